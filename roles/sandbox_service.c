/*
** sandbox_service.c — the sandbox as a service process (`prl role sandbox`): a ROUTER bound at the
** service endpoint receives `exec` {lang, wall_ms; frames program, stdin}, runs the program
** in one slot of a prl_sandbox and answers `exec_result` {ref, status, exit_code, wall_us;
** frames stdout, stderr} to the sender (docs/pipeline.md "Sandbox service").
**
** Threads: the main thread owns the socket (ZeroMQ sockets are not thread-safe); one worker
** thread per slot takes requests from a FIFO queue and runs them, so up to `slots` programs
** run at once. A finished job goes to a done list and a byte on a pipe wakes the main
** thread, which polls the socket and the pipe together and sends the reply.
**
** What it refuses: invalid messages are dropped and logged by the bus (never seen here);
** valid ones that make no sense — an unknown lang, wall_ms 0 or above the maximum, an empty
** program or one with a NUL byte, a type other than exec/stop — get an `error` naming the
** field. It does not deduplicate: a re-sent request runs again, which is harmless because a
** run has no effect outside its sandbox.
*/
#include "bus/bus.h"
#include "roles/msg/msg.h"
#include "roles/roles.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

enum { MAX_QUEUED = 4096 }; /* requests waiting for a slot before the service refuses more */

/* One request: the decoded message (owns the program and stdin frames), its sender and,
** once run, the result. Owned by whichever list holds it. */
typedef struct svc_job {
    struct svc_job *next;
    prl_bus_msg msg;
    prl_msg_exec exec; /* the request, decoded: views into msg */
    prl_bus_peer peer;
    prl_sandbox_result res;
} svc_job;

typedef struct svc {
    const char *name;
    prl_sandbox *sb;
    prl_bus_socket *sock;
    int auth; /* the socket asks for the run's key: `stop` only from the launcher */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    svc_job *todo, *todo_tail, *done; /* guarded by mu */
    int queued, stopping;             /* guarded by mu */
    int wake[2];                      /* workers → main: "a job is done" */
    pthread_t *threads;
    int n_threads;
    uint64_t next_id;
    prl_sandbox_service_stats stats;
} svc;

/* ---------------------------------------------------------------- signals ---------- */

static volatile sig_atomic_t stop_signal;
static int signal_wake_fd = -1;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
    if (signal_wake_fd >= 0) {
        ssize_t w = write(signal_wake_fd, "s", 1); /* the main thread's poll returns */
        (void)w;
    }
}

/* No SA_RESTART: a blocking zmq_poll returns EINTR at once. */
static void install_stop_handlers(struct sigaction old[2])
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old[0]);
    sigaction(SIGINT, &sa, &old[1]);
}

static void restore_stop_handlers(const struct sigaction old[2])
{
    sigaction(SIGTERM, &old[0], NULL);
    sigaction(SIGINT, &old[1], NULL);
}

/* ---------------------------------------------------------------- log -------------- */

static void svc_log(const svc *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void svc_log(const svc *s, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "prl %s: %s\n", s->name, line);
}

/* ---------------------------------------------------------------- workers ---------- */

static void job_free(svc_job *j)
{
    prl_bus_msg_free(&j->msg);
    prl_sandbox_result_free(&j->res);
    free(j);
}

/* Run a validated exec in `slot`. The program has no NUL (checked), but is not
** NUL-terminated; the sandbox takes it by length. */
static void job_run(svc *s, int slot, svc_job *j)
{
    prl_msg_exec x = j->exec;
    prl_sandbox_request req = {.lang = x.lang,
                               .program = x.program,
                               .program_len = x.program_len,
                               .stdin_data = x.stdin_data,
                               .stdin_len = x.stdin_len};
    prl_sandbox_limits_default(&req.limits);
    req.limits.wall_seconds = (double)x.wall_ms / 1000.0;
    req.limits.cpu_seconds = req.limits.wall_seconds + 1; /* the wall limit decides */
    prl_sandbox_run(s->sb, slot, &req, &j->res);          /* a failure is a sandbox_error result */
}

typedef struct worker_arg {
    svc *s;
    int slot;
} worker_arg;

static void *worker_main(void *p)
{
    worker_arg *a = p;
    svc *s = a->s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->todo && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
        svc_job *j = s->todo;
        if (!j) { /* stopping and nothing left */
            pthread_mutex_unlock(&s->mu);
            break;
        }
        s->todo = j->next;
        if (!s->todo) s->todo_tail = NULL;
        s->queued--;
        pthread_mutex_unlock(&s->mu);

        job_run(s, a->slot, j);

        pthread_mutex_lock(&s->mu);
        j->next = s->done;
        s->done = j;
        pthread_mutex_unlock(&s->mu);
        ssize_t w = write(s->wake[1], "d", 1);
        (void)w; /* a full pipe already holds a wake-up */
    }
    free(a);
    return NULL;
}

/* Start one worker per slot with SIGTERM/SIGINT blocked, so that the signals reach the
** main thread's poll. */
static prl_status start_workers(svc *s, int n)
{
    s->threads = calloc((size_t)n, sizeof *s->threads);
    if (!s->threads) return prl_error_set(PRL_ERR_NOMEM, "sandbox service: threads");
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    prl_status rc = PRL_OK;
    for (int i = 0; i < n && rc == PRL_OK; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a) *a = (worker_arg){s, i};
        if (!a || pthread_create(&s->threads[i], NULL, worker_main, a) != 0) {
            free(a);
            rc = prl_error_set(PRL_ERR_NOMEM, "sandbox service: starting worker %d", i);
        } else {
            s->n_threads++;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* Discard queued requests, let running ones finish, join every worker. */
static void stop_workers(svc *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    while (s->todo) {
        svc_job *j = s->todo;
        s->todo = j->next;
        job_free(j);
    }
    s->todo_tail = NULL;
    s->queued = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->n_threads; i++) pthread_join(s->threads[i], NULL);
    free(s->threads);
    s->threads = NULL;
    s->n_threads = 0;
}

/* ---------------------------------------------------------------- replies ---------- */

/* Send `m` to `peer`; a client that has gone (re-created its socket, died) is not an error
** of the service: count it and go on. */
static void reply_send(svc *s, const prl_bus_peer *peer, const prl_bus_msg *m)
{
    if (prl_bus_send(s->sock, peer, m) != PRL_OK) {
        s->stats.unsent++;
        svc_log(s, "reply not delivered: %s", prl_error_message());
    }
}

/* A reply to request `req` goes to the same run, with ref = the request's id. */
static const char *req_run(const prl_bus_msg *req)
{
    const char *run = prl_bus_msg_run(req);
    return run[0] ? run : "sandbox";
}

static void reply_error(svc *s, const prl_bus_peer *peer, const prl_bus_msg *req,
                        const char *reason)
{
    prl_bus_msg m;
    s->stats.refused++;
    prl_msg_error x = {.reason = reason, .ref = prl_bus_msg_id(req)};
    if (prl_msg_error_encode(&x, req_run(req), ++s->next_id, &m) == PRL_OK) reply_send(s, peer, &m);
    else svc_log(s, "building an error reply: %s", prl_error_message());
    prl_bus_msg_free(&m);
}

/* exec_result of a finished job. A run that never started (sandbox_error) has no exit
** code on the wire (the field is unsigned): it is sent as 0, and its reason as stderr. */
static void reply_result(svc *s, svc_job *j)
{
    const prl_sandbox_result *r = &j->res;
    int never = r->status == PRL_SANDBOX_STATUS_SANDBOX_ERROR;
    const char *err = never ? r->reason : r->err;
    size_t err_len = never ? strlen(r->reason) : r->err_len;
    prl_msg_exec_result x = {.ref = prl_bus_msg_id(&j->msg),
                             .status = prl_sandbox_status_name(r->status),
                             .exit_code = never || r->exit_code < 0 ? 0 : (uint64_t)r->exit_code,
                             .wall_us = (uint64_t)(r->wall_seconds * 1e6),
                             .out = r->out,
                             .out_len = never ? 0 : r->out_len,
                             .err = err,
                             .err_len = err_len};
    prl_bus_msg m;
    if (prl_msg_exec_result_encode(&x, req_run(&j->msg), ++s->next_id, &m) == PRL_OK)
        reply_send(s, &j->peer, &m);
    else svc_log(s, "building an exec_result: %s", prl_error_message());
    prl_bus_msg_free(&m);
}

/* Answer every finished job. */
static void send_done(svc *s)
{
    pthread_mutex_lock(&s->mu);
    svc_job *list = s->done;
    s->done = NULL;
    pthread_mutex_unlock(&s->mu);
    while (list) {
        svc_job *j = list;
        list = j->next;
        reply_result(s, j);
        job_free(j);
    }
}

/* ---------------------------------------------------------------- requests --------- */

/* Queue a runnable exec x, a view into *m (takes ownership of *m). */
static void enqueue(svc *s, const prl_bus_peer *peer, prl_bus_msg *m, const prl_msg_exec *x)
{
    svc_job *j = calloc(1, sizeof *j);
    pthread_mutex_lock(&s->mu);
    int full = s->queued >= MAX_QUEUED;
    if (j && !full) {
        j->msg = *m; /* the frames stay where they are: x's views remain valid */
        j->exec = *x;
        j->peer = *peer;
        if (s->todo_tail) s->todo_tail->next = j;
        else s->todo = j;
        s->todo_tail = j;
        s->queued++;
        s->stats.runs++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (j && !full) {
        memset(m, 0, sizeof *m); /* now owned by the job */
        return;
    }
    free(j);
    reply_error(s, peer, m, full ? "busy: too many requests queued" : "out of memory");
    prl_bus_msg_free(m);
}

/* Handle one valid message; returns 1 when it asks the service to stop. Frees *m. */
static int handle(svc *s, const prl_bus_peer *peer, prl_bus_msg *m)
{
    char why[256];
    prl_msg_stop stop;
    prl_msg_exec x;
    if (prl_msg_stop_decode(m, &stop) == PRL_OK && s->auth && strcmp(peer->user, "launcher")) {
        /* a worker's key opens the service to its programs, not to ending it for the run */
        svc_log(s,
                "stop message refused: it came from user '%s', only the launcher may stop "
                "the service",
                peer->user);
        reply_error(s, peer, m, "stop refused: only the launcher may stop the sandbox service");
        prl_bus_msg_free(m);
        return 0;
    }
    if (prl_msg_stop_decode(m, &stop) == PRL_OK) {
        svc_log(s, "stop message received (%s)", stop.reason ? stop.reason : "no reason given");
        prl_bus_msg_free(m);
        return 1;
    }
    if (strcmp(m->type, "exec") != 0) {
        snprintf(why, sizeof why, "message type '%s' is not served here (exec, stop)", m->type);
        reply_error(s, peer, m, why);
    } else if (prl_msg_exec_decode(m, &x)) {
        reply_error(s, peer, m, prl_error_message());
    } else {
        enqueue(s, peer, m, &x);
        return 0;
    }
    prl_bus_msg_free(m);
    return 0;
}

/* Take every message waiting on the socket (without blocking). 1: a stop was asked. */
static int drain_socket(svc *s)
{
    for (int k = 0; k < 256; k++) {
        uint64_t dropped = prl_bus_socket_dropped(s->sock);
        prl_bus_msg m;
        prl_bus_peer peer;
        int got = 0;
        if (prl_bus_recv(s->sock, 0, &m, &peer, &got) != PRL_OK) {
            svc_log(s, "receive failed: %s", prl_error_message());
            return 0;
        }
        if (got && handle(s, &peer, &m)) return 1;
        if (!got && prl_bus_socket_dropped(s->sock) == dropped) return 0; /* nothing left */
    }
    return 0; /* more may wait: the next poll says so at once */
}

/* Wait for a message, a finished job or a signal; serve until asked to stop. */
static void serve(svc *s)
{
    for (;;) {
        zmq_pollitem_t items[2] = {{prl_bus_socket_raw(s->sock), 0, ZMQ_POLLIN, 0},
                                   {NULL, s->wake[0], ZMQ_POLLIN, 0}};
        int rc = zmq_poll(items, 2, 1000);
        if (stop_signal) {
            svc_log(s, "signal %d received", (int)stop_signal);
            return;
        }
        if (rc < 0 && zmq_errno() != EINTR) {
            svc_log(s, "poll failed: %s; stopping", zmq_strerror(zmq_errno()));
            return;
        }
        char buf[64];
        while (read(s->wake[0], buf, sizeof buf) > 0) {
        }
        send_done(s);
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN) && drain_socket(s)) return;
    }
}

/* ---------------------------------------------------------------- run -------------- */

void prl_sandbox_service_options_default(prl_sandbox_service_options *opt)
{
    *opt = (prl_sandbox_service_options){.slots = 1, .name = "sandbox"};
}

/* Slot uids of this process: above the range of `prl sandbox exec` (200000 + pid) and
** distinct per pid (pid_max is at most 2^22, 256 slots each). */
static unsigned default_uid_base(void)
{
    return 100000000u + ((unsigned)getpid() % (1u << 22)) * 256u;
}

static prl_status svc_open(svc *s, const prl_sandbox_service_options *opt)
{
    if (opt->slots < 1 || opt->slots > 256)
        return prl_error_set(PRL_ERR_ARG, "sandbox service: slots must be in 1..256, got %d",
                             opt->slots);
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0)
        return prl_error_set(PRL_ERR_IO, "sandbox service: pipe: %s", strerror(errno));
    prl_sandbox_options so;
    prl_sandbox_options_default(&so);
    so.slots = opt->slots;
    so.warm = opt->warm;
    so.uid_base = opt->uid_base ? opt->uid_base : default_uid_base();
    prl_status rc = prl_sandbox_init(&s->sb, &so);
    if (rc) return prl_error_wrap(rc, "sandbox service: ");
    prl_bus_socket_options bo;
    prl_bus_socket_options_default(&bo);
    bo.bind = 1;
    bo.name = s->name;
    bo.registry = prl_msg_registry();
    bo.secret = opt->secret, bo.launcher_secret = opt->secret ? opt->launcher_secret : NULL;
    bo.curve = opt->curve, bo.curve_allow = opt->curve_allow, bo.allow_remote = opt->curve != NULL;
    s->auth = opt->secret != NULL || opt->curve != NULL;
    rc = prl_bus_socket_open(&s->sock, PRL_BUS_ROUTER, opt->endpoint, &bo);
    if (rc) return rc;
    return start_workers(s, opt->slots);
}

static void svc_close(svc *s)
{
    stop_workers(s);
    if (s->sock) {
        send_done(s); /* the runs that were in progress at the stop */
        s->stats.dropped = prl_bus_socket_dropped(s->sock);
    }
    prl_bus_socket_free(s->sock);
    prl_sandbox_free(s->sb);
    for (int i = 0; i < 2; i++)
        if (s->wake[i] >= 0) close(s->wake[i]);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

prl_status prl_sandbox_service_run(const prl_sandbox_service_options *opt,
                                   prl_sandbox_service_stats *stats)
{
    if (!opt || !opt->endpoint)
        return prl_error_set(PRL_ERR_ARG, "sandbox service: an endpoint is required");
    svc s = {.name = opt->name ? opt->name : "sandbox", .wake = {-1, -1}};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    struct sigaction old[2];
    stop_signal = 0;
    install_stop_handlers(old);
    prl_status rc = svc_open(&s, opt);
    if (rc == PRL_OK) {
        signal_wake_fd = s.wake[1];
        svc_log(&s, "serving %s with %d slot%s (sandbox layers 0x%x%s)",
                prl_bus_socket_endpoint(s.sock), opt->slots, opt->slots == 1 ? "" : "s",
                prl_sandbox_layers(s.sb), opt->warm ? ", warm python3" : "");
        serve(&s);
    }
    signal_wake_fd = -1;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", prl_error_message());
    svc_close(&s);
    s.stats.signal = (int)stop_signal;
    restore_stop_handlers(old);
    if (rc == PRL_OK)
        svc_log(&s, "stopped: %llu runs, %llu refused, %llu dropped, %llu replies undelivered",
                (unsigned long long)s.stats.runs, (unsigned long long)s.stats.refused,
                (unsigned long long)s.stats.dropped, (unsigned long long)s.stats.unsent);
    if (stats) *stats = s.stats;
    return rc ? prl_error_set(rc, "%s", msg) : PRL_OK;
}
