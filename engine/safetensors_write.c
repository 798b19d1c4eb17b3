/*
** safetensors_write.c — the safetensors writer: queues borrowed tensor data and copied
** metadata, then emits exactly what the reference writer emits (sort by dtype descending then
** name, compact JSON, space padding to a multiple of 8) either to memory or to a file
** replaced by atomic rename. Every file it writes is one the reader (safetensors_check.c)
** accepts.
*/
#include "engine/safetensors_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- writer ----------- */

void prl_safetensors_writer_init(prl_safetensors_writer *w)
{
    PRL_ASSERT(w);
    memset(w, 0, sizeof *w);
}

void prl_safetensors_writer_free(prl_safetensors_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    for (size_t i = 0; i < w->n_metadata; i++) {
        free(w->metadata_keys[i]);
        free(w->metadata_values[i]);
    }
    free(w->tensors);
    free(w->metadata_keys);
    free(w->metadata_values);
    memset(w, 0, sizeof *w);
}

/* Argument checks of writer_add, so that every file we write is one our reader accepts. */
static prl_status check_new_tensor(const prl_safetensors_writer *w, const char *name,
                                   prl_dtype dtype, const int64_t *shape, int ndim,
                                   const void *data, size_t *nbytes)
{
    char nb[NAME_BUF], sb[SHAPE_BUF];
    if (!name) return prl_error_set(PRL_ERR_ARG, "safetensors writer: NULL tensor name");
    const char *shown = st__printable(nb, sizeof nb, name, strlen(name));
    if (!st__name_valid(name, strlen(name)))
        return prl_error_set(PRL_ERR_ARG,
                             "safetensors writer: invalid tensor name '%s' (must "
                             "be non-empty [A-Za-z0-9._-])",
                             shown);
    if (strcmp(name, "__metadata__") == 0)
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: tensor name '__metadata__' is "
                                          "reserved");
    if (!st__dtype_valid(dtype))
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: tensor '%s': unknown dtype %d",
                             shown, (int)dtype);
    if (ndim < 0 || ndim > PRL_SAFETENSORS_MAX_DIMS || (ndim && !shape))
        return prl_error_set(PRL_ERR_ARG,
                             "safetensors writer: tensor '%s': rank %d not in "
                             "0..%d (or NULL shape)",
                             shown, ndim, PRL_SAFETENSORS_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return prl_error_set(PRL_ERR_ARG,
                                 "safetensors writer: tensor '%s': negative "
                                 "dimension %" PRId64,
                                 shown, shape[i]);
    size_t numel;
    if (!st__shape_bytes(shape, ndim, prl_dtype_size(dtype), &numel, nbytes))
        return prl_error_set(PRL_ERR_ARG,
                             "safetensors writer: tensor '%s': byte size of shape "
                             "%s overflows",
                             shown, st__format_shape(sb, sizeof sb, shape, ndim));
    if (!data && *nbytes)
        return prl_error_set(PRL_ERR_ARG,
                             "safetensors writer: tensor '%s': NULL data for %zu "
                             "bytes",
                             shown, *nbytes);
    /* Linear scan: a checkpoint has a few thousand tensors, so this is ~10^7 strcmp at
    ** worst, negligible next to writing the data. */
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return prl_error_set(PRL_ERR_ARG, "safetensors writer: duplicate tensor name '%s'",
                                 shown);
    return PRL_OK;
}

/* Grow an array of `elem`-byte items so that it holds at least n + 1. */
static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return 1;
    size_t nc = *cap ? *cap * 2 : 16;
    if (nc < *cap || nc > SIZE_MAX / elem) return 0;
    void *p = realloc(*arr, nc * elem);
    if (!p) return 0;
    *arr = p;
    *cap = nc;
    return 1;
}

prl_status prl_safetensors_writer_add(prl_safetensors_writer *w, const char *name, prl_dtype dtype,
                                      const int64_t *shape, int ndim, const void *data)
{
    if (!w) return prl_error_set(PRL_ERR_ARG, "safetensors writer: NULL writer");
    size_t nbytes;
    prl_status rc = check_new_tensor(w, name, dtype, shape, ndim, data, &nbytes);
    if (rc != PRL_OK) return rc;
    char *copy = strdup(name);
    if (!copy || !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors)) {
        free(copy);
        return prl_error_set(PRL_ERR_NOMEM, "safetensors writer: out of memory adding '%s'", name);
    }
    prl_safetensors_wtensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = nbytes;
    t->data = data;
    return PRL_OK;
}

prl_status prl_safetensors_writer_set_metadata(prl_safetensors_writer *w, const char *key,
                                               const char *value)
{
    if (!w || !key || !value)
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: set_metadata: NULL argument");
    char kb[NAME_BUF];
    size_t kl = strlen(key), vl = strlen(value);
    const char *shown = st__printable(kb, sizeof kb, key, kl);
    if (st__utf8_valid_prefix((const uint8_t *)key, kl) != kl)
        return prl_error_set(PRL_ERR_ARG,
                             "safetensors writer: __metadata__ key \"%s\" is not "
                             "valid UTF-8",
                             shown);
    if (st__utf8_valid_prefix((const uint8_t *)value, vl) != vl)
        return prl_error_set(PRL_ERR_ARG,
                             "safetensors writer: __metadata__ value of key \"%s\" "
                             "is not valid UTF-8",
                             shown);
    char *v = strdup(value);
    if (!v) return prl_error_set(PRL_ERR_NOMEM, "safetensors writer: out of memory");
    for (size_t i = 0; i < w->n_metadata; i++)
        if (strcmp(w->metadata_keys[i], key) == 0) {
            free(w->metadata_values[i]);
            w->metadata_values[i] = v;
            return PRL_OK;
        }
    char *k = strdup(key);
    /* keys and values share cap_metadata: grow both before committing the new cap */
    size_t cap = w->cap_metadata, cap2 = w->cap_metadata;
    int ok = k && grow((void **)&w->metadata_keys, &cap, w->n_metadata, sizeof(char *)) &&
             grow((void **)&w->metadata_values, &cap2, w->n_metadata, sizeof(char *));
    if (!ok) {
        free(k);
        free(v);
        return prl_error_set(PRL_ERR_NOMEM, "safetensors writer: out of memory");
    }
    w->cap_metadata = cap;
    w->metadata_keys[w->n_metadata] = k;
    w->metadata_values[w->n_metadata] = v;
    w->n_metadata++;
    return PRL_OK;
}

/* A growable byte string; a failed allocation is sticky and checked once at the end. */
typedef struct {
    char *p;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n)
{
    if (b->failed) return;
    if (n > b->cap - b->len) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc - b->len < n) {
            if (nc > SIZE_MAX / 2) {
                b->failed = 1;
                return;
            }
            nc *= 2;
        }
        char *p = realloc(b->p, nc);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void sb_cstr(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(strbuf *b, uint64_t v)
{
    char tmp[24];
    int k = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    sb_put(b, tmp, (size_t)k);
}

/* A JSON string escaped exactly as serde_json does: \" \\ \b \f \n \r \t, other control
** bytes as \u00xx (lowercase hex), everything else (including UTF-8 and 0x7f) raw. */
static void sb_json_string(strbuf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[7] = {'\\', 0, 0, 0, 0, 0, 0};
        size_t n = 2;
        switch (*p) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            if (*p >= 0x20) {
                sb_put(b, (const char *)p, 1);
                continue;
            }
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[*p >> 4];
            esc[5] = hex[*p & 15];
            n = 6;
        }
        sb_put(b, esc, n);
    }
    sb_put(b, "\"", 1);
}

/* Writer rule 1: dtype descending in enum order, then name ascending byte-wise. */
static int cmp_write_order(const void *a, const void *b)
{
    const prl_safetensors_wtensor *x = *(const prl_safetensors_wtensor *const *)a;
    const prl_safetensors_wtensor *y = *(const prl_safetensors_wtensor *const *)b;
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

typedef struct {
    const char *key, *value;
} meta_item;

static int cmp_meta_item(const void *a, const void *b)
{
    return strcmp(((const meta_item *)a)->key, ((const meta_item *)b)->key);
}

/* Everything the output needs besides the tensor bytes. */
typedef struct {
    uint8_t *head; /* 8-byte N + padded JSON */
    size_t head_len;
    const prl_safetensors_wtensor **order; /* tensors in data order */
    size_t data_len;
} prepared;

static void prepared_free(prepared *p)
{
    free(p->head);
    free(p->order);
    memset(p, 0, sizeof *p);
}

/* Writer rule 3: "__metadata__" first with sorted keys, then the tensors in `order`. */
static void emit_json(strbuf *b, const prl_safetensors_writer *w, const meta_item *meta,
                      const prl_safetensors_wtensor *const *order)
{
    sb_put(b, "{", 1);
    if (w->n_metadata) {
        sb_cstr(b, "\"__metadata__\":{");
        for (size_t i = 0; i < w->n_metadata; i++) {
            if (i) sb_put(b, ",", 1);
            sb_json_string(b, meta[i].key);
            sb_put(b, ":", 1);
            sb_json_string(b, meta[i].value);
        }
        sb_put(b, "}", 1);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const prl_safetensors_wtensor *t = order[i];
        if (i || w->n_metadata) sb_put(b, ",", 1);
        sb_json_string(b, t->name);
        sb_cstr(b, ":{\"dtype\":\"");
        sb_cstr(b, prl_dtype_name(t->dtype));
        sb_cstr(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_put(b, ",", 1);
            sb_u64(b, (uint64_t)t->shape[d]);
        }
        sb_cstr(b, "],\"data_offsets\":[");
        sb_u64(b, offset);
        sb_put(b, ",", 1);
        offset += t->nbytes; /* cannot wrap: prepare() checked the sum */
        sb_u64(b, offset);
        sb_cstr(b, "]}");
    }
    sb_put(b, "}", 1);
}

static prl_status prepare(const prl_safetensors_writer *w, prepared *p)
{
    memset(p, 0, sizeof *p);
    size_t nt = w->n_tensors, nm = w->n_metadata;
    for (size_t i = 0; i < nt; i++) {
        if (w->tensors[i].nbytes > SIZE_MAX - p->data_len)
            return prl_error_set(PRL_ERR_RANGE, "safetensors writer: total data size "
                                                "overflows");
        p->data_len += w->tensors[i].nbytes;
    }
    p->order = malloc((nt ? nt : 1) * sizeof *p->order);
    meta_item *meta = malloc((nm ? nm : 1) * sizeof *meta);
    strbuf b = {0};
    sb_put(&b, "\0\0\0\0\0\0\0\0", 8); /* N, filled in below */
    if (!p->order || !meta || b.failed) {
        free(meta);
        free(b.p);
        prepared_free(p);
        return prl_error_set(PRL_ERR_NOMEM, "safetensors writer: out of memory");
    }
    for (size_t i = 0; i < nt; i++) p->order[i] = &w->tensors[i];
    qsort(p->order, nt, sizeof *p->order, cmp_write_order);
    for (size_t i = 0; i < nm; i++)
        meta[i] = (meta_item){w->metadata_keys[i], w->metadata_values[i]};
    qsort(meta, nm, sizeof *meta, cmp_meta_item);
    emit_json(&b, w, meta, p->order);
    free(meta);
    while (!b.failed && (b.len - 8) % 8 != 0) sb_put(&b, " ", 1); /* writer rule 4 */
    if (b.failed) {
        free(b.p);
        prepared_free(p);
        return prl_error_set(PRL_ERR_NOMEM, "safetensors writer: out of memory building the "
                                            "header");
    }
    uint64_t n = b.len - 8;
    if (n > PRL_SAFETENSORS_MAX_HEADER || p->data_len > SIZE_MAX - b.len) {
        free(b.p);
        prepared_free(p);
        return prl_error_set(PRL_ERR_RANGE,
                             "safetensors writer: header of %" PRIu64 " bytes "
                             "(limit %llu) or total size too large",
                             n, PRL_SAFETENSORS_MAX_HEADER);
    }
    for (int i = 0; i < 8; i++) b.p[i] = (char)(n >> (8 * i));
    p->head = (uint8_t *)b.p;
    p->head_len = b.len;
    return PRL_OK;
}

prl_status prl_safetensors_writer_to_memory(const prl_safetensors_writer *w, uint8_t **out,
                                            size_t *out_len)
{
    if (!w || !out || !out_len)
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: to_memory: NULL argument");
    *out = NULL;
    *out_len = 0;
    prepared p;
    prl_status rc = prepare(w, &p);
    if (rc != PRL_OK) return rc;
    size_t total = p.head_len + p.data_len; /* no wrap: checked in prepare */
    uint8_t *buf = malloc(total);
    if (!buf) {
        prepared_free(&p);
        return prl_error_set(PRL_ERR_NOMEM, "safetensors writer: out of memory for %zu bytes",
                             total);
    }
    memcpy(buf, p.head, p.head_len);
    size_t o = p.head_len;
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (p.order[i]->nbytes) memcpy(buf + o, p.order[i]->data, p.order[i]->nbytes);
        o += p.order[i]->nbytes;
    }
    prepared_free(&p);
    *out = buf;
    *out_len = total;
    return PRL_OK;
}

/* Write head + tensor bytes to a new file `tmp` and make them durable (fflush, fsync).
** On failure the file is removed. */
static prl_status write_temp(const char *tmp, const prepared *p, size_t n_tensors)
{
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return prl_error_set(PRL_ERR_IO, "safetensors: create %s: %s", tmp, strerror(errno));
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return prl_error_set(PRL_ERR_IO, "safetensors: fdopen %s: %s", tmp, strerror(e));
    }
    const char *what = NULL;
    int e = 0;
    if (fwrite(p->head, 1, p->head_len, f) != p->head_len) what = "write";
    for (size_t i = 0; !what && i < n_tensors; i++) {
        size_t nb = p->order[i]->nbytes;
        if (nb && fwrite(p->order[i]->data, 1, nb, f) != nb) what = "write";
    }
    if (!what && fflush(f) != 0) what = "write";
    if (!what && fsync(fileno(f)) != 0) what = "fsync";
    if (what) e = errno;
    if (fclose(f) != 0 && !what) {
        what = "close";
        e = errno;
    }
    if (what) {
        unlink(tmp);
        return prl_error_set(PRL_ERR_IO, "safetensors: %s %s: %s", what, tmp, strerror(e));
    }
    return PRL_OK;
}

/* fsync the directory holding `path`, so that the rename itself survives a crash. A file
** system that cannot sync directories (EINVAL, ENOTSUP) gives no stronger guarantee to
** anyone, so that is not an error. */
static prl_status sync_parent_dir(const char *path)
{
    prl_status rc = prl_file_sync_parent(path);
    return rc ? prl_error_wrap(rc, "safetensors: ") : rc;
}

prl_status prl_safetensors_writer_save(const prl_safetensors_writer *w, const char *path)
{
    if (!w || !path || !*path)
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: save: NULL or empty path");
    prepared p;
    prl_status rc = prepare(w, &p);
    if (rc != PRL_OK) return rc;
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp) {
        prepared_free(&p);
        return prl_error_set(PRL_ERR_NOMEM, "safetensors: out of memory");
    }
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    struct stat sb;
    int existed = lstat(path, &sb) == 0;
    rc = write_temp(tmp, &p, w->n_tensors);
    if (rc == PRL_OK && rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        rc = prl_error_set(PRL_ERR_IO, "safetensors: rename %s -> %s: %s", tmp, path, strerror(e));
    } else if (rc == PRL_OK) {
        rc = sync_parent_dir(path);
        /* The new file is complete but its name may not be durable. Honour the contract
        ** "failure leaves no file that was not there before"; a replaced old file cannot
        ** be brought back, so it stays replaced by the complete new one. */
        if (rc != PRL_OK && !existed) unlink(path);
    }
    free(tmp);
    prepared_free(&p);
    return rc;
}
