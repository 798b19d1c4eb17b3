/*
** teach.c — the messages of an OPD teacher (msg.h): `teach` (one teacher's samples of a
** step, a grpo batch's sequence frames) and `taught` (the expert's log-probs of the item's
** response tokens, with opd.topk its top-k), whose values are checked against the item by
** opd's rules (prl_opd_batch_check) — the trainer's rules for the same numbers.
*/
#include "roles/msg/internal.h"

#include <string.h>

const prl_bus_type_spec prl_msg_teach_spec = {
    "teach",
    "the controller leases one teacher's samples of a step to a teacher process "
    "(OPD: log-probs of the student's tokens with the expert at `path`)",
    {MSG_U("lease"), MSG_U("step"), MSG_S("teacher"), MSG_S("path"), MSG_U("count")},
    {{"tokens", PRL_BUS_I32},
     {"offsets", PRL_BUS_I32},
     {"prompt_lens", PRL_BUS_I32},
     {"mask", PRL_BUS_U8}}};
const prl_bus_type_spec prl_msg_taught_spec = {
    "taught",
    "a teacher returns the expert's log-probs of a `teach` item's response tokens",
    {MSG_U("lease"), MSG_U("step"), MSG_S("teacher"), MSG_U("load_us"), MSG_U("teach_us"),
     MSG_U("peak_rss_kb"), MSG_U("loaded")},
    {{"logprobs", PRL_BUS_F32}}};

static prl_status teacher_key(const char *key, int *index)
{
    *index = prl_opd_teacher_index(key);
    if (*index < 0) return prl_error_set(PRL_ERR_FORMAT, "unknown teacher key '%s'", key);
    return PRL_OK;
}

/* ---------------------------------------------------------------- teach ------------ */

prl_status prl_msg_teach_encode(const prl_msg_teach *x, const char *run, uint64_t id,
                                prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_teach_spec, run, id);
    if (!rc) rc = prl_grpo_batch_check(&x->item);
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", x->lease);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", x->step);
    if (!rc) rc = prl_bus_msg_set_str(m, "teacher", x->teacher);
    if (!rc) rc = prl_bus_msg_set_str(m, "path", x->path);
    if (!rc) rc = msg_seq_frames_add(&x->item, m);
    return msg_done(rc, m, "teach message");
}

static prl_status teach_decode(const prl_bus_msg *m, prl_msg_teach *x)
{
    prl_status rc = msg_is(m, &prl_msg_teach_spec);
    if (!rc) rc = msg_uint(m, "lease", &x->lease);
    if (!rc) rc = msg_uint(m, "step", &x->step);
    if (!rc) rc = msg_str(m, "teacher", &x->teacher);
    if (!rc) rc = teacher_key(x->teacher, &x->teacher_index);
    if (!rc) rc = msg_str(m, "path", &x->path);
    if (!rc) rc = msg_seq_frames_read(&x->item, m);
    /* rewards, groups and log-probs stay 0 (valid); the layout and the mask are checked */
    return rc ? rc : prl_grpo_batch_check(&x->item);
}

prl_status prl_msg_teach_decode(const prl_bus_msg *m, prl_msg_teach *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = teach_decode(m, x);
    if (rc) prl_msg_teach_free(x);
    return msg_decoded(rc, x, sizeof *x, "teach message");
}

void prl_msg_teach_free(prl_msg_teach *x)
{
    prl_grpo_batch_free(&x->item);
    memset(x, 0, sizeof *x);
}

/* ---------------------------------------------------------------- taught ----------- */

prl_status prl_msg_taught_encode(const prl_msg_taught *x, const char *run, uint64_t id,
                                 prl_bus_msg *m)
{
    size_t cells = x->n_response * (size_t)x->topk;
    prl_status rc = prl_bus_msg_init(m, &prl_msg_taught_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", x->lease);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", x->step);
    if (!rc) rc = prl_bus_msg_set_str(m, "teacher", x->teacher);
    if (!rc) rc = prl_bus_msg_set_uint(m, "load_us", x->load_us);
    if (!rc) rc = prl_bus_msg_set_uint(m, "teach_us", x->teach_us);
    if (!rc) rc = prl_bus_msg_set_uint(m, "peak_rss_kb", x->peak_rss_kb);
    if (!rc) rc = prl_bus_msg_set_uint(m, "loaded", (uint64_t)(x->loaded != 0));
    if (!rc) rc = prl_bus_msg_add_frame(m, "logprobs", PRL_BUS_F32, x->logprobs, x->n_response);
    if (!rc && x->topk) rc = prl_bus_msg_add_frame(m, "topk_ids", PRL_BUS_I32, x->topk_ids, cells);
    if (!rc && x->topk)
        rc = prl_bus_msg_add_frame(m, "topk_logprobs", PRL_BUS_F32, x->topk_lp, cells);
    return msg_done(rc, m, "taught");
}

static prl_status taught_decode(const prl_bus_msg *m, prl_msg_taught *x)
{
    uint64_t loaded = 0;
    prl_status rc = msg_is(m, &prl_msg_taught_spec);
    if (!rc) rc = msg_uint(m, "lease", &x->lease);
    if (!rc) rc = msg_uint(m, "step", &x->step);
    if (!rc) rc = msg_str(m, "teacher", &x->teacher);
    if (!rc) rc = teacher_key(x->teacher, &x->teacher_index);
    if (!rc) rc = msg_uint(m, "load_us", &x->load_us);
    if (!rc) rc = msg_uint(m, "teach_us", &x->teach_us);
    if (!rc) rc = msg_uint(m, "peak_rss_kb", &x->peak_rss_kb);
    if (!rc) rc = msg_uint(m, "loaded", &loaded);
    const prl_bus_frame *lp = NULL, *ki = NULL, *kl = NULL;
    if (!rc) rc = msg_frame(m, "logprobs", PRL_BUS_F32, SIZE_MAX, &lp);
    if (rc) return rc;
    x->loaded = loaded != 0, x->logprobs = lp->data, x->n_response = lp->count;
    int has_ids = prl_bus_msg_frame(m, "topk_ids") != NULL;
    if (!has_ids && !prl_bus_msg_frame(m, "topk_logprobs")) return PRL_OK;
    if ((rc = msg_frame(m, "topk_ids", PRL_BUS_I32, SIZE_MAX, &ki)) ||
        (rc = msg_frame(m, "topk_logprobs", PRL_BUS_F32, ki->count, &kl)))
        return rc;
    if (!lp->count || ki->count % lp->count || ki->count / lp->count > PRL_MAX_EXTRA_TARGETS)
        return prl_error_set(PRL_ERR_FORMAT,
                             "frame 'topk_ids' has %zu elements for %zu response "
                             "tokens",
                             ki->count, lp->count);
    x->topk = (int)(ki->count / lp->count), x->topk_ids = ki->data, x->topk_lp = kl->data;
    return PRL_OK;
}

prl_status prl_msg_taught_decode(const prl_bus_msg *m, prl_msg_taught *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = taught_decode(m, x);
    return msg_decoded(rc, x, sizeof *x, "taught");
}

prl_status prl_msg_taught_scores(const prl_msg_taught *x, const prl_grpo_batch *item, int topk,
                                 prl_opd_batch *out)
{
    memset(out, 0, sizeof *out);
    if (x->n_response != item->n_response || x->topk != topk)
        return prl_error_set(PRL_ERR_FORMAT,
                             "taught: frames 'logprobs' (and with opd.topk %d "
                             "'topk_ids', 'topk_logprobs') must hold one f32 (%d i32, %d f32) per "
                             "response token of the item",
                             topk, topk, topk);
    prl_status rc = prl_opd_batch_init(out, item->n, item->n_response, topk);
    if (rc) return rc;
    size_t cells = item->n_response * (size_t)topk;
    if (item->n_response) memcpy(out->teacher_lp, x->logprobs, item->n_response * sizeof(float));
    if (cells) memcpy(out->topk_ids, x->topk_ids, cells * sizeof(int32_t));
    if (cells) memcpy(out->topk_lp, x->topk_lp, cells * sizeof(float));
    for (int i = 0; i < item->n; i++) out->teacher[i] = x->teacher_index;
    rc = prl_opd_batch_check(out, item);
    if (rc) {
        prl_opd_batch_free(out);
        return prl_error_wrap(rc, "taught: ");
    }
    return PRL_OK;
}
