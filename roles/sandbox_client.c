/*
** sandbox_client.c — the client of the sandbox service (sandbox_service.c): sends `exec` from a DEALER and
** waits for the `exec_result` (or `error`) whose ref is the request's id.
**
** Retry: the service may be killed and restarted by the launcher at any time, and a request
** in flight to a dead process is lost with it. So when no answer comes within wall_s + a
** margin, the client closes its socket (dropping whatever libzmq still queues for the dead
** peer), opens a fresh one and re-sends with a new id, until a total deadline. Running a
** program twice is harmless (no effect outside its sandbox), and an answer to an earlier
** try can only be late, so replies whose ref is not the current id are ignored.
*/
#include "bus/bus.h"
#include "roles/msg/msg.h"
#include "roles/roles.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct prl_sandbox_client {
    char endpoint[512];
    char name[64];
    prl_bus_secret secret; /* the run's bus key ("" when the service asks for none) */
    int curve_on;          /* instead: CURVE with this keypair to the service's public key */
    prl_bus_curve_keypair curve;
    char server_pub[PRL_BUS_CURVE_Z85 + 1];
    prl_bus_socket *sock; /* NULL until the first send and after a failed try */
    uint64_t next_id;
    double margin_s, deadline_s;
    uint64_t resends;
};

prl_status prl_sandbox_client_open(prl_sandbox_client **out, const char *endpoint, const char *name,
                                   const char *secret)
{
    *out = NULL;
    prl_status rc = prl_bus_endpoint_check(endpoint, 0);
    if (rc) return rc;
    if (!name || !*name) name = "sandbox-client";
    prl_sandbox_client *c = calloc(1, sizeof *c);
    if (!c) return prl_error_set(PRL_ERR_NOMEM, "sandbox client");
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    snprintf(c->name, sizeof c->name, "%s", name);
    if (secret) snprintf(c->secret.hex, sizeof c->secret.hex, "%s", secret);
    c->margin_s = 5.0;
    c->deadline_s = 30.0;
    *out = c;
    return PRL_OK;
}

prl_status prl_sandbox_client_open_curve(prl_sandbox_client **out, const char *endpoint,
                                         const char *name, const prl_bus_curve_keypair *kp,
                                         const char *server_pub)
{
    *out = NULL;
    prl_status rc = prl_bus_endpoint_check(endpoint, 1);
    if (!rc) rc = prl_bus_curve_available();
    if (!rc && !prl_bus_curve_key_ok(server_pub))
        rc = prl_error_set(PRL_ERR_ARG, "sandbox client: the service's public key is malformed");
    if (!rc) rc = prl_sandbox_client_open(out, "inproc://unused", name, NULL);
    if (rc) return rc;
    prl_sandbox_client *c = *out;
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    c->curve_on = 1, c->curve = *kp;
    snprintf(c->server_pub, sizeof c->server_pub, "%s", server_pub);
    return PRL_OK;
}

void prl_sandbox_client_free(prl_sandbox_client *c)
{
    if (!c) return;
    prl_bus_socket_free(c->sock);
    free(c);
}

void prl_sandbox_client_set_timing(prl_sandbox_client *c, double margin_s, double deadline_s)
{
    if (margin_s >= 0) c->margin_s = margin_s;
    if (deadline_s > 0) c->deadline_s = deadline_s;
}

uint64_t prl_sandbox_client_resends(const prl_sandbox_client *c) { return c->resends; }

/* ---------------------------------------------------------------- one try ---------- */

static prl_status send_try(prl_sandbox_client *c, const prl_bus_msg *m)
{
    if (!c->sock) {
        prl_bus_socket_options o;
        prl_bus_socket_options_default(&o);
        o.name = c->name, o.registry = prl_msg_registry();
        o.secret = c->secret.hex[0] ? c->secret.hex : NULL;
        if (c->curve_on) o.curve = &c->curve, o.curve_server = c->server_pub, o.allow_remote = 1;
        prl_status rc = prl_bus_socket_open(&c->sock, PRL_BUS_DEALER, c->endpoint, &o);
        if (rc) return rc;
    }
    return prl_bus_send(c->sock, NULL, m);
}

/* Copy n bytes into a NUL-terminated malloc'd buffer. */
static char *bytes_dup(const char *data, size_t n, size_t *len)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, data, n);
    p[n] = 0;
    *len = n;
    return p;
}

static prl_status parse_status(const char *word, prl_sandbox_status *st)
{
    for (int i = PRL_SANDBOX_STATUS_OK; i <= PRL_SANDBOX_STATUS_SANDBOX_ERROR; i++)
        if (strcmp(word, prl_sandbox_status_name((prl_sandbox_status)i)) == 0) {
            *st = (prl_sandbox_status)i;
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_FORMAT, "unknown status '%s'", word);
}

/* Fill res from an exec_result. */
static prl_status take_result(prl_sandbox_client *c, const prl_msg_exec_result *x,
                              prl_sandbox_result *res)
{
    const char *status = x->status;
    uint64_t code = x->exit_code, wall_us = x->wall_us;
    prl_status rc = parse_status(status, &res->status);
    if (rc) return prl_error_wrap(rc, "sandbox service at '%s': ", c->endpoint);
    res->out = bytes_dup(x->out, x->out_len, &res->out_len);
    res->err = bytes_dup(x->err, x->err_len, &res->err_len);
    if (!res->out || !res->err) return prl_error_set(PRL_ERR_NOMEM, "sandbox client: output");
    res->out_total = res->out_len, res->err_total = res->err_len;
    res->wall_seconds = (double)wall_us / 1e6;
    res->slot = -1;
    if (res->status == PRL_SANDBOX_STATUS_SANDBOX_ERROR) { /* the reason travels as stderr */
        res->exit_code = -1;
        snprintf(res->reason, sizeof res->reason, "%s", res->err);
        return PRL_OK;
    }
    res->exit_code = code > 255 ? 255 : (int)code;
    res->signal = res->exit_code > 128 ? res->exit_code - 128 : 0;
    snprintf(res->reason, sizeof res->reason,
             "%s (exit code %d), from the sandbox service at %.200s", status, res->exit_code,
             c->endpoint);
    return PRL_OK;
}

/* Wait until `until` for the answer to request `id`. 1: answered (rc says how), 0: none. */
static int wait_answer(prl_sandbox_client *c, uint64_t id, double until, prl_sandbox_result *res,
                       prl_status *rc)
{
    for (double left = until - prl_now(); left > 0; left = until - prl_now()) {
        prl_bus_msg m;
        int got = 0;
        if (prl_bus_recv(c->sock, (int)(left * 1000) + 1, &m, NULL, &got) != PRL_OK) return 0;
        if (!got) continue;
        prl_msg_exec_result x;
        prl_msg_error e;
        int mine = 0;
        if (prl_msg_exec_result_decode(&m, &x) == PRL_OK && x.ref == id) {
            mine = 1, *rc = take_result(c, &x, res);
        } else if (prl_msg_error_decode(&m, &e) == PRL_OK && e.ref == id) {
            mine = 1;
            *rc = prl_error_set(PRL_ERR_ARG, "sandbox service at '%s' refused the request: %s",
                                c->endpoint, e.reason);
        } /* else a late answer to an earlier try, or a stray type */
        prl_bus_msg_free(&m);
        if (mine) return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- exec ------------- */

prl_status prl_sandbox_client_exec(prl_sandbox_client *c, const char *lang, const char *program,
                                   const char *stdin_data, size_t stdin_len, double wall_s,
                                   prl_sandbox_result *res)
{
    memset(res, 0, sizeof *res);
    if (!lang || !program || (stdin_len && !stdin_data) || !(wall_s > 0))
        return prl_error_set(PRL_ERR_ARG,
                             "sandbox client: lang, program and a wall time > 0 are required");
    uint64_t wall_ms = (uint64_t)(wall_s * 1000.0 + 0.999);
    double per_try = wall_s + c->margin_s, start = prl_now();
    double deadline = start + (c->deadline_s > per_try ? c->deadline_s : per_try);
    int tries = 0;
    for (;;) {
        prl_bus_msg m;
        uint64_t id = ++c->next_id;
        prl_msg_exec x = {.lang = lang,
                          .wall_ms = wall_ms,
                          .program = program,
                          .program_len = strlen(program),
                          .stdin_data = stdin_data,
                          .stdin_len = stdin_len};
        prl_status rc = prl_msg_exec_encode(&x, c->name, id, &m);
        if (rc == PRL_OK) rc = send_try(c, &m);
        prl_bus_msg_free(&m);
        if (rc == PRL_ERR_ARG || rc == PRL_ERR_NOMEM) return rc; /* a retry cannot help */
        tries++;
        double until = prl_now() + per_try;
        if (until > deadline) until = deadline;
        if (rc == PRL_OK && wait_answer(c, id, until, res, &rc)) {
            if (rc) prl_sandbox_result_free(res);
            return rc;
        }
        /* No answer: the service may have died with the request; start over on a fresh
        ** socket so nothing queued for the dead peer lingers. */
        prl_bus_socket_free(c->sock);
        c->sock = NULL;
        if (prl_now() >= deadline) break;
        if (rc != PRL_OK) nanosleep(&(struct timespec){0, 100000000}, NULL); /* no hot loop */
        c->resends++;
    }
    return prl_error_set(PRL_ERR_IO,
                         "sandbox service at '%s' did not answer within %.1f s (%d tries)",
                         c->endpoint, prl_now() - start, tries);
}
