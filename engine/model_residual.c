/*
** model_residual.c — the train path's residual glue beyond a plain pre-norm sum, forward and
** backward: mHC streams (each site's hc_pre and hc_post, the embedding copied into every
** stream, the merge head), sandwich post-norms and block post-norms (docs/model.md "Residual
** streams"); the plain residual sum too. Off, the model runs exactly the plain path.
*/
#include "engine/model_int.h"

#include <string.h>

/* ------------------------------------------------------------------ residual glue --- */

/* The residual beyond a plain pre-norm sum: mHC streams, sandwich norms or block post-norms
** (docs/model.md "Residual streams"). Off, the model runs exactly the plain path. */
int model__residual_glue(const prl_config *c)
{
    return c->use_mhc || c->sandwich_norm || c->n_block_post_layernorm_idx > 0;
}

/* mHC streams through layer l: the trunk's layers with use_mhc; never an MTP layer, whose
** decoder layer keeps the ordinary residual (spec §9.2). */
int model__layer_mhc(const prl_model *m, int l)
{
    return m->cfg.use_mhc && l < m->cfg.num_hidden_layers;
}

prl_mhc_shape model__site_shape(const prl_model *m, int full)
{
    return (prl_mhc_shape){.N = m->acts->N,
                           .n = m->cfg.mhc_num_stream,
                           .d = m->cfg.hidden_size,
                           .it = m->cfg.mhc_recur_norm,
                           .full = full};
}

/* ------------------------------------------------------------------ forward --------- */

/* out = x + y over rows of width d */
static void add_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    size_t d = (size_t)c->D.d;
    for (size_t i = (size_t)r0 * d; i < (size_t)r1 * d; i++) c->out[i] = c->x[i] + c->y[i];
    model__rnd(c->m, c->out + (size_t)r0 * d, (size_t)(r1 - r0) * d);
}

static void residual_add(prl_model *m, prl_real *out, const prl_real *x, const prl_real *y)
{
    token_ctx c = {.m = m, .D = model__dims_of(&m->cfg), .out = out, .x = x, .y = y};
    prl_parallel_rows(m->acts->N, add_rows, &c);
}

/* The parameters of an mHC module at offsets off[4] (γ = 1 without mhc_use_gamma). */
static prl_mhc_params mhc_params(const prl_model *m, const size_t off[4])
{
    return (prl_mhc_params){.phi = P(off[0]),
                            .gamma = m->cfg.mhc_use_gamma ? P(off[1]) : m->acts->ones,
                            .alpha = P(off[2]),
                            .beta = P(off[3])};
}

static prl_mhc_grads mhc_grads(const prl_model *m, const size_t off[4])
{
    return (prl_mhc_grads){.dphi = G(off[0]),
                           .dgamma = m->cfg.mhc_use_gamma ? G(off[1]) : m->acts->dgamma_sink,
                           .dalpha = G(off[2]),
                           .dbeta = G(off[3])};
}

/* The residual stream(s) entering site `site` (0 attention, 1 FFN) of layer l: the mHC
** streams [N, n·d], else the plain residual, which is itself the sublayer's input. */
prl_real *model__site_stream(const prl_model *m, int l, int site)
{
    layer_acts *la = &m->acts->layer[l];
    if (model__layer_mhc(m, l)) return la->xs[site];
    return site ? la->res_ffn : la->res_attn;
}

/* Where the stream after layer l goes: the next layer's attention site, or the final one. */
prl_real *model__layer_out_stream(const prl_model *m, int l)
{
    if (l + 1 < m->cfg.num_hidden_layers) return model__site_stream(m, l + 1, 0);
    return m->cfg.use_mhc ? m->acts->xs_final : m->acts->res_final;
}

/* hc_pre of a site: its coefficients and the sublayer input res_attn / res_ffn. */
void model__site_enter(prl_model *m, int l, int site)
{
    if (!model__layer_mhc(m, l)) return;
    layer_acts *la = &m->acts->layer[l];
    prl_mhc_shape sh = model__site_shape(m, 1);
    prl_mhc_params p = mhc_params(m, m->acts->lo[l].hc[site]);
    prl_real *x_in = site ? la->res_ffn : la->res_attn;
    prl_mhc_site_forward(&la->hc[site], la->xs[site], &p, m->cfg.rms_norm_eps, sh, m->precision);
    prl_mhc_pre_forward(x_in, la->xs[site], la->hc[site].pre, sh);
    model__rnd(m, x_in, (size_t)sh.N * sh.d);
}

/* The sublayer's output (tmp) back into the residual, as `next`: sandwich post-norm, then
** hc_post (mHC) or the plain sum; then the block post-norm after a listed layer's FFN. */
void model__site_leave(prl_model *m, int l, int site, prl_real *next)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    const prl_config *c = &m->cfg;
    int N = a->N, d = c->hidden_size, S = prl_config_streams(c) * d;
    int block_post = site == 1 && prl_config_block_post_norm(c, l);
    prl_real *out = block_post ? la->bp_in : next;
    const prl_real *F = a->tmp;
    if (model__residual_glue(c)) {
        if (c->sandwich_norm) {
            memcpy(la->sub[site], a->tmp, (size_t)N * d * sizeof(prl_real));
            prl_rmsnorm_forward(la->F[site], la->rstd_sub[site], la->sub[site],
                                P(site ? o->ln_pm : o->ln_pa), N, d, d, d, c->rms_norm_eps);
            model__rnd(m, la->F[site], (size_t)N * d);
        } else {
            memcpy(la->F[site], a->tmp, (size_t)N * d * sizeof(prl_real));
        }
        F = la->F[site];
    }
    if (model__layer_mhc(m, l)) {
        prl_mhc_shape sh = model__site_shape(m, 1);
        int ns = prl_mhc_states(sh), n2 = sh.n * sh.n;
        prl_mhc_post_forward(out, F, la->xs[site], la->hc[site].post,
                             la->hc[site].S + (size_t)(ns - 1) * n2, ns * n2, sh);
        model__rnd(m, out, (size_t)N * S);
    } else {
        residual_add(m, out, model__site_stream(m, l, site), F); /* rounds */
    }
    if (block_post) {
        prl_rmsnorm_forward(next, la->rstd_bp, la->bp_in, P(o->ln_bp), N, S, S, S, c->rms_norm_eps);
        model__rnd(m, next, (size_t)N * S);
    }
}

/* Model start and end of the streams: the embedding copied into every stream, and the
** merge head (hc_pre only) into res_final before the final norm. */
void model__streams_begin(prl_model *m)
{
    if (!m->cfg.use_mhc) return;
    prl_acts *a = m->acts;
    int n = m->cfg.mhc_num_stream, d = m->cfg.hidden_size;
    for (int t = 0; t < a->N; t++)
        for (int i = 0; i < n; i++)
            memcpy(a->layer[0].xs[0] + ((size_t)t * n + i) * d,
                   a->layer[0].res_attn + (size_t)t * d, (size_t)d * sizeof(prl_real));
}

void model__streams_end(prl_model *m)
{
    if (!m->cfg.use_mhc) return;
    prl_acts *a = m->acts;
    prl_mhc_shape sh = model__site_shape(m, 0);
    prl_mhc_params p = mhc_params(m, model__offs(m)->merge);
    prl_mhc_site_forward(&a->hc_merge, a->xs_final, &p, m->cfg.rms_norm_eps, sh, m->precision);
    prl_mhc_pre_forward(a->res_final, a->xs_final, a->hc_merge.pre, sh);
    model__rnd(m, a->res_final, (size_t)sh.N * sh.d);
}

/* ------------------------------------------------------------------ backward -------- */

static void swap_dxs(prl_acts *a)
{
    prl_real *t = a->dxs;
    a->dxs = a->dxs2;
    a->dxs2 = t;
}

/* Backward of site_leave and the sublayer and site_enter: a->dxs holds ∂/∂(the stream after
** the site) and afterwards ∂/∂(the stream before it). */
static void site_backward(prl_model *m, int l, int site, const prl_batch *b, expert_task *tasks)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    const prl_config *c = &m->cfg;
    int N = a->N, d = c->hidden_size, S = prl_config_streams(c) * d;
    size_t Nd = (size_t)N * d;
    prl_mhc_shape sh = model__site_shape(m, 1);
    int ns = prl_mhc_states(sh), n2 = sh.n * sh.n;
    const prl_real *dF = a->dxs; /* ∂/∂F: the plain residual passes the stream's gradient */
    if (c->use_mhc) {
        model__zero(a->dxs2, (size_t)N * S), model__zero(a->dxin, Nd);
        model__zero(a->dpost, (size_t)N * sh.n), model__zero(a->dH, (size_t)N * n2);
        prl_mhc_post_backward(a->dxin, a->dxs2, a->dpost, a->dH, a->dxs, la->F[site], la->xs[site],
                              la->hc[site].post, la->hc[site].S + (size_t)(ns - 1) * n2, ns * n2,
                              sh);
        model__rnd(m, a->dxin, Nd); /* F is a rounded output (sandwich norm or sublayer) */
        dF = a->dxin;
    } else {
        memcpy(a->dxs2, a->dxs, (size_t)N * S * sizeof(prl_real));
    }
    model__zero(a->dres, Nd); /* ∂/∂(sublayer output) */
    if (c->sandwich_norm) {
        size_t g = site ? o->ln_pm : o->ln_pa;
        prl_rmsnorm_backward(a->dres, G(g), dF, la->sub[site], P(g), la->rstd_sub[site], N, d, d,
                             d);
        model__rnd(m, a->dres, Nd);
    } else {
        memcpy(a->dres, dF, Nd * sizeof(prl_real));
    }
    model__zero(a->dxin, Nd); /* ∂/∂(sublayer input) */
    if (site) model__ffn_backward(m, l, b, tasks, a->dxin);
    else model__mla_backward(m, l, b, a->dxin);
    if (c->use_mhc) {
        model__zero(a->dpre, (size_t)N * sh.n);
        prl_mhc_pre_backward(a->dxs2, a->dpre, a->dxin, la->xs[site], la->hc[site].pre, sh);
        prl_mhc_params p = mhc_params(m, o->hc[site]);
        prl_mhc_grads g = mhc_grads(m, o->hc[site]);
        prl_mhc_site_backward(a->dxs2, &g, a->hc_scratch, a->dpre, a->dpost, a->dH, &la->hc[site],
                              la->xs[site], &p, sh, m->precision);
    } else {
        for (size_t i = 0; i < Nd; i++) a->dxs2[i] += a->dxin[i];
    }
    model__rnd(m, a->dxs2, (size_t)N * S); /* the stream before the site, all its paths summed */
    swap_dxs(a);
}

/* Backward of the layers with the residual glue on: a->dres holds ∂/∂res_final; afterwards
** ∂/∂(the embedding rows), summed over the streams in order. */
void model__residual_backward(prl_model *m, const prl_batch *b, expert_task *tasks)
{
    prl_acts *a = m->acts;
    const prl_config *c = &m->cfg;
    int N = a->N, d = c->hidden_size, n = prl_config_streams(c), S = n * d;
    if (c->use_mhc) { /* the merge head */
        prl_mhc_shape sh = model__site_shape(m, 0);
        prl_mhc_params p = mhc_params(m, model__offs(m)->merge);
        prl_mhc_grads g = mhc_grads(m, model__offs(m)->merge);
        model__zero(a->dxs, (size_t)N * S), model__zero(a->dpre, (size_t)N * n);
        prl_mhc_pre_backward(a->dxs, a->dpre, a->dres, a->xs_final, a->hc_merge.pre, sh);
        prl_mhc_site_backward(a->dxs, &g, a->hc_scratch, a->dpre, NULL, NULL, &a->hc_merge,
                              a->xs_final, &p, sh, m->precision);
        model__rnd(m, a->dxs, (size_t)N * S);
    } else {
        memcpy(a->dxs, a->dres, (size_t)N * d * sizeof(prl_real));
    }
    for (int l = c->num_hidden_layers - 1; l >= 0; l--) {
        layer_acts *la = &a->layer[l];
        if (prl_config_block_post_norm(c, l)) {
            size_t g = a->lo[l].ln_bp;
            model__zero(a->dxs2, (size_t)N * S);
            prl_rmsnorm_backward(a->dxs2, G(g), a->dxs, la->bp_in, P(g), la->rstd_bp, N, S, S, S);
            model__rnd(m, a->dxs2, (size_t)N * S);
            swap_dxs(a);
        }
        site_backward(m, l, 1, b, tasks);
        site_backward(m, l, 0, b, tasks);
    }
    for (int t = 0; t < N; t++) /* every stream started as the embedding */
        for (int k = 0; k < d; k++) {
            prl_real s = a->dxs[(size_t)t * S + k];
            for (int i = 1; i < n; i++) s += a->dxs[(size_t)t * S + (size_t)i * d + k];
            a->dres[(size_t)t * d + k] = s;
        }
    if (n > 1) /* as the plain path's gradient at the embedding */
        model__rnd(m, a->dres, (size_t)N * d);
}
