/*
** store.h — the one public header of prl's run database (`runs/NAME/run.db`, SQLite).
**
** run.db is the source of truth of a run: runs, policy versions, prompts (with the solved
** history behind the "drop always-solved prompts" rule), samples (token ids, infer log-probs,
** MoE routes, loss mask, reward and its breakdown, the version and worker that made them,
** timings, status), steps with their metrics, and events (faults, restarts, stale drops).
** The schema, the BLOB formats and example queries are in docs/store.md.
**
** One writer: the controller owns every write; a handle is used by one thread at a time.
** Readers (the `sqlite3` shell, eval, reports) may read concurrently: the database runs in
** WAL mode, so a reader sees the last committed transaction and never blocks the writer.
**
** Error model: functions return a prl_status (engine.h) and leave a message naming what is
** wrong (the key of a sample, the column of a corrupted row, both schema versions). A
** corrupted row is PRL_ERR_FORMAT, never a crash. Every write runs in a transaction: its own,
** or the caller's batch opened with prl_store_begin.
**
** Ownership: input structs are borrowed for the call; output structs own their strings and
** arrays and are released with the matching *_free (which accept NULL / zeroed structs).
*/
#ifndef PRL_STORE_H
#define PRL_STORE_H

#include "engine/engine.h"

#include <stddef.h>
#include <stdint.h>

/* The schema version this code writes (PRAGMA user_version). Opening a database with a
** lower version migrates it; a higher version is an error naming both. */
enum { PRL_STORE_SCHEMA_VERSION = 4 };

typedef struct prl_store prl_store; /* opaque handle: one SQLite connection + cached statements */

/* ---------------------------------------------------------------- handle ----------- */

/* Open (creating if missing) the database at path, set WAL, synchronous=FULL, foreign keys
** and a busy timeout, and migrate it to PRL_STORE_SCHEMA_VERSION. *db is NULL on error.
** Pair: prl_store_close. */
prl_status prl_store_open(const char *path, prl_store **db);
/* Open an existing database to read only (reports, the `sqlite3 -readonly` way): nothing is
** created, migrated or written (SQLite may add its -wal/-shm files beside it, as any reader
** of a WAL database). Missing or unreadable: PRL_ERR_IO; schema version 0 (not a run
** database): PRL_ERR_FORMAT; newer than this code's: PRL_ERR_UNSUPPORTED. Pair: prl_store_close. */
prl_status prl_store_open_readonly(const char *path, prl_store **db);
void prl_store_close(prl_store *db);
/* The schema version stored in the file (after open: PRL_STORE_SCHEMA_VERSION). */
prl_status prl_store_schema_version(prl_store *db, int *version);
/* Group many writes in one transaction (one fsync): begin … commit, or rollback on error.
** Calls nest; only the outermost commit makes the writes durable. */
prl_status prl_store_begin(prl_store *db);
prl_status prl_store_commit(prl_store *db);
prl_status prl_store_rollback(prl_store *db);
/* PRAGMA integrity_check: PRL_OK when it reports "ok", else PRL_ERR_FORMAT with its first line. */
prl_status prl_store_check(prl_store *db);

/* ---------------------------------------------------------------- runs ------------- */

typedef struct prl_store_run {
    int64_t id;         /* row id; the `run` of every other table */
    const char *name;   /* unique */
    const char *config; /* JSON object: the job config */
    uint64_t seed;
    double created;     /* unix seconds */
    const char *status; /* "running", "done", "failed", ... (free text) */
} prl_store_run;

/* Create a run (status "running"); *id gets its row id. An existing name is PRL_ERR_ARG. */
prl_status prl_store_run_create(prl_store *db, const char *name, const char *config_json,
                                uint64_t seed, int64_t *id);
/* Look a run up by name; out owns its strings (prl_store_run_free). Missing: PRL_ERR_RANGE. */
prl_status prl_store_run_get(prl_store *db, const char *name, prl_store_run *out);
/* The one run of a file (a run directory's run.db holds one), as prl_store_run_get; a file
** with no run or several is PRL_ERR_RANGE. */
prl_status prl_store_run_sole(prl_store *db, prl_store_run *out);
prl_status prl_store_run_set_status(prl_store *db, int64_t run, const char *status);
void prl_store_run_free(prl_store_run *r);

/* ---------------------------------------------------------------- versions --------- */

typedef struct prl_store_version {
    int64_t run, version;
    const char *path;     /* checkpoint directory */
    const char *checksum; /* as announced by the trainer */
    int64_t step;         /* the step whose update produced it (version 0: -1) */
    double created;
} prl_store_version;

/* Record a published policy version. Idempotent: the same (run, version) with the same
** path/checksum/step is a no-op; with different ones it is PRL_ERR_ARG naming the version. */
prl_status prl_store_version_add(prl_store *db, const prl_store_version *v);
/* The highest version of a run; out owns its strings. None yet: PRL_ERR_RANGE. */
prl_status prl_store_version_latest(prl_store *db, int64_t run, prl_store_version *out);
/* The highest version of a run below `version` (PRL_ERR_RANGE: none). */
prl_status prl_store_version_before(prl_store *db, int64_t run, int64_t version,
                                    prl_store_version *out);
/* Take a run back to policy version `version` in one transaction: the versions above it,
** the steps from step `version` on (step s made version s + 1) and the samples generated by
** a version above it are deleted; *samples gets how many samples went (may be NULL). For a
** resume whose newer checkpoints are unusable: those steps are done again. */
prl_status prl_store_run_back_to(prl_store *db, int64_t run, int64_t version, int64_t *samples);
void prl_store_version_free(prl_store_version *v);

/* ---------------------------------------------------------------- prompts ---------- */

typedef struct prl_store_prompt {
    int64_t run;
    const char *prompt_id; /* the task's "id" */
    const char *domain;    /* "reasoning", "general", "agent", "coding" */
    const char *split;     /* "train", "eval" */
    const char *task;      /* JSON object: the task line */
    int difficulty;
    /* history (read only; written by prl_store_prompt_record) */
    uint64_t solved_bits;   /* bit i: every sample solved it in epoch last_epoch - i */
    uint64_t unsolved_bits; /* bit i: no sample scored above 0 in epoch last_epoch - i */
    int64_t last_epoch;     /* -1: no epoch recorded */
    int retired;            /* removed from sampling by prl_store_prompts_retire */
    double teacher_kl;      /* OPD: teacher KL at the last taught visit (-1: none; written by
                            ** prl_store_prompt_set_teacher_kl) */
} prl_store_prompt;

/* A prompt's group in one epoch. */
typedef enum prl_store_outcome {
    PRL_STORE_MIXED = 0,   /* some samples solved it, or scored in between */
    PRL_STORE_SOLVED = 1,  /* every sample solved it (reward >= 1) */
    PRL_STORE_UNSOLVED = 2 /* no sample scored above 0 */
} prl_store_outcome;

/* Insert a prompt. Idempotent: identical domain/split/task/difficulty is a no-op; different
** content under the same (run, prompt_id) is PRL_ERR_ARG naming the prompt. */
prl_status prl_store_prompt_put(prl_store *db, const prl_store_prompt *p);
/* Read one prompt; out owns its strings (prl_store_prompt_free). Missing: PRL_ERR_RANGE. */
prl_status prl_store_prompt_get(prl_store *db, int64_t run, const char *prompt_id,
                                prl_store_prompt *out);
void prl_store_prompt_free(prl_store_prompt *p);
/* Record a prompt's outcome in `epoch` (>= 0). Epochs move forward: a skipped epoch counts as
** neither solved nor unsolved; re-recording the last epoch overwrites it; an older epoch is
** PRL_ERR_RANGE. The history keeps the last 64 epochs. */
prl_status prl_store_prompt_record(prl_store *db, int64_t run, const char *prompt_id, int64_t epoch,
                                   prl_store_outcome outcome);
/* Retire every active prompt of the run whose outcome was `which` (PRL_STORE_SOLVED or
** PRL_STORE_UNSOLVED) in each of the last n epochs ending at `epoch` (1 <= n <= 63);
** *retired (may be NULL) gets how many were retired now. */
prl_status prl_store_prompts_retire(prl_store *db, int64_t run, int64_t epoch, int n,
                                    prl_store_outcome which, int64_t *retired);
/* Record a prompt's teacher KL (opd.revisit: finite and >= 0, else PRL_ERR_ARG); a missing
** prompt is PRL_ERR_RANGE. */
prl_status prl_store_prompt_set_teacher_kl(prl_store *db, int64_t run, const char *prompt_id,
                                           double kl);
/* Number of prompts of a run in `split` (NULL: all) that are not retired. */
prl_status prl_store_prompt_count_active(prl_store *db, int64_t run, const char *split,
                                         int64_t *count);

/* ---------------------------------------------------------------- samples ---------- */

typedef enum prl_store_sample_status {
    PRL_STORE_SAMPLE_OK = 0,     /* used for training */
    PRL_STORE_SAMPLE_STALE = 1,  /* async mode: version lag above the bound; not trained */
    PRL_STORE_SAMPLE_DROPPED = 2 /* dropped for another reason (filtered group, bad result) */
} prl_store_sample_status;
const char *prl_store_sample_status_name(prl_store_sample_status s);

/* One generated response. Key: (run, step, prompt_id, sample_index). For a put every array is
** borrowed; from a get the struct owns them (prl_store_sample_free). */
typedef struct prl_store_sample {
    int64_t run, step;
    const char *prompt_id;
    int sample_index;
    /* tokens: prompt then response, n_tokens in all; logprobs: infer log-prob of each of the
    ** n_tokens - prompt_len response tokens */
    const int32_t *tokens;
    int n_tokens, prompt_len;
    const float *logprobs;
    /* compact routes (prl_routes_pack): [route_tokens][route_moe][route_k] ids of route_width
    ** bytes (1 or 2); NULL with all four shape fields 0 when routes were not captured */
    const uint8_t *routes;
    int route_tokens, route_moe, route_k, route_width;
    /* optional per response token, 0 or 1 (NULL: every response token trains) */
    const uint8_t *loss_mask;
    int64_t version;           /* policy version that generated it */
    const char *worker;        /* rollout worker id */
    double reward;             /* finite */
    const char *reward_detail; /* JSON object: score, penalty, checks (NULL: "{}") */
    unsigned flags;            /* prl_reward_flag bits */
    int stop;                  /* prl_stop_reason */
    double gen_seconds, reward_seconds;
    prl_store_sample_status status;
    double created; /* set by the store on insert (ignored by put) */
} prl_store_sample;

/* Insert a sample idempotently. A new key is inserted (*already = 0). A repeat whose content
** (tokens, prompt_len, logprobs, routes and shape, loss mask, version, reward, reward_detail,
** flags, stop) equals the stored row is a no-op (*already = 1): the first delivery's worker,
** timings, status and created time stay. A repeat with different content is PRL_ERR_ARG
** naming the key and the first differing field. Shapes are validated (PRL_ERR_ARG). already
** may be NULL. */
prl_status prl_store_sample_put(prl_store *db, const prl_store_sample *s, int *already);
/* Read one sample (out owns its arrays). Missing: PRL_ERR_RANGE naming the key; a corrupted
** row: PRL_ERR_FORMAT naming the key and the column. */
prl_status prl_store_sample_get(prl_store *db, int64_t run, int64_t step, const char *prompt_id,
                                int sample_index, prl_store_sample *out);
/* Change the status of a stored sample (e.g. ok → dropped); missing: PRL_ERR_RANGE. */
prl_status prl_store_sample_set_status(prl_store *db, int64_t run, int64_t step,
                                       const char *prompt_id, int sample_index,
                                       prl_store_sample_status status);
/* Every sample of a step with the given status (-1: any), ordered by (prompt_id,
** sample_index), into a malloc'd array *out of *n (prl_store_samples_free). */
prl_status prl_store_samples_for_step(prl_store *db, int64_t run, int64_t step, int status,
                                      prl_store_sample **out, size_t *n);
void prl_store_sample_free(prl_store_sample *s);
void prl_store_samples_free(prl_store_sample *a, size_t n);
/* The highest step of a run that has samples into *step (-1 when none). */
prl_status prl_store_sample_last_step(prl_store *db, int64_t run, int64_t *step);
/* Number of samples of a run in `step` (-1: every step) with `status` (-1: any). */
prl_status prl_store_sample_count(prl_store *db, int64_t run, int64_t step, int status,
                                  int64_t *count);

/* ---------------------------------------------------------------- steps, events ---- */

typedef struct prl_store_step {
    int64_t run, step;
    const char *metrics; /* JSON object: every metric of the step (rl.md §6 names) */
    double reward_mean, accuracy, tokens_per_s, step_seconds; /* hot columns */
} prl_store_step;

/* Record a finished step; writing the same step again replaces it (the last write wins: a
** resumed controller recomputes a step's metrics from the same samples). */
prl_status prl_store_step_put(prl_store *db, const prl_store_step *st);
/* The highest recorded step of a run into *step (-1 when none). */
prl_status prl_store_step_last(prl_store *db, int64_t run, int64_t *step);
/* A recorded step's metrics JSON text (malloc'd, caller frees); missing: PRL_ERR_RANGE. */
prl_status prl_store_step_metrics(prl_store *db, int64_t run, int64_t step, char **metrics);

/* Every recorded step of a run in step order into a malloc'd array *out of *n; each step owns
** its metrics text (prl_store_steps_free). */
prl_status prl_store_steps_list(prl_store *db, int64_t run, prl_store_step **out, size_t *n);
void prl_store_steps_free(prl_store_step *a, size_t n);

/* One event as read back. */
typedef struct prl_store_event {
    int64_t id;         /* order of arrival */
    double time;        /* unix seconds */
    const char *kind;   /* "fault", "restart", "eval", ... */
    const char *detail; /* JSON object text */
} prl_store_event;

/* Append an event: kind is short free text ("fault", "restart", "stale_drop", ...), detail a
** JSON object (NULL: "{}"); the time is now. */
prl_status prl_store_event_add(prl_store *db, int64_t run, const char *kind,
                               const char *detail_json);
/* Number of events of a run of `kind` (NULL: any). */
prl_status prl_store_event_count(prl_store *db, int64_t run, const char *kind, int64_t *count);
/* Every event of a run in order of arrival into a malloc'd array *out of *n; each owns its
** strings (prl_store_events_free). */
prl_status prl_store_events_list(prl_store *db, int64_t run, prl_store_event **out, size_t *n);
void prl_store_events_free(prl_store_event *a, size_t n);

/* ---------------------------------------------------------------- BLOB formats ----- */

/* Little-endian int32 / float32 arrays (docs/store.md). encode writes 4·n bytes to out;
** decode checks that `bytes` is exactly 4·n (else PRL_ERR_FORMAT naming `what`, the length
** and the expected count) before reading. */
void prl_store_i32_encode(uint8_t *out, const int32_t *v, size_t n);
void prl_store_f32_encode(uint8_t *out, const float *v, size_t n);
prl_status prl_store_i32_decode(int32_t *v, size_t n, const uint8_t *in, size_t bytes,
                                const char *what);
prl_status prl_store_f32_decode(float *v, size_t n, const uint8_t *in, size_t bytes,
                                const char *what);

#endif /* PRL_STORE_H */
