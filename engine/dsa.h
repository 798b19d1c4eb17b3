/*
** dsa.h — DeepSeek Sparse Attention's lightning indexer (docs/model.md, "DSA"; spec model.md
** §2), private to engine/ and tests; the conventions of ops.h (outputs first, backward
** accumulates, shape comments).
**
** What is here: the index score of a query row over its causal keys, the top-k selection
** (ties to the lower key index), the indexer's KL objective, and the driver of one layer's
** indexer on the train path (projections, k norm, RoPE, scores, selection, loss, backward).
** What is not: the main attention over the selection — that is prl_attention_* of ops.h:
** the sparse kernel over each row's list of selected keys (prl_attn_shape.sel_idx,
** ops_attn_sparse.c), or, as the naive reference, the dense kernel with the selection as a
** mask (prl_attn_shape.sel, prl_attn_keys.sel). The indexer's input (the layer's normed input x and its
** normed compressed query cq) is detached: no gradient flows back into x or cq.
*/
#ifndef PRL_DSA_H
#define PRL_DSA_H

#include "engine/ops.h"

/* Index score of one query row over n keys, the code both paths run:
**   score[s] = Σ_j w[j]·ReLU(dI^(−1/2)·qI_j·kI(s))       heads j in order, s in [0, n)
** qI [HI·dI] (RoPE applied), w [HI] (already × HI^(−1/2)), kI rows [n, dI] at stride ldk. */
void prl_dsa_score_row(prl_real *score, const prl_real *qI, const prl_real *w, const prl_real *kI,
                       int ldk, int n, int HI, int dI);

/* Scores of B sequences of T tokens:
**   qI [B*T, HI*dI], kI [B*T, dI], w [B*T, HI] → score [B*T, T], row b*T+t holding columns
**   s <= t (the others 0); rows at or past lens[b] (NULL = T) are all 0. pos (NULL = one
**   sequence per row): packed rows (prl_dsa_dims.pos), columns of the row's segment only. */
void prl_dsa_score_forward(prl_real *score, const prl_real *qI, const prl_real *kI,
                           const prl_real *w, const int32_t *lens, int B, int T, int HI, int dI,
                           const int32_t *pos);
/* dqI, dkI, dw accumulate given dscore [B*T, T] (columns s > t and padding rows ignored).
** At the ReLU's kink (a = 0) the gradient is taken as 0. */
void prl_dsa_score_backward(prl_real *dqI, prl_real *dkI, prl_real *dw, const prl_real *dscore,
                            const prl_real *qI, const prl_real *kI, const prl_real *w,
                            const int32_t *lens, int B, int T, int HI, int dI, const int32_t *pos);

/* Top-min(k, n) of score[0..n): sel[s] = 1 when chosen, else 0. Equal scores are ordered by
** the lower index (spec §11.1), so the choice is deterministic. */
void prl_dsa_select_row(uint8_t *sel, const prl_real *score, int n, int k);

/* The indexer's KL objective for one query row over its support S (sel[s] != 0, or all of
** [0, n) when sel is NULL):
**   p = target / Σ_S target      (the head-summed main-attention probabilities; constant)
**   q = softmax_S(score)
**   returns KL(p ‖ q) = Σ_S p·(log p − log q), 0·log 0 = 0; 0 when Σ_S target = 0. */
double prl_dsa_kl_row_forward(const prl_real *target, const prl_real *score, const uint8_t *sel,
                              int n);
/* dscore[s] += scale·(q(s) − p(s)) on S. */
void prl_dsa_kl_row_backward(prl_real *dscore, const prl_real *target, const prl_real *score,
                             const uint8_t *sel, int n, prl_real scale);

/* ------------------------------------------------------------ one layer's indexer --- */

typedef struct prl_dsa_dims {
    int B, T;           /* batch shape */
    int d, rq;          /* hidden size, q_lora_rank */
    int HI, dI;         /* index_n_heads, index_head_dim */
    int dr;             /* qk_rope_head_dim: the first dr dims of every index head and key rotate */
    int topk;           /* index_topk */
    const int32_t *pos; /* NULL, or [B*T] positions in the segments of packed rows
                        ** (prl_batch.pos): a row scores, selects and learns over the keys of
                        ** its own segment only; a padding row (pos < 0) is skipped */
} prl_dsa_dims;

/* Indexer weights (out×in): wq_b [HI*dI, rq], wk [dI, d], k_norm [dI], wproj [HI, d]; and a
** gradient block of the same four. */
typedef struct prl_dsa_weights {
    prl_real *wq_b, *wk, *k_norm, *wproj;
} prl_dsa_weights;

/* Saved activations of one layer's indexer (views the caller carves; N = B*T):
**   qI [N, HI*dI], kz [N, dI] (x·wkᵀ), kI [N, dI], krstd [N], w [N, HI],
**   score [N, T], target [N, T] (head-summed attention probabilities), sel [N, T];
**   idx [N, k] (k = min(index_topk, T)): sel as row lists for the sparse attention. */
typedef struct prl_dsa_acts {
    prl_real *qI, *kz, *kI, *krstd, *w, *score, *target;
    uint8_t *sel;
    int32_t *idx;
} prl_dsa_acts;

/* Backward scratch (shared by the layers): dscore [N, T], dqI [N, HI*dI], dkI [N, dI],
** dkz [N, dI], dw [N, HI]. */
typedef struct prl_dsa_scratch {
    prl_real *dscore, *dqI, *dkI, *dkz, *dw;
} prl_dsa_scratch;

/* Forward of the indexer from the layer's normed input x [N, d] and normed compressed query
** cq [N, rq] (rope tables cos/sin [T, dr/2]):
**   qI = RoPE(cq·wq_bᵀ), kI = RoPE(RMSNorm(x·wkᵀ; k_norm)), w = (x·wprojᵀ)·HI^(−1/2), scores;
** then, when `select` is set, the top-k selection of every valid row into a->sel.
** In a reduced precision `p` the op outputs are rounded where the infer path's indexer rounds
** them: the three projections, qI and kI after RoPE, w after its scale, and the scores (the
** tensor the top-k reads). The KL objective's softmax and logs stay fp32. */
void prl_dsa_forward(prl_dsa_acts *a, const prl_dsa_weights *w, const prl_real *x,
                     const prl_real *cq, const prl_real *cos_t, const prl_real *sin_t,
                     const int32_t *lens, prl_dsa_dims D, int select, prl_precision p);
/* The indexer loss from the main attention's probabilities att [B, H, T, ns+T] (sinks first,
** excluded from the target): mean over valid query rows of the row KL, over the selection
** a->sel when `sparse`, else over every causal key. Fills a->target. idx NULL: att is dense;
** else att is the sparse kernel's compact [B, H, T, ns+k], column ns+j for key idx[row][j]
** (prl_attn_shape.sel_idx), which gives the same target bits. */
double prl_dsa_loss_forward(prl_dsa_acts *a, const prl_real *att, int H, int ns, int sparse,
                            const int32_t *idx, int k, const int32_t *lens, prl_dsa_dims D);
/* Gradient of that loss into the indexer weights only (g accumulates; x and cq detached).
** In a reduced precision p the gradient of every rounded forward output is rounded. */
void prl_dsa_backward(prl_dsa_weights *g, const prl_dsa_scratch *s, const prl_dsa_acts *a,
                      const prl_dsa_weights *w, const prl_real *x, const prl_real *cq,
                      const prl_real *cos_t, const prl_real *sin_t, int sparse, const int32_t *lens,
                      prl_dsa_dims D, prl_precision p);

#endif /* PRL_DSA_H */
