/*
** test_store.c — Check tests for store/, the SQLite run database.
**
** Covers: create/open/reopen (WAL, schema version); migrations 0 → current and 1 → current
** keeping data; refusing a newer schema (both versions named); idempotent sample put (same →
** no-op, different → error naming the key and field); BLOB round trips (tokens, log-probs,
** routes, loss mask) and the encode/decode helpers; corrupted rows written with raw SQLite
** are errors naming the key and column; a child writing samples is SIGKILLed mid-way and the
** reopened file is consistent with every acknowledged sample intact; a WAL reader keeps its
** snapshot while the writer commits; batches and savepoints; versions, steps, events; a run
** taken back to an older version, the one run of a file; the read-only handle and the
** whole-table readers of reports;
** prompts' solved history and the retire rule; their teacher KL (opd.revisit); foreign keys
** and JSON checks.
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "store/store.h"
#include "store/store_int.h"

#include "tests/check_util.h"
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers ---------- */

static char tmpdir[64];
static char dbpath[128];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/prl-store-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(dbpath, sizeof dbpath, "%s/run.db", tmpdir);
}

static void teardown(void)
{
    const char *suffix[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        char p[160];
        snprintf(p, sizeof p, "%s%s", dbpath, suffix[i]);
        unlink(p);
    }
    rmdir(tmpdir);
}

/* A sample whose every array is a function of (prompt, index, seed), in caller storage. */
typedef struct fixture {
    int32_t tokens[12];
    float logprobs[8];
    uint8_t routes[11 * 3 * 2 * 2];
    uint8_t mask[8];
    char prompt[16];
    prl_store_sample s;
} fixture;

static void fixture_make(fixture *f, int64_t run, int64_t step, int prompt, int index, int seed)
{
    memset(f, 0, sizeof *f);
    snprintf(f->prompt, sizeof f->prompt, "p%d", prompt);
    for (int i = 0; i < 12; i++) f->tokens[i] = (i * 7919 + seed * 31 + index) % 50000 - (i == 3);
    for (int i = 0; i < 8; i++) f->logprobs[i] = -0.125f * (float)(i + seed + index);
    f->logprobs[0] = -0.0f, f->logprobs[1] = 1e-42f; /* sign of zero, a denormal */
    for (size_t i = 0; i < sizeof f->routes; i++) f->routes[i] = (uint8_t)(i * 13 + seed);
    for (int i = 0; i < 8; i++) f->mask[i] = (uint8_t)(i != 5);
    prl_store_sample *s = &f->s;
    s->run = run, s->step = step, s->prompt_id = f->prompt, s->sample_index = index;
    s->tokens = f->tokens, s->n_tokens = 12, s->prompt_len = 4, s->logprobs = f->logprobs;
    s->routes = f->routes, s->route_tokens = 11, s->route_moe = 3, s->route_k = 2;
    s->route_width = 2, s->loss_mask = f->mask, s->version = 3, s->worker = "rollout-0";
    s->reward = 0.5 + seed, s->reward_detail = "{\"score\": 0.5, \"checks\": []}";
    s->flags = 4, s->stop = 1, s->gen_seconds = 1.5, s->reward_seconds = 0.25;
}

/* A fresh store with run "r" (id into *run) and prompts p0..p(n-1). */
static prl_store *open_with_prompts(int64_t *run, int n)
{
    prl_store *db;
    assert_ok(prl_store_open(dbpath, &db));
    assert_ok(prl_store_run_create(db, "r", "{\"grpo\": {\"G\": 4}}", 7, run));
    for (int i = 0; i < n; i++) {
        char id[16];
        snprintf(id, sizeof id, "p%d", i);
        prl_store_prompt p = {.run = *run,
                              .prompt_id = id,
                              .domain = "reasoning",
                              .split = "train",
                              .task = "{\"q\": 1}",
                              .difficulty = 2};
        assert_ok(prl_store_prompt_put(db, &p));
    }
    return db;
}

static void assert_sample_eq(const prl_store_sample *a, const prl_store_sample *b)
{
    ck_assert_int_eq(a->n_tokens, b->n_tokens);
    ck_assert_int_eq(a->prompt_len, b->prompt_len);
    ck_assert(memcmp(a->tokens, b->tokens, 4 * (size_t)a->n_tokens) == 0);
    ck_assert(memcmp(a->logprobs, b->logprobs, 4 * (size_t)(a->n_tokens - a->prompt_len)) == 0);
    ck_assert_int_eq(a->route_tokens * a->route_moe * a->route_k * a->route_width,
                     b->route_tokens * b->route_moe * b->route_k * b->route_width);
    ck_assert((a->routes == NULL) == (b->routes == NULL));
    if (a->routes)
        ck_assert(memcmp(a->routes, b->routes,
                         (size_t)(a->route_tokens * a->route_moe * a->route_k * a->route_width)) ==
                  0);
    ck_assert((a->loss_mask == NULL) == (b->loss_mask == NULL));
    if (a->loss_mask)
        ck_assert(memcmp(a->loss_mask, b->loss_mask, (size_t)(a->n_tokens - a->prompt_len)) == 0);
    ck_assert_int_eq(a->version, b->version);
    ck_assert(a->reward == b->reward);
    ck_assert_str_eq(a->reward_detail, b->reward_detail);
    ck_assert_str_eq(a->worker, b->worker);
    ck_assert_uint_eq(a->flags, b->flags);
    ck_assert_int_eq(a->stop, b->stop);
    ck_assert_int_eq(a->status, b->status);
}

/* Run SQL on the file through a separate raw connection (as a corrupting tool would). */
static void raw_exec(const char *sql)
{
    sqlite3 *raw;
    ck_assert_int_eq(sqlite3_open(dbpath, &raw), SQLITE_OK);
    char *err = NULL;
    int rc = sqlite3_exec(raw, sql, NULL, NULL, &err);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, err ? err : "");
    sqlite3_close(raw);
}

/* ---------------------------------------------------------------- open, schema ----- */

START_TEST(test_open_reopen)
{
    prl_store *db;
    int64_t run;
    assert_ok(prl_store_open(dbpath, &db));
    int v = -1;
    assert_ok(prl_store_schema_version(db, &v));
    ck_assert_int_eq(v, PRL_STORE_SCHEMA_VERSION);
    assert_ok(prl_store_run_create(db, "demo", "{\"seed\": 3}", 3, &run));
    ck_assert_int_eq(prl_store_run_create(db, "demo", "{}", 3, &run), PRL_ERR_ARG);
    assert_msg_has("'demo' already exists");
    ck_assert_int_eq(prl_store_run_create(db, "bad", "[1]", 3, &run), PRL_ERR_FORMAT);
    assert_msg_has("run config is not a JSON object");
    prl_store_close(db);

    assert_ok(prl_store_open(dbpath, &db));
    prl_store_run r;
    assert_ok(prl_store_run_get(db, "demo", &r));
    ck_assert_str_eq(r.config, "{\"seed\": 3}");
    ck_assert_str_eq(r.status, "running");
    ck_assert_uint_eq(r.seed, 3);
    assert_ok(prl_store_run_set_status(db, r.id, "done"));
    prl_store_run_free(&r);
    assert_ok(prl_store_run_get(db, "demo", &r));
    ck_assert_str_eq(r.status, "done");
    prl_store_run_free(&r);
    ck_assert_int_eq(prl_store_run_get(db, "nope", &r), PRL_ERR_RANGE);
    assert_msg_has("no run 'nope'");
    assert_ok(prl_store_check(db));
    prl_store_close(db);

    sqlite3 *raw;
    ck_assert_int_eq(sqlite3_open(dbpath, &raw), SQLITE_OK);
    sqlite3_stmt *st;
    ck_assert_int_eq(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    sqlite3_close(raw);
}
END_TEST

/* Does the schema hold object `name` (table or index)? */
static int has_object(prl_store *db, const char *name)
{
    (void)db;
    sqlite3 *raw;
    ck_assert_int_eq(sqlite3_open(dbpath, &raw), SQLITE_OK);
    sqlite3_stmt *st;
    sqlite3_prepare_v2(raw, "SELECT count(*) FROM sqlite_master WHERE name = ?1", -1, &st, NULL);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    int n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(raw);
    return n;
}

START_TEST(test_migrations)
{
    /* version 0 → current: an empty file */
    sqlite3 *raw;
    ck_assert_int_eq(sqlite3_open(dbpath, &raw), SQLITE_OK);
    /* version 1 with data in it, then the current code migrates it */
    assert_ok(store_migrate(raw, dbpath, 1));
    ck_assert_int_eq(sqlite3_exec(raw,
                                  "INSERT INTO runs (name, config, seed, created, status) "
                                  "VALUES ('old', '{}', 1, 0, 'running');"
                                  "INSERT INTO prompts (run, prompt_id, domain, split, task, "
                                  "difficulty, solved_bits, last_epoch) VALUES (1, 'p', "
                                  "'agent', 'train', '{}', 1, 5, 2)",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(raw);
    ck_assert_int_eq(has_object(NULL, "samples_by_status"), 0);
    prl_store *db;
    assert_ok(prl_store_open(dbpath, &db));
    int v;
    assert_ok(prl_store_schema_version(db, &v));
    ck_assert_int_eq(v, PRL_STORE_SCHEMA_VERSION);
    ck_assert_int_eq(has_object(db, "samples_by_status"), 1);
    prl_store_run r;
    assert_ok(prl_store_run_get(db, "old", &r));
    prl_store_run_free(&r);
    prl_store_prompt p; /* 2 → 3: the history kept, the new unsolved history empty */
    assert_ok(prl_store_prompt_get(db, 1, "p", &p));
    ck_assert_uint_eq(p.solved_bits, 5);
    ck_assert_uint_eq(p.unsolved_bits, 0);
    ck_assert_int_eq(p.last_epoch, 2);
    ck_assert(p.teacher_kl == -1); /* 3 → 4: no teacher KL yet */
    prl_store_prompt_free(&p);
    prl_store_close(db);
    teardown();
    setup();
    assert_ok(prl_store_open(dbpath, &db)); /* from 0: every step */
    assert_ok(prl_store_schema_version(db, &v));
    ck_assert_int_eq(v, PRL_STORE_SCHEMA_VERSION);
    ck_assert_int_eq(has_object(db, "events_by_kind"), 1);
    prl_store_close(db);
}
END_TEST

START_TEST(test_newer_schema_refused)
{
    raw_exec("CREATE TABLE future (x); PRAGMA user_version = 99");
    prl_store *db = (prl_store *)1;
    ck_assert_int_eq(prl_store_open(dbpath, &db), PRL_ERR_UNSUPPORTED);
    ck_assert_ptr_null(db);
    char want[96];
    snprintf(want, sizeof want, "schema version 99 is newer than this prl's version %d",
             PRL_STORE_SCHEMA_VERSION);
    assert_msg_has(want);
    /* a file that is not a database */
    teardown();
    setup();
    FILE *f = fopen(dbpath, "w");
    fputs("this is not a database, just some text that is long enough to be read.........."
          "................................................................................",
          f);
    fclose(f);
    ck_assert_int_eq(prl_store_open(dbpath, &db), PRL_ERR_FORMAT);
    assert_msg_has("run.db");
}
END_TEST

/* ---------------------------------------------------------------- samples ---------- */

START_TEST(test_sample_idempotent)
{
    int64_t run, n;
    prl_store *db = open_with_prompts(&run, 2);
    fixture f;
    fixture_make(&f, run, 3, 1, 2, 0);
    int already = -1;
    assert_ok(prl_store_sample_put(db, &f.s, &already));
    ck_assert_int_eq(already, 0);
    /* the same content from another worker, later: a no-op, the first delivery stays */
    f.s.worker = "rollout-1", f.s.gen_seconds = 9, f.s.status = PRL_STORE_SAMPLE_STALE;
    assert_ok(prl_store_sample_put(db, &f.s, &already));
    ck_assert_int_eq(already, 1);
    assert_ok(prl_store_sample_count(db, run, 3, -1, &n));
    ck_assert_int_eq(n, 1);
    prl_store_sample got;
    assert_ok(prl_store_sample_get(db, run, 3, "p1", 2, &got));
    ck_assert_str_eq(got.worker, "rollout-0");
    ck_assert_int_eq(got.status, PRL_STORE_SAMPLE_OK);
    prl_store_sample_free(&got);
    /* different content: an error naming the key and the field */
    f.s.reward = 0.75;
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, &already), PRL_ERR_ARG);
    assert_msg_has("sample (run 1, step 3, prompt 'p1', sample 2)");
    assert_msg_has("different reward");
    f.s.reward = 0.5;
    f.tokens[11]++;
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_ARG);
    assert_msg_has("different tokens");
    f.tokens[11]--;
    f.routes[5]++;
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_ARG);
    assert_msg_has("different routes");
    f.routes[5]--;
    f.s.version = 4;
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_ARG);
    assert_msg_has("different version");
    assert_ok(prl_store_sample_count(db, run, -1, -1, &n));
    ck_assert_int_eq(n, 1);
    /* other sample indexes and steps are other keys */
    f.s.version = 3, f.s.sample_index = 3;
    assert_ok(prl_store_sample_put(db, &f.s, &already));
    ck_assert_int_eq(already, 0);
    f.s.step = 4;
    assert_ok(prl_store_sample_put(db, &f.s, &already));
    ck_assert_int_eq(already, 0);
    assert_ok(prl_store_sample_count(db, run, 3, -1, &n));
    ck_assert_int_eq(n, 2);
    prl_store_close(db);
}
END_TEST

START_TEST(test_sample_roundtrip)
{
    int64_t run;
    prl_store *db = open_with_prompts(&run, 3);
    fixture f[3];
    for (int i = 0; i < 3; i++) fixture_make(&f[i], run, 0, 2 - i, 0, i);
    f[1].s.routes = NULL, f[1].s.route_tokens = f[1].s.route_moe = 0;
    f[1].s.route_k = f[1].s.route_width = 0, f[1].s.loss_mask = NULL;
    f[2].s.route_width = 1, f[2].s.route_tokens = 22, f[2].s.status = PRL_STORE_SAMPLE_STALE;
    for (int i = 0; i < 3; i++) assert_ok(prl_store_sample_put(db, &f[i].s, NULL));
    prl_store_sample *a;
    size_t n;
    assert_ok(prl_store_samples_for_step(db, run, 0, -1, &a, &n));
    ck_assert_uint_eq(n, 3);
    for (int i = 0; i < 3; i++) { /* ordered by prompt id: p0 = f[2], p1 = f[1], p2 = f[0] */
        ck_assert_str_eq(a[i].prompt_id, f[2 - i].s.prompt_id);
        assert_sample_eq(&a[i], &f[2 - i].s);
    }
    ck_assert_ptr_null(a[1].routes);
    ck_assert_ptr_null(a[1].loss_mask);
    ck_assert(signbit(a[0].logprobs[0]) && a[0].logprobs[1] == 1e-42f);
    prl_store_samples_free(a, n);
    assert_ok(prl_store_samples_for_step(db, run, 0, PRL_STORE_SAMPLE_STALE, &a, &n));
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(a[0].prompt_id, "p0");
    prl_store_samples_free(a, n);
    int64_t c;
    assert_ok(prl_store_sample_set_status(db, run, 0, "p1", 0, PRL_STORE_SAMPLE_DROPPED));
    assert_ok(prl_store_sample_count(db, run, -1, PRL_STORE_SAMPLE_DROPPED, &c));
    ck_assert_int_eq(c, 1);
    assert_ok(prl_store_sample_count(db, run, 0, PRL_STORE_SAMPLE_OK, &c));
    ck_assert_int_eq(c, 1);
    ck_assert_int_eq(prl_store_sample_set_status(db, run, 0, "p1", 9, PRL_STORE_SAMPLE_OK),
                     PRL_ERR_RANGE);
    assert_msg_has("sample 9) is not stored");
    prl_store_close(db);
}
END_TEST

START_TEST(test_blob_helpers)
{
    int32_t t[3] = {-1, 0, 0x12345678}, t2[3];
    float x[2] = {-INFINITY, 3.5f}, x2[2];
    uint8_t b[12];
    prl_store_i32_encode(b, t, 3);
    ck_assert_int_eq(b[0], 0xff);
    ck_assert_int_eq(b[8], 0x78); /* little-endian */
    ck_assert_int_eq(b[11], 0x12);
    assert_ok(prl_store_i32_decode(t2, 3, b, 12, "tokens"));
    ck_assert(memcmp(t, t2, sizeof t) == 0);
    ck_assert_int_eq(prl_store_i32_decode(t2, 3, b, 11, "tokens"), PRL_ERR_FORMAT);
    assert_msg_has("tokens: 11 bytes is not a multiple of 4");
    ck_assert_int_eq(prl_store_i32_decode(t2, 2, b, 12, "tokens"), PRL_ERR_FORMAT);
    assert_msg_has("hold 3 values, expected 2");
    prl_store_f32_encode(b, x, 2);
    ck_assert_int_eq(b[7], 0x40); /* 3.5f = 0x40600000 */
    assert_ok(prl_store_f32_decode(x2, 2, b, 8, "logprobs"));
    ck_assert(isinf(x2[0]) && x2[0] < 0 && x2[1] == 3.5f);
}
END_TEST

/* Corrupt the one stored sample with `sql`, then reading it must fail naming `column`. */
static void expect_corrupt(const char *sql, const char *column)
{
    int64_t run;
    prl_store *db = open_with_prompts(&run, 1);
    fixture f;
    fixture_make(&f, run, 5, 0, 1, 0);
    assert_ok(prl_store_sample_put(db, &f.s, NULL));
    raw_exec(sql);
    prl_store_sample got;
    ck_assert_int_eq(prl_store_sample_get(db, run, 5, "p0", 1, &got), PRL_ERR_FORMAT);
    assert_msg_has("sample (run 1, step 5, prompt 'p0', sample 1): corrupted row");
    assert_msg_has(column);
    ck_assert_ptr_null(got.tokens);
    prl_store_sample *a;
    size_t n;
    ck_assert_int_eq(prl_store_samples_for_step(db, run, 5, -1, &a, &n), PRL_ERR_FORMAT);
    ck_assert_ptr_null(a);
    /* a repeat put cannot compare against it either: an error, not a silent no-op */
    ck_assert_int_ne(prl_store_sample_put(db, &f.s, NULL), PRL_OK);
    prl_store_close(db);
    teardown();
    setup();
}

START_TEST(test_corrupted_rows)
{
    expect_corrupt("UPDATE samples SET logprobs = x'0102030405'", "logprobs: 5 bytes");
    expect_corrupt("UPDATE samples SET tokens = x'01020304'", "tokens: 4 bytes hold 1 values");
    expect_corrupt("UPDATE samples SET tokens = 'text'", "tokens is not a BLOB");
    expect_corrupt("UPDATE samples SET n_tokens = 13", "tokens: 48 bytes hold 12 values");
    expect_corrupt("UPDATE samples SET prompt_len = 40", "prompt_len 40 out of range");
    expect_corrupt("UPDATE samples SET route_k = 3", "routes: 132 bytes");
    expect_corrupt("UPDATE samples SET route_width = 3", "routes shape");
    expect_corrupt("UPDATE samples SET routes = NULL", "routes is not a BLOB");
    expect_corrupt("UPDATE samples SET loss_mask = x'0001'", "loss_mask: 2 bytes");
    expect_corrupt("UPDATE samples SET loss_mask = x'0101010101010107'", "loss_mask[7] = 7");
    expect_corrupt("PRAGMA ignore_check_constraints = 1; UPDATE samples SET status = 'odd'",
                   "status 'odd'");
}
END_TEST

START_TEST(test_sample_put_errors)
{
    int64_t run;
    prl_store *db = open_with_prompts(&run, 1);
    fixture f;
    fixture_make(&f, run, 0, 7, 0, 0); /* prompt p7 was never stored */
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_ARG);
    assert_msg_has("prompt 'p7'");
    assert_msg_has("is its run and prompt stored?");
    fixture_make(&f, run, 0, 0, 0, 0);
    f.s.reward_detail = "{oops";
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_FORMAT);
    assert_msg_has("reward_detail is not JSON");
    fixture_make(&f, run, 0, 0, 0, 0);
    f.s.reward = NAN;
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_NUMERIC);
    fixture_make(&f, run, 0, 0, 0, 0);
    f.s.route_k = 0;
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_ARG);
    assert_msg_has("routes shape [11][3][0]");
    fixture_make(&f, run, 0, 0, 0, 0);
    f.s.prompt_len = 13;
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_ARG);
    assert_msg_has("prompt_len 13 outside [0, n_tokens 12]");
    fixture_make(&f, run, 0, 0, 0, 0);
    f.mask[2] = 2;
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_ARG);
    assert_msg_has("loss_mask[2] = 2");
    int64_t n;
    assert_ok(prl_store_sample_count(db, run, -1, -1, &n));
    ck_assert_int_eq(n, 0);
    prl_store_close(db);
}
END_TEST

START_TEST(test_batches)
{
    int64_t run, n;
    prl_store *db = open_with_prompts(&run, 1);
    fixture f;
    assert_ok(prl_store_begin(db));
    for (int i = 0; i < 3; i++) {
        fixture_make(&f, run, 0, 0, i, 0);
        assert_ok(prl_store_sample_put(db, &f.s, NULL));
    }
    assert_ok(prl_store_rollback(db));
    assert_ok(prl_store_sample_count(db, run, -1, -1, &n));
    ck_assert_int_eq(n, 0);
    assert_ok(prl_store_begin(db));
    for (int i = 0; i < 3; i++) {
        fixture_make(&f, run, 0, 0, i, 0);
        assert_ok(prl_store_sample_put(db, &f.s, NULL));
    }
    /* a failing write inside the batch undoes only itself (savepoint) */
    fixture_make(&f, run, 0, 0, 1, 1);
    ck_assert_int_eq(prl_store_sample_put(db, &f.s, NULL), PRL_ERR_ARG);
    assert_ok(prl_store_commit(db));
    assert_ok(prl_store_sample_count(db, run, 0, -1, &n));
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(prl_store_commit(db), PRL_ERR_ARG);
    assert_msg_has("no open batch");
    prl_store_close(db);
}
END_TEST

/* ---------------------------------------------------------------- crash, WAL ------- */

enum { CRASH_ACKED_BEFORE_KILL = 40 };

/* Child: write samples 0, 1, 2, ... one transaction each; after each commit, send its index
** on the pipe (the "ack" a worker would get). Runs until killed. */
static void crash_writer(int fd)
{
    prl_store *db;
    if (prl_store_open(dbpath, &db) != PRL_OK) _exit(2);
    for (int i = 0;; i++) {
        fixture f;
        fixture_make(&f, 1, i / 8, 0, i % 8, i);
        if (prl_store_sample_put(db, &f.s, NULL) != PRL_OK) _exit(3);
        if (write(fd, &i, sizeof i) != (ssize_t)sizeof i) _exit(4);
    }
}

START_TEST(test_crash_safety)
{
    int64_t run;
    prl_store *db = open_with_prompts(&run, 1);
    prl_store_close(db);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        crash_writer(fds[1]);
    }
    close(fds[1]);
    int last = -1, i;
    while (last + 1 < CRASH_ACKED_BEFORE_KILL && read(fds[0], &i, sizeof i) == (ssize_t)sizeof i)
        last = i;
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                  "writer exited early (status %d)", status);
    while (read(fds[0], &i, sizeof i) == (ssize_t)sizeof i) last = i; /* acks in flight */
    close(fds[0]);
    ck_assert_int_ge(last + 1, CRASH_ACKED_BEFORE_KILL);

    assert_ok(prl_store_open(dbpath, &db));
    assert_ok(prl_store_check(db));
    int64_t n;
    assert_ok(prl_store_sample_count(db, run, -1, -1, &n));
    /* every acknowledged sample is there; at most the one being written after it too */
    ck_assert_int_ge(n, last + 1);
    ck_assert_int_le(n, last + 2);
    for (int k = 0; k < n; k++) {
        fixture f;
        fixture_make(&f, run, k / 8, 0, k % 8, k);
        prl_store_sample got;
        assert_ok(prl_store_sample_get(db, run, k / 8, "p0", k % 8, &got));
        assert_sample_eq(&got, &f.s);
        prl_store_sample_free(&got);
        int already = 0; /* redelivery after the crash: counted once */
        assert_ok(prl_store_sample_put(db, &f.s, &already));
        ck_assert_int_eq(already, 1);
    }
    assert_ok(prl_store_sample_count(db, run, -1, -1, &n));
    ck_assert_int_le(n, last + 2);
    prl_store_close(db);
}
END_TEST

static int64_t raw_count(sqlite3 *raw)
{
    sqlite3_stmt *st;
    ck_assert_int_eq(sqlite3_prepare_v2(raw, "SELECT count(*) FROM samples", -1, &st, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

START_TEST(test_concurrent_reader)
{
    int64_t run;
    prl_store *db = open_with_prompts(&run, 1);
    fixture f;
    fixture_make(&f, run, 0, 0, 0, 0);
    assert_ok(prl_store_sample_put(db, &f.s, NULL));
    sqlite3 *reader;
    ck_assert_int_eq(sqlite3_open_v2(dbpath, &reader, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(reader, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_eq(raw_count(reader), 1); /* the read transaction holds this snapshot */
    for (int i = 1; i < 5; i++) {           /* the writer is not blocked by the open reader */
        fixture_make(&f, run, 0, 0, i, 0);
        assert_ok(prl_store_sample_put(db, &f.s, NULL));
    }
    ck_assert_int_eq(raw_count(reader), 1);
    ck_assert_int_eq(sqlite3_exec(reader, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_eq(raw_count(reader), 5);
    sqlite3_close(reader);
    prl_store_close(db);
}
END_TEST

/* ---------------------------------------------------------------- small tables ----- */

START_TEST(test_versions_steps_events)
{
    int64_t run, n, last;
    prl_store *db = open_with_prompts(&run, 0);
    prl_store_version v = {.run = run,
                           .version = 0,
                           .path = "ckpt/v0",
                           .checksum = "aa",
                           .step = -1},
                      got;
    ck_assert_int_eq(prl_store_version_latest(db, run, &got), PRL_ERR_RANGE);
    assert_ok(prl_store_version_add(db, &v));
    v.version = 1, v.path = "ckpt/v1", v.checksum = "bb", v.step = 0;
    assert_ok(prl_store_version_add(db, &v));
    assert_ok(prl_store_version_add(db, &v)); /* repeat: no-op */
    v.checksum = "cc";
    ck_assert_int_eq(prl_store_version_add(db, &v), PRL_ERR_ARG);
    assert_msg_has("version 1 of run 1 is already stored");
    assert_ok(prl_store_version_latest(db, run, &got));
    ck_assert_int_eq(got.version, 1);
    ck_assert_str_eq(got.checksum, "bb");
    prl_store_version_free(&got);

    assert_ok(prl_store_step_last(db, run, &last));
    ck_assert_int_eq(last, -1);
    prl_store_step s = {.run = run,
                        .step = 0,
                        .metrics = "{\"reward/mean\": 0.25}",
                        .reward_mean = 0.25,
                        .accuracy = 0.5,
                        .tokens_per_s = 100,
                        .step_seconds = 2};
    assert_ok(prl_store_step_put(db, &s));
    s.step = 1;
    assert_ok(prl_store_step_put(db, &s));
    s.reward_mean = 0.75; /* replace */
    assert_ok(prl_store_step_put(db, &s));
    s.metrics = "[]";
    ck_assert_int_eq(prl_store_step_put(db, &s), PRL_ERR_FORMAT);
    assert_msg_has("step 1: metrics is not a JSON object");
    assert_ok(prl_store_step_last(db, run, &last));
    ck_assert_int_eq(last, 1);

    assert_ok(prl_store_event_add(db, run, "fault", "{\"role\": \"rollout\", \"pid\": 12}"));
    assert_ok(prl_store_event_add(db, run, "stale_drop", NULL));
    assert_ok(prl_store_event_add(db, run, "stale_drop", "{\"lag\": 3}"));
    ck_assert_int_eq(prl_store_event_add(db, run, "fault", "{"), PRL_ERR_FORMAT);
    assert_msg_has("event 'fault'");
    assert_ok(prl_store_event_count(db, run, "stale_drop", &n));
    ck_assert_int_eq(n, 2);
    assert_ok(prl_store_event_count(db, run, NULL, &n));
    ck_assert_int_eq(n, 3);
    prl_store_close(db);
}
END_TEST

/* A run taken back to version 1 (a corrupt newer checkpoint): versions 2 and 3 go, steps 1 and
** 2 go, samples of versions above 1 go; the rest stays. The one run of a file. */
START_TEST(test_run_back_to)
{
    int64_t run, n, last;
    prl_store *db = open_with_prompts(&run, 2);
    prl_store_run sole;
    assert_ok(prl_store_run_sole(db, &sole));
    ck_assert_str_eq(sole.name, "r");
    prl_store_run_free(&sole);
    for (int v = 0; v <= 3; v++) {
        prl_store_version x = {.run = run,
                               .version = v,
                               .path = "p",
                               .checksum = "c",
                               .step = v - 1};
        assert_ok(prl_store_version_add(db, &x));
        if (v == 3) break;
        prl_store_step s = {.run = run, .step = v, .metrics = "{}"};
        assert_ok(prl_store_step_put(db, &s));
        for (int j = 0; j < 2; j++) { /* step v's samples, made by version v */
            fixture f;
            fixture_make(&f, run, v, j, 0, v);
            f.s.version = v;
            assert_ok(prl_store_sample_put(db, &f.s, NULL));
        }
    }
    prl_store_version got;
    assert_ok(prl_store_version_before(db, run, 3, &got));
    ck_assert_int_eq(got.version, 2);
    prl_store_version_free(&got);
    ck_assert_int_eq(prl_store_version_before(db, run, 0, &got), PRL_ERR_RANGE);
    assert_msg_has("no policy version below 0");
    int64_t gone = -1;
    assert_ok(prl_store_run_back_to(db, run, 1, &gone));
    ck_assert_int_eq(gone, 2); /* step 2's, made by version 2 */
    assert_ok(prl_store_version_latest(db, run, &got));
    ck_assert_int_eq(got.version, 1);
    prl_store_version_free(&got);
    assert_ok(prl_store_step_last(db, run, &last));
    ck_assert_int_eq(last, 0);
    assert_ok(prl_store_sample_count(db, run, -1, -1, &n));
    ck_assert_int_eq(n, 4); /* steps 0 and 1, made by versions 0 and 1 */
    assert_ok(prl_store_run_create(db, "r2", "{}", 1, &n));
    ck_assert_int_eq(prl_store_run_sole(db, &sole), PRL_ERR_RANGE);
    assert_msg_has("holds several runs");
    prl_store_close(db);
}
END_TEST

/* The report's readers: a read-only handle (no file made, no write, nothing migrated) and the
** whole steps and events tables in order. */
START_TEST(test_readonly_lists)
{
    prl_store *ro = NULL;
    ck_assert_int_eq(prl_store_open_readonly(dbpath, &ro), PRL_ERR_IO);
    ck_assert_int_ne(access(dbpath, F_OK), 0); /* a missing file is not created */
    int64_t run;
    prl_store *db = open_with_prompts(&run, 0);
    const char *metrics[] = {"{\"a\": 2}", "{\"a\": 0}", "{\"a\": 1}"};
    const int64_t steps[] = {2, 0, 1}; /* written out of order, read in step order */
    for (int i = 0; i < 3; i++) {
        prl_store_step s = {.run = run, .step = steps[i], .metrics = metrics[i], .accuracy = i};
        assert_ok(prl_store_step_put(db, &s));
    }
    assert_ok(prl_store_event_add(db, run, "join", "{\"role\": \"trainer\"}"));
    assert_ok(prl_store_event_add(db, run, "eval", "{\"version\": 2}"));
    prl_store_close(db);

    assert_ok(prl_store_open_readonly(dbpath, &ro));
    prl_store_step *st = NULL;
    size_t ns = 0;
    assert_ok(prl_store_steps_list(ro, run, &st, &ns));
    ck_assert_int_eq(ns, 3);
    for (size_t i = 0; i < ns; i++) ck_assert_int_eq(st[i].step, (int64_t)i);
    ck_assert_str_eq(st[0].metrics, "{\"a\": 0}");
    ck_assert_str_eq(st[2].metrics, "{\"a\": 2}");
    ck_assert_double_eq(st[2].accuracy, 0);
    prl_store_steps_free(st, ns);
    prl_store_event *ev = NULL;
    size_t ne = 0;
    assert_ok(prl_store_events_list(ro, run, &ev, &ne));
    ck_assert_int_eq(ne, 2);
    ck_assert_str_eq(ev[0].kind, "join");
    ck_assert_str_eq(ev[1].kind, "eval");
    ck_assert_str_eq(ev[1].detail, "{\"version\": 2}");
    ck_assert(ev[0].id < ev[1].id && ev[0].time > 0);
    prl_store_events_free(ev, ne);
    assert_ok(prl_store_events_list(ro, run + 1, &ev, &ne)); /* another run: none */
    ck_assert_int_eq(ne, 0);
    prl_store_events_free(ev, ne);
    /* the handle cannot write */
    ck_assert_int_ne(prl_store_event_add(ro, run, "fault", NULL), PRL_OK);
    prl_store_close(ro);

    /* a file that is not a run database (schema version 0) is refused */
    char other[160];
    snprintf(other, sizeof other, "%s/other.db", tmpdir);
    sqlite3 *raw;
    ck_assert_int_eq(sqlite3_open(other, &raw), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(raw, "CREATE TABLE t (x)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(raw);
    ck_assert_int_eq(prl_store_open_readonly(other, &ro), PRL_ERR_FORMAT);
    assert_msg_has("not a prl run database");
    unlink(other);
}
END_TEST

START_TEST(test_prompts_retire)
{
    int64_t run, n;
    prl_store *db = open_with_prompts(&run, 4);
    /* p0 solved in 0, 1, 2; p1 in 0, 2; p2 in 1, 2; p3 in 0, 1 then skipped epoch 2 */
    static const int solved[3][3] = {{1, 1, 1}, {1, 0, 1}, {0, 1, 1}};
    for (int e = 0; e < 3; e++)
        for (int p = 0; p < 3; p++) {
            char id[8];
            snprintf(id, sizeof id, "p%d", p);
            assert_ok(prl_store_prompt_record(db, run, id, e, solved[p][e]));
        }
    assert_ok(prl_store_prompt_record(db, run, "p3", 0, 1));
    assert_ok(prl_store_prompt_record(db, run, "p3", 1, 0));
    assert_ok(prl_store_prompt_record(db, run, "p3", 1, 1)); /* re-record overwrites */
    ck_assert_int_eq(prl_store_prompt_record(db, run, "p3", 0, 1), PRL_ERR_RANGE);
    assert_msg_has("epoch 0 is before the last recorded epoch 1");
    prl_store_prompt p;
    assert_ok(prl_store_prompt_get(db, run, "p1", &p));
    ck_assert_uint_eq(p.solved_bits, 5); /* 101: epochs 2, (not 1), 0 */
    ck_assert_int_eq(p.last_epoch, 2);
    ck_assert_str_eq(p.domain, "reasoning");
    prl_store_prompt_free(&p);

    int64_t retired = -1;
    assert_ok(prl_store_prompts_retire(db, run, 2, 3, PRL_STORE_SOLVED, &retired));
    ck_assert_int_eq(retired, 1); /* p0 only */
    assert_ok(prl_store_prompts_retire(db, run, 2, 2, PRL_STORE_SOLVED, &retired));
    ck_assert_int_eq(retired, 1); /* p2 (p0 already retired; p3's last epoch is 1) */
    assert_ok(prl_store_prompt_count_active(db, run, "train", &n));
    ck_assert_int_eq(n, 2);
    assert_ok(prl_store_prompt_get(db, run, "p2", &p));
    ck_assert_int_eq(p.retired, 1);
    prl_store_prompt_free(&p);
    /* a skipped epoch counts as unsolved: p3 at epoch 3 after 0, 1 → bits 1001 */
    assert_ok(prl_store_prompt_record(db, run, "p3", 3, 1));
    assert_ok(prl_store_prompts_retire(db, run, 3, 2, PRL_STORE_SOLVED, &retired));
    ck_assert_int_eq(retired, 0);

    prl_store_prompt q = {.run = run,
                          .prompt_id = "p1",
                          .domain = "reasoning",
                          .split = "train",
                          .task = "{\"q\": 1}",
                          .difficulty = 2};
    assert_ok(prl_store_prompt_put(db, &q)); /* repeat: no-op, history kept */
    assert_ok(prl_store_prompt_get(db, run, "p1", &p));
    ck_assert_uint_eq(p.solved_bits, 5);
    prl_store_prompt_free(&p);
    q.difficulty = 3;
    ck_assert_int_eq(prl_store_prompt_put(db, &q), PRL_ERR_ARG);
    assert_msg_has("prompt 'p1' of run 1 is already stored");
    ck_assert_int_eq(prl_store_prompts_retire(db, run, 3, 64, PRL_STORE_SOLVED, NULL), PRL_ERR_ARG);
    ck_assert_int_eq(prl_store_prompts_retire(db, run, 3, 2, PRL_STORE_MIXED, NULL), PRL_ERR_ARG);
    assert_msg_has("outcome 0 is not solved (1) or unsolved (2)");
    ck_assert_int_eq(prl_store_prompt_record(db, run, "p3", 4, (prl_store_outcome)3), PRL_ERR_ARG);
    assert_msg_has("outcome 3 is not one of");
    prl_store_close(db);
}
END_TEST

/* The unsolved history is a second register beside the solved one: a mixed epoch is a 0 in
** both, a skipped epoch too, and its retire rule takes only prompts unsolved in every one of
** the last n epochs. */
START_TEST(test_prompts_retire_unsolved)
{
    int64_t run, n, retired = -1;
    prl_store *db = open_with_prompts(&run, 4);
    /* p0 unsolved in 0, 1, 2; p1 unsolved, mixed, unsolved; p2 solved, unsolved, unsolved;
    ** p3 unsolved in 0, 1 then skipped epoch 2, unsolved in 3 */
    static const prl_store_outcome o[3][3] = {
        {PRL_STORE_UNSOLVED, PRL_STORE_UNSOLVED, PRL_STORE_UNSOLVED},
        {PRL_STORE_UNSOLVED, PRL_STORE_MIXED, PRL_STORE_UNSOLVED},
        {PRL_STORE_SOLVED, PRL_STORE_UNSOLVED, PRL_STORE_UNSOLVED}};
    for (int e = 0; e < 3; e++)
        for (int p = 0; p < 3; p++) {
            char id[8];
            snprintf(id, sizeof id, "p%d", p);
            assert_ok(prl_store_prompt_record(db, run, id, e, o[p][e]));
        }
    assert_ok(prl_store_prompt_record(db, run, "p3", 0, PRL_STORE_UNSOLVED));
    assert_ok(prl_store_prompt_record(db, run, "p3", 1, PRL_STORE_UNSOLVED));
    prl_store_prompt p;
    assert_ok(prl_store_prompt_get(db, run, "p1", &p));
    ck_assert_uint_eq(p.unsolved_bits, 5); /* 101 */
    ck_assert_uint_eq(p.solved_bits, 0);
    prl_store_prompt_free(&p);
    assert_ok(prl_store_prompt_get(db, run, "p2", &p));
    ck_assert_uint_eq(p.unsolved_bits, 3); /* 011 */
    ck_assert_uint_eq(p.solved_bits, 4);   /* 100 */
    prl_store_prompt_free(&p);
    /* the solved rule does not see unsolved epochs */
    assert_ok(prl_store_prompts_retire(db, run, 2, 1, PRL_STORE_SOLVED, &retired));
    ck_assert_int_eq(retired, 0);
    assert_ok(prl_store_prompts_retire(db, run, 2, 3, PRL_STORE_UNSOLVED, &retired));
    ck_assert_int_eq(retired, 1); /* p0 */
    assert_ok(prl_store_prompts_retire(db, run, 2, 2, PRL_STORE_UNSOLVED, &retired));
    ck_assert_int_eq(retired, 1); /* p2 (p1 was mixed in epoch 1; p3's last epoch is 1) */
    assert_ok(prl_store_prompt_count_active(db, run, "train", &n));
    ck_assert_int_eq(n, 2);
    /* 1101: epochs 3, (not 2), 1, 0 */
    assert_ok(prl_store_prompt_record(db, run, "p3", 3, PRL_STORE_UNSOLVED));
    assert_ok(prl_store_prompts_retire(db, run, 3, 2, PRL_STORE_UNSOLVED, &retired));
    ck_assert_int_eq(retired, 0); /* the skipped epoch 2 breaks the run */
    assert_ok(prl_store_prompts_retire(db, run, 3, 1, PRL_STORE_UNSOLVED, &retired));
    ck_assert_int_eq(retired, 1);
    /* re-recording an epoch overwrites both registers' bit */
    assert_ok(prl_store_prompt_record(db, run, "p1", 2, PRL_STORE_SOLVED));
    assert_ok(prl_store_prompt_get(db, run, "p1", &p));
    ck_assert_uint_eq(p.unsolved_bits, 4); /* 100 */
    ck_assert_uint_eq(p.solved_bits, 1);
    prl_store_prompt_free(&p);
    prl_store_close(db);
}
END_TEST

/* opd.revisit's record: none → -1; set and overwritten; bad values and prompts refused;
** inside an open batch it is rolled back with the batch (the controller's step commit). */
START_TEST(test_prompt_teacher_kl)
{
    int64_t run;
    prl_store *db = open_with_prompts(&run, 2);
    prl_store_prompt p;
    assert_ok(prl_store_prompt_get(db, run, "p0", &p));
    ck_assert(p.teacher_kl == -1);
    prl_store_prompt_free(&p);
    assert_ok(prl_store_prompt_set_teacher_kl(db, run, "p0", 0.25));
    assert_ok(prl_store_prompt_set_teacher_kl(db, run, "p1", 0));
    assert_ok(prl_store_prompt_set_teacher_kl(db, run, "p0", 0.125));
    assert_ok(prl_store_prompt_get(db, run, "p0", &p));
    ck_assert(p.teacher_kl == 0.125);
    prl_store_prompt_free(&p);
    assert_ok(prl_store_prompt_get(db, run, "p1", &p));
    ck_assert(p.teacher_kl == 0);
    prl_store_prompt_free(&p);
    ck_assert_int_eq(prl_store_prompt_set_teacher_kl(db, run, "p0", -0.5), PRL_ERR_ARG);
    ck_assert_int_eq(prl_store_prompt_set_teacher_kl(db, run, "p0", NAN), PRL_ERR_ARG);
    ck_assert_int_eq(prl_store_prompt_set_teacher_kl(db, run, "nope", 1), PRL_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "nope"));
    assert_ok(prl_store_begin(db));
    assert_ok(prl_store_prompt_set_teacher_kl(db, run, "p0", 3));
    assert_ok(prl_store_rollback(db));
    assert_ok(prl_store_prompt_get(db, run, "p0", &p));
    ck_assert(p.teacher_kl == 0.125);
    prl_store_prompt_free(&p);
    prl_store_close(db);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_open_reopen);
    tcase_add_test(tc, test_migrations);
    tcase_add_test(tc, test_newer_schema_refused);
    tcase_add_test(tc, test_sample_idempotent);
    tcase_add_test(tc, test_sample_roundtrip);
    tcase_add_test(tc, test_blob_helpers);
    tcase_add_test(tc, test_corrupted_rows);
    tcase_add_test(tc, test_sample_put_errors);
    tcase_add_test(tc, test_batches);
    tcase_add_test(tc, test_crash_safety);
    tcase_add_test(tc, test_concurrent_reader);
    tcase_add_test(tc, test_versions_steps_events);
    tcase_add_test(tc, test_run_back_to);
    tcase_add_test(tc, test_readonly_lists);
    tcase_add_test(tc, test_prompts_retire);
    tcase_add_test(tc, test_prompts_retire_unsolved);
    tcase_add_test(tc, test_prompt_teacher_kl);
    suite_add_tcase(s, tc);
    return check_run(s);
}
