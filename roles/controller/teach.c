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

/* The samples of teacher k that the step trains on, in the order of ctl_build_train; calls
** fn for each. Returns their count. */
static int teacher_samples(const ctl *c, const step_run *r, int k,
                           void (*fn)(void *u, slot *s), void *u)
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

static prl_status build_teach(ctl *c, step_run *r, int k, prl_bus_msg *m, uint64_t lease_id)
{
    size_t n[2] = {0, 0};
    int cnt = teacher_samples(c, r, k, count_one, n);
    prl_grpo_batch b;
    prl_status rc = prl_grpo_batch_init(&b, cnt, n[0], n[1]);
    teach_pack p = {.b = &b};
    if (!rc) teacher_samples(c, r, k, pack_one, &p);
    if (!rc) b.offsets[cnt] = (int32_t)p.at;
    if (!rc) rc = prl_bus_msg_init(m, "teach", c->job->name, ++c->next_id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", lease_id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", (uint64_t)r->step);
    if (!rc) rc = prl_bus_msg_set_str(m, "teacher", prl_opd_teacher_key(k));
    if (!rc) rc = prl_bus_msg_set_str(m, "path", c->job->opd_teachers[k]);
    if (!rc) rc = prl_opd_teach_to_msg(&b, m);
    prl_grpo_batch_free(&b);
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
    memset(&m, 0, sizeof m); /* freed on error even if build_teach failed before its init */
    if ((rc = build_teach(c, r, k, &m, l->id))) {
        prl_bus_msg_free(&m);
        return rc;
    }
    if (ctl_send_msg(c, w, &m)) ctl_lease_requeue(c, l, "send failed");
    return PRL_OK;
}

/* An idle teacher process, preferring one that holds teacher k. */
static worker *idle_teacher(ctl *c, int k)
{
    for (int i = 0; i < c->nw; i++)
        if (!c->w[i].lease && c->w[i].peer.len && !strcmp(c->w[i].role, "teacher") &&
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

/* The teacher frames of `train`: each sample's teacher log-probs and teacher index. */
prl_status ctl_train_teachers(ctl *c, step_run *r, const prl_grpo_batch *b, prl_bus_msg *m)
{
    prl_opd_batch ob;
    int K = c->job->opd_topk;
    prl_status rc = prl_opd_batch_init(&ob, b->n, b->n_response, K);
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
            else memcpy(ob.teacher_lp + at, s->teacher_lp, (size_t)nr * sizeof *ob.teacher_lp);
            if (!rc && K) {
                memcpy(ob.topk_ids + at * K, s->topk_ids, (size_t)nr * K * sizeof *ob.topk_ids);
                memcpy(ob.topk_lp + at * K, s->topk_lp, (size_t)nr * K * sizeof *ob.topk_lp);
            }
            ob.teacher[k++] = r->g[i].teacher;
            at += (size_t)nr;
        }
    if (!rc) rc = prl_opd_batch_to_msg(&ob, m);
    prl_opd_batch_free(&ob);
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
    const float *lp;
    const int32_t *ids;   /* with opd.topk K: the top-k frames (else NULL) */
    const float *klp;
    int K;
    size_t at;
    int bad;
} teach_take;

static void take_one(void *u, slot *s)
{
    teach_take *t = u;
    size_t nr = (size_t)(s->n - s->prompt_len), cells = (nr ? nr : 1) * (size_t)t->K;
    free(s->teacher_lp), free(s->topk_ids), free(s->topk_lp);
    s->topk_ids = NULL, s->topk_lp = NULL;
    s->teacher_lp = malloc((nr ? nr : 1) * sizeof *s->teacher_lp);
    if (t->K) s->topk_ids = malloc(cells * sizeof *s->topk_ids), s->topk_lp = malloc(cells * sizeof *s->topk_lp);
    if (!s->teacher_lp || (t->K && (!s->topk_ids || !s->topk_lp))) {
        t->bad = 1;
        return;
    }
    memcpy(s->teacher_lp, t->lp + t->at, nr * sizeof *s->teacher_lp);
    if (t->K) {
        memcpy(s->topk_ids, t->ids + t->at * t->K, nr * t->K * sizeof *s->topk_ids);
        memcpy(s->topk_lp, t->klp + t->at * t->K, nr * t->K * sizeof *s->topk_lp);
    }
    t->at += nr;
}

static int bad_lp(float lp) { return !(isfinite(lp) && lp <= 0); }

/* The teacher log-probs of the loss tokens: finite and <= 0, and with the top-k (K > 0) its
** ids >= 0 and log-probs finite and <= 0 there, ids -1 elsewhere (the trainer's rules,
** opd/batch.c); the flat index of the first bad token, -1 when all are good. */
static long first_bad_teacher_lp(const ctl *c, const step_run *r, int k, const teach_take *t)
{
    size_t at = 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; r->g[i].verdict == 1 && r->g[i].teacher == k && j < c->G; j++) {
            const slot *s = &r->g[i].s[j];
            if (!ctl_sample_fresh(c, r, s)) continue;
            for (int x = 0; x < s->n - s->prompt_len; x++, at++) {
                if (s->mask[x] && bad_lp(t->lp[at])) return (long)at;
                for (int q = 0; q < t->K; q++) {
                    int32_t id = t->ids[at * t->K + q];
                    if (s->mask[x] ? id < 0 || bad_lp(t->klp[at * t->K + q]) : id != -1)
                        return (long)at;
                }
            }
        }
    return -1;
}

void ctl_on_taught(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    int bad = 0;
    uint64_t lid = ctl_field_u(m, "lease", &bad), step = ctl_field_u(m, "step", &bad);
    uint64_t load_us = ctl_field_u(m, "load_us", &bad), teach_us = ctl_field_u(m, "teach_us", &bad);
    uint64_t rss = ctl_field_u(m, "peak_rss_kb", &bad), loaded = ctl_field_u(m, "loaded", &bad);
    const char *key = NULL;
    bad |= prl_bus_msg_get_str(m, "teacher", &key) != PRL_OK;
    int k = bad ? -1 : prl_opd_teacher_index(key);
    step_run *r = k < 0 ? NULL : ctl_step_find(c, (int64_t)step);
    lease *l = r && r->teach_lease[k] == lid ? ctl_lease_find(c, lid) : NULL;
    if (!l || l->kind != LEASE_TEACH || &c->w[l->worker] != w) {
        ctl_send_error(c, &w->peer, id, "taught: lease %llu (step %llu, teacher %s) is not %s's teach "
                   "lease in flight", (unsigned long long)lid, (unsigned long long)step,
                   key ? key : "?", w->name);
        return;
    }
    size_t n[2] = {0, 0};
    teacher_samples(c, r, k, count_one, n);
    int K = c->job->opd_topk;
    const prl_bus_frame *lp = ctl_frame_of(m, "logprobs", PRL_BUS_F32, n[1], 1);
    const prl_bus_frame *ki = K ? ctl_frame_of(m, "topk_ids", PRL_BUS_I32, n[1] * K, 1) : NULL;
    const prl_bus_frame *kl = K ? ctl_frame_of(m, "topk_logprobs", PRL_BUS_F32, n[1] * K, 1) : NULL;
    int frames = lp && (!K || (ki && kl));
    teach_take t = {.lp = lp ? lp->data : NULL, .K = K, .ids = ki ? ki->data : NULL,
                    .klp = kl ? kl->data : NULL};
    long badi = frames ? first_bad_teacher_lp(c, r, k, &t) : -1;
    if (!frames) {
        CTL_REJECT_HELD(c, w, l, id, "taught: frames 'logprobs' (and with opd.topk %d 'topk_ids', "
                    "'topk_logprobs') must hold one f32 (%d i32, %d f32) per response token of "
                    "the item", K, K, K);
        return;
    }
    if (badi >= 0) {
        CTL_REJECT_HELD(c, w, l, id, "taught: response token %ld of the item: a log-prob is not "
                    "finite and <= 0, or a top-k id is < 0 on a loss token or not -1 off them", badi);
        return;
    }
    teacher_samples(c, r, k, take_one, &t);
    if (t.bad) {
        ctl_log("out of memory for teacher log-probs");
        ctl_lease_requeue(c, l, "out of memory");
        return;
    }
    r->taught[k] = 1;
    r->teach_loads[k] += (int)(loaded != 0);
    r->teach_load_s[k] += 1e-6 * (double)load_us, r->teach_s[k] += 1e-6 * (double)teach_us;
    r->teach_rss_kb[k] = rss;
    r->proc_rss_kb[w - c->w] = rss;
    ctl_lease_end(c, lid);
    r->teach_lease[k] = 0;
}
