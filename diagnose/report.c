/*
** report.c — prl diagnose's output: the JSON document (schema "prl.diagnose/1", described in
** docs/diagnose.md) and the human-readable tables. The HTML page is html.c.
**
** Non-finite numbers (an fp16 overflow, a NaN) have no JSON form: they are written as null
** and the op's "nonfinite" count says why.
*/
#include "diagnose/diagnose.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ JSON ------------ */

static json_t *num(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* "attn.q" of "L3.attn.q"; the whole name for model-level ops. */
static const char *op_part(const prl_diag_op *op)
{
    const char *dot = op->layer >= 0 ? strchr(op->name, '.') : NULL;
    return dot ? dot + 1 : op->name;
}

static json_t *op_json(const prl_diag_op *op, int index, double threshold)
{
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(index));
    json_object_set_new(o, "name", json_string(op->name));
    json_object_set_new(o, "layer", op->layer >= 0 ? json_integer(op->layer) : json_null());
    json_object_set_new(o, "op", json_string(op_part(op)));
    json_object_set_new(o, "missing", json_boolean(op->missing));
    json_object_set_new(o, "elements", json_integer((json_int_t)op->count));
    json_object_set_new(o, "nonfinite", json_integer((json_int_t)op->nonfinite));
    if (op->missing) return o;
    double rel = prl_diag_op_rel_l2(op);
    json_object_set_new(o, "max_abs", num(op->max_abs));
    json_object_set_new(o, "rel_l2", num(rel));
    json_object_set_new(o, "pcc", num(prl_diag_op_pcc(op)));
    json_object_set_new(o, "diverges", json_boolean(!(rel <= threshold)));
    return o;
}

static json_t *logprob_json(const prl_diag_logprob *lp)
{
    json_t *o = json_object(), *h = json_array();
    json_object_set_new(o, "tokens", json_integer(lp->n));
    json_object_set_new(o, "mean_abs", lp->n ? num(lp->sum_abs / lp->n) : json_null());
    json_object_set_new(o, "max_abs", lp->n ? num(lp->max_abs) : json_null());
    json_object_set_new(o, "mean_diff", lp->n ? num(lp->sum_d / lp->n) : json_null());
    json_object_set_new(o, "pcc_prob", lp->n ? num(prl_diag_op_pcc(&lp->prob)) : json_null());
    for (int b = 0; b < PRL_DIAG_HIST_BINS; b++) {
        json_t *e = json_object();
        json_object_set_new(e, "bin", json_string(prl_diag_hist_label(b)));
        json_object_set_new(e, "upper", num(prl_diag_hist_edge(b)));
        json_object_set_new(e, "count", json_integer(lp->hist[b]));
        json_array_append_new(h, e);
    }
    json_object_set_new(o, "histogram", h);
    return o;
}

static json_t *routing_json(const prl_diag_report *r)
{
    json_t *a = json_array();
    for (int i = 0; i < r->n_routing; i++) {
        const prl_diag_routing *g = &r->routing[i];
        json_t *o = json_object();
        json_object_set_new(o, "layer", json_integer(g->layer));
        json_object_set_new(o, "tokens", json_integer(g->tokens));
        json_object_set_new(o, "overlap",
                            g->tokens ? num(g->sum_overlap / g->tokens) : json_null());
        json_object_set_new(o, "disagree",
                            g->tokens ? num((double)g->differ / g->tokens) : json_null());
        json_array_append_new(a, o);
    }
    return a;
}

static json_t *sweep_json(const prl_diag_sweep *s)
{
    json_t *o = json_object(), *rows = json_array();
    json_object_set_new(o, "baseline", json_string(s->n ? s->rows[0].config : ""));
    for (int i = 0; i < s->n; i++) {
        const prl_diag_sweep_row *w = &s->rows[i];
        json_t *e = json_object();
        json_object_set_new(e, "knob", json_string(w->knob));
        json_object_set_new(e, "value", json_string(w->value));
        json_object_set_new(e, "config", json_string(w->config));
        json_object_set_new(e, "mean_abs", num(w->mean_abs));
        json_object_set_new(e, "max_abs", num(w->max_abs));
        json_object_set_new(e, "delta", num(w->delta));
        json_object_set_new(e, "route_differ", num(w->route_differ));
        json_array_append_new(rows, e);
    }
    json_object_set_new(o, "rows", rows);
    return o;
}

json_t *prl_diag_to_json(const prl_diag_report *r, const prl_diag_sweep *s)
{
    json_t *o = json_object(), *ops = json_array();
    json_object_set_new(o, "schema", json_string("prl.diagnose/1"));
    json_object_set_new(o, "other", json_string(r->other));
    json_object_set_new(o, "fault", r->fault[0] ? json_string(r->fault) : json_null());
    json_object_set_new(o, "threshold", num(r->threshold));
    json_object_set_new(o, "temperature", num(r->temperature));
    json_object_set_new(o, "sequences", json_integer(r->n_seqs));
    json_object_set_new(o, "tokens", json_integer(r->n_tokens));
    for (int i = 0; i < r->n_ops; i++)
        json_array_append_new(ops, op_json(&r->ops[i], i, r->threshold));
    json_object_set_new(o, "ops", ops);
    json_object_set_new(o, "first_divergent",
                        r->first >= 0 ? op_json(&r->ops[r->first], r->first, r->threshold)
                                      : json_null());
    json_object_set_new(o, "routing", routing_json(r));
    json_object_set_new(o, "logprob", logprob_json(&r->lp));
    json_object_set_new(o, "sweep", s ? sweep_json(s) : json_null());
    return o;
}

/* ------------------------------------------------------------------ text ------------ */

static void print_ops(FILE *out, const prl_diag_report *r)
{
    fprintf(out, "\n%-24s %12s %12s %12s %14s\n", "op (execution order)", "elements", "max|diff|",
            "rel L2", "PCC");
    for (int i = 0; i < r->n_ops; i++) {
        const prl_diag_op *op = &r->ops[i];
        if (op->missing) {
            fprintf(out, "%-24s %12s   (not in the other side's tensors)\n", op->name, "-");
            continue;
        }
        fprintf(out, "%-24s %12zu %12.3e %12.3e %14.10f%s%s\n", op->name, op->count, op->max_abs,
                prl_diag_op_rel_l2(op), prl_diag_op_pcc(op), op->nonfinite ? "  non-finite" : "",
                i == r->first ? "  <- first divergent" : "");
    }
    if (r->first >= 0) {
        const prl_diag_op *op = &r->ops[r->first];
        fprintf(out,
                "\nfirst divergent op (rel L2 > %g): %s (layer %d, op %s): max|diff| %.3e, "
                "rel L2 %.3e\n",
                r->threshold, op->name, op->layer, op_part(op), op->max_abs,
                prl_diag_op_rel_l2(op));
    } else {
        fprintf(out, "\nno op diverges: rel L2 <= %g everywhere\n", r->threshold);
    }
}

static void print_routing(FILE *out, const prl_diag_report *r)
{
    if (r->n_routing == 0) {
        fprintf(out, "\nrouting overlap: the other side has no routes\n");
        return;
    }
    fprintf(out, "\nrouting overlap per MoE layer\n%-8s %10s %10s %12s\n", "layer", "tokens",
            "overlap", "sets differ");
    for (int i = 0; i < r->n_routing; i++) {
        const prl_diag_routing *g = &r->routing[i];
        if (!g->tokens) {
            fprintf(out, "%-8d %10s\n", g->layer, "-");
            continue;
        }
        fprintf(out, "%-8d %10ld %10.6f %11.4f%%\n", g->layer, g->tokens,
                g->sum_overlap / g->tokens, 100.0 * g->differ / g->tokens);
    }
}

static void print_logprob(FILE *out, const prl_diag_logprob *lp)
{
    if (lp->n == 0) {
        fprintf(out, "\nlog-probs: none compared (the other side has no final.logits)\n");
        return;
    }
    fprintf(out,
            "\nlog-prob difference d = lp_train - lp_other over %ld response tokens\n"
            "mean|d| %.3e   max|d| %.3e   mean d %.3e   PCC(prob) %.10f\n",
            lp->n, lp->sum_abs / lp->n, lp->max_abs, lp->sum_d / lp->n, prl_diag_op_pcc(&lp->prob));
    long mx = 1;
    for (int b = 0; b < PRL_DIAG_HIST_BINS; b++) mx = lp->hist[b] > mx ? lp->hist[b] : mx;
    fprintf(out, "%-8s %8s\n", "|d|", "tokens");
    for (int b = 0; b < PRL_DIAG_HIST_BINS; b++) {
        int bar = (int)((40 * lp->hist[b] + mx - 1) / mx);
        fprintf(out, "%-8s %8ld %.*s\n", prl_diag_hist_label(b), lp->hist[b], bar,
                "########################################");
    }
}

static void print_sweep(FILE *out, const prl_diag_sweep *s)
{
    fprintf(out,
            "\nsweep: one knob at a time from the baseline (%s)\n%-10s %-9s %12s %12s %13s %13s\n",
            s->n ? s->rows[0].config : "", "knob", "value", "mean|d|", "max|d|", "vs baseline",
            "routes differ");
    for (int i = 0; i < s->n; i++) {
        const prl_diag_sweep_row *w = &s->rows[i];
        fprintf(out, "%-10s %-9s %12.3e %12.3e %+13.3e %12.4f%%\n", w->knob, w->value, w->mean_abs,
                w->max_abs, w->delta, 100 * w->route_differ);
    }
}

void prl_diag_print(FILE *out, const prl_diag_report *r, const prl_diag_sweep *s)
{
    fprintf(out, "train path vs %s\n%d sequences, %ld tokens, log-probs at temperature %g\n",
            r->other, r->n_seqs, r->n_tokens, r->temperature);
    if (r->fault[0]) fprintf(out, "TEST-ONLY FAULT injected into the infer path at %s\n", r->fault);
    print_ops(out, r);
    print_routing(out, r);
    print_logprob(out, &r->lp);
    if (s) print_sweep(out, s);
}
