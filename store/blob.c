/*
** blob.c — the BLOB formats of samples: int32 and float32 arrays, little-endian, 4 bytes per
** element, no header (the element counts live in the row's shape columns). Decoding checks
** the byte length against the expected count before reading anything.
*/
#include "store/store_int.h"

#include <string.h>

static void u32_put(uint8_t *p, uint32_t x)
{
    p[0] = (uint8_t)x, p[1] = (uint8_t)(x >> 8), p[2] = (uint8_t)(x >> 16);
    p[3] = (uint8_t)(x >> 24);
}

static uint32_t u32_get(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void prl_store_i32_encode(uint8_t *out, const int32_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) u32_put(out + 4 * i, (uint32_t)v[i]);
}

void prl_store_f32_encode(uint8_t *out, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, &v[i], 4);
        u32_put(out + 4 * i, x);
    }
}

static prl_status length_check(size_t n, size_t bytes, const char *what)
{
    if (bytes % 4 != 0)
        return prl_error_set(PRL_ERR_FORMAT, "%s: %zu bytes is not a multiple of 4", what, bytes);
    if (bytes / 4 != n)
        return prl_error_set(PRL_ERR_FORMAT, "%s: %zu bytes hold %zu values, expected %zu", what,
                             bytes, bytes / 4, n);
    return PRL_OK;
}

prl_status prl_store_i32_decode(int32_t *v, size_t n, const uint8_t *in, size_t bytes,
                                const char *what)
{
    prl_status rc = length_check(n, bytes, what);
    if (rc != PRL_OK) return rc;
    for (size_t i = 0; i < n; i++) v[i] = (int32_t)u32_get(in + 4 * i);
    return PRL_OK;
}

prl_status prl_store_f32_decode(float *v, size_t n, const uint8_t *in, size_t bytes,
                                const char *what)
{
    prl_status rc = length_check(n, bytes, what);
    if (rc != PRL_OK) return rc;
    for (size_t i = 0; i < n; i++) {
        uint32_t x = u32_get(in + 4 * i);
        memcpy(&v[i], &x, 4);
    }
    return PRL_OK;
}
