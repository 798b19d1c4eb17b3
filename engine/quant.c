/*
** quant.c — the W8A8 kernels (quant.h): weight and activation quantization, the exact int32
** dot products (naive reference, AVX2, AVX-512 VNNI) chosen once by cpuid, dequantization, and
** the BF16-stored weights' dot products. docs/w8a8.md has the maths.
*/
#include "engine/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int prl_q8_ld(int in) { return (in + 63) / 64 * 64; }

/* The interleaved layout: four rows' 32-byte chunks in turn, so a kernel computing four
** outputs reads one sequential stream (as the fp32 GEMM's packed panels; four separate row
** streams were slower). Rows past `out` are zero. */
size_t prl_q8w_index(const prl_q8w *w, int o, int i)
{
    size_t chunks = (size_t)w->ld / 32;
    return (((size_t)(o / 4) * chunks + (size_t)i / 32) * 4 + (size_t)(o % 4)) * 32 +
           (size_t)i % 32;
}

/* round(v / scale) clamped to [-127, 127]: -128 never appears, so |x|·|w| <= 127² and two
** such products fit int16 (the AVX2 kernel's vpmaddubsw cannot saturate). */
static int8_t q8_round(float v, float inv)
{
    float r = nearbyintf(v * inv);
    if (r != r) return 0; /* NaN (a non-finite row, whose scale is NaN): no UB cast */
    return (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
}

/* The quantization of x[0..in) (times m[i] when m): *scale = max|x·m| / 127 and the return
** value 127 / max, the multiplier of each code. A NaN or ∞ in the row makes the scale NaN, so
** its outputs are NaN as fp32 would pass them on (the codes are zeros); a subnormal max, whose
** 127/max overflows, quantizes to zeros. */
static float q8_row_scale(const float *x, const float *m, int in, float *scale)
{
    float amax = 0;
    int finite = 1;
    for (int i = 0; i < in; i++) {
        float v = fabsf(m ? x[i] * m[i] : x[i]);
        finite &= isfinite(v) != 0;
        amax = v > amax ? v : amax;
    }
    *scale = finite ? amax / 127.0f : NAN;
    return finite && amax > 0 && isfinite(127.0f / amax) ? 127.0f / amax : 0;
}

prl_status prl_q8w_init(prl_q8w *w, const float *W, int ldw, int out, int in, const float *s)
{
    memset(w, 0, sizeof *w);
    w->out = out, w->in = in, w->ld = prl_q8_ld(in);
    w->q = calloc((size_t)(out + 3) / 4 * 4 * w->ld, 1);
    w->scale = calloc((size_t)out, sizeof *w->scale);
    w->wsum = calloc((size_t)out, sizeof *w->wsum);
    w->inv_s = s ? calloc((size_t)in, sizeof *w->inv_s) : NULL;
    if (!w->q || !w->scale || !w->wsum || (s && !w->inv_s)) {
        prl_q8w_free(w);
        return prl_error_set(PRL_ERR_NOMEM, "INT8 weights [%d, %d]", out, in);
    }
    for (int i = 0; s && i < in; i++) w->inv_s[i] = 1.0f / s[i];
    for (int o = 0; o < out; o++) {
        const float *row = W + (size_t)o * ldw;
        float inv = q8_row_scale(row, s, in, &w->scale[o]);
        int32_t sum = 0;
        for (int i = 0; i < in; i++)
            sum += w->q[prl_q8w_index(w, o, i)] = q8_round(s ? row[i] * s[i] : row[i], inv);
        w->wsum[o] = sum;
    }
    return PRL_OK;
}

void prl_q8w_free(prl_q8w *w)
{
    free(w->q), free(w->scale), free(w->wsum), free(w->inv_s);
    memset(w, 0, sizeof *w);
}

void prl_q8_quantize_rows(int8_t *q, float *scale, const float *x, int ldx, int R, int in, int ld,
                          const float *inv_s)
{
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * ldx;
        int8_t *qr = q + (size_t)r * ld;
        float inv = q8_row_scale(xr, inv_s, in, &scale[r]);
        for (int i = 0; i < in; i++) qr[i] = q8_round(inv_s ? xr[i] * inv_s[i] : xr[i], inv);
        memset(qr + in, 0, (size_t)(ld - in));
    }
}

/* ------------------------------------------------------------------ int8 dots ------- */

static void dots_naive(int32_t *acc, const int8_t *xq, const prl_q8w *w, int o0, int no)
{
    for (int o = 0; o < no; o++) {
        int32_t s = 0;
        for (int i = 0; i < w->in; i++) s += (int32_t)xq[i] * w->q[prl_q8w_index(w, o0 + o, i)];
        acc[o] = s;
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2"))) static int32_t hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* |x| (unsigned) times sign(x)·w (signed) by vpmaddubsw: pairs of products <= 2·127² fit
** int16; vpmaddwd by ones widens to int32. Four outputs share each load of x. */
__attribute__((target("avx2"))) static void dots_avx2(int32_t *acc, const int8_t *xq,
                                                      const prl_q8w *w, int o0, int no)
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int o = 0; o < no; o += 4) {
        int n4 = no - o < 4 ? no - o : 4;
        const int8_t *q = w->q + prl_q8w_index(w, o0 + o, 0); /* four rows, interleaved */
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
        for (int i = 0; i < w->ld; i += 32, q += 128) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i)), ax = _mm256_abs_epi8(x);
#define STEP(c, j)                                                                                 \
    c = _mm256_add_epi32(                                                                          \
        c, _mm256_madd_epi16(                                                                      \
               _mm256_maddubs_epi16(                                                               \
                   ax, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(q + 32 * (j))), x)),  \
               ones))
            STEP(c0, 0);
            STEP(c1, 1);
            STEP(c2, 2);
            STEP(c3, 3);
#undef STEP
        }
        int32_t r[4] = {hsum_epi32(c0), hsum_epi32(c1), hsum_epi32(c2), hsum_epi32(c3)};
        for (int j = 0; j < n4; j++) acc[o + j] = r[j];
    }
}

/* vpdpbusd multiplies unsigned by signed bytes: x + 128 is unsigned, and
** Σ (x+128)·w − 128·Σ w = Σ x·w exactly. Each 512-bit load takes two rows' 32-byte chunks of
** the interleaved layout, against x's chunk twice. Compiled always, run only where cpuid says
** so (this repository's development machine has AVX2 only, so this kernel is untested there). */
__attribute__((target("avx2,avx512f,avx512bw,avx512vnni"))) static void dots_vnni(int32_t *acc,
                                                                                  const int8_t *xq,
                                                                                  const prl_q8w *w,
                                                                                  int o0, int no)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int o = 0; o < no; o += 4) {
        int n4 = no - o < 4 ? no - o : 4;
        const int8_t *q = w->q + prl_q8w_index(w, o0 + o, 0);
        __m512i c01 = _mm512_setzero_si512(), c23 = c01;
        for (int i = 0; i < w->ld; i += 32, q += 128) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i));
            __m512i u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(x), x, 1), flip);
            c01 = _mm512_dpbusd_epi32(c01, u, _mm512_loadu_si512(q));
            c23 = _mm512_dpbusd_epi32(c23, u, _mm512_loadu_si512(q + 64));
        }
        int32_t r[4] = {
            hsum_epi32(_mm512_castsi512_si256(c01)), hsum_epi32(_mm512_extracti64x4_epi64(c01, 1)),
            hsum_epi32(_mm512_castsi512_si256(c23)), hsum_epi32(_mm512_extracti64x4_epi64(c23, 1))};
        for (int j = 0; j < n4; j++) acc[o + j] = r[j] - 128 * w->wsum[o0 + o + j];
    }
}
#endif

static prl_q8_kernel active = PRL_Q8_NAIVE;
static int chosen;
static const char *const kernel_names[] = {"naive", "avx2", "vnni"};

const char *prl_q8_kernel_name(prl_q8_kernel k)
{
    return (unsigned)k <= PRL_Q8_VNNI ? kernel_names[k] : "?";
}

int prl_q8_kernel_supported(prl_q8_kernel k)
{
    if (k == PRL_Q8_NAIVE) return 1;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (k == PRL_Q8_AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (k == PRL_Q8_VNNI)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni");
#endif
    return 0;
}

prl_status prl_q8_kernel_set(const char *name)
{
    if (!name) {
        const char *env = getenv("PRL_Q8_KERNEL");
        if (env && *env) {
            prl_status rc = prl_q8_kernel_set(env);
            return rc ? prl_error_wrap(rc, "PRL_Q8_KERNEL: ") : PRL_OK;
        }
        active = prl_q8_kernel_supported(PRL_Q8_VNNI)   ? PRL_Q8_VNNI
                 : prl_q8_kernel_supported(PRL_Q8_AVX2) ? PRL_Q8_AVX2
                                                        : PRL_Q8_NAIVE;
        chosen = 1;
        return PRL_OK;
    }
    for (int k = 0; k < 3; k++)
        if (!strcmp(name, kernel_names[k])) {
            if (!prl_q8_kernel_supported((prl_q8_kernel)k))
                return prl_error_set(PRL_ERR_ARG,
                                     "INT8 kernel '%s' needs an instruction set this "
                                     "CPU does not have",
                                     name);
            active = (prl_q8_kernel)k, chosen = 1;
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_ARG, "unknown INT8 kernel '%s' (choices: naive, avx2, vnni)",
                         name);
}

prl_status prl_q8_kernel_env_check(void)
{
    const char *env = getenv("PRL_Q8_KERNEL");
    if (!env || !*env) return PRL_OK;
    for (int k = 0; k < 3; k++)
        if (!strcmp(env, kernel_names[k]))
            return prl_q8_kernel_supported((prl_q8_kernel)k)
                       ? PRL_OK
                       : prl_error_set(PRL_ERR_ARG,
                                       "PRL_Q8_KERNEL=%s: this CPU lacks its instruction set", env);
    return prl_error_set(PRL_ERR_ARG,
                         "PRL_Q8_KERNEL=%s: unknown INT8 kernel (choices: naive, "
                         "avx2, vnni)",
                         env);
}

prl_q8_kernel prl_q8_kernel_active(void)
{
    if (!chosen && prl_q8_kernel_set(NULL)) active = PRL_Q8_NAIVE, chosen = 1;
    return active;
}

void prl_q8_dots(prl_q8_kernel k, int32_t *acc, const int8_t *xq, const prl_q8w *w, int o0, int no)
{
    PRL_ASSERT(o0 % 4 == 0);                /* a group of the interleaved layout */
    PRL_ASSERT(prl_q8_kernel_supported(k)); /* never an instruction set the CPU lacks */
#if defined(__x86_64__)
    if (k == PRL_Q8_AVX2) return dots_avx2(acc, xq, w, o0, no);
    if (k == PRL_Q8_VNNI) return dots_vnni(acc, xq, w, o0, no);
#endif
    dots_naive(acc, xq, w, o0, no);
}

enum { Q8_BLOCK = 64 }; /* outputs a row's int32 sums are held for at once */

void prl_q8_linear_block(float *y, int ldy, const int8_t *xq, const float *xs, int R,
                         const prl_q8w *w, int o0, int no)
{
    prl_q8_kernel k = prl_q8_kernel_active();
    int32_t acc[Q8_BLOCK];
    for (int b = 0; b < no; b += Q8_BLOCK) {
        int nb = no - b < Q8_BLOCK ? no - b : Q8_BLOCK;
        for (int r = 0; r < R; r++) {
            prl_q8_dots(k, acc, xq + (size_t)r * w->ld, w, o0 + b, nb);
            float *yr = y + (size_t)r * ldy + b;
            for (int o = 0; o < nb; o++) yr[o] = (float)acc[o] * w->scale[o0 + b + o] * xs[r];
        }
    }
}

/* ------------------------------------------------------------------ bf16 weights ---- */

/* Four rows' 8-value chunks in turn (one sequential stream for four outputs, as the INT8
** layout), rows padded to a multiple of four with zeros; each row's last in mod 8 values after
** all the groups, row by row. */
size_t prl_bf16w_index(const prl_bf16w *w, int o, int i)
{
    int n8 = w->in / 8 * 8, groups = (w->out + 3) / 4;
    if (i >= n8) return (size_t)groups * 4 * n8 + (size_t)o * (w->in - n8) + (size_t)(i - n8);
    return (((size_t)(o / 4) * (n8 / 8) + (size_t)i / 8) * 4 + (size_t)(o % 4)) * 8 + (size_t)i % 8;
}

prl_status prl_bf16w_init(prl_bf16w *w, const float *W, int ldw, int out, int in)
{
    w->out = out, w->in = in;
    size_t n8 = (size_t)in / 8 * 8,
           total = (size_t)(out + 3) / 4 * 4 * n8 + (size_t)out * (in - n8);
    w->w = calloc(total ? total : 1, sizeof *w->w);
    if (!w->w) return prl_error_set(PRL_ERR_NOMEM, "BF16 weights [%d, %d]", out, in);
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            float v = prl_round_bf16(W[(size_t)o * ldw + i]);
            uint32_t u;
            memcpy(&u, &v, sizeof u);
            w->w[prl_bf16w_index(w, o, i)] = (uint16_t)(u >> 16);
        }
    return PRL_OK;
}

void prl_bf16w_free(prl_bf16w *w)
{
    free(w->w);
    memset(w, 0, sizeof *w);
}

static inline float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float lane_tree(const float *l)
{
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

static void bf16_dots_naive(float *y, const float *x, const prl_bf16w *w, int o0, int no)
{
    int n = w->in;
    for (int o = 0; o < no; o++) {
        float l[8] = {0};
        int i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++)
                l[j] = fmaf(x[i + j], bf16_value(w->w[prl_bf16w_index(w, o0 + o, i + j)]), l[j]);
        float s = lane_tree(l);
        for (; i < n; i++) s = fmaf(x[i], bf16_value(w->w[prl_bf16w_index(w, o0 + o, i)]), s);
        y[o] = s;
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static __m256 bf16_load8(const uint16_t *p)
{
    __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

/* Four outputs share each load of x; each lane is the naive kernel's fused chain. */
__attribute__((target("avx2,fma"))) static void bf16_dots_avx2(float *y, const float *x,
                                                               const prl_bf16w *w, int o0, int no)
{
    int n = w->in;
    for (int o = 0; o < no; o += 4) {
        int n4 = no - o < 4 ? no - o : 4;
        const uint16_t *b = w->w + prl_bf16w_index(w, o0 + o, 0); /* four rows, interleaved */
        __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        int i = 0;
        for (; i + 8 <= n; i += 8, b += 32) {
            __m256 a = _mm256_loadu_ps(x + i);
            c0 = _mm256_fmadd_ps(a, bf16_load8(b), c0);
            c1 = _mm256_fmadd_ps(a, bf16_load8(b + 8), c1);
            c2 = _mm256_fmadd_ps(a, bf16_load8(b + 16), c2);
            c3 = _mm256_fmadd_ps(a, bf16_load8(b + 24), c3);
        }
        __m256 c[4] = {c0, c1, c2, c3};
        for (int j = 0; j < n4; j++) {
            float l[8];
            _mm256_storeu_ps(l, c[j]);
            float s = lane_tree(l);
            for (int t = i; t < n; t++)
                s = fmaf(x[t], bf16_value(w->w[prl_bf16w_index(w, o0 + o + j, t)]), s);
            y[o + j] = s;
        }
    }
}
#endif

void prl_bf16_dots(prl_q8_kernel k, float *y, const float *x, const prl_bf16w *w, int o0, int no)
{
    PRL_ASSERT(o0 % 4 == 0);
#if defined(__x86_64__)
    if (k != PRL_Q8_NAIVE && prl_q8_kernel_supported(PRL_Q8_AVX2))
        return bf16_dots_avx2(y, x, w, o0, no);
#endif
    bf16_dots_naive(y, x, w, o0, no);
}
