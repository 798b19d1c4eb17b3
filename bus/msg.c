/*
** msg.c — building and reading messages: init/free, typed header fields checked against the
** type's schema, binary frames (copied in, owned by the message), equality.
*/
#include "bus/internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const dtype_names[] = {"i32", "f32", "u8", "bytes"};
static const size_t dtype_sizes[] = {4, 4, 1, 1};

const char *prl_bus_dtype_name(prl_bus_dtype d) { return ((unsigned)d < 4) ? dtype_names[d] : "?"; }

size_t prl_bus_dtype_size(prl_bus_dtype d) { return ((unsigned)d < 4) ? dtype_sizes[d] : 0; }

prl_status prl_bus_msg_init(prl_bus_msg *m, const prl_bus_type_spec *t, const char *run,
                            uint64_t id)
{
    memset(m, 0, sizeof *m);
    if (!t) return prl_error_set(PRL_ERR_ARG, "bus: the message type is not registered");
    snprintf(m->type, sizeof m->type, "%s", t->type);
    m->spec = t;
    m->fields = json_object();
    if (!m->fields) return prl_error_set(PRL_ERR_NOMEM, "bus: out of memory for a header");
    prl_status st = prl_bus_msg_set_str(m, "run", run);
    if (st == PRL_OK) st = prl_bus_msg_set_uint(m, "id", id);
    if (st != PRL_OK) prl_bus_msg_free(m);
    return st;
}

void prl_bus_msg_free(prl_bus_msg *m)
{
    if (!m) return;
    json_decref(m->fields);
    for (int i = 0; i < m->n_frames && i < PRL_BUS_MAX_FRAMES; i++) free(m->frames[i].data);
    memset(m, 0, sizeof *m);
}

const char *prl_bus_msg_run(const prl_bus_msg *m)
{
    const char *run = "";
    prl_bus_msg_get_str(m, "run", &run);
    return run;
}

uint64_t prl_bus_msg_id(const prl_bus_msg *m)
{
    uint64_t id = 0;
    prl_bus_msg_get_uint(m, "id", &id);
    return id;
}

/* The spec of a settable key, or an error naming why it cannot be set. */
static prl_status settable(const prl_bus_msg *m, const char *key, prl_bus_field_kind kind)
{
    if (!m->fields) return prl_error_set(PRL_ERR_ARG, "bus: message is not initialised");
    if (!key || prl_bus_key_reserved(key))
        return prl_error_set(PRL_ERR_ARG, "bus: header field '%s' is reserved for the codec",
                             key ? key : "(null)");
    const prl_bus_field_spec *f = prl_bus_field_find(m->spec, key);
    if (!f)
        return prl_error_set(PRL_ERR_ARG, "bus: header field '%s' is not part of message type '%s'",
                             key, m->type);
    if (f->kind != kind)
        return prl_error_set(PRL_ERR_ARG, "bus: header field '%s' of type '%s' is a %s field", key,
                             m->type,
                             f->kind == PRL_BUS_FIELD_UINT  ? "uint"
                             : f->kind == PRL_BUS_FIELD_STR ? "string"
                                                            : "hex64");
    return PRL_OK;
}

static prl_status set_value(prl_bus_msg *m, const char *key, json_t *v)
{
    if (!v || json_object_set_new(m->fields, key, v) != 0)
        return prl_error_set(PRL_ERR_NOMEM, "bus: out of memory setting header field '%s'", key);
    return PRL_OK;
}

prl_status prl_bus_msg_set_uint(prl_bus_msg *m, const char *key, uint64_t v)
{
    prl_status st = settable(m, key, PRL_BUS_FIELD_UINT);
    if (st != PRL_OK) return st;
    if (v > (uint64_t)INT64_MAX)
        return prl_error_set(PRL_ERR_RANGE, "bus: header field '%s' = %llu exceeds 2^63-1", key,
                             (unsigned long long)v);
    return set_value(m, key, json_integer((json_int_t)v));
}

prl_status prl_bus_msg_set_str(prl_bus_msg *m, const char *key, const char *v)
{
    prl_status st = settable(m, key, PRL_BUS_FIELD_STR);
    if (st != PRL_OK) return st;
    if (!v || !prl_bus_string_ok(v, strlen(v)))
        return prl_error_set(PRL_ERR_ARG,
                             "bus: header field '%s' must be a string of 1..%d bytes without "
                             "control characters",
                             key, PRL_BUS_MAX_STRING - 1);
    return set_value(m, key, json_string(v));
}

prl_status prl_bus_msg_set_hex64(prl_bus_msg *m, const char *key, uint64_t v)
{
    prl_status st = settable(m, key, PRL_BUS_FIELD_HEX64);
    if (st != PRL_OK) return st;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)v);
    return set_value(m, key, json_string(hex));
}

static const json_t *get_field(const prl_bus_msg *m, const char *key)
{
    return (m->fields && key) ? json_object_get(m->fields, key) : NULL;
}

prl_status prl_bus_msg_get_uint(const prl_bus_msg *m, const char *key, uint64_t *v)
{
    const json_t *j = get_field(m, key);
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return prl_error_set(PRL_ERR_ARG, "bus: '%s' message has no uint field '%s'", m->type,
                             key ? key : "(null)");
    *v = (uint64_t)json_integer_value(j);
    return PRL_OK;
}

prl_status prl_bus_msg_get_str(const prl_bus_msg *m, const char *key, const char **v)
{
    const json_t *j = get_field(m, key);
    if (!json_is_string(j))
        return prl_error_set(PRL_ERR_ARG, "bus: '%s' message has no string field '%s'", m->type,
                             key ? key : "(null)");
    *v = json_string_value(j);
    return PRL_OK;
}

prl_status prl_bus_msg_get_hex64(const prl_bus_msg *m, const char *key, uint64_t *v)
{
    const json_t *j = get_field(m, key);
    if (!json_is_string(j) || json_string_length(j) != 16 ||
        !prl_bus_hex64_parse(json_string_value(j), v))
        return prl_error_set(PRL_ERR_ARG, "bus: '%s' message has no hex64 field '%s'", m->type,
                             key ? key : "(null)");
    return PRL_OK;
}

prl_status prl_bus_msg_add_frame(prl_bus_msg *m, const char *name, prl_bus_dtype dtype,
                                 const void *data, size_t count)
{
    if (!m->fields) return prl_error_set(PRL_ERR_ARG, "bus: message is not initialised");
    if (!name || !prl_bus_name_ok(name, strlen(name)))
        return prl_error_set(PRL_ERR_ARG, "bus: frame name '%s' must be 1..%d of [A-Za-z0-9_]",
                             name ? name : "(null)", PRL_BUS_NAME_MAX - 1);
    if (prl_bus_dtype_size(dtype) == 0)
        return prl_error_set(PRL_ERR_ARG, "bus: frame '%s': unknown dtype %d", name, (int)dtype);
    if (m->n_frames >= PRL_BUS_MAX_FRAMES)
        return prl_error_set(PRL_ERR_RANGE, "bus: frame '%s': a message holds at most %d frames",
                             name, PRL_BUS_MAX_FRAMES);
    if (prl_bus_msg_frame(m, name))
        return prl_error_set(PRL_ERR_ARG, "bus: frame '%s' is already in the message", name);
    if (count > PRL_BUS_MAX_FRAME_BYTES / prl_bus_dtype_size(dtype))
        return prl_error_set(PRL_ERR_RANGE, "bus: frame '%s': %zu elements exceed %zu bytes", name,
                             count, PRL_BUS_MAX_FRAME_BYTES);
    if (count && !data) return prl_error_set(PRL_ERR_ARG, "bus: frame '%s': data is NULL", name);
    prl_bus_frame *f = &m->frames[m->n_frames];
    size_t bytes = count * prl_bus_dtype_size(dtype);
    void *copy = NULL;
    if (bytes) {
        copy = malloc(bytes);
        if (!copy)
            return prl_error_set(PRL_ERR_NOMEM, "bus: frame '%s': out of memory (%zu bytes)", name,
                                 bytes);
        memcpy(copy, data, bytes);
    }
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dtype = dtype;
    f->count = count;
    f->bytes = bytes;
    f->data = copy;
    m->n_frames++;
    return PRL_OK;
}

const prl_bus_frame *prl_bus_msg_frame(const prl_bus_msg *m, const char *name)
{
    for (int i = 0; i < m->n_frames; i++)
        if (strcmp(m->frames[i].name, name) == 0) return &m->frames[i];
    return NULL;
}

int prl_bus_msg_equal(const prl_bus_msg *a, const prl_bus_msg *b)
{
    if (strcmp(a->type, b->type) != 0 || a->n_frames != b->n_frames) return 0;
    if (!a->fields || !b->fields || !json_equal(a->fields, b->fields)) return 0;
    for (int i = 0; i < a->n_frames; i++) {
        const prl_bus_frame *x = &a->frames[i], *y = &b->frames[i];
        if (strcmp(x->name, y->name) != 0 || x->dtype != y->dtype || x->count != y->count ||
            x->bytes != y->bytes)
            return 0;
        if (x->bytes && memcmp(x->data, y->data, x->bytes) != 0) return 0;
    }
    return 1;
}

char *prl_bus_msg_text(const prl_bus_msg *m, const char *name)
{
    const prl_bus_frame *f = prl_bus_msg_frame(m, name);
    if (!f || f->dtype != PRL_BUS_BYTES) {
        prl_error_set(PRL_ERR_FORMAT, "'%s' message has no bytes frame '%s'", m->type, name);
        return NULL;
    }
    if (memchr(f->data, 0, f->bytes)) {
        prl_error_set(PRL_ERR_FORMAT, "'%s' frame '%s' holds a NUL byte", m->type, name);
        return NULL;
    }
    char *t = malloc(f->bytes + 1);
    if (!t) {
        prl_error_set(PRL_ERR_NOMEM, "frame '%s' of %zu bytes", name, f->bytes);
        return NULL;
    }
    if (f->bytes) memcpy(t, f->data, f->bytes);
    t[f->bytes] = 0;
    return t;
}
