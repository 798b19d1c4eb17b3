/*
** spec_decode.c — acceptance rules of self-speculative decoding (greedy and modified
** rejection sampling). The draft and verify passes and the cache rollback are the infer
** path's (infer_spec.c); the maths is docs/infer.md.
*/
#include "engine/spec_decode.h"

#include <stdlib.h>

int prl_spec_accept_greedy(int32_t *out, const int32_t *draft, const int32_t *best, int D)
{
    int a = 0;
    while (a < D && draft[a] == best[a]) out[a] = draft[a], a++;
    out[a] = best[a]; /* the correction, or the bonus token after all D */
    return a + 1;
}

int prl_spec_draw(const double *w, int V, prl_rng *rng)
{
    double total = 0, acc = 0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        total += w[i];
        if (w[i] > 0) last = i;
    }
    double u = prl_rng_uniform(rng) * total;
    for (int i = 0; i < V; i++) {
        acc += w[i];
        if (w[i] > 0 && u < acc) return i;
    }
    return last;
}

int prl_spec_accept_sample(int32_t *out, const int32_t *draft, const double *q, const double *p,
                           int V, int D, prl_rng *rng)
{
    for (int k = 0; k < D; k++) {
        const double *pk = p + (size_t)k * V, *qk = q + (size_t)k * V;
        int x = draft[k];
        double u = prl_rng_uniform(&rng[k]);
        /* q_k(x) > 0: x was drawn from q_k */
        if (u * qk[x] < pk[x]) { /* u < p/q without dividing */
            out[k] = x;
            continue;
        }
        double *res = malloc((size_t)V * sizeof *res);
        PRL_ASSERT(res != NULL);
        double mass = 0;
        for (int i = 0; i < V; i++) mass += (res[i] = pk[i] > qk[i] ? pk[i] - qk[i] : 0);
        /* mass = 0 only when p_k = q_k, where the test above always accepts; guard anyway */
        out[k] = prl_spec_draw(mass > 0 ? res : pk, V, &rng[k]);
        free(res);
        return k + 1;
    }
    out[D] = prl_spec_draw(p + (size_t)D * V, V, &rng[D]);
    return D + 1;
}
