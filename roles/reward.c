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
    if (!rc) rc = prl_chat_from_json(turns, "score: frame 'turns'", &msgs, &nm);
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
