/*
** test_model.c — the float engine: config validation, checkpoints (round trip, tampering and
** verify, non-finite optimizer state, stale save temporaries,
** atomicity), determinism across thread counts, optimizers against closed-form cases,
** schedules, clipping, expert-bias balancing, route capture/override and tensor hooks.
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "engine/ops.h"
#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SMALL_KEYS                                                                                 \
    "\"vocab_size\": 96, \"hidden_size\": 32, \"num_hidden_layers\": 3,"                           \
    " \"num_attention_heads\": 2, \"q_lora_rank\": 16, \"kv_lora_rank\": 16,"                      \
    " \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8,"                        \
    " \"first_k_dense_replace\": 1, \"intermediate_size\": 64,"                                    \
    " \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16,"         \
    " \"n_shared_experts\": 1, \"max_position_embeddings\": 64, \"initializer_range\": 0.1"

static const char *small_config =
    "{" SMALL_KEYS ", \"prl_balance_loss_alpha\": 0.001, \"prl_bias_update_rate\": 0.01}";

/* small_config with sliding windows (layers 1, 2), 3 sinks and ModAttn convs (k = 3). */
static const char *blocks_config =
    "{" SMALL_KEYS ", \"swa_layers\": [1, 2], \"sliding_window_list\": [5, 9],"
    " \"param_sink_number\": 3, \"router_sliding_window\": 3}";

/* blocks_config with DSA on layer 0 (2 index heads × 8, top-4): the post-hoc sparsified
** version of a blocks_config model. */
static const char *dsa_config =
    "{" SMALL_KEYS ", \"swa_layers\": [1, 2], \"sliding_window_list\": [5, 9],"
    " \"param_sink_number\": 3, \"router_sliding_window\": 3, \"dsa_layers\": [0],"
    " \"index_topk\": 4, \"index_n_heads\": 2, \"index_head_dim\": 8}";
/* small_config with mHC (4 streams, 20 Sinkhorn iterations, γ), sandwich norms and a block
** post-norm after layer 1. */
static const char *residual_config =
    "{" SMALL_KEYS ", \"use_mhc\": true, \"mhc_num_stream\": 4, \"mhc_recur_norm\": 20,"
    " \"mhc_use_gamma\": true, \"sandwich_norm\": true, \"block_post_layernorm_idx\": [1]}";

static char tmpdir[256];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/prl_test_model_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void build_from(prl_model *m, const char *config, uint64_t seed)
{
    prl_config c;
    ck_assert_int_eq(prl_config_parse(&c, config, "small"), PRL_OK);
    ck_assert_int_eq(prl_model_init(m, &c), PRL_OK);
    prl_model_init_weights(m, seed);
}

static void build(prl_model *m, uint64_t seed) { build_from(m, small_config, seed); }

/* A deterministic toy batch: B sequences of T tokens, every position trained. */
typedef struct toy_batch {
    int32_t tok[4 * 32], tgt[4 * 32], lens[4];
    float w[4 * 32];
    prl_batch b;
} toy_batch;

static void toy(toy_batch *t, int B, int T, uint64_t seed)
{
    prl_rng r;
    prl_rng_init(&r, seed, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < B * T; i++) t->tok[i] = (int32_t)(prl_rng_u64(&r) % 96);
    for (int i = 0; i < B; i++) t->lens[i] = T - (i % 3);
    int n = 0;
    for (int i = 0; i < B * T; i++) {
        int valid = i % T + 1 < t->lens[i / T];
        t->tgt[i] = valid ? t->tok[i + 1] : -1;
        n += valid;
    }
    for (int i = 0; i < B * T; i++) t->w[i] = t->tgt[i] >= 0 ? -1.0f / n : 0;
    t->b = (prl_batch){.B = B,
                       .T = T,
                       .tokens = t->tok,
                       .lens = t->lens,
                       .targets = t->tgt,
                       .weights = t->w,
                       .temperature = 1};
}

/* ------------------------------------------------------------------ config ---------- */

static prl_status parse(const char *text, prl_config *c)
{
    return prl_config_parse(c, text, "cfg");
}

START_TEST(test_config_errors)
{
    prl_config c;
    ck_assert_int_eq(parse("{\"hiden_size\": 32}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'hiden_size'"));
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "did you mean 'hidden_size'"));
    ck_assert_int_eq(parse("{\"hidden_size\": \"big\"}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'hidden_size' must be an integer"));
    ck_assert_int_eq(parse("{\"hidden_size\": -4}", &c), PRL_ERR_CONFIG);
    ck_assert_int_eq(parse("{\"num_experts_per_tok\": 9}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "num_experts_per_tok"));
    ck_assert_int_eq(parse("{\"qk_rope_head_dim\": 5}", &c), PRL_ERR_CONFIG);
    ck_assert_int_eq(parse("{\"vocab_size\": 64,", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "invalid JSON"));
    ck_assert_int_eq(parse("{\"vocab_size\": 64, \"vocab_size\": 65}", &c), PRL_ERR_CONFIG);
    ck_assert_int_eq(parse("[1, 2]", &c), PRL_ERR_CONFIG);
    /* later blocks: recognised, refused unless off */
    ck_assert_int_eq(parse("{\"layer_types\": [\"sliding_attention\"]}", &c), PRL_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "not yet supported"));
    /* DSA: layers, indexer shape, stage; bad values name the key */
    ck_assert_int_eq(parse("{\"dsa_layers\": [0, 3], \"index_topk\": 8, \"index_n_heads\": 2, "
                           "\"index_head_dim\": 16, \"prl_dsa_stage\": \"dense\"}",
                           &c),
                     PRL_OK);
    ck_assert(prl_config_is_dsa(&c, 3) && !prl_config_is_dsa(&c, 1));
    ck_assert_int_eq(c.dsa_stage, PRL_DSA_DENSE);
    ck_assert_int_eq(parse("{\"dsa_layers\": [0]}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "index_topk"));
    ck_assert_int_eq(parse("{\"dsa_layers\": [0], \"index_topk\": 8, \"index_n_heads\": 2, "
                           "\"index_head_dim\": 8}",
                           &c),
                     PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "index_head_dim"));
    ck_assert_int_eq(parse("{\"dsa_layers\": [1], \"index_topk\": 8, \"index_n_heads\": 2, "
                           "\"index_head_dim\": 16, \"swa_layers\": [1], \"sliding_window\": 4}",
                           &c),
                     PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "both"));
    ck_assert_int_eq(parse("{\"dsa_layers\": [6], \"index_topk\": 8, \"index_n_heads\": 2, "
                           "\"index_head_dim\": 16}",
                           &c),
                     PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "not a layer"));
    ck_assert_int_eq(parse("{\"prl_dsa_stage\": \"warm\"}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "prl_dsa_stage"));
    /* mHC, sandwich norms, block post-norms (docs/config.md) */
    ck_assert_int_eq(parse("{\"use_mhc\": true, \"mhc_use_gamma\": true, "
                           "\"sandwich_norm\": true, \"block_post_layernorm_idx\": [0, 4]}",
                           &c),
                     PRL_OK);
    ck_assert_int_eq(prl_config_streams(&c), 4);
    ck_assert_int_eq(c.mhc_recur_norm, 20); /* default, spec §11.1 */
    ck_assert_int_eq(prl_config_block_post_norm(&c, 4), 1);
    ck_assert_int_eq(prl_config_block_post_norm(&c, 1), 0);
    ck_assert_int_eq(parse("{\"use_mhc\": true, \"mhc_num_stream\": 0}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "mhc_num_stream"));
    ck_assert_int_eq(parse("{\"use_mhc\": true, \"mhc_recur_norm\": 0}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "Sinkhorn"));
    ck_assert_int_eq(parse("{\"block_post_layernorm_idx\": [6]}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "not a layer"));
    ck_assert_int_eq(parse("{\"block_post_layernorm_idx\": [2, 2]}", &c), PRL_ERR_CONFIG);
    ck_assert_int_eq(parse("{\"use_mhc\": false}", &c), PRL_OK);
    ck_assert_int_eq(prl_config_streams(&c), 1);
    /* MTP: up to PRL_MAX_LAYERS layers in all; its keys round-trip through config.json */
    ck_assert_int_eq(parse("{\"num_nextn_predict_layers\": 1, \"prl_mtp_loss_weight\": 0.1}", &c),
                     PRL_OK);
    ck_assert_int_eq(c.num_nextn_predict_layers, 1);
    char *js = prl_config_to_json(&c);
    prl_config back;
    ck_assert_int_eq(prl_config_parse(&back, js, "round trip"), PRL_OK);
    free(js);
    ck_assert_int_eq(back.num_nextn_predict_layers, 1);
    ck_assert_double_eq(back.mtp_loss_weight, 0.1);
    ck_assert_int_eq(parse("{\"num_nextn_predict_layers\": 59}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "num_nextn_predict_layers"));
    /* ModAttn convs: on by router_sliding_window (use_mome defaults to it) */
    ck_assert_int_eq(parse("{\"router_sliding_window\": 3}", &c), PRL_OK);
    ck_assert_int_eq(prl_config_conv_kernel(&c), 3);
    ck_assert_int_eq(parse("{\"router_sliding_window\": 3, \"use_mome\": false}", &c), PRL_OK);
    ck_assert_int_eq(prl_config_conv_kernel(&c), 0);
    ck_assert_int_eq(parse("{\"use_mome\": true}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "router_sliding_window"));
    ck_assert_int_eq(parse("{\"router_sliding_window\": 17}", &c), PRL_ERR_CONFIG);
    ck_assert_int_eq(parse("{\"layer_types\": [\"sliding_attention\"]}", &c), PRL_ERR_UNSUPPORTED);
    /* sliding windows and parameter sinks */
    ck_assert_int_eq(parse("{\"swa_layers\": [1, 4], \"sliding_window_list\": [8, 16], "
                           "\"param_sink_number\": 16}",
                           &c),
                     PRL_OK);
    ck_assert_int_eq(prl_config_window(&c, 0), 0);
    ck_assert_int_eq(prl_config_window(&c, 4), 16);
    ck_assert_int_eq(c.param_sink_number, 16);
    ck_assert_int_eq(c.param_sink_with_value, 1); /* default */
    ck_assert_int_eq(parse("{\"swa_layers\": [2], \"sliding_window\": 5}", &c), PRL_OK);
    ck_assert_int_eq(prl_config_window(&c, 2), 5);
    ck_assert_int_eq(parse("{\"swa_layers\": [1]}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "window is 0"));
    ck_assert_int_eq(parse("{\"swa_layers\": [6], \"sliding_window\": 4}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "not a layer"));
    ck_assert_int_eq(parse("{\"swa_layers\": [1, 1], \"sliding_window\": 4}", &c), PRL_ERR_CONFIG);
    ck_assert_int_eq(parse("{\"swa_layers\": [1, 2], \"sliding_window_list\": [4]}", &c),
                     PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "sliding_window_list"));
    ck_assert_int_eq(parse("{\"param_sink_number\": -1}", &c), PRL_ERR_CONFIG);
    ck_assert_int_eq(parse("{\"rope_interleave\": true}", &c), PRL_OK);
    ck_assert_int_eq(c.rope_interleave, 1);
    ck_assert_int_eq(
        parse("{\"dsa_layers\": [], \"use_mhc\": false, \"num_nextn_predict_layers\": 0}", &c),
        PRL_OK);
    ck_assert_int_eq(parse("{\"prl_bias_update_rule\": \"rms\"}", &c), PRL_OK);
    ck_assert_int_eq(c.bias_rule, PRL_BIAS_RMS);
    ck_assert_int_eq(parse("{\"prl_bias_update_rule\": \"sgn\"}", &c), PRL_ERR_CONFIG);
    /* round trip through config.json text */
    ck_assert_int_eq(parse(small_config, &c), PRL_OK);
    char *text = prl_config_to_json(&c);
    prl_config c2;
    ck_assert_int_eq(prl_config_parse(&c2, text, "round trip"), PRL_OK);
    ck_assert_mem_eq(&c, &c2, sizeof c);
    free(text);
    ck_assert_int_eq(parse(residual_config, &c), PRL_OK);
    text = prl_config_to_json(&c);
    ck_assert_int_eq(prl_config_parse(&c2, text, "round trip"), PRL_OK);
    ck_assert_mem_eq(&c, &c2, sizeof c);
    free(text);
    ck_assert_int_eq(parse("{\"swa_layers\": [1, 3], \"sliding_window_list\": [8, 6], "
                           "\"sliding_window\": 7, \"param_sink_number\": 4, "
                           "\"param_sink_with_value\": false, \"router_sliding_window\": 2}",
                           &c),
                     PRL_OK);
    text = prl_config_to_json(&c);
    ck_assert_int_eq(prl_config_parse(&c2, text, "round trip"), PRL_OK);
    ck_assert_mem_eq(&c, &c2, sizeof c);
    free(text);
}
END_TEST

/* ------------------------------------------------------------------ checkpoints ----- */

/* Post-hoc sparsification: a full-attention checkpoint's weights go into the same model with
** a DSA layer added; only the indexer is new. The other way round is an error naming the
** tensor. The DSA config round-trips through config.json. */
START_TEST(test_checkpoint_load_weights_into_dsa)
{
    make_tmpdir();
    char dir[512], dir2[512];
    snprintf(dir, sizeof dir, "%s/full", tmpdir);
    snprintf(dir2, sizeof dir2, "%s/dsa", tmpdir);
    prl_model full, sparse, back;
    build_from(&full, blocks_config, 3);
    for (int i = 0; i < full.n_moe * 4; i++) full.router_bias[i] = 0.02f * (float)i;
    ck_assert_int_eq(prl_checkpoint_save(&full, NULL, NULL, NULL, dir), PRL_OK);
    build_from(&sparse, dsa_config, 4);
    const prl_param_info *ix =
        prl_model_find(&sparse, "model.layers.0.self_attn.indexer.wk.weight");
    ck_assert_ptr_nonnull(ix);
    float keep = sparse.params[ix->offset];
    int fresh = -1;
    ck_assert_int_eq(prl_checkpoint_load_weights(&sparse, dir, &fresh), PRL_OK);
    ck_assert_int_eq(fresh, 4);
    ck_assert_float_eq(sparse.params[ix->offset], keep);
    for (int i = 0; i < full.n_tensors; i++) {
        const prl_param_info *p = &full.tensors[i], *q = prl_model_find(&sparse, p->name);
        ck_assert_ptr_nonnull(q);
        ck_assert_mem_eq(full.params + p->offset, sparse.params + q->offset,
                         p->numel * sizeof(float));
    }
    ck_assert_mem_eq(full.router_bias, sparse.router_bias, (size_t)full.n_moe * 4 * sizeof(float));
    /* a sparse checkpoint does not fit the full model: its indexer is an unexpected tensor */
    ck_assert_int_eq(prl_checkpoint_save(&sparse, NULL, NULL, NULL, dir2), PRL_OK);
    ck_assert_int_eq(prl_checkpoint_load_weights(&full, dir2, NULL), PRL_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "indexer"));
    ck_assert_int_eq(prl_checkpoint_load(&back, dir2), PRL_OK);
    ck_assert_mem_eq(&back.cfg, &sparse.cfg, sizeof back.cfg);
    ck_assert_mem_eq(back.params, sparse.params, sparse.n_params * sizeof(float));
    prl_model_free(&back), prl_model_free(&sparse), prl_model_free(&full);
}
END_TEST

/* One AdamW step (lr 1e-2, weight decay 0.1, no warm-up) on a toy batch, router biases updated
** after it; returns a copy of the weights from before the step (the caller frees it). */
static float *frozen_step(prl_model *m, int with_mtp, prl_forward_stats *st)
{
    float *before = malloc(m->n_params * sizeof *before);
    memcpy(before, m->params, m->n_params * sizeof *before);
    prl_optim o;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.weight_decay = 0.1, oc.warmup_steps = 0, oc.lr = 1e-2;
    ck_assert_int_eq(prl_optim_init(&o, m, &oc), PRL_OK);
    toy_batch t;
    toy(&t, 2, 16, 3);
    t.b.with_mtp = with_mtp;
    ck_assert_int_eq(prl_model_forward(m, &t.b, NULL, st), PRL_OK);
    prl_model_zero_grad(m);
    ck_assert_int_eq(prl_model_backward(m, &t.b), PRL_OK);
    ck_assert_int_eq(prl_optim_step(&o, m, NULL), PRL_OK);
    prl_model_update_router_bias(m);
    prl_optim_free(&o);
    return before;
}

/* The DSA warm-up with the main model frozen: an optimizer step (weight decay on, router
** bias rate on) moves only the indexer tensors; everything else keeps its bits. */
START_TEST(test_dsa_freeze_main_step)
{
    prl_model m;
    build_from(&m, dsa_config, 6);
    m.cfg.dsa_stage = PRL_DSA_DENSE, m.cfg.dsa_freeze_main = 1, m.cfg.bias_update_rate = 0.1;
    prl_forward_stats st;
    float *before = frozen_step(&m, 0, &st);
    ck_assert_double_gt(st.index_loss, 0);
    int moved = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const prl_param_info *p = &m.tensors[i];
        int same = !memcmp(before + p->offset, m.params + p->offset, p->numel * sizeof(float));
        if (p->kind == PRL_PARAM_INDEXER) moved += !same;
        else ck_assert_msg(same, "%s moved while frozen", p->name);
    }
    ck_assert_int_eq(moved, 4);
    for (int i = 0; i < m.n_moe * 4; i++) ck_assert_float_eq(m.router_bias[i], 0);
    free(before);
    prl_model_free(&m);
}
END_TEST

/* Uniform floats in [-1, 1) from a test stream. */
static float *rand_floats(prl_rng *r, size_t n)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(prl_rng_u64(r) >> 11) / 0x1p52 - 1);
    return x;
}

/* The sparse attention kernel against its naive reference, the masked dense kernel, on one
** selection: forward outputs, the probabilities (compact vs dense columns) and every gradient
** bit for bit, with and without sinks. T = 300 crosses a GEMM depth block (PRL_GEMM_KC = 256)
** and several query blocks; the second sequence is shorter. */
START_TEST(test_sparse_attention_equals_masked)
{
    enum { B = 2, T = 300, H = 2, dn = 16, dr = 8, dv = 16, K = 40 };
    int N = B * T, dq = dn + dr, dkv = dn + dv;
    int32_t lens[B] = {T, 270};
    prl_rng r;
    prl_rng_init(&r, 29, 0, 0, 0, PRL_RNG_TEST);
    uint8_t *sel = calloc((size_t)N * T, 1);
    int32_t *idx = malloc((size_t)N * K * sizeof *idx);
    for (int n = 0; n < N; n++) { /* rows t < K see all; later ones K keys, some past 256 */
        int t = n % T;
        for (int c = 0; c <= t && c < K; c++) {
            int s = t < K ? c : (int)(prl_rng_u64(&r) % (uint64_t)(t + 1));
            while (sel[(size_t)n * T + s]) s = (s + 1) % (t + 1);
            sel[(size_t)n * T + s] = 1;
        }
    }
    prl_attn_sel_index(idx, sel, N, T, K);
    float *q = rand_floats(&r, (size_t)N * H * dq), *kv = rand_floats(&r, (size_t)N * H * dkv);
    float *kr = rand_floats(&r, (size_t)N * dr), *skv = rand_floats(&r, (size_t)2 * H * dkv);
    float *skr = rand_floats(&r, 2 * dr), *dout = rand_floats(&r, (size_t)N * H * dv);
    for (int ns = 0; ns <= 2; ns += 2) {
        prl_attn_shape sh =
            {.B = B, .T = T, .H = H, .dn = dn, .dr = dr, .dv = dv, .ns = ns, .sel = sel};
        size_t natt = (size_t)B * H * T * (ns + T), nsc = prl_attention_scratch(sh);
        float *out[2], *att[2], *g[2][5];
        for (int v = 0; v < 2; v++) { /* v = 0: masked reference; 1: sparse */
            sh.sel_idx = v ? idx : NULL, sh.sel_k = K;
            out[v] = calloc((size_t)N * H * dv, sizeof(float));
            att[v] = calloc(natt, sizeof(float));
            prl_attention_forward(out[v], att[v], q, kv, kr, ns ? skv : NULL, ns ? skr : NULL, lens,
                                  sh);
            g[v][0] = calloc((size_t)N * H * dq, sizeof(float));
            g[v][1] = calloc((size_t)N * H * dkv, sizeof(float));
            g[v][2] = calloc((size_t)N * dr, sizeof(float));
            g[v][3] = calloc((size_t)2 * H * dkv, sizeof(float));
            g[v][4] = calloc(2 * dr, sizeof(float));
            float *scratch = malloc(nsc * sizeof *scratch);
            prl_attention_backward(g[v][0], g[v][1], g[v][2], g[v][3], g[v][4], dout, att[v], q, kv,
                                   kr, ns ? skv : NULL, ns ? skr : NULL, scratch, lens, sh);
            free(scratch);
        }
        ck_assert_mem_eq(out[0], out[1], (size_t)N * H * dv * sizeof(float));
        for (int bh = 0; bh < B * H; bh++) /* compact column j is dense column idx[j] */
            for (int t = 0; t < lens[bh / H]; t++) {
                const float *P0 = att[0] + ((size_t)bh * T + t) * (ns + T);
                const float *P1 = att[1] + ((size_t)bh * T + t) * (ns + K);
                const int32_t *row = idx + ((size_t)(bh / H) * T + t) * K;
                ck_assert_mem_eq(P0, P1, (size_t)ns * sizeof(float));
                for (int j = 0; j < prl_attn_sel_count(row, K); j++)
                    ck_assert_msg(!memcmp(&P0[ns + row[j]], &P1[ns + j], sizeof(float)),
                                  "ns %d row %d key %d", ns, t, row[j]);
            }
        size_t len[5] = {(size_t)N * H * dq, (size_t)N * H * dkv, (size_t)N * dr,
                         (size_t)2 * H * dkv, 2 * dr};
        for (int i = 0; i < 5; i++) {
            ck_assert_msg(!memcmp(g[0][i], g[1][i], len[i] * sizeof(float)),
                          "ns %d gradient %d differs", ns, i);
            free(g[0][i]), free(g[1][i]);
        }
        free(out[0]), free(out[1]), free(att[0]), free(att[1]);
    }
    free(sel), free(idx), free(q), free(kv), free(kr), free(skv), free(skr), free(dout);
}
END_TEST

/* The dense attention with each head's keys and values packed once (prl_attention_packed)
** against its per-block reference GEMMs: outputs, probabilities and every gradient bit for
** bit; causal and windowed (the window's last blocks start their keys at 256, a GEMM depth
** block), with and without sinks, full and short sequences. T = 400 crosses a depth block. */
START_TEST(test_attention_packed_equals_reference)
{
    enum { B = 2, T = 400, H = 2, dn = 16, dr = 8, dv = 24 };
    int N = B * T, dq = dn + dr, dkv = dn + dv;
    int32_t lens[B] = {T, 77};
    prl_rng r;
    prl_rng_init(&r, 31, 0, 0, 0, PRL_RNG_TEST);
    float *q = rand_floats(&r, (size_t)N * H * dq), *kv = rand_floats(&r, (size_t)N * H * dkv);
    float *kr = rand_floats(&r, (size_t)N * dr), *skv = rand_floats(&r, (size_t)2 * H * dkv);
    float *skr = rand_floats(&r, 2 * dr), *dout = rand_floats(&r, (size_t)N * H * dv);
    size_t len[5] = {(size_t)N * H * dq, (size_t)N * H * dkv, (size_t)N * dr, (size_t)2 * H * dkv,
                     2 * dr};
    for (int ns = 0; ns <= 2; ns += 2)
        for (int window = 0; window <= 50; window += 50) {
            prl_attn_shape sh =
                {.B = B, .T = T, .H = H, .dn = dn, .dr = dr, .dv = dv, .ns = ns, .window = window};
            size_t natt = (size_t)B * H * T * (ns + T), nsc = prl_attention_scratch(sh);
            float *out[2], *att[2], *g[2][5];
            for (int v = 0; v < 2; v++) { /* v = 0: per-block reference; 1: packed */
                int was = prl_attention_packed_set(v);
                out[v] = calloc((size_t)N * H * dv, sizeof(float));
                att[v] = calloc(natt, sizeof(float));
                prl_attention_forward(out[v], att[v], q, kv, kr, ns ? skv : NULL, ns ? skr : NULL,
                                      lens, sh);
                for (int i = 0; i < 5; i++) g[v][i] = calloc(len[i], sizeof(float));
                float *scratch = malloc(nsc * sizeof *scratch);
                prl_attention_backward(g[v][0], g[v][1], g[v][2], g[v][3], g[v][4], dout, att[v], q,
                                       kv, kr, ns ? skv : NULL, ns ? skr : NULL, scratch, lens, sh);
                free(scratch);
                prl_attention_packed_set(was);
            }
            ck_assert_msg(!memcmp(out[0], out[1], (size_t)N * H * dv * sizeof(float)),
                          "ns %d window %d: outputs differ", ns, window);
            ck_assert_msg(!memcmp(att[0], att[1], natt * sizeof(float)),
                          "ns %d window %d: probabilities differ", ns, window);
            for (int i = 0; i < 5; i++) {
                ck_assert_msg(!memcmp(g[0][i], g[1][i], len[i] * sizeof(float)),
                              "ns %d window %d: gradient %d differs", ns, window, i);
                free(g[0][i]), free(g[1][i]);
            }
            free(out[0]), free(out[1]), free(att[0]), free(att[1]);
        }
    free(q), free(kv), free(kr), free(skv), free(skr), free(dout);
}
END_TEST

/* The whole DSA model (sparse stage, top-4 of 16, packed-free batch with short rows): the
** sparse kernel and the masked reference give the same loss, index loss and gradients. */
START_TEST(test_dsa_sparse_model_equals_masked)
{
    prl_model m[2];
    prl_forward_stats st[2];
    toy_batch t;
    toy(&t, 2, 16, 3);
    for (int v = 0; v < 2; v++) {
        build_from(&m[v], dsa_config, 6);
        m[v].dsa_masked_reference = !v;
        ck_assert_int_eq(prl_model_forward(&m[v], &t.b, NULL, &st[v]), PRL_OK);
        prl_model_zero_grad(&m[v]);
        ck_assert_int_eq(prl_model_backward(&m[v], &t.b), PRL_OK);
    }
    ck_assert_double_gt(st[0].index_loss, 0);
    ck_assert_mem_eq(&st[0].loss, &st[1].loss, sizeof st[0].loss);
    ck_assert_mem_eq(&st[0].index_loss, &st[1].index_loss, sizeof st[0].index_loss);
    ck_assert_mem_eq(m[0].grads, m[1].grads, m[0].n_params * sizeof(float));
    prl_model_free(&m[0]), prl_model_free(&m[1]);
}
END_TEST

/* MTP modules added to a trained model and trained on a frozen trunk (configs/sft-mtp.json):
** the weights load with only the MTP layers' tensors new, and an optimizer step (weight decay
** on, router bias rate on) moves MTP-layer tensors only — the shared embedding and head, every
** trunk tensor and the trunk's router biases keep their bits. */
START_TEST(test_mtp_freeze_trunk_step)
{
    make_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/base", tmpdir);
    prl_model base, m;
    build(&base, 3);
    ck_assert_int_eq(prl_checkpoint_save(&base, NULL, NULL, NULL, dir), PRL_OK);
    build_from(&m,
               "{" SMALL_KEYS ", \"prl_bias_update_rate\": 0.1, "
               "\"num_nextn_predict_layers\": 2, \"prl_mtp_freeze_trunk\": true}",
               4);
    int fresh = -1, per_layer = 0;
    ck_assert_int_eq(prl_checkpoint_load_weights(&m, dir, &fresh), PRL_OK);
    for (int i = 0; i < m.n_tensors; i++) per_layer += m.tensors[i].layer == 3;
    ck_assert_int_eq(fresh, 2 * per_layer);
    prl_forward_stats st;
    float *before = frozen_step(&m, 1, &st);
    int moved = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const prl_param_info *p = &m.tensors[i];
        int same = !memcmp(before + p->offset, m.params + p->offset, p->numel * sizeof(float));
        if (p->layer >= 3) moved += !same;
        else ck_assert_msg(same, "%s moved while frozen", p->name);
    }
    ck_assert_int_gt(moved, per_layer); /* both modules learn */
    for (int i = 0; i < m.n_moe * 4; i++) ck_assert_float_eq(m.router_bias[i], base.router_bias[i]);
    /* the key needs MTP modules to train */
    prl_config c;
    ck_assert_int_eq(parse("{\"prl_mtp_freeze_trunk\": true}", &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "num_nextn_predict_layers"));
    free(before);
    prl_model_free(&m), prl_model_free(&base);
}
END_TEST

START_TEST(test_checkpoint_round_trip)
{
    make_tmpdir();
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    prl_model m, m2;
    build(&m, 5);
    for (int i = 0; i < m.n_moe * 4; i++) m.router_bias[i] = 0.01f * (float)i;
    prl_optim o;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    ck_assert_int_eq(prl_optim_init(&o, &m, &oc), PRL_OK);
    toy_batch t;
    toy(&t, 2, 16, 1);
    ck_assert_int_eq(prl_model_forward(&m, &t.b, NULL, NULL), PRL_OK);
    ck_assert_int_eq(prl_model_backward(&m, &t.b), PRL_OK);
    ck_assert_int_eq(prl_optim_step(&o, &m, NULL), PRL_OK);
    ck_assert_int_eq(prl_checkpoint_save(&m, &o, "{\"note\": 1}", NULL, dir), PRL_OK);
    ck_assert_int_eq(prl_checkpoint_load(&m2, dir), PRL_OK);
    ck_assert_int_eq(m2.n_params, m.n_params);
    ck_assert_mem_eq(m.params, m2.params, m.n_params * sizeof(float));
    ck_assert_mem_eq(m.router_bias, m2.router_bias, (size_t)m.n_moe * 4 * sizeof(float));
    prl_optim o2;
    char *state = NULL;
    ck_assert_int_eq(prl_optim_init(&o2, &m2, &oc), PRL_OK);
    ck_assert_int_eq(prl_checkpoint_load_optim(&o2, &m2, dir, &state), PRL_OK);
    ck_assert_int_eq(o2.step, 1);
    ck_assert_mem_eq(o.m, o2.m, m.n_params * sizeof(float));
    ck_assert_str_eq(state, "{\"note\":1}");
    free(state);
    /* saving again replaces the directory atomically and leaves no temporary behind */
    ck_assert_int_eq(prl_checkpoint_save(&m, NULL, NULL, NULL, dir), PRL_OK);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    ck_assert_int_ne(access(path, F_OK), 0); /* the new checkpoint has no optimizer */
    check_remove_tree(tmpdir);
    prl_optim_free(&o), prl_optim_free(&o2);
    prl_model_free(&m), prl_model_free(&m2);
}
END_TEST

/* Optimizer state that is not finite is refused on load (the file's checksum is right), and a
** flipped byte of the optimizer file is found by prl_checkpoint_verify. */
START_TEST(test_checkpoint_optimizer_checks)
{
    make_tmpdir();
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    prl_model m;
    build(&m, 6);
    prl_optim o, o2;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    ck_assert_int_eq(prl_optim_init(&o, &m, &oc), PRL_OK);
    ck_assert_int_eq(prl_optim_init(&o2, &m, &oc), PRL_OK);
    o.v[3] = (prl_real)NAN;
    ck_assert_int_eq(prl_checkpoint_save(&m, &o, NULL, NULL, dir), PRL_OK);
    ck_assert_int_eq(prl_checkpoint_verify(dir), PRL_OK); /* bytes intact */
    ck_assert_int_eq(prl_checkpoint_load_optim(&o2, &m, dir, NULL), PRL_ERR_NUMERIC);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "has a NaN at element 3"));
    o.v[3] = 0;
    ck_assert_int_eq(prl_checkpoint_save(&m, &o, NULL, NULL, dir), PRL_OK);
    ck_assert_int_eq(prl_checkpoint_load_optim(&o2, &m, dir, NULL), PRL_OK);
    snprintf(file, sizeof file, "%s/optimizer.safetensors", dir);
    FILE *f = fopen(file, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, -10, SEEK_END);
    int c = fgetc(f);
    fseek(f, -10, SEEK_END);
    fputc(c ^ 1, f);
    fclose(f);
    ck_assert_int_eq(prl_checkpoint_verify(dir), PRL_ERR_CHECKSUM);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "optimizer.safetensors"));
    check_remove_tree(tmpdir);
    prl_optim_free(&o), prl_optim_free(&o2);
    prl_model_free(&m);
}
END_TEST

/* Temporaries of saves whose process is gone are removed; a live process's, a link and a
** directory holding another file are left. */
START_TEST(test_checkpoint_clean_stale)
{
    make_tmpdir();
    char dir[512], p[700];
    prl_model m;
    build(&m, 6);
    pid_t dead = fork(); /* a PID that no process has once reaped */
    if (dead == 0) _exit(0);
    ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
    snprintf(dir, sizeof dir, "%s/v000003.tmp.%d", tmpdir, (int)dead);
    ck_assert_int_eq(prl_checkpoint_save(&m, NULL, NULL, NULL, dir), PRL_OK); /* a whole one */
    snprintf(dir, sizeof dir, "%s/v000004.tmp.%d", tmpdir, (int)getpid());    /* alive */
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(dir, sizeof dir, "%s/notes.tmp.%d", tmpdir, (int)dead); /* someone else's */
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    FILE *f = fopen(p, "w");
    fputs("mine", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/link.tmp.%d", tmpdir, (int)dead);
    ck_assert_int_eq(symlink(dir, p), 0);
    int removed = -1;
    ck_assert_int_eq(prl_checkpoint_clean_stale(tmpdir, &removed), PRL_ERR_IO);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "notes.tmp."));
    ck_assert_int_eq(removed, 1);
    snprintf(p, sizeof p, "%s/v000003.tmp.%d", tmpdir, (int)dead);
    ck_assert_int_ne(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/v000004.tmp.%d", tmpdir, (int)getpid());
    ck_assert_int_eq(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    ck_assert_int_eq(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/link.tmp.%d", tmpdir, (int)dead);
    ck_assert_int_eq(access(p, F_OK), 0);
    check_remove_tree(tmpdir);
    prl_model_free(&m);
}
END_TEST

static void corrupt_byte(const char *path, long offset_from_end)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, -offset_from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -offset_from_end, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
}

START_TEST(test_checkpoint_tampering)
{
    make_tmpdir();
    char dir[512], file[600], cmd[1300];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    prl_model m, m2;
    build(&m, 9);
    ck_assert_int_eq(prl_checkpoint_save(&m, NULL, NULL, NULL, dir), PRL_OK);
    ck_assert_int_eq(prl_checkpoint_verify(dir), PRL_OK);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    /* a flipped data byte: checksum mismatch naming the file (verify finds it too) */
    corrupt_byte(file, 10);
    ck_assert_int_eq(prl_checkpoint_load(&m2, dir), PRL_ERR_CHECKSUM);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "model.safetensors"));
    ck_assert_int_eq(prl_checkpoint_verify(dir), PRL_ERR_CHECKSUM);
    /* truncated: a format error */
    ck_assert_int_eq(prl_checkpoint_save(&m, NULL, NULL, NULL, dir), PRL_OK);
    ck_assert_int_eq(truncate(file, 1000), 0);
    ck_assert_int_ne(prl_checkpoint_load(&m2, dir), PRL_OK);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "model.safetensors"));
    ck_assert_int_ne(prl_checkpoint_verify(dir), PRL_OK);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "model.safetensors"));
    /* a config that does not match the weights: the tensor is named */
    ck_assert_int_eq(prl_checkpoint_save(&m, NULL, NULL, NULL, dir), PRL_OK);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"v_head_dim\": 8/\"v_head_dim\": 6/' '%s/config.json'",
             dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_ne(prl_checkpoint_load(&m2, dir), PRL_OK);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "self_attn"));
    /* a save into a path that cannot be created fails and leaves nothing behind */
    snprintf(file, sizeof file, "%s/missing/dir/ckpt", tmpdir);
    ck_assert_int_eq(prl_checkpoint_save(&m, NULL, NULL, NULL, file), PRL_ERR_IO);
    ck_assert_int_ne(access(file, F_OK), 0);
    /* a folder holding anything a save does not write (a user's file, a subfolder) is never
    ** replaced: refused before any work, every file still there, no temporary left */
    snprintf(file, sizeof file, "%s/notes.txt", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fputs("mine\n", f);
    fclose(f);
    ck_assert_int_eq(prl_checkpoint_save(&m, NULL, NULL, NULL, dir), PRL_ERR_IO);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "notes.txt"));
    ck_assert_int_eq(access(file, F_OK), 0);
    snprintf(cmd, sizeof cmd, "%s/config.json", dir);
    ck_assert_int_eq(access(cmd, F_OK), 0);
    ck_assert_int_eq(unlink(file), 0);
    snprintf(file, sizeof file, "%s/sub", dir);
    ck_assert_int_eq(mkdir(file, 0755), 0);
    ck_assert_int_eq(prl_checkpoint_save(&m, NULL, NULL, NULL, dir), PRL_ERR_IO);
    ck_assert_int_eq(access(file, F_OK), 0);
    snprintf(cmd, sizeof cmd, "ls -d '%s'.tmp.* 2>/dev/null | grep -q .", dir);
    ck_assert_int_ne(system(cmd), 0);
    check_remove_tree(tmpdir);
    prl_model_free(&m);
}
END_TEST

/* ------------------------------------------------------------------ determinism ----- */

/* Three optimizer steps on a fixed batch; returns a malloc'd copy of the parameters. */
static float *train_three_steps(int threads, const char *config)
{
    ck_assert_int_eq(prl_blas_init(threads), PRL_OK);
    prl_model m;
    build_from(&m, config, 11);
    prl_optim o;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    ck_assert_int_eq(prl_optim_init(&o, &m, &oc), PRL_OK);
    toy_batch t;
    toy(&t, 4, 32, 2);
    for (int s = 0; s < 3; s++) {
        prl_model_zero_grad(&m);
        ck_assert_int_eq(prl_model_forward(&m, &t.b, NULL, NULL), PRL_OK);
        ck_assert_int_eq(prl_model_backward(&m, &t.b), PRL_OK);
        ck_assert_int_eq(prl_optim_step(&o, &m, NULL), PRL_OK);
        prl_model_update_router_bias(&m);
    }
    float *copy = malloc(m.n_params * sizeof *copy);
    memcpy(copy, m.params, m.n_params * sizeof *copy);
    prl_optim_free(&o);
    prl_model_free(&m);
    return copy;
}

START_TEST(test_determinism_across_threads)
{
    prl_model m;
    build(&m, 11);
    size_t n = m.n_params;
    prl_model_free(&m);
    float *a = train_three_steps(1, small_config), *b = train_three_steps(2, small_config),
          *c = train_three_steps(2, small_config), *d = train_three_steps(3, small_config);
    ck_assert_mem_eq(a, b, n * sizeof *a);
    ck_assert_mem_eq(b, c, n * sizeof *a);
    ck_assert_mem_eq(a, d, n * sizeof *a);
    free(a), free(b), free(c), free(d);
    ck_assert_int_eq(prl_blas_init(0), PRL_OK);
}
END_TEST

/* The row kernels' AVX2 forms (softmax with and without sinks, log-probs, SiLU, norms,
** AdamW) train to the bits of their scalar references: three steps each way, two configs; so
** does the attention with its per-block GEMMs (prl_attention_packed_set(0)). */
START_TEST(test_row_kernels_avx2_equal_reference)
{
    if (!prl_row_kernels_avx2()) return; /* this CPU runs the references only */
    const char *configs[] = {small_config, blocks_config};
    for (int i = 0; i < 2; i++) {
        prl_model m;
        build_from(&m, configs[i], 11);
        size_t n = m.n_params;
        prl_model_free(&m);
        prl_row_kernels_avx2_set(0);
        float *ref = train_three_steps(2, configs[i]);
        prl_row_kernels_avx2_set(1);
        float *fast = train_three_steps(2, configs[i]);
        ck_assert_msg(!memcmp(ref, fast, n * sizeof *ref), "config %d: AVX2 forms differ", i);
        prl_attention_packed_set(0); /* and the attention's per-block GEMMs */
        float *blocks = train_three_steps(2, configs[i]);
        prl_attention_packed_set(1);
        ck_assert_msg(!memcmp(blocks, fast, n * sizeof *ref), "config %d: packed attention differs",
                      i);
        free(ref), free(fast), free(blocks);
    }
    ck_assert_int_eq(prl_blas_init(0), PRL_OK);
}
END_TEST

/* m (built from `config`, freed here) saved and loaded back bit for bit; then trained three
** steps with 1, 2 and 3 threads to the same bits, and every tensor of trained[] moved.
** *loaded receives the loaded model's config. */
static void check_checkpoint_and_threads(prl_model *m, const char *config,
                                         const char *const *trained, int n_trained,
                                         prl_config *loaded)
{
    prl_model m2;
    size_t n = m->n_params;
    make_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt", tmpdir);
    ck_assert_int_eq(prl_checkpoint_save(m, NULL, NULL, NULL, dir), PRL_OK);
    ck_assert_int_eq(prl_checkpoint_load(&m2, dir), PRL_OK);
    ck_assert_int_eq(m2.n_params, n);
    ck_assert_mem_eq(m->params, m2.params, n * sizeof(float));
    *loaded = m2.cfg;
    prl_model_free(&m2);
    float *a = train_three_steps(1, config), *b = train_three_steps(2, config),
          *c = train_three_steps(3, config);
    ck_assert_mem_eq(a, b, n * sizeof *a);
    ck_assert_mem_eq(a, c, n * sizeof *a);
    for (int i = 0; i < n_trained; i++) {
        const prl_param_info *p = prl_model_find(m, trained[i]);
        ck_assert_int_ne(memcmp(a + p->offset, m->params + p->offset, p->numel * sizeof *a), 0);
    }
    free(a), free(b), free(c);
    prl_model_free(m);
    ck_assert_int_eq(prl_blas_init(0), PRL_OK);
}

/* SWA, sinks and ModAttn: Hugging Face names and shapes, a checkpoint round trip (3-D conv
** tensors), trained sinks and kernels, and bitwise training for 1, 2 and 3 threads. */
START_TEST(test_blocks_checkpoint_and_threads)
{
    prl_model m;
    build_from(&m, blocks_config, 11);
    const prl_param_info *p = prl_model_find(&m, "model.layers.1.self_attn.o_conv.weight");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(p->ndim, 3);
    ck_assert(p->shape[0] == 16 && p->shape[1] == 1 && p->shape[2] == 3);
    p = prl_model_find(&m, "model.layers.0.self_attn.param_sink_compressed_kv");
    ck_assert(p && p->shape[0] == 3 && p->shape[1] == 16 && p->kind == PRL_PARAM_SINK);
    ck_assert_ptr_nonnull(prl_model_find(&m, "model.layers.2.self_attn.param_sink_k_pe"));
    ck_assert_ptr_nonnull(prl_model_find(&m, "model.layers.2.self_attn.qa_conv.weight"));
    ck_assert_ptr_nonnull(prl_model_find(&m, "model.layers.2.self_attn.compresskv_conv.weight"));
    const char *trained[] = {"model.layers.1.self_attn.o_conv.weight",
                             "model.layers.1.self_attn.param_sink_k_pe"};
    prl_config loaded; /* the blocks learn (conv kernels move off the identity) */
    check_checkpoint_and_threads(&m, blocks_config, trained, 2, &loaded);
    ck_assert_int_eq(prl_config_window(&loaded, 2), 9);
}
END_TEST

/* mHC, sandwich and block post-norms: Hugging Face names, shapes, kinds and the spec's
** initialisation; a checkpoint round trip; bitwise training for 1, 2 and 3 threads; the
** mHC parameters learn. */
START_TEST(test_residual_blocks_checkpoint_and_threads)
{
    prl_model m;
    build_from(&m, residual_config, 11);
    struct {
        const char *name;
        int64_t rows, cols;
        prl_param_kind kind;
    } want[] = {
        {"model.layers.0.attn_mhc_module.phi.weight", 24, 128, PRL_PARAM_MHC},
        {"model.layers.0.attn_mhc_module.norm_gamma", 128, 0, PRL_PARAM_NORM},
        {"model.layers.0.attn_mhc_module.branch_alpha", 3, 0, PRL_PARAM_MHC},
        {"model.layers.2.mlp_mhc_module.branch_beta", 24, 0, PRL_PARAM_MHC},
        {"model.layers.2.post_attention_layernorm.weight", 32, 0, PRL_PARAM_NORM},
        {"model.layers.2.pre_mlp_layernorm.weight", 32, 0, PRL_PARAM_NORM},
        {"model.layers.2.post_mlp_layernorm.weight", 32, 0, PRL_PARAM_NORM},
        {"model.layers.1.block_post_layernorm.weight", 128, 0, PRL_PARAM_NORM},
        {"model.merge_mhc_module.phi.weight", 4, 128, PRL_PARAM_MHC},
        {"model.merge_mhc_module.norm_gamma", 128, 0, PRL_PARAM_NORM},
        {"model.merge_mhc_module.branch_alpha_pre", 1, 0, PRL_PARAM_MHC},
        {"model.merge_mhc_module.branch_beta_pre", 4, 0, PRL_PARAM_MHC},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const prl_param_info *p = prl_model_find(&m, want[i].name);
        ck_assert_msg(p != NULL, "no tensor %s", want[i].name);
        ck_assert_int_eq(p->shape[0], want[i].rows);
        ck_assert_int_eq(p->shape[1], want[i].cols);
        ck_assert_int_eq(p->kind, want[i].kind);
    }
    ck_assert_ptr_null(prl_model_find(&m, "model.layers.0.block_post_layernorm.weight"));
    /* spec §7.4: α = 0.01, b_pre = logit(1/4), b_post = 0, b_res = 0 / −8 off the diagonal */
    const prl_param_info *a = prl_model_find(&m, "model.layers.1.mlp_mhc_module.branch_alpha");
    const prl_param_info *b = prl_model_find(&m, "model.layers.1.mlp_mhc_module.branch_beta");
    ck_assert_float_eq(m.params[a->offset + 2], 0.01f);
    ck_assert_float_eq_tol(m.params[b->offset + 0], (float)-log(3.0), 1e-6);
    ck_assert_float_eq(m.params[b->offset + 4], 0);
    ck_assert_float_eq(m.params[b->offset + 8 + 5], 0);  /* res[1][1] */
    ck_assert_float_eq(m.params[b->offset + 8 + 6], -8); /* res[1][2] */
    const char *trained[] = {
        "model.layers.0.attn_mhc_module.phi.weight", "model.layers.0.attn_mhc_module.branch_beta",
        "model.merge_mhc_module.branch_alpha_pre", "model.layers.1.block_post_layernorm.weight"};
    prl_config loaded;
    check_checkpoint_and_threads(&m, residual_config, trained, 4, &loaded);
    ck_assert_int_eq(prl_config_streams(&loaded), 4);
}
END_TEST

/* A sequence's log-probs and routes do not depend on its batch: scored alone, or at another
** index of a wider, longer-padded batch, the bits are the same (prl's GEMM is batch-invariant;
** OpenBLAS's sgemm would break this). */
START_TEST(test_batch_invariance)
{
    prl_model m;
    build(&m, 12);
    enum { T1 = 19, B2 = 3, T2 = 40 };
    int32_t tok1[T1], tgt1[T1], len1 = T1, tok2[B2 * T2], tgt2[B2 * T2], len2[B2] = {33, T1, 40};
    prl_rng r;
    prl_rng_init(&r, 4, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < B2 * T2; i++) tok2[i] = (int32_t)(prl_rng_u64(&r) % 96), tgt2[i] = -1;
    for (int t = 0; t < T1; t++) tok1[t] = tok2[T2 + t]; /* the sequence sits at index 1 */
    for (int b = 0; b < B2; b++)
        for (int t = 0; t + 1 < len2[b]; t++) tgt2[b * T2 + t] = tok2[b * T2 + t + 1];
    for (int t = 0; t < T1; t++) tgt1[t] = tgt2[T2 + t];
    float lp1[T1], lp2[B2 * T2];
    prl_batch b1 =
        {.B = 1, .T = T1, .tokens = tok1, .lens = &len1, .targets = tgt1, .temperature = 1};
    prl_batch b2 =
        {.B = B2, .T = T2, .tokens = tok2, .lens = len2, .targets = tgt2, .temperature = 1};
    ck_assert_int_eq(prl_model_forward(&m, &b1, lp1, NULL), PRL_OK);
    int K = m.cfg.num_experts_per_tok;
    int32_t *routes1 = malloc((size_t)m.n_moe * T1 * K * sizeof *routes1);
    memcpy(routes1, prl_model_routes(&m), (size_t)m.n_moe * T1 * K * sizeof *routes1);
    ck_assert_int_eq(prl_model_forward(&m, &b2, lp2, NULL), PRL_OK);
    ck_assert_mem_eq(lp1, lp2 + T2, (T1 - 1) * sizeof *lp1);
    for (int l = 0; l < m.n_moe; l++)
        ck_assert_mem_eq(routes1 + (size_t)l * T1 * K,
                         prl_model_routes(&m) + ((size_t)l * B2 * T2 + T2) * K, (size_t)T1 * K * 4);
    free(routes1);
    prl_model_free(&m);
}
END_TEST

/* ------------------------------------------------------------------ optimizers ------ */

/* An optimizer of `kind` on m with a constant lr, no warmup and no clipping: the update of the
** first steps has a closed form. */
static void closed_form_optim(prl_optim *o, const prl_model *m, prl_optim_kind kind, double lr,
                              double weight_decay)
{
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.kind = kind;
    oc.schedule = PRL_LR_CONSTANT;
    oc.warmup_steps = 0;
    oc.grad_clip = 0;
    oc.lr = lr;
    oc.weight_decay = weight_decay;
    ck_assert_int_eq(prl_optim_init(o, m, &oc), PRL_OK);
}

/* One tensor model stand-in: a model with a single 1-D "norm" parameter is enough to drive
** AdamW by hand, so use the small model and check one element against the formula. */
START_TEST(test_adamw_closed_form)
{
    prl_model m;
    build(&m, 1);
    prl_optim o;
    closed_form_optim(&o, &m, PRL_OPTIM_ADAMW, 0.1, 0.5);
    const prl_param_info *wq = prl_model_find(&m, "model.layers.0.self_attn.q_a_proj.weight");
    const prl_param_info *ln = prl_model_find(&m, "model.layers.0.input_layernorm.weight");
    float w0 = m.params[wq->offset], n0 = m.params[ln->offset];
    /* constant gradient g: m̂ = g, v̂ = g², so each step moves by lr·g/(|g|+eps) */
    for (int s = 0; s < 2; s++) {
        prl_model_zero_grad(&m);
        m.grads[wq->offset] = 0.3f;
        m.grads[ln->offset] = -2.0f;
        ck_assert_int_eq(prl_optim_step(&o, &m, NULL), PRL_OK);
    }
    double w = w0, n = n0;
    for (int s = 0; s < 2; s++) {
        w = w * (1 - 0.1 * 0.5) - 0.1 * 0.3 / (0.3 + 1e-8);
        n = n + 0.1 * 2.0 / (2.0 + 1e-8); /* norm gains: no weight decay */
    }
    ck_assert_double_eq_tol(m.params[wq->offset], w, 1e-6);
    ck_assert_double_eq_tol(m.params[ln->offset], n, 1e-6);
    prl_optim_free(&o);
    prl_model_free(&m);
}
END_TEST

START_TEST(test_muon_newton_schulz)
{
    /* NS5 pushes singular values into roughly [0.5, 1.5]: check XᵀX ≈ I loosely, and that
    ** the result is the same for a matrix and its transpose (iterated on the wide side). */
    enum { A = 12, B = 5 };
    prl_rng r;
    prl_rng_init(&r, 3, 0, 0, 0, PRL_RNG_TEST);
    float X[A * B], Xt[B * A], work[2 * A * B + 2 * A * A];
    for (int i = 0; i < A * B; i++) X[i] = (float)prl_rng_normal(&r);
    for (int i = 0; i < A; i++)
        for (int j = 0; j < B; j++) Xt[j * A + i] = X[i * B + j];
    prl_muon_newton_schulz(X, A, B, 5, work);
    prl_muon_newton_schulz(Xt, B, A, 5, work);
    for (int i = 0; i < A; i++)
        for (int j = 0; j < B; j++) ck_assert_float_eq_tol(X[i * B + j], Xt[j * A + i], 1e-5);
    for (int p = 0; p < B; p++)
        for (int q = 0; q < B; q++) {
            double s = 0;
            for (int i = 0; i < A; i++) s += (double)X[i * B + p] * X[i * B + q];
            if (p == q) ck_assert(s > 0.25 && s < 2.25); /* σ² of σ in [0.5, 1.5] */
            else ck_assert(fabs(s) < 0.5);
        }
    /* scale invariance: NS5(c·X) = NS5(X) */
    float Y[A * B], Z[A * B];
    for (int i = 0; i < A * B; i++) Y[i] = (float)prl_rng_normal(&r), Z[i] = 7.0f * Y[i];
    prl_muon_newton_schulz(Y, A, B, 5, work);
    prl_muon_newton_schulz(Z, A, B, 5, work);
    for (int i = 0; i < A * B; i++) ck_assert_float_eq_tol(Y[i], Z[i], 1e-4);
}
END_TEST

START_TEST(test_muon_step)
{
    /* With zero momentum history the first Muon update is −lr·0.2·sqrt(max(A,B))·NS5(G(1+μ)),
    ** plus decoupled decay; check one matrix against that formula. */
    prl_model m;
    build(&m, 2);
    prl_optim o;
    closed_form_optim(&o, &m, PRL_OPTIM_MUON, 0.02, 0.1);
    const prl_param_info *p = prl_model_find(&m, "model.layers.1.mlp.experts.2.down_proj.weight");
    ck_assert_ptr_nonnull(p);
    int A = (int)p->shape[0], B = (int)p->shape[1];
    prl_rng r;
    prl_rng_init(&r, 4, 0, 0, 0, PRL_RNG_TEST);
    prl_model_zero_grad(&m);
    for (size_t i = 0; i < p->numel; i++) m.grads[p->offset + i] = (float)prl_rng_normal(&r);
    float *U = malloc(p->numel * sizeof *U), *w0 = malloc(p->numel * sizeof *w0);
    float *work = malloc((2 * p->numel + 2 * (size_t)A * A) * sizeof *work);
    for (size_t i = 0; i < p->numel; i++)
        U[i] = m.grads[p->offset + i] * 1.95f, w0[i] = m.params[p->offset + i];
    prl_muon_newton_schulz(U, A, B, 5, work);
    ck_assert_int_eq(prl_optim_step(&o, &m, NULL), PRL_OK);
    double k = 0.02 * 0.2 * sqrt(A > B ? A : B);
    for (size_t i = 0; i < p->numel; i++)
        ck_assert_float_eq_tol(m.params[p->offset + i], w0[i] * (1 - 0.02 * 0.1) - k * U[i], 1e-6);
    free(U), free(w0), free(work);
    prl_optim_free(&o);
    prl_model_free(&m);
}
END_TEST

/* Loss scaling: the trace of rl.md §4.3, overflow events [0,0,0,1,0,0,0,0,1,1], for both
** rules (by hand: torch with growth_interval 3 grows after every third clean step in a row and
** halves on an overflow; megatron with window 3 and hysteresis 2 backs off only on the second
** overflow after a growth). */
START_TEST(test_loss_scaler_traces)
{
    static const int inf[10] = {0, 0, 0, 1, 0, 0, 0, 0, 1, 1};
    static const double torch_scale[10] = {65536, 65536,  131072, 65536, 65536,
                                           65536, 131072, 131072, 65536, 32768};
    const double p32 = 4294967296.0;
    const double mega_scale[10] = {p32,     p32,     2 * p32, 2 * p32, 2 * p32,
                                   2 * p32, 4 * p32, 4 * p32, 4 * p32, 2 * p32};
    prl_loss_scaler_config c;
    prl_loss_scaler s;
    ck_assert_int_eq(prl_loss_scaler_config_preset(&c, "torch"), PRL_OK);
    c.growth_interval = 3;
    ck_assert_int_eq(prl_loss_scaler_init(&s, &c), PRL_OK);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(prl_loss_scaler_update(&s, inf[i]), inf[i]);
        ck_assert_msg(s.scale == torch_scale[i], "torch step %d: scale %g", i, s.scale);
    }
    ck_assert_int_eq(s.skipped, 3);
    ck_assert_int_eq(prl_loss_scaler_config_preset(&c, "megatron"), PRL_OK);
    c.growth_interval = 3;
    ck_assert_int_eq(prl_loss_scaler_init(&s, &c), PRL_OK);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(prl_loss_scaler_update(&s, inf[i]), inf[i]);
        ck_assert_msg(s.scale == mega_scale[i], "megatron step %d: scale %g", i, s.scale);
    }
    /* megatron's floor: repeated overflows stop at min_scale */
    c.init_scale = 4, c.min_scale = 1, c.hysteresis = 1;
    ck_assert_int_eq(prl_loss_scaler_init(&s, &c), PRL_OK);
    for (int i = 0; i < 5; i++) prl_loss_scaler_update(&s, 1);
    ck_assert(s.scale == 1.0);
    /* a growth past the double range keeps the old scale */
    ck_assert_int_eq(prl_loss_scaler_config_preset(&c, "torch"), PRL_OK);
    c.init_scale = 1e308, c.growth_interval = 1;
    ck_assert_int_eq(prl_loss_scaler_init(&s, &c), PRL_OK);
    ck_assert_int_eq(prl_loss_scaler_update(&s, 0), 0);
    ck_assert(s.scale == 1e308);
    /* presets and the checks name what is wrong */
    ck_assert_int_eq(prl_loss_scaler_config_preset(&c, "verl_fsdp"), PRL_OK);
    ck_assert(c.kind == PRL_SCALER_TORCH && c.growth_interval == 400 && c.init_scale == 65536);
    ck_assert_int_eq(prl_loss_scaler_config_preset(&c, "verl_megatron"), PRL_OK);
    ck_assert(c.kind == PRL_SCALER_MEGATRON && c.init_scale == 32768 && c.min_scale == 1);
    ck_assert_int_eq(prl_loss_scaler_config_preset(&c, "apex"), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "'apex'"));
    ck_assert_int_eq(prl_loss_scaler_config_preset(&c, "torch"), PRL_OK);
    c.backoff_factor = 1;
    ck_assert_int_eq(prl_loss_scaler_init(&s, &c), PRL_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "backoff_factor"));
    /* unscale divides; the finiteness check sees inf and NaN */
    prl_real g[4] = {3, -6, 0.75, 0};
    prl_grads_unscale(g, 4, 3.0);
    ck_assert(g[0] == 1 && g[1] == -2 && g[2] == (prl_real)0.25 && g[3] == 0);
    ck_assert(prl_grads_finite(g, 4));
    g[2] = (prl_real)INFINITY;
    ck_assert(!prl_grads_finite(g, 4));
    g[2] = (prl_real)NAN;
    ck_assert(!prl_grads_finite(g, 4));
}
END_TEST

START_TEST(test_lr_schedule_and_clipping)
{
    prl_optim_config c;
    prl_optim_config_default(&c);
    c.lr = 1.0, c.warmup_steps = 4, c.total_steps = 14, c.min_lr_ratio = 0.1;
    c.schedule = PRL_LR_COSINE;
    ck_assert_double_eq_tol(prl_optim_lr_at(&c, 0), 0.25, 1e-12);
    ck_assert_double_eq_tol(prl_optim_lr_at(&c, 3), 1.0, 1e-12);
    ck_assert_double_eq_tol(prl_optim_lr_at(&c, 4), 1.0, 1e-12);
    ck_assert_double_eq_tol(prl_optim_lr_at(&c, 9), 0.55, 1e-12);
    ck_assert_double_eq_tol(prl_optim_lr_at(&c, 14), 0.1, 1e-12);
    ck_assert_double_eq_tol(prl_optim_lr_at(&c, 100), 0.1, 1e-12);
    c.schedule = PRL_LR_CONSTANT;
    ck_assert_double_eq_tol(prl_optim_lr_at(&c, 100), 1.0, 1e-12);
    /* global clipping: the gradient is scaled to the bound; per-expert clipping first */
    prl_model m;
    build(&m, 3);
    prl_optim o;
    prl_optim_config_default(&c);
    c.lr = 0, c.grad_clip = 1.0, c.expert_clip = 0.5;
    ck_assert_int_eq(prl_optim_init(&o, &m, &c), PRL_OK);
    prl_model_zero_grad(&m);
    const prl_param_info *e = prl_model_find(&m, "model.layers.2.mlp.experts.1.up_proj.weight");
    const prl_param_info *q = prl_model_find(&m, "model.layers.0.self_attn.q_a_proj.weight");
    m.grads[e->offset] = 3.0f;
    m.grads[q->offset] = 4.0f;
    prl_optim_stats st;
    ck_assert_int_eq(prl_optim_step(&o, &m, &st), PRL_OK);
    ck_assert_double_eq_tol(st.grad_norm, 5.0, 1e-6);
    ck_assert_int_eq(st.experts_clipped, 1);
    double after = sqrt(0.25 + 16.0); /* expert clipped to 0.5, then global norm */
    ck_assert_double_eq_tol(st.clip_scale, 1.0 / after, 1e-6);
    ck_assert_float_eq_tol(m.grads[e->offset], 0.5 / after, 1e-6);
    ck_assert_float_eq_tol(m.grads[q->offset], 4.0 / after, 1e-6);
    /* a non-finite gradient is refused, nothing updated */
    m.grads[q->offset] = NAN;
    ck_assert_int_eq(prl_optim_step(&o, &m, &st), PRL_ERR_NUMERIC);
    prl_optim_free(&o);
    prl_model_free(&m);
}
END_TEST

/* ------------------------------------------------------------------ MoE hooks ------- */

START_TEST(test_router_bias_rules)
{
    for (int rule = 0; rule < 2; rule++) {
        prl_model m;
        build(&m, 1);
        m.cfg.bias_rule = (prl_bias_rule)rule;
        m.cfg.bias_update_rate = 0.1;
        double counts[4] = {10, 2, 4, 0}; /* mean 4 */
        memcpy(m.expert_counts, counts, sizeof counts);
        prl_model_update_router_bias(&m);
        if (rule == PRL_BIAS_SIGN) {
            ck_assert_float_eq_tol(m.router_bias[0], -0.1f, 1e-7);
            ck_assert_float_eq_tol(m.router_bias[1], 0.1f, 1e-7);
            ck_assert_float_eq_tol(m.router_bias[2], 0.0f, 1e-7);
            ck_assert_float_eq_tol(m.router_bias[3], 0.1f, 1e-7);
        } else {
            /* F − Q = (0.375, −0.125, 0, −0.25); RMS = sqrt(0.21875/4) */
            double rms = sqrt((0.375 * 0.375 + 0.125 * 0.125 + 0.25 * 0.25) / 4 + 1e-12);
            ck_assert_float_eq_tol(m.router_bias[0], -0.1 * 0.375 / rms, 1e-6);
            ck_assert_float_eq_tol(m.router_bias[1], 0.1 * 0.125 / rms, 1e-6);
            ck_assert_float_eq_tol(m.router_bias[3], 0.1 * 0.25 / rms, 1e-6);
        }
        ck_assert_double_eq(m.expert_counts[0], 0); /* counts reset */
        prl_model_free(&m);
    }
}
END_TEST

typedef struct hook_log {
    char names[64][32];
    int n;
} hook_log;

static int record_hook(void *user, const char *name, const prl_real *data, int ndim,
                       const int64_t *shape)
{
    (void)data, (void)ndim, (void)shape;
    hook_log *h = user;
    if (h->n < 64) snprintf(h->names[h->n++], 32, "%s", name);
    return 0;
}

START_TEST(test_routes_override_and_hooks)
{
    prl_model m;
    build(&m, 6);
    toy_batch t;
    toy(&t, 2, 16, 3);
    float lp1[32], lp2[32], lp3[32];
    ck_assert_int_eq(prl_model_logprobs(&m, &t.b, lp1), PRL_OK);
    size_t nr = (size_t)m.n_moe * 32 * 2;
    int32_t *routes = malloc(nr * sizeof *routes);
    memcpy(routes, prl_model_routes(&m), nr * sizeof *routes);
    for (size_t i = 0; i < nr; i++) ck_assert(routes[i] >= 0 && routes[i] < 4);
    /* replaying the captured routes reproduces the log-probs exactly */
    t.b.route_override = routes;
    ck_assert_int_eq(prl_model_logprobs(&m, &t.b, lp2), PRL_OK);
    ck_assert_mem_eq(lp1, lp2, sizeof lp1);
    /* other routes change them; an out-of-range expert is refused */
    for (size_t i = 0; i < nr; i++) routes[i] = (routes[i] + 1) % 4;
    ck_assert_int_eq(prl_model_logprobs(&m, &t.b, lp3), PRL_OK);
    ck_assert(memcmp(lp1, lp3, sizeof lp1) != 0);
    routes[5] = 4;
    ck_assert_int_eq(prl_model_logprobs(&m, &t.b, lp3), PRL_ERR_RANGE);
    t.b.route_override = NULL;
    /* token ids are validated */
    t.tok[7] = 96;
    ck_assert_int_eq(prl_model_logprobs(&m, &t.b, lp3), PRL_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "token id 96"));
    t.tok[7] = 1;
    /* hooks see the named tensors in order; no hook → no calls */
    hook_log h = {0};
    prl_model_set_hook(&m, record_hook, &h);
    ck_assert_int_eq(prl_model_logprobs(&m, &t.b, lp3), PRL_OK);
    ck_assert_str_eq(h.names[0], "L0.attn.q");
    ck_assert_str_eq(h.names[3], "L0.mlp.out");
    ck_assert_str_eq(h.names[4], "L1.attn.q");
    ck_assert_str_eq(h.names[7], "L1.moe.router_logits");
    ck_assert_str_eq(h.names[8], "L1.moe.out");
    ck_assert_str_eq(h.names[h.n - 1], "final.logits");
    free(routes);
    prl_model_free(&m);
}
END_TEST

/* Every task of every job runs exactly once, also when jobs follow each other with no gap
** and growing task counts (a slow worker must never run a task of the next job). */
typedef struct count_ctx {
    int *hits;
} count_ctx;

static void count_task(void *p, int i)
{
    count_ctx *c = p;
    __atomic_fetch_add(&c->hits[i], 1, __ATOMIC_RELAXED);
}

START_TEST(test_pool_runs_each_task_once)
{
    ck_assert_int_eq(prl_pool_init(3), PRL_OK);
    enum { MAX = 64 };
    int hits[MAX];
    count_ctx c = {.hits = hits};
    for (int job = 0; job < 200000; job++) {
        int n = 2 + job % (MAX - 1);
        memset(hits, 0, sizeof hits);
        prl_parallel_for(n, count_task, &c);
        for (int i = 0; i < n; i++)
            if (__atomic_load_n(&hits[i], __ATOMIC_RELAXED) != 1)
                ck_abort_msg("job %d: task %d of %d ran %d times", job, i, n, hits[i]);
    }
    ck_assert_int_eq(prl_pool_init(prl_blas_threads()), PRL_OK);
}
END_TEST

/* The inline exp of the hot loops against libm, over the whole range it is used on. */
START_TEST(test_fast_exp)
{
    double worst = 0;
    for (float x = -87.0f; x < 88.0f; x += 0.001f + fabsf(x) * 1e-4f) {
        double e = exp((double)x), r = fabs(prl_expf(x) - e) / e;
        if (r > worst) worst = r;
    }
    ck_assert_double_lt(worst, 2e-7);
    ck_assert_float_eq(prl_expf(0.0f), 1.0f);
    ck_assert(prl_expf(-1000.0f) > 0 && prl_expf(-1000.0f) < 1e-37f); /* clamped, finite */
    ck_assert(isfinite(prl_expf(1000.0f)));
    /* the 4-lane version is the same arithmetic, bit for bit */
    for (float x = -100.0f; x < 100.0f; x += 0.37f) {
        prl_v4f v = prl_expf4((prl_v4f){x, -x, x * 0.5f, 1000.0f});
        float want[4] = {prl_expf(x), prl_expf(-x), prl_expf(x * 0.5f), prl_expf(1000.0f)};
        for (int j = 0; j < 4; j++) ck_assert_mem_eq(&v[j], &want[j], sizeof(float));
    }
}
END_TEST

static Suite *model_suite(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_sparse_attention_equals_masked);
    tcase_add_test(tc, test_attention_packed_equals_reference);
    tcase_add_test(tc, test_dsa_sparse_model_equals_masked);
    tcase_add_test(tc, test_checkpoint_round_trip);
    tcase_add_test(tc, test_checkpoint_tampering);
    tcase_add_test(tc, test_checkpoint_optimizer_checks);
    tcase_add_test(tc, test_checkpoint_clean_stale);
    tcase_add_test(tc, test_determinism_across_threads);
    tcase_add_test(tc, test_row_kernels_avx2_equal_reference);
    tcase_add_test(tc, test_blocks_checkpoint_and_threads);
    tcase_add_test(tc, test_residual_blocks_checkpoint_and_threads);
    tcase_add_test(tc, test_batch_invariance);
    tcase_add_test(tc, test_adamw_closed_form);
    tcase_add_test(tc, test_muon_newton_schulz);
    tcase_add_test(tc, test_muon_step);
    tcase_add_test(tc, test_lr_schedule_and_clipping);
    tcase_add_test(tc, test_loss_scaler_traces);
    tcase_add_test(tc, test_router_bias_rules);
    tcase_add_test(tc, test_checkpoint_load_weights_into_dsa);
    tcase_add_test(tc, test_dsa_freeze_main_step);
    tcase_add_test(tc, test_mtp_freeze_trunk_step);
    tcase_add_test(tc, test_routes_override_and_hooks);
    tcase_add_test(tc, test_fast_exp);
    tcase_add_test(tc, test_pool_runs_each_task_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (prl_blas_init(0) != PRL_OK) return 1;
    return check_run(model_suite());
}
