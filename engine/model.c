/*
** model.c — the MLA + MoE transformer: parameter layout, initialisation, and the train
** path (full-sequence forward with saved activations, backward, log-probs, route capture
** and override, expert-bias balancing).
**
** The maths is docs/model.md; the train path is its straight-line driver in the style of
** llm.c's gpt2_forward/gpt2_backward: per layer, compute the named views and call the kernels
** of ops.c in order; the backward is the mirror list. No graph, no autograd. This file holds
** the dimensions, the parameter table (each tensor's name, shape and offset), init and free,
** the tensor hook, the train precision and expert-bias balancing; the path is split by
** concern around the private model_int.h, each block's forward beside its backward:
**   model_acts.c      the saved activations and backward scratch, carved out of one block
**   model_attn.c      the attention sublayer: MLA, parameter sinks, ModAttn convs, DSA indexer
**   model_moe.c       the FFN sublayer: dense SwiGLU, MoE routing and experts, aux losses
**   model_residual.c  the residual glue: mHC streams, sandwich and block post-norms
**   model_mtp.c       the MTP modules after the trunk
**   model_train.c     the drivers: batch checks, the forward, log-probs, top-k, the backward
*/
#include "engine/model_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ dimensions ------ */

dims model__dims_of(const prl_config *c)
{
    dims D = {
        .V = c->vocab_size,
        .d = c->hidden_size,
        .L = c->num_hidden_layers,
        .H = c->num_attention_heads,
        .rq = c->q_lora_rank,
        .rkv = c->kv_lora_rank,
        .dn = c->qk_nope_head_dim,
        .dr = c->qk_rope_head_dim,
        .dv = c->v_head_dim,
        .I = c->intermediate_size,
        .E = c->n_routed_experts,
        .K = c->num_experts_per_tok,
        .de = c->moe_intermediate_size,
        .sde = c->n_shared_experts * c->moe_intermediate_size,
        .ns = c->param_sink_number,
        .ck = prl_config_conv_kernel(c),
        .HI = c->index_n_heads,
        .dI = c->index_head_dim,
    };
    D.dq = D.dn + D.dr;
    D.dkv = D.dn + D.dv;
    return D;
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
    off[1] = c->mhc_use_gamma
                 ? add_tensor(tb, PRL_PARAM_NORM, layer, -1, nd, 0, "%s.norm_gamma", prefix)
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
    dims D = model__dims_of(c);
    int S = prl_config_streams(c) * D.d, ck = mtp ? 0 : D.ck;
    char name[96];
    const char *p = "model.layers";
    if (c->use_mhc && !mtp) {
        snprintf(name, sizeof name, "%s.%d.attn_mhc_module", p, l);
        add_mhc_module(tb, c, l, 1, o->hc[0], name);
    }
    o->ln1 = add_tensor(tb, PRL_PARAM_NORM, l, -1, D.d, 0, "%s.%d.input_layernorm.weight", p, l);
    if (D.rq == 0) /* q_lora_rank null: one direct projection (wq_b reads the input) */
        o->wq_b = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, (int64_t)D.H * D.dq, D.d,
                             "%s.%d.self_attn.q_proj.weight", p, l);
    else {
        o->wq_a = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.rq, D.d,
                             "%s.%d.self_attn.q_a_proj.weight", p, l);
        if (ck) o->qa_conv = add_conv(tb, l, D.rq, ck, "%s.%d.self_attn.qa_conv.weight", l);
        o->q_norm = add_tensor(tb, PRL_PARAM_NORM, l, -1, D.rq, 0,
                               "%s.%d.self_attn.q_a_layernorm.weight", p, l);
        o->wq_b = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, (int64_t)D.H * D.dq, D.rq,
                             "%s.%d.self_attn.q_b_proj.weight", p, l);
    }
    o->wkv_a = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.rkv + D.dr, D.d,
                          "%s.%d.self_attn.kv_a_proj_with_mqa.weight", p, l);
    if (ck) o->kv_conv = add_conv(tb, l, D.rkv, ck, "%s.%d.self_attn.compresskv_conv.weight", l);
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
        o->ln_pm =
            add_tensor(tb, PRL_PARAM_NORM, l, -1, D.d, 0, "%s.%d.post_mlp_layernorm.weight", p, l);
    if (prl_config_block_post_norm(c, l))
        o->ln_bp =
            add_tensor(tb, PRL_PARAM_NORM, l, -1, S, 0, "%s.%d.block_post_layernorm.weight", p, l);
    if (!prl_config_is_moe(c, l)) {
        o->w1 =
            add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.I, D.d, "%s.%d.mlp.gate_proj.weight", p, l);
        o->w3 = add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.I, D.d, "%s.%d.mlp.up_proj.weight", p, l);
        o->w2 =
            add_tensor(tb, PRL_PARAM_MATRIX, l, -1, D.d, D.I, "%s.%d.mlp.down_proj.weight", p, l);
        PRL_ASSERT(o->w3 == o->w1 + (size_t)D.I * D.d); /* stacked gate/up GEMM */
        return;
    }
    o->router = add_tensor(tb, PRL_PARAM_ROUTER, l, -1, D.E, D.d, "%s.%d.mlp.gate.weight", p, l);
    for (int e = 0; e < D.E; e++) {
        size_t w1 = add_tensor(tb, PRL_PARAM_MATRIX, l, e, D.de, D.d,
                               "%s.%d.mlp.experts.%d.gate_proj.weight", p, l, e);
        add_tensor(tb, PRL_PARAM_MATRIX, l, e, D.de, D.d, "%s.%d.mlp.experts.%d.up_proj.weight", p,
                   l, e);
        add_tensor(tb, PRL_PARAM_MATRIX, l, e, D.d, D.de, "%s.%d.mlp.experts.%d.down_proj.weight",
                   p, l, e);
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
    o->eh_proj =
        add_tensor(tb, PRL_PARAM_MATRIX, l, -1, d, 2 * d, "model.layers.%d.eh_proj.weight", l);
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
static void build_table(table_builder *tb, const prl_config *c, layer_offsets *lo, size_t *embed,
                        size_t *norm, size_t *head, size_t *score, size_t merge[4])
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
    if (c->score_head) /* last: a reward model's tensors are the policy's plus this one */
        *score = add_tensor(tb, PRL_PARAM_SCORE, -1, -1, 1, c->hidden_size, "score.weight");
}

/* Trunk and MTP layers: the MTP layers are model.layers.{L..L+D−1}. */
int model__all_layers(const prl_config *c)
{
    return c->num_hidden_layers + c->num_nextn_predict_layers;
}

model_offsets *model__offs(const prl_model *m)
{
    return (model_offsets *)(m->acts->lo + model__all_layers(&m->cfg));
}

prl_status prl_model_init(prl_model *m, const prl_config *cfg)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->acts = calloc(1, sizeof *m->acts);
    /* layer offsets followed by one model_offsets record */
    size_t lo_bytes =
        (size_t)model__all_layers(cfg) * sizeof(layer_offsets) + sizeof(model_offsets);
    if (m->acts) m->acts->lo = calloc(1, lo_bytes);
    if (!m->acts || !m->acts->lo) {
        prl_model_free(m);
        return prl_error_set(PRL_ERR_NOMEM, "model tables");
    }
    table_builder tb = {0};
    model_offsets mo = {0};
    build_table(&tb, cfg, m->acts->lo, &mo.embed, &mo.norm, &mo.head, &mo.score, mo.merge);
    *model__offs(m) = mo;
    m->tensors = tb.t;
    m->n_tensors = tb.n;
    m->n_params = tb.total;
    m->n_moe = prl_config_moe_layers(cfg);
    m->n_moe_all = prl_config_moe_layers_all(cfg);
    m->params = calloc(m->n_params, sizeof *m->params);
    m->grads = calloc(m->n_params, sizeof *m->grads);
    /* the MTP layers' MoE bias rows follow the trunk's n_moe */
    size_t nb = (size_t)(m->n_moe_all > 0 ? m->n_moe_all : 1) *
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

void prl_model_free(prl_model *m)
{
    if (!m) return;
    if (m->acts) {
        model__free_acts_block(m->acts);
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
    size_t nb = (size_t)m->n_moe_all * m->cfg.n_routed_experts;
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

/* ------------------------------------------------------------------ hooks ----------- */

int model__emit(const prl_model *m, int layer, const char *what, const prl_real *data, int64_t rows,
                int64_t cols)
{
    if (!m->hook) return 0;
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "L%d.%s", layer, what);
    else snprintf(name, sizeof name, "%s", what);
    int64_t shape[2] = {rows, cols};
    return m->hook(m->hook_user, name, data, 2, shape);
}

/* ------------------------------------------------------------------ precision ------- */

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
void model__refresh_rounded_weights(prl_model *m)
{
    if (!m->wround) return;
    memcpy(m->wround, m->params, m->n_params * sizeof *m->wround);
    model__rnd(m, m->wround, m->n_params);
}

/* ------------------------------------------------------------------ bias balancing -- */

/* The MoE rows whose bias learns: none when only the DSA indexers learn; the MTP layers'
** alone when the trunk is frozen (its biases stay as they are, like its weights). */
static int bias_rows_first(const prl_model *m)
{
    if (m->cfg.dsa_freeze_main) return m->n_moe_all;
    return m->cfg.mtp_freeze_trunk ? m->n_moe : 0;
}

void prl_model_update_router_bias(prl_model *m)
{
    const prl_config *c = &m->cfg;
    int E = c->n_routed_experts;
    if (c->bias_update_rate <= 0 || m->n_moe_all == 0) return;
    int first = bias_rows_first(m);
    memset(m->expert_counts, 0, (size_t)first * E * sizeof *m->expert_counts);
    for (int i = first; i < m->n_moe_all; i++) {
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
