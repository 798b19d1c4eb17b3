/*
** safetensors.c — a strict safetensors reader and a byte-exact, atomic writer.
**
** Reader: the file is taken as one byte range (a caller's buffer or an mmap). Everything
** the reference implementation (huggingface/safetensors tensor.rs) rejects is rejected
** here too, in its order — length prefix, header bounds, UTF-8, JSON, offsets after
** sorting, sizes with overflow checks, exact coverage of the data buffer — plus the
** project rules: duplicate JSON keys, unknown entry fields, tensor names outside
** [A-Za-z0-9._-], more than 8 dimensions, anything but spaces around the JSON object.
** The JSON itself is parsed by jansson; this file checks the document's structure.
**
** Writer: queues borrowed tensor data and copied metadata, then emits exactly what the
** reference writer emits (sort by dtype descending then name, compact JSON, space padding
** to a multiple of 8) either to memory or to a file replaced by atomic rename.
**
** Not here: interpreting tensors (the model loader does that with read_f32/read_f64),
** big-endian hosts (the format is little-endian and so is every target machine; the
** converters load bytes explicitly anyway).
*/
#include "engine/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- dtypes ----------- */

static const struct {
    const char *name;
    size_t size;
} dtype_table[PRL_DTYPE_COUNT] = {
    [PRL_DTYPE_BOOL] = {"BOOL", 1},       [PRL_DTYPE_U8] = {"U8", 1},
    [PRL_DTYPE_I8] = {"I8", 1},           [PRL_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [PRL_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [PRL_DTYPE_I16] = {"I16", 2},
    [PRL_DTYPE_U16] = {"U16", 2},         [PRL_DTYPE_F16] = {"F16", 2},
    [PRL_DTYPE_BF16] = {"BF16", 2},       [PRL_DTYPE_I32] = {"I32", 4},
    [PRL_DTYPE_U32] = {"U32", 4},         [PRL_DTYPE_F32] = {"F32", 4},
    [PRL_DTYPE_F64] = {"F64", 8},         [PRL_DTYPE_I64] = {"I64", 8},
    [PRL_DTYPE_U64] = {"U64", 8},
};

static int dtype_valid(prl_dtype d) { return (int)d >= 0 && d < PRL_DTYPE_COUNT; }

const char *prl_dtype_name(prl_dtype dtype)
{
    return dtype_valid(dtype) ? dtype_table[dtype].name : NULL;
}

size_t prl_dtype_size(prl_dtype dtype)
{
    return dtype_valid(dtype) ? dtype_table[dtype].size : 0;
}

prl_dtype prl_dtype_from_name(const char *name)
{
    for (int d = 0; d < PRL_DTYPE_COUNT; d++)
        if (name && strcmp(name, dtype_table[d].name) == 0) return (prl_dtype)d;
    return PRL_DTYPE_COUNT;
}

/* ---------------------------------------------------------------- helpers ---------- */

/* Length of the longest valid UTF-8 prefix of s[0..n) (RFC 3629: no overlong forms, no
** surrogates, nothing above U+10FFFF); n means the whole range is valid. */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0; /* overlong */
            if (c == 0xED) hi = 0x9F; /* UTF-16 surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90; /* overlong */
            if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
        } else {
            return i; /* continuation byte, C0/C1 or F5..FF as a lead byte */
        }
        if (n - i < len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}

/* A printable, bounded rendering of a possibly hostile name for error messages: bytes
** outside printable ASCII (and the backslash, to keep escapes unambiguous) become \xHH and
** long names are cut with "...", so a 100 MB key or a control character cannot garble or
** crowd out the message. Returns buf. */
static const char *printable(char *buf, size_t cap, const char *s, size_t n)
{
    size_t o = 0;
    PRL_ASSERT(cap >= 8);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t need = (c >= 0x20 && c < 0x7F && c != '\\') ? 1 : 4;
        if (o + need + 4 > cap) {
            memcpy(buf + o, "...", 4);
            return buf;
        }
        if (need == 1)
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

#define NAME_BUF 96 /* room for printable() renderings of names in messages */

/* "[1,2,3]"; "[...]" if it does not fit (SHAPE_BUF always fits PRL_SAFETENSORS_MAX_DIMS
** dimensions: 8 x 21 characters + brackets). Returns buf. */
static const char *format_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t o = 0;
    buf[o++] = '[';
    for (int i = 0; i < ndim; i++) {
        int k = snprintf(buf + o, cap - o, "%s%" PRId64, i ? "," : "", shape[i]);
        if (k < 0 || (size_t)k >= cap - o) {
            snprintf(buf, cap, "[...]");
            return buf;
        }
        o += (size_t)k;
    }
    if (o + 2 > cap) {
        snprintf(buf, cap, "[...]");
        return buf;
    }
    buf[o++] = ']';
    buf[o] = '\0';
    return buf;
}

#define SHAPE_BUF (PRL_SAFETENSORS_MAX_DIMS * 21 + 4)

/* Project rule: tensor names are non-empty [A-Za-z0-9._-], so they never need JSON
** escaping, are safe in file names and messages, and compare the same everywhere. */
static int name_valid(const char *s, size_t n)
{
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

/* Element count and byte size of a shape, multiplied left to right with overflow checks
** in the reference's order (so [2^62, 2^62, 0] overflows there and here alike). */
static int shape_bytes(const int64_t *shape, int ndim, size_t elem, size_t *numel,
                       size_t *nbytes)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d) return 0;
        n *= d;
    }
    if (n > SIZE_MAX || (elem && n > SIZE_MAX / elem)) return 0;
    *numel = (size_t)n;
    *nbytes = (size_t)n * elem;
    return 1;
}

static uint64_t load_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static char *dup_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---------------------------------------------------------------- reader ----------- */

void prl_safetensors_free(prl_safetensors *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->n_metadata; i++) {
        free(st->metadata_keys[i]);
        free(st->metadata_values[i]);
    }
    free(st->tensors);
    free(st->by_name);
    free(st->metadata_keys);
    free(st->metadata_values);
    free(st->label);
    if (st->map) munmap(st->map, st->map_len);
    memset(st, 0, sizeof *st);
}

/* Set a PRL_ERR_FORMAT message prefixed with "safetensors <label>: ". */
static prl_status format_error(const prl_safetensors *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static prl_status format_error(const prl_safetensors *st, const char *fmt, ...)
{
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return prl_error_set(PRL_ERR_FORMAT, "safetensors %s: %s", st->label, msg);
}

static prl_status nomem(const prl_safetensors *st)
{
    return prl_error_set(PRL_ERR_NOMEM, "safetensors %s: out of memory", st->label);
}

/* Rules 1-3: the length prefix and the header's bounds. Sets st->header_len = N. */
static prl_status check_prefix(prl_safetensors *st)
{
    if (st->size < 8)
        return format_error(st, "file is %zu bytes, too small for the 8-byte header length",
                            st->size);
    uint64_t n = load_u64le(st->bytes);
    if (n > PRL_SAFETENSORS_MAX_HEADER)
        return format_error(st, "header length %" PRIu64 " exceeds the maximum of %llu bytes",
                            n, PRL_SAFETENSORS_MAX_HEADER);
    /* Compare against size - 8 (no wrap: size >= 8) rather than forming 8 + n. */
    if (n > (uint64_t)(st->size - 8))
        return format_error(st, "header length %" PRIu64 " runs past the end of the %zu-byte "
                            "file", n, st->size);
    st->header_len = n;
    return PRL_OK;
}

/* Rule 4 (UTF-8) and the space rule: locate the JSON object inside the header. serde_json
** accepts any JSON whitespace around it; the project (like upstream's planned
** InvalidHeaderStart check) allows only 0x20 padding, which is what every writer emits. */
static prl_status header_slice(const prl_safetensors *st, const uint8_t *h, size_t n,
                               size_t *start, size_t *len)
{
    size_t bad = utf8_valid_prefix(h, n);
    if (bad != n)
        return format_error(st, "header is not valid UTF-8 (byte 0x%02x at header offset %zu)",
                            h[bad], bad);
    size_t a = 0, b = n;
    while (a < b && h[a] == ' ') a++;
    while (b > a && h[b - 1] == ' ') b--;
    if (a == b) return format_error(st, "header is empty: expected a JSON object");
    if (h[a] != '{')
        return format_error(st, "header must be a JSON object padded only with spaces: found "
                            "byte 0x%02x at header offset %zu instead of '{'", h[a], a);
    if (h[b - 1] != '}')
        return format_error(st, "header must be a JSON object padded only with spaces: found "
                            "byte 0x%02x at header offset %zu instead of '}'", h[b - 1], b - 1);
    *start = a;
    *len = b - a;
    return PRL_OK;
}

/* A JSON integer in [0, INT64_MAX] (jansson already rejects larger literals). */
static int json_nonneg_int(const json_t *v, int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (int64_t)json_integer_value(v);
    return 1;
}

/* The parse_* helpers below get `tname`, the tensor name already made printable. */
static prl_status parse_dtype(const prl_safetensors *st, const char *tname, const json_t *v,
                              prl_dtype *out)
{
    char vb[NAME_BUF];
    if (!json_is_string(v))
        return format_error(st, "tensor '%s': dtype is not a string", tname);
    prl_dtype d = prl_dtype_from_name(json_string_value(v));
    if (d == PRL_DTYPE_COUNT)
        return format_error(st, "tensor '%s': unknown dtype \"%s\"", tname,
                            printable(vb, sizeof vb, json_string_value(v),
                                      json_string_length(v)));
    *out = d;
    return PRL_OK;
}

static prl_status parse_shape(const prl_safetensors *st, const char *tname, const json_t *v,
                              prl_safetensors_tensor *t)
{
    if (!json_is_array(v)) return format_error(st, "tensor '%s': shape is not an array", tname);
    size_t nd = json_array_size(v);
    if (nd > PRL_SAFETENSORS_MAX_DIMS)
        return format_error(st, "tensor '%s': shape has %zu dimensions, at most %d allowed",
                            tname, nd, PRL_SAFETENSORS_MAX_DIMS);
    for (size_t i = 0; i < nd; i++)
        if (!json_nonneg_int(json_array_get(v, i), &t->shape[i]))
            return format_error(st, "tensor '%s': shape[%zu] is not a non-negative integer",
                                tname, i);
    t->ndim = (int)nd;
    return PRL_OK;
}

static prl_status parse_offsets(const prl_safetensors *st, const char *tname, const json_t *v,
                                prl_safetensors_tensor *t)
{
    int64_t b, e;
    if (!json_is_array(v) || json_array_size(v) != 2)
        return format_error(st, "tensor '%s': data_offsets is not an array [begin, end]",
                            tname);
    if (!json_nonneg_int(json_array_get(v, 0), &b) ||
        !json_nonneg_int(json_array_get(v, 1), &e))
        return format_error(st, "tensor '%s': data_offsets are not non-negative integers",
                            tname);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    return PRL_OK;
}

/* One tensor entry: exactly the fields dtype, shape and data_offsets, each well formed.
** The reference ignores unknown fields; we reject them so that a typo ("offsets", as in
** the reference README) cannot silently yield a different file than the writer meant. */
static prl_status parse_entry(const prl_safetensors *st, const char *key, size_t key_len,
                              const json_t *entry, prl_safetensors_tensor *t)
{
    char nb[NAME_BUF], fb[NAME_BUF];
    const char *shown = printable(nb, sizeof nb, key, key_len);
    if (!name_valid(key, key_len))
        return format_error(st, "invalid tensor name '%s' (must be non-empty [A-Za-z0-9._-])",
                            shown);
    if (!json_is_object(entry))
        return format_error(st, "tensor '%s': entry is not an object", shown);
    int seen_dtype = 0, seen_shape = 0, seen_offsets = 0;
    const char *field;
    json_t *v;
    json_object_foreach((json_t *)entry, field, v) {
        prl_status rc;
        if (strcmp(field, "dtype") == 0) {
            rc = parse_dtype(st, shown, v, &t->dtype);
            seen_dtype = 1;
        } else if (strcmp(field, "shape") == 0) {
            rc = parse_shape(st, shown, v, t);
            seen_shape = 1;
        } else if (strcmp(field, "data_offsets") == 0) {
            rc = parse_offsets(st, shown, v, t);
            seen_offsets = 1;
        } else {
            rc = format_error(st, "tensor '%s': unknown field \"%s\"", shown,
                              printable(fb, sizeof fb, field, strlen(field)));
        }
        if (rc != PRL_OK) return rc;
    }
    if (!seen_dtype) return format_error(st, "tensor '%s': missing field \"dtype\"", shown);
    if (!seen_shape) return format_error(st, "tensor '%s': missing field \"shape\"", shown);
    if (!seen_offsets)
        return format_error(st, "tensor '%s': missing field \"data_offsets\"", shown);
    t->name = dup_string(key);
    return t->name ? PRL_OK : nomem(st);
}

/* __metadata__: an object of string -> string, copied in header order. */
static prl_status parse_metadata(prl_safetensors *st, const json_t *meta)
{
    char kb[NAME_BUF];
    if (!json_is_object(meta)) return format_error(st, "__metadata__ is not an object");
    size_t n = json_object_size(meta);
    st->metadata_keys = calloc(n ? n : 1, sizeof(char *));
    st->metadata_values = calloc(n ? n : 1, sizeof(char *));
    if (!st->metadata_keys || !st->metadata_values) return nomem(st);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)meta, k, v) {
        if (!json_is_string(v))
            return format_error(st, "__metadata__ value of key \"%s\" is not a string",
                                printable(kb, sizeof kb, k, strlen(k)));
        size_t i = st->n_metadata++; /* counted first so that free() releases a half pair */
        st->metadata_keys[i] = dup_string(k);
        st->metadata_values[i] = dup_string(json_string_value(v));
        if (!st->metadata_keys[i] || !st->metadata_values[i]) return nomem(st);
    }
    return PRL_OK;
}

/* Walk the top-level object: __metadata__ and the tensor entries, in header order. */
static prl_status parse_root(prl_safetensors *st, const json_t *root)
{
    size_t n = json_object_size(root);
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    if (!st->tensors) return nomem(st);
    const char *key;
    size_t key_len;
    json_t *v;
    json_object_keylen_foreach((json_t *)root, key, key_len, v) {
        prl_status rc;
        if (key_len == 12 && memcmp(key, "__metadata__", 12) == 0) {
            rc = parse_metadata(st, v);
        } else {
            rc = parse_entry(st, key, key_len, v, &st->tensors[st->n_tensors]);
            if (rc == PRL_OK) st->n_tensors++;
        }
        if (rc != PRL_OK) return rc;
    }
    return PRL_OK;
}

/* Rules 4 (JSON, duplicates) and the structure rules: header bytes -> tensors/metadata. */
static prl_status parse_header(prl_safetensors *st)
{
    const uint8_t *h = st->bytes + 8;
    size_t start = 0, len = 0;
    prl_status rc = header_slice(st, h, (size_t)st->header_len, &start, &len);
    if (rc != PRL_OK) return rc;
    /* jansson merges duplicate keys silently unless told not to; the reference's serde
    ** map does the same ("not all parsers respect this"), we reject them. */
    json_error_t err;
    json_t *root = json_loadb((const char *)h + start, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        char tb[200];
        return format_error(st, "header is not valid JSON: %s (near header offset %zu)",
                            printable(tb, sizeof tb, err.text, strlen(err.text)),
                            start + (size_t)(err.position > 0 ? err.position : 0));
    }
    if (json_is_object(root))
        rc = parse_root(st, root);
    else
        rc = format_error(st, "header is not a JSON object");
    json_decref(root);
    return rc;
}

/* Sort key for rule 5: (begin, end) like the reference, then header position, so that
** tensors with equal offsets (empty ones) keep header order and the order is total. */
typedef struct {
    prl_safetensors_tensor t;
    size_t pos;
} offset_item;

static int cmp_offset_item(const void *a, const void *b)
{
    const offset_item *x = a, *y = b;
    if (x->t.begin != y->t.begin) return x->t.begin < y->t.begin ? -1 : 1;
    if (x->t.end != y->t.end) return x->t.end < y->t.end ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static prl_status sort_by_offsets(prl_safetensors *st)
{
    size_t n = st->n_tensors;
    offset_item *items = malloc((n ? n : 1) * sizeof *items);
    if (!items) return nomem(st);
    for (size_t i = 0; i < n; i++) items[i] = (offset_item){st->tensors[i], i};
    qsort(items, n, sizeof *items, cmp_offset_item);
    for (size_t i = 0; i < n; i++) st->tensors[i] = items[i].t;
    free(items);
    return PRL_OK;
}

/* Rules 5-7 on the sorted tensors: contiguous from 0, sizes match, buffer fully used.
** Then point each tensor at its bytes. */
static prl_status check_layout(prl_safetensors *st)
{
    char nb[NAME_BUF], sb[SHAPE_BUF];
    uint64_t pos = 0;
    for (size_t i = 0; i < st->n_tensors; i++) {
        prl_safetensors_tensor *t = &st->tensors[i];
        const char *shown = printable(nb, sizeof nb, t->name, strlen(t->name));
        if (t->begin != pos || t->end < t->begin)
            return format_error(st, "tensor '%s': invalid data_offsets [%" PRIu64 ",%" PRIu64
                                "]: offsets must be contiguous from 0 with no gap or overlap "
                                "(expected begin %" PRIu64 ") and end >= begin",
                                shown, t->begin, t->end, pos);
        pos = t->end;
        size_t elem = prl_dtype_size(t->dtype);
        if (!shape_bytes(t->shape, t->ndim, elem, &t->numel, &t->nbytes))
            return format_error(st, "tensor '%s': byte size of shape %s x %zu overflows",
                                shown, format_shape(sb, sizeof sb, t->shape, t->ndim), elem);
        if (t->end - t->begin != (uint64_t)t->nbytes)
            return format_error(st, "tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                                "] hold %" PRIu64 " bytes but dtype %s shape %s needs %zu",
                                shown, t->begin, t->end, t->end - t->begin,
                                prl_dtype_name(t->dtype),
                                format_shape(sb, sizeof sb, t->shape, t->ndim), t->nbytes);
    }
    uint64_t data_len = (uint64_t)(st->size - 8) - st->header_len;
    if (pos != data_len)
        return format_error(st, "tensors cover %" PRIu64 " data bytes but the file holds %"
                            PRIu64 " after the header (the last data_offsets end must be the "
                            "end of the file)", pos, data_len);
    const uint8_t *data = st->bytes + 8 + st->header_len;
    for (size_t i = 0; i < st->n_tensors; i++)
        st->tensors[i].data = data + st->tensors[i].begin;
    return PRL_OK;
}

typedef struct {
    const char *name;
    size_t idx;
} name_item;

static int cmp_name_item(const void *a, const void *b)
{
    return strcmp(((const name_item *)a)->name, ((const name_item *)b)->name);
}

/* The index find() bisects. Names are unique: jansson rejected duplicate keys. */
static prl_status build_name_index(prl_safetensors *st)
{
    size_t n = st->n_tensors;
    name_item *items = malloc((n ? n : 1) * sizeof *items);
    st->by_name = malloc((n ? n : 1) * sizeof *st->by_name);
    if (!items || !st->by_name) {
        free(items);
        return nomem(st);
    }
    for (size_t i = 0; i < n; i++) items[i] = (name_item){st->tensors[i].name, i};
    qsort(items, n, sizeof *items, cmp_name_item);
    for (size_t i = 0; i < n; i++) st->by_name[i] = items[i].idx;
    free(items);
    return PRL_OK;
}

static prl_status parse_all(prl_safetensors *st)
{
    prl_status rc = check_prefix(st);
    if (rc == PRL_OK) rc = parse_header(st);
    if (rc == PRL_OK) rc = sort_by_offsets(st);
    if (rc == PRL_OK) rc = check_layout(st);
    if (rc == PRL_OK) rc = build_name_index(st);
    return rc;
}

prl_status prl_safetensors_parse(prl_safetensors *st, const void *buf, size_t len,
                                 const char *label)
{
    if (!st) return prl_error_set(PRL_ERR_ARG, "safetensors: parse: NULL handle");
    memset(st, 0, sizeof *st);
    if (!buf && len)
        return prl_error_set(PRL_ERR_ARG, "safetensors %s: parse: NULL buffer of %zu bytes",
                             label ? label : "<memory>", len);
    st->label = dup_string(label ? label : "<memory>");
    if (!st->label) return prl_error_set(PRL_ERR_NOMEM, "safetensors: out of memory");
    st->bytes = buf ? buf : (const void *)"";
    st->size = len;
    prl_status rc = parse_all(st);
    if (rc != PRL_OK) prl_safetensors_free(st);
    return rc;
}

prl_status prl_safetensors_open(prl_safetensors *st, const char *path)
{
    if (!st || !path) return prl_error_set(PRL_ERR_ARG, "safetensors: open: NULL argument");
    memset(st, 0, sizeof *st);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return prl_error_set(PRL_ERR_IO, "safetensors %s: open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return prl_error_set(PRL_ERR_IO, "safetensors %s: stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return prl_error_set(PRL_ERR_IO, "safetensors %s: not a regular file", path);
    }
    if ((uintmax_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return prl_error_set(PRL_ERR_IO, "safetensors %s: file too large to map", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) { /* mmap of 0 bytes is an error; parse reports the empty file instead */
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return prl_error_set(PRL_ERR_IO, "safetensors %s: mmap: %s", path, strerror(e));
        }
    }
    close(fd); /* the mapping keeps the file open */
    prl_status rc = prl_safetensors_parse(st, map, size, path);
    if (rc != PRL_OK) {
        if (map) munmap(map, size);
        return rc;
    }
    st->map = map;
    st->map_len = size;
    return PRL_OK;
}

const prl_safetensors_tensor *prl_safetensors_find(const prl_safetensors *st,
                                                    const char *name)
{
    if (!st || !name) return NULL;
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const prl_safetensors_tensor *t = &st->tensors[st->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *prl_safetensors_metadata(const prl_safetensors *st, const char *key)
{
    if (!st || !key) return NULL;
    for (size_t i = 0; i < st->n_metadata; i++)
        if (strcmp(st->metadata_keys[i], key) == 0) return st->metadata_values[i];
    return NULL;
}

/* ---------------------------------------------------------------- conversion ------- */

static uint16_t load_u16le(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t load_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE binary16 -> binary32, exact for every input (NaN payloads kept). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float (man < 2^10) */
    float mag = (float)man * 0x1p-24f;
    return sign ? -mag : mag;
}

/* bfloat16 is the top half of a binary32. */
static float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static double f64_load(const uint8_t *p)
{
    uint64_t u = load_u64le(p);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Shared front half of read_f32/read_f64: argument checks, lookup, shape and dtype
** checks. `to` names the target type for messages. */
static prl_status read_prepare(const prl_safetensors *st, const char *name,
                               const int64_t *expect, int expect_ndim, const void *out,
                               const char *to, const prl_safetensors_tensor **tp)
{
    char nb[NAME_BUF], sa[SHAPE_BUF], sb[SHAPE_BUF];
    if (!st || !name)
        return prl_error_set(PRL_ERR_ARG, "safetensors: read_%s: NULL argument", to);
    const char *shown = printable(nb, sizeof nb, name, strlen(name));
    if (expect_ndim < 0 || expect_ndim > PRL_SAFETENSORS_MAX_DIMS || (expect_ndim && !expect))
        return prl_error_set(PRL_ERR_ARG, "safetensors %s: read_%s '%s': bad expected rank %d",
                             st->label, to, shown, expect_ndim);
    for (int i = 0; i < expect_ndim; i++)
        if (expect[i] < 0)
            return prl_error_set(PRL_ERR_ARG, "safetensors %s: read_%s '%s': negative expected "
                                 "dimension %" PRId64, st->label, to, shown, expect[i]);
    const prl_safetensors_tensor *t = prl_safetensors_find(st, name);
    if (!t) return format_error(st, "tensor '%s' not found", shown);
    int same = t->ndim == expect_ndim;
    for (int i = 0; same && i < expect_ndim; i++) same = t->shape[i] == expect[i];
    if (!same)
        return format_error(st, "tensor '%s' has shape %s, expected %s", shown,
                            format_shape(sa, sizeof sa, t->shape, t->ndim),
                            format_shape(sb, sizeof sb, expect, expect_ndim));
    if (t->dtype != PRL_DTYPE_F32 && t->dtype != PRL_DTYPE_F64 && t->dtype != PRL_DTYPE_F16 &&
        t->dtype != PRL_DTYPE_BF16)
        return prl_error_set(PRL_ERR_UNSUPPORTED, "safetensors %s: tensor '%s' has dtype %s; "
                             "only F32, F64, F16 and BF16 convert to %s", st->label, shown,
                             prl_dtype_name(t->dtype), to);
    if (!out && t->numel)
        return prl_error_set(PRL_ERR_ARG, "safetensors %s: read_%s '%s': NULL output",
                             st->label, to, shown);
    *tp = t;
    return PRL_OK;
}

prl_status prl_safetensors_read_f32(const prl_safetensors *st, const char *name,
                                    const int64_t *expect_shape, int expect_ndim, float *out)
{
    const prl_safetensors_tensor *t;
    prl_status rc = read_prepare(st, name, expect_shape, expect_ndim, out, "f32", &t);
    if (rc != PRL_OK) return rc;
    const uint8_t *p = t->data;
    size_t n = t->numel;
    switch (t->dtype) {
    case PRL_DTYPE_F32:
        for (size_t i = 0; i < n; i++) out[i] = f32_from_bits(load_u32le(p + 4 * i));
        break;
    case PRL_DTYPE_F64: /* round to nearest; out-of-range values become ±inf (IEEE) */
        for (size_t i = 0; i < n; i++) out[i] = (float)f64_load(p + 8 * i);
        break;
    case PRL_DTYPE_F16:
        for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(load_u16le(p + 2 * i));
        break;
    case PRL_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(load_u16le(p + 2 * i));
        break;
    default: PRL_ASSERT(!"dtype checked by read_prepare");
    }
    return PRL_OK;
}

prl_status prl_safetensors_read_f64(const prl_safetensors *st, const char *name,
                                    const int64_t *expect_shape, int expect_ndim, double *out)
{
    const prl_safetensors_tensor *t;
    prl_status rc = read_prepare(st, name, expect_shape, expect_ndim, out, "f64", &t);
    if (rc != PRL_OK) return rc;
    const uint8_t *p = t->data;
    size_t n = t->numel;
    switch (t->dtype) {
    case PRL_DTYPE_F32:
        for (size_t i = 0; i < n; i++) out[i] = f32_from_bits(load_u32le(p + 4 * i));
        break;
    case PRL_DTYPE_F64:
        for (size_t i = 0; i < n; i++) out[i] = f64_load(p + 8 * i);
        break;
    case PRL_DTYPE_F16:
        for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(load_u16le(p + 2 * i));
        break;
    case PRL_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(load_u16le(p + 2 * i));
        break;
    default: PRL_ASSERT(!"dtype checked by read_prepare");
    }
    return PRL_OK;
}

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
    const char *shown = printable(nb, sizeof nb, name, strlen(name));
    if (!name_valid(name, strlen(name)))
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: invalid tensor name '%s' (must "
                             "be non-empty [A-Za-z0-9._-])", shown);
    if (strcmp(name, "__metadata__") == 0)
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: tensor name '__metadata__' is "
                             "reserved");
    if (!dtype_valid(dtype))
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: tensor '%s': unknown dtype %d",
                             shown, (int)dtype);
    if (ndim < 0 || ndim > PRL_SAFETENSORS_MAX_DIMS || (ndim && !shape))
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: tensor '%s': rank %d not in "
                             "0..%d (or NULL shape)", shown, ndim, PRL_SAFETENSORS_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return prl_error_set(PRL_ERR_ARG, "safetensors writer: tensor '%s': negative "
                                 "dimension %" PRId64, shown, shape[i]);
    size_t numel;
    if (!shape_bytes(shape, ndim, prl_dtype_size(dtype), &numel, nbytes))
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: tensor '%s': byte size of shape "
                             "%s overflows", shown, format_shape(sb, sizeof sb, shape, ndim));
    if (!data && *nbytes)
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: tensor '%s': NULL data for %zu "
                             "bytes", shown, *nbytes);
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

prl_status prl_safetensors_writer_add(prl_safetensors_writer *w, const char *name,
                                      prl_dtype dtype, const int64_t *shape, int ndim,
                                      const void *data)
{
    if (!w) return prl_error_set(PRL_ERR_ARG, "safetensors writer: NULL writer");
    size_t nbytes;
    prl_status rc = check_new_tensor(w, name, dtype, shape, ndim, data, &nbytes);
    if (rc != PRL_OK) return rc;
    char *copy = dup_string(name);
    if (!copy || !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors)) {
        free(copy);
        return prl_error_set(PRL_ERR_NOMEM, "safetensors writer: out of memory adding '%s'",
                             name);
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
    const char *shown = printable(kb, sizeof kb, key, kl);
    if (utf8_valid_prefix((const uint8_t *)key, kl) != kl)
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: __metadata__ key \"%s\" is not "
                             "valid UTF-8", shown);
    if (utf8_valid_prefix((const uint8_t *)value, vl) != vl)
        return prl_error_set(PRL_ERR_ARG, "safetensors writer: __metadata__ value of key \"%s\" "
                             "is not valid UTF-8", shown);
    char *v = dup_string(value);
    if (!v) return prl_error_set(PRL_ERR_NOMEM, "safetensors writer: out of memory");
    for (size_t i = 0; i < w->n_metadata; i++)
        if (strcmp(w->metadata_keys[i], key) == 0) {
            free(w->metadata_values[i]);
            w->metadata_values[i] = v;
            return PRL_OK;
        }
    char *k = dup_string(key);
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
    uint8_t *head;   /* 8-byte N + padded JSON */
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
    for (size_t i = 0; i < nm; i++) meta[i] = (meta_item){w->metadata_keys[i], w->metadata_values[i]};
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
        return prl_error_set(PRL_ERR_RANGE, "safetensors writer: header of %" PRIu64 " bytes "
                             "(limit %llu) or total size too large", n,
                             PRL_SAFETENSORS_MAX_HEADER);
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
        rc = prl_error_set(PRL_ERR_IO, "safetensors: rename %s -> %s: %s", tmp, path,
                           strerror(e));
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
