/*
** prompts.c — the controller's prompts (internal.h): the train split (and the eval split
** of in-run evaluations) generated or read from a prompt file and recorded in run.db, the candidate sequence (every prompt once an epoch, in a shuffled order), the
** retirement of prompts always solved or never solved, and OPD's revisits.
*/
#include "roles/controller/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The task arrays being filled: the train split first, then (eval = 1) the eval split. */
typedef struct collector {
    ctl *c;
    int eval;    /* collecting the eval split */
    int n_train; /* counting pass: lines of each split */
    int n_eval;
    int counting; /* 1: only count (prompt files are read twice: count, then keep) */
} collector;

static prl_status keep_task(ctl *c, json_t *line)
{
    int i = c->n_tasks + c->n_eval;
    c->task[i] = json_incref(line);
    c->task_text[i] = json_dumps(line, JSON_COMPACT | JSON_SORT_KEYS);
    c->task_id[i] = json_string_value(json_object_get(line, "id"));
    if (!c->task_text[i]) return prl_error_set(PRL_ERR_NOMEM, "task %d", i);
    if (!c->task_id[i]) return prl_error_set(PRL_ERR_FORMAT, "task %d has no \"id\"", i);
    return PRL_OK;
}

static prl_status collect_task(void *user, json_t *line)
{
    collector *k = user;
    ctl *c = k->c;
    const char *split = json_string_value(json_object_get(line, "split"));
    int is_eval = split && !strcmp(split, "eval");
    if (k->counting) {
        if (!is_eval) k->n_train++;
        else if (k->n_eval < c->job->eval_problems) k->n_eval++;
        return PRL_OK;
    }
    if (is_eval != k->eval) return PRL_OK;
    if (is_eval && c->n_eval >= k->n_eval) return PRL_OK; /* the first eval_problems */
    prl_status rc = keep_task(c, line);
    if (!rc && is_eval) c->n_eval++;
    else if (!rc) c->n_tasks++;
    return rc;
}

/* The generated problems of one split: the job's domain, or each of the four with
** task.domain = mixed (train: round(train_problems · task.mix.<d>) each; eval:
** task.eval_problems each), in prl_task_domain order. */
static prl_status generate_split(collector *k, prl_task_split split)
{
    const prl_job_config *j = k->c->job;
    prl_status rc = PRL_OK;
    for (int d = 0; d < PRL_TASK_N_DOMAINS && !rc; d++) {
        int n = prl_job_mix_problems(j, (prl_task_domain)d);
        if (n == 0) continue;
        prl_tasks_config tc;
        prl_tasks_config_default(&tc, (prl_task_domain)d);
        tc.split = split, tc.seed = j->seed, tc.difficulty = j->difficulty;
        tc.n = split == PRL_SPLIT_TRAIN ? n : j->eval_problems;
        if (k->counting) {
            *(split == PRL_SPLIT_TRAIN ? &k->n_train : &k->n_eval) += tc.n;
            continue;
        }
        k->eval = split == PRL_SPLIT_EVAL;
        rc = prl_tasks_generate(&tc, collect_task, k);
    }
    return rc;
}

/* Both splits into k->c's arrays (k->counting: only their sizes). */
static prl_status read_tasks(collector *k)
{
    const prl_job_config *j = k->c->job;
    int eval = j->eval_every > 0;
    if (!strcmp(j->task_source, "file")) {
        prl_tasks_file_options fo = {.require_verifier = !prl_job_has_reward_program(j)};
        k->eval = 0;
        prl_status rc = prl_reward_file_read(j->task_path, &fo, collect_task, k);
        if (!rc && eval && !k->counting)
            k->eval = 1, rc = prl_reward_file_read(j->task_path, &fo, collect_task, k);
        if (!rc && k->counting && !eval) k->n_eval = 0;
        if (!rc && k->counting && k->n_train == 0)
            rc = prl_error_set(PRL_ERR_FORMAT, "%s: no line is in the train split", j->task_path);
        return rc;
    }
    prl_status rc = generate_split(k, PRL_SPLIT_TRAIN);
    if (!rc && eval) rc = generate_split(k, PRL_SPLIT_EVAL);
    return rc;
}

/* Record tasks [from, to) of one split in run.db (idempotent on resume). */
static prl_status record_tasks(ctl *c, int from, int to, const char *split)
{
    prl_status rc = PRL_OK;
    for (int i = from; i < to && !rc; i++) {
        json_t *dj = json_object_get(c->task[i], "difficulty");
        const char *dom = json_string_value(json_object_get(c->task[i], "domain"));
        prl_store_prompt p = {.run = c->run,
                              .prompt_id = c->task_id[i],
                              .domain = dom ? dom : c->job->domain,
                              .split = split,
                              .task = c->task_text[i],
                              .difficulty = (int)json_integer_value(dj)};
        rc = prl_store_prompt_put(c->db, &p);
    }
    return rc;
}

/* The train split — generated (the job's domain, or the four of task.domain = mixed) or
** read from task.path — and, with task.eval_every, the eval split, recorded in run.db. */
prl_status ctl_load_tasks(ctl *c)
{
    collector k = {.c = c, .counting = 1};
    prl_status rc = read_tasks(&k);
    if (rc) return rc;
    size_t n = (size_t)k.n_train + (size_t)k.n_eval;
    c->task = calloc(n, sizeof *c->task);
    c->task_text = calloc(n, sizeof *c->task_text);
    c->task_id = calloc(n, sizeof *c->task_id);
    c->retired = calloc(n, 1);
    c->teacher_kl = calloc(n, sizeof *c->teacher_kl);
    c->task_teacher = calloc(n, sizeof *c->task_teacher);
    c->perm = calloc(n, sizeof *c->perm);
    if (!c->task || !c->task_text || !c->task_id || !c->retired || !c->teacher_kl ||
        !c->task_teacher || !c->perm)
        return prl_error_set(PRL_ERR_NOMEM, "%zu tasks", n);
    k.counting = 0;
    if ((rc = read_tasks(&k))) return rc;
    if ((rc = prl_store_begin(c->db))) return rc;
    rc = record_tasks(c, 0, c->n_tasks, "train");
    if (!rc) rc = record_tasks(c, c->n_tasks, c->n_tasks + c->n_eval, "eval");
    rc = rc ? (prl_store_rollback(c->db), rc) : prl_store_commit(c->db);
    for (int i = 0; i < c->n_tasks && !rc; i++) {
        prl_store_prompt p;
        if ((rc = prl_store_prompt_get(c->db, c->run, c->task_id[i], &p))) break;
        c->retired[i] = (uint8_t)p.retired;
        c->teacher_kl[i] = p.teacher_kl;
        c->task_teacher[i] = (int8_t)prl_opd_teacher_index(p.domain);
        prl_store_prompt_free(&p);
    }
    c->perm_epoch = -1;
    return rc;
}

/* The prompt at position p of the candidate sequence: epoch e = p / N visits every prompt
** once in an order shuffled from (seed, e). */
static int prompt_at(ctl *c, int64_t p, int64_t *epoch)
{
    int N = c->n_tasks;
    int64_t e = p / N;
    if (e != c->perm_epoch) {
        prl_rng r;
        prl_rng_init(&r, c->job->seed, (uint64_t)e, 0, 0, PRL_RNG_SHUFFLE);
        for (int i = 0; i < N; i++) c->perm[i] = i;
        for (int i = N - 1; i > 0; i--) {
            int k = (int)(prl_rng_u64(&r) % (uint64_t)(i + 1));
            int t = c->perm[i];
            c->perm[i] = c->perm[k], c->perm[k] = t;
        }
        c->perm_epoch = e;
    }
    *epoch = e;
    return c->perm[p % N];
}

/* One retirement rule at the start of `epoch`: the prompts whose outcome was `which` in each
** of the last n epochs (0 = off); *any is set when some were retired. */
static prl_status retire_rule(ctl *c, int64_t epoch, int n, prl_store_outcome which, int *any)
{
    if (n <= 0 || epoch < n) return PRL_OK;
    int64_t now = 0;
    prl_status rc = prl_store_prompts_retire(c->db, c->run, epoch - 1, n, which, &now);
    if (!rc && now > 0) {
        const char *what = which == PRL_STORE_SOLVED ? "solved" : "unsolved";
        ctl_log("retired %lld prompts %s in each of the last %d epochs", (long long)now, what, n);
        ctl_event(c, "retire", "{\"epoch\": %lld, \"retired\": %lld, \"rule\": \"%s\"}",
                  (long long)epoch, (long long)now, what);
        *any = 1;
    }
    return rc;
}

/* Before the first draw of a new epoch: retire the prompts solved (every sample) in each of
** the last n epochs (controller.retire_solved_epochs) and those no sample scored on in each
** of the last m (controller.retire_unsolved_epochs); then refresh the retired flags. */
static prl_status retire_before(ctl *c, int64_t epoch)
{
    if (epoch <= c->retired_epoch) return PRL_OK;
    c->retired_epoch = epoch;
    int any = 0;
    prl_status rc = retire_rule(c, epoch, c->job->retire_solved_epochs, PRL_STORE_SOLVED, &any);
    if (!rc) rc = retire_rule(c, epoch, c->job->retire_unsolved_epochs, PRL_STORE_UNSOLVED, &any);
    for (int i = 0; i < c->n_tasks && !rc && any; i++) {
        prl_store_prompt p;
        if ((rc = prl_store_prompt_get(c->db, c->run, c->task_id[i], &p))) break;
        c->retired[i] = (uint8_t)p.retired;
        prl_store_prompt_free(&p);
    }
    return rc;
}

static int step_has_prompt(const step_run *r, int p)
{
    for (int i = 0; r && i < r->n; i++)
        if (r->g[i].prompt == p) return 1;
    return 0;
}

/* The next active prompt of the candidate sequence (from c->cursor) that step r does not
** already hold (an epoch boundary could repeat one: results are keyed by prompt); -1 when
** none is left. */
int ctl_next_candidate(ctl *c, const step_run *r, int64_t *epoch)
{
    for (int tries = 0; tries < 2 * c->n_tasks + 2; tries++) {
        int64_t e = c->cursor / c->n_tasks;
        if (retire_before(c, e)) ctl_log("retirement skipped: %s", prl_error_message());
        int p = prompt_at(c, c->cursor++, epoch);
        if (!c->retired[p] && !step_has_prompt(r, p)) return p;
    }
    return -1;
}

/* ---------------------------------------------------------------- revisits (OPD) --- */
/* opd.revisit (docs/opd.md "Revisits"): a rare kind of prompt on which the student keeps
** disagreeing with its teacher teaches little at its share of the sequence. So R =
** round(opd.revisit · B) of each step's prompts are drawn again from the prompts already
** taught: a teacher, then one of its prompts with weight KL^opd.revisit_power, KL = the
** prompt's teacher KL at its last taught visit. A revisit that the student has learned has a
** low KL and is rarely drawn again. */

/* The prompts a step draws again (0 without opd.revisit). */
int ctl_revisit_count(const ctl *c)
{
    return c->job->opd_enabled ? (int)lround(c->job->opd_revisit * c->B) : 0;
}

/* A prompt's revisit weight within its teacher's prompts: KL^opd.revisit_power; 0 when it
** has no KL > 0, is retired or already in step r. */
static double revisit_weight(const ctl *c, const step_run *r, int p)
{
    if (c->task_teacher[p] < 0 || !(c->teacher_kl[p] > 0) || c->retired[p] || step_has_prompt(r, p))
        return 0;
    return pow(c->teacher_kl[p], c->job->opd_revisit_power);
}

/* Draw i of step r, from the draw (run seed, step, i, PRL_RNG_REVISIT): a teacher with
** probability proportional to its prompts with a weight (so the revisits keep the domains'
** mix: the teachers' KLs differ by tens of times), then one of its prompts in proportion
** to the weight; -1 when no prompt has one. Sums run in prompt order over the KLs the
** committed steps recorded, so the draw depends on nothing else. */
int ctl_revisit_draw(ctl *c, const step_run *r, int i)
{
    double total[PRL_OPD_TEACHERS] = {0};
    int n[PRL_OPD_TEACHERS] = {0}, all = 0;
    for (int p = 0; p < c->n_tasks; p++) {
        double w = revisit_weight(c, r, p);
        if (w > 0) total[c->task_teacher[p]] += w, n[c->task_teacher[p]]++, all++;
    }
    if (!all) return -1;
    prl_rng g;
    prl_rng_init(&g, c->job->seed, (uint64_t)r->step, (uint64_t)i, 0, PRL_RNG_REVISIT);
    int pick = (int)(prl_rng_u64(&g) % (uint64_t)all), k = 0;
    while (pick >= n[k]) pick -= n[k++];
    double u = prl_rng_uniform(&g) * total[k], acc = 0;
    int last = -1;
    for (int p = 0; p < c->n_tasks; p++) {
        if (c->task_teacher[p] != k) continue;
        double w = revisit_weight(c, r, p);
        if (!(w > 0)) continue;
        acc += w, last = p;
        if (u < acc) return p;
    }
    return last; /* u within rounding of total[k] */
}
