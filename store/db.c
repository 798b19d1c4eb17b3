/*
** db.c — the store handle: opening (pragmas, migrations), the prepared-statement cache,
** transactions (own or the caller's batch), integrity check and shared helpers.
**
** synchronous=FULL: a result counts as delivered (its lease is released) once its
** transaction commits, so a commit must survive an OS crash or power loss, not only a killed
** process; the price is one fsync of the WAL per transaction, which the controller amortises
** by batching a step's writes with prl_store_begin/commit.
*/
#include "store/store_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { STORE_BUSY_TIMEOUT_MS = 10000 };

prl_status store_sqlite_error(prl_store *db, const char *what)
{
    int ec = sqlite3_errcode(db->db);
    prl_status code = (ec == SQLITE_CORRUPT || ec == SQLITE_NOTADB) ? PRL_ERR_FORMAT
                      : ec == SQLITE_NOMEM                          ? PRL_ERR_NOMEM
                                                                    : PRL_ERR_IO;
    return prl_error_set(code, "%s: %s: %s", db->path, what, sqlite3_errmsg(db->db));
}

prl_status store_exec(prl_store *db, const char *sql, const char *what)
{
    if (sqlite3_exec(db->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return store_sqlite_error(db, what);
    return PRL_OK;
}

prl_status store_stmt(prl_store *db, const char *sql, sqlite3_stmt **st)
{
    for (int i = 0; i < db->n_stmts; i++)
        if (db->stmt_sql[i] == sql) {
            sqlite3_reset(db->stmt[i]);
            sqlite3_clear_bindings(db->stmt[i]);
            *st = db->stmt[i];
            return PRL_OK;
        }
    PRL_ASSERT(db->n_stmts < STORE_MAX_STMTS);
    if (sqlite3_prepare_v3(db->db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL) != SQLITE_OK)
        return store_sqlite_error(db, sql);
    db->stmt_sql[db->n_stmts] = sql;
    db->stmt[db->n_stmts++] = *st;
    return PRL_OK;
}

prl_status store_step_done(prl_store *db, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) return store_sqlite_error(db, what);
    return PRL_OK;
}

prl_status store_tx_begin(prl_store *db)
{
    prl_status rc = store_exec(db, db->tx_depth == 0 ? "BEGIN IMMEDIATE" : "SAVEPOINT prl_op",
                               "beginning a transaction");
    if (rc == PRL_OK) db->tx_depth++;
    return rc;
}

prl_status store_tx_end(prl_store *db, prl_status rc)
{
    PRL_ASSERT(db->tx_depth > 0);
    /* keep the caller's message: the rollback below must not overwrite it */
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", prl_error_message());
    db->tx_depth--;
    prl_status end;
    if (db->tx_depth == 0)
        end = store_exec(db, rc == PRL_OK ? "COMMIT" : "ROLLBACK", "ending a transaction");
    else if (rc == PRL_OK) end = store_exec(db, "RELEASE prl_op", "releasing a savepoint");
    else end = store_exec(db, "ROLLBACK TO prl_op; RELEASE prl_op", "rolling back a savepoint");
    if (rc != PRL_OK) return prl_error_set(rc, "%s", saved);
    /* a failed COMMIT leaves the transaction open: undo it so the handle stays usable */
    if (end != PRL_OK && db->tx_depth == 0 && !sqlite3_get_autocommit(db->db))
        sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
    return end;
}

prl_status store_insert_or_compare(prl_store *db, const char *insert_sql, const char *same_sql,
                                   void (*bind)(sqlite3_stmt *, const void *), const void *arg,
                                   int *same, const char *what)
{
    sqlite3_stmt *st;
    *same = 1;
    prl_status rc = store_stmt(db, insert_sql, &st);
    if (rc != PRL_OK) return rc;
    bind(st, arg);
    rc = store_step_done(db, st, what);
    if (rc != PRL_OK || sqlite3_changes(db->db) == 1) return rc;
    rc = store_stmt(db, same_sql, &st);
    if (rc != PRL_OK) return rc;
    bind(st, arg);
    int r = sqlite3_step(st);
    *same = r == SQLITE_ROW && sqlite3_column_int(st, 0) == 1;
    sqlite3_reset(st);
    if (r != SQLITE_ROW) return store_sqlite_error(db, what);
    return PRL_OK;
}

prl_status store_count(prl_store *db, const char *sql, int64_t run, const char *text,
                       int64_t *count, const char *what)
{
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, sql, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    if (text) sqlite3_bind_text(st, 2, text, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_ROW) rc = store_sqlite_error(db, what);
    else *count = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return rc;
}

prl_status prl_store_begin(prl_store *db) { return store_tx_begin(db); }
prl_status prl_store_commit(prl_store *db)
{
    if (db->tx_depth == 0) return prl_error_set(PRL_ERR_ARG, "prl_store_commit: no open batch");
    return store_tx_end(db, PRL_OK);
}
prl_status prl_store_rollback(prl_store *db)
{
    if (db->tx_depth == 0) return prl_error_set(PRL_ERR_ARG, "prl_store_rollback: no open batch");
    prl_error_set(PRL_ERR_ARG, "batch rolled back");
    store_tx_end(db, PRL_ERR_ARG);
    return PRL_OK;
}

prl_status store_column_text(sqlite3_stmt *st, int col, const char **out)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    *out = NULL;
    if (!t) return PRL_OK;
    char *copy = strdup((const char *)t);
    if (!copy) return prl_error_set(PRL_ERR_NOMEM, "copying a text column");
    *out = copy;
    return PRL_OK;
}

double store_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

prl_status store_json_check(const char *json, const char *what)
{
    json_error_t err;
    json_t *j = json_loads(json, JSON_DECODE_ANY, &err);
    int is_object = json_is_object(j);
    json_decref(j);
    if (!j) return prl_error_set(PRL_ERR_FORMAT, "%s is not JSON: %s", what, err.text);
    if (!is_object) return prl_error_set(PRL_ERR_FORMAT, "%s is not a JSON object", what);
    return PRL_OK;
}

/* busy timeout, WAL (checked: a read-only medium may refuse it), FULL sync, foreign keys */
static prl_status store_configure(prl_store *db)
{
    sqlite3_busy_timeout(db->db, STORE_BUSY_TIMEOUT_MS);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db->db, "PRAGMA journal_mode = WAL", -1, &st, NULL) != SQLITE_OK)
        return store_sqlite_error(db, "setting journal_mode");
    int rc = sqlite3_step(st);
    char mode[16] = "";
    if (rc == SQLITE_ROW) snprintf(mode, sizeof mode, "%s", sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW) return store_sqlite_error(db, "setting journal_mode");
    if (strcmp(mode, "wal") != 0)
        return prl_error_set(PRL_ERR_IO, "%s: journal_mode is \"%s\", WAL is required", db->path,
                             mode);
    return store_exec(db, "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON",
                      "setting synchronous and foreign_keys");
}

prl_status prl_store_open(const char *path, prl_store **out)
{
    *out = NULL;
    prl_store *db = calloc(1, sizeof *db);
    if (!db || !(db->path = strdup(path))) {
        free(db);
        return prl_error_set(PRL_ERR_NOMEM, "opening %s", path);
    }
    prl_status rc = PRL_OK;
    if (sqlite3_open_v2(path, &db->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK)
        rc = store_sqlite_error(db, "open");
    if (rc == PRL_OK) rc = store_configure(db);
    if (rc == PRL_OK) rc = store_migrate(db->db, path, PRL_STORE_SCHEMA_VERSION);
    if (rc != PRL_OK) {
        prl_store_close(db);
        return rc;
    }
    *out = db;
    return PRL_OK;
}

/* The schema version a reader can read: 1 (the tables) up to this code's. */
static prl_status readonly_check_version(prl_store *db)
{
    int v = 0;
    prl_status rc = prl_store_schema_version(db, &v);
    if (rc != PRL_OK) return rc;
    if (v > PRL_STORE_SCHEMA_VERSION)
        return prl_error_set(PRL_ERR_UNSUPPORTED,
                             "%s: schema version %d is newer than this prl's version %d; use "
                             "a newer prl to read it",
                             db->path, v, PRL_STORE_SCHEMA_VERSION);
    if (v < 1)
        return prl_error_set(PRL_ERR_FORMAT, "%s: schema version %d: not a prl run database",
                             db->path, v);
    return PRL_OK;
}

prl_status prl_store_open_readonly(const char *path, prl_store **out)
{
    *out = NULL;
    prl_store *db = calloc(1, sizeof *db);
    if (!db || !(db->path = strdup(path))) {
        free(db);
        return prl_error_set(PRL_ERR_NOMEM, "opening %s", path);
    }
    prl_status rc = PRL_OK;
    /* READONLY without CREATE: a missing file is an error, never an empty new database */
    if (sqlite3_open_v2(path, &db->db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK)
        rc = store_sqlite_error(db, "open (read-only)");
    if (rc == PRL_OK) sqlite3_busy_timeout(db->db, STORE_BUSY_TIMEOUT_MS);
    if (rc == PRL_OK) rc = readonly_check_version(db);
    if (rc != PRL_OK) {
        prl_store_close(db);
        return rc;
    }
    *out = db;
    return PRL_OK;
}

void prl_store_close(prl_store *db)
{
    if (!db) return;
    if (db->tx_depth > 0) sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
    for (int i = 0; i < db->n_stmts; i++) sqlite3_finalize(db->stmt[i]);
    sqlite3_close(db->db);
    free(db->path);
    free(db);
}

prl_status prl_store_schema_version(prl_store *db, int *version)
{
    static const char sql[] = "PRAGMA user_version";
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, sql, &st);
    if (rc != PRL_OK) return rc;
    if (sqlite3_step(st) != SQLITE_ROW) return store_sqlite_error(db, "reading user_version");
    *version = sqlite3_column_int(st, 0);
    sqlite3_reset(st);
    return PRL_OK;
}

prl_status prl_store_check(prl_store *db)
{
    static const char sql[] = "PRAGMA integrity_check";
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, sql, &st);
    if (rc != PRL_OK) return rc;
    if (sqlite3_step(st) != SQLITE_ROW) return store_sqlite_error(db, "integrity_check");
    const char *first = (const char *)sqlite3_column_text(st, 0);
    if (!first || strcmp(first, "ok") != 0)
        rc = prl_error_set(PRL_ERR_FORMAT, "%s: integrity_check: %s", db->path,
                           first ? first : "(null)");
    sqlite3_reset(st);
    return rc;
}
