/*
** infer.c — the infer path: prefill and batched incremental decode over a per-sequence KV
** cache, continuous batching, sampling, route capture, precision modes, tensor hooks. This
** file holds the options and presets, the engine's set-up (weights bound, rounded and packed;
** caches, row buffers and slots sized), its cache accounting, tensor hooks and the test-only
** fault; the path itself is split by concern around the private infer_int.h:
**   infer_matmul.c    the linear layers: GEMV-order dot products, the GEMM, OpenBLAS, on the pool;
**                     W8A8's INT8 and BF16 linears (kernels in quant.c)
**   infer_quant.c     W8A8's SmoothQuant: calibration, the α search, the factors' table
**   infer_forward.c   the forward over rows: MLA attention with the caches, FFN/MoE, residual glue
**   infer_sample.c    the sampler: greedy, temperature, top-k/top-p, log-probs
**   infer_generate.c  the generation driver: continuous batching, results, the route codec
**   infer_spec.c      self-speculative decoding: MTP drafts, one verify pass, rollback
**
** One driver, infer__forward_rows(), runs any set of rows (tokens at positions of sequences
** in cache slots) through the model: a prefill is the rows of one prompt, a decode step one
** row per active sequence. Each op is chosen by the options (infer.h): the matmul kind, the
** MLA form, the rounding. Every kernel computes a row from that row's inputs alone, in a fixed
** order, so batch composition and thread count never change a result; with the "aligned"
** preset each op is the train path's own code (ops.c, gemm.c) and results are bitwise equal.
** The maths is docs/model.md; the knobs are docs/infer.md.
*/
#include "engine/infer_int.h"
#include "engine/mhc.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ options --------- */

void prl_infer_options_default(prl_infer_options *o)
{
    *o = (prl_infer_options){.precision = PRL_PRECISION_FP32,
                             .mla = PRL_MLA_ABSORBED,
                             .matmul = PRL_MATMUL_GEMM,
                             .max_batch = 16,
                             .max_len = 0};
}

static const char *const precision_names[] = {"fp32", "bf16", "fp16"};
static const char *const mla_names[] = {"absorbed", "naive"};
static const char *const matmul_names[] = {"gemv", "gemm", "blas"};

static int lookup(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

prl_status prl_infer_options_preset(prl_infer_options *o, const char *name)
{
    prl_infer_options_default(o);
    int p = -1;
    if (!strncmp(name, "aligned",
                 7)) { /* "aligned" is fp32; "aligned-fp16" the train path's fp16 */
        p = !name[7]         ? PRL_PRECISION_FP32
            : name[7] == '-' ? lookup(precision_names, 3, name + 8)
                             : -1;
        o->mla = PRL_MLA_NAIVE;
        o->matmul = PRL_MATMUL_GEMM;
    } else if (!strcmp(name, "w8a8")) {
        p = PRL_PRECISION_FP32, o->w8a8 = PRL_W8A8_ALL;
    } else {
        p = lookup(precision_names, 3, name);
    }
    if (p < 0)
        return prl_error_set(PRL_ERR_ARG,
                             "unknown precision '%s' (choices: fp32, bf16, fp16, w8a8, "
                             "aligned, aligned-bf16, aligned-fp16)",
                             name);
    o->precision = (prl_precision)p;
    return PRL_OK;
}

prl_status prl_infer_options_set(prl_infer_options *o, const char *precision, const char *mla,
                                 const char *matmul)
{
    int v;
    if (precision) {
        int w8a8 = !strcmp(precision, "w8a8");
        if ((v = w8a8 ? PRL_PRECISION_FP32 : lookup(precision_names, 3, precision)) < 0)
            return prl_error_set(
                PRL_ERR_ARG, "unknown precision '%s' (choices: fp32, bf16, fp16, w8a8)", precision);
        o->precision = (prl_precision)v, o->w8a8 = w8a8 ? PRL_W8A8_ALL : 0;
    }
    if (mla) {
        if ((v = lookup(mla_names, 2, mla)) < 0)
            return prl_error_set(PRL_ERR_ARG, "unknown MLA form '%s' (choices: absorbed, naive)",
                                 mla);
        o->mla = (prl_mla_form)v;
    }
    if (matmul) {
        if ((v = lookup(matmul_names, 3, matmul)) < 0)
            return prl_error_set(PRL_ERR_ARG,
                                 "unknown matmul kind '%s' (choices: gemv, gemm, blas)", matmul);
        o->matmul = (prl_matmul_kind)v;
    }
    return PRL_OK;
}

void prl_infer_options_describe(const prl_infer_options *o, char *out, size_t n)
{
    char prec[32]; /* a partial W8A8 mask (a diagnose sweep row) shows its bits */
    if (o->w8a8 && o->w8a8 != PRL_W8A8_ALL)
        snprintf(prec, sizeof prec, "w8a8(mask %#x)", (unsigned)o->w8a8);
    else snprintf(prec, sizeof prec, "%s", o->w8a8 ? "w8a8" : precision_names[o->precision]);
    snprintf(out, n, "precision=%s mla=%s matmul=%s", prec, mla_names[o->mla],
             matmul_names[o->matmul]);
}

/* ------------------------------------------------------------------ set-up ---------- */

/* A tensor of the model by name (the layout is model.c's business), in `base`. */
static const float *tensor(const prl_infer *e, const float *base, int64_t rows, int64_t cols,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static const float *tensor(const prl_infer *e, const float *base, int64_t rows, int64_t cols,
                           const char *fmt, ...)
{
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const prl_param_info *p = prl_model_find(e->m, name);
    PRL_ASSERT(p != NULL && p->shape[0] == rows && (cols == 0 || p->shape[1] == cols));
    return base + p->offset;
}

static void lin_free(lin *L)
{
    prl_packed_b_free(&L->pk), prl_q8w_free(&L->q8), prl_bf16w_free(&L->bf);
}

/* Bind a linear held as `kind` in W8A8 mode (fp32 otherwise). Its smoothing factors survive a
** rebind (prl_infer_refresh re-quantizes with them). */
static prl_status lin_init_as(const prl_infer *e, lin *L, const float *w, int out, int in, int kind,
                              int w8a8_bit)
{
    float *smooth = L->smooth, alpha = L->smooth ? L->alpha : -1;
    lin_free(L);
    *L = (lin){.w = w, .out = out, .in = in, .kind = e->opt.w8a8 & w8a8_bit ? kind : LIN_F32};
    L->smooth = smooth, L->alpha = alpha;
    if (L->kind == LIN_Q8) return prl_q8w_init(&L->q8, w, in, out, in, smooth);
    if (L->kind == LIN_BF16) return prl_bf16w_init(&L->bf, w, in, out, in);
    if (e->opt.matmul == PRL_MATMUL_GEMM) return prl_packed_b_init(&L->pk, 1, in, out, w, in);
    return PRL_OK;
}

static prl_status lin_init(const prl_infer *e, lin *L, const float *w, int out, int in)
{
    return lin_init_as(e, L, w, out, in, LIN_F32, 0);
}

/* A lin and its smoothing factors (engine teardown). */
static void lin_free_all(lin *L)
{
    lin_free(L);
    free(L->smooth);
    L->smooth = NULL;
}

/* Sink rows of layer l from the (rounded) weights `base`, by the train path's own ops: the
** latent rows [RMSNorm(param_sink_compressed_kv; kv_a_layernorm) | param_sink_k_pe] (zero
** latent without param_sink_with_value) and, for the naive form, the per-head [k_nope | v]. */
static void bind_sinks(prl_infer *e, int l, const float *base)
{
    layer_w *w = &e->lw[l];
    int ns = e->ns, rkv = e->rkv;
    float *ckv = calloc((size_t)ns * rkv, sizeof *ckv), *rstd = malloc((size_t)ns * sizeof *rstd);
    PRL_ASSERT(ckv != NULL && rstd != NULL);
    if (e->m->cfg.param_sink_with_value) {
        const float *raw =
            tensor(e, base, ns, rkv, "model.layers.%d.self_attn.param_sink_compressed_kv", l);
        prl_rmsnorm_forward(ckv, rstd, raw, w->kv_norm, ns, rkv, rkv, rkv, PRL_LATENT_NORM_EPS);
        infer__act_round(e, ckv, (size_t)ns * rkv);
    }
    const float *kpe = tensor(e, base, ns, e->dr, "model.layers.%d.self_attn.param_sink_k_pe", l);
    for (int i = 0; i < ns; i++) {
        memcpy(w->sink_lat + (size_t)i * e->lat, ckv + (size_t)i * rkv, (size_t)rkv * sizeof *ckv);
        memcpy(w->sink_lat + (size_t)i * e->lat + rkv, kpe + (size_t)i * e->dr,
               (size_t)e->dr * sizeof *kpe);
    }
    if (e->opt.mla == PRL_MLA_NAIVE) {
        prl_matmul_forward(w->sink_kv, ckv, w->wkv_b.w, ns, rkv, e->H * e->dkv, 0);
        infer__act_round(e, w->sink_kv, (size_t)ns * e->H * e->dkv);
    }
    free(ckv), free(rstd);
}

/* One mHC module `prefix` (model.c's names): phi packed as a linear, γ (ones without
** mhc_use_gamma), α, β. */
static prl_status bind_mhc(prl_infer *e, lin *phi, const float **gamma, const float **alpha,
                           const float **beta, const float *base, const char *prefix, int full)
{
    int n = e->n_streams, nd = n * e->d, M = full ? n * n + 2 * n : n;
    const char *sfx = full ? "" : "_pre";
    *gamma = e->m->cfg.mhc_use_gamma ? tensor(e, base, nd, 0, "%s.norm_gamma", prefix) : e->ones;
    *alpha = tensor(e, base, full ? 3 : 1, 0, "%s.branch_alpha%s", prefix, sfx);
    *beta = tensor(e, base, M, 0, "%s.branch_beta%s", prefix, sfx);
    return lin_init(e, phi, tensor(e, base, M, nd, "%s.phi.weight", prefix), M, nd);
}

/* Sandwich norms, the block post-norm and the two mHC sites of layer l. */
static prl_status bind_residual(prl_infer *e, int l, const float *base)
{
    layer_w *w = &e->lw[l];
    const prl_config *c = &e->m->cfg;
    const char *p = "model.layers";
    w->ln_pa = c->sandwich_norm
                   ? tensor(e, base, e->d, 0, "%s.%d.post_attention_layernorm.weight", p, l)
                   : NULL;
    w->ln_pm =
        c->sandwich_norm ? tensor(e, base, e->d, 0, "%s.%d.post_mlp_layernorm.weight", p, l) : NULL;
    w->ln_bp = prl_config_block_post_norm(c, l) ? tensor(e, base, (int64_t)e->n_streams * e->d, 0,
                                                         "%s.%d.block_post_layernorm.weight", p, l)
                                                : NULL;
    prl_status rc = PRL_OK;
    for (int site = 0; site < 2 && c->use_mhc && l < e->L && !rc; site++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "%s.%d.%s_mhc_module", p, l, site ? "mlp" : "attn");
        rc = bind_mhc(e, &w->hc_phi[site], &w->hc_gamma[site], &w->hc_alpha[site],
                      &w->hc_beta[site], base, prefix, 1);
    }
    return rc;
}

/* MTP layer l's own tensors (model.c's names): enorm, hnorm, eh_proj, and shared_head.norm /
** shared_head.head when the config has them, else the trunk's model.norm / lm_head. */
static prl_status bind_mtp(prl_infer *e, int l, const float *base)
{
    layer_w *w = &e->lw[l];
    const prl_config *c = &e->m->cfg;
    w->enorm = tensor(e, base, e->d, 0, "model.layers.%d.enorm.weight", l);
    w->hnorm = tensor(e, base, e->d, 0, "model.layers.%d.hnorm.weight", l);
    w->sh_norm = c->mtp_head_norm
                     ? tensor(e, base, e->d, 0, "model.layers.%d.shared_head.norm.weight", l)
                     : e->norm;
    w->sh_head = &e->head;
    const float *eh = tensor(e, base, e->d, 2 * e->d, "model.layers.%d.eh_proj.weight", l);
    prl_status rc = lin_init(e, &w->eh_proj, eh, e->d, 2 * e->d);
    if (!rc && c->mtp_head) {
        const float *head =
            tensor(e, base, e->V, e->d, "model.layers.%d.shared_head.head.weight", l);
        rc = lin_init(e, &w->own_head, head, e->V, e->d);
        w->sh_head = &w->own_head;
    }
    int S = e->opt.spec_draft_vocab; /* the head's first S rows are the shortlist's weights */
    if (!rc && S > 0 && S < e->V) rc = lin_init(e, &w->draft_head, w->sh_head->w, S, e->d);
    return rc;
}

/* W8A8: kv_b is one of the BF16 linears; the absorbed form reads it as W_UK_hᵀ and W_UV_h per
** head, so those get BF16 copies (wuk_t built first). */
static prl_status bind_absorbed_bf16(prl_infer *e, layer_w *w)
{
    for (int h = 0; h < e->H && w->uk_bf; h++)
        prl_bf16w_free(&w->uk_bf[h]), prl_bf16w_free(&w->uv_bf[h]);
    free(w->uk_bf), free(w->uv_bf);
    w->uk_bf = calloc((size_t)e->H, sizeof *w->uk_bf);
    w->uv_bf = calloc((size_t)e->H, sizeof *w->uv_bf);
    if (!w->uk_bf || !w->uv_bf) return prl_error_set(PRL_ERR_NOMEM, "BF16 W_UK / W_UV");
    prl_status rc = PRL_OK;
    for (int h = 0; h < e->H && !rc; h++) {
        rc = prl_bf16w_init(&w->uk_bf[h], w->wuk_t + (size_t)h * e->rkv * e->dn, e->dn, e->rkv,
                            e->dn);
        if (!rc)
            rc = prl_bf16w_init(&w->uv_bf[h], w->wkv_b.w + ((size_t)h * e->dkv + e->dn) * e->rkv,
                                e->rkv, e->dv, e->rkv);
    }
    return rc;
}

/* Point every layer at the weights (rounded copy or the model's), pack them, and build the
** absorbed query matrices and the sink rows. */
static prl_status bind_weights(prl_infer *e)
{
    const float *base = e->m->params;
    if (e->opt.precision != PRL_PRECISION_FP32) {
        memcpy(e->wcopy, e->m->params, e->m->n_params * sizeof(float));
        prl_round_floats(e->opt.precision, e->wcopy, e->m->n_params);
        base = e->wcopy;
    }
#define T(suffix, rows, cols, ...)                                                                 \
    tensor(e, base, rows, cols, "model.layers.%d." suffix, l, ##__VA_ARGS__)
#define X(suffix, rows, cols)                                                                      \
    tensor(e, base, rows, cols, "model.layers.%d.mlp.experts.%d." suffix, l, x)
    prl_status rc = PRL_OK;
    for (int l = 0, moe_idx = 0; l < e->L + e->Lm && !rc; l++) { /* trunk, then MTP layers */
        layer_w *w = &e->lw[l];
        w->moe = prl_config_is_moe(&e->m->cfg, l) ? moe_idx++ : -1;
        w->ln1 = T("input_layernorm.weight", e->d, 0);
        w->q_norm = e->rq ? T("self_attn.q_a_layernorm.weight", e->rq, 0) : NULL;
        w->kv_norm = T("self_attn.kv_a_layernorm.weight", e->rkv, 0);
        w->ln2 = T("%s.weight", e->d, 0,
                   e->m->cfg.sandwich_norm ? "pre_mlp_layernorm" : "post_attention_layernorm");
        if (!rc) rc = bind_residual(e, l, base);
        if (!rc && e->rq == 0) /* q_lora_rank null: the direct q_proj */
            rc = lin_init_as(e, &w->wq_b, T("self_attn.q_proj.weight", e->H * e->dq, e->d),
                             e->H * e->dq, e->d, LIN_Q8, PRL_W8A8_Q_B);
        else if (!rc)
            rc = lin_init_as(e, &w->wq_a, T("self_attn.q_a_proj.weight", e->rq, e->d), e->rq, e->d,
                             LIN_BF16, PRL_W8A8_BF16_REST);
        rc = rc || e->rq == 0
                 ? rc
                 : lin_init_as(e, &w->wq_b, T("self_attn.q_b_proj.weight", e->H * e->dq, e->rq),
                               e->H * e->dq, e->rq, LIN_Q8, PRL_W8A8_Q_B);
        rc = rc ? rc
                : lin_init_as(e, &w->wkv_a, T("self_attn.kv_a_proj_with_mqa.weight", e->lat, e->d),
                              e->lat, e->d, LIN_BF16, PRL_W8A8_BF16_REST);
        rc = rc ? rc
                : lin_init(e, &w->wkv_b, T("self_attn.kv_b_proj.weight", e->H * e->dkv, e->rkv),
                           e->H * e->dkv, e->rkv);
        rc = rc ? rc
                : lin_init_as(e, &w->wo, T("self_attn.o_proj.weight", e->d, e->H * e->dv), e->d,
                              e->H * e->dv, LIN_Q8, PRL_W8A8_O_PROJ);
        if (w->moe < 0) { /* gate_proj and up_proj are adjacent: one stacked [2I, d] matrix */
            rc = rc ? rc
                    : lin_init_as(e, &w->w13, T("mlp.gate_proj.weight", e->I, e->d), 2 * e->I, e->d,
                                  LIN_Q8, PRL_W8A8_DENSE_MLP);
            rc = rc ? rc
                    : lin_init_as(e, &w->w2, T("mlp.down_proj.weight", e->d, e->I), e->d, e->I,
                                  LIN_Q8, PRL_W8A8_DENSE_MLP);
        } else {
            rc = rc ? rc
                    : lin_init_as(e, &w->router, T("mlp.gate.weight", e->E, e->d), e->E, e->d,
                                  LIN_BF16, PRL_W8A8_BF16_REST);
            if (e->sde > 0) {
                rc = rc ? rc
                        : lin_init_as(e, &w->w13,
                                      T("mlp.shared_experts.gate_proj.weight", e->sde, e->d),
                                      2 * e->sde, e->d, LIN_BF16, PRL_W8A8_BF16_REST);
                rc = rc ? rc
                        : lin_init_as(e, &w->w2,
                                      T("mlp.shared_experts.down_proj.weight", e->d, e->sde), e->d,
                                      e->sde, LIN_BF16, PRL_W8A8_BF16_REST);
            }
            for (int x = 0; x < e->E && !rc; x++) {
                rc = lin_init_as(e, &w->e13[x], X("gate_proj.weight", e->de, e->d), 2 * e->de, e->d,
                                 LIN_Q8, PRL_W8A8_ROUTED);
                rc = rc ? rc
                        : lin_init_as(e, &w->e2[x], X("down_proj.weight", e->d, e->de), e->d, e->de,
                                      LIN_Q8, PRL_W8A8_ROUTED);
            }
        }
        /* W_UK_hᵀ: rows [h·dkv, h·dkv + dn) of kv_b_proj are head h's key up-projection */
        for (int h = 0; h < e->H; h++)
            for (int c = 0; c < e->rkv; c++)
                for (int i = 0; i < e->dn; i++)
                    w->wuk_t[((size_t)h * e->rkv + c) * e->dn + i] =
                        w->wkv_b.w[((size_t)h * e->dkv + i) * e->rkv + c];
        if (!rc && (e->opt.w8a8 & PRL_W8A8_BF16_REST) && e->opt.mla == PRL_MLA_ABSORBED)
            rc = bind_absorbed_bf16(e, w);
        if (e->ns > 0 && !rc) bind_sinks(e, l, base);
        if (w->dsa && !rc) { /* trunk DSA layers only (w->dsa is 0 for MTP layers) */
#define IX(name, rows, cols)                                                                       \
    tensor(e, base, rows, cols, "model.layers.%d.self_attn.indexer." name, l)
            rc = lin_init_as(e, &w->ix_wq_b, IX("wq_b.weight", e->HI * e->dI, e->rq), e->HI * e->dI,
                             e->rq, LIN_BF16, PRL_W8A8_BF16_REST);
            rc = rc ? rc
                    : lin_init_as(e, &w->ix_wk, IX("wk.weight", e->dI, e->d), e->dI, e->d, LIN_BF16,
                                  PRL_W8A8_BF16_REST);
            rc = rc ? rc
                    : lin_init_as(e, &w->ix_wproj, IX("weights_proj.weight", e->HI, e->d), e->HI,
                                  e->d, LIN_BF16, PRL_W8A8_BF16_REST);
            w->ix_k_norm = IX("k_norm.weight", e->dI, 0);
#undef IX
        }
        if (e->ck && l < e->L) {
            w->conv_w[CONV_Q] =
                tensor(e, base, e->rq, 1, "model.layers.%d.self_attn.qa_conv.weight", l);
            w->conv_w[CONV_KV] =
                tensor(e, base, e->rkv, 1, "model.layers.%d.self_attn.compresskv_conv.weight", l);
            w->conv_w[CONV_O] =
                tensor(e, base, e->H * e->dv, 1, "model.layers.%d.self_attn.o_conv.weight", l);
        }
    }
#undef T
#undef X
    e->embed = tensor(e, base, e->V, e->d, "model.embed_tokens.weight");
    e->norm = tensor(e, base, e->d, 0, "model.norm.weight");
    if (!rc)
        rc = lin_init_as(e, &e->head, tensor(e, base, e->V, e->d, "lm_head.weight"), e->V, e->d,
                         LIN_BF16, PRL_W8A8_BF16_REST);
    if (!rc && e->m->cfg.use_mhc)
        rc = bind_mhc(e, &e->merge_phi, &e->merge_gamma, &e->merge_alpha, &e->merge_beta, base,
                      "model.merge_mhc_module", 0);
    for (int l = e->L; l < e->L + e->Lm && !rc; l++) /* MTP: input op and shared head */
        rc = bind_mtp(e, l, base);
    return rc;
}

prl_status prl_infer_refresh(prl_infer *e) { return bind_weights(e); }

static void *xcalloc(size_t n, size_t size, int *failed)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) *failed = 1;
    return p;
}

static void rows_buf_alloc(prl_infer *e, int cap, int *failed)
{
    rows_buf *b = &e->rb;
    size_t R = (size_t)cap, RK = R * e->K;
    int F = e->I > e->sde ? e->I : e->sde;
    b->cap = cap;
    b->tok = xcalloc(R, sizeof(int32_t), failed);
    b->slot = xcalloc(R, sizeof(int32_t), failed);
    b->pos = xcalloc(R, sizeof(int32_t), failed);
    b->req = xcalloc(R, sizeof(int32_t), failed);
    b->x = xcalloc(R * e->d, sizeof(float), failed);
    b->ln = xcalloc(R * e->d, sizeof(float), failed);
    b->rstd = xcalloc(R, sizeof(float), failed);
    b->zq = xcalloc(R * e->rq, sizeof(float), failed);
    b->cq = xcalloc(R * e->rq, sizeof(float), failed);
    b->q = xcalloc(R * e->H * e->dq, sizeof(float), failed);
    b->kva = xcalloc(R * (e->rkv + e->dr), sizeof(float), failed);
    b->ckv = xcalloc(R * e->rkv, sizeof(float), failed);
    b->kr = xcalloc(R * e->dr, sizeof(float), failed);
    b->lat = xcalloc(R * e->lat, sizeof(float), failed);
    b->first_row = xcalloc((size_t)e->opt.max_batch, sizeof(int32_t), failed);
    b->first_pos = xcalloc((size_t)e->opt.max_batch, sizeof(int32_t), failed);
    if (e->ck) {
        b->zqc = xcalloc(R * e->rq, sizeof(float), failed);
        b->kvc = xcalloc(R * e->rkv, sizeof(float), failed);
        b->oc = xcalloc(R * e->H * e->dv, sizeof(float), failed);
    }
    b->kvx = xcalloc(R * e->H * e->dkv, sizeof(float), failed);
    b->o = xcalloc(R * e->H * e->dv, sizeof(float), failed);
    b->tmp = xcalloc(R * e->d, sizeof(float), failed);
    b->a13 = xcalloc(R * 2 * (size_t)F, sizeof(float), failed);
    b->h = xcalloc(R * (size_t)F, sizeof(float), failed);
    b->z = xcalloc(R * e->E, sizeof(float), failed);
    b->s = xcalloc(R * e->E, sizeof(float), failed);
    b->g = xcalloc(RK, sizeof(float), failed);
    b->sel = xcalloc(RK, sizeof(int32_t), failed);
    b->offsets = xcalloc((size_t)e->E + 1, sizeof(int32_t), failed);
    b->gpos = xcalloc(RK, sizeof(int32_t), failed);
    b->token_of = xcalloc(RK, sizeof(int32_t), failed);
    b->xg = xcalloc(RK * e->d, sizeof(float), failed);
    b->ea13 = xcalloc(RK * 2 * e->de, sizeof(float), failed);
    b->eh = xcalloc(RK * e->de, sizeof(float), failed);
    b->yg = xcalloc(RK * e->d, sizeof(float), failed);
    b->logits = xcalloc(R * e->V, sizeof(float), failed);
    if (e->Lm) {
        b->mtp_e = xcalloc(R * e->d, sizeof(float), failed);
        b->mtp_h = xcalloc(R * e->d, sizeof(float), failed);
        b->mtp_cat = xcalloc(2 * R * e->d, sizeof(float), failed);
        b->mtp_rstd = xcalloc(2 * R, sizeof(float), failed);
    }
    if (e->m->cfg.n_dsa_layers > 0) {
        b->iq = xcalloc(R * e->HI * e->dI, sizeof(float), failed);
        b->ikz = xcalloc(R * e->dI, sizeof(float), failed);
        b->ik = xcalloc(R * e->dI, sizeof(float), failed);
        b->iw = xcalloc(R * e->HI, sizeof(float), failed);
        b->iscore = xcalloc((size_t)e->opt.max_len, sizeof(float), failed);
        b->dsel = xcalloc(R * e->opt.max_len, 1, failed);
    }
    if (e->m->cfg.use_mhc) {
        prl_mhc_shape sh = {.N = cap,
                            .n = e->n_streams,
                            .d = e->d,
                            .it = e->m->cfg.mhc_recur_norm,
                            .full = 1};
        size_t nd = (size_t)e->n_streams * e->d, n = (size_t)e->n_streams;
        b->xs = xcalloc(R * nd, sizeof(float), failed);
        b->xs2 = xcalloc(R * nd, sizeof(float), failed);
        b->hn = xcalloc(R * nd, sizeof(float), failed);
        b->hrstd = xcalloc(R, sizeof(float), failed);
        b->hm = xcalloc(R * prl_mhc_width(sh), sizeof(float), failed);
        b->pre = xcalloc(R * n, sizeof(float), failed);
        b->post = xcalloc(R * n, sizeof(float), failed);
        b->hS = xcalloc(R * prl_mhc_states(sh) * n * n, sizeof(float), failed);
    }
}

/* W8A8: room for the quantized inputs of the largest INT8 call or set on `cap` rows — an MoE
** layer's routed up or down projections (K rows a token), a dense MLP's, the query's or
** o_proj's (infer_matmul.c quantizes each into its own part). */
static void q8_scratch_alloc(prl_infer *e, int cap, int *failed)
{
    size_t K = e->K > 0 ? (size_t)e->K : 1, w = 0;
    size_t cand[] = {K * prl_q8_ld(e->d),
                     K * prl_q8_ld(e->de > 0 ? e->de : 1),
                     (size_t)prl_q8_ld(e->I),
                     (size_t)prl_q8_ld(e->rq > 0 ? e->rq : e->d),
                     (size_t)prl_q8_ld(e->H * e->dv),
                     (size_t)prl_q8_ld(e->d)};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) w = cand[i] > w ? cand[i] : w;
    e->q8x_cap = (size_t)cap * w, e->q8s_cap = (size_t)cap * K;
    e->q8x = xcalloc(e->q8x_cap, 1, failed);
    e->q8s = xcalloc(e->q8s_cap, sizeof(float), failed);
    (void)prl_q8_kernel_active(); /* chosen once here, before any pool thread asks */
}

static void rows_buf_free(rows_buf *b)
{
    void *ptrs[] = {
        b->tok,    b->slot, b->pos,   b->req,    b->x,       b->ln,      b->rstd,      b->zq,
        b->cq,     b->q,    b->kva,   b->ckv,    b->kr,      b->lat,     b->first_row, b->first_pos,
        b->zqc,    b->kvc,  b->oc,    b->kvx,    b->o,       b->tmp,     b->a13,       b->h,
        b->z,      b->s,    b->g,     b->sel,    b->offsets, b->gpos,    b->token_of,  b->xg,
        b->ea13,   b->eh,   b->yg,    b->logits, b->iq,      b->ikz,     b->ik,        b->iw,
        b->iscore, b->dsel, b->xs,    b->xs2,    b->hn,      b->hrstd,   b->hm,        b->pre,
        b->post,   b->hS,   b->mtp_e, b->mtp_h,  b->mtp_cat, b->mtp_rstd};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
    memset(b, 0, sizeof *b);
}

static prl_status check_options(const prl_model *m, prl_infer_options *o)
{
    int maxpos = m->cfg.max_position_embeddings;
    if (o->max_len == 0) o->max_len = maxpos;
    if (o->max_len < 2 || o->max_len > maxpos)
        return prl_error_set(PRL_ERR_ARG, "context %d not in [2, max_position_embeddings = %d]",
                             o->max_len, maxpos);
    if (o->max_batch < 1 || o->max_batch > 4096)
        return prl_error_set(PRL_ERR_ARG, "batch %d not in [1, 4096]", o->max_batch);
    if (o->spec_drafts < 0 || o->spec_drafts > m->cfg.num_nextn_predict_layers)
        return prl_error_set(PRL_ERR_ARG,
                             "speculative drafts %d not in [0, "
                             "num_nextn_predict_layers = %d] (one MTP module per draft)",
                             o->spec_drafts, m->cfg.num_nextn_predict_layers);
    if (o->spec_draft_vocab < 0 || o->spec_draft_vocab > m->cfg.vocab_size)
        return prl_error_set(PRL_ERR_ARG,
                             "draft vocabulary %d not in [0, vocab_size = %d] "
                             "(0 = the whole vocabulary)",
                             o->spec_draft_vocab, m->cfg.vocab_size);
    if (o->w8a8 & ~PRL_W8A8_ALL)
        return prl_error_set(PRL_ERR_ARG, "w8a8 module mask %#x has bits beyond %#x",
                             (unsigned)o->w8a8, (unsigned)PRL_W8A8_ALL);
    if (o->smooth && !o->w8a8)
        return prl_error_set(PRL_ERR_ARG, "SmoothQuant factors given without w8a8");
    if (o->w8a8 && o->precision != PRL_PRECISION_FP32)
        return prl_error_set(PRL_ERR_ARG, "w8a8 keeps activations in fp32: precision %s with w8a8",
                             prl_precision_name(o->precision));
    if ((unsigned)o->precision > PRL_PRECISION_FP16 || (unsigned)o->mla > PRL_MLA_NAIVE ||
        (unsigned)o->matmul > PRL_MATMUL_BLAS)
        return prl_error_set(PRL_ERR_ARG, "invalid infer options");
    return PRL_OK;
}

static prl_status fault_from_env(prl_infer *e);

/* Rows a per-sequence cache keeps beyond what its window needs: a verify pass feeds D + 1
** rows, and after a rollback the accepted prefix must still find every row its window
** reads (docs/infer.md "Rollback"). 0 without speculative decoding. */
static int spec_spare_rows(const prl_infer_options *o) { return o->spec_drafts; }

prl_status prl_infer_init(prl_infer **out, const prl_model *m, const prl_infer_options *opt)
{
    *out = NULL;
    prl_infer_options o = *opt;
    prl_status rc = check_options(m, &o);
    if (!rc && o.w8a8) rc = prl_q8_kernel_env_check();
    if (rc) return rc;
    prl_infer *e = calloc(1, sizeof *e);
    if (!e) return prl_error_set(PRL_ERR_NOMEM, "infer engine");
    infer__choose_gemv();
    const prl_config *c = &m->cfg;
    e->m = m;
    e->opt = o;
    e->V = c->vocab_size, e->d = c->hidden_size, e->L = c->num_hidden_layers;
    e->H = c->num_attention_heads, e->rq = c->q_lora_rank, e->rkv = c->kv_lora_rank;
    e->dn = c->qk_nope_head_dim, e->dr = c->qk_rope_head_dim, e->dv = c->v_head_dim;
    e->attn_scale = prl_config_softmax_scale(c);
    e->dq = e->dn + e->dr, e->dkv = e->dn + e->dv, e->I = c->intermediate_size;
    e->E = c->n_routed_experts, e->K = c->num_experts_per_tok, e->de = c->moe_intermediate_size;
    e->sde = c->n_shared_experts * c->moe_intermediate_size, e->n_moe = m->n_moe;
    e->lat = e->rkv + e->dr, e->ns = c->param_sink_number, e->ck = prl_config_conv_kernel(c);
    e->HI = c->index_n_heads, e->dI = c->index_head_dim;
    e->n_streams = prl_config_streams(c);
    e->Lm = o.spec_drafts > 0 ? c->num_nextn_predict_layers : 0;
    e->conv_hist = e->ck ? e->ck - 1 + spec_spare_rows(&o) : 0;
    int failed = 0, LL = e->L + e->Lm;
    if (c->use_mhc) {
        e->ones_buf = xcalloc((size_t)e->n_streams * e->d, sizeof(float), &failed);
        for (int i = 0; e->ones_buf && i < e->n_streams * e->d; i++) e->ones_buf[i] = 1;
        e->ones = e->ones_buf;
    }
    if (o.precision != PRL_PRECISION_FP32) e->wcopy = xcalloc(m->n_params, sizeof(float), &failed);
    e->lw = xcalloc((size_t)LL, sizeof *e->lw, &failed);
    for (int l = 0; l < LL && e->lw; l++) {
        e->lw[l].e13 = xcalloc((size_t)e->E, sizeof(lin), &failed);
        e->lw[l].e2 = xcalloc((size_t)e->E, sizeof(lin), &failed);
        e->lw[l].wuk_t = xcalloc((size_t)e->H * e->rkv * e->dn, sizeof(float), &failed);
        e->lw[l].sink_lat = xcalloc((size_t)e->ns * e->lat, sizeof(float), &failed);
        e->lw[l].sink_kv = xcalloc((size_t)e->ns * e->H * e->dkv, sizeof(float), &failed);
        for (int i = 0; i < 3 && e->ck && l < e->L; i++) /* no convs in MTP layers */
            e->lw[l].conv_state[i] =
                xcalloc((size_t)o.max_batch * e->conv_hist * infer__conv_channels(e, i) + 1,
                        sizeof(float), &failed);
    }
    /* cache rows per slot: the whole context, or a ring of W rows for a sliding-window layer */
    size_t lat_total = 0, kv_total = 0, idx_total = 0;
    for (int l = 0; l < LL && e->lw; l++) {
        layer_w *w = &e->lw[l];
        int ring = w->window = prl_config_window(c, l);
        ring += w->window > 0 ? spec_spare_rows(&o) : 0; /* rows a rollback may still need */
        w->cap = w->window > 0 && ring < o.max_len ? ring : o.max_len;
        /* DSA (trunk layers only, never a ring): the indexer keys of the whole context,
        ** position-indexed like cache_lat. Positions stay below max_len, a verify pass's
        ** draft rows included (spec_budget), so max_len rows hold the spare rows too and a
        ** rollback (slot length reset) leaves the keys of the accepted prefix in place. */
        w->dsa = l < e->L && prl_config_is_dsa(c, l);
        w->dsa_sparse = w->dsa && c->dsa_stage == PRL_DSA_SPARSE;
        w->idx_off = idx_total;
        w->slot_idx_floats = w->dsa ? (size_t)o.max_len * e->dI : 0;
        idx_total += (size_t)o.max_batch * w->slot_idx_floats;
        w->lat_off = lat_total, w->kv_off = kv_total;
        lat_total += (size_t)o.max_batch * w->cap * e->lat;
        kv_total += (size_t)o.max_batch * w->cap * e->H * e->dkv;
        /* what this layer adds to the buffers allocated below, per slot (prl_infer_kv_alloc) */
        w->slot_kv_floats =
            (size_t)w->cap * e->lat + (o.mla == PRL_MLA_NAIVE ? (size_t)w->cap * e->H * e->dkv : 0);
    }
    e->rope_cos = xcalloc((size_t)o.max_len * e->dr / 2, sizeof(float), &failed);
    e->rope_sin = xcalloc((size_t)o.max_len * e->dr / 2, sizeof(float), &failed);
    e->cache_lat = xcalloc(lat_total, sizeof(float), &failed);
    if (o.mla == PRL_MLA_NAIVE) e->cache_kv = xcalloc(kv_total, sizeof(float), &failed);
    if (idx_total) e->cache_idx = xcalloc(idx_total, sizeof(float), &failed);
    e->att_threads = prl_pool_threads() > 0 ? prl_pool_threads() : 1;
    /* naive: scores of a query block, then the gathered keys of a ring layer; absorbed:
    ** scores, absorbed queries, latent outputs, sink scores and outputs, the softmax
    ** statistics of the two parts, then the gathered latent rows of a ring layer */
    size_t naive_scratch =
        (size_t)PRL_ATT_BLOCK * (e->ns + o.max_len) + (size_t)o.max_len * (e->dkv + e->dr);
    size_t absorbed_scratch = (size_t)e->H * ((size_t)o.max_len + e->lat + 2 * e->rkv + e->ns + 2) +
                              (size_t)o.max_len * e->lat;
    e->att_scratch_per_thread = naive_scratch > absorbed_scratch ? naive_scratch : absorbed_scratch;
    e->att_scratch = xcalloc(e->att_scratch_per_thread * e->att_threads, sizeof(float), &failed);
    e->lin_jobs = xcalloc(2 * ((size_t)e->E + 1), sizeof *e->lin_jobs, &failed);
    int verify_rows = o.max_batch * (1 + o.spec_drafts);
    rows_buf_alloc(e, o.max_len > verify_rows ? o.max_len : verify_rows, &failed);
    if (o.w8a8) q8_scratch_alloc(e, e->rb.cap, &failed);
    e->slots = xcalloc((size_t)o.max_batch, sizeof *e->slots, &failed);
    for (int s = 0; s < o.max_batch && e->slots; s++) {
        slot_state *st = &e->slots[s];
        st->req = -1;
        st->routes =
            xcalloc((size_t)o.max_len * (e->n_moe ? e->n_moe : 1) * e->K, sizeof(int32_t), &failed);
        if (e->Lm == 0) continue;
        st->toks = xcalloc((size_t)o.max_len + o.spec_drafts + 1, sizeof(int32_t), &failed);
        st->hid = xcalloc((size_t)(1 + e->Lm) * o.max_len * e->d, sizeof(float), &failed);
        st->mtp_len = xcalloc((size_t)e->Lm, sizeof(int), &failed);
        st->draft = xcalloc((size_t)o.spec_drafts, sizeof(int32_t), &failed);
        st->q = xcalloc((size_t)o.spec_drafts * e->V, sizeof(double), &failed);
    }
    if (e->Lm) e->spec_p = xcalloc((size_t)(o.spec_drafts + 1) * e->V, sizeof(double), &failed);
    if (failed) {
        prl_infer_free(e);
        return prl_error_set(PRL_ERR_NOMEM, "infer engine for batch %d x context %d", o.max_batch,
                             o.max_len);
    }
    prl_rope_tables_scaled(e->rope_cos, e->rope_sin, o.max_len, e->dr, c->rope_theta,
                           &c->rope_scaling);
    if ((rc = bind_weights(e)) || (o.smooth && (rc = infer__apply_smooth(e, o.smooth))) ||
        (rc = fault_from_env(e))) {
        prl_infer_free(e);
        return rc;
    }
    *out = e;
    return PRL_OK;
}

void prl_infer_free(prl_infer *e)
{
    if (!e) return;
    for (int l = 0; e->lw && l < e->L + e->Lm; l++) {
        layer_w *w = &e->lw[l];
        lin_free(&w->eh_proj), lin_free(&w->own_head), lin_free(&w->draft_head);
        lin_free(&w->wq_a), lin_free_all(&w->wq_b), lin_free(&w->wkv_a), lin_free(&w->wkv_b);
        lin_free_all(&w->wo), lin_free_all(&w->w13), lin_free_all(&w->w2);
        lin_free(&w->router);
        lin_free(&w->ix_wq_b), lin_free(&w->ix_wk), lin_free(&w->ix_wproj);
        for (int x = 0; x < e->E && w->e13; x++) lin_free_all(&w->e13[x]), lin_free_all(&w->e2[x]);
        for (int h = 0; h < e->H && w->uk_bf; h++)
            prl_bf16w_free(&w->uk_bf[h]), prl_bf16w_free(&w->uv_bf[h]);
        free(w->uk_bf), free(w->uv_bf);
        free(w->e13), free(w->e2), free(w->wuk_t), free(w->sink_lat), free(w->sink_kv);
        for (int i = 0; i < 3; i++) free(w->conv_state[i]);
        lin_free(&w->hc_phi[0]), lin_free(&w->hc_phi[1]);
    }
    lin_free(&e->head), lin_free(&e->merge_phi);
    free(e->ones_buf);
    for (int s = 0; e->slots && s < e->opt.max_batch; s++) {
        slot_state *st = &e->slots[s];
        free(st->routes), free(st->toks), free(st->hid), free(st->mtp_len), free(st->draft);
        free(st->q);
    }
    free(e->spec_p);
    free(e->slots), free(e->lw), free(e->wcopy), free(e->rope_cos), free(e->rope_sin);
    free(e->cache_lat), free(e->cache_kv), free(e->cache_idx), free(e->att_scratch);
    free(e->lin_jobs), free(e->q8x), free(e->q8s);
    rows_buf_free(&e->rb);
    free(e);
}

static size_t kv_bytes_per_layer_token(const prl_infer *e)
{
    return ((size_t)e->lat + (e->opt.mla == PRL_MLA_NAIVE ? (size_t)e->H * e->dkv : 0)) *
           sizeof(float);
}

/* A DSA layer also caches its indexer key: d_I floats per token. */
static size_t idx_bytes_per_token(const prl_infer *e, int l)
{
    return e->lw[l].dsa ? (size_t)e->dI * sizeof(float) : 0;
}

size_t prl_infer_kv_bytes_per_token(const prl_infer *e)
{
    size_t bytes = 0;
    for (int l = 0; l < e->L; l++)
        if (e->lw[l].window == 0) bytes += kv_bytes_per_layer_token(e) + idx_bytes_per_token(e, l);
    return bytes;
}

size_t prl_infer_kv_bytes(const prl_infer *e, int n_tokens)
{
    size_t bytes = 0;
    for (int l = 0; l < e->L; l++) {
        int W = e->lw[l].window;
        bytes += (size_t)(W > 0 && W < n_tokens ? W : n_tokens) *
                 (kv_bytes_per_layer_token(e) + idx_bytes_per_token(e, l));
    }
    return bytes;
}

prl_kv_alloc prl_infer_kv_alloc(const prl_infer *e)
{
    prl_kv_alloc a = {0};
    for (int l = 0; l < e->L + e->Lm; l++) {
        const layer_w *w = &e->lw[l];
        size_t kv = w->slot_kv_floats * sizeof(float), ix = w->slot_idx_floats * sizeof(float);
        if (w->window > 0) a.ring += kv, a.n_ring++;
        else a.full += kv, a.n_full++;
        a.index += ix, a.n_dsa += w->dsa;
    }
    return a;
}

const prl_infer_options *prl_infer_get_options(const prl_infer *e) { return &e->opt; }

prl_spec_stats prl_infer_spec_stats(const prl_infer *e) { return e->spec; }

void prl_infer_set_hook(prl_infer *e, prl_tensor_hook hook, void *user)
{
    e->hook = hook;
    e->hook_user = user;
}

void prl_infer_hook_rows(const prl_infer *e, const int32_t **request, const int32_t **pos)
{
    if (request) *request = e->rb.req;
    if (pos) *pos = e->rb.pos;
}

prl_status prl_infer_set_fault(prl_infer *e, const char *name, double rel)
{
    e->fault_name[0] = 0;
    if (!name) return PRL_OK;
    static const char *const ops[] = {"attn.q",  "attn.kv_latent",    "attn.out",
                                      "mlp.out", "moe.router_logits", "moe.out"};
    int layer = -1, at = 0, ok = !strcmp(name, "final.logits");
    if (!ok && sscanf(name, "L%d.%n", &layer, &at) == 1 && at > 0 && layer >= 0 && layer < e->L)
        for (int i = 0; i < 6 && !ok; i++)
            ok = !strcmp(name + at, ops[i]) &&
                 (i < 3 || (i == 3) == (e->lw[layer].moe < 0)); /* mlp.out: dense layers only */
    if (!ok || strlen(name) >= sizeof e->fault_name)
        return prl_error_set(PRL_ERR_ARG,
                             "fault op '%s' is not an op of this model (L<layer>."
                             "attn.q|attn.kv_latent|attn.out|mlp.out|moe.router_logits|moe.out "
                             "with layer < %d, or final.logits)",
                             name, e->L);
    if (!isfinite(rel) || rel == 0)
        return prl_error_set(PRL_ERR_ARG, "fault size %g must be finite and non-zero", rel);
    snprintf(e->fault_name, sizeof e->fault_name, "%s", name);
    e->fault_rel = rel;
    return PRL_OK;
}

const char *prl_infer_fault(const prl_infer *e) { return e->fault_name[0] ? e->fault_name : NULL; }

/* PRL_INFER_FAULT="NAME:REL" (test-only; see infer.h). */
static prl_status fault_from_env(prl_infer *e)
{
    const char *v = getenv("PRL_INFER_FAULT");
    if (!v || !*v) return PRL_OK;
    const char *colon = strrchr(v, ':');
    char name[64], *end = NULL;
    double rel = colon ? strtod(colon + 1, &end) : 0;
    if (!colon || colon == v || (size_t)(colon - v) >= sizeof name || !end || end == colon + 1 ||
        *end)
        return prl_error_set(PRL_ERR_ARG,
                             "PRL_INFER_FAULT='%s': expected NAME:REL, e.g. "
                             "L2.attn.out:0.01",
                             v);
    snprintf(name, sizeof name, "%.*s", (int)(colon - v), v);
    prl_status rc = prl_infer_set_fault(e, name, rel);
    return rc ? prl_error_wrap(rc, "PRL_INFER_FAULT: ") : PRL_OK;
}

void infer__emit(const prl_infer *e, int layer, const char *what, const float *data, int rows,
                 int cols)
{
    if (!e->hook) return;
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "L%d.%s", layer, what);
    else snprintf(name, sizeof name, "%s", what);
    int64_t shape[2] = {rows, cols};
    e->hook(e->hook_user, name, data, 2, shape);
}

/* The test-only fault: where op `what` of `layer` is produced, scale it by (1 + rel) before
** anything reads it, so the error flows downstream as a real kernel bug would. */
void infer__fault(const prl_infer *e, int layer, const char *what, float *x, size_t n)
{
    if (!e->fault_name[0]) return;
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "L%d.%s", layer, what);
    else snprintf(name, sizeof name, "%s", what);
    if (strcmp(name, e->fault_name) != 0) return;
    float s = (float)(1.0 + e->fault_rel);
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
