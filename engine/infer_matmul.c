/*
** infer_matmul.c — the infer path's linear layers y = x·wᵀ in the three matmul kinds of
** prl_infer_options: GEMV-order dot products (generic, or AVX2/FMA chosen by cpuid once),
** prl's GEMM on pre-packed weights (gemm.c), OpenBLAS sgemm, and in W8A8 mode INT8 and BF16
** weights (quant.c; an INT8 linear quantizes its input rows first); all cut into tasks on prl's
** pool whose results do not depend on the thread that runs them. The dot products also serve
** the absorbed attention (infer_forward.c).
*/
#include "engine/infer_int.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ matmuls --------- */

/* The GEMV-order dot product: one 8-lane accumulator takes i ≡ lane (mod 8) in order (a
** fused multiply-add when the CPU has FMA), the lanes are summed in a fixed tree, the tail is
** added last. A dot's operations never depend on which tile computes it, so tiles of 2 rows ×
** 4 outputs (8 independent chains, enough to hide the FMA latency) give the same bits as one
** dot at a time. infer__gemv_tile computes y[r][o] = x_r·w_o for r < nr (<= 2), o < no (<= 4). */
static inline float lane_sum(const float *l)
{
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

static void gemv_tile_generic(const float *x, int ldx, int nr, const float *w, int ldw, int no,
                              int n, float *y, int ldy)
{
    for (int r = 0; r < nr; r++)
        for (int o = 0; o < no; o++) {
            const float *a = x + (size_t)r * ldx, *b = w + (size_t)o * ldw;
            v8f acc = {0};
            int i = 0;
            for (; i + 8 <= n; i += 8) {
                v8f u, v;
                memcpy(&u, a + i, sizeof u);
                memcpy(&v, b + i, sizeof v);
                acc = acc + u * v;
            }
            float l[8];
            memcpy(l, &acc, sizeof l);
            float s = lane_sum(l);
            for (; i < n; i++) s = s + a[i] * b[i];
            y[(size_t)r * ldy + o] = s;
        }
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static void gemv_tile_fma(const float *x, int ldx, int nr,
                                                              const float *w, int ldw, int no,
                                                              int n, float *y, int ldy)
{
    /* missing rows/outputs repeat the first (computed, never stored) */
    const float *x0 = x, *x1 = nr > 1 ? x + ldx : x;
    const float *w0 = w, *w1 = no > 1 ? w + ldw : w, *w2 = no > 2 ? w + 2 * (size_t)ldw : w;
    const float *w3 = no > 3 ? w + 3 * (size_t)ldw : w;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
    __m256 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a0 = _mm256_loadu_ps(x0 + i), a1 = _mm256_loadu_ps(x1 + i);
        __m256 b0 = _mm256_loadu_ps(w0 + i), b1 = _mm256_loadu_ps(w1 + i);
        __m256 b2 = _mm256_loadu_ps(w2 + i), b3 = _mm256_loadu_ps(w3 + i);
        c00 = _mm256_fmadd_ps(a0, b0, c00), c01 = _mm256_fmadd_ps(a0, b1, c01);
        c02 = _mm256_fmadd_ps(a0, b2, c02), c03 = _mm256_fmadd_ps(a0, b3, c03);
        c10 = _mm256_fmadd_ps(a1, b0, c10), c11 = _mm256_fmadd_ps(a1, b1, c11);
        c12 = _mm256_fmadd_ps(a1, b2, c12), c13 = _mm256_fmadd_ps(a1, b3, c13);
    }
    __m256 acc[2][4] = {{c00, c01, c02, c03}, {c10, c11, c12, c13}};
    const float *xs[2] = {x0, x1}, *ws[4] = {w0, w1, w2, w3};
    for (int r = 0; r < nr; r++)
        for (int o = 0; o < no; o++) {
            float l[8];
            _mm256_storeu_ps(l, acc[r][o]);
            float s = lane_sum(l);
            for (int t = i; t < n; t++) s = fmaf(xs[r][t], ws[o][t], s);
            y[(size_t)r * ldy + o] = s;
        }
}

/* One row against up to 8 outputs: the odd row of a tile pass (and all of batch-1 decode). */
__attribute__((target("avx2,fma"))) static void gemv_row8_fma(const float *x, const float *w,
                                                              int ldw, int no, int n, float *y)
{
    const float *ws[8];
    for (int o = 0; o < 8; o++) ws[o] = w + (size_t)(o < no ? o : 0) * ldw;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        c0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(ws[0] + i), c0);
        c1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(ws[1] + i), c1);
        c2 = _mm256_fmadd_ps(a, _mm256_loadu_ps(ws[2] + i), c2);
        c3 = _mm256_fmadd_ps(a, _mm256_loadu_ps(ws[3] + i), c3);
        c4 = _mm256_fmadd_ps(a, _mm256_loadu_ps(ws[4] + i), c4);
        c5 = _mm256_fmadd_ps(a, _mm256_loadu_ps(ws[5] + i), c5);
        c6 = _mm256_fmadd_ps(a, _mm256_loadu_ps(ws[6] + i), c6);
        c7 = _mm256_fmadd_ps(a, _mm256_loadu_ps(ws[7] + i), c7);
    }
    __m256 acc[8] = {c0, c1, c2, c3, c4, c5, c6, c7};
    for (int o = 0; o < no; o++) {
        float l[8];
        _mm256_storeu_ps(l, acc[o]);
        float s = lane_sum(l);
        for (int t = i; t < n; t++) s = fmaf(x[t], ws[o][t], s);
        y[o] = s;
    }
}
#endif

static void gemv_row8_generic(const float *x, const float *w, int ldw, int no, int n, float *y)
{
    gemv_tile_generic(x, n, 1, w, ldw, no, n, y, 1);
}

typedef void (*gemv_row_fn)(const float *x, const float *w, int ldw, int no, int n, float *y);
gemv_tile_fn infer__gemv_tile;
int infer__gemv_fma;
static gemv_row_fn gemv_row8;

void infer__choose_gemv(void)
{
    if (infer__gemv_tile) return;
    infer__gemv_tile = gemv_tile_generic, gemv_row8 = gemv_row8_generic;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        infer__gemv_tile = gemv_tile_fma, gemv_row8 = gemv_row8_fma, infer__gemv_fma = 1;
#endif
}

/* y[o] = x·w_o for o < no, w_o = w + o·ldw: the absorbed attention's products, 8 at a time. */
void infer__dots(float *y, const float *x, const float *w, int ldw, int no, int n)
{
    for (int o = 0; o < no; o += 8)
        gemv_row8(x, w + (size_t)o * ldw, ldw, no - o < 8 ? no - o : 8, n, y + o);
}

/* Column chunks of the GEMM kind: narrow for decode-sized calls (few rows: spread the weight
** streaming over the threads), wide for prefill. Multiples of 16 (the packed panel width). */
enum { GEMV_BLOCK = 32, GEMM_COLS_DECODE = 32, GEMM_COLS = 128, BLAS_ROWS = PRL_ROW_BLOCK };

typedef struct lin_ctx {
    const prl_infer *e;
    const lin *L;
    const float *x;
    float *y;
    int R, cols, col_tasks;
    const int8_t *xq; /* LIN_Q8: the quantized rows and their scales */
    const float *xs;
} lin_ctx;

static void gemv_task(void *p, int t)
{
    lin_ctx *c = p;
    int o0 = t * GEMV_BLOCK, o1 = o0 + GEMV_BLOCK < c->L->out ? o0 + GEMV_BLOCK : c->L->out;
    int in = c->L->in, out = c->L->out;
    int pairs = c->R & ~1; /* rows in 2×4 tiles; an odd last row in 1×8 tiles */
    for (int o = o0; o < o1; o += 4)
        for (int r = 0; r < pairs; r += 2)
            infer__gemv_tile(c->x + (size_t)r * in, in, 2, c->L->w + (size_t)o * in, in,
                             o1 - o < 4 ? o1 - o : 4, in, c->y + (size_t)r * out + o, out);
    if (pairs == c->R) return;
    const float *x = c->x + (size_t)pairs * in;
    for (int o = o0; o < o1; o += 8) {
        int no = o1 - o < 8 ? o1 - o : 8;
        gemv_row8(x, c->L->w + (size_t)o * in, in, no, in, c->y + (size_t)pairs * out + o);
    }
}

static void gemm_task(void *p, int t)
{
    lin_ctx *c = p;
    int rb = t / c->col_tasks, cb = t % c->col_tasks;
    int r0 = rb * PRL_ROW_BLOCK, rows = c->R - r0 < PRL_ROW_BLOCK ? c->R - r0 : PRL_ROW_BLOCK;
    int c0 = cb * c->cols, cols = c->L->out - c0 < c->cols ? c->L->out - c0 : c->cols;
    prl_gemm_f32_packed(0, rows, c0, cols, 1, c->x + (size_t)r0 * c->L->in, c->L->in, &c->L->pk, 0,
                        c->y + (size_t)r0 * c->L->out, c->L->out);
}

static void blas_task(void *p, int t)
{
    lin_ctx *c = p;
    int r0 = t * BLAS_ROWS, rows = c->R - r0 < BLAS_ROWS ? c->R - r0 : BLAS_ROWS;
    prl_sgemm(0, 1, rows, c->L->out, c->L->in, 1, c->x + (size_t)r0 * c->L->in, c->L->in, c->L->w,
              c->L->in, 0, c->y + (size_t)r0 * c->L->out, c->L->out);
}

/* W8A8 (docs/w8a8.md): output blocks of an INT8 or a BF16 linear. A task's outputs
** are cut into blocks whose weights stay in cache while every row reads them. */
enum { QUANT_BLOCK = 64 };

static void q8_task(void *p, int t)
{
    lin_ctx *c = p;
    int o0 = t * c->cols, no = c->L->out - o0 < c->cols ? c->L->out - o0 : c->cols;
    prl_q8_linear_block(c->y + o0, c->L->out, c->xq, c->xs, c->R, &c->L->q8, o0, no);
}

static void bf16_task(void *p, int t)
{
    lin_ctx *c = p;
    int o0 = t * c->cols, o1 = o0 + c->cols < c->L->out ? o0 + c->cols : c->L->out;
    prl_q8_kernel k = prl_q8_kernel_active();
    for (int b = o0; b < o1; b += QUANT_BLOCK) {
        int nb = o1 - b < QUANT_BLOCK ? o1 - b : QUANT_BLOCK;
        for (int r = 0; r < c->R; r++)
            prl_bf16_dots(k, c->y + (size_t)r * c->L->out + b, c->x + (size_t)r * c->L->in,
                          &c->L->bf, b, nb);
    }
}

/* The tasks of a W8A8 linear: an INT8 one quantizes its rows first (into *q8x / *q8s, which
** advance past them). Decode-sized calls take two column tasks (one per core, as the GEMM). */
static int quant_tasks(lin_ctx *c, void (**fn)(void *, int), int8_t **q8x, float **q8s)
{
    const lin *L = c->L;
    c->cols = c->R <= 32 ? (L->out + 1) / 2 : 4 * QUANT_BLOCK;
    c->cols = (c->cols + 3) / 4 * 4;
    if (L->kind == LIN_Q8) {
        PRL_ASSERT(*q8x + (size_t)c->R * L->q8.ld <= c->e->q8x + c->e->q8x_cap &&
                   *q8s + c->R <= c->e->q8s + c->e->q8s_cap);
        prl_q8_quantize_rows(*q8x, *q8s, c->x, L->in, c->R, L->in, L->q8.ld, L->q8.inv_s);
        c->xq = *q8x, c->xs = *q8s;
        *q8x += (size_t)c->R * L->q8.ld, *q8s += c->R;
        *fn = q8_task;
    } else {
        *fn = bf16_task;
    }
    return (L->out + c->cols - 1) / c->cols;
}

void infer__linear_f32_dots(float *y, const float *x, int R, const lin *L)
{
    for (int r = 0; r < R; r++)
        for (int o = 0; o < L->out; o += 8)
            gemv_row8(x + (size_t)r * L->in, L->w + (size_t)o * L->in, L->in,
                      L->out - o < 8 ? L->out - o : 8, L->in, y + (size_t)r * L->out + o);
}

/* Tasks run on the pool, or inline when the work is too small to pay for waking it. Which
** thread runs a task never changes its result. */
enum { POOL_MIN_MACS = 1 << 12 };

void infer__run_tasks(int n, void (*fn)(void *, int), void *ctx, double macs)
{
    if (macs < POOL_MIN_MACS || n == 1) {
        for (int t = 0; t < n; t++) fn(ctx, t);
        return;
    }
    prl_parallel_for(n, fn, ctx);
}

/* The tasks of y[R, out] = x[R, in]·wᵀ in the engine's matmul kind: c set up, its task
** function and count returned. */
static int linear_tasks(lin_ctx *c, void (**fn)(void *, int), const prl_infer *e, float *y,
                        const float *x, int R, const lin *L, int8_t **q8x, float **q8s)
{
    *c = (lin_ctx){.e = e, .L = L, .x = x, .y = y, .R = R};
    if (L->kind != LIN_F32 && e->calibrating) { /* fp32 activations for SmoothQuant's search */
        if (L->cal) infer__calib_record(L, x, R);
        *fn = gemv_task;
        return (L->out + GEMV_BLOCK - 1) / GEMV_BLOCK;
    }
    if (L->kind != LIN_F32) return quant_tasks(c, fn, q8x, q8s);
    int row_blocks = (R + PRL_ROW_BLOCK - 1) / PRL_ROW_BLOCK;
    switch (e->opt.matmul) {
    case PRL_MATMUL_GEMV: *fn = gemv_task; return (L->out + GEMV_BLOCK - 1) / GEMV_BLOCK;
    case PRL_MATMUL_GEMM:
        /* Decode-sized calls take two column tasks, one per thread of this machine: both
        ** cores stream weights and A is packed once per task (measured: 8 narrow tasks were
        ** ~35% slower at batch 1 from pool hand-offs, one task ~30% slower); prefill-sized
        ** calls take fixed 128-column tasks. */
        c->cols = R <= 32 ? (L->out + 1) / 2 : GEMM_COLS;
        c->cols = (c->cols + 15) / 16 * 16;
        c->cols = c->cols < GEMM_COLS_DECODE ? GEMM_COLS_DECODE : c->cols;
        c->col_tasks = (L->out + c->cols - 1) / c->cols;
        *fn = gemm_task;
        return row_blocks * c->col_tasks;
    case PRL_MATMUL_BLAS: *fn = blas_task; return (R + BLAS_ROWS - 1) / BLAS_ROWS;
    }
    PRL_ASSERT(!"unknown matmul kind");
    return 0;
}

/* y[R, out] = x[R, in]·wᵀ, rounded to the precision. */
void infer__linear(const prl_infer *e, float *y, const float *x, int R, const lin *L)
{
    if (R <= 0) return;
    lin_ctx c;
    void (*fn)(void *, int);
    int8_t *q8x = e->q8x;
    float *q8s = e->q8s;
    int n = linear_tasks(&c, &fn, e, y, x, R, L, &q8x, &q8s);
    infer__run_tasks(n, fn, &c, (double)R * L->in * L->out);
    infer__act_round(e, y, (size_t)R * L->out);
}

/* ------------------------------------------------------------------ linear sets ----- */

enum { MANY_MAX = 32 }; /* linears per parallel region; a longer list takes several */

typedef struct many_ctx {
    lin_ctx c[MANY_MAX];
    void (*fn[MANY_MAX])(void *, int);
    int first[MANY_MAX + 1]; /* linear i owns tasks [first[i], first[i + 1]) */
    int n;
} many_ctx;

static void many_task(void *p, int t)
{
    many_ctx *m = p;
    int i = 0;
    while (t >= m->first[i + 1]) i++;
    m->fn[i](&m->c[i], t - m->first[i]);
}

/* Independent linears (no output is another's input) in one parallel region instead of one
** region each: every task is the task infer__linear would run for its linear, so the bits
** are those of calling infer__linear on each in turn; only the hand-offs are fewer. */
void infer__linear_many(const prl_infer *e, const infer_lin_job *jobs, int n)
{
    for (int j0 = 0; j0 < n; j0 += MANY_MAX) {
        many_ctx m = {.n = 0};
        double macs = 0;
        int8_t *q8x = e->q8x; /* each INT8 job's quantized rows in their own part */
        float *q8s = e->q8s;
        m.first[0] = 0;
        for (int j = j0; j < n && j < j0 + MANY_MAX; j++) {
            const infer_lin_job *q = &jobs[j];
            if (q->R <= 0) continue;
            int k = m.n++;
            m.first[k + 1] =
                m.first[k] + linear_tasks(&m.c[k], &m.fn[k], e, q->y, q->x, q->R, q->L, &q8x, &q8s);
            macs += (double)q->R * q->L->in * q->L->out;
        }
        if (m.n == 0) continue;
        infer__run_tasks(m.first[m.n], many_task, &m, macs);
        for (int k = 0; k < m.n; k++)
            infer__act_round(e, m.c[k].y, (size_t)m.c[k].R * m.c[k].L->out);
    }
}
