/*
** reduce.c — the fixed-order sum of an update's micro-batch gradients over data-parallel
** ranks, and the broadcast of rank 0's weights after the update (reduce.h).
**
** Three phases, the same on every rank count: (1) every rank evaluates its nodes (the largest
** tree nodes inside its share) locally; (2) rank 0 receives, rank by rank, each rank's status,
** nodes, leaf records and counts (a rank sends everything only after computing everything,
** so no rank waits on rank 0 while it could compute); (3) rank 0 adds the nodes up the same
** tree. Why a tree and not "rank partials in rank order": the tree fixes every addition
** whatever the shares are, so 1, 2 or 4 ranks give the same bits.
*/
#include "grpo/reduce.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LEVELS = 48, REASON_BYTES = 240 };

int prl_grpo_share_first(int M, int R, int r) { return (int)((int64_t)M * r / R); }

/* The rank whose share holds all of [lo, hi), or -1. */
static int owner(int M, int R, int lo, int hi)
{
    for (int r = 0; r < R; r++) {
        int a = prl_grpo_share_first(M, R, r), b = prl_grpo_share_first(M, R, r + 1);
        if (lo >= a && lo < b) return hi <= b ? r : -1;
    }
    return -1;
}

static int mid_of(int lo, int hi) { return lo + (hi - lo) / 2; }

typedef struct node {
    int lo, hi, rank;
    prl_real *sum; /* owned; on rank 0 every node's, elsewhere only its own */
} node;

typedef struct tree {
    const prl_grpo_reduce *r;
    int R, me;
    node *nodes; /* in tree order (left to right) */
    int n_nodes;
    prl_real *lv[MAX_LEVELS]; /* scratch by tree level, allocated on first use */
    char *records;            /* [M × record_bytes] */
} tree;

/* Count (nodes NULL) or list the largest nodes each inside one rank's share. */
static void list_nodes(tree *t, int lo, int hi)
{
    int o = owner(t->r->M, t->R, lo, hi);
    if (o >= 0) {
        if (t->nodes) t->nodes[t->n_nodes] = (node){.lo = lo, .hi = hi, .rank = o};
        t->n_nodes++;
        return;
    }
    int mid = mid_of(lo, hi);
    list_nodes(t, lo, mid), list_nodes(t, mid, hi);
}

static prl_real *level_buf(tree *t, int L)
{
    if (L >= MAX_LEVELS) return NULL;
    if (!t->lv[L]) t->lv[L] = malloc(t->r->n * sizeof *t->lv[L]);
    return t->lv[L];
}

/* left = left + right, element by element (the tree's one addition). */
static void add_into(prl_real *left, const prl_real *right, size_t n)
{
    for (size_t i = 0; i < n; i++) left[i] = left[i] + right[i];
}

/* Node [lo, hi) evaluated here into dst; levels >= L are scratch. */
static prl_status eval_local(tree *t, int lo, int hi, prl_real *dst, int L)
{
    const prl_grpo_reduce *r = t->r;
    if (hi - lo == 1) return r->leaf(r->ctx, lo, dst, t->records + (size_t)lo * r->record_bytes);
    int mid = mid_of(lo, hi);
    prl_status rc = eval_local(t, lo, mid, dst, L);
    prl_real *right = rc ? NULL : level_buf(t, L);
    if (!rc && !right) rc = prl_error_set(PRL_ERR_NOMEM, "gradient tree level %d", L);
    if (!rc) rc = eval_local(t, mid, hi, right, L + 1);
    if (!rc) add_into(dst, right, r->n);
    return rc;
}

/* Rank 0, after the gather: node [lo, hi) from the gathered nodes (*k: the next one). */
static prl_real *combine(tree *t, int lo, int hi, int L, int *k)
{
    node *d = &t->nodes[*k];
    if (d->lo == lo && d->hi == hi) return (*k)++, d->sum;
    int mid = mid_of(lo, hi);
    prl_real *a = combine(t, lo, mid, L, k), *b = combine(t, mid, hi, L + 1, k), *out = t->lv[L];
    for (size_t i = 0; i < t->r->n; i++) out[i] = a[i] + b[i];
    return out;
}

typedef struct rank_status {
    int32_t rc;
    char reason[REASON_BYTES];
} rank_status;

/* Phase 1: this rank's nodes, each into its own buffer (rank 0 holds a buffer for every
** node: all are allocated first, so the gather has them even after a failed leaf). */
static prl_status eval_mine(tree *t)
{
    for (int i = 0; i < t->n_nodes; i++) {
        node *d = &t->nodes[i];
        if (d->rank != t->me && t->me != 0) continue;
        if (!(d->sum = malloc(t->r->n * sizeof *d->sum)))
            return prl_error_set(PRL_ERR_NOMEM, "gradient node [%d, %d)", d->lo, d->hi);
    }
    for (int i = 0; i < t->n_nodes; i++) {
        node *d = &t->nodes[i];
        prl_status rc = d->rank == t->me ? eval_local(t, d->lo, d->hi, d->sum, 0) : PRL_OK;
        if (rc) return rc;
    }
    return PRL_OK;
}

/* Phase 2 on rank r != 0: status, then (when it is OK) nodes, records and counts. */
static prl_status send_mine(tree *t, prl_status rc)
{
    const prl_grpo_reduce *r = t->r;
    const prl_grpo_comm *c = r->comm;
    rank_status st = {.rc = (int32_t)rc};
    if (rc) snprintf(st.reason, sizeof st.reason, "%s", prl_error_message());
    prl_status e = c->send(c->ctx, 0, &st, sizeof st);
    for (int i = 0; !e && !rc && i < t->n_nodes; i++)
        if (t->nodes[i].rank == t->me)
            e = c->send(c->ctx, 0, t->nodes[i].sum, r->n * sizeof *t->nodes[i].sum);
    int a = prl_grpo_share_first(r->M, t->R, t->me),
        b = prl_grpo_share_first(r->M, t->R, t->me + 1);
    if (!e && !rc && b > a && r->record_bytes)
        e = c->send(c->ctx, 0, t->records + (size_t)a * r->record_bytes,
                    (size_t)(b - a) * r->record_bytes);
    if (!e && !rc && r->n_counts)
        e = c->send(c->ctx, 0, r->counts, r->n_counts * sizeof *r->counts);
    return e ? e : rc;
}

/* Phase 2 on rank 0: every other rank's part, rank by rank; the first failure is kept (and
** the other ranks are still drained, so none is left blocked in a send). */
static prl_status gather(tree *t, prl_status rc)
{
    const prl_grpo_reduce *r = t->r;
    const prl_grpo_comm *c = r->comm;
    double *cnt = r->n_counts ? malloc(r->n_counts * sizeof *cnt) : NULL;
    if (r->n_counts && !cnt) return prl_error_set(PRL_ERR_NOMEM, "expert counts");
    prl_status failed = rc;
    for (int q = 1; q < t->R; q++) {
        rank_status st;
        prl_status e = c->recv(c->ctx, q, &st, sizeof st);
        if (e) return free(cnt), e;
        st.reason[sizeof st.reason - 1] = 0;
        if (st.rc) {
            if (!failed) failed = prl_error_set((prl_status)st.rc, "rank %d: %s", q, st.reason);
            continue;
        }
        for (int i = 0; !e && i < t->n_nodes; i++) {
            node *d = &t->nodes[i];
            if (d->rank != q) continue;
            if (!d->sum && !(d->sum = malloc(r->n * sizeof *d->sum))) /* phase 1 ran short */
                e = prl_error_set(PRL_ERR_NOMEM, "gradient node [%d, %d)", d->lo, d->hi);
            if (!e) e = c->recv(c->ctx, q, d->sum, r->n * sizeof *d->sum);
        }
        int a = prl_grpo_share_first(r->M, t->R, q), b = prl_grpo_share_first(r->M, t->R, q + 1);
        if (!e && b > a && r->record_bytes)
            e = c->recv(c->ctx, q, t->records + (size_t)a * r->record_bytes,
                        (size_t)(b - a) * r->record_bytes);
        if (!e && r->n_counts) e = c->recv(c->ctx, q, cnt, r->n_counts * sizeof *cnt);
        for (size_t i = 0; !e && i < r->n_counts; i++) r->counts[i] += cnt[i];
        if (e) return free(cnt), e;
    }
    free(cnt);
    return failed;
}

prl_status prl_grpo_reduce_run(const prl_grpo_reduce *r, prl_real *out, void *records)
{
    if (r->M < 1) return prl_error_set(PRL_ERR_ARG, "gradient tree of %d leaves", r->M);
    tree t = {.r = r, .R = r->comm ? r->comm->size : 1, .me = r->comm ? r->comm->rank : 0};
    t.records = records;
    char *own = NULL; /* a non-zero rank's records: only its share is filled and sent */
    if (t.me != 0 && r->record_bytes && !(t.records = own = malloc((size_t)r->M * r->record_bytes)))
        return prl_error_set(PRL_ERR_NOMEM, "micro-batch records");
    list_nodes(&t, 0, r->M);
    t.nodes = calloc((size_t)t.n_nodes, sizeof *t.nodes);
    prl_status rc = t.nodes ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "gradient nodes");
    if (t.nodes) t.n_nodes = 0, list_nodes(&t, 0, r->M);
    if (!rc) rc = eval_mine(&t);
    if (t.R > 1) rc = t.me ? send_mine(&t, rc) : gather(&t, rc);
    if (!rc && t.me == 0) {
        int k = 0;
        for (int L = 0; !rc && t.n_nodes > 1 && L < MAX_LEVELS && (1 << L) < 2 * r->M; L++)
            if (!level_buf(&t, L)) rc = prl_error_set(PRL_ERR_NOMEM, "gradient tree level %d", L);
        if (!rc) memcpy(out, combine(&t, 0, r->M, 0, &k), r->n * sizeof *out);
    }
    for (int i = 0; t.nodes && i < t.n_nodes; i++) free(t.nodes[i].sum);
    for (int L = 0; L < MAX_LEVELS; L++) free(t.lv[L]);
    free(t.nodes), free(own);
    return rc;
}

prl_status prl_grpo_reduce_bcast_model(const prl_grpo_comm *comm, prl_model *m,
                                       prl_loss_scaler *scaler, prl_status rc)
{
    if (!comm || comm->size <= 1) return rc;
    rank_status st = {.rc = (int32_t)rc};
    if (comm->rank == 0 && rc) snprintf(st.reason, sizeof st.reason, "%s", prl_error_message());
    prl_status e = comm->bcast(comm->ctx, &st, sizeof st);
    if (e) return e;
    st.reason[sizeof st.reason - 1] = 0;
    if (st.rc)
        return comm->rank == 0 ? rc : prl_error_set((prl_status)st.rc, "rank 0: %s", st.reason);
    size_t nb = (size_t)m->n_moe_all * m->cfg.n_routed_experts;
    e = comm->bcast(comm->ctx, m->params, m->n_params * sizeof *m->params);
    if (!e && nb) e = comm->bcast(comm->ctx, m->router_bias, nb * sizeof *m->router_bias);
    if (!e && scaler) e = comm->bcast(comm->ctx, scaler, sizeof *scaler);
    return e;
}
