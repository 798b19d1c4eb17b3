/*
** bus.h — the one public header of bus/: prl's message layer between its processes
** (controller, rollout, reward, sandbox, trainer, teacher), over ZeroMQ.
**
** A message on the wire is a multipart ZeroMQ message (docs/protocol.md has every detail):
**   frame 0     the type, a short ASCII token of a registry (the process's message types:
**               roles/msg/msg.h);
**   frame 1     a JSON header object: {"v": schema version, "type", "run", "id", the type's
**               own fields, "frames": [{"name", "dtype", "count"}...], "checksum": 16 hex
**               digits of prl_checksum64 chained over the binary frames};
**   frames 2..  binary payloads, little-endian, one per entry of "frames".
**
** Two layers:
**   - the codec (msg.c, codec.c, check.c): pure functions, no sockets, so it can be fuzzed.
**     prl_bus_decode validates everything (frame count, a type of the registry it is given,
**     header JSON and the types of its fields, schema version, sizes against dtype × count,
**     checksum, the per-type schema, size limits) and names what is wrong; prl_bus_encode
**     refuses a message its own decoder would reject. The bus knows no message type of its
**     own: each type's schema row, typed struct and checks live together in roles/msg/.
**   - sockets (socket.c): thin wrappers over libzmq for ROUTER/DEALER (work leasing with
**     worker identities) and PUB/SUB (announcements). Receiving validates every message,
**     logs and drops bad ones and returns only valid ones; bad input never aborts. Endpoints
**     are limited to ipc://, inproc:// and loopback tcp:// unless allow_remote is set.
**   - who may join (auth.c): a socket that binds with the run's secret accepts only peers
**     that present it (ZeroMQ PLAIN, checked by a ZAP handler before any message is
**     delivered); each message then names its sender's user ("worker" or "launcher").
**     Off loopback (curve.c) the socket is a CURVE server instead: only clients whose
**     public key is on its allow-list get in, and every byte on the wire is encrypted.
**
** Error model and ownership: functions return a prl_status (engine/engine.h) and set
** prl_error_message(). A prl_bus_msg owns its header fields and frame payloads from
** prl_bus_msg_init (or a successful prl_bus_decode / prl_bus_recv) until prl_bus_msg_free;
** payloads passed to prl_bus_msg_add_frame are copied. A prl_bus_wire owns its type and
** header text but borrows the payload frames from the message it was encoded from, which
** must outlive it. Every *_free accepts NULL or a zeroed struct.
**
** Byte order: payloads are little-endian; this code assumes a little-endian host (checked
** at compile time in codec.c).
*/
#ifndef PRL_BUS_H
#define PRL_BUS_H

#include "engine/engine.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- limits ----------- */

enum {
    PRL_BUS_VERSION = 1,                        /* the schema version this build speaks */
    PRL_BUS_TYPE_MAX = 16,                      /* type token: 1..15 bytes of [a-z_] */
    PRL_BUS_NAME_MAX = 32,                      /* frame name: 1..31 bytes of [A-Za-z0-9_] */
    PRL_BUS_MAX_FRAMES = 16,                    /* binary frames per message */
    PRL_BUS_MAX_PARTS = PRL_BUS_MAX_FRAMES + 2, /* with the type and header frames */
    PRL_BUS_MAX_HEADER_BYTES = 64 * 1024,
    PRL_BUS_MAX_HEADER_KEYS = 32,
    PRL_BUS_MAX_STRING = 1024 /* bytes of a string header field */
};
#define PRL_BUS_MAX_FRAME_BYTES ((size_t)64 << 20)  /* one binary frame: 64 MiB */
#define PRL_BUS_MAX_TOTAL_BYTES ((size_t)256 << 20) /* all binary frames: 256 MiB */

/* ---------------------------------------------------------------- messages --------- */

typedef enum prl_bus_dtype {
    PRL_BUS_I32 = 0,  /* "i32": int32 little-endian */
    PRL_BUS_F32 = 1,  /* "f32": IEEE-754 binary32 little-endian */
    PRL_BUS_U8 = 2,   /* "u8": unsigned bytes (e.g. MoE routes) */
    PRL_BUS_BYTES = 3 /* "bytes": opaque bytes (e.g. UTF-8 text) */
} prl_bus_dtype;

const char *prl_bus_dtype_name(prl_bus_dtype d); /* "i32"...; "?" if out of range */
size_t prl_bus_dtype_size(prl_bus_dtype d);      /* 4, 4, 1, 1; 0 if out of range */

typedef struct prl_bus_frame {
    char name[PRL_BUS_NAME_MAX];
    prl_bus_dtype dtype;
    size_t count; /* elements */
    size_t bytes; /* count × dtype size */
    void *data;   /* owned; NULL when bytes == 0 */
} prl_bus_frame;

struct prl_bus_type_spec;
typedef struct prl_bus_msg {
    char type[PRL_BUS_TYPE_MAX];
    const struct prl_bus_type_spec *spec; /* the type's schema (borrowed, static) */
    json_t *fields; /* owned JSON object: "run", "id" and the type's own fields */
    int n_frames;
    prl_bus_frame frames[PRL_BUS_MAX_FRAMES];
} prl_bus_msg;

/* Start a message of type `t` (NULL: an error, so that an unknown name found in a registry
** fails here) for run `run` with sender-assigned id `id`. */
prl_status prl_bus_msg_init(prl_bus_msg *m, const struct prl_bus_type_spec *t, const char *run,
                            uint64_t id);
void prl_bus_msg_free(prl_bus_msg *m);

/* Set a header field of the message's type (see the registry); the field's kind must match:
** uint fields take set_uint (<= INT64_MAX), string fields set_str (1..PRL_BUS_MAX_STRING-1
** bytes, no control characters), hex64 fields set_hex64. Reserved keys ("v", "type",
** "frames", "checksum") and keys the type does not have are refused. */
prl_status prl_bus_msg_set_uint(prl_bus_msg *m, const char *key, uint64_t v);
prl_status prl_bus_msg_set_str(prl_bus_msg *m, const char *key, const char *v);
prl_status prl_bus_msg_set_hex64(prl_bus_msg *m, const char *key, uint64_t v);
/* Read a header field ("run" and "id" included). Return PRL_ERR_ARG naming the key when it
** is absent or of another kind. get_str's result is owned by the message. */
prl_status prl_bus_msg_get_uint(const prl_bus_msg *m, const char *key, uint64_t *v);
prl_status prl_bus_msg_get_str(const prl_bus_msg *m, const char *key, const char **v);
prl_status prl_bus_msg_get_hex64(const prl_bus_msg *m, const char *key, uint64_t *v);

/* The envelope every message has: its run and its sender-assigned id ("" and 0 for a
** message that is not initialised). */
const char *prl_bus_msg_run(const prl_bus_msg *m);
uint64_t prl_bus_msg_id(const prl_bus_msg *m);

/* Append a binary frame: `count` elements of `dtype` copied from `data` (may be NULL when
** count is 0). Names are unique within a message. */
prl_status prl_bus_msg_add_frame(prl_bus_msg *m, const char *name, prl_bus_dtype dtype,
                                 const void *data, size_t count);
/* The frame called `name`, or NULL. */
const prl_bus_frame *prl_bus_msg_frame(const prl_bus_msg *m, const char *name);
/* The bytes frame `name` as a NUL-terminated string (malloc'd, caller frees); NULL with the
** error set when the frame is missing, not of dtype bytes, or holds a NUL byte. */
char *prl_bus_msg_text(const prl_bus_msg *m, const char *name);
/* 1 if type, header fields and frames (names, dtypes, bytes) are equal, else 0. */
int prl_bus_msg_equal(const prl_bus_msg *a, const prl_bus_msg *b);

/* ---------------------------------------------------------------- registry --------- */

typedef enum prl_bus_field_kind {
    PRL_BUS_FIELD_UINT = 0, /* JSON integer >= 0 */
    PRL_BUS_FIELD_STR = 1,  /* JSON string, 1..PRL_BUS_MAX_STRING-1 bytes, no control chars */
    PRL_BUS_FIELD_HEX64 = 2 /* JSON string of exactly 16 lowercase hex digits */
} prl_bus_field_kind;

typedef struct prl_bus_field_spec {
    const char *name;
    prl_bus_field_kind kind;
    int required;
} prl_bus_field_spec;

typedef struct prl_bus_frame_spec { /* a frame every message of the type must carry */
    const char *name;
    prl_bus_dtype dtype;
} prl_bus_frame_spec;

enum { PRL_BUS_SPEC_FIELDS = 10, PRL_BUS_SPEC_FRAMES = 4 };
typedef struct prl_bus_type_spec {
    const char *type;
    const char *doc;
    prl_bus_field_spec fields[PRL_BUS_SPEC_FIELDS]; /* ends at the first NULL name */
    prl_bus_frame_spec frames[PRL_BUS_SPEC_FRAMES]; /* ends at the first NULL name */
} prl_bus_type_spec;

/* The message types a process speaks (roles/msg/registry.c): a decoder accepts these only. */
typedef struct prl_bus_registry {
    const prl_bus_type_spec *const *types;
    int n;
} prl_bus_registry;

/* The spec of `type` in r (NULL if unknown). */
const prl_bus_type_spec *prl_bus_registry_find(const prl_bus_registry *r, const char *type);

/* ---------------------------------------------------------------- codec ------------ */

typedef struct prl_bus_part { /* one frame of a multipart message, borrowed */
    const void *data;
    size_t len;
} prl_bus_part;

typedef struct prl_bus_wire {
    int n;                                 /* parts used */
    prl_bus_part parts[PRL_BUS_MAX_PARTS]; /* 0: type, 1: header, 2..: the msg's payloads */
    char *header;                          /* owned JSON text behind parts[1] */
    char type[PRL_BUS_TYPE_MAX];           /* owned text behind parts[0] */
} prl_bus_wire;

/* Encode `m` into frames. Validates first: a message decode would reject is refused with
** the same reason. `w` borrows m's payloads. */
prl_status prl_bus_encode(const prl_bus_msg *m, prl_bus_wire *w);
void prl_bus_wire_free(prl_bus_wire *w);

/* Validate and decode `n` frames of a type of `reg` into `out` (initialised here; free it with prl_bus_msg_free
** on success; on failure it is left empty). On failure returns PRL_ERR_FORMAT (or
** PRL_ERR_CHECKSUM, PRL_ERR_UNSUPPORTED for a newer schema version, PRL_ERR_NOMEM) and
** writes a reason naming the frame or field into reason[reason_size] (and the error
** message). reason may be NULL. */
prl_status prl_bus_decode(const prl_bus_registry *reg, const prl_bus_part *parts, int n,
                          prl_bus_msg *out, char *reason, size_t reason_size);

/* The checksum of a message's payloads: prl_checksum64 chained over the frames in order
** (seed 0 for the first; each result seeds the next). */
uint64_t prl_bus_checksum(const prl_bus_part *frames, int n);

/* ---------------------------------------------------------------- sockets ---------- */

typedef enum prl_bus_kind {
    PRL_BUS_ROUTER = 0, /* the controller: many workers, replies by identity */
    PRL_BUS_DEALER = 1, /* a worker */
    PRL_BUS_PUB = 2,    /* announcements (weights) */
    PRL_BUS_SUB = 3     /* subscribes to everything */
} prl_bus_kind;

/* ---------------------------------------------------------------- log limit -------- */

/* Log lines about bad messages, rate-limited (log_limit.c): of one kind (one limit each), the
** first PRL_BUS_LOG_BURST are written, then at most one a second. The lines held back are
** counted and said in one line, "held back: N more 'KIND' lines ...", written before the next
** line of the kind and at the end (prl_bus_log_limit_held_line), so a log still accounts for
** every message. Zero-initialise. */
enum { PRL_BUS_LOG_BURST = 20 };
typedef struct prl_bus_log_limit {
    uint64_t written, held; /* lines written; lines held back since the last written one */
    double last;            /* when the last one was written (prl_now) */
} prl_bus_log_limit;
/* 1 when a line may be written at time `now`; then *held is what was held back before it
** (write prl_bus_log_held_line first when it is not 0). 0: the line is held back (counted). */
int prl_bus_log_limit_take(prl_bus_log_limit *l, double now, uint64_t *held);
/* The "held back" line of `held` lines of `kind` into out[n]. */
void prl_bus_log_held_line(uint64_t held, const char *kind, char *out, size_t n);
/* At the end: 1 with the "held back" line of what is still held into out[n] (and the count
** reset), 0 when nothing is held. */
int prl_bus_log_limit_held_line(prl_bus_log_limit *l, const char *kind, char *out, size_t n);

/* A log line sink ("bus[controller]: dropped message from peer 00a1b2c3d4: header field
** 'step' must be a non-negative integer"). */
typedef void (*prl_bus_log_fn)(void *ctx, const char *line);

typedef struct prl_bus_socket_options {
    int bind;             /* 1: bind, 0: connect */
    int allow_remote;     /* 1: allow tcp:// hosts other than loopback */
    const char *identity; /* DEALER routing id (NULL: libzmq picks one) */
    const char *name;     /* log prefix, e.g. the role ("bus" if NULL) */
    prl_bus_log_fn log;   /* NULL: stderr */
    void *log_ctx;
    int send_timeout_ms;              /* blocking send limit (default 5000; -1 forever) */
    const prl_bus_registry *registry; /* the types received (required, but for PUB) */
    /* Authentication (auth.c), PRL_BUS_SECRET_HEX hex digits each; NULL: none. Connect:
    ** present `secret` as `user` ("worker" if NULL). Bind: refuse every peer that does not
    ** present `secret` as "worker" or `launcher_secret` (when set) as "launcher". */
    const char *secret;
    const char *user;
    const char *launcher_secret;
    /* CURVE (curve.c), required on a tcp:// endpoint off loopback: this socket's keypair;
    ** connect: the server's public key too; bind: the clients it accepts (user "worker").
    ** With both a secret and a keypair, the keypair is used. */
    const struct prl_bus_curve_keypair *curve;
    const char *curve_server;                      /* Z85 */
    const struct prl_bus_curve_allow *curve_allow; /* copied at open */
} prl_bus_socket_options;

void prl_bus_socket_options_default(prl_bus_socket_options *o);

/* The sender of a message received on a ROUTER (its routing id), or the destination of one
** sent from it. */
typedef struct prl_bus_peer {
    size_t len;
    unsigned char id[255];
    char user[16]; /* received: the sender's authenticated user ("" on a socket without auth) */
} prl_bus_peer;

typedef struct prl_bus_socket prl_bus_socket;

/* Check an endpoint against the policy: ipc://PATH, inproc://NAME, tcp://127.0.0.1:PORT,
** tcp://localhost:PORT, tcp://[::1]:PORT (PORT may be * for bind); other tcp hosts only
** with allow_remote. PRL_ERR_ARG names what is wrong. */
prl_status prl_bus_endpoint_check(const char *endpoint, int allow_remote);
/* 1 when the endpoint passes the policy without allow_remote (ipc, inproc, loopback tcp). */
int prl_bus_endpoint_local(const char *endpoint);

/* Open a socket of `kind` and bind or connect it to `endpoint` (opt NULL: defaults, i.e.
** connect). One process-wide ZeroMQ context is created on first use. */
prl_status prl_bus_socket_open(prl_bus_socket **out, prl_bus_kind kind, const char *endpoint,
                               const prl_bus_socket_options *opt);
void prl_bus_socket_free(prl_bus_socket *s);
/* The endpoint really bound (tcp://127.0.0.1:* resolves to the chosen port). */
const char *prl_bus_socket_endpoint(const prl_bus_socket *s);
/* Messages dropped as invalid since the socket was opened. */
uint64_t prl_bus_socket_dropped(const prl_bus_socket *s);
/* The underlying zmq socket (tests send raw frames through it). */
void *prl_bus_socket_raw(prl_bus_socket *s);

/* Send `m` (encoded and validated first). On a ROUTER `to` names the peer (required; an
** unknown peer is an error); elsewhere `to` must be NULL. */
prl_status prl_bus_send(prl_bus_socket *s, const prl_bus_peer *to, const prl_bus_msg *m);

/* Wait up to timeout_ms (-1: forever, 0: do not wait) for a valid message. Invalid ones are
** logged with their reason, counted and dropped, and the wait goes on until the deadline.
** On PRL_OK, *got is 1 and `out` holds the message (free it) and `from` (may be NULL) the
** sender on a ROUTER; or *got is 0 on timeout. Errors are socket failures only. */
prl_status prl_bus_recv(prl_bus_socket *s, int timeout_ms, prl_bus_msg *out, prl_bus_peer *from,
                        int *got);

/* ---------------------------------------------------------------- who may join ---- */

/* A run's secret: PRL_BUS_SECRET_HEX lowercase hex digits (256 random bits), kept in
** RUN_DIR/bus.key, mode 0600. */
enum { PRL_BUS_SECRET_HEX = 64 };
typedef struct prl_bus_secret {
    char hex[PRL_BUS_SECRET_HEX + 1];
} prl_bus_secret;
/* Create key file `path` with a fresh secret (getrandom), mode 0600; PRL_ERR_IO if it
** exists or cannot be written (then nothing is left behind). */
prl_status prl_bus_key_create(const char *path);
/* Read key file `path`: a regular file (not a link) that only its owner can read, holding
** the secret and an optional newline; the error names what is wrong. */
prl_status prl_bus_key_load(const char *path, prl_bus_secret *out);
/* Load `path`, creating it first when it does not exist (a run's first start). */
prl_status prl_bus_key_ensure(const char *path, prl_bus_secret *out);
/* The key file of the run whose socket is ipc://DIR/NAME: DIR/bus.key; PRL_ERR_ARG (asking
** for --key) when the endpoint names no directory. */
prl_status prl_bus_key_path_for(const char *endpoint, char *out, size_t n);
/* 1 when s is a well-formed secret. */
int prl_bus_secret_ok(const char *s);

/* ---------------------------------------------------------------- hosts elsewhere - */

/* CURVE keys (curve.c): Z85 text of 32-byte keys. */
enum { PRL_BUS_CURVE_Z85 = 40, PRL_BUS_CURVE_MAX_CLIENTS = 4096 };
typedef struct prl_bus_curve_keypair {
    char public_z85[PRL_BUS_CURVE_Z85 + 1];
    char secret_z85[PRL_BUS_CURVE_Z85 + 1];
} prl_bus_curve_keypair;
typedef struct prl_bus_curve_key {
    char z85[PRL_BUS_CURVE_Z85 + 1];
} prl_bus_curve_key;
typedef struct prl_bus_curve_allow { /* the client public keys a binding socket accepts */
    int n;
    prl_bus_curve_key *keys; /* owned */
} prl_bus_curve_allow;

/* PRL_OK when libzmq has CURVE (zmq_has("curve")); PRL_ERR_UNSUPPORTED saying so. */
prl_status prl_bus_curve_available(void);
/* A new keypair in directory `dir`: public.key (0644) and secret.key (0600), each one Z85
** line. Refused (nothing written) when either exists. out may be NULL. */
prl_status prl_bus_curve_generate(const char *dir, prl_bus_curve_keypair *out);
/* Read the keypair of `dir` (secret.key readable by its owner only; the two must match). */
prl_status prl_bus_curve_load(const char *dir, prl_bus_curve_keypair *out);
/* Read a public key file (one Z85 line), e.g. the controller's public.key. */
prl_status prl_bus_curve_public_load(const char *path, char out[PRL_BUS_CURVE_Z85 + 1]);
/* 1 when z85 is a well-formed key. */
int prl_bus_curve_key_ok(const char *z85);
/* Read an allow-list: one Z85 public key a line ('#' comments, blank lines; text after the
** key is a comment); errors name the file and line. Free with prl_bus_curve_allow_free. */
prl_status prl_bus_curve_allow_load(const char *path, prl_bus_curve_allow *out);
void prl_bus_curve_allow_free(prl_bus_curve_allow *a);
/* 1 when the 32-byte key is on the list. */
int prl_bus_curve_allow_has(const prl_bus_curve_allow *a, const uint8_t key[32]);

/* Bind socket `s` (opened with bind = 1) to one more endpoint, as a CURVE server with
** keypair kp accepting the clients of `allow` (user "worker"): the controller's ipc:// socket
** also listening on tcp:// for other hosts. The first endpoint keeps its mechanism. kp NULL:
** a loopback endpoint with the socket's own mechanism (PLAIN with the run's secret). */
prl_status prl_bus_socket_bind_curve(prl_bus_socket *s, const char *endpoint,
                                     const prl_bus_curve_keypair *kp,
                                     const prl_bus_curve_allow *allow);
/* Replace the CURVE clients a binding socket accepts (an allow-list file read again). */
prl_status prl_bus_socket_allow_curve(prl_bus_socket *s, const prl_bus_curve_allow *allow);

/* Terminate the process-wide context; call only after every socket is freed. */
void prl_bus_shutdown(void);

#endif /* PRL_BUS_H */
