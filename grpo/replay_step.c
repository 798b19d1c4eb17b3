/*
** replay_step.c — routing replay inside one GRPO step (replay_step.h, docs/replay.md): the
** rollout's route records per sample, the per-position choice made in the old-policy pass,
** the micro-batch overrides of the replaying forwards, and the routing metrics.
*/
#include "grpo/replay_step.h"

#include "job/job.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int records_fit(const prl_grpo_batch *b, const prl_model *m)
{
    return b->route_rows && b->route_moe == m->n_moe && b->route_k == m->cfg.num_experts_per_tok;
}

/* Offsets and row counts of every sample; the size of the rec/chosen arrays. */
static size_t layout(prl_grpo_replay *r)
{
    size_t ids = 0;
    for (int i = 0; i < r->b->n; i++) {
        r->rows[i] = r->b->offsets[i + 1] - r->b->offsets[i] - 1;
        r->at[i] = ids;
        ids += (size_t)r->rows[i] * r->n_moe * r->K;
    }
    return ids;
}

/* Unpack sample records into rec: rows past a sample's record route natively. */
static void unpack_records(prl_grpo_replay *r)
{
    const prl_grpo_batch *b = r->b;
    size_t byte = 0, row_bytes = (size_t)b->route_moe * b->route_k * b->route_width;
    for (int i = 0; i < b->n; i++) {
        int nr = b->route_rows[i];
        int32_t *dst = r->rec + r->at[i];
        size_t n_ids = (size_t)r->rows[i] * r->n_moe * r->K;
        for (size_t k = 0; k < n_ids; k++) dst[k] = PRL_ROUTE_NATIVE;
        if (nr > 0) {
            /* unpack into the first nr rows of each layer's block of rows_i rows */
            int32_t *tmp = r->chosen + r->at[i]; /* free until observe */
            if (prl_replay_record_unpack(tmp, b->routes + byte, nr, r->n_moe, r->K, b->route_width,
                                         r->E) == PRL_OK) {
                for (int l = 0; l < r->n_moe; l++)
                    memcpy(dst + (size_t)l * r->rows[i] * r->K, tmp + (size_t)l * nr * r->K,
                           (size_t)nr * r->K * sizeof *dst);
                r->has_rec[i] = 1;
            } else {
                r->rejected++;
            }
        }
        byte += (size_t)nr * row_bytes;
    }
}

prl_status prl_grpo_replay_init(prl_grpo_replay *r, const prl_model *m, const prl_grpo_batch *b,
                                const prl_grpo_train_config *c, int micro_rows, int ctx)
{
    memset(r, 0, sizeof *r);
    r->mode = (prl_replay_mode)c->replay_mode, r->tau = c->replay_tau, r->alarm = c->entropy_alarm;
    r->n_moe = m->n_moe, r->K = m->cfg.num_experts_per_tok, r->E = m->cfg.n_routed_experts;
    r->b = b;
    if (r->n_moe == 0) return PRL_OK;
    if (b->route_rows && !records_fit(b, m) &&
        (r->mode == PRL_REPLAY_R3 || r->mode == PRL_REPLAY_MASKED_R3))
        return prl_error_set(PRL_ERR_RANGE,
                             "replay.mode %s: the routes are [%d MoE layers][K %d], "
                             "the model has [%d][%d]",
                             prl_replay_mode_name(r->mode), b->route_moe, b->route_k, m->n_moe,
                             r->K);
    int ctx_max = ctx; /* a micro-batch holds at most micro_rows × ctx positions */
    r->at = malloc((size_t)b->n * sizeof *r->at);
    r->rows = malloc((size_t)b->n * sizeof *r->rows);
    r->has_rec = calloc((size_t)b->n, sizeof *r->has_rec);
    r->counts = calloc((size_t)r->n_moe * r->E, sizeof *r->counts);
    r->native = malloc((size_t)ctx_max * r->K * sizeof *r->native);
    if (!r->at || !r->rows || !r->has_rec || !r->counts || !r->native)
        return prl_error_set(PRL_ERR_NOMEM, "routing replay");
    size_t ids = layout(r) + 1;
    r->rec = malloc(ids * sizeof *r->rec);
    r->chosen = malloc(ids * sizeof *r->chosen);
    if (r->mode != PRL_REPLAY_NONE)
        r->ov = malloc((size_t)r->n_moe * micro_rows * ctx_max * r->K * sizeof *r->ov);
    if (!r->rec || !r->chosen || (r->mode != PRL_REPLAY_NONE && !r->ov))
        return prl_error_set(PRL_ERR_NOMEM, "routing replay of %zu ids", ids);
    if (records_fit(b, m)) unpack_records(r);
    else
        for (size_t k = 0; k < ids; k++) r->rec[k] = PRL_ROUTE_NATIVE;
    for (int i = 0; i < b->n; i++) r->records += r->has_rec[i];
    return PRL_OK;
}

void prl_grpo_replay_free(prl_grpo_replay *r)
{
    free(r->at), free(r->rows), free(r->has_rec), free(r->rec), free(r->chosen), free(r->ov);
    free(r->native), free(r->counts);
    memset(r, 0, sizeof *r);
}

/* Rows of sample i's record in layer l (a prefix of its route positions). */
static int record_rows(const prl_grpo_replay *r, int l, int i)
{
    const int32_t *rec = r->rec + r->at[i] + (size_t)l * r->rows[i] * r->K;
    int nr = 0;
    while (nr < r->rows[i] && rec[(size_t)nr * r->K] != PRL_ROUTE_NATIVE) nr++;
    return nr;
}

/* used_overlap[l] += overlaps of `routes` (the pass's rows of sample i) with its record. */
static void add_used(prl_grpo_replay *r, const int32_t *routes, int l, int i)
{
    const int32_t *rec = r->rec + r->at[i] + (size_t)l * r->rows[i] * r->K;
    int nr = record_rows(r, l, i);
    for (int p = 0; p < nr; p++)
        r->used_overlap[l] +=
            (double)prl_replay_overlap(routes + (size_t)p * r->K, rec + (size_t)p * r->K, r->K) /
            r->K;
    r->used_compared[l] += nr;
}

/* One sample, one layer: native rows from the pass, choice against the record. */
static void observe_layer(prl_grpo_replay *r, const int32_t *routes, int l, int i, size_t row0)
{
    int n = r->rows[i], K = r->K;
    memcpy(r->native, routes + row0 * K, (size_t)n * K * sizeof *r->native);
    prl_replay_count(r->counts + (size_t)l * r->E, r->native, n, K);
    size_t blk = r->at[i] + (size_t)l * n * K;
    int32_t *out = r->chosen + blk;
    const int32_t *rec = r->rec + blk;
    /* positions past a record (rows of PRL_ROUTE_NATIVE) are compared with nothing */
    int nr = record_rows(r, l, i);
    if (!prl_grpo_replay_relog(r)) add_used(r, r->native, l, i); /* lp_old used these */
    prl_replay_choose(out, r->native, rec, nr, K, r->mode, r->tau, &r->layer[l]);
    prl_replay_choose(out + (size_t)nr * K, r->native + (size_t)nr * K, NULL, n - nr, K, r->mode,
                      r->tau, &r->layer[l]);
}

void prl_grpo_replay_observe(prl_grpo_replay *r, const prl_model *m, const prl_batch *batch,
                             const int *samples)
{
    if (r->n_moe == 0) return;
    const int32_t *routes = prl_model_routes(m);
    size_t N = (size_t)batch->B * batch->T;
    for (int l = 0; l < r->n_moe; l++)
        for (int j = 0; j < batch->B; j++)
            observe_layer(r, routes + (size_t)l * N * r->K, l, samples[j], (size_t)j * batch->T);
}

void prl_grpo_replay_observe_used(prl_grpo_replay *r, const prl_model *m, const prl_batch *batch,
                                  const int *samples)
{
    const int32_t *routes = prl_model_routes(m);
    size_t N = (size_t)batch->B * batch->T;
    for (int l = 0; l < r->n_moe; l++)
        for (int j = 0; j < batch->B; j++)
            add_used(r, routes + ((size_t)l * N + (size_t)j * batch->T) * r->K, l, samples[j]);
}

int prl_grpo_replay_relog(const prl_grpo_replay *r)
{
    return r->n_moe > 0 && (r->mode == PRL_REPLAY_R3 || r->mode == PRL_REPLAY_MASKED_R3);
}

const int32_t *prl_grpo_replay_override(prl_grpo_replay *r, const prl_batch *batch,
                                        const int *samples)
{
    if (r->n_moe == 0 || r->mode == PRL_REPLAY_NONE) return NULL;
    size_t N = (size_t)batch->B * batch->T, K = (size_t)r->K;
    for (size_t k = 0; k < (size_t)r->n_moe * N * K; k++) r->ov[k] = PRL_ROUTE_NATIVE;
    for (int l = 0; l < r->n_moe; l++)
        for (int j = 0; j < batch->B; j++) {
            int i = samples[j], n = r->rows[i];
            memcpy(r->ov + ((size_t)l * N + (size_t)j * batch->T) * K,
                   r->chosen + r->at[i] + (size_t)l * n * K, (size_t)n * K * sizeof *r->ov);
        }
    return r->ov;
}

void prl_grpo_replay_stats(const prl_grpo_replay *r, prl_grpo_step_stats *st)
{
    st->replay_mode = (int)r->mode;
    st->n_moe = r->n_moe < PRL_MAX_LAYERS ? r->n_moe : PRL_MAX_LAYERS;
    st->route_records = r->records, st->route_rejected = r->rejected;
    for (int l = 0; l < st->n_moe; l++) {
        const prl_replay_layer_stats *ls = &r->layer[l];
        const double *counts = r->counts + (size_t)l * r->E;
        st->route_overlap[l] = ls->compared ? ls->overlap / ls->compared : NAN;
        st->route_overlap_used[l] =
            r->used_compared[l] ? r->used_overlap[l] / r->used_compared[l] : NAN;
        st->route_replayed[l] = ls->rows ? (double)ls->replayed / ls->rows : 0;
        st->route_entropy[l] = prl_replay_entropy(counts, r->E);
        st->route_entropy_alarm |= r->alarm > 0 && prl_replay_entropy_alarm(counts, r->E, r->alarm);
    }
}

/* ------------------------------------------------------------------ config, JSON ---- */

prl_status prl_grpo_replay_config_from_job(prl_grpo_train_config *c, const prl_job_config *j)
{
    prl_replay_mode mode;
    prl_status rc = prl_replay_mode_parse(j->replay_mode, &mode);
    if (rc) return prl_error_wrap(rc, "replay.mode: ");
    c->replay_mode = (int)mode, c->replay_tau = j->replay_tau;
    c->entropy_alarm = j->replay_entropy_alarm;
    return PRL_OK;
}

prl_status prl_grpo_replay_config_check(const prl_grpo_train_config *c)
{
    if ((unsigned)c->replay_mode > PRL_REPLAY_MASKED_R3)
        return prl_error_set(PRL_ERR_CONFIG, "replay.mode %d out of range", c->replay_mode);
    if (!(c->replay_tau >= 0 && c->replay_tau <= 2))
        return prl_error_set(PRL_ERR_CONFIG, "replay.tau %g must be in [0, 2]", c->replay_tau);
    if (!(c->entropy_alarm >= 0 && c->entropy_alarm <= 1))
        return prl_error_set(PRL_ERR_CONFIG, "replay.entropy_alarm %g must be in [0, 1]",
                             c->entropy_alarm);
    return PRL_OK;
}

static json_t *layer_array(const double *v, int n)
{
    json_t *a = json_array();
    for (int l = 0; l < n; l++)
        json_array_append_new(a, isfinite(v[l]) ? json_real(v[l]) : json_null());
    return a;
}

void prl_grpo_replay_stats_json(json_t *o, const prl_grpo_step_stats *st)
{
    if (st->n_moe < 1) return;
    json_object_set_new(o, "replay_mode", json_string(prl_replay_mode_name(st->replay_mode)));
    json_object_set_new(o, "route_overlap", layer_array(st->route_overlap, st->n_moe));
    json_object_set_new(o, "route_overlap_used", layer_array(st->route_overlap_used, st->n_moe));
    json_object_set_new(o, "route_replayed", layer_array(st->route_replayed, st->n_moe));
    json_object_set_new(o, "route_entropy", layer_array(st->route_entropy, st->n_moe));
    json_object_set_new(o, "route_entropy_alarm", json_integer(st->route_entropy_alarm));
    json_object_set_new(o, "route_records", json_integer(st->route_records));
    json_object_set_new(o, "route_rejected", json_integer(st->route_rejected));
}
