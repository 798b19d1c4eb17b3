/*
** report_int.h — internals shared by report/'s sources: the sample browser's reader
** (samples.c) used by the gatherer (data.c). Not a public header.
*/
#ifndef PRL_REPORT_INT_H
#define PRL_REPORT_INT_H

#include "report/report.h"
#include "store/store.h"

/* Append to `out` (a JSON array) at most o->samples_per_step samples of each step of
** steps[0..n) (in (prompt_id, sample_index) order), with their tokens decoded by the run's
** tokenizer when one is found (runobj gets "tokenizer": its path or null), and set
** runobj's "samples_total" and "samples_shown". */
prl_status report_samples(prl_store *db, int64_t run, const prl_store_step *steps, size_t n,
                          const char *dir, const prl_report_options *o, json_t *runobj,
                          json_t *out);

#endif /* PRL_REPORT_INT_H */
