/*
** infer_quant.c — SmoothQuant for the W8A8 infer path (docs/w8a8.md): calibration
** (prompts prefilled with every linear in fp32, each INT8 linear's inputs recorded), the
** per-linear search of the migration strength α by output MSE against fp32, and the table of
** smoothing factors an engine applies at start-up (prl_infer_options.smooth).
*/
#include "engine/infer_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct prl_w8a8_smooth {
    int n;        /* INT8 linears, in infer__q8_linears order */
    int *in;      /* [n] their input widths (checked against the engine) */
    float **s;    /* [n] factors [in], NULL = not smoothed */
    float *alpha; /* [n] the α chosen (-1: none) */
};

static const float alphas[5] = {0, 0.25f, 0.5f, 0.75f, 1};

/* Append L to out (when not NULL); returns the new count. */
static int add_q8(lin **out, int n, lin *L)
{
    if (out) out[n] = L;
    return n + 1;
}

int infer__q8_linears(prl_infer *e, lin **out)
{
    int n = 0;
    for (int l = 0; l < e->L + e->Lm; l++) {
        layer_w *w = &e->lw[l];
        n = add_q8(out, n, &w->wq_b); /* every linear W8A8 may hold in INT8, whatever the mask */
        n = add_q8(out, n, &w->wo);
        if (w->moe < 0) {
            n = add_q8(out, n, &w->w13);
            n = add_q8(out, n, &w->w2);
        }
        for (int x = 0; w->moe >= 0 && x < e->E; x++) {
            n = add_q8(out, n, &w->e13[x]);
            n = add_q8(out, n, &w->e2[x]);
        }
    }
    return n;
}

void infer__calib_record(const lin *L, const float *x, int R)
{
    lin_calib *c = L->cal;
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * L->in;
        for (int j = 0; j < L->in; j++) c->amax[j] = fmaxf(c->amax[j], fabsf(xr[j]));
        if (c->n < CALIB_ROWS)
            memcpy(c->rows + (size_t)c->n++ * L->in, xr, (size_t)L->in * sizeof *xr);
    }
}

/* Output MSE of L quantized with factors s (NULL: none) against the fp32 outputs ref on the
** recorded rows. */
static double q8_mse(const lin *L, const float *s, const float *ref, prl_status *rc)
{
    const lin_calib *c = L->cal;
    prl_q8w q;
    if ((*rc = prl_q8w_init(&q, L->w, L->in, L->out, L->in, s))) return INFINITY;
    int8_t *xq = malloc((size_t)c->n * q.ld);
    float *xs = malloc((size_t)c->n * sizeof *xs), *y = malloc((size_t)c->n * L->out * sizeof *y);
    double se = INFINITY;
    if (xq && xs && y) {
        prl_q8_quantize_rows(xq, xs, c->rows, L->in, c->n, L->in, q.ld, q.inv_s);
        prl_q8_linear_block(y, L->out, xq, xs, c->n, &q, 0, L->out);
        se = 0;
        for (size_t i = 0; i < (size_t)c->n * L->out; i++)
            se += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
        se /= (double)c->n * L->out;
    } else {
        *rc = prl_error_set(PRL_ERR_NOMEM, "SmoothQuant search");
    }
    prl_q8w_free(&q);
    free(xq), free(xs), free(y);
    return se;
}

/* s_j = max|X_j|^α / max|W_j|^(1−α); a channel never active or with zero weights keeps 1. */
static void smooth_factors(float *s, const lin *L, float alpha)
{
    for (int j = 0; j < L->in; j++) {
        float aw = 0, ax = L->cal->amax[j];
        for (int o = 0; o < L->out; o++) aw = fmaxf(aw, fabsf(L->w[(size_t)o * L->in + j]));
        double v = ax > 0 && aw > 0 ? pow(ax, alpha) / pow(aw, 1 - alpha) : 1;
        s[j] = (float)(v < 1e-6 ? 1e-6 : v > 1e6 ? 1e6 : v);
    }
}

/* The best of no smoothing and the five α for L, into table entry i. */
static prl_status search_one(const lin *L, prl_w8a8_smooth *t, int i, prl_w8a8_calib *rep)
{
    prl_status rc = PRL_OK;
    t->in[i] = L->in, t->alpha[i] = -1;
    if (!L->cal || L->cal->n == 0) return PRL_OK; /* not INT8 here, or never reached */
    float *ref = malloc((size_t)L->cal->n * L->out * sizeof *ref);
    float *s = malloc((size_t)L->in * sizeof *s), *best = malloc((size_t)L->in * sizeof *best);
    if (!ref || !s || !best) rc = prl_error_set(PRL_ERR_NOMEM, "SmoothQuant search");
    if (!rc) infer__linear_f32_dots(ref, L->cal->rows, L->cal->n, L);
    double plain = rc ? 0 : q8_mse(L, NULL, ref, &rc), low = plain;
    int pick = -1;
    for (int a = 0; a < 5 && !rc; a++) {
        smooth_factors(s, L, alphas[a]);
        double mse = q8_mse(L, s, ref, &rc);
        if (mse < low) low = mse, pick = a, memcpy(best, s, (size_t)L->in * sizeof *s);
    }
    if (!rc) {
        rep->linears++, rep->mse_plain += plain, rep->mse_smooth += low;
        if (pick >= 0) {
            rep->smoothed++, rep->alpha_count[pick]++;
            t->s[i] = best, t->alpha[i] = alphas[pick], best = NULL;
        }
    }
    free(ref), free(s), free(best);
    return rc;
}

void prl_w8a8_smooth_free(prl_w8a8_smooth *t)
{
    if (!t) return;
    for (int i = 0; t->s && i < t->n; i++) free(t->s[i]);
    free(t->s), free(t->in), free(t->alpha), free(t);
}

/* Calibration buffers for every INT8 linear of e (freed by calib_end). */
static prl_status calib_begin(lin **ls, int n)
{
    for (int i = 0; i < n; i++) {
        if (ls[i]->kind != LIN_Q8) continue;
        lin_calib *c = calloc(1, sizeof *c);
        if (c) c->amax = calloc((size_t)ls[i]->in, sizeof *c->amax);
        if (c) c->rows = malloc((size_t)CALIB_ROWS * ls[i]->in * sizeof *c->rows);
        ls[i]->cal = c;
        if (!c || !c->amax || !c->rows) return prl_error_set(PRL_ERR_NOMEM, "calibration");
    }
    return PRL_OK;
}

static void calib_end(lin **ls, int n)
{
    for (int i = 0; ls && i < n; i++) { /* entries are NULL when the table was never filled */
        if (!ls[i] || !ls[i]->cal) continue;
        free(ls[i]->cal->amax), free(ls[i]->cal->rows), free(ls[i]->cal);
        ls[i]->cal = NULL;
    }
}

prl_status prl_w8a8_calibrate(prl_w8a8_smooth **out, const prl_model *m, const prl_infer_options *o,
                              const prl_gen_request *prompts, int n, prl_w8a8_calib *report)
{
    *out = NULL;
    memset(report, 0, sizeof *report);
    if (!o->w8a8) return prl_error_set(PRL_ERR_ARG, "calibration needs a w8a8 configuration");
    if (n < 1) return prl_error_set(PRL_ERR_ARG, "calibration needs at least one prompt");
    prl_infer_options co = *o;
    co.smooth = NULL, co.spec_drafts = 0;
    prl_infer *e = NULL;
    prl_status rc = prl_infer_init(&e, m, &co);
    if (rc) return rc;
    int nl = infer__q8_linears(e, NULL);
    lin **ls = calloc((size_t)nl + 1, sizeof *ls);
    prl_w8a8_smooth *t = calloc(1, sizeof *t);
    if (t) {
        t->n = nl;
        t->in = calloc((size_t)nl + 1, sizeof *t->in);
        t->s = calloc((size_t)nl + 1, sizeof *t->s);
        t->alpha = calloc((size_t)nl + 1, sizeof *t->alpha);
    }
    if (!ls || !t || !t->in || !t->s || !t->alpha) rc = prl_error_set(PRL_ERR_NOMEM, "calibration");
    if (!rc) infer__q8_linears(e, ls), rc = calib_begin(ls, nl);
    prl_gen_result *res = rc ? NULL : calloc((size_t)n, sizeof *res);
    if (!rc && !res) rc = prl_error_set(PRL_ERR_NOMEM, "calibration");
    if (!rc) { /* the prefill of each prompt is what records; one greedy token ends it */
        prl_sample_params sp;
        prl_sample_params_default(&sp);
        sp.max_new_tokens = 1, sp.n_stop_ids = 0;
        e->calibrating = 1;
        rc = prl_infer_generate(e, prompts, n, &sp, res, NULL, NULL);
        e->calibrating = 0;
        for (int i = 0; i < n; i++) prl_gen_result_free(&res[i]);
    }
    for (int i = 0; !rc && i < nl; i++) rc = search_one(ls[i], t, i, report);
    calib_end(ls, nl);
    free(ls), free(res);
    prl_infer_free(e);
    if (rc) {
        prl_w8a8_smooth_free(t);
        return prl_error_wrap(rc, "W8A8 calibration: ");
    }
    *out = t;
    return PRL_OK;
}

prl_status infer__apply_smooth(prl_infer *e, const prl_w8a8_smooth *t)
{
    int nl = infer__q8_linears(e, NULL);
    if (nl != t->n)
        return prl_error_set(PRL_ERR_ARG,
                             "SmoothQuant table has %d INT8 linears, this engine %d (calibrated "
                             "for another model or w8a8 mask)",
                             t->n, nl);
    lin **ls = calloc((size_t)nl + 1, sizeof *ls);
    if (!ls) return prl_error_set(PRL_ERR_NOMEM, "SmoothQuant factors");
    infer__q8_linears(e, ls);
    prl_status rc = PRL_OK;
    for (int i = 0; i < nl && !rc; i++)
        if (ls[i]->in != t->in[i])
            rc = prl_error_set(PRL_ERR_ARG, "SmoothQuant table: linear %d has %d inputs, not %d", i,
                               ls[i]->in, t->in[i]);
    for (int i = 0; i < nl && !rc; i++) {
        lin *L = ls[i];
        if (L->kind != LIN_Q8) continue; /* this engine's mask keeps it in fp32 */
        free(L->smooth);
        L->smooth = NULL, L->alpha = t->alpha[i];
        if (t->s[i]) {
            L->smooth = malloc((size_t)L->in * sizeof *L->smooth);
            if (!L->smooth) rc = prl_error_set(PRL_ERR_NOMEM, "SmoothQuant factors");
            else memcpy(L->smooth, t->s[i], (size_t)L->in * sizeof *L->smooth);
        }
        prl_q8w_free(&L->q8);
        if (!rc) rc = prl_q8w_init(&L->q8, L->w, L->in, L->out, L->in, L->smooth);
    }
    free(ls);
    return rc;
}
