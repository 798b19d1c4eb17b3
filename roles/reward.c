/*
** reward.c — the reward worker (`prl role reward`). Takes `score` (a task and the model's
** turns of one sample), runs the domain's verifier (reward/; programs go to the sandbox) and
** answers `scored` with the score and its breakdown as JSON (docs/pipeline.md).
*/
#include "roles/internal.h"

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

static prl_status score(void *ctx, prl_worker *r, const prl_bus_msg *m)
{
    const prl_reward_exec *exec = ctx;
    prl_msg_score x;
    prl_status rc = prl_msg_score_decode(m, &x);
    if (rc) return rc;
    double t0 = prl_now();
    prl_reward_result res;
    memset(&res, 0, sizeof res);
    rc = prl_reward_score(x.task, x.msgs, x.n_msgs, exec, &res);
    if (!rc && x.truncated) prl_reward_unfinished(&res);
    char *detail = rc ? NULL : result_json(&res);
    if (!rc && !detail) rc = prl_error_set(PRL_ERR_NOMEM, "score detail");
    prl_msg_scored out = {.lease = x.lease,
                          .step = x.step,
                          .prompt = x.prompt,
                          .sample = x.sample,
                          .score_us = (uint64_t)((prl_now() - t0) * 1e6),
                          .detail = detail};
    prl_bus_msg om;
    if (!rc) rc = prl_msg_scored_encode(&out, r->run, ++r->next_id, &om);
    if (!rc) rc = prl_worker_send(r, &om);
    free(detail);
    prl_msg_score_free(&x);
    return rc;
}

prl_status prl_role_reward_run(const prl_worker_options *o)
{
    prl_worker r;
    prl_status rc = prl_worker_join(&r, "reward", o);
    if (rc) return rc;
    prl_role_exec x;
    if ((rc = prl_role_exec_open(&x, o->sandbox, o->name, r.job.reward_timeout))) {
        prl_worker_leave(&r);
        return rc;
    }
    rc = prl_worker_serve(&r, "score", score, &x.exec);
    prl_worker_log(&r, "programs answered from the exec cache: %llu", (unsigned long long)x.hits);
    prl_role_exec_close(&x);
    prl_worker_leave(&r);
    return rc;
}
