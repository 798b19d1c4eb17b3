/*
** mhc.c — mHC hyper-connections: Sinkhorn, the coefficient heads, hc_pre, hc_post and a
** whole site (norm + φ + heads), each a forward/backward pair (engine/mhc.h has the maths).
**
** It does not know the model's layout: model_residual.c (train path) and infer_forward.c
** (infer path) call the same functions, so the aligned infer preset gives the train path's
** bits. Per-token work runs over fixed row blocks (prl_parallel_rows); sums over tokens (α, β
** gradients) are taken serially in token order.
*/
#include "engine/mhc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAXN = PRL_MHC_MAX_STREAMS, MAXN2 = PRL_MHC_MAX_STREAMS * PRL_MHC_MAX_STREAMS };

int prl_mhc_width(prl_mhc_shape s) { return s.full ? s.n * s.n + 2 * s.n : s.n; }

int prl_mhc_states(prl_mhc_shape s) { return s.full ? 2 * s.it : 0; }

static prl_real sigmoid(prl_real z) { return 1 / (1 + PRL_EXP(-z)); }

/* ------------------------------------------------------------------ Sinkhorn -------- */

/* P = softmax of each row of R (n×n). */
static void softmax_rows(prl_real *P, const prl_real *R, int n)
{
    for (int i = 0; i < n; i++) {
        const prl_real *r = R + i * n;
        prl_real mx = r[0];
        for (int j = 1; j < n; j++) mx = r[j] > mx ? r[j] : mx;
        double sum = 0;
        for (int j = 0; j < n; j++) sum += P[i * n + j] = PRL_EXP(r[j] - mx);
        for (int j = 0; j < n; j++) P[i * n + j] = P[i * n + j] / (prl_real)sum;
    }
}

/* The divisor of row (cols = 0) or column (cols = 1) k of M: Σ + ε, summed in index order. */
static prl_real line_denom(const prl_real *M, int n, int k, int cols)
{
    double s = 0;
    for (int j = 0; j < n; j++) s += cols ? M[j * n + k] : M[k * n + j];
    return (prl_real)(s + PRL_MHC_SINKHORN_EPS);
}

/* Step `step` >= 1 of Sinkhorn normalises columns when odd, rows when even. */
static int step_is_cols(int step) { return step % 2 == 1; }

void prl_sinkhorn_forward(prl_real *S, const prl_real *R, int n, int it)
{
    /* R (n,n); S (2·it, n, n) */
    int n2 = n * n;
    softmax_rows(S, R, n);
    for (int k = 0; k < n2; k++) S[k] = S[k] + (prl_real)PRL_MHC_SINKHORN_EPS;
    for (int step = 1; step < 2 * it; step++) {
        const prl_real *in = S + (size_t)(step - 1) * n2;
        prl_real *out = S + (size_t)step * n2;
        int cols = step_is_cols(step);
        prl_real den[MAXN];
        for (int k = 0; k < n; k++) den[k] = line_denom(in, n, k, cols);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) out[i * n + j] = in[i * n + j] / den[cols ? j : i];
    }
}

void prl_sinkhorn_backward(prl_real *dR, const prl_real *dH, const prl_real *S, const prl_real *R,
                           int n, int it)
{
    /* Y = M/(s+ε) per line: dM = dY/(s+ε) − (Σ_line dY·M)/(s+ε)²; then the softmax. */
    int n2 = n * n;
    prl_real G[MAXN2], Gin[MAXN2];
    memcpy(G, dH, (size_t)n2 * sizeof *G);
    for (int step = 2 * it - 1; step >= 1; step--) {
        const prl_real *in = S + (size_t)(step - 1) * n2;
        int cols = step_is_cols(step);
        for (int k = 0; k < n; k++) {
            prl_real den = line_denom(in, n, k, cols);
            double dot = 0;
            for (int j = 0; j < n; j++) {
                int at = cols ? j * n + k : k * n + j;
                dot += (double)G[at] * in[at];
            }
            prl_real corr = (prl_real)(dot / ((double)den * den));
            for (int j = 0; j < n; j++) {
                int at = cols ? j * n + k : k * n + j;
                Gin[at] = G[at] / den - corr;
            }
        }
        memcpy(G, Gin, (size_t)n2 * sizeof *G);
    }
    prl_real P[MAXN2];
    softmax_rows(P, R, n);
    for (int i = 0; i < n; i++) {
        double dot = 0;
        for (int j = 0; j < n; j++) dot += (double)P[i * n + j] * G[i * n + j];
        for (int j = 0; j < n; j++) dR[i * n + j] += P[i * n + j] * (G[i * n + j] - (prl_real)dot);
    }
}

/* ------------------------------------------------------------------ coefficients ---- */

typedef struct coef_ctx {
    prl_real *pre, *post, *S, *dz;
    const prl_real *m, *alpha, *beta, *dpre, *dpost, *dH;
    prl_mhc_shape s;
} coef_ctx;

static void coef_forward_rows(void *p, int r0, int r1)
{
    coef_ctx *c = p;
    int n = c->s.n, n2 = n * n, M = prl_mhc_width(c->s), ns = prl_mhc_states(c->s);
    for (int t = r0; t < r1; t++) {
        const prl_real *m = c->m + (size_t)t * M;
        for (int i = 0; i < n; i++)
            c->pre[(size_t)t * n + i] =
                sigmoid(c->alpha[0] * m[i] + c->beta[i]) + (prl_real)PRL_MHC_PRE_EPS;
        if (!c->s.full) continue;
        for (int i = 0; i < n; i++)
            c->post[(size_t)t * n + i] = 2 * sigmoid(c->alpha[1] * m[n + i] + c->beta[n + i]);
        prl_real R[MAXN2];
        for (int k = 0; k < n2; k++) R[k] = c->alpha[2] * m[2 * n + k] + c->beta[2 * n + k];
        prl_sinkhorn_forward(c->S + (size_t)t * ns * n2, R, n, c->s.it);
    }
}

void prl_mhc_coef_forward(prl_real *pre, prl_real *post, prl_real *S, const prl_real *m,
                          const prl_real *alpha, const prl_real *beta, prl_mhc_shape s)
{
    /* m (N,M) → pre (N,n); full: post (N,n), S (N, 2it, n, n) */
    coef_ctx c = {.pre = pre, .post = post, .S = S, .m = m, .alpha = alpha, .beta = beta, .s = s};
    prl_parallel_rows(s.N, coef_forward_rows, &c);
}

/* dz (N,M): the gradient of each head's pre-activation z = α·m + b. */
static void coef_backward_rows(void *p, int r0, int r1)
{
    coef_ctx *c = p;
    int n = c->s.n, n2 = n * n, M = prl_mhc_width(c->s), ns = prl_mhc_states(c->s);
    for (int t = r0; t < r1; t++) {
        const prl_real *m = c->m + (size_t)t * M;
        prl_real *dz = c->dz + (size_t)t * M;
        for (int i = 0; i < n; i++) {
            prl_real sg = sigmoid(c->alpha[0] * m[i] + c->beta[i]);
            dz[i] = c->dpre[(size_t)t * n + i] * sg * (1 - sg);
        }
        if (!c->s.full) continue;
        for (int i = 0; i < n; i++) {
            prl_real sg = sigmoid(c->alpha[1] * m[n + i] + c->beta[n + i]);
            dz[n + i] = c->dpost[(size_t)t * n + i] * 2 * sg * (1 - sg);
        }
        prl_real R[MAXN2];
        for (int k = 0; k < n2; k++) {
            R[k] = c->alpha[2] * m[2 * n + k] + c->beta[2 * n + k];
            dz[2 * n + k] = 0;
        }
        prl_sinkhorn_backward(dz + 2 * n, c->dH + (size_t)t * n2, c->S + (size_t)t * ns * n2, R, n,
                              c->s.it);
    }
}

/* The head (0 pre, 1 post, 2 res) coefficient k belongs to. */
static int head_of(int k, int n) { return k < n ? 0 : k < 2 * n ? 1 : 2; }

void prl_mhc_coef_backward(prl_real *dm, prl_real *dalpha, prl_real *dbeta, prl_real *scratch,
                           const prl_real *dpre, const prl_real *dpost, const prl_real *dH,
                           const prl_real *m, const prl_real *S, const prl_real *alpha,
                           const prl_real *beta, prl_mhc_shape s)
{
    /* dz (N,M) per token; dm += α·dz; dβ += Σ_t dz; dα_head += Σ_t Σ_k∈head dz·m */
    int M = prl_mhc_width(s), n = s.n;
    coef_ctx c = {.dz = scratch,
                  .m = m,
                  .S = (prl_real *)S,
                  .alpha = alpha,
                  .beta = beta,
                  .dpre = dpre,
                  .dpost = dpost,
                  .dH = dH,
                  .s = s};
    prl_parallel_rows(s.N, coef_backward_rows, &c);
    double da[3] = {0, 0, 0};
    double *db = calloc((size_t)M, sizeof *db);
    PRL_ASSERT(db != NULL);
    for (int t = 0; t < s.N; t++)
        for (int k = 0; k < M; k++) {
            size_t at = (size_t)t * M + k;
            int h = head_of(k, n);
            da[h] += (double)scratch[at] * m[at];
            db[k] += scratch[at];
            dm[at] += alpha[h] * scratch[at];
        }
    for (int h = 0; h < (s.full ? 3 : 1); h++) dalpha[h] += (prl_real)da[h];
    for (int k = 0; k < M; k++) dbeta[k] += (prl_real)db[k];
    free(db);
}

/* ------------------------------------------------------------------ stream mixing --- */

/* Σ_k a[k]·b[k] in double over four fixed lanes (k mod 4), combined in lane order: the lanes
** are independent chains, so the loop is not bound by one chain's add latency, and the
** order never changes. */
static double dot4(const prl_real *a, const prl_real *b, int n)
{
    double l[4] = {0, 0, 0, 0};
    int k = 0;
    for (; k + 4 <= n; k += 4)
        for (int j = 0; j < 4; j++) l[j] += (double)a[k + j] * b[k + j];
    for (; k < n; k++) l[k % 4] += (double)a[k] * b[k];
    return (l[0] + l[1]) + (l[2] + l[3]);
}

typedef struct mix_ctx {
    prl_real *out, *dX, *dpre, *dF, *dpost, *dH;
    const prl_real *X, *F, *coef, *post, *H, *dout;
    int h_stride;
    prl_mhc_shape s;
} mix_ctx;

static void pre_forward_rows(void *p, int r0, int r1)
{
    mix_ctx *c = p;
    int n = c->s.n, d = c->s.d;
    for (int t = r0; t < r1; t++) {
        prl_real *y = c->out + (size_t)t * d;
        const prl_real *X = c->X + (size_t)t * n * d, *pre = c->coef + (size_t)t * n;
        for (int k = 0; k < d; k++) y[k] = pre[0] * X[k];
        for (int i = 1; i < n; i++)
            for (int k = 0; k < d; k++) y[k] += pre[i] * X[(size_t)i * d + k];
    }
}

void prl_mhc_pre_forward(prl_real *x_in, const prl_real *X, const prl_real *pre, prl_mhc_shape s)
{
    /* X (N, n, d), pre (N, n) → x_in (N, d) */
    mix_ctx c = {.out = x_in, .X = X, .coef = pre, .s = s};
    prl_parallel_rows(s.N, pre_forward_rows, &c);
}

static void pre_backward_rows(void *p, int r0, int r1)
{
    mix_ctx *c = p;
    int n = c->s.n, d = c->s.d;
    for (int t = r0; t < r1; t++) {
        const prl_real *dy = c->dout + (size_t)t * d, *X = c->X + (size_t)t * n * d;
        prl_real *dX = c->dX + (size_t)t * n * d;
        for (int i = 0; i < n; i++) {
            prl_real w = c->coef[(size_t)t * n + i];
            for (int k = 0; k < d; k++) dX[(size_t)i * d + k] += w * dy[k];
            c->dpre[(size_t)t * n + i] += (prl_real)dot4(dy, X + (size_t)i * d, d);
        }
    }
}

void prl_mhc_pre_backward(prl_real *dX, prl_real *dpre, const prl_real *dx_in, const prl_real *X,
                          const prl_real *pre, prl_mhc_shape s)
{
    /* dx_in (N, d) → dX (N, n, d), dpre (N, n) */
    mix_ctx c = {.dX = dX, .dpre = dpre, .dout = dx_in, .X = X, .coef = pre, .s = s};
    prl_parallel_rows(s.N, pre_backward_rows, &c);
}

static void post_forward_rows(void *p, int r0, int r1)
{
    mix_ctx *c = p;
    int n = c->s.n, d = c->s.d;
    for (int t = r0; t < r1; t++) {
        const prl_real *F = c->F + (size_t)t * d, *X = c->X + (size_t)t * n * d;
        const prl_real *H = c->H + (size_t)t * c->h_stride, *post = c->post + (size_t)t * n;
        for (int j = 0; j < n; j++) {
            prl_real *y = c->out + ((size_t)t * n + j) * d;
            for (int k = 0; k < d; k++) y[k] = post[j] * F[k];
            for (int i = 0; i < n; i++)
                for (int k = 0; k < d; k++) y[k] += H[i * n + j] * X[(size_t)i * d + k];
        }
    }
}

void prl_mhc_post_forward(prl_real *Xo, const prl_real *F, const prl_real *X, const prl_real *post,
                          const prl_real *H, int h_stride, prl_mhc_shape s)
{
    /* F (N, d), X (N, n, d), post (N, n), H (N, n, n) → Xo (N, n, d) */
    mix_ctx c = {.out = Xo, .F = F, .X = X, .post = post, .H = H, .h_stride = h_stride, .s = s};
    prl_parallel_rows(s.N, post_forward_rows, &c);
}

static void post_backward_rows(void *p, int r0, int r1)
{
    mix_ctx *c = p;
    int n = c->s.n, d = c->s.d;
    for (int t = r0; t < r1; t++) {
        const prl_real *F = c->F + (size_t)t * d, *X = c->X + (size_t)t * n * d;
        const prl_real *dY = c->dout + (size_t)t * n * d;
        const prl_real *H = c->H + (size_t)t * c->h_stride, *post = c->post + (size_t)t * n;
        prl_real *dF = c->dF + (size_t)t * d, *dX = c->dX + (size_t)t * n * d;
        for (int j = 0; j < n; j++) {
            const prl_real *dy = dY + (size_t)j * d;
            for (int k = 0; k < d; k++) dF[k] += post[j] * dy[k];
            c->dpost[(size_t)t * n + j] += (prl_real)dot4(dy, F, d);
        }
        for (int i = 0; i < n; i++) {
            prl_real *dx = dX + (size_t)i * d;
            const prl_real *x = X + (size_t)i * d;
            for (int j = 0; j < n; j++) {
                const prl_real *dy = dY + (size_t)j * d;
                prl_real h = H[i * n + j];
                for (int k = 0; k < d; k++) dx[k] += h * dy[k];
                c->dH[(size_t)t * n * n + i * n + j] += (prl_real)dot4(dy, x, d);
            }
        }
    }
}

void prl_mhc_post_backward(prl_real *dF, prl_real *dX, prl_real *dpost, prl_real *dH,
                           const prl_real *dXo, const prl_real *F, const prl_real *X,
                           const prl_real *post, const prl_real *H, int h_stride, prl_mhc_shape s)
{
    /* dXo (N, n, d) → dF (N, d), dX (N, n, d), dpost (N, n), dH (N, n, n) */
    mix_ctx c = {.dF = dF,
                 .dX = dX,
                 .dpost = dpost,
                 .dH = dH,
                 .dout = dXo,
                 .F = F,
                 .X = X,
                 .post = post,
                 .H = H,
                 .h_stride = h_stride,
                 .s = s};
    prl_parallel_rows(s.N, post_backward_rows, &c);
}

/* ------------------------------------------------------------------ a whole site ---- */

void prl_mhc_site_forward(prl_mhc_saved *sv, const prl_real *X, const prl_mhc_params *p, double eps,
                          prl_mhc_shape s, prl_precision prec)
{
    /* X (N, n·d) → h (N, n·d), rstd (N), m (N, M), pre, post, S */
    int nd = s.n * s.d, M = prl_mhc_width(s);
    prl_rmsnorm_forward(sv->h, sv->rstd, X, p->gamma, s.N, nd, nd, nd, eps);
    prl_round_reals(prec, sv->h, (size_t)s.N * nd);
    prl_matmul_forward(sv->m, sv->h, p->phi, s.N, nd, M, 0);
    prl_round_reals(prec, sv->m, (size_t)s.N * M);
    prl_mhc_coef_forward(sv->pre, sv->post, sv->S, sv->m, p->alpha, p->beta, s);
}

size_t prl_mhc_site_scratch(prl_mhc_shape s)
{
    /* dm and dz (N, M), dh (N, n·d) */
    return (size_t)s.N * (2 * (size_t)prl_mhc_width(s) + (size_t)s.n * s.d);
}

void prl_mhc_site_backward(prl_real *dX, const prl_mhc_grads *g, prl_real *scratch,
                           const prl_real *dpre, const prl_real *dpost, const prl_real *dH,
                           const prl_mhc_saved *sv, const prl_real *X, const prl_mhc_params *p,
                           prl_mhc_shape s, prl_precision prec)
{
    int nd = s.n * s.d, M = prl_mhc_width(s);
    prl_real *dm = scratch, *dz = dm + (size_t)s.N * M, *dh = dz + (size_t)s.N * M;
    memset(dm, 0, (size_t)s.N * M * sizeof *dm);
    memset(dh, 0, (size_t)s.N * nd * sizeof *dh);
    prl_mhc_coef_backward(dm, g->dalpha, g->dbeta, dz, dpre, dpost, dH, sv->m, sv->S, p->alpha,
                          p->beta, s);
    prl_round_reals(prec, dm, (size_t)s.N * M);
    prl_matmul_backward(dh, g->dphi, dm, sv->h, p->phi, s.N, nd, M);
    prl_round_reals(prec, dh, (size_t)s.N * nd);
    prl_rmsnorm_backward(dX, g->dgamma, dh, X, p->gamma, sv->rstd, s.N, nd, nd, nd);
}

/* ------------------------------------------------------------------ initialisation -- */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int prl_mhc_init_tensor(const char *name, prl_real *w, size_t numel, int n)
{
    /* b_pre = logit(1/n) makes the read-out the streams' mean (= the embedding at init);
    ** with one stream logit(1) is infinite, so 8 (σ ≈ 1) stands in. */
    prl_real b_pre = n > 1 ? (prl_real)-log((double)(n - 1)) : 8;
    if (ends_with(name, "branch_alpha") || ends_with(name, "branch_alpha_pre")) {
        for (size_t k = 0; k < numel; k++) w[k] = (prl_real)0.01;
        return 1;
    }
    if (ends_with(name, "branch_beta_pre")) {
        for (size_t k = 0; k < numel; k++) w[k] = b_pre;
        return 1;
    }
    if (ends_with(name, "branch_beta")) { /* [pre (n) | post (n) | res (n×n)]: H ≈ I */
        for (size_t k = 0; k < numel; k++) {
            int r = (int)k - 2 * n;
            w[k] = (int)k < n ? b_pre : r < 0 ? 0 : r / n == r % n ? 0 : -8;
        }
        return 1;
    }
    return 0;
}
