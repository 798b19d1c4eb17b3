/*
** evals.c — in-run evaluation (internal.h; docs/pipeline.md "In-run evaluation"): with
** task.eval_every = N, versions 0, N, 2N, … and the last one are evaluated on the eval split
** (task.eval_problems held-out problems) while the run goes on.
**
** An evaluation is a step_run of its own (step EVAL_STEP + version, so its results and
** scores travel the same leases as a training step's): one group per eval problem of 1 + k
** samples (k = task.eval_samples when above 1) — sample 0 greedy, the k others sampled at
** the rollout temperature — scored by the reward workers like any sample. Its samples are
** tallied, never stored or trained on: when the last is scored one `eval` event goes to
** run.db with the accuracy (greedy sample scored 1), the mean greedy score and pass@k (a
** sampled one scored 1) over all problems and per verifier (or domain), and the run waits
** for an evaluation in flight before it ends.
*/
#include "roles/controller/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EVAL_STEP ((int64_t)1 << 40) /* above any training step */

static int is_due(const ctl *c, int64_t v)
{
    int every = c->job->eval_every;
    return every > 0 && c->n_eval > 0 && v > c->eval_last && (v % every == 0 || v >= c->job->steps);
}

prl_status ctl_eval_restore(ctl *c)
{
    prl_store_event *ev = NULL;
    size_t n = 0;
    c->eval_last = -1;
    prl_status rc = prl_store_events_list(c->db, c->run, &ev, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        if (strcmp(ev[i].kind, "eval")) continue;
        json_error_t je;
        json_t *d = json_loads(ev[i].detail, 0, &je);
        int64_t v = json_integer_value(json_object_get(d, "version"));
        json_decref(d);
        /* a version above the current one was taken back (a fallback): it is made again and
        ** evaluated again */
        if (v > c->eval_last && v <= c->version) c->eval_last = v;
    }
    prl_store_events_free(ev, n);
    return rc;
}

int ctl_eval_open(const ctl *c)
{
    for (int i = 0; i < MAX_INFLIGHT; i++)
        if (c->st[i].active && c->st[i].eval) return 1;
    return 0;
}

prl_status ctl_eval_due(ctl *c, int64_t v)
{
    if (!is_due(c, v)) return PRL_OK;
    step_run *r = NULL;
    for (int i = 0; i < MAX_INFLIGHT && !r; i++)
        if (!c->st[i].active) r = &c->st[i];
    if (!r) { /* every slot is busy: this version is skipped, the next due one is not */
        ctl_log("evaluation of version %lld skipped: %d steps in flight", (long long)v,
                MAX_INFLIGHT);
        return PRL_OK;
    }
    int k = c->job->eval_samples;
    *r = (step_run){.step = EVAL_STEP + v,
                    .active = 1,
                    .eval = 1,
                    .gsize = 1 + (k > 1 ? k : 0),
                    .eval_version = v,
                    .t_open = prl_now()};
    snprintf(r->eval_path, sizeof r->eval_path, "%s", c->version_path);
    prl_status rc = PRL_OK;
    for (int i = 0; i < c->n_eval && !rc; i++) rc = ctl_group_add(c, r, c->n_tasks + i, 0);
    if (rc) {
        ctl_step_free(c, r);
        return rc;
    }
    c->eval_last = v;
    ctl_log("evaluating version %lld: %d eval problems, %d samples each", (long long)v, c->n_eval,
            r->gsize);
    return PRL_OK;
}

/* ---------------------------------------------------------------- results ---------- */

/* What a problem is counted under: its verifier (prompt files), else its domain. */
static const char *problem_kind(const ctl *c, const group *g)
{
    const json_t *t = c->task[g->prompt];
    const char *v = json_string_value(json_object_get(t, "verifier"));
    return v ? v : json_string_value(json_object_get(t, "domain"));
}

typedef struct tally {
    int n, correct, passed;
    double score;
} tally;

static void tally_add(tally *t, const group *g, int G)
{
    int pass = 0;
    for (int j = 1; j < G; j++) pass |= ctl_sample_correct(&g->s[j]);
    t->n++, t->correct += ctl_sample_correct(&g->s[0]), t->passed += pass;
    t->score += g->s[0].reward;
}

static json_t *tally_json(const tally *t, int k)
{
    json_t *o =
        json_pack("{s:i, s:f, s:f}", "n", t->n, "accuracy", t->n ? (double)t->correct / t->n : 0.0,
                  "mean_score", t->n ? t->score / t->n : 0.0);
    if (o && k > 1)
        json_object_set_new(o, "pass_k", json_real(t->n ? (double)t->passed / t->n : 0));
    return o;
}

/* The event's detail: {version, n, accuracy, mean_score, k, [pass_k], seconds, by: {kind:
** {n, accuracy, mean_score, [pass_k]}}}. */
static json_t *report(const ctl *c, const step_run *r)
{
    enum { MAX_KINDS = 16 }; /* verifier names and domains: a handful */
    int k = r->gsize - 1, G = r->gsize, nk = 0;
    const char *kinds[MAX_KINDS];
    tally all = {0}, per[MAX_KINDS] = {{0}};
    for (int i = 0; i < r->n; i++) {
        const char *kind = problem_kind(c, &r->g[i]);
        int at = 0;
        while (at < nk && strcmp(kinds[at], kind)) at++;
        if (at == nk && nk < MAX_KINDS) kinds[nk++] = kind;
        tally_add(&all, &r->g[i], G);
        if (at < nk) tally_add(&per[at], &r->g[i], G);
    }
    json_t *o = tally_json(&all, k), *by = json_object();
    for (int i = 0; by && i < nk; i++) json_object_set_new(by, kinds[i], tally_json(&per[i], k));
    if (!o || !by) return json_decref(o), json_decref(by), NULL;
    json_object_set_new(o, "version", json_integer(r->eval_version));
    json_object_set_new(o, "k", json_integer(k > 1 ? k : 1));
    json_object_set_new(o, "seconds", json_real(prl_now() - r->t_open));
    json_object_set_new(o, "by", by);
    return o;
}

static void finish(ctl *c, step_run *r)
{
    json_t *o = report(c, r);
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
    if (!text || prl_store_event_add(c->db, c->run, "eval", text))
        ctl_log("could not record the evaluation of version %lld: %s", (long long)r->eval_version,
                prl_error_message());
    double acc = json_real_value(json_object_get(o, "accuracy"));
    json_t *pk = json_object_get(o, "pass_k");
    char extra[64] = "";
    if (pk)
        snprintf(extra, sizeof extra, ", pass@%d %.1f%%", r->gsize - 1, 100 * json_real_value(pk));
    printf("eval v%lld: accuracy %.1f%% on %d held-out problems%s (%.1f s)\n",
           (long long)r->eval_version, 100 * acc, r->n, extra, prl_now() - r->t_open);
    fflush(stdout);
    free(text);
    json_decref(o);
    ctl_step_free(c, r);
}

void ctl_eval_scored(ctl *c, step_run *r, group *g)
{
    (void)g;
    for (int i = 0; i < r->n; i++)
        if (r->g[i].scored < r->gsize) return;
    finish(c, r);
}

void ctl_eval_failed(ctl *c, step_run *r, group *g, lease_kind kind, int j, const char *why)
{
    if (kind == LEASE_SCORE && ++g->s[j].failures >= MAX_ATTEMPTS) {
        g->s[j].reward = 0, g->s[j].state = 2, g->scored++; /* an unscorable answer is wrong */
        ctl_eval_scored(c, r, g);
    } else if (kind == LEASE_ROLLOUT && ++g->failures >= MAX_ATTEMPTS) {
        ctl_log("evaluation of version %lld given up: %s", (long long)r->eval_version, why);
        ctl_event(c, "eval_failed", "{\"version\": %lld}", (long long)r->eval_version);
        for (int i = c->nl - 1; i >= 0; i--) /* its other leases end with it */
            if (c->l[i].step == r->step) ctl_lease_end(c, c->l[i].id);
        ctl_step_free(c, r);
    }
}
