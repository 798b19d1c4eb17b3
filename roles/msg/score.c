/*
** score.c — the messages of a reward worker (msg.h): `score` (a sample's task and the
** model's turns) and `scored` (its reward, the verifier's result as JSON).
*/
#include "roles/msg/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const prl_bus_type_spec prl_msg_score_spec = {
    "score",
    "the controller leases the scoring of one sample to a reward worker",
    {MSG_U("lease"), MSG_U("step"), MSG_U("prompt"), MSG_U("sample"), MSG_U_OPT("truncated"),
     MSG_U_OPT("prompt_len")},
    {{"task", PRL_BUS_BYTES}, {"turns", PRL_BUS_BYTES}}}; /* optional frame: tokens (i32) */
const prl_bus_type_spec prl_msg_scored_spec = {
    "scored",
    "a reward worker returns a sample's reward and breakdown (JSON)",
    {MSG_U("lease"), MSG_U("step"), MSG_U("prompt"), MSG_U("sample"), MSG_U("score_us")},
    {{"detail", PRL_BUS_BYTES}}};

/* The four keys of a sample, common to both. */
static prl_status sample_key(const prl_bus_msg *m, uint64_t *lease, uint64_t *step,
                             uint64_t *prompt, uint64_t *sample)
{
    prl_status rc = msg_uint(m, "lease", lease);
    if (!rc) rc = msg_uint(m, "step", step);
    if (!rc) rc = msg_uint(m, "prompt", prompt);
    if (!rc) rc = msg_uint(m, "sample", sample);
    return rc;
}

static prl_status sample_key_set(prl_bus_msg *m, uint64_t lease, uint64_t step, uint64_t prompt,
                                 uint64_t sample)
{
    prl_status rc = prl_bus_msg_set_uint(m, "lease", lease);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", step);
    if (!rc) rc = prl_bus_msg_set_uint(m, "prompt", prompt);
    if (!rc) rc = prl_bus_msg_set_uint(m, "sample", sample);
    return rc;
}

/* ---------------------------------------------------------------- score ------------ */

prl_status prl_msg_score_encode(const prl_msg_score *x, const char *run, uint64_t id,
                                prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_score_spec, run, id);
    if (!rc) rc = sample_key_set(m, x->lease, x->step, x->prompt, x->sample);
    if (!rc) rc = prl_bus_msg_set_uint(m, "truncated", (uint64_t)(x->truncated != 0));
    if (!rc) rc = prl_bus_msg_add_frame(m, "task", PRL_BUS_BYTES, x->task, strlen(x->task));
    if (!rc) rc = prl_bus_msg_add_frame(m, "turns", PRL_BUS_BYTES, x->turns, strlen(x->turns));
    if (!rc && x->tokens) rc = prl_bus_msg_set_uint(m, "prompt_len", (uint64_t)x->prompt_len);
    if (!rc && x->tokens)
        rc = prl_bus_msg_add_frame(m, "tokens", PRL_BUS_I32, x->tokens, x->n_tokens);
    return msg_done(rc, m, "score");
}

/* The optional frame `tokens` (ids >= 0) with `prompt_len` in [1, n_tokens]. */
static prl_status score_tokens(const prl_bus_msg *m, prl_msg_score *x)
{
    if (!prl_bus_msg_frame(m, "tokens")) return PRL_OK;
    const prl_bus_frame *f;
    uint64_t pl = 0;
    prl_status rc = msg_frame(m, "tokens", PRL_BUS_I32, SIZE_MAX, &f);
    if (!rc) rc = msg_uint(m, "prompt_len", &pl);
    if (rc) return rc;
    if (f->count == 0 || pl < 1 || pl > f->count)
        return prl_error_set(PRL_ERR_FORMAT, "prompt_len %llu must be in 1..%zu (frame 'tokens')",
                             (unsigned long long)pl, f->count);
    x->tokens = malloc(f->count * sizeof *x->tokens);
    if (!x->tokens) return prl_error_set(PRL_ERR_NOMEM, "score tokens");
    memcpy(x->tokens, f->data, f->count * sizeof *x->tokens);
    x->n_tokens = f->count, x->prompt_len = (int)pl;
    for (size_t i = 0; i < x->n_tokens; i++)
        if (x->tokens[i] < 0)
            return prl_error_set(PRL_ERR_FORMAT, "frame 'tokens': id %d at %zu", x->tokens[i], i);
    return PRL_OK;
}

static prl_status score_decode(const prl_bus_msg *m, prl_msg_score *x)
{
    prl_status rc = msg_is(m, &prl_msg_score_spec);
    if (!rc) rc = sample_key(m, &x->lease, &x->step, &x->prompt, &x->sample);
    if (rc) return rc;
    x->truncated = msg_uint_or(m, "truncated", 0) != 0;
    x->task = prl_bus_msg_text(m, "task");
    if (!x->task) return PRL_ERR_FORMAT;
    if ((rc = score_tokens(m, x))) return rc;
    if ((rc = msg_json(m, "turns", &x->turns_json))) return rc;
    if (!json_is_array(x->turns_json))
        return prl_error_set(PRL_ERR_FORMAT, "frame 'turns' is not a JSON array");
    return prl_chat_from_json(x->turns_json, "frame 'turns'", &x->msgs, &x->n_msgs);
}

prl_status prl_msg_score_decode(const prl_bus_msg *m, prl_msg_score *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = score_decode(m, x);
    if (rc) prl_msg_score_free(x);
    return msg_decoded(rc, x, sizeof *x, "score");
}

void prl_msg_score_free(prl_msg_score *x)
{
    free((char *)x->task), free(x->msgs), free(x->tokens);
    json_decref(x->turns_json);
    memset(x, 0, sizeof *x);
}

/* ---------------------------------------------------------------- scored ----------- */

prl_status prl_msg_scored_encode(const prl_msg_scored *x, const char *run, uint64_t id,
                                 prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_scored_spec, run, id);
    if (!rc) rc = sample_key_set(m, x->lease, x->step, x->prompt, x->sample);
    if (!rc) rc = prl_bus_msg_set_uint(m, "score_us", x->score_us);
    if (!rc) rc = prl_bus_msg_add_frame(m, "detail", PRL_BUS_BYTES, x->detail, strlen(x->detail));
    return msg_done(rc, m, "scored");
}

static prl_status scored_decode(const prl_bus_msg *m, prl_msg_scored *x)
{
    prl_status rc = msg_is(m, &prl_msg_scored_spec);
    if (!rc) rc = sample_key(m, &x->lease, &x->step, &x->prompt, &x->sample);
    if (!rc) rc = msg_uint(m, "score_us", &x->score_us);
    if (rc) return rc;
    json_t *dj = NULL;
    char *detail = prl_bus_msg_text(m, "detail");
    json_error_t je;
    if (detail) dj = json_loads(detail, 0, &je);
    json_t *score = json_object_get(dj, "score");
    double v = json_number_value(score);
    if (!json_is_number(score) || !isfinite(v) || v < 0 || v > 1) {
        free(detail), json_decref(dj);
        return prl_error_set(PRL_ERR_FORMAT,
                             "frame 'detail' must be JSON with a \"score\" in [0, 1]");
    }
    x->detail = detail, x->score = v;
    x->flags = (unsigned)json_integer_value(json_object_get(dj, "flags"));
    json_decref(dj);
    return PRL_OK;
}

prl_status prl_msg_scored_decode(const prl_bus_msg *m, prl_msg_scored *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = scored_decode(m, x);
    if (rc) prl_msg_scored_free(x);
    return msg_decoded(rc, x, sizeof *x, "scored");
}

void prl_msg_scored_free(prl_msg_scored *x)
{
    free((char *)x->detail);
    memset(x, 0, sizeof *x);
}
