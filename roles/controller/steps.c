/*
** steps.c — a step of the controller (internal.h): its groups opened (samples already in
** run.db taken as they are), judged once scored (dynamic sampling), and the work handed out
** oldest step first: rollouts, scores, and the `train` item of a finished step.
*/
#include "roles/controller/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ctl_slot_free(slot *s)
{
    free(s->tokens), free(s->logprobs), free(s->mask), free(s->routes), free(s->turns);
    free(s->detail), free(s->teacher_lp), free(s->topk_ids), free(s->topk_lp);
    memset(s, 0, sizeof *s);
}

void ctl_step_free(ctl *c, step_run *r)
{
    for (int i = 0; i < r->n; i++) {
        for (int j = 0; j < ctl_gsize(c, r); j++) ctl_slot_free(&r->g[i].s[j]);
        free(r->g[i].s);
    }
    free(r->g);
    memset(r, 0, sizeof *r);
}

step_run *ctl_step_find(ctl *c, int64_t step)
{
    for (int i = 0; i < MAX_INFLIGHT; i++)
        if (c->st[i].active && c->st[i].step == step) return &c->st[i];
    return NULL;
}

/* ---------------------------------------------------------------- steps ------------ */

prl_status ctl_group_add(ctl *c, step_run *r, int prompt, int64_t epoch)
{
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : c->B;
        group *g = realloc(r->g, (size_t)cap * sizeof *g);
        if (!g) return prl_error_set(PRL_ERR_NOMEM, "step groups");
        r->g = g, r->cap = cap;
    }
    group *g = &r->g[r->n];
    *g = (group){.prompt = prompt,
                 .epoch = epoch,
                 .s = calloc((size_t)ctl_gsize(c, r), sizeof(slot)),
                 .teacher = -1};
    if (c->job->opd_enabled && !r->eval) /* the teacher of the prompt's domain */
        g->teacher = c->task_teacher[prompt];
    if (!g->s) return prl_error_set(PRL_ERR_NOMEM, "group of %d samples", ctl_gsize(c, r));
    r->n++;
    return PRL_OK;
}

/* Fill a slot from a stored sample (resume). */
static prl_status slot_from_store(ctl *c, slot *s, const prl_store_sample *x)
{
    int nr = x->n_tokens - x->prompt_len;
    s->tokens = malloc((size_t)x->n_tokens * sizeof *s->tokens);
    s->logprobs = malloc((size_t)(nr ? nr : 1) * sizeof *s->logprobs);
    s->mask = malloc((size_t)(nr ? nr : 1));
    s->detail = strdup(x->reward_detail ? x->reward_detail : "{}");
    if (!s->tokens || !s->logprobs || !s->mask || !s->detail)
        return prl_error_set(PRL_ERR_NOMEM, "sample");
    memcpy(s->tokens, x->tokens, (size_t)x->n_tokens * sizeof *s->tokens);
    memcpy(s->logprobs, x->logprobs, (size_t)nr * sizeof *s->logprobs);
    for (int i = 0; i < nr; i++) s->mask[i] = x->loss_mask ? x->loss_mask[i] : 1;
    s->n = x->n_tokens, s->prompt_len = x->prompt_len, s->version = x->version;
    s->reward = x->reward, s->flags = x->flags, s->stop = x->stop, s->state = 2;
    if (x->routes && x->route_tokens > 0) { /* the record the trainer replays (docs/replay.md) */
        size_t bytes = (size_t)x->route_tokens * x->route_moe * x->route_k * x->route_width;
        s->routes = malloc(bytes);
        if (!s->routes) return prl_error_set(PRL_ERR_NOMEM, "sample routes");
        memcpy(s->routes, x->routes, bytes);
        s->routes_bytes = bytes;
        s->route_shape =
            (prl_route_shape){x->route_tokens, x->route_moe, x->route_k, x->route_width};
    }
    s->gen_s = x->gen_seconds, s->score_s = x->reward_seconds;
    snprintf(s->worker, sizeof s->worker, "%s", x->worker ? x->worker : "");
    (void)c;
    return PRL_OK;
}

/* Open the next step: its B base candidates; samples already in run.db (a resumed run) are
** taken as they are. */
static prl_status step_open(ctl *c)
{
    step_run *r = NULL;
    for (int i = 0; i < MAX_INFLIGHT && !r; i++)
        if (!c->st[i].active) r = &c->st[i];
    if (!r) return PRL_OK;
    *r = (step_run){.step = c->next_step, .active = 1, .t_open = prl_now()};
    prl_status rc = PRL_OK;
    int R = ctl_revisit_count(c);
    for (int i = 0; i < c->B && !rc; i++) {
        int64_t e = c->cursor / c->n_tasks; /* a revisit's outcome counts for the current epoch */
        int p = i >= c->B - R ? ctl_revisit_draw(c, r, i - (c->B - R)) : -1;
        int revisit = p >= 0;
        if (!revisit) p = ctl_next_candidate(c, r, &e);
        if (p < 0) { /* the retire rules emptied the set: a restart would find it empty too */
            c->failed = 1;
            return prl_error_set(PRL_ERR_RANGE,
                                 "step %lld: every train prompt is retired (see the "
                                 "'retire' events in run.db; lower controller.retire_*_epochs or "
                                 "raise task.train_problems)",
                                 (long long)r->step);
        }
        rc = ctl_group_add(c, r, p, e);
        if (!rc) r->g[r->n - 1].revisit = revisit;
    }
    c->next_step++;
    prl_store_sample *xs = NULL;
    size_t nx = 0;
    if (!rc) rc = prl_store_samples_for_step(c->db, c->run, r->step, -1, &xs, &nx);
    /* Groups judged here may add candidates (dynamic sampling) whose samples are stored too:
    ** take stored samples group by group until no new group appears. */
    for (int from = 0; !rc && from < r->n;) {
        int upto = r->n;
        for (size_t k = 0; k < nx && !rc; k++) {
            for (int gi = from; gi < upto; gi++) {
                group *g = &r->g[gi];
                if (strcmp(c->task_id[g->prompt], xs[k].prompt_id) || xs[k].sample_index >= c->G)
                    continue;
                slot *s = &g->s[xs[k].sample_index];
                if (s->state) continue;
                rc = slot_from_store(c, s, &xs[k]);
                g->generated++, g->scored++;
            }
        }
        for (int gi = from; gi < upto && !rc; gi++)
            if (r->g[gi].scored == c->G) ctl_judge_group(c, r, &r->g[gi]);
        from = upto;
    }
    prl_store_samples_free(xs, nx);
    if (nx) ctl_log("step %lld: %zu samples taken from run.db", (long long)r->step, nx);
    return rc;
}

static int all_equal(const group *g, int G)
{
    for (int j = 1; j < G; j++)
        if (g->s[j].reward != g->s[0].reward) return 0;
    return 1;
}

/* Every sample of a group is scored: record its outcome (solved, unsolved or mixed), then
** keep it or (dynamic sampling, equal rewards) drop it and add the next candidate. */
void ctl_judge_group(ctl *c, step_run *r, group *g)
{
    int solved = 1, unsolved = 1;
    for (int j = 0; j < c->G; j++)
        solved &= ctl_sample_correct(&g->s[j]), unsolved &= g->s[j].reward <= 0.0;
    prl_store_outcome o = solved     ? PRL_STORE_SOLVED
                          : unsolved ? PRL_STORE_UNSOLVED
                                     : PRL_STORE_MIXED;
    if (prl_store_prompt_record(c->db, c->run, c->task_id[g->prompt], g->epoch, o))
        ctl_log("outcome record of %s: %s", c->task_id[g->prompt], prl_error_message());
    if (c->job->dynamic_sampling && c->G > 1 && all_equal(g, c->G)) {
        g->verdict = -1;
        r->dropped++;
        for (int j = 0; j < c->G; j++)
            prl_store_sample_set_status(c->db, c->run, r->step, c->task_id[g->prompt], j,
                                        PRL_STORE_SAMPLE_DROPPED);
        if (r->n < CANDIDATE_FACTOR * c->B) {
            int64_t e;
            int p = ctl_next_candidate(c, r, &e);
            if (p >= 0 && ctl_group_add(c, r, p, e)) ctl_log("%s", prl_error_message());
        }
        return;
    }
    g->verdict = 1;
    r->accepted++;
}

int ctl_step_rolled(const ctl *c, const step_run *r)
{
    for (int i = 0; i < r->n; i++)
        if (r->g[i].verdict == 0) return 0;
    (void)c;
    return 1;
}

static prl_status lease_rollout(ctl *c, step_run *r, int gi, worker *w)
{
    lease *l;
    prl_status rc = ctl_lease_new(c, LEASE_ROLLOUT, r->step, gi, 0, w, &l);
    if (rc) return rc;
    group *g = &r->g[gi];
    g->lease = l->id;
    if (!r->t_leased) r->t_leased = l->started;
    prl_msg_work x = {.lease = l->id,
                      .step = (uint64_t)r->step,
                      .prompt = (uint64_t)g->prompt,
                      .sample = 0,
                      .count = (uint64_t)ctl_gsize(c, r),
                      .policy_version = (uint64_t)(r->eval ? r->eval_version : c->version),
                      .path = r->eval ? r->eval_path : c->version_path,
                      .task = c->task_text[g->prompt],
                      .eval = r->eval};
    prl_bus_msg m;
    if ((rc = prl_msg_work_encode(&x, c->job->name, ++c->next_id, &m))) return rc;
    if (ctl_send_msg(c, w, &m)) ctl_lease_requeue(c, l, "send failed");
    return PRL_OK;
}

static prl_status lease_score(ctl *c, step_run *r, int gi, int j, worker *w)
{
    lease *l;
    prl_status rc = ctl_lease_new(c, LEASE_SCORE, r->step, gi, j, w, &l);
    if (rc) return rc;
    group *g = &r->g[gi];
    slot *s = &g->s[j];
    s->score_lease = l->id;
    prl_msg_score x = {.lease = l->id,
                       .step = (uint64_t)r->step,
                       .prompt = (uint64_t)g->prompt,
                       .sample = (uint64_t)j,
                       .truncated = s->truncated,
                       .task = c->task_text[g->prompt],
                       .turns = s->turns,
                       .tokens = prl_job_has_reward_program(c->job) ? s->tokens : NULL,
                       .n_tokens = (size_t)s->n,
                       .prompt_len = s->prompt_len};
    prl_bus_msg m;
    if ((rc = prl_msg_score_encode(&x, c->job->name, ++c->next_id, &m))) return rc;
    if (ctl_send_msg(c, w, &m)) ctl_lease_requeue(c, l, "send failed");
    return PRL_OK;
}

/* A sample is trained on when its group is kept and its version is within the lag bound. */
int ctl_sample_fresh(const ctl *c, const step_run *r, const slot *s)
{
    return s->version >= r->step - c->lag;
}

int ctl_sample_correct(const slot *s)
{
    if (!s->detail || !strstr(s->detail, "\"rule_score\"")) return s->reward >= 1.0;
    json_error_t je;
    json_t *d = json_loads(s->detail, 0, &je);
    int ok = json_number_value(json_object_get(d, "rule_score")) >= 1.0;
    json_decref(d);
    return ok;
}

static int trainable(const ctl *c, const step_run *r)
{
    for (int i = 0; i < r->n; i++)
        for (int j = 0; r->g[i].verdict == 1 && j < c->G; j++)
            if (ctl_sample_fresh(c, r, &r->g[i].s[j])) return 1;
    return 0;
}

/* A slot's route record passes the route-record check and has the reference shape `ref`
** (rows aside). */
static int slot_routes_fit(const slot *s, const prl_route_shape *ref)
{
    const prl_route_shape *sh = &s->route_shape;
    return s->routes && prl_route_shape_check(sh, s->routes_bytes, (size_t)s->n) == PRL_OK &&
           sh->moe == ref->moe && sh->k == ref->k && sh->width == ref->width;
}

/* The routes frames of `train` (docs/replay.md): every kept sample's route record, in the
** shape of the first record; a sample without one (or of another shape) gets 0 rows and
** routes natively in the trainer. No frames when no sample has a record. */
static prl_status train_routes(ctl *c, step_run *r, prl_grpo_batch *b)
{
    const prl_route_shape *ref = NULL;
    size_t rows = 0;
    for (int pass = 0; pass < 2; pass++) {
        int k = 0;
        size_t at = 0;
        for (int i = 0; i < r->n; i++)
            for (int j = 0; r->g[i].verdict == 1 && j < c->G; j++) {
                const slot *s = &r->g[i].s[j];
                if (!ctl_sample_fresh(c, r, s)) continue;
                if (!ref && s->routes && s->route_shape.rows > 0) ref = &s->route_shape;
                int fit = ref && slot_routes_fit(s, ref);
                if (pass == 0 && fit) rows += (size_t)s->route_shape.rows;
                if (pass == 1 && fit) {
                    b->route_rows[k] = s->route_shape.rows;
                    memcpy(b->routes + at, s->routes, s->routes_bytes);
                    at += s->routes_bytes;
                }
                k++;
            }
        if (pass == 0 && !rows) return PRL_OK;
        if (pass == 0) {
            prl_status rc = prl_grpo_batch_routes_init(b, ref->moe, ref->k, ref->width, rows);
            if (rc) return rc;
        }
    }
    return PRL_OK;
}

/* Pack a step's kept, fresh samples into a `train` message (docs/pipeline.md). */
static prl_status build_train(ctl *c, step_run *r, prl_bus_msg *m, uint64_t lease_id)
{
    int cnt = 0;
    size_t ntok = 0, nresp = 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; r->g[i].verdict == 1 && j < c->G; j++) {
            const slot *s = &r->g[i].s[j];
            if (!ctl_sample_fresh(c, r, s)) continue;
            cnt++, ntok += (size_t)s->n, nresp += (size_t)(s->n - s->prompt_len);
        }
    prl_grpo_batch b;
    prl_status rc = prl_grpo_batch_init(&b, cnt, ntok, nresp);
    size_t at = 0, rat = 0;
    int k = 0;
    for (int i = 0; i < r->n && !rc; i++)
        for (int j = 0; r->g[i].verdict == 1 && j < c->G; j++) {
            const slot *s = &r->g[i].s[j];
            if (!ctl_sample_fresh(c, r, s)) continue;
            int nr = s->n - s->prompt_len;
            b.offsets[k] = (int32_t)at, b.prompt_lens[k] = s->prompt_len, b.groups[k] = i;
            b.rewards[k] = (float)s->reward;
            memcpy(b.tokens + at, s->tokens, (size_t)s->n * sizeof *b.tokens);
            memcpy(b.logprobs + rat, s->logprobs, (size_t)nr * sizeof *b.logprobs);
            memcpy(b.mask + rat, s->mask, (size_t)nr);
            at += (size_t)s->n, rat += (size_t)nr, k++;
        }
    if (!rc) b.offsets[cnt] = (int32_t)at;
    if (!rc) rc = train_routes(c, r, &b);
    prl_msg_train x = {.lease = lease_id,
                       .step = (uint64_t)r->step,
                       .policy_version = (uint64_t)c->version,
                       .path = c->version_path,
                       .batch = b,
                       .has_teachers = c->job->opd_enabled};
    if (!rc && x.has_teachers) rc = ctl_train_teachers(c, r, &b, &x.teachers);
    if (!rc) rc = prl_msg_train_encode(&x, c->job->name, ++c->next_id, m);
    prl_opd_batch_free(&x.teachers);
    prl_grpo_batch_free(&b);
    return rc;
}

static prl_status lease_train(ctl *c, step_run *r, worker *w)
{
    lease *l;
    prl_status rc = ctl_lease_new(c, LEASE_TRAIN, r->step, 0, 0, w, &l);
    if (rc) return rc;
    r->train_lease = l->id;
    if (!r->t_train) r->t_train = prl_now();
    prl_bus_msg m;
    if ((rc = build_train(c, r, &m, l->id))) return rc;
    if (ctl_send_msg(c, w, &m)) ctl_lease_requeue(c, l, "send failed");
    return PRL_OK;
}

/* Lease r's rollouts and scores to idle workers. */
static prl_status lease_samples(ctl *c, step_run *r)
{
    prl_status rc = PRL_OK;
    int G = ctl_gsize(c, r);
    for (int gi = 0; gi < r->n && !rc; gi++) {
        group *g = &r->g[gi];
        if (!g->lease && g->generated < G) {
            worker *w = ctl_idle_worker(c, c->rollout_role);
            if (!w) break;
            rc = lease_rollout(c, r, gi, w);
        }
    }
    for (int gi = 0; gi < r->n && !rc; gi++)
        for (int j = 0; j < G && !rc; j++) {
            slot *s = &r->g[gi].s[j];
            if (s->state != 1 || s->score_lease) continue;
            worker *w = ctl_idle_worker(c, "reward");
            if (!w) break;
            rc = lease_score(c, r, gi, j, w);
        }
    return rc;
}

/* Hand out everything that can start now, oldest step first. */
prl_status ctl_schedule(ctl *c)
{
    prl_status rc = PRL_OK;
    /* open steps: sync (lag 0) needs version == step; async lets `lag` steps run ahead */
    while (!rc && c->next_step < c->job->steps && c->next_step <= c->version + c->lag) {
        int free_slot = 0;
        for (int i = 0; i < MAX_INFLIGHT; i++) free_slot |= !c->st[i].active;
        if (!free_slot) break;
        rc = step_open(c);
    }
    for (int i = 0; i < MAX_INFLIGHT && !rc; i++) /* an evaluation goes first: it is short */
        if (c->st[i].active && c->st[i].eval) rc = lease_samples(c, &c->st[i]);
    for (int64_t t = c->next_step - MAX_INFLIGHT; !rc && t < c->next_step; t++) {
        step_run *r = ctl_step_find(c, t);
        if (!r) continue;
        rc = lease_samples(c, r);
        if (!rc && !r->train_lease && ctl_step_rolled(c, r) && !ctl_step_taught(c, r, &rc))
            continue;
        if (!rc && !r->train_lease && r->step == c->version && ctl_step_rolled(c, r)) {
            if (!trainable(c, r)) { /* every group dropped or stale: the policy stays */
                ctl_log("step %lld has no trainable sample: version %lld keeps the weights",
                        (long long)r->step, (long long)c->version + 1);
                char vpath[1024];
                snprintf(vpath, sizeof vpath, "%s", c->version_path);
                rc = ctl_step_commit(c, r, vpath, 0, "{\"skipped\": true}", 0);
                continue;
            }
            worker *w = ctl_idle_worker(c, "trainer");
            if (w) rc = lease_train(c, r, w);
        }
    }
    return rc;
}
