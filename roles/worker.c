/*
** worker.c — the one loop of every worker role (internal.h): connect to the controller, say
** hello, receive the run's welcome (run dir, seed, job config), keep a heartbeat going from a
** thread with its own socket, serve the role's work type, and stop on SIGTERM, SIGINT or a
** `stop` message (docs/pipeline.md).
*/
#include "roles/internal.h"

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

void prl_role_install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int prl_worker_stopping(const prl_worker *r) { return stop_signal || (r && r->stop); }

void prl_worker_log(const prl_worker *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%s] ", r->worker);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const char CTL_ERROR[] = "controller error", IGNORED[] = "ignored message";

/* A line of a kind a peer's messages can flood: rate-limited (bus.h, prl_bus_log_limit). */
static void __attribute__((format(printf, 4, 5)))
log_limited(prl_worker *r, prl_bus_log_limit *l, const char *kind, const char *fmt, ...)
{
    uint64_t held;
    if (!prl_bus_log_limit_take(l, prl_now(), &held)) return;
    char line[1200];
    if (held) {
        prl_bus_log_held_line(held, kind, line, sizeof line);
        prl_worker_log(r, "%s", line);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    prl_worker_log(r, "%s", line);
}

static void *heartbeat_main(void *arg)
{
    prl_worker *r = arg;
    prl_bus_socket_options o;
    char id[80];
    snprintf(id, sizeof id, "%s.hb", r->worker);
    prl_worker_socket_options(r, id, &o);
    o.send_timeout_ms = 1000;
    prl_bus_socket *s = NULL;
    if (prl_bus_socket_open(&s, PRL_BUS_DEALER, r->endpoint, &o)) {
        prl_worker_log(r, "heartbeat socket: %s", prl_error_message());
        return NULL;
    }
    uint64_t n = 0;
    while (!r->hb_quit && !prl_worker_stopping(r)) {
        prl_bus_msg m;
        prl_msg_heartbeat hb = {.worker = r->worker};
        if (!prl_msg_heartbeat_encode(&hb, r->run, ++n, &m)) {
            prl_bus_send(s, NULL, &m); /* a lost beat is the next one's job */
            prl_bus_msg_free(&m);
        }
        for (double t = 0; t < r->heartbeat_s && !r->hb_quit && !prl_worker_stopping(r); t += 0.05)
            usleep(50000);
    }
    prl_bus_socket_free(s);
    return NULL;
}

static prl_status send_hello(prl_worker *r);
static prl_status take_welcome(prl_worker *r, const prl_bus_msg *m);

/* Send hello and wait for the welcome, re-sending hello every second (the controller may
** still be starting, or restarting). */
static prl_status greet(prl_worker *r, double timeout_s)
{
    double t_end = prl_now() + timeout_s, t_next = 0;
    while (!prl_worker_stopping(r)) {
        double now = prl_now();
        if (now > t_end)
            return prl_error_set(PRL_ERR_IO, "no welcome from the controller at %s after %.0f s%s",
                                 r->endpoint, timeout_s,
                                 r->curve_on ? " (CURVE: is this worker's public.key on the "
                                               "controller's allow-list, and --server-key the "
                                               "controller's public.key? Its log names refused "
                                               "keys)"
                                             : "");
        if (now >= t_next) {
            prl_status rc = send_hello(r);
            if (rc) return rc;
            t_next = now + 1.0;
        }
        prl_bus_msg m;
        int got = 0;
        prl_status rc = prl_bus_recv(r->ctl, 200, &m, NULL, &got);
        if (rc) return rc;
        if (!got) continue;
        if (!strcmp(m.type, "welcome")) {
            rc = take_welcome(r, &m);
            prl_bus_msg_free(&m);
            if (!rc) return rc;
            prl_worker_log(r, "ignored a 'welcome' message: %s", prl_error_message());
            continue;
        }
        prl_worker_log(r, "ignored '%s' before the welcome", m.type);
        prl_bus_msg_free(&m);
    }
    return prl_error_set(PRL_ERR_IO, "stopped before the welcome");
}

static prl_status send_hello(prl_worker *r)
{
    prl_bus_msg m;
    prl_msg_hello h = {.role = r->role,
                       .worker = r->worker,
                       .pid = (uint64_t)getpid(),
                       .slots = (uint64_t)(r->slots > 1 ? r->slots : 1)};
    prl_status rc = prl_msg_hello_encode(&h, r->run[0] ? r->run : "-", ++r->next_id, &m);
    return rc ? rc : prl_worker_send(r, &m);
}

prl_status prl_worker_send(prl_worker *w, prl_bus_msg *m)
{
    prl_status rc = prl_bus_send(w->ctl, NULL, m);
    prl_bus_msg_free(m);
    return rc;
}

/* The welcome's run, directory, seed and job config; the worker's config changes only when the
** new one is valid. */
static prl_status take_welcome(prl_worker *r, const prl_bus_msg *m)
{
    prl_msg_welcome w;
    prl_status rc = prl_msg_welcome_decode(m, &w);
    if (rc) return rc;
    prl_job_config_free(&r->job);
    r->job = w.job; /* moved: w is not freed */
    snprintf(r->run, sizeof r->run, "%s", prl_bus_msg_run(m));
    snprintf(r->run_dir, sizeof r->run_dir, "%s", w.run_dir);
    r->seed = w.seed;
    r->heartbeat_s = r->job.heartbeat_seconds;
    return PRL_OK;
}

prl_status prl_role_load_secret(const char *key, const char *endpoint, prl_bus_secret *out)
{
    char path[1100];
    prl_status rc = key ? PRL_OK : prl_bus_key_path_for(endpoint, path, sizeof path);
    if (!rc) rc = prl_bus_key_load(key ? key : path, out);
    return rc;
}

void prl_worker_socket_options(const prl_worker *w, const char *id, prl_bus_socket_options *o)
{
    prl_bus_socket_options_default(o);
    o->identity = id, o->name = id, o->registry = prl_msg_registry();
    o->allow_remote = w->curve_on;
    if (w->curve_on) o->curve = &w->curve, o->curve_server = w->server_pub;
    else o->secret = w->secret.hex;
}

/* The worker's key: its CURVE keypair and the controller's public key, or the run's secret. */
static prl_status load_keys(prl_worker *r, const prl_worker_options *opt)
{
    if (!opt->curve_keys != !opt->server_key)
        return prl_error_set(PRL_ERR_ARG, "--curve-keys and --server-key go together");
    if (!opt->curve_keys) return prl_role_load_secret(opt->key, opt->connect, &r->secret);
    prl_status rc = prl_bus_curve_load(opt->curve_keys, &r->curve);
    if (!rc) rc = prl_bus_curve_public_load(opt->server_key, r->server_pub);
    r->curve_on = rc == PRL_OK;
    return rc;
}

prl_status prl_worker_exec_open(prl_worker *w, const prl_worker_options *o, prl_role_exec *x)
{
    double wall = w->job.reward_timeout;
    if (!o->sandbox_key) return prl_role_exec_open(x, o->sandbox, o->name, w->secret.hex, wall);
    if (!o->sandbox || !w->curve_on)
        return prl_error_set(PRL_ERR_ARG, "--sandbox-key needs --sandbox and --curve-keys");
    char pub[PRL_BUS_CURVE_Z85 + 1];
    prl_status rc = prl_bus_curve_public_load(o->sandbox_key, pub);
    return rc ? rc : prl_role_exec_open_curve(x, o->sandbox, o->name, &w->curve, pub, wall);
}

prl_status prl_worker_join(prl_worker *r, const char *role, const prl_worker_options *opt)
{
    memset(r, 0, sizeof *r);
    r->role = role;
    r->slots = opt->slots;
    snprintf(r->worker, sizeof r->worker, "%s", opt->name);
    snprintf(r->endpoint, sizeof r->endpoint, "%s", opt->connect);
    r->heartbeat_s = 2.0;
    prl_job_config_default(&r->job);
    prl_bus_socket_options o;
    prl_status rc = load_keys(r, opt);
    prl_worker_socket_options(r, r->worker, &o);
    o.allow_remote = opt->allow_remote;
    if (!rc) rc = prl_bus_socket_open(&r->ctl, PRL_BUS_DEALER, opt->connect, &o);
    if (!rc) rc = greet(r, 120.0);
    if (!rc && pthread_create(&r->hb, NULL, heartbeat_main, r) == 0) r->hb_running = 1;
    if (rc) prl_worker_leave(r);
    return rc;
}

void prl_worker_leave(prl_worker *r)
{
    r->hb_quit = 1;
    if (r->hb_running) pthread_join(r->hb, NULL);
    r->hb_running = 0;
    prl_bus_socket_free(r->ctl);
    r->ctl = NULL;
    prl_job_config_free(&r->job);
    char held[200];
    if (prl_bus_log_limit_held_line(&r->ctl_error_log, CTL_ERROR, held, sizeof held))
        prl_worker_log(r, "%s", held);
    if (prl_bus_log_limit_held_line(&r->ignored_log, IGNORED, held, sizeof held))
        prl_worker_log(r, "%s", held);
}

/* The next message for the role, up to timeout_ms. stop, welcome and error messages are
** handled here (*got stays 0): stop sets r->stop; a re-welcome updates the run; an error
** asking to say hello is answered. */
int prl_worker_control(prl_worker *r, prl_bus_msg *m, prl_status *rc)
{
    *rc = PRL_OK;
    if (!strcmp(m->type, "stop")) {
        r->stop = 1;
    } else if (!strcmp(m->type, "welcome")) { /* the controller restarted and greeted again */
        if (take_welcome(r, m))
            log_limited(r, &r->ignored_log, IGNORED, "ignored a 'welcome' message: %s",
                        prl_error_message());
    } else if (!strcmp(m->type, "error")) {
        prl_msg_error e;
        const char *why = prl_msg_error_decode(m, &e) ? NULL : e.reason;
        log_limited(r, &r->ctl_error_log, CTL_ERROR, "controller: %s", why ? why : "?");
        if (why && strstr(why, "say hello")) *rc = send_hello(r);
    } else {
        return 0;
    }
    prl_bus_msg_free(m);
    return 1;
}

static prl_status next_message(prl_worker *r, int timeout_ms, prl_bus_msg *m, int *got)
{
    *got = 0;
    prl_status rc = prl_bus_recv(r->ctl, timeout_ms, m, NULL, got);
    if (rc || !*got) return rc;
    if (prl_worker_control(r, m, &rc)) *got = 0;
    return rc;
}

/* Tell the controller this worker cannot do work item m (an `error` naming the lease, which
** the controller hands out again, at most a few times) and log it. */
static void refuse(prl_worker *r, const prl_bus_msg *m, const char *why)
{
    uint64_t lease = 0, id = prl_bus_msg_id(m);
    prl_bus_msg_get_uint(m, "lease", &lease); /* every work item has one */
    prl_worker_log(r, "cannot do lease %llu (%s): %s", (unsigned long long)lease, m->type, why);
    prl_bus_msg e;
    prl_msg_error x = {.reason = why, .ref = id, .lease = lease, .has_lease = 1};
    if (prl_msg_error_encode(&x, r->run, ++r->next_id, &e) || prl_worker_send(r, &e))
        prl_worker_log(r, "error report not sent: %s", prl_error_message());
}

const volatile sig_atomic_t *prl_role_stop_flag(void) { return &stop_signal; }

prl_status prl_worker_serve(prl_worker *w, const char *work_type, prl_worker_fn fn, void *ctx)
{
    return prl_worker_serve_idle(w, work_type, fn, NULL, ctx);
}

prl_status prl_worker_serve_idle(prl_worker *w, const char *work_type, prl_worker_fn fn,
                                 prl_worker_idle_fn idle, void *ctx)
{
    while (!prl_worker_stopping(w)) {
        prl_bus_msg m;
        int got = 0;
        prl_status rc = next_message(w, idle ? 50 : 200, &m, &got);
        if (!rc && idle) rc = idle(ctx, w);
        if (rc) {
            if (got) prl_bus_msg_free(&m);
            return rc;
        }
        if (!got) continue;
        if (strcmp(m.type, work_type))
            log_limited(w, &w->ignored_log, IGNORED, "ignored a '%s' message", m.type);
        else if (fn(ctx, w, &m)) refuse(w, &m, prl_error_message());
        prl_bus_msg_free(&m);
    }
    return PRL_OK;
}
