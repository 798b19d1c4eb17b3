/*
** reward.c — the reward worker (`prl role reward`). Takes `score` (a task and the model's
** turns of one sample), runs the task's verifier (reward/; programs go to the sandbox) or
** asks the job's reward program (reward_program.c), mixes in the job's reward model and
** judge (reward_learned.c), and answers `scored` with the score and its breakdown as JSON
** (docs/pipeline.md).
*/
#include "roles/internal.h"

#include <stdlib.h>
#include <string.h>

/* The verifier's result as the `detail` JSON text (malloc'd; NULL when out of memory); with
** learned rewards also the rule score (`rule_score`, what accuracy counts). */
static char *result_json(const prl_reward_result *res, int mixed, double rule)
{
    json_t *o = prl_reward_result_json(res);
    if (o && mixed) json_object_set_new(o, "rule_score", json_real(rule));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

typedef struct reward_ctx {
    prl_role_exec exec;          /* the verifiers' programs, in the sandbox service */
    prl_reward_program *program; /* reward.program (NULL: the verifiers score) */
    prl_reward_learned *learned; /* reward.model, reward.judge (NULL: none) */
} reward_ctx;

/* ids[from, to) as a JSON array (empty without ids). */
static json_t *ids_json(const int32_t *ids, size_t from, size_t to)
{
    json_t *a = json_array();
    for (size_t i = from; a && ids && i < to; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* The content of the last message of `role` (in JSON messages or in turns), or "". */
static const char *last_of(const json_t *msgs, const char *role)
{
    const char *text = "";
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        const char *r = json_string_value(json_object_get(m, "role"));
        const char *c = json_string_value(json_object_get(m, "content"));
        if (r && c && !strcmp(r, role)) text = c;
    }
    return text;
}

/* The request line of a reward program (docs/rewards.md "Reward programs"): the sample's
** key, the prompt (text and messages), the completion (its final text, every turn, its
** ids), the prompt ids, and the task's other fields as metadata. malloc'd, or NULL. */
static char *program_request(const prl_msg_score *x)
{
    json_error_t je;
    json_t *task = json_loads(x->task, 0, &je);
    json_t *msgs = json_object_get(task, "messages");
    msgs = msgs ? json_incref(msgs) : json_array();
    size_t pl = (size_t)x->prompt_len;
    json_t *o = json_pack("{s:I, s:I, s:I, s:s, s:O, s:s, s:O, s:o, s:o, s:b}", "step",
                          (json_int_t)x->step, "prompt_index", (json_int_t)x->prompt, "sample",
                          (json_int_t)x->sample, "prompt", last_of(msgs, "user"), "messages", msgs,
                          "completion", last_of(x->turns_json, "assistant"), "turns", x->turns_json,
                          "prompt_ids", ids_json(x->tokens, 0, pl), "completion_ids",
                          ids_json(x->tokens, pl, x->n_tokens), "truncated", x->truncated);
    if (o && task) { /* the line's own fields, id, source and split: the task minus its prompt */
        json_object_del(task, "messages");
        json_object_set(o, "metadata", task);
    }
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o), json_decref(task), json_decref(msgs);
    return text;
}

static prl_status score_by_program(reward_ctx *k, const prl_msg_score *x, prl_reward_result *res)
{
    char *req = program_request(x);
    if (!req) return prl_error_set(PRL_ERR_NOMEM, "reward program request");
    prl_status rc = prl_reward_program_score(k->program, req, res);
    free(req);
    return rc;
}

static prl_status score(void *ctx, prl_worker *r, const prl_bus_msg *m)
{
    reward_ctx *k = ctx;
    prl_msg_score x;
    prl_status rc = prl_msg_score_decode(m, &x);
    if (rc) return rc;
    double t0 = prl_now();
    prl_reward_result res;
    memset(&res, 0, sizeof res);
    if (k->program) rc = score_by_program(k, &x, &res);
    else rc = prl_reward_score(x.task, x.msgs, x.n_msgs, &k->exec.exec, &res);
    if (!rc && x.truncated) prl_reward_unfinished(&res);
    double rule = res.score;
    if (!rc && k->learned)
        rc = prl_reward_learned_mix(k->learned, x.task, x.msgs, x.n_msgs, &res, &rule);
    char *detail = rc ? NULL : result_json(&res, k->learned != NULL, rule);
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
    reward_ctx k = {0};
    if ((rc = prl_worker_exec_open(&r, o, &k.exec))) {
        prl_worker_leave(&r);
        return rc;
    }
    const char *dash = strrchr(r.worker, '-');
    if (prl_job_has_reward_program(&r.job))
        rc = prl_reward_program_open(&k.program, &r.job, dash ? atoi(dash + 1) : 0);
    if (!rc) rc = prl_reward_learned_open(&k.learned, &r.job); /* one resident model each */
    if (!rc) rc = prl_worker_serve(&r, "score", score, &k);
    prl_worker_log(&r, "programs answered from the exec cache: %llu",
                   (unsigned long long)k.exec.hits);
    if (k.program)
        prl_worker_log(&r, "reward program restarts: %llu",
                       (unsigned long long)prl_reward_program_restarts(k.program));
    if (k.learned && r.job.reward_judge[0]) {
        uint64_t judged, unparsed;
        prl_reward_learned_counts(k.learned, &judged, &unparsed);
        prl_worker_log(&r, "judge: %llu answers graded, %llu replies unparseable (graded 0)",
                       (unsigned long long)judged, (unsigned long long)unparsed);
    }
    prl_reward_learned_close(k.learned);
    prl_reward_program_close(k.program);
    prl_role_exec_close(&k.exec);
    prl_worker_leave(&r);
    return rc;
}
