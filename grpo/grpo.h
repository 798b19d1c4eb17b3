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

/* ∂loss/∂L_t of each valid token of a sequence with seq_tokens valid tokens, in a batch of
** n_tokens valid tokens in n_seqs sequences: the aggregation's coefficient (1/n_tokens for
** token-mean, ...). */
double prl_grpo_agg_coefficient(const prl_grpo_loss_config *c, int seq_tokens, int n_tokens,
                                int n_seqs);

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

/* The same for one part (a micro-batch) of a larger batch: the aggregation's denominators are
** the whole batch's (n_tokens valid tokens in n_seqs sequences), so the parts' losses, weights,
** clipfrac, clipfrac_lower and ppo_kl add up to the whole batch's. stats->tokens and
** stats->sequences count the part. */
prl_status prl_grpo_loss_partial(const prl_grpo_loss_config *c, const float *lp_new,
                                 const float *lp_old, const double *adv, const uint8_t *mask,
                                 const float *iw, int B, int T, int n_tokens, int n_seqs,
                                 float *w, prl_grpo_loss_stats *stats);

/* ---------------------------------------------------------------- training step ---- */
/* trainer.c: one step's samples (the bus `train` message, docs/pipeline.md) and the GRPO
** update of the trainer role (docs/grpo.md "Training step"). */

struct prl_bus_msg;
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
    int32_t *route_rows;  /* [n] or NULL */
    uint8_t *routes;      /* [routes_bytes] or NULL */
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
/* The response of sample i: its first token's index into logprobs/mask (*first) and count
** (O(i): sums the prompts before it). */
void prl_grpo_batch_response(const prl_grpo_batch *b, int i, size_t *first, int *len);

/* Read a decoded `train` message (field count; frames tokens, offsets, prompt_lens, rewards,
** groups, logprobs, mask; optionally frames route_rows and routes with fields route_moe,
** route_k, route_width) into a new batch `b`. Every frame's presence, dtype and size and
** every value is checked; an error (PRL_ERR_FORMAT) names the frame (and the sample), and
** leaves `b` empty. */
prl_status prl_grpo_batch_from_msg(prl_grpo_batch *b, const struct prl_bus_msg *m);
/* Add field count and the seven frames (nine with routes) to `m`, a `train` message the caller initialised
** (and gives lease, step, policy_version, path). The batch is checked first. */
prl_status prl_grpo_batch_to_msg(const prl_grpo_batch *b, struct prl_bus_msg *m);

typedef struct prl_grpo_train_config {
    prl_grpo_adv_norm adv_norm;  /* grpo.adv_norm */
    double adv_eps;              /* grpo.adv_eps */
    prl_grpo_singleton singleton;/* grpo.singleton */
    prl_grpo_loss_config loss;   /* grpo.clip_low, clip_high, clip_c, loss_agg, loss_scale_factor */
    int ppo_epochs;              /* grpo.ppo_epochs >= 1 */
    int minibatches;             /* grpo.minibatches >= 1: optimizer steps per epoch */
    int micro_rows;              /* sequences per forward/backward (memory bound), default 8 */
    double grad_clip;            /* optim.grad_clip: global L2 bound of each update (0 = off) */
    double temperature;          /* rollout.temperature: log-probs of softmax(logits / τ) */
    double kl_coef;              /* grpo.kl_coef: weight of the k3 KL to `ref` (0 = off) */
    prl_model *ref;              /* borrowed reference model (needed iff kl_coef > 0) */
    int replay_mode;             /* replay.mode: a prl_replay_mode (replay/replay.h), 0 = none */
    double replay_tau;           /* replay.tau: Masked R3 threshold on |I_train ∩ I_infer|/K */
    double entropy_alarm;        /* replay.entropy_alarm: alarm when a layer's routing entropy
                                 ** < entropy_alarm · ln N_experts (0 = never) */
} prl_grpo_train_config;

void prl_grpo_train_config_default(prl_grpo_train_config *c);
/* From the job's grpo.*, optim.grad_clip and rollout.temperature keys (ref = NULL: the
** caller loads the reference model when grpo.kl_coef > 0). */
prl_status prl_grpo_train_config_from_job(prl_grpo_train_config *c,
                                          const struct prl_job_config *j);
/* The optimizer of the job's optim.* keys (kind, lr, weight_decay, grad_clip, warmup). */
prl_status prl_grpo_optim_config_from_job(prl_optim_config *oc, const struct prl_job_config *j);
/* Errors name the key (grpo.ppo_epochs, ...). */
prl_status prl_grpo_train_config_check(const prl_grpo_train_config *c);

typedef struct prl_grpo_step_stats {
    int samples, groups, singletons, constant_groups, dropped;
    int updates;            /* optimizer steps: ppo_epochs × minibatches */
    long tokens;            /* tokens (prompt + response) of the trained samples */
    long loss_tokens;       /* response tokens with mask 1 */
    double reward_mean;     /* over all samples */
    double accuracy;        /* share of samples with reward == 1 */
    double adv_mean, adv_std, adv_min, adv_max; /* over the trained samples */
    double loss;            /* policy loss (+ kl_coef·kl), mean over the updates */
    double clipfrac, clipfrac_lower, ppo_kl;    /* means over the updates */
    double kl;              /* k3 KL to the reference, mean over the updates (0 when off) */
    double grad_norm;       /* mean pre-clip gradient norm over the updates */
    double grad_norm_max;
    double lr;              /* learning rate of the last update */
    double mismatch;        /* mean |train old logp − infer logp| over the loss tokens */
    double mismatch_max;
    double seconds;         /* wall time of the step */
    /* routing (docs/replay.md), per MoE layer l < n_moe, over the route positions (tokens with
    ** a next token) of the trained samples, from the native old-policy pass */
    int replay_mode;        /* the step's prl_replay_mode */
    int n_moe;
    double route_overlap[PRL_MAX_LAYERS];  /* mean |I_train ∩ I_infer| / K, I_train the native
                                           ** selection (NaN: no record) */
    double route_overlap_used[PRL_MAX_LAYERS]; /* the same with the routes lp_old used (after
                                           ** replay): 1 under R3 */
    double route_replayed[PRL_MAX_LAYERS]; /* share of the positions replayed */
    double route_entropy[PRL_MAX_LAYERS];  /* H_l of the layer's expert load (nats) */
    int route_entropy_alarm;/* some layer had H_l < entropy_alarm · ln N_experts */
    int route_records;      /* trained samples with a usable route record */
    int route_rejected;     /* samples whose record was rejected (bad or repeated id) */
} prl_grpo_step_stats;

/* One GRPO step on batch `b` (docs/grpo.md "Training step"): advantages per group; old
** log-probs recomputed on the train path with the current weights before any update; then
** ppo_epochs × minibatches updates over a fixed partition of the samples in their given order,
** each a forward + backward over micro-batches of at most micro_rows rows (gradients
** accumulated in order), grad clip and an optimizer step. Deterministic: the same input gives
** bitwise-identical weights whatever the thread count. A sample longer than the model's
** context or a token outside its vocabulary is PRL_ERR_RANGE naming the sample. */
prl_status prl_grpo_train_step(prl_model *m, prl_optim *o, const prl_grpo_batch *b,
                               const prl_grpo_train_config *c, prl_grpo_step_stats *st);

/* The stats as a JSON object text (malloc'd; NULL when out of memory): the `metrics` frame of
** `trained` and the step's row in run.db. Keys are the field names. */
char *prl_grpo_step_stats_to_json(const prl_grpo_step_stats *st);

#endif /* PRL_GRPO_H */
