/*
** tokenizer_hf_encode.c — encoding with an imported Hugging Face tokenizer, in Hugging Face's
** order: the text is split on added tokens first (those with normalized = false on the raw
** text, the others on each normalized piece), each remaining piece is normalized and
** pre-tokenized into words, and each word is BPE'd: its bytes (byte-level) or characters
** (with <0xXX> byte_fallback, else unk) become the first symbols and prl's merge loop
** (tokenizer_encode.c) applies the ranked merges; ignore_merges takes a word that is itself
** in the vocabulary as one token.
*/
#include "engine/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ============================================================ added tokens ============ */

/* The code point ending at s[p) (p > 0) or starting at s[p], for the word checks. */
static utf8proc_int32_t cp_before(const uint8_t *s, size_t p)
{
    size_t q = p - 1;
    while (q > 0 && (s[q] & 0xC0) == 0x80) q--;
    utf8proc_int32_t cp = -1;
    utf8proc_iterate(s + q, (utf8proc_ssize_t)(p - q), &cp);
    return cp;
}

static utf8proc_int32_t cp_at(const uint8_t *s, size_t n, size_t p)
{
    utf8proc_int32_t cp = -1;
    utf8proc_iterate(s + p, (utf8proc_ssize_t)(n - p), &cp);
    return cp;
}

/* Rust's char::is_alphanumeric() || '_' (single_word's notion of a word character). */
static int is_word_cp(utf8proc_int32_t cp)
{
    if (cp == '_') return 1;
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static int is_space_cp(utf8proc_int32_t cp)
{
    return cp == ' ' || (cp >= '\t' && cp <= '\r') || cp == 0x85 ||
           utf8proc_category(cp) == UTF8PROC_CATEGORY_ZS || cp == 0x2028 || cp == 0x2029;
}

/* Does an added token take part in this pass? The raw pass takes normalized = false ones,
** the normalized pass the others; special ones only when PRL_TOKENIZER_SPECIAL is set. */
static int added_in_pass(const hf_added *a, int normalized, unsigned flags)
{
    return a->normalized == normalized && (!a->special || (flags & PRL_TOKENIZER_SPECIAL));
}

/* The leftmost, then longest, added token in s[from, n): returns its start (n if none) and
** sets [*ms, *me) to what it covers (lstrip/rstrip widen it over whitespace) and *id. */
static size_t find_added(const hf_tokenizer *hf, unsigned flags, int normalized, const uint8_t *s,
                         size_t n, size_t from, size_t *ms, size_t *me, int32_t *id)
{
    for (size_t p = from; p < n; p++) {
        uint32_t lo = hf->by_byte_start[s[p]], hi = hf->by_byte_start[s[p] + 1];
        for (uint32_t k = lo; k < hi; k++) {
            const hf_added *a = &hf->added[hf->by_byte[k]];
            if (a->len > n - p || !added_in_pass(a, normalized, flags) ||
                memcmp(s + p, a->content, a->len) != 0)
                continue;
            size_t q = p + a->len;
            if (a->single_word &&
                ((p > 0 && is_word_cp(cp_before(s, p))) || (q < n && is_word_cp(cp_at(s, n, q)))))
                continue;
            size_t a0 = p, b0 = q;
            while (a->lstrip && a0 > from && is_space_cp(cp_before(s, a0))) {
                a0--;
                while (a0 > from && (s[a0] & 0xC0) == 0x80) a0--;
            }
            while (a->rstrip && b0 < n && is_space_cp(cp_at(s, n, b0))) b0 += tok__utf8_len(s[b0]);
            *ms = a0, *me = b0, *id = a->id;
            return a0;
        }
    }
    *ms = *me = n, *id = -1;
    return n;
}

/* ============================================================ words =================== */

prl_status tok__hf_word(encoder *e, const uint8_t *b, size_t m, size_t *n_out)
{
    const hf_tokenizer *hf = e->tok->hf;
    int32_t *sym = e->sym;
    if (hf->ignore_merges) {
        int64_t id = tok__bytes_map_get(&hf->model_ids, b, m);
        if (id >= 0) {
            sym[0] = (int32_t)id;
            *n_out = 1;
            return PRL_OK;
        }
    }
    size_t k = 0;
    int last_unk = 0;
    for (size_t i = 0; i < m;) {
        size_t L = hf->byte_level ? 1 : tok__utf8_len(b[i]);
        if (L > m - i) L = m - i;
        int64_t id =
            hf->byte_level ? hf->byte_id[b[i]] : tok__bytes_map_get(&hf->model_ids, b + i, L);
        if (id >= 0) {
            sym[k++] = (int32_t)id, last_unk = 0;
        } else {
            int fell_back = 0;
            if (hf->byte_fallback) { /* every byte's <0xXX> must exist, else unk */
                size_t j = 0;
                while (j < L && hf->byte_id[b[i + j]] >= 0) j++;
                if (j == L) {
                    for (j = 0; j < L; j++) sym[k++] = hf->byte_id[b[i + j]];
                    fell_back = 1, last_unk = 0;
                }
            }
            if (!fell_back && hf->unk_id >= 0) {
                if (!(hf->fuse_unk && last_unk)) sym[k++] = hf->unk_id;
                last_unk = 1;
            } /* no unk token: the character is dropped, as the Rust crate does */
        }
        i += L;
    }
    *n_out = tok__bpe(e, k);
    return PRL_OK;
}

/* ============================================================ pipeline ================ */

/* Pre-tokenize one normalized piece (is it the start of the text? for Metaspace "first") and
** encode its words. */
static prl_status encode_normalized(encoder *e, const uint8_t *s, size_t n, int first)
{
    const hf_tokenizer *hf = e->tok->hf;
    hf_pieces p = {.first = first};
    prl_status rc = tok__hf_pieces_push(&p, s, n);
    if (!rc) rc = tok__hf_pre_tokenize(hf, e->run, &p);
    for (size_t i = 0; i < p.n && !rc; i++)
        rc = tok__encode_word(e, p.buf + p.off[2 * i], p.off[2 * i + 1] - p.off[2 * i]);
    tok__hf_pieces_free(&p);
    return rc;
}

/* A raw piece between added tokens: normalize it, then split it on normalized added tokens. */
static prl_status encode_raw(encoder *e, const uint8_t *t, size_t n, int first)
{
    if (n == 0) return PRL_OK;
    const hf_tokenizer *hf = e->tok->hf;
    uint8_t *s = NULL;
    size_t len = 0;
    prl_status rc = tok__hf_normalize(hf, e->run, t, n, &s, &len);
    for (size_t p = 0; p < len && !rc;) {
        size_t ms, me;
        int32_t id;
        find_added(hf, e->flags, 1, s, len, p, &ms, &me, &id);
        if (ms > p) rc = encode_normalized(e, s + p, ms - p, first && p == 0);
        if (!rc && id >= 0) rc = tok__encoder_emit(e, &id, 1);
        p = me;
    }
    free(s);
    return rc;
}

/* The offset of the first byte that does not start valid UTF-8, or n. */
static size_t utf8_invalid_at(const uint8_t *t, size_t n)
{
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(t + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

prl_status tok__hf_encode_text(encoder *e, const uint8_t *t, size_t n)
{
    size_t bad = utf8_invalid_at(t, n);
    if (bad < n)
        return prl_error_set(PRL_ERR_ARG,
                             "tokenizer encode: the text is not valid UTF-8 at byte %zu "
                             "(an imported tokenizer takes UTF-8 text)",
                             bad);
    prl_status rc = e->run ? PRL_OK : tok__hf_run_new(&e->run);
    const hf_tokenizer *hf = e->tok->hf;
    for (size_t p = 0; p < n && !rc;) {
        size_t ms, me;
        int32_t id;
        find_added(hf, e->flags, 0, t, n, p, &ms, &me, &id);
        rc = encode_raw(e, t + p, ms - p, p == 0);
        if (!rc && id >= 0) rc = tok__encoder_emit(e, &id, 1);
        p = me;
    }
    return rc;
}
