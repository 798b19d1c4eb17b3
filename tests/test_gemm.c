/*
** test_gemm.c — prl's float GEMM (engine/gemm.c): bitwise equal to its naive reference for
** every transpose combination, alpha/beta case and edge shape; batch-invariant (a row's or
** column's bits never depend on its position or on the size of the call); trailing zero
** terms leave results unchanged; the pre-packed form equals the plain one; close to OpenBLAS.
*/
#include "engine/engine.h"
#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float *random_matrix(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x);
    prl_rng r;
    prl_rng_init(&r, seed, n, 0, 0, PRL_RNG_TEST);
    for (size_t i = 0; i < n; i++) x[i] = (float)prl_rng_normal(&r);
    return x;
}

/* Shapes that cross every tile edge: MR = 6, NR = 16, MC = 96, KC = 256; 1, 2 and 3 rows take
** the small-rows kernels (the row kernel, 2 rows × 3 panels, 3 rows × 2 panels), alone or
** after full panels (7, 8, 33, 97, 128), 4 and 5 leftover rows the 6-row one (17, 130). */
static const int sizes[] = {1, 2, 3, 5, 6, 7, 8, 17, 33, 97, 128, 130};
enum { N_SIZES = sizeof sizes / sizeof *sizes };
static const int depths[] = {1, 3, 16, 255, 256, 257, 600};

START_TEST(test_matches_reference_bitwise)
{
    const float alphas[] = {1.0f, 0.37f}, betas[] = {0.0f, 1.0f, -0.5f};
    int checked = 0;
    for (int mi = 0; mi < N_SIZES; mi++)
        for (int ni = 0; ni < N_SIZES; ni += 3)
            for (int ki = 0; ki < 7; ki++)
                for (int t = 0; t < 4; t++) {
                    int M = sizes[mi], N = sizes[ni], K = depths[ki], ta = t & 1, tb = t >> 1;
                    float *A = random_matrix((size_t)M * K, 1),
                          *B = random_matrix((size_t)K * N, 2);
                    float *C0 = random_matrix((size_t)M * N, 3);
                    float *C1 = malloc((size_t)M * N * sizeof *C1),
                          *C2 = malloc((size_t)M * N * sizeof *C2);
                    int ai = (M + N + K) % 2, bi = (M + K) % 3;
                    if (betas[bi] == 0.0f) /* beta = 0 must not read C: poison it */
                        for (int i = 0; i < M * N; i++) C0[i] = NAN;
                    memcpy(C1, C0, (size_t)M * N * sizeof *C1);
                    memcpy(C2, C0, (size_t)M * N * sizeof *C2);
                    prl_gemm_f32(ta, tb, M, N, K, alphas[ai], A, ta ? M : K, B, tb ? K : N,
                                 betas[bi], C1, N);
                    prl_gemm_f32_ref(ta, tb, M, N, K, alphas[ai], A, ta ? M : K, B, tb ? K : N,
                                     betas[bi], C2, N);
                    ck_assert_msg(!memcmp(C1, C2, (size_t)M * N * sizeof *C1),
                                  "M %d N %d K %d ta %d tb %d: differs from the reference", M, N, K,
                                  ta, tb);
                    checked++;
                    free(A), free(B), free(C0), free(C1), free(C2);
                }
    ck_assert_int_eq(checked, N_SIZES * ((N_SIZES + 2) / 3) * 7 * 4);
}
END_TEST

/* Every row of a 130-row product, recomputed alone or in a small call at another offset, and
** every column recomputed in a narrower call, has the same bits. */
START_TEST(test_batch_invariance)
{
    for (int ki = 0; ki < 7; ki++) {
        int M = 130, N = 70, K = depths[ki];
        float *A = random_matrix((size_t)M * K, 4), *W = random_matrix((size_t)N * K, 5);
        float *C = malloc((size_t)M * N * sizeof *C), *D = malloc((size_t)M * N * sizeof *D);
        prl_gemm_f32(0, 1, M, N, K, 1, A, K, W, K, 0, C, N);
        for (int off = 0; off < 20; off++)
            for (int rows = 1; rows <= 16 && off + rows <= M; rows += 5) {
                prl_gemm_f32(0, 1, rows, N, K, 1, A + (size_t)off * K, K, W, K, 0, D, N);
                ck_assert_msg(!memcmp(D, C + (size_t)off * N, (size_t)rows * N * sizeof *D),
                              "K %d: rows %d..%d differ when computed in a call of %d rows", K, off,
                              off + rows - 1, rows);
            }
        for (int col = 0; col < N; col += 7) { /* columns [col, col+3) alone */
            int cols = col + 3 <= N ? 3 : N - col;
            prl_gemm_f32(0, 1, M, cols, K, 1, A, K, W + (size_t)col * K, K, 0, D, cols);
            for (int i = 0; i < M; i++)
                ck_assert_msg(!memcmp(D + (size_t)i * cols, C + (size_t)i * N + col,
                                      (size_t)cols * sizeof *D),
                              "K %d: row %d columns %d.. differ in a narrower call", K, i, col);
        }
        free(A), free(W), free(C), free(D);
    }
}
END_TEST

/* p[1, K]·V[K, dv] with p zero past `len`: the same bits for K = len and any longer K (the
** causal softmax row of the train path is padded to its query block; decode stops at len). */
START_TEST(test_trailing_zeros)
{
    enum { DV = 24, KMAX = 700 };
    float *V = random_matrix((size_t)KMAX * DV, 6), *p = random_matrix(KMAX, 7);
    float a[DV], b[DV];
    for (int len = 1; len < 600; len += 37) {
        float *q = calloc(KMAX, sizeof *q);
        memcpy(q, p, (size_t)len * sizeof *q);
        prl_gemm_f32(0, 0, 1, DV, len, 1, q, KMAX, V, DV, 0, a, DV);
        for (int K = len + 1; K <= KMAX; K += 61) {
            prl_gemm_f32(0, 0, 1, DV, K, 1, q, KMAX, V, DV, 0, b, DV);
            ck_assert_msg(!memcmp(a, b, sizeof a), "len %d padded to %d differs", len, K);
        }
        free(q);
    }
    free(V), free(p);
}
END_TEST

/* Each case packs into a fresh prl_packed_b (init) and into one reused across the cases
** (repack: its storage grows and shrinks, as a matmul's shared weight buffer does). */
START_TEST(test_packed_equals_plain)
{
    prl_packed_b reused = {0};
    for (int ki = 0; ki < 7; ki++)
        for (int tb = 0; tb < 2; tb++) {
            int M = 37, N = 1100, K = depths[ki]; /* N crosses the NC = 1024 column block */
            float *A = random_matrix((size_t)M * K, 8), *B = random_matrix((size_t)N * K, 9);
            float *C1 = random_matrix((size_t)M * N, 10), *C2 = malloc((size_t)M * N * sizeof *C2);
            memcpy(C2, C1, (size_t)M * N * sizeof *C2);
            prl_packed_b pb;
            ck_assert_int_eq(prl_packed_b_init(&pb, tb, K, N, B, tb ? K : N), PRL_OK);
            prl_gemm_f32(0, tb, M, N, K, 0.5f, A, K, B, tb ? K : N, 1, C1, N);
            prl_gemm_f32_packed(0, M, 0, 512, 0.5f, A, K, &pb, 1, C2, N); /* in two column ranges */
            prl_gemm_f32_packed(0, M, 512, N - 512, 0.5f, A, K, &pb, 1, C2, N);
            ck_assert_msg(!memcmp(C1, C2, (size_t)M * N * sizeof *C1), "K %d tb %d: packed differs",
                          K, tb);
            ck_assert_int_eq(prl_packed_b_repack(&reused, tb, K, N, B, tb ? K : N), PRL_OK);
            memcpy(C2, C1, (size_t)M * N * sizeof *C2);
            prl_gemm_f32_packed(0, M, 0, 512, 0.5f, A, K, &pb, 1, C1, N);
            prl_gemm_f32_packed(0, M, 512, N - 512, 0.5f, A, K, &pb, 1, C1, N);
            prl_gemm_f32_packed(0, M, 0, N, 0.5f, A, K, &reused, 1, C2, N);
            ck_assert_msg(!memcmp(C1, C2, (size_t)M * N * sizeof *C1),
                          "K %d tb %d: repacked differs", K, tb);
            prl_packed_b_free(&pb);
            free(A), free(B), free(C1), free(C2);
        }
    prl_packed_b_free(&reused);
}
END_TEST

/* A matrix packed once, read over its leading depth rows from a KC block start and over a
** column range (prl_gemm_f32_packed_rows: the attention's keys packed once per head for all
** query blocks), equals prl_gemm_f32 (and its reference) on that sub-matrix; the pack made on
** the calling thread equals the pooled one. Every row count takes each kernel (1..3 rows,
** 4-5, full panels), trans_a both ways. */
START_TEST(test_packed_rows_equal_plain)
{
    enum { KP = 600, NP = 70 };
    float *B = random_matrix((size_t)KP * NP, 21);
    for (int tb = 0; tb < 2; tb++) {
        prl_packed_b pb = {0}, here = {0};
        ck_assert_int_eq(prl_packed_b_repack(&pb, tb, KP, NP, B, tb ? KP : NP), PRL_OK);
        ck_assert_int_eq(prl_packed_b_repack_here(&here, tb, KP, NP, B, tb ? KP : NP), PRL_OK);
        ck_assert_msg(!memcmp(pb.data, here.data, (size_t)KP * 80 * sizeof *pb.data),
                      "tb %d: the pack on the calling thread differs", tb);
        const int kb[] = {0, 256, 512}, ks[] = {1, 17, 64, 255, 256, 344};
        for (int bi = 0; bi < 3; bi++)
            for (int ki = 0; ki < 6; ki++)
                for (int ta = 0; ta < 2; ta++) {
                    int k0 = kb[bi], K = ks[ki] < KP - k0 ? ks[ki] : KP - k0, c0 = 16, nc = 51;
                    for (int mi = 0; mi < N_SIZES; mi++) {
                        int M = sizes[mi];
                        float *A = random_matrix((size_t)M * K, 22 + mi);
                        size_t cn = (size_t)M * NP;
                        float *C1 = random_matrix(cn, 40), *C2 = malloc(cn * sizeof *C2),
                              *C3 = malloc(cn * sizeof *C3);
                        memcpy(C2, C1, cn * sizeof *C2), memcpy(C3, C1, cn * sizeof *C3);
                        /* the sub-matrix B[k0.., c0..] through the plain GEMM */
                        const float *Bs = tb ? B + (size_t)c0 * KP + k0 : B + (size_t)k0 * NP + c0;
                        prl_gemm_f32(ta, tb, M, nc, K, 0.5f, A, ta ? M : K, Bs, tb ? KP : NP, 1,
                                     C1 + c0, NP);
                        prl_gemm_f32_packed_rows(ta, M, k0, K, c0, nc, 0.5f, A, ta ? M : K, &here,
                                                 1, C2, NP);
                        prl_gemm_f32_ref(ta, tb, M, nc, K, 0.5f, A, ta ? M : K, Bs, tb ? KP : NP, 1,
                                         C3 + c0, NP);
                        ck_assert_msg(!memcmp(C1, C2, cn * sizeof *C1) &&
                                          !memcmp(C3, C2, cn * sizeof *C3),
                                      "tb %d ta %d M %d rows [%d, %d): packed rows differ", tb, ta,
                                      M, k0, k0 + K);
                        free(A), free(C1), free(C2), free(C3);
                    }
                }
        prl_packed_b_free(&pb), prl_packed_b_free(&here);
    }
    free(B);
}
END_TEST

START_TEST(test_close_to_openblas)
{
    int M = 97, N = 130, K = 600;
    float *A = random_matrix((size_t)M * K, 11), *B = random_matrix((size_t)K * N, 12);
    float *C1 = malloc((size_t)M * N * sizeof *C1), *C2 = malloc((size_t)M * N * sizeof *C2);
    prl_gemm_f32(0, 0, M, N, K, 1, A, K, B, N, 0, C1, N);
    prl_sgemm(0, 0, M, N, K, 1, A, K, B, N, 0, C2, N);
    /* both are float sums of K products: each within K·u·Σ|a·b| of the exact value */
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double mag = 0;
            for (int k = 0; k < K; k++) mag += fabs((double)A[i * K + k] * B[k * N + j]);
            double e = fabs((double)C1[i * N + j] - C2[i * N + j]) / (2.0 * K * 0x1p-24 * mag);
            worst = e > worst ? e : worst;
        }
    ck_assert_msg(worst <= 1, "difference to OpenBLAS %g of the error bound", worst);
    free(A), free(B), free(C1), free(C2);
}
END_TEST

int main(void)
{
    if (prl_blas_init(1) != PRL_OK) return 1;
    printf("gemm kernel: %s\n", prl_gemm_kernel_name());
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_matches_reference_bitwise);
    tcase_add_test(tc, test_batch_invariance);
    tcase_add_test(tc, test_trailing_zeros);
    tcase_add_test(tc, test_packed_equals_plain);
    tcase_add_test(tc, test_packed_rows_equal_plain);
    tcase_add_test(tc, test_close_to_openblas);
    suite_add_tcase(s, tc);
    return check_run(s);
}
