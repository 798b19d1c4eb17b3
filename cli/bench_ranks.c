/*
** bench_ranks.c — `prl bench trainer-ranks`: the trainer's GRPO step time per rank count
** (trainer.ranks), measured side by side in one run.
**
** For each rank count R of --ranks, a child runs the same GRPO step (prl_grpo_train_step on
** one synthetic batch: same model, weights, samples, micro-batches) --steps times after one
** untimed step: one process for R = 1, `mpirun -n R` for R > 1, as `prl run` starts the
** trainer. The rank counts alternate within each of --rounds rounds, so a shared machine's
** drift hits them alike; the table gives the median step time per R over every round, the
** speed-up against one rank, and each R's final weights checksum (they must be equal: the
** step's sum does not depend on R). Ranks share the --threads threads (at least 1 each).
*/
#include "cli/bench.h"
#include "dp/dp.h"
#include "grpo/grpo.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_RANK_COUNTS = 8 };

typedef struct ranks_args {
    const char *config, *ranks;
    int samples, seq, micro_rows, steps, rounds, threads, json, worker;
    uint64_t seed;
} ranks_args;

/* One synthetic step's samples: prompts of seq/4 tokens, groups of 8, rewards that differ
** within each group, rollout log-probs −1 on every response token. */
static prl_status make_batch(prl_grpo_batch *b, const ranks_args *a, int vocab)
{
    int n = a->samples, T = a->seq, P = T / 4 > 0 ? T / 4 : 1;
    prl_status rc = prl_grpo_batch_init(b, n, (size_t)n * T, (size_t)n * (T - P));
    if (rc) return rc;
    prl_rng r;
    prl_rng_init(&r, a->seed, 0, 0, 0, PRL_RNG_TEST);
    for (size_t i = 0; i < (size_t)n * T; i++)
        b->tokens[i] = (int32_t)(prl_rng_u64(&r) % (uint64_t)vocab);
    for (int i = 0; i < n; i++) {
        b->offsets[i + 1] = (i + 1) * T;
        b->prompt_lens[i] = P;
        b->rewards[i] = (float)((i * 7) % 5) / 4;
        b->groups[i] = i / 8;
    }
    for (size_t j = 0; j < b->n_response; j++) b->logprobs[j] = -1, b->mask[j] = 1;
    return PRL_OK;
}

/* The child: one rank of R (R = 1: no MPI); rank 0 prints one JSON line of step times. */
static int worker(const ranks_args *a)
{
    prl_dp d = {.size = 1};
    prl_grpo_comm comm = {.size = 1};
    if (a->worker > 1) {
        if (prl_dp_init(&d, NULL, NULL)) return cli_fail("bench trainer-ranks");
        if (d.size != a->worker)
            return cli_failf("bench trainer-ranks", 1, "started %d ranks, want %d", d.size,
                             a->worker);
        comm = (prl_grpo_comm){.rank = d.rank,
                               .size = d.size,
                               .ctx = &d,
                               .send = prl_dp_send,
                               .recv = prl_dp_recv,
                               .bcast = prl_dp_bcast};
    }
    prl_config cfg;
    prl_model m;
    prl_optim o;
    prl_optim_config oc;
    prl_grpo_batch b;
    memset(&b, 0, sizeof b);
    prl_status rc = prl_config_load(&cfg, a->config);
    if (!rc) rc = prl_model_init(&m, &cfg);
    if (rc) return prl_dp_finalize(&d), cli_fail("bench trainer-ranks");
    prl_model_init_weights(&m, a->seed);
    prl_optim_config_default(&oc);
    oc.lr = 1e-4;
    if (!(rc = prl_optim_init(&o, &m, &oc))) rc = make_batch(&b, a, cfg.vocab_size);
    prl_grpo_train_config tc;
    prl_grpo_train_config_default(&tc);
    tc.micro_rows = a->micro_rows;
    tc.comm = &comm;
    double *t = calloc((size_t)a->steps, sizeof *t);
    for (int s = 0; !rc && s <= a->steps; s++) { /* step 0: untimed */
        double t0 = prl_now();
        prl_grpo_step_stats st;
        rc = prl_grpo_train_step(&m, &o, &b, &tc, &st);
        if (s > 0 && t) t[s - 1] = prl_now() - t0;
    }
    if (!rc && d.rank == 0) {
        printf("{\"ranks\": %d, \"threads\": %d, \"checksum\": \"%016llx\", \"steps\": [",
               comm.size, prl_blas_threads(),
               (unsigned long long)prl_checksum64(m.params, m.n_params * sizeof *m.params, 0));
        for (int s = 0; s < a->steps; s++) printf("%s%.6f", s ? ", " : "", t[s]);
        printf("]}\n");
        fflush(stdout);
    }
    if (rc) fprintf(stderr, "rank %d: %s\n", d.rank, prl_error_message());
    free(t);
    prl_grpo_batch_free(&b);
    prl_optim_free(&o);
    prl_model_free(&m);
    prl_dp_finalize(&d);
    return rc ? 1 : 0;
}

/* The rank counts of --ranks ("1,2,4"). */
static int parse_ranks(const char *s, int *r, int max)
{
    int n = 0;
    for (const char *p = s; *p && n < max;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 64 || (*end && *end != ',')) return -1;
        r[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

/* One child for R ranks; its JSON line into *out (caller decrefs). */
static prl_status run_child(const ranks_args *a, int R, int threads, json_t **out)
{
    char exe[1024], cmd[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[k > 0 ? k : 0] = 0;
    int n = snprintf(cmd, sizeof cmd, "%s", R > 1 ? "mpirun -n " : "");
    if (R > 1)
        n += snprintf(cmd + n, sizeof cmd - n, "%d %s--oversubscribe --bind-to none ", R,
                      getuid() == 0 ? "--allow-run-as-root " : "");
    n += snprintf(cmd + n, sizeof cmd - n,
                  "'%s' bench trainer-ranks --worker %d --config '%s' --samples %d --seq %d "
                  "--micro-rows %d --steps %d --threads %d --seed %llu 2>&1",
                  exe, R, a->config, a->samples, a->seq, a->micro_rows, a->steps, threads,
                  (unsigned long long)a->seed);
    if (n >= (int)sizeof cmd) return prl_error_set(PRL_ERR_ARG, "command too long");
    FILE *p = popen(cmd, "r");
    if (!p) return prl_error_set(PRL_ERR_IO, "cannot start: %s", cmd);
    char line[8192], last[512] = "";
    *out = NULL;
    while (fgets(line, sizeof line, p)) {
        json_error_t je;
        if (line[0] == '{' && !*out) *out = json_loads(line, 0, &je);
        else if (line[0] != '\n' && strncmp(line, "blas:", 5))
            snprintf(last, sizeof last, "%.500s", line);
    }
    int st = pclose(p);
    if (st == 0 && *out) return PRL_OK;
    json_decref(*out), *out = NULL;
    last[strcspn(last, "\n")] = 0;
    return prl_error_set(PRL_ERR_IO, "%d ranks: the child failed (status %d)%s%s", R, st,
                         last[0] ? ": " : "", last);
}

typedef struct rank_result {
    int R, threads;
    double *t;
    int n;
    char checksum[24];
} rank_result;

static prl_status take(rank_result *res, json_t *o, int steps)
{
    json_t *s = json_object_get(o, "steps");
    const char *sum = json_string_value(json_object_get(o, "checksum"));
    if (!json_is_array(s) || (int)json_array_size(s) != steps || !sum)
        return prl_error_set(PRL_ERR_FORMAT, "%d ranks: a malformed result line", res->R);
    for (int i = 0; i < steps; i++) res->t[res->n++] = json_number_value(json_array_get(s, i));
    res->threads = (int)json_integer_value(json_object_get(o, "threads"));
    if (res->checksum[0] && strcmp(res->checksum, sum))
        return prl_error_set(PRL_ERR_NUMERIC, "%d ranks: final weights differ between rounds",
                             res->R);
    snprintf(res->checksum, sizeof res->checksum, "%s", sum);
    return PRL_OK;
}

static void print_table(rank_result *res, int n, const ranks_args *a)
{
    double base = bench_median(res[0].t, res[0].n);
    int same = 1;
    for (int i = 1; i < n; i++) same &= !strcmp(res[i].checksum, res[0].checksum);
    if (a->json) {
        printf("{\"samples\": %d, \"seq\": %d, \"micro_rows\": %d, \"identical\": %s, "
               "\"results\": [",
               a->samples, a->seq, a->micro_rows, same ? "true" : "false");
        for (int i = 0; i < n; i++)
            printf("%s{\"ranks\": %d, \"threads_per_rank\": %d, \"median_s\": %.6f, "
                   "\"checksum\": \"%s\"}",
                   i ? ", " : "", res[i].R, res[i].threads, bench_median(res[i].t, res[i].n),
                   res[i].checksum);
        printf("]}\n");
        return;
    }
    printf("GRPO step, %d samples x %d tokens, micro-batches of %d rows (%d per update), %s; "
           "median of %d rounds x %d steps\n",
           a->samples, a->seq, a->micro_rows, (a->samples + a->micro_rows - 1) / a->micro_rows,
           a->config, a->rounds, a->steps);
    printf("ranks  threads/rank  step (median)  vs 1 rank  final weights\n");
    for (int i = 0; i < n; i++) {
        double med = bench_median(res[i].t, res[i].n);
        printf("%5d  %12d  %11.3f s  %8.2fx  %s\n", res[i].R, res[i].threads, med, base / med,
               res[i].checksum);
    }
    printf("final weights %s across rank counts\n", same ? "bitwise identical" : "DIFFER");
}

static int bench_parent(const ranks_args *a)
{
    int R[MAX_RANK_COUNTS], n = parse_ranks(a->ranks, R, MAX_RANK_COUNTS);
    if (n < 1) return cli_failf("bench", 2, "--ranks '%s': a list like 1,2,4 (1..64)", a->ranks);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int total = a->threads > 0 ? a->threads : (int)(cpus > 0 ? cpus : 1);
    rank_result res[MAX_RANK_COUNTS];
    memset(res, 0, sizeof res);
    prl_status rc = PRL_OK;
    for (int i = 0; i < n && !rc; i++) {
        res[i].R = R[i];
        if (!(res[i].t = calloc((size_t)a->rounds * a->steps, sizeof *res[i].t)))
            rc = prl_error_set(PRL_ERR_NOMEM, "times");
    }
    for (int round = 0; round < a->rounds && !rc; round++)
        for (int i = 0; i < n && !rc; i++) {
            json_t *o;
            int th = total / R[i] > 1 ? total / R[i] : 1;
            if (!(rc = run_child(a, R[i], th, &o))) rc = take(&res[i], o, a->steps);
            json_decref(o);
            if (!rc && !a->json)
                fprintf(stderr, "round %d: %d ranks: median %.3f s\n", round + 1, R[i],
                        bench_median(res[i].t + round * a->steps, a->steps));
        }
    if (!rc) print_table(res, n, a);
    for (int i = 0; i < n; i++) free(res[i].t);
    return rc ? cli_fail("bench trainer-ranks") : 0;
}

int cmd_bench_ranks(int argc, char **argv)
{
    ranks_args a = {.config = PRL_SOURCE_DIR "/configs/models/tiny.json",
                    .ranks = "1,2,4",
                    .samples = 32,
                    .seq = 64,
                    .micro_rows = 4,
                    .steps = 2,
                    .rounds = 3,
                    .seed = 1};
    cli_opt opts[] = {
        {"config", OPT_STR, &a.config, "CONFIG", "model config (default configs/models/tiny.json)",
         0, 0},
        {"ranks", OPT_STR, &a.ranks, "LIST", "rank counts (default 1,2,4)", 0, 0},
        {"samples", OPT_INT, &a.samples, "N", "samples per step (default 32)", 0, 0},
        {"seq", OPT_INT, &a.seq, "T", "tokens per sample (default 64)", 0, 0},
        {"micro-rows", OPT_INT, &a.micro_rows, "R", "rows per micro-batch (default 4)", 0, 0},
        {"steps", OPT_INT, &a.steps, "N", "timed steps per child (default 2)", 0, 0},
        {"rounds", OPT_INT, &a.rounds, "K", "rounds over the rank counts (default 3)", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads shared by the ranks (default: all CPUs)", 0,
         0},
        {"seed", OPT_U64, &a.seed, "S", "seed (default 1)", 0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {"worker", OPT_INT, &a.worker, "R", "internal: be one rank of R", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl bench trainer-ranks [--ranks 1,2,4] [--json]",
                       "Times the trainer's GRPO step with 1, 2, 4 ... data-parallel ranks "
                       "(trainer.ranks; mpirun) on one synthetic batch, side by side, and checks "
                       "that every rank count ends with the same weights.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (a.samples < 1 || a.seq < 2 || a.micro_rows < 1 || a.steps < 1 || a.rounds < 1)
        return cli_failf("bench", 2,
                         "--samples, --micro-rows, --steps, --rounds must be >= 1, --seq >= 2");
    if (a.worker) {
        if (cli_setup_blas("bench trainer-ranks", a.threads)) return 1;
        return worker(&a);
    }
    return bench_parent(&a);
}
