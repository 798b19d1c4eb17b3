/*
** role_teacher.c — `prl role teacher`: one process of the OPD teacher pool (docs/opd.md).
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
#include "cli/cli.h"
#include "opd/opd.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

typedef struct teacher {
    cli_role role;
    prl_model model;
    int have_model;
    char path[1200];      /* the expert held ("" = none) */
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
    cli_role_log(&t->role, "holding expert %s (loaded in %.2f s, peak RSS %llu KiB)", path,
                 1e-6 * (double)*load_us, (unsigned long long)prl_opd_peak_rss_kb());
    return PRL_OK;
}

static prl_status send_taught(teacher *t, uint64_t lease, uint64_t step, const char *key,
                              uint64_t load_us, uint64_t teach_us, int loaded,
                              const prl_opd_batch *sc)
{
    prl_bus_msg out;
    prl_status rc = prl_bus_msg_init(&out, "taught", t->role.run, ++t->role.next_id);
    if (rc) return rc;
    if (!rc) rc = prl_bus_msg_set_uint(&out, "lease", lease);
    if (!rc) rc = prl_bus_msg_set_uint(&out, "step", step);
    if (!rc) rc = prl_bus_msg_set_str(&out, "teacher", key);
    if (!rc) rc = prl_bus_msg_set_uint(&out, "load_us", load_us);
    if (!rc) rc = prl_bus_msg_set_uint(&out, "teach_us", teach_us);
    if (!rc) rc = prl_bus_msg_set_uint(&out, "peak_rss_kb", prl_opd_peak_rss_kb());
    if (!rc) rc = prl_bus_msg_set_uint(&out, "loaded", (uint64_t)loaded);
    size_t n = sc->n_response, cells = n * (size_t)sc->topk;
    if (!rc) rc = prl_bus_msg_add_frame(&out, "logprobs", PRL_BUS_F32, sc->teacher_lp, n);
    if (!rc && sc->topk)
        rc = prl_bus_msg_add_frame(&out, "topk_ids", PRL_BUS_I32, sc->topk_ids, cells);
    if (!rc && sc->topk)
        rc = prl_bus_msg_add_frame(&out, "topk_logprobs", PRL_BUS_F32, sc->topk_lp, cells);
    if (!rc) rc = prl_bus_send(t->role.ctl, NULL, &out);
    prl_bus_msg_free(&out);
    return rc;
}

static prl_status teach(teacher *t, const prl_bus_msg *m)
{
    uint64_t lease = 0, step = 0, load_us = 0;
    const char *key = NULL, *path = NULL;
    prl_status rc = prl_bus_msg_get_uint(m, "lease", &lease);
    if (!rc) rc = prl_bus_msg_get_uint(m, "step", &step);
    if (!rc) rc = prl_bus_msg_get_str(m, "teacher", &key);
    if (!rc) rc = prl_bus_msg_get_str(m, "path", &path);
    if (!rc && prl_opd_teacher_index(key) < 0)
        rc = prl_error_set(PRL_ERR_FORMAT, "teach: unknown teacher key '%s'", key);
    prl_grpo_batch b;
    memset(&b, 0, sizeof b);
    if (!rc) rc = prl_opd_teach_from_msg(&b, m);
    int loaded = 0;
    if (!rc) rc = hold(t, path, &load_us, &loaded);
    double t0 = prl_now();
    prl_opd_batch sc; /* the item's scores: the storage of a train message's teacher frames */
    memset(&sc, 0, sizeof sc);
    if (!rc) rc = prl_opd_batch_init(&sc, b.n, b.n_response, t->role.job.opd_topk);
    if (!rc) rc = prl_opd_teacher_score(&t->model, &b, 8, prl_grpo_score_temperature(&t->role.job),
                                        sc.topk, sc.teacher_lp, sc.topk_ids, sc.topk_lp);
    if (!rc) rc = send_taught(t, lease, step, key, load_us, (uint64_t)((prl_now() - t0) * 1e6),
                              loaded, &sc);
    if (!rc)
        cli_role_log(&t->role, "step %llu: %s scored %d samples (%zu tokens) in %.2f s",
                     (unsigned long long)step, key, b.n, b.n_response, prl_now() - t0);
    prl_opd_batch_free(&sc);
    prl_grpo_batch_free(&b);
    return rc;
}

int cmd_role_teacher(int argc, char **argv)
{
    const char *connect = NULL, *name = "teacher-0";
    int threads = 0, remote = 0;
    cli_opt opts[] = {
        {"connect", OPT_STR, &connect, "ENDPOINT", "the controller's endpoint", 1, 0},
        {"name", OPT_STR, &name, "NAME", "worker name, stable across restarts (default teacher-0)", 0, 0},
        {"threads", OPT_INT, &threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0},
        {"allow-remote", OPT_FLAG, &remote, NULL, "allow a non-loopback tcp:// endpoint", 0, 0},
        {0}};
    int pr = cli_parse(argc, argv, 3, opts, "prl role teacher --connect ENDPOINT [options]",
                       "An OPD teacher: scores the student's samples with one domain expert at a "
                       "time (docs/opd.md).", NULL, 0, NULL);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    if (cli_setup_blas("role teacher", threads)) return 1;
    /* a fixed mmap threshold: an unloaded expert's blocks go back to the system at once
    ** (glibc's adaptive threshold would keep them in the heap), so VmHWM shows one expert */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    cli_role_install_signals();
    teacher t;
    memset(&t, 0, sizeof t);
    if (cli_role_join(&t.role, "teacher", name, connect, remote)) return cli_fail("role teacher");
    int code = 0;
    while (!cli_role_stopping(&t.role)) {
        prl_bus_msg m;
        int got = 0;
        if (cli_role_next(&t.role, 200, &m, &got)) {
            code = cli_fail("role teacher");
            break;
        }
        if (!got) continue;
        if (!strcmp(m.type, "teach") && teach(&t, &m)) cli_role_refuse(&t.role, &m, prl_error_message());
        else if (strcmp(m.type, "teach")) cli_role_log(&t.role, "ignored a '%s' message", m.type);
        prl_bus_msg_free(&m);
    }
    unload(&t);
    cli_role_leave(&t.role);
    return code;
}
