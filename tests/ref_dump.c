/*
** ref_dump.c — writes a fixed batch and prl's logits, loss, log-probs (a reward model: its
** scores, with the batch's score weights in the loss) and every parameter gradient for it, so the PyTorch reference can check them (tests/test_reference_compare.sh).
**
** usage: ref_dump CKPT_DIR BATCH_OUT PRL_OUT [--pack]   (CKPT_DIR is rewritten with perturbed
** norm gains and router biases first; --pack: the rows hold several sequences, prl_batch.pos,
** written to the batch as "pos")
**
** Built twice: ref_dump (the float32 engine, the real check) and ref_dump64 (prl_model64, the
** engine in double), which tells float32 rounding from a wrong formula: in double, prl and the
** float64 reference must agree far below the float32 tolerances.
*/
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

enum { B = 3, T = 24 };

#ifdef PRL_REAL_DOUBLE
#define REAL_DTYPE PRL_DTYPE_F64
#else
#define REAL_DTYPE PRL_DTYPE_F32
#endif

static int fail(const char *what)
{
    fprintf(stderr, "ref_dump: %s: %s\n", what, prl_error_message());
    return 1;
}

int main(int argc, char **argv)
{
    int pack = argc == 5 && !strcmp(argv[4], "--pack");
    if (argc != 4 && !pack) {
        fprintf(stderr, "usage: ref_dump CKPT_DIR BATCH_OUT PRL_OUT [--pack]\n");
        return 2;
    }
    if (prl_blas_init(0)) return fail("blas");
    prl_model m;
    if (prl_checkpoint_load(&m, argv[1])) return fail(argv[1]);
    int V = m.cfg.vocab_size;
    /* Non-trivial norm gains, conv kernels, mHC coefficients and selection bias exercise every
    ** path; save them back so the
    ** reference reads the same weights. */
    prl_rng pr;
    prl_rng_init(&pr, 7, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < m.n_tensors; i++) {
        if (m.tensors[i].kind == PRL_PARAM_NORM ||
            (m.tensors[i].kind == PRL_PARAM_INDEXER && m.tensors[i].ndim == 1)) /* k_norm too */
            for (size_t j = 0; j < m.tensors[i].numel; j++)
                m.params[m.tensors[i].offset + j] = (float)(1 + 0.2 * prl_rng_normal(&pr));
        if (m.tensors[i].kind == PRL_PARAM_CONV) /* ModAttn kernels start at 0 (the identity) */
            for (size_t j = 0; j < m.tensors[i].numel; j++)
                m.params[m.tensors[i].offset + j] = (float)(0.2 * prl_rng_normal(&pr));
        if (m.tensors[i].kind == PRL_PARAM_MHC && m.tensors[i].ndim == 1) /* α = 0.01, b_res =
                                                  ** −8: the Sinkhorn mix would be ≈ I */
            for (size_t j = 0; j < m.tensors[i].numel; j++)
                m.params[m.tensors[i].offset + j] += (float)(0.5 * prl_rng_normal(&pr));
    }
    for (int i = 0; i < m.n_moe_all * m.cfg.n_routed_experts; i++) /* the MTP layers' too */
        m.router_bias[i] = (float)(0.05 * prl_rng_normal(&pr));
    /* the checkpoint is float32: compute with exactly the values the reference reads */
    for (size_t j = 0; j < m.n_params; j++) m.params[j] = (float)m.params[j];
    if (prl_checkpoint_save(&m, NULL, NULL, NULL, argv[1])) return fail(argv[1]);
    static int32_t tok[B * T], tgt[B * T], lens[B] = {24, 17, 9};
    static float w[B * T], logp[B * T];
    prl_rng r;
    prl_rng_init(&r, 99, 0, 0, 0, PRL_RNG_TEST);
    int n = 0;
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(prl_rng_u64(&r) % (uint64_t)V);
    for (int i = 0; i < B * T; i++) {
        int t = i % T, valid = t + 1 < lens[i / T] && t % 7 != 3;
        tgt[i] = valid ? tok[i + 1] : -1;
        n += valid;
    }
    for (int i = 0; i < B * T; i++) w[i] = tgt[i] >= 0 ? (float)(-(1.0 + 0.5 * (i % 3)) / n) : 0;
    /* packed: row 0 holds sequences of 10 and 14, row 1 of 6 and 10 around a padding position,
    ** row 2 one of 9 (positions past a row's length are never read) */
    static int32_t pos[B * T];
    static const int seqs[B][3] = {{10, 14, 0}, {6, -1, 10}, {9, 0, 0}};
    for (int i = 0; i < B; i++)
        for (int k = 0, t = 0; k < 3 && seqs[i][k]; k++) {
            int n = seqs[i][k] < 0 ? 1 : seqs[i][k];
            for (int j = 0; j < n; j++, t++) pos[i * T + t] = seqs[i][k] < 0 ? -1 : j;
        }
    const double tau = 0.8;
    prl_batch b = {.B = B,
                   .T = T,
                   .tokens = tok,
                   .lens = lens,
                   .targets = tgt,
                   .weights = w,
                   .temperature = tau,
                   .with_mtp = 1, /* MTP trains when the config has it */
                   .pos = pack ? pos : NULL};
    static float score_w[B] = {0.7f, -1.3f, 0.4f}; /* a reward model: dL/dscore per row */
    if (m.cfg.score_head) b.score_weights = score_w;
    prl_forward_stats st;
    prl_model_zero_grad(&m);
    if (prl_model_forward(&m, &b, logp, &st) || prl_model_backward(&m, &b))
        return fail("train path");
    prl_safetensors_writer bw, pw;
    prl_safetensors_writer_init(&bw);
    prl_safetensors_writer_init(&pw);
    int64_t sh_bt[2] = {B, T}, sh_b[1] = {B}, sh_btv[3] = {B, T, V}, sh_1[1] = {1};
    double loss = st.loss, index_loss = st.index_loss;
    /* the reference's loss holds the score term Σ_b g_b·score_b; st.loss is the token loss */
    for (int i = 0; m.cfg.score_head && i < B; i++)
        loss += (double)score_w[i] * prl_model_scores(&m)[i];
    prl_status rc = prl_safetensors_writer_add(&bw, "tokens", PRL_DTYPE_I32, sh_bt, 2, tok);
    if (!rc) rc = prl_safetensors_writer_add(&bw, "lens", PRL_DTYPE_I32, sh_b, 1, lens);
    if (!rc) rc = prl_safetensors_writer_add(&bw, "targets", PRL_DTYPE_I32, sh_bt, 2, tgt);
    if (!rc) rc = prl_safetensors_writer_add(&bw, "weights", PRL_DTYPE_F32, sh_bt, 2, w);
    if (!rc && pack) rc = prl_safetensors_writer_add(&bw, "pos", PRL_DTYPE_I32, sh_bt, 2, pos);
    if (!rc) rc = prl_safetensors_writer_set_metadata(&bw, "temperature", "0.8");
    if (!rc && m.cfg.score_head)
        rc = prl_safetensors_writer_add(&bw, "score_weights", PRL_DTYPE_F32, sh_b, 1, score_w);
    if (!rc && m.cfg.score_head)
        rc = prl_safetensors_writer_add(&pw, "scores", REAL_DTYPE, sh_b, 1, prl_model_scores(&m));
    if (!rc)
        rc = prl_safetensors_writer_add(&pw, "logits", REAL_DTYPE, sh_btv, 3, prl_model_logits(&m));
    if (!rc) rc = prl_safetensors_writer_add(&pw, "loss", PRL_DTYPE_F64, sh_1, 1, &loss);
    if (!rc) rc = prl_safetensors_writer_add(&pw, "logp", PRL_DTYPE_F32, sh_bt, 2, logp);
    if (!rc && m.cfg.n_dsa_layers > 0)
        rc = prl_safetensors_writer_add(&pw, "index_loss", PRL_DTYPE_F64, sh_1, 1, &index_loss);
    /* the DSA selections prl made, for the same near-tie check as the routes */
    int64_t sh_btt[3] = {B, T, T};
    char(*snames)[32] = calloc((size_t)m.cfg.n_dsa_layers + 1, sizeof *snames);
    for (int i = 0; !rc && i < m.cfg.n_dsa_layers; i++) {
        const uint8_t *sel = prl_model_dsa_selection(&m, m.cfg.dsa_layers[i]);
        if (!sel) continue; /* the dense stage selects nothing */
        snprintf(snames[i], sizeof snames[i], "dsa_sel.%d", m.cfg.dsa_layers[i]);
        rc = prl_safetensors_writer_add(&pw, snames[i], PRL_DTYPE_U8, sh_btt, 3, sel);
    }
    /* the routes prl chose, so the reference can tell float near-ties from real differences */
    int K = m.cfg.num_experts_per_tok;
    int64_t sh_btk[3] = {B, T, K};
    char(*rnames)[32] = calloc((size_t)m.n_moe + 1, sizeof *rnames);
    for (int i = 0; !rc && i < m.n_moe; i++) {
        snprintf(rnames[i], sizeof rnames[i], "routes.%d", prl_config_moe_layer(&m.cfg, i));
        rc = prl_safetensors_writer_add(&pw, rnames[i], PRL_DTYPE_I32, sh_btk, 3,
                                        prl_model_routes(&m) + (size_t)i * B * T * K);
    }
    char(*names)[112] = calloc((size_t)m.n_tensors, sizeof *names);
    for (int i = 0; !rc && i < m.n_tensors; i++) {
        const prl_param_info *p = &m.tensors[i];
        snprintf(names[i], sizeof names[i], "grad.%s", p->name);
        rc = prl_safetensors_writer_add(&pw, names[i], REAL_DTYPE, p->shape, p->ndim,
                                        m.grads + p->offset);
    }
    if (!rc) rc = prl_safetensors_writer_save(&bw, argv[2]);
    if (!rc) rc = prl_safetensors_writer_save(&pw, argv[3]);
    prl_safetensors_writer_free(&bw);
    prl_safetensors_writer_free(&pw);
    free(names);
    free(rnames);
    free(snames);
    prl_model_free(&m);
    if (rc) return fail("writing");
    fprintf(
        stderr,
        "ref_dump: loss %.6f (lm %.6f, balance %.3g, z %.3g, mtp %.6f, index %.6g), %d targets\n",
        st.loss, st.lm_loss, st.balance_loss, st.z_loss, st.mtp_loss, st.index_loss, st.n_targets);
    return 0;
}
