/*
** internal.h — helpers shared by the bus/ sources (not part of the public API): the checks
** both the encoder and the decoder apply, so a sender can never build a message its
** receiver would reject.
*/
#ifndef PRL_BUS_INTERNAL_H
#define PRL_BUS_INTERNAL_H

#include "bus/bus.h"

/* Keys every header has, owned by the codec rather than by a message type. */
int prl_bus_key_reserved(const char *key); /* "v", "type", "frames", "checksum" */
/* The spec of `key` in type `t`, with "run" (string) and "id" (uint) common to every type. */
const prl_bus_field_spec *prl_bus_field_find(const prl_bus_type_spec *t, const char *key);

/* 1 if s[0..len) is a valid frame name / type token / string field / hex64 text. */
int prl_bus_name_ok(const char *s, size_t len);
int prl_bus_type_token_ok(const char *s, size_t len);
int prl_bus_string_ok(const char *s, size_t len);
int prl_bus_hex64_parse(const char *s, uint64_t *v);

/* Check a JSON value against a field kind; on failure writes "header field 'KEY' must be
** ..." into reason and returns 0. */
int prl_bus_value_ok(const char *key, prl_bus_field_kind kind, const json_t *v, char *reason,
                     size_t n);

/* Check the header fields of a message of type `t` held in `obj` (reserved keys skipped):
** no unknown key, every required one present, every present one of the right kind. */
int prl_bus_fields_ok(const prl_bus_type_spec *t, const json_t *obj, char *reason, size_t n);

/* Check the frames a type requires are present with the right dtype. */
int prl_bus_frames_ok(const prl_bus_type_spec *t, const prl_bus_msg *m, char *reason, size_t n);

#endif /* PRL_BUS_INTERNAL_H */
