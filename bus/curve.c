/*
** curve.c — the keys of a bus off loopback: ZeroMQ CURVE keypairs (`prl keys generate`) and
** a binding socket's allow-list of client public keys (docs/protocol.md "Hosts elsewhere").
**
** Keys are Z85 text (40 characters for 32 bytes). A keypair is a directory holding
** public.key (0644) and secret.key (0600, read only when no one else can read it); an
** allow-list is a text file of public keys, one a line ('#' comments and blank lines
** ignored; text after the key on its line is a comment). The handshake itself and the
** allow-list check are libzmq's and auth.c's: this file only makes and reads the files.
*/
#include "bus/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

prl_status prl_bus_curve_available(void)
{
    if (zmq_has("curve")) return PRL_OK;
    return prl_error_set(PRL_ERR_UNSUPPORTED,
                         "bus: this libzmq was built without CURVE (zmq_has(\"curve\") is 0): "
                         "endpoints off loopback need it (install a libzmq with libsodium)");
}

/* 1 when s[0..40) is Z85 text that decodes to 32 bytes (into raw when not NULL). */
static int z85_key_ok(const char *s, size_t n, uint8_t *raw)
{
    if (n != PRL_BUS_CURVE_Z85) return 0;
    char text[PRL_BUS_CURVE_Z85 + 1];
    memcpy(text, s, PRL_BUS_CURVE_Z85);
    text[PRL_BUS_CURVE_Z85] = 0;
    uint8_t tmp[32];
    return zmq_z85_decode(raw ? raw : tmp, text) != NULL;
}

int prl_bus_curve_key_ok(const char *z85) { return z85 && z85_key_ok(z85, strlen(z85), NULL); }

/* Write `text` to a new file `path` (O_EXCL) of `mode`; on failure nothing is left. */
static prl_status write_new(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "keys: %s: %s", path, strerror(errno));
    size_t n = strlen(text);
    int bad = write(fd, text, n) != (ssize_t)n || fsync(fd) != 0;
    int e = errno;
    close(fd);
    if (bad) {
        unlink(path);
        return prl_error_set(PRL_ERR_IO, "keys: writing %s: %s", path, strerror(e));
    }
    return PRL_OK;
}

static void key_paths(const char *dir, char *pub, char *sec, size_t n)
{
    snprintf(pub, n, "%s/public.key", dir);
    snprintf(sec, n, "%s/secret.key", dir);
}

prl_status prl_bus_curve_generate(const char *dir, prl_bus_curve_keypair *out)
{
    prl_status rc = prl_bus_curve_available();
    if (rc) return rc;
    char pub[1100], sec[1100];
    key_paths(dir, pub, sec, sizeof pub);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return prl_error_set(PRL_ERR_IO, "keys: %s is not a directory", dir);
    if (!lstat(pub, &sb) || !lstat(sec, &sb))
        return prl_error_set(PRL_ERR_IO,
                             "keys: %s already holds a keypair (public.key or "
                             "secret.key): nothing written",
                             dir);
    prl_bus_curve_keypair kp;
    if (zmq_curve_keypair(kp.public_z85, kp.secret_z85) != 0)
        return prl_error_set(PRL_ERR_IO, "keys: zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    char line[PRL_BUS_CURVE_Z85 + 2];
    snprintf(line, sizeof line, "%s\n", kp.secret_z85);
    if ((rc = write_new(sec, line, 0600))) return rc;
    snprintf(line, sizeof line, "%s\n", kp.public_z85);
    if ((rc = write_new(pub, line, 0644))) {
        unlink(sec); /* made by this call */
        return rc;
    }
    if (out) *out = kp;
    return PRL_OK;
}

/* The one key of file `path` into out[41]; `secret`: the file must be its owner's alone. */
static prl_status read_key(const char *path, int secret, char *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "keys: %s: %s", path, strerror(errno));
    struct stat sb;
    char text[PRL_BUS_CURVE_Z85 + 4];
    ssize_t n = fstat(fd, &sb) == 0 ? read(fd, text, sizeof text) : -1;
    close(fd);
    if (n < 0) return prl_error_set(PRL_ERR_IO, "keys: %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return prl_error_set(PRL_ERR_CONFIG, "keys: %s is not a regular file", path);
    if (secret && (sb.st_mode & 077))
        return prl_error_set(PRL_ERR_CONFIG,
                             "keys: %s can be read by others (mode %04o): chmod 600 it", path,
                             (unsigned)(sb.st_mode & 07777));
    if (n > PRL_BUS_CURVE_Z85 && text[PRL_BUS_CURVE_Z85] == '\n') n--;
    if (!z85_key_ok(text, (size_t)n, NULL))
        return prl_error_set(PRL_ERR_FORMAT, "keys: %s: want one Z85 key of %d characters", path,
                             PRL_BUS_CURVE_Z85);
    memcpy(out, text, PRL_BUS_CURVE_Z85);
    out[PRL_BUS_CURVE_Z85] = 0;
    return PRL_OK;
}

prl_status prl_bus_curve_public_load(const char *path, char out[PRL_BUS_CURVE_Z85 + 1])
{
    return read_key(path, 0, out);
}

prl_status prl_bus_curve_load(const char *dir, prl_bus_curve_keypair *out)
{
    memset(out, 0, sizeof *out);
    prl_status rc = prl_bus_curve_available();
    if (rc) return rc;
    char pub[1100], sec[1100], derived[PRL_BUS_CURVE_Z85 + 1];
    key_paths(dir, pub, sec, sizeof pub);
    if ((rc = read_key(sec, 1, out->secret_z85)) || (rc = read_key(pub, 0, out->public_z85)))
        return rc;
    if (zmq_curve_public(derived, out->secret_z85) != 0 || strcmp(derived, out->public_z85)) {
        memset(out, 0, sizeof *out);
        return prl_error_set(PRL_ERR_FORMAT, "keys: %s and %s are not one keypair", pub, sec);
    }
    return PRL_OK;
}

void prl_bus_curve_allow_free(prl_bus_curve_allow *a)
{
    if (!a) return;
    free(a->keys);
    memset(a, 0, sizeof *a);
}

/* One line of an allow-list: 0 blank or comment, 1 a key (into a), -1 bad (error set). */
static int allow_line(prl_bus_curve_allow *a, const char *path, int lineno, char *line)
{
    char *p = line + strspn(line, " \t");
    size_t n = strcspn(p, " \t\r\n");
    if (n == 0 || *p == '#') return 0;
    if (!z85_key_ok(p, n, NULL)) {
        prl_error_set(PRL_ERR_FORMAT, "keys: %s line %d: not a Z85 public key of %d characters",
                      path, lineno, PRL_BUS_CURVE_Z85);
        return -1;
    }
    if (a->n >= PRL_BUS_CURVE_MAX_CLIENTS) {
        prl_error_set(PRL_ERR_FORMAT, "keys: %s: more than %d keys", path,
                      PRL_BUS_CURVE_MAX_CLIENTS);
        return -1;
    }
    memcpy(a->keys[a->n].z85, p, PRL_BUS_CURVE_Z85);
    a->keys[a->n].z85[PRL_BUS_CURVE_Z85] = 0;
    a->n++;
    return 1;
}

prl_status prl_bus_curve_allow_load(const char *path, prl_bus_curve_allow *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "re");
    if (!f) return prl_error_set(PRL_ERR_IO, "keys: allow-list %s: %s", path, strerror(errno));
    out->keys = calloc(PRL_BUS_CURVE_MAX_CLIENTS, sizeof *out->keys);
    if (!out->keys) {
        fclose(f);
        return prl_error_set(PRL_ERR_NOMEM, "keys: allow-list");
    }
    char line[512];
    int lineno = 0, bad = 0;
    while (!bad && fgets(line, sizeof line, f)) bad = allow_line(out, path, ++lineno, line) < 0;
    fclose(f);
    if (bad) {
        prl_bus_curve_allow_free(out);
        return PRL_ERR_FORMAT;
    }
    return PRL_OK;
}

int prl_bus_curve_allow_has(const prl_bus_curve_allow *a, const uint8_t key[32])
{
    for (int i = 0; a && i < a->n; i++) {
        uint8_t raw[32];
        if (z85_key_ok(a->keys[i].z85, PRL_BUS_CURVE_Z85, raw) && !memcmp(raw, key, 32)) return 1;
    }
    return 0;
}
