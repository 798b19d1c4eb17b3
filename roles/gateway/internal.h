/*
** internal.h — what the pieces of the gateway share (not part of the public API;
** docs/gateway.md is the reference).
**
**   request.c   an HTTP body as a validated request, or the OpenAI-shaped error naming the
**               field (pure: bytes in, struct out, nothing else touched, so it can be fuzzed)
**   reply.c     the JSON the gateway answers: completions, stream chunks, errors, models
**   engine.c    the one thread that owns the infer engine: queued requests with the same
**               sampling parameters are generated in one continuous batch; streaming
**               requests see their tokens after every decode step; a new policy version is
**               loaded between batches
**   episodes.c  the groups the controller leased and their episodes: each turn's prompt built
**               from the episode's recorded ids (token-in/token-out), every sampled id, its
**               log-prob, routes and version recorded, an ended episode turned into a result
**   http.c      libmicrohttpd: routes, bounded bodies, SSE streams, errors
**   gateway.c   the role: join the controller (or serve a checkpoint alone), take `work`
**               leases, send the results of ended episodes
**
** Threads: libmicrohttpd's (one per connection), the engine thread, and the role's main
** thread (the only one that touches the bus). The gateway's state is under gw.mu; the engine
** thread holds it only to take a batch and to publish its tokens.
*/
#ifndef PRL_GATEWAY_INTERNAL_H
#define PRL_GATEWAY_INTERNAL_H

#include "roles/gateway/gateway.h"

#include "engine/engine.h"

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum {
    GW_MAX_N = 64,         /* choices per request */
    GW_MAX_STOP = 4,       /* stop strings per request (OpenAI's limit) */
    GW_MAX_TOP = 20,       /* top_logprobs (OpenAI's limit) */
    GW_MAX_MESSAGES = 256, /* messages per chat request */
    GW_ID_MAX = 64         /* episode and group ids */
};

/* ---------------------------------------------------------------- request.c -------- */

typedef enum gw_kind { GW_CHAT = 0, GW_COMPLETION = 1 } gw_kind;

/* An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}} with an HTTP
** status. param and code may be "" (sent as null). */
typedef struct gw_error {
    int status;
    char type[48], param[48], code[48];
    char message[512];
} gw_error;

/* Fill e and return its status (for `return gw_fail(...)`). */
int gw_fail(gw_error *e, int status, const char *type, const char *param, const char *code,
            const char *fmt, ...) __attribute__((format(printf, 6, 7)));

typedef struct gw_message {
    char *role;    /* system, user, assistant or tool */
    char *content; /* owned, UTF-8 */
} gw_message;

typedef struct gw_request {
    gw_kind kind;
    char model[128];
    gw_message *messages; /* chat: [n_messages], owned */
    int n_messages;
    char *prompt; /* completions: owned */
    int n;        /* choices, 1..GW_MAX_N */
    double temperature, top_p;
    int has_temperature, has_top_p;
    int max_tokens; /* 0: the job's rollout.max_new_tokens */
    char *stop[GW_MAX_STOP];
    int n_stop;
    uint64_t seed;
    int has_seed;
    int logprobs;     /* return each sampled token's log-prob */
    int top_logprobs; /* 0..GW_MAX_TOP alternatives per position */
    int stream, include_usage;
    char episode[GW_ID_MAX]; /* X-Episode-Id, else `user` ("" when none) */
} gw_request;

/* Parse body[0..len) (not NUL-terminated) as a request of `kind`; header_episode is the
** X-Episode-Id header (NULL: none). On error *e says why (400 for a malformed body, with
** the field in param) and r is left empty. gw_request_free accepts an empty request. */
int gw_request_parse(const char *body, size_t len, gw_kind kind, const char *header_episode,
                     gw_request *r, gw_error *e);
void gw_request_free(gw_request *r);

/* The body of a posted reward: {"reward": x}, x a number in [0, 1]. */
int gw_reward_parse(const char *body, size_t len, double *reward, gw_error *e);
/* The body of a group claim: {} or {"wait": seconds in [0, 60]}. */
int gw_claim_parse(const char *body, size_t len, double *wait_s, gw_error *e);

/* ---------------------------------------------------------------- engine.c --------- */

struct gw_episode;

/* One choice being generated: the engine writes tokens as they come (under gw.mu). */
typedef struct gw_choice {
    int32_t *prompt; /* owned: the ids fed */
    int prompt_len;
    uint64_t seq_id;
    int32_t *tokens; /* [cap] sampled ids */
    float *logprobs;
    int32_t *top_ids; /* [cap × top] with top_logprobs */
    float *top_lp;
    int n, cap;
    int stop;        /* prl_stop_reason once done */
    uint8_t *routes; /* owned, from the engine's result: every token fed */
    size_t routes_bytes;
    int n_route_tokens;
    struct gw_episode *ep; /* the episode it plays (NULL: not recorded) */
} gw_choice;

/* A request's generation: n choices with the same sampling parameters. */
typedef struct gw_job {
    gw_choice c[GW_MAX_N];
    int n;
    double temperature, top_p;
    int max_tokens, top;
    const char *stop[GW_MAX_STOP];
    int n_stop;
    int done; /* 1 generated, -1 failed (error in why) */
    char why[256];
    int64_t version;     /* the policy version that generated it */
    double seconds;      /* wall time of its batch */
    struct gw_job *next; /* the queue */
} gw_job;

/* ---------------------------------------------------------------- episodes.c ------- */

typedef struct gw_episode {
    char id[GW_ID_MAX];
    int sample;
    int started, busy, ended, sent; /* busy: a request in flight (one at a time) */
    int32_t *ids;                   /* the whole sequence: prompt, turns, observations */
    uint8_t *mask;                  /* 1 on sampled ids */
    float *logprobs;                /* their log-probs (0 elsewhere) */
    int n, cap, prompt_len;
    gw_message *history; /* the messages it has seen (chat), assistant turns as returned */
    int n_history;
    char *text;      /* completions: the whole text so far */
    json_t *turns;   /* the model's turns and the observations, for the verifier */
    uint8_t *routes; /* the last turn's routes (every token fed then) */
    size_t routes_bytes;
    int n_route_tokens;
    int turns_played, truncated, stop;
    int64_t min_version;
    double gen_seconds, last_seen;
    int has_reward;
    double reward;
} gw_episode;

typedef struct gw_group {
    char id[GW_ID_MAX];
    uint64_t lease, step, prompt, sample0, version;
    int eval;   /* an evaluation's item: episode 0 is played greedily */
    char *task; /* the task JSON text */
    int claimed;
    double claimed_at;
    gw_episode *ep; /* [count] */
    int count, n_ended, n_sent;
    struct gw_group *next;
} gw_group;

/* ---------------------------------------------------------------- the gateway ------ */

typedef struct gw {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* jobs queued, tokens published, jobs done, groups leased */
    /* configuration */
    char model_name[PRL_JOB_NAME_MAX + 1]; /* served as "model" (a copy: a re-welcome frees the
                                           ** worker's job config) */
    size_t max_body;
    double client_timeout, episode_timeout;
    int default_max_tokens;
    double default_temperature, default_top_p;
    int connected; /* 1: episodes are the controller's (ids required) */
    uint64_t seed;
    /* the engine (engine.c) */
    prl_model *model; /* owned with tok and infer: swapped together under mu */
    prl_tokenizer *tok;
    prl_infer *infer;
    int max_len;        /* the engine's context */
    char precision[32]; /* the job's rollout.precision (a copy, as model_name) */
    int max_batch;
    int64_t version, want_version; /* loaded / to load (-1: none) */
    char path[1024], want_path[1024];
    gw_job *queue, *queue_tail;
    int quit;
    pthread_t thread;
    int thread_running;
    uint64_t requests; /* request counter: the seed of requests without one */
    /* episodes (episodes.c) */
    gw_group *groups;
    /* counters for the log */
    uint64_t served, refused, tokens_out;
} gw;

/* engine.c */
/* Start / stop the engine thread (the model is loaded by it: gw_engine_want). A stop fails
** the queued jobs (their waiters wake); the model stays until gw_engine_free, after the
** HTTP server (whose threads read the tokenizer) has stopped. */
prl_status gw_engine_start(gw *g);
void gw_engine_stop(gw *g);
void gw_engine_free(gw *g);
/* Ask for version v at path (loaded before the next batch). Under g->mu. */
void gw_engine_want(gw *g, int64_t v, const char *path);
/* Load path now, on the calling thread (standalone start-up, before the engine runs). */
prl_status gw_engine_load(gw *g, int64_t v, const char *path);
/* Queue job j (every choice's prompt, seq id and cap set) and return; the engine sets
** j->done and broadcasts g->cv. Under g->mu. */
void gw_engine_submit(gw *g, gw_job *j);
/* Wait (under g->mu) for the next change of any job, episode or group (everything is
** broadcast on g->cv), at most timeout_s; 0 when the wait timed out. j is not looked at:
** the caller checks its job again. */
int gw_engine_wait(gw *g, gw_job *j, double timeout_s);
void gw_job_free(gw_job *j);
/* The bytes of choice c's tokens [0, n), without a final stop id (owned, *len bytes). */
char *gw_choice_raw(gw *g, const gw_choice *c, int n, size_t *len);
/* The UTF-8 view of s[0..n) (owned). */
char *gw_view(const char *s, size_t n, size_t *len);
/* Where j's first stop string starts in text (the reply is cut there), or len. */
size_t gw_stop_cut(const gw_job *j, const char *text, size_t len);
/* The reply's text of choice c: the view of its bytes cut at a stop string (owned). */
char *gw_choice_text(gw *g, const gw_job *j, const gw_choice *c, size_t *len);

/* episodes.c (all under g->mu) */
/* A `work` lease: its group of `count` episodes, ready to be claimed. */
prl_status gw_group_add(gw *g, uint64_t lease, uint64_t step, uint64_t prompt, uint64_t sample0,
                        int count, uint64_t version, int eval, const char *task);
/* The next unclaimed group as the claim's JSON (owned), or NULL when none. */
char *gw_group_claim(gw *g);
/* Free every group (at exit). */
void gw_groups_free(gw *g);
/* The episode or group called id (NULL: none). */
gw_episode *gw_episode_find(gw *g, const char *id, gw_group **group);
gw_group *gw_group_find(gw *g, const char *id);
/* Prepare job j for request r on r->episode: each choice's prompt from the episode's record
** (n > 1 needs a group id: its next n unstarted episodes); marks them busy. On error *e. */
int gw_episodes_begin(gw *g, const gw_request *r, gw_job *j, gw_error *e);
/* Record job j's choices into their episodes (and unmark busy); failed: just unmark. */
void gw_episodes_record(gw *g, const gw_request *r, gw_job *j);
/* End episode id (a posted reward, or the verifier's when has_reward is 0). */
int gw_episode_end(gw *g, const char *id, int has_reward, double reward, char **reply, gw_error *e);
/* The record of an episode as JSON (owned), for GET /v1/episodes/{id}. */
char *gw_episode_json(gw *g, const char *id, gw_error *e);
/* End episodes silent for episode_timeout; give back claimed groups nobody started. */
void gw_episodes_sweep(gw *g, double now);
/* The next ended episode whose result is not sent yet, as a `result` message (NULL: none);
** groups whose every result is sent are removed. */
typedef struct prl_bus_msg prl_bus_msg;
int gw_episodes_next_result(gw *g, const char *run, uint64_t id, prl_bus_msg *m);

/* reply.c */
char *gw_error_json(const gw_error *e);
/* The whole (non-streamed) answer to request r from job j. */
char *gw_reply_completion(gw *g, const gw_request *r, const gw_job *j, const char *id,
                          const char *const *episodes);
/* One SSE chunk's JSON: choice `index`'s new text (NULL: none), its log-prob entries
** [from, to), finish reason (NULL: none); usage chunk when usage != NULL. */
char *gw_reply_chunk(gw *g, const gw_request *r, const gw_job *j, const char *id, int index,
                     const char *text, size_t len, int from, int to, const char *finish, int first,
                     const char *episode);
char *gw_reply_usage_chunk(const gw_request *r, const gw_job *j, const char *id);
char *gw_reply_models(const gw *g);
const char *gw_finish_reason(int stop);

/* http.c */
typedef struct gw_http gw_http;
/* Serve on host:port (port 0: any); *bound gets "http://HOST:PORT". */
prl_status gw_http_start(gw *g, const char *bind, int allow_remote, gw_http **h, char *bound,
                         size_t n);
void gw_http_stop(gw_http *h);

#endif /* PRL_GATEWAY_INTERNAL_H */
