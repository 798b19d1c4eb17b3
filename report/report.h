/*
** report.h — the one public header of report/: `prl report`, one self-contained HTML page of a
** run that opens offline (docs/report.md).
**
** A run directory is either a GRPO or OPD run (`runs/NAME/run.db`, the source of truth: every
** step's metrics, the events, the samples) or an SFT run (a recipe's run.dir or any folder
** holding the `metrics.jsonl` of `prl sft --metrics`, and no run.db). The report reads it
** (run.db through a read-only handle: nothing in the run directory is written), gathers one
** JSON document — the run, its steps' metrics, its events and a bounded sample of each
** step's samples with their tokens decoded by the run's tokenizer — and writes a page that
** inlines that document, the vendored plotting library (uPlot, with its licence) and the
** page's own script, which draws the curves with uPlot and builds the events table and the
** sample browser.
**
** Errors are prl_status codes with a message naming the file and what is wrong. The output
** is written atomically (a temporary beside it, then a rename); checking that it is new is
** the caller's (cli_require_new), before any work.
*/
#ifndef PRL_REPORT_H
#define PRL_REPORT_H

#include "engine/engine.h"

#include <jansson.h>

typedef struct prl_report_options {
    int samples_per_step; /* sample browser: at most this many samples of each step (>= 0) */
} prl_report_options;

/* The default options: 16 samples per step. */
prl_report_options prl_report_defaults(void);

/* The JSON document of the run directory `dir` (caller owns it, json_decref):
**   {"run": {"dir", "name", "kind": "grpo"|"opd"|"sft", "status", "created", "config",
**            "tokenizer", "samples_total", "samples_shown"},
**    "steps": [{"step": S, ...the step's metrics}, ...] (in step order),
**    "events": [{"id", "time", "kind", "detail"}, ...],
**    "samples": [{"step", "prompt_id", "sample_index", "version", "reward", "status",
**                 "stop", "detail", "prompt", "tokens": [text...], "ids": [...],
**                 "logprobs": [...], "mask": [...]}, ...]}
** A directory with neither run.db nor metrics.jsonl is PRL_ERR_IO naming both. */
prl_status prl_report_gather(const char *dir, const prl_report_options *o, json_t **doc);

/* The HTML page of a document from prl_report_gather, written atomically to `path`. */
prl_status prl_report_write_page(const char *path, const json_t *doc);

#endif /* PRL_REPORT_H */
