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

/* The process-wide ZeroMQ context (socket.c; created on first use, NULL if that fails). */
void *prl_bus_context(void);
/* Write "LABEL: TEXT" to a log sink (stderr as "prl LABEL: TEXT" when log is NULL). */
void prl_bus_auth_log(prl_bus_log_fn log, void *ctx, const char *label, const char *text);

/* The authentication handler (auth.c). Register what a binding socket with o->secret
** accepts (starting the handler thread on first use) and get the ZAP domain to set on it;
** unregister when the socket closes; join the thread once the context has terminated. */
prl_status prl_bus_auth_register(void *ctx, void *zs, const prl_bus_socket_options *o,
                                 const char *label, char *domain, size_t n);
void prl_bus_auth_unregister(const char *domain);
/* The CURVE clients a registered domain accepts from now on (the list is copied). */
prl_status prl_bus_auth_allow_curve(const char *domain, const prl_bus_curve_allow *allow);
void prl_bus_auth_join(void);

#endif /* PRL_BUS_INTERNAL_H */
