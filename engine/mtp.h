/*
** mtp.h — multi-token prediction (MTP) ops: the input op of an MTP module and the shifted
** inputs/targets of module k (private to engine/ and tests; the maths is docs/model.md
** "Multi-token prediction", spec/model.md §9).
**
** MTP module k (k = 1..D) at position i reads the previous depth's hidden state h^{k−1}_i
** (h⁰ = the trunk's merged hidden state before the final norm) and the embedding of token
** t_{i+k}, and predicts t_{i+k+1}:
**   h'_i = eh_proj · [enorm(Emb(t_{i+k})) ; hnorm(h^{k−1}_i)]     (embedding first, 2d → d)
** then a plain decoder layer and the (shared) head. The decoder layer and the head are the
** model's own code (model_mtp.c drives them); this file holds what is MTP-only.
**
** Like ops.h: outputs first, `d`-prefixed gradients, every backward ACCUMULATES (+=).
*/
#ifndef PRL_MTP_H
#define PRL_MTP_H

#include "engine/ops.h"

/* out[N,d] = cat[N,2d] · wᵀ with cat = [enorm(e; ge) | hnorm(h; gh)] (rms_norm_eps `eps`);
** w is eh_proj.weight [d, 2d] (out × in). cat, rstd_e[N], rstd_h[N] are saved for the
** backward. In a reduced precision `p` the op outputs cat (the norms') and out (eh_proj's)
** are rounded, as everywhere else; both paths call this, so they round alike. */
void prl_mtp_input_forward(prl_real *out, prl_real *cat, prl_real *rstd_e, prl_real *rstd_h,
                           const prl_real *e, const prl_real *h, const prl_real *ge,
                           const prl_real *gh, const prl_real *w, int N, int d, double eps,
                           prl_precision p);
/* de[N,d] += ∂/∂e, dh[N,d] += ∂/∂h, dge/dgh[d] and dw[d,2d] += theirs, given dout[N,d];
** dcat is scratch [N,2d] (overwritten; rounded to p, the gradient of a rounded output). */
void prl_mtp_input_backward(prl_real *de, prl_real *dh, prl_real *dge, prl_real *dgh, prl_real *dw,
                            prl_real *dcat, const prl_real *dout, const prl_real *cat,
                            const prl_real *e, const prl_real *h, const prl_real *ge,
                            const prl_real *gh, const prl_real *w, const prl_real *rstd_e,
                            const prl_real *rstd_h, int N, int d, prl_precision p);

/* The inputs of depth k (1-based) for a batch of B rows × T positions with valid lengths
** `lens` (NULL = all T): tok_k[b,i] = tokens[b,i+k] and tgt_k[b,i] = targets[b,i+k] (the
** target of position i+k is t_{i+k+1}), w_k[b,i] = scale · weights[b,i+k], while i + k <
** len_b; beyond that the position is padding (token 0, target −1, weight 0), and
** lens_k[b] = max(1, len_b − k). targets/weights NULL give −1/0 everywhere.
** Packed rows (pos [B*T], prl_batch.pos; NULL = none): position i takes i + k only inside
** its own sequence (pos[i+k] = pos[i] + k); the last k positions of each sequence become
** padding, pos_k −1, and pos_k = pos elsewhere (pos_k unused when pos is NULL). */
void prl_mtp_shift(int32_t *tok_k, int32_t *tgt_k, float *w_k, int32_t *lens_k,
                   const int32_t *tokens, const int32_t *targets, const float *weights,
                   const int32_t *lens, int B, int T, int k, double scale, const int32_t *pos,
                   int32_t *pos_k);

#endif /* PRL_MTP_H */
