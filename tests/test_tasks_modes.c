/*
** test_tasks_modes.c — thinking and non-thinking modes (tasks.h "modes", docs/tasks.md
** "Modes"): the switch names and their parse, the mode a conversation asks for, the form of
** an answer turn; demonstrations in modes (the mix, the switch on every prompt, the think
** block on think demos only, the same problems and splits as without modes, no mode means
** the lines of old); and the verifiers, which judge the answer after the think block.
*/
#include "reward/reward.h"
#include "tasks/tasks.h"

#include "tests/check_util.h"
#include <stdlib.h>
#include <string.h>

static prl_status collect(void *user, json_t *line)
{
    json_array_append(user, line);
    return PRL_OK;
}

static json_t *lines(const prl_tasks_config *c)
{
    json_t *all = json_array();
    assert_ok(prl_tasks_generate(c, collect, all));
    ck_assert_int_eq((int)json_array_size(all), c->n);
    return all;
}

static const char *content(json_t *line, size_t k)
{
    return json_string_value(
        json_object_get(json_array_get(json_object_get(line, "messages"), k), "content"));
}

START_TEST(test_mode_names)
{
    prl_tasks_mode m = PRL_MODE_DEFAULT;
    assert_ok(prl_tasks_mode_parse("think", &m));
    ck_assert_int_eq(m, PRL_MODE_THINK);
    assert_ok(prl_tasks_mode_parse("no_think", &m));
    ck_assert_int_eq(m, PRL_MODE_NO_THINK);
    assert_ok(prl_tasks_mode_parse("default", &m));
    ck_assert_int_eq(m, PRL_MODE_DEFAULT);
    ck_assert_int_eq(prl_tasks_mode_parse("thinking", &m), PRL_ERR_ARG);
    assert_msg_has("no_think");
    ck_assert_str_eq(prl_tasks_mode_name(PRL_MODE_NO_THINK), "no_think");
    ck_assert_ptr_null(prl_tasks_mode_name((prl_tasks_mode)7));
}
END_TEST

/* The last switch of a system or user message wins; assistant text never switches. */
START_TEST(test_mode_of_messages)
{
    json_t *m = json_loads("[{\"role\":\"system\",\"content\":\"Be brief. /no_think\"},"
                           "{\"role\":\"user\",\"content\":\"Hi /think\"},"
                           "{\"role\":\"assistant\",\"content\":\"ok /no_think\"}]",
                           0, NULL);
    ck_assert_int_eq(prl_tasks_mode_of_messages(m), PRL_MODE_THINK);
    json_array_remove(m, 1);
    ck_assert_int_eq(prl_tasks_mode_of_messages(m), PRL_MODE_NO_THINK);
    json_array_remove(m, 0);
    ck_assert_int_eq(prl_tasks_mode_of_messages(m), PRL_MODE_DEFAULT);
    json_decref(m);
    m = json_loads("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":"
                   "\"b\"},{\"role\":\"user\",\"content\":\"c\"}]",
                   0, NULL);
    assert_ok(prl_tasks_mode_apply(m, PRL_MODE_DEFAULT)); /* no switch */
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 2), "content")), "c");
    assert_ok(prl_tasks_mode_apply(m, PRL_MODE_NO_THINK)); /* the last user message */
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 0), "content")), "a");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(m, 2), "content")),
                     "c /no_think");
    ck_assert_int_eq(prl_tasks_mode_of_messages(m), PRL_MODE_NO_THINK);
    json_decref(m);
    m = json_loads("[{\"role\":\"system\",\"content\":\"s\"}]", 0, NULL);
    ck_assert_int_eq(prl_tasks_mode_apply(m, PRL_MODE_THINK), PRL_ERR_FORMAT);
    json_decref(m);
}
END_TEST

START_TEST(test_answer_forms)
{
    static const struct {
        const char *turn;
        prl_tasks_mode form;
        const char *answer;
    } cases[] = {
        {"<|think|>2 + 2 = 4<|/think|>Answer: 4", PRL_MODE_THINK, "Answer: 4"},
        {"\n<|think|><|/think|>x", PRL_MODE_THINK, "x"}, /* empty reasoning, leading blank */
        {"<|think|>a<|/think|>", PRL_MODE_THINK, ""},
        {"Answer: 4", PRL_MODE_NO_THINK, "Answer: 4"},
        {"", PRL_MODE_NO_THINK, ""},
        {"<|think|>never closed", PRL_MODE_DEFAULT, ""},
        {"Answer: 4<|think|>late<|/think|>", PRL_MODE_DEFAULT, "Answer: 4<|think|>late<|/think|>"},
        {"<|think|>a<|/think|>b<|think|>c<|/think|>d", PRL_MODE_DEFAULT, "b<|think|>c<|/think|>d"},
        {"stray <|/think|> close", PRL_MODE_DEFAULT, "stray <|/think|> close"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_assert_msg(prl_tasks_mode_of_answer(cases[i].turn) == cases[i].form, "case %zu", i);
        ck_assert_str_eq(cases[i].turn + prl_tasks_answer_offset(cases[i].turn), cases[i].answer);
    }
}
END_TEST

/* Demos at think_rate 0.5: every prompt ends in its line's switch; think lines open their
** first assistant turn with a closed block, no-think lines have no think token; about half of
** each; the problems, ids and splits are those of the lines without modes, and the lines
** without modes carry no "mode". think_rate 1 and 0 give one mode only. */
START_TEST(test_mode_demos)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++) {
        prl_tasks_config c;
        prl_tasks_config_default(&c, (prl_task_domain)d);
        c.n = 120, c.seed = 3, c.difficulty = 0, c.demos = 1;
        json_t *plain = lines(&c);
        c.think_rate = 0.5;
        json_t *moded = lines(&c);
        int think = 0;
        for (int i = 0; i < c.n; i++) {
            json_t *p = json_array_get(plain, i), *m = json_array_get(moded, i);
            ck_assert_ptr_null(json_object_get(p, "mode"));
            ck_assert_str_eq(json_string_value(json_object_get(p, "id")),
                             json_string_value(json_object_get(m, "id")));
            const char *mode = json_string_value(json_object_get(m, "mode"));
            int is_think = !strcmp(mode, "think");
            think += is_think;
            json_t *msgs = json_object_get(m, "messages");
            ck_assert_int_eq(prl_tasks_mode_of_messages(msgs),
                             is_think ? PRL_MODE_THINK : PRL_MODE_NO_THINK);
            char *pc = NULL, *mc = NULL; /* the same problem and split */
            assert_ok(prl_tasks_canonical_text(p, &pc));
            assert_ok(prl_tasks_canonical_text(m, &mc));
            ck_assert_str_eq(pc, mc);
            free(pc), free(mc);
            int first = 1;
            for (size_t k = 0; k < json_array_size(msgs); k++) {
                const char *role =
                    json_string_value(json_object_get(json_array_get(msgs, k), "role"));
                if (strcmp(role, "assistant")) continue;
                prl_tasks_mode form = prl_tasks_mode_of_answer(content(m, k));
                ck_assert_msg(form == (is_think && first ? PRL_MODE_THINK : PRL_MODE_NO_THINK),
                              "%s turn %zu: %s", json_string_value(json_object_get(m, "id")), k,
                              content(m, k));
                first = 0;
            }
        }
        ck_assert_msg(think > 40 && think < 80, "%s: %d think lines of 120",
                      prl_tasks_domain_name((prl_task_domain)d), think);
        json_decref(plain), json_decref(moded);
        for (int r = 0; r < 2; r++) {
            c.think_rate = r, c.n = 20;
            json_t *one = lines(&c);
            for (int i = 0; i < c.n; i++)
                ck_assert_str_eq(json_string_value(json_object_get(json_array_get(one, i), "mode")),
                                 r ? "think" : "no_think");
            json_decref(one);
        }
    }
    prl_tasks_config c;
    prl_tasks_config_default(&c, PRL_TASK_GENERAL);
    c.think_rate = 1.5;
    ck_assert_int_eq(prl_tasks_write_jsonl(&c, stdout), PRL_ERR_ARG);
    assert_msg_has("think rate");
}
END_TEST

static double score(json_t *line)
{
    char *text = json_dumps(line, JSON_COMPACT);
    prl_reward_result r;
    assert_ok(prl_reward_score_line(text, NULL, &r));
    free(text);
    return r.score;
}

/* Think demonstrations score 1 like the plain ones: the verifiers see the answer after the
** block (General's case, length and word checks would fail on the reasoning text). A wrong
** answer after a right one in the reasoning scores 0, and so does an unclosed block. */
START_TEST(test_verifier_sees_answer)
{
    prl_task_domain doms[3] = {PRL_TASK_REASONING, PRL_TASK_GENERAL, PRL_TASK_AGENT};
    for (int d = 0; d < 3; d++) {
        prl_tasks_config c;
        prl_tasks_config_default(&c, doms[d]);
        c.n = 40, c.seed = 5, c.difficulty = 0, c.demos = 1, c.think_rate = 1, c.tool_rate = 0;
        json_t *all = lines(&c);
        size_t i;
        json_t *line;
        json_array_foreach(all, i, line)
            ck_assert_msg(score(line) == 1, "%s", json_string_value(json_object_get(line, "id")));
        json_decref(all);
    }
    json_t *t = json_loads("{\"domain\":\"reasoning\",\"answer\":4,\"messages\":[{\"role\":"
                           "\"user\",\"content\":\"What is 2 + 2? /think\"}],\"response\":"
                           "\"<|think|>Answer: 4<|/think|>Answer: 5\"}",
                           0, NULL);
    ck_assert(score(t) == 0);
    json_object_set_new(t, "response", json_string("<|think|>2 + 2 = 4<|/think|>Answer: 4"));
    ck_assert(score(t) == 1);
    json_object_set_new(t, "response", json_string("<|think|>2 + 2 = 4 Answer: 4"));
    ck_assert(score(t) == 0);
    json_decref(t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tasks_modes");
    TCase *tc = tcase_create("modes");
    tcase_add_test(tc, test_mode_names);
    tcase_add_test(tc, test_mode_of_messages);
    tcase_add_test(tc, test_answer_forms);
    tcase_add_test(tc, test_mode_demos);
    tcase_add_test(tc, test_verifier_sees_answer);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return check_run(s);
}
