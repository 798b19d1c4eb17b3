/*
** precision.c — the one rounding implementation of the reduced precisions (bf16, fp16),
** shared by the train path (model*.c) and the infer path (infer*.c), and the names of the
** precisions.
**
** A value is held in fp32 storage but rounded to the nearest bf16 or fp16 value (ties to
** even), which is what a kernel that writes its output in that format does. fp16 handles
** subnormals and overflows to ±inf (|x| >= 65520), so an overflow is visible downstream —
** the condition dynamic loss scaling detects (shared/spec/rl.md §4.3). The maths and test
** vectors are rl.md §4.1. It does not decide where to round: each path calls it at its op
** outputs (docs/model.md "Precision").
*/
#include "engine/engine.h"

#include <math.h>
#include <string.h>

static const char *const names[] = {"fp32", "bf16", "fp16"};

const char *prl_precision_name(prl_precision p)
{
    return (unsigned)p <= PRL_PRECISION_FP16 ? names[p] : "?";
}

prl_status prl_precision_parse(prl_precision *p, const char *name)
{
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, names[i])) {
            *p = (prl_precision)i;
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_ARG, "unknown precision '%s' (choices: fp32, bf16, fp16)",
                         name ? name : "(null)");
}

float prl_round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x; /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);               /* round to nearest, ties to even */
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* IEEE binary16 rounding by hand, for compilers without _Float16 (clang < 15: the fuzz
** build). Normal halves keep 10 mantissa bits (ties to even; a carry may reach the
** exponent); below 2^-14 the step is 2^-24 and x·2^24 is exact, so nearbyintf rounds it as
** IEEE does. test_precision checks it against the compiler's conversion. */
float prl_round_fp16_by_hand(float x)
{
    if (x != x) return x;
    float a = fabsf(x);
    if (a < 0x1p-14f) return copysignf(nearbyintf(a * 0x1p24f) * 0x1p-24f, x);
    uint32_t u;
    memcpy(&u, &a, sizeof u);
    u += 0xfffu + ((u >> 13) & 1u);
    u &= ~0x1fffu;
    memcpy(&a, &u, sizeof a);
    return copysignf(a > 65504.0f ? INFINITY : a, x);
}

#if defined(__FLT16_MAX__)
/* The compiler's IEEE binary16 conversion: round to nearest even, subnormals, ±inf. Without
** F16C it is a library call (~35 ns a value measured), hence the vector path below. */
float prl_round_fp16(float x) { return (float)(_Float16)x; }
#else
float prl_round_fp16(float x) { return prl_round_fp16_by_hand(x); }
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

/* The same conversion with the F16C instructions, 8 values at a time: vcvtps2ph with
** round-to-nearest-even is IEEE binary16 rounding (subnormals kept, overflow to ±inf), so it
** gives the scalar's bits for every non-NaN value (tested over 2^24 patterns and the edges). */
__attribute__((target("f16c,avx"))) static void round_fp16_f16c(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) x[i] = prl_round_fp16(x[i]);
}

static int have_f16c(void)
{
    static int cached = -1; /* a benign race: every thread computes the same value */
    unsigned a, b, c, d;    /* cpuid 1 ECX bit 29: F16C (a name not every compiler's builtin has) */
    if (cached < 0)
        cached = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
    return cached;
}
#else
static int have_f16c(void) { return 0; }
static void round_fp16_f16c(float *x, size_t n) { (void)x, (void)n; }
#endif

void prl_round_fp16_scalar(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = prl_round_fp16(x[i]);
}

void prl_round_floats(prl_precision p, float *x, size_t n)
{
    if (p == PRL_PRECISION_BF16)
        for (size_t i = 0; i < n; i++) x[i] = prl_round_bf16(x[i]);
    else if (p == PRL_PRECISION_FP16 && have_f16c()) round_fp16_f16c(x, n);
    else if (p == PRL_PRECISION_FP16) prl_round_fp16_scalar(x, n);
}

/* The double build (gradient checks) rounds through the float nearest to each value, as the
** float build would store it first. */
void prl_round_doubles(prl_precision p, double *x, size_t n)
{
    if (p == PRL_PRECISION_BF16)
        for (size_t i = 0; i < n; i++) x[i] = prl_round_bf16((float)x[i]);
    else if (p == PRL_PRECISION_FP16)
        for (size_t i = 0; i < n; i++) x[i] = prl_round_fp16((float)x[i]);
}
