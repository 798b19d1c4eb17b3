/*
** test_reward_file.c — Check tests for the verifiers prompt-file lines name (reward/math.c,
** choice.c, and coding / general / agent on file fields): the rules of docs/rewards.md
** "Prompt-file verifiers", each with cases that must pass and cases that must fail.
*/
#include "tests/plain_exec.h"

#include "tests/check_util.h"

static const prl_reward_exec EXEC = {test_exec_python, NULL, 5.0};

/* Score one answer to a task line (as the loader makes it: "verifier" and "domain" set). */
static double score(const char *task, const char *answer)
{
    prl_chat_message t = {"assistant", answer};
    prl_reward_result r;
    assert_ok(prl_reward_score(task, &t, 1, &EXEC, &r));
    return r.score;
}

/* ---------------------------------------------------------------- math ------------- */

static const struct {
    const char *text, *want; /* want NULL: nothing extracted */
} extract[] = {
    {"so \\boxed{12} and later \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"},
    {"steps\n#### 42\n", "42"},
    {"#### 1\nmore\n#### 7 apples", "7 apples"},
    {"Answer: 9", "9"},
    {"the answer is 3/4.", "3/4."},
    {"ANSWER:  -5 \nthanks", "-5"},
    {"\\boxed{a{b}c}", "a{b}c"},
    {"no final answer here", NULL},
    {"Answer:", NULL},
    {"\\boxed{", NULL},
};

START_TEST(test_math_extract)
{
    char out[128];
    int rc = prl_reward_math_extract(extract[_i].text, out, sizeof out);
    if (!extract[_i].want) ck_assert_msg(rc != 0, "'%s' gave '%s'", extract[_i].text, out);
    else {
        ck_assert_int_eq(rc, 0);
        ck_assert_str_eq(out, extract[_i].want);
    }
}
END_TEST

static const struct {
    const char *got, *want;
    int equal;
} compare[] = {
    {"42", "42", 1},
    {"42.0", "42", 1},
    {"1,000", "1000", 1},
    {"$1{,}000$", "1000", 0}, /* {,} is not a separator the rules know */
    {"0.5", "\\frac{1}{2}", 1},
    {"1/2", "\\dfrac{1}{2}", 1},
    {"\\frac{\\sqrt{3}}{2}", "0.8660254037844386", 1},
    {"2\\pi", "6.283185307179586", 1},
    {"3\\sqrt{2}", "\\sqrt{18}", 1},
    {"\\sqrt 4", "2", 1},
    {"12 km", "12", 1},
    {"12\\text{ cm}", "12", 1},
    {"90^\\circ", "90", 1},
    {"25\\%", "25", 1},
    {"$-3$", "-3", 1},
    {"(2+3)*4", "20", 1},
    {"7.", "7", 1},
    {"x+1", "X+1", 1}, /* not values: normalised text, any case */
    {"41", "42", 0},
    {"0.51", "1/2", 0},
    {"12 km", "13 km", 0},
    {"1, 2", "12", 0},
    {"x+1", "x+2", 0},
    {"", "0", 0},
    {"1/0", "1/0", 1}, /* no value: compared as text */
    {"\\frac{1}{0}", "0", 0},
};

START_TEST(test_math_equal)
{
    ck_assert_msg(prl_reward_math_equal(compare[_i].got, compare[_i].want) == compare[_i].equal,
                  "'%s' vs '%s' should be %s", compare[_i].got, compare[_i].want,
                  compare[_i].equal ? "equal" : "different");
}
END_TEST

START_TEST(test_math_verifier)
{
    const char *task = "{\"domain\": \"reasoning\", \"verifier\": \"math\", \"answer\": \"7/2\", "
                       "\"messages\": [{\"role\": \"user\", \"content\": \"Half of 7?\"}]}";
    ck_assert_double_eq(score(task, "7 / 2 = 3.5\nAnswer: 3.5"), 1);
    ck_assert_double_eq(score(task, "\\boxed{\\frac{7}{2}}"), 1);
    ck_assert_double_eq(score(task, "Answer: 3"), 0);
    ck_assert_double_eq(score(task, "3.5"), 0); /* no extractable final answer: format fails */
    /* a numeric key and the python tool's penalty (math lines play as Reasoning) */
    const char *num = "{\"domain\": \"reasoning\", \"verifier\": \"math\", \"answer\": 12, "
                      "\"messages\": [{\"role\": \"user\", \"content\": \"3*4?\"}]}";
    prl_chat_message t[3] = {{"assistant", "<|tool_call|>calc<|/tool_call|>"},
                             {"tool", "error"},
                             {"assistant", "Answer: 12"}};
    prl_reward_result r;
    assert_ok(prl_reward_score(num, t, 3, &EXEC, &r));
    ck_assert_double_eq_tol(r.score, 1 - PRL_REWARD_TOOL_SYNTAX_PENALTY, 1e-12);
    ck_assert(r.flags & PRL_REWARD_TOOL_SYNTAX);
}
END_TEST

/* ---------------------------------------------------------------- choice ----------- */

static const struct {
    const char *text;
    char want; /* 0: nothing picked */
} picks[] = {
    {"I think the answer is (B).", 'B'},
    {"Answer: c", 'C'},
    {"\\boxed{D}", 'D'},
    {"A", 'A'},
    {"(b)", 'B'},
    {"B.", 'B'},
    {"Answer: Banana", 0},
    {"no idea", 0},
    {"answer: (E) because", 'E'},
    {"Options A or B", 0},
};

START_TEST(test_choice_extract)
{
    ck_assert_int_eq(prl_reward_choice_extract(picks[_i].text), picks[_i].want);
}
END_TEST

START_TEST(test_choice_verifier)
{
    const char *task = "{\"domain\": \"reasoning\", \"verifier\": \"choice\", \"answer\": \"B\", "
                       "\"messages\": [{\"role\": \"user\", \"content\": \"A or B?\"}]}";
    ck_assert_double_eq(score(task, "Answer: B"), 1);
    ck_assert_double_eq(score(task, "Answer: A"), 0);
    ck_assert_double_eq(score(task, "maybe"), 0);
}
END_TEST

/* ---------------------------------------------------------------- the others ------- */

START_TEST(test_code_tests_and_asserts)
{
    const char *task =
        "{\"domain\": \"coding\", \"verifier\": \"code\", \"messages\": [{\"role\": \"user\", "
        "\"content\": \"Define inc(n); read n, print n + 1.\"}], \"tests\": [{\"stdin\": \"4\", "
        "\"stdout\": \"5\"}], \"asserts\": [\"assert inc(1) == 2\", \"assert inc(-1) == 0\"]}";
    ck_assert_double_eq(
        score(task, "```python\ndef inc(n):\n    return n + 1\nif __name__ == '__main__':\n"
                    "    import sys\n    d = sys.stdin.read().strip()\n"
                    "    print(inc(int(d))) if d else None\n```"),
        1);
    /* passes the stdin test, fails one assert of two */
    double s =
        score(task, "```python\ndef inc(n):\n    return abs(n) + 1\n"
                    "import sys\nd = sys.stdin.read().strip()\nif d: print(inc(int(d)))\n```");
    ck_assert_double_eq_tol(s, 2.0 / 3, 1e-12);
    ck_assert_double_eq(score(task, "no code"), 0);
    /* asserts alone */
    const char *only = "{\"domain\": \"coding\", \"verifier\": \"code\", \"messages\": "
                       "[{\"role\": \"user\", \"content\": \"Define sq.\"}], \"asserts\": "
                       "[\"assert sq(3) == 9\"]}";
    ck_assert_double_eq(score(only, "```python\ndef sq(x):\n    return x * x\n```"), 1);
    ck_assert_double_eq(score(only, "```python\ndef sq(x):\n    return x + x\n```"), 0);
}
END_TEST

START_TEST(test_constraints_and_agent)
{
    const char *task = "{\"domain\": \"general\", \"verifier\": \"constraints\", \"messages\": "
                       "[{\"role\": \"user\", \"content\": \"Write about rain.\"}], "
                       "\"constraints\": [{\"type\": \"include\", \"word\": \"red\"}, "
                       "{\"type\": \"case\", \"value\": \"lower\"}]}";
    ck_assert_double_eq(score(task, "the red rain falls."), 1);
    ck_assert_double_eq_tol(score(task, "The red rain falls."), 0.5, 1e-12);
    ck_assert_double_eq(score(task, "The Rain Falls."), 0);
    /* agent: the built-in environment of (seed, difficulty); a wrong final answer fails */
    prl_agent_task t;
    assert_ok(prl_agent_task_make(3, 1, &t));
    char line[600];
    snprintf(line, sizeof line,
             "{\"domain\": \"agent\", \"verifier\": \"agent\", \"env\": {\"seed\": 3, "
             "\"difficulty\": 1}, \"messages\": [{\"role\": \"user\", \"content\": \"%s\"}]}",
             t.prompt);
    ck_assert_double_eq(score(line, "Answer: nothing"), 0);
}
END_TEST

/* A demonstration of the built-in environment, as a file line naming the agent verifier:
** its turns pass, the same turns with a wrong final answer fail. */
static prl_status agent_demo(void *user, json_t *line)
{
    json_object_set_new(line, "verifier", json_string("agent"));
    json_t *msgs = json_object_get(line, "messages");
    size_t n = json_array_size(msgs), first = 2; /* system, user, then the demo's turns */
    prl_chat_message t[32];
    ck_assert_uint_le(n - first, 32);
    for (size_t i = first; i < n; i++)
        t[i - first] = (prl_chat_message){
            json_string_value(json_object_get(json_array_get(msgs, i), "role")),
            json_string_value(json_object_get(json_array_get(msgs, i), "content"))};
    char *task = json_dumps(line, JSON_COMPACT);
    prl_reward_result r;
    assert_ok(prl_reward_score(task, t, n - first, &EXEC, &r));
    ck_assert_double_eq(r.score, 1);
    t[n - first - 1].content = "Answer: 999999";
    assert_ok(prl_reward_score(task, t, n - first, &EXEC, &r));
    ck_assert_double_eq(r.score, 0);
    free(task);
    ++*(int *)user;
    return PRL_OK;
}

/* A world and goal of the line's own: the environment plays it, the verifier judges it. */
START_TEST(test_agent_own_world)
{
    const char *task = "{\"domain\": \"agent\", \"verifier\": \"agent\", \"messages\": "
                       "[{\"role\": \"user\", \"content\": \"Sell 2 pears. What is the new "
                       "stock?\"}], \"env\": {\"items\": [{\"name\": \"pear\", \"stock\": 9, "
                       "\"price\": 4}, {\"name\": \"fig\", \"stock\": 1, \"price\": 2}], "
                       "\"goal\": \"sell\", \"item\": \"pear\", \"amount\": 2}}";
    prl_chat_message t[5] = {
        {"assistant", "<|tool_call|>lookup item=pear<|/tool_call|>"},
        {"tool", "pear: stock 9, price 4"},
        {"assistant", "<|tool_call|>update item=pear field=stock value=7<|/tool_call|>"},
        {"tool", "pear: stock 7, price 4"},
        {"assistant", "Answer: 7"}};
    prl_reward_result r;
    assert_ok(prl_reward_score(task, t, 5, &EXEC, &r));
    ck_assert_double_eq(r.score, 1);
    assert_ok(prl_reward_score(task, t + 4, 1, &EXEC, &r)); /* the answer without the update */
    ck_assert_double_eq(r.score, 0);
    t[3].content = "pear: stock 8, price 4"; /* a forged observation */
    assert_ok(prl_reward_score(task, t, 5, &EXEC, &r));
    ck_assert_double_eq(r.score, 0);
}
END_TEST

START_TEST(test_agent_demo_passes)
{
    prl_tasks_config tc;
    prl_tasks_config_default(&tc, PRL_TASK_AGENT);
    tc.n = 5, tc.demos = 1, tc.difficulty = 0;
    int seen = 0;
    assert_ok(prl_tasks_generate(&tc, agent_demo, &seen));
    ck_assert_int_eq(seen, 5);
}
END_TEST

static Suite *reward_file_suite(void)
{
    Suite *s = suite_create("reward_file");
    TCase *tc = tcase_create("verifiers");
    tcase_add_loop_test(tc, test_math_extract, 0, (int)(sizeof extract / sizeof extract[0]));
    tcase_add_loop_test(tc, test_math_equal, 0, (int)(sizeof compare / sizeof compare[0]));
    tcase_add_test(tc, test_math_verifier);
    tcase_add_loop_test(tc, test_choice_extract, 0, (int)(sizeof picks / sizeof picks[0]));
    tcase_add_test(tc, test_choice_verifier);
    tcase_add_test(tc, test_code_tests_and_asserts);
    tcase_add_test(tc, test_constraints_and_agent);
    tcase_add_test(tc, test_agent_demo_passes);
    tcase_add_test(tc, test_agent_own_world);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(reward_file_suite()); }
