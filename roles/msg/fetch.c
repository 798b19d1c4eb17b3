/*
** fetch.c — weights over the bus (msg.h): `fetch` (a worker on another host asks for a piece
** of one file of policy version v) and `chunk` (the controller's answer: the bytes, the
** file's size, the bytes' checksum and the version's weights checksum), so that no host
** needs the trainer's disk (docs/scale-out.md "Several hosts").
*/
#include "roles/msg/internal.h"

#include <string.h>

const prl_bus_type_spec prl_msg_fetch_spec = {
    "fetch",
    "a worker asks the controller for `length` bytes at `offset` of checkpoint file `file` "
    "of policy version `version`",
    {MSG_U("version"), MSG_S("file"), MSG_U("offset"), MSG_U("length")},
    {{0}}};
const prl_bus_type_spec prl_msg_chunk_spec = {
    "chunk",
    "the controller answers fetch `ref`: the bytes (frame `data`), the file's `size`, the "
    "bytes' prl_checksum64 `sum` and the version's weights checksum `ckpt_checksum`",
    {MSG_U("ref"), MSG_U("version"), MSG_S("file"), MSG_U("offset"), MSG_U_OPT("size"),
     MSG_H("sum"), MSG_H("ckpt_checksum")},
    {{"data", PRL_BUS_BYTES}}};

/* The files a version is fetched as: what a rollout worker loads. */
static const char *const files[] = {"config.json", "tokenizer.json", "model.safetensors"};

const char *prl_msg_fetch_file(int i)
{
    return i >= 0 && i < (int)(sizeof files / sizeof files[0]) ? files[i] : NULL;
}

static int file_known(const char *f)
{
    for (int i = 0; prl_msg_fetch_file(i); i++)
        if (!strcmp(prl_msg_fetch_file(i), f)) return 1;
    return 0;
}

prl_status prl_msg_fetch_encode(const prl_msg_fetch *x, const char *run, uint64_t id,
                                prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_fetch_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "version", x->version);
    if (!rc) rc = prl_bus_msg_set_str(m, "file", x->file);
    if (!rc) rc = prl_bus_msg_set_uint(m, "offset", x->offset);
    if (!rc) rc = prl_bus_msg_set_uint(m, "length", x->length);
    return msg_done(rc, m, "fetch");
}

prl_status prl_msg_fetch_decode(const prl_bus_msg *m, prl_msg_fetch *x)
{
    memset(x, 0, sizeof *x);
    prl_status rc = msg_is(m, &prl_msg_fetch_spec);
    if (!rc) rc = msg_uint(m, "version", &x->version);
    if (!rc) rc = msg_str(m, "file", &x->file);
    if (!rc) rc = msg_uint(m, "offset", &x->offset);
    if (!rc) rc = msg_uint(m, "length", &x->length);
    if (!rc && !file_known(x->file))
        rc = prl_error_set(PRL_ERR_FORMAT,
                           "file '%s' is not one of config.json, tokenizer.json, "
                           "model.safetensors",
                           x->file);
    if (!rc && (x->length < 1 || x->length > PRL_MSG_CHUNK_MAX))
        rc = prl_error_set(PRL_ERR_FORMAT, "length %llu must be in 1..%d",
                           (unsigned long long)x->length, PRL_MSG_CHUNK_MAX);
    return msg_decoded(rc, x, sizeof *x, "fetch");
}

prl_status prl_msg_chunk_encode(const prl_msg_chunk *x, const char *run, uint64_t id,
                                prl_bus_msg *m)
{
    prl_status rc = prl_bus_msg_init(m, &prl_msg_chunk_spec, run, id);
    if (!rc) rc = prl_bus_msg_set_uint(m, "ref", x->ref);
    if (!rc) rc = prl_bus_msg_set_uint(m, "version", x->version);
    if (!rc) rc = prl_bus_msg_set_str(m, "file", x->file);
    if (!rc) rc = prl_bus_msg_set_uint(m, "offset", x->offset);
    if (!rc) rc = prl_bus_msg_set_uint(m, "size", x->size);
    if (!rc) rc = prl_bus_msg_set_hex64(m, "sum", x->sum);
    if (!rc) rc = prl_bus_msg_set_hex64(m, "ckpt_checksum", x->ckpt_checksum);
    if (!rc) rc = prl_bus_msg_add_frame(m, "data", PRL_BUS_BYTES, x->data, x->len);
    return msg_done(rc, m, "chunk");
}

prl_status prl_msg_chunk_decode(const prl_bus_msg *m, prl_msg_chunk *x)
{
    memset(x, 0, sizeof *x);
    const prl_bus_frame *f = NULL;
    prl_status rc = msg_is(m, &prl_msg_chunk_spec);
    if (!rc) rc = msg_uint(m, "ref", &x->ref);
    if (!rc) rc = msg_uint(m, "version", &x->version);
    if (!rc) rc = msg_str(m, "file", &x->file);
    if (!rc) rc = msg_uint(m, "offset", &x->offset);
    if (!rc) x->size = msg_uint_or(m, "size", 0);
    if (!rc) rc = msg_hex64(m, "sum", &x->sum);
    if (!rc) rc = msg_hex64(m, "ckpt_checksum", &x->ckpt_checksum);
    if (!rc) rc = msg_frame(m, "data", PRL_BUS_BYTES, SIZE_MAX, &f);
    if (!rc) x->data = f->data, x->len = f->bytes;
    if (!rc && (x->offset > x->size || x->len > x->size - x->offset))
        rc = prl_error_set(PRL_ERR_FORMAT, "%zu bytes at offset %llu pass the size %llu", x->len,
                           (unsigned long long)x->offset, (unsigned long long)x->size);
    return msg_decoded(rc, x, sizeof *x, "chunk");
}
