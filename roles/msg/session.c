/*
** session.c — the messages of a worker's session with the controller (msg.h): hello,
** welcome, heartbeat, stop, error and ack.
*/
#include "roles/msg/internal.h"

#include <stdlib.h>
#include <string.h>

const prl_bus_type_spec prl_msg_hello_spec = {
    "hello",
    "a worker announces itself to the controller",
    {MSG_S("role"), MSG_S("worker"), MSG_U_OPT("pid"), MSG_U_OPT("slots")},
    {{0}}};
const prl_bus_type_spec prl_msg_welcome_spec = {
    "welcome",
    "the controller answers a hello: the run directory and the job config",
    {MSG_S("run_dir"), MSG_U("seed")},
    {{"config", PRL_BUS_BYTES}}};
const prl_bus_type_spec prl_msg_heartbeat_spec = {
    "heartbeat",
    "a worker is alive (and still holds `lease`, if given)",
    {MSG_S("worker"), MSG_U_OPT("lease")},
    {{0}}};
const prl_bus_type_spec prl_msg_stop_spec = {"stop",
                                             "the receiver should finish its current item and exit",
                                             {MSG_S_OPT("reason")},
                                             {{0}}};
const prl_bus_type_spec prl_msg_error_spec = {
    "error",
    "the sender refuses or failed message `ref`, with a reason",
    {MSG_S("reason"), MSG_U_OPT("ref"), MSG_U_OPT("lease")},
    {{0}}};
const prl_bus_type_spec prl_msg_ack_spec = {
    "ack",
    "the receiver accepted message `ref` (and lease `lease`, if given)",
    {MSG_U("ref"), MSG_U_OPT("lease")},
    {{0}}};

/* ---------------------------------------------------------------- hello ------------ */

static const char *const worker_roles[] = {"rollout", "reward", "trainer", "teacher", "gateway"};

prl_status prl_msg_hello_encode(const prl_msg_hello *x, const char *run, uint64_t id,
                                prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_hello_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_str(m, "role", x->role);
    if (!rc) rc = prl_bus_msg_set_str(m, "worker", x->worker);
    if (!rc) rc = prl_bus_msg_set_uint(m, "pid", x->pid);
    if (!rc && x->slots > 1) rc = prl_bus_msg_set_uint(m, "slots", x->slots);
    return msg_done(rc, m, "hello");
}

static prl_status hello_decode(const prl_bus_msg *m, prl_msg_hello *x)
{
    prl_status rc = msg_is(m, &prl_msg_hello_spec);
    if (!rc) rc = msg_str(m, "role", &x->role);
    if (!rc) rc = msg_str(m, "worker", &x->worker);
    if (rc) return rc;
    x->pid = msg_uint_or(m, "pid", 0);
    x->slots = msg_uint_or(m, "slots", 1);
    if (x->slots < 1 || x->slots > PRL_MSG_MAX_SLOTS)
        return prl_error_set(PRL_ERR_FORMAT, "field 'slots' = %llu must be in 1..%d",
                             (unsigned long long)x->slots, PRL_MSG_MAX_SLOTS);
    for (size_t i = 0; i < sizeof worker_roles / sizeof worker_roles[0]; i++)
        if (!strcmp(x->role, worker_roles[i])) return PRL_OK;
    return prl_error_set(PRL_ERR_FORMAT,
                         "unknown role '%s' (rollout, reward, trainer, teacher or gateway)",
                         x->role);
}

prl_status prl_msg_hello_decode(const prl_bus_msg *m, prl_msg_hello *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = hello_decode(m, x);
    return msg_decoded(rc, x, sizeof *x, "hello");
}

/* ---------------------------------------------------------------- welcome ---------- */

prl_status prl_msg_welcome_encode(const prl_msg_welcome *x, const char *run, uint64_t id,
                                  prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_welcome_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_str(m, "run_dir", x->run_dir);
    if (!rc) rc = prl_bus_msg_set_uint(m, "seed", x->seed);
    if (!rc) rc = prl_bus_msg_add_frame(m, "config", PRL_BUS_BYTES, x->config, strlen(x->config));
    return msg_done(rc, m, "welcome");
}

prl_status prl_msg_welcome_decode(const prl_bus_msg *m, prl_msg_welcome *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = msg_is(m, &prl_msg_welcome_spec);
    if (!rc) rc = msg_str(m, "run_dir", &x->run_dir);
    if (!rc) rc = msg_uint(m, "seed", &x->seed);
    char *text = rc ? NULL : prl_bus_msg_text(m, "config");
    if (!rc && !text) rc = PRL_ERR_FORMAT;
    prl_job_config_default(&x->job);
    if (!rc) rc = prl_job_config_parse(&x->job, text, "the controller's welcome");
    free(text);
    if (rc) prl_msg_welcome_free(x);
    return msg_decoded(rc, x, sizeof *x, "welcome");
}

void prl_msg_welcome_free(prl_msg_welcome *x)
{
    prl_job_config_free(&x->job);
    memset(x, 0, sizeof *x);
}

/* ---------------------------------------------------------------- heartbeat -------- */

prl_status prl_msg_heartbeat_encode(const prl_msg_heartbeat *x, const char *run, uint64_t id,
                                    prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_heartbeat_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_str(m, "worker", x->worker);
    if (!rc) rc = msg_set_uint_opt(m, "lease", x->lease);
    return msg_done(rc, m, "heartbeat");
}

prl_status prl_msg_heartbeat_decode(const prl_bus_msg *m, prl_msg_heartbeat *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = msg_is(m, &prl_msg_heartbeat_spec);
    if (!rc) rc = msg_str(m, "worker", &x->worker);
    x->lease = msg_uint_or(m, "lease", 0);
    return msg_decoded(rc, x, sizeof *x, "heartbeat");
}

/* ---------------------------------------------------------------- stop, error, ack - */

prl_status prl_msg_stop_encode(const prl_msg_stop *x, const char *run, uint64_t id, prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_stop_spec, run, id);
    if (!rc && x->reason) rc = prl_bus_msg_set_str(m, "reason", x->reason);
    return msg_done(rc, m, "stop");
}

prl_status prl_msg_stop_decode(const prl_bus_msg *m, prl_msg_stop *x)
{
    memset(x, 0, sizeof *x);
    x->reason = msg_str_or(m, "reason", NULL);
    return msg_decoded(msg_is(m, &prl_msg_stop_spec), x, sizeof *x, "stop");
}

prl_status prl_msg_error_encode(const prl_msg_error *x, const char *run, uint64_t id,
                                prl_bus_msg *m)
{
    char why[PRL_BUS_MAX_STRING];
    snprintf(why, sizeof why, "%s", x->reason && x->reason[0] ? x->reason : "?");
    for (char *p = why; *p; p++) /* a header string has no control characters */
        if ((unsigned char)*p < 32 || *p == 0x7f) *p = ' ';
    prl_status rc = prl_bus_msg_init(m, &prl_msg_error_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_str(m, "reason", why);
    if (!rc) rc = prl_bus_msg_set_uint(m, "ref", x->ref);
    if (!rc && x->has_lease) rc = prl_bus_msg_set_uint(m, "lease", x->lease);
    return msg_done(rc, m, "error");
}

prl_status prl_msg_error_decode(const prl_bus_msg *m, prl_msg_error *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = msg_is(m, &prl_msg_error_spec);
    if (!rc) rc = msg_str(m, "reason", &x->reason);
    x->ref = msg_uint_or(m, "ref", 0);
    x->has_lease = prl_bus_msg_get_uint(m, "lease", &x->lease) == PRL_OK;
    return msg_decoded(rc, x, sizeof *x, "error");
}

prl_status prl_msg_ack_encode(const prl_msg_ack *x, const char *run, uint64_t id, prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_ack_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "ref", x->ref);
    if (!rc) rc = msg_set_uint_opt(m, "lease", x->lease);
    return msg_done(rc, m, "ack");
}

prl_status prl_msg_ack_decode(const prl_bus_msg *m, prl_msg_ack *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = msg_is(m, &prl_msg_ack_spec);
    if (!rc) rc = msg_uint(m, "ref", &x->ref);
    x->lease = msg_uint_or(m, "lease", 0);
    return msg_decoded(rc, x, sizeof *x, "ack");
}
