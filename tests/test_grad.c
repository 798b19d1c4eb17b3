/*
** test_grad.c — finite-difference gradient checks in double, for every op and for the
** whole model on the micro config (MoE selections frozen by route override), with every
** block at once on configs/models/micro-pangu.json (spec §12.2).
**
** Linked against prl_model64 (the engine compiled with prl_real = double). Each op check
** builds a scalar L = Σ r ⊙ out with a fixed random r, runs the op's backward with dout = r,
** and compares every input/parameter gradient with the central difference
** (L(x+ε) − L(x−ε)) / 2ε, ε = 1e-6. The error measure is max |analytic − numeric| divided
** by max(1, max |numeric|), and must stay below 1e-6 (ops) or 1e-5 (whole model).
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "engine/dsa.h"
#include "engine/mhc.h"
#include "engine/mtp.h"
#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

#ifndef PRL_REAL_DOUBLE
#error "test_grad must be built against prl_model64 (PRL_REAL_DOUBLE)"
#endif

static prl_rng rng;

static double *randv(size_t n, double scale)
{
    double *v = malloc(n * sizeof *v + 8);
    for (size_t i = 0; i < n; i++) v[i] = scale * prl_rng_normal(&rng);
    return v;
}

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The op under test as a closure: fills out[] from the current inputs. */
typedef void (*forward_fn)(void *ctx, double *out);

/* Compare analytic gradient `grad` of L = r·out w.r.t. x[0..n) with central differences. */
static double fd_error(forward_fn f, void *ctx, double *x, size_t n, const double *grad,
                       const double *r, size_t n_out)
{
    double *out = malloc(n_out * sizeof *out + 8);
    double max_err = 0, max_num = 0;
    const double eps = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + eps;
        f(ctx, out);
        double lp = dot(r, out, n_out);
        x[i] = keep - eps;
        f(ctx, out);
        double lm = dot(r, out, n_out);
        x[i] = keep;
        double num = (lp - lm) / (2 * eps);
        double err = fabs(num - grad[i]);
        if (err > max_err) max_err = err;
        if (fabs(num) > max_num) max_num = fabs(num);
    }
    free(out);
    return max_err / (max_num > 1 ? max_num : 1);
}

/* ------------------------------------------------------------------ matmul ---------- */

typedef struct {
    double *inp, *w;
    int N, C, OC;
} mm_ctx;
static void mm_fwd(void *p, double *out)
{
    mm_ctx *c = p;
    prl_matmul_forward(out, c->inp, c->w, c->N, c->C, c->OC, 0);
}

START_TEST(test_matmul_grad)
{
    mm_ctx c = {.N = 5, .C = 7, .OC = 3};
    c.inp = randv(35, 1);
    c.w = randv(21, 1);
    double *r = randv(15, 1), *dinp = calloc(35, 8), *dw = calloc(21, 8);
    prl_matmul_backward(dinp, dw, r, c.inp, c.w, c.N, c.C, c.OC);
    ck_assert_double_lt(fd_error(mm_fwd, &c, c.inp, 35, dinp, r, 15), 1e-6);
    ck_assert_double_lt(fd_error(mm_fwd, &c, c.w, 21, dw, r, 15), 1e-6);
    /* large enough to use several row blocks (fixed split) */
    mm_ctx big = {.N = 300, .C = 4, .OC = 2};
    big.inp = randv(1200, 1);
    big.w = randv(8, 1);
    double *rb = randv(600, 1), *dib = calloc(1200, 8), *dwb = calloc(8, 8);
    prl_matmul_backward(dib, dwb, rb, big.inp, big.w, big.N, big.C, big.OC);
    ck_assert_double_lt(fd_error(mm_fwd, &big, big.w, 8, dwb, rb, 600), 1e-6);
}
END_TEST

/* ------------------------------------------------------------------ mHC ------------- */

typedef struct {
    double *R, S[2 * 20 * 16];
    int n, it;
} sk_ctx;
static void sk_fwd(void *p, double *out)
{
    sk_ctx *c = p;
    prl_sinkhorn_forward(c->S, c->R, c->n, c->it);
    memcpy(out, c->S + (size_t)(2 * c->it - 1) * c->n * c->n, (size_t)c->n * c->n * sizeof *out);
}

START_TEST(test_sinkhorn_grad)
{
    int its[3] = {1, 3, 20};
    for (int k = 0; k < 3; k++) {
        sk_ctx c = {.n = 4, .it = its[k]};
        c.R = randv(16, 2);
        double *r = randv(16, 1), *dR = calloc(16, 8), H[16];
        sk_fwd(&c, H);
        prl_sinkhorn_backward(dR, r, c.S, c.R, c.n, c.it);
        ck_assert_double_lt(fd_error(sk_fwd, &c, c.R, 16, dR, r, 16), 1e-6);
        if (its[k] == 20) /* doubly stochastic after 20 iterations */
            for (int i = 0; i < 4; i++) {
                double rs = 0, cs = 0;
                for (int j = 0; j < 4; j++) rs += H[i * 4 + j], cs += H[j * 4 + i];
                ck_assert_double_eq_tol(rs, 1, 1e-3);
                ck_assert_double_eq_tol(cs, 1, 1e-5);
            }
        free(c.R), free(r), free(dR);
    }
}
END_TEST

/* hc_pre and hc_post alone: x_in = Σ pre_i X_i;  Xo_j = post_j F + Σ_i H[i,j] X_i. */
typedef struct {
    double *X, *F, *pre, *post, *H;
    prl_mhc_shape s;
} mix_t;
static void hcpre_fwd(void *p, double *out)
{
    mix_t *c = p;
    prl_mhc_pre_forward(out, c->X, c->pre, c->s);
}
static void hcpost_fwd(void *p, double *out)
{
    mix_t *c = p;
    prl_mhc_post_forward(out, c->F, c->X, c->post, c->H, c->s.n * c->s.n, c->s);
}

START_TEST(test_hc_pre_post_grad)
{
    mix_t c = {.s = {.N = 3, .n = 4, .d = 5, .it = 1, .full = 1}};
    int N = 3, n = 4, d = 5, nd = 20;
    c.X = randv((size_t)N * nd, 1), c.F = randv((size_t)N * d, 1);
    c.pre = randv((size_t)N * n, 1), c.post = randv((size_t)N * n, 1),
    c.H = randv((size_t)N * 16, 1);
    double *r = randv((size_t)N * nd, 1);
    double *dX = calloc((size_t)N * nd, 8), *dpre = calloc((size_t)N * n, 8);
    prl_mhc_pre_backward(dX, dpre, r, c.X, c.pre, c.s);
    ck_assert_double_lt(fd_error(hcpre_fwd, &c, c.X, (size_t)N * nd, dX, r, (size_t)N * d), 1e-6);
    ck_assert_double_lt(fd_error(hcpre_fwd, &c, c.pre, (size_t)N * n, dpre, r, (size_t)N * d),
                        1e-6);
    double *dF = calloc((size_t)N * d, 8), *dpost = calloc((size_t)N * n, 8);
    double *dH = calloc((size_t)N * 16, 8);
    memset(dX, 0, (size_t)N * nd * 8);
    prl_mhc_post_backward(dF, dX, dpost, dH, r, c.F, c.X, c.post, c.H, 16, c.s);
    size_t no = (size_t)N * nd;
    ck_assert_double_lt(fd_error(hcpost_fwd, &c, c.F, (size_t)N * d, dF, r, no), 1e-6);
    ck_assert_double_lt(fd_error(hcpost_fwd, &c, c.X, no, dX, r, no), 1e-6);
    ck_assert_double_lt(fd_error(hcpost_fwd, &c, c.post, (size_t)N * n, dpost, r, no), 1e-6);
    ck_assert_double_lt(fd_error(hcpost_fwd, &c, c.H, (size_t)N * 16, dH, r, no), 1e-6);
}
END_TEST

/* A whole site: out = [pre | post | H] per token (full), or the merge head x_in = Σ pre_i X_i
** (pre only). */
typedef struct {
    double *X, *phi, *gamma, *alpha, *beta;
    double h[3 * 20], rstd[3], m[3 * 24], pre[12], post[12], S[3 * 6 * 16];
    prl_mhc_shape s;
} site_t;

static prl_mhc_saved site_saved(site_t *c)
{
    return (prl_mhc_saved){.h = c->h,
                           .rstd = c->rstd,
                           .m = c->m,
                           .pre = c->pre,
                           .post = c->post,
                           .S = c->S};
}

static void site_fwd(void *p, double *out)
{
    site_t *c = p;
    prl_mhc_saved sv = site_saved(c);
    prl_mhc_params pp = {.phi = c->phi, .gamma = c->gamma, .alpha = c->alpha, .beta = c->beta};
    prl_mhc_site_forward(&sv, c->X, &pp, 1e-5, c->s, PRL_PRECISION_FP32);
    int N = c->s.N, n = c->s.n, ns = prl_mhc_states(c->s);
    if (!c->s.full) {
        prl_mhc_pre_forward(out, c->X, c->pre, c->s);
        return;
    }
    memcpy(out, c->pre, (size_t)N * n * 8);
    memcpy(out + N * n, c->post, (size_t)N * n * 8);
    for (int t = 0; t < N; t++)
        memcpy(out + 2 * N * n + t * n * n, c->S + ((size_t)t * ns + ns - 1) * n * n,
               (size_t)n * n * 8);
}

static void check_site(int full)
{
    int N = 3, n = 4, d = 5, nd = 20;
    site_t c = {.s = {.N = N, .n = n, .d = d, .it = 3, .full = full}};
    int M = prl_mhc_width(c.s), n_out = full ? N * (2 * n + n * n) : N * d;
    c.X = randv((size_t)N * nd, 1), c.phi = randv((size_t)M * nd, 0.5);
    c.gamma = randv(nd, 1), c.alpha = randv(3, 1), c.beta = randv(M, 1);
    double *r = randv(n_out, 1), out[3 * 24];
    site_fwd(&c, out);
    double *dX = calloc((size_t)N * nd, 8), *dphi = calloc((size_t)M * nd, 8);
    double *dgamma = calloc(nd, 8), *dalpha = calloc(3, 8), *dbeta = calloc(M, 8);
    double *dpre = calloc((size_t)N * n, 8);
    prl_mhc_shape s = c.s;
    double *scratch = malloc(prl_mhc_site_scratch(s) * 8);
    const double *dpost = NULL, *dH = NULL;
    if (full) {
        memcpy(dpre, r, (size_t)N * n * 8);
        dpost = r + N * n, dH = r + 2 * N * n;
    } else {
        prl_mhc_pre_backward(dX, dpre, r, c.X, c.pre, s);
    }
    prl_mhc_saved sv = site_saved(&c);
    prl_mhc_params pp = {.phi = c.phi, .gamma = c.gamma, .alpha = c.alpha, .beta = c.beta};
    prl_mhc_grads g = {.dphi = dphi, .dgamma = dgamma, .dalpha = dalpha, .dbeta = dbeta};
    prl_mhc_site_backward(dX, &g, scratch, dpre, dpost, dH, &sv, c.X, &pp, s, PRL_PRECISION_FP32);
    ck_assert_double_lt(fd_error(site_fwd, &c, c.X, (size_t)N * nd, dX, r, n_out), 1e-6);
    ck_assert_double_lt(fd_error(site_fwd, &c, c.phi, (size_t)M * nd, dphi, r, n_out), 1e-6);
    ck_assert_double_lt(fd_error(site_fwd, &c, c.gamma, nd, dgamma, r, n_out), 1e-6);
    ck_assert_double_lt(fd_error(site_fwd, &c, c.alpha, full ? 3 : 1, dalpha, r, n_out), 1e-6);
    ck_assert_double_lt(fd_error(site_fwd, &c, c.beta, M, dbeta, r, n_out), 1e-6);
    free(dX), free(dphi), free(dgamma), free(dalpha), free(dbeta), free(dpre), free(scratch);
}

START_TEST(test_mhc_site_grad) { check_site(1); }
END_TEST

START_TEST(test_mhc_merge_head_grad) { check_site(0); }
END_TEST

/* ------------------------------------------------------------------ RMSNorm --------- */

typedef struct {
    double *inp, *g, rstd[8];
    int N, C, stride;
} rn_ctx;
static void rn_fwd(void *p, double *out)
{
    rn_ctx *c = p;
    prl_rmsnorm_forward(out, c->rstd, c->inp, c->g, c->N, c->C, c->stride, c->C, 1e-5);
}

START_TEST(test_rmsnorm_grad)
{
    /* normalise the first 5 of 7 columns (a strided slice, as for the kv latent) */
    rn_ctx c = {.N = 4, .C = 5, .stride = 7};
    c.inp = randv(28, 1);
    c.g = randv(5, 1);
    double *out = malloc(20 * 8), *r = randv(20, 1), *dinp = calloc(28, 8), *dg = calloc(5, 8);
    rn_fwd(&c, out);
    prl_rmsnorm_backward(dinp, dg, r, c.inp, c.g, c.rstd, c.N, c.C, c.stride, c.C);
    ck_assert_double_lt(fd_error(rn_fwd, &c, c.inp, 28, dinp, r, 20), 1e-6);
    ck_assert_double_lt(fd_error(rn_fwd, &c, c.g, 5, dg, r, 20), 1e-6);
    for (int n = 0; n < 4; n++) ck_assert_double_eq(dinp[n * 7 + 5], 0); /* untouched */
}
END_TEST

/* ------------------------------------------------------------------ RoPE ------------ */

typedef struct {
    double *x, cos_t[64], sin_t[64];
    int N, T, interleave;
} rope_ctx;
static void rope_fwd(void *p, double *out)
{
    rope_ctx *c = p;
    memcpy(out, c->x, (size_t)c->N * 2 * 6 * sizeof *out);
    /* 2 heads of 6 dims, rope on the last 4 of each head */
    prl_rope_forward(out, c->cos_t, c->sin_t, c->N, c->T, 2, 6, 2, 12, 4, c->interleave);
}

START_TEST(test_rope_grad)
{
    rope_ctx c = {.N = 6, .T = 3};
    prl_rope_tables(c.cos_t, c.sin_t, 3, 4, 10000.0);
    c.x = randv(72, 1);
    double *r = randv(72, 1), *dx = malloc(72 * 8);
    memcpy(dx, r, 72 * 8);
    prl_rope_backward(dx, c.cos_t, c.sin_t, c.N, c.T, 2, 6, 2, 12, 4, 0);
    ck_assert_double_lt(fd_error(rope_fwd, &c, c.x, 72, dx, r, 72), 1e-6);
    /* position 0 is the identity; the map preserves norms */
    double out[72];
    rope_fwd(&c, out);
    for (int i = 0; i < 12; i++) ck_assert_double_eq(out[i], c.x[i]);
    ck_assert_double_eq_tol(dot(out, out, 72), dot(c.x, c.x, 72), 1e-9);
}
END_TEST

/* DeepSeek-V3's RoPE: interleaved pairs (x[2i], x[2i+1]) and YaRN tables whose attention
** factor (mscale 1, mscale_all_dim 0.5: ≈ 1.06) scales cos and sin, so the backward is the
** transpose of a scaled rotation. Pair i of the interleaved rotation is the half-split one
** on the permuted vector. */
START_TEST(test_rope_interleave_yarn_grad)
{
    prl_rope_scaling y = {.yarn = 1,
                          .factor = 4,
                          .mscale = 1,
                          .mscale_all_dim = 0.5,
                          .original_max_position_embeddings = 2};
    rope_ctx c = {.N = 6, .T = 3, .interleave = 1};
    prl_rope_tables_scaled(c.cos_t, c.sin_t, 3, 4, 10000.0, &y);
    double af = prl_rope_attention_factor(&y);
    ck_assert_double_eq_tol(af, (0.1 * log(4) + 1) / (0.05 * log(4) + 1), 1e-15);
    ck_assert_double_eq_tol(c.cos_t[0], af, 1e-15); /* position 0: cos = factor, sin = 0 */
    c.x = randv(72, 1);
    double *r = randv(72, 1), *dx = malloc(72 * 8);
    memcpy(dx, r, 72 * 8);
    prl_rope_backward(dx, c.cos_t, c.sin_t, c.N, c.T, 2, 6, 2, 12, 4, 1);
    ck_assert_double_lt(fd_error(rope_fwd, &c, c.x, 72, dx, r, 72), 1e-6);
    /* interleaved = half-split on (x0, x2 | x1, x3) */
    double out[72], perm[72], back[72];
    rope_fwd(&c, out);
    for (int n = 0; n < 12; n++) {
        const double *v = c.x + n * 6 + 2;
        double *w = perm + n * 6;
        w[0] = v[0], w[1] = v[2], w[2] = v[1], w[3] = v[3];
    }
    prl_rope_forward(perm, c.cos_t, c.sin_t, 6, 3, 2, 6, 0, 12, 4, 0);
    for (int n = 0; n < 12; n++) {
        const double *w = perm + n * 6;
        double *v = back + n * 6;
        v[0] = w[0], v[2] = w[1], v[1] = w[2], v[3] = w[3];
        for (int i = 0; i < 4; i++) ck_assert_double_eq(v[i], out[n * 6 + 2 + i]);
    }
    free(dx), free(r), free(c.x);
}
END_TEST

/* ------------------------------------------------------------------ attention ------- */

typedef struct {
    double *q, *kv, *kr, *skv, *skr, *att;
    int32_t lens[2];
    prl_attn_shape sh;
} at_ctx;
static void at_fwd(void *p, double *out)
{
    at_ctx *c = p;
    prl_attention_forward(out, c->att, c->q, c->kv, c->kr, c->skv, c->skr, c->lens, c->sh);
}

/* FD check of every attention input (and the sinks when sh.ns > 0) for a batch of two
** sequences of lengths lens; returns the output of the unperturbed forward (caller frees). */
static double *check_attention(at_ctx *c)
{
    prl_attn_shape sh = c->sh;
    int N = sh.B * sh.T, dq = sh.dn + sh.dr, dkv = sh.dn + sh.dv;
    int nq = N * sh.H * dq, nkv = N * sh.H * dkv, nkr = N * sh.dr, no = N * sh.H * sh.dv;
    int nskv = sh.ns * sh.H * dkv, nskr = sh.ns * sh.dr;
    c->q = randv(nq, 1), c->kv = randv(nkv, 1), c->kr = randv(nkr, 1);
    c->skv = randv(nskv, 1), c->skr = randv(nskr, 1);
    c->att = malloc((size_t)sh.B * sh.H * sh.T * (sh.ns + sh.T) * 8);
    double *out = malloc(no * 8), *r = randv(no, 1);
    /* rows past a sequence's length are meaningless: give them zero weight */
    for (int b = 0; b < sh.B; b++)
        for (int t = c->lens[b]; t < sh.T; t++)
            for (int i = 0; i < sh.H * sh.dv; i++) r[(b * sh.T + t) * sh.H * sh.dv + i] = 0;
    at_fwd(c, out);
    for (int b = 0; b < sh.B; b++)
        for (int t = c->lens[b]; t < sh.T; t++)
            ck_assert_double_eq(out[(b * sh.T + t) * sh.H * sh.dv], 0);
    double *dq_ = calloc(nq, 8), *dkv_ = calloc(nkv, 8), *dkr = calloc(nkr, 8);
    double *dskv = calloc(nskv + 1, 8), *dskr = calloc(nskr + 1, 8);
    double *scratch = malloc(prl_attention_scratch(sh) * 8);
    prl_attention_backward(dq_, dkv_, dkr, dskv, dskr, r, c->att, c->q, c->kv, c->kr, c->skv,
                           c->skr, scratch, c->lens, sh);
    ck_assert_double_lt(fd_error(at_fwd, c, c->q, nq, dq_, r, no), 1e-6);
    ck_assert_double_lt(fd_error(at_fwd, c, c->kv, nkv, dkv_, r, no), 1e-6);
    ck_assert_double_lt(fd_error(at_fwd, c, c->kr, nkr, dkr, r, no), 1e-6);
    if (sh.ns > 0) {
        ck_assert_double_lt(fd_error(at_fwd, c, c->skv, nskv, dskv, r, no), 1e-6);
        ck_assert_double_lt(fd_error(at_fwd, c, c->skr, nskr, dskr, r, no), 1e-6);
    }
    free(r), free(dq_), free(dkv_), free(dkr), free(dskv), free(dskr), free(scratch);
    return out;
}

START_TEST(test_attention_grad)
{
    at_ctx c = {.sh = {.B = 2, .T = 5, .H = 2, .dn = 3, .dr = 2, .dv = 3}, .lens = {5, 3}};
    double *out = check_attention(&c);
    /* causality: changing a future key does not change an earlier output */
    double out2[200];
    c.kv[(1 * c.sh.H + 0) * 6 + 4] += 1.0; /* token 1's value, head 0 */
    at_fwd(&c, out2);
    for (int i = 0; i < c.sh.H * 3; i++) ck_assert_double_eq(out[i], out2[i]); /* token 0 */
    free(out);
}
END_TEST

/* A softmax scale other than (dn + dr)^(−1/2) (YaRN's mscale²): the derivative carries it, and
** scale 0 means the default, bit for bit. */
START_TEST(test_attention_scale_grad)
{
    double m = 0.1 * 0.7 * log(4.0) + 1;
    at_ctx c = {.sh = {.B = 2,
                       .T = 5,
                       .H = 2,
                       .dn = 3,
                       .dr = 2,
                       .dv = 3,
                       .ns = 1,
                       .scale = m * m / sqrt(5.0)},
                .lens = {5, 4}};
    double *out = check_attention(&c), out0[200], outd[200];
    c.sh.scale = 0;
    at_fwd(&c, out0);
    c.sh.scale = 1 / sqrt(5.0);
    at_fwd(&c, outd);
    ck_assert_mem_eq(out0, outd, (size_t)2 * 5 * 2 * 3 * sizeof(double));
    ck_assert(memcmp(out, out0, (size_t)2 * 5 * 2 * 3 * sizeof(double)) != 0);
    free(out);
}
END_TEST

/* Longer sequences: several 64-row query blocks, a length that ends inside a block. */
START_TEST(test_attention_blocks_grad)
{
    at_ctx c = {.sh = {.B = 2, .T = 150, .H = 1, .dn = 3, .dr = 2, .dv = 2}, .lens = {150, 97}};
    free(check_attention(&c));
}
END_TEST

/* Sliding window W = 3 with two parameter sinks: row t sees the sinks and tokens t-2..t. */
START_TEST(test_attention_window_sinks_grad)
{
    at_ctx c = {.sh = {.B = 2, .T = 7, .H = 2, .dn = 3, .dr = 2, .dv = 3, .window = 3, .ns = 2},
                .lens = {7, 5}};
    double *out = check_attention(&c);
    /* token 1's value is outside the window of row 4 but inside that of row 3 */
    double out2[200];
    c.kv[(1 * c.sh.H + 0) * 6 + 4] += 1.0;
    at_fwd(&c, out2);
    for (int i = 0; i < 3; i++)
        ck_assert_double_eq(out[4 * c.sh.H * 3 + i], out2[4 * c.sh.H * 3 + i]);
    ck_assert_double_ne(out[3 * c.sh.H * 3 + 1], out2[3 * c.sh.H * 3 + 1]); /* v element 1 */
    /* the probabilities of a row (sinks + window) sum to 1 */
    const double *P = c.att + 4 * (2 + 7);
    double sum = 0;
    for (int j = 0; j < 2 + 7; j++) sum += j < 2 || (j - 2 >= 2 && j - 2 <= 4) ? P[j] : 0;
    ck_assert_double_eq_tol(sum, 1.0, 1e-12);
    free(out);
}
END_TEST

/* Windows across several query blocks; from position 256 + W on, a block's keys start inside
** the sequence (at a multiple of PRL_GEMM_KC). */
START_TEST(test_attention_window_blocks_grad)
{
    at_ctx d = {.sh = {.B = 2, .T = 322, .H = 1, .dn = 2, .dr = 2, .dv = 1, .window = 30, .ns = 3},
                .lens = {322, 3}};
    ck_assert_int_eq(prl_attention_key_start(320, 30), 256);
    free(check_attention(&d));
}
END_TEST

/* ------------------------------------------------------------------ DSA ------------- */

/* Sparse attention: a fixed selection (as the indexer would give, frozen) with two sinks.
** Keys outside a row's selection must not change it and get no gradient from it. */
START_TEST(test_attention_dsa_sel_grad)
{
    enum { B = 2, T = 9 };
    static uint8_t sel[B * T * T];
    prl_rng r2;
    prl_rng_init(&r2, 5, 0, 0, 0, PRL_RNG_TEST);
    for (int n = 0; n < B * T; n++) /* rows t < 3 see all; later rows a pseudo-random 3 of t+1 */
        for (int s = 0, t = n % T, picked = 0; s <= t; s++) {
            int take = t < 3 || (picked < 3 && (prl_rng_u64(&r2) % 2 || t - s < 3 - picked));
            sel[n * T + s] = (uint8_t)take;
            picked += take;
        }
    at_ctx c = {.sh = {.B = B, .T = T, .H = 2, .dn = 3, .dr = 2, .dv = 3, .ns = 2, .sel = sel},
                .lens = {9, 6}};
    double *out = check_attention(&c);
    /* a key not selected by row 8 (sequence 0) does not move row 8's output */
    int s_out = -1;
    for (int s = 0; s <= 8; s++)
        if (!sel[8 * T + s]) s_out = s;
    ck_assert_int_ge(s_out, 0);
    double out2[B * T * 2 * 3];
    c.kv[(s_out * c.sh.H + 1) * 6 + 4] += 1.0; /* its value, head 1 */
    c.kr[s_out * 2] += 1.0;                    /* and its rope key */
    at_fwd(&c, out2);
    for (int i = 0; i < 2 * 3; i++) ck_assert_double_eq(out[8 * 6 + i], out2[8 * 6 + i]);
    /* the probabilities of an unselected key are exactly 0 */
    ck_assert_double_eq(c.att[(0 * 2 + 1) * T * (2 + T) + 8 * (2 + T) + 2 + s_out], 0);
    free(out);
}
END_TEST

/* The sparse kernel (row lists, compact probabilities) on the same kind of frozen selection:
** finite differences of its forward/backward pair, with and without sinks, and the masked
** kernel's output to rounding (the double build's GEMM is not the float one's, whose bits the
** sparse kernel follows; test_model checks those bitwise). */
START_TEST(test_attention_dsa_sparse_grad)
{
    enum { B = 2, T = 9, K = 4 };
    static uint8_t sel[B * T * T];
    static int32_t idx[B * T * K];
    prl_rng r2;
    prl_rng_init(&r2, 6, 0, 0, 0, PRL_RNG_TEST);
    for (int n = 0; n < B * T; n++) /* rows t < 4 see all; later rows a pseudo-random 4 */
        for (int s = 0, t = n % T, picked = 0; s <= t; s++) {
            int take = t < K || (picked < K && (prl_rng_u64(&r2) % 2 || t - s < K - picked));
            sel[n * T + s] = (uint8_t)take;
            picked += take;
        }
    prl_attn_sel_index(idx, sel, B * T, T, K);
    ck_assert_int_eq(prl_attn_sel_count(idx + 1 * K, K), 2); /* row 1 sees tokens 0 and 1 */
    ck_assert_int_eq(prl_attn_sel_count(idx + 8 * K, K), K);
    for (int ns = 0; ns <= 2; ns += 2) {
        at_ctx c = {.sh = {.B = B,
                           .T = T,
                           .H = 2,
                           .dn = 3,
                           .dr = 2,
                           .dv = 3,
                           .ns = ns,
                           .sel_idx = idx,
                           .sel_k = K},
                    .lens = {9, 6}};
        double *out = check_attention(&c);
        double ref[B * T * 2 * 3];
        c.sh.sel_idx = NULL, c.sh.sel = sel;
        at_fwd(&c, ref);
        for (int i = 0; i < B * T * 2 * 3; i++) ck_assert_double_eq_tol(out[i], ref[i], 1e-12);
        free(out), free(c.q), free(c.kv), free(c.kr), free(c.skv), free(c.skr), free(c.att);
    }
}
END_TEST

/* A selection that keeps every causal key computes the dense attention's very bits. */
START_TEST(test_attention_dsa_full_sel_is_dense)
{
    enum { B = 1, T = 7, H = 2 };
    static uint8_t sel[B * T * T];
    memset(sel, 1, sizeof sel);
    prl_attn_shape sh = {.B = B, .T = T, .H = H, .dn = 3, .dr = 2, .dv = 3, .ns = 1};
    double *q = randv(T * H * 5, 1), *kv = randv(T * H * 6, 1), *kr = randv(T * 2, 1);
    double *skv = randv(H * 6, 1), *skr = randv(2, 1), att[H * T * (1 + T)], o1[T * H * 3],
           o2[T * H * 3];
    prl_attention_forward(o1, att, q, kv, kr, skv, skr, NULL, sh);
    sh.sel = sel;
    prl_attention_forward(o2, att, q, kv, kr, skv, skr, NULL, sh);
    ck_assert_mem_eq(o1, o2, sizeof o1);
    free(q), free(kv), free(kr), free(skv), free(skr);
}
END_TEST

typedef struct {
    double *qI, *kI, *w;
    int32_t lens[2];
    int B, T, HI, dI;
} sc_ctx;
static void sc_fwd(void *p, double *out)
{
    sc_ctx *c = p;
    prl_dsa_score_forward(out, c->qI, c->kI, c->w, c->lens, c->B, c->T, c->HI, c->dI, NULL);
}

/* Index scores: qI, kI and the head weights w. */
START_TEST(test_dsa_score_grad)
{
    sc_ctx c = {.lens = {6, 4}, .B = 2, .T = 6, .HI = 3, .dI = 4};
    int N = c.B * c.T, nq = N * c.HI * c.dI, nk = N * c.dI, nw = N * c.HI, no = N * c.T;
    c.qI = randv(nq, 1), c.kI = randv(nk, 1), c.w = randv(nw, 1);
    double *r = randv(no, 1), *out = malloc(no * 8);
    sc_fwd(&c, out);
    /* row 3 of sequence 0 by hand: Σ_j w_j ReLU(q_j·k_s / 2) */
    double want = 0;
    for (int j = 0; j < 3; j++) {
        double a = 0;
        for (int i = 0; i < 4; i++) a += c.qI[(3 * 3 + j) * 4 + i] * c.kI[1 * 4 + i];
        want += a > 0 ? c.w[3 * 3 + j] * a / 2 : 0;
    }
    ck_assert_double_eq_tol(out[3 * 6 + 1], want, 1e-12);
    ck_assert_double_eq(out[3 * 6 + 4], 0);       /* s > t */
    ck_assert_double_eq(out[(6 + 5) * 6 + 0], 0); /* past sequence 1's length */
    double *dq = calloc(nq, 8), *dk = calloc(nk, 8), *dw = calloc(nw, 8);
    prl_dsa_score_backward(dq, dk, dw, r, c.qI, c.kI, c.w, c.lens, c.B, c.T, c.HI, c.dI, NULL);
    ck_assert_double_lt(fd_error(sc_fwd, &c, c.qI, nq, dq, r, no), 1e-6);
    ck_assert_double_lt(fd_error(sc_fwd, &c, c.kI, nk, dk, r, no), 1e-6);
    ck_assert_double_lt(fd_error(sc_fwd, &c, c.w, nw, dw, r, no), 1e-6);
    free(c.qI), free(c.kI), free(c.w), free(r), free(out), free(dq), free(dk), free(dw);
}
END_TEST

typedef struct {
    double *target, *score;
    const uint8_t *sel;
    int n;
} kl_ctx;
static void kl_fwd(void *p, double *out)
{
    kl_ctx *c = p;
    out[0] = prl_dsa_kl_row_forward(c->target, c->score, c->sel, c->n);
}

/* The KL objective over all keys (dense warm-up) and over a selection (sparse stage). */
START_TEST(test_dsa_kl_grad)
{
    enum { n = 7 };
    uint8_t sel[n] = {1, 0, 1, 1, 0, 0, 1};
    double target[n] = {0.3, 0.05, 0.2, 0.1, 0.15, 0.0, 0.2}, one = 1;
    kl_ctx c = {.target = target, .score = randv(n, 1), .n = n};
    for (int k = 0; k < 2; k++) {
        c.sel = k ? sel : NULL;
        double ds[n] = {0}, kl;
        kl_fwd(&c, &kl);
        ck_assert_double_gt(kl, 0);
        prl_dsa_kl_row_backward(ds, target, c.score, c.sel, n, 1);
        ck_assert_double_lt(fd_error(kl_fwd, &c, c.score, n, ds, &one, 1), 1e-6);
        if (k) ck_assert_double_eq(ds[1], 0); /* off the support: no gradient */
    }
    /* scores proportional to log p give KL 0 */
    double lp[n];
    for (int s = 0; s < n; s++) lp[s] = log(target[s] + 1e-300) + 3;
    ck_assert_double_lt(prl_dsa_kl_row_forward(target, lp, sel, n), 1e-12);
    free(c.score);
}
END_TEST

/* Top-k: the k largest, ties to the lower index; k >= n keeps all. */
START_TEST(test_dsa_select_ties)
{
    double s[8] = {0, 2, 0, 5, 2, 0, 2, 1};
    uint8_t sel[8];
    prl_dsa_select_row(sel, s, 8, 3);
    uint8_t want[8] = {0, 1, 0, 1, 1, 0, 0, 0}; /* 5, then the 2s at 1 and 4 (not 6) */
    ck_assert_mem_eq(sel, want, 8);
    prl_dsa_select_row(sel, s, 8, 6); /* among the (ReLU) zeros, index 0 wins */
    uint8_t want6[8] = {1, 1, 0, 1, 1, 0, 1, 1};
    ck_assert_mem_eq(sel, want6, 8);
    prl_dsa_select_row(sel, s, 3, 4);
    ck_assert(sel[0] && sel[1] && sel[2]);
}
END_TEST

/* ------------------------------------------------------------------ ModAttn conv ---- */

typedef struct {
    double *inp, *w;
    int B, T, C, k, stride;
    const int32_t *pos; /* packed rows, or NULL */
} conv_ctx;
static void conv_fwd(void *p, double *out)
{
    conv_ctx *c = p;
    prl_conv_forward(out, c->inp, c->stride, c->w, c->B, c->T, c->C, c->k, c->pos);
}

START_TEST(test_conv_grad)
{
    /* 2 sequences of 6 rows, the first 4 of 7 columns (a strided slice, as for the latent) */
    conv_ctx c = {.B = 2, .T = 6, .C = 4, .k = 3, .stride = 7};
    int n_in = 12 * 7, n_out = 12 * 4;
    c.inp = randv(n_in, 1), c.w = randv(12, 1);
    double *out = malloc(n_out * 8), *r = randv(n_out, 1), *dinp = calloc(n_in, 8),
           *dw = calloc(12, 8);
    conv_fwd(&c, out);
    prl_conv_backward(dinp, c.stride, dw, r, c.inp, c.w, c.B, c.T, c.C, c.k, NULL);
    ck_assert_double_lt(fd_error(conv_fwd, &c, c.inp, n_in, dinp, r, n_out), 1e-6);
    ck_assert_double_lt(fd_error(conv_fwd, &c, c.w, 12, dw, r, n_out), 1e-6);
    /* causal, zero padding at each sequence start, residual: row 6 (sequence 1, t = 0) is its
    ** input plus w[c, k-1]·input */
    for (int ch = 0; ch < 4; ch++)
        ck_assert_double_eq_tol(out[6 * 4 + ch], c.inp[6 * 7 + ch] * (1 + c.w[ch * 3 + 2]), 1e-15);
    ck_assert_double_eq(dinp[4], 0); /* untouched columns */
    free(out), free(r), free(dinp), free(dw);
}
END_TEST

START_TEST(test_conv_packed)
{
    /* one row of 12 packing sequences of 5, 1 and 4 positions and 2 padding positions: the
    ** same outputs as the sequences one per row, and finite differences agree */
    static const int32_t pos[12] = {0, 1, 2, 3, 4, 0, 0, 1, 2, 3, -1, -1};
    conv_ctx c = {.B = 1, .T = 12, .C = 4, .k = 3, .stride = 7, .pos = pos};
    int n_in = 12 * 7, n_out = 12 * 4;
    c.inp = randv(n_in, 1), c.w = randv(12, 1);
    double *out = malloc(n_out * 8), *r = randv(n_out, 1), *dinp = calloc(n_in, 8),
           *dw = calloc(12, 8), one[4 * 5];
    conv_fwd(&c, out);
    prl_conv_backward(dinp, c.stride, dw, r, c.inp, c.w, c.B, c.T, c.C, c.k, pos);
    ck_assert_double_lt(fd_error(conv_fwd, &c, c.inp, n_in, dinp, r, n_out), 1e-6);
    ck_assert_double_lt(fd_error(conv_fwd, &c, c.w, 12, dw, r, n_out), 1e-6);
    static const int starts[3] = {0, 5, 6}, lens[3] = {5, 1, 4};
    for (int q = 0; q < 3; q++) { /* each sequence alone */
        prl_conv_forward(one, c.inp + starts[q] * 7, 7, c.w, 1, lens[q], 4, 3, NULL);
        for (int i = 0; i < lens[q] * 4; i++) ck_assert_double_eq(out[starts[q] * 4 + i], one[i]);
    }
    for (int ch = 0; ch < 4; ch++) /* a padding row reads only itself */
        ck_assert_double_eq(out[10 * 4 + ch], c.inp[10 * 7 + ch] * (1 + c.w[ch * 3 + 2]));
    free(out), free(r), free(dinp), free(dw);
}
END_TEST

/* ------------------------------------------------------------------ SwiGLU ---------- */

typedef struct {
    double *inp, *w13, *w2, *a13, *h;
    int N, C, F;
} sw_ctx;
static void sw_fwd(void *p, double *out)
{
    sw_ctx *c = p;
    prl_swiglu_forward(out, c->a13, c->h, c->inp, c->w13, c->w2, c->N, c->C, c->F, 0,
                       PRL_PRECISION_FP32);
}

START_TEST(test_swiglu_grad)
{
    sw_ctx c = {.N = 4, .C = 5, .F = 6};
    c.inp = randv(20, 1);
    c.w13 = randv(60, 1);
    c.w2 = randv(30, 1);
    c.a13 = malloc(48 * 8), c.h = malloc(24 * 8);
    double *out = malloc(20 * 8), *r = randv(20, 1);
    sw_fwd(&c, out);
    double *di = calloc(20, 8), *d13 = calloc(60, 8), *d2 = calloc(30, 8);
    double *scratch = malloc(3 * 24 * 8);
    prl_swiglu_backward(di, d13, d2, scratch, r, c.inp, c.a13, c.h, c.w13, c.w2, c.N, c.C, c.F,
                        PRL_PRECISION_FP32);
    ck_assert_double_lt(fd_error(sw_fwd, &c, c.inp, 20, di, r, 20), 1e-6);
    ck_assert_double_lt(fd_error(sw_fwd, &c, c.w13, 60, d13, r, 20), 1e-6);
    ck_assert_double_lt(fd_error(sw_fwd, &c, c.w2, 30, d2, r, 20), 1e-6);
    /* h = silu(gate) ⊙ up, checked directly */
    double g = c.a13[0], u = c.a13[6];
    ck_assert_double_eq_tol(c.h[0], g / (1 + exp(-g)) * u, 1e-15);
}
END_TEST

/* ------------------------------------------------------------------ MoE gate -------- */

typedef struct {
    double *z, s[8];
    int32_t sel[3];
    const int32_t *forced;
    int renorm;
} gate_ctx;
static void gate_fwd(void *p, double *out)
{
    gate_ctx *c = p;
    prl_moe_gate_forward(c->sel, out, c->s, c->z, NULL, c->forced, 6, 3, c->renorm, 2.5);
}

START_TEST(test_moe_gate_grad)
{
    for (int renorm = 0; renorm < 2; renorm++) {
        gate_ctx c = {.renorm = renorm};
        c.z = randv(6, 1);
        double g[3], *r = randv(3, 1), dz[6] = {0};
        gate_fwd(&c, g);
        int32_t frozen[3];
        memcpy(frozen, c.sel, sizeof frozen);
        c.forced = frozen; /* selection is a constant for the derivative */
        prl_moe_gate_backward(dz, r, c.sel, c.s, 6, 3, renorm, 2.5);
        ck_assert_double_lt(fd_error(gate_fwd, &c, c.z, 6, dz, r, 3), 1e-6);
        if (renorm) ck_assert_double_eq_tol(g[0] + g[1] + g[2], 2.5, 1e-12);
    }
    /* ties: the lower expert index wins; the bias only selects */
    double z[4] = {0, 0, 0, 0}, s[4], g[2], bias[4] = {0, 0.5, 0, 0.5};
    int32_t sel[2];
    prl_moe_gate_forward(sel, g, s, z, NULL, NULL, 4, 2, 1, 1.0);
    ck_assert_int_eq(sel[0], 0);
    ck_assert_int_eq(sel[1], 1);
    prl_moe_gate_forward(sel, g, s, z, bias, NULL, 4, 2, 1, 1.0);
    ck_assert_int_eq(sel[0], 1);
    ck_assert_int_eq(sel[1], 3);
    ck_assert_double_eq_tol(g[0], 0.5, 1e-15); /* gates from s, not s + bias */
}
END_TEST

/* Group-limited routing (noaux_tc) against a direct reading of DeepSeek-V3's Gate: 8
** experts in 4 groups of 2, the best 2 groups by the sum of their two s + b, top-3 of those;
** the gates come from s; and the derivative through the gates with the selection unchanged. */
typedef struct {
    double *z, s[8], bias[8];
    int32_t sel[3];
} ggate_ctx;
static void ggate_fwd(void *p, double *out)
{
    ggate_ctx *c = p;
    prl_moe_gate_forward_grouped(c->sel, out, c->s, c->z, c->bias, NULL, 8, 3, 4, 2, 1, 2.5);
}

START_TEST(test_moe_gate_grouped)
{
    for (int trial = 0; trial < 200; trial++) {
        ggate_ctx c;
        c.z = randv(8, 2);
        for (int e = 0; e < 8; e++) c.bias[e] = 0.3 * prl_rng_normal(&rng);
        double g[3];
        ggate_fwd(&c, g);
        /* the reference reading: group scores, the two best groups, then top-3 */
        double v[8], gs[4];
        for (int e = 0; e < 8; e++) v[e] = 1 / (1 + exp(-c.z[e])) + c.bias[e];
        for (int gi = 0; gi < 4; gi++) gs[gi] = v[2 * gi] + v[2 * gi + 1];
        int g1 = 0;
        for (int gi = 1; gi < 4; gi++) g1 = gs[gi] > gs[g1] ? gi : g1;
        int g2 = g1 == 0 ? 1 : 0;
        for (int gi = 0; gi < 4; gi++) g2 = gi != g1 && gs[gi] > gs[g2] ? gi : g2;
        int cand[4] = {2 * g1, 2 * g1 + 1, 2 * g2, 2 * g2 + 1}, used[4] = {0};
        for (int k = 0; k < 3; k++) {
            int best = -1;
            for (int i = 0; i < 4; i++)
                if (!used[i] && (best < 0 || v[cand[i]] > v[cand[best]] ||
                                 (v[cand[i]] == v[cand[best]] && cand[i] < cand[best])))
                    best = i;
            used[best] = 1;
            ck_assert_int_eq(c.sel[k], cand[best]);
        }
        if (trial < 5) { /* the gates' derivative, the selection fixed */
            int32_t frozen[3];
            memcpy(frozen, c.sel, sizeof frozen);
            double *r = randv(3, 1), dz[8] = {0};
            prl_moe_gate_backward(dz, r, c.sel, c.s, 8, 3, 1, 2.5);
            ck_assert_double_lt(fd_error(ggate_fwd, &c, c.z, 8, dz, r, 3), 1e-6);
            ck_assert_mem_eq(c.sel, frozen, sizeof frozen);
            free(r);
        }
        free(c.z);
    }
    /* ties: equal groups go to the lower group, equal experts to the lower index; a group
    ** with one strong expert loses to one with two good ones (top-2 sum, not max) */
    double z[8] = {0}, s[8], g[3], bias[8] = {0.9, -0.5, 0.3, 0.3, 0.3, 0.3, 0, 0};
    int32_t sel[3];
    prl_moe_gate_forward_grouped(sel, g, s, z, bias, NULL, 8, 3, 4, 2, 1, 1.0);
    ck_assert_int_eq(sel[0], 2); /* groups 1 and 2 (sum 1.6) beat group 0 (1.4) */
    ck_assert_int_eq(sel[1], 3);
    ck_assert_int_eq(sel[2], 4);
    /* n_group = 1 is the ungrouped gate, bit for bit */
    double s1[8], g1[3];
    int32_t sel1[3];
    prl_moe_gate_forward_grouped(sel, g, s, z, bias, NULL, 8, 3, 1, 1, 1, 1.5);
    prl_moe_gate_forward(sel1, g1, s1, z, bias, NULL, 8, 3, 1, 1.5);
    ck_assert_mem_eq(sel, sel1, sizeof sel);
    ck_assert_mem_eq(g, g1, sizeof g);
}
END_TEST

/* ------------------------------------------------------------------ log-prob -------- */

typedef struct {
    double *logits;
    int y;
    double tau;
} lp_ctx;
static void lp_fwd(void *p, double *out)
{
    lp_ctx *c = p;
    double lse;
    out[0] = prl_logprob_forward(&lse, c->logits, 9, c->y, c->tau);
}

START_TEST(test_logprob_grad)
{
    double taus[3] = {1.0, 0.7, 1.6};
    for (int i = 0; i < 3; i++) {
        lp_ctx c = {.y = 4, .tau = taus[i]};
        c.logits = randv(9, 2);
        double lse, r[1] = {-0.8}, dl[9] = {0};
        double lp = prl_logprob_forward(&lse, c.logits, 9, c.y, c.tau);
        prl_logprob_backward(dl, c.logits, lse, 9, c.y, c.tau, r[0]);
        ck_assert_double_lt(fd_error(lp_fwd, &c, c.logits, 9, dl, r, 1), 1e-6);
        double sum = 0;
        for (int v = 0; v < 9; v++) sum += exp(c.logits[v] / c.tau - lse);
        ck_assert_double_eq_tol(sum, 1.0, 1e-12);
        ck_assert_double_le(lp, 0);
    }
}
END_TEST

/* Several targets of one row, each with its own weight (the teacher's top-k of OPD): one
** pass equals the sum of single-target gradients, and matches finite differences. */
typedef struct {
    double *logits;
    int32_t ys[4];
    double tau;
} lpm_ctx;
static void lpm_fwd(void *p, double *out)
{
    lpm_ctx *c = p;
    double lse;
    for (int i = 0; i < 4; i++) out[i] = prl_logprob_forward(&lse, c->logits, 9, c->ys[i], c->tau);
}

START_TEST(test_logprob_multi_grad)
{
    double taus[2] = {1.0, 0.5};
    for (int t = 0; t < 2; t++) {
        lpm_ctx c = {.ys = {4, 0, 4, 8}, .tau = taus[t]}; /* a repeated id adds up */
        c.logits = randv(9, 2);
        double lse, r[4] = {-0.8, 0.3, -0.25, 1.1}, dl[9] = {0}, single[9] = {0};
        prl_logprob_forward(&lse, c.logits, 9, 0, c.tau);
        prl_logprob_backward_multi(dl, c.logits, lse, 9, c.ys, r, 4, c.tau);
        ck_assert_double_lt(fd_error(lpm_fwd, &c, c.logits, 9, dl, r, 4), 1e-6);
        for (int i = 0; i < 4; i++)
            prl_logprob_backward(single, c.logits, lse, 9, c.ys[i], c.tau, r[i]);
        for (int v = 0; v < 9; v++) ck_assert_double_eq_tol(dl[v], single[v], 1e-12);
    }
}
END_TEST

/* ------------------------------------------------------------------ embedding ------- */

typedef struct {
    double *table;
    int32_t tok[5];
} emb_ctx;
static void emb_fwd(void *p, double *out)
{
    emb_ctx *c = p;
    prl_embedding_forward(out, c->table, c->tok, 5, 3);
}

START_TEST(test_embedding_grad)
{
    emb_ctx c = {.tok = {2, 0, 2, 3, 1}};
    c.table = randv(12, 1);
    double *r = randv(15, 1), dt[12] = {0};
    prl_embedding_backward(dt, r, c.tok, 5, 3);
    ck_assert_double_lt(fd_error(emb_fwd, &c, c.table, 12, dt, r, 15), 1e-6);
}
END_TEST

/* ------------------------------------------------------------------ score head ------ */

typedef struct {
    double *h, *w;
    int32_t lens[3];
} sh_ctx;
static void sh_fwd(void *p, double *out)
{
    sh_ctx *c = p;
    prl_score_head_forward(out, c->h, c->w, c->lens, 3, 4, 5);
}

/* The reward head reads row b at position lens[b] − 1 only: its gradient there, 0 elsewhere. */
START_TEST(test_score_head_grad)
{
    sh_ctx c = {.lens = {4, 1, 3}};
    c.h = randv(60, 1);
    c.w = randv(5, 1);
    double *r = randv(3, 1), dh[60] = {0}, dw[5] = {0};
    prl_score_head_backward(dh, dw, r, c.h, c.w, c.lens, 3, 4, 5);
    ck_assert_double_lt(fd_error(sh_fwd, &c, c.h, 60, dh, r, 3), 1e-6);
    ck_assert_double_lt(fd_error(sh_fwd, &c, c.w, 5, dw, r, 3), 1e-6);
    for (int i = 0; i < 5; i++) ck_assert_double_eq(dh[(4 + 1) * 5 + i], 0); /* row 1, t = 1 */
    double out[3];
    prl_score_head_forward(out, c.h, c.w, NULL, 3, 4, 5); /* lens NULL: the last of T */
    ck_assert_double_eq_tol(out[1], dot(c.h + (4 + 3) * 5, c.w, 5), 1e-12);
}
END_TEST

/* ------------------------------------------------------------------ MTP input ------- */

typedef struct {
    double *e, *h, *ge, *gh, *w, *cat, rstd_e[6], rstd_h[6];
    int N, d;
} mtpin_ctx;
static void mtpin_fwd(void *p, double *out)
{
    mtpin_ctx *c = p;
    prl_mtp_input_forward(out, c->cat, c->rstd_e, c->rstd_h, c->e, c->h, c->ge, c->gh, c->w, c->N,
                          c->d, 1e-5, PRL_PRECISION_FP32);
}

/* The MTP module's own op: [enorm(e) ; hnorm(h)] · eh_projᵀ, every input and parameter. */
START_TEST(test_mtp_input_grad)
{
    mtpin_ctx c = {.N = 6, .d = 5};
    size_t Nd = 30;
    c.e = randv(Nd, 1), c.h = randv(Nd, 2), c.ge = randv(5, 1), c.gh = randv(5, 1);
    c.w = randv(50, 1), c.cat = malloc(60 * 8);
    double *out = malloc(Nd * 8), *r = randv(Nd, 1), *dcat = malloc(60 * 8);
    double *de = calloc(Nd, 8), *dh = calloc(Nd, 8), *dge = calloc(5, 8), *dgh = calloc(5, 8),
           *dw = calloc(50, 8);
    mtpin_fwd(&c, out);
    prl_mtp_input_backward(de, dh, dge, dgh, dw, dcat, r, c.cat, c.e, c.h, c.ge, c.gh, c.w,
                           c.rstd_e, c.rstd_h, c.N, c.d, PRL_PRECISION_FP32);
    ck_assert_double_lt(fd_error(mtpin_fwd, &c, c.e, Nd, de, r, Nd), 1e-6);
    ck_assert_double_lt(fd_error(mtpin_fwd, &c, c.h, Nd, dh, r, Nd), 1e-6);
    ck_assert_double_lt(fd_error(mtpin_fwd, &c, c.ge, 5, dge, r, Nd), 1e-6);
    ck_assert_double_lt(fd_error(mtpin_fwd, &c, c.gh, 5, dgh, r, Nd), 1e-6);
    ck_assert_double_lt(fd_error(mtpin_fwd, &c, c.w, 50, dw, r, Nd), 1e-6);
    /* the embedding comes first: the first d inputs of eh_proj see enorm(e) */
    ck_assert_double_eq_tol(c.cat[0], c.ge[0] * c.e[0] * c.rstd_e[0], 1e-12);
    ck_assert_double_eq_tol(c.cat[5], c.gh[0] * c.h[0] * c.rstd_h[0], 1e-12);
}
END_TEST

/* Depth-k inputs: tokens and targets shift left by k inside each row's valid length. */
START_TEST(test_mtp_shift)
{
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, -1, 5, 6, 7, 8, -1};
    float w[8] = {-1, -1, -1, -1, -2, -2, -2, -2};
    int32_t lens[2] = {4, 2}, tk[8], gk[8], lk[2];
    float wk[8];
    prl_mtp_shift(tk, gk, wk, lk, tok, tgt, w, lens, 2, 4, 1, 0.5, NULL, NULL);
    int32_t want_t[8] = {2, 3, 4, 0, 6, 0, 0, 0}, want_g[8] = {3, -1, 5, -1, 7, -1, -1, -1};
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(tk[i], want_t[i]);
        ck_assert_int_eq(gk[i], want_g[i]);
    }
    ck_assert_float_eq(wk[0], -0.5f);
    ck_assert_float_eq(wk[4], -1.0f);
    ck_assert_float_eq(wk[3], 0.0f);
    ck_assert_int_eq(lk[0], 3);
    ck_assert_int_eq(lk[1], 1);
    prl_mtp_shift(tk, gk, wk, lk, tok, tgt, w, lens, 2, 4, 3, 1, NULL, NULL);
    ck_assert_int_eq(tk[0], 4);
    ck_assert_int_eq(gk[0], 5);
    ck_assert_int_eq(tk[1], 0);
    ck_assert_int_eq(lk[1], 1); /* row 1 is too short for depth 3 */
    ck_assert_int_eq(gk[4], -1);
}
END_TEST

/* ------------------------------------------------------------------ whole model ----- */

#define MICRO_KEYS                                                                                 \
    "\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 3,"                           \
    " \"num_attention_heads\": 2, \"q_lora_rank\": 16, \"kv_lora_rank\": 16,"                      \
    " \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8,"                        \
    " \"rope_theta\": 10000.0, \"rope_interleave\": false, \"rms_norm_eps\": 1e-5,"                \
    " \"first_k_dense_replace\": 1, \"intermediate_size\": 64,"                                    \
    " \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16,"         \
    " \"n_shared_experts\": 1, \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.5,"          \
    " \"max_position_embeddings\": 12, \"initializer_range\": 0.3,"                                \
    " \"prl_balance_loss_alpha\": 0.05, \"prl_router_z_loss_coef\": 0.01"

static const char *micro_config = "{" MICRO_KEYS "}";
/* The micro config's attention blocks (spec §12.2): layers 1 and 2 slide with W = 4, two
** parameter sinks per layer, ModAttn convs with k = 3; and sinks without values, no convs. */
static const char *micro_swa_sinks_config =
    "{" MICRO_KEYS ", \"swa_layers\": [1, 2], \"sliding_window_list\": [4, 4],"
    " \"sliding_window\": 4, \"param_sink_number\": 2, \"param_sink_with_value\": true,"
    " \"use_mome\": true, \"router_sliding_window\": 3}";
/* Everything of spec §12.2 but DSA and MTP: the attention blocks above plus mHC (4 streams,
** 3 Sinkhorn iterations, γ), sandwich norms and a block post-norm after layer 0; then the
** residual blocks one at a time (plain residual with sandwich + block post-norms; mHC
** without γ). */
#define MICRO_ATTN_BLOCKS                                                                          \
    ", \"swa_layers\": [1, 2], \"sliding_window_list\": [4, 4], \"sliding_window\": 4,"            \
    " \"param_sink_number\": 2, \"param_sink_with_value\": true, \"use_mome\": true,"              \
    " \"router_sliding_window\": 3"
static const char *micro_mhc_config =
    "{" MICRO_KEYS MICRO_ATTN_BLOCKS ", \"use_mhc\": true, \"mhc_num_stream\": 4,"
    " \"mhc_recur_norm\": 3, \"mhc_use_gamma\": true, \"sandwich_norm\": true,"
    " \"block_post_layernorm_idx\": [0]}";
static const char *micro_sandwich_config =
    "{" MICRO_KEYS ", \"sandwich_norm\": true, \"block_post_layernorm_idx\": [0, 2]}";
static const char *micro_mhc_plain_config =
    "{" MICRO_KEYS ", \"use_mhc\": true, \"mhc_num_stream\": 3, \"mhc_recur_norm\": 5}";
/* MTP (spec §12.2 plus a second, chained module): two MTP layers (3 and 4) on top of the
** mHC micro config, the first sliding with W = 4, the second fully causal; MoE FFNs with
** their own shared_head.norm, and once with own shared_head.head and dense FFNs. */
static const char *micro_mtp_mhc_config =
    "{" MICRO_KEYS ", \"swa_layers\": [1, 2, 3], \"sliding_window_list\": [4, 4, 4],"
    " \"sliding_window\": 4, \"param_sink_number\": 2, \"param_sink_with_value\": true,"
    " \"use_mome\": true, \"router_sliding_window\": 3, \"use_mhc\": true,"
    " \"mhc_num_stream\": 4, \"mhc_recur_norm\": 3, \"mhc_use_gamma\": true,"
    " \"sandwich_norm\": true, \"block_post_layernorm_idx\": [0],"
    " \"num_nextn_predict_layers\": 2, \"prl_mtp_loss_weight\": 0.7}";
static const char *micro_mtp_plain_config =
    "{" MICRO_KEYS ", \"num_nextn_predict_layers\": 1, \"prl_mtp_loss_weight\": 0.5,"
    " \"prl_mtp_head\": true, \"prl_mtp_head_norm\": false}";
/* DeepSeek-V3 maths on the micro scale: interleaved RoPE with YaRN (original context 4 < the
** 12 positions, mscale_all_dim 0.7 on the softmax scale), MoE on layers 2 and 4 only
** (moe_layer_freq 2), 2 groups of 2 experts with the best group kept, and one MTP module
** (layer 4, MoE, its own router bias). */
static const char *micro_deepseek_config =
    "{\"model_type\": \"deepseek_v3\", \"vocab_size\": 64, \"hidden_size\": 32,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"num_key_value_heads\": 2,"
    " \"q_lora_rank\": 16, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8,"
    " \"qk_rope_head_dim\": 4, \"v_head_dim\": 8, \"rope_theta\": 10000.0,"
    " \"rope_interleave\": true, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0,"
    " \"original_max_position_embeddings\": 4, \"mscale\": 1.0, \"mscale_all_dim\": 0.7},"
    " \"rms_norm_eps\": 1e-5, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 2,"
    " \"intermediate_size\": 64, \"n_routed_experts\": 4, \"num_experts_per_tok\": 2,"
    " \"n_group\": 2, \"topk_group\": 1, \"topk_method\": \"noaux_tc\","
    " \"moe_intermediate_size\": 16, \"n_shared_experts\": 1, \"norm_topk_prob\": true,"
    " \"routed_scaling_factor\": 2.5, \"max_position_embeddings\": 12,"
    " \"initializer_range\": 0.3, \"prl_balance_loss_alpha\": 0.05,"
    " \"prl_router_z_loss_coef\": 0.01, \"num_nextn_predict_layers\": 1}";
/* Moonlight's attention: no query latent (q_lora_rank null: q = a·q_projᵀ), interleaved RoPE
** by the deepseek_v3 default, plain RoPE; every layer MoE after the first, a dense MTP layer
** (first_k_dense_replace 4 would make it MoE: here moe_layer_freq 3 makes layer 3 MoE, 4 not). */
static const char *micro_moonlight_config =
    "{\"model_type\": \"deepseek_v3\", \"vocab_size\": 64, \"hidden_size\": 32,"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"q_lora_rank\": null,"
    " \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4,"
    " \"v_head_dim\": 8, \"rope_theta\": 50000.0, \"rms_norm_eps\": 1e-5,"
    " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 3, \"intermediate_size\": 64,"
    " \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16,"
    " \"n_shared_experts\": 2, \"norm_topk_prob\": true, \"routed_scaling_factor\": 2.446,"
    " \"max_position_embeddings\": 12, \"initializer_range\": 0.3,"
    " \"prl_balance_loss_alpha\": 0.05, \"num_nextn_predict_layers\": 1}";
static const char *micro_sinks_no_value_config =
    "{" MICRO_KEYS ", \"swa_layers\": [2], \"sliding_window\": 3, \"param_sink_number\": 3,"
    " \"param_sink_with_value\": false}";

typedef struct model_ctx {
    prl_model m;
    prl_batch b;
} model_ctx;

static double model_objective(model_ctx *c, int index)
{
    prl_forward_stats st;
    ck_assert_int_eq(prl_model_forward(&c->m, &c->b, NULL, &st), PRL_OK);
    double score_term = 0; /* a reward model: Σ_b score_weights[b]·score[b] */
    for (int b = 0; c->b.score_weights && b < c->b.B; b++)
        score_term += c->b.score_weights[b] * prl_model_scores(&c->m)[b];
    return index ? st.index_loss : st.loss + score_term;
}

static double model_loss(model_ctx *c) { return model_objective(c, 0); }

/* The DSA indexer learns only from its own loss (and nothing else learns from it), so its
** tensors are checked against st.index_loss, every other tensor against st.loss. */
static int is_indexer(const prl_param_info *p) { return p->kind == PRL_PARAM_INDEXER; }

/* A route override from the captured routes: `partial` = 0 forces every row as captured
** (routes frozen); 1 forces every row to other experts (each id + 1 mod E, as a replay of a
** disagreeing rollout would) except rows n ≡ 1 (mod 3), which are PRL_ROUTE_NATIVE. */
static void make_override(int32_t *ov, const int32_t *captured, int n_moe, int N, int K, int E,
                          int partial)
{
    for (int i = 0; i < n_moe; i++)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                size_t at = ((size_t)i * N + n) * K + k;
                ov[at] = !partial     ? captured[at]
                         : n % 3 == 1 ? PRL_ROUTE_NATIVE
                                      : (captured[at] + 1) % E;
            }
}

/* FD check of the whole model on a micro config: a few random elements of every tensor and
** one random direction over all parameters, MoE routes frozen (partial = 0) or partly forced
** to other experts and partly native (partial = 1, see make_override). */
static int grad_with_mtp;   /* set around a check: the batch runs the MTP modules */
static int grad_with_extra; /* set around a check: 3 extra targets per target position */
static int grad_with_pack;  /* set around a check: packed rows (prl_batch.pos): row 0 holds
                            ** sequences of 5 and 7, row 1 of 4 and 4 with a padding position
                            ** between them */

static double check_model_grad_cfg(const prl_config *cfg, int partial)
{
    model_ctx c;
    ck_assert_int_eq(prl_model_init(&c.m, cfg), PRL_OK);
    prl_model_init_weights(&c.m, 7);
    /* non-trivial norm gains and a selection bias, so every path is exercised */
    for (int i = 0; i < c.m.n_tensors; i++)
        if (c.m.tensors[i].kind == PRL_PARAM_NORM)
            for (size_t j = 0; j < c.m.tensors[i].numel; j++)
                c.m.params[c.m.tensors[i].offset + j] = 1 + 0.3 * prl_rng_normal(&rng);
        else if (c.m.tensors[i].kind == PRL_PARAM_CONV) /* init 0 is the identity: perturb */
            for (size_t j = 0; j < c.m.tensors[i].numel; j++)
                c.m.params[c.m.tensors[i].offset + j] = 0.3 * prl_rng_normal(&rng);
        else if (c.m.tensors[i].kind == PRL_PARAM_MHC && c.m.tensors[i].ndim == 1)
            /* α = 0.01 and b_res = −8 off the diagonal leave the Sinkhorn paths nearly flat */
            for (size_t j = 0; j < c.m.tensors[i].numel; j++)
                c.m.params[c.m.tensors[i].offset + j] = 0.5 * prl_rng_normal(&rng);
    for (int i = 0; i < c.m.n_moe_all * 4; i++) c.m.router_bias[i] = 0.1 * prl_rng_normal(&rng);
    enum { B = 2, T = 12 };
    int32_t tokens[B * T], targets[B * T], lens[B] = {12, 9};
    float weights[B * T];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)(prl_rng_u64(&rng) % 64);
        targets[i] = i % 5 == 0 ? -1 : (int32_t)(prl_rng_u64(&rng) % 64);
        weights[i] = (float)(-0.1 * (1 + prl_rng_uniform(&rng)));
    }
    c.b = (prl_batch){.B = B,
                      .T = T,
                      .tokens = tokens,
                      .lens = lens,
                      .targets = targets,
                      .weights = weights,
                      .temperature = 0.9,
                      .with_mtp = grad_with_mtp};
    int32_t extra_ids[B * T * 3];
    float extra_w[B * T * 3];
    for (int i = 0; i < B * T * 3; i++) { /* some slots empty (-1), and none off a target */
        int has = targets[i / 3] >= 0 && i % 7 != 3;
        extra_ids[i] = has ? (int32_t)(prl_rng_u64(&rng) % 64) : -1;
        extra_w[i] = (float)(-0.2 * prl_rng_uniform(&rng));
    }
    if (grad_with_extra)
        c.b.n_extra = 3, c.b.extra_targets = extra_ids, c.b.extra_weights = extra_w;
    static const int32_t pos[B * T] = {0, 1, 2, 3, 4,  0, 1, 2, 3, 4,  5,  6,
                                       0, 1, 2, 3, -1, 0, 1, 2, 3, -1, -1, -1};
    if (grad_with_pack) c.b.pos = pos;
    float score_w[B] = {0.7f, -1.3f}; /* a reward model's pair: chosen and rejected rows */
    if (c.m.cfg.score_head) c.b.score_weights = score_w;
    /* freeze routes: capture them, then always force them (or the partial override) */
    model_loss(&c);
    size_t nr = (size_t)c.m.n_moe * B * T * 2;
    int32_t *routes = malloc(nr * sizeof *routes);
    make_override(routes, prl_model_routes(&c.m), c.m.n_moe, B * T, 2, 4, partial);
    c.b.route_override = routes;
    c.m.dsa_keep_selection = 1; /* DSA top-k frozen as captured by the first forward */
    double base = model_loss(&c);
    if (partial) { /* forced rows took the override; native rows are a top-2 of 4 */
        const int32_t *got = prl_model_routes(&c.m);
        for (size_t i = 0; i < nr; i++)
            if (routes[i] != PRL_ROUTE_NATIVE) ck_assert_int_eq(got[i], routes[i]);
            else ck_assert(got[i] >= 0 && got[i] < 4);
    }
    prl_model_zero_grad(&c.m);
    ck_assert_int_eq(prl_model_backward(&c.m, &c.b), PRL_OK);
    double worst = 0;
    int checked = 0;
    const double eps = 1e-6;
    for (int i = 0; i < c.m.n_tensors; i++) {
        const prl_param_info *p = &c.m.tensors[i];
        /* a few elements per tensor, chosen at random */
        for (int k = 0; k < 4; k++) {
            size_t j = p->offset + prl_rng_u64(&rng) % p->numel;
            double keep = c.m.params[j];
            c.m.params[j] = keep + eps;
            double lp = model_objective(&c, is_indexer(p));
            c.m.params[j] = keep - eps;
            double lm = model_objective(&c, is_indexer(p));
            c.m.params[j] = keep;
            double num = (lp - lm) / (2 * eps), ana = c.m.grads[j];
            double err = fabs(num - ana) / fmax(1e-3, fabs(num) + fabs(ana));
            if (err > worst) worst = err;
            if (err > 1e-5)
                fprintf(stderr, "grad mismatch %s[%zu]: analytic %.10g numeric %.10g\n", p->name,
                        j - p->offset, ana, num);
            checked++;
        }
    }
    fprintf(stderr, "model FD: %d elements, worst relative error %.3g (loss %.6f)\n", checked,
            worst, base);
    ck_assert_double_lt(worst, 1e-5);
    /* random direction over all parameters at once (the indexer's apart, when there is one) */
    double *dir = randv(c.m.n_params, 1.0), *keep = malloc(c.m.n_params * sizeof *keep);
    memcpy(keep, c.m.params, c.m.n_params * sizeof *keep);
    for (int index = 0; index < 1 + (c.m.cfg.n_dsa_layers > 0); index++) {
        double *d = malloc(c.m.n_params * sizeof *d);
        for (int i = 0; i < c.m.n_tensors; i++) {
            const prl_param_info *p = &c.m.tensors[i];
            for (size_t j = p->offset; j < p->offset + p->numel; j++)
                d[j] = is_indexer(p) == index ? dir[j] : 0;
        }
        for (size_t j = 0; j < c.m.n_params; j++) c.m.params[j] = keep[j] + eps * d[j];
        double lp = model_objective(&c, index);
        for (size_t j = 0; j < c.m.n_params; j++) c.m.params[j] = keep[j] - eps * d[j];
        double lm = model_objective(&c, index);
        memcpy(c.m.params, keep, c.m.n_params * sizeof *keep);
        double num = (lp - lm) / (2 * eps), ana = dot(c.m.grads, d, c.m.n_params);
        ck_assert_msg(fabs(num - ana) / fabs(num) < 1e-6,
                      "direction %s: analytic %.10g numeric "
                      "%.10g",
                      index ? "indexer" : "model", ana, num);
        free(d);
    }
    /* the router learns through the gates even when routes are forced */
    char router_name[64];
    snprintf(router_name, sizeof router_name, "model.layers.%d.mlp.gate.weight",
             prl_config_moe_layer(&c.m.cfg, 0));
    const prl_param_info *router = prl_model_find(&c.m, router_name);
    ck_assert_ptr_nonnull(router);
    double gnorm = 0;
    for (size_t j = 0; j < router->numel; j++) gnorm += fabs(c.m.grads[router->offset + j]);
    ck_assert_double_gt(gnorm, 0);
    free(dir);
    free(keep);
    free(routes);
    prl_model_free(&c.m);
    return worst;
}

static void check_model_grad_mode(const char *config, int partial)
{
    prl_config cfg;
    ck_assert_msg(prl_config_parse(&cfg, config, "micro") == PRL_OK, "%s", prl_error_message());
    check_model_grad_cfg(&cfg, partial);
}

static void check_model_grad(const char *config) { check_model_grad_mode(config, 0); }

/* The micro config of spec §12.2 with DSA on layer 0 (2 index heads × 8 dims, top-4), SWA on
** layers 1 and 2, sinks and convs: the sparse stage (selection frozen) and the dense warm-up. */
#define MICRO_DSA_KEYS                                                                             \
    MICRO_KEYS ", \"dsa_layers\": [0], \"index_topk\": 4, \"index_n_heads\": 2,"                   \
               " \"index_head_dim\": 8, \"swa_layers\": [1, 2], \"sliding_window_list\": [4, 4],"  \
               " \"sliding_window\": 4, \"param_sink_number\": 2, \"use_mome\": true,"             \
               " \"router_sliding_window\": 3"
static const char *micro_dsa_config = "{" MICRO_DSA_KEYS "}";
static const char *micro_dsa_dense_config = "{" MICRO_DSA_KEYS ", \"prl_dsa_stage\": \"dense\"}";
/* spec §12.2 whole (but MTP): DSA with mHC, sandwich norms and a block post-norm */
static const char *micro_dsa_mhc_config =
    "{" MICRO_DSA_KEYS ", \"use_mhc\": true, \"mhc_num_stream\": 4, \"mhc_recur_norm\": 3,"
    " \"mhc_use_gamma\": true, \"sandwich_norm\": true, \"block_post_layernorm_idx\": [0]}";

START_TEST(test_model_grad_dsa)
{
    check_model_grad(micro_dsa_config);
    check_model_grad(micro_dsa_dense_config);
    check_model_grad(micro_dsa_mhc_config);
}
END_TEST

/* Every block at once: configs/models/micro-pangu.json is spec §12.2 as written (DSA on layer
** 0 top-4 of 12, SWA W = 4 on layers 1 and 2, 2 sinks with values, ModAttn k = 3, mHC 4
** streams × 3 Sinkhorn iterations with γ, sandwich norms, block post-norm after layer 0, one
** MTP layer). Only the test's own knobs change, as in MICRO_KEYS: weights drawn at 0.3 rather
** than 0.02 (so φ, sinks and every product are far from zero) and both auxiliary MoE losses on
** so their gradients are checked too. The MTP modules run (with_mtp). */
START_TEST(test_model_grad_pangu)
{
    prl_config cfg;
    ck_assert_msg(prl_config_load(&cfg, PRL_SOURCE_DIR "/configs/models/micro-pangu.json") ==
                      PRL_OK,
                  "%s", prl_error_message());
    ck_assert(cfg.n_dsa_layers == 1 && cfg.n_swa_layers == 2 && cfg.param_sink_number == 2 &&
              cfg.use_mome && cfg.use_mhc && cfg.sandwich_norm &&
              cfg.n_block_post_layernorm_idx == 1 && cfg.num_nextn_predict_layers == 1);
    cfg.initializer_range = 0.3;
    cfg.balance_loss_alpha = 0.05, cfg.router_z_loss_coef = 0.01;
    grad_with_mtp = 1;
    double worst = check_model_grad_cfg(&cfg, 0);
    grad_with_mtp = 0;
    fprintf(stderr, "micro-pangu.json (all blocks): worst FD relative error %.3g\n", worst);
}
END_TEST

/* The same on packed rows (docs/model.md "Packed sequences"): every block restarts at each
** sequence boundary, and the gradient of that forward is still its exact derivative. */
START_TEST(test_model_grad_pangu_packed)
{
    prl_config cfg;
    ck_assert_int_eq(prl_config_load(&cfg, PRL_SOURCE_DIR "/configs/models/micro-pangu.json"),
                     PRL_OK);
    cfg.initializer_range = 0.3;
    cfg.balance_loss_alpha = 0.05, cfg.router_z_loss_coef = 0.01;
    grad_with_mtp = 1, grad_with_pack = 1;
    double worst = check_model_grad_cfg(&cfg, 0);
    grad_with_mtp = 0, grad_with_pack = 0;
    fprintf(stderr, "micro-pangu.json packed rows: worst FD relative error %.3g\n", worst);
}
END_TEST

/* The indexer's loss moves only the indexer; the LM loss never reaches it. With the main
** model frozen, the backward fills the indexer's gradient alone. */
START_TEST(test_dsa_gradient_separation)
{
    for (int freeze = 0; freeze < 2; freeze++) {
        prl_config cfg;
        prl_model m;
        ck_assert_int_eq(prl_config_parse(&cfg, micro_dsa_dense_config, "micro"), PRL_OK);
        cfg.dsa_freeze_main = freeze;
        ck_assert_int_eq(prl_model_init(&m, &cfg), PRL_OK);
        prl_model_init_weights(&m, 9);
        int32_t tok[12], tgt[12];
        float wts[12];
        for (int i = 0; i < 12; i++)
            tok[i] = (int32_t)(i * 7 % 64), tgt[i] = (i * 3 + 1) % 64, wts[i] = -0.1f;
        prl_batch b =
            {.B = 1, .T = 12, .tokens = tok, .targets = tgt, .weights = wts, .temperature = 1};
        prl_forward_stats st;
        ck_assert_int_eq(prl_model_forward(&m, &b, NULL, &st), PRL_OK);
        ck_assert_double_gt(st.index_loss, 0);
        prl_model_zero_grad(&m);
        ck_assert_int_eq(prl_model_backward(&m, &b), PRL_OK);
        double g_ix = 0, g_main = 0;
        for (int i = 0; i < m.n_tensors; i++)
            for (size_t j = 0; j < m.tensors[i].numel; j++)
                *(is_indexer(&m.tensors[i]) ? &g_ix : &g_main) +=
                    fabs(m.grads[m.tensors[i].offset + j]);
        ck_assert_double_gt(g_ix, 0);
        if (freeze) ck_assert_double_eq(g_main, 0);
        else ck_assert_double_gt(g_main, 0);
        prl_model_free(&m);
    }
}
END_TEST

START_TEST(test_model_grad) { check_model_grad(micro_config); }
END_TEST

/* Extra weighted targets per position (OPD's top-k distillation term) in the loss. */
/* A reward model (score head on the last token of each row, rows of lengths 12 and 9): the
** head's weight and, through it, every tensor below it. */
START_TEST(test_model_grad_score_head)
{
    check_model_grad("{" MICRO_KEYS ", \"architectures\": "
                     "[\"OpenPanguV2ForSequenceClassification\"], \"num_labels\": 1}");
}
END_TEST

START_TEST(test_model_grad_extra_targets)
{
    grad_with_extra = 1;
    check_model_grad(micro_config);
    grad_with_extra = 0;
}
END_TEST

/* prl_model_topk: at each target position the k most likely ids, most likely first, with
** the log-probs the forward gives those ids as targets; -1 / 0 where no target; bad k named. */
START_TEST(test_model_topk)
{
    prl_config cfg;
    ck_assert_msg(prl_config_parse(&cfg, micro_config, "micro") == PRL_OK, "%s",
                  prl_error_message());
    prl_model m;
    ck_assert_int_eq(prl_model_init(&m, &cfg), PRL_OK);
    prl_model_init_weights(&m, 3);
    enum { B = 2, T = 6, K = 5 };
    int32_t tokens[B * T], targets[B * T], lens[B] = {6, 4}, ids[B * T * K], probe[B * T];
    float lp[B * T * K], got[B * T];
    for (int i = 0; i < B * T; i++)
        tokens[i] = (int32_t)(prl_rng_u64(&rng) % 64), targets[i] = i % 4 == 1 ? -1 : 0;
    prl_batch b =
        {.B = B, .T = T, .tokens = tokens, .lens = lens, .targets = targets, .temperature = 0.7};
    ck_assert_int_eq(prl_model_logprobs(&m, &b, NULL), PRL_OK);
    ck_assert_int_eq(prl_model_topk(&m, &b, K, ids, lp), PRL_OK);
    int V = cfg.vocab_size, n_target = 0;
    for (int n = 0; n < B * T; n++) {
        int has = targets[n] >= 0 && n % T < lens[n / T];
        n_target += has;
        for (int i = 0; i < K; i++) {
            if (!has) {
                ck_assert_int_eq(ids[n * K + i], -1);
                ck_assert(lp[n * K + i] == 0);
                continue;
            }
            ck_assert(ids[n * K + i] >= 0 && ids[n * K + i] < V);
            if (i) ck_assert(lp[n * K + i] <= lp[n * K + i - 1]);
        }
        if (!has) continue;
        const prl_real *row =
            prl_model_logits(&m) + (size_t)n * V; /* nothing outside beats the k-th */
        for (int v = 0, in; v < V; v++) {
            in = 0;
            for (int i = 0; i < K; i++) in |= ids[n * K + i] == v;
            if (!in) ck_assert(row[v] <= row[ids[n * K + K - 1]]);
        }
    }
    ck_assert_int_gt(n_target, 0);
    for (int i = 0; i < K; i++) { /* the log-prob of the i-th id, asked as a target */
        for (int n = 0; n < B * T; n++) probe[n] = targets[n] >= 0 ? ids[n * K + i] : -1;
        for (int n = 0; n < B * T; n++) probe[n] = probe[n] < 0 && targets[n] >= 0 ? 0 : probe[n];
        prl_batch pb = b;
        pb.targets = probe;
        ck_assert_int_eq(prl_model_logprobs(&m, &pb, got), PRL_OK);
        for (int n = 0; n < B * T; n++)
            if (targets[n] >= 0 && n % T < lens[n / T])
                ck_assert_msg(fabsf(got[n] - lp[n * K + i]) < 1e-5f,
                              "position %d rank %d: %g vs %g", n, i, lp[n * K + i], got[n]);
    }
    /* equal logits (a zero head): the lower ids first, each log-prob −log V */
    const prl_param_info *head = prl_model_find(&m, "lm_head.weight");
    ck_assert_ptr_nonnull(head);
    memset(m.params + head->offset, 0, head->numel * sizeof *m.params);
    ck_assert_int_eq(prl_model_logprobs(&m, &b, NULL), PRL_OK);
    ck_assert_int_eq(prl_model_topk(&m, &b, K, ids, lp), PRL_OK);
    for (int i = 0; i < K; i++) {
        ck_assert_int_eq(ids[i], i);
        ck_assert_double_eq_tol(lp[i], -log((double)V), 1e-5);
    }
    ck_assert_int_eq(prl_model_topk(&m, &b, 0, ids, lp), PRL_ERR_ARG);
    ck_assert_int_eq(prl_model_topk(&m, &b, V + 1, ids, lp), PRL_ERR_ARG);
    prl_batch other = b;
    other.T = T - 1;
    ck_assert_int_eq(prl_model_topk(&m, &other, K, ids, lp), PRL_ERR_ARG);
    prl_model_free(&m);
}
END_TEST

/* Routing replay: forced rows that disagree with the router, native rows between them. */
START_TEST(test_model_grad_partial_override) { check_model_grad_mode(micro_config, 1); }
END_TEST

/* A native row must be whole; an id out of range is rejected. */
START_TEST(test_override_rows_validated)
{
    prl_config cfg;
    prl_model m;
    ck_assert_int_eq(prl_config_parse(&cfg, micro_config, "micro"), PRL_OK);
    ck_assert_int_eq(prl_model_init(&m, &cfg), PRL_OK);
    prl_model_init_weights(&m, 5);
    int32_t tok[4] = {1, 2, 3, 4}, ov[2 * 4 * 2];
    for (int i = 0; i < 2 * 4 * 2; i++) ov[i] = PRL_ROUTE_NATIVE;
    ck_assert_int_eq(m.n_moe, 2);
    prl_batch b = {.B = 1, .T = 4, .tokens = tok, .temperature = 1, .route_override = ov};
    float lp[4];
    ck_assert_int_eq(prl_model_logprobs(&m, &b, lp), PRL_OK); /* all native */
    ov[5] = 2; /* row 2: {-1, 2} is neither native nor forced */
    ck_assert_int_eq(prl_model_logprobs(&m, &b, lp), PRL_ERR_RANGE);
    ov[4] = 1, ov[5] = 4; /* expert 4 of 4 */
    ck_assert_int_eq(prl_model_logprobs(&m, &b, lp), PRL_ERR_RANGE);
    ov[5] = 3;
    ck_assert_int_eq(prl_model_logprobs(&m, &b, lp), PRL_OK);
    ck_assert_int_eq(prl_model_routes(&m)[4], 1);
    ck_assert_int_eq(prl_model_routes(&m)[5], 3);
    prl_model_free(&m);
}
END_TEST

START_TEST(test_model_grad_swa_sinks)
{
    check_model_grad(micro_swa_sinks_config);
    check_model_grad(micro_sinks_no_value_config);
}
END_TEST

/* mHC with sandwich and block post-norms on top of every attention block; then the residual
** blocks apart. */
START_TEST(test_model_grad_mhc) { check_model_grad(micro_mhc_config); }
END_TEST

START_TEST(test_model_grad_residual_blocks)
{
    check_model_grad(micro_sandwich_config);
    check_model_grad(micro_mhc_plain_config);
}
END_TEST

/* The whole micro model with MTP on (mHC, sandwich, SWA, sinks, convs in the trunk; two
** chained MTP modules), and a plain trunk with one dense MTP layer with its own head. */
START_TEST(test_model_grad_mtp)
{
    grad_with_mtp = 1;
    check_model_grad(micro_mtp_mhc_config);
    check_model_grad(micro_mtp_plain_config);
    grad_with_mtp = 0;
}
END_TEST

START_TEST(test_model_grad_deepseek)
{
    prl_config c;
    ck_assert_int_eq(prl_config_parse(&c, micro_deepseek_config, "micro"), PRL_OK);
    ck_assert_int_eq(prl_config_moe_layers(&c), 1); /* layer 2; the MTP layer 4 is the other */
    ck_assert_int_eq(prl_config_moe_layers_all(&c), 2);
    grad_with_mtp = 1;
    check_model_grad(micro_deepseek_config);
    assert_ok(prl_config_parse(&c, micro_moonlight_config, "micro"));
    ck_assert_int_eq(c.q_lora_rank, 0);
    ck_assert_int_eq(c.rope_interleave, 1);
    ck_assert_int_eq(prl_config_moe_layers_all(&c), 1); /* layer 3 */
    check_model_grad(micro_moonlight_config);
    grad_with_mtp = 0;
}
END_TEST

/* The MTP modules alone: the gradient they add (grads with MTP − grads without) is the
** derivative of the reported mtp_loss, through the modules into the trunk, the shared
** embedding and the head. Without with_mtp the MTP tensors get no gradient. */
START_TEST(test_mtp_module_grad)
{
    prl_config cfg;
    prl_model m;
    ck_assert_int_eq(prl_config_parse(&cfg, micro_mtp_mhc_config, "micro"), PRL_OK);
    cfg.balance_loss_alpha = cfg.router_z_loss_coef = 0; /* the MTP layers' own aux losses
                                                           ** would add to the difference */
    ck_assert_int_eq(prl_model_init(&m, &cfg), PRL_OK);
    prl_model_init_weights(&m, 11);
    for (int i = 0; i < m.n_tensors; i++)
        if (m.tensors[i].kind == PRL_PARAM_NORM || m.tensors[i].kind == PRL_PARAM_CONV)
            for (size_t j = 0; j < m.tensors[i].numel; j++)
                m.params[m.tensors[i].offset + j] += 0.3 * prl_rng_normal(&rng);
    enum { B = 2, T = 12 };
    int32_t tokens[B * T], targets[B * T], lens[B] = {12, 8};
    float weights[B * T];
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int32_t)(prl_rng_u64(&rng) % 64);
        targets[i] = i % 7 == 3 ? -1 : (int32_t)(prl_rng_u64(&rng) % 64);
        weights[i] = -1.0f / 20;
    }
    prl_batch b = {.B = B,
                   .T = T,
                   .tokens = tokens,
                   .lens = lens,
                   .targets = targets,
                   .weights = weights,
                   .temperature = 1};
    prl_forward_stats st;
    double *g0 = malloc(m.n_params * sizeof *g0);
    prl_model_zero_grad(&m);
    ck_assert_int_eq(prl_model_forward(&m, &b, NULL, &st), PRL_OK);
    ck_assert_double_eq(st.mtp_loss, 0);
    ck_assert_int_eq(prl_model_backward(&m, &b), PRL_OK);
    memcpy(g0, m.grads, m.n_params * sizeof *g0);
    const prl_param_info *eh = prl_model_find(&m, "model.layers.3.eh_proj.weight");
    ck_assert_ptr_nonnull(eh);
    ck_assert_ptr_nonnull(prl_model_find(&m, "model.layers.4.shared_head.norm.weight"));
    ck_assert_ptr_null(prl_model_find(&m, "model.layers.3.attn_mhc_module.phi.weight"));
    ck_assert_ptr_null(prl_model_find(&m, "model.layers.3.self_attn.qa_conv.weight"));
    for (size_t j = 0; j < eh->numel; j++) ck_assert_double_eq(g0[eh->offset + j], 0);
    b.with_mtp = 1;
    prl_model_zero_grad(&m);
    ck_assert_int_eq(prl_model_forward(&m, &b, NULL, &st), PRL_OK);
    ck_assert_double_gt(st.mtp_loss, 0); /* Σ w·logp with w < 0: a cross-entropy */
    ck_assert_double_eq_tol(st.loss, st.lm_loss + st.balance_loss + st.z_loss + st.mtp_loss, 1e-12);
    ck_assert_int_eq(prl_model_backward(&m, &b), PRL_OK);
    for (size_t j = 0; j < m.n_params; j++) m.grads[j] -= g0[j]; /* the MTP part */
    /* FD of mtp_loss over a random direction, and per element on some tensors */
    const double eps = 1e-6;
    double *dir = randv(m.n_params, 1.0), *keep = malloc(m.n_params * sizeof *keep);
    memcpy(keep, m.params, m.n_params * sizeof *keep);
    double lp, lm;
    for (size_t j = 0; j < m.n_params; j++) m.params[j] = keep[j] + eps * dir[j];
    prl_model_forward(&m, &b, NULL, &st), lp = st.mtp_loss;
    for (size_t j = 0; j < m.n_params; j++) m.params[j] = keep[j] - eps * dir[j];
    prl_model_forward(&m, &b, NULL, &st), lm = st.mtp_loss;
    memcpy(m.params, keep, m.n_params * sizeof *keep);
    double num = (lp - lm) / (2 * eps), ana = dot(m.grads, dir, m.n_params);
    fprintf(stderr, "MTP alone: direction numeric %.10g analytic %.10g\n", num, ana);
    ck_assert_double_lt(fabs(num - ana) / fabs(num), 1e-6);
    const char *names[] = {"model.embed_tokens.weight",
                           "model.layers.0.self_attn.q_a_proj.weight",
                           "model.merge_mhc_module.phi.weight",
                           "lm_head.weight",
                           "model.layers.3.eh_proj.weight",
                           "model.layers.3.enorm.weight",
                           "model.layers.4.hnorm.weight",
                           "model.layers.4.mlp.gate.weight",
                           "model.layers.3.self_attn.param_sink_k_pe"};
    double worst = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const prl_param_info *p = prl_model_find(&m, names[i]);
        ck_assert_msg(p != NULL, "%s", names[i]);
        double gsum = 0;
        for (int r = 0; r < 6; r++) {
            size_t j = p->offset + prl_rng_u64(&rng) % p->numel;
            m.params[j] = keep[j] + eps;
            prl_model_forward(&m, &b, NULL, &st), lp = st.mtp_loss;
            m.params[j] = keep[j] - eps;
            prl_model_forward(&m, &b, NULL, &st), lm = st.mtp_loss;
            m.params[j] = keep[j];
            double n_ = (lp - lm) / (2 * eps), a_ = m.grads[j];
            double err = fabs(n_ - a_) / fmax(1e-3, fabs(n_) + fabs(a_));
            if (err > 1e-5)
                fprintf(stderr, "MTP grad %s: analytic %.10g numeric %.10g\n", names[i], a_, n_);
            worst = fmax(worst, err);
        }
        for (size_t j = 0; j < p->numel; j++) gsum += fabs(m.grads[p->offset + j]);
        ck_assert_msg(gsum > 0, "%s gets no MTP gradient", names[i]);
    }
    ck_assert_double_lt(worst, 1e-5);
    free(dir), free(keep), free(g0);
    prl_model_free(&m);
}
END_TEST

/* Bad MTP configs name the key. */
START_TEST(test_mtp_config_errors)
{
    prl_config cfg;
    ck_assert_int_eq(
        prl_config_parse(&cfg, "{" MICRO_KEYS ", \"num_nextn_predict_layers\": -1}", "x"),
        PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "num_nextn_predict_layers"));
    ck_assert_int_eq(prl_config_parse(&cfg, "{" MICRO_KEYS ", \"prl_mtp_loss_weight\": -0.1}", "x"),
                     PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "prl_mtp_loss_weight"));
    ck_assert_int_eq(prl_config_parse(&cfg,
                                      "{" MICRO_KEYS ", \"swa_layers\": [3],"
                                      " \"sliding_window\": 4}",
                                      "x"),
                     PRL_ERR_CONFIG);
    ck_assert_int_eq(prl_config_parse(&cfg,
                                      "{" MICRO_KEYS ", \"swa_layers\": [3],"
                                      " \"sliding_window\": 4, \"num_nextn_predict_layers\": 1}",
                                      "x"),
                     PRL_OK);
    ck_assert_int_eq(prl_config_window(&cfg, 3), 4);
}
END_TEST

/* Padding positions must not influence anything at valid positions. */
START_TEST(test_padding_is_inert)
{
    const char *configs[] = {micro_config, micro_swa_sinks_config, micro_mhc_config};
    for (int k = 0; k < 3; k++) {
        prl_config cfg;
        prl_model m;
        ck_assert_int_eq(prl_config_parse(&cfg, configs[k], "micro"), PRL_OK);
        ck_assert_int_eq(prl_model_init(&m, &cfg), PRL_OK);
        prl_model_init_weights(&m, 3);
        int32_t tok[12], tgt[12], len = 7;
        for (int i = 0; i < 12; i++) tok[i] = (int32_t)(i * 5 % 64), tgt[i] = (i + 1) % 64;
        float lp1[12], lp2[12];
        prl_batch b =
            {.B = 1, .T = 12, .tokens = tok, .lens = &len, .targets = tgt, .temperature = 1};
        ck_assert_int_eq(prl_model_logprobs(&m, &b, lp1), PRL_OK);
        for (int i = 7; i < 12; i++) tok[i] = 63 - i;
        ck_assert_int_eq(prl_model_logprobs(&m, &b, lp2), PRL_OK);
        for (int i = 0; i < 7; i++) ck_assert_double_eq(lp1[i], lp2[i]);
        for (int i = 7; i < 12; i++) ck_assert_double_eq(lp2[i], 0);
        prl_model_free(&m);
    }
}
END_TEST

static Suite *grad_suite(void)
{
    Suite *s = suite_create("grad");
    TCase *ops = tcase_create("ops");
    tcase_add_test(ops, test_matmul_grad);
    tcase_add_test(ops, test_score_head_grad);
    tcase_add_test(ops, test_rmsnorm_grad);
    tcase_add_test(ops, test_rope_grad);
    tcase_add_test(ops, test_rope_interleave_yarn_grad);
    tcase_add_test(ops, test_moe_gate_grouped);
    tcase_add_test(ops, test_attention_grad);
    tcase_add_test(ops, test_attention_scale_grad);
    tcase_add_test(ops, test_attention_blocks_grad);
    tcase_add_test(ops, test_attention_window_sinks_grad);
    tcase_add_test(ops, test_swiglu_grad);
    tcase_add_test(ops, test_conv_grad);
    tcase_add_test(ops, test_conv_packed);
    tcase_add_test(ops, test_moe_gate_grad);
    tcase_add_test(ops, test_logprob_grad);
    tcase_add_test(ops, test_logprob_multi_grad);
    tcase_add_test(ops, test_embedding_grad);
    tcase_add_test(ops, test_mtp_input_grad);
    tcase_add_test(ops, test_mtp_shift);
    tcase_add_test(ops, test_sinkhorn_grad);
    tcase_add_test(ops, test_hc_pre_post_grad);
    tcase_add_test(ops, test_mhc_site_grad);
    tcase_add_test(ops, test_mhc_merge_head_grad);
    tcase_add_test(ops, test_attention_dsa_sel_grad);
    tcase_add_test(ops, test_attention_dsa_full_sel_is_dense);
    tcase_add_test(ops, test_attention_dsa_sparse_grad);
    tcase_add_test(ops, test_dsa_score_grad);
    tcase_add_test(ops, test_dsa_kl_grad);
    tcase_add_test(ops, test_dsa_select_ties);
    suite_add_tcase(s, ops);
    TCase *slow = tcase_create("ops_long");
    tcase_set_timeout(slow, 120);
    tcase_add_test(slow, test_attention_window_blocks_grad);
    suite_add_tcase(s, slow);
    TCase *model = tcase_create("model");
    tcase_set_timeout(model, 300);
    tcase_add_test(model, test_model_grad);
    tcase_add_test(model, test_model_grad_extra_targets);
    tcase_add_test(model, test_model_grad_score_head);
    tcase_add_test(model, test_model_topk);
    tcase_add_test(model, test_model_grad_partial_override);
    tcase_add_test(model, test_override_rows_validated);
    tcase_add_test(model, test_model_grad_swa_sinks);
    tcase_add_test(model, test_model_grad_mhc);
    tcase_add_test(model, test_model_grad_residual_blocks);
    tcase_add_test(model, test_padding_is_inert);
    tcase_add_test(model, test_model_grad_mtp);
    tcase_add_test(model, test_model_grad_deepseek);
    tcase_add_test(model, test_mtp_module_grad);
    tcase_add_test(model, test_mtp_config_errors);
    tcase_add_test(model, test_model_grad_dsa);
    tcase_add_test(model, test_dsa_gradient_separation);
    suite_add_tcase(s, model);
    TCase *pangu = tcase_create("pangu"); /* CK_RUN_CASE=pangu runs it alone */
    tcase_set_timeout(pangu, 300);
    tcase_add_test(pangu, test_model_grad_pangu);
    tcase_add_test(pangu, test_model_grad_pangu_packed);
    suite_add_tcase(s, pangu);
    return s;
}

int main(void)
{
    prl_rng_init(&rng, 1234, 0, 0, 0, PRL_RNG_TEST);
    if (prl_blas_init(0) != PRL_OK) return 1;
    return check_run(grad_suite());
}
