/*
** codec.c — messages to frames and back. Pure functions (no sockets): prl_bus_encode builds
** [type, JSON header, payloads...]; prl_bus_decode validates every rule of docs/protocol.md
** before it allocates anything proportional to the input beyond the limits, and names what
** is wrong. The decoder must never crash or abort on any input: it is fuzzed by the tests.
*/
#include "bus/internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "bus/: payload frames are little-endian and copied as is; port the codec first"
#endif

uint64_t prl_bus_checksum(const prl_bus_part *frames, int n)
{
    uint64_t h = 0;
    for (int i = 0; i < n; i++) h = prl_checksum64(frames[i].data, frames[i].len, h);
    return h;
}

/* ---------------------------------------------------------------- encode ----------- */

static json_t *frames_json(const prl_bus_msg *m)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < m->n_frames; i++) {
        const prl_bus_frame *f = &m->frames[i];
        json_t *o = json_pack("{s:s, s:s, s:I}", "name", f->name, "dtype",
                              prl_bus_dtype_name(f->dtype), "count", (json_int_t)f->count);
        if (!o || json_array_append_new(arr, o) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

static prl_status encode_check(const prl_bus_msg *m, const prl_bus_type_spec **t)
{
    char reason[256];
    *t = m->spec;
    if (!*t || !m->fields)
        return prl_error_set(PRL_ERR_ARG,
                             "bus: cannot encode: message type '%s' is not registered "
                             "or the message is not initialised",
                             m->type);
    if (m->n_frames < 0 || m->n_frames > PRL_BUS_MAX_FRAMES)
        return prl_error_set(PRL_ERR_ARG, "bus: cannot encode: %d frames", m->n_frames);
    if (!prl_bus_fields_ok(*t, m->fields, reason, sizeof reason) ||
        !prl_bus_frames_ok(*t, m, reason, sizeof reason))
        return prl_error_set(PRL_ERR_ARG, "bus: cannot encode '%s' message: %s", m->type, reason);
    size_t total = 0;
    for (int i = 0; i < m->n_frames; i++) total += m->frames[i].bytes;
    if (total > PRL_BUS_MAX_TOTAL_BYTES)
        return prl_error_set(PRL_ERR_RANGE, "bus: cannot encode: %zu payload bytes exceed %zu",
                             total, PRL_BUS_MAX_TOTAL_BYTES);
    return PRL_OK;
}

prl_status prl_bus_encode(const prl_bus_msg *m, prl_bus_wire *w)
{
    memset(w, 0, sizeof *w);
    const prl_bus_type_spec *t;
    prl_status st = encode_check(m, &t);
    if (st != PRL_OK) return st;
    snprintf(w->type, sizeof w->type, "%s", m->type);
    w->parts[0] = (prl_bus_part){w->type, strlen(w->type)};
    for (int i = 0; i < m->n_frames; i++)
        w->parts[2 + i] = (prl_bus_part){m->frames[i].data, m->frames[i].bytes};
    w->n = 2 + m->n_frames;
    char sum[17];
    snprintf(sum, sizeof sum, "%016llx",
             (unsigned long long)prl_bus_checksum(w->parts + 2, m->n_frames));
    json_t *h = json_deep_copy(m->fields);
    json_t *fr = frames_json(m);
    if (!h || !fr || json_object_set_new(h, "v", json_integer(PRL_BUS_VERSION)) ||
        json_object_set_new(h, "type", json_string(m->type)) || json_object_set(h, "frames", fr) ||
        json_object_set_new(h, "checksum", json_string(sum)))
        st = prl_error_set(PRL_ERR_NOMEM, "bus: out of memory encoding a '%s' header", m->type);
    if (st == PRL_OK) {
        w->header = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
        if (!w->header) st = prl_error_set(PRL_ERR_NOMEM, "bus: out of memory dumping a header");
    }
    json_decref(fr);
    json_decref(h);
    if (st == PRL_OK && strlen(w->header) > PRL_BUS_MAX_HEADER_BYTES)
        st = prl_error_set(PRL_ERR_RANGE, "bus: cannot encode: header of %zu bytes exceeds %d",
                           strlen(w->header), PRL_BUS_MAX_HEADER_BYTES);
    if (st != PRL_OK) {
        prl_bus_wire_free(w);
        return st;
    }
    w->parts[1] = (prl_bus_part){w->header, strlen(w->header)};
    return PRL_OK;
}

void prl_bus_wire_free(prl_bus_wire *w)
{
    if (!w) return;
    free(w->header);
    memset(w, 0, sizeof *w);
}

/* ---------------------------------------------------------------- decode ----------- */

/* Decoding state: the reason buffer and the status of the first failure. */
typedef struct decoder {
    char *reason;
    size_t reason_size;
    prl_status status;
} decoder;

static int fail(decoder *d, prl_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(decoder *d, prl_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->reason, d->reason_size, fmt, ap);
    va_end(ap);
    d->status = code;
    return 0;
}

static int check_type_frame(decoder *d, const prl_bus_registry *reg, const prl_bus_part *p,
                            const prl_bus_type_spec **t)
{
    char tok[PRL_BUS_TYPE_MAX];
    if (p->len == 0) return fail(d, PRL_ERR_FORMAT, "frame 0 (type) is empty");
    if (!p->data || !prl_bus_type_token_ok(p->data, p->len))
        return fail(d, PRL_ERR_FORMAT,
                    "frame 0 (type) must be 1..%d bytes of [a-z_]; got %zu bytes",
                    PRL_BUS_TYPE_MAX - 1, p->len);
    memcpy(tok, p->data, p->len);
    tok[p->len] = '\0';
    *t = prl_bus_registry_find(reg, tok);
    if (!*t) return fail(d, PRL_ERR_FORMAT, "frame 0: type '%s' is not a known message type", tok);
    return 1;
}

static int parse_header(decoder *d, const prl_bus_part *p, json_t **out)
{
    json_error_t e;
    if (p->len == 0) return fail(d, PRL_ERR_FORMAT, "frame 1 (header) is empty");
    if (p->len > PRL_BUS_MAX_HEADER_BYTES)
        return fail(d, PRL_ERR_FORMAT, "frame 1 (header): %zu bytes exceed the limit of %d", p->len,
                    PRL_BUS_MAX_HEADER_BYTES);
    if (memchr(p->data, '\0', p->len))
        return fail(d, PRL_ERR_FORMAT, "frame 1 (header) contains a NUL byte");
    *out = json_loadb(p->data, p->len, JSON_REJECT_DUPLICATES, &e);
    if (!*out)
        return fail(d, PRL_ERR_FORMAT, "frame 1 (header) is not valid JSON: %s (column %d)", e.text,
                    e.column);
    if (!json_is_object(*out))
        return fail(d, PRL_ERR_FORMAT, "frame 1 (header) must be a JSON object");
    if (json_object_size(*out) > PRL_BUS_MAX_HEADER_KEYS)
        return fail(d, PRL_ERR_FORMAT, "header has %zu fields; the limit is %d",
                    json_object_size(*out), PRL_BUS_MAX_HEADER_KEYS);
    return 1;
}

static int check_version_type(decoder *d, const json_t *h, const prl_bus_type_spec *t)
{
    const json_t *v = json_object_get(h, "v"), *ty = json_object_get(h, "type");
    if (!v) return fail(d, PRL_ERR_FORMAT, "header field 'v' (schema version) is missing");
    if (!json_is_integer(v)) return fail(d, PRL_ERR_FORMAT, "header field 'v' must be an integer");
    if (json_integer_value(v) != PRL_BUS_VERSION)
        return fail(d, PRL_ERR_UNSUPPORTED,
                    "header field 'v': schema version %lld is not supported (this build "
                    "speaks %d)",
                    (long long)json_integer_value(v), PRL_BUS_VERSION);
    if (!json_is_string(ty)) return fail(d, PRL_ERR_FORMAT, "header field 'type' must be a string");
    if (strcmp(json_string_value(ty), t->type) != 0)
        return fail(d, PRL_ERR_FORMAT, "header field 'type' ('%.32s') differs from frame 0 ('%s')",
                    json_string_value(ty), t->type);
    return 1;
}

static int parse_dtype(const json_t *j, prl_bus_dtype *out)
{
    for (int i = 0; i < 4; i++)
        if (json_is_string(j) && strcmp(json_string_value(j), prl_bus_dtype_name(i)) == 0) {
            *out = (prl_bus_dtype)i;
            return 1;
        }
    return 0;
}

/* Check one "frames" entry against its payload part and fill the frame's metadata. */
static int check_frame_entry(decoder *d, int i, const json_t *e, const prl_bus_part *p,
                             prl_bus_frame *f)
{
    const json_t *name = json_object_get(e, "name"), *count = json_object_get(e, "count");
    if (!json_is_object(e) || json_object_size(e) != 3)
        return fail(d, PRL_ERR_FORMAT,
                    "header 'frames'[%d] must be an object with exactly name, dtype, count", i);
    if (!json_is_string(name) ||
        !prl_bus_name_ok(json_string_value(name), json_string_length(name)))
        return fail(d, PRL_ERR_FORMAT, "header 'frames'[%d].name must be 1..%d of [A-Za-z0-9_]", i,
                    PRL_BUS_NAME_MAX - 1);
    snprintf(f->name, sizeof f->name, "%s", json_string_value(name));
    if (!parse_dtype(json_object_get(e, "dtype"), &f->dtype))
        return fail(d, PRL_ERR_FORMAT, "frame '%s': dtype must be one of i32, f32, u8, bytes",
                    f->name);
    if (!json_is_integer(count) || json_integer_value(count) < 0)
        return fail(d, PRL_ERR_FORMAT, "frame '%s': count must be a non-negative integer", f->name);
    size_t size = prl_bus_dtype_size(f->dtype);
    if (p->len > PRL_BUS_MAX_FRAME_BYTES)
        return fail(d, PRL_ERR_FORMAT, "frame '%s': %zu bytes exceed the limit of %zu", f->name,
                    p->len, PRL_BUS_MAX_FRAME_BYTES);
    if (p->len % size != 0)
        return fail(d, PRL_ERR_FORMAT,
                    "frame '%s': %zu bytes is not a multiple of %zu for dtype %s", f->name, p->len,
                    size, prl_bus_dtype_name(f->dtype));
    if ((uint64_t)json_integer_value(count) != p->len / size)
        return fail(d, PRL_ERR_FORMAT, "frame '%s': header count %lld but the frame holds %zu %s",
                    f->name, (long long)json_integer_value(count), p->len / size,
                    prl_bus_dtype_name(f->dtype));
    f->count = p->len / size;
    f->bytes = p->len;
    return 1;
}

static int check_frames(decoder *d, const json_t *h, const prl_bus_part *payload, int n,
                        prl_bus_msg *m)
{
    const json_t *arr = json_object_get(h, "frames");
    if (!json_is_array(arr))
        return fail(d, PRL_ERR_FORMAT, "header field 'frames' must be an array");
    if (json_array_size(arr) != (size_t)n)
        return fail(d, PRL_ERR_FORMAT, "header lists %zu frames but the message carries %d",
                    json_array_size(arr), n);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!check_frame_entry(d, i, json_array_get(arr, (size_t)i), &payload[i], &m->frames[i]))
            return 0;
        for (int j = 0; j < i; j++)
            if (strcmp(m->frames[j].name, m->frames[i].name) == 0)
                return fail(d, PRL_ERR_FORMAT, "frame '%s' appears twice", m->frames[i].name);
        total += payload[i].len;
    }
    if (total > PRL_BUS_MAX_TOTAL_BYTES)
        return fail(d, PRL_ERR_FORMAT, "payload frames total %zu bytes; the limit is %zu", total,
                    PRL_BUS_MAX_TOTAL_BYTES);
    return 1;
}

static int check_checksum(decoder *d, const json_t *h, const prl_bus_part *payload, int n)
{
    const json_t *c = json_object_get(h, "checksum");
    uint64_t want;
    if (!json_is_string(c) || json_string_length(c) != 16 ||
        !prl_bus_hex64_parse(json_string_value(c), &want))
        return fail(d, PRL_ERR_FORMAT, "header field 'checksum' must be 16 lowercase hex digits");
    uint64_t got = prl_bus_checksum(payload, n);
    if (got != want)
        return fail(d, PRL_ERR_CHECKSUM,
                    "checksum mismatch: header says %016llx, payload frames hash to %016llx",
                    (unsigned long long)want, (unsigned long long)got);
    return 1;
}

/* Copy the payloads and the non-reserved header fields into m (sizes already bounded). */
static int take_payloads(decoder *d, const json_t *h, const prl_bus_part *payload, int n,
                         prl_bus_msg *m)
{
    for (int i = 0; i < n; i++) {
        prl_bus_frame *f = &m->frames[i];
        if (f->bytes) {
            f->data = malloc(f->bytes);
            if (!f->data) return fail(d, PRL_ERR_NOMEM, "frame '%s': out of memory", f->name);
            memcpy(f->data, payload[i].data, f->bytes);
        }
        m->n_frames = i + 1;
    }
    m->fields = json_object();
    if (!m->fields) return fail(d, PRL_ERR_NOMEM, "out of memory for the header fields");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)h, key, v)
    {
        if (!prl_bus_key_reserved(key) && json_object_set(m->fields, key, v) != 0)
            return fail(d, PRL_ERR_NOMEM, "out of memory for header field '%s'", key);
    }
    return 1;
}

static int decode_all(decoder *d, const prl_bus_registry *reg, const prl_bus_part *parts, int n,
                      prl_bus_msg *m, json_t **h)
{
    const prl_bus_type_spec *t;
    if (!parts || n < 2)
        return fail(d, PRL_ERR_FORMAT,
                    "message has %d frames; at least 2 (type, header) are needed", parts ? n : 0);
    if (n > PRL_BUS_MAX_PARTS)
        return fail(d, PRL_ERR_FORMAT, "message has %d frames; the limit is %d", n,
                    PRL_BUS_MAX_PARTS);
    if (!check_type_frame(d, reg, &parts[0], &t) || !parse_header(d, &parts[1], h) ||
        !check_version_type(d, *h, t))
        return 0;
    snprintf(m->type, sizeof m->type, "%s", t->type);
    m->spec = t;
    if (!check_frames(d, *h, parts + 2, n - 2, m) || !check_checksum(d, *h, parts + 2, n - 2))
        return 0;
    if (!prl_bus_fields_ok(t, *h, d->reason, d->reason_size)) {
        d->status = PRL_ERR_FORMAT;
        return 0;
    }
    m->n_frames = n - 2; /* metadata only, for the required-frames check */
    int ok = prl_bus_frames_ok(t, m, d->reason, d->reason_size);
    m->n_frames = 0;
    if (!ok) {
        d->status = PRL_ERR_FORMAT;
        return 0;
    }
    return take_payloads(d, *h, parts + 2, n - 2, m);
}

prl_status prl_bus_decode(const prl_bus_registry *reg, const prl_bus_part *parts, int n,
                          prl_bus_msg *out, char *reason, size_t reason_size)
{
    char local[512];
    decoder d = {reason ? reason : local, reason ? reason_size : sizeof local, PRL_OK};
    if (d.reason_size == 0) d = (decoder){local, sizeof local, PRL_OK};
    d.reason[0] = '\0';
    memset(out, 0, sizeof *out);
    json_t *h = NULL;
    int ok = decode_all(&d, reg, parts, n, out, &h);
    json_decref(h);
    if (ok) return PRL_OK;
    prl_bus_msg_free(out);
    if (d.status == PRL_OK) d.status = PRL_ERR_FORMAT;
    if (!d.reason[0]) snprintf(d.reason, d.reason_size, "invalid message");
    return prl_error_set(d.status, "bus: rejected message: %s", d.reason);
}
