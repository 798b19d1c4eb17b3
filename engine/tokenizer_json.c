/*
** tokenizer.c — prl's byte-level BPE tokenizer (API and exact rules in tokenizer.h).
**
** What is here, in file order: hash maps; the vocabulary; pre-tokenization; the encoder
** (cached heap BPE and the naive reference loop); decode; the multi-threaded window encoder;
** the trainer; chat encoding for SFT; tokenizer.json save/load (format in docs/formats.md).
** What is not: Unicode normalisation (the tokenizer sees bytes only), datasets, batching.
**
** Threads: a prl_tokenizer is never written after construction; all mutable encoding state
** (scratch buffers, the chunk cache) lives in a per-call `encoder`, so concurrent calls on
** one tokenizer need no locks.
*/
#include "engine/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ============================================================ specials ================ */

static const char *const special_names[PRL_TOKENIZER_N_SPECIAL] = {
    "<|pad|>",       "<|bos|>",        "<|eos|>",        "<|system|>",
    "<|user|>",      "<|assistant|>",  "<|tool|>",       "<|end|>",
    "<|tool_call|>", "<|/tool_call|>", "<|think|>",      "<|/think|>",
    "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>", "<|reserved_3|>"};

/* Longest special string (strlen("<|/tool_call|>")); the parallel encoder's safety margin
** must exceed it (see parallel section). Checked against the table in the tests. */
enum { SPECIAL_MAX_LEN = 14 };

int32_t prl_tokenizer_special_id(const char *name)
{
    if (!name) return -1;
    for (int32_t i = 0; i < PRL_TOKENIZER_N_SPECIAL; i++)
        if (strcmp(name, special_names[i]) == 0) return i;
    return -1;
}

const char *prl_tokenizer_special_name(int32_t id)
{
    return id >= 0 && id < PRL_TOKENIZER_N_SPECIAL ? special_names[id] : NULL;
}

/* The special whose string starts at t[0..avail), or -1. Specials all look like "<|...|>"
** with no '<' inside, so two occurrences can never overlap and a left-to-right scan finds
** every one: whether a special starts at p depends only on t[p .. p + SPECIAL_MAX_LEN). */
static int32_t special_at(const uint8_t *t, size_t avail)
{
    if (avail < 4 || t[0] != '<' || t[1] != '|') return -1;
    for (int32_t i = 0; i < PRL_TOKENIZER_N_SPECIAL; i++) {
        size_t n = strlen(special_names[i]);
        if (n <= avail && memcmp(t, special_names[i], n) == 0) return i;
    }
    return -1;
}

/* Position of the first special occurrence in t[from, len), or len; its id in *id. */
static size_t find_special(const uint8_t *t, size_t len, size_t from, int32_t *id)
{
    for (size_t p = from; p < len;) {
        const uint8_t *q = memchr(t + p, '<', len - p);
        if (!q) break;
        p = (size_t)(q - t);
        if ((*id = special_at(q, len - p)) >= 0) return p;
        p++;
    }
    *id = -1;
    return len;
}

/* ============================================================ hashing ================= */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix64(h ^ w);
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return mix64(h ^ w ^ 0x5851f42d4c957f2dULL);
}

static uint64_t pair_key(int32_t left, int32_t right)
{
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

/* ---- pair map: (left, right) key -> int32 value; open addressing, linear probing ------ */

#define PAIR_EMPTY UINT64_MAX /* no key: ids are < 2^31, so a real key never has it */

typedef struct pair_map {
    uint64_t *keys;
    int32_t *vals;
    size_t cap, n; /* cap is a power of two (or 0); n <= cap / 2 */
} pair_map;

static void pair_map_free(pair_map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t pair_map_slot(const pair_map *m, uint64_t key)
{
    size_t mask = m->cap - 1, i = (size_t)mix64(key) & mask;
    while (m->keys[i] != PAIR_EMPTY && m->keys[i] != key) i = (i + 1) & mask;
    return i;
}

/* Value stored for key, or -1. */
static int32_t pair_map_get(const pair_map *m, uint64_t key)
{
    if (!m->cap) return -1;
    size_t i = pair_map_slot(m, key);
    return m->keys[i] == key ? m->vals[i] : -1;
}

static prl_status pair_map_grow(pair_map *m)
{
    pair_map g = {0};
    g.cap = m->cap ? m->cap * 2 : 64;
    g.keys = malloc(g.cap * sizeof *g.keys);
    g.vals = malloc(g.cap * sizeof *g.vals);
    if (!g.keys || !g.vals) {
        pair_map_free(&g);
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory growing a pair map");
    }
    memset(g.keys, 0xff, g.cap * sizeof *g.keys);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == PAIR_EMPTY) continue;
        size_t j = pair_map_slot(&g, m->keys[i]);
        g.keys[j] = m->keys[i];
        g.vals[j] = m->vals[i];
    }
    g.n = m->n;
    pair_map_free(m);
    *m = g;
    return PRL_OK;
}

/* The value slot of key, inserting it with value `init` if absent (*added = 1 then). */
static prl_status pair_map_upsert(pair_map *m, uint64_t key, int32_t init, int32_t **val,
                                  int *added)
{
    if ((m->n + 1) * 2 > m->cap) {
        prl_status rc = pair_map_grow(m);
        if (rc) return rc;
    }
    size_t i = pair_map_slot(m, key);
    *added = m->keys[i] == PAIR_EMPTY;
    if (*added) {
        m->keys[i] = key;
        m->vals[i] = init;
        m->n++;
    }
    *val = &m->vals[i];
    return PRL_OK;
}

/* ---- bytes map: byte string (borrowed, must outlive the map) -> int64 value ----------- */

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

static void bytes_map_free(bytes_map *m)
{
    free(m->e);
    memset(m, 0, sizeof *m);
}

static size_t bytes_map_slot(const bytes_map *m, const uint8_t *key, size_t len, uint64_t h)
{
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (m->e[i].key &&
           !(m->e[i].hash == h && m->e[i].len == len && memcmp(m->e[i].key, key, len) == 0))
        i = (i + 1) & mask;
    return i;
}

static prl_status bytes_map_grow(bytes_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    bytes_entry *e = calloc(cap, sizeof *e);
    if (!e) return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory growing a map");
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].key) continue;
        size_t j = (size_t)m->e[i].hash & (cap - 1);
        while (e[j].key) j = (j + 1) & (cap - 1);
        e[j] = m->e[i];
    }
    free(m->e);
    m->e = e;
    m->cap = cap;
    return PRL_OK;
}

/* Entry for key (len > 0), inserted with value `init` if absent. The pointer is valid until
** the next insertion. */
static prl_status bytes_map_upsert(bytes_map *m, const uint8_t *key, size_t len, int64_t init,
                                   bytes_entry **out, int *added)
{
    if ((m->n + 1) * 2 > m->cap) {
        prl_status rc = bytes_map_grow(m);
        if (rc) return rc;
    }
    uint64_t h = hash_bytes(key, len);
    size_t i = bytes_map_slot(m, key, len, h);
    *added = m->e[i].key == NULL;
    if (*added) {
        m->e[i] = (bytes_entry){key, len, h, init};
        m->n++;
    }
    *out = &m->e[i];
    return PRL_OK;
}

/* ============================================================ vocabulary ============== */

struct prl_tokenizer {
    int32_t vocab_size;
    size_t *tok_off;    /* token id's bytes are tok_bytes[tok_off[id] .. tok_off[id + 1]) */
    uint8_t *tok_bytes; /* every token's bytes back to back (specials: their strings) */
    size_t tok_cap, bytes_cap, bytes_len;
    int32_t *merges; /* 3 per merge in rank order: left, right, result */
    size_t n_merges, merges_cap;
    pair_map ranks; /* pair_key(left, right) -> rank (index into merges) */
};

void prl_tokenizer_free(prl_tokenizer *tok)
{
    if (!tok) return;
    free(tok->tok_off);
    free(tok->tok_bytes);
    free(tok->merges);
    pair_map_free(&tok->ranks);
    free(tok);
}

static size_t tok_len(const prl_tokenizer *t, int32_t id)
{
    return t->tok_off[id + 1] - t->tok_off[id];
}

static const uint8_t *tok_ptr(const prl_tokenizer *t, int32_t id)
{
    return t->tok_bytes + t->tok_off[id];
}

/* Append a token with the given bytes; its id is the old vocab_size. */
static prl_status tok_add_token(prl_tokenizer *t, const uint8_t *b, size_t n)
{
    if ((size_t)t->vocab_size + 2 > t->tok_cap) {
        size_t cap = t->tok_cap ? t->tok_cap * 2 : 512;
        size_t *off = realloc(t->tok_off, cap * sizeof *off);
        if (!off) return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory (vocab)");
        t->tok_off = off;
        t->tok_cap = cap;
    }
    if (t->bytes_len + n > t->bytes_cap) {
        size_t cap = t->bytes_cap ? t->bytes_cap * 2 : 4096;
        while (cap < t->bytes_len + n) cap *= 2;
        uint8_t *bytes = realloc(t->tok_bytes, cap);
        if (!bytes) return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory (vocab)");
        t->tok_bytes = bytes;
        t->bytes_cap = cap;
    }
    memcpy(t->tok_bytes + t->bytes_len, b, n);
    t->tok_off[t->vocab_size] = t->bytes_len;
    t->bytes_len += n;
    t->tok_off[++t->vocab_size] = t->bytes_len;
    return PRL_OK;
}

/* Append merge left + right -> result (all existing ids) with the next rank. A pair that is
** already ranked keeps its first rank: the encoder could never apply the later one. */
static prl_status tok_add_merge(prl_tokenizer *t, int32_t left, int32_t right, int32_t result)
{
    if (t->n_merges == t->merges_cap) {
        size_t cap = t->merges_cap ? t->merges_cap * 2 : 256;
        int32_t *m = realloc(t->merges, cap * 3 * sizeof *m);
        if (!m) return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory (merges)");
        t->merges = m;
        t->merges_cap = cap;
    }
    int32_t *slot;
    int added;
    prl_status rc =
        pair_map_upsert(&t->ranks, pair_key(left, right), (int32_t)t->n_merges, &slot, &added);
    if (rc) return rc;
    int32_t *m = t->merges + 3 * t->n_merges++;
    m[0] = left, m[1] = right, m[2] = result;
    return PRL_OK;
}

/* A new tokenizer holding the 16 specials and the 256 bytes (ids as in tokenizer.h). */
static prl_status tok_new_base(prl_tokenizer **out)
{
    prl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory");
    prl_status rc = PRL_OK;
    for (int i = 0; i < PRL_TOKENIZER_N_SPECIAL && !rc; i++)
        rc = tok_add_token(t, (const uint8_t *)special_names[i], strlen(special_names[i]));
    for (int b = 0; b < 256 && !rc; b++) {
        uint8_t byte = (uint8_t)b;
        rc = tok_add_token(t, &byte, 1);
    }
    if (rc) {
        prl_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return PRL_OK;
}

prl_status prl_tokenizer_init_bytes(prl_tokenizer **out)
{
    if (!out) return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_init_bytes: out is NULL");
    *out = NULL;
    return tok_new_base(out);
}

int32_t prl_tokenizer_vocab_size(const prl_tokenizer *tok) { return tok ? tok->vocab_size : 0; }

size_t prl_tokenizer_n_merges(const prl_tokenizer *tok) { return tok ? tok->n_merges : 0; }

prl_status prl_tokenizer_merge(const prl_tokenizer *tok, size_t rank, int32_t *left,
                               int32_t *right, int32_t *result)
{
    if (!tok || rank >= tok->n_merges)
        return prl_error_set(PRL_ERR_RANGE, "tokenizer: merge rank %zu out of range [0, %zu)",
                             rank, tok ? tok->n_merges : 0);
    const int32_t *m = tok->merges + 3 * rank;
    if (left) *left = m[0];
    if (right) *right = m[1];
    if (result) *result = m[2];
    return PRL_OK;
}

prl_status prl_tokenizer_token_bytes(const prl_tokenizer *tok, int32_t id,
                                     const uint8_t **bytes, size_t *len)
{
    if (!tok || id < 0 || id >= tok->vocab_size)
        return prl_error_set(PRL_ERR_RANGE, "tokenizer: token id %d outside the vocabulary "
                             "[0, %d)", (int)id, tok ? (int)tok->vocab_size : 0);
    if (bytes) *bytes = tok_ptr(tok, id);
    if (len) *len = tok_len(tok, id);
    return PRL_OK;
}

/* ============================================================ pre-tokenization ======== */

enum { CL_D = 'D', CL_L = 'L', CL_W = 'W', CL_P = 'P' }; /* byte classes of tokenizer.h */

/* Classes of the ASCII bytes, 32 per line (0x00.., 0x20.., 0x40.., 0x60..); every byte
** >= 0x80 is a letter. A table because this runs once or twice per input byte. */
static const char ascii_class[129] =
    "PPPPPPPPPWWWWWPPPPPPPPPPPPPPPPPP"
    "WPPPPPPPPPPPPPPPDDDDDDDDDDPPPPPP"
    "PLLLLLLLLLLLLLLLLLLLLLLLLLLPPPPP"
    "PLLLLLLLLLLLLLLLLLLLLLLLLLLPPPPP";

static int byte_class(uint8_t c)
{
    return c >= 0x80 ? CL_L : ascii_class[c];
}

/* Rule of tokenizer.h: is there a chunk boundary before t[p], 0 < p < n? Reads only
** t[p-1], t[p] and t[p+1] (and whether p + 1 < n): the parallel encoder depends on this. */
static int is_boundary(const uint8_t *t, size_t n, size_t p)
{
    int a = byte_class(t[p - 1]), b = byte_class(t[p]);
    if (a == CL_D || b == CL_D) return 1;
    if (a == CL_W && b == CL_W) {
        if (t[p] != ' ' || p + 1 >= n) return 0;
        int c = byte_class(t[p + 1]);
        return c == CL_L || c == CL_P;
    }
    if (t[p - 1] == ' ' && (b == CL_L || b == CL_P)) return 0;
    return a != b;
}

size_t prl_tokenizer_chunk_end(const void *text, size_t len, size_t pos)
{
    const uint8_t *t = text;
    if (pos >= len) return len;
    size_t p = pos + 1;
    while (p < len && !is_boundary(t, len, p)) p++;
    return p;
}

/* ============================================================ encoder ================= */

/* Chunk cache: chunk bytes -> token ids, per encoder (so per call and per thread). Common
** words repeat, and a hit skips the merge loop. Bounded: when full it is simply cleared. */
enum {
    CACHE_SLOTS = 8192,     /* hash slots (power of two) */
    CACHE_MAX_ENTRIES = 4096,
    CACHE_MAX_KEY = 32,     /* longer chunks are rare and mostly unique: not cached */
    CACHE_MIN_TEXT = 4096   /* shorter texts do not pay for the cache's allocation */
};

typedef struct cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len; /* key_len 0 = empty */
    uint32_t ids_off, n_ids;
} cache_slot;

typedef struct chunk_cache {
    cache_slot *slots;
    uint8_t *keys;  /* CACHE_MAX_ENTRIES * CACHE_MAX_KEY bytes */
    int32_t *ids;   /* same count of ids: a chunk never has more tokens than bytes */
    uint32_t n, keys_len, ids_len;
} chunk_cache;

/* One heap entry of the fast merge loop: the pair starting at symbol `pos` has `rank`. */
typedef struct merge_entry {
    int32_t rank, pos;
} merge_entry;

typedef struct encoder {
    const prl_tokenizer *tok;
    unsigned flags;
    int32_t *ids;       /* output */
    uint8_t *starts;    /* per output token: 1 if it begins a chunk (parallel windows only) */
    size_t n, cap;
    int want_starts;
    /* scratch for one chunk */
    int32_t *sym, *next, *prev;
    merge_entry *heap;
    size_t scratch_cap;
    chunk_cache cache; /* slots == NULL: no cache */
} encoder;

static void encoder_free(encoder *e)
{
    free(e->ids);
    free(e->starts);
    free(e->sym);
    free(e->next);
    free(e->prev);
    free(e->heap);
    free(e->cache.slots);
    free(e->cache.keys);
    free(e->cache.ids);
    memset(e, 0, sizeof *e);
}

/* Set up an encoder. text_len sizes the first output buffer and decides whether the cache
** is worth allocating. */
static prl_status encoder_init(encoder *e, const prl_tokenizer *tok, unsigned flags,
                               size_t text_len, int want_starts)
{
    memset(e, 0, sizeof *e);
    e->tok = tok;
    e->flags = flags;
    e->want_starts = want_starts;
    e->cap = text_len / 3 + 16;
    e->ids = malloc(e->cap * sizeof *e->ids);
    e->starts = want_starts ? malloc(e->cap) : NULL;
    int nomem = !e->ids || (want_starts && !e->starts);
    if (!nomem && !(flags & PRL_TOKENIZER_NAIVE) && text_len >= CACHE_MIN_TEXT &&
        tok->n_merges > 0) {
        chunk_cache *c = &e->cache;
        c->slots = calloc(CACHE_SLOTS, sizeof *c->slots);
        c->keys = malloc((size_t)CACHE_MAX_ENTRIES * CACHE_MAX_KEY);
        c->ids = malloc((size_t)CACHE_MAX_ENTRIES * CACHE_MAX_KEY * sizeof *c->ids);
        nomem = !c->slots || !c->keys || !c->ids;
    }
    if (nomem) {
        encoder_free(e);
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer encode: out of memory (%zu bytes)",
                             text_len);
    }
    return PRL_OK;
}

static prl_status encoder_reserve(encoder *e, size_t extra)
{
    if (e->n + extra <= e->cap) return PRL_OK;
    size_t cap = e->cap * 2;
    while (cap < e->n + extra) cap *= 2;
    int32_t *ids = realloc(e->ids, cap * sizeof *ids);
    if (ids) e->ids = ids;
    if (!ids) return prl_error_set(PRL_ERR_NOMEM, "tokenizer encode: out of memory");
    if (e->want_starts) {
        uint8_t *st = realloc(e->starts, cap);
        if (!st) return prl_error_set(PRL_ERR_NOMEM, "tokenizer encode: out of memory");
        e->starts = st;
    }
    e->cap = cap;
    return PRL_OK;
}

/* Append ids[0..n) of one chunk (the first begins the chunk). */
static prl_status encoder_emit(encoder *e, const int32_t *ids, size_t n)
{
    prl_status rc = encoder_reserve(e, n);
    if (rc) return rc;
    memcpy(e->ids + e->n, ids, n * sizeof *ids);
    if (e->want_starts) {
        memset(e->starts + e->n, 0, n);
        e->starts[e->n] = 1;
    }
    e->n += n;
    return PRL_OK;
}

static prl_status encoder_scratch(encoder *e, size_t m)
{
    if (m <= e->scratch_cap) return PRL_OK;
    size_t cap = e->scratch_cap ? e->scratch_cap : 64;
    while (cap < m) cap *= 2;
    free(e->sym), free(e->next), free(e->prev), free(e->heap);
    e->sym = malloc(cap * sizeof *e->sym);
    e->next = malloc(cap * sizeof *e->next);
    e->prev = malloc(cap * sizeof *e->prev);
    e->heap = malloc(cap * 3 * sizeof *e->heap); /* m - 1 first pushes + 2 per merge */
    e->scratch_cap = cap;
    if (!e->sym || !e->next || !e->prev || !e->heap) {
        e->scratch_cap = 0;
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer encode: out of memory (chunk of %zu "
                             "bytes)", m);
    }
    return PRL_OK;
}

/* Rank of the pair (left, right), or -1 if it is not a merge. */
static int32_t pair_rank(const prl_tokenizer *t, int32_t left, int32_t right)
{
    return pair_map_get(&t->ranks, pair_key(left, right));
}

/* The reference merge loop (PRL_TOKENIZER_NAIVE): while some adjacent pair is a merge,
** apply the one with the lowest rank, the leftmost if it occurs more than once. Quadratic in
** the chunk length; it defines what the fast loop below must produce. */
static size_t bpe_naive(const prl_tokenizer *t, int32_t *sym, size_t m)
{
    for (;;) {
        int32_t best_rank = -1;
        size_t best = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            int32_t r = pair_rank(t, sym[i], sym[i + 1]);
            if (r >= 0 && (best_rank < 0 || r < best_rank)) best_rank = r, best = i;
        }
        if (best_rank < 0) return m;
        sym[best] = t->merges[3 * best_rank + 2];
        memmove(sym + best + 1, sym + best + 2, (m - best - 2) * sizeof *sym);
        m--;
    }
}

static int entry_less(merge_entry a, merge_entry b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(merge_entry *h, size_t *n, merge_entry x)
{
    size_t i = (*n)++;
    while (i > 0 && entry_less(x, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static merge_entry heap_pop(merge_entry *h, size_t *n)
{
    merge_entry top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && entry_less(h[c + 1], h[c])) c++;
        if (!entry_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

/* Push the pair starting at symbol i (if it has a right neighbour and is a merge). */
static void push_pair(const prl_tokenizer *t, encoder *e, size_t *hn, int32_t i)
{
    int32_t j = e->next[i];
    if (j < 0) return;
    int32_t r = pair_rank(t, e->sym[i], e->sym[j]);
    if (r >= 0) heap_push(e->heap, hn, (merge_entry){r, i});
}

/* The fast merge loop: same result as bpe_naive in O(m log m). Symbols sit in a linked
** list indexed by their first byte's position, so "leftmost" is "smallest pos" and a heap
** ordered by (rank, pos) pops exactly the pair bpe_naive would pick. Entries are never
** removed early; a popped entry whose pair has changed since it was pushed (different rank
** now, or its left symbol merged away) is stale and skipped. Writes the result to sym. */
static size_t bpe_heap(const prl_tokenizer *t, encoder *e, size_t m)
{
    int32_t *sym = e->sym, *next = e->next, *prev = e->prev;
    size_t hn = 0;
    for (size_t i = 0; i < m; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < m; i++) push_pair(t, e, &hn, (int32_t)i);
    while (hn > 0) {
        merge_entry x = heap_pop(e->heap, &hn);
        int32_t i = x.pos, j = next[i];
        if (sym[i] < 0 || j < 0 || pair_rank(t, sym[i], sym[j]) != x.rank) continue;
        sym[i] = t->merges[3 * x.rank + 2];
        sym[j] = -1; /* j is gone */
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        if (prev[i] >= 0) push_pair(t, e, &hn, prev[i]);
        push_pair(t, e, &hn, i);
    }
    size_t n = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) sym[n++] = sym[i];
    return n;
}

/* Merge one chunk in e->sym[0..m) (byte ids on entry) with the loop the flags ask for. */
static size_t bpe_chunk(encoder *e, size_t m)
{
    if (e->flags & PRL_TOKENIZER_NAIVE) return bpe_naive(e->tok, e->sym, m);
    return bpe_heap(e->tok, e, m);
}

static const cache_slot *cache_find(const chunk_cache *c, const uint8_t *b, size_t m,
                                    uint64_t h, size_t *slot)
{
    size_t i = (size_t)h & (CACHE_SLOTS - 1);
    for (; c->slots[i].key_len; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *s = &c->slots[i];
        if (s->hash == h && s->key_len == m && memcmp(c->keys + s->key_off, b, m) == 0)
            return s;
    }
    *slot = i;
    return NULL;
}

static void cache_insert(chunk_cache *c, size_t slot, const uint8_t *b, size_t m, uint64_t h,
                         const int32_t *ids, size_t n)
{
    if (c->n == CACHE_MAX_ENTRIES) { /* full: start over (cheap, and keeps it bounded) */
        memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
        c->n = c->keys_len = c->ids_len = 0;
        slot = (size_t)h & (CACHE_SLOTS - 1);
    }
    memcpy(c->keys + c->keys_len, b, m);
    memcpy(c->ids + c->ids_len, ids, n * sizeof *ids);
    c->slots[slot] = (cache_slot){h, c->keys_len, (uint32_t)m, c->ids_len, (uint32_t)n};
    c->keys_len += (uint32_t)m;
    c->ids_len += (uint32_t)n;
    c->n++;
}

/* Encode one pre-tokenization chunk b[0..m), m >= 1. */
static prl_status encode_chunk(encoder *e, const uint8_t *b, size_t m)
{
    if (m == 1) {
        int32_t id = PRL_TOKENIZER_BYTE0 + b[0];
        return encoder_emit(e, &id, 1);
    }
    chunk_cache *c = &e->cache;
    uint64_t h = 0;
    size_t slot = 0;
    int cacheable = c->slots && m <= CACHE_MAX_KEY;
    if (cacheable) {
        h = hash_bytes(b, m);
        const cache_slot *s = cache_find(c, b, m, h, &slot);
        if (s) return encoder_emit(e, c->ids + s->ids_off, s->n_ids);
    }
    prl_status rc = encoder_scratch(e, m);
    if (rc) return rc;
    for (size_t i = 0; i < m; i++) e->sym[i] = PRL_TOKENIZER_BYTE0 + b[i];
    size_t n = bpe_chunk(e, m);
    if (cacheable) cache_insert(c, slot, b, m, h, e->sym, n);
    return encoder_emit(e, e->sym, n);
}

/* Encode t[0..n) as one pre-tokenization text (no special-token handling). */
static prl_status encode_plain(encoder *e, const uint8_t *t, size_t n)
{
    for (size_t p = 0; p < n;) {
        size_t q = prl_tokenizer_chunk_end(t, n, p);
        prl_status rc = encode_chunk(e, t + p, q - p);
        if (rc) return rc;
        p = q;
    }
    return PRL_OK;
}

/* Encode t[0..n) honouring e->flags: with PRL_TOKENIZER_SPECIAL the text is cut at each
** special string, which becomes one token (a chunk of its own), and the pieces between are
** pre-tokenized as separate texts. */
static prl_status encode_text(encoder *e, const uint8_t *t, size_t n)
{
    if (!(e->flags & PRL_TOKENIZER_SPECIAL)) return encode_plain(e, t, n);
    for (size_t p = 0; p < n;) {
        int32_t id;
        size_t q = find_special(t, n, p, &id);
        prl_status rc = encode_plain(e, t + p, q - p);
        if (!rc && id >= 0) rc = encoder_emit(e, &id, 1);
        if (rc) return rc;
        p = id >= 0 ? q + strlen(special_names[id]) : q;
    }
    return PRL_OK;
}

static prl_status check_encode_args(const prl_tokenizer *tok, const void *text, size_t len,
                                    int32_t **ids, size_t *n_ids, const char *fn)
{
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!tok || !ids || !n_ids || (!text && len))
        return prl_error_set(PRL_ERR_ARG, "%s: NULL argument", fn);
    return PRL_OK;
}

/* Hand the encoder's output to the caller (shrunk to fit) and free the rest. */
static void encoder_take(encoder *e, int32_t **ids, size_t *n_ids)
{
    int32_t *shrunk = realloc(e->ids, (e->n ? e->n : 1) * sizeof *shrunk);
    *ids = shrunk ? shrunk : e->ids;
    *n_ids = e->n;
    e->ids = NULL;
    encoder_free(e);
}

prl_status prl_tokenizer_encode(const prl_tokenizer *tok, const void *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n_ids)
{
    prl_status rc = check_encode_args(tok, text, len, ids, n_ids, "prl_tokenizer_encode");
    if (rc) return rc;
    encoder e;
    if ((rc = encoder_init(&e, tok, flags, len, 0))) return rc;
    if ((rc = encode_text(&e, text, len))) {
        encoder_free(&e);
        return rc;
    }
    encoder_take(&e, ids, n_ids);
    return PRL_OK;
}

/* ============================================================ decode ================== */

/* Length of the valid UTF-8 sequence at p (n bytes left), 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len || len > n) return 0;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range excludes overlongs and surrogates */
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    return len;
}

long prl_utf8_view(const char *s, size_t n, char **out, size_t *out_len)
{
    const unsigned char *p = (const unsigned char *)s;
    char *buf = malloc(n * 3 + 1);
    *out = buf;
    if (!buf) return -1;
    size_t o = 0;
    long replaced = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(p + i, n - i);
        if (k) {
            memcpy(buf + o, p + i, k);
            o += k, i += k;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3); /* U+FFFD */
            o += 3, i += 1, replaced++;
        }
    }
    buf[o] = 0;
    if (out_len) *out_len = o;
    return replaced;
}

prl_status prl_tokenizer_decode(const prl_tokenizer *tok, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len)
{
    if (text) *text = NULL;
    if (len) *len = 0;
    if (!tok || !text || !len || (!ids && n))
        return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->vocab_size)
            return prl_error_set(PRL_ERR_RANGE, "tokenizer decode: token id %d at position "
                                 "%zu is outside the vocabulary [0, %d)",
                                 (int)ids[i], i, (int)tok->vocab_size);
        if (!((flags & PRL_TOKENIZER_SKIP_SPECIAL) && ids[i] < PRL_TOKENIZER_N_SPECIAL))
            total += tok_len(tok, ids[i]);
    }
    char *out = malloc(total + 1);
    if (!out)
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer decode: out of memory (%zu bytes)",
                             total);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & PRL_TOKENIZER_SKIP_SPECIAL) && ids[i] < PRL_TOKENIZER_N_SPECIAL) continue;
        memcpy(out + w, tok_ptr(tok, ids[i]), tok_len(tok, ids[i]));
        w += tok_len(tok, ids[i]);
    }
    out[w] = '\0';
    *text = out;
    *len = w;
    return PRL_OK;
}

/* ============================================================ parallel encoding ======= */
/*
** Why the window algorithm is exact. Serial encoding is "cut the text into chunks, BPE each
** chunk on its own", so if p is a chunk boundary of the whole text, encode(t) is
** encode(t[0,p)) followed by encode(t[p,n)): cutting only at pre-token boundaries is a valid
** basis for splitting the work. Whether p is a boundary is a local question: the rule of
** tokenizer.h reads t[p-1], t[p], t[p+1], and with PRL_TOKENIZER_SPECIAL also whether a
** special string covers those bytes or starts at p + 1 (specials never overlap, so that is
** decided within SPECIAL_MAX_LEN bytes). Hence a window t[b,e) encoded on its own sees
** exactly the chunk boundaries of the whole text at every p with b + MARGIN <= p and
** p + MARGIN <= e (the edges b = 0 and e = n are real, so no margin is needed there), and
** every chunk lying between two such boundaries gets exactly the serial tokens.
**
** The joiner walks the windows left to right. `cur` is the window being emitted, valid from
** `cut` (a true boundary) on. For the next window R it looks, in the overlap, for an offset
** p that both windows mark as the start of a chunk and that lies inside both windows' exact
** zones; both windows then agree that a token, indeed a chunk, starts at p, cur's tokens
** [cut, p) and R's tokens from p on (up to R's own exact edge, where the next join happens)
** are the serial ones, and the join is exact. Agreeing on a mere token boundary inside a
** chunk would not be enough: two windows that both see a long chunk cut short by their
** edges can share token boundaries that the serial encoding of the whole chunk does not
** have (test_parallel_right_to_left_merges builds such a case). When the overlap has no
** such p (a letter, space or punctuation run longer than the overlap), cur is grown:
** re-encoded from `cut` over a doubled span, which is exact because `cut` is a true
** boundary, and the search is repeated, skipping windows that cur has swallowed whole. The
** growth doubles, so a text that is one huge chunk costs at most about 2x re-encoding.
*/

enum { PAR_MARGIN = SPECIAL_MAX_LEN + 2 };

typedef struct window {
    size_t begin, end; /* bytes of the text encoded */
    int32_t *ids;
    uint8_t *starts; /* 1 where a token starts a chunk (in the window's own view) */
    size_t n;
    prl_status rc;
    char msg[256]; /* the worker's error message (error messages are thread-local) */
} window;

static void window_free(window *w)
{
    free(w->ids);
    free(w->starts);
    w->ids = NULL;
    w->starts = NULL;
    w->n = 0;
}

/* Encode text[w->begin, w->end) as if it were the whole text. */
static prl_status window_encode(const prl_tokenizer *tok, const uint8_t *text, unsigned flags,
                                window *w)
{
    encoder e;
    prl_status rc = encoder_init(&e, tok, flags, w->end - w->begin, 1);
    if (!rc) rc = encode_text(&e, text + w->begin, w->end - w->begin);
    if (rc) {
        encoder_free(&e);
        return rc;
    }
    w->ids = e.ids;
    w->starts = e.starts;
    w->n = e.n;
    e.ids = NULL;
    e.starts = NULL;
    encoder_free(&e);
    return PRL_OK;
}

typedef struct par_job {
    const prl_tokenizer *tok;
    const uint8_t *text;
    unsigned flags;
    window *w;
    size_t n_windows;
    int n_threads, thread;
} par_job;

/* Thread body: windows thread, thread + n_threads, ... (a fixed split: nothing depends on
** which thread finishes first). */
static void *par_worker(void *arg)
{
    par_job *j = arg;
    for (size_t k = (size_t)j->thread; k < j->n_windows; k += (size_t)j->n_threads) {
        window *w = &j->w[k];
        w->rc = window_encode(j->tok, j->text, j->flags, w);
        if (w->rc) snprintf(w->msg, sizeof w->msg, "%s", prl_error_message());
    }
    return NULL;
}

/* Run par_worker on n_threads threads, the caller being thread 0. A thread that cannot be
** started has its share run by the caller, so the result never depends on it. */
static void par_run(par_job *jobs, int n_threads)
{
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    char *started = calloc((size_t)n_threads, 1);
    for (int t = 1; t < n_threads && th && started; t++)
        started[t] = pthread_create(&th[t], NULL, par_worker, &jobs[t]) == 0;
    par_worker(&jobs[0]);
    for (int t = 1; t < n_threads; t++) {
        if (started && started[t])
            pthread_join(th[t], NULL);
        else
            par_worker(&jobs[t]);
    }
    free(th);
    free(started);
}

/* Growable output of the joiner. */
typedef struct id_vec {
    int32_t *v;
    size_t n, cap;
} id_vec;

static prl_status id_vec_append(id_vec *o, const int32_t *ids, size_t n)
{
    if (o->n + n > o->cap) {
        size_t cap = o->cap ? o->cap : 1024;
        while (cap < o->n + n) cap *= 2;
        int32_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) return prl_error_set(PRL_ERR_NOMEM, "tokenizer encode_parallel: out of memory");
        o->v = v;
        o->cap = cap;
    }
    memcpy(o->v + o->n, ids, n * sizeof *ids);
    o->n += n;
    return PRL_OK;
}

/* Where the joiner stands in `cur`: token index i starts at byte offset off. */
typedef struct join_pos {
    size_t i, off;
} join_pos;

/* Find the smallest p in [lo, hi) where both cur (from position *c) and r (from its first
** token) have a token that starts a chunk. On success *c and *rp point at those tokens. */
static int find_agreement(const prl_tokenizer *tok, const window *cur, join_pos *c,
                          const window *r, join_pos *rp, size_t lo, size_t hi)
{
    join_pos a = *c, b = {0, r->begin};
    while (a.i < cur->n && b.i < r->n && a.off < hi && b.off < hi) {
        if (a.off < b.off) {
            a.off += tok_len(tok, cur->ids[a.i++]);
        } else if (b.off < a.off) {
            b.off += tok_len(tok, r->ids[b.i++]);
        } else {
            if (a.off >= lo && cur->starts[a.i] && r->starts[b.i]) {
                *c = a;
                *rp = b;
                return 1;
            }
            a.off += tok_len(tok, cur->ids[a.i++]);
            b.off += tok_len(tok, r->ids[b.i++]);
        }
    }
    return 0;
}

typedef struct joiner {
    const prl_tokenizer *tok;
    const uint8_t *text;
    size_t len, overlap;
    unsigned flags;
    prl_tokenizer_parallel_stats st;
} joiner;

/* Re-encode cur from the true boundary `cut` over a doubled span (see the section comment). */
static prl_status join_grow(joiner *J, window *cur, join_pos *c, size_t cut)
{
    size_t grow = cur->end - cut;
    if (grow < J->overlap) grow = J->overlap;
    if (grow < 4 * PAR_MARGIN) grow = 4 * PAR_MARGIN;
    size_t end = grow > J->len - cur->end ? J->len : cur->end + grow;
    window_free(cur);
    cur->begin = cut;
    cur->end = end;
    prl_status rc = window_encode(J->tok, J->text, J->flags, cur);
    if (rc) return rc;
    *c = (join_pos){0, cut};
    J->st.n_grows++;
    J->st.bytes_reencoded += end - cut;
    return PRL_OK;
}

/* Join the encoded windows w[0..nw) into out. Takes ownership of the windows' arrays. */
static prl_status join_windows(joiner *J, window *w, size_t nw, id_vec *out)
{
    const prl_tokenizer *tok = J->tok;
    window cur = w[0];
    w[0].ids = NULL, w[0].starts = NULL;
    join_pos c = {0, 0};  /* search position in cur; never before `cut` */
    size_t emit_from = 0; /* index in cur of the token that starts at `cut` */
    size_t cut = 0;       /* everything before it is in `out` */
    prl_status rc = PRL_OK;
    for (size_t k = 1; k < nw && cur.end < J->len && !rc;) {
        window *r = &w[k];
        if (r->end <= cur.end) { /* cur already reaches as far as r: r adds nothing */
            window_free(r);
            k++;
            continue;
        }
        /* p must lie in r's exact zone (>= r->begin + margin), in cur's (<= cur.end - margin;
        ** r->end > cur.end, so r's right edge is then fine too) and not before cut. */
        size_t lo = r->begin + PAR_MARGIN > cut ? r->begin + PAR_MARGIN : cut;
        size_t hi = cur.end >= PAR_MARGIN ? cur.end - PAR_MARGIN + 1 : 0;
        join_pos rp;
        if (lo < hi && find_agreement(tok, &cur, &c, r, &rp, lo, hi)) {
            rc = id_vec_append(out, cur.ids + emit_from, c.i - emit_from);
            window_free(&cur);
            cur = *r;
            r->ids = NULL, r->starts = NULL;
            c = rp;
            emit_from = rp.i;
            cut = rp.off;
            k++;
        } else {
            rc = join_grow(J, &cur, &c, cut);
            emit_from = 0;
        }
    }
    if (!rc) rc = id_vec_append(out, cur.ids + emit_from, cur.n - emit_from);
    window_free(&cur);
    return rc;
}

/* Check the options and fill in the defaults of tokenizer.h. */
static prl_status par_options(const prl_tokenizer_parallel_opts *opts, size_t len, int *threads,
                              size_t *chunk, size_t *overlap)
{
    *threads = opts ? opts->n_threads : 2;
    if (*threads < 1 || *threads > 1024)
        return prl_error_set(PRL_ERR_ARG, "tokenizer encode_parallel: n_threads %d is outside "
                             "[1, 1024]", *threads);
    *chunk = opts ? opts->chunk_bytes : 0;
    if (*chunk == 0) {
        *chunk = len / (4 * (size_t)*threads);
        if (*chunk < 65536) *chunk = 65536;
    }
    *overlap = opts && opts->overlap_bytes ? opts->overlap_bytes : 256;
    return PRL_OK;
}

/* Window k covers its nominal span [k*chunk, (k+1)*chunk) widened by `overlap` both ways. */
static void par_layout(window *w, size_t nw, size_t len, size_t chunk, size_t overlap)
{
    for (size_t k = 0; k < nw; k++) {
        size_t a = k * chunk, b = len - a > chunk ? a + chunk : len;
        w[k].begin = a > overlap ? a - overlap : 0;
        w[k].end = len - b > overlap ? b + overlap : len;
    }
}

/* The first window that failed, re-raised on the calling thread (messages are thread-local,
** so the worker's was copied into the window). */
static prl_status par_first_error(const window *w, size_t nw)
{
    for (size_t k = 0; k < nw; k++)
        if (w[k].rc)
            return prl_error_set(w[k].rc, "tokenizer encode_parallel: window %zu [%zu, %zu): "
                                 "%s", k, w[k].begin, w[k].end, w[k].msg);
    return PRL_OK;
}

prl_status prl_tokenizer_encode_parallel(const prl_tokenizer *tok, const void *text,
                                         size_t len, unsigned flags,
                                         const prl_tokenizer_parallel_opts *opts,
                                         int32_t **ids, size_t *n_ids,
                                         prl_tokenizer_parallel_stats *stats)
{
    if (stats) memset(stats, 0, sizeof *stats);
    prl_status rc = check_encode_args(tok, text, len, ids, n_ids, "prl_tokenizer_encode_parallel");
    int n_threads = 0;
    size_t chunk = 0, overlap = 0;
    if (!rc) rc = par_options(opts, len, &n_threads, &chunk, &overlap);
    if (rc) return rc;
    if (len == 0) return prl_tokenizer_encode(tok, text, 0, flags, ids, n_ids);

    size_t nw = (len - 1) / chunk + 1;
    if ((size_t)n_threads > nw) n_threads = (int)nw; /* an idle thread would only cost */
    window *w = calloc(nw, sizeof *w);
    par_job *jobs = calloc((size_t)n_threads, sizeof *jobs);
    if (!w || !jobs) {
        free(w), free(jobs);
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer encode_parallel: out of memory");
    }
    par_layout(w, nw, len, chunk, overlap);
    for (int t = 0; t < n_threads; t++)
        jobs[t] = (par_job){tok, text, flags, w, nw, n_threads, t};
    par_run(jobs, n_threads);

    rc = par_first_error(w, nw);
    joiner J = {tok, text, len, overlap, flags, {nw, 0, 0}};
    id_vec out = {0};
    if (!rc) rc = join_windows(&J, w, nw, &out);
    for (size_t k = 0; k < nw; k++) window_free(&w[k]);
    free(w);
    free(jobs);
    if (rc) {
        free(out.v);
        return rc;
    }
    *ids = out.v ? out.v : malloc(sizeof **ids);
    if (!*ids) return prl_error_set(PRL_ERR_NOMEM, "tokenizer encode_parallel: out of memory");
    *n_ids = out.n;
    if (stats) *stats = J.st;
    return PRL_OK;
}

/* ============================================================ trainer ================= */
/*
** Greedy BPE over the multiset of chunks ("words": each distinct chunk once, with its
** count), as in Hugging Face's BpeTrainer. Each pair of adjacent symbols has a count (summed
** over words, weighted by word count) and a list of the words it occurs in. A merge rewrites
** only the words on its pair's list and updates the counts of the pairs it destroys and
** creates as it goes, so one merge costs the size of the words it touches, not a recount.
**
** The best pair comes from a max-heap of (count, pair) with lazy deletion: counts only fall,
** except for pairs that contain the new token, which are pushed afresh after each merge. So
** every live pair has an entry whose count is >= its true count, and an entry popped with
** its true count is the true maximum (ties: the lowest (left, right), compared by id).
** Nothing depends on text order or hash layout, so training is deterministic.
*/

typedef struct train_pair {
    int32_t left, right;
    int64_t count;     /* occurrences, weighted by word count */
    int32_t *words;    /* words that held the pair at some point (stale entries skipped) */
    uint32_t n_words, cap_words;
    int32_t last_word; /* the word appended last: avoids repeats within one word */
    int32_t queued_at; /* the merge step that last put it on `changed` */
} train_pair;

typedef struct heap_item {
    int64_t count;
    int32_t pair;
} heap_item;

typedef struct trainer {
    prl_tokenizer *tok;
    int32_t *sym;        /* every word's symbols; a word shrinks in place as it is merged */
    size_t *word_off;
    int32_t *word_len;
    int64_t *word_count;
    int32_t *word_seen;  /* merge step that last rewrote the word (dedupes pair lists) */
    size_t n_words;
    pair_map pair_ix;    /* pair_key -> index in pairs */
    train_pair *pairs;
    size_t n_pairs, cap_pairs;
    heap_item *heap;
    size_t heap_n, heap_cap;
    int32_t *changed;    /* pairs whose count rose during this step */
    size_t n_changed, cap_changed;
    bytes_map merged_ids; /* merged token bytes -> id, to reuse an id for equal bytes */
    uint8_t **owned;      /* the keys of merged_ids (token byte copies) */
    size_t n_owned, cap_owned;
    int32_t step;
} trainer;

static void trainer_free(trainer *tr)
{
    free(tr->sym), free(tr->word_off), free(tr->word_len), free(tr->word_count);
    free(tr->word_seen);
    pair_map_free(&tr->pair_ix);
    for (size_t i = 0; i < tr->n_pairs; i++) free(tr->pairs[i].words);
    free(tr->pairs), free(tr->heap), free(tr->changed);
    bytes_map_free(&tr->merged_ids);
    for (size_t i = 0; i < tr->n_owned; i++) free(tr->owned[i]);
    free(tr->owned);
}

static prl_status train_nomem(void)
{
    return prl_error_set(PRL_ERR_NOMEM, "tokenizer train: out of memory");
}

/* Grow *buf (elements of `size` bytes, capacity *cap) to hold at least `need`. */
static int grow_array(void *buf, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) return 1;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    void *p = realloc(*(void **)buf, c * size);
    if (!p) return 0;
    *(void **)buf = p;
    *cap = c;
    return 1;
}

static int heap_item_before(const trainer *tr, heap_item a, heap_item b)
{
    if (a.count != b.count) return a.count > b.count;
    const train_pair *p = &tr->pairs[a.pair], *q = &tr->pairs[b.pair];
    return p->left != q->left ? p->left < q->left : p->right < q->right;
}

static prl_status train_heap_push(trainer *tr, int32_t pair)
{
    if (!grow_array(&tr->heap, &tr->heap_cap, tr->heap_n + 1, sizeof *tr->heap))
        return train_nomem();
    heap_item x = {tr->pairs[pair].count, pair};
    size_t i = tr->heap_n++;
    while (i > 0 && heap_item_before(tr, x, tr->heap[(i - 1) / 2])) {
        tr->heap[i] = tr->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    tr->heap[i] = x;
    return PRL_OK;
}

static heap_item train_heap_pop(trainer *tr)
{
    heap_item top = tr->heap[0], x = tr->heap[--tr->heap_n];
    size_t i = 0, n = tr->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_item_before(tr, tr->heap[c + 1], tr->heap[c])) c++;
        if (!heap_item_before(tr, tr->heap[c], x)) break;
        tr->heap[i] = tr->heap[c];
        i = c;
    }
    tr->heap[i] = x;
    return top;
}

/* Index of pair (l, r), creating an empty record if it is new. */
static prl_status train_pair_index(trainer *tr, int32_t l, int32_t r, int32_t *ix)
{
    int32_t *slot = NULL;
    int added;
    prl_status rc = pair_map_upsert(&tr->pair_ix, pair_key(l, r), (int32_t)tr->n_pairs, &slot,
                                    &added);
    if (rc) return rc;
    if (added) {
        if (tr->n_pairs >= INT32_MAX ||
            !grow_array(&tr->pairs, &tr->cap_pairs, tr->n_pairs + 1, sizeof *tr->pairs))
            return train_nomem();
        tr->pairs[tr->n_pairs++] = (train_pair){l, r, 0, NULL, 0, 0, -1, -1};
    }
    *ix = *slot;
    return PRL_OK;
}

/* Pair (l, r) occurs `count` more times, in word w. */
static prl_status train_inc(trainer *tr, int32_t l, int32_t r, int64_t count, int32_t w)
{
    int32_t ix = -1;
    prl_status rc = train_pair_index(tr, l, r, &ix);
    if (rc) return rc;
    train_pair *p = &tr->pairs[ix];
    p->count += count;
    if (p->last_word != w) {
        size_t cap = p->cap_words;
        if (!grow_array(&p->words, &cap, (size_t)p->n_words + 1, sizeof *p->words))
            return train_nomem();
        p->cap_words = (uint32_t)cap;
        p->words[p->n_words++] = w;
        p->last_word = w;
    }
    if (p->queued_at != tr->step) {
        if (!grow_array(&tr->changed, &tr->cap_changed, tr->n_changed + 1, sizeof *tr->changed))
            return train_nomem();
        tr->changed[tr->n_changed++] = ix;
        p->queued_at = tr->step;
    }
    return PRL_OK;
}

/* Pair (l, r) occurs `count` fewer times (it must exist). */
static void train_dec(trainer *tr, int32_t l, int32_t r, int64_t count)
{
    int32_t ix = pair_map_get(&tr->pair_ix, pair_key(l, r));
    PRL_ASSERT(ix >= 0);
    tr->pairs[ix].count -= count;
    PRL_ASSERT(tr->pairs[ix].count >= 0);
}

/* Count the chunks of all texts: chunk bytes -> count (keys point into the texts; chunks of
** one byte are skipped, having no pair to merge). */
static prl_status train_count_chunks(const char *const *texts, const size_t *lens,
                                     size_t n_texts, bytes_map *chunks)
{
    for (size_t i = 0; i < n_texts; i++) {
        const uint8_t *t = (const uint8_t *)texts[i];
        size_t n = lens ? lens[i] : strlen(texts[i]);
        for (size_t p = 0; p < n;) {
            size_t q = prl_tokenizer_chunk_end(t, n, p);
            if (q - p >= 2) {
                bytes_entry *e;
                int added;
                prl_status rc = bytes_map_upsert(chunks, t + p, q - p, 0, &e, &added);
                if (rc) return rc;
                e->val++;
            }
            p = q;
        }
    }
    return PRL_OK;
}

/* Turn the chunk counts into words of byte ids and count their pairs. */
static prl_status train_build_words(trainer *tr, const bytes_map *chunks)
{
    size_t n_sym = 0;
    for (size_t i = 0; i < chunks->cap; i++) n_sym += chunks->e[i].key ? chunks->e[i].len : 0;
    if (chunks->n >= INT32_MAX)
        return prl_error_set(PRL_ERR_RANGE, "tokenizer train: %zu distinct chunks (limit %d)",
                             chunks->n, INT32_MAX);
    tr->sym = malloc((n_sym ? n_sym : 1) * sizeof *tr->sym);
    tr->word_off = malloc((chunks->n + 1) * sizeof *tr->word_off);
    tr->word_len = malloc((chunks->n + 1) * sizeof *tr->word_len);
    tr->word_count = malloc((chunks->n + 1) * sizeof *tr->word_count);
    tr->word_seen = malloc((chunks->n + 1) * sizeof *tr->word_seen);
    if (!tr->sym || !tr->word_off || !tr->word_len || !tr->word_count || !tr->word_seen)
        return train_nomem();
    size_t off = 0;
    for (size_t i = 0; i < chunks->cap; i++) {
        const bytes_entry *e = &chunks->e[i];
        if (!e->key) continue;
        if (e->len > INT32_MAX)
            return prl_error_set(PRL_ERR_RANGE, "tokenizer train: a chunk of %zu bytes", e->len);
        int32_t w = (int32_t)tr->n_words++;
        tr->word_off[w] = off;
        tr->word_len[w] = (int32_t)e->len;
        tr->word_count[w] = e->val;
        tr->word_seen[w] = -1;
        for (size_t j = 0; j < e->len; j++) tr->sym[off + j] = PRL_TOKENIZER_BYTE0 + e->key[j];
        for (size_t j = 0; j + 1 < e->len; j++) {
            prl_status rc = train_inc(tr, tr->sym[off + j], tr->sym[off + j + 1], e->val, w);
            if (rc) return rc;
        }
        off += e->len;
    }
    return PRL_OK;
}

/* Pop the best pair (highest count, then lowest (left, right)); 0 if none is left. */
static int train_pick(trainer *tr, int32_t *best, prl_status *rc)
{
    while (tr->heap_n > 0) {
        heap_item x = train_heap_pop(tr);
        int64_t now = tr->pairs[x.pair].count;
        if (now == x.count && now > 0) {
            *best = x.pair;
            return 1;
        }
        if (now > 0 && now < x.count && (*rc = train_heap_push(tr, x.pair))) return 0;
    }
    return 0;
}

/* The id of the token with bytes left + right: an existing merged token with those bytes,
** or a new one appended to the vocabulary. */
static prl_status train_result_id(trainer *tr, int32_t left, int32_t right, int32_t *id)
{
    prl_tokenizer *t = tr->tok;
    size_t nl = tok_len(t, left), nr = tok_len(t, right);
    uint8_t *b = malloc(nl + nr);
    if (!b || !grow_array(&tr->owned, &tr->cap_owned, tr->n_owned + 1, sizeof *tr->owned)) {
        free(b);
        return train_nomem();
    }
    memcpy(b, tok_ptr(t, left), nl);
    memcpy(b + nl, tok_ptr(t, right), nr);
    bytes_entry *e;
    int added;
    prl_status rc = bytes_map_upsert(&tr->merged_ids, b, nl + nr, t->vocab_size, &e, &added);
    if (rc || !added) {
        free(b);
        if (!rc) *id = (int32_t)e->val;
        return rc;
    }
    tr->owned[tr->n_owned++] = b;
    *id = t->vocab_size;
    return tok_add_token(t, b, nl + nr);
}

/* Apply merge a + b -> z to word w, left to right, keeping the pair counts exact. */
static prl_status train_merge_word(trainer *tr, int32_t w, int32_t a, int32_t b, int32_t z)
{
    int32_t *s = tr->sym + tr->word_off[w];
    int32_t n = tr->word_len[w], j = 0;
    int64_t c = tr->word_count[w];
    prl_status rc = PRL_OK;
    for (int32_t i = 0; i < n && !rc;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            if (j > 0) { /* the left neighbour (maybe a z made just before) now meets z */
                train_dec(tr, s[j - 1], a, c);
                rc = train_inc(tr, s[j - 1], z, c, w);
            }
            train_dec(tr, a, b, c);
            if (i + 2 < n) { /* s[i + 2] is still unread input: j <= i */
                train_dec(tr, b, s[i + 2], c);
                if (!rc) rc = train_inc(tr, z, s[i + 2], c, w);
            }
            s[j++] = z;
            i += 2;
        } else {
            s[j++] = s[i++];
        }
    }
    tr->word_len[w] = j;
    return rc;
}

/* Learn one merge of pair index pi. */
static prl_status train_step(trainer *tr, int32_t pi)
{
    int32_t a = tr->pairs[pi].left, b = tr->pairs[pi].right, z = -1;
    prl_status rc = train_result_id(tr, a, b, &z);
    if (!rc) rc = tok_add_merge(tr->tok, a, b, z);
    if (rc) return rc;
    tr->step++;
    tr->n_changed = 0;
    /* Keep the list pointer, not a pointer to the record: new pair records may move
    ** tr->pairs, but nothing appends to this list (every pair a merge creates contains z,
    ** and z is longer than a and b, so it is never (a, b)). */
    int32_t *words = tr->pairs[pi].words;
    uint32_t n_words = tr->pairs[pi].n_words;
    for (uint32_t k = 0; k < n_words && !rc; k++) {
        int32_t w = words[k];
        if (tr->word_seen[w] == tr->step) continue;
        tr->word_seen[w] = tr->step;
        rc = train_merge_word(tr, w, a, b, z);
    }
    if (rc) return rc;
    PRL_ASSERT(tr->pairs[pi].count == 0);
    free(tr->pairs[pi].words);
    tr->pairs[pi].words = NULL;
    tr->pairs[pi].n_words = tr->pairs[pi].cap_words = 0;
    for (size_t k = 0; k < tr->n_changed && !rc; k++)
        if (tr->pairs[tr->changed[k]].count > 0) rc = train_heap_push(tr, tr->changed[k]);
    return rc;
}

prl_status prl_tokenizer_train(const char *const *texts, const size_t *lens, size_t n_texts,
                               int32_t vocab_size, prl_tokenizer **out)
{
    if (!out) return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_train: out is NULL");
    *out = NULL;
    if (!texts && n_texts)
        return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_train: texts is NULL");
    for (size_t i = 0; i < n_texts; i++)
        if (!texts[i] && (!lens || lens[i]))
            return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_train: texts[%zu] is NULL", i);
    if (vocab_size < PRL_TOKENIZER_N_BASE)
        return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_train: vocab_size %d is below the %d "
                             "base tokens (16 specials + 256 bytes)", (int)vocab_size,
                             PRL_TOKENIZER_N_BASE);
    trainer tr;
    memset(&tr, 0, sizeof tr);
    bytes_map chunks = {0};
    prl_status rc = tok_new_base(&tr.tok);
    if (!rc) rc = train_count_chunks(texts, lens, n_texts, &chunks);
    if (!rc) rc = train_build_words(&tr, &chunks);
    bytes_map_free(&chunks); /* the words hold their own copies of the symbols */
    for (size_t i = 0; i < tr.n_pairs && !rc; i++) rc = train_heap_push(&tr, (int32_t)i);
    int32_t best;
    while (!rc && tr.tok->vocab_size < vocab_size && train_pick(&tr, &best, &rc))
        rc = train_step(&tr, best);
    prl_tokenizer *tok = tr.tok;
    tr.tok = NULL;
    trainer_free(&tr);
    if (rc) {
        prl_tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return PRL_OK;
}

/* ============================================================ chat encoding =========== */

/* The turn-start token of a role name, or -1. */
static int32_t role_token(const char *role)
{
    static const char *const names[] = {"system", "user", "assistant", "tool"};
    static const int32_t ids[] = {PRL_TOKEN_SYSTEM, PRL_TOKEN_USER, PRL_TOKEN_ASSISTANT,
                                  PRL_TOKEN_TOOL};
    for (int i = 0; role && i < 4; i++)
        if (strcmp(role, names[i]) == 0) return ids[i];
    return -1;
}

/* An encoder plus the loss mask kept in step with its output. */
typedef struct chat_buf {
    encoder e;
    uint8_t *mask;
    size_t mask_cap;
} chat_buf;

/* Give the tokens appended since `from` the mask value v. */
static prl_status chat_mark(chat_buf *b, size_t from, uint8_t v)
{
    if (!grow_array(&b->mask, &b->mask_cap, b->e.n, 1))
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer chat: out of memory");
    memset(b->mask + from, v, b->e.n - from);
    return PRL_OK;
}

static prl_status chat_special(chat_buf *b, int32_t id, uint8_t v)
{
    size_t from = b->e.n;
    prl_status rc = encoder_emit(&b->e, &id, 1);
    return rc ? rc : chat_mark(b, from, v);
}

static prl_status chat_check(const prl_chat_message *msgs, size_t n_msgs, size_t *total)
{
    *total = 0;
    if (!msgs && n_msgs) return prl_error_set(PRL_ERR_ARG, "tokenizer chat: msgs is NULL");
    for (size_t i = 0; i < n_msgs; i++) {
        if (role_token(msgs[i].role) < 0)
            return prl_error_set(PRL_ERR_ARG, "tokenizer chat: message %zu has unknown role "
                                 "\"%s\" (expected system, user, assistant or tool)", i,
                                 msgs[i].role ? msgs[i].role : "(null)");
        if (!msgs[i].content)
            return prl_error_set(PRL_ERR_ARG, "tokenizer chat: message %zu (%s) has NULL "
                                 "content", i, msgs[i].role);
        *total += strlen(msgs[i].content) + 2;
    }
    return PRL_OK;
}

/* The shared body of encode_chat (prompt = 0) and encode_chat_prompt (prompt = 1). */
static prl_status chat_encode(const prl_tokenizer *tok, const prl_chat_message *msgs,
                              size_t n_msgs, unsigned flags, int prompt, int32_t **ids,
                              uint8_t **loss_mask, size_t *n_ids)
{
    if (ids) *ids = NULL;
    if (loss_mask) *loss_mask = NULL;
    if (n_ids) *n_ids = 0;
    if (!tok || !ids || !n_ids) return prl_error_set(PRL_ERR_ARG, "tokenizer chat: NULL argument");
    size_t total;
    prl_status rc = chat_check(msgs, n_msgs, &total);
    if (rc) return rc;
    chat_buf b = {0};
    if ((rc = encoder_init(&b.e, tok, flags & (PRL_TOKENIZER_SPECIAL | PRL_TOKENIZER_NAIVE),
                           total, 0)))
        return rc;
    rc = chat_special(&b, PRL_TOKEN_BOS, 0);
    for (size_t i = 0; i < n_msgs && !rc; i++) {
        uint8_t learn = role_token(msgs[i].role) == PRL_TOKEN_ASSISTANT;
        rc = chat_special(&b, role_token(msgs[i].role), 0);
        size_t from = b.e.n;
        if (!rc) rc = encode_text(&b.e, (const uint8_t *)msgs[i].content,
                                  strlen(msgs[i].content));
        if (!rc) rc = encoder_emit(&b.e, &(int32_t){PRL_TOKEN_END}, 1);
        if (!rc) rc = chat_mark(&b, from, learn); /* content and <|end|> */
    }
    if (!rc && prompt) rc = chat_special(&b, PRL_TOKEN_ASSISTANT, 0);
    if (!rc && !prompt) {
        int last_assistant =
            n_msgs > 0 && role_token(msgs[n_msgs - 1].role) == PRL_TOKEN_ASSISTANT;
        rc = chat_special(&b, PRL_TOKEN_EOS, (uint8_t)last_assistant);
    }
    if (rc) {
        free(b.mask);
        encoder_free(&b.e);
        return rc;
    }
    if (loss_mask)
        *loss_mask = b.mask;
    else
        free(b.mask);
    encoder_take(&b.e, ids, n_ids);
    return PRL_OK;
}

prl_status prl_tokenizer_encode_chat(const prl_tokenizer *tok, const prl_chat_message *msgs,
                                     size_t n_msgs, unsigned flags, int32_t **ids,
                                     uint8_t **loss_mask, size_t *n_ids)
{
    return chat_encode(tok, msgs, n_msgs, flags, 0, ids, loss_mask, n_ids);
}

prl_status prl_chat_from_json(const json_t *v, const char *where, prl_chat_message **msgs,
                              size_t *n)
{
    *msgs = NULL, *n = 0;
    if (!json_is_array(v))
        return prl_error_set(PRL_ERR_FORMAT, "%s: the messages are not a JSON array", where);
    size_t nm = json_array_size(v);
    prl_chat_message *cm = calloc(nm + 1, sizeof *cm);
    if (!cm) return prl_error_set(PRL_ERR_NOMEM, "%s: messages", where);
    for (size_t i = 0; i < nm; i++) {
        json_t *msg = json_array_get(v, i);
        cm[i].role = json_string_value(json_object_get(msg, "role"));
        cm[i].content = json_string_value(json_object_get(msg, "content"));
        if (!cm[i].role || !cm[i].content) {
            free(cm);
            return prl_error_set(PRL_ERR_FORMAT, "%s: message %zu needs string role and content",
                                 where, i);
        }
    }
    *msgs = cm, *n = nm;
    return PRL_OK;
}

prl_status prl_tokenizer_encode_chat_prompt(const prl_tokenizer *tok,
                                            const prl_chat_message *msgs, size_t n_msgs,
                                            unsigned flags, int32_t **ids, size_t *n_ids)
{
    return chat_encode(tok, msgs, n_msgs, flags, 1, ids, NULL, n_ids);
}

/* ============================================================ tokenizer.json ========== */

/* Our pre-tokenization rule as a Hugging Face Split regex (chars >= U+0080 stand for the
** bytes >= 0x80 of tokenizer.h). Descriptive: prl itself never parses it. */
static const char PRETOKENIZE_REGEX[] =
    "[0-9]"
    "| ?[A-Za-z\\x{80}-\\x{10FFFF}]+"
    "| ?[^\\t\\n\\x0B\\f\\r 0-9A-Za-z\\x{80}-\\x{10FFFF}]+"
    "|[\\t\\n\\x0B\\f\\r ]+(?= [^\\t\\n\\x0B\\f\\r 0-9])"
    "|[\\t\\n\\x0B\\f\\r ]+";

enum { BYTE_LEVEL_MAX_CP = 324 }; /* GPT-2's byte-level code points are all < 256 + 68 */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
** for U+0100.. in byte order, so every token is a printable string without spaces. */
static void byte_level_tables(uint16_t byte_cp[256], int16_t cp_byte[BYTE_LEVEL_MAX_CP])
{
    int extra = 0;
    for (int i = 0; i < BYTE_LEVEL_MAX_CP; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        byte_cp[b] = (uint16_t)(printable ? b : 256 + extra++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

/* Token bytes -> byte-level UTF-8 string in out (room for 2 * n + 1). */
static void byte_level_encode(const uint16_t byte_cp[256], const uint8_t *b, size_t n, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned cp = byte_cp[b[i]];
        if (cp < 0x80) {
            out[w++] = (char)cp;
        } else {
            out[w++] = (char)(0xC0 | cp >> 6);
            out[w++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[w] = '\0';
}

/* Byte-level string -> bytes in out (room for strlen(s)); 0 if s is not one. */
static int byte_level_decode(const int16_t cp_byte[BYTE_LEVEL_MAX_CP], const char *s,
                             uint8_t *out, size_t *n)
{
    const uint8_t *p = (const uint8_t *)s;
    *n = 0;
    while (*p) {
        unsigned cp;
        if (p[0] < 0x80) {
            cp = p[0];
            p += 1;
        } else if ((p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) {
            cp = (unsigned)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
            p += 2;
        } else {
            return 0;
        }
        if (cp >= BYTE_LEVEL_MAX_CP || cp_byte[cp] < 0) return 0;
        out[(*n)++] = (uint8_t)cp_byte[cp];
    }
    return 1;
}

/* ---- save ---------------------------------------------------------------------------- */

/* obj[key] = v (stolen); records failure in *ok (jansson returns NULL/-1 on no memory). */
static void jset(json_t *obj, const char *key, json_t *v, int *ok)
{
    if (!v || json_object_set_new(obj, key, v)) *ok = 0;
}

static void jappend(json_t *arr, json_t *v, int *ok)
{
    if (!v || json_array_append_new(arr, v)) *ok = 0;
}

static json_t *json_added_tokens(int *ok)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < PRL_TOKENIZER_N_SPECIAL; i++) {
        json_t *t = json_object();
        if (!t) {
            *ok = 0;
            break;
        }
        jset(t, "id", json_integer(i), ok);
        jset(t, "content", json_string(special_names[i]), ok);
        jset(t, "single_word", json_false(), ok);
        jset(t, "lstrip", json_false(), ok);
        jset(t, "rstrip", json_false(), ok);
        jset(t, "normalized", json_false(), ok);
        jset(t, "special", json_true(), ok);
        jappend(arr, t, ok);
    }
    return arr;
}

static json_t *json_byte_level(int *ok)
{
    json_t *o = json_object();
    if (!o) return NULL;
    jset(o, "type", json_string("ByteLevel"), ok);
    jset(o, "add_prefix_space", json_false(), ok);
    jset(o, "trim_offsets", json_false(), ok);
    jset(o, "use_regex", json_false(), ok);
    return o;
}

static json_t *json_pre_tokenizer(int *ok)
{
    json_t *split = json_object(), *pattern = json_object(), *seq = json_object(),
           *list = json_array();
    if (split && pattern) {
        jset(pattern, "Regex", json_string(PRETOKENIZE_REGEX), ok);
        jset(split, "type", json_string("Split"), ok);
        jset(split, "pattern", pattern, ok);
        jset(split, "behavior", json_string("Isolated"), ok);
        jset(split, "invert", json_false(), ok);
    } else {
        json_decref(pattern);
        *ok = 0;
    }
    if (list) {
        jappend(list, split, ok);
        jappend(list, json_byte_level(ok), ok);
    } else {
        json_decref(split);
    }
    if (seq) {
        jset(seq, "type", json_string("Sequence"), ok);
        jset(seq, "pretokenizers", list, ok);
    } else {
        json_decref(list);
    }
    return seq;
}

/* model.vocab (ids >= 16; specials live only in added_tokens, so a merged token whose bytes
** spell "<|pad|>" cannot clash with the special) and model.merges as "left right". */
static json_t *json_model(const prl_tokenizer *tok, int *ok)
{
    uint16_t byte_cp[256];
    int16_t cp_byte[BYTE_LEVEL_MAX_CP];
    byte_level_tables(byte_cp, cp_byte);
    size_t max_len = 0;
    for (int32_t id = 0; id < tok->vocab_size; id++)
        if (tok_len(tok, id) > max_len) max_len = tok_len(tok, id);
    char *s = malloc(4 * max_len + 4);
    json_t *m = json_object(), *vocab = json_object(), *merges = json_array();
    if (!s || !m || !vocab || !merges) {
        free(s), json_decref(m), json_decref(vocab), json_decref(merges);
        *ok = 0;
        return NULL;
    }
    for (int32_t id = PRL_TOKENIZER_BYTE0; id < tok->vocab_size && *ok; id++) {
        byte_level_encode(byte_cp, tok_ptr(tok, id), tok_len(tok, id), s);
        jset(vocab, s, json_integer(id), ok);
    }
    for (size_t r = 0; r < tok->n_merges && *ok; r++) {
        const int32_t *mg = tok->merges + 3 * r;
        size_t nl = tok_len(tok, mg[0]);
        byte_level_encode(byte_cp, tok_ptr(tok, mg[0]), nl, s);
        size_t w = strlen(s);
        s[w++] = ' ';
        byte_level_encode(byte_cp, tok_ptr(tok, mg[1]), tok_len(tok, mg[1]), s + w);
        jappend(merges, json_string(s), ok);
    }
    free(s);
    jset(m, "type", json_string("BPE"), ok);
    jset(m, "dropout", json_null(), ok);
    jset(m, "unk_token", json_null(), ok);
    jset(m, "continuing_subword_prefix", json_null(), ok);
    jset(m, "end_of_word_suffix", json_null(), ok);
    jset(m, "fuse_unk", json_false(), ok);
    jset(m, "byte_fallback", json_false(), ok);
    jset(m, "ignore_merges", json_false(), ok);
    jset(m, "vocab", vocab, ok);
    jset(m, "merges", merges, ok);
    return m;
}

static json_t *json_prl(const prl_tokenizer *tok, int *ok)
{
    json_t *p = json_object();
    if (!p) return NULL;
    jset(p, "format_version", json_integer(PRL_TOKENIZER_FORMAT_VERSION), ok);
    jset(p, "split_digits", json_true(), ok);
    jset(p, "byte_offset", json_integer(PRL_TOKENIZER_BYTE0), ok);
    jset(p, "vocab_size", json_integer(tok->vocab_size), ok);
    return p;
}

static json_t *tokenizer_to_json(const prl_tokenizer *tok)
{
    int ok = 1;
    json_t *root = json_object();
    if (!root) return NULL;
    jset(root, "version", json_string("1.0"), &ok);
    jset(root, "truncation", json_null(), &ok);
    jset(root, "padding", json_null(), &ok);
    jset(root, "added_tokens", json_added_tokens(&ok), &ok);
    jset(root, "normalizer", json_null(), &ok);
    jset(root, "pre_tokenizer", json_pre_tokenizer(&ok), &ok);
    jset(root, "post_processor", json_null(), &ok);
    jset(root, "decoder", json_byte_level(&ok), &ok);
    jset(root, "model", json_model(tok, &ok), &ok);
    jset(root, "prl", json_prl(tok, &ok), &ok);
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

prl_status prl_tokenizer_save(const prl_tokenizer *tok, const char *path)
{
    if (!tok || !path) return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_save: NULL argument");
    json_t *root = tokenizer_to_json(tok);
    char *text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
    json_decref(root);
    if (!text)
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer save %s: out of memory building JSON",
                             path);
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps leaves no final newline; overwrite the NUL, keep len+1 */
    prl_status rc = prl_file_write_atomic(path, text, len + 1);
    free(text);
    return rc;
}

/* ---- load ---------------------------------------------------------------------------- */
/* Each check sets a message naming the JSON field and the offending value; the loader then
** prefixes the file name. */

static prl_status load_check_prl(const json_t *root)
{
    const json_t *prl = json_object_get(root, "prl");
    if (!json_is_object(prl))
        return prl_error_set(PRL_ERR_FORMAT, "no \"prl\" object (not written by prl?)");
    const json_t *v = json_object_get(prl, "format_version");
    if (!json_is_integer(v))
        return prl_error_set(PRL_ERR_FORMAT, "prl.format_version is missing or not an integer");
    if (json_integer_value(v) != PRL_TOKENIZER_FORMAT_VERSION)
        return prl_error_set(PRL_ERR_FORMAT, "prl.format_version is %lld; this build reads "
                             "version %d%s", (long long)json_integer_value(v),
                             PRL_TOKENIZER_FORMAT_VERSION,
                             json_integer_value(v) > PRL_TOKENIZER_FORMAT_VERSION
                                 ? " (written by a newer prl?)" : "");
    if (!json_is_true(json_object_get(prl, "split_digits")))
        return prl_error_set(PRL_ERR_FORMAT, "prl.split_digits must be true (each digit its own "
                             "chunk is the only pre-tokenization prl implements)");
    v = json_object_get(prl, "byte_offset");
    if (v && (!json_is_integer(v) || json_integer_value(v) != PRL_TOKENIZER_BYTE0))
        return prl_error_set(PRL_ERR_FORMAT, "prl.byte_offset must be %d",
                             PRL_TOKENIZER_BYTE0);
    return PRL_OK;
}

static prl_status load_check_added(const json_t *root)
{
    const json_t *arr = json_object_get(root, "added_tokens");
    if (!json_is_array(arr))
        return prl_error_set(PRL_ERR_FORMAT, "\"added_tokens\" is missing or not an array");
    int seen[PRL_TOKENIZER_N_SPECIAL] = {0};
    size_t i;
    const json_t *t;
    json_array_foreach(arr, i, t) {
        const json_t *id = json_object_get(t, "id"), *content = json_object_get(t, "content");
        if (!json_is_integer(id) || !json_is_string(content))
            return prl_error_set(PRL_ERR_FORMAT, "added_tokens[%zu] needs an integer \"id\" "
                                 "and a string \"content\"", i);
        long long k = json_integer_value(id);
        if (k < 0 || k >= PRL_TOKENIZER_N_SPECIAL)
            return prl_error_set(PRL_ERR_FORMAT, "added_tokens[%zu]: id %lld is not a special "
                                 "id 0..%d", i, k, PRL_TOKENIZER_N_SPECIAL - 1);
        if (seen[k]++)
            return prl_error_set(PRL_ERR_FORMAT, "added_tokens[%zu]: duplicate id %lld", i, k);
        if (strcmp(json_string_value(content), special_names[k]) != 0)
            return prl_error_set(PRL_ERR_FORMAT, "added_tokens[%zu]: id %lld is \"%s\", "
                                 "expected \"%s\"", i, k, json_string_value(content),
                                 special_names[k]);
    }
    for (int k = 0; k < PRL_TOKENIZER_N_SPECIAL; k++)
        if (!seen[k])
            return prl_error_set(PRL_ERR_FORMAT, "added_tokens: special id %d (\"%s\") is "
                                 "missing", k, special_names[k]);
    return PRL_OK;
}

/* model.vocab -> tokens 16..V-1 appended to tok (which holds the 272 base tokens), checking
** ids (integers, in range, no duplicates, no holes) and strings (byte-level, bytes at their
** fixed ids, merged tokens of >= 2 bytes). */
typedef struct vocab_entry {
    const char *key;
    size_t off, len; /* decoded bytes in a shared buffer */
} vocab_entry;

static prl_status load_vocab_entries(const json_t *vocab, vocab_entry *ent, uint8_t *buf,
                                     size_t n_ids)
{
    uint16_t byte_cp[256];
    int16_t cp_byte[BYTE_LEVEL_MAX_CP];
    byte_level_tables(byte_cp, cp_byte);
    size_t off = 0;
    const char *key, *outside = NULL;
    long long outside_id = 0;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v))
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab[\"%s\"] is not an integer id",
                                 key);
        long long id = json_integer_value(v);
        if (id < PRL_TOKENIZER_BYTE0 || id >= (long long)(PRL_TOKENIZER_BYTE0 + n_ids)) {
            if (!outside) outside = key, outside_id = id; /* reported below, with the hole */
            continue;
        }
        vocab_entry *e = &ent[id - PRL_TOKENIZER_BYTE0];
        if (e->key)
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab: duplicate id %lld (\"%s\" and "
                                 "\"%s\")", id, e->key, key);
        size_t n;
        if (!byte_level_decode(cp_byte, key, buf + off, &n) || n == 0)
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab[\"%s\"] (id %lld) is not a "
                                 "byte-level token string", key, id);
        *e = (vocab_entry){key, off, n};
        off += n;
        if (id < PRL_TOKENIZER_N_BASE && (n != 1 || buf[e->off] != id - PRL_TOKENIZER_BYTE0))
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab[\"%s\"]: id %lld must be the "
                                 "single byte 0x%02llx", key, id, id - PRL_TOKENIZER_BYTE0);
        if (id >= PRL_TOKENIZER_N_BASE && n < 2)
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab[\"%s\"]: merged id %lld is a "
                                 "single byte (bytes are ids %d..%d)", key, id,
                                 PRL_TOKENIZER_BYTE0, PRL_TOKENIZER_N_BASE - 1);
    }
    /* n entries without duplicates fill [16, 16 + n) exactly unless one lies outside it, and
    ** then some id inside is missing: name both. */
    for (size_t i = 0; i < n_ids; i++)
        if (!ent[i].key)
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab has no token with id %zu (a "
                                 "hole: %zu entries must use ids %d..%zu, but \"%s\" has id "
                                 "%lld)", i + PRL_TOKENIZER_BYTE0, n_ids, PRL_TOKENIZER_BYTE0,
                                 n_ids + PRL_TOKENIZER_BYTE0 - 1, outside ? outside : "?",
                                 outside_id);
    return PRL_OK;
}

static prl_status load_vocab(const json_t *model, prl_tokenizer *tok)
{
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return prl_error_set(PRL_ERR_FORMAT, "model.vocab is missing or not an object");
    size_t n_ids = json_object_size(vocab), total = 0;
    if (n_ids > INT32_MAX - PRL_TOKENIZER_BYTE0)
        return prl_error_set(PRL_ERR_FORMAT, "model.vocab has %zu entries", n_ids);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) total += strlen(key);
    vocab_entry *ent = calloc(n_ids + 1, sizeof *ent);
    uint8_t *buf = malloc(total + 1);
    prl_status rc = ent && buf ? load_vocab_entries(vocab, ent, buf, n_ids)
                               : prl_error_set(PRL_ERR_NOMEM, "out of memory");
    if (!rc && n_ids < 256)
        rc = prl_error_set(PRL_ERR_FORMAT, "model.vocab has %zu entries; the 256 byte tokens "
                           "alone need 256", n_ids);
    for (size_t i = 256; i < n_ids && !rc; i++) /* ids 272.. in order (bytes are built in) */
        rc = tok_add_token(tok, buf + ent[i].off, ent[i].len);
    free(ent);
    free(buf);
    return rc;
}

/* One merge entry ("left right" or ["left", "right"]) -> its two token ids. */
static prl_status load_merge_pair(const json_t *vocab, const json_t *m, size_t i, int32_t *l,
                                  int32_t *r)
{
    char *copy = NULL;
    const char *a, *b;
    if (json_is_string(m)) {
        copy = strdup(json_string_value(m));
        if (!copy) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
        char *sp = strchr(copy, ' ');
        if (!sp || strchr(sp + 1, ' ') || sp == copy || !sp[1]) {
            prl_status rc = prl_error_set(PRL_ERR_FORMAT, "merges[%zu] \"%s\" is not \"left "
                                          "right\" (two tokens, one space)", i,
                                          json_string_value(m));
            free(copy);
            return rc;
        }
        *sp = '\0';
        a = copy, b = sp + 1;
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        a = json_string_value(json_array_get(m, 0));
        b = json_string_value(json_array_get(m, 1));
    } else {
        return prl_error_set(PRL_ERR_FORMAT, "merges[%zu] is neither \"left right\" nor "
                             "[\"left\", \"right\"]", i);
    }
    const json_t *ja = json_object_get(vocab, a), *jb = json_object_get(vocab, b);
    prl_status rc = PRL_OK;
    if (!ja || !jb)
        rc = prl_error_set(PRL_ERR_FORMAT, "merges[%zu] \"%s %s\": unknown token \"%s\"", i, a,
                           b, ja ? b : a);
    else
        *l = (int32_t)json_integer_value(ja), *r = (int32_t)json_integer_value(jb);
    free(copy);
    return rc;
}

/* State of the merge checks: merged tokens by bytes, scratch for left + right, next new id. */
typedef struct merge_loader {
    prl_tokenizer *tok;
    bytes_map by_bytes;
    uint8_t *joined;
    int32_t next_new;
} merge_loader;

static prl_status merge_loader_init(merge_loader *L, prl_tokenizer *tok)
{
    memset(L, 0, sizeof *L);
    L->tok = tok;
    L->next_new = PRL_TOKENIZER_N_BASE;
    size_t longest = 1;
    for (int32_t id = 0; id < tok->vocab_size; id++)
        if (tok_len(tok, id) > longest) longest = tok_len(tok, id);
    L->joined = malloc(2 * longest);
    if (!L->joined) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
    prl_status rc = PRL_OK;
    for (int32_t id = PRL_TOKENIZER_N_BASE; id < tok->vocab_size && !rc; id++) {
        bytes_entry *e;
        int added;
        rc = bytes_map_upsert(&L->by_bytes, tok_ptr(tok, id), tok_len(tok, id), id, &e, &added);
    }
    return rc;
}

static void merge_loader_free(merge_loader *L)
{
    free(L->joined);
    bytes_map_free(&L->by_bytes);
}

/* Check and add merges[i] = m. */
static prl_status load_one_merge(merge_loader *L, const json_t *vocab, const json_t *m, size_t i)
{
    prl_tokenizer *tok = L->tok;
    int32_t l = 0, r = 0;
    prl_status rc = load_merge_pair(vocab, m, i, &l, &r);
    if (rc) return rc;
    if (l >= L->next_new || r >= L->next_new)
        return prl_error_set(PRL_ERR_FORMAT, "merges[%zu] uses token id %d before the merge "
                             "that creates it", i, (int)(l >= L->next_new ? l : r));
    size_t nl = tok_len(tok, l), nr = tok_len(tok, r);
    memcpy(L->joined, tok_ptr(tok, l), nl);
    memcpy(L->joined + nl, tok_ptr(tok, r), nr);
    bytes_entry *e;
    int added;
    if ((rc = bytes_map_upsert(&L->by_bytes, L->joined, nl + nr, -1, &e, &added))) return rc;
    if (added) /* (the map now holds the scratch buffer as a key; it is not used again) */
        return prl_error_set(PRL_ERR_FORMAT, "merges[%zu] (ids %d + %d): the result is not in "
                             "model.vocab", i, (int)l, (int)r);
    int32_t res = (int32_t)e->val;
    if (res > L->next_new)
        return prl_error_set(PRL_ERR_FORMAT, "merges[%zu] creates id %d but the next new id is "
                             "%d (merged ids must follow merge order)", i, (int)res,
                             (int)L->next_new);
    if (pair_map_get(&tok->ranks, pair_key(l, r)) >= 0)
        return prl_error_set(PRL_ERR_FORMAT, "merges[%zu]: duplicate merge of ids %d + %d", i,
                             (int)l, (int)r);
    if (res == L->next_new) L->next_new++;
    return tok_add_merge(tok, l, r, res);
}

/* model.merges, in rank order. Each merge must join two tokens that exist by then, and its
** result (looked up by bytes) must be an earlier token or exactly the next new id, so that
** ids 272..V-1 are numbered in the order their merges create them and each is created. */
static prl_status load_merges(const json_t *model, prl_tokenizer *tok)
{
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges))
        return prl_error_set(PRL_ERR_FORMAT, "model.merges is missing or not an array");
    merge_loader L;
    prl_status rc = merge_loader_init(&L, tok);
    for (size_t i = 0; i < json_array_size(merges) && !rc; i++)
        rc = load_one_merge(&L, vocab, json_array_get(merges, i), i);
    if (!rc && L.next_new != tok->vocab_size)
        rc = prl_error_set(PRL_ERR_FORMAT, "model.vocab id %d is not created by any merge "
                           "(%zu merges create ids up to %d)", (int)L.next_new,
                           json_array_size(merges), (int)L.next_new - 1);
    merge_loader_free(&L);
    return rc;
}

static prl_status load_json(const json_t *root, prl_tokenizer **out)
{
    if (!json_is_object(root)) return prl_error_set(PRL_ERR_FORMAT, "top level is not an object");
    prl_status rc = load_check_prl(root);
    if (!rc) rc = load_check_added(root);
    if (rc) return rc;
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return prl_error_set(PRL_ERR_FORMAT, "\"model\" is missing or not an object");
    const json_t *type = json_object_get(model, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0)
        return prl_error_set(PRL_ERR_FORMAT, "model.type must be \"BPE\"");
    prl_tokenizer *tok = NULL;
    rc = tok_new_base(&tok);
    if (!rc) rc = load_vocab(model, tok);
    if (!rc) rc = load_merges(model, tok);
    const json_t *vs = json_object_get(json_object_get(root, "prl"), "vocab_size");
    if (!rc && vs && (!json_is_integer(vs) || json_integer_value(vs) != tok->vocab_size))
        rc = prl_error_set(PRL_ERR_FORMAT, "prl.vocab_size does not match the %d ids of the "
                           "file", (int)tok->vocab_size);
    if (rc) {
        prl_tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return PRL_OK;
}

prl_status prl_tokenizer_load(const char *path, prl_tokenizer **out)
{
    if (out) *out = NULL;
    if (!path || !out) return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_load: NULL argument");
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        prl_status code = json_error_code(&err) == json_error_cannot_open_file ? PRL_ERR_IO
                                                                                : PRL_ERR_FORMAT;
        return prl_error_set(code, "tokenizer %s: line %d column %d: %s", path, err.line,
                             err.column, err.text);
    }
    prl_status rc = load_json(root, out);
    json_decref(root);
    if (rc) return prl_error_wrap(rc, "tokenizer %s: ", path);
    return PRL_OK;
}
