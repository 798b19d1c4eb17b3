/*
** exec.c — the messages of the sandbox service (msg.h): `exec` (one program to run) and
** `exec_result` (its outcome). A valid `exec` the service cannot run — an unknown lang, a
** wall_ms outside 1..PRL_MSG_EXEC_MAX_WALL_MS, an empty program or one with a NUL byte — is
** refused by the decoder, naming the field.
*/
#include "roles/msg/internal.h"

#include <string.h>

const prl_bus_type_spec prl_msg_exec_spec = {
    "exec",
    "run one program in the sandbox service (reply: exec_result with ref = id)",
    {MSG_S("lang"), MSG_U("wall_ms")},
    {{"program", PRL_BUS_BYTES}, {"stdin", PRL_BUS_BYTES}}};
const prl_bus_type_spec prl_msg_exec_result_spec = {
    "exec_result",
    "the outcome of exec `ref`: status, exit code, outputs",
    {MSG_U("ref"), MSG_S("status"), MSG_U("exit_code"), MSG_U("wall_us")},
    {{"stdout", PRL_BUS_BYTES}, {"stderr", PRL_BUS_BYTES}}};

/* ---------------------------------------------------------------- exec ------------- */

prl_status prl_msg_exec_encode(const prl_msg_exec *x, const char *run, uint64_t id, prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_exec_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_str(m, "lang", x->lang);
    if (!rc) rc = prl_bus_msg_set_uint(m, "wall_ms", x->wall_ms);
    if (!rc) rc = prl_bus_msg_add_frame(m, "program", PRL_BUS_BYTES, x->program, x->program_len);
    if (!rc) rc = prl_bus_msg_add_frame(m, "stdin", PRL_BUS_BYTES, x->stdin_data, x->stdin_len);
    return msg_done(rc, m, "exec");
}

static prl_status exec_decode(const prl_bus_msg *m, prl_msg_exec *x)
{
    const prl_bus_frame *prog = NULL, *in = NULL;
    prl_status rc = msg_is(m, &prl_msg_exec_spec);
    if (!rc) rc = msg_str(m, "lang", &x->lang);
    if (!rc) rc = msg_uint(m, "wall_ms", &x->wall_ms);
    if (!rc) rc = msg_frame(m, "program", PRL_BUS_BYTES, SIZE_MAX, &prog);
    if (!rc) rc = msg_frame(m, "stdin", PRL_BUS_BYTES, SIZE_MAX, &in);
    if (rc) return rc;
    if (strcmp(x->lang, "python3") != 0 && strcmp(x->lang, "sh") != 0)
        return prl_error_set(PRL_ERR_FORMAT,
                             "field 'lang': unknown language '%.64s' (python3 "
                             "or sh)",
                             x->lang);
    if (x->wall_ms == 0 || x->wall_ms > PRL_MSG_EXEC_MAX_WALL_MS)
        return prl_error_set(PRL_ERR_FORMAT, "field 'wall_ms': %llu is not in 1..%u",
                             (unsigned long long)x->wall_ms, PRL_MSG_EXEC_MAX_WALL_MS);
    if (prog->bytes == 0) return prl_error_set(PRL_ERR_FORMAT, "frame 'program' is empty");
    if (memchr(prog->data, 0, prog->bytes))
        return prl_error_set(PRL_ERR_FORMAT, "frame 'program' contains a NUL byte");
    x->program = prog->data, x->program_len = prog->bytes;
    x->stdin_data = in->data, x->stdin_len = in->bytes;
    return PRL_OK;
}

prl_status prl_msg_exec_decode(const prl_bus_msg *m, prl_msg_exec *x)
{
    memset(x, 0, sizeof *x);
    return msg_decoded(exec_decode(m, x), x, sizeof *x, "exec");
}

/* ---------------------------------------------------------------- exec_result ------ */

prl_status prl_msg_exec_result_encode(const prl_msg_exec_result *x, const char *run, uint64_t id,
                                      prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_exec_result_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "ref", x->ref);
    if (!rc) rc = prl_bus_msg_set_str(m, "status", x->status);
    if (!rc) rc = prl_bus_msg_set_uint(m, "exit_code", x->exit_code);
    if (!rc) rc = prl_bus_msg_set_uint(m, "wall_us", x->wall_us);
    if (!rc) rc = prl_bus_msg_add_frame(m, "stdout", PRL_BUS_BYTES, x->out, x->out_len);
    if (!rc) rc = prl_bus_msg_add_frame(m, "stderr", PRL_BUS_BYTES, x->err, x->err_len);
    return msg_done(rc, m, "exec_result");
}

prl_status prl_msg_exec_result_decode(const prl_bus_msg *m, prl_msg_exec_result *x)
{
    memset(x, 0, sizeof *x);
    const prl_bus_frame *out = NULL, *err = NULL;
    prl_status rc = msg_is(m, &prl_msg_exec_result_spec);
    if (!rc) rc = msg_uint(m, "ref", &x->ref);
    if (!rc) rc = msg_str(m, "status", &x->status);
    if (!rc) rc = msg_uint(m, "exit_code", &x->exit_code);
    if (!rc) rc = msg_uint(m, "wall_us", &x->wall_us);
    if (!rc) rc = msg_frame(m, "stdout", PRL_BUS_BYTES, SIZE_MAX, &out);
    if (!rc) rc = msg_frame(m, "stderr", PRL_BUS_BYTES, SIZE_MAX, &err);
    if (!rc)
        x->out = out->data, x->out_len = out->bytes, x->err = err->data, x->err_len = err->bytes;
    return msg_decoded(rc, x, sizeof *x, "exec_result");
}
