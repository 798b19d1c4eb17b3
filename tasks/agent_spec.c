/*
** agent_spec.c — an Agent episode from its JSON spec (tasks.h, docs/tasks.md "Prompt files"):
** {"seed", "difficulty"} is the generated episode of prl_agent_task_make; {"items", "goal",
** "item", "item2", "amount"} is a world and goal of the user's own, checked so that the
** environment can play it and the verifier can judge it (the same tools, the same answers).
*/
#include "tasks/tasks_int.h"

#include <string.h>

static const struct {
    const char *name;
    prl_agent_goal goal;
    int difficulty; /* the generator's difficulty of this goal */
    int amount;     /* the goal needs "amount" */
} goals[] = {{"price", PRL_AGENT_PRICE, 1, 0},         {"stock", PRL_AGENT_STOCK, 1, 0},
             {"set_price", PRL_AGENT_SET_PRICE, 1, 1}, {"cost", PRL_AGENT_COST, 2, 1},
             {"sell", PRL_AGENT_SELL, 2, 1},           {"restock", PRL_AGENT_RESTOCK, 2, 1},
             {"value", PRL_AGENT_VALUE, 3, 0},         {"cheapest", PRL_AGENT_CHEAPEST, 3, 0},
             {"sell_cost", PRL_AGENT_SELL_COST, 3, 1}};
enum { N_GOALS = sizeof goals / sizeof goals[0], MAX_VALUE = 999999 /* update's range */ };

static prl_status bad(const char *field, const char *why)
{
    return prl_error_set(PRL_ERR_FORMAT, "agent env: \"%s\" %s", field, why);
}

/* A name the tool syntax can carry (lookup item=NAME): 1..11 of [a-z]. */
static int good_name(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 'a' || s[i] > 'z') return 0;
    return n >= 1 && n < sizeof((prl_agent_item *)0)->name;
}

static int item_index(const prl_agent_world *w, const char *name)
{
    for (int i = 0; name && i < w->n_items; i++)
        if (!strcmp(w->items[i].name, name)) return i;
    return -1;
}

static int in_range(const json_t *v, int64_t lo)
{
    return json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= MAX_VALUE;
}

static prl_status read_items(const json_t *items, prl_agent_world *w)
{
    size_t n = json_array_size(items), i;
    if (!json_is_array(items) || n < 1 || n > PRL_AGENT_MAX_ITEMS)
        return bad("items", "must be an array of 1..4 {\"name\", \"stock\", \"price\"}");
    json_t *it;
    json_array_foreach(items, i, it)
    {
        const char *name = json_string_value(json_object_get(it, "name"));
        json_t *stock = json_object_get(it, "stock"), *price = json_object_get(it, "price");
        if (!good_name(name)) return bad("items", "need names of 1..11 letters a-z");
        if (item_index(w, name) >= 0) return bad("items", "repeat a name");
        if (!in_range(stock, 0) || !in_range(price, 1))
            return bad("items", "need an integer stock 0..999999 and price 1..999999");
        prl_agent_item *x = &w->items[w->n_items++];
        snprintf(x->name, sizeof x->name, "%s", name);
        x->stock = json_integer_value(stock), x->price = json_integer_value(price);
    }
    return PRL_OK;
}

/* The goal's items and amount, checked against the world. */
static prl_status read_goal(const json_t *env, int g, prl_agent_task *t)
{
    const prl_agent_world *w = &t->world;
    t->goal = goals[g].goal, t->difficulty = goals[g].difficulty, t->item2 = -1;
    t->item = item_index(w, json_string_value(json_object_get(env, "item")));
    if (t->goal != PRL_AGENT_CHEAPEST && t->item < 0) return bad("item", "must name an item");
    if (t->goal == PRL_AGENT_CHEAPEST) { /* the answer must be one item */
        t->item = 0;
        int ties = 0;
        for (int i = 1; i < w->n_items; i++)
            if (w->items[i].price < w->items[t->item].price) t->item = i;
        for (int i = 0; i < w->n_items; i++) ties += w->items[i].price == w->items[t->item].price;
        if (ties > 1) return bad("items", "need one strictly cheapest item for goal cheapest");
    }
    if (t->goal == PRL_AGENT_VALUE) {
        t->item2 = item_index(w, json_string_value(json_object_get(env, "item2")));
        if (t->item2 < 0 || t->item2 == t->item)
            return bad("item2", "must name another item for goal value");
    }
    json_t *a = json_object_get(env, "amount");
    if (goals[g].amount && !in_range(a, 1)) return bad("amount", "must be an integer 1..999999");
    t->amount = goals[g].amount ? json_integer_value(a) : 0;
    int sells = t->goal == PRL_AGENT_SELL || t->goal == PRL_AGENT_SELL_COST;
    if (sells && t->amount > w->items[t->item].stock)
        return bad("amount", "is more than the item's stock");
    if (t->goal == PRL_AGENT_RESTOCK && w->items[t->item].stock + t->amount > MAX_VALUE)
        return bad("amount", "would take the stock above 999999");
    return PRL_OK;
}

prl_status prl_agent_task_from_spec(const json_t *env, prl_agent_task *t)
{
    json_t *seed = json_object_get(env, "seed"), *d = json_object_get(env, "difficulty");
    if (!json_is_object(env))
        return bad("env", "must be {\"seed\", \"difficulty\"} or {\"items\", \"goal\", ...}");
    if (seed || d) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0 || !json_is_integer(d))
            return bad("seed", "and \"difficulty\" must be integers (seed >= 0)");
        return prl_agent_task_make((uint64_t)json_integer_value(seed), (int)json_integer_value(d),
                                   t);
    }
    memset(t, 0, sizeof *t);
    prl_status rc = read_items(json_object_get(env, "items"), &t->world);
    const char *goal = json_string_value(json_object_get(env, "goal"));
    int g = 0;
    while (g < N_GOALS && (!goal || strcmp(goals[g].name, goal))) g++;
    if (!rc && g == N_GOALS)
        rc = bad("goal", "must be one of price, stock, set_price, cost, sell, restock, value, "
                         "cheapest, sell_cost");
    if (!rc) rc = read_goal(env, g, t);
    if (!rc) tasks__agent_prompt(t);
    return rc;
}
