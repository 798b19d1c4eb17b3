/*
** role_reward.c — `prl role reward`: a reward worker. Takes `score` (a task and the model's
** turns of one sample), runs the domain's verifier (reward/; programs go to the sandbox) and
** answers `scored` with the score and its breakdown as JSON (docs/pipeline.md).
*/
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

/* The verifier's result as the `detail` JSON text (malloc'd; NULL when out of memory). */
static char *result_json(const prl_reward_result *res)
{
    json_t *o = prl_reward_result_json(res);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

static prl_status score(cli_role *r, const prl_reward_exec *exec, const prl_bus_msg *m)
{
    uint64_t lease = 0, step = 0, prompt = 0, sample = 0;
    prl_status rc = prl_bus_msg_get_uint(m, "lease", &lease);
    if (!rc) rc = prl_bus_msg_get_uint(m, "step", &step);
    if (!rc) rc = prl_bus_msg_get_uint(m, "prompt", &prompt);
    if (!rc) rc = prl_bus_msg_get_uint(m, "sample", &sample);
    char *task = rc ? NULL : prl_bus_msg_text(m, "task");
    char *turns_text = task ? prl_bus_msg_text(m, "turns") : NULL;
    if (!rc && (!task || !turns_text)) rc = PRL_ERR_FORMAT;
    json_error_t je;
    json_t *turns = turns_text ? json_loads(turns_text, 0, &je) : NULL;
    if (!rc && !json_is_array(turns)) rc = prl_error_set(PRL_ERR_FORMAT, "score: frame 'turns' is not a JSON array");
    prl_chat_message *msgs = NULL;
    size_t nm = 0;
    if (!rc) rc = cli_json_messages(turns, "score", 0, &msgs, &nm);
    double t0 = prl_now();
    prl_reward_result res;
    memset(&res, 0, sizeof res);
    if (!rc) rc = prl_reward_score(task, msgs, nm, exec, &res);
    uint64_t truncated = 0;
    prl_bus_msg_get_uint(m, "truncated", &truncated);
    if (!rc && truncated) prl_reward_unfinished(&res);
    char *detail = rc ? NULL : result_json(&res);
    if (!rc && !detail) rc = prl_error_set(PRL_ERR_NOMEM, "score detail");
    prl_bus_msg out;
    if (!rc) rc = prl_bus_msg_init(&out, "scored", r->run, ++r->next_id);
    if (!rc) {
        rc = prl_bus_msg_set_uint(&out, "lease", lease);
        if (!rc) rc = prl_bus_msg_set_uint(&out, "step", step);
        if (!rc) rc = prl_bus_msg_set_uint(&out, "prompt", prompt);
        if (!rc) rc = prl_bus_msg_set_uint(&out, "sample", sample);
        if (!rc) rc = prl_bus_msg_set_uint(&out, "score_us", (uint64_t)((prl_now() - t0) * 1e6));
        if (!rc) rc = prl_bus_msg_add_frame(&out, "detail", PRL_BUS_BYTES, detail, strlen(detail));
        if (!rc) rc = prl_bus_send(r->ctl, NULL, &out);
        prl_bus_msg_free(&out);
    }
    free(detail), free(msgs), free(task), free(turns_text);
    json_decref(turns);
    return rc;
}

int cmd_role_reward(int argc, char **argv)
{
    const char *connect = NULL, *name = "reward-0", *sandbox = NULL;
    int remote = 0;
    cli_opt opts[] = {
        {"connect", OPT_STR, &connect, "ENDPOINT", "the controller's endpoint", 1, 0},
        {"name", OPT_STR, &name, "NAME", "worker name, stable across restarts (default reward-0)", 0, 0},
        {"sandbox", OPT_STR, &sandbox, "ENDPOINT", "sandbox service for programs (default: a local sandbox)", 0, 0},
        {"allow-remote", OPT_FLAG, &remote, NULL, "allow a non-loopback tcp:// endpoint", 0, 0},
        {0}};
    int pr = cli_parse(argc, argv, 3, opts, "prl role reward --connect ENDPOINT [options]",
                       "A reward worker: scores samples with the domain verifiers for the controller "
                       "at ENDPOINT (docs/pipeline.md).", NULL, 0, NULL);
    if (pr) return pr == CLI_HELP ? 0 : 2;
    cli_role_install_signals();
    cli_role r;
    if (cli_role_join(&r, "reward", name, connect, remote)) return cli_fail("role reward");
    cli_role_exec x;
    if (cli_role_exec_open(&x, sandbox, name, r.job.reward_timeout)) {
        cli_role_leave(&r);
        return cli_fail("role reward");
    }
    int code = 0;
    while (!cli_role_stopping(&r)) {
        prl_bus_msg m;
        int got = 0;
        if (cli_role_next(&r, 200, &m, &got)) {
            code = cli_fail("role reward");
            break;
        }
        if (!got) continue;
        if (!strcmp(m.type, "score") && score(&r, &x.exec, &m)) cli_role_refuse(&r, &m, prl_error_message());
        else if (strcmp(m.type, "score")) cli_role_log(&r, "ignored a '%s' message", m.type);
        prl_bus_msg_free(&m);
    }
    cli_role_log(&r, "programs answered from the exec cache: %llu", (unsigned long long)x.hits);
    cli_role_exec_close(&x);
    cli_role_leave(&r);
    return code;
}
