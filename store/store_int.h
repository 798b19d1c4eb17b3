/*
** store_int.h — internals shared by the store's sources: the handle, the statement cache,
** transactions, and error helpers. Not installed; tests may include it to build old schemas.
*/
#ifndef PRL_STORE_INT_H
#define PRL_STORE_INT_H

#include "store/store.h"

#include <sqlite3.h>

enum { STORE_MAX_STMTS = 48 };

struct prl_store {
    sqlite3 *db;
    char *path;
    int tx_depth; /* nesting of store_tx_begin / prl_store_begin */
    int n_stmts;
    const char *stmt_sql[STORE_MAX_STMTS]; /* keys: the static SQL strings' addresses */
    sqlite3_stmt *stmt[STORE_MAX_STMTS];
};

/* The cached prepared statement for `sql` (a static string: its address is the key), reset
** and with its bindings cleared. Errors name the SQL. */
prl_status store_stmt(prl_store *db, const char *sql, sqlite3_stmt **st);
/* Record the connection's last error as PRL_ERR_IO (or PRL_ERR_FORMAT for a corrupt file),
** prefixed by `what`. */
prl_status store_sqlite_error(prl_store *db, const char *what);
/* sqlite3_step expecting SQLITE_DONE. */
prl_status store_step_done(prl_store *db, sqlite3_stmt *st, const char *what);
/* Run one statement without results; errors name `what`. */
prl_status store_exec(prl_store *db, const char *sql, const char *what);

/* A write: BEGIN IMMEDIATE at depth 0, else a SAVEPOINT; end commits or releases on rc ==
** PRL_OK and rolls back otherwise, then returns rc (keeping its message). */
prl_status store_tx_begin(prl_store *db);
prl_status store_tx_end(prl_store *db, prl_status rc);

/* Idempotent insert: run insert_sql (… ON CONFLICT DO NOTHING) bound by bind(st, arg); when
** it inserted nothing, run same_sql (same bindings; one row, one boolean column "the stored
** row equals the new one") into *same. A fresh insert sets *same = 1. */
prl_status store_insert_or_compare(prl_store *db, const char *insert_sql, const char *same_sql,
                                   void (*bind)(sqlite3_stmt *, const void *), const void *arg,
                                   int *same, const char *what);
/* count(*) of a query bound with ?1 = run and ?2 = text (NULL stays NULL). */
prl_status store_count(prl_store *db, const char *sql, int64_t run, const char *text,
                       int64_t *count, const char *what);
/* A malloc'd copy of a text column (NULL stays NULL); NOMEM is reported. */
prl_status store_column_text(sqlite3_stmt *st, int col, const char **out);
/* Unix time in seconds (CLOCK_REALTIME). */
double store_now(void);
/* JSON text must be an object: PRL_ERR_FORMAT naming `what` otherwise. */
prl_status store_json_check(const char *json, const char *what);

/* Migrations (schema.c): the SQL that takes the schema from version i to i + 1 is
** store_migrations[i]; store_migrate applies those from the file's version up to `target`,
** each in its own transaction that also sets user_version. */
extern const char *const store_migrations[PRL_STORE_SCHEMA_VERSION];
prl_status store_migrate(sqlite3 *db, const char *path, int target);

#endif /* PRL_STORE_INT_H */
