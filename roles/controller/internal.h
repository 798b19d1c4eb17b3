/*
** internal.h — what the pieces of the controller share (not part of the public API): its
** state (workers, leases, the steps in flight with their groups and samples) and the
** functions of each file (controller.c lists them). One thread owns all of it.
*/
#ifndef PRL_CONTROLLER_INTERNAL_H
#define PRL_CONTROLLER_INTERNAL_H

#include "roles/controller/controller.h"

#include "bus/bus.h"
#include "roles/msg/msg.h"
#include "grpo/grpo.h"
#include "opd/opd.h"
#include "reward/reward.h"
#include "store/store.h"
#include "tasks/tasks.h"

enum {
    MAX_WORKERS = 256,
    MAX_INFLIGHT = 8,
    CANDIDATE_FACTOR = 4,
    MAX_ATTEMPTS = 4, /* failed attempts of one work item before it is given up */
    CTL_SERVED = 4,   /* versions whose files remote.c remembers */
    CTL_FAULTS = 4    /* PRL_WEIGHTS_FAULT entries */
};

typedef struct worker {
    char name[64], role[16];
    prl_bus_peer peer;
    double seen;    /* last message or heartbeat */
    uint64_t lease; /* the newest lease held (0: none) */
    int slots;      /* leases it takes at once (hello's `slots`: a gateway's groups; else 1) */
    int held;       /* leases it holds */
    int holds;      /* teacher: 1 + the teacher index last leased to it (0: none) */
} worker;

typedef enum lease_kind {
    LEASE_ROLLOUT = 1,
    LEASE_SCORE = 2,
    LEASE_TRAIN = 3,
    LEASE_TEACH = 4 /* group = the teacher index */
} lease_kind;

typedef struct lease {
    uint64_t id;
    lease_kind kind;
    int64_t step;
    int group, sample; /* the group (rollout, score) and sample (score) */
    int worker;
    double started;
} lease;

typedef struct slot { /* one sample */
    int state;        /* 0 waiting for rollout, 1 generated, 2 scored */
    uint64_t score_lease;
    int32_t *tokens;
    int n, prompt_len;
    float *logprobs; /* [n - prompt_len] */
    uint8_t *mask;   /* [n - prompt_len] */
    uint8_t *routes;
    size_t routes_bytes;
    prl_route_shape route_shape;
    char *turns; /* JSON array of the model's turns */
    int64_t version;
    char worker[64];
    double gen_s, score_s;
    int stop;
    double reward;
    char *detail;
    unsigned flags;
    int failures;      /* scoring attempts that ended in an error */
    int rejected;      /* answers to its score lease the controller rejected */
    int truncated;     /* the episode's last turn was cut off (the verifier pays nothing) */
    float *teacher_lp; /* OPD: [n - prompt_len] the teacher's log-probs (NULL: not taught) */
    int32_t *topk_ids; /* OPD with opd.topk K: [(n - prompt_len) × K] the teacher's top-k */
    float *topk_lp;    /* and their log-probs (NULL without) */
} slot;

typedef struct group {
    int prompt;     /* index into the train tasks */
    int64_t epoch;  /* the epoch its solved record counts for */
    uint64_t lease; /* rollout lease (0: queued or done) */
    int generated, scored;
    int verdict;  /* 0 pending, 1 trained on, -1 dropped (equal rewards) */
    int failures; /* rollout attempts that ended in an error */
    int rejected; /* results of its rollout the controller rejected */
    int teacher;  /* OPD: the teacher index of the prompt's domain (-1: none) */
    int revisit;  /* OPD: drawn again by its teacher KL (opd.revisit), not the sequence */
    slot *s;      /* [G] */
} group;

typedef struct step_run {
    int64_t step;
    int active;
    group *g; /* candidates, in order */
    int n, cap;
    int accepted, dropped;
    uint64_t train_lease;
    int train_failures, train_rejected;
    double t_open, t_leased, t_rolled, t_scored, t_train; /* t_leased: first rollout lease */
    double gen_tokens, gen_seconds, score_seconds;
    /* OPD (docs/opd.md): one teach lease per teacher with samples, in key order */
    uint64_t teach_lease[PRL_OPD_TEACHERS];
    int taught[PRL_OPD_TEACHERS], teach_failures[PRL_OPD_TEACHERS];
    int teach_rejected[PRL_OPD_TEACHERS];
    int teach_loads[PRL_OPD_TEACHERS]; /* experts loaded for the step's items */
    double teach_load_s[PRL_OPD_TEACHERS], teach_s[PRL_OPD_TEACHERS];
    uint64_t teach_rss_kb[PRL_OPD_TEACHERS]; /* VmHWM of the process that taught it */
    uint64_t proc_rss_kb[MAX_WORKERS];       /* per worker: VmHWM of its last answer */
    double t_taught;
    /* in-run evaluation (evals.c): a step_run of the eval split at one version */
    int eval;             /* 1: an evaluation, not a training step */
    int gsize;            /* samples per group (0: the job's G) */
    int64_t eval_version; /* the version evaluated, at eval_path */
    char eval_path[1024];
} step_run;

typedef struct ctl {
    const prl_controller_options *o;
    const prl_job_config *job;
    int G, B, lag;
    prl_store *db;
    int64_t run;
    prl_bus_socket *sock;
    char *config_json;
    /* train prompts */
    json_t **task;
    char **task_text;
    const char **task_id;
    uint8_t *retired;
    double *teacher_kl;   /* OPD: each prompt's teacher KL at its last taught visit (-1: none) */
    int8_t *task_teacher; /* OPD: each prompt's teacher index (-1: none) */
    int n_tasks;
    int n_eval;         /* eval-split tasks, at task[n_tasks .. n_tasks + n_eval) */
    int64_t eval_last;  /* newest version evaluated or being evaluated (-1: none) */
    int64_t perm_epoch; /* epoch of perm[] */
    int *perm;
    /* workers and leases */
    worker w[MAX_WORKERS];
    int nw;
    lease *l;
    int nl, capl;
    uint64_t next_lease, next_id;
    /* steps */
    step_run st[MAX_INFLIGHT];
    int64_t next_step;        /* next step to open */
    int64_t cursor;           /* next position of the candidate sequence */
    int64_t version;          /* newest committed policy version */
    const char *rollout_role; /* who plays the rollouts: "rollout", or "gateway" (rollout.source) */
    char version_path[1024];
    int64_t retired_epoch; /* last epoch the retirement rule ran for */
    int done;
    prl_status fatal;              /* a run.db failure: stop, the restart continues from run.db */
    int failed;                    /* a work item kept failing, or no prompt is left: no restart */
    prl_bus_log_limit reject_log;  /* CTL_REJECTED lines (a flood must not fill the log) */
    prl_bus_log_limit requeue_log; /* CTL_REQUEUED lines (each is an event in run.db too) */
    double t_start, t_last_commit;
    int metrics_file_failed; /* an append to metrics.jsonl failed: no more until a restart's
                             ** catch-up, so the file never has a gap */
    double interval_sum;     /* of the steps committed by this process, for the ETA */
    int intervals;
    /* workers on other hosts (remote.c) */
    int remote;                  /* bus.bind off loopback is open (CURVE) */
    prl_bus_curve_keypair curve; /* the controller's keypair (bus.keys) */
    char allow_path[1100];       /* the workers' public keys */
    int64_t allow_mtime;         /* of allow_path when last read (-1: missing) */
    struct {
        int used;
        int64_t version;
        char path[1024];
        uint64_t sum;
    } served[CTL_SERVED]; /* versions served by `fetch`, with their weights checksum */
    int served_next;
    int fault_kind[CTL_FAULTS], fault_at[CTL_FAULTS], n_faults, fault_seen; /* tests */
    uint64_t chunks_served;
} ctl;

/* The kinds of the controller's rate-limited log lines (prl_bus_log_limit). */
#define CTL_REJECTED "rejected message"
#define CTL_REQUEUED "lease handed out again"

/* Refuse the content of a result whose lease the sender really holds: the work goes back to
** the queue (a worker that sent garbage once may do it right, or another worker will),
** instead of the step waiting forever on a lease nobody will finish; after
** controller.max_rejected such results of one item the run fails (ctl_lease_rejected). */
#define CTL_REJECT_HELD(c, w, l, id, ...)                                                          \
    do {                                                                                           \
        char why_[512];                                                                            \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                                  \
        ctl_send_error(c, &(w)->peer, id, "%s", why_);                                             \
        ctl_lease_rejected(c, l, why_);                                                            \
    } while (0)

/* controller.c */
/* "[controller] message" on stderr. */
void ctl_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Samples per group of step r: G, or an evaluation's 1 + k. */
static inline int ctl_gsize(const ctl *c, const step_run *r) { return r->gsize ? r->gsize : c->G; }

/* leases.c */
/* The worker called `name` / behind socket identity `p`, or NULL. */
worker *ctl_worker_by_name(ctl *c, const char *name);
worker *ctl_worker_by_peer(ctl *c, const prl_bus_peer *p);
/* The lease `id` in flight, or NULL. */
lease *ctl_lease_find(ctl *c, uint64_t id);
/* A new lease of `kind` on (step, group, sample) held by w. */
prl_status ctl_lease_new(ctl *c, lease_kind kind, int64_t step, int group, int sample, worker *w,
                         lease **out);
/* End a lease: its worker is idle again (if it still holds it). */
void ctl_lease_end(ctl *c, uint64_t id);
/* Give a lease's work back to the queue (logged, and an event in run.db). */
void ctl_lease_requeue(ctl *c, lease *l, const char *why);
/* Requeue every lease w holds. */
void ctl_requeue_worker(ctl *c, worker *w, const char *why);
/* Its worker failed the item: requeue it, up to MAX_ATTEMPTS (then a score is 0, anything else fails the run). */
void ctl_lease_failed(ctl *c, lease *l, const char *why);
/* The controller rejected a result of l's item (why): requeue it, up to
** controller.max_rejected times; then the run fails naming the item and the last reason (an
** evaluation counts it as a failed attempt instead: evaluations never fail the run). */
void ctl_lease_rejected(ctl *c, lease *l, const char *why);
/* Send m to w and free it; a failed send forgets w until its next hello. */
prl_status ctl_send_msg(ctl *c, worker *w, prl_bus_msg *m);
/* The "rejected message REF: WHY" log line, rate-limited (prl_bus_log_limit). */
void ctl_log_rejected(ctl *c, uint64_t ref, const char *why);
/* An `error` (ref = the message refused) to `to`, and a "rejected message" log line. */
void ctl_send_error(ctl *c, const prl_bus_peer *to, uint64_t ref, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The welcome (run directory, seed, job config) / a stop. */
prl_status ctl_send_welcome(ctl *c, worker *w);
void ctl_send_stop(ctl *c, worker *w, const char *why);
/* A connected worker of `role` with a free slot (most hold one lease at a time), or NULL. */
worker *ctl_idle_worker(ctl *c, const char *role);

/* prompts.c */
/* The train split of the job's domain(s), recorded in run.db. */
prl_status ctl_load_tasks(ctl *c);
/* The next active prompt of the candidate sequence not yet in r (-1: none). */
int ctl_next_candidate(ctl *c, const step_run *r, int64_t *epoch);
/* OPD revisits: how many prompts a step draws again, and draw i of step r (-1: none). */
int ctl_revisit_count(const ctl *c);
int ctl_revisit_draw(ctl *c, const step_run *r, int i);

/* steps.c */
/* Free a sample / a step (every group and sample). */
void ctl_slot_free(slot *s);
void ctl_step_free(ctl *c, step_run *r);
/* The step in flight, or NULL. */
step_run *ctl_step_find(ctl *c, int64_t step);
/* Every sample of g scored: record its outcome, keep it or (dynamic sampling) drop it. */
void ctl_judge_group(ctl *c, step_run *r, group *g);
/* Every group of r judged. */
int ctl_step_rolled(const ctl *c, const step_run *r);
/* A sample within the version-lag bound of its step. */
int ctl_sample_fresh(const ctl *c, const step_run *r, const slot *s);
/* The sample counts as solved: its rule score is 1 (the detail's "rule_score" when learned
** rewards were mixed in, else the reward). */
int ctl_sample_correct(const slot *s);
/* Hand out everything that can start now, oldest step first. */
prl_status ctl_schedule(ctl *c);
/* A new group of r on prompt index `prompt` (a train task, or an eval task for r->eval). */
prl_status ctl_group_add(ctl *c, step_run *r, int prompt, int64_t epoch);

/* teach.c */
/* Hand out a rolled-out step's teach items; 1 when every teacher has answered. */
int ctl_step_taught(ctl *c, step_run *r, prl_status *rc);
/* The teacher side of a step's `train` batch b (*ob owned by the caller). */
prl_status ctl_train_teachers(ctl *c, step_run *r, const prl_grpo_batch *b, prl_opd_batch *ob);
/* With opd.revisit: each taught group's teacher KL, in run.db and in memory. */
prl_status ctl_record_teacher_kls(ctl *c, const step_run *r);
/* A teacher's answer. */
void ctl_on_taught(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id);

/* evals.c (task.eval_every, docs/pipeline.md "In-run evaluation") */
/* Open the evaluation of version v when it is due (v = 0, every eval_every-th, the last). */
prl_status ctl_eval_due(ctl *c, int64_t v);
/* An evaluation is in flight (the run waits for it before it ends). */
int ctl_eval_open(const ctl *c);
/* The newest version run.db's eval events cover, at most the current one, so that a resumed
** run does not evaluate it again. */
prl_status ctl_eval_restore(ctl *c);
/* An evaluation's sample j of group g is scored (or its scoring failed): when every sample
** is, the results go to run.db (event `eval`) and the evaluation closes. */
void ctl_eval_scored(ctl *c, step_run *r, group *g);
/* A failed item of an evaluation: handed out again up to MAX_ATTEMPTS, then a score counts
** as wrong and a rollout gives the evaluation up (event `eval_failed`): an evaluation never
** fails the run. */
void ctl_eval_failed(ctl *c, step_run *r, group *g, lease_kind kind, int j, const char *why);

/* receive.c */
/* A message from w that cannot be taken (why): an `error` to w, and when it names a lease of
** `kind` that w holds, the lease goes back to the queue (CTL_REJECT_HELD). */
void ctl_refuse(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id, lease_kind kind,
                const char *why);
/* The workers' messages, each decoded and checked against the work in flight. */
void ctl_on_hello(ctl *c, const prl_bus_msg *m, const prl_bus_peer *from, uint64_t id);
void ctl_on_heartbeat(ctl *c, const prl_bus_msg *m, uint64_t id);
void ctl_on_result(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id);
void ctl_on_scored(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id);
void ctl_on_trained(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id);

/* remote.c (docs/scale-out.md "Several hosts") */
/* Listen at bus.bind too (CURVE off loopback, with the allow-list); PRL_OK without it. */
prl_status ctl_remote_open(ctl *c);
/* Read the allow-list again if its file changed (called every half second). */
void ctl_remote_tick(ctl *c);
/* A `fetch`: answer with the chunk, or an `error` naming why it cannot be served. */
void ctl_on_fetch(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id);

/* metrics.c */
/* A step's metrics JSON into out[n] and its steps row into *st. */
void ctl_step_metrics(ctl *c, step_run *r, const char *trainer_metrics, double train_s, char *out,
                      size_t n, prl_store_step *st);
/* The step's progress line. */
void ctl_progress_line(ctl *c, const prl_store_step *st, const char *metrics, step_run *r);
/* Append step's line {"step", ...metrics} to runs/NAME/metrics.jsonl (failures logged). */
void ctl_metrics_append(ctl *c, int64_t step, const char *metrics);
/* After a restart: drop metrics.jsonl's lines of steps run.db no longer holds (a fallback to
** an older version) and append those it lacks (a crash between the commit and the append),
** so the file has every step once, in order. */
prl_status ctl_metrics_catch_up(ctl *c);

/* record.c */
/* An event row in run.db (a failure is only logged). */
void ctl_event(ctl *c, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Write a scored sample to run.db (idempotent by its key). */
prl_status ctl_store_sample(ctl *c, step_run *r, group *g, int j);
/* A sample that could not be scored: reward 0, the reason in its detail. */
prl_status ctl_store_failed_score(ctl *c, step_run *r, group *g, int j, const char *why);
/* Close step r: version v+1 at `path` and the metrics in one transaction. */
prl_status ctl_step_commit(ctl *c, step_run *r, const char *path, uint64_t sum,
                           const char *trainer_metrics, double train_s);
/* Create the run in run.db, or resume it (the config must match). */
prl_status ctl_open_run(ctl *c);
/* The newest version and the next step from run.db. */
prl_status ctl_restore(ctl *c);
/* runs/NAME/final -> the newest version, atomically. */
void ctl_link_final(ctl *c);

#endif /* PRL_CONTROLLER_INTERNAL_H */
