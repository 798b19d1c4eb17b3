/*
** auth.c — who may join a run's bus: the per-run secret (a key file, 0600, in the run
** directory) and the ZeroMQ authentication handler (ZAP, RFC 27) that checks it.
**
** A socket that binds with a secret is a ZeroMQ PLAIN server: a peer must present a user
** ("worker", or "launcher" where the socket accepts one) and that user's secret during the
** handshake, or libzmq closes the connection before a single message of the peer is
** delivered. The check runs here, in one handler thread per process on the well-known
** inproc endpoint, for every such socket of the process (each one its own ZAP domain).
** A refusal is logged on the socket's log sink, rate-limited. Messages from an accepted
** peer carry its user as the "User-Id" property, which prl_bus_recv reports in the peer.
**
** PLAIN sends the secret in the clear: it is meant for ipc:// sockets in the run directory
** (0700) and loopback tcp://. Hosts elsewhere use CURVE (curve.c): the same handler accepts a
** CURVE client when its public key is on the domain's allow-list (user "worker"), and logs
** the key of one that is not (docs/protocol.md "Who may join").
*/
#include "bus/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

/* ---------------------------------------------------------------- key files -------- */

static int hex_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

prl_status prl_bus_key_create(const char *path)
{
    unsigned char raw[PRL_BUS_SECRET_HEX / 2];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return prl_error_set(PRL_ERR_IO, "bus key %s: getrandom: %s", path, strerror(errno));
    char text[PRL_BUS_SECRET_HEX + 2];
    for (size_t i = 0; i < sizeof raw; i++) snprintf(text + 2 * i, 3, "%02x", raw[i]);
    text[PRL_BUS_SECRET_HEX] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "bus key %s: %s", path, strerror(errno));
    ssize_t w = write(fd, text, PRL_BUS_SECRET_HEX + 1);
    int bad = w != PRL_BUS_SECRET_HEX + 1 || fsync(fd) != 0;
    int e = errno;
    close(fd);
    if (bad) {
        unlink(path); /* made by this call: a torn key would refuse every role */
        return prl_error_set(PRL_ERR_IO, "bus key %s: write: %s", path, strerror(e));
    }
    return PRL_OK;
}

prl_status prl_bus_key_load(const char *path, prl_bus_secret *out)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return prl_error_set(PRL_ERR_IO, "bus key %s: %s (the run's key is RUN_DIR/bus.key)", path,
                             strerror(errno));
    struct stat sb;
    char text[PRL_BUS_SECRET_HEX + 4];
    ssize_t n = fstat(fd, &sb) == 0 ? read(fd, text, sizeof text) : -1;
    close(fd);
    if (n < 0) return prl_error_set(PRL_ERR_IO, "bus key %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return prl_error_set(PRL_ERR_CONFIG, "bus key %s is not a regular file", path);
    if (sb.st_mode & 077)
        return prl_error_set(PRL_ERR_CONFIG,
                             "bus key %s can be read by others (mode %04o): chmod 600 it", path,
                             (unsigned)(sb.st_mode & 07777));
    if (n > PRL_BUS_SECRET_HEX && text[PRL_BUS_SECRET_HEX] == '\n') n--;
    if (n != PRL_BUS_SECRET_HEX || !hex_ok(text, PRL_BUS_SECRET_HEX))
        return prl_error_set(PRL_ERR_FORMAT, "bus key %s: want %d lowercase hex digits", path,
                             PRL_BUS_SECRET_HEX);
    memcpy(out->hex, text, PRL_BUS_SECRET_HEX);
    return PRL_OK;
}

prl_status prl_bus_key_path_for(const char *endpoint, char *out, size_t n)
{
    const char *slash = strncmp(endpoint, "ipc://", 6) == 0 ? strrchr(endpoint + 6, '/') : NULL;
    if (!slash)
        return prl_error_set(PRL_ERR_ARG,
                             "endpoint '%s' does not name the run directory: give the run's key "
                             "with --key RUN_DIR/bus.key",
                             endpoint);
    int len = (int)(slash - (endpoint + 6));
    int k = snprintf(out, n, "%.*s/bus.key", len, endpoint + 6);
    if (k < 0 || (size_t)k >= n) return prl_error_set(PRL_ERR_ARG, "bus key path too long");
    return PRL_OK;
}

/* ---------------------------------------------------------------- domains ---------- */

/* What one authenticating socket accepts. Slots are reused once their socket closes. */
typedef struct auth_domain {
    int used;
    char name[16]; /* the ZAP domain: "prl-N" */
    prl_bus_secret worker, launcher;
    int has_worker, has_launcher;
    prl_bus_curve_allow curve; /* CURVE clients accepted (a copy; n = 0: none) */
    char label[64];            /* the socket's log prefix */
    prl_bus_log_fn log;
    void *log_ctx;
    prl_bus_log_limit refused_log;
    unsigned generation; /* changes at each registration: the handler's monitor follows */
} auth_domain;

enum { MAX_DOMAINS = 16 };
static const char ZAP_ENDPOINT[] = "inproc://zeromq.zap.01";

static pthread_mutex_t auth_lock = PTHREAD_MUTEX_INITIALIZER;
static auth_domain domains[MAX_DOMAINS];
static unsigned next_domain;
static unsigned generations;
static unsigned synced; /* the handler's monitor readers cover every domain up to this one */
static pthread_t zap_thread;
static int zap_running;
static void *zap_ready_ctx;

/* Constant time in the secret's bytes: the handler's timing says nothing of the key. */
static int secret_equal(const prl_bus_secret *s, const char *given, size_t n)
{
    unsigned diff = n != PRL_BUS_SECRET_HEX;
    for (size_t i = 0; i < PRL_BUS_SECRET_HEX; i++)
        diff |= (unsigned char)s->hex[i] ^ (unsigned char)(i < n ? given[i] : 0);
    return diff == 0;
}

/* ---------------------------------------------------------------- the handler ------ */

enum { ZAP_PARTS = 8 };
typedef struct zap_request {
    zmq_msg_t part[ZAP_PARTS];
    int n;
} zap_request;

static int part_is(zmq_msg_t *p, const char *s)
{
    size_t n = strlen(s);
    return zmq_msg_size(p) == n && memcmp(zmq_msg_data(p), s, n) == 0;
}

/* A CURVE client (auth_lock held): accepted as "worker" when its public key (part 6, 32
** bytes) is on domain dom's allow-list; the refusal names the key in Z85. */
static const char *decide_curve(zap_request *q, const char *dom, char *user, size_t user_n,
                                char *why, size_t why_n)
{
    if (zmq_msg_size(&q->part[6]) != 32) {
        snprintf(why, why_n, "a CURVE request without a 32-byte client key");
        return "400";
    }
    const uint8_t *key = zmq_msg_data(&q->part[6]);
    for (int i = 0; i < MAX_DOMAINS; i++) {
        auth_domain *d = &domains[i];
        if (!d->used || strcmp(d->name, dom)) continue;
        if (prl_bus_curve_allow_has(&d->curve, key)) {
            snprintf(user, user_n, "worker");
            return "200";
        }
        char z85[PRL_BUS_CURVE_Z85 + 1] = "?";
        zmq_z85_encode(z85, key, 32);
        snprintf(why, why_n, "CURVE key %s is not on the allow-list", z85);
        return "400";
    }
    snprintf(why, why_n, "unknown domain");
    return "400";
}

/* The answer to one request: status code and the user id (empty when refused). */
static const char *decide(zap_request *q, char *user, size_t user_n, char *why, size_t why_n)
{
    user[0] = why[0] = 0;
    if (q->n < 6 || !part_is(&q->part[0], "1.0")) {
        snprintf(why, why_n, "malformed authentication request");
        return "500";
    }
    if (part_is(&q->part[5], "NULL")) return "200"; /* a socket without a secret */
    char dom[16];
    size_t dn = zmq_msg_size(&q->part[2]);
    snprintf(dom, sizeof dom, "%.*s", (int)(dn < sizeof dom - 1 ? dn : sizeof dom - 1),
             (const char *)zmq_msg_data(&q->part[2]));
    if (part_is(&q->part[5], "CURVE") && q->n >= 7)
        return decide_curve(q, dom, user, user_n, why, why_n);
    if (!part_is(&q->part[5], "PLAIN") || q->n < 8) {
        snprintf(why, why_n, "mechanism not accepted (PLAIN with the run's key, or CURVE)");
        return "400";
    }
    const char *given = zmq_msg_data(&q->part[7]);
    size_t gn = zmq_msg_size(&q->part[7]);
    for (int i = 0; i < MAX_DOMAINS; i++) {
        auth_domain *d = &domains[i];
        if (!d->used || strcmp(d->name, dom)) continue;
        if (part_is(&q->part[6], "worker") && d->has_worker &&
            secret_equal(&d->worker, given, gn)) {
            snprintf(user, user_n, "worker");
            return "200";
        }
        if (part_is(&q->part[6], "launcher") && d->has_launcher &&
            secret_equal(&d->launcher, given, gn)) {
            snprintf(user, user_n, "launcher");
            return "200";
        }
        size_t un = zmq_msg_size(&q->part[6]);
        snprintf(why, why_n, "user '%.*s' with a wrong key", (int)(un < 32 ? un : 32),
                 (const char *)zmq_msg_data(&q->part[6]));
        return "400";
    }
    snprintf(why, why_n, "unknown domain");
    return "400";
}

/* "refused a connection [from ADDR]: WHY" on the domain's sink, rate-limited (auth_lock
** held). */
static void log_domain_refusal(auth_domain *d, const char *addr, const char *why)
{
    uint64_t held;
    if (!prl_bus_log_limit_take(&d->refused_log, prl_now(), &held)) return;
    char line[400];
    if (held) {
        prl_bus_log_held_line(held, "refused a connection", line, sizeof line);
        prl_bus_auth_log(d->log, d->log_ctx, d->label, line);
    }
    snprintf(line, sizeof line, "refused a connection%s%s: %s", *addr ? " from " : "", addr, why);
    prl_bus_auth_log(d->log, d->log_ctx, d->label, line);
}

static void log_refusal(zap_request *q, const char *why)
{
    char dom[16], addr[80];
    size_t dn = zmq_msg_size(&q->part[2]), an = q->n > 3 ? zmq_msg_size(&q->part[3]) : 0;
    snprintf(dom, sizeof dom, "%.*s", (int)(dn < 15 ? dn : 15),
             (const char *)zmq_msg_data(&q->part[2]));
    snprintf(addr, sizeof addr, "%.*s", (int)(an < 79 ? an : 79),
             an ? (const char *)zmq_msg_data(&q->part[3]) : "");
    for (int i = 0; i < MAX_DOMAINS; i++)
        if (domains[i].used && !strcmp(domains[i].name, dom))
            log_domain_refusal(&domains[i], addr, why);
}

static void reply(void *rep, zap_request *q, const char *code, const char *user)
{
    zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(rep, zmq_msg_data(&q->part[1]), zmq_msg_size(&q->part[1]), ZMQ_SNDMORE);
    zmq_send(rep, code, 3, ZMQ_SNDMORE);
    zmq_send(rep, code[0] == '2' ? "OK" : "refused", code[0] == '2' ? 2 : 7, ZMQ_SNDMORE);
    zmq_send(rep, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(rep, "", 0, 0);
}

/* Read one request; -1 when the context is ending. */
static int read_request(void *rep, zap_request *q)
{
    q->n = 0;
    for (int more = 1; more;) {
        zmq_msg_t p;
        zmq_msg_init(&p);
        if (zmq_msg_recv(&p, rep, 0) < 0) {
            zmq_msg_close(&p);
            if (zmq_errno() == EINTR) continue;
            return -1;
        }
        more = zmq_msg_more(&p);
        if (q->n < ZAP_PARTS) q->part[q->n++] = p;
        else zmq_msg_close(&p);
    }
    return 0;
}

static void serve_request(void *rep)
{
    zap_request q;
    if (read_request(rep, &q) < 0) return;
    char user[16], why[160];
    pthread_mutex_lock(&auth_lock);
    const char *code = q.n >= 2 ? decide(&q, user, sizeof user, why, sizeof why) : NULL;
    if (code && code[0] != '2') log_refusal(&q, why);
    pthread_mutex_unlock(&auth_lock);
    if (code) reply(rep, &q, code, user);
    for (int i = 0; i < q.n; i++) zmq_msg_close(&q.part[i]);
}

/* A peer that presents no key at all never reaches ZAP: libzmq refuses the mechanism and
** says so only to a socket monitor. The handler thread owns one monitor reader per domain
** (the sockets are its own: a ZeroMQ socket stays in one thread). */
typedef struct monitor {
    void *pair;
    unsigned generation;
} monitor;

static void monitor_endpoint(const auth_domain *d, char *out, size_t n)
{
    snprintf(out, n, "inproc://prl-auth-monitor-%u", d->generation);
}

/* Open readers for new domains, close those of domains gone (auth_lock held). */
static void monitors_sync(void *ctx, monitor *mon)
{
    for (int i = 0; i < MAX_DOMAINS; i++) {
        unsigned want = domains[i].used ? domains[i].generation : 0;
        if (mon[i].generation == want) continue;
        if (mon[i].pair) zmq_close(mon[i].pair);
        mon[i] = (monitor){0};
        if (!want) continue;
        char ep[64];
        monitor_endpoint(&domains[i], ep, sizeof ep);
        int linger = 0;
        void *p = zmq_socket(ctx, ZMQ_PAIR);
        if (p && !zmq_setsockopt(p, ZMQ_LINGER, &linger, sizeof linger) && !zmq_connect(p, ep))
            mon[i] = (monitor){p, want};
        else if (p) zmq_close(p);
    }
}

/* One monitor event of domain i: log a handshake refused for its mechanism. */
static void monitor_event(monitor *m, int i)
{
    zmq_msg_t ev, addr;
    zmq_msg_init(&ev), zmq_msg_init(&addr);
    int ok = zmq_msg_recv(&ev, m->pair, 0) >= 0 && zmq_msg_more(&ev) &&
             zmq_msg_recv(&addr, m->pair, 0) >= 0 && zmq_msg_size(&ev) >= 6;
    uint16_t event = 0;
    uint32_t value = 0;
    if (ok) memcpy(&event, zmq_msg_data(&ev), 2), memcpy(&value, (char *)zmq_msg_data(&ev) + 2, 4);
    zmq_msg_close(&ev), zmq_msg_close(&addr);
    /* PROTOCOL: this side saw the mechanism mismatch; NO_DETAIL: the peer saw it first and
    ** hung up mid-handshake (a keyless peer gives either, depending on who reads first) */
    if (!ok || (event != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
                event != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL))
        return;
    pthread_mutex_lock(&auth_lock);
    auth_domain *d = &domains[i];
    if (d->used && d->generation == m->generation) {
        char why[120];
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
            value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
            snprintf(why, sizeof why,
                     "the peer's CURVE handshake failed: it does not hold this server's "
                     "public key (ZMTP error 0x%x)",
                     value);
        else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
            snprintf(why, sizeof why, "the peer did not present a key (ZMTP error 0x%x)", value);
        else
            snprintf(why, sizeof why, "the peer did not present a key (it left the handshake: %s)",
                     zmq_strerror((int)value));
        log_domain_refusal(d, "", why);
    }
    pthread_mutex_unlock(&auth_lock);
}

static void *zap_main(void *arg)
{
    void *rep = arg;
    void *ctx = zap_ready_ctx;
    monitor mon[MAX_DOMAINS] = {{0}};
    for (;;) {
        pthread_mutex_lock(&auth_lock);
        monitors_sync(ctx, mon);
        synced = generations;
        pthread_mutex_unlock(&auth_lock);
        zmq_pollitem_t items[1 + MAX_DOMAINS];
        int idx[1 + MAX_DOMAINS], n = 1;
        items[0] = (zmq_pollitem_t){rep, 0, ZMQ_POLLIN, 0};
        for (int i = 0; i < MAX_DOMAINS; i++)
            if (mon[i].pair)
                idx[n] = i, items[n++] = (zmq_pollitem_t){mon[i].pair, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(items, n, 100); /* the timeout picks up new and closed domains */
        if (rc < 0 && zmq_errno() == ETERM) break;
        if (rc <= 0) continue;
        if (items[0].revents & ZMQ_POLLIN) serve_request(rep);
        for (int k = 1; k < n; k++)
            if (items[k].revents & ZMQ_POLLIN) monitor_event(&mon[idx[k]], idx[k]);
    }
    for (int i = 0; i < MAX_DOMAINS; i++)
        if (mon[i].pair) zmq_close(mon[i].pair);
    zmq_close(rep);
    return NULL;
}

/* Start the handler once per context (auth_lock held). */
static prl_status zap_start(void *ctx)
{
    if (zap_running && zap_ready_ctx == ctx) return PRL_OK;
    void *rep = zmq_socket(ctx, ZMQ_REP);
    int linger = 0;
    if (!rep || zmq_setsockopt(rep, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_bind(rep, ZAP_ENDPOINT) != 0) {
        prl_status st = prl_error_set(PRL_ERR_IO, "bus: the authentication handler: %s",
                                      zmq_strerror(zmq_errno()));
        if (rep) zmq_close(rep);
        return st;
    }
    zap_ready_ctx = ctx; /* before the thread reads it */
    if (pthread_create(&zap_thread, NULL, zap_main, rep) != 0) {
        zmq_close(rep);
        zap_ready_ctx = NULL;
        return prl_error_set(PRL_ERR_IO, "bus: cannot start the authentication thread");
    }
    zap_running = 1;
    return PRL_OK;
}

void prl_bus_auth_join(void)
{
    pthread_mutex_lock(&auth_lock);
    int running = zap_running;
    zap_running = 0, zap_ready_ctx = NULL;
    pthread_mutex_unlock(&auth_lock);
    if (running) pthread_join(zap_thread, NULL); /* ends once the context terminates */
}

prl_status prl_bus_auth_register(void *ctx, void *zs, const prl_bus_socket_options *o,
                                 const char *label, char *domain, size_t n)
{
    pthread_mutex_lock(&auth_lock);
    prl_status st = zap_start(ctx);
    int slot = -1;
    for (int i = 0; st == PRL_OK && i < MAX_DOMAINS && slot < 0; i++)
        if (!domains[i].used) slot = i;
    if (st == PRL_OK && slot < 0)
        st = prl_error_set(PRL_ERR_ARG, "bus: more than %d authenticating sockets", MAX_DOMAINS);
    if (st == PRL_OK) {
        auth_domain *d = &domains[slot];
        memset(d, 0, sizeof *d);
        d->used = 1, d->generation = ++generations;
        snprintf(d->name, sizeof d->name, "prl-%u", next_domain++);
        if (o->secret) memcpy(d->worker.hex, o->secret, PRL_BUS_SECRET_HEX);
        d->has_worker = o->secret != NULL;
        if (o->launcher_secret) memcpy(d->launcher.hex, o->launcher_secret, PRL_BUS_SECRET_HEX);
        d->has_launcher = o->launcher_secret != NULL;
        snprintf(d->label, sizeof d->label, "%s", label);
        d->log = o->log, d->log_ctx = o->log_ctx;
        snprintf(domain, n, "%s", d->name);
        char ep[64];
        monitor_endpoint(d, ep, sizeof ep);
        if (zmq_socket_monitor(zs, ep,
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
            st = prl_error_set(PRL_ERR_IO, "bus: monitoring the handshakes of '%s': %s", label,
                               zmq_strerror(zmq_errno()));
        if (st) memset(d, 0, sizeof *d);
    }
    unsigned want = generations;
    pthread_mutex_unlock(&auth_lock);
    /* a handshake refused before the handler reads the new monitor would go unlogged: wait
    ** (at most a second) until it does, before the socket binds */
    for (int i = 0; st == PRL_OK && i < 1000; i++) {
        pthread_mutex_lock(&auth_lock);
        int done = synced >= want;
        pthread_mutex_unlock(&auth_lock);
        if (done) break;
        usleep(1000);
    }
    return st;
}

prl_status prl_bus_auth_allow_curve(const char *domain, const prl_bus_curve_allow *allow)
{
    prl_bus_curve_key *copy = NULL;
    int n = allow ? allow->n : 0;
    if (n && !(copy = malloc((size_t)n * sizeof *copy)))
        return prl_error_set(PRL_ERR_NOMEM, "bus: allow-list of %d keys", n);
    if (n) memcpy(copy, allow->keys, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&auth_lock);
    int found = 0;
    for (int i = 0; i < MAX_DOMAINS && !found; i++) {
        auth_domain *d = &domains[i];
        if (!d->used || strcmp(d->name, domain)) continue;
        free(d->curve.keys);
        d->curve.keys = copy, d->curve.n = n, found = 1;
    }
    pthread_mutex_unlock(&auth_lock);
    if (found) return PRL_OK;
    free(copy);
    return prl_error_set(PRL_ERR_ARG, "bus: no authentication domain '%s'", domain);
}

void prl_bus_auth_unregister(const char *domain)
{
    pthread_mutex_lock(&auth_lock);
    for (int i = 0; i < MAX_DOMAINS; i++) {
        auth_domain *d = &domains[i];
        if (!d->used || strcmp(d->name, domain)) continue;
        char held[200];
        if (prl_bus_log_limit_held_line(&d->refused_log, "refused a connection", held, sizeof held))
            prl_bus_auth_log(d->log, d->log_ctx, d->label, held);
        free(d->curve.keys);
        memset(d, 0, sizeof *d);
    }
    pthread_mutex_unlock(&auth_lock);
}

int prl_bus_secret_ok(const char *s)
{
    return s && strlen(s) == PRL_BUS_SECRET_HEX && hex_ok(s, PRL_BUS_SECRET_HEX);
}

prl_status prl_bus_key_ensure(const char *path, prl_bus_secret *out)
{
    struct stat sb;
    prl_status st = prl_bus_key_create(path);
    if (st != PRL_OK && lstat(path, &sb) != 0) return st; /* not there and not creatable */
    return prl_bus_key_load(path, out);
}
