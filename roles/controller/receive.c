/*
** receive.c — the workers' answers to the controller (internal.h): hello, heartbeat,
** result, scored and trained, each checked against the work in flight before it changes
** anything; a bad one gets an `error` naming the problem (docs/pipeline.md "Robustness").
*/
#include "roles/controller/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

uint64_t ctl_field_u(const prl_bus_msg *m, const char *k, int *bad)
{
    uint64_t v = 0;
    if (prl_bus_msg_get_uint(m, k, &v)) *bad = 1;
    return v;
}

/* The group a result or score answers: step in flight, prompt among its candidates. */
static group *find_group(ctl *c, uint64_t step, uint64_t prompt, step_run **rr, int *gi)
{
    step_run *r = ctl_step_find(c, (int64_t)step);
    if (!r) return NULL;
    for (int i = 0; i < r->n; i++)
        if ((uint64_t)r->g[i].prompt == prompt) {
            *rr = r, *gi = i;
            return &r->g[i];
        }
    return NULL;
}

void ctl_on_hello(ctl *c, const prl_bus_msg *m, const prl_bus_peer *from, uint64_t id)
{
    const char *role = NULL, *name = NULL;
    if (prl_bus_msg_get_str(m, "role", &role) || prl_bus_msg_get_str(m, "worker", &name)) {
        ctl_send_error(c, from, id, "hello needs role and worker");
        return;
    }
    if (strcmp(role, "rollout") && strcmp(role, "reward") && strcmp(role, "trainer") &&
        strcmp(role, "teacher")) {
        ctl_send_error(c, from, id, "unknown role '%s' (rollout, reward, trainer or teacher)", role);
        return;
    }
    if (from->len != strlen(name) || memcmp(from->id, name, from->len)) {
        ctl_send_error(c, from, id, "worker '%s' must connect with its name as the socket identity", name);
        return;
    }
    worker *w = ctl_worker_by_name(c, name);
    if (w) {
        if (w->lease) ctl_requeue_worker(c, w, "the worker said hello again (restarted)");
        ctl_event(c, "rejoin", "{\"worker\": \"%s\", \"role\": \"%s\"}", name, role);
    } else {
        if (c->nw == MAX_WORKERS) {
            ctl_send_error(c, from, id, "too many workers (%d)", MAX_WORKERS);
            return;
        }
        w = &c->w[c->nw++];
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "%s", name);
        ctl_log("%s joined (%s)", name, role);
        ctl_event(c, "join", "{\"worker\": \"%s\", \"role\": \"%s\"}", name, role);
    }
    snprintf(w->role, sizeof w->role, "%s", role);
    w->peer = *from;
    w->seen = prl_now();
    w->lease = 0, w->holds = 0;
    ctl_send_welcome(c, w);
}

/* A heartbeat comes from the worker's heartbeat socket, which reads nothing: an unknown
** name is only logged. */
void ctl_on_heartbeat(ctl *c, const prl_bus_msg *m, uint64_t id)
{
    const char *name = NULL;
    prl_bus_msg_get_str(m, "worker", &name);
    worker *w = name ? ctl_worker_by_name(c, name) : NULL;
    if (w && w->peer.len) {
        w->seen = prl_now();
        return;
    }
    ctl_log("rejected message %llu: heartbeat from unknown worker '%s'", (unsigned long long)id,
          name ? name : "?");
    /* A worker this controller does not know (it restarted, or forgot a silent worker) is
    ** idle and only heart-beating: ask its main socket, whose identity is its name, to say
    ** hello again. Nobody by that name connected: nothing is sent. */
    size_t k = name ? strlen(name) : 0;
    if (k == 0 || k > sizeof ((prl_bus_peer *)0)->id) return;
    prl_bus_peer to = {.len = k};
    memcpy(to.id, name, k);
    prl_bus_msg e;
    if (prl_bus_msg_init(&e, "error", c->job->name, ++c->next_id)) return;
    prl_bus_msg_set_str(&e, "reason", "unknown worker: say hello first");
    prl_bus_msg_set_uint(&e, "ref", id);
    if (prl_bus_send(c->sock, &to, &e) == PRL_OK) ctl_log("asked '%s' to say hello again", name);
    prl_bus_msg_free(&e);
}

/* A result frame of the expected dtype and count, or NULL. */
const prl_bus_frame *ctl_frame_of(const prl_bus_msg *m, const char *name, prl_bus_dtype dt,
                                     size_t count, int exact)
{
    const prl_bus_frame *f = prl_bus_msg_frame(m, name);
    if (!f || f->dtype != dt || (exact && f->count != count)) return NULL;
    return f;
}

void ctl_on_result(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    int bad = 0;
    uint64_t lid = ctl_field_u(m, "lease", &bad), step = ctl_field_u(m, "step", &bad);
    uint64_t prompt = ctl_field_u(m, "prompt", &bad), sample = ctl_field_u(m, "sample", &bad);
    uint64_t ver = ctl_field_u(m, "policy_version", &bad), plen = ctl_field_u(m, "prompt_len", &bad);
    uint64_t gen_us = 0, stop = 0;
    prl_bus_msg_get_uint(m, "gen_us", &gen_us);
    prl_bus_msg_get_uint(m, "stop", &stop);
    if (bad) {
        ctl_send_error(c, &w->peer, id, "result needs lease, step, prompt, sample, policy_version and prompt_len");
        return;
    }
    step_run *r;
    int gi;
    group *g = find_group(c, step, prompt, &r, &gi);
    if (!g || sample >= (uint64_t)c->G) {
        ctl_send_error(c, &w->peer, id, "result for step %llu prompt %llu sample %llu: no such work in flight",
                   (unsigned long long)step, (unsigned long long)prompt, (unsigned long long)sample);
        return;
    }
    lease *l = ctl_lease_find(c, lid);
    if (!l || l->kind != LEASE_ROLLOUT || l->step != r->step || l->group != gi || &c->w[l->worker] != w) {
        ctl_send_error(c, &w->peer, id, "result: lease %llu is not %s's rollout lease of step %llu prompt %llu",
                   (unsigned long long)lid, w->name, (unsigned long long)step, (unsigned long long)prompt);
        return;
    }
    const prl_bus_frame *tok = prl_bus_msg_frame(m, "tokens");
    if (plen < 1 || plen >= tok->count || tok->count > (1u << 20)) {
        CTL_REJECT_HELD(c, w, l, id, "result: prompt_len %llu must be in [1, %zu)", (unsigned long long)plen, tok->count);
        return;
    }
    size_t nr = tok->count - plen;
    const prl_bus_frame *lp = ctl_frame_of(m, "logprobs", PRL_BUS_F32, nr, 1);
    const prl_bus_frame *mk = ctl_frame_of(m, "mask", PRL_BUS_U8, nr, 1);
    const prl_bus_frame *rt = prl_bus_msg_frame(m, "routes");
    char *meta = prl_bus_msg_text(m, "meta");
    json_error_t je;
    json_t *mj = meta ? json_loads(meta, 0, &je) : NULL;
    json_t *turns = json_object_get(mj, "turns");
    if (!lp || !mk || !json_is_array(turns) || ver > (uint64_t)c->version) {
        CTL_REJECT_HELD(c, w, l, id, "result: %s", !lp ? "frame 'logprobs' must hold one f32 per response token"
                   : !mk ? "frame 'mask' must hold one u8 per response token"
                   : !json_is_array(turns) ? "frame 'meta' must be JSON with a \"turns\" array"
                   : "policy_version is newer than any committed version");
        free(meta), json_decref(mj);
        return;
    }
    int32_t *ids = tok->data;
    for (size_t i = 0; i < tok->count; i++) {
        if (ids[i] < 0) {
            CTL_REJECT_HELD(c, w, l, id, "result: token %zu has the negative id %d", i, (int)ids[i]);
            free(meta), json_decref(mj);
            return;
        }
    }
    const float *lv = lp->data;
    const uint8_t *mv = mk->data;
    for (size_t i = 0; i < nr; i++) {
        if (!isfinite(lv[i]) || lv[i] > 0 || mv[i] > 1) {
            CTL_REJECT_HELD(c, w, l, id, "result: response token %zu has log-prob %g and mask %u", i,
                       (double)lv[i], mv[i]);
            free(meta), json_decref(mj);
            return;
        }
    }
    slot *s = &g->s[sample];
    if (s->state) { /* a repeat (re-leased work): idempotent */
        if (s->n != (int)tok->count || memcmp(s->tokens, ids, tok->count * sizeof *ids))
            ctl_event(c, "mismatch", "{\"step\": %llu, \"prompt\": \"%s\", \"sample\": %llu, \"why\": "
                  "\"a repeated result differs from the first; the first is kept\"}",
                  (unsigned long long)step, c->task_id[g->prompt], (unsigned long long)sample);
    } else {
        s->tokens = malloc(tok->bytes), s->logprobs = malloc(nr * sizeof(float) + 1);
        s->mask = malloc(nr + 1);
        s->turns = json_dumps(turns, JSON_COMPACT);
        if (rt && rt->dtype == PRL_BUS_U8 && rt->bytes) {
            s->routes = malloc(rt->bytes);
            if (s->routes) memcpy(s->routes, rt->data, rt->bytes), s->routes_bytes = rt->bytes;
            json_t *shape = json_object_get(mj, "route_shape");
            for (int k = 0; k < 4; k++) s->route_shape[k] = (int)json_integer_value(json_array_get(shape, (size_t)k));
            if (!ctl_routes_shape_ok(s->route_shape, s->routes_bytes, tok->count)) {
                /* stored and trained alike: without routes (the trainer routes natively) */
                ctl_log("result: routes of shape [%d][%d][%d] x %d do not match their %zu bytes "
                      "and %zu tokens: dropped", s->route_shape[0], s->route_shape[1],
                      s->route_shape[2], s->route_shape[3], s->routes_bytes, tok->count);
                free(s->routes), s->routes = NULL, s->routes_bytes = 0;
                memset(s->route_shape, 0, sizeof s->route_shape);
            }
        }
        if (!s->tokens || !s->logprobs || !s->mask || !s->turns) {
            ctl_log("out of memory for a result");
            ctl_slot_free(s);
        } else {
            memcpy(s->tokens, ids, tok->bytes);
            memcpy(s->logprobs, lv, nr * sizeof(float));
            memcpy(s->mask, mv, nr);
            s->n = (int)tok->count, s->prompt_len = (int)plen, s->version = (int64_t)ver;
            s->gen_s = 1e-6 * (double)gen_us, s->stop = (int)stop, s->state = 1;
            s->truncated = json_is_true(json_object_get(mj, "truncated"));
            snprintf(s->worker, sizeof s->worker, "%s", w->name);
            g->generated++;
            r->gen_tokens += (double)nr;
            if (g->generated == c->G) {
                r->gen_seconds += s->gen_s;
                int done = 1;
                for (int i = 0; i < r->n; i++) done &= r->g[i].generated == c->G;
                if (done) r->t_rolled = prl_now();
            }
        }
    }
    free(meta), json_decref(mj);
    if (g->generated == c->G && g->lease) {
        lease *l = ctl_lease_find(c, g->lease);
        g->lease = 0;
        if (l) ctl_lease_end(c, l->id);
    }
}

void ctl_on_scored(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    int bad = 0;
    uint64_t step = ctl_field_u(m, "step", &bad), prompt = ctl_field_u(m, "prompt", &bad);
    uint64_t sample = ctl_field_u(m, "sample", &bad), us = ctl_field_u(m, "score_us", &bad);
    uint64_t lid = ctl_field_u(m, "lease", &bad);
    step_run *r;
    int gi;
    group *g = bad ? NULL : find_group(c, step, prompt, &r, &gi);
    if (!g || sample >= (uint64_t)c->G || g->s[sample].state != 1) {
        ctl_send_error(c, &w->peer, id, "scored: step %llu prompt %llu sample %llu is not waiting for a score",
                   (unsigned long long)step, (unsigned long long)prompt, (unsigned long long)sample);
        return;
    }
    slot *s = &g->s[sample];
    lease *l = ctl_lease_find(c, lid);
    if (!l || s->score_lease != lid || &c->w[l->worker] != w) {
        ctl_send_error(c, &w->peer, id, "scored: lease %llu is not %s's score lease of step %llu prompt %llu "
                   "sample %llu", (unsigned long long)lid, w->name, (unsigned long long)step,
                   (unsigned long long)prompt, (unsigned long long)sample);
        return;
    }
    ctl_lease_end(c, lid); /* answered: a bad detail below is scored again */
    s->score_lease = 0;
    char *detail = prl_bus_msg_text(m, "detail");
    json_error_t je;
    json_t *dj = detail ? json_loads(detail, 0, &je) : NULL;
    json_t *score = json_object_get(dj, "score");
    double v = json_number_value(score);
    if (!json_is_number(score) || !isfinite(v) || v < 0 || v > 1) {
        ctl_send_error(c, &w->peer, id, "scored: frame 'detail' must be JSON with a \"score\" in [0, 1]");
        free(detail), json_decref(dj);
        return;
    }
    s->reward = v;
    s->flags = (unsigned)json_integer_value(json_object_get(dj, "flags"));
    s->detail = detail;
    s->score_s = 1e-6 * (double)us;
    s->state = 2;
    json_decref(dj);
    r->score_seconds += s->score_s;
    c->fatal = ctl_store_sample(c, r, g, (int)sample);
    if (c->fatal) return;
    g->scored++;
    if (g->scored == c->G) ctl_judge_group(c, r, g);
    if (ctl_step_rolled(c, r) && !r->t_scored) r->t_scored = prl_now();
}

/* The trainer flagged a collapsed router (route_entropy_alarm, docs/replay.md): an ctl_event in
** run.db with the per-layer routing entropies. */
static void routing_alarm(ctl *c, int64_t step, json_t *metrics)
{
    if (json_integer_value(json_object_get(metrics, "route_entropy_alarm")) != 1) return;
    char *h = json_dumps(json_object_get(metrics, "route_entropy"), JSON_COMPACT);
    ctl_event(c, "routing_collapse", "{\"step\": %lld, \"route_entropy\": %s, \"alarm_fraction\": %g}",
          (long long)step, h ? h : "null", c->job->replay_entropy_alarm);
    free(h);
}

void ctl_on_trained(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    int bad = 0;
    uint64_t step = ctl_field_u(m, "step", &bad), ver = ctl_field_u(m, "version", &bad);
    uint64_t sum = 0, us = ctl_field_u(m, "train_us", &bad), lid = ctl_field_u(m, "lease", &bad);
    const char *path = NULL;
    bad |= prl_bus_msg_get_hex64(m, "ckpt_checksum", &sum) != PRL_OK;
    bad |= prl_bus_msg_get_str(m, "path", &path) != PRL_OK;
    step_run *r = bad ? NULL : ctl_step_find(c, (int64_t)step);
    lease *l = r && r->train_lease == lid ? ctl_lease_find(c, lid) : NULL;
    if (!r || (int64_t)step != c->version || (int64_t)ver != c->version + 1 || !l || &c->w[l->worker] != w) {
        ctl_send_error(c, &w->peer, id, "trained: step %llu version %llu lease %llu is not the training in "
                   "flight (step %lld at version %lld, lease %llu)", (unsigned long long)step,
                   (unsigned long long)ver, (unsigned long long)lid, (long long)c->version,
                   (long long)c->version, (unsigned long long)(r ? r->train_lease : 0));
        return;
    }
    char *metrics = prl_bus_msg_text(m, "metrics");
    json_error_t je;
    json_t *mj = metrics ? json_loads(metrics, 0, &je) : NULL;
    struct stat sb;
    if (!json_is_object(mj) || stat(path, &sb) || !S_ISDIR(sb.st_mode)) {
        CTL_REJECT_HELD(c, w, l, id, "trained: %s", !json_is_object(mj) ? "frame 'metrics' must be a JSON object"
                    : "path is not a checkpoint directory");
        free(metrics), json_decref(mj);
        return;
    }
    routing_alarm(c, (int64_t)step, mj);
    json_decref(mj);
    if (r->train_lease) ctl_lease_end(c, r->train_lease);
    r->train_lease = 0;
    c->fatal = ctl_step_commit(c, r, path, sum, metrics, 1e-6 * (double)us);
    free(metrics);
}
