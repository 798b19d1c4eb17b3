/*
** test_infer.c — the infer path against the train path on the tiny config:
**   aligned mode equals the train path bitwise (batch 1 and 16, 1 and 2 threads);
**   fp32 mode within 1e-4 in log-prob; bf16/fp16 mismatch measured and printed;
**   greedy tokens identical across batch sizes and thread counts; seeded sampling identical
**   for a sequence whatever its batch; routes, stops, KV-cache size and bad input; every
**   block at once (tiny-pangu.json) aligned bitwise too.
** The train path is itself batch-invariant (prl's GEMM), so the train-path side scores every
** sequence in one padded batch.
*/
#include "engine/infer_int.h"
#include "engine/ops.h"
#include "tests/check_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

static prl_model model;

/* The tiny model; with blocks != 0 it also has sliding-window layers 1, 2, 4, 5 (W = 16, so
** the rings wrap in every generation) and 4 parameter sinks per layer; blocks == 1: sinks
** with values and ModAttn convs (k = 3, random kernels); blocks == 2: value-less sinks;
** blocks == 3: blocks 1 plus mHC (4 streams, 20 Sinkhorn iterations, γ; random α and β so
** the stream mixing is far from the identity), sandwich norms and block post-norms after
** layers 0 and 3 (value-less sinks);
** blocks == 4 (sparse) / 5 (dense warm-up stage): blocks 1 plus DSA on layers 0 and 3 (2
** index heads × 32, top-8, so most rows of a 20–64-token sequence attend to a strict subset);
** blocks == 6: blocks 4 plus the mHC, sandwich and block post-norms of blocks 3;
** blocks == 7: configs/models/tiny-pangu.json, every block at once (spec §12.1: DSA on layers
** 0 and 3, SWA on 1, 2, 4, 5, 16 sinks with values, ModAttn k = 3, mHC 4 streams × 20 with γ,
** sandwich norms, block post-norm after layer 0, one MTP layer), with W = 16 and top-8 instead
** of 64 and 64 so that, in these 20–64-token sequences, the rings wrap and the selection is a
** strict subset; random norm gains as in blocks 3;
** blocks == 8: tiny.json with DeepSeek-V3's maths (model_type deepseek_v3): interleaved RoPE
** with YaRN (factor 4 over an original context of 32, so the 20–64-token sequences pass it;
** mscale_all_dim 0.7 on the softmax scale), MoE on layers 2 and 4 only (moe_layer_freq 2) and
** group-limited routing (4 groups of 2 experts, the best 2 kept);
** blocks == 9: tiny.json as Moonlight's attention: no query latent (q_lora_rank 0, a direct
** q_proj), interleaved RoPE without YaRN, every layer after the first MoE. */
static int model_blocks;

static const char *model_file(int blocks)
{
    return blocks == 7 ? PRL_SOURCE_DIR "/configs/models/tiny-pangu.json"
                       : PRL_SOURCE_DIR "/configs/models/tiny.json";
}

static void load_model(int blocks)
{
    if (model.params && model_blocks == blocks) return;
    prl_model_free(&model);
    model_blocks = blocks;
    prl_config c;
    ck_assert_int_eq(prl_config_load(&c, model_file(blocks)), PRL_OK);
    c.max_position_embeddings = 160; /* keeps the test quick */
    if (blocks == 9) {
        snprintf(c.model_type, sizeof c.model_type, "deepseek_v3");
        c.q_lora_rank = 0, c.rope_interleave = 1;
    } else if (blocks == 8) {
        snprintf(c.model_type, sizeof c.model_type, "deepseek_v3");
        c.rope_interleave = 1, c.moe_layer_freq = 2, c.n_group = 4, c.topk_group = 2;
        c.rope_scaling = (prl_rope_scaling){.yarn = 1,
                                            .factor = 4,
                                            .mscale = 1,
                                            .mscale_all_dim = 0.7,
                                            .original_max_position_embeddings = 32};
    } else if (blocks == 7) {
        c.sliding_window = 16, c.index_topk = 8;
        for (int i = 0; i < c.n_sliding_window_list; i++) c.sliding_window_list[i] = 16;
    } else if (blocks) {
        int layers[] = {1, 2, 4, 5};
        c.n_swa_layers = 4, c.sliding_window = 16;
        memcpy(c.swa_layers, layers, sizeof layers);
        c.param_sink_number = 4, c.param_sink_with_value = blocks == 1 || blocks >= 4;
        c.use_mome = blocks != 2, c.router_sliding_window = blocks != 2 ? 3 : 0;
    }
    if (blocks == 3 || blocks == 6) {
        c.use_mhc = 1, c.mhc_num_stream = 4, c.mhc_recur_norm = 20, c.mhc_use_gamma = 1;
        c.sandwich_norm = 1;
        c.n_block_post_layernorm_idx = 2, c.block_post_layernorm_idx[0] = 0;
        c.block_post_layernorm_idx[1] = 3;
    }
    if (blocks >= 4 && blocks <= 7) { /* 8, 9: the DeepSeek models */
        c.n_dsa_layers = 2, c.dsa_layers[0] = 0, c.dsa_layers[1] = 3;
        c.index_topk = 8, c.index_n_heads = 2, c.index_head_dim = 32;
        c.dsa_stage = blocks == 5 ? PRL_DSA_DENSE : PRL_DSA_SPARSE;
    }
    ck_assert_int_eq(prl_model_init(&model, &c), PRL_OK);
    prl_model_init_weights(&model, 7);
    /* sharper distributions than the 0.02 init, so greedy has clear winners and the
    ** sampled sequences are not uniform noise */
    const prl_param_info *head = prl_model_find(&model, "lm_head.weight");
    for (size_t i = 0; i < head->numel; i++) model.params[head->offset + i] *= 40;
    for (int i = 0; i < model.n_moe * c.n_routed_experts; i++) /* a non-trivial bias */
        model.router_bias[i] = (float)(0.01 * ((i * 7) % 5 - 2));
    prl_rng rng;
    prl_rng_init(&rng, 3, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < model.n_tensors; i++) {
        const prl_param_info *p = &model.tensors[i];
        for (size_t j = 0; j < p->numel && p->kind == PRL_PARAM_SINK; j++)
            model.params[p->offset + j] *= 50; /* sinks that take a real share of attention */
        for (size_t j = 0; j < p->numel && p->kind == PRL_PARAM_CONV; j++)
            model.params[p->offset + j] =
                (float)(0.3 * prl_rng_normal(&rng)); /* not the identity */
        for (size_t j = 0; j < p->numel && p->kind == PRL_PARAM_INDEXER && p->ndim == 2; j++)
            model.params[p->offset + j] *= 30; /* index scores with a real spread */
        for (size_t j = 0; j < p->numel && p->kind == PRL_PARAM_MHC && p->ndim == 1; j++)
            model.params[p->offset + j] += (float)(0.5 * prl_rng_normal(&rng)); /* α, β */
        for (size_t j = 0; j < p->numel && (blocks == 3 || blocks == 6 || blocks == 7) &&
                           p->kind == PRL_PARAM_NORM;
             j++)
            model.params[p->offset + j] = (float)(1 + 0.2 * prl_rng_normal(&rng)); /* each norm
                                                                   ** its own gains */
    }
}

static void load_tiny(void) { load_model(0); }

enum { NREQ = 16, PLEN_MAX = 24 };

typedef struct reqs {
    int32_t prompts[NREQ][PLEN_MAX];
    prl_gen_request r[NREQ];
} reqs;

static void make_requests(reqs *q, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        prl_rng rng;
        prl_rng_init(&rng, seed, (uint64_t)i, 0, 0, PRL_RNG_TEST);
        int len = 3 + (int)(prl_rng_u64(&rng) % (PLEN_MAX - 3));
        for (int t = 0; t < len; t++) q->prompts[i][t] = 16 + (int32_t)(prl_rng_u64(&rng) % 4000);
        q->r[i] = (prl_gen_request){.prompt = q->prompts[i], .prompt_len = len, .seq_id = 100 + i};
    }
}

/* A preset name, optionally with "+gemv" / "+naive" knob overrides. */
static prl_infer *engine(const char *preset, int max_batch)
{
    prl_infer_options o;
    char name[32];
    snprintf(name, sizeof name, "%s", preset);
    char *plus = strchr(name, '+');
    if (plus) *plus = 0;
    ck_assert_int_eq(prl_infer_options_preset(&o, name), PRL_OK);
    if (plus && !strcmp(plus + 1, "gemv")) o.matmul = PRL_MATMUL_GEMV;
    if (plus && !strcmp(plus + 1, "naive")) o.mla = PRL_MLA_NAIVE;
    o.max_batch = max_batch;
    prl_infer *e = NULL;
    ck_assert_msg(prl_infer_init(&e, &model, &o) == PRL_OK, "%s", prl_error_message());
    return e;
}

static void generate(prl_infer *e, reqs *q, int n, const prl_sample_params *sp, prl_gen_result *res)
{
    prl_status rc = prl_infer_generate(e, q->r, n, sp, res, NULL, NULL);
    ck_assert_msg(rc == PRL_OK, "%s", prl_error_message());
}

/* The train path's log-probs of every prompt and generated token, all sequences in one
** padded batch; also its routes ([n_moe][B·T][K]) and T. */
typedef struct train_scores {
    float *logp;
    int32_t *routes;
    int B, T;
} train_scores;

static void train_score(train_scores *ts, reqs *q, prl_gen_result *res, int n, double tau)
{
    int T = 0;
    for (int i = 0; i < n; i++)
        if (q->r[i].prompt_len + res[i].n > T) T = q->r[i].prompt_len + res[i].n;
    int32_t *tok = calloc((size_t)n * T, sizeof *tok), *tgt = malloc((size_t)n * T * sizeof *tgt);
    int32_t *lens = malloc((size_t)n * sizeof *lens);
    for (int i = 0; i < n * T; i++) tgt[i] = -1;
    for (int i = 0; i < n; i++) {
        int P = q->r[i].prompt_len;
        lens[i] = P + res[i].n;
        memcpy(tok + (size_t)i * T, q->r[i].prompt, (size_t)P * sizeof *tok);
        memcpy(tok + (size_t)i * T + P, res[i].tokens, (size_t)res[i].n * sizeof *tok);
        for (int t = 0; t + 1 < lens[i]; t++) tgt[(size_t)i * T + t] = tok[(size_t)i * T + t + 1];
    }
    prl_batch b = {.B = n, .T = T, .tokens = tok, .lens = lens, .targets = tgt, .temperature = tau};
    ts->logp = malloc((size_t)n * T * sizeof *ts->logp);
    ck_assert_int_eq(prl_model_logprobs(&model, &b, ts->logp), PRL_OK);
    size_t nr = (size_t)model.n_moe * n * T * model.cfg.num_experts_per_tok;
    ts->routes = malloc(nr * sizeof *ts->routes);
    memcpy(ts->routes, prl_model_routes(&model), nr * sizeof *ts->routes);
    ts->B = n, ts->T = T;
    free(tok), free(tgt), free(lens);
}

/* Infer log-prob of token t (>= 1) of sequence i: the prompt's or the generated one's. */
static float infer_logp(const prl_gen_result *r, int t)
{
    return t < r->prompt_len ? r->prompt_logprobs[t] : r->logprobs[t - r->prompt_len];
}

typedef struct mismatch {
    double mean, max, route_diff_share;
    long n, bitwise_diff;
} mismatch;

static mismatch compare(const train_scores *ts, reqs *q, prl_gen_result *res, int n)
{
    mismatch mm = {0};
    int K = model.cfg.num_experts_per_tok, E = model.cfg.n_routed_experts;
    long route_tokens = 0, route_diff = 0;
    for (int i = 0; i < n; i++) {
        int len = q->r[i].prompt_len + res[i].n;
        for (int t = 1; t < len; t++) {
            float a = infer_logp(&res[i], t), b = ts->logp[(size_t)i * ts->T + t - 1];
            double d = fabs((double)a - b);
            mm.mean += d, mm.n++;
            mm.max = d > mm.max ? d : mm.max;
            mm.bitwise_diff += memcmp(&a, &b, sizeof a) != 0;
        }
        int32_t *ids = malloc((size_t)res[i].n_route_tokens * model.n_moe * K * sizeof *ids);
        ck_assert_int_eq(prl_routes_unpack(ids, res[i].routes,
                                           (size_t)res[i].n_route_tokens * model.n_moe * K, E),
                         PRL_OK);
        ck_assert_int_eq(res[i].n_route_tokens, len - 1);
        for (int t = 0; t < res[i].n_route_tokens; t++)
            for (int l = 0; l < model.n_moe; l++) {
                const int32_t *a = ids + ((size_t)t * model.n_moe + l) * K;
                const int32_t *b = ts->routes + (((size_t)l * ts->B + i) * ts->T + t) * K;
                int same = 1; /* as sets */
                for (int k = 0; k < K; k++) {
                    int found = 0;
                    for (int j = 0; j < K; j++) found |= a[k] == b[j];
                    same &= found;
                }
                route_tokens++, route_diff += !same;
            }
        free(ids);
    }
    mm.mean /= mm.n ? mm.n : 1;
    mm.route_diff_share = route_tokens ? (double)route_diff / route_tokens : 0;
    return mm;
}

static void free_all(prl_gen_result *res, int n, train_scores *ts)
{
    for (int i = 0; i < n; i++) prl_gen_result_free(&res[i]);
    if (ts) free(ts->logp), free(ts->routes);
}

static prl_sample_params sampling(double tau, int max_new)
{
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    sp.temperature = tau, sp.seed = 99, sp.max_new_tokens = max_new, sp.n_stop_ids = 0;
    return sp;
}

/* Sample 16 requests (temperature 1, 40 new tokens) in `mode` at batch `batch`, then score
** them with the train path and compare. */
static mismatch run_vs_train(const char *mode, int batch, uint64_t seed)
{
    reqs q;
    make_requests(&q, NREQ, seed);
    prl_infer *e = engine(mode, batch);
    prl_sample_params sp = sampling(1.0, 40);
    prl_gen_result res[NREQ];
    generate(e, &q, NREQ, &sp, res);
    train_scores ts;
    train_score(&ts, &q, res, NREQ, 1.0);
    mismatch mm = compare(&ts, &q, res, NREQ);
    free_all(res, NREQ, &ts);
    prl_infer_free(e);
    return mm;
}

/* The absorbed attention's fast kernels (infer_absorbed.c) against their reference loops
** (the same calls with the AVX2 row kernels off): bitwise equal scores, softmax (weights and
** statistics) and weighted sums, for head counts 1–3, key counts on and off the 8-key blocks
** and latent widths with and without an 8-lane tail, scores large enough to hit exp's clamp. */
START_TEST(test_absorbed_kernels_match_reference)
{
    static const int lats[] = {80, 83, 8, 5, 136};
    static const int ns[] = {1, 3, 8, 13, 64, 333, 1000};
    enum { NMAX = 1000, LMAX = 136, HMAX = 3 };
    infer__choose_gemv();
    int fast = infer__absorbed_fast_ok();
    float *c = malloc((size_t)NMAX * LMAX * sizeof *c), *q = malloc(HMAX * LMAX * sizeof *q);
    float *Sa = malloc((size_t)HMAX * NMAX * sizeof *Sa), *Sb = malloc((size_t)HMAX * NMAX * 4);
    float *raw = malloc((size_t)HMAX * NMAX * sizeof *raw);
    float oa[LMAX], ob[LMAX];
    long checked = 0;
    prl_rng rng;
    prl_rng_init(&rng, 5, 0, 0, 0, PRL_RNG_TEST);
    for (size_t li = 0; li < sizeof lats / sizeof *lats; li++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int nh = 1; nh <= HMAX; nh++) {
                int lat = lats[li], n = ns[ni], w = lat - (lat > 16 ? 16 : 0);
                float amp = ni % 2 ? 30.0f : 1.0f; /* amp 30: scores past exp's clamp */
                for (int i = 0; i < n * lat; i++) c[i] = (float)(prl_rng_normal(&rng));
                for (int i = 0; i < nh * lat; i++) q[i] = amp * (float)prl_rng_normal(&rng);
                for (int v = 0; v < 2; v++) { /* v 0: fast (when the CPU has it), 1: reference */
                    float *S = v ? Sb : Sa, *o = v ? ob : oa, mx[HMAX], sum[HMAX];
                    int was = prl_row_kernels_avx2_set(v == 0);
                    infer__absorbed_scores(S, NMAX, q, nh, c, lat, n);
                    for (int j = 0; j < nh; j++) /* the fast scores kept, checked below */
                        if (v == 0)
                            memcpy(raw + (size_t)j * NMAX, S + (size_t)j * NMAX, (size_t)n * 4);
                        else
                            ck_assert_msg(!memcmp(raw + (size_t)j * NMAX, S + (size_t)j * NMAX,
                                                  (size_t)n * 4),
                                          "scores differ: lat %d n %d head %d of %d", lat, n, j,
                                          nh);
                    for (int j = 0; j < nh; j++)
                        infer__absorbed_softmax(S + (size_t)j * NMAX, n, 0.125f, &mx[j], &sum[j]);
                    infer__absorbed_wsum(o, S, c, lat, w, n);
                    prl_row_kernels_avx2_set(was);
                    static float mxa[HMAX], suma[HMAX];
                    if (v == 0) {
                        memcpy(mxa, mx, sizeof mx), memcpy(suma, sum, sizeof sum);
                        continue;
                    }
                    for (int j = 0; j < nh; j++)
                        ck_assert_msg(
                            !memcmp(Sa + (size_t)j * NMAX, Sb + (size_t)j * NMAX, (size_t)n * 4) &&
                                mxa[j] == mx[j] && suma[j] == sum[j],
                            "softmax differs: lat %d n %d head %d", lat, n, j);
                    ck_assert_msg(!memcmp(oa, ob, (size_t)w * 4),
                                  "weighted sum differs: lat %d n %d width %d", lat, n, w);
                    checked++;
                }
            }
    printf("absorbed kernels: %ld cases, fast form %s, bitwise equal to the reference loops\n",
           checked, fast ? "on" : "off (no AVX2/FMA: both sides ran the reference)");
    free(c), free(q), free(Sa), free(Sb), free(raw);
}
END_TEST

/* The engine with the fast absorbed attention (rows' heads split into groups over the
** threads, fast kernels) against the reference one (absorbed_task, one task a row): the same
** tokens and log-prob bits, sampled, at batch 1 and 3, on tiny.json and on the model with
** sliding-window rings (W 16, wrapping), sinks with values and ModAttn convs; fp32 and
** w8a8 (whose W_UK/W_UV are BF16 in both paths). */
START_TEST(test_absorbed_engine_matches_reference)
{
    static const int blocks[] = {0, 1};
    for (int bi = 0; bi < 2; bi++) {
        load_model(blocks[bi]);
        for (int batch = 1; batch <= 3; batch += 2) {
            reqs q;
            make_requests(&q, 6, 21);
            prl_sample_params sp = sampling(1.0, 40);
            static const char *presets[] = {"fp32", "w8a8"}; /* w8a8: W_UK/W_UV in BF16 */
            for (int pi = 0; pi < 2; pi++) {
                prl_gen_result res[2][6];
                for (int v = 0; v < 2; v++) {
                    prl_infer *e = engine(presets[pi], batch);
                    e->absorbed_ref = v;
                    generate(e, &q, 6, &sp, res[v]);
                    prl_infer_free(e);
                }
                for (int i = 0; i < 6; i++) {
                    const prl_gen_result *a = &res[0][i], *b = &res[1][i];
                    ck_assert_msg(a->n == b->n && !memcmp(a->tokens, b->tokens, (size_t)a->n * 4) &&
                                      !memcmp(a->logprobs, b->logprobs, (size_t)a->n * 4) &&
                                      !memcmp(a->prompt_logprobs, b->prompt_logprobs,
                                              (size_t)a->prompt_len * 4),
                                  "%s blocks %d batch %d: request %d differs", presets[pi],
                                  blocks[bi], batch, i);
                }
                free_all(res[0], 6, NULL), free_all(res[1], 6, NULL);
            }
        }
    }
}
END_TEST

/* The decode step's sampler (infer__sample_row_fast, top-k/top-p by selection) against the
** reference one (full sort): the same candidates, and the same token for every seed,
** temperature, top-k/top-p and vocabulary limit, on rows of several lengths (tails past the
** 8-lane blocks), scales, ties, zeros of both signs and −∞ entries.
** The draws must also differ between seeds, or agreeing would prove nothing. */
START_TEST(test_fast_sampler_matches_naive)
{
    static const int Vs[] = {1, 7, 8, 61, 512, 1031};
    static const double taus[] = {0, 0.25, 0.7, 1, 1.6};
    static const int top_ks[] = {0, 1, 5, 50};
    static const double top_ps[] = {1, 0.9, 0.3};
    enum { ROWS = 6, SEEDS = 40, VMAX = 1031 };
    float *logits = malloc(VMAX * sizeof *logits);
    cand *cs = malloc(VMAX * sizeof *cs), *cf = malloc(VMAX * sizeof *cf);
    long draws = 0, differing = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof *Vs; vi++) {
        int V = Vs[vi];
        for (int row = 0; row < ROWS; row++) {
            prl_rng lr;
            prl_rng_init(&lr, 7, (uint64_t)V, (uint64_t)row, 0, PRL_RNG_SAMPLE);
            double scale = row < 2 ? 1 : row < 4 ? 6 : 0.01;
            for (int i = 0; i < V; i++) {
                logits[i] = (float)(scale * (2 * prl_rng_uniform(&lr) - 1));
                if (row == 4 && i % 3 == 0) logits[i] = i % 2 ? -0.0f : 0.0f; /* ties, ±0 */
                if (row == 5 && i % 4 == 1) logits[i] = -INFINITY;
            }
            for (size_t ti = 0; ti < sizeof taus / sizeof *taus; ti++)
                for (size_t ki = 0; ki < sizeof top_ks / sizeof *top_ks; ki++)
                    for (size_t pi = 0; pi < sizeof top_ps / sizeof *top_ps; pi++)
                        for (int lim = 0; lim <= 1; lim++) {
                            prl_sample_params sp;
                            prl_sample_params_default(&sp);
                            sp.temperature = taus[ti], sp.top_k = top_ks[ki];
                            sp.top_p = top_ps[pi], sp.vocab_limit = lim ? (V + 1) / 2 : 0;
                            int first = -1;
                            if (sp.temperature > 0) { /* the selected candidates themselves */
                                int na = infer__sample_weights(cs, logits, V, &sp);
                                int nb = infer__sample_weights_fast(cf, logits, V, &sp);
                                ck_assert_msg(na == nb,
                                              "V %d row %d top-k %d top-p %g: %d vs %d "
                                              "candidates",
                                              V, row, sp.top_k, sp.top_p, na, nb);
                                for (int i = 0; i < na; i++)
                                    ck_assert_msg(cs[i].id == cf[i].id && cs[i].w == cf[i].w,
                                                  "V %d row %d: candidate %d differs", V, row, i);
                            }
                            for (int seed = 0; seed < SEEDS; seed++) {
                                prl_rng a, b;
                                prl_rng_init(&a, (uint64_t)seed, 3, (uint64_t)row, 0,
                                             PRL_RNG_SAMPLE);
                                b = a;
                                int ya = infer__sample_row(logits, V, &sp, &a, cs);
                                int yb = infer__sample_row_fast(logits, V, &sp, &b, cs);
                                ck_assert_msg(ya == yb,
                                              "V %d row %d tau %g top-k %d top-p %g limit %d "
                                              "seed %d: naive %d, fast %d",
                                              V, row, sp.temperature, sp.top_k, sp.top_p,
                                              sp.vocab_limit, seed, ya, yb);
                                first = seed == 0 ? ya : first;
                                differing += ya != first;
                                draws++;
                            }
                        }
        }
    }
    ck_assert_int_gt(differing, draws / 8); /* the seeds do move the draws */
    free(logits);
    free(cs), free(cf);
}
END_TEST

START_TEST(test_aligned_is_bitwise_equal)
{
    load_tiny();
    int batches[] = {1, 16}, threads[] = {1, 2};
    for (int bi = 0; bi < 2; bi++)
        for (int ti = 0; ti < 2; ti++) {
            prl_blas_set_threads(threads[ti]);
            mismatch mm = run_vs_train("aligned", batches[bi], 5);
            printf("aligned batch %d threads %d: %ld tokens, %ld differ bitwise, max |dlogp| %g, "
                   "routes differ %.4f\n",
                   batches[bi], threads[ti], mm.n, mm.bitwise_diff, mm.max, mm.route_diff_share);
            ck_assert_int_gt(mm.n, NREQ * 40);
            ck_assert_msg(mm.bitwise_diff == 0, "%ld of %ld log-probs differ (max %g)",
                          mm.bitwise_diff, mm.n, mm.max);
            ck_assert(mm.route_diff_share == 0);
        }
    prl_blas_set_threads(2);
}
END_TEST

START_TEST(test_fp32_and_low_precision_mismatch)
{
    load_tiny();
    const char *modes[] = {"fp32", "bf16", "fp16", "fp32+gemv", "fp32+naive", "w8a8"};
    for (int mi = 0; mi < 6; mi++) {
        mismatch mm = run_vs_train(modes[mi], 8, 6);
        printf("%s vs train path: %ld tokens, mean |dlogp| %.3g, max |dlogp| %.3g, "
               "MoE top-k differs on %.2f%% of token-layers\n",
               modes[mi], mm.n, mm.mean, mm.max, 100 * mm.route_diff_share);
        if (mi == 5) /* INT8: quantization applied, and the mismatch of a reduced precision */
            ck_assert_msg(mm.max > 1e-4 && mm.mean < 0.5, "w8a8 mean %g max %g", mm.mean, mm.max);
        else if (mi == 0 || mi >= 3)
            ck_assert_msg(mm.max < 1e-4, "%s max |dlogp| %g >= 1e-4", modes[mi], mm.max);
        else
            ck_assert_msg(mm.max > 1e-4, "%s is suspiciously close (%g): rounding not applied?",
                          modes[mi], mm.max);
    }
}
END_TEST

/* The same requests with different batch limits, thread counts and companions. */
START_TEST(test_batch_and_thread_invariance)
{
    load_tiny();
    const char *modes[] = {"fp32", "aligned", "bf16", "fp32+gemv", "w8a8"};
    for (int mi = 0; mi < 5; mi++)
        for (int greedy = 0; greedy < 2; greedy++) {
            reqs q;
            make_requests(&q, NREQ, 8);
            prl_sample_params sp = sampling(greedy ? 0.0 : 0.8, 30);
            sp.top_k = greedy ? 0 : 50;
            sp.top_p = greedy ? 1 : 0.9;
            prl_gen_result ref[NREQ];
            prl_blas_set_threads(2);
            prl_infer *e = engine(modes[mi], 16);
            generate(e, &q, NREQ, &sp, ref);
            prl_infer_free(e);
            int batch[] = {1, 3}, threads[] = {1, 2};
            for (int v = 0; v < 2; v++) {
                prl_blas_set_threads(threads[v]);
                prl_infer *e2 = engine(modes[mi], batch[v]);
                prl_gen_result res[NREQ];
                /* batch 3 also changes the companions: run the requests in reverse order */
                reqs q2 = q;
                if (v == 1)
                    for (int i = 0; i < NREQ; i++) q2.r[i] = q.r[NREQ - 1 - i];
                generate(e2, &q2, NREQ, &sp, res);
                for (int i = 0; i < NREQ; i++) {
                    const prl_gen_result *a = &ref[v == 1 ? NREQ - 1 - i : i], *b = &res[i];
                    ck_assert_msg(a->n == b->n && !memcmp(a->tokens, b->tokens, (size_t)a->n * 4) &&
                                      !memcmp(a->logprobs, b->logprobs, (size_t)a->n * 4),
                                  "%s %s: request %d differs with batch %d threads %d", modes[mi],
                                  greedy ? "greedy" : "sampled", i, batch[v], threads[v]);
                }
                free_all(res, NREQ, NULL);
                prl_infer_free(e2);
            }
            free_all(ref, NREQ, NULL);
        }
    prl_blas_set_threads(2);
}
END_TEST

/* W8A8: the naive INT8/BF16 kernels and the AVX2 ones (the one cpuid picks here) give the same
** tokens and log-probs bit for bit (integer sums are exact; the BF16 dots share one order). */
START_TEST(test_w8a8_kernels_bitwise)
{
    load_tiny();
    reqs q;
    make_requests(&q, NREQ, 9);
    prl_sample_params sp = sampling(0.8, 24);
    prl_gen_result ref[NREQ], res[NREQ];
    ck_assert_int_eq(prl_q8_kernel_set("naive"), PRL_OK);
    prl_infer *e = engine("w8a8", 16);
    generate(e, &q, NREQ, &sp, ref);
    prl_infer_free(e);
    ck_assert_int_eq(prl_q8_kernel_set(NULL), PRL_OK);
    ck_assert_int_ne(prl_q8_kernel_active(), PRL_Q8_NAIVE); /* the build machine has AVX2 */
    e = engine("w8a8", 16);
    generate(e, &q, NREQ, &sp, res);
    long n = 0;
    for (int i = 0; i < NREQ; i++) {
        ck_assert_int_eq(ref[i].n, res[i].n);
        ck_assert_int_eq(memcmp(ref[i].tokens, res[i].tokens, (size_t)ref[i].n * 4), 0);
        ck_assert_int_eq(memcmp(ref[i].logprobs, res[i].logprobs, (size_t)ref[i].n * 4), 0);
        ck_assert_int_eq(
            memcmp(ref[i].prompt_logprobs, res[i].prompt_logprobs, (size_t)ref[i].prompt_len * 4),
            0);
        n += ref[i].n;
    }
    ck_assert_int_gt(n, 0);
    prl_infer_free(e);
    free_all(ref, NREQ, NULL), free_all(res, NREQ, NULL);
}
END_TEST

/* SmoothQuant: calibration keeps, per INT8 linear, the best of no smoothing and five α by
** output MSE on its recorded rows, so the summed MSE cannot grow; an engine given the table
** quantizes with it (other log-probs than without); the table is refused without w8a8. */
START_TEST(test_w8a8_smoothquant)
{
    load_tiny();
    reqs q;
    make_requests(&q, NREQ, 10);
    prl_infer_options o;
    ck_assert_int_eq(prl_infer_options_preset(&o, "w8a8"), PRL_OK);
    prl_w8a8_smooth *t = NULL;
    prl_w8a8_calib c;
    ck_assert_msg(prl_w8a8_calibrate(&t, &model, &o, q.r, NREQ, &c) == PRL_OK, "%s",
                  prl_error_message());
    printf("SmoothQuant on tiny: %d INT8 linears, %d smoothed, summed MSE %.4g -> %.4g\n",
           c.linears, c.smoothed, c.mse_plain, c.mse_smooth);
    ck_assert_int_gt(c.linears, 0);
    ck_assert(c.mse_smooth <= c.mse_plain);
    ck_assert_int_gt(c.smoothed, 0);
    reqs q2;
    make_requests(&q2, 4, 11);
    prl_sample_params sp = sampling(0, 8);
    prl_gen_result a[4], b[4];
    o.max_batch = 4;
    prl_infer *e = NULL;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_OK);
    generate(e, &q2, 4, &sp, a);
    prl_infer_free(e);
    o.smooth = t;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_OK);
    generate(e, &q2, 4, &sp, b);
    ck_assert_int_eq(prl_infer_refresh(e), PRL_OK); /* re-quantized with the same factors */
    prl_infer_free(e);
    int differ = 0;
    for (int i = 0; i < 4; i++)
        differ |= memcmp(a[i].prompt_logprobs, b[i].prompt_logprobs, (size_t)a[i].prompt_len * 4);
    ck_assert_msg(differ, "the smoothing factors changed nothing");
    o.w8a8 = 0;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    free_all(a, 4, NULL), free_all(b, 4, NULL);
    prl_w8a8_smooth_free(t);
}
END_TEST

/* Shared prefill: groups of identical prompts (a GRPO group) give bitwise the same tokens,
** log-probs, prompt log-probs and routes whether each request prefills its prompt or copies
** the caches of its twin admitted just before it. Every cache kind is exercised: rings that
** wrap during the prompt (20 > W = 16), ModAttn histories, sinks, DSA indexer keys, mHC, and
** every block at once; sampled at τ = 0.8 with 8 slots, so groups straddle admission rounds
** and later admissions (after decode steps) must prefill again. */
static void shared_prefill_case(int blocks, const char *mode)
{
    load_model(blocks);
    enum { GROUPS = 4, G = 4, N = GROUPS * G };
    int32_t prompts[GROUPS][20];
    prl_gen_request r[N];
    for (int k = 0; k < GROUPS; k++) {
        prl_rng rng;
        prl_rng_init(&rng, 41, (uint64_t)k, 0, 0, PRL_RNG_TEST);
        for (int t = 0; t < 20; t++) prompts[k][t] = 16 + (int32_t)(prl_rng_u64(&rng) % 4000);
        for (int j = 0; j < G; j++)
            r[k * G + j] = (prl_gen_request){.prompt = prompts[k],
                                             .prompt_len = k == 1 ? 7 : 20, /* one short group */
                                             .seq_id = 500 + (uint64_t)(k * G + j)};
    }
    prl_sample_params sp = sampling(0.8, 12);
    prl_gen_result res[2][N];
    long shared[2];
    for (int v = 0; v < 2; v++) {
        prl_infer_options o;
        int naive = !strcmp(mode, "naive"); /* the per-head K/V cache too */
        ck_assert_int_eq(prl_infer_options_preset(&o, naive ? "fp32" : mode), PRL_OK);
        if (naive) o.mla = PRL_MLA_NAIVE;
        o.max_batch = 8, o.no_shared_prefill = v;
        prl_infer *e = NULL;
        ck_assert_msg(prl_infer_init(&e, &model, &o) == PRL_OK, "%s", prl_error_message());
        ck_assert_int_eq(prl_infer_generate(e, r, N, &sp, res[v], NULL, NULL), PRL_OK);
        prl_spec_stats st = prl_infer_spec_stats(e);
        ck_assert_int_eq(st.prefills, N);
        shared[v] = st.shared_prefills;
        prl_infer_free(e);
    }
    ck_assert_int_eq(shared[1], 0);
    ck_assert_msg(shared[0] >= N / 2, "blocks %d: only %ld of %d prefills shared", blocks,
                  shared[0], N);
    for (int i = 0; i < N; i++) {
        const prl_gen_result *a = &res[0][i], *b = &res[1][i];
        ck_assert_msg(
            a->n == b->n && !memcmp(a->tokens, b->tokens, (size_t)a->n * 4) &&
                !memcmp(a->logprobs, b->logprobs, (size_t)a->n * 4) &&
                !memcmp(a->prompt_logprobs, b->prompt_logprobs, (size_t)a->prompt_len * 4) &&
                a->routes_bytes == b->routes_bytes &&
                !memcmp(a->routes, b->routes, a->routes_bytes),
            "blocks %d %s: request %d differs with the shared prefill", blocks, mode, i);
    }
    printf("shared prefill, blocks %d, %s: %ld of %d prompts copied from a twin, bitwise equal\n",
           blocks, mode, shared[0], N);
    free_all(res[0], N, NULL), free_all(res[1], N, NULL);
}

START_TEST(test_shared_prefill_bitwise)
{
    const int blocks[] = {0, 1, 3, 6, 7};
    for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++)
        shared_prefill_case(blocks[i], "fp32");
    shared_prefill_case(1, "bf16");
    shared_prefill_case(1, "w8a8");
    shared_prefill_case(1, "naive");
    load_model(0);
}
END_TEST

START_TEST(test_stops_forced_and_routes_format)
{
    load_tiny();
    prl_infer *e = engine("fp32", 4);
    reqs q;
    make_requests(&q, 4, 9);
    prl_gen_result res[4];
    /* greedy first tokens become stop ids: every sequence stops after one token */
    prl_sample_params sp = sampling(0, 50);
    generate(e, &q, 4, &sp, res);
    int32_t stops[4];
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(res[i].stop, PRL_STOP_LENGTH);
        ck_assert_int_eq(res[i].n, 50);
        stops[i] = res[i].tokens[0];
    }
    free_all(res, 4, NULL);
    sp.stop_ids = stops, sp.n_stop_ids = 4;
    generate(e, &q, 4, &sp, res);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(res[i].stop, PRL_STOP_TOKEN);
        ck_assert_int_eq(res[i].n, 1);
    }
    free_all(res, 4, NULL);
    /* a vocabulary limit (a tokenizer smaller than the model): no id at or past it is drawn */
    for (int greedy = 0; greedy < 2; greedy++) {
        sp = sampling(greedy ? 0 : 1.0, 30);
        sp.vocab_limit = 300;
        generate(e, &q, 4, &sp, res);
        for (int i = 0; i < 4; i++)
            for (int t = 0; t < res[i].n; t++) ck_assert_int_lt(res[i].tokens[t], 300);
        free_all(res, 4, NULL);
    }
    sp.vocab_limit = -1;
    ck_assert_int_eq(prl_infer_generate(e, q.r, 4, &sp, res, NULL, NULL), PRL_ERR_ARG);
    /* forced tokens: the scores equal a generation's own log-probs */
    sp = sampling(0.7, 20);
    generate(e, &q, 4, &sp, res);
    prl_gen_result forced[4];
    reqs q2 = q;
    for (int i = 0; i < 4; i++) q2.r[i].forced = res[i].tokens, q2.r[i].n_forced = res[i].n;
    generate(e, &q2, 4, &sp, forced);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(forced[i].stop, PRL_STOP_FORCED);
        ck_assert(!memcmp(forced[i].logprobs, res[i].logprobs, (size_t)res[i].n * 4));
    }
    free_all(forced, 4, NULL);
    free_all(res, 4, NULL);
    /* context limit: generation stops when prompt + output fill the context */
    prl_infer_free(e);
    prl_infer_options o;
    prl_infer_options_default(&o);
    o.max_len = 30;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_OK);
    sp = sampling(0, 100);
    generate(e, &q, 4, &sp, res);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(res[i].stop, PRL_STOP_CONTEXT);
        ck_assert_int_eq(res[i].prompt_len + res[i].n, 30);
    }
    free_all(res, 4, NULL);
    prl_infer_free(e);
    /* compact routes round trip; wide ids take two bytes; bad bytes are rejected */
    int32_t ids[5] = {0, 7, 3, 255, 1}, back[5];
    uint8_t buf[10];
    ck_assert_uint_eq(prl_routes_pack(buf, ids, 5, 256), 5);
    ck_assert_int_eq(prl_routes_unpack(back, buf, 5, 256), PRL_OK);
    ck_assert(!memcmp(ids, back, sizeof ids));
    ids[3] = 300;
    ck_assert_uint_eq(prl_routes_pack(buf, ids, 5, 512), 10);
    ck_assert_int_eq(prl_routes_unpack(back, buf, 5, 512), PRL_OK);
    ck_assert_int_eq(back[3], 300);
    ids[3] = 255;
    prl_routes_pack(buf, ids, 5, 256); /* one byte each; 255 is no expert of an 8-expert model */
    ck_assert_int_eq(prl_routes_unpack(back, buf, 5, 8), PRL_ERR_FORMAT);
    ck_assert_msg(strstr(prl_error_message(), "route entry 3: expert 255"), "%s",
                  prl_error_message());
}
END_TEST

START_TEST(test_kv_bytes_and_bad_input)
{
    load_tiny();
    const prl_config *c = &model.cfg;
    prl_infer *e = engine("fp32", 2);
    ck_assert_uint_eq(prl_infer_kv_bytes_per_token(e),
                      (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * c->num_hidden_layers * 4);
    reqs q;
    make_requests(&q, 2, 10);
    prl_gen_result res[2];
    prl_sample_params sp = sampling(0, 5);
    int32_t long_prompt[200] = {0};
    q.r[1].prompt = long_prompt, q.r[1].prompt_len = 200;
    ck_assert_int_eq(prl_infer_generate(e, q.r, 2, &sp, res, NULL, NULL), PRL_ERR_RANGE);
    ck_assert_msg(strstr(prl_error_message(), "request 1: prompt of 200 tokens"), "%s",
                  prl_error_message());
    make_requests(&q, 2, 10);
    q.prompts[0][1] = 5000;
    ck_assert_int_eq(prl_infer_generate(e, q.r, 2, &sp, res, NULL, NULL), PRL_ERR_RANGE);
    ck_assert(strstr(prl_error_message(), "request 0 position 1: token id 5000"));
    make_requests(&q, 2, 10);
    sp.temperature = -1;
    ck_assert_int_eq(prl_infer_generate(e, q.r, 2, &sp, res, NULL, NULL), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "temperature -1"));
    sp = sampling(1, 5), sp.top_p = 1.5;
    ck_assert_int_eq(prl_infer_generate(e, q.r, 2, &sp, res, NULL, NULL), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "top-p 1.5"));
    sp = sampling(1, 5), sp.top_k = -3;
    ck_assert_int_eq(prl_infer_generate(e, q.r, 2, &sp, res, NULL, NULL), PRL_ERR_ARG);
    sp = sampling(1, 0);
    ck_assert_int_eq(prl_infer_generate(e, q.r, 2, &sp, res, NULL, NULL), PRL_ERR_ARG);
    prl_infer_free(e);
    prl_infer_options o;
    ck_assert_int_eq(prl_infer_options_preset(&o, "fp8"), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "unknown precision 'fp8'"));
    prl_infer_options_default(&o);
    o.max_len = 10000;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "context 10000"));
    /* W8A8: the preset and the knob, the description, and what is refused */
    char desc[96];
    ck_assert_int_eq(prl_infer_options_preset(&o, "w8a8"), PRL_OK);
    ck_assert_int_eq(o.w8a8, PRL_W8A8_ALL);
    prl_infer_options_describe(&o, desc, sizeof desc);
    ck_assert_str_eq(desc, "precision=w8a8 mla=absorbed matmul=gemm");
    ck_assert_int_eq(prl_infer_options_set(&o, "bf16", NULL, NULL), PRL_OK);
    ck_assert_int_eq(o.w8a8, 0);
    o.w8a8 = PRL_W8A8_ROUTED; /* bf16 activations with INT8 linears: refused */
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "w8a8 keeps activations in fp32"));
    o.precision = PRL_PRECISION_FP32, o.w8a8 = 64;
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "w8a8 module mask"));
    o.w8a8 = PRL_W8A8_ALL;
    setenv("PRL_Q8_KERNEL", "sse9", 1);
    ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_ERR_ARG);
    ck_assert(strstr(prl_error_message(), "PRL_Q8_KERNEL=sse9"));
    unsetenv("PRL_Q8_KERNEL");
}
END_TEST

/* The loaded model on both paths: aligned bitwise equal at batch 16 and 1 (routes too), fp32
** and fp32+gemv within `tol` of the train path's log-probs. */
static void check_modes(const char *label, double tol)
{
    const char *modes[] = {"aligned", "aligned", "fp32", "fp32+gemv"};
    int batch[] = {16, 1, 8, 8};
    for (int mi = 0; mi < 4; mi++) {
        mismatch mm = run_vs_train(modes[mi], batch[mi], 12);
        printf("%s %s batch %d: %ld tokens, %ld differ bitwise, max |dlogp| %.3g, routes "
               "differ %.4f\n",
               label, modes[mi], batch[mi], mm.n, mm.bitwise_diff, mm.max, mm.route_diff_share);
        if (mi < 2) {
            ck_assert_msg(mm.bitwise_diff == 0, "%ld of %ld log-probs differ (max %g)",
                          mm.bitwise_diff, mm.n, mm.max);
            ck_assert(mm.route_diff_share == 0);
        } else {
            ck_assert_msg(mm.max < tol, "%s max |dlogp| %g >= %g", modes[mi], mm.max, tol);
        }
    }
}

/* Sliding windows (ring caches), parameter sinks and ModAttn convs (per-sequence state) on
** both paths: aligned bitwise equal at batch 1 and 16, fp32 (absorbed, sinks merged by the
** two-part softmax) and gemv close. */
START_TEST(test_swa_sinks_match_train_path)
{
    for (int blocks = 1; blocks <= 2; blocks++) {
        load_model(blocks);
        check_modes(blocks == 1 ? "SWA W=16 + 4 sinks (with values, ModAttn k=3)"
                                : "SWA W=16 + 4 sinks (no values)",
                    1e-4);
    }
    /* KV memory: the whole-context layers grow with the context, the rings stop at W */
    prl_infer *e = engine("fp32", 2);
    const prl_config *c = &model.cfg;
    size_t row = (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * 4;
    ck_assert_uint_eq(prl_infer_kv_bytes_per_token(e), 2 * row);
    ck_assert_uint_eq(prl_infer_kv_bytes(e, 10), 6 * 10 * row);
    ck_assert_uint_eq(prl_infer_kv_bytes(e, 150), (2 * 150 + 4 * 16) * row);
    prl_infer_free(e);
    load_model(0);
}
END_TEST

/* DSA (layers 0 and 3, top-8 of up to 64 tokens) with SWA, sinks and convs: the infer path
** caches each token's indexer key and selects over the cache; aligned is bitwise equal to the
** train path at batch 16 and 1, in the sparse stage, in the dense warm-up stage and with mHC
** and sandwich norms on top; fp32
** (absorbed, masked softmax) is close. The cache holds d_I more floats per token per DSA layer. */
START_TEST(test_dsa_matches_train_path)
{
    for (int blocks = 4; blocks <= 6; blocks++) {
        load_model(blocks);
        const char *modes[] = {"aligned", "aligned", "fp32"};
        int batch[] = {16, 1, 8};
        for (int mi = 0; mi < 3; mi++) {
            mismatch mm = run_vs_train(modes[mi], batch[mi], 12);
            printf("DSA top-8 (%s stage) + SWA + sinks%s %s batch %d: %ld tokens, %ld differ "
                   "bitwise, mean |dlogp| %.3g, max %.3g, routes differ %.4f\n",
                   blocks == 5 ? "dense" : "sparse", blocks == 6 ? " + mHC + sandwich" : "",
                   modes[mi], batch[mi], mm.n, mm.bitwise_diff, mm.mean, mm.max,
                   mm.route_diff_share);
            if (mi < 2) {
                ck_assert_msg(mm.bitwise_diff == 0, "%ld of %ld log-probs differ (max %g)",
                              mm.bitwise_diff, mm.n, mm.max);
                ck_assert(mm.route_diff_share == 0);
            } else {
                /* a near-tie in the index scores can flip one selection: one token off,
                ** the rest at fp32 noise */
                ck_assert_msg(mm.mean < (blocks == 5 ? 1e-5 : 5e-4), "fp32 mean |dlogp| %g",
                              mm.mean);
            }
        }
    }
    /* the sparse stage really differs from dense attention on this model */
    load_model(4);
    reqs q;
    make_requests(&q, 2, 12);
    prl_sample_params sp = sampling(0, 40);
    prl_gen_result sparse[2], dense[2];
    prl_infer *e = engine("aligned", 2);
    generate(e, &q, 2, &sp, sparse);
    prl_infer_free(e);
    model.cfg.dsa_stage = PRL_DSA_DENSE;
    e = engine("aligned", 2);
    generate(e, &q, 2, &sp, dense);
    long differ = 0;
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < sparse[i].n && t < dense[i].n; t++)
            differ += sparse[i].logprobs[t] != dense[i].logprobs[t];
    ck_assert_int_gt(differ, 0);
    free_all(sparse, 2, NULL), free_all(dense, 2, NULL);
    prl_infer_free(e);
    e = engine("fp32", 2);
    /* KV memory: per token, each whole-context layer's latent + rope key, and a DSA layer's
    ** indexer key besides */
    const prl_config *c = &model.cfg;
    size_t row = (size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * 4,
           ix = (size_t)c->index_head_dim * 4;
    ck_assert_uint_eq(prl_infer_kv_bytes_per_token(e), 2 * (row + ix));
    ck_assert_uint_eq(prl_infer_kv_bytes(e, 150), 2 * 150 * (row + ix) + 4 * 16 * row);
    prl_infer_free(e);
    model.cfg.dsa_stage = PRL_DSA_SPARSE;
    load_model(0);
}
END_TEST

/* Every block at once (tiny-pangu.json, blocks 7; DSA in the sparse stage): aligned is
** bitwise equal to the train path at batch 16 and 1, routes included; fp32 (absorbed) close,
** with the DSA near-tie allowance of test_dsa_matches_train_path. */
START_TEST(test_all_blocks_match_train_path)
{
    load_model(7);
    ck_assert_int_eq(model.cfg.dsa_stage, PRL_DSA_SPARSE);
    ck_assert(model.cfg.n_dsa_layers == 2 && model.cfg.n_swa_layers == 4 && model.cfg.use_mhc &&
              model.cfg.use_mome && model.cfg.param_sink_with_value && model.cfg.sandwich_norm &&
              model.cfg.num_nextn_predict_layers == 1);
    const char *modes[] = {"aligned", "aligned", "fp32"};
    int batch[] = {16, 1, 8};
    for (int mi = 0; mi < 3; mi++) {
        mismatch mm = run_vs_train(modes[mi], batch[mi], 12);
        printf("all blocks (tiny-pangu, W=16, top-8) %s batch %d: %ld tokens, %ld differ bitwise, "
               "mean |dlogp| %.3g, max %.3g, routes differ %.4f\n",
               modes[mi], batch[mi], mm.n, mm.bitwise_diff, mm.mean, mm.max, mm.route_diff_share);
        ck_assert_int_gt(mm.n, NREQ * 40);
        if (mi < 2) {
            ck_assert_msg(mm.bitwise_diff == 0, "%ld of %ld log-probs differ (max %g)",
                          mm.bitwise_diff, mm.n, mm.max);
            ck_assert(mm.route_diff_share == 0);
        } else {
            ck_assert_msg(mm.mean < 5e-4, "fp32 mean |dlogp| %g", mm.mean);
        }
    }
    /* the caches as allocated for one slot of n rows are the accounted bytes of an n-token
    ** context: rings stop at W = 16, whole-context layers and indexer keys grow with n */
    for (int n = 10; n <= 160; n += 150) {
        prl_infer_options o;
        prl_infer_options_default(&o);
        o.max_batch = 1, o.max_len = n;
        prl_infer *e = NULL;
        ck_assert_int_eq(prl_infer_init(&e, &model, &o), PRL_OK);
        prl_kv_alloc a = prl_infer_kv_alloc(e);
        size_t row = (size_t)(model.cfg.kv_lora_rank + model.cfg.qk_rope_head_dim) * 4;
        ck_assert(a.n_full == 2 && a.n_dsa == 2 && a.n_ring == 4);
        ck_assert_uint_eq(a.full + a.index + a.ring, prl_infer_kv_bytes(e, n));
        ck_assert_uint_eq(a.ring, 4 * (size_t)(n < 16 ? n : 16) * row);
        ck_assert_uint_eq(a.index, 2 * (size_t)n * model.cfg.index_head_dim * 4);
        prl_infer_free(e);
    }
    load_model(0);
}
END_TEST

/* DeepSeek-V3's maths on both paths: the absorbed form's cached k_pe is rotated (interleaved,
** YaRN) as the train path's keys, the softmax scale carries mscale², and the grouped routes
** are recorded per MoE layer (2 of 6 layers). Aligned is bitwise equal at batch 16 and 1. */
START_TEST(test_deepseek_match_train_path)
{
    load_model(8);
    ck_assert_int_eq(model.n_moe, 2);
    check_modes("deepseek_v3: interleaved YaRN RoPE, moe_layer_freq 2, 4 groups top-2", 1e-4);
    load_model(9);
    ck_assert_ptr_nonnull(prl_model_find(&model, "model.layers.0.self_attn.q_proj.weight"));
    check_modes("deepseek_v3: q_lora_rank null (q_proj), interleaved RoPE", 1e-4);
    load_model(0);
}
END_TEST

/* mHC streams, sandwich norms and block post-norms on top of SWA, sinks and ModAttn: aligned
** bitwise equal at batch 16 and 1; fp32 (absorbed) and gemv close. */
START_TEST(test_mhc_sandwich_match_train_path)
{
    load_model(3);
    /* random gains on 26 norms amplify the absorbed form's rounding: measured 1.0e-4 (fp32)
    ** and 7.6e-5 (gemv), vs 5.3e-5 without them */
    check_modes("mHC n=4 it=20 + sandwich + block post [0, 3]", 3e-4);
    load_model(0);
}
END_TEST

/* Hooks: the same names on both paths, equal tensors in aligned mode. */
typedef struct hook_log {
    char names[64][32];
    int n;
} hook_log;

static int log_hook(void *user, const char *name, const prl_real *data, int ndim,
                    const int64_t *shape)
{
    (void)data, (void)ndim, (void)shape;
    hook_log *h = user;
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->names[i], name)) return 0;
    if (h->n < 64) snprintf(h->names[h->n++], 32, "%s", name);
    return 0;
}

START_TEST(test_hook_names_match)
{
    load_tiny();
    hook_log a = {0}, b = {0};
    prl_infer *e = engine("fp32", 2);
    prl_infer_set_hook(e, log_hook, &a);
    reqs q;
    make_requests(&q, 2, 11);
    prl_gen_result res[2];
    prl_sample_params sp = sampling(0, 3);
    generate(e, &q, 2, &sp, res);
    prl_model_set_hook(&model, log_hook, &b);
    train_scores ts;
    train_score(&ts, &q, res, 2, 1.0);
    prl_model_set_hook(&model, NULL, NULL);
    ck_assert_int_eq(a.n, b.n);
    for (int i = 0; i < a.n; i++) {
        int found = 0;
        for (int j = 0; j < b.n; j++) found |= !strcmp(a.names[i], b.names[j]);
        ck_assert_msg(found, "infer hook %s has no train-path twin", a.names[i]);
    }
    ck_assert_int_ge(a.n, 6 * 3 + 1);
    free_all(res, 2, &ts);
    prl_infer_free(e);
}
END_TEST

int main(void)
{
    if (prl_blas_init(2) != PRL_OK) return 1;
    Suite *s = suite_create("infer");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_aligned_is_bitwise_equal);
    tcase_add_test(tc, test_fp32_and_low_precision_mismatch);
    tcase_add_test(tc, test_batch_and_thread_invariance);
    tcase_add_test(tc, test_w8a8_kernels_bitwise);
    tcase_add_test(tc, test_w8a8_smoothquant);
    tcase_add_test(tc, test_shared_prefill_bitwise);
    tcase_add_test(tc, test_stops_forced_and_routes_format);
    tcase_add_test(tc, test_fast_sampler_matches_naive);
    tcase_add_test(tc, test_absorbed_kernels_match_reference);
    tcase_add_test(tc, test_absorbed_engine_matches_reference);
    tcase_add_test(tc, test_kv_bytes_and_bad_input);
    tcase_add_test(tc, test_hook_names_match);
    tcase_add_test(tc, test_swa_sinks_match_train_path);
    suite_add_tcase(s, tc);
    TCase *dsa = tcase_create("dsa");
    tcase_set_timeout(dsa, 600);
    tcase_add_test(dsa, test_dsa_matches_train_path);
    suite_add_tcase(s, dsa);
    TCase *residual = tcase_create("residual"); /* CK_RUN_CASE=residual runs it alone */
    tcase_set_timeout(residual, 600);
    tcase_add_test(residual, test_mhc_sandwich_match_train_path);
    suite_add_tcase(s, residual);
    TCase *all = tcase_create("all_blocks"); /* CK_RUN_CASE=all_blocks runs it alone */
    tcase_set_timeout(all, 600);
    tcase_add_test(all, test_all_blocks_match_train_path);
    suite_add_tcase(s, all);
    TCase *ds = tcase_create("deepseek"); /* CK_RUN_CASE=deepseek runs it alone */
    tcase_set_timeout(ds, 600);
    tcase_add_test(ds, test_deepseek_match_train_path);
    suite_add_tcase(s, ds);
    int failed = check_run_mode(s, CK_NOFORK); /* the tests share one loaded model */
    prl_model_free(&model);
    return failed;
}
