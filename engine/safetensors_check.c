/*
** safetensors_check.c — the safetensors reader's checks. The file is taken as one byte range
** (a caller's buffer or an mmap). Everything the reference implementation (huggingface/
** safetensors tensor.rs) rejects is rejected here too, in its order — length prefix, header
** bounds, UTF-8, JSON, offsets after sorting, sizes with overflow checks, exact coverage of
** the data buffer — plus the project rules: duplicate JSON keys, unknown entry fields, tensor
** names outside [A-Za-z0-9._-], more than 8 dimensions, anything but spaces around the JSON
** object. The JSON itself is parsed by jansson; this file checks the document's structure.
*/
#include "engine/safetensors_int.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- reader checks ---- */

/* Set a PRL_ERR_FORMAT message prefixed with "safetensors <label>: " (declared with its
** format attribute in safetensors_int.h). */
prl_status st__format_error(const prl_safetensors *st, const char *fmt, ...)
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
        return st__format_error(st, "file is %zu bytes, too small for the 8-byte header length",
                                st->size);
    uint64_t n = st__load_u64le(st->bytes);
    if (n > PRL_SAFETENSORS_MAX_HEADER)
        return st__format_error(st, "header length %" PRIu64 " exceeds the maximum of %llu bytes",
                                n, PRL_SAFETENSORS_MAX_HEADER);
    /* Compare against size - 8 (no wrap: size >= 8) rather than forming 8 + n. */
    if (n > (uint64_t)(st->size - 8))
        return st__format_error(st,
                                "header length %" PRIu64 " runs past the end of the %zu-byte "
                                "file",
                                n, st->size);
    st->header_len = n;
    return PRL_OK;
}

/* Rule 4 (UTF-8) and the space rule: locate the JSON object inside the header. serde_json
** accepts any JSON whitespace around it; the project (like upstream's planned
** InvalidHeaderStart check) allows only 0x20 padding, which is what every writer emits. */
static prl_status header_slice(const prl_safetensors *st, const uint8_t *h, size_t n, size_t *start,
                               size_t *len)
{
    size_t bad = st__utf8_valid_prefix(h, n);
    if (bad != n)
        return st__format_error(st, "header is not valid UTF-8 (byte 0x%02x at header offset %zu)",
                                h[bad], bad);
    size_t a = 0, b = n;
    while (a < b && h[a] == ' ') a++;
    while (b > a && h[b - 1] == ' ') b--;
    if (a == b) return st__format_error(st, "header is empty: expected a JSON object");
    if (h[a] != '{')
        return st__format_error(st,
                                "header must be a JSON object padded only with spaces: found "
                                "byte 0x%02x at header offset %zu instead of '{'",
                                h[a], a);
    if (h[b - 1] != '}')
        return st__format_error(st,
                                "header must be a JSON object padded only with spaces: found "
                                "byte 0x%02x at header offset %zu instead of '}'",
                                h[b - 1], b - 1);
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
        return st__format_error(st, "tensor '%s': dtype is not a string", tname);
    prl_dtype d = prl_dtype_from_name(json_string_value(v));
    if (d == PRL_DTYPE_COUNT)
        return st__format_error(
            st, "tensor '%s': unknown dtype \"%s\"", tname,
            st__printable(vb, sizeof vb, json_string_value(v), json_string_length(v)));
    *out = d;
    return PRL_OK;
}

static prl_status parse_shape(const prl_safetensors *st, const char *tname, const json_t *v,
                              prl_safetensors_tensor *t)
{
    if (!json_is_array(v)) return st__format_error(st, "tensor '%s': shape is not an array", tname);
    size_t nd = json_array_size(v);
    if (nd > PRL_SAFETENSORS_MAX_DIMS)
        return st__format_error(st, "tensor '%s': shape has %zu dimensions, at most %d allowed",
                                tname, nd, PRL_SAFETENSORS_MAX_DIMS);
    for (size_t i = 0; i < nd; i++)
        if (!json_nonneg_int(json_array_get(v, i), &t->shape[i]))
            return st__format_error(st, "tensor '%s': shape[%zu] is not a non-negative integer",
                                    tname, i);
    t->ndim = (int)nd;
    return PRL_OK;
}

static prl_status parse_offsets(const prl_safetensors *st, const char *tname, const json_t *v,
                                prl_safetensors_tensor *t)
{
    int64_t b, e;
    if (!json_is_array(v) || json_array_size(v) != 2)
        return st__format_error(st, "tensor '%s': data_offsets is not an array [begin, end]",
                                tname);
    if (!json_nonneg_int(json_array_get(v, 0), &b) || !json_nonneg_int(json_array_get(v, 1), &e))
        return st__format_error(st, "tensor '%s': data_offsets are not non-negative integers",
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
    const char *shown = st__printable(nb, sizeof nb, key, key_len);
    if (!st__name_valid(key, key_len))
        return st__format_error(st, "invalid tensor name '%s' (must be non-empty [A-Za-z0-9._-])",
                                shown);
    if (!json_is_object(entry))
        return st__format_error(st, "tensor '%s': entry is not an object", shown);
    int seen_dtype = 0, seen_shape = 0, seen_offsets = 0;
    const char *field;
    json_t *v;
    json_object_foreach((json_t *)entry, field, v)
    {
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
            rc = st__format_error(st, "tensor '%s': unknown field \"%s\"", shown,
                                  st__printable(fb, sizeof fb, field, strlen(field)));
        }
        if (rc != PRL_OK) return rc;
    }
    if (!seen_dtype) return st__format_error(st, "tensor '%s': missing field \"dtype\"", shown);
    if (!seen_shape) return st__format_error(st, "tensor '%s': missing field \"shape\"", shown);
    if (!seen_offsets)
        return st__format_error(st, "tensor '%s': missing field \"data_offsets\"", shown);
    t->name = strdup(key);
    return t->name ? PRL_OK : nomem(st);
}

/* __metadata__: an object of string -> string, copied in header order. */
static prl_status parse_metadata(prl_safetensors *st, const json_t *meta)
{
    char kb[NAME_BUF];
    if (!json_is_object(meta)) return st__format_error(st, "__metadata__ is not an object");
    size_t n = json_object_size(meta);
    st->metadata_keys = calloc(n ? n : 1, sizeof(char *));
    st->metadata_values = calloc(n ? n : 1, sizeof(char *));
    if (!st->metadata_keys || !st->metadata_values) return nomem(st);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)meta, k, v)
    {
        if (!json_is_string(v))
            return st__format_error(st, "__metadata__ value of key \"%s\" is not a string",
                                    st__printable(kb, sizeof kb, k, strlen(k)));
        size_t i = st->n_metadata++; /* counted first so that free() releases a half pair */
        st->metadata_keys[i] = strdup(k);
        st->metadata_values[i] = strdup(json_string_value(v));
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
    json_object_keylen_foreach((json_t *)root, key, key_len, v)
    {
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
        return st__format_error(st, "header is not valid JSON: %s (near header offset %zu)",
                                st__printable(tb, sizeof tb, err.text, strlen(err.text)),
                                start + (size_t)(err.position > 0 ? err.position : 0));
    }
    if (json_is_object(root)) rc = parse_root(st, root);
    else rc = st__format_error(st, "header is not a JSON object");
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
        const char *shown = st__printable(nb, sizeof nb, t->name, strlen(t->name));
        if (t->begin != pos || t->end < t->begin)
            return st__format_error(st,
                                    "tensor '%s': invalid data_offsets [%" PRIu64 ",%" PRIu64
                                    "]: offsets must be contiguous from 0 with no gap or overlap "
                                    "(expected begin %" PRIu64 ") and end >= begin",
                                    shown, t->begin, t->end, pos);
        pos = t->end;
        size_t elem = prl_dtype_size(t->dtype);
        if (!st__shape_bytes(t->shape, t->ndim, elem, &t->numel, &t->nbytes))
            return st__format_error(st, "tensor '%s': byte size of shape %s x %zu overflows", shown,
                                    st__format_shape(sb, sizeof sb, t->shape, t->ndim), elem);
        if (t->end - t->begin != (uint64_t)t->nbytes)
            return st__format_error(st,
                                    "tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                                    "] hold %" PRIu64 " bytes but dtype %s shape %s needs %zu",
                                    shown, t->begin, t->end, t->end - t->begin,
                                    prl_dtype_name(t->dtype),
                                    st__format_shape(sb, sizeof sb, t->shape, t->ndim), t->nbytes);
    }
    uint64_t data_len = (uint64_t)(st->size - 8) - st->header_len;
    if (pos != data_len)
        return st__format_error(st,
                                "tensors cover %" PRIu64 " data bytes but the file holds %" PRIu64
                                " after the header (the last data_offsets end must be the "
                                "end of the file)",
                                pos, data_len);
    const uint8_t *data = st->bytes + 8 + st->header_len;
    for (size_t i = 0; i < st->n_tensors; i++) st->tensors[i].data = data + st->tensors[i].begin;
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

prl_status st__parse_all(prl_safetensors *st)
{
    prl_status rc = check_prefix(st);
    if (rc == PRL_OK) rc = parse_header(st);
    if (rc == PRL_OK) rc = sort_by_offsets(st);
    if (rc == PRL_OK) rc = check_layout(st);
    if (rc == PRL_OK) rc = build_name_index(st);
    return rc;
}
