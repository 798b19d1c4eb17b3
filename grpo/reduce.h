/*
** reduce.h — grpo's internal header of reduce.c: the fixed-order sum of an update's
** micro-batch gradients over data-parallel ranks (prl_grpo_comm, grpo.h), and the broadcast
** of rank 0's weights after the update.
**
** The sum is a fixed binary tree over the leaf (micro-batch) indices: node [lo, hi) is
** node [lo, mid) + node [mid, hi) with mid = lo + (hi − lo)/2, added element by element in
** prl_real. Rank r of R owns the leaves [M·r/R, M·(r+1)/R) and evaluates the largest nodes
** inside its share; rank 0 gathers every rank's nodes and evaluates the rest of the same
** tree. The tree, not the ranks, fixes every addition, so the sum is bitwise the same for
** every R (one process is R = 1: the root is one node).
*/
#ifndef PRL_GRPO_REDUCE_H
#define PRL_GRPO_REDUCE_H

#include "grpo/grpo.h"

/* Leaf j's gradient into grad[n] and its record (record_bytes) into record. */
typedef prl_status (*prl_grpo_leaf_fn)(void *ctx, int j, prl_real *grad, void *record);

typedef struct prl_grpo_reduce {
    int M;               /* leaves, >= 1 */
    size_t n;            /* reals per gradient */
    size_t record_bytes; /* per-leaf record gathered to rank 0 (stats), may be 0 */
    double *counts;      /* [n_counts] integer-valued tallies (expert counts): a rank's
                                ** are added into rank 0's (exact in any order) */
    size_t n_counts;
    const prl_grpo_comm *comm; /* NULL: one process */
    prl_grpo_leaf_fn leaf;
    void *ctx;
} prl_grpo_reduce;

/* The first leaf of rank r's share of M leaves among R ranks (r = R gives M). */
int prl_grpo_share_first(int M, int R, int r);

/* Rank 0: the tree's sum into out[n] and every leaf's record into records[M × record_bytes]
** in leaf order. Other ranks: their nodes, records and counts sent to rank 0 (out and
** records untouched). Every rank takes part in every transfer even after a failure, so a
** failed leaf on any rank fails the call on rank 0 (naming the rank) without a hang. */
prl_status prl_grpo_reduce_run(const prl_grpo_reduce *r, prl_real *out, void *records);

/* After rank 0's update (its status rc): rank 0's status, weights, router bias and loss
** scaler (when not NULL) to every rank. Returns rank 0's status on every rank (a failure of
** rank 0 reads as PRL_ERR_IO elsewhere). No-op returning rc with comm NULL or one rank. */
prl_status prl_grpo_reduce_bcast_model(const prl_grpo_comm *comm, prl_model *m,
                                       prl_loss_scaler *scaler, prl_status rc);

#endif /* PRL_GRPO_REDUCE_H */
