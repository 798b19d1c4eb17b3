/*
** test_grpo.c — the GRPO objective against the test vectors of shared/spec/rl.md §1 (advantage
** edge cases, the clipped-surrogate table, the aggregation table), finite-difference checks of
** the token weights w = ∂loss/∂lp_new in every aggregation mode, and config errors.
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
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 6, PRL_GRPO_NORM_STD, 1e-6,
                                         PRL_GRPO_SINGLETON_ZERO, &st),
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
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 6, PRL_GRPO_NORM_NONE, 1e-6,
                                         PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_OK);
    ck_assert_double_eq_tol(a[0], 1 - mean, 1e-12);
    /* verl's singleton fallback: r / (1 + eps); drop mode clears keep */
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 6, PRL_GRPO_NORM_STD, 1e-6,
                                         PRL_GRPO_SINGLETON_VERL, NULL),
                     PRL_OK);
    ck_assert_double_eq_tol(a[3], 2 / (1 + 1e-6), 1e-12);
    ck_assert_int_eq(prl_grpo_advantages(a, keep, r, g, 6, PRL_GRPO_NORM_STD, 1e-6,
                                         PRL_GRPO_SINGLETON_DROP, NULL),
                     PRL_OK);
    ck_assert(keep[3] == 0 && keep[0] == 1 && keep[1] == 1);
    /* a group of two uses n − 1 = 1 */
    double r2[2] = {1, 0}, a2[2];
    int64_t g2[2] = {1, 1};
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_NORM_STD, 1e-6,
                                         PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_OK);
    ck_assert_double_eq_tol(a2[0], 0.5 / (sqrt(0.5) + 1e-6), 1e-12);
    /* errors */
    r2[1] = NAN;
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_NORM_STD, 1e-6,
                                         PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "sample 1"));
    r2[1] = 0;
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_NORM_STD, 0,
                                         PRL_GRPO_SINGLETON_ZERO, NULL),
                     PRL_ERR_ARG);
    ck_assert_int_eq(prl_grpo_advantages(a2, NULL, r2, g2, 2, PRL_GRPO_NORM_STD, 1e-6,
                                         PRL_GRPO_SINGLETON_DROP, NULL),
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

/* w = ∂loss/∂lp_new by central differences in every mode, with mixed branches. */
START_TEST(test_token_weights_finite_difference)
{
    enum { B = 3, T = 5 };
    float lp_new[B * T], lp_old[B * T], w[B * T], iw[B * T];
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
        ck_assert_int_eq(prl_grpo_loss(&c, lp_new, lp_old, adv, mask, iw, B, T, w, &st), PRL_OK);
        for (int i = 0; i < B * T; i++) {
            if (!mask[i]) {
                ck_assert(w[i] == 0);
                continue;
            }
            float saved = lp_new[i], h = 1e-3f;
            prl_grpo_loss_stats up, dn;
            float wtmp[B * T];
            lp_new[i] = saved + h;
            prl_grpo_loss(&c, lp_new, lp_old, adv, mask, iw, B, T, wtmp, &up);
            lp_new[i] = saved - h;
            prl_grpo_loss(&c, lp_new, lp_old, adv, mask, iw, B, T, wtmp, &dn);
            lp_new[i] = saved;
            double fd = (up.loss - dn.loss) / (2.0 * ((double)(saved + h) - saved));
            ck_assert_msg(fabs(fd - w[i]) < 2e-3 * (1 + fabs(fd)),
                          "mode %s token %d: w %g vs fd %g", prl_grpo_agg_name(c.agg), i, w[i], fd);
            checked++;
        }
        ck_assert(st.clipfrac > 0 && st.clipfrac < 1); /* both branches occur */
    }
    ck_assert_int_eq(checked, 5 * 11);
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
    tcase_add_test(tc, test_config_errors);
    suite_add_tcase(s, tc);
    return check_run(s);
}
