/*
** remote.c — the controller's side of workers on other hosts (docs/scale-out.md "Several
** hosts"): the run's tcp:// endpoint (bus.bind) besides the ipc:// one, as a CURVE server
** whose allow-list of worker public keys is read again when its file changes (a host joins
** by adding its key), and the weights served over the bus in chunks (`fetch` → `chunk`), so
** that a worker elsewhere needs no shared disk.
**
** PRL_WEIGHTS_FAULT=corrupt:N,truncate:M (tests only) spoils the N-th (M-th) chunk of
** model.safetensors this process serves, once: a flipped byte, or half the bytes, under the
** checksum of the real ones. The worker must notice and fetch it again.
*/
#include "roles/controller/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int64_t mtime_ns(const char *path)
{
    struct stat sb;
    if (stat(path, &sb)) return -1;
    return (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
}

/* Read the allow-list again when its file changed (or appeared). A bad file keeps the list
** that was there, logged. */
static void reload_allow(ctl *c, int first)
{
    int64_t t = mtime_ns(c->allow_path);
    if (!first && t == c->allow_mtime) return;
    c->allow_mtime = t;
    prl_bus_curve_allow a;
    if (t < 0) {
        if (first)
            ctl_log("%s does not exist yet: no worker off this host is accepted until it "
                    "lists their public keys",
                    c->allow_path);
        memset(&a, 0, sizeof a);
    } else if (prl_bus_curve_allow_load(c->allow_path, &a)) {
        ctl_log("kept the allow-list: %s", prl_error_message());
        return;
    }
    if (prl_bus_socket_allow_curve(c->sock, &a)) ctl_log("allow-list: %s", prl_error_message());
    else if (t >= 0)
        ctl_log("allow-list %s: %d worker key%s", c->allow_path, a.n, a.n == 1 ? "" : "s");
    prl_bus_curve_allow_free(&a);
}

/* PRL_WEIGHTS_FAULT="corrupt:N,truncate:M,..." (at most CTL_FAULTS entries). */
static void fault_from_env(ctl *c)
{
    const char *v = getenv("PRL_WEIGHTS_FAULT");
    for (const char *p = v; p && *p && c->n_faults < CTL_FAULTS;) {
        const char *colon = strchr(p, ':');
        int at = colon ? atoi(colon + 1) : 0, kind = 0;
        if (at > 0 && !strncmp(p, "corrupt:", 8)) kind = 1;
        else if (at > 0 && !strncmp(p, "truncate:", 9)) kind = 2;
        if (!kind) {
            ctl_log("ignored PRL_WEIGHTS_FAULT='%s' (corrupt:N or truncate:N, comma-separated)", v);
            c->n_faults = 0;
            return;
        }
        c->fault_kind[c->n_faults] = kind, c->fault_at[c->n_faults++] = at;
        p = strchr(p, ',');
        if (p) p++;
    }
}

prl_status ctl_remote_open(ctl *c)
{
    const prl_job_config *j = c->job;
    fault_from_env(c);
    if (!*j->bus_bind) return PRL_OK;
    if (!*j->bus_keys) { /* loopback (job.c checks): the run's secret, as on ipc:// */
        prl_status rc = prl_bus_socket_bind_curve(c->sock, j->bus_bind, NULL, NULL);
        if (!rc) ctl_log("also listening at %s (the run's bus key)", j->bus_bind);
        return rc;
    }
    prl_status rc = prl_bus_curve_load(j->bus_keys, &c->curve);
    if (rc) return prl_error_wrap(rc, "bus.keys: ");
    if (*j->bus_authorized_keys)
        snprintf(c->allow_path, sizeof c->allow_path, "%s", j->bus_authorized_keys);
    else snprintf(c->allow_path, sizeof c->allow_path, "%s/authorized_keys", c->o->run_dir);
    if ((rc = prl_bus_socket_bind_curve(c->sock, j->bus_bind, &c->curve, NULL))) return rc;
    c->remote = 1;
    ctl_log("also listening at %s (CURVE, server key %s)", j->bus_bind, c->curve.public_z85);
    reload_allow(c, 1);
    return PRL_OK;
}

void ctl_remote_tick(ctl *c)
{
    if (c->remote) reload_allow(c, 0);
}

/* The directory and weights checksum of committed version v (cached: a version's files do
** not change once committed). */
static prl_status version_source(ctl *c, int64_t v, char *dir, size_t n, uint64_t *sum)
{
    for (int i = 0; i < CTL_SERVED; i++)
        if (c->served[i].used && c->served[i].version == v) {
            snprintf(dir, n, "%s", c->served[i].path);
            *sum = c->served[i].sum;
            return PRL_OK;
        }
    if (v > c->version)
        return prl_error_set(PRL_ERR_RANGE, "version %lld is not committed", (long long)v);
    if (v == c->version) snprintf(dir, n, "%s", c->version_path);
    else {
        prl_store_version sv;
        prl_status rc = prl_store_version_before(c->db, c->run, v + 1, &sv);
        if (rc || sv.version != v) {
            if (!rc) prl_store_version_free(&sv);
            return prl_error_set(PRL_ERR_RANGE, "version %lld is not in run.db", (long long)v);
        }
        snprintf(dir, n, "%s", sv.path);
        prl_store_version_free(&sv);
    }
    prl_status rc = prl_checkpoint_weights_hash(dir, 0, sum);
    if (rc) return rc;
    int slot = c->served_next++ % CTL_SERVED;
    c->served[slot].used = 1, c->served[slot].version = v, c->served[slot].sum = *sum;
    snprintf(c->served[slot].path, sizeof c->served[slot].path, "%s", dir);
    return PRL_OK;
}

/* Read up to want bytes at off of dir/file into buf: *got bytes, *size the file's size. */
static prl_status read_piece(const char *dir, const char *file, uint64_t off, size_t want,
                             uint8_t *buf, size_t *got, uint64_t *size)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    prl_status rc = PRL_OK;
    *got = 0;
    if (fstat(fd, &sb)) rc = prl_error_set(PRL_ERR_IO, "%s: %s", path, strerror(errno));
    *size = rc ? 0 : (uint64_t)sb.st_size;
    if (!rc && off < *size) {
        size_t n = *size - off < want ? (size_t)(*size - off) : want;
        ssize_t k = pread(fd, buf, n, (off_t)off);
        if (k != (ssize_t)n) rc = prl_error_set(PRL_ERR_IO, "%s: short read", path);
        else *got = n;
    }
    close(fd);
    return rc;
}

/* The test faults on the chunk about to be sent (each once). */
static void spoil(ctl *c, const char *file, uint8_t *buf, size_t *len)
{
    if (!c->n_faults || strcmp(file, "model.safetensors") || *len < 2) return;
    int n = ++c->fault_seen;
    for (int i = 0; i < c->n_faults; i++) {
        if (c->fault_at[i] != n) continue;
        if (c->fault_kind[i] == 1) buf[*len / 2] ^= 0x40;
        else *len /= 2;
        ctl_log("PRL_WEIGHTS_FAULT: %s chunk %d of model.safetensors",
                c->fault_kind[i] == 1 ? "corrupted" : "truncated", n);
    }
}

void ctl_on_fetch(ctl *c, worker *w, const prl_bus_msg *m, uint64_t id)
{
    prl_msg_fetch x;
    char dir[1024];
    uint64_t sum = 0, size = 0;
    prl_status rc = prl_msg_fetch_decode(m, &x);
    if (!rc) rc = version_source(c, (int64_t)x.version, dir, sizeof dir, &sum);
    uint8_t *buf = rc ? NULL : malloc((size_t)x.length);
    size_t len = 0;
    if (!rc && !buf)
        rc = prl_error_set(PRL_ERR_NOMEM, "a chunk of %llu bytes", (unsigned long long)x.length);
    if (!rc) rc = read_piece(dir, x.file, x.offset, (size_t)x.length, buf, &len, &size);
    if (rc) {
        ctl_send_error(c, &w->peer, id, "fetch: %s", prl_error_message());
        free(buf);
        return;
    }
    prl_msg_chunk ch = {.ref = id,
                        .version = x.version,
                        .file = x.file,
                        .offset = x.offset < size ? x.offset : size,
                        .size = size,
                        .sum = prl_checksum64(buf, len, 0),
                        .ckpt_checksum = sum,
                        .data = buf,
                        .len = len};
    spoil(c, x.file, buf, &ch.len);
    prl_bus_msg out;
    if (!prl_msg_chunk_encode(&ch, c->job->name, ++c->next_id, &out)) ctl_send_msg(c, w, &out);
    c->chunks_served++;
    free(buf);
}
