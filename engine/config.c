/*
** config.c — reading and writing the model's config.json (Hugging Face openpangu_v2 names).
**
** Every key of the file must be known: a table below lists each one with its type and
** where it goes. Unknown keys (typos) are errors that suggest the nearest known key; blocks
** of the openPangu-2.0 design that this build does not have yet are recognised and refused
** with a "not yet supported" error, so a config never silently means something else.
** Sliding-window layers, parameter sinks and DSA are read by name (parse_attention,
** parse_dsa): their keys are lists or are written to config.json only when the block is on;
** so is the list block_post_layernorm_idx.
*/
#include "engine/engine.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { K_INT, K_REAL, K_BOOL, K_STRING, K_ANY, K_INT_LIST } key_type;

/* What a key does when present. */
typedef enum {
    USE_FIELD,      /* stored into a prl_config field */
    USE_IGNORED,    /* Hugging Face bookkeeping with no effect on the maths */
    USE_UNSUPPORTED /* a block not built yet: refused unless it is "off" */
} key_use;

typedef struct key_spec {
    const char *name;
    key_type type;
    key_use use;
    size_t offset;    /* into prl_config, for USE_FIELD */
    const char *what; /* for USE_UNSUPPORTED: the block's name */
} key_spec;

#define F(name, type, field)                                                                       \
    {                                                                                              \
        name, type, USE_FIELD, offsetof(prl_config, field), NULL                                   \
    }
#define IGN(name, type)                                                                            \
    {                                                                                              \
        name, type, USE_IGNORED, 0, NULL                                                           \
    }
#define UNS(name, type, what)                                                                      \
    {                                                                                              \
        name, type, USE_UNSUPPORTED, 0, what                                                       \
    }

static const key_spec keys[] = {
    F("vocab_size", K_INT, vocab_size),
    F("hidden_size", K_INT, hidden_size),
    F("num_hidden_layers", K_INT, num_hidden_layers),
    F("num_attention_heads", K_INT, num_attention_heads),
    F("q_lora_rank", K_INT, q_lora_rank),
    F("kv_lora_rank", K_INT, kv_lora_rank),
    F("qk_nope_head_dim", K_INT, qk_nope_head_dim),
    F("qk_rope_head_dim", K_INT, qk_rope_head_dim),
    F("v_head_dim", K_INT, v_head_dim),
    F("rope_theta", K_REAL, rope_theta),
    F("rms_norm_eps", K_REAL, rms_norm_eps),
    F("initializer_range", K_REAL, initializer_range),
    F("first_k_dense_replace", K_INT, first_k_dense_replace),
    F("intermediate_size", K_INT, intermediate_size),
    F("n_routed_experts", K_INT, n_routed_experts),
    F("num_experts_per_tok", K_INT, num_experts_per_tok),
    F("moe_intermediate_size", K_INT, moe_intermediate_size),
    F("n_shared_experts", K_INT, n_shared_experts),
    F("norm_topk_prob", K_BOOL, norm_topk_prob),
    F("routed_scaling_factor", K_REAL, routed_scaling_factor),
    F("max_position_embeddings", K_INT, max_position_embeddings),
    F("bos_token_id", K_INT, bos_token_id),
    F("eos_token_id", K_INT, eos_token_id),
    F("pad_token_id", K_INT, pad_token_id),
    F("prl_bias_update_rate", K_REAL, bias_update_rate),
    F("prl_balance_loss_alpha", K_REAL, balance_loss_alpha),
    F("prl_router_z_loss_coef", K_REAL, router_z_loss_coef),
    /* prl_bias_update_rule is a string, handled by name below. */
    IGN("prl_bias_update_rule", K_STRING),
    IGN("architectures", K_ANY),
    IGN("num_labels", K_INT), /* parse_score_head: 1 with a *ForSequenceClassification */
    IGN("model_type", K_STRING),
    IGN("torch_dtype", K_STRING),
    IGN("transformers_version", K_STRING),
    IGN("use_cache", K_BOOL),
    IGN("use_mla", K_BOOL),
    IGN("hidden_act", K_STRING),
    IGN("attention_bias", K_BOOL),
    IGN("attention_dropout", K_REAL),
    IGN("auto_map", K_ANY),
    IGN("scoring_func", K_STRING), /* checked below: "sigmoid" */
    IGN("topk_method", K_STRING),  /* checked below: "noaux_tc" */
    IGN("router_enable_expert_bias", K_BOOL),
    IGN("tie_word_embeddings", K_BOOL), /* checked below: must be false */
    /* DeepSeek-V3 maths: read by name in parse_deepseek (written only when not the default,
    ** so openPangu configs keep their bytes) */
    IGN("rope_interleave", K_BOOL),
    IGN("n_group", K_INT),
    IGN("topk_group", K_INT),
    IGN("moe_layer_freq", K_INT),
    IGN("rope_scaling", K_ANY),
    IGN("num_key_value_heads", K_INT), /* checked: MLA has one key per query head */
    /* DeepSeek-V3 deployment and training bookkeeping, no effect on prl's maths */
    IGN("ep_size", K_INT),
    IGN("pretraining_tp", K_INT),
    IGN("quantization_config", K_ANY),
    IGN("aux_loss_alpha", K_REAL),
    IGN("seq_aux", K_BOOL),
    /* DSA: read by name in parse_dsa (a list, a string; written only when on) */
    IGN("dsa_layers", K_INT_LIST),
    IGN("index_topk", K_INT),
    IGN("index_n_heads", K_INT),
    IGN("index_head_dim", K_INT),
    IGN("prl_dsa_stage", K_STRING),
    IGN("prl_dsa_freeze_main", K_BOOL),
    /* SWA and sinks: read by name in parse_attention (lists, and written only when on) */
    IGN("swa_layers", K_INT_LIST),
    IGN("sliding_window_list", K_INT_LIST),
    IGN("sliding_window", K_INT),
    IGN("param_sink_number", K_INT),
    IGN("param_sink_with_value", K_BOOL),
    UNS("layer_types", K_ANY, "per-layer attention types (use swa_layers)"),
    IGN("use_mome", K_BOOL), /* ModAttn: parse_attention */
    IGN("router_sliding_window", K_INT),
    F("use_mhc", K_BOOL, use_mhc),
    F("mhc_num_stream", K_INT, mhc_num_stream),
    F("mhc_recur_norm", K_INT, mhc_recur_norm),
    F("mhc_use_gamma", K_BOOL, mhc_use_gamma),
    F("sandwich_norm", K_BOOL, sandwich_norm),
    /* block_post_layernorm_idx is a list: read by name in parse_residual */
    IGN("block_post_layernorm_idx", K_INT_LIST),
    F("num_nextn_predict_layers", K_INT, num_nextn_predict_layers),
    F("prl_mtp_loss_weight", K_REAL, mtp_loss_weight),
    F("prl_mtp_head_norm", K_BOOL, mtp_head_norm),
    F("prl_mtp_head", K_BOOL, mtp_head),
    F("prl_mtp_freeze_trunk", K_BOOL, mtp_freeze_trunk),
};
enum { N_KEYS = sizeof keys / sizeof keys[0] };

void prl_config_default(prl_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 4096;
    c->hidden_size = 256;
    c->num_hidden_layers = 6;
    c->num_attention_heads = 4;
    c->q_lora_rank = 128;
    c->kv_lora_rank = 64;
    c->qk_nope_head_dim = 32;
    c->qk_rope_head_dim = 16;
    c->v_head_dim = 32;
    c->rope_theta = 10000.0;
    c->rms_norm_eps = 1e-5;
    c->initializer_range = 0.02;
    c->first_k_dense_replace = 1;
    c->intermediate_size = 512;
    c->n_routed_experts = 8;
    c->num_experts_per_tok = 2;
    c->moe_intermediate_size = 128;
    c->n_shared_experts = 1;
    c->norm_topk_prob = 1;
    c->routed_scaling_factor = 1.0;
    c->max_position_embeddings = 512;
    c->mtp_loss_weight = 0.3; /* DeepSeek-V3's λ for the first 10T tokens */
    c->mtp_head_norm = 1;     /* each MTP layer has its shared_head.norm (spec §12.1) */
    c->bos_token_id = 1;
    c->eos_token_id = 2;
    c->pad_token_id = 0;
    c->bias_rule = PRL_BIAS_SIGN;
    c->bias_update_rate = 0.001;
    c->param_sink_with_value = 1;
    c->mhc_num_stream = 4;
    c->mhc_recur_norm = 20; /* spec §11.1 defaults; mhc_use_gamma false */
    c->moe_layer_freq = 1;
    c->n_group = 1;
    c->topk_group = 1;
    snprintf(c->model_type, sizeof c->model_type, "openpangu_v2");
}

static const key_spec *find_key(const char *name)
{
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].name, name)) return &keys[i];
    return NULL;
}

static const char *nearest_key(const char *name)
{
    const char *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < N_KEYS; i++) {
        int d = prl_edit_distance(name, keys[i].name);
        if (d < best_d) best_d = d, best = keys[i].name;
    }
    return best_d <= 4 ? best : NULL;
}

static const char *type_name(key_type t)
{
    switch (t) {
    case K_INT: return "an integer";
    case K_REAL: return "a number";
    case K_BOOL: return "true or false";
    case K_STRING: return "a string";
    case K_INT_LIST: return "a list of integers";
    case K_ANY: return "any value";
    }
    return "?";
}

static int value_has_type(json_t *v, key_type t)
{
    switch (t) {
    case K_INT: return json_is_integer(v);
    case K_REAL: return json_is_number(v);
    case K_BOOL: return json_is_boolean(v);
    case K_STRING: return json_is_string(v);
    case K_ANY: return 1;
    case K_INT_LIST: {
        if (!json_is_array(v)) return 0;
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) if (!json_is_integer(e)) return 0;
        return 1;
    }
    }
    return 0;
}

/* An unsupported block is acceptable only when its key says "off". */
static int block_is_off(json_t *v)
{
    if (json_is_null(v)) return 1;
    if (json_is_false(v)) return 1;
    if (json_is_integer(v)) return json_integer_value(v) == 0;
    if (json_is_array(v)) return json_array_size(v) == 0;
    return 0;
}

static prl_status store_field(prl_config *c, const key_spec *k, json_t *v)
{
    char *base = (char *)c + k->offset;
    switch (k->type) {
    case K_INT: {
        json_int_t x = json_integer_value(v);
        if (x < -2147483647 || x > 2147483647)
            return prl_error_set(PRL_ERR_CONFIG, "'%s' = %lld is out of range", k->name,
                                 (long long)x);
        *(int *)base = (int)x;
        return PRL_OK;
    }
    case K_REAL: *(double *)base = json_number_value(v); return PRL_OK;
    case K_BOOL: *(int *)base = json_is_true(v); return PRL_OK;
    default: return prl_error_set(PRL_ERR_CONFIG, "internal: key '%s' has no field", k->name);
    }
}

static prl_status check_positive(const char *src, const char *name, long long v, long long max)
{
    if (v <= 0 || v > max)
        return prl_error_set(PRL_ERR_CONFIG, "%s: '%s' = %lld must be in [1, %lld]", src, name, v,
                             max);
    return PRL_OK;
}

/* Ranges and cross-key consistency. */
static prl_status validate(const prl_config *c, const char *src)
{
    prl_status rc;
    struct {
        const char *name;
        long long v, max;
    } pos[] = {
        {"vocab_size", c->vocab_size, 1 << 24},
        {"hidden_size", c->hidden_size, 1 << 16},
        {"num_hidden_layers", c->num_hidden_layers, PRL_MAX_LAYERS},
        {"num_attention_heads", c->num_attention_heads, 1024},
        {"q_lora_rank", c->q_lora_rank, 1 << 16},
        {"kv_lora_rank", c->kv_lora_rank, 1 << 16},
        {"qk_nope_head_dim", c->qk_nope_head_dim, 4096},
        {"qk_rope_head_dim", c->qk_rope_head_dim, 4096},
        {"v_head_dim", c->v_head_dim, 4096},
        {"max_position_embeddings", c->max_position_embeddings, 1 << 24},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if ((pos[i].v != 0 || strcmp(pos[i].name, "q_lora_rank")) && /* 0: null, no latent */
            (rc = check_positive(src, pos[i].name, pos[i].v, pos[i].max)))
            return rc;
    if (c->q_lora_rank == 0 && (c->n_dsa_layers > 0 || c->use_mome))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'q_lora_rank' = null (no query latent) cannot go with %s, "
                             "which reads the query latent",
                             src, c->n_dsa_layers > 0 ? "'dsa_layers'" : "'use_mome'");
    if (c->qk_rope_head_dim % 2)
        return prl_error_set(PRL_ERR_CONFIG, "%s: 'qk_rope_head_dim' = %d must be even", src,
                             c->qk_rope_head_dim);
    if (c->num_nextn_predict_layers < 0 ||
        c->num_nextn_predict_layers > PRL_MAX_LAYERS - c->num_hidden_layers)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'num_nextn_predict_layers' = %d must be in "
                             "[0, %d] (at most %d layers in all)",
                             src, c->num_nextn_predict_layers,
                             PRL_MAX_LAYERS - c->num_hidden_layers, PRL_MAX_LAYERS);
    if (c->mtp_freeze_trunk && c->num_nextn_predict_layers == 0)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'prl_mtp_freeze_trunk' needs MTP modules "
                             "('num_nextn_predict_layers' > 0)",
                             src);
    if (c->mtp_freeze_trunk && c->dsa_freeze_main)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'prl_mtp_freeze_trunk' and 'prl_dsa_freeze_main' "
                             "would leave nothing to train",
                             src);
    if (c->first_k_dense_replace < 0 || c->first_k_dense_replace > c->num_hidden_layers)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'first_k_dense_replace' = %d must be in [0, "
                             "num_hidden_layers = %d]",
                             src, c->first_k_dense_replace, c->num_hidden_layers);
    if (c->moe_layer_freq < 1)
        return prl_error_set(PRL_ERR_CONFIG, "%s: 'moe_layer_freq' = %d must be >= 1", src,
                             c->moe_layer_freq);
    int all = c->num_hidden_layers + c->num_nextn_predict_layers, n_moe = 0;
    for (int l = 0; l < all; l++) n_moe += prl_config_is_moe(c, l);
    if (n_moe < all &&
        (rc = check_positive(src, "intermediate_size", c->intermediate_size, 1 << 20)))
        return rc;
    if (n_moe > 0) {
        if ((rc = check_positive(src, "n_routed_experts", c->n_routed_experts, 4096))) return rc;
        if ((rc = check_positive(src, "moe_intermediate_size", c->moe_intermediate_size, 1 << 20)))
            return rc;
        if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->n_routed_experts)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'num_experts_per_tok' = %d must be in [1, "
                                 "n_routed_experts = %d]",
                                 src, c->num_experts_per_tok, c->n_routed_experts);
        if (c->n_shared_experts < 0 || c->n_shared_experts > 64)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'n_shared_experts' = %d must be in "
                                 "[0, 64]",
                                 src, c->n_shared_experts);
    }
    struct {
        const char *name;
        double v;
        int allow_zero;
    } reals[] = {
        {"rope_theta", c->rope_theta, 0},
        {"rms_norm_eps", c->rms_norm_eps, 0},
        {"initializer_range", c->initializer_range, 0},
        {"routed_scaling_factor", c->routed_scaling_factor, 0},
        {"prl_bias_update_rate", c->bias_update_rate, 1},
        {"prl_balance_loss_alpha", c->balance_loss_alpha, 1},
        {"prl_router_z_loss_coef", c->router_z_loss_coef, 1},
        {"prl_mtp_loss_weight", c->mtp_loss_weight, 1},
    };
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        double v = reals[i].v;
        if (!isfinite(v) || v < 0 || (v == 0 && !reals[i].allow_zero))
            return prl_error_set(PRL_ERR_CONFIG, "%s: '%s' = %g must be a finite number %s 0", src,
                                 reals[i].name, v, reals[i].allow_zero ? ">=" : ">");
    }
    struct {
        const char *name;
        int v;
    } ids[] = {
        {"bos_token_id", c->bos_token_id},
        {"eos_token_id", c->eos_token_id},
        {"pad_token_id", c->pad_token_id},
    };
    for (size_t i = 0; i < 3; i++)
        if (ids[i].v < 0 || ids[i].v >= c->vocab_size)
            return prl_error_set(PRL_ERR_CONFIG, "%s: '%s' = %d is not a token id (vocab_size %d)",
                                 src, ids[i].name, ids[i].v, c->vocab_size);
    return PRL_OK;
}

/* Keys whose only accepted value is the one this engine implements. */
static prl_status check_fixed_values(const prl_config *c, json_t *root, const char *src)
{
    json_t *v;
    if ((v = json_object_get(root, "tie_word_embeddings")) && json_is_true(v))
        return prl_error_set(PRL_ERR_UNSUPPORTED,
                             "%s: 'tie_word_embeddings' = true is not "
                             "supported (the LM head is untied)",
                             src);
    if ((v = json_object_get(root, "scoring_func")) && strcmp(json_string_value(v), "sigmoid") != 0)
        return prl_error_set(PRL_ERR_UNSUPPORTED,
                             "%s: 'scoring_func' = \"%s\" is not "
                             "supported (prl routes with a sigmoid gate)",
                             src, json_string_value(v));
    /* DeepSeek's topk_method names the selection rule; openPangu's HF code does not read it */
    if (prl_config_is_deepseek(c) && (v = json_object_get(root, "topk_method")) &&
        strcmp(json_string_value(v), "noaux_tc") != 0)
        return prl_error_set(PRL_ERR_UNSUPPORTED,
                             "%s: 'topk_method' = \"%s\" is not supported (prl selects by "
                             "s + bias with group limits: \"noaux_tc\")",
                             src, json_string_value(v));
    return PRL_OK;
}

/* A list of integers into out[max]; *n its length. */
static prl_status read_int_list(json_t *v, const char *key, int *out, int *n, int max,
                                const char *src)
{
    if (json_array_size(v) > (size_t)max)
        return prl_error_set(PRL_ERR_CONFIG, "%s: '%s' has %zu entries (at most %d)", src, key,
                             json_array_size(v), max);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        json_int_t x = json_integer_value(e);
        if (x < 0 || x > (1 << 24))
            return prl_error_set(PRL_ERR_CONFIG, "%s: '%s'[%zu] = %lld is out of range", src, key,
                                 i, (long long)x);
        out[i] = (int)x;
    }
    *n = (int)json_array_size(v);
    return PRL_OK;
}

/* Integer keys read by name: each present one must be in [0, 2^24]. */
typedef struct int_key {
    const char *key;
    int *field;
} int_key;

static prl_status read_ints(json_t *root, const int_key *ks, int n, const char *src)
{
    for (int i = 0; i < n; i++) {
        json_t *v = json_object_get(root, ks[i].key);
        if (!v) continue;
        json_int_t x = json_integer_value(v);
        if (x < 0 || x > (1 << 24))
            return prl_error_set(PRL_ERR_CONFIG, "%s: '%s' = %lld is out of range", src, ks[i].key,
                                 (long long)x);
        *ks[i].field = (int)x;
    }
    return PRL_OK;
}

/* SWA, parameter-sink and ModAttn keys (docs/model.md). */
static prl_status parse_attention(prl_config *c, json_t *root, const char *src)
{
    json_t *v;
    prl_status rc;
    if ((v = json_object_get(root, "swa_layers")) &&
        (rc = read_int_list(v, "swa_layers", c->swa_layers, &c->n_swa_layers, PRL_MAX_LAYERS, src)))
        return rc;
    if ((v = json_object_get(root, "sliding_window_list")) &&
        (rc = read_int_list(v, "sliding_window_list", c->sliding_window_list,
                            &c->n_sliding_window_list, PRL_MAX_LAYERS, src)))
        return rc;
    int_key ints[] = {
        {"sliding_window", &c->sliding_window},
        {"param_sink_number", &c->param_sink_number},
    };
    if ((rc = read_ints(root, ints, 2, src))) return rc;
    if ((v = json_object_get(root, "param_sink_with_value")))
        c->param_sink_with_value = json_is_true(v);
    if ((v = json_object_get(root, "router_sliding_window"))) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || x > 16)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'router_sliding_window' = %lld must be in "
                                 "[0, 16]",
                                 src, (long long)x);
        c->router_sliding_window = (int)x;
    }
    /* spec §11.1: use_mome defaults to router_sliding_window > 0 */
    c->use_mome = c->router_sliding_window > 0;
    if ((v = json_object_get(root, "use_mome"))) c->use_mome = json_is_true(v);
    if (c->use_mome && c->router_sliding_window < 1)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'use_mome' is true but 'router_sliding_window' "
                             "(the conv kernel size) is %d",
                             src, c->router_sliding_window);
    return PRL_OK;
}

/* mHC streams and the block post-norm list (docs/config.md). */
static prl_status validate_residual(const prl_config *c, const char *src)
{
    if (c->use_mhc && (c->mhc_num_stream < 1 || c->mhc_num_stream > PRL_MHC_MAX_STREAMS))
        return prl_error_set(PRL_ERR_CONFIG, "%s: 'mhc_num_stream' = %d must be in [1, %d]", src,
                             c->mhc_num_stream, PRL_MHC_MAX_STREAMS);
    if (c->use_mhc && (c->mhc_recur_norm < 1 || c->mhc_recur_norm > 1000))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'mhc_recur_norm' = %d (Sinkhorn iterations) "
                             "must be in [1, 1000]",
                             src, c->mhc_recur_norm);
    int seen[PRL_MAX_LAYERS] = {0};
    for (int i = 0; i < c->n_block_post_layernorm_idx; i++) {
        int l = c->block_post_layernorm_idx[i];
        if (l >= c->num_hidden_layers)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'block_post_layernorm_idx'[%d] = %d is not "
                                 "a layer (num_hidden_layers %d)",
                                 src, i, l, c->num_hidden_layers);
        if (seen[l]++)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'block_post_layernorm_idx' lists layer %d "
                                 "twice",
                                 src, l);
    }
    return PRL_OK;
}

static prl_status validate_attention(const prl_config *c, const char *src)
{
    prl_status rc;
    int seen[PRL_MAX_LAYERS] = {0};
    if (c->n_sliding_window_list > 0 && c->n_sliding_window_list != c->n_swa_layers)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'sliding_window_list' has %d entries but "
                             "'swa_layers' has %d",
                             src, c->n_sliding_window_list, c->n_swa_layers);
    int all = c->num_hidden_layers + c->num_nextn_predict_layers; /* MTP layers may slide */
    for (int i = 0; i < c->n_swa_layers; i++) {
        int l = c->swa_layers[i];
        if (l >= all)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'swa_layers'[%d] = %d is not a layer "
                                 "(num_hidden_layers %d + num_nextn_predict_layers %d)",
                                 src, i, l, c->num_hidden_layers, c->num_nextn_predict_layers);
        if (seen[l]++)
            return prl_error_set(PRL_ERR_CONFIG, "%s: 'swa_layers' lists layer %d twice", src, l);
        if (prl_config_window(c, l) < 1)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: layer %d is in 'swa_layers' but its window "
                                 "is 0 (set 'sliding_window' or 'sliding_window_list')",
                                 src, l);
    }
    if ((rc = validate_residual(c, src))) return rc;
    if (c->param_sink_number > 4096)
        return prl_error_set(PRL_ERR_CONFIG, "%s: 'param_sink_number' = %d must be in [0, 4096]",
                             src, c->param_sink_number);
    return PRL_OK;
}

/* DSA keys (docs/model.md, DSA; docs/config.md). */
static prl_status parse_dsa(prl_config *c, json_t *root, const char *src)
{
    json_t *v;
    prl_status rc;
    if ((v = json_object_get(root, "dsa_layers")) &&
        (rc = read_int_list(v, "dsa_layers", c->dsa_layers, &c->n_dsa_layers, PRL_MAX_LAYERS, src)))
        return rc;
    int_key ints[] = {
        {"index_topk", &c->index_topk},
        {"index_n_heads", &c->index_n_heads},
        {"index_head_dim", &c->index_head_dim},
    };
    if ((rc = read_ints(root, ints, 3, src))) return rc;
    if ((v = json_object_get(root, "prl_dsa_stage"))) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "sparse")) c->dsa_stage = PRL_DSA_SPARSE;
        else if (!strcmp(s, "dense")) c->dsa_stage = PRL_DSA_DENSE;
        else
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'prl_dsa_stage' = \"%s\" must be "
                                 "\"sparse\" or \"dense\"",
                                 src, s);
    }
    if ((v = json_object_get(root, "prl_dsa_freeze_main"))) c->dsa_freeze_main = json_is_true(v);
    return PRL_OK;
}

static prl_status validate_dsa(const prl_config *c, const char *src)
{
    int seen[PRL_MAX_LAYERS] = {0};
    for (int i = 0; i < c->n_dsa_layers; i++) {
        int l = c->dsa_layers[i];
        if (l >= c->num_hidden_layers)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'dsa_layers'[%d] = %d is not a layer "
                                 "(num_hidden_layers %d)",
                                 src, i, l, c->num_hidden_layers);
        if (seen[l]++)
            return prl_error_set(PRL_ERR_CONFIG, "%s: 'dsa_layers' lists layer %d twice", src, l);
        if (prl_config_window(c, l) > 0)
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: layer %d is in both 'dsa_layers' and "
                                 "'swa_layers'",
                                 src, l);
    }
    if (c->n_dsa_layers == 0) return PRL_OK;
    if (c->index_topk < 1 || c->index_n_heads < 1)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'dsa_layers' is set but '%s' = %d (must be "
                             ">= 1)",
                             src, c->index_topk < 1 ? "index_topk" : "index_n_heads",
                             c->index_topk < 1 ? c->index_topk : c->index_n_heads);
    if (c->index_head_dim < c->qk_rope_head_dim || c->index_head_dim < 1)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'index_head_dim' = %d must be >= "
                             "'qk_rope_head_dim' = %d (its first qk_rope_head_dim dims rotate)",
                             src, c->index_head_dim, c->qk_rope_head_dim);
    return PRL_OK;
}

/* ------------------------------------------------------------------ DeepSeek-V3 ------ */

/* model_type: the families prl builds (Kimi-K2 and Moonlight are DeepseekV3ForCausalLM). */
static prl_status parse_model_type(prl_config *c, json_t *root, const char *src)
{
    static const char *known[] = {"openpangu_v2", "deepseek_v3", "kimi_k2"};
    json_t *v = json_object_get(root, "model_type");
    if (!v) return PRL_OK;
    const char *s = json_string_value(v);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(s, known[i])) {
            snprintf(c->model_type, sizeof c->model_type, "%s", s);
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_UNSUPPORTED,
                         "%s: 'model_type' = \"%s\" is not supported (openpangu_v2, deepseek_v3 "
                         "or kimi_k2)",
                         src, s);
}

/* One number of the rope_scaling object into *out (absent: unchanged); must be >= 0. */
static prl_status yarn_number(json_t *rs, const char *key, double *out, const char *src)
{
    json_t *v = json_object_get(rs, key);
    if (!v || json_is_null(v)) return PRL_OK;
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || x < 0)
        return prl_error_set(PRL_ERR_CONFIG, "%s: 'rope_scaling.%s' must be a number >= 0", src,
                             key);
    *out = x;
    return PRL_OK;
}

/* rope_scaling: null, or YaRN with transformers' keys; any other type is refused by name. */
static prl_status parse_rope_scaling(prl_config *c, json_t *rs, const char *src)
{
    static const char *keys_yarn[] = {
        "type",      "rope_type",      "factor",
        "mscale",    "mscale_all_dim", "original_max_position_embeddings",
        "beta_fast", "beta_slow",      "attention_factor"};
    if (!rs || json_is_null(rs)) return PRL_OK;
    if (!json_is_object(rs))
        return prl_error_set(PRL_ERR_CONFIG, "%s: 'rope_scaling' must be null or an object", src);
    json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "(none)";
    if (strcmp(type, "yarn") != 0)
        return prl_error_set(PRL_ERR_UNSUPPORTED,
                             "%s: 'rope_scaling' type \"%s\" is not supported (null or \"yarn\")",
                             src, type);
    const char *name;
    json_t *v;
    json_object_foreach(rs, name, v)
    {
        size_t i = 0;
        while (i < sizeof keys_yarn / sizeof keys_yarn[0] && strcmp(keys_yarn[i], name)) i++;
        if (i == sizeof keys_yarn / sizeof keys_yarn[0])
            return prl_error_set(PRL_ERR_CONFIG, "%s: unknown key 'rope_scaling.%s' (YaRN)", src,
                                 name);
    }
    prl_rope_scaling *y = &c->rope_scaling;
    double orig = 0;
    prl_status rc;
    if ((rc = yarn_number(rs, "factor", &y->factor, src)) ||
        (rc = yarn_number(rs, "beta_fast", &y->beta_fast, src)) ||
        (rc = yarn_number(rs, "beta_slow", &y->beta_slow, src)) ||
        (rc = yarn_number(rs, "mscale", &y->mscale, src)) ||
        (rc = yarn_number(rs, "mscale_all_dim", &y->mscale_all_dim, src)) ||
        (rc = yarn_number(rs, "attention_factor", &y->attention_factor, src)) ||
        (rc = yarn_number(rs, "original_max_position_embeddings", &orig, src)))
        return rc;
    if (y->factor <= 0 || orig < 1 || orig > (1 << 24) || orig != floor(orig))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: YaRN 'rope_scaling' needs 'factor' > 0 and an integer "
                             "'original_max_position_embeddings' >= 1",
                             src);
    y->original_max_position_embeddings = (int)orig;
    y->yarn = 1;
    return PRL_OK;
}

/* The DeepSeek-V3 keys with maths (docs/config.md "DeepSeek-V3 family"). */
static prl_status parse_deepseek(prl_config *c, json_t *root, const char *src)
{
    prl_status rc;
    json_t *v;
    if ((rc = parse_model_type(c, root, src))) return rc;
    int_key ints[] = {
        {"moe_layer_freq", &c->moe_layer_freq},
        {"n_group", &c->n_group},
        {"topk_group", &c->topk_group},
    };
    if ((rc = read_ints(root, ints, 3, src))) return rc;
    /* transformers' DeepseekV3Config defaults to interleaved pairs, as DeepSeek's checkpoints
    ** are laid out (the released config.json files do not say) */
    c->rope_interleave = prl_config_is_deepseek(c);
    if ((v = json_object_get(root, "rope_interleave"))) c->rope_interleave = json_is_true(v);
    if ((rc = parse_rope_scaling(c, json_object_get(root, "rope_scaling"), src))) return rc;
    if ((v = json_object_get(root, "num_key_value_heads")) &&
        json_integer_value(v) != json_integer_value(json_object_get(root, "num_attention_heads")))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'num_key_value_heads' = %lld must equal 'num_attention_heads' "
                             "(MLA: every query head has its key and value)",
                             src, (long long)json_integer_value(v));
    if (!prl_config_is_deepseek(c)) return PRL_OK;
    char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
    size_t n = text ? strlen(text) : 0;
    if (text && n < sizeof c->source_json) memcpy(c->source_json, text, n + 1);
    free(text);
    if (!text || n >= sizeof c->source_json)
        return prl_error_set(PRL_ERR_CONFIG, "%s: the config is over %d bytes", src,
                             PRL_CONFIG_SOURCE_MAX - 1);
    return PRL_OK;
}

/* A reward model: architectures names a *ForSequenceClassification class, whose scalar head
** (score.weight) reads the last token; num_labels (default 1) must be 1 — one score. */
static prl_status parse_score_head(prl_config *c, json_t *root, const char *src)
{
    const char *arch = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
    static const char suffix[] = "ForSequenceClassification";
    size_t n = arch ? strlen(arch) : 0, k = sizeof suffix - 1;
    c->score_head = n >= k && !strcmp(arch + n - k, suffix);
    json_t *labels = json_object_get(root, "num_labels");
    if (labels && (!c->score_head || json_integer_value(labels) != 1))
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'num_labels' = %lld: only 1 (a scalar reward head, with "
                             "architectures [\"...ForSequenceClassification\"]) is supported",
                             src, (long long)json_integer_value(labels));
    return PRL_OK;
}

/* moe_layer_freq and the routing groups against the expert counts. */
static prl_status validate_deepseek(const prl_config *c, const char *src)
{
    if (c->n_group < 1 || c->topk_group < 1 || c->topk_group > c->n_group)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'n_group' = %d and 'topk_group' = %d must satisfy 1 <= "
                             "topk_group <= n_group",
                             src, c->n_group, c->topk_group);
    if (c->n_group == 1 || prl_config_moe_layers_all(c) == 0) return PRL_OK;
    int E = c->n_routed_experts, per = E / c->n_group;
    if (E % c->n_group || per < 2)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'n_group' = %d must divide 'n_routed_experts' = %d into "
                             "groups of at least 2 (a group scores by its top two)",
                             src, c->n_group, E);
    if (c->topk_group * per < c->num_experts_per_tok)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s: 'topk_group' = %d groups of %d experts cannot hold "
                             "'num_experts_per_tok' = %d",
                             src, c->topk_group, per, c->num_experts_per_tok);
    return PRL_OK;
}

static prl_status parse_object(prl_config *c, json_t *root, const char *src)
{
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v)
    {
        const key_spec *k = find_key(name);
        if (!k) {
            const char *near = nearest_key(name);
            if (near)
                return prl_error_set(PRL_ERR_CONFIG,
                                     "%s: unknown config key '%s' (did you "
                                     "mean '%s'?)",
                                     src, name, near);
            return prl_error_set(PRL_ERR_CONFIG, "%s: unknown config key '%s'", src, name);
        }
        if (!strcmp(name, "q_lora_rank") && json_is_null(v)) {
            c->q_lora_rank = 0; /* no query latent: a direct q_proj (Moonlight, V2-Lite) */
            continue;
        }
        if (json_is_null(v) && !strcmp(name, "pad_token_id"))
            continue; /* Moonlight has none: prl keeps its default id, the source keeps null */
        if (!value_has_type(v, k->type) && !(k->use == USE_UNSUPPORTED && json_is_null(v)))
            return prl_error_set(PRL_ERR_CONFIG, "%s: '%s' must be %s", src, name,
                                 type_name(k->type));
        if (k->use == USE_UNSUPPORTED && !block_is_off(v))
            return prl_error_set(PRL_ERR_UNSUPPORTED,
                                 "%s: '%s' turns on %s, which is not yet supported by this "
                                 "build; remove the key or switch it off (0, false or [])",
                                 src, name, k->what);
        if (k->use == USE_FIELD) {
            prl_status rc = store_field(c, k, v);
            if (rc) return prl_error_wrap(rc, "%s: ", src);
        }
    }
    if ((v = json_object_get(root, "prl_bias_update_rule"))) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "sign")) c->bias_rule = PRL_BIAS_SIGN;
        else if (!strcmp(s, "rms")) c->bias_rule = PRL_BIAS_RMS;
        else
            return prl_error_set(PRL_ERR_CONFIG,
                                 "%s: 'prl_bias_update_rule' = \"%s\" must be "
                                 "\"sign\" or \"rms\"",
                                 src, s);
    }
    prl_status rc = parse_attention(c, root, src);
    if (!rc && (v = json_object_get(root, "block_post_layernorm_idx")))
        rc = read_int_list(v, "block_post_layernorm_idx", c->block_post_layernorm_idx,
                           &c->n_block_post_layernorm_idx, PRL_MAX_LAYERS, src);
    if (!rc) rc = parse_dsa(c, root, src);
    if (!rc) rc = parse_deepseek(c, root, src);
    if (!rc) rc = parse_score_head(c, root, src);
    return rc ? rc : check_fixed_values(c, root, src);
}

prl_status prl_config_parse(prl_config *c, const char *json_text, const char *source)
{
    prl_config_default(c);
    json_error_t err;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return prl_error_set(PRL_ERR_CONFIG, "%s:%d:%d: invalid JSON: %s", source, err.line,
                             err.column, err.text);
    prl_status rc;
    if (!json_is_object(root))
        rc = prl_error_set(PRL_ERR_CONFIG, "%s: a config must be a JSON object", source);
    else if ((rc = parse_object(c, root, source)) == PRL_OK &&
             (rc = validate(c, source)) == PRL_OK &&
             (rc = validate_attention(c, source)) == PRL_OK &&
             (rc = validate_deepseek(c, source)) == PRL_OK)
        rc = validate_dsa(c, source);
    json_decref(root);
    return rc;
}

prl_status prl_config_load(prl_config *c, const char *path)
{
    char *text;
    prl_status rc = prl_file_read(path, &text, NULL);
    if (rc) return prl_error_wrap(rc, "config: ");
    rc = prl_config_parse(c, text, path);
    free(text);
    return rc;
}

static json_t *rope_scaling_json(const prl_rope_scaling *y)
{
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("yarn"));
    json_object_set_new(o, "factor", json_real(y->factor));
    json_object_set_new(o, "original_max_position_embeddings",
                        json_integer(y->original_max_position_embeddings));
    const char *names[] = {"beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                           "attention_factor"};
    double vals[] = {y->beta_fast, y->beta_slow, y->mscale, y->mscale_all_dim, y->attention_factor};
    for (int i = 0; i < 5; i++)
        if (vals[i] > 0) json_object_set_new(o, names[i], json_real(vals[i]));
    return o;
}

/* The DeepSeek-V3 keys prl writes into an openPangu config, only when not the default (so
** the config.json of every openPangu model is as before). */
static void deepseek_keys_json(json_t *o, const prl_config *c)
{
    if (c->moe_layer_freq != 1)
        json_object_set_new(o, "moe_layer_freq", json_integer(c->moe_layer_freq));
    if (c->n_group != 1 || c->topk_group != 1) {
        json_object_set_new(o, "n_group", json_integer(c->n_group));
        json_object_set_new(o, "topk_group", json_integer(c->topk_group));
    }
    if (c->rope_scaling.yarn)
        json_object_set_new(o, "rope_scaling", rope_scaling_json(&c->rope_scaling));
}

/* Set key k of o to the field's value unless the source already holds that value (so a
** round trip keeps the source's spelling: 10000 stays an integer). A null stays null. */
static void update_field(json_t *o, const key_spec *k, const prl_config *c)
{
    json_t *old = json_object_get(o, k->name);
    if (old && json_is_null(old)) return;
    if (!strcmp(k->name, "q_lora_rank") && c->q_lora_rank == 0) {
        json_object_set_new(o, k->name, json_null());
        return;
    }
    const char *base = (const char *)c + k->offset;
    json_t *nv = NULL;
    if (k->type == K_INT) {
        int x = *(const int *)base;
        if (!old || !json_is_integer(old) || json_integer_value(old) != x) nv = json_integer(x);
    } else if (k->type == K_REAL) {
        double x = *(const double *)base;
        if (!old || !json_is_number(old) || json_number_value(old) != x) nv = json_real(x);
    } else if (k->type == K_BOOL) {
        int x = *(const int *)base;
        if (!old || !json_is_boolean(old) || json_is_true(old) != x) nv = json_boolean(x);
    }
    if (nv) json_object_set_new(o, k->name, nv);
}

/* A DeepSeek-V3-family config: its source object, every key in its place, with prl's values
** of the keys it reads; prl's own prl_* keys only where they are not the default. */
static char *deepseek_to_json(const prl_config *c)
{
    json_t *o = json_loads(c->source_json, 0, NULL);
    if (!o) return NULL;
    prl_config def;
    prl_config_default(&def);
    for (int i = 0; i < N_KEYS; i++) {
        const key_spec *k = &keys[i];
        if (k->use != USE_FIELD) continue;
        size_t sz = k->type == K_REAL ? sizeof(double) : sizeof(int);
        int present = json_object_get(o, k->name) != NULL;
        int is_default = !memcmp((const char *)c + k->offset, (const char *)&def + k->offset, sz);
        if (present || (strncmp(k->name, "prl_", 4) == 0 && !is_default)) update_field(o, k, c);
    }
    if (json_object_get(o, "prl_bias_update_rule") || c->bias_rule != PRL_BIAS_SIGN)
        json_object_set_new(o, "prl_bias_update_rule",
                            json_string(c->bias_rule == PRL_BIAS_RMS ? "rms" : "sign"));
    const char *ints[] = {"moe_layer_freq", "n_group", "topk_group"};
    const int vals[] = {c->moe_layer_freq, c->n_group, c->topk_group};
    for (int i = 0; i < 3; i++)
        if (json_object_get(o, ints[i]) || vals[i] != 1)
            json_object_set_new(o, ints[i], json_integer(vals[i]));
    if (json_object_get(o, "rope_interleave") || !c->rope_interleave) /* the default: true */
        json_object_set_new(o, "rope_interleave", json_boolean(c->rope_interleave));
    if (c->score_head) { /* a reward model made from a DeepSeek-V3 checkpoint */
        json_object_set_new(o, "architectures",
                            json_pack("[s]", "DeepseekV3ForSequenceClassification"));
        json_object_set_new(o, "num_labels", json_integer(1));
    }
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}

char *prl_config_to_json(const prl_config *c)
{
    if (prl_config_is_deepseek(c)) return deepseek_to_json(c);
    json_t *o = json_object();
    json_object_set_new(o, "architectures",
                        json_pack("[s]", c->score_head ? "OpenPanguV2ForSequenceClassification"
                                                       : "OpenPanguV2ForCausalLM"));
    if (c->score_head) json_object_set_new(o, "num_labels", json_integer(1));
    json_object_set_new(o, "model_type", json_string("openpangu_v2"));
    for (int i = 0; i < N_KEYS; i++) {
        const key_spec *k = &keys[i];
        if (k->use != USE_FIELD) continue;
        const char *base = (const char *)c + k->offset;
        if (k->type == K_INT) json_object_set_new(o, k->name, json_integer(*(const int *)base));
        if (k->type == K_REAL) json_object_set_new(o, k->name, json_real(*(const double *)base));
        if (k->type == K_BOOL) json_object_set_new(o, k->name, json_boolean(*(const int *)base));
    }
    if (c->q_lora_rank == 0) json_object_set_new(o, "q_lora_rank", json_null());
    json_object_set_new(o, "prl_bias_update_rule",
                        json_string(c->bias_rule == PRL_BIAS_RMS ? "rms" : "sign"));
    if (c->n_swa_layers > 0) {
        json_t *layers = json_array(), *windows = json_array();
        for (int i = 0; i < c->n_swa_layers; i++)
            json_array_append_new(layers, json_integer(c->swa_layers[i]));
        for (int i = 0; i < c->n_sliding_window_list; i++)
            json_array_append_new(windows, json_integer(c->sliding_window_list[i]));
        json_object_set_new(o, "swa_layers", layers);
        if (c->n_sliding_window_list > 0) json_object_set_new(o, "sliding_window_list", windows);
        else json_decref(windows);
        json_object_set_new(o, "sliding_window", json_integer(c->sliding_window));
    }
    if (c->router_sliding_window > 0) {
        json_object_set_new(o, "use_mome", json_boolean(c->use_mome));
        json_object_set_new(o, "router_sliding_window", json_integer(c->router_sliding_window));
    }
    if (c->param_sink_number > 0) {
        json_object_set_new(o, "param_sink_number", json_integer(c->param_sink_number));
        json_object_set_new(o, "param_sink_with_value", json_boolean(c->param_sink_with_value));
    }
    if (c->n_block_post_layernorm_idx > 0) {
        json_t *idx = json_array();
        for (int i = 0; i < c->n_block_post_layernorm_idx; i++)
            json_array_append_new(idx, json_integer(c->block_post_layernorm_idx[i]));
        json_object_set_new(o, "block_post_layernorm_idx", idx);
    }
    if (c->n_dsa_layers > 0) {
        json_t *layers = json_array();
        for (int i = 0; i < c->n_dsa_layers; i++)
            json_array_append_new(layers, json_integer(c->dsa_layers[i]));
        json_object_set_new(o, "dsa_layers", layers);
        json_object_set_new(o, "index_topk", json_integer(c->index_topk));
        json_object_set_new(o, "index_n_heads", json_integer(c->index_n_heads));
        json_object_set_new(o, "index_head_dim", json_integer(c->index_head_dim));
        json_object_set_new(o, "prl_dsa_stage",
                            json_string(c->dsa_stage == PRL_DSA_DENSE ? "dense" : "sparse"));
        json_object_set_new(o, "prl_dsa_freeze_main", json_boolean(c->dsa_freeze_main));
    }
    deepseek_keys_json(o, c);
    json_object_set_new(o, "rope_interleave", json_boolean(c->rope_interleave));
    json_object_set_new(o, "tie_word_embeddings", json_false());
    json_object_set_new(o, "torch_dtype", json_string("float32"));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(o);
    return s;
}

int prl_config_window(const prl_config *c, int layer)
{
    for (int i = 0; i < c->n_swa_layers; i++)
        if (c->swa_layers[i] == layer)
            return i < c->n_sliding_window_list ? c->sliding_window_list[i] : c->sliding_window;
    return 0;
}

int prl_config_streams(const prl_config *c) { return c->use_mhc ? c->mhc_num_stream : 1; }

int prl_config_block_post_norm(const prl_config *c, int layer)
{
    for (int i = 0; i < c->n_block_post_layernorm_idx; i++)
        if (c->block_post_layernorm_idx[i] == layer) return 1;
    return 0;
}

int prl_config_is_dsa(const prl_config *c, int layer)
{
    for (int i = 0; i < c->n_dsa_layers; i++)
        if (c->dsa_layers[i] == layer) return 1;
    return 0;
}

int prl_config_conv_kernel(const prl_config *c)
{
    return c->use_mome ? c->router_sliding_window : 0;
}

/* DeepSeek's HF modeling_deepseek.py rule (transformers' port and the official inference code
** ignore moe_layer_freq, which is 1 in every released config). */
int prl_config_is_moe(const prl_config *c, int layer)
{
    return layer >= c->first_k_dense_replace && layer % c->moe_layer_freq == 0;
}

static int moe_layers_below(const prl_config *c, int n)
{
    int k = 0;
    for (int l = 0; l < n; l++) k += prl_config_is_moe(c, l);
    return k;
}

int prl_config_moe_layers(const prl_config *c) { return moe_layers_below(c, c->num_hidden_layers); }

int prl_config_moe_layers_all(const prl_config *c)
{
    return moe_layers_below(c, c->num_hidden_layers + c->num_nextn_predict_layers);
}

int prl_config_moe_layer(const prl_config *c, int moe_idx)
{
    for (int l = 0, k = 0; l < c->num_hidden_layers + c->num_nextn_predict_layers; l++)
        if (prl_config_is_moe(c, l) && k++ == moe_idx) return l;
    return -1;
}

int prl_config_is_deepseek(const prl_config *c)
{
    return strcmp(c->model_type, "openpangu_v2") != 0;
}

double prl_yarn_mscale(double factor, double mscale)
{
    return factor <= 1 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

double prl_config_softmax_scale(const prl_config *c)
{
    double s = 1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    const prl_rope_scaling *y = &c->rope_scaling;
    if (y->yarn && y->mscale_all_dim > 0) {
        double m = prl_yarn_mscale(y->factor, y->mscale_all_dim);
        s = s * m * m;
    }
    return s;
}
