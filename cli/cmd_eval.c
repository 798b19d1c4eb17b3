/*
** cmd_eval.c — `prl eval`: held-out accuracy of a checkpoint per task domain.
**
** For each domain, n problems of the eval split (seeded, so every checkpoint sees the same
** ones) are played with the infer path (rollout/: greedy by default, multi-turn for Agent and
** the Reasoning python tool, programs in the sandbox) and scored by the verifiers. Accuracy is
** the share of episodes with score 1; the mean score counts partial credit. With --mode the
** prompts ask for a thinking or non-thinking answer (docs/tasks.md "Modes") and each row also
** gives the share of episodes answered in the requested form.
*/
#include "cli/cli.h"
#include "roles/roles.h"
#include "rollout/rollout.h"

#include <stdlib.h>
#include <string.h>

typedef struct eval_args {
    const char *ckpt, *compare, *domain, *precision, *dump, *mode;
    prl_tasks_mode modes[2]; /* --mode: the modes evaluated, in order */
    int n_modes;
    FILE *dump_fp; /* --dump: one JSON line per episode (NULL: off) */
    int n, samples, difficulty, max_new, max_turns, threads, json, batch;
    double temperature;
    uint64_t seed;
} eval_args;

typedef struct task_list {
    json_t **items;
    int n, cap;
} task_list;

static prl_status collect(void *user, json_t *line)
{
    task_list *t = user;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        json_t **p = realloc(t->items, (size_t)t->cap * sizeof *p);
        if (!p) return prl_error_set(PRL_ERR_NOMEM, "task list");
        t->items = p;
    }
    t->items[t->n++] = json_incref(line);
    return PRL_OK;
}

typedef struct domain_result {
    prl_task_domain domain;
    prl_tasks_mode mode;
    int n, episodes; /* problems; episodes = n × --samples (the means are over these) */
    int solved, truncated;
    int in_mode;   /* episodes answered in the requested mode's form (in_mode_of) */
    int word_runs; /* General: answers with one word 5+ times in a row (monitor:word_run) */
    double score_sum, turns_sum;
    double seconds;
} domain_result;

/* An episode answered in the requested form: THINK, its first model turn opens with a closed
** think block and no turn has a broken one; NO_THINK, no turn has a think token. */
static int in_mode_of(const prl_episode *ep, prl_tasks_mode mode)
{
    int first = 1;
    for (int i = 0; i < ep->n_msgs; i++) {
        if (strcmp(ep->msgs[i].role, "assistant") != 0) continue;
        prl_tasks_mode form = prl_tasks_mode_of_answer(ep->msgs[i].content);
        if (mode == PRL_MODE_NO_THINK
                ? form != PRL_MODE_NO_THINK
                : form == PRL_MODE_DEFAULT || (first && form != PRL_MODE_THINK))
            return 0;
        first = 0;
    }
    return !first;
}

/* One `--dump` line: the episode's task, its whole conversation (prompt with the mode's
** switch, model turns and observations, as the verifier saw them) and the verifier's result
** (docs/recipes.md). */
static prl_status dump_episode(const eval_args *a, const char *ckpt, const prl_tokenizer *tok,
                               json_t *task, int sample, prl_tasks_mode mode, const prl_episode *ep)
{
    /* `text`: the whole sequence as sampled (its UTF-8 view), special tokens included */
    char *text_all = NULL;
    size_t len = 0;
    prl_status rc = prl_tokenizer_decode(tok, ep->ids, (size_t)ep->n, 0, &text_all, &len);
    if (rc) return rc;
    char *view = NULL;
    long bad = prl_utf8_view(text_all, len, &view, &len);
    free(text_all);
    text_all = view;
    if (bad < 0) return prl_error_set(PRL_ERR_NOMEM, "--dump: episode text");
    json_t *msgs = json_deep_copy(json_object_get(task, "messages"));
    if (msgs && prl_tasks_mode_apply(msgs, mode)) json_decref(msgs), msgs = NULL;
    for (int i = 0; msgs && i < ep->n_msgs; i++)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", ep->msgs[i].role, "content",
                                              ep->msgs[i].content));
    json_t *o = json_pack(
        "{s:s, s:O, s:s, s:O, s:O, s:i, s:f, s:i, s:b, s:o*, s:s%, s:o*}", "ckpt", ckpt, "domain",
        json_object_get(task, "domain"), "mode", prl_tasks_mode_name(mode), "id",
        json_object_get(task, "id"), "difficulty", json_object_get(task, "difficulty"), "sample",
        sample, "score", ep->reward, "turns", ep->turns, "truncated", ep->truncated, "messages",
        msgs, "text", text_all, len, "reward", prl_reward_result_json(&ep->result));
    free(text_all);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    int ok = text && fprintf(a->dump_fp, "%s\n", text) > 0;
    free(text);
    if (!ok) return prl_error_set(PRL_ERR_IO, "--dump %s: cannot write an episode", a->dump);
    return PRL_OK;
}

static int has_check(const prl_reward_result *r, const char *name)
{
    for (int i = 0; i < r->n_checks; i++)
        if (!strcmp(r->checks[i].name, name)) return 1;
    return 0;
}

static prl_status eval_domain(const eval_args *a, const char *ckpt, prl_infer *e,
                              const prl_tokenizer *tok, const prl_reward_exec *exec,
                              prl_task_domain d, prl_tasks_mode mode, domain_result *out)
{
    prl_tasks_config tc;
    prl_tasks_config_default(&tc, d);
    tc.split = PRL_SPLIT_EVAL, tc.n = a->n, tc.seed = a->seed, tc.difficulty = a->difficulty;
    task_list tl = {0};
    prl_status rc = prl_tasks_generate(&tc, collect, &tl);
    prl_rollout_config rcfg;
    prl_rollout_config_default(&rcfg);
    rcfg.sampling.temperature = a->temperature, rcfg.sampling.seed = a->seed;
    rcfg.sampling.max_new_tokens = a->max_new, rcfg.max_turns = a->max_turns;
    rcfg.mode = mode;
    int32_t stops[2]; /* the tokenizer's end of turn and eos (prl: <|end|>, <|eos|>) */
    rcfg.sampling.stop_ids = stops, rcfg.sampling.n_stop_ids = prl_tokenizer_stop_ids(tok, stops);
    /* episode j plays problem j / K as its sample j % K, sampled with sequence id j (so K = 1
    ** plays every problem once with the ids it always had) */
    int K = a->samples, ne = tl.n * K;
    uint64_t *ids = calloc((size_t)(ne ? ne : 1), sizeof *ids);
    prl_episode *eps = calloc((size_t)(ne ? ne : 1), sizeof *eps);
    json_t **items = calloc((size_t)(ne ? ne : 1), sizeof *items);
    *out = (domain_result){.domain = d, .mode = mode, .n = tl.n, .episodes = ne};
    double t0 = prl_now();
    if (!rc && (!ids || !eps || !items))
        rc = prl_error_set(PRL_ERR_NOMEM, "eval of %d episodes", ne);
    for (int j = 0; !rc && j < ne; j++) ids[j] = (uint64_t)j, items[j] = tl.items[j / K];
    if (!rc) rc = prl_rollout_run(e, tok, items, ids, ne, &rcfg, exec, eps);
    for (int i = 0; !rc && i < ne; i++) {
        out->solved += eps[i].reward >= 1.0;
        out->score_sum += eps[i].reward;
        out->turns_sum += eps[i].turns;
        out->truncated += eps[i].truncated;
        out->in_mode += in_mode_of(&eps[i], mode);
        out->word_runs += has_check(&eps[i].result, "monitor:word_run");
        if (a->dump_fp) rc = dump_episode(a, ckpt, tok, items[i], i % K, mode, &eps[i]);
    }
    out->seconds = prl_now() - t0;
    for (int i = 0; !rc && i < ne; i++) prl_episode_free(&eps[i]);
    for (int i = 0; i < tl.n; i++) json_decref(tl.items[i]);
    free(tl.items), free(items), free(ids), free(eps);
    return rc;
}

/* Means over the episodes (every sample of every problem). */
static double mean_of(const domain_result *r, double sum)
{
    return r->episodes ? sum / r->episodes : 0;
}
static double acc_of(const domain_result *r) { return mean_of(r, r->solved); }

/* The row's name: its domain, and its mode when --mode asks for one ("reasoning/think"). */
static const char *row_name(const domain_result *r, char *buf, size_t n)
{
    if (r->mode == PRL_MODE_DEFAULT) return prl_tasks_domain_name(r->domain);
    snprintf(buf, n, "%s/%s", prl_tasks_domain_name(r->domain), prl_tasks_mode_name(r->mode));
    return buf;
}

static void print_json(const eval_args *a, const domain_result *r, const domain_result *c, int n)
{
    printf("{\"ckpt\": \"%s\", ", a->ckpt);
    if (c) printf("\"compare\": \"%s\", ", a->compare);
    printf("\"split\": \"eval\", \"n\": %d, \"samples\": %d, \"seed\": %llu, \"temperature\": %g, "
           "\"domains\": [",
           a->n, a->samples, (unsigned long long)a->seed, a->temperature);
    for (int i = 0; i < n; i++) {
        printf("%s{\"domain\": \"%s\", \"n\": %d, \"accuracy\": %.4f, \"mean_score\": %.4f, "
               "\"mean_turns\": %.2f, \"truncated\": %d, \"word_runs\": %d, \"seconds\": %.2f",
               i ? ", " : "", prl_tasks_domain_name(r[i].domain), r[i].n, acc_of(&r[i]),
               mean_of(&r[i], r[i].score_sum), mean_of(&r[i], r[i].turns_sum), r[i].truncated,
               r[i].word_runs, r[i].seconds);
        if (r[i].mode != PRL_MODE_DEFAULT)
            printf(", \"mode\": \"%s\", \"in_mode\": %.4f", prl_tasks_mode_name(r[i].mode),
                   mean_of(&r[i], r[i].in_mode));
        if (c)
            printf(", \"compare_accuracy\": %.4f, \"compare_mean_score\": %.4f, \"delta\": %.4f, "
                   "\"compare_word_runs\": %d",
                   acc_of(&c[i]), mean_of(&c[i], c[i].score_sum), acc_of(&c[i]) - acc_of(&r[i]),
                   c[i].word_runs);
        printf("}");
    }
    printf("]}\n");
}

/* General's degenerate answers (docs/rewards.md "Degenerate-text monitor"), per checkpoint. */
static void print_word_runs(const eval_args *a, const domain_result *r, const domain_result *c,
                            int n)
{
    char name[40];
    for (int i = 0; i < n; i++) { /* a row per mode with --mode: general/think, ... */
        if (r[i].domain != PRL_TASK_GENERAL) continue;
        printf("%s: answers with a word 5+ times in a row: %d of %d (%.1f%%) %s",
               row_name(&r[i], name, sizeof name), r[i].word_runs, r[i].episodes,
               100 * mean_of(&r[i], r[i].word_runs), a->ckpt);
        if (c)
            printf("; %d of %d (%.1f%%) %s", c[i].word_runs, c[i].episodes,
                   100 * mean_of(&c[i], c[i].word_runs), a->compare);
        printf("\n");
    }
}

static void print_results(const eval_args *a, const domain_result *r, const domain_result *c, int n)
{
    if (a->json) {
        print_json(a, r, c, n);
        return;
    }
    char name[40];
    int moded = a->n_modes > 0; /* rows per mode, with the share in the requested form */
    int w = moded ? 18 : 10;    /* "reasoning/no_think" */
    if (c) {                    /* before/after: accuracy of both and the change, in points */
        printf("%-*s %5s %10s %10s %8s %11s %11s\n", w, "domain", "n", "before", "after", "change",
               "score bef.", "score aft.");
        for (int i = 0; i < n; i++)
            printf("%-*s %5d %9.1f%% %9.1f%% %+7.1f %11.3f %11.3f\n", w,
                   row_name(&r[i], name, sizeof name), r[i].n, 100 * acc_of(&r[i]),
                   100 * acc_of(&c[i]), 100 * (acc_of(&c[i]) - acc_of(&r[i])),
                   mean_of(&r[i], r[i].score_sum), mean_of(&c[i], c[i].score_sum));
        printf("(before: %s, after: %s; change in accuracy points)\n", a->ckpt, a->compare);
        print_word_runs(a, r, c, n);
        return;
    }
    printf("%-*s %5s %9s %10s %6s %9s %8s%s\n", w, moded ? "domain/mode" : "domain", "n",
           "accuracy", "mean score", "turns", "truncated", "seconds", moded ? "  in mode" : "");
    for (int i = 0; i < n; i++) {
        printf("%-*s %5d %8.1f%% %10.3f %6.2f %9d %8.1f", w, row_name(&r[i], name, sizeof name),
               r[i].n, 100 * acc_of(&r[i]), mean_of(&r[i], r[i].score_sum),
               mean_of(&r[i], r[i].turns_sum), r[i].truncated, r[i].seconds);
        if (moded) printf(" %7.1f%%", 100 * mean_of(&r[i], r[i].in_mode));
        printf("\n");
    }
    if (moded) /* the acceptance figure of the modes: every row of a mode together */
        for (int k = 0; k < a->n_modes; k++) {
            int in = 0, eps = 0;
            for (int i = 0; i < n; i++)
                if (r[i].mode == a->modes[k]) in += r[i].in_mode, eps += r[i].episodes;
            printf("mode %s: %d of %d episodes (%.1f%%) answered in the requested form\n",
                   prl_tasks_mode_name(a->modes[k]), in, eps, eps ? 100.0 * in / eps : 0.0);
        }
    print_word_runs(a, r, NULL, n);
}

/* Every domain of one checkpoint into res[nd]. */
static int eval_ckpt(const eval_args *a, const char *ckpt, prl_task_domain *domains, int nd,
                     domain_result *res)
{
    prl_model m;
    prl_tokenizer *tok = NULL;
    if (prl_checkpoint_load_tokenizer(&m, ckpt, &tok)) return cli_fail("eval");
    if (!tok) {
        prl_model_free(&m);
        return cli_failf("eval", 1,
                         "%s has no tokenizer.json: eval needs the checkpoint's tokenizer", ckpt);
    }
    prl_infer_options io;
    int rc = 0;
    prl_infer *e = NULL;
    prl_exec_local *runner = prl_exec_local_new();
    if (prl_infer_options_preset(&io, a->precision))
        rc = cli_failf("eval", 2, "%s", prl_error_message());
    io.max_batch = a->batch;
    if (!rc && prl_infer_init(&e, &m, &io)) rc = cli_fail("eval");
    prl_reward_exec exec = {prl_exec_local_run, runner, 2.0};
    int nm = a->n_modes ? a->n_modes : 1;
    for (int k = 0; !rc && k < nm; k++) /* rows: every domain of a mode, mode by mode */
        for (int i = 0; !rc && i < nd; i++) {
            prl_tasks_mode mode = a->n_modes ? a->modes[k] : PRL_MODE_DEFAULT;
            domain_result *r = &res[k * nd + i];
            char name[40];
            if (eval_domain(a, ckpt, e, tok, &exec, domains[i], mode, r)) rc = cli_fail("eval");
            else
                fprintf(stderr, "eval: %s: %s done (%d problems, %.1f s)\n", ckpt,
                        row_name(r, name, sizeof name), r->n, r->seconds);
        }
    prl_exec_local_free(runner);
    prl_infer_free(e);
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    return rc;
}

static int run(const eval_args *a, prl_task_domain *domains, int nd)
{
    domain_result res[2 * PRL_TASK_N_DOMAINS], cmp[2 * PRL_TASK_N_DOMAINS];
    int rows = nd * (a->n_modes ? a->n_modes : 1);
    int rc = eval_ckpt(a, a->ckpt, domains, nd, res);
    if (!rc && a->compare) rc = eval_ckpt(a, a->compare, domains, nd, cmp);
    if (!rc) print_results(a, res, a->compare ? cmp : NULL, rows);
    return rc;
}

int cmd_eval(int argc, char **argv)
{
    eval_args a = {.domain = "all",
                   .precision = "fp32",
                   .n = 50,
                   .samples = 1,
                   .max_new = 96,
                   .max_turns = 10,
                   .batch = 16,
                   .seed = 1};
    cli_opt opts[] = {
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "checkpoint directory (with tokenizer.json)", 1, 0},
        {"compare", OPT_STR, &a.compare, "DIR",
         "also evaluate this checkpoint on the same problems: a before/after table", 0, 0},
        {"domain", OPT_STR, &a.domain, "D", "all (default), reasoning, general, agent or coding", 0,
         0},
        {"n", OPT_INT, &a.n, "N", "eval problems per domain (default 50)", 0, 0},
        {"samples", OPT_INT, &a.samples, "K",
         "episodes per problem, each sampled with its own seed; accuracy and scores are means over "
         "all (default 1; with --temperature > 0: avg@K)",
         0, 0},
        {"difficulty", OPT_INT, &a.difficulty, "D", "1..3, or 0 = mixed (default 0)", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "problem and sampling seed (default 1)", 0, 0},
        {"temperature", OPT_DOUBLE, &a.temperature, "T", "sampling temperature (default 0: greedy)",
         0, 0},
        {"max-new-tokens", OPT_INT, &a.max_new, "N", "tokens per model turn (default 96)", 0, 0},
        {"max-turns", OPT_INT, &a.max_turns, "N", "model turns per episode (default 10)", 0, 0},
        {"precision", OPT_STR, &a.precision, "P",
         "infer preset: fp32 (default), bf16, fp16, w8a8, aligned", 0, 0},
        {"batch", OPT_INT, &a.batch, "B", "episodes decoded together (default 16)", 0, 0},
        {"mode", OPT_STR, &a.mode, "M",
         "think, no_think or both: the prompts end in the /think or /no_think switch, each row "
         "also gives the share answered in that form (default: the prompts as they are)",
         0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {"dump", OPT_STR, &a.dump, "FILE",
         "write every episode (conversation, score, verifier checks) as a JSON line", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 2, opts,
                       "prl eval --ckpt DIR [--compare DIR2] [--domain all|D] [--n N] [--json]",
                       "Held-out accuracy per task domain: eval-split problems played with the "
                       "infer path and scored by the verifiers.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (a.n < 1) return cli_failf("eval", 2, "--n %d must be >= 1", a.n);
    if (a.samples < 1 || a.samples > 1000)
        return cli_failf("eval", 2, "--samples %d not in 1..1000", a.samples);
    if (a.difficulty < 0 || a.difficulty > 3)
        return cli_failf("eval", 2, "--difficulty %d not in 0..3", a.difficulty);
    if (a.max_new < 1 || a.max_turns < 1 || a.batch < 1)
        return cli_failf("eval", 2, "--max-new-tokens, --max-turns and --batch must be >= 1");
    if (!(a.temperature >= 0))
        return cli_failf("eval", 2, "--temperature %g must be >= 0", a.temperature);
    if (a.mode && !strcmp(a.mode, "both")) {
        a.modes[0] = PRL_MODE_THINK, a.modes[1] = PRL_MODE_NO_THINK, a.n_modes = 2;
    } else if (a.mode) {
        if (prl_tasks_mode_parse(a.mode, &a.modes[0]))
            return cli_failf("eval", 2, "--mode: %s, or both", prl_error_message());
        a.n_modes = a.modes[0] != PRL_MODE_DEFAULT;
    }
    prl_task_domain domains[PRL_TASK_N_DOMAINS];
    int nd = 0;
    if (!strcmp(a.domain, "all")) {
        for (int d = 0; d < PRL_TASK_N_DOMAINS; d++) domains[nd++] = (prl_task_domain)d;
    } else if (prl_tasks_domain_parse(a.domain, &domains[0])) {
        return cli_failf("eval", 2, "--domain: %s", prl_error_message());
    } else {
        nd = 1;
    }
    if (a.dump && cli_require_new("eval", "dump", a.dump)) return 2;
    if (a.dump && !(a.dump_fp = fopen(a.dump, "wx")))
        return cli_failf("eval", 1, "--dump %s: cannot open for writing", a.dump);
    if (cli_setup_blas("eval", a.threads)) rc = 1;
    if (!rc) rc = run(&a, domains, nd);
    if (a.dump_fp && fclose(a.dump_fp) != 0 && !rc)
        rc = cli_failf("eval", 1, "--dump %s: write failed", a.dump);
    return rc;
}
