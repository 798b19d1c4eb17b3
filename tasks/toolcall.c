/*
** toolcall.c — the strict parser of the tool-call syntax (grammar in tasks.h and
** docs/tasks.md). It checks only the syntax; which tools and arguments exist is the business
** of the environment (agent_env.c) or verifier (reward/) that receives the call.
*/
#include "tasks/tasks.h"

#include <stdarg.h>
#include <string.h>

static prl_tool_parse malformed(prl_tool_call *call, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static prl_tool_parse malformed(prl_tool_call *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call->error, sizeof call->error, fmt, ap);
    va_end(ap);
    return PRL_TOOL_MALFORMED;
}

static int is_name_char(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

static int is_value_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '+' || c == '-' || c == '*' || c == '(' || c == ')';
}

/* Copy a run of chars accepted by `ok` from *p into out (cap bytes incl. NUL); returns its
** length, or -1 if it is longer than cap - 1. Advances *p past the run. */
static int take(const char **p, const char *end, int (*ok)(char), char *out, size_t cap)
{
    size_t n = 0;
    while (*p + n < end && ok((*p)[n])) n++;
    if (n >= cap) return -1;
    memcpy(out, *p, n);
    out[n] = 0;
    *p += n;
    return (int)n;
}

/* name=value pairs separated by single spaces, from p to end. */
static prl_tool_parse parse_args(const char *p, const char *end, prl_tool_call *call)
{
    while (p < end) {
        if (*p != ' ') return malformed(call, "expected ' ' before argument %d", call->n_args + 1);
        p++;
        if (call->n_args == PRL_TOOL_MAX_ARGS)
            return malformed(call, "more than %d arguments", PRL_TOOL_MAX_ARGS);
        prl_tool_arg *a = &call->args[call->n_args];
        int n = take(&p, end, is_name_char, a->key, sizeof a->key);
        if (n <= 0)
            return malformed(call,
                             n < 0 ? "argument name longer than %d characters"
                                   : "argument %d has no name (expected key=value)",
                             n < 0 ? (int)sizeof a->key - 1 : call->n_args + 1);
        if (p == end || *p != '=') return malformed(call, "argument '%s' needs '=value'", a->key);
        p++;
        n = take(&p, end, is_value_char, a->value, sizeof a->value);
        if (n <= 0)
            return malformed(call,
                             n < 0 ? "value of '%s' longer than 63 characters"
                                   : "argument '%s' has an empty or invalid value",
                             a->key);
        if (p < end && *p != ' ')
            return malformed(call, "invalid character '%c' in the value of '%s'", *p, a->key);
        for (int i = 0; i < call->n_args; i++)
            if (!strcmp(call->args[i].key, a->key))
                return malformed(call, "argument '%s' given twice", a->key);
        call->n_args++;
    }
    return PRL_TOOL_OK;
}

static int only_space(const char *p)
{
    for (; *p; p++)
        if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r') return 0;
    return 1;
}

prl_tool_parse prl_tasks_tool_call_parse(const char *turn, prl_tool_call *call)
{
    memset(call, 0, sizeof *call);
    const char *open = strstr(turn, PRL_TOOL_CALL_OPEN);
    if (!open) {
        if (strstr(turn, PRL_TOOL_CALL_CLOSE))
            return malformed(call, PRL_TOOL_CALL_CLOSE " without " PRL_TOOL_CALL_OPEN);
        return PRL_TOOL_NONE;
    }
    const char *p = open + strlen(PRL_TOOL_CALL_OPEN);
    const char *end = strstr(p, PRL_TOOL_CALL_CLOSE);
    if (!end) return malformed(call, "no " PRL_TOOL_CALL_CLOSE " after " PRL_TOOL_CALL_OPEN);
    const char *after = end + strlen(PRL_TOOL_CALL_CLOSE);
    if (strstr(after, PRL_TOOL_CALL_OPEN))
        return malformed(call, "more than one tool call in a turn");
    if (!only_space(after)) return malformed(call, "text after " PRL_TOOL_CALL_CLOSE);
    int n = take(&p, end, is_name_char, call->name, sizeof call->name);
    if (n < 0)
        return malformed(call, "tool name longer than %d characters", (int)sizeof call->name - 1);
    if (n == 0) return malformed(call, "a tool call must start with a tool name [a-z_]");
    if (p < end && *p == '\n') {
        call->body = p + 1;
        call->body_len = (size_t)(end - p - 1);
        return PRL_TOOL_OK;
    }
    return parse_args(p, end, call);
}

const char *prl_tasks_tool_arg(const prl_tool_call *call, const char *key)
{
    for (int i = 0; i < call->n_args; i++)
        if (!strcmp(call->args[i].key, key)) return call->args[i].value;
    return NULL;
}
