/*
** registry.c — every message type of prl (msg.h) in one list, and the helpers the homes
** share (internal.h). A new message type is a row here, a home file with its schema, struct
** and codec, and a section of docs/protocol.md.
*/
#include "roles/msg/internal.h"

#include <string.h>

extern const prl_bus_type_spec prl_msg_hello_spec, prl_msg_heartbeat_spec, prl_msg_welcome_spec,
    prl_msg_work_spec, prl_msg_result_spec, prl_msg_score_spec, prl_msg_scored_spec,
    prl_msg_train_spec, prl_msg_trained_spec, prl_msg_teach_spec, prl_msg_taught_spec,
    prl_msg_exec_spec, prl_msg_exec_result_spec, prl_msg_weights_spec, prl_msg_ack_spec,
    prl_msg_error_spec, prl_msg_stop_spec, prl_msg_fetch_spec, prl_msg_chunk_spec;

static const prl_bus_type_spec *const types[] = {
    &prl_msg_hello_spec,       &prl_msg_heartbeat_spec, &prl_msg_welcome_spec, &prl_msg_work_spec,
    &prl_msg_result_spec,      &prl_msg_score_spec,     &prl_msg_scored_spec,  &prl_msg_train_spec,
    &prl_msg_trained_spec,     &prl_msg_teach_spec,     &prl_msg_taught_spec,  &prl_msg_exec_spec,
    &prl_msg_exec_result_spec, &prl_msg_weights_spec,   &prl_msg_ack_spec,     &prl_msg_error_spec,
    &prl_msg_stop_spec,        &prl_msg_fetch_spec,     &prl_msg_chunk_spec,
};

static const prl_bus_registry registry = {types, (int)(sizeof types / sizeof types[0])};

const prl_bus_registry *prl_msg_registry(void) { return &registry; }

const prl_bus_type_spec *prl_msg_spec(const char *type)
{
    return prl_bus_registry_find(&registry, type);
}

/* ---------------------------------------------------------------- helpers ---------- */

prl_status msg_is(const prl_bus_msg *m, const prl_bus_type_spec *t)
{
    if (m->spec != t && strcmp(m->type, t->type))
        return prl_error_set(PRL_ERR_FORMAT, "a '%s' message, expected '%s'", m->type, t->type);
    return PRL_OK;
}

static prl_status absent(prl_status rc, const char *key)
{
    return rc ? prl_error_set(PRL_ERR_FORMAT, "header field '%s' is missing", key) : PRL_OK;
}

prl_status msg_uint(const prl_bus_msg *m, const char *key, uint64_t *v)
{
    return absent(prl_bus_msg_get_uint(m, key, v), key);
}

prl_status msg_str(const prl_bus_msg *m, const char *key, const char **v)
{
    return absent(prl_bus_msg_get_str(m, key, v), key);
}

prl_status msg_hex64(const prl_bus_msg *m, const char *key, uint64_t *v)
{
    return absent(prl_bus_msg_get_hex64(m, key, v), key);
}

uint64_t msg_uint_or(const prl_bus_msg *m, const char *key, uint64_t fallback)
{
    uint64_t v;
    return prl_bus_msg_get_uint(m, key, &v) == PRL_OK ? v : fallback;
}

const char *msg_str_or(const prl_bus_msg *m, const char *key, const char *fallback)
{
    const char *v;
    return prl_bus_msg_get_str(m, key, &v) == PRL_OK ? v : fallback;
}

prl_status msg_frame(const prl_bus_msg *m, const char *name, prl_bus_dtype dt, size_t count,
                     const prl_bus_frame **out)
{
    const prl_bus_frame *f = prl_bus_msg_frame(m, name);
    if (!f) return prl_error_set(PRL_ERR_FORMAT, "frame '%s' is missing", name);
    if (f->dtype != dt)
        return prl_error_set(PRL_ERR_FORMAT, "frame '%s' is %s, expected %s", name,
                             prl_bus_dtype_name(f->dtype), prl_bus_dtype_name(dt));
    if (count != SIZE_MAX && f->count != count)
        return prl_error_set(PRL_ERR_FORMAT, "frame '%s' has %zu elements, expected %zu", name,
                             f->count, count);
    *out = f;
    return PRL_OK;
}

prl_status msg_json(const prl_bus_msg *m, const char *name, json_t **out)
{
    const prl_bus_frame *f = NULL; /* set by msg_frame on success; gcc -O3 cannot see that */
    prl_status rc = msg_frame(m, name, PRL_BUS_BYTES, SIZE_MAX, &f);
    if (rc) return rc;
    json_error_t je;
    *out = json_loadb(f->data ? f->data : "", f->bytes, 0, &je);
    if (!*out) return prl_error_set(PRL_ERR_FORMAT, "frame '%s' is not JSON: %s", name, je.text);
    return PRL_OK;
}

prl_status msg_set_uint_opt(prl_bus_msg *m, const char *key, uint64_t v)
{
    return v ? prl_bus_msg_set_uint(m, key, v) : PRL_OK;
}

prl_status msg_decoded(prl_status rc, void *x, size_t size, const char *type)
{
    if (!rc) return PRL_OK;
    memset(x, 0, size);
    return prl_error_wrap(rc, "%s: ", type);
}

prl_status msg_done(prl_status rc, prl_bus_msg *m, const char *type)
{
    if (!rc) return PRL_OK;
    prl_bus_msg_free(m);
    return prl_error_wrap(rc, "%s: ", type);
}
