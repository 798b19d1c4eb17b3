/*
** tokenizer.c — prl's byte-level BPE tokenizer (API and exact rules in tokenizer.h).
**
** This file holds the specials, the hash maps, the vocabulary and the pre-tokenization
** rule; the rest is split by concern around the private tokenizer_int.h:
**   tokenizer_encode.c    the encoder (cached heap BPE and the naive reference loop), decode
**   tokenizer_parallel.c  the multi-threaded window encoder (identical to serial)
**   tokenizer_train.c     the trainer (greedy BPE over counted chunks)
**   tokenizer_chat.c      chat encoding for SFT (turns, loss mask), prl_chat_from_json
**   tokenizer_json.c      tokenizer.json save/load (format in docs/tokenizer.md)
**   tokenizer_hf*.c       imported Hugging Face tokenizer.json files: load (tokenizer_hf.c),
**                         normalizers, pre-tokenizers and decoders parsed
**                         (tokenizer_hf_parse.c) and run (tokenizer_hf_steps.c), encoding
**                         (tokenizer_hf_encode.c), chat templates (tokenizer_hf_chat.c)
** What is not: datasets, batching. (prl's own tokenizer sees bytes only; Unicode
** normalisation exists for imported tokenizers that ask for it.)
**
** Threads: a prl_tokenizer is never written after construction; all mutable encoding state
** (scratch buffers, the chunk cache) lives in a per-call `encoder`, so concurrent calls on
** one tokenizer need no locks.
*/
#include "engine/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

/* ============================================================ specials ================ */

const char *const tok__special_names[PRL_TOKENIZER_N_SPECIAL] = {
    "<|pad|>",        "<|bos|>",        "<|eos|>",        "<|system|>",
    "<|user|>",       "<|assistant|>",  "<|tool|>",       "<|end|>",
    "<|tool_call|>",  "<|/tool_call|>", "<|think|>",      "<|/think|>",
    "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>", "<|reserved_3|>"};

int32_t prl_tokenizer_special_id(const char *name)
{
    if (!name) return -1;
    for (int32_t i = 0; i < PRL_TOKENIZER_N_SPECIAL; i++)
        if (strcmp(name, tok__special_names[i]) == 0) return i;
    return -1;
}

const char *prl_tokenizer_special_name(int32_t id)
{
    return id >= 0 && id < PRL_TOKENIZER_N_SPECIAL ? tok__special_names[id] : NULL;
}

/* The special whose string starts at t[0..avail), or -1. Specials all look like "<|...|>"
** with no '<' inside, so two occurrences can never overlap and a left-to-right scan finds
** every one: whether a special starts at p depends only on t[p .. p + SPECIAL_MAX_LEN). */
static int32_t special_at(const uint8_t *t, size_t avail)
{
    if (avail < 4 || t[0] != '<' || t[1] != '|') return -1;
    for (int32_t i = 0; i < PRL_TOKENIZER_N_SPECIAL; i++) {
        size_t n = strlen(tok__special_names[i]);
        if (n <= avail && memcmp(t, tok__special_names[i], n) == 0) return i;
    }
    return -1;
}

/* Position of the first special occurrence in t[from, len), or len; its id in *id. */
size_t tok__find_special(const uint8_t *t, size_t len, size_t from, int32_t *id)
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

uint64_t tok__hash_bytes(const uint8_t *p, size_t n)
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

/* ---- pair map: (left, right) key -> int32 value; open addressing, linear probing ------ */

#define PAIR_EMPTY UINT64_MAX /* no key: ids are < 2^31, so a real key never has it */

void tok__pair_map_free(pair_map *m)
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
int32_t tok__pair_map_get(const pair_map *m, uint64_t key)
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
        tok__pair_map_free(&g);
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
    tok__pair_map_free(m);
    *m = g;
    return PRL_OK;
}

/* The value slot of key, inserting it with value `init` if absent (*added = 1 then). */
prl_status tok__pair_map_upsert(pair_map *m, uint64_t key, int32_t init, int32_t **val, int *added)
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

void tok__bytes_map_free(bytes_map *m)
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

/* The value stored for key, or -1 if absent. */
int64_t tok__bytes_map_get(const bytes_map *m, const uint8_t *key, size_t len)
{
    if (!m->cap || !len) return -1;
    size_t i = bytes_map_slot(m, key, len, tok__hash_bytes(key, len));
    return m->e[i].key ? m->e[i].val : -1;
}

/* Entry for key (len > 0), inserted with value `init` if absent. The pointer is valid until
** the next insertion. */
prl_status tok__bytes_map_upsert(bytes_map *m, const uint8_t *key, size_t len, int64_t init,
                                 bytes_entry **out, int *added)
{
    if ((m->n + 1) * 2 > m->cap) {
        prl_status rc = bytes_map_grow(m);
        if (rc) return rc;
    }
    uint64_t h = tok__hash_bytes(key, len);
    size_t i = bytes_map_slot(m, key, len, h);
    *added = m->e[i].key == NULL;
    if (*added) {
        m->e[i] = (bytes_entry){key, len, h, init};
        m->n++;
    }
    *out = &m->e[i];
    return PRL_OK;
}

/* ---- growable arrays ------------------------------------------------------------------ */

/* Grow *buf (elements of `size` bytes, capacity *cap) to hold at least `need`. */
int tok__grow_array(void *buf, size_t *cap, size_t need, size_t size)
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

/* ============================================================ vocabulary ============== */

void prl_tokenizer_free(prl_tokenizer *tok)
{
    if (!tok) return;
    free(tok->tok_off);
    free(tok->tok_bytes);
    free(tok->merges);
    tok__pair_map_free(&tok->ranks);
    tok__hf_free(tok->hf);
    free(tok);
}

void tok__prl_roles(prl_tokenizer *t)
{
    t->roles[PRL_ROLE_PAD] = PRL_TOKEN_PAD;
    t->roles[PRL_ROLE_BOS] = PRL_TOKEN_BOS;
    t->roles[PRL_ROLE_EOS] = PRL_TOKEN_EOS;
    t->roles[PRL_ROLE_UNK] = -1; /* every byte is a token: nothing is unknown */
    t->roles[PRL_ROLE_END] = PRL_TOKEN_END;
}

int32_t prl_tokenizer_role_id(const prl_tokenizer *tok, prl_tokenizer_role role)
{
    if (!tok || (int)role < 0 || role >= PRL_ROLE_COUNT) return -1;
    return tok->roles[role];
}

int prl_tokenizer_stop_ids(const prl_tokenizer *tok, int32_t out[2])
{
    int n = 0;
    int32_t end = prl_tokenizer_role_id(tok, PRL_ROLE_END),
            eos = prl_tokenizer_role_id(tok, PRL_ROLE_EOS);
    if (end >= 0) out[n++] = end;
    if (eos >= 0 && eos != end) out[n++] = eos;
    return n;
}

int32_t prl_tokenizer_token_id(const prl_tokenizer *tok, const char *content)
{
    if (!tok || !content) return -1;
    if (!tok->hf) return prl_tokenizer_special_id(content);
    size_t n = strlen(content);
    for (size_t i = 0; i < tok->hf->n_added; i++) /* added tokens first, as Hugging Face */
        if (tok->hf->added[i].len == n && memcmp(tok->hf->added[i].content, content, n) == 0)
            return tok->hf->added[i].id;
    for (int32_t id = 0; id < tok->vocab_size; id++) /* rare: a lookup by decoded bytes */
        if (tok__len(tok, id) == n && n && memcmp(tok__ptr(tok, id), content, n) == 0) return id;
    return -1;
}

int prl_tokenizer_is_imported(const prl_tokenizer *tok) { return tok && tok->hf; }

/* Append a token with the given bytes; its id is the old vocab_size. */
prl_status tok__add_token(prl_tokenizer *t, const uint8_t *b, size_t n)
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
    if (n) memcpy(t->tok_bytes + t->bytes_len, b, n); /* an empty token may have no buffer yet */
    t->tok_off[t->vocab_size] = t->bytes_len;
    t->bytes_len += n;
    t->tok_off[++t->vocab_size] = t->bytes_len;
    return PRL_OK;
}

/* Append merge left + right -> result (all existing ids) with the next rank. A pair that is
** already ranked keeps its first rank: the encoder could never apply the later one. */
prl_status tok__add_merge(prl_tokenizer *t, int32_t left, int32_t right, int32_t result)
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
    prl_status rc = tok__pair_map_upsert(&t->ranks, tok__pair_key(left, right),
                                         (int32_t)t->n_merges, &slot, &added);
    if (rc) return rc;
    int32_t *m = t->merges + 3 * t->n_merges++;
    m[0] = left, m[1] = right, m[2] = result;
    return PRL_OK;
}

/* A new tokenizer holding the 16 specials and the 256 bytes (ids as in tokenizer.h). */
prl_status tok__new_base(prl_tokenizer **out)
{
    prl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory");
    tok__prl_roles(t);
    prl_status rc = PRL_OK;
    for (int i = 0; i < PRL_TOKENIZER_N_SPECIAL && !rc; i++)
        rc = tok__add_token(t, (const uint8_t *)tok__special_names[i],
                            strlen(tok__special_names[i]));
    for (int b = 0; b < 256 && !rc; b++) {
        uint8_t byte = (uint8_t)b;
        rc = tok__add_token(t, &byte, 1);
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
    return tok__new_base(out);
}

int32_t prl_tokenizer_vocab_size(const prl_tokenizer *tok) { return tok ? tok->vocab_size : 0; }

size_t prl_tokenizer_n_merges(const prl_tokenizer *tok) { return tok ? tok->n_merges : 0; }

prl_status prl_tokenizer_merge(const prl_tokenizer *tok, size_t rank, int32_t *left, int32_t *right,
                               int32_t *result)
{
    if (!tok || rank >= tok->n_merges)
        return prl_error_set(PRL_ERR_RANGE, "tokenizer: merge rank %zu out of range [0, %zu)", rank,
                             tok ? tok->n_merges : 0);
    const int32_t *m = tok->merges + 3 * rank;
    if (left) *left = m[0];
    if (right) *right = m[1];
    if (result) *result = m[2];
    return PRL_OK;
}

prl_status prl_tokenizer_token_bytes(const prl_tokenizer *tok, int32_t id, const uint8_t **bytes,
                                     size_t *len)
{
    if (!tok || id < 0 || id >= tok->vocab_size)
        return prl_error_set(PRL_ERR_RANGE,
                             "tokenizer: token id %d outside the vocabulary "
                             "[0, %d)",
                             (int)id, tok ? (int)tok->vocab_size : 0);
    if (bytes) *bytes = tok__ptr(tok, id);
    if (len) *len = tok__len(tok, id);
    return PRL_OK;
}

/* ============================================================ pre-tokenization ======== */

enum { CL_D = 'D', CL_L = 'L', CL_W = 'W', CL_P = 'P' }; /* byte classes of tokenizer.h */

/* Classes of the ASCII bytes, 32 per line (0x00.., 0x20.., 0x40.., 0x60..); every byte
** >= 0x80 is a letter. A table because this runs once or twice per input byte. */
static const char ascii_class[129] = "PPPPPPPPPWWWWWPPPPPPPPPPPPPPPPPP"
                                     "WPPPPPPPPPPPPPPPDDDDDDDDDDPPPPPP"
                                     "PLLLLLLLLLLLLLLLLLLLLLLLLLLPPPPP"
                                     "PLLLLLLLLLLLLLLLLLLLLLLLLLLPPPPP";

static int byte_class(uint8_t c) { return c >= 0x80 ? CL_L : ascii_class[c]; }

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
