/*
** receive.c — the workers' answers to the controller (internal.h): hello, heartbeat,
** result, scored and trained, each checked against the work in flight before it changes
** anything; a bad one gets an `error` naming the problem (docs/faults.md "Robustness").
*/
#include "roles/controller/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void ctl_refuse(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id, lease_kind kind,
                const char *why)
{
    uint64_t lid = 0;
    lease *l = prl_bus_msg_get_uint(m, "lease", &lid) ? NULL : ctl_lease_find(c, lid);
    if (l && l->kind == kind && &c->w[l->worker] == w) CTL_REJECT_HELD(c, w, l, id, "%s", why);
    else ctl_send_error(c, &w->peer, id, "%s", why);
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
    prl_msg_hello x;
    if (prl_msg_hello_decode(m, &x)) {
        ctl_send_error(c, from, id, "%s", prl_error_message());
        return;
    }
    const char *role = x.role, *name = x.worker;
    if (from->len != strlen(name) || memcmp(from->id, name, from->len)) {
        ctl_send_error(c, from, id, "worker '%s' must connect with its name as the socket identity",
                       name);
        return;
    }
    worker *w = ctl_worker_by_name(c, name);
    if (w) {
        if (w->held) ctl_requeue_worker(c, w, "the worker said hello again (restarted)");
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
    w->lease = 0, w->holds = 0, w->held = 0;
    w->slots = (int)x.slots;
    ctl_send_welcome(c, w);
}

/* A heartbeat comes from the worker's heartbeat socket, which reads nothing: an unknown
** name is only logged. */
void ctl_on_heartbeat(ctl *c, const prl_bus_msg *m, uint64_t id)
{
    prl_msg_heartbeat x;
    const char *name = prl_msg_heartbeat_decode(m, &x) ? NULL : x.worker;
    worker *w = name ? ctl_worker_by_name(c, name) : NULL;
    if (w && w->peer.len) {
        w->seen = prl_now();
        return;
    }
    char why[160];
    snprintf(why, sizeof why, "heartbeat from unknown worker '%s'", name ? name : "?");
    ctl_log_rejected(c, id, why);
    /* A worker this controller does not know (it restarted, or forgot a silent worker) is
    ** idle and only heart-beating: ask its main socket, whose identity is its name, to say
    ** hello again. Nobody by that name connected: nothing is sent. */
    size_t k = name ? strlen(name) : 0;
    if (k == 0 || k > sizeof((prl_bus_peer *)0)->id) return;
    prl_bus_peer to = {.len = k};
    memcpy(to.id, name, k);
    prl_bus_msg e;
    prl_msg_error err = {.reason = "unknown worker: say hello first", .ref = id};
    if (prl_msg_error_encode(&err, c->job->name, ++c->next_id, &e)) return;
    if (prl_bus_send(c->sock, &to, &e) == PRL_OK) ctl_log("asked '%s' to say hello again", name);
    prl_bus_msg_free(&e);
}

/* Sample j of g has its reward (state 2): an evaluation tallies it, a step stores it and
** judges the group once every sample is scored. */
static void sample_scored(ctl *c, step_run *r, group *g, int j)
{
    r->score_seconds += g->s[j].score_s;
    if (r->eval) { /* evaluation samples are tallied, not stored (evals.c) */
        g->scored++;
        ctl_eval_scored(c, r, g);
        return;
    }
    c->fatal = ctl_store_sample(c, r, g, j);
    if (c->fatal) return;
    g->scored++;
    if (g->scored == c->G) ctl_judge_group(c, r, g);
    if (ctl_step_rolled(c, r) && !r->t_scored) r->t_scored = prl_now();
}

/* A gateway episode whose harness posted the reward (docs/gateway.md) needs no scoring. */
static void take_posted_reward(ctl *c, step_run *r, group *g, int j, double reward)
{
    slot *s = &g->s[j];
    char detail[96];
    snprintf(detail, sizeof detail, "{\"score\": %.17g, \"source\": \"harness\"}", reward);
    s->detail = strdup(detail);
    if (!s->detail) {
        ctl_log("out of memory for a posted reward");
        return; /* stays generated: a reward worker scores it */
    }
    s->reward = reward, s->flags = 0, s->score_s = 0, s->state = 2;
    sample_scored(c, r, g, j);
}

/* Keep the first result of a sample (a repeat of re-leased work must be the same). */
static void take_result(ctl *c, step_run *r, group *g, slot *s, const worker *w,
                        const prl_msg_result *x)
{
    size_t nr = x->n_tokens - (size_t)x->prompt_len;
    s->tokens = malloc(x->n_tokens * sizeof *s->tokens),
    s->logprobs = malloc(nr * sizeof(float) + 1);
    s->mask = malloc(nr + 1);
    s->turns = json_dumps(x->turns, JSON_COMPACT);
    if (x->routes) {
        s->routes = malloc(x->routes_bytes);
        if (s->routes)
            memcpy(s->routes, x->routes, x->routes_bytes), s->routes_bytes = x->routes_bytes;
        s->route_shape = x->route_shape;
    } else if (x->routes_dropped[0]) { /* stored and trained alike: without routes */
        ctl_log("result: routes dropped (the trainer routes natively): %s", x->routes_dropped);
    }
    if (!s->tokens || !s->logprobs || !s->mask || !s->turns) {
        ctl_log("out of memory for a result");
        ctl_slot_free(s);
        return;
    }
    memcpy(s->tokens, x->tokens, x->n_tokens * sizeof *s->tokens);
    memcpy(s->logprobs, x->logprobs, nr * sizeof(float));
    memcpy(s->mask, x->mask, nr);
    s->n = (int)x->n_tokens, s->prompt_len = x->prompt_len, s->version = (int64_t)x->policy_version;
    s->gen_s = 1e-6 * (double)x->gen_us, s->stop = x->stop, s->state = 1;
    s->truncated = x->truncated;
    snprintf(s->worker, sizeof s->worker, "%s", w->name);
    g->generated++;
    r->gen_tokens += (double)nr;
    if (g->generated == ctl_gsize(c, r)) {
        r->gen_seconds += s->gen_s;
        int done = 1;
        for (int i = 0; i < r->n; i++) done &= r->g[i].generated == ctl_gsize(c, r);
        if (done) r->t_rolled = prl_now();
    }
}

/* The result is for a sample in flight, under the rollout lease its sender holds. */
static int result_in_flight(ctl *c, worker *w, const prl_msg_result *x, uint64_t id, step_run **r,
                            group **g)
{
    int gi;
    *g = find_group(c, x->step, x->prompt, r, &gi);
    if (!*g || x->sample >= (uint64_t)ctl_gsize(c, *r)) {
        ctl_send_error(c, &w->peer, id,
                       "result for step %llu prompt %llu sample %llu: no such work in flight",
                       (unsigned long long)x->step, (unsigned long long)x->prompt,
                       (unsigned long long)x->sample);
        return 0;
    }
    lease *l = ctl_lease_find(c, x->lease);
    if (!l || l->kind != LEASE_ROLLOUT || l->step != (*r)->step || l->group != gi ||
        &c->w[l->worker] != w) {
        ctl_send_error(c, &w->peer, id,
                       "result: lease %llu is not %s's rollout lease of step %llu prompt %llu",
                       (unsigned long long)x->lease, w->name, (unsigned long long)x->step,
                       (unsigned long long)x->prompt);
        return 0;
    }
    if (x->policy_version > (uint64_t)c->version) {
        CTL_REJECT_HELD(c, w, l, id, "result: policy_version is newer than any committed version");
        return 0;
    }
    return 1;
}

void ctl_on_result(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    prl_msg_result x;
    if (prl_msg_result_decode(m, &x)) {
        ctl_refuse(c, w, m, id, LEASE_ROLLOUT, prl_error_message());
        return;
    }
    step_run *r;
    group *g;
    if (!result_in_flight(c, w, &x, id, &r, &g)) {
        prl_msg_result_free(&x);
        return;
    }
    slot *s = &g->s[x.sample];
    int j = (int)x.sample, posted = 0;
    double reward = x.reward;
    if (!s->state) {
        take_result(c, r, g, s, w, &x);
        posted = s->state == 1 && x.has_reward;
    } else if (s->n != (int)x.n_tokens ||
               memcmp(s->tokens, x.tokens, x.n_tokens * sizeof *x.tokens))
        ctl_event(c, "mismatch",
                  "{\"step\": %llu, \"prompt\": \"%s\", \"sample\": %llu, \"why\": "
                  "\"a repeated result differs from the first; the first is kept\"}",
                  (unsigned long long)x.step, c->task_id[g->prompt], (unsigned long long)x.sample);
    prl_msg_result_free(&x);
    if (g->generated == ctl_gsize(c, r) && g->lease) {
        lease *l = ctl_lease_find(c, g->lease);
        g->lease = 0;
        if (l) ctl_lease_end(c, l->id);
    }
    if (posted) take_posted_reward(c, r, g, j, reward); /* last: an evaluation may close */
}

void ctl_on_scored(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    prl_msg_scored x;
    if (prl_msg_scored_decode(m, &x)) {
        ctl_refuse(c, w, m, id, LEASE_SCORE, prl_error_message());
        return;
    }
    step_run *r;
    int gi;
    group *g = find_group(c, x.step, x.prompt, &r, &gi);
    if (!g || x.sample >= (uint64_t)ctl_gsize(c, r) || g->s[x.sample].state != 1) {
        ctl_send_error(
            c, &w->peer, id, "scored: step %llu prompt %llu sample %llu is not waiting for a score",
            (unsigned long long)x.step, (unsigned long long)x.prompt, (unsigned long long)x.sample);
        prl_msg_scored_free(&x);
        return;
    }
    slot *s = &g->s[x.sample];
    lease *l = ctl_lease_find(c, x.lease);
    if (!l || s->score_lease != x.lease || &c->w[l->worker] != w) {
        ctl_send_error(c, &w->peer, id,
                       "scored: lease %llu is not %s's score lease of step %llu prompt %llu "
                       "sample %llu",
                       (unsigned long long)x.lease, w->name, (unsigned long long)x.step,
                       (unsigned long long)x.prompt, (unsigned long long)x.sample);
        prl_msg_scored_free(&x);
        return;
    }
    ctl_lease_end(c, x.lease);
    s->score_lease = 0;
    s->reward = x.score;
    s->flags = x.flags;
    s->detail = (char *)x.detail; /* moved: x is not freed */
    s->score_s = 1e-6 * (double)x.score_us;
    s->state = 2;
    sample_scored(c, r, g, (int)x.sample);
}

/* The trainer flagged a collapsed router (route_entropy_alarm, docs/replay.md): an event in
** run.db with the per-layer routing entropies. */
static void routing_alarm(ctl *c, int64_t step, json_t *metrics)
{
    if (json_integer_value(json_object_get(metrics, "route_entropy_alarm")) != 1) return;
    char *h = json_dumps(json_object_get(metrics, "route_entropy"), JSON_COMPACT);
    ctl_event(c, "routing_collapse",
              "{\"step\": %lld, \"route_entropy\": %s, \"alarm_fraction\": %g}", (long long)step,
              h ? h : "null", c->job->replay_entropy_alarm);
    free(h);
}

/* Why a trained result's checkpoint cannot become the version (NULL: it can): it must be
** the run's own ckpt/vNNNNNN of that version, a directory, whose weight files hash to the
** checksum the trainer announced. */
static const char *trained_checkpoint_bad(ctl *c, const prl_msg_trained *x)
{
    char want[1200];
    prl_job_ckpt_dir(c->o->run_dir, (int64_t)x->version, want, sizeof want);
    if (strcmp(x->path, want)) return "trained: the checkpoint is not the run's ckpt/vNNNNNN";
    struct stat sb;
    if (lstat(x->path, &sb) || !S_ISDIR(sb.st_mode))
        return "trained: path is not a checkpoint directory";
    uint64_t sum = 0;
    if (prl_checkpoint_weights_hash(x->path, 0, &sum) || sum != x->ckpt_checksum)
        return "trained: the checkpoint's weights do not match the checksum announced";
    return NULL;
}

void ctl_on_trained(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    prl_msg_trained x;
    if (prl_msg_trained_decode(m, &x)) {
        ctl_refuse(c, w, m, id, LEASE_TRAIN, prl_error_message());
        return;
    }
    step_run *r = ctl_step_find(c, (int64_t)x.step);
    lease *l = r && r->train_lease == x.lease ? ctl_lease_find(c, x.lease) : NULL;
    if (!r || (int64_t)x.step != c->version || (int64_t)x.version != c->version + 1 || !l ||
        &c->w[l->worker] != w) {
        ctl_send_error(c, &w->peer, id,
                       "trained: step %llu version %llu lease %llu is not the training in "
                       "flight (step %lld at version %lld, lease %llu)",
                       (unsigned long long)x.step, (unsigned long long)x.version,
                       (unsigned long long)x.lease, (long long)c->version, (long long)c->version,
                       (unsigned long long)(r ? r->train_lease : 0));
        prl_msg_trained_free(&x);
        return;
    }
    const char *bad = trained_checkpoint_bad(c, &x);
    if (bad) {
        CTL_REJECT_HELD(c, w, l, id, "%s", bad);
        prl_msg_trained_free(&x);
        return;
    }
    routing_alarm(c, (int64_t)x.step, x.metrics_json);
    if (r->train_lease) ctl_lease_end(c, r->train_lease);
    r->train_lease = 0;
    c->fatal = ctl_step_commit(c, r, x.path, x.ckpt_checksum, x.metrics, 1e-6 * (double)x.train_us);
    prl_msg_trained_free(&x);
}
