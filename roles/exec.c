/*
** exec.c — where the verifiers' programs run (prl_reward_exec_fn, roles.h):
**   - prl_exec_local_run: in a sandbox of this process (sandbox/), in one slot, with the
**     sandbox's default limits and the verifier's wall time; the sandbox starts on the first
**     run, so commands that never execute a program (General, Agent) never probe it;
**   - prl_exec_service_run: the same over the sandbox service (a prl_sandbox_client as ctx);
**     both share the conversion of a sandbox result into the verifiers' result;
**   - prl_role_exec: either of them behind a cache of finished runs, for the rollout and
**     reward roles.
*/
#include "roles/roles.h"

#include <stdlib.h>
#include <string.h>

struct prl_exec_local {
    prl_sandbox *sb;
    int tried;
    prl_status init_rc;
    char init_msg[512];
};

prl_exec_local *prl_exec_local_new(void) { return calloc(1, sizeof(prl_exec_local)); }

void prl_exec_local_free(prl_exec_local *x)
{
    if (!x) return;
    prl_sandbox_free(x->sb);
    free(x);
}

static prl_status ensure_sandbox(prl_exec_local *x)
{
    if (!x->tried) {
        x->tried = 1;
        prl_sandbox_options opt;
        prl_sandbox_options_default(&opt);
        x->init_rc = prl_sandbox_init(&x->sb, &opt);
        if (x->init_rc) snprintf(x->init_msg, sizeof x->init_msg, "%s", prl_error_message());
    }
    if (x->init_rc)
        return prl_error_set(x->init_rc, "the sandbox could not start: %s", x->init_msg);
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
static prl_status reward_result_take(prl_status rc, prl_sandbox_result *r,
                                     prl_reward_exec_result *res)
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

prl_status prl_exec_local_run(void *ctx, const prl_reward_exec_request *req,
                              prl_reward_exec_result *res)
{
    memset(res, 0, sizeof *res);
    prl_status rc = ensure_sandbox(ctx);
    if (rc) return rc;
    prl_sandbox_request sr = {.lang = req->lang,
                              .program = req->program,
                              .program_len = strlen(req->program),
                              .stdin_data = req->stdin_data,
                              .stdin_len = req->stdin_len};
    prl_sandbox_limits_default(&sr.limits);
    sr.limits.wall_seconds = req->wall_s;
    sr.limits.cpu_seconds = req->wall_s + 1;
    prl_sandbox_result r;
    rc = prl_sandbox_run(((prl_exec_local *)ctx)->sb, 0, &sr, &r);
    return reward_result_take(rc, &r, res);
}

prl_status prl_exec_service_run(void *ctx, const prl_reward_exec_request *req,
                                prl_reward_exec_result *res)
{
    memset(res, 0, sizeof *res);
    prl_sandbox_result r;
    prl_status rc = prl_sandbox_client_exec(ctx, req->lang, req->program, req->stdin_data,
                                            req->stdin_len, req->wall_s, &r);
    return reward_result_take(rc, &r, res);
}

/* ---------------------------------------------------------------- the roles' cache - */

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
static prl_status exec_cached(void *ctx, const prl_reward_exec_request *q,
                              prl_reward_exec_result *res)
{
    prl_role_exec *x = ctx;
    uint64_t k = exec_key(q);
    prl_exec_cache_entry *e = &x->cache[k % PRL_EXEC_CACHE];
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

/* The executor over client svc (opened by the caller into x->svc). */
static void use_service(prl_role_exec *x)
{
    x->inner.fn = prl_exec_service_run, x->inner.ctx = x->svc;
}

prl_status prl_role_exec_open_curve(prl_role_exec *x, const char *sandbox, const char *worker,
                                    const prl_bus_curve_keypair *kp, const char *server_pub,
                                    double wall_s)
{
    prl_status rc = prl_role_exec_open(x, NULL, worker, NULL, wall_s);
    if (rc) return rc;
    prl_exec_local_free(x->local);
    x->local = NULL;
    char name[96];
    snprintf(name, sizeof name, "%s.sandbox", worker);
    if ((rc = prl_sandbox_client_open_curve(&x->svc, sandbox, name, kp, server_pub))) return rc;
    use_service(x);
    return PRL_OK;
}

prl_status prl_role_exec_open(prl_role_exec *x, const char *sandbox, const char *worker,
                              const char *secret, double wall_s)
{
    memset(x, 0, sizeof *x);
    x->cache = calloc(PRL_EXEC_CACHE, sizeof *x->cache);
    if (!x->cache) return prl_error_set(PRL_ERR_NOMEM, "exec cache");
    x->exec = (prl_reward_exec){.fn = exec_cached, .ctx = x, .wall_s = wall_s};
    x->inner.wall_s = wall_s;
    if (!sandbox) { /* no service: a sandbox of this process's own */
        x->local = prl_exec_local_new();
        if (!x->local) return prl_error_set(PRL_ERR_NOMEM, "executor");
        x->inner.fn = prl_exec_local_run, x->inner.ctx = x->local;
        return PRL_OK;
    }
    char name[96];
    snprintf(name, sizeof name, "%s.sandbox", worker);
    prl_status rc = prl_sandbox_client_open(&x->svc, sandbox, name, secret);
    if (rc) return rc;
    use_service(x);
    return PRL_OK;
}

void prl_role_exec_close(prl_role_exec *x)
{
    for (int i = 0; x->cache && i < PRL_EXEC_CACHE; i++)
        if (x->cache[i].used) prl_reward_exec_result_free(&x->cache[i].result);
    free(x->cache);
    prl_exec_local_free(x->local);
    prl_sandbox_client_free(x->svc);
    memset(x, 0, sizeof *x);
}
