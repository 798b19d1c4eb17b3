/*
** test_quant.c — the W8A8 kernels (engine/quant.h): the AVX2 (and, where the CPU has it, the
** AVX-512 VNNI) int32 dot products equal the naive reference exactly, also at the ±127
** extremes where vpmaddubsw would saturate without the sign trick; quantized linears stay
** within the rounding bound of fp32; SmoothQuant factors cut the error of an outlier channel;
** non-finite rows give NaN, subnormal ones zeros; the BF16-weight dot products (naive vs
** AVX2) agree bitwise; kernel names are checked.
*/
#include "engine/quant.h"

#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void fill_normal(float *x, size_t n, uint64_t seed, double sd)
{
    prl_rng r;
    prl_rng_init(&r, seed, 1, 2, 3, 4);
    for (size_t i = 0; i < n; i++) x[i] = (float)(sd * prl_rng_normal(&r));
}

/* Random INT8 weights (scale 1) of [out, in], or all ±127 when extreme. */
static void q8w_random(prl_q8w *w, int out, int in, uint64_t seed, int extreme)
{
    float *W = malloc((size_t)out * in * sizeof *W);
    prl_rng r;
    prl_rng_init(&r, seed, 0, 0, 0, 9);
    for (size_t i = 0; i < (size_t)out * in; i++)
        W[i] = extreme ? (prl_rng_u64(&r) & 1 ? 127.0f : -127.0f)
                       : (float)((int)(prl_rng_u64(&r) % 255) - 127);
    if (!extreme) W[0] = 127; /* scale 1, so q = W */
    assert_ok(prl_q8w_init(w, W, in, out, in, NULL));
    free(W);
}

static const prl_q8_kernel fast_kernels[] = {PRL_Q8_AVX2, PRL_Q8_VNNI};

START_TEST(test_int8_dots_match_naive)
{
    static const int ins[] = {1, 7, 31, 32, 64, 100, 768, 2048, 5632};
    for (int e = 0; e < 2; e++)
        for (size_t t = 0; t < sizeof ins / sizeof ins[0]; t++) {
            int in = ins[t], out = 13;
            prl_q8w w;
            q8w_random(&w, out, in, 7 + t, e);
            int8_t *xq = calloc((size_t)w.ld, 1);
            prl_rng r;
            prl_rng_init(&r, t, 5, 5, 5, 5);
            for (int i = 0; i < in; i++)
                xq[i] = e ? (prl_rng_u64(&r) & 1 ? 127 : -127)
                          : (int8_t)((int)(prl_rng_u64(&r) % 255) - 127);
            int32_t ref[13], got[13];
            prl_q8_dots(PRL_Q8_NAIVE, ref, xq, &w, 0, out);
            /* the reference itself against a 64-bit sum of the quantized values */
            for (int o = 0; o < out; o++) {
                int64_t s = 0;
                for (int i = 0; i < in; i++) s += (int64_t)xq[i] * w.q[prl_q8w_index(&w, o, i)];
                ck_assert_int_eq(ref[o], s);
            }
            for (size_t k = 0; k < 2; k++) {
                if (!prl_q8_kernel_supported(fast_kernels[k])) continue;
                memset(got, 0, sizeof got);
                prl_q8_dots(fast_kernels[k], got, xq, &w, 0, out);
                for (int o = 0; o < out; o++)
                    ck_assert_msg(got[o] == ref[o], "%s in %d extreme %d out %d: %d vs %d",
                                  prl_q8_kernel_name(fast_kernels[k]), in, e, o, got[o], ref[o]);
                prl_q8_dots(fast_kernels[k], got, xq, &w, 4, 7); /* an offset, partial group */
                for (int o = 0; o < 7; o++) ck_assert_int_eq(got[o], ref[4 + o]);
            }
            prl_q8w_free(&w);
            free(xq);
        }
}
END_TEST

/* y = x·Wᵀ quantized: within Σ_i (|x_i| s_w/2 + |w_i| s_x/2 + s_x s_w/4) of fp32 (the rounding
** of each factor is at most half its step), and the same floats by every kernel. */
START_TEST(test_q8_linear_error_bound)
{
    int R = 3, in = 200, out = 37;
    float *W = malloc((size_t)out * in * sizeof *W), *x = malloc((size_t)R * in * sizeof *x);
    fill_normal(W, (size_t)out * in, 1, 0.05), fill_normal(x, (size_t)R * in, 2, 1.0);
    prl_q8w w;
    assert_ok(prl_q8w_init(&w, W, in, out, in, NULL));
    int8_t *xq = malloc((size_t)R * w.ld);
    float xs[3], *y = malloc((size_t)R * out * sizeof *y),
                 *y2 = malloc((size_t)R * out * sizeof *y);
    prl_q8_quantize_rows(xq, xs, x, in, R, in, w.ld, NULL);
    assert_ok(prl_q8_kernel_set("naive"));
    prl_q8_linear_block(y, out, xq, xs, R, &w, 0, out);
    double worst = 0;
    for (int r = 0; r < R; r++)
        for (int o = 0; o < out; o++) {
            double ref = 0, bound = 0;
            for (int i = 0; i < in; i++) {
                double a = x[(size_t)r * in + i], b = W[(size_t)o * in + i];
                ref += a * b;
                bound += fabs(a) * w.scale[o] / 2 + fabs(b) * xs[r] / 2 + xs[r] * w.scale[o] / 4;
            }
            double err = fabs(y[(size_t)r * out + o] - ref);
            ck_assert_msg(err <= bound * 1.001 + 1e-6, "r %d o %d: error %g > bound %g", r, o, err,
                          bound);
            worst = err / bound > worst ? err / bound : worst;
        }
    ck_assert(worst > 0); /* the quantization did change something */
    for (size_t k = 0; k < 2; k++) {
        if (!prl_q8_kernel_supported(fast_kernels[k])) continue;
        assert_ok(prl_q8_kernel_set(prl_q8_kernel_name(fast_kernels[k])));
        prl_q8_linear_block(y2, out, xq, xs, R, &w, 0, out);
        ck_assert_int_eq(memcmp(y, y2, (size_t)R * out * sizeof *y), 0);
    }
    assert_ok(prl_q8_kernel_set(NULL));
    prl_q8w_free(&w);
    free(W), free(x), free(xq), free(y), free(y2);
}
END_TEST

/* Rows the fp32 path would not round: a NaN or ∞ in an activation row (or a weight row)
** makes that row's (that output's) results NaN, as fp32 passes them on; a row whose largest
** value is subnormal quantizes to zeros; the other rows are unaffected. */
START_TEST(test_q8_nonfinite_and_subnormal_rows)
{
    enum { R = 4, IN = 40, OUT = 8 };
    float W[OUT * IN], x[R * IN], xs[R], y[R * OUT], yc[R * OUT];
    fill_normal(W, OUT * IN, 5, 0.05), fill_normal(x, R * IN, 6, 1.0);
    prl_q8w w;
    assert_ok(prl_q8w_init(&w, W, IN, OUT, IN, NULL));
    int8_t *xq = malloc((size_t)R * w.ld);
    prl_q8_quantize_rows(xq, xs, x, IN, R, IN, w.ld, NULL);
    prl_q8_linear_block(yc, OUT, xq, xs, R, &w, 0, OUT); /* the clean result */
    x[1 * IN + 3] = NAN, x[2 * IN + 7] = INFINITY;
    for (int i = 0; i < IN; i++) x[3 * IN + i] = i % 2 ? 1e-39f : -2e-39f; /* subnormal */
    prl_q8_quantize_rows(xq, xs, x, IN, R, IN, w.ld, NULL);
    prl_q8_linear_block(y, OUT, xq, xs, R, &w, 0, OUT);
    for (int o = 0; o < OUT; o++) {
        ck_assert_msg(y[o] == yc[o], "row 0 output %d changed", o);
        ck_assert_msg(isnan(y[1 * OUT + o]) && isnan(y[2 * OUT + o]), "non-finite row %d", o);
        ck_assert_msg(y[3 * OUT + o] == 0, "subnormal row output %d = %g", o, y[3 * OUT + o]);
    }
    prl_q8w_free(&w);
    W[2 * IN + 5] = NAN; /* one weight row */
    assert_ok(prl_q8w_init(&w, W, IN, OUT, IN, NULL));
    prl_q8_linear_block(y, OUT, xq, xs, 1, &w, 0, OUT);
    for (int o = 0; o < OUT; o++)
        ck_assert_msg(o == 2 ? isnan(y[o]) : y[o] == yc[o], "weight row %d: %g", o, y[o]);
    prl_q8w_free(&w);
    free(xq);
}
END_TEST

/* Squared error of the quantized x·Wᵀ against fp32 over R rows, with smoothing s (or none). */
static double q8_mse(const float *x, const float *W, int R, int in, int out, const float *s)
{
    prl_q8w w;
    assert_ok(prl_q8w_init(&w, W, in, out, in, s));
    int8_t *xq = malloc((size_t)R * w.ld);
    float *xs = malloc((size_t)R * sizeof *xs), *y = malloc((size_t)R * out * sizeof *y);
    prl_q8_quantize_rows(xq, xs, x, in, R, in, w.ld, w.inv_s);
    prl_q8_linear_block(y, out, xq, xs, R, &w, 0, out);
    double se = 0;
    for (int r = 0; r < R; r++)
        for (int o = 0; o < out; o++) {
            double ref = 0;
            for (int i = 0; i < in; i++)
                ref += (double)x[(size_t)r * in + i] * W[(size_t)o * in + i];
            se += (y[(size_t)r * out + o] - ref) * (y[(size_t)r * out + o] - ref);
        }
    prl_q8w_free(&w);
    free(xq), free(xs), free(y);
    return se / ((double)R * out);
}

/* One activation channel 50× the others (the outliers SmoothQuant is for): s_j =
** max|X_j|^½ / max|W_j|^½ moves the difficulty into the weights and the error drops. */
START_TEST(test_smoothing_cuts_outlier_error)
{
    int R = 16, in = 128, out = 32;
    float *W = malloc((size_t)out * in * sizeof *W), *x = malloc((size_t)R * in * sizeof *x);
    float *s = malloc((size_t)in * sizeof *s);
    fill_normal(W, (size_t)out * in, 3, 0.05), fill_normal(x, (size_t)R * in, 4, 1.0);
    for (int r = 0; r < R; r++) x[(size_t)r * in + 5] *= 50;
    for (int i = 0; i < in; i++) {
        double ax = 0, aw = 0;
        for (int r = 0; r < R; r++) ax = fmax(ax, fabs(x[(size_t)r * in + i]));
        for (int o = 0; o < out; o++) aw = fmax(aw, fabs(W[(size_t)o * in + i]));
        s[i] = (float)(sqrt(ax) / sqrt(aw));
    }
    double plain = q8_mse(x, W, R, in, out, NULL), smooth = q8_mse(x, W, R, in, out, s);
    ck_assert_msg(smooth < 0.5 * plain, "smoothed MSE %g not below half of plain %g", smooth,
                  plain);
    free(W), free(x), free(s);
}
END_TEST

START_TEST(test_bf16_dots_match_naive)
{
    static const int ins[] = {1, 9, 64, 203, 2048};
    for (size_t t = 0; t < sizeof ins / sizeof ins[0]; t++) {
        int in = ins[t], out = 11;
        float *W = malloc((size_t)out * in * sizeof *W), *x = malloc((size_t)in * sizeof *x);
        fill_normal(W, (size_t)out * in, 10 + t, 0.1), fill_normal(x, (size_t)in, 20 + t, 1);
        prl_bf16w w;
        assert_ok(prl_bf16w_init(&w, W, in, out, in));
        float ref[11], got[11];
        prl_bf16_dots(PRL_Q8_NAIVE, ref, x, &w, 0, out);
        for (int o = 0; o < out; o++) { /* near the fp32 product: bf16 weights, 2^-8 relative */
            double d = 0, mag = 0;
            for (int i = 0; i < in; i++)
                d += (double)x[i] * W[(size_t)o * in + i],
                    mag += fabs((double)x[i] * W[(size_t)o * in + i]);
            ck_assert_msg(fabs(ref[o] - d) <= mag * 0x1p-8 + 1e-6, "in %d o %d", in, o);
        }
        if (prl_q8_kernel_supported(PRL_Q8_AVX2)) {
            prl_bf16_dots(PRL_Q8_AVX2, got, x, &w, 0, out);
            ck_assert_int_eq(memcmp(ref, got, sizeof ref), 0);
            prl_bf16_dots(PRL_Q8_AVX2, got, x, &w, 4, 7);
            ck_assert_int_eq(memcmp(ref + 4, got, 7 * sizeof *got), 0);
        }
        prl_bf16w_free(&w);
        free(W), free(x);
    }
}
END_TEST

START_TEST(test_kernel_names)
{
    ck_assert_int_eq(prl_q8_kernel_set("sse9"), PRL_ERR_ARG);
    assert_msg_has("naive, avx2, vnni");
    assert_ok(prl_q8_kernel_set("naive"));
    ck_assert_int_eq(prl_q8_kernel_active(), PRL_Q8_NAIVE);
    if (!prl_q8_kernel_supported(PRL_Q8_VNNI)) {
        ck_assert_int_eq(prl_q8_kernel_set("vnni"), PRL_ERR_ARG);
        assert_msg_has("vnni");
    }
    assert_ok(prl_q8_kernel_set(NULL));
    prl_q8_kernel best = prl_q8_kernel_supported(PRL_Q8_VNNI)   ? PRL_Q8_VNNI
                         : prl_q8_kernel_supported(PRL_Q8_AVX2) ? PRL_Q8_AVX2
                                                                : PRL_Q8_NAIVE;
    if (!getenv("PRL_Q8_KERNEL")) ck_assert_int_eq(prl_q8_kernel_active(), best);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("quant");
    TCase *tc = tcase_create("quant");
    tcase_add_test(tc, test_int8_dots_match_naive);
    tcase_add_test(tc, test_q8_linear_error_bound);
    tcase_add_test(tc, test_q8_nonfinite_and_subnormal_rows);
    tcase_add_test(tc, test_smoothing_cuts_outlier_error);
    tcase_add_test(tc, test_bf16_dots_match_naive);
    tcase_add_test(tc, test_kernel_names);
    suite_add_tcase(su, tc);
    return check_run(su);
}
