/*
** model_moe.c — the train path's MoE FFN sublayer, forward and backward: the router and its
** gates (route capture and override), tokens grouped by expert for per-expert GEMMs, the
** shared experts, the combine in slot order, and the balance and z auxiliary losses; the
** dense SwiGLU FFN's backward too (ops.c has the kernels). Tasks are cut by rows of one
** expert or by (expert, matrix), so no two write the same element.
*/
#include "engine/model_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ forward --------- */

/* Group (token, slot) pairs by expert with a stable counting sort: rows of one expert are
** contiguous and in token order, so per-expert GEMMs see a fixed row order. */
static void group_by_expert(layer_acts *la, int N, int E, int K)
{
    int32_t *off = la->offsets;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int i = 0; i < N * K; i++) off[la->sel[i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    int32_t cursor[4096];
    PRL_ASSERT(E <= 4096);
    memcpy(cursor, off, (size_t)E * sizeof *cursor);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            int p = cursor[la->sel[n * K + k]]++;
            la->pos[n * K + k] = p;
            la->token_of[p] = n;
        }
}

typedef struct expert_ctx {
    prl_model *m;
    layer_acts *la;
    const layer_offsets *o;
    dims D;
    expert_task *tasks;
    int n_tasks;
#ifndef PRL_REAL_DOUBLE
    const prl_packed_b *pk; /* per expert [w13, w2] packed for this pass (pack_experts) */
#endif
} expert_ctx;

static int build_expert_tasks(expert_task *t, const int32_t *off, int E)
{
    int n = 0;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r += PRL_ROW_BLOCK) {
            t[n].e = e;
            t[n].r0 = r;
            t[n].rows = off[e + 1] - r < PRL_ROW_BLOCK ? off[e + 1] - r : PRL_ROW_BLOCK;
            n++;
        }
    return n;
}

static size_t expert_base(const layer_offsets *o, const dims *D, int e)
{
    return o->experts + (size_t)e * 3 * D->de * D->d;
}

/* Task i's expert: its rows, its weights, and the offsets of its rows in the inputs (xo,
** d wide) and the hidden activations (ho, de wide); forward and backward alike. */
typedef struct expert_view {
    expert_task t;
    const prl_real *w13, *w2;
    size_t xo, ho;
} expert_view;

static expert_view expert_view_of(const expert_ctx *c, int i)
{
    const prl_model *m = c->m;
    const dims *D = &c->D;
    expert_view v = {.t = c->tasks[i]};
    size_t base = expert_base(c->o, D, v.t.e);
    v.w13 = P(base), v.w2 = P(base + 2 * (size_t)D->de * D->d);
    v.xo = (size_t)v.t.r0 * D->d, v.ho = (size_t)v.t.r0 * D->de;
    return v;
}

#ifndef PRL_REAL_DOUBLE
/* The float build packs each used expert's two matrices once per pass, for all of its
** row-block tasks (a task per 128 rows packed them once per task); the packed GEMM computes
** prl_gemm's bits. Forward: op(B) = w13ᵀ, w2ᵀ; backward: op(B) = w13, w2. The buffers are the
** calling thread's, reused from layer to layer. */
static _Thread_local prl_packed_b *tl_expert_pk;
static _Thread_local int tl_expert_pk_n;

typedef struct pack_ctx {
    expert_ctx *c;
    prl_packed_b *pk;
    int transposed;
} pack_ctx;

static void pack_expert_task(void *p, int i)
{
    pack_ctx *k = p;
    const expert_ctx *c = k->c;
    const dims *D = &c->D;
    int e = i / 2, d = D->d, de = D->de;
    if (c->la->offsets[e + 1] == c->la->offsets[e]) return; /* no rows: never read */
    const prl_model *m = c->m;
    size_t base = expert_base(c->o, D, e);
    const prl_real *w = i % 2 ? P(base + 2 * (size_t)de * d) : P(base);
    int rows = i % 2 ? d : 2 * de, cols = i % 2 ? de : d; /* w is rows × cols */
    prl_status rc = k->transposed ? prl_packed_b_repack(&k->pk[i], 1, cols, rows, w, cols)
                                  : prl_packed_b_repack(&k->pk[i], 0, rows, cols, w, cols);
    PRL_ASSERT(rc == PRL_OK);
}

static void pack_experts(expert_ctx *c, int transposed)
{
    int n = 2 * c->D.E;
    if (tl_expert_pk_n < n) {
        prl_packed_b *grown = realloc(tl_expert_pk, (size_t)n * sizeof *grown);
        PRL_ASSERT(grown != NULL);
        memset(grown + tl_expert_pk_n, 0, (size_t)(n - tl_expert_pk_n) * sizeof *grown);
        tl_expert_pk = grown, tl_expert_pk_n = n;
    }
    pack_ctx k = {.c = c, .pk = tl_expert_pk, .transposed = transposed};
    prl_parallel_for(n, pack_expert_task, &k);
    c->pk = tl_expert_pk;
}
#endif

/* out (rows, n) = a (rows, k)·op(B), B expert e's matrix `which` (0: w13, 1: w2), with the
** packed copy when there is one. */
static void expert_gemm(const expert_ctx *c, int trans_b, int e, int which, int rows, int n, int k,
                        const prl_real *a, const prl_real *w, int ldw, prl_real *out)
{
#ifndef PRL_REAL_DOUBLE
    if (c->pk) {
        prl_gemm_f32_packed(0, rows, 0, n, 1, a, k, &c->pk[2 * e + which], 0, out, n);
        return;
    }
#else
    (void)c, (void)e, (void)which;
#endif
    prl_gemm(0, trans_b, rows, n, k, 1, a, k, w, ldw, 0, out, n);
}

static void expert_forward_task(void *p, int i)
{
    expert_ctx *c = p;
    prl_model *m = c->m;
    layer_acts *la = c->la;
    const dims *D = &c->D;
    expert_view v = expert_view_of(c, i);
    expert_gemm(c, 1, v.t.e, 0, v.t.rows, 2 * D->de, D->d, la->xg + v.xo, v.w13, D->d,
                la->ea13 + 2 * v.ho);
    model__rnd(m, la->ea13 + 2 * v.ho, (size_t)v.t.rows * 2 * D->de);
    prl_silu_mul_forward(la->eh + v.ho, la->ea13 + 2 * v.ho, v.t.rows, D->de);
    model__rnd(m, la->eh + v.ho, (size_t)v.t.rows * D->de);
    expert_gemm(c, 1, v.t.e, 1, v.t.rows, D->d, D->de, la->eh + v.ho, v.w2, D->de, la->yg + v.xo);
    model__rnd(m, la->yg + v.xo, (size_t)v.t.rows * D->d);
}

static void gate_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    int E = c->D.E, K = c->D.K;
    for (int n = r0; n < r1; n++) {
        /* a PRL_ROUTE_NATIVE row (validated whole) routes natively: no forced ids */
        const int32_t *f = c->forced ? c->forced + (size_t)n * K : NULL;
        if (f && f[0] == PRL_ROUTE_NATIVE) f = NULL;
        prl_moe_gate_forward_grouped(la->sel + (size_t)n * K, la->g + (size_t)n * K,
                                     la->s + (size_t)n * E, la->z + (size_t)n * E, c->bias, f, E, K,
                                     c->m->cfg.n_group, c->m->cfg.topk_group,
                                     c->m->cfg.norm_topk_prob, c->m->cfg.routed_scaling_factor);
    }
}

static void gather_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    int d = c->D.d;
    for (int q = r0; q < r1; q++)
        memcpy(c->la->xg + (size_t)q * d, c->la->ln_f + (size_t)c->la->token_of[q] * d,
               (size_t)d * sizeof(prl_real));
}

/* out[n] += Σ_k g[n,k]·yg[pos(n,k)], slots in order */
static void combine_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    int d = c->D.d, K = c->D.K;
    for (int n = r0; n < r1; n++) {
        prl_real *out = c->out + (size_t)n * d;
        for (int k = 0; k < K; k++) {
            prl_real g = la->g[n * K + k];
            const prl_real *y = la->yg + (size_t)la->pos[n * K + k] * d;
            for (int i = 0; i < d; i++) out[i] += g * y[i];
        }
    }
    model__rnd(c->m, c->out + (size_t)r0 * d, (size_t)(r1 - r0) * d);
}

/* MoE: ln_f (N,d) → tmp (N,d) = shared(ln_f) + Σ_k g_k·expert_k(ln_f). */
int model__moe_forward(prl_model *m, int l, int moe_idx, const prl_batch *b, expert_task *tasks)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = model__dims_of(&m->cfg);
    int N = a->N;
    prl_matmul_forward(la->z, la->ln_f, P(o->router), N, D.d, D.E, 0);
    model__rnd(m, la->z, (size_t)N * D.E);
    const prl_real *bias = m->router_bias + (size_t)moe_idx * D.E;
    const int32_t *forced = b->route_override && moe_idx < m->n_moe /* MTP: native */
                                ? b->route_override + (size_t)moe_idx * N * D.K
                                : NULL;
    token_ctx tc = {.m = m, .la = la, .D = D, .bias = bias, .forced = forced, .out = a->tmp};
    prl_parallel_rows(N, gate_rows, &tc);
    memcpy(a->routes + (size_t)moe_idx * N * D.K, la->sel, (size_t)N * D.K * sizeof(int32_t));
    group_by_expert(la, N, D.E, D.K);
    prl_parallel_rows(N * D.K, gather_rows, &tc);
    expert_ctx c = {.m = m, .la = la, .o = o, .D = D, .tasks = tasks};
    c.n_tasks = build_expert_tasks(tasks, la->offsets, D.E);
#ifndef PRL_REAL_DOUBLE
    pack_experts(&c, 1);
#endif
    prl_parallel_for(c.n_tasks, expert_forward_task, &c);
    if (D.sde > 0)
        prl_swiglu_forward(a->tmp, la->a13, la->h, la->ln_f, P(o->sw1), P(o->sw2), N, D.d, D.sde, 0,
                           m->precision);
    else memset(a->tmp, 0, (size_t)N * D.d * sizeof(prl_real));
    prl_parallel_rows(N, combine_rows, &tc);
    int stop = model__emit(m, l, "moe.router_logits", la->z, N, D.E);
    return stop || model__emit(m, l, "moe.out", a->tmp, N, D.d);
}

/* The next sequence of row bi at or after position t, [*s0, *s1): the row's valid prefix, or
** in a packed row (prl_batch.pos) a run from a position 0; 0 when none is left. */
static int next_sequence(const prl_batch *b, int bi, int t, int *s0, int *s1)
{
    int len = b->lens ? b->lens[bi] : b->T;
    if (!b->pos) {
        *s0 = 0, *s1 = len;
        return t == 0;
    }
    const int32_t *p = b->pos + (size_t)bi * b->T;
    while (t < len && p[t] != 0) t++;
    if (t >= len) return 0;
    int e = t + 1;
    while (e < len && p[e] > 0) e++; /* validated: p[e] > 0 continues the sequence */
    *s0 = t, *s1 = e;
    return 1;
}

/* The sequences of the batch: B, or those of its packed rows. */
static int count_sequences(const prl_batch *b)
{
    int n = 0, s0, s1;
    for (int bi = 0; bi < b->B; bi++)
        for (int t = 0; next_sequence(b, bi, t, &s0, &s1); t = s1) n++;
    return n;
}

/* Auxiliary losses of one MoE layer (values only; gradients in the backward). */
void model__aux_losses(const prl_model *m, const layer_acts *la, const prl_batch *b, double *bal,
                       double *zl)
{
    dims D = model__dims_of(&m->cfg);
    const prl_config *c = &m->cfg;
    if (c->balance_loss_alpha > 0) { /* sequence-wise: each sequence's f·P, averaged */
        double *f = calloc((size_t)D.E * 2, sizeof(double)), *P_ = f + D.E;
        int n_seq = count_sequences(b), s0, s1;
        for (int bi = 0; bi < b->B; bi++)
            for (int t0 = 0; next_sequence(b, bi, t0, &s0, &s1); t0 = s1) {
                int len = s1 - s0;
                memset(f, 0, (size_t)D.E * 2 * sizeof(double));
                for (int t = s0; t < s1; t++) {
                    int n = bi * b->T + t;
                    const prl_real *s = la->s + (size_t)n * D.E;
                    double sum = 0;
                    for (int e = 0; e < D.E; e++) sum += s[e];
                    for (int e = 0; e < D.E; e++) P_[e] += s[e] / sum / len;
                    for (int k = 0; k < D.K; k++)
                        f[la->sel[n * D.K + k]] += (double)D.E / (D.K * len);
                }
                double term = 0;
                for (int e = 0; e < D.E; e++) term += f[e] * P_[e];
                *bal += c->balance_loss_alpha * term / n_seq;
            }
        free(f);
    }
    if (c->router_z_loss_coef > 0) {
        int n_valid = 0;
        double acc = 0;
        for (int n = 0; n < b->B * b->T; n++) {
            if (!model__valid_pos(b, n)) continue;
            const prl_real *z = la->z + (size_t)n * D.E;
            double mx = z[0], sum = 0;
            for (int e = 1; e < D.E; e++) mx = z[e] > mx ? z[e] : mx;
            for (int e = 0; e < D.E; e++) sum += exp(z[e] - mx);
            double lse = mx + log(sum);
            acc += lse * lse;
            n_valid++;
        }
        if (n_valid) *zl += c->router_z_loss_coef * acc / n_valid;
    }
}

/* ------------------------------------------------------------------ backward -------- */

static void expert_backward_rows_task(void *p, int i)
{
    expert_ctx *c = p;
    prl_model *m = c->m;
    prl_acts *a = m->acts;
    layer_acts *la = c->la;
    const dims *D = &c->D;
    expert_view v = expert_view_of(c, i);
    size_t NK = (size_t)a->N * D->K;
    prl_real *da13 = a->deh + 2 * v.ho, *dh = a->deh + 2 * NK * D->de + v.ho;
    /* dh = dyg·w2 (rows, de), then da13 (rows, 2de), then dxg = da13·w13 */
    expert_gemm(c, 0, v.t.e, 1, v.t.rows, D->de, D->d, a->dyg + v.xo, v.w2, D->de, dh);
    model__rnd(m, dh, (size_t)v.t.rows * D->de);
    prl_silu_mul_backward(da13, dh, la->ea13 + 2 * v.ho, v.t.rows, D->de);
    model__rnd(m, da13, (size_t)v.t.rows * 2 * D->de);
    expert_gemm(c, 0, v.t.e, 0, v.t.rows, D->d, 2 * D->de, da13, v.w13, D->d, a->dxg + v.xo);
}

/* One task per (expert, matrix pair): the weight gradient reduces over all of the expert's
** rows in one GEMM, so no two tasks write the same gradient. */
static void expert_backward_weights_task(void *p, int i)
{
    expert_ctx *c = p;
    prl_model *m = c->m;
    prl_acts *a = m->acts;
    layer_acts *la = c->la;
    const dims *D = &c->D;
    int e = i / 2, which = i % 2;
    int r0 = la->offsets[e], rows = la->offsets[e + 1] - r0;
    if (rows == 0) return;
    size_t base = expert_base(c->o, D, e);
    size_t xo = (size_t)r0 * D->d, ho = (size_t)r0 * D->de;
    if (which == 0) /* d[W1;W3] (2de,d) += da13ᵀ·xg */
        prl_gemm(1, 0, 2 * D->de, D->d, rows, 1, a->deh + 2 * ho, 2 * D->de, la->xg + xo, D->d, 1,
                 G(base), D->d);
    else /* dW2 (d,de) += dygᵀ·eh */
        prl_gemm(1, 0, D->d, D->de, rows, 1, a->dyg + xo, D->d, la->eh + ho, D->de, 1,
                 G(base + 2 * (size_t)D->de * D->d), D->de);
}

/* Gradients of the balance loss and z-loss of one MoE layer into dz, times the loss scale. */
static void aux_backward(const prl_model *m, const layer_acts *la, const prl_batch *b, prl_real *dz)
{
    dims D = model__dims_of(&m->cfg);
    const prl_config *c = &m->cfg;
    double ls = model__loss_scale(b);
    if (c->balance_loss_alpha > 0) {
        double *f = calloc((size_t)D.E, sizeof(double));
        int n_seq = count_sequences(b), s0, s1;
        for (int bi = 0; bi < b->B; bi++)
            for (int t0 = 0; next_sequence(b, bi, t0, &s0, &s1); t0 = s1) {
                int len = s1 - s0;
                memset(f, 0, (size_t)D.E * sizeof(double));
                for (int t = s0; t < s1; t++)
                    for (int k = 0; k < D.K; k++)
                        f[la->sel[(bi * b->T + t) * D.K + k]] += (double)D.E / (D.K * len);
                for (int t = s0; t < s1; t++) {
                    int n = bi * b->T + t;
                    const prl_real *s = la->s + (size_t)n * D.E;
                    double S = 0, dot = 0, k = ls * c->balance_loss_alpha / ((double)n_seq * len);
                    for (int e = 0; e < D.E; e++) S += s[e];
                    for (int e = 0; e < D.E; e++) dot += k * f[e] * s[e] / S;
                    for (int e = 0; e < D.E; e++) {
                        double ds = (k * f[e] - dot) / S;
                        dz[(size_t)n * D.E + e] += (prl_real)(ds * s[e] * (1 - s[e]));
                    }
                }
            }
        free(f);
    }
    if (c->router_z_loss_coef > 0) {
        int n_valid = 0;
        for (int n = 0; n < b->B * b->T; n++) n_valid += model__valid_pos(b, n);
        for (int n = 0; n < b->B * b->T; n++) {
            if (!model__valid_pos(b, n)) continue;
            const prl_real *z = la->z + (size_t)n * D.E;
            double mx = z[0], sum = 0;
            for (int e = 1; e < D.E; e++) mx = z[e] > mx ? z[e] : mx;
            for (int e = 0; e < D.E; e++) sum += exp(z[e] - mx);
            double lse = mx + log(sum), k = ls * c->router_z_loss_coef * 2 * lse / n_valid;
            for (int e = 0; e < D.E; e++)
                dz[(size_t)n * D.E + e] += (prl_real)(k * exp(z[e] - mx) / sum);
        }
    }
}

/* Backward per-token passes of the MoE. */
static void dyg_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    prl_acts *a = c->m->acts;
    int d = c->D.d, K = c->D.K;
    for (int n = r0; n < r1; n++) {
        const prl_real *dy = a->dres + (size_t)n * d;
        for (int k = 0; k < K; k++) {
            int q = la->pos[n * K + k];
            const prl_real *y = la->yg + (size_t)q * d;
            prl_real *dyg = a->dyg + (size_t)q * d, g = la->g[n * K + k], dot = 0;
            for (int i = 0; i < d; i++) {
                dot += dy[i] * y[i];
                dyg[i] = g * dy[i];
            }
            model__rnd(c->m, dyg, (size_t)d);
            a->dg[n * K + k] = dot;
        }
    }
}

static void scatter_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    prl_acts *a = c->m->acts;
    int d = c->D.d, K = c->D.K;
    for (int n = r0; n < r1; n++) {
        prl_real *dx = a->dln + (size_t)n * d;
        for (int k = 0; k < K; k++) {
            const prl_real *src = a->dxg + (size_t)la->pos[n * K + k] * d;
            for (int i = 0; i < d; i++) dx[i] += src[i];
        }
    }
}

static void gate_backward_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    prl_acts *a = c->m->acts;
    int E = c->D.E, K = c->D.K;
    memset(a->dz + (size_t)r0 * E, 0, (size_t)(r1 - r0) * E * sizeof(prl_real));
    for (int n = r0; n < r1; n++)
        prl_moe_gate_backward(a->dz + (size_t)n * E, a->dg + (size_t)n * K, la->sel + (size_t)n * K,
                              la->s + (size_t)n * E, E, K, c->m->cfg.norm_topk_prob,
                              c->m->cfg.routed_scaling_factor);
}

/* FFN sublayer (dense or MoE): dres holds ∂/∂(its output); adds the path through the FFN
** and ln2 into dx (∂/∂res_ffn; the plain residual passes dres itself). */
void model__ffn_backward(prl_model *m, int l, const prl_batch *b, expert_task *tasks, prl_real *dx)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = model__dims_of(&m->cfg);
    int N = a->N;
    model__zero(a->dln, (size_t)N * D.d);
    if (!prl_config_is_moe(&m->cfg, l)) {
        prl_swiglu_backward(a->dln, G(o->w1), G(o->w2), a->dffn_scratch, a->dres, la->ln_f, la->a13,
                            la->h, P(o->w1), P(o->w2), N, D.d, D.I, m->precision);
    } else {
        token_ctx tc = {.m = m, .la = la, .D = D};
        prl_parallel_rows(N, dyg_rows, &tc);
        expert_ctx c = {.m = m, .la = la, .o = o, .D = D, .tasks = tasks};
        c.n_tasks = build_expert_tasks(tasks, la->offsets, D.E);
#ifndef PRL_REAL_DOUBLE
        pack_experts(&c, 0);
#endif
        prl_parallel_for(c.n_tasks, expert_backward_rows_task, &c);
        prl_parallel_for(2 * D.E, expert_backward_weights_task, &c);
        prl_parallel_rows(N, scatter_rows, &tc);
        if (D.sde > 0)
            prl_swiglu_backward(a->dln, G(o->sw1), G(o->sw2), a->dffn_scratch, a->dres, la->ln_f,
                                la->a13, la->h, P(o->sw1), P(o->sw2), N, D.d, D.sde, m->precision);
        prl_parallel_rows(N, gate_backward_rows, &tc);
        aux_backward(m, la, b, a->dz);
        model__rnd(m, a->dz, (size_t)N * D.E);
        prl_matmul_backward(a->dln, G(o->router), a->dz, la->ln_f, P(o->router), N, D.d, D.E);
    }
    model__rnd(m, a->dln, (size_t)N * D.d);
    prl_rmsnorm_backward(dx, G(o->ln2), a->dln, la->res_ffn, P(o->ln2), la->rstd_f, N, D.d, D.d,
                         D.d);
    model__rnd(m, dx, (size_t)N * D.d);
}
