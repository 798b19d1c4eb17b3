/*
** msg.h — the one public header of roles/msg/: every message the processes of a run exchange
** (docs/protocol.md), one home per message. A type's home file holds its schema row (the
** header fields and frames the bus checks), its typed struct, its encoder and its decoder
** with every check that needs only the message; registry.c lists the types.
**
**   session.c  hello, welcome, heartbeat, stop, error, ack   (any worker ↔ the controller)
**   rollout.c  work, result                                  (controller ↔ rollout)
**   score.c    score, scored                                 (controller ↔ reward)
**   train.c    train, trained, weights                       (controller ↔ trainer)
**   teach.c    teach, taught                                 (controller ↔ teacher, OPD)
**   exec.c     exec, exec_result                             (roles ↔ the sandbox service)
**   fetch.c    fetch, chunk                                  (remote workers ↔ the controller)
**
** Conventions, for every type X:
**   prl_msg_X_encode(&x, run, id, &m)  builds message m (initialised here; on error it is
**                                      left empty) from x: the codec's schema always, the
**                                      batch rules for `train` and `teach`; the values of
**                                      the other types are the decoder's to check;
**   prl_msg_X_decode(&m, &x)           checks m and fills x; errors (PRL_ERR_FORMAT) start
**                                      with the type and name the field or frame, and leave
**                                      x empty. Pointer fields of x are views into m (valid
**                                      while m lives) unless the struct says "owned": those
**                                      are freed by prl_msg_X_free (which accepts a zeroed
**                                      struct). Fields marked "decode" are set by the
**                                      decoder only; "encode" ones are read by the encoder
**                                      only.
** Checks that need more than the message (a lease in flight, a committed version, the files
** on disk) are the receiver's.
*/
#ifndef PRL_MSG_H
#define PRL_MSG_H

#include "bus/bus.h"
#include "grpo/grpo.h"
#include "job/job.h"
#include "opd/opd.h"
#include "replay/replay.h"

#include <jansson.h>

/* ---------------------------------------------------------------- registry --------- */

/* Every message type of prl; a socket that receives is opened with it. */
const prl_bus_registry *prl_msg_registry(void);
/* The schema of `type` (NULL if prl has no such type). */
const prl_bus_type_spec *prl_msg_spec(const char *type);

/* ---------------------------------------------------------------- session.c -------- */

/* A worker announces itself; role is one of "rollout", "reward", "trainer", "teacher". */
enum { PRL_MSG_MAX_SLOTS = 4096 };
typedef struct prl_msg_hello {
    const char *role, *worker; /* role: rollout, reward, trainer, teacher or gateway */
    uint64_t pid;
    uint64_t slots; /* work items the worker takes at once, 1..PRL_MSG_MAX_SLOTS (0 or 1 on
                    ** encode: the field is left out; decode: 1 when absent). A gateway holds
                    ** one rollout lease per group its outside agents play */
} prl_msg_hello;
prl_status prl_msg_hello_encode(const prl_msg_hello *x, const char *run, uint64_t id,
                                prl_bus_msg *m);
prl_status prl_msg_hello_decode(const prl_bus_msg *m, prl_msg_hello *x);

/* The controller answers a hello: the run directory, the seed, the job config. */
typedef struct prl_msg_welcome {
    const char *run_dir;
    uint64_t seed;
    const char *config; /* encode: the job config as JSON text */
    prl_job_config job; /* decode, owned: the config parsed (and validated) */
} prl_msg_welcome;
prl_status prl_msg_welcome_encode(const prl_msg_welcome *x, const char *run, uint64_t id,
                                  prl_bus_msg *m);
prl_status prl_msg_welcome_decode(const prl_bus_msg *m, prl_msg_welcome *x);
void prl_msg_welcome_free(prl_msg_welcome *x);

/* A worker is alive (and still holds `lease`: 0 = none). */
typedef struct prl_msg_heartbeat {
    const char *worker;
    uint64_t lease;
} prl_msg_heartbeat;
prl_status prl_msg_heartbeat_encode(const prl_msg_heartbeat *x, const char *run, uint64_t id,
                                    prl_bus_msg *m);
prl_status prl_msg_heartbeat_decode(const prl_bus_msg *m, prl_msg_heartbeat *x);

/* The receiver should finish its current item and exit (reason may be NULL). */
typedef struct prl_msg_stop {
    const char *reason;
} prl_msg_stop;
prl_status prl_msg_stop_encode(const prl_msg_stop *x, const char *run, uint64_t id, prl_bus_msg *m);
prl_status prl_msg_stop_decode(const prl_bus_msg *m, prl_msg_stop *x);

/* The sender refuses or failed message `ref` (always sent: 0 is an id too) and, with
** has_lease, lease `lease` (a worker refusing a work item). The encoder replaces control
** characters of the reason with spaces. */
typedef struct prl_msg_error {
    const char *reason;
    uint64_t ref, lease;
    int has_lease;
} prl_msg_error;
prl_status prl_msg_error_encode(const prl_msg_error *x, const char *run, uint64_t id,
                                prl_bus_msg *m);
prl_status prl_msg_error_decode(const prl_bus_msg *m, prl_msg_error *x);

/* The receiver accepted message `ref` (and lease `lease`: 0 = not given). */
typedef struct prl_msg_ack {
    uint64_t ref, lease;
} prl_msg_ack;
prl_status prl_msg_ack_encode(const prl_msg_ack *x, const char *run, uint64_t id, prl_bus_msg *m);
prl_status prl_msg_ack_decode(const prl_bus_msg *m, prl_msg_ack *x);

/* ---------------------------------------------------------------- rollout.c -------- */

enum {
    PRL_MSG_MAX_SAMPLES = 1024,   /* samples of one `work` item */
    PRL_MSG_MAX_SAMPLE = 1 << 20, /* a sample index */
    PRL_MSG_MAX_TOKENS = 1 << 20
}; /* tokens of one sample */

/* One work item for a rollout worker: `count` samples of prompt `prompt` of step `step`,
** from sample index `sample` on, with the policy version at `path`. */
typedef struct prl_msg_work {
    uint64_t lease, step, prompt, sample, count, policy_version;
    const char *path;
    const char *task;  /* encode: the task as JSON text */
    json_t *task_json; /* decode, owned: the task, a JSON object */
    int eval;          /* an in-run evaluation: sample 0 greedy, the others sampled */
} prl_msg_work;
prl_status prl_msg_work_encode(const prl_msg_work *x, const char *run, uint64_t id, prl_bus_msg *m);
prl_status prl_msg_work_decode(const prl_bus_msg *m, prl_msg_work *x);
void prl_msg_work_free(prl_msg_work *x);

/* One sample of a work item: its tokens (prompt then response), per response token the
** infer log-prob and the loss mask, the MoE route record, the model's turns. */
typedef struct prl_msg_result {
    uint64_t lease, step, prompt, sample, policy_version;
    int prompt_len; /* in [1, n_tokens) */
    uint64_t gen_us;
    int stop;              /* the sampler's stop reason */
    const int32_t *tokens; /* [n_tokens], ids >= 0, n_tokens <= PRL_MSG_MAX_TOKENS */
    size_t n_tokens;
    const float *logprobs; /* [n_tokens − prompt_len], finite, <= 0 */
    const uint8_t *mask;   /* [n_tokens − prompt_len], 0 or 1 */
    const uint8_t *routes; /* the route record (NULL: none), of shape route_shape */
    size_t routes_bytes;
    prl_route_shape route_shape;
    json_t *turns; /* the model's turns, [{role, content}...] (encode: borrowed;
                              ** decode: a view into meta) */
    int truncated; /* the last turn was cut off */
    int turns_played;
    int has_reward; /* a gateway episode whose harness posted its reward (docs/gateway.md): */
    double reward;  /* in [0, 1]; the sample needs no scoring */
    json_t *meta;   /* decode, owned: the meta frame */
    char routes_dropped[256]; /* decode: why a routes frame of a bad shape was dropped ("") */
} prl_msg_result;
prl_status prl_msg_result_encode(const prl_msg_result *x, const char *run, uint64_t id,
                                 prl_bus_msg *m);
prl_status prl_msg_result_decode(const prl_bus_msg *m, prl_msg_result *x);
void prl_msg_result_free(prl_msg_result *x);
/* The turns of an episode as the JSON array a result carries (new reference; NULL: no
** memory). */
json_t *prl_msg_turns_json(const prl_chat_message *msgs, int n);

/* ---------------------------------------------------------------- score.c ---------- */

/* The scoring of one sample, for a reward worker: the task and the model's turns. */
typedef struct prl_msg_score {
    uint64_t lease, step, prompt, sample;
    int truncated;          /* the episode's last turn was cut off (pays nothing) */
    const char *task;       /* the task as JSON text (encode: borrowed; decode: owned) */
    const char *turns;      /* encode: the turns as JSON text */
    json_t *turns_json;     /* decode, owned */
    prl_chat_message *msgs; /* decode, owned array: the turns (strings in turns_json) */
    size_t n_msgs;
    /* optional: the sample's token ids (prompt then response) and the prompt's length, for
    ** reward programs (frame `tokens`, field `prompt_len`; NULL / 0 when absent) */
    int32_t *tokens; /* encode: borrowed; decode: owned */
    size_t n_tokens;
    int prompt_len;
} prl_msg_score;
prl_status prl_msg_score_encode(const prl_msg_score *x, const char *run, uint64_t id,
                                prl_bus_msg *m);
prl_status prl_msg_score_decode(const prl_bus_msg *m, prl_msg_score *x);
void prl_msg_score_free(prl_msg_score *x);

/* A sample's reward: the verifier's result as JSON text with a "score" in [0, 1]. */
typedef struct prl_msg_scored {
    uint64_t lease, step, prompt, sample, score_us;
    const char *detail; /* encode: borrowed; decode: owned copy */
    double score;       /* decode */
    unsigned flags;     /* decode: the detail's "flags" */
} prl_msg_scored;
prl_status prl_msg_scored_encode(const prl_msg_scored *x, const char *run, uint64_t id,
                                 prl_bus_msg *m);
prl_status prl_msg_scored_decode(const prl_bus_msg *m, prl_msg_scored *x);
void prl_msg_scored_free(prl_msg_scored *x);

/* ---------------------------------------------------------------- train.c ---------- */

/* A step's samples for the trainer, at the policy version at `path`; with OPD the teacher
** frames too. */
typedef struct prl_msg_train {
    uint64_t lease, step, policy_version;
    const char *path;
    prl_grpo_batch batch; /* decode: owned, prl_grpo_batch_check'ed */
    int has_teachers;
    prl_opd_batch teachers; /* with has_teachers (decode: owned, prl_opd_batch_check'ed) */
} prl_msg_train;
prl_status prl_msg_train_encode(const prl_msg_train *x, const char *run, uint64_t id,
                                prl_bus_msg *m);
/* opd_topk: the job's opd.topk when the job distils (the teacher frames are then required),
** -1 when it does not (they are ignored). */
prl_status prl_msg_train_decode(const prl_bus_msg *m, int opd_topk, prl_msg_train *x);
void prl_msg_train_free(prl_msg_train *x);

/* The trainer committed `version` (step `step`'s update) at `path`. */
typedef struct prl_msg_trained {
    uint64_t lease, step, version, train_us, ckpt_checksum;
    const char *path;
    const char *metrics;  /* a JSON object (encode: borrowed; decode: owned copy) */
    json_t *metrics_json; /* decode, owned */
} prl_msg_trained;
prl_status prl_msg_trained_encode(const prl_msg_trained *x, const char *run, uint64_t id,
                                  prl_bus_msg *m);
prl_status prl_msg_trained_decode(const prl_bus_msg *m, prl_msg_trained *x);
void prl_msg_trained_free(prl_msg_trained *x);

/* The trainer announces a committed checkpoint. */
typedef struct prl_msg_weights {
    uint64_t version, ckpt_checksum;
    const char *path;
} prl_msg_weights;
prl_status prl_msg_weights_encode(const prl_msg_weights *x, const char *run, uint64_t id,
                                  prl_bus_msg *m);
prl_status prl_msg_weights_decode(const prl_bus_msg *m, prl_msg_weights *x);

/* ---------------------------------------------------------------- teach.c ---------- */

/* One teacher's samples of a step (OPD), for a teacher process: the item is a grpo batch of
** which tokens, offsets, prompt_lens and the loss mask travel. */
typedef struct prl_msg_teach {
    uint64_t lease, step;
    const char *teacher; /* a teacher key (prl_opd_teacher_key) */
    int teacher_index;   /* decode */
    const char *path;    /* the expert's checkpoint */
    prl_grpo_batch item; /* decode: owned, prl_grpo_batch_check'ed */
} prl_msg_teach;
prl_status prl_msg_teach_encode(const prl_msg_teach *x, const char *run, uint64_t id,
                                prl_bus_msg *m);
prl_status prl_msg_teach_decode(const prl_bus_msg *m, prl_msg_teach *x);
void prl_msg_teach_free(prl_msg_teach *x);

/* A teacher's answer: the expert's log-prob of every response token of the item (with
** opd.topk K also its top-k), its load and scoring times and peak RSS. */
typedef struct prl_msg_taught {
    uint64_t lease, step, load_us, teach_us, peak_rss_kb;
    int loaded; /* the expert was loaded for this item */
    const char *teacher;
    int teacher_index;     /* decode */
    const float *logprobs; /* [n_response] */
    size_t n_response;
    int topk;                /* K: 0 without the top-k frames */
    const int32_t *topk_ids; /* [n_response × K] or NULL */
    const float *topk_lp;    /* [n_response × K] or NULL */
} prl_msg_taught;
prl_status prl_msg_taught_encode(const prl_msg_taught *x, const char *run, uint64_t id,
                                 prl_bus_msg *m);
prl_status prl_msg_taught_decode(const prl_bus_msg *m, prl_msg_taught *x);
/* The answer's scores against the item it answers: n_response and K as the item and the
** job's opd.topk need, every value by prl_opd_batch_check; *out (owned; every sample of
** teacher x->teacher_index) holds them. Errors name the frame and the token. */
prl_status prl_msg_taught_scores(const prl_msg_taught *x, const prl_grpo_batch *item, int topk,
                                 prl_opd_batch *out);

/* ---------------------------------------------------------------- exec.c ----------- */

/* The sandbox service's wall maximum for one program (the sandbox's own, 3600 s). */
#define PRL_MSG_EXEC_MAX_WALL_MS 3600000u

/* Run one program in the sandbox service (the reply's ref is this message's id). */
typedef struct prl_msg_exec {
    const char *lang;    /* "python3" or "sh" */
    uint64_t wall_ms;    /* 1 .. PRL_MSG_EXEC_MAX_WALL_MS */
    const char *program; /* non-empty, no NUL byte (decode: a view, not NUL-terminated) */
    size_t program_len;
    const char *stdin_data;
    size_t stdin_len;
} prl_msg_exec;
prl_status prl_msg_exec_encode(const prl_msg_exec *x, const char *run, uint64_t id, prl_bus_msg *m);
prl_status prl_msg_exec_decode(const prl_bus_msg *m, prl_msg_exec *x);

/* The outcome of exec `ref`: a sandbox status name, the exit code, the outputs. */
typedef struct prl_msg_exec_result {
    uint64_t ref, exit_code, wall_us;
    const char *status;
    const char *out, *err; /* not NUL-terminated */
    size_t out_len, err_len;
} prl_msg_exec_result;
prl_status prl_msg_exec_result_encode(const prl_msg_exec_result *x, const char *run, uint64_t id,
                                      prl_bus_msg *m);
prl_status prl_msg_exec_result_decode(const prl_bus_msg *m, prl_msg_exec_result *x);

/* ---------------------------------------------------------------- fetch.c ---------- */

/* Weights over the bus: a version is fetched file by file (prl_msg_fetch_file(0..): NULL
** past the last) in chunks of at most PRL_MSG_CHUNK_MAX bytes. */
enum { PRL_MSG_CHUNK_MAX = 4 << 20 };
const char *prl_msg_fetch_file(int i);
typedef struct prl_msg_fetch {
    uint64_t version, offset, length; /* length 1..PRL_MSG_CHUNK_MAX */
    const char *file;                 /* one of prl_msg_fetch_file's */
} prl_msg_fetch;
prl_status prl_msg_fetch_encode(const prl_msg_fetch *x, const char *run, uint64_t id,
                                prl_bus_msg *m);
prl_status prl_msg_fetch_decode(const prl_bus_msg *m, prl_msg_fetch *x);

/* The answer to fetch `ref`: len bytes at offset of a file of `size` bytes (len 0: past its
** end), sum = prl_checksum64(data, len, 0), ckpt_checksum = the version's weights hash
** (prl_checkpoint_weights_hash, seed 0). */
typedef struct prl_msg_chunk {
    uint64_t ref, version, offset, size, sum, ckpt_checksum;
    const char *file;
    const void *data;
    size_t len;
} prl_msg_chunk;
prl_status prl_msg_chunk_encode(const prl_msg_chunk *x, const char *run, uint64_t id,
                                prl_bus_msg *m);
prl_status prl_msg_chunk_decode(const prl_bus_msg *m, prl_msg_chunk *x);

#endif /* PRL_MSG_H */
