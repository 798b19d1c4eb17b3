/*
** step.c — one OPD training step (opd.h, docs/opd.md): the per-token advantages from the
** student's rollout log-probs and the teachers' log-probs, then the GRPO trainer's step with
** them (grpo.h token_adv): the same clipped surrogate, mismatch corrections (grpo.correction.*)
** and routing replay (replay.*) — the trainer's machinery, not a fork of it; with opd.topk,
** the distillation term onto the teacher's top-k as the trainer's extra targets.
*/
#include "opd/opd.h"

#include <stdlib.h>
#include <string.h>

prl_status prl_opd_train_step(prl_model *m, prl_optim *o, const prl_grpo_batch *b,
                              const prl_opd_batch *ob, const prl_opd_config *c,
                              const prl_grpo_train_config *tc, prl_grpo_step_stats *st,
                              prl_opd_stats *ost)
{
    if (ob->n != b->n || ob->n_response != b->n_response)
        return prl_error_set(PRL_ERR_ARG,
                             "opd step: teacher batch of %d samples / %zu tokens, "
                             "student batch of %d / %zu",
                             ob->n, ob->n_response, b->n, b->n_response);
    size_t nr = b->n_response ? b->n_response : 1;
    float *adv = malloc(nr * sizeof *adv);
    int32_t *start = malloc(((size_t)b->n + 1) * sizeof *start);
    prl_status rc = adv && start ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "opd step");
    for (int i = 0; !rc && i < b->n; i++) {
        size_t first;
        int len;
        prl_grpo_batch_response(b, i, &first, &len);
        start[i] = (int32_t)first;
    }
    if (!rc) start[b->n] = (int32_t)b->n_response;
    /* lp_S = the sampler's log-probs (rl.md §5.1), not the train path's */
    if (!rc)
        rc = prl_opd_advantages(c, b->logprobs, ob->teacher_lp, b->mask, start, b->n, ob->teacher,
                                adv, ost);
    size_t nq = ob->topk ? nr * (size_t)ob->topk : 0;
    float *q = nq ? malloc(nq * sizeof *q) : NULL;
    if (!rc && nq && !q) rc = prl_error_set(PRL_ERR_NOMEM, "opd step distillation weights");
    if (!rc && q) prl_opd_distill_weights(c, b, ob, q, ost);
    if (!rc) {
        prl_grpo_train_config t = *tc;
        t.token_adv = adv;
        t.seq_adv_weight = c->task_weight;
        t.distill_k = ob->topk, t.distill_ids = ob->topk_ids, t.distill_w = q;
        rc = prl_grpo_train_step(m, o, b, &t, st);
    }
    free(adv), free(start), free(q);
    return rc;
}
