/*
** tokenizer_train.c — prl_tokenizer_train: greedy byte-level BPE over the counted
** pre-tokenization chunks of the texts, with incremental pair counts and a lazy max-heap;
** deterministic (the method is below).
*/
#include "engine/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

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
    int64_t count;  /* occurrences, weighted by word count */
    int32_t *words; /* words that held the pair at some point (stale entries skipped) */
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
    int32_t *sym; /* every word's symbols; a word shrinks in place as it is merged */
    size_t *word_off;
    int32_t *word_len;
    int64_t *word_count;
    int32_t *word_seen; /* merge step that last rewrote the word (dedupes pair lists) */
    size_t n_words;
    pair_map pair_ix; /* pair_key -> index in pairs */
    train_pair *pairs;
    size_t n_pairs, cap_pairs;
    heap_item *heap;
    size_t heap_n, heap_cap;
    int32_t *changed; /* pairs whose count rose during this step */
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
    tok__pair_map_free(&tr->pair_ix);
    for (size_t i = 0; i < tr->n_pairs; i++) free(tr->pairs[i].words);
    free(tr->pairs), free(tr->heap), free(tr->changed);
    tok__bytes_map_free(&tr->merged_ids);
    for (size_t i = 0; i < tr->n_owned; i++) free(tr->owned[i]);
    free(tr->owned);
}

static prl_status train_nomem(void)
{
    return prl_error_set(PRL_ERR_NOMEM, "tokenizer train: out of memory");
}

static int heap_item_before(const trainer *tr, heap_item a, heap_item b)
{
    if (a.count != b.count) return a.count > b.count;
    const train_pair *p = &tr->pairs[a.pair], *q = &tr->pairs[b.pair];
    return p->left != q->left ? p->left < q->left : p->right < q->right;
}

static prl_status train_heap_push(trainer *tr, int32_t pair)
{
    if (!tok__grow_array(&tr->heap, &tr->heap_cap, tr->heap_n + 1, sizeof *tr->heap))
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
    prl_status rc = tok__pair_map_upsert(&tr->pair_ix, tok__pair_key(l, r), (int32_t)tr->n_pairs,
                                         &slot, &added);
    if (rc) return rc;
    if (added) {
        if (tr->n_pairs >= INT32_MAX ||
            !tok__grow_array(&tr->pairs, &tr->cap_pairs, tr->n_pairs + 1, sizeof *tr->pairs))
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
        if (!tok__grow_array(&p->words, &cap, (size_t)p->n_words + 1, sizeof *p->words))
            return train_nomem();
        p->cap_words = (uint32_t)cap;
        p->words[p->n_words++] = w;
        p->last_word = w;
    }
    if (p->queued_at != tr->step) {
        if (!tok__grow_array(&tr->changed, &tr->cap_changed, tr->n_changed + 1,
                             sizeof *tr->changed))
            return train_nomem();
        tr->changed[tr->n_changed++] = ix;
        p->queued_at = tr->step;
    }
    return PRL_OK;
}

/* Pair (l, r) occurs `count` fewer times (it must exist). */
static void train_dec(trainer *tr, int32_t l, int32_t r, int64_t count)
{
    int32_t ix = tok__pair_map_get(&tr->pair_ix, tok__pair_key(l, r));
    PRL_ASSERT(ix >= 0);
    tr->pairs[ix].count -= count;
    PRL_ASSERT(tr->pairs[ix].count >= 0);
}

/* Count the chunks of all texts: chunk bytes -> count (keys point into the texts; chunks of
** one byte are skipped, having no pair to merge). */
static prl_status train_count_chunks(const char *const *texts, const size_t *lens, size_t n_texts,
                                     bytes_map *chunks)
{
    for (size_t i = 0; i < n_texts; i++) {
        const uint8_t *t = (const uint8_t *)texts[i];
        size_t n = lens ? lens[i] : strlen(texts[i]);
        for (size_t p = 0; p < n;) {
            size_t q = prl_tokenizer_chunk_end(t, n, p);
            if (q - p >= 2) {
                bytes_entry *e;
                int added;
                prl_status rc = tok__bytes_map_upsert(chunks, t + p, q - p, 0, &e, &added);
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
    size_t nl = tok__len(t, left), nr = tok__len(t, right);
    uint8_t *b = malloc(nl + nr);
    if (!b || !tok__grow_array(&tr->owned, &tr->cap_owned, tr->n_owned + 1, sizeof *tr->owned)) {
        free(b);
        return train_nomem();
    }
    memcpy(b, tok__ptr(t, left), nl);
    memcpy(b + nl, tok__ptr(t, right), nr);
    bytes_entry *e;
    int added;
    prl_status rc = tok__bytes_map_upsert(&tr->merged_ids, b, nl + nr, t->vocab_size, &e, &added);
    if (rc || !added) {
        free(b);
        if (!rc) *id = (int32_t)e->val;
        return rc;
    }
    tr->owned[tr->n_owned++] = b;
    *id = t->vocab_size;
    return tok__add_token(t, b, nl + nr);
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
    if (!rc) rc = tok__add_merge(tr->tok, a, b, z);
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
    if (!texts && n_texts) return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_train: texts is NULL");
    for (size_t i = 0; i < n_texts; i++)
        if (!texts[i] && (!lens || lens[i]))
            return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_train: texts[%zu] is NULL", i);
    if (vocab_size < PRL_TOKENIZER_N_BASE)
        return prl_error_set(PRL_ERR_ARG,
                             "prl_tokenizer_train: vocab_size %d is below the %d "
                             "base tokens (16 specials + 256 bytes)",
                             (int)vocab_size, PRL_TOKENIZER_N_BASE);
    trainer tr;
    memset(&tr, 0, sizeof tr);
    bytes_map chunks = {0};
    prl_status rc = tok__new_base(&tr.tok);
    if (!rc) rc = train_count_chunks(texts, lens, n_texts, &chunks);
    if (!rc) rc = train_build_words(&tr, &chunks);
    tok__bytes_map_free(&chunks); /* the words hold their own copies of the symbols */
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
