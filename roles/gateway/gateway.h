/*
** gateway.h — the one public header of roles/gateway/: the gateway role (`prl role
** gateway`), an OpenAI-compatible HTTP server through which agents written outside prl play
** the run's episodes with the rollout engine at the current policy version
** (docs/gateway.md). Every turn is recorded token-in/token-out (the exact sampled ids, their
** log-probs, MoE routes and policy version) and an ended episode goes to the controller as
** the `result` of its sample, so the trainer trains on what was sampled.
**
** Error model: functions return a prl_status and set prl_error_message() (engine/engine.h).
*/
#ifndef PRL_GATEWAY_H
#define PRL_GATEWAY_H

#include "roles/roles.h"

typedef struct prl_gateway_options {
    const char *bind;      /* HOST:PORT to serve on (port 0: any free one); required */
    const char *connect;   /* the controller's endpoint: serve the run's episodes */
    const char *name;      /* worker name with connect (default "gateway-0") */
    const char *key;       /* with connect: the run's bus key file (NULL: beside the socket) */
    const char *model;     /* without connect: serve this checkpoint directory alone (nothing
                         ** recorded; for benches and trying a harness) */
    const char *addr_file; /* write the served address ("http://HOST:PORT\n") here; with
                           ** connect and NULL: RUN_DIR/gateway.addr */
    int allow_remote;      /* a non-loopback bind (and controller endpoint) */
    int slots;             /* with connect: groups held at once (0: 64) */
    /* without connect (with connect the job's gateway.* and rollout.* keys apply) */
    int max_body;          /* bytes (0: 1 MiB) */
    double client_timeout; /* seconds (0: 30) */
    int max_tokens;        /* default max_tokens (0: 96) */
    int max_batch;         /* sequences decoded together (0: 16) */
} prl_gateway_options;

/* Serve until SIGTERM/SIGINT or the controller's `stop`. PRL_OK after a clean stop; an
** error when the gateway could not start (a bad bind, no model, no welcome). */
prl_status prl_role_gateway_run(const prl_gateway_options *o);

#endif /* PRL_GATEWAY_H */
