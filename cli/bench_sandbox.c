/*
** bench_sandbox.c — `prl bench sandbox`: sandboxed executions per second against a bare spawn,
** cold and warm.
**
** A trivial python3 program (print(1)) runs with every isolation layer the machine offers
** (sandbox/): cold (each run execs python3) and warm (each run starts from the slot's
** pre-started interpreter, options.warm), and with a bare fork + execve + wait of the same
** interpreter, argv and environment, in alternating rounds; the medians, the ratios and the
** goals (cold isolated >= 60 % of bare; warm >= 3x cold).
*/
#include "cli/bench.h"
#include "sandbox/sandbox.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The bare spawn: fork, execve the same interpreter, argv and clean environment the sandbox
** uses, read stdout to EOF, wait. Returns 0 when it printed "1\n" and exited 0. */
static int bare_spawn(const char *python, const char *file)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return -1;
    const char *argv[] = {python, "-I", "-B", "-u", file, NULL};
    const char *envp[] = {"PATH=/usr/bin:/bin",
                          "HOME=/tmp",
                          "TMPDIR=/tmp",
                          "LANG=C.UTF-8",
                          "USER=sandbox",
                          "PYTHONDONTWRITEBYTECODE=1",
                          "PYTHONUNBUFFERED=1",
                          "OMP_NUM_THREADS=1",
                          "OPENBLAS_NUM_THREADS=1",
                          NULL};
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        execve(python, (char *const *)argv, (char *const *)envp);
        _exit(127);
    }
    close(p[1]);
    char buf[64];
    size_t n = 0;
    ssize_t got;
    while ((got = read(p[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)got;
    close(p[0]);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0) return -1;
    buf[n] = 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 && !strcmp(buf, "1\n") ? 0 : -1;
}

static int isolated_run(prl_sandbox *sb, const prl_sandbox_request *req)
{
    prl_sandbox_result res;
    prl_status st = prl_sandbox_run(sb, 0, req, &res);
    int ok = st == PRL_OK && res.status == PRL_SANDBOX_STATUS_OK && !strcmp(res.out, "1\n");
    if (!ok)
        fprintf(stderr, "bench: isolated run failed: %s: %s\n", prl_sandbox_status_name(res.status),
                res.reason);
    prl_sandbox_result_free(&res);
    return ok ? 0 : -1;
}

/* Runs per second over one round of `secs` seconds. */
static double round_rate(prl_sandbox *sb, const prl_sandbox_request *req, const char *python,
                         const char *file, double secs, int *count)
{
    double t0 = prl_now(), t;
    int n = 0;
    do {
        if ((sb ? isolated_run(sb, req) : bare_spawn(python, file)) != 0) return -1;
        n++;
        t = prl_now();
    } while (t - t0 < secs);
    *count += n;
    return n / (t - t0);
}

int cmd_bench_sandbox(int argc, char **argv)
{
    double seconds = 10, round_s = 0.5;
    int json = 0;
    const char *python = "/usr/bin/python3";
    cli_opt opts[] = {
        {"seconds", OPT_DOUBLE, &seconds, "S", "total measuring time (default 10)", 0, 0},
        {"round", OPT_DOUBLE, &round_s, "S", "length of one round (default 0.5)", 0, 0},
        {"python", OPT_STR, &python, "PATH", "interpreter (default /usr/bin/python3)", 0, 0},
        {"json", OPT_FLAG, &json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(
        argc, argv, 3, opts, "prl bench sandbox [--seconds S] [--json]",
        "Executions per second of a trivial python3 program (print(1)) with full isolation, "
        "cold and warm, and with a bare fork/exec+wait, in alternating rounds; medians and "
        "their ratios (goals: isolated >= 60% of bare, warm >= 3x cold).",
        NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (!(seconds > 0) || !(round_s > 0) || seconds < 2 * round_s)
        return cli_failf("bench", 2, "--seconds must be >= 2 x --round and both positive");
    static const char program[] = "print(1)\n";
    const char *dir = bench_tmpdir("sandbox");
    if (!dir) return cli_fail("bench");
    char file[600];
    snprintf(file, sizeof file, "%s/main.py", dir);
    prl_sandbox_caps caps;
    prl_sandbox_options opt;
    prl_sandbox_options_default(&opt);
    prl_sandbox *sb = NULL, *wsb = NULL;
    prl_status st = prl_file_write_sync(file, program, sizeof program - 1);
    if (st == PRL_OK) st = prl_sandbox_probe(&caps);
    opt.caps = &caps;
    opt.python3 = python;
    opt.uid_base = 200000u + (unsigned)getpid(); /* see cmd_sandbox.c */
    if (st == PRL_OK) st = prl_sandbox_init(&sb, &opt);
    opt.warm = 1;
    opt.uid_base += 1; /* its own slot uid */
    if (st == PRL_OK) st = prl_sandbox_init(&wsb, &opt);
    if (st) {
        prl_sandbox_free(sb);
        return cli_fail("bench");
    }
    prl_sandbox_request req = {.lang = "python3",
                               .program = program,
                               .program_len = sizeof program - 1};
    prl_sandbox_limits_default(&req.limits);
    /* Warm both paths (page cache, first cgroup writes), then alternate rounds so drift in
    ** the shared machine's speed hits both alike. */
    int n_iso = 0, n_bare = 0, n_warm = 0, warm = 0;
    if (round_rate(sb, &req, python, file, 0.2, &warm) < 0 ||
        round_rate(wsb, &req, python, file, 0.2, &warm) < 0 ||
        round_rate(NULL, NULL, python, file, 0.2, &warm) < 0)
        rc = 1;
    int rounds = (int)(seconds / round_s / 3);
    if (rounds < 1) rounds = 1;
    double *iso = calloc((size_t)rounds, sizeof *iso), *bare = calloc((size_t)rounds, sizeof *bare),
           *wrm = calloc((size_t)rounds, sizeof *wrm);
    for (int r = 0; rc == 0 && r < rounds; r++) {
        iso[r] = round_rate(sb, &req, python, file, round_s, &n_iso);
        wrm[r] = round_rate(wsb, &req, python, file, round_s, &n_warm);
        bare[r] = round_rate(NULL, NULL, python, file, round_s, &n_bare);
        if (iso[r] < 0 || bare[r] < 0 || wrm[r] < 0) rc = 1;
    }
    unsigned layers = prl_sandbox_layers(sb);
    prl_sandbox_free(sb);
    prl_sandbox_free(wsb);
    if (rc) {
        free(iso), free(bare), free(wrm);
        return cli_failf("bench", 1, "a run failed (see above)");
    }
    double mi = bench_median(iso, rounds), mb = bench_median(bare, rounds), ratio = mi / mb;
    double mw = bench_median(wrm, rounds), wratio = mw / mi;
    free(iso), free(bare), free(wrm);
    const double goal = 0.6, wgoal = 3.0;
    if (json) {
        printf(
            "{\"program\": \"print(1)\", \"python\": \"%s\", \"rounds\": %d, \"round_seconds\": "
            "%.2f, "
            "\"isolated_runs\": %d, \"bare_runs\": %d, \"isolated_execs_per_s\": %.2f, "
            "\"bare_execs_per_s\": %.2f, \"ratio_isolated_over_bare\": %.3f, \"goal_ratio\": %.2f, "
            "\"goal_met\": %s, \"warm_runs\": %d, \"warm_execs_per_s\": %.2f, "
            "\"ratio_warm_over_cold\": %.3f, \"warm_goal_ratio\": %.2f, \"warm_goal_met\": %s, "
            "\"layers\": [",
            python, rounds, round_s, n_iso, n_bare, mi, mb, ratio, goal,
            ratio >= goal ? "true" : "false", n_warm, mw, wratio, wgoal,
            wratio >= wgoal ? "true" : "false");
        for (int i = 0, first = 1; i < PRL_SANDBOX_N_LAYERS; i++)
            if (layers & (1u << i))
                printf("%s\"%s\"", first ? "" : ", ", prl_sandbox_layer_name(1u << i)), first = 0;
        printf("]}\n");
    } else {
        printf("python3 print(1): %d rounds of %.1f s each of 3 ways, alternating (medians)\n",
               rounds, round_s);
        printf("  isolated  %7.2f execs/s   (%d runs; layers:", mi, n_iso);
        for (int i = 0; i < PRL_SANDBOX_N_LAYERS; i++)
            if (layers & (1u << i)) printf(" %s", prl_sandbox_layer_name(1u << i));
        printf(")\n  bare      %7.2f execs/s   (%d runs; fork + execve + wait)\n", mb, n_bare);
        printf("  warm      %7.2f execs/s   (%d runs; every layer, from the slot's zygote)\n", mw,
               n_warm);
        printf("  ratio isolated/bare = %.2f   goal >= %.2f: %s\n", ratio, goal,
               ratio >= goal ? "met" : "NOT met");
        printf("  ratio warm/cold     = %.2f   goal >= %.2f: %s\n", wratio, wgoal,
               wratio >= wgoal ? "met" : "NOT met");
    }
    return 0;
}
