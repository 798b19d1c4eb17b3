/*
** bus_fuzz.h — test helpers shared by tests/test_bus.c and tests/test_sandbox_service.c:
** valid messages of any registered type, a mutable copy of an encoded message (wcopy), and
** the fuzz generators (random parts, mutations) that make invalid ones. Check asserts are
** used inside, so call them from Check tests only.
*/
#ifndef PRL_TESTS_BUS_FUZZ_H
#define PRL_TESTS_BUS_FUZZ_H

#include "bus/bus.h"
#include "roles/msg/msg.h"

#include <jansson.h>

/* A mutable, owned copy of an encoded message. */
typedef struct wcopy {
    int n;
    unsigned char *buf[PRL_BUS_MAX_PARTS + 8];
    size_t len[PRL_BUS_MAX_PARTS + 8];
} wcopy;

/* A valid message of `type` with every required field (optional ones too when `all`), the
** required frames and `extra` extra frames; contents drawn from `r`. */
void make_msg(prl_bus_msg *m, const char *type, prl_rng *r, int all, int extra);

/* wcopy: set/insert/remove part i (data copied), fill from an encoded message, free. */
void wc_set(wcopy *c, int i, const void *data, size_t len);
void wc_from_msg(wcopy *c, const prl_bus_msg *m);
void wc_free(wcopy *c);
void wc_remove(wcopy *c, int i);
void wc_insert(wcopy *c, int i, const void *data, size_t len);
/* Replace the header by `h` (stolen); fix_sum: recompute the checksum over the payloads. */
void wc_put_header(wcopy *c, json_t *h, int fix_sum);
/* prl_bus_decode of c's parts. */
prl_status wc_decode(const wcopy *c, prl_bus_msg *out, char *reason, size_t n);

/* Part i of a random message: random bytes, a registered type (part 0) or JSON-looking
** soup (part 1). */
void random_part(prl_rng *r, wcopy *c, int i);
/* Apply mutation `kind` (0..5: bit flip, truncation, frame drop, frame duplication, header
** JSON edit, header reformat) to c. Returns 1 when the message stays valid and equal, -1
** when it must become invalid, 0 when either may happen. */
int mutate(prl_rng *r, wcopy *c, int kind);
enum { MUTATION_KINDS = 6 };

#endif /* PRL_TESTS_BUS_FUZZ_H */
