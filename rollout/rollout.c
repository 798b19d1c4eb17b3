/*
** rollout.c — episodes in rounds of continuous-batched generation: model turns, environment
** and tool observations, then the verifier (rollout.h).
*/
#include "rollout/rollout.h"

#include "replay/replay.h"

#include <stdlib.h>
#include <string.h>

void prl_rollout_config_default(prl_rollout_config *c)
{
    memset(c, 0, sizeof *c);
    prl_sample_params_default(&c->sampling);
    c->sampling.max_new_tokens = 96;
    c->max_turns = 10;
    c->score = 1;
}

void prl_episode_free(prl_episode *ep)
{
    if (!ep) return;
    for (int i = 0; i < ep->n_msgs; i++) free((char *)ep->msgs[i].content);
    free(ep->msgs), free(ep->ids), free(ep->mask), free(ep->logprobs), free(ep->routes);
    memset(ep, 0, sizeof *ep);
}

/* ------------------------------------------------------------------ episode state --- */

typedef struct play {
    prl_episode *ep;
    json_t *task;
    prl_task_domain domain;
    prl_agent_env *env; /* Agent only */
    int done;
    prl_route_cache cache; /* Cached R3: first-seen routes (cached_routes only) */
} play;

static prl_status append(prl_episode *ep, const int32_t *ids, const float *lp, int k, int sampled)
{
    if (ep->n + k > ep->cap) {
        int cap = ep->cap ? ep->cap : 256;
        while (cap < ep->n + k) cap *= 2;
        int32_t *i2 = realloc(ep->ids, (size_t)cap * sizeof *i2);
        if (i2) ep->ids = i2;
        uint8_t *m2 = realloc(ep->mask, (size_t)cap);
        if (m2) ep->mask = m2;
        float *l2 = realloc(ep->logprobs, (size_t)cap * sizeof *l2);
        if (l2) ep->logprobs = l2;
        if (!i2 || !m2 || !l2) return prl_error_set(PRL_ERR_NOMEM, "episode of %d tokens", cap);
        ep->cap = cap;
    }
    for (int j = 0; j < k; j++) {
        ep->ids[ep->n + j] = ids[j];
        ep->mask[ep->n + j] = (uint8_t)sampled;
        ep->logprobs[ep->n + j] = lp ? lp[j] : 0.0f;
    }
    ep->n += k;
    return PRL_OK;
}

static prl_status add_msg(prl_episode *ep, const char *role, const char *text, size_t len)
{
    prl_chat_message *m = realloc(ep->msgs, (size_t)(ep->n_msgs + 1) * sizeof *m);
    char *copy = malloc(len + 1);
    if (m) ep->msgs = m;
    if (!m || !copy) {
        free(copy);
        return prl_error_set(PRL_ERR_NOMEM, "episode message");
    }
    memcpy(copy, text, len);
    copy[len] = 0;
    ep->msgs[ep->n_msgs++] = (prl_chat_message){.role = role, .content = copy};
    return PRL_OK;
}

/* The prompt: the task's messages (with the mode's switch) as a chat generation prompt. */
static prl_status start(play *p, const prl_tokenizer *tok, int index, prl_tasks_mode mode)
{
    json_t *msgs = json_object_get(p->task, "messages");
    const char *dom = json_string_value(json_object_get(p->task, "domain"));
    if (!json_is_array(msgs) || !dom || prl_tasks_domain_parse(dom, &p->domain))
        return prl_error_set(PRL_ERR_FORMAT, "task %d: needs \"messages\" and a known \"domain\"",
                             index);
    json_t *moded = NULL; /* the task is borrowed: the switch goes on a copy */
    if (mode != PRL_MODE_DEFAULT) {
        prl_status rc = (moded = json_deep_copy(msgs))
                            ? prl_tasks_mode_apply(moded, mode)
                            : prl_error_set(PRL_ERR_NOMEM, "task %d", index);
        if (rc) {
            json_decref(moded);
            return prl_error_wrap(rc, "task %d: ", index);
        }
        msgs = moded;
    }
    size_t nm = json_array_size(msgs);
    prl_chat_message *cm = calloc(nm + 1, sizeof *cm);
    if (!cm) {
        json_decref(moded);
        return prl_error_set(PRL_ERR_NOMEM, "task %d", index);
    }
    for (size_t i = 0; i < nm; i++) {
        cm[i].role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        cm[i].content = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
        if (!cm[i].role || !cm[i].content) {
            free(cm);
            json_decref(moded);
            return prl_error_set(PRL_ERR_FORMAT, "task %d: message %zu needs role and content",
                                 index, i);
        }
    }
    int32_t *ids = NULL;
    size_t n = 0;
    prl_status rc = prl_tokenizer_encode_chat_prompt(tok, cm, nm, 0, &ids, &n);
    free(cm);
    json_decref(moded);
    if (!rc) rc = append(p->ep, ids, NULL, (int)n, 0);
    free(ids);
    p->ep->prompt_len = p->ep->n;
    if (rc || p->domain != PRL_TASK_AGENT) return rc;
    prl_agent_task t; /* {seed, difficulty} or a world and goal of a prompt file's own */
    if ((rc = prl_agent_task_from_spec(json_object_get(p->task, "env"), &t)))
        return prl_error_wrap(rc, "task %d: ", index);
    if ((rc = prl_agent_env_init(&p->env))) return rc;
    return prl_agent_env_reset_task(p->env, &t, NULL);
}

/* A tool turn and the next assistant opening after a model turn, in the tokenizer's chat
** format (prl: `<|tool|> text <|end|> <|assistant|>`); never trained on. */
static prl_status observe(play *p, const prl_tokenizer *tok, const char *text)
{
    /* the observation's bytes (a program's output, cut at 200 bytes) need not be UTF-8: the
    ** verifier and the bus get its UTF-8 view, as for a model turn; an imported tokenizer
    ** encodes that view too (it takes UTF-8 only), prl's own the bytes as they are */
    char *view = NULL;
    size_t len = 0;
    if (prl_utf8_view(text, strlen(text), &view, &len) < 0)
        return prl_error_set(PRL_ERR_NOMEM, "observation text");
    int32_t *ids = NULL;
    size_t n = 0;
    prl_chat_message msg = {.role = "tool",
                            .content = prl_tokenizer_is_imported(tok) ? view : text};
    prl_status rc = prl_tokenizer_encode_chat_turn(tok, &msg, 0, &ids, &n);
    if (!rc) rc = append(p->ep, ids, NULL, (int)n, 0);
    free(ids);
    if (!rc) rc = add_msg(p->ep, "tool", view, len);
    free(view);
    return rc;
}

/* What follows a model turn: an environment step, a python tool run, or the end. */
static prl_status react(play *p, const prl_tokenizer *tok, const char *turn,
                        const prl_reward_exec *exec)
{
    if (p->domain == PRL_TASK_AGENT) {
        prl_agent_step st;
        prl_status rc = prl_agent_env_step(p->env, turn, &st);
        if (rc) return rc;
        if (st.done || !st.observation) {
            p->done = 1;
            return PRL_OK;
        }
        return observe(p, tok, st.observation);
    }
    if (p->domain != PRL_TASK_REASONING) {
        p->done = 1;
        return PRL_OK;
    }
    prl_tool_call call;
    prl_tool_parse kind = prl_tasks_tool_call_parse(turn, &call);
    if (kind == PRL_TOOL_NONE) {
        p->done = 1;
        return PRL_OK;
    }
    if (kind == PRL_TOOL_MALFORMED || strcmp(call.name, "python") != 0 || !call.body || !exec) {
        char msg[200];
        snprintf(msg, sizeof msg, "error: %s",
                 kind == PRL_TOOL_MALFORMED ? call.error
                 : !exec                    ? "no executor for the python tool"
                                            : "the only tool is python");
        return observe(p, tok, msg);
    }
    char *obs = NULL;
    prl_status rc = prl_reward_python_observation(exec, call.body, call.body_len, &obs);
    if (!rc) rc = observe(p, tok, obs);
    free(obs);
    return rc;
}

/* Cached R3 (rl.md §3.5): merge this round's pass into the episode's first-seen routes and
** make them the episode's record. */
static prl_status cache_routes(play *p, const prl_gen_result *r)
{
    prl_episode *ep = p->ep;
    if (!r->routes || r->n_route_tokens < 1) return PRL_OK;
    size_t row = r->routes_bytes / (size_t)r->n_route_tokens;
    prl_status rc =
        prl_route_cache_merge(&p->cache, ep->ids, ep->n, r->routes, r->n_route_tokens, row, NULL);
    if (rc) return rc;
    size_t bytes = (size_t)p->cache.n * row;
    uint8_t *copy = malloc(bytes ? bytes : 1);
    if (!copy) return prl_error_set(PRL_ERR_NOMEM, "episode routes of %zu bytes", bytes);
    memcpy(copy, p->cache.rows, bytes);
    free(ep->routes);
    ep->routes = copy, ep->routes_bytes = bytes, ep->n_route_tokens = p->cache.n;
    return PRL_OK;
}

/* Take one generated turn into the episode and decide what happens next. */
static prl_status take_turn(play *p, const prl_tokenizer *tok, const prl_gen_result *r,
                            const prl_reward_exec *exec, int cached)
{
    prl_episode *ep = p->ep;
    prl_status rc = append(ep, r->tokens, r->logprobs, r->n, 1);
    if (rc) return rc;
    ep->turns++;
    ep->stop = (int)r->stop;
    if (cached) {
        if ((rc = cache_routes(p, r))) return rc;
    } else { /* each round re-prefills the whole sequence: keep the newest routes */
        free(ep->routes);
        ep->routes = r->routes, ep->routes_bytes = r->routes_bytes,
        ep->n_route_tokens = r->n_route_tokens;
        ((prl_gen_result *)r)->routes = NULL;
    }
    int k = r->n; /* the turn's text without its closing special (end of turn or eos) */
    int32_t stops[2];
    int n_stops = prl_tokenizer_stop_ids(tok, stops);
    for (int s = 0; s < n_stops; s++)
        if (k > 0 && r->tokens[k - 1] == stops[s]) {
            k--;
            break;
        }
    char *text = NULL;
    size_t len = 0;
    if ((rc = prl_tokenizer_decode(tok, r->tokens, (size_t)k, 0, &text, &len))) return rc;
    char *view = NULL; /* the verifier and the bus see the UTF-8 view of the turn's bytes */
    if (prl_utf8_view(text, len, &view, &len) < 0) rc = prl_error_set(PRL_ERR_NOMEM, "turn text");
    free(text);
    text = view;
    if (!rc) rc = add_msg(ep, "assistant", text, len);
    if (!rc && r->stop != PRL_STOP_TOKEN) { /* cut off mid-turn: the episode ends here */
        ep->truncated = 1;
        p->done = 1;
    } else if (!rc) {
        rc = react(p, tok, ep->msgs[ep->n_msgs - 1].content, exec);
    }
    free(text);
    return rc;
}

/* ------------------------------------------------------------------ rounds ---------- */

/* One round: every active episode generates its next turn together. */
static prl_status round_once(prl_infer *e, const prl_tokenizer *tok, play *ps, int n,
                             const uint64_t *seq_ids, const prl_rollout_config *c,
                             const prl_reward_exec *exec, int *active)
{
    int max_len = prl_infer_get_options(e)->max_len;
    prl_gen_request *q = calloc((size_t)n, sizeof *q);
    int *who = calloc((size_t)n, sizeof *who), k = 0;
    prl_gen_result *res = calloc((size_t)n, sizeof *res);
    if (!q || !who || !res) {
        free(q), free(who), free(res);
        return prl_error_set(PRL_ERR_NOMEM, "rollout round of %d", n);
    }
    for (int i = 0; i < n; i++) {
        play *p = &ps[i];
        if (p->done) continue;
        if (p->ep->turns >= c->max_turns || p->ep->n + 1 >= max_len) { /* out of turns or room */
            p->ep->truncated = p->ep->n + 1 >= max_len;
            p->done = 1;
            continue;
        }
        /* each turn draws from its own streams: the sequence id is mixed with the turn */
        q[k] = (prl_gen_request){.prompt = p->ep->ids,
                                 .prompt_len = p->ep->n,
                                 .seq_id = prl_hash64(seq_ids[i] ^ ((uint64_t)p->ep->turns << 48))};
        who[k++] = i;
    }
    prl_sample_params sp = c->sampling; /* draw only ids the tokenizer can decode */
    sp.vocab_limit = prl_tokenizer_vocab_size(tok);
    double t0 = prl_now();
    prl_status rc = k ? prl_infer_generate(e, q, k, &sp, res, NULL, NULL) : PRL_OK;
    double dt = prl_now() - t0;
    for (int j = 0; !rc && j < k; j++) {
        ps[who[j]].ep->gen_seconds += dt;
        rc = take_turn(&ps[who[j]], tok, &res[j], exec, c->cached_routes);
    }
    for (int j = 0; j < k; j++) prl_gen_result_free(&res[j]);
    *active = 0;
    for (int i = 0; i < n; i++) *active += !ps[i].done;
    free(q), free(who), free(res);
    return rc;
}

prl_status prl_rollout_run(prl_infer *e, const prl_tokenizer *tok, json_t *const *tasks,
                           const uint64_t *seq_ids, int n, const prl_rollout_config *c,
                           const prl_reward_exec *exec, prl_episode *out)
{
    memset(out, 0, (size_t)n * sizeof *out);
    if (c->max_turns < 1)
        return prl_error_set(PRL_ERR_ARG, "max turns %d must be >= 1", c->max_turns);
    play *ps = calloc((size_t)(n ? n : 1), sizeof *ps);
    if (!ps) return prl_error_set(PRL_ERR_NOMEM, "rollout of %d tasks", n);
    prl_status rc = PRL_OK;
    int max_len = prl_infer_get_options(e)->max_len;
    for (int i = 0; i < n && !rc; i++) {
        ps[i] = (play){.ep = &out[i], .task = tasks[i]};
        rc = start(&ps[i], tok, i, c->mode);
        if (!rc && out[i].n >= max_len)
            rc = prl_error_set(PRL_ERR_RANGE,
                               "task %d: prompt of %d tokens does not fit the "
                               "context of %d",
                               i, out[i].n, max_len);
    }
    for (int active = n; !rc && active > 0;)
        rc = round_once(e, tok, ps, n, seq_ids, c, exec, &active);
    for (int i = 0; i < n && !rc && c->score; i++) {
        char *task_json = json_dumps(tasks[i], JSON_COMPACT);
        rc = task_json ? prl_reward_score(task_json, out[i].msgs, (size_t)out[i].n_msgs, exec,
                                          &out[i].result)
                       : prl_error_set(PRL_ERR_NOMEM, "task %d", i);
        if (!rc && out[i].truncated) prl_reward_unfinished(&out[i].result);
        out[i].reward = out[i].result.score;
        free(task_json);
    }
    for (int i = 0; i < n; i++) prl_agent_env_free(ps[i].env), prl_route_cache_free(&ps[i].cache);
    free(ps);
    if (rc)
        for (int i = 0; i < n; i++) prl_episode_free(&out[i]);
    return rc;
}
