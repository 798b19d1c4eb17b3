/*
** agent.c — the Agent verifier: replays the transcript in a fresh environment, then checks
** the end state and the final answer against what the goal demands — computed here from the
** episode description alone (prl_reward_agent_check), not by the environment's tools.
**
** Checks: "format" (required) — the episode ends with a final answer turn and nothing after
** it; "observations" (required) — every tool turn is what the environment answers on replay
** (a transcript is token-in/token-out: the tool turns come from the environment, never from
** the model); "answer" and "end_state" (required, weight 1 each); "tool_syntax"
** (informational). Penalty: 0.2 per malformed tool call. So a solved episode scores
** 1 − 0.2·malformed and anything else 0.
*/
#include "reward/reward_int.h"

#include <strings.h>
#include <string.h>

/* The end world the goal asks for, and the answer as text. */
static void expected(const prl_agent_task *t, prl_agent_world *w, char *answer, size_t n)
{
    *w = t->world;
    prl_agent_item *it = &w->items[t->item];
    const prl_agent_item *y = t->item2 >= 0 ? &t->world.items[t->item2] : NULL;
    int64_t a = t->amount, v = 0;
    switch (t->goal) {
    case PRL_AGENT_PRICE: v = it->price; break;
    case PRL_AGENT_STOCK: v = it->stock; break;
    case PRL_AGENT_SET_PRICE: v = it->price = a; break;
    case PRL_AGENT_COST: v = a * it->price; break;
    case PRL_AGENT_SELL: v = it->stock -= a; break;
    case PRL_AGENT_RESTOCK: v = it->stock += a; break;
    case PRL_AGENT_VALUE: v = it->stock * it->price + y->stock * y->price; break;
    case PRL_AGENT_SELL_COST:
        it->stock -= a;
        v = a * it->price;
        break;
    case PRL_AGENT_CHEAPEST: {
        const prl_agent_item *best = &w->items[0];
        for (int i = 1; i < w->n_items; i++)
            if (w->items[i].price < best->price) best = &w->items[i];
        snprintf(answer, n, "%s", best->name);
        return;
    }
    case PRL_AGENT_N_GOALS: break;
    }
    snprintf(answer, n, "%lld", (long long)v);
}

/* "" if a == b, else the first difference. */
static void world_diff(const prl_agent_world *got, const prl_agent_world *want, char *out, size_t n)
{
    out[0] = 0;
    if (got->n_items != want->n_items) {
        snprintf(out, n, "%d items, expected %d", got->n_items, want->n_items);
        return;
    }
    for (int i = 0; i < want->n_items; i++) {
        const prl_agent_item *g = &got->items[i], *w = &want->items[i];
        if (strcmp(g->name, w->name) || g->stock != w->stock || g->price != w->price) {
            snprintf(out, n, "%s: stock %lld, price %lld; expected stock %lld, price %lld", w->name,
                     (long long)g->stock, (long long)g->price, (long long)w->stock,
                     (long long)w->price);
            return;
        }
    }
}

void prl_reward_agent_check(const prl_agent_task *task, const prl_agent_world *end,
                            const char *final_turn, prl_reward_result *out)
{
    prl_agent_world want;
    char answer[32], got[64] = "", why[128] = "", diff[200];
    expected(task, &want, answer, sizeof answer);
    int ok = final_turn && reward__final_answer(final_turn, got, sizeof got, why, sizeof why) == 0;
    int64_t g, a;
    if (ok && task->goal == PRL_AGENT_CHEAPEST) ok = !strcasecmp(got, answer);
    else if (ok)
        ok = reward__parse_int(got, &g) == 0 && reward__parse_int(answer, &a) == 0 && g == a;
    reward__check(out, "answer", ok, 1, 1, "expected %s, got %s", answer,
                  got[0] ? got : "no answer");
    world_diff(end, &want, diff, sizeof diff);
    reward__check(out, "end_state", diff[0] == 0, 1, 1, "%s",
                  diff[0] ? diff : "as the goal demands");
}

typedef struct replay {
    const char *final_turn; /* the answer turn, or NULL */
    char format_why[160], obs_why[200];
} replay;

/* Play the assistant turns; compare each tool turn with the environment's observation. */
static prl_status play(prl_agent_env *env, const prl_chat_message *turns, size_t n, replay *r)
{
    int done = 0;
    for (size_t i = 0; i < n; i++) {
        if (done) {
            snprintf(r->format_why, sizeof r->format_why, "turn %zu comes after the episode ended",
                     i);
            return PRL_OK;
        }
        if (strcmp(turns[i].role, "assistant") != 0) {
            snprintf(r->obs_why, sizeof r->obs_why, "turn %zu: a tool turn without a tool call", i);
            return PRL_OK;
        }
        prl_agent_step st;
        prl_status rc = prl_agent_env_step(env, turns[i].content, &st);
        if (rc) return rc;
        done = st.done;
        if (st.answer) r->final_turn = st.answer;
        if (!st.observation) continue;
        if (i + 1 == n) {
            snprintf(r->format_why, sizeof r->format_why, "the transcript ends with a tool call");
            return PRL_OK;
        }
        const prl_chat_message *t = &turns[++i];
        if (strcmp(t->role, "tool") != 0 || strcmp(t->content, st.observation) != 0) {
            snprintf(r->obs_why, sizeof r->obs_why,
                     "turn %zu: expected tool '%.60s', got %s '%.60s'", i, st.observation, t->role,
                     t->content);
            return PRL_OK;
        }
    }
    if (!r->final_turn && !r->format_why[0])
        snprintf(r->format_why, sizeof r->format_why,
                 done ? "the tool call limit ended the episode" : "no final answer turn");
    return PRL_OK;
}

/* The episode of a task's "env": {"seed", "difficulty"}. */
prl_status prl_reward_agent(const char *task_json, const prl_chat_message *turns, size_t n_turns,
                            prl_reward_result *out)
{
    json_t *task;
    prl_status rc = reward__task(task_json, PRL_TASK_AGENT, turns, n_turns, &task);
    prl_agent_task spec; /* {seed, difficulty}, or a prompt file's own world and goal */
    if (rc == PRL_OK && (rc = prl_agent_task_from_spec(json_object_get(task, "env"), &spec)))
        rc = prl_error_wrap(rc, "agent task: ");
    json_decref(task);
    prl_agent_env *env = NULL;
    const prl_agent_task *t = NULL;
    if (rc == PRL_OK) rc = prl_agent_env_init(&env);
    if (rc == PRL_OK) rc = prl_agent_env_reset_task(env, &spec, &t);
    replay r = {0};
    if (rc == PRL_OK) rc = play(env, turns, n_turns, &r);
    if (rc == PRL_OK) {
        reward__begin(out);
        int malformed = prl_agent_env_malformed(env), calls = prl_agent_env_calls(env);
        reward__check(out, "format", !r.format_why[0], 0, 1, "%s",
                      r.format_why[0] ? r.format_why : "ends with Answer: X");
        reward__check(out, "observations", !r.obs_why[0], 0, 1, "%s",
                      r.obs_why[0] ? r.obs_why : "match the environment");
        prl_reward_agent_check(t, prl_agent_env_world(env), r.final_turn, out);
        reward__check(out, "tool_syntax", malformed == 0, 0, 0, "%d of %d calls malformed",
                      malformed, calls);
        out->flags |= (r.format_why[0] ? PRL_REWARD_FORMAT_ERROR : 0) |
                      (malformed ? PRL_REWARD_TOOL_SYNTAX : 0);
        out->penalty = PRL_REWARD_TOOL_SYNTAX_PENALTY * malformed;
        reward__finish(out);
    }
    prl_agent_env_free(env);
    return rc;
}
