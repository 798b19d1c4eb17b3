/*
** model_train.c — the train path's drivers: the batch checks, the forward over the layers
** with saved activations (embedding, each decoder layer, final norm, LM head and score head,
** log-probs,
** the MTP modules, expert counts), the public log-probs, routes, logits and top-k, and the
** backward, the forward's mirror list from ∂/∂logits down to the embedding.
*/
#include "engine/model_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ batch ----------- */

int model__valid_pos(const prl_batch *b, int n)
{
    return (!b->lens || n % b->T < b->lens[n / b->T]) && !(b->pos && b->pos[n] < 0);
}

/* Packed rows: inside each row's length, a position is padding (−1), starts a sequence (0) or
** continues the one before it (its position + 1). */
static prl_status validate_pos(const prl_batch *b)
{
    for (int i = 0; b->pos && i < b->B; i++) {
        int len = b->lens ? b->lens[i] : b->T;
        for (int t = 0; t < len; t++) {
            int32_t p = b->pos[i * b->T + t], prev = t ? b->pos[i * b->T + t - 1] : -1;
            if (p < -1 || (p > 0 && (prev < 0 || p != prev + 1)))
                return prl_error_set(PRL_ERR_RANGE,
                                     "sequence %d position %d: packed position %d must be -1, 0 or "
                                     "the previous position + 1 (%d)",
                                     i, t, p, prev < 0 ? 0 : prev + 1);
        }
    }
    return PRL_OK;
}

/* Position n's extra targets: each in [-1, V), and none where the position has no target
** (their log-probs need the row's log-sum-exp, which only a target position computes). */
static prl_status validate_extra(const prl_batch *b, int n, int V)
{
    if (b->n_extra < 0 || b->n_extra > PRL_MAX_EXTRA_TARGETS ||
        (b->n_extra > 0 && (!b->extra_targets || !b->extra_weights)))
        return prl_error_set(PRL_ERR_ARG,
                             "n_extra %d: at most %d, with extra_targets and "
                             "extra_weights",
                             b->n_extra, PRL_MAX_EXTRA_TARGETS);
    int has_target = b->targets && b->targets[n] >= 0;
    for (int i = 0; i < b->n_extra; i++) {
        int32_t y = b->extra_targets[(size_t)n * b->n_extra + i];
        if (y < -1 || y >= V || (y >= 0 && !has_target))
            return prl_error_set(PRL_ERR_RANGE, "sequence %d position %d: extra target %d id %d %s",
                                 n / b->T, n % b->T, i, y,
                                 y >= 0 && y < V ? "at a position "
                                                   "without a target"
                                                 : "out of range");
    }
    return PRL_OK;
}

/* Each override row: K expert ids in range, or K × PRL_ROUTE_NATIVE (route natively). */
static prl_status validate_override(const prl_model *m, const int32_t *ov, int N)
{
    int K = m->cfg.num_experts_per_tok, E = m->cfg.n_routed_experts;
    size_t rows = (size_t)m->n_moe * N;
    for (size_t r = 0; r < rows; r++) {
        const int32_t *row = ov + r * K;
        int native = row[0] == PRL_ROUTE_NATIVE;
        for (int k = 0; k < K; k++) {
            if (native && row[k] == PRL_ROUTE_NATIVE) continue;
            if (native || row[k] < 0 || row[k] >= E)
                return prl_error_set(PRL_ERR_RANGE,
                                     "route override entry %zu: expert %d out of "
                                     "range [0, %d)%s",
                                     r * K + k, row[k], E,
                                     native || row[k] == PRL_ROUTE_NATIVE
                                         ? " (a native row must be all PRL_ROUTE_NATIVE)"
                                         : "");
        }
    }
    return PRL_OK;
}

static prl_status validate_batch(const prl_model *m, const prl_batch *b)
{
    const prl_config *c = &m->cfg;
    if (b->B <= 0 || b->T <= 0)
        return prl_error_set(PRL_ERR_ARG, "batch shape %d x %d must be positive", b->B, b->T);
    if (b->T > c->max_position_embeddings)
        return prl_error_set(PRL_ERR_RANGE, "sequence length %d exceeds max_position_embeddings %d",
                             b->T, c->max_position_embeddings);
    if (!(b->temperature > 0) || !isfinite(b->temperature))
        return prl_error_set(PRL_ERR_ARG, "temperature %g must be > 0", b->temperature);
    for (int i = 0; i < b->B; i++)
        if (b->lens && (b->lens[i] < 1 || b->lens[i] > b->T))
            return prl_error_set(PRL_ERR_RANGE, "sequence %d: length %d not in [1, %d]", i,
                                 b->lens[i], b->T);
    prl_status prc = validate_pos(b);
    if (prc) return prc;
    if (b->pos && c->score_head) /* one score per row, read at its length: not per sequence */
        return prl_error_set(PRL_ERR_ARG, "a reward model (score head) takes one sequence per "
                                          "row: packed rows (pos) are not supported");
    int N = b->B * b->T;
    for (int n = 0; n < N; n++) /* padding positions too: their embeddings are looked up */
        if (b->tokens[n] < 0 || b->tokens[n] >= c->vocab_size)
            return prl_error_set(PRL_ERR_RANGE,
                                 "sequence %d position %d: token id %d out of "
                                 "range [0, %d)",
                                 n / b->T, n % b->T, b->tokens[n], c->vocab_size);
    for (int n = 0; n < N; n++) {
        if (!model__valid_pos(b, n)) continue;
        if (b->targets && (b->targets[n] < -1 || b->targets[n] >= c->vocab_size))
            return prl_error_set(PRL_ERR_RANGE,
                                 "sequence %d position %d: target id %d out of "
                                 "range [-1, %d)",
                                 n / b->T, n % b->T, b->targets[n], c->vocab_size);
        prl_status rc = validate_extra(b, n, c->vocab_size);
        if (rc) return rc;
    }
    return b->route_override ? validate_override(m, b->route_override, N) : PRL_OK;
}

static int target_of(const prl_batch *b, int n)
{
    return b->targets && model__valid_pos(b, n) ? b->targets[n] : -1;
}

void model__logprob_rows(void *p, int r0, int r1)
{
    logits_ctx *c = p;
    int V = c->m->cfg.vocab_size;
    for (int n = r0; n < r1; n++) {
        int y = target_of(c->b, n);
        float lp = 0;
        if (y >= 0)
            lp = (float)prl_logprob_forward(&c->lse[n], c->logits + (size_t)n * V, V, y,
                                            c->b->temperature);
        if (c->out) c->out[n] = lp;
    }
}

/* ------------------------------------------------------------------ forward --------- */

/* Σ w·logp over the batch's targets in position order (double), for a thread-independent
** value; *n_targets counts the positions with a target. */
double model__weighted_logp(const prl_batch *b, const prl_real *logits, const prl_real *lse, int V,
                            int *n_targets)
{
    double sum = 0;
    for (int n = 0; n < b->B * b->T; n++) {
        int y = b->targets ? b->targets[n] : -1;
        if (y < 0 || !model__valid_pos(b, n)) continue;
        ++*n_targets;
        if (b->weights)
            sum += (double)b->weights[n] *
                   (logits[(size_t)n * V + y] / (prl_real)b->temperature - lse[n]);
        for (int i = 0; i < b->n_extra; i++) {
            int32_t e = b->extra_targets[(size_t)n * b->n_extra + i];
            if (e >= 0)
                sum += (double)b->extra_weights[(size_t)n * b->n_extra + i] *
                       (logits[(size_t)n * V + e] / (prl_real)b->temperature - lse[n]);
        }
    }
    return sum;
}

/* Decoder layer l (trunk or MTP) from its input (res_attn, or the streams xs[0] with mHC) to
** `out`: attention site, FFN site. *moe_idx counts MoE layers (router bias and route slot);
** `train` adds the layer's auxiliary losses to st. Returns non-zero when a hook stops. */
int model__layer_forward(prl_model *m, int l, int *moe_idx, const prl_batch *b, expert_task *tasks,
                         prl_forward_stats *st, int train, prl_real *out)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = model__dims_of(&m->cfg);
    int N = a->N, stop;
    model__site_enter(m, l, 0);
    prl_rmsnorm_forward(la->ln_a, la->rstd_a, la->res_attn, P(o->ln1), N, D.d, D.d, D.d,
                        m->cfg.rms_norm_eps);
    model__rnd(m, la->ln_a, (size_t)N * D.d);
    stop = model__mla_forward(m, l, b);
    model__site_leave(m, l, 0, model__site_stream(m, l, 1));
    model__site_enter(m, l, 1);
    prl_rmsnorm_forward(la->ln_f, la->rstd_f, la->res_ffn, P(o->ln2), N, D.d, D.d, D.d,
                        m->cfg.rms_norm_eps);
    model__rnd(m, la->ln_f, (size_t)N * D.d);
    if (prl_config_is_moe(&m->cfg, l)) {
        stop = stop || model__moe_forward(m, l, *moe_idx, b, tasks);
        if (train) model__aux_losses(m, la, b, &st->balance_loss, &st->z_loss);
        ++*moe_idx;
    } else {
        prl_swiglu_forward(a->tmp, la->a13, la->h, la->ln_f, P(o->w1), P(o->w2), N, D.d, D.I, 0,
                           m->precision);
        stop = stop || model__emit(m, l, "mlp.out", a->tmp, N, D.d);
    }
    model__site_leave(m, l, 1, out);
    return stop;
}

void model__count_experts(prl_model *m, const prl_batch *b, int moe_idx)
{
    const prl_acts *a = m->acts;
    int N = a->N, E = m->cfg.n_routed_experts, K = m->cfg.num_experts_per_tok;
    if (m->cfg.bias_update_rate <= 0) return;
    const int32_t *routes = a->routes + (size_t)moe_idx * N * K;
    double *cnt = m->expert_counts + (size_t)moe_idx * E;
    for (int n = 0; n < N; n++)
        if (model__valid_pos(b, n))
            for (int k = 0; k < K; k++) cnt[routes[(size_t)n * K + k]] += 1;
}

/* Forward with saved activations; `train` also counts experts and computes aux losses. */
static prl_status forward(prl_model *m, const prl_batch *b, float *out_logp, prl_forward_stats *st,
                          int train)
{
    prl_status rc = validate_batch(m, b);
    if (rc) return rc;
    if ((rc = model__ensure_acts(m, b->B, b->T))) return rc;
    prl_acts *a = m->acts;
    dims D = model__dims_of(&m->cfg);
    int N = a->N;
    prl_forward_stats stats = {0};
    expert_task *tasks =
        malloc(((size_t)D.E + (size_t)N * D.K / PRL_ROW_BLOCK + 1) * sizeof *tasks);
    if (!tasks) return prl_error_set(PRL_ERR_NOMEM, "expert tasks");
    a->have_forward = 0;
    model__refresh_rounded_weights(m);
    a->index_loss = 0;
    const model_offsets *mo = model__offs(m);
    prl_embedding_forward(a->layer[0].res_attn, P(mo->embed), b->tokens, N, D.d);
    model__streams_begin(m);
    int stop = 0, moe_idx = 0;
    for (int l = 0; l < D.L && !stop; l++)
        stop = model__layer_forward(m, l, &moe_idx, b, tasks, &stats, train,
                                    model__layer_out_stream(m, l));
    if (!stop) model__streams_end(m);
    prl_rmsnorm_forward(a->ln_final, a->rstd_final, a->res_final, P(mo->norm), N, D.d, D.d, D.d,
                        m->cfg.rms_norm_eps);
    model__rnd(m, a->ln_final, (size_t)N * D.d);
    if (m->cfg.score_head)
        prl_score_head_forward(a->scores, a->ln_final, P(mo->score), b->lens, b->B, b->T, D.d);
    prl_matmul_forward(a->logits, a->ln_final, P(mo->head), N, D.d, D.V, 0);
    model__rnd(m, a->logits, (size_t)N * D.V);
    model__emit(m, -1, "final.logits", a->logits, N, D.V);
    logits_ctx lc = {.m = m, .b = b, .out = out_logp, .logits = a->logits, .lse = a->lse};
    prl_parallel_rows(N, model__logprob_rows, &lc);
    stats.lm_loss = model__weighted_logp(b, a->logits, a->lse, D.V, &stats.n_targets);
    a->mtp_ran = train && b->with_mtp && m->cfg.num_nextn_predict_layers > 0 && !stop;
    if (a->mtp_ran) stop = model__mtp_forward(m, b, moe_idx, tasks, &stats);
    free(tasks);
    if (train)
        for (int i = 0; i < m->n_moe; i++) model__count_experts(m, b, i);
    stats.loss = stats.lm_loss + stats.balance_loss + stats.z_loss + stats.mtp_loss;
    stats.index_loss = a->index_loss;
    if (st) *st = stats;
    a->have_forward = 1;
    return PRL_OK;
}

prl_status prl_model_forward(prl_model *m, const prl_batch *b, float *out_logp,
                             prl_forward_stats *st)
{
    return forward(m, b, out_logp, st, 1);
}

prl_status prl_model_logprobs(prl_model *m, const prl_batch *b, float *out_logp)
{
    prl_status rc = forward(m, b, out_logp, NULL, 0);
    m->acts->have_forward = 0; /* no aux-loss state: a backward must redo the forward */
    return rc;
}

const int32_t *prl_model_routes(const prl_model *m) { return m->acts->routes; }
const prl_real *prl_model_logits(const prl_model *m) { return m->acts->logits; }
const prl_real *prl_model_scores(const prl_model *m)
{
    return m->cfg.score_head ? m->acts->scores : NULL;
}

/* The k largest of row[0..V) into ids[0..k) (largest first; equal values: the lower id
** first, since ids are scanned in order and only a strictly larger value moves one down). */
static void row_topk(const prl_real *row, int V, int k, int32_t *ids)
{
    int n = 0;
    for (int v = 0; v < V; v++) {
        if (n == k && !(row[v] > row[ids[k - 1]])) continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && row[v] > row[ids[at - 1]]) ids[at] = ids[at - 1], at--;
        ids[at] = v;
    }
}

prl_status prl_model_topk(const prl_model *m, const prl_batch *batch, int k, int32_t *ids,
                          float *logp)
{
    const prl_acts *a = m->acts;
    int V = m->cfg.vocab_size;
    if (k < 1 || k > V) return prl_error_set(PRL_ERR_ARG, "top-k %d not in [1, %d]", k, V);
    if (a->B != batch->B || a->T != batch->T)
        return prl_error_set(PRL_ERR_ARG, "top-k needs a forward of the same batch shape first");
    prl_real inv_tau = (prl_real)(1.0 / batch->temperature); /* as prl_logprob_forward: <= 0 */
    for (int n = 0; n < batch->B * batch->T; n++) {
        int32_t *id = ids + (size_t)n * k;
        float *lp = logp + (size_t)n * k;
        if (target_of(batch, n) < 0) { /* no log-sum-exp was taken here */
            for (int i = 0; i < k; i++) id[i] = -1, lp[i] = 0;
            continue;
        }
        const prl_real *row = a->logits + (size_t)n * V;
        row_topk(row, V, k, id);
        for (int i = 0; i < k; i++) lp[i] = (float)(row[id[i]] * inv_tau - a->lse[n]);
    }
    return PRL_OK;
}

const uint8_t *prl_model_dsa_selection(const prl_model *m, int layer)
{
    if (layer < 0 || layer >= m->cfg.num_hidden_layers || !model__dsa_sparse(m, layer) ||
        !m->acts->layer)
        return NULL;
    return m->acts->layer[layer].dsa.sel;
}

/* ------------------------------------------------------------------ backward -------- */

/* The backward's loss multiplier (prl_batch.loss_scale; 0 means 1). */
double model__loss_scale(const prl_batch *b) { return b->loss_scale > 0 ? b->loss_scale : 1; }

void model__dlogits_rows(void *p, int r0, int r1)
{
    logits_ctx *c = p;
    prl_acts *a = c->m->acts;
    int V = c->m->cfg.vocab_size;
    for (int n = r0; n < r1; n++) {
        prl_real *dl = a->dlogits + (size_t)n * V;
        memset(dl, 0, (size_t)V * sizeof *dl);
        int y = target_of(c->b, n), ne = 0;
        if (y < 0) continue;
        int32_t ys[1 + PRL_MAX_EXTRA_TARGETS];
        prl_real ws[1 + PRL_MAX_EXTRA_TARGETS];
        ys[ne] = y,
        ws[ne++] = c->b->weights ? (prl_real)(c->b->weights[n] * model__loss_scale(c->b)) : 0;
        for (int i = 0; i < c->b->n_extra; i++) { /* the teacher's top-k (distillation) */
            size_t e = (size_t)n * c->b->n_extra + i;
            if (c->b->extra_targets[e] >= 0)
                ys[ne] = c->b->extra_targets[e],
                ws[ne++] = (prl_real)(c->b->extra_weights[e] * model__loss_scale(c->b));
        }
        if (ne == 1 && ws[0] == 0) continue;
        prl_logprob_backward_multi(dl, c->logits + (size_t)n * V, c->lse[n], V, ys, ws, ne,
                                   c->b->temperature);
    }
}

prl_status prl_model_backward(prl_model *m, const prl_batch *b)
{
    prl_acts *a = m->acts;
    if (!a->have_forward || a->B != b->B || a->T != b->T)
        return prl_error_set(PRL_ERR_ARG, "backward needs a forward of the same batch first");
    dims D = model__dims_of(&m->cfg);
    int N = a->N;
    model__dsa_backward(m, b);
    if (m->cfg.dsa_freeze_main) return PRL_OK; /* only the indexer learns */
    const model_offsets *mo = model__offs(m);
    expert_task *tasks =
        malloc(((size_t)D.E + (size_t)N * D.K / PRL_ROW_BLOCK + 1) * sizeof *tasks);
    if (!tasks) return prl_error_set(PRL_ERR_NOMEM, "expert tasks");
    if (a->mtp_ran) /* ∂L_MTP/∂h⁰ into dh_mtp; uses dres, dlogits */
        model__mtp_backward(m, b, tasks);
    if (m->cfg.mtp_freeze_trunk) { /* only the MTP modules learn: the trunk's gradient is unused */
        free(tasks);
        return PRL_OK;
    }
    logits_ctx dc = {.m = m, .b = b, .logits = a->logits, .lse = a->lse};
    prl_parallel_rows(N, model__dlogits_rows, &dc);
    model__rnd(m, a->dlogits, (size_t)N * D.V);
    model__zero(a->dln, (size_t)N * D.d);
    prl_matmul_backward(a->dln, G(mo->head), a->dlogits, a->ln_final, P(mo->head), N, D.d, D.V);
    if (m->cfg.score_head && b->score_weights) { /* the scalar head reads the same h */
        for (int r = 0; r < b->B; r++)
            a->dscores[r] = (prl_real)(b->score_weights[r] * model__loss_scale(b));
        prl_score_head_backward(a->dln, G(mo->score), a->dscores, a->ln_final, P(mo->score),
                                b->lens, b->B, b->T, D.d);
    }
    model__rnd(m, a->dln, (size_t)N * D.d);
    model__zero(a->dres, (size_t)N * D.d);
    prl_rmsnorm_backward(a->dres, G(mo->norm), a->dln, a->res_final, P(mo->norm), a->rstd_final, N,
                         D.d, D.d, D.d);
    if (a->mtp_ran) /* h⁰ = res_final also feeds MTP module 1 */
        for (size_t i = 0; i < (size_t)N * D.d; i++) a->dres[i] += a->dh_mtp[i];
    model__rnd(m, a->dres, (size_t)N * D.d); /* once both paths into h⁰ are summed */
    if (model__residual_glue(&m->cfg)) {
        model__residual_backward(m, b, tasks);
    } else {
        for (int l = D.L - 1; l >= 0; l--) {
            model__ffn_backward(m, l, b, tasks, a->dres);
            model__mla_backward(m, l, b, a->dres);
        }
    }
    free(tasks);
    prl_embedding_backward(G(mo->embed), a->dres, b->tokens, N, D.d);
    return PRL_OK;
}
