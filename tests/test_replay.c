/*
** test_replay.c — routing replay (replay/, docs/replay.md) against hand-computed cases: the
** spec's gate and overlap vector, the record unpacking and its rejections, the replay choice
** of every mode (Masked R3's replayed share at several τ), the routing entropy and its alarm,
** and the Cached R3 route cache (first-seen rows kept, never overwritten, cut at a changed
** token).
*/
#include "replay/replay.h"

#include "check_util.h"
#include "engine/ops.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ spec vectors ---- */

/* rl.md §3.2: s_train = [2, 1, 0.5, -1] (logits of the sigmoid router), K = 2, native {0, 1},
** replayed {0, 2}: gates σ(s)[idx] / Σ = [0.585926, 0.414074]; overlap 0.5. */
START_TEST(test_spec_vector)
{
    prl_real z[4] = {2.0, 1.0, 0.5, -1.0}, s[4], g[2];
    int32_t sel[2], native[2], forced[2] = {0, 2};
    prl_moe_gate_forward(native, g, s, z, NULL, NULL, 4, 2, 1, 1.0);
    ck_assert_int_eq(native[0], 0);
    ck_assert_int_eq(native[1], 1);
    prl_moe_gate_forward(sel, g, s, z, NULL, forced, 4, 2, 1, 1.0);
    ck_assert_int_eq(sel[1], 2);
    ck_assert_double_eq_tol(g[0], 0.585926, 1e-6);
    ck_assert_double_eq_tol(g[1], 0.414074, 1e-6);
    ck_assert_int_eq(prl_replay_overlap(native, forced, 2), 1);
}
END_TEST

START_TEST(test_overlap_sets)
{
    int32_t a[3] = {0, 1, 2}, b[3] = {2, 0, 5}, c[3] = {1, 1, 1};
    ck_assert_int_eq(prl_replay_overlap(a, b, 3), 2);
    ck_assert_int_eq(prl_replay_overlap(b, a, 3), 2);
    ck_assert_int_eq(prl_replay_overlap(a, a, 3), 3);
    ck_assert_int_eq(prl_replay_overlap(c, a, 3), 1); /* a repeated id counts once */
}
END_TEST

START_TEST(test_mode_names)
{
    prl_replay_mode m;
    const char *names[] = {"none", "r2", "r3", "masked_r3"};
    for (int i = 0; i < 4; i++) {
        assert_ok(prl_replay_mode_parse(names[i], &m));
        ck_assert_int_eq(m, i);
        ck_assert_str_eq(prl_replay_mode_name(m), names[i]);
    }
    ck_assert_int_eq(prl_replay_mode_parse("r4", &m), PRL_ERR_CONFIG);
    assert_msg_has("masked_r3");
}
END_TEST

/* ------------------------------------------------------------------ records --------- */

/* 3 positions × 2 MoE layers × K 2, token-major bytes → [layer][position][K]. */
START_TEST(test_record_unpack)
{
    uint8_t rec[12] = {0, 1, 2, 3, /* p0: L0 {0,1}  L1 {2,3} */
                       3, 2, 1, 0, /* p1: L0 {3,2}  L1 {1,0} */
                       0, 2, 1, 3};
    int32_t out[12];
    assert_ok(prl_replay_record_unpack(out, rec, 3, 2, 2, 1, 4));
    int32_t want[12] = {0, 1, 3, 2, 0, 2, /* layer 0: p0 p1 p2 */
                        2, 3, 1, 0, 1, 3};
    for (int i = 0; i < 12; i++) ck_assert_int_eq(out[i], want[i]);
    rec[9] = 0; /* p2 L0 {0, 0} */
    ck_assert_int_eq(prl_replay_record_unpack(out, rec, 3, 2, 2, 1, 4), PRL_ERR_FORMAT);
    assert_msg_has("position 2 MoE layer 0 repeats");
    rec[9] = 4; /* out of range for 4 experts */
    ck_assert_int_eq(prl_replay_record_unpack(out, rec, 3, 2, 2, 1, 4), PRL_ERR_FORMAT);
    assert_msg_has("position 2 MoE layer 0");
    rec[9] = 2;
    ck_assert_int_eq(prl_replay_record_unpack(out, rec, 3, 2, 2, 2, 4), PRL_ERR_FORMAT);
    assert_msg_has("bytes per id");
}
END_TEST

/* ------------------------------------------------------------------ choosing -------- */

/* Five positions, K = 2; overlaps 1, 0.5, 0, 1 (slot order differs), 0.5. */
static const int32_t nat5[10] = {0, 1, 0, 1, 2, 3, 1, 2, 3, 0};
static const int32_t rec5[10] = {0, 1, 0, 2, 0, 1, 2, 1, 3, 2};

START_TEST(test_choose_modes)
{
    int32_t out[10];
    prl_replay_layer_stats st = {0};
    prl_replay_choose(out, nat5, rec5, 5, 2, PRL_REPLAY_R3, 0.5, &st);
    ck_assert_mem_eq(out, rec5, sizeof rec5); /* R3: the record everywhere */
    ck_assert_int_eq(st.replayed, 5);
    ck_assert_int_eq(st.compared, 5);
    ck_assert_double_eq_tol(st.overlap / st.compared, 0.6, 1e-15);
    memset(&st, 0, sizeof st);
    prl_replay_choose(out, nat5, rec5, 5, 2, PRL_REPLAY_R2, 0.5, &st);
    ck_assert_mem_eq(out, nat5, sizeof nat5); /* R2: the old-policy pass's own routes */
    memset(&st, 0, sizeof st);
    prl_replay_choose(out, nat5, rec5, 5, 2, PRL_REPLAY_NONE, 0.5, &st);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(out[i], PRL_ROUTE_NATIVE);
    ck_assert_int_eq(st.replayed, 0);
    ck_assert_double_eq_tol(st.overlap, 3.0, 1e-15); /* metrics in every mode */
    memset(&st, 0, sizeof st);
    prl_replay_choose(out, nat5, NULL, 5, 2, PRL_REPLAY_R3, 0.5, &st); /* no record */
    ck_assert_int_eq(st.replayed, 0);
    ck_assert_int_eq(st.compared, 0);
    ck_assert_int_eq(out[0], PRL_ROUTE_NATIVE);
}
END_TEST

/* Masked R3: the replayed share is the share of positions with overlap >= τ (inclusive), by
** hand 5/5, 4/5, 2/5, 0/5 at τ = 0, 0.5, 1, 1.01; replayed rows carry the record, the others
** the native marker. */
START_TEST(test_masked_share)
{
    const double taus[4] = {0, 0.5, 1.0, 1.01};
    const long share[4] = {5, 4, 2, 0};
    const int replay_at_half[5] = {1, 1, 0, 1, 1};
    for (int t = 0; t < 4; t++) {
        int32_t out[10];
        prl_replay_layer_stats st = {0};
        prl_replay_choose(out, nat5, rec5, 5, 2, PRL_REPLAY_MASKED_R3, taus[t], &st);
        ck_assert_int_eq(st.replayed, share[t]);
        ck_assert_int_eq(st.rows, 5);
        if (taus[t] == 0.5)
            for (int p = 0; p < 5; p++)
                for (int k = 0; k < 2; k++)
                    ck_assert_int_eq(out[p * 2 + k], replay_at_half[p] ? rec5[p * 2 + k]
                                                                        : PRL_ROUTE_NATIVE);
    }
}
END_TEST

/* ------------------------------------------------------------------ entropy --------- */

START_TEST(test_entropy)
{
    int32_t routes[4] = {0, 1, 0, 2}; /* counts {2, 1, 1, 0}: H = 1.5 ln 2 = 0.75 ln 4 */
    double counts[4] = {0};
    prl_replay_count(counts, routes, 2, 2);
    ck_assert_double_eq_tol(prl_replay_entropy(counts, 4), 1.5 * log(2.0), 1e-15);
    ck_assert_int_eq(prl_replay_entropy_alarm(counts, 4, 0.8), 1);
    ck_assert_int_eq(prl_replay_entropy_alarm(counts, 4, 0.7), 0);
    double uniform[4] = {3, 3, 3, 3}, none[4] = {0}, one[4] = {0, 7, 0, 0};
    ck_assert_double_eq_tol(prl_replay_entropy(uniform, 4), log(4.0), 1e-15);
    ck_assert_double_eq(prl_replay_entropy(one, 4), 0);
    ck_assert_int_eq(prl_replay_entropy_alarm(one, 4, 0.1), 1); /* collapsed on one expert */
    ck_assert_int_eq(prl_replay_entropy_alarm(none, 4, 0.9), 0); /* nothing counted */
}
END_TEST

/* ------------------------------------------------------------------ Cached R3 ------- */

/* Rows of 2 bytes; a pass's row p is {tag, p}: different tags are different routes. */
static void pass_rows(uint8_t *rows, int n, uint8_t tag)
{
    for (int p = 0; p < n; p++) rows[2 * p] = tag, rows[2 * p + 1] = (uint8_t)p;
}

START_TEST(test_cache_first_seen)
{
    prl_route_cache c;
    prl_route_cache_init(&c);
    prl_route_cache_stats st;
    int32_t ids[12] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    uint8_t r1[24], r2[24], r3[24];
    /* turn 1: prompt 3 + 2 generated → 4 rows (the last token is never fed) */
    pass_rows(r1, 4, 1);
    assert_ok(prl_route_cache_merge(&c, ids, 5, r1, 4, 2, &st));
    ck_assert_int_eq(st.added, 4);
    /* turn 2 re-prefills all 8 tokens with different routes: rows 0..3 stay turn 1's */
    pass_rows(r2, 8, 2);
    assert_ok(prl_route_cache_merge(&c, ids, 9, r2, 8, 2, &st));
    ck_assert_int_eq(st.kept, 4);
    ck_assert_int_eq(st.changed, 4);
    ck_assert_int_eq(st.added, 4);
    ck_assert_int_eq(c.n, 8);
    for (int p = 0; p < 8; p++) ck_assert_int_eq(c.rows[2 * p], p < 4 ? 1 : 2);
    /* turn 3 with the same routes as the cache where it overlaps: nothing changes there */
    pass_rows(r3, 11, 3);
    memcpy(r3, c.rows, 16);
    assert_ok(prl_route_cache_merge(&c, ids, 12, r3, 11, 2, &st));
    ck_assert_int_eq(st.changed, 0);
    ck_assert_int_eq(st.added, 3);
    for (int p = 0; p < 11; p++) ck_assert_int_eq(c.rows[2 * p], p < 4 ? 1 : p < 8 ? 2 : 3);
    /* a history re-tokenised from position 6: rows 6.. are dropped and re-recorded */
    ids[6] = 40;
    pass_rows(r3, 11, 4);
    assert_ok(prl_route_cache_merge(&c, ids, 12, r3, 11, 2, &st));
    ck_assert_int_eq(st.discarded, 5);
    ck_assert_int_eq(st.added, 5);
    for (int p = 0; p < 11; p++) ck_assert_int_eq(c.rows[2 * p], p < 4 ? 1 : p < 6 ? 2 : 4);
    ck_assert_int_eq(c.ids[6], 40);
    /* a different row size is an error */
    ck_assert_int_eq(prl_route_cache_merge(&c, ids, 12, r3, 11, 4, &st), PRL_ERR_ARG);
    ck_assert_int_eq(prl_route_cache_merge(&c, ids, 3, r3, 4, 2, &st), PRL_ERR_ARG);
    prl_route_cache_free(&c);
}
END_TEST

static Suite *replay_suite(void)
{
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("units");
    tcase_add_test(tc, test_spec_vector);
    tcase_add_test(tc, test_overlap_sets);
    tcase_add_test(tc, test_mode_names);
    tcase_add_test(tc, test_record_unpack);
    tcase_add_test(tc, test_choose_modes);
    tcase_add_test(tc, test_masked_share);
    tcase_add_test(tc, test_entropy);
    tcase_add_test(tc, test_cache_first_seen);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(replay_suite()); }
