/*
** tokenizer_encode.c — encode and decode: a per-call encoder (output, scratch, a chunk cache)
** cuts a text at its special strings (PRL_TOKENIZER_SPECIAL) and into pre-tokenization
** chunks and merges each chunk with the fast heap loop, or with the naive reference loop that
** defines it (PRL_TOKENIZER_NAIVE); decode turns ids back into bytes; prl_utf8_view.
*/
#include "engine/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

/* ============================================================ encoder ================= */

void tok__encoder_free(encoder *e)
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
    tok__hf_run_free(e->run);
    memset(e, 0, sizeof *e);
}

/* Set up an encoder. text_len sizes the first output buffer and decides whether the cache
** is worth allocating. */
prl_status tok__encoder_init(encoder *e, const prl_tokenizer *tok, unsigned flags, size_t text_len,
                             int want_starts)
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
        tok__encoder_free(e);
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
prl_status tok__encoder_emit(encoder *e, const int32_t *ids, size_t n)
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
        return prl_error_set(PRL_ERR_NOMEM,
                             "tokenizer encode: out of memory (chunk of %zu "
                             "bytes)",
                             m);
    }
    return PRL_OK;
}

/* Rank of the pair (left, right), or -1 if it is not a merge. */
static int32_t pair_rank(const prl_tokenizer *t, int32_t left, int32_t right)
{
    return tok__pair_map_get(&t->ranks, tok__pair_key(left, right));
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

/* Merge one chunk in e->sym[0..m) (token ids on entry) with the loop the flags ask for. */
size_t tok__bpe(encoder *e, size_t m)
{
    if (e->flags & PRL_TOKENIZER_NAIVE) return bpe_naive(e->tok, e->sym, m);
    return bpe_heap(e->tok, e, m);
}

static const cache_slot *cache_find(const chunk_cache *c, const uint8_t *b, size_t m, uint64_t h,
                                    size_t *slot)
{
    size_t i = (size_t)h & (CACHE_SLOTS - 1);
    for (; c->slots[i].key_len; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *s = &c->slots[i];
        if (s->hash == h && s->key_len == m && memcmp(c->keys + s->key_off, b, m) == 0) return s;
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

/* Encode one pre-tokenization chunk b[0..m), m >= 1 (an imported tokenizer's word). */
static prl_status encode_chunk(encoder *e, const uint8_t *b, size_t m)
{
    if (m == 1 && !e->tok->hf) {
        int32_t id = PRL_TOKENIZER_BYTE0 + b[0];
        return tok__encoder_emit(e, &id, 1);
    }
    chunk_cache *c = &e->cache;
    uint64_t h = 0;
    size_t slot = 0;
    int cacheable = c->slots && m <= CACHE_MAX_KEY;
    if (cacheable) {
        h = tok__hash_bytes(b, m);
        const cache_slot *s = cache_find(c, b, m, h, &slot);
        if (s) return tok__encoder_emit(e, c->ids + s->ids_off, s->n_ids);
    }
    prl_status rc = encoder_scratch(e, m);
    if (rc) return rc;
    size_t n;
    if (e->tok->hf) {
        if ((rc = tok__hf_word(e, b, m, &n))) return rc;
    } else {
        for (size_t i = 0; i < m; i++) e->sym[i] = PRL_TOKENIZER_BYTE0 + b[i];
        n = tok__bpe(e, m);
    }
    if (cacheable) cache_insert(c, slot, b, m, h, e->sym, n);
    return tok__encoder_emit(e, e->sym, n);
}

/* Encode one word of an imported tokenizer (the chunk cache applies to words too). */
prl_status tok__encode_word(encoder *e, const uint8_t *b, size_t m)
{
    return encode_chunk(e, b, m);
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
prl_status tok__encode_text(encoder *e, const uint8_t *t, size_t n)
{
    if (e->tok->hf) return tok__hf_encode_text(e, t, n);
    if (!(e->flags & PRL_TOKENIZER_SPECIAL)) return encode_plain(e, t, n);
    for (size_t p = 0; p < n;) {
        int32_t id;
        size_t q = tok__find_special(t, n, p, &id);
        prl_status rc = encode_plain(e, t + p, q - p);
        if (!rc && id >= 0) rc = tok__encoder_emit(e, &id, 1);
        if (rc) return rc;
        p = id >= 0 ? q + strlen(tok__special_names[id]) : q;
    }
    return PRL_OK;
}

prl_status tok__check_encode_args(const prl_tokenizer *tok, const void *text, size_t len,
                                  int32_t **ids, size_t *n_ids, const char *fn)
{
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!tok || !ids || !n_ids || (!text && len))
        return prl_error_set(PRL_ERR_ARG, "%s: NULL argument", fn);
    return PRL_OK;
}

/* Hand the encoder's output to the caller (shrunk to fit) and free the rest. */
void tok__encoder_take(encoder *e, int32_t **ids, size_t *n_ids)
{
    int32_t *shrunk = realloc(e->ids, (e->n ? e->n : 1) * sizeof *shrunk);
    *ids = shrunk ? shrunk : e->ids;
    *n_ids = e->n;
    e->ids = NULL;
    tok__encoder_free(e);
}

prl_status prl_tokenizer_encode(const prl_tokenizer *tok, const void *text, size_t len,
                                unsigned flags, int32_t **ids, size_t *n_ids)
{
    prl_status rc = tok__check_encode_args(tok, text, len, ids, n_ids, "prl_tokenizer_encode");
    if (rc) return rc;
    encoder e;
    if ((rc = tok__encoder_init(&e, tok, flags, len, 0))) return rc;
    const hf_tokenizer *hf = tok->hf;
    int add = hf && (flags & PRL_TOKENIZER_ADD_SPECIAL); /* the post-processor's tokens */
    if (add) rc = tok__encoder_emit(&e, hf->post_pre, (size_t)hf->n_post_pre);
    if (!rc) rc = tok__encode_text(&e, text, len);
    if (!rc && add) rc = tok__encoder_emit(&e, hf->post_post, (size_t)hf->n_post_post);
    if (rc) {
        tok__encoder_free(&e);
        return rc;
    }
    tok__encoder_take(&e, ids, n_ids);
    return PRL_OK;
}

/* ============================================================ decode ================== */

/* Length of the valid UTF-8 sequence at p (n bytes left), 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xC2 && c <= 0xDF   ? 2
                 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4
                                          : 0;
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

/* Does SKIP_SPECIAL drop id? prl: ids 0..15; imported: added tokens with special = true. */
static int is_special(const prl_tokenizer *tok, int32_t id)
{
    return tok->hf ? tok->hf->is_special[id] : id < PRL_TOKENIZER_N_SPECIAL;
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
            return prl_error_set(PRL_ERR_RANGE,
                                 "tokenizer decode: token id %d at position "
                                 "%zu is outside the vocabulary [0, %d)",
                                 (int)ids[i], i, (int)tok->vocab_size);
        if (!((flags & PRL_TOKENIZER_SKIP_SPECIAL) && is_special(tok, ids[i])))
            total += tok__len(tok, ids[i]);
    }
    char *out = malloc(total + 1);
    if (!out)
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer decode: out of memory (%zu bytes)", total);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & PRL_TOKENIZER_SKIP_SPECIAL) && is_special(tok, ids[i])) continue;
        memcpy(out + w, tok__ptr(tok, ids[i]), tok__len(tok, ids[i]));
        w += tok__len(tok, ids[i]);
    }
    if (tok->hf) tok__hf_decode_joined(tok->hf, out, &w); /* Strip after Fuse and the like */
    out[w] = '\0';
    *text = out;
    *len = w;
    return PRL_OK;
}
