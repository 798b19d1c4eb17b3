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
#include <stdlib.h>
#include <string.h>

enum { KC = PRL_GEMM_KC, ATT_BLOCK = PRL_ATT_BLOCK };

/* ------------------------------------------------------------------ multiply-add chains */

/* out[i] = acc[i] + out[i], acc[i] the chain acc = acc + c[j]·x[j][i] from 0 over the m terms
** j in order: one GEMM depth block of one output row, in the GEMM's arithmetic. */
static void madd_add_plain(prl_real *restrict out, const prl_real *c, const prl_real *const *x,
                           int m, int w)
{
    for (int i = 0; i < w; i++) {
        prl_real acc = 0;
        for (int j = 0; j < m; j++) acc = acc + c[j] * x[j][i];
        out[i] = acc + out[i];
    }
}

/* out[l] = Σ_i a[i]·b[l][i] from 0 in order, for the m rows b[l], in the GEMM's arithmetic. */
static void dots_plain(const prl_real *a, const prl_real *const *b, int m, int n, prl_real *out)
{
    for (int l = 0; l < m; l++) {
        prl_real acc = 0;
        for (int i = 0; i < n; i++) acc = acc + a[i] * b[l][i];
        out[l] = acc;
    }
}

#if defined(PRL_OPS_X86) && !defined(PRL_REAL_DOUBLE)
#define SPARSE_FMA 1
#include <immintrin.h>
#define FMA_FN __attribute__((target("avx2,fma")))

/* Lanes in registers, 32 then 8 at a time, across all the terms. */
FMA_FN static void madd_add_fma(float *restrict out, const float *c, const float *const *x, int m,
                                int w)
{
    int i = 0;
    for (; i + 32 <= w; i += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int j = 0; j < m; j++) {
            __m256 vc = _mm256_set1_ps(c[j]);
            const float *xj = x[j] + i;
            a0 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(xj), a0);
            a1 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(xj + 8), a1);
            a2 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(xj + 16), a2);
            a3 = _mm256_fmadd_ps(vc, _mm256_loadu_ps(xj + 24), a3);
        }
        _mm256_storeu_ps(out + i, _mm256_add_ps(a0, _mm256_loadu_ps(out + i)));
        _mm256_storeu_ps(out + i + 8, _mm256_add_ps(a1, _mm256_loadu_ps(out + i + 8)));
        _mm256_storeu_ps(out + i + 16, _mm256_add_ps(a2, _mm256_loadu_ps(out + i + 16)));
        _mm256_storeu_ps(out + i + 24, _mm256_add_ps(a3, _mm256_loadu_ps(out + i + 24)));
    }
    for (; i + 8 <= w; i += 8) {
        __m256 a0 = _mm256_setzero_ps();
        for (int j = 0; j < m; j++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(c[j]), _mm256_loadu_ps(x[j] + i), a0);
        _mm256_storeu_ps(out + i, _mm256_add_ps(a0, _mm256_loadu_ps(out + i)));
    }
    for (; i < w; i++) {
        float acc = 0;
        for (int j = 0; j < m; j++) acc = __builtin_fmaf(c[j], x[j][i], acc);
        out[i] = acc + out[i];
    }
}

/* Eight chains interleaved when there are eight (one chain is latency-bound); each chain is
** the single one's operations. */
FMA_FN static void dots_fma(const float *a, const float *const *b, int m, int n, float *out)
{
    if (m == 8) { /* named scalars: an array of chains would live in memory */
        float c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0, c5 = 0, c6 = 0, c7 = 0;
        const float *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3], *b4 = b[4], *b5 = b[5],
                    *b6 = b[6], *b7 = b[7];
        for (int i = 0; i < n; i++) {
            float x = a[i];
            c0 = __builtin_fmaf(x, b0[i], c0), c1 = __builtin_fmaf(x, b1[i], c1);
            c2 = __builtin_fmaf(x, b2[i], c2), c3 = __builtin_fmaf(x, b3[i], c3);
            c4 = __builtin_fmaf(x, b4[i], c4), c5 = __builtin_fmaf(x, b5[i], c5);
            c6 = __builtin_fmaf(x, b6[i], c6), c7 = __builtin_fmaf(x, b7[i], c7);
        }
        out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
        out[4] = c4, out[5] = c5, out[6] = c6, out[7] = c7;
        return;
    }
    for (int l = 0; l < m; l++) {
        float acc = 0;
        for (int i = 0; i < n; i++) acc = __builtin_fmaf(a[i], b[l][i], acc);
        out[l] = acc;
    }
}
#endif

typedef struct chains {
    void (*madd_add)(prl_real *restrict, const prl_real *, const prl_real *const *, int, int);
    void (*dots)(const prl_real *, const prl_real *const *, int, int, prl_real *);
} chains;

/* The chain arithmetic of the GEMM the masked kernel runs. */
static chains chains_of_gemm(void)
{
#ifdef SPARSE_FMA
    if (prl_gemm_fma()) return (chains){madd_add_fma, dots_fma};
#endif
    return (chains){madd_add_plain, dots_plain};
}

/* out[j] = alpha·(a · x[pos_j]) over depth n for the m terms (pos_j = idx[j], or j when idx is
** NULL), as one GEMM row: per depth block of KC a chain from 0, then out = alpha·acc, added
** to out after the first block or when not `fresh` (beta 1). */
static void gemm_dots(const chains *k, prl_real *out, const prl_real *a, const int32_t *idx, int m,
                      const prl_real *x, size_t ldx, int n, prl_real alpha, int fresh)
{
    for (int j0 = 0; j0 < m; j0 += 8) {
        int w = m - j0 < 8 ? m - j0 : 8;
        const prl_real *b[8];
        prl_real acc[8];
        for (int k0 = 0; k0 < n; k0 += KC) {
            for (int l = 0; l < w; l++) b[l] = x + (size_t)(idx ? idx[j0 + l] : j0 + l) * ldx + k0;
            k->dots(a + k0, b, w, n - k0 < KC ? n - k0 : KC, acc);
            for (int l = 0; l < w; l++) {
                prl_real t = alpha * acc[l];
                out[j0 + l] = fresh && k0 == 0 ? t : t + out[j0 + l];
            }
        }
    }
}

/* out[0..w) (+)= Σ_j p[j]·x[pos_j] over the n terms (pos_j = idx[j], or j when idx is NULL,
** increasing) as one GEMM column of depth positions: a chain per KC block of positions, each
** added to out; `fresh` (beta 0): out starts at 0. */
static void gemm_lanes(const chains *k, prl_real *out, const prl_real *p, const int32_t *idx, int n,
                       const prl_real *x, size_t ldx, int w, int fresh)
{
    const prl_real *xs[KC]; /* a block holds at most KC positions */
    if (fresh) memset(out, 0, (size_t)w * sizeof *out);
    for (int j = 0; j < n;) {
        int blk = (idx ? idx[j] : j) / KC, m = 0, j0 = j;
        for (; j < n && (idx ? idx[j] : j) / KC == blk; j++, m++)
            xs[m] = x + (size_t)(idx ? idx[j] : j) * ldx;
        k->madd_add(out, p + j0, xs, m, w);
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

static void row_sparse(const chains *ch, prl_real *out, prl_real *Ss, prl_real *S,
                       const prl_real *q, const prl_attn_keys *kk, const int32_t *idx, int n,
                       int dn, int dr, int dv)
{
    /* S[j] = scale·(q_nope·k_nope(s) + q_rope·kr(s)), s = idx[j]: the masked kernel's two GEMMs */
    prl_real scale = (prl_real)(kk->scale > 0 ? kk->scale : 1.0 / sqrt((double)(dn + dr)));
    gemm_dots(ch, S, q, idx, n, kk->k, (size_t)kk->ldk, dn, scale, 1);
    gemm_dots(ch, S, q + dn, idx, n, kk->kr, (size_t)kk->ldkr, dr, scale, 0);
    if (kk->ns > 0) {
        gemm_dots(ch, Ss, q, NULL, kk->ns, kk->sk, (size_t)kk->ldsk, dn, scale, 1);
        gemm_dots(ch, Ss, q + dn, NULL, kk->ns, kk->skr, (size_t)kk->ldskr, dr, scale, 0);
    }
    softmax_sparse(Ss, kk->ns, S, n);
    /* out = P_sink·v_sink + P·v */
    if (kk->ns > 0) gemm_lanes(ch, out, Ss, NULL, kk->ns, kk->sk + dn, kk->ldsk, dv, 1);
    gemm_lanes(ch, out, S, idx, n, kk->k + dn, kk->ldk, dv, kk->ns == 0);
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

/* n rows of width w from stride lds to stride ldd. A task copies its head's keys (and, in the
** backward, their gradients) into one contiguous block: the selection reads them at random
** positions, which then stay in cache (the [T, H·dkv] rows interleave every head's). */
static void rows_copy(prl_real *dst, size_t ldd, const prl_real *src, size_t lds, int n, int w)
{
    for (int i = 0; i < n; i++) memcpy(dst + i * ldd, src + i * lds, (size_t)w * sizeof *dst);
}

static void sparse_forward_head(void *p, int task)
{
    sparse_ctx *c = p;
    prl_attn_shape sh = c->sh;
    int b = task / sh.H, h = task % sh.H, T = sh.T, H = sh.H, K = sh.sel_k, ldS = sh.ns + K;
    int dq = sh.dn + sh.dr, len = seq_len(c, b);
    prl_attn_keys kk = sparse_keys(c, b, h);
    int dkv = sh.dn + sh.dv;
    prl_real *kh = malloc(((size_t)len * dkv + 1) * sizeof *kh);
    PRL_ASSERT(kh != NULL);
    rows_copy(kh, (size_t)dkv, kk.k, (size_t)kk.ldk, len, dkv);
    kk.k = kh, kk.ldk = dkv;
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
    free(kh);
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
** is the block's rows: one chain, then added). The block's (row, entry) pairs are bucketed by
** key in row order (a counting sort, O(rows·k)), so each key's terms are in order and no key
** outside the selection is visited. */
typedef struct key_block {
    const int32_t *idx[ATT_BLOCK]; /* each row's list and count */
    int cnt[ATT_BLOCK], rows;
    const prl_real *P, *dS; /* compact rows at ldS (token columns) */
    const prl_real *dO, *q; /* row r at r·ldo / r·ldq */
    size_t ldS, ldo, ldq;
} key_block;

/* Bucket space of one task: slot [T] (-1 between blocks), and per pair of a block: the keys
** seen (uk), each key's first entry and fill, and the entries (row·ldS + j, row). */
typedef struct key_buckets {
    int *slot, *uk, *start, *fill, *ent, *row;
} key_buckets;

static void key_side_block(const chains *ch, const key_block *kb, key_buckets *bk, prl_real *dkv,
                           size_t ldkv, prl_real *dkr, int dn, int dr, int dv)
{
    int nu = 0, total = 0;
    for (int r = 0; r < kb->rows; r++) /* keys seen and their counts */
        for (int j = 0; j < kb->cnt[r]; j++) {
            int s = kb->idx[r][j];
            if (bk->slot[s] < 0) bk->slot[s] = nu, bk->uk[nu] = s, bk->fill[nu++] = 0;
            bk->fill[bk->slot[s]]++;
        }
    for (int u = 0; u < nu; u++) bk->start[u] = total, total += bk->fill[u], bk->fill[u] = 0;
    for (int r = 0; r < kb->rows; r++) /* entries by key, rows in order */
        for (int j = 0; j < kb->cnt[r]; j++) {
            int u = bk->slot[kb->idx[r][j]], e = bk->start[u] + bk->fill[u]++;
            bk->ent[e] = (int)((size_t)r * kb->ldS) + j, bk->row[e] = r;
        }
    prl_real cp[ATT_BLOCK], cs[ATT_BLOCK];
    const prl_real *xo[ATT_BLOCK], *xq[ATT_BLOCK], *xr[ATT_BLOCK];
    for (int u = 0; u < nu; u++) {
        int s = bk->uk[u], m = bk->fill[u];
        const int *ent = bk->ent + bk->start[u], *row = bk->row + bk->start[u];
        bk->slot[s] = -1;
        for (int i = 0; i < m; i++) {
            cp[i] = kb->P[ent[i]], cs[i] = kb->dS[ent[i]];
            xo[i] = kb->dO + (size_t)row[i] * kb->ldo, xq[i] = kb->q + (size_t)row[i] * kb->ldq;
            xr[i] = xq[i] + dn;
        }
        prl_real *dk = dkv + (size_t)s * ldkv;
        ch->madd_add(dk + dn, cp, xo, m, dv);
        ch->madd_add(dk, cs, xq, m, dn);
        ch->madd_add(dkr + (size_t)s * dr, cs, xr, m, dr);
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
    prl_real *dS = c->scratch + (size_t)prl_pool_worker() * ((size_t)ATT_BLOCK * (ns + T));
    prl_real *dkr_h = c->dkr_heads + (size_t)task * T * dr;
    prl_real *dsk_h = c->dsink_heads + (size_t)task * ns * (dkv + dr),
             *dskr_h = dsk_h + (size_t)ns * dkv;
    prl_attn_keys kk = sparse_keys(c, b, h);
    memset(dkr_h, 0, (size_t)T * dr * sizeof *dkr_h);
    memset(dsk_h, 0, (size_t)ns * (dkv + dr) * sizeof *dsk_h);
    size_t pairs = (size_t)ATT_BLOCK * K;
    int *space = malloc(((size_t)T + 5 * pairs) * sizeof *space);
    PRL_ASSERT(space != NULL);
    key_buckets bk = {.slot = space, .uk = space + T, .start = space + T + pairs};
    bk.fill = bk.start + pairs, bk.ent = bk.fill + pairs, bk.row = bk.ent + pairs;
    for (int i = 0; i < T; i++) bk.slot[i] = -1;
    prl_real *kh = malloc((2 * (size_t)len * dkv + 1) * sizeof *kh), *dkh = kh + (size_t)len * dkv;
    PRL_ASSERT(kh != NULL);
    rows_copy(kh, (size_t)dkv, kk.k, (size_t)kk.ldk, len, dkv);
    rows_copy(dkh, (size_t)dkv, c->dkv + kvoff, (size_t)H * dkv, len, dkv);
    kk.k = kh, kk.ldk = dkv;
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
            if (ns > 0)
                gemm_dots(&c->ch, dSr, dOr, NULL, ns, kk.sk + dn, (size_t)kk.ldsk, dv, 1, 1);
            gemm_dots(&c->ch, dSr + ns, dOr, kb.idx[r], kb.cnt[r], kk.k + dn, (size_t)kk.ldk, dv, 1,
                      1);
            softmax_sparse_backward(dSr, Pb + (size_t)r * ldS, ns, dSr + ns,
                                    Pb + (size_t)r * ldS + ns, kb.cnt[r], scale);
            /* dq_nope += dS·k_nope, dq_rope += dS·kr (tokens; the sinks below) */
            prl_real *dqr = dqb + (size_t)r * H * dq;
            gemm_lanes(&c->ch, dqr, dSr + ns, kb.idx[r], kb.cnt[r], kk.k, kk.ldk, dn, 0);
            gemm_lanes(&c->ch, dqr + dn, dSr + ns, kb.idx[r], kb.cnt[r], kk.kr, kk.ldkr, dr, 0);
        }
        key_side_block(&c->ch, &kb, &bk, dkh, (size_t)dkv, dkr_h, dn, dr, dv);
        if (ns > 0) { /* the sink columns are dense: the masked kernel's GEMMs on them */
            prl_gemm(1, 0, ns, dv, rows, 1, Pb, (int)ldS, dOb, H * dv, 1, dsk_h + dn, dkv);
            prl_gemm(0, 0, rows, dn, ns, 1, dS, (int)ldS, c->sink_kv + (size_t)h * dkv, H * dkv, 1,
                     dqb, H * dq);
            prl_gemm(0, 0, rows, dr, ns, 1, dS, (int)ldS, c->sink_kr, dr, 1, dqb + dn, H * dq);
            prl_gemm(1, 0, ns, dn, rows, 1, dS, (int)ldS, qb, H * dq, 1, dsk_h, dkv);
            prl_gemm(1, 0, ns, dr, rows, 1, dS, (int)ldS, qb + dn, H * dq, 1, dskr_h, dr);
        }
    }
    rows_copy(c->dkv + kvoff, (size_t)H * dkv, dkh, (size_t)dkv, len, dkv);
    free(space), free(kh);
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
