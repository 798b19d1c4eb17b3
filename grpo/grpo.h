/*
** grpo.h — the one public header of grpo/: the GRPO objective as plain functions on arrays.
**
** What it computes (shared/spec/rl.md §1, following verl's core_algos):
**   - group-relative advantages from outcome rewards (GRPO: mean/std with ε added to the
**     unbiased std; Dr.GRPO: mean only; RLOO: the leave-one-out mean as the baseline; the
**     singleton-group rule of the project);
**   - the per-token PPO clipped surrogate with clip-higher (ε_low, ε_high) and dual clip (c),
**     and GSPO's: the same surrogate on the sequence's geometric-mean ratio;
**   - the loss aggregation modes (token-mean default, token-sum, seq-mean-token-mean,
**     seq-mean-token-sum, seq-mean-token-sum-norm with a fixed H);
**   - the train–infer mismatch corrections of rl.md §2 (TIS, MIS, IcePop, KPop, decoupled or
**     bypass, the denominator after masking, the PCC-driven strict/loose setting) and the
**     per-step mismatch metrics of rl.md §6 (mismatch.c);
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

struct prl_job_config;

/* ---------------------------------------------------------------- advantages ------- */

typedef enum prl_grpo_adv_norm {
    PRL_GRPO_NORM_STD = 0, /* A = (r − mean) / (std + ε), std unbiased (GRPO) */
    PRL_GRPO_NORM_NONE = 1 /* A = r − mean (Dr.GRPO) */
} prl_grpo_adv_norm;

typedef enum prl_grpo_baseline {
    PRL_GRPO_BASELINE_GROUP = 0, /* baseline: the group mean m (GRPO, Dr.GRPO) */
    PRL_GRPO_BASELINE_RLOO = 1   /* baseline: the mean of the group's other samples (RLOO):
                           ** r_i − (Σ_j r_j − r_i)/(k − 1) = k/(k − 1)·(r_i − m) */
} prl_grpo_baseline;

typedef enum prl_grpo_singleton {
    PRL_GRPO_SINGLETON_ZERO = 0, /* a group of one gets A = 0 (project default) */
    PRL_GRPO_SINGLETON_VERL = 1, /* verl's fallback: mean 0, std 1 → A ≈ r */
    PRL_GRPO_SINGLETON_DROP = 2  /* the sample is dropped (keep[i] = 0) */
} prl_grpo_singleton;

typedef struct prl_grpo_adv_stats {
    int groups, singletons, constant_groups; /* constant: all rewards equal (A = 0) */
} prl_grpo_adv_stats;

/* adv[i] for n samples with rewards[i] and group ids group[i] (any order; groups are formed
** over the whole array). est picks the baseline, norm the scale (NORM_STD divides either
** estimator's difference by the group's unbiased std + eps). keep[i] (may be NULL unless
** singleton mode is DROP) is set to 0 for dropped samples, 1 otherwise. eps > 0 (verl:
** 1e-6). Errors: n < 0, eps <= 0, an unknown estimator, a non-finite reward (PRL_ERR_ARG
** naming the sample). */
prl_status prl_grpo_advantages(double *adv, int *keep, const double *rewards, const int64_t *group,
                               int n, prl_grpo_baseline est, prl_grpo_adv_norm norm, double eps,
                               prl_grpo_singleton singleton, prl_grpo_adv_stats *stats);

/* ---------------------------------------------------------------- policy loss ------ */

typedef enum prl_grpo_agg {
    PRL_GRPO_AGG_TOKEN_MEAN = 0,
    PRL_GRPO_AGG_TOKEN_SUM = 1,
    PRL_GRPO_AGG_SEQ_MEAN_TOKEN_MEAN = 2,
    PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM = 3,
    PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM_NORM = 4 /* needs loss_scale_factor H > 0 */
} prl_grpo_agg;

typedef enum prl_grpo_loss_kind {
    PRL_GRPO_LOSS_PPO_CLIP = 0, /* the clipped surrogate above (default) */
    PRL_GRPO_LOSS_REINFORCE = 1 /* L = −A·lp_new, no ratio, no clip: bypass mode's
                                ** `reinforce` loss (rl.md §2.1), weighted by detached IS weights */
} prl_grpo_loss_kind;

typedef enum prl_grpo_ratio {
    PRL_GRPO_RATIO_TOKEN = 0,   /* r_t = π_θ(y_t)/π_old(y_t) per token (GRPO, PPO; default) */
    PRL_GRPO_RATIO_SEQUENCE = 1 /* GSPO: s_i = exp(mean_t (lp_new − lp_old)) over the
                                ** sequence's loss tokens, clipped at sequence level */
} prl_grpo_ratio;

typedef struct prl_grpo_loss_config {
    prl_grpo_loss_kind kind;  /* default PPO_CLIP */
    prl_grpo_ratio ratio;     /* grpo.algorithm: token (grpo, default) or sequence (gspo) */
    double clip_low;          /* ε_low, default 0.2 */
    double clip_high;         /* ε_high, default 0.28 (DAPO clip-higher) */
    double clip_c;            /* dual-clip c > 1, default 3; 0 disables the dual clip */
    prl_grpo_agg agg;         /* default token-mean */
    double loss_scale_factor; /* H of seq-mean-token-sum-norm */
} prl_grpo_loss_config;

void prl_grpo_loss_config_default(prl_grpo_loss_config *c);
/* Errors name the field: clip_low not in [0, 1), clip_high < 0, clip_c in (0, 1], agg unknown,
** H <= 0 with seq-mean-token-sum-norm, a sequence ratio with the REINFORCE kind (no ratio). */
prl_status prl_grpo_loss_config_check(const prl_grpo_loss_config *c);
/* "token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
** "seq-mean-token-sum-norm" ↔ enum; parse errors list the choices. */
const char *prl_grpo_agg_name(prl_grpo_agg a);
prl_status prl_grpo_agg_parse(const char *s, prl_grpo_agg *out);

/* ∂loss/∂L_t of each valid token of a sequence with seq_tokens valid tokens, in a batch of
** n_tokens valid tokens in n_seqs sequences: the aggregation's coefficient (1/n_tokens for
** token-mean, ...). */
double prl_grpo_agg_coefficient(const prl_grpo_loss_config *c, int seq_tokens, int n_tokens,
                                int n_seqs);

/* One token: the clipped surrogate L and ∂L/∂lp_new (A, lp_old constants); with kind
** REINFORCE, L = −A·lp_new and ∂L/∂lp_new = −A (lp_old unused). */
double prl_grpo_token_loss(double lp_new, double lp_old, double adv, const prl_grpo_loss_config *c,
                           double *dloss_dlp);

/* GSPO's loss of one sequence of n >= 1 loss tokens (the paper's objective, negated): with
** log s = mean_t (lp_new[t] − lp_old[t]) the token surrogate above taken at ratio s (log s
** clamped to ±20, the dual clip included), ∂ℓ/∂lp_new[t] = g/n into dlp[t] (may be NULL),
** g = −A·s on the unclipped branch, 0 on a clipped one. Everything in double. */
double prl_grpo_gspo_seq_loss(const double *lp_new, const double *lp_old, int n, double adv,
                              const prl_grpo_loss_config *c, double *dlp);

typedef struct prl_grpo_loss_stats {
    double loss;           /* the aggregated loss */
    double clipfrac;       /* share of valid tokens with the ratio clip above (L2 > L1) */
    double clipfrac_lower; /* share where the dual clip bounds the loss (A < 0) */
    double ppo_kl;         /* mean of lp_old − lp_new over valid tokens */
    int tokens, sequences; /* valid tokens; sequences with at least one */
} prl_grpo_loss_stats;

/* The aggregated loss of a batch of B sequences × T positions (row-major [B·T] arrays):
** mask[i] = 1 for response tokens that carry loss, adv[b] per sequence, optional token weights
** iw[i] (mismatch correction, detached; NULL = 1). Writes w[i] = ∂loss/∂lp_new[i] (0 off the
** mask) for the engine's backward. With the sequence ratio (GSPO) every loss token of
** sequence b carries ℓ(s_b, A) (token i's loss is coef·iw·ℓ) and w[i] = coef·iw[i]·g(s_b, A),
** GSPO-token's gradient (paper §4.3): exactly ∂loss/∂lp_new when A and iw are constant
** along the sequence; with per-token A or iw, each token's own A and iw weight its term. */
prl_status prl_grpo_loss(const prl_grpo_loss_config *c, const float *lp_new, const float *lp_old,
                         const double *adv, const uint8_t *mask, const float *iw, int B, int T,
                         float *w, prl_grpo_loss_stats *stats);

/* The same for one part (a micro-batch) of a larger batch: the aggregation's denominators are
** the whole batch's (n_tokens valid tokens in n_seqs sequences), so the parts' losses, weights,
** clipfrac, clipfrac_lower and ppo_kl add up to the whole batch's. stats->tokens and
** stats->sequences count the part. */
prl_status prl_grpo_loss_partial(const prl_grpo_loss_config *c, const float *lp_new,
                                 const float *lp_old, const double *adv, const uint8_t *mask,
                                 const float *iw, int B, int T, int n_tokens, int n_seqs, float *w,
                                 prl_grpo_loss_stats *stats);

/* The same with a per-token advantage added: token i's advantage is adv[b] + adv_tok[i]
** (adv_tok [B·T], NULL = none). On-policy distillation's per-token advantages (opd/) come in
** here; the token loss, weights and stats are otherwise those of prl_grpo_loss_partial. */
prl_status prl_grpo_loss_partial_tok(const prl_grpo_loss_config *c, const float *lp_new,
                                     const float *lp_old, const double *adv, const float *adv_tok,
                                     const uint8_t *mask, const float *iw, int B, int T,
                                     int n_tokens, int n_seqs, float *w,
                                     prl_grpo_loss_stats *stats);

/* ---------------------------------------------------------------- mismatch correction */
/* mismatch.c: the train–infer mismatch corrections of rl.md §2 as per-token weights and keep
** masks, the PCC-driven choice of a strict or loose threshold setting, and the per-step
** mismatch metrics of rl.md §6 (docs/grpo.md "Mismatch corrections" has the exact formulas).
** Inputs are per-token log-probs of the sampled token: `lp` of the training engine (lp_old in
** decoupled mode; lp_new, detached, in bypass mode) and `lp_mu` of the rollout engine.
** Token i of sequence s is i ∈ [seq_start[s], seq_start[s+1]); only tokens with mask[i] = 1
** count. Everything in double, in index order. */

typedef enum prl_grpo_corr {
    PRL_GRPO_CORR_NONE = 0,   /* w = 1 (default: the update is the uncorrected one) */
    PRL_GRPO_CORR_TIS = 1,    /* w = min(ρ, C) */
    PRL_GRPO_CORR_MIS = 2,    /* w = ρ·1[ρ ≤ C] */
    PRL_GRPO_CORR_ICEPOP = 3, /* w = ρ·1[α ≤ ρ ≤ β] (token level) */
    PRL_GRPO_CORR_KPOP = 4    /* w = ρ·1[max(D_B(p‖q), D_B(q‖p)) ≤ φ] (token level) */
} prl_grpo_corr;

typedef enum prl_grpo_corr_level {
    PRL_GRPO_LEVEL_TOKEN = 0,   /* ρ = exp(lp − lp_mu) per token */
    PRL_GRPO_LEVEL_SEQUENCE = 1 /* ρ = exp(Σ_t (lp − lp_mu)) over the sequence's valid tokens,
                                ** broadcast (TIS and MIS only) */
} prl_grpo_corr_level;

typedef enum prl_grpo_corr_mode {
    PRL_GRPO_MODE_DECOUPLED = 0, /* PPO ratio lp_new − lp_old; w from lp_old vs lp_mu, once */
    PRL_GRPO_MODE_BYPASS = 1     /* lp_old := lp_mu; w (reinforce only) from lp_new vs lp_mu */
} prl_grpo_corr_mode;

typedef enum prl_grpo_denominator {
    PRL_GRPO_DENOM_ORIGINAL = 0, /* the aggregation counts the loss tokens before masking */
    PRL_GRPO_DENOM_KEPT = 1      /* it counts only the tokens the correction keeps (verl RS) */
} prl_grpo_denominator;

/* One threshold setting (the loose or the strict one of the PCC rule). */
typedef struct prl_grpo_corr_bounds {
    double tis_cap;                 /* C of TIS, > 0 (default 2) */
    double mis_cap;                 /* C of MIS, > 0 (default 2) */
    double icepop_low, icepop_high; /* [α, β], 0 < α <= β (default [0.5, 5]) */
    double kpop_phi;                /* φ > 0 (default 0.75) */
} prl_grpo_corr_bounds;

typedef struct prl_grpo_corr_config {
    prl_grpo_corr kind;               /* grpo.correction.kind */
    prl_grpo_corr_level level;        /* grpo.correction.level */
    prl_grpo_corr_mode mode;          /* grpo.correction.mode */
    prl_grpo_loss_kind bypass_loss;   /* grpo.correction.bypass_loss (bypass mode only) */
    prl_grpo_denominator denominator; /* grpo.correction.denominator */
    prl_grpo_corr_bounds loose;       /* grpo.correction.{tis_cap, ...}: the default setting */
    prl_grpo_corr_bounds strict;      /* grpo.correction.strict.*: used when the PCC rule fires */
    int pcc_rule;                     /* grpo.correction.pcc_rule: 1 = pick by the batch PCC */
    double pcc_threshold;             /* grpo.correction.pcc_threshold: PCC below it → strict */
    double extreme_ratio;             /* grpo.correction.extreme_ratio τ > 1 of the metric F(τ) */
} prl_grpo_corr_config;

void prl_grpo_corr_config_default(prl_grpo_corr_config *c);
/* Ranges and the cross rules (errors name the key grpo.correction.*): KPop, IcePop need token
** level and KPop decoupled mode; bypass with ppo_clip takes no correction (the PPO ratio
** already is π_θ/π_infer: a weight would count the mismatch twice); bypass with `kept` is
** refused (its weights change with every forward); with the PCC rule on, the strict setting
** must be at least as strict as the loose one (caps and φ not larger, [α, β] inside). */
prl_status prl_grpo_corr_config_check(const prl_grpo_corr_config *c);
/* From the job's grpo.correction.* keys (choices already validated by the key table). */
prl_status prl_grpo_corr_config_from_job(prl_grpo_corr_config *c, const struct prl_job_config *j);
const char *prl_grpo_corr_name(prl_grpo_corr k);               /* "none", "tis", ... */
const char *prl_grpo_denominator_name(prl_grpo_denominator d); /* "original", "kept" */
const char *prl_grpo_corr_mode_name(prl_grpo_corr_mode m);     /* "decoupled", "bypass" */

/* The PCC rule: *out = the strict setting when c->pcc_rule is on and pcc < pcc_threshold or
** pcc is NaN (undefined: fewer than 2 tokens or a constant vector — no evidence of agreement,
** so the safe side), else the loose setting. Returns 1 when strict was chosen. */
int prl_grpo_corr_select(const prl_grpo_corr_config *c, double pcc, prl_grpo_corr_bounds *out);

/* KPop's metric of one token: max(D_B(p‖q), D_B(q‖p)) with p = clamp(e^lp, 1e-8, 1 − 1e-8),
** q likewise from lp_mu, D_B the Bernoulli KL (rl.md §2.6). NaN in → NaN out. */
double prl_grpo_kpop_metric(double lp, double lp_mu);

typedef struct prl_grpo_corr_stats {
    long tokens;                 /* valid tokens (mask 1) */
    long masked;                 /* valid tokens with keep 0 */
    long truncated;              /* valid tokens whose weight TIS capped (ρ > C) */
    double w_sum, w_sq;          /* Σ w, Σ w² over the valid tokens */
    double w_mean, w_min, w_max; /* of the weights over the valid tokens (0 when none) */
    double ess;                  /* (Σw)² / (N·Σw²), in (0, 1]; NaN when every weight is 0 */
} prl_grpo_corr_stats;

/* Weights w[i] (detached) and keep[i] of n_seq sequences with bounds `bd` and c->kind /
** c->level (mode and PCC rule are the caller's). Off the mask w = 0, keep = 0. keep = 0 marks
** a token the correction masks (MIS, IcePop, KPop, or any token whose ratio is NaN: it cannot
** be judged); TIS never masks. Log-ratios are clamped to ±20 before exp (verl). KPop follows
** rl.md §2.6 exactly (a NaN metric masks; a non-finite log-ratio of a kept token gives w = 1).
** keep and st may be NULL. */
prl_status prl_grpo_corr_weights(const prl_grpo_corr_config *c, const prl_grpo_corr_bounds *bd,
                                 const float *lp, const float *lp_mu, const uint8_t *mask,
                                 const int32_t *seq_start, int n_seq, float *w, uint8_t *keep,
                                 prl_grpo_corr_stats *st);

/* The per-step mismatch metrics (rl.md §6) of train log-probs vs rollout log-probs over the
** valid tokens; d = lp_train − lp_infer, r = exp(clamp(d, ±20)), p = e^lp. NaN (JSON null)
** where undefined (no tokens; PCC of < 2 tokens or a constant vector). */
typedef struct prl_grpo_mismatch_stats {
    long tokens;                                         /* valid tokens */
    double logprob_diff_mean, logprob_diff_max;          /* |d| */
    double prob_diff_mean, prob_diff_max, prob_diff_std; /* |p_tr − p_inf|, std unbiased */
    double pcc, pcc_logprob;     /* Pearson of probabilities, of log-probabilities */
    double k1, k2, k3;           /* mean −d, mean d²/2, mean (r − log r − 1) */
    double chi2_token, chi2_seq; /* mean r² − 1; mean over sequences of R² − 1 */
    double ess;                  /* ESS of the raw ratios r */
    double extreme_frac;         /* share with r > τ or r < 1/τ */
    int strict;                  /* 1: the PCC rule picked the strict setting */
    /* what each correction would do at the chosen setting (masks over valid tokens) */
    double tis_clipfrac, mis_masked_frac, icepop_masked_frac, kpop_masked_frac;
} prl_grpo_mismatch_stats;

/* Fills *st (and *bd, the setting chosen by the PCC rule, when not NULL). */
prl_status prl_grpo_mismatch_metrics(const prl_grpo_corr_config *c, const float *lp_train,
                                     const float *lp_infer, const uint8_t *mask,
                                     const int32_t *seq_start, int n_seq,
                                     prl_grpo_mismatch_stats *st, prl_grpo_corr_bounds *bd);

/* ---------------------------------------------------------------- training step ---- */
/* batch.c: one step's samples (the `train` message carries them: roles/msg/msg.h); trainer.c:
** the GRPO update of the trainer role (docs/grpo.md "Training step"). */

struct prl_job_config;

/* n samples of one step, packed as the `train` message carries them. Sample i's tokens
** (prompt then response) are tokens[offsets[i] .. offsets[i+1]); its first prompt_lens[i] are
** the prompt. The response tokens of all samples, concatenated in sample order, have one
** infer log-prob (logprobs) and one loss-mask byte (mask: 1 trained, 0 observation) each.
** Ownership: every array is owned (prl_grpo_batch_init / prl_grpo_batch_free). */
typedef struct prl_grpo_batch {
    int n;                /* samples */
    size_t n_tokens;      /* offsets[n] */
    size_t n_response;    /* Σ (length − prompt_len) */
    int32_t *tokens;      /* [n_tokens] */
    int32_t *offsets;     /* [n + 1], offsets[0] = 0 */
    int32_t *prompt_lens; /* [n], 1 <= prompt_len < length */
    float *rewards;       /* [n], finite */
    int32_t *groups;      /* [n], the group (prompt) of each sample */
    float *logprobs;      /* [n_response] infer log-probs, finite, <= 0 */
    uint8_t *mask;        /* [n_response] 0 or 1 */
    /* MoE routes recorded by the rollout engine (optional: all 0/NULL without them;
    ** docs/replay.md). Sample i has route_rows[i] rows (0 = no record, at most length − 1:
    ** row p is the route of token p), each route_moe × route_k ids of route_width bytes
    ** (prl_routes_pack, token-major); `routes` holds them sample after sample. */
    int route_moe, route_k, route_width;
    int32_t *route_rows; /* [n] or NULL */
    uint8_t *routes;     /* [routes_bytes] or NULL */
    size_t routes_bytes;
} prl_grpo_batch;

/* Allocate the arrays (zeroed) for n samples of n_tokens tokens with n_response response
** tokens; the caller fills them. */
prl_status prl_grpo_batch_init(prl_grpo_batch *b, int n, size_t n_tokens, size_t n_response);
void prl_grpo_batch_free(prl_grpo_batch *b);
/* Allocate the route arrays (zeroed; owned by the batch) for `rows` route rows in all of
** route_moe × route_k ids of `width` bytes; the caller fills route_rows and routes. */
prl_status prl_grpo_batch_routes_init(prl_grpo_batch *b, int route_moe, int route_k, int width,
                                      size_t rows);
/* Check every size and value (see the field comments); errors name the array and sample. */
prl_status prl_grpo_batch_check(const prl_grpo_batch *b);
/* The number of response tokens of sample i. */
static inline int prl_grpo_batch_response_len(const prl_grpo_batch *b, int i)
{
    return b->offsets[i + 1] - b->offsets[i] - b->prompt_lens[i];
}
/* The response of sample i: its first token's index into logprobs/mask (*first) and count
** (O(i): sums the prompts before it). */
void prl_grpo_batch_response(const prl_grpo_batch *b, int i, size_t *first, int *len);

/* Every sample fits model m: length <= its context, token ids < its vocabulary; else
** PRL_ERR_RANGE naming the sample (and position). */
prl_status prl_grpo_batch_fits(const prl_model *m, const prl_grpo_batch *b);

/* Data-parallel ranks of one training step (docs/grpo.md "Data-parallel ranks"): every rank
** calls prl_grpo_train_step with the same batch and weights; rank r forms the gradients of
** its fixed share of each update's micro-batches, rank 0 sums them over the fixed tree, steps
** the optimizer and broadcasts the new weights. Blocking byte transfers (dp/dp.h gives them
** on Open MPI); a failed transfer returns an error and the step fails. Borrowed. */
typedef struct prl_grpo_comm {
    int rank, size; /* 0 <= rank < size */
    void *ctx;
    prl_status (*send)(void *ctx, int to, const void *data, size_t bytes);
    prl_status (*recv)(void *ctx, int from, void *data, size_t bytes);
    prl_status (*bcast)(void *ctx, void *data, size_t bytes); /* rank 0's bytes to every rank */
} prl_grpo_comm;

typedef struct prl_grpo_train_config {
    prl_grpo_baseline baseline;   /* grpo.advantage: grpo (group mean) | rloo */
    prl_grpo_adv_norm adv_norm;   /* grpo.adv_norm */
    double adv_eps;               /* grpo.adv_eps */
    prl_grpo_singleton singleton; /* grpo.singleton */
    prl_grpo_loss_config loss;  /* grpo.clip_low, clip_high, clip_c, loss_agg, loss_scale_factor */
    int ppo_epochs;             /* grpo.ppo_epochs >= 1 */
    int minibatches;            /* grpo.minibatches >= 1: optimizer steps per epoch */
    int micro_rows;             /* sequences per forward/backward (memory bound), default 8 */
    double grad_clip;           /* optim.grad_clip: global L2 bound of each update (0 = off) */
    double temperature;         /* rollout.temperature: log-probs of softmax(logits / τ) */
    double kl_coef;             /* grpo.kl_coef: weight of the k3 KL to `ref` (0 = off) */
    prl_model *ref;             /* borrowed reference model (needed iff kl_coef > 0) */
    prl_grpo_corr_config corr;  /* grpo.correction.*: default none (the plain update) */
    int replay_mode;            /* replay.mode: a prl_replay_mode (replay/replay.h), 0 = none */
    double replay_tau;          /* replay.tau: Masked R3 threshold on |I_train ∩ I_infer|/K */
    double entropy_alarm;       /* replay.entropy_alarm: alarm when a layer's routing entropy
                                 ** < entropy_alarm · ln N_experts (0 = never) */
    const float *token_adv;     /* borrowed, [n_response] in the batch's response layout, or
                                 ** NULL: a per-token advantage added to each loss token's
                                 ** (on-policy distillation, opd/) */
    double seq_adv_weight;      /* weight of the group (reward) advantage, default 1 */
    int distill_k;              /* extra targets per response token (0: none; at most
                                 ** PRL_MAX_EXTRA_TARGETS): a distillation term (opd.topk) */
    const int32_t *distill_ids; /* borrowed, [n_response × distill_k] target ids (-1: none;
                                 ** only on loss tokens) */
    const float *distill_w;     /* borrowed, [n_response × distill_k] q >= 0: the term's loss
                                 ** is −Σ q·log p_θ(id) per loss token, aggregated over the
                                 ** tokens as the surrogate (grpo.loss_agg); no IS weight */
    prl_loss_scaler *scaler;    /* borrowed dynamic loss scaler (trainer.loss_scale), or NULL:
                                 ** no scaling. Its state advances with every update. */
    const prl_grpo_comm *comm;  /* borrowed data-parallel ranks (trainer.ranks), or NULL: one
                                 ** process. The result does not depend on comm->size. */
} prl_grpo_train_config;

void prl_grpo_train_config_default(prl_grpo_train_config *c);
/* From the job's grpo.*, optim.grad_clip and rollout.temperature keys (ref = NULL: the
** caller loads the reference model when grpo.kl_coef > 0). */
prl_status prl_grpo_train_config_from_job(prl_grpo_train_config *c, const struct prl_job_config *j);
/* The temperature τ at which a job's rollout tokens are scored (trainer, OPD teachers):
** rollout.temperature, or 1 for greedy rollouts (temperature 0). */
double prl_grpo_score_temperature(const struct prl_job_config *j);
/* The optimizer of the job's optim.* keys (kind, lr, weight_decay, grad_clip, warmup) and
** grpo.expert_clip (the engine's per-expert clip, as SFT's sft.expert_clip). */
prl_status prl_grpo_optim_config_from_job(prl_optim_config *oc, const struct prl_job_config *j);
/* Errors name the key (grpo.ppo_epochs, ...). */
prl_status prl_grpo_train_config_check(const prl_grpo_train_config *c);

typedef struct prl_grpo_step_stats {
    int samples, groups, singletons, constant_groups, dropped;
    int updates;        /* optimizer steps applied (ppo_epochs × minibatches − skipped) */
    int skipped;        /* updates skipped for a non-finite gradient (loss scaling) */
    int scaler_on;      /* a loss scaler ran (the three fields below are meaningful) */
    double loss_scale;  /* the scale after the step's last update */
    long skipped_total; /* updates the scaler has skipped over the run */
    long tokens;        /* tokens (prompt + response) of the trained samples */
    long loss_tokens;   /* response tokens with mask 1 */
    double reward_mean; /* over all samples */
    double accuracy;    /* share of samples with reward == 1 */
    double adv_mean, adv_std, adv_min, adv_max; /* over the trained samples */
    double loss; /* policy loss (+ kl_coef·kl), mean over the updates */
    double clipfrac, clipfrac_lower, ppo_kl; /* means over the updates */
    double kl;            /* k3 KL to the reference, mean over the updates (0 when off) */
    double grad_norm;     /* mean pre-clip gradient norm over the updates */
    int expert_clip_on;   /* grpo.expert_clip > 0 (experts_clipped is then reported) */
    long experts_clipped; /* routed experts whose gradient the per-expert clip scaled, summed
                           ** over the applied updates */
    double grad_norm_max;
    double lr;       /* learning rate of the last update */
    double mismatch; /* mean |train old logp − infer logp| over the loss tokens */
    double mismatch_max;
    prl_grpo_mismatch_stats mm; /* rl.md §6 metrics of the old vs the infer log-probs */
    prl_grpo_corr_config corr;  /* the correction applied (logged with every step) */
    /* the applied correction over the loss tokens it scored (decoupled: once; bypass: every
    ** forward of every update, pooled) */
    double corr_masked_frac; /* share masked */
    double is_weight_mean, is_weight_min, is_weight_max, is_weight_ess;
    double seconds; /* wall time of the step */
    /* routing (docs/replay.md), per MoE layer l < n_moe, over the route positions (tokens with
    ** a next token) of the trained samples, from the native old-policy pass */
    int replay_mode; /* the step's prl_replay_mode */
    int n_moe;
    double route_overlap[PRL_MAX_LAYERS];      /* mean |I_train ∩ I_infer| / K, I_train the native
                                           ** selection (NaN: no record) */
    double route_overlap_used[PRL_MAX_LAYERS]; /* the same with the routes lp_old used (after
                                           ** replay): 1 under R3 */
    double route_replayed[PRL_MAX_LAYERS];     /* share of the positions replayed */
    double route_entropy[PRL_MAX_LAYERS];      /* H_l of the layer's expert load (nats) */
    int route_entropy_alarm; /* some layer had H_l < entropy_alarm · ln N_experts */
    int route_records;       /* trained samples with a usable route record */
    int route_rejected;      /* samples whose record was rejected (bad or repeated id) */
} prl_grpo_step_stats;

/* ---------------------------------------------------------------- precision -------- */
/* scaling.c: the trainer's precision and loss scaling from the job (docs/grpo.md "Precision
** and loss scaling"); the scaler's state travels in the checkpoint's state.json. */

typedef struct prl_grpo_precision {
    prl_precision precision;       /* trainer.precision (prl_model_set_precision) */
    int scaler_on;                 /* trainer.loss_scale.enabled: on, or auto with fp16 */
    prl_loss_scaler_config scaler; /* trainer.loss_scale.preset with the set constants */
} prl_grpo_precision;

/* From the job; the scaler's range rules run here, so errors name the keys. */
prl_status prl_grpo_precision_from_job(prl_grpo_precision *p, const struct prl_job_config *j);
/* The scaler's state as a JSON object text {"scale": …, "growth_tracker": …,
** "hysteresis_tracker": …, "steps": …, "skipped": …} into out (snprintf's return value);
** "null" for s NULL (no scaler). */
int prl_grpo_scaler_state_format(const prl_loss_scaler *s, char *out, size_t n);
/* Restore the state from a state.json text's "loss_scaler" object (absent, null or NULL
** text: unchanged). A malformed object is PRL_ERR_FORMAT naming it. */
prl_status prl_grpo_scaler_state_parse(prl_loss_scaler *s, const char *state_json);

/* One GRPO step on batch `b` (docs/grpo.md "Training step"): advantages per group; old
** log-probs recomputed on the train path with the current weights before any update; then
** ppo_epochs × minibatches updates over a fixed partition of the samples in their given order,
** each a forward + backward over micro-batches of at most micro_rows rows (each micro-batch's
** gradient formed alone, then summed over a fixed binary tree of the micro-batch indices:
** [lo, hi) = [lo, mid) + [mid, hi), mid = lo + (hi − lo)/2), grad clip and an optimizer step.
** With c->comm the micro-batches are shared among the ranks and only rank 0 steps the
** optimizer and writes the stats (the others' *st is partial); the weights every rank ends
** with are rank 0's, bitwise the same as one process's. With c->scaler each update follows
** rl.md §4.3: the token weights (the loss) times the scale → backward → unscale → inf/NaN
** check → clip the unscaled gradients → step, or skip (weights, router bias and the
** optimizer's step count untouched) → update the scale. Deterministic: the same input gives
** bitwise-identical weights whatever the thread count. A sample longer than the model's
** context or a token outside its vocabulary is PRL_ERR_RANGE naming the sample. */
prl_status prl_grpo_train_step(prl_model *m, prl_optim *o, const prl_grpo_batch *b,
                               const prl_grpo_train_config *c, prl_grpo_step_stats *st);

/* The stats as a JSON object text (malloc'd; NULL when out of memory): the `metrics` frame of
** `trained` and the step's row in run.db. Keys are the field names. */
char *prl_grpo_step_stats_to_json(const prl_grpo_step_stats *st);

#endif /* PRL_GRPO_H */
