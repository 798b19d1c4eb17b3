/*
** model_util.h — test weights shared by the engine suites (test_spec_decode, test_precision).
**
** A freshly initialised model (std 0.02) has nearly flat logits and no-op blocks: greedy ties
** flip on rounding, sinks and convolutions contribute nothing, mHC mixes its streams evenly.
** These suites need clear greedy winners and every block active, so they reshape the init.
*/
#ifndef PRL_TESTS_MODEL_UTIL_H
#define PRL_TESTS_MODEL_UTIL_H

#include "engine/model.h"

/* Heads ×40 (clear winners for greedy; the MTP head is the shared one), sinks ×50, conv
** kernels and mHC's 1-d tensors (α, β, γ) drawn from a fixed test stream; with `norm_gains`
** every RMSNorm gain becomes 1 + 0.2·N(0, 1) as well. */
static inline void test_model_sharpen(prl_model *m, int norm_gains)
{
    prl_rng rng;
    prl_rng_init(&rng, 3, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        prl_real *w = m->params + p->offset;
        for (size_t j = 0; j < p->numel; j++) {
            if (p->kind == PRL_PARAM_HEAD) w[j] *= 40;
            if (p->kind == PRL_PARAM_SINK) w[j] *= 50;
            if (p->kind == PRL_PARAM_CONV) w[j] = (prl_real)(0.3 * prl_rng_normal(&rng));
            if (p->kind == PRL_PARAM_MHC && p->ndim == 1)
                w[j] += (prl_real)(0.5 * prl_rng_normal(&rng));
            if (norm_gains && p->kind == PRL_PARAM_NORM)
                w[j] = (prl_real)(1 + 0.2 * prl_rng_normal(&rng));
        }
    }
}

#endif /* PRL_TESTS_MODEL_UTIL_H */
