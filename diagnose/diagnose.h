/*
** diagnose.h — the one public header of diagnose/: where do the train path and another engine
** disagree on the same tokens (shared/spec/rl.md §6, "train/infer numeric-consistency
** diagnostics").
**
** The train path (engine/model.h) scores each sequence with its tensor hook set; the other
** side is either prl's infer path (engine/infer.h: prefill of the prompt, then the response
** teacher-forced one decode step at a time, as a rollout produced it) with its own hook, or
** tensors another engine dumped under the same hook names (one safetensors file per
** sequence, docs/diagnose.md). For every named op (L3.attn.q, L3.moe.out, final.logits, ...)
** in the train path's execution order it measures max |a − b|, ‖a − b‖₂ / (‖b‖₂ + 1e-12) and
** the Pearson correlation (a = train, b = the other side), names the first op whose relative
** L2 exceeds a threshold, and measures the routing overlap per MoE layer and the per-token
** log-prob differences d_t = lp_train − lp_other on the response tokens (histogram of |d_t|).
** A sweep switches the infer path's knobs one at a time and attributes the mean |d_t| to each.
**
** Errors are prl_status codes with a message naming the sequence (its label) and the fault.
** Ownership: sequences are borrowed; reports own their arrays (prl_diag_report_free,
** prl_diag_sweep_free). The model is used, not changed (its hook is set during a call and
** cleared after).
*/
#ifndef PRL_DIAGNOSE_H
#define PRL_DIAGNOSE_H

#include "engine/engine.h"

#include <jansson.h>
#include <stdio.h>

/* One token sequence to diagnose. */
typedef struct prl_diag_seq {
    const int32_t *tokens; /* [n], borrowed */
    int n;                 /* >= 2 */
    int prompt_len;        /* [1, n): prefilled on the infer path; log-probs compared after it */
    const char *label;     /* names the sequence in messages ("x.jsonl:3"), borrowed */
} prl_diag_seq;

/* Check every sequence against the model: length >= 2 and <= max_position_embeddings,
** prompt_len in [1, n), token ids in [0, vocab_size). Errors name the label and position. */
prl_status prl_diag_check_seqs(const prl_model *m, const prl_diag_seq *seqs, int n);

/* ---------------------------------------------------------------- statistics ------- */

/* Divergence of one named op over every compared element (a = train path, b = other side). */
typedef struct prl_diag_op {
    char name[64];        /* hook name: "L3.attn.out", "final.logits" */
    int layer;            /* -1 for final.logits */
    int missing;          /* the other side never produced this op (external dumps) */
    size_t count;         /* elements compared */
    size_t nonfinite;     /* elements where a or b is NaN/inf and they differ */
    double max_abs;       /* max |a − b| (inf when nonfinite > 0) */
    double ss_diff, ss_b; /* Σ (a − b)², Σ b² */
    double mean_a, mean_b, m2a, m2b, cab; /* running co-moments for the PCC */
} prl_diag_op;

/* ‖a − b‖₂ / (‖b‖₂ + 1e-12); the Pearson correlation (1 when a and b are identical, NaN when a
** side is constant and they differ). */
double prl_diag_op_rel_l2(const prl_diag_op *op);
double prl_diag_op_pcc(const prl_diag_op *op);
/* Accumulate n elements of a and b (merged with what the op already holds). */
void prl_diag_op_add(prl_diag_op *op, const float *a, const float *b, size_t n);

/* |d| histogram: bin 0 holds d = 0 exactly, bins 1..8 the decades (0, 1e-7], (1e-7, 1e-6],
** ..., (1e-1, 1], bin 9 |d| > 1 and non-finite values. */
enum { PRL_DIAG_HIST_BINS = 10 };
int prl_diag_hist_bin(double abs_d);
/* The bin's upper edge (0, 1e-7, ..., 1, inf) and a label ("0", "<=1e-07", ..., ">1"). */
double prl_diag_hist_edge(int bin);
const char *prl_diag_hist_label(int bin);

/* Per-token log-prob differences d = lp_train − lp_other. */
typedef struct prl_diag_logprob {
    long n; /* tokens compared */
    double sum_abs, max_abs, sum_d;
    prl_diag_op prob; /* co-moments of p_train = e^lp_train vs p_other (for the PCC) */
    long hist[PRL_DIAG_HIST_BINS];
} prl_diag_logprob;

void prl_diag_logprob_add(prl_diag_logprob *s, const float *lp_train, const float *lp_other, int n);

/* Routing overlap of one MoE layer: O = mean |I_train ∩ I_other| / K over tokens, and the share
** of tokens whose expert sets differ. */
typedef struct prl_diag_routing {
    int layer; /* model layer */
    long tokens;
    double sum_overlap;
    long differ;
} prl_diag_routing;

/* Add `tokens` tokens: ids_a/ids_b are [tokens][K] expert ids, at row strides lda/ldb. */
void prl_diag_routing_add(prl_diag_routing *r, const int32_t *ids_a, size_t lda,
                          const int32_t *ids_b, size_t ldb, int tokens, int K);

/* ---------------------------------------------------------------- one comparison --- */

typedef struct prl_diag_report {
    char other[160];    /* what the train path was compared with */
    double threshold;   /* relative L2 above which an op diverges */
    double temperature; /* log-probs of softmax(logits / temperature) */
    int n_seqs;
    long n_tokens; /* tokens in all sequences */
    int n_ops;
    prl_diag_op *ops; /* in the train path's execution order */
    int first;        /* index into ops of the first divergent op, -1 when none */
    int n_routing;    /* 0 when the other side has no routes */
    prl_diag_routing *routing;
    prl_diag_logprob lp;
    char fault[64]; /* the infer path's test-only fault, "" when none */
} prl_diag_report;

void prl_diag_report_free(prl_diag_report *r);

/* The train path vs prl's infer path with options `io` (io->max_batch sequences decode
** together) and `threads` pool threads (0 = as it is). temperature > 0. */
prl_status prl_diag_compare_infer(prl_model *m, const prl_infer_options *io, int threads,
                                  const prl_diag_seq *seqs, int n, double threshold,
                                  double temperature, prl_diag_report *out);

/* The train path vs an external dump: DIR/seq-<i>.safetensors for sequence i (0-based), each
** with `tokens` (I32 [n], must equal the sequence) and hook tensors [n, cols] (F32, F64, F16
** or BF16), optionally `L<l>.moe.routes` (I32 [n, K]) for the routing overlap. Log-probs
** come from the dump's final.logits. A hook tensor the dump lacks is reported missing; a
** dump without any hook tensor, a missing file, other tokens or a wrong shape are errors. */
prl_status prl_diag_compare_external(prl_model *m, const char *dir, const prl_diag_seq *seqs, int n,
                                     double threshold, double temperature, prl_diag_report *out);

/* ---------------------------------------------------------------- sweep ------------ */

typedef struct prl_diag_sweep_row {
    char knob[16]; /* "baseline", "precision", "mla", "matmul", "batch", "threads" */
    char value[32];
    char config[160]; /* the whole infer configuration of the run */
    double mean_abs;  /* mean |lp_train − lp_infer| over response tokens */
    double max_abs;
    double route_differ; /* share of (token, MoE layer) pairs with another expert set */
    double delta;        /* mean_abs − the baseline's: the mismatch this knob adds (or removes) */
} prl_diag_sweep_row;

typedef struct prl_diag_sweep {
    int n; /* rows[0] is the baseline */
    prl_diag_sweep_row *rows;
} prl_diag_sweep;

/* From the baseline (io, threads), switch one knob at a time — precision (fp32, bf16, fp16),
** MLA form (absorbed, naive), matmul (gemm, gemv, blas), batch (io->max_batch vs 1, or 1 vs
** min(n, 8)), threads (the baseline's vs 1, or 1 vs 2) — and measure each run's log-prob
** mismatch against the train path (computed once). The pool is left at `threads`. */
prl_status prl_diag_sweep_run(prl_model *m, const prl_infer_options *io, int threads,
                              const prl_diag_seq *seqs, int n, double temperature,
                              prl_diag_sweep *out);
void prl_diag_sweep_free(prl_diag_sweep *s);

/* ---------------------------------------------------------------- output ----------- */

/* The report (and the sweep, may be NULL) as JSON, schema "prl.diagnose/1" (docs/diagnose.md).
** Returns a new reference. */
json_t *prl_diag_to_json(const prl_diag_report *r, const prl_diag_sweep *s);
/* Human-readable tables: ops, the first divergent op, routing, the |d| histogram, the sweep. */
void prl_diag_print(FILE *out, const prl_diag_report *r, const prl_diag_sweep *s);
/* A self-contained HTML page (inline SVG plots, no external resources) written atomically. */
prl_status prl_diag_write_html(const char *path, const prl_diag_report *r, const prl_diag_sweep *s);

#endif /* PRL_DIAGNOSE_H */
