/*
** test_replay.c — routing replay (replay/, docs/replay.md) against hand-computed cases: the
** spec's gate and overlap vector, the record unpacking and its rejections, the replay choice
** of every mode (Masked R3's replayed share at several τ), the routing entropy and its alarm,
** and the Cached R3 route cache (first-seen rows kept, never overwritten, cut at a changed
** token). Then the trainer (grpo/): the routes frames of `train` and their rejections, R3
** bringing the trainer's routes to the rollout's (overlap 1), Masked R3's replayed share at τ
** on a hand-built record, R2 keeping θ_old's routes across updates, mode none staying bitwise
** identical with routes present, rejected records, and the replay.* job keys.
*/
#include "replay/replay.h"

#include "tests/msg_util.h"
#include "grpo/grpo.h"
#include "job/job.h"

#include "engine/ops.h"
#include "tests/check_util.h"
#include "tests/grpo_util.h"

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
                    ck_assert_int_eq(out[p * 2 + k],
                                     replay_at_half[p] ? rec5[p * 2 + k] : PRL_ROUTE_NATIVE);
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
    ck_assert_int_eq(prl_replay_entropy_alarm(one, 4, 0.1), 1);  /* collapsed on one expert */
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

/* ------------------------------------------------------------------ the trainer ----- */

enum { NS = 4, LEN = 8, PL = 3, ROWS = LEN - 1 }; /* 4 samples of 8 tokens, prompt 3 */

/* The micro model with every weight ×20: routers far from uniform. */
static void sharp_micro_model(prl_model *m, uint64_t seed)
{
    micro_model(m, seed, 0);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] *= 20;
}

/* One group of NS samples of LEN tokens, rewards 0/1, infer log-probs -1, every response
** token trained. */
static void equal_batch(prl_grpo_batch *b)
{
    assert_ok(prl_grpo_batch_init(b, NS, NS * LEN, NS * (LEN - PL)));
    for (int i = 0; i < NS; i++) {
        b->offsets[i] = i * LEN, b->prompt_lens[i] = PL, b->groups[i] = 0;
        b->rewards[i] = (float)(i % 2);
        for (int t = 0; t < LEN; t++) b->tokens[i * LEN + t] = (int32_t)(5 + (i * 13 + t * 7) % 50);
    }
    b->offsets[NS] = NS * LEN;
    for (size_t k = 0; k < b->n_response; k++) b->logprobs[k] = -1.0f, b->mask[k] = 1;
    assert_ok(prl_grpo_batch_check(b));
}

/* The native routes of the batch's samples as the trainer's old-policy pass sees them (one
** micro-batch of NS rows × LEN): [n_moe][NS × LEN][K]. */
static int32_t *native_routes(prl_model *m, const prl_grpo_batch *b)
{
    prl_batch batch = {.B = NS, .T = LEN, .tokens = b->tokens, .temperature = 1};
    float lp[NS * LEN];
    assert_ok(prl_model_logprobs(m, &batch, lp));
    size_t n = (size_t)m->n_moe * NS * LEN * m->cfg.num_experts_per_tok;
    int32_t *r = malloc(n * sizeof *r);
    memcpy(r, prl_model_routes(m), n * sizeof *r);
    return r;
}

/* How a record row is made from the native row (K = 2 of E = 4) at position p. */
typedef void (*record_fn)(int32_t *rec, const int32_t *nat, int p);

static void shifted(int32_t *rec, const int32_t *nat, int p)
{
    (void)p;
    rec[0] = (nat[0] + 1) % 4, rec[1] = (nat[1] + 1) % 4;
    if (rec[0] == rec[1]) rec[1] = (rec[1] + 1) % 4;
}

/* overlap 1 at p ≡ 0, 0.5 at p ≡ 1, 0 at p ≡ 2 (mod 3) */
static void by_position(int32_t *rec, const int32_t *nat, int p)
{
    int32_t others[2], k = 0;
    for (int e = 0; e < 4; e++)
        if (e != nat[0] && e != nat[1]) others[k++] = e;
    if (p % 3 == 0) rec[0] = nat[1], rec[1] = nat[0]; /* same set, other slot order */
    else if (p % 3 == 1) rec[0] = nat[0], rec[1] = others[0];
    else rec[0] = others[1], rec[1] = others[0];
}

/* Attach records made by `fn` from the native routes (compact, token-major, width 1). */
static void attach_routes(prl_grpo_batch *b, const prl_model *m, const int32_t *native,
                          record_fn fn)
{
    int M = m->n_moe, K = 2;
    assert_ok(prl_grpo_batch_routes_init(b, M, K, 1, (size_t)NS * ROWS));
    for (int i = 0; i < NS; i++) {
        b->route_rows[i] = ROWS;
        for (int p = 0; p < ROWS; p++)
            for (int l = 0; l < M; l++) {
                int32_t rec[2];
                fn(rec, native + ((size_t)l * NS * LEN + (size_t)i * LEN + p) * K, p);
                uint8_t *dst = b->routes + (((size_t)i * ROWS + p) * M + l) * K;
                dst[0] = (uint8_t)rec[0], dst[1] = (uint8_t)rec[1];
            }
    }
    assert_ok(prl_grpo_batch_check(b));
}

/* One step of `mode` on a fresh micro model; returns the stats, the weights in *w (malloc'd). */
static prl_grpo_step_stats run_step(const prl_grpo_batch *b, prl_replay_mode mode, double tau,
                                    prl_real **w)
{
    prl_model m;
    sharp_micro_model(&m, 11);
    prl_optim o;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.lr = 1e-3;
    assert_ok(prl_optim_init(&o, &m, &oc));
    prl_grpo_train_config c;
    prl_grpo_train_config_default(&c);
    c.replay_mode = (int)mode, c.replay_tau = tau, c.entropy_alarm = 0.5;
    prl_grpo_step_stats st;
    assert_ok(prl_grpo_train_step(&m, &o, b, &c, &st));
    if (w) {
        *w = malloc(m.n_params * sizeof **w);
        memcpy(*w, m.params, m.n_params * sizeof **w);
    }
    prl_optim_free(&o);
    prl_model_free(&m);
    return st;
}

/* The micro model, the batch, its native routes and records made from them by `fn`. */
typedef struct fixture {
    prl_model m;
    prl_grpo_batch b;
    int32_t *native;
} fixture;

static void fixture_init(fixture *f, record_fn fn)
{
    sharp_micro_model(&f->m, 11);
    equal_batch(&f->b);
    f->native = native_routes(&f->m, &f->b);
    attach_routes(&f->b, &f->m, f->native, fn);
}

static void fixture_free(fixture *f)
{
    free(f->native);
    prl_grpo_batch_free(&f->b);
    prl_model_free(&f->m);
}

/* Mean overlap over all positions and layer 0 of the records `fn` makes from `native`. */
static double hand_overlap(const int32_t *native, int l, record_fn fn)
{
    double sum = 0;
    for (int i = 0; i < NS; i++)
        for (int p = 0; p < ROWS; p++) {
            const int32_t *nat = native + ((size_t)l * NS * LEN + (size_t)i * LEN + p) * 2;
            int32_t rec[2];
            fn(rec, nat, p);
            sum +=
                ((rec[0] == nat[0] || rec[0] == nat[1]) + (rec[1] == nat[0] || rec[1] == nat[1])) /
                2.0;
        }
    return sum / (NS * ROWS);
}

/* R3: the routes the trainer's lp_old used equal the rollout's at every position of every
** layer (overlap 1), although the native router disagrees; without replay they do not. */
START_TEST(test_trainer_r3_overlap_one)
{
    fixture f;
    fixture_init(&f, shifted);
    prl_grpo_step_stats r3 = run_step(&f.b, PRL_REPLAY_R3, 0.5, NULL);
    prl_grpo_step_stats none = run_step(&f.b, PRL_REPLAY_NONE, 0.5, NULL);
    ck_assert_int_eq(r3.n_moe, f.m.n_moe);
    ck_assert_int_eq(r3.route_records, NS);
    for (int l = 0; l < f.m.n_moe; l++) {
        ck_assert_double_eq(r3.route_overlap_used[l], 1.0);
        ck_assert_double_eq(r3.route_replayed[l], 1.0);
        ck_assert_double_eq_tol(r3.route_overlap[l], hand_overlap(f.native, l, shifted), 1e-12);
        ck_assert_double_eq_tol(none.route_overlap_used[l], none.route_overlap[l], 1e-12);
        ck_assert_double_lt(none.route_overlap_used[l], 0.9);
        ck_assert_double_eq(none.route_replayed[l], 0.0);
        ck_assert(r3.route_entropy[l] > 0 && r3.route_entropy[l] <= log(4.0) + 1e-12);
    }
    char *json = prl_grpo_step_stats_to_json(&r3);
    ck_assert(strstr(json, "\"replay_mode\":\"r3\"") &&
              strstr(json, "\"route_overlap_used\":[1.0,1.0]"));
    free(json);
    fixture_free(&f);
}
END_TEST

/* Masked R3: per layer, the replayed share is the share of positions with overlap >= τ — by
** hand 5 of the 7 positions per sample at τ = 0.5 (p ≢ 2 mod 3), 3 of 7 at τ = 1, all at 0;
** the overlap is 4/7. Positions replayed use the record, so layer 0 (whose input no replay
** changes) has a used overlap of (5·1 + 2·0) / 7 at τ = 0.5. */
START_TEST(test_trainer_masked_share)
{
    fixture f;
    fixture_init(&f, by_position);
    const double taus[3] = {0.5, 1.0, 0.0}, share[3] = {5.0 / 7, 3.0 / 7, 1.0};
    for (int t = 0; t < 3; t++) {
        prl_grpo_step_stats st = run_step(&f.b, PRL_REPLAY_MASKED_R3, taus[t], NULL);
        for (int l = 0; l < f.m.n_moe; l++) {
            ck_assert_double_eq_tol(st.route_replayed[l], share[t], 1e-12);
            ck_assert_double_eq_tol(st.route_overlap[l], 4.0 / 7, 1e-12);
        }
        if (t == 0) ck_assert_double_eq_tol(st.route_overlap_used[0], 5.0 / 7, 1e-12);
        if (t == 2) ck_assert_double_eq(st.route_overlap_used[1], 1.0);
    }
    fixture_free(&f);
}
END_TEST

/* Mode none ignores the routes: bitwise the same weights as a batch without them; R3 differs. */
START_TEST(test_trainer_none_is_unchanged)
{
    prl_model m;
    sharp_micro_model(&m, 11);
    prl_grpo_batch b, plain;
    equal_batch(&b);
    equal_batch(&plain);
    int32_t *native = native_routes(&m, &b);
    attach_routes(&b, &m, native, shifted);
    prl_real *w0, *w1, *w2;
    run_step(&plain, PRL_REPLAY_NONE, 0.5, &w0);
    prl_grpo_step_stats st = run_step(&b, PRL_REPLAY_NONE, 0.5, &w1);
    run_step(&b, PRL_REPLAY_R3, 0.5, &w2);
    ck_assert_mem_eq(w0, w1, m.n_params * sizeof *w0);
    ck_assert(memcmp(w0, w2, m.n_params * sizeof *w0) != 0);
    ck_assert_int_eq(st.route_records, NS);
    free(w0), free(w1), free(w2), free(native);
    prl_grpo_batch_free(&b), prl_grpo_batch_free(&plain);
    prl_model_free(&m);
}
END_TEST

/* Positions p < ROWS of every sample and layer where `routes` ([n_moe][NS·LEN][K]) differ
** from the fixture's native routes at θ_old. */
static int routes_changed(const fixture *f, const int32_t *routes)
{
    int changed = 0;
    for (int l = 0; l < f->m.n_moe; l++)
        for (int i = 0; i < NS; i++)
            for (int p = 0; p < ROWS; p++) {
                size_t at = ((size_t)l * NS * LEN + (size_t)i * LEN + p) * 2;
                changed += routes[at] != f->native[at] || routes[at + 1] != f->native[at + 1];
            }
    return changed;
}

/* R2: every update forward replays the old-policy pass's routes. Two epochs at a large
** learning rate move the router, so the second update's forward routes differently without
** replay; with R2 its routes are θ_old's at every position (the model's last forward is that
** update's, one micro-batch of the NS samples). */
START_TEST(test_trainer_r2_keeps_old_routes)
{
    fixture f;
    fixture_init(&f, shifted);
    int changed[2];
    for (int k = 0; k < 2; k++) {
        prl_model m;
        sharp_micro_model(&m, 11);
        prl_optim o;
        prl_optim_config oc;
        prl_optim_config_default(&oc);
        oc.lr = 0.05;
        assert_ok(prl_optim_init(&o, &m, &oc));
        prl_grpo_train_config c;
        prl_grpo_train_config_default(&c);
        c.replay_mode = k ? PRL_REPLAY_R2 : PRL_REPLAY_NONE, c.ppo_epochs = 2, c.grad_clip = 0;
        prl_grpo_step_stats st;
        assert_ok(prl_grpo_train_step(&m, &o, &f.b, &c, &st));
        changed[k] = routes_changed(&f, prl_model_routes(&m));
        for (int l = 0; k && l < m.n_moe; l++) {
            ck_assert_double_eq(st.route_replayed[l], 1.0);
            ck_assert_double_eq_tol(st.route_overlap_used[l], st.route_overlap[l], 1e-12);
        }
        prl_optim_free(&o);
        prl_model_free(&m);
    }
    ck_assert_int_gt(changed[0], 0);
    ck_assert_int_eq(changed[1], 0);
    fixture_free(&f);
}
END_TEST

/* The routes frames through the codec, and every bad routes frame rejected by name. */
START_TEST(test_routes_frame)
{
    fixture f;
    fixture_init(&f, shifted);
    prl_grpo_batch back;
    size_t rb = (size_t)f.m.n_moe * 2; /* bytes per route row */
    f.b.route_rows[2] = 4;             /* a prefix record is allowed: sample 3's rows move up */
    memmove(f.b.routes + (2 * ROWS + 4) * rb, f.b.routes + 3 * ROWS * rb, ROWS * rb);
    f.b.routes_bytes -= (ROWS - 4) * rb;
    assert_ok(prl_grpo_batch_check(&f.b));
    prl_bus_msg msg, dec;
    assert_ok(train_to_msg(&f.b, NULL, &msg));
    prl_bus_wire w;
    assert_ok(prl_bus_encode(&msg, &w));
    assert_ok(prl_bus_decode(prl_msg_registry(), w.parts, w.n, &dec, NULL, 0));
    assert_ok(train_batch_from_msg(&back, &dec));
    ck_assert_int_eq(back.route_moe, f.m.n_moe);
    ck_assert_int_eq(back.route_k, 2);
    ck_assert_int_eq(back.route_width, 1);
    ck_assert_mem_eq(back.route_rows, f.b.route_rows, NS * sizeof *f.b.route_rows);
    ck_assert_uint_eq(back.routes_bytes, f.b.routes_bytes);
    ck_assert_mem_eq(back.routes, f.b.routes, f.b.routes_bytes);
    prl_grpo_batch_free(&back);
    /* a sample with more route rows than length − 1 */
    int32_t *rows = (int32_t *)prl_bus_msg_frame(&dec, "route_rows")->data;
    rows[1] = LEN;
    ck_assert_int_eq(train_batch_from_msg(&back, &dec), PRL_ERR_FORMAT);
    assert_msg_has("route_rows: sample 1");
    ck_assert_ptr_null(back.routes);
    rows[1] = ROWS - 1; /* now the bytes do not add up */
    ck_assert_int_eq(train_batch_from_msg(&back, &dec), PRL_ERR_FORMAT);
    assert_msg_has("routes:");
    rows[1] = ROWS;
    assert_ok(train_batch_from_msg(&back, &dec));
    prl_grpo_batch_free(&back);
    /* one frame without the other; a missing shape field; a bad width */
    prl_bus_msg part;
    prl_grpo_batch plain;
    equal_batch(&plain);
    assert_ok(train_to_msg(&plain, NULL, &part));
    assert_ok(prl_bus_msg_add_frame(&part, "routes", PRL_BUS_U8, f.b.routes, f.b.routes_bytes));
    ck_assert_int_eq(train_batch_from_msg(&back, &part), PRL_ERR_FORMAT);
    assert_msg_has("route_rows");
    assert_ok(prl_bus_msg_add_frame(&part, "route_rows", PRL_BUS_I32, f.b.route_rows, NS));
    ck_assert_int_ne(train_batch_from_msg(&back, &part), PRL_OK);
    assert_msg_has("route_moe");
    assert_ok(prl_bus_msg_set_uint(&part, "route_moe", (uint64_t)f.m.n_moe));
    assert_ok(prl_bus_msg_set_uint(&part, "route_k", 2));
    assert_ok(prl_bus_msg_set_uint(&part, "route_width", 3));
    ck_assert_int_eq(train_batch_from_msg(&back, &part), PRL_ERR_FORMAT);
    assert_msg_has("route_width 3");
    prl_bus_msg_free(&part), prl_grpo_batch_free(&plain);
    prl_bus_wire_free(&w);
    prl_bus_msg_free(&dec), prl_bus_msg_free(&msg);
    fixture_free(&f);
}
END_TEST

/* A record with a repeated id is rejected for its sample (counted; the sample routes natively),
** and a record of another shape than the model's is an error under R3. */
START_TEST(test_trainer_rejects_records)
{
    fixture f;
    fixture_init(&f, shifted);
    f.b.routes[(size_t)ROWS * f.m.n_moe * 2 + 1] =
        f.b.routes[(size_t)ROWS * f.m.n_moe * 2]; /* sample 1 */
    prl_grpo_step_stats st = run_step(&f.b, PRL_REPLAY_R3, 0.5, NULL);
    ck_assert_int_eq(st.route_rejected, 1);
    ck_assert_int_eq(st.route_records, NS - 1);
    ck_assert_double_eq_tol(st.route_replayed[0], (NS - 1.0) / NS, 1e-12);
    f.b.route_k = 1; /* shape [n_moe][1]: bytes still add up with 2 × rows */
    for (int i = 0; i < NS; i++) f.b.route_rows[i] = ROWS; /* unchanged */
    f.b.routes_bytes = (size_t)NS * ROWS * f.m.n_moe * 1;
    prl_model m2;
    sharp_micro_model(&m2, 11);
    prl_optim o;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    assert_ok(prl_optim_init(&o, &m2, &oc));
    prl_grpo_train_config c;
    prl_grpo_train_config_default(&c);
    c.replay_mode = PRL_REPLAY_R3;
    ck_assert_int_eq(prl_grpo_train_step(&m2, &o, &f.b, &c, &st), PRL_ERR_RANGE);
    assert_msg_has("replay.mode r3");
    c.replay_mode = PRL_REPLAY_NONE; /* mode none ignores them */
    assert_ok(prl_grpo_train_step(&m2, &o, &f.b, &c, &st));
    ck_assert_int_eq(st.route_records, 0);
    prl_optim_free(&o);
    prl_model_free(&m2);
    fixture_free(&f);
}
END_TEST

/* The job keys: defaults, the trainer's config from them, errors naming the key. */
START_TEST(test_job_keys)
{
    prl_job_config j;
    assert_ok(prl_job_config_default(&j));
    ck_assert_str_eq(j.replay_mode, "none");
    ck_assert_int_eq(j.replay_cached, 0);
    assert_ok(prl_job_config_set(&j, "replay.mode=masked_r3"));
    assert_ok(prl_job_config_set(&j, "replay.tau=1.0"));
    assert_ok(prl_job_config_set(&j, "replay.cached=true"));
    prl_grpo_train_config c;
    assert_ok(prl_grpo_train_config_from_job(&c, &j));
    ck_assert_int_eq(c.replay_mode, PRL_REPLAY_MASKED_R3);
    ck_assert_double_eq(c.replay_tau, 1.0);
    ck_assert_double_eq(c.entropy_alarm, 0.5);
    ck_assert_int_eq(j.replay_cached, 1);
    ck_assert_int_eq(prl_job_config_set(&j, "replay.mode=r4"), PRL_ERR_CONFIG);
    assert_msg_has("replay.mode");
    ck_assert_int_eq(prl_job_config_set(&j, "replay.tau=3"), PRL_ERR_CONFIG);
    assert_msg_has("replay.tau");
    ck_assert_int_eq(prl_job_config_set(&j, "replay.entropy_alarm=-0.1"), PRL_ERR_CONFIG);
    assert_msg_has("replay.entropy_alarm");
    c.replay_tau = -1;
    ck_assert_int_eq(prl_grpo_train_config_check(&c), PRL_ERR_CONFIG);
    assert_msg_has("replay.tau");
    prl_job_config_free(&j);
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
    tcase_add_test(tc, test_job_keys);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("trainer");
    tcase_set_timeout(tr, 120);
    tcase_add_test(tr, test_routes_frame);
    tcase_add_test(tr, test_trainer_r3_overlap_one);
    tcase_add_test(tr, test_trainer_masked_share);
    tcase_add_test(tr, test_trainer_r2_keeps_old_routes);
    tcase_add_test(tr, test_trainer_none_is_unchanged);
    tcase_add_test(tr, test_trainer_rejects_records);
    suite_add_tcase(s, tr);
    return s;
}

int main(void) { return check_run(replay_suite()); }
