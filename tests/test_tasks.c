/*
** test_tasks.c — Check tests for tasks/: generation, splits, the tool-call parser and the
** agent environment.
**
** Covers: same seed → byte-identical JSONL and different seeds → different JSONL, for every
** domain and difficulty, demos included; demos carry exactly the prompts of `generate`;
** train and eval share no problem (2000 train vs 500 eval per domain, mixed difficulty, and
** at difficulty 1, the smallest problem space), and each line's split is the hash rule's;
** line fields per domain; configuration errors; the tool-call grammar (every accepted form
** and every rejection); every agent tool with a correct and a malformed or wrong call; the
** call limit, the end of an episode and API misuse; calc; episode determinism.
*/
#include "tasks/tasks.h"

#include "tests/check_util.h"
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers ---------- */

/* The JSONL of a config, as a malloc'd string. */
static char *jsonl(const prl_tasks_config *c)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    assert_ok(prl_tasks_write_jsonl(c, f));
    fclose(f);
    return text;
}

static prl_tasks_config config(prl_task_domain d, prl_task_split s, int difficulty, int n,
                               uint64_t seed, int demos)
{
    prl_tasks_config c;
    prl_tasks_config_default(&c, d);
    c.split = s, c.difficulty = difficulty, c.n = n, c.seed = seed, c.demos = demos;
    return c;
}

/* Lines collected by prl_tasks_generate. */
typedef struct lines {
    json_t *a;
} lines;

static prl_status collect(void *user, json_t *line)
{
    lines *l = user;
    json_array_append(l->a, line);
    return PRL_OK;
}

static json_t *generate(const prl_tasks_config *c)
{
    lines l = {json_array()};
    assert_ok(prl_tasks_generate(c, collect, &l));
    ck_assert_int_eq((int)json_array_size(l.a), c->n);
    return l.a;
}

/* A set of strings (open addressing on prl_checksum64). */
typedef struct strset {
    char **slot;
    size_t cap;
} strset;

static void set_init(strset *s, size_t cap)
{
    s->cap = cap;
    s->slot = calloc(cap, sizeof *s->slot);
}

static size_t set_pos(const strset *s, const char *x)
{
    size_t i = prl_checksum64(x, strlen(x), 1) % s->cap;
    while (s->slot[i] && strcmp(s->slot[i], x)) i = (i + 1) % s->cap;
    return i;
}

static void set_add(strset *s, const char *x)
{
    size_t i = set_pos(s, x);
    if (!s->slot[i]) s->slot[i] = strdup(x);
}

static int set_has(const strset *s, const char *x) { return s->slot[set_pos(s, x)] != NULL; }

static void set_free(strset *s)
{
    for (size_t i = 0; i < s->cap; i++) free(s->slot[i]);
    free(s->slot);
}

static const char *user_text(const json_t *line)
{
    const char *t = NULL;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(line, "messages"), i,
                       m) if (!strcmp(json_string_value(json_object_get(m, "role")), "user")) t =
        json_string_value(json_object_get(m, "content"));
    ck_assert_ptr_nonnull(t);
    return t;
}

/* ---------------------------------------------------------------- generation ------- */

START_TEST(test_determinism)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++)
        for (int k = 0; k <= PRL_TASKS_MAX_DIFFICULTY; k++)
            for (int demos = 0; demos <= 1; demos++) {
                prl_tasks_config c = config(
                    (prl_task_domain)d, k % 2 ? PRL_SPLIT_EVAL : PRL_SPLIT_TRAIN, k, 40, 11, demos);
                c.error_rate = demos ? 0.3 : 0;
                char *a = jsonl(&c), *b = jsonl(&c);
                ck_assert_msg(strcmp(a, b) == 0, "%s difficulty %d: same seed, different JSONL",
                              prl_tasks_domain_name(d), k);
                c.seed = 12;
                char *other = jsonl(&c);
                ck_assert_msg(strcmp(a, other) != 0,
                              "%s difficulty %d: seeds 11 and 12 gave the "
                              "same JSONL",
                              prl_tasks_domain_name(d), k);
                free(a), free(b), free(other);
            }
}
END_TEST

START_TEST(test_demos_have_generate_prompts)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++) {
        prl_tasks_config c = config((prl_task_domain)d, PRL_SPLIT_TRAIN, 0, 30, 5, 0);
        json_t *plain = generate(&c);
        c.demos = 1;
        c.error_rate = 0.5;
        json_t *demos = generate(&c);
        for (size_t i = 0; i < 30; i++) {
            json_t *p = json_array_get(plain, i), *q = json_array_get(demos, i);
            json_t *pm = json_object_get(p, "messages"), *qm = json_object_get(q, "messages");
            ck_assert_str_eq(json_string_value(json_object_get(p, "id")),
                             json_string_value(json_object_get(q, "id")));
            ck_assert_uint_gt(json_array_size(qm), json_array_size(pm));
            for (size_t m = 0; m < json_array_size(pm); m++)
                ck_assert(json_equal(json_array_get(pm, m), json_array_get(qm, m)));
            json_t *last = json_array_get(qm, json_array_size(qm) - 1);
            ck_assert_str_eq(json_string_value(json_object_get(last, "role")), "assistant");
            ck_assert_ptr_null(json_object_get(p, "demo_error"));
            ck_assert(json_is_string(json_object_get(q, "demo_error")));
        }
        json_decref(plain), json_decref(demos);
    }
}
END_TEST

/* n_train + n_eval problems of a domain: no canonical text (nor, outside Agent, prompt) in
** both; every line's split follows the hash of its canonical text. */
static void check_disjoint(prl_task_domain d, int difficulty, int n_train, int n_eval)
{
    prl_tasks_config c = config(d, PRL_SPLIT_TRAIN, difficulty, n_train, 3, 0);
    json_t *train = generate(&c);
    c.split = PRL_SPLIT_EVAL, c.n = n_eval;
    json_t *eval = generate(&c);
    strset canon, prompts;
    set_init(&canon, 8192), set_init(&prompts, 8192);
    size_t i;
    json_t *line;
    json_array_foreach(train, i, line)
    {
        char *text;
        assert_ok(prl_tasks_canonical_text(line, &text));
        ck_assert_str_eq(json_string_value(json_object_get(line, "split")), "train");
        ck_assert_int_eq(prl_tasks_split_of(text, strlen(text)), PRL_SPLIT_TRAIN);
        set_add(&canon, text);
        set_add(&prompts, user_text(line));
        free(text);
    }
    int eval_prompt_in_train = 0;
    json_array_foreach(eval, i, line)
    {
        char *text;
        assert_ok(prl_tasks_canonical_text(line, &text));
        ck_assert_str_eq(json_string_value(json_object_get(line, "split")), "eval");
        ck_assert_int_eq(prl_tasks_split_of(text, strlen(text)), PRL_SPLIT_EVAL);
        ck_assert_msg(!set_has(&canon, text), "%s: eval problem also in train: %s",
                      prl_tasks_domain_name(d), text);
        eval_prompt_in_train += set_has(&prompts, user_text(line));
        free(text);
    }
    /* The Agent's problem is the prompt plus the hidden world: the same question about
    ** another world is another problem. Every other domain's problem is its prompt. */
    if (d != PRL_TASK_AGENT) ck_assert_int_eq(eval_prompt_in_train, 0);
    set_free(&canon), set_free(&prompts);
    json_decref(train), json_decref(eval);
}

START_TEST(test_splits_disjoint)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++) {
        check_disjoint((prl_task_domain)d, 0, 2000, 500);
        check_disjoint((prl_task_domain)d, 1, 500, 100);
    }
}
END_TEST

START_TEST(test_split_rate)
{
    /* About one problem in ten is eval: count the hash rule on distinct texts. */
    int eval = 0;
    char text[32];
    for (int i = 0; i < 10000; i++) {
        snprintf(text, sizeof text, "problem %d", i);
        eval += prl_tasks_split_of(text, strlen(text)) == PRL_SPLIT_EVAL;
    }
    ck_assert_int_gt(eval, 850);
    ck_assert_int_lt(eval, 1150);
}
END_TEST

START_TEST(test_line_fields)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++) {
        prl_tasks_config c = config((prl_task_domain)d, PRL_SPLIT_TRAIN, 0, 60, 9, 0);
        json_t *all = generate(&c);
        size_t i;
        json_t *line;
        json_array_foreach(all, i, line)
        {
            ck_assert(json_is_string(json_object_get(line, "id")));
            ck_assert_str_eq(json_string_value(json_object_get(line, "domain")),
                             prl_tasks_domain_name(d));
            json_int_t k = json_integer_value(json_object_get(line, "difficulty"));
            ck_assert(k >= 1 && k <= 3);
            ck_assert(json_is_array(json_object_get(line, "messages")));
            if (d == PRL_TASK_REASONING)
                ck_assert(json_is_integer(json_object_get(line, "answer")));
            if (d == PRL_TASK_GENERAL)
                ck_assert_int_eq((int)json_array_size(json_object_get(line, "constraints")),
                                 (int)k);
            if (d == PRL_TASK_AGENT) {
                json_t *env = json_object_get(line, "env");
                ck_assert(json_is_integer(json_object_get(env, "seed")));
                ck_assert_int_eq((int)json_integer_value(json_object_get(env, "difficulty")),
                                 (int)k);
            }
            if (d == PRL_TASK_CODING) {
                json_t *tests = json_object_get(line, "tests");
                ck_assert_int_eq((int)json_array_size(tests), 5);
                ck_assert(json_is_string(json_object_get(json_array_get(tests, 0), "stdin")));
                ck_assert(json_is_string(json_object_get(json_array_get(tests, 0), "stdout")));
            }
        }
        json_decref(all);
    }
}
END_TEST

START_TEST(test_demo_error_rate)
{
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++) {
        prl_tasks_config c = config((prl_task_domain)d, PRL_SPLIT_TRAIN, 0, 200, 4, 1);
        int mistakes[3] = {0};
        double rates[3] = {0, 0.3, 1};
        for (int r = 0; r < 3; r++) {
            c.error_rate = rates[r];
            json_t *all = generate(&c);
            size_t i;
            json_t *line;
            json_array_foreach(all, i, line) mistakes[r] +=
                strcmp(json_string_value(json_object_get(line, "demo_error")), "none") != 0;
            json_decref(all);
        }
        ck_assert_int_eq(mistakes[0], 0);
        ck_assert_int_gt(mistakes[1], 30);
        ck_assert_int_lt(mistakes[1], 90);
        ck_assert_int_eq(mistakes[2], 200);
    }
}
END_TEST

START_TEST(test_config_errors)
{
    prl_tasks_config c = config(PRL_TASK_GENERAL, PRL_SPLIT_TRAIN, 4, 10, 1, 0);
    ck_assert_int_eq(prl_tasks_write_jsonl(&c, stdout), PRL_ERR_ARG);
    assert_msg_has("difficulty 4");
    c.difficulty = 1, c.error_rate = 1.5;
    ck_assert_int_eq(prl_tasks_write_jsonl(&c, stdout), PRL_ERR_ARG);
    assert_msg_has("error rate");
    c.error_rate = 0, c.n = -1;
    ck_assert_int_eq(prl_tasks_write_jsonl(&c, stdout), PRL_ERR_ARG);
    c.n = 1, c.domain = (prl_task_domain)7;
    ck_assert_int_eq(prl_tasks_write_jsonl(&c, stdout), PRL_ERR_ARG);
    prl_task_domain d;
    prl_task_split s;
    ck_assert_int_eq(prl_tasks_domain_parse("math", &d), PRL_ERR_ARG);
    assert_msg_has("unknown domain 'math'");
    ck_assert_int_eq(prl_tasks_split_parse("test", &s), PRL_ERR_ARG);
    assert_msg_has("unknown split 'test'");
    assert_ok(prl_tasks_domain_parse("coding", &d));
    ck_assert_int_eq(d, PRL_TASK_CODING);
    assert_ok(prl_tasks_split_parse("eval", &s));
    ck_assert_int_eq(s, PRL_SPLIT_EVAL);
}
END_TEST

/* ---------------------------------------------------------------- tool calls ------- */

START_TEST(test_tool_call_parse_ok)
{
    prl_tool_call c;
    ck_assert_int_eq(prl_tasks_tool_call_parse("Answer: 12", &c), PRL_TOOL_NONE);
    ck_assert_int_eq(prl_tasks_tool_call_parse("<|tool_call|>list<|/tool_call|>", &c), PRL_TOOL_OK);
    ck_assert_str_eq(c.name, "list");
    ck_assert_int_eq(c.n_args, 0);
    ck_assert_int_eq(prl_tasks_tool_call_parse("I check. <|tool_call|>update item=pear field=stock "
                                               "value=7<|/tool_call|>\n",
                                               &c),
                     PRL_TOOL_OK);
    ck_assert_str_eq(c.name, "update");
    ck_assert_int_eq(c.n_args, 3);
    ck_assert_str_eq(prl_tasks_tool_arg(&c, "field"), "stock");
    ck_assert_str_eq(prl_tasks_tool_arg(&c, "value"), "7");
    ck_assert_ptr_null(prl_tasks_tool_arg(&c, "price"));
    ck_assert_int_eq(prl_tasks_tool_call_parse("<|tool_call|>calc expr=(2+3)*-4<|/tool_call|>", &c),
                     PRL_TOOL_OK);
    ck_assert_str_eq(prl_tasks_tool_arg(&c, "expr"), "(2+3)*-4");
    const char *py = "<|tool_call|>python\nx = 6\nprint(x * 7)<|/tool_call|>";
    ck_assert_int_eq(prl_tasks_tool_call_parse(py, &c), PRL_TOOL_OK);
    ck_assert_str_eq(c.name, "python");
    ck_assert_uint_eq(c.body_len, strlen("x = 6\nprint(x * 7)"));
    ck_assert(strncmp(c.body, "x = 6\nprint(x * 7)", c.body_len) == 0);
}
END_TEST

START_TEST(test_tool_call_parse_malformed)
{
    static const struct {
        const char *turn, *why;
    } cases[] = {
        {"<|tool_call|>lookup item=pear", "no <|/tool_call|>"},
        {"lookup item=pear<|/tool_call|>", "without <|tool_call|>"},
        {"<|tool_call|>list<|/tool_call|> Answer: 3", "text after"},
        {"<|tool_call|>list<|/tool_call|><|tool_call|>list<|/tool_call|>", "more than one"},
        {"<|tool_call|><|/tool_call|>", "must start with a tool name"},
        {"<|tool_call|>Lookup item=pear<|/tool_call|>", "must start with a tool name"},
        {"<|tool_call|>lookup pear<|/tool_call|>", "'pear' needs '=value'"},
        {"<|tool_call|>lookup item=<|/tool_call|>", "empty or invalid value"},
        {"<|tool_call|>lookup item=pe\"ar<|/tool_call|>", "invalid character"},
        {"<|tool_call|>lookup  item=pear<|/tool_call|>", "has no name"},
        {"<|tool_call|>lookup item=pear item=fig<|/tool_call|>", "given twice"},
        {"<|tool_call|>calc a=1 b=2 c=3 d=4 e=5<|/tool_call|>", "more than 4 arguments"},
        {"<|tool_call|>averyveryverylongname<|/tool_call|>", "longer than"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prl_tool_call c;
        ck_assert_msg(prl_tasks_tool_call_parse(cases[i].turn, &c) == PRL_TOOL_MALFORMED,
                      "accepted: %s", cases[i].turn);
        ck_assert_msg(strstr(c.error, cases[i].why) != NULL, "'%s': error '%s' lacks '%s'",
                      cases[i].turn, c.error, cases[i].why);
    }
}
END_TEST

/* ---------------------------------------------------------------- agent env -------- */

START_TEST(test_agent_calc)
{
    int64_t v;
    ck_assert_int_eq(prl_agent_calc("2+3*4", &v), 0);
    ck_assert_int_eq(v, 14);
    ck_assert_int_eq(prl_agent_calc("(2+3)*4-25", &v), 0);
    ck_assert_int_eq(v, -5);
    ck_assert_int_eq(prl_agent_calc("12", &v), 0);
    ck_assert_int_eq(v, 12);
    const char *bad[] = {
        "",   "2+", "*3", "(2+3", "2+3)", "2 + 3", "-4", "99999999999*99999999999", "9999999999999",
        "a+1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(prl_agent_calc(bad[i], &v) == -1, "accepted '%s'", bad[i]);
}
END_TEST

/* An env at an episode whose first item is known. */
static prl_agent_env *env_at(uint64_t seed, int difficulty, const prl_agent_task **task)
{
    prl_agent_env *env;
    assert_ok(prl_agent_env_init(&env));
    assert_ok(prl_agent_env_reset(env, seed, difficulty, task));
    return env;
}

/* Step a turn and expect an observation; returns it. */
static const char *step(prl_agent_env *env, const char *turn, int malformed)
{
    prl_agent_step st;
    assert_ok(prl_agent_env_step(env, turn, &st));
    ck_assert_int_eq(st.done, 0);
    ck_assert_ptr_nonnull(st.observation);
    ck_assert_msg(st.malformed == malformed, "'%s' -> '%s': malformed %d, expected %d", turn,
                  st.observation, st.malformed, malformed);
    return st.observation;
}

static void call(char *out, size_t n, const char *body)
{
    snprintf(out, n, PRL_TOOL_CALL_OPEN "%s" PRL_TOOL_CALL_CLOSE, body);
}

START_TEST(test_agent_tools)
{
    const prl_agent_task *t;
    prl_agent_env *env = env_at(77, 2, &t);
    const prl_agent_item *it = &t->world.items[0];
    char turn[160], expect[160], body[128];
    /* list */
    call(turn, sizeof turn, "list");
    const char *obs = step(env, turn, 0);
    ck_assert(strstr(obs, it->name) == obs);
    ck_assert(strstr(obs, t->world.items[3].name) != NULL);
    call(turn, sizeof turn, "list all=1");
    ck_assert(strstr(step(env, turn, 1), "list has no argument 'all'") != NULL);
    /* lookup */
    snprintf(body, sizeof body, "lookup item=%s", it->name);
    call(turn, sizeof turn, body);
    snprintf(expect, sizeof expect, "%s: stock %lld, price %lld", it->name, (long long)it->stock,
             (long long)it->price);
    ck_assert_str_eq(step(env, turn, 0), expect);
    call(turn, sizeof turn, "lookup name=pear");
    ck_assert(strstr(step(env, turn, 1), "lookup needs item=") != NULL);
    call(turn, sizeof turn, "lookup item=banana");
    ck_assert_str_eq(step(env, turn, 0), "error: no item 'banana'"); /* a tool error, well-formed */
    /* update */
    snprintf(body, sizeof body, "update item=%s field=stock value=123", it->name);
    call(turn, sizeof turn, body);
    snprintf(expect, sizeof expect, "%s: stock 123, price %lld", it->name, (long long)it->price);
    ck_assert_str_eq(step(env, turn, 0), expect);
    ck_assert_int_eq(prl_agent_env_world(env)->items[0].stock, 123);
    ck_assert_int_eq(t->world.items[0].stock, it->stock); /* the task keeps the initial world */
    snprintf(body, sizeof body, "update item=%s field=colour value=3", it->name);
    call(turn, sizeof turn, body);
    ck_assert(strstr(step(env, turn, 1), "field must be stock or price") != NULL);
    snprintf(body, sizeof body, "update item=%s field=price value=-3", it->name);
    call(turn, sizeof turn, body);
    ck_assert(strstr(step(env, turn, 1), "value must be a whole number") != NULL);
    ck_assert_int_eq(prl_agent_env_world(env)->items[0].price, it->price);
    ck_assert_int_eq(prl_agent_env_calls(env), 8);
    ck_assert_int_eq(prl_agent_env_malformed(env), 4);
    prl_agent_env_free(env);
}
END_TEST

START_TEST(test_agent_calc_and_errors)
{
    prl_agent_env *env = env_at(5, 1, NULL);
    char turn[160];
    call(turn, sizeof turn, "calc expr=7*6-2");
    ck_assert_str_eq(step(env, turn, 0), "40");
    call(turn, sizeof turn, "calc expr=7*");
    ck_assert(strstr(step(env, turn, 1), "bad expression '7*'") != NULL);
    call(turn, sizeof turn, "calc");
    ck_assert(strstr(step(env, turn, 1), "calc needs expr=") != NULL);
    call(turn, sizeof turn, "search item=pear");
    ck_assert(strstr(step(env, turn, 1), "unknown tool 'search'") != NULL);
    call(turn, sizeof turn, "python\nprint(1)");
    ck_assert(strstr(step(env, turn, 1), "unknown tool 'python'") != NULL);
    call(turn, sizeof turn, "lookup\nitem=pear");
    ck_assert(strstr(step(env, turn, 1), "not a program") != NULL);
    ck_assert(strstr(step(env, "<|tool_call|>list", 1), "no <|/tool_call|>") != NULL);
    ck_assert_int_eq(prl_agent_env_calls(env), 7);
    /* the 8th call is allowed, the 9th ends the episode */
    call(turn, sizeof turn, "list");
    step(env, turn, 0);
    prl_agent_step st;
    assert_ok(prl_agent_env_step(env, turn, &st));
    ck_assert_int_eq(st.done, 1);
    ck_assert_ptr_null(st.answer);
    ck_assert(strstr(st.observation, "tool call limit (8)") != NULL);
    ck_assert_int_eq(prl_agent_env_step(env, "Answer: 1", &st), PRL_ERR_ARG);
    assert_msg_has("after the episode ended");
    prl_agent_env_free(env);
}
END_TEST

START_TEST(test_agent_episode_end_and_reset)
{
    const prl_agent_task *t;
    prl_agent_env *env = env_at(31, 3, &t);
    prl_agent_step st;
    assert_ok(prl_agent_env_step(env, "It is kiwi.\nAnswer: kiwi", &st));
    ck_assert_int_eq(st.done, 1);
    ck_assert_ptr_null(st.observation);
    ck_assert_str_eq(st.answer, "It is kiwi.\nAnswer: kiwi");
    /* reset starts over with the same episode */
    prl_agent_task first = *t;
    assert_ok(prl_agent_env_reset(env, 31, 3, &t));
    ck_assert(memcmp(&first, t, sizeof first) == 0);
    ck_assert_int_eq(prl_agent_env_calls(env), 0);
    char turn[64];
    call(turn, sizeof turn, "list");
    step(env, turn, 0);
    /* episodes differ across seeds and are pure functions of (seed, difficulty) */
    prl_agent_task a, b, c;
    assert_ok(prl_agent_task_make(31, 3, &a));
    assert_ok(prl_agent_task_make(31, 3, &b));
    assert_ok(prl_agent_task_make(32, 3, &c));
    ck_assert(memcmp(&a, &b, sizeof a) == 0);
    ck_assert(memcmp(&a.world, &c.world, sizeof a.world) != 0);
    ck_assert_int_eq(prl_agent_task_make(31, 4, &a), PRL_ERR_ARG);
    prl_agent_env_free(env);
    prl_agent_env *fresh;
    assert_ok(prl_agent_env_init(&fresh));
    ck_assert_int_eq(prl_agent_env_step(fresh, "Answer: 1", &st), PRL_ERR_ARG);
    assert_msg_has("before reset");
    prl_agent_env_free(fresh);
    prl_agent_env_free(NULL);
}
END_TEST

START_TEST(test_agent_goals_by_difficulty)
{
    /* Each difficulty uses its three goals, the right world size, and prompts name the item. */
    for (int k = 1; k <= 3; k++) {
        int seen[PRL_AGENT_N_GOALS] = {0};
        for (uint64_t s = 0; s < 200; s++) {
            prl_agent_task t;
            assert_ok(prl_agent_task_make(s, k, &t));
            seen[t.goal] = 1;
            ck_assert_int_eq(t.world.n_items, k == 1 ? 3 : 4);
            ck_assert_int_eq(t.goal / 3, k - 1);
            if (t.goal != PRL_AGENT_CHEAPEST)
                ck_assert(strstr(t.prompt, t.world.items[t.item].name) != NULL);
            if (t.goal == PRL_AGENT_SELL || t.goal == PRL_AGENT_SELL_COST)
                ck_assert_int_ge(t.world.items[t.item].stock, t.amount);
        }
        for (int g = 3 * (k - 1); g < 3 * k; g++) ck_assert_msg(seen[g], "goal %d never drawn", g);
    }
}
END_TEST

static Suite *tasks_suite(void)
{
    Suite *s = suite_create("tasks");
    TCase *tc = tcase_create("generate");
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_demos_have_generate_prompts);
    tcase_add_test(tc, test_splits_disjoint);
    tcase_add_test(tc, test_split_rate);
    tcase_add_test(tc, test_line_fields);
    tcase_add_test(tc, test_demo_error_rate);
    tcase_add_test(tc, test_config_errors);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    tc = tcase_create("tool_calls");
    tcase_add_test(tc, test_tool_call_parse_ok);
    tcase_add_test(tc, test_tool_call_parse_malformed);
    suite_add_tcase(s, tc);
    tc = tcase_create("agent_env");
    tcase_add_test(tc, test_agent_calc);
    tcase_add_test(tc, test_agent_tools);
    tcase_add_test(tc, test_agent_calc_and_errors);
    tcase_add_test(tc, test_agent_episode_end_and_reset);
    tcase_add_test(tc, test_agent_goals_by_difficulty);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(tasks_suite()); }
