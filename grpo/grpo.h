/*
** grpo.h — the one public header of grpo/: the GRPO objective as plain functions on arrays.
**
** What it computes (shared/spec/rl.md §1, following verl's core_algos):
**   - group-relative advantages from outcome rewards (GRPO: mean/std with ε added to the
**     unbiased std; Dr.GRPO: mean only; the singleton-group rule of the project);
**   - the per-token PPO clipped surrogate with clip-higher (ε_low, ε_high) and dual clip (c);
**   - the loss aggregation modes (token-mean default, token-sum, seq-mean-token-mean,
**     seq-mean-token-sum, seq-mean-token-sum-norm with a fixed H);
**   - for the hand-written backward, the weight of every token: w_t = ∂loss/∂log π_new(t). The
**     engine's train path takes exactly these as prl_batch.weights (its loss is Σ w·logp), so
**     one forward + backward gives ∂loss/∂θ.
** Everything is computed in double in a fixed order (deterministic, thread-free). Advantages
** are constants (no gradient flows through them).
**
** Ownership: every array is the caller's; functions write only their outputs.
*/
#ifndef PRL_GRPO_H
#define PRL_GRPO_H

#include "engine/engine.h"

/* ---------------------------------------------------------------- advantages ------- */

typedef enum prl_grpo_adv_norm {
    PRL_GRPO_NORM_STD = 0,  /* A = (r − mean) / (std + ε), std unbiased (GRPO) */
    PRL_GRPO_NORM_NONE = 1  /* A = r − mean (Dr.GRPO) */
} prl_grpo_adv_norm;

typedef enum prl_grpo_singleton {
    PRL_GRPO_SINGLETON_ZERO = 0, /* a group of one gets A = 0 (project default) */
    PRL_GRPO_SINGLETON_VERL = 1, /* verl's fallback: mean 0, std 1 → A ≈ r */
    PRL_GRPO_SINGLETON_DROP = 2  /* the sample is dropped (keep[i] = 0) */
} prl_grpo_singleton;

typedef struct prl_grpo_adv_stats {
    int groups, singletons, constant_groups; /* constant: all rewards equal (A = 0) */
} prl_grpo_adv_stats;

/* adv[i] for n samples with rewards[i] and group ids group[i] (any order; groups are formed
** over the whole array). keep[i] (may be NULL unless singleton mode is DROP) is set to 0 for
** dropped samples, 1 otherwise. eps > 0 (verl: 1e-6). Errors: n < 0, eps <= 0, a non-finite
** reward (PRL_ERR_ARG naming the sample). */
prl_status prl_grpo_advantages(double *adv, int *keep, const double *rewards,
                               const int64_t *group, int n, prl_grpo_adv_norm norm, double eps,
                               prl_grpo_singleton singleton, prl_grpo_adv_stats *stats);

/* ---------------------------------------------------------------- policy loss ------ */

typedef enum prl_grpo_agg {
    PRL_GRPO_AGG_TOKEN_MEAN = 0,
    PRL_GRPO_AGG_TOKEN_SUM = 1,
    PRL_GRPO_AGG_SEQ_MEAN_TOKEN_MEAN = 2,
    PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM = 3,
    PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM_NORM = 4 /* needs loss_scale_factor H > 0 */
} prl_grpo_agg;

typedef struct prl_grpo_loss_config {
    double clip_low;           /* ε_low, default 0.2 */
    double clip_high;          /* ε_high, default 0.28 (DAPO clip-higher) */
    double clip_c;             /* dual-clip c > 1, default 3; 0 disables the dual clip */
    prl_grpo_agg agg;          /* default token-mean */
    double loss_scale_factor;  /* H of seq-mean-token-sum-norm */
} prl_grpo_loss_config;

void prl_grpo_loss_config_default(prl_grpo_loss_config *c);
/* Errors name the field: clip_low not in [0, 1), clip_high < 0, clip_c in (0, 1], agg unknown,
** H <= 0 with seq-mean-token-sum-norm. */
prl_status prl_grpo_loss_config_check(const prl_grpo_loss_config *c);
/* "token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
** "seq-mean-token-sum-norm" ↔ enum; parse errors list the choices. */
const char *prl_grpo_agg_name(prl_grpo_agg a);
prl_status prl_grpo_agg_parse(const char *s, prl_grpo_agg *out);

/* One token: the clipped surrogate L and ∂L/∂lp_new (A, lp_old constants). */
double prl_grpo_token_loss(double lp_new, double lp_old, double adv,
                           const prl_grpo_loss_config *c, double *dloss_dlp);

typedef struct prl_grpo_loss_stats {
    double loss;          /* the aggregated loss */
    double clipfrac;      /* share of valid tokens with the ratio clip above (L2 > L1) */
    double clipfrac_lower;/* share where the dual clip bounds the loss (A < 0) */
    double ppo_kl;        /* mean of lp_old − lp_new over valid tokens */
    int tokens, sequences;/* valid tokens; sequences with at least one */
} prl_grpo_loss_stats;

/* The aggregated loss of a batch of B sequences × T positions (row-major [B·T] arrays):
** mask[i] = 1 for response tokens that carry loss, adv[b] per sequence, optional token weights
** iw[i] (mismatch correction, detached; NULL = 1). Writes w[i] = ∂loss/∂lp_new[i] (0 off the
** mask) for the engine's backward. */
prl_status prl_grpo_loss(const prl_grpo_loss_config *c, const float *lp_new, const float *lp_old,
                         const double *adv, const uint8_t *mask, const float *iw, int B, int T,
                         float *w, prl_grpo_loss_stats *stats);

#endif /* PRL_GRPO_H */
