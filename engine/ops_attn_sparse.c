/*
** ops_attn_sparse.c — naive MLA attention over a selection of keys (DSA's sparse stage, see
** docs/model.md "DSA"): forward and backward that read only each query row's selected keys,
** so a layer costs O(T·k) instead of O(T²); the masked dense kernel of ops_attn.c stays the
** naive reference (ops.h, prl_attn_shape.sel_idx).
**
** Why it gives the masked kernel's bits: prl_gemm_f32 computes every element as a chain of
** multiply-adds in depth order, restarted at each PRL_GEMM_KC block of depth (counted from 0)
** and added to C (engine.h). Here each sum is the same chain over the selected terms only:
** a masked-out term is 0·x, which leaves the chain's value unchanged, so dropping it changes
** no bit, as long as the terms stay in order and in their depth blocks. The chains use FMA
** exactly when the GEMM does (prl_gemm_fma). The score and softmax loops mirror
** softmax_row_masked / softmax_row_backward of ops_attn.c term for term.
*/
#include "engine/ops.h"

#include <math.h>
#include <string.h>

enum { KC = PRL_GEMM_KC, ATT_BLOCK = PRL_ATT_BLOCK };

/* ------------------------------------------------------------------ multiply-add chains */

/* acc[i] = acc[i] + c·x[i] (each lane one chain step), in the GEMM's arithmetic. */
static void madd_lanes_plain(prl_real *restrict acc, prl_real c, const prl_real *restrict x, int n)
{
    for (int i = 0; i < n; i++) acc[i] = acc[i] + c * x[i];
}

/* Σ a[i]·b[i] from 0 in order, in the GEMM's arithmetic. */
static prl_real dot_plain(const prl_real *a, const prl_real *b, int n)
{
    prl_real acc = 0;
    for (int i = 0; i < n; i++) acc = acc + a[i] * b[i];
    return acc;
}

#if defined(PRL_OPS_X86) && !defined(PRL_REAL_DOUBLE)
#define SPARSE_FMA 1
__attribute__((target("avx2,fma"))) static void madd_lanes_fma(float *restrict acc, float c,
                                                               const float *restrict x, int n)
{
    for (int i = 0; i < n; i++) acc[i] = __builtin_fmaf(c, x[i], acc[i]);
}

__attribute__((target("avx2,fma"))) static float dot_fma(const float *a, const float *b, int n)
{
    float acc = 0;
    for (int i = 0; i < n; i++) acc = __builtin_fmaf(a[i], b[i], acc);
    return acc;
}
#endif

typedef struct chains {
    void (*madd)(prl_real *restrict, prl_real, const prl_real *restrict, int);
    prl_real (*dot)(const prl_real *, const prl_real *, int);
} chains;

/* The chain arithmetic of the GEMM the masked kernel runs. */
static chains chains_of_gemm(void)
{
#ifdef SPARSE_FMA
    if (prl_gemm_fma()) return (chains){madd_lanes_fma, dot_fma};
#endif
    return (chains){madd_lanes_plain, dot_plain};
}

/* c = alpha·a·b over depth n in the GEMM's blocks: from c (or nothing when `fresh`, beta 0). */
static prl_real gemm_dot(const chains *k, const prl_real *a, const prl_real *b, int n,
                         prl_real alpha, prl_real c, int fresh)
{
    for (int k0 = 0; k0 < n; k0 += KC) {
        prl_real t = alpha * k->dot(a + k0, b + k0, n - k0 < KC ? n - k0 : KC);
        c = fresh && k0 == 0 ? t : t + c;
    }
    return c;
}

/* out[0..w) (+)= Σ_j p[j]·x[pos_j] over the n terms (pos_j = idx[j], or j when idx is NULL,
** increasing) as one GEMM column of depth positions: a chain per KC block of positions, each
** added to out; `fresh` (beta 0): out starts at 0. acc holds w reals. */
static void gemm_lanes(const chains *k, prl_real *out, prl_real *acc, const prl_real *p,
                       const int32_t *idx, int n, const prl_real *x, size_t ldx, int w, int fresh)
{
    if (fresh) memset(out, 0, (size_t)w * sizeof *out);
    for (int j = 0; j < n;) {
        int blk = (idx ? idx[j] : j) / KC;
        memset(acc, 0, (size_t)w * sizeof *acc);
        for (; j < n && (idx ? idx[j] : j) / KC == blk; j++)
            k->madd(acc, p[j], x + (size_t)(idx ? idx[j] : j) * ldx, w);
        for (int i = 0; i < w; i++) out[i] = acc[i] + out[i];
    }
}

/* ------------------------------------------------------------------ row lists ------- */

void prl_attn_sel_index(int32_t *idx, const uint8_t *sel, int N, int T, int k)
{
    for (int n = 0; n < N; n++) {
        int32_t *row = idx + (size_t)n * k;
        const uint8_t *m = sel + (size_t)n * T;
        int c = 0;
        for (int s = 0; s < T && c < k; s++)
            if (m[s]) row[c++] = s;
        for (; c < k; c++) row[c] = -1;
    }
}

int prl_attn_sel_count(const int32_t *idx, int k)
{
    int c = 0;
    while (c < k && idx[c] >= 0) c++;
    return c;
}

/* ------------------------------------------------------------------ forward --------- */

/* softmax_row_masked over the sinks Ss [ns] and the n selected scores S. */
static void softmax_sparse(prl_real *Ss, int ns, prl_real *S, int n)
{
    prl_real m = -INFINITY;
    for (int i = 0; i < ns; i++) m = Ss[i] > m ? Ss[i] : m;
    for (int j = 0; j < n; j++) m = S[j] > m ? S[j] : m;
    PRL_ASSERT(m > -INFINITY); /* a selection holds at least one token */
    prl_real sum = 0;
    for (int i = 0; i < ns; i++) sum += (Ss[i] = PRL_EXP(Ss[i] - m));
    for (int j = 0; j < n; j++) sum += (S[j] = PRL_EXP(S[j] - m));
    prl_real inv = 1 / sum;
    for (int i = 0; i < ns; i++) Ss[i] *= inv;
    for (int j = 0; j < n; j++) S[j] = S[j] * inv;
}

enum { MAX_WIDTH = 1024 }; /* the widest head part a row accumulates on the stack */

static void row_sparse(const chains *ch, prl_real *out, prl_real *Ss, prl_real *S,
                       const prl_real *q, const prl_attn_keys *kk, const int32_t *idx, int n,
                       int dn, int dr, int dv)
{
    /* S[j] = scale·(q_nope·k_nope(s) + q_rope·kr(s)), s = idx[j]: the masked kernel's two GEMMs */
    prl_real scale = (prl_real)(kk->scale > 0 ? kk->scale : 1.0 / sqrt((double)(dn + dr)));
    for (int j = 0; j < n; j++) {
        size_t s = (size_t)idx[j];
        S[j] = gemm_dot(ch, q, kk->k + s * kk->ldk, dn, scale, 0, 1);
        S[j] = gemm_dot(ch, q + dn, kk->kr + s * kk->ldkr, dr, scale, S[j], 0);
    }
    for (int i = 0; i < kk->ns; i++) {
        Ss[i] = gemm_dot(ch, q, kk->sk + (size_t)i * kk->ldsk, dn, scale, 0, 1);
        Ss[i] = gemm_dot(ch, q + dn, kk->skr + (size_t)i * kk->ldskr, dr, scale, Ss[i], 0);
    }
    softmax_sparse(Ss, kk->ns, S, n);
    /* out = P_sink·v_sink + P·v */
    prl_real acc[MAX_WIDTH];
    PRL_ASSERT(dv <= MAX_WIDTH);
    if (kk->ns > 0) gemm_lanes(ch, out, acc, Ss, NULL, kk->ns, kk->sk + dn, kk->ldsk, dv, 1);
    gemm_lanes(ch, out, acc, S, idx, n, kk->k + dn, kk->ldk, dv, kk->ns == 0);
}

void prl_attention_row_sparse(prl_real *out, prl_real *Ss, prl_real *S, const prl_real *q,
                              const prl_attn_keys *keys, const int32_t *idx, int n, int dn, int dr,
                              int dv)
{
    chains ch = chains_of_gemm();
    row_sparse(&ch, out, Ss, S, q, keys, idx, n, dn, dr, dv);
}

typedef struct sparse_ctx {
    prl_real *out, *att, *dq, *dkv, *dkr_heads, *dsink_heads, *scratch;
    const prl_real *q, *kv, *kr, *sink_kv, *sink_kr, *dout;
    const int32_t *lens;
    prl_attn_shape sh;
    chains ch;
} sparse_ctx;

static int seq_len(const sparse_ctx *c, int b) { return c->lens ? c->lens[b] : c->sh.T; }

/* Keys of head h of sequence b, rows indexed by position. */
static prl_attn_keys sparse_keys(const sparse_ctx *c, int b, int h)
{
    prl_attn_shape sh = c->sh;
    int dkv = sh.dn + sh.dv;
    prl_attn_keys kk = {.k = c->kv + (size_t)b * sh.T * sh.H * dkv + (size_t)h * dkv,
                        .ldk = sh.H * dkv,
                        .kr = c->kr + (size_t)b * sh.T * sh.dr,
                        .ldkr = sh.dr,
                        .ns = sh.ns,
                        .scale = sh.scale};
    if (sh.ns > 0) {
        kk.sk = c->sink_kv + (size_t)h * dkv, kk.ldsk = sh.H * dkv;
        kk.skr = c->sink_kr, kk.ldskr = sh.dr;
    }
    return kk;
}

static void sparse_forward_head(void *p, int task)
{
    sparse_ctx *c = p;
    prl_attn_shape sh = c->sh;
    int b = task / sh.H, h = task % sh.H, T = sh.T, H = sh.H, K = sh.sel_k, ldS = sh.ns + K;
    int dq = sh.dn + sh.dr, len = seq_len(c, b);
    prl_attn_keys kk = sparse_keys(c, b, h);
    for (int t = 0; t < T; t++) {
        prl_real *out = c->out + ((size_t)b * T + t) * H * sh.dv + (size_t)h * sh.dv;
        prl_real *P = c->att + ((size_t)task * T + t) * ldS;
        if (t >= len) {
            memset(out, 0, (size_t)sh.dv * sizeof *out);
            continue;
        }
        const int32_t *idx = sh.sel_idx + ((size_t)b * T + t) * K;
        int n = prl_attn_sel_count(idx, K);
        row_sparse(&c->ch, out, P, P + sh.ns, c->q + ((size_t)b * T + t) * H * dq + (size_t)h * dq,
                   &kk, idx, n, sh.dn, sh.dr, sh.dv);
        memset(P + sh.ns + n, 0, (size_t)(K - n) * sizeof *P);
    }
}

void prl_attention_sparse_forward(prl_real *out, prl_real *att, const prl_real *q,
                                  const prl_real *kv, const prl_real *kr, const prl_real *sink_kv,
                                  const prl_real *sink_kr, const int32_t *lens, prl_attn_shape sh)
{
    PRL_ASSERT(sh.window == 0 && sh.sel_k > 0);
    sparse_ctx c = {.out = out,
                    .att = att,
                    .q = q,
                    .kv = kv,
                    .kr = kr,
                    .sink_kv = sink_kv,
                    .sink_kr = sink_kr,
                    .lens = lens,
                    .sh = sh,
                    .ch = chains_of_gemm()};
    prl_parallel_for(sh.B * sh.H, sparse_forward_head, &c);
}

/* ------------------------------------------------------------------ backward -------- */

/* softmax_row_backward over the sinks and the n selected tokens. */
static void softmax_sparse_backward(prl_real *dSs, const prl_real *Ps, int ns, prl_real *dS,
                                    const prl_real *P, int n, prl_real scale)
{
    prl_real dot = 0;
    for (int i = 0; i < ns; i++) dot += Ps[i] * dSs[i];
    for (int j = 0; j < n; j++) dot += P[j] * dS[j];
    for (int i = 0; i < ns; i++) dSs[i] = scale * Ps[i] * (dSs[i] - dot);
    for (int j = 0; j < n; j++) dS[j] = scale * P[j] * (dS[j] - dot);
}

/* One query block's key-side gradients: for every key s selected by a row of the block,
**   dv(s) += Σ_t P[t,s]·dO(t),  dk_nope(s) += Σ_t dS[t,s]·q_nope(t),  dkr(s) += Σ_t dS[t,s]·q_rope(t)
** the sums over the block's rows t in order (the masked kernel's Pᵀ·dO and dSᵀ·q, whose depth
** is the block's rows: one chain, then added). Keys are visited in increasing order by merging
** the rows' sorted lists (cur[r] walks row r's list). */
typedef struct key_block {
    const int32_t *idx[ATT_BLOCK]; /* each row's list and count */
    int cnt[ATT_BLOCK], rows;
    const prl_real *P, *dS; /* compact rows at ldS (token columns) */
    const prl_real *dO, *q; /* row r at r·ldo / r·ldq */
    size_t ldS, ldo, ldq;
} key_block;

static void key_side_block(const chains *ch, const key_block *kb, prl_real *dkv, size_t ldkv,
                           prl_real *dkr, int dn, int dr, int dv, prl_real *acc)
{
    int cur[ATT_BLOCK] = {0};
    prl_real *av = acc, *ak = av + dv, *ar = ak + dn;
    for (;;) {
        int s = -1;
        for (int r = 0; r < kb->rows; r++)
            if (cur[r] < kb->cnt[r] && (s < 0 || kb->idx[r][cur[r]] < s)) s = kb->idx[r][cur[r]];
        if (s < 0) return;
        memset(acc, 0, (size_t)(dv + dn + dr) * sizeof *acc);
        for (int r = 0; r < kb->rows; r++) {
            if (cur[r] >= kb->cnt[r] || kb->idx[r][cur[r]] != s) continue;
            size_t j = (size_t)r * kb->ldS + (size_t)cur[r]++;
            const prl_real *qr = kb->q + (size_t)r * kb->ldq;
            ch->madd(av, kb->P[j], kb->dO + (size_t)r * kb->ldo, dv);
            ch->madd(ak, kb->dS[j], qr, dn);
            ch->madd(ar, kb->dS[j], qr + dn, dr);
        }
        prl_real *dk = dkv + (size_t)s * ldkv, *dkrs = dkr + (size_t)s * dr;
        for (int i = 0; i < dv; i++) dk[dn + i] = av[i] + dk[dn + i];
        for (int i = 0; i < dn; i++) dk[i] = ak[i] + dk[i];
        for (int i = 0; i < dr; i++) dkrs[i] = ar[i] + dkrs[i];
    }
}

static void sparse_backward_head(void *p, int task)
{
    sparse_ctx *c = p;
    prl_attn_shape sh = c->sh;
    int b = task / sh.H, h = task % sh.H, T = sh.T, H = sh.H, ns = sh.ns, K = sh.sel_k;
    int dn = sh.dn, dr = sh.dr, dv = sh.dv, dq = dn + dr, dkv = dn + dv, len = seq_len(c, b);
    size_t ldS = (size_t)ns + K;
    prl_real scale = (prl_real)(sh.scale > 0 ? sh.scale : 1.0 / sqrt((double)dq));
    size_t qoff = (size_t)b * T * H * dq + (size_t)h * dq;
    size_t kvoff = (size_t)b * T * H * dkv + (size_t)h * dkv;
    const prl_real *P = c->att + (size_t)task * T * ldS;
    const prl_real *dO = c->dout + (size_t)b * T * H * dv + (size_t)h * dv;
    prl_real *dS =
        c->scratch + (size_t)prl_pool_worker() * ((size_t)ATT_BLOCK * (ns + T) + dn + dv + dr);
    prl_real *acc = dS + (size_t)ATT_BLOCK * (ns + T);
    prl_real *dkr_h = c->dkr_heads + (size_t)task * T * dr;
    prl_real *dsk_h = c->dsink_heads + (size_t)task * ns * (dkv + dr),
             *dskr_h = dsk_h + (size_t)ns * dkv;
    prl_attn_keys kk = sparse_keys(c, b, h);
    memset(dkr_h, 0, (size_t)T * dr * sizeof *dkr_h);
    memset(dsk_h, 0, (size_t)ns * (dkv + dr) * sizeof *dsk_h);
    for (int r0 = 0; r0 < len; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < len ? r0 + ATT_BLOCK : len, rows = r1 - r0;
        const prl_real *Pb = P + (size_t)r0 * ldS, *dOb = dO + (size_t)r0 * H * dv;
        const prl_real *qb = c->q + qoff + (size_t)r0 * H * dq;
        prl_real *dqb = c->dq + qoff + (size_t)r0 * H * dq;
        key_block kb = {.rows = rows,
                        .P = Pb + ns,
                        .dS = dS + ns,
                        .dO = dOb,
                        .q = qb,
                        .ldS = ldS,
                        .ldo = (size_t)H * dv,
                        .ldq = (size_t)H * dq};
        for (int r = 0; r < rows; r++) {
            kb.idx[r] = sh.sel_idx + ((size_t)b * T + r0 + r) * K;
            kb.cnt[r] = prl_attn_sel_count(kb.idx[r], K);
            const prl_real *dOr = dOb + (size_t)r * H * dv;
            prl_real *dSr = dS + (size_t)r * ldS;
            /* dP = dO·vᵀ over the sinks and the selected tokens */
            for (int i = 0; i < ns; i++)
                dSr[i] =
                    gemm_dot(&c->ch, dOr, c->sink_kv + (size_t)h * dkv + dn + (size_t)i * H * dkv,
                             dv, 1, 0, 1);
            for (int j = 0; j < kb.cnt[r]; j++)
                dSr[ns + j] =
                    gemm_dot(&c->ch, dOr, kk.k + (size_t)kb.idx[r][j] * kk.ldk + dn, dv, 1, 0, 1);
            softmax_sparse_backward(dSr, Pb + (size_t)r * ldS, ns, dSr + ns,
                                    Pb + (size_t)r * ldS + ns, kb.cnt[r], scale);
            /* dq_nope += dS·k_nope, dq_rope += dS·kr (tokens; the sinks below) */
            prl_real *dqr = dqb + (size_t)r * H * dq;
            gemm_lanes(&c->ch, dqr, acc, dSr + ns, kb.idx[r], kb.cnt[r], kk.k, kk.ldk, dn, 0);
            gemm_lanes(&c->ch, dqr + dn, acc, dSr + ns, kb.idx[r], kb.cnt[r], kk.kr, kk.ldkr, dr,
                       0);
        }
        key_side_block(&c->ch, &kb, c->dkv + kvoff, (size_t)H * dkv, dkr_h, dn, dr, dv, acc);
        if (ns > 0) { /* the sink columns are dense: the masked kernel's GEMMs on them */
            prl_gemm(1, 0, ns, dv, rows, 1, Pb, (int)ldS, dOb, H * dv, 1, dsk_h + dn, dkv);
            prl_gemm(0, 0, rows, dn, ns, 1, dS, (int)ldS, c->sink_kv + (size_t)h * dkv, H * dkv, 1,
                     dqb, H * dq);
            prl_gemm(0, 0, rows, dr, ns, 1, dS, (int)ldS, c->sink_kr, dr, 1, dqb + dn, H * dq);
            prl_gemm(1, 0, ns, dn, rows, 1, dS, (int)ldS, qb, H * dq, 1, dsk_h, dkv);
            prl_gemm(1, 0, ns, dr, rows, 1, dS, (int)ldS, qb + dn, H * dq, 1, dskr_h, dr);
        }
    }
}

void prl_attention_sparse_backward(prl_real *dq, prl_real *dkv, prl_real *dkr_heads,
                                   prl_real *dsink_heads, prl_real *scratch, const prl_real *dout,
                                   const prl_real *att, const prl_real *q, const prl_real *kv,
                                   const prl_real *kr, const prl_real *sink_kv,
                                   const prl_real *sink_kr, const int32_t *lens, prl_attn_shape sh)
{
    PRL_ASSERT(sh.window == 0 && sh.sel_k > 0);
    sparse_ctx c = {.dq = dq,
                    .dkv = dkv,
                    .dkr_heads = dkr_heads,
                    .dsink_heads = dsink_heads,
                    .scratch = scratch,
                    .dout = dout,
                    .att = (prl_real *)att,
                    .q = q,
                    .kv = kv,
                    .kr = kr,
                    .sink_kv = sink_kv,
                    .sink_kr = sink_kr,
                    .lens = lens,
                    .sh = sh,
                    .ch = chains_of_gemm()};
    prl_parallel_for(sh.B * sh.H, sparse_backward_head, &c);
}
