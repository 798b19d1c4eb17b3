/*
** controller.c — the run's coordinator (controller.h, docs/pipeline.md): start-up, the
** event loop and the end of a run.
**
** One thread, one ROUTER socket, one event loop: receive a message, update the state, then
** hand out whatever work can start. State lives in memory for the steps in flight and in
** run.db for everything finished, so a restarted controller continues from run.db.
**
** A step's life: open (its candidate prompts chosen) → every group rolled out (one `work`
** per group of G samples) → every sample scored (one `score` each) and written to run.db →
** groups judged (dynamic sampling drops groups of equal rewards and adds a candidate) →
** `train` to the trainer once the policy is at the step's version → `trained`: the version
** is recorded, the step's metrics written, the step closed. In sync mode (lag 0) step t+1
** opens when version t+1 exists; in async mode up to `max_lag` steps roll out ahead.
**
** The pieces (internal.h): leases.c (workers, leases, what is sent to them), prompts.c (the
** candidate sequence, retirement, revisits), steps.c (a step's groups, scheduling, the
** `train` item), teach.c (OPD's teacher items), receive.c (the workers' answers), metrics.c
** (a step's metrics and progress line), record.c (every run.db write), evals.c (in-run
** evaluations of the eval split).
*/
#include "roles/controller/internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void ctl_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("[controller] ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

prl_status prl_controller_endpoint(const char *run_dir, const char *socket_name, char *out,
                                   size_t n)
{
    int k = snprintf(out, n, "ipc://%s/%s", run_dir, socket_name);
    if (k < 0 || (size_t)k >= n || k - 6 > 107)
        return prl_error_set(PRL_ERR_ARG,
                             "socket path %s/%s is longer than the 107 bytes of "
                             "an ipc:// endpoint: use a shorter run directory",
                             run_dir, socket_name);
    return PRL_OK;
}

/* ---------------------------------------------------------------- loop ------------- */

static void dispatch(ctl *c, prl_bus_msg *m, const prl_bus_peer *from)
{
    uint64_t id = prl_bus_msg_id(m);
    const char *run = prl_bus_msg_run(m);
    if (!strcmp(m->type, "hello")) {
        ctl_on_hello(c, m, from, id);
        return;
    }
    if (!strcmp(m->type, "heartbeat")) {
        ctl_on_heartbeat(c, m, id);
        return;
    }
    worker *w = ctl_worker_by_peer(c, from);
    if (!w) {
        ctl_send_error(c, from, id, "unknown worker: say hello first");
        return;
    }
    w->seen = prl_now();
    if (strcmp(run, c->job->name)) {
        ctl_send_error(c, from, id, "message for run '%s', this is run '%s'", run, c->job->name);
        return;
    }
    if (!strcmp(m->type, "result") && !strcmp(w->role, c->rollout_role)) ctl_on_result(c, w, m, id);
    else if (!strcmp(m->type, "scored") && !strcmp(w->role, "reward")) ctl_on_scored(c, w, m, id);
    else if (!strcmp(m->type, "trained") && !strcmp(w->role, "trainer"))
        ctl_on_trained(c, w, m, id);
    else if (!strcmp(m->type, "taught") && !strcmp(w->role, "teacher")) ctl_on_taught(c, w, m, id);
    else if (!strcmp(m->type, "fetch")) ctl_on_fetch(c, w, m, id);
    else if (!strcmp(m->type, "error")) {
        prl_msg_error e;
        const char *why = prl_msg_error_decode(m, &e) ? "?" : e.reason;
        ctl_log("%s reports: %s", w->name, why);
        lease *l = e.has_lease ? ctl_lease_find(c, e.lease) : NULL;
        if (l && &c->w[l->worker] == w) { /* only the holder gives it back */
            char reason[300];
            snprintf(reason, sizeof reason, "%s reported: %s", w->name, why);
            ctl_lease_failed(c, l, reason);
        }
    } else if (strcmp(m->type, "ack")) {
        ctl_send_error(c, from, id, "a %s does not send '%s' messages", w->role, m->type);
    }
}

/* Leases of workers silent for longer than lease_seconds go back to the queue. */
static void expire(ctl *c)
{
    double now = prl_now();
    for (int i = 0; i < c->nw; i++) {
        worker *w = &c->w[i];
        if (!w->peer.len || now - w->seen <= c->job->lease_seconds) continue;
        if (w->held) ctl_requeue_worker(c, w, "no heartbeat within controller.lease_seconds");
        ctl_log("%s is silent: forgotten until it says hello again", w->name);
        ctl_event(c, "lost", "{\"worker\": \"%s\"}", w->name);
        w->peer.len = 0;
    }
}

/* Status `failed` and the event naming why: the run is over until the user changes something. */
static void record_failed(prl_store *db, int64_t run, const char *why)
{
    prl_store_run_set_status(db, run, "failed");
    json_t *d = json_pack("{s:s}", "why", why);
    char *dt = d ? json_dumps(d, JSON_COMPACT) : NULL;
    if (dt) prl_store_event_add(db, run, "failed", dt);
    free(dt), json_decref(d);
}

prl_status prl_controller_record_failure(const char *run_dir, const char *why)
{
    char db_path[1100];
    snprintf(db_path, sizeof db_path, "%s/run.db", run_dir);
    if (access(db_path, F_OK))
        return prl_error_set(PRL_ERR_IO, "%s: no run.db to record the failure in", run_dir);
    prl_store *db;
    prl_status rc = prl_store_open(db_path, &db);
    if (rc) return rc;
    prl_store_run r;
    if (!(rc = prl_store_run_sole(db, &r))) record_failed(db, r.id, why);
    prl_store_run_free(&r);
    prl_store_close(db);
    return rc;
}

static void finish(ctl *c, const char *why)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].peer.len) ctl_send_stop(c, &c->w[i], why);
}

static void cleanup(ctl *c)
{
    char held[200];
    if (prl_bus_log_limit_held_line(&c->reject_log, CTL_REJECTED, held, sizeof held))
        ctl_log("%s", held);
    if (prl_bus_log_limit_held_line(&c->requeue_log, CTL_REQUEUED, held, sizeof held))
        ctl_log("%s", held);
    for (int i = 0; i < MAX_INFLIGHT; i++)
        if (c->st[i].active) ctl_step_free(c, &c->st[i]);
    for (int i = 0; i < c->n_tasks + c->n_eval; i++) json_decref(c->task[i]), free(c->task_text[i]);
    free(c->task), free(c->task_text), free(c->task_id), free(c->retired), free(c->teacher_kl);
    free(c->task_teacher), free(c->perm);
    free(c->l), free(c->config_json);
    prl_bus_socket_free(c->sock);
    prl_store_close(c->db);
}

/* ckpt/ and logs/ of the run directory: `prl run` makes them, and so does a controller
** started by hand (prl role controller), so the trainer's first save has its folder. */
static prl_status make_run_folders(const char *run_dir)
{
    const char *sub[] = {"ckpt", "logs"};
    char path[1100];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", run_dir, sub[i]);
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return prl_error_set(PRL_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    }
    return PRL_OK;
}

prl_status prl_controller_run(const prl_controller_options *o)
{
    ctl c0, *c = &c0;
    memset(c, 0, sizeof *c);
    c->o = o, c->job = o->job, c->G = o->job->group_size, c->B = o->job->batch_prompts;
    c->lag = strcmp(o->job->mode, "async") ? 0 : o->job->max_lag;
    c->rollout_role = strcmp(o->job->rollout_source, "gateway") ? "rollout" : "gateway";
    c->t_start = prl_now();
    char db_path[1100], ep[1100];
    snprintf(db_path, sizeof db_path, "%s/run.db", o->run_dir);
    prl_status rc = PRL_OK;
    if (o->endpoint) snprintf(ep, sizeof ep, "%s", o->endpoint);
    else rc = prl_controller_endpoint(o->run_dir, "control.sock", ep, sizeof ep);
    c->config_json = prl_job_config_to_json(o->job);
    if (!rc && !c->config_json) rc = prl_error_set(PRL_ERR_NOMEM, "config");
    if (!rc) rc = make_run_folders(o->run_dir);
    if (!rc) rc = prl_store_open(db_path, &c->db);
    if (!rc) rc = ctl_open_run(c);
    if (rc == PRL_ERR_CONFIG && o->failed) *o->failed = 1; /* a restart cannot fix the config */
    if (!rc) rc = ctl_load_tasks(c);
    if (!rc) rc = ctl_restore(c);
    prl_bus_socket_options so;
    prl_bus_socket_options_default(&so);
    so.bind = 1, so.name = "controller", so.send_timeout_ms = 2000,
    so.registry = prl_msg_registry();
    prl_bus_secret secret; /* who may join: docs/protocol.md */
    char key[1100];
    snprintf(key, sizeof key, "%s/bus.key", o->run_dir);
    if (!rc) rc = prl_bus_key_ensure(key, &secret);
    so.secret = secret.hex;
    if (!rc) rc = prl_bus_socket_open(&c->sock, PRL_BUS_ROUTER, ep, &so);
    if (!rc) rc = ctl_remote_open(c); /* bus.bind: workers on other hosts */
    if (!rc)
        ctl_log("run '%s' at %s: %d train prompts, B=%d G=%d, %s mode (lag %d), step %lld of %d",
                o->job->name, ep, c->n_tasks, c->B, c->G, o->job->mode, c->lag,
                (long long)c->next_step, o->job->steps);
    c->done = c->version >= o->job->steps;
    if (!rc) rc = ctl_eval_restore(c); /* a resumed run does not evaluate a version again */
    if (!rc) rc = ctl_eval_due(c, c->version);
    double last_expire = prl_now();
    while (!rc && (!c->done || ctl_eval_open(c)) && !(o->stop && *o->stop)) {
        prl_bus_msg m;
        prl_bus_peer from;
        int got = 0;
        rc = prl_bus_recv(c->sock, 100, &m, &from, &got);
        if (!rc && got) {
            dispatch(c, &m, &from);
            prl_bus_msg_free(&m);
        }
        if (!rc && prl_now() - last_expire > 0.5) {
            expire(c);
            ctl_remote_tick(c);
            last_expire = prl_now();
        }
        if (!rc) rc = c->fatal;
        if (!rc) rc = ctl_schedule(c);
    }
    if (!rc && c->done) {
        ctl_link_final(c);
        prl_store_run_set_status(c->db, c->run, "done");
        ctl_event(c, "done", "{\"version\": %lld}", (long long)c->version);
        ctl_log("run '%s' done: version %lld in %.1f s", o->job->name, (long long)c->version,
                prl_now() - c->t_start);
        finish(c, "the run is done");
    } else if (!rc) { /* a signal: the workers are not told to stop, so that a controller
                       ** stopped alone (kill -TERM) finds them again when it is restarted;
                       ** a launcher that stops the run signals every role itself */
        prl_store_run_set_status(c->db, c->run, "stopped");
    } else if (c->failed) { /* a work item kept failing: a restart would fail the same way */
        char why[600];
        snprintf(why, sizeof why, "%s", prl_error_message());
        record_failed(c->db, c->run, why);
        finish(c, "the run failed");
        rc = prl_error_set(PRL_ERR_IO, "run '%s' failed: %s", o->job->name, why);
        if (o->failed) *o->failed = 1;
    }
    cleanup(c);
    return rc;
}
