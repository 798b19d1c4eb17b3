/*
** model_int.h — private to the train path's sources (engine/model*.c, see model.c): the
** offsets of each layer's tensors in params/grads, the saved activations and backward scratch
** (struct prl_acts), the dimensions, the weight and gradient views and the rounding every op
** applies, the task contexts the parts share, and the few functions one part calls in
** another. Include engine/engine.h from outside; the model's API is engine/model.h.
*/
#ifndef PRL_MODEL_INT_H
#define PRL_MODEL_INT_H

#include "engine/dsa.h"
#include "engine/mhc.h"
#include "engine/mtp.h"

#include <string.h>

/* ------------------------------------------------------------------ state ----------- */

/* Element offsets of one layer's tensors inside params/grads. Routed experts are stored
** one after another, each as [gate_proj (de×d), up_proj (de×d), down_proj (d×de)]. */
typedef struct layer_offsets {
    size_t ln1, wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo, ln2;
    size_t sink_ckv, sink_kpe; /* parameter sinks (sink_ckv only with param_sink_with_value) */
    size_t qa_conv, kv_conv, o_conv;            /* ModAttn kernels [C, k] */
    size_t ix_wq_b, ix_wk, ix_k_norm, ix_wproj; /* DSA lightning indexer */
    size_t w1, w3, w2;      /* dense SwiGLU; w3 follows w1, so [w1; w3] is one 2F×d matrix */
    size_t router, experts; /* MoE */
    size_t sw1, sw3, sw2;   /* shared experts; sw3 follows sw1 likewise */
    size_t ln_pa, ln_pm;    /* sandwich: post_attention_layernorm, post_mlp_layernorm */
    size_t ln_bp;           /* block_post_layernorm (over all streams) */
    size_t hc[2][4];        /* mHC sites attn, mlp: phi, norm_gamma, branch_alpha, branch_beta */
    size_t enorm, hnorm, eh_proj, sh_norm, sh_head; /* MTP layers: input op; shared_head
                                                    ** norm/head (model.norm / lm_head when
                                                    ** the config gives none) */
} layer_offsets;

/* Saved activations of one layer (for the current batch shape). */
typedef struct layer_acts {
    prl_real *res_attn, *ln_a, *rstd_a;       /* residual in, normed, 1/rms */
    prl_real *zq, *cq, *rstd_q, *q;           /* query path */
    prl_real *kva, *ckv, *rstd_kv, *kr, *kv;  /* key/value path */
    prl_real *att, *o;                        /* probabilities, head outputs */
    prl_real *sink_ckv, *sink_rstd, *sink_kv; /* sinks: normed latent, 1/rms, [k_nope | v] */
    prl_real *zqc, *kvc, *oc;                 /* ModAttn outputs (query, latent, heads) */
    prl_dsa_acts dsa;                         /* DSA indexer (dsa.h), DSA layers only */
    prl_real *res_ffn, *ln_f, *rstd_f;        /* residual after attention, normed */
    prl_real *a13, *h;                        /* dense or shared-expert SwiGLU */
    /* MoE */
    prl_real *z, *s, *g;           /* router logits, sigmoid, gates [N,K] */
    int32_t *sel;                  /* [N,K] */
    int32_t *offsets;              /* [E+1] rows per expert in grouped order */
    int32_t *pos;                  /* [N,K] grouped row of (token, slot) */
    int32_t *token_of;             /* [N·K] token of each grouped row */
    prl_real *xg, *ea13, *eh, *yg; /* grouped expert inputs/activations/outputs */
    /* residual glue (mHC, sandwich norms, block post-norm); site 0 attention, 1 FFN */
    prl_real *xs[2];                /* mHC: streams into each site [N, n·d] */
    prl_mhc_saved hc[2];            /* mHC: each site's coefficients */
    prl_real *sub[2], *rstd_sub[2]; /* sandwich: sublayer output before its norm */
    prl_real *F[2];                 /* what goes back into the residual [N, d] */
    prl_real *bp_in, *rstd_bp;      /* block post-norm input [N, S], 1/rms */
} layer_acts;

/* Saved activations of MTP module k (its decoder layer's are a layer_acts). */
typedef struct mtp_acts {
    int32_t *tokens, *targets, *lens; /* depth-k inputs (prl_mtp_shift) */
    int32_t *pos;                     /* their positions when the batch is packed */
    float *weights;
    prl_real *emb, *cat, *rstd_e, *rstd_h; /* input op */
    prl_real *h;                           /* h^k, the layer's output [N,d] */
    prl_real *ln, *rstd, *logits, *lse;    /* shared head */
} mtp_acts;

struct prl_acts {
    int B, T, N;
    mtp_acts *mtp; /* per MTP module (num_nextn_predict_layers) */
    prl_real *dh_mtp, *dh_mtp2, *dcat_mtp, *demb_mtp; /* MTP backward scratch [N,d]/[N,2d] */
    int mtp_ran;                                      /* the current forward ran the MTP modules */
    layer_offsets *lo;                                /* per layer, fixed at init */
    layer_acts *layer;
    prl_real *res_final, *ln_final, *rstd_final, *logits, *lse;
    prl_real *scores, *dscores; /* [B] score head (cfg.score_head) and its gradient */
    prl_real *tmp;              /* [N,d] a sublayer's output before the residual add */
    prl_real *rope_cos, *rope_sin;
    /* backward scratch */
    prl_real *dres, *dln, *dlogits, *dzq, *dcq, *dq, *dkva, *dckv, *dkv, *dkr, *dattn_scratch;
    prl_real *dsink_kv, *dsink_ckv, *dconv;
    prl_real *do_, *dffn_scratch, *dz, *dg, *dyg, *dxg, *deh;
    size_t attn_scratch_len;
    prl_dsa_scratch dsa_scratch; /* DSA indexer backward */
    double index_loss;           /* the last forward's DSA indexer loss */
    int32_t *routes;             /* [n_moe][N][K] captured routes */
    /* residual glue: the streams after the last layer and the merge head (mHC) */
    prl_real *xs_final;
    prl_mhc_saved hc_merge;
    prl_real *ones, *dgamma_sink; /* γ = 1 when mhc_use_gamma is off, and its discarded grad */
    prl_real *dxs, *dxs2, *dxin, *dpre, *dpost, *dH, *hc_scratch;
    int have_forward; /* a forward with saved activations is current */
    void *block;      /* the one allocation all of the above point into */
    size_t block_bytes;
    size_t offsets_init; /* lo is allocated separately (it outlives batch shapes) */
};

/* ------------------------------------------------------------------ dimensions ------ */

typedef struct dims {
    int V, d, L, H, rq, rkv, dn, dr, dv, dq, dkv, I, E, K, de, sde, ns, ck, HI, dI;
} dims;

/* Model-level offsets live beside the layer table (in the acts struct: they never change). */
typedef struct model_offsets {
    size_t embed, norm, head;
    size_t score;    /* score.weight (cfg.score_head) */
    size_t merge[4]; /* mHC merge head: phi, norm_gamma, branch_alpha_pre, branch_beta_pre */
} model_offsets;

/* ------------------------------------------------------------------ views ----------- */

/* Weights as the path reads them: the rounded copy in a reduced precision, else the master. */
#define P(off) ((m->wround ? m->wround : m->params) + (off))
#define G(off) (m->grads + (off))

/* An op output (forward) or the gradient of one (backward) rounded to the train precision
** at the points the infer path rounds (docs/model.md "Precision"); a no-op in fp32. */
static inline void model__rnd(const prl_model *m, prl_real *x, size_t n)
{
    prl_round_reals(m->precision, x, n);
}

/* p[0..n) = 0 (the backward zeroes a gradient before kernels accumulate into it). */
static inline void model__zero(prl_real *p, size_t n) { memset(p, 0, n * sizeof *p); }

/* ------------------------------------------------------------------ task contexts --- */

/* Work item of the expert GEMMs: a block of rows of one expert. */
typedef struct expert_task {
    int e, r0, rows;
} expert_task;

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

/* Rows of the LM head's output: log-probs in the forward, ∂/∂logits in the backward. */
typedef struct logits_ctx {
    prl_model *m;
    const prl_batch *b;
    float *out;
    const prl_real *logits; /* [N,V]: the trunk's, or an MTP module's */
    prl_real *lse;          /* [N] */
} logits_ctx;

/* ------------------------------------------------------------------ model.c --------- */

dims model__dims_of(const prl_config *c);
/* Trunk and MTP layers: the MTP layers are model.layers.{L..L+D−1}. */
int model__all_layers(const prl_config *c);
/* The model-level offsets (embedding, final norm, head, mHC merge head). */
model_offsets *model__offs(const prl_model *m);
/* The tensor hook's call for op `what` of `layer` (-1: a model-level op); non-zero: stop. */
int model__emit(const prl_model *m, int layer, const char *what, const prl_real *data, int64_t rows,
                int64_t cols);
/* The master weights rounded into wround (reduced precisions), before each forward. */
void model__refresh_rounded_weights(prl_model *m);

/* ------------------------------------------------------------------ model_acts.c ---- */

/* Free the activation block and the per-layer tables (the layer offsets stay). */
void model__free_acts_block(prl_acts *a);
/* Size (or reuse) the activation block for a B × T batch. */
prl_status model__ensure_acts(prl_model *m, int B, int T);

/* ------------------------------------------------------------------ model_attn.c ---- */

/* 1 when layer l's main attention runs over its DSA selection (a DSA layer, sparse stage). */
int model__dsa_sparse(const prl_model *m, int l);
/* The attention call of layer l for the current batch shape (window, sinks, selection) and
** batch b's packing (prl_batch.pos; b NULL: none). */
prl_attn_shape model__attn_shape(const prl_model *m, int l, const prl_batch *b);
/* The longest selection of a DSA row at sequence length T: min(index_topk, T). */
int model__dsa_k(const prl_model *m, int T);
/* MLA in the naive form: a = ln_a (N,d) → o (N,H·dv), and tmp = o·Woᵀ. */
int model__mla_forward(prl_model *m, int l, const prl_batch *b);
/* Attention sublayer backward: dres holds ∂/∂(its output); adds ∂/∂res_attn into dx. */
void model__mla_backward(prl_model *m, int l, const prl_batch *b, prl_real *dx);
/* The indexers' own objective (DSA layers), apart from the LM backward. */
void model__dsa_backward(prl_model *m, const prl_batch *b);

/* ------------------------------------------------------------------ model_moe.c ----- */

/* MoE: ln_f (N,d) → tmp (N,d) = shared(ln_f) + Σ_k g_k·expert_k(ln_f). */
int model__moe_forward(prl_model *m, int l, int moe_idx, const prl_batch *b, expert_task *tasks);
/* Auxiliary losses of one MoE layer (values only; gradients in the backward). */
void model__aux_losses(const prl_model *m, const layer_acts *la, const prl_batch *b, double *bal,
                       double *zl);
/* FFN sublayer backward (dense or MoE): dres holds ∂/∂(its output); adds ∂/∂res_ffn into dx. */
void model__ffn_backward(prl_model *m, int l, const prl_batch *b, expert_task *tasks, prl_real *dx);

/* ------------------------------------------------------------------ model_residual.c */

/* The residual beyond a plain pre-norm sum: mHC streams, sandwich or block post-norms. */
int model__residual_glue(const prl_config *c);
/* mHC streams through layer l (trunk layers with use_mhc; never an MTP layer). */
int model__layer_mhc(const prl_model *m, int l);
prl_mhc_shape model__site_shape(const prl_model *m, int full);
/* The residual stream(s) entering site `site` (0 attention, 1 FFN) of layer l. */
prl_real *model__site_stream(const prl_model *m, int l, int site);
/* Where the stream after layer l goes: the next layer's attention site, or the final one. */
prl_real *model__layer_out_stream(const prl_model *m, int l);
/* hc_pre of a site: its coefficients and the sublayer input res_attn / res_ffn. */
void model__site_enter(prl_model *m, int l, int site);
/* The sublayer's output (tmp) back into the residual, as `next`. */
void model__site_leave(prl_model *m, int l, int site, prl_real *next);
/* The embedding into every stream; the merge head into res_final (mHC only). */
void model__streams_begin(prl_model *m);
void model__streams_end(prl_model *m);
/* Backward of the layers with the residual glue on: dres ∂/∂res_final in, ∂/∂embedding out. */
void model__residual_backward(prl_model *m, const prl_batch *b, expert_task *tasks);

/* ------------------------------------------------------------------ model_mtp.c ----- */

/* The MTP modules after the trunk; adds their loss to st->mtp_loss. */
int model__mtp_forward(prl_model *m, const prl_batch *b, int moe_idx, expert_task *tasks,
                       prl_forward_stats *st);
/* Backward of model__mtp_forward; leaves ∂/∂h⁰ in a->dh_mtp. */
void model__mtp_backward(prl_model *m, const prl_batch *b, expert_task *tasks);

/* ------------------------------------------------------------------ model_train.c --- */

/* Adds the routes of MoE row moe_idx in the last forward, over the valid positions of b, to
** m->expert_counts (the selection-bias update's loads); no-op when the update is off. */
void model__count_experts(prl_model *m, const prl_batch *b, int moe_idx);

/* Position n of the batch is inside its sequence's length. */
int model__valid_pos(const prl_batch *b, int n);
/* Log-probs of the targets (logits_ctx) over rows [r0, r1). */
void model__logprob_rows(void *p, int r0, int r1);
/* Σ w·logp over the batch's targets in position order (double). */
double model__weighted_logp(const prl_batch *b, const prl_real *logits, const prl_real *lse, int V,
                            int *n_targets);
/* Decoder layer l (trunk or MTP) from its input to `out`; non-zero when a hook stops. */
int model__layer_forward(prl_model *m, int l, int *moe_idx, const prl_batch *b, expert_task *tasks,
                         prl_forward_stats *st, int train, prl_real *out);
/* The backward's loss multiplier (prl_batch.loss_scale; 0 means 1). */
double model__loss_scale(const prl_batch *b);
/* ∂/∂logits (logits_ctx) into a->dlogits over rows [r0, r1). */
void model__dlogits_rows(void *p, int r0, int r1);

#endif /* PRL_MODEL_INT_H */
