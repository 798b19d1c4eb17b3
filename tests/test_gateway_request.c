/*
** test_gateway_request.c — the gateway's request parser (roles/gateway/request.c,
** docs/gateway.md "Requests"): every served field read, each bad value refused with a 4xx
** and the field named, OpenAI's error shape, and 20,000 mutations of valid bodies (flipped,
** cut, spliced bytes) that never crash it and each get either a request or a 4xx with a
** message, leaving the struct empty.
*/
#include "tests/check_util.h"
#include "roles/gateway/internal.h"

#include <math.h>
#include <string.h>

static int parse(const char *body, gw_kind kind, const char *hdr, gw_request *r, gw_error *e)
{
    return gw_request_parse(body, strlen(body), kind, hdr, r, e);
}

START_TEST(test_chat_fields)
{
    gw_request r;
    gw_error e;
    const char *body =
        "{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"S\"},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
        "{\"type\": \"text\", \"text\": \"b\"}]}, {\"role\": \"assistant\", \"content\": null},"
        "{\"role\": \"developer\", \"content\": \"D\"}],"
        "\"n\": 3, \"temperature\": 0.5, \"top_p\": 0.9, \"max_completion_tokens\": 7,"
        "\"stop\": [\"x\", \"yy\"], \"seed\": 42, \"logprobs\": true, \"top_logprobs\": 4,"
        "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"user\": \"ep-1-2-3\","
        "\"tools\": [], \"frequency_penalty\": 0, \"response_format\": {\"type\": \"text\"}}";
    ck_assert_int_eq(parse(body, GW_CHAT, NULL, &r, &e), 0);
    ck_assert_str_eq(r.model, "m");
    ck_assert_int_eq(r.n_messages, 4);
    ck_assert_str_eq(r.messages[1].content, "ab");
    ck_assert_str_eq(r.messages[2].content, "");
    ck_assert_str_eq(r.messages[3].role, "system");
    ck_assert_int_eq(r.n, 3);
    ck_assert(r.has_temperature && r.temperature == 0.5 && r.has_top_p && r.top_p == 0.9);
    ck_assert_int_eq(r.max_tokens, 7);
    ck_assert_int_eq(r.n_stop, 2);
    ck_assert_str_eq(r.stop[1], "yy");
    ck_assert(r.has_seed && r.seed == 42);
    ck_assert(r.logprobs && r.top_logprobs == 4 && r.stream && r.include_usage);
    ck_assert_str_eq(r.episode, "ep-1-2-3");
    gw_request_free(&r);
    /* the header names the episode over `user` */
    ck_assert_int_eq(parse(body, GW_CHAT, "grp-1-2", &r, &e), 0);
    ck_assert_str_eq(r.episode, "grp-1-2");
    gw_request_free(&r);
    /* defaults */
    ck_assert_int_eq(
        parse("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}",
              GW_CHAT, NULL, &r, &e),
        0);
    ck_assert(r.n == 1 && !r.has_temperature && !r.has_seed && !r.stream && r.max_tokens == 0);
    ck_assert_str_eq(r.episode, "");
    gw_request_free(&r);
}
END_TEST

START_TEST(test_completion_fields)
{
    gw_request r;
    gw_error e;
    ck_assert_int_eq(parse("{\"model\": \"m\", \"prompt\": [\"p q\"], \"logprobs\": 2, \"n\": 2, "
                           "\"best_of\": 2, \"echo\": false, \"stop\": \"\\n\"}",
                           GW_COMPLETION, NULL, &r, &e),
                     0);
    ck_assert_str_eq(r.prompt, "p q");
    ck_assert(r.logprobs && r.top_logprobs == 2 && r.n == 2 && r.n_stop == 1);
    gw_request_free(&r);
}
END_TEST

/* Each bad body: its status and the param the error names ("" for none). */
static const struct {
    gw_kind kind;
    const char *body, *param;
    int status;
} bad[] = {
    {GW_CHAT, "", "", 400},
    {GW_CHAT, "{\"model\": \"m\", ", "", 400},
    {GW_CHAT, "[1]", "", 400},
    {GW_CHAT, "{\"model\": \"m\", \"model\": \"n\", \"messages\": []}", "", 400},
    {GW_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}", "model", 400},
    {GW_CHAT, "{\"model\": \"m\", \"messages\": []}", "messages", 400},
    {GW_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"bot\", \"content\": \"q\"}]}",
     "messages[0].role", 400},
    {GW_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\"}]}", "messages[0].role", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
     "\"image_url\"}]}]}",
     "messages[0].content", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"x\": 1}", "x",
     400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"n\": 65}", "n",
     400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
     "\"temperature\": 2.5}",
     "temperature", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"top_p\": 0}",
     "top_p", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
     "\"max_tokens\": 0}",
     "max_tokens", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"stop\": "
     "[\"a\", \"b\", \"c\", \"d\", \"e\"]}",
     "stop", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"stop\": \"\"}",
     "stop", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
     "\"top_logprobs\": 3}",
     "top_logprobs", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"seed\": 1.5}",
     "seed", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": "
     "[{\"type\": \"function\"}]}",
     "tools", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
     "\"presence_penalty\": 1}",
     "presence_penalty", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"user\": \"a "
     "b\"}",
     "user", 400},
    {GW_CHAT,
     "{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"content\": \"\", "
     "\"tool_calls\": [{\"id\": \"1\"}]}]}",
     "tool_calls", 400},
    {GW_COMPLETION, "{\"model\": \"m\", \"prompt\": \"\"}", "prompt", 400},
    {GW_COMPLETION, "{\"model\": \"m\", \"prompt\": [\"a\", \"b\"]}", "prompt", 400},
    {GW_COMPLETION, "{\"model\": \"m\", \"prompt\": \"a\", \"logprobs\": 6}", "logprobs", 400},
    {GW_COMPLETION, "{\"model\": \"m\", \"prompt\": \"a\", \"echo\": true}", "echo", 400},
    {GW_COMPLETION, "{\"model\": \"m\", \"prompt\": \"a\", \"best_of\": 3}", "best_of", 400},
    {GW_COMPLETION, "{\"model\": \"m\", \"prompt\": \"a\", \"messages\": []}", "messages", 400},
};

START_TEST(test_refused)
{
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gw_request r;
        gw_error e;
        int st = parse(bad[i].body, bad[i].kind, NULL, &r, &e);
        ck_assert_msg(st == bad[i].status && e.status == st, "body %zu: status %d", i, st);
        ck_assert_msg(!strcmp(e.param, bad[i].param), "body %zu: param '%s', want '%s' (%s)", i,
                      e.param, bad[i].param, e.message);
        ck_assert_msg(e.message[0] && !strcmp(e.type, "invalid_request_error"), "body %zu", i);
        ck_assert(r.n_messages == 0 && !r.messages && !r.prompt && r.n_stop == 0);
    }
    gw_request r;
    gw_error e;
    ck_assert_int_eq(parse("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": "
                           "\"q\"}]}",
                           GW_CHAT, "bad id!", &r, &e),
                     400);
}
END_TEST

START_TEST(test_error_shape_and_small_bodies)
{
    gw_error e;
    gw_fail(&e, 404, "invalid_request_error", "model", "model_not_found", "no %s", "x");
    char *t = gw_error_json(&e);
    json_t *o = json_loads(t, 0, NULL), *er = json_object_get(o, "error");
    ck_assert_int_eq(json_object_size(o), 1);
    ck_assert_int_eq(json_object_size(er), 4);
    ck_assert_str_eq(json_string_value(json_object_get(er, "message")), "no x");
    ck_assert_str_eq(json_string_value(json_object_get(er, "code")), "model_not_found");
    json_decref(o), free(t);
    gw_fail(&e, 400, "invalid_request_error", NULL, NULL, "bad");
    t = gw_error_json(&e);
    o = json_loads(t, 0, NULL), er = json_object_get(o, "error");
    ck_assert(json_is_null(json_object_get(er, "param")) &&
              json_is_null(json_object_get(er, "code")));
    json_decref(o), free(t);
    double x = -1;
    ck_assert_int_eq(gw_reward_parse("{\"reward\": 0.25}", 16, &x, &e), 0);
    ck_assert(x == 0.25);
    ck_assert_int_eq(gw_reward_parse("{\"reward\": 1.5}", 15, &x, &e), 400);
    ck_assert_int_eq(gw_reward_parse("{\"reward\": \"1\"}", 15, &x, &e), 400);
    ck_assert_int_eq(gw_reward_parse("{\"reward\": 1, \"x\": 2}", 21, &x, &e), 400);
    ck_assert_int_eq(gw_claim_parse("", 0, &x, &e), 0);
    ck_assert(x == 0);
    ck_assert_int_eq(gw_claim_parse("{\"wait\": 3}", 11, &x, &e), 0);
    ck_assert(x == 3);
    ck_assert_int_eq(gw_claim_parse("{\"wait\": 61}", 12, &x, &e), 400);
    ck_assert_int_eq(gw_claim_parse("{\"when\": 1}", 11, &x, &e), 400);
}
END_TEST

/* Mutated valid bodies: a request, or a 4xx with a message and an empty struct. */
START_TEST(test_mutations)
{
    static const char *const seeds[] = {
        "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
        "\"text\": \"hi\"}]}], \"n\": 2, \"stop\": [\"a\"], \"logprobs\": true, "
        "\"top_logprobs\": 2, \"stream_options\": {\"include_usage\": true}, \"user\": \"e\"}",
        "{\"model\": \"m\", \"prompt\": \"abc\", \"logprobs\": 1, \"seed\": 9, \"stop\": \"x\"}"};
    prl_rng rng;
    prl_rng_init(&rng, 7, 0, 0, 0, PRL_RNG_TEST);
    char buf[512];
    int accepted = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        const char *s = seeds[it % 2];
        size_t n = strlen(s);
        memcpy(buf, s, n);
        int edits = 1 + (int)(prl_rng_u64(&rng) % 4);
        for (int k = 0; k < edits; k++) {
            size_t at = prl_rng_u64(&rng) % n;
            switch (prl_rng_u64(&rng) % 4) {
            case 0: buf[at] = (char)(prl_rng_u64(&rng) & 0xff); break;
            case 1: n = at; break; /* cut */
            case 2: buf[at] = "{}[]\",:0-9tn\\"[prl_rng_u64(&rng) % 14]; break;
            default: /* splice in a stretch from elsewhere */
                if (n + 8 < sizeof buf) {
                    size_t from = prl_rng_u64(&rng) % n;
                    memmove(buf + at + 8, buf + at, n - at);
                    for (int q = 0; q < 8; q++) buf[at + q] = s[(from + (size_t)q) % strlen(s)];
                    n += 8;
                }
            }
            if (n == 0) break;
        }
        gw_request r;
        gw_error e;
        int st = gw_request_parse(buf, n, it % 2 ? GW_COMPLETION : GW_CHAT, NULL, &r, &e);
        if (st == 0) {
            ck_assert(r.n >= 1 && r.n <= GW_MAX_N && r.model[0]);
            accepted++;
            gw_request_free(&r);
        } else {
            ck_assert_msg(st >= 400 && st < 500 && e.message[0], "mutation %d: %d", it, st);
            ck_assert(r.n_messages == 0 && !r.messages && !r.prompt && r.n_stop == 0);
            refused++;
        }
    }
    ck_assert(accepted > 100 && refused > 10000); /* both paths were taken */
}
END_TEST

static Suite *gateway_request_suite(void)
{
    Suite *s = suite_create("gateway_request");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_chat_fields);
    tcase_add_test(tc, test_completion_fields);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_error_shape_and_small_bodies);
    tcase_add_test(tc, test_mutations);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(gateway_request_suite()); }
