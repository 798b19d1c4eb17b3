/*
** model_mtp.c — the train path's MTP modules after the trunk (spec §9.1–9.2), forward and
** backward: module k's shifted batch, its input op over h^{k−1} and the shared embedding
** (mtp.c), its plain decoder layer (the trunk's own code) and the shared head; the
** backward runs the modules last first and leaves ∂/∂h⁰ for the trunk.
*/
#include "engine/model_int.h"

#include <string.h>

/* ------------------------------------------------------------------ forward --------- */

/* The batch MTP module k trains on, over t's buffers: temperature 1, native routes, the
** trunk's loss scale (so its gradients are scaled like the trunk's). */
static prl_batch mtp_view(const prl_batch *b, const mtp_acts *t)
{
    return (prl_batch){.B = b->B,
                       .T = b->T,
                       .tokens = t->tokens,
                       .lens = t->lens,
                       .targets = t->targets,
                       .weights = t->weights,
                       .temperature = 1,
                       .loss_scale = b->loss_scale,
                       .pos = b->pos ? t->pos : NULL};
}

/* Fill t with the depth-(k+1) shift of b (k 0-based; prl_mtp_shift), weights scaled by λ/D,
** and return its view. */
static prl_batch mtp_batch(const prl_model *m, const prl_batch *b, int k, mtp_acts *t)
{
    const prl_config *c = &m->cfg;
    prl_mtp_shift(t->tokens, t->targets, t->weights, t->lens, b->tokens, b->targets, b->weights,
                  b->lens, b->B, b->T, k + 1, c->mtp_loss_weight / c->num_nextn_predict_layers,
                  b->pos, t->pos);
    return mtp_view(b, t);
}

/* The MTP modules after the trunk (spec §9.1–9.2): module k reads h^{k−1} (h⁰ = res_final,
** the merged trunk state before the final norm) and Emb(t_{i+k}), runs its plain decoder
** layer and the shared head. Adds λ/D·Σ_k Σ_i w·logp to st->mtp_loss. */
int model__mtp_forward(prl_model *m, const prl_batch *b, int moe_idx, expert_task *tasks,
                       prl_forward_stats *st)
{
    prl_acts *a = m->acts;
    const prl_config *c = &m->cfg;
    int N = a->N, d = c->hidden_size, V = c->vocab_size, stop = 0, unused = 0;
    const prl_real *h_prev = a->res_final;
    for (int k = 0; k < c->num_nextn_predict_layers && !stop; k++) {
        int l = c->num_hidden_layers + k;
        mtp_acts *t = &a->mtp[k];
        const layer_offsets *o = &a->lo[l];
        prl_batch bk = mtp_batch(m, b, k, t);
        prl_embedding_forward(t->emb, P(model__offs(m)->embed), t->tokens, N, d);
        prl_mtp_input_forward(a->layer[l].res_attn, t->cat, t->rstd_e, t->rstd_h, t->emb, h_prev,
                              P(o->enorm), P(o->hnorm), P(o->eh_proj), N, d, c->rms_norm_eps,
                              m->precision);
        int layer_moe = moe_idx; /* this layer's bias row, if it is a MoE layer */
        stop = model__layer_forward(m, l, &moe_idx, &bk, tasks, st, 1, t->h);
        if (prl_config_is_moe(c, l)) model__count_experts(m, &bk, layer_moe);
        /* the shared head rounds as the main head does (and as the infer path's drafts) */
        prl_rmsnorm_forward(t->ln, t->rstd, t->h, P(o->sh_norm), N, d, d, d, c->rms_norm_eps);
        model__rnd(m, t->ln, (size_t)N * d);
        prl_matmul_forward(t->logits, t->ln, P(o->sh_head), N, d, V, 0);
        model__rnd(m, t->logits, (size_t)N * V);
        stop = stop || model__emit(m, l, "mtp.logits", t->logits, N, V);
        logits_ctx lc = {.m = m, .b = &bk, .logits = t->logits, .lse = t->lse};
        prl_parallel_rows(N, model__logprob_rows, &lc);
        st->mtp_loss += model__weighted_logp(&bk, t->logits, t->lse, V, &unused);
        h_prev = t->h;
    }
    return stop;
}

/* ------------------------------------------------------------------ backward -------- */

/* Backward of an MTP layer's two sites (plain residual, sandwich norms when on): dx holds
** ∂/∂(the layer's output) and afterwards ∂/∂(its input). */
static void plain_layer_backward(prl_model *m, int l, const prl_batch *b, expert_task *tasks,
                                 prl_real *dx)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    int N = a->N, d = m->cfg.hidden_size;
    for (int site = 1; site >= 0; site--) {
        model__zero(a->dres, (size_t)N * d); /* ∂/∂(sublayer output) */
        if (m->cfg.sandwich_norm) {
            size_t g = site ? o->ln_pm : o->ln_pa;
            prl_rmsnorm_backward(a->dres, G(g), dx, la->sub[site], P(g), la->rstd_sub[site], N, d,
                                 d, d);
            model__rnd(m, a->dres, (size_t)N * d);
        } else {
            memcpy(a->dres, dx, (size_t)N * d * sizeof(prl_real));
        }
        if (site) model__ffn_backward(m, l, b, tasks, dx); /* dx keeps the residual's own path */
        else model__mla_backward(m, l, b, dx);
    }
}

/* Backward of mtp_forward, last module first: the head's loss gradient and the chain from
** the next module into h^k, the decoder layer, the input op (into the shared embedding and
** h^{k−1}). Leaves ∂/∂h⁰ in a->dh_mtp. */
void model__mtp_backward(prl_model *m, const prl_batch *b, expert_task *tasks)
{
    prl_acts *a = m->acts;
    const prl_config *c = &m->cfg;
    int N = a->N, d = c->hidden_size, V = c->vocab_size;
    size_t embed = model__offs(m)->embed;
    model__zero(a->dh_mtp, (size_t)N * d);
    for (int k = c->num_nextn_predict_layers - 1; k >= 0; k--) {
        int l = c->num_hidden_layers + k;
        mtp_acts *t = &a->mtp[k];
        const layer_offsets *o = &a->lo[l];
        prl_batch bk = mtp_view(b, t);
        logits_ctx dc = {.m = m, .b = &bk, .logits = t->logits, .lse = t->lse};
        prl_parallel_rows(N, model__dlogits_rows, &dc);
        model__rnd(m, a->dlogits, (size_t)N * V);
        model__zero(a->dln, (size_t)N * d);
        prl_matmul_backward(a->dln, G(o->sh_head), a->dlogits, t->ln, P(o->sh_head), N, d, V);
        model__rnd(m, a->dln, (size_t)N * d);
        prl_rmsnorm_backward(a->dh_mtp, G(o->sh_norm), a->dln, t->h, P(o->sh_norm), t->rstd, N, d,
                             d, d);
        model__rnd(m, a->dh_mtp, (size_t)N * d); /* ∂h^k: the head's path and the next module's */
        plain_layer_backward(m, l, &bk, tasks, a->dh_mtp); /* now ∂/∂(the input op's output) */
        const prl_real *h_prev = k ? a->mtp[k - 1].h : a->res_final;
        model__zero(a->dh_mtp2, (size_t)N * d), model__zero(a->demb_mtp, (size_t)N * d);
        prl_mtp_input_backward(a->demb_mtp, a->dh_mtp2, G(o->enorm), G(o->hnorm), G(o->eh_proj),
                               a->dcat_mtp, a->dh_mtp, t->cat, t->emb, h_prev, P(o->enorm),
                               P(o->hnorm), P(o->eh_proj), t->rstd_e, t->rstd_h, N, d,
                               m->precision);
        prl_embedding_backward(G(embed), a->demb_mtp, t->tokens, N, d);
        prl_real *swap = a->dh_mtp;
        a->dh_mtp = a->dh_mtp2, a->dh_mtp2 = swap;
    }
}
