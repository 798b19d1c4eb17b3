/*
** mtp.c — the MTP-only ops: an MTP module's input (enorm, hnorm, eh_proj) and the shifted
** tokens/targets/weights of depth k. The module's decoder layer and head are the model's
** ordinary code (model_mtp.c drives them); the maths is docs/model.md "Multi-token prediction".
*/
#include "engine/mtp.h"

#include <string.h>

void prl_mtp_input_forward(prl_real *out, prl_real *cat, prl_real *rstd_e, prl_real *rstd_h,
                           const prl_real *e, const prl_real *h, const prl_real *ge,
                           const prl_real *gh, const prl_real *w, int N, int d, double eps,
                           prl_precision p)
{
    /* e, h (N,d) → cat (N,2d) = [enorm(e) | hnorm(h)] → out (N,d) = cat · wᵀ, w (d,2d).
    ** The checkpoint order puts the embedding first (spec §9.1, §11.1). */
    prl_rmsnorm_forward(cat, rstd_e, e, ge, N, d, d, 2 * d, eps);
    prl_rmsnorm_forward(cat + d, rstd_h, h, gh, N, d, d, 2 * d, eps);
    prl_round_reals(p, cat, (size_t)N * 2 * d);
    prl_matmul_forward(out, cat, w, N, 2 * d, d, 0);
    prl_round_reals(p, out, (size_t)N * d);
}

void prl_mtp_input_backward(prl_real *de, prl_real *dh, prl_real *dge, prl_real *dgh, prl_real *dw,
                            prl_real *dcat, const prl_real *dout, const prl_real *cat,
                            const prl_real *e, const prl_real *h, const prl_real *ge,
                            const prl_real *gh, const prl_real *w, const prl_real *rstd_e,
                            const prl_real *rstd_h, int N, int d, prl_precision p)
{
    /* dout (N,d) → dcat (N,2d) = dout · w, dw (d,2d) += doutᵀ · cat; then each half back
    ** through its norm (the halves are rows of dcat at stride 2d). */
    memset(dcat, 0, (size_t)N * 2 * d * sizeof *dcat);
    prl_matmul_backward(dcat, dw, dout, cat, w, N, 2 * d, d);
    prl_round_reals(p, dcat, (size_t)N * 2 * d);
    prl_rmsnorm_backward(de, dge, dcat, e, ge, rstd_e, N, d, d, 2 * d);
    prl_rmsnorm_backward(dh, dgh, dcat + d, h, gh, rstd_h, N, d, d, 2 * d);
}

void prl_mtp_shift(int32_t *tok_k, int32_t *tgt_k, float *w_k, int32_t *lens_k,
                   const int32_t *tokens, const int32_t *targets, const float *weights,
                   const int32_t *lens, int B, int T, int k, double scale, const int32_t *pos,
                   int32_t *pos_k)
{
    /* tokens/targets/weights (B,T) → the same shape shifted left by k within each row (each
    ** packed sequence) */
    for (int b = 0; b < B; b++) {
        int len = lens ? lens[b] : T;
        lens_k[b] = len - k > 1 ? len - k : 1;
        for (int i = 0; i < T; i++) {
            size_t n = (size_t)b * T + i, src = n + (size_t)k;
            int in = i + k < len;
            if (pos) { /* the same sequence k positions on; else this position is padding */
                in = in && pos[n] >= 0 && pos[src] == pos[n] + k;
                pos_k[n] = in ? pos[n] : -1;
            }
            tok_k[n] = in ? tokens[src] : 0;
            tgt_k[n] = in && targets ? targets[src] : -1;
            w_k[n] = in && weights ? (float)(scale * weights[src]) : 0.0f;
        }
    }
}
