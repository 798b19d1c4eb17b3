/*
** opd.h — the one public header of opd/: multi-teacher on-policy distillation (shared/spec/rl.md
** §5, docs/opd.md). The student samples (rollout workers, as for GRPO); each sample goes to the
** teacher of its task's domain; a `teacher` process scores the student's tokens with that
** expert's train path; the trainer turns the two log-probs into a per-token advantage and runs
** the GRPO step with it (grpo.h's token advantages: the same clipped surrogate, mismatch
** corrections and routing replay — nothing of the trainer is forked here).
**
** What is here:
**   - advantage.c: the teacher keys — the four domains in lexicographic order (agent, coding,
**     general, reasoning), the order the controller hands them out in (rl.md §5.3) —, the
**     job's opd.* keys as a config, and the per-token advantage: A = coef·(lp_T − lp_S) on
**     the loss tokens (observation tokens stay 0), optional discount, optional clip, the
**     near-zero mask, with the metrics (reverse KL student→teacher, masked and clipped
**     shares, per teacher), and the weights of the top-k distillation term (opd.topk);
**   - batch.c: the teacher side of a step's batch (what the `train` message's teacher frames
**     and a teacher's `taught` answer carry) and the one check of its values;
**   - teacher.c: the teacher's scoring pass (log-probs of the student's tokens, and with
**     opd.topk the expert's own top-k at each), its peak memory, and the teacher-checkpoint check
**     that `prl run` (and `--check`) runs before any process starts;
**   - step.c: the OPD training step over grpo's.
**
** Everything is in double, in index order (deterministic, thread-free). Ownership: every array
** is the caller's unless a struct says it owns it.
*/
#ifndef PRL_OPD_H
#define PRL_OPD_H

#include "engine/engine.h"
#include "grpo/grpo.h"

struct prl_job_config;

/* ---------------------------------------------------------------- teachers --------- */

enum { PRL_OPD_TEACHERS = 4 };

/* Teacher i's key (a domain name), i in [0, PRL_OPD_TEACHERS): "agent", "coding", "general",
** "reasoning" — lexicographic, the loading order. NULL out of range. */
const char *prl_opd_teacher_key(int i);
/* The index of key `name`, or -1 when no teacher has that key. */
int prl_opd_teacher_index(const char *name);

/* ---------------------------------------------------------------- advantages ------- */

typedef struct prl_opd_config {
    double coef; /* opd.coef: A = coef·(lp_T − lp_S) (Tinker kl_penalty_coef, 1) */
    double teacher_coef[PRL_OPD_TEACHERS]; /* opd.teacher_coef.<key> >= 0: coef of teacher k's
                          ** samples is coef·teacher_coef[k] (1 each: one coef for all) */
    double discount; /* opd.discount γ in [0, 1): A_t ← Σ_{k≥t} γ^{k−t} A_k over the
                          ** sequence's loss tokens (0: no future credit) */
    int clip;        /* opd.adv_clip: clamp A to [clip_low, clip_high] after discounting */
    double clip_low, clip_high; /* opd.adv_clip_low, opd.adv_clip_high (−5, 5) */
    double mask_eps;            /* opd.adv_mask_eps δ >= 0: |A| < δ (after clipping) → A = 0 */
    double task_weight;         /* opd.task_weight: weight of the GRPO (task-reward) advantage */
    int topk;         /* opd.topk in [0, PRL_MAX_EXTRA_TARGETS]: the teacher's k most likely
                          ** tokens at each loss token, for the distillation term (0: off) */
    double topk_coef; /* opd.topk_coef >= 0: that term's weight λ (per teacher also
                          ** teacher_coef[k]): loss −λ·Σ_{i<k} p_T(id_i)·log p_θ(id_i) */
} prl_opd_config;

void prl_opd_config_default(prl_opd_config *c);
/* Errors name the key: coef not finite, a teacher_coef < 0 or not finite, discount outside
** [0, 1), clip_low > clip_high, mask_eps < 0, task_weight not finite, topk outside
** [0, PRL_MAX_EXTRA_TARGETS], topk_coef < 0 or not finite. */
prl_status prl_opd_config_check(const prl_opd_config *c);
prl_status prl_opd_config_from_job(prl_opd_config *c, const struct prl_job_config *j);

typedef struct prl_opd_stats {
    long tokens;         /* loss tokens scored */
    double teacher_kl;   /* mean over them of lp_S − lp_T (k1 reverse KL student→teacher) */
    double clipped_frac; /* share whose advantage the clip changed */
    double masked_frac;  /* share masked as near zero (rl.md §5.6
                               ** near_zero_masked_fraction) */
    double adv_mean, adv_min, adv_max; /* of the final token advantages (0 with no token) */
    /* per teacher (index of prl_opd_teacher_key) */
    int samples[PRL_OPD_TEACHERS];
    long teacher_tokens[PRL_OPD_TEACHERS];
    double kl[PRL_OPD_TEACHERS]; /* teacher_kl of its samples (NaN: none) */
    /* with opd.topk (prl_opd_distill_weights; NaN without) */
    double topk_mass;  /* mean over the loss tokens of the teacher's top-k probability */
    double top1_match; /* share of loss tokens the student sampled the teacher's top-1 */
} prl_opd_stats;

/* The per-token OPD advantages of n_seq sequences: token i of sequence s is
** i ∈ [seq_start[s], seq_start[s+1]); lp_s the student's (sampler's) log-probs, lp_t the
** teacher's, mask 1 on the loss tokens; teacher[s] the sequence's teacher index, which picks
** its teacher_coef (may be NULL: coef alone, no per-teacher stats). Writes adv[i] (0 off the
** mask). Errors (PRL_ERR_ARG) name the token: a non-finite log-prob on the mask, a teacher
** index out of range. st may be NULL. */
prl_status prl_opd_advantages(const prl_opd_config *c, const float *lp_s, const float *lp_t,
                              const uint8_t *mask, const int32_t *seq_start, int n_seq,
                              const int32_t *teacher, float *adv, prl_opd_stats *st);

/* The stats as keys of object `o` (a jansson json_t *): opd_teacher_kl, opd_masked_frac,
** opd_clipped_frac, opd_adv_mean/min/max, opd_tokens, and objects opd_teacher_samples,
** opd_teacher_tokens, opd_teacher_kl_by keyed by teacher; with opd.topk also opd_topk_mass
** and opd_top1_match. */
void prl_opd_stats_json(void *o, const prl_opd_stats *st);

/* ---------------------------------------------------------------- the batch -------- */

/* The teacher side of a step's `train` message: per response token the teacher's log-prob,
** per sample its teacher index. Owned (prl_opd_batch_free). */
typedef struct prl_opd_batch {
    int n;             /* samples (= the grpo batch's) */
    size_t n_response; /* response tokens (= the grpo batch's) */
    float *teacher_lp; /* [n_response]; finite and <= 0 on the loss tokens */
    int32_t *teacher;  /* [n] in [0, PRL_OPD_TEACHERS) */
    int topk;          /* teacher top-k per response token (opd.topk; 0: none) */
    int32_t *topk_ids; /* [n_response × topk] (NULL without): ids >= 0 on the loss tokens,
                          ** -1 elsewhere */
    float *topk_lp;    /* [n_response × topk]: their teacher log-probs, finite and <= 0 on
                          ** the loss tokens, 0 elsewhere */
} prl_opd_batch;

prl_status prl_opd_batch_init(prl_opd_batch *ob, int n, size_t n_response, int topk);
void prl_opd_batch_free(prl_opd_batch *ob);
/* The values of ob for the grpo batch b it goes with: the same sample and response counts,
** every teacher index in [0, PRL_OPD_TEACHERS), on a loss token (b's mask) a teacher log-prob
** finite and <= 0 and top-k ids >= 0 with log-probs finite and <= 0, off them top-k ids -1.
** Errors (PRL_ERR_FORMAT) name the frame ('teachers', 'teacher_logprobs',
** 'teacher_topk_ids', 'teacher_topk_logprobs'), the sample and the token. */
prl_status prl_opd_batch_check(const prl_opd_batch *ob, const prl_grpo_batch *b);

/* ---------------------------------------------------------------- the teacher ------ */

/* A `teach` item is a prl_grpo_batch of one teacher's samples whose rewards, groups and
** log-probs are unused (0): tokens, offsets, prompt_lens and the loss mask travel
** (roles/msg/teach.c). */

/* The teacher's log-prob of every response token with mask 1 (train path, native routing,
** no gradient) under log_softmax(logits / temperature), in micro-batches of micro_rows rows;
** 0 off the mask. out[n_response]. The temperature is the one the student's log-probs are
** taken at (prl_grpo_score_temperature of the job), so that lp_T − lp_S compares two
** distributions of the same tempered family. A sample longer than the model's context or a
** token outside its vocabulary is PRL_ERR_RANGE naming the sample; a temperature not > 0 is
** PRL_ERR_ARG. */
prl_status prl_opd_teacher_logprobs(prl_model *m, const prl_grpo_batch *t, int micro_rows,
                                    double temperature, float *out);
/* The same pass, also giving at each loss token the teacher's topk most likely ids (most
** likely first) and their log-probs into topk_ids / topk_lp [n_response × topk] (-1 / 0 off
** the loss tokens); topk 0 (arrays NULL) is prl_opd_teacher_logprobs. PRL_ERR_ARG: topk
** outside [0, min(V, PRL_MAX_EXTRA_TARGETS)]. */
prl_status prl_opd_teacher_score(prl_model *m, const prl_grpo_batch *t, int micro_rows,
                                 double temperature, int topk, float *out, int32_t *topk_ids,
                                 float *topk_lp);

/* The process's peak resident set (VmHWM of /proc/self/status) in KiB; 0 when unknown. */
uint64_t prl_opd_peak_rss_kb(void);

/* ---------------------------------------------------------------- job and step ----- */

/* The teachers a job needs: with opd.enabled, the teacher of every domain its prompts cover
** (task.domain, or with `mixed` each domain whose task.mix share leaves it problems:
** prl_job_mix_problems). need[i] = 1 for each. */
void prl_opd_teachers_needed(const struct prl_job_config *j, int need[PRL_OPD_TEACHERS]);

/* Before any process starts (prl run, prl run --check): every needed teacher's key
** opd.teachers.KEY names a checkpoint directory with config.json, model.safetensors and
** tokenizer.json, whose model config equals model.init's (same vocabulary, same architecture)
** and whose tokenizer.json is byte-identical to model.init's, and whose files verify
** (prl_checkpoint_verify: complete, checksums right; the values are checked when the teacher
** loads it). Errors (PRL_ERR_CONFIG) name the key and the file. A job without opd.enabled
** passes. */
prl_status prl_opd_check_teachers(const struct prl_job_config *j);

/* The distillation term's weights q[n_response × ob->topk] of a step: on each loss token of
** sample i, q = c->topk_coef · c->teacher_coef[teacher] · p_T(id) for each of the teacher's
** top-k ids (0 elsewhere); sets st->topk_mass and st->top1_match (st may be NULL). */
void prl_opd_distill_weights(const prl_opd_config *c, const prl_grpo_batch *b,
                             const prl_opd_batch *ob, float *q, prl_opd_stats *st);

/* One OPD step: the token advantages from the batch's rollout log-probs (lp_S) and `ob`'s
** teacher log-probs, then prl_grpo_train_step with them as tc->token_adv and the GRPO
** advantage weighted by c->task_weight; with ob->topk, also the distillation term
** (prl_opd_distill_weights, grpo's distill_*). `tc` is the trainer's config (corrections,
** replay...); its token_adv / seq_adv_weight / distill_* are set here. */
prl_status prl_opd_train_step(prl_model *m, prl_optim *o, const prl_grpo_batch *b,
                              const prl_opd_batch *ob, const prl_opd_config *c,
                              const prl_grpo_train_config *tc, prl_grpo_step_stats *st,
                              prl_opd_stats *ost);

#endif /* PRL_OPD_H */
