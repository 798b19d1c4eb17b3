/*
** batch.c — the OPD frames on the bus (opd.h, docs/protocol.md): the teacher side of `train`
** (teacher_logprobs, teachers; with opd.topk teacher_topk_ids, teacher_topk_logprobs) and
** the `teach` item (a grpo batch's tokens, offsets, prompt_lens and loss mask). Every size
** and value is checked on the way in; errors name the frame and the sample. The layout
** checks are grpo's (prl_grpo_batch_check): one set of rules.
*/
#include "opd/opd.h"

#include "bus/bus.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

prl_status prl_opd_batch_init(prl_opd_batch *ob, int n, size_t n_response, int topk)
{
    memset(ob, 0, sizeof *ob);
    if (n < 1) return prl_error_set(PRL_ERR_ARG, "opd batch: %d samples", n);
    if (topk < 0 || topk > PRL_MAX_EXTRA_TARGETS)
        return prl_error_set(PRL_ERR_ARG, "opd batch: top-k %d (0..%d)", topk, PRL_MAX_EXTRA_TARGETS);
    ob->n = n, ob->n_response = n_response, ob->topk = topk;
    size_t cells = (n_response ? n_response : 1) * (size_t)topk;
    ob->teacher_lp = calloc(n_response ? n_response : 1, sizeof *ob->teacher_lp);
    ob->teacher = calloc((size_t)n, sizeof *ob->teacher);
    if (topk) {
        ob->topk_ids = malloc(cells * sizeof *ob->topk_ids);
        ob->topk_lp = calloc(cells, sizeof *ob->topk_lp);
        for (size_t e = 0; ob->topk_ids && e < cells; e++) ob->topk_ids[e] = -1;
    }
    if (!ob->teacher_lp || !ob->teacher || (topk && (!ob->topk_ids || !ob->topk_lp))) {
        prl_opd_batch_free(ob);
        return prl_error_set(PRL_ERR_NOMEM, "opd batch of %d samples", n);
    }
    return PRL_OK;
}

void prl_opd_batch_free(prl_opd_batch *ob)
{
    if (!ob) return;
    free(ob->teacher_lp), free(ob->teacher), free(ob->topk_ids), free(ob->topk_lp);
    memset(ob, 0, sizeof *ob);
}

/* Response token f's top-k (sample i, token j): on a loss token ids >= 0 (the trainer's
** model checks them against its vocabulary) with log-probs finite and <= 0; else id -1. */
static prl_status check_topk(const prl_opd_batch *ob, size_t f, int loss, int i, int j)
{
    for (int k = 0; k < ob->topk; k++) {
        int32_t id = ob->topk_ids[f * ob->topk + k];
        float lp = ob->topk_lp[f * ob->topk + k];
        if (loss ? id < 0 : id != -1)
            return prl_error_set(PRL_ERR_FORMAT, "frame 'teacher_topk_ids': sample %d response "
                                 "token %d rank %d has id %d (must be %s)", i, j, k, id,
                                 loss ? ">= 0 on a loss token" : "-1 off the loss tokens");
        if (loss && !(isfinite(lp) && lp <= 0))
            return prl_error_set(PRL_ERR_FORMAT, "frame 'teacher_topk_logprobs': sample %d "
                                 "response token %d rank %d has log-prob %g (must be finite and "
                                 "<= 0)", i, j, k, lp);
    }
    return PRL_OK;
}

/* Teacher indices in range; teacher log-probs of the loss tokens finite and <= 0; the top-k. */
static prl_status check_values(const prl_opd_batch *ob, const prl_grpo_batch *b)
{
    for (int i = 0; i < b->n; i++) {
        if (ob->teacher[i] < 0 || ob->teacher[i] >= PRL_OPD_TEACHERS)
            return prl_error_set(PRL_ERR_FORMAT, "frame 'teachers': sample %d has teacher %d "
                                 "(need 0..%d)", i, ob->teacher[i], PRL_OPD_TEACHERS - 1);
        size_t first;
        int len;
        prl_grpo_batch_response(b, i, &first, &len);
        for (int j = 0; j < len; j++) {
            float lp = ob->teacher_lp[first + j];
            if (b->mask[first + j] && !(isfinite(lp) && lp <= 0))
                return prl_error_set(PRL_ERR_FORMAT, "frame 'teacher_logprobs': sample %d response "
                                     "token %d has log-prob %g (must be finite and <= 0)", i, j, lp);
            prl_status rc = check_topk(ob, first + j, b->mask[first + j], i, j);
            if (rc) return rc;
        }
    }
    return PRL_OK;
}

prl_status prl_opd_batch_from_msg(prl_opd_batch *ob, const prl_grpo_batch *b, const prl_bus_msg *m,
                                  int topk)
{
    memset(ob, 0, sizeof *ob);
    const prl_bus_frame *lp = NULL, *tk = NULL, *ki = NULL, *kl = NULL;
    size_t cells = b->n_response * (size_t)(topk > 0 ? topk : 0);
    prl_status rc = prl_grpo_msg_frame(m, "teacher_logprobs", PRL_BUS_F32, b->n_response, &lp);
    if (!rc) rc = prl_grpo_msg_frame(m, "teachers", PRL_BUS_I32, (size_t)b->n, &tk);
    if (!rc && topk > 0) rc = prl_grpo_msg_frame(m, "teacher_topk_ids", PRL_BUS_I32, cells, &ki);
    if (!rc && topk > 0) rc = prl_grpo_msg_frame(m, "teacher_topk_logprobs", PRL_BUS_F32, cells, &kl);
    if (!rc) rc = prl_opd_batch_init(ob, b->n, b->n_response, topk);
    if (rc) return prl_error_wrap(rc, "train message: ");
    if (lp->bytes) memcpy(ob->teacher_lp, lp->data, lp->bytes);
    memcpy(ob->teacher, tk->data, tk->bytes);
    if (ki && ki->bytes) memcpy(ob->topk_ids, ki->data, ki->bytes);
    if (kl && kl->bytes) memcpy(ob->topk_lp, kl->data, kl->bytes);
    rc = check_values(ob, b);
    if (rc) {
        prl_opd_batch_free(ob);
        return prl_error_wrap(rc, "train message: ");
    }
    return PRL_OK;
}

prl_status prl_opd_batch_to_msg(const prl_opd_batch *ob, prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_add_frame(m, "teacher_logprobs", PRL_BUS_F32, ob->teacher_lp,
                                          ob->n_response);
    if (!rc) rc = prl_bus_msg_add_frame(m, "teachers", PRL_BUS_I32, ob->teacher, (size_t)ob->n);
    size_t cells = ob->n_response * (size_t)ob->topk;
    if (!rc && ob->topk)
        rc = prl_bus_msg_add_frame(m, "teacher_topk_ids", PRL_BUS_I32, ob->topk_ids, cells);
    if (!rc && ob->topk)
        rc = prl_bus_msg_add_frame(m, "teacher_topk_logprobs", PRL_BUS_F32, ob->topk_lp, cells);
    return rc;
}

/* ---------------------------------------------------------------- teach ------------ */

prl_status prl_opd_teach_to_msg(const prl_grpo_batch *t, prl_bus_msg *m)
{
    prl_status rc = prl_grpo_batch_check(t);
    return rc ? prl_error_wrap(rc, "teach message: ") : prl_grpo_seq_frames_add(t, m);
}

static prl_status teach_from_msg(prl_grpo_batch *t, const prl_bus_msg *m)
{
    prl_status rc = prl_grpo_seq_frames_read(t, m);
    return rc ? rc : prl_grpo_batch_check(t); /* log-probs are 0: valid; the layout and mask are checked */
}

prl_status prl_opd_teach_from_msg(prl_grpo_batch *t, const prl_bus_msg *m)
{
    memset(t, 0, sizeof *t);
    if (strcmp(m->type, "teach"))
        return prl_error_set(PRL_ERR_FORMAT, "teach message: a '%s' message, expected 'teach'", m->type);
    prl_status rc = teach_from_msg(t, m);
    if (rc) {
        prl_grpo_batch_free(t);
        return prl_error_wrap(rc, "teach message: ");
    }
    return PRL_OK;
}
