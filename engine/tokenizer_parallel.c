/*
** tokenizer_parallel.c — prl_tokenizer_encode_parallel: overlapping windows of the text
** encoded on threads by the serial encoder, joined where both windows agree on a chunk
** start, so the result is identical to serial encoding (the proof is below).
*/
#include "engine/tokenizer_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
    prl_status rc = tok__encoder_init(&e, tok, flags, w->end - w->begin, 1);
    if (!rc) rc = tok__encode_text(&e, text + w->begin, w->end - w->begin);
    if (rc) {
        tok__encoder_free(&e);
        return rc;
    }
    w->ids = e.ids;
    w->starts = e.starts;
    w->n = e.n;
    e.ids = NULL;
    e.starts = NULL;
    tok__encoder_free(&e);
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
        if (started && started[t]) pthread_join(th[t], NULL);
        else par_worker(&jobs[t]);
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
static int find_agreement(const prl_tokenizer *tok, const window *cur, join_pos *c, const window *r,
                          join_pos *rp, size_t lo, size_t hi)
{
    join_pos a = *c, b = {0, r->begin};
    while (a.i < cur->n && b.i < r->n && a.off < hi && b.off < hi) {
        if (a.off < b.off) {
            a.off += tok__len(tok, cur->ids[a.i++]);
        } else if (b.off < a.off) {
            b.off += tok__len(tok, r->ids[b.i++]);
        } else {
            if (a.off >= lo && cur->starts[a.i] && r->starts[b.i]) {
                *c = a;
                *rp = b;
                return 1;
            }
            a.off += tok__len(tok, cur->ids[a.i++]);
            b.off += tok__len(tok, r->ids[b.i++]);
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
        return prl_error_set(PRL_ERR_ARG,
                             "tokenizer encode_parallel: n_threads %d is outside "
                             "[1, 1024]",
                             *threads);
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
            return prl_error_set(w[k].rc,
                                 "tokenizer encode_parallel: window %zu [%zu, %zu): "
                                 "%s",
                                 k, w[k].begin, w[k].end, w[k].msg);
    return PRL_OK;
}

prl_status prl_tokenizer_encode_parallel(const prl_tokenizer *tok, const void *text, size_t len,
                                         unsigned flags, const prl_tokenizer_parallel_opts *opts,
                                         int32_t **ids, size_t *n_ids,
                                         prl_tokenizer_parallel_stats *stats)
{
    if (stats) memset(stats, 0, sizeof *stats);
    prl_status rc =
        tok__check_encode_args(tok, text, len, ids, n_ids, "prl_tokenizer_encode_parallel");
    int n_threads = 0;
    size_t chunk = 0, overlap = 0;
    if (!rc) rc = par_options(opts, len, &n_threads, &chunk, &overlap);
    if (rc) return rc;
    /* An imported tokenizer's word boundaries come from its regexes and normalizers, for which
    ** no locality bound like the one above is proven: it encodes serially (one window). */
    if (len == 0 || tok->hf) {
        if (stats && len) stats->n_windows = 1;
        return prl_tokenizer_encode(tok, text, len, flags, ids, n_ids);
    }

    size_t nw = (len - 1) / chunk + 1;
    if ((size_t)n_threads > nw) n_threads = (int)nw; /* an idle thread would only cost */
    window *w = calloc(nw, sizeof *w);
    par_job *jobs = calloc((size_t)n_threads, sizeof *jobs);
    if (!w || !jobs) {
        free(w), free(jobs);
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer encode_parallel: out of memory");
    }
    par_layout(w, nw, len, chunk, overlap);
    for (int t = 0; t < n_threads; t++) jobs[t] = (par_job){tok, text, flags, w, nw, n_threads, t};
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
