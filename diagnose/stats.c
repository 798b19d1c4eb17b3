/*
** stats.c — the divergence measures of prl diagnose (shared/spec/rl.md §6): per-op max abs
** difference, relative L2 and Pearson correlation; the per-token log-prob difference
** histogram; routing overlap per MoE layer.
**
** Everything accumulates in double. The PCC is merged chunk by chunk from co-moments
** (Chan et al.'s parallel update), not from raw sums: two tensors that agree to 1e-7 give
** Σab and √(Σa²Σb²) equal in their first ~14 digits, and the raw formula would lose the
** answer to cancellation. No I/O, no allocation.
*/
#include "diagnose/diagnose.h"

#include <math.h>
#include <string.h>

double prl_diag_op_rel_l2(const prl_diag_op *op)
{
    if (op->nonfinite) return INFINITY;
    return sqrt(op->ss_diff) / (sqrt(op->ss_b) + 1e-12);
}

double prl_diag_op_pcc(const prl_diag_op *op)
{
    if (op->count == 0 || op->nonfinite) return NAN;
    if (op->ss_diff == 0) return 1.0; /* identical, constant or not */
    double den = sqrt(op->m2a) * sqrt(op->m2b);
    return den > 0 ? op->cab / den : NAN;
}

void prl_diag_op_add(prl_diag_op *op, const float *a, const float *b, size_t n)
{
    /* the chunk's own means and co-moments (two passes), then one merge */
    double sa = 0, sb = 0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (!isfinite(x) || !isfinite(y)) {
            if (!(x == y)) op->nonfinite++, op->max_abs = INFINITY; /* inf == inf is agreement */
            continue;
        }
        double d = fabs(x - y);
        if (d > op->max_abs) op->max_abs = d;
        op->ss_diff += d * d;
        op->ss_b += y * y;
        sa += x, sb += y, m++;
    }
    if (m == 0) return;
    double ma = sa / (double)m, mb = sb / (double)m, m2a = 0, m2b = 0, cab = 0;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (!isfinite(x) || !isfinite(y)) continue;
        m2a += (x - ma) * (x - ma), m2b += (y - mb) * (y - mb), cab += (x - ma) * (y - mb);
    }
    double n1 = (double)op->count, n2 = (double)m, nt = n1 + n2;
    double da = ma - op->mean_a, db = mb - op->mean_b, w = n1 * n2 / nt;
    op->m2a += m2a + da * da * w;
    op->m2b += m2b + db * db * w;
    op->cab += cab + da * db * w;
    op->mean_a += da * n2 / nt;
    op->mean_b += db * n2 / nt;
    op->count += m;
}

int prl_diag_hist_bin(double d)
{
    if (d == 0) return 0;
    if (!(d <= 1)) return PRL_DIAG_HIST_BINS - 1; /* > 1 and NaN */
    double edge = 1e-7;
    for (int i = 1; i < PRL_DIAG_HIST_BINS - 1; i++, edge *= 10)
        if (d <= edge * (1 + 1e-12)) return i; /* the decade edges are not exact in binary */
    return PRL_DIAG_HIST_BINS - 2;
}

double prl_diag_hist_edge(int bin)
{
    if (bin <= 0) return 0;
    if (bin >= PRL_DIAG_HIST_BINS - 1) return INFINITY;
    return pow(10.0, bin - 8);
}

const char *prl_diag_hist_label(int bin)
{
    static const char *const labels[PRL_DIAG_HIST_BINS] = {
        "0", "<=1e-7", "<=1e-6", "<=1e-5", "<=1e-4", "<=1e-3", "<=1e-2", "<=1e-1", "<=1", ">1"};
    return bin >= 0 && bin < PRL_DIAG_HIST_BINS ? labels[bin] : "?";
}

void prl_diag_logprob_add(prl_diag_logprob *s, const float *lp_train, const float *lp_other, int n)
{
    for (int i = 0; i < n; i++) {
        double d = (double)lp_train[i] - (double)lp_other[i], ad = fabs(d);
        s->n++;
        s->hist[prl_diag_hist_bin(ad)]++;
        if (!isfinite(d)) {
            s->max_abs = INFINITY;
            continue;
        }
        s->sum_abs += ad;
        s->sum_d += d;
        if (ad > s->max_abs) s->max_abs = ad;
        float pa = expf(lp_train[i]), pb = expf(lp_other[i]);
        prl_diag_op_add(&s->prob, &pa, &pb, 1);
    }
}

void prl_diag_routing_add(prl_diag_routing *r, const int32_t *ids_a, size_t lda,
                          const int32_t *ids_b, size_t ldb, int tokens, int K)
{
    for (int t = 0; t < tokens; t++) {
        const int32_t *a = ids_a + (size_t)t * lda, *b = ids_b + (size_t)t * ldb;
        int common = 0;
        for (int i = 0; i < K; i++) /* K is small (top-k): a quadratic set intersection */
            for (int j = 0; j < K; j++)
                if (a[i] == b[j]) {
                    common++;
                    break;
                }
        r->sum_overlap += (double)common / K;
        r->differ += common != K;
        r->tokens++;
    }
}
