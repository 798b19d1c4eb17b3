/*
** ops_attn.c — the train path's attention kernels (ops.h): causal, sliding-window and
** parameter-sink softmax attention over the naive MLA heads, forward and backward, one task
** per (sequence, head), the per-head partial gradients reduced in a fixed order.
*/
#include "engine/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ attention ------- */

/* Causal attention is computed in blocks of ATT_BLOCK query rows: rows [r0, r1) only need
** keys [k0, r1) (k0 = 0, or the window's start rounded down to a GEMM depth block), so the
** upper triangle is never multiplied (about half the FLOPs at T = 256). Rows at or past a
** sequence's length are skipped (their outputs are zero). Parameter sinks are ns extra
** columns before the tokens in every row. */
enum { ATT_BLOCK = PRL_ATT_BLOCK };

typedef struct attn_ctx {
    prl_real *out, *att, *dq, *dkv, *dkr_heads, *dsink_heads, *scratch;
    const prl_real *q, *kv, *kr, *sink_kv, *sink_kr, *dout;
    const int32_t *lens;
    prl_attn_shape sh;
} attn_ctx;

int prl_attention_key_start(int p0, int window)
{
    if (window <= 0 || p0 - window + 1 <= 0) return 0;
    return (p0 - window + 1) / PRL_GEMM_KC * PRL_GEMM_KC;
}

/* First allowed token column of row t when the key rows start at position k0. */
static int row_lo(int t, int k0, int window)
{
    return window > 0 && t - window + 1 > k0 ? t - window + 1 - k0 : 0;
}

/* The same in a packed row, where row t at position `pos` of its segment also sees no key
** before the segment's first (pos NULL: an unpacked row). */
static int row_lo_packed(int t, int k0, int window, const int32_t *pos)
{
    int lo = row_lo(t, k0, window);
    if (!pos) return lo;
    int seg = prl_segment_start(t, *pos) - k0;
    return seg > lo ? seg : lo;
}

#if defined(PRL_OPS_X86) && !defined(PRL_REAL_DOUBLE)
#define ROW_AVX2 1
/* The AVX2 forms of softmax_row's token loops (its scalar loops finish the tail): the max
** (prl_v8_max_scaled), x[i] = exp(x[i] − m), x[i] *= k; each returns how many it did. */
PRL_AVX2 static int exp_shifted_avx2(float *x, int n, float m)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) prl_v8_store(x + i, prl_expf8(prl_v8_load(x + i) - m));
    return i;
}

PRL_AVX2 static int scale_avx2(float *x, int n, float k)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) prl_v8_store(x + i, prl_v8_load(x + i) * k);
    return i;
}
#endif

/* Softmax of one row over the ns sink scores Ss and the token scores S[lo..hi]; the other
** token entries up to `width` are set to zero. Sinks first, then tokens, in order: the sum
** runs over the stored exps in that order whichever form computed them. */
static void softmax_row(prl_real *Ss, int ns, prl_real *S, int lo, int hi, int width)
{
    int s = lo;
#ifdef ROW_AVX2
    int fast = prl_row_kernels_avx2(), n = hi - lo + 1;
#endif
    prl_real m = ns > 0 ? Ss[0] : S[lo];
    for (int i = 1; i < ns; i++) m = Ss[i] > m ? Ss[i] : m;
#ifdef ROW_AVX2
    if (fast) {
        int done;
        m = prl_v8_max_scaled(m, S + lo, n, 1.0f, &done);
        s += done;
    }
#endif
    for (; s <= hi; s++) m = S[s] > m ? S[s] : m;
    prl_real sum = 0;
    for (int i = 0; i < ns; i++) sum += (Ss[i] = PRL_EXP(Ss[i] - m));
    s = lo;
#ifdef ROW_AVX2
    if (fast) s += exp_shifted_avx2(S + lo, n, m);
#endif
    for (int t = lo; t < s; t++) sum += S[t];
    for (; s <= hi; s++) sum += (S[s] = PRL_EXP(S[s] - m));
    prl_real inv = 1 / sum;
    for (int i = 0; i < ns; i++) Ss[i] *= inv;
    s = lo;
#ifdef ROW_AVX2
    if (fast) s += scale_avx2(S + lo, n, inv);
#endif
    for (; s <= hi; s++) S[s] *= inv;
    for (int s = 0; s < lo; s++) S[s] = 0;
    for (int s = hi + 1; s < width; s++) S[s] = 0;
}

/* softmax_row restricted to the token columns with allow[s] != 0 (a DSA selection); the
** others get probability 0. With every column allowed it computes the same bits. */
static void softmax_row_masked(prl_real *Ss, int ns, prl_real *S, int lo, int hi, int width,
                               const uint8_t *allow)
{
    prl_real m = -INFINITY;
    for (int i = 0; i < ns; i++) m = Ss[i] > m ? Ss[i] : m;
    for (int s = lo; s <= hi; s++)
        if (allow[s]) m = S[s] > m ? S[s] : m;
    PRL_ASSERT(m > -INFINITY); /* a selection holds at least one token */
    prl_real sum = 0;
    for (int i = 0; i < ns; i++) sum += (Ss[i] = PRL_EXP(Ss[i] - m));
    for (int s = lo; s <= hi; s++)
        if (allow[s]) sum += (S[s] = PRL_EXP(S[s] - m));
    prl_real inv = 1 / sum;
    for (int i = 0; i < ns; i++) Ss[i] *= inv;
    for (int s = lo; s <= hi; s++) S[s] = allow[s] ? S[s] * inv : 0;
    for (int s = 0; s < lo; s++) S[s] = 0;
    for (int s = hi + 1; s < width; s++) S[s] = 0;
}

/* The softmax scale of a call: the given one, else (dn + dr)^(−1/2). */
static prl_real attn_scale(double scale, int dq)
{
    return (prl_real)(scale > 0 ? scale : 1.0 / sqrt((double)dq));
}

/* Valid rows of sequence b: [0, len). */
static int seq_len(const attn_ctx *c, int b) { return c->lens ? c->lens[b] : c->sh.T; }

/* The sink scores Ss [rows, ns] = scale·(q_nope·sink_kᵀ + q_rope·sink_krᵀ) (none: ns = 0). */
static void sink_scores(prl_real *Ss, int ldS, const prl_real *q, int ldq, const prl_attn_keys *kk,
                        int rows, int dn, int dr, prl_real scale)
{
    if (kk->ns <= 0) return;
    prl_gemm(0, 1, rows, kk->ns, dn, scale, q, ldq, kk->sk, kk->ldsk, 0, Ss, ldS);
    prl_gemm(0, 1, rows, kk->ns, dr, scale, q + dn, ldq, kk->skr, kk->ldskr, 1, Ss, ldS);
}

/* The softmax of the query rows [p0, p1) over their sinks and allowed tokens, in place. */
static void softmax_block(prl_real *Ss, prl_real *S, int ldS, const prl_attn_keys *kk, int p0,
                          int p1)
{
    int k0 = kk->k0, nk = p1 - k0, ns = kk->ns;
    for (int t = p0; t < p1; t++) {
        prl_real *Srow = S + (size_t)(t - p0) * ldS,
                 *Ssrow = ns > 0 ? Ss + (size_t)(t - p0) * ldS : NULL;
        int lo = row_lo_packed(t, k0, kk->window, kk->pos ? kk->pos + (t - p0) : NULL);
        if (kk->sel)
            softmax_row_masked(Ssrow, ns, Srow, lo, t - k0, nk,
                               kk->sel + (size_t)(t - p0) * kk->ldsel + k0);
        else softmax_row(Ssrow, ns, Srow, lo, t - k0, nk);
    }
}

void prl_attention_rows(prl_real *out, int ldo, prl_real *Ss, prl_real *S, int ldS,
                        const prl_real *q, int ldq, const prl_attn_keys *kk, int p0, int p1, int dn,
                        int dr, int dv)
{
    /* q [rows, dn+dr] at ldq; token keys [nk = p1-k0] and sink keys [ns] (prl_attn_keys);
    ** Ss [rows, ns] and S [rows, nk] at ldS; out [rows, dv] at ldo */
    int rows = p1 - p0, k0 = kk->k0, nk = p1 - k0, ns = kk->ns;
    PRL_ASSERT(k0 <= prl_attention_key_start(p0, kk->window) && k0 >= 0);
    prl_real scale = attn_scale(kk->scale, dn + dr);
    /* S = scale·(q_nope·k_nopeᵀ + q_rope·krᵀ) over the token keys, then the sinks */
    prl_gemm(0, 1, rows, nk, dn, scale, q, ldq, kk->k, kk->ldk, 0, S, ldS);
    prl_gemm(0, 1, rows, nk, dr, scale, q + dn, ldq, kk->kr, kk->ldkr, 1, S, ldS);
    sink_scores(Ss, ldS, q, ldq, kk, rows, dn, dr, scale);
    softmax_block(Ss, S, ldS, kk, p0, p1);
    /* out = P_sink·v_sink + P·v */
    if (ns > 0) prl_gemm(0, 0, rows, dv, ns, 1, Ss, ldS, kk->sk + dn, kk->ldsk, 0, out, ldo);
    prl_gemm(0, 0, rows, dv, nk, 1, S, ldS, kk->k + dn, kk->ldk, ns > 0 ? 1 : 0, out, ldo);
}

/* The key set of head h of sequence b for the query block starting at r0. */
static prl_attn_keys head_keys(const attn_ctx *c, int b, int h, int r0)
{
    prl_attn_shape sh = c->sh;
    int dkv = sh.dn + sh.dv, k0 = prl_attention_key_start(r0, sh.window);
    prl_attn_keys kk = {.k = c->kv + ((size_t)b * sh.T + k0) * sh.H * dkv + (size_t)h * dkv,
                        .ldk = sh.H * dkv,
                        .kr = c->kr + ((size_t)b * sh.T + k0) * sh.dr,
                        .ldkr = sh.dr,
                        .k0 = k0,
                        .window = sh.window,
                        .ns = sh.ns,
                        .scale = sh.scale};
    if (sh.ns > 0) {
        kk.sk = c->sink_kv + (size_t)h * dkv, kk.ldsk = sh.H * dkv;
        kk.skr = c->sink_kr, kk.ldskr = sh.dr;
    }
    if (sh.sel) kk.sel = sh.sel + ((size_t)b * sh.T + r0) * sh.T, kk.ldsel = sh.T;
    if (sh.pos) kk.pos = sh.pos + (size_t)b * sh.T + r0;
    return kk;
}

/* ------------------------------------------------------------------ packed keys ----- */

/* The float build packs a head's keys and values once for all its query blocks (a query
** block reads the leading keys [k0, r1) of the same matrices, so per block they were packed
** again: 640 key rows per head at T = 256 instead of 256), and each block's GEMMs read the
** packs over its rows (prl_gemm_f32_packed_rows: the bits of prl_gemm on the sub-matrix).
** The per-block prl_gemm form stays as the reference (prl_attention_packed_set(0)); the
** double build always runs it. */
static int packed_off;

int prl_attention_packed(void)
{
#ifdef PRL_REAL_DOUBLE
    return 0;
#else
    return !packed_off;
#endif
}

int prl_attention_packed_set(int on)
{
    int was = prl_attention_packed();
    packed_off = !on;
    return was;
}

#ifndef PRL_REAL_DOUBLE
_Static_assert((int)ATT_BLOCK <= (int)PRL_GEMM_KC,
               "a query block's GEMMs over its rows are one depth block");

/* Per pool thread: the packs of the head it runs, and a scratch it grows. */
typedef struct head_packs {
    prl_packed_b a, b, c;
    float *tmp;
    size_t tmp_len;
} head_packs;
static _Thread_local head_packs tl_packs;

static float *packs_tmp(head_packs *hp, size_t n)
{
    if (hp->tmp_len < n) {
        float *t = realloc(hp->tmp, n * sizeof *t);
        if (!t) return NULL;
        hp->tmp = t, hp->tmp_len = n;
    }
    return hp->tmp;
}

/* The forward's packs of head h of sequence b over its first len keys: a = k_nopeᵀ [dn, len],
** b = krᵀ [dr, len] (the scores' B), c = v [len, dv] (P·v's B). 0 when out of memory. */
static int pack_forward(head_packs *hp, const attn_ctx *c, int b, int h, int len)
{
    prl_attn_shape sh = c->sh;
    int dkv = sh.dn + sh.dv, ldk = sh.H * dkv;
    const float *k = c->kv + (size_t)b * sh.T * ldk + (size_t)h * dkv;
    const float *kr = c->kr + (size_t)b * sh.T * sh.dr;
    return !prl_packed_b_repack_here(&hp->a, 1, sh.dn, len, k, ldk) &&
           !prl_packed_b_repack_here(&hp->b, 1, sh.dr, len, kr, sh.dr) &&
           !prl_packed_b_repack_here(&hp->c, 0, len, sh.dv, k + sh.dn, ldk);
}

/* prl_attention_rows for the query block [p0, p1) on the head's packs; S0 is the token
** scores' column of key 0 (prl_attention_rows's S is S0 + k0). Same GEMMs, same bits. */
static void attention_rows_packed(float *out, int ldo, float *Ss, float *S0, int ldS,
                                  const float *q, int ldq, const prl_attn_keys *kk,
                                  const head_packs *hp, int p0, int p1, int dn, int dr, int dv)
{
    int rows = p1 - p0, k0 = kk->k0, nk = p1 - k0, ns = kk->ns;
    float scale = attn_scale(kk->scale, dn + dr);
    prl_gemm_f32_packed_rows(0, rows, 0, dn, k0, nk, scale, q, ldq, &hp->a, 0, S0, ldS);
    prl_gemm_f32_packed_rows(0, rows, 0, dr, k0, nk, scale, q + dn, ldq, &hp->b, 1, S0, ldS);
    sink_scores(Ss, ldS, q, ldq, kk, rows, dn, dr, scale);
    softmax_block(Ss, S0 + k0, ldS, kk, p0, p1);
    if (ns > 0) prl_gemm(0, 0, rows, dv, ns, 1, Ss, ldS, kk->sk + dn, kk->ldsk, 0, out, ldo);
    prl_gemm_f32_packed_rows(0, rows, k0, nk, 0, dv, 1, S0 + k0, ldS, &hp->c, ns > 0 ? 1 : 0, out,
                             ldo);
}
#endif

static void attention_forward_head(void *p, int task)
{
    attn_ctx *c = p;
    prl_attn_shape sh = c->sh;
    int b = task / sh.H, h = task % sh.H, T = sh.T, H = sh.H, ns = sh.ns, ldS = ns + T;
    int dq = sh.dn + sh.dr, len = seq_len(c, b);
    const prl_real *q = c->q + (size_t)b * T * H * dq + (size_t)h * dq;
    prl_real *P = c->att + (size_t)task * T * ldS;
    prl_real *out = c->out + (size_t)b * T * H * sh.dv + (size_t)h * sh.dv;
#ifndef PRL_REAL_DOUBLE
    head_packs *hp = &tl_packs;
    int packed = len > 0 && prl_attention_packed() && pack_forward(hp, c, b, h, len);
#endif
    for (int r0 = 0; r0 < len; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < len ? r0 + ATT_BLOCK : len;
        prl_attn_keys kk = head_keys(c, b, h, r0);
        prl_real *Pb = P + (size_t)r0 * ldS, *Ob = out + (size_t)r0 * H * sh.dv;
        const prl_real *qb = q + (size_t)r0 * H * dq;
#ifndef PRL_REAL_DOUBLE
        if (packed) {
            attention_rows_packed(Ob, H * sh.dv, Pb, Pb + ns, ldS, qb, H * dq, &kk, hp, r0, r1,
                                  sh.dn, sh.dr, sh.dv);
            continue;
        }
#endif
        prl_attention_rows(Ob, H * sh.dv, Pb, Pb + ns + kk.k0, ldS, qb, H * dq, &kk, r0, r1, sh.dn,
                           sh.dr, sh.dv);
    }
    for (int t = len; t < T; t++)
        memset(out + (size_t)t * H * sh.dv, 0, (size_t)sh.dv * sizeof *out);
}

void prl_attention_forward(prl_real *out, prl_real *att, const prl_real *q, const prl_real *kv,
                           const prl_real *kr, const prl_real *sink_kv, const prl_real *sink_kr,
                           const int32_t *lens, prl_attn_shape sh)
{
    attn_ctx c = {.out = out,
                  .att = att,
                  .q = q,
                  .kv = kv,
                  .kr = kr,
                  .sink_kv = sink_kv,
                  .sink_kr = sink_kr,
                  .lens = lens,
                  .sh = sh};
    if (sh.sel_idx) {
        prl_attention_sparse_forward(out, att, q, kv, kr, sink_kv, sink_kr, lens, sh);
        return;
    }
    prl_parallel_for(sh.B * sh.H, attention_forward_head, &c);
}

/* Per-task gradient parts: the shared rope key [B·H][T][dr], the sinks [B·H][ns][dkv + dr];
** then per pool thread one block of dS rows [ATT_BLOCK][ns + T]. */
static size_t dkr_parts_len(prl_attn_shape sh) { return (size_t)sh.B * sh.H * sh.T * sh.dr; }
static size_t dsink_parts_len(prl_attn_shape sh)
{
    return (size_t)sh.B * sh.H * sh.ns * (sh.dn + sh.dv + sh.dr);
}

size_t prl_attention_scratch(prl_attn_shape sh)
{
    return dkr_parts_len(sh) + dsink_parts_len(sh) +
           (size_t)prl_pool_threads() * ATT_BLOCK * (sh.ns + sh.T);
}

#ifdef ROW_AVX2
/* dS[i] = scale·P[i]·(dS[i] − dot) for i in [0, n), 8 at a time, the same operations in the
** same order as the scalar loop (which finishes the tail); returns how many it did. */
PRL_AVX2 static int dsoftmax_avx2(float *dS, const float *P, int n, float scale, float dot)
{
    int i = 0;
    prl_v8f k = prl_v8_splat(scale), d = prl_v8_splat(dot);
    for (; i + 8 <= n; i += 8)
        prl_v8_store(dS + i, k * prl_v8_load(P + i) * (prl_v8_load(dS + i) - d));
    return i;
}
#endif

/* dS = scale · P ⊙ (dP − Σ P·dP) over one row's sinks and allowed tokens (others are 0). The
** dot is a scalar sum (its order is the result's); the element-wise part runs 8 lanes. */
static void softmax_row_backward(prl_real *dSs, const prl_real *Ps, int ns, prl_real *dS,
                                 const prl_real *P, int lo, int hi, int width, prl_real scale)
{
    prl_real dot = 0;
    for (int i = 0; i < ns; i++) dot += Ps[i] * dSs[i];
    for (int s = lo; s <= hi; s++) dot += P[s] * dS[s];
    for (int i = 0; i < ns; i++) dSs[i] = scale * Ps[i] * (dSs[i] - dot);
    int s = lo;
#ifdef ROW_AVX2
    if (prl_row_kernels_avx2() && hi >= lo)
        s += dsoftmax_avx2(dS + lo, P + lo, hi - lo + 1, scale, dot);
#endif
    for (; s <= hi; s++) dS[s] = scale * P[s] * (dS[s] - dot);
    for (s = 0; s < lo; s++) dS[s] = 0;
    for (s = hi + 1; s < width; s++) dS[s] = 0;
}

#ifndef PRL_REAL_DOUBLE
/* The backward's packs of head h of sequence b over its first len keys: a = vᵀ [dv, len]
** (dP's B), b = [k_nope | kr] [len, dn + dr] (dq's B: one GEMM for both parts of dq, the
** columns' sums unchanged). 0 when out of memory. */
static int pack_backward(head_packs *hp, const attn_ctx *c, int b, int h, int len)
{
    prl_attn_shape sh = c->sh;
    int dkv = sh.dn + sh.dv, ldk = sh.H * dkv, dq = sh.dn + sh.dr;
    const float *k = c->kv + (size_t)b * sh.T * ldk + (size_t)h * dkv;
    const float *kr = c->kr + (size_t)b * sh.T * sh.dr;
    float *kk = packs_tmp(hp, (size_t)len * dq);
    if (!kk) return 0;
    for (int t = 0; t < len; t++) {
        memcpy(kk + (size_t)t * dq, k + (size_t)t * ldk, (size_t)sh.dn * sizeof *kk);
        memcpy(kk + (size_t)t * dq + sh.dn, kr + (size_t)t * sh.dr, (size_t)sh.dr * sizeof *kk);
    }
    return !prl_packed_b_repack_here(&hp->a, 1, sh.dv, len, k + sh.dn, ldk) &&
           !prl_packed_b_repack_here(&hp->b, 0, len, dq, kk, dq);
}

/* attention_backward_head's blocks on the head's packs; dS the thread's score block. The
** token products are those of the reference below with two fusions that keep every sum:
** dq's nope and rope parts in one GEMM over [k_nope | kr], and dk_nope and the rope key's
** head part in one GEMM dSᵀ·[q_nope | q_rope] into a scratch (alpha 1, beta 0: the bare
** sums), then added to each (the reference's c + 1·sum: the same bits; a block's depth is
** its rows, within one GEMM depth block). Returns 0 (nothing done) when out of memory. */
static int backward_head_packed(attn_ctx *c, int task, float *dS)
{
    prl_attn_shape sh = c->sh;
    int b = task / sh.H, h = task % sh.H, T = sh.T, H = sh.H, ns = sh.ns, ldS = ns + T;
    int dn = sh.dn, dr = sh.dr, dv = sh.dv, dq = dn + dr, dkv = dn + dv, len = seq_len(c, b);
    head_packs *hp = &tl_packs;
    if (!pack_backward(hp, c, b, h, len)) return 0;
    float *tmp = packs_tmp(hp, (size_t)len * dq); /* the kk copy is packed: reused */
    if (!tmp) return 0;
    float scale = attn_scale(sh.scale, dq);
    size_t qoff = (size_t)b * T * H * dq + (size_t)h * dq;
    size_t kvoff = (size_t)b * T * H * dkv + (size_t)h * dkv;
    const float *P = c->att + (size_t)task * T * ldS;
    const float *dO = c->dout + (size_t)b * T * H * dv + (size_t)h * dv;
    float *dkr_h = c->dkr_heads + (size_t)task * T * dr;
    float *dsk_h = c->dsink_heads + (size_t)task * ns * (dkv + dr),
          *dskr_h = dsk_h + (size_t)ns * dkv;
    for (int r0 = 0; r0 < len; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < len ? r0 + ATT_BLOCK : len, rows = r1 - r0;
        int k0 = prl_attention_key_start(r0, sh.window), nk = r1 - k0;
        const float *Pb = P + (size_t)r0 * ldS, *Pt = Pb + ns + k0;
        const float *dOb = dO + (size_t)r0 * H * dv, *qb = c->q + qoff + (size_t)r0 * H * dq;
        float *dkb = c->dkv + kvoff + (size_t)k0 * H * dkv, *dSt = dS + ns + k0;
        float *dqb = c->dq + qoff + (size_t)r0 * H * dq;
        prl_gemm_f32_packed_rows(0, rows, 0, dv, k0, nk, 1, dOb, H * dv, &hp->a, 0, dS + ns, ldS);
        prl_gemm(1, 0, nk, dv, rows, 1, Pt, ldS, dOb, H * dv, 1, dkb + dn, H * dkv);
        if (ns > 0) {
            prl_gemm(0, 1, rows, ns, dv, 1, dOb, H * dv, c->sink_kv + (size_t)h * dkv + dn, H * dkv,
                     0, dS, ldS);
            prl_gemm(1, 0, ns, dv, rows, 1, Pb, ldS, dOb, H * dv, 1, dsk_h + dn, dkv);
        }
        for (int t = r0; t < r1; t++)
            softmax_row_backward(
                dS + (size_t)(t - r0) * ldS, Pb + (size_t)(t - r0) * ldS, ns,
                dSt + (size_t)(t - r0) * ldS, Pt + (size_t)(t - r0) * ldS,
                row_lo_packed(t, k0, sh.window, sh.pos ? sh.pos + (size_t)b * T + t : NULL), t - k0,
                nk, scale);
        prl_gemm_f32_packed_rows(0, rows, k0, nk, 0, dq, 1, dSt, ldS, &hp->b, 1, dqb, H * dq);
        prl_gemm(1, 0, nk, dq, rows, 1, dSt, ldS, qb, H * dq, 0, tmp, dq);
        for (int i = 0; i < nk; i++) {
            float *dk = dkb + (size_t)i * H * dkv, *dkr = dkr_h + (size_t)(k0 + i) * dr;
            const float *s = tmp + (size_t)i * dq;
            for (int j = 0; j < dn; j++) dk[j] += s[j];
            for (int j = 0; j < dr; j++) dkr[j] += s[dn + j];
        }
        if (ns > 0) { /* the sink columns, as the reference */
            prl_gemm(0, 0, rows, dn, ns, 1, dS, ldS, c->sink_kv + (size_t)h * dkv, H * dkv, 1, dqb,
                     H * dq);
            prl_gemm(0, 0, rows, dr, ns, 1, dS, ldS, c->sink_kr, dr, 1, dqb + dn, H * dq);
            prl_gemm(1, 0, ns, dn, rows, 1, dS, ldS, qb, H * dq, 1, dsk_h, dkv);
            prl_gemm(1, 0, ns, dr, rows, 1, dS, ldS, qb + dn, H * dq, 1, dskr_h, dr);
        }
    }
    return 1;
}
#endif

static void attention_backward_head(void *p, int task)
{
    attn_ctx *c = p;
    prl_attn_shape sh = c->sh;
    int b = task / sh.H, h = task % sh.H, T = sh.T, H = sh.H, ns = sh.ns, ldS = ns + T;
    int dn = sh.dn, dr = sh.dr, dv = sh.dv, dq = dn + dr, dkv = dn + dv, len = seq_len(c, b);
    prl_real scale = attn_scale(sh.scale, dq);
    size_t qoff = (size_t)b * T * H * dq + (size_t)h * dq;
    size_t kvoff = (size_t)b * T * H * dkv + (size_t)h * dkv;
    const prl_real *P = c->att + (size_t)task * T * ldS;
    const prl_real *dO = c->dout + (size_t)b * T * H * dv + (size_t)h * dv;
    const prl_real *kr = c->kr + (size_t)b * T * dr;
    prl_real *dS = c->scratch + (size_t)prl_pool_worker() * ATT_BLOCK * ldS;
    prl_real *dkr_h = c->dkr_heads + (size_t)task * T * dr;
    prl_real *dsk_h = c->dsink_heads + (size_t)task * ns * (dkv + dr),
             *dskr_h = dsk_h + (size_t)ns * dkv;
    memset(dkr_h, 0, (size_t)T * dr * sizeof *dkr_h);
    memset(dsk_h, 0, (size_t)ns * (dkv + dr) * sizeof *dsk_h);
#ifndef PRL_REAL_DOUBLE
    if (len > 0 && prl_attention_packed() && backward_head_packed(c, task, dS)) return;
#endif
    for (int r0 = 0; r0 < len; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < len ? r0 + ATT_BLOCK : len, rows = r1 - r0;
        int k0 = prl_attention_key_start(r0, sh.window), nk = r1 - k0;
        const prl_real *Pb = P + (size_t)r0 * ldS, *Pt = Pb + ns + k0;
        const prl_real *dOb = dO + (size_t)r0 * H * dv;
        const prl_real *kb = c->kv + kvoff + (size_t)k0 * H * dkv, *krb = kr + (size_t)k0 * dr;
        prl_real *dkb = c->dkv + kvoff + (size_t)k0 * H * dkv, *dSt = dS + ns + k0;
        /* dP = dO·vᵀ;  dv[k0, r1) += Pᵀ·dO  (tokens, then sinks) */
        prl_gemm(0, 1, rows, nk, dv, 1, dOb, H * dv, kb + dn, H * dkv, 0, dSt, ldS);
        prl_gemm(1, 0, nk, dv, rows, 1, Pt, ldS, dOb, H * dv, 1, dkb + dn, H * dkv);
        if (ns > 0) {
            prl_gemm(0, 1, rows, ns, dv, 1, dOb, H * dv, c->sink_kv + (size_t)h * dkv + dn, H * dkv,
                     0, dS, ldS);
            prl_gemm(1, 0, ns, dv, rows, 1, Pb, ldS, dOb, H * dv, 1, dsk_h + dn, dkv);
        }
        for (int t = r0; t < r1; t++)
            softmax_row_backward(
                dS + (size_t)(t - r0) * ldS, Pb + (size_t)(t - r0) * ldS, ns,
                dSt + (size_t)(t - r0) * ldS, Pt + (size_t)(t - r0) * ldS,
                row_lo_packed(t, k0, sh.window, sh.pos ? sh.pos + (size_t)b * T + t : NULL), t - k0,
                nk, scale);
        /* dq_nope += dS·k_nope; dq_rope += dS·kr; dk_nope += dSᵀ·q_nope; dkr_h += dSᵀ·q_rope */
        prl_real *dqb = c->dq + qoff + (size_t)r0 * H * dq;
        const prl_real *qb = c->q + qoff + (size_t)r0 * H * dq;
        prl_gemm(0, 0, rows, dn, nk, 1, dSt, ldS, kb, H * dkv, 1, dqb, H * dq);
        prl_gemm(0, 0, rows, dr, nk, 1, dSt, ldS, krb, dr, 1, dqb + dn, H * dq);
        prl_gemm(1, 0, nk, dn, rows, 1, dSt, ldS, qb, H * dq, 1, dkb, H * dkv);
        prl_gemm(1, 0, nk, dr, rows, 1, dSt, ldS, qb + dn, H * dq, 1, dkr_h + (size_t)k0 * dr, dr);
        if (ns > 0) { /* the same four products for the sink columns */
            prl_gemm(0, 0, rows, dn, ns, 1, dS, ldS, c->sink_kv + (size_t)h * dkv, H * dkv, 1, dqb,
                     H * dq);
            prl_gemm(0, 0, rows, dr, ns, 1, dS, ldS, c->sink_kr, dr, 1, dqb + dn, H * dq);
            prl_gemm(1, 0, ns, dn, rows, 1, dS, ldS, qb, H * dq, 1, dsk_h, dkv);
            prl_gemm(1, 0, ns, dr, rows, 1, dS, ldS, qb + dn, H * dq, 1, dskr_h, dr);
        }
    }
}

/* The shared rope key gets the sum over heads, added in head order; the sinks the sum over
** sequences and heads, in (sequence, head) order. */
static void reduce_heads(prl_real *dkr, prl_real *dsink_kv, prl_real *dsink_kr,
                         const prl_real *dkr_parts, const prl_real *dsink_parts, prl_attn_shape sh)
{
    int T = sh.T, dr = sh.dr, H = sh.H, ns = sh.ns, wkv = sh.dn + sh.dv;
    for (int b = 0; b < sh.B; b++)
        for (int h = 0; h < H; h++) {
            const prl_real *src = dkr_parts + (size_t)(b * H + h) * T * dr;
            prl_real *dst = dkr + (size_t)b * T * dr;
            for (size_t i = 0; i < (size_t)T * dr; i++) dst[i] += src[i];
            const prl_real *sk = dsink_parts + (size_t)(b * H + h) * ns * (wkv + dr);
            for (int i = 0; i < ns; i++) {
                for (int j = 0; j < wkv; j++)
                    dsink_kv[(size_t)i * H * wkv + (size_t)h * wkv + j] += sk[(size_t)i * wkv + j];
                for (int j = 0; j < dr; j++)
                    dsink_kr[(size_t)i * dr + j] += sk[(size_t)ns * wkv + (size_t)i * dr + j];
            }
        }
}

void prl_attention_backward(prl_real *dq, prl_real *dkv, prl_real *dkr, prl_real *dsink_kv,
                            prl_real *dsink_kr, const prl_real *dout, const prl_real *att,
                            const prl_real *q, const prl_real *kv, const prl_real *kr,
                            const prl_real *sink_kv, const prl_real *sink_kr, prl_real *scratch,
                            const int32_t *lens, prl_attn_shape sh)
{
    attn_ctx c = {.dq = dq,
                  .dkv = dkv,
                  .dkr_heads = scratch,
                  .dsink_heads = scratch + dkr_parts_len(sh),
                  .scratch = scratch + dkr_parts_len(sh) + dsink_parts_len(sh),
                  .dout = dout,
                  .att = (prl_real *)att,
                  .q = q,
                  .kv = kv,
                  .kr = kr,
                  .sink_kv = sink_kv,
                  .sink_kr = sink_kr,
                  .lens = lens,
                  .sh = sh};
    if (sh.sel_idx)
        prl_attention_sparse_backward(dq, dkv, c.dkr_heads, c.dsink_heads, c.scratch, dout, att, q,
                                      kv, kr, sink_kv, sink_kr, lens, sh);
    else prl_parallel_for(sh.B * sh.H, attention_backward_head, &c);
    reduce_heads(dkr, dsink_kv, dsink_kr, scratch, c.dsink_heads, sh);
}
