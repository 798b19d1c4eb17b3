/*
** test_opd.c — on-policy distillation (opd/): the per-token advantage against the test vector
** of shared/spec/rl.md §5.6 and hand-computed vectors (clip, discount, near-zero mask and their
** order, observation tokens, per-teacher stats, errors), the per-token token weights of the
** shared GRPO loss by central finite differences (mixed signs within one sequence, with IS
** weights), the teacher frames of `train` and the `teach` item through the wire codec (and
** their errors), the teacher's scoring pass against the train path, and the OPD step on the
** micro model (a teacher equal to the student moves nothing; a teacher that prefers the
** sampled tokens raises their probability, one that dislikes them lowers it).
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "opd/opd.h"

#include "tests/msg_util.h"
#include "job/job.h"
#include "tests/check_util.h"
#include "tests/grpo_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ advantages ------ */

/* rl.md §5.6: p_S = [0.5, 0.9, 0.01, 0.3], p_T = [0.6, 0.9, 0.5, 1e-4], one sequence of four
** loss tokens: its advantages under `c` into adv[4]. */
static void spec_advantages(const prl_opd_config *c, float *adv, prl_opd_stats *st)
{
    const double ps[4] = {0.5, 0.9, 0.01, 0.3}, pt[4] = {0.6, 0.9, 0.5, 1e-4};
    float lp_s[4], lp_t[4];
    for (int i = 0; i < 4; i++) lp_s[i] = (float)log(ps[i]), lp_t[i] = (float)log(pt[i]);
    const uint8_t mask[4] = {1, 1, 1, 1};
    const int32_t start[2] = {0, 4};
    assert_ok(prl_opd_advantages(c, lp_s, lp_t, mask, start, 1, NULL, adv, st));
}

START_TEST(test_spec_vector)
{
    float adv[4];
    prl_opd_config c;
    prl_opd_config_default(&c);
    prl_opd_stats st;
    spec_advantages(&c, adv, &st);
    const double raw[4] = {0.182322, 0.000000, 3.912023, -8.006368};
    for (int i = 0; i < 4; i++) ck_assert_double_eq_tol(adv[i], raw[i], 2e-6);
    ck_assert_double_eq_tol(st.teacher_kl, 0.978006, 2e-6);
    ck_assert_int_eq(st.tokens, 4);
    ck_assert(st.masked_frac == 0 && st.clipped_frac == 0);
    /* clipped to [−5, 5] */
    c.clip = 1;
    spec_advantages(&c, adv, &st);
    const double clipped[4] = {0.182322, 0.000000, 3.912023, -5.000000};
    for (int i = 0; i < 4; i++) ck_assert_double_eq_tol(adv[i], clipped[i], 2e-6);
    ck_assert_double_eq_tol(st.clipped_frac, 0.25, 1e-12);
    ck_assert_double_eq_tol(st.teacher_kl, 0.978006, 2e-6); /* the KL is of the raw log-probs */
    /* discounted, γ = 0.5, unclipped */
    c.clip = 0, c.discount = 0.5;
    spec_advantages(&c, adv, &st);
    const double disc[4] = {0.159531, -0.045580, -0.091161, -8.006368};
    for (int i = 0; i < 4; i++) ck_assert_double_eq_tol(adv[i], disc[i], 2e-6);
    /* discounted then clipped (clipping comes after discounting): only the last one moves */
    c.clip = 1;
    spec_advantages(&c, adv, &st);
    ck_assert_double_eq_tol(adv[2], -0.091161, 2e-6);
    ck_assert_double_eq_tol(adv[3], -5.0, 1e-6);
    /* coef 2 doubles every advantage, not the KL */
    c = (prl_opd_config){.coef = 2};
    spec_advantages(&c, adv, &st);
    ck_assert_double_eq_tol(adv[2], 2 * 3.912023, 4e-6);
    ck_assert_double_eq_tol(st.teacher_kl, 0.978006, 2e-6);
}
END_TEST

/* The near-zero mask acts after the clip: δ = 0.2 masks 0.182322 and 0 (2 of 4); with the
** clip at [−0.1, 0.1] (three of four clipped) every |A| is at most 0.1 < 0.15 = δ, so all
** four are masked. */
START_TEST(test_mask_after_clip)
{
    float adv[4];
    prl_opd_config c;
    prl_opd_config_default(&c);
    c.mask_eps = 0.2;
    prl_opd_stats st;
    spec_advantages(&c, adv, &st);
    ck_assert(adv[0] == 0 && adv[1] == 0);
    ck_assert_double_eq_tol(adv[2], 3.912023, 2e-6);
    ck_assert_double_eq_tol(st.masked_frac, 0.5, 1e-12);
    c.clip = 1, c.clip_low = -0.1, c.clip_high = 0.1, c.mask_eps = 0.15;
    spec_advantages(&c, adv, &st);
    for (int i = 0; i < 4; i++) ck_assert(adv[i] == 0);
    ck_assert_double_eq_tol(st.masked_frac, 1.0, 1e-12);
    ck_assert_double_eq_tol(st.clipped_frac, 0.75, 1e-12); /* 0.18, 3.91 and −8.0 were clipped */
}
END_TEST

/* Observation tokens (mask 0) get 0 and pass no credit; sequences are independent; stats per
** teacher. Sequence 0 (teacher 1): d = [1, (obs), −2], γ = 0.5 → [1 − 1, 0, −2] = [0, 0, −2];
** sequence 1 (teacher 3): d = [0.5, 0.5] → [0.75, 0.5]. lp_S = −1 everywhere, lp_T = −1 + d. */
START_TEST(test_observation_tokens_and_teachers)
{
    float lp_s[5] = {-1, -1, -1, -1, -1}, lp_t[5] = {0, NAN, -3, -0.5f, -0.5f}, adv[5];
    uint8_t mask[5] = {1, 0, 1, 1, 1};
    int32_t start[3] = {0, 3, 5}, teacher[2] = {1, 3};
    prl_opd_config c;
    prl_opd_config_default(&c);
    c.discount = 0.5;
    prl_opd_stats st;
    assert_ok(prl_opd_advantages(&c, lp_s, lp_t, mask, start, 2, teacher, adv, &st));
    const double want[5] = {0, 0, -2, 0.75, 0.5};
    for (int i = 0; i < 5; i++) ck_assert_double_eq_tol(adv[i], want[i], 1e-6);
    ck_assert_int_eq(st.tokens, 4);
    ck_assert_int_eq(st.samples[1], 1);
    ck_assert_int_eq(st.samples[3], 1);
    ck_assert_int_eq(st.samples[0] + st.samples[2], 0);
    ck_assert_int_eq(st.teacher_tokens[1], 2);
    ck_assert_int_eq(st.teacher_tokens[3], 2);
    ck_assert_double_eq_tol(st.kl[1], (-1 + 2) / 2.0, 1e-6); /* mean of lp_S − lp_T */
    ck_assert_double_eq_tol(st.kl[3], -0.5, 1e-6);
    ck_assert(isnan(st.kl[0]));
    ck_assert_double_eq_tol(st.teacher_kl, (-1 + 2 - 0.5 - 0.5) / 4.0, 1e-6);
    ck_assert_double_eq_tol(st.adv_min, -2, 1e-6);
    ck_assert_double_eq_tol(st.adv_max, 0.75, 1e-6);
    /* the JSON keys */
    json_t *o = json_object();
    prl_opd_stats_json(o, &st);
    ck_assert(json_integer_value(
                  json_object_get(json_object_get(o, "opd_teacher_samples"), "coding")) == 1);
    ck_assert(
        json_is_number(json_object_get(json_object_get(o, "opd_teacher_kl_by"), "reasoning")));
    ck_assert(json_is_number(json_object_get(o, "opd_teacher_kl")));
    ck_assert(json_is_number(json_object_get(o, "opd_masked_frac")));
    json_decref(o);
    /* teacher_coef scales its teacher's sequences before discounting and clipping: coding
    ** (sequence 0) ×3 → [3 − 3, 0, −6]; reasoning (sequence 1) ×0 → 0; the KL is unscaled */
    c.teacher_coef[1] = 3, c.teacher_coef[3] = 0;
    assert_ok(prl_opd_advantages(&c, lp_s, lp_t, mask, start, 2, teacher, adv, &st));
    const double scaled[5] = {0, 0, -6, 0, 0};
    for (int i = 0; i < 5; i++) ck_assert_double_eq_tol(adv[i], scaled[i], 1e-6);
    ck_assert_double_eq_tol(st.kl[1], 0.5, 1e-6);
    /* without teacher indices there is no per-teacher coef: coef alone */
    assert_ok(prl_opd_advantages(&c, lp_s, lp_t, mask, start, 2, NULL, adv, &st));
    for (int i = 0; i < 5; i++) ck_assert_double_eq_tol(adv[i], want[i], 1e-6);
}
END_TEST

START_TEST(test_errors)
{
    float lp_s[2] = {-1, NAN}, lp_t[2] = {-1, -1}, adv[2];
    uint8_t mask[2] = {1, 1};
    int32_t start[2] = {0, 2}, teacher[1] = {7};
    prl_opd_config c;
    prl_opd_config_default(&c);
    ck_assert_int_eq(prl_opd_advantages(&c, lp_s, lp_t, mask, start, 1, NULL, adv, NULL),
                     PRL_ERR_ARG);
    assert_msg_has("sequence 0 token 1");
    mask[1] = 0; /* off the mask a NaN does not matter */
    assert_ok(prl_opd_advantages(&c, lp_s, lp_t, mask, start, 1, NULL, adv, NULL));
    ck_assert(adv[1] == 0);
    ck_assert_int_eq(prl_opd_advantages(&c, lp_s, lp_t, mask, start, 1, teacher, adv, NULL),
                     PRL_ERR_ARG);
    assert_msg_has("teacher 7");
    c.discount = 1;
    ck_assert_int_eq(prl_opd_config_check(&c), PRL_ERR_CONFIG);
    assert_msg_has("opd.discount");
    prl_opd_config_default(&c);
    c.clip = 1, c.clip_low = 1, c.clip_high = -1;
    ck_assert_int_eq(prl_opd_config_check(&c), PRL_ERR_CONFIG);
    assert_msg_has("opd.adv_clip_low");
    prl_opd_config_default(&c);
    c.mask_eps = -1;
    ck_assert_int_eq(prl_opd_config_check(&c), PRL_ERR_CONFIG);
    assert_msg_has("opd.adv_mask_eps");
    prl_opd_config_default(&c);
    c.teacher_coef[2] = -1;
    ck_assert_int_eq(prl_opd_config_check(&c), PRL_ERR_CONFIG);
    assert_msg_has("opd.teacher_coef.general");
    ck_assert_int_eq(prl_opd_teacher_index("coding"), 1);
    ck_assert_int_eq(prl_opd_teacher_index("chess"), -1);
    ck_assert_str_eq(prl_opd_teacher_key(3), "reasoning");
}
END_TEST

/* ------------------------------------------------------------------ the token loss -- */

/* w = ∂loss/∂lp_new of the per-token advantage loss by central differences: advantages of both
** signs within one sequence, a sequence advantage added, IS weights, every aggregation mode,
** both clip branches. With adv_tok NULL it is the sequence loss, bitwise. */
START_TEST(test_token_advantage_weights)
{
    enum { B = 3, T = 5 };
    float lp_new[B * T], lp_old[B * T], w[B * T], w2[B * T], iw[B * T], at[B * T];
    uint8_t mask[B * T];
    double adv[B] = {0.5, 0, -0.25}, zero[B] = {0, 0, 0};
    prl_rng r;
    prl_rng_init(&r, 5, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < B * T; i++) {
        lp_old[i] = (float)(-1 - prl_rng_uniform(&r));
        lp_new[i] = lp_old[i] + (float)(0.6 * (prl_rng_uniform(&r) - 0.5));
        mask[i] = (uint8_t)(i % T != 0);
        iw[i] = (float)(0.5 + prl_rng_uniform(&r));
        at[i] = (float)(2 * (prl_rng_uniform(&r) - 0.5)); /* mixed signs per sequence */
    }
    int checked = 0, kinks = 0;
    for (int a = 0; a < 5; a++) {
        prl_grpo_loss_config c;
        prl_grpo_loss_config_default(&c);
        c.agg = (prl_grpo_agg)a;
        c.loss_scale_factor = 7;
        prl_grpo_loss_stats st;
        assert_ok(
            prl_grpo_loss_partial_tok(&c, lp_new, lp_old, adv, at, mask, iw, B, T, 12, 3, w, &st));
        for (int i = 0; i < B * T; i++) {
            if (!mask[i]) {
                ck_assert(w[i] == 0);
                continue;
            }
            float saved = lp_new[i], h = 1e-3f;
            double lr = (double)lp_new[i] - lp_old[i];
            if (fabs(lr - log(1 - c.clip_low)) < 4 * h || fabs(lr - log(1 + c.clip_high)) < 4 * h) {
                kinks++; /* the surrogate has a kink there: no derivative to compare */
                continue;
            }
            prl_grpo_loss_stats up, dn;
            lp_new[i] = saved + h;
            prl_grpo_loss_partial_tok(&c, lp_new, lp_old, adv, at, mask, iw, B, T, 12, 3, w2, &up);
            lp_new[i] = saved - h;
            prl_grpo_loss_partial_tok(&c, lp_new, lp_old, adv, at, mask, iw, B, T, 12, 3, w2, &dn);
            lp_new[i] = saved;
            double fd = (up.loss - dn.loss) / (2.0 * ((double)(saved + h) - saved));
            ck_assert_msg(fabs(fd - w[i]) < 2e-3 * (1 + fabs(fd)),
                          "mode %d token %d: w %g vs fd %g "
                          "(log-ratio %g, A %g)",
                          a, i, w[i], fd, lp_new[i] - lp_old[i], adv[i / T] + at[i]);
            checked++;
        }
        ck_assert(st.clipfrac > 0 && st.clipfrac < 1);
    }
    ck_assert_int_eq(checked + kinks, 5 * 12);
    ck_assert_int_le(kinks, 10); /* two tokens of this draw sit within 4h of a clip kink */
    /* a per-token advantage constant over a sequence is the sequence advantage, bitwise */
    prl_grpo_loss_config c;
    prl_grpo_loss_config_default(&c);
    for (int i = 0; i < B * T; i++) at[i] = (float)adv[i / T];
    float adv_f[B];
    for (int b = 0; b < B; b++) adv_f[b] = (float)adv[b], adv[b] = adv_f[b];
    assert_ok(
        prl_grpo_loss_partial_tok(&c, lp_new, lp_old, zero, at, mask, iw, B, T, 12, 3, w, NULL));
    assert_ok(prl_grpo_loss_partial(&c, lp_new, lp_old, adv, mask, iw, B, T, 12, 3, w2, NULL));
    ck_assert(!memcmp(w, w2, sizeof w));
}
END_TEST

/* The OPD token weight with truncated IS against the rollout (decoupled TIS, cap 2), by hand.
** Three loss tokens of one sequence, lp_new = lp_old = −1 (ratio 1, first update):
**   lp_S (rollout) = [−1.5, −2, −1],  lp_T = [−1, −3, −1]
**   A   = lp_T − lp_S           = [0.5, −1, 0]
**   ρ   = exp(lp_old − lp_S)    = [e^0.5, e^1, 1] = [1.648721, 2.718282, 1]
**   w   = min(ρ, 2)             = [1.648721, 2, 1]
**   ∂L/∂lp_new = −A·w·r / N (token-mean, N = 3) = [−0.274787, 0.666667, 0]
** and the IcePop band [0.5, 1.8] masks the second token instead: weight 0. */
START_TEST(test_is_correction)
{
    float lp_s[3] = {-1.5f, -2, -1}, lp_t[3] = {-1, -3, -1}, lp_old[3] = {-1, -1, -1};
    float adv[3], iw[3], w[3];
    uint8_t mask[3] = {1, 1, 1};
    int32_t start[2] = {0, 3};
    double zero[1] = {0};
    prl_opd_config oc;
    prl_opd_config_default(&oc);
    assert_ok(prl_opd_advantages(&oc, lp_s, lp_t, mask, start, 1, NULL, adv, NULL));
    prl_grpo_corr_config cc;
    prl_grpo_corr_config_default(&cc);
    cc.kind = PRL_GRPO_CORR_TIS;
    assert_ok(prl_grpo_corr_weights(&cc, &cc.loose, lp_old, lp_s, mask, start, 1, iw, NULL, NULL));
    ck_assert_double_eq_tol(iw[0], 1.648721, 1e-6);
    ck_assert_double_eq_tol(iw[1], 2.0, 1e-6);
    prl_grpo_loss_config lc;
    prl_grpo_loss_config_default(&lc);
    assert_ok(
        prl_grpo_loss_partial_tok(&lc, lp_old, lp_old, zero, adv, mask, iw, 1, 3, 3, 1, w, NULL));
    ck_assert_double_eq_tol(w[0], -0.274787, 1e-6);
    ck_assert_double_eq_tol(w[1], 0.666667, 1e-6);
    ck_assert(w[2] == 0);
    cc.kind = PRL_GRPO_CORR_ICEPOP, cc.loose.icepop_high = 1.8;
    assert_ok(prl_grpo_corr_weights(&cc, &cc.loose, lp_old, lp_s, mask, start, 1, iw, NULL, NULL));
    assert_ok(
        prl_grpo_loss_partial_tok(&lc, lp_old, lp_old, zero, adv, mask, iw, 1, 3, 3, 1, w, NULL));
    ck_assert_double_eq_tol(w[0], -0.274787, 1e-6);
    ck_assert(w[1] == 0);
}
END_TEST

/* ------------------------------------------------------------------ frames ---------- */

/* Two samples: prompt 2 + response 3, prompt 1 + response 2; sample 1's first response token
** is an observation (mask 0). */
static void small_batch(prl_grpo_batch *b)
{
    assert_ok(prl_grpo_batch_init(b, 2, 8, 5));
    const int32_t tok[8] = {5, 6, 7, 8, 9, 10, 11, 12}, off[3] = {0, 5, 8}, pl[2] = {2, 1};
    const uint8_t mask[5] = {1, 1, 1, 0, 1};
    memcpy(b->tokens, tok, sizeof tok), memcpy(b->offsets, off, sizeof off);
    memcpy(b->prompt_lens, pl, sizeof pl), memcpy(b->mask, mask, sizeof mask);
    for (int i = 0; i < 5; i++) b->logprobs[i] = -1;
    assert_ok(prl_grpo_batch_check(b));
}

/* Encode and decode m through the wire codec into *out. */
static void wire(prl_bus_msg *m, prl_bus_msg *out)
{
    prl_bus_wire w;
    char why[256];
    assert_ok(prl_bus_encode(m, &w));
    ck_assert_int_eq(prl_bus_decode(prl_msg_registry(), w.parts, w.n, out, why, sizeof why),
                     PRL_OK);
    prl_bus_wire_free(&w);
}

START_TEST(test_train_frames)
{
    prl_grpo_batch b;
    small_batch(&b);
    prl_opd_batch ob, back;
    assert_ok(prl_opd_batch_init(&ob, 2, 5, 0));
    const float tl[5] = {-0.5f, -1, -2, NAN, -0.25f}; /* NaN on the observation: ignored */
    memcpy(ob.teacher_lp, tl, sizeof tl);
    ob.teacher[0] = 3, ob.teacher[1] = 0;
    prl_bus_msg m, d;
    assert_ok(train_to_msg(&b, &ob, &m));
    wire(&m, &d);
    assert_ok(train_teachers_from_msg(&back, &d, 0));
    ck_assert(!memcmp(back.teacher, ob.teacher, 2 * sizeof *ob.teacher));
    ck_assert(back.teacher_lp[2] == -2 && back.teacher_lp[4] == -0.25f);
    prl_opd_batch_free(&back);
    prl_bus_msg_free(&d), prl_bus_msg_free(&m);
    /* errors name the frame and the sample */
    struct {
        const char *want;
        int case_;
    } bad[] = {
        {"frame 'teachers': sample 1 has teacher 4", 0},
        {"frame 'teacher_logprobs': sample 0 response token 1 has log-prob 0.5", 1},
        {"frame 'teachers' is missing", 2},
        {"frame 'teacher_logprobs' has 4 elements, expected 5", 3},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        prl_opd_batch x;
        assert_ok(prl_opd_batch_init(&x, 2, 5, 0));
        memcpy(x.teacher_lp, tl, sizeof tl),
            memcpy(x.teacher, ob.teacher, sizeof ob.teacher[0] * 2);
        if (bad[k].case_ == 0) x.teacher[1] = 4;
        if (bad[k].case_ == 1) x.teacher_lp[1] = 0.5f;
        assert_ok(train_to_msg(&b, NULL, &m));
        if (bad[k].case_ == 2)
            prl_bus_msg_add_frame(&m, "teacher_logprobs", PRL_BUS_F32, x.teacher_lp, 5);
        else if (bad[k].case_ == 3) {
            prl_bus_msg_add_frame(&m, "teacher_logprobs", PRL_BUS_F32, x.teacher_lp, 4);
            prl_bus_msg_add_frame(&m, "teachers", PRL_BUS_I32, x.teacher, 2);
        } else add_teacher_frames(&m, &x);
        wire(&m, &d);
        ck_assert_int_eq(train_teachers_from_msg(&back, &d, 0), PRL_ERR_FORMAT);
        assert_msg_has(bad[k].want);
        ck_assert_ptr_null(back.teacher_lp);
        prl_opd_batch_free(&x);
        prl_bus_msg_free(&d), prl_bus_msg_free(&m);
    }
    prl_opd_batch_free(&ob);
    prl_grpo_batch_free(&b);
}
END_TEST

/* With opd.topk 2: the top-k frames travel and come back; a missing frame, an id < 0 on a loss
** token, an id other than -1 off them and a log-prob > 0 are named. (small_batch: response
** token 3 is the observation.) */
START_TEST(test_train_frames_topk)
{
    prl_grpo_batch b;
    small_batch(&b);
    const int32_t ids[10] = {7, 9, 1, 2, 3, 4, -1, -1, 5, 6};
    const float klp[10] = {-0.1f, -2.5f, -0.2f, -3, -0.5f, -1, 0, 0, -0.7f, -0.9f};
    struct {
        const char *want;
        int case_;
    } cases[] = {
        {NULL, 0},
        {"frame 'teacher_topk_logprobs' is missing", 1},
        {"frame 'teacher_topk_ids': sample 0 response token 1 rank 1 has id -1 (must be >= 0 on a "
         "loss token)",
         2},
        {"frame 'teacher_topk_ids': sample 1 response token 0 rank 0 has id 5 (must be -1 off the "
         "loss tokens)",
         3},
        {"frame 'teacher_topk_logprobs': sample 1 response token 1 rank 0 has log-prob 0.5", 4},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        prl_opd_batch ob, back;
        assert_ok(prl_opd_batch_init(&ob, 2, 5, 2));
        for (int i = 0; i < 5; i++) ob.teacher_lp[i] = i == 3 ? 0 : -1;
        memcpy(ob.topk_ids, ids, sizeof ids), memcpy(ob.topk_lp, klp, sizeof klp);
        ob.teacher[0] = 1, ob.teacher[1] = 2;
        if (cases[k].case_ == 2) ob.topk_ids[3] = -1;
        if (cases[k].case_ == 3) ob.topk_ids[6] = 5;
        if (cases[k].case_ == 4) ob.topk_lp[8] = 0.5f;
        prl_bus_msg m, d;
        assert_ok(train_to_msg(&b, NULL, &m));
        if (cases[k].case_ == 1) {
            ob.topk = 0; /* the plain frames only */
            add_teacher_frames(&m, &ob);
            ob.topk = 2;
            prl_bus_msg_add_frame(&m, "teacher_topk_ids", PRL_BUS_I32, ob.topk_ids, 10);
        } else add_teacher_frames(&m, &ob);
        wire(&m, &d);
        if (!cases[k].want) {
            assert_ok(train_teachers_from_msg(&back, &d, 2));
            ck_assert_int_eq(back.topk, 2);
            ck_assert(!memcmp(back.topk_ids, ids, sizeof ids) &&
                      !memcmp(back.topk_lp, klp, sizeof klp));
            prl_opd_batch_free(&back);
            /* the job's topk decides which frames are read: 0 ignores them */
            assert_ok(train_teachers_from_msg(&back, &d, 0));
            ck_assert(back.topk == 0 && !back.topk_ids);
            prl_opd_batch_free(&back);
        } else {
            ck_assert_int_eq(train_teachers_from_msg(&back, &d, 2), PRL_ERR_FORMAT);
            assert_msg_has(cases[k].want);
        }
        prl_opd_batch_free(&ob);
        prl_bus_msg_free(&d), prl_bus_msg_free(&m);
    }
    prl_grpo_batch_free(&b);
}
END_TEST

static void teach_msg(prl_bus_msg *m)
{
    assert_ok(prl_bus_msg_init(m, prl_msg_spec("teach"), "r", 1));
    prl_bus_msg_set_uint(m, "lease", 1), prl_bus_msg_set_uint(m, "step", 0);
    prl_bus_msg_set_str(m, "teacher", "coding"), prl_bus_msg_set_str(m, "path", "x");
}

/* A teach message with b's frames as they are (prl_msg_teach_encode would refuse them). */
static void teach_raw(prl_bus_msg *m, const prl_grpo_batch *b)
{
    teach_msg(m);
    prl_bus_msg_set_uint(m, "count", (uint64_t)b->n);
    prl_bus_msg_add_frame(m, "tokens", PRL_BUS_I32, b->tokens, b->n_tokens);
    prl_bus_msg_add_frame(m, "offsets", PRL_BUS_I32, b->offsets, (size_t)b->n + 1);
    prl_bus_msg_add_frame(m, "prompt_lens", PRL_BUS_I32, b->prompt_lens, (size_t)b->n);
    prl_bus_msg_add_frame(m, "mask", PRL_BUS_U8, b->mask, b->n_response);
}

START_TEST(test_teach_frames)
{
    prl_grpo_batch b, t;
    small_batch(&b);
    prl_bus_msg m, d;
    prl_msg_teach x = {.lease = 1, .step = 0, .teacher = "coding", .path = "x", .item = b}, back;
    assert_ok(prl_msg_teach_encode(&x, "r", 1, &m));
    wire(&m, &d);
    assert_ok(prl_msg_teach_decode(&d, &back));
    t = back.item;
    ck_assert_int_eq(t.n, 2);
    ck_assert(!memcmp(t.tokens, b.tokens, 8 * sizeof *b.tokens));
    ck_assert(!memcmp(t.mask, b.mask, 5));
    prl_grpo_batch_free(&t);
    prl_bus_msg_free(&d), prl_bus_msg_free(&m);
    /* a prompt length as long as the sample, a mask byte of 2: named */
    b.prompt_lens[1] = 3;
    teach_raw(&m, &b);
    wire(&m, &d);
    ck_assert_int_eq(prl_msg_teach_decode(&d, &back), PRL_ERR_FORMAT);
    assert_msg_has("prompt_lens: sample 1 has prompt length 3");
    prl_bus_msg_free(&d), prl_bus_msg_free(&m);
    b.prompt_lens[1] = 1, b.mask[2] = 2;
    teach_raw(&m, &b);
    wire(&m, &d);
    ck_assert_int_eq(prl_msg_teach_decode(&d, &back), PRL_ERR_FORMAT);
    assert_msg_has("mask: sample 0 response token 2 is 2");
    prl_bus_msg_free(&d), prl_bus_msg_free(&m);
    prl_grpo_batch_free(&b);
}
END_TEST

/* ------------------------------------------------------------------ on the model ---- */

/* n samples: prompt 3, response 1 + i % 4 tokens; every third response token an observation;
** b->logprobs = the model's own train-path log-probs (each sample scored alone). */
static void model_batch(prl_model *m, prl_grpo_batch *b, int n)
{
    size_t tokens = 0, response = 0;
    for (int i = 0; i < n; i++) tokens += 4 + i % 4, response += 1 + i % 4;
    assert_ok(prl_grpo_batch_init(b, n, tokens, response));
    prl_rng r;
    prl_rng_init(&r, 11, 0, 0, 0, PRL_RNG_TEST);
    size_t t = 0, k = 0;
    for (int i = 0; i < n; i++) {
        int len = 4 + i % 4;
        b->offsets[i] = (int32_t)t, b->prompt_lens[i] = 3, b->groups[i] = i;
        for (int j = 0; j < len; j++) b->tokens[t++] = 10 + (int32_t)(prl_rng_u64(&r) % 54);
        for (int j = 0; j < len - 3; j++) b->mask[k++] = j % 3 != 2;
    }
    b->offsets[n] = (int32_t)t;
    train_logprobs(m, b);
    assert_ok(prl_grpo_batch_check(b));
}

/* The teacher's pass gives the train path's log-probs on the loss tokens (micro-batches of 3
** rows of different lengths), 0 on observations, at the temperature asked for (τ = 0.5 is the
** train path's at 0.5, not its τ = 1 values); a temperature of 0 and a token outside the
** vocabulary are named. */
START_TEST(test_teacher_logprobs)
{
    prl_model m;
    micro_model(&m, 3, 1);
    prl_grpo_batch b;
    model_batch(&m, &b, 7);
    float *lp = malloc(b.n_response * sizeof *lp);
    assert_ok(prl_opd_teacher_logprobs(&m, &b, 3, 1.0, lp));
    for (size_t i = 0; i < b.n_response; i++) {
        if (!b.mask[i]) ck_assert(lp[i] == 0);
        else
            ck_assert_msg(fabsf(lp[i] - b.logprobs[i]) < 1e-5f, "token %zu: %g vs %g", i, lp[i],
                          b.logprobs[i]);
    }
    /* at the student's temperature τ: the train path's log_softmax(logits / τ), row by row */
    float *lp_half = malloc(b.n_response * sizeof *lp_half);
    assert_ok(prl_opd_teacher_logprobs(&m, &b, 3, 0.5, lp_half));
    prl_batch_buf bb;
    assert_ok(prl_batch_buf_init(&bb, 1, m.cfg.max_position_embeddings));
    int differ = 0;
    for (int i = 0; i < b.n; i++) {
        int len = b.offsets[i + 1] - b.offsets[i], nr;
        float ref[64];
        prl_batch_buf_set_row(&bb, len, 0, b.tokens + b.offsets[i], len, NULL);
        prl_batch batch = prl_batch_buf_view(&bb, 1, len);
        batch.temperature = 0.5;
        assert_ok(prl_model_logprobs(&m, &batch, ref));
        size_t first;
        prl_grpo_batch_response(&b, i, &first, &nr);
        for (int j = 0; j < nr; j++) {
            float want = b.mask[first + j] ? ref[2 + j] : 0;
            ck_assert_msg(fabsf(lp_half[first + j] - want) < 1e-5f,
                          "τ 0.5, sample %d token %d: "
                          "%g vs %g",
                          i, j, lp_half[first + j], want);
            differ += b.mask[first + j] && fabsf(lp_half[first + j] - lp[first + j]) > 1e-3f;
        }
    }
    ck_assert_msg(differ > 0, "τ = 0.5 gave the τ = 1 log-probs");
    prl_batch_buf_free(&bb);
    free(lp_half);
    ck_assert_int_eq(prl_opd_teacher_logprobs(&m, &b, 3, 0.0, lp), PRL_ERR_ARG);
    assert_msg_has("temperature 0 must be > 0");
    b.tokens[b.offsets[2] + 1] = m.cfg.vocab_size;
    ck_assert_int_eq(prl_opd_teacher_logprobs(&m, &b, 3, 1.0, lp), PRL_ERR_RANGE);
    assert_msg_has("sample 2 position 1");
    ck_assert(prl_opd_peak_rss_kb() > 0);
    free(lp);
    prl_grpo_batch_free(&b);
    prl_model_free(&m);
}
END_TEST

/* With top-k: the same log-probs, and at each loss token the model's k most likely ids (the
** first at least as likely as the token sampled) with their log-probs; -1 / 0 elsewhere. */
START_TEST(test_teacher_topk)
{
    prl_model m;
    micro_model(&m, 3, 1);
    prl_grpo_batch b;
    model_batch(&m, &b, 7);
    enum { K = 4 };
    size_t n = b.n_response;
    float *lp = malloc(n * sizeof *lp), *lp2 = malloc(n * sizeof *lp2),
          *klp = malloc(n * K * sizeof *klp);
    int32_t *ids = malloc(n * K * sizeof *ids);
    assert_ok(prl_opd_teacher_logprobs(&m, &b, 3, 1.0, lp));
    assert_ok(prl_opd_teacher_score(&m, &b, 3, 1.0, K, lp2, ids, klp));
    ck_assert(!memcmp(lp, lp2, n * sizeof *lp));
    int loss = 0;
    for (size_t f = 0; f < n; f++) {
        for (int k = 0; k < K; k++) {
            if (!b.mask[f]) {
                ck_assert(ids[f * K + k] == -1 && klp[f * K + k] == 0);
                continue;
            }
            ck_assert(ids[f * K + k] >= 0 && ids[f * K + k] < m.cfg.vocab_size);
            ck_assert(klp[f * K + k] <= 0 && (!k || klp[f * K + k] <= klp[f * K + k - 1]));
        }
        if (b.mask[f]) loss++, ck_assert(klp[f * K] >= lp[f] - 1e-6f);
    }
    ck_assert_int_gt(loss, 0);
    ck_assert_int_eq(
        prl_opd_teacher_score(&m, &b, 3, 1.0, PRL_MAX_EXTRA_TARGETS + 1, lp2, ids, klp),
        PRL_ERR_ARG);
    assert_msg_has("top-k 65");
    free(lp), free(lp2), free(klp), free(ids);
    prl_grpo_batch_free(&b);
    prl_model_free(&m);
}
END_TEST

/* Mean over sample i's loss tokens of log p(id) under m, id in place of each loss token's
** target (same contexts). */
static double mean_logp_of(prl_model *m, const prl_grpo_batch *b, int i, int32_t id)
{
    int len = b->offsets[i + 1] - b->offsets[i], pl = b->prompt_lens[i], n = 0;
    uint8_t train[64];
    size_t first;
    int nr;
    prl_grpo_batch_response(b, i, &first, &nr);
    for (int t = 0; t < len; t++) train[t] = t >= pl && b->mask[first + t - pl];
    prl_batch_buf bb;
    assert_ok(prl_batch_buf_init(&bb, 1, len));
    prl_batch_buf_set_row(&bb, len, 0, b->tokens + b->offsets[i], len, train);
    for (int t = 0; t < len; t++) bb.targets[t] = bb.targets[t] >= 0 ? id : -1;
    prl_batch batch = prl_batch_buf_view(&bb, 1, len);
    float lp[64];
    assert_ok(prl_model_logprobs(m, &batch, lp));
    double s = 0;
    for (int t = 0; t < len; t++) s += bb.targets[t] >= 0 ? lp[t] : 0, n += bb.targets[t] >= 0;
    prl_batch_buf_free(&bb);
    return n ? s / n : 0;
}

/* A step's fixture: the micro model (seed), 6 samples of its own, AdamW at lr 3e-3 without
** decay, micro-batches of 4 rows. */
static void step_fixture(prl_model *m, uint64_t seed, prl_grpo_batch *b, prl_optim *o,
                         prl_grpo_train_config *tc)
{
    micro_model(m, seed, 1);
    model_batch(m, b, 6);
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.lr = 3e-3, oc.weight_decay = 0;
    assert_ok(prl_optim_init(o, m, &oc));
    prl_grpo_train_config_default(tc);
    tc->micro_rows = 4;
}

/* The distillation term alone (opd.coef 0, no task reward): a teacher whose top-2 at every loss
** token is {X, Y} with p 0.6 / 0.3 raises the student's log p(X) and log p(Y) there; the
** weights are λ·teacher_coef·p_T; top1_match counts the sampled tokens equal to X. */
START_TEST(test_opd_distill_step)
{
    prl_model m;
    prl_grpo_batch b;
    prl_optim o;
    prl_grpo_train_config tc;
    step_fixture(&m, 5, &b, &o, &tc);
    prl_opd_config c;
    prl_opd_config_default(&c);
    c.coef = 0, c.task_weight = 0, c.topk = 2, c.topk_coef = 2, c.teacher_coef[1] = 0.5;
    const int32_t X = 21, Y = 40;
    prl_opd_batch ob;
    assert_ok(prl_opd_batch_init(&ob, b.n, b.n_response, 2));
    memcpy(ob.teacher_lp, b.logprobs, b.n_response * sizeof *b.logprobs);
    long loss = 0, match = 0;
    for (int i = 0; i < b.n; i++) {
        ob.teacher[i] = i % 2;
        size_t first;
        int nr;
        prl_grpo_batch_response(&b, i, &first, &nr);
        for (int j = 0; j < nr; j++) {
            size_t f = first + j;
            if (!b.mask[f]) continue;
            ob.topk_ids[f * 2] = X, ob.topk_ids[f * 2 + 1] = Y;
            ob.topk_lp[f * 2] = logf(0.6f), ob.topk_lp[f * 2 + 1] = logf(0.3f);
            loss++, match += b.tokens[b.offsets[i] + b.prompt_lens[i] + j] == X;
        }
    }
    float *q = malloc(b.n_response * 2 * sizeof *q);
    prl_opd_stats ost;
    prl_opd_distill_weights(&c, &b, &ob, q, &ost);
    for (int i = 0; i < b.n; i++) {
        size_t first;
        int nr;
        prl_grpo_batch_response(&b, i, &first, &nr);
        double coef = 2 * (i % 2 ? 0.5 : 1.0);
        for (int j = 0; j < nr; j++) {
            size_t f = first + j;
            ck_assert_double_eq_tol(q[f * 2], b.mask[f] ? coef * 0.6 : 0, 1e-6);
            ck_assert_double_eq_tol(q[f * 2 + 1], b.mask[f] ? coef * 0.3 : 0, 1e-6);
        }
    }
    ck_assert_double_eq_tol(ost.topk_mass, 0.9, 1e-6);
    ck_assert_double_eq_tol(ost.top1_match, (double)match / loss, 1e-12);
    free(q);
    double x0 = mean_logp_of(&m, &b, 0, X), y0 = mean_logp_of(&m, &b, 0, Y);
    prl_grpo_step_stats st;
    for (int step = 0; step < 3; step++)
        assert_ok(prl_opd_train_step(&m, &o, &b, &ob, &c, &tc, &st, &ost));
    double dx = mean_logp_of(&m, &b, 0, X) - x0, dy = mean_logp_of(&m, &b, 0, Y) - y0;
    ck_assert_msg(dx > 0.05 && dy > 0.02, "log p(X) %+g, log p(Y) %+g: both should rise", dx, dy);
    ck_assert_double_eq_tol(ost.topk_mass, 0.9, 1e-6);
    /* an id outside the vocabulary is the model's range error, before any update */
    size_t f0;
    int nr0;
    prl_grpo_batch_response(&b, 0, &f0, &nr0);
    ob.topk_ids[f0 * 2 + 1] = m.cfg.vocab_size;
    ck_assert_int_eq(prl_opd_train_step(&m, &o, &b, &ob, &c, &tc, &st, &ost), PRL_ERR_RANGE);
    assert_msg_has("extra target 1");
    prl_opd_batch_free(&ob);
    prl_optim_free(&o);
    prl_grpo_batch_free(&b);
    prl_model_free(&m);
}
END_TEST

/* Log-prob of the loss tokens of sample i under m, summed. */
static double sample_logp(prl_model *m, const prl_grpo_batch *b, int i)
{
    float *lp = malloc(b->n_response * sizeof *lp);
    assert_ok(prl_opd_teacher_logprobs(m, b, 8, 1.0, lp));
    size_t first;
    int nr;
    prl_grpo_batch_response(b, i, &first, &nr);
    double s = 0;
    for (int j = 0; j < nr; j++) s += b->mask[first + j] ? lp[first + j] : 0;
    free(lp);
    return s;
}

/* A teacher equal to the student gives A = 0: the step leaves every weight bitwise unchanged.
** A teacher 1 nat above the student on sample 0's tokens and 1 below on sample 1's raises the
** first's log-prob and lowers the second's (the sign of the update). */
START_TEST(test_opd_step)
{
    prl_model m;
    prl_grpo_batch b;
    prl_optim o;
    prl_grpo_train_config tc;
    step_fixture(&m, 4, &b, &o, &tc);
    prl_opd_config c;
    prl_opd_config_default(&c);
    prl_opd_batch ob;
    assert_ok(prl_opd_batch_init(&ob, b.n, b.n_response, 0));
    memcpy(ob.teacher_lp, b.logprobs, b.n_response * sizeof *b.logprobs);
    for (int i = 0; i < b.n; i++) ob.teacher[i] = i % 4;
    prl_real *before = malloc(m.n_params * sizeof *before);
    memcpy(before, m.params, m.n_params * sizeof *before);
    prl_grpo_step_stats st;
    prl_opd_stats ost;
    assert_ok(prl_opd_train_step(&m, &o, &b, &ob, &c, &tc, &st, &ost));
    ck_assert(!memcmp(before, m.params, m.n_params * sizeof *before));
    ck_assert_double_eq_tol(ost.teacher_kl, 0, 1e-12);
    ck_assert_int_eq(ost.samples[0] + ost.samples[1] + ost.samples[2] + ost.samples[3], 6);
    /* the teacher likes sample 0's tokens and dislikes sample 1's */
    double lp0 = sample_logp(&m, &b, 0), lp1 = sample_logp(&m, &b, 1);
    for (int i = 0; i < 2; i++) {
        size_t first;
        int nr;
        prl_grpo_batch_response(&b, i, &first, &nr);
        for (int j = 0; j < nr; j++)
            ob.teacher_lp[first + j] = b.logprobs[first + j] + (i ? -1.0f : 1.0f);
    }
    for (int step = 0; step < 3; step++)
        assert_ok(prl_opd_train_step(&m, &o, &b, &ob, &c, &tc, &st, &ost));
    double up = sample_logp(&m, &b, 0) - lp0, down = sample_logp(&m, &b, 1) - lp1;
    ck_assert_msg(up > 0.05 && down < -0.05, "log-prob change %g (should rise), %g (should fall)",
                  up, down);
    /* mismatched teacher batch */
    ob.n = 5;
    ck_assert_int_eq(prl_opd_train_step(&m, &o, &b, &ob, &c, &tc, &st, &ost), PRL_ERR_ARG);
    ob.n = 6;
    free(before);
    prl_opd_batch_free(&ob);
    prl_optim_free(&o);
    prl_grpo_batch_free(&b);
    prl_model_free(&m);
}
END_TEST

/* ------------------------------------------------------------------ job keys -------- */

START_TEST(test_job_keys)
{
    prl_job_config j;
    assert_ok(prl_job_config_default(&j));
    ck_assert(!j.opd_enabled && !*j.opd_teachers[0]);
    assert_ok(prl_job_config_set(&j, "task.domain=mixed"));
    ck_assert_int_eq(prl_job_config_set(&j, "opd.enabled=true"), PRL_ERR_CONFIG);
    assert_msg_has("opd.teachers.agent");
    prl_job_config_free(&j); /* a refused --set leaves the value in: start again */
    assert_ok(prl_job_config_default(&j));
    assert_ok(prl_job_config_set(&j, "task.domain=coding"));
    ck_assert_int_eq(prl_job_config_set(&j, "opd.enabled=true"), PRL_ERR_CONFIG);
    assert_msg_has("opd.teachers.coding");
    prl_job_config_free(&j);
    assert_ok(prl_job_config_default(&j));
    assert_ok(prl_job_config_set(&j, "task.domain=coding"));
    assert_ok(prl_job_config_set(&j, "opd.teachers.coding=runs/coding/ckpt"));
    assert_ok(prl_job_config_set(&j, "opd.enabled=true"));
    int need[PRL_OPD_TEACHERS];
    prl_opd_teachers_needed(&j, need);
    ck_assert(!need[0] && need[1] && !need[2] && !need[3]);
    ck_assert_int_eq(prl_job_config_set(&j, "opd.discount=1"), PRL_ERR_CONFIG);
    assert_msg_has("opd.discount"); /* out of range: refused before it is stored */
    ck_assert_int_eq(prl_job_config_set(&j, "opd.teacher.coding=x"), PRL_ERR_CONFIG);
    assert_msg_has("opd.teachers.coding"); /* the nearest key is suggested */
    ck_assert_int_eq(prl_job_config_set(&j, "teacher.workers=0"), PRL_ERR_CONFIG);
    assert_msg_has("teacher.workers");
    /* a missing teacher checkpoint is named with its file */
    ck_assert_int_eq(prl_opd_check_teachers(&j), PRL_ERR_CONFIG);
    assert_msg_has("runs/coding/ckpt/config.json");
    prl_opd_config oc;
    assert_ok(prl_job_config_set(&j, "opd.adv_mask_eps=0.01"));
    assert_ok(prl_opd_config_from_job(&oc, &j));
    ck_assert(oc.mask_eps == 0.01 && oc.coef == 1 && !oc.clip);
    ck_assert(oc.teacher_coef[0] == 1 && oc.teacher_coef[1] == 1 && oc.teacher_coef[3] == 1);
    assert_ok(prl_job_config_set(&j, "opd.teacher_coef.coding=4"));
    ck_assert_int_eq(prl_job_config_set(&j, "opd.teacher_coef.agent=-1"), PRL_ERR_CONFIG);
    assert_msg_has("opd.teacher_coef.agent");
    assert_ok(prl_opd_config_from_job(&oc, &j));
    ck_assert(oc.teacher_coef[1] == 4 && oc.teacher_coef[2] == 1);
    prl_job_config_free(&j);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("opd");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_spec_vector);
    tcase_add_test(tc, test_mask_after_clip);
    tcase_add_test(tc, test_observation_tokens_and_teachers);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_token_advantage_weights);
    tcase_add_test(tc, test_is_correction);
    tcase_add_test(tc, test_train_frames);
    tcase_add_test(tc, test_train_frames_topk);
    tcase_add_test(tc, test_teach_frames);
    tcase_add_test(tc, test_teacher_logprobs);
    tcase_add_test(tc, test_opd_step);
    tcase_add_test(tc, test_teacher_topk);
    tcase_add_test(tc, test_opd_distill_step);
    tcase_add_test(tc, test_job_keys);
    suite_add_tcase(s, tc);
    return check_run(s);
}
