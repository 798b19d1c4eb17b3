/*
** engine.h — the one public header of prl's engine.
**
** The engine builds an openPangu-2.0-style MoE transformer from a Hugging Face style
** config.json, trains it (train path: full-sequence forward with saved activations,
** backward, optimizers), scores tokens, and reads/writes checkpoints and tokenizers.
** It knows nothing of RL, processes or files other than checkpoints and tokenizers.
**
** Error model (library): functions return a prl_status (0 = PRL_OK, negative = error) and
** leave a human-readable message, naming the offending key/file/value, in a thread-local
** buffer read with prl_error_message(). Invariants are checked with PRL_ASSERT, which aborts
** with file:line. Ownership: the caller owns what it allocates; init/free pairs own
** everything in between and every *_free accepts NULL.
**
** Real type: the model code is compiled twice. The normal library uses float; the test-only
** library prl_model64 is compiled with PRL_REAL_DOUBLE so finite-difference gradient checks
** run in double with the very same source.
*/
#ifndef PRL_ENGINE_H
#define PRL_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef PRL_REAL_DOUBLE
typedef double prl_real;
#else
typedef float prl_real;
#endif

/* ---------------------------------------------------------------- errors ---------- */

typedef enum prl_status {
    PRL_OK = 0,
    PRL_ERR_NOMEM = -1,       /* allocation failed */
    PRL_ERR_IO = -2,          /* open/read/write/rename/fsync failed */
    PRL_ERR_FORMAT = -3,      /* a file or message is malformed (safetensors, JSON, JSONL) */
    PRL_ERR_CONFIG = -4,      /* unknown key, bad value, inconsistent model config */
    PRL_ERR_RANGE = -5,       /* a value is out of its allowed range (token id, index) */
    PRL_ERR_UNSUPPORTED = -6, /* a recognised feature that is not built yet */
    PRL_ERR_ARG = -7,         /* bad argument to an API call or a CLI flag */
    PRL_ERR_NUMERIC = -8,     /* NaN/Inf where a finite number is required */
    PRL_ERR_CHECKSUM = -9     /* stored and computed checksums differ */
} prl_status;

/* Record an error message (printf-style) and return `code`, so callers can write
** `return prl_error_set(PRL_ERR_IO, "open %s: %s", path, strerror(errno));`. */
prl_status prl_error_set(prl_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prepend context to the current message ("loading ckpt/: " + old message). */
prl_status prl_error_wrap(prl_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The last message set on this thread ("" if none). Valid until the next set. */
const char *prl_error_message(void);
/* Levenshtein distance of two names (99 when either is longer than 63), for "did you mean"
** suggestions in errors. */
int prl_edit_distance(const char *a, const char *b);
/* A short constant name for a status ("PRL_ERR_IO"). */
const char *prl_status_name(prl_status code);

/* Invariant checks: documentation that runs. Always on (the engine is not hot at -O2 on
** branch-predictable checks); failure prints file:line and aborts. */
#define PRL_ASSERT(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) prl_assert_fail(#cond, __FILE__, __LINE__);                                   \
    } while (0)
void prl_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

/* Checked allocation for tools: on failure prints the size and call site and exits(1).
** Library code that must report NOMEM instead uses plain malloc and prl_error_set. */
#define prl_xmalloc(n) prl_xmalloc_at((n), __FILE__, __LINE__)
#define prl_xcalloc(n, s) prl_xcalloc_at((n), (s), __FILE__, __LINE__)
void *prl_xmalloc_at(size_t n, const char *file, int line);
void *prl_xcalloc_at(size_t n, size_t size, const char *file, int line);

/* Read a whole file into a malloc'd, NUL-terminated buffer (caller frees *text); *len (may
** be NULL) gets its length. Errors name the file. */
prl_status prl_file_read(const char *path, char **text, size_t *len);
/* Write len bytes to path (created or truncated) and fsync them. */
prl_status prl_file_write_sync(const char *path, const void *data, size_t len);
/* Replace path atomically: write "<path>.tmp.<pid>", fsync, rename, fsync the directory. On
** failure the temporary is removed and path is as it was. */
prl_status prl_file_write_atomic(const char *path, const void *data, size_t len);
/* Append `line` and a newline to path (created 0644 when absent) in one write, so a reader
** never sees half a line from a live writer; a tail that a crash left without its newline
** is cut first, so the file holds whole lines only. line NULL: only that repair. Not
** fsynced: for logs whose source of truth is elsewhere (metrics.jsonl, run.db). */
prl_status prl_file_append_line(const char *path, const char *line);
/* fsync a directory / the directory holding path (EINVAL, ENOTSUP: not an error). */
prl_status prl_file_sync_dir(const char *dir);
prl_status prl_file_sync_parent(const char *path);

/* ---------------------------------------------------------------- BLAS ------------- */

/* Pick the OpenBLAS kernel for this CPU (cpuid: AVX-512 → SkylakeX, AVX2 → Haswell) unless
** OPENBLAS_CORETYPE is already set (the user's setting wins), then load OpenBLAS and set its
** thread count (threads <= 0: PRL_THREADS, else OPENBLAS_NUM_THREADS, else the number of
** online CPUs). Idempotent; later calls only change the thread count. One thread pool:
** OpenBLAS runs 1 thread per call and prl's pool (below) runs `threads` calls at once. */
prl_status prl_blas_init(int threads);
/* Print "blas: <core> threads=<n>" (and where the core came from) to `out`. */
void prl_blas_print(FILE *out);
const char *prl_blas_core(void);
int prl_blas_threads(void);
void prl_blas_set_threads(int threads);

/* Row-major GEMM on prl_real: C[M,N] = alpha * op(A) * op(B) + beta * C, where op(X) is X or
** Xᵀ (trans_a/trans_b nonzero) and lda/ldb/ldc are row strides. */
void prl_gemm(int trans_a, int trans_b, int M, int N, int K, prl_real alpha, const prl_real *A,
              int lda, const prl_real *B, int ldb, prl_real beta, prl_real *C, int ldc);
/* The same in explicit precisions through OpenBLAS (benchmarks, both builds). */
void prl_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc);
void prl_dgemm(int trans_a, int trans_b, int M, int N, int K, double alpha, const double *A,
               int lda, const double *B, int ldb, double beta, double *C, int ldc);

/* ---------------------------------------------------------------- precision -------- */

/* Arithmetic precision of a path (precision.c; shared/spec/rl.md §4). Reduced precisions keep
** fp32 storage and accumulation but round weights and op outputs to the format's nearest
** value (ties to even) at fixed points, the same points on the train and the infer path. */
typedef enum prl_precision {
    PRL_PRECISION_FP32 = 0,
    PRL_PRECISION_BF16 = 1, /* 8-bit exponent, 7-bit mantissa: fp32's range, unit roundoff 2^-8 */
    PRL_PRECISION_FP16 = 2  /* IEEE half: unit roundoff 2^-11, max 65504, overflow to ±inf */
} prl_precision;

/* "fp32" | "bf16" | "fp16" ("?" for an invalid value). */
const char *prl_precision_name(prl_precision p);
/* The inverse; PRL_ERR_ARG naming the value and the choices. */
prl_status prl_precision_parse(prl_precision *p, const char *name);
/* x rounded to the nearest bf16 / fp16 value (ties to even; NaN stays NaN; fp16 overflows to
** ±inf at |x| >= 65520 and keeps subnormals). */
float prl_round_bf16(float x);
float prl_round_fp16(float x);
/* x[0..n) rounded in place to precision p (no-op for fp32). The double version rounds each
** value's nearest float (the double build is for gradient checks). */
void prl_round_floats(prl_precision p, float *x, size_t n);
/* The portable fp16 loop prl_round_floats uses when the CPU has no F16C (exposed for the
** test that both give the same bits). */
void prl_round_fp16_scalar(float *x, size_t n);
/* prl_round_fp16 without the compiler's _Float16 (what a compiler lacking it uses; exposed
** for the test that it gives the same bits). */
float prl_round_fp16_by_hand(float x);
void prl_round_doubles(prl_precision p, double *x, size_t n);

/* ---------------------------------------------------------------- prl's GEMM ------- */

/* prl's own float GEMM (gemm.c), the one the float engine uses: batch-invariant — every
** element of C is computed by the same operations whatever M, N, its position in C or the
** thread count (OpenBLAS's sgemm is not: a row's bits depend on its place in the call).
** Per element and per depth block of PRL_GEMM_KC (boundaries at multiples of PRL_GEMM_KC):
** acc = Σ_k a·b in k order (fused multiply-add when the CPU has FMA), then
** c = alpha·acc + beta·c on the first block and c = alpha·acc + c after it; beta = 0 never
** reads C. Same arguments as prl_gemm. */
enum { PRL_GEMM_KC = 256 };
void prl_gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* The naive triple loop with the same arithmetic (the tests require bitwise equality). */
void prl_gemm_f32_ref(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* "avx2-fma 6x16" or "generic 6x16": the micro-kernel this CPU runs. */
const char *prl_gemm_kernel_name(void);
/* 1 when prl_gemm_f32 accumulates by fused multiply-add (the AVX2+FMA kernel), 0 when it
** multiplies then adds: kernels that must give prl_gemm_f32's bits (ops_attn_sparse.c) follow it. */
int prl_gemm_fma(void);
/* 1 when the engine's row kernels (softmax, log-probs, SiLU, norms, AdamW) run their AVX2
** forms: the CPU has AVX2 and prl_row_kernels_avx2_set(0) has not turned them off. Both
** forms give the same bits (tests compare them); set returns the previous state. */
int prl_row_kernels_avx2(void);
int prl_row_kernels_avx2_set(int on);

/* op(B) [K, N] packed once for prl_gemm_f32_packed (a weight used by many GEMMs: the decode
** engine; a matmul's weight shared by its row-block tasks). Owns `data` (cap floats);
** init/free pair. Results equal prl_gemm_f32's bitwise. The packing runs on the pool. */
typedef struct prl_packed_b {
    int K, N;
    float *data;
    size_t cap;
} prl_packed_b;
prl_status prl_packed_b_init(prl_packed_b *pb, int trans_b, int K, int N, const float *B, int ldb);
/* Pack op(B) into an initialised (or zeroed) pb, reusing its storage when it is big enough. */
prl_status prl_packed_b_repack(prl_packed_b *pb, int trans_b, int K, int N, const float *B,
                               int ldb);
void prl_packed_b_free(prl_packed_b *pb);
/* prl_packed_b_repack on the calling thread: for a pack made inside a pool task (the
** attention's per-head keys and values). Same floats as the pooled form. */
prl_status prl_packed_b_repack_here(prl_packed_b *pb, int trans_b, int K, int N, const float *B,
                                    int ldb);
/* Depth rows [k_begin, k_begin+K) and columns [col0, col0+ncols) of a pre-packed B:
** C = alpha·op(A)[M, K]·B[k_begin.., col0..] + beta·C, k_begin a multiple of PRL_GEMM_KC and
** col0 of 16 (C is the whole matrix, as below). The bits of prl_gemm_f32 on that sub-matrix of
** B: a matrix packed once serves GEMMs over its leading rows (causal query blocks). */
void prl_gemm_f32_packed_rows(int trans_a, int M, int k_begin, int K, int col0, int ncols,
                              float alpha, const float *A, int lda, const prl_packed_b *pb,
                              float beta, float *C, int ldc);
/* Columns [col0, col0+ncols) of C[M, N] = alpha·op(A)[M, K]·B + beta·C with B pre-packed;
** col0 a multiple of 16 (so column blocks can run as separate tasks). C is the whole matrix. */
void prl_gemm_f32_packed(int trans_a, int M, int col0, int ncols, float alpha, const float *A,
                         int lda, const prl_packed_b *pb, float beta, float *C, int ldc);

/* ---------------------------------------------------------------- threads ---------- */

/* The one thread pool (parallel.c). prl_blas_init creates it; tasks must not depend on
** which thread runs them, and the task split must not depend on the thread count. */
prl_status prl_pool_init(int n_threads);
void prl_pool_free(void);
int prl_pool_threads(void);
/* Index of the calling thread in [0, prl_pool_threads()), for per-thread scratch. */
int prl_pool_worker(void);
/* Run fn(ctx, i) for i in [0, n_tasks) on the pool; returns when all are done. Nested
** calls from inside a task run serially. */
void prl_parallel_for(int n_tasks, void (*fn)(void *ctx, int task), void *ctx);

/* ---------------------------------------------------------------- RNG -------------- */

/* Counter-based random streams: every draw is a pure function of (seed, a, b, c, purpose)
** and the draw index, so results never depend on call order elsewhere or thread count.
** For RL: a = step, b = prompt id, c = sample index. */
typedef struct prl_rng {
    uint64_t key;     /* hash of (seed, a, b, c, purpose) */
    uint64_t counter; /* next draw index */
} prl_rng;

void prl_rng_init(prl_rng *r, uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t purpose);
uint64_t prl_rng_u64(prl_rng *r);
double prl_rng_uniform(prl_rng *r); /* [0, 1) with 53 random bits */
double prl_rng_normal(prl_rng *r);  /* N(0, 1), Box–Muller on two uniforms */
uint64_t prl_hash64(uint64_t x);    /* splitmix64 finaliser */

/* Purposes (never renumber: they are part of every seed). */
enum {
    PRL_RNG_INIT = 1,    /* weight initialisation */
    PRL_RNG_SHUFFLE = 2, /* data order */
    PRL_RNG_SAMPLE = 3,  /* token sampling */
    PRL_RNG_TASK = 4,    /* task generation */
    PRL_RNG_TEST = 5,    /* tests */
    PRL_RNG_DRAFT = 6,   /* speculative decoding: a draft token d_k ~ q_k */
    PRL_RNG_ACCEPT = 7,  /* speculative decoding: the acceptance test u_k and its residual draw */
    PRL_RNG_REVISIT = 8  /* OPD: the prompts a step draws again by teacher KL (opd.revisit) */
};

/* Seconds on the monotonic clock (for durations; never for seeds). */
double prl_now(void);
/* A duration for people: "1h02m", "3m10s", "12s". */
void prl_format_duration(char *out, size_t n, double seconds);

/* CRC-32C style checksum of a byte range (used in checkpoint metadata). */
uint64_t prl_checksum64(const void *data, size_t n, uint64_t seed);

#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "engine/model.h"
#include "engine/infer.h"

#endif /* PRL_ENGINE_H */
