/*
** model_attn.c — the train path's attention sublayer, forward and backward: MLA in the naive
** form (query and KV latents with their norms, RoPE, per-head keys and values), parameter
** sinks, the ModAttn convs on the latents and the heads' output, and the DSA lightning
** indexer of a DSA layer (its selection, its loss and its own backward, dsa.c).
*/
#include "engine/model_int.h"

#include <string.h>

/* ------------------------------------------------------------------ shape ----------- */

/* 1 when layer l's main attention runs over its DSA selection (a DSA layer, sparse stage). */
int model__dsa_sparse(const prl_model *m, int l)
{
    return prl_config_is_dsa(&m->cfg, l) && m->cfg.dsa_stage == PRL_DSA_SPARSE;
}

int model__dsa_k(const prl_model *m, int T)
{
    return m->cfg.index_topk < T ? m->cfg.index_topk : T;
}

/* Layer l's selection as row lists for the sparse kernel, or NULL when it runs masked (not
** the sparse stage, or the masked reference asked for). */
static int32_t *sparse_idx(const prl_model *m, int l)
{
    if (!model__dsa_sparse(m, l) || m->dsa_masked_reference || !m->acts->layer) return NULL;
    return m->acts->layer[l].dsa.idx;
}

/* The attention call of layer l for the current batch shape (window, sinks, selection) and
** batch b's packing (b NULL: none). */
prl_attn_shape model__attn_shape(const prl_model *m, int l, const prl_batch *b)
{
    dims D = model__dims_of(&m->cfg);
    const uint8_t *sel =
        model__dsa_sparse(m, l) && m->acts->layer ? m->acts->layer[l].dsa.sel : NULL;
    return (prl_attn_shape){.B = m->acts->B,
                            .T = m->acts->T,
                            .H = D.H,
                            .dn = D.dn,
                            .dr = D.dr,
                            .dv = D.dv,
                            .window = prl_config_window(&m->cfg, l),
                            .ns = D.ns,
                            .sel = sel,
                            .sel_idx = sparse_idx(m, l),
                            .sel_k = model__dsa_k(m, m->acts->T),
                            .pos = b ? b->pos : NULL,
                            .scale = prl_config_softmax_scale(&m->cfg)};
}

/* The indexer geometry of the current batch shape and batch b's packing. */
static prl_dsa_dims dsa_dims(const prl_model *m, const prl_batch *b)
{
    const prl_config *c = &m->cfg;
    return (prl_dsa_dims){.B = m->acts->B,
                          .T = m->acts->T,
                          .d = c->hidden_size,
                          .rq = c->q_lora_rank,
                          .HI = c->index_n_heads,
                          .dI = c->index_head_dim,
                          .dr = c->qk_rope_head_dim,
                          .topk = c->index_topk,
                          .pos = b->pos};
}

/* ------------------------------------------------------------------ forward --------- */

/* Parameter sinks of layer l: ĉ = RMSNorm(param_sink_compressed_kv; kv_a_layernorm), then
** [k_nope | v] = ĉ·kv_b_projᵀ per head, like a token's; zero without param_sink_with_value. */
static void sinks_forward(prl_model *m, int l)
{
    layer_acts *la = &m->acts->layer[l];
    const layer_offsets *o = &m->acts->lo[l];
    dims D = model__dims_of(&m->cfg);
    if (!m->cfg.param_sink_with_value) {
        memset(la->sink_kv, 0, (size_t)D.ns * D.H * D.dkv * sizeof(prl_real));
        return;
    }
    prl_rmsnorm_forward(la->sink_ckv, la->sink_rstd, P(o->sink_ckv), P(o->kv_norm), D.ns, D.rkv,
                        D.rkv, D.rkv, PRL_LATENT_NORM_EPS);
    model__rnd(m, la->sink_ckv, (size_t)D.ns * D.rkv);
    prl_matmul_forward(la->sink_kv, la->sink_ckv, P(o->wkv_b), D.ns, D.rkv, D.H * D.dkv, 0);
    model__rnd(m, la->sink_kv, (size_t)D.ns * D.H * D.dkv);
}

/* The indexer tensors of DSA layer l inside a parameter-layout block (params or grads). */
static prl_dsa_weights dsa_weights(const prl_model *m, prl_real *base, int l)
{
    const layer_offsets *o = &m->acts->lo[l];
    return (prl_dsa_weights){.wq_b = base + o->ix_wq_b,
                             .wk = base + o->ix_wk,
                             .k_norm = base + o->ix_k_norm,
                             .wproj = base + o->ix_wproj};
}

/* A latent of C channels (rows of z at z_stride) through ModAttn and its norm:
** y = RMSNorm(zc; g) with zc = z + conv(z) when the convs are on (saved), else z; the conv
** restarts at the boundaries of packed rows (pos, prl_batch.pos). */
static void latent_forward(prl_model *m, prl_real *y, prl_real *rstd, const prl_real *z,
                           int z_stride, prl_real *zc, size_t g, size_t conv, int C,
                           const int32_t *pos)
{
    prl_acts *a = m->acts;
    int ck = conv ? prl_config_conv_kernel(&m->cfg) : 0; /* offset 0: no conv (MTP layer) */
    if (ck) {
        prl_conv_forward(zc, z, z_stride, P(conv), a->B, a->T, C, ck, pos);
        model__rnd(m, zc, (size_t)a->N * C);
        z = zc, z_stride = C;
    }
    prl_rmsnorm_forward(y, rstd, z, P(g), a->N, C, z_stride, C, PRL_LATENT_NORM_EPS);
    model__rnd(m, y, (size_t)a->N * C);
}

/* MLA in the naive form: a = ln_a (N,d) → o (N,H·dv), and tmp = o·Woᵀ. */
int model__mla_forward(prl_model *m, int l, const prl_batch *b)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = model__dims_of(&m->cfg);
    int N = a->N;
    size_t nq = (size_t)N * D.H * D.dq;
    if (D.rq > 0) { /* the query latent */
        prl_matmul_forward(la->zq, la->ln_a, P(o->wq_a), N, D.d, D.rq, 0);
        model__rnd(m, la->zq, (size_t)N * D.rq);
        latent_forward(m, la->cq, la->rstd_q, la->zq, D.rq, la->zqc, o->q_norm, o->qa_conv, D.rq,
                       b->pos);
        prl_matmul_forward(la->q, la->cq, P(o->wq_b), N, D.rq, D.H * D.dq, 0);
    } else {
        prl_matmul_forward(la->q, la->ln_a, P(o->wq_b), N, D.d, D.H * D.dq, 0);
    }
    model__rnd(m, la->q, nq);
    prl_rope_packed(la->q, a->rope_cos, a->rope_sin, b->pos, N, a->T, D.H, D.dq, D.dn, D.H * D.dq,
                    D.dr, m->cfg.rope_interleave, 1);
    model__rnd(m, la->q, nq);
    prl_matmul_forward(la->kva, la->ln_a, P(o->wkv_a), N, D.d, D.rkv + D.dr, 0);
    model__rnd(m, la->kva, (size_t)N * (D.rkv + D.dr));
    latent_forward(m, la->ckv, la->rstd_kv, la->kva, D.rkv + D.dr, la->kvc, o->kv_norm, o->kv_conv,
                   D.rkv, b->pos); /* the compressed KV only: its rope part is untouched */
    for (int n = 0; n < N; n++)
        memcpy(la->kr + (size_t)n * D.dr, la->kva + (size_t)n * (D.rkv + D.dr) + D.rkv,
               (size_t)D.dr * sizeof(prl_real));
    prl_rope_packed(la->kr, a->rope_cos, a->rope_sin, b->pos, N, a->T, 1, D.dr, 0, D.dr, D.dr,
                    m->cfg.rope_interleave, 1);
    model__rnd(m, la->kr, (size_t)N * D.dr);
    prl_matmul_forward(la->kv, la->ckv, P(o->wkv_b), N, D.rkv, D.H * D.dkv, 0);
    model__rnd(m, la->kv, (size_t)N * D.H * D.dkv);
    if (D.ns > 0) sinks_forward(m, l);
    int dsa = prl_config_is_dsa(&m->cfg, l);
    if (dsa) { /* the indexer picks each row's keys before the main attention reads them */
        prl_dsa_weights w = dsa_weights(m, P(0), l); /* rounded, as the infer path reads them */
        prl_dsa_forward(&la->dsa, &w, la->ln_a, la->cq, a->rope_cos, a->rope_sin, b->lens,
                        dsa_dims(m, b), model__dsa_sparse(m, l) && !m->dsa_keep_selection,
                        m->precision);
        if (sparse_idx(m, l)) /* kept selections too: the lists follow the mask in use */
            prl_attn_sel_index(la->dsa.idx, la->dsa.sel, N, a->T, model__dsa_k(m, a->T));
    }
    prl_attention_forward(la->o, la->att, la->q, la->kv, la->kr, la->sink_kv,
                          D.ns > 0 ? P(o->sink_kpe) : NULL, b->lens, model__attn_shape(m, l, b));
    model__rnd(m, la->o, (size_t)N * D.H * D.dv);
    if (dsa)
        a->index_loss +=
            prl_dsa_loss_forward(&la->dsa, la->att, D.H, D.ns, model__dsa_sparse(m, l),
                                 sparse_idx(m, l), model__dsa_k(m, a->T), b->lens, dsa_dims(m, b));
    const prl_real *o_out = la->o;
    if (D.ck && o->o_conv) { /* ModAttn on the heads' output, before o_proj (not in MTP) */
        prl_conv_forward(la->oc, la->o, D.H * D.dv, P(o->o_conv), a->B, a->T, D.H * D.dv, D.ck,
                         b->pos);
        model__rnd(m, la->oc, (size_t)N * D.H * D.dv);
        o_out = la->oc;
    }
    prl_matmul_forward(a->tmp, o_out, P(o->wo), N, D.H * D.dv, D.d, 0);
    model__rnd(m, a->tmp, (size_t)N * D.d);
    int stop = model__emit(m, l, "attn.q", la->q, N, (int64_t)D.H * D.dq);
    stop = stop || model__emit(m, l, "attn.kv_latent", la->ckv, N, D.rkv);
    stop = stop || model__emit(m, l, "attn.out", a->tmp, N, D.d);
    return stop;
}

/* ------------------------------------------------------------------ backward -------- */

/* Backward of latent_forward: dz (rows at z_stride) += ∂/∂z given dy = ∂/∂y; the gain and
** kernel gradients accumulate. */
static void latent_backward(prl_model *m, prl_real *dz, const prl_real *dy, const prl_real *z,
                            int z_stride, const prl_real *zc, const prl_real *rstd, size_t g,
                            size_t conv, int C, const int32_t *pos)
{
    prl_acts *a = m->acts;
    int ck = conv ? prl_config_conv_kernel(&m->cfg) : 0, N = a->N; /* as latent_forward */
    if (!ck) {
        prl_rmsnorm_backward(dz, G(g), dy, z, P(g), rstd, N, C, z_stride, C);
        return;
    }
    model__zero(a->dconv, (size_t)N * C);
    prl_rmsnorm_backward(a->dconv, G(g), dy, zc, P(g), rstd, N, C, C, C);
    model__rnd(m, a->dconv, (size_t)N * C);
    prl_conv_backward(dz, z_stride, G(conv), a->dconv, z, P(conv), a->B, a->T, C, ck, pos);
}

/* The sinks' latent: dsink_kv (∂/∂ their [k_nope | v]) through kv_b_proj and the norm. */
static void sinks_backward(prl_model *m, int l)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = model__dims_of(&m->cfg);
    if (D.ns == 0 || !m->cfg.param_sink_with_value) return;
    model__zero(a->dsink_ckv, (size_t)D.ns * D.rkv);
    prl_matmul_backward(a->dsink_ckv, G(o->wkv_b), a->dsink_kv, la->sink_ckv, P(o->wkv_b), D.ns,
                        D.rkv, D.H * D.dkv);
    model__rnd(m, a->dsink_ckv, (size_t)D.ns * D.rkv);
    prl_rmsnorm_backward(G(o->sink_ckv), G(o->kv_norm), a->dsink_ckv, P(o->sink_ckv), P(o->kv_norm),
                         la->sink_rstd, D.ns, D.rkv, D.rkv, D.rkv);
}

/* Attention sublayer: dres holds ∂/∂(its output); adds the path through MLA and ln1 into dx
** (∂/∂res_attn; the plain residual passes dres itself). */
void model__mla_backward(prl_model *m, int l, const prl_batch *b, prl_real *dx)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = model__dims_of(&m->cfg);
    int N = a->N;
    int HV = D.H * D.dv;
    prl_real *do_att = a->do_; /* ∂/∂(attention output) */
    model__zero(a->do_, (size_t)N * HV);
    if (D.ck && o->o_conv) { /* through o_conv: a->do_ is ∂/∂oc first */
        prl_matmul_backward(a->do_, G(o->wo), a->dres, la->oc, P(o->wo), N, HV, D.d);
        model__rnd(m, a->do_, (size_t)N * HV);
        model__zero(a->dconv, (size_t)N * HV);
        prl_conv_backward(a->dconv, HV, G(o->o_conv), a->do_, la->o, P(o->o_conv), a->B, a->T, HV,
                          D.ck, b->pos);
        do_att = a->dconv;
    } else {
        prl_matmul_backward(a->do_, G(o->wo), a->dres, la->o, P(o->wo), N, HV, D.d);
    }
    model__rnd(m, do_att, (size_t)N * HV);
    model__zero(a->dq, (size_t)N * D.H * D.dq);
    model__zero(a->dkv, (size_t)N * D.H * D.dkv);
    model__zero(a->dkr, (size_t)N * D.dr);
    model__zero(a->dsink_kv, (size_t)D.ns * D.H * D.dkv);
    prl_attention_backward(a->dq, a->dkv, a->dkr, a->dsink_kv, D.ns > 0 ? G(o->sink_kpe) : NULL,
                           do_att, la->att, la->q, la->kv, la->kr, la->sink_kv,
                           D.ns > 0 ? P(o->sink_kpe) : NULL, a->dattn_scratch, b->lens,
                           model__attn_shape(m, l, b));
    model__rnd(m, a->dq, (size_t)N * D.H * D.dq);
    model__rnd(m, a->dkv, (size_t)N * D.H * D.dkv);
    model__rnd(m, a->dkr, (size_t)N * D.dr);
    model__rnd(m, a->dsink_kv, (size_t)D.ns * D.H * D.dkv);
    sinks_backward(m, l);
    model__zero(a->dckv, (size_t)N * D.rkv);
    prl_matmul_backward(a->dckv, G(o->wkv_b), a->dkv, la->ckv, P(o->wkv_b), N, D.rkv, D.H * D.dkv);
    model__rnd(m, a->dckv, (size_t)N * D.rkv);
    prl_rope_packed(a->dkr, a->rope_cos, a->rope_sin, b->pos, N, a->T, 1, D.dr, 0, D.dr, D.dr,
                    m->cfg.rope_interleave, -1);
    int wa = D.rkv + D.dr;
    model__zero(a->dkva, (size_t)N * wa);
    latent_backward(m, a->dkva, a->dckv, la->kva, wa, la->kvc, la->rstd_kv, o->kv_norm, o->kv_conv,
                    D.rkv, b->pos);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < D.dr; i++)
            a->dkva[(size_t)n * wa + D.rkv + i] += a->dkr[(size_t)n * D.dr + i];
    model__rnd(m, a->dkva, (size_t)N * wa);
    model__zero(a->dln, (size_t)N * D.d);
    prl_matmul_backward(a->dln, G(o->wkv_a), a->dkva, la->ln_a, P(o->wkv_a), N, D.d, wa);
    prl_rope_packed(a->dq, a->rope_cos, a->rope_sin, b->pos, N, a->T, D.H, D.dq, D.dn, D.H * D.dq,
                    D.dr, m->cfg.rope_interleave, -1);
    model__rnd(m, a->dq, (size_t)N * D.H * D.dq);
    if (D.rq > 0) {
        model__zero(a->dcq, (size_t)N * D.rq);
        prl_matmul_backward(a->dcq, G(o->wq_b), a->dq, la->cq, P(o->wq_b), N, D.rq, D.H * D.dq);
        model__rnd(m, a->dcq, (size_t)N * D.rq);
        model__zero(a->dzq, (size_t)N * D.rq);
        latent_backward(m, a->dzq, a->dcq, la->zq, D.rq, la->zqc, la->rstd_q, o->q_norm, o->qa_conv,
                        D.rq, b->pos);
        model__rnd(m, a->dzq, (size_t)N * D.rq);
        prl_matmul_backward(a->dln, G(o->wq_a), a->dzq, la->ln_a, P(o->wq_a), N, D.d, D.rq);
    } else {
        prl_matmul_backward(a->dln, G(o->wq_b), a->dq, la->ln_a, P(o->wq_b), N, D.d, D.H * D.dq);
    }
    model__rnd(m, a->dln, (size_t)N * D.d);
    prl_rmsnorm_backward(dx, G(o->ln1), a->dln, la->res_attn, P(o->ln1), la->rstd_a, N, D.d, D.d,
                         D.d);
    model__rnd(m, dx, (size_t)N * D.d);
}

/* The indexers' own objective: its gradient reaches only the indexer tensors (its input is
** detached, docs/model.md DSA), so it runs apart from the LM backward. */
void model__dsa_backward(prl_model *m, const prl_batch *b)
{
    prl_acts *a = m->acts;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (!prl_config_is_dsa(&m->cfg, l)) continue;
        layer_acts *la = &a->layer[l];
        prl_dsa_weights w = dsa_weights(m, P(0), l), g = dsa_weights(m, m->grads, l);
        prl_dsa_backward(&g, &a->dsa_scratch, &la->dsa, &w, la->ln_a, la->cq, a->rope_cos,
                         a->rope_sin, model__dsa_sparse(m, l), b->lens, dsa_dims(m, b),
                         m->precision);
    }
}
