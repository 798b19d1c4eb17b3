/*
** teach.c — OPD's teacher stage in the controller (internal.h, docs/opd.md): once a step
** is rolled out, each teacher's trained samples go to the teacher pool as one `teach` item
** per teacher, handed out in key order (rl.md §5.3); a teacher process holding that expert
** is preferred, so experts are loaded as rarely as possible and never two in one process.
** The step trains when every teacher has answered; the answers' log-probs go to the samples
** and, with opd.revisit, each group's teacher KL to run.db.
*/
#include "roles/controller/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The KL of a group's taught samples: the mean over their loss tokens of lp_S − lp_T (the
** sampler's and the teacher's log-probs of the sampled token: the per-token estimate of
** KL(student ‖ teacher) that the step's metrics report), floored at 0; -1 when none was
** taught (the group was dropped, or its samples were stale). */
static double group_teacher_kl(const ctl *c, const step_run *r, const group *g)
{
    double sum = 0;
    long n = 0;
    for (int j = 0; g->verdict == 1 && j < c->G; j++) {
        const slot *s = &g->s[j];
        if (!s->teacher_lp || !ctl_sample_fresh(c, r, s)) continue;
        for (int t = 0; t < s->n - s->prompt_len; t++)
            if (s->mask[t]) sum += (double)s->logprobs[t] - (double)s->teacher_lp[t], n++;
    }
    return n ? fmax(0.0, sum / (double)n) : -1;
}

/* The samples of teacher k that the step trains on, in the order of steps.c's build_train; calls
** fn for each. Returns their count. */
static int teacher_samples(const ctl *c, const step_run *r, int k, void (*fn)(void *u, slot *s),
                           void *u)
{
    int n = 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; r->g[i].verdict == 1 && r->g[i].teacher == k && j < c->G; j++) {
            slot *s = &r->g[i].s[j];
            if (!ctl_sample_fresh(c, r, s)) continue;
            n++;
            if (fn) fn(u, s);
        }
    return n;
}

typedef struct teach_pack {
    prl_grpo_batch *b;
    int k;
    size_t at, rat;
} teach_pack;

static void pack_one(void *u, slot *s)
{
    teach_pack *p = u;
    int nr = s->n - s->prompt_len;
    p->b->offsets[p->k] = (int32_t)p->at, p->b->prompt_lens[p->k] = s->prompt_len;
    memcpy(p->b->tokens + p->at, s->tokens, (size_t)s->n * sizeof *s->tokens);
    memcpy(p->b->mask + p->rat, s->mask, (size_t)nr);
    p->at += (size_t)s->n, p->rat += (size_t)nr, p->k++;
}

static void count_one(void *u, slot *s)
{
    size_t *n = u;
    n[0] += (size_t)s->n, n[1] += (size_t)(s->n - s->prompt_len);
}

/* The `teach` item of teacher k in step r: its samples' tokens, prompts and loss masks (*b
** owned by the caller). */
static prl_status teach_item(const ctl *c, const step_run *r, int k, prl_grpo_batch *b)
{
    size_t n[2] = {0, 0};
    int cnt = teacher_samples(c, r, k, count_one, n);
    prl_status rc = prl_grpo_batch_init(b, cnt, n[0], n[1]);
    teach_pack p = {.b = b};
    if (!rc) teacher_samples(c, r, k, pack_one, &p);
    if (!rc) b->offsets[cnt] = (int32_t)p.at;
    return rc;
}

static prl_status build_teach(ctl *c, step_run *r, int k, prl_bus_msg *m, uint64_t lease_id)
{
    prl_msg_teach x = {.lease = lease_id,
                       .step = (uint64_t)r->step,
                       .teacher = prl_opd_teacher_key(k),
                       .path = c->job->opd_teachers[k]};
    prl_status rc = teach_item(c, r, k, &x.item);
    if (!rc) rc = prl_msg_teach_encode(&x, c->job->name, ++c->next_id, m);
    prl_grpo_batch_free(&x.item);
    return rc;
}

static prl_status lease_teach(ctl *c, step_run *r, int k, worker *w)
{
    lease *l = NULL;
    prl_status rc = ctl_lease_new(c, LEASE_TEACH, r->step, k, 0, w, &l);
    if (rc) return rc;
    r->teach_lease[k] = l->id;
    w->holds = k + 1;
    prl_bus_msg m;
    if ((rc = build_teach(c, r, k, &m, l->id))) return rc;
    if (ctl_send_msg(c, w, &m)) ctl_lease_requeue(c, l, "send failed");
    return PRL_OK;
}

/* An idle teacher process, preferring one that holds teacher k. */
static worker *idle_teacher(ctl *c, int k)
{
    for (int i = 0; i < c->nw; i++)
        if (!c->w[i].held && c->w[i].peer.len && !strcmp(c->w[i].role, "teacher") &&
            c->w[i].holds == k + 1)
            return &c->w[i];
    return ctl_idle_worker(c, "teacher");
}

/* Hand out the teach items of a rolled-out step, in key order; 1 when every teacher has
** answered (or the job has no teachers). */
int ctl_step_taught(ctl *c, step_run *r, prl_status *rc)
{
    if (!c->job->opd_enabled) return 1;
    int done = 1;
    for (int k = 0; k < PRL_OPD_TEACHERS && !*rc; k++) {
        if (r->taught[k]) continue;
        if (!teacher_samples(c, r, k, NULL, NULL)) {
            r->taught[k] = 1;
            continue;
        }
        done = 0;
        if (r->teach_lease[k]) continue;
        worker *w = idle_teacher(c, k);
        if (w) *rc = lease_teach(c, r, k, w);
    }
    if (done && !r->t_taught) r->t_taught = prl_now();
    return done;
}

/* The teacher side of `train`: each sample's teacher log-probs and teacher index. */
prl_status ctl_train_teachers(ctl *c, step_run *r, const prl_grpo_batch *b, prl_opd_batch *ob)
{
    int K = c->job->opd_topk;
    prl_status rc = prl_opd_batch_init(ob, b->n, b->n_response, K);
    size_t at = 0;
    int k = 0;
    for (int i = 0; i < r->n && !rc; i++)
        for (int j = 0; r->g[i].verdict == 1 && j < c->G && !rc; j++) {
            const slot *s = &r->g[i].s[j];
            if (!ctl_sample_fresh(c, r, s)) continue;
            int nr = s->n - s->prompt_len;
            if (!s->teacher_lp || (K && !s->topk_ids))
                rc = prl_error_set(PRL_ERR_ARG, "step %lld: sample %d has no teacher log-probs",
                                   (long long)r->step, k);
            else memcpy(ob->teacher_lp + at, s->teacher_lp, (size_t)nr * sizeof *ob->teacher_lp);
            if (!rc && K) {
                memcpy(ob->topk_ids + at * K, s->topk_ids, (size_t)nr * K * sizeof *ob->topk_ids);
                memcpy(ob->topk_lp + at * K, s->topk_lp, (size_t)nr * K * sizeof *ob->topk_lp);
            }
            ob->teacher[k++] = r->g[i].teacher;
            at += (size_t)nr;
        }
    return rc;
}

/* With opd.revisit: each taught group's teacher KL, in run.db (inside the step's transaction,
** so a resumed run draws from what the committed steps recorded) and in memory. */
prl_status ctl_record_teacher_kls(ctl *c, const step_run *r)
{
    if (!ctl_revisit_count(c)) return PRL_OK;
    prl_status rc = PRL_OK;
    for (int i = 0; i < r->n && !rc; i++) {
        double kl = group_teacher_kl(c, r, &r->g[i]);
        if (kl < 0) continue;
        rc = prl_store_prompt_set_teacher_kl(c->db, c->run, c->task_id[r->g[i].prompt], kl);
        if (!rc) c->teacher_kl[r->g[i].prompt] = kl;
    }
    return rc;
}

/* A teacher answered its `teach` item (docs/opd.md): the log-probs go to the samples. */
typedef struct teach_take {
    const prl_opd_batch *sc; /* the item's scores, checked */
    size_t at;
    int bad;
} teach_take;

static void take_one(void *u, slot *s)
{
    teach_take *t = u;
    int K = t->sc->topk;
    size_t nr = (size_t)(s->n - s->prompt_len), cells = (nr ? nr : 1) * (size_t)K;
    free(s->teacher_lp), free(s->topk_ids), free(s->topk_lp);
    s->topk_ids = NULL, s->topk_lp = NULL;
    s->teacher_lp = malloc((nr ? nr : 1) * sizeof *s->teacher_lp);
    if (K)
        s->topk_ids = malloc(cells * sizeof *s->topk_ids),
        s->topk_lp = malloc(cells * sizeof *s->topk_lp);
    if (!s->teacher_lp || (K && (!s->topk_ids || !s->topk_lp))) {
        t->bad = 1;
        return;
    }
    memcpy(s->teacher_lp, t->sc->teacher_lp + t->at, nr * sizeof *s->teacher_lp);
    if (K) {
        memcpy(s->topk_ids, t->sc->topk_ids + t->at * K, nr * K * sizeof *s->topk_ids);
        memcpy(s->topk_lp, t->sc->topk_lp + t->at * K, nr * K * sizeof *s->topk_lp);
    }
    t->at += nr;
}

/* The scores of taught answer x for teacher k's item of step r (*sc owned by the caller),
** by the rules the trainer applies to them (prl_msg_taught_scores). */
static prl_status taught_scores(const ctl *c, const step_run *r, int k, const prl_msg_taught *x,
                                prl_opd_batch *sc)
{
    prl_grpo_batch item;
    prl_status rc = teach_item(c, r, k, &item);
    if (!rc) rc = prl_msg_taught_scores(x, &item, c->job->opd_topk, sc);
    prl_grpo_batch_free(&item);
    return rc;
}

void ctl_on_taught(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    prl_msg_taught x;
    if (prl_msg_taught_decode(m, &x)) {
        ctl_refuse(c, w, m, id, LEASE_TEACH, prl_error_message());
        return;
    }
    int k = x.teacher_index;
    step_run *r = ctl_step_find(c, (int64_t)x.step);
    lease *l = r && r->teach_lease[k] == x.lease ? ctl_lease_find(c, x.lease) : NULL;
    if (!l || l->kind != LEASE_TEACH || &c->w[l->worker] != w) {
        ctl_send_error(c, &w->peer, id,
                       "taught: lease %llu (step %llu, teacher %s) is not %s's teach "
                       "lease in flight",
                       (unsigned long long)x.lease, (unsigned long long)x.step, x.teacher, w->name);
        return;
    }
    prl_opd_batch sc;
    if (taught_scores(c, r, k, &x, &sc)) {
        CTL_REJECT_HELD(c, w, l, id, "%s", prl_error_message());
        return;
    }
    teach_take t = {.sc = &sc};
    teacher_samples(c, r, k, take_one, &t);
    prl_opd_batch_free(&sc);
    if (t.bad) {
        ctl_log("out of memory for teacher log-probs");
        ctl_lease_requeue(c, l, "out of memory");
        return;
    }
    r->taught[k] = 1;
    r->teach_loads[k] += x.loaded;
    r->teach_load_s[k] += 1e-6 * (double)x.load_us, r->teach_s[k] += 1e-6 * (double)x.teach_us;
    r->teach_rss_kb[k] = x.peak_rss_kb;
    r->proc_rss_kb[w - c->w] = x.peak_rss_kb;
    ctl_lease_end(c, x.lease);
    r->teach_lease[k] = 0;
}
