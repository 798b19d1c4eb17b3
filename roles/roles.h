/*
** roles.h — the one public header of roles/: the processes of a run (docs/pipeline.md) as
** functions that cli/ calls after parsing a command line.
**
**   worker roles   rollout, reward, trainer, teacher: each joins the controller, serves its
**                  work type in the shared worker loop (worker.c) and leaves on `stop`,
**                  SIGTERM or SIGINT;
**   sandbox        the sandbox as a service over the bus (sandbox_service.c) and the client
**                  the roles send `exec` through (sandbox_client.c);
**   exec           where the verifiers' programs run: a sandbox of this process, or the
**                  service, behind a cache of finished runs (exec.c);
**   launcher       `prl run`: every role as a child process, restarted when it dies
**                  (launcher.c).
** The controller has its own folder and header (roles/controller/controller.h); the
** messages they exchange have theirs (roles/msg/msg.h).
**
** Error model: functions return a prl_status and set prl_error_message() (engine/engine.h).
*/
#ifndef PRL_ROLES_H
#define PRL_ROLES_H

#include "bus/bus.h"
#include "job/job.h"
#include "reward/reward.h"
#include "sandbox/sandbox.h"

#include <signal.h>

/* ---------------------------------------------------------------- signals ---------- */

/* SIGTERM/SIGINT set the flag prl_role_stop_flag points at; SIGPIPE is ignored. */
void prl_role_install_signals(void);
const volatile sig_atomic_t *prl_role_stop_flag(void);

/* ---------------------------------------------------------------- worker roles ----- */

typedef struct prl_worker_options {
    const char *connect; /* the controller's endpoint (required) */
    const char *name;    /* worker name, stable across restarts, e.g. "rollout-0" */
    const char *sandbox; /* rollout, reward: the sandbox service (NULL: a local sandbox) */
    int allow_remote;    /* allow a non-loopback tcp:// endpoint */
    int slots;           /* work items taken at once (the gateway: groups; 0: 1) */
    int ranks;           /* trainer: ranks of its MPI group (0 or 1: one process, no MPI) */
    const char *key; /* the run's bus key file (NULL: DIR/bus.key of an ipc://DIR/... endpoint) */
    /* another host (docs/scale-out.md "Several hosts"): this worker's CURVE keypair directory
    ** and the controller's public.key, instead of the run's key; NULL: none */
    const char *curve_keys;
    const char *server_key;
    /* rollout: fetch each policy version over the bus into this directory (vNNNNNN/),
    ** instead of reading the controller's path; NULL: read the path */
    const char *cache;
    /* with curve_keys and a --sandbox on another host: the service's public.key */
    const char *sandbox_key;
} prl_worker_options;

/* The bus secret of a role: `key` or, when NULL, the bus.key beside the ipc:// socket
** `endpoint` (docs/protocol.md "Who may join"). */
prl_status prl_role_load_secret(const char *key, const char *endpoint, prl_bus_secret *out);

/* Join the run at o->connect and serve until stopped. PRL_OK after a `stop` or a signal;
** an error when the role could not join or its socket failed. Work items it cannot do are
** refused to the controller (logged), never fatal. */
prl_status prl_role_rollout_run(const prl_worker_options *o);
prl_status prl_role_reward_run(const prl_worker_options *o);

/* reward.program (docs/rewards.md "Reward programs"): a reward worker's long-lived scoring
** process in the sandbox, one JSON line each way per sample; restarted when it dies or
** hangs. */
typedef struct prl_reward_program prl_reward_program;
/* reward.program's command is [INTERPRETER, SCRIPT] — python3, sh, or an executable under
** /usr (a name is looked up in /usr/bin, /usr/local/bin) — and the script can be read (prl run
** checks it before any process starts); PRL_OK without a program. */
prl_status prl_reward_program_check(const prl_job_config *job);
/* A program for reward worker `worker_index` (its sandbox's uid range); not started yet. */
prl_status prl_reward_program_open(prl_reward_program **p, const prl_job_config *job,
                                   int worker_index);
/* Score one request line (JSON, no newline): *out gets the reply's score and breakdown, or
** score 0 with the reason when the reply is not a score in [0, 1]. A program that dies or
** does not answer within reward.timeout is started again and asked again; after 3 tries
** the error is returned (the sample goes back to the controller). */
prl_status prl_reward_program_score(prl_reward_program *p, const char *request,
                                    prl_reward_result *out);
/* Restarts so far (for the worker's log and tests). */
uint64_t prl_reward_program_restarts(const prl_reward_program *p);
void prl_reward_program_close(prl_reward_program *p);

/* reward.model and reward.judge (roles/reward_learned.c, docs/reward-models.md):
** learned scores mixed into the verifiers' rule score by every reward worker. */
typedef struct prl_reward_learned prl_reward_learned;
/* The checkpoints are usable (a reward model: score head and tokenizer; a judge: tokenizer,
** a template with {answer}); errors name the key. prl run checks before any process starts. */
prl_status prl_reward_learned_check(const prl_job_config *job);
/* Load the job's reward model and judge (*out NULL when it has neither). */
prl_status prl_reward_learned_open(prl_reward_learned **out, const prl_job_config *job);
void prl_reward_learned_close(prl_reward_learned *l);
/* Mix into res (a verifier's result): *rule gets its rule score, res->score the mix, with a
** check per learned part ("reward_model", "judge"). A result with a failed required check
** is left as it is. l NULL: nothing but *rule. */
prl_status prl_reward_learned_mix(prl_reward_learned *l, const char *task_json,
                                  const prl_chat_message *turns, size_t n_turns,
                                  prl_reward_result *res, double *rule);
/* Answers the judge graded, and of them the unparseable. */
void prl_reward_learned_counts(const prl_reward_learned *l, uint64_t *judged, uint64_t *unparsed);
prl_status prl_role_trainer_run(const prl_worker_options *o);
prl_status prl_role_teacher_run(const prl_worker_options *o);

/* ---------------------------------------------------------------- exec ------------- */

/* The verifiers' executor on a sandbox of this process (exec.c): every program in one slot,
** with the sandbox's default limits and the request's wall time. The sandbox starts on the
** first run, so a command that never runs a program never probes it; a start-up failure is
** returned by that run, naming the cause. Pass the prl_exec_local as the prl_reward_exec
** ctx. new/free pair; free accepts NULL. */
typedef struct prl_exec_local prl_exec_local;
prl_exec_local *prl_exec_local_new(void);
void prl_exec_local_free(prl_exec_local *x);
prl_status prl_exec_local_run(void *ctx, const prl_reward_exec_request *req,
                              prl_reward_exec_result *res);

/* Where a role's programs run (python tool calls, coding tests): the sandbox service at
** `sandbox` (re-sent after a service restart), or with sandbox NULL a local sandbox;
** repeats of a finished run are answered from a cache. open/close pair; x->exec is what
** the verifiers and rollouts take. */
enum { PRL_EXEC_CACHE = 4096 };
typedef struct prl_exec_cache_entry {
    uint64_t key;
    int used;
    prl_reward_exec_result result;
} prl_exec_cache_entry;
typedef struct prl_role_exec {
    prl_exec_local *local;
    struct prl_sandbox_client *svc;
    prl_reward_exec inner;       /* the executor behind the cache */
    prl_reward_exec exec;        /* the cached one: give this to the verifiers */
    prl_exec_cache_entry *cache; /* [PRL_EXEC_CACHE] */
    uint64_t hits;
} prl_role_exec;
/* `secret`: the run's bus key, presented to the sandbox service (NULL: it asks for none). */
prl_status prl_role_exec_open(prl_role_exec *x, const char *sandbox, const char *worker,
                              const char *secret, double wall_s);
/* The same with the service on another host, over CURVE (prl_sandbox_client_open_curve). */
prl_status prl_role_exec_open_curve(prl_role_exec *x, const char *sandbox, const char *worker,
                                    const prl_bus_curve_keypair *kp, const char *server_pub,
                                    double wall_s);
void prl_role_exec_close(prl_role_exec *x);

/* ---------------------------------------------------------------- service ---------- */

/* An `exec` the service cannot run (roles/msg/exec.c: an unknown lang, wall_ms outside
** 1..PRL_MSG_EXEC_MAX_WALL_MS, an empty program or one with a NUL byte) gets an `error`
** naming the field. */
typedef struct prl_sandbox_service_options {
    const char *endpoint; /* ROUTER bind, e.g. ipc://runs/NAME/sandbox.sock (required) */
    int slots;            /* concurrent runs, one worker thread per slot, 1..256 (default 1) */
    int warm;             /* python3 programs start from a zygote per slot (sandbox.h) */
    unsigned uid_base;    /* slot uids start here; 0: derived from the pid, so services
                             and `prl sandbox exec` processes on one host never share uids */
    const char *name;     /* log prefix (default "sandbox") */
    /* who may use it (docs/protocol.md "Who may join"): with `secret`, only peers presenting
    ** it; a `stop` message only from a peer presenting `launcher_secret` (NULL: from nobody,
    ** the service stops on a signal). Without `secret`, anyone on the endpoint. */
    const char *secret;
    const char *launcher_secret;
    /* off loopback (docs/scale-out.md "Several hosts"): a CURVE server with this keypair,
    ** serving the clients of the allow-list (copied at start), instead of `secret` */
    const prl_bus_curve_keypair *curve;
    const prl_bus_curve_allow *curve_allow;
} prl_sandbox_service_options;

void prl_sandbox_service_options_default(prl_sandbox_service_options *opt);

/* What a service did, for its final log line and for tests. */
typedef struct prl_sandbox_service_stats {
    uint64_t runs;    /* exec requests run (whatever the program's status) */
    uint64_t refused; /* `error` replies: unknown lang, bad wall_ms, bad program, other types */
    uint64_t dropped; /* invalid messages dropped by the bus (each logged with its reason) */
    uint64_t unsent;  /* replies that could not be delivered (the client had gone) */
    int signal;       /* the signal that stopped it (SIGTERM, SIGINT), 0 after a `stop` */
} prl_sandbox_service_stats;

/* Probe, create a sandbox of opt->slots slots, bind the ROUTER and serve until SIGTERM or
** SIGINT (handlers installed for the duration of the call) or a `stop` message. Requests
** wait in a queue for a free slot. On stop, queued requests are discarded (their clients
** re-send) and runs in progress finish (bounded by their wall limits) and are answered.
** Every log line goes to stderr as "prl NAME: ...". Returns PRL_OK after a clean stop, an
** error when the service could not start; stats (may be NULL) gets the counters. */
prl_status prl_sandbox_service_run(const prl_sandbox_service_options *opt,
                                   prl_sandbox_service_stats *stats);

/* ---------------------------------------------------------------- client ----------- */

typedef struct prl_sandbox_client prl_sandbox_client; /* opaque; one thread at a time */

/* Open a client of the service at `endpoint` (connects lazily; nothing is sent yet).
** `name` (e.g. "reward-0") is the log prefix and the messages' run field. *c is NULL on
** failure. Free with prl_sandbox_client_free (NULL accepted). */
prl_status prl_sandbox_client_open(prl_sandbox_client **c, const char *endpoint, const char *name,
                                   const char *secret);
/* The same for a service on another host: CURVE with the worker's keypair `kp` to the
** service's public key `server_pub` (Z85), instead of the run's secret. */
prl_status prl_sandbox_client_open_curve(prl_sandbox_client **c, const char *endpoint,
                                         const char *name, const prl_bus_curve_keypair *kp,
                                         const char *server_pub);
void prl_sandbox_client_free(prl_sandbox_client *c);

/* Timing: one try waits wall_s + margin_s for the answer (default 5 s), then the socket is
** re-created and the request re-sent, until deadline_s have passed since the first send
** (default 30 s; at least one full try is always made). */
void prl_sandbox_client_set_timing(prl_sandbox_client *c, double margin_s, double deadline_s);
/* Requests re-sent since the client was opened. */
uint64_t prl_sandbox_client_resends(const prl_sandbox_client *c);

/* Run `program` (NUL-terminated) in language `lang` with stdin_len bytes of stdin (NULL
** when 0) under a wall limit of wall_s seconds, and fill *res (free with
** prl_sandbox_result_free): status, exit_code (-1 for sandbox_error), signal (when the
** exit code says 128 + signal), out/err (byte-exact, NUL-terminated), wall_seconds, and a
** reason line (the service's message for sandbox_error). Fields the protocol does not carry
** (cpu, memory, layers, limits) are zero. Returns PRL_OK when the service answered; the
** service's `error` (a refused request: unknown lang, bad wall_ms or program) is
** PRL_ERR_ARG with its reason; no answer by the deadline is PRL_ERR_IO naming the
** endpoint. Replies to other requests (late answers to an earlier try) are ignored. */
prl_status prl_sandbox_client_exec(prl_sandbox_client *c, const char *lang, const char *program,
                                   const char *stdin_data, size_t stdin_len, double wall_s,
                                   prl_sandbox_result *res);

/* The same executor over the sandbox service: ctx is a prl_sandbox_client, owned by the
** caller; its retry and deadline apply. A run the service could not start (sandbox_error)
** or no answer by the deadline is an error return, as for the local one. */
prl_status prl_exec_service_run(void *ctx, const prl_reward_exec_request *req,
                                prl_reward_exec_result *res);

/* ---------------------------------------------------------------- launcher --------- */

/* The controller's exit code when the run failed for good (the launcher does not restart it). */
enum { PRL_RUN_FAILED_EXIT = 4 };
/* Every role's exit code when SIGTERM or SIGINT stopped it (0 is kept for a `stop` message or
** a finished run): the launcher restarts a role stopped by a signal it did not send, as one
** that died, so a stray SIGTERM cannot leave the run waiting for a role that is gone. */
enum { PRL_ROLE_SIGNALED_EXIT = 3 };

/* Lock the run directory for this process's lifetime (flock on run_dir/lock, which then
** holds this PID), so two `prl run` of one run cannot both start. *fd is the lock's file
** (close-on-exec: the roles do not hold it). A run locked by a live process is
** PRL_ERR_ARG naming its PID. */
prl_status prl_launcher_lock(const char *run_dir, int *fd);
/* What the launcher needs beyond the job's own rules: with trainer.ranks > 1, prl built with
** MPI and mpirun (or srun: trainer.launcher, or SLURM_JOB_ID set) on PATH; PRL_ERR_CONFIG
** naming trainer.ranks otherwise; with trainer.hosts or trainer.hostfile, mpirun and this
** host first (prl_rank_hosts_check). */
prl_status prl_launcher_check(const prl_job_config *job);
/* trainer.hosts / trainer.hostfile (rank_hosts.c), checked on this host: not under srun
** (`launcher`), a hostfile that names a host, and the first host (rank 0's) this one;
** PRL_ERR_CONFIG naming the key otherwise. */
prl_status prl_rank_hosts_check(const prl_job_config *job, const char *launcher);
/* mpirun's placement options for the job into argv (--host LIST or --hostfile FILE; at most
** 2 entries, pointing into job); returns how many. */
int prl_rank_hosts_args(const prl_job_config *job, const char **argv);

/* Start every role of the run in run_dir (job.json, logs/ and ckpt/ exist) as a child
** process and supervise them: `threads` per role unless the job sets trainer.threads,
** rollout.threads or teacher.threads (0: PRL_THREADS or all CPUs). Returns the exit code of
** `prl run`: 0 when the controller finished the run, 130 after SIGINT/SIGTERM (every role
** stopped, the run resumable), 1 when the run failed or a role kept dying. */
int prl_launcher_run(const char *run_dir, const prl_job_config *job, int threads);

#endif /* PRL_ROLES_H */
