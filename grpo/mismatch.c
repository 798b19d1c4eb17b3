/*
** mismatch.c — train–infer mismatch corrections and metrics (grpo.h "mismatch correction";
** maths: shared/spec/rl.md §2 and §6; the project's choices: docs/grpo.md).
**
** What it does: per-token detached weights and keep masks of TIS, MIS, IcePop and KPop from
** two log-prob arrays; the PCC rule that picks the strict or the loose threshold setting; the
** step's mismatch metrics. What it does not do: apply them — the trainer multiplies the PPO
** token loss by the weights (grpo.c takes them as `iw`) and chooses the denominator.
**
** Ownership: every array is the caller's; functions write only their outputs (the metrics
** allocate scratch and free it before returning).
*/
#include "grpo/grpo.h"

#include "job/job.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAFETY_BOUND 20.0 /* verl clamps log-ratios to ±20 before exp */
#define KPOP_CLAMP 1e-8   /* AReaL clamps p, q to [1e-8, 1 − 1e-8] */

/* ------------------------------------------------------------------ configuration --- */

static const char *const corr_names[] = {"none", "tis", "mis", "icepop", "kpop"};
static const char *const level_names[] = {"token", "sequence"};
static const char *const mode_names[] = {"decoupled", "bypass"};
static const char *const loss_names[] = {"ppo_clip", "reinforce"};
static const char *const denom_names[] = {"original", "kept"};

const char *prl_grpo_corr_name(prl_grpo_corr k)
{
    return (unsigned)k <= PRL_GRPO_CORR_KPOP ? corr_names[k] : "?";
}

const char *prl_grpo_corr_mode_name(prl_grpo_corr_mode m)
{
    return (unsigned)m <= PRL_GRPO_MODE_BYPASS ? mode_names[m] : "?";
}

const char *prl_grpo_denominator_name(prl_grpo_denominator d)
{
    return (unsigned)d <= PRL_GRPO_DENOM_KEPT ? denom_names[d] : "?";
}

void prl_grpo_corr_config_default(prl_grpo_corr_config *c)
{
    /* loose: the literature's defaults (rl.md §2.2–2.6, §7); strict: a tighter band that
    ** masks more of a poorly correlated batch [G] */
    *c = (prl_grpo_corr_config){.kind = PRL_GRPO_CORR_NONE,
                                .level = PRL_GRPO_LEVEL_TOKEN,
                                .mode = PRL_GRPO_MODE_DECOUPLED,
                                .bypass_loss = PRL_GRPO_LOSS_PPO_CLIP,
                                .denominator = PRL_GRPO_DENOM_ORIGINAL,
                                .loose = {.tis_cap = 2.0,
                                          .mis_cap = 2.0,
                                          .icepop_low = 0.5,
                                          .icepop_high = 5.0,
                                          .kpop_phi = 0.75},
                                .strict = {.tis_cap = 1.5,
                                           .mis_cap = 1.5,
                                           .icepop_low = 0.8,
                                           .icepop_high = 1.25,
                                           .kpop_phi = 0.1},
                                .pcc_rule = 0,
                                .pcc_threshold = 0.99,
                                .extreme_ratio = 2.0};
}

/* One setting's ranges; `pre` is "" or "strict." for the key names. */
static prl_status check_bounds(const prl_grpo_corr_bounds *b, const char *pre)
{
    const struct {
        const char *k;
        double v;
    } pos[] = {{"tis_cap", b->tis_cap},
               {"mis_cap", b->mis_cap},
               {"icepop_low", b->icepop_low},
               {"icepop_high", b->icepop_high},
               {"kpop_phi", b->kpop_phi}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (!(pos[i].v > 0 && isfinite(pos[i].v)))
            return prl_error_set(PRL_ERR_CONFIG, "grpo.correction.%s%s %g must be > 0", pre,
                                 pos[i].k, pos[i].v);
    if (b->icepop_low > b->icepop_high)
        return prl_error_set(PRL_ERR_CONFIG,
                             "grpo.correction.%sicepop_low %g must be <= "
                             "grpo.correction.%sicepop_high %g",
                             pre, b->icepop_low, pre, b->icepop_high);
    return PRL_OK;
}

/* The strict setting masks at least what the loose one masks. */
static prl_status check_stricter(const prl_grpo_corr_bounds *s, const prl_grpo_corr_bounds *l)
{
    if (s->tis_cap > l->tis_cap || s->mis_cap > l->mis_cap || s->kpop_phi > l->kpop_phi ||
        s->icepop_low < l->icepop_low || s->icepop_high > l->icepop_high)
        return prl_error_set(PRL_ERR_CONFIG,
                             "grpo.correction.strict.*: the strict setting "
                             "(tis_cap %g, mis_cap %g, icepop [%g, %g], kpop_phi %g) must be at "
                             "least as strict as the loose one (%g, %g, [%g, %g], %g)",
                             s->tis_cap, s->mis_cap, s->icepop_low, s->icepop_high, s->kpop_phi,
                             l->tis_cap, l->mis_cap, l->icepop_low, l->icepop_high, l->kpop_phi);
    return PRL_OK;
}

/* The rules that tie kind, level, mode and denominator together (rl.md §2.1, §2.6, §7). */
static prl_status check_combination(const prl_grpo_corr_config *c)
{
    const char *k = prl_grpo_corr_name(c->kind);
    if (c->level == PRL_GRPO_LEVEL_SEQUENCE &&
        (c->kind == PRL_GRPO_CORR_ICEPOP || c->kind == PRL_GRPO_CORR_KPOP))
        return prl_error_set(PRL_ERR_CONFIG,
                             "grpo.correction.level = sequence: only tis and "
                             "mis have a sequence level, not %s",
                             k);
    if (c->mode == PRL_GRPO_MODE_DECOUPLED && c->bypass_loss != PRL_GRPO_LOSS_PPO_CLIP)
        return prl_error_set(PRL_ERR_CONFIG, "grpo.correction.bypass_loss = reinforce needs "
                                             "grpo.correction.mode = bypass");
    if (c->mode != PRL_GRPO_MODE_BYPASS) return PRL_OK;
    if (c->kind == PRL_GRPO_CORR_KPOP)
        return prl_error_set(PRL_ERR_CONFIG,
                             "grpo.correction.kind = kpop needs "
                             "grpo.correction.mode = decoupled (its mask is computed once from "
                             "the recomputed old log-probs)");
    if (c->bypass_loss == PRL_GRPO_LOSS_PPO_CLIP && c->kind != PRL_GRPO_CORR_NONE)
        return prl_error_set(PRL_ERR_CONFIG,
                             "grpo.correction.kind = %s with mode = bypass and "
                             "bypass_loss = ppo_clip: the PPO ratio already is pi/pi_infer, a "
                             "weight would count the mismatch twice (use bypass_loss = "
                             "reinforce or mode = decoupled)",
                             k);
    if (c->denominator == PRL_GRPO_DENOM_KEPT)
        return prl_error_set(PRL_ERR_CONFIG,
                             "grpo.correction.denominator = kept needs "
                             "grpo.correction.mode = decoupled (bypass weights change with every "
                             "forward, the count must be known before it)");
    return PRL_OK;
}

prl_status prl_grpo_corr_config_check(const prl_grpo_corr_config *c)
{
    if ((unsigned)c->kind > PRL_GRPO_CORR_KPOP || (unsigned)c->level > PRL_GRPO_LEVEL_SEQUENCE ||
        (unsigned)c->mode > PRL_GRPO_MODE_BYPASS ||
        (unsigned)c->bypass_loss > PRL_GRPO_LOSS_REINFORCE ||
        (unsigned)c->denominator > PRL_GRPO_DENOM_KEPT)
        return prl_error_set(PRL_ERR_CONFIG, "grpo.correction: kind, level, mode, bypass_loss or "
                                             "denominator out of range");
    prl_status rc = check_bounds(&c->loose, "");
    if (rc == PRL_OK) rc = check_bounds(&c->strict, "strict.");
    if (rc == PRL_OK && c->pcc_rule) rc = check_stricter(&c->strict, &c->loose);
    if (rc) return rc;
    if (!(c->pcc_threshold >= -1 && c->pcc_threshold <= 1))
        return prl_error_set(PRL_ERR_CONFIG, "grpo.correction.pcc_threshold %g must be in [-1, 1]",
                             c->pcc_threshold);
    if (!(c->extreme_ratio > 1 && isfinite(c->extreme_ratio)))
        return prl_error_set(PRL_ERR_CONFIG, "grpo.correction.extreme_ratio %g must be > 1",
                             c->extreme_ratio);
    return check_combination(c);
}

/* The index of s among names[0..n), or -1. */
static int choice(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

prl_status prl_grpo_corr_config_from_job(prl_grpo_corr_config *c, const prl_job_config *j)
{
    prl_grpo_corr_config_default(c);
    int k = choice(j->corr_kind, corr_names, 5), l = choice(j->corr_level, level_names, 2);
    int m = choice(j->corr_mode, mode_names, 2), bl = choice(j->corr_bypass_loss, loss_names, 2);
    int d = choice(j->corr_denominator, denom_names, 2);
    if (k < 0 || l < 0 || m < 0 || bl < 0 || d < 0) /* the key table checks the choices first */
        return prl_error_set(PRL_ERR_CONFIG, "grpo.correction: an unknown kind, level, mode, "
                                             "bypass_loss or denominator");
    c->kind = (prl_grpo_corr)k, c->level = (prl_grpo_corr_level)l;
    c->mode = (prl_grpo_corr_mode)m, c->bypass_loss = (prl_grpo_loss_kind)bl;
    c->denominator = (prl_grpo_denominator)d;
    c->loose =
        (prl_grpo_corr_bounds){j->tis_cap, j->mis_cap, j->icepop_low, j->icepop_high, j->kpop_phi};
    c->strict = (prl_grpo_corr_bounds){j->strict_tis_cap, j->strict_mis_cap, j->strict_icepop_low,
                                       j->strict_icepop_high, j->strict_kpop_phi};
    c->pcc_rule = j->pcc_rule, c->pcc_threshold = j->pcc_threshold;
    c->extreme_ratio = j->extreme_ratio;
    return prl_grpo_corr_config_check(c);
}

int prl_grpo_corr_select(const prl_grpo_corr_config *c, double pcc, prl_grpo_corr_bounds *out)
{
    /* !(pcc >= t) is true for NaN: an undefined PCC takes the strict side */
    int strict = c->pcc_rule && !(pcc >= c->pcc_threshold);
    *out = strict ? c->strict : c->loose;
    return strict;
}

/* ------------------------------------------------------------------ weights --------- */

static double clamp_lr(double x)
{
    return x < -SAFETY_BOUND ? -SAFETY_BOUND : x > SAFETY_BOUND ? SAFETY_BOUND : x;
}

/* p log(p/q) + (1−p) log((1−p)/(1−q)): the KL of Bernoulli(p) to Bernoulli(q). */
static double bernoulli_kl(double p, double q)
{
    return p * log(p / q) + (1 - p) * log((1 - p) / (1 - q));
}

/* clamp(e^lp, 1e-8, 1 − 1e-8), NaN kept (fmin/fmax would drop it). */
static double kpop_prob(double lp)
{
    double p = exp(lp);
    if (isnan(p)) return p;
    return p < KPOP_CLAMP ? KPOP_CLAMP : p > 1 - KPOP_CLAMP ? 1 - KPOP_CLAMP : p;
}

double prl_grpo_kpop_metric(double lp, double lp_mu)
{
    double p = kpop_prob(lp), q = kpop_prob(lp_mu);
    double fw = bernoulli_kl(p, q), rv = bernoulli_kl(q, p);
    if (isnan(fw) || isnan(rv)) return NAN;
    return fw > rv ? fw : rv;
}

/* The weight of a (token or sequence) log-ratio x under a ratio-based correction; *kept = 0
** when the correction masks it, *capped = 1 when TIS truncated it. */
static double ratio_weight(prl_grpo_corr kind, const prl_grpo_corr_bounds *bd, double x, int *kept,
                           int *capped)
{
    *kept = 1, *capped = 0;
    if (kind == PRL_GRPO_CORR_NONE) return 1.0;
    if (isnan(x)) { /* e.g. −inf − (−inf): the ratio cannot be judged → masked [G] */
        *kept = 0;
        return 0.0;
    }
    double rho = exp(clamp_lr(x));
    switch (kind) {
    case PRL_GRPO_CORR_TIS: *capped = rho > bd->tis_cap; return *capped ? bd->tis_cap : rho;
    case PRL_GRPO_CORR_MIS: *kept = rho <= bd->mis_cap; break;
    case PRL_GRPO_CORR_ICEPOP: *kept = rho >= bd->icepop_low && rho <= bd->icepop_high; break;
    default: break;
    }
    return *kept ? rho : 0.0;
}

/* KPop of one token (rl.md §2.6 pseudo-code). */
static double kpop_weight(const prl_grpo_corr_bounds *bd, double lp, double lp_mu, int *kept)
{
    double metric = prl_grpo_kpop_metric(lp, lp_mu);
    *kept = metric <= bd->kpop_phi; /* NaN compares false: masked */
    double lr = lp - lp_mu;
    if (!isfinite(lr)) lr = 0;
    return *kept ? exp(clamp_lr(lr)) : 0.0;
}

/* Σ of the valid tokens' log-ratios of sequence s (NaN if any is NaN). */
static double seq_log_ratio(const float *lp, const float *lp_mu, const uint8_t *mask,
                            const int32_t *seq_start, int s)
{
    double sum = 0;
    for (int32_t i = seq_start[s]; i < seq_start[s + 1]; i++)
        if (mask[i]) sum += (double)lp[i] - lp_mu[i];
    return sum;
}

static void stats_add(prl_grpo_corr_stats *st, double *sum, double *sq, double w, int kept,
                      int capped)
{
    st->tokens++;
    st->masked += !kept, st->truncated += capped;
    *sum += w, *sq += w * w;
    if (st->tokens == 1 || w < st->w_min) st->w_min = w;
    if (st->tokens == 1 || w > st->w_max) st->w_max = w;
}

prl_status prl_grpo_corr_weights(const prl_grpo_corr_config *c, const prl_grpo_corr_bounds *bd,
                                 const float *lp, const float *lp_mu, const uint8_t *mask,
                                 const int32_t *seq_start, int n_seq, float *w, uint8_t *keep,
                                 prl_grpo_corr_stats *st_out)
{
    if (n_seq < 0 || (unsigned)c->kind > PRL_GRPO_CORR_KPOP)
        return prl_error_set(PRL_ERR_ARG, "correction weights: %d sequences, kind %d", n_seq,
                             (int)c->kind);
    int seq_level = c->level == PRL_GRPO_LEVEL_SEQUENCE &&
                    (c->kind == PRL_GRPO_CORR_TIS || c->kind == PRL_GRPO_CORR_MIS);
    prl_grpo_corr_stats st = {0};
    double sum = 0, sq = 0;
    for (int s = 0; s < n_seq; s++) {
        int kept = 1, capped = 0;
        double ws = 0;
        if (seq_level)
            ws = ratio_weight(c->kind, bd, seq_log_ratio(lp, lp_mu, mask, seq_start, s), &kept,
                              &capped);
        for (int32_t i = seq_start[s]; i < seq_start[s + 1]; i++) {
            if (!mask[i]) {
                w[i] = 0;
                if (keep) keep[i] = 0;
                continue;
            }
            double wi = ws;
            if (c->kind == PRL_GRPO_CORR_KPOP) wi = kpop_weight(bd, lp[i], lp_mu[i], &kept);
            else if (!seq_level)
                wi = ratio_weight(c->kind, bd, (double)lp[i] - lp_mu[i], &kept, &capped);
            w[i] = (float)wi;
            if (keep) keep[i] = (uint8_t)kept;
            stats_add(&st, &sum, &sq, wi, kept, capped);
        }
    }
    st.w_sum = sum, st.w_sq = sq;
    if (st.tokens) {
        st.w_mean = sum / st.tokens;
        st.ess = sq > 0 ? sum * sum / ((double)st.tokens * sq) : NAN;
    } else {
        st.ess = NAN;
    }
    if (st_out) *st_out = st;
    return PRL_OK;
}

/* ------------------------------------------------------------------ metrics --------- */

/* Pearson correlation of a, b over the valid tokens (means first, then the centred sums, in
** index order); NaN for fewer than 2 tokens or a constant vector. Constancy is tested on the
** values, not on the centred sum of squares: the rounded mean of n equal values can differ
** from them, which would leave a tiny non-zero variance and a meaningless PCC. */
static double pearson(const double *a, const double *b, long n)
{
    if (n < 2) return NAN;
    int varies_a = 0, varies_b = 0;
    for (long i = 1; i < n; i++) varies_a |= a[i] != a[0], varies_b |= b[i] != b[0];
    if (!varies_a || !varies_b) return NAN;
    double ma = 0, mb = 0;
    for (long i = 0; i < n; i++) ma += a[i], mb += b[i];
    ma /= n, mb /= n;
    double sab = 0, saa = 0, sbb = 0;
    for (long i = 0; i < n; i++) {
        sab += (a[i] - ma) * (b[i] - mb);
        saa += (a[i] - ma) * (a[i] - ma);
        sbb += (b[i] - mb) * (b[i] - mb);
    }
    return saa > 0 && sbb > 0 ? sab / sqrt(saa * sbb) : NAN;
}

/* The metrics that need only the token pairs: |d|, |Δp|, k1–k3, χ²_token, ESS, F(τ). The
** valid tokens' values are gathered into a (p_tr, p_inf, lp_tr, lp_inf) scratch for the PCC. */
static void token_metrics(const prl_grpo_corr_config *c, const float *lp_tr, const float *lp_inf,
                          const uint8_t *mask, long n_all, double *scratch,
                          prl_grpo_mismatch_stats *st)
{
    double *ptr = scratch, *pinf = scratch + n_all, *ltr = pinf + n_all, *linf = ltr + n_all;
    double sd = 0, sdp = 0, k1 = 0, k2 = 0, k3 = 0, r1 = 0, r2 = 0, tau = log(c->extreme_ratio);
    long n = 0, extreme = 0;
    for (long i = 0; i < n_all; i++) {
        if (!mask[i]) continue;
        double d = (double)lp_tr[i] - lp_inf[i], dc = clamp_lr(d), r = exp(dc);
        ltr[n] = lp_tr[i], linf[n] = lp_inf[i];
        ptr[n] = exp(ltr[n]), pinf[n] = exp(linf[n]);
        double dp = fabs(ptr[n] - pinf[n]);
        sd += fabs(d), sdp += dp;
        if (n == 0 || fabs(d) > st->logprob_diff_max) st->logprob_diff_max = fabs(d);
        if (n == 0 || dp > st->prob_diff_max) st->prob_diff_max = dp;
        k1 -= d, k2 += 0.5 * d * d, k3 += r - dc - 1;
        r1 += r, r2 += r * r;
        extreme += d > tau || d < -tau;
        n++;
    }
    st->tokens = n;
    if (n == 0) return;
    st->logprob_diff_mean = sd / n, st->prob_diff_mean = sdp / n;
    double var = 0;
    for (long i = 0; i < n; i++) {
        double e = fabs(ptr[i] - pinf[i]) - st->prob_diff_mean;
        var += e * e;
    }
    st->prob_diff_std = n > 1 ? sqrt(var / (n - 1)) : NAN;
    st->k1 = k1 / n, st->k2 = k2 / n, st->k3 = k3 / n;
    st->chi2_token = r2 / n - 1;
    st->ess = r1 * r1 / ((double)n * r2);
    st->extreme_frac = (double)extreme / n;
    st->pcc = pearson(ptr, pinf, n);
    st->pcc_logprob = pearson(ltr, linf, n);
}

/* χ²_seq = mean over sequences with a valid token of exp(2·clamp(Σ_t d, ±20)) − 1. */
static double chi2_seq(const float *lp_tr, const float *lp_inf, const uint8_t *mask,
                       const int32_t *seq_start, int n_seq)
{
    double sum = 0;
    long n = 0;
    for (int s = 0; s < n_seq; s++) {
        int valid = 0;
        for (int32_t i = seq_start[s]; i < seq_start[s + 1]; i++) valid |= mask[i];
        if (!valid) continue;
        double R = exp(clamp_lr(seq_log_ratio(lp_tr, lp_inf, mask, seq_start, s)));
        sum += R * R, n++;
    }
    return n ? sum / n - 1 : NAN;
}

/* The share of valid tokens correction `kind` masks (or, for TIS, truncates) at setting bd. */
static prl_status would_mask(const prl_grpo_corr_config *c, prl_grpo_corr kind,
                             const prl_grpo_corr_bounds *bd, const float *lp_tr,
                             const float *lp_inf, const uint8_t *mask, const int32_t *seq_start,
                             int n_seq, float *w, double *frac)
{
    prl_grpo_corr_config k = *c;
    k.kind = kind;
    if (kind == PRL_GRPO_CORR_ICEPOP || kind == PRL_GRPO_CORR_KPOP) k.level = PRL_GRPO_LEVEL_TOKEN;
    prl_grpo_corr_stats cs;
    prl_status rc =
        prl_grpo_corr_weights(&k, bd, lp_tr, lp_inf, mask, seq_start, n_seq, w, NULL, &cs);
    long hit = kind == PRL_GRPO_CORR_TIS ? cs.truncated : cs.masked;
    *frac = cs.tokens ? (double)hit / cs.tokens : NAN;
    return rc;
}

prl_status prl_grpo_mismatch_metrics(const prl_grpo_corr_config *c, const float *lp_train,
                                     const float *lp_infer, const uint8_t *mask,
                                     const int32_t *seq_start, int n_seq,
                                     prl_grpo_mismatch_stats *st_out, prl_grpo_corr_bounds *bd_out)
{
    if (n_seq < 0 || (n_seq > 0 && seq_start[0] != 0))
        return prl_error_set(PRL_ERR_ARG, "mismatch metrics: %d sequences", n_seq);
    long n_all = n_seq ? seq_start[n_seq] : 0;
    prl_grpo_mismatch_stats st = {0};
    double *scratch = malloc((size_t)(n_all ? n_all : 1) * 4 * sizeof *scratch);
    float *w = malloc((size_t)(n_all ? n_all : 1) * sizeof *w);
    if (!scratch || !w) {
        free(scratch), free(w);
        return prl_error_set(PRL_ERR_NOMEM, "mismatch metrics of %ld tokens", n_all);
    }
    token_metrics(c, lp_train, lp_infer, mask, n_all, scratch, &st);
    if (st.tokens == 0) { /* nothing to measure: every mean is undefined */
        st.logprob_diff_mean = st.logprob_diff_max = st.prob_diff_mean = st.prob_diff_max = NAN;
        st.prob_diff_std = st.pcc = st.pcc_logprob = st.k1 = st.k2 = st.k3 = NAN;
        st.chi2_token = st.ess = st.extreme_frac = NAN;
    }
    st.chi2_seq = chi2_seq(lp_train, lp_infer, mask, seq_start, n_seq);
    prl_grpo_corr_bounds bd;
    st.strict = prl_grpo_corr_select(c, st.pcc, &bd);
    prl_status rc = PRL_OK;
    const prl_grpo_corr kinds[4] = {PRL_GRPO_CORR_TIS, PRL_GRPO_CORR_MIS, PRL_GRPO_CORR_ICEPOP,
                                    PRL_GRPO_CORR_KPOP};
    double *fracs[4] = {&st.tis_clipfrac, &st.mis_masked_frac, &st.icepop_masked_frac,
                        &st.kpop_masked_frac};
    for (int k = 0; rc == PRL_OK && k < 4; k++)
        rc = would_mask(c, kinds[k], &bd, lp_train, lp_infer, mask, seq_start, n_seq, w, fracs[k]);
    free(scratch), free(w);
    if (rc) return rc;
    if (st_out) *st_out = st;
    if (bd_out) *bd_out = bd;
    return PRL_OK;
}
