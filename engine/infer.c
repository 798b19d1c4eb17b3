/*
** infer.c — the infer path: prefill and batched incremental decode over a per-sequence KV
** cache, continuous batching, sampling, route capture, precision modes, tensor hooks.
**
** One driver, forward_rows(), runs any set of rows (tokens at positions of sequences in
** cache slots) through the model: a prefill is the rows of one prompt, a decode step one row
** per active sequence. Each op is chosen by the options (infer.h): the matmul kind, the MLA
** form, the rounding. Every kernel computes a row from that row's inputs alone, in a fixed
** order, so batch composition and thread count never change a result; with the "aligned"
** preset each op is the train path's own code (ops.c, gemm.c) and results are bitwise equal.
** The maths is docs/model.md; the knobs are docs/infer.md.
*/
#include "engine/dsa.h"
#include "engine/mhc.h"
#include "engine/spec_decode.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#ifdef PRL_REAL_DOUBLE
#error "the infer path is float-only (build it in prl_model, not prl_model64)"
#endif

/* ------------------------------------------------------------------ options --------- */

void prl_infer_options_default(prl_infer_options *o)
{
    *o = (prl_infer_options){.precision = PRL_PRECISION_FP32, .mla = PRL_MLA_ABSORBED,
                             .matmul = PRL_MATMUL_GEMM, .max_batch = 16, .max_len = 0};
}

static const char *const precision_names[] = {"fp32", "bf16", "fp16"};
static const char *const mla_names[] = {"absorbed", "naive"};
static const char *const matmul_names[] = {"gemv", "gemm", "blas"};

static int lookup(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

prl_status prl_infer_options_preset(prl_infer_options *o, const char *name)
{
    prl_infer_options_default(o);
    int p = -1;
    if (!strncmp(name, "aligned", 7)) { /* "aligned" is fp32; "aligned-fp16" the train path's fp16 */
        p = !name[7] ? PRL_PRECISION_FP32 : name[7] == '-' ? lookup(precision_names, 3, name + 8) : -1;
        o->mla = PRL_MLA_NAIVE;
        o->matmul = PRL_MATMUL_GEMM;
    } else {
        p = lookup(precision_names, 3, name);
    }
    if (p < 0)
        return prl_error_set(PRL_ERR_ARG, "unknown precision '%s' (choices: fp32, bf16, fp16, "
                             "aligned, aligned-bf16, aligned-fp16)", name);
    o->precision = (prl_precision)p;
    return PRL_OK;
}

prl_status prl_infer_options_set(prl_infer_options *o, const char *precision, const char *mla,
                                 const char *matmul)
{
    int v;
    if (precision) {
        if ((v = lookup(precision_names, 3, precision)) < 0)
            return prl_error_set(PRL_ERR_ARG, "unknown precision '%s' (choices: fp32, bf16, fp16)",
                                 precision);
        o->precision = (prl_precision)v;
    }
    if (mla) {
        if ((v = lookup(mla_names, 2, mla)) < 0)
            return prl_error_set(PRL_ERR_ARG, "unknown MLA form '%s' (choices: absorbed, naive)", mla);
        o->mla = (prl_mla_form)v;
    }
    if (matmul) {
        if ((v = lookup(matmul_names, 3, matmul)) < 0)
            return prl_error_set(PRL_ERR_ARG, "unknown matmul kind '%s' (choices: gemv, gemm, blas)",
                                 matmul);
        o->matmul = (prl_matmul_kind)v;
    }
    return PRL_OK;
}

void prl_infer_options_describe(const prl_infer_options *o, char *out, size_t n)
{
    snprintf(out, n, "precision=%s mla=%s matmul=%s", precision_names[o->precision],
             mla_names[o->mla], matmul_names[o->matmul]);
}

/* ------------------------------------------------------------------ state ----------- */

/* A linear layer out = x·wᵀ, w [out, in] (with a packed copy for the GEMM kind). */
typedef struct lin {
    const float *w;
    int out, in;
    prl_packed_b pk;
} lin;

typedef struct layer_w {
    int moe;                          /* MoE index, -1 for a dense layer */
    const float *ln1, *q_norm, *kv_norm, *ln2;
    lin wq_a, wq_b, wkv_a, wkv_b, wo;
    lin w13, w2;                      /* dense FFN, or the shared experts; gate/up stacked */
    lin router;
    lin *e13, *e2;                    /* [E] routed experts, gate/up stacked */
    float *wuk_t;                     /* absorbed form: [H][rkv][dn] = W_UK_hᵀ per head */
    int window;                       /* 0 = causal, W = sliding window (docs/model.md) */
    int cap;                          /* cache rows per slot: max_len, or W for a ring */
    size_t lat_off, kv_off;           /* the layer's part of cache_lat / cache_kv */
    size_t slot_kv_floats;            /* floats one slot holds in cache_lat (+ cache_kv, naive) */
    size_t slot_idx_floats;           /* floats one slot holds in cache_idx (DSA layers) */
    float *sink_lat;                  /* [ns][rkv + dr]: normed sink latent, then k_pe */
    float *sink_kv;                   /* [ns][H·dkv]: per-head sink [k_nope | v] (naive) */
    const float *conv_w[3];           /* ModAttn kernels [C, k]: query, latent, heads */
    int dsa;                          /* 1: a DSA layer (indexer below; never a ring) */
    int dsa_sparse;                   /* its attention reads only the selected tokens */
    lin ix_wq_b, ix_wk, ix_wproj;     /* the lightning indexer (docs/model.md, DSA) */
    const float *ix_k_norm;
    size_t idx_off;                   /* the layer's part of cache_idx */
    float *conv_state[3];             /* per slot the k−1 latest inputs of each conv [k−1][C] */
    const float *ln_pa, *ln_pm, *ln_bp; /* sandwich post-norms, block post-norm (or NULL) */
    lin hc_phi[2];                    /* mHC sites attention, FFN: phi, and below γ, α, β */
    const float *hc_gamma[2], *hc_alpha[2], *hc_beta[2];
    const float *enorm, *hnorm, *sh_norm; /* MTP layer: input norms, shared_head.norm */
    lin eh_proj, own_head;            /* MTP layer: eh_proj, its own shared_head.head */
    const lin *sh_head;               /* own_head, or the trunk's lm_head */
    lin draft_head;                   /* spec_draft_vocab: sh_head's first rows (w NULL: off) */
} layer_w;

enum { CONV_Q, CONV_KV, CONV_O };

/* Buffers of one forward_rows call, sized for `cap` rows. */
typedef struct rows_buf {
    int cap;
    int32_t *tok, *slot, *pos, *req;
    float *x, *ln, *rstd, *zq, *cq, *q, *kva, *ckv, *kr, *lat, *kvx, *o, *tmp, *a13, *h;
    int32_t *first_row, *first_pos; /* [max_batch]: a slot's first row in the call, its position */
    float *zqc, *kvc, *oc;        /* ModAttn outputs */
    float *z, *s, *g;
    int32_t *sel, *offsets, *gpos, *token_of;
    float *xg, *ea13, *eh, *yg, *logits;
    float *iq, *ikz, *ik, *iw, *iscore; /* DSA indexer: qI, x·wkᵀ, kI, head weights; scores */
    uint8_t *dsel;                     /* [cap][max_len] each row's DSA selection */
    float *xs, *xs2, *hn, *hrstd, *hm, *pre, *post, *hS; /* mHC streams [cap, n·d], a site's
                                                            coefficients (engine/mhc.h) */
    float *mtp_e, *mtp_h, *mtp_cat, *mtp_rstd; /* MTP input op: Emb rows, h^{k−1} rows, [cap, 2d],
                                                ** rstd of both norms [2·cap] */
} rows_buf;

/* A cache slot's generation state. */
typedef struct slot_state {
    int req;           /* request index, -1 when free */
    int len;           /* tokens in the cache */
    int32_t last;      /* the token to feed next */
    int32_t *routes;   /* [max_len][n_moe][K] */
    /* speculative decoding only (docs/infer.md): */
    int32_t *toks;     /* [max_len + D + 1] the sequence: prompt, generated, then `last` */
    float *hid;        /* [1 + Lm][max_len][d]: h⁰ (trunk) and h^k (MTP k) per position */
    int *mtp_len;      /* [Lm] positions MTP layer k has final cache rows for */
    int32_t *draft;    /* [D] this step's drafts */
    double *q;         /* [D][V] their draft distributions (sampling) */
} slot_state;

struct prl_infer {
    const prl_model *m;
    prl_infer_options opt;
    int V, d, L, H, rq, rkv, dn, dr, dv, dq, dkv, I, E, K, de, sde, n_moe, lat, ns, ck, HI, dI;
    float *wcopy;                 /* rounded weights (bf16/fp16), NULL in fp32 */
    layer_w *lw;
    const float *embed, *norm;
    lin head;
    float *rope_cos, *rope_sin;   /* [max_len][dr/2] */
    float *cache_lat;             /* per layer [max_batch][cap][rkv+dr]: c_kv then k_r */
    float *cache_kv;              /* naive: per layer [max_batch][cap][H·dkv] */
    float *cache_idx;             /* DSA layers: [max_batch][max_len][dI] indexer keys */
    float *att_scratch;           /* per pool thread */
    size_t att_scratch_per_thread;
    int att_threads;
    rows_buf rb;
    slot_state *slots;
    prl_tensor_hook hook;
    void *hook_user;
    int n_streams;                /* mHC streams (1 = the plain residual) */
    lin merge_phi;                /* mHC merge head */
    const float *merge_gamma, *merge_alpha, *merge_beta, *ones;
    float *ones_buf;              /* γ = 1 without mhc_use_gamma */
    char fault_name[64];          /* test-only fault (prl_infer_set_fault): "" = none */
    double fault_rel;
    int Lm;                       /* MTP layers bound (speculative decoding on), after the L */
    int conv_hist;                /* inputs a conv history keeps per slot: k − 1 + spare rows */
    double *spec_p;               /* [D + 1][V] one slot's verify distributions */
    prl_spec_stats spec;          /* counters since init */
};

/* Activation rounding at an op's output (no-op in fp32). */
static void act_round(const prl_infer *e, float *x, size_t n) { prl_round_floats(e->opt.precision, x, n); }

/* ------------------------------------------------------------------ matmuls --------- */

/* The GEMV-order dot product: one 8-lane accumulator takes i ≡ lane (mod 8) in order (a
** fused multiply-add when the CPU has FMA), the lanes are summed in a fixed tree, the tail is
** added last. A dot's operations never depend on which tile computes it, so tiles of 2 rows ×
** 4 outputs (8 independent chains, enough to hide the FMA latency) give the same bits as one
** dot at a time. gemv_tile computes y[r][o] = x_r·w_o for r < nr (<= 2), o < no (<= 4). */
typedef float v8f __attribute__((vector_size(32)));

static inline float lane_sum(const float *l)
{
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

typedef void (*gemv_tile_fn)(const float *x, int ldx, int nr, const float *w, int ldw, int no,
                             int n, float *y, int ldy);

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
__attribute__((target("avx2,fma"))) static void
gemv_tile_fma(const float *x, int ldx, int nr, const float *w, int ldw, int no, int n, float *y,
              int ldy)
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
__attribute__((target("avx2,fma"))) static void
gemv_row8_fma(const float *x, const float *w, int ldw, int no, int n, float *y)
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
static gemv_tile_fn gemv_tile;
static gemv_row_fn gemv_row8;

static void choose_gemv(void)
{
    if (gemv_tile) return;
    gemv_tile = gemv_tile_generic, gemv_row8 = gemv_row8_generic;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        gemv_tile = gemv_tile_fma, gemv_row8 = gemv_row8_fma;
#endif
}

/* y[o] = x·w_o for o < no, w_o = w + o·ldw: the absorbed attention's products, 8 at a time. */
static void dots(float *y, const float *x, const float *w, int ldw, int no, int n)
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
} lin_ctx;

static void gemv_task(void *p, int t)
{
    lin_ctx *c = p;
    int o0 = t * GEMV_BLOCK, o1 = o0 + GEMV_BLOCK < c->L->out ? o0 + GEMV_BLOCK : c->L->out;
    int in = c->L->in, out = c->L->out;
    int pairs = c->R & ~1; /* rows in 2×4 tiles; an odd last row in 1×8 tiles */
    for (int o = o0; o < o1; o += 4)
        for (int r = 0; r < pairs; r += 2)
            gemv_tile(c->x + (size_t)r * in, in, 2, c->L->w + (size_t)o * in, in,
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
    prl_gemm_f32_packed(0, rows, c0, cols, 1, c->x + (size_t)r0 * c->L->in, c->L->in, &c->L->pk,
                        0, c->y + (size_t)r0 * c->L->out, c->L->out);
}

static void blas_task(void *p, int t)
{
    lin_ctx *c = p;
    int r0 = t * BLAS_ROWS, rows = c->R - r0 < BLAS_ROWS ? c->R - r0 : BLAS_ROWS;
    prl_sgemm(0, 1, rows, c->L->out, c->L->in, 1, c->x + (size_t)r0 * c->L->in, c->L->in,
              c->L->w, c->L->in, 0, c->y + (size_t)r0 * c->L->out, c->L->out);
}

/* Tasks run on the pool, or inline when the work is too small to pay for waking it. Which
** thread runs a task never changes its result. */
enum { POOL_MIN_MACS = 1 << 12 };

static void run_tasks(int n, void (*fn)(void *, int), void *ctx, double macs)
{
    if (macs < POOL_MIN_MACS || n == 1) {
        for (int t = 0; t < n; t++) fn(ctx, t);
        return;
    }
    prl_parallel_for(n, fn, ctx);
}

/* y[R, out] = x[R, in]·wᵀ, rounded to the precision. */
static void linear(const prl_infer *e, float *y, const float *x, int R, const lin *L)
{
    if (R <= 0) return;
    lin_ctx c = {.e = e, .L = L, .x = x, .y = y, .R = R};
    int row_blocks = (R + PRL_ROW_BLOCK - 1) / PRL_ROW_BLOCK;
    double macs = (double)R * L->in * L->out;
    switch (e->opt.matmul) {
    case PRL_MATMUL_GEMV:
        run_tasks((L->out + GEMV_BLOCK - 1) / GEMV_BLOCK, gemv_task, &c, macs);
        break;
    case PRL_MATMUL_GEMM:
        /* Decode-sized calls take two column tasks, one per thread of this machine: both
        ** cores stream weights and A is packed once per task (measured: 8 narrow tasks were
        ** ~35% slower at batch 1 from pool hand-offs, one task ~30% slower); prefill-sized
        ** calls take fixed 128-column tasks. */
        c.cols = R <= 32 ? (L->out + 1) / 2 : GEMM_COLS;
        c.cols = (c.cols + 15) / 16 * 16;
        c.cols = c.cols < GEMM_COLS_DECODE ? GEMM_COLS_DECODE : c.cols;
        c.col_tasks = (L->out + c.cols - 1) / c.cols;
        run_tasks(row_blocks * c.col_tasks, gemm_task, &c, macs);
        break;
    case PRL_MATMUL_BLAS:
        run_tasks((R + BLAS_ROWS - 1) / BLAS_ROWS, blas_task, &c, macs);
        break;
    }
    act_round(e, y, (size_t)R * L->out);
}

/* ------------------------------------------------------------------ set-up ---------- */

/* A tensor of the model by name (the layout is model.c's business), in `base`. */
static const float *tensor(const prl_infer *e, const float *base, int64_t rows, int64_t cols,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static const float *tensor(const prl_infer *e, const float *base, int64_t rows, int64_t cols,
                           const char *fmt, ...)
{
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const prl_param_info *p = prl_model_find(e->m, name);
    PRL_ASSERT(p != NULL && p->shape[0] == rows && (cols == 0 || p->shape[1] == cols));
    return base + p->offset;
}

static prl_status lin_init(const prl_infer *e, lin *L, const float *w, int out, int in)
{
    prl_packed_b_free(&L->pk);
    *L = (lin){.w = w, .out = out, .in = in};
    if (e->opt.matmul == PRL_MATMUL_GEMM) return prl_packed_b_init(&L->pk, 1, in, out, w, in);
    return PRL_OK;
}

static void lin_free(lin *L) { prl_packed_b_free(&L->pk); }

/* Sink rows of layer l from the (rounded) weights `base`, by the train path's own ops: the
** latent rows [RMSNorm(param_sink_compressed_kv; kv_a_layernorm) | param_sink_k_pe] (zero
** latent without param_sink_with_value) and, for the naive form, the per-head [k_nope | v]. */
static void bind_sinks(prl_infer *e, int l, const float *base)
{
    layer_w *w = &e->lw[l];
    int ns = e->ns, rkv = e->rkv;
    float *ckv = calloc((size_t)ns * rkv, sizeof *ckv), *rstd = malloc((size_t)ns * sizeof *rstd);
    PRL_ASSERT(ckv != NULL && rstd != NULL);
    if (e->m->cfg.param_sink_with_value) {
        const float *raw = tensor(e, base, ns, rkv, "model.layers.%d.self_attn.param_sink_compressed_kv", l);
        prl_rmsnorm_forward(ckv, rstd, raw, w->kv_norm, ns, rkv, rkv, rkv, PRL_LATENT_NORM_EPS);
        act_round(e, ckv, (size_t)ns * rkv);
    }
    const float *kpe = tensor(e, base, ns, e->dr, "model.layers.%d.self_attn.param_sink_k_pe", l);
    for (int i = 0; i < ns; i++) {
        memcpy(w->sink_lat + (size_t)i * e->lat, ckv + (size_t)i * rkv, (size_t)rkv * sizeof *ckv);
        memcpy(w->sink_lat + (size_t)i * e->lat + rkv, kpe + (size_t)i * e->dr, (size_t)e->dr * sizeof *kpe);
    }
    if (e->opt.mla == PRL_MLA_NAIVE) {
        prl_matmul_forward(w->sink_kv, ckv, w->wkv_b.w, ns, rkv, e->H * e->dkv, 0);
        act_round(e, w->sink_kv, (size_t)ns * e->H * e->dkv);
    }
    free(ckv), free(rstd);
}

/* One mHC module `prefix` (model.c's names): phi packed as a linear, γ (ones without
** mhc_use_gamma), α, β. */
static prl_status bind_mhc(prl_infer *e, lin *phi, const float **gamma, const float **alpha,
                           const float **beta, const float *base, const char *prefix, int full)
{
    int n = e->n_streams, nd = n * e->d, M = full ? n * n + 2 * n : n;
    const char *sfx = full ? "" : "_pre";
    *gamma = e->m->cfg.mhc_use_gamma ? tensor(e, base, nd, 0, "%s.norm_gamma", prefix) : e->ones;
    *alpha = tensor(e, base, full ? 3 : 1, 0, "%s.branch_alpha%s", prefix, sfx);
    *beta = tensor(e, base, M, 0, "%s.branch_beta%s", prefix, sfx);
    return lin_init(e, phi, tensor(e, base, M, nd, "%s.phi.weight", prefix), M, nd);
}

/* Sandwich norms, the block post-norm and the two mHC sites of layer l. */
static prl_status bind_residual(prl_infer *e, int l, const float *base)
{
    layer_w *w = &e->lw[l];
    const prl_config *c = &e->m->cfg;
    const char *p = "model.layers";
    w->ln_pa = c->sandwich_norm ? tensor(e, base, e->d, 0, "%s.%d.post_attention_layernorm.weight", p, l) : NULL;
    w->ln_pm = c->sandwich_norm ? tensor(e, base, e->d, 0, "%s.%d.post_mlp_layernorm.weight", p, l) : NULL;
    w->ln_bp = prl_config_block_post_norm(c, l)
                   ? tensor(e, base, (int64_t)e->n_streams * e->d, 0, "%s.%d.block_post_layernorm.weight", p, l)
                   : NULL;
    prl_status rc = PRL_OK;
    for (int site = 0; site < 2 && c->use_mhc && l < e->L && !rc; site++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "%s.%d.%s_mhc_module", p, l, site ? "mlp" : "attn");
        rc = bind_mhc(e, &w->hc_phi[site], &w->hc_gamma[site], &w->hc_alpha[site], &w->hc_beta[site],
                      base, prefix, 1);
    }
    return rc;
}

/* MTP layer l's own tensors (model.c's names): enorm, hnorm, eh_proj, and shared_head.norm /
** shared_head.head when the config has them, else the trunk's model.norm / lm_head. */
static prl_status bind_mtp(prl_infer *e, int l, const float *base)
{
    layer_w *w = &e->lw[l];
    const prl_config *c = &e->m->cfg;
    w->enorm = tensor(e, base, e->d, 0, "model.layers.%d.enorm.weight", l);
    w->hnorm = tensor(e, base, e->d, 0, "model.layers.%d.hnorm.weight", l);
    w->sh_norm = c->mtp_head_norm
                     ? tensor(e, base, e->d, 0, "model.layers.%d.shared_head.norm.weight", l)
                     : e->norm;
    w->sh_head = &e->head;
    const float *eh = tensor(e, base, e->d, 2 * e->d, "model.layers.%d.eh_proj.weight", l);
    prl_status rc = lin_init(e, &w->eh_proj, eh, e->d, 2 * e->d);
    if (!rc && c->mtp_head) {
        const float *head = tensor(e, base, e->V, e->d, "model.layers.%d.shared_head.head.weight", l);
        rc = lin_init(e, &w->own_head, head, e->V, e->d);
        w->sh_head = &w->own_head;
    }
    int S = e->opt.spec_draft_vocab; /* the head's first S rows are the shortlist's weights */
    if (!rc && S > 0 && S < e->V) rc = lin_init(e, &w->draft_head, w->sh_head->w, S, e->d);
    return rc;
}

/* Point every layer at the weights (rounded copy or the model's), pack them, and build the
** absorbed query matrices and the sink rows. */
static prl_status bind_weights(prl_infer *e)
{
    const float *base = e->m->params;
    if (e->opt.precision != PRL_PRECISION_FP32) {
        memcpy(e->wcopy, e->m->params, e->m->n_params * sizeof(float));
        prl_round_floats(e->opt.precision, e->wcopy, e->m->n_params);
        base = e->wcopy;
    }
#define T(suffix, rows, cols, ...) tensor(e, base, rows, cols, "model.layers.%d." suffix, l, ##__VA_ARGS__)
#define X(suffix, rows, cols) tensor(e, base, rows, cols, "model.layers.%d.mlp.experts.%d." suffix, l, x)
    prl_status rc = PRL_OK;
    for (int l = 0, moe_idx = 0; l < e->L + e->Lm && !rc; l++) { /* trunk, then MTP layers */
        layer_w *w = &e->lw[l];
        w->moe = prl_config_is_moe(&e->m->cfg, l) ? moe_idx++ : -1;
        w->ln1 = T("input_layernorm.weight", e->d, 0);
        w->q_norm = T("self_attn.q_a_layernorm.weight", e->rq, 0);
        w->kv_norm = T("self_attn.kv_a_layernorm.weight", e->rkv, 0);
        w->ln2 = T("%s.weight", e->d, 0,
                   e->m->cfg.sandwich_norm ? "pre_mlp_layernorm" : "post_attention_layernorm");
        if (!rc) rc = bind_residual(e, l, base);
        rc = rc ? rc : lin_init(e, &w->wq_a, T("self_attn.q_a_proj.weight", e->rq, e->d), e->rq, e->d);
        rc = rc ? rc : lin_init(e, &w->wq_b, T("self_attn.q_b_proj.weight", e->H * e->dq, e->rq),
                                e->H * e->dq, e->rq);
        rc = rc ? rc : lin_init(e, &w->wkv_a, T("self_attn.kv_a_proj_with_mqa.weight", e->lat, e->d),
                                e->lat, e->d);
        rc = rc ? rc : lin_init(e, &w->wkv_b, T("self_attn.kv_b_proj.weight", e->H * e->dkv, e->rkv),
                                e->H * e->dkv, e->rkv);
        rc = rc ? rc : lin_init(e, &w->wo, T("self_attn.o_proj.weight", e->d, e->H * e->dv), e->d,
                                e->H * e->dv);
        if (w->moe < 0) { /* gate_proj and up_proj are adjacent: one stacked [2I, d] matrix */
            rc = rc ? rc : lin_init(e, &w->w13, T("mlp.gate_proj.weight", e->I, e->d), 2 * e->I, e->d);
            rc = rc ? rc : lin_init(e, &w->w2, T("mlp.down_proj.weight", e->d, e->I), e->d, e->I);
        } else {
            rc = rc ? rc : lin_init(e, &w->router, T("mlp.gate.weight", e->E, e->d), e->E, e->d);
            if (e->sde > 0) {
                rc = rc ? rc : lin_init(e, &w->w13, T("mlp.shared_experts.gate_proj.weight", e->sde, e->d),
                                        2 * e->sde, e->d);
                rc = rc ? rc : lin_init(e, &w->w2, T("mlp.shared_experts.down_proj.weight", e->d, e->sde),
                                        e->d, e->sde);
            }
            for (int x = 0; x < e->E && !rc; x++) {
                rc = lin_init(e, &w->e13[x], X("gate_proj.weight", e->de, e->d), 2 * e->de, e->d);
                rc = rc ? rc : lin_init(e, &w->e2[x], X("down_proj.weight", e->d, e->de), e->d, e->de);
            }
        }
        /* W_UK_hᵀ: rows [h·dkv, h·dkv + dn) of kv_b_proj are head h's key up-projection */
        for (int h = 0; h < e->H; h++)
            for (int c = 0; c < e->rkv; c++)
                for (int i = 0; i < e->dn; i++)
                    w->wuk_t[((size_t)h * e->rkv + c) * e->dn + i] =
                        w->wkv_b.w[((size_t)h * e->dkv + i) * e->rkv + c];
        if (e->ns > 0 && !rc) bind_sinks(e, l, base);
        if (w->dsa && !rc) { /* trunk DSA layers only (w->dsa is 0 for MTP layers) */
#define IX(name, rows, cols) tensor(e, base, rows, cols, "model.layers.%d.self_attn.indexer." name, l)
            rc = lin_init(e, &w->ix_wq_b, IX("wq_b.weight", e->HI * e->dI, e->rq), e->HI * e->dI, e->rq);
            rc = rc ? rc : lin_init(e, &w->ix_wk, IX("wk.weight", e->dI, e->d), e->dI, e->d);
            rc = rc ? rc : lin_init(e, &w->ix_wproj, IX("weights_proj.weight", e->HI, e->d), e->HI, e->d);
            w->ix_k_norm = IX("k_norm.weight", e->dI, 0);
#undef IX
        }
        if (e->ck && l < e->L) {
            w->conv_w[CONV_Q] = tensor(e, base, e->rq, 1, "model.layers.%d.self_attn.qa_conv.weight", l);
            w->conv_w[CONV_KV] =
                tensor(e, base, e->rkv, 1, "model.layers.%d.self_attn.compresskv_conv.weight", l);
            w->conv_w[CONV_O] =
                tensor(e, base, e->H * e->dv, 1, "model.layers.%d.self_attn.o_conv.weight", l);
        }
    }
#undef T
#undef X
    e->embed = tensor(e, base, e->V, e->d, "model.embed_tokens.weight");
    e->norm = tensor(e, base, e->d, 0, "model.norm.weight");
    if (!rc) rc = lin_init(e, &e->head, tensor(e, base, e->V, e->d, "lm_head.weight"), e->V, e->d);
    if (!rc && e->m->cfg.use_mhc)
        rc = bind_mhc(e, &e->merge_phi, &e->merge_gamma, &e->merge_alpha, &e->merge_beta, base,
                      "model.merge_mhc_module", 0);
    for (int l = e->L; l < e->L + e->Lm && !rc; l++) /* MTP: input op and shared head */
        rc = bind_mtp(e, l, base);
    return rc;
}

prl_status prl_infer_refresh(prl_infer *e) { return bind_weights(e); }

static void *xcalloc(size_t n, size_t size, int *failed)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) *failed = 1;
    return p;
}

/* Channels of the three ModAttn convs: the query latent, the KV latent, the heads' output. */
static int conv_channels(const prl_infer *e, int which)
{
    return which == CONV_Q ? e->rq : which == CONV_KV ? e->rkv : e->H * e->dv;
}

static void rows_buf_alloc(prl_infer *e, int cap, int *failed)
{
    rows_buf *b = &e->rb;
    size_t R = (size_t)cap, RK = R * e->K;
    int F = e->I > e->sde ? e->I : e->sde;
    b->cap = cap;
    b->tok = xcalloc(R, sizeof(int32_t), failed);
    b->slot = xcalloc(R, sizeof(int32_t), failed);
    b->pos = xcalloc(R, sizeof(int32_t), failed);
    b->req = xcalloc(R, sizeof(int32_t), failed);
    b->x = xcalloc(R * e->d, sizeof(float), failed);
    b->ln = xcalloc(R * e->d, sizeof(float), failed);
    b->rstd = xcalloc(R, sizeof(float), failed);
    b->zq = xcalloc(R * e->rq, sizeof(float), failed);
    b->cq = xcalloc(R * e->rq, sizeof(float), failed);
    b->q = xcalloc(R * e->H * e->dq, sizeof(float), failed);
    b->kva = xcalloc(R * (e->rkv + e->dr), sizeof(float), failed);
    b->ckv = xcalloc(R * e->rkv, sizeof(float), failed);
    b->kr = xcalloc(R * e->dr, sizeof(float), failed);
    b->lat = xcalloc(R * e->lat, sizeof(float), failed);
    b->first_row = xcalloc((size_t)e->opt.max_batch, sizeof(int32_t), failed);
    b->first_pos = xcalloc((size_t)e->opt.max_batch, sizeof(int32_t), failed);
    if (e->ck) {
        b->zqc = xcalloc(R * e->rq, sizeof(float), failed);
        b->kvc = xcalloc(R * e->rkv, sizeof(float), failed);
        b->oc = xcalloc(R * e->H * e->dv, sizeof(float), failed);
    }
    b->kvx = xcalloc(R * e->H * e->dkv, sizeof(float), failed);
    b->o = xcalloc(R * e->H * e->dv, sizeof(float), failed);
    b->tmp = xcalloc(R * e->d, sizeof(float), failed);
    b->a13 = xcalloc(R * 2 * (size_t)F, sizeof(float), failed);
    b->h = xcalloc(R * (size_t)F, sizeof(float), failed);
    b->z = xcalloc(R * e->E, sizeof(float), failed);
    b->s = xcalloc(R * e->E, sizeof(float), failed);
    b->g = xcalloc(RK, sizeof(float), failed);
    b->sel = xcalloc(RK, sizeof(int32_t), failed);
    b->offsets = xcalloc((size_t)e->E + 1, sizeof(int32_t), failed);
    b->gpos = xcalloc(RK, sizeof(int32_t), failed);
    b->token_of = xcalloc(RK, sizeof(int32_t), failed);
    b->xg = xcalloc(RK * e->d, sizeof(float), failed);
    b->ea13 = xcalloc(RK * 2 * e->de, sizeof(float), failed);
    b->eh = xcalloc(RK * e->de, sizeof(float), failed);
    b->yg = xcalloc(RK * e->d, sizeof(float), failed);
    b->logits = xcalloc(R * e->V, sizeof(float), failed);
    if (e->Lm) {
        b->mtp_e = xcalloc(R * e->d, sizeof(float), failed);
        b->mtp_h = xcalloc(R * e->d, sizeof(float), failed);
        b->mtp_cat = xcalloc(2 * R * e->d, sizeof(float), failed);
        b->mtp_rstd = xcalloc(2 * R, sizeof(float), failed);
    }
    if (e->m->cfg.n_dsa_layers > 0) {
        b->iq = xcalloc(R * e->HI * e->dI, sizeof(float), failed);
        b->ikz = xcalloc(R * e->dI, sizeof(float), failed);
        b->ik = xcalloc(R * e->dI, sizeof(float), failed);
        b->iw = xcalloc(R * e->HI, sizeof(float), failed);
        b->iscore = xcalloc((size_t)e->opt.max_len, sizeof(float), failed);
        b->dsel = xcalloc(R * e->opt.max_len, 1, failed);
    }
    if (e->m->cfg.use_mhc) {
        prl_mhc_shape sh = {.N = cap, .n = e->n_streams, .d = e->d, .it = e->m->cfg.mhc_recur_norm,
                            .full = 1};
        size_t nd = (size_t)e->n_streams * e->d, n = (size_t)e->n_streams;
        b->xs = xcalloc(R * nd, sizeof(float), failed);
        b->xs2 = xcalloc(R * nd, sizeof(float), failed);
        b->hn = xcalloc(R * nd, sizeof(float), failed);
        b->hrstd = xcalloc(R, sizeof(float), failed);
        b->hm = xcalloc(R * prl_mhc_width(sh), sizeof(float), failed);
        b->pre = xcalloc(R * n, sizeof(float), failed);
        b->post = xcalloc(R * n, sizeof(float), failed);
        b->hS = xcalloc(R * prl_mhc_states(sh) * n * n, sizeof(float), failed);
    }
}

static void rows_buf_free(rows_buf *b)
{
    void *ptrs[] = {b->tok, b->slot, b->pos, b->req, b->x, b->ln, b->rstd, b->zq, b->cq, b->q,
                    b->kva, b->ckv, b->kr, b->lat, b->first_row, b->first_pos, b->zqc, b->kvc, b->oc, b->kvx, b->o, b->tmp, b->a13, b->h, b->z, b->s, b->g,
                    b->sel, b->offsets, b->gpos, b->token_of, b->xg, b->ea13, b->eh, b->yg,
                    b->logits, b->iq, b->ikz, b->ik, b->iw, b->iscore, b->dsel, b->xs, b->xs2,
                    b->hn, b->hrstd, b->hm, b->pre, b->post, b->hS,
                    b->mtp_e, b->mtp_h, b->mtp_cat, b->mtp_rstd};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
    memset(b, 0, sizeof *b);
}

static prl_status check_options(const prl_model *m, prl_infer_options *o)
{
    int maxpos = m->cfg.max_position_embeddings;
    if (o->max_len == 0) o->max_len = maxpos;
    if (o->max_len < 2 || o->max_len > maxpos)
        return prl_error_set(PRL_ERR_ARG, "context %d not in [2, max_position_embeddings = %d]",
                             o->max_len, maxpos);
    if (o->max_batch < 1 || o->max_batch > 4096)
        return prl_error_set(PRL_ERR_ARG, "batch %d not in [1, 4096]", o->max_batch);
    if (o->spec_drafts < 0 || o->spec_drafts > m->cfg.num_nextn_predict_layers)
        return prl_error_set(PRL_ERR_ARG, "speculative drafts %d not in [0, "
                             "num_nextn_predict_layers = %d] (one MTP module per draft)",
                             o->spec_drafts, m->cfg.num_nextn_predict_layers);
    if (o->spec_draft_vocab < 0 || o->spec_draft_vocab > m->cfg.vocab_size)
        return prl_error_set(PRL_ERR_ARG, "draft vocabulary %d not in [0, vocab_size = %d] "
                             "(0 = the whole vocabulary)", o->spec_draft_vocab, m->cfg.vocab_size);
    if ((unsigned)o->precision > PRL_PRECISION_FP16 || (unsigned)o->mla > PRL_MLA_NAIVE ||
        (unsigned)o->matmul > PRL_MATMUL_BLAS)
        return prl_error_set(PRL_ERR_ARG, "invalid infer options");
    return PRL_OK;
}

static prl_status fault_from_env(prl_infer *e);

/* Rows a per-sequence cache keeps beyond what its window needs: a verify pass feeds D + 1
** rows, and after a rollback the accepted prefix must still find every row its window
** reads (docs/infer.md "Rollback"). 0 without speculative decoding. */
static int spec_spare_rows(const prl_infer_options *o) { return o->spec_drafts; }

prl_status prl_infer_init(prl_infer **out, const prl_model *m, const prl_infer_options *opt)
{
    *out = NULL;
    prl_infer_options o = *opt;
    prl_status rc = check_options(m, &o);
    if (rc) return rc;
    prl_infer *e = calloc(1, sizeof *e);
    if (!e) return prl_error_set(PRL_ERR_NOMEM, "infer engine");
    choose_gemv();
    const prl_config *c = &m->cfg;
    e->m = m;
    e->opt = o;
    e->V = c->vocab_size, e->d = c->hidden_size, e->L = c->num_hidden_layers;
    e->H = c->num_attention_heads, e->rq = c->q_lora_rank, e->rkv = c->kv_lora_rank;
    e->dn = c->qk_nope_head_dim, e->dr = c->qk_rope_head_dim, e->dv = c->v_head_dim;
    e->dq = e->dn + e->dr, e->dkv = e->dn + e->dv, e->I = c->intermediate_size;
    e->E = c->n_routed_experts, e->K = c->num_experts_per_tok, e->de = c->moe_intermediate_size;
    e->sde = c->n_shared_experts * c->moe_intermediate_size, e->n_moe = m->n_moe;
    e->lat = e->rkv + e->dr, e->ns = c->param_sink_number, e->ck = prl_config_conv_kernel(c);
    e->HI = c->index_n_heads, e->dI = c->index_head_dim;
    e->n_streams = prl_config_streams(c);
    e->Lm = o.spec_drafts > 0 ? c->num_nextn_predict_layers : 0;
    e->conv_hist = e->ck ? e->ck - 1 + spec_spare_rows(&o) : 0;
    int failed = 0, LL = e->L + e->Lm;
    if (c->use_mhc) {
        e->ones_buf = xcalloc((size_t)e->n_streams * e->d, sizeof(float), &failed);
        for (int i = 0; e->ones_buf && i < e->n_streams * e->d; i++) e->ones_buf[i] = 1;
        e->ones = e->ones_buf;
    }
    if (o.precision != PRL_PRECISION_FP32) e->wcopy = xcalloc(m->n_params, sizeof(float), &failed);
    e->lw = xcalloc((size_t)LL, sizeof *e->lw, &failed);
    for (int l = 0; l < LL && e->lw; l++) {
        e->lw[l].e13 = xcalloc((size_t)e->E, sizeof(lin), &failed);
        e->lw[l].e2 = xcalloc((size_t)e->E, sizeof(lin), &failed);
        e->lw[l].wuk_t = xcalloc((size_t)e->H * e->rkv * e->dn, sizeof(float), &failed);
        e->lw[l].sink_lat = xcalloc((size_t)e->ns * e->lat, sizeof(float), &failed);
        e->lw[l].sink_kv = xcalloc((size_t)e->ns * e->H * e->dkv, sizeof(float), &failed);
        for (int i = 0; i < 3 && e->ck && l < e->L; i++) /* no convs in MTP layers */
            e->lw[l].conv_state[i] =
                xcalloc((size_t)o.max_batch * e->conv_hist * conv_channels(e, i) + 1,
                        sizeof(float), &failed);
    }
    /* cache rows per slot: the whole context, or a ring of W rows for a sliding-window layer */
    size_t lat_total = 0, kv_total = 0, idx_total = 0;
    for (int l = 0; l < LL && e->lw; l++) {
        layer_w *w = &e->lw[l];
        int ring = w->window = prl_config_window(c, l);
        ring += w->window > 0 ? spec_spare_rows(&o) : 0; /* rows a rollback may still need */
        w->cap = w->window > 0 && ring < o.max_len ? ring : o.max_len;
        /* DSA (trunk layers only, never a ring): the indexer keys of the whole context,
        ** position-indexed like cache_lat. Positions stay below max_len, a verify pass's
        ** draft rows included (spec_budget), so max_len rows hold the spare rows too and a
        ** rollback (slot length reset) leaves the keys of the accepted prefix in place. */
        w->dsa = l < e->L && prl_config_is_dsa(c, l);
        w->dsa_sparse = w->dsa && c->dsa_stage == PRL_DSA_SPARSE;
        w->idx_off = idx_total;
        w->slot_idx_floats = w->dsa ? (size_t)o.max_len * e->dI : 0;
        idx_total += (size_t)o.max_batch * w->slot_idx_floats;
        w->lat_off = lat_total, w->kv_off = kv_total;
        lat_total += (size_t)o.max_batch * w->cap * e->lat;
        kv_total += (size_t)o.max_batch * w->cap * e->H * e->dkv;
        /* what this layer adds to the buffers allocated below, per slot (prl_infer_kv_alloc) */
        w->slot_kv_floats = (size_t)w->cap * e->lat +
                            (o.mla == PRL_MLA_NAIVE ? (size_t)w->cap * e->H * e->dkv : 0);
    }
    e->rope_cos = xcalloc((size_t)o.max_len * e->dr / 2, sizeof(float), &failed);
    e->rope_sin = xcalloc((size_t)o.max_len * e->dr / 2, sizeof(float), &failed);
    e->cache_lat = xcalloc(lat_total, sizeof(float), &failed);
    if (o.mla == PRL_MLA_NAIVE) e->cache_kv = xcalloc(kv_total, sizeof(float), &failed);
    if (idx_total) e->cache_idx = xcalloc(idx_total, sizeof(float), &failed);
    e->att_threads = prl_pool_threads() > 0 ? prl_pool_threads() : 1;
    /* naive: scores of a query block, then the gathered keys of a ring layer; absorbed:
    ** scores, absorbed queries, latent outputs, sink scores and outputs, the softmax
    ** statistics of the two parts, then the gathered latent rows of a ring layer */
    size_t naive_scratch = (size_t)PRL_ATT_BLOCK * (e->ns + o.max_len) +
                           (size_t)o.max_len * (e->dkv + e->dr);
    size_t absorbed_scratch = (size_t)e->H * ((size_t)o.max_len + e->lat + 2 * e->rkv + e->ns + 2) +
                              (size_t)o.max_len * e->lat;
    e->att_scratch_per_thread = naive_scratch > absorbed_scratch ? naive_scratch : absorbed_scratch;
    e->att_scratch = xcalloc(e->att_scratch_per_thread * e->att_threads, sizeof(float), &failed);
    int verify_rows = o.max_batch * (1 + o.spec_drafts);
    rows_buf_alloc(e, o.max_len > verify_rows ? o.max_len : verify_rows, &failed);
    e->slots = xcalloc((size_t)o.max_batch, sizeof *e->slots, &failed);
    for (int s = 0; s < o.max_batch && e->slots; s++) {
        slot_state *st = &e->slots[s];
        st->req = -1;
        st->routes = xcalloc((size_t)o.max_len * (e->n_moe ? e->n_moe : 1) * e->K,
                             sizeof(int32_t), &failed);
        if (e->Lm == 0) continue;
        st->toks = xcalloc((size_t)o.max_len + o.spec_drafts + 1, sizeof(int32_t), &failed);
        st->hid = xcalloc((size_t)(1 + e->Lm) * o.max_len * e->d, sizeof(float), &failed);
        st->mtp_len = xcalloc((size_t)e->Lm, sizeof(int), &failed);
        st->draft = xcalloc((size_t)o.spec_drafts, sizeof(int32_t), &failed);
        st->q = xcalloc((size_t)o.spec_drafts * e->V, sizeof(double), &failed);
    }
    if (e->Lm) e->spec_p = xcalloc((size_t)(o.spec_drafts + 1) * e->V, sizeof(double), &failed);
    if (failed) {
        prl_infer_free(e);
        return prl_error_set(PRL_ERR_NOMEM, "infer engine for batch %d x context %d", o.max_batch,
                             o.max_len);
    }
    prl_rope_tables(e->rope_cos, e->rope_sin, o.max_len, e->dr, c->rope_theta);
    if ((rc = bind_weights(e)) || (rc = fault_from_env(e))) {
        prl_infer_free(e);
        return rc;
    }
    *out = e;
    return PRL_OK;
}

void prl_infer_free(prl_infer *e)
{
    if (!e) return;
    for (int l = 0; e->lw && l < e->L + e->Lm; l++) {
        layer_w *w = &e->lw[l];
        lin_free(&w->eh_proj), lin_free(&w->own_head), lin_free(&w->draft_head);
        lin_free(&w->wq_a), lin_free(&w->wq_b), lin_free(&w->wkv_a), lin_free(&w->wkv_b);
        lin_free(&w->wo), lin_free(&w->w13), lin_free(&w->w2), lin_free(&w->router);
        lin_free(&w->ix_wq_b), lin_free(&w->ix_wk), lin_free(&w->ix_wproj);
        for (int x = 0; x < e->E && w->e13; x++) lin_free(&w->e13[x]), lin_free(&w->e2[x]);
        free(w->e13), free(w->e2), free(w->wuk_t), free(w->sink_lat), free(w->sink_kv);
        for (int i = 0; i < 3; i++) free(w->conv_state[i]);
        lin_free(&w->hc_phi[0]), lin_free(&w->hc_phi[1]);
    }
    lin_free(&e->head), lin_free(&e->merge_phi);
    free(e->ones_buf);
    for (int s = 0; e->slots && s < e->opt.max_batch; s++) {
        slot_state *st = &e->slots[s];
        free(st->routes), free(st->toks), free(st->hid), free(st->mtp_len), free(st->draft);
        free(st->q);
    }
    free(e->spec_p);
    free(e->slots), free(e->lw), free(e->wcopy), free(e->rope_cos), free(e->rope_sin);
    free(e->cache_lat), free(e->cache_kv), free(e->cache_idx), free(e->att_scratch);
    rows_buf_free(&e->rb);
    free(e);
}

static size_t kv_bytes_per_layer_token(const prl_infer *e)
{
    return ((size_t)e->lat + (e->opt.mla == PRL_MLA_NAIVE ? (size_t)e->H * e->dkv : 0)) * sizeof(float);
}

/* A DSA layer also caches its indexer key: d_I floats per token. */
static size_t idx_bytes_per_token(const prl_infer *e, int l)
{
    return e->lw[l].dsa ? (size_t)e->dI * sizeof(float) : 0;
}

size_t prl_infer_kv_bytes_per_token(const prl_infer *e)
{
    size_t bytes = 0;
    for (int l = 0; l < e->L; l++)
        if (e->lw[l].window == 0) bytes += kv_bytes_per_layer_token(e) + idx_bytes_per_token(e, l);
    return bytes;
}

size_t prl_infer_kv_bytes(const prl_infer *e, int n_tokens)
{
    size_t bytes = 0;
    for (int l = 0; l < e->L; l++) {
        int W = e->lw[l].window;
        bytes += (size_t)(W > 0 && W < n_tokens ? W : n_tokens) *
                 (kv_bytes_per_layer_token(e) + idx_bytes_per_token(e, l));
    }
    return bytes;
}

prl_kv_alloc prl_infer_kv_alloc(const prl_infer *e)
{
    prl_kv_alloc a = {0};
    for (int l = 0; l < e->L + e->Lm; l++) {
        const layer_w *w = &e->lw[l];
        size_t kv = w->slot_kv_floats * sizeof(float), ix = w->slot_idx_floats * sizeof(float);
        if (w->window > 0) a.ring += kv, a.n_ring++;
        else a.full += kv, a.n_full++;
        a.index += ix, a.n_dsa += w->dsa;
    }
    return a;
}

const prl_infer_options *prl_infer_get_options(const prl_infer *e) { return &e->opt; }

prl_spec_stats prl_infer_spec_stats(const prl_infer *e) { return e->spec; }

void prl_infer_set_hook(prl_infer *e, prl_tensor_hook hook, void *user)
{
    e->hook = hook;
    e->hook_user = user;
}

void prl_infer_hook_rows(const prl_infer *e, const int32_t **request, const int32_t **pos)
{
    if (request) *request = e->rb.req;
    if (pos) *pos = e->rb.pos;
}

prl_status prl_infer_set_fault(prl_infer *e, const char *name, double rel)
{
    e->fault_name[0] = 0;
    if (!name) return PRL_OK;
    static const char *const ops[] = {"attn.q", "attn.kv_latent", "attn.out", "mlp.out",
                                      "moe.router_logits", "moe.out"};
    int layer = -1, at = 0, ok = !strcmp(name, "final.logits");
    if (!ok && sscanf(name, "L%d.%n", &layer, &at) == 1 && at > 0 && layer >= 0 && layer < e->L)
        for (int i = 0; i < 6 && !ok; i++)
            ok = !strcmp(name + at, ops[i]) &&
                 (i < 3 || (i == 3) == (e->lw[layer].moe < 0)); /* mlp.out: dense layers only */
    if (!ok || strlen(name) >= sizeof e->fault_name)
        return prl_error_set(PRL_ERR_ARG, "fault op '%s' is not an op of this model (L<layer>."
                             "attn.q|attn.kv_latent|attn.out|mlp.out|moe.router_logits|moe.out "
                             "with layer < %d, or final.logits)", name, e->L);
    if (!isfinite(rel) || rel == 0)
        return prl_error_set(PRL_ERR_ARG, "fault size %g must be finite and non-zero", rel);
    snprintf(e->fault_name, sizeof e->fault_name, "%s", name);
    e->fault_rel = rel;
    return PRL_OK;
}

const char *prl_infer_fault(const prl_infer *e) { return e->fault_name[0] ? e->fault_name : NULL; }

/* PRL_INFER_FAULT="NAME:REL" (test-only; see infer.h). */
static prl_status fault_from_env(prl_infer *e)
{
    const char *v = getenv("PRL_INFER_FAULT");
    if (!v || !*v) return PRL_OK;
    const char *colon = strrchr(v, ':');
    char name[64], *end = NULL;
    double rel = colon ? strtod(colon + 1, &end) : 0;
    if (!colon || colon == v || (size_t)(colon - v) >= sizeof name || !end || end == colon + 1 || *end)
        return prl_error_set(PRL_ERR_ARG, "PRL_INFER_FAULT='%s': expected NAME:REL, e.g. "
                             "L2.attn.out:0.01", v);
    snprintf(name, sizeof name, "%.*s", (int)(colon - v), v);
    prl_status rc = prl_infer_set_fault(e, name, rel);
    return rc ? prl_error_wrap(rc, "PRL_INFER_FAULT: ") : PRL_OK;
}

static void emit(const prl_infer *e, int layer, const char *what, const float *data, int rows,
                 int cols)
{
    if (!e->hook) return;
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "L%d.%s", layer, what);
    else snprintf(name, sizeof name, "%s", what);
    int64_t shape[2] = {rows, cols};
    e->hook(e->hook_user, name, data, 2, shape);
}

/* The test-only fault: where op `what` of `layer` is produced, scale it by (1 + rel) before
** anything reads it, so the error flows downstream as a real kernel bug would. */
static void fault(const prl_infer *e, int layer, const char *what, float *x, size_t n)
{
    if (!e->fault_name[0]) return;
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "L%d.%s", layer, what);
    else snprintf(name, sizeof name, "%s", what);
    if (strcmp(name, e->fault_name) != 0) return;
    float s = (float)(1.0 + e->fault_rel);
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* ------------------------------------------------------------------ attention ------- */

/* Cache rows of position `pos` of the sequence in `slot`: row pos of the whole-context
** cache, or row pos mod W of a sliding-window layer's ring. */
static float *lat_row(const prl_infer *e, int l, int slot, int pos)
{
    const layer_w *w = &e->lw[l];
    return e->cache_lat + w->lat_off + ((size_t)slot * w->cap + pos % w->cap) * e->lat;
}

static float *kv_row(const prl_infer *e, int l, int slot, int pos)
{
    const layer_w *w = &e->lw[l];
    return e->cache_kv + w->kv_off + ((size_t)slot * w->cap + pos % w->cap) * e->H * e->dkv;
}

/* A ring layer keeps only W cache rows, so during a call its keys come from two places: the
** rows of this call (rows_buf, written to the ring only after every row has attended) and
** the ring (older positions). NULL: a position the ring no longer holds; no row of the call
** can see it. */
static int is_ring(const prl_infer *e, int l) { return e->lw[l].cap < e->opt.max_len; }

static const float *key_row(const prl_infer *e, int l, int slot, int q, int naive)
{
    const rows_buf *b = &e->rb;
    int f = b->first_pos[slot];
    if (q >= f) {
        size_t r = (size_t)(b->first_row[slot] + q - f);
        return naive ? b->kvx + r * e->H * e->dkv : b->lat + r * e->lat;
    }
    if (q < f - e->lw[l].cap) return NULL;
    return naive ? kv_row(e, l, slot, q) : lat_row(e, l, slot, q);
}

typedef struct att_ctx {
    prl_infer *e;
    int l, R;
    int *run_start, *run_rows; /* naive: row chunks of one sequence at consecutive positions */
    int n_runs;
} att_ctx;

/* Naive form: the train path's prl_attention_rows on the cached per-head keys and values
** (gathered in position order for a ring layer) and the layer's sinks. */
static void naive_task(void *p, int t)
{
    att_ctx *c = p;
    prl_infer *e = c->e;
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[c->l];
    int run = t / e->H, h = t % e->H, r0 = c->run_start[run], rows = c->run_rows[run];
    int slot = b->slot[r0], p0 = b->pos[r0], p1 = p0 + rows, ldS = e->ns + e->opt.max_len;
    float *S = e->att_scratch + e->att_scratch_per_thread * (size_t)prl_pool_worker();
    prl_attn_keys kk = {.window = w->window, .ns = e->ns};
    if (w->dsa_sparse) kk.sel = b->dsel + (size_t)r0 * e->opt.max_len, kk.ldsel = e->opt.max_len;
    if (e->ns > 0) {
        kk.sk = w->sink_kv + (size_t)h * e->dkv, kk.ldsk = e->H * e->dkv;
        kk.skr = w->sink_lat + e->rkv, kk.ldskr = e->lat;
    }
    if (!is_ring(e, c->l)) {
        kk.k = kv_row(e, c->l, slot, 0) + (size_t)h * e->dkv, kk.ldk = e->H * e->dkv;
        kk.kr = lat_row(e, c->l, slot, 0) + e->rkv, kk.ldkr = e->lat;
    } else { /* keys [k0, p1) in position order: [k_nope | v | k_r] per row */
        int wk = e->dkv + e->dr;
        float *g = S + (size_t)PRL_ATT_BLOCK * ldS;
        kk.k0 = prl_attention_key_start(p0, w->window);
        for (int q = kk.k0; q < p1; q++) {
            const float *kv = key_row(e, c->l, slot, q, 1), *lat = key_row(e, c->l, slot, q, 0);
            float *dst = g + (size_t)(q - kk.k0) * wk;
            if (!kv) {
                memset(dst, 0, (size_t)wk * sizeof *dst);
                continue;
            }
            memcpy(dst, kv + (size_t)h * e->dkv, (size_t)e->dkv * sizeof *dst);
            memcpy(dst + e->dkv, lat + e->rkv, (size_t)e->dr * sizeof *dst);
        }
        kk.k = g, kk.ldk = wk, kk.kr = g + e->dkv, kk.ldkr = wk;
    }
    prl_attention_rows(b->o + (size_t)r0 * e->H * e->dv + (size_t)h * e->dv, e->H * e->dv, S,
                       S + e->ns, ldS, b->q + (size_t)r0 * e->H * e->dq + (size_t)h * e->dq,
                       e->H * e->dq, &kk, p0, p1, e->dn, e->dr, e->dv);
}

/* y[i] += a·x[i] (8 lanes at a time; each element's operations are the same either way). */
static void axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    v8f va = {a, a, a, a, a, a, a, a};
    for (; i + 8 <= n; i += 8) {
        v8f u, v;
        memcpy(&u, x + i, sizeof u);
        memcpy(&v, y + i, sizeof v);
        v = v + va * u;
        memcpy(y + i, &v, sizeof v);
    }
    for (; i < n; i++) y[i] = y[i] + a * x[i];
}

/* The sinks' part of an absorbed row, merged exactly into the tokens' part (docs/model.md,
** "two-part softmax"): per head, the sink scores' max m_A, sum l_A and normalised latent
** output o_A, then o = (l_A e^{m_A−m} o_A + l_B e^{m_B−m} o_B) / (l_A e^{m_A−m} + l_B e^{m_B−m})
** with m = max(m_A, m_B), where the tokens' part (m_B, l_B, o_B) is already in `ov`. */
static void merge_sinks(const prl_infer *e, const layer_w *w, const float *qa, float *ov,
                        const float *mB, const float *lB, float *Ss, float *oA, float scale)
{
    int H = e->H, ns = e->ns, lat = e->lat, rkv = e->rkv;
    for (int h = 0; h < H; h++) {
        float *S = Ss + (size_t)h * ns, *o = oA + (size_t)h * rkv, mA, lA = 0;
        dots(S, qa + (size_t)h * lat, w->sink_lat, lat, ns, lat);
        mA = scale * S[0];
        for (int i = 0; i < ns; i++) S[i] = scale * S[i], mA = S[i] > mA ? S[i] : mA;
        memset(o, 0, (size_t)rkv * sizeof *o);
        for (int i = 0; i < ns; i++) {
            lA += (S[i] = prl_expf(S[i] - mA));
            axpy(o, S[i], w->sink_lat + (size_t)i * lat, rkv);
        }
        float m = mA > mB[h] ? mA : mB[h];
        float a = lA * prl_expf(mA - m), bb = lB[h] * prl_expf(mB[h] - m), inv = 1 / (a + bb);
        float *out = ov + (size_t)h * rkv;
        for (int i = 0; i < rkv; i++) out[i] = (a * (o[i] / lA) + bb * out[i]) * inv;
    }
}

/* Absorbed form for one row, all heads together: each query absorbs W_UK, the scores and the
** weighted sums run on the shared latent rows [c_kv; k_r] (every cache row is read once for
** all heads; a ring layer's window is first gathered in position order), the sinks are
** merged in, and W_UV maps each head's result back to d_v. */
static void absorbed_task(void *p, int r)
{
    att_ctx *c = p;
    prl_infer *e = c->e;
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[c->l];
    int H = e->H, L = e->opt.max_len, lat = e->lat, rkv = e->rkv, pos = b->pos[r];
    int lo = w->window > 0 && pos - w->window + 1 > 0 ? pos - w->window + 1 : 0, n = pos + 1 - lo;
    float *S = e->att_scratch + e->att_scratch_per_thread * (size_t)prl_pool_worker();
    float *qa = S + (size_t)H * L, *ov = qa + (size_t)H * lat, *Ss = ov + (size_t)H * rkv;
    float *oA = Ss + (size_t)H * e->ns, *mB = oA + (size_t)H * rkv, *lB = mB + H, *g = lB + H;
    const float *q = b->q + (size_t)r * H * e->dq;
    for (int h = 0; h < H; h++) {
        dots(qa + (size_t)h * lat, q + (size_t)h * e->dq, w->wuk_t + (size_t)h * rkv * e->dn, e->dn,
             rkv, e->dn);
        memcpy(qa + (size_t)h * lat + rkv, q + (size_t)h * e->dq + e->dn, (size_t)e->dr * sizeof *qa);
    }
    act_round(e, qa, (size_t)H * lat);
    const float *cache = lat_row(e, c->l, b->slot[r], lo);
    if (is_ring(e, c->l)) {
        for (int s = 0; s < n; s++)
            memcpy(g + (size_t)s * lat, key_row(e, c->l, b->slot[r], lo + s, 0), (size_t)lat * sizeof *g);
        cache = g;
    }
    /* S[h][s] = qa_h · cache_s in 2-head × 4-key tiles */
    for (int s0 = 0; s0 < n; s0 += 4)
        for (int h0 = 0; h0 < H; h0 += 2)
            gemv_tile(qa + (size_t)h0 * lat, lat, H - h0 < 2 ? H - h0 : 2, cache + (size_t)s0 * lat,
                      lat, n - s0 < 4 ? n - s0 : 4, lat, S + (size_t)h0 * L + s0, L);
    float scale = (float)(1.0 / sqrt((double)e->dq));
    /* a DSA layer's row sees only its selected tokens (lo = 0: DSA layers never slide) */
    const uint8_t *sel = w->dsa_sparse ? b->dsel + (size_t)r * L : NULL;
    for (int h = 0; h < H; h++) { /* softmax, normalised in place */
        float *Sh = S + (size_t)h * L, mx = -INFINITY, sum = 0;
        for (int s = 0; s < n; s++)
            if (!sel || sel[s]) Sh[s] = scale * Sh[s], mx = Sh[s] > mx ? Sh[s] : mx;
        for (int s = 0; s < n; s++) sum += (Sh[s] = !sel || sel[s] ? prl_expf(Sh[s] - mx) : 0);
        float inv = 1 / sum;
        for (int s = 0; s < n; s++) Sh[s] *= inv;
        mB[h] = mx, lB[h] = sum;
    }
    memset(ov, 0, (size_t)H * rkv * sizeof *ov);
    for (int s = 0; s < n; s++)
        for (int h = 0; h < H; h++)
            axpy(ov + (size_t)h * rkv, S[(size_t)h * L + s], cache + (size_t)s * lat, rkv);
    if (e->ns > 0) merge_sinks(e, w, qa, ov, mB, lB, Ss, oA, scale);
    act_round(e, ov, (size_t)H * rkv);
    for (int h = 0; h < H; h++)
        dots(b->o + (size_t)r * H * e->dv + (size_t)h * e->dv, ov + (size_t)h * rkv,
             w->wkv_b.w + ((size_t)h * e->dkv + e->dn) * rkv, rkv, e->dv, rkv);
}

/* Rows of one sequence at consecutive positions form a run, cut into query blocks. */
static int build_runs(const rows_buf *b, int R, int *start, int *rows)
{
    int n = 0;
    for (int r = 0; r < R;) {
        int r1 = r + 1;
        while (r1 < R && r1 - r < PRL_ATT_BLOCK && b->slot[r1] == b->slot[r] &&
               b->pos[r1] == b->pos[r1 - 1] + 1)
            r1++;
        start[n] = r, rows[n] = r1 - r, n++;
        r = r1;
    }
    return n;
}

/* ModAttn conv `which` of layer l over this call's R rows: y = z + conv(z) (input row r at
** z + r·ldz), by the train path's prl_conv_row. Inputs before a slot's first row in the call
** come from its state, none before position 0. The state is a history of conv_hist inputs
** per slot indexed by position (row q mod conv_hist): k − 1 rows, plus the speculative
** spare rows, so a rollback to an earlier length finds its k − 1 inputs (docs/infer.md). */
static void conv_rows(prl_infer *e, int l, int which, float *y, const float *z, int ldz, int R)
{
    rows_buf *b = &e->rb;
    int k = e->ck, C = conv_channels(e, which), hist = e->conv_hist;
    float *state = e->lw[l].conv_state[which];
    const float *x[16];
    /* the input at position q of the slot's sequence, NULL before position 0 */
#define CONV_IN(s, q)                                                                         \
    ((q) < 0 ? NULL                                                                           \
     : (q) >= b->first_pos[s]                                                                 \
         ? z + (size_t)(b->first_row[s] + (q) - b->first_pos[s]) * ldz                         \
         : state + ((size_t)(s) * hist + (size_t)(q) % hist) * C)
    for (int r = 0; r < R; r++) {
        int s = b->slot[r];
        for (int j = 0; j < k; j++) x[j] = CONV_IN(s, b->pos[r] - (k - 1) + j);
        prl_conv_row(y + (size_t)r * C, x, e->lw[l].conv_w[which], C, k);
    }
    act_round(e, y, (size_t)R * C);
    for (int r = 0; r < R; r++) /* the call's inputs join the history after every read, in
                                   ** position order: a slot keeps its last hist inputs */
        memcpy(state + ((size_t)b->slot[r] * hist + (size_t)b->pos[r] % hist) * C,
               z + (size_t)r * ldz, (size_t)C * sizeof(float));
#undef CONV_IN
}

/* This call's keys of layer l into the cache (a ring keeps the last W positions). */
static void write_cache(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    for (int r = 0; r < R; r++) {
        memcpy(lat_row(e, l, b->slot[r], b->pos[r]), b->lat + (size_t)r * e->lat,
               (size_t)e->lat * sizeof(float));
        if (e->opt.mla == PRL_MLA_NAIVE)
            memcpy(kv_row(e, l, b->slot[r], b->pos[r]), b->kvx + (size_t)r * e->H * e->dkv,
                   (size_t)e->H * e->dkv * sizeof(float));
    }
}

/* The DSA indexer of layer l for this call's rows (ln and cq ready): each row's indexer key
** into the cache, then, in the sparse stage, each row's top-k over the cached keys of its
** sequence (positions 0..pos, this call's rows included) into rb.dsel — with the train
** path's ops (dsa.c), so the aligned preset selects the same tokens bit for bit. */
static void indexer_rows(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    int HI = e->HI, dI = e->dI, L = e->opt.max_len;
    linear(e, b->iq, b->cq, R, &w->ix_wq_b);
    prl_rope_at(b->iq, e->rope_cos, e->rope_sin, b->pos, R, HI, dI, 0, HI * dI, e->dr);
    act_round(e, b->iq, (size_t)R * HI * dI);
    linear(e, b->ikz, b->ln, R, &w->ix_wk);
    prl_rmsnorm_forward(b->ik, b->rstd, b->ikz, w->ix_k_norm, R, dI, dI, dI, PRL_LATENT_NORM_EPS);
    prl_rope_at(b->ik, e->rope_cos, e->rope_sin, b->pos, R, 1, dI, 0, dI, e->dr);
    act_round(e, b->ik, (size_t)R * dI);
    linear(e, b->iw, b->ln, R, &w->ix_wproj);
    float hs = (float)(1.0 / sqrt((double)HI));
    for (size_t i = 0; i < (size_t)R * HI; i++) b->iw[i] *= hs;
    act_round(e, b->iw, (size_t)R * HI);
    for (int r = 0; r < R; r++)
        memcpy(e->cache_idx + w->idx_off + ((size_t)b->slot[r] * L + b->pos[r]) * dI,
               b->ik + (size_t)r * dI, (size_t)dI * sizeof(float));
    if (!w->dsa_sparse) return;
    for (int r = 0; r < R; r++) {
        int n = b->pos[r] + 1;
        prl_dsa_score_row(b->iscore, b->iq + (size_t)r * HI * dI, b->iw + (size_t)r * HI,
                          e->cache_idx + w->idx_off + (size_t)b->slot[r] * L * dI, dI, n, HI, dI);
        act_round(e, b->iscore, (size_t)n); /* the scores are a stored op output: the top-k reads them */
        prl_dsa_select_row(b->dsel + (size_t)r * L, b->iscore, n, e->m->cfg.index_topk);
    }
}

/* ln (R, d) → tmp (R, d): MLA with the cache. A whole-context layer writes the new keys into
** the cache first, so a prefill row sees the earlier rows of its own call there; a ring layer
** reads them from the call's rows and writes them after attending. */
static void attention(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    int H = e->H;
    linear(e, b->zq, b->ln, R, &w->wq_a);
    const float *zq = b->zq, *ckv_in = b->kva, *o_out = b->o;
    int ckv_stride = e->lat, ck = e->ck && l < e->L; /* MTP layers have no convs */
    if (ck) { /* ModAttn: before the query and latent norms, after the heads */
        conv_rows(e, l, CONV_Q, b->zqc, b->zq, e->rq, R);
        zq = b->zqc;
    }
    prl_rmsnorm_forward(b->cq, b->rstd, zq, w->q_norm, R, e->rq, e->rq, e->rq, PRL_LATENT_NORM_EPS);
    act_round(e, b->cq, (size_t)R * e->rq);
    linear(e, b->q, b->cq, R, &w->wq_b);
    prl_rope_at(b->q, e->rope_cos, e->rope_sin, b->pos, R, H, e->dq, e->dn, H * e->dq, e->dr);
    act_round(e, b->q, (size_t)R * H * e->dq);
    fault(e, l, "attn.q", b->q, (size_t)R * H * e->dq);
    linear(e, b->kva, b->ln, R, &w->wkv_a);
    if (ck) {
        conv_rows(e, l, CONV_KV, b->kvc, b->kva, e->lat, R);
        ckv_in = b->kvc, ckv_stride = e->rkv;
    }
    prl_rmsnorm_forward(b->ckv, b->rstd, ckv_in, w->kv_norm, R, e->rkv, ckv_stride, e->rkv,
                        PRL_LATENT_NORM_EPS);
    act_round(e, b->ckv, (size_t)R * e->rkv);
    fault(e, l, "attn.kv_latent", b->ckv, (size_t)R * e->rkv);
    for (int r = 0; r < R; r++)
        memcpy(b->kr + (size_t)r * e->dr, b->kva + (size_t)r * e->lat + e->rkv, (size_t)e->dr * sizeof(float));
    prl_rope_at(b->kr, e->rope_cos, e->rope_sin, b->pos, R, 1, e->dr, 0, e->dr, e->dr);
    act_round(e, b->kr, (size_t)R * e->dr);
    for (int r = 0; r < R; r++) {
        float *row = b->lat + (size_t)r * e->lat;
        memcpy(row, b->ckv + (size_t)r * e->rkv, (size_t)e->rkv * sizeof(float));
        memcpy(row + e->rkv, b->kr + (size_t)r * e->dr, (size_t)e->dr * sizeof(float));
    }
    if (e->opt.mla == PRL_MLA_NAIVE) linear(e, b->kvx, b->ckv, R, &w->wkv_b);
    if (w->dsa) indexer_rows(e, l, R);
    int ring = is_ring(e, l);
    if (!ring) write_cache(e, l, R);
    att_ctx c = {.e = e, .l = l, .R = R};
    int keys = w->window > 0 && w->window < b->pos[R - 1] + 1 ? w->window : b->pos[R - 1] + 1;
    if (e->opt.mla == PRL_MLA_NAIVE) {
        int *runs = malloc(2 * (size_t)R * sizeof *runs);
        PRL_ASSERT(runs != NULL);
        c.run_start = runs, c.run_rows = runs + R;
        c.n_runs = build_runs(b, R, c.run_start, c.run_rows);
        run_tasks(c.n_runs * H, naive_task, &c, (double)R * H * (keys + e->ns) * (e->dq + e->dv));
        free(runs);
    } else {
        run_tasks(R, absorbed_task, &c, (double)R * H * (keys + e->ns) * (2 * e->lat));
    }
    if (ring) write_cache(e, l, R);
    act_round(e, b->o, (size_t)R * H * e->dv);
    if (ck) {
        conv_rows(e, l, CONV_O, b->oc, b->o, H * e->dv, R);
        o_out = b->oc;
    }
    linear(e, b->tmp, o_out, R, &w->wo);
    fault(e, l, "attn.out", b->tmp, (size_t)R * e->d);
    emit(e, l, "attn.q", b->q, R, H * e->dq);
    emit(e, l, "attn.kv_latent", b->ckv, R, e->rkv);
    emit(e, l, "attn.out", b->tmp, R, e->d);
}

/* ------------------------------------------------------------------ FFN / MoE ------- */

/* out (R, d) = SwiGLU of in with stacked gate/up `w13` and down `w2`. */
static void swiglu(prl_infer *e, float *out, const float *in, int R, const lin *w13, const lin *w2)
{
    rows_buf *b = &e->rb;
    int F = w13->out / 2;
    linear(e, b->a13, in, R, w13);
    prl_silu_mul_forward(b->h, b->a13, R, F);
    act_round(e, b->h, (size_t)R * F);
    linear(e, out, b->h, R, w2);
}

/* ln (R, d) → tmp (R, d) = shared(ln) + Σ_k g_k·expert_k(ln), routes recorded per row. */
static void moe(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    int E = e->E, K = e->K, d = e->d;
    linear(e, b->z, b->ln, R, &w->router);
    fault(e, l, "moe.router_logits", b->z, (size_t)R * E);
    const prl_real *bias = e->m->router_bias + (size_t)w->moe * E;
    for (int r = 0; r < R; r++) {
        prl_moe_gate_forward(b->sel + (size_t)r * K, b->g + (size_t)r * K, b->s + (size_t)r * E,
                             b->z + (size_t)r * E, bias, NULL, E, K, e->m->cfg.norm_topk_prob,
                             e->m->cfg.routed_scaling_factor);
        if (w->moe >= e->n_moe) continue; /* an MTP layer: its routes are not recorded */
        int32_t *dst = e->slots[b->slot[r]].routes + ((size_t)b->pos[r] * e->n_moe + w->moe) * K;
        memcpy(dst, b->sel + (size_t)r * K, (size_t)K * sizeof *dst);
    }
    /* group (row, slot) pairs by expert, rows in order */
    int32_t *off = b->offsets;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int i = 0; i < R * K; i++) off[b->sel[i] + 1]++;
    for (int x = 0; x < E; x++) off[x + 1] += off[x];
    for (int x = 0, cursor; x < E; x++) {
        cursor = off[x];
        for (int i = 0; i < R * K; i++)
            if (b->sel[i] == x) b->gpos[i] = cursor, b->token_of[cursor++] = i / K;
    }
    for (int q = 0; q < R * K; q++)
        memcpy(b->xg + (size_t)q * d, b->ln + (size_t)b->token_of[q] * d, (size_t)d * sizeof(float));
    if (e->sde > 0) swiglu(e, b->tmp, b->ln, R, &w->w13, &w->w2);
    else memset(b->tmp, 0, (size_t)R * d * sizeof(float));
    for (int x = 0; x < E; x++) {
        int n = off[x + 1] - off[x];
        if (!n) continue;
        float *a13 = b->ea13 + (size_t)off[x] * 2 * e->de, *h = b->eh + (size_t)off[x] * e->de;
        linear(e, a13, b->xg + (size_t)off[x] * d, n, &w->e13[x]);
        prl_silu_mul_forward(h, a13, n, e->de);
        act_round(e, h, (size_t)n * e->de);
        linear(e, b->yg + (size_t)off[x] * d, h, n, &w->e2[x]);
    }
    for (int r = 0; r < R; r++) { /* slots in order, as the train path adds them */
        float *out = b->tmp + (size_t)r * d;
        for (int k = 0; k < K; k++) {
            float g = b->g[r * K + k];
            const float *y = b->yg + (size_t)b->gpos[r * K + k] * d;
            for (int i = 0; i < d; i++) out[i] += g * y[i];
        }
    }
    act_round(e, b->tmp, (size_t)R * d);
    fault(e, l, "moe.out", b->tmp, (size_t)R * d);
    emit(e, l, "moe.router_logits", b->z, R, E);
    emit(e, l, "moe.out", b->tmp, R, d);
}

/* ------------------------------------------------------------------ forward --------- */

static void residual_add(const prl_infer *e, float *x, const float *y, int R)
{
    size_t n = (size_t)R * e->d;
    for (size_t i = 0; i < n; i++) x[i] = x[i] + y[i];
    act_round(e, x, n);
}

/* ------------------------------------------------------------------ residual glue --- */

/* The train path's residual glue (model.c site_enter / site_leave) on R rows, with the same
** ops: mHC sites on the streams rb.xs, sandwich norms, block post-norms; rb.x is the sublayer
** input (with mHC) or the plain residual. */

static prl_mhc_shape rows_shape(const prl_infer *e, int R, int full)
{
    return (prl_mhc_shape){.N = R, .n = e->n_streams, .d = e->d, .it = e->m->cfg.mhc_recur_norm,
                           .full = full};
}

/* A site's coefficients from the streams (φ through the infer path's linear). */
static void hc_coefficients(prl_infer *e, int R, const lin *phi, const float *gamma,
                            const float *alpha, const float *beta, int full)
{
    rows_buf *b = &e->rb;
    prl_mhc_shape sh = rows_shape(e, R, full);
    int nd = e->n_streams * e->d;
    prl_rmsnorm_forward(b->hn, b->hrstd, b->xs, gamma, R, nd, nd, nd, e->m->cfg.rms_norm_eps);
    act_round(e, b->hn, (size_t)R * nd);
    linear(e, b->hm, b->hn, R, phi);
    prl_mhc_coef_forward(b->pre, b->post, b->hS, b->hm, alpha, beta, sh);
    prl_mhc_pre_forward(b->x, b->xs, b->pre, sh);
    act_round(e, b->x, (size_t)R * e->d);
}

static void hc_enter(prl_infer *e, int l, int site, int R)
{
    const layer_w *w = &e->lw[l];
    if (e->m->cfg.use_mhc && l < e->L) /* MTP layers keep the plain residual */
        hc_coefficients(e, R, &w->hc_phi[site], w->hc_gamma[site], w->hc_alpha[site],
                        w->hc_beta[site], 1);
}

/* tmp (the sublayer's output) back into the residual. */
static void hc_leave(prl_infer *e, int l, int site, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    const prl_config *c = &e->m->cfg;
    int d = e->d, S = e->n_streams * d;
    if (c->sandwich_norm) { /* in place: each row's sum is taken before it is overwritten */
        prl_rmsnorm_forward(b->tmp, b->rstd, b->tmp, site ? w->ln_pm : w->ln_pa, R, d, d, d,
                            c->rms_norm_eps);
        act_round(e, b->tmp, (size_t)R * d);
    }
    int mhc = c->use_mhc && l < e->L;
    float *stream = mhc ? b->xs : b->x;
    if (mhc) {
        prl_mhc_shape sh = rows_shape(e, R, 1);
        int ns = prl_mhc_states(sh), n2 = sh.n * sh.n;
        prl_mhc_post_forward(b->xs2, b->tmp, b->xs, b->post, b->hS + (size_t)(ns - 1) * n2, ns * n2, sh);
        float *t = b->xs;
        b->xs = b->xs2, b->xs2 = t;
        stream = b->xs;
        act_round(e, stream, (size_t)R * S);
    } else {
        residual_add(e, b->x, b->tmp, R);
    }
    if (site == 1 && w->ln_bp) {
        prl_rmsnorm_forward(stream, b->rstd, stream, w->ln_bp, R, S, S, S, c->rms_norm_eps);
        act_round(e, stream, (size_t)R * S);
    }
}

/* Rows rb.tok/slot/pos[0, R) through the model; leaves rb.logits [R, V]. */
/* Each slot's first row in the call and its position (a slot's rows are consecutive). */
static void rows_begin(prl_infer *e, int R)
{
    rows_buf *b = &e->rb;
    for (int r = R - 1; r >= 0; r--)
        b->first_row[b->slot[r]] = r, b->first_pos[b->slot[r]] = b->pos[r];
}

/* Decoder layer l on R rows: rb.x (or the streams rb.xs) in, out. */
static void layer_rows(prl_infer *e, int l, int R)
{
    rows_buf *b = &e->rb;
    const layer_w *w = &e->lw[l];
    int d = e->d;
    hc_enter(e, l, 0, R);
    prl_rmsnorm_forward(b->ln, b->rstd, b->x, w->ln1, R, d, d, d, e->m->cfg.rms_norm_eps);
    act_round(e, b->ln, (size_t)R * d);
    attention(e, l, R);
    hc_leave(e, l, 0, R);
    hc_enter(e, l, 1, R);
    prl_rmsnorm_forward(b->ln, b->rstd, b->x, w->ln2, R, d, d, d, e->m->cfg.rms_norm_eps);
    act_round(e, b->ln, (size_t)R * d);
    if (w->moe >= 0) {
        moe(e, l, R);
    } else {
        swiglu(e, b->tmp, b->ln, R, &w->w13, &w->w2);
        fault(e, l, "mlp.out", b->tmp, (size_t)R * d);
        emit(e, l, "mlp.out", b->tmp, R, d);
    }
    hc_leave(e, l, 1, R);
}

/* The trunk on R rows (tokens rb.tok at rb.pos of slots rb.slot): logits into rb.logits; rb.x
** keeps h⁰, the merged hidden state before the final norm (the MTP modules' input). */
static void forward_rows(prl_infer *e, int R)
{
    rows_buf *b = &e->rb;
    int d = e->d;
    rows_begin(e, R);
    for (int r = 0; r < R; r++)
        memcpy(b->x + (size_t)r * d, e->embed + (size_t)b->tok[r] * d, (size_t)d * sizeof(float));
    for (int r = 0; r < R && e->m->cfg.use_mhc; r++) /* every stream starts as the embedding */
        for (int i = 0; i < e->n_streams; i++)
            memcpy(b->xs + ((size_t)r * e->n_streams + i) * d, b->x + (size_t)r * d,
                   (size_t)d * sizeof(float));
    for (int l = 0; l < e->L; l++) layer_rows(e, l, R);
    if (e->m->cfg.use_mhc) /* the merge head */
        hc_coefficients(e, R, &e->merge_phi, e->merge_gamma, e->merge_alpha, e->merge_beta, 0);
    prl_rmsnorm_forward(b->ln, b->rstd, b->x, e->norm, R, d, d, d, e->m->cfg.rms_norm_eps);
    act_round(e, b->ln, (size_t)R * d);
    linear(e, b->logits, b->ln, R, &e->head);
    fault(e, -1, "final.logits", b->logits, (size_t)R * e->V);
    emit(e, -1, "final.logits", b->logits, R, e->V);
}

/* ------------------------------------------------------------------ sampling -------- */

void prl_sample_params_default(prl_sample_params *p)
{
    static const int32_t eos[] = {PRL_TOKEN_EOS};
    *p = (prl_sample_params){.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0,
                             .max_new_tokens = 256, .stop_ids = eos, .n_stop_ids = 1};
}

prl_status prl_sample_params_check(const prl_sample_params *p, int vocab_size)
{
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return prl_error_set(PRL_ERR_ARG, "temperature %g must be finite and >= 0 (0 = greedy)",
                             p->temperature);
    if (p->top_k < 0) return prl_error_set(PRL_ERR_ARG, "top-k %d must be >= 0 (0 = off)", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return prl_error_set(PRL_ERR_ARG, "top-p %g must be in (0, 1]", p->top_p);
    if (p->max_new_tokens < 1)
        return prl_error_set(PRL_ERR_ARG, "max new tokens %d must be >= 1", p->max_new_tokens);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= vocab_size)
            return prl_error_set(PRL_ERR_ARG, "stop token id %d out of range [0, %d)",
                                 p->stop_ids[i], vocab_size);
    if (p->vocab_limit < 0)
        return prl_error_set(PRL_ERR_ARG, "vocab limit %d must be >= 0 (0 = the whole vocabulary)",
                             p->vocab_limit);
    if (p->n_stop_strings > 0 && !p->tok)
        return prl_error_set(PRL_ERR_ARG, "stop strings need a tokenizer");
    for (int i = 0; i < p->n_stop_strings; i++)
        if (!p->stop_strings[i] || !p->stop_strings[i][0])
            return prl_error_set(PRL_ERR_ARG, "stop string %d is empty", i);
    return PRL_OK;
}

typedef struct cand {
    double w;
    int id;
} cand;

static int cand_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? 1 : -1;
    return x->id - y->id;
}

/* The sampler's candidates for τ > 0: cs[0..n) with weights exp(logits/τ − max) over the
** ids below vocab_limit, restricted by top-k/top-p (then sorted by weight). Returns n. */
static int sample_weights(cand *cs, const float *logits, int V, const prl_sample_params *sp)
{
    if (sp->vocab_limit > 0 && sp->vocab_limit < V) V = sp->vocab_limit; /* never draw past it */
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        double x = logits[i] / sp->temperature;
        mx = x > mx ? x : mx;
    }
    int n = V;
    for (int i = 0; i < V; i++) cs[i] = (cand){exp(logits[i] / sp->temperature - mx), i};
    int restrict_ = (sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1;
    if (restrict_) {
        qsort(cs, (size_t)V, sizeof *cs, cand_desc);
        if (sp->top_k > 0 && sp->top_k < n) n = sp->top_k;
        if (sp->top_p < 1) {
            double total = 0, acc = 0;
            for (int i = 0; i < n; i++) total += cs[i].w;
            for (int i = 0; i < n; i++) {
                acc += cs[i].w;
                if (acc >= sp->top_p * total) {
                    n = i + 1;
                    break;
                }
            }
        }
    }
    return n;
}

/* Draw a token from softmax(logits/τ) restricted by top-k/top-p; greedy when τ = 0. */
static int sample_row(const float *logits, int V, const prl_sample_params *sp, prl_rng *rng,
                      cand *cs)
{
    if (sp->temperature == 0) {
        if (sp->vocab_limit > 0 && sp->vocab_limit < V) V = sp->vocab_limit;
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    int n = sample_weights(cs, logits, V, sp);
    double total = 0;
    for (int i = 0; i < n; i++) total += cs[i].w;
    double u = prl_rng_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += cs[i].w;
        if (u < acc) return cs[i].id;
    }
    return cs[n - 1].id; /* u rounded up to the total */
}

/* log p(y) under softmax(logits/τ) over the whole vocabulary: the train path's function. */
static float logprob(const float *logits, int V, int y, double tau)
{
    prl_real lse;
    return (float)prl_logprob_forward(&lse, logits, V, y, tau);
}

const char *prl_stop_reason_name(prl_stop_reason r)
{
    static const char *const names[] = {"stop_token", "length", "stop_string", "context", "forced"};
    return (unsigned)r < 5 ? names[r] : "?";
}

void prl_gen_result_free(prl_gen_result *r)
{
    if (!r) return;
    free(r->tokens), free(r->logprobs), free(r->prompt_logprobs), free(r->routes);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------ routes ---------- */

int prl_routes_width(int n_experts) { return n_experts <= 256 ? 1 : 2; }

size_t prl_routes_pack(uint8_t *out, const int32_t *ids, size_t n_ids, int n_experts)
{
    int w = prl_routes_width(n_experts);
    for (size_t i = 0; i < n_ids; i++) {
        out[i * w] = (uint8_t)(ids[i] & 0xff);
        if (w == 2) out[i * w + 1] = (uint8_t)(ids[i] >> 8);
    }
    return n_ids * (size_t)w;
}

prl_status prl_routes_unpack(int32_t *ids, const uint8_t *in, size_t n_ids, int n_experts)
{
    int w = prl_routes_width(n_experts);
    for (size_t i = 0; i < n_ids; i++) {
        int32_t v = in[i * w] | (w == 2 ? in[i * w + 1] << 8 : 0);
        if (v >= n_experts)
            return prl_error_set(PRL_ERR_FORMAT, "route entry %zu: expert %d out of range [0, %d)",
                                 i, v, n_experts);
        ids[i] = v;
    }
    return PRL_OK;
}

/* ------------------------------------------------------------------ generation ------ */

typedef struct gen_state {
    prl_infer *e;
    const prl_gen_request *reqs;
    const prl_sample_params *sp;
    prl_gen_result *res;
    int cap_new;     /* per-request capacity of tokens/logprobs */
    cand *cands;
    int32_t *text_ids;
} gen_state;

static prl_status check_requests(const prl_infer *e, const prl_gen_request *reqs, int n)
{
    for (int i = 0; i < n; i++) {
        const prl_gen_request *q = &reqs[i];
        if (q->prompt_len < 1 || !q->prompt)
            return prl_error_set(PRL_ERR_ARG, "request %d: empty prompt", i);
        if (q->prompt_len >= e->opt.max_len)
            return prl_error_set(PRL_ERR_RANGE, "request %d: prompt of %d tokens leaves no room in "
                                 "the context of %d tokens", i, q->prompt_len, e->opt.max_len);
        if (q->forced && q->prompt_len + q->n_forced > e->opt.max_len)
            return prl_error_set(PRL_ERR_RANGE, "request %d: prompt %d + %d forced tokens exceed "
                                 "the context of %d tokens", i, q->prompt_len, q->n_forced,
                                 e->opt.max_len);
        for (int t = 0; t < q->prompt_len; t++)
            if (q->prompt[t] < 0 || q->prompt[t] >= e->V)
                return prl_error_set(PRL_ERR_RANGE, "request %d position %d: token id %d out of "
                                     "range [0, %d)", i, t, q->prompt[t], e->V);
        for (int t = 0; q->forced && t < q->n_forced; t++)
            if (q->forced[t] < 0 || q->forced[t] >= e->V)
                return prl_error_set(PRL_ERR_RANGE, "request %d forced token %d: id %d out of "
                                     "range [0, %d)", i, t, q->forced[t], e->V);
    }
    return PRL_OK;
}

static int has_stop_string(gen_state *g, const prl_gen_result *r)
{
    const prl_sample_params *sp = g->sp;
    if (sp->n_stop_strings == 0) return 0;
    char *text = NULL;
    size_t len = 0;
    if (prl_tokenizer_decode(sp->tok, r->tokens, (size_t)r->n, 0, &text, &len) != PRL_OK) return 0;
    int hit = 0;
    for (int i = 0; i < sp->n_stop_strings && !hit; i++)
        hit = memmem(text, len, sp->stop_strings[i], strlen(sp->stop_strings[i])) != NULL;
    free(text);
    return hit;
}

static int record_token(gen_state *g, int slot, int32_t y, const float *logits);

/* Take the next token of the request in `slot` from logits row `row`: sample (or the forced
** token), record it with its log-prob, decide whether the sequence stops. Returns 1 if it
** stopped. */
static int take_token(gen_state *g, int slot, int row)
{
    prl_infer *e = g->e;
    slot_state *st = &e->slots[slot];
    const prl_gen_request *q = &g->reqs[st->req];
    prl_gen_result *r = &g->res[st->req];
    const prl_sample_params *sp = g->sp;
    const float *logits = e->rb.logits + (size_t)row * e->V;
    int32_t y;
    if (q->forced) {
        y = q->forced[r->n];
    } else {
        prl_rng rng;
        prl_rng_init(&rng, sp->seed, q->seq_id, (uint64_t)st->len, 0, PRL_RNG_SAMPLE);
        y = sample_row(logits, e->V, sp, &rng, g->cands);
    }
    return record_token(g, slot, y, logits);
}

/* Record token y (at position st->len, drawn from `logits`) with its log-prob and decide
** whether the sequence stops. Returns 1 if it stopped. */
static int record_token(gen_state *g, int slot, int32_t y, const float *logits)
{
    prl_infer *e = g->e;
    slot_state *st = &e->slots[slot];
    const prl_gen_request *q = &g->reqs[st->req];
    prl_gen_result *r = &g->res[st->req];
    const prl_sample_params *sp = g->sp;
    double tau = sp->temperature > 0 ? sp->temperature : 1.0;
    if (st->toks) st->toks[st->len] = y; /* speculative decoding: the sequence so far */
    r->tokens[r->n] = y;
    r->logprobs[r->n] = logprob(logits, e->V, y, tau);
    r->n++;
    st->last = y;
    int stop = -1;
    if (q->forced) {
        if (r->n == q->n_forced) stop = PRL_STOP_FORCED;
    } else {
        for (int i = 0; i < sp->n_stop_ids && stop < 0; i++)
            if (y == sp->stop_ids[i]) stop = PRL_STOP_TOKEN;
        if (stop < 0 && has_stop_string(g, r)) stop = PRL_STOP_STRING;
        if (stop < 0 && r->n >= sp->max_new_tokens) stop = PRL_STOP_LENGTH;
    }
    if (stop < 0 && st->len + 1 >= e->opt.max_len) stop = PRL_STOP_CONTEXT; /* no room to feed y */
    if (stop < 0) return 0;
    r->stop = (prl_stop_reason)stop;
    return 1;
}

static void spec_admit(prl_infer *e, int slot, const int32_t *prompt, int P);
static void spec_prefill(gen_state *g, int slot);
static prl_status spec_step(gen_state *g, int *finished, long *tokens);

static prl_status alloc_result(gen_state *g, int i)
{
    const prl_gen_request *q = &g->reqs[i];
    prl_gen_result *r = &g->res[i];
    int cap = q->forced ? (q->n_forced > 0 ? q->n_forced : 1) : g->sp->max_new_tokens;
    r->tokens = malloc((size_t)cap * sizeof *r->tokens);
    r->logprobs = malloc((size_t)cap * sizeof *r->logprobs);
    r->prompt_logprobs = calloc((size_t)q->prompt_len, sizeof *r->prompt_logprobs);
    r->prompt_len = q->prompt_len;
    if (!r->tokens || !r->logprobs || !r->prompt_logprobs)
        return prl_error_set(PRL_ERR_NOMEM, "results of request %d", i);
    return PRL_OK;
}

/* Pack the slot's routes into the result and free the slot. */
static prl_status finish(gen_state *g, int slot)
{
    prl_infer *e = g->e;
    slot_state *st = &e->slots[slot];
    prl_gen_result *r = &g->res[st->req];
    r->n_route_tokens = st->len;
    size_t n_ids = (size_t)st->len * e->n_moe * e->K;
    r->routes_bytes = n_ids * (size_t)prl_routes_width(e->E);
    r->routes = malloc(r->routes_bytes ? r->routes_bytes : 1);
    if (!r->routes) return prl_error_set(PRL_ERR_NOMEM, "routes of request %d", st->req);
    prl_routes_pack(r->routes, st->routes, n_ids, e->E);
    st->req = -1;
    return PRL_OK;
}

/* Prefill request i into a free slot and take its first token. */
static prl_status admit(gen_state *g, int i, int slot, int *stopped)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    const prl_gen_request *q = &g->reqs[i];
    prl_status rc = alloc_result(g, i);
    if (rc) return rc;
    slot_state *st = &e->slots[slot];
    st->req = i;
    int P = q->prompt_len;
    for (int t = 0; t < P; t++) b->tok[t] = q->prompt[t], b->slot[t] = slot, b->pos[t] = t, b->req[t] = i;
    forward_rows(e, P);
    st->len = P;
    spec_admit(e, slot, q->prompt, P);
    double tau = g->sp->temperature > 0 ? g->sp->temperature : 1.0;
    prl_gen_result *r = &g->res[i];
    for (int t = 1; t < P; t++)
        r->prompt_logprobs[t] = logprob(b->logits + (size_t)(t - 1) * e->V, e->V, q->prompt[t], tau);
    if (q->forced && q->n_forced == 0) { /* prompt log-probs only */
        r->stop = PRL_STOP_FORCED;
        *stopped = 1;
    } else {
        *stopped = take_token(g, slot, P - 1);
    }
    spec_prefill(g, slot); /* after the logits rows are read: it reuses the row buffers */
    return *stopped ? finish(g, slot) : PRL_OK;
}

/* One decode step for every active slot (in slot order). */
static prl_status decode_step(gen_state *g, int *finished)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    int R = 0;
    for (int s = 0; s < e->opt.max_batch; s++) {
        slot_state *st = &e->slots[s];
        if (st->req < 0) continue;
        b->tok[R] = st->last, b->slot[R] = s, b->pos[R] = st->len, b->req[R] = st->req;
        R++;
    }
    if (R == 0) return PRL_OK;
    forward_rows(e, R);
    for (int r = 0; r < R; r++) {
        int s = b->slot[r];
        e->slots[s].len++;
        if (take_token(g, s, r)) {
            prl_status rc = finish(g, s);
            if (rc) return rc;
            (*finished)++;
        }
    }
    return PRL_OK;
}

prl_status prl_infer_generate(prl_infer *e, const prl_gen_request *reqs, int n,
                              const prl_sample_params *sp, prl_gen_result *results,
                              prl_gen_progress progress, void *user)
{
    memset(results, 0, (size_t)n * sizeof *results);
    prl_status rc = prl_sample_params_check(sp, e->V);
    if (!rc) rc = check_requests(e, reqs, n);
    if (rc) return rc;
    if (prl_pool_threads() > e->att_threads)
        return prl_error_set(PRL_ERR_ARG, "the pool grew to %d threads after the infer engine was "
                             "made for %d", prl_pool_threads(), e->att_threads);
    gen_state g = {.e = e, .reqs = reqs, .sp = sp, .res = results};
    g.cands = malloc((size_t)e->V * sizeof *g.cands);
    if (!g.cands) return prl_error_set(PRL_ERR_NOMEM, "sampling scratch");
    for (int s = 0; s < e->opt.max_batch; s++) e->slots[s].req = -1;
    int next = 0, finished = 0, active = 0;
    long tokens = 0;
    while (!rc && finished < n) {
        for (int s = 0; s < e->opt.max_batch && next < n && !rc; s++) {
            if (e->slots[s].req >= 0) continue;
            int stopped = 0;
            rc = admit(&g, next++, s, &stopped);
            tokens++;
            if (stopped) finished++, s--; /* the slot is free again */
        }
        if (rc) break;
        active = 0;
        for (int s = 0; s < e->opt.max_batch; s++) active += e->slots[s].req >= 0;
        if (active == 0) continue;
        double t0 = prl_now();
        if (e->Lm > 0) {
            rc = spec_step(&g, &finished, &tokens);
        } else {
            rc = decode_step(&g, &finished);
            tokens += active;
        }
        e->spec.passes++, e->spec.pass_s += prl_now() - t0;
        if (progress) progress(user, finished, n, tokens);
    }
    free(g.cands);
    if (rc) {
        for (int i = 0; i < n; i++) prl_gen_result_free(&results[i]);
        for (int s = 0; s < e->opt.max_batch; s++) e->slots[s].req = -1;
    }
    return rc;
}

/* ------------------------------------------------------------------ self-speculative decoding */

/* docs/infer.md "Speculative decoding". Per step and active slot: D' ≤ spec_drafts drafts
** from the MTP modules (module k at the slot's last position, its input h^{k−1} and the
** token k places ahead, the k-th draft d_k ~ q_k), one trunk pass over [last, d_1..d_D'] for
** every slot together (the verify), the acceptance rule of spec_decode.c, then a rollback of
** every per-sequence cache to the accepted length.
**
** Rollback. Every per-sequence cache is indexed by absolute position and keeps
** spec_spare_rows() rows beyond what its window reads: the KV latent + rope-key caches
** (whole context, or a ring of W + D rows for a sliding-window layer), the three ModAttn conv
** histories (k − 1 + D inputs), the MTP layers' own KV caches. A verify pass of D + 1 rows
** therefore never overwrites a row the accepted prefix still needs, and rolling a sequence
** back is setting its length (slot_rollback): rows past it are dead and are rewritten when
** those positions are fed again. A new per-sequence cache joins by being position-indexed
** the same way; for the DSA indexer key cache (whole context) that is all it needs. */

/* Hidden state h^k (k = 0: the trunk's h⁰) of position i in slot s. */
static float *slot_hidden(const prl_infer *e, const slot_state *st, int k, int i)
{
    return st->hid + ((size_t)k * e->opt.max_len + (size_t)i) * e->d;
}

/* Roll slot s back to `len` fed positions: every cache is position-indexed with spare rows
** (above), so the trunk caches (KV latent + rope key, SWA rings, ModAttn conv histories —
** and a DSA indexer key cache) need only the length; the MTP layers' final rows are capped. */
static void slot_rollback(prl_infer *e, int s, int len)
{
    slot_state *st = &e->slots[s];
    st->len = len;
    for (int k = 0; k < e->Lm; k++) st->mtp_len[k] = st->mtp_len[k] < len ? st->mtp_len[k] : len;
}

/* Keep the prompt's tokens and trunk states (rb.x after forward_rows) for the MTP modules. */
static void spec_admit(prl_infer *e, int slot, const int32_t *prompt, int P)
{
    slot_state *st = &e->slots[slot];
    if (e->Lm == 0) return;
    memcpy(st->toks, prompt, (size_t)P * sizeof *st->toks);
    memcpy(slot_hidden(e, st, 0, 0), e->rb.x, (size_t)P * e->d * sizeof(float));
    memset(st->mtp_len, 0, (size_t)e->Lm * sizeof *st->mtp_len);
}

static void mtp_rows(prl_infer *e, int k, int R, const int *head_rows, int n_head);

/* The MTP modules' part of the prefill: module k = 1..D on the prompt positions whose token k
** ahead is in the prompt (i < P − k), without the head, so their cache rows and h^k are
** final before the first step — which then runs k rows per module, as every later step
** does. Prefill work, so it runs with the trunk's prefill (and is timed with it), even when
** the first token already ended the sequence. Nothing for teacher forcing (no drafts). */
static void spec_prefill(gen_state *g, int slot)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    slot_state *st = &e->slots[slot];
    const prl_gen_request *q = &g->reqs[st->req];
    int P = q->prompt_len;
    if (e->Lm == 0 || q->forced) return;
    for (int k = 1; k <= e->opt.spec_drafts && P - k > 0; k++) {
        int R = P - k; /* <= P rows: the prefill's own row count fits the buffer */
        for (int i = 0; i < R; i++) {
            b->tok[i] = st->toks[i + k], b->slot[i] = slot, b->pos[i] = i, b->req[i] = st->req;
            memcpy(b->x + (size_t)i * e->d, slot_hidden(e, st, k - 1, i), (size_t)e->d * sizeof(float));
        }
        mtp_rows(e, k, R, NULL, 0);
        for (int i = 0; i < R; i++)
            memcpy(slot_hidden(e, st, k, i), b->x + (size_t)i * e->d, (size_t)e->d * sizeof(float));
        st->mtp_len[k - 1] = R;
    }
}

/* MTP module k (1-based) on R rows: rb.tok holds t_{i+k}, rb.x holds h^{k−1}; afterwards rb.x
** holds h^k and rb.logits rows 0..n_head−1 (stride V) the module's logits (shared head) of
** rows head_rows[]: only the row a draft is drawn from needs them — the other rows only fill
** the module's KV cache and h^k, and the head is the module's largest matrix (V × d). With
** spec_draft_vocab = S the head covers ids [0, S) and the rest of each row is −∞, so the
** draft and its distribution q (what the acceptance rule needs) never leave the shortlist. */
static void mtp_rows(prl_infer *e, int k, int R, const int *head_rows, int n_head)
{
    rows_buf *b = &e->rb;
    int l = e->L + k - 1, d = e->d;
    const layer_w *w = &e->lw[l];
    double eps = e->m->cfg.rms_norm_eps;
    rows_begin(e, R);
    for (int r = 0; r < R; r++)
        memcpy(b->mtp_e + (size_t)r * d, e->embed + (size_t)b->tok[r] * d,
               (size_t)d * sizeof(float));
    /* prl_mtp_input_forward's ops and rounding points, with eh_proj through the infer path's
    ** pre-packed linear (the train path's matmul packs the 2d × d weight on every call) */
    prl_rmsnorm_forward(b->mtp_cat, b->mtp_rstd, b->mtp_e, w->enorm, R, d, d, 2 * d, eps);
    prl_rmsnorm_forward(b->mtp_cat + d, b->mtp_rstd + R, b->x, w->hnorm, R, d, d, 2 * d, eps);
    act_round(e, b->mtp_cat, (size_t)R * 2 * d);
    linear(e, b->x, b->mtp_cat, R, &w->eh_proj);
    layer_rows(e, l, R);
    /* A hook sees the head on every row, as the train path's `mtp.logits` has it (with the
    ** rows' request and position from prl_infer_hook_rows); decoding needs only head_rows. */
    int all = e->hook != NULL, n = all ? R : n_head;
    for (int i = 0; i < n; i++) /* the head's rows, gathered (mtp_h is free again) */
        memcpy(b->mtp_h + (size_t)i * d, b->x + (size_t)(all ? i : head_rows[i]) * d,
               (size_t)d * sizeof(float));
    prl_rmsnorm_forward(b->ln, b->rstd, b->mtp_h, w->sh_norm, n, d, d, d, eps);
    act_round(e, b->ln, (size_t)n * d);
    const lin *head = w->draft_head.w ? &w->draft_head : w->sh_head;
    int S = head->out, V = e->V;
    linear(e, b->logits, b->ln, n, head);
    for (int i = n - 1; i >= 0 && S < V; i--) { /* rows of S → rows of V, last first */
        float *row = b->logits + (size_t)i * V;
        memmove(row, b->logits + (size_t)i * S, (size_t)S * sizeof *row);
        for (int j = S; j < V; j++) row[j] = -INFINITY;
    }
    if (all) {
        emit(e, l, "mtp.logits", b->logits, R, V); /* the train path's name for the same rows */
        for (int i = 0; i < n_head; i++) /* rows 0..n_head−1 are head_rows' logits again */
            memmove(b->logits + (size_t)i * V, b->logits + (size_t)head_rows[i] * V,
                    (size_t)V * sizeof(float));
    }
}

/* Drafts a step may take for the slot: none for teacher forcing; never past the context or
** the new-token budget (the emitted tokens are the drafts accepted plus one). */
static int spec_budget(const gen_state *g, int s)
{
    const prl_infer *e = g->e;
    const slot_state *st = &e->slots[s];
    const prl_gen_request *q = &g->reqs[st->req];
    int n = e->opt.spec_drafts, room = e->opt.max_len - 1 - st->len;
    int left = g->sp->max_new_tokens - g->res[st->req].n - 1;
    if (q->forced) return 0;
    n = room < n ? room : n;
    return left < n ? (left > 0 ? left : 0) : n;
}

/* The sampler's distribution of a logits row as a probability vector over the vocabulary
** (zeros outside the top-k/top-p set): what sampling draws from, for p and q alike. */
static void probs_row(double *w, const float *logits, const gen_state *g)
{
    int V = g->e->V, n = sample_weights(g->cands, logits, V, g->sp);
    double total = 0;
    for (int i = 0; i < n; i++) total += g->cands[i].w;
    memset(w, 0, (size_t)V * sizeof *w);
    for (int i = 0; i < n; i++) w[g->cands[i].id] = g->cands[i].w / total;
}

/* A draft from the module's logits row: its argmax (greedy) or a draw from q_k (kept for the
** acceptance test), seeded from (seed, sequence, position of the draft, DRAFT). */
static int32_t draw_draft(gen_state *g, int s, int k, const float *logits)
{
    slot_state *st = &g->e->slots[s];
    if (g->sp->temperature == 0) return (int32_t)sample_row(logits, g->e->V, g->sp, NULL, g->cands);
    double *q = st->q + (size_t)(k - 1) * g->e->V;
    probs_row(q, logits, g);
    prl_rng rng;
    prl_rng_init(&rng, g->sp->seed, g->reqs[st->req].seq_id, (uint64_t)(st->len + k), 0,
                 PRL_RNG_DRAFT);
    return (int32_t)prl_spec_draw(q, g->e->V, &rng);
}

/* Token at position j of slot s during a step: the sequence up to `last` (position len),
** then this step's drafts. */
static int32_t step_token(const slot_state *st, int j)
{
    return j <= st->len ? st->toks[j] : st->draft[j - st->len - 1];
}

/* Run module k on `rows` (slots n_slots of `slots`, each from its mtp_len[k−1] to len − 1),
** keep h^k, draw the slot's k-th draft from its last row. */
static void draft_flush(gen_state *g, int k, const int *slots, int n_slots, int R)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    int last[4096] = {0}; /* max_batch <= 4096 (prl_infer_init); zeroed: gcc cannot see n_slots >= 1 */
    for (int i = 0, r = 0; i < n_slots; i++) { /* each slot's rows end at position len − 1 */
        const slot_state *st = &e->slots[slots[i]];
        r += st->len - st->mtp_len[k - 1];
        last[i] = r - 1;
    }
    mtp_rows(e, k, R, last, n_slots);
    for (int r = 0; r < R; r++) {
        slot_state *st = &e->slots[b->slot[r]];
        memcpy(slot_hidden(e, st, k, b->pos[r]), b->x + (size_t)r * e->d,
               (size_t)e->d * sizeof(float));
    }
    for (int i = 0; i < n_slots; i++) {
        slot_state *st = &e->slots[slots[i]];
        st->draft[k - 1] = draw_draft(g, slots[i], k, b->logits + (size_t)i * e->V);
        /* rows with t_{i+k} final (i + k <= len) are final; the rest are redone next step */
        int fin = st->len - k + 1;
        st->mtp_len[k - 1] = fin > st->mtp_len[k - 1] ? fin : st->mtp_len[k - 1];
    }
}

/* The k-th drafts of every slot with nd[s] >= k, in batches that fit the rows buffer. */
static void draft_pass(gen_state *g, int k, const int *nd)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    int slots[4096], n_slots = 0, R = 0;
    for (int s = 0; s < e->opt.max_batch; s++) {
        slot_state *st = &e->slots[s];
        if (st->req < 0 || nd[s] < k) continue;
        int m = st->mtp_len[k - 1], rows = st->len - m;
        if (R + rows > b->cap) draft_flush(g, k, slots, n_slots, R), n_slots = 0, R = 0;
        for (int i = m; i < st->len; i++, R++) {
            b->tok[R] = step_token(st, i + k), b->slot[R] = s, b->pos[R] = i, b->req[R] = st->req;
            memcpy(b->x + (size_t)R * e->d, slot_hidden(e, st, k - 1, i),
                   (size_t)e->d * sizeof(float));
        }
        slots[n_slots++] = s;
    }
    if (R > 0) draft_flush(g, k, slots, n_slots, R);
}

/* Accept or reject slot s's drafts against its verify rows [r0, r0 + nd] and record the
** emitted tokens; returns how many; *stopped when the sequence ended. */
static int spec_accept(gen_state *g, int s, int r0, int nd, int *stopped)
{
    prl_infer *e = g->e;
    slot_state *st = &e->slots[s];
    int V = e->V, len0 = st->len, n_emit;
    int32_t out[PRL_MAX_LAYERS + 1], best[PRL_MAX_LAYERS + 1];
    const float *logits = e->rb.logits + (size_t)r0 * V;
    if (g->sp->temperature == 0) {
        for (int j = 0; j <= nd; j++)
            best[j] = (int32_t)sample_row(logits + (size_t)j * V, V, g->sp, NULL, g->cands);
        n_emit = prl_spec_accept_greedy(out, st->draft, best, nd);
    } else {
        prl_rng rng[PRL_MAX_LAYERS + 1];
        uint64_t seq = g->reqs[st->req].seq_id;
        for (int j = 0; j <= nd; j++) {
            probs_row(e->spec_p + (size_t)j * V, logits + (size_t)j * V, g);
            prl_rng_init(&rng[j], g->sp->seed, seq, (uint64_t)(len0 + 1 + j), 0, PRL_RNG_ACCEPT);
        }
        n_emit = prl_spec_accept_sample(out, st->draft, st->q, e->spec_p, V, nd, rng);
    }
    e->spec.drafted += nd, e->spec.accepted += n_emit - 1, e->spec.emitted += n_emit;
    e->spec.steps++;
    *stopped = 0;
    int j = 0;
    while (j < n_emit && !*stopped) { /* token j follows the verify row of position len0 + j */
        st->len = len0 + 1 + j;
        *stopped = record_token(g, s, out[j], logits + (size_t)j * V);
        j++;
    }
    slot_rollback(e, s, st->len); /* the rows past the last emitted token's are dead */
    return j;
}

/* One speculative step for every active slot: drafts, one verify pass, acceptance. */
static prl_status spec_step(gen_state *g, int *finished, long *tokens)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    int nd[4096], first[4096], R = 0;
    PRL_ASSERT(e->opt.max_batch <= 4096 && e->opt.spec_drafts <= PRL_MAX_LAYERS);
    double t0 = prl_now();
    for (int s = 0; s < e->opt.max_batch; s++) nd[s] = e->slots[s].req >= 0 ? spec_budget(g, s) : 0;
    for (int k = 1; k <= e->opt.spec_drafts; k++) draft_pass(g, k, nd);
    double t1 = prl_now();
    for (int s = 0; s < e->opt.max_batch; s++) {
        slot_state *st = &e->slots[s];
        if (st->req < 0) continue;
        first[s] = R;
        for (int j = 0; j <= nd[s]; j++, R++)
            b->tok[R] = step_token(st, st->len + j), b->slot[R] = s, b->pos[R] = st->len + j,
            b->req[R] = st->req;
    }
    if (R == 0) return PRL_OK;
    forward_rows(e, R);
    for (int r = 0; r < R; r++) /* h⁰ of every fed row (dead ones are overwritten later) */
        memcpy(slot_hidden(e, &e->slots[b->slot[r]], 0, b->pos[r]), b->x + (size_t)r * e->d,
               (size_t)e->d * sizeof(float));
    double t2 = prl_now();
    e->spec.draft_s += t1 - t0, e->spec.verify_s += t2 - t1;
    for (int s = 0; s < e->opt.max_batch; s++) {
        if (e->slots[s].req < 0) continue;
        int stopped;
        *tokens += spec_accept(g, s, first[s], nd[s], &stopped);
        if (stopped) {
            prl_status rc = finish(g, s);
            if (rc) return rc;
            (*finished)++;
        }
    }
    e->spec.accept_s += prl_now() - t2;
    return PRL_OK;
}
