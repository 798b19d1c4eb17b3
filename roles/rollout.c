/*
** rollout.c — the rollout worker (`prl role rollout`). Takes `work` (one prompt, `count`
** samples, at a policy version), plays the episodes with the infer path in one continuous
** batch (rollout/, unscored: scoring is the reward workers' job) and returns one `result` per
** sample with its tokens, infer log-probs, loss mask, MoE routes and turns (an in-run
** evaluation's item: sample 0 greedy, the others sampled). A new policy
** version is loaded only between work items (docs/pipeline.md).
*/
#include "roles/internal.h"
#include "rollout/rollout.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct rollout_worker {
    prl_worker role;
    prl_model model;
    int have_model;
    prl_tokenizer *tok;
    prl_infer *engine;
    int64_t version; /* loaded policy version (-1: none) */
    char path[1024];
    prl_role_exec exec; /* python tool calls */
    const char *cache;  /* --cache: versions fetched over the bus (NULL: read `path`) */
    char fetched[1100]; /* the last version this process fetched into the cache ("" none) */
} rollout_worker;

static void unload(rollout_worker *w)
{
    prl_infer_free(w->engine);
    prl_tokenizer_free(w->tok);
    if (w->have_model) prl_model_free(&w->model);
    w->engine = NULL, w->tok = NULL, w->have_model = 0, w->version = -1;
}

/* Load the checkpoint of version v (between work items only). */
static prl_status load_version(rollout_worker *w, int64_t v, const char *path)
{
    if (w->version == v && !strcmp(w->path, path)) return PRL_OK;
    unload(w);
    prl_status rc = prl_checkpoint_load_tokenizer(&w->model, path, &w->tok);
    if (rc) return rc;
    w->have_model = 1;
    if (!w->tok) return prl_error_set(PRL_ERR_FORMAT, "%s has no tokenizer.json", path);
    prl_infer_options io;
    if ((rc = prl_infer_options_preset(&io, w->role.job.precision))) return rc;
    io.max_batch = w->role.job.group_size < 64 ? w->role.job.group_size : 64;
    if ((rc = prl_infer_init(&w->engine, &w->model, &io))) return rc;
    w->version = v;
    snprintf(w->path, sizeof w->path, "%s", path);
    prl_worker_log(&w->role, "loaded policy version %lld from %s", (long long)v, path);
    return PRL_OK;
}

/* Remove a version directory this process fetched (its files: fetch.c's list). */
static void drop_fetched(const char *dir)
{
    char path[1200];
    for (int i = 0; prl_msg_fetch_file(i); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, prl_msg_fetch_file(i));
        unlink(path);
    }
    rmdir(dir);
}

/* Version v: from `path` (the same disk), or with --cache fetched over the bus first; the
** previous version this process fetched leaves the cache once the new one is loaded. */
static prl_status take_version(rollout_worker *w, int64_t v, const char *path)
{
    if (!w->cache) return load_version(w, v, path);
    char local[1100];
    if (w->version == v) return PRL_OK;
    prl_status rc = prl_worker_fetch_version(&w->role, w->cache, (uint64_t)v, local, sizeof local);
    if (!rc) rc = load_version(w, v, local);
    if (rc) return rc;
    if (w->fetched[0] && strcmp(w->fetched, local)) drop_fetched(w->fetched);
    snprintf(w->fetched, sizeof w->fetched, "%s", local);
    return PRL_OK;
}

/* One sample of work item w as a `result`. */
static prl_status send_result(rollout_worker *w, const prl_msg_work *work, int sample,
                              const prl_episode *ep)
{
    const prl_config *cfg = &w->model.cfg;
    prl_msg_result x = {.lease = work->lease,
                        .step = work->step,
                        .prompt = work->prompt,
                        .sample = (uint64_t)sample,
                        .policy_version = work->policy_version,
                        .prompt_len = ep->prompt_len,
                        .gen_us = (uint64_t)(ep->gen_seconds * 1e6),
                        .stop = ep->stop,
                        .tokens = ep->ids,
                        .n_tokens = (size_t)ep->n,
                        .logprobs = ep->logprobs + ep->prompt_len,
                        .mask = ep->mask + ep->prompt_len,
                        .routes = ep->routes,
                        .routes_bytes = ep->routes_bytes,
                        .route_shape = {ep->n_route_tokens, w->model.n_moe,
                                        cfg->num_experts_per_tok,
                                        prl_routes_width(cfg->n_routed_experts)},
                        .turns = prl_msg_turns_json(ep->msgs, ep->n_msgs),
                        .truncated = ep->truncated,
                        .turns_played = ep->turns};
    prl_bus_msg m;
    prl_status rc = x.turns ? prl_msg_result_encode(&x, w->role.run, ++w->role.next_id, &m)
                            : prl_error_set(PRL_ERR_NOMEM, "result turns");
    json_decref(x.turns);
    return rc ? rc : prl_worker_send(&w->role, &m);
}

static prl_status do_work(void *ctx, prl_worker *role, const prl_bus_msg *m)
{
    rollout_worker *w = ctx;
    (void)role;
    prl_msg_work work;
    prl_status rc = prl_msg_work_decode(m, &work);
    if (!rc) rc = take_version(w, (int64_t)work.policy_version, work.path);
    uint64_t count = rc ? 0 : work.count;
    json_t **tasks = calloc(count ? count : 1, sizeof *tasks);
    uint64_t *seq = calloc(count ? count : 1, sizeof *seq);
    prl_episode *eps = calloc(count ? count : 1, sizeof *eps);
    if (!rc && (!tasks || !seq || !eps))
        rc = prl_error_set(PRL_ERR_NOMEM, "%llu episodes", (unsigned long long)count);
    for (uint64_t i = 0; !rc && i < count; i++) {
        prl_rng r; /* each sample's draws come from (run seed, step, prompt, sample) */
        prl_rng_init(&r, w->role.seed, work.step, work.prompt, work.sample + i, PRL_RNG_SAMPLE);
        tasks[i] = work.task_json, seq[i] = r.key;
    }
    prl_rollout_config rc_;
    prl_rollout_config_default(&rc_);
    const prl_job_config *j = &w->role.job;
    rc_.sampling.temperature = j->temperature, rc_.sampling.top_p = j->top_p;
    rc_.sampling.seed = w->role.seed, rc_.sampling.max_new_tokens = j->max_new_tokens;
    int32_t stops[2]; /* the tokenizer's end of turn and eos (prl: <|end|>, <|eos|>) */
    rc_.sampling.stop_ids = stops, rc_.sampling.n_stop_ids = prl_tokenizer_stop_ids(w->tok, stops);
    rc_.max_turns = j->max_turns, rc_.score = 0;
    rc_.cached_routes = j->replay_cached;                           /* Cached R3 (docs/replay.md) */
    if (!rc) rc = prl_tasks_mode_parse(j->rollout_mode, &rc_.mode); /* the key table checked it */
    /* an evaluation's sample 0 is greedy (its accuracy); the others are sampled (pass@k) */
    int greedy = work.eval && count > 0 ? 1 : 0;
    if (!rc && greedy) {
        prl_rollout_config g = rc_;
        g.sampling.temperature = 0;
        rc = prl_rollout_run(w->engine, w->tok, tasks, seq, 1, &g, &w->exec.exec, eps);
    }
    if (!rc && count > (uint64_t)greedy)
        rc = prl_rollout_run(w->engine, w->tok, tasks + greedy, seq + greedy, (int)count - greedy,
                             &rc_, &w->exec.exec, eps + greedy);
    for (uint64_t i = 0; !rc && i < count; i++)
        rc = send_result(w, &work, (int)(work.sample + i), &eps[i]);
    for (uint64_t i = 0; eps && i < count; i++) prl_episode_free(&eps[i]);
    free(tasks), free(seq), free(eps);
    prl_msg_work_free(&work);
    return rc;
}

prl_status prl_role_rollout_run(const prl_worker_options *o)
{
    rollout_worker w = {.version = -1, .cache = o->cache};
    prl_status rc = prl_worker_join(&w.role, "rollout", o);
    if (rc) return rc;
    if ((rc = prl_worker_exec_open(&w.role, o, &w.exec))) {
        prl_worker_leave(&w.role);
        return rc;
    }
    rc = prl_worker_serve(&w.role, "work", do_work, &w);
    unload(&w);
    prl_worker_log(&w.role, "programs answered from the exec cache: %llu",
                   (unsigned long long)w.exec.hits);
    prl_role_exec_close(&w.exec);
    prl_worker_leave(&w.role);
    return rc;
}
