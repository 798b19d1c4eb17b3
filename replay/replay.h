/*
** replay.h — the one public header of replay/: MoE routing replay (shared/spec/rl.md §3,
** docs/replay.md).
**
** What it holds:
**   - the replay modes (none, R2, R3, Masked R3) and their names;
**   - the per-sample route record: its shape and the one check of it (record.c), the compact
**     form the rollout engine produces and run.db stores (prl_routes_pack, [rows][n_moe][K]
**     token-major, rows = tokens − 1), unpacked into
**     the engine's override layout [n_moe][rows][K] with every row checked (K distinct ids in
**     range — spec §3.3: a row with a duplicate or out-of-range id rejects the sample);
**   - the choice of the override row per (MoE layer, position): R2 replays the trainer's own
**     old-policy routes, R3 the recorded ones, Masked R3 the recorded ones only where
**     |I_train ∩ I_infer| / K ≥ τ and PRL_ROUTE_NATIVE elsewhere (spec §3.4);
**   - the routing metrics: overlap |I_train ∩ I_infer| / K, replayed share, and the routing
**     entropy of a layer's expert load with its collapse test;
**   - the Cached R3 route cache of a multi-turn episode: first-seen routes per position, never
**     overwritten by a later re-prefill, dropped from the first position whose token changed
**     (spec §3.5).
** What it does not do: run a model (the trainer and the rollout call the engine and hand the
** routes in), or pick gates — the engine recomputes them from the live router scores at the
** replayed ids (spec §3.2, prl_moe_gate_forward with forced ids).
**
** Ownership: arrays are the caller's unless a struct says it owns them (prl_route_cache).
*/
#ifndef PRL_REPLAY_H
#define PRL_REPLAY_H

#include "engine/engine.h"

/* ---------------------------------------------------------------- modes ------------ */

typedef enum prl_replay_mode {
    PRL_REPLAY_NONE = 0,     /* native routing everywhere (default) */
    PRL_REPLAY_R2 = 1,       /* the trainer's old-policy (lp_old pass) routes */
    PRL_REPLAY_R3 = 2,       /* the rollout engine's recorded routes */
    PRL_REPLAY_MASKED_R3 = 3 /* recorded routes where the overlap with native is >= τ */
} prl_replay_mode;

/* "none", "r2", "r3", "masked_r3" ↔ enum; a parse error lists the choices. */
const char *prl_replay_mode_name(prl_replay_mode m);
prl_status prl_replay_mode_parse(const char *s, prl_replay_mode *out);

/* ---------------------------------------------------------------- records ---------- */

/* The shape of one sample's compact route record: `rows` rows (row p is the route of token
** p, so at most the sequence's tokens − 1) of moe × k ids of `width` bytes (prl_routes_width
** of the model's experts). It travels beside the record's bytes (the `result` message's
** meta, the `train` message's fields, run.db's columns). */
typedef struct prl_route_shape {
    int rows, moe, k, width;
} prl_route_shape;

/* rows × moe × k × width (0 for a negative dimension). */
size_t prl_route_shape_bytes(const prl_route_shape *s);
/* The one check of a record's shape, wherever a record arrives: 1 <= rows <= n_tokens − 1,
** 1 <= moe <= PRL_MAX_LAYERS, 1 <= k <= 256, width 1 or 2, and `bytes` equal to
** prl_route_shape_bytes. PRL_ERR_FORMAT names what is wrong. */
prl_status prl_route_shape_check(const prl_route_shape *s, size_t bytes, size_t n_tokens);
/* The shape as the JSON array [rows, moe, k, width] (new reference; NULL out of memory) and
** back (PRL_ERR_FORMAT unless an array of four integers). */
struct json_t *prl_route_shape_json(const prl_route_shape *s);
prl_status prl_route_shape_from_json(const struct json_t *v, prl_route_shape *s);

/* |a ∩ b| of two rows of K expert ids, as sets (an id repeated in a counts once). */
int prl_replay_overlap(const int32_t *a, const int32_t *b, int K);

/* Unpack a compact record of `rows` rows × n_moe × K ids of `width` bytes (token-major, as
** stored) into out [n_moe][rows][K] (the engine's override layout). Errors (PRL_ERR_FORMAT,
** naming the position and layer): width other than prl_routes_width(E), an id outside
** [0, E), a row with a repeated id. `out` is then undefined. */
prl_status prl_replay_record_unpack(int32_t *out, const uint8_t *rec, int rows, int n_moe, int K,
                                    int width, int E);

/* ---------------------------------------------------------------- choosing --------- */

/* Routing metrics of one MoE layer, summed over the rows seen (prl_replay_choose). */
typedef struct prl_replay_layer_stats {
    double overlap; /* Σ |I_native ∩ I_recorded| / K over rows with a record */
    long compared;  /* rows with a record */
    long replayed;  /* rows whose override is not PRL_ROUTE_NATIVE */
    long rows;      /* rows seen */
} prl_replay_layer_stats;

/* The override rows of one MoE layer for `rows` positions: out[p] (K ids) is
**   none       PRL_ROUTE_NATIVE
**   R2         native[p]                       (the old-policy pass's own selection)
**   R3         recorded[p]
**   Masked R3  recorded[p] if |native[p] ∩ recorded[p]| / K >= tau, else PRL_ROUTE_NATIVE
** `recorded` may be NULL (no record: R3 and Masked R3 route natively). Adds the rows to *st
** (overlap of native against recorded whenever there is a record, in every mode). */
void prl_replay_choose(int32_t *out, const int32_t *native, const int32_t *recorded, int rows,
                       int K, prl_replay_mode mode, double tau, prl_replay_layer_stats *st);

/* ---------------------------------------------------------------- entropy ---------- */

/* counts[e] += slots of `rows` rows of K ids routed to expert e (ids must be in [0, E)). */
void prl_replay_count(double *counts, const int32_t *routes, int rows, int K);
/* Routing entropy of a layer's load: H = −Σ_e p_e ln p_e with p_e = counts[e] / Σ counts
** (0 when nothing was counted). Its maximum is ln E (uniform load). */
double prl_replay_entropy(const double *counts, int E);
/* 1 when H < fraction · ln E (a collapsed router), else 0; never with E < 2 or no counts. */
int prl_replay_entropy_alarm(const double *counts, int E, double fraction);

/* ---------------------------------------------------------------- Cached R3 -------- */

/* The first-seen routes of one multi-turn episode: row p holds the route record of token
** ids[p] as the inference engine produced it the first time position p went through it. */
typedef struct prl_route_cache {
    int32_t *ids;  /* [n] owned: the token id of each cached position */
    uint8_t *rows; /* [n × row_bytes] owned: compact routes, one row per position */
    int n, cap;
    size_t row_bytes; /* n_moe × K × width, fixed by the first merge */
} prl_route_cache;

typedef struct prl_route_cache_stats {
    int kept;      /* cached rows kept although the new pass covered them */
    int changed;   /* of those, rows where the new pass's routes differ (re-prefill drift) */
    int added;     /* rows first seen in this pass */
    int discarded; /* cached rows dropped because a token before or at them changed */
} prl_route_cache_stats;

void prl_route_cache_init(prl_route_cache *c);
void prl_route_cache_free(prl_route_cache *c);
/* Merge one inference pass over the sequence ids[0 .. n_ids): `routes` holds n_rows rows
** (n_rows <= n_ids) of row_bytes each, row p for position p. First the cache is cut at the
** first position p < min(n, n_ids) with ids[p] != the cached id (those rows are re-recorded
** from this pass); then rows [n, n_rows) are appended. A cached row is never overwritten.
** Errors: n_rows > n_ids, row_bytes differing from the cache's (PRL_ERR_ARG), no memory. */
prl_status prl_route_cache_merge(prl_route_cache *c, const int32_t *ids, int n_ids,
                                 const uint8_t *routes, int n_rows, size_t row_bytes,
                                 prl_route_cache_stats *st);

#endif /* PRL_REPLAY_H */
