/*
** safetensors.c — a strict safetensors reader and a byte-exact, atomic writer.
**
** This file holds the dtypes, the helpers reader and writer share, the reader's entry points
** (parse a buffer, open and mmap a file, find a tensor, read metadata) and the conversions of
** read_f32/read_f64; the rest is split around the private safetensors_int.h:
**   safetensors_check.c  the reader's checks, in the reference implementation's order
**   safetensors_write.c  the writer: the reference writer's layout, in memory or to a file
**
** Not here: interpreting tensors (the model loader does that with read_f32/read_f64),
** big-endian hosts (the format is little-endian and so is every target machine; the
** converters load bytes explicitly anyway).
*/
#include "engine/safetensors_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- dtypes ----------- */

static const struct {
    const char *name;
    size_t size;
} dtype_table[PRL_DTYPE_COUNT] = {
    [PRL_DTYPE_BOOL] = {"BOOL", 1},       [PRL_DTYPE_U8] = {"U8", 1},
    [PRL_DTYPE_I8] = {"I8", 1},           [PRL_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [PRL_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [PRL_DTYPE_I16] = {"I16", 2},
    [PRL_DTYPE_U16] = {"U16", 2},         [PRL_DTYPE_F16] = {"F16", 2},
    [PRL_DTYPE_BF16] = {"BF16", 2},       [PRL_DTYPE_I32] = {"I32", 4},
    [PRL_DTYPE_U32] = {"U32", 4},         [PRL_DTYPE_F32] = {"F32", 4},
    [PRL_DTYPE_F64] = {"F64", 8},         [PRL_DTYPE_I64] = {"I64", 8},
    [PRL_DTYPE_U64] = {"U64", 8},
};

int st__dtype_valid(prl_dtype d) { return (int)d >= 0 && d < PRL_DTYPE_COUNT; }

const char *prl_dtype_name(prl_dtype dtype)
{
    return st__dtype_valid(dtype) ? dtype_table[dtype].name : NULL;
}

size_t prl_dtype_size(prl_dtype dtype)
{
    return st__dtype_valid(dtype) ? dtype_table[dtype].size : 0;
}

prl_dtype prl_dtype_from_name(const char *name)
{
    for (int d = 0; d < PRL_DTYPE_COUNT; d++)
        if (name && strcmp(name, dtype_table[d].name) == 0) return (prl_dtype)d;
    return PRL_DTYPE_COUNT;
}

/* ---------------------------------------------------------------- helpers ---------- */

/* Length of the longest valid UTF-8 prefix of s[0..n) (RFC 3629: no overlong forms, no
** surrogates, nothing above U+10FFFF); n means the whole range is valid. */
size_t st__utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0; /* overlong */
            if (c == 0xED) hi = 0x9F; /* UTF-16 surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90; /* overlong */
            if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
        } else {
            return i; /* continuation byte, C0/C1 or F5..FF as a lead byte */
        }
        if (n - i < len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}

/* A printable, bounded rendering of a possibly hostile name for error messages: bytes
** outside printable ASCII (and the backslash, to keep escapes unambiguous) become \xHH and
** long names are cut with "...", so a 100 MB key or a control character cannot garble or
** crowd out the message. Returns buf. */
const char *st__printable(char *buf, size_t cap, const char *s, size_t n)
{
    size_t o = 0;
    PRL_ASSERT(cap >= 8);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t need = (c >= 0x20 && c < 0x7F && c != '\\') ? 1 : 4;
        if (o + need + 4 > cap) {
            memcpy(buf + o, "...", 4);
            return buf;
        }
        if (need == 1) buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

/* "[1,2,3]"; "[...]" if it does not fit (SHAPE_BUF always fits PRL_SAFETENSORS_MAX_DIMS
** dimensions: 8 x 21 characters + brackets). Returns buf. */
const char *st__format_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t o = 0;
    buf[o++] = '[';
    for (int i = 0; i < ndim; i++) {
        int k = snprintf(buf + o, cap - o, "%s%" PRId64, i ? "," : "", shape[i]);
        if (k < 0 || (size_t)k >= cap - o) {
            snprintf(buf, cap, "[...]");
            return buf;
        }
        o += (size_t)k;
    }
    if (o + 2 > cap) {
        snprintf(buf, cap, "[...]");
        return buf;
    }
    buf[o++] = ']';
    buf[o] = '\0';
    return buf;
}

/* Project rule: tensor names are non-empty [A-Za-z0-9._-], so they never need JSON
** escaping, are safe in file names and messages, and compare the same everywhere. */
int st__name_valid(const char *s, size_t n)
{
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok) return 0;
    }
    return 1;
}

/* Element count and byte size of a shape, multiplied left to right with overflow checks
** in the reference's order (so [2^62, 2^62, 0] overflows there and here alike). */
int st__shape_bytes(const int64_t *shape, int ndim, size_t elem, size_t *numel, size_t *nbytes)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d) return 0;
        n *= d;
    }
    if (n > SIZE_MAX || (elem && n > SIZE_MAX / elem)) return 0;
    *numel = (size_t)n;
    *nbytes = (size_t)n * elem;
    return 1;
}

uint64_t st__load_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---------------------------------------------------------------- reader ----------- */

void prl_safetensors_free(prl_safetensors *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->n_metadata; i++) {
        free(st->metadata_keys[i]);
        free(st->metadata_values[i]);
    }
    free(st->tensors);
    free(st->by_name);
    free(st->metadata_keys);
    free(st->metadata_values);
    free(st->label);
    if (st->map) munmap(st->map, st->map_len);
    memset(st, 0, sizeof *st);
}

prl_status prl_safetensors_parse(prl_safetensors *st, const void *buf, size_t len,
                                 const char *label)
{
    if (!st) return prl_error_set(PRL_ERR_ARG, "safetensors: parse: NULL handle");
    memset(st, 0, sizeof *st);
    if (!buf && len)
        return prl_error_set(PRL_ERR_ARG, "safetensors %s: parse: NULL buffer of %zu bytes",
                             label ? label : "<memory>", len);
    st->label = strdup(label ? label : "<memory>");
    if (!st->label) return prl_error_set(PRL_ERR_NOMEM, "safetensors: out of memory");
    st->bytes = buf ? buf : (const void *)"";
    st->size = len;
    prl_status rc = st__parse_all(st);
    if (rc != PRL_OK) prl_safetensors_free(st);
    return rc;
}

prl_status prl_safetensors_open(prl_safetensors *st, const char *path)
{
    if (!st || !path) return prl_error_set(PRL_ERR_ARG, "safetensors: open: NULL argument");
    memset(st, 0, sizeof *st);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "safetensors %s: open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return prl_error_set(PRL_ERR_IO, "safetensors %s: stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return prl_error_set(PRL_ERR_IO, "safetensors %s: not a regular file", path);
    }
    if ((uintmax_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return prl_error_set(PRL_ERR_IO, "safetensors %s: file too large to map", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) { /* mmap of 0 bytes is an error; parse reports the empty file instead */
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return prl_error_set(PRL_ERR_IO, "safetensors %s: mmap: %s", path, strerror(e));
        }
    }
    close(fd); /* the mapping keeps the file open */
    prl_status rc = prl_safetensors_parse(st, map, size, path);
    if (rc != PRL_OK) {
        if (map) munmap(map, size);
        return rc;
    }
    st->map = map;
    st->map_len = size;
    return PRL_OK;
}

const prl_safetensors_tensor *prl_safetensors_find(const prl_safetensors *st, const char *name)
{
    if (!st || !name) return NULL;
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const prl_safetensors_tensor *t = &st->tensors[st->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

const char *prl_safetensors_metadata(const prl_safetensors *st, const char *key)
{
    if (!st || !key) return NULL;
    for (size_t i = 0; i < st->n_metadata; i++)
        if (strcmp(st->metadata_keys[i], key) == 0) return st->metadata_values[i];
    return NULL;
}

/* ---------------------------------------------------------------- conversion ------- */

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "F32 tensors are copied as they are");

static uint16_t load_u16le(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t load_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE binary16 -> binary32, exact for every input (NaN payloads kept). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float (man < 2^10) */
    float mag = (float)man * 0x1p-24f;
    return sign ? -mag : mag;
}

/* bfloat16 is the top half of a binary32. */
static float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* float8 e4m3fn (the "F8_E4M3" of safetensors, torch.float8_e4m3fn): bias 7, no infinities,
** S.1111.111 is NaN; exact in float. */
static float f8e4m3_to_f32(uint8_t b)
{
    int exp = (b >> 3) & 0xf, man = b & 7;
    float mag;
    if (exp == 0xf && man == 7) mag = NAN;
    else if (exp == 0) mag = (float)man * 0x1p-9f; /* subnormal: man/8 · 2^-6 */
    else mag = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return (b & 0x80) ? -mag : mag;
}

static double f64_load(const uint8_t *p)
{
    uint64_t u = st__load_u64le(p);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Shared front half of read_f32/read_f64: argument checks, lookup, shape and dtype
** checks. `to` names the target type for messages. */
static prl_status read_prepare(const prl_safetensors *st, const char *name, const int64_t *expect,
                               int expect_ndim, const void *out, const char *to,
                               const prl_safetensors_tensor **tp)
{
    char nb[NAME_BUF], sa[SHAPE_BUF], sb[SHAPE_BUF];
    if (!st || !name) return prl_error_set(PRL_ERR_ARG, "safetensors: read_%s: NULL argument", to);
    const char *shown = st__printable(nb, sizeof nb, name, strlen(name));
    if (expect_ndim < 0 || expect_ndim > PRL_SAFETENSORS_MAX_DIMS || (expect_ndim && !expect))
        return prl_error_set(PRL_ERR_ARG, "safetensors %s: read_%s '%s': bad expected rank %d",
                             st->label, to, shown, expect_ndim);
    for (int i = 0; i < expect_ndim; i++)
        if (expect[i] < 0)
            return prl_error_set(PRL_ERR_ARG,
                                 "safetensors %s: read_%s '%s': negative expected "
                                 "dimension %" PRId64,
                                 st->label, to, shown, expect[i]);
    const prl_safetensors_tensor *t = prl_safetensors_find(st, name);
    if (!t) return st__format_error(st, "tensor '%s' not found", shown);
    int same = t->ndim == expect_ndim;
    for (int i = 0; same && i < expect_ndim; i++) same = t->shape[i] == expect[i];
    if (!same)
        return st__format_error(st, "tensor '%s' has shape %s, expected %s", shown,
                                st__format_shape(sa, sizeof sa, t->shape, t->ndim),
                                st__format_shape(sb, sizeof sb, expect, expect_ndim));
    if (t->dtype != PRL_DTYPE_F32 && t->dtype != PRL_DTYPE_F64 && t->dtype != PRL_DTYPE_F16 &&
        t->dtype != PRL_DTYPE_BF16 && t->dtype != PRL_DTYPE_F8_E4M3)
        return prl_error_set(PRL_ERR_UNSUPPORTED,
                             "safetensors %s: tensor '%s' has dtype %s; "
                             "only F32, F64, F16, BF16 and F8_E4M3 convert to %s",
                             st->label, shown, prl_dtype_name(t->dtype), to);
    if (!out && t->numel)
        return prl_error_set(PRL_ERR_ARG, "safetensors %s: read_%s '%s': NULL output", st->label,
                             to, shown);
    *tp = t;
    return PRL_OK;
}

/* Element i of a float tensor as a double: exact for F32, F16, BF16 and F8_E4M3 (each widens without
** rounding), so a reader of either width rounds at most once, on its own store. */
static double element(const prl_safetensors_tensor *t, size_t i)
{
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case PRL_DTYPE_F32: return f32_from_bits(load_u32le(p + 4 * i));
    case PRL_DTYPE_F64: return f64_load(p + 8 * i);
    case PRL_DTYPE_F16: return f16_to_f32(load_u16le(p + 2 * i));
    case PRL_DTYPE_BF16: return bf16_to_f32(load_u16le(p + 2 * i));
    case PRL_DTYPE_F8_E4M3: return f8e4m3_to_f32(p[i]);
    default: PRL_ASSERT(!"dtype checked by read_prepare");
    }
    return 0;
}

prl_status prl_safetensors_read_f32(const prl_safetensors *st, const char *name,
                                    const int64_t *expect_shape, int expect_ndim, float *out)
{
    const prl_safetensors_tensor *t;
    prl_status rc = read_prepare(st, name, expect_shape, expect_ndim, out, "f32", &t);
    if (rc != PRL_OK) return rc;
    const uint8_t *p = t->data;
    /* one loop per dtype: a checkpoint load converts a billion elements here */
    switch (t->dtype) {
    case PRL_DTYPE_BF16:
        for (size_t i = 0; i < t->numel; i++) out[i] = bf16_to_f32(load_u16le(p + 2 * i));
        break;
    case PRL_DTYPE_F32: /* little-endian host; an empty tensor may come with no buffer */
        if (t->nbytes) memcpy(out, p, t->nbytes);
        break;
    default: /* F64 rounds to nearest; out-of-range values become ±inf (IEEE) */
        for (size_t i = 0; i < t->numel; i++) out[i] = (float)element(t, i);
    }
    return PRL_OK;
}

prl_status prl_safetensors_read_f64(const prl_safetensors *st, const char *name,
                                    const int64_t *expect_shape, int expect_ndim, double *out)
{
    const prl_safetensors_tensor *t;
    prl_status rc = read_prepare(st, name, expect_shape, expect_ndim, out, "f64", &t);
    if (rc != PRL_OK) return rc;
    for (size_t i = 0; i < t->numel; i++) out[i] = element(t, i);
    return PRL_OK;
}

void prl_safetensors_release(const prl_safetensors *st, const prl_safetensors_tensor *t)
{
    if (!st || !st->map) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = t ? (uintptr_t)t->data : (uintptr_t)st->map;
    uintptr_t lo = (begin + page - 1) / page * page;
    uintptr_t hi = (begin + (t ? t->nbytes : st->map_len)) / page * page;
    /* whole pages inside the tensor only: a neighbour may still be read from a shared page */
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
