/*
** bench.c — what the `prl bench` benches share: the median of timed rounds, and the PyTorch
** reference (reference/pangu_ref.py) run as a child process on prl's BLAS core and threads.
*/
#include "cli/bench.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
