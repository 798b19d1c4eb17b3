/*
** test_reward.c — Check tests for reward/: the four verifiers, the reward-hacking monitor,
** the python tool observation, line scoring, and the CLI's executor they run programs with.
**
** Covers: reasoning — correct, wrong, missing/broken format, python tool calls that parse,
** that do not (penalty) and that are malformed (penalty); general — a passing and a failing
** response for every constraint type, partial credit, malformed tasks; agent — demonstrations
** pass the external check, a wrong answer, a wrong end state, a malformed call (penalty), a
** forged observation, unfinished transcripts, the rollout-style check on a live env; coding —
** correct (1), partial (fraction), wrong (0), crashes and timeouts, every monitor rule with a
** flagged example and look-alikes that are not flagged, flagged programs are never run, a
** sandbox violation; demonstrations with error rate 0 score exactly 1 in every domain and
** difficulty, with error rate 0.3 clearly less, and every deliberate mistake costs score.
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "tests/plain_exec.h"

#include "tests/check_util.h"
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers ---------- */

static const prl_reward_exec EXEC = {test_exec_python, NULL, 5.0};

static const prl_reward_check *find(const prl_reward_result *r, const char *name)
{
    for (int i = 0; i < r->n_checks; i++)
        if (!strcmp(r->checks[i].name, name)) return &r->checks[i];
    return NULL;
}

static int passed(const prl_reward_result *r, const char *name)
{
    const prl_reward_check *c = find(r, name);
    ck_assert_msg(c != NULL, "no check '%s'", name);
    return c->passed;
}

static void assert_score(const prl_reward_result *r, double want)
{
    ck_assert_msg(r->score > want - 1e-9 && r->score < want + 1e-9, "score %.6f, expected %.6f",
                  r->score, want);
}

/* Score one assistant response to a task. */
static prl_reward_result score1(const char *task, const char *response)
{
    prl_chat_message turn = {"assistant", response};
    prl_reward_result r;
    assert_ok(prl_reward_score(task, &turn, 1, &EXEC, &r));
    return r;
}

/* Score a line (task + model turns) given as a json_t. */
static prl_reward_result score_line(const json_t *line, const prl_reward_exec *exec)
{
    char *text = json_dumps(line, JSON_COMPACT);
    prl_reward_result r;
    assert_ok(prl_reward_score_line(text, exec, &r));
    free(text);
    return r;
}

static prl_status collect(void *user, json_t *line)
{
    json_array_append(user, line);
    return PRL_OK;
}

static json_t *demos(prl_task_domain d, int difficulty, int n, double error_rate, uint64_t seed)
{
    prl_tasks_config c;
    prl_tasks_config_default(&c, d);
    c.difficulty = difficulty, c.n = n, c.seed = seed, c.demos = 1, c.error_rate = error_rate;
    json_t *all = json_array();
    assert_ok(prl_tasks_generate(&c, collect, all));
    return all;
}

static const char *line_content(const json_t *line, int index_from_end)
{
    json_t *m = json_object_get(line, "messages");
    return json_string_value(json_object_get(
        json_array_get(m, json_array_size(m) - 1 - (size_t)index_from_end), "content"));
}

static void set_content(json_t *line, int index_from_end, const char *content)
{
    json_t *m = json_object_get(line, "messages");
    json_object_set_new(json_array_get(m, json_array_size(m) - 1 - (size_t)index_from_end),
                        "content", json_string(content));
}

/* ---------------------------------------------------------------- executor --------- */

static prl_reward_exec_result run(const char *program, const char *in, double wall)
{
    prl_reward_exec_request req = {"python3", program, in, in ? strlen(in) : 0, wall};
    prl_reward_exec_result res;
    assert_ok(test_exec_python(NULL, &req, &res));
    return res;
}

START_TEST(test_exec_bridge)
{
    prl_reward_exec_result r = run("print(int(input()) * 2)", "21\n", 5);
    ck_assert_str_eq(r.status, "ok");
    ck_assert_str_eq(r.stdout_data, "42\n");
    ck_assert_int_eq(r.exit_code, 0);
    prl_reward_exec_result_free(&r);
    r = run("import sys\nsys.stderr.write('bad\\n')\nsys.exit(3)", NULL, 5);
    ck_assert_str_eq(r.status, "runtime_error");
    ck_assert_int_eq(r.exit_code, 3);
    ck_assert_str_eq(r.stderr_data, "bad\n");
    prl_reward_exec_result_free(&r);
    r = run("while True:\n    pass", NULL, 0.5);
    ck_assert_str_eq(r.status, "timeout");
    ck_assert(r.wall_s < 3);
    prl_reward_exec_result_free(&r);
    r = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", NULL, 5);
    ck_assert_str_eq(r.status, "output_limit");
    prl_reward_exec_result_free(&r);
    r = run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", NULL, 5);
    ck_assert_str_eq(r.status, "killed");
    prl_reward_exec_result_free(&r);
    /* a large stdin the program never reads must not hang or kill the caller */
    char *big = malloc(1 << 20);
    memset(big, 'a', (1 << 20) - 1);
    big[(1 << 20) - 1] = 0;
    r = run("print('done')", big, 5);
    ck_assert_str_eq(r.stdout_data, "done\n");
    prl_reward_exec_result_free(&r);
    free(big);
    prl_reward_exec_request req = {"ruby", "puts 1", NULL, 0, 1};
    ck_assert_int_eq(test_exec_python(NULL, &req, &r), PRL_ERR_UNSUPPORTED);
}
END_TEST

/* ---------------------------------------------------------------- reasoning -------- */

static const char *REASONING = "{\"domain\":\"reasoning\",\"messages\":[{\"role\":\"user\","
                               "\"content\":\"What is 3 * 4?\"}],\"answer\":12}";

START_TEST(test_reasoning_answers)
{
    prl_reward_result r = score1(REASONING, "3 * 4 = 12\nAnswer: 12");
    assert_score(&r, 1);
    ck_assert_uint_eq(r.flags, 0);
    r = score1(REASONING, "3 * 4 = 13\nAnswer: 13");
    assert_score(&r, 0);
    ck_assert(passed(&r, "format") && !passed(&r, "answer"));
    ck_assert(strstr(find(&r, "answer")->detail, "expected 12, got 13") != NULL);
    const char *bad_format[] = {"The answer is 12.", "Answer: 12\nDone.", "Answer: twelve",
                                "Answer:",           "Answer: 12.0",      ""};
    for (size_t i = 0; i < sizeof bad_format / sizeof *bad_format; i++) {
        r = score1(REASONING, bad_format[i]);
        assert_score(&r, 0);
        ck_assert_msg(!passed(&r, "format"), "format accepted: '%s'", bad_format[i]);
        ck_assert(r.flags & PRL_REWARD_FORMAT_ERROR);
    }
    r = score1(REASONING, "Answer: 12\n\n");
    assert_score(&r, 1);
    r = score1("{\"domain\":\"reasoning\",\"answer\":-5}", "2 - 7 = -5\nAnswer: -5");
    assert_score(&r, 1);
}
END_TEST

/* Score a python tool turn, its observation and a final answer. */
static prl_reward_result tool_episode(const char *call, const char *final,
                                      const prl_reward_exec *exec, prl_status expect)
{
    prl_chat_message turns[] = {{"assistant", call}, {"tool", "12"}, {"assistant", final}};
    prl_reward_result r;
    ck_assert_int_eq(prl_reward_reasoning(REASONING, turns, 3, exec, &r), expect);
    return r;
}

START_TEST(test_reasoning_python_tool)
{
    prl_reward_result r = tool_episode("<|tool_call|>python\nprint(3 * 4)<|/tool_call|>",
                                       "Answer: 12", &EXEC, PRL_OK);
    assert_score(&r, 1);
    ck_assert(passed(&r, "python_parse") && passed(&r, "tool_syntax"));
    /* code that does not parse: penalty 0.25 */
    r = tool_episode("<|tool_call|>python\nprint(3 * 4<|/tool_call|>", "Answer: 12", &EXEC, PRL_OK);
    assert_score(&r, 1 - PRL_REWARD_PARSE_PENALTY);
    ck_assert(!passed(&r, "python_parse") && (r.flags & PRL_REWARD_PARSE_ERROR));
    ck_assert(strstr(find(&r, "python_parse")->detail, "SyntaxError") != NULL);
    r = tool_episode("<|tool_call|>python\nfor i in range(3) print(i)<|/tool_call|>", "Answer: 13",
                     &EXEC, PRL_OK);
    assert_score(&r, 0); /* wrong answer: the penalty cannot go below 0 */
    /* malformed calls: penalty 0.2 */
    const char *malformed[] = {
        "<|tool_call|>python print(3)<|/tool_call|>", "<|tool_call|>calc expr=3*4<|/tool_call|>",
        "<|tool_call|>python\nprint(3)", "<|tool_call|>python<|/tool_call|>"};
    for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
        r = tool_episode(malformed[i], "Answer: 12", &EXEC, PRL_OK);
        assert_score(&r, 1 - PRL_REWARD_TOOL_SYNTAX_PENALTY);
        ck_assert_msg(!passed(&r, "tool_syntax") && (r.flags & PRL_REWARD_TOOL_SYNTAX), "%s",
                      malformed[i]);
    }
    /* two failing calls add up */
    prl_chat_message turns[] = {{"assistant", "<|tool_call|>python\nprint(3 *<|/tool_call|>"},
                                {"tool", "x"},
                                {"assistant", "<|tool_call|>python\nprint(3 * 4))<|/tool_call|>"},
                                {"tool", "x"},
                                {"assistant", "Answer: 12"}};
    assert_ok(prl_reward_reasoning(REASONING, turns, 5, &EXEC, &r));
    assert_score(&r, 1 - 2 * PRL_REWARD_PARSE_PENALTY);
    /* the last turn must be the answer, not a call */
    prl_chat_message unfinished[] = {{"assistant", "<|tool_call|>python\nprint(12)<|/tool_call|>"}};
    assert_ok(prl_reward_reasoning(REASONING, unfinished, 1, &EXEC, &r));
    ck_assert(!passed(&r, "format"));
    assert_score(&r, 0);
    /* a tool call needs an executor; an answer alone does not */
    tool_episode("<|tool_call|>python\nprint(3 * 4)<|/tool_call|>", "Answer: 12", NULL,
                 PRL_ERR_ARG);
    assert_msg_has("no executor");
    prl_chat_message plain = {"assistant", "Answer: 12"};
    assert_ok(prl_reward_reasoning(REASONING, &plain, 1, NULL, &r));
    assert_score(&r, 1);
}
END_TEST

START_TEST(test_reasoning_bad_tasks)
{
    prl_chat_message t = {"assistant", "Answer: 1"};
    prl_reward_result r;
    ck_assert_int_eq(prl_reward_reasoning("{\"domain\":\"reasoning\"}", &t, 1, NULL, &r),
                     PRL_ERR_FORMAT);
    assert_msg_has("\"answer\"");
    ck_assert_int_eq(prl_reward_reasoning("{\"domain\":\"coding\",\"answer\":1}", &t, 1, NULL, &r),
                     PRL_ERR_FORMAT);
    assert_msg_has("not 'reasoning'");
    ck_assert_int_eq(prl_reward_reasoning("{\"answer\":", &t, 1, NULL, &r), PRL_ERR_FORMAT);
    prl_chat_message robot = {"robot", "Answer: 1"};
    ck_assert_int_eq(prl_reward_reasoning("{\"answer\":1}", &robot, 1, NULL, &r), PRL_ERR_ARG);
    assert_msg_has("robot");
    ck_assert_int_eq(prl_reward_score("{\"domain\":\"chess\"}", &t, 1, NULL, &r), PRL_ERR_ARG);
    assert_msg_has("unknown domain 'chess'");
}
END_TEST

START_TEST(test_python_observation)
{
    char *obs;
    assert_ok(prl_reward_python_observation(&EXEC, "print(6 * 7)\n\n", 14, &obs));
    ck_assert_str_eq(obs, "42");
    free(obs);
    assert_ok(prl_reward_python_observation(&EXEC, "print(1", 7, &obs));
    ck_assert_msg(strncmp(obs, "error: SyntaxError", 18) == 0, "%s", obs);
    free(obs);
    prl_reward_exec quick = {test_exec_python, NULL, 0.5};
    assert_ok(prl_reward_python_observation(&quick, "while 1: pass", 13, &obs));
    ck_assert_str_eq(obs, "error: timeout");
    free(obs);
    ck_assert_int_eq(prl_reward_python_observation(NULL, "print(1)", 8, &obs), PRL_ERR_ARG);
}
END_TEST

/* ---------------------------------------------------------------- general ---------- */

/* A general task with one constraint (JSON object text). */
static prl_reward_result general1(const char *constraint, const char *response)
{
    char task[512];
    snprintf(task, sizeof task, "{\"domain\":\"general\",\"constraints\":[%s]}", constraint);
    return score1(task, response);
}

START_TEST(test_general_constraints)
{
    static const struct {
        const char *constraint, *pass, *fail;
    } cases[] = {
        {"{\"type\":\"case\",\"value\":\"lower\"}", "cats are soft.", "Cats are soft."},
        {"{\"type\":\"case\",\"value\":\"upper\"}", "CATS ARE SOFT.", "CATS are soft."},
        {"{\"type\":\"word_count\",\"relation\":\"exactly\",\"n\":3}", "Cats are soft.",
         "Cats are very soft."},
        {"{\"type\":\"word_count\",\"relation\":\"at_most\",\"n\":3}", "Cats purr.",
         "Cats are very soft."},
        {"{\"type\":\"word_count\",\"relation\":\"at_least\",\"n\":3}", "Cats are very soft.",
         "Cats purr."},
        {"{\"type\":\"sentence_count\",\"n\":2}", "Cats purr. Dogs bark!", "Cats purr."},
        {"{\"type\":\"word_repeat\",\"word\":\"red\",\"n\":2}", "Red cats and red dogs.",
         "Red cats, red dogs, red birds."},
        {"{\"type\":\"include\",\"word\":\"blue\"}", "A blue cat.", "A red cat."},
        {"{\"type\":\"forbid\",\"word\":\"fur\"}", "Cats are soft.", "Cats have FUR."},
        {"{\"type\":\"start\",\"word\":\"gold\"}", "Gold cats sleep.", "Cats are gold."},
        {"{\"type\":\"end\",\"word\":\"gold\"}", "Cats are gold.", "Gold cats sleep."},
        {"{\"type\":\"order\",\"first\":\"red\",\"second\":\"blue\"}", "Red then blue.",
         "Blue then red."},
        {"{\"type\":\"order\",\"first\":\"red\",\"second\":\"blue\"}", "Red, blue, red.",
         "Red only."},
        {"{\"type\":\"bullets\",\"n\":2}", "- cats purr.\n- dogs bark.\n",
         "- cats purr.\ndogs bark."},
        {"{\"type\":\"bullets\",\"n\":2}", "\n- a b.\n\n- c d.", "- a.\n- b.\n- c."},
        {"{\"type\":\"quoted\"}", "\"Cats purr.\"", "Cats purr."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        prl_reward_result r = general1(cases[i].constraint, cases[i].pass);
        ck_assert_msg(r.score == 1, "%s: '%s' scored %g (%s)", cases[i].constraint, cases[i].pass,
                      r.score, r.checks[0].detail);
        r = general1(cases[i].constraint, cases[i].fail);
        ck_assert_msg(r.score == 0, "%s: '%s' scored %g", cases[i].constraint, cases[i].fail,
                      r.score);
        ck_assert_int_eq(r.n_checks, 1);
        ck_assert_double_eq(r.checks[0].weight, 1);
    }
}
END_TEST

/* A turn cut off before <|end|> is not an answer: score 0, the other checks kept. */
START_TEST(test_unfinished)
{
    const char *task =
        "{\"domain\":\"general\",\"constraints\":[{\"type\":\"include\",\"word\":\"blue\"}]}";
    prl_reward_result r = score1(task, "the blue sea");
    assert_score(&r, 1);
    int n = r.n_checks;
    prl_reward_unfinished(&r);
    assert_score(&r, 0);
    ck_assert_int_eq(r.n_checks, n + 1);
    ck_assert(passed(&r, "include") && !passed(&r, "finished"));
    ck_assert(find(&r, "finished")->required);
}
END_TEST

START_TEST(test_general_partial_credit)
{
    const char *task =
        "{\"domain\":\"general\",\"constraints\":[{\"type\":\"case\",\"value\":\"lower\"},"
        "{\"type\":\"include\",\"word\":\"blue\"},{\"type\":\"sentence_count\",\"n\":1}]}";
    prl_reward_result r = score1(task, "the blue sea.");
    assert_score(&r, 1);
    r = score1(task, "the blue sea. the sky.");
    assert_score(&r, 2.0 / 3);
    ck_assert(passed(&r, "case") && passed(&r, "include") && !passed(&r, "sentence_count"));
    r = score1(task, "The red sea. The sky.");
    assert_score(&r, 0);
    r = score1(task, "");
    ck_assert_double_lt(r.score, 0.5);
}
END_TEST

/* on_topic, a gate: off topic = neither a topic word nor a constraint's, a constraint word past
** its count + 1, or a fifth word in a row; at most a quarter of the words may be. */
START_TEST(test_general_on_topic)
{
    const char *task = "{\"domain\":\"general\",\"topic_words\":[\"cats\",\"fur\",\"soft\"],"
                       "\"constraints\":[{\"type\":\"include\",\"word\":\"blue\"},"
                       "{\"type\":\"word_repeat\",\"word\":\"red\",\"n\":2},"
                       "{\"type\":\"order\",\"first\":\"old\",\"second\":\"new\"}]}";
    static const struct {
        const char *response;
        int on_topic;
        const char *detail;
    } cases[] = {
        {"Old red cats, soft fur, red new blue cats.", 1, "9 words, all on topic"},
        {"Blue blue cats.", 1, "3 words, all on topic"},   /* one more than asked */
        {"RED red red CATS.", 1, "4 words, all on topic"}, /* word_repeat's 2 + 1 */
        {"Old red cats small red new blue.", 1,
         "1 of 7 words off topic (at most a quarter), first 'small' (word 4)"},
        {"Blue blue blue cats.", 1, "1 of 4 words off topic"},
        {"Small small cats.", 0, "2 of 3 words off topic"},
        {"Old small small small small.", 0,
         "4 of 5 words off topic (at most a quarter), first 'small' (word 2)"},
        {"Blue blue blue blue blue cats.", 0,
         "3 of 6 words off topic (at most a quarter), first 'blue' (word 3)"},
        {"Red red red red red cats.", 0,
         "2 of 6 words off topic (at most a quarter), first 'red' (word 4)"},
        {"Fur fur fur fur soft cats.", 1, "6 words, all on topic"}, /* a run of 4 */
        {"Fur fur fur fur fur soft cats fur soft cats.", 1, "1 of 10 words off topic"},
        {"Soft fur fur fur fur fur fur fur cats.", 0,
         "3 of 9 words off topic (at most a quarter), first 'fur' (word 6)"},
        {"", 0, "0 words"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        prl_reward_result r = score1(task, cases[i].response);
        int rule_checks = 0; /* the monitor's findings come on top (test_general_monitor) */
        for (int k = 0; k < r.n_checks; k++)
            rule_checks += strncmp(r.checks[k].name, "monitor:", 8) != 0;
        ck_assert_int_eq(rule_checks, 4);
        const prl_reward_check *c = find(&r, "on_topic");
        ck_assert_msg(c && c->passed == cases[i].on_topic && c->weight == 0 && c->required,
                      "'%s': on_topic %d (%s)", cases[i].response, c ? c->passed : -1,
                      c ? c->detail : "missing");
        ck_assert_msg(strstr(c->detail, cases[i].detail), "%s", c->detail);
        if (!c->passed) ck_assert(r.score == 0);
    }
    /* a gate, not a point: the score is the constraints' fraction, or 0 off topic */
    prl_reward_result r = score1(task, "Old red red blue new small.");
    assert_score(&r, 1);
    r = score1(task, "Red cats new old.");
    assert_score(&r, 0);
    r = score1(task, "Old red red blue new small small.");
    assert_score(&r, 0);
    ck_assert(passed(&r, "include") && passed(&r, "word_repeat") && passed(&r, "order"));
    /* a malformed word list is a task error */
    prl_chat_message t = {"assistant", "x"};
    const char *bad[] = {"{\"topic_words\":[],\"constraints\":[{\"type\":\"quoted\"}]}",
                         "{\"topic_words\":[\"\"],\"constraints\":[{\"type\":\"quoted\"}]}",
                         "{\"topic_words\":\"cats\",\"constraints\":[{\"type\":\"quoted\"}]}"};
    for (size_t i = 0; i < 3; i++) {
        ck_assert_int_eq(prl_reward_general(bad[i], &t, 1, &r), PRL_ERR_FORMAT);
        assert_msg_has("\"topic_words\" must be an array");
    }
}
END_TEST

/* The degenerate-text monitor: each rule on answers that trip it and on ones that stay just
** under it, its required check (score 0 whatever the constraints say) and the flag. */
START_TEST(test_general_monitor)
{
    const char *task = "{\"domain\":\"general\",\"topic_words\":[\"cats\",\"fur\",\"soft\"],"
                       "\"constraints\":[{\"type\":\"include\",\"word\":\"blue\"},"
                       "{\"type\":\"word_repeat\",\"word\":\"red\",\"n\":2},"
                       "{\"type\":\"order\",\"first\":\"old\",\"second\":\"new\"}]}";
    static const struct {
        const char *response, *rule, *detail; /* rule NULL: nothing flagged */
    } cases[] = {
        {"Old red cats, soft fur, red new blue cats.", NULL, NULL},
        {"Soft cats fur fur fur fur old new red red blue.", NULL, NULL}, /* a run of 4 */
        {"Old blue red red new cats cats cats cats cats fur.", "monitor:word_run",
         "'cats' 5 times in a row (word 6)"},
        {"Old new red blue soft cats soft cats soft cats soft cats.", "monitor:ngram_repeat",
         "'soft cats soft' said 3 times (word 5)"},
        {"Old blue red new soft cats. Soft cats purr, soft cats nap.", NULL,
         NULL}, /* 'soft cats' */
        {"Old blue blue blue red red new cats.", "monitor:stuffing",
         "'blue' used 3 times (at most 2)"},
        {"Old red red red new blue cats.", NULL, NULL}, /* word_repeat's 2 + 1 */
        {"Old red red red red new blue cats.", "monitor:stuffing",
         "'red' used 4 times (at most 3)"},
        {"Old new red blue red old blue new cats.", NULL, NULL}, /* each within its allowance */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        prl_reward_result r = score1(task, cases[i].response);
        int flagged = 0;
        for (int k = 0; k < r.n_checks; k++) flagged += !strncmp(r.checks[k].name, "monitor:", 8);
        if (!cases[i].rule) {
            ck_assert_msg(flagged == 0 && !(r.flags & PRL_REWARD_DEGENERATE), "'%s' flagged",
                          cases[i].response);
            continue;
        }
        const prl_reward_check *c = find(&r, cases[i].rule);
        ck_assert_msg(c && !c->passed && c->required && c->weight == 0, "'%s': no %s",
                      cases[i].response, cases[i].rule);
        ck_assert_msg(strstr(c->detail, cases[i].detail), "%s", c->detail);
        ck_assert(r.flags & PRL_REWARD_DEGENERATE);
        ck_assert(r.score == 0);
    }
    char flags[128];
    prl_reward_flags_format(PRL_REWARD_DEGENERATE | PRL_REWARD_JUDGE_UNPARSED, flags, sizeof flags);
    ck_assert_str_eq(flags, "degenerate,judge_unparsed");
}
END_TEST

/* The generator's demonstrations (no mistakes) never stuff a constraint's word; their filler
** is drawn at random, so a few repeat a word 5 times or a trigram thrice — 2 of these 3,000
** (general-d0-s43-1803, -2895) — and those are degenerate text like any other. */
START_TEST(test_general_demos_not_degenerate)
{
    json_t *all = demos(PRL_TASK_GENERAL, 0, 3000, 0, 43);
    size_t i;
    json_t *line;
    int flagged = 0;
    json_array_foreach(all, i, line)
    {
        prl_reward_result r = score_line(line, &EXEC);
        ck_assert_msg(!find(&r, "monitor:stuffing"), "%s: %s",
                      json_string_value(json_object_get(line, "id")), line_content(line, 0));
        if (r.flags & PRL_REWARD_DEGENERATE) {
            flagged++;
            ck_assert(find(&r, "monitor:word_run") || find(&r, "monitor:ngram_repeat"));
            ck_assert_double_eq(r.score, 0);
        } else {
            ck_assert_double_eq(r.score, 1);
        }
    }
    ck_assert_int_eq(flagged, 2);
    json_decref(all);
}
END_TEST

/* The run rule and the quarter are not by construction for demonstrations (their filler is
** drawn from the topic's bank, repeats and all): 5,000 of them, mistakes included, all pass
** on_topic (so does every one of 100,000, docs/tasks.md). */
START_TEST(test_general_demos_on_topic)
{
    json_t *all = demos(PRL_TASK_GENERAL, 0, 5000, 0.3, 41);
    size_t i;
    json_t *line;
    json_array_foreach(all, i, line)
    {
        prl_reward_result r = score_line(line, &EXEC);
        ck_assert_msg(passed(&r, "on_topic"), "%s: %s (%s)",
                      json_string_value(json_object_get(line, "id")), line_content(line, 0),
                      find(&r, "on_topic")->detail);
    }
    json_decref(all);
}
END_TEST

START_TEST(test_general_bad_tasks)
{
    prl_chat_message t = {"assistant", "x"};
    prl_reward_result r;
    const char *bad[][2] = {
        {"{\"constraints\":[]}", "\"constraints\" must be an array"},
        {"{\"constraints\":[{\"type\":\"rhyme\"}]}", "unknown type 'rhyme'"},
        {"{\"constraints\":[{\"type\":\"include\"}]}", "needs a string \"word\""},
        {"{\"constraints\":[{\"type\":\"word_count\",\"relation\":\"about\",\"n\":3}]}",
         "unknown relation 'about'"},
        {"{\"constraints\":[{\"type\":\"bullets\",\"n\":\"two\"}]}", "needs an integer \"n\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_int_eq(prl_reward_general(bad[i][0], &t, 1, &r), PRL_ERR_FORMAT);
        assert_msg_has(bad[i][1]);
    }
    /* at most 40 constraints, so every check fits in a result */
    char many[4096] = "{\"constraints\":[";
    for (int i = 0; i < 41; i++)
        strcat(many, i ? ",{\"type\":\"quoted\"}" : "{\"type\":\"quoted\"}");
    strcat(many, "]}");
    ck_assert_int_eq(prl_reward_general(many, &t, 1, &r), PRL_ERR_FORMAT);
    assert_msg_has("1..40 entries");
    many[strlen(many) - 2 - strlen(",{\"type\":\"quoted\"}")] = 0;
    strcat(many, "]}");
    assert_ok(prl_reward_general(many, &t, 1, &r));
    ck_assert_int_eq(r.n_checks, 40);
}
END_TEST

/* ---------------------------------------------------------------- agent ------------ */

START_TEST(test_agent_demos_pass)
{
    json_t *all = demos(PRL_TASK_AGENT, 0, 90, 0, 21);
    size_t i;
    json_t *line;
    json_array_foreach(all, i, line)
    {
        prl_reward_result r = score_line(line, NULL);
        ck_assert_msg(r.score == 1, "%s scored %g", json_string_value(json_object_get(line, "id")),
                      r.score);
        ck_assert(passed(&r, "answer") && passed(&r, "end_state") && passed(&r, "observations"));
    }
    json_decref(all);
}
END_TEST

START_TEST(test_agent_mistakes)
{
    json_t *all = demos(PRL_TASK_AGENT, 0, 120, 1, 22);
    int seen[3] = {0};
    size_t i;
    json_t *line;
    json_array_foreach(all, i, line)
    {
        const char *kind = json_string_value(json_object_get(line, "demo_error"));
        prl_reward_result r = score_line(line, NULL);
        if (!strcmp(kind, "wrong_answer")) {
            seen[0]++;
            assert_score(&r, 0);
            ck_assert(!passed(&r, "answer") && passed(&r, "end_state"));
        } else if (!strcmp(kind, "wrong_update")) {
            seen[1]++;
            assert_score(&r, 0);
            ck_assert(!passed(&r, "end_state"));
        } else {
            ck_assert_str_eq(kind, "malformed_call");
            seen[2]++;
            assert_score(&r, 1 - PRL_REWARD_TOOL_SYNTAX_PENALTY);
            ck_assert(!passed(&r, "tool_syntax") && (r.flags & PRL_REWARD_TOOL_SYNTAX));
        }
    }
    ck_assert(seen[0] > 10 && seen[1] > 10 && seen[2] > 10);
    json_decref(all);
}
END_TEST

START_TEST(test_agent_broken_transcripts)
{
    json_t *all = demos(PRL_TASK_AGENT, 2, 1, 0, 23);
    json_t *line = json_array_get(all, 0);
    /* a wrong final answer */
    json_t *wrong = json_deep_copy(line);
    set_content(wrong, 0, "Answer: 99999");
    prl_reward_result r = score_line(wrong, NULL);
    assert_score(&r, 0);
    ck_assert(!passed(&r, "answer") && passed(&r, "end_state"));
    /* a forged observation */
    json_t *forged = json_deep_copy(line);
    set_content(forged, 1, "apple: stock 1, price 1");
    r = score_line(forged, NULL);
    assert_score(&r, 0);
    ck_assert(!passed(&r, "observations"));
    /* ends on a tool call: drop the tool turn and the answer */
    json_t *cut = json_deep_copy(line);
    json_t *m = json_object_get(cut, "messages");
    json_array_remove(m, json_array_size(m) - 1);
    json_array_remove(m, json_array_size(m) - 1);
    r = score_line(cut, NULL);
    assert_score(&r, 0);
    ck_assert(!passed(&r, "format") && (r.flags & PRL_REWARD_FORMAT_ERROR));
    /* a turn after the final answer */
    json_t *extra = json_deep_copy(line);
    json_array_append_new(json_object_get(extra, "messages"),
                          json_pack("{s:s, s:s}", "role", "assistant", "content", "Answer: 1"));
    r = score_line(extra, NULL);
    ck_assert(!passed(&r, "format"));
    assert_score(&r, 0);
    /* no "env" */
    json_t *noenv = json_deep_copy(line);
    json_object_del(noenv, "env");
    char *text = json_dumps(noenv, 0);
    ck_assert_int_eq(prl_reward_score_line(text, NULL, &r), PRL_ERR_FORMAT);
    assert_msg_has("\"env\"");
    free(text);
    json_decref(wrong), json_decref(forged), json_decref(cut), json_decref(extra),
        json_decref(noenv);
    json_decref(all);
}
END_TEST

/* The rollout worker's way: play the env live, then the external check on its end state. */
START_TEST(test_agent_check_live_env)
{
    json_t *all = demos(PRL_TASK_AGENT, 3, 20, 0, 24);
    size_t i;
    json_t *line;
    json_array_foreach(all, i, line)
    {
        json_t *env_cfg = json_object_get(line, "env");
        prl_agent_env *env;
        const prl_agent_task *task;
        assert_ok(prl_agent_env_init(&env));
        assert_ok(prl_agent_env_reset(
            env, (uint64_t)json_integer_value(json_object_get(env_cfg, "seed")),
            (int)json_integer_value(json_object_get(env_cfg, "difficulty")), &task));
        json_t *msgs = json_object_get(line, "messages");
        const char *answer = NULL;
        for (size_t k = 2; k < json_array_size(msgs); k++) {
            json_t *m = json_array_get(msgs, k);
            if (strcmp(json_string_value(json_object_get(m, "role")), "assistant")) continue;
            prl_agent_step st;
            assert_ok(
                prl_agent_env_step(env, json_string_value(json_object_get(m, "content")), &st));
            if (st.done) answer = st.answer;
        }
        prl_reward_result r;
        memset(&r, 0, sizeof r);
        prl_reward_agent_check(task, prl_agent_env_world(env), answer, &r);
        ck_assert(passed(&r, "answer") && passed(&r, "end_state"));
        /* the same end state with another answer fails the answer only */
        memset(&r, 0, sizeof r);
        prl_reward_agent_check(task, prl_agent_env_world(env), "Answer: nothing", &r);
        ck_assert(!passed(&r, "answer") && passed(&r, "end_state"));
        /* the initial world fails the end state of goals that change it */
        memset(&r, 0, sizeof r);
        prl_reward_agent_check(task, &task->world, answer, &r);
        ck_assert_int_eq(passed(&r, "end_state"), task->goal != PRL_AGENT_SELL_COST);
        prl_agent_env_free(env);
    }
    json_decref(all);
}
END_TEST

/* ---------------------------------------------------------------- coding ----------- */

static const char *CODING =
    "{\"domain\":\"coding\",\"messages\":[{\"role\":\"user\",\"content\":\"Write a Python program. "
    "Read an integer n. Print n + 7.\"}],\"tests\":[{\"stdin\":\"10\\n\",\"stdout\":\"17\\n\"},"
    "{\"stdin\":\"250\\n\",\"stdout\":\"257\\n\"},{\"stdin\":\"600\\n\",\"stdout\":\"607\\n\"},"
    "{\"stdin\":\"35\\n\",\"stdout\":\"42\\n\"}]}";

START_TEST(test_coding_scores)
{
    prl_reward_result r = score1(CODING, "```python\nprint(int(input()) + 7)\n```");
    assert_score(&r, 1);
    ck_assert_int_eq(r.n_checks, 5);
    r = score1(CODING,
               "Here:\n```py\nn = int(input())\nprint(n + 7 if n < 300 else n)\n```\nDone.");
    assert_score(&r, 0.75);
    ck_assert(!passed(&r, "test_3") && passed(&r, "test_4"));
    ck_assert(strstr(find(&r, "test_3")->detail, "expected '607', got '600'") != NULL);
    r = score1(CODING, "```python\nprint(int(input()) + 8)\n```");
    assert_score(&r, 0);
    r = score1(CODING, "```\nprint(str(int(input()) + 7) + '   ')\nprint()\n```");
    assert_score(&r, 1); /* trailing spaces and blank lines do not matter */
    r = score1(CODING, "print(int(input()) + 7)");
    assert_score(&r, 0);
    ck_assert(!passed(&r, "format") && (r.flags & PRL_REWARD_FORMAT_ERROR));
    r = score1(CODING, "```python\nprint(int(input()) + x)\n```");
    assert_score(&r, 0);
    ck_assert(strstr(find(&r, "test_1")->detail, "runtime_error: NameError") != NULL);
    prl_reward_exec quick = {test_exec_python, NULL, 0.5};
    prl_chat_message loop = {"assistant", "```python\nwhile True:\n    pass\n```"};
    assert_ok(prl_reward_coding(CODING, &loop, 1, &quick, &r));
    assert_score(&r, 0);
    ck_assert(strstr(find(&r, "test_1")->detail, "timeout") != NULL &&
              (r.flags & PRL_REWARD_EXEC_ERROR));
    prl_chat_message ok = {"assistant", "```python\nprint(int(input()) + 7)\n```"};
    ck_assert_int_eq(prl_reward_coding(CODING, &ok, 1, NULL, &r), PRL_ERR_ARG);
    ck_assert_int_eq(prl_reward_coding("{\"domain\":\"coding\",\"tests\":[]}", &ok, 1, &EXEC, &r),
                     PRL_ERR_FORMAT);
    assert_msg_has("\"tests\" must be an array of 1..40");
}
END_TEST

/* An executor that counts runs and answers every run with a fixed status. */
typedef struct fake {
    int runs;
    const char *status;
} fake;

static prl_status fake_exec(void *ctx, const prl_reward_exec_request *req,
                            prl_reward_exec_result *res)
{
    fake *f = ctx;
    f->runs++;
    memset(res, 0, sizeof *res);
    snprintf(res->status, sizeof res->status, "%s", f->status);
    res->stdout_data = strdup(strcmp(f->status, "ok") ? "" : "17\n");
    res->stderr_data = strdup("");
    (void)req;
    return PRL_OK;
}

/* Score a coding answer with the fake executor `f`. */
static prl_reward_result score_fake(fake *f, const char *answer)
{
    prl_reward_exec exec = {fake_exec, f, 1};
    prl_chat_message turn = {"assistant", answer};
    prl_reward_result r;
    assert_ok(prl_reward_coding(CODING, &turn, 1, &exec, &r));
    return r;
}

START_TEST(test_coding_empty_program)
{
    /* An empty code block is a bad answer, never an error, and reaches no executor (the sandbox
    ** refuses an empty program): python3 would print nothing, so every test fails. */
    fake f = {0, "ok"};
    prl_reward_result r = score_fake(&f, "```python\n```");
    ck_assert(r.score == 0 && passed(&r, "format") && !passed(&r, "test_1"));
    ck_assert_int_eq(f.runs, 0);
}
END_TEST

START_TEST(test_coding_monitor_flags)
{
    static const struct {
        const char *program, *rule;
    } cases[] = {
        {"n = int(input())\nif n == 250:\n    print(257)\nelse:\n    print(n + 7)", "special_case"},
        {"s = input()\nprint(607 if s in ('600', '35') else int(s) + 7)", "special_case"},
        {"n = int(input())\nmatch n:\n    case 600: print(607)\n    case _: print(n + 7)",
         "special_case"},
        {"print({'10': 17, '250': 257, '600': 607, '35': 42}[input()])", "hardcoded_outputs"},
        {"print(open('/etc/passwd').read()[:0] + str(int(input()) + 7))", "forbidden_file"},
        {"import json\nt = json.load(open('tests.json'))\nprint(t[input()])", "forbidden_file"},
        {"import os\nprint(os.listdir('.'))", "forbidden_file"},
        {"p = '/proc/self/environ'\nprint(int(input()) + 7)", "forbidden_file"},
        {"import subprocess\nprint(subprocess.run(['cat', 'x']))", "forbidden_module"},
        {"print(eval(input() + '+7'))", "forbidden_module"},
        {"import os\nprint(int(input()) + 7)\nos._exit(0)", "early_exit"},
        {"import sys\nsys.exit(0)\nprint(int(input()) + 7)", "early_exit"},
        {"raise SystemExit", "early_exit"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char answer[512], name[48];
        snprintf(answer, sizeof answer, "```python\n%s\n```", cases[i].program);
        snprintf(name, sizeof name, "monitor:%s", cases[i].rule);
        fake f = {0, "ok"};
        prl_reward_result r = score_fake(&f, answer);
        ck_assert_msg(find(&r, name) != NULL && !passed(&r, name), "%s not flagged as %s",
                      cases[i].program, cases[i].rule);
        ck_assert_msg(r.score == 0 && (r.flags & PRL_REWARD_HACKING), "%s", cases[i].program);
        ck_assert_msg(f.runs == 0, "a flagged program was run");
    }
}
END_TEST

START_TEST(test_coding_monitor_lookalikes)
{
    /* Constants of the spec, order comparisons, comments and names that only resemble a
    ** rule are fair: these programs run and are scored on their tests. */
    static const char *const programs[] = {
        "n = int(input())\nif n == 7 or n != -7:\n    print(n + 7)",   /* 7 is in the prompt */
        "n = int(input())\nprint(n + 7 if n > 250 or n < 600 else 0)", /* order comparisons */
        "# 250 -> 257, 600 -> 607\nprint(int(input()) + 7)",           /* a comment */
        "import sys\nprint(int(sys.stdin.read()) + 7)",                /* sys.stdin is fine */
        "opened = 7\nexits = 0\nprint(int(input()) + opened + exits)", /* names, not calls */
    };
    for (size_t i = 0; i < sizeof programs / sizeof *programs; i++) {
        char answer[512];
        snprintf(answer, sizeof answer, "```python\n%s\n```", programs[i]);
        prl_reward_result r = score1(CODING, answer);
        ck_assert_msg(!(r.flags & PRL_REWARD_HACKING), "flagged: %s (%s)", programs[i],
                      r.checks[1].name);
        assert_score(&r, 1);
    }
}
END_TEST

START_TEST(test_coding_sandbox_violation)
{
    const char *answer = "```python\nprint(int(input()) + 7)\n```";
    fake f = {0, "violation"};
    prl_reward_result r = score_fake(&f, answer);
    ck_assert_int_eq(f.runs, 4);
    ck_assert(find(&r, "monitor:sandbox_violation") && (r.flags & PRL_REWARD_HACKING));
    int reported = 0;
    for (int i = 0; i < r.n_checks; i++)
        reported += !strcmp(r.checks[i].name, "monitor:sandbox_violation");
    ck_assert_int_eq(reported, 1);
    assert_score(&r, 0);
    f = (fake){0, "ok"}; /* the fake prints 17: only test 1 passes */
    r = score_fake(&f, answer);
    assert_score(&r, 0.25);
}
END_TEST

/* ---------------------------------------------------------------- demonstrations --- */

/* Every python tool call of a reasoning demo prints, when really run, its tool turn. */
static void check_tool_turns(const json_t *line)
{
    json_t *msgs = json_object_get(line, "messages");
    for (size_t k = 0; k + 1 < json_array_size(msgs); k++) {
        const char *content =
            json_string_value(json_object_get(json_array_get(msgs, k), "content"));
        prl_tool_call call;
        if (prl_tasks_tool_call_parse(content, &call) != PRL_TOOL_OK) continue;
        char *obs;
        assert_ok(prl_reward_python_observation(&EXEC, call.body, call.body_len, &obs));
        ck_assert_str_eq(
            obs, json_string_value(json_object_get(json_array_get(msgs, k + 1), "content")));
        free(obs);
    }
}

START_TEST(test_demos_score_one)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++)
        for (int k = 1; k <= PRL_TASKS_MAX_DIFFICULTY; k++) {
            json_t *all = demos((prl_task_domain)d, k, d == PRL_TASK_CODING ? 12 : 40, 0, 31);
            size_t i;
            json_t *line;
            json_array_foreach(all, i, line)
            {
                prl_reward_result r = score_line(line, &EXEC);
                ck_assert_msg(r.score == 1 && r.flags == 0, "%s: score %g flags %u: %s",
                              json_string_value(json_object_get(line, "id")), r.score, r.flags,
                              line_content(line, 0));
                if (d == PRL_TASK_REASONING) check_tool_turns(line);
            }
            json_decref(all);
        }
}
END_TEST

START_TEST(test_demos_with_mistakes)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++) {
        json_t *all = demos((prl_task_domain)d, 0, d == PRL_TASK_CODING ? 40 : 100, 0.3, 32);
        double sum = 0;
        int n_wrong = 0;
        size_t i;
        json_t *line;
        json_array_foreach(all, i, line)
        {
            prl_reward_result r = score_line(line, &EXEC);
            int mistake =
                strcmp(json_string_value(json_object_get(line, "demo_error")), "none") != 0;
            n_wrong += mistake;
            const char *kind = json_string_value(json_object_get(line, "demo_error"));
            ck_assert_msg(mistake ? r.score < 1 : r.score == 1, "%s (%s) scored %g",
                          json_string_value(json_object_get(line, "id")), kind, r.score);
            if (d == PRL_TASK_GENERAL) { /* exactly the mistake's check fails; always on topic */
                int failed = 0;
                for (int k = 0; k < r.n_checks; k++) failed += !r.checks[k].passed;
                ck_assert_int_eq(failed, mistake);
                ck_assert(passed(&r, "on_topic") && (!mistake || !passed(&r, kind)));
            }
            sum += r.score;
        }
        double mean = sum / (double)json_array_size(all);
        ck_assert_msg(n_wrong > 0 && mean < 0.9, "%s: mean %.3f with %d mistakes",
                      prl_tasks_domain_name(d), mean, n_wrong);
        json_decref(all);
    }
}
END_TEST

/* ---------------------------------------------------------------- lines ------------ */

START_TEST(test_score_line_forms)
{
    const char *task = "{\"domain\":\"reasoning\",\"messages\":[{\"role\":\"user\",\"content\":\"1+"
                       "1?\"}],\"answer\":2";
    char line[512];
    prl_reward_result r;
    snprintf(line, sizeof line, "%s,\"response\":\"Answer: 2\"}", task);
    assert_ok(prl_reward_score_line(line, NULL, &r));
    assert_score(&r, 1);
    snprintf(line, sizeof line, "%s}", task);
    ck_assert_int_eq(prl_reward_score_line(line, NULL, &r), PRL_ERR_FORMAT);
    assert_msg_has("no answer to score");
    snprintf(line, sizeof line, "%s,\"response\":7}", task);
    ck_assert_int_eq(prl_reward_score_line(line, NULL, &r), PRL_ERR_FORMAT);
    assert_msg_has("\"response\" must be a string");
    ck_assert_int_eq(prl_reward_score_line("[1,2]", NULL, &r), PRL_ERR_FORMAT);
    char flags[96];
    prl_reward_flags_format(PRL_REWARD_FORMAT_ERROR | PRL_REWARD_HACKING, flags, sizeof flags);
    ck_assert_str_eq(flags, "format_error,hacking");
}
END_TEST

static Suite *reward_suite(void)
{
    Suite *s = suite_create("reward");
    TCase *tc = tcase_create("exec");
    tcase_add_test(tc, test_exec_bridge);
    tcase_add_test(tc, test_unfinished);
    tcase_add_test(tc, test_python_observation);
    suite_add_tcase(s, tc);
    tc = tcase_create("reasoning");
    tcase_add_test(tc, test_reasoning_answers);
    tcase_add_test(tc, test_reasoning_python_tool);
    tcase_add_test(tc, test_reasoning_bad_tasks);
    suite_add_tcase(s, tc);
    tc = tcase_create("general");
    tcase_add_test(tc, test_general_constraints);
    tcase_add_test(tc, test_general_partial_credit);
    tcase_add_test(tc, test_general_on_topic);
    tcase_add_test(tc, test_general_demos_on_topic);
    tcase_add_test(tc, test_general_monitor);
    tcase_add_test(tc, test_general_demos_not_degenerate);
    tcase_add_test(tc, test_general_bad_tasks);
    suite_add_tcase(s, tc);
    tc = tcase_create("agent");
    tcase_add_test(tc, test_agent_demos_pass);
    tcase_add_test(tc, test_agent_mistakes);
    tcase_add_test(tc, test_agent_broken_transcripts);
    tcase_add_test(tc, test_agent_check_live_env);
    suite_add_tcase(s, tc);
    tc = tcase_create("coding");
    tcase_add_test(tc, test_coding_scores);
    tcase_add_test(tc, test_coding_empty_program);
    tcase_add_test(tc, test_coding_monitor_flags);
    tcase_add_test(tc, test_coding_monitor_lookalikes);
    tcase_add_test(tc, test_coding_sandbox_violation);
    suite_add_tcase(s, tc);
    tc = tcase_create("demos");
    tcase_add_test(tc, test_demos_score_one);
    tcase_add_test(tc, test_demos_with_mistakes);
    tcase_add_test(tc, test_score_line_forms);
    tcase_set_timeout(tc, 600);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(reward_suite()); }
