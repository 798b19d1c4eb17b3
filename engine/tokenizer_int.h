/*
** tokenizer_int.h — private to the tokenizer's sources (engine/tokenizer*.c, see
** tokenizer.c): the tokenizer's state (struct prl_tokenizer), its hash maps, the per-call
** encoder, and the few functions one part calls in another. Include engine/engine.h from
** outside; the tokenizer's API is engine/tokenizer.h.
*/
#ifndef PRL_TOKENIZER_INT_H
#define PRL_TOKENIZER_INT_H

#include "engine/engine.h"

/* ============================================================ specials ================ */

/* Longest special string (strlen("<|/tool_call|>")); the parallel encoder's safety margin
** must exceed it (tokenizer_parallel.c). Checked against the table in the tests. */
enum { SPECIAL_MAX_LEN = 14 };

/* The special strings by id (tokenizer.h). */
extern const char *const tok__special_names[PRL_TOKENIZER_N_SPECIAL];

/* ============================================================ hashing ================= */

static inline uint64_t tok__pair_key(int32_t left, int32_t right)
{
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

/* (left, right) key -> int32 value; open addressing, linear probing. */
typedef struct pair_map {
    uint64_t *keys;
    int32_t *vals;
    size_t cap, n; /* cap is a power of two (or 0); n <= cap / 2 */
} pair_map;

/* Byte string (borrowed, must outlive the map) -> int64 value. */
typedef struct bytes_entry {
    const uint8_t *key; /* NULL = empty slot (empty strings are never stored) */
    size_t len;
    uint64_t hash;
    int64_t val;
} bytes_entry;

typedef struct bytes_map {
    bytes_entry *e;
    size_t cap, n;
} bytes_map;

/* ============================================================ vocabulary ============== */

struct prl_tokenizer {
    int32_t vocab_size;
    size_t *tok_off;    /* token id's bytes are tok_bytes[tok_off[id] .. tok_off[id + 1]) */
    uint8_t *tok_bytes; /* every token's bytes back to back (specials: their strings) */
    size_t tok_cap, bytes_cap, bytes_len;
    int32_t *merges; /* 3 per merge in rank order: left, right, result */
    size_t n_merges, merges_cap;
    pair_map ranks; /* tok__pair_key(left, right) -> rank (index into merges) */
};

static inline size_t tok__len(const prl_tokenizer *t, int32_t id)
{
    return t->tok_off[id + 1] - t->tok_off[id];
}

static inline const uint8_t *tok__ptr(const prl_tokenizer *t, int32_t id)
{
    return t->tok_bytes + t->tok_off[id];
}

/* ============================================================ encoder ================= */

/* Chunk cache: chunk bytes -> token ids, per encoder (so per call and per thread). Common
** words repeat, and a hit skips the merge loop. Bounded: when full it is simply cleared. */
enum {
    CACHE_SLOTS = 8192, /* hash slots (power of two) */
    CACHE_MAX_ENTRIES = 4096,
    CACHE_MAX_KEY = 32,   /* longer chunks are rare and mostly unique: not cached */
    CACHE_MIN_TEXT = 4096 /* shorter texts do not pay for the cache's allocation */
};

typedef struct cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len; /* key_len 0 = empty */
    uint32_t ids_off, n_ids;
} cache_slot;

typedef struct chunk_cache {
    cache_slot *slots;
    uint8_t *keys; /* CACHE_MAX_ENTRIES * CACHE_MAX_KEY bytes */
    int32_t *ids;  /* same count of ids: a chunk never has more tokens than bytes */
    uint32_t n, keys_len, ids_len;
} chunk_cache;

/* One heap entry of the fast merge loop: the pair starting at symbol `pos` has `rank`. */
typedef struct merge_entry {
    int32_t rank, pos;
} merge_entry;

typedef struct encoder {
    const prl_tokenizer *tok;
    unsigned flags;
    int32_t *ids;    /* output */
    uint8_t *starts; /* per output token: 1 if it begins a chunk (parallel windows only) */
    size_t n, cap;
    int want_starts;
    /* scratch for one chunk */
    int32_t *sym, *next, *prev;
    merge_entry *heap;
    size_t scratch_cap;
    chunk_cache cache; /* slots == NULL: no cache */
} encoder;

/* ---- tokenizer.c ---------------------------------------------------------------------- */

/* Position of the first special occurrence in t[from, len), or len; its id in *id. */
size_t tok__find_special(const uint8_t *t, size_t len, size_t from, int32_t *id);
uint64_t tok__hash_bytes(const uint8_t *p, size_t n);
void tok__pair_map_free(pair_map *m);
/* Value stored for key, or -1. */
int32_t tok__pair_map_get(const pair_map *m, uint64_t key);
/* The value slot of key, inserting it with value `init` if absent (*added = 1 then). */
prl_status tok__pair_map_upsert(pair_map *m, uint64_t key, int32_t init, int32_t **val, int *added);
void tok__bytes_map_free(bytes_map *m);
/* Entry for key (len > 0), inserted with value `init` if absent; valid until the next
** insertion. */
prl_status tok__bytes_map_upsert(bytes_map *m, const uint8_t *key, size_t len, int64_t init,
                                 bytes_entry **out, int *added);
/* Grow *buf (elements of `size` bytes, capacity *cap) to hold at least `need`; 0: no memory. */
int tok__grow_array(void *buf, size_t *cap, size_t need, size_t size);
/* Append a token with the given bytes; its id is the old vocab_size. */
prl_status tok__add_token(prl_tokenizer *t, const uint8_t *b, size_t n);
/* Append merge left + right -> result with the next rank (a ranked pair keeps its rank). */
prl_status tok__add_merge(prl_tokenizer *t, int32_t left, int32_t right, int32_t result);
/* A new tokenizer holding the 16 specials and the 256 bytes (ids as in tokenizer.h). */
prl_status tok__new_base(prl_tokenizer **out);

/* ---- tokenizer_encode.c --------------------------------------------------------------- */

void tok__encoder_free(encoder *e);
/* Set up an encoder; text_len sizes the first output buffer and decides on the cache. */
prl_status tok__encoder_init(encoder *e, const prl_tokenizer *tok, unsigned flags, size_t text_len,
                             int want_starts);
/* Append ids[0..n) of one chunk (the first begins the chunk). */
prl_status tok__encoder_emit(encoder *e, const int32_t *ids, size_t n);
/* Encode t[0..n) honouring e->flags (PRL_TOKENIZER_SPECIAL: specials cut the text). */
prl_status tok__encode_text(encoder *e, const uint8_t *t, size_t n);
/* The NULL checks of the encode entry points (fn names the caller); clears the outputs. */
prl_status tok__check_encode_args(const prl_tokenizer *tok, const void *text, size_t len,
                                  int32_t **ids, size_t *n_ids, const char *fn);
/* Hand the encoder's output to the caller (shrunk to fit) and free the rest. */
void tok__encoder_take(encoder *e, int32_t **ids, size_t *n_ids);

#endif /* PRL_TOKENIZER_INT_H */
