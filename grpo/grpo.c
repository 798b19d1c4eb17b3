/*
** grpo.c — group-relative advantages (GRPO, Dr.GRPO, RLOO), the clipped PPO surrogate on the
** token ratio or on GSPO's sequence ratio and its aggregation, with the per-token gradient
** weights the engine's backward takes (grpo.h; maths: shared/spec/rl.md §1, docs/grpo.md).
*/
#include "grpo/grpo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ advantages ------ */

typedef struct member {
    int64_t group;
    int index;
} member;

static int by_group(const void *a, const void *b)
{
    const member *x = a, *y = b;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    return x->index - y->index; /* stable: sums run in sample order */
}

/* Advantages of one group: members m[0..k) (in sample order). */
static void group_advantages(double *adv, int *keep, const double *r, const member *m, int k,
                             prl_grpo_baseline est, prl_grpo_adv_norm norm, double eps,
                             prl_grpo_singleton singleton, prl_grpo_adv_stats *st)
{
    st->groups++;
    if (k == 1) {
        int i = m[0].index;
        st->singletons++;
        adv[i] = singleton == PRL_GRPO_SINGLETON_VERL
                     ? (norm == PRL_GRPO_NORM_STD ? r[i] / (1.0 + eps) : r[i])
                     : 0.0;
        if (keep) keep[i] = singleton != PRL_GRPO_SINGLETON_DROP;
        return;
    }
    double sum = 0, mean, var = 0;
    for (int j = 0; j < k; j++) sum += r[m[j].index];
    mean = sum / k;
    for (int j = 0; j < k; j++) var += (r[m[j].index] - mean) * (r[m[j].index] - mean);
    double sd = sqrt(var / (k - 1)); /* unbiased, as verl (torch.std) */
    int constant = 1;
    for (int j = 1; j < k; j++) constant &= r[m[j].index] == r[m[0].index];
    st->constant_groups += constant;
    for (int j = 0; j < k; j++) {
        int i = m[j].index;
        /* a constant group gets exactly 0, whatever rounding the mean picked up; RLOO's
        ** baseline leaves the sample itself out */
        double base = est == PRL_GRPO_BASELINE_RLOO ? (sum - r[i]) / (k - 1) : mean;
        double d = constant ? 0.0 : r[i] - base;
        adv[i] = norm == PRL_GRPO_NORM_STD ? d / (sd + eps) : d;
        if (keep) keep[i] = 1;
    }
}

prl_status prl_grpo_advantages(double *adv, int *keep, const double *rewards, const int64_t *group,
                               int n, prl_grpo_baseline est, prl_grpo_adv_norm norm, double eps,
                               prl_grpo_singleton singleton, prl_grpo_adv_stats *stats)
{
    prl_grpo_adv_stats st = {0};
    if (n < 0) return prl_error_set(PRL_ERR_ARG, "advantages: %d samples", n);
    if ((unsigned)est > PRL_GRPO_BASELINE_RLOO)
        return prl_error_set(PRL_ERR_ARG, "advantages: unknown estimator %d", (int)est);
    if (!(eps > 0)) return prl_error_set(PRL_ERR_ARG, "advantages: epsilon %g must be > 0", eps);
    if (singleton == PRL_GRPO_SINGLETON_DROP && !keep)
        return prl_error_set(PRL_ERR_ARG, "advantages: singleton mode 'drop' needs a keep array");
    for (int i = 0; i < n; i++)
        if (!isfinite(rewards[i]))
            return prl_error_set(PRL_ERR_ARG, "advantages: sample %d has reward %g", i, rewards[i]);
    member *m = malloc((size_t)(n ? n : 1) * sizeof *m);
    if (!m) return prl_error_set(PRL_ERR_NOMEM, "advantages of %d samples", n);
    for (int i = 0; i < n; i++) m[i] = (member){group[i], i};
    qsort(m, (size_t)n, sizeof *m, by_group);
    for (int j = 0; j < n;) {
        int k = 1;
        while (j + k < n && m[j + k].group == m[j].group) k++;
        group_advantages(adv, keep, rewards, m + j, k, est, norm, eps, singleton, &st);
        j += k;
    }
    free(m);
    if (stats) *stats = st;
    return PRL_OK;
}

/* ------------------------------------------------------------------ policy loss ----- */

void prl_grpo_loss_config_default(prl_grpo_loss_config *c)
{
    *c = (prl_grpo_loss_config){.kind = PRL_GRPO_LOSS_PPO_CLIP,
                                .ratio = PRL_GRPO_RATIO_TOKEN,
                                .clip_low = 0.2,
                                .clip_high = 0.28,
                                .clip_c = 3.0,
                                .agg = PRL_GRPO_AGG_TOKEN_MEAN,
                                .loss_scale_factor = 0};
}

static const char *const agg_names[] = {"token-mean", "token-sum", "seq-mean-token-mean",
                                        "seq-mean-token-sum", "seq-mean-token-sum-norm"};

const char *prl_grpo_agg_name(prl_grpo_agg a) { return (unsigned)a < 5 ? agg_names[a] : "?"; }

prl_status prl_grpo_agg_parse(const char *s, prl_grpo_agg *out)
{
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, agg_names[i])) {
            *out = (prl_grpo_agg)i;
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_ARG,
                         "unknown loss aggregation '%s' (choices: token-mean, "
                         "token-sum, seq-mean-token-mean, seq-mean-token-sum, "
                         "seq-mean-token-sum-norm)",
                         s);
}

prl_status prl_grpo_loss_config_check(const prl_grpo_loss_config *c)
{
    if ((unsigned)c->kind > PRL_GRPO_LOSS_REINFORCE)
        return prl_error_set(PRL_ERR_ARG, "unknown loss kind %d", (int)c->kind);
    if ((unsigned)c->ratio > PRL_GRPO_RATIO_SEQUENCE)
        return prl_error_set(PRL_ERR_ARG, "unknown ratio level %d", (int)c->ratio);
    if (c->ratio == PRL_GRPO_RATIO_SEQUENCE && c->kind == PRL_GRPO_LOSS_REINFORCE)
        return prl_error_set(PRL_ERR_ARG, "the sequence ratio (gspo) needs the clipped "
                                          "surrogate: the reinforce loss has no ratio");
    if (!(c->clip_low >= 0 && c->clip_low < 1))
        return prl_error_set(PRL_ERR_ARG, "clip_low %g must be in [0, 1)", c->clip_low);
    if (!(c->clip_high >= 0))
        return prl_error_set(PRL_ERR_ARG, "clip_high %g must be >= 0", c->clip_high);
    if (!(c->clip_c == 0 || c->clip_c > 1))
        return prl_error_set(PRL_ERR_ARG, "clip_c %g must be > 1 (or 0 to disable the dual clip)",
                             c->clip_c);
    if ((unsigned)c->agg > PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM_NORM)
        return prl_error_set(PRL_ERR_ARG, "unknown loss aggregation %d", (int)c->agg);
    if (c->agg == PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM_NORM && !(c->loss_scale_factor > 0))
        return prl_error_set(PRL_ERR_ARG,
                             "loss_scale_factor %g must be > 0 for "
                             "seq-mean-token-sum-norm",
                             c->loss_scale_factor);
    return PRL_OK;
}

/* Flags of a token (verl's clip fractions): the ratio clip is above the unclipped loss
** (L2 > L1); the dual clip bounds the loss (A < 0 and max(L1, L2) > L3). */
enum { CLIPPED = 1, DUAL = 2 };

static double token_loss(double lp_new, double lp_old, double A, const prl_grpo_loss_config *c,
                         double *dlp, int *branch)
{
    if (c->kind == PRL_GRPO_LOSS_REINFORCE) { /* plain policy gradient: no ratio to clip */
        *branch = 0;
        *dlp = -A;
        return -A * lp_new;
    }
    double nkl = lp_new - lp_old, clamped = nkl < -20 ? -20 : nkl > 20 ? 20 : nkl;
    double r = exp(clamped);
    double L1 = -A * r;
    double rc = r < 1 - c->clip_low ? 1 - c->clip_low : r > 1 + c->clip_high ? 1 + c->clip_high : r;
    double L2 = -A * rc;
    double L = L1 >= L2 ? L1 : L2;
    /* the unclipped branch carries −A·r as gradient; a clamp (ratio or ±20) carries none */
    double g = L1 >= L2 && clamped == nkl ? -A * r : 0.0;
    *branch = L2 > L1 ? CLIPPED : 0;
    if (c->clip_c > 0 && A < 0) {
        double L3 = -A * c->clip_c;
        if (L3 < L) {
            L = L3, g = 0.0;
            *branch |= DUAL;
        }
    }
    *dlp = g;
    return L;
}

double prl_grpo_token_loss(double lp_new, double lp_old, double adv, const prl_grpo_loss_config *c,
                           double *dloss_dlp)
{
    int branch;
    double g, L = token_loss(lp_new, lp_old, adv, c, &g, &branch);
    if (dloss_dlp) *dloss_dlp = g;
    return L;
}

/* GSPO's sequence log-ratio: mean_t (lp_new − lp_old) over n tokens, summed in index order. */
static double seq_log_ratio_d(const double *lp_new, const double *lp_old, int n)
{
    double d = 0;
    for (int t = 0; t < n; t++) d += lp_new[t] - lp_old[t];
    return d / n;
}

double prl_grpo_gspo_seq_loss(const double *lp_new, const double *lp_old, int n, double adv,
                              const prl_grpo_loss_config *c, double *dlp)
{
    int branch;
    double g, L = token_loss(seq_log_ratio_d(lp_new, lp_old, n), 0.0, adv, c, &g, &branch);
    for (int t = 0; dlp && t < n; t++) dlp[t] = g / n; /* ∂ log s / ∂lp_new[t] = 1/n */
    return L;
}

double prl_grpo_agg_coefficient(const prl_grpo_loss_config *c, int seq_tokens, int n_tokens,
                                int n_seqs)
{
    switch (c->agg) {
    case PRL_GRPO_AGG_TOKEN_MEAN: return 1.0 / n_tokens;
    case PRL_GRPO_AGG_TOKEN_SUM: return 1.0;
    case PRL_GRPO_AGG_SEQ_MEAN_TOKEN_MEAN: return 1.0 / n_seqs / (seq_tokens + 1e-8);
    case PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM: return 1.0 / n_seqs;
    case PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM_NORM: return 1.0 / n_seqs / c->loss_scale_factor;
    }
    return 0;
}

/* Valid tokens of sequence b (mask != 0). */
static int seq_tokens(const uint8_t *mask, int b, int T)
{
    int k = 0;
    for (int t = 0; t < T; t++) k += mask[(size_t)b * T + t] != 0;
    return k;
}

/* GSPO's log s of sequence b: the mean of lp_new − lp_old over its k loss tokens (in double,
** in index order, as prl_grpo_gspo_seq_loss); 0 with the token ratio (unused there). */
static double seq_log_ratio(const prl_grpo_loss_config *c, const float *lp_new, const float *lp_old,
                            const uint8_t *mask, int b, int T, int k)
{
    if (c->ratio != PRL_GRPO_RATIO_SEQUENCE) return 0;
    double d = 0;
    for (int t = 0; t < T; t++) {
        size_t i = (size_t)b * T + t;
        if (mask[i]) d += (double)lp_new[i] - (double)lp_old[i];
    }
    return d / k;
}

prl_status prl_grpo_loss_partial(const prl_grpo_loss_config *c, const float *lp_new,
                                 const float *lp_old, const double *adv, const uint8_t *mask,
                                 const float *iw, int B, int T, int n_tokens, int n_seqs, float *w,
                                 prl_grpo_loss_stats *stats)
{
    return prl_grpo_loss_partial_tok(c, lp_new, lp_old, adv, NULL, mask, iw, B, T, n_tokens, n_seqs,
                                     w, stats);
}

prl_status prl_grpo_loss_partial_tok(const prl_grpo_loss_config *c, const float *lp_new,
                                     const float *lp_old, const double *adv, const float *adv_tok,
                                     const uint8_t *mask, const float *iw, int B, int T,
                                     int n_tokens, int n_seqs, float *w, prl_grpo_loss_stats *stats)
{
    prl_status rc = prl_grpo_loss_config_check(c);
    if (rc) return rc;
    if (B < 0 || T < 0 || n_tokens < 0 || n_seqs < 0)
        return prl_error_set(PRL_ERR_ARG, "loss: batch %d x %d, %d tokens in %d sequences", B, T,
                             n_tokens, n_seqs);
    prl_grpo_loss_stats st = {0};
    memset(w, 0, (size_t)B * T * sizeof *w);
    int clipped = 0, dual = 0;
    for (int b = 0; b < B; b++) {
        int k = seq_tokens(mask, b, T);
        if (k == 0) continue;
        if (k > n_tokens || n_seqs < 1)
            return prl_error_set(PRL_ERR_ARG,
                                 "loss: sequence %d has %d tokens but the whole "
                                 "batch counts %d in %d sequences",
                                 b, k, n_tokens, n_seqs);
        st.tokens += k, st.sequences++;
        double coef = prl_grpo_agg_coefficient(c, k, n_tokens, n_seqs);
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            if (mask[i] && (!isfinite(lp_new[i]) || !isfinite(lp_old[i])))
                return prl_error_set(PRL_ERR_ARG, "loss: sequence %d position %d: log-prob %g / %g",
                                     b, t, lp_new[i], lp_old[i]);
        }
        int seq = c->ratio == PRL_GRPO_RATIO_SEQUENCE;
        double log_s = seq_log_ratio(c, lp_new, lp_old, mask, b, T, k);
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            if (!mask[i]) continue;
            int branch;
            double A = adv[b] + (adv_tok ? (double)adv_tok[i] : 0.0);
            /* GSPO: every token takes the surrogate at s (GSPO-token: its gradient −A·s) */
            double g, L = seq ? token_loss(log_s, 0.0, A, c, &g, &branch)
                              : token_loss(lp_new[i], lp_old[i], A, c, &g, &branch);
            double wt = iw ? iw[i] : 1.0;
            st.loss += coef * wt * L;
            w[i] = (float)(coef * wt * g);
            clipped += (branch & CLIPPED) != 0;
            dual += (branch & DUAL) != 0;
            st.ppo_kl += (double)lp_old[i] - lp_new[i];
        }
    }
    if (n_tokens) {
        st.clipfrac = (double)clipped / n_tokens;
        st.clipfrac_lower = (double)dual / n_tokens;
        st.ppo_kl /= n_tokens;
    }
    if (stats) *stats = st;
    return PRL_OK;
}

prl_status prl_grpo_loss(const prl_grpo_loss_config *c, const float *lp_new, const float *lp_old,
                         const double *adv, const uint8_t *mask, const float *iw, int B, int T,
                         float *w, prl_grpo_loss_stats *stats)
{
    if (B < 0 || T < 0) return prl_error_set(PRL_ERR_ARG, "loss: batch %d x %d", B, T);
    int n_tokens = 0, n_seqs = 0;
    for (int b = 0; b < B; b++) {
        int k = seq_tokens(mask, b, T);
        n_tokens += k, n_seqs += k > 0;
    }
    return prl_grpo_loss_partial(c, lp_new, lp_old, adv, mask, iw, B, T, n_tokens, n_seqs, w,
                                 stats);
}
