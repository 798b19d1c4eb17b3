/*
** model_acts.c — the train path's saved activations and backward scratch: every buffer a
** forward saves for its backward and every gradient scratch the backward uses, carved out of
** one allocation sized for the batch shape (B, T) of the last forward (a block big enough is
** reused as is). Two passes of the same code: the first counts, the second points.
*/
#include "engine/model_int.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ activations ----- */

/* Carves named buffers out of one allocation: first pass counts, second pass points. */
typedef struct carver {
    char *base;
    size_t used;
} carver;

static void *carve(carver *c, size_t bytes)
{
    size_t at = (c->used + 63) & ~(size_t)63;
    c->used = at + bytes;
    return c->base ? c->base + at : NULL;
}
#define CARVE_R(c, n) ((prl_real *)carve((c), (size_t)(n) * sizeof(prl_real)))
#define CARVE_I(c, n) ((int32_t *)carve((c), (size_t)(n) * sizeof(int32_t)))

/* The saved activations of a DSA layer's indexer (dsa.h). */
static void carve_dsa(carver *cv, prl_dsa_acts *x, size_t N, size_t T, size_t K, const dims *D)
{
    x->qI = CARVE_R(cv, N * D->HI * D->dI);
    x->kz = CARVE_R(cv, N * D->dI);
    x->kI = CARVE_R(cv, N * D->dI);
    x->krstd = CARVE_R(cv, N);
    x->w = CARVE_R(cv, N * D->HI);
    x->score = CARVE_R(cv, N * T);
    x->target = CARVE_R(cv, N * T);
    x->sel = carve(cv, N * T);
    x->idx = CARVE_I(cv, N * K);
}

static void carve_mhc_saved(carver *cv, prl_mhc_saved *sv, prl_mhc_shape s)
{
    size_t N = (size_t)s.N, n = (size_t)s.n;
    sv->h = CARVE_R(cv, N * n * s.d);
    sv->rstd = CARVE_R(cv, N);
    sv->m = CARVE_R(cv, N * prl_mhc_width(s));
    sv->pre = CARVE_R(cv, N * n);
    if (s.full) {
        sv->post = CARVE_R(cv, N * n);
        sv->S = CARVE_R(cv, N * prl_mhc_states(s) * n * n);
    }
}

static void carve_residual_layer(prl_model *m, carver *cv, int l)
{
    const prl_config *c = &m->cfg;
    layer_acts *la = &m->acts->layer[l];
    size_t N = (size_t)m->acts->N, d = (size_t)c->hidden_size, S = prl_config_streams(c) * d;
    if (!model__residual_glue(c)) return;
    for (int site = 0; site < 2; site++) {
        if (model__layer_mhc(m, l)) {
            la->xs[site] = CARVE_R(cv, N * S);
            carve_mhc_saved(cv, &la->hc[site], model__site_shape(m, 1));
        }
        if (c->sandwich_norm) {
            la->sub[site] = CARVE_R(cv, N * d);
            la->rstd_sub[site] = CARVE_R(cv, N);
        }
        la->F[site] = CARVE_R(cv, N * d);
    }
    if (prl_config_block_post_norm(c, l)) {
        la->bp_in = CARVE_R(cv, N * S);
        la->rstd_bp = CARVE_R(cv, N);
    }
}

static void carve_residual_model(prl_model *m, carver *cv)
{
    const prl_config *c = &m->cfg;
    prl_acts *a = m->acts;
    size_t N = (size_t)a->N, n = (size_t)c->mhc_num_stream,
           S = prl_config_streams(c) * (size_t)c->hidden_size;
    if (!model__residual_glue(c)) return;
    a->dxs = CARVE_R(cv, N * S);
    a->dxs2 = CARVE_R(cv, N * S);
    a->dxin = CARVE_R(cv, N * c->hidden_size);
    if (!c->use_mhc) return;
    a->xs_final = CARVE_R(cv, N * S);
    carve_mhc_saved(cv, &a->hc_merge, model__site_shape(m, 0));
    a->ones = CARVE_R(cv, S);
    a->dgamma_sink = CARVE_R(cv, S);
    a->dpre = CARVE_R(cv, N * n);
    a->dpost = CARVE_R(cv, N * n);
    a->dH = CARVE_R(cv, N * n * n);
    a->hc_scratch = CARVE_R(cv, prl_mhc_site_scratch(model__site_shape(m, 1)));
    if (a->ones)
        for (size_t i = 0; i < S; i++) a->ones[i] = 1;
}

static void carve_mtp(prl_model *m, carver *cv)
{
    prl_acts *a = m->acts;
    size_t N = (size_t)a->N, d = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    if (m->cfg.num_nextn_predict_layers == 0) return;
    for (int k = 0; k < m->cfg.num_nextn_predict_layers; k++) {
        mtp_acts *t = &a->mtp[k];
        t->tokens = CARVE_I(cv, N);
        t->targets = CARVE_I(cv, N);
        t->lens = CARVE_I(cv, a->B);
        t->pos = CARVE_I(cv, N);
        t->weights = carve(cv, N * sizeof(float));
        t->emb = CARVE_R(cv, N * d);
        t->cat = CARVE_R(cv, 2 * N * d);
        t->rstd_e = CARVE_R(cv, N);
        t->rstd_h = CARVE_R(cv, N);
        t->h = CARVE_R(cv, N * d);
        t->ln = CARVE_R(cv, N * d);
        t->rstd = CARVE_R(cv, N);
        t->logits = CARVE_R(cv, N * V);
        t->lse = CARVE_R(cv, N);
    }
    a->dh_mtp = CARVE_R(cv, N * d);
    a->dh_mtp2 = CARVE_R(cv, N * d);
    a->dcat_mtp = CARVE_R(cv, 2 * N * d);
    a->demb_mtp = CARVE_R(cv, N * d);
}

static void carve_all(prl_model *m, carver *cv)
{
    prl_acts *a = m->acts;
    dims D = model__dims_of(&m->cfg);
    size_t N = (size_t)a->N, NK = N * D.K;
    for (int l = 0; l < model__all_layers(&m->cfg); l++) {
        layer_acts *la = &a->layer[l];
        la->res_attn = CARVE_R(cv, N * D.d);
        la->ln_a = CARVE_R(cv, N * D.d);
        la->rstd_a = CARVE_R(cv, N);
        la->zq = CARVE_R(cv, N * D.rq);
        la->cq = CARVE_R(cv, N * D.rq);
        la->rstd_q = CARVE_R(cv, N);
        la->q = CARVE_R(cv, N * D.H * D.dq);
        la->kva = CARVE_R(cv, N * (D.rkv + D.dr));
        la->ckv = CARVE_R(cv, N * D.rkv);
        la->rstd_kv = CARVE_R(cv, N);
        la->kr = CARVE_R(cv, N * D.dr);
        la->kv = CARVE_R(cv, N * D.H * D.dkv);
        la->att = CARVE_R(cv, (size_t)a->B * D.H * a->T * (a->T + D.ns));
        la->sink_ckv = CARVE_R(cv, (size_t)D.ns * D.rkv);
        la->sink_rstd = CARVE_R(cv, D.ns);
        la->sink_kv = CARVE_R(cv, (size_t)D.ns * D.H * D.dkv);
        if (D.ck) {
            la->zqc = CARVE_R(cv, N * D.rq);
            la->kvc = CARVE_R(cv, N * D.rkv);
            la->oc = CARVE_R(cv, N * D.H * D.dv);
        }
        la->o = CARVE_R(cv, N * D.H * D.dv);
        if (prl_config_is_dsa(&m->cfg, l))
            carve_dsa(cv, &la->dsa, N, (size_t)a->T, (size_t)model__dsa_k(m, a->T), &D);
        la->res_ffn = CARVE_R(cv, N * D.d);
        la->ln_f = CARVE_R(cv, N * D.d);
        la->rstd_f = CARVE_R(cv, N);
        carve_residual_layer(m, cv, l);
        if (!prl_config_is_moe(&m->cfg, l)) {
            la->a13 = CARVE_R(cv, 2 * N * D.I);
            la->h = CARVE_R(cv, N * D.I);
            continue;
        }
        if (D.sde > 0) {
            la->a13 = CARVE_R(cv, 2 * N * D.sde);
            la->h = CARVE_R(cv, N * D.sde);
        }
        la->z = CARVE_R(cv, N * D.E);
        la->s = CARVE_R(cv, N * D.E);
        la->g = CARVE_R(cv, NK);
        la->sel = CARVE_I(cv, NK);
        la->offsets = CARVE_I(cv, D.E + 1);
        la->pos = CARVE_I(cv, NK);
        la->token_of = CARVE_I(cv, NK);
        la->xg = CARVE_R(cv, NK * D.d);
        la->ea13 = CARVE_R(cv, 2 * NK * D.de);
        la->eh = CARVE_R(cv, NK * D.de);
        la->yg = CARVE_R(cv, NK * D.d);
    }
    a->res_final = CARVE_R(cv, N * D.d);
    a->ln_final = CARVE_R(cv, N * D.d);
    a->rstd_final = CARVE_R(cv, N);
    a->logits = CARVE_R(cv, N * D.V);
    a->lse = CARVE_R(cv, N);
    a->scores = CARVE_R(cv, a->B);
    a->dscores = CARVE_R(cv, a->B);
    a->tmp = CARVE_R(cv, N * D.d);
    a->rope_cos = CARVE_R(cv, (size_t)a->T * D.dr / 2);
    a->rope_sin = CARVE_R(cv, (size_t)a->T * D.dr / 2);
    /* backward scratch, sized for the widest use */
    size_t wide = (size_t)D.I > (size_t)D.sde ? (size_t)D.I : (size_t)D.sde;
    a->dres = CARVE_R(cv, N * D.d);
    a->dln = CARVE_R(cv, N * D.d);
    a->dlogits = CARVE_R(cv, N * D.V);
    a->dzq = CARVE_R(cv, N * D.rq);
    a->dcq = CARVE_R(cv, N * D.rq);
    a->dq = CARVE_R(cv, N * D.H * D.dq);
    a->dkva = CARVE_R(cv, N * (D.rkv + D.dr));
    a->dckv = CARVE_R(cv, N * D.rkv);
    a->dkv = CARVE_R(cv, N * D.H * D.dkv);
    a->dkr = CARVE_R(cv, N * D.dr);
    a->attn_scratch_len = prl_attention_scratch(model__attn_shape(m, 0, NULL));
    a->dattn_scratch = CARVE_R(cv, a->attn_scratch_len);
    a->do_ = CARVE_R(cv, N * D.H * D.dv);
    a->dsink_kv = CARVE_R(cv, (size_t)D.ns * D.H * D.dkv);
    a->dsink_ckv = CARVE_R(cv, (size_t)D.ns * D.rkv);
    if (D.ck) { /* the widest of the three conv inputs: heads' output, query and KV latents */
        size_t widest = (size_t)D.H * D.dv;
        widest = (size_t)D.rq > widest ? (size_t)D.rq : widest;
        widest = (size_t)D.rkv > widest ? (size_t)D.rkv : widest;
        a->dconv = CARVE_R(cv, N * widest);
    }
    a->dffn_scratch = CARVE_R(cv, 3 * N * (wide > 0 ? wide : 1));
    a->dz = CARVE_R(cv, N * D.E);
    a->dg = CARVE_R(cv, NK);
    a->dyg = CARVE_R(cv, NK * D.d);
    a->dxg = CARVE_R(cv, NK * D.d);
    a->deh = CARVE_R(cv, 3 * NK * D.de);
    int n_moe_all = m->n_moe + m->cfg.num_nextn_predict_layers; /* MTP routes after the trunk's */
    a->routes = CARVE_I(cv, (size_t)(n_moe_all > 0 ? n_moe_all : 1) * NK);
    carve_residual_model(m, cv);
    carve_mtp(m, cv);
    if (m->cfg.n_dsa_layers > 0) {
        prl_dsa_scratch *x = &a->dsa_scratch;
        x->dscore = CARVE_R(cv, N * a->T);
        x->dqI = CARVE_R(cv, N * D.HI * D.dI);
        x->dkI = CARVE_R(cv, N * D.dI);
        x->dkz = CARVE_R(cv, N * D.dI);
        x->dw = CARVE_R(cv, N * D.HI);
    }
}

void model__free_acts_block(prl_acts *a)
{
    free(a->block);
    a->block = NULL;
    a->block_bytes = 0;
    free(a->layer);
    a->layer = NULL;
    free(a->mtp);
    a->mtp = NULL;
    a->mtp_ran = 0;
    a->B = a->T = a->N = 0;
    a->have_forward = 0;
}

prl_status model__ensure_acts(prl_model *m, int B, int T)
{
    prl_acts *a = m->acts;
    if (a->B == B && a->T == T && a->block) return PRL_OK;
    carver cv = {0};
    if (a->block) { /* a block big enough is reused, zeroed as calloc would: shapes that change
                       from batch to batch (SFT grouped by length) pay no fresh page faults */
        int oB = a->B, oT = a->T;
        a->B = B, a->T = T, a->N = B * T;
        carve_all(m, &cv); /* sizes only: base NULL */
        if (cv.used <= a->block_bytes) {
            memset(a->block, 0, cv.used);
            a->have_forward = 0;
            cv = (carver){.base = a->block};
            carve_all(m, &cv);
            prl_rope_tables_scaled(a->rope_cos, a->rope_sin, T, m->cfg.qk_rope_head_dim,
                                   m->cfg.rope_theta, &m->cfg.rope_scaling);
            return PRL_OK;
        }
        a->B = oB, a->T = oT, a->N = oB * oT;
    }
    model__free_acts_block(a);
    a->layer = calloc((size_t)model__all_layers(&m->cfg), sizeof *a->layer);
    a->mtp = calloc((size_t)m->cfg.num_nextn_predict_layers + 1, sizeof *a->mtp);
    if (!a->layer || !a->mtp) {
        model__free_acts_block(a);
        return prl_error_set(PRL_ERR_NOMEM, "activations");
    }
    a->B = B, a->T = T, a->N = B * T;
    cv = (carver){0};
    carve_all(m, &cv);
    a->block = calloc(1, cv.used);
    if (!a->block) {
        size_t mb = cv.used >> 20;
        model__free_acts_block(a);
        return prl_error_set(PRL_ERR_NOMEM, "activations for batch %d x %d (%zu MiB)", B, T, mb);
    }
    a->block_bytes = cv.used;
    cv = (carver){.base = a->block};
    carve_all(m, &cv);
    prl_rope_tables_scaled(a->rope_cos, a->rope_sin, T, m->cfg.qk_rope_head_dim, m->cfg.rope_theta,
                           &m->cfg.rope_scaling);
    return PRL_OK;
}
