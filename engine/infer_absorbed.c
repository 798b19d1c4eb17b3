/*
** infer_absorbed.c — the fast kernels of one head of the absorbed attention over a latent
** cache (infer_forward.c's per-head task): the scores of n cache rows against the absorbed
** query, the softmax over them, and the weighted sum of the rows. Each gives the bits of the
** reference loops in infer_forward.c (absorbed_task: 2 × 4 GEMV tiles, scalar softmax, one
** axpy per key), so the fast form changes no result, only the speed:
**   scores: 8 keys at a time, each key's dot the GEMV-order dot (8-lane FMA accumulator in
**     index order, lanes summed by the fixed tree ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)), tail
**     fmaf'd last), the 8 trees done together by vector shuffles and adds;
**   softmax: scale, max, exp (prl_expf8 = prl_expf lane by lane), normalise 8 lanes at a
**     time; the sum of the weights stays a scalar sum in key order;
**   weighted sum: the output row's accumulators kept in registers over the keys, each
**     element y = y + p·x (multiply, then add, no fused form) in key order.
** Used only where the CPU has the instructions (AVX2 for all, FMA for the scores, the same
** test the GEMV kernels make); elsewhere the reference loops run.
*/
#include "engine/infer_int.h"
#include "engine/ops.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

/* The 8 GEMV-tree lane sums of a0..a7 as one vector [sum a0, …, sum a7]: the 128-bit halves
** fold first (l_i + l_{i+4}), then two rounds of pairwise adds give
** ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)) for each input, in input order. */
__attribute__((target("avx2,fma"))) static __m256 tree8(__m256 a0, __m256 a1, __m256 a2, __m256 a3,
                                                        __m256 a4, __m256 a5, __m256 a6, __m256 a7)
{
#define FOLD(x, y)                                                                                 \
    _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31))
    __m256 x04 = FOLD(a0, a4), x15 = FOLD(a1, a5), x26 = FOLD(a2, a6), x37 = FOLD(a3, a7);
#undef FOLD
    return _mm256_hadd_ps(_mm256_hadd_ps(x04, x15), _mm256_hadd_ps(x26, x37));
}

/* S[s] = q·c_s for s in [s0, s0 + 8), c_s = c + s·ld, over n elements. */
__attribute__((target("avx2,fma"))) static void scores8(float *S, const float *q, const float *c,
                                                        size_t ld, int n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(c + i), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(c + ld + i), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(c + 2 * ld + i), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(c + 3 * ld + i), a3);
        a4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(c + 4 * ld + i), a4);
        a5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(c + 5 * ld + i), a5);
        a6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(c + 6 * ld + i), a6);
        a7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(c + 7 * ld + i), a7);
    }
    _mm256_storeu_ps(S, tree8(a0, a1, a2, a3, a4, a5, a6, a7));
    for (int k = 0; k < 8 && i < n; k++) /* the tail after the tree, as the GEMV dot adds it */
        for (int t = i; t < n; t++) S[k] = fmaf(q[t], c[k * ld + t], S[k]);
}

/* Heads j < nh (query q + j·lat, scores S + j·ldS) block by block: a block of 8 keys comes
** from memory for the first head and from L1 for the others; the next blocks are prefetched. */
__attribute__((target("avx2,fma"))) static void scores_fma(float *S, int ldS, const float *q,
                                                           int nh, const float *c, int lat, int n)
{
    int s = 0;
    size_t blk = (size_t)8 * lat;
    for (; s + 8 <= n; s += 8) {
        const float *cb = c + (size_t)s * lat;
        for (size_t off = 0; off < blk * sizeof(float); off += 64)
            _mm_prefetch((const char *)(cb + 2 * blk) + off, _MM_HINT_T0);
        for (int j = 0; j < nh; j++)
            scores8(S + (size_t)j * ldS + s, q + (size_t)j * lat, cb, (size_t)lat, lat);
    }
    for (int j = 0; j < nh; j++)
        for (int t = s; t < n; t += 4) /* the last keys by the GEMV tile itself */
            infer__gemv_tile(q + (size_t)j * lat, lat, 1, c + (size_t)t * lat, lat,
                             n - t < 4 ? n - t : 4, lat, S + (size_t)j * ldS + t, 1);
}

/* The softmax of S[0..n) (scaled first), normalised in place; *mx and *sum its statistics. */
PRL_AVX2 static void softmax_avx2(float *S, int n, float scale, float *mx, float *sum)
{
    int s = 0;
    for (; s + 8 <= n; s += 8) prl_v8_store(S + s, prl_v8_load(S + s) * scale);
    for (; s < n; s++) S[s] = scale * S[s];
    float m = prl_v8_max_scaled(-INFINITY, S, n, 1.0f, &s); /* ·1 is exact */
    for (; s < n; s++) m = S[s] > m ? S[s] : m;
    for (s = 0; s + 8 <= n; s += 8) prl_v8_store(S + s, prl_expf8(prl_v8_load(S + s) - m));
    for (; s < n; s++) S[s] = prl_expf(S[s] - m);
    float l = 0;
    for (s = 0; s < n; s++) l += S[s]; /* in key order: the reference's sum */
    float inv = 1 / l;
    for (s = 0; s + 8 <= n; s += 8) prl_v8_store(S + s, prl_v8_load(S + s) * inv);
    for (; s < n; s++) S[s] *= inv;
    *mx = m, *sum = l;
}

/* y[0..64) = Σ_s p[s]·c_s[0..64) for s < n in order: the 8 accumulators stay in registers
** over the keys. */
PRL_AVX2 static void wsum8(float *out, const float *p, const float *c, size_t ld, int n)
{
    __m256 y0 = _mm256_setzero_ps(), y1 = y0, y2 = y0, y3 = y0, y4 = y0, y5 = y0, y6 = y0, y7 = y0;
    for (int s = 0; s < n; s++) {
        __m256 ps = _mm256_set1_ps(p[s]);
        const float *x = c + (size_t)s * ld;
        y0 = _mm256_add_ps(y0, _mm256_mul_ps(ps, _mm256_loadu_ps(x)));
        y1 = _mm256_add_ps(y1, _mm256_mul_ps(ps, _mm256_loadu_ps(x + 8)));
        y2 = _mm256_add_ps(y2, _mm256_mul_ps(ps, _mm256_loadu_ps(x + 16)));
        y3 = _mm256_add_ps(y3, _mm256_mul_ps(ps, _mm256_loadu_ps(x + 24)));
        y4 = _mm256_add_ps(y4, _mm256_mul_ps(ps, _mm256_loadu_ps(x + 32)));
        y5 = _mm256_add_ps(y5, _mm256_mul_ps(ps, _mm256_loadu_ps(x + 40)));
        y6 = _mm256_add_ps(y6, _mm256_mul_ps(ps, _mm256_loadu_ps(x + 48)));
        y7 = _mm256_add_ps(y7, _mm256_mul_ps(ps, _mm256_loadu_ps(x + 56)));
    }
    _mm256_storeu_ps(out, y0), _mm256_storeu_ps(out + 8, y1), _mm256_storeu_ps(out + 16, y2);
    _mm256_storeu_ps(out + 24, y3), _mm256_storeu_ps(out + 32, y4), _mm256_storeu_ps(out + 40, y5);
    _mm256_storeu_ps(out + 48, y6), _mm256_storeu_ps(out + 56, y7);
}

/* The same for 8 elements. */
PRL_AVX2 static void wsum1(float *out, const float *p, const float *c, size_t ld, int n)
{
    __m256 y = _mm256_setzero_ps();
    for (int s = 0; s < n; s++)
        y = _mm256_add_ps(y,
                          _mm256_mul_ps(_mm256_set1_ps(p[s]), _mm256_loadu_ps(c + (size_t)s * ld)));
    _mm256_storeu_ps(out, y);
}

PRL_AVX2 static void wsum_avx2(float *out, const float *p, const float *c, int ld, int w, int n)
{
    int i = 0;
    for (; i + 64 <= w; i += 64) wsum8(out + i, p, c + i, (size_t)ld, n);
    for (; i + 8 <= w; i += 8) wsum1(out + i, p, c + i, (size_t)ld, n);
    for (; i < w; i++) {
        float y = 0;
        for (int s = 0; s < n; s++) y = y + p[s] * c[(size_t)s * ld + i];
        out[i] = y;
    }
}
#endif

int infer__absorbed_fast_ok(void)
{
#if defined(__x86_64__)
    return infer__gemv_fma && prl_row_kernels_avx2();
#else
    return 0;
#endif
}

void infer__absorbed_scores(float *S, int ldS, const float *q, int nh, const float *c, int lat,
                            int n)
{
#if defined(__x86_64__)
    if (infer__absorbed_fast_ok()) {
        scores_fma(S, ldS, q, nh, c, lat, n);
        return;
    }
#endif
    for (int j = 0; j < nh; j++)
        for (int s = 0; s < n; s += 4)
            infer__gemv_tile(q + (size_t)j * lat, lat, 1, c + (size_t)s * lat, lat,
                             n - s < 4 ? n - s : 4, lat, S + (size_t)j * ldS + s, 1);
}

void infer__absorbed_softmax(float *S, int n, float scale, float *mx, float *sum)
{
#if defined(__x86_64__)
    if (infer__absorbed_fast_ok()) {
        softmax_avx2(S, n, scale, mx, sum);
        return;
    }
#endif
    float m = -INFINITY, l = 0;
    for (int s = 0; s < n; s++) S[s] = scale * S[s], m = S[s] > m ? S[s] : m;
    for (int s = 0; s < n; s++) l += (S[s] = prl_expf(S[s] - m));
    float inv = 1 / l;
    for (int s = 0; s < n; s++) S[s] *= inv;
    *mx = m, *sum = l;
}

void infer__absorbed_wsum(float *out, const float *p, const float *c, int ld, int w, int n)
{
#if defined(__x86_64__)
    if (infer__absorbed_fast_ok()) {
        wsum_avx2(out, p, c, ld, w, n);
        return;
    }
#endif
    memset(out, 0, (size_t)w * sizeof *out);
    for (int s = 0; s < n; s++)
        for (int i = 0; i < w; i++) out[i] = out[i] + p[s] * c[(size_t)s * ld + i];
}
