/*
** gemm.c — prl's own single-precision GEMM: batch-invariant by construction.
**
** Why not OpenBLAS for float: measured here, OpenBLAS's sgemm gives a row of C different bits
** depending on where that row sits in the call and how many rows the call has (the edge and
** main kernels round differently). A sequence's log-probs would then depend on its batch, and
** the decode engine (one row per sequence per step) could never reproduce the train path
** (128-row blocks). This GEMM computes every element of C by the same sequence of operations,
** whatever M, N, the element's position or the thread count:
**
**     for each K block [kb, kb+KC):  acc = 0;  for k in order: acc = fma(a_ik, b_kj, acc)
**                                    c = alpha·acc + (first block ? beta·c : c)
**
** Block boundaries are multiples of PRL_GEMM_KC counted from k = 0, so trailing zero terms
** in A (a causal softmax row padded to its block) leave the result unchanged. Edge tiles are
** computed on zero-padded packed panels by the same micro-kernel, so they round like interior
** tiles. The micro-kernel uses AVX2+FMA when the CPU has them (chosen once at start-up) and a
** portable multiply-then-add kernel otherwise; prl_gemm_f32_ref is the naive triple loop with
** the same arithmetic, and the tests require bitwise equality with it.
**
** Structure (BLIS): loop over NC column blocks, KC depth blocks (pack B), MC row blocks (pack
** A), then MR×NR micro-tiles. Packing buffers are per thread and grow as needed.
*/
#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PRL_GEMM_X86 1
#endif

enum { MR = 6, NR = 16, KC = PRL_GEMM_KC, MC = 96, NC = 1024 };

/* ------------------------------------------------------------------ packing --------- */

/* Element (i, k) of op(A) and (k, j) of op(B) (the reference loop). */
static inline float a_at(int ta, const float *A, int lda, int i, int k)
{
    return ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
}

static inline float b_at(int tb, const float *B, int ldb, int k, int j)
{
    return tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
}

static int min_int(int a, int b) { return a < b ? a : b; }

/* Rows [i0, i0+mc) × depth [k0, k0+kc) of op(A) into MR-row micro-panels, each kc × MR
** (k-major); rows past M are zero. Each branch reads its source along memory order. The
** scalar reference of pack_a (the portable build runs it; the AVX2 build runs it for edge
** panels): a copy, so any faster form that puts the same floats in the same places gives the
** same GEMM bits. */
static void pack_a_panel_ref(float *dst, int ta, const float *A, int lda, int rows, int i, int k0,
                             int kc)
{
    if (rows < MR) memset(dst, 0, (size_t)kc * MR * sizeof *dst);
    if (ta) {
        for (int k = 0; k < kc; k++) {
            const float *src = A + (size_t)(k0 + k) * lda + i;
            for (int r = 0; r < rows; r++) dst[k * MR + r] = src[r];
        }
    } else if (rows == MR) { /* k outer: contiguous writes from six row streams */
        const float *src = A + (size_t)i * lda + k0;
        for (int k = 0; k < kc; k++)
            for (int r = 0; r < MR; r++) dst[k * MR + r] = src[(size_t)r * lda + k];
    } else {
        for (int r = 0; r < rows; r++) {
            const float *src = A + (size_t)(i + r) * lda + k0;
            for (int k = 0; k < kc; k++) dst[k * MR + r] = src[k];
        }
    }
}

/* Depth [k0, k0+kc) × columns [j, j+NR) of op(B) into one NR-column micro-panel, kc × NR
** (k-major); columns past `cols` are zero. The scalar reference of pack_b. */
static void pack_b_panel_ref(float *dst, int tb, const float *B, int ldb, int cols, int j, int k0,
                             int kc)
{
    if (cols < NR) memset(dst, 0, (size_t)kc * NR * sizeof *dst);
    if (tb) {
        for (int c = 0; c < cols; c++) {
            const float *src = B + (size_t)(j + c) * ldb + k0;
            for (int k = 0; k < kc; k++) dst[k * NR + c] = src[k];
        }
    } else {
        for (int k = 0; k < kc; k++)
            memcpy(dst + k * NR, B + (size_t)(k0 + k) * ldb + j, (size_t)cols * sizeof *dst);
    }
}

#ifdef PRL_GEMM_X86
/* The 8×8 transpose of r[0..8) in place (r[i] lane j → r[j] lane i). */
__attribute__((target("avx2"))) static inline void transpose8(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* The first MR (6) lanes of v to dst: 4 + 2 floats, never past dst + 6. */
__attribute__((target("avx2"))) static inline void store6(float *dst, __m256 v)
{
    _mm_storeu_ps(dst, _mm256_castps256_ps128(v));
    _mm_storel_pi((__m64 *)(dst + 4), _mm256_extractf128_ps(v, 1));
}

/* A full MR-row panel of row-major A (ta = 0), vectorised: the same floats as
** pack_a_panel_ref; eight k of six rows (plus two zero rows) transposed at a time. */
__attribute__((target("avx2"))) static void pack_a_panel_avx2(float *dst, const float *A, int lda,
                                                              int i, int k0, int kc)
{
    int k = 0;
    const float *src = A + (size_t)i * lda + k0;
    for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
        for (int q = 0; q < MR; q++) r[q] = _mm256_loadu_ps(src + (size_t)q * lda + k);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8(r);
        for (int q = 0; q < 8; q++) store6(dst + (k + q) * MR, r[q]);
    }
    for (; k < kc; k++)
        for (int q = 0; q < MR; q++) dst[k * MR + q] = src[(size_t)q * lda + k];
}

/* A full NR-column panel, vectorised: the same floats as pack_b_panel_ref. Transposed B
** (tb = 1, a weight [N, K]): 8 columns × 8 k transposed at a time; row-major B: two 8-float
** copies per k. */
__attribute__((target("avx2"))) static void pack_b_panel_avx2(float *dst, int tb, const float *B,
                                                              int ldb, int j, int k0, int kc)
{
    if (!tb) {
        for (int k = 0; k < kc; k++) {
            const float *src = B + (size_t)(k0 + k) * ldb + j;
            _mm256_storeu_ps(dst + k * NR, _mm256_loadu_ps(src));
            _mm256_storeu_ps(dst + k * NR + 8, _mm256_loadu_ps(src + 8));
        }
        return;
    }
    for (int h = 0; h < NR; h += 8) {
        const float *src = B + (size_t)(j + h) * ldb + k0;
        int k = 0;
        for (; k + 8 <= kc; k += 8) {
            __m256 r[8];
            for (int c = 0; c < 8; c++) r[c] = _mm256_loadu_ps(src + (size_t)c * ldb + k);
            transpose8(r);
            for (int q = 0; q < 8; q++) _mm256_storeu_ps(dst + (k + q) * NR + h, r[q]);
        }
        for (; k < kc; k++)
            for (int c = 0; c < 8; c++) dst[k * NR + h + c] = src[(size_t)c * ldb + k];
    }
}
#endif

static int pack_fast; /* the AVX2 packers (chosen with the kernel) */

#ifdef PRL_GEMM_X86
/* `panels` full panels of transposed A (ta = 1) from row i, k outer: each source row k is
** read once, contiguously, for all panels (a panel at a time would walk every k row, lda
** apart, once per panel: a cache and TLB miss each time for a wide A). */
__attribute__((target("avx2"))) static void pack_a_trans_avx2(float *dst, const float *A, int lda,
                                                              int i, int panels, int k0, int kc)
{
    for (int k = 0; k < kc; k++) {
        const float *src = A + (size_t)(k0 + k) * lda + i;
        for (int p = 0; p < panels; p++) {
            float *d = dst + (size_t)p * kc * MR + k * MR;
            _mm_storeu_ps(d, _mm_loadu_ps(src + p * MR));
            _mm_storel_pi((__m64 *)(d + 4),
                          _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(src + p * MR + 4)));
        }
    }
}
#endif

static void pack_a(float *dst, int ta, const float *A, int lda, int M, int i0, int mc, int k0,
                   int kc)
{
    int ir = 0;
#ifdef PRL_GEMM_X86
    if (pack_fast && ta) {
        int panels = min_int(mc, M - i0) / MR;
        pack_a_trans_avx2(dst, A, lda, i0, panels, k0, kc);
        ir = panels * MR, dst += (size_t)panels * kc * MR;
    }
#endif
    for (; ir < mc; ir += MR, dst += (size_t)kc * MR) {
        int rows = min_int(MR, M - (i0 + ir));
#ifdef PRL_GEMM_X86
        if (pack_fast && !ta && rows == MR) {
            pack_a_panel_avx2(dst, A, lda, i0 + ir, k0, kc);
            continue;
        }
#endif
        pack_a_panel_ref(dst, ta, A, lda, rows, i0 + ir, k0, kc);
    }
}

/* Depth [k0, k0+kc) × columns [j0, j0+nc) of op(B) into NR-column micro-panels, each kc × NR
** (k-major); columns past N are zero. */
static void pack_b(float *dst, int tb, const float *B, int ldb, int N, int j0, int nc, int k0,
                   int kc)
{
    for (int jr = 0; jr < nc; jr += NR, dst += (size_t)kc * NR) {
        int cols = min_int(NR, N - (j0 + jr));
#ifdef PRL_GEMM_X86
        if (pack_fast && cols == NR) {
            pack_b_panel_avx2(dst, tb, B, ldb, j0 + jr, k0, kc);
            continue;
        }
#endif
        pack_b_panel_ref(dst, tb, B, ldb, cols, j0 + jr, k0, kc);
    }
}

/* ------------------------------------------------------------------ micro-kernels --- */

/* The epilogue both kernels and the reference share: c = alpha·acc + (first ? beta·c : c);
** beta = 0 never reads c (it may hold garbage). */
static inline float epilogue(float acc, float alpha, float beta, int first, float c)
{
    float t = alpha * acc;
    if (!first) return t + c;
    return beta == 0.0f ? t : t + beta * c;
}

/* acc[MR][NR] = Σ_k ap[k][r]·bp[k][c], then written through the epilogue into the valid
** mr × nr corner of C. */
typedef void (*micro_kernel_fn)(int kc, const float *ap, const float *bp, float *C, int ldc, int mr,
                                int nr, float alpha, float beta, int first);

static void store_tile(const float *acc, float *C, int ldc, int mr, int nr, float alpha, float beta,
                       int first)
{
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) {
            float *p = &C[(size_t)r * ldc + c];
            *p = epilogue(acc[r * NR + c], alpha, beta, first, first && beta == 0.0f ? 0.0f : *p);
        }
}

/* Portable kernel: multiply then add (no FMA contraction: C11 mode keeps them separate). */
static void kernel_generic(int kc, const float *ap, const float *bp, float *C, int ldc, int mr,
                           int nr, float alpha, float beta, int first)
{
    float acc[MR * NR] = {0};
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < MR; r++) {
            float a = ap[k * MR + r];
            for (int c = 0; c < NR; c++) acc[r * NR + c] = acc[r * NR + c] + a * bp[k * NR + c];
        }
    store_tile(acc, C, ldc, mr, nr, alpha, beta, first);
}

#ifdef PRL_GEMM_X86
__attribute__((target("avx2,fma"))) static void kernel_avx2(int kc, const float *ap,
                                                            const float *bp, float *C, int ldc,
                                                            int mr, int nr, float alpha, float beta,
                                                            int first)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp + k * NR), b1 = _mm256_loadu_ps(bp + k * NR + 8);
        const float *a = ap + k * MR;
        __m256 a0 = _mm256_broadcast_ss(a + 0), a1 = _mm256_broadcast_ss(a + 1);
        c00 = _mm256_fmadd_ps(a0, b0, c00), c01 = _mm256_fmadd_ps(a0, b1, c01);
        c10 = _mm256_fmadd_ps(a1, b0, c10), c11 = _mm256_fmadd_ps(a1, b1, c11);
        __m256 a2 = _mm256_broadcast_ss(a + 2), a3 = _mm256_broadcast_ss(a + 3);
        c20 = _mm256_fmadd_ps(a2, b0, c20), c21 = _mm256_fmadd_ps(a2, b1, c21);
        c30 = _mm256_fmadd_ps(a3, b0, c30), c31 = _mm256_fmadd_ps(a3, b1, c31);
        __m256 a4 = _mm256_broadcast_ss(a + 4), a5 = _mm256_broadcast_ss(a + 5);
        c40 = _mm256_fmadd_ps(a4, b0, c40), c41 = _mm256_fmadd_ps(a4, b1, c41);
        c50 = _mm256_fmadd_ps(a5, b0, c50), c51 = _mm256_fmadd_ps(a5, b1, c51);
    }
    float acc[MR * NR] __attribute__((aligned(32)));
    _mm256_store_ps(acc + 0, c00), _mm256_store_ps(acc + 8, c01);
    _mm256_store_ps(acc + 16, c10), _mm256_store_ps(acc + 24, c11);
    _mm256_store_ps(acc + 32, c20), _mm256_store_ps(acc + 40, c21);
    _mm256_store_ps(acc + 48, c30), _mm256_store_ps(acc + 56, c31);
    _mm256_store_ps(acc + 64, c40), _mm256_store_ps(acc + 72, c41);
    _mm256_store_ps(acc + 80, c50), _mm256_store_ps(acc + 88, c51);
    if (mr == MR && nr == NR) {
        /* full tile: the epilogue in vector form (same operations per element) */
        __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
        for (int r = 0; r < MR; r++)
            for (int h = 0; h < 2; h++) {
                float *p = C + (size_t)r * ldc + 8 * h;
                __m256 t = _mm256_mul_ps(va, _mm256_load_ps(acc + r * NR + 8 * h));
                if (!first) t = _mm256_add_ps(t, _mm256_loadu_ps(p));
                else if (beta != 0.0f) t = _mm256_add_ps(t, _mm256_mul_ps(vb, _mm256_loadu_ps(p)));
                _mm256_storeu_ps(p, t);
            }
        return;
    }
    store_tile(acc, C, ldc, mr, nr, alpha, beta, first);
}
#endif

#ifdef PRL_GEMM_X86
/* A single row of A against up to 4 B panels (64 columns): the decode case (M = 1), where the
** 6-row kernel would spend 5/6 of its work on padding. Each element is the same FMA chain in k
** order as in kernel_avx2 and goes through the same epilogue, so the bits are the same; four
** panels give 8 independent chains to hide the FMA latency. Panels past `np` repeat panel 0
** (computed, never stored). */
__attribute__((target("avx2,fma"))) static void kernel_row_avx2(int kc, const float *ap,
                                                                const float *bp, size_t bs, int np,
                                                                int last_nr, float *C, float alpha,
                                                                float beta, int first)
{
    const float *b[4];
    for (int p = 0; p < 4; p++) b[p] = bp + (size_t)(p < np ? p : 0) * bs;
    __m256 c[8];
    for (int i = 0; i < 8; i++) c[i] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 a = _mm256_broadcast_ss(ap + k * MR);
        c[0] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b[0] + k * NR), c[0]);
        c[1] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b[0] + k * NR + 8), c[1]);
        c[2] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b[1] + k * NR), c[2]);
        c[3] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b[1] + k * NR + 8), c[3]);
        c[4] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b[2] + k * NR), c[4]);
        c[5] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b[2] + k * NR + 8), c[5]);
        c[6] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b[3] + k * NR), c[6]);
        c[7] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b[3] + k * NR + 8), c[7]);
    }
    for (int p = 0; p < np; p++) {
        float acc[NR];
        _mm256_storeu_ps(acc, c[2 * p]);
        _mm256_storeu_ps(acc + 8, c[2 * p + 1]);
        int nr = p == np - 1 ? last_nr : NR;
        for (int j = 0; j < nr; j++) {
            float *q = C + p * NR + j;
            *q = epilogue(acc[j], alpha, beta, first, first && beta == 0.0f ? 0.0f : *q);
        }
    }
}
#endif

#ifdef PRL_GEMM_X86
/* The tile of a small-rows kernel, acc[r][c] over `np` panels, through the epilogue into C. */
static void store_rows(const float *acc, int rows, int np, int last_nr, float *C, int ldc,
                       float alpha, float beta, int first)
{
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < np; p++) {
            int nr = p == np - 1 ? last_nr : NR;
            for (int j = 0; j < nr; j++) {
                float *q = C + (size_t)r * ldc + p * NR + j;
                float v = acc[(r * 3 + p) * NR + j];
                *q = epilogue(v, alpha, beta, first, first && beta == 0.0f ? 0.0f : *q);
            }
        }
}

/* Two or three rows of A against up to 3 / 2 B panels, 12 accumulators: a speculative verify
** (D + 1 rows), an MTP draft over a few positions, small-batch decode. The row kernel once per
** row streams B per row (8 loads per 8 FMAs), and the 6-row kernel spends 12 FMAs per 16
** columns whatever the rows; here each B vector loaded serves every row. Each element is the
** same FMA chain in k order as kernel_avx2, through the same epilogue: the same bits. Panels
** past `np` repeat panel 0 (computed, never stored). */
__attribute__((target("avx2,fma"))) static void kernel_rows2_avx2(int kc, const float *ap,
                                                                  const float *bp, size_t bs,
                                                                  int np, int last_nr, float *C,
                                                                  int ldc, float alpha, float beta,
                                                                  int first)
{
    const float *b0 = bp, *b1 = bp + (size_t)(np > 1) * bs, *b2 = bp + (size_t)(np > 2) * 2 * bs;
    __m256 z = _mm256_setzero_ps();
    __m256 c00 = z, c01 = z, c02 = z, c03 = z, c04 = z, c05 = z;
    __m256 c10 = z, c11 = z, c12 = z, c13 = z, c14 = z, c15 = z;
    for (int k = 0; k < kc; k++) {
        __m256 x0 = _mm256_loadu_ps(b0 + k * NR), x1 = _mm256_loadu_ps(b0 + k * NR + 8);
        __m256 x2 = _mm256_loadu_ps(b1 + k * NR), x3 = _mm256_loadu_ps(b1 + k * NR + 8);
        __m256 a0 = _mm256_broadcast_ss(ap + k * MR), a1 = _mm256_broadcast_ss(ap + k * MR + 1);
        c00 = _mm256_fmadd_ps(a0, x0, c00), c01 = _mm256_fmadd_ps(a0, x1, c01);
        c02 = _mm256_fmadd_ps(a0, x2, c02), c03 = _mm256_fmadd_ps(a0, x3, c03);
        c10 = _mm256_fmadd_ps(a1, x0, c10), c11 = _mm256_fmadd_ps(a1, x1, c11);
        c12 = _mm256_fmadd_ps(a1, x2, c12), c13 = _mm256_fmadd_ps(a1, x3, c13);
        x0 = _mm256_loadu_ps(b2 + k * NR), x1 = _mm256_loadu_ps(b2 + k * NR + 8);
        c04 = _mm256_fmadd_ps(a0, x0, c04), c05 = _mm256_fmadd_ps(a0, x1, c05);
        c14 = _mm256_fmadd_ps(a1, x0, c14), c15 = _mm256_fmadd_ps(a1, x1, c15);
    }
    float acc[2 * 3 * NR];
    __m256 all[12] = {c00, c01, c02, c03, c04, c05, c10, c11, c12, c13, c14, c15};
    for (int i = 0; i < 12; i++) _mm256_storeu_ps(acc + 8 * i, all[i]);
    store_rows(acc, 2, np, last_nr, C, ldc, alpha, beta, first);
}

__attribute__((target("avx2,fma"))) static void kernel_rows3_avx2(int kc, const float *ap,
                                                                  const float *bp, size_t bs,
                                                                  int np, int last_nr, float *C,
                                                                  int ldc, float alpha, float beta,
                                                                  int first)
{
    const float *b0 = bp, *b1 = bp + (size_t)(np > 1) * bs;
    __m256 z = _mm256_setzero_ps();
    __m256 c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z;
    __m256 c20 = z, c21 = z, c22 = z, c23 = z;
    for (int k = 0; k < kc; k++) {
        __m256 x0 = _mm256_loadu_ps(b0 + k * NR), x1 = _mm256_loadu_ps(b0 + k * NR + 8);
        __m256 x2 = _mm256_loadu_ps(b1 + k * NR), x3 = _mm256_loadu_ps(b1 + k * NR + 8);
        __m256 a = _mm256_broadcast_ss(ap + k * MR);
        c00 = _mm256_fmadd_ps(a, x0, c00), c01 = _mm256_fmadd_ps(a, x1, c01);
        c02 = _mm256_fmadd_ps(a, x2, c02), c03 = _mm256_fmadd_ps(a, x3, c03);
        a = _mm256_broadcast_ss(ap + k * MR + 1);
        c10 = _mm256_fmadd_ps(a, x0, c10), c11 = _mm256_fmadd_ps(a, x1, c11);
        c12 = _mm256_fmadd_ps(a, x2, c12), c13 = _mm256_fmadd_ps(a, x3, c13);
        a = _mm256_broadcast_ss(ap + k * MR + 2);
        c20 = _mm256_fmadd_ps(a, x0, c20), c21 = _mm256_fmadd_ps(a, x1, c21);
        c22 = _mm256_fmadd_ps(a, x2, c22), c23 = _mm256_fmadd_ps(a, x3, c23);
    }
    /* store_rows reads 3 panels per row: the third stays unused (np <= 2) */
    float acc[3 * 3 * NR];
    __m256 all[12] = {c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23};
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(acc + r * 3 * NR + 8 * i, all[r * 4 + i]);
    store_rows(acc, 3, np, last_nr, C, ldc, alpha, beta, first);
}
#endif

static micro_kernel_fn kernel;
static int kernel_has_fma;

static void choose_kernel(void)
{
    if (kernel) return;
#ifdef PRL_GEMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        kernel_has_fma = 1;
        pack_fast = 1;
        kernel = kernel_avx2;
        return;
    }
#endif
    kernel = kernel_generic;
}

const char *prl_gemm_kernel_name(void)
{
    choose_kernel();
    return kernel_has_fma ? "avx2-fma 6x16" : "generic 6x16";
}

int prl_gemm_fma(void)
{
    choose_kernel();
    return kernel_has_fma;
}

static int row_kernels_off;

int prl_row_kernels_avx2(void)
{
#ifdef PRL_GEMM_X86
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx2");
    }
    return has && !row_kernels_off;
#else
    return 0;
#endif
}

int prl_row_kernels_avx2_set(int on)
{
    int was = prl_row_kernels_avx2();
    row_kernels_off = !on;
    return was;
}

/* ------------------------------------------------------------------ driver ---------- */

/* Per-thread packing buffers (each pool task calls GEMMs on its own thread). */
static _Thread_local float *tl_a, *tl_b;
static _Thread_local size_t tl_a_len, tl_b_len;

static float *grow(float **buf, size_t *len, size_t want)
{
    if (*len < want) {
        free(*buf);
        *buf = aligned_alloc(64, (want * sizeof(float) + 63) & ~(size_t)63);
        PRL_ASSERT(*buf != NULL);
        *len = want;
    }
    return *buf;
}

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

#ifdef PRL_GEMM_X86
/* rows (1..3) rows of C at C[0, j0..] over the packed A panel ap (rows beyond `rows` unused)
** and the packed B block: the row kernel for one row, the 2- and 3-row kernels otherwise
** (for 2 or 3 rows the 6-row kernel would spend 2/3 or 1/2 of its FMAs on padding). */
static void small_rows_block(int rows, int kc, const float *ap, const float *bp, size_t bs, int j0,
                             int nc, int N, float alpha, float beta, int first, float *C, int ldc)
{
    int width = (rows == 1 ? 4 : rows == 3 ? 2 : 3) * NR; /* 8 or 12 accumulators */
    for (int jr = 0; jr < nc; jr += width) {
        int cols = nc - jr < width ? nc - jr : width, np = (cols + NR - 1) / NR;
        int last_nr = min_int(NR, N - (j0 + jr + (np - 1) * NR));
        const float *bpan = bp + (size_t)(jr / NR) * bs;
        float *c = C + j0 + jr;
        if (rows == 1) kernel_row_avx2(kc, ap, bpan, bs, np, last_nr, c, alpha, beta, first);
        else if (rows == 3)
            kernel_rows3_avx2(kc, ap, bpan, bs, np, last_nr, c, ldc, alpha, beta, first);
        else kernel_rows2_avx2(kc, ap, bpan, bs, np, last_nr, c, ldc, alpha, beta, first);
    }
}
#endif

/* C[i0.., j0..] over one packed B block (kc × nc in NR panels, bs floats apart: kc·NR, or more
** when the kc rows are the start of a deeper pre-packed block). Full 6-row panels go to the
** micro-kernel; a last panel of 1–3 rows to the small-rows kernels (same bits), one of 4–5
** rows to the micro-kernel (about as fast). */
static void macro_block(int ta, const float *A, int lda, int M, int k0, int kc, const float *bp,
                        size_t bs, int j0, int nc, int N, float alpha, float beta, int first,
                        float *C, int ldc)
{
    float *ap = grow(&tl_a, &tl_a_len, (size_t)MC * kc);
    for (int i0 = 0; i0 < M; i0 += MC) {
        int mc = M - i0 < MC ? M - i0 : MC, main_rows = mc;
        pack_a(ap, ta, A, lda, M, i0, round_up(mc, MR), k0, kc);
#ifdef PRL_GEMM_X86
        if (kernel_has_fma && mc % MR > 0 && mc % MR <= 3) {
            main_rows = mc - mc % MR;
            small_rows_block(mc % MR, kc, ap + (size_t)(main_rows / MR) * kc * MR, bp, bs, j0, nc,
                             N, alpha, beta, first, C + (size_t)(i0 + main_rows) * ldc, ldc);
        }
#endif
        for (int jr = 0; jr < nc; jr += NR) {
            int nr = N - (j0 + jr) < NR ? N - (j0 + jr) : NR;
            const float *bpan = bp + (size_t)(jr / NR) * bs;
            for (int ir = 0; ir < main_rows; ir += MR) {
                int mr = main_rows - ir < MR ? main_rows - ir : MR;
                kernel(kc, ap + (size_t)(ir / MR) * kc * MR, bpan,
                       C + (size_t)(i0 + ir) * ldc + j0 + jr, ldc, mr, nr, alpha, beta, first);
            }
        }
    }
}

static void scale_c(float *C, int ldc, int M, int N, float beta)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float *p = &C[(size_t)i * ldc + j];
            *p = beta == 0.0f ? 0.0f : beta * *p;
        }
}

void prl_gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    /* op(A) is M×K, op(B) is K×N, C is M×N, all row-major with the given row strides */
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty sum: C = beta·C, as BLAS defines it */
        scale_c(C, ldc, M, N, beta);
        return;
    }
    choose_kernel();
    for (int j0 = 0; j0 < N; j0 += NC) {
        int nc = N - j0 < NC ? N - j0 : NC;
        for (int k0 = 0; k0 < K; k0 += KC) {
            int kc = K - k0 < KC ? K - k0 : KC;
            float *bp = grow(&tl_b, &tl_b_len, (size_t)round_up(nc, NR) * kc);
            pack_b(bp, trans_b, B, ldb, N, j0, round_up(nc, NR), k0, kc);
            macro_block(trans_a, A, lda, M, k0, kc, bp, (size_t)kc * NR, j0, nc, N, alpha, beta,
                        k0 == 0, C, ldc);
        }
    }
}

/* ------------------------------------------------------------------ pre-packed B ---- */

/* Layout: for each K block (in order), the NR-column panels of all N columns, kc × NR each.
** Panel (kb, p) starts at kb·KC·Npad + p·kc·NR where Npad = N rounded up to NR. A pack is
** cut into tasks of one K block × PACK_PANELS panels (a copy: the split changes no bit). */
enum { PACK_PANELS = 16 };

typedef struct pack_ctx {
    const prl_packed_b *pb;
    int trans_b, ldb, col_tasks;
    const float *B;
} pack_ctx;

static void pack_task(void *p, int t)
{
    const pack_ctx *c = p;
    int npad = round_up(c->pb->N, NR), k0 = t / c->col_tasks * KC;
    int j0 = t % c->col_tasks * PACK_PANELS * NR, kc = min_int(KC, c->pb->K - k0);
    pack_b(c->pb->data + (size_t)k0 * npad + (size_t)j0 * kc, c->trans_b, c->B, c->ldb, c->pb->N,
           j0, min_int(PACK_PANELS * NR, npad - j0), k0, kc);
}

/* Storage for op(B) [K, N] in pb (grown when too small), its shape set; the pack's task
** split as pack_ctx wants it. */
static prl_status packed_b_reserve(prl_packed_b *pb, int K, int N)
{
    if (K <= 0 || N <= 0) return prl_error_set(PRL_ERR_ARG, "packed matrix %d x %d is empty", K, N);
    size_t need = (size_t)K * round_up(N, NR);
    if (pb->cap < need) {
        free(pb->data);
        pb->data = aligned_alloc(64, (need * sizeof(float) + 63) & ~(size_t)63);
        pb->cap = pb->data ? need : 0;
        if (!pb->data) return prl_error_set(PRL_ERR_NOMEM, "packed matrix %d x %d", K, N);
    }
    pb->K = K, pb->N = N;
    choose_kernel();
    return PRL_OK;
}

/* Pack op(B) into pb: on the pool (serial = 0) or on the calling thread (serial = 1, from
** inside a pool task). The same floats in the same places either way. */
static prl_status packed_b_fill(prl_packed_b *pb, int trans_b, int K, int N, const float *B,
                                int ldb, int serial)
{
    prl_status rc = packed_b_reserve(pb, K, N);
    if (rc) return rc;
    int col_tasks = (round_up(N, NR) / NR + PACK_PANELS - 1) / PACK_PANELS;
    int tasks = (K + KC - 1) / KC * col_tasks;
    pack_ctx c = {.pb = pb, .trans_b = trans_b, .ldb = ldb, .col_tasks = col_tasks, .B = B};
    if (!serial) prl_parallel_for(tasks, pack_task, &c);
    else
        for (int t = 0; t < tasks; t++) pack_task(&c, t);
    return PRL_OK;
}

prl_status prl_packed_b_repack(prl_packed_b *pb, int trans_b, int K, int N, const float *B, int ldb)
{
    return packed_b_fill(pb, trans_b, K, N, B, ldb, 0);
}

prl_status prl_packed_b_repack_here(prl_packed_b *pb, int trans_b, int K, int N, const float *B,
                                    int ldb)
{
    return packed_b_fill(pb, trans_b, K, N, B, ldb, 1);
}

prl_status prl_packed_b_init(prl_packed_b *pb, int trans_b, int K, int N, const float *B, int ldb)
{
    memset(pb, 0, sizeof *pb);
    return prl_packed_b_repack(pb, trans_b, K, N, B, ldb);
}

void prl_packed_b_free(prl_packed_b *pb)
{
    free(pb->data);
    memset(pb, 0, sizeof *pb);
}

void prl_gemm_f32_packed_rows(int trans_a, int M, int k_begin, int K, int col0, int ncols,
                              float alpha, const float *A, int lda, const prl_packed_b *pb,
                              float beta, float *C, int ldc)
{
    /* C[M, col0 : col0+ncols] = alpha·op(A)[M, K]·B[k_begin : k_begin+K, cols] + beta·C. The
    ** depth blocks are the pack's own (KC deep from row 0), so k_begin must start one; the
    ** GEMM's block k0 reads the first kc rows of the pack's block k_begin + k0, whose panels
    ** are that block's full depth apart. */
    PRL_ASSERT(col0 % NR == 0 && col0 >= 0 && col0 + ncols <= pb->N);
    PRL_ASSERT(k_begin % KC == 0 && k_begin >= 0 && k_begin + K <= pb->K);
    if (M <= 0 || ncols <= 0) return;
    if (K <= 0) {
        scale_c(C + col0, ldc, M, ncols, beta);
        return;
    }
    choose_kernel();
    int end = col0 + ncols, npad = round_up(pb->N, NR);
    for (int j0 = col0; j0 < end; j0 += NC) {
        int nc = end - j0 < NC ? end - j0 : NC;
        for (int k0 = 0; k0 < K; k0 += KC) {
            int kc = K - k0 < KC ? K - k0 : KC, kb = k_begin + k0;
            int depth = pb->K - kb < KC ? pb->K - kb : KC; /* the pack's block */
            const float *bp = pb->data + (size_t)kb * npad + (size_t)j0 * depth;
            macro_block(trans_a, A, lda, M, k0, kc, bp, (size_t)depth * NR, j0, nc, end, alpha,
                        beta, k0 == 0, C, ldc);
        }
    }
}

void prl_gemm_f32_packed(int trans_a, int M, int col0, int ncols, float alpha, const float *A,
                         int lda, const prl_packed_b *pb, float beta, float *C, int ldc)
{
    prl_gemm_f32_packed_rows(trans_a, M, 0, pb->K, col0, ncols, alpha, A, lda, pb, beta, C, ldc);
}

/* ------------------------------------------------------------------ reference ------- */

void prl_gemm_f32_ref(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    choose_kernel();
    if (K <= 0) {
        scale_c(C, ldc, M, N, beta);
        return;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float *p = &C[(size_t)i * ldc + j];
            for (int k0 = 0; k0 < K; k0 += KC) {
                int k1 = K - k0 < KC ? K : k0 + KC;
                float acc = 0.0f;
                for (int k = k0; k < k1; k++) {
                    float a = a_at(trans_a, A, lda, i, k), b = b_at(trans_b, B, ldb, k, j);
                    acc = kernel_has_fma ? fmaf(a, b, acc) : acc + a * b;
                }
                int first = k0 == 0;
                *p = epilogue(acc, alpha, beta, first, first && beta == 0.0f ? 0.0f : *p);
            }
        }
}
