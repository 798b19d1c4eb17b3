/*
** grpo_util.h — fixtures shared by the suites that train GRPO batches on the micro model
** (test_grpo_trainer, test_opd, test_replay): the model itself and the train path's own
** log-probs of a batch.
*/
#ifndef PRL_TESTS_GRPO_UTIL_H
#define PRL_TESTS_GRPO_UTIL_H

#include "grpo/grpo.h"
#include "tests/check_util.h"

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

/* The micro model (configs/models/micro.json) with weights from `seed`; aux losses off when
** `pure` (so only the policy loss makes gradients). */
static inline void micro_model(prl_model *m, uint64_t seed, int pure)
{
    prl_config c;
    assert_ok(prl_config_load(&c, PRL_SOURCE_DIR "/configs/models/micro.json"));
    if (pure) c.balance_loss_alpha = 0, c.router_z_loss_coef = 0;
    assert_ok(prl_model_init(m, &c));
    prl_model_init_weights(m, seed);
}

/* Set b->logprobs to the train path's log-probs, each sample scored alone (at most 64
** tokens a sample). */
static inline void train_logprobs(prl_model *m, prl_grpo_batch *b)
{
    prl_batch_buf bb;
    assert_ok(prl_batch_buf_init(&bb, 1, m->cfg.max_position_embeddings));
    float lp[64];
    for (int i = 0; i < b->n; i++) {
        int len = b->offsets[i + 1] - b->offsets[i], pl = b->prompt_lens[i];
        ck_assert_int_le(len, 64);
        prl_batch_buf_set_row(&bb, len, 0, b->tokens + b->offsets[i], len, NULL);
        prl_batch batch = prl_batch_buf_view(&bb, 1, len);
        assert_ok(prl_model_logprobs(m, &batch, lp));
        size_t first;
        int n_resp;
        prl_grpo_batch_response(b, i, &first, &n_resp);
        for (int j = 0; j < n_resp; j++) b->logprobs[first + j] = lp[pl - 1 + j];
    }
    prl_batch_buf_free(&bb);
}

#endif /* PRL_TESTS_GRPO_UTIL_H */
