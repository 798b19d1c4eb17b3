/*
** record.c — every write of the controller to run.db (internal.h; docs/store.md): events,
** scored samples (idempotent by their key), a step's commit (version and metrics in one
** transaction), the run's creation or resumption, and the checkpoints kept on disk.
*/
#include "roles/controller/internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void ctl_event(ctl *c, const char *kind, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (prl_store_event_add(c->db, c->run, kind, detail))
        ctl_log("could not record ctl_event %s: %s", kind, prl_error_message());
}

/* Write a scored sample to run.db (idempotent by its key). */
prl_status ctl_store_sample(ctl *c, step_run *r, group *g, int j)
{
    slot *s = &g->s[j];
    int nr = s->n - s->prompt_len;
    prl_store_sample x = {.run = c->run,
                          .step = r->step,
                          .prompt_id = c->task_id[g->prompt],
                          .sample_index = j,
                          .tokens = s->tokens,
                          .n_tokens = s->n,
                          .prompt_len = s->prompt_len,
                          .logprobs = s->logprobs,
                          .loss_mask = s->mask,
                          .version = s->version,
                          .worker = s->worker,
                          .reward = s->reward,
                          .reward_detail = s->detail,
                          .flags = s->flags,
                          .stop = s->stop,
                          .gen_seconds = s->gen_s,
                          .reward_seconds = s->score_s,
                          .status = ctl_sample_fresh(c, r, s) ? PRL_STORE_SAMPLE_OK
                                                              : PRL_STORE_SAMPLE_STALE};
    if (s->routes && s->route_shape.rows > 0) {
        x.routes = s->routes, x.route_tokens = s->route_shape.rows,
        x.route_moe = s->route_shape.moe;
        x.route_k = s->route_shape.k, x.route_width = s->route_shape.width;
    }
    (void)nr;
    int already = 0;
    prl_status rc = prl_store_sample_put(c->db, &x, &already);
    /* routes of a bad shape (PRL_ERR_ARG) must not lose the sample; any other failure (a
    ** locked or full run.db) is the caller's, so that the sample keeps its routes */
    if (rc == PRL_ERR_ARG && x.routes) {
        ctl_log("sample stored without routes: %s", prl_error_message());
        x.routes = NULL, x.route_tokens = x.route_moe = x.route_k = x.route_width = 0;
        rc = prl_store_sample_put(c->db, &x, &already);
    }
    return rc;
}

/* A sample that could not be scored: reward 0, the reason in its detail, EXEC_ERROR. */
prl_status ctl_store_failed_score(ctl *c, step_run *r, group *g, int j, const char *why)
{
    slot *s = &g->s[j];
    json_t *d = json_pack("{s:f,s:f,s:i,s:s,s:[]}", "score", 0.0, "penalty", 0.0, "flags",
                          (int)PRL_REWARD_EXEC_ERROR, "error", why, "checks");
    free(s->detail);
    s->detail = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(d);
    if (!s->detail) return prl_error_set(PRL_ERR_NOMEM, "score detail");
    s->reward = 0, s->flags = PRL_REWARD_EXEC_ERROR, s->state = 2;
    prl_status rc = ctl_store_sample(c, r, g, j);
    if (rc) return rc;
    if (++g->scored == c->G) ctl_judge_group(c, r, g);
    if (ctl_step_rolled(c, r) && !r->t_scored) r->t_scored = prl_now();
    return PRL_OK;
}

/* ---------------------------------------------------------------- checkpoints ------ */

static void remove_checkpoint(const char *dir)
{
    static const char *files[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                                  "state.json", "tokenizer.json"};
    char p[1600]; /* dir (at most 1400) + "/" + a file name */
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    if (rmdir(dir) && errno != ENOENT) ctl_log("could not remove %s: %s", dir, strerror(errno));
}

/* Kept: version 0, the newest lag+2 versions and every checkpoint.every-th one. */
static int kept(const ctl *c, int64_t v)
{
    int every = c->job->checkpoint_every;
    return v < 1 || v > c->version - c->lag - 2 || (every > 0 && v % every == 0);
}

/* After a commit only one version leaves the newest lag+2. */
static void prune_checkpoints(ctl *c)
{
    int64_t v = c->version - c->lag - 2;
    if (kept(c, v)) return;
    char dir[1100];
    prl_job_ckpt_dir(c->o->run_dir, v, dir, sizeof dir);
    remove_checkpoint(dir);
}

/* vNNNNNN (at least 6 digits, as prl_job_ckpt_dir names them): *v gets the version. */
static int version_dir_name(const char *name, int64_t *v)
{
    if (name[0] != 'v' || strlen(name) < 7 || strspn(name + 1, "0123456789") != strlen(name + 1))
        return 0;
    *v = strtoll(name + 1, NULL, 10);
    return 1;
}

/* A controller that died between a commit and its prune left a version the keep rule drops:
** every start prunes all of ckpt/ (versions above the committed one are left to the trainer). */
static void prune_all(ctl *c, const char *ckpt)
{
    DIR *d = opendir(ckpt);
    if (!d) return;
    struct dirent *e;
    int64_t v;
    char dir[1400];
    int n = 0;
    while ((e = readdir(d)))
        if (version_dir_name(e->d_name, &v) && v <= c->version && !kept(c, v)) {
            snprintf(dir, sizeof dir, "%s/%s", ckpt, e->d_name);
            remove_checkpoint(dir);
            n++;
        }
    closedir(d);
    if (n) ctl_log("pruned %d checkpoint%s the keep rule drops", n, n == 1 ? "" : "s");
}

/* Close step r: version v+1 (at `path`) and the step's metrics go to run.db in one
** transaction, then the step leaves memory. A run.db failure is fatal: the controller exits
** and its restart continues from what run.db holds. */
prl_status ctl_step_commit(ctl *c, step_run *r, const char *path, uint64_t sum,
                           const char *trainer_metrics, double train_s)
{
    char sumhex[17], vpath[1024];
    snprintf(sumhex, sizeof sumhex, "%016llx", (unsigned long long)sum);
    snprintf(vpath, sizeof vpath, "%s", path);
    prl_store_version v = {.run = c->run,
                           .version = c->version + 1,
                           .path = vpath,
                           .checksum = sumhex,
                           .step = r->step};
    size_t cap = 8192 + strlen(trainer_metrics);
    char *text = malloc(cap);
    if (!text) return prl_error_set(PRL_ERR_NOMEM, "step metrics");
    c->version++;
    snprintf(c->version_path, sizeof c->version_path, "%s", vpath);
    prl_store_step st;
    ctl_step_metrics(c, r, trainer_metrics, train_s, text, cap, &st);
    st.metrics = text;
    prl_status rc = prl_store_begin(c->db);
    if (!rc) {
        rc = prl_store_version_add(c->db, &v);
        if (!rc) rc = prl_store_step_put(c->db, &st);
        if (!rc) rc = ctl_record_teacher_kls(c, r);
        rc = rc ? (prl_store_rollback(c->db), rc) : prl_store_commit(c->db);
    }
    if (rc) rc = prl_error_wrap(rc, "run.db: recording step %lld: ", (long long)r->step);
    else {
        ctl_metrics_append(c, r->step, text);
        ctl_progress_line(c, &st, text, r);
    }
    free(text);
    ctl_step_free(c, r);
    prune_checkpoints(c);
    if (c->version >= c->job->steps) c->done = 1;
    if (!rc) rc = ctl_eval_due(c, c->version);
    return rc;
}

prl_status ctl_open_run(ctl *c)
{
    prl_store_run existing;
    prl_status rc = prl_store_run_get(c->db, c->job->name, &existing);
    if (rc == PRL_ERR_RANGE) {
        if ((rc = prl_store_run_create(c->db, c->job->name, c->config_json, c->job->seed, &c->run)))
            return rc;
        prl_store_version v0 = {.run = c->run,
                                .version = 0,
                                .path = c->job->init,
                                .checksum = "0000000000000000",
                                .step = -1};
        return prl_store_version_add(c->db, &v0);
    }
    if (rc) return rc;
    c->run = existing.id;
    rc = prl_job_config_same_run(existing.config, c->config_json, c->job->name, "run.db");
    prl_store_run_free(&existing);
    if (rc) return rc;
    prl_store_run_set_status(c->db, c->run, "running");
    return PRL_OK;
}

/* A path under run_dir/ckpt/ (a checkpoint the run wrote, not model.init). */
static int in_run_ckpt(const ctl *c, const char *path)
{
    char ckpt[1100];
    int k = snprintf(ckpt, sizeof ckpt, "%s/ckpt/", c->o->run_dir);
    return !strncmp(path, ckpt, (size_t)k);
}

/* A checkpoint of the run that failed to verify goes to PATH.corrupt-TIME, for a look (and
** so the trainer writes the version afresh); model.init and missing paths are left alone. */
static void move_aside(ctl *c, const char *path)
{
    if (!in_run_ckpt(c, path) || access(path, F_OK)) return;
    char aside[1200];
    snprintf(aside, sizeof aside, "%s.corrupt-%lld", path, (long long)time(NULL));
    if (rename(path, aside)) ctl_log("cannot move %s aside: %s", path, strerror(errno));
    else ctl_log("moved %s to %s", path, aside);
}

/* The fallback from version `newest` to v, said on the terminal, in the log and in run.db. */
static void record_fallback(ctl *c, int64_t newest, const prl_store_version *v, const char *why,
                            int64_t gone)
{
    char line[900];
    snprintf(line, sizeof line,
             "version %lld cannot be used (%s): falling back to version %lld (%s); steps %lld.. "
             "are done again (%lld samples of the newer versions dropped)",
             (long long)newest, why, (long long)v->version, v->path, (long long)v->version,
             (long long)gone);
    ctl_log("%s", line);
    if (c->o->progress) fprintf(c->o->progress, "%s\n", line), fflush(c->o->progress);
    json_t *d = json_pack("{s:I,s:I,s:s,s:I}", "from", (json_int_t)newest, "to",
                          (json_int_t)v->version, "why", why, "samples_dropped", (json_int_t)gone);
    char *dt = d ? json_dumps(d, JSON_COMPACT) : NULL;
    if (dt && prl_store_event_add(c->db, c->run, "fallback", dt))
        ctl_log("could not record the fallback event: %s", prl_error_message());
    free(dt), json_decref(d);
}

/* The newest version whose checkpoint verifies (prl_checkpoint_verify) into *v. The unusable
** newer ones are moved aside (ckpt/vNNNNNN.corrupt-TIME, kept for a look) and run.db is taken
** back to *v, so their steps are done again; a `fallback` event says so. Nothing usable is a
** failed run: model.init itself is broken. */
static prl_status newest_usable(ctl *c, prl_store_version *v)
{
    prl_status rc = prl_store_version_latest(c->db, c->run, v);
    int64_t newest = v->version;
    char why[700] = "";
    prl_status bad_ckpt;
    while (!rc && (bad_ckpt = prl_checkpoint_verify(v->path))) {
        if (bad_ckpt == PRL_ERR_NOMEM) { /* no verdict on the files: the restart tries again */
            prl_store_version_free(v);
            return bad_ckpt;
        }
        if (!why[0]) snprintf(why, sizeof why, "%s", prl_error_message());
        ctl_log("version %lld (%s) cannot be used: %s", (long long)v->version, v->path,
                prl_error_message());
        move_aside(c, v->path);
        int64_t bad = v->version;
        prl_store_version_free(v);
        if (bad == 0 || (rc = prl_store_version_before(c->db, c->run, bad, v))) {
            c->failed = 1;
            return prl_error_set(PRL_ERR_IO,
                                 "no usable checkpoint: version %lld and every older "
                                 "one fail to verify; the newest: %s",
                                 (long long)newest, why);
        }
    }
    if (rc || v->version == newest) return rc;
    int64_t gone = 0;
    if ((rc = prl_store_run_back_to(c->db, c->run, v->version, &gone))) return rc;
    record_fallback(c, newest, v, why, gone);
    return PRL_OK;
}

/* What a killed save or controller left in ckpt/: temporaries of dead processes, versions
** the keep rule drops. */
static void tidy_ckpt(ctl *c)
{
    char ckpt[1100];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", c->o->run_dir);
    int removed = 0;
    if (prl_checkpoint_clean_stale(ckpt, &removed)) ctl_log("%s", prl_error_message());
    if (removed) {
        ctl_log("removed %d temporary checkpoint%s of a killed save", removed,
                removed == 1 ? "" : "s");
        ctl_event(c, "cleaned", "{\"stale_tmp\": %d}", removed);
    }
    prune_all(c, ckpt);
}

prl_status ctl_restore(ctl *c)
{
    prl_store_version v;
    prl_status rc = newest_usable(c, &v);
    if (rc) return rc;
    c->version = v.version;
    snprintf(c->version_path, sizeof c->version_path, "%s", v.path);
    prl_store_version_free(&v);
    tidy_ckpt(c);
    int64_t last = -1;
    if ((rc = prl_store_step_last(c->db, c->run, &last))) return rc;
    c->next_step = last + 1;
    c->retired_epoch = -1;
    if (last >= 0) {
        char *mt = NULL;
        if ((rc = prl_store_step_metrics(c->db, c->run, last, &mt))) return rc;
        json_error_t je;
        json_t *mj = json_loads(mt, 0, &je);
        c->cursor = json_integer_value(json_object_get(mj, "cursor_end"));
        json_decref(mj);
        free(mt);
        ctl_log("resuming at step %lld, version %lld", (long long)c->next_step,
                (long long)c->version);
        ctl_event(c, "resume", "{\"step\": %lld, \"version\": %lld}", (long long)c->next_step,
                  (long long)c->version);
    }
    if (c->version != c->next_step)
        return prl_error_set(PRL_ERR_FORMAT,
                             "run.db: version %lld after %lld steps (each step makes one)",
                             (long long)c->version, (long long)c->next_step);
    return ctl_metrics_catch_up(c);
}

/* Write runs/NAME/final -> the newest version's directory, atomically. */
void ctl_link_final(ctl *c)
{
    char tmp[1200], fin[1200];
    snprintf(tmp, sizeof tmp, "%s/final.tmp", c->o->run_dir);
    snprintf(fin, sizeof fin, "%s/final", c->o->run_dir);
    const char *target = c->version_path;
    size_t rl = strlen(c->o->run_dir);
    if (!strncmp(target, c->o->run_dir, rl) && target[rl] == '/') target += rl + 1;
    unlink(tmp);
    if (symlink(target, tmp) || rename(tmp, fin))
        ctl_log("could not link %s: %s", fin, strerror(errno));
}
