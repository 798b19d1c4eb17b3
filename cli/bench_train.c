/*
** bench_train.c — `prl bench train`: prl's full training step against the PyTorch reference.
**
** One run measures, side by side and with the same config, batch, thread count and BLAS
** core, in alternating rounds: (1) the GEMM rate this machine gives prl (a 1024³ GEMM through
** prl's pool, with OpenBLAS's sgemm and with prl's GEMM), (2) prl's full training step
** (zero-grad, forward, backward, AdamW), (3) the reference's training step
** (reference/pangu_ref.py bench, a child process). It prints medians, tokens/s, the
** prl/PyTorch ratio, and prl's tokens/s as a share of the limit the sgemm rate sets (the
** step's GEMM FLOPs at that rate), each against the goal (2x, 70 %).
*/
#include "cli/bench.h"
#include "engine/ops.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct train_args {
    const char *config, *python, *reference;
    int batch, seq, steps, warmup, rounds, threads, json, no_reference;
    uint64_t seed;
} train_args;

/* C[1024,1024] = A·Bᵀ in row blocks of 128 on prl's pool, through prl's GEMM (what the engine
** runs) or OpenBLAS's sgemm (the machine's reference rate). */
typedef struct rate_ctx {
    const float *A, *B;
    float *C;
    int openblas;
} rate_ctx;

enum { RATE_S = 1024, RATE_REPS = 3 /* GEMM-rate samples per round */ };

static void rate_task(void *p, int blk)
{
    rate_ctx *c = p;
    size_t off = (size_t)blk * PRL_ROW_BLOCK * RATE_S;
    if (c->openblas)
        prl_sgemm(0, 1, PRL_ROW_BLOCK, RATE_S, RATE_S, 1, c->A + off, RATE_S, c->B, RATE_S, 0,
                  c->C + off, RATE_S);
    else
        prl_gemm_f32(0, 1, PRL_ROW_BLOCK, RATE_S, RATE_S, 1, c->A + off, RATE_S, c->B, RATE_S, 0,
                     c->C + off, RATE_S);
}

/* GFLOP/s of reps runs into t[0..reps) (after one untimed run). */
static void gemm_rate(int reps, int openblas, double *t)
{
    size_t n = (size_t)RATE_S * RATE_S;
    float *A = malloc(sizeof(float) * n), *B = malloc(sizeof(float) * n),
          *C = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) A[i] = (float)((i % 7) * 0.01), B[i] = (float)((i % 5) * 0.02);
    rate_ctx c = {.A = A, .B = B, .C = C, .openblas = openblas};
    prl_parallel_for(RATE_S / PRL_ROW_BLOCK, rate_task, &c); /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = prl_now();
        prl_parallel_for(RATE_S / PRL_ROW_BLOCK, rate_task, &c);
        t[r] = 2.0 * RATE_S * RATE_S * RATE_S / (prl_now() - t0) / 1e9;
    }
    free(A), free(B), free(C);
}

/* Floating-point operations of one training step as prl computes it (GEMMs only; the MoE
** counted at K experts per token, attention over the causal blocks it multiplies). */
static double step_flops(const prl_config *c, int B, int T)
{
    double d = c->hidden_size, H = c->num_attention_heads,
           dq = c->qk_nope_head_dim + c->qk_rope_head_dim, dv = c->v_head_dim, rq = c->q_lora_rank,
           rkv = c->kv_lora_rank, dr = c->qk_rope_head_dim,
           dkv = c->qk_nope_head_dim + c->v_head_dim;
    double q = rq > 0 ? rq * d + H * dq * rq : H * dq * d; /* q_lora_rank null: q_proj */
    double attn = q + (rkv + dr) * d + H * dkv * rkv + d * H * dv;
    double per_token = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        per_token += attn;
        if (!prl_config_is_moe(c, l)) per_token += 3 * d * c->intermediate_size;
        else
            per_token += c->n_routed_experts * d +
                         (double)c->num_experts_per_tok * 3 * d * c->moe_intermediate_size +
                         3 * d * (double)c->n_shared_experts * c->moe_intermediate_size;
    }
    per_token += (double)c->vocab_size * d;
    double tokens = (double)B * T;
    /* causal attention in query blocks: block [r0, r1) multiplies against keys [0, r1) */
    double pairs = 0;
    for (int r0 = 0; r0 < T; r0 += PRL_ATT_BLOCK) {
        int r1 = r0 + PRL_ATT_BLOCK < T ? r0 + PRL_ATT_BLOCK : T;
        pairs += (double)(r1 - r0) * r1;
    }
    double attention = 6.0 * pairs * (dq + dv) * B * H * c->num_hidden_layers;
    return 6 * per_token * tokens + attention;
}

/* Seconds of each timed training step of prl (AdamW, as the reference) into t[0..steps). */
static prl_status time_prl(const prl_config *cfg, const train_args *a, double *t)
{
    prl_model m;
    prl_optim o;
    prl_status rc = prl_model_init(&m, cfg);
    if (rc) return rc;
    prl_model_init_weights(&m, a->seed);
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.kind = PRL_OPTIM_ADAMW;
    oc.schedule = PRL_LR_CONSTANT;
    oc.warmup_steps = 0;
    oc.lr = 1e-4;
    oc.grad_clip = 0;
    if ((rc = prl_optim_init(&o, &m, &oc))) {
        prl_model_free(&m);
        return rc;
    }
    int N = a->batch * a->seq;
    int32_t *tok = malloc((size_t)N * sizeof *tok), *tgt = malloc((size_t)N * sizeof *tgt);
    float *w = malloc((size_t)N * sizeof *w);
    prl_rng r;
    prl_rng_init(&r, a->seed, 0, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(prl_rng_u64(&r) % (uint64_t)cfg->vocab_size);
    for (int i = 0; i < N; i++) {
        tgt[i] = (i + 1) % a->seq ? tok[i + 1] : -1;
        w[i] = tgt[i] >= 0 ? -1.0f / (float)(N - a->batch) : 0;
    }
    prl_batch b =
        {.B = a->batch, .T = a->seq, .tokens = tok, .targets = tgt, .weights = w, .temperature = 1};
    for (int s = 0; rc == PRL_OK && s < a->warmup + a->steps; s++) {
        double t0 = prl_now();
        prl_model_zero_grad(&m);
        rc = prl_model_forward(&m, &b, NULL, NULL);
        if (rc == PRL_OK) rc = prl_model_backward(&m, &b);
        if (rc == PRL_OK) rc = prl_optim_step(&o, &m, NULL);
        if (s >= a->warmup) t[s - a->warmup] = prl_now() - t0;
    }
    free(tok), free(tgt), free(w);
    prl_optim_free(&o);
    prl_model_free(&m);
    return rc;
}

/* Run the PyTorch reference's bench as a child process; its per-step seconds into
** t[0..steps). */
static prl_status time_reference(const train_args *a, double *t, char *info, size_t info_n)
{
    json_t *root;
    char *out;
    prl_status rc =
        bench_reference(a->python, a->reference, &root, &out,
                        "bench --config '%s' --batch %d --seq %d --threads %d --steps %d "
                        "--warmup %d --seed %llu --json",
                        a->config, a->batch, a->seq, prl_blas_threads(), a->steps, a->warmup,
                        (unsigned long long)a->seed);
    if (rc) return rc;
    json_t *v = root ? json_object_get(root, "step_s_all") : NULL;
    if (!json_is_array(v) || json_array_size(v) != (size_t)a->steps) {
        json_decref(root);
        rc = prl_error_set(PRL_ERR_FORMAT, "reference output lacks %d step times: %.200s", a->steps,
                           out);
        free(out);
        return rc;
    }
    free(out);
    for (int i = 0; i < a->steps; i++) t[i] = json_number_value(json_array_get(v, (size_t)i));
    json_t *ver = json_object_get(root, "torch");
    snprintf(info, info_n, "torch %s", json_is_string(ver) ? json_string_value(ver) : "?");
    json_decref(root);
    return PRL_OK;
}

int cmd_bench_train(int argc, char **argv)
{
    train_args a = {.config = PRL_SOURCE_DIR "/configs/models/tiny.json",
                    .python = "/usr/bin/python3",
                    .reference = PRL_SOURCE_DIR "/reference/pangu_ref.py",
                    .batch = 8,
                    .seq = 256,
                    .steps = 5,
                    .warmup = 2,
                    .rounds = 3,
                    .seed = 1};
    cli_opt opts[] = {
        {"config", OPT_STR, &a.config, "CONFIG", "model config (default configs/models/tiny.json)",
         0, 0},
        {"batch", OPT_INT, &a.batch, "B", "sequences per step (default 8)", 0, 0},
        {"seq", OPT_INT, &a.seq, "T", "tokens per sequence (default 256)", 0, 0},
        {"steps", OPT_INT, &a.steps, "N", "timed steps per engine and round (default 5)", 0, 0},
        {"rounds", OPT_INT, &a.rounds, "R", "alternating prl/reference rounds (default 3)", 0, 0},
        {"warmup", OPT_INT, &a.warmup, "N", "untimed warm-up steps (default 2)", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads for both engines (default: all CPUs)", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "seed (default 1)", 0, 0},
        {"python", OPT_STR, &a.python, "PATH", "python with torch (default /usr/bin/python3)", 0,
         0},
        {"reference", OPT_STR, &a.reference, "FILE",
         "reference script (default reference/pangu_ref.py)", 0, 0},
        {"no-reference", OPT_FLAG, &a.no_reference, NULL, "time prl only", 0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts,
                       "prl bench train [--config CONFIG] [--batch B --seq T] [--json]",
                       "Times a full training step (forward, backward, AdamW) of prl and of the "
                       "PyTorch reference on the same config, batch, threads and BLAS core; "
                       "samples the sgemm rate in every round and reports prl's share of the "
                       "tokens/s that rate allows.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (a.batch < 1 || a.seq < 2 || a.steps < 1 || a.warmup < 0 || a.rounds < 1)
        return cli_failf("bench", 2,
                         "--batch, --steps, --rounds must be >= 1, --seq >= 2, --warmup >= 0");
    if (cli_setup_blas("bench", a.threads)) return 1;
    prl_config cfg;
    if (prl_config_load(&cfg, a.config)) return cli_fail("bench");
    /* Rounds alternate the GEMM rate, prl and the reference, so drift in the machine's speed
    ** (it is shared) hits all three alike; medians are over all samples of all rounds. */
    int n = a.rounds * a.steps, nr = a.rounds * RATE_REPS;
    double *prl_t = calloc((size_t)n, sizeof *prl_t), *ref_t = calloc((size_t)n, sizeof *ref_t);
    double *peak_t = calloc((size_t)nr, sizeof *peak_t), *own_t = calloc((size_t)nr, sizeof *own_t);
    char info[128] = "skipped";
    for (int r = 0; r < a.rounds; r++) {
        gemm_rate(RATE_REPS, 1, peak_t + r * RATE_REPS);
        gemm_rate(RATE_REPS, 0, own_t + r * RATE_REPS);
        fprintf(stderr, "bench: round %d/%d GEMM rate done\n", r + 1, a.rounds);
        if (time_prl(&cfg, &a, prl_t + r * a.steps)) return cli_fail("bench");
        fprintf(stderr, "bench: round %d/%d prl done\n", r + 1, a.rounds);
        if (a.no_reference) continue;
        if (time_reference(&a, ref_t + r * a.steps, info, sizeof info)) return cli_fail("bench");
        fprintf(stderr, "bench: round %d/%d reference done\n", r + 1, a.rounds);
    }
    double prl_s = bench_median(prl_t, n), ref_s = a.no_reference ? 0 : bench_median(ref_t, n);
    double peak = bench_median(peak_t, nr), own = bench_median(own_t, nr);
    free(prl_t), free(ref_t), free(peak_t), free(own_t);
    double tokens = (double)a.batch * a.seq, flops = step_flops(&cfg, a.batch, a.seq);
    double prl_tps = tokens / prl_s, gflops = flops / prl_s / 1e9;
    /* the tokens/s prl would reach if its whole step ran at the sgemm rate */
    double limit_tps = tokens / (flops / (peak * 1e9)), share = prl_tps / limit_tps;
    fprintf(stderr, "bench: prl step %.3f s, reference step %.3f s (medians of %d steps)\n", prl_s,
            ref_s, n);
    double ref_tps = ref_s > 0 ? tokens / ref_s : 0, ratio = ref_tps > 0 ? prl_tps / ref_tps : 0;
    if (a.json) {
        printf(
            "{\"config\": \"%s\", \"batch\": %d, \"seq\": %d, \"threads\": %d, \"blas_core\": "
            "\"%s\", "
            "\"sgemm_gflops\": %.2f, \"prl_gemm_gflops\": %.2f, \"step_gflop\": %.3f, "
            "\"prl_step_s\": %.5f, \"prl_tokens_per_s\": %.1f, "
            "\"prl_gflops\": %.2f, \"prl_share_of_sgemm\": %.4f, \"sgemm_limit_tokens_per_s\": "
            "%.1f, \"torch_step_s\": %.5f, "
            "\"torch_tokens_per_s\": %.1f, \"ratio_prl_over_torch\": %.3f, \"reference\": \"%s\", "
            "\"steps_timed\": %d, \"gemm_rate_samples\": %d}\n",
            a.config, a.batch, a.seq, prl_blas_threads(), prl_blas_core(), peak, own, flops / 1e9,
            prl_s, prl_tps, gflops, share, limit_tps, ref_s, ref_tps, ratio, info, n, nr);
    } else {
        printf("config %s, batch %d x %d, threads %d, blas %s\n", a.config, a.batch, a.seq,
               prl_blas_threads(), prl_blas_core());
        printf("  GEMM 1024^3 on the pool (medians of %d, %d per round): OpenBLAS sgemm %.1f "
               "GFLOP/s, prl's GEMM %.1f GFLOP/s\n",
               nr, RATE_REPS, peak, own);
        printf("  prl      %8.1f tokens/s   %.3f s/step   %.1f GFLOP/s\n", prl_tps, prl_s, gflops);
        printf("  limit    %8.1f tokens/s   (the step's GEMM FLOPs at the sgemm rate)\n",
               limit_tps);
        printf("  share of the limit = %.1f%%   (goal >= 70%%: %s)\n", 100 * share,
               share >= 0.70 ? "PASS" : "MISS");
        if (ref_tps > 0)
            printf("  pytorch  %8.1f tokens/s   %.3f s/step   (%s)\n  ratio prl/pytorch = %.2fx   "
                   "(goal >= 2x: %s)\n",
                   ref_tps, ref_s, info, ratio, ratio >= 2 ? "PASS" : "MISS");
    }
    return 0;
}
