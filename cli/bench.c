/*
** bench.c — what the `prl bench` benches share: the median of timed rounds, the PyTorch
** reference (reference/pangu_ref.py) run as a child process on prl's BLAS core and threads,
** and the one temporary directory a bench may make, removed however the bench ends.
*/
#include "cli/bench.h"

#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- temp directory --- */

static char tmp_dir[512];
static pid_t tmp_owner; /* a forked child that exits must not remove its parent's folder */
static int tmp_keep;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void tmp_remove(void)
{
    if (!tmp_dir[0] || getpid() != tmp_owner) return;
    if (tmp_keep) fprintf(stderr, "bench: kept %s\n", tmp_dir);
    else nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    tmp_dir[0] = 0;
}

static void tmp_on_signal(int sig)
{
    (void)sig;
    exit(130); /* through atexit: Ctrl-C leaves no folder behind either */
}

const char *bench_tmpdir(const char *name)
{
    if (tmp_dir[0]) return tmp_dir;
    const char *base = getenv("TMPDIR");
    if (!base || !*base || strlen(base) > 300) base = "/tmp";
    snprintf(tmp_dir, sizeof tmp_dir, "%s/prl-bench-%s-XXXXXX", base, name);
    if (!mkdtemp(tmp_dir)) {
        prl_error_set(PRL_ERR_IO, "cannot make a temporary directory %s", tmp_dir);
        tmp_dir[0] = 0;
        return NULL;
    }
    tmp_owner = getpid();
    atexit(tmp_remove);
    signal(SIGINT, tmp_on_signal);
    signal(SIGTERM, tmp_on_signal);
    return tmp_dir;
}

void bench_tmpdir_keep(void) { tmp_keep = 1; }

/* ---------------------------------------------------------------- rounds ----------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

prl_status bench_reference(const char *python, const char *reference, json_t **root, char **out,
                           const char *fmt, ...)
{
    *root = NULL;
    if (out) *out = NULL;
    char cmd[8192];
    int k = snprintf(cmd, sizeof cmd,
                     "OPENBLAS_CORETYPE='%s' OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d '%s' '%s' ",
                     prl_blas_core(), prl_blas_threads(), prl_blas_threads(), python, reference);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < sizeof cmd) vsnprintf(cmd + k, sizeof cmd - (size_t)k, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    if (!p) return prl_error_set(PRL_ERR_IO, "cannot run the reference: %s", cmd);
    size_t cap = 1 << 20, n = 0, got;
    char *text = malloc(cap);
    if (!text) {
        pclose(p);
        return prl_error_set(PRL_ERR_NOMEM, "the reference's output");
    }
    while ((got = fread(text + n, 1, cap - 1 - n, p)) > 0) n += got;
    text[n] = 0;
    int status = pclose(p);
    if (status != 0) {
        free(text);
        return prl_error_set(PRL_ERR_IO, "the PyTorch reference failed (exit %d): %s", status, cmd);
    }
    json_error_t err;
    *root = json_loads(strchr(text, '{') ? strchr(text, '{') : text, JSON_DISABLE_EOF_CHECK, &err);
    if (out) *out = text;
    else free(text);
    return PRL_OK;
}
