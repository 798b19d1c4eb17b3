/*
** ops.h — the engine's operators as forward/backward pairs (private to engine/ and tests).
**
** Conventions (llm.c): outputs first, then inputs, then sizes; gradient arguments carry a
** `d` prefix; every backward ACCUMULATES (+=) into input and parameter gradients, so a
** residual branch needs no extra add. Each function starts with a shape comment. Linear
** weights are stored out×in, so a Linear is out = inp · wᵀ.
**
** Parallel ops split their work into fixed blocks (PRL_ROW_BLOCK rows) that do not depend
** on the thread count, so results are bitwise identical for any number of threads.
*/
#ifndef PRL_OPS_H
#define PRL_OPS_H

#include "engine/engine.h"

enum { PRL_ROW_BLOCK = 128, PRL_ATT_BLOCK = 64 /* causal attention query block */ };

/* eps of the RMSNorms on the compressed query and key/value latents (q_a_layernorm,
** kv_a_layernorm), as in DeepSeek-V3's modelling code. */
#define PRL_LATENT_NORM_EPS 1e-6

/* exp for the hot loops (softmax, log-sum-exp, SiLU). The float build uses prl_expf, an
** inline Cephes-style polynomial (max relative error ~2 ulp) that the compiler can keep in
** registers and vectorise; it is the same code on every path, so results stay reproducible.
** The double build (gradient checks) uses libm's exp. */
#ifdef PRL_REAL_DOUBLE
#define PRL_EXP exp
#define PRL_LOG log
#define PRL_SQRT sqrt
#else
#define PRL_EXP prl_expf
#define PRL_LOG logf
#define PRL_SQRT sqrtf
#endif

/* exp(r) for |r| <= ln 2 / 2 from p = 1.9875691500e-4 on: one polynomial for the scalar and
** the vector prl_expf (GCC's vector operators broadcast the constants), so both perform the
** same IEEE operations. */
#define PRL_EXP_POLY(p, r)                                                                         \
    do {                                                                                           \
        p = p * r + 1.3981999507e-3f;                                                              \
        p = p * r + 8.3334519073e-3f;                                                              \
        p = p * r + 4.1665795894e-2f;                                                              \
        p = p * r + 1.6666665459e-1f;                                                              \
        p = p * r + 5.0000001201e-1f;                                                              \
        p = p * (r * r) + r + 1.0f;                                                                \
    } while (0)

static inline float prl_expf(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    /* n = round(x / ln 2) by the 1.5·2^23 trick (default rounding mode), r = x − n·ln 2 */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    PRL_EXP_POLY(p, r);
    union {
        uint32_t u;
        float f;
    } scale = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* prl_expf on 4 lanes (GCC vector extensions; SSE on baseline x86-64). Each lane performs the
** same IEEE operations as prl_expf, so vector and scalar results are bitwise equal. */
typedef float prl_v4f __attribute__((vector_size(16)));
typedef int32_t prl_v4i __attribute__((vector_size(16)));

static inline prl_v4f prl_v4_splat(float x) { return (prl_v4f){x, x, x, x}; }

static inline prl_v4f prl_v4_select(prl_v4i mask, prl_v4f a, prl_v4f b)
{
    return (prl_v4f)(((prl_v4i)a & mask) | ((prl_v4i)b & ~mask));
}

static inline prl_v4f prl_expf4(prl_v4f x)
{
    x = prl_v4_select(x < prl_v4_splat(-87.0f), prl_v4_splat(-87.0f), x);
    x = prl_v4_select(x > prl_v4_splat(88.0f), prl_v4_splat(88.0f), x);
    prl_v4f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    prl_v4f r = x - n * 0.693359375f + n * 2.12194440e-4f;
    prl_v4f p = prl_v4_splat(1.9875691500e-4f);
    PRL_EXP_POLY(p, r);
    prl_v4i e = (__builtin_convertvector(n, prl_v4i) + 127) << 23;
    return p * (prl_v4f)e;
}

static inline prl_v4f prl_v4_load(const float *p)
{
    prl_v4f v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

static inline void prl_v4_store(float *p, prl_v4f v) { __builtin_memcpy(p, &v, sizeof v); }

/* 8 lanes for the AVX2 forms of the row kernels (functions marked PRL_AVX2, run only when
** prl_row_kernels_avx2() says so). prl_expf8 performs prl_expf's IEEE operations on each
** lane and C11 mode contracts no multiply-add, so every 8-lane loop gives the bits of its
** scalar (reference) loop. */
#if defined(__x86_64__) || defined(__i386__)
#define PRL_OPS_X86 1
#define PRL_AVX2 __attribute__((target("avx2")))
typedef float prl_v8f __attribute__((vector_size(32)));
typedef int32_t prl_v8i __attribute__((vector_size(32)));

PRL_AVX2 static inline prl_v8f prl_v8_splat(float x) { return (prl_v8f){x, x, x, x, x, x, x, x}; }

PRL_AVX2 static inline prl_v8f prl_v8_load(const float *p)
{
    prl_v8f v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

PRL_AVX2 static inline void prl_v8_store(float *p, prl_v8f v) { __builtin_memcpy(p, &v, sizeof v); }

/* Lanes 0..3 and 4..7. */
PRL_AVX2 static inline prl_v4f prl_v8_lo(prl_v8f v) { return (prl_v4f){v[0], v[1], v[2], v[3]}; }
PRL_AVX2 static inline prl_v4f prl_v8_hi(prl_v8f v) { return (prl_v4f){v[4], v[5], v[6], v[7]}; }

/* Lane-wise a > b ? a : b, the scalar loops' max rule (a NaN a keeps b). */
PRL_AVX2 static inline prl_v8f prl_v8_max(prl_v8f a, prl_v8f b)
{
    prl_v8i gt = a > b;
    return (prl_v8f)(((prl_v8i)a & gt) | ((prl_v8i)b & ~gt));
}

PRL_AVX2 static inline prl_v8f prl_expf8(prl_v8f x)
{
    prl_v8i lo = x<prl_v8_splat(-87.0f), hi = x> prl_v8_splat(88.0f);
    x = (prl_v8f)(((prl_v8i)prl_v8_splat(-87.0f) & lo) | ((prl_v8i)x & ~lo));
    x = (prl_v8f)(((prl_v8i)prl_v8_splat(88.0f) & hi) | ((prl_v8i)x & ~hi));
    prl_v8f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    prl_v8f r = x - n * 0.693359375f + n * 2.12194440e-4f;
    prl_v8f p = prl_v8_splat(1.9875691500e-4f);
    PRL_EXP_POLY(p, r);
    prl_v8i e = (__builtin_convertvector(n, prl_v8i) + 127) << 23;
    return p * (prl_v8f)e;
}

/* max(m, x[i] · k for i in [0, n)) under the scalar rule `v > m ? v : m` taken in index
** order: lanes start at m and are combined in lane order, which gives the scalar loop's
** value (ties between +0 and −0 aside, which no caller can tell apart: it subtracts the max). */
PRL_AVX2 static inline float prl_v8_max_scaled(float m, const float *x, int n, float k, int *done)
{
    prl_v8f acc = prl_v8_splat(m);
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = prl_v8_max(prl_v8_load(x + i) * k, acc);
    for (int j = 0; j < 8; j++) m = acc[j] > m ? acc[j] : m;
    *done = i;
    return m;
}
#endif

/* x[0..n) rounded in place to precision p (precision.c; a no-op in fp32): the rounding of an
** op output in a reduced-precision path, in either build. */
static inline void prl_round_reals(prl_precision p, prl_real *x, size_t n)
{
    if (p == PRL_PRECISION_FP32) return;
#ifdef PRL_REAL_DOUBLE
    prl_round_doubles(p, x, n);
#else
    prl_round_floats(p, x, n);
#endif
}
/* Run fn(ctx, r0, r1) over [0, n_rows) in fixed blocks of PRL_ROW_BLOCK rows on the pool. */
typedef void (*prl_rows_fn)(void *ctx, int r0, int r1);
void prl_parallel_rows(int n_rows, prl_rows_fn fn, void *ctx);

/* out[N,OC] = inp[N,C] · w[OC,C]ᵀ   (beta = 0: overwrite, 1: accumulate) */
void prl_matmul_forward(prl_real *out, const prl_real *inp, const prl_real *w, int N, int C, int OC,
                        prl_real beta);
/* dinp[N,C] += dout[N,OC] · w[OC,C];  dw[OC,C] += dout[N,OC]ᵀ · inp[N,C]
** (either gradient may be NULL to skip it) */
void prl_matmul_backward(prl_real *dinp, prl_real *dw, const prl_real *dout, const prl_real *inp,
                         const prl_real *w, int N, int C, int OC);

/* out[N,C] = g ⊙ inp / sqrt(mean(inp²) + eps); rstd[N] saved. inp and out rows have strides
** in_stride / out_stride (>= C) so a slice of a wider row can be normalised in place. */
void prl_rmsnorm_forward(prl_real *out, prl_real *rstd, const prl_real *inp, const prl_real *g,
                         int N, int C, int in_stride, int out_stride, double eps);
/* dinp += ∂/∂inp, dg += ∂/∂g, given dout (same strides as the forward). */
void prl_rmsnorm_backward(prl_real *dinp, prl_real *dg, const prl_real *dout, const prl_real *inp,
                          const prl_real *g, const prl_real *rstd, int N, int C, int in_stride,
                          int dout_stride);

/* Half-split RoPE tables for positions [0, T): cos/sin [T, D/2], angles in double. */
void prl_rope_tables(prl_real *cos_t, prl_real *sin_t, int T, int D, double theta);
/* The same with rope_scaling (NULL or not yarn: prl_rope_tables): YaRN's frequencies, and
** cos and sin multiplied by its attention factor (docs/model.md "RoPE"). */
void prl_rope_tables_scaled(prl_real *cos_t, prl_real *sin_t, int T, int D, double theta,
                            const prl_rope_scaling *y);
/* YaRN's cos/sin factor: attention_factor if given, else mscale(f, mscale)/mscale(f,
** mscale_all_dim) when both are set, else mscale(f, 1); 1 without YaRN. */
double prl_rope_attention_factor(const prl_rope_scaling *y);
/* In place on x[B*T rows][heads][D] at column offset `col` in rows of `stride`: the pair of
** frequency i — (i, i+D/2), or (2i, 2i+1) when `interleave` — rotated by pos·inv_freq_i;
** pos = row index mod T. */
void prl_rope_forward(prl_real *x, const prl_real *cos_t, const prl_real *sin_t, int N, int T,
                      int heads, int head_stride, int col, int stride, int D, int interleave);
/* The same rotation with explicit positions: row n is at position pos[n] (< table length). */
void prl_rope_at(prl_real *x, const prl_real *cos_t, const prl_real *sin_t, const int32_t *pos,
                 int N, int heads, int head_stride, int col, int stride, int D, int interleave);
/* The transposed rotation applied to a gradient, in place. */
void prl_rope_backward(prl_real *dx, const prl_real *cos_t, const prl_real *sin_t, int N, int T,
                       int heads, int head_stride, int col, int stride, int D, int interleave);
/* Packed rows (prl_batch.pos): forward (sign 1) or transposed (sign −1) rotation of row n at
** position pos[n], a negative pos (a padding row) at 0; pos NULL: prl_rope_forward /
** prl_rope_backward (row n at n mod T). */
void prl_rope_packed(prl_real *x, const prl_real *cos_t, const prl_real *sin_t, const int32_t *pos,
                     int N, int T, int heads, int head_stride, int col, int stride, int D,
                     int interleave, int sign);
/* First key position row t (at position pos of its segment) may read in a packed row: the
** segment's first, t − pos; t itself for a padding row (pos < 0, it sees only itself). */
static inline int prl_segment_start(int t, int32_t pos) { return pos >= 0 ? t - pos : t; }

/* The key set of a causal MLA attention call (naive form):
**   tokens: key rows of positions [k0, p1) — k [.., dn | dv] per row at stride ldk (k_nope
**     then v), kr [.., dr] the shared rope key at stride ldkr; row j is position k0 + j;
**   window: 0 = causal (row t sees every token s <= t); W > 0 = sliding window, row t sees
**     t − W < s <= t (docs/model.md, SWA);
**   sinks: ns parameter sinks visible to every row, rows sk [ns, dn | dv] at ldsk and
**     position-free rope keys skr [ns, dr] at ldskr (docs/model.md, parameter sinks);
**   sel: NULL, or a DSA selection (docs/model.md, DSA): row t − p0 of the query rows at
**     stride ldsel, column = key position; a token key s is visible only where it is non-zero
**     (the sinks always are);
**   pos: NULL, or the query rows' positions in their segments (packed rows, prl_batch.pos;
**     entry t − p0): token keys before prl_segment_start(t, pos) are hidden. */
typedef struct prl_attn_keys {
    const prl_real *k, *kr;
    int ldk, ldkr, k0, window;
    const prl_real *sk, *skr;
    int ldsk, ldskr, ns;
    const uint8_t *sel;
    int ldsel;
    const int32_t *pos;
    double scale; /* softmax scale; 0 = (dn + dr)^(−1/2) */
} prl_attn_keys;

/* Shape of a whole-batch attention call: B sequences of T tokens, H heads, window W (0 =
** causal) and ns sinks; sel NULL, or a DSA selection [B*T, T] (row b*T+t, column = key
** position, non-zero = visible): the softmax runs over the sinks and the selected tokens only,
** so the gradient reaches only those; pos NULL, or [B*T] positions in the segments of packed
** rows (prl_batch.pos): a row sees only the keys of its own segment (block-diagonal causal). */
typedef struct prl_attn_shape {
    int B, T, H, dn, dr, dv, window, ns;
    const uint8_t *sel;
    /* sel_idx NULL: a selection is applied as a mask over the dense scores (the naive
    ** reference). Else the sparse kernel (ops_attn_sparse.c) reads only the selected keys:
    ** sel_idx [B*T, sel_k] holds row b*T+t's selected key positions in increasing order, ended
    ** by -1 when fewer than sel_k (prl_attn_sel_index); sel is then not read, window must be
    ** 0, and att is compact: [B, H, T, ns+sel_k], column ns+j the probability of key
    ** sel_idx[row][j]. The result is bitwise the masked one's (same sums in the same order). */
    const int32_t *sel_idx;
    int sel_k;
    const int32_t *pos;
    double scale; /* softmax scale; 0 = (dn + dr)^(−1/2) (YaRN: prl_config_softmax_scale) */
} prl_attn_shape;

/* First key position a query block starting at p0 reads: 0 for causal attention; for a
** window W the multiple of PRL_GEMM_KC at or below max(0, p0 − W + 1), so that the GEMM
** depth blocks of P·V sit at the same absolute positions in every caller (the train path's
** query blocks and the decode engine's single rows give the same bits). */
int prl_attention_key_start(int p0, int window);

/* Causal MLA attention, naive form, for B sequences of T tokens and H heads.
**   q   [B*T, H*(dn+dr)]  per head [nope | rope]        (rope already applied)
**   kv  [B*T, H*(dn+dv)]  per head [k_nope | v]
**   kr  [B*T, dr]         shared rope key               (rope already applied)
**   sink_kv [ns, H*(dn+dv)], sink_kr [ns, dr]          (NULL when ns = 0)
**   out [B*T, H*dv];  att [B, H, T, ns+T] softmax probabilities saved for backward: sink i
**   at column i, token s at column ns + s.
** lens[b] (NULL = T): rows and keys at or past lens[b] are skipped (those output rows are
** zero). Only the allowed entries of att (and those between them in a query block) are
** written. */
void prl_attention_forward(prl_real *out, prl_real *att, const prl_real *q, const prl_real *kv,
                           const prl_real *kr, const prl_real *sink_kv, const prl_real *sink_kr,
                           const int32_t *lens, prl_attn_shape sh);
/* One head of naive attention for the query rows at positions [p0, p1) of one sequence over
** the key set `keys` (keys->k0 = prl_attention_key_start(p0, window) or lower): the single
** code both paths run (the train path per query block, the decode engine's naive form per
** step). Row t of the scores goes to Ss (ns sink columns) and S (token columns, column j =
** position k0 + j), both at row stride ldS; they are left holding the softmax over the sinks
** and the allowed tokens, with zeros at the other token columns up to p1. */
void prl_attention_rows(prl_real *out, int ldo, prl_real *Ss, prl_real *S, int ldS,
                        const prl_real *q, int ldq, const prl_attn_keys *keys, int p0, int p1,
                        int dn, int dr, int dv);
/* dq, dkv, dkr, dsink_kv, dsink_kr accumulate (the sink gradients are summed over every
** query of the batch); scratch holds prl_attention_scratch(sh) reals. */
void prl_attention_backward(prl_real *dq, prl_real *dkv, prl_real *dkr, prl_real *dsink_kv,
                            prl_real *dsink_kr, const prl_real *dout, const prl_real *att,
                            const prl_real *q, const prl_real *kv, const prl_real *kr,
                            const prl_real *sink_kv, const prl_real *sink_kr, prl_real *scratch,
                            const int32_t *lens, prl_attn_shape sh);
size_t prl_attention_scratch(prl_attn_shape sh);
/* 1 when the dense train-path attention packs each head's keys and values once for all its
** query blocks (the float build's default); prl_attention_packed_set(0) runs the per-block
** reference GEMMs instead. Both give the same bits (tests compare them); set returns the
** previous state. */
int prl_attention_packed(void);
int prl_attention_packed_set(int on);

/* ---- sparse attention over a selection (ops_attn_sparse.c; DSA's sparse stage) ---- */

/* Row lists of a selection mask: idx [N, k] gets, for each row n, the positions s < T with
** sel[n*T + s] != 0 in increasing order (at most k of them), then -1 when fewer. */
void prl_attn_sel_index(int32_t *idx, const uint8_t *sel, int N, int T, int k);
/* Number of entries of a row list before its -1 (at most k). */
int prl_attn_sel_count(const int32_t *idx, int k);
/* One query row of naive attention over the n selected keys idx[0..n) (positions, in
** increasing order, relative to keys->k; keys->sel, k0 and window unused): Ss [ns] and S [n]
** are left holding the softmax over the sinks and the selected tokens; out [dv]. The code both
** paths run; bitwise prl_attention_rows with the selection as a mask. */
void prl_attention_row_sparse(prl_real *out, prl_real *Ss, prl_real *S, const prl_real *q,
                              const prl_attn_keys *keys, const int32_t *idx, int n, int dn, int dr,
                              int dv);
/* The heads of prl_attention_forward / _backward when sh.sel_idx is set (internal to the two). */
void prl_attention_sparse_forward(prl_real *out, prl_real *att, const prl_real *q,
                                  const prl_real *kv, const prl_real *kr, const prl_real *sink_kv,
                                  const prl_real *sink_kr, const int32_t *lens, prl_attn_shape sh);
void prl_attention_sparse_backward(prl_real *dq, prl_real *dkv, prl_real *dkr_heads,
                                   prl_real *dsink_heads, prl_real *scratch, const prl_real *dout,
                                   const prl_real *att, const prl_real *q, const prl_real *kv,
                                   const prl_real *kr, const prl_real *sink_kv,
                                   const prl_real *sink_kr, const int32_t *lens, prl_attn_shape sh);

/* ModAttn causal depthwise convolution with residual, over B sequences of T rows:
**   out[n, c] = inp[n, c] + Σ_{j<k} w[c, j] · inp[n − (k−1) + j, c]
** rows before a sequence's first are zero (no term); inp rows at in_stride, out [B*T, C],
** w [C, k] (the checkpoint's [C, 1, k]). pos NULL, or [B*T] positions in the segments of
** packed rows (prl_batch.pos): a row reads no row of an earlier segment (the conv restarts
** at each boundary), a padding row (pos < 0) only itself. */
void prl_conv_forward(prl_real *out, const prl_real *inp, int in_stride, const prl_real *w, int B,
                      int T, int C, int k, const int32_t *pos);
/* dinp (rows at in_stride) += ∂/∂inp, dw += ∂/∂w, given dout [B*T, C]. */
void prl_conv_backward(prl_real *dinp, int in_stride, prl_real *dw, const prl_real *dout,
                       const prl_real *inp, const prl_real *w, int B, int T, int C, int k,
                       const int32_t *pos);
/* One output row, the code both paths run: out[c] = x[k−1][c] + Σ_j w[c, j]·x[j][c] over the
** taps j in order whose input row x[j] (the row k−1−j positions back) is not NULL. */
void prl_conv_row(prl_real *out, const prl_real *const *x, const prl_real *w, int C, int k);

/* SwiGLU FFN with the gate and up projections stacked: w13 [2F,C] = [w1; w3] (gate_proj then
** up_proj, adjacent in the parameter block), w2 [C,F]:
**   a13[N,2F] = inp·w13ᵀ;  h[N,F] = silu(a13[:, :F]) ⊙ a13[:, F:];  out[N,C] = h·w2ᵀ (+ beta·out)
** One GEMM of width 2F instead of two of width F. a13 and h are saved for the backward.
** Precision p rounds a13, h and out (beta must then be 0), as the infer path does. */
void prl_swiglu_forward(prl_real *out, prl_real *a13, prl_real *h, const prl_real *inp,
                        const prl_real *w13, const prl_real *w2, int N, int C, int F, prl_real beta,
                        prl_precision p);
/* dinp, dw13, dw2 accumulate; scratch holds 3·N·F reals. Precision p rounds the gradients of
** h and a13 (dinp is the caller's to round once complete). */
void prl_swiglu_backward(prl_real *dinp, prl_real *dw13, prl_real *dw2, prl_real *scratch,
                         const prl_real *dout, const prl_real *inp, const prl_real *a13,
                         const prl_real *h, const prl_real *w13, const prl_real *w2, int N, int C,
                         int F, prl_precision p);

/* Row-wise SwiGLU core on `rows` rows: h[r,f] = silu(a13[r,f]) · a13[r,F+f], and its backward
** (da13 [rows,2F] overwritten). */
void prl_silu_mul_forward(prl_real *h, const prl_real *a13, int rows, int F);
void prl_silu_mul_backward(prl_real *da13, const prl_real *dh, const prl_real *a13, int rows,
                           int F);

/* MoE gate for one token: s = σ(z) [E]; sel = top-K of s + bias (ties: lower index) unless
** `forced` (K ids) is given; g[k] = scale · s[sel k] / (Σ s[sel] + 1e-20) if renorm, else
** scale · s[sel k]. */
void prl_moe_gate_forward(int32_t *sel, prl_real *g, prl_real *s, const prl_real *z,
                          const prl_real *bias, const int32_t *forced, int E, int K, int renorm,
                          double scale);
/* The same with group-limited routing (DeepSeek-V3 noaux_tc): the E experts form n_group
** groups of E/n_group; only the topk_group groups with the largest sum of their two best
** s + bias compete (ties: the lower group). n_group = 1 is prl_moe_gate_forward. */
void prl_moe_gate_forward_grouped(int32_t *sel, prl_real *g, prl_real *s, const prl_real *z,
                                  const prl_real *bias, const int32_t *forced, int E, int K,
                                  int n_group, int topk_group, int renorm, double scale);
/* dz[E] += ∂/∂z given dg[K] (through g and the sigmoid; sel is a constant). */
void prl_moe_gate_backward(prl_real *dz, const prl_real *dg, const int32_t *sel, const prl_real *s,
                           int E, int K, int renorm, double scale);

/* Log-prob of target y under softmax(logits/τ) for one row of V: returns logp, stores the
** log-sum-exp of logits/τ in *lse. */
prl_real prl_logprob_forward(prl_real *lse, const prl_real *logits, int V, int y, double tau);
/* dlogits[V] += w/τ · (onehot(y) − softmax(logits/τ)). */
void prl_logprob_backward(prl_real *dlogits, const prl_real *logits, prl_real lse, int V, int y,
                          double tau, prl_real w);
/* The gradient of Σ_i w_i · log p(y_i) over n targets of one row in one pass:
** dlogits[V] += Σ_i w_i/τ · (onehot(y_i) − softmax(logits/τ)); ys in [0, V). */
void prl_logprob_backward_multi(prl_real *dlogits, const prl_real *logits, prl_real lse, int V,
                                const int32_t *ys, const prl_real *ws, int n, double tau);

/* out[N,C] = table[tokens[n]];  dtable[tokens[n]] += dout[n] (serial, in token order). */
void prl_embedding_forward(prl_real *out, const prl_real *table, const int32_t *tokens, int N,
                           int C);
void prl_embedding_backward(prl_real *dtable, const prl_real *dout, const int32_t *tokens, int N,
                            int C);

/* Scalar head on the last token (reward models, HF ...ForSequenceClassification with one
** label): out[b] = w · h[b, lens[b] − 1] (lens NULL: T). h [B, T, C], w [C], out [B]. The
** backward adds dout[b]·w to dh at that position and Σ_b dout[b]·h[b, last] to dw, in row
** order (fixed reduction). */
void prl_score_head_forward(prl_real *out, const prl_real *h, const prl_real *w,
                            const int32_t *lens, int B, int T, int C);
void prl_score_head_backward(prl_real *dh, prl_real *dw, const prl_real *dout, const prl_real *h,
                             const prl_real *w, const int32_t *lens, int B, int T, int C);

#endif /* PRL_OPS_H */
