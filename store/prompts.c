/*
** prompts.c — a run's prompts and their outcome history: the rules "drop prompts solved in
** every one of the last n epochs" (the Agent domain's "drop always-solved prompts") and
** "drop prompts no sample scored on in every one of the last n epochs" (no signal to learn).
**
** History: solved_bits and unsolved_bits are shift registers of the last 64 epochs, bit 0 =
** last_epoch. A new epoch shifts both left by the epochs elapsed (a skipped epoch is a 0 in
** both, so it never counts towards retiring).
*/
#include "store/store_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_PROMPT_INSERT[] =
    "INSERT INTO prompts (run, prompt_id, domain, split, task, difficulty) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (run, prompt_id) DO NOTHING";
static const char SQL_PROMPT_SAME[] =
    "SELECT domain = ?3 AND split = ?4 AND task = ?5 AND difficulty = ?6 FROM prompts "
    "WHERE run = ?1 AND prompt_id = ?2";

static void prompt_bind(sqlite3_stmt *st, const void *arg)
{
    const prl_store_prompt *p = arg;
    sqlite3_bind_int64(st, 1, p->run);
    sqlite3_bind_text(st, 2, p->prompt_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, p->domain, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, p->split, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, p->task, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 6, p->difficulty);
}

static prl_status prompt_insert(prl_store *db, const prl_store_prompt *p)
{
    int same;
    prl_status rc = store_insert_or_compare(db, SQL_PROMPT_INSERT, SQL_PROMPT_SAME, prompt_bind, p,
                                            &same, "inserting a prompt");
    if (rc == PRL_OK && !same)
        return prl_error_set(PRL_ERR_ARG,
                             "prompt '%s' of run %lld is already stored with a "
                             "different domain, split, task or difficulty",
                             p->prompt_id, (long long)p->run);
    return rc;
}

prl_status prl_store_prompt_put(prl_store *db, const prl_store_prompt *p)
{
    if (!p->prompt_id || !p->domain || !p->split)
        return prl_error_set(PRL_ERR_ARG, "prompt: prompt_id, domain and split are required");
    prl_status rc = store_json_check(p->task ? p->task : "", "task");
    if (rc != PRL_OK) return prl_error_wrap(rc, "prompt '%s': ", p->prompt_id);
    rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    return store_tx_end(db, prompt_insert(db, p));
}

static const char SQL_PROMPT_GET[] =
    "SELECT run, prompt_id, domain, split, task, difficulty, solved_bits, last_epoch, retired, "
    "unsolved_bits, teacher_kl FROM prompts WHERE run = ?1 AND prompt_id = ?2";

static prl_status prompt_from_row(sqlite3_stmt *st, prl_store_prompt *out)
{
    out->run = sqlite3_column_int64(st, 0);
    out->difficulty = sqlite3_column_int(st, 5);
    out->solved_bits = (uint64_t)sqlite3_column_int64(st, 6);
    out->last_epoch = sqlite3_column_int64(st, 7);
    out->retired = sqlite3_column_int(st, 8);
    out->unsolved_bits = (uint64_t)sqlite3_column_int64(st, 9);
    out->teacher_kl =
        sqlite3_column_type(st, 10) == SQLITE_NULL ? -1 : sqlite3_column_double(st, 10);
    prl_status rc = store_column_text(st, 1, &out->prompt_id);
    if (rc == PRL_OK) rc = store_column_text(st, 2, &out->domain);
    if (rc == PRL_OK) rc = store_column_text(st, 3, &out->split);
    if (rc == PRL_OK) rc = store_column_text(st, 4, &out->task);
    return rc;
}

prl_status prl_store_prompt_get(prl_store *db, int64_t run, const char *prompt_id,
                                prl_store_prompt *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    prl_status rc = store_stmt(db, SQL_PROMPT_GET, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_text(st, 2, prompt_id, -1, SQLITE_STATIC);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) rc = prompt_from_row(st, out);
    else if (r == SQLITE_DONE)
        rc = prl_error_set(PRL_ERR_RANGE, "no prompt '%s' in run %lld", prompt_id, (long long)run);
    else rc = store_sqlite_error(db, "reading a prompt");
    sqlite3_reset(st);
    if (rc != PRL_OK) prl_store_prompt_free(out);
    return rc;
}

void prl_store_prompt_free(prl_store_prompt *p)
{
    if (!p) return;
    free((void *)p->prompt_id), free((void *)p->domain), free((void *)p->split);
    free((void *)p->task);
    memset(p, 0, sizeof *p);
}

/* One history register after recording `bit` in `epoch` (>= last_epoch: the caller checks). */
static uint64_t register_advance(uint64_t b, int64_t last_epoch, int64_t epoch, int bit)
{
    if (last_epoch < 0 || epoch - last_epoch >= 64) b = 0;
    else b <<= (unsigned)(epoch - last_epoch);
    if (last_epoch >= 0 && epoch == last_epoch) b &= ~(uint64_t)1;
    return b | (bit ? 1u : 0u);
}

static const char SQL_PROMPT_HISTORY[] =
    "UPDATE prompts SET solved_bits = ?3, last_epoch = ?4, unsolved_bits = ?5 "
    "WHERE run = ?1 AND prompt_id = ?2";

static prl_status prompt_record(prl_store *db, int64_t run, const char *prompt_id, int64_t epoch,
                                prl_store_outcome outcome)
{
    prl_store_prompt p;
    prl_status rc = prl_store_prompt_get(db, run, prompt_id, &p);
    if (rc != PRL_OK) return rc;
    if (epoch < p.last_epoch) { /* before shifting: a negative shift count is undefined */
        rc = prl_error_set(PRL_ERR_RANGE,
                           "prompt '%s': epoch %lld is before the last recorded "
                           "epoch %lld",
                           prompt_id, (long long)epoch, (long long)p.last_epoch);
        prl_store_prompt_free(&p);
        return rc;
    }
    uint64_t solved =
        register_advance(p.solved_bits, p.last_epoch, epoch, outcome == PRL_STORE_SOLVED);
    uint64_t unsolved =
        register_advance(p.unsolved_bits, p.last_epoch, epoch, outcome == PRL_STORE_UNSOLVED);
    prl_store_prompt_free(&p);
    sqlite3_stmt *st;
    if (rc == PRL_OK) rc = store_stmt(db, SQL_PROMPT_HISTORY, &st);
    if (rc != PRL_OK) return rc;
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_text(st, 2, prompt_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (int64_t)solved);
    sqlite3_bind_int64(st, 4, epoch);
    sqlite3_bind_int64(st, 5, (int64_t)unsolved);
    return store_step_done(db, st, "recording a prompt's epoch");
}

prl_status prl_store_prompt_record(prl_store *db, int64_t run, const char *prompt_id, int64_t epoch,
                                   prl_store_outcome outcome)
{
    if (epoch < 0)
        return prl_error_set(PRL_ERR_ARG, "prompt '%s': epoch %lld < 0", prompt_id,
                             (long long)epoch);
    if (outcome != PRL_STORE_MIXED && outcome != PRL_STORE_SOLVED && outcome != PRL_STORE_UNSOLVED)
        return prl_error_set(PRL_ERR_ARG,
                             "prompt '%s': outcome %d is not one of mixed (0), "
                             "solved (1), unsolved (2)",
                             prompt_id, (int)outcome);
    prl_status rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    return store_tx_end(db, prompt_record(db, run, prompt_id, epoch, outcome));
}

static const char SQL_PROMPT_RETIRE_SOLVED[] =
    "UPDATE prompts SET retired = 1 WHERE run = ?1 AND retired = 0 AND last_epoch = ?2 "
    "AND (solved_bits & ?3) = ?3";
static const char SQL_PROMPT_RETIRE_UNSOLVED[] =
    "UPDATE prompts SET retired = 1 WHERE run = ?1 AND retired = 0 AND last_epoch = ?2 "
    "AND (unsolved_bits & ?3) = ?3";

prl_status prl_store_prompts_retire(prl_store *db, int64_t run, int64_t epoch, int n,
                                    prl_store_outcome which, int64_t *retired)
{
    if (n < 1 || n > 63) return prl_error_set(PRL_ERR_ARG, "retire: n = %d outside [1, 63]", n);
    if (which != PRL_STORE_SOLVED && which != PRL_STORE_UNSOLVED)
        return prl_error_set(PRL_ERR_ARG, "retire: outcome %d is not solved (1) or unsolved (2)",
                             (int)which);
    sqlite3_stmt *st;
    prl_status rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    rc = store_stmt(
        db, which == PRL_STORE_SOLVED ? SQL_PROMPT_RETIRE_SOLVED : SQL_PROMPT_RETIRE_UNSOLVED, &st);
    if (rc == PRL_OK) {
        sqlite3_bind_int64(st, 1, run);
        sqlite3_bind_int64(st, 2, epoch);
        sqlite3_bind_int64(st, 3, (int64_t)((UINT64_C(1) << n) - 1));
        rc = store_step_done(db, st, "retiring prompts");
    }
    if (rc == PRL_OK && retired) *retired = sqlite3_changes(db->db);
    return store_tx_end(db, rc);
}

static const char SQL_PROMPT_TEACHER_KL[] =
    "UPDATE prompts SET teacher_kl = ?3 WHERE run = ?1 AND prompt_id = ?2";

prl_status prl_store_prompt_set_teacher_kl(prl_store *db, int64_t run, const char *prompt_id,
                                           double kl)
{
    if (!(isfinite(kl) && kl >= 0))
        return prl_error_set(PRL_ERR_ARG, "prompt '%s': teacher KL %g is not finite and >= 0",
                             prompt_id, kl);
    sqlite3_stmt *st;
    prl_status rc = store_tx_begin(db);
    if (rc != PRL_OK) return rc;
    rc = store_stmt(db, SQL_PROMPT_TEACHER_KL, &st);
    if (rc == PRL_OK) {
        sqlite3_bind_int64(st, 1, run);
        sqlite3_bind_text(st, 2, prompt_id, -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 3, kl);
        rc = store_step_done(db, st, "recording a prompt's teacher KL");
    }
    if (rc == PRL_OK && sqlite3_changes(db->db) == 0)
        rc = prl_error_set(PRL_ERR_RANGE, "no prompt '%s' in run %lld", prompt_id, (long long)run);
    return store_tx_end(db, rc);
}

static const char SQL_PROMPT_ACTIVE[] =
    "SELECT count(*) FROM prompts WHERE run = ?1 AND retired = 0 AND (?2 IS NULL OR split = ?2)";

prl_status prl_store_prompt_count_active(prl_store *db, int64_t run, const char *split,
                                         int64_t *count)
{
    return store_count(db, SQL_PROMPT_ACTIVE, run, split, count, "counting prompts");
}
