/*
** socket.c — thin wrappers over libzmq: open ROUTER/DEALER/PUB/SUB sockets on endpoints that
** pass the loopback policy, send encoded messages, and receive with a deadline while
** validating every message: a bad one is logged with its reason, counted and dropped, and
** never stops or crashes the receiver. Part counts and sizes are bounded while receiving, so
** a hostile peer cannot make us hold more than the limits of bus.h.
*/
#include "bus/internal.h"

#include <sys/stat.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

struct prl_bus_socket {
    void *zs;
    prl_bus_kind kind;
    char endpoint[512];
    char name[64];
    prl_bus_log_fn log;
    void *log_ctx;
    const prl_bus_registry *registry;
    uint64_t dropped;
    int bound_ipc;        /* bound to an ipc:// path: the socket file is removed when it closes */
    char auth_domain[16]; /* registered with the authentication handler ("" if not) */
    prl_bus_log_limit drop_log; /* "dropped message" lines */
};

/* ---------------------------------------------------------------- context ---------- */

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static void *ctx;

void *prl_bus_context(void)
{
    pthread_mutex_lock(&ctx_lock);
    if (!ctx) ctx = zmq_ctx_new();
    void *c = ctx;
    pthread_mutex_unlock(&ctx_lock);
    return c;
}

void prl_bus_shutdown(void)
{
    pthread_mutex_lock(&ctx_lock);
    if (ctx) zmq_ctx_term(ctx);
    ctx = NULL;
    pthread_mutex_unlock(&ctx_lock);
    prl_bus_auth_join();
}

/* ---------------------------------------------------------------- endpoints -------- */

static int port_ok(const char *p, int is_bind)
{
    if (is_bind && strcmp(p, "*") == 0) return 1;
    if (!*p || strlen(p) > 5) return 0;
    long v = 0;
    for (const char *c = p; *c; c++) {
        if (*c < '0' || *c > '9') return 0;
        v = v * 10 + (*c - '0');
    }
    return v >= 1 && v <= 65535;
}

/* tcp://HOST:PORT: loopback hosts always; others only with allow_remote. */
static prl_status tcp_check(const char *endpoint, const char *rest, int allow_remote)
{
    static const char *const loopback[] = {"127.0.0.1:", "localhost:", "[::1]:"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(loopback[i]);
        if (strncmp(rest, loopback[i], n) == 0) {
            if (port_ok(rest + n, 1)) return PRL_OK;
            return prl_error_set(PRL_ERR_ARG, "bus: endpoint '%s': port must be 1..65535 or *",
                                 endpoint);
        }
    }
    if (allow_remote) return PRL_OK;
    return prl_error_set(PRL_ERR_ARG,
                         "bus: endpoint '%s' is not loopback (tcp://127.0.0.1:PORT, "
                         "tcp://localhost:PORT, tcp://[::1]:PORT); set allow_remote to use it",
                         endpoint);
}

int prl_bus_endpoint_local(const char *endpoint)
{
    return prl_bus_endpoint_check(endpoint, 0) == PRL_OK;
}

prl_status prl_bus_endpoint_check(const char *endpoint, int allow_remote)
{
    if (!endpoint || !*endpoint) return prl_error_set(PRL_ERR_ARG, "bus: endpoint is empty");
    if (strlen(endpoint) >= 512)
        return prl_error_set(PRL_ERR_ARG, "bus: endpoint of %zu bytes is too long",
                             strlen(endpoint));
    if (strncmp(endpoint, "ipc://", 6) == 0 && endpoint[6]) return PRL_OK;
    if (strncmp(endpoint, "inproc://", 9) == 0 && endpoint[9]) return PRL_OK;
    if (strncmp(endpoint, "tcp://", 6) == 0) return tcp_check(endpoint, endpoint + 6, allow_remote);
    return prl_error_set(PRL_ERR_ARG,
                         "bus: endpoint '%s': transport must be ipc://PATH, inproc://NAME or "
                         "tcp://HOST:PORT",
                         endpoint);
}

/* ---------------------------------------------------------------- open/close ------- */

void prl_bus_socket_options_default(prl_bus_socket_options *o)
{
    memset(o, 0, sizeof *o);
    o->send_timeout_ms = 5000;
}

static const int zmq_kinds[] = {ZMQ_ROUTER, ZMQ_DEALER, ZMQ_PUB, ZMQ_SUB};

static prl_status zfail(prl_bus_socket *s, const char *what)
{
    return prl_error_set(PRL_ERR_IO, "bus: %s '%s': %s", what, s->endpoint,
                         zmq_strerror(zmq_errno()));
}

/* The ZAP domain of a binding socket, registered once (with or without a PLAIN secret). */
static prl_status ensure_domain(prl_bus_socket *s, const prl_bus_socket_options *o)
{
    if (s->auth_domain[0]) return PRL_OK;
    prl_status st = prl_bus_auth_register(prl_bus_context(), s->zs, o, s->name, s->auth_domain,
                                          sizeof s->auth_domain);
    if (st) return st;
    if (zmq_setsockopt(s->zs, ZMQ_ZAP_DOMAIN, s->auth_domain, strlen(s->auth_domain)) != 0)
        return zfail(s, "requiring authentication on");
    return PRL_OK;
}

/* A CURVE server with keypair kp accepting `allow`, for the binds that follow. */
static prl_status curve_server(prl_bus_socket *s, const prl_bus_socket_options *o,
                               const prl_bus_curve_keypair *kp, const prl_bus_curve_allow *allow)
{
    int one = 1;
    prl_status st = prl_bus_curve_available();
    if (!st) st = ensure_domain(s, o);
    if (!st) st = prl_bus_auth_allow_curve(s->auth_domain, allow);
    if (st) return st;
    if (zmq_setsockopt(s->zs, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_CURVE_SECRETKEY, kp->secret_z85, PRL_BUS_CURVE_Z85) != 0)
        return zfail(s, "making a CURVE server of");
    return PRL_OK;
}

/* A CURVE client: its keypair and the server's public key. */
static prl_status curve_client(prl_bus_socket *s, const prl_bus_socket_options *o)
{
    prl_status st = prl_bus_curve_available();
    if (st) return st;
    if (!prl_bus_curve_key_ok(o->curve_server))
        return prl_error_set(PRL_ERR_ARG,
                             "bus: connecting to '%s' with CURVE needs the server's "
                             "public key (its public.key)",
                             s->endpoint);
    if (zmq_setsockopt(s->zs, ZMQ_CURVE_SERVERKEY, o->curve_server, PRL_BUS_CURVE_Z85) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_CURVE_PUBLICKEY, o->curve->public_z85, PRL_BUS_CURVE_Z85) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_CURVE_SECRETKEY, o->curve->secret_z85, PRL_BUS_CURVE_Z85) != 0)
        return zfail(s, "setting the CURVE keys of");
    return PRL_OK;
}

/* CURVE when the socket has a keypair; else PLAIN credentials (connect) or the PLAIN server
** and its ZAP domain (bind). */
static prl_status configure_auth(prl_bus_socket *s, const prl_bus_socket_options *o)
{
    if (o->curve)
        return o->bind ? curve_server(s, o, o->curve, o->curve_allow) : curve_client(s, o);
    if (!o->secret) return PRL_OK;
    if (!prl_bus_secret_ok(o->secret) ||
        (o->launcher_secret && !prl_bus_secret_ok(o->launcher_secret)))
        return prl_error_set(PRL_ERR_ARG, "bus: a secret must be %d lowercase hex digits",
                             PRL_BUS_SECRET_HEX);
    if (!o->bind) {
        const char *user = o->user ? o->user : "worker";
        if (zmq_setsockopt(s->zs, ZMQ_PLAIN_USERNAME, user, strlen(user)) != 0 ||
            zmq_setsockopt(s->zs, ZMQ_PLAIN_PASSWORD, o->secret, PRL_BUS_SECRET_HEX) != 0)
            return zfail(s, "setting the credentials of");
        return PRL_OK;
    }
    int one = 1;
    prl_status st = ensure_domain(s, o);
    if (st) return st;
    if (zmq_setsockopt(s->zs, ZMQ_PLAIN_SERVER, &one, sizeof one) != 0)
        return zfail(s, "requiring authentication on");
    return PRL_OK;
}

static prl_status configure(prl_bus_socket *s, const prl_bus_socket_options *o)
{
    int linger = 0, one = 1;
    int64_t maxsize = (int64_t)PRL_BUS_MAX_FRAME_BYTES;
    if (zmq_setsockopt(s->zs, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_MAXMSGSIZE, &maxsize, sizeof maxsize) != 0 ||
        zmq_setsockopt(s->zs, ZMQ_SNDTIMEO, &o->send_timeout_ms, sizeof(int)) != 0)
        return zfail(s, "setting options on");
    if (s->kind == PRL_BUS_ROUTER &&
        zmq_setsockopt(s->zs, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0)
        return zfail(s, "setting ROUTER_MANDATORY on");
    if (s->kind == PRL_BUS_SUB && zmq_setsockopt(s->zs, ZMQ_SUBSCRIBE, "", 0) != 0)
        return zfail(s, "subscribing on");
    prl_status st = configure_auth(s, o);
    if (st) return st;
    if (o->identity) {
        size_t n = strlen(o->identity);
        if (n == 0 || n > 255)
            return prl_error_set(PRL_ERR_ARG, "bus: identity must be 1..255 bytes");
        if (zmq_setsockopt(s->zs, ZMQ_ROUTING_ID, o->identity, n) != 0)
            return zfail(s, "setting the identity of");
    }
    return PRL_OK;
}

static prl_status attach(prl_bus_socket *s, int bind)
{
    if (!bind) return zmq_connect(s->zs, s->endpoint) == 0 ? PRL_OK : zfail(s, "connect to");
    if (zmq_bind(s->zs, s->endpoint) != 0) return zfail(s, "bind");
    s->bound_ipc = !strncmp(s->endpoint, "ipc://", 6);
    /* only the run's owner may connect at all (the run directory is 0700 too) */
    if (s->bound_ipc && chmod(s->endpoint + 6, 0600) != 0) return zfail(s, "chmod 0600 of");
    size_t n = sizeof s->endpoint;
    if (zmq_getsockopt(s->zs, ZMQ_LAST_ENDPOINT, s->endpoint, &n) != 0)
        return zfail(s, "reading the bound endpoint of");
    return PRL_OK;
}

prl_status prl_bus_socket_open(prl_bus_socket **out, prl_bus_kind kind, const char *endpoint,
                               const prl_bus_socket_options *opt)
{
    *out = NULL;
    prl_bus_socket_options def;
    if (!opt) {
        prl_bus_socket_options_default(&def);
        opt = &def;
    }
    if ((unsigned)kind > PRL_BUS_SUB)
        return prl_error_set(PRL_ERR_ARG, "bus: unknown socket kind %d", (int)kind);
    if (!opt->registry && kind != PRL_BUS_PUB)
        return prl_error_set(PRL_ERR_ARG, "bus: a socket that receives needs the registry of "
                                          "its message types");
    prl_status st = prl_bus_endpoint_check(endpoint, opt->allow_remote);
    if (st == PRL_OK && !opt->curve && !prl_bus_endpoint_local(endpoint))
        st = prl_error_set(PRL_ERR_ARG,
                           "bus: endpoint '%s' is off loopback: it needs CURVE keys (prl keys "
                           "generate; docs/pipeline.md \"Several hosts\")",
                           endpoint);
    if (st != PRL_OK) return st;
    void *c = prl_bus_context();
    if (!c) return prl_error_set(PRL_ERR_IO, "bus: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    prl_bus_socket *s = calloc(1, sizeof *s);
    if (!s) return prl_error_set(PRL_ERR_NOMEM, "bus: out of memory for a socket");
    s->kind = kind;
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
    snprintf(s->name, sizeof s->name, "%s", opt->name ? opt->name : "bus");
    s->log = opt->log;
    s->log_ctx = opt->log_ctx;
    s->registry = opt->registry;
    s->zs = zmq_socket(c, zmq_kinds[kind]);
    st = s->zs ? configure(s, opt) : zfail(s, "creating a socket for");
    if (st == PRL_OK) st = attach(s, opt->bind);
    if (st != PRL_OK) {
        prl_bus_socket_free(s);
        return st;
    }
    *out = s;
    return PRL_OK;
}

prl_status prl_bus_socket_bind_curve(prl_bus_socket *s, const char *endpoint,
                                     const prl_bus_curve_keypair *kp,
                                     const prl_bus_curve_allow *allow)
{
    prl_status st = prl_bus_endpoint_check(endpoint, 1);
    if (st) return st;
    if (s->kind != PRL_BUS_ROUTER && s->kind != PRL_BUS_PUB)
        return prl_error_set(PRL_ERR_ARG, "bus: only ROUTER and PUB sockets bind more endpoints");
    if (!kp && !prl_bus_endpoint_local(endpoint))
        return prl_error_set(PRL_ERR_ARG, "bus: endpoint '%s' is off loopback: it needs CURVE keys",
                             endpoint);
    prl_bus_socket_options o;
    prl_bus_socket_options_default(&o);
    o.bind = 1, o.log = s->log, o.log_ctx = s->log_ctx;
    if (kp && (st = curve_server(s, &o, kp, allow))) return st;
    if (zmq_bind(s->zs, endpoint) != 0)
        return prl_error_set(PRL_ERR_IO, "bus: bind '%s': %s", endpoint, zmq_strerror(zmq_errno()));
    return PRL_OK;
}

prl_status prl_bus_socket_allow_curve(prl_bus_socket *s, const prl_bus_curve_allow *allow)
{
    if (!s->auth_domain[0])
        return prl_error_set(PRL_ERR_ARG, "bus: '%s' does not authenticate", s->endpoint);
    return prl_bus_auth_allow_curve(s->auth_domain, allow);
}

static void log_drops_held(prl_bus_socket *s);

void prl_bus_socket_free(prl_bus_socket *s)
{
    if (!s) return;
    log_drops_held(s);
    if (s->zs) zmq_close(s->zs);
    if (s->auth_domain[0]) prl_bus_auth_unregister(s->auth_domain);
    /* libzmq removes the file only once its I/O thread closes the listener, which a process
    ** that exits soon after never sees: the file this socket made goes now */
    if (s->bound_ipc) unlink(s->endpoint + 6);
    free(s);
}

const char *prl_bus_socket_endpoint(const prl_bus_socket *s) { return s->endpoint; }
uint64_t prl_bus_socket_dropped(const prl_bus_socket *s) { return s->dropped; }
void *prl_bus_socket_raw(prl_bus_socket *s) { return s->zs; }

/* ---------------------------------------------------------------- send ------------- */

static prl_status send_part(prl_bus_socket *s, const void *data, size_t len, int more)
{
    if (zmq_send(s->zs, data, len, more ? ZMQ_SNDMORE : 0) >= 0) return PRL_OK;
    return zfail(s, "send on");
}

prl_status prl_bus_send(prl_bus_socket *s, const prl_bus_peer *to, const prl_bus_msg *m)
{
    if ((s->kind == PRL_BUS_ROUTER) != (to != NULL))
        return prl_error_set(PRL_ERR_ARG, "bus: send on '%s': a peer is %s", s->endpoint,
                             to ? "only for ROUTER sockets" : "required on a ROUTER socket");
    if (s->kind == PRL_BUS_SUB)
        return prl_error_set(PRL_ERR_ARG, "bus: send on '%s': SUB sockets cannot send",
                             s->endpoint);
    prl_bus_wire w;
    prl_status st = prl_bus_encode(m, &w);
    if (st != PRL_OK) return st;
    if (to) st = send_part(s, to->id, to->len, 1);
    for (int i = 0; st == PRL_OK && i < w.n; i++)
        st = send_part(s, w.parts[i].data, w.parts[i].len, i + 1 < w.n);
    prl_bus_wire_free(&w);
    return st;
}

/* ---------------------------------------------------------------- receive ---------- */

/* One multipart message as received: up to PRL_BUS_MAX_PARTS parts kept (+1 for a ROUTER's
** peer id); further parts are read and discarded, and counted. */
typedef struct raw_msg {
    zmq_msg_t parts[PRL_BUS_MAX_PARTS + 2];
    int kept, total;
} raw_msg;

static void raw_free(raw_msg *r)
{
    for (int i = 0; i < r->kept; i++) zmq_msg_close(&r->parts[i]);
    r->kept = 0;
}

/* Read all parts of the next message (poll said it is there). 0: none ready; -1: error. */
static int raw_recv(prl_bus_socket *s, raw_msg *r)
{
    int cap = PRL_BUS_MAX_PARTS + 2, flags = ZMQ_DONTWAIT;
    r->kept = r->total = 0;
    for (;;) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, s->zs, flags) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&part);
            if (e == EAGAIN && r->total == 0) return 0;
            if (e == EINTR) continue;
            return -1;
        }
        int more = zmq_msg_more(&part);
        if (r->kept < cap) r->parts[r->kept++] = part;
        else zmq_msg_close(&part);
        r->total++;
        flags = 0; /* the remaining parts of a message arrive together with the first */
        if (!more) return 1;
    }
}

void prl_bus_auth_log(prl_bus_log_fn log, void *ctx, const char *label, const char *text)
{
    char line[1200];
    snprintf(line, sizeof line, "%s: %s", label, text);
    if (log) log(ctx, line);
    else fprintf(stderr, "prl %s\n", line);
}

static void log_line(prl_bus_socket *s, const char *text)
{
    prl_bus_auth_log(s->log, s->log_ctx, s->name, text);
}

static const char DROPPED[] = "dropped message";

/* What the drop limit still holds, said once (the socket is closing). */
static void log_drops_held(prl_bus_socket *s)
{
    char held[200];
    if (prl_bus_log_limit_held_line(&s->drop_log, DROPPED, held, sizeof held)) log_line(s, held);
}

static void log_drop(prl_bus_socket *s, const prl_bus_peer *from, const char *reason)
{
    uint64_t held;
    if (!prl_bus_log_limit_take(&s->drop_log, prl_now(), &held)) return;
    char line[1024], peer[2 * 32 + 16] = "";
    if (held) {
        prl_bus_log_held_line(held, DROPPED, line, sizeof line);
        log_line(s, line);
    }
    if (from && from->len) {
        size_t n = from->len < 32 ? from->len : 32;
        int k = snprintf(peer, sizeof peer, " from peer ");
        for (size_t i = 0; i < n; i++)
            k += snprintf(peer + k, sizeof peer - (size_t)k, "%02x", from->id[i]);
    }
    snprintf(line, sizeof line, "%s%s: %s", DROPPED, peer, reason);
    log_line(s, line);
}

/* Validate a raw message; 1 with `out` filled, or 0 after logging why it was dropped. */
static int accept_raw(prl_bus_socket *s, raw_msg *r, prl_bus_msg *out, prl_bus_peer *from)
{
    char reason[512];
    prl_bus_peer peer = {0};
    int first = 0;
    if (s->kind == PRL_BUS_ROUTER && r->kept > 0) {
        size_t n = zmq_msg_size(&r->parts[0]);
        peer.len = n < sizeof peer.id ? n : sizeof peer.id;
        memcpy(peer.id, zmq_msg_data(&r->parts[0]), peer.len);
        first = 1;
    }
    prl_bus_part parts[PRL_BUS_MAX_PARTS];
    int n = r->total - first;
    if (n > PRL_BUS_MAX_PARTS) {
        snprintf(reason, sizeof reason, "message has %d frames; the limit is %d", n,
                 PRL_BUS_MAX_PARTS);
    } else {
        for (int i = 0; i < n; i++)
            parts[i] = (prl_bus_part){zmq_msg_data(&r->parts[first + i]),
                                      zmq_msg_size(&r->parts[first + i])};
        if (prl_bus_decode(s->registry, parts, n, out, reason, sizeof reason) == PRL_OK) {
            const char *user = n > 0 ? zmq_msg_gets(&r->parts[first], "User-Id") : NULL;
            if (user) snprintf(peer.user, sizeof peer.user, "%s", user);
            if (from) *from = peer;
            return 1;
        }
    }
    s->dropped++;
    log_drop(s, &peer, reason);
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

prl_status prl_bus_recv(prl_bus_socket *s, int timeout_ms, prl_bus_msg *out, prl_bus_peer *from,
                        int *got)
{
    *got = 0;
    memset(out, 0, sizeof *out);
    if (s->kind == PRL_BUS_PUB)
        return prl_error_set(PRL_ERR_ARG, "bus: recv on '%s': PUB sockets cannot receive",
                             s->endpoint);
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    for (;;) {
        long wait = deadline < 0 ? -1 : (long)(deadline - now_ms());
        if (deadline >= 0 && wait < 0) wait = 0;
        zmq_pollitem_t item = {s->zs, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(&item, 1, wait);
        if (rc < 0 && zmq_errno() != EINTR) return zfail(s, "poll on");
        if (rc > 0) {
            raw_msg r;
            int k = raw_recv(s, &r);
            if (k < 0) {
                raw_free(&r);
                return zfail(s, "recv on");
            }
            int ok = k > 0 && accept_raw(s, &r, out, from);
            raw_free(&r);
            if (ok) {
                *got = 1;
                return PRL_OK;
            }
        }
        if (deadline >= 0 && now_ms() >= deadline) return PRL_OK;
    }
}
