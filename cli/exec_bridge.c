/*
** exec_bridge.c — the CLI's program executor for the verifiers (prl_reward_exec_fn): every
** program runs in the sandbox (sandbox/), in one slot, with the sandbox's default limits and
** the verifier's wall time. The sandbox is started on the first run, so commands that never
** execute a program (General, Agent) never probe it.
**
** cli_exec_service is the same executor over the sandbox service (a prl_sandbox_client as
** ctx), for the reward and rollout roles; both share the conversion of a sandbox result
** into the verifiers' result.
*/
#include "cli/cli.h"
#include "sandbox/sandbox.h"

#include <stdlib.h>
#include <string.h>

struct cli_exec {
    prl_sandbox *sb;
    int tried;
    prl_status init_rc;
    char init_msg[512];
};

cli_exec *cli_exec_new(void) { return calloc(1, sizeof(cli_exec)); }

void cli_exec_free(cli_exec *x)
{
    if (!x) return;
    prl_sandbox_free(x->sb);
    free(x);
}

static prl_status ensure_sandbox(cli_exec *x)
{
    if (!x->tried) {
        x->tried = 1;
        prl_sandbox_options opt;
        prl_sandbox_options_default(&opt);
        x->init_rc = prl_sandbox_init(&x->sb, &opt);
        if (x->init_rc) snprintf(x->init_msg, sizeof x->init_msg, "%s", prl_error_message());
    }
    if (x->init_rc) return prl_error_set(x->init_rc, "the sandbox could not start: %s", x->init_msg);
    return PRL_OK;
}

/* The verifiers' status words (reward.h) for the sandbox's statuses. */
static const char *reward_status(prl_sandbox_status s)
{
    switch (s) {
    case PRL_SANDBOX_STATUS_OK: return "ok";
    case PRL_SANDBOX_STATUS_RUNTIME_ERROR: return "runtime_error";
    case PRL_SANDBOX_STATUS_TIMEOUT: return "timeout";
    case PRL_SANDBOX_STATUS_MEMORY_LIMIT: return "memory_limit";
    case PRL_SANDBOX_STATUS_OUTPUT_LIMIT: return "output_limit";
    case PRL_SANDBOX_STATUS_KILLED: return "violation"; /* a forbidden syscall or ABI */
    default: return "error";
    }
}

/* Move a finished run into the verifiers' result (the output buffers change owner; r is
** freed either way). A run that failed to start (rc, or status sandbox_error) is an
** executor failure, not a program's result. */
static prl_status reward_result_take(prl_status rc, prl_sandbox_result *r, prl_reward_exec_result *res)
{
    if (rc == PRL_OK && r->status == PRL_SANDBOX_STATUS_SANDBOX_ERROR)
        rc = prl_error_set(PRL_ERR_IO, "%s", r->reason);
    if (rc) {
        prl_sandbox_result_free(r);
        return prl_error_wrap(rc, "sandbox: ");
    }
    snprintf(res->status, sizeof res->status, "%s", reward_status(r->status));
    res->exit_code = r->exit_code;
    res->wall_s = r->wall_seconds;
    res->stdout_data = r->out ? r->out : strdup(""), res->stdout_len = r->out_len;
    res->stderr_data = r->err ? r->err : strdup(""), res->stderr_len = r->err_len;
    r->out = r->err = NULL; /* now owned by res */
    prl_sandbox_result_free(r);
    if (!res->stdout_data || !res->stderr_data) {
        prl_reward_exec_result_free(res);
        return prl_error_set(PRL_ERR_NOMEM, "sandbox output");
    }
    return PRL_OK;
}

prl_status cli_exec_sandboxed(void *ctx, const prl_reward_exec_request *req,
                              prl_reward_exec_result *res)
{
    memset(res, 0, sizeof *res);
    prl_status rc = ensure_sandbox(ctx);
    if (rc) return rc;
    prl_sandbox_request sr = {.lang = req->lang, .program = req->program,
                              .program_len = strlen(req->program), .stdin_data = req->stdin_data,
                              .stdin_len = req->stdin_len};
    prl_sandbox_limits_default(&sr.limits);
    sr.limits.wall_seconds = req->wall_s;
    sr.limits.cpu_seconds = req->wall_s + 1;
    prl_sandbox_result r;
    rc = prl_sandbox_run(((cli_exec *)ctx)->sb, 0, &sr, &r);
    return reward_result_take(rc, &r, res);
}

prl_status cli_exec_service(void *ctx, const prl_reward_exec_request *req,
                            prl_reward_exec_result *res)
{
    memset(res, 0, sizeof *res);
    prl_sandbox_result r;
    prl_status rc = prl_sandbox_client_exec(ctx, req->lang, req->program, req->stdin_data,
                                            req->stdin_len, req->wall_s, &r);
    return reward_result_take(rc, &r, res);
}
