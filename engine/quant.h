/*
** quant.h — W8A8 kernels of the infer path (internal to the engine and its tests; docs/infer.md
** "W8A8"): static symmetric per-output-channel INT8 weights (optionally SmoothQuant-smoothed),
** dynamic per-token INT8 activations, exact int32 dot products, dequantization; and the
** BF16-stored weights the W8A8 mode keeps its full-precision linears in.
**
** The integer dot products have three kernels — naive (the reference), AVX2 (vpmaddubsw with
** the sign trick, |values| <= 127 so no int16 saturation) and AVX-512 VNNI (vpdpbusd on x+128
** minus 128·Σw) — chosen once by cpuid; PRL_Q8_KERNEL=naive|avx2|vnni or prl_q8_kernel_set
** forces one. Integer sums are exact, so every kernel gives the same int32 and therefore the same
** floats (dequantization is shared code). The BF16 dot products (naive and AVX2/FMA) use one
** 8-lane fused multiply-add order and agree bitwise too.
*/
#ifndef PRL_QUANT_H
#define PRL_QUANT_H

#include "engine/engine.h"

#include <stdint.h>

typedef enum prl_q8_kernel { PRL_Q8_NAIVE = 0, PRL_Q8_AVX2 = 1, PRL_Q8_VNNI = 2 } prl_q8_kernel;

/* INT8 weights of a linear y = x·Wᵀ, W [out, in]: q_o = round(W_o ⊙ s / scale_o) with
** scale_o = max|W_o ⊙ s| / 127 (0 for a zero row), rows padded with zeros to ld (a multiple
** of 64) bytes. s = the SmoothQuant factors (the activation is divided by them), or none. */
typedef struct prl_q8w {
    int8_t *q;     /* [out/4 groups][ld/32 chunks][4 rows][32] (prl_q8w_index) */
    float *scale;  /* [out] */
    int32_t *wsum; /* [out] Σ_i q_o[i] (the VNNI kernel's offset) */
    float *inv_s;  /* [in] 1/s, NULL = no smoothing */
    int out, in, ld;
} prl_q8w;

/* Row length of an INT8 row of `in` values, padded. */
int prl_q8_ld(int in);
/* Where weight (o, i) sits in q: groups of four rows, their 32-byte chunks interleaved. */
size_t prl_q8w_index(const prl_q8w *w, int o, int i);
/* Quantize W [out, in] (row stride ldw) with smoothing factors s (NULL = none). */
prl_status prl_q8w_init(prl_q8w *w, const float *W, int ldw, int out, int in, const float *s);
void prl_q8w_free(prl_q8w *w);

/* Per-token (dynamic, symmetric) quantization of R rows x [R, in] (row stride ldx), each
** divided by the smoothing factors first (inv_s: 1/s, NULL = none): q [R][ld] (padding
** zeroed), scale[r] = max|x_r/s| / 127. */
void prl_q8_quantize_rows(int8_t *q, float *scale, const float *x, int ldx, int R, int in, int ld,
                          const float *inv_s);

/* acc[o] = Σ_i xq[i]·q_{o0+o}[i] for o < no (one row xq of ld bytes), by kernel k; o0 is a
** multiple of 4. */
void prl_q8_dots(prl_q8_kernel k, int32_t *acc, const int8_t *xq, const prl_q8w *w, int o0, int no);
/* y[r·ldy + o] = acc · scale_{o0+o} · xs[r] for rows r < R and outputs o < no, by the active
** kernel: one INT8 linear's block of outputs. */
void prl_q8_linear_block(float *y, int ldy, const int8_t *xq, const float *xs, int R,
                         const prl_q8w *w, int o0, int no);

/* The kernel in use (chosen at the first call: PRL_Q8_KERNEL, else the best the CPU has). */
prl_q8_kernel prl_q8_kernel_active(void);
/* Force a kernel by name ("naive", "avx2", "vnni"); NULL chooses again from the environment
** and cpuid. A kernel the CPU lacks is PRL_ERR_ARG naming it. */
prl_status prl_q8_kernel_set(const char *name);
const char *prl_q8_kernel_name(prl_q8_kernel k);
/* PRL_Q8_KERNEL, when set, names a kernel this CPU has (else PRL_ERR_ARG naming the
** variable); the choice itself is left alone. prl_infer_init checks it for W8A8 engines. */
prl_status prl_q8_kernel_env_check(void);
int prl_q8_kernel_supported(prl_q8_kernel k);

/* BF16-stored weights: W rounded to bf16 (nearest even), 2 bytes a value, [out][in]. */
typedef struct prl_bf16w {
    uint16_t *w; /* interleaved in groups of four rows (prl_bf16w_index) */
    int out, in;
} prl_bf16w;

/* Where weight (o, i) sits in w. */
size_t prl_bf16w_index(const prl_bf16w *w, int o, int i);

prl_status prl_bf16w_init(prl_bf16w *w, const float *W, int ldw, int out, int in);
void prl_bf16w_free(prl_bf16w *w);
/* y[o] = x·W_{o0+o} for o < no, in the infer path's GEMV order (8 fused multiply-add lanes,
** the fixed lane tree, then the tail), by the naive (k = PRL_Q8_NAIVE) or the AVX2/FMA kernel;
** o0 is a multiple of 4. */
void prl_bf16_dots(prl_q8_kernel k, float *y, const float *x, const prl_bf16w *w, int o0, int no);

#endif /* PRL_QUANT_H */
