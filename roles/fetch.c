/*
** fetch.c — weights over the bus, the worker's side (internal.h, docs/scale-out.md "Several
** hosts"): policy version v is copied from the controller into a local cache, file by file
** in chunks (`fetch` → `chunk`, roles/msg/fetch.c), into cache/vNNNNNN.tmp-PID, then
** checked as a whole and renamed to cache/vNNNNNN. So a worker on another host needs no
** shared disk, and a torn transfer never becomes a version:
**   - each chunk must be the piece asked for, of the length the file's size implies, with
**     the checksum the controller computed from its bytes; otherwise it is asked for again;
**   - the whole must hash to the version's weights checksum and pass prl_checkpoint_verify
**     (config, tokenizer, the safetensors offsets and checksum); otherwise it is fetched
**     again from the start.
*/
#include "roles/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CHUNK = 1 << 20, CHUNK_TRIES = 5, WHOLE_TRIES = 3, WAIT_S = 10 };

/* Wait for the chunk answering fetch `id` (other control messages handled as usual). */
static prl_status await_chunk(prl_worker *w, uint64_t id, prl_bus_msg *m, prl_msg_chunk *ch)
{
    double end = prl_now() + WAIT_S;
    while (!prl_worker_stopping(w)) {
        if (prl_now() > end)
            return prl_error_set(PRL_ERR_IO, "no chunk from the controller within %d s", WAIT_S);
        int got = 0;
        prl_status rc = prl_bus_recv(w->ctl, 200, m, NULL, &got);
        if (rc) return rc;
        if (!got) continue;
        if (!strcmp(m->type, "chunk")) {
            if (!prl_msg_chunk_decode(m, ch) && ch->ref == id) return PRL_OK;
            prl_bus_msg_free(m);
            continue; /* a late answer to an earlier try */
        }
        prl_msg_error e;
        if (!strcmp(m->type, "error") && !prl_msg_error_decode(m, &e) && e.ref == id) {
            rc = prl_error_set(PRL_ERR_ARG, "the controller cannot serve it: %s", e.reason);
            prl_bus_msg_free(m);
            return rc;
        }
        if (prl_worker_control(w, m, &rc)) {
            if (rc) return rc;
            continue;
        }
        prl_worker_log(w, "ignored a '%s' message while fetching weights", m->type);
        prl_bus_msg_free(m);
    }
    return prl_error_set(PRL_ERR_IO, "stopped while fetching weights");
}

/* Why chunk ch is not the piece asked for (NULL: it is). */
static const char *chunk_bad(const prl_msg_chunk *ch, uint64_t v, const char *file, uint64_t off)
{
    if (ch->version != v || strcmp(ch->file, file) || ch->offset != off)
        return "not the piece asked for";
    uint64_t want = ch->size > off ? ch->size - off : 0;
    if (want > CHUNK) want = CHUNK;
    if (ch->len != want) return "truncated";
    if (prl_checksum64(ch->data, ch->len, 0) != ch->sum) return "corrupted (checksum)";
    return NULL;
}

typedef struct fetch_state {
    uint64_t version, ckpt_checksum;
    int have_checksum;
    uint64_t chunks, refetched;
} fetch_state;

/* Ask for the piece at off until a good one arrives; it is written to fd. *size: the file's. */
static prl_status fetch_piece(prl_worker *w, fetch_state *st, const char *file, uint64_t off,
                              int fd, uint64_t *size)
{
    for (int t = 0; t < CHUNK_TRIES; t++) {
        uint64_t id = ++w->next_id;
        prl_msg_fetch f = {.version = st->version, .file = file, .offset = off, .length = CHUNK};
        prl_bus_msg q, m;
        prl_msg_chunk ch;
        prl_status rc = prl_msg_fetch_encode(&f, w->run, id, &q);
        if (!rc) rc = prl_worker_send(w, &q);
        if (!rc) rc = await_chunk(w, id, &m, &ch);
        if (rc == PRL_ERR_ARG || (rc && prl_worker_stopping(w))) return rc;
        const char *bad = rc ? prl_error_message() : chunk_bad(&ch, st->version, file, off);
        if (!bad && st->have_checksum && ch.ckpt_checksum != st->ckpt_checksum)
            bad = "the version's checksum changed";
        if (!bad) {
            st->ckpt_checksum = ch.ckpt_checksum, st->have_checksum = 1;
            *size = ch.size;
            ssize_t k = ch.len ? pwrite(fd, ch.data, ch.len, (off_t)off) : 0;
            rc = k == (ssize_t)ch.len
                     ? PRL_OK
                     : prl_error_set(PRL_ERR_IO, "writing %s: %s", file, strerror(errno));
            prl_bus_msg_free(&m);
            st->chunks++;
            return rc;
        }
        char why[300];
        snprintf(why, sizeof why, "%s", bad);
        if (!rc) prl_bus_msg_free(&m);
        st->refetched++;
        prl_worker_log(w, "weights v%llu: chunk %s@%llu %s: fetching it again",
                       (unsigned long long)st->version, file, (unsigned long long)off, why);
    }
    return prl_error_set(PRL_ERR_IO, "weights v%llu: chunk %s@%llu failed %d times",
                         (unsigned long long)st->version, file, (unsigned long long)off,
                         CHUNK_TRIES);
}

static prl_status fetch_file(prl_worker *w, fetch_state *st, const char *dir, const char *file)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "%s: %s", path, strerror(errno));
    uint64_t size = 0, off = 0;
    prl_status rc = PRL_OK;
    do {
        rc = fetch_piece(w, st, file, off, fd, &size);
        off += CHUNK;
    } while (!rc && off < size);
    if (!rc && fsync(fd)) rc = prl_error_set(PRL_ERR_IO, "fsync %s: %s", path, strerror(errno));
    close(fd);
    return rc;
}

/* Remove a temporary version directory this process made (its known files only). */
static void remove_tmp(const char *dir)
{
    char path[1300];
    for (int i = 0; prl_msg_fetch_file(i); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, prl_msg_fetch_file(i));
        unlink(path);
    }
    rmdir(dir);
}

/* dir holds version st: its weights hash to the announced checksum and it verifies. */
static int version_ok(const char *dir, const fetch_state *st)
{
    uint64_t h = 0;
    return prl_checkpoint_weights_hash(dir, 0, &h) == PRL_OK && h == st->ckpt_checksum &&
           prl_checkpoint_verify(dir) == PRL_OK;
}

/* One whole fetch into tmp; PRL_ERR_FORMAT when it arrived but is not the version. */
static prl_status fetch_whole(prl_worker *w, fetch_state *st, const char *tmp)
{
    if (mkdir(tmp, 0755)) return prl_error_set(PRL_ERR_IO, "%s: %s", tmp, strerror(errno));
    prl_status rc = PRL_OK;
    st->have_checksum = 0;
    for (int i = 0; !rc && prl_msg_fetch_file(i); i++)
        rc = fetch_file(w, st, tmp, prl_msg_fetch_file(i));
    if (!rc && !version_ok(tmp, st))
        rc = prl_error_set(PRL_ERR_FORMAT,
                           "weights v%llu: the files do not hash to the version's checksum "
                           "%016llx or do not verify",
                           (unsigned long long)st->version, (unsigned long long)st->ckpt_checksum);
    if (rc) remove_tmp(tmp);
    return rc;
}

/* The version's checksum: the first piece of config.json says it. */
static prl_status probe(prl_worker *w, fetch_state *st, const char *tmp)
{
    char path[1300];
    snprintf(path, sizeof path, "%s.probe", tmp);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "%s: %s", path, strerror(errno));
    uint64_t size;
    prl_status rc = fetch_piece(w, st, "config.json", 0, fd, &size);
    close(fd);
    unlink(path);
    return rc;
}

prl_status prl_worker_fetch_version(prl_worker *w, const char *cache, uint64_t v, char *out,
                                    size_t n)
{
    char final[1100], tmp[1200];
    snprintf(final, sizeof final, "%s/v%06llu", cache, (unsigned long long)v);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", final, (int)getpid());
    snprintf(out, n, "%s", final);
    if (mkdir(cache, 0755) && errno != EEXIST)
        return prl_error_set(PRL_ERR_IO, "cache %s: %s", cache, strerror(errno));
    fetch_state st = {.version = v};
    struct stat sb;
    double t0 = prl_now();
    prl_status rc = PRL_OK;
    if (!stat(final, &sb)) { /* fetched before (by an earlier process, maybe) */
        if ((rc = probe(w, &st, tmp))) return rc;
        if (version_ok(final, &st)) return PRL_OK;
        char aside[1200];
        snprintf(aside, sizeof aside, "%s.bad-%d", final, (int)getpid());
        prl_worker_log(w, "%s is not version %llu: moved aside to %s", final, (unsigned long long)v,
                       aside);
        if (rename(final, aside))
            return prl_error_set(PRL_ERR_IO, "rename %s: %s", final, strerror(errno));
    }
    for (int t = 0; t < WHOLE_TRIES; t++) {
        rc = fetch_whole(w, &st, tmp);
        if (rc != PRL_ERR_FORMAT) break;
        st.refetched++;
        prl_worker_log(w, "%s: fetching the version again", prl_error_message());
    }
    if (!rc && rename(tmp, final)) {
        rc = prl_error_set(PRL_ERR_IO, "rename %s: %s", tmp, strerror(errno));
        remove_tmp(tmp);
    }
    if (!rc)
        prl_worker_log(w,
                       "fetched policy version %llu over the bus: %llu chunks in %.2f s, %llu "
                       "fetched again, checksum %016llx verified",
                       (unsigned long long)v, (unsigned long long)st.chunks, prl_now() - t0,
                       (unsigned long long)st.refetched, (unsigned long long)st.ckpt_checksum);
    return rc;
}
