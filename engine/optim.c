/*
** optim.c — AdamW, Muon, gradient clipping, learning-rate schedules and dynamic loss scaling.
**
** Parameter split (shared/spec/model.md §10): with PRL_OPTIM_MUON every hidden 2-D matrix
** (attention projections, dense FFN, each routed expert's matrices, shared experts) is
** updated by Muon; embeddings, the LM head, norm gains and the router weight by AdamW.
** Weight decay is decoupled and applies to matrices and the LM head only: never to norm
** gains, the token embedding or the router.
**
** Clipping order: each routed expert's gradient (its three matrices together) is first
** clipped to expert_clip, then the whole gradient to grad_clip. Norms are summed in double
** in tensor order, so they do not depend on the thread count.
*/
#include "engine/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void prl_optim_config_default(prl_optim_config *c)
{
    memset(c, 0, sizeof *c);
    c->kind = PRL_OPTIM_MUON;
    c->lr = 3e-3;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->weight_decay = 0.1;
    c->muon_momentum = 0.95;
    c->muon_ns_steps = 5;
    c->grad_clip = 1.0;
    c->expert_clip = 0;
    c->schedule = PRL_LR_COSINE;
    c->warmup_steps = 10;
    c->total_steps = 1000;
    c->min_lr_ratio = 0.1;
}

static int uses_muon(const prl_optim_config *c, const prl_param_info *p)
{
    return c->kind == PRL_OPTIM_MUON && p->kind == PRL_PARAM_MATRIX;
}

/* DSA warm-up with prl_dsa_freeze_main: everything but the indexer is left as it is (no
** update, no weight decay, not in the gradient norm). prl_mtp_freeze_trunk: everything but
** the MTP layers (model.layers.{L..}) — the shared embedding and head included — stays. */
static int frozen(const prl_model *m, const prl_param_info *p)
{
    if (m->cfg.mtp_freeze_trunk && p->layer < m->cfg.num_hidden_layers) return 1;
    return m->cfg.dsa_freeze_main && p->kind != PRL_PARAM_INDEXER;
}

static int decays(const prl_param_info *p)
{
    return p->kind == PRL_PARAM_MATRIX || p->kind == PRL_PARAM_HEAD;
}

prl_status prl_optim_init(prl_optim *o, const prl_model *m, const prl_optim_config *cfg)
{
    memset(o, 0, sizeof *o);
    if (!(cfg->lr >= 0) || !(cfg->beta1 >= 0 && cfg->beta1 < 1) ||
        !(cfg->beta2 >= 0 && cfg->beta2 < 1) || !(cfg->eps > 0) || !(cfg->weight_decay >= 0) ||
        !(cfg->muon_momentum >= 0 && cfg->muon_momentum < 1) || cfg->muon_ns_steps < 0 ||
        !(cfg->grad_clip >= 0) || !(cfg->expert_clip >= 0) || cfg->warmup_steps < 0 ||
        !(cfg->min_lr_ratio >= 0 && cfg->min_lr_ratio <= 1))
        return prl_error_set(PRL_ERR_CONFIG,
                             "optimizer: a hyper-parameter is out of range "
                             "(lr %g, betas %g/%g, eps %g, wd %g, momentum %g, clip %g/%g, "
                             "warmup %d, min_lr_ratio %g)",
                             cfg->lr, cfg->beta1, cfg->beta2, cfg->eps, cfg->weight_decay,
                             cfg->muon_momentum, cfg->grad_clip, cfg->expert_clip,
                             cfg->warmup_steps, cfg->min_lr_ratio);
    o->cfg = *cfg;
    o->n_params = m->n_params;
    o->m = calloc(m->n_params, sizeof *o->m);
    o->v = calloc(m->n_params, sizeof *o->v);
    /* NS5 scratch per worker: 2·A·B + 2·r² for the largest matrix */
    size_t per = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        if (p->ndim != 2) continue;
        size_t r = (size_t)(p->shape[0] < p->shape[1] ? p->shape[0] : p->shape[1]);
        size_t need = 2 * p->numel + 2 * r * r;
        if (need > per) per = need;
    }
    o->work_len = per;
    o->work = calloc(per * (size_t)prl_pool_threads() + 1, sizeof *o->work);
    if (!o->m || !o->v || !o->work) {
        prl_optim_free(o);
        return prl_error_set(PRL_ERR_NOMEM, "optimizer state");
    }
    return PRL_OK;
}

void prl_optim_free(prl_optim *o)
{
    if (!o) return;
    free(o->m);
    free(o->v);
    free(o->work);
    memset(o, 0, sizeof *o);
}

double prl_optim_lr_at(const prl_optim_config *c, int64_t step)
{
    if (c->warmup_steps > 0 && step < c->warmup_steps)
        return c->lr * (double)(step + 1) / c->warmup_steps;
    if (c->schedule == PRL_LR_CONSTANT) return c->lr;
    int64_t span = (int64_t)c->total_steps - c->warmup_steps;
    double progress = span > 0 ? (double)(step - c->warmup_steps) / (double)span : 1.0;
    if (progress > 1) progress = 1;
    if (progress < 0) progress = 0;
    double cosine = 0.5 * (1 + cos(M_PI * progress));
    return c->lr * (c->min_lr_ratio + (1 - c->min_lr_ratio) * cosine);
}

/* X (A×B, row-major) ← NS5 orthogonalisation, in place. work: 2·A·B + 2·r² reals. */
void prl_muon_newton_schulz(prl_real *X, int A, int B, int steps, prl_real *work)
{
    const prl_real a = (prl_real)3.4445, b = (prl_real)-4.7750, c = (prl_real)2.0315;
    int tr = A > B, R = tr ? B : A, C = tr ? A : B; /* iterate on the wide R×C orientation */
    prl_real *Y = work, *Z = work + (size_t)A * B, *S = Z + (size_t)A * B, *S2 = S + (size_t)R * R;
    if (tr)
        for (int i = 0; i < A; i++)
            for (int j = 0; j < B; j++) Y[(size_t)j * A + i] = X[(size_t)i * B + j];
    else memcpy(Y, X, (size_t)A * B * sizeof *Y);
    double ss = 0;
    for (size_t i = 0; i < (size_t)A * B; i++) ss += (double)Y[i] * Y[i];
    prl_real inv = (prl_real)(1.0 / (sqrt(ss) + 1e-7));
    for (size_t i = 0; i < (size_t)A * B; i++) Y[i] *= inv;
    for (int it = 0; it < steps; it++) {
        /* S = Y·Yᵀ; S2 = b·S + c·S·S; Y = a·Y + S2·Y */
        prl_gemm(0, 1, R, R, C, 1, Y, C, Y, C, 0, S, R);
        memcpy(S2, S, (size_t)R * R * sizeof *S2);
        prl_gemm(0, 0, R, R, R, c, S, R, S, R, b, S2, R);
        memcpy(Z, Y, (size_t)R * C * sizeof *Z);
        prl_gemm(0, 0, R, C, R, 1, S2, R, Z, C, a, Y, C);
    }
    if (tr)
        for (int i = 0; i < A; i++)
            for (int j = 0; j < B; j++) X[(size_t)i * B + j] = Y[(size_t)j * A + i];
    else memcpy(X, Y, (size_t)A * B * sizeof *X);
}

static double sum_squares(const prl_real *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

static void scale(prl_real *g, size_t n, double k)
{
    prl_real f = (prl_real)k;
    for (size_t i = 0; i < n; i++) g[i] *= f;
}

/* Per-expert clipping; returns how many experts were clipped. */
static int clip_experts(const prl_model *m, double bound)
{
    int clipped = 0;
    for (int i = 0; i < m->n_tensors;) {
        const prl_param_info *p = &m->tensors[i];
        if (p->expert < 0) {
            i++;
            continue;
        }
        int j = i;
        double ss = 0;
        while (j < m->n_tensors && m->tensors[j].expert == p->expert &&
               m->tensors[j].layer == p->layer) {
            ss += sum_squares(m->grads + m->tensors[j].offset, m->tensors[j].numel);
            j++;
        }
        double norm = sqrt(ss);
        if (norm > bound) {
            for (int k = i; k < j; k++)
                scale(m->grads + m->tensors[k].offset, m->tensors[k].numel, bound / norm);
            clipped++;
        }
        i = j;
    }
    return clipped;
}

/* Work items of an update: a whole Muon matrix, or a chunk of CHUNK elements of an AdamW
** tensor (so the embedding and LM head do not leave a thread idle). Fixed split. */
enum { CHUNK = 1 << 16 };

typedef struct update_task {
    int tensor;
    size_t begin, end; /* element range within the tensor */
} update_task;

typedef struct update_ctx {
    prl_optim *o;
    prl_model *m;
    double lr, bc1, bc2;
    update_task *tasks;
    double *partial; /* per task sum of squares (norm pass) */
} update_ctx;

static int build_tasks(const prl_optim *o, const prl_model *m, update_task *t)
{
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        if (frozen(m, p)) continue;
        size_t step = uses_muon(&o->cfg, p) ? p->numel : CHUNK;
        for (size_t b = 0; b < p->numel; b += step) {
            if (t)
                t[n] = (update_task){.tensor = i,
                                     .begin = b,
                                     .end = b + step < p->numel ? b + step : p->numel};
            n++;
        }
    }
    return n;
}

#if defined(PRL_OPS_X86) && !defined(PRL_REAL_DOUBLE)
#include <immintrin.h>
#define ROW_AVX2 1
/* adamw_update's loop on 8 lanes (the same IEEE operations in the same order: sqrt and
** division are correctly rounded in both forms); returns how many elements it did. */
PRL_AVX2 static size_t adamw_avx2(float *w, const float *g, float *mm, float *vv, size_t n,
                                  float b1, float b2, float decay, float step, float eps,
                                  float ibc1, float ibc2)
{
    size_t i = 0;
    float c1 = 1 - b1, c2 = 1 - b2;
    for (; i + 8 <= n; i += 8) {
        prl_v8f gv = prl_v8_load(g + i);
        prl_v8f m = b1 * prl_v8_load(mm + i) + c1 * gv;
        prl_v8f v = b2 * prl_v8_load(vv + i) + c2 * gv * gv;
        prl_v8_store(mm + i, m), prl_v8_store(vv + i, v);
        prl_v8f mhat = m * ibc1, root = (prl_v8f)_mm256_sqrt_ps((__m256)(v * ibc2));
        prl_v8_store(w + i, prl_v8_load(w + i) * decay - step * mhat / (root + eps));
    }
    return i;
}
#endif

static void adamw_update(update_ctx *c, const prl_param_info *p, size_t begin, size_t end)
{
    prl_optim *o = c->o;
    const prl_optim_config *k = &o->cfg;
    prl_real *w = c->m->params + p->offset, *g = c->m->grads + p->offset;
    prl_real *mm = o->m + p->offset, *vv = o->v + p->offset;
    prl_real b1 = (prl_real)k->beta1, b2 = (prl_real)k->beta2;
    prl_real decay = (prl_real)(decays(p) ? 1 - c->lr * k->weight_decay : 1);
    prl_real step = (prl_real)c->lr, eps = (prl_real)k->eps;
    prl_real ibc1 = (prl_real)(1 / c->bc1), ibc2 = (prl_real)(1 / c->bc2);
    size_t i = begin;
#ifdef ROW_AVX2
    if (prl_row_kernels_avx2())
        i += adamw_avx2(w + i, g + i, mm + i, vv + i, end - begin, b1, b2, decay, step, eps, ibc1,
                        ibc2);
#endif
    for (; i < end; i++) {
        mm[i] = b1 * mm[i] + (1 - b1) * g[i];
        vv[i] = b2 * vv[i] + (1 - b2) * g[i] * g[i];
        prl_real mhat = mm[i] * ibc1, vhat = vv[i] * ibc2;
        w[i] = w[i] * decay - step * mhat / (PRL_SQRT(vhat) + eps);
    }
}

static void muon_update(update_ctx *c, const prl_param_info *p)
{
    prl_optim *o = c->o;
    const prl_optim_config *k = &o->cfg;
    int A = (int)p->shape[0], B = (int)p->shape[1];
    prl_real *w = c->m->params + p->offset, *g = c->m->grads + p->offset;
    prl_real *mom = o->m + p->offset;
    prl_real *work = o->work + (size_t)prl_pool_worker() * o->work_len;
    prl_real *U = o->v + p->offset; /* Muon keeps no second moment: v's storage holds U */
    prl_real mu = (prl_real)k->muon_momentum;
    for (size_t i = 0; i < p->numel; i++) {
        mom[i] = mu * mom[i] + g[i];
        U[i] = g[i] + mu * mom[i];
    }
    prl_muon_newton_schulz(U, A, B, k->muon_ns_steps, work);
    double rms_scale = 0.2 * sqrt((double)(A > B ? A : B));
    prl_real decay = (prl_real)(1 - c->lr * k->weight_decay);
    prl_real step = (prl_real)(c->lr * rms_scale);
    for (size_t i = 0; i < p->numel; i++) w[i] = w[i] * decay - step * U[i];
}

static void update_task_run(void *p, int i)
{
    update_ctx *c = p;
    update_task t = c->tasks[i];
    const prl_param_info *info = &c->m->tensors[t.tensor];
    if (uses_muon(&c->o->cfg, info)) muon_update(c, info);
    else adamw_update(c, info, t.begin, t.end);
}

static void sum_squares_task(void *p, int i)
{
    update_ctx *c = p;
    update_task t = c->tasks[i];
    const prl_param_info *info = &c->m->tensors[t.tensor];
    c->partial[i] = sum_squares(c->m->grads + info->offset + t.begin, t.end - t.begin);
}

/* Global sum of squares: per-task partials added in task order (thread-count independent). */
static double grad_sum_squares(update_ctx *c, int n_tasks)
{
    prl_parallel_for(n_tasks, sum_squares_task, c);
    double ss = 0;
    for (int i = 0; i < n_tasks; i++) ss += c->partial[i];
    return ss;
}

prl_status prl_optim_step(prl_optim *o, prl_model *m, prl_optim_stats *stats)
{
    if (o->n_params != m->n_params)
        return prl_error_set(PRL_ERR_ARG, "optimizer was made for %zu parameters, model has %zu",
                             o->n_params, m->n_params);
    int n_tasks = build_tasks(o, m, NULL);
    update_ctx c = {.o = o,
                    .m = m,
                    .tasks = malloc((size_t)n_tasks * sizeof(update_task)),
                    .partial = malloc((size_t)n_tasks * sizeof(double))};
    if (!c.tasks || !c.partial) {
        free(c.tasks), free(c.partial);
        return prl_error_set(PRL_ERR_NOMEM, "optimizer step");
    }
    build_tasks(o, m, c.tasks);
    prl_optim_stats st = {.clip_scale = 1};
    st.lr = prl_optim_lr_at(&o->cfg, o->step);
    double ss = grad_sum_squares(&c, n_tasks);
    st.grad_norm = sqrt(ss);
    prl_status rc = PRL_OK;
    if (!isfinite(st.grad_norm)) {
        rc = prl_error_set(PRL_ERR_NUMERIC, "gradient norm is %g at step %lld: update skipped",
                           st.grad_norm, (long long)o->step);
        goto done;
    }
    if (o->cfg.expert_clip > 0) {
        st.experts_clipped = clip_experts(m, o->cfg.expert_clip);
        if (st.experts_clipped) ss = grad_sum_squares(&c, n_tasks);
    }
    double norm = sqrt(ss);
    if (o->cfg.grad_clip > 0 && norm > o->cfg.grad_clip) {
        st.clip_scale = o->cfg.grad_clip / norm;
        scale(m->grads, m->n_params, st.clip_scale);
    }
    o->step++;
    c.lr = st.lr;
    c.bc1 = 1 - pow(o->cfg.beta1, (double)o->step);
    c.bc2 = 1 - pow(o->cfg.beta2, (double)o->step);
    prl_parallel_for(n_tasks, update_task_run, &c);
    if (stats) *stats = st;
done:
    free(c.tasks);
    free(c.partial);
    return rc;
}

/* ------------------------------------------------------------------ loss scaling --- */

prl_status prl_loss_scaler_config_preset(prl_loss_scaler_config *c, const char *name)
{
    *c = (prl_loss_scaler_config){.kind = PRL_SCALER_TORCH,
                                  .init_scale = 65536.0,
                                  .growth_factor = 2.0,
                                  .backoff_factor = 0.5,
                                  .growth_interval = 2000,
                                  .hysteresis = 2,
                                  .min_scale = 1.0};
    if (!strcmp(name, "torch")) return PRL_OK;
    if (!strcmp(name, "verl_fsdp")) {
        c->growth_interval = 400;
        return PRL_OK;
    }
    c->kind = PRL_SCALER_MEGATRON, c->growth_interval = 1000;
    if (!strcmp(name, "megatron")) {
        c->init_scale = 4294967296.0; /* 2^32 */
        return PRL_OK;
    }
    if (!strcmp(name, "verl_megatron")) {
        c->init_scale = 32768.0;
        return PRL_OK;
    }
    return prl_error_set(PRL_ERR_CONFIG,
                         "loss scaler '%s' (choices: torch, megatron, verl_fsdp, "
                         "verl_megatron)",
                         name);
}

prl_status prl_loss_scaler_init(prl_loss_scaler *s, const prl_loss_scaler_config *c)
{
    memset(s, 0, sizeof *s);
    if ((unsigned)c->kind > PRL_SCALER_MEGATRON)
        return prl_error_set(PRL_ERR_CONFIG, "loss scaler: kind %d", (int)c->kind);
    if (!(c->init_scale > 0 && isfinite(c->init_scale)))
        return prl_error_set(PRL_ERR_CONFIG, "loss scaler: init_scale %g must be finite and > 0",
                             c->init_scale);
    if (!(c->growth_factor >= 1 && isfinite(c->growth_factor)))
        return prl_error_set(PRL_ERR_CONFIG, "loss scaler: growth_factor %g must be >= 1",
                             c->growth_factor);
    if (!(c->backoff_factor > 0 && c->backoff_factor < 1))
        return prl_error_set(PRL_ERR_CONFIG, "loss scaler: backoff_factor %g must be in (0, 1)",
                             c->backoff_factor);
    if (c->growth_interval < 1)
        return prl_error_set(PRL_ERR_CONFIG, "loss scaler: growth_interval %d must be >= 1",
                             c->growth_interval);
    if (c->kind == PRL_SCALER_MEGATRON && c->hysteresis < 1)
        return prl_error_set(PRL_ERR_CONFIG, "loss scaler: hysteresis %d must be >= 1",
                             c->hysteresis);
    if (c->kind == PRL_SCALER_MEGATRON && !(c->min_scale > 0 && c->min_scale <= c->init_scale))
        return prl_error_set(PRL_ERR_CONFIG, "loss scaler: min_scale %g must be in (0, init_scale]",
                             c->min_scale);
    s->cfg = *c;
    s->scale = c->init_scale;
    s->hysteresis_tracker = c->hysteresis;
    return PRL_OK;
}

/* A growth that overflows the double keeps the old scale (rl.md §4.3 guard). */
static void scaler_grow(prl_loss_scaler *s)
{
    double grown = s->scale * s->cfg.growth_factor;
    if (isfinite(grown)) s->scale = grown;
}

int prl_loss_scaler_update(prl_loss_scaler *s, int found_inf)
{
    const prl_loss_scaler_config *c = &s->cfg;
    s->steps++;
    if (found_inf) {
        s->skipped++;
        s->growth_tracker = 0;
        if (c->kind == PRL_SCALER_TORCH) {
            s->scale *= c->backoff_factor;
        } else if (--s->hysteresis_tracker <= 0) {
            double b = s->scale * c->backoff_factor;
            s->scale = b > c->min_scale ? b : c->min_scale;
        }
        return 1;
    }
    if (++s->growth_tracker == c->growth_interval) {
        s->growth_tracker = 0;
        if (c->kind == PRL_SCALER_MEGATRON) s->hysteresis_tracker = c->hysteresis;
        scaler_grow(s);
    }
    return 0;
}

void prl_grads_unscale(prl_real *grads, size_t n, double scale)
{
    prl_real d = (prl_real)scale; /* a division, as the spec says: exact for any scale */
    for (size_t i = 0; i < n; i++) grads[i] /= d;
}

int prl_grads_finite(const prl_real *grads, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(grads[i])) return 0;
    return 1;
}

prl_status prl_optim_step_scaled(prl_optim *o, prl_model *m, prl_loss_scaler *s,
                                 prl_optim_stats *stats, int *skipped)
{
    *skipped = 0;
    if (!s) return prl_optim_step(o, m, stats);
    /* rl.md §4.3: unscale (in the gradients' precision) → inf/NaN check → clip the unscaled
    ** gradients and step, or skip → update the scale */
    prl_grads_unscale(m->grads, m->n_params, s->scale);
    int found_inf = !prl_grads_finite(m->grads, m->n_params);
    prl_status rc = PRL_OK;
    if (found_inf) {
        if (stats)
            *stats = (prl_optim_stats){.lr = prl_optim_lr_at(&o->cfg, o->step),
                                       .grad_norm = NAN,
                                       .clip_scale = 1};
    } else {
        rc = prl_optim_step(o, m, stats);
    }
    if (rc == PRL_OK) *skipped = prl_loss_scaler_update(s, found_inf);
    return rc;
}
