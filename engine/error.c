/*
** error.c — status codes, the thread-local error message, assertions, checked allocation.
**
** Library functions report failure as a negative prl_status plus a message that names the
** offending thing (file, key, value); tools print prl_error_message() and exit non-zero.
*/
#include "engine/engine.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char error_message[1024];

prl_status prl_error_set(prl_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return code;
}

prl_status prl_error_wrap(prl_status code, const char *fmt, ...)
{
    char old[sizeof error_message];
    memcpy(old, error_message, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof error_message)
        snprintf(error_message + n, sizeof error_message - (size_t)n, "%s", old);
    return code;
}

const char *prl_error_message(void) { return error_message; }

const char *prl_status_name(prl_status code)
{
    switch (code) {
    case PRL_OK: return "PRL_OK";
    case PRL_ERR_NOMEM: return "PRL_ERR_NOMEM";
    case PRL_ERR_IO: return "PRL_ERR_IO";
    case PRL_ERR_FORMAT: return "PRL_ERR_FORMAT";
    case PRL_ERR_CONFIG: return "PRL_ERR_CONFIG";
    case PRL_ERR_RANGE: return "PRL_ERR_RANGE";
    case PRL_ERR_UNSUPPORTED: return "PRL_ERR_UNSUPPORTED";
    case PRL_ERR_ARG: return "PRL_ERR_ARG";
    case PRL_ERR_NUMERIC: return "PRL_ERR_NUMERIC";
    case PRL_ERR_CHECKSUM: return "PRL_ERR_CHECKSUM";
    }
    return "PRL_ERR_UNKNOWN";
}

void prl_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "prl: assertion failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}

void *prl_xmalloc_at(size_t n, const char *file, int line)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "prl: out of memory allocating %zu bytes (%s:%d)\n", n, file, line);
        exit(1);
    }
    return p;
}

void *prl_xcalloc_at(size_t n, size_t size, const char *file, int line)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "prl: out of memory allocating %zu x %zu bytes (%s:%d)\n", n, size, file,
                line);
        exit(1);
    }
    return p;
}

int prl_edit_distance(const char *a, const char *b)
{
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}
