/*
** reward.c — what every verifier shares: building a result and its score, parsing tasks
** and final answers, running programs through the execution callback, the python tool's
** observation format, and the dispatch on a task's domain (prl_reward_score, _score_line).
*/
#include "reward/reward_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---------------------------------------------------------------- results ---------- */

void reward__begin(prl_reward_result *out) { memset(out, 0, sizeof *out); }

void reward__check(prl_reward_result *out, const char *name, int passed, double weight,
                   int required, const char *fmt, ...)
{
    PRL_ASSERT(out->n_checks < PRL_REWARD_MAX_CHECKS); /* the verifiers bound their lists */
    prl_reward_check *c = &out->checks[out->n_checks++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->passed = passed;
    c->weight = weight;
    c->required = required;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->detail, sizeof c->detail, fmt, ap);
    va_end(ap);
}

void reward__finish(prl_reward_result *out)
{
    double got = 0, total = 0;
    int required_ok = 1;
    for (int i = 0; i < out->n_checks; i++) {
        const prl_reward_check *c = &out->checks[i];
        total += c->weight;
        got += c->passed ? c->weight : 0;
        if (c->required && !c->passed) required_ok = 0;
    }
    double s = !required_ok ? 0 : (total > 0 ? got / total : 1) - out->penalty;
    out->score = s < 0 ? 0 : s > 1 ? 1 : s;
}

void prl_reward_flags_format(unsigned flags, char *out, size_t n)
{
    static const char *const names[] = {"format_error", "tool_syntax", "parse_error",   "hacking",
                                        "exec_error",   "degenerate",  "judge_unparsed"};
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < 7 && at < n; i++)
        if (flags & (1u << i))
            at += (size_t)snprintf(out + at, n - at, "%s%s", at ? "," : "", names[i]);
}

json_t *prl_reward_result_json(const prl_reward_result *r)
{
    char flags[128];
    prl_reward_flags_format(r->flags, flags, sizeof flags);
    json_t *checks = json_array();
    for (int i = 0; checks && i < r->n_checks; i++) {
        const prl_reward_check *c = &r->checks[i];
        json_array_append_new(checks, json_pack("{s:s, s:b, s:f, s:b, s:s}", "name", c->name,
                                                "passed", c->passed, "weight", c->weight,
                                                "required", c->required, "detail", c->detail));
    }
    return json_pack("{s:f, s:f, s:i, s:s, s:o*}", "score", r->score, "penalty", r->penalty,
                     "flags", (int)r->flags, "flag_names", flags, "checks", checks);
}

/* ---------------------------------------------------------------- parsing ---------- */

static int word_char(char c) { return isalnum((unsigned char)c) || c == '\''; }

void reward__split_words(reward__text *t, const char *s)
{
    t->s = s;
    t->n_words = 0;
    for (const char *p = s; *p;) {
        if (!word_char(*p)) {
            p++;
            continue;
        }
        size_t n = 0; /* past REWARD_MAX_WORDS the last slot takes each further word */
        char *w = t->words[t->n_words < REWARD_MAX_WORDS ? t->n_words : REWARD_MAX_WORDS - 1];
        for (; word_char(*p); p++, n++)
            if (n < REWARD_WORD_LEN - 1) w[n] = (char)tolower((unsigned char)*p);
        w[n < REWARD_WORD_LEN - 1 ? n : REWARD_WORD_LEN - 1] = 0;
        if (t->n_words < REWARD_MAX_WORDS) t->n_words++;
    }
}

static prl_status check_turns(const prl_chat_message *turns, size_t n_turns)
{
    for (size_t i = 0; i < n_turns; i++) {
        const char *role = turns[i].role;
        if (!role || !turns[i].content || (strcmp(role, "assistant") && strcmp(role, "tool")))
            return prl_error_set(PRL_ERR_ARG,
                                 "turn %zu: role must be assistant or tool (got %s) "
                                 "with a content",
                                 i, role ? role : "none");
    }
    return PRL_OK;
}

prl_status reward__task(const char *task_json, prl_task_domain domain,
                        const prl_chat_message *turns, size_t n_turns, json_t **task)
{
    *task = NULL;
    prl_status rc = check_turns(turns, n_turns);
    if (rc) return rc;
    json_error_t err;
    *task = json_loads(task_json, JSON_REJECT_DUPLICATES, &err);
    if (!*task)
        return prl_error_set(PRL_ERR_FORMAT, "task: invalid JSON: %s (column %d)", err.text,
                             err.column);
    if (!json_is_object(*task)) {
        json_decref(*task);
        *task = NULL;
        return prl_error_set(PRL_ERR_FORMAT, "task: expected a JSON object");
    }
    const char *d = json_string_value(json_object_get(*task, "domain"));
    if (d && strcmp(d, prl_tasks_domain_name(domain)) != 0) {
        rc = prl_error_set(PRL_ERR_FORMAT, "task: domain is '%s', not '%s'", d,
                           prl_tasks_domain_name(domain));
        json_decref(*task); /* d points into it */
        *task = NULL;
    }
    return rc;
}

prl_status reward__task_list(const char *task_json, prl_task_domain domain,
                             const prl_chat_message *turns, size_t n_turns, const char *key,
                             json_t **task, json_t **list)
{
    prl_status rc = reward__task(task_json, domain, turns, n_turns, task);
    if (rc) return rc;
    *list = json_object_get(*task, key);
    size_t n = json_array_size(*list);
    if (json_is_array(*list) && n > 0 && n <= PRL_REWARD_MAX_ITEMS) return PRL_OK;
    json_decref(*task);
    *task = *list = NULL;
    return prl_error_set(PRL_ERR_FORMAT, "%s task: \"%s\" must be an array of 1..%d entries",
                         prl_tasks_domain_name(domain), key, PRL_REWARD_MAX_ITEMS);
}

const char *reward__last_assistant(const prl_chat_message *turns, size_t n_turns)
{
    for (size_t i = n_turns; i-- > 0;)
        if (turns[i].role && !strcmp(turns[i].role, "assistant")) return turns[i].content;
    return NULL;
}

const char *reward__prompt(const json_t *task)
{
    const char *text = "";
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(task, "messages"), i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (role && content && !strcmp(role, "user")) text = content;
    }
    return text;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

void reward__last_line(const char *text, char *out, size_t n)
{
    size_t end = strlen(text);
    while (end > 0 && is_space(text[end - 1])) end--;
    size_t start = end;
    while (start > 0 && text[start - 1] != '\n') start--;
    while (start < end && is_space(text[start])) start++;
    snprintf(out, n, "%.*s", (int)(end - start), text + start);
}

int reward__final_answer(const char *turn, char *value, size_t n, char *why, size_t why_n)
{
    static const char prefix[] = "Answer: ";
    char line[256];
    reward__last_line(turn, line, sizeof line);
    if (strncmp(line, prefix, sizeof prefix - 1) != 0) {
        snprintf(why, why_n, "the last line '%.60s' is not 'Answer: X'", line);
        return -1;
    }
    const char *x = line + sizeof prefix - 1;
    if (!*x || is_space(*x)) {
        snprintf(why, why_n, "'Answer:' has no value");
        return -1;
    }
    snprintf(value, n, "%s", x);
    return 0;
}

const char *reward__last_ci(const char *text, const char *needle)
{
    const char *at = NULL;
    size_t k = strlen(needle);
    for (const char *p = text; *p; p++)
        if (!strncasecmp(p, needle, k)) at = p;
    return at;
}

int reward__parse_int(const char *s, int64_t *v)
{
    const char *p = s + (*s == '-');
    if (!*p || strlen(p) > 15) return -1;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9') return -1;
    *v = strtoll(s, NULL, 10);
    return 0;
}

/* ---------------------------------------------------------------- execution -------- */

void prl_reward_exec_result_free(prl_reward_exec_result *res)
{
    free(res->stdout_data);
    free(res->stderr_data);
    memset(res, 0, sizeof *res);
}

prl_status reward__run(const prl_reward_exec *exec, const char *program, const char *stdin_data,
                       size_t stdin_len, prl_reward_exec_result *res)
{
    memset(res, 0, sizeof *res);
    if (!exec || !exec->fn)
        return prl_error_set(PRL_ERR_ARG,
                             "reward: this answer runs a program but no executor was given");
    if (!*program) { /* what python3 does with an empty file; executors may refuse one (the
                        sandbox does), and a model's empty code block is a bad answer, not an error */
        res->stdout_data = strdup(""), res->stderr_data = strdup("");
        snprintf(res->status, sizeof res->status, "ok");
        if (res->stdout_data && res->stderr_data) return PRL_OK;
        prl_reward_exec_result_free(res);
        return prl_error_set(PRL_ERR_NOMEM, "reward: empty program");
    }
    prl_reward_exec_request req = {.lang = "python3",
                                   .program = program,
                                   .stdin_data = stdin_data,
                                   .stdin_len = stdin_len,
                                   .wall_s = exec->wall_s > 0 ? exec->wall_s : 2.0};
    prl_status rc = exec->fn(exec->ctx, &req, res);
    if (rc == PRL_OK && (!res->stdout_data || !res->stderr_data)) {
        prl_reward_exec_result_free(res);
        rc =
            prl_error_set(PRL_ERR_FORMAT, "reward: the executor returned no stdout/stderr buffers");
    }
    return rc;
}

prl_status prl_reward_python_observation(const prl_reward_exec *exec, const char *code,
                                         size_t code_len, char **observation)
{
    *observation = NULL;
    char *program = malloc(code_len + 1);
    if (!program) return prl_error_set(PRL_ERR_NOMEM, "python tool");
    memcpy(program, code, code_len);
    program[code_len] = 0;
    prl_reward_exec_result res;
    prl_status rc = reward__run(exec, program, NULL, 0, &res);
    free(program);
    if (rc) return rc;
    char text[256];
    if (!strcmp(res.status, "ok")) {
        size_t n = res.stdout_len;
        while (n > 0 && is_space(res.stdout_data[n - 1])) n--;
        snprintf(text, sizeof text, "%.*s", (int)(n > 200 ? 200 : n), res.stdout_data);
    } else if (!strcmp(res.status, "timeout")) {
        snprintf(text, sizeof text, "error: timeout");
    } else {
        char last[200];
        reward__last_line(res.stderr_data, last, sizeof last);
        snprintf(text, sizeof text, "error: %s", last[0] ? last : res.status);
    }
    prl_reward_exec_result_free(&res);
    *observation = strdup(text);
    return *observation ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "python tool");
}

/* ---------------------------------------------------------------- dispatch --------- */

/* A prompt-file line's named verifier (its "domain" is the one the verifier plays as). */
static prl_status score_verifier(const char *name, const char *task_json,
                                 const prl_chat_message *turns, size_t n_turns,
                                 const prl_reward_exec *exec, prl_reward_result *out)
{
    if (!strcmp(name, "math")) return prl_reward_math(task_json, turns, n_turns, exec, out);
    if (!strcmp(name, "choice")) return prl_reward_choice(task_json, turns, n_turns, exec, out);
    if (!strcmp(name, "code")) return prl_reward_coding(task_json, turns, n_turns, exec, out);
    if (!strcmp(name, "constraints")) return prl_reward_general(task_json, turns, n_turns, out);
    if (!strcmp(name, "agent")) return prl_reward_agent(task_json, turns, n_turns, out);
    return prl_error_set(PRL_ERR_FORMAT,
                         "task: \"verifier\" '%s' is not one of math, code, constraints, "
                         "choice, agent",
                         name);
}

static int is_answer(const prl_chat_message *t)
{
    return t->role && t->content && !strcmp(t->role, "assistant");
}

/* The verifiers judge answers, not reasoning: each assistant turn as the text after its
** leading think block (docs/tasks.md "Modes"). *view borrows the turns' strings; NULL when no
** turn has a block (the turns as they are, malformed ones included: the verifier names them). */
static prl_status answers_only(const prl_chat_message *turns, size_t n_turns,
                               prl_chat_message **view)
{
    *view = NULL;
    size_t with_block = 0;
    for (size_t i = 0; i < n_turns; i++)
        with_block += is_answer(&turns[i]) && prl_tasks_answer_offset(turns[i].content) > 0;
    if (!with_block) return PRL_OK;
    prl_chat_message *v = malloc((n_turns ? n_turns : 1) * sizeof *v);
    if (!v) return prl_error_set(PRL_ERR_NOMEM, "scoring: answer view");
    for (size_t i = 0; i < n_turns; i++) {
        v[i] = turns[i];
        if (is_answer(&turns[i]))
            v[i].content = turns[i].content + prl_tasks_answer_offset(turns[i].content);
    }
    *view = v;
    return PRL_OK;
}

static prl_status score_answers(const char *task_json, const prl_chat_message *turns,
                                size_t n_turns, const prl_reward_exec *exec,
                                prl_reward_result *out);

prl_status prl_reward_score(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                            const prl_reward_exec *exec, prl_reward_result *out)
{
    prl_chat_message *view = NULL;
    prl_status rc = turns ? answers_only(turns, n_turns, &view) : PRL_OK; /* bad turns: the
                                                                  ** verifier names them */
    if (rc) return rc;
    rc = score_answers(task_json, view ? view : turns, n_turns, exec, out);
    free(view);
    return rc;
}

static prl_status score_answers(const char *task_json, const prl_chat_message *turns,
                                size_t n_turns, const prl_reward_exec *exec, prl_reward_result *out)
{
    json_error_t err;
    json_t *task = json_loads(task_json, 0, &err);
    const char *name = json_string_value(json_object_get(task, "domain"));
    char verifier[16] = "";
    json_t *v = json_object_get(task, "verifier");
    if (v)
        snprintf(verifier, sizeof verifier, "%s", json_is_string(v) ? json_string_value(v) : "?");
    prl_task_domain d = PRL_TASK_REASONING;
    prl_status rc = !task   ? prl_error_set(PRL_ERR_FORMAT, "task: invalid JSON: %s", err.text)
                    : !name ? prl_error_set(PRL_ERR_FORMAT, "task: missing string field \"domain\"")
                            : prl_tasks_domain_parse(name, &d);
    json_decref(task);
    if (rc) return rc;
    if (*verifier) return score_verifier(verifier, task_json, turns, n_turns, exec, out);
    switch (d) {
    case PRL_TASK_REASONING: return prl_reward_reasoning(task_json, turns, n_turns, exec, out);
    case PRL_TASK_GENERAL: return prl_reward_general(task_json, turns, n_turns, out);
    case PRL_TASK_AGENT: return prl_reward_agent(task_json, turns, n_turns, out);
    case PRL_TASK_CODING: return prl_reward_coding(task_json, turns, n_turns, exec, out);
    case PRL_TASK_N_DOMAINS: break;
    }
    return prl_error_set(PRL_ERR_ARG, "task: domain out of range");
}

prl_status prl_reward_score_line(const char *line_json, const prl_reward_exec *exec,
                                 prl_reward_result *out)
{
    json_error_t err;
    json_t *line = json_loads(line_json, JSON_REJECT_DUPLICATES, &err);
    if (!line)
        return prl_error_set(PRL_ERR_FORMAT, "invalid JSON: %s (column %d)", err.text, err.column);
    json_t *msgs = json_object_get(line, "messages"), *response = json_object_get(line, "response");
    size_t n = json_array_size(msgs), first = 0;
    prl_status rc = PRL_OK;
    if (!json_is_object(line) || !json_is_array(msgs))
        rc = prl_error_set(PRL_ERR_FORMAT, "expected an object with a \"messages\" array");
    else if (response && !json_is_string(response))
        rc = prl_error_set(PRL_ERR_FORMAT, "\"response\" must be a string");
    for (size_t i = 0; rc == PRL_OK && i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || !json_is_string(json_object_get(m, "content")))
            rc = prl_error_set(PRL_ERR_FORMAT, "message %zu needs string \"role\" and \"content\"",
                               i);
        else if (!strcmp(role, "user") || !strcmp(role, "system")) first = i + 1;
    }
    size_t n_turns = n - first + (response != NULL);
    if (rc == PRL_OK && n_turns == 0)
        rc = prl_error_set(PRL_ERR_FORMAT, "no answer to score: add a \"response\" string or the "
                                           "model's turns after the prompt in \"messages\"");
    prl_chat_message *turns = rc ? NULL : calloc(n_turns, sizeof *turns);
    if (rc == PRL_OK && !turns) rc = prl_error_set(PRL_ERR_NOMEM, "scoring a line");
    for (size_t i = first; rc == PRL_OK && i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        turns[i - first] = (prl_chat_message){json_string_value(json_object_get(m, "role")),
                                              json_string_value(json_object_get(m, "content"))};
    }
    if (rc == PRL_OK && response)
        turns[n_turns - 1] = (prl_chat_message){"assistant", json_string_value(response)};
    if (rc == PRL_OK) rc = prl_reward_score(line_json, turns, n_turns, exec, out);
    free(turns);
    json_decref(line);
    return rc;
}

void prl_reward_unfinished(prl_reward_result *r)
{
    if (r->n_checks < PRL_REWARD_MAX_CHECKS) {
        prl_reward_check *k = &r->checks[r->n_checks++];
        memset(k, 0, sizeof *k);
        snprintf(k->name, sizeof k->name, "finished");
        snprintf(k->detail, sizeof k->detail, "the turn was cut off before <|end|>");
        k->passed = 0, k->weight = 0, k->required = 1;
    }
    r->score = 0;
}
