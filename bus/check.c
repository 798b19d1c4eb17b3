/*
** check.c — the validation rules shared by the encoder and the decoder: a type's schema in a
** registry, tokens, names, strings, hex digests, header field kinds against the schema,
** required frames.
** Every rule that fails writes a reason naming the field or frame.
*/
#include "bus/internal.h"

#include <stdio.h>
#include <string.h>

static const prl_bus_field_spec common_fields[] = {
    {"run", PRL_BUS_FIELD_STR, 1},
    {"id", PRL_BUS_FIELD_UINT, 1},
};

const prl_bus_type_spec *prl_bus_registry_find(const prl_bus_registry *r, const char *type)
{
    for (int i = 0; r && type && i < r->n; i++)
        if (strcmp(r->types[i]->type, type) == 0) return r->types[i];
    return NULL;
}

int prl_bus_key_reserved(const char *key)
{
    return strcmp(key, "v") == 0 || strcmp(key, "type") == 0 || strcmp(key, "frames") == 0 ||
           strcmp(key, "checksum") == 0;
}

const prl_bus_field_spec *prl_bus_field_find(const prl_bus_type_spec *t, const char *key)
{
    for (size_t i = 0; i < sizeof common_fields / sizeof common_fields[0]; i++)
        if (strcmp(common_fields[i].name, key) == 0) return &common_fields[i];
    for (int i = 0; t && i < PRL_BUS_SPEC_FIELDS && t->fields[i].name; i++)
        if (strcmp(t->fields[i].name, key) == 0) return &t->fields[i];
    return NULL;
}

int prl_bus_name_ok(const char *s, size_t len)
{
    if (len == 0 || len >= PRL_BUS_NAME_MAX) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return 0;
    }
    return 1;
}

int prl_bus_type_token_ok(const char *s, size_t len)
{
    if (len == 0 || len >= PRL_BUS_TYPE_MAX) return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || s[i] == '_')) return 0;
    return 1;
}

int prl_bus_string_ok(const char *s, size_t len)
{
    if (len == 0 || len >= PRL_BUS_MAX_STRING) return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

int prl_bus_hex64_parse(const char *s, uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        x = (x << 4) | (uint64_t)d;
    }
    if (s[16] != '\0') return 0;
    *v = x;
    return 1;
}

int prl_bus_value_ok(const char *key, prl_bus_field_kind kind, const json_t *v, char *reason,
                     size_t n)
{
    uint64_t h;
    switch (kind) {
    case PRL_BUS_FIELD_UINT:
        if (json_is_integer(v) && json_integer_value(v) >= 0) return 1;
        snprintf(reason, n, "header field '%s' must be a non-negative integer", key);
        return 0;
    case PRL_BUS_FIELD_STR:
        if (json_is_string(v) && prl_bus_string_ok(json_string_value(v), json_string_length(v)))
            return 1;
        snprintf(reason, n,
                 "header field '%s' must be a string of 1..%d bytes without control characters",
                 key, PRL_BUS_MAX_STRING - 1);
        return 0;
    case PRL_BUS_FIELD_HEX64:
        if (json_is_string(v) && json_string_length(v) == 16 &&
            prl_bus_hex64_parse(json_string_value(v), &h))
            return 1;
        snprintf(reason, n, "header field '%s' must be 16 lowercase hex digits", key);
        return 0;
    }
    snprintf(reason, n, "header field '%s' has an unknown kind", key);
    return 0;
}

static int required_present(const prl_bus_type_spec *t, const json_t *obj, char *reason, size_t n)
{
    for (size_t i = 0; i < sizeof common_fields / sizeof common_fields[0]; i++)
        if (!json_object_get(obj, common_fields[i].name)) {
            snprintf(reason, n, "header field '%s' is missing", common_fields[i].name);
            return 0;
        }
    for (int i = 0; i < PRL_BUS_SPEC_FIELDS && t->fields[i].name; i++)
        if (t->fields[i].required && !json_object_get(obj, t->fields[i].name)) {
            snprintf(reason, n, "header field '%s' is missing (required by type '%s')",
                     t->fields[i].name, t->type);
            return 0;
        }
    return 1;
}

int prl_bus_fields_ok(const prl_bus_type_spec *t, const json_t *obj, char *reason, size_t n)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        if (prl_bus_key_reserved(key)) continue;
        const prl_bus_field_spec *f = prl_bus_field_find(t, key);
        if (!f) {
            snprintf(reason, n, "header field '%.64s' is not part of message type '%s'", key,
                     t->type);
            return 0;
        }
        if (!prl_bus_value_ok(key, f->kind, v, reason, n)) return 0;
    }
    return required_present(t, obj, reason, n);
}

int prl_bus_frames_ok(const prl_bus_type_spec *t, const prl_bus_msg *m, char *reason, size_t n)
{
    for (int i = 0; i < PRL_BUS_SPEC_FRAMES && t->frames[i].name; i++) {
        const prl_bus_frame *f = prl_bus_msg_frame(m, t->frames[i].name);
        if (!f) {
            snprintf(reason, n, "frame '%s' is missing (required by type '%s')", t->frames[i].name,
                     t->type);
            return 0;
        }
        if (f->dtype != t->frames[i].dtype) {
            snprintf(reason, n, "frame '%s' has dtype %s; type '%s' requires %s", f->name,
                     prl_bus_dtype_name(f->dtype), t->type, prl_bus_dtype_name(t->frames[i].dtype));
            return 0;
        }
    }
    return 1;
}
