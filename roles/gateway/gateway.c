/*
** gateway.c — the gateway role (gateway.h, docs/gateway.md). Joined to a run (--connect),
** it is a worker of role "gateway" holding up to `slots` rollout leases at once: each `work`
** item becomes a group of episodes that outside agents claim and play over HTTP, and each
** ended episode goes back as the `result` of its sample (sent by this thread, the only one
** on the bus). Alone (--model), it serves a checkpoint and records nothing.
*/
#include "roles/gateway/internal.h"

#include "roles/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void gw_log(const char *fmt, const char *a)
{
    fprintf(stderr, "[gateway] ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
}

/* "http://HOST:PORT\n" into path, atomically (a reader never sees half an address). */
static prl_status write_addr(const char *path, const char *addr)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return prl_error_set(PRL_ERR_IO, "cannot write %s", tmp);
    int bad = fprintf(f, "%s\n", addr) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        unlink(tmp);
        return prl_error_set(PRL_ERR_IO, "cannot write %s", path);
    }
    return PRL_OK;
}

/* ---------------------------------------------------------------- joined to a run -- */

static prl_status on_work(void *ctx, prl_worker *w, const prl_bus_msg *m)
{
    gw *g = ctx;
    (void)w;
    prl_msg_work x;
    prl_status rc = prl_msg_work_decode(m, &x);
    if (rc) return rc;
    char *task = json_dumps(x.task_json, JSON_COMPACT);
    pthread_mutex_lock(&g->mu);
    rc = task ? gw_group_add(g, x.lease, x.step, x.prompt, x.sample, (int)x.count, x.policy_version,
                             x.eval, task)
              : prl_error_set(PRL_ERR_NOMEM, "task");
    if (!rc) gw_engine_want(g, (int64_t)x.policy_version, x.path);
    pthread_mutex_unlock(&g->mu);
    free(task);
    prl_msg_work_free(&x);
    return rc;
}

/* Between messages: end silent episodes, send the results of ended ones. */
static prl_status on_idle(void *ctx, prl_worker *w)
{
    gw *g = ctx;
    pthread_mutex_lock(&g->mu);
    gw_episodes_sweep(g, prl_now());
    for (;;) {
        prl_bus_msg m;
        if (!gw_episodes_next_result(g, w->run, w->next_id + 1, &m)) break;
        w->next_id++;
        pthread_mutex_unlock(&g->mu);
        prl_status rc = prl_worker_send(w, &m);
        pthread_mutex_lock(&g->mu);
        if (rc) prl_worker_log(w, "result not sent: %s", prl_error_message());
    }
    pthread_mutex_unlock(&g->mu);
    return PRL_OK;
}

static void configure_from_job(gw *g, const prl_job_config *j)
{
    g->max_body = (size_t)j->gateway_max_body;
    g->client_timeout = j->gateway_client_timeout, g->episode_timeout = j->gateway_episode_timeout;
    g->default_max_tokens = j->max_new_tokens;
    g->default_temperature = j->temperature, g->default_top_p = j->top_p;
    snprintf(g->precision, sizeof g->precision, "%s", j->precision);
    g->max_batch = 32;
}

static prl_status serve_run(gw *g, const prl_gateway_options *o)
{
    prl_worker w;
    prl_worker_options wo = {.connect = o->connect,
                             .name = o->name ? o->name : "gateway-0",
                             .allow_remote = o->allow_remote,
                             .key = o->key,
                             .slots = o->slots > 0 ? o->slots : 64};
    prl_status rc = prl_worker_join(&w, "gateway", &wo);
    if (rc) return rc;
    configure_from_job(g, &w.job);
    g->connected = 1, g->seed = w.seed;
    snprintf(g->model_name, sizeof g->model_name, "%s", w.job.name);
    char bound[160], addr_path[1200];
    gw_http *h = NULL;
    rc = gw_http_start(g, o->bind ? o->bind : w.job.gateway_bind,
                       o->allow_remote || w.job.gateway_allow_remote, &h, bound, sizeof bound);
    if (!rc) snprintf(addr_path, sizeof addr_path, "%s/gateway.addr", w.run_dir);
    if (!rc) rc = write_addr(o->addr_file ? o->addr_file : addr_path, bound);
    if (!rc) rc = gw_engine_start(g);
    if (!rc) {
        prl_worker_log(&w, "serving model '%s' at %s (%d groups at once)", g->model_name, bound,
                       wo.slots);
        if (strcmp(w.job.rollout_source, "gateway"))
            prl_worker_log(&w,
                           "the run's rollout.source is %s: its rollout workers get the "
                           "groups, this gateway none",
                           w.job.rollout_source);
        rc = prl_worker_serve_idle(&w, "work", on_work, on_idle, g);
    }
    gw_engine_stop(g);
    gw_http_stop(h);
    prl_worker_log(&w, "served %llu requests (%llu refused), %llu tokens",
                   (unsigned long long)g->served, (unsigned long long)g->refused,
                   (unsigned long long)g->tokens_out);
    prl_worker_leave(&w);
    return rc;
}

/* ---------------------------------------------------------------- alone ------------ */

static prl_status serve_alone(gw *g, const prl_gateway_options *o)
{
    g->max_body = o->max_body > 0 ? (size_t)o->max_body : 1 << 20;
    g->client_timeout = o->client_timeout > 0 ? o->client_timeout : 30;
    g->episode_timeout = 300;
    g->default_max_tokens = o->max_tokens > 0 ? o->max_tokens : 96;
    g->default_temperature = 1.0, g->default_top_p = 1.0;
    snprintf(g->precision, sizeof g->precision, "fp32");
    g->max_batch = o->max_batch > 0 ? o->max_batch : 16;
    snprintf(g->model_name, sizeof g->model_name, "prl");
    g->seed = 1;
    prl_status rc = gw_engine_load(g, 0, o->model);
    char bound[160];
    gw_http *h = NULL;
    if (!rc) rc = gw_http_start(g, o->bind, o->allow_remote, &h, bound, sizeof bound);
    if (!rc && o->addr_file) rc = write_addr(o->addr_file, bound);
    if (!rc) rc = gw_engine_start(g);
    if (!rc) {
        gw_log("serving model 'prl' at %s", bound);
        const volatile sig_atomic_t *stop = prl_role_stop_flag();
        while (!*stop) usleep(100000);
    }
    gw_engine_stop(g);
    gw_http_stop(h);
    fprintf(stderr, "[gateway] served %llu requests (%llu refused), %llu tokens\n",
            (unsigned long long)g->served, (unsigned long long)g->refused,
            (unsigned long long)g->tokens_out);
    return rc;
}

prl_status prl_role_gateway_run(const prl_gateway_options *o)
{
    if (!o->connect == !o->model)
        return prl_error_set(PRL_ERR_ARG, "the gateway needs --connect ENDPOINT (a run) or "
                                          "--model DIR (a checkpoint alone), not both");
    if (!o->connect && !o->bind) return prl_error_set(PRL_ERR_ARG, "--model needs --bind");
    gw g0, *g = &g0;
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->version = -1, g->want_version = -1;
    prl_status rc = o->connect ? serve_run(g, o) : serve_alone(g, o);
    gw_groups_free(g); /* episodes still in flight are played again: their leases go back */
    gw_engine_free(g);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    return rc;
}
