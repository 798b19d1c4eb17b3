/*
** trainer.c — the GRPO update of the trainer role (grpo.h, docs/grpo.md "Training step"):
** the training configuration from the job, and prl_grpo_train_step on a step's batch
** (batch.c).
**
** Layout of a sample in a micro-batch row: position t holds token t; response token j (token
** prompt_len + j) is the target of position prompt_len − 1 + j. Only response tokens with mask
** 1 get a target, so the train path scores exactly the loss tokens. Row arrays are [rows × T]
** with T the longest sample of the micro-batch (<= the model's context).
**
** Determinism: samples are taken in the given order, minibatch k of M holds the kept samples
** [n·k/M, n·(k+1)/M); each micro-batch's gradient is formed alone and the gradients are summed
** over a fixed tree of the micro-batch indices (reduce.h), whatever the number of ranks that
** formed them; every stats sum is in double in micro-batch order; the engine's kernels do not
** depend on the thread count.
*/
#include "grpo/grpo.h"
#include "grpo/reduce.h"
#include "grpo/replay_step.h"

#include "job/job.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ configuration --- */

void prl_grpo_train_config_default(prl_grpo_train_config *c)
{
    *c = (prl_grpo_train_config){.baseline = PRL_GRPO_BASELINE_GROUP,
                                 .adv_norm = PRL_GRPO_NORM_STD,
                                 .adv_eps = 1e-6,
                                 .singleton = PRL_GRPO_SINGLETON_ZERO,
                                 .ppo_epochs = 1,
                                 .minibatches = 1,
                                 .micro_rows = 8,
                                 .grad_clip = 1.0,
                                 .temperature = 1.0,
                                 .replay_tau = 0.5,
                                 .seq_adv_weight = 1.0};
    prl_grpo_loss_config_default(&c->loss);
    prl_grpo_corr_config_default(&c->corr);
}

prl_status prl_grpo_train_config_from_job(prl_grpo_train_config *c, const prl_job_config *j)
{
    prl_grpo_train_config_default(c);
    c->adv_norm = strcmp(j->adv_norm, "none") == 0 ? PRL_GRPO_NORM_NONE : PRL_GRPO_NORM_STD;
    c->singleton = strcmp(j->singleton, "verl") == 0   ? PRL_GRPO_SINGLETON_VERL
                   : strcmp(j->singleton, "drop") == 0 ? PRL_GRPO_SINGLETON_DROP
                                                       : PRL_GRPO_SINGLETON_ZERO;
    c->adv_eps = j->adv_eps;
    c->baseline =
        strcmp(j->grpo_advantage, "rloo") == 0 ? PRL_GRPO_BASELINE_RLOO : PRL_GRPO_BASELINE_GROUP;
    c->loss.ratio =
        strcmp(j->grpo_algorithm, "gspo") == 0 ? PRL_GRPO_RATIO_SEQUENCE : PRL_GRPO_RATIO_TOKEN;
    c->loss.clip_low = j->clip_low;
    c->loss.clip_high = j->clip_high;
    c->loss.clip_c = j->clip_c;
    c->loss.loss_scale_factor = j->loss_scale_factor;
    prl_status rc = prl_grpo_agg_parse(j->loss_agg, &c->loss.agg);
    if (rc) return prl_error_wrap(rc, "grpo.loss_agg: ");
    c->ppo_epochs = j->ppo_epochs;
    c->micro_rows = j->micro_rows;
    c->minibatches = j->minibatches;
    c->grad_clip = j->grad_clip;
    c->temperature = prl_grpo_score_temperature(j);
    c->kl_coef = j->kl_coef;
    rc = prl_grpo_corr_config_from_job(&c->corr, j);
    if (rc) return rc;
    rc = prl_grpo_replay_config_from_job(c, j);
    return rc ? rc : prl_grpo_train_config_check(c);
}

double prl_grpo_score_temperature(const prl_job_config *j)
{
    return j->temperature > 0 ? j->temperature : 1.0; /* greedy rollouts score at τ = 1 */
}

prl_status prl_grpo_optim_config_from_job(prl_optim_config *oc, const prl_job_config *j)
{
    prl_optim_config_default(oc);
    if (strcmp(j->optimizer, "adamw") && strcmp(j->optimizer, "muon"))
        return prl_error_set(PRL_ERR_CONFIG, "optim.kind '%s' (choices: adamw, muon)",
                             j->optimizer);
    oc->kind = strcmp(j->optimizer, "muon") == 0 ? PRL_OPTIM_MUON : PRL_OPTIM_ADAMW;
    oc->lr = j->lr;
    oc->weight_decay = j->weight_decay;
    oc->grad_clip = j->grad_clip;
    oc->expert_clip = j->grpo_expert_clip; /* the engine clips each expert, then the whole */
    oc->warmup_steps = j->warmup;
    /* counted in optimizer steps (ppo_epochs × minibatches a training step), not in
    ** controller.steps: a longer run is the same run continued */
    oc->schedule = strcmp(j->lr_schedule, "constant") == 0 ? PRL_LR_CONSTANT : PRL_LR_COSINE;
    oc->total_steps = j->decay_steps;
    oc->min_lr_ratio = j->min_lr_ratio;
    return PRL_OK;
}

prl_status prl_grpo_train_config_check(const prl_grpo_train_config *c)
{
    prl_status rc = prl_grpo_loss_config_check(&c->loss);
    if (rc) return prl_error_wrap(rc, "grpo: ");
    if (!(c->adv_eps > 0))
        return prl_error_set(PRL_ERR_CONFIG, "grpo.adv_eps %g must be > 0", c->adv_eps);
    if ((unsigned)c->adv_norm > PRL_GRPO_NORM_NONE ||
        (unsigned)c->singleton > PRL_GRPO_SINGLETON_DROP ||
        (unsigned)c->baseline > PRL_GRPO_BASELINE_RLOO)
        return prl_error_set(PRL_ERR_CONFIG,
                             "grpo.adv_norm / grpo.singleton / grpo.advantage out of range");
    if (c->ppo_epochs < 1)
        return prl_error_set(PRL_ERR_CONFIG, "grpo.ppo_epochs %d must be >= 1", c->ppo_epochs);
    if (c->minibatches < 1)
        return prl_error_set(PRL_ERR_CONFIG, "grpo.minibatches %d must be >= 1", c->minibatches);
    if (c->micro_rows < 1)
        return prl_error_set(PRL_ERR_CONFIG, "micro_rows %d must be >= 1", c->micro_rows);
    if (!(c->grad_clip >= 0))
        return prl_error_set(PRL_ERR_CONFIG, "optim.grad_clip %g must be >= 0", c->grad_clip);
    if (!(c->temperature > 0 && isfinite(c->temperature)))
        return prl_error_set(PRL_ERR_CONFIG, "rollout.temperature %g must be > 0", c->temperature);
    if (!isfinite(c->seq_adv_weight))
        return prl_error_set(PRL_ERR_CONFIG, "seq_adv_weight %g must be finite", c->seq_adv_weight);
    if (!(c->kl_coef >= 0 && isfinite(c->kl_coef)))
        return prl_error_set(PRL_ERR_CONFIG, "grpo.kl_coef %g must be >= 0", c->kl_coef);
    if (c->distill_k < 0 || c->distill_k > PRL_MAX_EXTRA_TARGETS ||
        (c->distill_k && (!c->distill_ids || !c->distill_w)))
        return prl_error_set(PRL_ERR_CONFIG,
                             "distillation: %d targets per token (0..%d, with ids "
                             "and weights)",
                             c->distill_k, PRL_MAX_EXTRA_TARGETS);
    if (c->loss.kind != PRL_GRPO_LOSS_PPO_CLIP) /* reinforce comes with bypass mode only */
        return prl_error_set(PRL_ERR_CONFIG, "grpo: the loss kind is set by "
                                             "grpo.correction.bypass_loss, not in the loss config");
    if (c->loss.ratio == PRL_GRPO_RATIO_SEQUENCE && c->corr.mode == PRL_GRPO_MODE_BYPASS &&
        c->corr.bypass_loss == PRL_GRPO_LOSS_REINFORCE)
        return prl_error_set(PRL_ERR_CONFIG,
                             "grpo.algorithm = gspo needs the clipped surrogate: "
                             "grpo.correction.bypass_loss = reinforce has no ratio");
    rc = prl_grpo_corr_config_check(&c->corr);
    return rc ? rc : prl_grpo_replay_config_check(c);
}

/* ------------------------------------------------------------------ the step -------- */

/* The mismatch correction of a step (rl.md §2): flat [n_response] arrays in the batch's
** response layout, [micro_rows × ctx] row arrays, and the applied weights' running sums. */
typedef struct step_corr {
    int active;              /* a correction multiplies the token losses (kind != none) */
    int bypass;              /* lp_old := lp_mu */
    prl_grpo_corr_bounds bd; /* the setting the PCC rule picked */
    int32_t *seq_start;      /* [n + 1] response offsets of the samples */
    uint8_t *mask;           /* [n_response] loss tokens of the kept samples */
    float *iw;               /* [n_response] decoupled weights */
    uint8_t *keep;           /* [n_response] decoupled keep mask */
    float *iw_rows;          /* [micro_rows × ctx] */
    int32_t *row_start;      /* [micro_rows + 1] */
    long n, masked;          /* applied: tokens scored, tokens masked */
    double sum, sq, min, max;
} step_corr;

/* Everything one step owns; rows × ctx arrays are sized for one micro-batch. */
typedef struct step_ctx {
    prl_model *m;
    const prl_grpo_batch *b;
    const prl_grpo_train_config *c;
    int ctx;                             /* the model's context (positions per row at most) */
    int n_kept, *kept;                   /* samples trained, in order */
    size_t *first;                       /* [n] first response token of each sample */
    double *adv;                         /* [n] */
    float *lp_old;                       /* [n_response] train log-probs before any update */
    float *lp_ref;                       /* [n_response] reference log-probs (KL only) */
    prl_batch_buf bb;                    /* micro_rows × ctx */
    uint8_t *train;                      /* [ctx] a row's target mask */
    float *lp_new, *old_rows, *ref_rows; /* [micro_rows × ctx] */
    float *adv_tok_rows; /* [micro_rows × ctx] c->token_adv in rows (NULL without) */
    int32_t *extra_ids; /* [micro_rows × ctx × distill_k] c->distill_ids in rows (NULL without) */
    float *extra_w;     /* [micro_rows × ctx × distill_k] their loss weights */
    uint8_t *mask_rows; /* [micro_rows × ctx] */
    double *adv_rows;   /* [micro_rows] */
    step_corr corr;     /* the mismatch correction's state */
    prl_grpo_replay rp; /* routing replay and metrics (replay_step.h) */
} step_ctx;

static void step_free(step_ctx *s)
{
    free(s->kept), free(s->first), free(s->adv), free(s->lp_old), free(s->lp_ref);
    prl_batch_buf_free(&s->bb);
    free(s->train), free(s->lp_new), free(s->old_rows), free(s->ref_rows);
    free(s->mask_rows), free(s->adv_rows), free(s->adv_tok_rows);
    free(s->extra_ids), free(s->extra_w);
    free(s->corr.seq_start), free(s->corr.mask), free(s->corr.iw), free(s->corr.keep);
    free(s->corr.iw_rows), free(s->corr.row_start);
    prl_grpo_replay_free(&s->rp);
}

static prl_status step_alloc(step_ctx *s)
{
    const prl_grpo_batch *b = s->b;
    size_t rows = (size_t)s->c->micro_rows * (size_t)s->ctx, nr = b->n_response ? b->n_response : 1;
    s->kept = malloc((size_t)b->n * sizeof *s->kept);
    s->first = malloc((size_t)b->n * sizeof *s->first);
    s->adv = malloc((size_t)b->n * sizeof *s->adv);
    s->lp_old = calloc(nr, sizeof *s->lp_old);
    s->lp_ref = calloc(nr, sizeof *s->lp_ref);
    s->train = malloc((size_t)s->ctx);
    s->lp_new = malloc(rows * sizeof *s->lp_new);
    s->old_rows = malloc(rows * sizeof *s->old_rows);
    s->ref_rows = malloc(rows * sizeof *s->ref_rows);
    s->mask_rows = malloc(rows);
    s->adv_rows = malloc((size_t)s->c->micro_rows * sizeof *s->adv_rows);
    if (s->c->token_adv && !(s->adv_tok_rows = malloc(rows * sizeof *s->adv_tok_rows)))
        return prl_error_set(PRL_ERR_NOMEM, "grpo step token advantages");
    size_t k = (size_t)s->c->distill_k;
    if (k && (!(s->extra_ids = malloc(rows * k * sizeof *s->extra_ids)) ||
              !(s->extra_w = malloc(rows * k * sizeof *s->extra_w))))
        return prl_error_set(PRL_ERR_NOMEM, "grpo step distillation targets");
    s->corr.seq_start = malloc(((size_t)b->n + 1) * sizeof *s->corr.seq_start);
    s->corr.mask = calloc(nr, 1);
    s->corr.iw = calloc(nr, sizeof *s->corr.iw);
    s->corr.keep = calloc(nr, 1);
    s->corr.iw_rows = malloc(rows * sizeof *s->corr.iw_rows);
    s->corr.row_start = malloc(((size_t)s->c->micro_rows + 1) * sizeof *s->corr.row_start);
    if (!s->kept || !s->first || !s->adv || !s->lp_old || !s->lp_ref || !s->train || !s->lp_new ||
        !s->old_rows || !s->ref_rows || !s->mask_rows || !s->adv_rows || !s->corr.seq_start ||
        !s->corr.mask || !s->corr.iw || !s->corr.keep || !s->corr.iw_rows || !s->corr.row_start)
        return prl_error_set(PRL_ERR_NOMEM, "grpo step of %d samples", b->n);
    prl_status rc = prl_batch_buf_init(&s->bb, s->c->micro_rows, s->ctx);
    return rc ? rc : prl_grpo_replay_init(&s->rp, s->m, b, s->c, s->c->micro_rows, s->ctx);
}

/* Advantages and the kept samples; reward and advantage stats. */
static prl_status step_advantages(step_ctx *s, prl_grpo_step_stats *st)
{
    const prl_grpo_batch *b = s->b;
    double *r = malloc((size_t)b->n * sizeof *r);
    int64_t *g = malloc((size_t)b->n * sizeof *g);
    int *keep = malloc((size_t)b->n * sizeof *keep);
    prl_status rc = r && g && keep ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "advantages");
    for (int i = 0; rc == PRL_OK && i < b->n; i++) {
        r[i] = b->rewards[i], g[i] = b->groups[i];
        st->reward_mean += r[i];
        st->accuracy += r[i] == 1.0;
    }
    prl_grpo_adv_stats as;
    if (rc == PRL_OK)
        rc = prl_grpo_advantages(s->adv, keep, r, g, b->n, s->c->baseline, s->c->adv_norm,
                                 s->c->adv_eps, s->c->singleton, &as);
    if (rc == PRL_OK) {
        st->reward_mean /= b->n, st->accuracy /= b->n;
        st->groups = as.groups, st->singletons = as.singletons;
        st->constant_groups = as.constant_groups;
        double sum = 0, sq = 0;
        st->adv_min = INFINITY, st->adv_max = -INFINITY;
        size_t first = 0;
        for (int i = 0; i < b->n; i++) {
            int len = prl_grpo_batch_response_len(b, i);
            s->first[i] = first;
            first += (size_t)len;
            if (!keep[i]) continue;
            s->kept[s->n_kept++] = i;
            sum += s->adv[i], sq += s->adv[i] * s->adv[i];
            st->adv_min = fmin(st->adv_min, s->adv[i]), st->adv_max = fmax(st->adv_max, s->adv[i]);
            st->tokens += b->offsets[i + 1] - b->offsets[i];
            for (int j = 0; j < len; j++) st->loss_tokens += b->mask[s->first[i] + j];
        }
        st->dropped = b->n - s->n_kept;
        if (s->n_kept) {
            st->adv_mean = sum / s->n_kept;
            st->adv_std = sqrt(fmax(0, sq / s->n_kept - st->adv_mean * st->adv_mean));
        } else {
            st->adv_min = st->adv_max = 0;
        }
    }
    free(r), free(g), free(keep);
    return rc;
}

/* Pack kept samples [k0, k0 + rows) into the micro-batch rows (T = the longest). */
static prl_batch pack_rows(step_ctx *s, int k0, int rows)
{
    const prl_grpo_batch *b = s->b;
    int T = 1;
    for (int r = 0; r < rows; r++) {
        int i = s->kept[k0 + r], len = b->offsets[i + 1] - b->offsets[i];
        T = len > T ? len : T;
    }
    for (int r = 0; r < rows; r++) {
        int i = s->kept[k0 + r], len = b->offsets[i + 1] - b->offsets[i], pl = b->prompt_lens[i];
        for (int t = 0; t < len; t++) s->train[t] = t >= pl && b->mask[s->first[i] + t - pl];
        prl_batch_buf_set_row(&s->bb, T, r, b->tokens + b->offsets[i], len, s->train);
        s->adv_rows[r] = s->c->seq_adv_weight * s->adv[i];
    }
    prl_batch batch = prl_batch_buf_view(&s->bb, rows, T);
    batch.temperature = s->c->temperature;
    return batch;
}

/* Response log-probs of the rows (loss tokens only) ↔ the flat per-response layout. The
** position of response token j is prompt_len − 1 + j. */
static void rows_to_flat(const step_ctx *s, int k0, const prl_batch *batch, const float *rows,
                         float *flat)
{
    for (int r = 0; r < batch->B; r++) {
        int i = s->kept[k0 + r], pl = s->b->prompt_lens[i],
            len = prl_grpo_batch_response_len(s->b, i);
        for (int j = 0; j < len; j++)
            flat[s->first[i] + j] = rows[(size_t)r * batch->T + pl - 1 + j];
    }
}

static void flat_to_rows(const step_ctx *s, int k0, const prl_batch *batch, const float *flat,
                         float *rows)
{
    memset(rows, 0, (size_t)batch->B * batch->T * sizeof *rows);
    for (int r = 0; r < batch->B; r++) {
        int i = s->kept[k0 + r], pl = s->b->prompt_lens[i],
            len = prl_grpo_batch_response_len(s->b, i);
        for (int j = 0; j < len; j++)
            rows[(size_t)r * batch->T + pl - 1 + j] = flat[s->first[i] + j];
    }
}

/* The rows' loss mask: 1 where a position has a target (a response token with mask 1). */
static void mask_of_rows(const prl_batch *batch, uint8_t *mask)
{
    for (size_t p = 0; p < (size_t)batch->B * batch->T; p++) mask[p] = batch->targets[p] >= 0;
}

static prl_status step_corr_prepare(step_ctx *s, prl_grpo_step_stats *st);

/* lp_old of the rows into lp_new: the native pass (routing metrics and the replay choice at
** θ_old), then, when the mode replays records, the pass with the chosen routes (docs/replay.md). */
static prl_status old_logprobs(step_ctx *s, int k0, prl_batch *batch)
{
    prl_status rc = prl_model_logprobs(s->m, batch, s->lp_new);
    if (rc) return rc;
    prl_grpo_replay_observe(&s->rp, s->m, batch, s->kept + k0);
    if (!prl_grpo_replay_relog(&s->rp)) return PRL_OK;
    batch->route_override = prl_grpo_replay_override(&s->rp, batch, s->kept + k0);
    rc = prl_model_logprobs(s->m, batch, s->lp_new);
    if (rc == PRL_OK) prl_grpo_replay_observe_used(&s->rp, s->m, batch, s->kept + k0);
    batch->route_override = NULL; /* the reference model routes by itself */
    return rc;
}

/* Old (and reference) log-probs of every kept sample, before any update; the mismatch stats
** and the decoupled correction weights. */
static prl_status step_recompute(step_ctx *s, prl_grpo_step_stats *st)
{
    prl_status rc = PRL_OK;
    for (int k0 = 0; rc == PRL_OK && k0 < s->n_kept; k0 += s->c->micro_rows) {
        int rows = s->n_kept - k0 < s->c->micro_rows ? s->n_kept - k0 : s->c->micro_rows;
        prl_batch batch = pack_rows(s, k0, rows);
        rc = old_logprobs(s, k0, &batch);
        if (rc == PRL_OK) rows_to_flat(s, k0, &batch, s->lp_new, s->lp_old);
        if (rc == PRL_OK && s->c->kl_coef > 0) {
            rc = prl_model_logprobs(s->c->ref, &batch, s->lp_new);
            if (rc == PRL_OK) rows_to_flat(s, k0, &batch, s->lp_new, s->lp_ref);
        }
    }
    if (rc) return prl_error_wrap(rc, "grpo step: old log-probs: ");
    return step_corr_prepare(s, st);
}

/* The k3 KL to the reference (rl.md §1.4) of the rows' loss tokens, added to the token weights
** with the aggregation's coefficients: returns the part's Σ coef·k3. */
static double add_kl(step_ctx *s, const prl_batch *batch, int n_tokens, int n_seqs)
{
    double kl = 0;
    for (int r = 0; r < batch->B; r++) {
        int k = 0;
        for (int t = 0; t < batch->T; t++) k += s->mask_rows[(size_t)r * batch->T + t];
        if (!k) continue;
        double coef = prl_grpo_agg_coefficient(&s->c->loss, k, n_tokens, n_seqs);
        for (int t = 0; t < batch->T; t++) {
            size_t p = (size_t)r * batch->T + t;
            if (!s->mask_rows[p]) continue;
            double d = (double)s->ref_rows[p] - s->lp_new[p];
            double kc = d < -20 ? -20 : d > 20 ? 20 : d, e = exp(kc), k3 = e - kc - 1;
            double g = kc == d && k3 <= 10 ? 1 - e : 0; /* ∂k3/∂lp; a clamp carries none */
            kl += coef * (k3 > 10 ? 10 : k3);
            s->bb.weights[p] = (float)(s->bb.weights[p] + s->c->kl_coef * coef * g);
        }
    }
    return kl;
}

/* The distillation targets of the rows (c->distill_*): on each loss token, weight
** −coef·q of each id, coef the aggregation's for the row (as add_kl), so the term's loss is
** −Σ q·log p_θ(id) aggregated like the surrogate. Sets the batch's extra targets. */
static void add_distill(step_ctx *s, int k0, prl_batch *batch, int n_tokens, int n_seqs)
{
    int K = s->c->distill_k;
    size_t cells = (size_t)batch->B * batch->T * K;
    for (size_t e = 0; e < cells; e++) s->extra_ids[e] = -1, s->extra_w[e] = 0;
    for (int r = 0; r < batch->B; r++) {
        int i = s->kept[k0 + r], pl = s->b->prompt_lens[i],
            len = prl_grpo_batch_response_len(s->b, i), n = 0;
        for (int t = 0; t < batch->T; t++) n += s->mask_rows[(size_t)r * batch->T + t];
        if (!n) continue;
        double coef = prl_grpo_agg_coefficient(&s->c->loss, n, n_tokens, n_seqs);
        for (int j = 0; j < len; j++) {
            size_t f = s->first[i] + j, p = (size_t)r * batch->T + pl - 1 + j;
            if (!s->mask_rows[p]) continue;
            for (int q = 0; q < K; q++) {
                s->extra_ids[p * K + q] = s->c->distill_ids[f * K + q];
                s->extra_w[p * K + q] = (float)(-coef * s->c->distill_w[f * K + q]);
            }
        }
    }
    batch->n_extra = K, batch->extra_targets = s->extra_ids, batch->extra_weights = s->extra_w;
}

/* Valid tokens and sequences of kept samples [k0, k1); with `keep`, only the tokens the
** correction keeps (denominator `kept`, rl.md §2.8). */
static void count_tokens(const step_ctx *s, int k0, int k1, const uint8_t *keep, int *n_tokens,
                         int *n_seqs)
{
    *n_tokens = *n_seqs = 0;
    for (int k = k0; k < k1; k++) {
        int i = s->kept[k], v = 0;
        for (int j = 0; j < prl_grpo_batch_response_len(s->b, i); j++) {
            size_t f = s->first[i] + j;
            v += s->b->mask[f] && (!keep || keep[f]);
        }
        *n_tokens += v, *n_seqs += v > 0;
    }
}

static const uint8_t *step_corr_count_keep(const step_ctx *s);
static prl_grpo_loss_config step_corr_loss(const step_ctx *s);
static prl_status step_corr_rows(step_ctx *s, int k0, const prl_batch *batch, const float **iw,
                                 prl_grpo_corr_stats *cs);

/* What one micro-batch adds to its update's stats; rank 0 adds the records up in
** micro-batch order (the order one process adds them in). */
typedef struct mb_record {
    prl_grpo_loss_stats loss;
    double kl;                /* Σ coef·k3 of the part */
    prl_grpo_corr_stats corr; /* bypass mode's applied weights (tokens 0: none) */
} mb_record;

/* The micro-batches of one update: kept samples [k0, k1) in rows of micro_rows. */
typedef struct update_ctx {
    step_ctx *s;
    int k0, k1;
    int n_tokens, n_seqs; /* the update's aggregation denominators */
    prl_grpo_loss_config loss;
} update_ctx;

/* Micro-batch j alone: zeroed gradients, forward, token weights, backward; its gradient
** into grad (a prl_grpo_leaf_fn of reduce.h). */
static prl_status micro_grad(void *ctx, int j, prl_real *grad, void *record)
{
    update_ctx *u = ctx;
    step_ctx *s = u->s;
    mb_record *rec = record;
    memset(rec, 0, sizeof *rec);
    int r0 = u->k0 + j * s->c->micro_rows;
    int rows = u->k1 - r0 < s->c->micro_rows ? u->k1 - r0 : s->c->micro_rows;
    prl_model_zero_grad(s->m);
    prl_batch batch = pack_rows(s, r0, rows);
    batch.route_override = prl_grpo_replay_override(&s->rp, &batch, s->kept + r0);
    mask_of_rows(&batch, s->mask_rows);
    /* before the forward, which validates the ids (they come off the bus) */
    if (s->c->distill_k) add_distill(s, r0, &batch, u->n_tokens, u->n_seqs);
    prl_status rc = prl_model_forward(s->m, &batch, s->lp_new, NULL);
    if (rc) return rc;
    flat_to_rows(s, r0, &batch, s->corr.bypass ? s->b->logprobs : s->lp_old, s->old_rows);
    const float *iw = NULL;
    if ((rc = step_corr_rows(s, r0, &batch, &iw, &rec->corr))) return rc;
    if (s->adv_tok_rows) flat_to_rows(s, r0, &batch, s->c->token_adv, s->adv_tok_rows);
    rc = prl_grpo_loss_partial_tok(&u->loss, s->lp_new, s->old_rows, s->adv_rows, s->adv_tok_rows,
                                   s->mask_rows, iw, rows, batch.T, u->n_tokens, u->n_seqs,
                                   s->bb.weights, &rec->loss);
    if (rc) return rc;
    if (s->c->kl_coef > 0) {
        flat_to_rows(s, r0, &batch, s->lp_ref, s->ref_rows);
        rec->kl = add_kl(s, &batch, u->n_tokens, u->n_seqs);
    }
    if (s->c->scaler) batch.loss_scale = s->c->scaler->scale; /* scale·∂loss/∂θ */
    if ((rc = prl_model_backward(s->m, &batch))) return rc;
    memcpy(grad, s->m->grads, s->m->n_params * sizeof *grad);
    return PRL_OK;
}

static void corr_add(step_corr *k, const prl_grpo_corr_stats *cs);

static const prl_grpo_comm *step_comm(const step_ctx *s)
{
    return s->c->comm && s->c->comm->size > 1 ? s->c->comm : NULL;
}

/* The gradient of the update on kept samples [k0, k1) into m->grads (on rank 0): the
** micro-batch gradients summed over the fixed tree (reduce.h), the ranks sharing the
** micro-batches; the parts' stats summed in micro-batch order. */
static prl_status minibatch_grads(step_ctx *s, int k0, int k1, prl_grpo_loss_stats *sum, double *kl)
{
    update_ctx u = {.s = s, .k0 = k0, .k1 = k1, .loss = step_corr_loss(s)};
    count_tokens(s, k0, k1, step_corr_count_keep(s), &u.n_tokens, &u.n_seqs);
    int M = (k1 - k0 + s->c->micro_rows - 1) / s->c->micro_rows;
    mb_record *rec = calloc((size_t)M, sizeof *rec);
    if (!rec) return prl_error_set(PRL_ERR_NOMEM, "grpo step: %d micro-batch records", M);
    const prl_grpo_comm *cm = step_comm(s);
    size_t n_counts = (size_t)s->m->n_moe_all * s->m->cfg.n_routed_experts;
    if (cm && cm->rank) /* a rank's counts are its share's; rank 0 adds them to its own */
        memset(s->m->expert_counts, 0, n_counts * sizeof *s->m->expert_counts);
    prl_grpo_reduce r = {.M = M,
                         .n = s->m->n_params,
                         .record_bytes = sizeof *rec,
                         .counts = s->m->expert_counts,
                         .n_counts = cm ? n_counts : 0,
                         .comm = cm,
                         .leaf = micro_grad,
                         .ctx = &u};
    prl_status rc = prl_grpo_reduce_run(&r, s->m->grads, rec);
    for (int j = 0; rc == PRL_OK && (!cm || cm->rank == 0) && j < M; j++) {
        corr_add(&s->corr, &rec[j].corr);
        sum->loss += rec[j].loss.loss, sum->clipfrac += rec[j].loss.clipfrac;
        sum->clipfrac_lower += rec[j].loss.clipfrac_lower, sum->ppo_kl += rec[j].loss.ppo_kl;
        *kl += rec[j].kl;
    }
    free(rec);
    return rc;
}

/* Rank 0's part of an update, after its gradient: the loss check, clip, optimizer step (or,
** with a loss scaler, a skip on an overflow), the router bias; adds to the stats. */
static prl_status apply_update(step_ctx *s, prl_optim *o, int k0, int k1,
                               const prl_grpo_loss_stats *sum, double kl, prl_grpo_step_stats *st)
{
    double loss = sum->loss + s->c->kl_coef * kl;
    if (!isfinite(loss))
        return prl_error_set(PRL_ERR_NUMERIC, "grpo step: loss is %g on samples [%d, %d)", loss,
                             s->kept[k0], s->kept[k1 - 1] + 1);
    st->loss += loss, st->clipfrac += sum->clipfrac, st->clipfrac_lower += sum->clipfrac_lower;
    st->ppo_kl += sum->ppo_kl, st->kl += kl;
    double clip = o->cfg.grad_clip; /* the step's bound, restored after */
    o->cfg.grad_clip = s->c->grad_clip;
    prl_optim_stats os;
    int skip;
    prl_status rc = prl_optim_step_scaled(o, s->m, s->c->scaler, &os, &skip);
    o->cfg.grad_clip = clip;
    if (rc) return rc;
    if (s->c->scaler) {
        st->scaler_on = 1, st->loss_scale = s->c->scaler->scale;
        st->skipped_total = s->c->scaler->skipped;
    }
    if (skip) { /* weights, router bias (its expert counts carry over) and step count kept */
        st->skipped++;
        return PRL_OK;
    }
    prl_model_update_router_bias(s->m);
    st->updates++;
    st->experts_clipped += os.experts_clipped;
    st->grad_norm += os.grad_norm, st->grad_norm_max = fmax(st->grad_norm_max, os.grad_norm);
    st->lr = os.lr;
    return PRL_OK;
}

/* One update on kept samples [k0, k1). With ranks, rank 0 applies it and every rank then
** holds rank 0's weights, router bias and loss scale (or rank 0's failure). */
static prl_status step_update(step_ctx *s, prl_optim *o, int k0, int k1, prl_grpo_step_stats *st)
{
    const prl_grpo_comm *cm = step_comm(s);
    prl_grpo_loss_stats sum = {0};
    double kl = 0;
    prl_status rc = minibatch_grads(s, k0, k1, &sum, &kl);
    if (rc == PRL_OK && (!cm || cm->rank == 0)) rc = apply_update(s, o, k0, k1, &sum, kl, st);
    if (!cm) return rc;
    prl_status r0 = prl_grpo_reduce_bcast_model(cm, s->m, s->c->scaler, cm->rank ? PRL_OK : rc);
    return cm->rank && rc ? rc : r0;
}

static void step_corr_stats(const step_ctx *s, prl_grpo_step_stats *st);

static prl_status step_run(step_ctx *s, prl_optim *o, prl_grpo_step_stats *st)
{
    prl_status rc = step_advantages(s, st);
    if (rc == PRL_OK) rc = step_recompute(s, st);
    int M = s->c->minibatches, n = s->n_kept;
    for (int e = 0; rc == PRL_OK && e < s->c->ppo_epochs; e++)
        for (int k = 0; rc == PRL_OK && k < M; k++) {
            int k0 = (int)((int64_t)n * k / M), k1 = (int)((int64_t)n * (k + 1) / M);
            if (k1 > k0) rc = step_update(s, o, k0, k1, st);
        }
    if (rc == PRL_OK && st->updates + st->skipped) { /* the loss of every update, the
                                                      ** gradient norm of the applied ones */
        double u = st->updates + st->skipped;
        st->loss /= u, st->clipfrac /= u, st->clipfrac_lower /= u, st->ppo_kl /= u, st->kl /= u;
        if (st->updates) st->grad_norm /= st->updates;
    }
    if (rc == PRL_OK) step_corr_stats(s, st);
    if (rc == PRL_OK) prl_grpo_replay_stats(&s->rp, st);
    return rc;
}

prl_status prl_grpo_train_step(prl_model *m, prl_optim *o, const prl_grpo_batch *b,
                               const prl_grpo_train_config *c, prl_grpo_step_stats *st_out)
{
    double t0 = prl_now();
    prl_status rc = prl_grpo_train_config_check(c);
    if (rc == PRL_OK && c->kl_coef > 0 && !c->ref)
        rc = prl_error_set(PRL_ERR_ARG,
                           "grpo.kl_coef = %g needs a reference model "
                           "(prl_grpo_train_config.ref)",
                           c->kl_coef);
    if (rc == PRL_OK && c->kl_coef > 0 &&
        (c->ref->cfg.vocab_size != m->cfg.vocab_size ||
         c->ref->cfg.max_position_embeddings < m->cfg.max_position_embeddings))
        rc = prl_error_set(PRL_ERR_ARG, "grpo.kl_coef: the reference model's vocabulary or "
                                        "context differs from the policy's");
    if (rc == PRL_OK) rc = prl_grpo_batch_check(b);
    if (rc == PRL_OK && (rc = prl_grpo_batch_fits(m, b))) rc = prl_error_wrap(rc, "grpo step: ");
    if (rc) return rc;
    step_ctx s = {.m = m, .b = b, .c = c, .ctx = m->cfg.max_position_embeddings};
    prl_grpo_step_stats st = {.samples = b->n, .expert_clip_on = o->cfg.expert_clip > 0};
    rc = step_alloc(&s);
    if (rc == PRL_OK) rc = step_run(&s, o, &st);
    step_free(&s);
    st.seconds = prl_now() - t0;
    if (rc == PRL_OK && st_out) *st_out = st;
    return rc;
}

/* ------------------------------------------------------------------ mismatch correction */
/* rl.md §2 in the step (docs/grpo.md "Mismatch corrections"): the metrics and the PCC rule
** once per step from the old log-probs, the weights once (decoupled) or per forward (bypass),
** the denominator's token count. Kept apart from the forward/backward code above. */

/* Pool one weight computation into the step's applied-correction sums. */
static void corr_add(step_corr *k, const prl_grpo_corr_stats *cs)
{
    if (!cs->tokens) return;
    k->min = k->n ? fmin(k->min, cs->w_min) : cs->w_min;
    k->max = k->n ? fmax(k->max, cs->w_max) : cs->w_max;
    k->n += cs->tokens, k->masked += cs->masked;
    k->sum += cs->w_sum, k->sq += cs->w_sq;
}

/* After the old log-probs: the metrics over the kept samples' loss tokens, the setting the
** PCC rule picks and, in decoupled mode, the weights and keep mask of every token. */
static prl_status step_corr_prepare(step_ctx *s, prl_grpo_step_stats *st)
{
    const prl_grpo_batch *b = s->b;
    const prl_grpo_corr_config *c = &s->c->corr;
    step_corr *k = &s->corr;
    k->active = c->kind != PRL_GRPO_CORR_NONE;
    k->bypass = c->mode == PRL_GRPO_MODE_BYPASS;
    for (int i = 0; i < b->n; i++) k->seq_start[i] = (int32_t)s->first[i];
    k->seq_start[b->n] = (int32_t)b->n_response;
    memset(k->mask, 0, b->n_response); /* dropped samples are not measured */
    for (int j = 0; j < s->n_kept; j++) {
        int i = s->kept[j];
        memcpy(k->mask + s->first[i], b->mask + s->first[i],
               (size_t)prl_grpo_batch_response_len(b, i));
    }
    prl_status rc = prl_grpo_mismatch_metrics(c, s->lp_old, b->logprobs, k->mask, k->seq_start,
                                              b->n, &st->mm, &k->bd);
    if (rc) return prl_error_wrap(rc, "grpo step: ");
    st->mismatch = st->mm.tokens ? st->mm.logprob_diff_mean : 0;
    st->mismatch_max = st->mm.tokens ? st->mm.logprob_diff_max : 0;
    if (k->bypass) return PRL_OK; /* bypass weights come with every forward (step_corr_rows) */
    prl_grpo_corr_stats cs;
    rc = prl_grpo_corr_weights(c, &k->bd, s->lp_old, b->logprobs, k->mask, k->seq_start, b->n,
                               k->iw, k->keep, &cs);
    if (rc) return prl_error_wrap(rc, "grpo step: ");
    corr_add(k, &cs);
    return PRL_OK;
}

/* The keep mask the token count uses: only with denominator `kept` and a correction on. */
static const uint8_t *step_corr_count_keep(const step_ctx *s)
{
    return s->corr.active && s->c->corr.denominator == PRL_GRPO_DENOM_KEPT ? s->corr.keep : NULL;
}

/* The token loss: bypass mode's `reinforce`, else the configured clipped surrogate. */
static prl_grpo_loss_config step_corr_loss(const step_ctx *s)
{
    prl_grpo_loss_config l = s->c->loss;
    if (s->c->corr.mode == PRL_GRPO_MODE_BYPASS) l.kind = s->c->corr.bypass_loss;
    return l;
}

/* The micro-batch's token weights (*iw, NULL when no correction): decoupled — the step's
** weights moved to the rows, and with denominator `kept` the masked tokens leave the rows'
** loss mask; bypass — computed from this forward's lp_new (detached) against the rollout's
** log-probs, which old_rows holds in bypass mode. */
static prl_status step_corr_rows(step_ctx *s, int k0, const prl_batch *batch, const float **iw,
                                 prl_grpo_corr_stats *cs)
{
    step_corr *k = &s->corr;
    *iw = NULL;
    memset(cs, 0, sizeof *cs);
    if (!k->active) return PRL_OK;
    if (!k->bypass) {
        flat_to_rows(s, k0, batch, k->iw, k->iw_rows);
        if (step_corr_count_keep(s))
            for (int r = 0; r < batch->B; r++) {
                int i = s->kept[k0 + r], pl = s->b->prompt_lens[i];
                for (int j = 0; j < prl_grpo_batch_response_len(s->b, i); j++)
                    s->mask_rows[(size_t)r * batch->T + pl - 1 + j] &= k->keep[s->first[i] + j];
            }
        *iw = k->iw_rows;
        return PRL_OK;
    }
    for (int r = 0; r <= batch->B; r++) k->row_start[r] = r * batch->T;
    prl_status rc = prl_grpo_corr_weights(&s->c->corr, &k->bd, s->lp_new, s->old_rows, s->mask_rows,
                                          k->row_start, batch->B, k->iw_rows, NULL, cs);
    if (rc) return rc;
    *iw = k->iw_rows; /* cs is pooled in micro-batch order (minibatch_grads) */
    return PRL_OK;
}

/* The applied correction's stats (all 1, nothing masked, when there is none). */
static void step_corr_stats(const step_ctx *s, prl_grpo_step_stats *st)
{
    const step_corr *k = &s->corr;
    st->corr = s->c->corr;
    if (!k->active) {
        st->is_weight_mean = st->is_weight_min = st->is_weight_max = st->is_weight_ess = 1;
        return;
    }
    st->corr_masked_frac = k->n ? (double)k->masked / k->n : NAN;
    st->is_weight_mean = k->n ? k->sum / k->n : NAN;
    st->is_weight_min = k->n ? k->min : NAN;
    st->is_weight_max = k->n ? k->max : NAN;
    st->is_weight_ess = k->sq > 0 ? k->sum * k->sum / ((double)k->n * k->sq) : NAN;
}

/* ------------------------------------------------------------------ metrics --------- */

/* A number, or null for NaN and ±inf (JSON has neither): "undefined" in the metrics. */
static void set_real(json_t *o, const char *key, double v)
{
    json_object_set_new(o, key, isfinite(v) ? json_real(v) : json_null());
}

/* The mismatch metrics and the applied correction (rl.md §6), flat beside the step's stats. */
static void mismatch_to_json(json_t *o, const prl_grpo_step_stats *st)
{
    const prl_grpo_mismatch_stats *m = &st->mm;
    json_object_set_new(o, "correction", json_string(prl_grpo_corr_name(st->corr.kind)));
    json_object_set_new(o, "correction_mode", json_string(prl_grpo_corr_mode_name(st->corr.mode)));
    json_object_set_new(o, "denominator",
                        json_string(prl_grpo_denominator_name(st->corr.denominator)));
    json_object_set_new(o, "pcc_strict", json_integer(m->strict));
    const struct {
        const char *k;
        double v;
    } reals[] = {{"prob_diff_mean", m->prob_diff_mean},
                 {"prob_diff_max", m->prob_diff_max},
                 {"prob_diff_std", m->prob_diff_std},
                 {"pcc", m->pcc},
                 {"pcc_logprob", m->pcc_logprob},
                 {"k1", m->k1},
                 {"k2", m->k2},
                 {"k3", m->k3},
                 {"chi2_token", m->chi2_token},
                 {"chi2_seq", m->chi2_seq},
                 {"ess", m->ess},
                 {"extreme_frac", m->extreme_frac},
                 {"tis_clipfrac", m->tis_clipfrac},
                 {"mis_masked_frac", m->mis_masked_frac},
                 {"icepop_masked_frac", m->icepop_masked_frac},
                 {"kpop_masked_frac", m->kpop_masked_frac},
                 {"corr_masked_frac", st->corr_masked_frac},
                 {"is_weight_mean", st->is_weight_mean},
                 {"is_weight_min", st->is_weight_min},
                 {"is_weight_max", st->is_weight_max},
                 {"is_weight_ess", st->is_weight_ess}};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) set_real(o, reals[i].k, reals[i].v);
}

char *prl_grpo_step_stats_to_json(const prl_grpo_step_stats *st)
{
    json_t *o = json_object();
    if (!o) return NULL;
    const struct {
        const char *k;
        long v;
    } ints[] = {{"samples", st->samples},       {"groups", st->groups},
                {"singletons", st->singletons}, {"constant_groups", st->constant_groups},
                {"dropped", st->dropped},       {"updates", st->updates},
                {"tokens", st->tokens},         {"loss_tokens", st->loss_tokens}};
    const struct {
        const char *k;
        double v;
    } reals[] = {{"reward_mean", st->reward_mean},
                 {"accuracy", st->accuracy},
                 {"adv_mean", st->adv_mean},
                 {"adv_std", st->adv_std},
                 {"adv_min", st->adv_min},
                 {"adv_max", st->adv_max},
                 {"loss", st->loss},
                 {"clipfrac", st->clipfrac},
                 {"clipfrac_lower", st->clipfrac_lower},
                 {"ppo_kl", st->ppo_kl},
                 {"kl", st->kl},
                 {"grad_norm", st->grad_norm},
                 {"grad_norm_max", st->grad_norm_max},
                 {"lr", st->lr},
                 {"mismatch", st->mismatch},
                 {"mismatch_max", st->mismatch_max},
                 {"seconds", st->seconds}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        json_object_set_new(o, ints[i].k, json_integer(ints[i].v));
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) set_real(o, reals[i].k, reals[i].v);
    mismatch_to_json(o, st);
    if (st->expert_clip_on) /* grpo.expert_clip (docs/grpo.md): present only when it is on */
        json_object_set_new(o, "experts_clipped", json_integer(st->experts_clipped));
    if (st->scaler_on) { /* loss scaling (docs/store.md): present only when a scaler ran */
        json_object_set_new(o, "loss_scale", json_real(st->loss_scale));
        json_object_set_new(o, "overflow", json_integer(st->skipped > 0));
        json_object_set_new(o, "skipped", json_integer(st->skipped));
        json_object_set_new(o, "skipped_total", json_integer(st->skipped_total));
    }
    prl_grpo_replay_stats_json(o, st);
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return text;
}
