/*
** train.c — the messages of the trainer (msg.h): `train` (a step's samples packed as a grpo
** batch, with OPD the teacher frames), `trained` (the committed version) and `weights` (a
** version announced); and the sequence frames `train` shares with `teach` (internal.h).
** Every size and value of a batch is checked by the batch's own rules (grpo and opd).
*/
#include "roles/msg/internal.h"

#include <stdlib.h>
#include <string.h>

const prl_bus_type_spec prl_msg_train_spec = {
    "train",
    "the controller hands the trainer one step's samples, packed",
    {MSG_U("lease"), MSG_U("step"), MSG_U("policy_version"), MSG_S("path"), MSG_U("count"),
     MSG_U_OPT("route_moe"), MSG_U_OPT("route_k"), MSG_U_OPT("route_width")},
    {{"tokens", PRL_BUS_I32},
     {"offsets", PRL_BUS_I32},
     {"prompt_lens", PRL_BUS_I32},
     {"rewards", PRL_BUS_F32}}};
const prl_bus_type_spec prl_msg_trained_spec = {
    "trained",
    "the trainer committed version `version` (step `step`'s update) at `path`",
    {MSG_U("lease"), MSG_U("step"), MSG_U("version"), MSG_S("path"), MSG_H("ckpt_checksum"),
     MSG_U("train_us")},
    {{"metrics", PRL_BUS_BYTES}}};
const prl_bus_type_spec prl_msg_weights_spec = {
    "weights",
    "the trainer announces a committed checkpoint",
    {MSG_U("version"), MSG_H("ckpt_checksum"), MSG_S("path")},
    {{0}}};

/* ---------------------------------------------------------------- sequence frames -- */

static void copy_frame(void *dst, const prl_bus_frame *f)
{
    if (f->bytes) memcpy(dst, f->data, f->bytes);
}

prl_status msg_seq_frames_add(const prl_grpo_batch *b, prl_bus_msg *m)
{
    prl_status rc;
    if ((rc = prl_bus_msg_set_uint(m, "count", (uint64_t)b->n)) ||
        (rc = prl_bus_msg_add_frame(m, "tokens", PRL_BUS_I32, b->tokens, b->n_tokens)) ||
        (rc = prl_bus_msg_add_frame(m, "offsets", PRL_BUS_I32, b->offsets, (size_t)b->n + 1)) ||
        (rc = prl_bus_msg_add_frame(m, "prompt_lens", PRL_BUS_I32, b->prompt_lens, (size_t)b->n)) ||
        (rc = prl_bus_msg_add_frame(m, "mask", PRL_BUS_U8, b->mask, b->n_response)))
        return rc;
    return PRL_OK;
}

prl_status msg_seq_frames_read(prl_grpo_batch *b, const prl_bus_msg *m)
{
    uint64_t count;
    prl_status rc = msg_uint(m, "count", &count);
    if (rc) return rc;
    if (count < 1 || count > (uint64_t)(PRL_BUS_MAX_FRAME_BYTES / sizeof(int32_t)) - 1)
        return prl_error_set(PRL_ERR_FORMAT, "field 'count' = %llu samples (need 1 .. %zu)",
                             (unsigned long long)count,
                             PRL_BUS_MAX_FRAME_BYTES / sizeof(int32_t) - 1);
    size_t n = (size_t)count;
    const prl_bus_frame *tok = NULL, *off = NULL, *pl = NULL, *mask = NULL;
    if ((rc = msg_frame(m, "tokens", PRL_BUS_I32, SIZE_MAX, &tok)) ||
        (rc = msg_frame(m, "offsets", PRL_BUS_I32, n + 1, &off)) ||
        (rc = msg_frame(m, "prompt_lens", PRL_BUS_I32, n, &pl)) ||
        (rc = msg_frame(m, "mask", PRL_BUS_U8, SIZE_MAX, &mask)))
        return rc;
    if (mask->count > tok->count)
        return prl_error_set(PRL_ERR_FORMAT,
                             "frame 'mask' has %zu elements, more than the %zu "
                             "tokens",
                             mask->count, tok->count);
    if ((rc = prl_grpo_batch_init(b, (int)n, tok->count, mask->count))) return rc;
    copy_frame(b->tokens, tok);
    copy_frame(b->offsets, off);
    copy_frame(b->prompt_lens, pl);
    copy_frame(b->mask, mask);
    return PRL_OK;
}

/* ---------------------------------------------------------------- train ------------ */

static prl_status routes_add(const prl_grpo_batch *b, prl_bus_msg *m)
{
    prl_status rc;
    if (!b->route_rows) return PRL_OK;
    if ((rc = prl_bus_msg_set_uint(m, "route_moe", (uint64_t)b->route_moe)) ||
        (rc = prl_bus_msg_set_uint(m, "route_k", (uint64_t)b->route_k)) ||
        (rc = prl_bus_msg_set_uint(m, "route_width", (uint64_t)b->route_width)) ||
        (rc = prl_bus_msg_add_frame(m, "route_rows", PRL_BUS_I32, b->route_rows, (size_t)b->n)) ||
        (rc = prl_bus_msg_add_frame(m, "routes", PRL_BUS_U8, b->routes, b->routes_bytes)))
        return rc;
    return PRL_OK;
}

static prl_status teachers_add(const prl_opd_batch *ob, prl_bus_msg *m)
{
    prl_status rc =
        prl_bus_msg_add_frame(m, "teacher_logprobs", PRL_BUS_F32, ob->teacher_lp, ob->n_response);
    if (!rc) rc = prl_bus_msg_add_frame(m, "teachers", PRL_BUS_I32, ob->teacher, (size_t)ob->n);
    size_t cells = ob->n_response * (size_t)ob->topk;
    if (!rc && ob->topk)
        rc = prl_bus_msg_add_frame(m, "teacher_topk_ids", PRL_BUS_I32, ob->topk_ids, cells);
    if (!rc && ob->topk)
        rc = prl_bus_msg_add_frame(m, "teacher_topk_logprobs", PRL_BUS_F32, ob->topk_lp, cells);
    return rc;
}

prl_status prl_msg_train_encode(const prl_msg_train *x, const char *run, uint64_t id,
                                prl_bus_msg *m)
{
    const prl_grpo_batch *b = &x->batch;
    prl_status rc = prl_bus_msg_init(m, &prl_msg_train_spec, run, id);
    if (!rc) rc = prl_grpo_batch_check(b);
    if (!rc && x->has_teachers) rc = prl_opd_batch_check(&x->teachers, b);
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", x->lease);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", x->step);
    if (!rc) rc = prl_bus_msg_set_uint(m, "policy_version", x->policy_version);
    if (!rc) rc = prl_bus_msg_set_str(m, "path", x->path);
    if (!rc) rc = msg_seq_frames_add(b, m);
    if (!rc) rc = prl_bus_msg_add_frame(m, "rewards", PRL_BUS_F32, b->rewards, (size_t)b->n);
    if (!rc) rc = prl_bus_msg_add_frame(m, "groups", PRL_BUS_I32, b->groups, (size_t)b->n);
    if (!rc) rc = prl_bus_msg_add_frame(m, "logprobs", PRL_BUS_F32, b->logprobs, b->n_response);
    if (!rc) rc = routes_add(b, m);
    if (!rc && x->has_teachers) rc = teachers_add(&x->teachers, m);
    return msg_done(rc, m, "train");
}

/* The optional frames route_rows + routes and fields route_moe, route_k, route_width. */
static prl_status routes_read(prl_grpo_batch *b, const prl_bus_msg *m)
{
    const prl_bus_frame *rr = prl_bus_msg_frame(m, "route_rows"),
                        *rt = prl_bus_msg_frame(m, "routes");
    if (!rr && !rt) return PRL_OK;
    if (!rr || !rt)
        return prl_error_set(PRL_ERR_FORMAT,
                             "frame '%s' is missing (routes need both "
                             "'route_rows' and 'routes')",
                             rr ? "routes" : "route_rows");
    uint64_t shape[3];
    const char *names[3] = {"route_moe", "route_k", "route_width"};
    for (int k = 0; k < 3; k++) {
        prl_status rc = msg_uint(m, names[k], &shape[k]);
        if (rc) return rc;
        if (shape[k] > 256)
            return prl_error_set(PRL_ERR_FORMAT, "field '%s' = %llu is out of range", names[k],
                                 (unsigned long long)shape[k]);
    }
    const prl_bus_frame *f;
    prl_status rc = msg_frame(m, "route_rows", PRL_BUS_I32, (size_t)b->n, &f);
    if (!rc) rc = msg_frame(m, "routes", PRL_BUS_U8, SIZE_MAX, &f);
    if (rc) return rc;
    b->route_moe = (int)shape[0], b->route_k = (int)shape[1], b->route_width = (int)shape[2];
    b->route_rows = malloc((size_t)b->n * sizeof *b->route_rows);
    b->routes = malloc(rt->bytes ? rt->bytes : 1);
    if (!b->route_rows || !b->routes) return prl_error_set(PRL_ERR_NOMEM, "routes");
    copy_frame(b->route_rows, rr);
    copy_frame(b->routes, rt);
    b->routes_bytes = rt->bytes;
    return PRL_OK;
}

/* The teacher frames `teacher_logprobs` (f32 [n_response]) and `teachers` (i32 [n]), and
** with topk > 0 `teacher_topk_ids` (i32) and `teacher_topk_logprobs` (f32), [n_response ×
** topk] each. */
static prl_status teachers_read(prl_opd_batch *ob, const prl_grpo_batch *b, const prl_bus_msg *m,
                                int topk)
{
    const prl_bus_frame *lp = NULL, *tk = NULL, *ki = NULL, *kl = NULL;
    size_t cells = b->n_response * (size_t)topk;
    prl_status rc = msg_frame(m, "teacher_logprobs", PRL_BUS_F32, b->n_response, &lp);
    if (!rc) rc = msg_frame(m, "teachers", PRL_BUS_I32, (size_t)b->n, &tk);
    if (!rc && topk > 0) rc = msg_frame(m, "teacher_topk_ids", PRL_BUS_I32, cells, &ki);
    if (!rc && topk > 0) rc = msg_frame(m, "teacher_topk_logprobs", PRL_BUS_F32, cells, &kl);
    if (!rc) rc = prl_opd_batch_init(ob, b->n, b->n_response, topk);
    if (rc) return rc;
    copy_frame(ob->teacher_lp, lp);
    copy_frame(ob->teacher, tk);
    if (ki) copy_frame(ob->topk_ids, ki);
    if (kl) copy_frame(ob->topk_lp, kl);
    return prl_opd_batch_check(ob, b);
}

static prl_status train_decode(const prl_bus_msg *m, int opd_topk, prl_msg_train *x)
{
    prl_grpo_batch *b = &x->batch;
    prl_status rc = msg_is(m, &prl_msg_train_spec);
    if (!rc) rc = msg_uint(m, "lease", &x->lease);
    if (!rc) rc = msg_uint(m, "step", &x->step);
    if (!rc) rc = msg_uint(m, "policy_version", &x->policy_version);
    if (!rc) rc = msg_str(m, "path", &x->path);
    if (!rc && x->policy_version > (1u << 30))
        rc = prl_error_set(PRL_ERR_ARG, "policy_version %llu",
                           (unsigned long long)x->policy_version);
    if (!rc) rc = msg_seq_frames_read(b, m);
    if (rc) return rc;
    const prl_bus_frame *rew = NULL, *grp = NULL, *lp = NULL;
    if ((rc = msg_frame(m, "rewards", PRL_BUS_F32, (size_t)b->n, &rew)) ||
        (rc = msg_frame(m, "groups", PRL_BUS_I32, (size_t)b->n, &grp)) ||
        (rc = msg_frame(m, "logprobs", PRL_BUS_F32, b->n_response, &lp)))
        return rc;
    copy_frame(b->rewards, rew);
    copy_frame(b->groups, grp);
    copy_frame(b->logprobs, lp);
    if ((rc = routes_read(b, m)) || (rc = prl_grpo_batch_check(b))) return rc;
    if (opd_topk < 0) return PRL_OK;
    x->has_teachers = 1;
    return teachers_read(&x->teachers, b, m, opd_topk);
}

prl_status prl_msg_train_decode(const prl_bus_msg *m, int opd_topk, prl_msg_train *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = train_decode(m, opd_topk, x);
    if (rc) prl_msg_train_free(x);
    return msg_decoded(rc, x, sizeof *x, "train message");
}

void prl_msg_train_free(prl_msg_train *x)
{
    prl_grpo_batch_free(&x->batch);
    prl_opd_batch_free(&x->teachers);
    memset(x, 0, sizeof *x);
}

/* ---------------------------------------------------------------- trained ---------- */

prl_status prl_msg_trained_encode(const prl_msg_trained *x, const char *run, uint64_t id,
                                  prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_trained_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", x->lease);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", x->step);
    if (!rc) rc = prl_bus_msg_set_uint(m, "version", x->version);
    if (!rc) rc = prl_bus_msg_set_str(m, "path", x->path);
    if (!rc) rc = prl_bus_msg_set_hex64(m, "ckpt_checksum", x->ckpt_checksum);
    if (!rc) rc = prl_bus_msg_set_uint(m, "train_us", x->train_us);
    if (!rc)
        rc = prl_bus_msg_add_frame(m, "metrics", PRL_BUS_BYTES, x->metrics, strlen(x->metrics));
    return msg_done(rc, m, "trained");
}

static prl_status trained_decode(const prl_bus_msg *m, prl_msg_trained *x)
{
    prl_status rc = msg_is(m, &prl_msg_trained_spec);
    if (!rc) rc = msg_uint(m, "lease", &x->lease);
    if (!rc) rc = msg_uint(m, "step", &x->step);
    if (!rc) rc = msg_uint(m, "version", &x->version);
    if (!rc) rc = msg_str(m, "path", &x->path);
    if (!rc) rc = msg_hex64(m, "ckpt_checksum", &x->ckpt_checksum);
    if (!rc) rc = msg_uint(m, "train_us", &x->train_us);
    if (rc) return rc;
    x->metrics = prl_bus_msg_text(m, "metrics");
    json_error_t je;
    x->metrics_json = x->metrics ? json_loads(x->metrics, 0, &je) : NULL;
    if (!json_is_object(x->metrics_json))
        return prl_error_set(PRL_ERR_FORMAT, "frame 'metrics' must be a JSON object");
    return PRL_OK;
}

prl_status prl_msg_trained_decode(const prl_bus_msg *m, prl_msg_trained *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = trained_decode(m, x);
    if (rc) prl_msg_trained_free(x);
    return msg_decoded(rc, x, sizeof *x, "trained");
}

void prl_msg_trained_free(prl_msg_trained *x)
{
    free((char *)x->metrics);
    json_decref(x->metrics_json);
    memset(x, 0, sizeof *x);
}

/* ---------------------------------------------------------------- weights ---------- */

prl_status prl_msg_weights_encode(const prl_msg_weights *x, const char *run, uint64_t id,
                                  prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_weights_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "version", x->version);
    if (!rc) rc = prl_bus_msg_set_hex64(m, "ckpt_checksum", x->ckpt_checksum);
    if (!rc) rc = prl_bus_msg_set_str(m, "path", x->path);
    return msg_done(rc, m, "weights");
}

prl_status prl_msg_weights_decode(const prl_bus_msg *m, prl_msg_weights *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = msg_is(m, &prl_msg_weights_spec);
    if (!rc) rc = msg_uint(m, "version", &x->version);
    if (!rc) rc = msg_hex64(m, "ckpt_checksum", &x->ckpt_checksum);
    if (!rc) rc = msg_str(m, "path", &x->path);
    return msg_decoded(rc, x, sizeof *x, "weights");
}
