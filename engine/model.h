/*
** model.h — the model, its train path and optimizers (part of engine.h; include that).
**
** Memory follows llm.c: every parameter lives in one flat block `params`, gradients in a
** block of the same layout `grads`, and a table `tensors` names each view (Hugging Face
** tensor name, shape, offset). Zero-grad is one memset, an optimizer is a loop over the
** table, a checkpoint is one pass over it. Activations are owned by the model and sized
** for the largest batch seen.
*/
#ifndef PRL_MODEL_H
#define PRL_MODEL_H

/* ---------------------------------------------------------------- config ----------- */

typedef enum prl_bias_rule {
    PRL_BIAS_SIGN = 0, /* b_i += γ·sign(c̄ − c_i)   (DeepSeek-V3) */
    PRL_BIAS_RMS = 1   /* b_i −= γ·(F_i − Q_i)/RMS(F − Q) */
} prl_bias_rule;

enum { PRL_MAX_LAYERS = 64, PRL_MHC_MAX_STREAMS = 16 };

/* Training stage of the DSA indexer (docs/model.md, DSA): SPARSE — the main attention sees
** the top-k selected tokens and the indexer learns KL(p ‖ softmax I) on that set; DENSE —
** the warm-up: the main attention stays dense and the indexer learns the dense distribution. */
typedef enum prl_dsa_stage { PRL_DSA_SPARSE = 0, PRL_DSA_DENSE = 1 } prl_dsa_stage;

/* YaRN RoPE scaling (`rope_scaling` {"type": "yarn", ...}; docs/model.md "RoPE"): the
** frequencies blend interpolation (÷ factor) and extrapolation per dimension between the
** beta_fast / beta_slow rotation counts of the original context; cos and sin are multiplied
** by an attention factor, and the attention softmax scale by mscale(factor, mscale_all_dim)². */
typedef struct prl_rope_scaling {
    int yarn;                            /* 0: rope_scaling null (plain RoPE) */
    double factor, beta_fast, beta_slow; /* beta defaults 32, 1 (0 means the default) */
    double mscale, mscale_all_dim;       /* 0 = absent */
    double attention_factor;             /* 0 = absent: derived from mscale, mscale_all_dim */
    int original_max_position_embeddings;
} prl_rope_scaling;

enum { PRL_CONFIG_SOURCE_MAX = 16384 };

/* A Hugging Face openpangu_v2 or deepseek_v3 (DeepSeek-V3, Kimi-K2, Moonlight)
** config.json, validated. Field names follow the JSON keys. */
typedef struct prl_config {
    int vocab_size, hidden_size, num_hidden_layers, num_attention_heads;
    int q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    double rope_theta, rms_norm_eps, initializer_range;
    int first_k_dense_replace, intermediate_size;
    int n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts;
    int norm_topk_prob;
    double routed_scaling_factor;
    int max_position_embeddings;
    int bos_token_id, eos_token_id, pad_token_id;
    /* prl's own keys (prefix prl_ in JSON) */
    prl_bias_rule bias_rule;   /* prl_bias_update_rule: "sign" | "rms" */
    double bias_update_rate;   /* prl_bias_update_rate γ (0 = off) */
    double balance_loss_alpha; /* prl_balance_loss_alpha α (0 = off) */
    double router_z_loss_coef; /* prl_router_z_loss_coef β (0 = off) */
    /* attention blocks (docs/model.md) */
    int n_swa_layers; /* swa_layers: sliding-window layers */
    int swa_layers[PRL_MAX_LAYERS];
    int n_sliding_window_list;               /* sliding_window_list (0 = absent) */
    int sliding_window_list[PRL_MAX_LAYERS]; /* window of swa_layers[i] */
    int sliding_window;                      /* window of swa layers without a list entry */
    int param_sink_number;                   /* N_s parameter sinks per layer (0 = off) */
    int param_sink_with_value;               /* sinks have a latent (k_nope and v), else
                                               ** only a position-free rope key */
    int use_mome;                            /* ModAttn (MoME) convolutions on */
    int router_sliding_window;               /* their kernel size k */
    /* residual blocks (docs/model.md, mHC and sandwich norms) */
    int use_mhc;                    /* mHC hyper-connections on */
    int mhc_num_stream;             /* n residual streams (default 4) */
    int mhc_recur_norm;             /* Sinkhorn iterations (default 20) */
    int mhc_use_gamma;              /* norm_gamma gains on the flattened streams */
    int sandwich_norm;              /* post-attention and post-MLP norms too */
    int n_block_post_layernorm_idx; /* layers followed by block_post_layernorm */
    int block_post_layernorm_idx[PRL_MAX_LAYERS];
    /* multi-token prediction (docs/model.md "Multi-token prediction"): MTP layers are the
    ** layers num_hidden_layers .. num_hidden_layers + num_nextn_predict_layers − 1 */
    int num_nextn_predict_layers; /* D chained MTP modules (0 = off) */
    double mtp_loss_weight;       /* prl_mtp_loss_weight λ: loss += λ/D·Σ_k L_k */
    int mtp_head_norm;            /* prl_mtp_head_norm: own shared_head.norm, else
                                               ** the trunk's model.norm */
    int mtp_head;                 /* prl_mtp_head: own shared_head.head, else
                                               ** lm_head */
    /* DeepSeek sparse attention (docs/model.md, DSA) */
    int n_dsa_layers; /* dsa_layers: layers with a lightning indexer */
    int dsa_layers[PRL_MAX_LAYERS];
    int index_topk;                    /* k tokens each query attends to */
    int index_n_heads, index_head_dim; /* H_I, d_I (the first qk_rope_head_dim rotate) */
    prl_dsa_stage dsa_stage;           /* prl_dsa_stage: "sparse" | "dense" (warm-up) */
    int dsa_freeze_main;               /* prl_dsa_freeze_main: only the indexer learns */
    int mtp_freeze_trunk;              /* prl_mtp_freeze_trunk: only the MTP modules learn */
    int score_head; /* architectures [*ForSequenceClassification], num_labels 1: a scalar head
                    ** score.weight [1, hidden] on the last token (reward models) */
    /* DeepSeek-V3 maths (docs/config.md "DeepSeek-V3 family"); defaults keep openPangu's */
    int moe_layer_freq;            /* layer l is MoE iff l >= first_k_dense_replace and
                                   ** l % moe_layer_freq == 0 */
    int n_group, topk_group;       /* group-limited routing (noaux_tc); 1, 1 = off */
    int rope_interleave;           /* RoPE pairs (x[2i], x[2i+1]) instead of (x[i], x[i+d/2]) */
    prl_rope_scaling rope_scaling; /* YaRN, or none */
    /* model_type as read ("openpangu_v2" when absent). Any other family keeps its whole
    ** source object (`source_json`) so prl_config_to_json writes it back with its own keys,
    ** the deployment-only ones included. */
    char model_type[32];
    char source_json[PRL_CONFIG_SOURCE_MAX]; /* "" for openpangu_v2 */
} prl_config;

/* Defaults for every key (a small valid model). */
void prl_config_default(prl_config *c);
/* Parse JSON text; `source` names it in messages. Unknown keys, wrong types, out-of-range
** or inconsistent values are PRL_ERR_CONFIG; blocks of the openPangu design that are not
** built yet (per-layer layer_types) are
** PRL_ERR_UNSUPPORTED; both name the key. */
prl_status prl_config_parse(prl_config *c, const char *json_text, const char *source);
prl_status prl_config_load(prl_config *c, const char *path);
/* Serialise as config.json text (malloc'd, caller frees). */
char *prl_config_to_json(const prl_config *c);
/* Attention window of layer l: W for a sliding-window layer (row t sees keys t−W < s ≤ t),
** 0 for a fully causal one. */
int prl_config_window(const prl_config *c, int layer);
/* 1 when layer l has a DSA lightning indexer (it is in dsa_layers). */
int prl_config_is_dsa(const prl_config *c, int layer);
/* Residual streams: mhc_num_stream with mHC on, else 1 (the plain residual). */
int prl_config_streams(const prl_config *c);
/* 1 when layer l is followed by the block post-norm (RMSNorm over all its streams). */
int prl_config_block_post_norm(const prl_config *c, int layer);
/* Kernel size of the ModAttn causal convolutions (0 = off). */
int prl_config_conv_kernel(const prl_config *c);
/* MoE layout (moe_layer_freq): 1 when layer l (trunk or MTP) has a MoE FFN; the number of
** MoE layers of the trunk; of trunk and MTP layers together (the router-bias table's rows:
** the trunk's first, then the MTP layers'); the layer of MoE index i (-1 past the end). */
int prl_config_is_moe(const prl_config *c, int layer);
int prl_config_moe_layers(const prl_config *c);
int prl_config_moe_layers_all(const prl_config *c);
int prl_config_moe_layer(const prl_config *c, int moe_idx);
/* 1 for a DeepSeek-V3-family config (model_type other than openpangu_v2). */
int prl_config_is_deepseek(const prl_config *c);
/* YaRN's mscale(f, m) = 0.1·m·ln f + 1 (1 when f <= 1; transformers' yarn_get_mscale). */
double prl_yarn_mscale(double factor, double mscale);
/* The attention softmax scale: (d_n + d_r)^(−1/2), times mscale(factor, mscale_all_dim)²
** under YaRN with mscale_all_dim (as transformers' DeepseekV3Attention). */
double prl_config_softmax_scale(const prl_config *c);

/* ---------------------------------------------------------------- parameters ------- */

typedef enum prl_param_kind {
    PRL_PARAM_EMBED,   /* token embedding */
    PRL_PARAM_HEAD,    /* LM head */
    PRL_PARAM_NORM,    /* RMSNorm gain */
    PRL_PARAM_MATRIX,  /* hidden 2-D matrix (Muon) */
    PRL_PARAM_ROUTER,  /* MoE router weight (AdamW) */
    PRL_PARAM_SINK,    /* parameter attention sink latents / rope keys (AdamW, no decay) */
    PRL_PARAM_CONV,    /* ModAttn depthwise conv kernel [C, 1, k] (AdamW, no decay; init 0) */
    PRL_PARAM_MHC,     /* mHC phi, branch_alpha, branch_beta (AdamW, no decay; engine/mhc.h) */
    PRL_PARAM_INDEXER, /* DSA lightning indexer (AdamW, no decay; k_norm gain init 1); learns
                       ** only from the indexer loss */
    PRL_PARAM_SCORE    /* score.weight of a reward model's scalar head (AdamW, no decay) */
} prl_param_kind;

typedef struct prl_param_info {
    char name[96];    /* Hugging Face tensor name */
    int ndim;         /* 1, 2, or 3 (conv kernels [C, 1, k]) */
    int64_t shape[3]; /* out × in for matrices */
    size_t offset;    /* element offset into params/grads */
    size_t numel;
    prl_param_kind kind;
    int layer;  /* -1 for model-level tensors */
    int expert; /* routed expert index, -1 otherwise */
} prl_param_info;

/* ---------------------------------------------------------------- hooks ------------ */

/* Named-tensor callback: `name` like "L3.attn.q", "final.logits"; `data` is a row-major
** tensor of `ndim` dims `shape`, valid only during the call. Return 0 to continue. Zero cost
** when unset (a NULL test per site). */
typedef int (*prl_tensor_hook)(void *user, const char *name, const prl_real *data, int ndim,
                               const int64_t *shape);

/* ---------------------------------------------------------------- model ------------ */

typedef struct prl_acts prl_acts; /* activations and scratch, private to model*.c */

typedef struct prl_model {
    prl_config cfg;
    int n_tensors;
    prl_param_info *tensors; /* owned */
    size_t n_params;
    prl_real *params;      /* owned, n_params */
    prl_real *grads;       /* owned, n_params; backward accumulates (+=) */
    int n_moe;             /* number of MoE layers of the trunk */
    int n_moe_all;         /* MoE layers of the trunk and the MTP layers */
    prl_real *router_bias; /* owned, n_moe_all × N_r (the trunk's rows, then the MTP
                           ** layers'); not a parameter (no gradient) */
    double *expert_counts; /* owned, n_moe_all × N_r tokens routed since the last update */
    prl_acts *acts;        /* owned */
    prl_tensor_hook hook;
    void *hook_user;
    prl_precision precision;  /* train path arithmetic (prl_model_set_precision) */
    prl_real *wround;         /* owned, n_params: the weights rounded to `precision` that a
                             ** forward and its backward read (NULL in fp32) */
    int dsa_keep_selection;   /* tests: the forward reuses the last DSA top-k selection instead
                             ** of selecting again (gradient checks with selections frozen);
                             ** only after a forward of the same batch shape */
    int dsa_masked_reference; /* benches and tests: the sparse stage's attention runs as the
                              ** masked dense kernel (the naive reference, same bits, O(T²))
                              ** instead of the sparse one */
} prl_model;

/* A batch of B sequences of T positions. Positions t >= lens[b] are padding: they affect
** nothing. Pointers are borrowed for the duration of the call. */
typedef struct prl_batch {
    int B, T;
    const int32_t *tokens;         /* [B*T] */
    const int32_t *lens;           /* [B] valid lengths, NULL = all T */
    const int32_t *targets;        /* [B*T] target token per position, -1 = none; NULL = none */
    const float *weights;          /* [B*T] ∂loss/∂logp per position (backward); NULL = 0 */
    int n_extra;                   /* more targets per position, each with its own weight
                                   ** (distillation onto a teacher's top-k; 0 = none) */
    const int32_t *extra_targets;  /* [B*T*n_extra] ids, -1 = none; only at positions with a
                                   ** target; the trunk's head only (not MTP) */
    const float *extra_weights;    /* [B*T*n_extra] ∂loss/∂logp of each; the loss adds
                                   ** Σ extra_weights·logp(extra_targets) */
    double temperature;            /* log-probs are log_softmax(logits / temperature) */
    int with_mtp;                  /* 1: also run the MTP modules and add their loss
                                   ** λ/D·Σ_k Σ_i weights[i+k]·log p_k,i(targets[i+k]) at
                                   ** temperature 1 (SFT); 0: the trunk only */
    const int32_t *route_override; /* NULL, or [n_moe][B*T][K] expert ids to use; a row of K
                                   ** PRL_ROUTE_NATIVE routes that (layer, position) natively */
    double loss_scale;             /* backward: gradients of loss_scale × the whole loss (aux
                                   ** losses included), for dynamic loss scaling; 0 means 1 */
    const int32_t *pos;            /* packed rows (docs/model.md "Packed sequences"): NULL, one
                                   ** sequence per row; else [B*T] the position of each token in
                                   ** its own sequence: 0 starts a sequence, p + 1 follows p, −1
                                   ** is padding (affects nothing). A row then holds several
                                   ** sequences, each seen by the model as if it were alone in a
                                   ** row: attention, RoPE, ModAttn convs, DSA, MTP targets and
                                   ** the sequence-wise balance loss restart at every 0 */
    const float *score_weights;    /* [B] ∂loss/∂score of each row: the loss adds
                                   ** Σ_b score_weights[b]·score[b] (score head only; NULL = 0) */
} prl_batch;

/* A route_override row of K of these means "route natively here" (top-K of s + bias), so a
** replay can be partial per (MoE layer, position) — Masked R3 (docs/replay.md). A row is
** either all PRL_ROUTE_NATIVE or all expert ids. */
enum { PRL_ROUTE_NATIVE = -1 };
/* Most extra targets a position can have (prl_batch.n_extra). */
enum { PRL_MAX_EXTRA_TARGETS = 64 };

/* Owned buffers behind a prl_batch of up to `rows` sequences × `cols` positions (batch.c;
** init/free pair). A view of B ≤ rows rows of T ≤ cols positions lays rows out with stride
** T, so the buffers can back batches of any shape within the capacity. */
typedef struct prl_batch_buf {
    int rows, cols;            /* capacity */
    int32_t *tokens, *targets; /* [rows*cols] */
    int32_t *lens;             /* [rows] */
    float *weights;            /* [rows*cols], zeroed by prl_batch_buf_set_row */
} prl_batch_buf;

prl_status prl_batch_buf_init(prl_batch_buf *bb, int rows, int cols);
void prl_batch_buf_free(prl_batch_buf *bb);
/* Row i of a view with T positions: ids[0..n) (n ≤ T) right-padded with <|pad|>; position t
** targets ids[t+1] when t + 1 < n and train[t+1] != 0 (train NULL: every position); its
** weight is 0. Returns the number of positions with a target. */
int prl_batch_buf_set_row(prl_batch_buf *bb, int T, int i, const int32_t *ids, int n,
                          const uint8_t *train);
/* The batch of rows [0, B) × T positions over the buffers (temperature 1, no override). */
prl_batch prl_batch_buf_view(const prl_batch_buf *bb, int B, int T);

typedef struct prl_forward_stats {
    double loss;         /* Σ w·logp + aux losses */
    double lm_loss;      /* Σ w·logp */
    double balance_loss; /* sequence-wise balance loss (0 if off) */
    double z_loss;       /* router z-loss (0 if off) */
    double mtp_loss;     /* λ/D·Σ_k Σ_i w_{i+k}·logp of the MTP modules (0 if not run) */
    double index_loss;   /* DSA indexer KL, mean over query rows, summed over DSA layers (its
                         ** gradient reaches only the indexer; not part of `loss`) */
    int n_targets;       /* positions with a target */
} prl_forward_stats;

/* Allocate a model for `cfg` with all parameters zero (caller then loads or initialises).
** On failure the model is left freed. */
prl_status prl_model_init(prl_model *m, const prl_config *cfg);
void prl_model_free(prl_model *m);
/* Random initialisation: matrices N(0, initializer_range²) drawn from
** (seed, tensor index, PRL_RNG_INIT); norm gains 1; router bias 0. */
void prl_model_init_weights(prl_model *m, uint64_t seed);
void prl_model_zero_grad(prl_model *m);
const prl_param_info *prl_model_find(const prl_model *m, const char *name);
void prl_model_set_hook(prl_model *m, prl_tensor_hook hook, void *user);

/* Train path precision (docs/model.md "Precision"; default fp32). In bf16/fp16 each forward
** reads the master weights rounded to the precision (a copy refreshed at every forward, so
** an optimizer step between forwards is seen), rounds every op output at the infer path's
** points, and accumulates in fp32; the backward rounds the gradient of every rounded
** activation likewise, so an fp16 overflow shows as ±inf or NaN in m->grads. Master weights,
** gradients and optimizer state stay fp32. PRL_ERR_ARG for an invalid value. */
prl_status prl_model_set_precision(prl_model *m, prl_precision p);
/* Train path forward: full sequences, activations saved for backward. Writes per-position
** log-probs of the targets into out_logp [B*T] (0 where no target) if non-NULL; counts
** routed tokens for the bias update. Token ids and route ids are validated
** (PRL_ERR_RANGE naming the position). */
prl_status prl_model_forward(prl_model *m, const prl_batch *batch, float *out_logp,
                             prl_forward_stats *stats);
/* Backward of the last forward (same batch): grads += ∂loss/∂params. */
prl_status prl_model_backward(prl_model *m, const prl_batch *batch);
/* Per-position log-probs only (no activations kept for backward; expert counts untouched). */
prl_status prl_model_logprobs(prl_model *m, const prl_batch *batch, float *out_logp);
/* Routes chosen by the last forward: [n_moe][B*T][K] expert ids (model-owned, valid until
** the next forward). */
const int32_t *prl_model_routes(const prl_model *m);
/* DSA selection of layer l in the last forward, [B*T][T] bytes (1 = key s visible to the
** query row b*T+t; model-owned, valid until the next forward); NULL for a layer without an
** indexer or in the dense stage. */
const uint8_t *prl_model_dsa_selection(const prl_model *m, int layer);
/* Score-head models (cfg.score_head): the score of each row of the last forward, [B]:
** score.weight · the final-normed hidden state of its last valid position (model-owned);
** NULL for a model without the head. */
const prl_real *prl_model_scores(const prl_model *m);
/* Logits of the last forward, [B*T][V] (model-owned). */
const prl_real *prl_model_logits(const prl_model *m);
/* Of the last forward (prl_model_forward or prl_model_logprobs) of `batch`, at each position
** with a target: the k most likely ids under softmax(logits/τ), most likely first (equal
** logits: the lower id first), into ids[B*T*k], and their log-probs into logp[B*T*k];
** positions without a target get ids -1 and log-probs 0. PRL_ERR_ARG: k not in [1, V], or no
** forward of this batch's shape. */
prl_status prl_model_topk(const prl_model *m, const prl_batch *batch, int k, int32_t *ids,
                          float *logp);
/* Apply the selection-bias rule with the counts gathered since the last call, then reset
** the counts. No-op when prl_bias_update_rate is 0. */
void prl_model_update_router_bias(prl_model *m);

/* ---------------------------------------------------------------- optimizers ------- */

typedef enum prl_optim_kind { PRL_OPTIM_ADAMW = 0, PRL_OPTIM_MUON = 1 } prl_optim_kind;
typedef enum prl_lr_schedule {
    PRL_LR_CONSTANT = 0, /* warm-up, then lr */
    PRL_LR_COSINE = 1    /* warm-up, then cosine from lr to lr·min_lr_ratio at total_steps */
} prl_lr_schedule;

typedef struct prl_optim_config {
    prl_optim_kind kind; /* MUON: hidden matrices on Muon, the rest on AdamW */
    double lr;
    double beta1, beta2, eps; /* AdamW (0.9, 0.95, 1e-8) */
    double weight_decay;      /* decoupled; not applied to norms, embeddings or router */
    double muon_momentum;     /* 0.95, Nesterov */
    int muon_ns_steps;        /* 5 */
    double grad_clip;         /* global L2 norm bound, 0 = off */
    double expert_clip;       /* per routed expert L2 bound, 0 = off */
    prl_lr_schedule schedule;
    int warmup_steps, total_steps;
    double min_lr_ratio;
} prl_optim_config;

typedef struct prl_optim {
    prl_optim_config cfg;
    size_t n_params;
    prl_real *m, *v; /* owned, same layout as params */
    int64_t step;    /* completed steps */
    prl_real *work;  /* NS5 scratch */
    size_t work_len;
} prl_optim;

typedef struct prl_optim_stats {
    double lr;
    double grad_norm;    /* before clipping */
    double clip_scale;   /* factor applied by the global clip (1 = none) */
    int experts_clipped; /* routed experts whose gradient was clipped */
} prl_optim_stats;

void prl_optim_config_default(prl_optim_config *c);
prl_status prl_optim_init(prl_optim *o, const prl_model *m, const prl_optim_config *cfg);
void prl_optim_free(prl_optim *o);
/* One update from m->grads (which it may rescale when clipping); does not zero them. */
prl_status prl_optim_step(prl_optim *o, prl_model *m, prl_optim_stats *stats);
double prl_optim_lr_at(const prl_optim_config *c, int64_t step);
/* The Newton–Schulz quintic of Muon on an A×B matrix, in place (exposed for tests). */
void prl_muon_newton_schulz(prl_real *X, int A, int B, int steps, prl_real *work);

/* Dynamic loss scaling for FP16 training (shared/spec/rl.md §4.3). The caller scales the loss
** by `scale`, unscales the gradients (prl_grads_unscale), checks them (prl_grads_finite), clips
** the unscaled gradients, then steps the optimizer only when prl_loss_scaler_update says so.
** TORCH: an overflow halves the scale and skips the step; growth_interval clean steps in a row
** double it (a grown scale that is not finite is not taken). MEGATRON: an overflow skips the
** step and spends one unit of hysteresis; only when none is left does the scale back off (not
** below min_scale); a growth refills the hysteresis. */
typedef enum prl_scaler_kind { PRL_SCALER_TORCH = 0, PRL_SCALER_MEGATRON = 1 } prl_scaler_kind;

typedef struct prl_loss_scaler_config {
    prl_scaler_kind kind;
    double init_scale;     /* torch 2^16, megatron 2^32 */
    double growth_factor;  /* 2 */
    double backoff_factor; /* 0.5 */
    int growth_interval;   /* clean steps before a growth: torch 2000, megatron 1000 */
    int hysteresis;        /* megatron: overflows tolerated before a back-off, 2 */
    double min_scale;      /* megatron: floor of the scale, 1 */
} prl_loss_scaler_config;

typedef struct prl_loss_scaler {
    prl_loss_scaler_config cfg;
    double scale;
    int growth_tracker;     /* clean steps since the last growth or overflow */
    int hysteresis_tracker; /* megatron */
    long steps, skipped;    /* updates seen, of which skipped for an overflow */
} prl_loss_scaler;

/* The defaults of a rule (the project's: torch), or of a preset by name: "torch",
** "megatron", "verl_fsdp" (torch with growth_interval 400) or "verl_megatron" (megatron from
** 32768). PRL_ERR_CONFIG names an unknown preset. */
prl_status prl_loss_scaler_config_preset(prl_loss_scaler_config *c, const char *name);
/* PRL_ERR_CONFIG naming the field when a constant is out of range. */
prl_status prl_loss_scaler_init(prl_loss_scaler *s, const prl_loss_scaler_config *c);
/* Record one step's outcome; returns 1 when the optimizer step must be skipped (found_inf). */
int prl_loss_scaler_update(prl_loss_scaler *s, int found_inf);
/* One update under dynamic loss scaling, after a backward of scale × the loss
** (prl_batch.loss_scale = s->scale): unscale the gradients, check them for inf/NaN, then
** prl_optim_step — which clips the now unscaled gradients — or skip it (weights and the
** optimizer's step count untouched; stats->grad_norm NaN), and update the scale (rl.md §4.3
** order). *skipped = 1 on a skip. s NULL: a plain prl_optim_step. */
prl_status prl_optim_step_scaled(prl_optim *o, prl_model *m, prl_loss_scaler *s,
                                 prl_optim_stats *stats, int *skipped);
/* grads[0..n) /= scale, in the gradients' precision (fp32 or fp64). */
void prl_grads_unscale(prl_real *grads, size_t n, double scale);
/* 1 when every gradient is finite (no inf, no NaN). */
int prl_grads_finite(const prl_real *grads, size_t n);

/* ---------------------------------------------------------------- checkpoints ------ */

/* A checkpoint directory: config.json, model.safetensors (HF names, F32, checksum in the
** metadata), optimizer.safetensors when an optimizer is given, and state.json when an
** optimizer or a state is given (its step is 0 without an optimizer). The whole
** directory is written under a temporary name, fsynced and renamed, so `dir` either holds
** the previous complete checkpoint or the new complete one. An existing `dir` is replaced
** only when it holds nothing but the files a save writes (else PRL_ERR_IO, nothing written).
** `state_json` (a JSON object
** text, may be NULL) is extra run state stored in state.json; `tok` (may be NULL) is saved
** as tokenizer.json. */
prl_status prl_checkpoint_save(const prl_model *m, const prl_optim *o, const char *state_json,
                               const struct prl_tokenizer *tok, const char *dir);
/* A save killed midway leaves "<dir>.tmp.<pid>" behind. Remove those in directory `parent`
** whose process is gone: entries named NAME.tmp.PID (PID digits) that are directories, not
** links, of a PID no process has, holding nothing but regular files named as a save names
** them. One holding anything else is left untouched (a user's file is never removed) and
** named in the error. *removed counts the directories removed. PRL_ERR_IO when `parent`
** cannot be read or a directory is left. */
prl_status prl_checkpoint_clean_stale(const char *parent, int *removed);
/* Load config + weights into a new model (m must be zeroed/unused). Every tensor's name,
** shape and dtype and the checksum are validated; errors name the file and tensor. */
prl_status prl_checkpoint_load(prl_model *m, const char *dir);
/* The same, and the checkpoint's tokenizer.json when it has one (*tok NULL otherwise). On
** error nothing is left allocated. */
prl_status prl_checkpoint_load_tokenizer(prl_model *m, const char *dir, prl_tokenizer **tok);
/* Check checkpoint `dir` without building a model: config.json parses, every weight file
** opens (offsets and sizes valid) with its prl checksum right, optimizer.safetensors (when
** present) with its checksum, state.json and tokenizer.json (when present) parse. Cheap next
** to a load (one pass over the files' bytes); catches a flipped byte, a truncated or a missing
** file. Values are not converted, so non-finite weights are found by a load only. */
prl_status prl_checkpoint_verify(const char *dir);
/* Load the weights of checkpoint `dir` into an initialised model `m` whose config may add DSA
** layers (post-hoc sparsification) or MTP modules (docs/recipes.md) to the checkpoint's: every
** tensor of `m` must be in the file with its shape, except DSA indexer tensors and MTP layers'
** tensors, which keep their values (*n_new counts them; may be NULL); a tensor of the file that
** `m` lacks is an error. The config.json of `dir` is not read. */
prl_status prl_checkpoint_load_weights(prl_model *m, const char *dir, int *n_new);
/* A hash of checkpoint dir's weight files (model.safetensors, or its shards in index order)
** chained from `seed`: what a recipe that starts from the checkpoint depends on. */
prl_status prl_checkpoint_weights_hash(const char *dir, uint64_t seed, uint64_t *hash);
/* How prl_checkpoint_export writes the weights. */
typedef struct prl_export_options {
    prl_dtype dtype;    /* PRL_DTYPE_BF16 or PRL_DTYPE_F32 */
    size_t shard_bytes; /* largest shard; one model.safetensors when everything fits */
    int no_checksum;    /* 1: no prl_checksum metadata (a file as other exporters write it) */
} prl_export_options;
/* Write m as a Hugging Face model directory `out` (which must not exist): config.json, the
** weights as one model.safetensors or shards + model.safetensors.index.json, router biases
** named mlp.gate.e_score_correction_bias, tokenizer files copied from `src_dir` (may be
** NULL). Built under a temporary name and renamed into place; on error nothing is left. */
prl_status prl_checkpoint_export(const prl_model *m, const char *src_dir, const char *out,
                                 const prl_export_options *o);
/* Load optimizer state saved with the same model; `o` must be initialised. state.json
** text is returned (malloc'd) in *state_json if non-NULL. */
prl_status prl_checkpoint_load_optim(prl_optim *o, const prl_model *m, const char *dir,
                                     char **state_json);

#endif /* PRL_MODEL_H */
