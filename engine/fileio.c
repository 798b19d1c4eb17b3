/*
** fileio.c — whole-file reading shared by the config loader, checkpoints and the CLI.
*/
#include "engine/engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

prl_status prl_file_read(const char *path, char **text, size_t *len)
{
    *text = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return prl_error_set(PRL_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger) free(buf);
            buf = bigger;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return prl_error_set(PRL_ERR_NOMEM, "reading %s", path);
    if (err) {
        free(buf);
        return prl_error_set(PRL_ERR_IO, "read error in %s", path);
    }
    buf[n] = 0;
    *text = buf;
    if (len) *len = n;
    return PRL_OK;
}
