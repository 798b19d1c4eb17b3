/*
** teacher.c — a teacher (`prl role teacher`): one process of the OPD teacher pool (docs/opd.md).
** Takes `teach` (one teacher's samples of a step and the expert's checkpoint path), scores
** every response token with that expert's train path at the temperature the trainer scores
** the student at (the job's rollout.temperature; opd/teacher.c) and answers `taught`
** with the log-probs (with opd.topk also the expert's own top-k at each token), the load
** time and the process's peak RSS.
**
** One expert at a time: the process keeps the last expert it loaded and, when an item names
** another, frees it before loading the next, so its peak memory stays that of one expert
** (rl.md §5.3; `peak_rss_kb` lets anyone check). Experts are read-only: nothing is written.
*/
#include "roles/internal.h"
#include "opd/opd.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

typedef struct teacher {
    prl_worker role;
    prl_model model;
    int have_model;
    char path[1200]; /* the expert held ("" = none) */
} teacher;

static void unload(teacher *t)
{
    if (t->have_model) prl_model_free(&t->model);
    t->have_model = 0, t->path[0] = 0;
}

/* The expert at `path`, loaded unless it is the one held; *loaded_us its load time. */
static prl_status hold(teacher *t, const char *path, uint64_t *load_us, int *loaded)
{
    *load_us = 0, *loaded = 0;
    if (t->have_model && !strcmp(t->path, path)) return PRL_OK;
    unload(t); /* first: two experts are never resident together */
    double t0 = prl_now();
    prl_status rc = prl_checkpoint_load(&t->model, path);
    if (rc) return prl_error_wrap(rc, "teacher %s: ", path);
    t->have_model = 1, *loaded = 1;
    snprintf(t->path, sizeof t->path, "%s", path);
    *load_us = (uint64_t)((prl_now() - t0) * 1e6);
    prl_worker_log(&t->role, "holding expert %s (loaded in %.2f s, peak RSS %llu KiB)", path,
                   1e-6 * (double)*load_us, (unsigned long long)prl_opd_peak_rss_kb());
    return PRL_OK;
}

static prl_status send_taught(teacher *t, const prl_msg_teach *x, uint64_t load_us,
                              uint64_t teach_us, int loaded, const prl_opd_batch *sc)
{
    prl_msg_taught out = {.lease = x->lease,
                          .step = x->step,
                          .teacher = x->teacher,
                          .load_us = load_us,
                          .teach_us = teach_us,
                          .peak_rss_kb = prl_opd_peak_rss_kb(),
                          .loaded = loaded,
                          .logprobs = sc->teacher_lp,
                          .n_response = sc->n_response,
                          .topk = sc->topk,
                          .topk_ids = sc->topk_ids,
                          .topk_lp = sc->topk_lp};
    prl_bus_msg m;
    prl_status rc = prl_msg_taught_encode(&out, t->role.run, ++t->role.next_id, &m);
    return rc ? rc : prl_worker_send(&t->role, &m);
}

static prl_status teach(void *ctx, prl_worker *role, const prl_bus_msg *m)
{
    teacher *t = ctx;
    (void)role;
    uint64_t load_us = 0;
    prl_msg_teach x;
    prl_status rc = prl_msg_teach_decode(m, &x);
    int loaded = 0;
    if (!rc) rc = hold(t, x.path, &load_us, &loaded);
    double t0 = prl_now();
    prl_opd_batch sc; /* the item's scores: the storage of a train message's teacher frames */
    memset(&sc, 0, sizeof sc);
    const prl_grpo_batch *b = &x.item;
    if (!rc) rc = prl_opd_batch_init(&sc, b->n, b->n_response, t->role.job.opd_topk);
    if (!rc)
        rc = prl_opd_teacher_score(&t->model, b, 8, prl_grpo_score_temperature(&t->role.job),
                                   sc.topk, sc.teacher_lp, sc.topk_ids, sc.topk_lp);
    if (!rc) rc = send_taught(t, &x, load_us, (uint64_t)((prl_now() - t0) * 1e6), loaded, &sc);
    if (!rc)
        prl_worker_log(&t->role, "step %llu: %s scored %d samples (%zu tokens) in %.2f s",
                       (unsigned long long)x.step, x.teacher, b->n, b->n_response, prl_now() - t0);
    prl_opd_batch_free(&sc);
    prl_msg_teach_free(&x);
    return rc;
}

prl_status prl_role_teacher_run(const prl_worker_options *o)
{
    /* a fixed mmap threshold: an unloaded expert's blocks go back to the system at once
    ** (glibc's adaptive threshold would keep them in the heap), so VmHWM shows one expert */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    teacher t;
    memset(&t, 0, sizeof t);
    prl_status rc = prl_worker_join(&t.role, "teacher", o);
    if (rc) return rc;
    rc = prl_worker_serve(&t.role, "teach", teach, &t);
    unload(&t);
    prl_worker_leave(&t.role);
    return rc;
}
