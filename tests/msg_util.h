/*
** msg_util.h — the `train` message (roles/msg/train.c) for the tests of the batches it carries
** (grpo, opd, replay): a batch encoded with the header fields every test uses, decoded back,
** and teacher frames added as they are (unchecked), for the decoder's rejections.
*/
#ifndef PRL_TESTS_MSG_UTIL_H
#define PRL_TESTS_MSG_UTIL_H

#include "roles/msg/msg.h"

#include <string.h>

/* b (and with ob its teacher side) as a `train` message: lease 3, step 4, version 5. */
static inline prl_status train_to_msg(const prl_grpo_batch *b, const prl_opd_batch *ob,
                                      prl_bus_msg *m)
{
    prl_msg_train x = {.lease = 3,
                       .step = 4,
                       .policy_version = 5,
                       .path = "ckpt/v000005",
                       .batch = *b,
                       .has_teachers = ob != NULL};
    if (ob) x.teachers = *ob;
    return prl_msg_train_encode(&x, "run-test", 1, m);
}

/* The batch of a `train` message (*b zeroed on error). */
static inline prl_status train_batch_from_msg(prl_grpo_batch *b, const prl_bus_msg *m)
{
    prl_msg_train x;
    prl_status rc = prl_msg_train_decode(m, -1, &x);
    *b = x.batch;
    return rc;
}

/* The teacher side of a `train` message read with opd.topk `topk` (*ob zeroed on error). */
static inline prl_status train_teachers_from_msg(prl_opd_batch *ob, const prl_bus_msg *m, int topk)
{
    prl_msg_train x;
    prl_status rc = prl_msg_train_decode(m, topk, &x);
    *ob = x.teachers;
    memset(&x.teachers, 0, sizeof x.teachers);
    prl_msg_train_free(&x);
    return rc;
}

/* ob's frames added to m as they are (the encoder would refuse bad values). */
static inline void add_teacher_frames(prl_bus_msg *m, const prl_opd_batch *ob)
{
    size_t cells = ob->n_response * (size_t)ob->topk;
    prl_bus_msg_add_frame(m, "teacher_logprobs", PRL_BUS_F32, ob->teacher_lp, ob->n_response);
    prl_bus_msg_add_frame(m, "teachers", PRL_BUS_I32, ob->teacher, (size_t)ob->n);
    if (ob->topk) prl_bus_msg_add_frame(m, "teacher_topk_ids", PRL_BUS_I32, ob->topk_ids, cells);
    if (ob->topk)
        prl_bus_msg_add_frame(m, "teacher_topk_logprobs", PRL_BUS_F32, ob->topk_lp, cells);
}

#endif /* PRL_TESTS_MSG_UTIL_H */
