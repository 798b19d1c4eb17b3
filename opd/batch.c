/*
** batch.c — the teacher side of a step's batch (opd.h): per response token the teacher's
** log-prob (and with opd.topk its top-k), per sample its teacher; and the one check of
** those values, for the `train` message and the teachers' `taught` answers alike
** (roles/msg/). Errors name the frame and the sample.
*/
#include "opd/opd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

prl_status prl_opd_batch_init(prl_opd_batch *ob, int n, size_t n_response, int topk)
{
    memset(ob, 0, sizeof *ob);
    if (n < 1) return prl_error_set(PRL_ERR_ARG, "opd batch: %d samples", n);
    if (topk < 0 || topk > PRL_MAX_EXTRA_TARGETS)
        return prl_error_set(PRL_ERR_ARG, "opd batch: top-k %d (0..%d)", topk,
                             PRL_MAX_EXTRA_TARGETS);
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
            return prl_error_set(PRL_ERR_FORMAT,
                                 "frame 'teacher_topk_ids': sample %d response "
                                 "token %d rank %d has id %d (must be %s)",
                                 i, j, k, id,
                                 loss ? ">= 0 on a loss token" : "-1 off the loss tokens");
        if (loss && !(isfinite(lp) && lp <= 0))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "frame 'teacher_topk_logprobs': sample %d "
                                 "response token %d rank %d has log-prob %g (must be finite and "
                                 "<= 0)",
                                 i, j, k, lp);
    }
    return PRL_OK;
}

prl_status prl_opd_batch_check(const prl_opd_batch *ob, const prl_grpo_batch *b)
{
    if (ob->n != b->n || ob->n_response != b->n_response)
        return prl_error_set(PRL_ERR_FORMAT,
                             "teacher frames: %d samples and %zu response tokens, "
                             "the batch has %d and %zu",
                             ob->n, ob->n_response, b->n, b->n_response);
    for (int i = 0; i < b->n; i++) {
        if (ob->teacher[i] < 0 || ob->teacher[i] >= PRL_OPD_TEACHERS)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "frame 'teachers': sample %d has teacher %d "
                                 "(need 0..%d)",
                                 i, ob->teacher[i], PRL_OPD_TEACHERS - 1);
        size_t first;
        int len;
        prl_grpo_batch_response(b, i, &first, &len);
        for (int j = 0; j < len; j++) {
            float lp = ob->teacher_lp[first + j];
            if (b->mask[first + j] && !(isfinite(lp) && lp <= 0))
                return prl_error_set(PRL_ERR_FORMAT,
                                     "frame 'teacher_logprobs': sample %d response "
                                     "token %d has log-prob %g (must be finite and <= 0)",
                                     i, j, lp);
            prl_status rc = check_topk(ob, first + j, b->mask[first + j], i, j);
            if (rc) return rc;
        }
    }
    return PRL_OK;
}
