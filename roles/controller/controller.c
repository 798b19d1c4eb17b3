/*
** controller.c — the run's coordinator (controller.h, docs/pipeline.md).
**
** One thread, one ROUTER socket, one event loop: receive a message, update the state, then
** hand out whatever work can start. State lives in memory for the steps in flight and in
** run.db for everything finished, so a restarted controller continues from run.db.
**
** A step's life: open (its candidate prompts chosen) → every group rolled out (one `work`
** per group of G samples) → every sample scored (one `score` each) and written to run.db →
** groups judged (dynamic sampling drops groups of equal rewards and adds a candidate) →
** `train` to the trainer once the policy is at the step's version → `trained`: the version
** is recorded, the step's metrics written, the step closed. In sync mode (lag 0) step t+1
** opens when version t+1 exists; in async mode up to `max_lag` steps roll out ahead.
*/
#include "roles/controller/controller.h"

#include "bus/bus.h"
#include "grpo/grpo.h"
#include "opd/opd.h"
#include "reward/reward.h"
#include "store/store.h"
#include "tasks/tasks.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_WORKERS = 256, MAX_INFLIGHT = 8, CANDIDATE_FACTOR = 4,
       MAX_ATTEMPTS = 4 /* failed attempts of one work item before it is given up */ };

typedef struct worker {
    char name[64], role[16];
    prl_bus_peer peer;
    double seen;          /* last message or heartbeat */
    uint64_t lease;       /* lease held (0: idle) */
    int holds;            /* teacher: 1 + the teacher index last leased to it (0: none) */
} worker;

typedef enum lease_kind { LEASE_ROLLOUT = 1, LEASE_SCORE = 2, LEASE_TRAIN = 3,
                          LEASE_TEACH = 4 /* group = the teacher index */ } lease_kind;

typedef struct lease {
    uint64_t id;
    lease_kind kind;
    int64_t step;
    int group, sample;    /* the group (rollout, score) and sample (score) */
    int worker;
    double started;
} lease;

typedef struct slot {     /* one sample */
    int state;            /* 0 waiting for rollout, 1 generated, 2 scored */
    uint64_t score_lease;
    int32_t *tokens;
    int n, prompt_len;
    float *logprobs;      /* [n - prompt_len] */
    uint8_t *mask;        /* [n - prompt_len] */
    uint8_t *routes;
    size_t routes_bytes;
    int route_shape[4];   /* tokens, moe, k, width */
    char *turns;          /* JSON array of the model's turns */
    int64_t version;
    char worker[64];
    double gen_s, score_s;
    int stop;
    double reward;
    char *detail;
    unsigned flags;
    int failures;         /* scoring attempts that ended in an error or a rejected answer */
    int truncated;        /* the episode's last turn was cut off (the verifier pays nothing) */
    float *teacher_lp;    /* OPD: [n - prompt_len] the teacher's log-probs (NULL: not taught) */
    int32_t *topk_ids;    /* OPD with opd.topk K: [(n - prompt_len) × K] the teacher's top-k */
    float *topk_lp;       /* and their log-probs (NULL without) */
} slot;

typedef struct group {
    int prompt;           /* index into the train tasks */
    int64_t epoch;        /* the epoch its solved record counts for */
    uint64_t lease;       /* rollout lease (0: queued or done) */
    int generated, scored;
    int verdict;          /* 0 pending, 1 trained on, -1 dropped (equal rewards) */
    int failures;         /* rollout attempts that ended in an error or a rejected result */
    int teacher;          /* OPD: the teacher index of the prompt's domain (-1: none) */
    int revisit;          /* OPD: drawn again by its teacher KL (opd.revisit), not the sequence */
    slot *s;              /* [G] */
} group;

typedef struct step_run {
    int64_t step;
    int active;
    group *g;             /* candidates, in order */
    int n, cap;
    int accepted, dropped;
    uint64_t train_lease;
    int train_failures;
    double t_open, t_leased, t_rolled, t_scored, t_train; /* t_leased: first rollout lease */
    double gen_tokens, gen_seconds, score_seconds;
    /* OPD (docs/opd.md): one teach lease per teacher with samples, in key order */
    uint64_t teach_lease[PRL_OPD_TEACHERS];
    int taught[PRL_OPD_TEACHERS], teach_failures[PRL_OPD_TEACHERS];
    int teach_loads[PRL_OPD_TEACHERS];             /* experts loaded for the step's items */
    double teach_load_s[PRL_OPD_TEACHERS], teach_s[PRL_OPD_TEACHERS];
    uint64_t teach_rss_kb[PRL_OPD_TEACHERS];       /* VmHWM of the process that taught it */
    uint64_t proc_rss_kb[MAX_WORKERS];             /* per worker: VmHWM of its last answer */
    double t_taught;
} step_run;

typedef struct ctl {
    const prl_controller_options *o;
    const prl_job_config *job;
    int G, B, lag;
    prl_store *db;
    int64_t run;
    prl_bus_socket *sock;
    char *config_json;
    /* train prompts */
    json_t **task;
    char **task_text;
    const char **task_id;
    uint8_t *retired;
    double *teacher_kl;   /* OPD: each prompt's teacher KL at its last taught visit (-1: none) */
    int8_t *task_teacher; /* OPD: each prompt's teacher index (-1: none) */
    int n_tasks;
    int64_t perm_epoch;   /* epoch of perm[] */
    int *perm;
    /* workers and leases */
    worker w[MAX_WORKERS];
    int nw;
    lease *l;
    int nl, capl;
    uint64_t next_lease, next_id;
    /* steps */
    step_run st[MAX_INFLIGHT];
    int64_t next_step;    /* next step to open */
    int64_t cursor;       /* next position of the candidate sequence */
    int64_t version;      /* newest committed policy version */
    char version_path[1024];
    int64_t retired_epoch;/* last epoch the retirement rule ran for */
    int done;
    prl_status fatal;     /* a run.db failure: stop, the restart continues from run.db */
    int failed;           /* a work item kept failing, or no prompt is left: no restart */
    double t_start, t_last_commit;
    double interval_sum;  /* of the steps committed by this process, for the ETA */
    int intervals;
} ctl;

/* ---------------------------------------------------------------- helpers ---------- */

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("[controller] ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

prl_status prl_controller_endpoint(const char *run_dir, const char *socket_name, char *out,
                                   size_t n)
{
    int k = snprintf(out, n, "ipc://%s/%s", run_dir, socket_name);
    if (k < 0 || (size_t)k >= n || k - 6 > 107)
        return prl_error_set(PRL_ERR_ARG, "socket path %s/%s is longer than the 107 bytes of "
                             "an ipc:// endpoint: use a shorter run directory", run_dir, socket_name);
    return PRL_OK;
}

static void event(ctl *c, const char *kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void event(ctl *c, const char *kind, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (prl_store_event_add(c->db, c->run, kind, detail))
        logf_("could not record event %s: %s", kind, prl_error_message());
}

static void slot_free(slot *s)
{
    free(s->tokens), free(s->logprobs), free(s->mask), free(s->routes), free(s->turns);
    free(s->detail), free(s->teacher_lp), free(s->topk_ids), free(s->topk_lp);
    memset(s, 0, sizeof *s);
}

static void step_free(ctl *c, step_run *r)
{
    for (int i = 0; i < r->n; i++) {
        for (int j = 0; j < c->G; j++) slot_free(&r->g[i].s[j]);
        free(r->g[i].s);
    }
    free(r->g);
    memset(r, 0, sizeof *r);
}

static step_run *step_find(ctl *c, int64_t step)
{
    for (int i = 0; i < MAX_INFLIGHT; i++)
        if (c->st[i].active && c->st[i].step == step) return &c->st[i];
    return NULL;
}

static worker *worker_by_name(ctl *c, const char *name)
{
    for (int i = 0; i < c->nw; i++)
        if (!strcmp(c->w[i].name, name)) return &c->w[i];
    return NULL;
}

static worker *worker_by_peer(ctl *c, const prl_bus_peer *p)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].peer.len == p->len && !memcmp(c->w[i].peer.id, p->id, p->len)) return &c->w[i];
    return NULL;
}

static lease *lease_find(ctl *c, uint64_t id)
{
    for (int i = 0; i < c->nl; i++)
        if (c->l[i].id == id) return &c->l[i];
    return NULL;
}

static prl_status lease_new(ctl *c, lease_kind kind, int64_t step, int group, int sample,
                            worker *w, lease **out)
{
    if (c->nl == c->capl) {
        int cap = c->capl ? 2 * c->capl : 64;
        lease *p = realloc(c->l, (size_t)cap * sizeof *p);
        if (!p) return prl_error_set(PRL_ERR_NOMEM, "lease table");
        c->l = p, c->capl = cap;
    }
    lease *l = &c->l[c->nl++];
    *l = (lease){.id = ++c->next_lease, .kind = kind, .step = step, .group = group,
                 .sample = sample, .worker = (int)(w - c->w), .started = prl_now()};
    w->lease = l->id;
    *out = l;
    return PRL_OK;
}

/* End a lease: its worker is idle again (if it still holds it). */
static void lease_end(ctl *c, uint64_t id)
{
    for (int i = 0; i < c->nl; i++) {
        if (c->l[i].id != id) continue;
        worker *w = &c->w[c->l[i].worker];
        if (w->lease == id) w->lease = 0;
        c->l[i] = c->l[--c->nl];
        return;
    }
}

/* Give a lease's work back to the queue (its worker died, restarted or went silent). */
static void lease_requeue(ctl *c, lease *l, const char *why)
{
    step_run *r = step_find(c, l->step);
    if (r && l->kind == LEASE_ROLLOUT && l->group < r->n && r->g[l->group].lease == l->id)
        r->g[l->group].lease = 0;
    if (r && l->kind == LEASE_SCORE && l->group < r->n && r->g[l->group].s[l->sample].score_lease == l->id)
        r->g[l->group].s[l->sample].score_lease = 0;
    if (r && l->kind == LEASE_TRAIN && r->train_lease == l->id) r->train_lease = 0;
    if (r && l->kind == LEASE_TEACH && r->teach_lease[l->group] == l->id) r->teach_lease[l->group] = 0;
    static const char *kinds[] = {"", "rollout", "score", "train", "teach"};
    logf_("lease %llu (%s, step %lld) handed out again: %s", (unsigned long long)l->id,
          kinds[l->kind], (long long)l->step, why);
    event(c, "requeue", "{\"lease\": %llu, \"kind\": \"%s\", \"step\": %lld, \"worker\": \"%s\", "
          "\"why\": \"%s\"}", (unsigned long long)l->id, kinds[l->kind], (long long)l->step,
          c->w[l->worker].name, why);
    lease_end(c, l->id);
}

static void requeue_worker(ctl *c, worker *w, const char *why)
{
    for (int i = c->nl - 1; i >= 0; i--)
        if (&c->w[c->l[i].worker] == w) lease_requeue(c, &c->l[i], why);
}

static prl_status store_failed_score(ctl *c, step_run *r, group *g, int j, const char *why);

/* A work item failed (its worker reported an error doing it): hand it out again, up to
** MAX_ATTEMPTS. (A result the controller rejects is handed out again without counting: a
** worker must not be able to fail the run by sending garbage.) Then a score becomes reward 0 with the reason in its detail (a
** model output that cannot be scored must not stop the run); a rollout or training that keeps
** failing fails the run, naming the item and the reason. */
static void lease_failed(ctl *c, lease *l, const char *why)
{
    step_run *r = step_find(c, l->step);
    lease_kind kind = l->kind;
    int gi = l->group, j = l->sample;
    lease_requeue(c, l, why);
    if (!r || (kind != LEASE_TEACH && gi >= r->n)) return;
    group *g = kind == LEASE_TEACH ? NULL : &r->g[gi];
    if (kind == LEASE_SCORE && ++g->s[j].failures >= MAX_ATTEMPTS) {
        event(c, "score_failed", "{\"step\": %lld, \"prompt\": \"%s\", \"sample\": %d}",
              (long long)r->step, c->task_id[g->prompt], j);
        c->fatal = store_failed_score(c, r, g, j, why);
    } else if (kind == LEASE_ROLLOUT && ++g->failures >= MAX_ATTEMPTS) {
        c->failed = 1;
        c->fatal = prl_error_set(PRL_ERR_IO, "the rollout of prompt %s (step %lld) failed %d times: %s",
                                 c->task_id[g->prompt], (long long)r->step, g->failures, why);
    } else if (kind == LEASE_TEACH && ++r->teach_failures[gi] >= MAX_ATTEMPTS) {
        c->failed = 1;
        c->fatal = prl_error_set(PRL_ERR_IO, "teacher %s of step %lld failed %d times: %s",
                                 prl_opd_teacher_key(gi), (long long)r->step,
                                 r->teach_failures[gi], why);
    } else if (kind == LEASE_TRAIN && ++r->train_failures >= MAX_ATTEMPTS) {
        c->failed = 1;
        c->fatal = prl_error_set(PRL_ERR_IO, "training step %lld failed %d times: %s",
                                 (long long)r->step, r->train_failures, why);
    }
}

/* ---------------------------------------------------------------- sending ---------- */

static prl_status send_msg(ctl *c, worker *w, prl_bus_msg *m)
{
    prl_status rc = prl_bus_send(c->sock, &w->peer, m);
    prl_bus_msg_free(m);
    if (rc) { /* gone: forgotten until it says hello again */
        logf_("send to %s failed: %s", w->name, prl_error_message());
        w->peer.len = 0;
    }
    return rc;
}

static void send_error(ctl *c, const prl_bus_peer *to, uint64_t ref, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(ctl *c, const prl_bus_peer *to, uint64_t ref, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    for (char *p = why; *p; p++)
        if ((unsigned char)*p < 32) *p = ' ';
    logf_("rejected message %llu: %s", (unsigned long long)ref, why);
    prl_bus_msg m;
    if (prl_bus_msg_init(&m, "error", c->job->name, ++c->next_id)) return;
    prl_bus_msg_set_str(&m, "reason", why);
    prl_bus_msg_set_uint(&m, "ref", ref);
    if (prl_bus_send(c->sock, to, &m)) logf_("error reply failed: %s", prl_error_message());
    prl_bus_msg_free(&m);
}

static prl_status send_welcome(ctl *c, worker *w)
{
    prl_bus_msg m;
    prl_status rc = prl_bus_msg_init(&m, "welcome", c->job->name, ++c->next_id);
    if (!rc) rc = prl_bus_msg_set_str(&m, "run_dir", c->o->run_dir);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "seed", c->job->seed);
    if (!rc) rc = prl_bus_msg_add_frame(&m, "config", PRL_BUS_BYTES, c->config_json, strlen(c->config_json));
    if (rc) {
        prl_bus_msg_free(&m);
        return rc;
    }
    return send_msg(c, w, &m);
}

static void send_stop(ctl *c, worker *w, const char *why)
{
    prl_bus_msg m;
    if (prl_bus_msg_init(&m, "stop", c->job->name, ++c->next_id)) return;
    prl_bus_msg_set_str(&m, "reason", why);
    send_msg(c, w, &m);
}

/* ---------------------------------------------------------------- prompts ---------- */

static prl_status collect_task(void *user, json_t *line)
{
    ctl *c = user;
    int i = c->n_tasks;
    c->task[i] = json_incref(line);
    c->task_text[i] = json_dumps(line, JSON_COMPACT | JSON_SORT_KEYS);
    c->task_id[i] = json_string_value(json_object_get(line, "id"));
    if (!c->task_text[i]) return prl_error_set(PRL_ERR_NOMEM, "task %d", i);
    if (!c->task_id[i]) return prl_error_set(PRL_ERR_FORMAT, "task %d has no \"id\"", i);
    c->n_tasks++;
    return PRL_OK;
}

/* The train split of the job's domain — of each of the four with task.domain = mixed
** (round(train_problems · task.mix.<d>) each, in prl_task_domain order) — recorded in run.db
** (idempotent on resume). */
static prl_status load_tasks(ctl *c)
{
    const prl_job_config *j = c->job;
    prl_status rc = PRL_OK;
    size_t n = 0;
    for (int k = 0; k < PRL_TASK_N_DOMAINS; k++) n += (size_t)prl_job_mix_problems(j, (prl_task_domain)k);
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
    for (int k = 0; k < PRL_TASK_N_DOMAINS && !rc; k++) {
        prl_tasks_config tc;
        prl_tasks_config_default(&tc, (prl_task_domain)k);
        tc.split = PRL_SPLIT_TRAIN, tc.n = prl_job_mix_problems(j, (prl_task_domain)k), tc.seed = j->seed;
        if (tc.n == 0) continue;
        tc.difficulty = j->difficulty;
        rc = prl_tasks_generate(&tc, collect_task, c);
    }
    if (rc) return rc;
    if ((rc = prl_store_begin(c->db))) return rc;
    for (int i = 0; i < c->n_tasks && !rc; i++) {
        json_t *dj = json_object_get(c->task[i], "difficulty");
        const char *dom = json_string_value(json_object_get(c->task[i], "domain"));
        prl_store_prompt p = {.run = c->run, .prompt_id = c->task_id[i], .domain = dom ? dom : j->domain,
                              .split = "train", .task = c->task_text[i],
                              .difficulty = (int)json_integer_value(dj)};
        rc = prl_store_prompt_put(c->db, &p);
    }
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
        logf_("retired %lld prompts %s in each of the last %d epochs", (long long)now, what, n);
        event(c, "retire", "{\"epoch\": %lld, \"retired\": %lld, \"rule\": \"%s\"}",
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
static int next_candidate(ctl *c, const step_run *r, int64_t *epoch)
{
    for (int tries = 0; tries < 2 * c->n_tasks + 2; tries++) {
        int64_t e = c->cursor / c->n_tasks;
        if (retire_before(c, e)) logf_("retirement skipped: %s", prl_error_message());
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

static int sample_fresh(const ctl *c, const step_run *r, const slot *s);

/* The prompts a step draws again (0 without opd.revisit). */
static int revisit_count(const ctl *c)
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
static int revisit_draw(ctl *c, const step_run *r, int i)
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

/* The KL of a group's taught samples: the mean over their loss tokens of lp_S − lp_T (the
** sampler's and the teacher's log-probs of the sampled token: the per-token estimate of
** KL(student ‖ teacher) that the step's metrics report), floored at 0; -1 when none was
** taught (the group was dropped, or its samples were stale). */
static double group_teacher_kl(const ctl *c, const step_run *r, const group *g)
{
    double sum = 0;
    long n = 0;
    for (int j = 0; g->verdict == 1 && j < c->G; j++) {
        const slot *s = &g->s[j];
        if (!s->teacher_lp || !sample_fresh(c, r, s)) continue;
        for (int t = 0; t < s->n - s->prompt_len; t++)
            if (s->mask[t]) sum += (double)s->logprobs[t] - (double)s->teacher_lp[t], n++;
    }
    return n ? fmax(0.0, sum / (double)n) : -1;
}

/* ---------------------------------------------------------------- steps ------------ */

static prl_status group_add(ctl *c, step_run *r, int prompt, int64_t epoch)
{
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : c->B;
        group *g = realloc(r->g, (size_t)cap * sizeof *g);
        if (!g) return prl_error_set(PRL_ERR_NOMEM, "step groups");
        r->g = g, r->cap = cap;
    }
    group *g = &r->g[r->n];
    *g = (group){.prompt = prompt, .epoch = epoch, .s = calloc((size_t)c->G, sizeof(slot)),
                 .teacher = -1};
    if (c->job->opd_enabled) /* the teacher of the prompt's domain (every one is configured) */
        g->teacher = c->task_teacher[prompt];
    if (!g->s) return prl_error_set(PRL_ERR_NOMEM, "group of %d samples", c->G);
    r->n++;
    return PRL_OK;
}

/* Fill a slot from a stored sample (resume). */
static prl_status slot_from_store(ctl *c, slot *s, const prl_store_sample *x)
{
    int nr = x->n_tokens - x->prompt_len;
    s->tokens = malloc((size_t)x->n_tokens * sizeof *s->tokens);
    s->logprobs = malloc((size_t)(nr ? nr : 1) * sizeof *s->logprobs);
    s->mask = malloc((size_t)(nr ? nr : 1));
    s->detail = strdup(x->reward_detail ? x->reward_detail : "{}");
    if (!s->tokens || !s->logprobs || !s->mask || !s->detail)
        return prl_error_set(PRL_ERR_NOMEM, "sample");
    memcpy(s->tokens, x->tokens, (size_t)x->n_tokens * sizeof *s->tokens);
    memcpy(s->logprobs, x->logprobs, (size_t)nr * sizeof *s->logprobs);
    for (int i = 0; i < nr; i++) s->mask[i] = x->loss_mask ? x->loss_mask[i] : 1;
    s->n = x->n_tokens, s->prompt_len = x->prompt_len, s->version = x->version;
    s->reward = x->reward, s->flags = x->flags, s->stop = x->stop, s->state = 2;
    if (x->routes && x->route_tokens > 0) { /* the record the trainer replays (docs/replay.md) */
        size_t bytes = (size_t)x->route_tokens * x->route_moe * x->route_k * x->route_width;
        s->routes = malloc(bytes);
        if (!s->routes) return prl_error_set(PRL_ERR_NOMEM, "sample routes");
        memcpy(s->routes, x->routes, bytes);
        s->routes_bytes = bytes;
        s->route_shape[0] = x->route_tokens, s->route_shape[1] = x->route_moe;
        s->route_shape[2] = x->route_k, s->route_shape[3] = x->route_width;
    }
    s->gen_s = x->gen_seconds, s->score_s = x->reward_seconds;
    snprintf(s->worker, sizeof s->worker, "%s", x->worker ? x->worker : "");
    (void)c;
    return PRL_OK;
}

static void judge_group(ctl *c, step_run *r, group *g);

/* Open the next step: its B base candidates; samples already in run.db (a resumed run) are
** taken as they are. */
static prl_status step_open(ctl *c)
{
    step_run *r = NULL;
    for (int i = 0; i < MAX_INFLIGHT && !r; i++)
        if (!c->st[i].active) r = &c->st[i];
    if (!r) return PRL_OK;
    *r = (step_run){.step = c->next_step, .active = 1, .t_open = prl_now()};
    prl_status rc = PRL_OK;
    int R = revisit_count(c);
    for (int i = 0; i < c->B && !rc; i++) {
        int64_t e = c->cursor / c->n_tasks; /* a revisit's outcome counts for the current epoch */
        int p = i >= c->B - R ? revisit_draw(c, r, i - (c->B - R)) : -1;
        int revisit = p >= 0;
        if (!revisit) p = next_candidate(c, r, &e);
        if (p < 0) { /* the retire rules emptied the set: a restart would find it empty too */
            c->failed = 1;
            return prl_error_set(PRL_ERR_RANGE, "step %lld: every train prompt is retired (see the "
                                 "'retire' events in run.db; lower controller.retire_*_epochs or "
                                 "raise task.train_problems)", (long long)r->step);
        }
        rc = group_add(c, r, p, e);
        if (!rc) r->g[r->n - 1].revisit = revisit;
    }
    c->next_step++;
    prl_store_sample *xs = NULL;
    size_t nx = 0;
    if (!rc) rc = prl_store_samples_for_step(c->db, c->run, r->step, -1, &xs, &nx);
    /* Groups judged here may add candidates (dynamic sampling) whose samples are stored too:
    ** take stored samples group by group until no new group appears. */
    for (int from = 0; !rc && from < r->n;) {
        int upto = r->n;
        for (size_t k = 0; k < nx && !rc; k++) {
            for (int gi = from; gi < upto; gi++) {
                group *g = &r->g[gi];
                if (strcmp(c->task_id[g->prompt], xs[k].prompt_id) || xs[k].sample_index >= c->G) continue;
                slot *s = &g->s[xs[k].sample_index];
                if (s->state) continue;
                rc = slot_from_store(c, s, &xs[k]);
                g->generated++, g->scored++;
            }
        }
        for (int gi = from; gi < upto && !rc; gi++)
            if (r->g[gi].scored == c->G) judge_group(c, r, &r->g[gi]);
        from = upto;
    }
    prl_store_samples_free(xs, nx);
    if (nx) logf_("step %lld: %zu samples taken from run.db", (long long)r->step, nx);
    return rc;
}

static int all_equal(const group *g, int G)
{
    for (int j = 1; j < G; j++)
        if (g->s[j].reward != g->s[0].reward) return 0;
    return 1;
}

/* Every sample of a group is scored: record its outcome (solved, unsolved or mixed), then
** keep it or (dynamic sampling, equal rewards) drop it and add the next candidate. */
static void judge_group(ctl *c, step_run *r, group *g)
{
    int solved = 1, unsolved = 1;
    for (int j = 0; j < c->G; j++) solved &= g->s[j].reward >= 1.0, unsolved &= g->s[j].reward <= 0.0;
    prl_store_outcome o = solved ? PRL_STORE_SOLVED : unsolved ? PRL_STORE_UNSOLVED : PRL_STORE_MIXED;
    if (prl_store_prompt_record(c->db, c->run, c->task_id[g->prompt], g->epoch, o))
        logf_("outcome record of %s: %s", c->task_id[g->prompt], prl_error_message());
    if (c->job->dynamic_sampling && c->G > 1 && all_equal(g, c->G)) {
        g->verdict = -1;
        r->dropped++;
        for (int j = 0; j < c->G; j++)
            prl_store_sample_set_status(c->db, c->run, r->step, c->task_id[g->prompt], j,
                                        PRL_STORE_SAMPLE_DROPPED);
        if (r->n < CANDIDATE_FACTOR * c->B) {
            int64_t e;
            int p = next_candidate(c, r, &e);
            if (p >= 0 && group_add(c, r, p, e)) logf_("%s", prl_error_message());
        }
        return;
    }
    g->verdict = 1;
    r->accepted++;
}

static int step_rolled(const ctl *c, const step_run *r)
{
    for (int i = 0; i < r->n; i++)
        if (r->g[i].verdict == 0) return 0;
    (void)c;
    return 1;
}

/* ---------------------------------------------------------------- leasing ---------- */

static worker *idle_worker(ctl *c, const char *role)
{
    for (int i = 0; i < c->nw; i++)
        if (!c->w[i].lease && c->w[i].peer.len && !strcmp(c->w[i].role, role)) return &c->w[i];
    return NULL;
}

static prl_status lease_rollout(ctl *c, step_run *r, int gi, worker *w)
{
    lease *l;
    prl_status rc = lease_new(c, LEASE_ROLLOUT, r->step, gi, 0, w, &l);
    if (rc) return rc;
    group *g = &r->g[gi];
    g->lease = l->id;
    if (!r->t_leased) r->t_leased = l->started;
    prl_bus_msg m;
    rc = prl_bus_msg_init(&m, "work", c->job->name, ++c->next_id);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "lease", l->id);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "step", (uint64_t)r->step);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "prompt", (uint64_t)g->prompt);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "sample", 0);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "count", (uint64_t)c->G);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "policy_version", (uint64_t)c->version);
    if (!rc) rc = prl_bus_msg_set_str(&m, "path", c->version_path);
    const char *t = c->task_text[g->prompt];
    if (!rc) rc = prl_bus_msg_add_frame(&m, "task", PRL_BUS_BYTES, t, strlen(t));
    if (rc) {
        prl_bus_msg_free(&m);
        return rc;
    }
    if (send_msg(c, w, &m)) lease_requeue(c, l, "send failed");
    return PRL_OK;
}

static prl_status lease_score(ctl *c, step_run *r, int gi, int j, worker *w)
{
    lease *l;
    prl_status rc = lease_new(c, LEASE_SCORE, r->step, gi, j, w, &l);
    if (rc) return rc;
    group *g = &r->g[gi];
    slot *s = &g->s[j];
    s->score_lease = l->id;
    prl_bus_msg m;
    rc = prl_bus_msg_init(&m, "score", c->job->name, ++c->next_id);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "lease", l->id);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "step", (uint64_t)r->step);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "prompt", (uint64_t)g->prompt);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "sample", (uint64_t)j);
    if (!rc) rc = prl_bus_msg_set_uint(&m, "truncated", (uint64_t)s->truncated);
    const char *t = c->task_text[g->prompt];
    if (!rc) rc = prl_bus_msg_add_frame(&m, "task", PRL_BUS_BYTES, t, strlen(t));
    if (!rc) rc = prl_bus_msg_add_frame(&m, "turns", PRL_BUS_BYTES, s->turns, strlen(s->turns));
    if (rc) {
        prl_bus_msg_free(&m);
        return rc;
    }
    if (send_msg(c, w, &m)) lease_requeue(c, l, "send failed");
    return PRL_OK;
}

/* A sample is trained on when its group is kept and its version is within the lag bound. */
static int sample_fresh(const ctl *c, const step_run *r, const slot *s)
{
    return s->version >= r->step - c->lag;
}

static prl_status step_commit(ctl *c, step_run *r, const char *path, uint64_t sum,
                              const char *trainer_metrics, double train_s);

static int trainable(const ctl *c, const step_run *r)
{
    for (int i = 0; i < r->n; i++)
        for (int j = 0; r->g[i].verdict == 1 && j < c->G; j++)
            if (sample_fresh(c, r, &r->g[i].s[j])) return 1;
    return 0;
}

/* A route record of shape [tokens][moe][k] x width holds `bytes` bytes and at most one row
** per fed token of a sequence of n tokens. */
static int routes_shape_ok(const int *sh, size_t bytes, size_t n)
{
    if (sh[0] < 1 || (size_t)sh[0] > n - 1 || sh[1] < 1 || sh[1] > PRL_MAX_LAYERS || sh[2] < 1 ||
        sh[2] > 256 || (sh[3] != 1 && sh[3] != 2))
        return 0;
    return bytes == (size_t)sh[0] * sh[1] * sh[2] * sh[3];
}

/* A slot's route record fits the reference shape `ref` (tokens ignored) and its tokens. */
static int slot_routes_fit(const slot *s, const int *ref)
{
    const int *sh = s->route_shape;
    return s->routes && routes_shape_ok(sh, s->routes_bytes, (size_t)s->n) && sh[1] == ref[1] &&
           sh[2] == ref[2] && sh[3] == ref[3];
}

/* The routes frames of `train` (docs/replay.md): every kept sample's route record, in the
** shape of the first record; a sample without one (or of another shape) gets 0 rows and
** routes natively in the trainer. No frames when no sample has a record. */
static prl_status train_routes(ctl *c, step_run *r, prl_grpo_batch *b)
{
    const int *ref = NULL;
    size_t rows = 0;
    for (int pass = 0; pass < 2; pass++) {
        int k = 0;
        size_t at = 0;
        for (int i = 0; i < r->n; i++)
            for (int j = 0; r->g[i].verdict == 1 && j < c->G; j++) {
                const slot *s = &r->g[i].s[j];
                if (!sample_fresh(c, r, s)) continue;
                if (!ref && s->routes && s->route_shape[0] > 0) ref = s->route_shape;
                int fit = ref && slot_routes_fit(s, ref);
                if (pass == 0 && fit) rows += (size_t)s->route_shape[0];
                if (pass == 1 && fit) {
                    b->route_rows[k] = s->route_shape[0];
                    memcpy(b->routes + at, s->routes, s->routes_bytes);
                    at += s->routes_bytes;
                }
                k++;
            }
        if (pass == 0 && !rows) return PRL_OK;
        if (pass == 0) {
            prl_status rc = prl_grpo_batch_routes_init(b, ref[1], ref[2], ref[3], rows);
            if (rc) return rc;
        }
    }
    return PRL_OK;
}

/* ---------------------------------------------------------------- OPD teachers ----- */
/* docs/opd.md: once a step is rolled out, each teacher's trained samples go to the teacher
** pool as one `teach` item per teacher, handed out in key order (rl.md §5.3); a teacher
** process holding that expert is preferred, so experts are loaded as rarely as possible and
** never two in one process. The step trains when every teacher has answered. */

/* The samples of teacher k that the step trains on, in the order of build_train; calls
** fn for each. Returns their count. */
static int teacher_samples(const ctl *c, const step_run *r, int k,
                           void (*fn)(void *u, slot *s), void *u)
{
    int n = 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; r->g[i].verdict == 1 && r->g[i].teacher == k && j < c->G; j++) {
            slot *s = &r->g[i].s[j];
            if (!sample_fresh(c, r, s)) continue;
            n++;
            if (fn) fn(u, s);
        }
    return n;
}

typedef struct teach_pack {
    prl_grpo_batch *b;
    int k;
    size_t at, rat;
} teach_pack;

static void pack_one(void *u, slot *s)
{
    teach_pack *p = u;
    int nr = s->n - s->prompt_len;
    p->b->offsets[p->k] = (int32_t)p->at, p->b->prompt_lens[p->k] = s->prompt_len;
    memcpy(p->b->tokens + p->at, s->tokens, (size_t)s->n * sizeof *s->tokens);
    memcpy(p->b->mask + p->rat, s->mask, (size_t)nr);
    p->at += (size_t)s->n, p->rat += (size_t)nr, p->k++;
}

static void count_one(void *u, slot *s)
{
    size_t *n = u;
    n[0] += (size_t)s->n, n[1] += (size_t)(s->n - s->prompt_len);
}

static prl_status build_teach(ctl *c, step_run *r, int k, prl_bus_msg *m, uint64_t lease_id)
{
    size_t n[2] = {0, 0};
    int cnt = teacher_samples(c, r, k, count_one, n);
    prl_grpo_batch b;
    prl_status rc = prl_grpo_batch_init(&b, cnt, n[0], n[1]);
    teach_pack p = {.b = &b};
    if (!rc) teacher_samples(c, r, k, pack_one, &p);
    if (!rc) b.offsets[cnt] = (int32_t)p.at;
    if (!rc) rc = prl_bus_msg_init(m, "teach", c->job->name, ++c->next_id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", lease_id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", (uint64_t)r->step);
    if (!rc) rc = prl_bus_msg_set_str(m, "teacher", prl_opd_teacher_key(k));
    if (!rc) rc = prl_bus_msg_set_str(m, "path", c->job->opd_teachers[k]);
    if (!rc) rc = prl_opd_teach_to_msg(&b, m);
    prl_grpo_batch_free(&b);
    return rc;
}

static prl_status lease_teach(ctl *c, step_run *r, int k, worker *w)
{
    lease *l = NULL;
    prl_status rc = lease_new(c, LEASE_TEACH, r->step, k, 0, w, &l);
    if (rc) return rc;
    r->teach_lease[k] = l->id;
    w->holds = k + 1;
    prl_bus_msg m;
    memset(&m, 0, sizeof m); /* freed on error even if build_teach failed before its init */
    if ((rc = build_teach(c, r, k, &m, l->id))) {
        prl_bus_msg_free(&m);
        return rc;
    }
    if (send_msg(c, w, &m)) lease_requeue(c, l, "send failed");
    return PRL_OK;
}

/* An idle teacher process, preferring one that holds teacher k. */
static worker *idle_teacher(ctl *c, int k)
{
    for (int i = 0; i < c->nw; i++)
        if (!c->w[i].lease && c->w[i].peer.len && !strcmp(c->w[i].role, "teacher") &&
            c->w[i].holds == k + 1)
            return &c->w[i];
    return idle_worker(c, "teacher");
}

/* Hand out the teach items of a rolled-out step, in key order; 1 when every teacher has
** answered (or the job has no teachers). */
static int step_taught(ctl *c, step_run *r, prl_status *rc)
{
    if (!c->job->opd_enabled) return 1;
    int done = 1;
    for (int k = 0; k < PRL_OPD_TEACHERS && !*rc; k++) {
        if (r->taught[k]) continue;
        if (!teacher_samples(c, r, k, NULL, NULL)) {
            r->taught[k] = 1;
            continue;
        }
        done = 0;
        if (r->teach_lease[k]) continue;
        worker *w = idle_teacher(c, k);
        if (w) *rc = lease_teach(c, r, k, w);
    }
    if (done && !r->t_taught) r->t_taught = prl_now();
    return done;
}

/* The teacher frames of `train`: each sample's teacher log-probs and teacher index. */
static prl_status train_teachers(ctl *c, step_run *r, const prl_grpo_batch *b, prl_bus_msg *m)
{
    prl_opd_batch ob;
    int K = c->job->opd_topk;
    prl_status rc = prl_opd_batch_init(&ob, b->n, b->n_response, K);
    size_t at = 0;
    int k = 0;
    for (int i = 0; i < r->n && !rc; i++)
        for (int j = 0; r->g[i].verdict == 1 && j < c->G && !rc; j++) {
            const slot *s = &r->g[i].s[j];
            if (!sample_fresh(c, r, s)) continue;
            int nr = s->n - s->prompt_len;
            if (!s->teacher_lp || (K && !s->topk_ids))
                rc = prl_error_set(PRL_ERR_ARG, "step %lld: sample %d has no teacher log-probs",
                                   (long long)r->step, k);
            else memcpy(ob.teacher_lp + at, s->teacher_lp, (size_t)nr * sizeof *ob.teacher_lp);
            if (!rc && K) {
                memcpy(ob.topk_ids + at * K, s->topk_ids, (size_t)nr * K * sizeof *ob.topk_ids);
                memcpy(ob.topk_lp + at * K, s->topk_lp, (size_t)nr * K * sizeof *ob.topk_lp);
            }
            ob.teacher[k++] = r->g[i].teacher;
            at += (size_t)nr;
        }
    if (!rc) rc = prl_opd_batch_to_msg(&ob, m);
    prl_opd_batch_free(&ob);
    return rc;
}

/* The step's teacher metrics (JSON object text into out[n]): per teacher its samples' load
** and scoring time, loads and the peak RSS of the process that taught it; per teacher
** process that answered, its peak RSS. */
static void teach_metrics(const ctl *c, const step_run *r, char *out, size_t n)
{
    size_t k = (size_t)snprintf(out, n, "{");
    uint64_t peak = 0;
    for (int t = 0; t < PRL_OPD_TEACHERS && k < n; t++) {
        if (!r->teach_rss_kb[t]) continue;
        peak = r->teach_rss_kb[t] > peak ? r->teach_rss_kb[t] : peak;
        k += (size_t)snprintf(out + k, n - k, "%s\"%s\": {\"load_s\": %.3f, \"teach_s\": %.3f, "
                              "\"loads\": %d, \"peak_rss_kb\": %llu}", k > 1 ? ", " : "",
                              prl_opd_teacher_key(t), r->teach_load_s[t], r->teach_s[t],
                              r->teach_loads[t], (unsigned long long)r->teach_rss_kb[t]);
    }
    if (k < n) k += (size_t)snprintf(out + k, n - k, "%s\"processes\": {", k > 1 ? ", " : "");
    for (int i = 0, first = 1; i < c->nw && k < n; i++) {
        if (!r->proc_rss_kb[i]) continue;
        k += (size_t)snprintf(out + k, n - k, "%s\"%s\": %llu", first ? "" : ", ", c->w[i].name,
                              (unsigned long long)r->proc_rss_kb[i]);
        first = 0;
    }
    if (k < n) snprintf(out + k, n - k, "}, \"peak_rss_kb\": %llu}", (unsigned long long)peak);
}

/* Pack a step's kept, fresh samples into a `train` message (docs/pipeline.md). */
static prl_status build_train(ctl *c, step_run *r, prl_bus_msg *m, uint64_t lease_id)
{
    int cnt = 0;
    size_t ntok = 0, nresp = 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; r->g[i].verdict == 1 && j < c->G; j++) {
            const slot *s = &r->g[i].s[j];
            if (!sample_fresh(c, r, s)) continue;
            cnt++, ntok += (size_t)s->n, nresp += (size_t)(s->n - s->prompt_len);
        }
    prl_grpo_batch b;
    prl_status rc = prl_grpo_batch_init(&b, cnt, ntok, nresp);
    size_t at = 0, rat = 0;
    int k = 0;
    for (int i = 0; i < r->n && !rc; i++)
        for (int j = 0; r->g[i].verdict == 1 && j < c->G; j++) {
            const slot *s = &r->g[i].s[j];
            if (!sample_fresh(c, r, s)) continue;
            int nr = s->n - s->prompt_len;
            b.offsets[k] = (int32_t)at, b.prompt_lens[k] = s->prompt_len, b.groups[k] = i;
            b.rewards[k] = (float)s->reward;
            memcpy(b.tokens + at, s->tokens, (size_t)s->n * sizeof *b.tokens);
            memcpy(b.logprobs + rat, s->logprobs, (size_t)nr * sizeof *b.logprobs);
            memcpy(b.mask + rat, s->mask, (size_t)nr);
            at += (size_t)s->n, rat += (size_t)nr, k++;
        }
    if (!rc) b.offsets[cnt] = (int32_t)at;
    if (!rc) rc = train_routes(c, r, &b);
    if (!rc) rc = prl_bus_msg_init(m, "train", c->job->name, ++c->next_id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "lease", lease_id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "step", (uint64_t)r->step);
    if (!rc) rc = prl_bus_msg_set_uint(m, "policy_version", (uint64_t)c->version);
    if (!rc) rc = prl_bus_msg_set_str(m, "path", c->version_path);
    if (!rc) rc = prl_grpo_batch_to_msg(&b, m);
    if (!rc && c->job->opd_enabled) rc = train_teachers(c, r, &b, m);
    prl_grpo_batch_free(&b);
    return rc;
}

static prl_status lease_train(ctl *c, step_run *r, worker *w)
{
    lease *l;
    prl_status rc = lease_new(c, LEASE_TRAIN, r->step, 0, 0, w, &l);
    if (rc) return rc;
    r->train_lease = l->id;
    if (!r->t_train) r->t_train = prl_now();
    prl_bus_msg m;
    if ((rc = build_train(c, r, &m, l->id))) {
        prl_bus_msg_free(&m);
        return rc;
    }
    if (send_msg(c, w, &m)) lease_requeue(c, l, "send failed");
    return PRL_OK;
}

/* Hand out everything that can start now, oldest step first. */
static prl_status schedule(ctl *c)
{
    prl_status rc = PRL_OK;
    /* open steps: sync (lag 0) needs version == step; async lets `lag` steps run ahead */
    while (!rc && c->next_step < c->job->steps && c->next_step <= c->version + c->lag) {
        int free_slot = 0;
        for (int i = 0; i < MAX_INFLIGHT; i++) free_slot |= !c->st[i].active;
        if (!free_slot) break;
        rc = step_open(c);
    }
    for (int64_t t = c->next_step - MAX_INFLIGHT; !rc && t < c->next_step; t++) {
        step_run *r = step_find(c, t);
        if (!r) continue;
        for (int gi = 0; gi < r->n && !rc; gi++) {
            group *g = &r->g[gi];
            if (!g->lease && g->generated < c->G) {
                worker *w = idle_worker(c, "rollout");
                if (!w) break;
                rc = lease_rollout(c, r, gi, w);
            }
        }
        for (int gi = 0; gi < r->n && !rc; gi++)
            for (int j = 0; j < c->G && !rc; j++) {
                slot *s = &r->g[gi].s[j];
                if (s->state != 1 || s->score_lease) continue;
                worker *w = idle_worker(c, "reward");
                if (!w) break;
                rc = lease_score(c, r, gi, j, w);
            }
        if (!rc && !r->train_lease && step_rolled(c, r) && !step_taught(c, r, &rc)) continue;
        if (!rc && !r->train_lease && r->step == c->version && step_rolled(c, r)) {
            if (!trainable(c, r)) { /* every group dropped or stale: the policy stays */
                logf_("step %lld has no trainable sample: version %lld keeps the weights",
                      (long long)r->step, (long long)c->version + 1);
                char vpath[1024];
                snprintf(vpath, sizeof vpath, "%s", c->version_path);
                rc = step_commit(c, r, vpath, 0, "{\"skipped\": true}", 0);
                continue;
            }
            worker *w = idle_worker(c, "trainer");
            if (w) rc = lease_train(c, r, w);
        }
    }
    return rc;
}

/* ---------------------------------------------------------------- receiving -------- */

static uint64_t field_u(const prl_bus_msg *m, const char *k, int *bad)
{
    uint64_t v = 0;
    if (prl_bus_msg_get_uint(m, k, &v)) *bad = 1;
    return v;
}

/* The group a result or score answers: step in flight, prompt among its candidates. */
static group *find_group(ctl *c, uint64_t step, uint64_t prompt, step_run **rr, int *gi)
{
    step_run *r = step_find(c, (int64_t)step);
    if (!r) return NULL;
    for (int i = 0; i < r->n; i++)
        if ((uint64_t)r->g[i].prompt == prompt) {
            *rr = r, *gi = i;
            return &r->g[i];
        }
    return NULL;
}

static void on_hello(ctl *c, const prl_bus_msg *m, const prl_bus_peer *from, uint64_t id)
{
    const char *role = NULL, *name = NULL;
    if (prl_bus_msg_get_str(m, "role", &role) || prl_bus_msg_get_str(m, "worker", &name)) {
        send_error(c, from, id, "hello needs role and worker");
        return;
    }
    if (strcmp(role, "rollout") && strcmp(role, "reward") && strcmp(role, "trainer") &&
        strcmp(role, "teacher")) {
        send_error(c, from, id, "unknown role '%s' (rollout, reward, trainer or teacher)", role);
        return;
    }
    if (from->len != strlen(name) || memcmp(from->id, name, from->len)) {
        send_error(c, from, id, "worker '%s' must connect with its name as the socket identity", name);
        return;
    }
    worker *w = worker_by_name(c, name);
    if (w) {
        if (w->lease) requeue_worker(c, w, "the worker said hello again (restarted)");
        event(c, "rejoin", "{\"worker\": \"%s\", \"role\": \"%s\"}", name, role);
    } else {
        if (c->nw == MAX_WORKERS) {
            send_error(c, from, id, "too many workers (%d)", MAX_WORKERS);
            return;
        }
        w = &c->w[c->nw++];
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "%s", name);
        logf_("%s joined (%s)", name, role);
        event(c, "join", "{\"worker\": \"%s\", \"role\": \"%s\"}", name, role);
    }
    snprintf(w->role, sizeof w->role, "%s", role);
    w->peer = *from;
    w->seen = prl_now();
    w->lease = 0, w->holds = 0;
    send_welcome(c, w);
}

/* A heartbeat comes from the worker's heartbeat socket, which reads nothing: an unknown
** name is only logged. */
static void on_heartbeat(ctl *c, const prl_bus_msg *m, uint64_t id)
{
    const char *name = NULL;
    prl_bus_msg_get_str(m, "worker", &name);
    worker *w = name ? worker_by_name(c, name) : NULL;
    if (w && w->peer.len) {
        w->seen = prl_now();
        return;
    }
    logf_("rejected message %llu: heartbeat from unknown worker '%s'", (unsigned long long)id,
          name ? name : "?");
    /* A worker this controller does not know (it restarted, or forgot a silent worker) is
    ** idle and only heart-beating: ask its main socket, whose identity is its name, to say
    ** hello again. Nobody by that name connected: nothing is sent. */
    size_t k = name ? strlen(name) : 0;
    if (k == 0 || k > sizeof ((prl_bus_peer *)0)->id) return;
    prl_bus_peer to = {.len = k};
    memcpy(to.id, name, k);
    prl_bus_msg e;
    if (prl_bus_msg_init(&e, "error", c->job->name, ++c->next_id)) return;
    prl_bus_msg_set_str(&e, "reason", "unknown worker: say hello first");
    prl_bus_msg_set_uint(&e, "ref", id);
    if (prl_bus_send(c->sock, &to, &e) == PRL_OK) logf_("asked '%s' to say hello again", name);
    prl_bus_msg_free(&e);
}

/* A result frame of the expected dtype and count, or NULL. */
static const prl_bus_frame *frame_of(const prl_bus_msg *m, const char *name, prl_bus_dtype dt,
                                     size_t count, int exact)
{
    const prl_bus_frame *f = prl_bus_msg_frame(m, name);
    if (!f || f->dtype != dt || (exact && f->count != count)) return NULL;
    return f;
}

/* Refuse the content of a result whose lease the sender really holds: the work goes back to
** the queue (a worker that sent garbage once may do it right, or another worker will),
** instead of the step waiting forever on a lease nobody will finish. */
#define REJECT_HELD(c, w, l, id, ...)                                         \
    do {                                                                     \
        send_error(c, &(w)->peer, id, __VA_ARGS__);                          \
        lease_requeue(c, l, "its result was rejected");                      \
    } while (0)

static void on_result(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    int bad = 0;
    uint64_t lid = field_u(m, "lease", &bad), step = field_u(m, "step", &bad);
    uint64_t prompt = field_u(m, "prompt", &bad), sample = field_u(m, "sample", &bad);
    uint64_t ver = field_u(m, "policy_version", &bad), plen = field_u(m, "prompt_len", &bad);
    uint64_t gen_us = 0, stop = 0;
    prl_bus_msg_get_uint(m, "gen_us", &gen_us);
    prl_bus_msg_get_uint(m, "stop", &stop);
    if (bad) {
        send_error(c, &w->peer, id, "result needs lease, step, prompt, sample, policy_version and prompt_len");
        return;
    }
    step_run *r;
    int gi;
    group *g = find_group(c, step, prompt, &r, &gi);
    if (!g || sample >= (uint64_t)c->G) {
        send_error(c, &w->peer, id, "result for step %llu prompt %llu sample %llu: no such work in flight",
                   (unsigned long long)step, (unsigned long long)prompt, (unsigned long long)sample);
        return;
    }
    lease *l = lease_find(c, lid);
    if (!l || l->kind != LEASE_ROLLOUT || l->step != r->step || l->group != gi || &c->w[l->worker] != w) {
        send_error(c, &w->peer, id, "result: lease %llu is not %s's rollout lease of step %llu prompt %llu",
                   (unsigned long long)lid, w->name, (unsigned long long)step, (unsigned long long)prompt);
        return;
    }
    const prl_bus_frame *tok = prl_bus_msg_frame(m, "tokens");
    if (plen < 1 || plen >= tok->count || tok->count > (1u << 20)) {
        REJECT_HELD(c, w, l, id, "result: prompt_len %llu must be in [1, %zu)", (unsigned long long)plen, tok->count);
        return;
    }
    size_t nr = tok->count - plen;
    const prl_bus_frame *lp = frame_of(m, "logprobs", PRL_BUS_F32, nr, 1);
    const prl_bus_frame *mk = frame_of(m, "mask", PRL_BUS_U8, nr, 1);
    const prl_bus_frame *rt = prl_bus_msg_frame(m, "routes");
    char *meta = prl_bus_msg_text(m, "meta");
    json_error_t je;
    json_t *mj = meta ? json_loads(meta, 0, &je) : NULL;
    json_t *turns = json_object_get(mj, "turns");
    if (!lp || !mk || !json_is_array(turns) || ver > (uint64_t)c->version) {
        REJECT_HELD(c, w, l, id, "result: %s", !lp ? "frame 'logprobs' must hold one f32 per response token"
                   : !mk ? "frame 'mask' must hold one u8 per response token"
                   : !json_is_array(turns) ? "frame 'meta' must be JSON with a \"turns\" array"
                   : "policy_version is newer than any committed version");
        free(meta), json_decref(mj);
        return;
    }
    int32_t *ids = tok->data;
    for (size_t i = 0; i < tok->count; i++) {
        if (ids[i] < 0) {
            REJECT_HELD(c, w, l, id, "result: token %zu has the negative id %d", i, (int)ids[i]);
            free(meta), json_decref(mj);
            return;
        }
    }
    const float *lv = lp->data;
    const uint8_t *mv = mk->data;
    for (size_t i = 0; i < nr; i++) {
        if (!isfinite(lv[i]) || lv[i] > 0 || mv[i] > 1) {
            REJECT_HELD(c, w, l, id, "result: response token %zu has log-prob %g and mask %u", i,
                       (double)lv[i], mv[i]);
            free(meta), json_decref(mj);
            return;
        }
    }
    slot *s = &g->s[sample];
    if (s->state) { /* a repeat (re-leased work): idempotent */
        if (s->n != (int)tok->count || memcmp(s->tokens, ids, tok->count * sizeof *ids))
            event(c, "mismatch", "{\"step\": %llu, \"prompt\": \"%s\", \"sample\": %llu, \"why\": "
                  "\"a repeated result differs from the first; the first is kept\"}",
                  (unsigned long long)step, c->task_id[g->prompt], (unsigned long long)sample);
    } else {
        s->tokens = malloc(tok->bytes), s->logprobs = malloc(nr * sizeof(float) + 1);
        s->mask = malloc(nr + 1);
        s->turns = json_dumps(turns, JSON_COMPACT);
        if (rt && rt->dtype == PRL_BUS_U8 && rt->bytes) {
            s->routes = malloc(rt->bytes);
            if (s->routes) memcpy(s->routes, rt->data, rt->bytes), s->routes_bytes = rt->bytes;
            json_t *shape = json_object_get(mj, "route_shape");
            for (int k = 0; k < 4; k++) s->route_shape[k] = (int)json_integer_value(json_array_get(shape, (size_t)k));
            if (!routes_shape_ok(s->route_shape, s->routes_bytes, tok->count)) {
                /* stored and trained alike: without routes (the trainer routes natively) */
                logf_("result: routes of shape [%d][%d][%d] x %d do not match their %zu bytes "
                      "and %zu tokens: dropped", s->route_shape[0], s->route_shape[1],
                      s->route_shape[2], s->route_shape[3], s->routes_bytes, tok->count);
                free(s->routes), s->routes = NULL, s->routes_bytes = 0;
                memset(s->route_shape, 0, sizeof s->route_shape);
            }
        }
        if (!s->tokens || !s->logprobs || !s->mask || !s->turns) {
            logf_("out of memory for a result");
            slot_free(s);
        } else {
            memcpy(s->tokens, ids, tok->bytes);
            memcpy(s->logprobs, lv, nr * sizeof(float));
            memcpy(s->mask, mv, nr);
            s->n = (int)tok->count, s->prompt_len = (int)plen, s->version = (int64_t)ver;
            s->gen_s = 1e-6 * (double)gen_us, s->stop = (int)stop, s->state = 1;
            s->truncated = json_is_true(json_object_get(mj, "truncated"));
            snprintf(s->worker, sizeof s->worker, "%s", w->name);
            g->generated++;
            r->gen_tokens += (double)nr;
            if (g->generated == c->G) {
                r->gen_seconds += s->gen_s;
                int done = 1;
                for (int i = 0; i < r->n; i++) done &= r->g[i].generated == c->G;
                if (done) r->t_rolled = prl_now();
            }
        }
    }
    free(meta), json_decref(mj);
    if (g->generated == c->G && g->lease) {
        lease *l = lease_find(c, g->lease);
        g->lease = 0;
        if (l) lease_end(c, l->id);
    }
}

/* Write a scored sample to run.db (idempotent by its key). */
static prl_status store_sample(ctl *c, step_run *r, group *g, int j)
{
    slot *s = &g->s[j];
    int nr = s->n - s->prompt_len;
    prl_store_sample x = {
        .run = c->run, .step = r->step, .prompt_id = c->task_id[g->prompt], .sample_index = j,
        .tokens = s->tokens, .n_tokens = s->n, .prompt_len = s->prompt_len,
        .logprobs = s->logprobs, .loss_mask = s->mask, .version = s->version,
        .worker = s->worker, .reward = s->reward, .reward_detail = s->detail, .flags = s->flags,
        .stop = s->stop, .gen_seconds = s->gen_s, .reward_seconds = s->score_s,
        .status = sample_fresh(c, r, s) ? PRL_STORE_SAMPLE_OK : PRL_STORE_SAMPLE_STALE};
    if (s->routes && s->route_shape[0] > 0) {
        x.routes = s->routes, x.route_tokens = s->route_shape[0], x.route_moe = s->route_shape[1];
        x.route_k = s->route_shape[2], x.route_width = s->route_shape[3];
    }
    (void)nr;
    int already = 0;
    prl_status rc = prl_store_sample_put(c->db, &x, &already);
    if (rc && x.routes) { /* routes of a bad shape must not lose the sample */
        logf_("sample stored without routes: %s", prl_error_message());
        x.routes = NULL, x.route_tokens = x.route_moe = x.route_k = x.route_width = 0;
        rc = prl_store_sample_put(c->db, &x, &already);
    }
    return rc;
}

/* A sample that could not be scored: reward 0, the reason in its detail, EXEC_ERROR. */
static prl_status store_failed_score(ctl *c, step_run *r, group *g, int j, const char *why)
{
    slot *s = &g->s[j];
    json_t *d = json_pack("{s:f,s:f,s:i,s:s,s:[]}", "score", 0.0, "penalty", 0.0, "flags",
                          (int)PRL_REWARD_EXEC_ERROR, "error", why, "checks");
    free(s->detail);
    s->detail = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(d);
    if (!s->detail) return prl_error_set(PRL_ERR_NOMEM, "score detail");
    s->reward = 0, s->flags = PRL_REWARD_EXEC_ERROR, s->state = 2;
    prl_status rc = store_sample(c, r, g, j);
    if (rc) return rc;
    if (++g->scored == c->G) judge_group(c, r, g);
    if (step_rolled(c, r) && !r->t_scored) r->t_scored = prl_now();
    return PRL_OK;
}

static void on_scored(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    int bad = 0;
    uint64_t step = field_u(m, "step", &bad), prompt = field_u(m, "prompt", &bad);
    uint64_t sample = field_u(m, "sample", &bad), us = field_u(m, "score_us", &bad);
    uint64_t lid = field_u(m, "lease", &bad);
    step_run *r;
    int gi;
    group *g = bad ? NULL : find_group(c, step, prompt, &r, &gi);
    if (!g || sample >= (uint64_t)c->G || g->s[sample].state != 1) {
        send_error(c, &w->peer, id, "scored: step %llu prompt %llu sample %llu is not waiting for a score",
                   (unsigned long long)step, (unsigned long long)prompt, (unsigned long long)sample);
        return;
    }
    slot *s = &g->s[sample];
    lease *l = lease_find(c, lid);
    if (!l || s->score_lease != lid || &c->w[l->worker] != w) {
        send_error(c, &w->peer, id, "scored: lease %llu is not %s's score lease of step %llu prompt %llu "
                   "sample %llu", (unsigned long long)lid, w->name, (unsigned long long)step,
                   (unsigned long long)prompt, (unsigned long long)sample);
        return;
    }
    lease_end(c, lid); /* answered: a bad detail below is scored again */
    s->score_lease = 0;
    char *detail = prl_bus_msg_text(m, "detail");
    json_error_t je;
    json_t *dj = detail ? json_loads(detail, 0, &je) : NULL;
    json_t *score = json_object_get(dj, "score");
    double v = json_number_value(score);
    if (!json_is_number(score) || !isfinite(v) || v < 0 || v > 1) {
        send_error(c, &w->peer, id, "scored: frame 'detail' must be JSON with a \"score\" in [0, 1]");
        free(detail), json_decref(dj);
        return;
    }
    s->reward = v;
    s->flags = (unsigned)json_integer_value(json_object_get(dj, "flags"));
    s->detail = detail;
    s->score_s = 1e-6 * (double)us;
    s->state = 2;
    json_decref(dj);
    r->score_seconds += s->score_s;
    c->fatal = store_sample(c, r, g, (int)sample);
    if (c->fatal) return;
    g->scored++;
    if (g->scored == c->G) judge_group(c, r, g);
    if (step_rolled(c, r) && !r->t_scored) r->t_scored = prl_now();
}

/* ---------------------------------------------------------------- trained ---------- */

static void remove_checkpoint(const char *dir)
{
    static const char *files[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                                  "state.json", "tokenizer.json"};
    char p[1200];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    if (rmdir(dir) && errno != ENOENT) logf_("could not remove %s: %s", dir, strerror(errno));
}

/* Keep version 0, the newest lag+2 versions and every checkpoint.every-th one. */
static void prune_checkpoints(ctl *c)
{
    int64_t v = c->version - c->lag - 2;
    if (v < 1) return;
    int every = c->job->checkpoint_every;
    if (every > 0 && v % every == 0) return;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/ckpt/v%06lld", c->o->run_dir, (long long)v);
    remove_checkpoint(dir);
}

/* With opd.revisit: how many of the step's groups were revisits and the mean teacher KL they
** were drawn with, against the mean over every prompt with a KL before the step (-1: none). */
static void revisit_metrics(const ctl *c, const step_run *r, char *out, size_t n)
{
    int nr = 0, np = 0;
    double kr = 0, kp = 0;
    for (int i = 0; i < r->n; i++)
        if (r->g[i].revisit) nr++, kr += c->teacher_kl[r->g[i].prompt];
    for (int p = 0; p < c->n_tasks; p++)
        if (c->teacher_kl[p] >= 0) np++, kp += c->teacher_kl[p];
    snprintf(out, n, "\"revisits\": %d, \"revisit_kl\": %.6f, \"prompts_kl\": %.6f, ", nr,
             nr ? kr / nr : -1.0, np ? kp / np : -1.0);
}

static void step_metrics(ctl *c, step_run *r, const char *trainer_metrics, double train_s, char *out,
                         size_t n, prl_store_step *st)
{
    int samples = 0, solved = 0, stale = 0;
    double rsum = 0, tok = 0, trunc = 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < c->G; j++) {
            const slot *s = &r->g[i].s[j];
            samples++, rsum += s->reward, solved += s->reward >= 1.0;
            tok += s->n - s->prompt_len, trunc += s->stop != 0;
            stale += !sample_fresh(c, r, s);
        }
    double now = prl_now();
    double rollout_s = (r->t_rolled ? r->t_rolled : now) - r->t_open;
    double score_s = r->t_scored && r->t_rolled ? r->t_scored - r->t_rolled : 0;
    /* open → first rollout lease: in async mode the rollout workers may still be busy with
    ** the previous step; rollout_s − rollout_wait_s is the time the step's rollout took */
    double wait_s = r->t_leased && r->t_leased < now ? r->t_leased - r->t_open : 0;
    double step_s = now - r->t_open;
    /* the pace of the run: time since the previous step was committed (in async mode steps
    ** overlap, so this is less than step_s) */
    double interval_s = now - (c->t_last_commit ? c->t_last_commit : c->t_start);
    c->t_last_commit = now;
    char teachers[2400] = "", tm[2048], rv[128] = "";
    if (c->job->opd_enabled) { /* OPD: the teacher stage (last score → last teacher answer) */
        teach_metrics(c, r, tm, sizeof tm);
        snprintf(teachers, sizeof teachers, "\"teach_s\": %.3f, \"teachers\": %s, ",
                 r->t_taught && r->t_scored ? r->t_taught - r->t_scored : 0, tm);
    }
    if (revisit_count(c)) revisit_metrics(c, r, rv, sizeof rv);
    *st = (prl_store_step){.run = c->run, .step = r->step,
                           .reward_mean = samples ? rsum / samples : 0,
                           .accuracy = samples ? (double)solved / samples : 0,
                           .tokens_per_s = rollout_s > 0 ? tok / rollout_s : 0,
                           .step_seconds = step_s};
    snprintf(out, n,
             "{\"samples\": %d, \"groups\": %d, \"groups_kept\": %d, \"groups_dropped\": %d, "
             "\"stale\": %d, \"reward_mean\": %.6f, \"accuracy\": %.6f, \"response_tokens\": %.0f, "
             "\"truncated_share\": %.4f, \"rollout_s\": %.3f, \"rollout_wait_s\": %.3f, "
             "\"score_tail_s\": %.3f, \"train_s\": %.3f, "
             "\"step_s\": %.3f, \"interval_s\": %.3f, \"reward_busy_s\": %.3f, \"tokens_per_s\": %.1f, "
             "\"cursor_end\": %lld, \"version\": %lld, %s%s\"trainer\": %s}",
             samples, r->n, r->accepted, r->dropped, stale, st->reward_mean, st->accuracy, tok,
             samples ? trunc / samples : 0, rollout_s, wait_s, score_s, train_s, step_s, interval_s,
             r->score_seconds, st->tokens_per_s,
             (long long)c->cursor, (long long)c->version, teachers, rv, trainer_metrics);
}

static void progress_line(ctl *c, const prl_store_step *st, const char *metrics, step_run *r)
{
    json_error_t je;
    json_t *mj = json_loads(metrics, 0, &je);
    double roll = json_number_value(json_object_get(mj, "rollout_s"));
    double tail = json_number_value(json_object_get(mj, "score_tail_s"));
    double train = json_number_value(json_object_get(mj, "train_s"));
    double interval = json_number_value(json_object_get(mj, "interval_s"));
    int stale = (int)json_integer_value(json_object_get(mj, "stale"));
    /* loss scaling (fp16 training): the scale and the skipped updates, when a scaler ran */
    json_t *tr = json_object_get(mj, "trainer"), *ls = json_object_get(tr, "loss_scale");
    char scale[96] = "";
    if (json_is_number(ls))
        snprintf(scale, sizeof scale, " | scale %g  skipped %lld (%lld total)", json_number_value(ls),
                 (long long)json_integer_value(json_object_get(tr, "skipped")),
                 (long long)json_integer_value(json_object_get(tr, "skipped_total")));
    json_t *kl = json_object_get(json_object_get(mj, "trainer"), "opd_teacher_kl");
    char opd[48] = ""; /* OPD: the reverse KL student→teacher of the step's tokens */
    if (json_is_number(kl)) snprintf(opd, sizeof opd, " | KL %.4f", json_number_value(kl));
    json_decref(mj);
    c->interval_sum += interval, c->intervals++;
    if (!c->o->progress) return;
    char el[32], eta[32];
    prl_format_duration(el, sizeof el, prl_now() - c->t_start);
    prl_format_duration(eta, sizeof eta, (c->job->steps - c->version) * c->interval_sum / c->intervals);
    fprintf(c->o->progress,
            "step %lld/%d  v%lld | reward %.3f  acc %5.1f%% | %6.0f tok/s | rollout %.1fs  score %.1fs  "
            "train %.1fs | step %.1fs | stale %d  dropped %d%s%s | %s, eta %s\n",
            (long long)r->step + 1, c->job->steps, (long long)c->version, st->reward_mean,
            100 * st->accuracy, st->tokens_per_s, roll, tail, train, interval, stale, r->dropped,
            scale, opd, el, eta);
    fflush(c->o->progress);
}

/* With opd.revisit: each taught group's teacher KL, in run.db (inside the step's transaction,
** so a resumed run draws from what the committed steps recorded) and in memory. */
static prl_status record_teacher_kls(ctl *c, const step_run *r)
{
    if (!revisit_count(c)) return PRL_OK;
    prl_status rc = PRL_OK;
    for (int i = 0; i < r->n && !rc; i++) {
        double kl = group_teacher_kl(c, r, &r->g[i]);
        if (kl < 0) continue;
        rc = prl_store_prompt_set_teacher_kl(c->db, c->run, c->task_id[r->g[i].prompt], kl);
        if (!rc) c->teacher_kl[r->g[i].prompt] = kl;
    }
    return rc;
}

/* Close step r: version v+1 (at `path`) and the step's metrics go to run.db in one
** transaction, then the step leaves memory. A run.db failure is fatal: the controller exits
** and its restart continues from what run.db holds. */
static prl_status step_commit(ctl *c, step_run *r, const char *path, uint64_t sum,
                              const char *trainer_metrics, double train_s)
{
    char sumhex[17], vpath[1024];
    snprintf(sumhex, sizeof sumhex, "%016llx", (unsigned long long)sum);
    snprintf(vpath, sizeof vpath, "%s", path);
    prl_store_version v = {.run = c->run, .version = c->version + 1, .path = vpath,
                           .checksum = sumhex, .step = r->step};
    size_t cap = 8192 + strlen(trainer_metrics);
    char *text = malloc(cap);
    if (!text) return prl_error_set(PRL_ERR_NOMEM, "step metrics");
    c->version++;
    snprintf(c->version_path, sizeof c->version_path, "%s", vpath);
    prl_store_step st;
    step_metrics(c, r, trainer_metrics, train_s, text, cap, &st);
    st.metrics = text;
    prl_status rc = prl_store_begin(c->db);
    if (!rc) {
        rc = prl_store_version_add(c->db, &v);
        if (!rc) rc = prl_store_step_put(c->db, &st);
        if (!rc) rc = record_teacher_kls(c, r);
        rc = rc ? (prl_store_rollback(c->db), rc) : prl_store_commit(c->db);
    }
    if (rc) rc = prl_error_wrap(rc, "run.db: recording step %lld: ", (long long)r->step);
    else progress_line(c, &st, text, r);
    free(text);
    step_free(c, r);
    prune_checkpoints(c);
    if (c->version >= c->job->steps) c->done = 1;
    return rc;
}

/* The trainer flagged a collapsed router (route_entropy_alarm, docs/replay.md): an event in
** run.db with the per-layer routing entropies. */
static void routing_alarm(ctl *c, int64_t step, json_t *metrics)
{
    if (json_integer_value(json_object_get(metrics, "route_entropy_alarm")) != 1) return;
    char *h = json_dumps(json_object_get(metrics, "route_entropy"), JSON_COMPACT);
    event(c, "routing_collapse", "{\"step\": %lld, \"route_entropy\": %s, \"alarm_fraction\": %g}",
          (long long)step, h ? h : "null", c->job->replay_entropy_alarm);
    free(h);
}

/* A teacher answered its `teach` item (docs/opd.md): the log-probs go to the samples. */
typedef struct teach_take {
    const float *lp;
    const int32_t *ids;   /* with opd.topk K: the top-k frames (else NULL) */
    const float *klp;
    int K;
    size_t at;
    int bad;
} teach_take;

static void take_one(void *u, slot *s)
{
    teach_take *t = u;
    size_t nr = (size_t)(s->n - s->prompt_len), cells = (nr ? nr : 1) * (size_t)t->K;
    free(s->teacher_lp), free(s->topk_ids), free(s->topk_lp);
    s->topk_ids = NULL, s->topk_lp = NULL;
    s->teacher_lp = malloc((nr ? nr : 1) * sizeof *s->teacher_lp);
    if (t->K) s->topk_ids = malloc(cells * sizeof *s->topk_ids), s->topk_lp = malloc(cells * sizeof *s->topk_lp);
    if (!s->teacher_lp || (t->K && (!s->topk_ids || !s->topk_lp))) {
        t->bad = 1;
        return;
    }
    memcpy(s->teacher_lp, t->lp + t->at, nr * sizeof *s->teacher_lp);
    if (t->K) {
        memcpy(s->topk_ids, t->ids + t->at * t->K, nr * t->K * sizeof *s->topk_ids);
        memcpy(s->topk_lp, t->klp + t->at * t->K, nr * t->K * sizeof *s->topk_lp);
    }
    t->at += nr;
}

static int bad_lp(float lp) { return !(isfinite(lp) && lp <= 0); }

/* The teacher log-probs of the loss tokens: finite and <= 0, and with the top-k (K > 0) its
** ids >= 0 and log-probs finite and <= 0 there, ids -1 elsewhere (the trainer's rules,
** opd/batch.c); the flat index of the first bad token, -1 when all are good. */
static long first_bad_teacher_lp(const ctl *c, const step_run *r, int k, const teach_take *t)
{
    size_t at = 0;
    for (int i = 0; i < r->n; i++)
        for (int j = 0; r->g[i].verdict == 1 && r->g[i].teacher == k && j < c->G; j++) {
            const slot *s = &r->g[i].s[j];
            if (!sample_fresh(c, r, s)) continue;
            for (int x = 0; x < s->n - s->prompt_len; x++, at++) {
                if (s->mask[x] && bad_lp(t->lp[at])) return (long)at;
                for (int q = 0; q < t->K; q++) {
                    int32_t id = t->ids[at * t->K + q];
                    if (s->mask[x] ? id < 0 || bad_lp(t->klp[at * t->K + q]) : id != -1)
                        return (long)at;
                }
            }
        }
    return -1;
}

static void on_taught(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    int bad = 0;
    uint64_t lid = field_u(m, "lease", &bad), step = field_u(m, "step", &bad);
    uint64_t load_us = field_u(m, "load_us", &bad), teach_us = field_u(m, "teach_us", &bad);
    uint64_t rss = field_u(m, "peak_rss_kb", &bad), loaded = field_u(m, "loaded", &bad);
    const char *key = NULL;
    bad |= prl_bus_msg_get_str(m, "teacher", &key) != PRL_OK;
    int k = bad ? -1 : prl_opd_teacher_index(key);
    step_run *r = k < 0 ? NULL : step_find(c, (int64_t)step);
    lease *l = r && r->teach_lease[k] == lid ? lease_find(c, lid) : NULL;
    if (!l || l->kind != LEASE_TEACH || &c->w[l->worker] != w) {
        send_error(c, &w->peer, id, "taught: lease %llu (step %llu, teacher %s) is not %s's teach "
                   "lease in flight", (unsigned long long)lid, (unsigned long long)step,
                   key ? key : "?", w->name);
        return;
    }
    size_t n[2] = {0, 0};
    teacher_samples(c, r, k, count_one, n);
    int K = c->job->opd_topk;
    const prl_bus_frame *lp = frame_of(m, "logprobs", PRL_BUS_F32, n[1], 1);
    const prl_bus_frame *ki = K ? frame_of(m, "topk_ids", PRL_BUS_I32, n[1] * K, 1) : NULL;
    const prl_bus_frame *kl = K ? frame_of(m, "topk_logprobs", PRL_BUS_F32, n[1] * K, 1) : NULL;
    int frames = lp && (!K || (ki && kl));
    teach_take t = {.lp = lp ? lp->data : NULL, .K = K, .ids = ki ? ki->data : NULL,
                    .klp = kl ? kl->data : NULL};
    long badi = frames ? first_bad_teacher_lp(c, r, k, &t) : -1;
    if (!frames) {
        REJECT_HELD(c, w, l, id, "taught: frames 'logprobs' (and with opd.topk %d 'topk_ids', "
                    "'topk_logprobs') must hold one f32 (%d i32, %d f32) per response token of "
                    "the item", K, K, K);
        return;
    }
    if (badi >= 0) {
        REJECT_HELD(c, w, l, id, "taught: response token %ld of the item: a log-prob is not "
                    "finite and <= 0, or a top-k id is < 0 on a loss token or not -1 off them", badi);
        return;
    }
    teacher_samples(c, r, k, take_one, &t);
    if (t.bad) {
        logf_("out of memory for teacher log-probs");
        lease_requeue(c, l, "out of memory");
        return;
    }
    r->taught[k] = 1;
    r->teach_loads[k] += (int)(loaded != 0);
    r->teach_load_s[k] += 1e-6 * (double)load_us, r->teach_s[k] += 1e-6 * (double)teach_us;
    r->teach_rss_kb[k] = rss;
    r->proc_rss_kb[w - c->w] = rss;
    lease_end(c, lid);
    r->teach_lease[k] = 0;
}

static void on_trained(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    int bad = 0;
    uint64_t step = field_u(m, "step", &bad), ver = field_u(m, "version", &bad);
    uint64_t sum = 0, us = field_u(m, "train_us", &bad), lid = field_u(m, "lease", &bad);
    const char *path = NULL;
    bad |= prl_bus_msg_get_hex64(m, "ckpt_checksum", &sum) != PRL_OK;
    bad |= prl_bus_msg_get_str(m, "path", &path) != PRL_OK;
    step_run *r = bad ? NULL : step_find(c, (int64_t)step);
    lease *l = r && r->train_lease == lid ? lease_find(c, lid) : NULL;
    if (!r || (int64_t)step != c->version || (int64_t)ver != c->version + 1 || !l || &c->w[l->worker] != w) {
        send_error(c, &w->peer, id, "trained: step %llu version %llu lease %llu is not the training in "
                   "flight (step %lld at version %lld, lease %llu)", (unsigned long long)step,
                   (unsigned long long)ver, (unsigned long long)lid, (long long)c->version,
                   (long long)c->version, (unsigned long long)(r ? r->train_lease : 0));
        return;
    }
    char *metrics = prl_bus_msg_text(m, "metrics");
    json_error_t je;
    json_t *mj = metrics ? json_loads(metrics, 0, &je) : NULL;
    struct stat sb;
    if (!json_is_object(mj) || stat(path, &sb) || !S_ISDIR(sb.st_mode)) {
        REJECT_HELD(c, w, l, id, "trained: %s", !json_is_object(mj) ? "frame 'metrics' must be a JSON object"
                    : "path is not a checkpoint directory");
        free(metrics), json_decref(mj);
        return;
    }
    routing_alarm(c, (int64_t)step, mj);
    json_decref(mj);
    if (r->train_lease) lease_end(c, r->train_lease);
    r->train_lease = 0;
    c->fatal = step_commit(c, r, path, sum, metrics, 1e-6 * (double)us);
    free(metrics);
}

/* ---------------------------------------------------------------- loop ------------- */

static void dispatch(ctl *c, prl_bus_msg *m, const prl_bus_peer *from)
{
    uint64_t id = 0;
    prl_bus_msg_get_uint(m, "id", &id);
    const char *run = NULL;
    prl_bus_msg_get_str(m, "run", &run);
    if (!strcmp(m->type, "hello")) {
        on_hello(c, m, from, id);
        return;
    }
    if (!strcmp(m->type, "heartbeat")) {
        on_heartbeat(c, m, id);
        return;
    }
    worker *w = worker_by_peer(c, from);
    if (!w) {
        send_error(c, from, id, "unknown worker: say hello first");
        return;
    }
    w->seen = prl_now();
    if (!run || strcmp(run, c->job->name)) {
        send_error(c, from, id, "message for run '%s', this is run '%s'", run ? run : "?", c->job->name);
        return;
    }
    if (!strcmp(m->type, "result") && !strcmp(w->role, "rollout")) on_result(c, w, m, id);
    else if (!strcmp(m->type, "scored") && !strcmp(w->role, "reward")) on_scored(c, w, m, id);
    else if (!strcmp(m->type, "trained") && !strcmp(w->role, "trainer")) on_trained(c, w, m, id);
    else if (!strcmp(m->type, "taught") && !strcmp(w->role, "teacher")) on_taught(c, w, m, id);
    else if (!strcmp(m->type, "error")) {
        const char *why = NULL;
        uint64_t lid = 0;
        prl_bus_msg_get_str(m, "reason", &why);
        logf_("%s reports: %s", w->name, why ? why : "?");
        lease *l = prl_bus_msg_get_uint(m, "lease", &lid) ? NULL : lease_find(c, lid);
        if (l && &c->w[l->worker] == w && w->lease == lid) { /* only the holder gives it back */
            char reason[300];
            snprintf(reason, sizeof reason, "%s reported: %s", w->name, why ? why : "?");
            lease_failed(c, l, reason);
        }
    } else if (strcmp(m->type, "ack")) {
        send_error(c, from, id, "a %s does not send '%s' messages", w->role, m->type);
    }
}

/* Leases of workers silent for longer than lease_seconds go back to the queue. */
static void expire(ctl *c)
{
    double now = prl_now();
    for (int i = 0; i < c->nw; i++) {
        worker *w = &c->w[i];
        if (!w->peer.len || now - w->seen <= c->job->lease_seconds) continue;
        if (w->lease) requeue_worker(c, w, "no heartbeat within controller.lease_seconds");
        logf_("%s is silent: forgotten until it says hello again", w->name);
        event(c, "lost", "{\"worker\": \"%s\"}", w->name);
        w->peer.len = 0;
    }
}

/* Keys a newer prl added since the run was recorded are absent from its config; at their
** defaults they do what the older prl did (every new key's default keeps the old behaviour),
** so they are dropped from `now` before the two configs are compared. A new key set to
** anything else still makes the configs differ. */
static void drop_added_defaults_in(json_t *then, json_t *now, json_t *def)
{
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(now, tmp, k, v) {
        json_t *t = json_object_get(then, k), *d = json_object_get(def, k);
        if (!t && d && json_equal(v, d)) json_object_del(now, k);
        else if (json_is_object(t) && json_is_object(v) && json_is_object(d))
            drop_added_defaults_in(t, v, d);
    }
}

static void drop_added_defaults(json_t *then, json_t *now)
{
    prl_job_config d;
    char *text = prl_job_config_default(&d) ? NULL : prl_job_config_to_json(&d);
    json_error_t je;
    json_t *def = text ? json_loads(text, 0, &je) : NULL;
    if (def) drop_added_defaults_in(then, now, def);
    json_decref(def), free(text);
    prl_job_config_free(&d);
}

static prl_status open_run(ctl *c)
{
    prl_store_run existing;
    prl_status rc = prl_store_run_get(c->db, c->job->name, &existing);
    if (rc == PRL_ERR_RANGE) {
        if ((rc = prl_store_run_create(c->db, c->job->name, c->config_json, c->job->seed, &c->run)))
            return rc;
        prl_store_version v0 = {.run = c->run, .version = 0, .path = c->job->init,
                                .checksum = "0000000000000000", .step = -1};
        return prl_store_version_add(c->db, &v0);
    }
    if (rc) return rc;
    c->run = existing.id;
    /* a resumed run continues the recorded config; only the step count may grow, and the
    ** thread counts may change (results do not depend on them) */
    json_error_t je;
    json_t *a = json_loads(existing.config, 0, &je), *b = json_loads(c->config_json, 0, &je);
    static const char *free_keys[][2] = {{"controller", "steps"}, {"rollout", "threads"},
                                         {"trainer", "threads"}, {"teacher", "threads"}};
    for (size_t i = 0; i < sizeof free_keys / sizeof free_keys[0]; i++) {
        json_t *ca = json_object_get(a, free_keys[i][0]), *cb = json_object_get(b, free_keys[i][0]);
        json_object_del(ca, free_keys[i][1]), json_object_del(cb, free_keys[i][1]);
        if (ca && !json_object_size(ca)) json_object_del(a, free_keys[i][0]);
        if (cb && !json_object_size(cb)) json_object_del(b, free_keys[i][0]);
    }
    if (a && b) drop_added_defaults(a, b);
    int same = a && b && json_equal(a, b);
    json_decref(a), json_decref(b);
    prl_store_run_free(&existing);
    if (!same)
        return prl_error_set(PRL_ERR_CONFIG, "run '%s' in run.db was started with another config "
                             "(only controller.steps and the thread counts may change on --resume)", c->job->name);
    prl_store_run_set_status(c->db, c->run, "running");
    return PRL_OK;
}

static prl_status restore(ctl *c)
{
    prl_store_version v;
    prl_status rc = prl_store_version_latest(c->db, c->run, &v);
    if (rc) return rc;
    c->version = v.version;
    snprintf(c->version_path, sizeof c->version_path, "%s", v.path);
    prl_store_version_free(&v);
    int64_t last = -1;
    if ((rc = prl_store_step_last(c->db, c->run, &last))) return rc;
    c->next_step = last + 1;
    c->retired_epoch = -1;
    if (last >= 0) {
        char *mt = NULL;
        if ((rc = prl_store_step_metrics(c->db, c->run, last, &mt))) return rc;
        json_error_t je;
        json_t *mj = json_loads(mt, 0, &je);
        c->cursor = json_integer_value(json_object_get(mj, "cursor_end"));
        json_decref(mj);
        free(mt);
        logf_("resuming at step %lld, version %lld", (long long)c->next_step, (long long)c->version);
        event(c, "resume", "{\"step\": %lld, \"version\": %lld}", (long long)c->next_step,
              (long long)c->version);
    }
    if (c->version != c->next_step)
        return prl_error_set(PRL_ERR_FORMAT, "run.db: version %lld after %lld steps (each step makes one)",
                             (long long)c->version, (long long)c->next_step);
    return PRL_OK;
}

static void finish(ctl *c, const char *why)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].peer.len) send_stop(c, &c->w[i], why);
}

static void cleanup(ctl *c)
{
    for (int i = 0; i < MAX_INFLIGHT; i++)
        if (c->st[i].active) step_free(c, &c->st[i]);
    for (int i = 0; i < c->n_tasks; i++) json_decref(c->task[i]), free(c->task_text[i]);
    free(c->task), free(c->task_text), free(c->task_id), free(c->retired), free(c->teacher_kl);
    free(c->task_teacher), free(c->perm);
    free(c->l), free(c->config_json);
    prl_bus_socket_free(c->sock);
    prl_store_close(c->db);
}

/* Write runs/NAME/final -> the newest version's directory, atomically. */
static void link_final(ctl *c)
{
    char tmp[1200], fin[1200];
    snprintf(tmp, sizeof tmp, "%s/final.tmp", c->o->run_dir);
    snprintf(fin, sizeof fin, "%s/final", c->o->run_dir);
    const char *target = c->version_path;
    size_t rl = strlen(c->o->run_dir);
    if (!strncmp(target, c->o->run_dir, rl) && target[rl] == '/') target += rl + 1;
    unlink(tmp);
    if (symlink(target, tmp) || rename(tmp, fin)) logf_("could not link %s: %s", fin, strerror(errno));
}

prl_status prl_controller_run(const prl_controller_options *o)
{
    ctl c0, *c = &c0;
    memset(c, 0, sizeof *c);
    c->o = o, c->job = o->job, c->G = o->job->group_size, c->B = o->job->batch_prompts;
    c->lag = strcmp(o->job->mode, "async") ? 0 : o->job->max_lag;
    c->t_start = prl_now();
    char db_path[1100], ep[1100];
    snprintf(db_path, sizeof db_path, "%s/run.db", o->run_dir);
    prl_status rc = PRL_OK;
    if (o->endpoint) snprintf(ep, sizeof ep, "%s", o->endpoint);
    else rc = prl_controller_endpoint(o->run_dir, "control.sock", ep, sizeof ep);
    c->config_json = prl_job_config_to_json(o->job);
    if (!rc && !c->config_json) rc = prl_error_set(PRL_ERR_NOMEM, "config");
    if (!rc) rc = prl_store_open(db_path, &c->db);
    if (!rc) rc = open_run(c);
    if (rc == PRL_ERR_CONFIG && o->failed) *o->failed = 1; /* a restart cannot fix the config */
    if (!rc) rc = load_tasks(c);
    if (!rc) rc = restore(c);
    prl_bus_socket_options so;
    prl_bus_socket_options_default(&so);
    so.bind = 1, so.name = "controller", so.send_timeout_ms = 2000;
    if (!rc) rc = prl_bus_socket_open(&c->sock, PRL_BUS_ROUTER, ep, &so);
    if (!rc) logf_("run '%s' at %s: %d train prompts, B=%d G=%d, %s mode (lag %d), step %lld of %d",
                   o->job->name, ep, c->n_tasks, c->B, c->G, o->job->mode, c->lag,
                   (long long)c->next_step, o->job->steps);
    c->done = c->version >= o->job->steps;
    double last_expire = prl_now();
    while (!rc && !c->done && !(o->stop && *o->stop)) {
        prl_bus_msg m;
        prl_bus_peer from;
        int got = 0;
        rc = prl_bus_recv(c->sock, 100, &m, &from, &got);
        if (!rc && got) {
            dispatch(c, &m, &from);
            prl_bus_msg_free(&m);
        }
        if (!rc && prl_now() - last_expire > 0.5) {
            expire(c);
            last_expire = prl_now();
        }
        if (!rc) rc = c->fatal;
        if (!rc) rc = schedule(c);
    }
    if (!rc && c->done) {
        link_final(c);
        prl_store_run_set_status(c->db, c->run, "done");
        event(c, "done", "{\"version\": %lld}", (long long)c->version);
        logf_("run '%s' done: version %lld in %.1f s", o->job->name, (long long)c->version,
              prl_now() - c->t_start);
        finish(c, "the run is done");
    } else if (!rc) {
        prl_store_run_set_status(c->db, c->run, "stopped");
        finish(c, "the controller is stopping");
    } else if (c->failed) { /* a work item kept failing: a restart would fail the same way */
        char why[600];
        snprintf(why, sizeof why, "%s", prl_error_message());
        prl_store_run_set_status(c->db, c->run, "failed");
        json_t *d = json_pack("{s:s}", "why", why);
        char *dt = d ? json_dumps(d, JSON_COMPACT) : NULL;
        if (dt) prl_store_event_add(c->db, c->run, "failed", dt);
        free(dt), json_decref(d);
        finish(c, "the run failed");
        rc = prl_error_set(PRL_ERR_IO, "run '%s' failed: %s", o->job->name, why);
        if (o->failed) *o->failed = 1;
    }
    cleanup(c);
    return rc;
}
