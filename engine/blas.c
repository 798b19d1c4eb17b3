/*
** blas.c — choosing, loading and calling OpenBLAS.
**
** Debian's DYNAMIC_ARCH OpenBLAS reads OPENBLAS_CORETYPE once, when the library is loaded,
** and on some CPUs falls back to the slow "Prescott" kernels. So prl does not link OpenBLAS
** at build time: prl_blas_init() inspects the CPU with cpuid, sets OPENBLAS_CORETYPE when the
** user has not, and only then dlopen()s the library. OpenBLAS GEMMs go through prl_sgemm /
** prl_dgemm here: dgemm for the double build (gradient checks), sgemm for benchmarks and as
** the batch-variant comparison kernel; the float engine itself uses gemm.c.
**
** One thread pool: OpenBLAS is pinned to 1 thread and prl's own pool (parallel.c) splits
** work into thread-count-independent tasks, because OpenBLAS's threaded sgemm gives
** different bits for 1 and 2 threads and prl promises identical results for both.
*/
#include "engine/engine.h"

#include <cblas.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
                         blasint, blasint, float, const float *, blasint, const float *, blasint,
                         float, float *, blasint);
typedef void (*dgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
                         blasint, blasint, double, const double *, blasint, const double *, blasint,
                         double, double *, blasint);

static struct {
    void *lib;
    sgemm_fn sgemm;
    dgemm_fn dgemm;
    void (*set_num_threads)(int);
    char *(*get_corename)(void);
    int threads;
    char core_source[64]; /* "user", "cpuid", or "library default" */
} blas;

/* The OpenBLAS core name matching this CPU's vector extensions, or NULL to let OpenBLAS
** decide. AVX-512 needs the OS to save ZMM state (XCR0 bits 5-7), AVX2 the YMM state. */
static const char *detect_core(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return NULL;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    if (!osxsave || !avx) return NULL;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    int ymm_ok = (xcr0_lo & 0x6) == 0x6, zmm_ok = (xcr0_lo & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return NULL;
    int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1,
        avx512vl = (b >> 31) & 1, avx512dq = (b >> 17) & 1;
    if (zmm_ok && avx512f && avx512bw && avx512vl && avx512dq) return "SkylakeX";
    if (ymm_ok && avx2 && fma) return "Haswell";
    return NULL;
}

static int default_threads(void)
{
    const char *s = getenv("PRL_THREADS");
    if (!s || !*s) s = getenv("OPENBLAS_NUM_THREADS");
    if (s && *s) {
        int n = atoi(s);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

prl_status prl_blas_init(int threads)
{
    if (threads <= 0) threads = default_threads();
    if (!blas.lib) {
        /* OpenBLAS would start its own thread pool at load; prl runs one pool, its own. */
        if (!getenv("OPENBLAS_NUM_THREADS")) setenv("OPENBLAS_NUM_THREADS", "1", 1);
        const char *user = getenv("OPENBLAS_CORETYPE");
        if (user && *user) {
            snprintf(blas.core_source, sizeof blas.core_source, "user");
        } else {
            const char *core = detect_core();
            if (core) {
                setenv("OPENBLAS_CORETYPE", core, 1);
                snprintf(blas.core_source, sizeof blas.core_source, "cpuid");
            } else {
                snprintf(blas.core_source, sizeof blas.core_source, "library default");
            }
        }
        const char *names[] = {"libopenblas.so.0", "libopenblas.so"};
        for (size_t i = 0; i < 2 && !blas.lib; i++) blas.lib = dlopen(names[i], RTLD_NOW);
        if (!blas.lib)
            return prl_error_set(PRL_ERR_IO,
                                 "cannot load OpenBLAS (libopenblas.so.0): %s; install "
                                 "libopenblas0-pthread (scripts/install-deps.sh)",
                                 dlerror());
        *(void **)&blas.sgemm = dlsym(blas.lib, "cblas_sgemm");
        *(void **)&blas.dgemm = dlsym(blas.lib, "cblas_dgemm");
        *(void **)&blas.set_num_threads = dlsym(blas.lib, "openblas_set_num_threads");
        *(void **)&blas.get_corename = dlsym(blas.lib, "openblas_get_corename");
        if (!blas.sgemm || !blas.dgemm || !blas.set_num_threads)
            return prl_error_set(PRL_ERR_IO, "OpenBLAS lacks cblas_sgemm/cblas_dgemm/"
                                             "openblas_set_num_threads");
    }
    prl_blas_set_threads(threads);
    return PRL_OK;
}

void prl_blas_set_threads(int threads)
{
    PRL_ASSERT(blas.lib && threads > 0);
    blas.threads = threads;
    blas.set_num_threads(1);
    if (prl_pool_init(threads) != PRL_OK) {
        fprintf(stderr, "prl: %s\n", prl_error_message());
        exit(1);
    }
}

const char *prl_blas_core(void)
{
    if (!blas.lib) return "not loaded";
    return blas.get_corename ? blas.get_corename() : "unknown";
}

int prl_blas_threads(void) { return blas.threads; }

void prl_blas_print(FILE *out)
{
    fprintf(out,
            "blas: %s threads=%d (core from %s; OpenBLAS 1 thread per call, prl pool %d; "
            "float GEMM: prl %s)\n",
            prl_blas_core(), blas.threads, blas.core_source[0] ? blas.core_source : "-",
            prl_pool_threads(), prl_gemm_kernel_name());
}

/* Lazily initialise so tests and library users that forget prl_blas_init still get the
** right kernel (at the default thread count). */
static void ensure_loaded(void)
{
    if (!blas.lib && prl_blas_init(0) != PRL_OK) {
        fprintf(stderr, "prl: %s\n", prl_error_message());
        exit(1);
    }
}

void prl_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc)
{
    ensure_loaded();
    if (M == 0 || N == 0) return;
    blas.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
               trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void prl_dgemm(int trans_a, int trans_b, int M, int N, int K, double alpha, const double *A,
               int lda, const double *B, int ldb, double beta, double *C, int ldc)
{
    ensure_loaded();
    if (M == 0 || N == 0) return;
    blas.dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
               trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
