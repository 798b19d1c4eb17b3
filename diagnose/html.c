/*
** html.c — prl diagnose's HTML report: one self-contained page (inline CSS and SVG, no
** scripts, no external resources) with the op table and four plots: relative L2 per op in
** execution order (log scale, threshold line, the first divergent op in red), routing overlap
** per MoE layer, the |Δ log-prob| histogram, and the sweep's mean |Δ log-prob| per knob.
**
** The page is built in memory (open_memstream) and written atomically.
*/
#include "diagnose/diagnose.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Text with &, <, > and " escaped. */
static void esc(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A bar chart: n bars of values v (log10 scale between 10^lo and 10^hi when log_scale, else
** linear from 0 to hi), labels under the bars, bar i red when red[i], an optional dashed
** line at `line` (NAN: none). Values <= 0 on a log scale are drawn as a stub labelled 0. */
typedef struct chart {
    const char *title, *ylabel;
    int n;
    const double *v;
    const char *const *labels;
    const int *red;
    int log_scale;
    double lo, hi, line;
} chart;

static double chart_y(const chart *c, double v, double top, double h)
{
    double t;
    if (c->log_scale) t = v > 0 ? (log10(v) - c->lo) / (c->hi - c->lo) : 0;
    else t = c->hi > 0 ? v / c->hi : 0;
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    return top + h * (1 - t);
}

static void chart_svg(FILE *f, const chart *c)
{
    int bw = c->n > 40 ? 14 : 24, left = 70, top = 30, h = 220, bottom = 110;
    int width = left + c->n * bw + 20, height = top + h + bottom;
    fprintf(f, "<h3>");
    esc(f, c->title);
    fprintf(f,
            "</h3>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"10\">\n",
            width, height);
    /* axis and gridlines */
    int ticks = c->log_scale ? (int)(c->hi - c->lo) : 4;
    for (int i = 0; i <= ticks; i++) {
        double v = c->log_scale ? pow(10, c->lo + i) : c->hi * i / ticks;
        double y = chart_y(c, v, top, h);
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                left, y, width - 10, y, left - 4, y + 3, v);
    }
    fprintf(f, "<text x=\"12\" y=\"%d\" transform=\"rotate(-90 12 %d)\" text-anchor=\"middle\">",
            top + h / 2, top + h / 2);
    esc(f, c->ylabel);
    fprintf(f, "</text>\n");
    for (int i = 0; i < c->n; i++) {
        double v = c->v[i],
               y = chart_y(c, isfinite(v) ? v : (c->log_scale ? pow(10, c->hi) : c->hi), top, h);
        int x = left + i * bw;
        double bh = top + h - y < 1 ? 1 : top + h - y;
        fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"><title>",
                x + 2, top + h - bh, bw - 4, bh, c->red && c->red[i] ? "#d62728" : "#1f77b4");
        esc(f, c->labels[i]);
        fprintf(f, ": %.6g</title></rect>\n", v);
        fprintf(f, "<text x=\"%d\" y=\"%d\" transform=\"rotate(-60 %d %d)\" text-anchor=\"end\">",
                x + bw / 2, top + h + 10, x + bw / 2, top + h + 10);
        esc(f, c->labels[i]);
        fprintf(f, "</text>\n");
    }
    if (!isnan(c->line) && (!c->log_scale || c->line > 0)) {
        double y = chart_y(c, c->line, top, h);
        fprintf(f,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#d62728\" "
                "stroke-dasharray=\"4 3\"/>\n",
                left, y, width - 10, y);
    }
    fprintf(f, "</svg>\n");
}

/* Log-scale bounds (whole decades) covering the positive finite values and `extra`. */
static void log_bounds(const double *v, int n, double extra, double *lo, double *hi)
{
    double mn = INFINITY, mx = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > 0 && isfinite(v[i])) mn = v[i] < mn ? v[i] : mn, mx = v[i] > mx ? v[i] : mx;
    if (extra > 0) mn = extra < mn ? extra : mn, mx = extra > mx ? extra : mx;
    if (mx == 0) mn = 1e-8, mx = 1;
    *lo = floor(log10(mn)), *hi = ceil(log10(mx));
    if (*hi <= *lo) *hi = *lo + 1;
}

static void ops_chart(FILE *f, const prl_diag_report *r)
{
    int n = r->n_ops;
    double *v = calloc((size_t)n + 1, sizeof *v);
    const char **lb = calloc((size_t)n + 1, sizeof *lb);
    int *red = calloc((size_t)n + 1, sizeof *red);
    if (!v || !lb || !red) goto done;
    for (int i = 0; i < n; i++) {
        v[i] = r->ops[i].missing ? 0 : prl_diag_op_rel_l2(&r->ops[i]);
        lb[i] = r->ops[i].name;
        red[i] = i == r->first;
    }
    chart c = {
        .title =
            "Relative L2 per op, execution order (dashed: the threshold; red: first divergent)",
        .ylabel = "rel L2",
        .n = n,
        .v = v,
        .labels = lb,
        .red = red,
        .log_scale = 1,
        .line = r->threshold};
    log_bounds(v, n, r->threshold, &c.lo, &c.hi);
    chart_svg(f, &c);
done:
    free(v), free(lb), free(red);
}

static void routing_chart(FILE *f, const prl_diag_report *r)
{
    if (r->n_routing == 0) return;
    double v[PRL_MAX_LAYERS];
    char names[PRL_MAX_LAYERS][16];
    const char *lb[PRL_MAX_LAYERS];
    int n = r->n_routing < PRL_MAX_LAYERS ? r->n_routing : PRL_MAX_LAYERS;
    for (int i = 0; i < n; i++) {
        const prl_diag_routing *g = &r->routing[i];
        v[i] = g->tokens ? g->sum_overlap / g->tokens : 0;
        snprintf(names[i], sizeof names[i], "L%d", g->layer);
        lb[i] = names[i];
    }
    chart c = {.title = "Routing overlap per MoE layer (mean |I_train ∩ I_other| / K)",
               .ylabel = "overlap",
               .n = n,
               .v = v,
               .labels = lb,
               .hi = 1,
               .line = NAN};
    chart_svg(f, &c);
}

static void hist_chart(FILE *f, const prl_diag_logprob *lp)
{
    if (lp->n == 0) return;
    double v[PRL_DIAG_HIST_BINS], mx = 1;
    const char *lb[PRL_DIAG_HIST_BINS];
    for (int b = 0; b < PRL_DIAG_HIST_BINS; b++) {
        v[b] = (double)lp->hist[b], lb[b] = prl_diag_hist_label(b);
        mx = v[b] > mx ? v[b] : mx;
    }
    chart c = {.title = "Histogram of |lp_train − lp_other| over response tokens",
               .ylabel = "tokens",
               .n = PRL_DIAG_HIST_BINS,
               .v = v,
               .labels = lb,
               .hi = mx,
               .line = NAN};
    chart_svg(f, &c);
}

static void sweep_chart(FILE *f, const prl_diag_sweep *s)
{
    if (!s || s->n == 0) return;
    double v[32] = {0};
    char names[32][56]; /* knob (16) = value (32) */
    const char *lb[32];
    int n = s->n < 32 ? s->n : 32;
    for (int i = 0; i < n; i++) {
        v[i] = s->rows[i].mean_abs;
        snprintf(names[i], sizeof names[i], "%s%s%s", s->rows[i].knob,
                 s->rows[i].value[0] ? "=" : "", s->rows[i].value);
        lb[i] = names[i];
    }
    chart c = {.title = "Sweep: mean |Δ log-prob| with one knob switched from the baseline",
               .ylabel = "mean |d|",
               .n = n,
               .v = v,
               .labels = lb,
               .log_scale = 1,
               .line = v[0]};
    log_bounds(v, n, 0, &c.lo, &c.hi);
    chart_svg(f, &c);
}

static void ops_table(FILE *f, const prl_diag_report *r)
{
    fprintf(f, "<table><tr><th>#</th><th>op</th><th>elements</th><th>max |diff|</th><th>rel L2</th>"
               "<th>PCC</th></tr>\n");
    for (int i = 0; i < r->n_ops; i++) {
        const prl_diag_op *op = &r->ops[i];
        fprintf(f, "<tr%s><td>%d</td><td>", i == r->first ? " class=\"first\"" : "", i);
        esc(f, op->name);
        if (op->missing)
            fprintf(f, "</td><td colspan=\"4\">not in the other side's tensors</td></tr>\n");
        else
            fprintf(f, "</td><td>%zu</td><td>%.3e</td><td>%.3e</td><td>%.10f</td></tr>\n",
                    op->count, op->max_abs, prl_diag_op_rel_l2(op), prl_diag_op_pcc(op));
    }
    fprintf(f, "</table>\n");
}

static void sweep_table(FILE *f, const prl_diag_sweep *s)
{
    if (!s) return;
    fprintf(f, "<table><tr><th>knob</th><th>value</th><th>configuration</th><th>mean |d|</th>"
               "<th>max |d|</th><th>vs baseline</th><th>routes differ</th></tr>\n");
    for (int i = 0; i < s->n; i++) {
        const prl_diag_sweep_row *w = &s->rows[i];
        fprintf(f, "<tr><td>%s</td><td>%s</td><td>", w->knob, w->value);
        esc(f, w->config);
        fprintf(f, "</td><td>%.3e</td><td>%.3e</td><td>%+.3e</td><td>%.4f%%</td></tr>\n",
                w->mean_abs, w->max_abs, w->delta, 100 * w->route_differ);
    }
    fprintf(f, "</table>\n");
}

static void page(FILE *f, const prl_diag_report *r, const prl_diag_sweep *s)
{
    fprintf(f,
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>prl diagnose</title>\n"
            "<style>body{font-family:sans-serif;margin:2em;max-width:1400px}"
            "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;"
            "padding:2px 6px;text-align:right}td:nth-child(2){text-align:left}"
            "tr.first{background:#fdd}.fault{color:#d62728;font-weight:bold}</style></head><body>\n"
            "<h1>prl diagnose</h1>\n<p>Train path vs <b>");
    esc(f, r->other);
    fprintf(f, "</b>: %d sequences, %ld tokens, log-probs at temperature %g.</p>\n", r->n_seqs,
            r->n_tokens, r->temperature);
    if (r->fault[0]) {
        fprintf(f, "<p class=\"fault\">Test-only fault injected into the infer path at ");
        esc(f, r->fault);
        fprintf(f, ".</p>\n");
    }
    if (r->first >= 0) {
        fprintf(f, "<p>First divergent op (relative L2 &gt; %g): <b>", r->threshold);
        esc(f, r->ops[r->first].name);
        fprintf(f, "</b>, relative L2 %.3e.</p>\n", prl_diag_op_rel_l2(&r->ops[r->first]));
    } else {
        fprintf(f, "<p>No op diverges: relative L2 &le; %g everywhere.</p>\n", r->threshold);
    }
    if (r->lp.n)
        fprintf(
            f,
            "<p>Response tokens: %ld; mean |d| %.3e, max |d| %.3e (d = lp_train − lp_other).</p>\n",
            r->lp.n, r->lp.sum_abs / r->lp.n, r->lp.max_abs);
    ops_chart(f, r);
    routing_chart(f, r);
    hist_chart(f, &r->lp);
    sweep_chart(f, s);
    fprintf(f, "<h2>Ops</h2>\n");
    ops_table(f, r);
    if (s) fprintf(f, "<h2>Sweep</h2>\n");
    sweep_table(f, s);
    fprintf(f, "</body></html>\n");
}

prl_status prl_diag_write_html(const char *path, const prl_diag_report *r, const prl_diag_sweep *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return prl_error_set(PRL_ERR_NOMEM, "HTML report");
    page(f, r, s);
    if (fclose(f) != 0) {
        free(buf);
        return prl_error_set(PRL_ERR_NOMEM, "HTML report");
    }
    prl_status rc = prl_file_write_atomic(path, buf, len);
    free(buf);
    return rc;
}
