/*
** bench_dsa.c — `prl bench dsa`: DSA's sparse stage, the sparse attention kernel against the
** masked dense one it replaces (its naive reference) and against plain causal attention.
**
** For each sequence length T (default 512, 2048, 4096) one run measures, in alternating
** rounds so that drift in the shared machine's speed hits all alike: (1) the attention alone,
** forward + backward, on tiny.json's head shapes with random top-k selections, as the masked
** dense kernel, the sparse kernel and causal attention without a selection; (2) a layer step
** (forward + backward of a one-layer DSA model: indexer, attention, MLP, head) with the
** attention masked or sparse (prl_model.dsa_masked_reference). It prints medians of the
** rounds and the ratios masked/sparse. The indexer's scores and top-k stay O(T²) by design
** (docs/model.md, "DSA"), so the layer step's ratio is below the attention's.
*/
#include "cli/bench.h"
#include "engine/ops.h"

#include <stdlib.h>
#include <string.h>

typedef struct dsa_args {
    const char *seqs;
    int topk, rounds, threads;
    uint64_t seed;
} dsa_args;

/* tiny.json's attention: 4 heads of 32 + 16 (rope), values 32, 16 sinks (tiny-dsa.json). */
enum { H = 4, DN = 32, DR = 16, DV = 32, NS = 16, MAX_SEQS = 8 };

/* One attention problem: inputs, a random selection of top-k per row, outputs and scratch. */
typedef struct att_case {
    int T, K;
    float *q, *kv, *kr, *skv, *skr, *dout, *out, *att, *g[5], *scratch;
    uint8_t *sel;
    int32_t *idx;
} att_case;

static float *rand_floats(prl_rng *r, size_t n)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++)
        x[i] = (float)((double)(prl_rng_u64(r) >> 11) / 0x1p53 - 0.5);
    return x;
}

static void case_init(att_case *c, int T, int K, uint64_t seed)
{
    prl_rng r;
    prl_rng_init(&r, seed, (uint64_t)T, 0, 0, PRL_RNG_TEST);
    c->T = T, c->K = K < T ? K : T;
    c->q = rand_floats(&r, (size_t)T * H * (DN + DR));
    c->kv = rand_floats(&r, (size_t)T * H * (DN + DV));
    c->kr = rand_floats(&r, (size_t)T * DR);
    c->skv = rand_floats(&r, (size_t)NS * H * (DN + DV));
    c->skr = rand_floats(&r, (size_t)NS * DR);
    c->dout = rand_floats(&r, (size_t)T * H * DV);
    c->out = malloc((size_t)T * H * DV * sizeof(float));
    c->att = malloc((size_t)H * T * (NS + T) * sizeof(float));
    size_t len[5] = {(size_t)T * H * (DN + DR), (size_t)T * H * (DN + DV), (size_t)T * DR,
                     (size_t)NS * H * (DN + DV), (size_t)NS * DR};
    for (int i = 0; i < 5; i++) c->g[i] = calloc(len[i], sizeof(float));
    prl_attn_shape sh = {.B = 1, .T = T, .H = H, .dn = DN, .dr = DR, .dv = DV, .ns = NS};
    c->scratch = malloc(prl_attention_scratch(sh) * sizeof(float));
    c->sel = calloc((size_t)T * T, 1);
    c->idx = malloc((size_t)T * c->K * sizeof *c->idx);
    for (int t = 0; t < T; t++) /* k distinct keys of [0, t] (all of them when t < k) */
        for (int n = 0; n <= t && n < c->K; n++) {
            int s = t < c->K ? n : (int)(prl_rng_u64(&r) % (uint64_t)(t + 1));
            while (c->sel[(size_t)t * T + s]) s = (s + 1) % (t + 1);
            c->sel[(size_t)t * T + s] = 1;
        }
    prl_attn_sel_index(c->idx, c->sel, T, T, c->K);
}

static void case_free(att_case *c)
{
    free(c->q), free(c->kv), free(c->kr), free(c->skv), free(c->skr), free(c->dout);
    free(c->out), free(c->att), free(c->scratch), free(c->sel), free(c->idx);
    for (int i = 0; i < 5; i++) free(c->g[i]);
}

/* Seconds of one forward + backward; mode 0 masked dense, 1 sparse, 2 causal (no selection). */
static double time_attention(att_case *c, int mode)
{
    prl_attn_shape sh = {.B = 1, .T = c->T, .H = H, .dn = DN, .dr = DR, .dv = DV, .ns = NS};
    if (mode < 2) sh.sel = c->sel;
    if (mode == 1) sh.sel_idx = c->idx, sh.sel_k = c->K;
    double t0 = prl_now();
    prl_attention_forward(c->out, c->att, c->q, c->kv, c->kr, c->skv, c->skr, NULL, sh);
    prl_attention_backward(c->g[0], c->g[1], c->g[2], c->g[3], c->g[4], c->dout, c->att, c->q,
                           c->kv, c->kr, c->skv, c->skr, c->scratch, NULL, sh);
    return prl_now() - t0;
}

/* A one-layer DSA model on tiny.json's shapes (dense MLP, 16 sinks, 2 index heads × 32). */
static prl_status layer_model(prl_model *m, int T, int K, uint64_t seed)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"vocab_size\": 512, \"hidden_size\": 256, \"num_hidden_layers\": 1,"
             " \"num_attention_heads\": %d, \"q_lora_rank\": 128, \"kv_lora_rank\": 64,"
             " \"qk_nope_head_dim\": %d, \"qk_rope_head_dim\": %d, \"v_head_dim\": %d,"
             " \"first_k_dense_replace\": 1, \"intermediate_size\": 512,"
             " \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
             " \"moe_intermediate_size\": 128, \"n_shared_experts\": 1,"
             " \"max_position_embeddings\": %d, \"initializer_range\": 0.02,"
             " \"param_sink_number\": %d, \"dsa_layers\": [0], \"index_topk\": %d,"
             " \"index_n_heads\": 2, \"index_head_dim\": 32}",
             H, DN, DR, DV, T, NS, K);
    prl_config cfg;
    prl_status rc = prl_config_parse(&cfg, json, "bench dsa");
    if (rc == PRL_OK) rc = prl_model_init(m, &cfg);
    if (rc == PRL_OK) prl_model_init_weights(m, seed);
    return rc;
}

/* Seconds of one forward + backward of m on batch b, the attention masked or sparse. */
static double time_layer(prl_model *m, const prl_batch *b, int masked, prl_status *rc)
{
    m->dsa_masked_reference = masked;
    double t0 = prl_now();
    prl_model_zero_grad(m);
    if (!*rc) *rc = prl_model_forward(m, b, NULL, NULL);
    if (!*rc) *rc = prl_model_backward(m, b);
    return prl_now() - t0;
}

/* The comma-separated lengths of --seq into T[]; their number, or 0 when one is bad. */
static int parse_seqs(const char *s, int *T)
{
    int n = 0;
    while (*s && n < MAX_SEQS) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 2 || v > 1 << 16 || (*end && *end != ',')) return 0;
        T[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return *s ? 0 : n;
}

/* Medians over the rounds of: attention masked, sparse, causal; layer masked, sparse. */
static prl_status bench_length(const dsa_args *a, int T, double med[5])
{
    att_case c;
    case_init(&c, T, a->topk, a->seed);
    prl_model m;
    prl_status rc = layer_model(&m, T, a->topk, a->seed);
    if (rc) {
        case_free(&c);
        return rc;
    }
    int32_t *tok = malloc((size_t)T * sizeof *tok), *tgt = malloc((size_t)T * sizeof *tgt);
    float *w = malloc((size_t)T * sizeof *w);
    prl_rng r;
    prl_rng_init(&r, a->seed, 1, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)(prl_rng_u64(&r) % 512);
    for (int i = 0; i < T; i++)
        tgt[i] = i + 1 < T ? tok[i + 1] : -1, w[i] = i + 1 < T ? -1.0f / (float)(T - 1) : 0;
    prl_batch b = {.B = 1, .T = T, .tokens = tok, .targets = tgt, .weights = w, .temperature = 1};
    double t[5][16];
    time_attention(&c, 1), time_layer(&m, &b, 0, &rc); /* warm-up: buffers, packing */
    for (int k = 0; k < a->rounds && rc == PRL_OK; k++) {
        for (int mode = 0; mode < 3; mode++) t[mode][k] = time_attention(&c, mode);
        t[3][k] = time_layer(&m, &b, 1, &rc);
        t[4][k] = time_layer(&m, &b, 0, &rc);
        fprintf(stderr, "bench: T %d round %d/%d done\n", T, k + 1, a->rounds);
    }
    for (int i = 0; i < 5; i++) med[i] = bench_median(t[i], a->rounds);
    free(tok), free(tgt), free(w);
    prl_model_free(&m);
    case_free(&c);
    return rc;
}

int cmd_bench_dsa(int argc, char **argv)
{
    dsa_args a = {.seqs = "512,2048,4096", .topk = 256, .rounds = 3, .seed = 1};
    cli_opt opts[] = {
        {"seq", OPT_STR, &a.seqs, "T,T,..", "sequence lengths (default 512,2048,4096)", 0, 0},
        {"topk", OPT_INT, &a.topk, "K", "keys selected per query row (default 256)", 0, 0},
        {"rounds", OPT_INT, &a.rounds, "R", "alternating rounds, medians over them (default 3)", 0,
         0},
        {"threads", OPT_INT, &a.threads, "N", "threads (default: all CPUs)", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "seed (default 1)", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl bench dsa [--seq 512,2048,4096] [--topk K]",
                       "Times DSA's sparse attention kernel against the masked dense kernel (its "
                       "naive reference) and causal attention, alone and in a one-layer model "
                       "step, at each sequence length; prints medians and ratios.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    int T[MAX_SEQS], n = parse_seqs(a.seqs, T);
    if (!n) return cli_failf("bench", 2, "--seq: comma-separated lengths 2..65536, at most 8");
    if (a.topk < 1 || a.rounds < 1 || a.rounds > 16)
        return cli_failf("bench", 2, "--topk must be >= 1, --rounds 1..16");
    if (cli_setup_blas("bench", a.threads)) return 1;
    printf("DSA sparse stage, top-%d, heads %d x (%d+%d | %d), %d sinks, threads %d, medians of "
           "%d rounds (seconds, forward + backward)\n",
           a.topk, H, DN, DR, DV, NS, prl_blas_threads(), a.rounds);
    printf("%6s | %9s %9s %9s %8s %8s | %9s %9s %8s\n", "T", "masked", "sparse", "causal",
           "mask/sp", "caus/sp", "layer-msk", "layer-sp", "msk/sp");
    for (int i = 0; i < n; i++) {
        double m[5];
        if (bench_length(&a, T[i], m)) return cli_fail("bench");
        printf("%6d | %9.4f %9.4f %9.4f %7.2fx %7.2fx | %9.4f %9.4f %7.2fx\n", T[i], m[0], m[1],
               m[2], m[0] / m[1], m[2] / m[1], m[3], m[4], m[3] / m[4]);
        fflush(stdout);
    }
    return 0;
}
