/*
** agent_env.c — the Agent domain's tool environment: a shop inventory played turn by turn.
**
** reset(seed, difficulty) loads the world of prl_agent_task_make; step(turn) parses the
** turn's tool call (toolcall.c), checks it against the tool signatures and runs it:
**
**   list                                          "apple, pear, plum"
**   lookup item=NAME                              "pear: stock 9, price 4"
**   update item=NAME field=stock|price value=N    "pear: stock 7, price 4" (the new record)
**   calc expr=EXPR                                "7"   (integers, + - *, parentheses)
**
** A call that breaks the syntax or a signature (unknown tool or argument, missing argument,
** bad field, number or expression) is malformed: its observation is "error: malformed tool
** call: <why>" and it is counted. A well-formed call on an unknown item is a tool error
** ("error: no item 'x'"), not malformed. The environment does not judge success: that is
** the verifier's job in reward/agent.c, which recomputes the goal without this code.
*/
#include "tasks/tasks.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct prl_agent_env {
    prl_agent_task task;
    prl_agent_world world;
    int calls, malformed, done, started;
    char obs[256];
};

prl_status prl_agent_env_init(prl_agent_env **env)
{
    *env = calloc(1, sizeof **env);
    return *env ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "agent env");
}

void prl_agent_env_free(prl_agent_env *env) { free(env); }

prl_status prl_agent_env_reset(prl_agent_env *env, uint64_t seed, int difficulty,
                               const prl_agent_task **task)
{
    prl_agent_task t;
    prl_status rc = prl_agent_task_make(seed, difficulty, &t);
    return rc ? rc : prl_agent_env_reset_task(env, &t, task);
}

prl_status prl_agent_env_reset_task(prl_agent_env *env, const prl_agent_task *t,
                                    const prl_agent_task **task)
{
    env->task = *t;
    env->world = env->task.world;
    env->calls = env->malformed = env->done = 0;
    env->started = 1;
    env->obs[0] = 0;
    if (task) *task = &env->task;
    return PRL_OK;
}

const prl_agent_world *prl_agent_env_world(const prl_agent_env *env) { return &env->world; }
int prl_agent_env_calls(const prl_agent_env *env) { return env->calls; }
int prl_agent_env_malformed(const prl_agent_env *env) { return env->malformed; }

/* ---------------------------------------------------------------- calc ------------- */

typedef struct calc {
    const char *p;
    int bad;
} calc;

static int64_t calc_expr(calc *c);

static int64_t calc_factor(calc *c)
{
    if (*c->p == '(') {
        c->p++;
        int64_t v = calc_expr(c);
        if (*c->p != ')') c->bad = 1;
        else c->p++;
        return v;
    }
    if (*c->p < '0' || *c->p > '9') {
        c->bad = 1;
        return 0;
    }
    int64_t v = 0;
    int digits = 0;
    for (; *c->p >= '0' && *c->p <= '9'; c->p++, digits++) v = v * 10 + (*c->p - '0');
    if (digits > 12) c->bad = 1;
    return v;
}

static int64_t calc_term(calc *c)
{
    int64_t v = calc_factor(c);
    while (!c->bad && *c->p == '*') {
        c->p++;
        int64_t w = calc_factor(c);
        if (__builtin_mul_overflow(v, w, &v)) c->bad = 1;
    }
    return v;
}

static int64_t calc_expr(calc *c)
{
    int64_t v = calc_term(c);
    while (!c->bad && (*c->p == '+' || *c->p == '-')) {
        char op = *c->p++;
        int64_t w = calc_term(c);
        if (op == '+' ? __builtin_add_overflow(v, w, &v) : __builtin_sub_overflow(v, w, &v))
            c->bad = 1;
    }
    return v;
}

int prl_agent_calc(const char *expr, int64_t *value)
{
    calc c = {expr, 0};
    int64_t v = calc_expr(&c);
    if (c.bad || *c.p) return -1;
    *value = v;
    return 0;
}

/* ---------------------------------------------------------------- tools ------------ */

static void say(prl_agent_env *env, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(prl_agent_env *env, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(env->obs, sizeof env->obs, fmt, ap);
    va_end(ap);
}

static void bad_call(prl_agent_env *env, const char *why)
{
    env->malformed++;
    say(env, "error: malformed tool call: %s", why);
}

/* 1 if the call has exactly the arguments named in keys (NULL-terminated), else reports. */
static int signature(prl_agent_env *env, const prl_tool_call *call, const char *const *keys,
                     const char *usage)
{
    int n = 0;
    char why[160];
    for (; keys[n]; n++)
        if (!prl_tasks_tool_arg(call, keys[n])) {
            snprintf(why, sizeof why, "%s needs %s=... (usage: %s)", call->name, keys[n], usage);
            bad_call(env, why);
            return 0;
        }
    for (int i = 0; i < call->n_args; i++) {
        int known = 0;
        for (int k = 0; k < n; k++) known |= !strcmp(call->args[i].key, keys[k]);
        if (!known) {
            snprintf(why, sizeof why, "%s has no argument '%s' (usage: %s)", call->name,
                     call->args[i].key, usage);
            bad_call(env, why);
            return 0;
        }
    }
    return 1;
}

static prl_agent_item *find_item(prl_agent_env *env, const char *name)
{
    for (int i = 0; i < env->world.n_items; i++)
        if (!strcmp(env->world.items[i].name, name)) return &env->world.items[i];
    say(env, "error: no item '%s'", name);
    return NULL;
}

static void say_item(prl_agent_env *env, const prl_agent_item *it)
{
    say(env, "%s: stock %lld, price %lld", it->name, (long long)it->stock, (long long)it->price);
}

static void tool_list(prl_agent_env *env, const prl_tool_call *call)
{
    static const char *const keys[] = {NULL};
    if (!signature(env, call, keys, "list")) return;
    size_t at = 0;
    env->obs[0] = 0;
    for (int i = 0; i < env->world.n_items; i++)
        at += (size_t)snprintf(env->obs + at, sizeof env->obs - at, "%s%s", i ? ", " : "",
                               env->world.items[i].name);
}

static void tool_lookup(prl_agent_env *env, const prl_tool_call *call)
{
    static const char *const keys[] = {"item", NULL};
    if (!signature(env, call, keys, "lookup item=NAME")) return;
    prl_agent_item *it = find_item(env, prl_tasks_tool_arg(call, "item"));
    if (it) say_item(env, it);
}

/* A non-negative integer of at most 6 digits, or -1. */
static int64_t parse_amount(const char *s)
{
    int64_t v = 0;
    int n = 0;
    for (; s[n] >= '0' && s[n] <= '9' && n < 7; n++) v = v * 10 + (s[n] - '0');
    return n == 0 || n > 6 || s[n] ? -1 : v;
}

static void tool_update(prl_agent_env *env, const prl_tool_call *call)
{
    static const char *const keys[] = {"item", "field", "value", NULL};
    const char *usage = "update item=NAME field=stock|price value=N";
    if (!signature(env, call, keys, usage)) return;
    const char *field = prl_tasks_tool_arg(call, "field");
    int64_t value = parse_amount(prl_tasks_tool_arg(call, "value"));
    char why[160];
    if (strcmp(field, "stock") && strcmp(field, "price")) {
        snprintf(why, sizeof why, "field must be stock or price, not '%s'", field);
        bad_call(env, why);
        return;
    }
    if (value < 0) {
        snprintf(why, sizeof why, "value must be a whole number 0..999999, not '%s'",
                 prl_tasks_tool_arg(call, "value"));
        bad_call(env, why);
        return;
    }
    prl_agent_item *it = find_item(env, prl_tasks_tool_arg(call, "item"));
    if (!it) return;
    *(strcmp(field, "stock") ? &it->price : &it->stock) = value;
    say_item(env, it);
}

static void tool_calc(prl_agent_env *env, const prl_tool_call *call)
{
    static const char *const keys[] = {"expr", NULL};
    if (!signature(env, call, keys, "calc expr=EXPR")) return;
    int64_t v;
    const char *expr = prl_tasks_tool_arg(call, "expr");
    char why[160];
    if (prl_agent_calc(expr, &v) != 0) {
        snprintf(why, sizeof why, "bad expression '%s' (integers, + - * and parentheses)", expr);
        bad_call(env, why);
        return;
    }
    say(env, "%lld", (long long)v);
}

prl_status prl_agent_env_step(prl_agent_env *env, const char *turn, prl_agent_step *out)
{
    if (!env->started) return prl_error_set(PRL_ERR_ARG, "agent env: step before reset");
    if (env->done) return prl_error_set(PRL_ERR_ARG, "agent env: step after the episode ended");
    *out = (prl_agent_step){0};
    prl_tool_call call;
    prl_tool_parse kind = prl_tasks_tool_call_parse(turn, &call);
    if (kind == PRL_TOOL_NONE) {
        env->done = out->done = 1;
        out->answer = turn;
        return PRL_OK;
    }
    if (env->calls == PRL_AGENT_MAX_CALLS) {
        env->done = out->done = 1;
        say(env, "error: tool call limit (%d) reached", PRL_AGENT_MAX_CALLS);
        out->observation = env->obs;
        return PRL_OK;
    }
    env->calls++;
    int before = env->malformed;
    static const struct {
        const char *name;
        void (*run)(prl_agent_env *, const prl_tool_call *);
    } tools[] = {{"list", tool_list},
                 {"lookup", tool_lookup},
                 {"update", tool_update},
                 {"calc", tool_calc}};
    int t = 0;
    while (kind == PRL_TOOL_OK && t < 4 && strcmp(call.name, tools[t].name)) t++;
    char why[96];
    if (kind == PRL_TOOL_MALFORMED) {
        bad_call(env, call.error);
    } else if (t == 4) {
        snprintf(why, sizeof why, "unknown tool '%s' (tools: list, lookup, update, calc)",
                 call.name);
        bad_call(env, why);
    } else if (call.body) {
        snprintf(why, sizeof why, "%s takes key=value arguments, not a program", call.name);
        bad_call(env, why);
    } else {
        tools[t].run(env, &call);
    }
    out->malformed = env->malformed > before;
    out->observation = env->obs;
    return PRL_OK;
}
