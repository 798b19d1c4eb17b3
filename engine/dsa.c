/*
** dsa.c — the DSA lightning indexer: scores, top-k selection, KL objective and one layer's
** indexer driver for the train path (see dsa.h; maths in docs/model.md, "DSA").
**
** Every reduction runs in a fixed order (heads, then keys, in index order) inside one task
** that owns its output row, so results do not depend on the thread count. The infer path
** calls prl_dsa_score_row and prl_dsa_select_row, so its selection is bit for bit the train
** path's when the inputs are.
*/
#include "engine/dsa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int seq_len(const int32_t *lens, int b, int T) { return lens ? lens[b] : T; }

/* Row n (position t of sequence b) is a query row: inside the length and, in a packed row,
** not a padding row. */
static int query_row(const int32_t *lens, const int32_t *pos, int n, int T)
{
    return n % T < seq_len(lens, n / T, T) && !(pos && pos[n] < 0);
}

/* The first key of row n's causal keys [lo, t]: its segment's first in a packed row. */
static int key_lo(const int32_t *pos, int n, int T)
{
    return pos ? prl_segment_start(n % T, pos[n]) : 0;
}

/* ------------------------------------------------------------------ scores ---------- */

void prl_dsa_score_row(prl_real *score, const prl_real *qI, const prl_real *w, const prl_real *kI,
                       int ldk, int n, int HI, int dI)
{
    /* qI [HI, dI], w [HI], kI [n, dI] at ldk → score [n] */
    prl_real scale = (prl_real)(1.0 / sqrt((double)dI));
    for (int s = 0; s < n; s++) {
        const prl_real *k = kI + (size_t)s * ldk;
        prl_real acc = 0;
        for (int j = 0; j < HI; j++) {
            const prl_real *q = qI + (size_t)j * dI;
            prl_real a = 0;
            for (int i = 0; i < dI; i++) a += q[i] * k[i];
            a *= scale;
            if (a > 0) acc += w[j] * a;
        }
        score[s] = acc;
    }
}

typedef struct score_ctx {
    prl_real *score, *dqI, *dkI, *dw;
    const prl_real *qI, *kI, *w, *dscore;
    const int32_t *lens, *pos;
    int B, T, HI, dI;
} score_ctx;

static void score_rows(void *p, int r0, int r1)
{
    score_ctx *c = p;
    int T = c->T;
    for (int n = r0; n < r1; n++) {
        int b = n / T, t = n % T, lo = key_lo(c->pos, n, T);
        prl_real *row = c->score + (size_t)n * T;
        memset(row, 0, (size_t)T * sizeof *row);
        if (!query_row(c->lens, c->pos, n, T)) continue;
        prl_dsa_score_row(row + lo, c->qI + (size_t)n * c->HI * c->dI, c->w + (size_t)n * c->HI,
                          c->kI + ((size_t)b * T + lo) * c->dI, c->dI, t + 1 - lo, c->HI, c->dI);
    }
}

void prl_dsa_score_forward(prl_real *score, const prl_real *qI, const prl_real *kI,
                           const prl_real *w, const int32_t *lens, int B, int T, int HI, int dI,
                           const int32_t *pos)
{
    score_ctx c = {.score = score,
                   .qI = qI,
                   .kI = kI,
                   .w = w,
                   .lens = lens,
                   .pos = pos,
                   .B = B,
                   .T = T,
                   .HI = HI,
                   .dI = dI};
    prl_parallel_rows(B * T, score_rows, &c);
}

/* Query-side gradients: row t owns dqI(t) and dw(t). */
static void score_backward_query_rows(void *p, int r0, int r1)
{
    score_ctx *c = p;
    int T = c->T, HI = c->HI, dI = c->dI;
    prl_real scale = (prl_real)(1.0 / sqrt((double)dI));
    for (int n = r0; n < r1; n++) {
        int b = n / T, t = n % T;
        if (!query_row(c->lens, c->pos, n, T)) continue;
        const prl_real *ds = c->dscore + (size_t)n * T, *w = c->w + (size_t)n * HI;
        for (int s = key_lo(c->pos, n, T); s <= t; s++) {
            if (ds[s] == 0) continue;
            const prl_real *k = c->kI + ((size_t)b * T + s) * dI;
            for (int j = 0; j < HI; j++) {
                const prl_real *q = c->qI + ((size_t)n * HI + j) * dI;
                prl_real a = 0;
                for (int i = 0; i < dI; i++) a += q[i] * k[i];
                a *= scale;
                if (!(a > 0)) continue;
                c->dw[(size_t)n * HI + j] += ds[s] * a;
                prl_real f = ds[s] * w[j] * scale;
                prl_real *dq = c->dqI + ((size_t)n * HI + j) * dI;
                for (int i = 0; i < dI; i++) dq[i] += f * k[i];
            }
        }
    }
}

/* Key-side gradients: row s owns dkI(s), summed over the queries t >= s in order. */
static void score_backward_key_rows(void *p, int r0, int r1)
{
    score_ctx *c = p;
    int T = c->T, HI = c->HI, dI = c->dI;
    prl_real scale = (prl_real)(1.0 / sqrt((double)dI));
    for (int n = r0; n < r1; n++) {
        int b = n / T, s = n % T, len = seq_len(c->lens, b, T);
        const prl_real *k = c->kI + (size_t)n * dI;
        prl_real *dk = c->dkI + (size_t)n * dI;
        for (int t = s; t < len; t++) {
            size_t m = (size_t)b * T + t;
            if (!query_row(c->lens, c->pos, (int)m, T) || key_lo(c->pos, (int)m, T) > s) continue;
            prl_real ds = c->dscore[m * T + s];
            if (ds == 0) continue;
            for (int j = 0; j < HI; j++) {
                const prl_real *q = c->qI + (m * HI + j) * dI;
                prl_real a = 0;
                for (int i = 0; i < dI; i++) a += q[i] * k[i];
                a *= scale;
                if (!(a > 0)) continue;
                prl_real f = ds * c->w[m * HI + j] * scale;
                for (int i = 0; i < dI; i++) dk[i] += f * q[i];
            }
        }
    }
}

void prl_dsa_score_backward(prl_real *dqI, prl_real *dkI, prl_real *dw, const prl_real *dscore,
                            const prl_real *qI, const prl_real *kI, const prl_real *w,
                            const int32_t *lens, int B, int T, int HI, int dI, const int32_t *pos)
{
    score_ctx c = {.dqI = dqI,
                   .pos = pos,
                   .dkI = dkI,
                   .dw = dw,
                   .dscore = dscore,
                   .qI = qI,
                   .kI = kI,
                   .w = w,
                   .lens = lens,
                   .B = B,
                   .T = T,
                   .HI = HI,
                   .dI = dI};
    prl_parallel_rows(B * T, score_backward_query_rows, &c);
    prl_parallel_rows(B * T, score_backward_key_rows, &c);
}

/* ------------------------------------------------------------------ selection ------- */

typedef struct ranked {
    prl_real score;
    int idx;
} ranked;

/* Higher score first; equal scores by the lower index. */
static int rank_cmp(const void *pa, const void *pb)
{
    const ranked *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* Restore the heap below i: every node ranks before (is better than) its children, so the
** root is the worst of the kept k. */
static void sift_down(ranked *h, int k, int i)
{
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        if (l < k && rank_cmp(&h[l], &h[w]) > 0) w = l;
        if (r < k && rank_cmp(&h[r], &h[w]) > 0) w = r;
        if (w == i) return;
        ranked t = h[i];
        h[i] = h[w], h[w] = t, i = w;
    }
}

void prl_dsa_select_row(uint8_t *sel, const prl_real *score, int n, int k)
{
    if (k >= n || k <= 0) { /* the first k tokens attend densely (spec §2.3) */
        memset(sel, k > 0, (size_t)n);
        return;
    }
    /* the k best under a total order, kept in a heap whose root is the worst of them:
    ** O(n log k), and the set is unique whatever the algorithm */
    ranked *h = malloc((size_t)k * sizeof *h);
    PRL_ASSERT(h != NULL);
    for (int s = 0; s < k; s++) h[s] = (ranked){score[s], s};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    for (int s = k; s < n; s++) {
        ranked x = {score[s], s};
        if (rank_cmp(&x, &h[0]) < 0) h[0] = x, sift_down(h, k, 0);
    }
    memset(sel, 0, (size_t)n);
    for (int i = 0; i < k; i++) sel[h[i].idx] = 1;
    free(h);
}

/* ------------------------------------------------------------------ KL objective ---- */

/* Max score, softmax denominator and target mass over the support. */
static void kl_stats(const prl_real *target, const prl_real *score, const uint8_t *sel, int n,
                     prl_real *mx, prl_real *sum, prl_real *tsum)
{
    prl_real m = -INFINITY, z = 0, ts = 0;
    for (int s = 0; s < n; s++)
        if (!sel || sel[s]) m = score[s] > m ? score[s] : m;
    for (int s = 0; s < n; s++)
        if (!sel || sel[s]) z += PRL_EXP(score[s] - m), ts += target[s];
    *mx = m, *sum = z, *tsum = ts;
}

double prl_dsa_kl_row_forward(const prl_real *target, const prl_real *score, const uint8_t *sel,
                              int n)
{
    prl_real m, z, ts;
    kl_stats(target, score, sel, n, &m, &z, &ts);
    if (!(ts > 0)) return 0;
    prl_real lse = m + PRL_LOG(z);
    double kl = 0;
    for (int s = 0; s < n; s++) {
        if ((sel && !sel[s]) || !(target[s] > 0)) continue;
        prl_real p = target[s] / ts;
        kl += (double)(p * (PRL_LOG(p) - (score[s] - lse)));
    }
    return kl;
}

void prl_dsa_kl_row_backward(prl_real *dscore, const prl_real *target, const prl_real *score,
                             const uint8_t *sel, int n, prl_real scale)
{
    prl_real m, z, ts;
    kl_stats(target, score, sel, n, &m, &z, &ts);
    if (!(ts > 0)) return;
    for (int s = 0; s < n; s++)
        if (!sel || sel[s]) dscore[s] += scale * (PRL_EXP(score[s] - m) / z - target[s] / ts);
}

/* ------------------------------------------------------------------ layer driver ---- */

void prl_dsa_forward(prl_dsa_acts *a, const prl_dsa_weights *w, const prl_real *x,
                     const prl_real *cq, const prl_real *cos_t, const prl_real *sin_t,
                     const int32_t *lens, prl_dsa_dims D, int select, prl_precision p)
{
    int N = D.B * D.T, HI = D.HI, dI = D.dI;
    size_t nq = (size_t)N * HI * dI, nk = (size_t)N * dI, nw = (size_t)N * HI;
    prl_matmul_forward(a->qI, cq, w->wq_b, N, D.rq, HI * dI, 0);
    prl_round_reals(p, a->qI, nq);
    prl_rope_packed(a->qI, cos_t, sin_t, D.pos, N, D.T, HI, dI, 0, HI * dI, D.dr, 0,
                    1); /* [rope | nope] */
    prl_round_reals(p, a->qI, nq);
    prl_matmul_forward(a->kz, x, w->wk, N, D.d, dI, 0);
    prl_round_reals(p, a->kz, nk);
    /* norm and RoPE as one op, rounded once: the infer path stores kI only after both */
    prl_rmsnorm_forward(a->kI, a->krstd, a->kz, w->k_norm, N, dI, dI, dI, PRL_LATENT_NORM_EPS);
    prl_rope_packed(a->kI, cos_t, sin_t, D.pos, N, D.T, 1, dI, 0, dI, D.dr, 0, 1);
    prl_round_reals(p, a->kI, nk);
    prl_matmul_forward(a->w, x, w->wproj, N, D.d, HI, 0);
    prl_round_reals(p, a->w, nw);
    prl_real hs = (prl_real)(1.0 / sqrt((double)HI));
    for (size_t i = 0; i < (size_t)N * HI; i++) a->w[i] *= hs;
    prl_round_reals(p, a->w, nw);
    prl_dsa_score_forward(a->score, a->qI, a->kI, a->w, lens, D.B, D.T, HI, dI, D.pos);
    prl_round_reals(p, a->score, (size_t)N * D.T);
    if (!select) return;
    for (int n = 0; n < N; n++) {
        int t = n % D.T, lo = key_lo(D.pos, n, D.T);
        uint8_t *row = a->sel + (size_t)n * D.T;
        memset(row, 0, (size_t)D.T);
        if (query_row(lens, D.pos, n, D.T))
            prl_dsa_select_row(row + lo, a->score + (size_t)n * D.T + lo, t + 1 - lo, D.topk);
    }
}

double prl_dsa_loss_forward(prl_dsa_acts *a, const prl_real *att, int H, int ns, int sparse,
                            const int32_t *idx, int k, const int32_t *lens, prl_dsa_dims D)
{
    int T = D.T, ldS = ns + (idx ? k : T), rows = 0;
    double sum = 0;
    for (int b = 0; b < D.B; b++) {
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            int lo = key_lo(D.pos, (int)n, T);
            prl_real *p = a->target + n * T;
            memset(p, 0, (size_t)T * sizeof *p);
            if (!query_row(lens, D.pos, (int)n, T)) continue;
            for (int h = 0; h < H; h++) { /* heads in order; sink columns left out */
                const prl_real *P = att + (((size_t)b * H + h) * T + t) * ldS + ns;
                if (idx) { /* the unselected keys' terms are 0 in the dense layout */
                    const int32_t *row = idx + n * k;
                    for (int j = 0, c = prl_attn_sel_count(row, k); j < c; j++) p[row[j]] += P[j];
                } else {
                    for (int s = lo; s <= t; s++) p[s] += P[s];
                }
            }
            sum += prl_dsa_kl_row_forward(p + lo, a->score + n * T + lo,
                                          sparse ? a->sel + n * T + lo : NULL, t + 1 - lo);
            rows++;
        }
    }
    return rows ? sum / rows : 0;
}

void prl_dsa_backward(prl_dsa_weights *g, const prl_dsa_scratch *s, const prl_dsa_acts *a,
                      const prl_dsa_weights *w, const prl_real *x, const prl_real *cq,
                      const prl_real *cos_t, const prl_real *sin_t, int sparse, const int32_t *lens,
                      prl_dsa_dims D, prl_precision p)
{
    int N = D.B * D.T, T = D.T, HI = D.HI, dI = D.dI, rows = 0;
    size_t nq = (size_t)N * HI * dI, nk = (size_t)N * dI, nw = (size_t)N * HI;
    for (int n = 0; n < N; n++) rows += query_row(lens, D.pos, n, T);
    memset(s->dscore, 0, (size_t)N * T * sizeof *s->dscore);
    for (int n = 0; n < N; n++) {
        int t = n % T, lo = key_lo(D.pos, n, T);
        if (!query_row(lens, D.pos, n, T)) continue;
        size_t at = (size_t)n * T + lo;
        prl_dsa_kl_row_backward(s->dscore + at, a->target + at, a->score + at,
                                sparse ? a->sel + at : NULL, t + 1 - lo, (prl_real)(1.0 / rows));
    }
    memset(s->dqI, 0, (size_t)N * HI * dI * sizeof *s->dqI);
    memset(s->dkI, 0, (size_t)N * dI * sizeof *s->dkI);
    memset(s->dw, 0, (size_t)N * HI * sizeof *s->dw);
    prl_round_reals(p, s->dscore, (size_t)N * T);
    prl_dsa_score_backward(s->dqI, s->dkI, s->dw, s->dscore, a->qI, a->kI, a->w, lens, D.B, T, HI,
                           dI, D.pos);
    prl_round_reals(p, s->dqI, nq);
    prl_round_reals(p, s->dkI, nk);
    prl_round_reals(p, s->dw, nw);
    /* w = raw·HI^(−1/2); no gradient into x or cq (the indexer's input is detached) */
    prl_real hs = (prl_real)(1.0 / sqrt((double)HI));
    for (size_t i = 0; i < (size_t)N * HI; i++) s->dw[i] *= hs;
    prl_round_reals(p, s->dw, nw);
    prl_matmul_backward(NULL, g->wproj, s->dw, x, w->wproj, N, D.d, HI);
    prl_rope_packed(s->dkI, cos_t, sin_t, D.pos, N, T, 1, dI, 0, dI, D.dr, 0, -1);
    memset(s->dkz, 0, (size_t)N * dI * sizeof *s->dkz);
    prl_rmsnorm_backward(s->dkz, g->k_norm, s->dkI, a->kz, w->k_norm, a->krstd, N, dI, dI, dI);
    prl_round_reals(p, s->dkz, nk);
    prl_matmul_backward(NULL, g->wk, s->dkz, x, w->wk, N, D.d, dI);
    prl_rope_packed(s->dqI, cos_t, sin_t, D.pos, N, T, HI, dI, 0, HI * dI, D.dr, 0, -1);
    prl_round_reals(p, s->dqI, nq);
    prl_matmul_backward(NULL, g->wq_b, s->dqI, cq, w->wq_b, N, D.rq, HI * dI);
}
