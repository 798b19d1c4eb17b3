/*
** infer_sample.c — the infer path's sampler: sampling parameters and their checks, the
** candidates of a logits row (temperature, vocabulary limit, top-k, top-p), a draw seeded
** by the caller, greedy argmax at temperature 0, and the log-prob of a token (the train
** path's function). Speculative decoding (infer_spec.c) builds its draft and verify
** distributions from the same candidates.
**
** Two forms of the draw: the naive one (the reference, kept for the test that compares them)
** and the fast one the decode step uses, which takes the row's max with 8-lane AVX2 and sums
** the weights while it makes them. Both give the same bits: the max of logits[i]/τ is the max
** of the logits divided by τ (division by τ > 0 is monotone), and every weight and sum is the
** same double operation in the same index order.
*/
#include "engine/infer_int.h"
#include "engine/ops.h"

#include <math.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ sampling -------- */

void prl_sample_params_default(prl_sample_params *p)
{
    static const int32_t eos[] = {PRL_TOKEN_EOS}; /* prl's; with a tokenizer callers set
                                                     prl_tokenizer_stop_ids */
    *p = (prl_sample_params){.temperature = 0,
                             .top_k = 0,
                             .top_p = 1,
                             .seed = 0,
                             .max_new_tokens = 256,
                             .stop_ids = eos,
                             .n_stop_ids = 1};
}

prl_status prl_sample_params_check(const prl_sample_params *p, int vocab_size)
{
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return prl_error_set(PRL_ERR_ARG, "temperature %g must be finite and >= 0 (0 = greedy)",
                             p->temperature);
    if (p->top_k < 0)
        return prl_error_set(PRL_ERR_ARG, "top-k %d must be >= 0 (0 = off)", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return prl_error_set(PRL_ERR_ARG, "top-p %g must be in (0, 1]", p->top_p);
    if (p->max_new_tokens < 1)
        return prl_error_set(PRL_ERR_ARG, "max new tokens %d must be >= 1", p->max_new_tokens);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= vocab_size)
            return prl_error_set(PRL_ERR_ARG, "stop token id %d out of range [0, %d)",
                                 p->stop_ids[i], vocab_size);
    if (p->vocab_limit < 0)
        return prl_error_set(PRL_ERR_ARG, "vocab limit %d must be >= 0 (0 = the whole vocabulary)",
                             p->vocab_limit);
    if (p->n_stop_strings > 0 && !p->tok)
        return prl_error_set(PRL_ERR_ARG, "stop strings need a tokenizer");
    for (int i = 0; i < p->n_stop_strings; i++)
        if (!p->stop_strings[i] || !p->stop_strings[i][0])
            return prl_error_set(PRL_ERR_ARG, "stop string %d is empty", i);
    return PRL_OK;
}

static int cand_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? 1 : -1;
    return x->id - y->id;
}

/* The sampler's candidates for τ > 0: cs[0..n) with weights exp(logits/τ − max) over the
** ids below vocab_limit, restricted by top-k/top-p (then sorted by weight). Returns n. */
int infer__sample_weights(cand *cs, const float *logits, int V, const prl_sample_params *sp)
{
    if (sp->vocab_limit > 0 && sp->vocab_limit < V) V = sp->vocab_limit; /* never draw past it */
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        double x = logits[i] / sp->temperature;
        mx = x > mx ? x : mx;
    }
    int n = V;
    for (int i = 0; i < V; i++) cs[i] = (cand){exp(logits[i] / sp->temperature - mx), i};
    int restrict_ = (sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1;
    if (restrict_) {
        qsort(cs, (size_t)V, sizeof *cs, cand_desc);
        if (sp->top_k > 0 && sp->top_k < n) n = sp->top_k;
        if (sp->top_p < 1) {
            double total = 0, acc = 0;
            for (int i = 0; i < n; i++) total += cs[i].w;
            for (int i = 0; i < n; i++) {
                acc += cs[i].w;
                if (acc >= sp->top_p * total) {
                    n = i + 1;
                    break;
                }
            }
        }
    }
    return n;
}

static int argmax_row(const float *logits, int V, const prl_sample_params *sp)
{
    if (sp->vocab_limit > 0 && sp->vocab_limit < V) V = sp->vocab_limit;
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* Draw a token from softmax(logits/τ) restricted by top-k/top-p; greedy when τ = 0. The
** reference form: infer__sample_row_fast must return the same token. */
int infer__sample_row(const float *logits, int V, const prl_sample_params *sp, prl_rng *rng,
                      cand *cs)
{
    if (sp->temperature == 0) return argmax_row(logits, V, sp);
    int n = infer__sample_weights(cs, logits, V, sp);
    double total = 0;
    for (int i = 0; i < n; i++) total += cs[i].w;
    double u = prl_rng_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += cs[i].w;
        if (u < acc) return cs[i].id;
    }
    return cs[n - 1].id; /* u rounded up to the total */
}

/* max over i < V of logits[i] under the rule `x > m ? x : m` from −∞, in float. */
static float row_max(const float *logits, int V)
{
    float m = -INFINITY;
    int i = 0;
#ifdef PRL_OPS_X86
    if (prl_row_kernels_avx2()) m = prl_v8_max_scaled(m, logits, V, 1.0f, &i); /* ·1 exact */
#endif
    for (; i < V; i++) m = logits[i] > m ? logits[i] : m;
    return m;
}

/* infer__sample_row's draw with the max vectorised and, when top-k/top-p leave every
** candidate, the weights summed as they are made (the same sum in the same order). */
int infer__sample_row_fast(const float *logits, int V, const prl_sample_params *sp, prl_rng *rng,
                           cand *cs)
{
    if (sp->temperature == 0) return argmax_row(logits, V, sp);
    if (sp->vocab_limit > 0 && sp->vocab_limit < V) V = sp->vocab_limit; /* never draw past it */
    int restrict_ = (sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1;
    if (restrict_) return infer__sample_row(logits, V, sp, rng, cs);
    double tau = sp->temperature, mx = (double)row_max(logits, V) / tau, total = 0;
    for (int i = 0; i < V; i++) {
        cs[i].w = exp(logits[i] / tau - mx);
        total += cs[i].w;
    }
    double u = prl_rng_uniform(rng) * total, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += cs[i].w;
        if (u < acc) return i;
    }
    return V - 1; /* u rounded up to the total */
}

/* log p(y) under softmax(logits/τ) over the whole vocabulary: the train path's function. */
float infer__logprob(const float *logits, int V, int y, double tau)
{
    prl_real lse;
    return (float)prl_logprob_forward(&lse, logits, V, y, tau);
}
