/*
** bench_load.c — `prl bench load`: how much memory and time loading a checkpoint takes.
**
** Without --ckpt it makes a Hugging Face-style checkpoint first: the model of --config
** (configs/models/bench-1b.json, 1.0 B parameters) with random weights, exported as BF16
** shards + index without prl metadata, as an outside exporter writes them, into a temporary
** directory it removes afterwards. Each round loads the checkpoint in a fresh child process
** (`prl bench load --ckpt DIR --once`) and takes the child's peak resident set from wait4's
** ru_maxrss, so nothing of the generator or of earlier rounds is counted. Printed: medians of
** the load time, the peak RSS and its ratio to the fp32 weights (n_params × 4 bytes), the
** loader's goal being ≤ 1.2 (weights converted tensor by tensor, file pages released).
*/
#include "cli/bench.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --once: load and report in this process. */
static int load_once(const char *ckpt)
{
    double t0 = now_s();
    prl_model m;
    if (prl_checkpoint_load(&m, ckpt)) return cli_fail("bench");
    double dt = now_s() - t0;
    printf("{\"seconds\": %.4f, \"n_params\": %zu}\n", dt, m.n_params);
    prl_model_free(&m);
    return 0;
}

/* One round: a child loads ckpt; its load time and peak RSS (bytes). */
static prl_status child_round(const char *ckpt, double *seconds, double *peak, size_t *n_params)
{
    int fd[2];
    if (pipe(fd)) return prl_error_set(PRL_ERR_IO, "pipe: %m");
    pid_t pid = fork();
    if (pid < 0) return prl_error_set(PRL_ERR_IO, "fork: %m");
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        execl("/proc/self/exe", "prl", "bench", "load", "--ckpt", ckpt, "--once", (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char out[256] = {0};
    size_t n = 0;
    ssize_t got;
    while (n + 1 < sizeof out && (got = read(fd[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)got;
    close(fd[0]);
    int status;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) return prl_error_set(PRL_ERR_IO, "wait4: %m");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        sscanf(out, "{\"seconds\": %lf, \"n_params\": %zu", seconds, n_params) != 2)
        return prl_error_set(PRL_ERR_IO, "the loading child failed (status %d): %s", status, out);
    *peak = (double)ru.ru_maxrss * 1024.0; /* Linux: kilobytes */
    return PRL_OK;
}

/* Bytes of the regular files in dir (the checkpoint on disk). */
static double dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    double total = 0;
    struct dirent *e;
    char path[4200];
    struct stat sb;
    while (d && (e = readdir(d)))
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path &&
            stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            total += (double)sb.st_size;
    if (d) closedir(d);
    return total;
}

/* The generated checkpoint: random weights of `config`, BF16 shards, no prl metadata. */
static prl_status make_checkpoint(const char *config, const char *out, size_t shard_bytes)
{
    prl_config cfg;
    prl_model m;
    prl_status rc = prl_config_load(&cfg, config);
    if (rc == PRL_OK) rc = prl_model_init(&m, &cfg);
    if (rc) return rc;
    fprintf(stderr, "bench: %zu parameters from %s, writing BF16 shards to %s\n", m.n_params,
            config, out);
    prl_model_init_weights(&m, 1);
    prl_export_options eo = {.dtype = PRL_DTYPE_BF16, .shard_bytes = shard_bytes, .no_checksum = 1};
    rc = prl_checkpoint_export(&m, NULL, out, &eo);
    prl_model_free(&m);
    return rc;
}

int cmd_bench_load(int argc, char **argv)
{
    const char *ckpt = NULL, *config = PRL_SOURCE_DIR "/configs/models/bench-1b.json";
    int rounds = 3, once = 0, json = 0;
    cli_opt opts[] = {
        {"ckpt", OPT_STR, &ckpt, "DIR", "checkpoint to load (default: generate one)", 0, 0},
        {"config", OPT_STR, &config, "CONFIG",
         "model of the generated checkpoint (default configs/models/bench-1b.json, 1.0 B)", 0, 0},
        {"rounds", OPT_INT, &rounds, "N", "loads, each in a fresh process (default 3)", 0, 0},
        {"json", OPT_FLAG, &json, NULL, "one JSON object", 0, 0},
        {"once", OPT_FLAG, &once, NULL, "load once in this process and print the time", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl bench load [--ckpt DIR | --config CONFIG]",
                       "Loads a checkpoint in fresh processes: load time, peak resident memory "
                       "and its ratio to the fp32 weights.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (once) return ckpt ? load_once(ckpt) : cli_failf("bench", 2, "--once needs --ckpt");
    if (rounds < 1 || rounds > 50) return cli_failf("bench", 2, "--rounds must be in 1..50");
    char made[600];
    if (!ckpt) {
        const char *tmp = bench_tmpdir("load");
        if (!tmp) return cli_fail("bench");
        snprintf(made, sizeof made, "%s/hf", tmp);
        if (make_checkpoint(config, made, (size_t)1 << 30)) return cli_fail("bench");
    }
    const char *dir = ckpt ? ckpt : made;
    double secs[50], peaks[50], file = dir_bytes(dir);
    size_t n_params = 0;
    prl_status st = PRL_OK;
    for (int i = 0; st == PRL_OK && i < rounds; i++) {
        st = child_round(dir, &secs[i], &peaks[i], &n_params);
        if (st == PRL_OK)
            fprintf(stderr, "bench: round %d: %.2f s, peak RSS %.0f MiB\n", i + 1, secs[i],
                    peaks[i] / 1048576.0);
    }
    if (st) return cli_fail("bench");
    double t = bench_median(secs, rounds), peak = bench_median(peaks, rounds);
    double fp32 = (double)n_params * 4.0;
    if (json)
        printf("{\"ckpt\": \"%s\", \"n_params\": %zu, \"file_bytes\": %.0f, \"fp32_bytes\": %.0f, "
               "\"load_s\": %.4f, \"peak_rss_bytes\": %.0f, \"peak_rss_over_fp32\": %.3f, "
               "\"rounds\": %d}\n",
               ckpt ? ckpt : "generated", n_params, file, fp32, t, peak, peak / fp32, rounds);
    else
        printf("load %s: %zu parameters, %.2f GB on disk, medians of %d loads in fresh processes\n"
               "  load time %.2f s (%.2f GB/s of file)\n"
               "  peak RSS %.2f GB = %.3f x the fp32 weights (%.2f GB)\n",
               ckpt ? ckpt : "generated bf16 checkpoint", n_params, file / 1e9, rounds, t,
               file / 1e9 / t, peak / 1e9, peak / fp32, fp32 / 1e9);
    return 0;
}
