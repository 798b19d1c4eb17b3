/*
** test_spec_decode.c — self-speculative decoding with the MTP heads (docs/infer.md):
**   the acceptance rules alone (greedy; modified rejection sampling reproduces p, chi-square);
**   greedy speculative decoding emits exactly plain greedy decoding's tokens and log-probs
**   (several prompts, batch 1 and 5, one and two drafts) on a tiny model with sliding-window
**   rings that wrap, ModAttn convs, sinks, mHC and sandwich norms: every draft that is
**   rejected rolls the caches back, so this is also the rollback test;
**   the same with DSA on trunk layers 0 and 3 (top-4 selection over the indexer key cache,
**   which a rollback must leave consistent); and with every block at once (tiny-pangu.json);
**   speculative sampling matches plain sampling in distribution (chi-square, many sequences,
**   a 4-token vocabulary); both again with the drafts' head cut to a shortlist of ids
**   (spec_draft_vocab: drafts and q never leave it, the verify restores the rest); bad
**   options name the key.
** The tiny model's MTP heads are random, so drafts are accepted by chance only: a vocabulary
** limit of 2 or 4 tokens makes both acceptances and rejections frequent.
*/
#include "engine/spec_decode.h"
#include "tests/model_util.h"
#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

static prl_model model, variants[4];

enum { PLAIN, DSA, PANGU, DEEPSEEK };

/* tiny.json with 2 MTP layers, sliding windows of 8 on trunk layers 1, 2, 4, 5 and MTP layer
** 6, sinks, ModAttn convs, mHC with sandwich and block post-norms; random MTP weights.
** DSA: also DSA (sparse stage, 2 index heads × 16, top-4) on the full-attention trunk layers
** 0 and 3. PANGU: configs/models/tiny-pangu.json as written (every block, one MTP layer)
** but W = 8 and top-4, so that rings wrap and the selection is a strict subset within these
** ≤ 70-token sequences. The tests use `model`, which load_model points at the variant asked
** for. */
static void load_pangu_config(prl_config *c)
{
    ck_assert_int_eq(prl_config_load(c, PRL_SOURCE_DIR "/configs/models/tiny-pangu.json"), PRL_OK);
    c->max_position_embeddings = 96;
    c->sliding_window = 8, c->index_topk = 4;
    for (int i = 0; i < c->n_sliding_window_list; i++) c->sliding_window_list[i] = 8;
}

static void load_tiny_config(prl_config *c, int dsa)
{
    ck_assert_int_eq(prl_config_load(c, PRL_SOURCE_DIR "/configs/models/tiny.json"), PRL_OK);
    c->max_position_embeddings = 96;
    int layers[] = {1, 2, 4, 5, 6};
    c->n_swa_layers = 5, c->sliding_window = 8;
    memcpy(c->swa_layers, layers, sizeof layers);
    c->param_sink_number = 4, c->param_sink_with_value = 1;
    c->use_mome = 1, c->router_sliding_window = 3;
    c->use_mhc = 1, c->mhc_num_stream = 4, c->mhc_recur_norm = 20, c->mhc_use_gamma = 1;
    c->sandwich_norm = 1, c->n_block_post_layernorm_idx = 1, c->block_post_layernorm_idx[0] = 0;
    c->num_nextn_predict_layers = 2;
    if (dsa) {
        c->n_dsa_layers = 2, c->dsa_layers[0] = 0, c->dsa_layers[1] = 3;
        c->index_topk = 4, c->index_n_heads = 2, c->index_head_dim = 16;
        c->dsa_stage = PRL_DSA_SPARSE;
    }
}

/* DEEPSEEK: tiny.json with DeepSeek-V3's maths — interleaved YaRN RoPE, 4 groups of 2 experts
** (top 2), moe_layer_freq 2 — and one MTP layer (layer 6: MoE) with its own router bias. */
static void load_deepseek_config(prl_config *c)
{
    ck_assert_int_eq(prl_config_load(c, PRL_SOURCE_DIR "/configs/models/tiny.json"), PRL_OK);
    c->max_position_embeddings = 96;
    snprintf(c->model_type, sizeof c->model_type, "deepseek_v3");
    c->rope_interleave = 1, c->moe_layer_freq = 2, c->n_group = 4, c->topk_group = 2;
    c->rope_scaling = (prl_rope_scaling){.yarn = 1,
                                         .factor = 4,
                                         .mscale = 1,
                                         .mscale_all_dim = 1,
                                         .original_max_position_embeddings = 16};
    c->num_nextn_predict_layers = 1;
}

static void load_model_variant(int variant)
{
    prl_model *target = &variants[variant];
    if (target->params) {
        model = *target;
        return;
    }
    prl_config c;
    if (variant == PANGU) load_pangu_config(&c);
    else if (variant == DEEPSEEK) load_deepseek_config(&c);
    else load_tiny_config(&c, variant == DSA);
    ck_assert_int_eq(prl_model_init(&model, &c), PRL_OK);
    prl_model_init_weights(&model, 7);
    test_model_sharpen(&model, 0);
    for (int i = 0; variant == DEEPSEEK && i < model.n_moe_all * c.n_routed_experts; i++)
        model.router_bias[i] = (float)(0.02 * ((i * 5) % 7 - 3)); /* the MTP layer's too */
    *target = model;
}

static void load_model(void) { load_model_variant(PLAIN); }

/* draft_vocab: spec_draft_vocab, the drafts' shortlist (0 = the whole vocabulary). */
static prl_infer *engine_vocab(int max_batch, int drafts, int draft_vocab)
{
    prl_infer_options o;
    prl_infer_options_default(&o);
    o.max_batch = max_batch, o.spec_drafts = drafts, o.spec_draft_vocab = draft_vocab;
    prl_infer *e = NULL;
    ck_assert_msg(prl_infer_init(&e, &model, &o) == PRL_OK, "%s", prl_error_message());
    return e;
}

static prl_infer *engine(int max_batch, int drafts) { return engine_vocab(max_batch, drafts, 0); }

enum { NP = 6, PLEN = 20 };

typedef struct reqs {
    int32_t prompts[NP][PLEN];
    prl_gen_request r[NP];
} reqs;

static void make_requests(reqs *q)
{
    for (int i = 0; i < NP; i++) {
        int len = 2 + (i * 7) % (PLEN - 2);
        for (int t = 0; t < len; t++) q->prompts[i][t] = (int32_t)(16 + (i * 131 + t * 977) % 4000);
        q->r[i] = (prl_gen_request){.prompt = q->prompts[i], .prompt_len = len, .seq_id = 10 + i};
    }
}

static void run(prl_infer *e, const prl_gen_request *r, int n, const prl_sample_params *sp,
                prl_gen_result *res)
{
    ck_assert_msg(prl_infer_generate(e, r, n, sp, res, NULL, NULL) == PRL_OK, "%s",
                  prl_error_message());
}

/* ------------------------------------------------------------------ acceptance rules - */

START_TEST(test_greedy_rule)
{
    int32_t out[4], draft[3] = {5, 6, 7};
    int32_t all[4] = {5, 6, 7, 9}, second[4] = {5, 1, 7, 9};
    ck_assert_int_eq(prl_spec_accept_greedy(out, draft, all, 3), 4);
    ck_assert_int_eq(out[3], 9); /* the bonus token */
    ck_assert_int_eq(prl_spec_accept_greedy(out, draft, second, 3), 2);
    ck_assert_int_eq(out[0], 5);
    ck_assert_int_eq(out[1], 1); /* the correction */
    ck_assert_int_eq(prl_spec_accept_greedy(out, draft, second, 0), 1);
    ck_assert_int_eq(out[0], 5);
}
END_TEST

/* Chi-square statistic of counts against expected probabilities (cells with p > 0). */
static double chi2(const long *count, const double *p, int n, long total)
{
    double x = 0;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) x += (count[i] - total * p[i]) * (count[i] - total * p[i]) / (total * p[i]);
    return x;
}

/* Drafts d_k ~ q_k, then the rule: the first token emitted is distributed as p_1, and the
** second (when d_1 was accepted) as p_2 — whatever q is. */
START_TEST(test_rejection_sampling_reproduces_p)
{
    enum { V = 4, N = 200000 };
    const double q[2 * V] = {0.7, 0.1, 0.1, 0.1, 0.25, 0.25, 0.25, 0.25};
    const double p[3 * V] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.0, 0.2, 0.3, 0.25, 0.25, 0.25, 0.25};
    long first[V] = {0}, second[V] = {0}, n_second = 0;
    for (long i = 0; i < N; i++) {
        prl_rng rng[3], dr;
        for (int k = 0; k < 3; k++)
            prl_rng_init(&rng[k], 1, (uint64_t)i, (uint64_t)k, 0, PRL_RNG_ACCEPT);
        prl_rng_init(&dr, 1, (uint64_t)i, 0, 0, PRL_RNG_DRAFT);
        int32_t draft[2] = {prl_spec_draw(q, V, &dr), prl_spec_draw(q + V, V, &dr)}, out[3];
        int n = prl_spec_accept_sample(out, draft, q, p, V, 2, rng);
        first[out[0]]++;
        if (n >= 2) second[out[1]]++, n_second++;
    }
    double x1 = chi2(first, p, V, N), x2 = chi2(second, p + V, V, n_second);
    fprintf(stderr, "rejection sampling: chi2 first %.2f, second %.2f (3 dof; 16.3 is p = 0.001)\n",
            x1, x2);
    ck_assert_double_lt(x1, 16.3);
    ck_assert_double_lt(x2, 16.3);
    ck_assert_int_eq(second[1], 0); /* p_2(1) = 0 is never emitted */
}
END_TEST

/* ------------------------------------------------------------------ engine ----------- */

/* Greedy speculative decoding = plain greedy decoding, on `model` as loaded: token for token
** and log-prob for log-prob, for 1 and 2 drafts (as many as the model has MTP layers) at
** batch 1 and 5; draft_vocab > 0: the drafts' head covers ids [0, draft_vocab) (with the
** vocabulary limit of 2, a shortlist of 1 drafts token 0 always). */
static void greedy_equals_plain(int draft_vocab)
{
    reqs q;
    make_requests(&q);
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    sp.max_new_tokens = 50, sp.n_stop_ids = 0;
    for (int pass = 0; pass < 2; pass++) {
        sp.vocab_limit = pass == 0 ? 2 : 0; /* coin-flip drafts; then the whole vocabulary */
        prl_gen_result plain[NP], spec[NP];
        prl_infer *e0 = engine(5, 0);
        run(e0, q.r, NP, &sp, plain);
        prl_infer_free(e0);
        for (int drafts = 1; drafts <= 2 && drafts <= model.cfg.num_nextn_predict_layers; drafts++)
            for (int batch = 1; batch <= 5; batch += 4) {
                int dv = draft_vocab && pass == 0 ? 1 : draft_vocab;
                prl_infer *e = engine_vocab(batch, drafts, dv);
                run(e, q.r, NP, &sp, spec);
                prl_spec_stats st = prl_infer_spec_stats(e);
                fprintf(stderr,
                        "greedy vocab %d, draft vocab %d, %d drafts, batch %d: %ld of %ld "
                        "drafts accepted, %ld sequence steps for %ld tokens\n",
                        sp.vocab_limit, dv, drafts, batch, st.accepted, st.drafted, st.steps,
                        st.emitted);
                if (pass == 0) ck_assert(st.accepted > 0 && st.accepted < st.drafted);
                for (int i = 0; i < NP; i++) {
                    ck_assert_int_eq(spec[i].n, plain[i].n);
                    ck_assert_int_eq(spec[i].stop, plain[i].stop);
                    for (int t = 0; t < plain[i].n; t++) {
                        ck_assert_msg(spec[i].tokens[t] == plain[i].tokens[t],
                                      "request %d token %d: spec %d plain %d (%d drafts, batch %d)",
                                      i, t, spec[i].tokens[t], plain[i].tokens[t], drafts, batch);
                        ck_assert_float_eq(spec[i].logprobs[t], plain[i].logprobs[t]);
                    }
                    ck_assert_int_eq(spec[i].n_route_tokens, plain[i].n_route_tokens);
                    ck_assert_mem_eq(spec[i].routes, plain[i].routes, plain[i].routes_bytes);
                    prl_gen_result_free(&spec[i]);
                }
                prl_infer_free(e);
            }
        for (int i = 0; i < NP; i++) prl_gen_result_free(&plain[i]);
    }
}

START_TEST(test_greedy_equals_plain)
{
    load_model_variant(PLAIN);
    greedy_equals_plain(0);
}
END_TEST

/* The drafts' head cut to a shortlist (ids [0, 1) under the vocabulary limit of 2, then
** [0, 100) of 4096): plain greedy's tokens exactly, though most plain tokens lie outside it. */
START_TEST(test_greedy_equals_plain_draft_vocab)
{
    load_model_variant(PLAIN);
    greedy_equals_plain(100);
}
END_TEST

/* With DSA layers: the verify pass writes the drafts' indexer keys and selects over them; a
** rejection rolls the key cache back by the slot's length like the KV caches. */
START_TEST(test_greedy_equals_plain_dsa)
{
    load_model_variant(DSA);
    greedy_equals_plain(0);
}
END_TEST

/* Every block at once (tiny-pangu.json: MTP, DSA, SWA, mHC, convs, sinks, sandwich and block
** post-norms), one draft: the verify pass and its rollback keep every cache (rings, indexer
** keys, conv history, mHC streams' inputs) as plain decoding has them. */
START_TEST(test_greedy_equals_plain_all_blocks)
{
    load_model_variant(PANGU);
    ck_assert(model.cfg.n_dsa_layers == 2 && model.cfg.n_swa_layers == 4 && model.cfg.use_mhc &&
              model.cfg.use_mome && model.cfg.param_sink_number > 0 &&
              model.cfg.num_nextn_predict_layers == 1);
    greedy_equals_plain(0);
}
END_TEST

/* DeepSeek-V3's maths with an MoE MTP layer: the drafts route with the MTP layer's bias and
** the verify pass keeps the caches (rope keys rotated interleaved, YaRN) as plain decoding. */
START_TEST(test_greedy_equals_plain_deepseek)
{
    load_model_variant(DEEPSEEK);
    ck_assert_int_eq(model.n_moe_all, model.n_moe + 1);
    greedy_equals_plain(0);
}
END_TEST

/* The joint distribution of generated tokens 2 and 3 (16 cells over a 4-token vocabulary)
** under speculative sampling equals plain sampling's: two-sample chi-square over 480
** sequences each (one prompt, different sequence ids); mode 2 cuts the drafts' head to ids
** {0, 1}, so q is 0 on tokens 2 and 3 and only the residual max(0, p − q) can emit them. */
START_TEST(test_sampling_matches_plain_in_distribution)
{
    enum { N = 480, CELLS = 16 };
    load_model();
    static int32_t prompt[5] = {17, 300, 2000, 45, 999};
    static prl_gen_request r[N];
    for (int i = 0; i < N; i++)
        r[i] = (prl_gen_request){.prompt = prompt, .prompt_len = 5, .seq_id = 1000 + (uint64_t)i};
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    sp.seed = 5, sp.max_new_tokens = 3, sp.n_stop_ids = 0, sp.vocab_limit = 4;
    sp.temperature = 12; /* the sharpened heads (×40) at τ 12: p and q overlap, not too much */
    long count[3][CELLS] = {{0}};
    static prl_gen_result res[N];
    prl_spec_stats stats[3] = {{0}};
    for (int mode = 0; mode < 3; mode++) {
        prl_infer *e = engine_vocab(16, mode ? 2 : 0, mode == 2 ? 2 : 0);
        run(e, r, N, &sp, res);
        stats[mode] = prl_infer_spec_stats(e);
        for (int i = 0; i < N; i++) {
            ck_assert_int_eq(res[i].n, 3);
            count[mode][res[i].tokens[1] * 4 + res[i].tokens[2]]++;
            prl_gen_result_free(&res[i]);
        }
        prl_infer_free(e);
    }
    for (int mode = 1; mode < 3; mode++) {
        double x = 0;
        int dof = -1;
        for (int c = 0; c < CELLS; c++) {
            long a = count[0][c], b = count[mode][c];
            if (a + b == 0) continue;
            x += (double)(a - b) * (a - b) / (double)(a + b);
            dof++;
        }
        prl_spec_stats st = stats[mode];
        fprintf(stderr,
                "sampling%s: %ld of %ld drafts accepted; two-sample chi2 %.2f with %d dof\n",
                mode == 2 ? " (draft vocab 2)" : "", st.accepted, st.drafted, x, dof);
        /* p = 0.001 critical values for 1..15 dof */
        static const double crit[16] = {0,     10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32,
                                        26.12, 27.88, 29.59, 31.26, 32.91, 34.53, 36.12, 37.70};
        ck_assert_int_gt(dof, 0);
        ck_assert_double_lt(x, crit[dof]);
        ck_assert(st.accepted > 0 && st.accepted < st.drafted); /* both branches ran */
    }
}
END_TEST

START_TEST(test_bad_options)
{
    load_model();
    prl_infer_options o;
    prl_infer_options_default(&o);
    o.spec_drafts = 3; /* the model has 2 MTP layers */
    prl_infer *e = NULL;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "num_nextn_predict_layers"));
    o.spec_drafts = -1;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    o.spec_drafts = 1, o.spec_draft_vocab = model.cfg.vocab_size + 1;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(prl_error_message(), "draft vocabulary"));
}
END_TEST

int main(void)
{
    if (prl_blas_init(2) != PRL_OK) return 1;
    Suite *s = suite_create("spec_decode");
    TCase *rules = tcase_create("rules");
    tcase_add_test(rules, test_greedy_rule);
    tcase_add_test(rules, test_rejection_sampling_reproduces_p);
    suite_add_tcase(s, rules);
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_bad_options);
    tcase_add_test(tc, test_greedy_equals_plain);
    tcase_add_test(tc, test_greedy_equals_plain_dsa);
    tcase_add_test(tc, test_greedy_equals_plain_draft_vocab);
    tcase_add_test(tc, test_greedy_equals_plain_all_blocks);
    tcase_add_test(tc, test_greedy_equals_plain_deepseek);
    tcase_add_test(tc, test_sampling_matches_plain_in_distribution);
    suite_add_tcase(s, tc);
    int failed = check_run_mode(s, CK_NOFORK); /* the tests share one loaded model */
    prl_model_free(&model);
    return failed;
}
