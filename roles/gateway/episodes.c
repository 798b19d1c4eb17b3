/*
** episodes.c — the groups the controller leased to the gateway and their episodes
** (internal.h, docs/gateway.md "Episodes"). Every function runs under gw.mu.
**
** Token-in/token-out: an episode keeps the ids it was fed and sampled. A turn's prompt is the
** episode's ids so far, then — when the request brings a message after the last reply — that
** message as a chat turn (an observation: mask 0), so the reply the model gave is never
** re-tokenised: the request's history must repeat the replies exactly as they were returned,
** or it is refused. The sampled ids go in with mask 1, their infer log-probs, the turn's MoE
** routes (every id fed) and the policy version. An ended episode becomes the `result` of its
** sample (lease, step, prompt, sample), as a rollout worker's would.
*/
#include "roles/gateway/internal.h"

#include "bus/bus.h"
#include "roles/msg/msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void episode_free(gw_episode *ep)
{
    free(ep->ids), free(ep->mask), free(ep->logprobs), free(ep->text), free(ep->routes);
    for (int i = 0; i < ep->n_history; i++) free(ep->history[i].role), free(ep->history[i].content);
    free(ep->history);
    json_decref(ep->turns);
}

static void group_free(gw_group *gr)
{
    for (int i = 0; i < gr->count; i++) episode_free(&gr->ep[i]);
    free(gr->ep), free(gr->task), free(gr);
}

prl_status gw_group_add(gw *g, uint64_t lease, uint64_t step, uint64_t prompt, uint64_t sample0,
                        int count, uint64_t version, int eval, const char *task)
{
    /* a group handed out again (a restarted controller): the new lease, and every ended
    ** episode's result sent again (the controller keeps a sample's first result) */
    for (gw_group *x = g->groups; x; x = x->next)
        if (x->step == step && x->prompt == prompt && x->sample0 == sample0) {
            x->lease = lease, x->version = version, x->n_sent = 0;
            for (int i = 0; i < x->count; i++) x->ep[i].sent = 0;
            return PRL_OK;
        }
    gw_group *gr = calloc(1, sizeof *gr);
    if (gr) gr->ep = calloc((size_t)count, sizeof *gr->ep), gr->task = strdup(task);
    if (!gr || !gr->ep || !gr->task) {
        if (gr) free(gr->ep), free(gr->task);
        free(gr);
        return prl_error_set(PRL_ERR_NOMEM, "a group of %d episodes", count);
    }
    *gr = (gw_group){.lease = lease,
                     .step = step,
                     .prompt = prompt,
                     .sample0 = sample0,
                     .version = version,
                     .eval = eval,
                     .task = gr->task,
                     .ep = gr->ep,
                     .count = count};
    snprintf(gr->id, sizeof gr->id, "grp-%llu-%llu", (unsigned long long)step,
             (unsigned long long)prompt);
    for (int i = 0; i < count; i++) {
        gr->ep[i].sample = (int)sample0 + i;
        gr->ep[i].min_version = -1;
        snprintf(gr->ep[i].id, sizeof gr->ep[i].id, "ep-%llu-%llu-%d", (unsigned long long)step,
                 (unsigned long long)prompt, (int)sample0 + i);
    }
    gw_group **pp = &g->groups;
    while (*pp) pp = &(*pp)->next;
    *pp = gr;
    pthread_cond_broadcast(&g->cv);
    return PRL_OK;
}

char *gw_group_claim(gw *g)
{
    gw_group *gr = g->groups;
    while (gr && gr->claimed) gr = gr->next;
    if (!gr) return NULL;
    json_error_t je;
    json_t *task = json_loads(gr->task, 0, &je), *eps = json_array();
    for (int i = 0; eps && i < gr->count; i++)
        if (!gr->ep[i].started) json_array_append_new(eps, json_string(gr->ep[i].id));
    json_t *o = json_pack("{s:s,s:o,s:o*,s:O*,s:b,s:I}", "id", gr->id, "episodes", eps, "task",
                          task, "messages", task ? json_object_get(task, "messages") : NULL, "eval",
                          gr->eval, "policy_version", (json_int_t)gr->version);
    if (o && gr->eval) json_object_set_new(o, "greedy_episode", json_string(gr->ep[0].id));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (text) gr->claimed = 1, gr->claimed_at = prl_now();
    return text;
}

void gw_groups_free(gw *g)
{
    while (g->groups) {
        gw_group *next = g->groups->next;
        group_free(g->groups);
        g->groups = next;
    }
}

gw_group *gw_group_find(gw *g, const char *id)
{
    for (gw_group *gr = g->groups; gr; gr = gr->next)
        if (!strcmp(gr->id, id)) return gr;
    return NULL;
}

gw_episode *gw_episode_find(gw *g, const char *id, gw_group **group)
{
    for (gw_group *gr = g->groups; gr; gr = gr->next)
        for (int i = 0; i < gr->count; i++)
            if (!strcmp(gr->ep[i].id, id)) {
                if (group) *group = gr;
                return &gr->ep[i];
            }
    return NULL;
}

/* ---------------------------------------------------------------- a turn's prompt -- */

static prl_status chat_prompt(gw *g, const gw_request *r, int32_t **ids, size_t *n)
{
    prl_chat_message *cm = calloc((size_t)r->n_messages, sizeof *cm);
    if (!cm) return prl_error_set(PRL_ERR_NOMEM, "messages");
    for (int i = 0; i < r->n_messages; i++)
        cm[i] = (prl_chat_message){r->messages[i].role, r->messages[i].content};
    prl_status rc = prl_tokenizer_encode_chat_prompt(g->tok, cm, (size_t)r->n_messages, 0, ids, n);
    free(cm);
    return rc;
}

/* The ids of a started episode's next turn: its record, an end-of-turn id when its last turn
** was cut off (the environment closes it: an observation), then the request's one new
** message as a chat turn and the next assistant opening. */
static int continue_prompt(gw *g, const gw_request *r, const gw_episode *ep, int32_t **out,
                           int *out_n, gw_error *e)
{
    int32_t *extra = NULL, end = prl_tokenizer_role_id(g->tok, PRL_ROLE_END);
    size_t ne = 0;
    int cut = ep->stop != PRL_STOP_TOKEN && end >= 0;
    prl_status rc = PRL_OK;
    if (r->kind == GW_CHAT) {
        int h = ep->n_history;
        for (int i = 0; i < h && i < r->n_messages; i++)
            if (strcmp(r->messages[i].role, ep->history[i].role) ||
                strcmp(r->messages[i].content, ep->history[i].content))
                return gw_fail(e, 400, "invalid_request_error", "messages",
                               "episode_history_mismatch",
                               "messages[%d] differs from what episode %s recorded: send the "
                               "episode's messages and replies exactly as they were, then one "
                               "new message",
                               i, ep->id);
        if (r->n_messages != h + 1)
            return gw_fail(e, 400, "invalid_request_error", "messages", "episode_history_mismatch",
                           "episode %s has %d messages: the request must repeat them and add "
                           "exactly one (it has %d)",
                           ep->id, h, r->n_messages);
        const gw_message *m = &r->messages[h];
        if (!strcmp(m->role, "assistant"))
            return gw_fail(e, 400, "invalid_request_error", "messages", "episode_history_mismatch",
                           "the new message of episode %s must not be the assistant's: the "
                           "model writes those",
                           ep->id);
        prl_chat_message cm = {m->role, m->content};
        rc = prl_tokenizer_encode_chat_turn(g->tok, &cm, 0, &extra, &ne);
    } else {
        size_t tl = strlen(ep->text);
        if (strncmp(r->prompt, ep->text, tl))
            return gw_fail(e, 400, "invalid_request_error", "prompt", "episode_history_mismatch",
                           "the prompt must start with episode %s's text so far (its prompt "
                           "and completions as returned)",
                           ep->id);
        const char *suffix = r->prompt + tl;
        rc =
            *suffix ? prl_tokenizer_encode(g->tok, suffix, strlen(suffix), 0, &extra, &ne) : PRL_OK;
    }
    if (rc)
        return gw_fail(e, 400, "invalid_request_error", "messages", NULL, "%s",
                       prl_error_message());
    int n = ep->n + cut + (int)ne;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) {
        free(extra);
        return gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    memcpy(ids, ep->ids, (size_t)ep->n * sizeof *ids);
    if (cut) ids[ep->n] = end;
    if (ne) memcpy(ids + ep->n + cut, extra, ne * sizeof *ids);
    free(extra);
    *out = ids, *out_n = n;
    return 0;
}

/* The sequence id of a choice: an episode's from its coordinates (as a rollout worker's)
** mixed with its turn; the request's seed, when given, in place of the run seed. */
static uint64_t episode_seq(const gw *g, const gw_request *r, const gw_group *gr,
                            const gw_episode *ep)
{
    prl_rng rng;
    prl_rng_init(&rng, r->has_seed ? r->seed : g->seed, gr->step, gr->prompt, (uint64_t)ep->sample,
                 PRL_RNG_SAMPLE);
    return prl_hash64(rng.key ^ ((uint64_t)ep->turns_played << 48));
}

static uint64_t free_seq(gw *g, const gw_request *r, int choice)
{
    prl_rng rng;
    if (r->has_seed) prl_rng_init(&rng, r->seed, 0, 0, (uint64_t)choice, PRL_RNG_SAMPLE);
    else prl_rng_init(&rng, g->seed, g->requests + 1, (uint64_t)choice, 1, PRL_RNG_SAMPLE);
    return rng.key;
}

/* The episodes request r plays, into eps[r->n]; NULL entries for a request recorded nowhere. */
static int pick_episodes(gw *g, const gw_request *r, gw_episode **eps, gw_group **grp, gw_error *e)
{
    *grp = NULL;
    if (!r->episode[0]) {
        if (g->connected)
            return gw_fail(e, 400, "invalid_request_error", "user", "missing_episode_id",
                           "name the episode (or group) in the X-Episode-Id header or the "
                           "'user' field: claim one with POST /v1/groups");
        for (int i = 0; i < r->n; i++) eps[i] = NULL;
        return 0;
    }
    gw_group *gr = gw_group_find(g, r->episode);
    if (gr) { /* a group id: its next n unstarted episodes, each playing its first turn */
        if (gr->eval && r->n > 1)
            return gw_fail(e, 400, "invalid_request_error", "n", NULL,
                           "group %s is an evaluation's: play its episodes one by one (its "
                           "first is greedy)",
                           gr->id);
        int k = 0;
        for (int i = 0; i < gr->count && k < r->n; i++)
            if (!gr->ep[i].started) eps[k++] = &gr->ep[i];
        if (k < r->n)
            return gw_fail(e, 409, "invalid_request_error", "n", "group_exhausted",
                           "group %s has %d unplayed episodes, the request asks for n = %d", gr->id,
                           k, r->n);
        gr->claimed = 1, gr->claimed_at = gr->claimed_at ? gr->claimed_at : prl_now();
        *grp = gr;
        return 0;
    }
    gw_episode *ep = gw_episode_find(g, r->episode, &gr);
    if (!ep)
        return gw_fail(e, 404, "invalid_request_error", "user", "episode_not_found",
                       "no episode or group '%s' in flight at this gateway", r->episode);
    if (r->n != 1)
        return gw_fail(e, 400, "invalid_request_error", "n", NULL,
                       "an episode is one trajectory: n must be 1 (name its group to play "
                       "several episodes at once)");
    if (ep->ended)
        return gw_fail(e, 409, "invalid_request_error", "user", "episode_ended",
                       "episode %s has ended", ep->id);
    if (ep->busy)
        return gw_fail(e, 409, "invalid_request_error", "user", "episode_busy",
                       "episode %s has a request in flight: one turn at a time", ep->id);
    eps[0] = ep, *grp = gr;
    gr->claimed = 1, gr->claimed_at = gr->claimed_at ? gr->claimed_at : prl_now();
    return 0;
}

int gw_episodes_begin(gw *g, const gw_request *r, gw_job *j, gw_error *e)
{
    gw_episode *eps[GW_MAX_N];
    gw_group *gr = NULL;
    int st = pick_episodes(g, r, eps, &gr, e);
    if (st) return st;
    if (!g->tok)
        return gw_fail(e, 503, "server_error", NULL, "no_policy",
                       "no policy version is loaded yet: try again shortly");
    j->n = r->n;
    j->temperature = r->has_temperature ? r->temperature : g->default_temperature;
    j->top_p = r->has_top_p ? r->top_p : g->default_top_p;
    if (gr && gr->eval && eps[0] == &gr->ep[0]) j->temperature = 0; /* the greedy sample */
    j->max_tokens = r->max_tokens ? r->max_tokens : g->default_max_tokens;
    if (j->max_tokens > g->max_len) j->max_tokens = g->max_len; /* the context ends it anyway */
    j->top = r->top_logprobs;
    for (int i = 0; i < r->n_stop; i++) j->stop[i] = r->stop[i];
    j->n_stop = r->n_stop;
    int32_t *first = NULL;
    size_t nf = 0;
    for (int i = 0; i < r->n && !st; i++) {
        gw_choice *c = &j->c[i];
        c->ep = eps[i];
        if (c->ep && c->ep->started) {
            st = continue_prompt(g, r, c->ep, &c->prompt, &c->prompt_len, e);
        } else { /* a first turn: every choice has the same prompt */
            prl_status rc = PRL_OK;
            if (!first)
                rc = r->kind == GW_CHAT ? chat_prompt(g, r, &first, &nf)
                                        : prl_tokenizer_encode(g->tok, r->prompt, strlen(r->prompt),
                                                               0, &first, &nf);
            if (rc)
                st =
                    gw_fail(e, 400, "invalid_request_error", NULL, NULL, "%s", prl_error_message());
            c->prompt = st ? NULL : malloc((nf ? nf : 1) * sizeof *c->prompt);
            if (!st && !c->prompt) st = gw_fail(e, 500, "server_error", NULL, NULL, "no memory");
            if (!st) memcpy(c->prompt, first, nf * sizeof *first), c->prompt_len = (int)nf;
        }
        if (!st && c->prompt_len < 1)
            st = gw_fail(e, 400, "invalid_request_error", "prompt", NULL, "the prompt is empty");
        if (!st && c->prompt_len + 1 >= g->max_len)
            st = gw_fail(e, 400, "invalid_request_error", "messages", "context_length_exceeded",
                         "the prompt has %d tokens: the context holds %d", c->prompt_len,
                         g->max_len);
        c->seq_id = c->ep ? episode_seq(g, r, gr, c->ep) : free_seq(g, r, i);
        c->cap = j->max_tokens;
        c->tokens = malloc((size_t)c->cap * sizeof *c->tokens);
        c->logprobs = malloc((size_t)c->cap * sizeof *c->logprobs);
        if (j->top) {
            c->top_ids = malloc((size_t)c->cap * (size_t)j->top * sizeof *c->top_ids);
            c->top_lp = malloc((size_t)c->cap * (size_t)j->top * sizeof *c->top_lp);
        }
        if (!st && (!c->tokens || !c->logprobs || (j->top && (!c->top_ids || !c->top_lp))))
            st = gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    free(first);
    if (st) return st;
    for (int i = 0; i < r->n; i++)
        if (j->c[i].ep) j->c[i].ep->busy = 1;
    return 0;
}

/* ---------------------------------------------------------------- recording -------- */

static int grow(gw_episode *ep, int k)
{
    if (ep->n + k <= ep->cap) return 0;
    int cap = ep->cap ? ep->cap : 256;
    while (cap < ep->n + k) cap *= 2;
    int32_t *i2 = realloc(ep->ids, (size_t)cap * sizeof *i2);
    if (i2) ep->ids = i2;
    uint8_t *m2 = realloc(ep->mask, (size_t)cap);
    if (m2) ep->mask = m2;
    float *l2 = realloc(ep->logprobs, (size_t)cap * sizeof *l2);
    if (l2) ep->logprobs = l2;
    if (!i2 || !m2 || !l2) return -1;
    ep->cap = cap;
    return 0;
}

static int append(gw_episode *ep, const int32_t *ids, const float *lp, int k, int sampled)
{
    if (grow(ep, k)) return -1;
    for (int i = 0; i < k; i++) {
        ep->ids[ep->n + i] = ids[i];
        ep->mask[ep->n + i] = (uint8_t)sampled;
        ep->logprobs[ep->n + i] = sampled ? lp[i] : 0.0f;
    }
    ep->n += k;
    return 0;
}

static int history_add(gw_episode *ep, const char *role, const char *content)
{
    gw_message *h = realloc(ep->history, (size_t)(ep->n_history + 1) * sizeof *h);
    if (!h) return -1;
    ep->history = h;
    h[ep->n_history] = (gw_message){strdup(role), strdup(content)};
    if (!h[ep->n_history].role || !h[ep->n_history].content) return -1;
    ep->n_history++;
    return 0;
}

static int turn_add(gw_episode *ep, const char *role, const char *content)
{
    if (!ep->turns) ep->turns = json_array();
    return ep->turns ? json_array_append_new(
                           ep->turns, json_pack("{s:s,s:s}", "role", role, "content", content))
                     : -1;
}

/* One choice's turn into its episode. */
static int record_turn(gw *g, const gw_request *r, const gw_job *j, gw_choice *c)
{
    gw_episode *ep = c->ep;
    size_t tl = 0;
    char *text = gw_choice_text(g, j, c, &tl); /* what the harness was given */
    if (!text) return -1;
    int bad = 0;
    if (!ep->started) { /* the prompt, and what it was made from */
        ep->started = 1;
        bad |= append(ep, c->prompt, NULL, c->prompt_len, 0);
        ep->prompt_len = c->prompt_len;
        for (int i = 0; r->kind == GW_CHAT && i < r->n_messages; i++)
            bad |= history_add(ep, r->messages[i].role, r->messages[i].content);
        if (r->kind == GW_COMPLETION) ep->text = strdup(r->prompt), bad |= !ep->text;
    } else { /* the observation before this turn */
        bad |= append(ep, c->prompt + ep->n, NULL, c->prompt_len - ep->n, 0);
        if (r->kind == GW_CHAT) {
            const gw_message *m = &r->messages[r->n_messages - 1];
            bad |= history_add(ep, m->role, m->content) | turn_add(ep, m->role, m->content);
        } else {
            const char *suffix = r->prompt + strlen(ep->text);
            bad |= turn_add(ep, "user", suffix);
            free(ep->text), ep->text = strdup(r->prompt), bad |= !ep->text;
        }
    }
    bad |= append(ep, c->tokens, c->logprobs, c->n, 1);
    bad |= turn_add(ep, "assistant", text);
    if (r->kind == GW_CHAT) bad |= history_add(ep, "assistant", text);
    else if (ep->text) {
        char *t = malloc(strlen(ep->text) + strlen(text) + 1);
        if (t) strcat(strcpy(t, ep->text), text);
        free(ep->text), ep->text = t, bad |= !t;
    }
    free(text);
    free(ep->routes); /* the turn's pass fed every id of the episode: its routes replace */
    ep->routes = c->routes, ep->routes_bytes = c->routes_bytes;
    ep->n_route_tokens = c->n_route_tokens;
    c->routes = NULL;
    ep->turns_played++;
    ep->stop = c->stop;
    ep->truncated = c->stop != PRL_STOP_TOKEN && c->stop != PRL_STOP_STRING;
    if (ep->min_version < 0 || j->version < ep->min_version) ep->min_version = j->version;
    ep->gen_seconds += j->seconds;
    ep->last_seen = prl_now();
    return bad ? -1 : 0;
}

void gw_episodes_record(gw *g, const gw_request *r, gw_job *j)
{
    for (int i = 0; i < j->n; i++) {
        gw_choice *c = &j->c[i];
        if (!c->ep) continue;
        c->ep->busy = 0;
        if (j->done == 1 && record_turn(g, r, j, c)) {
            fprintf(stderr, "[gateway] episode %s: out of memory recording a turn: it ends\n",
                    c->ep->id);
            c->ep->ended = 1, c->ep->truncated = 1;
        }
    }
    pthread_cond_broadcast(&g->cv);
}

/* ---------------------------------------------------------------- ending ----------- */

static void end_episode(gw *g, gw_group *gr, gw_episode *ep, int has_reward, double reward)
{
    ep->ended = 1, ep->has_reward = has_reward, ep->reward = reward;
    gr->n_ended++;
    pthread_cond_broadcast(&g->cv);
}

int gw_episode_end(gw *g, const char *id, int has_reward, double reward, char **reply, gw_error *e)
{
    gw_group *gr = NULL;
    gw_episode *ep = gw_episode_find(g, id, &gr);
    if (!ep)
        return gw_fail(e, 404, "invalid_request_error", NULL, "episode_not_found",
                       "no episode '%s' in flight at this gateway", id);
    if (!ep->started)
        return gw_fail(e, 409, "invalid_request_error", NULL, "episode_not_started",
                       "episode %s has not played a turn yet", id);
    if (ep->ended)
        return gw_fail(e, 409, "invalid_request_error", NULL, "episode_ended",
                       "episode %s has ended already", id);
    if (ep->busy)
        return gw_fail(e, 409, "invalid_request_error", NULL, "episode_busy",
                       "episode %s has a request in flight", id);
    end_episode(g, gr, ep, has_reward, reward);
    json_t *o = json_pack("{s:s,s:s,s:b,s:i,s:i,s:s}", "id", ep->id, "group", gr->id, "ended", 1,
                          "tokens", ep->n, "turns", ep->turns_played, "reward_from",
                          has_reward ? "harness" : "verifier");
    if (o && has_reward) json_object_set_new(o, "reward", json_real(reward));
    *reply = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return *reply ? 0 : gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

static json_t *ints_json(const int32_t *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

char *gw_episode_json(gw *g, const char *id, gw_error *e)
{
    gw_group *gr = NULL;
    gw_episode *ep = gw_episode_find(g, id, &gr);
    if (!ep) {
        gw_fail(e, 404, "invalid_request_error", NULL, "episode_not_found",
                "no episode '%s' in flight at this gateway", id);
        return NULL;
    }
    json_t *mask = json_array(), *lp = json_array();
    for (int i = ep->prompt_len; mask && lp && i < ep->n; i++) {
        json_array_append_new(mask, json_integer(ep->mask[i]));
        json_array_append_new(lp, json_real(ep->logprobs[i]));
    }
    json_t *o = json_pack(
        "{s:s,s:s,s:i,s:b,s:b,s:b,s:i,s:o,s:o,s:o,s:i,s:I,s:b,s:O*}", "id", ep->id, "group", gr->id,
        "sample", ep->sample, "started", ep->started, "busy", ep->busy, "ended", ep->ended,
        "prompt_len", ep->prompt_len, "tokens", ints_json(ep->ids, ep->n), "mask", mask, "logprobs",
        lp, "turns_played", ep->turns_played, "policy_version", (json_int_t)ep->min_version,
        "truncated", ep->truncated, "turns", ep->turns);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return text;
}

void gw_episodes_sweep(gw *g, double now)
{
    for (gw_group *gr = g->groups; gr; gr = gr->next) {
        int unstarted = 0;
        for (int i = 0; i < gr->count; i++) {
            gw_episode *ep = &gr->ep[i];
            unstarted += !ep->started;
            if (!ep->started || ep->ended || ep->busy || now - ep->last_seen < g->episode_timeout)
                continue;
            fprintf(stderr,
                    "[gateway] episode %s silent for %.0f s: ended as it stands (truncated)\n",
                    ep->id, now - ep->last_seen);
            ep->truncated = 1;
            end_episode(g, gr, ep, 0, 0);
        }
        if (gr->claimed && unstarted && now - gr->claimed_at >= g->episode_timeout) {
            fprintf(stderr,
                    "[gateway] group %s: %d episodes unplayed %.0f s after its claim: it can "
                    "be claimed again\n",
                    gr->id, unstarted, now - gr->claimed_at);
            gr->claimed = 0, gr->claimed_at = 0;
        }
    }
}

int gw_episodes_next_result(gw *g, const char *run, uint64_t id, prl_bus_msg *m)
{
    for (gw_group **pp = &g->groups; *pp; pp = &(*pp)->next) {
        gw_group *gr = *pp;
        if (gr->n_sent == gr->count) { /* every result sent: forget it */
            *pp = gr->next;
            group_free(gr);
            return gw_episodes_next_result(g, run, id, m);
        }
        for (int i = 0; i < gr->count; i++) {
            gw_episode *ep = &gr->ep[i];
            if (!ep->ended || ep->sent) continue;
            const prl_config *cfg = &g->model->cfg;
            prl_msg_result x = {
                .lease = gr->lease,
                .step = gr->step,
                .prompt = gr->prompt,
                .sample = (uint64_t)ep->sample,
                .policy_version = (uint64_t)(ep->min_version < 0 ? 0 : ep->min_version),
                .prompt_len = ep->prompt_len,
                .gen_us = (uint64_t)(ep->gen_seconds * 1e6),
                .stop = ep->stop,
                .tokens = ep->ids,
                .n_tokens = (size_t)ep->n,
                .logprobs = ep->logprobs + ep->prompt_len,
                .mask = ep->mask + ep->prompt_len,
                .routes = ep->n_route_tokens == ep->n - 1 ? ep->routes : NULL,
                .routes_bytes = ep->routes_bytes,
                .route_shape = {ep->n_route_tokens, g->model->n_moe, cfg->num_experts_per_tok,
                                prl_routes_width(cfg->n_routed_experts)},
                .turns = ep->turns ? ep->turns : json_array(),
                .truncated = ep->truncated,
                .turns_played = ep->turns_played,
                .has_reward = ep->has_reward,
                .reward = ep->reward};
            prl_status rc = prl_msg_result_encode(&x, run, id, m);
            if (!ep->turns) json_decref(x.turns);
            ep->sent = 1, gr->n_sent++;
            if (rc) {
                fprintf(stderr, "[gateway] episode %s: result not built: %s\n", ep->id,
                        prl_error_message());
                continue;
            }
            return 1;
        }
    }
    return 0;
}
