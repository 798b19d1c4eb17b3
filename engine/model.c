/*
** model.c — the MLA + MoE transformer: parameter layout, initialisation, and the train
** path (full-sequence forward with saved activations, backward, log-probs, route capture
** and override, expert-bias balancing).
**
** The maths is docs/model.md; this file is its straight-line driver in the style of llm.c's
** gpt2_forward/gpt2_backward: per layer, compute the named views and call the kernels of
** ops.c in order; the backward is the mirror list. No graph, no autograd.
*/
#include "engine/dsa.h"
#include "engine/mhc.h"
#include "engine/mtp.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Element offsets of one layer's tensors inside params/grads. Routed experts are stored
** one after another, each as [gate_proj (de×d), up_proj (de×d), down_proj (d×de)]. */
typedef struct layer_offsets {
    size_t ln1, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo, ln2;
    size_t sink_ckv, sink_kpe; /* parameter sinks (sink_ckv only with param_sink_with_value) */
    size_t qa_conv, kv_conv, o_conv; /* ModAttn kernels [C, k] */
    size_t ix_wq_b, ix_wk, ix_k_norm, ix_wproj; /* DSA lightning indexer */
    size_t w1, w3, w2;       /* dense SwiGLU; w3 follows w1, so [w1; w3] is one 2F×d matrix */
    size_t router, experts;  /* MoE */
    size_t sw1, sw3, sw2;    /* shared experts; sw3 follows sw1 likewise */
    size_t ln_pa, ln_pm;     /* sandwich: post_attention_layernorm, post_mlp_layernorm */
    size_t ln_bp;            /* block_post_layernorm (over all streams) */
    size_t hc[2][4];         /* mHC sites attn, mlp: phi, norm_gamma, branch_alpha, branch_beta */
    size_t enorm, hnorm, eh_proj, sh_norm, sh_head; /* MTP layers: input op; shared_head
                                                    ** norm/head (model.norm / lm_head when
                                                    ** the config gives none) */
} layer_offsets;

/* Saved activations of one layer (for the current batch shape). */
typedef struct layer_acts {
    prl_real *res_attn, *ln_a, *rstd_a;         /* residual in, normed, 1/rms */
    prl_real *zq, *cq, *rstd_q, *q;             /* query path */
    prl_real *kva, *ckv, *rstd_kv, *kr, *kv;    /* key/value path */
    prl_real *att, *o;                          /* probabilities, head outputs */
    prl_real *sink_ckv, *sink_rstd, *sink_kv;   /* sinks: normed latent, 1/rms, [k_nope | v] */
    prl_real *zqc, *kvc, *oc;                   /* ModAttn outputs (query, latent, heads) */
    prl_dsa_acts dsa;                           /* DSA indexer (dsa.h), DSA layers only */
    prl_real *res_ffn, *ln_f, *rstd_f;          /* residual after attention, normed */
    prl_real *a13, *h;                          /* dense or shared-expert SwiGLU */
    /* MoE */
    prl_real *z, *s, *g;                        /* router logits, sigmoid, gates [N,K] */
    int32_t *sel;                               /* [N,K] */
    int32_t *offsets;                           /* [E+1] rows per expert in grouped order */
    int32_t *pos;                               /* [N,K] grouped row of (token, slot) */
    int32_t *token_of;                          /* [N·K] token of each grouped row */
    prl_real *xg, *ea13, *eh, *yg;              /* grouped expert inputs/activations/outputs */
    /* residual glue (mHC, sandwich norms, block post-norm); site 0 attention, 1 FFN */
    prl_real *xs[2];                            /* mHC: streams into each site [N, n·d] */
    prl_mhc_saved hc[2];                        /* mHC: each site's coefficients */
    prl_real *sub[2], *rstd_sub[2];             /* sandwich: sublayer output before its norm */
    prl_real *F[2];                             /* what goes back into the residual [N, d] */
    prl_real *bp_in, *rstd_bp;                  /* block post-norm input [N, S], 1/rms */
} layer_acts;

/* Saved activations of MTP module k (its decoder layer's are a layer_acts). */
typedef struct mtp_acts {
    int32_t *tokens, *targets, *lens; /* depth-k inputs (prl_mtp_shift) */
    float *weights;
    prl_real *emb, *cat, *rstd_e, *rstd_h; /* input op */
    prl_real *h;                           /* h^k, the layer's output [N,d] */
    prl_real *ln, *rstd, *logits, *lse;    /* shared head */
} mtp_acts;

struct prl_acts {
    int B, T, N;
    mtp_acts *mtp;          /* per MTP module (num_nextn_predict_layers) */
    prl_real *dh_mtp, *dh_mtp2, *dcat_mtp, *demb_mtp; /* MTP backward scratch [N,d]/[N,2d] */
    int mtp_ran;            /* the current forward ran the MTP modules */
    layer_offsets *lo;      /* per layer, fixed at init */
    layer_acts *layer;
    prl_real *res_final, *ln_final, *rstd_final, *logits, *lse;
    prl_real *tmp;          /* [N,d] a sublayer's output before the residual add */
    prl_real *rope_cos, *rope_sin;
    /* backward scratch */
    prl_real *dres, *dln, *dlogits, *dzq, *dcq, *dq, *dkva, *dckv, *dkv, *dkr, *dattn_scratch;
    prl_real *dsink_kv, *dsink_ckv, *dconv;
    prl_real *do_, *dffn_scratch, *dz, *dg, *dyg, *dxg, *deh;
    size_t attn_scratch_len;
    prl_dsa_scratch dsa_scratch; /* DSA indexer backward */
    double index_loss;      /* the last forward's DSA indexer loss */
    int32_t *routes;        /* [n_moe][N][K] captured routes */
    /* residual glue: the streams after the last layer and the merge head (mHC) */
    prl_real *xs_final;
    prl_mhc_saved hc_merge;
    prl_real *ones, *dgamma_sink;   /* γ = 1 when mhc_use_gamma is off, and its discarded grad */
    prl_real *dxs, *dxs2, *dxin, *dpre, *dpost, *dH, *hc_scratch;
    int have_forward;       /* a forward with saved activations is current */
    void *block;            /* the one allocation all of the above point into */
    size_t block_bytes;
    size_t offsets_init;    /* lo is allocated separately (it outlives batch shapes) */
};

/* ------------------------------------------------------------------ dimensions ------ */

typedef struct dims {
    int V, d, L, H, rq, rkv, dn, dr, dv, dq, dkv, I, E, K, de, sde, ns, ck, HI, dI;
} dims;

static dims dims_of(const prl_config *c)
{
    dims D = {
        .V = c->vocab_size, .d = c->hidden_size, .L = c->num_hidden_layers,
        .H = c->num_attention_heads, .rq = c->q_lora_rank, .rkv = c->kv_lora_rank,
        .dn = c->qk_nope_head_dim, .dr = c->qk_rope_head_dim, .dv = c->v_head_dim,
        .I = c->intermediate_size, .E = c->n_routed_experts, .K = c->num_experts_per_tok,
        .de = c->moe_intermediate_size, .sde = c->n_shared_experts * c->moe_intermediate_size,
        .ns = c->param_sink_number, .ck = prl_config_conv_kernel(c),
        .HI = c->index_n_heads, .dI = c->index_head_dim,
    };
    D.dq = D.dn + D.dr;
    D.dkv = D.dn + D.dv;
    return D;
}

/* 1 when layer l's main attention runs over its DSA selection (a DSA layer, sparse stage). */
static int dsa_sparse(const prl_model *m, int l)
{
    return prl_config_is_dsa(&m->cfg, l) && m->cfg.dsa_stage == PRL_DSA_SPARSE;
}

/* The attention call of layer l for the current batch shape (window, sinks, selection). */
static prl_attn_shape attn_shape(const prl_model *m, int l)
{
    dims D = dims_of(&m->cfg);
    const uint8_t *sel = dsa_sparse(m, l) && m->acts->layer ? m->acts->layer[l].dsa.sel : NULL;
    return (prl_attn_shape){.B = m->acts->B, .T = m->acts->T, .H = D.H, .dn = D.dn, .dr = D.dr,
                            .dv = D.dv, .window = prl_config_window(&m->cfg, l), .ns = D.ns,
                            .sel = sel};
}

/* The indexer geometry of the current batch shape. */
static prl_dsa_dims dsa_dims(const prl_model *m)
{
    const prl_config *c = &m->cfg;
    return (prl_dsa_dims){.B = m->acts->B, .T = m->acts->T, .d = c->hidden_size,
                          .rq = c->q_lora_rank, .HI = c->index_n_heads, .dI = c->index_head_dim,
                          .dr = c->qk_rope_head_dim, .topk = c->index_topk};
}

/* ------------------------------------------------------------------ parameter table - */

typedef struct table_builder {
    prl_param_info *t;
    int n, cap;
    size_t total;
} table_builder;

static size_t add_tensor(table_builder *tb, prl_param_kind kind, int layer, int expert,
                         int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static size_t add_tensor(table_builder *tb, prl_param_kind kind, int layer, int expert,
                         int64_t rows, int64_t cols, const char *fmt, ...)
{
    if (tb->n == tb->cap) {
        tb->cap = tb->cap ? 2 * tb->cap : 64;
        tb->t = realloc(tb->t, (size_t)tb->cap * sizeof *tb->t);
        PRL_ASSERT(tb->t != NULL);
    }
    prl_param_info *p = &tb->t[tb->n++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->kind = kind;
    p->layer = layer;
    p->expert = expert;
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 0;
    p->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    p->offset = tb->total;
    tb->total += p->numel;
    return p->offset;
}

/* A conv kernel, stored [C, 1, k] as Hugging Face's Conv1d (used as [C, k]). */
static size_t add_conv(table_builder *tb, int layer, int C, int k, const char *fmt, int l)
    __attribute__((format(printf, 5, 0)));

static size_t add_conv(table_builder *tb, int layer, int C, int k, const char *fmt, int l)
{
    size_t off = add_tensor(tb, PRL_PARAM_CONV, layer, -1, C, k, fmt, "model.layers", l);
    prl_param_info *p = &tb->t[tb->n - 1];
    p->ndim = 3, p->shape[1] = 1, p->shape[2] = k;
    return off;
}

/* One mHC module `prefix` (spec §11 names): phi.weight [M, n·d], norm_gamma [n·d] (with
** mhc_use_gamma), branch_alpha [3], branch_beta [M]; the merge head's alpha and beta carry
** the suffix _pre. off[0..3] = phi, gamma (0 when absent), alpha, beta. */
static void add_mhc_module(table_builder *tb, const prl_config *c, int layer, int full,
                           size_t off[4], const char *prefix)
{
    int n = c->mhc_num_stream, nd = n * c->hidden_size, M = full ? n * n + 2 * n : n;
    const char *suffix = full ? "" : "_pre";
    off[0] = add_tensor(tb, PRL_PARAM_MHC, layer, -1, M, nd, "%s.phi.weight", prefix);
    off[1] = c->mhc_use_gamma ? add_tensor(tb, PRL_PARAM_NORM, layer, -1, nd, 0, "%s.norm_gamma",
                                           prefix)
                              : 0;
    off[2] = add_tensor(tb, PRL_PARAM_MHC, layer, -1, full ? 3 : 1, 0, "%s.branch_alpha%s", prefix,
                        suffix);
    off[3] = add_tensor(tb, PRL_PARAM_MHC, layer, -1, M, 0, "%s.branch_beta%s", prefix, suffix);
}

/* The tensors of decoder layer l (model.layers.{l}.*). An MTP layer (`mtp`) is a plain
** decoder layer: no mHC modules and no ModAttn convs (spec §9.2); block post-norms are
** listed for trunk layers only. */
static void add_layer(table_builder *tb, const prl_config *c, int l, layer_offsets *o, int mtp)
{
    dims D = dims_of(c);
    int S = prl_config_streams(c) * D.d, ck = mtp ? 0 : D.ck;
    char name[96];
    const char *p = "model.layers";
    if (c->use_mhc && !mtp) {
        snprintf(name, sizeof name, "%s.%d.attn_mhc_module", p, l);
        add_mhc_module(tb, c, l, 1, o->hc[0], name);
    }
    o->ln1 = add_tensor(tb, PRL_PARAM_NORM, l, -1, D.d, 0, "%s.%d.input_layernorm.weight", p, l);
    o->wq_a = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.rq, D.d,
                         "%s.%d.self_attn.q_a_proj.weight", p, l);
    if (ck) o->qa_conv = add_conv(tb, l, D.rq, ck, "%s.%d.self_attn.qa_conv.weight", l);
    o->q_norm = add_tensor(tb, PRL_PARAM_NORM, l, -1, D.rq, 0,
                           "%s.%d.self_attn.q_a_layernorm.weight", p, l);
    o->wq_b = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, (int64_t)D.H * D.dq, D.rq,
                         "%s.%d.self_attn.q_b_proj.weight", p, l);
    o->wkv_a = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.rkv + D.dr, D.d,
                          "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, l);
    if (ck)
        o->kv_conv = add_conv(tb, l, D.rkv, ck, "%s.%d.self_attn.compresskv_conv.weight", l);
    o->kv_norm = add_tensor(tb, PRL_PARAM_NORM, l, -1, D.rkv, 0,
                            "%s.%d.self_attn.kv_a_layernorm.weight", p, l);
    o->wkv_b = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, (int64_t)D.H * D.dkv, D.rkv,
                          "%s.%d.self_attn.kv_b_proj.weight", p, l);
    if (ck) o->o_conv = add_conv(tb, l, D.H * D.dv, ck, "%s.%d.self_attn.o_conv.weight", l);
    o->wo = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.d, (int64_t)D.H * D.dv,
                       "%s.%d.self_attn.o_proj.weight", p, l);
    if (c->param_sink_number > 0 && c->param_sink_with_value)
        o->sink_ckv = add_tensor(tb, PRL_PARAM_SINK, l, -1, c->param_sink_number, D.rkv,
                                 "%s.%d.self_attn.param_sink_compressed_kv", p, l);
    if (c->param_sink_number > 0)
        o->sink_kpe = add_tensor(tb, PRL_PARAM_SINK, l, -1, c->param_sink_number, D.dr,
                                 "%s.%d.self_attn.param_sink_k_pe", p, l);
    if (!mtp && prl_config_is_dsa(c, l)) { /* trunk layers only: MTP layers have no indexer */
        o->ix_wq_b = add_tensor(tb, PRL_PARAM_INDEXER, l, -1, (int64_t)D.HI * D.dI, D.rq,
                                "%s.%d.self_attn.indexer.wq_b.weight", p, l);
        o->ix_wk = add_tensor(tb, PRL_PARAM_INDEXER, l, -1, D.dI, D.d,
                              "%s.%d.self_attn.indexer.wk.weight", p, l);
        o->ix_k_norm = add_tensor(tb, PRL_PARAM_INDEXER, l, -1, D.dI, 0,
                                  "%s.%d.self_attn.indexer.k_norm.weight", p, l);
        o->ix_wproj = add_tensor(tb, PRL_PARAM_INDEXER, l, -1, D.HI, D.d,
                                 "%s.%d.self_attn.indexer.weights_proj.weight", p, l);
    }
    if (c->sandwich_norm) /* post_attention_layernorm is then the post-attention norm */
        o->ln_pa = add_tensor(tb, PRL_PARAM_NORM, l, -1, D.d, 0,
                              "%s.%d.post_attention_layernorm.weight", p, l);
    if (c->use_mhc && !mtp) {
        snprintf(name, sizeof name, "%s.%d.mlp_mhc_module", p, l);
        add_mhc_module(tb, c, l, 1, o->hc[1], name);
    }
    o->ln2 = add_tensor(tb, PRL_PARAM_NORM, l, -1, D.d, 0, "%s.%d.%s.weight", p, l,
                        c->sandwich_norm ? "pre_mlp_layernorm" : "post_attention_layernorm");
    if (c->sandwich_norm)
        o->ln_pm = add_tensor(tb, PRL_PARAM_NORM, l, -1, D.d, 0,
                              "%s.%d.post_mlp_layernorm.weight", p, l);
    if (prl_config_block_post_norm(c, l))
        o->ln_bp = add_tensor(tb, PRL_PARAM_NORM, l, -1, S, 0,
                              "%s.%d.block_post_layernorm.weight", p, l);
    if (!prl_config_is_moe(c, l)) {
        o->w1 = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.I, D.d, "%s.%d.mlp.gate_proj.weight", p, l);
        o->w3 = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.I, D.d, "%s.%d.mlp.up_proj.weight", p, l);
        o->w2 = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.d, D.I, "%s.%d.mlp.down_proj.weight", p, l);
        PRL_ASSERT(o->w3 == o->w1 + (size_t)D.I * D.d); /* stacked gate/up GEMM */
        return;
    }
    o->router = add_tensor(tb, PRL_PARAM_ROUTER, l, -1, D.E, D.d, "%s.%d.mlp.gate.weight", p, l);
    for (int e = 0; e < D.E; e++) {
        size_t w1 = add_tensor(tb, PRL_PARAM_MATRIX, l, e, D.de, D.d,
                               "%s.%d.mlp.experts.%d.gate_proj.weight", p, l, e);
        add_tensor(tb, PRL_PARAM_MATRIX, l, e, D.de, D.d, "%s.%d.mlp.experts.%d.up_proj.weight",
                   p, l, e);
        add_tensor(tb, PRL_PARAM_MATRIX, l, e, D.d, D.de,
                   "%s.%d.mlp.experts.%d.down_proj.weight", p, l, e);
        if (e == 0) o->experts = w1;
    }
    if (D.sde > 0) {
        o->sw1 = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.sde, D.d,
                            "%s.%d.mlp.shared_experts.gate_proj.weight", p, l);
        o->sw3 = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.sde, D.d,
                            "%s.%d.mlp.shared_experts.up_proj.weight", p, l);
        o->sw2 = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.d, D.sde,
                            "%s.%d.mlp.shared_experts.down_proj.weight", p, l);
        PRL_ASSERT(o->sw3 == o->sw1 + (size_t)D.sde * D.d);
    }
}

/* MTP layer l: the input op's tensors first (enorm, hnorm, eh_proj), then the decoder
** layer, then its shared_head.norm / shared_head.head when the config has them (else the
** trunk's model.norm / lm_head at norm, head). */
static void add_mtp_layer(table_builder *tb, const prl_config *c, int l, layer_offsets *o,
                          size_t norm, size_t head)
{
    int d = c->hidden_size;
    o->enorm = add_tensor(tb, PRL_PARAM_NORM, l, -1, d, 0, "model.layers.%d.enorm.weight", l);
    o->hnorm = add_tensor(tb, PRL_PARAM_NORM, l, -1, d, 0, "model.layers.%d.hnorm.weight", l);
    o->eh_proj = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, d, 2 * d,
                            "model.layers.%d.eh_proj.weight", l);
    add_layer(tb, c, l, o, 1);
    o->sh_norm = c->mtp_head_norm ? add_tensor(tb, PRL_PARAM_NORM, l, -1, d, 0,
                                               "model.layers.%d.shared_head.norm.weight", l)
                                  : norm;
    o->sh_head = c->mtp_head ? add_tensor(tb, PRL_PARAM_HEAD, l, -1, c->vocab_size, d,
                                          "model.layers.%d.shared_head.head.weight", l)
                             : head;
}

/* Lay out every tensor in checkpoint order; fill per-layer offsets (trunk, then MTP).
** `merge` receives the merge head's module (mHC only). */
static void build_table(table_builder *tb, const prl_config *c, layer_offsets *lo,
                        size_t *embed, size_t *norm, size_t *head, size_t merge[4])
{
    int L = c->num_hidden_layers;
    *embed = add_tensor(tb, PRL_PARAM_EMBED, -1, -1, c->vocab_size, c->hidden_size,
                        "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) add_layer(tb, c, l, &lo[l], 0);
    if (c->use_mhc) add_mhc_module(tb, c, -1, 0, merge, "model.merge_mhc_module");
    *norm = add_tensor(tb, PRL_PARAM_NORM, -1, -1, c->hidden_size, 0, "model.norm.weight");
    *head = add_tensor(tb, PRL_PARAM_HEAD, -1, -1, c->vocab_size, c->hidden_size, "lm_head.weight");
    for (int k = 0; k < c->num_nextn_predict_layers; k++)
        add_mtp_layer(tb, c, L + k, &lo[L + k], *norm, *head);
}

/* Model-level offsets live beside the layer table (in the acts struct: they never change). */
typedef struct model_offsets {
    size_t embed, norm, head;
    size_t merge[4]; /* mHC merge head: phi, norm_gamma, branch_alpha_pre, branch_beta_pre */
} model_offsets;

/* Trunk and MTP layers: the MTP layers are model.layers.{L..L+D−1}. */
static int all_layers(const prl_config *c)
{
    return c->num_hidden_layers + c->num_nextn_predict_layers;
}

static model_offsets *model_offs(const prl_model *m)
{
    return (model_offsets *)(m->acts->lo + all_layers(&m->cfg));
}

prl_status prl_model_init(prl_model *m, const prl_config *cfg)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->acts = calloc(1, sizeof *m->acts);
    /* layer offsets followed by one model_offsets record */
    size_t lo_bytes = (size_t)all_layers(cfg) * sizeof(layer_offsets) + sizeof(model_offsets);
    if (m->acts) m->acts->lo = calloc(1, lo_bytes);
    if (!m->acts || !m->acts->lo) {
        prl_model_free(m);
        return prl_error_set(PRL_ERR_NOMEM, "model tables");
    }
    table_builder tb = {0};
    model_offsets mo = {0};
    build_table(&tb, cfg, m->acts->lo, &mo.embed, &mo.norm, &mo.head, mo.merge);
    *model_offs(m) = mo;
    m->tensors = tb.t;
    m->n_tensors = tb.n;
    m->n_params = tb.total;
    m->n_moe = prl_config_moe_layers(cfg);
    m->params = calloc(m->n_params, sizeof *m->params);
    m->grads = calloc(m->n_params, sizeof *m->grads);
    /* MTP MoE layers own zero bias slots after the trunk's n_moe (never updated or saved) */
    size_t nb = (size_t)(m->n_moe + cfg->num_nextn_predict_layers > 0
                             ? m->n_moe + cfg->num_nextn_predict_layers : 1) *
                (size_t)(cfg->n_routed_experts > 0 ? cfg->n_routed_experts : 1);
    m->router_bias = calloc(nb, sizeof *m->router_bias);
    m->expert_counts = calloc(nb, sizeof *m->expert_counts);
    if (!m->params || !m->grads || !m->router_bias || !m->expert_counts) {
        size_t mb = m->n_params * sizeof(prl_real) >> 20;
        prl_model_free(m);
        return prl_error_set(PRL_ERR_NOMEM, "model parameters (%zu MiB)", mb);
    }
    return PRL_OK;
}

static void free_acts_block(prl_acts *a)
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

void prl_model_free(prl_model *m)
{
    if (!m) return;
    if (m->acts) {
        free_acts_block(m->acts);
        free(m->acts->lo);
        free(m->acts);
    }
    free(m->tensors);
    free(m->params);
    free(m->grads);
    free(m->router_bias);
    free(m->expert_counts);
    free(m->wround);
    memset(m, 0, sizeof *m);
}

void prl_model_init_weights(prl_model *m, uint64_t seed)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        prl_real *w = m->params + p->offset;
        if (p->kind == PRL_PARAM_MHC &&
            prl_mhc_init_tensor(p->name, w, p->numel, m->cfg.mhc_num_stream))
            continue; /* α and β (spec §7.4); φ is drawn like any matrix */
        int gain = p->kind == PRL_PARAM_NORM || (p->kind == PRL_PARAM_INDEXER && p->ndim == 1);
        if (gain || p->kind == PRL_PARAM_CONV) { /* gains 1 (the indexer's k_norm too); convs 0:
                                                    the identity */
            for (size_t j = 0; j < p->numel; j++) w[j] = (prl_real)gain;
            continue;
        }
        prl_rng r;
        prl_rng_init(&r, seed, (uint64_t)i, 0, 0, PRL_RNG_INIT);
        for (size_t j = 0; j < p->numel; j++)
            w[j] = (prl_real)(m->cfg.initializer_range * prl_rng_normal(&r));
    }
    size_t nb = (size_t)m->n_moe * m->cfg.n_routed_experts;
    memset(m->router_bias, 0, nb * sizeof *m->router_bias);
    memset(m->expert_counts, 0, nb * sizeof *m->expert_counts);
}

void prl_model_zero_grad(prl_model *m) { memset(m->grads, 0, m->n_params * sizeof *m->grads); }

const prl_param_info *prl_model_find(const prl_model *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

void prl_model_set_hook(prl_model *m, prl_tensor_hook hook, void *user)
{
    m->hook = hook;
    m->hook_user = user;
}

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
static void carve_dsa(carver *cv, prl_dsa_acts *x, size_t N, size_t T, const dims *D)
{
    x->qI = CARVE_R(cv, N * D->HI * D->dI);
    x->kz = CARVE_R(cv, N * D->dI);
    x->kI = CARVE_R(cv, N * D->dI);
    x->krstd = CARVE_R(cv, N);
    x->w = CARVE_R(cv, N * D->HI);
    x->score = CARVE_R(cv, N * T);
    x->target = CARVE_R(cv, N * T);
    x->sel = carve(cv, N * T);
}

/* ------------------------------------------------------------------ residual glue --- */

/* The residual beyond a plain pre-norm sum: mHC streams, sandwich norms or block post-norms
** (docs/model.md "Residual streams"). Off, the model runs exactly the plain path. */
static int residual_glue(const prl_config *c)
{
    return c->use_mhc || c->sandwich_norm || c->n_block_post_layernorm_idx > 0;
}

/* mHC streams through layer l: the trunk's layers with use_mhc; never an MTP layer, whose
** decoder layer keeps the ordinary residual (spec §9.2). */
static int layer_mhc(const prl_model *m, int l)
{
    return m->cfg.use_mhc && l < m->cfg.num_hidden_layers;
}

static prl_mhc_shape site_shape(const prl_model *m, int full)
{
    return (prl_mhc_shape){.N = m->acts->N, .n = m->cfg.mhc_num_stream, .d = m->cfg.hidden_size,
                           .it = m->cfg.mhc_recur_norm, .full = full};
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
    if (!residual_glue(c)) return;
    for (int site = 0; site < 2; site++) {
        if (layer_mhc(m, l)) {
            la->xs[site] = CARVE_R(cv, N * S);
            carve_mhc_saved(cv, &la->hc[site], site_shape(m, 1));
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
    size_t N = (size_t)a->N, n = (size_t)c->mhc_num_stream, S = prl_config_streams(c) * (size_t)c->hidden_size;
    if (!residual_glue(c)) return;
    a->dxs = CARVE_R(cv, N * S);
    a->dxs2 = CARVE_R(cv, N * S);
    a->dxin = CARVE_R(cv, N * c->hidden_size);
    if (!c->use_mhc) return;
    a->xs_final = CARVE_R(cv, N * S);
    carve_mhc_saved(cv, &a->hc_merge, site_shape(m, 0));
    a->ones = CARVE_R(cv, S);
    a->dgamma_sink = CARVE_R(cv, S);
    a->dpre = CARVE_R(cv, N * n);
    a->dpost = CARVE_R(cv, N * n);
    a->dH = CARVE_R(cv, N * n * n);
    a->hc_scratch = CARVE_R(cv, prl_mhc_site_scratch(site_shape(m, 1)));
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
    dims D = dims_of(&m->cfg);
    size_t N = (size_t)a->N, NK = N * D.K;
    for (int l = 0; l < all_layers(&m->cfg); l++) {
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
        if (prl_config_is_dsa(&m->cfg, l)) carve_dsa(cv, &la->dsa, N, (size_t)a->T, &D);
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
    a->attn_scratch_len = prl_attention_scratch(attn_shape(m, 0));
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

static prl_status ensure_acts(prl_model *m, int B, int T)
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
            prl_rope_tables(a->rope_cos, a->rope_sin, T, m->cfg.qk_rope_head_dim, m->cfg.rope_theta);
            return PRL_OK;
        }
        a->B = oB, a->T = oT, a->N = oB * oT;
    }
    free_acts_block(a);
    a->layer = calloc((size_t)all_layers(&m->cfg), sizeof *a->layer);
    a->mtp = calloc((size_t)m->cfg.num_nextn_predict_layers + 1, sizeof *a->mtp);
    if (!a->layer || !a->mtp) {
        free_acts_block(a);
        return prl_error_set(PRL_ERR_NOMEM, "activations");
    }
    a->B = B, a->T = T, a->N = B * T;
    cv = (carver){0};
    carve_all(m, &cv);
    a->block = calloc(1, cv.used);
    if (!a->block) {
        size_t mb = cv.used >> 20;
        free_acts_block(a);
        return prl_error_set(PRL_ERR_NOMEM, "activations for batch %d x %d (%zu MiB)", B, T, mb);
    }
    a->block_bytes = cv.used;
    cv = (carver){.base = a->block};
    carve_all(m, &cv);
    prl_rope_tables(a->rope_cos, a->rope_sin, T, m->cfg.qk_rope_head_dim, m->cfg.rope_theta);
    return PRL_OK;
}

/* ------------------------------------------------------------------ hooks ----------- */

static int emit(const prl_model *m, int layer, const char *what, const prl_real *data,
                int64_t rows, int64_t cols)
{
    if (!m->hook) return 0;
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "L%d.%s", layer, what);
    else snprintf(name, sizeof name, "%s", what);
    int64_t shape[2] = {rows, cols};
    return m->hook(m->hook_user, name, data, 2, shape);
}

/* ------------------------------------------------------------------ forward --------- */

/* Weights as the path reads them: the rounded copy in a reduced precision, else the master. */
#define P(off) ((m->wround ? m->wround : m->params) + (off))
#define G(off) (m->grads + (off))

/* An op output (forward) or the gradient of one (backward) rounded to the train precision
** at the points the infer path rounds (docs/model.md "Precision"); a no-op in fp32. */
static void rnd(const prl_model *m, prl_real *x, size_t n) { prl_round_reals(m->precision, x, n); }

prl_status prl_model_set_precision(prl_model *m, prl_precision p)
{
    if ((unsigned)p > PRL_PRECISION_FP16)
        return prl_error_set(PRL_ERR_ARG, "train precision %d is not fp32, bf16 or fp16", (int)p);
    if (p == m->precision && (p == PRL_PRECISION_FP32 || m->wround)) return PRL_OK;
    free(m->wround);
    m->wround = NULL;
    m->precision = p;
    if (p == PRL_PRECISION_FP32) return PRL_OK;
    m->wround = malloc(m->n_params * sizeof *m->wround);
    if (!m->wround) {
        m->precision = PRL_PRECISION_FP32;
        return prl_error_set(PRL_ERR_NOMEM, "rounded weights (%zu parameters)", m->n_params);
    }
    return PRL_OK;
}

/* The master weights rounded into wround, so this forward and its backward see the weights
** of the latest optimizer step. */
static void refresh_rounded_weights(prl_model *m)
{
    if (!m->wround) return;
    memcpy(m->wround, m->params, m->n_params * sizeof *m->wround);
    rnd(m, m->wround, m->n_params);
}

/* Parameter sinks of layer l: ĉ = RMSNorm(param_sink_compressed_kv; kv_a_layernorm), then
** [k_nope | v] = ĉ·kv_b_projᵀ per head, like a token's; zero without param_sink_with_value. */
static void sinks_forward(prl_model *m, int l)
{
    layer_acts *la = &m->acts->layer[l];
    const layer_offsets *o = &m->acts->lo[l];
    dims D = dims_of(&m->cfg);
    if (!m->cfg.param_sink_with_value) {
        memset(la->sink_kv, 0, (size_t)D.ns * D.H * D.dkv * sizeof(prl_real));
        return;
    }
    prl_rmsnorm_forward(la->sink_ckv, la->sink_rstd, P(o->sink_ckv), P(o->kv_norm), D.ns, D.rkv,
                        D.rkv, D.rkv, PRL_LATENT_NORM_EPS);
    rnd(m, la->sink_ckv, (size_t)D.ns * D.rkv);
    prl_matmul_forward(la->sink_kv, la->sink_ckv, P(o->wkv_b), D.ns, D.rkv, D.H * D.dkv, 0);
    rnd(m, la->sink_kv, (size_t)D.ns * D.H * D.dkv);
}

/* The indexer tensors of DSA layer l inside a parameter-layout block (params or grads). */
static prl_dsa_weights dsa_weights(const prl_model *m, prl_real *base, int l)
{
    const layer_offsets *o = &m->acts->lo[l];
    return (prl_dsa_weights){.wq_b = base + o->ix_wq_b, .wk = base + o->ix_wk,
                             .k_norm = base + o->ix_k_norm, .wproj = base + o->ix_wproj};
}

/* A latent of C channels (rows of z at z_stride) through ModAttn and its norm:
** y = RMSNorm(zc; g) with zc = z + conv(z) when the convs are on (saved), else z. */
static void latent_forward(prl_model *m, prl_real *y, prl_real *rstd, const prl_real *z,
                           int z_stride, prl_real *zc, size_t g, size_t conv, int C)
{
    prl_acts *a = m->acts;
    int ck = conv ? prl_config_conv_kernel(&m->cfg) : 0; /* offset 0: no conv (MTP layer) */
    if (ck) {
        prl_conv_forward(zc, z, z_stride, P(conv), a->B, a->T, C, ck);
        rnd(m, zc, (size_t)a->N * C);
        z = zc, z_stride = C;
    }
    prl_rmsnorm_forward(y, rstd, z, P(g), a->N, C, z_stride, C, PRL_LATENT_NORM_EPS);
    rnd(m, y, (size_t)a->N * C);
}

/* MLA in the naive form: a = ln_a (N,d) → o (N,H·dv), and tmp = o·Woᵀ. */
static int mla_forward(prl_model *m, int l, const prl_batch *b)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = dims_of(&m->cfg);
    int N = a->N;
    size_t nq = (size_t)N * D.H * D.dq;
    prl_matmul_forward(la->zq, la->ln_a, P(o->wq_a), N, D.d, D.rq, 0);
    rnd(m, la->zq, (size_t)N * D.rq);
    latent_forward(m, la->cq, la->rstd_q, la->zq, D.rq, la->zqc, o->q_norm, o->qa_conv, D.rq);
    prl_matmul_forward(la->q, la->cq, P(o->wq_b), N, D.rq, D.H * D.dq, 0);
    rnd(m, la->q, nq);
    prl_rope_forward(la->q, a->rope_cos, a->rope_sin, N, a->T, D.H, D.dq, D.dn, D.H * D.dq, D.dr);
    rnd(m, la->q, nq);
    prl_matmul_forward(la->kva, la->ln_a, P(o->wkv_a), N, D.d, D.rkv + D.dr, 0);
    rnd(m, la->kva, (size_t)N * (D.rkv + D.dr));
    latent_forward(m, la->ckv, la->rstd_kv, la->kva, D.rkv + D.dr, la->kvc, o->kv_norm, o->kv_conv,
                   D.rkv); /* the compressed KV only: its rope part is untouched */
    for (int n = 0; n < N; n++)
        memcpy(la->kr + (size_t)n * D.dr, la->kva + (size_t)n * (D.rkv + D.dr) + D.rkv,
               (size_t)D.dr * sizeof(prl_real));
    prl_rope_forward(la->kr, a->rope_cos, a->rope_sin, N, a->T, 1, D.dr, 0, D.dr, D.dr);
    rnd(m, la->kr, (size_t)N * D.dr);
    prl_matmul_forward(la->kv, la->ckv, P(o->wkv_b), N, D.rkv, D.H * D.dkv, 0);
    rnd(m, la->kv, (size_t)N * D.H * D.dkv);
    if (D.ns > 0) sinks_forward(m, l);
    int dsa = prl_config_is_dsa(&m->cfg, l);
    if (dsa) { /* the indexer picks each row's keys before the main attention reads them */
        prl_dsa_weights w = dsa_weights(m, P(0), l); /* rounded, as the infer path reads them */
        prl_dsa_forward(&la->dsa, &w, la->ln_a, la->cq, a->rope_cos, a->rope_sin, b->lens,
                        dsa_dims(m), dsa_sparse(m, l) && !m->dsa_keep_selection, m->precision);
    }
    prl_attention_forward(la->o, la->att, la->q, la->kv, la->kr, la->sink_kv,
                          D.ns > 0 ? P(o->sink_kpe) : NULL, b->lens, attn_shape(m, l));
    rnd(m, la->o, (size_t)N * D.H * D.dv);
    if (dsa)
        a->index_loss += prl_dsa_loss_forward(&la->dsa, la->att, D.H, D.ns, dsa_sparse(m, l),
                                              b->lens, dsa_dims(m));
    const prl_real *o_out = la->o;
    if (D.ck && o->o_conv) { /* ModAttn on the heads' output, before o_proj (not in MTP) */
        prl_conv_forward(la->oc, la->o, D.H * D.dv, P(o->o_conv), a->B, a->T, D.H * D.dv, D.ck);
        rnd(m, la->oc, (size_t)N * D.H * D.dv);
        o_out = la->oc;
    }
    prl_matmul_forward(a->tmp, o_out, P(o->wo), N, D.H * D.dv, D.d, 0);
    rnd(m, a->tmp, (size_t)N * D.d);
    int stop = emit(m, l, "attn.q", la->q, N, (int64_t)D.H * D.dq);
    stop = stop || emit(m, l, "attn.kv_latent", la->ckv, N, D.rkv);
    stop = stop || emit(m, l, "attn.out", a->tmp, N, D.d);
    return stop;
}

/* Group (token, slot) pairs by expert with a stable counting sort: rows of one expert are
** contiguous and in token order, so per-expert GEMMs see a fixed row order. */
static void group_by_expert(layer_acts *la, int N, int E, int K)
{
    int32_t *off = la->offsets;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int i = 0; i < N * K; i++) off[la->sel[i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    int32_t cursor[4096];
    PRL_ASSERT(E <= 4096);
    memcpy(cursor, off, (size_t)E * sizeof *cursor);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            int p = cursor[la->sel[n * K + k]]++;
            la->pos[n * K + k] = p;
            la->token_of[p] = n;
        }
}

/* Work item of the expert GEMMs: a block of rows of one expert. */
typedef struct expert_task {
    int e, r0, rows;
} expert_task;

typedef struct expert_ctx {
    prl_model *m;
    layer_acts *la;
    const layer_offsets *o;
    dims D;
    expert_task *tasks;
    int n_tasks;
} expert_ctx;

static int build_expert_tasks(expert_task *t, const int32_t *off, int E)
{
    int n = 0;
    for (int e = 0; e < E; e++)
        for (int r = off[e]; r < off[e + 1]; r += PRL_ROW_BLOCK) {
            t[n].e = e;
            t[n].r0 = r;
            t[n].rows = off[e + 1] - r < PRL_ROW_BLOCK ? off[e + 1] - r : PRL_ROW_BLOCK;
            n++;
        }
    return n;
}

static size_t expert_base(const layer_offsets *o, const dims *D, int e)
{
    return o->experts + (size_t)e * 3 * D->de * D->d;
}

static void expert_forward_task(void *p, int i)
{
    expert_ctx *c = p;
    prl_model *m = c->m;
    layer_acts *la = c->la;
    const dims *D = &c->D;
    expert_task t = c->tasks[i];
    size_t base = expert_base(c->o, D, t.e);
    const prl_real *w13 = P(base), *w2 = P(base + 2 * (size_t)D->de * D->d);
    size_t xo = (size_t)t.r0 * D->d, ho = (size_t)t.r0 * D->de;
    prl_gemm(0, 1, t.rows, 2 * D->de, D->d, 1, la->xg + xo, D->d, w13, D->d, 0, la->ea13 + 2 * ho,
             2 * D->de);
    rnd(m, la->ea13 + 2 * ho, (size_t)t.rows * 2 * D->de);
    prl_silu_mul_forward(la->eh + ho, la->ea13 + 2 * ho, t.rows, D->de);
    rnd(m, la->eh + ho, (size_t)t.rows * D->de);
    prl_gemm(0, 1, t.rows, D->d, D->de, 1, la->eh + ho, D->de, w2, D->de, 0, la->yg + xo, D->d);
    rnd(m, la->yg + xo, (size_t)t.rows * D->d);
}

/* Per-token passes of the MoE and the residual stream, run over row blocks on the pool
** (each row is written by exactly one task). */
typedef struct token_ctx {
    prl_model *m;
    layer_acts *la;
    dims D;
    const prl_real *bias;
    const int32_t *forced;
    prl_real *out;
    const prl_real *x, *y;
} token_ctx;

static void gate_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    int E = c->D.E, K = c->D.K;
    for (int n = r0; n < r1; n++) {
        /* a PRL_ROUTE_NATIVE row (validated whole) routes natively: no forced ids */
        const int32_t *f = c->forced ? c->forced + (size_t)n * K : NULL;
        if (f && f[0] == PRL_ROUTE_NATIVE) f = NULL;
        prl_moe_gate_forward(la->sel + (size_t)n * K, la->g + (size_t)n * K, la->s + (size_t)n * E,
                             la->z + (size_t)n * E, c->bias, f, E, K, c->m->cfg.norm_topk_prob,
                             c->m->cfg.routed_scaling_factor);
    }
}

static void gather_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    int d = c->D.d;
    for (int q = r0; q < r1; q++)
        memcpy(c->la->xg + (size_t)q * d, c->la->ln_f + (size_t)c->la->token_of[q] * d,
               (size_t)d * sizeof(prl_real));
}

/* out[n] += Σ_k g[n,k]·yg[pos(n,k)], slots in order */
static void combine_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    int d = c->D.d, K = c->D.K;
    for (int n = r0; n < r1; n++) {
        prl_real *out = c->out + (size_t)n * d;
        for (int k = 0; k < K; k++) {
            prl_real g = la->g[n * K + k];
            const prl_real *y = la->yg + (size_t)la->pos[n * K + k] * d;
            for (int i = 0; i < d; i++) out[i] += g * y[i];
        }
    }
    rnd(c->m, c->out + (size_t)r0 * d, (size_t)(r1 - r0) * d);
}

/* out = x + y over rows of width d */
static void add_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    size_t d = (size_t)c->D.d;
    for (size_t i = (size_t)r0 * d; i < (size_t)r1 * d; i++) c->out[i] = c->x[i] + c->y[i];
    rnd(c->m, c->out + (size_t)r0 * d, (size_t)(r1 - r0) * d);
}

static void residual_add(prl_model *m, prl_real *out, const prl_real *x, const prl_real *y)
{
    token_ctx c = {.m = m, .D = dims_of(&m->cfg), .out = out, .x = x, .y = y};
    prl_parallel_rows(m->acts->N, add_rows, &c);
}

/* MoE: ln_f (N,d) → tmp (N,d) = shared(ln_f) + Σ_k g_k·expert_k(ln_f). */
static int moe_forward(prl_model *m, int l, int moe_idx, const prl_batch *b, expert_task *tasks)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = dims_of(&m->cfg);
    int N = a->N;
    prl_matmul_forward(la->z, la->ln_f, P(o->router), N, D.d, D.E, 0);
    rnd(m, la->z, (size_t)N * D.E);
    const prl_real *bias = m->router_bias + (size_t)moe_idx * D.E;
    const int32_t *forced = b->route_override && moe_idx < m->n_moe /* MTP: native */
                                ? b->route_override + (size_t)moe_idx * N * D.K : NULL;
    token_ctx tc = {.m = m, .la = la, .D = D, .bias = bias, .forced = forced, .out = a->tmp};
    prl_parallel_rows(N, gate_rows, &tc);
    memcpy(a->routes + (size_t)moe_idx * N * D.K, la->sel, (size_t)N * D.K * sizeof(int32_t));
    group_by_expert(la, N, D.E, D.K);
    prl_parallel_rows(N * D.K, gather_rows, &tc);
    expert_ctx c = {.m = m, .la = la, .o = o, .D = D, .tasks = tasks};
    c.n_tasks = build_expert_tasks(tasks, la->offsets, D.E);
    prl_parallel_for(c.n_tasks, expert_forward_task, &c);
    if (D.sde > 0)
        prl_swiglu_forward(a->tmp, la->a13, la->h, la->ln_f, P(o->sw1), P(o->sw2), N, D.d,
                           D.sde, 0, m->precision);
    else
        memset(a->tmp, 0, (size_t)N * D.d * sizeof(prl_real));
    prl_parallel_rows(N, combine_rows, &tc);
    int stop = emit(m, l, "moe.router_logits", la->z, N, D.E);
    return stop || emit(m, l, "moe.out", a->tmp, N, D.d);
}

static int valid_pos(const prl_batch *b, int n)
{
    return !b->lens || n % b->T < b->lens[n / b->T];
}

/* Auxiliary losses of one MoE layer (values only; gradients in the backward). */
static void aux_losses(const prl_model *m, const layer_acts *la, const prl_batch *b,
                       double *bal, double *zl)
{
    dims D = dims_of(&m->cfg);
    const prl_config *c = &m->cfg;
    if (c->balance_loss_alpha > 0) {
        double *f = calloc((size_t)D.E * 2, sizeof(double)), *P_ = f + D.E;
        for (int bi = 0; bi < b->B; bi++) {
            int len = b->lens ? b->lens[bi] : b->T;
            memset(f, 0, (size_t)D.E * 2 * sizeof(double));
            for (int t = 0; t < len; t++) {
                int n = bi * b->T + t;
                const prl_real *s = la->s + (size_t)n * D.E;
                double sum = 0;
                for (int e = 0; e < D.E; e++) sum += s[e];
                for (int e = 0; e < D.E; e++) P_[e] += s[e] / sum / len;
                for (int k = 0; k < D.K; k++) f[la->sel[n * D.K + k]] += (double)D.E / (D.K * len);
            }
            double term = 0;
            for (int e = 0; e < D.E; e++) term += f[e] * P_[e];
            *bal += c->balance_loss_alpha * term / b->B;
        }
        free(f);
    }
    if (c->router_z_loss_coef > 0) {
        int n_valid = 0;
        double acc = 0;
        for (int n = 0; n < b->B * b->T; n++) {
            if (!valid_pos(b, n)) continue;
            const prl_real *z = la->z + (size_t)n * D.E;
            double mx = z[0], sum = 0;
            for (int e = 1; e < D.E; e++) mx = z[e] > mx ? z[e] : mx;
            for (int e = 0; e < D.E; e++) sum += exp(z[e] - mx);
            double lse = mx + log(sum);
            acc += lse * lse;
            n_valid++;
        }
        if (n_valid) *zl += c->router_z_loss_coef * acc / n_valid;
    }
}

/* Position n's extra targets: each in [-1, V), and none where the position has no target
** (their log-probs need the row's log-sum-exp, which only a target position computes). */
static prl_status validate_extra(const prl_batch *b, int n, int V)
{
    if (b->n_extra < 0 || b->n_extra > PRL_MAX_EXTRA_TARGETS ||
        (b->n_extra > 0 && (!b->extra_targets || !b->extra_weights)))
        return prl_error_set(PRL_ERR_ARG, "n_extra %d: at most %d, with extra_targets and "
                             "extra_weights", b->n_extra, PRL_MAX_EXTRA_TARGETS);
    int has_target = b->targets && b->targets[n] >= 0;
    for (int i = 0; i < b->n_extra; i++) {
        int32_t y = b->extra_targets[(size_t)n * b->n_extra + i];
        if (y < -1 || y >= V || (y >= 0 && !has_target))
            return prl_error_set(PRL_ERR_RANGE, "sequence %d position %d: extra target %d id %d %s",
                                 n / b->T, n % b->T, i, y, y >= 0 && y < V ? "at a position "
                                 "without a target" : "out of range");
    }
    return PRL_OK;
}

/* Each override row: K expert ids in range, or K × PRL_ROUTE_NATIVE (route natively). */
static prl_status validate_override(const prl_model *m, const int32_t *ov, int N)
{
    int K = m->cfg.num_experts_per_tok, E = m->cfg.n_routed_experts;
    size_t rows = (size_t)m->n_moe * N;
    for (size_t r = 0; r < rows; r++) {
        const int32_t *row = ov + r * K;
        int native = row[0] == PRL_ROUTE_NATIVE;
        for (int k = 0; k < K; k++) {
            if (native && row[k] == PRL_ROUTE_NATIVE) continue;
            if (native || row[k] < 0 || row[k] >= E)
                return prl_error_set(PRL_ERR_RANGE, "route override entry %zu: expert %d out of "
                                     "range [0, %d)%s", r * K + k, row[k], E,
                                     native || row[k] == PRL_ROUTE_NATIVE
                                         ? " (a native row must be all PRL_ROUTE_NATIVE)" : "");
        }
    }
    return PRL_OK;
}

static prl_status validate_batch(const prl_model *m, const prl_batch *b)
{
    const prl_config *c = &m->cfg;
    if (b->B <= 0 || b->T <= 0)
        return prl_error_set(PRL_ERR_ARG, "batch shape %d x %d must be positive", b->B, b->T);
    if (b->T > c->max_position_embeddings)
        return prl_error_set(PRL_ERR_RANGE, "sequence length %d exceeds max_position_embeddings %d",
                             b->T, c->max_position_embeddings);
    if (!(b->temperature > 0) || !isfinite(b->temperature))
        return prl_error_set(PRL_ERR_ARG, "temperature %g must be > 0", b->temperature);
    for (int i = 0; i < b->B; i++)
        if (b->lens && (b->lens[i] < 1 || b->lens[i] > b->T))
            return prl_error_set(PRL_ERR_RANGE, "sequence %d: length %d not in [1, %d]", i,
                                 b->lens[i], b->T);
    int N = b->B * b->T;
    for (int n = 0; n < N; n++) /* padding positions too: their embeddings are looked up */
        if (b->tokens[n] < 0 || b->tokens[n] >= c->vocab_size)
            return prl_error_set(PRL_ERR_RANGE, "sequence %d position %d: token id %d out of "
                                 "range [0, %d)", n / b->T, n % b->T, b->tokens[n], c->vocab_size);
    for (int n = 0; n < N; n++) {
        if (!valid_pos(b, n)) continue;
        if (b->targets && (b->targets[n] < -1 || b->targets[n] >= c->vocab_size))
            return prl_error_set(PRL_ERR_RANGE, "sequence %d position %d: target id %d out of "
                                 "range [-1, %d)", n / b->T, n % b->T, b->targets[n], c->vocab_size);
        prl_status rc = validate_extra(b, n, c->vocab_size);
        if (rc) return rc;
    }
    return b->route_override ? validate_override(m, b->route_override, N) : PRL_OK;
}

/* Rows of the LM head's output: log-probs in the forward, ∂/∂logits in the backward. */
typedef struct logits_ctx {
    prl_model *m;
    const prl_batch *b;
    float *out;
    const prl_real *logits; /* [N,V]: the trunk's, or an MTP module's */
    prl_real *lse;          /* [N] */
} logits_ctx;

static int target_of(const prl_batch *b, int n)
{
    return b->targets && valid_pos(b, n) ? b->targets[n] : -1;
}

static void logprob_rows(void *p, int r0, int r1)
{
    logits_ctx *c = p;
    int V = c->m->cfg.vocab_size;
    for (int n = r0; n < r1; n++) {
        int y = target_of(c->b, n);
        float lp = 0;
        if (y >= 0)
            lp = (float)prl_logprob_forward(&c->lse[n], c->logits + (size_t)n * V, V, y,
                                            c->b->temperature);
        if (c->out) c->out[n] = lp;
    }
}

/* The parameters of an mHC module at offsets off[4] (γ = 1 without mhc_use_gamma). */
static prl_mhc_params mhc_params(const prl_model *m, const size_t off[4])
{
    return (prl_mhc_params){.phi = P(off[0]), .gamma = m->cfg.mhc_use_gamma ? P(off[1]) : m->acts->ones,
                            .alpha = P(off[2]), .beta = P(off[3])};
}

static prl_mhc_grads mhc_grads(const prl_model *m, const size_t off[4])
{
    return (prl_mhc_grads){.dphi = G(off[0]),
                           .dgamma = m->cfg.mhc_use_gamma ? G(off[1]) : m->acts->dgamma_sink,
                           .dalpha = G(off[2]), .dbeta = G(off[3])};
}

/* The residual stream(s) entering site `site` (0 attention, 1 FFN) of layer l: the mHC
** streams [N, n·d], else the plain residual, which is itself the sublayer's input. */
static prl_real *site_stream(const prl_model *m, int l, int site)
{
    layer_acts *la = &m->acts->layer[l];
    if (layer_mhc(m, l)) return la->xs[site];
    return site ? la->res_ffn : la->res_attn;
}

/* Where the stream after layer l goes: the next layer's attention site, or the final one. */
static prl_real *layer_out_stream(const prl_model *m, int l)
{
    if (l + 1 < m->cfg.num_hidden_layers) return site_stream(m, l + 1, 0);
    return m->cfg.use_mhc ? m->acts->xs_final : m->acts->res_final;
}

/* hc_pre of a site: its coefficients and the sublayer input res_attn / res_ffn. */
static void site_enter(prl_model *m, int l, int site)
{
    if (!layer_mhc(m, l)) return;
    layer_acts *la = &m->acts->layer[l];
    prl_mhc_shape sh = site_shape(m, 1);
    prl_mhc_params p = mhc_params(m, m->acts->lo[l].hc[site]);
    prl_real *x_in = site ? la->res_ffn : la->res_attn;
    prl_mhc_site_forward(&la->hc[site], la->xs[site], &p, m->cfg.rms_norm_eps, sh, m->precision);
    prl_mhc_pre_forward(x_in, la->xs[site], la->hc[site].pre, sh);
    rnd(m, x_in, (size_t)sh.N * sh.d);
}

/* The sublayer's output (tmp) back into the residual, as `next`: sandwich post-norm, then
** hc_post (mHC) or the plain sum; then the block post-norm after a listed layer's FFN. */
static void site_leave(prl_model *m, int l, int site, prl_real *next)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    const prl_config *c = &m->cfg;
    int N = a->N, d = c->hidden_size, S = prl_config_streams(c) * d;
    int block_post = site == 1 && prl_config_block_post_norm(c, l);
    prl_real *out = block_post ? la->bp_in : next;
    const prl_real *F = a->tmp;
    if (residual_glue(c)) {
        if (c->sandwich_norm) {
            memcpy(la->sub[site], a->tmp, (size_t)N * d * sizeof(prl_real));
            prl_rmsnorm_forward(la->F[site], la->rstd_sub[site], la->sub[site],
                                P(site ? o->ln_pm : o->ln_pa), N, d, d, d, c->rms_norm_eps);
            rnd(m, la->F[site], (size_t)N * d);
        } else {
            memcpy(la->F[site], a->tmp, (size_t)N * d * sizeof(prl_real));
        }
        F = la->F[site];
    }
    if (layer_mhc(m, l)) {
        prl_mhc_shape sh = site_shape(m, 1);
        int ns = prl_mhc_states(sh), n2 = sh.n * sh.n;
        prl_mhc_post_forward(out, F, la->xs[site], la->hc[site].post,
                             la->hc[site].S + (size_t)(ns - 1) * n2, ns * n2, sh);
        rnd(m, out, (size_t)N * S);
    } else {
        residual_add(m, out, site_stream(m, l, site), F); /* rounds */
    }
    if (block_post) {
        prl_rmsnorm_forward(next, la->rstd_bp, la->bp_in, P(o->ln_bp), N, S, S, S, c->rms_norm_eps);
        rnd(m, next, (size_t)N * S);
    }
}

/* Model start and end of the streams: the embedding copied into every stream, and the
** merge head (hc_pre only) into res_final before the final norm. */
static void streams_begin(prl_model *m)
{
    if (!m->cfg.use_mhc) return;
    prl_acts *a = m->acts;
    int n = m->cfg.mhc_num_stream, d = m->cfg.hidden_size;
    for (int t = 0; t < a->N; t++)
        for (int i = 0; i < n; i++)
            memcpy(a->layer[0].xs[0] + ((size_t)t * n + i) * d, a->layer[0].res_attn + (size_t)t * d,
                   (size_t)d * sizeof(prl_real));
}

static void streams_end(prl_model *m)
{
    if (!m->cfg.use_mhc) return;
    prl_acts *a = m->acts;
    prl_mhc_shape sh = site_shape(m, 0);
    prl_mhc_params p = mhc_params(m, model_offs(m)->merge);
    prl_mhc_site_forward(&a->hc_merge, a->xs_final, &p, m->cfg.rms_norm_eps, sh, m->precision);
    prl_mhc_pre_forward(a->res_final, a->xs_final, a->hc_merge.pre, sh);
    rnd(m, a->res_final, (size_t)sh.N * sh.d);
}

/* Σ w·logp over the batch's targets in position order (double), for a thread-independent
** value; *n_targets counts the positions with a target. */
static double weighted_logp(const prl_batch *b, const prl_real *logits, const prl_real *lse,
                            int V, int *n_targets)
{
    double sum = 0;
    for (int n = 0; n < b->B * b->T; n++) {
        int y = b->targets ? b->targets[n] : -1;
        if (y < 0 || !valid_pos(b, n)) continue;
        ++*n_targets;
        if (b->weights)
            sum += (double)b->weights[n] *
                   (logits[(size_t)n * V + y] / (prl_real)b->temperature - lse[n]);
        for (int i = 0; i < b->n_extra; i++) {
            int32_t e = b->extra_targets[(size_t)n * b->n_extra + i];
            if (e >= 0)
                sum += (double)b->extra_weights[(size_t)n * b->n_extra + i] *
                       (logits[(size_t)n * V + e] / (prl_real)b->temperature - lse[n]);
        }
    }
    return sum;
}

/* Decoder layer l (trunk or MTP) from its input (res_attn, or the streams xs[0] with mHC) to
** `out`: attention site, FFN site. *moe_idx counts MoE layers (router bias and route slot);
** `train` adds the layer's auxiliary losses to st. Returns non-zero when a hook stops. */
static int layer_forward(prl_model *m, int l, int *moe_idx, const prl_batch *b,
                         expert_task *tasks, prl_forward_stats *st, int train, prl_real *out)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = dims_of(&m->cfg);
    int N = a->N, stop;
    site_enter(m, l, 0);
    prl_rmsnorm_forward(la->ln_a, la->rstd_a, la->res_attn, P(o->ln1), N, D.d, D.d, D.d,
                        m->cfg.rms_norm_eps);
    rnd(m, la->ln_a, (size_t)N * D.d);
    stop = mla_forward(m, l, b);
    site_leave(m, l, 0, site_stream(m, l, 1));
    site_enter(m, l, 1);
    prl_rmsnorm_forward(la->ln_f, la->rstd_f, la->res_ffn, P(o->ln2), N, D.d, D.d, D.d,
                        m->cfg.rms_norm_eps);
    rnd(m, la->ln_f, (size_t)N * D.d);
    if (prl_config_is_moe(&m->cfg, l)) {
        stop = stop || moe_forward(m, l, *moe_idx, b, tasks);
        if (train) aux_losses(m, la, b, &st->balance_loss, &st->z_loss);
        ++*moe_idx;
    } else {
        prl_swiglu_forward(a->tmp, la->a13, la->h, la->ln_f, P(o->w1), P(o->w2), N, D.d, D.I, 0,
                           m->precision);
        stop = stop || emit(m, l, "mlp.out", a->tmp, N, D.d);
    }
    site_leave(m, l, 1, out);
    return stop;
}

/* The batch MTP module k trains on, over t's buffers: temperature 1, native routes, the
** trunk's loss scale (so its gradients are scaled like the trunk's). */
static prl_batch mtp_view(const prl_batch *b, const mtp_acts *t)
{
    return (prl_batch){.B = b->B, .T = b->T, .tokens = t->tokens, .lens = t->lens,
                       .targets = t->targets, .weights = t->weights, .temperature = 1,
                       .loss_scale = b->loss_scale};
}

/* Fill t with the depth-(k+1) shift of b (k 0-based; prl_mtp_shift), weights scaled by λ/D,
** and return its view. */
static prl_batch mtp_batch(const prl_model *m, const prl_batch *b, int k, mtp_acts *t)
{
    const prl_config *c = &m->cfg;
    prl_mtp_shift(t->tokens, t->targets, t->weights, t->lens, b->tokens, b->targets, b->weights,
                  b->lens, b->B, b->T, k + 1, c->mtp_loss_weight / c->num_nextn_predict_layers);
    return mtp_view(b, t);
}

/* The MTP modules after the trunk (spec §9.1–9.2): module k reads h^{k−1} (h⁰ = res_final,
** the merged trunk state before the final norm) and Emb(t_{i+k}), runs its plain decoder
** layer and the shared head. Adds λ/D·Σ_k Σ_i w·logp to st->mtp_loss. */
static int mtp_forward(prl_model *m, const prl_batch *b, int moe_idx, expert_task *tasks,
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
        prl_embedding_forward(t->emb, P(model_offs(m)->embed), t->tokens, N, d);
        prl_mtp_input_forward(a->layer[l].res_attn, t->cat, t->rstd_e, t->rstd_h, t->emb, h_prev,
                              P(o->enorm), P(o->hnorm), P(o->eh_proj), N, d, c->rms_norm_eps,
                              m->precision);
        stop = layer_forward(m, l, &moe_idx, &bk, tasks, st, 1, t->h);
        /* the shared head rounds as the main head does (and as the infer path's drafts) */
        prl_rmsnorm_forward(t->ln, t->rstd, t->h, P(o->sh_norm), N, d, d, d, c->rms_norm_eps);
        rnd(m, t->ln, (size_t)N * d);
        prl_matmul_forward(t->logits, t->ln, P(o->sh_head), N, d, V, 0);
        rnd(m, t->logits, (size_t)N * V);
        stop = stop || emit(m, l, "mtp.logits", t->logits, N, V);
        logits_ctx lc = {.m = m, .b = &bk, .logits = t->logits, .lse = t->lse};
        prl_parallel_rows(N, logprob_rows, &lc);
        st->mtp_loss += weighted_logp(&bk, t->logits, t->lse, V, &unused);
        h_prev = t->h;
    }
    return stop;
}

/* Forward with saved activations; `train` also counts experts and computes aux losses. */
static prl_status forward(prl_model *m, const prl_batch *b, float *out_logp,
                          prl_forward_stats *st, int train)
{
    prl_status rc = validate_batch(m, b);
    if (rc) return rc;
    if ((rc = ensure_acts(m, b->B, b->T))) return rc;
    prl_acts *a = m->acts;
    dims D = dims_of(&m->cfg);
    int N = a->N;
    prl_forward_stats stats = {0};
    expert_task *tasks = malloc(((size_t)D.E + (size_t)N * D.K / PRL_ROW_BLOCK + 1) * sizeof *tasks);
    if (!tasks) return prl_error_set(PRL_ERR_NOMEM, "expert tasks");
    a->have_forward = 0;
    refresh_rounded_weights(m);
    a->index_loss = 0;
    const model_offsets *mo = model_offs(m);
    prl_embedding_forward(a->layer[0].res_attn, P(mo->embed), b->tokens, N, D.d);
    streams_begin(m);
    int stop = 0, moe_idx = 0;
    for (int l = 0; l < D.L && !stop; l++)
        stop = layer_forward(m, l, &moe_idx, b, tasks, &stats, train, layer_out_stream(m, l));
    if (!stop) streams_end(m);
    prl_rmsnorm_forward(a->ln_final, a->rstd_final, a->res_final, P(mo->norm), N, D.d, D.d, D.d,
                        m->cfg.rms_norm_eps);
    rnd(m, a->ln_final, (size_t)N * D.d);
    prl_matmul_forward(a->logits, a->ln_final, P(mo->head), N, D.d, D.V, 0);
    rnd(m, a->logits, (size_t)N * D.V);
    emit(m, -1, "final.logits", a->logits, N, D.V);
    logits_ctx lc = {.m = m, .b = b, .out = out_logp, .logits = a->logits, .lse = a->lse};
    prl_parallel_rows(N, logprob_rows, &lc);
    stats.lm_loss = weighted_logp(b, a->logits, a->lse, D.V, &stats.n_targets);
    a->mtp_ran = train && b->with_mtp && m->cfg.num_nextn_predict_layers > 0 && !stop;
    if (a->mtp_ran)
        stop = mtp_forward(m, b, moe_idx, tasks, &stats);
    free(tasks);
    if (train && m->cfg.bias_update_rate > 0) {
        for (int i = 0; i < m->n_moe; i++)
            for (int n = 0; n < N; n++)
                if (valid_pos(b, n))
                    for (int k = 0; k < D.K; k++)
                        m->expert_counts[(size_t)i * D.E +
                                         a->routes[((size_t)i * N + n) * D.K + k]] += 1;
    }
    stats.loss = stats.lm_loss + stats.balance_loss + stats.z_loss + stats.mtp_loss;
    stats.index_loss = a->index_loss;
    if (st) *st = stats;
    a->have_forward = 1;
    return PRL_OK;
}

prl_status prl_model_forward(prl_model *m, const prl_batch *b, float *out_logp,
                             prl_forward_stats *st)
{
    return forward(m, b, out_logp, st, 1);
}

prl_status prl_model_logprobs(prl_model *m, const prl_batch *b, float *out_logp)
{
    prl_status rc = forward(m, b, out_logp, NULL, 0);
    m->acts->have_forward = 0; /* no aux-loss state: a backward must redo the forward */
    return rc;
}

const int32_t *prl_model_routes(const prl_model *m) { return m->acts->routes; }
const prl_real *prl_model_logits(const prl_model *m) { return m->acts->logits; }

/* The k largest of row[0..V) into ids[0..k) (largest first; equal values: the lower id
** first, since ids are scanned in order and only a strictly larger value moves one down). */
static void row_topk(const prl_real *row, int V, int k, int32_t *ids)
{
    int n = 0;
    for (int v = 0; v < V; v++) {
        if (n == k && !(row[v] > row[ids[k - 1]])) continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && row[v] > row[ids[at - 1]]) ids[at] = ids[at - 1], at--;
        ids[at] = v;
    }
}

prl_status prl_model_topk(const prl_model *m, const prl_batch *batch, int k, int32_t *ids,
                          float *logp)
{
    const prl_acts *a = m->acts;
    int V = m->cfg.vocab_size;
    if (k < 1 || k > V) return prl_error_set(PRL_ERR_ARG, "top-k %d not in [1, %d]", k, V);
    if (a->B != batch->B || a->T != batch->T)
        return prl_error_set(PRL_ERR_ARG, "top-k needs a forward of the same batch shape first");
    prl_real inv_tau = (prl_real)(1.0 / batch->temperature); /* as prl_logprob_forward: <= 0 */
    for (int n = 0; n < batch->B * batch->T; n++) {
        int32_t *id = ids + (size_t)n * k;
        float *lp = logp + (size_t)n * k;
        if (target_of(batch, n) < 0) { /* no log-sum-exp was taken here */
            for (int i = 0; i < k; i++) id[i] = -1, lp[i] = 0;
            continue;
        }
        const prl_real *row = a->logits + (size_t)n * V;
        row_topk(row, V, k, id);
        for (int i = 0; i < k; i++) lp[i] = (float)(row[id[i]] * inv_tau - a->lse[n]);
    }
    return PRL_OK;
}

const uint8_t *prl_model_dsa_selection(const prl_model *m, int layer)
{
    if (layer < 0 || layer >= m->cfg.num_hidden_layers || !dsa_sparse(m, layer) || !m->acts->layer)
        return NULL;
    return m->acts->layer[layer].dsa.sel;
}

/* ------------------------------------------------------------------ backward -------- */

static void zero(prl_real *p, size_t n) { memset(p, 0, n * sizeof *p); }

/* Backward of latent_forward: dz (rows at z_stride) += ∂/∂z given dy = ∂/∂y; the gain and
** kernel gradients accumulate. */
static void latent_backward(prl_model *m, prl_real *dz, const prl_real *dy, const prl_real *z,
                            int z_stride, const prl_real *zc, const prl_real *rstd, size_t g,
                            size_t conv, int C)
{
    prl_acts *a = m->acts;
    int ck = conv ? prl_config_conv_kernel(&m->cfg) : 0, N = a->N; /* as latent_forward */
    if (!ck) {
        prl_rmsnorm_backward(dz, G(g), dy, z, P(g), rstd, N, C, z_stride, C);
        return;
    }
    zero(a->dconv, (size_t)N * C);
    prl_rmsnorm_backward(a->dconv, G(g), dy, zc, P(g), rstd, N, C, C, C);
    rnd(m, a->dconv, (size_t)N * C);
    prl_conv_backward(dz, z_stride, G(conv), a->dconv, z, P(conv), a->B, a->T, C, ck);
}

/* The sinks' latent: dsink_kv (∂/∂ their [k_nope | v]) through kv_b_proj and the norm. */
static void sinks_backward(prl_model *m, int l)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = dims_of(&m->cfg);
    if (D.ns == 0 || !m->cfg.param_sink_with_value) return;
    zero(a->dsink_ckv, (size_t)D.ns * D.rkv);
    prl_matmul_backward(a->dsink_ckv, G(o->wkv_b), a->dsink_kv, la->sink_ckv, P(o->wkv_b), D.ns,
                        D.rkv, D.H * D.dkv);
    rnd(m, a->dsink_ckv, (size_t)D.ns * D.rkv);
    prl_rmsnorm_backward(G(o->sink_ckv), G(o->kv_norm), a->dsink_ckv, P(o->sink_ckv),
                         P(o->kv_norm), la->sink_rstd, D.ns, D.rkv, D.rkv, D.rkv);
}

/* Attention sublayer: dres holds ∂/∂(its output); adds the path through MLA and ln1 into dx
** (∂/∂res_attn; the plain residual passes dres itself). */
static void mla_backward(prl_model *m, int l, const prl_batch *b, prl_real *dx)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = dims_of(&m->cfg);
    int N = a->N;
    int HV = D.H * D.dv;
    prl_real *do_att = a->do_; /* ∂/∂(attention output) */
    zero(a->do_, (size_t)N * HV);
    if (D.ck && o->o_conv) { /* through o_conv: a->do_ is ∂/∂oc first */
        prl_matmul_backward(a->do_, G(o->wo), a->dres, la->oc, P(o->wo), N, HV, D.d);
        rnd(m, a->do_, (size_t)N * HV);
        zero(a->dconv, (size_t)N * HV);
        prl_conv_backward(a->dconv, HV, G(o->o_conv), a->do_, la->o, P(o->o_conv), a->B, a->T, HV, D.ck);
        do_att = a->dconv;
    } else {
        prl_matmul_backward(a->do_, G(o->wo), a->dres, la->o, P(o->wo), N, HV, D.d);
    }
    rnd(m, do_att, (size_t)N * HV);
    zero(a->dq, (size_t)N * D.H * D.dq);
    zero(a->dkv, (size_t)N * D.H * D.dkv);
    zero(a->dkr, (size_t)N * D.dr);
    zero(a->dsink_kv, (size_t)D.ns * D.H * D.dkv);
    prl_attention_backward(a->dq, a->dkv, a->dkr, a->dsink_kv, D.ns > 0 ? G(o->sink_kpe) : NULL,
                           do_att, la->att, la->q, la->kv, la->kr, la->sink_kv,
                           D.ns > 0 ? P(o->sink_kpe) : NULL, a->dattn_scratch, b->lens,
                           attn_shape(m, l));
    rnd(m, a->dq, (size_t)N * D.H * D.dq);
    rnd(m, a->dkv, (size_t)N * D.H * D.dkv);
    rnd(m, a->dkr, (size_t)N * D.dr);
    rnd(m, a->dsink_kv, (size_t)D.ns * D.H * D.dkv);
    sinks_backward(m, l);
    zero(a->dckv, (size_t)N * D.rkv);
    prl_matmul_backward(a->dckv, G(o->wkv_b), a->dkv, la->ckv, P(o->wkv_b), N, D.rkv, D.H * D.dkv);
    rnd(m, a->dckv, (size_t)N * D.rkv);
    prl_rope_backward(a->dkr, a->rope_cos, a->rope_sin, N, a->T, 1, D.dr, 0, D.dr, D.dr);
    int wa = D.rkv + D.dr;
    zero(a->dkva, (size_t)N * wa);
    latent_backward(m, a->dkva, a->dckv, la->kva, wa, la->kvc, la->rstd_kv, o->kv_norm, o->kv_conv,
                    D.rkv);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < D.dr; i++) a->dkva[(size_t)n * wa + D.rkv + i] += a->dkr[(size_t)n * D.dr + i];
    rnd(m, a->dkva, (size_t)N * wa);
    zero(a->dln, (size_t)N * D.d);
    prl_matmul_backward(a->dln, G(o->wkv_a), a->dkva, la->ln_a, P(o->wkv_a), N, D.d, wa);
    prl_rope_backward(a->dq, a->rope_cos, a->rope_sin, N, a->T, D.H, D.dq, D.dn, D.H * D.dq, D.dr);
    rnd(m, a->dq, (size_t)N * D.H * D.dq);
    zero(a->dcq, (size_t)N * D.rq);
    prl_matmul_backward(a->dcq, G(o->wq_b), a->dq, la->cq, P(o->wq_b), N, D.rq, D.H * D.dq);
    rnd(m, a->dcq, (size_t)N * D.rq);
    zero(a->dzq, (size_t)N * D.rq);
    latent_backward(m, a->dzq, a->dcq, la->zq, D.rq, la->zqc, la->rstd_q, o->q_norm, o->qa_conv,
                    D.rq);
    rnd(m, a->dzq, (size_t)N * D.rq);
    prl_matmul_backward(a->dln, G(o->wq_a), a->dzq, la->ln_a, P(o->wq_a), N, D.d, D.rq);
    rnd(m, a->dln, (size_t)N * D.d);
    prl_rmsnorm_backward(dx, G(o->ln1), a->dln, la->res_attn, P(o->ln1), la->rstd_a, N, D.d,
                         D.d, D.d);
    rnd(m, dx, (size_t)N * D.d);
}

static void expert_backward_rows_task(void *p, int i)
{
    expert_ctx *c = p;
    prl_model *m = c->m;
    prl_acts *a = m->acts;
    layer_acts *la = c->la;
    const dims *D = &c->D;
    expert_task t = c->tasks[i];
    size_t base = expert_base(c->o, D, t.e);
    const prl_real *w13 = P(base), *w2 = P(base + 2 * (size_t)D->de * D->d);
    size_t xo = (size_t)t.r0 * D->d, ho = (size_t)t.r0 * D->de;
    size_t NK = (size_t)a->N * D->K;
    prl_real *da13 = a->deh + 2 * ho, *dh = a->deh + 2 * NK * D->de + ho;
    /* dh = dyg·w2 (rows, de), then da13 (rows, 2de), then dxg = da13·w13 */
    prl_gemm(0, 0, t.rows, D->de, D->d, 1, a->dyg + xo, D->d, w2, D->de, 0, dh, D->de);
    rnd(m, dh, (size_t)t.rows * D->de);
    prl_silu_mul_backward(da13, dh, la->ea13 + 2 * ho, t.rows, D->de);
    rnd(m, da13, (size_t)t.rows * 2 * D->de);
    prl_gemm(0, 0, t.rows, D->d, 2 * D->de, 1, da13, 2 * D->de, w13, D->d, 0, a->dxg + xo, D->d);
}

/* One task per (expert, matrix pair): the weight gradient reduces over all of the expert's
** rows in one GEMM, so no two tasks write the same gradient. */
static void expert_backward_weights_task(void *p, int i)
{
    expert_ctx *c = p;
    prl_model *m = c->m;
    prl_acts *a = m->acts;
    layer_acts *la = c->la;
    const dims *D = &c->D;
    int e = i / 2, which = i % 2;
    int r0 = la->offsets[e], rows = la->offsets[e + 1] - r0;
    if (rows == 0) return;
    size_t base = expert_base(c->o, D, e);
    size_t xo = (size_t)r0 * D->d, ho = (size_t)r0 * D->de;
    if (which == 0) /* d[W1;W3] (2de,d) += da13ᵀ·xg */
        prl_gemm(1, 0, 2 * D->de, D->d, rows, 1, a->deh + 2 * ho, 2 * D->de, la->xg + xo, D->d, 1,
                 G(base), D->d);
    else /* dW2 (d,de) += dygᵀ·eh */
        prl_gemm(1, 0, D->d, D->de, rows, 1, a->dyg + xo, D->d, la->eh + ho, D->de, 1,
                 G(base + 2 * (size_t)D->de * D->d), D->de);
}

/* The backward's loss multiplier (prl_batch.loss_scale; 0 means 1). */
static double loss_scale(const prl_batch *b) { return b->loss_scale > 0 ? b->loss_scale : 1; }

/* Gradients of the balance loss and z-loss of one MoE layer into dz, times the loss scale. */
static void aux_backward(const prl_model *m, const layer_acts *la, const prl_batch *b, prl_real *dz)
{
    dims D = dims_of(&m->cfg);
    const prl_config *c = &m->cfg;
    double ls = loss_scale(b);
    if (c->balance_loss_alpha > 0) {
        double *f = calloc((size_t)D.E, sizeof(double));
        for (int bi = 0; bi < b->B; bi++) {
            int len = b->lens ? b->lens[bi] : b->T;
            memset(f, 0, (size_t)D.E * sizeof(double));
            for (int t = 0; t < len; t++)
                for (int k = 0; k < D.K; k++)
                    f[la->sel[(bi * b->T + t) * D.K + k]] += (double)D.E / (D.K * len);
            for (int t = 0; t < len; t++) {
                int n = bi * b->T + t;
                const prl_real *s = la->s + (size_t)n * D.E;
                double S = 0, dot = 0, k = ls * c->balance_loss_alpha / ((double)b->B * len);
                for (int e = 0; e < D.E; e++) S += s[e];
                for (int e = 0; e < D.E; e++) dot += k * f[e] * s[e] / S;
                for (int e = 0; e < D.E; e++) {
                    double ds = (k * f[e] - dot) / S;
                    dz[(size_t)n * D.E + e] += (prl_real)(ds * s[e] * (1 - s[e]));
                }
            }
        }
        free(f);
    }
    if (c->router_z_loss_coef > 0) {
        int n_valid = 0;
        for (int n = 0; n < b->B * b->T; n++) n_valid += valid_pos(b, n);
        for (int n = 0; n < b->B * b->T; n++) {
            if (!valid_pos(b, n)) continue;
            const prl_real *z = la->z + (size_t)n * D.E;
            double mx = z[0], sum = 0;
            for (int e = 1; e < D.E; e++) mx = z[e] > mx ? z[e] : mx;
            for (int e = 0; e < D.E; e++) sum += exp(z[e] - mx);
            double lse = mx + log(sum), k = ls * c->router_z_loss_coef * 2 * lse / n_valid;
            for (int e = 0; e < D.E; e++)
                dz[(size_t)n * D.E + e] += (prl_real)(k * exp(z[e] - mx) / sum);
        }
    }
}

/* Backward per-token passes of the MoE. */
static void dyg_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    prl_acts *a = c->m->acts;
    int d = c->D.d, K = c->D.K;
    for (int n = r0; n < r1; n++) {
        const prl_real *dy = a->dres + (size_t)n * d;
        for (int k = 0; k < K; k++) {
            int q = la->pos[n * K + k];
            const prl_real *y = la->yg + (size_t)q * d;
            prl_real *dyg = a->dyg + (size_t)q * d, g = la->g[n * K + k], dot = 0;
            for (int i = 0; i < d; i++) {
                dot += dy[i] * y[i];
                dyg[i] = g * dy[i];
            }
            rnd(c->m, dyg, (size_t)d);
            a->dg[n * K + k] = dot;
        }
    }
}

static void scatter_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    prl_acts *a = c->m->acts;
    int d = c->D.d, K = c->D.K;
    for (int n = r0; n < r1; n++) {
        prl_real *dx = a->dln + (size_t)n * d;
        for (int k = 0; k < K; k++) {
            const prl_real *src = a->dxg + (size_t)la->pos[n * K + k] * d;
            for (int i = 0; i < d; i++) dx[i] += src[i];
        }
    }
}

static void gate_backward_rows(void *p, int r0, int r1)
{
    token_ctx *c = p;
    layer_acts *la = c->la;
    prl_acts *a = c->m->acts;
    int E = c->D.E, K = c->D.K;
    memset(a->dz + (size_t)r0 * E, 0, (size_t)(r1 - r0) * E * sizeof(prl_real));
    for (int n = r0; n < r1; n++)
        prl_moe_gate_backward(a->dz + (size_t)n * E, a->dg + (size_t)n * K, la->sel + (size_t)n * K,
                              la->s + (size_t)n * E, E, K, c->m->cfg.norm_topk_prob,
                              c->m->cfg.routed_scaling_factor);
}

/* FFN sublayer (dense or MoE): dres holds ∂/∂(its output); adds the path through the FFN
** and ln2 into dx (∂/∂res_ffn; the plain residual passes dres itself). */
static void ffn_backward(prl_model *m, int l, const prl_batch *b, expert_task *tasks,
                         prl_real *dx)
{
    prl_acts *a = m->acts;
    layer_acts *la = &a->layer[l];
    const layer_offsets *o = &a->lo[l];
    dims D = dims_of(&m->cfg);
    int N = a->N;
    zero(a->dln, (size_t)N * D.d);
    if (!prl_config_is_moe(&m->cfg, l)) {
        prl_swiglu_backward(a->dln, G(o->w1), G(o->w2), a->dffn_scratch, a->dres, la->ln_f,
                            la->a13, la->h, P(o->w1), P(o->w2), N, D.d, D.I, m->precision);
    } else {
        token_ctx tc = {.m = m, .la = la, .D = D};
        prl_parallel_rows(N, dyg_rows, &tc);
        expert_ctx c = {.m = m, .la = la, .o = o, .D = D, .tasks = tasks};
        c.n_tasks = build_expert_tasks(tasks, la->offsets, D.E);
        prl_parallel_for(c.n_tasks, expert_backward_rows_task, &c);
        prl_parallel_for(2 * D.E, expert_backward_weights_task, &c);
        prl_parallel_rows(N, scatter_rows, &tc);
        if (D.sde > 0)
            prl_swiglu_backward(a->dln, G(o->sw1), G(o->sw2), a->dffn_scratch, a->dres,
                                la->ln_f, la->a13, la->h, P(o->sw1), P(o->sw2), N, D.d, D.sde,
                                m->precision);
        prl_parallel_rows(N, gate_backward_rows, &tc);
        aux_backward(m, la, b, a->dz);
        rnd(m, a->dz, (size_t)N * D.E);
        prl_matmul_backward(a->dln, G(o->router), a->dz, la->ln_f, P(o->router), N, D.d, D.E);
    }
    rnd(m, a->dln, (size_t)N * D.d);
    prl_rmsnorm_backward(dx, G(o->ln2), a->dln, la->res_ffn, P(o->ln2), la->rstd_f, N, D.d,
                         D.d, D.d);
    rnd(m, dx, (size_t)N * D.d);
}

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
    prl_mhc_shape sh = site_shape(m, 1);
    int ns = prl_mhc_states(sh), n2 = sh.n * sh.n;
    const prl_real *dF = a->dxs; /* ∂/∂F: the plain residual passes the stream's gradient */
    if (c->use_mhc) {
        zero(a->dxs2, (size_t)N * S), zero(a->dxin, Nd);
        zero(a->dpost, (size_t)N * sh.n), zero(a->dH, (size_t)N * n2);
        prl_mhc_post_backward(a->dxin, a->dxs2, a->dpost, a->dH, a->dxs, la->F[site], la->xs[site],
                              la->hc[site].post, la->hc[site].S + (size_t)(ns - 1) * n2, ns * n2, sh);
        rnd(m, a->dxin, Nd); /* F is a rounded output (sandwich norm or sublayer) */
        dF = a->dxin;
    } else {
        memcpy(a->dxs2, a->dxs, (size_t)N * S * sizeof(prl_real));
    }
    zero(a->dres, Nd); /* ∂/∂(sublayer output) */
    if (c->sandwich_norm) {
        size_t g = site ? o->ln_pm : o->ln_pa;
        prl_rmsnorm_backward(a->dres, G(g), dF, la->sub[site], P(g), la->rstd_sub[site], N, d, d, d);
        rnd(m, a->dres, Nd);
    } else {
        memcpy(a->dres, dF, Nd * sizeof(prl_real));
    }
    zero(a->dxin, Nd); /* ∂/∂(sublayer input) */
    if (site) ffn_backward(m, l, b, tasks, a->dxin);
    else mla_backward(m, l, b, a->dxin);
    if (c->use_mhc) {
        zero(a->dpre, (size_t)N * sh.n);
        prl_mhc_pre_backward(a->dxs2, a->dpre, a->dxin, la->xs[site], la->hc[site].pre, sh);
        prl_mhc_params p = mhc_params(m, o->hc[site]);
        prl_mhc_grads g = mhc_grads(m, o->hc[site]);
        prl_mhc_site_backward(a->dxs2, &g, a->hc_scratch, a->dpre, a->dpost, a->dH, &la->hc[site],
                              la->xs[site], &p, sh, m->precision);
    } else {
        for (size_t i = 0; i < Nd; i++) a->dxs2[i] += a->dxin[i];
    }
    rnd(m, a->dxs2, (size_t)N * S); /* the stream before the site, all its paths summed */
    swap_dxs(a);
}

/* Backward of the layers with the residual glue on: a->dres holds ∂/∂res_final; afterwards
** ∂/∂(the embedding rows), summed over the streams in order. */
static void residual_backward(prl_model *m, const prl_batch *b, expert_task *tasks)
{
    prl_acts *a = m->acts;
    const prl_config *c = &m->cfg;
    int N = a->N, d = c->hidden_size, n = prl_config_streams(c), S = n * d;
    if (c->use_mhc) { /* the merge head */
        prl_mhc_shape sh = site_shape(m, 0);
        prl_mhc_params p = mhc_params(m, model_offs(m)->merge);
        prl_mhc_grads g = mhc_grads(m, model_offs(m)->merge);
        zero(a->dxs, (size_t)N * S), zero(a->dpre, (size_t)N * n);
        prl_mhc_pre_backward(a->dxs, a->dpre, a->dres, a->xs_final, a->hc_merge.pre, sh);
        prl_mhc_site_backward(a->dxs, &g, a->hc_scratch, a->dpre, NULL, NULL, &a->hc_merge,
                              a->xs_final, &p, sh, m->precision);
        rnd(m, a->dxs, (size_t)N * S);
    } else {
        memcpy(a->dxs, a->dres, (size_t)N * d * sizeof(prl_real));
    }
    for (int l = c->num_hidden_layers - 1; l >= 0; l--) {
        layer_acts *la = &a->layer[l];
        if (prl_config_block_post_norm(c, l)) {
            size_t g = a->lo[l].ln_bp;
            zero(a->dxs2, (size_t)N * S);
            prl_rmsnorm_backward(a->dxs2, G(g), a->dxs, la->bp_in, P(g), la->rstd_bp, N, S, S, S);
            rnd(m, a->dxs2, (size_t)N * S);
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
    if (n > 1) rnd(m, a->dres, (size_t)N * d); /* as the plain path's gradient at the embedding */
}

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
        zero(a->dres, (size_t)N * d); /* ∂/∂(sublayer output) */
        if (m->cfg.sandwich_norm) {
            size_t g = site ? o->ln_pm : o->ln_pa;
            prl_rmsnorm_backward(a->dres, G(g), dx, la->sub[site], P(g), la->rstd_sub[site], N, d,
                                 d, d);
            rnd(m, a->dres, (size_t)N * d);
        } else {
            memcpy(a->dres, dx, (size_t)N * d * sizeof(prl_real));
        }
        if (site) ffn_backward(m, l, b, tasks, dx); /* dx keeps the residual's own path */
        else mla_backward(m, l, b, dx);
    }
}

static void dlogits_rows(void *p, int r0, int r1);

/* Backward of mtp_forward, last module first: the head's loss gradient and the chain from
** the next module into h^k, the decoder layer, the input op (into the shared embedding and
** h^{k−1}). Leaves ∂/∂h⁰ in a->dh_mtp. */
static void mtp_backward(prl_model *m, const prl_batch *b, expert_task *tasks)
{
    prl_acts *a = m->acts;
    const prl_config *c = &m->cfg;
    int N = a->N, d = c->hidden_size, V = c->vocab_size;
    size_t embed = model_offs(m)->embed;
    zero(a->dh_mtp, (size_t)N * d);
    for (int k = c->num_nextn_predict_layers - 1; k >= 0; k--) {
        int l = c->num_hidden_layers + k;
        mtp_acts *t = &a->mtp[k];
        const layer_offsets *o = &a->lo[l];
        prl_batch bk = mtp_view(b, t);
        logits_ctx dc = {.m = m, .b = &bk, .logits = t->logits, .lse = t->lse};
        prl_parallel_rows(N, dlogits_rows, &dc);
        rnd(m, a->dlogits, (size_t)N * V);
        zero(a->dln, (size_t)N * d);
        prl_matmul_backward(a->dln, G(o->sh_head), a->dlogits, t->ln, P(o->sh_head), N, d, V);
        rnd(m, a->dln, (size_t)N * d);
        prl_rmsnorm_backward(a->dh_mtp, G(o->sh_norm), a->dln, t->h, P(o->sh_norm), t->rstd, N,
                             d, d, d);
        rnd(m, a->dh_mtp, (size_t)N * d); /* ∂h^k: the head's path and the next module's */
        plain_layer_backward(m, l, &bk, tasks, a->dh_mtp); /* now ∂/∂(the input op's output) */
        const prl_real *h_prev = k ? a->mtp[k - 1].h : a->res_final;
        zero(a->dh_mtp2, (size_t)N * d), zero(a->demb_mtp, (size_t)N * d);
        prl_mtp_input_backward(a->demb_mtp, a->dh_mtp2, G(o->enorm), G(o->hnorm), G(o->eh_proj),
                               a->dcat_mtp, a->dh_mtp, t->cat, t->emb, h_prev, P(o->enorm),
                               P(o->hnorm), P(o->eh_proj), t->rstd_e, t->rstd_h, N, d,
                               m->precision);
        prl_embedding_backward(G(embed), a->demb_mtp, t->tokens, N, d);
        prl_real *swap = a->dh_mtp;
        a->dh_mtp = a->dh_mtp2, a->dh_mtp2 = swap;
    }
}

static void dlogits_rows(void *p, int r0, int r1)
{
    logits_ctx *c = p;
    prl_acts *a = c->m->acts;
    int V = c->m->cfg.vocab_size;
    for (int n = r0; n < r1; n++) {
        prl_real *dl = a->dlogits + (size_t)n * V;
        memset(dl, 0, (size_t)V * sizeof *dl);
        int y = target_of(c->b, n), ne = 0;
        if (y < 0) continue;
        int32_t ys[1 + PRL_MAX_EXTRA_TARGETS];
        prl_real ws[1 + PRL_MAX_EXTRA_TARGETS];
        ys[ne] = y, ws[ne++] = c->b->weights ? (prl_real)(c->b->weights[n] * loss_scale(c->b)) : 0;
        for (int i = 0; i < c->b->n_extra; i++) { /* the teacher's top-k (distillation) */
            size_t e = (size_t)n * c->b->n_extra + i;
            if (c->b->extra_targets[e] >= 0)
                ys[ne] = c->b->extra_targets[e],
                ws[ne++] = (prl_real)(c->b->extra_weights[e] * loss_scale(c->b));
        }
        if (ne == 1 && ws[0] == 0) continue;
        prl_logprob_backward_multi(dl, c->logits + (size_t)n * V, c->lse[n], V, ys, ws, ne,
                                   c->b->temperature);
    }
}

/* The indexers' own objective: its gradient reaches only the indexer tensors (its input is
** detached, docs/model.md DSA), so it runs apart from the LM backward. */
static void dsa_backward(prl_model *m, const prl_batch *b)
{
    prl_acts *a = m->acts;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (!prl_config_is_dsa(&m->cfg, l)) continue;
        layer_acts *la = &a->layer[l];
        prl_dsa_weights w = dsa_weights(m, P(0), l), g = dsa_weights(m, m->grads, l);
        prl_dsa_backward(&g, &a->dsa_scratch, &la->dsa, &w, la->ln_a, la->cq, a->rope_cos,
                         a->rope_sin, dsa_sparse(m, l), b->lens, dsa_dims(m), m->precision);
    }
}

prl_status prl_model_backward(prl_model *m, const prl_batch *b)
{
    prl_acts *a = m->acts;
    if (!a->have_forward || a->B != b->B || a->T != b->T)
        return prl_error_set(PRL_ERR_ARG, "backward needs a forward of the same batch first");
    dims D = dims_of(&m->cfg);
    int N = a->N;
    dsa_backward(m, b);
    if (m->cfg.dsa_freeze_main) return PRL_OK; /* only the indexer learns */
    const model_offsets *mo = model_offs(m);
    expert_task *tasks = malloc(((size_t)D.E + (size_t)N * D.K / PRL_ROW_BLOCK + 1) * sizeof *tasks);
    if (!tasks) return prl_error_set(PRL_ERR_NOMEM, "expert tasks");
    if (a->mtp_ran) mtp_backward(m, b, tasks); /* ∂L_MTP/∂h⁰ into dh_mtp; uses dres, dlogits */
    if (m->cfg.mtp_freeze_trunk) { /* only the MTP modules learn: the trunk's gradient is unused */
        free(tasks);
        return PRL_OK;
    }
    logits_ctx dc = {.m = m, .b = b, .logits = a->logits, .lse = a->lse};
    prl_parallel_rows(N, dlogits_rows, &dc);
    rnd(m, a->dlogits, (size_t)N * D.V);
    zero(a->dln, (size_t)N * D.d);
    prl_matmul_backward(a->dln, G(mo->head), a->dlogits, a->ln_final, P(mo->head), N, D.d, D.V);
    rnd(m, a->dln, (size_t)N * D.d);
    zero(a->dres, (size_t)N * D.d);
    prl_rmsnorm_backward(a->dres, G(mo->norm), a->dln, a->res_final, P(mo->norm), a->rstd_final,
                         N, D.d, D.d, D.d);
    if (a->mtp_ran) /* h⁰ = res_final also feeds MTP module 1 */
        for (size_t i = 0; i < (size_t)N * D.d; i++) a->dres[i] += a->dh_mtp[i];
    rnd(m, a->dres, (size_t)N * D.d); /* once both paths into h⁰ are summed */
    if (residual_glue(&m->cfg)) {
        residual_backward(m, b, tasks);
    } else {
        for (int l = D.L - 1; l >= 0; l--) {
            ffn_backward(m, l, b, tasks, a->dres);
            mla_backward(m, l, b, a->dres);
        }
    }
    free(tasks);
    prl_embedding_backward(G(mo->embed), a->dres, b->tokens, N, D.d);
    return PRL_OK;
}

/* ------------------------------------------------------------------ bias balancing -- */

void prl_model_update_router_bias(prl_model *m)
{
    const prl_config *c = &m->cfg;
    int E = c->n_routed_experts;
    if (c->bias_update_rate <= 0 || m->n_moe == 0) return;
    if (c->dsa_freeze_main || c->mtp_freeze_trunk) { /* the frozen trunk keeps its biases too */
        memset(m->expert_counts, 0, (size_t)m->n_moe * E * sizeof *m->expert_counts);
        return;
    }
    for (int i = 0; i < m->n_moe; i++) {
        double *cnt = m->expert_counts + (size_t)i * E, total = 0, ms = 0;
        prl_real *bias = m->router_bias + (size_t)i * E;
        for (int e = 0; e < E; e++) total += cnt[e];
        if (total <= 0) continue;
        if (c->bias_rule == PRL_BIAS_SIGN) {
            double mean = total / E;
            for (int e = 0; e < E; e++) {
                double diff = mean - cnt[e];
                bias[e] += (prl_real)(c->bias_update_rate * ((diff > 0) - (diff < 0)));
            }
        } else {
            for (int e = 0; e < E; e++) {
                double d = cnt[e] / total - 1.0 / E;
                ms += d * d;
            }
            double rms = sqrt(ms / E + 1e-12);
            for (int e = 0; e < E; e++)
                bias[e] -= (prl_real)(c->bias_update_rate * (cnt[e] / total - 1.0 / E) / rms);
        }
        memset(cnt, 0, (size_t)E * sizeof *cnt);
    }
}
