/*
** bench_pipeline.c — `prl bench pipeline`: `prl run` of one job in sync and in async mode,
** stage times from run.db.
**
** Both modes run the same GRPO job (seed, prompts, sizes) as a child `prl run`, in
** alternating rounds; per mode the medians of the rollout stage (first lease to last score),
** the train stage and the step interval, read from the steps' metrics in run.db, and the
** sync/async speed-up against the goal (async interval <= 1.2 x its slowest stage).
*/
#include "cli/bench.h"
#include "store/store.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct pipe_args {
    const char *init, *domain;
    int steps, batch, group, max_new, threads, async_threads, skip, rounds, keep, json;
    double lr;
    uint64_t seed;
} pipe_args;

/* One mode's stage times over every measured step of every round. */
typedef struct pipe_mode {
    const char *name; /* sync | async */
    int threads;      /* of the rollout worker and of the trainer */
    double *roll, *train, *interval;
    int n;
    double roll_m, train_m, interval_m, slowest, ratio;
} pipe_mode;

/* The job both modes run: the same seed, prompts and sizes; only mode and threads differ.
** Checkpoints other than the newest few are pruned by the controller as in any run. */
static prl_status pipe_write_job(const pipe_args *a, const char *path, const char *name,
                                 const pipe_mode *m)
{
    json_t *job =
        json_pack("{s:{s:s,s:I},s:{s:s},s:{s:s,s:i},s:{s:i,s:i,s:i,s:i},s:{s:i},s:{s:f},"
                  "s:{s:i,s:s,s:i}}",
                  "run", "name", name, "seed", (json_int_t)a->seed, "model", "init", a->init,
                  "task", "domain", a->domain, "train_problems", 256, "rollout", "batch_prompts",
                  a->batch, "group_size", a->group, "max_new_tokens", a->max_new, "threads",
                  m->threads, "trainer", "threads", m->threads, "optim", "lr", a->lr, "controller",
                  "steps", a->steps, "mode", m->name, "max_lag", 1);
    int bad = !job || json_dump_file(job, path, JSON_INDENT(1));
    json_decref(job);
    return bad ? prl_error_set(PRL_ERR_IO, "cannot write %s", path) : PRL_OK;
}

/* `/proc/self/exe run JOB --runs DIR` with its output in DIR/NAME.log; 0 when it finished. */
static prl_status pipe_run(const char *dir, const char *name)
{
    char job[1200], runs[1200], log[1200];
    snprintf(job, sizeof job, "%s/%s.json", dir, name);
    snprintf(runs, sizeof runs, "%s/runs", dir);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "cannot write %s: %m", log);
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO);
        execl("/proc/self/exe", "prl", "run", job, "--runs", runs, (char *)NULL);
        _exit(127);
    }
    close(fd);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return prl_error_set(PRL_ERR_IO, "cannot run prl run: %m");
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        return prl_error_set(PRL_ERR_IO, "`prl run %s` failed (exit %d): see %s", job,
                             WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), log);
    return PRL_OK;
}

/* Append the stage times of steps [skip, last] of run NAME in DIR/runs/NAME/run.db. */
static prl_status pipe_collect(const char *dir, const char *name, int skip, pipe_mode *m)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/runs/%s/run.db", dir, name);
    prl_store *db = NULL;
    prl_store_run run = {0};
    int64_t last = -1;
    prl_status rc = prl_store_open(path, &db);
    if (!rc) rc = prl_store_run_get(db, name, &run);
    if (!rc) rc = prl_store_step_last(db, run.id, &last);
    for (int64_t s = skip; !rc && s <= last; s++) {
        char *text = NULL;
        if ((rc = prl_store_step_metrics(db, run.id, s, &text))) break;
        json_error_t je;
        json_t *j = json_loads(text, 0, &je);
        free(text);
        double v[5];
        static const char *keys[5] = {"rollout_s", "rollout_wait_s", "score_tail_s", "train_s",
                                      "interval_s"};
        for (int k = 0; k < 5; k++) v[k] = json_number_value(json_object_get(j, keys[k]));
        json_decref(j);
        /* the rollout stage: from its first lease to the last score */
        m->roll[m->n] = v[0] - v[1] + v[2], m->train[m->n] = v[3], m->interval[m->n] = v[4];
        m->n++;
    }
    prl_store_run_free(&run);
    prl_store_close(db);
    return rc;
}

static void pipe_summarise(pipe_mode *m)
{
    m->roll_m = bench_median(m->roll, m->n), m->train_m = bench_median(m->train, m->n);
    m->interval_m = bench_median(m->interval, m->n);
    m->slowest = m->roll_m > m->train_m ? m->roll_m : m->train_m;
    m->ratio = m->slowest > 0 ? m->interval_m / m->slowest : 0;
}

int cmd_bench_pipeline(int argc, char **argv)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    pipe_args a = {.domain = "general",
                   .steps = 8,
                   .batch = 8,
                   .group = 4,
                   .max_new = 64,
                   .skip = 1,
                   .rounds = 1,
                   .lr = 1e-5,
                   .seed = 1};
    cli_opt opts[] = {
        {"init", OPT_STR, &a.init, "CKPT",
         "the policy to start from (a checkpoint with tokenizer.json)", 1, 0},
        {"domain", OPT_STR, &a.domain, "D", "task domain (default general)", 0, 0},
        {"steps", OPT_INT, &a.steps, "N", "steps per run (default 8)", 0, 0},
        {"skip", OPT_INT, &a.skip, "N", "warm-up steps left out of the medians (default 1)", 0, 0},
        {"batch", OPT_INT, &a.batch, "B", "prompts per step (default 8)", 0, 0},
        {"group", OPT_INT, &a.group, "G", "samples per prompt (default 4)", 0, 0},
        {"max-new-tokens", OPT_INT, &a.max_new, "N", "tokens per response (default 64)", 0, 0},
        {"threads", OPT_INT, &a.threads, "N",
         "sync mode: threads of the rollout worker and of the trainer "
         "(they alternate; default: all CPUs)",
         0, 0},
        {"async-threads", OPT_INT, &a.async_threads, "N",
         "async mode: threads of each (they run at "
         "once; default: half the CPUs, at least 1)",
         0, 0},
        {"rounds", OPT_INT, &a.rounds, "R", "sync and async runs, alternating (default 1)", 0, 0},
        {"lr", OPT_DOUBLE, &a.lr, "LR", "learning rate (default 1e-5)", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "run seed of both modes (default 1)", 0, 0},
        {"keep", OPT_FLAG, &a.keep, NULL, "keep the temporary runs directory (its path is printed)",
         0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(
        argc, argv, 3, opts,
        "prl bench pipeline --init CKPT [--steps N] [--batch B --group G] [--json]",
        "Runs the same GRPO job with `prl run` in sync mode and in async mode (max_lag 1) and "
        "prints per mode the medians of the rollout stage (first lease to last score), the "
        "train stage (the trainer's wall time) and the step interval (commit to commit), "
        "interval / slowest stage, and the sync/async speed-up. Goal: async interval <= "
        "1.2 x its slowest stage.",
        NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (a.steps < 1 || a.skip < 0 || a.skip >= a.steps || a.batch < 1 || a.group < 1 ||
        a.max_new < 1 || a.rounds < 1 || a.threads < 0 || a.async_threads < 0)
        return cli_failf("bench", 2,
                         "--steps, --batch, --group, --max-new-tokens, --rounds must be >= 1 "
                         "and --skip in [0, --steps)");
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/tokenizer.json", a.init);
    if (access(probe, R_OK))
        return cli_failf("bench", 2, "--init %s: no tokenizer.json there", a.init);
    pipe_mode modes[2] = {
        {.name = "sync", .threads = a.threads ? a.threads : (int)(ncpu > 0 ? ncpu : 1)},
        {.name = "async",
         .threads = a.async_threads ? a.async_threads : (int)(ncpu > 1 ? ncpu / 2 : 1)}};
    int per_mode = a.rounds * (a.steps - a.skip);
    for (int k = 0; k < 2; k++) {
        modes[k].roll = calloc((size_t)per_mode, sizeof(double));
        modes[k].train = calloc((size_t)per_mode, sizeof(double));
        modes[k].interval = calloc((size_t)per_mode, sizeof(double));
    }
    const char *dir = bench_tmpdir("pipeline");
    if (!dir) return cli_fail("bench");
    if (a.keep) bench_tmpdir_keep();
    prl_status st = PRL_OK;
    /* Rounds alternate the modes, so drift in the shared machine's speed hits both alike. */
    for (int r = 0; !st && r < a.rounds; r++)
        for (int k = 0; !st && k < 2; k++) {
            pipe_mode *m = &modes[k];
            char name[32], job[1200];
            snprintf(name, sizeof name, "%s-%d", m->name, r + 1);
            snprintf(job, sizeof job, "%s/%s.json", dir, name);
            fprintf(stderr,
                    "bench: round %d/%d: %s mode, %d steps of %d x %d, %d thread(s) per role\n",
                    r + 1, a.rounds, m->name, a.steps, a.batch, a.group, m->threads);
            double t0 = prl_now();
            st = pipe_write_job(&a, job, name, m);
            if (!st) st = pipe_run(dir, name);
            if (!st) st = pipe_collect(dir, name, a.skip, m);
            if (!st)
                fprintf(stderr, "bench: round %d/%d: %s mode took %.1f s\n", r + 1, a.rounds,
                        m->name, prl_now() - t0);
        }
    if (st) {
        fprintf(stderr, "prl bench: %s (runs kept in %s)\n", prl_error_message(), dir);
        return 1;
    }
    for (int k = 0; k < 2; k++) pipe_summarise(&modes[k]);
    const pipe_mode *sy = &modes[0], *as = &modes[1];
    double speedup = as->interval_m > 0 ? sy->interval_m / as->interval_m : 0;
    const double goal = 1.2;
    int pass = as->ratio > 0 && as->ratio <= goal;
    if (a.json) {
        printf("{\"init\": \"%s\", \"domain\": \"%s\", \"steps\": %d, \"skip\": %d, \"rounds\": "
               "%d, \"batch\": %d, "
               "\"group\": %d, \"max_new_tokens\": %d, \"seed\": %llu, \"modes\": [",
               a.init, a.domain, a.steps, a.skip, a.rounds, a.batch, a.group, a.max_new,
               (unsigned long long)a.seed);
        for (int k = 0; k < 2; k++) {
            const pipe_mode *m = &modes[k];
            printf("%s{\"mode\": \"%s\", \"threads\": %d, \"steps_measured\": %d, \"rollout_s\": "
                   "%.3f, "
                   "\"train_s\": %.3f, \"interval_s\": %.3f, \"slowest_stage\": \"%s\", "
                   "\"slowest_s\": %.3f, "
                   "\"ratio_interval_over_slowest\": %.3f}",
                   k ? ", " : "", m->name, m->threads, m->n, m->roll_m, m->train_m, m->interval_m,
                   m->roll_m > m->train_m ? "rollout" : "train", m->slowest, m->ratio);
        }
        printf("], \"speedup_sync_over_async\": %.3f, \"goal_ratio\": %.2f, \"goal_met\": %s}\n",
               speedup, goal, pass ? "true" : "false");
    } else {
        printf("%s, %s, %d steps of %d prompts x %d samples (max %d new tokens), seed %llu; "
               "medians over "
               "steps %d..%d of %d round(s)\n",
               a.init, a.domain, a.steps, a.batch, a.group, a.max_new, (unsigned long long)a.seed,
               a.skip + 1, a.steps, a.rounds);
        printf("  mode   threads  rollout+score  train    interval  slowest        "
               "interval/slowest\n");
        for (int k = 0; k < 2; k++) {
            const pipe_mode *m = &modes[k];
            printf("  %-5s  %7d  %11.2f s  %5.2f s  %6.2f s  %-7s %5.2f s  %.2f\n", m->name,
                   m->threads, m->roll_m, m->train_m, m->interval_m,
                   m->roll_m > m->train_m ? "rollout" : "train", m->slowest, m->ratio);
        }
        printf("  speed-up sync/async interval = %.2fx\n", speedup);
        printf("  goal: async interval <= %.1f x slowest stage: %.2f  %s\n", goal, as->ratio,
               pass ? "PASS" : "MISS");
    }
    for (int k = 0; k < 2; k++) free(modes[k].roll), free(modes[k].train), free(modes[k].interval);
    return 0;
}
