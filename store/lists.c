/*
** lists.c — whole tables of one run read back in order, for readers that show a run
** (prl report): every step with its metrics, every event. Reads only.
*/
#include "store/store_int.h"

#include <stdlib.h>
#include <string.h>

/* Grow *a (elements of `size` bytes) so that it holds n + 1; NOMEM names `what`. */
static prl_status grow(void **a, size_t size, size_t n, size_t *cap, const char *what)
{
    if (n < *cap) return PRL_OK;
    size_t nc = *cap ? 2 * *cap : 64;
    void *p = realloc(*a, nc * size);
    if (!p) return prl_error_set(PRL_ERR_NOMEM, "reading %zu %s", nc, what);
    *a = p, *cap = nc;
    return PRL_OK;
}

static const char SQL_STEPS_LIST[] =
    "SELECT step, metrics, reward_mean, accuracy, tokens_per_s, step_seconds FROM steps "
    "WHERE run = ?1 ORDER BY step";

static prl_status step_row(sqlite3_stmt *st, int64_t run, prl_store_step *s)
{
    memset(s, 0, sizeof *s);
    s->run = run;
    s->step = sqlite3_column_int64(st, 0);
    s->reward_mean = sqlite3_column_double(st, 2);
    s->accuracy = sqlite3_column_double(st, 3);
    s->tokens_per_s = sqlite3_column_double(st, 4);
    s->step_seconds = sqlite3_column_double(st, 5);
    return store_column_text(st, 1, &s->metrics);
}

prl_status prl_store_steps_list(prl_store *db, int64_t run, prl_store_step **out, size_t *n_out)
{
    *out = NULL, *n_out = 0;
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_STEPS_LIST, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    prl_store_step *a = NULL;
    size_t n = 0, cap = 0;
    int r = SQLITE_DONE;
    while (rc == PRL_OK && (r = sqlite3_step(st)) == SQLITE_ROW) {
        rc = grow((void **)&a, sizeof *a, n, &cap, "steps");
        if (rc == PRL_OK) rc = step_row(st, run, &a[n]);
        if (rc == PRL_OK) n++;
    }
    if (rc == PRL_OK && r != SQLITE_DONE) rc = store_sqlite_error(db, "reading the steps");
    sqlite3_reset(st);
    if (rc != PRL_OK) {
        prl_store_steps_free(a, n);
        return rc;
    }
    *out = a, *n_out = n;
    return PRL_OK;
}

void prl_store_steps_free(prl_store_step *a, size_t n)
{
    for (size_t i = 0; a && i < n; i++) free((void *)a[i].metrics);
    free(a);
}

static const char SQL_EVENTS_LIST[] =
    "SELECT id, time, kind, detail FROM events WHERE run = ?1 ORDER BY id";

static prl_status event_row(sqlite3_stmt *st, prl_store_event *e)
{
    memset(e, 0, sizeof *e);
    e->id = sqlite3_column_int64(st, 0);
    e->time = sqlite3_column_double(st, 1);
    prl_status rc = store_column_text(st, 2, &e->kind);
    if (rc == PRL_OK) rc = store_column_text(st, 3, &e->detail);
    return rc;
}

prl_status prl_store_events_list(prl_store *db, int64_t run, prl_store_event **out, size_t *n_out)
{
    *out = NULL, *n_out = 0;
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_EVENTS_LIST, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    prl_store_event *a = NULL;
    size_t n = 0, cap = 0;
    int r = SQLITE_DONE;
    while (rc == PRL_OK && (r = sqlite3_step(st)) == SQLITE_ROW) {
        rc = grow((void **)&a, sizeof *a, n, &cap, "events");
        if (rc == PRL_OK) rc = event_row(st, &a[n]);
        if (rc == PRL_OK) n++;
        else free((void *)a[n].kind); /* a row whose detail failed keeps no half */
    }
    if (rc == PRL_OK && r != SQLITE_DONE) rc = store_sqlite_error(db, "reading the events");
    sqlite3_reset(st);
    if (rc != PRL_OK) {
        prl_store_events_free(a, n);
        return rc;
    }
    *out = a, *n_out = n;
    return PRL_OK;
}

void prl_store_events_free(prl_store_event *a, size_t n)
{
    for (size_t i = 0; a && i < n; i++) free((void *)a[i].kind), free((void *)a[i].detail);
    free(a);
}
