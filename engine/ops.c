/*
** ops.c — forward/backward kernels of the train path (see ops.h for the conventions); the
** attention kernels are in ops_attn.c.
**
** GEMMs go to prl's batch-invariant GEMM (gemm.c; OpenBLAS's dgemm in the double build), one
** call per fixed-size block of rows, blocks spread over prl's pool; everything else is plain C
** loops in a fixed order, the hot element-wise ones also in an 8-lane AVX2 form (chosen at run
** time, same bits: ROW_AVX2). Reductions that matter for
** bitwise reproducibility (a row's sum, an expert's weight gradient) are always done by one
** task in index order.
*/
#include "engine/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(PRL_OPS_X86) && !defined(PRL_REAL_DOUBLE)
#define ROW_AVX2 1 /* the float build's 8-lane row kernels */
#endif

void prl_gemm(int trans_a, int trans_b, int M, int N, int K, prl_real alpha, const prl_real *A,
              int lda, const prl_real *B, int ldb, prl_real beta, prl_real *C, int ldc)
{
#ifdef PRL_REAL_DOUBLE
    prl_dgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    prl_gemm_f32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

static int n_blocks(int rows) { return (rows + PRL_ROW_BLOCK - 1) / PRL_ROW_BLOCK; }

typedef struct rows_ctx {
    prl_rows_fn fn;
    void *ctx;
    int n;
} rows_ctx;

static void rows_task(void *p, int blk)
{
    rows_ctx *c = p;
    int r0 = blk * PRL_ROW_BLOCK, r1 = r0 + PRL_ROW_BLOCK < c->n ? r0 + PRL_ROW_BLOCK : c->n;
    c->fn(c->ctx, r0, r1);
}

void prl_parallel_rows(int n_rows, prl_rows_fn fn, void *ctx)
{
    rows_ctx c = {.fn = fn, .ctx = ctx, .n = n_rows};
    prl_parallel_for(n_blocks(n_rows), rows_task, &c);
}

/* ------------------------------------------------------------------ matmul ---------- */

/* A matmul's tasks share one B: in the float build it is packed once per call (on the pool)
** into the calling thread's buffer, instead of once per task; the packed GEMM computes the
** same bits as prl_gemm (gemm.c), so this changes speed only. The double build (OpenBLAS's
** dgemm) and single-task calls go straight to prl_gemm. */
typedef struct matmul_ctx {
    prl_real *out, *dinp, *dw;
    const prl_real *inp, *w, *dout;
    int N, C, OC;
    int dw_cols; /* columns of a dw tile (dw_tile_cols) */
    prl_real beta;
#ifndef PRL_REAL_DOUBLE
    const prl_packed_b *pk; /* op(B) of the call packed, or NULL */
#endif
} matmul_ctx;

#ifndef PRL_REAL_DOUBLE
static _Thread_local prl_packed_b tl_shared_b;

/* op(B) [K, N] packed into the calling thread's buffer; NULL (plain GEMMs) if it cannot be. */
static const prl_packed_b *pack_shared_b(int trans_b, int K, int N, const prl_real *B, int ldb)
{
    return prl_packed_b_repack(&tl_shared_b, trans_b, K, N, B, ldb) == PRL_OK ? &tl_shared_b : NULL;
}
#endif

static void matmul_forward_block(void *p, int blk)
{
    matmul_ctx *c = p;
    int r0 = blk * PRL_ROW_BLOCK, rows = c->N - r0 < PRL_ROW_BLOCK ? c->N - r0 : PRL_ROW_BLOCK;
    const prl_real *a = c->inp + (size_t)r0 * c->C;
    prl_real *out = c->out + (size_t)r0 * c->OC;
#ifndef PRL_REAL_DOUBLE
    if (c->pk) {
        prl_gemm_f32_packed(0, rows, 0, c->OC, 1, a, c->C, c->pk, c->beta, out, c->OC);
        return;
    }
#endif
    prl_gemm(0, 1, rows, c->OC, c->C, 1, a, c->C, c->w, c->C, c->beta, out, c->OC);
}

void prl_matmul_forward(prl_real *out, const prl_real *inp, const prl_real *w, int N, int C, int OC,
                        prl_real beta)
{
    /* inp is (N,C), w is (OC,C), out is (N,OC) */
    matmul_ctx c = {.out = out, .inp = inp, .w = w, .N = N, .C = C, .OC = OC, .beta = beta};
#ifndef PRL_REAL_DOUBLE
    if (n_blocks(N) > 1) c.pk = pack_shared_b(1, C, OC, w, C);
#endif
    prl_parallel_for(n_blocks(N), matmul_forward_block, &c);
}

static void matmul_dinp_block(void *p, int blk)
{
    matmul_ctx *c = p;
    int r0 = blk * PRL_ROW_BLOCK, rows = c->N - r0 < PRL_ROW_BLOCK ? c->N - r0 : PRL_ROW_BLOCK;
    const prl_real *a = c->dout + (size_t)r0 * c->OC;
    prl_real *dinp = c->dinp + (size_t)r0 * c->C;
#ifndef PRL_REAL_DOUBLE
    if (c->pk) {
        prl_gemm_f32_packed(0, rows, 0, c->C, 1, a, c->OC, c->pk, 1, dinp, c->C);
        return;
    }
#endif
    prl_gemm(0, 0, rows, c->C, c->OC, 1, a, c->OC, c->w, c->C, 1, dinp, c->C);
}

/* dw tiles: PRL_ROW_BLOCK rows × dw_cols columns of dw, each reducing over all N rows in one
** GEMM. A tile packs its rows of doutᵀ (all N deep) once for all its columns, so tiles are as
** wide as DW_TASKS tasks allow: small weight matrices still give several tasks, tall ones
** (the LM head, the dense FFN) pack doutᵀ once or twice instead of once per 128 columns.
** The split depends on the shape only, and changes no bit (each element is one GEMM's). */
enum { DW_TASKS = 8 };

static int dw_tile_cols(int OC, int C)
{
    int col_blocks = n_blocks(C), row_blocks = n_blocks(OC), f = 1;
    while (f < col_blocks && row_blocks * ((col_blocks + 2 * f - 1) / (2 * f)) >= DW_TASKS) f *= 2;
    return f * PRL_ROW_BLOCK;
}

static void matmul_dw_block(void *p, int tile)
{
    matmul_ctx *c = p;
    int col_tiles = (c->C + c->dw_cols - 1) / c->dw_cols;
    int r0 = tile / col_tiles * PRL_ROW_BLOCK, c0 = tile % col_tiles * c->dw_cols;
    int rows = c->OC - r0 < PRL_ROW_BLOCK ? c->OC - r0 : PRL_ROW_BLOCK;
    int cols = c->C - c0 < c->dw_cols ? c->C - c0 : c->dw_cols;
#ifndef PRL_REAL_DOUBLE
    if (c->pk) { /* inp packed whole: the tile's columns of it */
        prl_gemm_f32_packed(1, rows, c0, cols, 1, c->dout + r0, c->OC, c->pk, 1,
                            c->dw + (size_t)r0 * c->C, c->C);
        return;
    }
#endif
    prl_gemm(1, 0, rows, cols, c->N, 1, c->dout + r0, c->OC, c->inp + c0, c->C, 1,
             c->dw + (size_t)r0 * c->C + c0, c->C);
}

void prl_matmul_backward(prl_real *dinp, prl_real *dw, const prl_real *dout, const prl_real *inp,
                         const prl_real *w, int N, int C, int OC)
{
    /* dout is (N,OC); dinp (N,C) += dout·w; dw (OC,C) += doutᵀ·inp */
    matmul_ctx c =
        {.dinp = dinp, .dw = dw, .dout = dout, .inp = inp, .w = w, .N = N, .C = C, .OC = OC};
    if (dinp) {
#ifndef PRL_REAL_DOUBLE
        if (n_blocks(N) > 1) c.pk = pack_shared_b(0, OC, C, w, C);
#endif
        prl_parallel_for(n_blocks(N), matmul_dinp_block, &c);
    }
    if (dw) {
#ifndef PRL_REAL_DOUBLE
        /* each row of tiles reads all of inp: packed once when there are several */
        c.pk = n_blocks(OC) > 1 ? pack_shared_b(0, N, C, inp, C) : NULL;
#endif
        c.dw_cols = dw_tile_cols(OC, C);
        prl_parallel_for(n_blocks(OC) * ((C + c.dw_cols - 1) / c.dw_cols), matmul_dw_block, &c);
    }
}

/* ------------------------------------------------------------------ RMSNorm --------- */

typedef struct rmsnorm_ctx {
    prl_real *out, *rstd, *dinp, *dg_parts;
    const prl_real *inp, *g, *dout;
    int C, in_stride, out_stride;
    double eps;
} rmsnorm_ctx;

/* The AVX2 forms of the norms' element-wise loops (the scalar loops after each call are
** the reference and finish the tail); each returns how many elements it did. The row sums
** stay scalar: their order is the result's. */
#ifdef ROW_AVX2
PRL_AVX2 static int rmsnorm_scale_avx2(float *y, const float *x, const float *g, float r, int C)
{
    int i = 0;
    for (; i + 8 <= C; i += 8) prl_v8_store(y + i, prl_v8_load(g + i) * (prl_v8_load(x + i) * r));
    return i;
}

PRL_AVX2 static int rmsnorm_dx_avx2(float *dx, float *dg, const float *x, const float *dy,
                                    const float *g, float r, float k, int C)
{
    int i = 0;
    for (; i + 8 <= C; i += 8) {
        prl_v8f xv = prl_v8_load(x + i), dyv = prl_v8_load(dy + i);
        prl_v8_store(dx + i, prl_v8_load(dx + i) + (prl_v8_load(g + i) * dyv * r - xv * k));
        prl_v8_store(dg + i, prl_v8_load(dg + i) + dyv * (xv * r));
    }
    return i;
}
#endif

/* The row sums of the norms for ROWS4 rows at once: each row's sum is its own chain in index
** order (the bits of one row at a time); four chains in flight hide the add's latency, which
** bounds a single chain. Rows past `nr` repeat row 0 (summed, never used). With the row
** kernels' fast forms off (prl_row_kernels_avx2_set(0)) the norms run the one-row loops, the
** reference. */
enum { ROWS4 = 4 };

/* ss[j] = Σ_i x_j[i]² for rows x_j = x + (n0 + j)·stride, j < nr. */
static void sum_squares_rows(double *ss, const prl_real *x, size_t stride, int nr, int C)
{
    const prl_real *a = x, *b = nr > 1 ? x + stride : x, *c = nr > 2 ? x + 2 * stride : x,
                   *d = nr > 3 ? x + 3 * stride : x;
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int i = 0; i < C; i++) {
        s0 += (double)a[i] * a[i], s1 += (double)b[i] * b[i];
        s2 += (double)c[i] * c[i], s3 += (double)d[i] * d[i];
    }
    ss[0] = s0, ss[1] = s1, ss[2] = s2, ss[3] = s3;
}

/* dot[j] = Σ_i g[i]·dy_j[i]·x_j[i] for the rows j < nr, each in index order. */
static void dot_rows(double *dot, const prl_real *g, const prl_real *dy, size_t dy_stride,
                     const prl_real *x, size_t x_stride, int nr, int C)
{
    const prl_real *y[ROWS4], *v[ROWS4];
    for (int j = 0; j < ROWS4; j++) {
        y[j] = dy + (size_t)(j < nr ? j : 0) * dy_stride;
        v[j] = x + (size_t)(j < nr ? j : 0) * x_stride;
    }
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int i = 0; i < C; i++) {
        s0 += (double)g[i] * y[0][i] * v[0][i], s1 += (double)g[i] * y[1][i] * v[1][i];
        s2 += (double)g[i] * y[2][i] * v[2][i], s3 += (double)g[i] * y[3][i] * v[3][i];
    }
    dot[0] = s0, dot[1] = s1, dot[2] = s2, dot[3] = s3;
}

static void rmsnorm_forward_rows(void *p, int r0, int r1)
{
    rmsnorm_ctx *c = p;
    double sums[ROWS4];
    for (int n = r0; n < r1; n++) {
        const prl_real *x = c->inp + (size_t)n * c->in_stride;
        prl_real *y = c->out + (size_t)n * c->out_stride;
        double ss = 0;
        if (!prl_row_kernels_avx2()) {
            for (int i = 0; i < c->C; i++) ss += (double)x[i] * x[i];
        } else {
            if ((n - r0) % ROWS4 == 0)
                sum_squares_rows(sums, x, (size_t)c->in_stride, r1 - n < ROWS4 ? r1 - n : ROWS4,
                                 c->C);
            ss = sums[(n - r0) % ROWS4];
        }
        prl_real r = (prl_real)(1.0 / sqrt(ss / c->C + c->eps));
        int i = 0;
#ifdef ROW_AVX2
        if (prl_row_kernels_avx2()) i = rmsnorm_scale_avx2(y, x, c->g, r, c->C);
#endif
        for (; i < c->C; i++) y[i] = c->g[i] * (x[i] * r);
        c->rstd[n] = r;
    }
}

void prl_rmsnorm_forward(prl_real *out, prl_real *rstd, const prl_real *inp, const prl_real *g,
                         int N, int C, int in_stride, int out_stride, double eps)
{
    /* inp rows (N, C) at in_stride; out rows (N, C) at out_stride; rstd (N) */
    rmsnorm_ctx c = {.out = out,
                     .rstd = rstd,
                     .inp = inp,
                     .g = g,
                     .C = C,
                     .in_stride = in_stride,
                     .out_stride = out_stride,
                     .eps = eps};
    prl_parallel_rows(N, rmsnorm_forward_rows, &c);
}

/* dg is a sum over rows: each block of rows writes its own partial, added in block order. */
static void rmsnorm_backward_rows(void *p, int r0, int r1)
{
    rmsnorm_ctx *c = p;
    prl_real *dg = c->dg_parts + (size_t)(r0 / PRL_ROW_BLOCK) * c->C;
    memset(dg, 0, (size_t)c->C * sizeof *dg);
    double dots[ROWS4];
    for (int n = r0; n < r1; n++) {
        const prl_real *x = c->inp + (size_t)n * c->in_stride;
        const prl_real *dy = c->dout + (size_t)n * c->out_stride;
        prl_real *dx = c->dinp + (size_t)n * c->in_stride;
        prl_real r = c->rstd[n];
        double dot = 0;
        if (!prl_row_kernels_avx2()) {
            for (int i = 0; i < c->C; i++) dot += (double)c->g[i] * dy[i] * x[i];
        } else {
            if ((n - r0) % ROWS4 == 0)
                dot_rows(dots, c->g, dy, (size_t)c->out_stride, x, (size_t)c->in_stride,
                         r1 - n < ROWS4 ? r1 - n : ROWS4, c->C);
            dot = dots[(n - r0) % ROWS4];
        }
        prl_real k = (prl_real)(dot * r * r * r / c->C);
        int i = 0;
#ifdef ROW_AVX2
        if (prl_row_kernels_avx2()) i = rmsnorm_dx_avx2(dx, dg, x, dy, c->g, r, k, c->C);
#endif
        for (; i < c->C; i++) {
            dx[i] += c->g[i] * dy[i] * r - x[i] * k;
            dg[i] += dy[i] * (x[i] * r);
        }
    }
}

void prl_rmsnorm_backward(prl_real *dinp, prl_real *dg, const prl_real *dout, const prl_real *inp,
                          const prl_real *g, const prl_real *rstd, int N, int C, int in_stride,
                          int dout_stride)
{
    /* dx = u·r − x·r³·(Σ u·x)/C with u = g ⊙ dy;  dg += dy ⊙ x·r */
    int nb = n_blocks(N);
    prl_real *parts = malloc((size_t)nb * C * sizeof *parts);
    PRL_ASSERT(parts != NULL);
    rmsnorm_ctx c = {.dinp = dinp,
                     .dg_parts = parts,
                     .inp = inp,
                     .g = g,
                     .dout = dout,
                     .rstd = (prl_real *)rstd,
                     .C = C,
                     .in_stride = in_stride,
                     .out_stride = dout_stride};
    prl_parallel_rows(N, rmsnorm_backward_rows, &c);
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < C; i++) dg[i] += parts[(size_t)b * C + i];
    free(parts);
}

/* ------------------------------------------------------------------ RoPE ------------ */

/* YaRN's per-pair inverse frequencies, as transformers' _compute_yarn_parameters (truncated
** correction range), in double. */
static void yarn_inv_freq(double *inv, int D, double theta, const prl_rope_scaling *y)
{
    double fast = y->beta_fast > 0 ? y->beta_fast : 32, slow = y->beta_slow > 0 ? y->beta_slow : 1;
    double orig = y->original_max_position_embeddings;
    /* the dimension at which a pair turns `rot` times over the original context */
    double lo = floor(D * log(orig / (fast * 2 * M_PI)) / (2 * log(theta)));
    double hi = ceil(D * log(orig / (slow * 2 * M_PI)) / (2 * log(theta)));
    lo = lo > 0 ? lo : 0, hi = hi < D - 1 ? hi : D - 1;
    if (lo == hi) hi += 0.001; /* no singular ramp */
    for (int i = 0; i < D / 2; i++) {
        double pos_freq = pow(theta, 2.0 * i / D), ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extra = 1 - ramp; /* 1: keep the pair's frequency (extrapolate) */
        inv[i] = 1 / (y->factor * pos_freq) * (1 - extra) + 1 / pos_freq * extra;
    }
}

double prl_rope_attention_factor(const prl_rope_scaling *y)
{
    if (!y || !y->yarn) return 1.0;
    if (y->attention_factor > 0) return y->attention_factor;
    if (y->mscale > 0 && y->mscale_all_dim > 0)
        return prl_yarn_mscale(y->factor, y->mscale) /
               prl_yarn_mscale(y->factor, y->mscale_all_dim);
    return prl_yarn_mscale(y->factor, 1.0);
}

void prl_rope_tables_scaled(prl_real *cos_t, prl_real *sin_t, int T, int D, double theta,
                            const prl_rope_scaling *y)
{
    if (!y || !y->yarn) {
        prl_rope_tables(cos_t, sin_t, T, D, theta);
        return;
    }
    int half = D / 2;
    double inv[2048], af = prl_rope_attention_factor(y);
    PRL_ASSERT(half <= 2048);
    yarn_inv_freq(inv, D, theta, y);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double angle = t * inv[i];
            cos_t[t * half + i] = (prl_real)(cos(angle) * af);
            sin_t[t * half + i] = (prl_real)(sin(angle) * af);
        }
}

void prl_rope_tables(prl_real *cos_t, prl_real *sin_t, int T, int D, double theta)
{
    int half = D / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double angle = t * pow(theta, -2.0 * i / D);
            cos_t[t * half + i] = (prl_real)cos(angle);
            sin_t[t * half + i] = (prl_real)sin(angle);
        }
}

typedef struct rope_ctx {
    prl_real *x;
    const prl_real *cos_t, *sin_t;
    const int32_t *pos; /* position of each row, or NULL: row n is at n mod T */
    int T, heads, head_stride, col, stride, D;
    int interleave; /* pairs (2i, 2i+1), else (i, i + D/2) */
    prl_real sign;
} rope_ctx;

static void rope_rows(void *p, int r0, int r1)
{
    rope_ctx *c = p;
    int half = c->D / 2;
    for (int n = r0; n < r1; n++) {
        int at = c->pos ? (c->pos[n] > 0 ? c->pos[n] : 0) : n % c->T; /* padding row: 0 */
        const prl_real *co = c->cos_t + (size_t)at * half;
        const prl_real *si = c->sin_t + (size_t)at * half;
        /* the pair of frequency i sits at (lo, hi) = (i·step, i·step + off) */
        int step = c->interleave ? 2 : 1, off = c->interleave ? 1 : half;
        for (int h = 0; h < c->heads; h++) {
            prl_real *v = c->x + (size_t)n * c->stride + (size_t)h * c->head_stride + c->col;
            for (int i = 0; i < half; i++) {
                prl_real *lo = v + i * step, *hi = lo + off;
                prl_real a = *lo, b = *hi, s = c->sign * si[i];
                *lo = a * co[i] - b * s;
                *hi = b * co[i] + a * s;
            }
        }
    }
}

/* Row n at position pos[n] (pos NULL: n mod T), rotated forward (sign 1) or back (−1). */
static void rope_apply(prl_real *x, const prl_real *cos_t, const prl_real *sin_t,
                       const int32_t *pos, int N, int T, int heads, int head_stride, int col,
                       int stride, int D, int interleave, prl_real sign)
{
    rope_ctx c = {.x = x,
                  .interleave = interleave,
                  .cos_t = cos_t,
                  .sin_t = sin_t,
                  .pos = pos,
                  .T = T,
                  .heads = heads,
                  .head_stride = head_stride,
                  .col = col,
                  .stride = stride,
                  .D = D,
                  .sign = sign};
    prl_parallel_rows(N, rope_rows, &c);
}

void prl_rope_forward(prl_real *x, const prl_real *cos_t, const prl_real *sin_t, int N, int T,
                      int heads, int head_stride, int col, int stride, int D, int interleave)
{
    rope_apply(x, cos_t, sin_t, NULL, N, T, heads, head_stride, col, stride, D, interleave, 1);
}

void prl_rope_at(prl_real *x, const prl_real *cos_t, const prl_real *sin_t, const int32_t *pos,
                 int N, int heads, int head_stride, int col, int stride, int D, int interleave)
{
    rope_apply(x, cos_t, sin_t, pos, N, 1, heads, head_stride, col, stride, D, interleave, 1);
}

void prl_rope_backward(prl_real *dx, const prl_real *cos_t, const prl_real *sin_t, int N, int T,
                       int heads, int head_stride, int col, int stride, int D, int interleave)
{
    /* Each pair is a rotation scaled by YaRN's attention factor a (cos and sin both carry
    ** it): its transpose is a times the rotation by −angle, the same tables with sin negated. */
    rope_apply(dx, cos_t, sin_t, NULL, N, T, heads, head_stride, col, stride, D, interleave, -1);
}

void prl_rope_packed(prl_real *x, const prl_real *cos_t, const prl_real *sin_t, const int32_t *pos,
                     int N, int T, int heads, int head_stride, int col, int stride, int D,
                     int interleave, int sign)
{
    rope_apply(x, cos_t, sin_t, pos, N, T, heads, head_stride, col, stride, D, interleave,
               sign < 0 ? -1 : 1);
}

/* ------------------------------------------------------------------ ModAttn conv ---- */

enum { CONV_MAX_K = 16 };

void prl_conv_row(prl_real *out, const prl_real *const *x, const prl_real *w, int C, int k)
{
    for (int c = 0; c < C; c++) {
        prl_real acc = 0;
        for (int j = 0; j < k; j++)
            if (x[j]) acc += w[(size_t)c * k + j] * x[j][c];
        out[c] = x[k - 1][c] + acc;
    }
}

typedef struct conv_ctx {
    prl_real *out, *dinp;
    const prl_real *inp, *w, *dout;
    const int32_t *pos; /* packed rows: positions in the segments, or NULL */
    int in_stride, T, C, k;
} conv_ctx;

/* 1 when row n (position t of its sequence) reads the row `back` rows before it: inside the
** sequence and, in a packed row, inside the row's segment (back 0, the row itself, always). */
static int conv_tap(const int32_t *pos, int n, int t, int back)
{
    return back == 0 || (t >= back && (!pos || pos[n] >= back));
}

static void conv_forward_rows(void *p, int r0, int r1)
{
    conv_ctx *c = p;
    const prl_real *x[CONV_MAX_K];
    for (int n = r0; n < r1; n++) {
        int t = n % c->T;
        for (int j = 0; j < c->k; j++) {
            int back = c->k - 1 - j;
            x[j] = conv_tap(c->pos, n, t, back) ? c->inp + (size_t)(n - back) * c->in_stride : NULL;
        }
        prl_conv_row(c->out + (size_t)n * c->C, x, c->w, c->C, c->k);
    }
}

void prl_conv_forward(prl_real *out, const prl_real *inp, int in_stride, const prl_real *w, int B,
                      int T, int C, int k, const int32_t *pos)
{
    PRL_ASSERT(k >= 1 && k <= CONV_MAX_K);
    conv_ctx c = {.out = out,
                  .inp = inp,
                  .w = w,
                  .pos = pos,
                  .in_stride = in_stride,
                  .T = T,
                  .C = C,
                  .k = k};
    prl_parallel_rows(B * T, conv_forward_rows, &c);
}

/* dinp[t] += dout[t] + Σ_j w[c, j]·dout[t + (k−1) − j] (rows of the same sequence) */
static void conv_backward_rows(void *p, int r0, int r1)
{
    conv_ctx *c = p;
    for (int n = r0; n < r1; n++) {
        int t = n % c->T;
        prl_real *dx = c->dinp + (size_t)n * c->in_stride;
        const prl_real *dy = c->dout + (size_t)n * c->C;
        for (int ch = 0; ch < c->C; ch++) {
            prl_real acc = dy[ch];
            for (int j = 0; j < c->k; j++) {
                int fwd = c->k - 1 - j; /* the row fwd rows later reads this one at tap j */
                if (t + fwd < c->T && conv_tap(c->pos, n + fwd, t + fwd, fwd))
                    acc += c->w[(size_t)ch * c->k + j] * dy[(size_t)fwd * c->C + ch];
            }
            dx[ch] += acc;
        }
    }
}

void prl_conv_backward(prl_real *dinp, int in_stride, prl_real *dw, const prl_real *dout,
                       const prl_real *inp, const prl_real *w, int B, int T, int C, int k,
                       const int32_t *pos)
{
    conv_ctx c = {.dinp = dinp,
                  .inp = inp,
                  .w = w,
                  .dout = dout,
                  .pos = pos,
                  .in_stride = in_stride,
                  .T = T,
                  .C = C,
                  .k = k};
    prl_parallel_rows(B * T, conv_backward_rows, &c);
    /* dw[c, j] = Σ_n dout[n, c]·inp[n − (k−1) + j, c], in row order (one thread) */
    for (int n = 0; n < B * T; n++) {
        int t = n % T;
        const prl_real *dy = dout + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            int back = k - 1 - j;
            if (!conv_tap(pos, n, t, back)) continue;
            const prl_real *x = inp + (size_t)(n - back) * in_stride;
            for (int ch = 0; ch < C; ch++) dw[(size_t)ch * k + j] += dy[ch] * x[ch];
        }
    }
}

/* ------------------------------------------------------------------ SwiGLU ---------- */

/* One row of silu(g)·u and its backward. The float build runs 4 lanes at a time with the
** same per-element arithmetic as the scalar tail (bitwise equal results). */
#ifdef ROW_AVX2
PRL_AVX2 static int silu_mul_row_avx2(float *y, const float *g, const float *u, int F)
{
    int f = 0;
    for (; f + 8 <= F; f += 8) {
        prl_v8f gv = prl_v8_load(g + f);
        prl_v8_store(y + f, gv / (1.0f + prl_expf8(-gv)) * prl_v8_load(u + f));
    }
    return f;
}

PRL_AVX2 static int silu_mul_backward_row_avx2(float *dg, float *du, const float *dy,
                                               const float *g, const float *u, int F)
{
    int f = 0;
    for (; f + 8 <= F; f += 8) {
        prl_v8f gv = prl_v8_load(g + f), uv = prl_v8_load(u + f), dv = prl_v8_load(dy + f);
        prl_v8f sg = 1.0f / (1.0f + prl_expf8(-gv));
        prl_v8_store(dg + f, dv * uv * sg * (1.0f + gv * (1.0f - sg)));
        prl_v8_store(du + f, dv * gv * sg);
    }
    return f;
}
#endif

static void silu_mul_row(prl_real *y, const prl_real *g, const prl_real *u, int F)
{
    int f = 0;
#ifdef ROW_AVX2
    if (prl_row_kernels_avx2()) f = silu_mul_row_avx2(y, g, u, F);
#endif
#ifndef PRL_REAL_DOUBLE
    for (; f + 4 <= F; f += 4) {
        prl_v4f gv = prl_v4_load(g + f);
        prl_v4_store(y + f, gv / (1.0f + prl_expf4(-gv)) * prl_v4_load(u + f));
    }
#endif
    for (; f < F; f++) y[f] = g[f] / (1 + PRL_EXP(-g[f])) * u[f];
}

static void silu_mul_backward_row(prl_real *dg, prl_real *du, const prl_real *dy, const prl_real *g,
                                  const prl_real *u, int F)
{
    /* silu'(x) = σ(x)·(1 + x·(1 − σ(x))) */
    int f = 0;
#ifdef ROW_AVX2
    if (prl_row_kernels_avx2()) f = silu_mul_backward_row_avx2(dg, du, dy, g, u, F);
#endif
#ifndef PRL_REAL_DOUBLE
    for (; f + 4 <= F; f += 4) {
        prl_v4f gv = prl_v4_load(g + f), uv = prl_v4_load(u + f), dv = prl_v4_load(dy + f);
        prl_v4f sg = 1.0f / (1.0f + prl_expf4(-gv));
        prl_v4_store(dg + f, dv * uv * sg * (1.0f + gv * (1.0f - sg)));
        prl_v4_store(du + f, dv * gv * sg);
    }
#endif
    for (; f < F; f++) {
        prl_real sg = 1 / (1 + PRL_EXP(-g[f]));
        dg[f] = dy[f] * u[f] * sg * (1 + g[f] * (1 - sg));
        du[f] = dy[f] * g[f] * sg;
    }
}

void prl_silu_mul_forward(prl_real *h, const prl_real *a13, int rows, int F)
{
    for (int r = 0; r < rows; r++) {
        const prl_real *g = a13 + (size_t)r * 2 * F;
        silu_mul_row(h + (size_t)r * F, g, g + F, F);
    }
}

void prl_silu_mul_backward(prl_real *da13, const prl_real *dh, const prl_real *a13, int rows, int F)
{
    for (int r = 0; r < rows; r++) {
        const prl_real *g = a13 + (size_t)r * 2 * F;
        prl_real *dg = da13 + (size_t)r * 2 * F;
        silu_mul_backward_row(dg, dg + F, dh + (size_t)r * F, g, g + F, F);
    }
}

typedef struct swiglu_ctx {
    prl_real *a13, *h, *da13;
    const prl_real *dh;
    int N, F;
} swiglu_ctx;

static void silu_mul_block(void *p, int blk)
{
    swiglu_ctx *c = p;
    int r0 = blk * PRL_ROW_BLOCK, rows = c->N - r0 < PRL_ROW_BLOCK ? c->N - r0 : PRL_ROW_BLOCK;
    prl_silu_mul_forward(c->h + (size_t)r0 * c->F, c->a13 + (size_t)r0 * 2 * c->F, rows, c->F);
}

void prl_swiglu_forward(prl_real *out, prl_real *a13, prl_real *h, const prl_real *inp,
                        const prl_real *w13, const prl_real *w2, int N, int C, int F, prl_real beta,
                        prl_precision p)
{
    /* inp (N,C); w13 (2F,C); w2 (C,F); a13 (N,2F); h (N,F); out (N,C) */
    PRL_ASSERT(p == PRL_PRECISION_FP32 || beta == 0);
    prl_matmul_forward(a13, inp, w13, N, C, 2 * F, 0);
    prl_round_reals(p, a13, (size_t)N * 2 * F);
    swiglu_ctx c = {.a13 = a13, .h = h, .N = N, .F = F};
    prl_parallel_for(n_blocks(N), silu_mul_block, &c);
    prl_round_reals(p, h, (size_t)N * F);
    prl_matmul_forward(out, h, w2, N, F, C, beta);
    prl_round_reals(p, out, (size_t)N * C);
}

static void silu_mul_backward_block(void *p, int blk)
{
    swiglu_ctx *c = p;
    int r0 = blk * PRL_ROW_BLOCK, rows = c->N - r0 < PRL_ROW_BLOCK ? c->N - r0 : PRL_ROW_BLOCK;
    size_t o1 = (size_t)r0 * c->F, o2 = 2 * o1;
    prl_silu_mul_backward(c->da13 + o2, c->dh + o1, c->a13 + o2, rows, c->F);
}

void prl_swiglu_backward(prl_real *dinp, prl_real *dw13, prl_real *dw2, prl_real *scratch,
                         const prl_real *dout, const prl_real *inp, const prl_real *a13,
                         const prl_real *h, const prl_real *w13, const prl_real *w2, int N, int C,
                         int F, prl_precision p)
{
    /* dh (N,F) = dout·w2;  dw2 (C,F) += doutᵀ·h;  then da13 (N,2F), dinp, dw13 */
    prl_real *dh = scratch, *da13 = scratch + (size_t)N * F;
    memset(dh, 0, (size_t)N * F * sizeof *dh);
    prl_matmul_backward(dh, dw2, dout, h, w2, N, F, C);
    prl_round_reals(p, dh, (size_t)N * F);
    swiglu_ctx c = {.a13 = (prl_real *)a13, .da13 = da13, .dh = dh, .N = N, .F = F};
    prl_parallel_for(n_blocks(N), silu_mul_backward_block, &c);
    prl_round_reals(p, da13, (size_t)N * 2 * F);
    prl_matmul_backward(dinp, dw13, da13, inp, w13, N, C, 2 * F);
}

/* ------------------------------------------------------------------ MoE gate -------- */

/* keep[e] = 1 for the experts of the topk_group groups (of E/n_group consecutive experts)
** whose two best s + bias sum highest; strict '>' keeps the lower group on ties. */
static void gate_groups(uint8_t *keep, const prl_real *s, const prl_real *bias, int E, int n_group,
                        int topk_group)
{
    int per = E / n_group;
    prl_real gs[4096];
    uint8_t gkeep[4096];
    PRL_ASSERT(n_group <= 4096);
    for (int gi = 0; gi < n_group; gi++) {
        prl_real b1 = -INFINITY, b2 = -INFINITY;
        for (int e = gi * per; e < (gi + 1) * per; e++) {
            prl_real v = s[e] + (bias ? bias[e] : 0);
            if (v > b1) b2 = b1, b1 = v;
            else if (v > b2) b2 = v;
        }
        gs[gi] = b1 + b2, gkeep[gi] = 0;
    }
    for (int k = 0; k < topk_group; k++) {
        int best = -1;
        for (int gi = 0; gi < n_group; gi++)
            if (!gkeep[gi] && (best < 0 || gs[gi] > gs[best])) best = gi;
        gkeep[best] = 1;
    }
    for (int e = 0; e < E; e++) keep[e] = gkeep[e / per];
}

void prl_moe_gate_forward(int32_t *sel, prl_real *g, prl_real *s, const prl_real *z,
                          const prl_real *bias, const int32_t *forced, int E, int K, int renorm,
                          double scale)
{
    prl_moe_gate_forward_grouped(sel, g, s, z, bias, forced, E, K, 1, 1, renorm, scale);
}

void prl_moe_gate_forward_grouped(int32_t *sel, prl_real *g, prl_real *s, const prl_real *z,
                                  const prl_real *bias, const int32_t *forced, int E, int K,
                                  int n_group, int topk_group, int renorm, double scale)
{
    for (int e = 0; e < E; e++) s[e] = 1 / (1 + PRL_EXP(-z[e]));
    if (forced) {
        for (int k = 0; k < K; k++) sel[k] = forced[k];
    } else {
        uint8_t keep[4096];
        PRL_ASSERT(E <= 4096);
        if (n_group > 1) gate_groups(keep, s, bias, E, n_group, topk_group);
        /* Top-K by s + bias over the kept groups (a masked expert is −∞, as DeepSeek-V3's
        ** inference code); strict '>' keeps the lower index on ties. */
        for (int k = 0; k < K; k++) {
            int best = -1;
            prl_real best_v = 0;
            for (int e = 0; e < E; e++) {
                int taken = n_group > 1 && !keep[e];
                for (int j = 0; j < k; j++) taken |= sel[j] == e;
                if (taken) continue;
                prl_real v = s[e] + (bias ? bias[e] : 0);
                if (best < 0 || v > best_v) best = e, best_v = v;
            }
            sel[k] = best;
        }
    }
    prl_real sum = 0;
    for (int k = 0; k < K; k++) sum += s[sel[k]];
    prl_real denom = renorm ? sum + (prl_real)1e-20 : 1;
    for (int k = 0; k < K; k++) g[k] = (prl_real)scale * s[sel[k]] / denom;
}

void prl_moe_gate_backward(prl_real *dz, const prl_real *dg, const int32_t *sel, const prl_real *s,
                           int E, int K, int renorm, double scale)
{
    (void)E;
    prl_real sum = 0, dot = 0;
    for (int k = 0; k < K; k++) sum += s[sel[k]];
    prl_real denom = renorm ? sum + (prl_real)1e-20 : 1;
    /* g_k = c·s_k/S:  ∂L/∂s_j = c/S·dg_j − c·Σ_k dg_k s_k / S²  (second term only if renorm) */
    for (int k = 0; k < K; k++) dot += dg[k] * s[sel[k]];
    for (int k = 0; k < K; k++) {
        int e = sel[k];
        prl_real ds = (prl_real)scale * dg[k] / denom;
        if (renorm) ds -= (prl_real)scale * dot / (denom * denom);
        /* duplicates in a forced route add up, as the forward sums them */
        dz[e] += ds * s[e] * (1 - s[e]);
    }
}

/* ------------------------------------------------------------------ log-probs ------- */

#ifdef ROW_AVX2
/* acc += the 4-lane loop's terms for v in [0, done): each 8-lane exp is added as its low
** then its high half, the order of two 4-lane steps. */
PRL_AVX2 static int logprob_sum_avx2(prl_v4f *acc, const float *logits, int V, float inv_tau,
                                     float m)
{
    int v = 0;
    prl_v4f a = *acc;
    for (; v + 8 <= V; v += 8) {
        prl_v8f e = prl_expf8(prl_v8_load(logits + v) * inv_tau - m);
        a += prl_v8_lo(e);
        a += prl_v8_hi(e);
    }
    *acc = a;
    return v;
}

PRL_AVX2 static int logprob_backward_avx2(float *dlogits, const float *logits, int V, float inv_tau,
                                          float lse, float k)
{
    int v = 0;
    for (; v + 8 <= V; v += 8)
        prl_v8_store(dlogits + v, prl_v8_load(dlogits + v) -
                                      k * prl_expf8(prl_v8_load(logits + v) * inv_tau - lse));
    return v;
}
#endif

prl_real prl_logprob_forward(prl_real *lse, const prl_real *logits, int V, int y, double tau)
{
    prl_real inv_tau = (prl_real)(1.0 / tau);
    prl_real m = logits[0] * inv_tau;
    int v = 1;
#ifdef ROW_AVX2
    if (prl_row_kernels_avx2()) {
        int done;
        m = prl_v8_max_scaled(m, logits + 1, V - 1, inv_tau, &done);
        v += done;
    }
#endif
    for (; v < V; v++) m = logits[v] * inv_tau > m ? logits[v] * inv_tau : m;
    prl_real sum = 0;
    v = 0;
#ifndef PRL_REAL_DOUBLE
    /* 4 partial sums, combined in lane order: a fixed order, so still reproducible */
    prl_v4f acc = prl_v4_splat(0);
#ifdef ROW_AVX2
    if (prl_row_kernels_avx2()) v = logprob_sum_avx2(&acc, logits, V, inv_tau, m);
#endif
    for (; v + 4 <= V; v += 4) acc += prl_expf4(prl_v4_load(logits + v) * inv_tau - m);
    for (int j = 0; j < 4; j++) sum += acc[j];
#endif
    for (; v < V; v++) sum += PRL_EXP(logits[v] * inv_tau - m);
    *lse = m + PRL_LOG(sum);
    return logits[y] * inv_tau - *lse;
}

void prl_logprob_backward(prl_real *dlogits, const prl_real *logits, prl_real lse, int V, int y,
                          double tau, prl_real w)
{
    prl_logprob_backward_multi(dlogits, logits, lse, V, &y, &w, 1, tau);
}

void prl_logprob_backward_multi(prl_real *dlogits, const prl_real *logits, prl_real lse, int V,
                                const int32_t *ys, const prl_real *ws, int n, double tau)
{
    prl_real inv_tau = (prl_real)(1.0 / tau), w = 0;
    for (int i = 0; i < n; i++) w += ws[i];
    prl_real k = w * inv_tau; /* the softmax term once, with the weights' sum */
    int v = 0;
#ifdef ROW_AVX2
    if (prl_row_kernels_avx2()) v = logprob_backward_avx2(dlogits, logits, V, inv_tau, lse, k);
#endif
#ifndef PRL_REAL_DOUBLE
    for (; v + 4 <= V; v += 4)
        prl_v4_store(dlogits + v, prl_v4_load(dlogits + v) -
                                      k * prl_expf4(prl_v4_load(logits + v) * inv_tau - lse));
#endif
    for (; v < V; v++) dlogits[v] -= k * PRL_EXP(logits[v] * inv_tau - lse);
    for (int i = 0; i < n; i++) dlogits[ys[i]] += ws[i] * inv_tau;
}

/* ------------------------------------------------------------------ embedding ------- */

void prl_embedding_forward(prl_real *out, const prl_real *table, const int32_t *tokens, int N,
                           int C)
{
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, table + (size_t)tokens[n] * C, (size_t)C * sizeof *out);
}

void prl_embedding_backward(prl_real *dtable, const prl_real *dout, const int32_t *tokens, int N,
                            int C)
{
    for (int n = 0; n < N; n++) {
        prl_real *dst = dtable + (size_t)tokens[n] * C;
        const prl_real *src = dout + (size_t)n * C;
        for (int i = 0; i < C; i++) dst[i] += src[i];
    }
}

/* The row a sequence's score is read at: its last valid position. */
static size_t score_row(const int32_t *lens, int b, int T)
{
    int n = lens ? lens[b] : T;
    return (size_t)b * T + (size_t)(n > 0 ? n - 1 : 0);
}

void prl_score_head_forward(prl_real *out, const prl_real *h, const prl_real *w,
                            const int32_t *lens, int B, int T, int C)
{
    /* out [B] = h[B, T, C] at the last valid t · w[C] */
    for (int b = 0; b < B; b++) {
        const prl_real *x = h + score_row(lens, b, T) * C;
        prl_real s = 0;
        for (int i = 0; i < C; i++) s += x[i] * w[i];
        out[b] = s;
    }
}

void prl_score_head_backward(prl_real *dh, prl_real *dw, const prl_real *dout, const prl_real *h,
                             const prl_real *w, const int32_t *lens, int B, int T, int C)
{
    for (int b = 0; b < B; b++) {
        size_t r = score_row(lens, b, T) * C;
        for (int i = 0; i < C; i++) {
            dh[r + i] += dout[b] * w[i];
            dw[i] += dout[b] * h[r + i];
        }
    }
}
