/*
** advantage.c — the OPD per-token advantage and its metrics (opd.h, rl.md §5.1, §5.6):
** A_t = coef·(lp_T − lp_S) on the loss tokens (coef scaled per teacher), discounted (γ),
** clipped ([lo, hi]) and masked (|A| < δ → 0) in that order. Observation tokens (mask 0) get 0
** and pass no credit. Also the weights of the top-k distillation term (opd.topk), the teacher
** keys and the opd.* config. Everything in double, in index order.
*/
#include "opd/opd.h"

#include "job/job.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- teachers --------- */

static const char *const keys[PRL_OPD_TEACHERS] = {"agent", "coding", "general", "reasoning"};

const char *prl_opd_teacher_key(int i) { return i >= 0 && i < PRL_OPD_TEACHERS ? keys[i] : NULL; }

int prl_opd_teacher_index(const char *name)
{
    for (int i = 0; name && i < PRL_OPD_TEACHERS; i++)
        if (!strcmp(keys[i], name)) return i;
    return -1;
}

/* ---------------------------------------------------------------- config ----------- */

void prl_opd_config_default(prl_opd_config *c)
{
    *c = (prl_opd_config){.coef = 1.0, .clip_low = -5, .clip_high = 5, .topk_coef = 1.0};
    for (int k = 0; k < PRL_OPD_TEACHERS; k++) c->teacher_coef[k] = 1.0;
}

prl_status prl_opd_config_check(const prl_opd_config *c)
{
    if (!isfinite(c->coef))
        return prl_error_set(PRL_ERR_CONFIG, "opd.coef %g must be finite", c->coef);
    for (int k = 0; k < PRL_OPD_TEACHERS; k++)
        if (!(c->teacher_coef[k] >= 0 && isfinite(c->teacher_coef[k])))
            return prl_error_set(PRL_ERR_CONFIG, "opd.teacher_coef.%s %g must be finite and >= 0",
                                 keys[k], c->teacher_coef[k]);
    if (!(c->discount >= 0 && c->discount < 1))
        return prl_error_set(PRL_ERR_CONFIG, "opd.discount %g must be in [0, 1)", c->discount);
    if (c->clip && !(c->clip_low <= c->clip_high))
        return prl_error_set(PRL_ERR_CONFIG, "opd.adv_clip_low %g must be <= opd.adv_clip_high %g",
                             c->clip_low, c->clip_high);
    if (!(c->mask_eps >= 0 && isfinite(c->mask_eps)))
        return prl_error_set(PRL_ERR_CONFIG, "opd.adv_mask_eps %g must be >= 0", c->mask_eps);
    if (!isfinite(c->task_weight))
        return prl_error_set(PRL_ERR_CONFIG, "opd.task_weight %g must be finite", c->task_weight);
    if (c->topk < 0 || c->topk > PRL_MAX_EXTRA_TARGETS)
        return prl_error_set(PRL_ERR_CONFIG, "opd.topk %d must be in [0, %d]", c->topk,
                             PRL_MAX_EXTRA_TARGETS);
    if (!(c->topk_coef >= 0 && isfinite(c->topk_coef)))
        return prl_error_set(PRL_ERR_CONFIG, "opd.topk_coef %g must be finite and >= 0",
                             c->topk_coef);
    return PRL_OK;
}

prl_status prl_opd_config_from_job(prl_opd_config *c, const prl_job_config *j)
{
    prl_opd_config_default(c);
    c->coef = j->opd_coef, c->discount = j->opd_discount, c->clip = j->opd_adv_clip;
    c->clip_low = j->opd_adv_clip_low, c->clip_high = j->opd_adv_clip_high;
    c->mask_eps = j->opd_adv_mask_eps, c->task_weight = j->opd_task_weight;
    c->topk = j->opd_topk, c->topk_coef = j->opd_topk_coef;
    for (int k = 0; k < PRL_OPD_TEACHERS; k++) c->teacher_coef[k] = j->opd_teacher_coef[k];
    return prl_opd_config_check(c);
}

/* ---------------------------------------------------------------- advantages ------- */

/* Sequence s: raw advantages of its loss tokens (coefficient coef), then the discounted sum
** from the end. */
static prl_status seq_raw(const prl_opd_config *c, double coef, const float *lp_s,
                          const float *lp_t, const uint8_t *mask, int32_t a, int32_t b, int s,
                          double *kl, float *adv)
{
    double future = 0; /* Σ_{k>t} γ^{k−t} A_k over later loss tokens */
    for (int32_t i = b - 1; i >= a; i--) {
        adv[i] = 0;
        if (!mask[i]) continue;
        if (!isfinite(lp_s[i]) || !isfinite(lp_t[i]))
            return prl_error_set(PRL_ERR_ARG,
                                 "opd advantages: sequence %d token %d: student "
                                 "log-prob %g, teacher log-prob %g",
                                 s, i - a, lp_s[i], lp_t[i]);
        double d = (double)lp_t[i] - lp_s[i];
        *kl -= d;
        double A = coef * d + c->discount * future;
        future = A;
        adv[i] = (float)A;
    }
    return PRL_OK;
}

/* Clip then mask one advantage; counts what changed. */
static double clip_mask(const prl_opd_config *c, double A, long *clipped, long *masked)
{
    if (c->clip && (A < c->clip_low || A > c->clip_high)) {
        A = A < c->clip_low ? c->clip_low : c->clip_high;
        (*clipped)++;
    }
    if (fabs(A) < c->mask_eps) {
        A = 0;
        (*masked)++;
    }
    return A;
}

prl_status prl_opd_advantages(const prl_opd_config *c, const float *lp_s, const float *lp_t,
                              const uint8_t *mask, const int32_t *seq_start, int n_seq,
                              const int32_t *teacher, float *adv, prl_opd_stats *st_out)
{
    prl_status rc = prl_opd_config_check(c);
    if (rc) return rc;
    if (n_seq < 0) return prl_error_set(PRL_ERR_ARG, "opd advantages: %d sequences", n_seq);
    prl_opd_stats st;
    memset(&st, 0, sizeof st);
    long clipped = 0, masked = 0;
    double kl_sum = 0, tkl[PRL_OPD_TEACHERS] = {0}, sum = 0;
    for (int s = 0; s < n_seq; s++) {
        int32_t a = seq_start[s], b = seq_start[s + 1];
        int k = teacher ? teacher[s] : -1;
        if (teacher && (k < 0 || k >= PRL_OPD_TEACHERS))
            return prl_error_set(PRL_ERR_ARG,
                                 "opd advantages: sequence %d has teacher %d (need "
                                 "0..%d)",
                                 s, k, PRL_OPD_TEACHERS - 1);
        double kl = 0;
        double coef = c->coef * (k >= 0 ? c->teacher_coef[k] : 1.0);
        if ((rc = seq_raw(c, coef, lp_s, lp_t, mask, a, b, s, &kl, adv))) return rc;
        long n = 0;
        for (int32_t i = a; i < b; i++) {
            if (!mask[i]) continue;
            double A = clip_mask(c, adv[i], &clipped, &masked);
            adv[i] = (float)A;
            sum += A, n++;
            st.adv_min = st.tokens + n == 1 ? A : fmin(st.adv_min, A);
            st.adv_max = st.tokens + n == 1 ? A : fmax(st.adv_max, A);
        }
        st.tokens += n, kl_sum += kl;
        if (k >= 0) st.samples[k]++, st.teacher_tokens[k] += n, tkl[k] += kl;
    }
    st.teacher_kl = st.tokens ? kl_sum / st.tokens : NAN;
    st.topk_mass = st.top1_match = NAN; /* prl_opd_distill_weights' */
    st.clipped_frac = st.tokens ? (double)clipped / st.tokens : 0;
    st.masked_frac = st.tokens ? (double)masked / st.tokens : 0;
    st.adv_mean = st.tokens ? sum / st.tokens : 0;
    for (int k = 0; k < PRL_OPD_TEACHERS; k++)
        st.kl[k] = st.teacher_tokens[k] ? tkl[k] / st.teacher_tokens[k] : NAN;
    if (st_out) *st_out = st;
    return PRL_OK;
}

/* ---------------------------------------------------------------- distillation ----- */

void prl_opd_distill_weights(const prl_opd_config *c, const prl_grpo_batch *b,
                             const prl_opd_batch *ob, float *q, prl_opd_stats *st)
{
    int K = ob->topk;
    long tokens = 0, match = 0;
    double mass = 0;
    for (int i = 0; i < b->n; i++) {
        size_t first;
        int len;
        prl_grpo_batch_response(b, i, &first, &len);
        const int32_t *sampled = b->tokens + b->offsets[i] + b->prompt_lens[i];
        double coef = c->topk_coef * c->teacher_coef[ob->teacher[i]];
        for (int j = 0; j < len; j++) {
            size_t f = first + j;
            int loss = b->mask[f];
            for (int k = 0; k < K; k++) {
                double p = loss ? exp((double)ob->topk_lp[f * K + k]) : 0;
                q[f * K + k] = (float)(coef * p);
                mass += p;
            }
            tokens += loss;
            match += loss && ob->topk_ids[f * K] == sampled[j];
        }
    }
    if (st) {
        st->topk_mass = tokens ? mass / tokens : NAN;
        st->top1_match = tokens ? (double)match / tokens : NAN;
    }
}

/* ---------------------------------------------------------------- metrics ---------- */

static json_t *real_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

void prl_opd_stats_json(void *obj, const prl_opd_stats *st)
{
    json_t *o = obj, *samples = json_object(), *tokens = json_object(), *kl = json_object();
    json_object_set_new(o, "opd_tokens", json_integer(st->tokens));
    json_object_set_new(o, "opd_teacher_kl", real_or_null(st->teacher_kl));
    json_object_set_new(o, "opd_masked_frac", json_real(st->masked_frac));
    json_object_set_new(o, "opd_clipped_frac", json_real(st->clipped_frac));
    json_object_set_new(o, "opd_adv_mean", json_real(st->adv_mean));
    json_object_set_new(o, "opd_adv_min", json_real(st->adv_min));
    json_object_set_new(o, "opd_adv_max", json_real(st->adv_max));
    for (int k = 0; k < PRL_OPD_TEACHERS; k++) {
        if (!st->samples[k]) continue;
        json_object_set_new(samples, keys[k], json_integer(st->samples[k]));
        json_object_set_new(tokens, keys[k], json_integer(st->teacher_tokens[k]));
        json_object_set_new(kl, keys[k], real_or_null(st->kl[k]));
    }
    if (isfinite(st->topk_mass)) {
        json_object_set_new(o, "opd_topk_mass", json_real(st->topk_mass));
        json_object_set_new(o, "opd_top1_match", real_or_null(st->top1_match));
    }
    json_object_set_new(o, "opd_teacher_samples", samples);
    json_object_set_new(o, "opd_teacher_tokens", tokens);
    json_object_set_new(o, "opd_teacher_kl_by", kl);
}
