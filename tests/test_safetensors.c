/*
** test_safetensors.c — Check tests for engine/safetensors*.c.
**
** Covers: the six byte-exact examples of engine-style.md §3.4 (writer output and reader
** parse), round trips over every dtype with scalars, empty tensors and escaped metadata,
** every reader rejection rule on crafted buffers (status code AND message contents),
** truncation at every cut point, a deterministic header fuzz loop with consistency checks,
** the float/double conversion helpers, writer argument checks, and the atomic file write
** (no temp file left, no final file created on failure, old file kept on failure; fsync
** failures are injected through a test-only fsync() that overrides libc's), and the line
** appender of metrics files (torn tails cut).
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "engine/engine.h"
#include "tests/check_util.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers ---------- */

/* A file: 8-byte N = json_len, the header bytes, then data_len zero bytes (or `data`). */
static uint8_t *make_file(const char *json, size_t json_len, const void *data, size_t data_len,
                          size_t *len)
{
    *len = 8 + json_len + data_len;
    uint8_t *b = calloc(*len ? *len : 1, 1);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)json_len >> (8 * i));
    memcpy(b + 8, json, json_len);
    if (data) memcpy(b + 8 + json_len, data, data_len);
    return b;
}

static int is_zeroed(const prl_safetensors *st)
{
    static const prl_safetensors zero;
    return memcmp(st, &zero, sizeof zero) == 0;
}

/* Parse must fail with `status` and a message naming the label and both needles. */
static void expect_reject(const uint8_t *buf, size_t len, prl_status status, const char *needle1,
                          const char *needle2)
{
    prl_safetensors st;
    prl_status rc = prl_safetensors_parse(&st, buf, len, "case.safetensors");
    ck_assert_msg(rc == status, "expected %s, got %s (%s)", prl_status_name(status),
                  prl_status_name(rc), prl_error_message());
    ck_assert(is_zeroed(&st));
    assert_msg_has("safetensors case.safetensors: ");
    if (needle1) assert_msg_has(needle1);
    if (needle2) assert_msg_has(needle2);
    prl_safetensors_free(&st); /* no-op on a failed parse, must not crash */
}

static void expect_reject_json(const char *json, size_t json_len, size_t data_len,
                               const char *needle1, const char *needle2)
{
    size_t len;
    uint8_t *b = make_file(json, json_len, NULL, data_len, &len);
    expect_reject(b, len, PRL_ERR_FORMAT, needle1, needle2);
    free(b);
}

static prl_safetensors parse_ok(const uint8_t *buf, size_t len)
{
    prl_safetensors st;
    prl_status rc = prl_safetensors_parse(&st, buf, len, "ok.safetensors");
    ck_assert_msg(rc == PRL_OK, "parse failed: %s", prl_error_message());
    return st;
}

static void parse_ok_json(const char *json, size_t json_len, size_t data_len)
{
    size_t len;
    uint8_t *b = make_file(json, json_len, NULL, data_len, &len);
    prl_safetensors st = parse_ok(b, len);
    prl_safetensors_free(&st);
    free(b);
}

static uint8_t *write_mem(const prl_safetensors_writer *w, size_t *len)
{
    uint8_t *out = NULL;
    prl_status rc = prl_safetensors_writer_to_memory(w, &out, len);
    ck_assert_msg(rc == PRL_OK, "to_memory failed: %s", prl_error_message());
    ck_assert_ptr_nonnull(out);
    return out;
}

static void assert_bytes(const uint8_t *got, size_t got_len, const void *want, size_t want_len)
{
    ck_assert_uint_eq(got_len, want_len);
    for (size_t i = 0; i < want_len; i++)
        ck_assert_msg(got[i] == ((const uint8_t *)want)[i], "byte %zu: got 0x%02x want 0x%02x", i,
                      got[i], ((const uint8_t *)want)[i]);
}

/* The writer's output is exactly want_len bytes of `want`; the writer is freed. */
static void assert_writes(prl_safetensors_writer *w, const void *want, size_t want_len)
{
    size_t len;
    uint8_t *out = write_mem(w, &len);
    assert_bytes(out, len, want, want_len);
    free(out);
    prl_safetensors_writer_free(w);
}

#define S(lit) lit, (sizeof(lit) - 1) /* a string literal and its length (NULs included) */
#define F32A "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"

/* ---------------------------------------------------------------- dtypes ----------- */

START_TEST(test_dtype_table)
{
    static const char *names[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                                  "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64"};
    static const size_t sizes[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
    ck_assert_int_eq(PRL_DTYPE_COUNT, 15);
    for (int d = 0; d < PRL_DTYPE_COUNT; d++) {
        ck_assert_str_eq(prl_dtype_name((prl_dtype)d), names[d]);
        ck_assert_uint_eq(prl_dtype_size((prl_dtype)d), sizes[d]);
        ck_assert_int_eq(prl_dtype_from_name(names[d]), d);
    }
    ck_assert_ptr_null(prl_dtype_name(PRL_DTYPE_COUNT));
    ck_assert_ptr_null(prl_dtype_name((prl_dtype)-1));
    ck_assert_uint_eq(prl_dtype_size(PRL_DTYPE_COUNT), 0);
    ck_assert_int_eq(prl_dtype_from_name("f32"), PRL_DTYPE_COUNT);
    ck_assert_int_eq(prl_dtype_from_name("F32 "), PRL_DTYPE_COUNT);
    ck_assert_int_eq(prl_dtype_from_name(""), PRL_DTYPE_COUNT);
    ck_assert_int_eq(prl_dtype_from_name(NULL), PRL_DTYPE_COUNT);
}
END_TEST

/* ---------------------------------------------------------------- examples --------- */

static const uint8_t ex_data_0_to_5[24] = {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3f,
                                           0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x40, 0x40,
                                           0x00, 0x00, 0x80, 0x40, 0x00, 0x00, 0xa0, 0x40};
static const float ex_values_0_to_5[6] = {0, 1, 2, 3, 4, 5};

/* Example 1: one F32 tensor attn.0 [1,2,3] -> 96 bytes, no padding. */
START_TEST(test_example1)
{
    static const char want[] =
        "\x40\0\0\0\0\0\0\0"
        "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
    uint8_t full[96];
    ck_assert_uint_eq(sizeof want - 1, 72);
    memcpy(full, want, 72);
    memcpy(full + 72, ex_data_0_to_5, 24);

    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    const int64_t shape[] = {1, 2, 3};
    ck_assert_int_eq(
        prl_safetensors_writer_add(&w, "attn.0", PRL_DTYPE_F32, shape, 3, ex_values_0_to_5),
        PRL_OK);
    assert_writes(&w, full, sizeof full);

    prl_safetensors st = parse_ok(full, sizeof full);
    ck_assert_uint_eq(st.header_len, 64);
    ck_assert_uint_eq(st.n_tensors, 1);
    ck_assert_uint_eq(st.n_metadata, 0);
    const prl_safetensors_tensor *t = prl_safetensors_find(&st, "attn.0");
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->name, "attn.0");
    ck_assert_int_eq(t->dtype, PRL_DTYPE_F32);
    ck_assert_int_eq(t->ndim, 3);
    ck_assert_int_eq(t->shape[0], 1);
    ck_assert_int_eq(t->shape[1], 2);
    ck_assert_int_eq(t->shape[2], 3);
    ck_assert_uint_eq(t->numel, 6);
    ck_assert_uint_eq(t->nbytes, 24);
    ck_assert_uint_eq(t->begin, 0);
    ck_assert_uint_eq(t->end, 24);
    ck_assert_ptr_eq(t->data, full + 72);
    float v[6];
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "attn.0", shape, 3, v), PRL_OK);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(v[i], (float)i);
    prl_safetensors_free(&st);
}
END_TEST

/* Example 2: attn0 [1,1,2,3] -> JSON of 65 bytes + 7 spaces, N = 72, 104 bytes. */
START_TEST(test_example2)
{
    static const char want[] =
        "\x48\0\0\0\0\0\0\0"
        "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ";
    uint8_t full[104];
    ck_assert_uint_eq(sizeof want - 1, 80);
    memcpy(full, want, 80);
    memcpy(full + 80, ex_data_0_to_5, 24);

    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    const int64_t shape[] = {1, 1, 2, 3};
    ck_assert_int_eq(
        prl_safetensors_writer_add(&w, "attn0", PRL_DTYPE_F32, shape, 4, ex_values_0_to_5), PRL_OK);
    assert_writes(&w, full, sizeof full);

    prl_safetensors st = parse_ok(full, sizeof full);
    ck_assert_uint_eq(st.header_len, 72);
    ck_assert_uint_eq(st.n_tensors, 1);
    ck_assert_int_eq(st.tensors[0].ndim, 4);
    double v[6];
    ck_assert_int_eq(prl_safetensors_read_f64(&st, "attn0", shape, 4, v), PRL_OK);
    for (int i = 0; i < 6; i++) ck_assert_double_eq(v[i], (double)i);
    prl_safetensors_free(&st);
}
END_TEST

/* Example 3: nothing -> "{}" + 6 spaces, 16 bytes. */
START_TEST(test_example3)
{
    static const char want[] = "\x08\0\0\0\0\0\0\0{}      ";
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    assert_writes(&w, want, 16);

    prl_safetensors st = parse_ok((const uint8_t *)want, 16);
    ck_assert_uint_eq(st.n_tensors, 0);
    ck_assert_uint_eq(st.n_metadata, 0);
    ck_assert_ptr_null(prl_safetensors_find(&st, "x"));
    ck_assert_ptr_null(prl_safetensors_metadata(&st, "framework"));
    prl_safetensors_free(&st);
}
END_TEST

/* Example 4: metadata {"framework":"pt"} only -> 35 bytes + 5 spaces, 48 bytes. */
START_TEST(test_example4)
{
    static const char want[] = "\x28\0\0\0\0\0\0\0{\"__metadata__\":{\"framework\":\"pt\"}}     ";
    ck_assert_uint_eq(sizeof want - 1, 48);
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "framework", "pt"), PRL_OK);
    assert_writes(&w, want, 48);

    prl_safetensors st = parse_ok((const uint8_t *)want, 48);
    ck_assert_uint_eq(st.n_tensors, 0);
    ck_assert_uint_eq(st.n_metadata, 1);
    ck_assert_str_eq(st.metadata_keys[0], "framework");
    ck_assert_str_eq(prl_safetensors_metadata(&st, "framework"), "pt");
    ck_assert_ptr_null(prl_safetensors_metadata(&st, "pt"));
    prl_safetensors_free(&st);
}
END_TEST

/* Example 5: b F32 [2], a F16 [3], c F64 [1] -> order c, b, a; 163 + 5 spaces; 198 bytes. */
START_TEST(test_example5)
{
    static const char head[] =
        "\xa8\0\0\0\0\0\0\0"
        "{\"c\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
        "\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[16,22]}}     ";
    static const uint8_t data[22] = {
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, /* c = 1.5 */
        0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x80, 0xbf, /* b = 2, -1 */
        0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00,             /* a = 1, -2, 2^-24 (f16) */
    };
    uint8_t full[198];
    ck_assert_uint_eq(sizeof head - 1, 176);
    memcpy(full, head, 176);
    memcpy(full + 176, data, 22);

    const double c[1] = {1.5};
    const float b[2] = {2.0f, -1.0f};
    const uint16_t a[3] = {0x3c00, 0xc000, 0x0001};
    const int64_t s1[] = {1}, s2[] = {2}, s3[] = {3};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "b", PRL_DTYPE_F32, s2, 1, b), PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "a", PRL_DTYPE_F16, s3, 1, a), PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "c", PRL_DTYPE_F64, s1, 1, c), PRL_OK);
    assert_writes(&w, full, sizeof full);

    prl_safetensors st = parse_ok(full, sizeof full);
    ck_assert_uint_eq(st.header_len, 168);
    ck_assert_uint_eq(st.n_tensors, 3);
    ck_assert_str_eq(st.tensors[0].name, "c"); /* file order */
    ck_assert_str_eq(st.tensors[1].name, "b");
    ck_assert_str_eq(st.tensors[2].name, "a");
    float fa[3], fb[2], fc[1];
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "a", s3, 1, fa), PRL_OK);
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "b", s2, 1, fb), PRL_OK);
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "c", s1, 1, fc), PRL_OK);
    ck_assert_float_eq(fa[0], 1.0f);
    ck_assert_float_eq(fa[1], -2.0f);
    ck_assert_float_eq(fa[2], 0x1p-24f);
    ck_assert_float_eq(fb[0], 2.0f);
    ck_assert_float_eq(fb[1], -1.0f);
    ck_assert_float_eq(fc[0], 1.5f);
    prl_safetensors_free(&st);
}
END_TEST

/* Example 6: metadata {"step":"7"} + F32 x = [0, 1] -> 82 + 6 spaces; 104 bytes. */
START_TEST(test_example6)
{
    static const char want[] =
        "\x58\0\0\0\0\0\0\0"
        "{\"__metadata__\":{\"step\":\"7\"},\"x\":{\"dtype\":\"F32\",\"shape\":[2],"
        "\"data_offsets\":[0,8]}}      "
        "\0\0\0\0\0\0\x80\x3f";
    ck_assert_uint_eq(sizeof want - 1, 104);
    const float x[2] = {0, 1};
    const int64_t s[] = {2};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "x", PRL_DTYPE_F32, s, 1, x), PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "step", "7"), PRL_OK);
    assert_writes(&w, want, 104);

    prl_safetensors st = parse_ok((const uint8_t *)want, 104);
    ck_assert_str_eq(prl_safetensors_metadata(&st, "step"), "7");
    float v[2];
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "x", s, 1, v), PRL_OK);
    ck_assert_float_eq(v[0], 0.0f);
    ck_assert_float_eq(v[1], 1.0f);
    prl_safetensors_free(&st);
}
END_TEST

/* ---------------------------------------------------------------- round trips ------ */

/* The expected write order of one tensor per dtype: dtype descending. */
START_TEST(test_roundtrip_all_dtypes)
{
    uint8_t data[PRL_DTYPE_COUNT][3 * 2 * 8];
    char names[PRL_DTYPE_COUNT][16];
    const int64_t shape[] = {3, 2};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    for (int d = 0; d < PRL_DTYPE_COUNT; d++) {
        for (size_t i = 0; i < sizeof data[d]; i++) data[d][i] = (uint8_t)(i * 7 + d);
        /* names in reverse dtype order so that name order cannot explain the result */
        snprintf(names[d], sizeof names[d], "t%02d", PRL_DTYPE_COUNT - d);
        ck_assert_int_eq(prl_safetensors_writer_add(&w, names[d], (prl_dtype)d, shape, 2, data[d]),
                         PRL_OK);
    }
    size_t len;
    uint8_t *out = write_mem(&w, &len);
    size_t n = (size_t)out[0] | ((size_t)out[1] << 8);
    ck_assert_uint_eq(len - 8 - n, 6 * (5 * 1 + 4 * 2 + 3 * 4 + 3 * 8)); /* 294 data bytes */
    ck_assert_uint_eq(n % 8, 0);
    prl_safetensors st = parse_ok(out, len);
    ck_assert_uint_eq(st.n_tensors, PRL_DTYPE_COUNT);
    uint64_t pos = 0;
    for (size_t i = 0; i < st.n_tensors; i++) {
        const prl_safetensors_tensor *t = &st.tensors[i];
        int d = PRL_DTYPE_COUNT - 1 - (int)i; /* U64 first ... BOOL last */
        ck_assert_int_eq(t->dtype, d);
        ck_assert_str_eq(t->name, names[d]);
        ck_assert_int_eq(t->ndim, 2);
        ck_assert_int_eq(t->shape[0], 3);
        ck_assert_int_eq(t->shape[1], 2);
        ck_assert_uint_eq(t->numel, 6);
        ck_assert_uint_eq(t->nbytes, 6 * prl_dtype_size((prl_dtype)d));
        ck_assert_uint_eq(t->begin, pos);
        pos = t->end;
        ck_assert_int_eq(memcmp(t->data, data[d], t->nbytes), 0);
        ck_assert_ptr_eq(prl_safetensors_find(&st, names[d]), t);
    }
    ck_assert_uint_eq(pos, len - 8 - st.header_len);
    prl_safetensors_free(&st);
    prl_safetensors_free(&st); /* idempotent */
    free(out);
    prl_safetensors_writer_free(&w);
    prl_safetensors_writer_free(&w);
    prl_safetensors_writer_free(NULL);
    prl_safetensors_free(NULL);
}
END_TEST

START_TEST(test_roundtrip_scalar_empty_metadata)
{
    const double pi = 3.141592653589793;
    const int64_t s_empty1[] = {0}, s_empty2[] = {3, 0, 2}, s_vec[] = {4};
    const int32_t ints[4] = {1, -2, 3, -4};
    const uint8_t flag = 1;
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "pi", PRL_DTYPE_F64, NULL, 0, &pi), PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "none", PRL_DTYPE_F32, s_empty1, 1, NULL),
                     PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "none2", PRL_DTYPE_F32, s_empty2, 3, NULL),
                     PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "ints", PRL_DTYPE_I32, s_vec, 1, ints), PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "flag", PRL_DTYPE_BOOL, NULL, 0, &flag),
                     PRL_OK);
    /* metadata: keys sorted on output; escapes as serde_json writes them */
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "zeta", "old"), PRL_OK);
    ck_assert_int_eq(
        prl_safetensors_writer_set_metadata(&w, "alpha", "a\"b\\c\nd\x01\t\x7f\xc3\xa9/\b\f\r\x1f"),
        PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "zeta", "new"), PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "", "empty key"), PRL_OK);
    size_t len;
    uint8_t *out = write_mem(&w, &len);
    static const char want_json[] =
        "{\"__metadata__\":{\"\":\"empty "
        "key\",\"alpha\":\"a\\\"b\\\\c\\nd\\u0001\\t\x7f\xc3\xa9/\\b\\f\\r\\u001f\","
        "\"zeta\":\"new\"},"
        "\"pi\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
        "\"none\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
        "\"none2\":{\"dtype\":\"F32\",\"shape\":[3,0,2],\"data_offsets\":[8,8]},"
        "\"ints\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[8,24]},"
        "\"flag\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[24,25]}}";
    size_t jl = sizeof want_json - 1, n = (jl + 7) / 8 * 8;
    ck_assert_uint_eq(len, 8 + n + 25);
    ck_assert_uint_eq(out[0] | (out[1] << 8), n);
    ck_assert_int_eq(memcmp(out + 8, want_json, jl), 0);
    for (size_t i = jl; i < n; i++) ck_assert_int_eq(out[8 + i], ' ');

    prl_safetensors st = parse_ok(out, len);
    ck_assert_uint_eq(st.n_tensors, 5);
    ck_assert_uint_eq(st.n_metadata, 3);
    ck_assert_str_eq(prl_safetensors_metadata(&st, "alpha"),
                     "a\"b\\c\nd\x01\t\x7f\xc3\xa9/\b\f\r\x1f");
    ck_assert_str_eq(prl_safetensors_metadata(&st, "zeta"), "new");
    ck_assert_str_eq(prl_safetensors_metadata(&st, ""), "empty key");
    const prl_safetensors_tensor *t = prl_safetensors_find(&st, "pi");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->ndim, 0);
    ck_assert_uint_eq(t->numel, 1);
    double d;
    ck_assert_int_eq(prl_safetensors_read_f64(&st, "pi", NULL, 0, &d), PRL_OK);
    ck_assert_double_eq(d, pi);
    t = prl_safetensors_find(&st, "none2");
    ck_assert_uint_eq(t->numel, 0);
    ck_assert_uint_eq(t->nbytes, 0);
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "none2", s_empty2, 3, NULL), PRL_OK);
    t = prl_safetensors_find(&st, "ints");
    ck_assert_int_eq(memcmp(t->data, ints, sizeof ints), 0);
    t = prl_safetensors_find(&st, "flag");
    ck_assert_int_eq(*(const uint8_t *)t->data, 1);
    /* file order: by offset (F64, F32, I32, BOOL: dtype descending), the two empty
    ** tensors at offset 8 in header order */
    ck_assert_str_eq(st.tensors[0].name, "pi");
    ck_assert_str_eq(st.tensors[1].name, "none");
    ck_assert_str_eq(st.tensors[2].name, "none2");
    ck_assert_str_eq(st.tensors[3].name, "ints");
    ck_assert_str_eq(st.tensors[4].name, "flag");
    prl_safetensors_free(&st);
    free(out);
    prl_safetensors_writer_free(&w);
}
END_TEST

/* Within one dtype, names sort byte-wise: '-' < '.' < digits < upper < '_' < lower. */
START_TEST(test_writer_name_order)
{
    static const char *in[] = {"b", "a_1", "a1", "a.1", "a-1", "B", "a", "Z9"};
    static const char *want[] = {"B", "Z9", "a", "a-1", "a.1", "a1", "a_1", "b"};
    const float v = 0;
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    for (size_t i = 0; i < 8; i++)
        ck_assert_int_eq(prl_safetensors_writer_add(&w, in[i], PRL_DTYPE_F32, NULL, 0, &v), PRL_OK);
    size_t len;
    uint8_t *out = write_mem(&w, &len);
    prl_safetensors st = parse_ok(out, len);
    for (size_t i = 0; i < 8; i++) {
        ck_assert_str_eq(st.tensors[i].name, want[i]);
        ck_assert_uint_eq(st.tensors[i].begin, 4 * i);
    }
    prl_safetensors_free(&st);
    free(out);
    prl_safetensors_writer_free(&w);
}
END_TEST

/* Files the reader must accept although our writer would not produce them. */
START_TEST(test_reader_accepts_variants)
{
    /* header order differs from data order; iteration is by offset */
    {
        size_t len;
        uint8_t *b = make_file(S("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}"),
                               NULL, 8, &len);
        prl_safetensors st = parse_ok(b, len);
        ck_assert_str_eq(st.tensors[0].name, "a");
        ck_assert_str_eq(st.tensors[1].name, "b");
        ck_assert_ptr_eq(st.tensors[1].data, b + len - 4);
        prl_safetensors_free(&st);
        free(b);
    }
    /* equal begins sort by end (like the reference): the empty tensor listed last in the
    ** header comes first in the file, else the offsets would not look contiguous */
    {
        size_t len;
        uint8_t *b = make_file(S("{" F32A ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],"
                                 "\"data_offsets\":[4,8]},\"e\":{\"dtype\":\"F32\","
                                 "\"shape\":[0],\"data_offsets\":[4,4]}}"),
                               NULL, 8, &len);
        prl_safetensors st = parse_ok(b, len);
        ck_assert_str_eq(st.tensors[0].name, "a");
        ck_assert_str_eq(st.tensors[1].name, "e");
        ck_assert_str_eq(st.tensors[2].name, "b");
        prl_safetensors_free(&st);
        free(b);
    }
    /* spaces around the object, whitespace inside, N not a multiple of 8, metadata last,
    ** field order changed, metadata keys unsorted */
    parse_ok_json(S("  { \"a\" :\n{\"shape\":[ 2 ],\t\"data_offsets\":[0,2],\"dtype\":\"U8\"},"
                    "\"__metadata__\":{\"z\":\"1\",\"a\":\"\\u00e9\"}}   "),
                  2);
    /* an empty object after spaces */
    parse_ok_json(S(" {}"), 0);
    /* empty tensors with equal offsets at the end of the data */
    parse_ok_json(S("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"y\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]}}"),
                  4);
    /* 8 dimensions is the limit */
    parse_ok_json(
        S("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}"), 8);
    /* the reference order of multiplication: 0 first means no overflow */
    parse_ok_json(S("{\"x\":{\"dtype\":\"U8\",\"shape\":[0,4611686018427387904,4],"
                    "\"data_offsets\":[0,0]}}"),
                  0);
    /* a NULL buffer of length 0 is an (invalid) empty file, not a crash */
    prl_safetensors st;
    ck_assert_int_eq(prl_safetensors_parse(&st, NULL, 0, NULL), PRL_ERR_FORMAT);
    assert_msg_has("<memory>");
    assert_msg_has("too small");
    ck_assert_int_eq(prl_safetensors_parse(&st, NULL, 5, NULL), PRL_ERR_ARG);
}
END_TEST

/* ---------------------------------------------------------------- reader rules ----- */

/* Rule 1: fewer than 8 bytes. */
START_TEST(test_reject_too_small)
{
    uint8_t b[8] = {0};
    for (size_t n = 0; n < 8; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, b, n);
        expect_reject(copy, n, PRL_ERR_FORMAT, "too small", NULL);
        free(copy);
    }
}
END_TEST

/* Rules 2 and 3: header length limits and bounds. */
START_TEST(test_reject_header_length)
{
    uint8_t b[24] = {0};
    /* N = 100,000,001 > limit, with a file far shorter: rule 2 is reported, not rule 3 */
    uint64_t n = 100000001;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n >> (8 * i));
    expect_reject(b, 8, PRL_ERR_FORMAT, "100000001", "exceeds the maximum");
    memset(b, 0xff, 8); /* N = 2^64 - 1: must not wrap 8 + N */
    expect_reject(b, 24, PRL_ERR_FORMAT, "18446744073709551615", "exceeds the maximum");
    n = 100000000; /* at the limit: passes rule 2, fails rule 3 */
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n >> (8 * i));
    expect_reject(b, 24, PRL_ERR_FORMAT, "100000000", "runs past the end");
    n = 17; /* one byte more than the file has */
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n >> (8 * i));
    expect_reject(b, 24, PRL_ERR_FORMAT, "header length 17", "24-byte file");
    /* N = 0: rule 3 holds, the (empty) header is not JSON */
    memset(b, 0, 8);
    expect_reject(b, 8, PRL_ERR_FORMAT, "header is empty", NULL);
}
END_TEST

typedef struct {
    const char *json;
    size_t json_len;
    size_t data_len;
    const char *needle1, *needle2;
} reject_case;

#define ENTRY(name, body) "{\"" name "\":{" body "}}"

/* Every structural rejection: header text, data length, what the message must say. */
static const reject_case reject_cases[] = {
    /* rule 4 and the space rule */
    {S("        "), 0, "header is empty", NULL},
    {S("\t{}"), 0, "0x09", "instead of '{'"},
    {S("\n{}"), 0, "0x0a", "instead of '{'"},
    {S("{}\n"), 0, "0x0a", "instead of '}'"},
    {S("{}\r "), 0, "0x0d", "instead of '}'"},
    {S("{}\0"), 0, "0x00", "instead of '}'"},
    {S("[]"), 0, "0x5b", "instead of '{'"},
    {S("\"{}\""), 0, "instead of '{'", NULL},
    {S("{} {}"), 0, "not valid JSON", NULL},
    {S("{\"a\":}"), 0, "not valid JSON", NULL},
    {S("{'a':1}"), 0, "not valid JSON", NULL},
    {S("{" F32A ",}"), 4, "not valid JSON", NULL},
    {S("{" F32A), 4, "not valid JSON", "'}' expected"},
    {S("{\"a\\u0000\":{}}"), 0, "not valid JSON", NULL},
    {S("{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,0]}}"), 0,
     "not valid JSON", NULL},
    {S("{\"a\xff\":{}}"), 0, "not valid UTF-8", "0xff"},
    {S("{\"__metadata__\":{\"k\":\"\xc0\x80\"}}"), 0, "UTF-8", "0xc0"},         /* overlong */
    {S("{\"__metadata__\":{\"k\":\"\xe0\x80\x80\"}}"), 0, "UTF-8", "0xe0"},     /* overlong */
    {S("{\"__metadata__\":{\"k\":\"\xed\xa0\x80\"}}"), 0, "UTF-8", "0xed"},     /* surrogate */
    {S("{\"__metadata__\":{\"k\":\"\xf4\x90\x80\x80\"}}"), 0, "UTF-8", "0xf4"}, /* >10FFFF */
    {S("{\"__metadata__\":{\"k\":\"\x80\"}}"), 0, "UTF-8", "0x80"},
    {S("{\"__metadata__\":{\"k\":\"\xf8\x88\x80\x80\x80\"}}"), 0, "UTF-8", "0xf8"},
    {S("{}\xe2\x82"), 0, "UTF-8", "offset 2"},
    /* rule 8: duplicate keys, at every level and through escapes */
    {S("{" F32A "," F32A "}"), 4, "duplicate", NULL},
    {S("{" F32A ",\"\\u0061\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}"), 8,
     "duplicate", NULL},
    {S("{\"__metadata__\":{},\"__metadata__\":{}}"), 0, "duplicate", NULL},
    {S("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}"), 0, "duplicate", NULL},
    {S(ENTRY("a", "\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]")), 4,
     "duplicate", NULL},
    /* entry structure */
    {S("{\"wq\":1}"), 0, "tensor 'wq'", "not an object"},
    {S("{\"wq\":[]}"), 0, "tensor 'wq'", "not an object"},
    {S(ENTRY("wq", "\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "unknown dtype \"F128\""},
    {S(ENTRY("wq", "\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "unknown dtype \"f32\""},
    {S(ENTRY("wq", "\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "dtype is not a string"},
    {S(ENTRY("wq", "\"shape\":[1],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "missing field \"dtype\""},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "missing field \"shape\""},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1]")), 4, "tensor 'wq'",
     "missing field \"data_offsets\""},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1],\"offsets\":[0,4]")), 4, "tensor 'wq'",
     "unknown field \"offsets\""},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"name\":\"x\"")), 4,
     "tensor 'wq'", "unknown field \"name\""},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "shape is not an array"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":null,\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "shape is not an array"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "shape[0] is not a non-negative integer"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1,1.0],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "shape[1] is not a non-negative integer"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "shape[0]"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]")), 4,
     "tensor 'wq'", "9 dimensions"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]")), 4, "tensor 'wq'",
     "data_offsets is not an array [begin, end]"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]")), 4, "tensor 'wq'",
     "data_offsets is not an array"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0,4\"")), 4, "tensor 'wq'",
     "data_offsets is not an array"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-1,4]")), 4, "tensor 'wq'",
     "not non-negative integers"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]")), 4, "tensor 'wq'",
     "not non-negative integers"},
    /* project rule: tensor names */
    {S(ENTRY("", "\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]")), 1,
     "invalid tensor name ''", "[A-Za-z0-9._-]"},
    {S(ENTRY("a b", "\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]")), 1,
     "invalid tensor name 'a b'", NULL},
    {S(ENTRY("a/b", "\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]")), 1,
     "invalid tensor name 'a/b'", NULL},
    {S(ENTRY("\xc3\xa9", "\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]")), 1,
     "invalid tensor name '\\xc3\\xa9'", NULL},
    {S(ENTRY("a\\nb", "\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]")), 1,
     "invalid tensor name 'a\\x0ab'", NULL},
    /* __metadata__ */
    {S("{\"__metadata__\":\"x\"}"), 0, "__metadata__ is not an object", NULL},
    {S("{\"__metadata__\":[]}"), 0, "__metadata__ is not an object", NULL},
    {S("{\"__metadata__\":null}"), 0, "__metadata__ is not an object", NULL},
    {S("{\"__metadata__\":{\"step\":7}}"), 0, "key \"step\"", "not a string"},
    {S("{\"__metadata__\":{\"step\":null}}"), 0, "key \"step\"", "not a string"},
    {S("{\"__metadata__\":{\"a\":\"1\",\"step\":{}}}"), 0, "key \"step\"", "not a string"},
    /* rule 5: offsets contiguous from 0 */
    {S("{" F32A ",\"bq\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}"), 12,
     "tensor 'bq'", "expected begin 4"},
    {S("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"bq\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}"),
     8, "tensor 'bq'", "expected begin 8"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]")), 8, "tensor 'wq'",
     "expected begin 0"},
    {S("{" F32A ",\"bq\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}"), 4,
     "tensor 'bq'", "[4,0]"},
    /* rule 6: sizes, with overflow checks */
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "needs 8"},
    {S(ENTRY("wq", "\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "dtype F16 shape [3] needs 6"},
    {S(ENTRY("wq", "\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "shape [] needs 8"},
    {S(ENTRY("wq", "\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]")), 4, "tensor 'wq'",
     "needs 0"},
    {S(ENTRY("wq", "\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]")), 0,
     "tensor 'wq'", "overflows"},
    {S(ENTRY("wq", "\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]")), 0,
     "tensor 'wq'", "overflows"},
    {S(ENTRY("wq", "\"dtype\":\"U8\",\"shape\":[4611686018427387904,4,0],\"data_offsets\":[0,0]")),
     0, "tensor 'wq'", "overflows"},
    {S(ENTRY("wq", "\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,9223372036854775807]")), 1,
     "tensor 'wq'", "needs 1"},
    /* rule 7: the data buffer is covered exactly */
    {S("{" F32A "}"), 5, "cover 4 data bytes", "holds 5"},
    {S("{" F32A "}"), 3, "cover 4 data bytes", "holds 3"},
    {S("{" F32A "x}"), 4, "not valid JSON", NULL},
    {S("{" F32A "}"), 0, "cover 4 data bytes", "holds 0"},
    {S("{}"), 1, "cover 0 data bytes", "holds 1"},
    {S("{\"__metadata__\":{}}"), 8, "cover 0 data bytes", "holds 8"},
};

#define N_REJECT_CASES ((int)(sizeof reject_cases / sizeof reject_cases[0]))

START_TEST(test_reject_case)
{
    const reject_case *c = &reject_cases[_i];
    expect_reject_json(c->json, c->json_len, c->data_len, c->needle1, c->needle2);
}
END_TEST

/* A hostile, very long name is cut in the message instead of swamping it. */
START_TEST(test_reject_long_name_message)
{
    size_t nl = 5000;
    char *json = malloc(nl + 100);
    memcpy(json, "{\"", 2);
    memset(json + 2, 'x', nl);
    int k = snprintf(json + 2 + nl, 100,
                     "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}");
    expect_reject_json(json, 2 + nl + (size_t)k, 4, "xxx...'", "needs 8");
    free(json);
}
END_TEST

/* ---------------------------------------------------------------- robustness ------- */

static uint8_t *rich_file(size_t *len)
{
    static const float w1[6] = {1, 2, 3, 4, 5, 6};
    static const double w2[2] = {-1.25, 1e300};
    static const uint16_t w3[3] = {0x3c00, 0x7c00, 0x8000};
    static const int64_t w4[1] = {-7};
    const int64_t s23[] = {2, 3}, s2[] = {2}, s3[] = {3}, s0[] = {0, 4};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "layers.0.attn.wq", PRL_DTYPE_F32, s23, 2, w1),
                     0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "layers.0.norm", PRL_DTYPE_F64, s2, 1, w2), 0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "emb-half", PRL_DTYPE_BF16, s3, 1, w3), 0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "step_count", PRL_DTYPE_I64, NULL, 0, w4), 0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "empty", PRL_DTYPE_F16, s0, 2, NULL), 0);
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "format", "pt"), 0);
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "step", "1234"), 0);
    uint8_t *out = write_mem(&w, len);
    prl_safetensors_writer_free(&w);
    return out;
}

/* Every proper prefix of a valid file is rejected, and never read out of bounds (each
** prefix lives in its own exact-size allocation for valgrind/ASan). */
START_TEST(test_truncated_files)
{
    size_t len;
    uint8_t *full = rich_file(&len);
    prl_safetensors ok = parse_ok(full, len);
    prl_safetensors_free(&ok);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *p = malloc(cut ? cut : 1);
        memcpy(p, full, cut);
        prl_safetensors st;
        prl_status rc = prl_safetensors_parse(&st, p, cut, "cut");
        ck_assert_msg(rc == PRL_ERR_FORMAT, "cut at %zu: %s", cut, prl_status_name(rc));
        ck_assert(is_zeroed(&st));
        ck_assert_msg(strncmp(prl_error_message(), "safetensors cut: ", 17) == 0, "%s",
                      prl_error_message());
        free(p);
    }
    /* one byte too many */
    uint8_t *p = malloc(len + 1);
    memcpy(p, full, len);
    p[len] = 0;
    expect_reject(p, len + 1, PRL_ERR_FORMAT, "holds", NULL);
    free(p);
    free(full);
}
END_TEST

static int name_ok(const char *s)
{
    if (!*s) return 0;
    for (; *s; s++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-", *s))
            return 0;
    return 1;
}

/* A file the reader accepted must be self-consistent, and writing it back with our writer
** and parsing again must give the same tensors. */
static void check_consistent(const prl_safetensors *st, const uint8_t *buf, size_t len)
{
    ck_assert_ptr_eq(st->bytes, buf);
    ck_assert_uint_eq(st->size, len);
    ck_assert(st->header_len <= len - 8);
    const uint8_t *data = buf + 8 + st->header_len;
    uint64_t pos = 0;
    for (size_t i = 0; i < st->n_tensors; i++) {
        const prl_safetensors_tensor *t = &st->tensors[i];
        ck_assert(name_ok(t->name));
        ck_assert(t->dtype >= 0 && t->dtype < PRL_DTYPE_COUNT);
        ck_assert(t->ndim >= 0 && t->ndim <= PRL_SAFETENSORS_MAX_DIMS);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        ck_assert_uint_eq(numel, t->numel);
        ck_assert_uint_eq(t->nbytes, t->numel * prl_dtype_size(t->dtype));
        ck_assert_uint_eq(t->begin, pos);
        ck_assert_uint_eq(t->end - t->begin, t->nbytes);
        ck_assert_ptr_eq(t->data, data + t->begin);
        pos = t->end;
        ck_assert_ptr_eq(prl_safetensors_find(st, t->name), t);
    }
    ck_assert_uint_eq(8 + st->header_len + pos, len);
    for (size_t i = 0; i < st->n_metadata; i++)
        ck_assert_str_eq(prl_safetensors_metadata(st, st->metadata_keys[i]),
                         st->metadata_values[i]);

    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    for (size_t i = 0; i < st->n_tensors; i++) {
        const prl_safetensors_tensor *t = &st->tensors[i];
        ck_assert_int_eq(
            prl_safetensors_writer_add(&w, t->name, t->dtype, t->shape, t->ndim, t->data), PRL_OK);
    }
    for (size_t i = 0; i < st->n_metadata; i++)
        ck_assert_int_eq(
            prl_safetensors_writer_set_metadata(&w, st->metadata_keys[i], st->metadata_values[i]),
            PRL_OK);
    size_t len2;
    uint8_t *again = write_mem(&w, &len2);
    prl_safetensors st2 = parse_ok(again, len2);
    ck_assert_uint_eq(st2.n_tensors, st->n_tensors);
    ck_assert_uint_eq(st2.n_metadata, st->n_metadata);
    for (size_t i = 0; i < st->n_tensors; i++) {
        const prl_safetensors_tensor *a = &st->tensors[i];
        const prl_safetensors_tensor *b = prl_safetensors_find(&st2, a->name);
        ck_assert_ptr_nonnull(b);
        ck_assert_int_eq(a->dtype, b->dtype);
        ck_assert_int_eq(a->ndim, b->ndim);
        ck_assert_int_eq(memcmp(a->shape, b->shape, sizeof a->shape), 0);
        ck_assert_int_eq(memcmp(a->data, b->data, a->nbytes), 0);
    }
    for (size_t i = 0; i < st->n_metadata; i++)
        ck_assert_str_eq(prl_safetensors_metadata(&st2, st->metadata_keys[i]),
                         st->metadata_values[i]);
    prl_safetensors_free(&st2);
    free(again);
    prl_safetensors_writer_free(&w);
}

/* 2000 deterministic mutations of the length prefix and header (1-4 random byte changes,
** sometimes a printable byte so that some mutants stay valid JSON): each is rejected with
** FORMAT or parses into a self-consistent file. */
START_TEST(test_fuzz_header_flips)
{
    size_t len;
    uint8_t *full = rich_file(&len);
    size_t hdr_end = 8 + (size_t)(full[0] | (full[1] << 8) | (full[2] << 16));
    prl_rng r;
    prl_rng_init(&r, 20240601, 0, 0, 0, PRL_RNG_TEST);
    int accepted = 0, rejected = 0;
    uint8_t *p = malloc(len);
    for (int it = 0; it < 2000; it++) {
        memcpy(p, full, len);
        int flips = 1 + (int)(prl_rng_u64(&r) % 4);
        for (int f = 0; f < flips; f++) {
            size_t pos = (size_t)(prl_rng_u64(&r) % hdr_end);
            uint64_t kind = prl_rng_u64(&r) % 3;
            if (kind == 0) p[pos] ^= (uint8_t)(1u << (prl_rng_u64(&r) % 8)); /* bit flip */
            else if (kind == 1) p[pos] = (uint8_t)(prl_rng_u64(&r) % 256);   /* any byte */
            else p[pos] = (uint8_t)(0x20 + prl_rng_u64(&r) % 95);            /* printable */
        }
        prl_safetensors st;
        prl_status rc = prl_safetensors_parse(&st, p, len, "fuzz");
        if (rc == PRL_OK) {
            accepted++;
            check_consistent(&st, p, len);
            prl_safetensors_free(&st);
        } else {
            rejected++;
            ck_assert_msg(rc == PRL_ERR_FORMAT, "iteration %d: %s: %s", it, prl_status_name(rc),
                          prl_error_message());
            ck_assert(is_zeroed(&st));
            ck_assert(strncmp(prl_error_message(), "safetensors fuzz: ", 18) == 0);
        }
    }
    /* Deterministic stream: both outcomes must occur or the loop tests nothing. */
    ck_assert_int_gt(accepted, 10);
    ck_assert_int_gt(rejected, 1000);
    free(p);
    free(full);
}
END_TEST

/* ---------------------------------------------------------------- conversion ------- */

START_TEST(test_read_f32_conversions)
{
    const uint16_t h[8] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x8000};
    const uint16_t hn[1] = {0x7e00};
    const uint16_t bf[4] = {0x3f80, 0xc040, 0x7f80, 0x0001};
    const double dd[3] = {0.1, 1e300, -0.0};
    const float ff[2] = {-3.5f, 1e-45f};
    const int32_t ii[1] = {5};
    const int64_t s8[] = {8}, s1[] = {1}, s4[] = {4}, s3[] = {3}, s2[] = {2}, s21[] = {2, 1};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "h", PRL_DTYPE_F16, s8, 1, h), 0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "hn", PRL_DTYPE_F16, s1, 1, hn), 0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "bf", PRL_DTYPE_BF16, s4, 1, bf), 0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "dd", PRL_DTYPE_F64, s3, 1, dd), 0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "ff", PRL_DTYPE_F32, s21, 2, ff), 0);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "ii", PRL_DTYPE_I32, s1, 1, ii), 0);
    size_t len;
    uint8_t *out = write_mem(&w, &len);
    prl_safetensors_writer_free(&w);
    prl_safetensors st = parse_ok(out, len);

    float f[8];
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "h", s8, 1, f), PRL_OK);
    ck_assert_float_eq(f[0], 1.0f);
    ck_assert_float_eq(f[1], -2.0f);
    ck_assert_float_eq(f[2], 65504.0f);
    ck_assert_float_eq(f[3], 0x1p-24f);        /* smallest subnormal */
    ck_assert_float_eq(f[4], 1023 * 0x1p-24f); /* largest subnormal */
    ck_assert(isinf(f[5]) && f[5] > 0);
    ck_assert(isinf(f[6]) && f[6] < 0);
    ck_assert(f[7] == 0 && signbit(f[7]));
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "hn", s1, 1, f), PRL_OK);
    ck_assert(isnan(f[0]));
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "bf", s4, 1, f), PRL_OK);
    ck_assert_float_eq(f[0], 1.0f);
    ck_assert_float_eq(f[1], -3.0f);
    ck_assert(isinf(f[2]));
    ck_assert_float_eq(f[3], 0x1p-133f); /* bf16 subnormal: same bits as f32 top half */
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "dd", s3, 1, f), PRL_OK);
    ck_assert_float_eq(f[0], 0.1f);
    ck_assert(isinf(f[1]));
    ck_assert(f[2] == 0 && signbit(f[2]));
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "ff", s21, 2, f), PRL_OK);
    ck_assert_float_eq(f[0], -3.5f);
    ck_assert_float_eq(f[1], 1e-45f);

    double d[8];
    ck_assert_int_eq(prl_safetensors_read_f64(&st, "dd", s3, 1, d), PRL_OK);
    ck_assert_double_eq(d[0], 0.1);
    ck_assert_double_eq(d[1], 1e300);
    ck_assert_int_eq(prl_safetensors_read_f64(&st, "ff", s21, 2, d), PRL_OK);
    ck_assert_double_eq(d[0], -3.5);
    ck_assert_double_eq(d[1], (double)1e-45f);
    ck_assert_int_eq(prl_safetensors_read_f64(&st, "h", s8, 1, d), PRL_OK);
    ck_assert_double_eq(d[2], 65504.0);
    ck_assert_double_eq(d[3], 0x1p-24);
    ck_assert_int_eq(prl_safetensors_read_f64(&st, "bf", s4, 1, d), PRL_OK);
    ck_assert_double_eq(d[1], -3.0);

    /* errors name the tensor and both shapes */
    const int64_t s12[] = {1, 2};
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "ff", s12, 2, f), PRL_ERR_FORMAT);
    assert_msg_has("tensor 'ff'");
    assert_msg_has("shape [2,1]");
    assert_msg_has("expected [1,2]");
    ck_assert_int_eq(prl_safetensors_read_f64(&st, "ff", s2, 1, d), PRL_ERR_FORMAT);
    assert_msg_has("shape [2,1], expected [2]");
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "hn", NULL, 0, f), PRL_ERR_FORMAT);
    assert_msg_has("tensor 'hn' has shape [1], expected []");
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "missing.w", s1, 1, f), PRL_ERR_FORMAT);
    assert_msg_has("tensor 'missing.w' not found");
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "ii", s1, 1, f), PRL_ERR_UNSUPPORTED);
    assert_msg_has("tensor 'ii' has dtype I32");
    ck_assert_int_eq(prl_safetensors_read_f64(&st, "ii", s1, 1, d), PRL_ERR_UNSUPPORTED);
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "ff", s21, 9, f), PRL_ERR_ARG);
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "ff", NULL, 2, f), PRL_ERR_ARG);
    const int64_t neg[] = {-2, -1};
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "ff", neg, 2, f), PRL_ERR_ARG);
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "ff", s21, 2, NULL), PRL_ERR_ARG);
    ck_assert_int_eq(prl_safetensors_read_f32(NULL, "ff", s21, 2, f), PRL_ERR_ARG);
    prl_safetensors_free(&st);
    free(out);
}
END_TEST

/* The data region need not be aligned (N % 8 != 0 is legal); conversion copes. */
START_TEST(test_read_unaligned)
{
    static const char json[] = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    const float v[2] = {1.5f, -2.25f};
    size_t len;
    uint8_t *b = make_file(json, sizeof json - 1, v, sizeof v, &len);
    ck_assert_uint_ne((8 + sizeof json - 1) % 4, 0);
    prl_safetensors st = parse_ok(b, len);
    float f[2];
    const int64_t s[] = {2};
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "x", s, 1, f), PRL_OK);
    ck_assert_float_eq(f[0], 1.5f);
    ck_assert_float_eq(f[1], -2.25f);
    prl_safetensors_free(&st);
    free(b);
}
END_TEST

/* ---------------------------------------------------------------- writer checks ---- */

START_TEST(test_writer_rejects)
{
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    const float v[4] = {0};
    const int64_t s[] = {2, 2}, sn[] = {2, -1}, sbig[] = {INT64_MAX, INT64_MAX};
    const int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "ok", PRL_DTYPE_F32, s, 2, v), PRL_OK);
    struct {
        const char *name;
        int dtype;
        const int64_t *shape;
        int ndim;
        const void *data;
        const char *needle;
    } cases[] = {
        {"", PRL_DTYPE_F32, s, 2, v, "invalid tensor name ''"},
        {"a b", PRL_DTYPE_F32, s, 2, v, "invalid tensor name 'a b'"},
        {"a/b", PRL_DTYPE_F32, s, 2, v, "invalid tensor name 'a/b'"},
        {"w\xc3\xa9", PRL_DTYPE_F32, s, 2, v, "invalid tensor name 'w\\xc3\\xa9'"},
        {"a\"b", PRL_DTYPE_F32, s, 2, v, "invalid tensor name"},
        {"__metadata__", PRL_DTYPE_F32, s, 2, v, "reserved"},
        {"ok", PRL_DTYPE_F32, s, 2, v, "duplicate tensor name 'ok'"},
        {"ok", PRL_DTYPE_U8, NULL, 0, v, "duplicate tensor name 'ok'"},
        {"t1", PRL_DTYPE_COUNT, s, 2, v, "tensor 't1': unknown dtype 15"},
        {"t2", -1, s, 2, v, "tensor 't2': unknown dtype -1"},
        {"t3", PRL_DTYPE_F32, s9, 9, v, "tensor 't3': rank 9"},
        {"t4", PRL_DTYPE_F32, s, -1, v, "tensor 't4': rank -1"},
        {"t5", PRL_DTYPE_F32, NULL, 2, v, "tensor 't5'"},
        {"t6", PRL_DTYPE_F32, sn, 2, v, "tensor 't6': negative dimension -1"},
        {"t7", PRL_DTYPE_U8, sbig, 2, v, "tensor 't7': byte size of shape"},
        {"t8", PRL_DTYPE_F32, s, 2, NULL, "tensor 't8': NULL data for 16 bytes"},
        {NULL, PRL_DTYPE_F32, s, 2, v, "NULL tensor name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prl_status rc = prl_safetensors_writer_add(&w, cases[i].name, (prl_dtype)cases[i].dtype,
                                                   cases[i].shape, cases[i].ndim, cases[i].data);
        ck_assert_msg(rc == PRL_ERR_ARG, "case %zu: %s", i, prl_status_name(rc));
        assert_msg_has(cases[i].needle);
        ck_assert_uint_eq(w.n_tensors, 1); /* nothing queued by a failed add */
    }
    ck_assert_int_eq(prl_safetensors_writer_add(NULL, "x", PRL_DTYPE_F32, s, 2, v), PRL_ERR_ARG);
    /* NULL data is fine when there are no bytes */
    const int64_t s0[] = {0, 5};
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "e", PRL_DTYPE_F32, s0, 2, NULL), PRL_OK);
    /* metadata must be valid UTF-8 */
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "k\xff", "v"), PRL_ERR_ARG);
    assert_msg_has("key \"k\\xff\" is not valid UTF-8");
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "k", "\xed\xa0\x80"), PRL_ERR_ARG);
    assert_msg_has("value of key \"k\" is not valid UTF-8");
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, NULL, "v"), PRL_ERR_ARG);
    ck_assert_uint_eq(w.n_metadata, 0);
    /* output/args */
    ck_assert_int_eq(prl_safetensors_writer_to_memory(&w, NULL, NULL), PRL_ERR_ARG);
    ck_assert_int_eq(prl_safetensors_writer_save(&w, ""), PRL_ERR_ARG);
    ck_assert_int_eq(prl_safetensors_writer_save(&w, NULL), PRL_ERR_ARG);
    /* many tensors: exercises array growth and the duplicate scan */
    char name[32];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "p.%03d", i);
        ck_assert_int_eq(prl_safetensors_writer_add(&w, name, PRL_DTYPE_F32, NULL, 0, v), PRL_OK);
    }
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "p.123", PRL_DTYPE_F32, NULL, 0, v),
                     PRL_ERR_ARG);
    size_t len;
    uint8_t *out = write_mem(&w, &len);
    prl_safetensors st = parse_ok(out, len);
    ck_assert_uint_eq(st.n_tensors, 302);
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "p.%03d", i);
        const prl_safetensors_tensor *t = prl_safetensors_find(&st, name);
        ck_assert_ptr_nonnull(t);
        ck_assert_str_eq(t->name, name);
    }
    ck_assert_ptr_null(prl_safetensors_find(&st, "p.300"));
    ck_assert_ptr_null(prl_safetensors_find(&st, ""));
    prl_safetensors_free(&st);
    free(out);
    prl_safetensors_writer_free(&w);
    ck_assert_uint_eq(w.n_tensors, 0);
}
END_TEST

/* A header over the reader's limit is refused by the writer too. */
START_TEST(test_writer_header_limit)
{
    size_t n = 100000000;
    char *big = malloc(n + 1);
    memset(big, 'v', n);
    big[n] = '\0';
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_set_metadata(&w, "k", big), PRL_OK);
    uint8_t *out = (uint8_t *)1;
    size_t len = 1;
    ck_assert_int_eq(prl_safetensors_writer_to_memory(&w, &out, &len), PRL_ERR_RANGE);
    assert_msg_has("limit 100000000");
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(len, 0);
    prl_safetensors_writer_free(&w);
    free(big);
}
END_TEST

/* ---------------------------------------------------------------- files ------------ */

/* Test seam: this definition of fsync() overrides libc's for the whole test program (the
** executable's symbol wins at link time), so the writer's fsync failure paths, which a
** real disk almost never takes, run deterministically. 0 = pass through to the kernel. */
static int fsync_file_errno, fsync_dir_errno;

int fsync(int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) == 0) {
        int e = S_ISDIR(sb.st_mode) ? fsync_dir_errno : fsync_file_errno;
        if (e) {
            errno = e;
            return -1;
        }
    }
    return (int)syscall(SYS_fsync, fd);
}

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/prl_st_test_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

/* Names in `dir` (sorted, space-separated) for "no temp file left" checks. */
static void list_dir(const char *dir, char *out, size_t cap)
{
    char names[16][256];
    int n = 0;
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        ck_assert_int_lt(n, 16);
        snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < cap; i++) {
        int k = snprintf(out + len, cap - len, "%s%s", i ? " " : "", names[i]);
        len += k > 0 ? (size_t)k : 0;
    }
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) remove_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

START_TEST(test_save_and_open)
{
    make_tmpdir();
    char path[256], listing[1024];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", tmpdir);
    size_t len;
    uint8_t *want = rich_file(&len);
    prl_safetensors src = parse_ok(want, len);
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    for (size_t i = 0; i < src.n_tensors; i++)
        ck_assert_int_eq(prl_safetensors_writer_add(&w, src.tensors[i].name, src.tensors[i].dtype,
                                                    src.tensors[i].shape, src.tensors[i].ndim,
                                                    src.tensors[i].data),
                         PRL_OK);
    for (size_t i = 0; i < src.n_metadata; i++)
        ck_assert_int_eq(
            prl_safetensors_writer_set_metadata(&w, src.metadata_keys[i], src.metadata_values[i]),
            PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_save(&w, path), PRL_OK);
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "ckpt.safetensors");
    size_t got_len;
    uint8_t *got = (uint8_t *)check_read_file(path, &got_len);
    assert_bytes(got, got_len, want, len);
    free(got);

    prl_safetensors st;
    ck_assert_int_eq(prl_safetensors_open(&st, path), PRL_OK);
    ck_assert_ptr_nonnull(st.map);
    ck_assert_str_eq(st.label, path);
    ck_assert_uint_eq(st.n_tensors, src.n_tensors);
    ck_assert_str_eq(prl_safetensors_metadata(&st, "step"), "1234");
    float f[6];
    const int64_t s23[] = {2, 3};
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "layers.0.attn.wq", s23, 2, f), PRL_OK);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(f[i], (float)(i + 1));
    prl_safetensors_free(&st);

    /* overwrite an existing file: replaced, still no temp file */
    prl_safetensors_writer_free(&w);
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_save(&w, path), PRL_OK);
    got = (uint8_t *)check_read_file(path, &got_len);
    assert_bytes(got, got_len, "\x08\0\0\0\0\0\0\0{}      ", 16);
    free(got);
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "ckpt.safetensors");

    /* a relative path (no directory part) syncs "." */
    char cwd[512];
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir(tmpdir), 0);
    ck_assert_int_eq(prl_safetensors_writer_save(&w, "rel.safetensors"), PRL_OK);
    ck_assert_int_eq(chdir(cwd), 0);
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "ckpt.safetensors rel.safetensors");

    prl_safetensors_writer_free(&w);
    prl_safetensors_free(&src);
    free(want);
    remove_tree(tmpdir);
}
END_TEST

START_TEST(test_open_errors)
{
    make_tmpdir();
    char path[256];
    prl_safetensors st;
    snprintf(path, sizeof path, "%s/missing.safetensors", tmpdir);
    ck_assert_int_eq(prl_safetensors_open(&st, path), PRL_ERR_IO);
    assert_msg_has(path);
    assert_msg_has("No such file");
    ck_assert(is_zeroed(&st));
    ck_assert_int_eq(prl_safetensors_open(&st, tmpdir), PRL_ERR_IO);
    assert_msg_has("not a regular file");
    ck_assert_int_eq(prl_safetensors_open(&st, NULL), PRL_ERR_ARG);

    snprintf(path, sizeof path, "%s/empty.safetensors", tmpdir);
    FILE *f = fopen(path, "wb");
    fclose(f);
    ck_assert_int_eq(prl_safetensors_open(&st, path), PRL_ERR_FORMAT);
    assert_msg_has(path);
    assert_msg_has("too small");

    /* a truncated file on disk is rejected with its path in the message */
    size_t len;
    uint8_t *full = rich_file(&len);
    snprintf(path, sizeof path, "%s/trunc.safetensors", tmpdir);
    f = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(full, 1, len - 1, f), len - 1);
    fclose(f);
    ck_assert_int_eq(prl_safetensors_open(&st, path), PRL_ERR_FORMAT);
    assert_msg_has(path);
    assert_msg_has("tensors cover");
    ck_assert(is_zeroed(&st));
    free(full);
    remove_tree(tmpdir);
}
END_TEST

/* Failure before anything is written: no temp file and no final file appear. */
START_TEST(test_save_missing_directory)
{
    make_tmpdir();
    char path[256], listing[1024];
    snprintf(path, sizeof path, "%s/nope/ckpt.safetensors", tmpdir);
    const float v[2] = {1, 2};
    const int64_t s[] = {2};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "x", PRL_DTYPE_F32, s, 1, v), PRL_OK);
    ck_assert_int_eq(prl_safetensors_writer_save(&w, path), PRL_ERR_IO);
    assert_msg_has("nope/ckpt.safetensors.tmp.");
    assert_msg_has("No such file");
    struct stat sb;
    ck_assert_int_ne(stat(path, &sb), 0);
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "");
    prl_safetensors_writer_free(&w);
    remove_tree(tmpdir);
}
END_TEST

/* Failure at rename (the target is a non-empty directory): temp file removed, the
** directory untouched. */
START_TEST(test_save_rename_fails)
{
    make_tmpdir();
    char path[256], inner[300], listing[1024];
    snprintf(path, sizeof path, "%s/target", tmpdir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(inner, sizeof inner, "%s/keep", path);
    FILE *f = fopen(inner, "wb");
    fclose(f);
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_save(&w, path), PRL_ERR_IO);
    assert_msg_has("rename");
    assert_msg_has(path);
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "target");
    list_dir(path, listing, sizeof listing);
    ck_assert_str_eq(listing, "keep");
    prl_safetensors_writer_free(&w);
    remove_tree(tmpdir);
}
END_TEST

/* Failure in the middle of writing the data (file size limit): the old file is intact and
** no temp file is left. Runs in a child so that the rlimit cannot leak into other tests
** even when Check runs without fork. */
START_TEST(test_save_write_fails_keeps_old)
{
    make_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", tmpdir);
    const float old[2] = {7, 8};
    const int64_t s_old[] = {2};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "old", PRL_DTYPE_F32, s_old, 1, old), 0);
    ck_assert_int_eq(prl_safetensors_writer_save(&w, path), PRL_OK);
    prl_safetensors_writer_free(&w);
    size_t old_len;
    uint8_t *old_bytes = (uint8_t *)check_read_file(path, &old_len);

    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        free(old_bytes);           /* the child needs only the path */
        static float big[1 << 16]; /* 256 KiB, far above the limit */
        const int64_t s_big[] = {1 << 16};
        signal(SIGXFSZ, SIG_IGN); /* get EFBIG from write instead of being killed */
        struct rlimit rl = {4096, 4096};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
        prl_safetensors_writer cw;
        prl_safetensors_writer_init(&cw);
        if (prl_safetensors_writer_add(&cw, "big", PRL_DTYPE_F32, s_big, 1, big) != 0) _exit(11);
        prl_status rc = prl_safetensors_writer_save(&cw, path);
        if (rc != PRL_ERR_IO) _exit(12);
        if (!strstr(prl_error_message(), "File too large")) _exit(13);
        prl_safetensors_writer_free(&cw);
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);

    size_t now_len;
    uint8_t *now = (uint8_t *)check_read_file(path, &now_len);
    assert_bytes(now, now_len, old_bytes, old_len);
    char listing[1024];
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "ckpt.safetensors");
    free(now);
    free(old_bytes);
    remove_tree(tmpdir);
}
END_TEST

static void save_small(const char *path, float value, prl_status want)
{
    const float v[1] = {value};
    const int64_t s[] = {1};
    prl_safetensors_writer w;
    prl_safetensors_writer_init(&w);
    ck_assert_int_eq(prl_safetensors_writer_add(&w, "v", PRL_DTYPE_F32, s, 1, v), PRL_OK);
    prl_status rc = prl_safetensors_writer_save(&w, path);
    ck_assert_msg(rc == want, "save: %s (%s)", prl_status_name(rc), prl_error_message());
    prl_safetensors_writer_free(&w);
}

static float load_small(const char *path)
{
    prl_safetensors st;
    ck_assert_int_eq(prl_safetensors_open(&st, path), PRL_OK);
    float v;
    const int64_t s[] = {1};
    ck_assert_int_eq(prl_safetensors_read_f32(&st, "v", s, 1, &v), PRL_OK);
    prl_safetensors_free(&st);
    return v;
}

/* fsync of the data fails: temp removed, the old file untouched; with no old file, none. */
START_TEST(test_save_fsync_file_fails)
{
    make_tmpdir();
    char path[256], listing[1024];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", tmpdir);
    save_small(path, 1.0f, PRL_OK);
    fsync_file_errno = EIO;
    save_small(path, 2.0f, PRL_ERR_IO);
    assert_msg_has("fsync");
    assert_msg_has("ckpt.safetensors.tmp.");
    assert_msg_has("Input/output error");
    fsync_file_errno = 0;
    ck_assert_float_eq(load_small(path), 1.0f);
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "ckpt.safetensors");

    snprintf(path, sizeof path, "%s/fresh.safetensors", tmpdir);
    fsync_file_errno = EIO;
    save_small(path, 3.0f, PRL_ERR_IO);
    fsync_file_errno = 0;
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "ckpt.safetensors");
    remove_tree(tmpdir);
}
END_TEST

/* fsync of the directory fails after the rename: error returned; a new name is removed
** again, an existing one holds the complete new file (the rename cannot be undone); a file
** system that cannot sync directories (EINVAL) is not an error. */
START_TEST(test_save_fsync_dir_fails)
{
    make_tmpdir();
    char path[256], listing[1024];
    snprintf(path, sizeof path, "%s/new.safetensors", tmpdir);
    fsync_dir_errno = EIO;
    save_small(path, 1.0f, PRL_ERR_IO);
    assert_msg_has("fsync directory");
    assert_msg_has(tmpdir);
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "");

    fsync_dir_errno = 0;
    save_small(path, 1.0f, PRL_OK);
    fsync_dir_errno = EIO;
    save_small(path, 2.0f, PRL_ERR_IO);
    fsync_dir_errno = 0;
    ck_assert_float_eq(load_small(path), 2.0f);
    list_dir(tmpdir, listing, sizeof listing);
    ck_assert_str_eq(listing, "new.safetensors");

    fsync_dir_errno = EINVAL;
    save_small(path, 3.0f, PRL_OK);
    fsync_dir_errno = 0;
    ck_assert_float_eq(load_small(path), 3.0f);
    remove_tree(tmpdir);
}
END_TEST

/* prl_file_append_line: whole lines appended; a torn tail (a crash mid-line) cut before the
** next line, also when it is the only content or longer than the reader's buffer. */
START_TEST(test_append_line)
{
    make_tmpdir();
    char path[256];
    size_t len;
    snprintf(path, sizeof path, "%s/log.jsonl", tmpdir);
    assert_ok(prl_file_append_line(path, "{\"step\": 0}"));
    assert_ok(prl_file_append_line(path, "{\"step\": 1}"));
    char *text = check_read_file(path, &len);
    ck_assert_str_eq(text, "{\"step\": 0}\n{\"step\": 1}\n");
    free(text);
    FILE *f = fopen(path, "a");
    fputs("{\"step\": 2, \"lo", f); /* torn */
    fclose(f);
    assert_ok(prl_file_append_line(path, "{\"step\": 2}"));
    text = check_read_file(path, &len);
    ck_assert_str_eq(text, "{\"step\": 0}\n{\"step\": 1}\n{\"step\": 2}\n");
    free(text);
    f = fopen(path, "w");
    for (int i = 0; i < 10000; i++) fputc('x', f); /* a torn first line, > 4 KiB */
    fclose(f);
    assert_ok(prl_file_append_line(path, NULL));
    text = check_read_file(path, &len);
    ck_assert_uint_eq(len, 0);
    free(text);
    snprintf(path, sizeof path, "%s/no/such/log.jsonl", tmpdir);
    ck_assert_int_eq(prl_file_append_line(path, "x"), PRL_ERR_IO);
    assert_msg_has(path);
    remove_tree(tmpdir);
}
END_TEST

/* ---------------------------------------------------------------- suite ------------ */

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("examples");
    tcase_add_test(tc, test_dtype_table);
    tcase_add_test(tc, test_example1);
    tcase_add_test(tc, test_example2);
    tcase_add_test(tc, test_example3);
    tcase_add_test(tc, test_example4);
    tcase_add_test(tc, test_example5);
    tcase_add_test(tc, test_example6);
    suite_add_tcase(s, tc);

    tc = tcase_create("roundtrip");
    tcase_add_test(tc, test_roundtrip_all_dtypes);
    tcase_add_test(tc, test_roundtrip_scalar_empty_metadata);
    tcase_add_test(tc, test_writer_name_order);
    tcase_add_test(tc, test_reader_accepts_variants);
    tcase_add_test(tc, test_read_f32_conversions);
    tcase_add_test(tc, test_read_unaligned);
    suite_add_tcase(s, tc);

    tc = tcase_create("reject");
    tcase_add_test(tc, test_reject_too_small);
    tcase_add_test(tc, test_reject_header_length);
    tcase_add_loop_test(tc, test_reject_case, 0, N_REJECT_CASES);
    tcase_add_test(tc, test_reject_long_name_message);
    tcase_add_test(tc, test_writer_rejects);
    tcase_add_test(tc, test_writer_header_limit);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);

    tc = tcase_create("robustness");
    tcase_add_test(tc, test_truncated_files);
    tcase_add_test(tc, test_fuzz_header_flips);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    tc = tcase_create("files");
    tcase_add_test(tc, test_save_and_open);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_save_missing_directory);
    tcase_add_test(tc, test_save_rename_fails);
    tcase_add_test(tc, test_save_write_fails_keeps_old);
    tcase_add_test(tc, test_save_fsync_file_fails);
    tcase_add_test(tc, test_save_fsync_dir_fails);
    tcase_add_test(tc, test_append_line);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(safetensors_suite()); }
