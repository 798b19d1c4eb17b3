/*
** test_grpo_mismatch.c — the train–infer mismatch corrections and metrics of grpo/mismatch.c
** against hand-computed vectors: TIS, MIS (token and sequence), IcePop, KPop (φ ∈ {0.1, 0.5,
** 0.75, 2}, the probability clamp, the NaN rule), the PCC rule, every rl.md §6 metric, the
** edge cases (NaN, empty, all masked), the config rules, and the bypass `reinforce` token
** loss's gradient by central finite differences.
**
** The 5-token vector V of rl.md §2.7 is used throughout (one sequence, every token valid):
**   p_train = [0.3, 0.6, 0.01, 0.9, 0.05], p_infer = [0.3, 0.2, 0.1, 0.85, 0.004]
**   ρ = p_train/p_infer = [1, 3, 0.1, 1.058824, 12.5]
**   d = log ρ = [0, 1.098612, −2.302585, 0.057158, 2.525729], Σd = 1.378914
** Log-probs are stored as float, so expected values carry a 1e-5 relative tolerance.
*/
#include "grpo/grpo.h"

#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <string.h>

static const double PT[5] = {0.3, 0.6, 0.01, 0.9, 0.05}, PI[5] = {0.3, 0.2, 0.1, 0.85, 0.004};

static void vector_v(float *lp, float *mu, uint8_t *mask)
{
    for (int i = 0; i < 5; i++) lp[i] = (float)log(PT[i]), mu[i] = (float)log(PI[i]), mask[i] = 1;
}

static void close_to(double got, double want, const char *what)
{
    ck_assert_msg(fabs(got - want) <= 1e-5 * (1 + fabs(want)), "%s: %.9g, expected %.9g", what, got,
                  want);
}

static prl_grpo_corr_config corr(prl_grpo_corr kind, prl_grpo_corr_level level)
{
    prl_grpo_corr_config c;
    prl_grpo_corr_config_default(&c);
    c.kind = kind, c.level = level;
    return c;
}

/* Weights of V under `c` at its loose setting. */
static void weights_v(const prl_grpo_corr_config *c, float *w, uint8_t *keep,
                      prl_grpo_corr_stats *st)
{
    float lp[5], mu[5];
    uint8_t mask[5];
    int32_t seq[2] = {0, 5};
    vector_v(lp, mu, mask);
    ck_assert_int_eq(prl_grpo_corr_weights(c, &c->loose, lp, mu, mask, seq, 1, w, keep, st),
                     PRL_OK);
}

/* rl.md §2.7: TIS C = 2 → min(ρ, 2) = [1, 2, 0.1, 1.058824, 2]; IcePop [0.5, 5] → ρ inside
** the band, else 0 = [1, 3, 0, 1.058824, 0]; token MIS C = 2 → ρ·1[ρ ≤ 2] = [1, 0, 0.1,
** 1.058824, 0]. */
START_TEST(test_token_weights_rl_vector)
{
    const double tis[5] = {1, 2, 0.1, 0.9 / 0.85, 2}, ice[5] = {1, 3, 0, 0.9 / 0.85, 0},
                 mis[5] = {1, 0, 0.1, 0.9 / 0.85, 0};
    const uint8_t ice_keep[5] = {1, 1, 0, 1, 0}, mis_keep[5] = {1, 0, 1, 1, 0};
    float w[5];
    uint8_t keep[5];
    prl_grpo_corr_stats st;
    prl_grpo_corr_config c = corr(PRL_GRPO_CORR_TIS, PRL_GRPO_LEVEL_TOKEN);
    weights_v(&c, w, keep, &st);
    for (int i = 0; i < 5; i++) {
        close_to(w[i], tis[i], "tis");
        ck_assert_int_eq(keep[i], 1);
    }
    ck_assert(st.tokens == 5 && st.masked == 0 && st.truncated == 2); /* ρ = 3 and 12.5 capped */
    /* Σw = 6.158824, Σw² = 10.131107 → ESS = 6.158824² / (5 · 10.131107) = 0.748805 */
    close_to(st.w_mean, 6.158824 / 5, "tis mean");
    close_to(st.ess, 0.748805, "tis ess");
    close_to(st.w_min, 0.1, "tis min");
    ck_assert(st.w_max == 2.0);
    c = corr(PRL_GRPO_CORR_ICEPOP, PRL_GRPO_LEVEL_TOKEN);
    weights_v(&c, w, keep, &st);
    for (int i = 0; i < 5; i++) {
        close_to(w[i], ice[i], "icepop");
        ck_assert_int_eq(keep[i], ice_keep[i]);
    }
    ck_assert(st.masked == 2 && st.truncated == 0);
    c = corr(PRL_GRPO_CORR_MIS, PRL_GRPO_LEVEL_TOKEN);
    weights_v(&c, w, keep, &st);
    for (int i = 0; i < 5; i++) {
        close_to(w[i], mis[i], "mis");
        ck_assert_int_eq(keep[i], mis_keep[i]);
    }
    ck_assert(st.masked == 2);
    /* none: 1 on every valid token */
    c = corr(PRL_GRPO_CORR_NONE, PRL_GRPO_LEVEL_TOKEN);
    weights_v(&c, w, keep, &st);
    for (int i = 0; i < 5; i++) ck_assert(w[i] == 1 && keep[i] == 1);
    ck_assert(st.ess == 1);
}
END_TEST

/* IcePop's bounds are inclusive: with α = β = 1 the ratio-1 token (p equal) is kept and every
** other token of V is masked. */
START_TEST(test_icepop_inclusive)
{
    prl_grpo_corr_config c = corr(PRL_GRPO_CORR_ICEPOP, PRL_GRPO_LEVEL_TOKEN);
    c.loose.icepop_low = c.loose.icepop_high = 1.0;
    float w[5];
    uint8_t keep[5];
    weights_v(&c, w, keep, NULL);
    ck_assert(keep[0] == 1 && w[0] == 1);
    for (int i = 1; i < 5; i++) ck_assert(keep[i] == 0 && w[i] == 0);
}
END_TEST

/* Sequence level on V: Σd = 1.378914 → ρ_seq = e^1.378914 = 3.970588 (= Π ρ = 3·0.1·1.058824·
** 12.5); TIS C = 2 → 2 on every token; TIS C = 10 → 3.970588; MIS C = 2 → rejected (all 0).
** Two sequences with a masked token: seq 0 log-ratios [0.2, (0.3 masked), −0.1] → Σ = 0.1,
** ρ = e^0.1 = 1.105171; seq 1 [0.5, 0.4] → ρ = e^0.9 = 2.459603. TIS C = 1.5 → [1.105171, 0,
** 1.105171, 1.5, 1.5]; MIS C = 2 → [1.105171, 0, 1.105171, 0, 0] with seq 1 masked. */
START_TEST(test_sequence_level)
{
    float w[5];
    uint8_t keep[5];
    prl_grpo_corr_config c = corr(PRL_GRPO_CORR_TIS, PRL_GRPO_LEVEL_SEQUENCE);
    weights_v(&c, w, keep, NULL);
    for (int i = 0; i < 5; i++) close_to(w[i], 2.0, "seq tis");
    c.loose.tis_cap = 10;
    weights_v(&c, w, keep, NULL);
    for (int i = 0; i < 5; i++) close_to(w[i], 3.970588, "seq is");
    c = corr(PRL_GRPO_CORR_MIS, PRL_GRPO_LEVEL_SEQUENCE);
    prl_grpo_corr_stats st;
    weights_v(&c, w, keep, &st);
    for (int i = 0; i < 5; i++) ck_assert(w[i] == 0 && keep[i] == 0);
    ck_assert(st.masked == 5 && isnan(st.ess)); /* every weight 0: ESS undefined */

    float lp[5] = {-0.8f, -0.7f, -1.1f, -0.5f, -0.6f}, mu[5] = {-1, -1, -1, -1, -1};
    uint8_t mask[5] = {1, 0, 1, 1, 1};
    int32_t seq[3] = {0, 3, 5};
    c = corr(PRL_GRPO_CORR_TIS, PRL_GRPO_LEVEL_SEQUENCE);
    c.loose.tis_cap = 1.5;
    ck_assert_int_eq(prl_grpo_corr_weights(&c, &c.loose, lp, mu, mask, seq, 2, w, keep, &st),
                     PRL_OK);
    const double tis[5] = {1.105171, 0, 1.105171, 1.5, 1.5};
    for (int i = 0; i < 5; i++) close_to(w[i], tis[i], "seq tis 2");
    ck_assert(keep[1] == 0 && st.tokens == 4 && st.masked == 0 && st.truncated == 2);
    c = corr(PRL_GRPO_CORR_MIS, PRL_GRPO_LEVEL_SEQUENCE);
    ck_assert_int_eq(prl_grpo_corr_weights(&c, &c.loose, lp, mu, mask, seq, 2, w, keep, &st),
                     PRL_OK);
    const double mis[5] = {1.105171, 0, 1.105171, 0, 0};
    for (int i = 0; i < 5; i++) close_to(w[i], mis[i], "seq mis 2");
    ck_assert(keep[0] == 1 && keep[2] == 1 && keep[3] == 0 && keep[4] == 0 && st.masked == 2);
}
END_TEST

/* KPop metric max(D_B(p‖q), D_B(q‖p)), D_B(p‖q) = p ln(p/q) + (1−p) ln((1−p)/(1−q)):
**   (0.6, 0.2):   D(p‖q) = 0.6 ln 3 + 0.4 ln 0.5 = 0.659167 − 0.277259 = 0.381908
**                 D(q‖p) = 0.2 ln(1/3) + 0.8 ln 2 = −0.219722 + 0.554518 = 0.334795 → 0.381908
**   (0.9, 0.5):   D(p‖q) = 0.9 ln 1.8 + 0.1 ln 0.2 = 0.529008 − 0.160944 = 0.368064
**                 D(q‖p) = 0.5 ln(5/9) + 0.5 ln 5 = −0.293893 + 0.804719 = 0.510826 → 0.510826
**   (0.95, 0.4):  D(p‖q) = 0.95 ln 2.375 + 0.05 ln(1/12) = 0.821760 − 0.124245 = 0.697514
**                 D(q‖p) = 0.4 ln(0.4/0.95) + 0.6 ln 12 = −0.346004 + 1.490944 = 1.144940
**   (0.01, 0.1):  D(p‖q) = 0.01 ln 0.1 + 0.99 ln 1.1 = −0.023026 + 0.094358 = 0.071332
**                 D(q‖p) = 0.1 ln 10 + 0.9 ln(0.9/0.99) = 0.230259 − 0.085780 = 0.144479
**   (0.05, 0.004): D(p‖q) = 0.05 ln 12.5 + 0.95 ln(0.95/0.996) = 0.126286 − 0.044921 = 0.081365
**                 D(q‖p) = 0.004 ln 0.08 + 0.996 ln(0.996/0.95) = −0.010103 + 0.047098 = 0.036995
** Keep iff metric ≤ φ; a kept token's weight is ρ = p/q = [3, 1.8, 2.375, 0.1, 12.5]. */
START_TEST(test_kpop_phi)
{
    const double p[5] = {0.6, 0.9, 0.95, 0.01, 0.05}, q[5] = {0.2, 0.5, 0.4, 0.1, 0.004};
    const double metric[5] = {0.381908, 0.510826, 1.144940, 0.144479, 0.081365};
    const double phi[4] = {0.1, 0.5, 0.75, 2.0};
    const uint8_t keeps[4][5] = {{0, 0, 0, 0, 1},
                                 {1, 0, 0, 1, 1},
                                 {1, 1, 0, 1, 1},
                                 {1, 1, 1, 1, 1}};
    float lp[5], mu[5], w[5];
    uint8_t mask[5] = {1, 1, 1, 1, 1}, keep[5];
    int32_t seq[2] = {0, 5};
    for (int i = 0; i < 5; i++) {
        lp[i] = (float)log(p[i]), mu[i] = (float)log(q[i]);
        close_to(prl_grpo_kpop_metric(lp[i], mu[i]), metric[i], "kpop metric");
    }
    for (int f = 0; f < 4; f++) {
        prl_grpo_corr_config c = corr(PRL_GRPO_CORR_KPOP, PRL_GRPO_LEVEL_TOKEN);
        c.loose.kpop_phi = phi[f];
        prl_grpo_corr_stats st;
        ck_assert_int_eq(prl_grpo_corr_weights(&c, &c.loose, lp, mu, mask, seq, 1, w, keep, &st),
                         PRL_OK);
        long masked = 0;
        for (int i = 0; i < 5; i++) {
            ck_assert_msg(keep[i] == keeps[f][i], "phi %g token %d", phi[f], i);
            close_to(w[i], keeps[f][i] ? p[i] / q[i] : 0, "kpop weight");
            masked += !keeps[f][i];
        }
        ck_assert_int_eq(st.masked, masked);
    }
}
END_TEST

/* The clamps and the NaN rule. p = 1 is clamped to 1 − 1e-8: against q = 0.5,
** D(p‖q) = (1 − 1e-8) ln(2(1 − 1e-8)) + 1e-8 ln(2e-8) ≈ ln 2 = 0.693147,
** D(q‖p) = 0.5 ln(0.5/(1 − 1e-8)) + 0.5 ln(0.5/1e-8) = −0.346574 + 8.863767 = 8.517193 (finite;
** unclamped it is +inf). Both log-probs −inf: p = q = 1e-8 → metric 0 → kept, and the NaN
** log-ratio −inf − (−inf) is replaced by 0 → w = 1. A NaN log-prob: metric NaN → masked. */
START_TEST(test_kpop_clamps_and_nan)
{
    close_to(prl_grpo_kpop_metric(0.0, log(0.5)), 8.517193, "clamped metric");
    ck_assert(prl_grpo_kpop_metric(-INFINITY, -INFINITY) == 0);
    ck_assert(isnan(prl_grpo_kpop_metric(NAN, -1)));
    float lp[3] = {-INFINITY, NAN, -1}, mu[3] = {-INFINITY, -1, NAN}, w[3];
    uint8_t mask[3] = {1, 1, 1}, keep[3];
    int32_t seq[2] = {0, 3};
    prl_grpo_corr_config c = corr(PRL_GRPO_CORR_KPOP, PRL_GRPO_LEVEL_TOKEN);
    ck_assert_int_eq(prl_grpo_corr_weights(&c, &c.loose, lp, mu, mask, seq, 1, w, keep, NULL),
                     PRL_OK);
    ck_assert(keep[0] == 1 && w[0] == 1);
    ck_assert(keep[1] == 0 && w[1] == 0 && keep[2] == 0 && w[2] == 0);
    /* the ratio-based corrections mask a NaN log-ratio (−inf − −inf included) */
    for (int k = PRL_GRPO_CORR_TIS; k <= PRL_GRPO_CORR_ICEPOP; k++) {
        c = corr((prl_grpo_corr)k, PRL_GRPO_LEVEL_TOKEN);
        ck_assert_int_eq(prl_grpo_corr_weights(&c, &c.loose, lp, mu, mask, seq, 1, w, keep, NULL),
                         PRL_OK);
        for (int i = 0; i < 3; i++)
            ck_assert_msg(keep[i] == 0 && w[i] == 0, "kind %d token %d", k, i);
    }
    /* ±inf log-ratios are clamped to ±20: TIS caps e^20 at C */
    float lp2[1] = {-1}, mu2[1] = {-INFINITY};
    uint8_t m1[1] = {1};
    int32_t s1[2] = {0, 1};
    c = corr(PRL_GRPO_CORR_TIS, PRL_GRPO_LEVEL_TOKEN);
    ck_assert_int_eq(prl_grpo_corr_weights(&c, &c.loose, lp2, mu2, m1, s1, 1, w, keep, NULL),
                     PRL_OK);
    ck_assert(w[0] == 2 && keep[0] == 1);
}
END_TEST

/* Off the mask w = 0 and keep = 0; no valid token: zero counts, ESS undefined; no sequence. */
START_TEST(test_weights_empty_and_masked)
{
    float lp[5], mu[5], w[5];
    uint8_t mask[5], keep[5];
    int32_t seq[2] = {0, 5};
    vector_v(lp, mu, mask);
    memset(mask, 0, sizeof mask);
    for (int k = PRL_GRPO_CORR_NONE; k <= PRL_GRPO_CORR_KPOP; k++) {
        prl_grpo_corr_config c = corr((prl_grpo_corr)k, PRL_GRPO_LEVEL_TOKEN);
        prl_grpo_corr_stats st;
        memset(w, 0x7f, sizeof w);
        ck_assert_int_eq(prl_grpo_corr_weights(&c, &c.loose, lp, mu, mask, seq, 1, w, keep, &st),
                         PRL_OK);
        for (int i = 0; i < 5; i++) ck_assert(w[i] == 0 && keep[i] == 0);
        ck_assert(st.tokens == 0 && st.masked == 0 && isnan(st.ess));
        ck_assert_int_eq(prl_grpo_corr_weights(&c, &c.loose, lp, mu, mask, seq, 0, w, keep, &st),
                         PRL_OK);
        ck_assert(st.tokens == 0);
    }
}
END_TEST

/* Every §6 metric of V (one sequence, N = 5; hand computation):
**   |d| mean = (0 + 1.098612 + 2.302585 + 0.057158 + 2.525729)/5 = 5.984084/5 = 1.196817,
**   max 2.525729
**   |Δp| = [0, 0.4, 0.09, 0.05, 0.046]: mean 0.586/5 = 0.1172, max 0.4, unbiased std:
**   deviations [−0.1172, 0.2828, −0.0272, −0.0672, −0.0712], Σ² = 0.1040368, /4, √ = 0.161274
**   k1 = −Σd/5 = −0.275783; k2 = Σ d²/2 / 5 = (1.206949 + 5.301898 + 0.003267 + 6.379307)/10
**   = 1.289142; k3 = mean(ρ − d − 1) = (0 + 0.901388 + 1.402585 + 0.001665 + 8.974271)/5
**   = 2.255982 (the rl.md §2.7 seq_mean_k3)
**   χ²_token = mean ρ² − 1 = (1 + 9 + 0.01 + 1.121107 + 156.25)/5 − 1 = 32.476221
**   χ²_seq = (e^Σd)² − 1 = 3.970588² − 1 = 14.765571
**   ESS of ρ = (Σρ)²/(N Σρ²) = 17.658824² / (5 · 167.381107) = 0.372604
**   F(2): ρ > 2 or < 1/2 → tokens 1, 2, 4 → 0.6
**   PCC(p): means 0.372, 0.2908; Σ(a−ā)(b−b̄) = 0.435312, Σ(a−ā)² = 0.570680,
**   Σ(b−b̄)² = 0.439693 → 0.435312 / √(0.570680 · 0.439693) = 0.869020 (log-probs: 0.593975)
**   per mask at the loose setting: TIS truncates 2/5, MIS masks 2/5, IcePop 2/5, KPop (φ 0.75;
**   metrics 0, 0.381908, 0.144479, 0.012235, 0.081365) 0/5. */
START_TEST(test_metrics_rl_vector)
{
    float lp[5], mu[5];
    uint8_t mask[5];
    int32_t seq[2] = {0, 5};
    vector_v(lp, mu, mask);
    prl_grpo_corr_config c = corr(PRL_GRPO_CORR_NONE, PRL_GRPO_LEVEL_TOKEN);
    prl_grpo_mismatch_stats m;
    prl_grpo_corr_bounds bd;
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, mu, mask, seq, 1, &m, &bd), PRL_OK);
    ck_assert_int_eq(m.tokens, 5);
    close_to(m.logprob_diff_mean, 1.196817, "abs diff mean");
    close_to(m.logprob_diff_max, 2.525729, "abs diff max");
    close_to(m.prob_diff_mean, 0.1172, "prob diff mean");
    close_to(m.prob_diff_max, 0.4, "prob diff max");
    close_to(m.prob_diff_std, 0.161274, "prob diff std");
    close_to(m.k1, -0.275783, "k1");
    close_to(m.k2, 1.289142, "k2");
    close_to(m.k3, 2.255982, "k3");
    close_to(m.chi2_token, 32.476221, "chi2 token");
    close_to(m.chi2_seq, 14.765571, "chi2 seq");
    close_to(m.ess, 0.372604, "ess");
    close_to(m.extreme_frac, 0.6, "extreme");
    close_to(m.pcc, 0.869020, "pcc");
    close_to(m.pcc_logprob, 0.593975, "pcc logprob");
    close_to(m.tis_clipfrac, 0.4, "tis clipfrac");
    close_to(m.mis_masked_frac, 0.4, "mis masked");
    close_to(m.icepop_masked_frac, 0.4, "icepop masked");
    ck_assert(m.kpop_masked_frac == 0 && m.strict == 0);
    ck_assert(bd.kpop_phi == c.loose.kpop_phi);
    /* τ = 15: no token is extreme (12.5 < 15, 0.1 > 1/15) */
    c.extreme_ratio = 15;
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, mu, mask, seq, 1, &m, NULL), PRL_OK);
    ck_assert(m.extreme_frac == 0);
    /* identical log-probs: every distance 0, PCC 1, ESS 1 */
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, lp, mask, seq, 1, &m, NULL), PRL_OK);
    ck_assert(m.logprob_diff_max == 0 && m.k1 == 0 && m.k2 == 0 && m.k3 == 0 && m.chi2_token == 0);
    close_to(m.pcc, 1, "pcc identical");
    ck_assert(m.ess == 1 && m.chi2_seq == 0);
}
END_TEST

/* No valid token: every metric NaN (JSON null), nothing masked, the PCC rule sees NaN. */
START_TEST(test_metrics_empty)
{
    float lp[5], mu[5];
    uint8_t mask[5];
    int32_t seq[2] = {0, 5};
    vector_v(lp, mu, mask);
    memset(mask, 0, sizeof mask);
    prl_grpo_corr_config c = corr(PRL_GRPO_CORR_NONE, PRL_GRPO_LEVEL_TOKEN);
    prl_grpo_mismatch_stats m;
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, mu, mask, seq, 1, &m, NULL), PRL_OK);
    ck_assert(m.tokens == 0 && isnan(m.logprob_diff_mean) && isnan(m.pcc) && isnan(m.k3));
    ck_assert(isnan(m.chi2_seq) && isnan(m.ess) && isnan(m.kpop_masked_frac));
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, mu, mask, seq, 0, &m, NULL), PRL_OK);
    ck_assert(m.tokens == 0);
    /* a constant vector: PCC undefined, though the mean of 3 × e^logf(0.2f) in double is
    ** 2.8e-17 off the value (so the centred sum of squares is not exactly 0) */
    float mu3[3] = {logf(0.2f), logf(0.2f), logf(0.2f)};
    uint8_t mask3[3] = {1, 1, 1};
    int32_t seq3[2] = {0, 3};
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, mu3, mask3, seq3, 1, &m, NULL), PRL_OK);
    ck_assert(m.tokens == 3 && isnan(m.pcc) && isnan(m.pcc_logprob));
    /* one token: the PCC and the std are undefined, the means are not */
    mask[1] = 1;
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, mu, mask, seq, 1, &m, NULL), PRL_OK);
    ck_assert(m.tokens == 1 && isnan(m.pcc) && isnan(m.prob_diff_std));
    close_to(m.k1, -log(3), "k1 of one token");
}
END_TEST

/* The PCC rule: strict iff the rule is on and PCC < threshold or PCC is NaN. Through the
** metrics: p_train = [0.1, 0.2, 0.3], p_infer = [0.3, 0.2, 0.1] has PCC −1 (b = 0.4 − a);
** ratios [1/3, 1, 3]: IcePop masks 1/3 at [0.5, 5] but 2/3 at the strict [0.8, 1.25]. */
START_TEST(test_pcc_rule)
{
    prl_grpo_corr_config c = corr(PRL_GRPO_CORR_KPOP, PRL_GRPO_LEVEL_TOKEN);
    prl_grpo_corr_bounds bd;
    c.pcc_threshold = 0.9;
    ck_assert_int_eq(prl_grpo_corr_select(&c, -1.0, &bd), 0); /* rule off: always loose */
    ck_assert(bd.kpop_phi == c.loose.kpop_phi);
    c.pcc_rule = 1;
    ck_assert_int_eq(prl_grpo_corr_select(&c, 0.95, &bd), 0);
    ck_assert(bd.kpop_phi == 0.75);
    ck_assert_int_eq(prl_grpo_corr_select(&c, 0.9, &bd), 0); /* at the threshold: loose */
    ck_assert_int_eq(prl_grpo_corr_select(&c, 0.85, &bd), 1);
    ck_assert(bd.kpop_phi == 0.1 && bd.icepop_low == 0.8 && bd.tis_cap == 1.5);
    ck_assert_int_eq(prl_grpo_corr_select(&c, NAN, &bd), 1);

    float lp[3] = {(float)log(0.1), (float)log(0.2), (float)log(0.3)};
    float mu[3] = {(float)log(0.3), (float)log(0.2), (float)log(0.1)};
    uint8_t mask[3] = {1, 1, 1};
    int32_t seq[2] = {0, 3};
    prl_grpo_mismatch_stats m;
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, mu, mask, seq, 1, &m, &bd), PRL_OK);
    close_to(m.pcc, -1, "pcc -1");
    ck_assert(m.strict == 1 && bd.icepop_high == 1.25);
    close_to(m.icepop_masked_frac, 2.0 / 3, "strict icepop");
    c.pcc_rule = 0;
    ck_assert_int_eq(prl_grpo_mismatch_metrics(&c, lp, mu, mask, seq, 1, &m, &bd), PRL_OK);
    ck_assert(m.strict == 0 && bd.icepop_high == 5);
    close_to(m.icepop_masked_frac, 1.0 / 3, "loose icepop");
}
END_TEST

static void expect_config_error(const prl_grpo_corr_config *c, const char *key)
{
    ck_assert_int_eq(prl_grpo_corr_config_check(c), PRL_ERR_CONFIG);
    ck_assert_msg(strstr(prl_error_message(), key), "'%s' not in: %s", key, prl_error_message());
}

START_TEST(test_config_rules)
{
    prl_grpo_corr_config c;
    prl_grpo_corr_config_default(&c);
    ck_assert_int_eq(prl_grpo_corr_config_check(&c), PRL_OK);
    ck_assert(c.kind == PRL_GRPO_CORR_NONE && c.loose.kpop_phi == 0.75 &&
              c.loose.icepop_low == 0.5);
    c.kind = PRL_GRPO_CORR_KPOP, c.mode = PRL_GRPO_MODE_BYPASS,
    c.bypass_loss = PRL_GRPO_LOSS_REINFORCE;
    expect_config_error(&c, "grpo.correction.kind = kpop");
    c.kind = PRL_GRPO_CORR_TIS, c.bypass_loss = PRL_GRPO_LOSS_PPO_CLIP;
    expect_config_error(&c, "count the mismatch twice");
    c.bypass_loss = PRL_GRPO_LOSS_REINFORCE;
    ck_assert_int_eq(prl_grpo_corr_config_check(&c), PRL_OK);
    c.denominator = PRL_GRPO_DENOM_KEPT;
    expect_config_error(&c, "grpo.correction.denominator");
    prl_grpo_corr_config_default(&c);
    c.bypass_loss = PRL_GRPO_LOSS_REINFORCE;
    expect_config_error(&c, "grpo.correction.bypass_loss");
    prl_grpo_corr_config_default(&c);
    c.kind = PRL_GRPO_CORR_ICEPOP, c.level = PRL_GRPO_LEVEL_SEQUENCE;
    expect_config_error(&c, "grpo.correction.level");
    prl_grpo_corr_config_default(&c);
    c.loose.icepop_low = 6;
    expect_config_error(&c, "grpo.correction.icepop_low 6");
    prl_grpo_corr_config_default(&c);
    c.strict.kpop_phi = 1.0; /* looser than the loose 0.75: unused while the rule is off */
    ck_assert_int_eq(prl_grpo_corr_config_check(&c), PRL_OK);
    c.pcc_rule = 1;
    expect_config_error(&c, "grpo.correction.strict");
    prl_grpo_corr_config_default(&c);
    c.strict.tis_cap = 0;
    expect_config_error(&c, "grpo.correction.strict.tis_cap 0");
    prl_grpo_corr_config_default(&c);
    c.pcc_threshold = 1.5;
    expect_config_error(&c, "grpo.correction.pcc_threshold");
    prl_grpo_corr_config_default(&c);
    c.extreme_ratio = 1;
    expect_config_error(&c, "grpo.correction.extreme_ratio");
}
END_TEST

/* Bypass `reinforce` (rl.md §2.1): L = −A·lp_new per token, ∂L/∂lp_new = −A whatever the
** ratio (no clip); the aggregated loss's token weights w = ∂loss/∂lp_new match central
** differences in every aggregation mode, with detached IS weights. */
START_TEST(test_reinforce_finite_difference)
{
    prl_grpo_loss_config c;
    prl_grpo_loss_config_default(&c);
    c.kind = PRL_GRPO_LOSS_REINFORCE;
    double g, h = 1e-6;
    const double cases[3][2] = {{-1.3, 0.7}, {-0.2, -1.1}, {-4.0, 2.5}}; /* (lp_new, A) */
    for (int k = 0; k < 3; k++) {
        double lp = cases[k][0], A = cases[k][1];
        close_to(prl_grpo_token_loss(lp, -0.1, A, &c, &g), -A * lp, "reinforce loss");
        double fd = (prl_grpo_token_loss(lp + h, -0.1, A, &c, NULL) -
                     prl_grpo_token_loss(lp - h, -0.1, A, &c, NULL)) /
                    (2 * h);
        ck_assert(fabs(fd - g) < 1e-8 && g == -A);
    }
    enum { B = 3, T = 4 };
    float lp_new[B * T], lp_old[B * T], w[B * T], wtmp[B * T], iw[B * T];
    uint8_t mask[B * T];
    double adv[B] = {1.3, -0.7, 0.4};
    for (int i = 0; i < B * T; i++) {
        lp_new[i] = -0.5f - 0.25f * (float)(i % 5);
        lp_old[i] = -3; /* far away: a PPO ratio would clip, reinforce ignores it */
        mask[i] = (uint8_t)(i % T != 1);
        iw[i] = (float)(i % 3 == 0 ? 0 : 0.5 + 0.1 * i); /* some tokens masked */
    }
    for (int a = 0; a < 5; a++) {
        c.agg = (prl_grpo_agg)a;
        c.loss_scale_factor = 7;
        prl_grpo_loss_stats st, up, dn;
        ck_assert_int_eq(prl_grpo_loss(&c, lp_new, lp_old, adv, mask, iw, B, T, w, &st), PRL_OK);
        ck_assert(st.clipfrac == 0 && st.clipfrac_lower == 0);
        for (int i = 0; i < B * T; i++) {
            float saved = lp_new[i], hf = 1e-2f;
            lp_new[i] = saved + hf;
            prl_grpo_loss(&c, lp_new, lp_old, adv, mask, iw, B, T, wtmp, &up);
            lp_new[i] = saved - hf;
            prl_grpo_loss(&c, lp_new, lp_old, adv, mask, iw, B, T, wtmp, &dn);
            lp_new[i] = saved;
            double fd = (up.loss - dn.loss) / ((double)(saved + hf) - (double)(saved - hf));
            ck_assert_msg(fabs(fd - w[i]) < 1e-5 * (1 + fabs(fd)), "mode %d token %d: w %g fd %g",
                          a, i, w[i], fd);
        }
        /* and the weights are −A·iw·coef: a masked token (iw 0) carries no gradient */
        ck_assert(w[0] == 0 && w[3] == 0);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grpo_mismatch");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_token_weights_rl_vector);
    tcase_add_test(tc, test_icepop_inclusive);
    tcase_add_test(tc, test_sequence_level);
    tcase_add_test(tc, test_kpop_phi);
    tcase_add_test(tc, test_kpop_clamps_and_nan);
    tcase_add_test(tc, test_weights_empty_and_masked);
    tcase_add_test(tc, test_metrics_rl_vector);
    tcase_add_test(tc, test_metrics_empty);
    tcase_add_test(tc, test_pcc_rule);
    tcase_add_test(tc, test_config_rules);
    tcase_add_test(tc, test_reinforce_finite_difference);
    suite_add_tcase(s, tc);
    return check_run(s);
}
