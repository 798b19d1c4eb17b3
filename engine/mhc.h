/*
** mhc.h — mHC (manifold-constrained hyper-connections) as forward/backward op pairs
** (private to engine/ and tests; the maths is docs/model.md "mHC", spec/model.md §7).
**
** The residual is n streams per token, X [N, n·d] (stream i of token t at X + t·n·d + i·d).
** A site (two per decoder layer, one merge head before the final norm) computes, per token,
**   h   = RMSNorm(vec(X); γ, rms_norm_eps)                          [n·d]
**   m   = φ · h                                                       [M]
**   pre = σ(α_pre·m[0:n] + b_pre) + 1e-6,  post = 2σ(α_post·m[n:2n] + b_post)
**   H   = Sinkhorn(α_res·mat(m[2n:]) + mat(b_res))                   [n×n]
** with M = n² + 2n (a sublayer site) or M = n (the merge head: pre only). The sublayer reads
** x_in = Σ_i pre_i·X_i (prl_mhc_pre_*) and its output F goes back into the streams as
** X'_j = post_j·F + Σ_i H[i,j]·X_i (prl_mhc_post_*).
**
** Like ops.h: outputs first, `d`-prefixed gradients, every backward ACCUMULATES (+=).
** Per-token work runs over fixed row blocks, parameter gradients are summed over tokens in
** token order, so results do not depend on the thread count.
*/
#ifndef PRL_MHC_H
#define PRL_MHC_H

#include "engine/ops.h"

/* The 1e-6 the spec adds to pre (HF port, merge head included) and the ε of Sinkhorn. */
#define PRL_MHC_PRE_EPS 1e-6
#define PRL_MHC_SINKHORN_EPS 1e-6

/* N tokens, n streams of width d, `it` Sinkhorn iterations; full = 1 for a sublayer site
** (pre, post and H), 0 for the merge head (pre only). */
typedef struct prl_mhc_shape {
    int N, n, d, it, full;
} prl_mhc_shape;

/* Coefficients per token: M = n² + 2n (full) or n. */
int prl_mhc_width(prl_mhc_shape s);
/* Sinkhorn states kept per token for the backward: 2·it matrices of n×n (the last is H). */
int prl_mhc_states(prl_mhc_shape s);

/* Sinkhorn of one n×n matrix R (row i, column j) with `it` iterations, the spec's order:
**   S_0 = softmax_row(R) + ε;  S_1 = S_0 / (colsum + ε);
**   then it−1 times: row step S/(rowsum + ε), column step S/(colsum + ε).
** S [2·it][n·n] receives every state; H = S[2·it − 1]. */
void prl_sinkhorn_forward(prl_real *S, const prl_real *R, int n, int it);
/* dR[n·n] += ∂/∂R given dH (through every iteration; S and R from the forward). */
void prl_sinkhorn_backward(prl_real *dR, const prl_real *dH, const prl_real *S, const prl_real *R,
                           int n, int it);

/* The coefficient heads from m [N, M]: pre [N, n]; full: post [N, n] and the Sinkhorn
** states S [N, states·n²] (H of token t at S + (t·states + states − 1)·n²). alpha [3] (merge
** head: [1]) = α_pre, α_post, α_res; beta [M] = b_pre, b_post, b_res (row-major n×n). */
void prl_mhc_coef_forward(prl_real *pre, prl_real *post, prl_real *S, const prl_real *m,
                          const prl_real *alpha, const prl_real *beta, prl_mhc_shape s);
/* dm [N, M] += ∂/∂m; dalpha, dbeta accumulate (summed over tokens in order) given dpre,
** dpost [N, n] and dH [N, n²] (dpost, dH unused for the merge head). scratch: N·M reals. */
void prl_mhc_coef_backward(prl_real *dm, prl_real *dalpha, prl_real *dbeta, prl_real *scratch,
                           const prl_real *dpre, const prl_real *dpost, const prl_real *dH,
                           const prl_real *m, const prl_real *S, const prl_real *alpha,
                           const prl_real *beta, prl_mhc_shape s);

/* hc_pre: x_in [N, d] = Σ_i pre[t, i]·X_i  (streams in order). */
void prl_mhc_pre_forward(prl_real *x_in, const prl_real *X, const prl_real *pre, prl_mhc_shape s);
/* dX [N, n·d] += pre_i·dx_in;  dpre [N, n] += dx_in·X_i. */
void prl_mhc_pre_backward(prl_real *dX, prl_real *dpre, const prl_real *dx_in, const prl_real *X,
                          const prl_real *pre, prl_mhc_shape s);

/* hc_post: Xo_j = post_j·F + Σ_i H[i,j]·X_i  (Xo, X [N, n·d], F [N, d]; H of token t at
** H + t·h_stride, n×n row-major). Xo must not alias X. */
void prl_mhc_post_forward(prl_real *Xo, const prl_real *F, const prl_real *X, const prl_real *post,
                          const prl_real *H, int h_stride, prl_mhc_shape s);
/* dF += Σ_j post_j·dXo_j;  dX_i += Σ_j H[i,j]·dXo_j;  dpost_j += dXo_j·F;
** dH [N, n²] (stride n²) += dXo_j·X_i. */
void prl_mhc_post_backward(prl_real *dF, prl_real *dX, prl_real *dpost, prl_real *dH,
                           const prl_real *dXo, const prl_real *F, const prl_real *X,
                           const prl_real *post, const prl_real *H, int h_stride, prl_mhc_shape s);

/* What a site's forward keeps for its backward (buffers owned by the caller):
** h [N, n·d] the normalised streams, rstd [N], m [N, M], pre [N, n], post [N, n] and
** S [N, states·n²] (post and S only for a full site). */
typedef struct prl_mhc_saved {
    prl_real *h, *rstd, *m, *pre, *post, *S;
} prl_mhc_saved;

/* A site's parameters: phi [M, n·d], gamma [n·d] (a vector of ones when mhc_use_gamma is
** off), alpha, beta as in prl_mhc_coef_forward. */
typedef struct prl_mhc_params {
    const prl_real *phi, *gamma, *alpha, *beta;
} prl_mhc_params;

/* Parameter gradients of a site (dgamma may point at scratch when γ is not a parameter). */
typedef struct prl_mhc_grads {
    prl_real *dphi, *dgamma, *dalpha, *dbeta;
} prl_mhc_grads;

/* The whole coefficient computation of a site from the streams X: norm, φ, heads. In a
** reduced precision `prec` the norm's output h and φ's output m are rounded, as the infer
** path's site rounds them (op outputs); the coefficients pre, post and the Sinkhorn states
** stay fp32, like the MoE gates (docs/engine.md "Train precision"). */
void prl_mhc_site_forward(prl_mhc_saved *sv, const prl_real *X, const prl_mhc_params *p, double eps,
                          prl_mhc_shape s, prl_precision prec);
/* dX [N, n·d] += the coefficient path's gradient; parameter gradients accumulate; given
** dpre, dpost, dH (as prl_mhc_coef_backward). scratch: prl_mhc_site_scratch(s) reals. In a
** reduced precision the gradients of m and h are rounded, the forward's rounding points. */
void prl_mhc_site_backward(prl_real *dX, const prl_mhc_grads *g, prl_real *scratch,
                           const prl_real *dpre, const prl_real *dpost, const prl_real *dH,
                           const prl_mhc_saved *sv, const prl_real *X, const prl_mhc_params *p,
                           prl_mhc_shape s, prl_precision prec);
size_t prl_mhc_site_scratch(prl_mhc_shape s);

/* Initial value of an mHC tensor other than phi (spec §7.4): branch_alpha* 0.01, b_pre =
** logit(1/n), b_post = 0, b_res 0 on the diagonal and −8 off it. `name` is the checkpoint
** name; returns 1 when it set w[0..numel), 0 for phi (drawn like any matrix). */
int prl_mhc_init_tensor(const char *name, prl_real *w, size_t numel, int n);

#endif /* PRL_MHC_H */
