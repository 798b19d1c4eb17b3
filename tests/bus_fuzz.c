/*
** bus_fuzz.c — the message generators of bus_fuzz.h: valid messages, a mutable wire copy,
** random parts and mutations (moved out of test_bus.c so that the sandbox service's fuzz
** test sends the same kinds of bad messages).
*/
#include "tests/bus_fuzz.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A valid message of `type` with every field of the registry set (optional ones too when
** `all`), the required frames, and `extra` extra frames; contents drawn from `r`. */
void make_msg(prl_bus_msg *m, const char *type, prl_rng *r, int all, int extra)
{
    const prl_bus_type_spec *t = prl_msg_spec(type);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(prl_bus_msg_init(m, prl_msg_spec(type), "run-1", prl_rng_u64(r) % 100000),
                     PRL_OK);
    for (int i = 0; i < PRL_BUS_SPEC_FIELDS && t->fields[i].name; i++) {
        const prl_bus_field_spec *f = &t->fields[i];
        if (!f->required && !all) continue;
        char s[64];
        snprintf(s, sizeof s, "val-%llu /x.y", (unsigned long long)(prl_rng_u64(r) % 1000));
        prl_status st =
            f->kind == PRL_BUS_FIELD_UINT  ? prl_bus_msg_set_uint(m, f->name, prl_rng_u64(r) % 5000)
            : f->kind == PRL_BUS_FIELD_STR ? prl_bus_msg_set_str(m, f->name, s)
                                           : prl_bus_msg_set_hex64(m, f->name, prl_rng_u64(r));
        ck_assert_msg(st == PRL_OK, "%s", prl_error_message());
    }
    int n = 1 + (int)(prl_rng_u64(r) % 12);
    for (int i = 0; i < PRL_BUS_SPEC_FRAMES && t->frames[i].name; i++) {
        float buf[16];
        for (int k = 0; k < n; k++) buf[k] = (float)prl_rng_normal(r);
        ck_assert_int_eq(prl_bus_msg_add_frame(m, t->frames[i].name, t->frames[i].dtype, buf, n),
                         PRL_OK);
    }
    for (int e = 0; e < extra; e++) {
        unsigned char bytes[40];
        for (int k = 0; k < 40; k++) bytes[k] = (unsigned char)prl_rng_u64(r);
        char name[16];
        snprintf(name, sizeof name, "extra%d", e);
        prl_bus_dtype d = (prl_bus_dtype)(prl_rng_u64(r) % 4);
        size_t cnt = prl_rng_u64(r) % 11; /* at most 40 bytes */
        ck_assert_int_eq(prl_bus_msg_add_frame(m, name, d, bytes, cnt), PRL_OK);
    }
}

void wc_set(wcopy *c, int i, const void *data, size_t len)
{
    free(c->buf[i]);
    c->buf[i] = malloc(len ? len : 1);
    if (len) memcpy(c->buf[i], data, len);
    c->len[i] = len;
}

void wc_from_msg(wcopy *c, const prl_bus_msg *m)
{
    prl_bus_wire w;
    memset(c, 0, sizeof *c);
    ck_assert_msg(prl_bus_encode(m, &w) == PRL_OK, "%s", prl_error_message());
    for (int i = 0; i < w.n; i++) wc_set(c, i, w.parts[i].data, w.parts[i].len);
    c->n = w.n;
    prl_bus_wire_free(&w);
}

void wc_free(wcopy *c)
{
    for (int i = 0; i < PRL_BUS_MAX_PARTS + 8; i++) free(c->buf[i]);
    memset(c, 0, sizeof *c);
}

void wc_remove(wcopy *c, int i)
{
    free(c->buf[i]);
    for (int k = i; k + 1 < c->n; k++) {
        c->buf[k] = c->buf[k + 1];
        c->len[k] = c->len[k + 1];
    }
    c->n--;
    c->buf[c->n] = NULL;
    c->len[c->n] = 0;
}

void wc_insert(wcopy *c, int i, const void *data, size_t len)
{
    for (int k = c->n; k > i; k--) {
        c->buf[k] = c->buf[k - 1];
        c->len[k] = c->len[k - 1];
    }
    c->buf[i] = NULL;
    c->n++;
    wc_set(c, i, data, len);
}

/* Replace the header by `h` (stolen); fix_sum: recompute the checksum over the payloads. */
void wc_put_header(wcopy *c, json_t *h, int fix_sum)
{
    if (fix_sum) {
        prl_bus_part p[PRL_BUS_MAX_PARTS + 8];
        for (int i = 2; i < c->n; i++) p[i - 2] = (prl_bus_part){c->buf[i], c->len[i]};
        char sum[17];
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)prl_bus_checksum(p, c->n - 2));
        json_object_set_new(h, "checksum", json_string(sum));
    }
    char *text = json_dumps(h, JSON_COMPACT);
    wc_set(c, 1, text, strlen(text));
    free(text);
    json_decref(h);
}

prl_status wc_decode(const wcopy *c, prl_bus_msg *out, char *reason, size_t n)
{
    prl_bus_part p[PRL_BUS_MAX_PARTS + 8];
    for (int i = 0; i < c->n; i++) p[i] = (prl_bus_part){c->buf[i], c->len[i]};
    return prl_bus_decode(prl_msg_registry(), p, c->n, out, reason, n);
}

static const char *const json_soup[] = {
    "{",       "}",         "[",           "]",          ",",
    ":",       "\"v\"",     "\"type\"",    "\"frames\"", "\"checksum\"",
    "\"run\"", "\"id\"",    "1",           "-1",         "0.5",
    "\"x\"",   "null",      "true",        "\"name\"",   "\"dtype\"",
    "\"i32\"", "\"count\"", "\"\\u0000\"", " "};

void random_part(prl_rng *r, wcopy *c, int i)
{
    unsigned char b[300];
    size_t n = prl_rng_u64(r) % sizeof b;
    int mode = (int)(prl_rng_u64(r) % 3);
    if (i == 0 && mode == 0) {
        const char *t =
            prl_msg_registry()->types[prl_rng_u64(r) % (uint64_t)prl_msg_registry()->n]->type;
        wc_set(c, i, t, strlen(t));
        return;
    }
    if (i == 1 && mode != 2) { /* JSON-looking soup */
        size_t k = 0, words = prl_rng_u64(r) % 40;
        for (size_t w = 0; w < words; w++) {
            const char *s = json_soup[prl_rng_u64(r) % (sizeof json_soup / sizeof json_soup[0])];
            size_t l = strlen(s);
            if (k + l >= sizeof b) break;
            memcpy(b + k, s, l);
            k += l;
        }
        wc_set(c, i, b, k);
        return;
    }
    for (size_t k = 0; k < n; k++) b[k] = (unsigned char)prl_rng_u64(r);
    wc_set(c, i, b, n);
}

static json_t *random_json(prl_rng *r)
{
    switch (prl_rng_u64(r) % 8) {
    case 0: return json_integer((json_int_t)(prl_rng_u64(r) % 20) - 5);
    case 1: return json_string("");
    case 2: return json_string("x");
    case 3: return json_real(1.5);
    case 4: return json_null();
    case 5: return json_object();
    case 6: return json_array();
    default: return json_string("0123456789abcdef");
    }
}

static const char *const edit_keys[] = {"v",        "type",   "run",   "id",      "frames",
                                        "checksum", "step",   "lease", "version", "path",
                                        "reason",   "worker", "zzz"};

/* Apply mutation `kind` to c. Returns 1 when the mutation keeps the message valid and equal,
** -1 when it must make it invalid (anything but a bit flip in the header: a flipped payload
** bit breaks the checksum, a truncated type or header is never valid, a dropped or
** duplicated frame breaks the frame count), 0 when either may happen. */
int mutate(prl_rng *r, wcopy *c, int kind)
{
    int i = (int)(prl_rng_u64(r) % (uint64_t)c->n);
    switch (kind) {
    case 0: /* bit flip */
        if (c->len[i])
            c->buf[i][prl_rng_u64(r) % c->len[i]] ^= (unsigned char)(1u << (prl_rng_u64(r) % 8));
        else wc_set(c, i, "\x01", 1);
        return i == 1 ? 0 : -1;
    case 1: /* truncation (of a non-empty frame) */
        if (!c->len[i]) i = 1;
        c->len[i] = prl_rng_u64(r) % c->len[i];
        return -1;
    case 2: wc_remove(c, i); return -1;                       /* frame drop */
    case 3: wc_insert(c, i, c->buf[i], c->len[i]); return -1; /* frame duplication */
    case 4: {                                                 /* header JSON edit */
        json_t *h = json_loadb((const char *)c->buf[1], c->len[1], 0, NULL);
        const char *key = edit_keys[prl_rng_u64(r) % (sizeof edit_keys / sizeof edit_keys[0])];
        if (prl_rng_u64(r) % 3 == 0) json_object_del(h, key);
        else json_object_set_new(h, key, random_json(r));
        wc_put_header(c, h, (int)(prl_rng_u64(r) % 2));
        return 0;
    }
    default: { /* benign: reformat header */
        json_t *h = json_loadb((const char *)c->buf[1], c->len[1], 0, NULL);
        char *text = json_dumps(h, JSON_INDENT(prl_rng_u64(r) % 4) | JSON_SORT_KEYS);
        wc_set(c, 1, text, strlen(text));
        free(text);
        json_decref(h);
        return 1;
    }
    }
}
