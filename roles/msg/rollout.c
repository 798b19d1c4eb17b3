/*
** rollout.c — the messages of a rollout worker (msg.h): `work` (one prompt's samples to
** generate) and `result` (one generated sample: tokens, infer log-probs, loss mask, MoE
** routes, the model's turns).
*/
#include "roles/msg/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const prl_bus_type_spec prl_msg_work_spec = {
    "work",
    "the controller leases one work item to a worker (rollout: `count` samples of one "
    "prompt from index `sample`, at the checkpoint `path`)",
    {MSG_U("lease"), MSG_U("step"), MSG_U("prompt"), MSG_U("sample"), MSG_U("policy_version"),
     MSG_S_OPT("task"), MSG_U_OPT("count"), MSG_S_OPT("path"), MSG_U_OPT("eval")},
    {{0}}};
const prl_bus_type_spec prl_msg_result_spec = {
    "result",
    "a worker returns the result of a leased work item (rollout: one sample)",
    {MSG_U("lease"), MSG_U("step"), MSG_U("prompt"), MSG_U("sample"), MSG_U("policy_version"),
     MSG_U_OPT("prompt_len"), MSG_U_OPT("gen_us"), MSG_U_OPT("stop")},
    {{"tokens", PRL_BUS_I32}, {"logprobs", PRL_BUS_F32}}};

/* ---------------------------------------------------------------- work ------------- */

prl_status prl_msg_work_encode(const prl_msg_work *x, const char *run, uint64_t id, prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_work_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", x->lease);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", x->step);
    if (!rc) rc = prl_bus_msg_set_uint(m, "prompt", x->prompt);
    if (!rc) rc = prl_bus_msg_set_uint(m, "sample", x->sample);
    if (!rc) rc = prl_bus_msg_set_uint(m, "count", x->count);
    if (!rc) rc = prl_bus_msg_set_uint(m, "policy_version", x->policy_version);
    if (!rc) rc = prl_bus_msg_set_str(m, "path", x->path);
    if (!rc) rc = msg_set_uint_opt(m, "eval", (uint64_t)(x->eval != 0));
    if (!rc) rc = prl_bus_msg_add_frame(m, "task", PRL_BUS_BYTES, x->task, strlen(x->task));
    return msg_done(rc, m, "work");
}

static prl_status work_decode(const prl_bus_msg *m, prl_msg_work *x)
{
    prl_status rc = msg_is(m, &prl_msg_work_spec);
    if (!rc) rc = msg_uint(m, "lease", &x->lease);
    if (!rc) rc = msg_uint(m, "step", &x->step);
    if (!rc) rc = msg_uint(m, "prompt", &x->prompt);
    if (!rc) rc = msg_uint(m, "sample", &x->sample);
    if (!rc) rc = msg_uint(m, "count", &x->count);
    if (!rc) rc = msg_uint(m, "policy_version", &x->policy_version);
    if (!rc) rc = msg_str(m, "path", &x->path);
    if (rc) return rc;
    x->eval = msg_uint_or(m, "eval", 0) != 0;
    if (x->count < 1 || x->count > PRL_MSG_MAX_SAMPLES || x->sample > PRL_MSG_MAX_SAMPLE)
        return prl_error_set(PRL_ERR_ARG,
                             "count %llu must be in 1..%d and sample %llu at most "
                             "2^20",
                             (unsigned long long)x->count, PRL_MSG_MAX_SAMPLES,
                             (unsigned long long)x->sample);
    if ((rc = msg_json(m, "task", &x->task_json))) return rc;
    if (!json_is_object(x->task_json))
        return prl_error_set(PRL_ERR_FORMAT, "frame 'task' is not a JSON object");
    return PRL_OK;
}

prl_status prl_msg_work_decode(const prl_bus_msg *m, prl_msg_work *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = work_decode(m, x);
    if (rc) prl_msg_work_free(x);
    return msg_decoded(rc, x, sizeof *x, "work");
}

void prl_msg_work_free(prl_msg_work *x)
{
    json_decref(x->task_json);
    memset(x, 0, sizeof *x);
}

/* ---------------------------------------------------------------- result ----------- */

json_t *prl_msg_turns_json(const prl_chat_message *msgs, int n)
{
    json_t *turns = json_array();
    for (int i = 0; turns && i < n; i++)
        if (json_array_append_new(
                turns, json_pack("{s:s,s:s}", "role", msgs[i].role, "content", msgs[i].content))) {
            json_decref(turns);
            return NULL;
        }
    return turns;
}

/* The meta frame: the model's turns for the verifier, and the routes' shape. */
static char *result_meta(const prl_msg_result *x)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set(o, "turns", x->turns);
    json_object_set_new(o, "truncated", json_boolean(x->truncated));
    json_object_set_new(o, "turns_played", json_integer(x->turns_played));
    if (x->routes) json_object_set_new(o, "route_shape", prl_route_shape_json(&x->route_shape));
    if (x->has_reward) json_object_set_new(o, "reward", json_real(x->reward));
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

prl_status prl_msg_result_encode(const prl_msg_result *x, const char *run, uint64_t id,
                                 prl_bus_msg *m)
{
    size_t nr = x->n_tokens - (size_t)x->prompt_len;
    if (x->has_reward && !(x->reward >= 0 && x->reward <= 1)) {
        memset(m, 0, sizeof *m); /* left empty, as on any encoder error */
        return prl_error_set(PRL_ERR_FORMAT, "result: meta 'reward' %g must be in [0, 1]",
                             x->reward);
    }
    char *meta = result_meta(x);
    prl_status rc = meta ? prl_bus_msg_init(m, &prl_msg_result_spec, run, id)
                         : prl_error_set(PRL_ERR_NOMEM, "result meta");
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", x->lease);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", x->step);
    if (!rc) rc = prl_bus_msg_set_uint(m, "prompt", x->prompt);
    if (!rc) rc = prl_bus_msg_set_uint(m, "sample", x->sample);
    if (!rc) rc = prl_bus_msg_set_uint(m, "policy_version", x->policy_version);
    if (!rc) rc = prl_bus_msg_set_uint(m, "prompt_len", (uint64_t)x->prompt_len);
    if (!rc) rc = prl_bus_msg_set_uint(m, "gen_us", x->gen_us);
    if (!rc) rc = prl_bus_msg_set_uint(m, "stop", (uint64_t)x->stop);
    if (!rc) rc = prl_bus_msg_add_frame(m, "tokens", PRL_BUS_I32, x->tokens, x->n_tokens);
    if (!rc) rc = prl_bus_msg_add_frame(m, "logprobs", PRL_BUS_F32, x->logprobs, nr);
    if (!rc) rc = prl_bus_msg_add_frame(m, "mask", PRL_BUS_U8, x->mask, nr);
    if (!rc && x->routes)
        rc = prl_bus_msg_add_frame(m, "routes", PRL_BUS_U8, x->routes, x->routes_bytes);
    if (!rc) rc = prl_bus_msg_add_frame(m, "meta", PRL_BUS_BYTES, meta, strlen(meta));
    free(meta);
    return msg_done(rc, m, "result");
}

/* ids >= 0; per response token a finite log-prob <= 0 and a mask of 0 or 1. */
static prl_status result_values(const prl_msg_result *x)
{
    for (size_t i = 0; i < x->n_tokens; i++)
        if (x->tokens[i] < 0)
            return prl_error_set(PRL_ERR_FORMAT, "token %zu has the negative id %d", i,
                                 (int)x->tokens[i]);
    for (size_t i = 0; i < x->n_tokens - (size_t)x->prompt_len; i++)
        if (!isfinite(x->logprobs[i]) || x->logprobs[i] > 0 || x->mask[i] > 1)
            return prl_error_set(PRL_ERR_FORMAT, "response token %zu has log-prob %g and mask %u",
                                 i, (double)x->logprobs[i], x->mask[i]);
    return PRL_OK;
}

/* A routes frame whose shape (meta.route_shape) does not fit its bytes and tokens is
** dropped, not refused: the sample is stored and trained alike without routes (the trainer
** routes natively), and routes_dropped says why. */
static void result_routes(const prl_bus_msg *m, prl_msg_result *x)
{
    const prl_bus_frame *rt = prl_bus_msg_frame(m, "routes");
    if (!rt || rt->dtype != PRL_BUS_U8 || !rt->bytes) return;
    prl_route_shape s;
    prl_status rc = prl_route_shape_from_json(json_object_get(x->meta, "route_shape"), &s);
    if (!rc) rc = prl_route_shape_check(&s, rt->bytes, x->n_tokens);
    if (rc) {
        snprintf(x->routes_dropped, sizeof x->routes_dropped, "%s", prl_error_message());
        return;
    }
    x->routes = rt->data, x->routes_bytes = rt->bytes, x->route_shape = s;
}

static prl_status result_decode(const prl_bus_msg *m, prl_msg_result *x)
{
    uint64_t plen = 0;
    prl_status rc = msg_is(m, &prl_msg_result_spec);
    if (!rc) rc = msg_uint(m, "lease", &x->lease);
    if (!rc) rc = msg_uint(m, "step", &x->step);
    if (!rc) rc = msg_uint(m, "prompt", &x->prompt);
    if (!rc) rc = msg_uint(m, "sample", &x->sample);
    if (!rc) rc = msg_uint(m, "policy_version", &x->policy_version);
    if (!rc) rc = msg_uint(m, "prompt_len", &plen);
    const prl_bus_frame *tok = NULL, *lp = NULL, *mk = NULL;
    if (!rc) rc = msg_frame(m, "tokens", PRL_BUS_I32, SIZE_MAX, &tok);
    if (rc) return rc;
    x->gen_us = msg_uint_or(m, "gen_us", 0), x->stop = (int)msg_uint_or(m, "stop", 0);
    if (plen < 1 || plen >= tok->count || tok->count > PRL_MSG_MAX_TOKENS)
        return prl_error_set(PRL_ERR_FORMAT, "prompt_len %llu must be in [1, %zu)",
                             (unsigned long long)plen, tok->count);
    size_t nr = tok->count - plen;
    if ((rc = msg_frame(m, "logprobs", PRL_BUS_F32, nr, &lp)))
        return prl_error_set(rc, "frame 'logprobs' must hold one f32 per response token");
    if ((rc = msg_frame(m, "mask", PRL_BUS_U8, nr, &mk)))
        return prl_error_set(rc, "frame 'mask' must hold one u8 per response token");
    x->prompt_len = (int)plen, x->tokens = tok->data, x->n_tokens = tok->count;
    x->logprobs = lp->data, x->mask = mk->data;
    if (msg_json(m, "meta", &x->meta) || !json_is_array(json_object_get(x->meta, "turns")))
        return prl_error_set(PRL_ERR_FORMAT, "frame 'meta' must be JSON with a \"turns\" array");
    x->turns = json_object_get(x->meta, "turns");
    x->truncated = json_is_true(json_object_get(x->meta, "truncated"));
    x->turns_played = (int)json_integer_value(json_object_get(x->meta, "turns_played"));
    json_t *reward = json_object_get(x->meta, "reward");
    if (reward && (!json_is_number(reward) || !(json_number_value(reward) >= 0) ||
                   json_number_value(reward) > 1))
        return prl_error_set(PRL_ERR_FORMAT, "meta 'reward' must be a number in [0, 1]");
    x->has_reward = reward != NULL, x->reward = reward ? json_number_value(reward) : 0;
    if ((rc = result_values(x))) return rc;
    result_routes(m, x);
    return PRL_OK;
}

prl_status prl_msg_result_decode(const prl_bus_msg *m, prl_msg_result *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = result_decode(m, x);
    if (rc) prl_msg_result_free(x);
    return msg_decoded(rc, x, sizeof *x, "result");
}

void prl_msg_result_free(prl_msg_result *x)
{
    json_decref(x->meta);
    memset(x, 0, sizeof *x);
}
