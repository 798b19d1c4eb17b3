/*
** cmd_tasks_check.c — `prl tasks check`: score answers with the verifiers of reward/.
**
** Input: JSONL, one task per line (as `prl tasks generate` writes it) carrying the model's
** answer as turns after the prompt in "messages" and/or a "response" string (the format of
** `prl tasks demos` lines, so demonstrations check as they are). Output: one line per task
** (score, flags, checks; details of failed checks) and a summary with the mean score and the
** accuracy (share of score 1) per domain; --json writes the same as JSON objects. Programs run
** in the sandbox (roles/exec.c). The reward-hacking monitor's findings are printed to
** stderr and, with --monitor-log, appended as JSON records (docs/rewards.md).
*/
#include "cli/cli.h"
#include "roles/roles.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct check_args {
    const char *domain, *input, *monitor_log;
    int json;
    double timeout;
} check_args;

typedef struct tally {
    int n, solved, flagged;
    double sum;
} tally;

static void print_text(int line_no, const char *id, const prl_reward_result *r)
{
    char flags[128];
    prl_reward_flags_format(r->flags, flags, sizeof flags);
    printf("%d %s score=%.3f", line_no, id, r->score);
    if (flags[0]) printf(" flags=%s", flags);
    for (int i = 0; i < r->n_checks; i++) {
        const prl_reward_check *c = &r->checks[i];
        printf(" %s:%s", c->name, c->passed ? "ok" : "FAIL");
        if (!c->passed) printf("(%s)", c->detail);
    }
    printf("\n");
}

/* `--json` record of one task (docs/rewards.md): where it came from, then the verifier's
** result with `flags` as the names. */
static json_t *result_json(int line_no, const char *id, const char *domain,
                           const prl_reward_result *r)
{
    json_t *res = prl_reward_result_json(r);
    json_t *o =
        res ? json_pack("{s:i, s:s, s:s}", "line", line_no, "id", id, "domain", domain) : NULL;
    if (o) {
        json_object_set_new(o, "score", json_incref(json_object_get(res, "score")));
        json_object_set_new(o, "penalty", json_incref(json_object_get(res, "penalty")));
        json_object_set_new(o, "flags", json_incref(json_object_get(res, "flag_names")));
        json_object_set_new(o, "checks", json_incref(json_object_get(res, "checks")));
    }
    json_decref(res);
    return o;
}

/* Print the monitor's findings; append them to the log (with the answer) if asked. */
static int log_monitor(FILE *log, const char *path, int line_no, const char *id, json_t *line,
                       const prl_reward_result *r)
{
    json_t *msgs = json_object_get(line, "messages"), *resp = json_object_get(line, "response");
    const char *answer = resp ? json_string_value(resp)
                              : json_string_value(json_object_get(
                                    json_array_get(msgs, json_array_size(msgs) - 1), "content"));
    for (int i = 0; i < r->n_checks; i++) {
        const prl_reward_check *c = &r->checks[i];
        if (strncmp(c->name, "monitor:", 8) != 0 || c->passed) continue;
        fprintf(stderr, "prl tasks: monitor: %s:%d %s %s: %s\n", path, line_no, id, c->name + 8,
                c->detail);
        if (!log) continue;
        json_t *rec =
            json_pack("{s:s, s:i, s:s, s:s, s:s, s:s}", "input", path, "line", line_no, "id", id,
                      "rule", c->name + 8, "detail", c->detail, "answer", answer ? answer : "");
        char *text = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
        json_decref(rec);
        int ok = text && fprintf(log, "%s\n", text) > 0;
        free(text);
        if (!ok) return cli_failf("tasks", 1, "writing the monitor log failed");
    }
    return 0;
}

/* Score one line; 0, or an exit code after printing the error. */
static int check_line(const check_args *a, const prl_reward_exec *exec, FILE *log, int line_no,
                      const char *text, tally *t)
{
    json_error_t err;
    json_t *line = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    if (!line)
        return cli_failf("tasks", 1, "%s:%d: invalid JSON: %s (column %d)", a->input, line_no,
                         err.text, err.column);
    const char *domain = json_string_value(json_object_get(line, "domain"));
    const char *id = json_string_value(json_object_get(line, "id"));
    prl_task_domain d;
    int rc = 0;
    if (!domain || prl_tasks_domain_parse(domain, &d))
        rc = cli_failf("tasks", 1, "%s:%d: missing or unknown \"domain\"", a->input, line_no);
    else if (strcmp(a->domain, "all") && strcmp(a->domain, domain))
        rc = cli_failf("tasks", 1, "%s:%d: domain is '%s' but --domain is '%s'", a->input, line_no,
                       domain, a->domain);
    prl_reward_result r;
    if (!rc && prl_reward_score_line(text, exec, &r) != PRL_OK)
        rc = cli_failf("tasks", 1, "%s:%d: %s", a->input, line_no, prl_error_message());
    if (!rc) {
        char fallback[32];
        snprintf(fallback, sizeof fallback, "line-%d", line_no);
        if (!id) id = fallback;
        if (a->json) {
            json_t *o = result_json(line_no, id, domain, &r);
            char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
            if (s) printf("%s\n", s);
            free(s);
            json_decref(o);
        } else {
            print_text(line_no, id, &r);
        }
        if (r.flags & PRL_REWARD_HACKING) rc = log_monitor(log, a->input, line_no, id, line, &r);
        t[d].n++, t[d].sum += r.score, t[d].solved += r.score >= 1;
        t[d].flagged += (r.flags & PRL_REWARD_HACKING) != 0;
    }
    json_decref(line);
    return rc;
}

static void print_summary(const tally *t, int json)
{
    tally all = {0};
    for (int d = 0; d < PRL_TASK_N_DOMAINS; d++)
        all.n += t[d].n, all.sum += t[d].sum, all.solved += t[d].solved,
            all.flagged += t[d].flagged;
    for (int d = 0; d <= PRL_TASK_N_DOMAINS; d++) {
        const tally *x = d < PRL_TASK_N_DOMAINS ? &t[d] : &all;
        const char *name =
            d < PRL_TASK_N_DOMAINS ? prl_tasks_domain_name((prl_task_domain)d) : "all";
        if (x->n == 0 && d < PRL_TASK_N_DOMAINS) continue;
        double mean = x->n ? x->sum / x->n : 0, acc = x->n ? (double)x->solved / x->n : 0;
        if (json)
            printf("{\"summary\":\"%s\",\"n\":%d,\"mean_score\":%.6f,\"accuracy\":%.6f,\"flagged\":"
                   "%d}\n",
                   name, x->n, mean, acc, x->flagged);
        else
            printf("summary %s: %d lines, mean score %.4f, accuracy %.4f, flagged %d\n", name, x->n,
                   mean, acc, x->flagged);
    }
}

static int run(const check_args *a)
{
    if (strcmp(a->domain, "all")) {
        prl_task_domain d;
        if (prl_tasks_domain_parse(a->domain, &d))
            return cli_failf("tasks", 2, "--domain: %s", prl_error_message());
    }
    if (!(a->timeout > 0))
        return cli_failf("tasks", 2, "--timeout must be > 0, got %g", a->timeout);
    FILE *f = fopen(a->input, "rb");
    if (!f) return cli_failf("tasks", 1, "cannot open %s: %m", a->input);
    FILE *log = a->monitor_log ? fopen(a->monitor_log, "a") : NULL;
    if (a->monitor_log && !log) {
        fclose(f);
        return cli_failf("tasks", 1, "cannot open %s: %m", a->monitor_log);
    }
    prl_exec_local *runner = prl_exec_local_new();
    if (!runner) {
        fclose(f);
        if (log) fclose(log);
        return cli_failf("tasks", 1, "out of memory");
    }
    prl_reward_exec exec = {prl_exec_local_run, runner, a->timeout};
    tally t[PRL_TASK_N_DOMAINS] = {{0}};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0, line_no = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        rc = check_line(a, &exec, log, line_no, line, t);
    }
    if (!rc && ferror(f)) rc = cli_failf("tasks", 1, "read error in %s", a->input);
    free(line);
    fclose(f);
    prl_exec_local_free(runner);
    if (log && fclose(log) != 0 && !rc)
        rc = cli_failf("tasks", 1, "writing %s failed", a->monitor_log);
    if (!rc) print_summary(t, a->json);
    return rc;
}

int cmd_tasks_check(int argc, char **argv)
{
    check_args a = {.domain = NULL, .timeout = 2.0};
    cli_opt opts[] = {
        {"domain", OPT_STR, &a.domain, "D", "reasoning, general, agent, coding, or all", 1, 0},
        {"input", OPT_STR, &a.input, "FILE", "JSONL: tasks with the model's turns or \"response\"",
         1, 0},
        {"json", OPT_FLAG, &a.json, NULL, "write JSON objects instead of text", 0, 0},
        {"timeout", OPT_DOUBLE, &a.timeout, "S", "wall-time limit per program run (default 2)", 0,
         0},
        {"monitor-log", OPT_STR, &a.monitor_log, "FILE", "append reward-hacking findings as JSONL",
         0, 0},
        {0},
    };
    int rc = cli_parse(
        argc, argv, 3, opts, "prl tasks check --domain D --input FILE.jsonl [--json]",
        "Scores answers with the domain verifiers (programs run in the sandbox).", NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    return run(&a);
}
