/*
** test_tasks_file.c — Check tests for prompt files (tasks/file.c, reward/file.c): the lines
** a file turns into (messages, id, split, domain, metadata, shards in name order) and every
** kind of bad line, each failing with FILE:LINE and the field it names.
*/
#include "reward/reward.h"

#include "tests/check_util.h"
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/prl-tasks-file-XXXXXX";

static void setup(void) { ck_assert_ptr_nonnull(mkdtemp(dir)); }
static void teardown(void)
{
    check_remove_tree(dir);
    strcpy(dir, "/tmp/prl-tasks-file-XXXXXX");
}

/* Write text to dir/name; the path into out. */
static void put(const char *name, const char *text, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", dir, name);
    FILE *f = fopen(out, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

typedef struct lines {
    json_t *all; /* every task object, in order */
} lines;

static prl_status keep(void *user, json_t *line)
{
    json_array_append(((lines *)user)->all, line);
    return PRL_OK;
}

/* Read path (verifier required); the tasks into *out (a new array). */
static prl_status read_all(const char *path, json_t **out)
{
    lines l = {json_array()};
    prl_tasks_file_options fo = {.require_verifier = 1};
    prl_status rc = prl_reward_file_read(path, &fo, keep, &l);
    *out = l.all;
    return rc;
}

static const char *str(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

START_TEST(test_lines_become_tasks)
{
    char p[600];
    put("a.jsonl",
        "{\"prompt\": \"What is 2+3?\", \"verifier\": \"math\", \"answer\": 5, \"src\": \"x\"}\n"
        "\n"
        "{\"id\": \"q2\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
        "{\"role\": \"user\", \"content\": \"Pick one\"}], \"verifier\": \"choice\", "
        "\"answer\": \"B\", \"choices\": [\"Lima\", \"Quito\"], \"split\": \"eval\"}\n"
        "{\"prompt\": \"Write\", \"verifier\": \"constraints\", \"constraints\": "
        "[{\"type\": \"include\", \"word\": \"red\"}]}\n"
        "{\"verifier\": \"agent\", \"env\": {\"seed\": 3, \"difficulty\": 1}}\n"
        "{\"prompt\": \"Add one\", \"verifier\": \"code\", \"asserts\": [\"assert f(1) == 2\"]}\n"
        "{\"verifier\": \"agent\", \"env\": {\"items\": [{\"name\": \"pear\", \"stock\": 9, "
        "\"price\": 4}, {\"name\": \"fig\", \"stock\": 1, \"price\": 2}], \"goal\": \"sell\", "
        "\"item\": \"pear\", \"amount\": 2}}\n",
        p, sizeof p);
    json_t *a;
    assert_ok(read_all(p, &a));
    ck_assert_uint_eq(json_array_size(a), 6);
    json_t *m = json_array_get(a, 0);
    ck_assert_str_eq(str(m, "id"), "a.jsonl:1");
    ck_assert_str_eq(str(m, "domain"), "reasoning");
    ck_assert_str_eq(str(m, "src"), "x"); /* metadata kept */
    ck_assert_str_eq(str(json_array_get(json_object_get(m, "messages"), 0), "content"),
                     "What is 2+3?");
    char where[700];
    snprintf(where, sizeof where, "%s:1", p);
    ck_assert_str_eq(str(m, "source"), where);
    json_t *c = json_array_get(a, 1);
    ck_assert_str_eq(str(c, "id"), "q2");
    ck_assert_str_eq(str(c, "split"), "eval");
    ck_assert_uint_eq(json_array_size(json_object_get(c, "messages")), 2);
    /* a choice line's options are shown after its last message, lettered */
    ck_assert_str_eq(str(json_array_get(json_object_get(c, "messages"), 1), "content"),
                     "Pick one\n\nA) Lima\nB) Quito");
    ck_assert_str_eq(str(json_array_get(a, 2), "domain"), "general");
    json_t *ag = json_array_get(a, 3); /* the environment's own system and user messages */
    ck_assert_str_eq(str(ag, "domain"), "agent");
    ck_assert_str_eq(str(json_array_get(json_object_get(ag, "messages"), 0), "role"), "system");
    ck_assert_str_eq(str(json_array_get(a, 4), "domain"), "coding");
    json_t *own = json_array_get(json_object_get(json_array_get(a, 5), "messages"), 1);
    ck_assert_str_eq(str(own, "content"), "Sell 2 pears. What is the new stock?"); /* its goal */
    json_decref(a);
}
END_TEST

/* Without "split", the split is the hash of the problem statement: the same prompt in another
** file, with other metadata, lands in the same split; about 10% are eval. */
START_TEST(test_split_is_stable)
{
    char p[600], q[600], text[200];
    FILE *f = fopen((snprintf(p, sizeof p, "%s/s.jsonl", dir), p), "w");
    for (int i = 0; i < 1000; i++)
        fprintf(f, "{\"prompt\": \"What is %d + 1?\", \"verifier\": \"math\", \"answer\": %d}\n", i,
                i + 1);
    fclose(f);
    json_t *a, *b;
    assert_ok(read_all(p, &a));
    int eval = 0;
    for (size_t i = 0; i < json_array_size(a); i++)
        eval += !strcmp(str(json_array_get(a, i), "split"), "eval");
    ck_assert_int_gt(eval, 60);
    ck_assert_int_lt(eval, 140);
    for (int i = 0; i < 1000; i++) {
        if (strcmp(str(json_array_get(a, (size_t)i), "split"), "eval")) continue;
        snprintf(text, sizeof text,
                 "{\"prompt\": \"What is %d + 1?\", \"verifier\": \"math\", \"answer\": \"%d\", "
                 "\"tag\": 1}\n",
                 i, i + 1);
        put("t.jsonl", text, q, sizeof q);
        assert_ok(read_all(q, &b));
        ck_assert_str_eq(str(json_array_get(b, 0), "split"), "eval");
        json_decref(b);
        break;
    }
    json_decref(a);
}
END_TEST

START_TEST(test_shards_in_name_order)
{
    char p[600], d[600];
    snprintf(d, sizeof d, "%s/shards", dir);
    ck_assert_int_eq(mkdir(d, 0755), 0);
    put("shards/b.jsonl",
        "{\"id\": \"second\", \"prompt\": \"x\", \"verifier\": \"math\", "
        "\"answer\": 1}\n",
        p, sizeof p);
    put("shards/a.jsonl",
        "{\"id\": \"first\", \"prompt\": \"y\", \"verifier\": \"math\", "
        "\"answer\": 2}\n",
        p, sizeof p);
    put("shards/notes.txt", "not a shard\n", p, sizeof p);
    json_t *a;
    assert_ok(read_all(d, &a));
    ck_assert_uint_eq(json_array_size(a), 2);
    ck_assert_str_eq(str(json_array_get(a, 0), "id"), "first");
    ck_assert_str_eq(str(json_array_get(a, 1), "id"), "second");
    json_decref(a);
    /* an id repeated across shards names both places */
    put("shards/c.jsonl",
        "{\"id\": \"first\", \"prompt\": \"z\", \"verifier\": \"math\", "
        "\"answer\": 3}\n",
        p, sizeof p);
    ck_assert_int_eq(read_all(d, &a), PRL_ERR_FORMAT);
    assert_msg_has("c.jsonl:1: field 'id'");
    assert_msg_has("a.jsonl:1");
    json_decref(a);
}
END_TEST

/* Each bad line: (line text, what the error must say after "FILE:2: "). Line 1 is good. */
static const struct {
    const char *line, *want;
} bad[] = {
    {"{not json", "invalid JSON"},
    {"[1, 2]", "a line must be a JSON object"},
    {"{\"verifier\": \"math\", \"answer\": 1}", "field 'prompt': missing"},
    {"{\"prompt\": \"\", \"verifier\": \"math\", \"answer\": 1}", "field 'prompt'"},
    {"{\"prompt\": \"a\", \"messages\": [], \"verifier\": \"math\", \"answer\": 1}",
     "field 'prompt': give"},
    {"{\"messages\": [{\"role\": \"user\"}], \"verifier\": \"math\", \"answer\": 1}",
     "field 'messages'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
     "\"content\": \"b\"}], \"verifier\": \"math\", \"answer\": 1}",
     "field 'messages': the last message"},
    {"{\"prompt\": \"a\"}", "field 'verifier': missing"},
    {"{\"prompt\": \"a\", \"verifier\": \"regex\"}", "field 'verifier': 'regex'"},
    {"{\"prompt\": \"a\", \"verifier\": \"math\"}", "field 'answer'"},
    {"{\"prompt\": \"a\", \"verifier\": \"math\", \"answer\": \"\"}", "\"answer\" is empty"},
    {"{\"prompt\": \"a\", \"verifier\": \"choice\", \"answer\": \"b\"}", "field 'answer'"},
    {"{\"prompt\": \"a\", \"verifier\": \"choice\", \"answer\": \"C\", \"choices\": [\"x\", "
     "\"y\"]}",
     "field 'choices'"},
    {"{\"prompt\": \"a\", \"verifier\": \"code\"}", "field 'tests'"},
    {"{\"prompt\": \"a\", \"verifier\": \"code\", \"tests\": [{\"stdin\": \"1\"}]}",
     "field 'tests': test 0"},
    {"{\"prompt\": \"a\", \"verifier\": \"code\", \"asserts\": [3]}", "field 'asserts'"},
    {"{\"prompt\": \"a\", \"verifier\": \"constraints\"}", "field 'constraints'"},
    {"{\"prompt\": \"a\", \"verifier\": \"constraints\", \"constraints\": [{\"type\": "
     "\"colour\"}]}",
     "unknown type 'colour'"},
    {"{\"verifier\": \"agent\", \"env\": {\"seed\": 1, \"difficulty\": 7}}", "field 'env'"},
    {"{\"verifier\": \"agent\", \"env\": {\"items\": [{\"name\": \"pear\", \"stock\": 2, "
     "\"price\": 3}], \"goal\": \"haggle\", \"item\": \"pear\"}}",
     "field 'env': agent env: \"goal\" must be one of"},
    {"{\"verifier\": \"agent\", \"env\": {\"items\": [{\"name\": \"pear\", \"stock\": 2, "
     "\"price\": 3}], \"goal\": \"price\", \"item\": \"fig\"}}",
     "\"item\" must name an item"},
    {"{\"verifier\": \"agent\", \"env\": {\"items\": [{\"name\": \"pear\", \"stock\": 2, "
     "\"price\": 3}], \"goal\": \"sell\", \"item\": \"pear\", \"amount\": 5}}",
     "\"amount\" is more than the item's stock"},
    {"{\"verifier\": \"agent\", \"env\": {\"items\": [{\"name\": \"pear\", \"stock\": 2, "
     "\"price\": 3}, {\"name\": \"fig\", \"stock\": 1, \"price\": 3}], \"goal\": \"cheapest\"}}",
     "strictly cheapest"},
    {"{\"verifier\": \"agent\", \"env\": {\"items\": [{\"name\": \"Pear!\", \"stock\": 2, "
     "\"price\": 3}], \"goal\": \"price\", \"item\": \"Pear!\"}}",
     "names of 1..11 letters"},
    {"{\"verifier\": \"agent\", \"env\": {\"items\": [{\"name\": \"pear\", \"stock\": 2, "
     "\"price\": 0}], \"goal\": \"price\", \"item\": \"pear\"}}",
     "price 1..999999"},
    {"{\"prompt\": \"a\", \"verifier\": \"math\", \"answer\": 1, \"split\": \"test\"}",
     "field 'split'"},
    {"{\"prompt\": \"a\", \"verifier\": \"math\", \"answer\": 1, \"id\": 5}", "field 'id'"},
    {"{\"prompt\": \"a\", \"verifier\": \"math\", \"answer\": 1, \"domain\": \"x\"}",
     "field 'domain'"},
    {"{\"prompt\": \"a\", \"verifier\": \"math\", \"answer\": 1, \"id\": \"a.jsonl:1\"}",
     "is also the id of"},
};

START_TEST(test_bad_line_names_file_line_field)
{
    char p[600], text[800], want[900];
    snprintf(text, sizeof text, "{\"prompt\": \"ok\", \"verifier\": \"math\", \"answer\": 1}\n%s\n",
             bad[_i].line);
    put("a.jsonl", text, p, sizeof p);
    json_t *a;
    prl_status rc = read_all(p, &a);
    json_decref(a);
    ck_assert_msg(rc == PRL_ERR_FORMAT, "line '%s' accepted", bad[_i].line);
    snprintf(want, sizeof want, "%s:2: ", p);
    assert_msg_has(want);
    assert_msg_has(bad[_i].want);
}
END_TEST

START_TEST(test_missing_and_empty)
{
    json_t *a;
    char p[600];
    ck_assert_int_eq(read_all("/nonexistent/prompts.jsonl", &a), PRL_ERR_IO);
    assert_msg_has("/nonexistent/prompts.jsonl");
    json_decref(a);
    put("empty.jsonl", "\n\n", p, sizeof p);
    ck_assert_int_eq(read_all(p, &a), PRL_ERR_FORMAT);
    assert_msg_has("holds no lines");
    json_decref(a);
    /* a reward program scores lines without a verifier */
    put("free.jsonl", "{\"prompt\": \"Say hi\", \"rubric\": \"friendly\"}\n", p, sizeof p);
    lines l = {json_array()};
    prl_tasks_file_options fo = {.require_verifier = 0};
    assert_ok(prl_reward_file_read(p, &fo, keep, &l));
    ck_assert_str_eq(str(json_array_get(l.all, 0), "domain"), "general");
    json_decref(l.all);
}
END_TEST

static Suite *tasks_file_suite(void)
{
    Suite *s = suite_create("tasks_file");
    TCase *tc = tcase_create("file");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_lines_become_tasks);
    tcase_add_test(tc, test_split_is_stable);
    tcase_add_test(tc, test_shards_in_name_order);
    tcase_add_loop_test(tc, test_bad_line_names_file_line_field, 0,
                        (int)(sizeof bad / sizeof bad[0]));
    tcase_add_test(tc, test_missing_and_empty);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(tasks_file_suite()); }
