/*
** test_msg.c — the message homes of roles/msg/ (docs/protocol.md "Message types"): the
** registry, and for the types whose decoder checks more than the codec does (work, result,
** hello, error, taught, exec, score's token ids, fetch, chunk) a round trip through the wire codec and each rule refused by
** name. The batch messages (train, teach) are tested with their batches' rules in
** test_grpo_trainer.c, test_opd.c and test_replay.c.
*/
#include "tests/check_util.h"
#include "roles/msg/msg.h"

#include <math.h>
#include <string.h>

/* m through the wire codec (encode, decode with the registry) into *out; m is freed. */
static void wire(prl_bus_msg *m, prl_bus_msg *out)
{
    prl_bus_wire w;
    char why[256];
    assert_ok(prl_bus_encode(m, &w));
    ck_assert_msg(prl_bus_decode(prl_msg_registry(), w.parts, w.n, out, why, sizeof why) == PRL_OK,
                  "%s", why);
    prl_bus_wire_free(&w);
    prl_bus_msg_free(m);
}

/* Weights over the bus: fetch and chunk round trips; an unknown file, a length out of
** 1..PRL_MSG_CHUNK_MAX and bytes past the file's size are refused by name. */
START_TEST(test_fetch_chunk)
{
    prl_bus_msg m, got;
    prl_msg_fetch f = {.version = 3,
                       .file = "model.safetensors",
                       .offset = 1 << 20,
                       .length = 4096};
    assert_ok(prl_msg_fetch_encode(&f, "run-t", 1, &m));
    wire(&m, &got);
    prl_msg_fetch fx;
    assert_ok(prl_msg_fetch_decode(&got, &fx));
    ck_assert_uint_eq(fx.version, 3);
    ck_assert_uint_eq(fx.offset, 1 << 20);
    ck_assert_uint_eq(fx.length, 4096);
    ck_assert_str_eq(fx.file, "model.safetensors");
    prl_bus_msg_free(&got);
    const char *bad_file[] = {"../etc/passwd", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        prl_msg_fetch b = f;
        b.file = bad_file[i];
        assert_ok(prl_msg_fetch_encode(&b, "run-t", 2, &m));
        ck_assert_int_ne(prl_msg_fetch_decode(&m, &fx), PRL_OK);
        ck_assert_ptr_nonnull(strstr(prl_error_message(), "is not one of"));
        prl_bus_msg_free(&m);
    }
    uint64_t lens[] = {0, PRL_MSG_CHUNK_MAX + 1};
    for (int i = 0; i < 2; i++) {
        prl_msg_fetch b = f;
        b.length = lens[i];
        assert_ok(prl_msg_fetch_encode(&b, "run-t", 3, &m));
        ck_assert_int_ne(prl_msg_fetch_decode(&m, &fx), PRL_OK);
        ck_assert_ptr_nonnull(strstr(prl_error_message(), "length"));
        prl_bus_msg_free(&m);
    }
    const char data[5] = "abcde";
    prl_msg_chunk c = {.ref = 9,
                       .version = 3,
                       .file = "config.json",
                       .offset = 10,
                       .size = 15,
                       .sum = prl_checksum64(data, 5, 0),
                       .ckpt_checksum = 0x1234,
                       .data = data,
                       .len = 5};
    assert_ok(prl_msg_chunk_encode(&c, "run-t", 4, &m));
    wire(&m, &got);
    prl_msg_chunk cx;
    assert_ok(prl_msg_chunk_decode(&got, &cx));
    ck_assert_uint_eq(cx.ref, 9);
    ck_assert_uint_eq(cx.size, 15);
    ck_assert_uint_eq(cx.len, 5);
    ck_assert_uint_eq(cx.sum, c.sum);
    ck_assert_uint_eq(cx.ckpt_checksum, 0x1234);
    ck_assert(memcmp(cx.data, data, 5) == 0);
    prl_bus_msg_free(&got);
    c.size = 12; /* 5 bytes at 10 pass a 12-byte file */
    assert_ok(prl_msg_chunk_encode(&c, "run-t", 5, &m));
    ck_assert_int_ne(prl_msg_chunk_decode(&m, &cx), PRL_OK);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "pass the size"));
    prl_bus_msg_free(&m);
}
END_TEST

START_TEST(test_registry)
{
    const prl_bus_registry *r = prl_msg_registry();
    ck_assert_int_eq(r->n, 19);
    for (int i = 0; i < r->n; i++) {
        ck_assert_ptr_eq(prl_msg_spec(r->types[i]->type), r->types[i]);
        for (int j = 0; j < i; j++) ck_assert_str_ne(r->types[i]->type, r->types[j]->type);
    }
    ck_assert_ptr_null(prl_msg_spec("nosuch"));
}
END_TEST

/* ---------------------------------------------------------------- result ----------- */

static const int32_t tok[5] = {4, 9, 17, 30, 2};
static float lp[2] = {-0.7f, -1.2f};
static uint8_t mask[2] = {1, 0};
static const uint8_t routes[8] = {0, 1, 1, 2, 2, 3, 3, 0}; /* 4 rows of 1 layer × 2 ids */

static prl_msg_result result_of(json_t *turns)
{
    return (prl_msg_result){.lease = 10,
                            .step = 11,
                            .prompt = 12,
                            .sample = 1,
                            .prompt_len = 3,
                            .gen_us = 5,
                            .tokens = tok,
                            .n_tokens = 5,
                            .logprobs = lp,
                            .mask = mask,
                            .routes = routes,
                            .routes_bytes = 8,
                            .route_shape = {4, 1, 2, 1},
                            .turns = turns,
                            .truncated = 1,
                            .turns_played = 2};
}

/* The decoder's verdict on x after the wire: PRL_OK with *y filled, or the error. */
static prl_status result_trip(const prl_msg_result *x, prl_bus_msg *d, prl_msg_result *y)
{
    prl_bus_msg m;
    assert_ok(prl_msg_result_encode(x, "r", 1, &m));
    wire(&m, d);
    return prl_msg_result_decode(d, y);
}

START_TEST(test_result)
{
    prl_chat_message turn = {"assistant", "- a"};
    json_t *turns = prl_msg_turns_json(&turn, 1);
    prl_msg_result x = result_of(turns), y;
    prl_bus_msg d;
    assert_ok(result_trip(&x, &d, &y));
    ck_assert(y.lease == 10 && y.step == 11 && y.prompt == 12 && y.sample == 1);
    ck_assert(y.prompt_len == 3 && y.n_tokens == 5 && y.truncated == 1 && y.turns_played == 2);
    ck_assert_mem_eq(y.tokens, tok, sizeof tok);
    ck_assert(y.logprobs[1] == -1.2f && y.mask[0] == 1 && y.mask[1] == 0);
    ck_assert(y.routes && y.routes_bytes == 8 && y.route_shape.rows == 4 && !y.routes_dropped[0]);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(y.turns, 0), "content")),
                     "- a");
    ck_assert(!y.has_reward);
    prl_msg_result_free(&y), prl_bus_msg_free(&d);
    /* a gateway episode's posted reward travels in meta; outside [0, 1] neither end takes it */
    x.has_reward = 1, x.reward = 0.75;
    assert_ok(result_trip(&x, &d, &y));
    ck_assert(y.has_reward && y.reward == 0.75);
    prl_msg_result_free(&y), prl_bus_msg_free(&d);
    x.reward = 1.5;
    prl_bus_msg m;
    ck_assert_int_eq(prl_msg_result_encode(&x, "r", 9, &m), PRL_ERR_FORMAT);
    assert_msg_has("meta 'reward'");
    x.has_reward = 0;
    /* a route record whose shape does not fit: the sample stays, its routes go */
    x.route_shape.rows = 5; /* 5 rows of a 5-token sample: at most tokens - 1 */
    assert_ok(result_trip(&x, &d, &y));
    ck_assert_ptr_null(y.routes);
    ck_assert_ptr_nonnull(strstr(y.routes_dropped, "5 rows for 5 tokens"));
    prl_msg_result_free(&y), prl_bus_msg_free(&d);
    /* each value rule, named */
    struct {
        const char *want;
        float lp1;
        uint8_t mask1;
        int plen;
    } bad[] = {
        {"response token 1 has log-prob 0.5", 0.5f, 0, 3},
        {"response token 1 has log-prob nan", NAN, 0, 3},
        {"response token 1 has log-prob -1.2 and mask 2", -1.2f, 2, 3},
        {"prompt_len 5 must be in [1, 5)", -1.2f, 0, 5},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        lp[1] = bad[k].lp1, mask[1] = bad[k].mask1;
        x = result_of(turns);
        x.prompt_len = bad[k].plen;
        prl_bus_msg m;
        if (bad[k].plen == 5) { /* the encoder sends what it is given: a hand-made frame set */
            assert_ok(prl_bus_msg_init(&m, prl_msg_spec("result"), "r", 1));
            const char *u[] = {"lease", "step", "prompt", "sample", "policy_version", "prompt_len"};
            for (int i = 0; i < 6; i++) assert_ok(prl_bus_msg_set_uint(&m, u[i], i == 5 ? 5 : 1));
            assert_ok(prl_bus_msg_add_frame(&m, "tokens", PRL_BUS_I32, tok, 5));
            assert_ok(prl_bus_msg_add_frame(&m, "logprobs", PRL_BUS_F32, lp, 0));
            wire(&m, &d);
            ck_assert_int_eq(prl_msg_result_decode(&d, &y), PRL_ERR_FORMAT);
        } else {
            ck_assert_int_eq(result_trip(&x, &d, &y), PRL_ERR_FORMAT);
        }
        assert_msg_has("result: ");
        assert_msg_has(bad[k].want);
        ck_assert_ptr_null(y.meta); /* left empty */
        prl_bus_msg_free(&d);
    }
    lp[1] = -1.2f, mask[1] = 0;
    json_decref(turns);
}
END_TEST

/* ---------------------------------------------------------------- session, work ---- */

START_TEST(test_hello_error_work)
{
    prl_bus_msg m, d;
    prl_msg_hello h = {.role = "judge", .worker = "judge-0", .pid = 7}, hy;
    assert_ok(prl_msg_hello_encode(&h, "-", 1, &m));
    wire(&m, &d);
    ck_assert_int_eq(prl_msg_hello_decode(&d, &hy), PRL_ERR_FORMAT);
    assert_msg_has("hello: unknown role 'judge'");
    prl_bus_msg_free(&d);
    /* slots: absent is 1; a gateway says how many leases it takes; 0 and > 4096 refused */
    h.role = "gateway", h.slots = 12;
    assert_ok(prl_msg_hello_encode(&h, "-", 1, &m));
    wire(&m, &d);
    assert_ok(prl_msg_hello_decode(&d, &hy));
    ck_assert(hy.slots == 12 && !strcmp(hy.role, "gateway"));
    prl_bus_msg_free(&d);
    h.role = "rollout", h.slots = 0;
    assert_ok(prl_msg_hello_encode(&h, "-", 1, &m));
    wire(&m, &d);
    assert_ok(prl_msg_hello_decode(&d, &hy));
    ck_assert(hy.slots == 1);
    prl_bus_msg_free(&d);
    assert_ok(prl_bus_msg_init(&m, prl_msg_spec("hello"), "-", 1));
    assert_ok(prl_bus_msg_set_str(&m, "role", "gateway"));
    assert_ok(prl_bus_msg_set_str(&m, "worker", "gateway-0"));
    assert_ok(prl_bus_msg_set_uint(&m, "slots", 5000));
    wire(&m, &d);
    ck_assert_int_eq(prl_msg_hello_decode(&d, &hy), PRL_ERR_FORMAT);
    assert_msg_has("'slots' = 5000");
    prl_bus_msg_free(&d);
    /* error: ref always travels, lease only with has_lease (0 is a value then) */
    for (int with = 0; with < 2; with++) {
        prl_msg_error e = {.reason = "bad\nline", .ref = 0, .lease = 0, .has_lease = with}, ey;
        assert_ok(prl_msg_error_encode(&e, "r", 2, &m));
        wire(&m, &d);
        assert_ok(prl_msg_error_decode(&d, &ey));
        ck_assert_str_eq(ey.reason, "bad line"); /* control characters become spaces */
        ck_assert(ey.ref == 0 && ey.has_lease == with);
        uint64_t ref;
        assert_ok(prl_bus_msg_get_uint(&d, "ref", &ref));
        prl_bus_msg_free(&d);
    }
    /* work: the sample count and the task */
    prl_msg_work w = {.lease = 1,
                      .step = 2,
                      .prompt = 3,
                      .count = 2000,
                      .path = "ckpt",
                      .task = "{\"id\": \"t\"}"},
                 wy;
    assert_ok(prl_msg_work_encode(&w, "r", 3, &m));
    wire(&m, &d);
    ck_assert_int_ne(prl_msg_work_decode(&d, &wy), PRL_OK);
    assert_msg_has("count 2000 must be in 1..1024");
    prl_bus_msg_free(&d);
    w.count = 4, w.task = "[1]";
    assert_ok(prl_msg_work_encode(&w, "r", 4, &m));
    wire(&m, &d);
    ck_assert_int_eq(prl_msg_work_decode(&d, &wy), PRL_ERR_FORMAT);
    assert_msg_has("frame 'task' is not a JSON object");
    prl_bus_msg_free(&d);
    w.task = "{\"id\": \"t\"}";
    assert_ok(prl_msg_work_encode(&w, "r", 5, &m));
    wire(&m, &d);
    assert_ok(prl_msg_work_decode(&d, &wy));
    ck_assert(wy.count == 4 && !strcmp(wy.path, "ckpt"));
    ck_assert_str_eq(json_string_value(json_object_get(wy.task_json, "id")), "t");
    prl_msg_work_free(&wy), prl_bus_msg_free(&d);
}
END_TEST

/* ---------------------------------------------------------------- taught ----------- */

/* A teach item of two samples (prompt 2 + response 3, prompt 1 + response 2); response token
** 3 (sample 1's first) is an observation. */
static void item_of(prl_grpo_batch *b)
{
    assert_ok(prl_grpo_batch_init(b, 2, 8, 5));
    const int32_t t[8] = {5, 6, 7, 8, 9, 10, 11, 12}, off[3] = {0, 5, 8}, pl[2] = {2, 1};
    const uint8_t mk[5] = {1, 1, 1, 0, 1};
    memcpy(b->tokens, t, sizeof t), memcpy(b->offsets, off, sizeof off);
    memcpy(b->prompt_lens, pl, sizeof pl), memcpy(b->mask, mk, sizeof mk);
    for (int i = 0; i < 5; i++) b->logprobs[i] = -1;
}

START_TEST(test_taught_scores)
{
    prl_grpo_batch item;
    item_of(&item);
    float tlp[5] = {-0.5f, -1, -2, NAN, -0.25f}; /* NaN on the observation: not looked at */
    prl_msg_taught x = {.lease = 1,
                        .step = 2,
                        .teacher = "coding",
                        .logprobs = tlp,
                        .n_response = 5},
                   y;
    prl_bus_msg m, d;
    assert_ok(prl_msg_taught_encode(&x, "r", 1, &m));
    wire(&m, &d);
    assert_ok(prl_msg_taught_decode(&d, &y));
    ck_assert_int_eq(y.teacher_index, prl_opd_teacher_index("coding"));
    prl_opd_batch sc;
    assert_ok(prl_msg_taught_scores(&y, &item, 0, &sc));
    ck_assert(sc.teacher[0] == y.teacher_index && sc.teacher[1] == y.teacher_index);
    ck_assert(sc.teacher_lp[4] == -0.25f);
    prl_opd_batch_free(&sc);
    /* the job's opd.topk must match the answer's frames */
    ck_assert_int_eq(prl_msg_taught_scores(&y, &item, 2, &sc), PRL_ERR_FORMAT);
    assert_msg_has("with opd.topk 2");
    ck_assert_ptr_null(sc.teacher_lp);
    prl_bus_msg_free(&d);
    /* a loss token's log-prob > 0: the trainer's rule, named */
    tlp[1] = 0.5f;
    assert_ok(prl_msg_taught_encode(&x, "r", 2, &m));
    wire(&m, &d);
    assert_ok(prl_msg_taught_decode(&d, &y));
    ck_assert_int_eq(prl_msg_taught_scores(&y, &item, 0, &sc), PRL_ERR_FORMAT);
    assert_msg_has("sample 0 response token 1 has log-prob 0.5");
    prl_bus_msg_free(&d);
    /* an unknown teacher key */
    x.teacher = "poetry";
    assert_ok(prl_msg_taught_encode(&x, "r", 3, &m));
    wire(&m, &d);
    ck_assert_int_eq(prl_msg_taught_decode(&d, &y), PRL_ERR_FORMAT);
    assert_msg_has("unknown teacher key 'poetry'");
    prl_bus_msg_free(&d);
    prl_grpo_batch_free(&item);
}
END_TEST

/* ---------------------------------------------------------------- exec ------------- */

START_TEST(test_exec)
{
    struct {
        const char *lang;
        uint64_t wall_ms;
        const char *prog;
        size_t len;
        const char *want;
    } c[] = {
        {"python3", 2000, "print(1)", 8, NULL},
        {"ruby", 2000, "puts 1", 6, "exec: field 'lang': unknown language 'ruby'"},
        {"sh", 0, "echo", 4, "field 'wall_ms': 0 is not in 1..3600000"},
        {"sh", 3600001, "echo", 4, "field 'wall_ms': 3600001"},
        {"sh", 100, "", 0, "frame 'program' is empty"},
        {"sh", 100, "ec\0ho", 5, "frame 'program' contains a NUL byte"},
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        prl_msg_exec x = {.lang = c[k].lang,
                          .wall_ms = c[k].wall_ms,
                          .program = c[k].prog,
                          .program_len = c[k].len,
                          .stdin_data = "in",
                          .stdin_len = 2},
                     y;
        prl_bus_msg m, d;
        assert_ok(prl_msg_exec_encode(&x, "r", 1, &m));
        wire(&m, &d);
        prl_status rc = prl_msg_exec_decode(&d, &y);
        if (!c[k].want) {
            assert_ok(rc);
            ck_assert(y.program_len == 8 && !memcmp(y.program, "print(1)", 8) && y.stdin_len == 2);
        } else {
            ck_assert_int_eq(rc, PRL_ERR_FORMAT);
            assert_msg_has(c[k].want);
            ck_assert_ptr_null(y.lang);
        }
        prl_bus_msg_free(&d);
    }
}
END_TEST

/* ---------------------------------------------------------------- score ------------ */

/* `score` with and without the optional token ids (sent for reward programs), and the rules
** on them: prompt_len in 1..n, ids >= 0; `work`'s eval flag round trip. */
START_TEST(test_score_tokens_and_work_eval)
{
    int32_t ids[4] = {5, 6, 7, 8};
    prl_msg_score x = {.lease = 1,
                       .step = 2,
                       .prompt = 3,
                       .sample = 0,
                       .task = "{}",
                       .turns = "[{\"role\": \"assistant\", \"content\": \"hi\"}]"};
    for (int with = 0; with < 2; with++) {
        if (with) x.tokens = ids, x.n_tokens = 4, x.prompt_len = 3;
        prl_bus_msg m, d;
        assert_ok(prl_msg_score_encode(&x, "r", 1, &m));
        wire(&m, &d);
        prl_msg_score y;
        assert_ok(prl_msg_score_decode(&d, &y));
        ck_assert_uint_eq(y.n_tokens, with ? 4 : 0);
        ck_assert_int_eq(y.prompt_len, with ? 3 : 0);
        if (with) ck_assert_int_eq(y.tokens[3], 8);
        prl_msg_score_free(&y);
        prl_bus_msg_free(&d);
    }
    int bad_len[2] = {0, 5};
    for (int i = 0; i < 3; i++) {
        prl_bus_msg m, d;
        x.tokens = ids, x.n_tokens = 4, x.prompt_len = i < 2 ? bad_len[i] : 2;
        ids[1] = i == 2 ? -1 : 6;
        assert_ok(prl_msg_score_encode(&x, "r", 1, &m));
        wire(&m, &d);
        prl_msg_score y;
        ck_assert_int_eq(prl_msg_score_decode(&d, &y), PRL_ERR_FORMAT);
        assert_msg_has(i < 2 ? "prompt_len" : "frame 'tokens'");
        prl_bus_msg_free(&d);
    }
    for (int e = 0; e < 2; e++) {
        prl_msg_work w =
            {.lease = 1, .step = 2, .prompt = 3, .count = 1, .path = "p", .task = "{}", .eval = e};
        prl_bus_msg m, d;
        assert_ok(prl_msg_work_encode(&w, "r", 1, &m));
        wire(&m, &d);
        prl_msg_work y;
        assert_ok(prl_msg_work_decode(&d, &y));
        ck_assert_int_eq(y.eval, e);
        prl_msg_work_free(&y);
        prl_bus_msg_free(&d);
    }
}
END_TEST

static Suite *msg_suite(void)
{
    Suite *s = suite_create("msg");
    TCase *tc = tcase_create("homes");
    tcase_add_test(tc, test_registry);
    tcase_add_test(tc, test_result);
    tcase_add_test(tc, test_hello_error_work);
    tcase_add_test(tc, test_taught_scores);
    tcase_add_test(tc, test_exec);
    tcase_add_test(tc, test_fetch_chunk);
    tcase_add_test(tc, test_score_tokens_and_work_eval);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(msg_suite()); }
