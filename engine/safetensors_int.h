/*
** safetensors_int.h — private to the safetensors sources (engine/safetensors*.c, see
** safetensors.c): the helpers the reader and the writer share (dtype checks, UTF-8, names,
** shapes, bounded renderings of names for messages), and the reader's checks. Include
** engine/engine.h from outside; the API is engine/safetensors.h.
*/
#ifndef PRL_SAFETENSORS_INT_H
#define PRL_SAFETENSORS_INT_H

#include "engine/engine.h"

/* ---------------------------------------------------------------- safetensors.c ---- */

int st__dtype_valid(prl_dtype d);
/* Length of the longest valid UTF-8 prefix of s[0..n) (RFC 3629); n: all of it is valid. */
size_t st__utf8_valid_prefix(const uint8_t *s, size_t n);
/* A printable, bounded rendering of a possibly hostile name for messages; returns buf. */
const char *st__printable(char *buf, size_t cap, const char *s, size_t n);

#define NAME_BUF 96 /* room for printable() renderings of names in messages */

/* "[1,2,3]"; "[...]" if it does not fit (SHAPE_BUF always fits). Returns buf. */
const char *st__format_shape(char *buf, size_t cap, const int64_t *shape, int ndim);

#define SHAPE_BUF (PRL_SAFETENSORS_MAX_DIMS * 21 + 4)

/* Project rule: tensor names are non-empty [A-Za-z0-9._-]. */
int st__name_valid(const char *s, size_t n);
/* Element count and byte size of a shape with overflow checks in the reference's order;
** 0 on overflow. */
int st__shape_bytes(const int64_t *shape, int ndim, size_t elem, size_t *numel, size_t *nbytes);
uint64_t st__load_u64le(const uint8_t *p);

/* ---------------------------------------------------------------- safetensors_check.c - */

/* Set a PRL_ERR_FORMAT message prefixed with "safetensors <label>: ". */
prl_status st__format_error(const prl_safetensors *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Every check of the file in st->bytes[0, st->size), in the reference's order, then the
** tensors sorted by offset, pointed at their bytes and indexed by name. */
prl_status st__parse_all(prl_safetensors *st);

#endif /* PRL_SAFETENSORS_INT_H */
