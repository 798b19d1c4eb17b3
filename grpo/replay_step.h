/*
** replay_step.h — private to grpo/: routing replay inside one GRPO step (docs/replay.md;
** shared/spec/rl.md §3.3–§3.6). trainer.c calls it at three places: after each micro-batch
** of the native old-policy pass (observe: metrics and the per-position choice), before each
** forward that must replay (override), and at the end of the step (stats).
**
** The choice is made once, in the old-policy pass at θ_old, and reused by the lp_old
** recompute (R3, Masked R3) and by every update forward, so the PPO ratio compares like with
** like (rl.md §3.4 decision 2).
**
** Ownership: prl_grpo_replay owns its arrays (init/free); the model and batch are borrowed.
*/
#ifndef PRL_GRPO_REPLAY_STEP_H
#define PRL_GRPO_REPLAY_STEP_H

#include "grpo/grpo.h"
#include "replay/replay.h"

#include <jansson.h>

typedef struct prl_grpo_replay {
    prl_replay_mode mode;
    double tau, alarm;
    int n_moe, K, E;
    const prl_grpo_batch *b;
    size_t *at;      /* [n] offset of sample i's rows in rec/chosen (ids), SIZE_MAX: none */
    int *rows;       /* [n] route positions of sample i (length − 1) */
    int *has_rec;    /* [n] sample i has a usable record */
    int32_t *rec;    /* sample i: [n_moe][rows_i][K] recorded ids (positions without: native) */
    int32_t *chosen; /* sample i: [n_moe][rows_i][K] the override rows chosen at θ_old */
    int32_t *ov;     /* [n_moe][micro_rows × ctx][K] one micro-batch's override */
    int32_t *native; /* [rows_i × K] scratch: one layer's native rows of one sample */
    prl_replay_layer_stats layer[PRL_MAX_LAYERS];
    double used_overlap[PRL_MAX_LAYERS]; /* Σ overlap of the routes lp_old used vs the record */
    long used_compared[PRL_MAX_LAYERS];
    double *counts; /* [n_moe × E] native expert load */
    int records, rejected;
} prl_grpo_replay;

/* Set up for batch b: unpack and check every sample's record (a bad one is rejected and
** counted; its sample routes natively). A record of another shape than the model's (MoE
** layers, K) is PRL_ERR_RANGE when the mode replays records (r3, masked_r3), else ignored. */
prl_status prl_grpo_replay_init(prl_grpo_replay *r, const prl_model *m, const prl_grpo_batch *b,
                                const prl_grpo_train_config *c, int micro_rows, int ctx);
void prl_grpo_replay_free(prl_grpo_replay *r);
/* After the native pass over `batch` whose row j is sample samples[j]: count the native load,
** compare with the records and choose each position's override row. */
void prl_grpo_replay_observe(prl_grpo_replay *r, const prl_model *m, const prl_batch *batch,
                             const int *samples);
/* After the replaying lp_old pass over `batch`: compare the routes it used with the records
** (the overlap R3 must bring to 1 on replayed positions). */
void prl_grpo_replay_observe_used(prl_grpo_replay *r, const prl_model *m, const prl_batch *batch,
                                  const int *samples);
/* 1 when lp_old must be recomputed with the override (R3, Masked R3). */
int prl_grpo_replay_relog(const prl_grpo_replay *r);
/* The override for `batch` (rows samples[j]) from the chosen rows: positions without a route
** and padding route natively. NULL in mode none (the engine's plain forward). */
const int32_t *prl_grpo_replay_override(prl_grpo_replay *r, const prl_batch *batch,
                                        const int *samples);
/* Fill the step's routing stats. */
void prl_grpo_replay_stats(const prl_grpo_replay *r, prl_grpo_step_stats *st);

/* replay.mode, replay.tau, replay.entropy_alarm of the job into c (errors name the key), and
** their range check. */
prl_status prl_grpo_replay_config_from_job(prl_grpo_train_config *c,
                                           const struct prl_job_config *j);
prl_status prl_grpo_replay_config_check(const prl_grpo_train_config *c);
/* Add the routing stats to a step's JSON object (nothing for a model without MoE layers):
** replay_mode, route_overlap, route_overlap_used, route_replayed, route_entropy (arrays over
** the MoE layers, null for NaN), route_entropy_alarm, route_records, route_rejected. */
void prl_grpo_replay_stats_json(json_t *o, const prl_grpo_step_stats *st);

#endif /* PRL_GRPO_REPLAY_STEP_H */
