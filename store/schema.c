/*
** schema.c — the run database's schema as an ordered list of migrations, and the code that
** applies them. Version i + 1 is reached by running store_migrations[i] in one transaction
** that also sets PRAGMA user_version; a file newer than this code is refused.
**
** Append a step to change the schema; never edit a released one (docs/store.md).
*/
#include "store/store_int.h"

#include <stdio.h>

const char *const store_migrations[PRL_STORE_SCHEMA_VERSION] = {
    /* 0 → 1: the tables */
    "CREATE TABLE runs ("
    "  id INTEGER PRIMARY KEY,"
    "  name TEXT NOT NULL UNIQUE,"
    "  config TEXT NOT NULL CHECK (json_valid(config)),"
    "  seed INTEGER NOT NULL,"
    "  created REAL NOT NULL,"
    "  status TEXT NOT NULL);"
    "CREATE TABLE versions ("
    "  run INTEGER NOT NULL REFERENCES runs(id),"
    "  version INTEGER NOT NULL CHECK (version >= 0),"
    "  path TEXT NOT NULL,"
    "  checksum TEXT NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  created REAL NOT NULL,"
    "  PRIMARY KEY (run, version));"
    "CREATE TABLE prompts ("
    "  run INTEGER NOT NULL REFERENCES runs(id),"
    "  prompt_id TEXT NOT NULL,"
    "  domain TEXT NOT NULL,"
    "  split TEXT NOT NULL,"
    "  task TEXT NOT NULL CHECK (json_valid(task)),"
    "  difficulty INTEGER NOT NULL,"
    "  solved_bits INTEGER NOT NULL DEFAULT 0,"
    "  last_epoch INTEGER NOT NULL DEFAULT -1,"
    "  retired INTEGER NOT NULL DEFAULT 0 CHECK (retired IN (0, 1)),"
    "  PRIMARY KEY (run, prompt_id));"
    "CREATE TABLE samples ("
    "  id INTEGER PRIMARY KEY,"
    "  run INTEGER NOT NULL REFERENCES runs(id),"
    "  step INTEGER NOT NULL CHECK (step >= 0),"
    "  prompt_id TEXT NOT NULL,"
    "  sample_index INTEGER NOT NULL CHECK (sample_index >= 0),"
    "  tokens BLOB NOT NULL,"
    "  n_tokens INTEGER NOT NULL,"
    "  prompt_len INTEGER NOT NULL,"
    "  logprobs BLOB NOT NULL,"
    "  routes BLOB,"
    "  route_tokens INTEGER NOT NULL DEFAULT 0,"
    "  route_moe INTEGER NOT NULL DEFAULT 0,"
    "  route_k INTEGER NOT NULL DEFAULT 0,"
    "  route_width INTEGER NOT NULL DEFAULT 0,"
    "  loss_mask BLOB,"
    "  version INTEGER NOT NULL,"
    "  worker TEXT NOT NULL,"
    "  reward REAL NOT NULL,"
    "  reward_detail TEXT NOT NULL CHECK (json_valid(reward_detail)),"
    "  flags INTEGER NOT NULL DEFAULT 0,"
    "  stop INTEGER NOT NULL,"
    "  gen_seconds REAL NOT NULL DEFAULT 0,"
    "  reward_seconds REAL NOT NULL DEFAULT 0,"
    "  status TEXT NOT NULL CHECK (status IN ('ok', 'stale', 'dropped')),"
    "  created REAL NOT NULL,"
    "  UNIQUE (run, step, prompt_id, sample_index),"
    "  FOREIGN KEY (run, prompt_id) REFERENCES prompts(run, prompt_id));"
    "CREATE TABLE steps ("
    "  run INTEGER NOT NULL REFERENCES runs(id),"
    "  step INTEGER NOT NULL,"
    "  metrics TEXT NOT NULL CHECK (json_valid(metrics)),"
    "  reward_mean REAL,"
    "  accuracy REAL,"
    "  tokens_per_s REAL,"
    "  step_seconds REAL,"
    "  created REAL NOT NULL,"
    "  PRIMARY KEY (run, step));"
    "CREATE TABLE events ("
    "  id INTEGER PRIMARY KEY,"
    "  run INTEGER NOT NULL REFERENCES runs(id),"
    "  time REAL NOT NULL,"
    "  kind TEXT NOT NULL,"
    "  detail TEXT NOT NULL CHECK (json_valid(detail)));",
    /* 1 → 2: indexes for the controller's queries (the samples' key is already indexed by
    ** its UNIQUE constraint: per-step reads and counts use it) */
    "CREATE INDEX samples_by_status ON samples(run, status, step);"
    "CREATE INDEX samples_by_version ON samples(run, version);"
    "CREATE INDEX prompts_active ON prompts(run, retired, split);"
    "CREATE INDEX events_by_kind ON events(run, kind, time);",
    /* 2 → 3: the unsolved history (controller.retire_unsolved_epochs) */
    "ALTER TABLE prompts ADD COLUMN unsolved_bits INTEGER NOT NULL DEFAULT 0;",
    /* 3 → 4: the teacher KL of a prompt's last taught visit (opd.revisit; NULL: none) */
    "ALTER TABLE prompts ADD COLUMN teacher_kl REAL;",
};

static int user_version(sqlite3 *db, int *v)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *v = sqlite3_column_int(st, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

static prl_status migrate_error(sqlite3 *db, const char *path, int from)
{
    prl_status code = sqlite3_errcode(db) == SQLITE_NOTADB || sqlite3_errcode(db) == SQLITE_CORRUPT
                          ? PRL_ERR_FORMAT
                          : PRL_ERR_IO;
    prl_error_set(code, "%s: migrating the schema from version %d: %s", path, from,
                  sqlite3_errmsg(db));
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return code;
}

/* One step from → from + 1 in its own transaction; the version is re-read under the write
** lock, so two processes opening a fresh file cannot both apply a step. */
static prl_status migrate_one(sqlite3 *db, const char *path, int from, int *now)
{
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK ||
        user_version(db, now) != SQLITE_OK)
        return migrate_error(db, path, from);
    if (*now != from) return sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), PRL_OK;
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", from + 1);
    if (sqlite3_exec(db, store_migrations[from], NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(db, pragma, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        return migrate_error(db, path, from);
    *now = from + 1;
    return PRL_OK;
}

prl_status store_migrate(sqlite3 *db, const char *path, int target)
{
    PRL_ASSERT(target >= 0 && target <= PRL_STORE_SCHEMA_VERSION);
    int v = 0;
    if (user_version(db, &v) != SQLITE_OK) return migrate_error(db, path, 0);
    if (v > PRL_STORE_SCHEMA_VERSION)
        return prl_error_set(PRL_ERR_UNSUPPORTED,
                             "%s: schema version %d is newer than this prl's version %d; use "
                             "a newer prl to open it",
                             path, v, PRL_STORE_SCHEMA_VERSION);
    if (v < 0) return prl_error_set(PRL_ERR_FORMAT, "%s: schema version %d is negative", path, v);
    while (v < target) {
        prl_status rc = migrate_one(db, path, v, &v);
        if (rc != PRL_OK) return rc;
    }
    return PRL_OK;
}
