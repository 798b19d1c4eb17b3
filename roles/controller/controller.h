/*
** controller.h — the one public header of controller/: the run's coordinator process
** (docs/pipeline.md). It owns run.db (the only writer), chooses each step's prompts, leases
** rollout, scoring and training work to the worker processes over one ROUTER socket, takes
** the results idempotently by (run, step, prompt, sample), applies dynamic sampling, the
** version-lag bound and the retirement of always-solved prompts, records versions, samples,
** step metrics and events, and prints a progress line per step.
**
** Ownership: options and the job config are borrowed for the call.
*/
#ifndef PRL_CONTROLLER_H
#define PRL_CONTROLLER_H

#include "job/job.h"

#include <signal.h>
#include <stdio.h>

typedef struct prl_controller_options {
    const char *run_dir;  /* runs/NAME: holds run.db and ckpt/ */
    const char *endpoint; /* ROUTER bind endpoint (NULL: ipc://RUN_DIR/control.sock) */
    const prl_job_config *job;
    FILE *progress;                    /* one line per step (NULL: none) */
    const volatile sig_atomic_t *stop; /* set (e.g. by a signal handler) to stop after the current
                                 ** message; the run stays resumable */
    int *failed;                       /* out (may be NULL): set to 1 when a restart would fail the
                                 ** same way: a work item failed MAX_ATTEMPTS times (the run
                                 ** is marked failed), or the config differs from the one
                                 ** recorded in run.db (the run is left as it was) */
} prl_controller_options;

/* Run (or continue: a run.db that already holds the run resumes it) until controller.steps
** steps are trained, then tell every worker to stop. PRL_OK when the run finished or was
** stopped; errors name the cause (an unusable run.db, a config that differs from the
** recorded one, a socket that cannot bind). */
prl_status prl_controller_run(const prl_controller_options *o);

/* Mark the run in run_dir/run.db failed: status `failed` and a `failed` event {why}. For a
** fault found before the controller can run, that a restart cannot fix (a job.json that
** cannot be read). A directory without run.db is left as it is (PRL_ERR_IO). */
prl_status prl_controller_record_failure(const char *run_dir, const char *why);

/* The default control endpoint of a run directory, into out[n] (ipc:// paths are limited to
** 107 bytes: PRL_ERR_ARG names the path when it is too long). */
prl_status prl_controller_endpoint(const char *run_dir, const char *socket_name, char *out,
                                   size_t n);

#endif /* PRL_CONTROLLER_H */
