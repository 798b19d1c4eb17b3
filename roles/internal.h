/*
** internal.h — what the worker roles of roles/ share (not part of the public API): a
** worker's link to the run and the one loop every worker role runs (worker.c).
**
** A worker joins (connect, hello, wait for the welcome: run directory, seed, job config),
** keeps a heartbeat going from a thread with its own socket, then serves: each message of
** its work type goes to the role's handler; a handler error is refused to the controller
** (the controller hands the item out again); `stop`, a re-welcome and the controller's
** `error` messages are handled here; anything else is logged as ignored.
*/
#ifndef PRL_ROLES_INTERNAL_H
#define PRL_ROLES_INTERNAL_H

#include "bus/bus.h"
#include "dp/dp.h"
#include "roles/msg/msg.h"
#include "roles/roles.h"

#include <pthread.h>

typedef struct prl_worker {
    const char *role; /* "rollout", "reward", "trainer", "teacher", "gateway" */
    int slots;        /* work items it takes at once (said in its hello) */
    char worker[64];  /* stable name, e.g. "rollout-0" */
    char endpoint[512];
    char run[128]; /* from the welcome */
    char run_dir[1024];
    uint64_t seed;
    prl_job_config job; /* from the welcome */
    double heartbeat_s;
    prl_bus_socket *ctl;
    prl_bus_secret secret; /* the run's bus key, presented on every socket it opens */
    int curve_on;          /* instead: CURVE with this keypair to the server's public key */
    prl_bus_curve_keypair curve;
    char server_pub[PRL_BUS_CURVE_Z85 + 1];
    uint64_t next_id; /* ids of the messages this worker sends */
    /* log lines a peer's messages could flood, rate-limited: "controller: REASON" (its error
    ** replies) and "ignored a 'TYPE' message" */
    prl_bus_log_limit ctl_error_log, ignored_log;
    int stop; /* a stop message arrived */
    volatile int hb_quit;
    int hb_running;
    pthread_t hb;
} prl_worker;

/* Connect, hello, wait for the welcome (re-sending hello every second, up to 2 minutes),
** start the heartbeat. On error nothing is left open. join/leave pair. */
prl_status prl_worker_join(prl_worker *w, const char *role, const prl_worker_options *o);
void prl_worker_leave(prl_worker *w);
/* A signal or a `stop` message asked the worker to finish. */
int prl_worker_stopping(const prl_worker *w);

/* Handle one message of the worker's work type; an error return is refused to the
** controller with prl_error_message() as the reason. */
typedef prl_status (*prl_worker_fn)(void *ctx, prl_worker *w, const prl_bus_msg *m);

/* Serve messages of `work_type` with fn until stopped. PRL_OK after a stop; an error only
** when the socket failed. */
prl_status prl_worker_serve(prl_worker *w, const char *work_type, prl_worker_fn fn, void *ctx);
/* The same, calling idle(ctx, w) after every wait for a message (at most 200 ms apart): a
** role with work of its own to send (the gateway's ended episodes). An error from idle stops
** the loop and is returned. */
typedef prl_status (*prl_worker_idle_fn)(void *ctx, prl_worker *w);
prl_status prl_worker_serve_idle(prl_worker *w, const char *work_type, prl_worker_fn fn,
                                 prl_worker_idle_fn idle, void *ctx);

/* A stop, welcome or error from the controller, handled as the serve loop does (m freed,
** 1; *rc a failure to answer); 0 for any other message (m left to the caller). */
int prl_worker_control(prl_worker *w, prl_bus_msg *m, prl_status *rc);

/* Where the worker's programs run (prl_role_exec_open): o->sandbox with the run's key, or with
** o->sandbox_key a service on another host over CURVE, or a local sandbox. */
prl_status prl_worker_exec_open(prl_worker *w, const prl_worker_options *o, prl_role_exec *x);

/* Send m to the controller and free it. */
prl_status prl_worker_send(prl_worker *w, prl_bus_msg *m);

/* The options of a socket to the controller: identity and name `id`, the worker's key
** (the run's secret, or its CURVE keypair and the controller's public key). */
void prl_worker_socket_options(const prl_worker *w, const char *id, prl_bus_socket_options *o);

/* Weights over the bus (fetch.c): policy version v fetched from the controller into
** cache/vNNNNNN (a no-op when that directory already holds the version the controller
** announces), in chunks each checked against its checksum, the whole against the version's
** weights checksum and prl_checkpoint_verify; a bad chunk or a bad whole is fetched again
** (a few times, then an error). Built under a temporary name and renamed, so a killed
** fetch leaves no half version. Only between work items. out: the local directory. */
prl_status prl_worker_fetch_version(prl_worker *w, const char *cache, uint64_t v, char *out,
                                    size_t n);

/* "[rollout-0] message" on stderr. */
void prl_worker_log(const prl_worker *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- trainer ranks ---- */
/* trainer_ranks.c: rank 0 of a data-parallel trainer hands the other ranks what a step needs
** (collective calls: rank 0 sends, the others receive, in the same order everywhere). */

/* Rank 0's NUL-terminated *text to every rank (the others' *text is malloc'd here). */
prl_status prl_ranks_bcast_text(prl_dp *d, char **text);
/* Rank 0's message m (its wire frames) to every rank; the others decode it into *out (owned:
** prl_bus_msg_free), validated as off the bus. */
prl_status prl_ranks_bcast_msg(prl_dp *d, const prl_bus_msg *m, prl_bus_msg *out);
/* Rank 0's model (config, weights, router bias, expert counts) into every rank's m; a rank
** builds m on the first call or when the config changed (*have: m is built). */
prl_status prl_ranks_bcast_model(prl_dp *d, prl_model *m, int *have);

#endif /* PRL_ROLES_INTERNAL_H */
