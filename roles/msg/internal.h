/*
** internal.h — helpers shared by the message homes of roles/msg/ (not part of the public
** API): reading fields and frames with errors that name them, and the sequence frames that
** `train` and `teach` both carry (train.c).
*/
#ifndef PRL_MSG_INTERNAL_H
#define PRL_MSG_INTERNAL_H

#include "roles/msg/msg.h"

/* Schema-row shorthands: a required / optional uint, string or hex64 header field. */
#define MSG_U(n)                                                                                   \
    {                                                                                              \
        n, PRL_BUS_FIELD_UINT, 1                                                                   \
    }
#define MSG_U_OPT(n)                                                                               \
    {                                                                                              \
        n, PRL_BUS_FIELD_UINT, 0                                                                   \
    }
#define MSG_S(n)                                                                                   \
    {                                                                                              \
        n, PRL_BUS_FIELD_STR, 1                                                                    \
    }
#define MSG_S_OPT(n)                                                                               \
    {                                                                                              \
        n, PRL_BUS_FIELD_STR, 0                                                                    \
    }
#define MSG_H(n)                                                                                   \
    {                                                                                              \
        n, PRL_BUS_FIELD_HEX64, 1                                                                  \
    }

/* m is of type t (a decoder given another type's message refuses it). */
prl_status msg_is(const prl_bus_msg *m, const prl_bus_type_spec *t);
/* The uint / string / hex64 header field `key`; PRL_ERR_FORMAT naming it when absent. */
prl_status msg_uint(const prl_bus_msg *m, const char *key, uint64_t *v);
prl_status msg_str(const prl_bus_msg *m, const char *key, const char **v);
prl_status msg_hex64(const prl_bus_msg *m, const char *key, uint64_t *v);
/* An optional uint / string field, or `fallback` when it is absent. */
uint64_t msg_uint_or(const prl_bus_msg *m, const char *key, uint64_t fallback);
const char *msg_str_or(const prl_bus_msg *m, const char *key, const char *fallback);
/* The frame `name` of dtype dt and `count` elements (SIZE_MAX: any); PRL_ERR_FORMAT naming
** it when missing or of another dtype or size. */
prl_status msg_frame(const prl_bus_msg *m, const char *name, prl_bus_dtype dt, size_t count,
                     const prl_bus_frame **out);
/* The bytes frame `name` parsed as JSON (*out owned by the caller); PRL_ERR_FORMAT names the
** frame when it is missing or not JSON. */
prl_status msg_json(const prl_bus_msg *m, const char *name, json_t **out);
/* A header field 0 means "not given": set it only when v != 0. */
prl_status msg_set_uint_opt(prl_bus_msg *m, const char *key, uint64_t v);
/* Finish an encoder: on error free m (left empty) and prefix the error with the type. */
prl_status msg_done(prl_status rc, prl_bus_msg *m, const char *type);
/* Finish a decoder: on error zero x (of `size` bytes; the caller freed what it owns) and
** prefix the error with the type. */
prl_status msg_decoded(prl_status rc, void *x, size_t size, const char *type);

/* The frames of a sequence batch (train.c): field count and frames tokens, offsets,
** prompt_lens (i32) and mask (u8). `add` writes them from b; `read` checks each one's
** presence, dtype and size (mask: at most one entry per token), makes b a new batch with one
** response entry per mask entry and copies the four in; the caller reads the rest and runs
** prl_grpo_batch_check. On error b is not allocated. */
prl_status msg_seq_frames_add(const prl_grpo_batch *b, prl_bus_msg *m);
prl_status msg_seq_frames_read(prl_grpo_batch *b, const prl_bus_msg *m);

#endif /* PRL_MSG_INTERNAL_H */
