/*
** tokenizer_hf_steps.c — running the steps of an imported Hugging Face tokenizer (parsed by
** tokenizer_hf_parse.c): the normalizers (Unicode forms by libutf8proc, Prepend, Replace), the
** pre-tokenizers (Split by PCRE2, ByteLevel, Digits, Metaspace) over a list of pieces, and the
** decoders per token and on the joined text.
**
** Semantics follow Hugging Face's Rust crate: a Split finds every match of its pattern, marks
** the text between matches as non-matches (invert swaps the two), then keeps them by its
** behavior; empty pieces are dropped.
*/
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizer_int.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ============================================================ regex state ============= */

struct hf_run {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
};

prl_status tok__hf_run_new(hf_run **out)
{
    hf_run *r = calloc(1, sizeof *r);
    if (r) r->md = pcre2_match_data_create(4, NULL);
    if (r) r->mc = pcre2_match_context_create(NULL);
    if (r) r->js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    if (!r || !r->md || !r->mc) {
        tok__hf_run_free(r);
        *out = NULL;
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory (regex match data)");
    }
    /* a long whitespace run under \s+(?!\S) backtracks deeply: more than the default 32 KiB */
    if (r->js) pcre2_jit_stack_assign(r->mc, NULL, r->js);
    *out = r;
    return PRL_OK;
}

void tok__hf_run_free(hf_run *r)
{
    if (!r) return;
    pcre2_match_data_free(r->md);
    pcre2_match_context_free(r->mc);
    pcre2_jit_stack_free(r->js);
    free(r);
}

/* The first match of re in s[0..n) at or after pos: 1 and [*a, *b), 0 if none, < 0 error.
** The text was checked to be UTF-8 once, on entry. */
static int re_find(const pcre2_code *re, hf_run *run, const uint8_t *s, size_t n, size_t pos,
                   size_t *a, size_t *b)
{
    int rc = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, run->md, run->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        prl_error_set(PRL_ERR_FORMAT, "tokenizer: regex match failed: %s", (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(run->md);
    *a = ov[0], *b = ov[1];
    return 1;
}

/* ============================================================ byte buffers ============ */

typedef struct bbuf {
    uint8_t *p;
    size_t n, cap;
    int nomem;
} bbuf;

static void bb_put(bbuf *b, const void *s, size_t n)
{
    if (b->nomem || !tok__grow_array(&b->p, &b->cap, b->n + n + 1, 1)) {
        b->nomem = 1;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static prl_status bb_done(bbuf *b, uint8_t **out, size_t *len)
{
    bb_put(b, "", 0); /* ensures a buffer even for empty results */
    if (b->nomem) {
        free(b->p);
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory");
    }
    *out = b->p, *len = b->n;
    return PRL_OK;
}

/* s[0..n) with every occurrence of the step's pattern replaced by its content. */
static prl_status replace(const hf_step *st, hf_run *run, const uint8_t *s, size_t n, bbuf *o)
{
    size_t pos = 0;
    for (;;) {
        size_t a = n, b = n;
        if (st->re) {
            int k = re_find(st->re, run, s, n, pos, &a, &b);
            if (k < 0) return PRL_ERR_FORMAT;
            if (k == 0) a = b = n;
            else if (a == b) { /* an empty match replaces nothing: step over a character */
                size_t c = a < n ? tok__utf8_len(s[a]) : 1;
                bb_put(o, s + pos, a + c > n ? n - pos : a + c - pos);
                pos = a + c;
                if (pos >= n) break;
                continue;
            }
        } else {
            for (size_t i = pos; st->pattern_len && i + st->pattern_len <= n; i++)
                if (memcmp(s + i, st->pattern, st->pattern_len) == 0) {
                    a = i, b = i + st->pattern_len;
                    break;
                }
        }
        bb_put(o, s + pos, a - pos);
        if (a == n) break;
        bb_put(o, st->text, st->text_len);
        pos = b;
    }
    return PRL_OK;
}

/* ============================================================ normalizers ============= */

static prl_status unicode_form(hf_step_kind k, const uint8_t *s, size_t n, bbuf *o)
{
    int opt = UTF8PROC_STABLE;
    opt |= k == HF_NFC || k == HF_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
    if (k == HF_NFKC || k == HF_NFKD) opt |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t m = utf8proc_map(s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
    if (m < 0) return prl_error_set(PRL_ERR_ARG, "tokenizer normalize: %s", utf8proc_errmsg(m));
    bb_put(o, dst, (size_t)m);
    free(dst);
    return PRL_OK;
}

prl_status tok__hf_normalize(const hf_tokenizer *hf, hf_run *run, const uint8_t *s, size_t n,
                             uint8_t **out, size_t *out_len)
{
    bbuf cur = {0};
    bb_put(&cur, s, n);
    for (size_t i = 0; i < hf->n_norm && !cur.nomem; i++) {
        const hf_step *st = &hf->norm[i];
        bbuf nx = {0};
        prl_status rc = PRL_OK;
        switch (st->kind) {
        case HF_NFC:
        case HF_NFD:
        case HF_NFKC:
        case HF_NFKD: rc = unicode_form(st->kind, cur.p, cur.n, &nx); break;
        case HF_PREPEND: /* only a non-empty text gets the prefix */
            if (cur.n) bb_put(&nx, st->text, st->text_len);
            bb_put(&nx, cur.p, cur.n);
            break;
        case HF_REPLACE: rc = replace(st, run, cur.p, cur.n, &nx); break;
        default: PRL_ASSERT(0);
        }
        free(cur.p);
        if (rc) {
            free(nx.p);
            return rc;
        }
        cur = nx;
    }
    return bb_done(&cur, out, out_len);
}

/* ============================================================ pre-tokenizers ========== */

void tok__hf_pieces_free(hf_pieces *p)
{
    free(p->buf);
    free(p->off);
    memset(p, 0, sizeof *p);
}

/* Append a span [a, b) of p->buf (already there). */
static prl_status span(hf_pieces *p, size_t a, size_t b)
{
    if (a == b) return PRL_OK; /* Hugging Face drops empty pieces */
    if (!tok__grow_array(&p->off, &p->ncap, 2 * p->n + 2, sizeof *p->off))
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory (pieces)");
    p->off[2 * p->n] = a, p->off[2 * p->n + 1] = b;
    p->n++;
    return PRL_OK;
}

prl_status tok__hf_pieces_push(hf_pieces *p, const uint8_t *b, size_t n)
{
    if (!tok__grow_array(&p->buf, &p->cap, p->len + n + 1, 1))
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory (pieces)");
    memcpy(p->buf + p->len, b, n);
    p->len += n;
    return span(p, p->len - n, p->len);
}

/* The pieces of span [a0, b0) of buf split by the step's regex: matches and the gaps between
** them, kept by behavior (the Rust crate's SplitDelimiterBehavior folds). The span is its own
** subject, so lookarounds do not see the neighbouring pieces, as in Hugging Face. */
static prl_status split_span(const hf_step *st, hf_run *run, const uint8_t *buf, size_t a0,
                             size_t b0, hf_pieces *out)
{
    const uint8_t *s = buf + a0;
    size_t n = b0 - a0, pos = 0, last_end = 0;
    int prev_match = 0, have_prev = 0, holding = 0;
    size_t prev_a = 0, prev_b = 0, hold_a = 0; /* the piece being built; a held match */
    prl_status rc = PRL_OK;
#define EMIT(A, B)                                                                                 \
    do {                                                                                           \
        if ((rc = span(out, a0 + (A), a0 + (B)))) return rc;                                       \
    } while (0)
    for (int done = 0; !done;) {
        size_t a = n, b = n;
        int k = re_find(st->re, run, s, n, pos, &a, &b);
        if (k < 0) return PRL_ERR_FORMAT;
        if (k == 0) a = b = n, done = 1;
        else if (a == b) { /* an empty match makes no piece: step over a character */
            pos = a + (a < n ? tok__utf8_len(s[a]) : 1);
            if (pos <= n) continue;
            a = b = n, done = 1;
        }
        /* the gap [last_end, a) is a non-match, [a, b) a match (invert swaps them) */
        for (int part = 0; part < 2; part++) {
            size_t x = part == 0 ? last_end : a, y = part == 0 ? a : b;
            if (x == y) continue;
            int m = (part == 1) != (st->invert != 0);
            switch (st->behavior) {
            case HF_REMOVED:
                if (!m) EMIT(x, y);
                break;
            case HF_ISOLATED: EMIT(x, y); break;
            case HF_MERGED_WITH_PREVIOUS: /* a match joins the non-match before it */
                if (m && !prev_match && have_prev) prev_b = y;
                else {
                    if (have_prev) EMIT(prev_a, prev_b);
                    prev_a = x, prev_b = y, have_prev = 1;
                }
                prev_match = m;
                break;
            case HF_MERGED_WITH_NEXT:
                /* Rust folds from the right: a match whose right neighbour is a non-match
                ** joins it. From the left: hold a match until its right neighbour shows. */
                if (holding) {
                    holding = 0;
                    if (!m) {
                        EMIT(hold_a, y);
                        break;
                    }
                    EMIT(hold_a, x);
                }
                if (m) hold_a = x, holding = 1;
                else EMIT(x, y);
                break;
            case HF_CONTIGUOUS: /* runs of matches (or of non-matches) become one piece */
                if (have_prev && m == prev_match) prev_b = y;
                else {
                    if (have_prev) EMIT(prev_a, prev_b);
                    prev_a = x, prev_b = y, have_prev = 1;
                }
                prev_match = m;
                break;
            }
        }
        last_end = pos = b;
        if (pos >= n) done = 1;
    }
    if (have_prev) EMIT(prev_a, prev_b);
    if (holding) EMIT(hold_a, n);
#undef EMIT
    return PRL_OK;
}

/* Split every piece of *p by the step's regex. */
static prl_status split_all(const hf_step *st, hf_run *run, hf_pieces *p)
{
    hf_pieces out = {.buf = p->buf, .len = p->len, .cap = p->cap, .first = p->first};
    prl_status rc = PRL_OK;
    for (size_t i = 0; i < p->n && !rc; i++)
        rc = split_span(st, run, p->buf, p->off[2 * i], p->off[2 * i + 1], &out);
    free(p->off);
    *p = out;
    return rc;
}

/* Rewrite every piece: ByteLevel's prefix space, Metaspace's replacement and prefix. */
static prl_status rewrite_all(const hf_step *st, hf_pieces *p)
{
    hf_pieces out = {.first = p->first};
    prl_status rc = PRL_OK;
    bbuf b = {0};
    for (size_t i = 0; i < p->n && !rc; i++) {
        const uint8_t *s = p->buf + p->off[2 * i];
        size_t n = p->off[2 * i + 1] - p->off[2 * i];
        b.n = 0;
        if (st->kind == HF_BYTE_LEVEL) {
            if (n == 0 || s[0] != ' ') bb_put(&b, " ", 1);
            bb_put(&b, s, n);
        } else { /* Metaspace */
            int pre = st->flag == HF_PREPEND_ALWAYS ||
                      (st->flag == HF_PREPEND_FIRST && p->first && i == 0 && p->off[0] == 0);
            if (pre && !(n >= st->text_len && memcmp(s, st->text, st->text_len) == 0))
                bb_put(&b, st->text, st->text_len);
            for (size_t j = 0; j < n; j++)
                if (s[j] == ' ') bb_put(&b, st->text, st->text_len);
                else bb_put(&b, s + j, 1);
        }
        if (b.nomem) rc = prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory");
        else rc = tok__hf_pieces_push(&out, b.p, b.n);
    }
    free(b.p);
    tok__hf_pieces_free(p);
    *p = out;
    return rc;
}

/* Metaspace's split: each replacement character starts a new piece (MergedWithNext). */
static prl_status metaspace_split(const hf_step *st, hf_pieces *p)
{
    hf_pieces out = {.buf = p->buf, .len = p->len, .cap = p->cap, .first = p->first};
    prl_status rc = PRL_OK;
    for (size_t i = 0; i < p->n && !rc; i++) {
        size_t a = p->off[2 * i], b = p->off[2 * i + 1], start = a;
        for (size_t j = a; j + st->text_len <= b && !rc; j++)
            if (j > start && memcmp(p->buf + j, st->text, st->text_len) == 0) {
                rc = span(&out, start, j);
                start = j;
            }
        if (!rc) rc = span(&out, start, b);
    }
    free(p->off);
    *p = out;
    return rc;
}

prl_status tok__hf_pre_tokenize(const hf_tokenizer *hf, hf_run *run, hf_pieces *p)
{
    prl_status rc = PRL_OK;
    for (size_t i = 0; i < hf->n_pre && !rc; i++) {
        const hf_step *st = &hf->pre[i];
        switch (st->kind) {
        case HF_SPLIT:
        case HF_DIGITS: rc = split_all(st, run, p); break;
        case HF_BYTE_LEVEL:
            if (st->flag) rc = rewrite_all(st, p);
            if (!rc && st->re) {
                hf_step iso = *st;
                iso.behavior = HF_ISOLATED, iso.invert = 0;
                rc = split_all(&iso, run, p);
            }
            break;
        case HF_METASPACE:
            rc = rewrite_all(st, p);
            if (!rc && st->split) rc = metaspace_split(st, p);
            break;
        default: PRL_ASSERT(0);
        }
    }
    return rc;
}

/* ============================================================ decoders ================ */

/* GPT-2's byte-level alphabet, inverted: code point -> byte, -1 if not in it. */
static int byte_of_cp(unsigned cp)
{
    if ((cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 0x100 || cp >= 0x100 + 68) return -1;
    int k = (int)cp - 0x100; /* the k-th byte that is not printable, in byte order */
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (!printable && k-- == 0) return b;
    }
    return -1;
}

/* ByteLevel on one token: its bytes if every character is in the alphabet, else the token
** unchanged (as the Rust decoder does). */
static void byte_level_token(const uint8_t *s, size_t n, bbuf *o)
{
    size_t start = o->n;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        int b = k > 0 ? byte_of_cp((unsigned)cp) : -1;
        if (b < 0) {
            o->n = start;
            bb_put(o, s, n);
            return;
        }
        uint8_t c = (uint8_t)b;
        bb_put(o, &c, 1);
        i += (size_t)k;
    }
}

static int hexval(uint8_t c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void strip(const hf_step *st, const uint8_t *s, size_t n, size_t *a, size_t *b)
{
    size_t c = st->text_len;
    *a = 0, *b = n;
    for (int k = 0; k < st->start && *a + c <= *b && memcmp(s + *a, st->text, c) == 0; k++) *a += c;
    for (int k = 0; k < st->stop && *b >= *a + c && memcmp(s + *b - c, st->text, c) == 0; k++)
        *b -= c;
}

/* One decoder step on one token (or on the joined text). */
static prl_status dec_step(const hf_step *st, hf_run *run, const uint8_t *s, size_t n, bbuf *o)
{
    size_t a, b;
    switch (st->kind) {
    case HF_BYTE_LEVEL: byte_level_token(s, n, o); break;
    case HF_BYTE_FALLBACK: /* "<0xAB>" is the byte 0xAB */
        if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' &&
            hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
            uint8_t c = (uint8_t)(hexval(s[3]) << 4 | hexval(s[4]));
            bb_put(o, &c, 1);
        } else bb_put(o, s, n);
        break;
    case HF_FUSE: bb_put(o, s, n); break;
    case HF_STRIP:
        strip(st, s, n, &a, &b);
        bb_put(o, s + a, b - a);
        break;
    case HF_REPLACE: return replace(st, run, s, n, o);
    case HF_METASPACE:
        for (size_t i = 0; i < n;)
            if (i + st->text_len <= n && memcmp(s + i, st->text, st->text_len) == 0) {
                bb_put(o, " ", 1);
                i += st->text_len;
            } else bb_put(o, s + i++, 1);
        break;
    default: PRL_ASSERT(0);
    }
    return PRL_OK;
}

prl_status tok__hf_decode_token(const hf_tokenizer *hf, hf_run *run, const uint8_t *s, size_t n,
                                uint8_t **out, size_t *out_len)
{
    bbuf cur = {0};
    bb_put(&cur, s, n);
    for (size_t i = 0; i < hf->dec_join && !cur.nomem; i++) {
        const hf_step *st = &hf->dec[i];
        bbuf nx = {0};
        prl_status rc = dec_step(st, run, cur.p, cur.n, &nx);
        free(cur.p);
        if (rc) {
            free(nx.p);
            return rc;
        }
        cur = nx;
    }
    return bb_done(&cur, out, out_len);
}

void tok__hf_decode_joined(const hf_tokenizer *hf, char *text, size_t *len)
{
    uint8_t *s = (uint8_t *)text;
    if (hf->dec_strip_first && *len && s[0] == ' ') memmove(s, s + 1, --*len);
    for (size_t i = hf->dec_join; i < hf->n_dec; i++) {
        const hf_step *st = &hf->dec[i];
        if (st->kind == HF_STRIP) {
            size_t a, b;
            strip(st, s, *len, &a, &b);
            memmove(s, s + a, b - a);
            *len = b - a;
        } else if (st->kind == HF_REPLACE) { /* a String pattern no shorter than its content */
            bbuf o = {0};
            if (replace(st, NULL, s, *len, &o) == PRL_OK && !o.nomem) {
                memcpy(s, o.p, o.n);
                *len = o.n;
            }
            free(o.p);
        }
    }
}
