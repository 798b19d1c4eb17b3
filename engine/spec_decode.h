/*
** spec_decode.h — the acceptance rules of self-speculative decoding (private to engine/ and
** tests; docs/infer.md "Speculative decoding", spec/model.md §9.3).
**
** D draft tokens d_1..d_D with their draft distributions q_1..q_D are checked against the
** trunk's distributions p_1..p_{D+1} from one verify pass (p_k is the trunk's prediction for
** the position of d_k; p_{D+1} follows d_D). Both rules emit a + 1 tokens: the a accepted
** drafts, then a correction (at the first rejection) or the bonus token (all accepted).
** Pure functions on arrays: the infer path builds p and q (with the sampler's temperature /
** top-k / top-p transform applied to both) and owns the caches and their rollback.
*/
#ifndef PRL_SPEC_DECODE_H
#define PRL_SPEC_DECODE_H

#include "engine/engine.h"

/* Greedy: accept d_k while d_k == best[k−1] (= argmax p_k); at the first mismatch emit
** best[k−1]; if all D match emit best[D] too. out[] gets the emitted tokens (<= D + 1);
** returns how many. The output equals plain greedy decoding of the trunk. */
int prl_spec_accept_greedy(int32_t *out, const int32_t *draft, const int32_t *best, int D);

/* Modified rejection sampling [Leviathan et al.; Chen et al.]: for k = 1..D accept d_k when
** u_k < min(1, p_k(d_k) / q_k(d_k)) (u_k = prl_rng_uniform(&rng[k−1])); otherwise draw the
** correction from norm(max(0, p_k − q_k)) with rng[k−1] (after its u_k) and stop. If all D are
** accepted draw the bonus token from p_{D+1} with rng[D]. p is [(D+1)][V], q is [D][V], each
** row a probability vector (zeros outside the allowed set). Returns the number emitted. The
** emitted tokens are distributed exactly as sampling from p token by token. */
int prl_spec_accept_sample(int32_t *out, const int32_t *draft, const double *q, const double *p,
                           int V, int D, prl_rng *rng);

/* A draw from the probability vector w[0..V) (sums to ~1; the rounding tail goes to the last
** non-zero entry). */
int prl_spec_draw(const double *w, int V, prl_rng *rng);

#endif /* PRL_SPEC_DECODE_H */
