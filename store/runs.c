/*
** runs.c — runs, policy versions, steps and events: the small tables of the run database.
*/
#include "store/store_int.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- runs ------------- */

static const char SQL_RUN_INSERT[] =
    "INSERT INTO runs (name, config, seed, created, status) VALUES (?1, ?2, ?3, ?4, 'running')";

static prl_status run_insert(prl_store *db, const char *name, const char *config, uint64_t seed,
                             int64_t *id)
{
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_RUN_INSERT, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, config, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (int64_t)seed);
    sqlite3_bind_double(st, 4, store_now());
    int r = sqlite3_step(st);
    sqlite3_reset(st);
    if (r == SQLITE_CONSTRAINT)
        return prl_error_set(PRL_ERR_ARG, "run '%s' already exists in %s", name, db->path);
    if (r != SQLITE_DONE) return store_sqlite_error(db, "creating a run");
    *id = sqlite3_last_insert_rowid(db->db);
    return PRL_OK;
}

prl_status prl_store_run_create(prl_store *db, const char *name, const char *config_json,
                                uint64_t seed, int64_t *id)
{
    if (!name || !*name) return prl_error_set(PRL_ERR_ARG, "run name is empty");
    prl_status rc = store_json_check(config_json ? config_json : "", "run config");
    if (rc != PRL_OK) return prl_error_wrap(rc, "run '%s': ", name);
    rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    return store_tx_end(db, run_insert(db, name, config_json, seed, id));
}

static const char SQL_RUN_GET[] =
    "SELECT id, name, config, seed, created, status FROM runs WHERE name = ?1";

prl_status prl_store_run_get(prl_store *db, const char *name, prl_store_run *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_RUN_GET, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        out->id = sqlite3_column_int64(st, 0);
        out->seed = (uint64_t)sqlite3_column_int64(st, 3);
        out->created = sqlite3_column_double(st, 4);
        rc = store_column_text(st, 1, &out->name);
        if (rc == PRL_OK) rc = store_column_text(st, 2, &out->config);
        if (rc == PRL_OK) rc = store_column_text(st, 5, &out->status);
        if (rc != PRL_OK) prl_store_run_free(out);
    } else if (r == SQLITE_DONE) {
        rc = prl_error_set(PRL_ERR_RANGE, "no run '%s' in %s", name, db->path);
    } else {
        rc = store_sqlite_error(db, "reading a run");
    }
    sqlite3_reset(st);
    return rc;
}

static const char SQL_RUN_NAMES[] = "SELECT name FROM runs ORDER BY id LIMIT 2";

prl_status prl_store_run_sole(prl_store *db, prl_store_run *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_RUN_NAMES, &st);
    if (rc != PRL_OK) return rc;
    char *name = NULL;
    int rows = 0, r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW)
        if (rows++ == 0 && (rc = store_column_text(st, 0, (const char **)&name))) break;
    if (rc == PRL_OK && r != SQLITE_DONE) rc = store_sqlite_error(db, "reading the runs");
    sqlite3_reset(st);
    if (rc == PRL_OK && rows != 1)
        rc = prl_error_set(PRL_ERR_RANGE, "%s holds %s runs, not one", db->path,
                           rows ? "several" : "no");
    if (rc == PRL_OK) rc = prl_store_run_get(db, name, out);
    free(name);
    return rc;
}

void prl_store_run_free(prl_store_run *r)
{
    if (!r) return;
    free((void *)r->name), free((void *)r->config), free((void *)r->status);
    memset(r, 0, sizeof *r);
}

static const char SQL_RUN_STATUS[] = "UPDATE runs SET status = ?2 WHERE id = ?1";

prl_status prl_store_run_set_status(prl_store *db, int64_t run, const char *status)
{
    sqlite3_stmt *st;
    prl_status rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    rc = store_stmt(db, SQL_RUN_STATUS, &st);
    if (rc == PRL_OK) {
        sqlite3_bind_int64(st, 1, run);
        sqlite3_bind_text(st, 2, status, -1, SQLITE_STATIC);
        rc = store_step_done(db, st, "setting a run's status");
    }
    if (rc == PRL_OK && sqlite3_changes(db->db) == 0)
        rc = prl_error_set(PRL_ERR_RANGE, "no run with id %lld", (long long)run);
    return store_tx_end(db, rc);
}

/* ---------------------------------------------------------------- versions --------- */

static const char SQL_VERSION_INSERT[] =
    "INSERT INTO versions (run, version, path, checksum, step, created) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (run, version) DO NOTHING";
static const char SQL_VERSION_SAME[] =
    "SELECT path = ?3 AND checksum = ?4 AND step = ?5 FROM versions "
    "WHERE run = ?1 AND version = ?2";

/* Bind (run, version, path, checksum, step) as ?1..?5, and the time as ?6 where asked. */
static void version_bind(sqlite3_stmt *st, const void *arg)
{
    const prl_store_version *v = arg;
    sqlite3_bind_int64(st, 1, v->run);
    sqlite3_bind_int64(st, 2, v->version);
    sqlite3_bind_text(st, 3, v->path, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, v->checksum, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 5, v->step);
    if (sqlite3_bind_parameter_count(st) >= 6) sqlite3_bind_double(st, 6, store_now());
}

static prl_status version_insert(prl_store *db, const prl_store_version *v)
{
    int same;
    prl_status rc = store_insert_or_compare(db, SQL_VERSION_INSERT, SQL_VERSION_SAME, version_bind,
                                            v, &same, "adding a version");
    if (rc == PRL_OK && !same)
        return prl_error_set(PRL_ERR_ARG,
                             "version %lld of run %lld is already stored with a different "
                             "path, checksum or step",
                             (long long)v->version, (long long)v->run);
    return rc;
}

prl_status prl_store_version_add(prl_store *db, const prl_store_version *v)
{
    if (!v->path || !v->checksum || v->version < 0)
        return prl_error_set(PRL_ERR_ARG, "version %lld: path/checksum NULL or version < 0",
                             (long long)v->version);
    prl_status rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    return store_tx_end(db, version_insert(db, v));
}

static const char SQL_VERSION_BEFORE[] =
    "SELECT run, version, path, checksum, step, created FROM versions WHERE run = ?1 "
    "AND version < ?2 ORDER BY version DESC LIMIT 1";

prl_status prl_store_version_before(prl_store *db, int64_t run, int64_t version,
                                    prl_store_version *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_VERSION_BEFORE, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, version);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        out->run = sqlite3_column_int64(st, 0);
        out->version = sqlite3_column_int64(st, 1);
        out->step = sqlite3_column_int64(st, 4);
        out->created = sqlite3_column_double(st, 5);
        rc = store_column_text(st, 2, &out->path);
        if (rc == PRL_OK) rc = store_column_text(st, 3, &out->checksum);
        if (rc != PRL_OK) prl_store_version_free(out);
    } else if (r == SQLITE_DONE) {
        rc =
            version == INT64_MAX
                ? prl_error_set(PRL_ERR_RANGE, "run %lld has no policy version yet", (long long)run)
                : prl_error_set(PRL_ERR_RANGE, "run %lld has no policy version below %lld",
                                (long long)run, (long long)version);
    } else {
        rc = store_sqlite_error(db, "reading a version");
    }
    sqlite3_reset(st);
    return rc;
}

prl_status prl_store_version_latest(prl_store *db, int64_t run, prl_store_version *out)
{
    return prl_store_version_before(db, run, INT64_MAX, out);
}

static const char *const SQL_ROLLBACK[] = {
    "DELETE FROM samples WHERE run = ?1 AND version > ?2",
    "DELETE FROM versions WHERE run = ?1 AND version > ?2",
    "DELETE FROM steps WHERE run = ?1 AND step >= ?2",
};

prl_status prl_store_run_back_to(prl_store *db, int64_t run, int64_t version, int64_t *samples)
{
    prl_status rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    for (size_t i = 0; rc == PRL_OK && i < sizeof SQL_ROLLBACK / sizeof SQL_ROLLBACK[0]; i++) {
        sqlite3_stmt *st;
        rc = store_stmt(db, SQL_ROLLBACK[i], &st);
        if (rc != PRL_OK) break;
        sqlite3_bind_int64(st, 1, run);
        sqlite3_bind_int64(st, 2, version);
        rc = store_step_done(db, st, "taking the run back to an older version");
        if (rc == PRL_OK && i == 0 && samples) *samples = sqlite3_changes(db->db);
    }
    return store_tx_end(db, rc);
}

void prl_store_version_free(prl_store_version *v)
{
    if (!v) return;
    free((void *)v->path), free((void *)v->checksum);
    memset(v, 0, sizeof *v);
}

/* ---------------------------------------------------------------- steps ------------ */

static const char SQL_STEP_PUT[] =
    "INSERT OR REPLACE INTO steps (run, step, metrics, reward_mean, accuracy, tokens_per_s, "
    "step_seconds, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

static prl_status step_insert(prl_store *db, const prl_store_step *s)
{
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_STEP_PUT, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, s->run);
    sqlite3_bind_int64(st, 2, s->step);
    sqlite3_bind_text(st, 3, s->metrics, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 4, s->reward_mean);
    sqlite3_bind_double(st, 5, s->accuracy);
    sqlite3_bind_double(st, 6, s->tokens_per_s);
    sqlite3_bind_double(st, 7, s->step_seconds);
    sqlite3_bind_double(st, 8, store_now());
    rc = store_step_done(db, st, "writing a step");
    if (rc != PRL_OK) prl_error_wrap(rc, "step %lld: ", (long long)s->step);
    return rc;
}

prl_status prl_store_step_put(prl_store *db, const prl_store_step *s)
{
    prl_status rc = store_json_check(s->metrics ? s->metrics : "", "metrics");
    if (rc != PRL_OK) return prl_error_wrap(rc, "step %lld: ", (long long)s->step);
    rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    return store_tx_end(db, step_insert(db, s));
}

static const char SQL_STEP_LAST[] = "SELECT max(step) FROM steps WHERE run = ?1";

prl_status prl_store_step_last(prl_store *db, int64_t run, int64_t *step)
{
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_STEP_LAST, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    if (sqlite3_step(st) != SQLITE_ROW) rc = store_sqlite_error(db, "reading the last step");
    else if (sqlite3_column_type(st, 0) == SQLITE_NULL) *step = -1;
    else *step = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc;
}

static const char SQL_STEP_METRICS[] = "SELECT metrics FROM steps WHERE run = ?1 AND step = ?2";

prl_status prl_store_step_metrics(prl_store *db, int64_t run, int64_t step, char **metrics)
{
    *metrics = NULL;
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_STEP_METRICS, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, step);
    int r = sqlite3_step(st);
    if (r == SQLITE_DONE) {
        rc = prl_error_set(PRL_ERR_RANGE, "run %lld has no step %lld", (long long)run,
                           (long long)step);
    } else if (r != SQLITE_ROW) {
        rc = store_sqlite_error(db, "reading a step's metrics");
    } else {
        const char *t = (const char *)sqlite3_column_text(st, 0);
        *metrics = strdup(t ? t : "{}");
        if (!*metrics) rc = prl_error_set(PRL_ERR_NOMEM, "step %lld metrics", (long long)step);
    }
    sqlite3_reset(st);
    return rc;
}

/* ---------------------------------------------------------------- events ----------- */

static const char SQL_EVENT_ADD[] =
    "INSERT INTO events (run, time, kind, detail) VALUES (?1, ?2, ?3, ?4)";

static prl_status event_insert(prl_store *db, int64_t run, const char *kind, const char *detail)
{
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_EVENT_ADD, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_double(st, 2, store_now());
    sqlite3_bind_text(st, 3, kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, detail, -1, SQLITE_STATIC);
    return store_step_done(db, st, "adding an event");
}

prl_status prl_store_event_add(prl_store *db, int64_t run, const char *kind,
                               const char *detail_json)
{
    if (!kind || !*kind) return prl_error_set(PRL_ERR_ARG, "event kind is empty");
    if (!detail_json) detail_json = "{}";
    prl_status rc = store_json_check(detail_json, "event detail");
    if (rc != PRL_OK) return prl_error_wrap(rc, "event '%s': ", kind);
    rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    return store_tx_end(db, event_insert(db, run, kind, detail_json));
}

static const char SQL_EVENT_COUNT[] =
    "SELECT count(*) FROM events WHERE run = ?1 AND (?2 IS NULL OR kind = ?2)";

prl_status prl_store_event_count(prl_store *db, int64_t run, const char *kind, int64_t *count)
{
    return store_count(db, SQL_EVENT_COUNT, run, kind, count, "counting events");
}
