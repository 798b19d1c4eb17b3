/*
** samples.c — samples: idempotent insert by (run, step, prompt_id, sample_index), reads that
** validate every BLOB against the row's shape columns, status changes and counts.
**
** A read never trusts a row: a BLOB whose length disagrees with its shape columns, an
** unknown status or a bad shape is PRL_ERR_FORMAT naming the sample's key and the column.
*/
#include "store/store_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { STORE_MAX_TOKENS = 1 << 26, STORE_MAX_ROUTE_DIM = 1 << 16 };

static const char *const status_names[] = {"ok", "stale", "dropped"};

const char *prl_store_sample_status_name(prl_store_sample_status s)
{
    return (unsigned)s < 3 ? status_names[s] : "unknown";
}

static int status_parse(const char *name)
{
    for (int i = 0; name && i < 3; i++)
        if (strcmp(name, status_names[i]) == 0) return i;
    return -1;
}

/* "sample (run R, step S, prompt 'P', sample I)" into buf */
static const char *sample_key(char *buf, size_t n, int64_t run, int64_t step, const char *prompt_id,
                              int index)
{
    snprintf(buf, n, "sample (run %lld, step %lld, prompt '%s', sample %d)", (long long)run,
             (long long)step, prompt_id ? prompt_id : "(null)", index);
    return buf;
}

/* ---------------------------------------------------------------- validation ------- */

/* Bytes of a routes BLOB for a shape, or 0 for "no routes"; -1 for a bad shape. */
static long long routes_bytes(int tokens, int moe, int k, int width)
{
    if (tokens == 0 && moe == 0 && k == 0 && width == 0) return 0;
    if (tokens <= 0 || moe <= 0 || k <= 0 || (width != 1 && width != 2)) return -1;
    if (tokens > STORE_MAX_TOKENS || moe > STORE_MAX_ROUTE_DIM || k > STORE_MAX_ROUTE_DIM)
        return -1;
    return (long long)tokens * moe * k * width;
}

/* The shape and values a put needs; errors (PRL_ERR_ARG) name the field. */
static prl_status sample_check(const prl_store_sample *s)
{
    if (!s->prompt_id) return prl_error_set(PRL_ERR_ARG, "prompt_id is NULL");
    if (s->step < 0 || s->sample_index < 0)
        return prl_error_set(PRL_ERR_ARG, "step and sample_index must be >= 0");
    if (s->n_tokens < 1 || s->n_tokens > STORE_MAX_TOKENS || !s->tokens)
        return prl_error_set(PRL_ERR_ARG, "n_tokens %d (or tokens NULL)", s->n_tokens);
    if (s->prompt_len < 0 || s->prompt_len > s->n_tokens)
        return prl_error_set(PRL_ERR_ARG, "prompt_len %d outside [0, n_tokens %d]", s->prompt_len,
                             s->n_tokens);
    if (s->n_tokens > s->prompt_len && !s->logprobs)
        return prl_error_set(PRL_ERR_ARG, "logprobs NULL for %d response tokens",
                             s->n_tokens - s->prompt_len);
    long long rb = routes_bytes(s->route_tokens, s->route_moe, s->route_k, s->route_width);
    if (rb < 0 || (rb > 0) != (s->routes != NULL))
        return prl_error_set(PRL_ERR_ARG, "routes shape [%d][%d][%d] x %d bytes (routes %s)",
                             s->route_tokens, s->route_moe, s->route_k, s->route_width,
                             s->routes ? "given" : "NULL");
    for (int i = 0; s->loss_mask && i < s->n_tokens - s->prompt_len; i++)
        if (s->loss_mask[i] > 1)
            return prl_error_set(PRL_ERR_ARG, "loss_mask[%d] = %d, not 0 or 1", i, s->loss_mask[i]);
    if (!isfinite(s->reward)) return prl_error_set(PRL_ERR_NUMERIC, "reward is not finite");
    if (!s->worker) return prl_error_set(PRL_ERR_ARG, "worker is NULL");
    if (status_parse(prl_store_sample_status_name(s->status)) < 0)
        return prl_error_set(PRL_ERR_ARG, "status %d is not a prl_store_sample_status",
                             (int)s->status);
    if (s->reward_detail) return store_json_check(s->reward_detail, "reward_detail");
    return PRL_OK;
}

/* ---------------------------------------------------------------- reading ---------- */

/* The columns sample_from_row reads, in its order. */
#define SAMPLE_SELECT                                                                              \
    "SELECT run, step, prompt_id, sample_index, tokens, n_tokens, prompt_len, logprobs, "          \
    "routes, route_tokens, route_moe, route_k, route_width, loss_mask, version, worker, "          \
    "reward, reward_detail, flags, stop, gen_seconds, reward_seconds, status, created "            \
    "FROM samples "

/* A BLOB column into a malloc'd copy; NULL (or a non-BLOB) is allowed only if `optional`. */
static prl_status column_bytes(sqlite3_stmt *st, int col, const char *name, int optional,
                               uint8_t **out, size_t *bytes)
{
    *out = NULL, *bytes = 0;
    int type = sqlite3_column_type(st, col);
    if (type == SQLITE_NULL && optional) return PRL_OK;
    if (type != SQLITE_BLOB)
        return prl_error_set(PRL_ERR_FORMAT, "%s is not a BLOB (SQLite type %d)", name, type);
    const void *p = sqlite3_column_blob(st, col);
    *bytes = (size_t)sqlite3_column_bytes(st, col);
    *out = malloc(*bytes ? *bytes : 1);
    if (!*out) return prl_error_set(PRL_ERR_NOMEM, "%s: %zu bytes", name, *bytes);
    if (*bytes) memcpy(*out, p, *bytes);
    return PRL_OK;
}

/* Tokens and log-probs: decode the LE BLOBs against n_tokens / prompt_len. */
static prl_status decode_arrays(sqlite3_stmt *st, prl_store_sample *s)
{
    if (s->n_tokens < 1 || s->n_tokens > STORE_MAX_TOKENS || s->prompt_len < 0 ||
        s->prompt_len > s->n_tokens)
        return prl_error_set(PRL_ERR_FORMAT, "n_tokens %d / prompt_len %d out of range",
                             s->n_tokens, s->prompt_len);
    size_t n = (size_t)s->n_tokens, n_resp = n - (size_t)s->prompt_len, bytes;
    uint8_t *raw;
    int32_t *tokens = malloc(n * 4);
    float *logprobs = malloc(n_resp ? n_resp * 4 : 1);
    s->tokens = tokens, s->logprobs = logprobs;
    if (!tokens || !logprobs) return prl_error_set(PRL_ERR_NOMEM, "%zu tokens", n);
    prl_status rc = column_bytes(st, 4, "tokens", 0, &raw, &bytes);
    if (rc == PRL_OK) rc = prl_store_i32_decode(tokens, n, raw, bytes, "tokens");
    free(raw);
    if (rc != PRL_OK) return rc;
    rc = column_bytes(st, 7, "logprobs", 0, &raw, &bytes);
    if (rc == PRL_OK) rc = prl_store_f32_decode(logprobs, n_resp, raw, bytes, "logprobs");
    free(raw);
    return rc;
}

/* Routes and loss mask: sizes against the shape columns, mask values 0/1. */
static prl_status decode_routes_mask(sqlite3_stmt *st, prl_store_sample *s)
{
    uint8_t *raw;
    size_t bytes;
    long long want = routes_bytes(s->route_tokens, s->route_moe, s->route_k, s->route_width);
    if (want < 0)
        return prl_error_set(PRL_ERR_FORMAT, "routes shape [%d][%d][%d] x %d bytes is invalid",
                             s->route_tokens, s->route_moe, s->route_k, s->route_width);
    prl_status rc = column_bytes(st, 8, "routes", want == 0, &raw, &bytes);
    s->routes = raw;
    if (rc != PRL_OK) return rc;
    if ((long long)bytes != want)
        return prl_error_set(PRL_ERR_FORMAT,
                             "routes: %zu bytes, shape [%d][%d][%d] x %d needs %lld", bytes,
                             s->route_tokens, s->route_moe, s->route_k, s->route_width, want);
    if (want == 0) free(raw), s->routes = NULL;
    rc = column_bytes(st, 13, "loss_mask", 1, &raw, &bytes);
    s->loss_mask = raw;
    if (rc != PRL_OK || !raw) return rc;
    size_t n_resp = (size_t)(s->n_tokens - s->prompt_len);
    if (bytes != n_resp)
        return prl_error_set(PRL_ERR_FORMAT, "loss_mask: %zu bytes for %zu response tokens", bytes,
                             n_resp);
    for (size_t i = 0; i < bytes; i++)
        if (raw[i] > 1)
            return prl_error_set(PRL_ERR_FORMAT, "loss_mask[%zu] = %d, not 0 or 1", i, raw[i]);
    return PRL_OK;
}

/* Text fields and the status name. */
static prl_status decode_text(sqlite3_stmt *st, prl_store_sample *s)
{
    const char *status = (const char *)sqlite3_column_text(st, 22);
    int sv = status_parse(status);
    if (sv < 0)
        return prl_error_set(PRL_ERR_FORMAT, "status '%s' is not ok/stale/dropped",
                             status ? status : "(null)");
    s->status = (prl_store_sample_status)sv;
    prl_status rc = store_column_text(st, 15, &s->worker);
    if (rc == PRL_OK) rc = store_column_text(st, 17, &s->reward_detail);
    return rc;
}

/* One result row of SAMPLE_SELECT into *s (owned); on error *s is freed and the message
** starts with the sample's key. */
static prl_status sample_from_row(sqlite3_stmt *st, prl_store_sample *s)
{
    memset(s, 0, sizeof *s);
    s->run = sqlite3_column_int64(st, 0);
    s->step = sqlite3_column_int64(st, 1);
    s->sample_index = sqlite3_column_int(st, 3);
    s->n_tokens = sqlite3_column_int(st, 5);
    s->prompt_len = sqlite3_column_int(st, 6);
    s->route_tokens = sqlite3_column_int(st, 9);
    s->route_moe = sqlite3_column_int(st, 10);
    s->route_k = sqlite3_column_int(st, 11);
    s->route_width = sqlite3_column_int(st, 12);
    s->version = sqlite3_column_int64(st, 14);
    s->reward = sqlite3_column_double(st, 16);
    s->flags = (unsigned)sqlite3_column_int64(st, 18);
    s->stop = sqlite3_column_int(st, 19);
    s->gen_seconds = sqlite3_column_double(st, 20);
    s->reward_seconds = sqlite3_column_double(st, 21);
    s->created = sqlite3_column_double(st, 23);
    prl_status rc = store_column_text(st, 2, &s->prompt_id);
    if (rc == PRL_OK) rc = decode_arrays(st, s);
    if (rc == PRL_OK) rc = decode_routes_mask(st, s);
    if (rc == PRL_OK) rc = decode_text(st, s);
    if (rc != PRL_OK) {
        char key[256];
        sample_key(key, sizeof key, s->run, s->step, (const char *)sqlite3_column_text(st, 2),
                   s->sample_index);
        prl_error_wrap(rc, "%s: corrupted row: ", key);
        prl_store_sample_free(s);
    }
    return rc;
}

void prl_store_sample_free(prl_store_sample *s)
{
    if (!s) return;
    free((void *)s->prompt_id);
    free((void *)s->tokens);
    free((void *)s->logprobs);
    free((void *)s->routes);
    free((void *)s->loss_mask);
    free((void *)s->worker);
    free((void *)s->reward_detail);
    memset(s, 0, sizeof *s);
}

void prl_store_samples_free(prl_store_sample *a, size_t n)
{
    for (size_t i = 0; a && i < n; i++) prl_store_sample_free(&a[i]);
    free(a);
}

static const char SQL_SAMPLE_GET[] =
    SAMPLE_SELECT "WHERE run = ?1 AND step = ?2 AND prompt_id = ?3 AND sample_index = ?4";

prl_status prl_store_sample_get(prl_store *db, int64_t run, int64_t step, const char *prompt_id,
                                int sample_index, prl_store_sample *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_SAMPLE_GET, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, step);
    sqlite3_bind_text(st, 3, prompt_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, sample_index);
    int r = sqlite3_step(st);
    char key[256];
    if (r == SQLITE_ROW) rc = sample_from_row(st, out);
    else if (r == SQLITE_DONE)
        rc = prl_error_set(PRL_ERR_RANGE, "%s is not stored",
                           sample_key(key, sizeof key, run, step, prompt_id, sample_index));
    else rc = store_sqlite_error(db, "reading a sample");
    sqlite3_reset(st);
    return rc;
}

/* ---------------------------------------------------------------- writing ---------- */

static const char SQL_SAMPLE_INSERT[] =
    "INSERT INTO samples (run, step, prompt_id, sample_index, tokens, n_tokens, prompt_len, "
    "logprobs, routes, route_tokens, route_moe, route_k, route_width, loss_mask, version, "
    "worker, reward, reward_detail, flags, stop, gen_seconds, reward_seconds, status, created) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
    "?19, ?20, ?21, ?22, ?23, ?24) "
    "ON CONFLICT (run, step, prompt_id, sample_index) DO NOTHING";

/* Bind a BLOB; a zero-length one must not become NULL (a NULL pointer would). */
static void bind_blob(sqlite3_stmt *st, int i, const void *p, size_t n)
{
    static const uint8_t empty;
    sqlite3_bind_blob64(st, i, n ? p : &empty, n, SQLITE_TRANSIENT);
}

/* Encode and bind every column of s; the encoded arrays are freed here (TRANSIENT copies). */
static prl_status sample_bind(sqlite3_stmt *st, const prl_store_sample *s)
{
    size_t n = (size_t)s->n_tokens, n_resp = n - (size_t)s->prompt_len;
    uint8_t *tok = malloc(n * 4), *lp = malloc(n_resp ? n_resp * 4 : 1);
    if (!tok || !lp) {
        free(tok), free(lp);
        return prl_error_set(PRL_ERR_NOMEM, "encoding %zu tokens", n);
    }
    prl_store_i32_encode(tok, s->tokens, n);
    prl_store_f32_encode(lp, s->logprobs, n_resp);
    sqlite3_bind_int64(st, 1, s->run);
    sqlite3_bind_int64(st, 2, s->step);
    sqlite3_bind_text(st, 3, s->prompt_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, s->sample_index);
    bind_blob(st, 5, tok, n * 4);
    sqlite3_bind_int(st, 6, s->n_tokens);
    sqlite3_bind_int(st, 7, s->prompt_len);
    bind_blob(st, 8, lp, n_resp * 4);
    free(tok), free(lp);
    long long rb = routes_bytes(s->route_tokens, s->route_moe, s->route_k, s->route_width);
    if (rb > 0) bind_blob(st, 9, s->routes, (size_t)rb);
    sqlite3_bind_int(st, 10, s->route_tokens);
    sqlite3_bind_int(st, 11, s->route_moe);
    sqlite3_bind_int(st, 12, s->route_k);
    sqlite3_bind_int(st, 13, s->route_width);
    if (s->loss_mask) bind_blob(st, 14, s->loss_mask, n_resp);
    sqlite3_bind_int64(st, 15, s->version);
    sqlite3_bind_text(st, 16, s->worker, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 17, s->reward);
    sqlite3_bind_text(st, 18, s->reward_detail ? s->reward_detail : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 19, s->flags);
    sqlite3_bind_int(st, 20, s->stop);
    sqlite3_bind_double(st, 21, s->gen_seconds);
    sqlite3_bind_double(st, 22, s->reward_seconds);
    sqlite3_bind_text(st, 23, prl_store_sample_status_name(s->status), -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 24, store_now());
    return PRL_OK;
}

static int arrays_differ(const void *a, const void *b, size_t bytes)
{
    if (!a || !b) return a != b;
    return memcmp(a, b, bytes) != 0;
}

/* The first content field where the stored row `old` and the new sample differ, or NULL. */
static const char *sample_diff(const prl_store_sample *old, const prl_store_sample *s)
{
    if (old->n_tokens != s->n_tokens || old->prompt_len != s->prompt_len) return "n_tokens";
    size_t n = (size_t)s->n_tokens, n_resp = n - (size_t)s->prompt_len;
    if (arrays_differ(old->tokens, s->tokens, n * 4)) return "tokens";
    if (n_resp && arrays_differ(old->logprobs, s->logprobs, n_resp * 4)) return "logprobs";
    if (old->route_tokens != s->route_tokens || old->route_moe != s->route_moe ||
        old->route_k != s->route_k || old->route_width != s->route_width)
        return "routes shape";
    long long rb = routes_bytes(s->route_tokens, s->route_moe, s->route_k, s->route_width);
    if (rb > 0 && arrays_differ(old->routes, s->routes, (size_t)rb)) return "routes";
    if ((old->loss_mask != NULL) != (s->loss_mask != NULL) ||
        (s->loss_mask && n_resp && memcmp(old->loss_mask, s->loss_mask, n_resp) != 0))
        return "loss_mask";
    if (old->version != s->version) return "version";
    if (old->reward != s->reward) return "reward";
    if (strcmp(old->reward_detail, s->reward_detail ? s->reward_detail : "{}") != 0)
        return "reward_detail";
    if (old->flags != s->flags) return "flags";
    if (old->stop != s->stop) return "stop";
    return NULL;
}

/* The key exists: equal content → *already = 1, else an error naming key and field. */
static prl_status sample_compare_stored(prl_store *db, const prl_store_sample *s, int *already)
{
    prl_store_sample old;
    prl_status rc = prl_store_sample_get(db, s->run, s->step, s->prompt_id, s->sample_index, &old);
    if (rc != PRL_OK) return rc;
    const char *field = sample_diff(&old, s);
    prl_store_sample_free(&old);
    char key[256];
    sample_key(key, sizeof key, s->run, s->step, s->prompt_id, s->sample_index);
    if (field)
        return prl_error_set(PRL_ERR_ARG, "%s is already stored with a different %s", key, field);
    *already = 1;
    return PRL_OK;
}

static prl_status sample_insert(prl_store *db, const prl_store_sample *s, int *already)
{
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_SAMPLE_INSERT, &st);
    if (rc == PRL_OK) rc = sample_bind(st, s);
    if (rc != PRL_OK) return rc;
    char key[256];
    sample_key(key, sizeof key, s->run, s->step, s->prompt_id, s->sample_index);
    int r = sqlite3_step(st);
    sqlite3_reset(st);
    if (r != SQLITE_DONE) {
        rc = store_sqlite_error(db, "inserting a sample");
        if (sqlite3_extended_errcode(db->db) == SQLITE_CONSTRAINT_FOREIGNKEY)
            return prl_error_wrap(PRL_ERR_ARG, "%s (is its run and prompt stored?): ", key);
        return prl_error_wrap(rc, "%s: ", key);
    }
    if (sqlite3_changes(db->db) == 1) return PRL_OK;
    return sample_compare_stored(db, s, already);
}

prl_status prl_store_sample_put(prl_store *db, const prl_store_sample *s, int *already)
{
    int dummy;
    if (!already) already = &dummy;
    *already = 0;
    prl_status rc = sample_check(s);
    if (rc != PRL_OK) {
        char key[256];
        return prl_error_wrap(
            rc,
            "%s: ", sample_key(key, sizeof key, s->run, s->step, s->prompt_id, s->sample_index));
    }
    rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    return store_tx_end(db, sample_insert(db, s, already));
}

static const char SQL_SAMPLE_STATUS[] =
    "UPDATE samples SET status = ?5 "
    "WHERE run = ?1 AND step = ?2 AND prompt_id = ?3 AND sample_index = ?4";

prl_status prl_store_sample_set_status(prl_store *db, int64_t run, int64_t step,
                                       const char *prompt_id, int sample_index,
                                       prl_store_sample_status status)
{
    char key[256];
    sample_key(key, sizeof key, run, step, prompt_id, sample_index);
    if (status_parse(prl_store_sample_status_name(status)) < 0)
        return prl_error_set(PRL_ERR_ARG, "%s: status %d is not a prl_store_sample_status", key,
                             (int)status);
    sqlite3_stmt *st;
    prl_status rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    rc = store_stmt(db, SQL_SAMPLE_STATUS, &st);
    if (rc == PRL_OK) {
        sqlite3_bind_int64(st, 1, run);
        sqlite3_bind_int64(st, 2, step);
        sqlite3_bind_text(st, 3, prompt_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 4, sample_index);
        sqlite3_bind_text(st, 5, prl_store_sample_status_name(status), -1, SQLITE_STATIC);
        rc = store_step_done(db, st, "updating a sample's status");
    }
    if (rc == PRL_OK && sqlite3_changes(db->db) == 0)
        rc = prl_error_set(PRL_ERR_RANGE, "%s is not stored", key);
    return store_tx_end(db, rc);
}

/* ---------------------------------------------------------------- queries ---------- */

static const char SQL_SAMPLES_STEP[] =
    SAMPLE_SELECT "WHERE run = ?1 AND step = ?2 AND (?3 IS NULL OR status = ?3) "
                  "ORDER BY prompt_id, sample_index";

/* Bind a status filter: -1 → NULL (any). */
static prl_status bind_status(sqlite3_stmt *st, int i, int status)
{
    if (status < 0) return PRL_OK;
    const char *name = prl_store_sample_status_name((prl_store_sample_status)status);
    if (status_parse(name) < 0)
        return prl_error_set(PRL_ERR_ARG, "status filter %d is not -1 or a status", status);
    sqlite3_bind_text(st, i, name, -1, SQLITE_STATIC);
    return PRL_OK;
}

/* Append the current row to *a (grown by doubling). */
static prl_status samples_append(sqlite3_stmt *st, prl_store_sample **a, size_t *n, size_t *cap)
{
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 16;
        prl_store_sample *p = realloc(*a, c * sizeof *p);
        if (!p) return prl_error_set(PRL_ERR_NOMEM, "%zu samples", c);
        *a = p, *cap = c;
    }
    prl_status rc = sample_from_row(st, &(*a)[*n]);
    if (rc == PRL_OK) (*n)++;
    return rc;
}

prl_status prl_store_samples_for_step(prl_store *db, int64_t run, int64_t step, int status,
                                      prl_store_sample **out, size_t *n_out)
{
    *out = NULL, *n_out = 0;
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_SAMPLES_STEP, &st);
    if (rc == PRL_OK) rc = bind_status(st, 3, status);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, step);
    prl_store_sample *a = NULL;
    size_t n = 0, cap = 0;
    int r;
    while (rc == PRL_OK && (r = sqlite3_step(st)) == SQLITE_ROW)
        rc = samples_append(st, &a, &n, &cap);
    if (rc == PRL_OK && r != SQLITE_DONE) rc = store_sqlite_error(db, "reading a step's samples");
    sqlite3_reset(st);
    if (rc != PRL_OK) {
        prl_store_samples_free(a, n);
        return rc;
    }
    *out = a, *n_out = n;
    return PRL_OK;
}

static const char SQL_SAMPLE_COUNT[] =
    "SELECT count(*) FROM samples WHERE run = ?1 AND (?2 < 0 OR step = ?2) "
    "AND (?3 IS NULL OR status = ?3)";

prl_status prl_store_sample_count(prl_store *db, int64_t run, int64_t step, int status,
                                  int64_t *count)
{
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_SAMPLE_COUNT, &st);
    if (rc == PRL_OK) rc = bind_status(st, 3, status);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, step);
    if (sqlite3_step(st) != SQLITE_ROW) rc = store_sqlite_error(db, "counting samples");
    else *count = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc;
}

static const char SQL_SAMPLE_LAST_STEP[] = "SELECT max(step) FROM samples WHERE run = ?1";

prl_status prl_store_sample_last_step(prl_store *db, int64_t run, int64_t *step)
{
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_SAMPLE_LAST_STEP, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    if (sqlite3_step(st) != SQLITE_ROW) rc = store_sqlite_error(db, "reading the last sample step");
    else if (sqlite3_column_type(st, 0) == SQLITE_NULL) *step = -1;
    else *step = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc;
}
