/*
** coding.c — the Coding verifier: the answer's program is run on every hidden test through
** the executor; the score is the fraction of tests passed, unless the monitor flags it.
**
** Checks: "format" (required) — the last assistant turn holds a fenced code block (```python,
** ```py or ```, closed by ```); "monitor:<rule>" (required, monitor.c) — a flagged program is
** not run and scores 0; "test_<i>" (weight 1 each) — status "ok" and stdout equal to the
** expected output, both compared with trailing whitespace removed from every line and trailing
** empty lines dropped; "monitor:sandbox_violation" (required) — the sandbox reported a
** refused action during a test; "assert_<i>" (weight 1 each, prompt-file lines) — the
** program followed by the i-th assert statement exits 0.
*/
#include "reward/reward_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The code of the first fenced block of text (malloc'd), or NULL. */
static char *code_block(const char *text)
{
    static const char *const fences[] = {"```python\n", "```py\n", "```\n"};
    for (int i = 0; i < 3; i++) {
        const char *start = strstr(text, fences[i]);
        if (!start) continue;
        start += strlen(fences[i]);
        const char *end = strstr(start, "```");
        if (!end) return NULL;
        return strndup(start, (size_t)(end - start));
    }
    return NULL;
}

/* Copy s with trailing spaces of every line and trailing newlines removed. */
static char *normalise(const char *s)
{
    size_t n = strlen(s), k = 0;
    char *o = malloc(n + 1);
    if (!o) return NULL;
    for (size_t i = 0; i <= n; i++) {
        if (s[i] == '\n' || s[i] == 0)
            while (k > 0 && (o[k - 1] == ' ' || o[k - 1] == '\t' || o[k - 1] == '\r')) k--;
        if (s[i] == 0) break;
        o[k++] = s[i];
    }
    while (k > 0 && o[k - 1] == '\n') k--;
    o[k] = 0;
    return o;
}

static int find_check(const prl_reward_result *r, const char *name)
{
    for (int i = 0; i < r->n_checks; i++)
        if (!strcmp(r->checks[i].name, name)) return 1;
    return 0;
}

/* Run one test; adds its check (and, once, the sandbox's refusal). */
static prl_status run_test(const prl_reward_exec *exec, const char *code, const json_t *test, int i,
                           prl_reward_result *out)
{
    const char *in = json_string_value(json_object_get(test, "stdin"));
    const char *want = json_string_value(json_object_get(test, "stdout"));
    if (!in || !want)
        return prl_error_set(PRL_ERR_FORMAT,
                             "coding task: test %d needs strings \"stdin\" and \"stdout\"", i);
    prl_reward_exec_result res;
    prl_status rc = reward__run(exec, code, in, strlen(in), &res);
    if (rc) return rc;
    char name[24], *got = normalise(res.stdout_data), *exp = normalise(want);
    snprintf(name, sizeof name, "test_%d", i + 1);
    if (!got || !exp) rc = prl_error_set(PRL_ERR_NOMEM, "coding verifier");
    else if (strcmp(res.status, "ok") != 0) {
        char last[120];
        reward__last_line(res.stderr_data, last, sizeof last);
        reward__check(out, name, 0, 1, 0, "%s%s%s", res.status, last[0] ? ": " : "", last);
        if (strcmp(res.status, "runtime_error") != 0) out->flags |= PRL_REWARD_EXEC_ERROR;
    } else {
        int ok = !strcmp(got, exp);
        reward__check(out, name, ok, 1, 0, "expected '%.60s'%s%.60s%s", exp, ok ? "" : ", got '",
                      ok ? "" : got, ok ? "" : "'");
    }
    if (rc == PRL_OK && !strcmp(res.status, "violation") &&
        !find_check(out, "monitor:sandbox_violation")) {
        reward__check(out, "monitor:sandbox_violation", 0, 0, 1,
                      "test %d: the sandbox refused an "
                      "action",
                      i + 1);
        out->flags |= PRL_REWARD_HACKING;
    }
    free(got);
    free(exp);
    prl_reward_exec_result_free(&res);
    return rc;
}

/* Run one assert-style test: the answer's code, then the assert statement, empty stdin; it
** passes when the program exits 0. */
static prl_status run_assert(const prl_reward_exec *exec, const char *code, const char *stmt, int i,
                             prl_reward_result *out)
{
    char *program = NULL, name[24];
    if (asprintf(&program, "%s\n%s\n", code, stmt) < 0)
        return prl_error_set(PRL_ERR_NOMEM, "coding verifier");
    prl_reward_exec_result res;
    prl_status rc = reward__run(exec, program, NULL, 0, &res);
    free(program);
    if (rc) return rc;
    snprintf(name, sizeof name, "assert_%d", i + 1);
    char last[120];
    reward__last_line(res.stderr_data, last, sizeof last);
    int ok = !strcmp(res.status, "ok");
    reward__check(out, name, ok, 1, 0, "%.80s%s%s", stmt, ok ? "" : ": ", ok ? "" : last);
    if (!ok && strcmp(res.status, "runtime_error")) out->flags |= PRL_REWARD_EXEC_ERROR;
    prl_reward_exec_result_free(&res);
    return PRL_OK;
}

/* The task's "tests" ({stdin, stdout}) and "asserts" (statements, prompt-file lines): 1 to
** PRL_REWARD_MAX_ITEMS in all, each list optional. */
static prl_status test_lists(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                             json_t **task, json_t **tests, json_t **asserts)
{
    prl_status rc = reward__task(task_json, PRL_TASK_CODING, turns, n_turns, task);
    if (rc) return rc;
    *tests = json_object_get(*task, "tests"), *asserts = json_object_get(*task, "asserts");
    size_t n = json_array_size(*tests) + json_array_size(*asserts);
    if ((!*tests || json_is_array(*tests)) && (!*asserts || json_is_array(*asserts)) && n > 0 &&
        n <= PRL_REWARD_MAX_ITEMS)
        return PRL_OK;
    json_decref(*task);
    *task = NULL;
    return prl_error_set(PRL_ERR_FORMAT,
                         "coding task: \"tests\" must be an array of 1..%d entries (with "
                         "\"asserts\", of %d in all)",
                         PRL_REWARD_MAX_ITEMS, PRL_REWARD_MAX_ITEMS);
}

prl_status prl_reward_coding(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                             const prl_reward_exec *exec, prl_reward_result *out)
{
    json_t *task, *tests, *asserts;
    prl_status rc = test_lists(task_json, turns, n_turns, &task, &tests, &asserts);
    if (rc) return rc;
    reward__begin(out);
    const char *last = reward__last_assistant(turns, n_turns);
    char *code = last ? code_block(last) : NULL;
    reward__check(out, "format", code != NULL, 0, 1, "%s",
                  code ? "a fenced code block"
                       : "no ```python ... ``` block in the last assistant turn");
    if (!code) out->flags |= PRL_REWARD_FORMAT_ERROR;
    int flagged = code ? reward__monitor(code, reward__prompt(task), tests, out) : 0;
    size_t i;
    json_t *t;
    if (code && !flagged) json_array_foreach(tests, i, t)
        {
            if ((rc = run_test(exec, code, t, (int)i, out))) break;
        }
    if (code && !flagged && !rc) json_array_foreach(asserts, i, t)
        {
            const char *stmt = json_string_value(t);
            rc = stmt ? run_assert(exec, code, stmt, (int)i, out)
                      : prl_error_set(PRL_ERR_FORMAT, "coding task: assert %zu is not a string", i);
            if (rc) break;
        }
    free(code);
    json_decref(task);
    if (rc) return rc;
    reward__finish(out);
    return PRL_OK;
}
