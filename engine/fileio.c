/*
** fileio.c — whole-file reading and durable writing, shared by configs, checkpoints,
** safetensors, the tokenizer and the CLI.
**
** Durable means: data fsynced before a rename makes it visible, and the directory fsynced
** after, so a crash leaves the old file or the complete new one, never a torn one. Line
** logs (metrics.jsonl) are appended whole, a torn tail cut before the next line.
*/
#include "engine/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* fsync a directory so that renames and creations in it survive a crash. File systems that
** cannot sync directories (EINVAL, ENOTSUP) give no stronger guarantee to anyone, so that is
** not an error. */
prl_status prl_file_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "open directory %s: %s", dir, strerror(errno));
    prl_status rc = PRL_OK;
    if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)
        rc = prl_error_set(PRL_ERR_IO, "fsync directory %s: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

prl_status prl_file_sync_parent(const char *path)
{
    size_t n = strlen(path);
    char *dir = malloc(n + 2);
    if (!dir) return prl_error_set(PRL_ERR_NOMEM, "syncing the directory of %s", path);
    memcpy(dir, path, n + 1);
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = '\0'; /* "/name" lives in "/" */
    else *slash = '\0';
    prl_status rc = prl_file_sync_dir(dir);
    free(dir);
    return rc;
}

prl_status prl_file_write_sync(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return prl_error_set(PRL_ERR_IO, "write %s: %s", path, strerror(e));
        }
        p += w;
        len -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return prl_error_set(PRL_ERR_IO, "fsync %s: %s", path, strerror(e));
    }
    if (close(fd) != 0) return prl_error_set(PRL_ERR_IO, "close %s: %s", path, strerror(errno));
    return PRL_OK;
}

/* The length of fd's whole lines: just past its last newline (0 without one). */
static prl_status whole_lines_length(int fd, off_t size, const char *path, off_t *out)
{
    char buf[4096];
    for (off_t end = size; end > 0;) {
        off_t start = end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0;
        ssize_t got = pread(fd, buf, (size_t)(end - start), start);
        if (got != end - start)
            return prl_error_set(PRL_ERR_IO, "read %s: %s", path, strerror(errno));
        for (ssize_t i = got - 1; i >= 0; i--)
            if (buf[i] == '\n') {
                *out = start + i + 1;
                return PRL_OK;
            }
        end = start;
    }
    *out = 0;
    return PRL_OK;
}

/* Append line + newline at the end of fd in one write. A short write leaves a torn tail,
** which the next append cuts. */
static prl_status write_line(int fd, const char *line, const char *path)
{
    size_t n = strlen(line);
    char *text = malloc(n + 2);
    if (!text) return prl_error_set(PRL_ERR_NOMEM, "appending to %s", path);
    memcpy(text, line, n);
    text[n] = '\n';
    off_t at = lseek(fd, 0, SEEK_END);
    ssize_t w = at < 0 ? -1 : pwrite(fd, text, n + 1, at);
    free(text);
    if (w != (ssize_t)(n + 1))
        return prl_error_set(PRL_ERR_IO, "write %s: %s", path, strerror(errno));
    return PRL_OK;
}

prl_status prl_file_append_line(const char *path, const char *line)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    off_t whole = 0;
    prl_status rc = fstat(fd, &sb) == 0
                        ? whole_lines_length(fd, sb.st_size, path, &whole)
                        : prl_error_set(PRL_ERR_IO, "stat %s: %s", path, strerror(errno));
    if (rc == PRL_OK && whole < sb.st_size && ftruncate(fd, whole) != 0)
        rc = prl_error_set(PRL_ERR_IO, "truncate %s: %s", path, strerror(errno));
    if (rc == PRL_OK && line) rc = write_line(fd, line, path);
    if (close(fd) != 0 && rc == PRL_OK)
        rc = prl_error_set(PRL_ERR_IO, "close %s: %s", path, strerror(errno));
    return rc;
}

prl_status prl_file_write_atomic(const char *path, const void *data, size_t len)
{
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp) return prl_error_set(PRL_ERR_NOMEM, "writing %s", path);
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    prl_status rc = prl_file_write_sync(tmp, data, len);
    if (rc == PRL_OK && rename(tmp, path) != 0)
        rc = prl_error_set(PRL_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    else rc = prl_file_sync_parent(path);
    free(tmp);
    return rc;
}
