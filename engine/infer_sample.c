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

/* The top-p cut of cs[0..n) (sorted): the shortest prefix whose weight reaches top_p of
** `total`; n when none does (rounding). */
static float row_max(const float *logits, int V);

static int top_p_cut(const cand *cs, int n, double top_p, double total)
{
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += cs[i].w;
        if (acc >= top_p * total) return i + 1;
    }
    return n;
}

/* The sampler's candidates for τ > 0: cs[0..n) with weights exp(logits/τ − max) over the
** ids below vocab_limit, restricted by top-k/top-p (then sorted by weight, ties by id).
** Returns n. The top-p mass is measured against the kept candidates' total: summed in
** sorted order when top-k cut the vocabulary, else in id order (as the weights are made,
** so the fast form needs no full sort). The reference form: it sorts everything. */
int infer__sample_weights(cand *cs, const float *logits, int V, const prl_sample_params *sp)
{
    if (sp->vocab_limit > 0 && sp->vocab_limit < V) V = sp->vocab_limit; /* never draw past it */
    double mx = -INFINITY, total_id = 0;
    for (int i = 0; i < V; i++) {
        double x = logits[i] / sp->temperature;
        mx = x > mx ? x : mx;
    }
    int n = V;
    for (int i = 0; i < V; i++) {
        cs[i] = (cand){exp(logits[i] / sp->temperature - mx), i};
        total_id += cs[i].w;
    }
    int restrict_ = (sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1;
    if (restrict_) {
        qsort(cs, (size_t)V, sizeof *cs, cand_desc);
        if (sp->top_k > 0 && sp->top_k < n) n = sp->top_k;
        if (sp->top_p < 1) {
            double total = 0;
            for (int i = 0; i < n; i++) total += cs[i].w;
            n = top_p_cut(cs, n, sp->top_p, n < V ? total : total_id);
        }
    }
    return n;
}

/* a before b in the candidates' order (weight descending, then id ascending). */
static int better(const cand *a, const cand *b)
{
    return a->w > b->w || (a->w == b->w && a->id < b->id);
}

static void cand_swap(cand *a, cand *b)
{
    cand t = *a;
    *a = *b, *b = t;
}

/* Rearrange cs[lo, hi) so that cs[lo, lo + k) holds its k first candidates in the order
** (in any order among themselves): quickselect, median-of-three pivots. The order is strict
** (ids differ), so the set is the one a full sort puts first. */
static void select_first(cand *cs, int lo, int hi, int k)
{
    int want = lo + k;
    while (hi - lo > 1 && want > lo && want < hi) {
        int mid = lo + (hi - lo) / 2;
        if (better(&cs[mid], &cs[lo])) cand_swap(&cs[mid], &cs[lo]);
        if (better(&cs[hi - 1], &cs[lo])) cand_swap(&cs[hi - 1], &cs[lo]);
        if (better(&cs[hi - 1], &cs[mid])) cand_swap(&cs[hi - 1], &cs[mid]);
        cand pv = cs[mid]; /* the median; Lomuto partition around it */
        cand_swap(&cs[mid], &cs[hi - 1]);
        int st = lo;
        for (int i = lo; i < hi - 1; i++)
            if (better(&cs[i], &pv)) cand_swap(&cs[i], &cs[st++]);
        cand_swap(&cs[st], &cs[hi - 1]); /* cs[lo, st) before the pivot, at st, the rest after */
        if (st == want || st + 1 == want) return;
        if (st > want) hi = st;
        else lo = st + 1;
    }
}

enum { TOP_P_CHUNK = 64 }; /* first candidates sorted per round of the top-p search */

/* infer__sample_weights with selection instead of the full sort: top-k selects its k
** candidates and sorts only them; top-p alone sorts growing chunks of the best remaining
** candidates until the prefix reaches the mass. The same candidates in the same order with
** the same weights, so every draw from them is the reference's. */
int infer__sample_weights_fast(cand *cs, const float *logits, int V, const prl_sample_params *sp)
{
    if (sp->vocab_limit > 0 && sp->vocab_limit < V) V = sp->vocab_limit;
    double tau = sp->temperature, mx = (double)row_max(logits, V) / tau, total_id = 0;
    for (int i = 0; i < V; i++) {
        cs[i] = (cand){exp(logits[i] / tau - mx), i};
        total_id += cs[i].w;
    }
    if (sp->top_k > 0 && sp->top_k < V) {
        int n = sp->top_k;
        select_first(cs, 0, V, n);
        qsort(cs, (size_t)n, sizeof *cs, cand_desc);
        if (sp->top_p < 1) {
            double total = 0;
            for (int i = 0; i < n; i++) total += cs[i].w;
            n = top_p_cut(cs, n, sp->top_p, total);
        }
        return n;
    }
    if (!(sp->top_p < 1)) return V;
    double acc = 0, want = sp->top_p * total_id;
    for (int done = 0, chunk = TOP_P_CHUNK; done < V; done += chunk, chunk *= 2) {
        chunk = V - done < chunk ? V - done : chunk;
        select_first(cs, done, V, chunk);
        qsort(cs + done, (size_t)chunk, sizeof *cs, cand_desc);
        for (int i = done; i < done + chunk; i++) {
            acc += cs[i].w;
            if (acc >= want) return i + 1;
        }
    }
    return V;
}

static int argmax_row(const float *logits, int V, const prl_sample_params *sp)
{
    if (sp->vocab_limit > 0 && sp->vocab_limit < V) V = sp->vocab_limit;
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* A draw from the candidates cs[0..n) in proportion to their weights. */
static int draw(const cand *cs, int n, prl_rng *rng)
{
    double total = 0;
    for (int i = 0; i < n; i++) total += cs[i].w;
    double u = prl_rng_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += cs[i].w;
        if (u < acc) return cs[i].id;
    }
    return cs[n - 1].id; /* u rounded up to the total */
}

/* Draw a token from softmax(logits/τ) restricted by top-k/top-p; greedy when τ = 0. The
** reference form: infer__sample_row_fast must return the same token. */
int infer__sample_row(const float *logits, int V, const prl_sample_params *sp, prl_rng *rng,
                      cand *cs)
{
    if (sp->temperature == 0) return argmax_row(logits, V, sp);
    return draw(cs, infer__sample_weights(cs, logits, V, sp), rng);
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
    if (restrict_) return draw(cs, infer__sample_weights_fast(cs, logits, V, sp), rng);
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
