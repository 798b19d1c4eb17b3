/*
** test_bus.c — Check tests for bus/: round trips of every registered message type, one
** rejected message per validation rule (the expected reason is checked), the encoder's
** refusals, a fuzz of 10,000 random and 10,000 mutated messages through the decoder, and
** ROUTER/DEALER exchanges over ipc:// (in a fresh temp dir) and loopback tcp:// with
** garbage interleaved, plus the receive timeout and the endpoint policy.
*/
#include "bus/bus.h"
#include "tests/bus_fuzz.h"
#include "tests/check_util.h"

#include <check.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

/* ---------------------------------------------------------------- helpers ---------- */

static json_t *wc_header(const wcopy *c)
{
    json_t *h = json_loadb((const char *)c->buf[1], c->len[1], 0, NULL);
    ck_assert_ptr_nonnull(h);
    return h;
}

static void expect_reject(const wcopy *c, const char *want)
{
    prl_bus_msg out;
    char reason[512];
    prl_status st = wc_decode(c, &out, reason, sizeof reason);
    ck_assert_msg(st != PRL_OK, "accepted a message that should fail with '%s'", want);
    ck_assert_msg(strstr(reason, want), "reason '%s' does not contain '%s'", reason, want);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), want));
    ck_assert_ptr_null(out.fields);
}

/* A valid "result" message with tokens, logprobs and one extra frame. */
static void result_wire(wcopy *c)
{
    prl_bus_msg m;
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("result"), "run-7", 42), PRL_OK);
    const char *keys[] = {"lease", "step", "prompt", "sample", "policy_version"};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(prl_bus_msg_set_uint(&m, keys[i], 10 + i), PRL_OK);
    int32_t tok[4] = {1, 2, 3, 4};
    float lp[4] = {-0.5f, -1.0f, -0.25f, -2.0f};
    unsigned char routes[6] = {1, 2, 3, 4, 5, 6};
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "tokens", PRL_BUS_I32, tok, 4), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "logprobs", PRL_BUS_F32, lp, 4), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "routes", PRL_BUS_U8, routes, 6), PRL_OK);
    wc_from_msg(c, &m);
    prl_bus_msg_free(&m);
}

/* A valid "weights" announcement. */
static void make_weights(prl_bus_msg *m, const char *run, uint64_t id, uint64_t version,
                         uint64_t sum, const char *path)
{
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("weights"), run, id), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_uint(m, "version", version), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_hex64(m, "ckpt_checksum", sum), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_str(m, "path", path), PRL_OK);
}

/* ---------------------------------------------------------------- round trips ------ */

START_TEST(test_roundtrip_every_type)
{
    prl_rng r;
    prl_rng_init(&r, 1, 0, 0, 0, PRL_RNG_TEST);
    ck_assert_int_ge(prl_msg_registry()->n, 8);
    for (int i = 0; i < prl_msg_registry()->n; i++) {
        for (int all = 0; all < 2; all++) {
            prl_bus_msg m, out;
            make_msg(&m, prl_msg_registry()->types[i]->type, &r, all, all ? 3 : 0);
            wcopy c;
            wc_from_msg(&c, &m);
            char reason[256];
            ck_assert_msg(wc_decode(&c, &out, reason, sizeof reason) == PRL_OK, "%s: %s", m.type,
                          reason);
            ck_assert_msg(prl_bus_msg_equal(&m, &out), "type %s differs after a round trip",
                          m.type);
            prl_bus_msg_free(&out);
            prl_bus_msg_free(&m);
            wc_free(&c);
        }
    }
}
END_TEST

START_TEST(test_accessors)
{
    prl_bus_msg m;
    make_weights(&m, "run-x", 9, 3, 0x0123456789abcdefULL, "runs/r/ckpt-3");
    wcopy c;
    wc_from_msg(&c, &m);
    prl_bus_msg out;
    ck_assert_int_eq(wc_decode(&c, &out, NULL, 0), PRL_OK);
    uint64_t v, h, id;
    const char *path, *run;
    ck_assert_int_eq(prl_bus_msg_get_uint(&out, "version", &v), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_get_uint(&out, "id", &id), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_get_hex64(&out, "ckpt_checksum", &h), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_get_str(&out, "path", &path), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_get_str(&out, "run", &run), PRL_OK);
    ck_assert_uint_eq(v, 3);
    ck_assert_uint_eq(id, 9);
    ck_assert(h == 0x0123456789abcdefULL);
    ck_assert_str_eq(path, "runs/r/ckpt-3");
    ck_assert_str_eq(run, "run-x");
    ck_assert_int_eq(prl_bus_msg_get_uint(&out, "path", &v), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "no uint field 'path'"));
    ck_assert_ptr_null(prl_bus_msg_frame(&out, "tokens"));
    prl_bus_msg_free(&out);
    prl_bus_msg_free(&m);
    prl_bus_msg_free(&m); /* a freed message is zeroed: freeing again is harmless */
    wc_free(&c);
}
END_TEST

/* ---------------------------------------------------------------- encoder ---------- */

START_TEST(test_encoder_refuses)
{
    prl_bus_msg m;
    ck_assert_ptr_null(prl_msg_spec("nosuch"));
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("nosuch"), "r", 1), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "type is not registered"));
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("work"), "", 1), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'run' must be a string"));
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("work"), "r", 1), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_uint(&m, "stpe", 1), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'stpe' is not part of message type 'work'"));
    ck_assert_int_eq(prl_bus_msg_set_uint(&m, "v", 2), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'v' is reserved"));
    ck_assert_int_eq(prl_bus_msg_set_str(&m, "step", "3"), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'step' of type 'work' is a uint field"));
    ck_assert_int_eq(prl_bus_msg_set_uint(&m, "step", UINT64_MAX), PRL_ERR_RANGE);
    ck_assert_int_eq(prl_bus_msg_set_str(&m, "task", "a\nb"), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "bad name", PRL_BUS_I32, NULL, 0), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "x", (prl_bus_dtype)7, NULL, 0), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "x", PRL_BUS_U8, NULL, 0), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "x", PRL_BUS_U8, NULL, 0), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "frame 'x' is already"));
    prl_bus_wire w;
    ck_assert_int_eq(prl_bus_encode(&m, &w), PRL_ERR_ARG); /* lease, step... missing */
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "header field 'lease' is missing"));
    prl_bus_msg_free(&m);

    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("result"), "r", 1), PRL_OK);
    const char *keys[] = {"lease", "step", "prompt", "sample", "policy_version"};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(prl_bus_msg_set_uint(&m, keys[i], 1), PRL_OK);
    int32_t tok[2] = {5, 6};
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "tokens", PRL_BUS_I32, tok, 2), PRL_OK);
    ck_assert_int_eq(prl_bus_encode(&m, &w), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "frame 'logprobs' is missing"));
    ck_assert_int_eq(prl_bus_msg_add_frame(&m, "logprobs", PRL_BUS_I32, tok, 2), PRL_OK);
    ck_assert_int_eq(prl_bus_encode(&m, &w), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "frame 'logprobs' has dtype i32"));
    prl_bus_msg_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- validation rules - */

typedef void (*edit_fn)(wcopy *c);

static void e_one_frame(wcopy *c)
{
    while (c->n > 1) wc_remove(c, c->n - 1);
}
static void e_no_frames(wcopy *c)
{
    while (c->n > 0) wc_remove(c, c->n - 1);
}
static void e_too_many(wcopy *c)
{
    while (c->n <= PRL_BUS_MAX_PARTS) wc_insert(c, c->n, "x", 1);
}
static void e_type_empty(wcopy *c) { wc_set(c, 0, "", 0); }
static void e_type_upper(wcopy *c) { wc_set(c, 0, "RESULT", 6); }
static void e_type_long(wcopy *c) { wc_set(c, 0, "resultresultresult", 18); }
static void e_type_unknown(wcopy *c) { wc_set(c, 0, "bogus", 5); }
static void e_hdr_empty(wcopy *c) { wc_set(c, 1, "", 0); }
static void e_hdr_notjson(wcopy *c) { wc_set(c, 1, "{\"v\":1,", 7); }
static void e_hdr_array(wcopy *c) { wc_set(c, 1, "[1,2]", 5); }
static void e_hdr_nul(wcopy *c) { wc_set(c, 1, "{\"v\":1}\0", 8); }
static void e_hdr_dupkey(wcopy *c) { wc_set(c, 1, "{\"v\":1,\"v\":1}", 13); }
static void e_hdr_huge(wcopy *c)
{
    size_t n = PRL_BUS_MAX_HEADER_BYTES + 10;
    char *s = malloc(n);
    memset(s, ' ', n);
    s[0] = '{';
    s[n - 1] = '}';
    wc_set(c, 1, s, n);
    free(s);
}
static void e_hdr_deep(wcopy *c)
{
    size_t d = 30000;
    char *s = malloc(2 * d);
    memset(s, '[', d);
    memset(s + d, ']', d);
    wc_set(c, 1, s, 2 * d);
    free(s);
}

#define HDR_EDIT(fn, fix, body)                                                                    \
    static void fn(wcopy *c)                                                                       \
    {                                                                                              \
        json_t *h = wc_header(c);                                                                  \
        json_t *fr = json_object_get(h, "frames");                                                 \
        (void)fr;                                                                                  \
        body;                                                                                      \
        wc_put_header(c, h, fix);                                                                  \
    }

HDR_EDIT(e_v_missing, 0, json_object_del(h, "v"))
HDR_EDIT(e_v_string, 0, json_object_set_new(h, "v", json_string("1")))
HDR_EDIT(e_v_two, 0, json_object_set_new(h, "v", json_integer(2)))
HDR_EDIT(e_type_field_int, 0, json_object_set_new(h, "type", json_integer(3)))
HDR_EDIT(e_type_differs, 0, json_object_set_new(h, "type", json_string("work")))
HDR_EDIT(e_frames_obj, 0, json_object_set_new(h, "frames", json_object()))
HDR_EDIT(e_frame_extra_key, 0, json_object_set_new(json_array_get(fr, 0), "x", json_true()))
HDR_EDIT(e_frame_bad_name, 0,
         json_object_set_new(json_array_get(fr, 0), "name", json_string("a b")))
HDR_EDIT(e_frame_bad_dtype, 0,
         json_object_set_new(json_array_get(fr, 0), "dtype", json_string("f64")))
HDR_EDIT(e_frame_neg_count, 0,
         json_object_set_new(json_array_get(fr, 0), "count", json_integer(-1)))
HDR_EDIT(e_frame_count_real, 0, json_object_set_new(json_array_get(fr, 0), "count", json_real(4.0)))
HDR_EDIT(e_frame_count_diff, 0,
         json_object_set_new(json_array_get(fr, 0), "count", json_integer(5)))
HDR_EDIT(e_frame_dup_name, 0,
         json_object_set_new(json_array_get(fr, 1), "name", json_string("tokens")))
HDR_EDIT(e_sum_bad_hex, 0, json_object_set_new(h, "checksum", json_string("0123456789ABCDEF")))
HDR_EDIT(e_sum_int, 0, json_object_set_new(h, "checksum", json_integer(5)))
HDR_EDIT(e_unknown_field, 1, json_object_set_new(h, "stpe", json_integer(1)))
HDR_EDIT(e_missing_step, 1, json_object_del(h, "step"))
HDR_EDIT(e_neg_step, 1, json_object_set_new(h, "step", json_integer(-3)))
HDR_EDIT(e_str_step, 1, json_object_set_new(h, "step", json_string("3")))
HDR_EDIT(e_real_step, 1, json_object_set_new(h, "step", json_real(3.5)))
HDR_EDIT(e_missing_run, 1, json_object_del(h, "run"))
HDR_EDIT(e_missing_id, 1, json_object_del(h, "id"))
HDR_EDIT(e_empty_run, 1, json_object_set_new(h, "run", json_string("")))
HDR_EDIT(e_ctrl_run, 1, json_object_set_new(h, "run", json_string("a\tb")))
HDR_EDIT(e_logprobs_i32, 1, json_object_set_new(json_array_get(fr, 1), "dtype", json_string("i32")))
HDR_EDIT(
    e_many_keys, 1, for (int k = 0; k < 40; k++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", k);
        json_object_set_new(h, key, json_integer(k));
    })

static void e_payload_flip(wcopy *c) { c->buf[2][1] ^= 0x10; }
static void e_payload_trunc(wcopy *c) { c->len[2] -= 1; }
static void e_drop_payload(wcopy *c) { wc_remove(c, c->n - 1); }
static void e_drop_logprobs(wcopy *c)
{
    wc_remove(c, 3);
    json_t *h = wc_header(c);
    json_array_remove(json_object_get(h, "frames"), 1);
    wc_put_header(c, h, 1);
}

static const struct rule {
    const char *name;
    edit_fn edit;
    const char *want;
} rules[] = {
    {"one frame", e_one_frame, "message has 1 frames; at least 2"},
    {"no frames", e_no_frames, "message has 0 frames"},
    {"too many frames", e_too_many, "the limit is 18"},
    {"empty type", e_type_empty, "frame 0 (type) is empty"},
    {"upper-case type", e_type_upper, "frame 0 (type) must be 1..15 bytes of [a-z_]"},
    {"long type", e_type_long, "frame 0 (type) must be 1..15 bytes"},
    {"unknown type", e_type_unknown, "type 'bogus' is not a known message type"},
    {"empty header", e_hdr_empty, "frame 1 (header) is empty"},
    {"header not JSON", e_hdr_notjson, "frame 1 (header) is not valid JSON"},
    {"header an array", e_hdr_array, "frame 1 (header) must be a JSON object"},
    {"header with NUL", e_hdr_nul, "contains a NUL byte"},
    {"duplicate key", e_hdr_dupkey, "duplicate object key"},
    {"huge header", e_hdr_huge, "exceed the limit of 65536"},
    {"deep header", e_hdr_deep, "not valid JSON"},
    {"too many keys", e_many_keys, "the limit is 32"},
    {"v missing", e_v_missing, "header field 'v' (schema version) is missing"},
    {"v string", e_v_string, "header field 'v' must be an integer"},
    {"v = 2", e_v_two, "schema version 2 is not supported"},
    {"type field int", e_type_field_int, "header field 'type' must be a string"},
    {"type differs", e_type_differs, "differs from frame 0"},
    {"frames object", e_frames_obj, "header field 'frames' must be an array"},
    {"frame dropped", e_drop_payload, "header lists 3 frames but the message carries 2"},
    {"frame entry extra key", e_frame_extra_key, "exactly name, dtype, count"},
    {"frame bad name", e_frame_bad_name, "'frames'[0].name must be"},
    {"frame bad dtype", e_frame_bad_dtype, "frame 'tokens': dtype must be one of"},
    {"frame count -1", e_frame_neg_count, "frame 'tokens': count must be a non-negative integer"},
    {"frame count real", e_frame_count_real,
     "frame 'tokens': count must be a non-negative integer"},
    {"frame count differs", e_frame_count_diff,
     "frame 'tokens': header count 5 but the frame holds 4 i32"},
    {"frame bytes", e_payload_trunc,
     "frame 'tokens': 15 bytes is not a multiple of 4 for dtype i32"},
    {"frame name twice", e_frame_dup_name, "frame 'tokens' appears twice"},
    {"checksum upper-case", e_sum_bad_hex, "'checksum' must be 16 lowercase hex digits"},
    {"checksum int", e_sum_int, "'checksum' must be 16 lowercase hex digits"},
    {"payload bit flip", e_payload_flip, "checksum mismatch"},
    {"unknown field", e_unknown_field, "header field 'stpe' is not part of message type 'result'"},
    {"step missing", e_missing_step, "header field 'step' is missing (required by type 'result')"},
    {"step negative", e_neg_step, "header field 'step' must be a non-negative integer"},
    {"step string", e_str_step, "header field 'step' must be a non-negative integer"},
    {"step real", e_real_step, "header field 'step' must be a non-negative integer"},
    {"run missing", e_missing_run, "header field 'run' is missing"},
    {"id missing", e_missing_id, "header field 'id' is missing"},
    {"run empty", e_empty_run, "header field 'run' must be a string of 1..1023 bytes"},
    {"run control char", e_ctrl_run, "header field 'run' must be a string"},
    {"required frame missing", e_drop_logprobs,
     "frame 'logprobs' is missing (required by type 'result')"},
    {"required frame dtype", e_logprobs_i32,
     "frame 'logprobs' has dtype i32; type 'result' requires f32"},
};

START_TEST(test_rule)
{
    const struct rule *r = &rules[_i];
    wcopy c;
    result_wire(&c);
    prl_bus_msg ok;
    ck_assert_int_eq(wc_decode(&c, &ok, NULL, 0), PRL_OK); /* the base message is valid */
    prl_bus_msg_free(&ok);
    r->edit(&c);
    expect_reject(&c, r->want);
    wc_free(&c);
}
END_TEST

START_TEST(test_hex64_field)
{
    prl_bus_msg m;
    make_weights(&m, "r", 1, 1, 0xabcULL, "p");
    wcopy c;
    wc_from_msg(&c, &m);
    json_t *h = wc_header(&c);
    json_object_set_new(h, "ckpt_checksum", json_string("0000000000000ABC"));
    wc_put_header(&c, h, 1);
    expect_reject(&c, "header field 'ckpt_checksum' must be 16 lowercase hex digits");
    h = wc_header(&c);
    json_object_set_new(h, "ckpt_checksum", json_string("abc"));
    wc_put_header(&c, h, 1);
    expect_reject(&c, "header field 'ckpt_checksum' must be 16 lowercase hex digits");
    wc_free(&c);
    prl_bus_msg_free(&m);
}
END_TEST

/* Frame and total size limits, with parts that point into one 64 MiB buffer. */
START_TEST(test_size_limits)
{
    size_t big = PRL_BUS_MAX_FRAME_BYTES;
    unsigned char *buf = calloc(1, big + 4);
    ck_assert_ptr_nonnull(buf);
    json_t *frames = json_array();
    prl_bus_part p[8] = {{"work", 4}, {NULL, 0}};
    for (int i = 0; i < 5; i++) {
        char name[8];
        snprintf(name, sizeof name, "f%d", i);
        json_array_append_new(frames, json_pack("{s:s,s:s,s:I}", "name", name, "dtype", "u8",
                                                "count", (json_int_t)big));
        p[2 + i] = (prl_bus_part){buf, big};
    }
    json_t *h = json_pack("{s:i,s:s,s:s,s:i,s:o,s:s}", "v", 1, "type", "work", "run", "r", "id", 1,
                          "frames", frames, "checksum", "0000000000000000");
    char *text = json_dumps(h, JSON_COMPACT);
    p[1] = (prl_bus_part){text, strlen(text)};
    char reason[256];
    prl_bus_msg out;
    ck_assert_int_eq(prl_bus_decode(prl_msg_registry(), p, 7, &out, reason, sizeof reason),
                     PRL_ERR_FORMAT);
    ck_assert_msg(strstr(reason, "payload frames total 335544320 bytes; the limit is 268435456"),
                  "%s", reason);
    free(text);
    json_array_clear(frames);
    json_array_append_new(frames, json_pack("{s:s,s:s,s:I}", "name", "f", "dtype", "u8", "count",
                                            (json_int_t)big + 4));
    text = json_dumps(h, JSON_COMPACT);
    p[1] = (prl_bus_part){text, strlen(text)};
    p[2] = (prl_bus_part){buf, big + 4};
    ck_assert_int_eq(prl_bus_decode(prl_msg_registry(), p, 3, &out, reason, sizeof reason),
                     PRL_ERR_FORMAT);
    ck_assert_msg(strstr(reason, "frame 'f': 67108868 bytes exceed the limit of 67108864"), "%s",
                  reason);
    free(text);
    json_decref(h);
    free(buf);
}
END_TEST

/* ---------------------------------------------------------------- fuzz ------------- */

/* An accepted message must survive its own re-encoding unchanged. */
static void check_accepted(prl_bus_msg *m)
{
    wcopy c;
    wc_from_msg(&c, m);
    prl_bus_msg again;
    ck_assert_int_eq(wc_decode(&c, &again, NULL, 0), PRL_OK);
    ck_assert(prl_bus_msg_equal(m, &again));
    prl_bus_msg_free(&again);
    wc_free(&c);
}

START_TEST(test_fuzz_random)
{
    prl_rng r;
    prl_rng_init(&r, 2, 0, 0, 0, PRL_RNG_TEST);
    int rejected = 0, accepted = 0;
    for (int it = 0; it < 10000; it++) {
        wcopy c;
        memset(&c, 0, sizeof c);
        c.n = (int)(prl_rng_u64(&r) % (PRL_BUS_MAX_PARTS + 4));
        for (int i = 0; i < c.n; i++) random_part(&r, &c, i);
        prl_bus_msg m;
        char reason[512];
        if (wc_decode(&c, &m, reason, sizeof reason) == PRL_OK) {
            accepted++;
            check_accepted(&m);
            prl_bus_msg_free(&m);
        } else {
            rejected++;
            ck_assert_msg(reason[0] != '\0', "rejected without a reason");
            ck_assert_ptr_null(m.fields);
        }
        wc_free(&c);
    }
    fprintf(stderr, "fuzz random: %d messages, %d rejected with a reason, %d accepted\n",
            rejected + accepted, rejected, accepted);
    ck_assert_int_eq(rejected + accepted, 10000);
    ck_assert_int_eq(rejected, 10000); /* random frames never carry a valid checksum */
}
END_TEST

START_TEST(test_fuzz_mutated)
{
    prl_rng r;
    prl_rng_init(&r, 3, 0, 0, 0, PRL_RNG_TEST);
    int rejected = 0, accepted = 0, benign = 0, by_kind[6] = {0};
    for (int it = 0; it < 10000; it++) {
        prl_bus_msg orig, m;
        const char *type =
            prl_msg_registry()->types[prl_rng_u64(&r) % (uint64_t)prl_msg_registry()->n]->type;
        make_msg(&orig, type, &r, (int)(prl_rng_u64(&r) % 2), (int)(prl_rng_u64(&r) % 3));
        wcopy c;
        wc_from_msg(&c, &orig);
        int kind = (int)(prl_rng_u64(&r) % 6);
        by_kind[kind]++;
        int keeps = mutate(&r, &c, kind);
        char reason[512];
        if (wc_decode(&c, &m, reason, sizeof reason) == PRL_OK) {
            accepted++;
            ck_assert_msg(keeps >= 0, "mutation kind %d was accepted", kind);
            if (keeps) {
                benign++;
                ck_assert_msg(prl_bus_msg_equal(&orig, &m),
                              "a reformatted header changed the message");
            }
            check_accepted(&m);
            prl_bus_msg_free(&m);
        } else {
            rejected++;
            ck_assert_msg(keeps <= 0, "a validity-keeping mutation was rejected: %s", reason);
            ck_assert_msg(reason[0] != '\0', "rejected without a reason");
        }
        wc_free(&c);
        prl_bus_msg_free(&orig);
    }
    fprintf(stderr,
            "fuzz mutated: %d messages (flip %d, truncate %d, drop %d, duplicate %d, header edit "
            "%d, reformat %d): %d rejected with a reason, %d accepted (%d reformatted, equal)\n",
            rejected + accepted, by_kind[0], by_kind[1], by_kind[2], by_kind[3], by_kind[4],
            by_kind[5], rejected, accepted, benign);
    ck_assert_int_eq(benign, by_kind[5]);
    ck_assert_int_gt(rejected, 7000);
}
END_TEST

/* ---------------------------------------------------------------- sockets ---------- */

typedef struct log_sink {
    int n;
    char lines[16][512];
} log_sink;

static void sink_log(void *ctx, const char *line)
{
    log_sink *s = ctx;
    if (s->n < 16) snprintf(s->lines[s->n], sizeof s->lines[0], "%s", line);
    s->n++;
}

static void send_raw(void *zs, int n, const char *const *parts)
{
    for (int i = 0; i < n; i++)
        ck_assert_int_ge(zmq_send(zs, parts[i], strlen(parts[i]), i + 1 < n ? ZMQ_SNDMORE : 0), 0);
}

static void make_hello(prl_bus_msg *m, uint64_t id)
{
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec("hello"), "run-s", id), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_str(m, "role", "rollout"), PRL_OK);
    ck_assert_int_eq(prl_bus_msg_set_str(m, "worker", "w1"), PRL_OK);
}

static void expect_recv(prl_bus_socket *s, const char *type, uint64_t id, prl_bus_peer *from)
{
    prl_bus_msg m;
    int got = 0;
    ck_assert_msg(prl_bus_recv(s, 5000, &m, from, &got) == PRL_OK, "%s", prl_error_message());
    ck_assert_msg(got, "no '%s' message within 5 s", type);
    ck_assert_str_eq(m.type, type);
    uint64_t v;
    ck_assert_int_eq(prl_bus_msg_get_uint(&m, "id", &v), PRL_OK);
    ck_assert_uint_eq(v, id);
    prl_bus_msg_free(&m);
}

/* ROUTER/DEALER over `endpoint` (bound by the router): valid messages with garbage
** interleaved, replies by identity, garbage towards the dealer too. */
static void exchange(const char *endpoint)
{
    log_sink logs = {0}, dlogs = {0};
    prl_bus_socket_options ro, dopt;
    prl_bus_socket_options_default(&ro);
    ro.registry = prl_msg_registry();
    ro.bind = 1;
    ro.name = "controller";
    ro.log = sink_log;
    ro.log_ctx = &logs;
    prl_bus_socket *router, *dealer;
    ck_assert_msg(prl_bus_socket_open(&router, PRL_BUS_ROUTER, endpoint, &ro) == PRL_OK, "%s",
                  prl_error_message());
    prl_bus_socket_options_default(&dopt);
    dopt.registry = prl_msg_registry();
    dopt.identity = "w1";
    dopt.name = "rollout";
    dopt.log = sink_log;
    dopt.log_ctx = &dlogs;
    ck_assert_int_eq(
        prl_bus_socket_open(&dealer, PRL_BUS_DEALER, prl_bus_socket_endpoint(router), &dopt),
        PRL_OK);

    prl_bus_msg m;
    make_hello(&m, 1);
    ck_assert_int_eq(prl_bus_send(dealer, NULL, &m), PRL_OK);
    const char *junk1[] = {"junk"};
    const char *junk2[] = {"work", "{not json"};
    const char *junk3[] = {"bogus", "{}"};
    send_raw(prl_bus_socket_raw(dealer), 1, junk1);
    send_raw(prl_bus_socket_raw(dealer), 2, junk2);
    send_raw(prl_bus_socket_raw(dealer), 2, junk3);
    const char *many[PRL_BUS_MAX_PARTS + 5];
    for (int i = 0; i < PRL_BUS_MAX_PARTS + 5; i++) many[i] = "z";
    send_raw(prl_bus_socket_raw(dealer), PRL_BUS_MAX_PARTS + 5, many);
    prl_bus_msg_free(&m);
    make_hello(&m, 2);
    ck_assert_int_eq(prl_bus_send(dealer, NULL, &m), PRL_OK);
    prl_bus_msg_free(&m);

    prl_bus_peer from;
    expect_recv(router, "hello", 1, &from);
    ck_assert_uint_eq(from.len, 2);
    ck_assert_int_eq(memcmp(from.id, "w1", 2), 0);
    expect_recv(router, "hello", 2, &from);
    ck_assert_int_eq(logs.n, 4);
    ck_assert_uint_eq(prl_bus_socket_dropped(router), 4);
    ck_assert_msg(
        strstr(logs.lines[0], "controller: dropped message from peer 7731: message has 1 frames"),
        "%s", logs.lines[0]);
    ck_assert_msg(strstr(logs.lines[1], "frame 1 (header) is not valid JSON"), "%s", logs.lines[1]);
    ck_assert_msg(strstr(logs.lines[2], "type 'bogus' is not a known message type"), "%s",
                  logs.lines[2]);
    ck_assert_msg(strstr(logs.lines[3], "message has 23 frames; the limit is 18"), "%s",
                  logs.lines[3]);

    /* reply by identity; garbage first */
    ck_assert_int_eq(prl_bus_msg_init(&m, prl_msg_spec("stop"), "run-s", 3), PRL_OK);
    const char *junk4[] = {"w1", "stop", "{\"v\":1}"};
    send_raw(prl_bus_socket_raw(router), 3, junk4);
    ck_assert_int_eq(prl_bus_send(router, &from, &m), PRL_OK);
    expect_recv(dealer, "stop", 3, NULL);
    ck_assert_int_eq(dlogs.n, 1);
    ck_assert_msg(
        strstr(dlogs.lines[0], "rollout: dropped message: header field 'type' must be a string"),
        "%s", dlogs.lines[0]);

    /* misuse is an error, not a crash */
    prl_bus_peer nobody = {.len = 3, .id = "xyz"};
    ck_assert_int_eq(prl_bus_send(router, &nobody, &m), PRL_ERR_IO);
    ck_assert_int_eq(prl_bus_send(router, NULL, &m), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_send(dealer, &from, &m), PRL_ERR_ARG);
    prl_bus_msg_free(&m);
    prl_bus_socket_free(dealer);
    prl_bus_socket_free(router);
}

START_TEST(test_socket_ipc)
{
    char dir[] = "/tmp/prl-bus-test-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/controller", dir);
    exchange(ep);
    prl_bus_shutdown();
    char path[128];
    snprintf(path, sizeof path, "%s/controller", dir);
    unlink(path);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(test_socket_tcp_loopback)
{
    exchange("tcp://127.0.0.1:*");
    prl_bus_shutdown();
}
END_TEST

START_TEST(test_socket_timeout)
{
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.registry = prl_msg_registry();
    o.bind = 1;
    prl_bus_socket *s;
    ck_assert_int_eq(prl_bus_socket_open(&s, PRL_BUS_ROUTER, "inproc://timeout", &o), PRL_OK);
    prl_bus_msg m;
    int got = 1;
    double t0 = prl_now();
    ck_assert_int_eq(prl_bus_recv(s, 300, &m, NULL, &got), PRL_OK);
    double dt = prl_now() - t0;
    ck_assert_int_eq(got, 0);
    ck_assert_msg(dt >= 0.28 && dt < 2.0, "waited %.3f s for a 300 ms timeout", dt);
    ck_assert_int_eq(prl_bus_recv(s, 0, &m, NULL, &got), PRL_OK);
    ck_assert_int_eq(got, 0);
    prl_bus_socket_free(s);
    prl_bus_shutdown();
}
END_TEST

START_TEST(test_endpoint_policy)
{
    ck_assert_int_eq(prl_bus_endpoint_check("ipc:///tmp/x", 0), PRL_OK);
    ck_assert_int_eq(prl_bus_endpoint_check("inproc://a", 0), PRL_OK);
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://127.0.0.1:5555", 0), PRL_OK);
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://localhost:*", 0), PRL_OK);
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://[::1]:80", 0), PRL_OK);
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://0.0.0.0:5555", 0), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'tcp://0.0.0.0:5555' is not loopback"));
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://*:5555", 0), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://127.0.0.1.evil:5555", 0), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://eth0;127.0.0.1:5555", 0), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://127.0.0.1:99999", 0), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "port must be 1..65535"));
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://127.0.0.1:", 0), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_endpoint_check("ipc://", 0), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_endpoint_check("udp://127.0.0.1:1", 0), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "transport must be"));
    ck_assert_int_eq(prl_bus_endpoint_check("", 0), PRL_ERR_ARG);
    ck_assert_int_eq(prl_bus_endpoint_check("tcp://10.1.2.3:5555", 1), PRL_OK); /* checked only */
    prl_bus_socket *s;
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.registry = prl_msg_registry();
    o.bind = 1;
    ck_assert_int_eq(prl_bus_socket_open(&s, PRL_BUS_ROUTER, "tcp://0.0.0.0:*", &o), PRL_ERR_ARG);
    ck_assert_ptr_null(s);
}
END_TEST

/* ---------------------------------------------------------------- who may join ---- */

/* Lines logged by the authentication thread: guarded, it runs beside the test. */
typedef struct locked_sink {
    pthread_mutex_t mu;
    log_sink s;
} locked_sink;

static void locked_log(void *ctx, const char *line)
{
    locked_sink *l = ctx;
    pthread_mutex_lock(&l->mu);
    sink_log(&l->s, line);
    pthread_mutex_unlock(&l->mu);
}

static int locked_count(locked_sink *l, const char *needle)
{
    pthread_mutex_lock(&l->mu);
    int k = 0;
    for (int i = 0; i < l->s.n && i < 16; i++) k += strstr(l->s.lines[i], needle) != NULL;
    pthread_mutex_unlock(&l->mu);
    return k;
}

static const char KEY_A[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
static const char KEY_B[] = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/* A dealer presenting `secret` as `user` (NULL: no credentials) sends a hello; returns
** whether the router got it within wait_ms, with the sender's user in *user. */
static int hello_through(prl_bus_socket *router, const char *secret, const char *user, int wait_ms,
                         char *got_user)
{
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    static int n_dealers; /* a fresh routing id each: the router may not have seen the last go */
    char id[16];
    snprintf(id, sizeof id, "w%d", ++n_dealers);
    o.registry = prl_msg_registry(), o.identity = id, o.secret = secret, o.user = user;
    o.send_timeout_ms = 0;
    prl_bus_socket *d;
    ck_assert_int_eq(prl_bus_socket_open(&d, PRL_BUS_DEALER, prl_bus_socket_endpoint(router), &o),
                     PRL_OK);
    prl_bus_msg m;
    make_hello(&m, 1);
    prl_bus_send(d, NULL, &m); /* may fail at once (no peer accepted): that is the point */
    prl_bus_msg_free(&m);
    prl_bus_peer from;
    int got = 0;
    ck_assert_int_eq(prl_bus_recv(router, wait_ms, &m, &from, &got), PRL_OK);
    if (got) {
        snprintf(got_user, 16, "%s", from.user);
        prl_bus_msg_free(&m);
    }
    prl_bus_socket_free(d);
    return got;
}

static void auth_exchange(const char *endpoint)
{
    locked_sink logs = {.mu = PTHREAD_MUTEX_INITIALIZER};
    prl_bus_socket_options ro;
    prl_bus_socket_options_default(&ro);
    ro.registry = prl_msg_registry(), ro.bind = 1, ro.name = "controller";
    ro.log = locked_log, ro.log_ctx = &logs, ro.secret = KEY_A, ro.launcher_secret = KEY_B;
    prl_bus_socket *router;
    ck_assert_msg(prl_bus_socket_open(&router, PRL_BUS_ROUTER, endpoint, &ro) == PRL_OK, "%s",
                  prl_error_message());
    char user[16] = "";
    ck_assert_msg(hello_through(router, KEY_A, NULL, 5000, user), "the run's key was refused");
    ck_assert_str_eq(user, "worker");
    ck_assert_msg(hello_through(router, KEY_B, "launcher", 5000, user), "launcher refused");
    ck_assert_str_eq(user, "launcher");
    /* each of these is refused before any of its messages is delivered, and logged */
    ck_assert_msg(!hello_through(router, KEY_B, NULL, 700, user), "a wrong key was let in");
    ck_assert_msg(!hello_through(router, KEY_A, "launcher", 700, user), "worker key as launcher");
    ck_assert_msg(!hello_through(router, NULL, NULL, 700, user), "no key was let in");
    ck_assert_int_eq(prl_bus_socket_dropped(router), 0);
    ck_assert_msg(locked_count(&logs, "controller: refused a connection") >= 2, "%d lines: %s",
                  logs.s.n, logs.s.lines[0]);
    ck_assert_int_ge(locked_count(&logs, "user 'worker' with a wrong key"), 1);
    ck_assert_int_ge(locked_count(&logs, "user 'launcher' with a wrong key"), 1);
    for (int i = 0; i < 30 && !locked_count(&logs, "did not present a key"); i++)
        usleep(100000); /* the monitor's event comes on its own time */
    ck_assert_int_ge(locked_count(&logs, "did not present a key"), 1);
    prl_bus_socket_free(router);
}

START_TEST(test_auth_ipc)
{
    char dir[] = "/tmp/prl-bus-auth-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char ep[128], path[128];
    snprintf(ep, sizeof ep, "ipc://%s/control.sock", dir);
    auth_exchange(ep);
    prl_bus_shutdown();
    snprintf(path, sizeof path, "%s/control.sock", dir);
    ck_assert_int_ne(access(path, F_OK), 0); /* removed on close */
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(test_auth_tcp_loopback)
{
    auth_exchange("tcp://127.0.0.1:*");
    prl_bus_shutdown();
}
END_TEST

START_TEST(test_key_files)
{
    char dir[] = "/tmp/prl-bus-key-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128], other[128];
    snprintf(path, sizeof path, "%s/bus.key", dir);
    prl_bus_secret a, b;
    ck_assert_int_eq(prl_bus_key_ensure(path, &a), PRL_OK);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    ck_assert(prl_bus_secret_ok(a.hex));
    ck_assert_int_eq(prl_bus_key_ensure(path, &b), PRL_OK); /* the same key again */
    ck_assert_str_eq(a.hex, b.hex);
    ck_assert_int_eq(prl_bus_key_create(path), PRL_ERR_IO); /* never overwritten */
    ck_assert_int_eq(prl_bus_key_load(path, &b), PRL_OK);
    ck_assert_str_eq(a.hex, b.hex);
    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_int_eq(prl_bus_key_load(path, &b), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "can be read by others (mode 0644)"));
    snprintf(other, sizeof other, "%s/short.key", dir);
    FILE *f = fopen(other, "w");
    fputs("abc\n", f);
    fclose(f);
    ck_assert_int_eq(chmod(other, 0600), 0);
    ck_assert_int_eq(prl_bus_key_load(other, &b), PRL_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "want 64 lowercase hex digits"));
    char derived[128];
    char ep[160];
    snprintf(ep, sizeof ep, "ipc://%s/control.sock", dir);
    ck_assert_int_eq(prl_bus_key_path_for(ep, derived, sizeof derived), PRL_OK);
    ck_assert_str_eq(derived, path);
    ck_assert_int_eq(prl_bus_key_path_for("tcp://127.0.0.1:5", derived, sizeof derived),
                     PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "--key"));
    unlink(path), unlink(other);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* ---------------------------------------------------------------- main ------------- */

int main(void)
{
    Suite *s = suite_create("bus");
    TCase *codec = tcase_create("codec");
    tcase_add_test(codec, test_roundtrip_every_type);
    tcase_add_test(codec, test_accessors);
    tcase_add_test(codec, test_encoder_refuses);
    tcase_add_loop_test(codec, test_rule, 0, (int)(sizeof rules / sizeof rules[0]));
    tcase_add_test(codec, test_hex64_field);
    tcase_add_test(codec, test_size_limits);
    suite_add_tcase(s, codec);
    TCase *fuzz = tcase_create("fuzz");
    tcase_add_test(fuzz, test_fuzz_random);
    tcase_add_test(fuzz, test_fuzz_mutated);
    suite_add_tcase(s, fuzz);
    TCase *sock = tcase_create("sockets");
    tcase_add_test(sock, test_socket_ipc);
    tcase_add_test(sock, test_socket_tcp_loopback);
    tcase_add_test(sock, test_socket_timeout);
    tcase_add_test(sock, test_endpoint_policy);
    tcase_add_test(sock, test_auth_ipc);
    tcase_add_test(sock, test_auth_tcp_loopback);
    tcase_add_test(sock, test_key_files);
    suite_add_tcase(s, sock);
    return check_run(s);
}
