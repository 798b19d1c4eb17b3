/*
** leases.c — the controller's workers and leases (internal.h): who is connected, which
** work item each holds, handing an item out again when its worker dies, goes silent or
** fails it, and the messages every worker gets (welcome, error, stop).
*/
#include "roles/controller/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

worker *ctl_worker_by_name(ctl *c, const char *name)
{
    for (int i = 0; i < c->nw; i++)
        if (!strcmp(c->w[i].name, name)) return &c->w[i];
    return NULL;
}

worker *ctl_worker_by_peer(ctl *c, const prl_bus_peer *p)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].peer.len == p->len && !memcmp(c->w[i].peer.id, p->id, p->len)) return &c->w[i];
    return NULL;
}

lease *ctl_lease_find(ctl *c, uint64_t id)
{
    for (int i = 0; i < c->nl; i++)
        if (c->l[i].id == id) return &c->l[i];
    return NULL;
}

prl_status ctl_lease_new(ctl *c, lease_kind kind, int64_t step, int group, int sample, worker *w,
                         lease **out)
{
    if (c->nl == c->capl) {
        int cap = c->capl ? 2 * c->capl : 64;
        lease *p = realloc(c->l, (size_t)cap * sizeof *p);
        if (!p) return prl_error_set(PRL_ERR_NOMEM, "lease table");
        c->l = p, c->capl = cap;
    }
    lease *l = &c->l[c->nl++];
    *l = (lease){.id = ++c->next_lease,
                 .kind = kind,
                 .step = step,
                 .group = group,
                 .sample = sample,
                 .worker = (int)(w - c->w),
                 .started = prl_now()};
    w->lease = l->id;
    w->held++;
    *out = l;
    return PRL_OK;
}

/* End a lease: its worker is idle again (if it still holds it). */
void ctl_lease_end(ctl *c, uint64_t id)
{
    for (int i = 0; i < c->nl; i++) {
        if (c->l[i].id != id) continue;
        worker *w = &c->w[c->l[i].worker];
        if (w->lease == id) w->lease = 0;
        if (w->held > 0) w->held--;
        c->l[i] = c->l[--c->nl];
        return;
    }
}

/* Give a lease's work back to the queue (its worker died, restarted or went silent). */
void ctl_lease_requeue(ctl *c, lease *l, const char *why)
{
    step_run *r = ctl_step_find(c, l->step);
    if (r && l->kind == LEASE_ROLLOUT && l->group < r->n && r->g[l->group].lease == l->id)
        r->g[l->group].lease = 0;
    if (r && l->kind == LEASE_SCORE && l->group < r->n &&
        r->g[l->group].s[l->sample].score_lease == l->id)
        r->g[l->group].s[l->sample].score_lease = 0;
    if (r && l->kind == LEASE_TRAIN && r->train_lease == l->id) r->train_lease = 0;
    if (r && l->kind == LEASE_TEACH && r->teach_lease[l->group] == l->id)
        r->teach_lease[l->group] = 0;
    static const char *kinds[] = {"", "rollout", "score", "train", "teach"};
    uint64_t held;
    if (prl_bus_log_limit_take(&c->requeue_log, prl_now(), &held)) {
        char line[200];
        if (held) prl_bus_log_held_line(held, CTL_REQUEUED, line, sizeof line), ctl_log("%s", line);
        ctl_log("lease %llu (%s, step %lld) handed out again: %s", (unsigned long long)l->id,
                kinds[l->kind], (long long)l->step, why);
    }
    ctl_event(c, "requeue",
              "{\"lease\": %llu, \"kind\": \"%s\", \"step\": %lld, \"worker\": \"%s\", "
              "\"why\": \"%s\"}",
              (unsigned long long)l->id, kinds[l->kind], (long long)l->step, c->w[l->worker].name,
              why);
    ctl_lease_end(c, l->id);
}

void ctl_requeue_worker(ctl *c, worker *w, const char *why)
{
    for (int i = c->nl - 1; i >= 0; i--)
        if (&c->w[c->l[i].worker] == w) ctl_lease_requeue(c, &c->l[i], why);
}

/* A work item failed (its worker reported an error doing it): hand it out again, up to
** MAX_ATTEMPTS. (A result the controller rejects is handed out again without counting: a
** worker must not be able to fail the run by sending garbage.) Then a score becomes reward 0 with the reason in its detail (a
** model output that cannot be scored must not stop the run); a rollout or training that keeps
** failing fails the run, naming the item and the reason. */
void ctl_lease_failed(ctl *c, lease *l, const char *why)
{
    step_run *r = ctl_step_find(c, l->step);
    lease_kind kind = l->kind;
    int gi = l->group, j = l->sample;
    ctl_lease_requeue(c, l, why);
    if (!r || (kind != LEASE_TEACH && gi >= r->n)) return;
    group *g = kind == LEASE_TEACH ? NULL : &r->g[gi];
    if (r->eval) {
        ctl_eval_failed(c, r, g, kind, j, why);
        return;
    }
    if (kind == LEASE_SCORE && ++g->s[j].failures >= MAX_ATTEMPTS) {
        ctl_event(c, "score_failed", "{\"step\": %lld, \"prompt\": \"%s\", \"sample\": %d}",
                  (long long)r->step, c->task_id[g->prompt], j);
        c->fatal = ctl_store_failed_score(c, r, g, j, why);
    } else if (kind == LEASE_ROLLOUT && ++g->failures >= MAX_ATTEMPTS) {
        c->failed = 1;
        c->fatal =
            prl_error_set(PRL_ERR_IO, "the rollout of prompt %s (step %lld) failed %d times: %s",
                          c->task_id[g->prompt], (long long)r->step, g->failures, why);
    } else if (kind == LEASE_TEACH && ++r->teach_failures[gi] >= MAX_ATTEMPTS) {
        c->failed = 1;
        c->fatal =
            prl_error_set(PRL_ERR_IO, "teacher %s of step %lld failed %d times: %s",
                          prl_opd_teacher_key(gi), (long long)r->step, r->teach_failures[gi], why);
    } else if (kind == LEASE_TRAIN && ++r->train_failures >= MAX_ATTEMPTS) {
        c->failed = 1;
        c->fatal = prl_error_set(PRL_ERR_IO, "training step %lld failed %d times: %s",
                                 (long long)r->step, r->train_failures, why);
    }
}

/* The rejection count of l's item (NULL: the item is gone). */
static int *rejections(ctl *c, step_run *r, lease_kind kind, int gi, int j)
{
    if (kind == LEASE_TRAIN) return &r->train_rejected;
    if (kind == LEASE_TEACH) return gi < PRL_OPD_TEACHERS ? &r->teach_rejected[gi] : NULL;
    if (gi >= r->n || (kind == LEASE_SCORE && j >= ctl_gsize(c, r))) return NULL;
    return kind == LEASE_SCORE ? &r->g[gi].s[j].rejected : &r->g[gi].rejected;
}

/* Not counted like a failure (MAX_ATTEMPTS), so one garbage message cannot fail the run; but
** an item whose every answer is unusable (a policy whose log-probs are NaN) would otherwise
** be handed out forever, so after controller.max_rejected rejections the run fails. */
void ctl_lease_rejected(ctl *c, lease *l, const char *why)
{
    step_run *r = ctl_step_find(c, l->step);
    lease_kind kind = l->kind;
    int gi = l->group, j = l->sample;
    ctl_lease_requeue(c, l, "its result was rejected");
    int *n = r ? rejections(c, r, kind, gi, j) : NULL;
    if (!n) return;
    if (r->eval) {
        ctl_eval_failed(c, r, &r->g[gi], kind, j, why);
        return;
    }
    if (++*n < c->job->max_rejected) return;
    char item[160];
    if (kind == LEASE_TRAIN) snprintf(item, sizeof item, "training step %lld", (long long)r->step);
    else if (kind == LEASE_TEACH)
        snprintf(item, sizeof item, "teacher %s of step %lld", prl_opd_teacher_key(gi),
                 (long long)r->step);
    else if (kind == LEASE_SCORE)
        snprintf(item, sizeof item, "the score of prompt %s sample %d (step %lld)",
                 c->task_id[r->g[gi].prompt], j, (long long)r->step);
    else
        snprintf(item, sizeof item, "the rollout of prompt %s (step %lld)",
                 c->task_id[r->g[gi].prompt], (long long)r->step);
    c->failed = 1;
    c->fatal = prl_error_set(PRL_ERR_IO,
                             "%s: %d results rejected (controller.max_rejected = %d), the last: %s",
                             item, *n, c->job->max_rejected, why);
}

/* ---------------------------------------------------------------- sending ---------- */

prl_status ctl_send_msg(ctl *c, worker *w, prl_bus_msg *m)
{
    prl_status rc = prl_bus_send(c->sock, &w->peer, m);
    prl_bus_msg_free(m);
    if (rc) { /* gone: forgotten until it says hello again */
        ctl_log("send to %s failed: %s", w->name, prl_error_message());
        w->peer.len = 0;
    }
    return rc;
}

void ctl_log_rejected(ctl *c, uint64_t ref, const char *why)
{
    uint64_t held;
    if (!prl_bus_log_limit_take(&c->reject_log, prl_now(), &held)) return;
    char line[200];
    if (held) {
        prl_bus_log_held_line(held, CTL_REJECTED, line, sizeof line);
        ctl_log("%s", line);
    }
    ctl_log("rejected message %llu: %s", (unsigned long long)ref, why);
}

void ctl_send_error(ctl *c, const prl_bus_peer *to, uint64_t ref, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    for (char *p = why; *p; p++)
        if ((unsigned char)*p < 32) *p = ' ';
    ctl_log_rejected(c, ref, why);
    prl_bus_msg m;
    prl_msg_error e = {.reason = why, .ref = ref};
    if (prl_msg_error_encode(&e, c->job->name, ++c->next_id, &m) || prl_bus_send(c->sock, to, &m))
        ctl_log("error reply failed: %s", prl_error_message());
    prl_bus_msg_free(&m);
}

prl_status ctl_send_welcome(ctl *c, worker *w)
{
    prl_bus_msg m;
    prl_msg_welcome x = {.run_dir = c->o->run_dir, .seed = c->job->seed, .config = c->config_json};
    prl_status rc = prl_msg_welcome_encode(&x, c->job->name, ++c->next_id, &m);
    return rc ? rc : ctl_send_msg(c, w, &m);
}

void ctl_send_stop(ctl *c, worker *w, const char *why)
{
    prl_bus_msg m;
    prl_msg_stop x = {.reason = why};
    if (!prl_msg_stop_encode(&x, c->job->name, ++c->next_id, &m)) ctl_send_msg(c, w, &m);
}

/* ---------------------------------------------------------------- leasing ---------- */

worker *ctl_idle_worker(ctl *c, const char *role)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].held < (c->w[i].slots > 1 ? c->w[i].slots : 1) && c->w[i].peer.len &&
            !strcmp(c->w[i].role, role))
            return &c->w[i];
    return NULL;
}
