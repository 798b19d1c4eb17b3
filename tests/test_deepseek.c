/*
** test_deepseek.c — DeepSeek-V3-family configs (deepseek_v3, kimi_k2): the real config.json
** key sets (tests/data, dimensions shrunk) parse and are written back with their own keys,
** the keys with maths are read and checked, moe_layer_freq shapes the layer table, and the
** router biases of every MoE layer — the MTP layers' too — are saved, loaded and updated.
*/
#include "engine/ops.h"
#include "tests/check_util.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static prl_status load_data(prl_config *c, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tests/data/%s", PRL_SOURCE_DIR, name);
    return prl_config_load(c, path);
}

static prl_status parse(prl_config *c, const char *text)
{
    return prl_config_parse(c, text, "cfg");
}

/* 1 when the objects a and b have the same set of keys. */
static int same_keys(json_t *a, json_t *b)
{
    const char *k;
    json_t *v;
    json_object_foreach(a, k, v) if (!json_object_get(b, k)) return 0;
    json_object_foreach(b, k, v) if (!json_object_get(a, k)) return 0;
    return 1;
}

/* A config is written back with its source's keys (deployment ones too) and parses to the
** same config. */
static void check_round_trip(const prl_config *c, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tests/data/%s", PRL_SOURCE_DIR, name);
    json_t *src = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(src);
    char *text = prl_config_to_json(c);
    ck_assert_ptr_nonnull(text);
    json_t *out = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(out);
    ck_assert_msg(same_keys(src, out), "%s: written keys differ from the source's", name);
    const char *kept[] = {"quantization_config", "auto_map", "rope_scaling", "q_lora_rank"};
    for (int i = 0; i < 4; i++) /* structured and null values come back as they were */
        ck_assert_msg(!json_object_get(src, kept[i]) ||
                          json_equal(json_object_get(src, kept[i]), json_object_get(out, kept[i])),
                      "%s: '%s' changed", name, kept[i]);
    ck_assert_str_eq(json_string_value(json_object_get(out, "model_type")),
                     json_string_value(json_object_get(src, "model_type")));
    prl_config c2;
    ck_assert_int_eq(prl_config_parse(&c2, text, "round trip"), PRL_OK);
    ck_assert_mem_eq(c, &c2, sizeof *c);
    free(text);
    json_decref(src), json_decref(out);
}

START_TEST(test_real_config_key_sets)
{
    prl_config c;
    assert_ok(load_data(&c, "deepseek-v3-mini.json"));
    ck_assert_str_eq(c.model_type, "deepseek_v3");
    ck_assert_int_eq(prl_config_is_deepseek(&c), 1);
    ck_assert_int_eq(c.n_group, 4);
    ck_assert_int_eq(c.topk_group, 2);
    ck_assert_int_eq(c.rope_interleave, 1); /* absent: transformers' DeepseekV3Config default */
    ck_assert_int_eq(c.rope_scaling.yarn, 1);
    ck_assert_double_eq(c.rope_scaling.factor, 40);
    ck_assert_int_eq(c.rope_scaling.original_max_position_embeddings, 64);
    ck_assert_double_eq(c.rope_scaling.mscale_all_dim, 1);
    double m = 0.1 * log(40) + 1;
    ck_assert_double_eq_tol(prl_config_softmax_scale(&c), m * m / sqrt(12.0), 1e-15);
    ck_assert_int_eq(prl_config_moe_layers(&c), 2);     /* layers 1, 2 */
    ck_assert_int_eq(prl_config_moe_layers_all(&c), 3); /* and the MTP layer 3 */
    check_round_trip(&c, "deepseek-v3-mini.json");

    assert_ok(load_data(&c, "kimi-k2-mini.json"));
    ck_assert_str_eq(c.model_type, "kimi_k2");
    ck_assert_double_eq(c.rope_scaling.beta_fast, 1);
    /* mscale = mscale_all_dim: the cos/sin factor is 1, the softmax scale still m² */
    ck_assert_double_eq(prl_rope_attention_factor(&c.rope_scaling), 1);
    check_round_trip(&c, "kimi-k2-mini.json");

    /* Moonlight: no query latent (q_lora_rank null: a direct q_proj), no rope_scaling, no
    ** pad_token_id */
    assert_ok(load_data(&c, "moonlight-mini.json"));
    ck_assert_int_eq(c.q_lora_rank, 0);
    ck_assert_int_eq(c.rope_scaling.yarn, 0);
    ck_assert_double_eq_tol(prl_config_softmax_scale(&c), 1 / sqrt(12.0), 1e-16);
    check_round_trip(&c, "moonlight-mini.json");
    prl_model mm;
    assert_ok(prl_model_init(&mm, &c));
    ck_assert_ptr_nonnull(prl_model_find(&mm, "model.layers.0.self_attn.q_proj.weight"));
    ck_assert_ptr_null(prl_model_find(&mm, "model.layers.0.self_attn.q_a_proj.weight"));
    ck_assert_ptr_null(prl_model_find(&mm, "model.layers.0.self_attn.q_a_layernorm.weight"));
    prl_model_free(&mm);
    /* the query latent is what DSA and the ModAttn query conv read */
    ck_assert_int_eq(parse(&c, "{\"q_lora_rank\": null, \"router_sliding_window\": 3}"),
                     PRL_ERR_CONFIG);
    assert_msg_has("q_lora_rank");
}
END_TEST

/* The real dimensions parse too: DeepSeek-V3's (61 layers + 1 MTP, 256 experts in 8 groups,
** YaRN 40 over 4096) and Kimi-K2's (384 experts, 64 heads, 131072 positions). */
static void check_full_size(const char *name, const char *const *kv, int n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tests/data/%s", PRL_SOURCE_DIR, name);
    json_t *o = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(o);
    for (int i = 0; i < n; i += 2)
        json_object_set_new(o, kv[i], json_loads(kv[i + 1], JSON_DECODE_ANY, NULL));
    json_object_set_new(json_object_get(o, "rope_scaling"), "original_max_position_embeddings",
                        json_integer(4096));
    char *text = json_dumps(o, 0);
    prl_config c;
    ck_assert_msg(prl_config_parse(&c, text, name) == PRL_OK, "%s", prl_error_message());
    free(text), json_decref(o);
}

START_TEST(test_full_size_configs)
{
    const char *v3[] = {"hidden_size",
                        "7168",
                        "intermediate_size",
                        "18432",
                        "kv_lora_rank",
                        "512",
                        "max_position_embeddings",
                        "163840",
                        "moe_intermediate_size",
                        "2048",
                        "first_k_dense_replace",
                        "3",
                        "n_group",
                        "8",
                        "n_routed_experts",
                        "256",
                        "num_attention_heads",
                        "128",
                        "num_experts_per_tok",
                        "8",
                        "num_hidden_layers",
                        "61",
                        "num_key_value_heads",
                        "128",
                        "q_lora_rank",
                        "1536",
                        "qk_nope_head_dim",
                        "128",
                        "qk_rope_head_dim",
                        "64",
                        "topk_group",
                        "4",
                        "v_head_dim",
                        "128",
                        "vocab_size",
                        "129280"};
    check_full_size("deepseek-v3-mini.json", v3, sizeof v3 / sizeof v3[0]);
    const char *k2[] = {"hidden_size",
                        "7168",
                        "intermediate_size",
                        "18432",
                        "kv_lora_rank",
                        "512",
                        "max_position_embeddings",
                        "131072",
                        "moe_intermediate_size",
                        "2048",
                        "n_routed_experts",
                        "384",
                        "num_attention_heads",
                        "64",
                        "num_experts_per_tok",
                        "8",
                        "num_hidden_layers",
                        "61",
                        "num_key_value_heads",
                        "64",
                        "q_lora_rank",
                        "1536",
                        "qk_nope_head_dim",
                        "128",
                        "qk_rope_head_dim",
                        "64",
                        "v_head_dim",
                        "128",
                        "vocab_size",
                        "163840",
                        "bos_token_id",
                        "163584",
                        "eos_token_id",
                        "163585"};
    check_full_size("kimi-k2-mini.json", k2, sizeof k2 / sizeof k2[0]);
}
END_TEST

#define DS_KEYS                                                                                    \
    "\"model_type\": \"deepseek_v3\", \"vocab_size\": 96, \"hidden_size\": 32,"                    \
    " \"num_attention_heads\": 2, \"q_lora_rank\": 16,"                                            \
    " \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8,"  \
    " \"first_k_dense_replace\": 1, \"intermediate_size\": 64, \"n_routed_experts\": 8,"           \
    " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, \"n_shared_experts\": 1,"         \
    " \"max_position_embeddings\": 64, \"initializer_range\": 0.1"

START_TEST(test_config_keys_with_maths)
{
    prl_config c;
    const char *bad[][2] = {
        {"{" DS_KEYS ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", "linear"},
        {"{" DS_KEYS ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0}}",
         "original_max_position_embeddings"},
        {"{" DS_KEYS ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0, "
         "\"original_max_position_embeddings\": 8, \"truncate\": false}}",
         "rope_scaling.truncate"},
        {"{" DS_KEYS ", \"topk_method\": \"greedy\"}", "greedy"},
        {"{" DS_KEYS ", \"topk_method\": \"group_limited_greedy\"}", "group_limited_greedy"},
        {"{" DS_KEYS ", \"scoring_func\": \"softmax\"}", "softmax"},
        {"{" DS_KEYS ", \"num_key_value_heads\": 1}", "num_key_value_heads"},
        {"{" DS_KEYS ", \"moe_layer_freq\": 0}", "moe_layer_freq"},
        {"{" DS_KEYS ", \"n_group\": 3}", "n_group"},
        {"{" DS_KEYS ", \"n_group\": 8}", "n_group"}, /* groups of one expert */
        {"{" DS_KEYS ", \"n_group\": 4, \"topk_group\": 5}", "topk_group"},
        {"{" DS_KEYS ", \"model_type\": \"llama\"}", NULL}, /* a duplicate: invalid JSON */
        {"{" DS_KEYS ", \"qk_head_dimm\": 12}", "qk_head_dimm"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(parse(&c, bad[i][0]) != PRL_OK, "accepted: %s", bad[i][0]);
        if (bad[i][1]) assert_msg_has(bad[i][1]);
    }
    ck_assert_int_eq(parse(&c, "{\"model_type\": \"gpt2\"}"), PRL_ERR_UNSUPPORTED);
    assert_msg_has("gpt2");
    /* the deployment keys are accepted, their values kept in the written config */
    assert_ok(parse(&c, "{" DS_KEYS ", \"ep_size\": 8, \"pretraining_tp\": 1, \"seq_aux\": true, "
                        "\"aux_loss_alpha\": 0.001, \"quantization_config\": {\"fmt\": \"e4m3\"}, "
                        "\"moe_layer_freq\": 2, \"n_group\": 4, \"topk_group\": 1}"));
    char *text = prl_config_to_json(&c);
    json_t *o = json_loads(text, 0, NULL);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "ep_size")), 8);
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(o, "quantization_config"), "fmt")),
        "e4m3");
    json_decref(o), free(text);
    /* 6 layers, moe_layer_freq 2: MoE on layers 2 and 4 only (l >= first_k_dense_replace and
    ** l % 2 == 0) */
    for (int l = 0; l < 6; l++) ck_assert_int_eq(prl_config_is_moe(&c, l), l == 2 || l == 4);
    ck_assert_int_eq(prl_config_moe_layer(&c, 0), 2);
    ck_assert_int_eq(prl_config_moe_layer(&c, 1), 4);
    ck_assert_int_eq(prl_config_moe_layer(&c, 2), -1);
    /* an openPangu config written by prl carries the DeepSeek keys only when not the default */
    assert_ok(parse(&c, "{\"n_group\": 1, \"moe_layer_freq\": 1, \"rope_scaling\": null}"));
    text = prl_config_to_json(&c);
    ck_assert_ptr_null(strstr(text, "n_group"));
    ck_assert_ptr_null(strstr(text, "moe_layer_freq"));
    ck_assert_ptr_null(strstr(text, "rope_scaling"));
    ck_assert_ptr_nonnull(strstr(text, "\"rope_interleave\": false"));
    free(text);
    assert_ok(parse(&c, "{\"n_group\": 2, \"topk_group\": 1, \"moe_layer_freq\": 2, "
                        "\"rope_interleave\": true, \"rope_scaling\": {\"type\": \"yarn\", "
                        "\"factor\": 4.0, \"original_max_position_embeddings\": 32, "
                        "\"mscale_all_dim\": 0.5}}"));
    text = prl_config_to_json(&c);
    prl_config c2;
    assert_ok(prl_config_parse(&c2, text, "round trip"));
    ck_assert_mem_eq(&c, &c2, sizeof c);
    free(text);
}
END_TEST

/* A deepseek_v3 model of 6 layers (the default) with MoE layers 2 and 4 (moe_layer_freq 2;
** 1, 3 and 5 dense) and an MoE MTP layer 6. */
static const char *mtp_moe_config =
    "{" DS_KEYS ", \"moe_layer_freq\": 2, \"num_nextn_predict_layers\": 1,"
    " \"prl_bias_update_rate\": 0.05}";

static void build(prl_model *m, const char *config)
{
    prl_config c;
    assert_ok(parse(&c, config));
    assert_ok(prl_model_init(m, &c));
    prl_model_init_weights(m, 3);
}

/* One SFT-like forward with the MTP modules, then the bias update. */
static void forward_and_update(prl_model *m)
{
    enum { B = 2, T = 16 };
    int32_t tok[B * T], tgt[B * T];
    float w[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)((i * 37 + 11) % 96);
        tgt[i] = i % T + 1 < T ? (int32_t)(((i + 1) * 37 + 11) % 96) : -1;
        w[i] = tgt[i] >= 0 ? -1.0f / 30 : 0;
    }
    prl_batch b = {.B = B,
                   .T = T,
                   .tokens = tok,
                   .targets = tgt,
                   .weights = w,
                   .temperature = 1,
                   .with_mtp = 1};
    assert_ok(prl_model_forward(m, &b, NULL, NULL));
    prl_model_update_router_bias(m);
}

/* Part 6 of issue 22: the MTP layers' router biases are saved and loaded under their layer's
** name (DeepSeek's mlp.gate.e_score_correction_bias) and updated like the trunk's. */
START_TEST(test_mtp_router_bias)
{
    char dir[] = "/tmp/prl_test_deepseek_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    prl_model m, m2;
    build(&m, mtp_moe_config);
    ck_assert_int_eq(m.n_moe, 2);
    ck_assert_int_eq(m.n_moe_all, 3);
    int E = m.cfg.n_routed_experts;
    for (int i = 0; i < m.n_moe_all * E; i++) m.router_bias[i] = 0.01f * (float)(i + 1);
    assert_ok(prl_checkpoint_save(&m, NULL, NULL, NULL, ckpt));
    assert_ok(prl_checkpoint_load(&m2, ckpt));
    ck_assert_mem_eq(m.router_bias, m2.router_bias, (size_t)m.n_moe_all * E * sizeof(float));
    /* the names: layers 2, 4 and the MTP layer 6, in DeepSeek's spelling */
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    prl_safetensors st;
    assert_ok(prl_safetensors_open(&st, path));
    ck_assert_ptr_nonnull(
        prl_safetensors_find(&st, "model.layers.2.mlp.gate.e_score_correction_bias"));
    ck_assert_ptr_nonnull(
        prl_safetensors_find(&st, "model.layers.4.mlp.gate.e_score_correction_bias"));
    ck_assert_ptr_nonnull(
        prl_safetensors_find(&st, "model.layers.6.mlp.gate.e_score_correction_bias"));
    ck_assert_ptr_null(
        prl_safetensors_find(&st, "model.layers.3.mlp.gate.e_score_correction_bias"));
    ck_assert_ptr_null(
        prl_safetensors_find(&st, "model.layers.5.mlp.gate.e_score_correction_bias"));
    prl_safetensors_free(&st);
    /* updated as the trunk's: every row moves */
    prl_real *before = malloc((size_t)m.n_moe_all * E * sizeof *before);
    memcpy(before, m.router_bias, (size_t)m.n_moe_all * E * sizeof *before);
    forward_and_update(&m);
    for (int i = 0; i < m.n_moe_all; i++)
        ck_assert_msg(memcmp(before + (size_t)i * E, m.router_bias + (size_t)i * E,
                             (size_t)E * sizeof *before) != 0,
                      "router bias row %d (layer %d) did not move", i,
                      prl_config_moe_layer(&m.cfg, i));
    /* with the trunk frozen only the MTP layer's row learns */
    prl_model f;
    build(&f, "{" DS_KEYS ", \"moe_layer_freq\": 2, \"num_nextn_predict_layers\": 1,"
              " \"prl_bias_update_rate\": 0.05, \"prl_mtp_freeze_trunk\": true}");
    memcpy(before, f.router_bias, (size_t)f.n_moe_all * E * sizeof *before);
    forward_and_update(&f);
    ck_assert_mem_eq(before, f.router_bias, (size_t)f.n_moe * E * sizeof *before);
    ck_assert(memcmp(before + (size_t)f.n_moe * E, f.router_bias + (size_t)f.n_moe * E,
                     (size_t)E * sizeof *before) != 0);
    free(before);
    prl_model_free(&m), prl_model_free(&m2), prl_model_free(&f);
    check_remove_tree(dir);
}
END_TEST

/* An openPangu checkpoint names its MTP layer's bias as the trunk's (its own spelling), and a
** file with the DeepSeek spelling loads into it too. */
START_TEST(test_openpangu_mtp_bias_names)
{
    char dir[] = "/tmp/prl_test_deepseek_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char ckpt[600], path[700];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    prl_model m, m2;
    build(&m, "{\"vocab_size\": 96, \"hidden_size\": 32, \"num_hidden_layers\": 2,"
              " \"num_attention_heads\": 2, \"q_lora_rank\": 16, \"kv_lora_rank\": 16,"
              " \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8,"
              " \"n_routed_experts\": 4, \"moe_intermediate_size\": 16,"
              " \"num_nextn_predict_layers\": 1}");
    ck_assert_int_eq(m.n_moe_all, 2); /* layer 1 and the MTP layer 2 */
    for (int i = 0; i < m.n_moe_all * 4; i++) m.router_bias[i] = 0.5f - 0.01f * (float)i;
    assert_ok(prl_checkpoint_save(&m, NULL, NULL, NULL, ckpt));
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    prl_safetensors st;
    assert_ok(prl_safetensors_open(&st, path));
    ck_assert_ptr_nonnull(prl_safetensors_find(&st, "model.layers.2.mlp.e_score_correction.bias"));
    prl_safetensors_free(&st);
    assert_ok(prl_checkpoint_load(&m2, ckpt));
    ck_assert_mem_eq(m.router_bias, m2.router_bias, (size_t)m.n_moe_all * 4 * sizeof(float));
    prl_model_free(&m), prl_model_free(&m2);
    check_remove_tree(dir);
}
END_TEST

/* Routing replay with group-limited routing: a replayed route bypasses the selection (groups
** included), so replaying the captured routes reproduces the forward bit for bit, and a route
** into a group the gate would drop is taken as given. */
START_TEST(test_grouped_routes_replay)
{
    prl_model m;
    build(&m, "{" DS_KEYS ", \"n_group\": 4, \"topk_group\": 1}");
    ck_assert_int_eq(m.n_moe, 5); /* layers 1..5 */
    enum { B = 2, T = 10 };
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 29 + 5) % 96), tgt[i] = tok[i];
    prl_batch b = {.B = B, .T = T, .tokens = tok, .targets = tgt, .temperature = 1};
    float lp[B * T], lp2[B * T];
    assert_ok(prl_model_logprobs(&m, &b, lp));
    size_t nr = (size_t)m.n_moe * B * T * 2;
    int32_t *routes = malloc(nr * sizeof *routes);
    memcpy(routes, prl_model_routes(&m), nr * sizeof *routes);
    for (size_t i = 0; i < nr; i += 2) /* one group of 2 kept: both experts share a group */
        ck_assert_int_eq(routes[i] / 2, routes[i + 1] / 2);
    b.route_override = routes;
    assert_ok(prl_model_logprobs(&m, &b, lp2));
    ck_assert_mem_eq(lp, lp2, sizeof lp);
    for (size_t i = 0; i < nr; i += 2) routes[i + 1] = (routes[i] + 2) % 8; /* another group */
    assert_ok(prl_model_logprobs(&m, &b, lp2));
    ck_assert_mem_eq(prl_model_routes(&m), routes, nr * sizeof *routes);
    ck_assert(memcmp(lp, lp2, sizeof lp) != 0);
    free(routes);
    prl_model_free(&m);
}
END_TEST

static Suite *deepseek_suite(void)
{
    Suite *s = suite_create("deepseek");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_real_config_key_sets);
    tcase_add_test(tc, test_full_size_configs);
    tcase_add_test(tc, test_config_keys_with_maths);
    tcase_add_test(tc, test_mtp_router_bias);
    tcase_add_test(tc, test_openpangu_mtp_bias_names);
    tcase_add_test(tc, test_grouped_routes_replay);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (prl_blas_init(0) != PRL_OK) return 1;
    return check_run(deepseek_suite());
}
