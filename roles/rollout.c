/*
** rollout.c — the rollout worker (`prl role rollout`). Takes `work` (one prompt, `count`
** samples, at a policy version), plays the episodes with the infer path in one continuous
** batch (rollout/, unscored: scoring is the reward workers' job) and returns one `result` per
** sample with its tokens, infer log-probs, loss mask, MoE routes and turns. A new policy
** version is loaded only between work items (docs/pipeline.md).
*/
#include "roles/internal.h"
#include "rollout/rollout.h"

#include <stdlib.h>
#include <string.h>

typedef struct rollout_worker {
    prl_worker role;
    prl_model model;
    int have_model;
    prl_tokenizer *tok;
    prl_infer *engine;
    int64_t version;        /* loaded policy version (-1: none) */
    char path[1024];
    prl_role_exec exec;     /* python tool calls */
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

/* The meta frame: the model's turns for the verifier, and the routes' shape. */
static char *episode_meta(const rollout_worker *w, const prl_episode *ep)
{
    json_t *o = json_object(), *turns = json_array();
    for (int i = 0; i < ep->n_msgs; i++)
        json_array_append_new(turns, json_pack("{s:s,s:s}", "role", ep->msgs[i].role, "content",
                                               ep->msgs[i].content));
    const prl_config *cfg = &w->model.cfg;
    json_object_set_new(o, "turns", turns);
    json_object_set_new(o, "truncated", json_boolean(ep->truncated));
    json_object_set_new(o, "turns_played", json_integer(ep->turns));
    if (ep->routes)
        json_object_set_new(o, "route_shape",
                            json_pack("[i,i,i,i]", ep->n_route_tokens, w->model.n_moe,
                                      cfg->num_experts_per_tok, prl_routes_width(cfg->n_routed_experts)));
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

static prl_status send_result(rollout_worker *w, const prl_bus_msg *work, int sample,
                              const prl_episode *ep)
{
    uint64_t lease = 0, step = 0, prompt = 0, ver = 0;
    prl_bus_msg_get_uint(work, "lease", &lease);
    prl_bus_msg_get_uint(work, "step", &step);
    prl_bus_msg_get_uint(work, "prompt", &prompt);
    prl_bus_msg_get_uint(work, "policy_version", &ver);
    char *meta = episode_meta(w, ep);
    size_t nr = (size_t)(ep->n - ep->prompt_len);
    prl_bus_msg m;
    prl_status rc = meta ? prl_bus_msg_init(&m, "result", w->role.run, ++w->role.next_id)
                         : prl_error_set(PRL_ERR_NOMEM, "result meta");
    if (rc) {
        free(meta);
        return rc;
    }
    rc = prl_bus_msg_set_uint(&m, "lease", lease);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "step", step);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "prompt", prompt);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "sample", (uint64_t)sample);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "policy_version", ver);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "prompt_len", (uint64_t)ep->prompt_len);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "gen_us", (uint64_t)(ep->gen_seconds * 1e6));
    if (!rc) rc = prl_bus_msg_set_uint(&m, "stop", (uint64_t)ep->stop);
    if (!rc) rc = prl_bus_msg_add_frame(&m, "tokens", PRL_BUS_I32, ep->ids, (size_t)ep->n);
    if (!rc) rc = prl_bus_msg_add_frame(&m, "logprobs", PRL_BUS_F32, ep->logprobs + ep->prompt_len, nr);
    if (!rc) rc = prl_bus_msg_add_frame(&m, "mask", PRL_BUS_U8, ep->mask + ep->prompt_len, nr);
    if (!rc && ep->routes)
        rc = prl_bus_msg_add_frame(&m, "routes", PRL_BUS_U8, ep->routes, ep->routes_bytes);
    if (!rc) rc = prl_bus_msg_add_frame(&m, "meta", PRL_BUS_BYTES, meta, strlen(meta));
    if (!rc) rc = prl_bus_send(w->role.ctl, NULL, &m);
    prl_bus_msg_free(&m);
    free(meta);
    return rc;
}

static prl_status do_work(void *ctx, prl_worker *role, const prl_bus_msg *m)
{
    rollout_worker *w = ctx;
    (void)role;
    uint64_t step = 0, prompt = 0, sample = 0, count = 0, ver = 0;
    const char *path = NULL;
    prl_status rc = prl_bus_msg_get_uint(m, "step", &step);
    if (!rc) rc = prl_bus_msg_get_uint(m, "prompt", &prompt);
    if (!rc) rc = prl_bus_msg_get_uint(m, "sample", &sample);
    if (!rc) rc = prl_bus_msg_get_uint(m, "count", &count);
    if (!rc) rc = prl_bus_msg_get_uint(m, "policy_version", &ver);
    if (!rc) rc = prl_bus_msg_get_str(m, "path", &path);
    if (!rc && (count < 1 || count > 1024 || sample > 1u << 20))
        rc = prl_error_set(PRL_ERR_ARG, "work: count %llu must be in 1..1024 and sample %llu at most 2^20",
                           (unsigned long long)count, (unsigned long long)sample);
    char *task_text = rc ? NULL : prl_bus_msg_text(m, "task");
    json_error_t je;
    json_t *task = task_text ? json_loads(task_text, 0, &je) : NULL;
    free(task_text);
    if (!rc && !json_is_object(task)) rc = prl_error_set(PRL_ERR_FORMAT, "work: frame 'task' is not a JSON object");
    if (!rc) rc = load_version(w, (int64_t)ver, path);
    json_t **tasks = calloc(count ? count : 1, sizeof *tasks);
    uint64_t *seq = calloc(count ? count : 1, sizeof *seq);
    prl_episode *eps = calloc(count ? count : 1, sizeof *eps);
    if (!rc && (!tasks || !seq || !eps)) rc = prl_error_set(PRL_ERR_NOMEM, "%llu episodes", (unsigned long long)count);
    for (uint64_t i = 0; !rc && i < count; i++) {
        prl_rng r; /* each sample's draws come from (run seed, step, prompt, sample) */
        prl_rng_init(&r, w->role.seed, step, prompt, sample + i, PRL_RNG_SAMPLE);
        tasks[i] = task, seq[i] = r.key;
    }
    prl_rollout_config rc_;
    prl_rollout_config_default(&rc_);
    const prl_job_config *j = &w->role.job;
    rc_.sampling.temperature = j->temperature, rc_.sampling.top_p = j->top_p;
    rc_.sampling.seed = w->role.seed, rc_.sampling.max_new_tokens = j->max_new_tokens;
    int32_t stops[2] = {PRL_TOKEN_END, PRL_TOKEN_EOS};
    rc_.sampling.stop_ids = stops, rc_.sampling.n_stop_ids = 2;
    rc_.max_turns = j->max_turns, rc_.score = 0;
    rc_.cached_routes = j->replay_cached; /* Cached R3 (docs/replay.md) */
    if (!rc) rc = prl_rollout_run(w->engine, w->tok, tasks, seq, (int)count, &rc_, &w->exec.exec, eps);
    for (uint64_t i = 0; !rc && i < count; i++) rc = send_result(w, m, (int)(sample + i), &eps[i]);
    for (uint64_t i = 0; eps && i < count; i++) prl_episode_free(&eps[i]);
    free(tasks), free(seq), free(eps);
    json_decref(task);
    return rc;
}

prl_status prl_role_rollout_run(const prl_worker_options *o)
{
    rollout_worker w = {.version = -1};
    prl_status rc = prl_worker_join(&w.role, "rollout", o);
    if (rc) return rc;
    if ((rc = prl_role_exec_open(&w.exec, o->sandbox, o->name, w.role.job.reward_timeout))) {
        prl_worker_leave(&w.role);
        return rc;
    }
    rc = prl_worker_serve(&w.role, "work", do_work, &w);
    unload(&w);
    prl_worker_log(&w.role, "programs answered from the exec cache: %llu", (unsigned long long)w.exec.hits);
    prl_role_exec_close(&w.exec);
    prl_worker_leave(&w.role);
    return rc;
}
