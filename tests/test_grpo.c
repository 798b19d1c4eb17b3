/*
** test_grpo.c — the GRPO objective against the test vectors of shared/spec/rl.md §1 (advantage
** edge cases, the clipped-surrogate table, the aggregation table), finite-difference checks of
** the token weights w = ∂loss/∂lp_new in every aggregation mode, and config errors; RLOO's
** advantages and GSPO's sequence-ratio loss against hand-computed vectors, GSPO's gradient by
** finite differences in double (one sequence) and through the batch loss (every mode).
*/
#include "grpo/grpo.h"
#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <string.h>

START_TEST(test_advantage_groups)
{
    /* group 7: rewards 1, 0, 1 ; group 3: 0.5, 0.5 (constant) ; group 9: 2 (singleton) */
    double r[6] = {1, 0.5, 0, 2, 1, 0.5}, a[6];
    int64_t g[6] = {7, 3, 7, 9, 7, 3};
    int keep[6];
    prl_grpo_adv_stats st;
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 6, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_STD, 1e-6, PRL_GRPO_SINGLETON_ZERO, &st),
                     PRL_OK);
    double mean = 2.0 / 3,
           sd = sqrt(((1 - mean) * (1 - mean) * 2 + mean * mean) / 2); /* unbiased */
    ck_assert_double_eq_tol(a[0], (1 - mean) / (sd + 1e-6), 1e-12);
    ck_assert_double_eq_tol(a[2], (0 - mean) / (sd + 1e-6), 1e-12);
    ck_assert(a[4] == a[0]);
    ck_assert(a[1] == 0 && a[5] == 0); /* a constant group: exactly 0 */
    ck_assert(a[3] == 0);              /* singleton, project default */
    ck_assert_int_eq(st.groups, 3);
    ck_assert_int_eq(st.singletons, 1);
    ck_assert_int_eq(st.constant_groups, 1);
    /* Dr.GRPO: no std */
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 6, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_NONE, 1e-6, PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_OK);
    ck_assert_double_eq_tol(a[0], 1 - mean, 1e-12);
    /* verl's singleton fallback: r / (1 + eps); drop mode clears keep */
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 6, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_STD, 1e-6, PRL_GRPO_SINGLETON_VERL, NULL),
                     PRL_OK);
    ck_assert_double_eq_tol(a[3], 2 / (1 + 1e-6), 1e-12);
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 6, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_STD, 1e-6, PRL_GRPO_SINGLETON_DROP, NULL),
                     PRL_OK);
    ck_assert(keep[3] == 0 && keep[0] == 1 && keep[1] == 1);
    /* a group of two uses n − 1 = 1 */
    double r2[2] = {1, 0}, a2[2];
    int64_t g2[2] = {1, 1};
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_STD, 1e-6, PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_OK);
    ck_assert_double_eq_tol(a2[0], 0.5 / (sqrt(0.5) + 1e-6), 1e-12);
    /* errors */
    r2[1] = NAN;
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_STD, 1e-6, PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "sample 1"));
    r2[1] = 0;
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_STD, 0, PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_ERR_ARG);
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_STD, 1e-6, PRL_GRPO_SINGLETON_DROP, NULL),
                     PRL_ERR_ARG);
}
END_TEST

/* rl.md §1.2: lp_new = log r, lp_old = 0; ε_l 0.2, ε_h 0.28, c 3 (and the symmetric 0.2). */
START_TEST(test_token_loss_vectors)
{
    static const struct {
        double r, A, L, sym;
    } v[] = {
        {1.50, +1, -1.28, -1.2}, {1.50, -1, +1.5, +1.5},  {0.50, +1, -0.5, -0.5},
        {0.50, -1, +0.8, +0.8},  {1.10, +1, -1.1, -1.1},  {4.00, -1, +3.0, +3.0},
        {1.25, +2, -2.5, -2.4},  {1.30, +2, -2.56, -2.4},
    };
    prl_grpo_loss_config c, sym;
    prl_grpo_loss_config_default(&c);
    sym = c;
    sym.clip_high = 0.2;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        ck_assert_double_eq_tol(prl_grpo_token_loss(log(v[i].r), 0, v[i].A, &c, NULL), v[i].L,
                                1e-9);
        ck_assert_double_eq_tol(prl_grpo_token_loss(log(v[i].r), 0, v[i].A, &sym, NULL), v[i].sym,
                                1e-9);
    }
}
END_TEST

/* rl.md §1.3 with token losses seq1 = [2, 2, 2] (same sum as the spec's [1, 2, 3], which the
** per-sequence advantage of GRPO cannot produce), seq2 = [10], H = 4: at r = 1 a token's loss
** is −A, so A = −2 and −10. The spec's results are unchanged: every mode sees only the sums. */
START_TEST(test_aggregation_vectors)
{
    static const double want[] = {4.0, 16.0, 6.0, 8.0, 2.0};
    enum { B = 2, T = 3 };
    float lp[B * T] = {0}, w[B * T];
    uint8_t mask[B * T] = {1, 1, 1, 1, 0, 0};
    double adv[B] = {-2, -10};
    for (int a = 0; a < 5; a++) {
        prl_grpo_loss_config c;
        prl_grpo_loss_config_default(&c);
        c.agg = (prl_grpo_agg)a;
        c.loss_scale_factor = 4;
        prl_grpo_loss_stats st;
        ck_assert_int_eq(prl_grpo_loss(&c, lp, lp, adv, mask, NULL, B, T, w, &st), PRL_OK);
        ck_assert_msg(fabs(st.loss - want[a]) < 1e-6, "%s: %g, want %g", prl_grpo_agg_name(c.agg),
                      st.loss, want[a]);
        ck_assert_int_eq(st.tokens, 4);
        ck_assert_int_eq(st.sequences, 2);
    }
}
END_TEST

/* The token weights of prl_grpo_loss under c against central differences of its loss (steps
** of 1e-3 on each loss token's lp_new, restored after); w is 0 off the mask. Returns the
** tokens checked and the unperturbed stats in *st. */
static int check_weights_fd(const prl_grpo_loss_config *c, float *lp_new, const float *lp_old,
                            const double *adv, const uint8_t *mask, const float *iw, int B, int T,
                            prl_grpo_loss_stats *st)
{
    float w[64], wtmp[64];
    ck_assert_int_le(B * T, 64);
    ck_assert_int_eq(prl_grpo_loss(c, lp_new, lp_old, adv, mask, iw, B, T, w, st), PRL_OK);
    int checked = 0;
    for (int i = 0; i < B * T; i++) {
        if (!mask[i]) {
            ck_assert(w[i] == 0);
            continue;
        }
        float saved = lp_new[i], h = 1e-3f;
        prl_grpo_loss_stats up, dn;
        lp_new[i] = saved + h;
        prl_grpo_loss(c, lp_new, lp_old, adv, mask, iw, B, T, wtmp, &up);
        lp_new[i] = saved - h;
        prl_grpo_loss(c, lp_new, lp_old, adv, mask, iw, B, T, wtmp, &dn);
        lp_new[i] = saved;
        double fd = (up.loss - dn.loss) / (2.0 * ((double)(saved + h) - saved));
        ck_assert_msg(fabs(fd - w[i]) < 2e-3 * (1 + fabs(fd)), "mode %s token %d: w %g vs fd %g",
                      prl_grpo_agg_name(c->agg), i, w[i], fd);
        checked++;
    }
    return checked;
}

/* w = ∂loss/∂lp_new by central differences in every mode, with mixed branches. */
START_TEST(test_token_weights_finite_difference)
{
    enum { B = 3, T = 5 };
    float lp_new[B * T], lp_old[B * T], iw[B * T];
    uint8_t mask[B * T];
    double adv[B] = {1.3, -0.7, 0.4};
    prl_rng r;
    prl_rng_init(&r, 3, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < B * T; i++) {
        lp_old[i] = (float)(-1 - prl_rng_uniform(&r));
        lp_new[i] = lp_old[i] + (float)(0.6 * (prl_rng_uniform(&r) - 0.5)); /* some clip */
        mask[i] = (uint8_t)(i % T != 0 && !(i / T == 2 && i % T == 4));
        iw[i] = (float)(0.5 + prl_rng_uniform(&r));
    }
    int checked = 0;
    for (int a = 0; a < 5; a++) {
        prl_grpo_loss_config c;
        prl_grpo_loss_config_default(&c);
        c.agg = (prl_grpo_agg)a;
        c.loss_scale_factor = 7;
        prl_grpo_loss_stats st;
        checked += check_weights_fd(&c, lp_new, lp_old, adv, mask, iw, B, T, &st);
        ck_assert(st.clipfrac > 0 && st.clipfrac < 1); /* both branches occur */
    }
    ck_assert_int_eq(checked, 5 * 11);
}
END_TEST

/* RLOO: A_i = r_i − mean_{j≠i} r_j. Group 5 = (1, 0, 0.5, 0), Σ = 1.5, k = 4:
** A = 1 − 0.5/3 = 5/6, 0 − 1.5/3 = −1/2, 0.5 − 1/3 = 1/6, −1/2 (= 4/3 · (r − 0.375));
** group 8 = (1, 1) is constant (exactly 0); group 2 = (0.25) is a singleton. With adv_norm
** std each is divided by the group's unbiased std + ε: sd² = (0.625² + 2·0.375² + 0.125²)/3
** = 0.6875/3, sd = 0.478713554, so 5/6 → 1.740772923. A pair (1, 0) gets (1, −1). */
START_TEST(test_advantage_rloo)
{
    double r[7] = {1, 1, 0, 0.5, 1, 0, 0.25}, a[7];
    int64_t g[7] = {5, 8, 5, 5, 8, 5, 2};
    int keep[7];
    prl_grpo_adv_stats st;
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 7, PRL_GRPO_BASELINE_RLOO,
                                         PRL_GRPO_NORM_NONE, 1e-6, PRL_GRPO_SINGLETON_ZERO, &st),
                     PRL_OK);
    ck_assert_double_eq_tol(a[0], 5.0 / 6, 1e-15);
    ck_assert_double_eq_tol(a[2], -0.5, 1e-15);
    ck_assert_double_eq_tol(a[3], 1.0 / 6, 1e-15);
    ck_assert_double_eq_tol(a[5], -0.5, 1e-15);
    ck_assert_double_eq_tol(a[0] + a[2] + a[3] + a[5], 0, 1e-15); /* a baseline, no bias */
    ck_assert(a[1] == 0 && a[4] == 0 && a[6] == 0);
    ck_assert_int_eq(st.groups, 3);
    ck_assert_int_eq(st.constant_groups, 1);
    ck_assert_int_eq(st.singletons, 1);
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 7, PRL_GRPO_BASELINE_RLOO,
                                         PRL_GRPO_NORM_STD, 1e-6, PRL_GRPO_SINGLETON_VERL, NULL),
                     PRL_OK);
    ck_assert_double_eq_tol(a[0], 1.7407729232009383, 1e-12);
    ck_assert_double_eq_tol(a[2], -0.5 / (0.47871355387816905 + 1e-6), 1e-12);
    ck_assert_double_eq_tol(a[6], 0.25 / (1 + 1e-6), 1e-15); /* verl's singleton rule */
    /* RLOO = k/(k − 1) · GRPO's difference, for every estimator pair of the same norm */
    double grpo[7];
    ck_assert_int_eq(prl_grpo_advantages(grpo, keep, r, g, 7, PRL_GRPO_BASELINE_GROUP,
                                         PRL_GRPO_NORM_STD, 1e-6, PRL_GRPO_SINGLETON_VERL, NULL),
                     PRL_OK);
    ck_assert_double_eq_tol(a[3], grpo[3] * 4 / 3, 1e-12);
    double r2[2] = {1, 0}, a2[2];
    int64_t g2[2] = {4, 4};
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_BASELINE_RLOO,
                                         PRL_GRPO_NORM_NONE, 1e-6, PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_OK);
    ck_assert(a2[0] == 1 && a2[1] == -1);
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, (prl_grpo_baseline)2,
                                         PRL_GRPO_NORM_NONE, 1e-6, PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "estimator 2"));
}
END_TEST

/* GSPO on a hand-computed pair (dyadic log-probs, exact in float). Sequence 0: three loss
** tokens with lp_new − lp_old = (0.125, −0.0625, 0.03125), log s0 = 0.03125,
** s0 = e^0.03125 = 1.0317434074991028; sequence 1: two loss tokens (after a masked position)
** with (−0.03125, −0.046875), log s1 = −0.0390625, s1 = 0.9616906016054253.
** seq-mean-token-mean (G = 2): token weights coef = 1/(2·|y_i|) times g.
**  (a) A = (1.5, −0.8), ε = (0.2, 0.28): both unclipped: ℓ0 = −1.5·s0, ℓ1 = 0.8·s1;
**      loss = (ℓ0 + ℓ1)/2 = −0.389131314982157; w0 = −1.5·s0/6 = −0.2579358518747757 on
**      each of the three tokens, w1 = 0.8·s1/4 = 0.19233812032108508 on each of the two.
**  (b) A = (1.5, 0.8), the paper's ε = (3e-4, 4e-4): s0 > 1.0004 with A > 0 is clipped
**      (ℓ0 = −1.5·1.0004, w0 = 0); s1 < 0.9997 with A > 0 is not (the min keeps −A·s1):
**      w1 = −0.8·s1/4 = −0.19233812032108508; loss = (−1.5006 − 0.8·s1)/2 =
**      −1.1349762362177889; clipfrac = 3/5 (the three tokens of sequence 0).
**  (c) the dual clip at sequence level: log s = 1.25 (s = 3.49) with A = −0.8: L1 = 2.79,
**      L2 = 0.8·1.28, L3 = 0.8·3 = 2.4 < max(L1, L2), so ℓ = 2.4 and no gradient.
** The token ratio (GRPO) on (a)'s data gives other weights: token 0 of sequence 0 has
** r = e^0.125, so w = −1.5·e^0.125/5 under token-mean, not the sequence's −1.5·s0/5. */
START_TEST(test_gspo_vectors)
{
    enum { B = 2, T = 4 };
    float lp_old[B * T] = {-1, -2, -0.5, -3, -1, -0.25, -1.5, -2};
    float d[B * T] = {0.125f, -0.0625f, 0.03125f, 0, 0, -0.03125f, -0.046875f, 0};
    float lp_new[B * T], w[B * T];
    for (int i = 0; i < B * T; i++) lp_new[i] = lp_old[i] + d[i];
    uint8_t mask[B * T] = {1, 1, 1, 0, 0, 1, 1, 0};
    double s0 = 1.0317434074991028, s1 = 0.9616906016054253;
    prl_grpo_loss_config c;
    prl_grpo_loss_config_default(&c);
    c.ratio = PRL_GRPO_RATIO_SEQUENCE;
    c.agg = PRL_GRPO_AGG_SEQ_MEAN_TOKEN_MEAN;
    prl_grpo_loss_stats st;
    double adv_a[B] = {1.5, -0.8};
    ck_assert_int_eq(prl_grpo_loss(&c, lp_new, lp_old, adv_a, mask, NULL, B, T, w, &st), PRL_OK);
    ck_assert_double_eq_tol(st.loss, -0.389131314982157, 1e-8);
    for (int t = 0; t < 3; t++) ck_assert_double_eq_tol(w[t], -1.5 * s0 / 6, 1e-7);
    ck_assert_double_eq_tol(w[5], 0.8 * s1 / 4, 1e-7);
    ck_assert_double_eq_tol(w[6], 0.8 * s1 / 4, 1e-7);
    ck_assert(w[3] == 0 && w[4] == 0 && w[7] == 0);
    ck_assert(st.clipfrac == 0);
    c.clip_low = 3e-4, c.clip_high = 4e-4;
    double adv_b[B] = {1.5, 0.8};
    ck_assert_int_eq(prl_grpo_loss(&c, lp_new, lp_old, adv_b, mask, NULL, B, T, w, &st), PRL_OK);
    ck_assert_double_eq_tol(st.loss, -1.1349762362177889, 1e-8);
    ck_assert(w[0] == 0 && w[1] == 0 && w[2] == 0);
    ck_assert_double_eq_tol(w[5], -0.8 * s1 / 4, 1e-7);
    ck_assert_double_eq_tol(st.clipfrac, 0.6, 1e-15);
    /* (c) through the one-sequence function, in double */
    prl_grpo_loss_config_default(&c);
    c.ratio = PRL_GRPO_RATIO_SEQUENCE;
    double n2[2] = {-0.5, -1}, o2[2] = {-1.75, -2.25}, g2[2]; /* log-ratios 1.25, 1.25 */
    ck_assert_double_eq_tol(prl_grpo_gspo_seq_loss(n2, o2, 2, -0.8, &c, g2), 2.4, 1e-12);
    ck_assert(g2[0] == 0 && g2[1] == 0);
    c.clip_c = 0; /* no dual clip: the ratio branch L1 = 0.8·e^1.25 with gradient 0.8·s/2 */
    ck_assert_double_eq_tol(prl_grpo_gspo_seq_loss(n2, o2, 2, -0.8, &c, g2),
                            0.8 * 3.4903429574618414, 1e-12);
    ck_assert_double_eq_tol(g2[0], 0.4 * 3.4903429574618414, 1e-12);
    /* the token ratio differs on (a)'s data */
    prl_grpo_loss_config_default(&c);
    ck_assert_int_eq(prl_grpo_loss(&c, lp_new, lp_old, adv_a, mask, NULL, B, T, w, &st), PRL_OK);
    ck_assert_double_eq_tol(w[0], -1.5 * exp(0.125) / 5, 1e-7);
}
END_TEST

/* On-policy (lp_new = lp_old) s = 1 and r = 1: GSPO's weights are GRPO's, bitwise, in every
** mode, per-token advantages included (a GSPO run with one update a step trains as GRPO). */
START_TEST(test_gspo_on_policy_is_grpo)
{
    enum { B = 3, T = 5 };
    float lp[B * T], adv_tok[B * T], wg[B * T], ws[B * T];
    uint8_t mask[B * T];
    double adv[B] = {0.9, -1.1, 0.3};
    for (int i = 0; i < B * T; i++) {
        lp[i] = -0.1f * (float)(1 + i % 7);
        adv_tok[i] = 0.01f * (float)(i % 4) - 0.015f;
        mask[i] = (uint8_t)(i % 5 != 1);
    }
    for (int a = 0; a < 5; a++) {
        prl_grpo_loss_config c;
        prl_grpo_loss_config_default(&c);
        c.agg = (prl_grpo_agg)a;
        c.loss_scale_factor = 3;
        prl_grpo_loss_stats sg, ss;
        ck_assert_int_eq(
            prl_grpo_loss_partial_tok(&c, lp, lp, adv, adv_tok, mask, NULL, B, T, 12, 3, wg, &sg),
            PRL_OK);
        c.ratio = PRL_GRPO_RATIO_SEQUENCE;
        ck_assert_int_eq(
            prl_grpo_loss_partial_tok(&c, lp, lp, adv, adv_tok, mask, NULL, B, T, 12, 3, ws, &ss),
            PRL_OK);
        ck_assert_mem_eq(wg, ws, sizeof wg);
        ck_assert(sg.loss == ss.loss);
    }
}
END_TEST

/* GSPO's gradient in double: central differences of prl_grpo_gspo_seq_loss on random
** sequences, both advantage signs, with the ratio inside and outside the clip band (the
** clipped branch must have gradient 0: a wrong branch fails by |A·s/n| ≈ 0.1). */
START_TEST(test_gspo_finite_difference_double)
{
    enum { N = 6 };
    prl_rng r;
    prl_rng_init(&r, 11, 0, 0, 0, PRL_RNG_TEST);
    prl_grpo_loss_config c;
    prl_grpo_loss_config_default(&c);
    c.ratio = PRL_GRPO_RATIO_SEQUENCE;
    c.clip_low = 0.02, c.clip_high = 0.03;
    int clipped = 0, open = 0;
    for (int trial = 0; trial < 40; trial++) {
        double lp_new[N], lp_old[N], g[N];
        int n = 1 + trial % N;
        double A = trial % 2 ? 0.7 + prl_rng_uniform(&r) : -0.7 - prl_rng_uniform(&r);
        for (int t = 0; t < n; t++) {
            lp_old[t] = -0.2 - 2 * prl_rng_uniform(&r);
            lp_new[t] = lp_old[t] + 0.12 * (prl_rng_uniform(&r) - 0.5);
        }
        prl_grpo_gspo_seq_loss(lp_new, lp_old, n, A, &c, g);
        *(g[0] == 0 ? &clipped : &open) += 1;
        for (int t = 0; t < n; t++) {
            double saved = lp_new[t], h = 1e-6;
            lp_new[t] = saved + h;
            double up = prl_grpo_gspo_seq_loss(lp_new, lp_old, n, A, &c, NULL);
            lp_new[t] = saved - h;
            double dn = prl_grpo_gspo_seq_loss(lp_new, lp_old, n, A, &c, NULL);
            lp_new[t] = saved;
            double fd = (up - dn) / (2 * h);
            ck_assert_msg(fabs(fd - g[t]) < 1e-7, "trial %d token %d: g %.12g fd %.12g", trial, t,
                          g[t], fd);
        }
    }
    ck_assert(clipped > 4 && open > 4); /* both branches checked */
}
END_TEST

/* The batch loss under GSPO: w = ∂loss/∂lp_new by central differences in every mode, with
** per-sequence IS weights (constant along a sequence, so w is the exact gradient). */
START_TEST(test_gspo_weights_finite_difference)
{
    enum { B = 6, T = 5 };
    float lp_new[B * T], lp_old[B * T], iw[B * T];
    uint8_t mask[B * T];
    double adv[B] = {1.3, -0.7, 0.4, -1.2, 0.8, -0.5};
    prl_rng r;
    prl_rng_init(&r, 5, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < B * T; i++) {
        lp_old[i] = (float)(-1 - prl_rng_uniform(&r));
        lp_new[i] = lp_old[i] + (float)(0.3 * (prl_rng_uniform(&r) - 0.5));
        mask[i] = (uint8_t)(i % T != 0 && !(i / T == 2 && i % T == 4));
        iw[i] = (float)(0.5 + 0.1 * (i / T));
    }
    int checked = 0;
    for (int a = 0; a < 5; a++) {
        prl_grpo_loss_config c;
        prl_grpo_loss_config_default(&c);
        c.ratio = PRL_GRPO_RATIO_SEQUENCE;
        c.clip_low = 0.03, c.clip_high = 0.05; /* no log s within 2.5e-4 (h/k) of a bound */
        c.agg = (prl_grpo_agg)a;
        c.loss_scale_factor = 7;
        prl_grpo_loss_stats st;
        checked += check_weights_fd(&c, lp_new, lp_old, adv, mask, iw, B, T, &st);
        ck_assert_msg(st.clipfrac > 0 && st.clipfrac < 1, "clipfrac %g", st.clipfrac);
    }
    ck_assert_int_eq(checked, 5 * (B * (T - 1) - 1));
}
END_TEST

START_TEST(test_config_errors)
{
    prl_grpo_loss_config c;
    prl_grpo_loss_config_default(&c);
    ck_assert_int_eq(prl_grpo_loss_config_check(&c), PRL_OK);
    c.clip_low = -0.1;
    ck_assert_int_eq(prl_grpo_loss_config_check(&c), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "clip_low -0.1"));
    prl_grpo_loss_config_default(&c);
    c.clip_c = 0.5;
    ck_assert_int_eq(prl_grpo_loss_config_check(&c), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "clip_c 0.5"));
    prl_grpo_loss_config_default(&c);
    c.agg = PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM_NORM;
    ck_assert_int_eq(prl_grpo_loss_config_check(&c), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "loss_scale_factor"));
    prl_grpo_agg a;
    ck_assert_int_eq(prl_grpo_agg_parse("seq-mean-token-sum-norm", &a), PRL_OK);
    ck_assert_int_eq(a, PRL_GRPO_AGG_SEQ_MEAN_TOKEN_SUM_NORM);
    ck_assert_int_eq(prl_grpo_agg_parse("token-avg", &a), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "unknown loss aggregation 'token-avg'"));
    prl_grpo_loss_config_default(&c);
    c.ratio = PRL_GRPO_RATIO_SEQUENCE, c.kind = PRL_GRPO_LOSS_REINFORCE;
    ck_assert_int_eq(prl_grpo_loss_config_check(&c), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "gspo"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grpo");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_advantage_groups);
    tcase_add_test(tc, test_token_loss_vectors);
    tcase_add_test(tc, test_aggregation_vectors);
    tcase_add_test(tc, test_token_weights_finite_difference);
    tcase_add_test(tc, test_advantage_rloo);
    tcase_add_test(tc, test_gspo_vectors);
    tcase_add_test(tc, test_gspo_on_policy_is_grpo);
    tcase_add_test(tc, test_gspo_finite_difference_double);
    tcase_add_test(tc, test_gspo_weights_finite_difference);
    tcase_add_test(tc, test_config_errors);
    suite_add_tcase(s, tc);
    return check_run(s);
}
