/*
** role.c — what every worker role (rollout, reward, trainer) does to take part in a run:
** connect to the controller, say hello, receive the run's welcome (run dir, seed, job
** config), keep a heartbeat going from a thread with its own socket, and stop on SIGTERM,
** SIGINT or a `stop` message (docs/pipeline.md).
*/
#include "cli/cli.h"
#include "sandbox/sandbox.h"

#include <stdarg.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    (void)sig;
    stop_signal = 1;
}

void cli_role_install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int cli_role_stopping(const cli_role *r)
{
    return stop_signal || (r && r->stop);
}

void cli_role_log(const cli_role *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%s] ", r->worker);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void *heartbeat_main(void *arg)
{
    cli_role *r = arg;
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    char id[80];
    snprintf(id, sizeof id, "%s.hb", r->worker);
    o.identity = id, o.name = id, o.send_timeout_ms = 1000;
    prl_bus_socket *s = NULL;
    if (prl_bus_socket_open(&s, PRL_BUS_DEALER, r->endpoint, &o)) {
        cli_role_log(r, "heartbeat socket: %s", prl_error_message());
        return NULL;
    }
    uint64_t n = 0;
    while (!r->hb_quit && !cli_role_stopping(r)) {
        prl_bus_msg m;
        if (!prl_bus_msg_init(&m, "heartbeat", r->run, ++n)) {
            prl_bus_msg_set_str(&m, "worker", r->worker);
            prl_bus_send(s, NULL, &m); /* a lost beat is the next one's job */
            prl_bus_msg_free(&m);
        }
        for (double t = 0; t < r->heartbeat_s && !r->hb_quit && !cli_role_stopping(r); t += 0.05)
            usleep(50000);
    }
    prl_bus_socket_free(s);
    return NULL;
}

/* Send hello and wait for the welcome, re-sending hello every second (the controller may
** still be starting, or restarting). */
static prl_status greet(cli_role *r, double timeout_s)
{
    double t_end = prl_now() + timeout_s, t_next = 0;
    while (!cli_role_stopping(r)) {
        double now = prl_now();
        if (now > t_end)
            return prl_error_set(PRL_ERR_IO, "no welcome from the controller at %s after %.0f s",
                                 r->endpoint, timeout_s);
        if (now >= t_next) {
            prl_status rc = cli_role_send_hello(r);
            if (rc) return rc;
            t_next = now + 1.0;
        }
        prl_bus_msg m;
        int got = 0;
        prl_status rc = prl_bus_recv(r->ctl, 200, &m, NULL, &got);
        if (rc) return rc;
        if (!got) continue;
        if (!strcmp(m.type, "welcome")) {
            rc = cli_role_take_welcome(r, &m);
            prl_bus_msg_free(&m);
            if (!rc) return rc;
            cli_role_log(r, "ignored a 'welcome' message: %s", prl_error_message());
            continue;
        }
        cli_role_log(r, "ignored '%s' before the welcome", m.type);
        prl_bus_msg_free(&m);
    }
    return prl_error_set(PRL_ERR_IO, "stopped before the welcome");
}

prl_status cli_role_send_hello(cli_role *r)
{
    prl_bus_msg m;
    prl_status rc = prl_bus_msg_init(&m, "hello", r->run[0] ? r->run : "-", ++r->next_id);
    if (!rc) rc = prl_bus_msg_set_str(&m, "role", r->role);
    if (!rc) rc = prl_bus_msg_set_str(&m, "worker", r->worker);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "pid", (uint64_t)getpid());
    if (!rc) rc = prl_bus_send(r->ctl, NULL, &m);
    prl_bus_msg_free(&m);
    return rc;
}

prl_status cli_role_take_welcome(cli_role *r, const prl_bus_msg *m)
{
    const char *run = NULL, *dir = NULL;
    uint64_t seed = 0;
    prl_status rc = prl_bus_msg_get_str(m, "run", &run);
    if (!rc) rc = prl_bus_msg_get_str(m, "run_dir", &dir);
    if (!rc) rc = prl_bus_msg_get_uint(m, "seed", &seed);
    if (rc) return rc;
    char *text = prl_bus_msg_text(m, "config");
    if (!text) return PRL_ERR_FORMAT;
    prl_job_config job; /* the role's config changes only when the new one is valid */
    prl_job_config_default(&job);
    rc = prl_job_config_parse(&job, text, "the controller's welcome");
    free(text);
    if (rc) {
        prl_job_config_free(&job);
        return rc;
    }
    prl_job_config_free(&r->job);
    r->job = job;
    snprintf(r->run, sizeof r->run, "%s", run);
    snprintf(r->run_dir, sizeof r->run_dir, "%s", dir);
    r->seed = seed;
    r->heartbeat_s = r->job.heartbeat_seconds;
    return PRL_OK;
}

prl_status cli_role_join(cli_role *r, const char *role, const char *worker, const char *endpoint,
                         int allow_remote)
{
    memset(r, 0, sizeof *r);
    r->role = role;
    snprintf(r->worker, sizeof r->worker, "%s", worker);
    snprintf(r->endpoint, sizeof r->endpoint, "%s", endpoint);
    r->heartbeat_s = 2.0;
    prl_job_config_default(&r->job);
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.identity = r->worker, o.name = r->worker, o.allow_remote = allow_remote;
    prl_status rc = prl_bus_socket_open(&r->ctl, PRL_BUS_DEALER, endpoint, &o);
    if (!rc) rc = greet(r, 120.0);
    if (!rc && pthread_create(&r->hb, NULL, heartbeat_main, r) == 0) r->hb_running = 1;
    if (rc) cli_role_leave(r);
    return rc;
}

void cli_role_leave(cli_role *r)
{
    r->hb_quit = 1;
    if (r->hb_running) pthread_join(r->hb, NULL);
    r->hb_running = 0;
    prl_bus_socket_free(r->ctl);
    r->ctl = NULL;
    prl_job_config_free(&r->job);
}

prl_status cli_role_next(cli_role *r, int timeout_ms, prl_bus_msg *m, int *got)
{
    *got = 0;
    prl_status rc = prl_bus_recv(r->ctl, timeout_ms, m, NULL, got);
    if (rc || !*got) return rc;
    if (!strcmp(m->type, "stop")) {
        r->stop = 1;
        prl_bus_msg_free(m);
        *got = 0;
    } else if (!strcmp(m->type, "welcome")) { /* the controller restarted and greeted again */
        if (cli_role_take_welcome(r, m))
            cli_role_log(r, "ignored a 'welcome' message: %s", prl_error_message());
        prl_bus_msg_free(m);
        *got = 0;
    } else if (!strcmp(m->type, "error")) {
        const char *why = NULL;
        prl_bus_msg_get_str(m, "reason", &why);
        cli_role_log(r, "controller: %s", why ? why : "?");
        if (why && strstr(why, "say hello")) rc = cli_role_send_hello(r);
        prl_bus_msg_free(m);
        *got = 0;
    }
    return rc;
}

/* The cache key of a run: everything the result depends on. */
static uint64_t exec_key(const prl_reward_exec_request *q)
{
    uint64_t k = prl_checksum64(q->lang, strlen(q->lang), 0x5eed);
    k = prl_checksum64(q->program, strlen(q->program), k);
    k = prl_checksum64(q->stdin_data ? q->stdin_data : "", q->stdin_len, k);
    return prl_hash64(k ^ (uint64_t)(q->wall_s * 1e6));
}

static prl_status copy_result(prl_reward_exec_result *to, const prl_reward_exec_result *from)
{
    *to = *from;
    to->stdout_data = malloc(from->stdout_len + 1);
    to->stderr_data = malloc(from->stderr_len + 1);
    if (!to->stdout_data || !to->stderr_data) {
        prl_reward_exec_result_free(to);
        return prl_error_set(PRL_ERR_NOMEM, "cached exec result");
    }
    memcpy(to->stdout_data, from->stdout_data ? from->stdout_data : "", from->stdout_len);
    memcpy(to->stderr_data, from->stderr_data ? from->stderr_data : "", from->stderr_len);
    to->stdout_data[from->stdout_len] = 0, to->stderr_data[from->stderr_len] = 0;
    return PRL_OK;
}

/* Samples of one group often hold the same program, run on the same test inputs: answer a
** repeat from memory. Only outcomes that do not depend on the machine's load are kept ("ok"
** and "runtime_error": a program that finished), so a cached answer is the answer a new run
** would give. Slot i of a direct-mapped table holds the newest run with key % size == i. */
static prl_status exec_cached(void *ctx, const prl_reward_exec_request *q, prl_reward_exec_result *res)
{
    cli_role_exec *x = ctx;
    uint64_t k = exec_key(q);
    cli_exec_cache_entry *e = &x->cache[k % CLI_EXEC_CACHE];
    if (e->used && e->key == k) {
        x->hits++;
        return copy_result(res, &e->result);
    }
    prl_status rc = x->inner.fn(x->inner.ctx, q, res);
    if (rc || (strcmp(res->status, "ok") && strcmp(res->status, "runtime_error"))) return rc;
    if (e->used) prl_reward_exec_result_free(&e->result);
    e->used = 0;
    if (copy_result(&e->result, res) == PRL_OK) e->used = 1, e->key = k;
    return PRL_OK;
}

prl_status cli_role_exec_open(cli_role_exec *x, const char *sandbox, const char *worker,
                              double wall_s)
{
    memset(x, 0, sizeof *x);
    x->cache = calloc(CLI_EXEC_CACHE, sizeof *x->cache);
    if (!x->cache) return prl_error_set(PRL_ERR_NOMEM, "exec cache");
    x->exec = (prl_reward_exec){.fn = exec_cached, .ctx = x, .wall_s = wall_s};
    x->inner.wall_s = wall_s;
    if (!sandbox) { /* no service: a sandbox of this process's own */
        x->local = cli_exec_new();
        if (!x->local) return prl_error_set(PRL_ERR_NOMEM, "executor");
        x->inner.fn = cli_exec_sandboxed, x->inner.ctx = x->local;
        return PRL_OK;
    }
    char name[96];
    snprintf(name, sizeof name, "%s.sandbox", worker);
    prl_status rc = prl_sandbox_client_open(&x->svc, sandbox, name);
    if (rc) return rc;
    x->inner.fn = cli_exec_service, x->inner.ctx = x->svc;
    return PRL_OK;
}

void cli_role_exec_close(cli_role_exec *x)
{
    for (int i = 0; x->cache && i < CLI_EXEC_CACHE; i++)
        if (x->cache[i].used) prl_reward_exec_result_free(&x->cache[i].result);
    free(x->cache);
    cli_exec_free(x->local);
    prl_sandbox_client_free(x->svc);
    memset(x, 0, sizeof *x);
}

void cli_role_refuse(cli_role *r, const prl_bus_msg *m, const char *why)
{
    uint64_t lease = 0, id = 0;
    prl_bus_msg_get_uint(m, "lease", &lease);
    prl_bus_msg_get_uint(m, "id", &id);
    cli_role_log(r, "cannot do lease %llu (%s): %s", (unsigned long long)lease, m->type, why);
    prl_bus_msg e;
    if (prl_bus_msg_init(&e, "error", r->run, ++r->next_id)) return;
    prl_bus_msg_set_str(&e, "reason", why);
    prl_bus_msg_set_uint(&e, "ref", id);
    prl_bus_msg_set_uint(&e, "lease", lease);
    if (prl_bus_send(r->ctl, NULL, &e)) cli_role_log(r, "error report not sent: %s", prl_error_message());
    prl_bus_msg_free(&e);
}

const volatile sig_atomic_t *cli_role_stop_flag(void)
{
    return &stop_signal;
}
