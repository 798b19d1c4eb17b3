/*
** agent.c — the Agent domain's episodes (world + goal, a pure function of a seed) and their
** demonstrations: an oracle plan of tool calls played through the real environment, so every
** observation in a demonstration is what the environment answers.
**
** Difficulty: d1 one lookup or update (3 items), d2 lookup + calc (+ update) (4 items),
** d3 several lookups, calc and update (4 items). A deliberate mistake is one of: a wrong
** final answer, an update written with a wrong value (goals that update), or a malformed
** first call followed by the correct one (penalised but recovered).
*/
#include "tasks/tasks_int.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { N_NAMES = 10, MAX_PLAN = PRL_AGENT_MAX_CALLS };

static const char *const item_names[N_NAMES] = {"apple", "pear", "plum", "lemon", "melon",
                                                "grape", "kiwi", "fig",  "lime",  "date"};

const char *prl_agent_system_prompt(void)
{
    return "Tools: list; lookup item=X; update item=X field=stock|price value=N; calc expr=E. "
           "End with Answer: X";
}

void prl_agent_world_format(const prl_agent_world *w, char *out, size_t n)
{
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < w->n_items && at < n; i++)
        at += (size_t)snprintf(out + at, n - at, "%s%s: stock %lld, price %lld", i ? "; " : "",
                               w->items[i].name, (long long)w->items[i].stock,
                               (long long)w->items[i].price);
}

static void make_world(prl_rng *r, int n_items, prl_agent_world *w)
{
    int used[N_NAMES] = {0};
    w->n_items = n_items;
    for (int i = 0; i < n_items; i++) {
        int k;
        do k = (int)tasks__range(r, 0, N_NAMES - 1);
        while (used[k]);
        used[k] = 1;
        snprintf(w->items[i].name, sizeof w->items[i].name, "%s", item_names[k]);
        w->items[i].stock = tasks__range(r, 0, 20);
        w->items[i].price = tasks__range(r, 1, 9);
    }
}

/* The goal and its numbers; adjusts the world where a goal needs it (enough stock to sell,
** one strictly cheapest item). */
static void make_goal(prl_rng *r, prl_agent_task *t)
{
    static const prl_agent_goal by_difficulty[3][3] = {
        {PRL_AGENT_PRICE, PRL_AGENT_STOCK, PRL_AGENT_SET_PRICE},
        {PRL_AGENT_COST, PRL_AGENT_SELL, PRL_AGENT_RESTOCK},
        {PRL_AGENT_VALUE, PRL_AGENT_CHEAPEST, PRL_AGENT_SELL_COST}};
    prl_agent_world *w = &t->world;
    t->goal = by_difficulty[t->difficulty - 1][tasks__range(r, 0, 2)];
    t->item = (int)tasks__range(r, 0, w->n_items - 1);
    t->item2 = -1;
    prl_agent_item *it = &w->items[t->item];
    switch (t->goal) {
    case PRL_AGENT_SET_PRICE:
        t->amount = tasks__range(r, 1, 8);
        if (t->amount >= it->price) t->amount++; /* a new price, never the current one */
        break;
    case PRL_AGENT_COST: t->amount = tasks__range(r, 2, 9); break;
    case PRL_AGENT_SELL:
    case PRL_AGENT_SELL_COST:
        t->amount = tasks__range(r, 1, 5) + (t->goal == PRL_AGENT_SELL_COST);
        if (it->stock < t->amount) it->stock = t->amount + tasks__range(r, 0, 10);
        break;
    case PRL_AGENT_RESTOCK: t->amount = tasks__range(r, 1, 20); break;
    case PRL_AGENT_VALUE:
        t->item2 = (t->item + 1 + (int)tasks__range(r, 0, w->n_items - 2)) % w->n_items;
        break;
    case PRL_AGENT_CHEAPEST:
        for (int i = 0; i < w->n_items; i++) w->items[i].price = tasks__range(r, 3, 9);
        it->price = tasks__range(r, 1, 2);
        break;
    default: break;
    }
}

void tasks__agent_prompt(prl_agent_task *t)
{
    const char *x = t->world.items[t->item].name;
    long long a = (long long)t->amount;
    char *p = t->prompt;
    size_t n = sizeof t->prompt;
    switch (t->goal) {
    case PRL_AGENT_PRICE: snprintf(p, n, "What is the price of one %s?", x); break;
    case PRL_AGENT_STOCK: snprintf(p, n, "How many %ss are in stock?", x); break;
    case PRL_AGENT_SET_PRICE:
        snprintf(p, n, "Set the price of %s to %lld. What is its new price?", x, a);
        break;
    case PRL_AGENT_COST: snprintf(p, n, "What do %lld %ss cost?", a, x); break;
    case PRL_AGENT_SELL: snprintf(p, n, "Sell %lld %ss. What is the new stock?", a, x); break;
    case PRL_AGENT_RESTOCK:
        snprintf(p, n, "Add %lld %ss to the stock. What is the new stock?", a, x);
        break;
    case PRL_AGENT_VALUE:
        snprintf(p, n, "What is the total value of the %s and %s stock?", x,
                 t->world.items[t->item2].name);
        break;
    case PRL_AGENT_CHEAPEST: snprintf(p, n, "Which item is the cheapest?"); break;
    case PRL_AGENT_SELL_COST: snprintf(p, n, "Sell %lld %ss. What do they cost?", a, x); break;
    case PRL_AGENT_N_GOALS: break;
    }
}

prl_status prl_agent_task_make(uint64_t seed, int difficulty, prl_agent_task *t)
{
    if (difficulty < 1 || difficulty > PRL_TASKS_MAX_DIFFICULTY)
        return prl_error_set(PRL_ERR_ARG, "agent: difficulty %d must be 1..%d", difficulty,
                             PRL_TASKS_MAX_DIFFICULTY);
    memset(t, 0, sizeof *t);
    t->seed = seed;
    t->difficulty = difficulty;
    prl_rng r;
    prl_rng_init(&r, seed, (uint64_t)difficulty, 0, 0, PRL_RNG_TASK);
    make_world(&r, difficulty == 1 ? 3 : 4, &t->world);
    make_goal(&r, t);
    tasks__agent_prompt(t);
    return PRL_OK;
}

/* ---------------------------------------------------------------- demonstrations --- */

typedef struct plan {
    char calls[MAX_PLAN][96];
    int n;
    char answer[32];
} plan;

static void add_call(plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add_call(plan *p, const char *fmt, ...)
{
    PRL_ASSERT(p->n < MAX_PLAN);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->calls[p->n++], sizeof p->calls[0], fmt, ap);
    va_end(ap);
}

/* The oracle's tool calls and answer for t (`delta` shifts the value an update writes). */
static void make_plan(const prl_agent_task *t, int64_t delta, plan *p)
{
    const prl_agent_item *it = &t->world.items[t->item];
    const char *x = it->name;
    long long s = (long long)it->stock, pr = (long long)it->price, a = (long long)t->amount;
    long long d = (long long)delta, ans = 0;
    memset(p, 0, sizeof *p);
    switch (t->goal) {
    case PRL_AGENT_PRICE: add_call(p, "lookup item=%s", x), ans = pr; break;
    case PRL_AGENT_STOCK: add_call(p, "lookup item=%s", x), ans = s; break;
    case PRL_AGENT_SET_PRICE:
        add_call(p, "update item=%s field=price value=%lld", x, a + d), ans = a + d;
        break;
    case PRL_AGENT_COST:
        add_call(p, "lookup item=%s", x);
        add_call(p, "calc expr=%lld*%lld", a, pr);
        ans = a * pr;
        break;
    case PRL_AGENT_SELL:
    case PRL_AGENT_RESTOCK:
    case PRL_AGENT_SELL_COST: {
        char op = t->goal == PRL_AGENT_RESTOCK ? '+' : '-';
        long long now = (op == '+' ? s + a : s - a) + d;
        add_call(p, "lookup item=%s", x);
        add_call(p, "calc expr=%lld%c%lld", s, op, a);
        add_call(p, "update item=%s field=stock value=%lld", x, now);
        ans = now;
        if (t->goal == PRL_AGENT_SELL_COST) {
            add_call(p, "calc expr=%lld*%lld", a, pr);
            ans = a * pr;
        }
        break;
    }
    case PRL_AGENT_VALUE: {
        const prl_agent_item *y = &t->world.items[t->item2];
        add_call(p, "lookup item=%s", x);
        add_call(p, "lookup item=%s", y->name);
        add_call(p, "calc expr=%lld*%lld+%lld*%lld", s, pr, (long long)y->stock,
                 (long long)y->price);
        ans = s * pr + (long long)(y->stock * y->price);
        break;
    }
    case PRL_AGENT_CHEAPEST:
        add_call(p, "list");
        for (int i = 0; i < t->world.n_items; i++)
            add_call(p, "lookup item=%s", t->world.items[i].name);
        snprintf(p->answer, sizeof p->answer, "%s", x);
        return;
    case PRL_AGENT_N_GOALS: break;
    }
    snprintf(p->answer, sizeof p->answer, "%lld", ans);
}

static int updates(prl_agent_goal g)
{
    return g == PRL_AGENT_SET_PRICE || g == PRL_AGENT_SELL || g == PRL_AGENT_RESTOCK ||
           g == PRL_AGENT_SELL_COST;
}

/* A malformed version of a call: missing "key=", an unknown tool, or no closing tag. */
static void malformed_turn(prl_rng *r, const char *call, char *out, size_t n)
{
    const char *sp = strchr(call, ' '), *eq = sp ? strchr(sp, '=') : NULL;
    int variant = (int)tasks__range(r, 0, 2);
    if (variant == 0 && !eq) variant = 1; /* a call without arguments has no key to drop */
    if (variant == 0)                     /* "lookup pear" */
        snprintf(out, n, PRL_TOOL_CALL_OPEN "%.*s %s" PRL_TOOL_CALL_CLOSE, (int)(sp - call), call,
                 eq + 1);
    else if (variant == 1) /* an unknown tool */
        snprintf(out, n, PRL_TOOL_CALL_OPEN "get%s" PRL_TOOL_CALL_CLOSE, sp ? sp : "");
    else /* no closing tag */ snprintf(out, n, PRL_TOOL_CALL_OPEN "%s", call);
}

/* Play one assistant turn through the env and append it and the observation. */
static prl_status play(prl_agent_env *env, json_t *turns, const char *turn)
{
    prl_agent_step st;
    prl_status rc = prl_agent_env_step(env, turn, &st);
    if (rc == PRL_OK) rc = tasks__append(turns, "assistant", turn);
    if (rc == PRL_OK && st.observation) rc = tasks__append(turns, "tool", st.observation);
    return rc;
}

static prl_status demo(tasks__gen *g, const prl_agent_task *t, json_t *turns, const char **kind)
{
    enum { WRONG_ANSWER, WRONG_UPDATE, MALFORMED } mistake = WRONG_ANSWER;
    int slip = tasks__chance(&g->demo, g->error_rate);
    if (slip) {
        mistake = (int)tasks__range(&g->demo, 0, 2);
        if (mistake == WRONG_UPDATE && !updates(t->goal)) mistake = WRONG_ANSWER;
    }
    static const char *const kinds[] = {"wrong_answer", "wrong_update", "malformed_call"};
    *kind = slip ? kinds[mistake] : "none";
    plan p;
    make_plan(t, slip && mistake == WRONG_UPDATE, &p);
    prl_agent_env *env = NULL;
    prl_status rc = prl_agent_env_init(&env);
    if (rc == PRL_OK) rc = prl_agent_env_reset(env, t->seed, t->difficulty, NULL);
    char turn[160];
    if (rc == PRL_OK && slip && mistake == MALFORMED) {
        malformed_turn(&g->demo, p.calls[0], turn, sizeof turn);
        rc = play(env, turns, turn);
    }
    for (int i = 0; rc == PRL_OK && i < p.n; i++) {
        snprintf(turn, sizeof turn, PRL_TOOL_CALL_OPEN "%s" PRL_TOOL_CALL_CLOSE, p.calls[i]);
        rc = play(env, turns, turn);
    }
    if (slip && mistake == WRONG_ANSWER) {
        if (t->goal == PRL_AGENT_CHEAPEST)
            snprintf(p.answer, sizeof p.answer, "%s",
                     t->world.items[(t->item + 1) % t->world.n_items].name);
        else snprintf(p.answer, sizeof p.answer, "%lld", atoll(p.answer) + 1);
    }
    snprintf(turn, sizeof turn, "Answer: %s", p.answer);
    if (rc == PRL_OK) rc = play(env, turns, turn);
    prl_agent_env_free(env);
    return rc;
}

/* The reasoning of a think demonstration: the plan's tools and items, in order ("Plan:
** lookup pear, calc, update pear; then answer."), nothing the world has not shown yet. */
static prl_status plan_think(const prl_agent_task *t, char **out)
{
    plan p;
    make_plan(t, 0, &p);
    tasks__buf b = {0};
    tasks__buf_printf(&b, "Plan:");
    for (int i = 0; i < p.n; i++) {
        const char *sp = strchr(p.calls[i], ' '), *item = strstr(p.calls[i], "item=");
        int name_len = sp ? (int)(sp - p.calls[i]) : (int)strlen(p.calls[i]);
        tasks__buf_printf(&b, "%s %.*s", i ? "," : "", name_len, p.calls[i]);
        if (item) tasks__buf_printf(&b, " %.*s", (int)strcspn(item + 5, " "), item + 5);
    }
    tasks__buf_printf(&b, "; then answer.");
    *out = b.s;
    return b.oom ? prl_error_set(PRL_ERR_NOMEM, "agent plan") : PRL_OK;
}

prl_status tasks__agent_make(tasks__gen *g, tasks__draft *d)
{
    uint64_t seed = prl_rng_u64(&g->problem) & ((1ULL << 53) - 1); /* exact in any JSON reader */
    prl_agent_task t;
    prl_status rc = prl_agent_task_make(seed, g->difficulty, &t);
    if (rc) return rc;
    d->prompt = tasks__prompt(prl_agent_system_prompt(), t.prompt);
    d->fields =
        json_pack("{s:{s:I, s:i}}", "env", "seed", (json_int_t)seed, "difficulty", g->difficulty);
    if (!d->prompt || !d->fields) return prl_error_set(PRL_ERR_NOMEM, "agent problem");
    if (!g->demos) return PRL_OK;
    d->turns = json_array();
    if (!d->turns) return prl_error_set(PRL_ERR_NOMEM, "agent demo");
    if (g->moded && (rc = plan_think(&t, &d->think))) return rc;
    return demo(g, &t, d->turns, &d->demo_error);
}
