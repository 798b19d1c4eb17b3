/*
** cmd_bench.c — `prl bench train` and `prl bench decode`: prl against the PyTorch reference;
** `prl bench sandbox`: sandboxed executions per second against a bare spawn;
** `prl bench pipeline`: `prl run` of one job in sync and in async mode, stage times from run.db.
**
** bench decode: greedy KV-cached generation of the same prompts (random token ids from the
** seed, written to a file both engines read) at each batch size, prl's infer path against
** reference/pangu_ref.py bench-decode with the same config, weights, threads, BLAS core and
** MLA form; prefill and decode timed apart (prl's prefill is a run with one new token),
** medians over rounds, decode tokens/s and their ratio, KV-cache bytes per token, and the
** caches as allocated at contexts 64..512 (whole-context, DSA indexer, SWA rings).
**
** One run measures, side by side and with the same config, batch, thread count and BLAS
** core: (1) the GEMM rate this machine gives prl (a 1024³ GEMM through prl's pool, with
** prl's GEMM and with OpenBLAS's sgemm), (2)
** prl's full training step (zero-grad, forward, backward, AdamW), (3) the reference's
** training step (reference/pangu_ref.py bench, a child process). It prints medians, tokens/s,
** the prl/PyTorch ratio and prl's achieved GFLOP/s as a share of the measured OpenBLAS rate.
*/
#include "cli/cli.h"
#include "engine/ops.h"
#include "sandbox/sandbox.h"
#include "store/store.h"

#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PRL_SOURCE_DIR
#define PRL_SOURCE_DIR "."
#endif

typedef struct bench_args {
    const char *config, *python, *reference;
    int batch, seq, steps, warmup, rounds, threads, json, no_reference;
    uint64_t seed;
} bench_args;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* C[1024,1024] = A·Bᵀ in row blocks of 128 on prl's pool, through prl's GEMM (what the engine
** runs) or OpenBLAS's sgemm (the machine's reference rate). */
typedef struct rate_ctx {
    const float *A, *B;
    float *C;
    int openblas;
} rate_ctx;

enum { RATE_S = 1024 };

static void rate_task(void *p, int blk)
{
    rate_ctx *c = p;
    size_t off = (size_t)blk * PRL_ROW_BLOCK * RATE_S;
    if (c->openblas)
        prl_sgemm(0, 1, PRL_ROW_BLOCK, RATE_S, RATE_S, 1, c->A + off, RATE_S, c->B, RATE_S, 0, c->C + off, RATE_S);
    else
        prl_gemm_f32(0, 1, PRL_ROW_BLOCK, RATE_S, RATE_S, 1, c->A + off, RATE_S, c->B, RATE_S, 0, c->C + off, RATE_S);
}

/* Median GFLOP/s over reps runs. */
static double gemm_rate(int reps, int openblas)
{
    size_t n = (size_t)RATE_S * RATE_S;
    float *A = malloc(sizeof(float) * n), *B = malloc(sizeof(float) * n), *C = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) A[i] = (float)((i % 7) * 0.01), B[i] = (float)((i % 5) * 0.02);
    double *t = malloc(sizeof(double) * (size_t)reps);
    rate_ctx c = {.A = A, .B = B, .C = C, .openblas = openblas};
    prl_parallel_for(RATE_S / PRL_ROW_BLOCK, rate_task, &c); /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = prl_now();
        prl_parallel_for(RATE_S / PRL_ROW_BLOCK, rate_task, &c);
        t[r] = 2.0 * RATE_S * RATE_S * RATE_S / (prl_now() - t0) / 1e9;
    }
    double med = median(t, reps);
    free(A), free(B), free(C), free(t);
    return med;
}

/* Floating-point operations of one training step as prl computes it (GEMMs only; the MoE
** counted at K experts per token, attention over the causal blocks it multiplies). */
static double step_flops(const prl_config *c, int B, int T)
{
    double d = c->hidden_size, H = c->num_attention_heads, dq = c->qk_nope_head_dim + c->qk_rope_head_dim,
           dv = c->v_head_dim, rq = c->q_lora_rank, rkv = c->kv_lora_rank, dr = c->qk_rope_head_dim,
           dkv = c->qk_nope_head_dim + c->v_head_dim;
    double attn = rq * d + H * dq * rq + (rkv + dr) * d + H * dkv * rkv + d * H * dv;
    double per_token = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        per_token += attn;
        if (l < c->first_k_dense_replace) per_token += 3 * d * c->intermediate_size;
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
static prl_status time_prl(const prl_config *cfg, const bench_args *a, double *t)
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
    prl_batch b = {.B = a->batch, .T = a->seq, .tokens = tok, .targets = tgt, .weights = w, .temperature = 1};
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
static prl_status time_reference(const bench_args *a, double *t, char *info, size_t info_n)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "OPENBLAS_CORETYPE='%s' OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d '%s' '%s' bench "
             "--config '%s' --batch %d --seq %d --threads %d --steps %d --warmup %d --seed %llu --json",
             prl_blas_core(), prl_blas_threads(), prl_blas_threads(), a->python, a->reference, a->config, a->batch,
             a->seq, prl_blas_threads(), a->steps, a->warmup, (unsigned long long)a->seed);
    FILE *p = popen(cmd, "r");
    if (!p) return prl_error_set(PRL_ERR_IO, "cannot run the reference: %s", cmd);
    char out[65536];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int status = pclose(p);
    if (status != 0)
        return prl_error_set(PRL_ERR_IO, "the PyTorch reference failed (exit %d): %s", status, cmd);
    json_error_t err;
    json_t *root = json_loads(strchr(out, '{') ? strchr(out, '{') : out, JSON_DISABLE_EOF_CHECK, &err);
    json_t *v = root ? json_object_get(root, "step_s_all") : NULL;
    if (!json_is_array(v) || json_array_size(v) != (size_t)a->steps) {
        json_decref(root);
        return prl_error_set(PRL_ERR_FORMAT, "reference output lacks %d step times: %.200s", a->steps, out);
    }
    for (int i = 0; i < a->steps; i++) t[i] = json_number_value(json_array_get(v, (size_t)i));
    json_t *ver = json_object_get(root, "torch");
    snprintf(info, info_n, "torch %s", json_is_string(ver) ? json_string_value(ver) : "?");
    json_decref(root);
    return PRL_OK;
}

static int bench_train(int argc, char **argv)
{
    bench_args a = {.config = PRL_SOURCE_DIR "/configs/models/tiny.json", .python = "/usr/bin/python3",
                    .reference = PRL_SOURCE_DIR "/reference/pangu_ref.py", .batch = 8, .seq = 256,
                    .steps = 5, .warmup = 2, .rounds = 3, .seed = 1};
    cli_opt opts[] = {
        {"config", OPT_STR, &a.config, "CONFIG", "model config (default configs/models/tiny.json)", 0, 0},
        {"batch", OPT_INT, &a.batch, "B", "sequences per step (default 8)", 0, 0},
        {"seq", OPT_INT, &a.seq, "T", "tokens per sequence (default 256)", 0, 0},
        {"steps", OPT_INT, &a.steps, "N", "timed steps per engine and round (default 5)", 0, 0},
        {"rounds", OPT_INT, &a.rounds, "R", "alternating prl/reference rounds (default 3)", 0, 0},
        {"warmup", OPT_INT, &a.warmup, "N", "untimed warm-up steps (default 2)", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads for both engines (default: all CPUs)", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "seed (default 1)", 0, 0},
        {"python", OPT_STR, &a.python, "PATH", "python with torch (default /usr/bin/python3)", 0, 0},
        {"reference", OPT_STR, &a.reference, "FILE", "reference script (default reference/pangu_ref.py)", 0, 0},
        {"no-reference", OPT_FLAG, &a.no_reference, NULL, "time prl only", 0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl bench train [--config CONFIG] [--batch B --seq T] [--json]",
                       "Times a full training step (forward, backward, AdamW) of prl and of the "
                       "PyTorch reference on the same config, batch, threads and BLAS core.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (a.batch < 1 || a.seq < 2 || a.steps < 1 || a.warmup < 0 || a.rounds < 1)
        return cli_failf("bench", 2, "--batch, --steps, --rounds must be >= 1, --seq >= 2, --warmup >= 0");
    if (cli_setup_blas("bench", a.threads)) return 1;
    prl_config cfg;
    if (prl_config_load(&cfg, a.config)) return cli_fail("bench");
    double peak = gemm_rate(9, 1), own = gemm_rate(9, 0);
    fprintf(stderr, "bench: 1024^3 GEMM on prl's pool: OpenBLAS sgemm %.1f GFLOP/s, prl's GEMM "
            "%.1f GFLOP/s (medians of 9)\n", peak, own);
    /* Rounds alternate the two engines, so drift in the machine's speed (it is shared)
    ** hits both alike; medians are over all timed steps of all rounds. */
    int n = a.rounds * a.steps;
    double *prl_t = calloc((size_t)n, sizeof *prl_t), *ref_t = calloc((size_t)n, sizeof *ref_t);
    char info[128] = "skipped";
    for (int r = 0; r < a.rounds; r++) {
        if (time_prl(&cfg, &a, prl_t + r * a.steps)) return cli_fail("bench");
        fprintf(stderr, "bench: round %d/%d prl done\n", r + 1, a.rounds);
        if (a.no_reference) continue;
        if (time_reference(&a, ref_t + r * a.steps, info, sizeof info)) return cli_fail("bench");
        fprintf(stderr, "bench: round %d/%d reference done\n", r + 1, a.rounds);
    }
    double prl_s = median(prl_t, n), ref_s = a.no_reference ? 0 : median(ref_t, n);
    free(prl_t), free(ref_t);
    double tokens = (double)a.batch * a.seq, flops = step_flops(&cfg, a.batch, a.seq);
    double prl_tps = tokens / prl_s, gflops = flops / prl_s / 1e9;
    fprintf(stderr, "bench: prl step %.3f s, reference step %.3f s (medians of %d steps)\n", prl_s,
            ref_s, n);
    double ref_tps = ref_s > 0 ? tokens / ref_s : 0;
    if (a.json) {
        printf("{\"config\": \"%s\", \"batch\": %d, \"seq\": %d, \"threads\": %d, \"blas_core\": \"%s\", "
               "\"sgemm_gflops\": %.2f, \"prl_gemm_gflops\": %.2f, \"step_gflop\": %.3f, \"prl_step_s\": %.5f, \"prl_tokens_per_s\": %.1f, "
               "\"prl_gflops\": %.2f, \"prl_share_of_sgemm\": %.4f, \"torch_step_s\": %.5f, "
               "\"torch_tokens_per_s\": %.1f, \"ratio_prl_over_torch\": %.3f, \"reference\": \"%s\", "
               "\"steps_timed\": %d}\n",
               a.config, a.batch, a.seq, prl_blas_threads(), prl_blas_core(), peak, own, flops / 1e9, prl_s,
               prl_tps, gflops, gflops / peak, ref_s, ref_tps, ref_tps > 0 ? prl_tps / ref_tps : 0, info, n);
    } else {
        printf("config %s, batch %d x %d, threads %d, blas %s\n", a.config, a.batch, a.seq,
               prl_blas_threads(), prl_blas_core());
        printf("  GEMM 1024^3 on the pool: OpenBLAS sgemm %.1f GFLOP/s, prl's GEMM %.1f GFLOP/s\n", peak, own);
        printf("  prl      %8.1f tokens/s   %.3f s/step   %.1f GFLOP/s = %.0f%% of sgemm\n", prl_tps,
               prl_s, gflops, 100 * gflops / peak);
        if (ref_tps > 0)
            printf("  pytorch  %8.1f tokens/s   %.3f s/step   (%s)\n  ratio prl/pytorch = %.2fx\n",
                   ref_tps, ref_s, info, prl_tps / ref_tps);
    }
    return 0;
}

/* ------------------------------------------------------------------ bench decode ---- */

typedef struct decode_args {
    const char *config, *ckpt, *python, *reference, *batches, *precision, *mla, *matmul;
    int prompt_len, new_tokens, rounds, warmup, threads, json, no_reference;
    int spec; /* > 0: also time self-speculative decoding with this many MTP drafts */
    int spec_vocab; /* > 0: the drafts' head covers ids [0, spec_vocab) */
    const char *prompts; /* JSONL of real prompts (generate's formats) instead of random ids */
    double temperature;  /* 0 = greedy */
    uint64_t seed;
} decode_args;

/* What one timed generation runs: the requests (all decoded with max_batch = the batch size)
** and the sampler. Random prompts: greedy, stops off, every sequence makes new_tokens. Real
** prompts (--prompts): stops at <|eos|> / <|end|>, so sequences end where the model ends them
** and acceptance is measured on the text the model really writes. */
typedef struct decode_run {
    prl_gen_request *q;
    int n;
    prl_sample_params sp;
    int32_t stop_ids[2];
} decode_run;

typedef struct decode_result {
    int batch;
    double prl_prefill, prl_decode, ref_prefill, ref_decode;
    int greedy_agree; /* leading tokens of sequence 0 equal in both engines */
    size_t ref_kv_bytes;
    char ref_info[64];
    double spec_decode, spec_speedup; /* speculative: median decode time, median of the
                                      ** per-round plain/speculative decode-time ratios */
    prl_spec_stats spec;              /* counters over the timed rounds */
    prl_spec_stats plain;             /* the plain engine's passes over the same rounds */
    int spec_agree;                   /* leading tokens of sequence 0 equal to plain greedy's */
    long plain_tokens, spec_tokens;   /* decode tokens of one round (the last), all sequences */
    long spec_equal;                  /* tokens equal to plain's at the same place, all sequences */
    int n_seq;                        /* sequences per round */
} decode_result;

/* Seconds of prl's generation of at most n_new tokens for every request of `run`; *decoded
** (may be NULL) gets the tokens made after each sequence's first (which comes with the
** prefill); tokens (may be NULL) gets sequence i's tokens at [i·n_new ..], lens[i] their
** count. */
static prl_status prl_generate_time(prl_infer *e, const decode_run *run, int n_new, double *seconds,
                                    long *decoded, int32_t *tokens, int *lens)
{
    prl_sample_params sp = run->sp;
    sp.max_new_tokens = n_new;
    sp.stop_ids = run->stop_ids;
    prl_gen_result *r = calloc((size_t)run->n, sizeof *r);
    double t0 = prl_now();
    prl_status rc = prl_infer_generate(e, run->q, run->n, &sp, r, NULL, NULL);
    *seconds = prl_now() - t0;
    if (decoded) *decoded = 0;
    for (int i = 0; rc == PRL_OK && i < run->n; i++) {
        if (decoded) *decoded += r[i].n - 1;
        if (tokens) memcpy(tokens + (size_t)i * n_new, r[i].tokens, (size_t)r[i].n * sizeof *tokens);
        if (lens) lens[i] = r[i].n;
    }
    for (int i = 0; i < run->n; i++) prl_gen_result_free(&r[i]);
    free(r);
    return rc;
}

static prl_status write_prompts(const char *path, int32_t *ids, int B, int P)
{
    FILE *f = fopen(path, "w");
    if (!f) return prl_error_set(PRL_ERR_IO, "cannot write %s: %m", path);
    fputc('[', f);
    for (int b = 0; b < B; b++) {
        fputs(b ? ",[" : "[", f);
        for (int t = 0; t < P; t++) fprintf(f, t ? ",%d" : "%d", ids[b * P + t]);
        fputc(']', f);
    }
    fputs("]\n", f);
    return fclose(f) ? prl_error_set(PRL_ERR_IO, "cannot write %s: %m", path) : PRL_OK;
}

/* The reference's bench-decode on the same checkpoint and prompts. */
static prl_status ref_decode(const decode_args *a, const char *ckpt, const char *prompts,
                             const char *mla, decode_result *d, const int32_t *prl_tokens)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "OPENBLAS_CORETYPE='%s' OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d '%s' '%s' bench-decode "
             "--ckpt '%s' --prompts '%s' --new-tokens %d --threads %d --rounds %d --warmup %d --mla %s --json",
             prl_blas_core(), prl_blas_threads(), prl_blas_threads(), a->python, a->reference, ckpt,
             prompts, a->new_tokens, prl_blas_threads(), a->rounds, a->warmup, mla);
    FILE *p = popen(cmd, "r");
    if (!p) return prl_error_set(PRL_ERR_IO, "cannot run the reference: %s", cmd);
    size_t cap = 1 << 20, n = 0, got;
    char *out = malloc(cap);
    while ((got = fread(out + n, 1, cap - 1 - n, p)) > 0) n += got;
    out[n] = 0;
    int status = pclose(p);
    if (status != 0) {
        free(out);
        return prl_error_set(PRL_ERR_IO, "the PyTorch reference failed (exit %d): %s", status, cmd);
    }
    json_error_t err;
    json_t *root = json_loads(strchr(out, '{') ? strchr(out, '{') : out, JSON_DISABLE_EOF_CHECK, &err);
    free(out);
    json_t *pre = json_object_get(root, "prefill_seconds_median"), *dec = json_object_get(root, "decode_seconds_median");
    if (!json_is_number(pre) || !json_is_number(dec)) {
        json_decref(root);
        return prl_error_set(PRL_ERR_FORMAT, "reference output lacks prefill/decode medians");
    }
    d->ref_prefill = json_number_value(pre), d->ref_decode = json_number_value(dec);
    d->ref_kv_bytes = (size_t)json_integer_value(json_object_get(root, "kv_cache_bytes_per_token"));
    json_t *tok = json_object_get(root, "tokens_first_sequence");
    d->greedy_agree = 0;
    for (size_t i = 0; i < json_array_size(tok) && (int)i < a->new_tokens; i++) {
        if (json_integer_value(json_array_get(tok, i)) != prl_tokens[i]) break;
        d->greedy_agree++;
    }
    json_t *ver = json_object_get(root, "torch_version");
    snprintf(d->ref_info, sizeof d->ref_info, "torch %s", json_is_string(ver) ? json_string_value(ver) : "?");
    json_decref(root);
    return PRL_OK;
}

/* Leading tokens of sequence 0 that two runs share, and tokens equal at the same place over
** every sequence (greedy speculative decoding must give plain decoding's tokens exactly). */
static void tokens_compare(decode_result *d, const int32_t *x, const int *xl, const int32_t *y,
                           const int *yl, int n_seq, int N)
{
    d->spec_agree = 0;
    while (d->spec_agree < xl[0] && d->spec_agree < yl[0] && x[d->spec_agree] == y[d->spec_agree])
        d->spec_agree++;
    d->spec_equal = 0;
    for (int i = 0; i < n_seq; i++)
        for (int t = 0; t < xl[i] && t < yl[i]; t++)
            d->spec_equal += x[(size_t)i * N + t] == y[(size_t)i * N + t];
}

static prl_spec_stats stats_since(const prl_infer *e, prl_spec_stats b)
{
    prl_spec_stats a = prl_infer_spec_stats(e);
    return (prl_spec_stats){.drafted = a.drafted - b.drafted, .accepted = a.accepted - b.accepted,
                            .steps = a.steps - b.steps, .emitted = a.emitted - b.emitted,
                            .passes = a.passes - b.passes, .pass_s = a.pass_s - b.pass_s,
                            .draft_s = a.draft_s - b.draft_s, .verify_s = a.verify_s - b.verify_s,
                            .accept_s = a.accept_s - b.accept_s};
}

/* Speculative decoding (a->spec MTP drafts) against plain decoding on engine `plain`, the
** two timed in alternate rounds (prefill subtracted as above): median decode time, median of
** the per-round ratios of decode tokens/s (with sampling or stops the two may make different
** numbers of tokens), acceptance counters, and whether the tokens are plain's. */
static prl_status bench_spec(const decode_args *a, prl_model *m, prl_infer_options io,
                             prl_infer *plain, const decode_run *run, decode_result *d)
{
    int N = a->new_tokens, n = run->n;
    io.spec_drafts = a->spec, io.spec_draft_vocab = a->spec_vocab;
    prl_infer *e = NULL;
    prl_status rc = prl_infer_init(&e, m, &io);
    double *ps = calloc((size_t)a->rounds, sizeof *ps), *ss = calloc((size_t)a->rounds, sizeof *ss);
    double *ratio = calloc((size_t)a->rounds, sizeof *ratio), pre = 0, all = 0;
    int32_t *want = calloc((size_t)n * N, sizeof *want), *got = calloc((size_t)n * N, sizeof *got);
    int *want_len = calloc((size_t)n, sizeof *want_len), *got_len = calloc((size_t)n, sizeof *got_len);
    for (int w = 0; !rc && w < a->warmup; w++) rc = prl_generate_time(e, run, N, &all, NULL, NULL, NULL);
    prl_spec_stats before = rc ? (prl_spec_stats){0} : prl_infer_spec_stats(e);
    prl_spec_stats plain_before = prl_infer_spec_stats(plain);
    for (int i = 0; !rc && i < a->rounds; i++) {
        long first = 0;
        rc = prl_generate_time(plain, run, 1, &pre, NULL, NULL, NULL);
        if (!rc) rc = prl_generate_time(plain, run, N, &all, &d->plain_tokens, want, want_len);
        ps[i] = all - pre;
        if (!rc) rc = prl_generate_time(e, run, 1, &pre, &first, NULL, NULL);
        if (!rc) rc = prl_generate_time(e, run, N, &all, &d->spec_tokens, got, got_len);
        ss[i] = all - pre;
        ratio[i] = (d->spec_tokens / ss[i]) / (d->plain_tokens / ps[i]);
    }
    if (!rc) {
        d->spec = stats_since(e, before), d->plain = stats_since(plain, plain_before);
        d->spec_decode = median(ss, a->rounds), d->spec_speedup = median(ratio, a->rounds);
        tokens_compare(d, want, want_len, got, got_len, n, N);
    }
    prl_infer_free(e);
    free(ps), free(ss), free(ratio), free(want), free(got), free(want_len), free(got_len);
    return rc;
}

/* The requests of one batch size: B random prompts of prompt_len ids (written to `file` for
** the reference), or every prompt of --prompts. *max_prompt gets the longest. */
static prl_status decode_requests(const decode_args *a, const prl_model *m, const prl_tokenizer *tok,
                                  int B, const char *file, decode_run *run, int32_t **ids,
                                  cli_prompts *pl, int *max_prompt)
{
    prl_sample_params_default(&run->sp);
    run->sp.temperature = a->temperature, run->sp.seed = a->seed;
    run->stop_ids[0] = PRL_TOKEN_EOS, run->stop_ids[1] = PRL_TOKEN_END;
    if (a->prompts) {
        prl_status rc = cli_prompts_read(NULL, a->prompts, 0, tok, pl);
        if (rc) return rc;
        run->n = pl->n, run->sp.n_stop_ids = 2;
        run->sp.vocab_limit = tok ? prl_tokenizer_vocab_size(tok) : 0;
        run->q = calloc((size_t)run->n, sizeof *run->q);
        *max_prompt = 0;
        for (int i = 0; i < run->n; i++) {
            run->q[i] = (prl_gen_request){.prompt = pl->ids[i], .prompt_len = pl->len[i], .seq_id = (uint64_t)i};
            *max_prompt = pl->len[i] > *max_prompt ? pl->len[i] : *max_prompt;
        }
        return PRL_OK;
    }
    int P = a->prompt_len;
    *ids = malloc((size_t)B * P * sizeof **ids);
    prl_rng r;
    prl_rng_init(&r, a->seed, (uint64_t)B, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < B * P; i++) (*ids)[i] = 16 + (int32_t)(prl_rng_u64(&r) % (uint64_t)(m->cfg.vocab_size - 16));
    run->n = B, run->sp.n_stop_ids = 0, *max_prompt = P;
    run->q = calloc((size_t)B, sizeof *run->q);
    for (int b = 0; b < B; b++) run->q[b] = (prl_gen_request){.prompt = *ids + (size_t)b * P, .prompt_len = P, .seq_id = (uint64_t)b};
    return write_prompts(file, *ids, B, P);
}

static prl_status bench_decode_batch(const decode_args *a, prl_model *m, const prl_tokenizer *tok,
                                     const char *ckpt, const char *dir, prl_infer_options io, int B,
                                     decode_result *d)
{
    int N = a->new_tokens, P = 0;
    int32_t *ids = NULL;
    decode_run run = {0};
    cli_prompts pl = {0};
    char prompts[4200];
    snprintf(prompts, sizeof prompts, "%s/prompts-%d.json", dir, B);
    prl_status rc = decode_requests(a, m, tok, B, prompts, &run, &ids, &pl, &P);
    int32_t *tokens = calloc((size_t)run.n * N + 1, sizeof *tokens); /* every sequence's */
    io.max_batch = B, io.max_len = P + N;
    prl_infer *e = NULL;
    if (!rc && io.max_len > m->cfg.max_position_embeddings)
        rc = prl_error_set(PRL_ERR_ARG, "prompt %d + --new-tokens %d exceeds max_position_embeddings %d",
                           P, N, m->cfg.max_position_embeddings);
    if (!rc) rc = prl_infer_init(&e, m, &io);
    double *pre = calloc((size_t)a->rounds, sizeof *pre), *all = calloc((size_t)a->rounds, sizeof *all), t;
    long *dec = calloc((size_t)a->rounds, sizeof *dec);
    for (int w = 0; !rc && w < a->warmup; w++) rc = prl_generate_time(e, &run, N, &t, NULL, NULL, NULL);
    /* prl's rounds straddle the reference's, so drift of the shared machine hits both */
    int half = a->rounds / 2;
    for (int i = 0; !rc && i < half; i++) {
        rc = prl_generate_time(e, &run, 1, &pre[i], NULL, NULL, NULL);
        if (!rc) rc = prl_generate_time(e, &run, N, &all[i], &dec[i], tokens, NULL);
    }
    d->batch = B, d->n_seq = run.n;
    if (!rc && !a->no_reference) rc = ref_decode(a, ckpt, prompts, io.mla == PRL_MLA_NAIVE ? "naive" : "absorbed", d, tokens);
    for (int i = half; !rc && i < a->rounds; i++) {
        rc = prl_generate_time(e, &run, 1, &pre[i], NULL, NULL, NULL);
        if (!rc) rc = prl_generate_time(e, &run, N, &all[i], &dec[i], tokens, NULL);
    }
    if (!rc) {
        d->prl_prefill = median(pre, a->rounds);
        for (int i = 0; i < a->rounds; i++) all[i] -= pre[i];
        d->prl_decode = median(all, a->rounds);
        d->plain_tokens = dec[a->rounds - 1];
    }
    if (!rc && a->spec > 0) rc = bench_spec(a, m, io, e, &run, d);
    prl_infer_free(e);
    free(pre), free(all), free(dec), free(run.q), free(ids), free(tokens);
    cli_prompts_free(&pl);
    return rc;
}

/* The formula of one sequence's cache bytes at an n-token context, from the config alone:
** whole-context layers n × row, DSA indexer keys n × d_I per DSA layer, each sliding-window
** layer min(n, W) × row, where row = r_kv + d_r floats (naive form: + H·(d_n + d_v)). */
static prl_kv_alloc kv_formula_at(const prl_config *c, int naive, int n)
{
    size_t row = ((size_t)(c->kv_lora_rank + c->qk_rope_head_dim) +
                  (naive ? (size_t)c->num_attention_heads * (c->qk_nope_head_dim + c->v_head_dim) : 0)) *
                 sizeof(float);
    prl_kv_alloc f = {.n_dsa = c->n_dsa_layers};
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int W = prl_config_window(c, l);
        if (W > 0) f.ring += (size_t)(W < n ? W : n) * row, f.n_ring++;
        else f.full += (size_t)n * row, f.n_full++;
    }
    f.index = (size_t)n * c->index_head_dim * c->n_dsa_layers * sizeof(float);
    return f;
}

/* Decode memory by context length, measured: for n = 64, 128, 256, 512 (capped at
** max_position_embeddings), an engine with one slot of n rows reports its caches as allocated
** (prl_infer_kv_alloc), split into whole-context layers (DSA indexer keys apart) and
** sliding-window rings; beside them the formula, so a mismatch shows. */
static prl_status print_kv_by_context(const prl_model *m, prl_infer_options io, int json)
{
    const prl_config *c = &m->cfg;
    int naive = io.mla == PRL_MLA_NAIVE;
    const char *row = naive ? "(r_kv + d_r + H(d_n + d_v))" : "(r_kv + d_r)";
    static const int ctxs[] = {64, 128, 256, 512};
    if (json) printf(", \"kv_by_context\": [");
    else printf("  KV cache by context, one sequence, as allocated (formula: whole-context layers "
                "n x %s x layers; indexer n x index_head_dim x DSA layers; SWA min(n, W) x %s x "
                "layers; x 4 bytes):\n  %7s %26s %26s %26s %12s\n", row, row, "context",
                "whole-context [formula]", "DSA indexer [formula]", "SWA rings [formula]", "total");
    for (int i = 0, last = 0; i < 4 && !last; i++) {
        int n = ctxs[i] < c->max_position_embeddings ? ctxs[i] : c->max_position_embeddings;
        last = n == c->max_position_embeddings;
        io.max_batch = 1, io.max_len = n, io.spec_drafts = 0;
        prl_infer *e = NULL;
        prl_status rc = prl_infer_init(&e, m, &io);
        if (rc) return rc;
        prl_kv_alloc a = prl_infer_kv_alloc(e), f = kv_formula_at(c, naive, n);
        prl_infer_free(e);
        size_t total = a.full + a.index + a.ring;
        if (json)
            printf("%s{\"context\": %d, \"whole_context_bytes\": %zu, \"whole_context_layers\": %d, "
                   "\"dsa_index_bytes\": %zu, \"dsa_layers\": %d, \"swa_bytes\": %zu, \"swa_layers\": %d, "
                   "\"total_bytes\": %zu, \"whole_context_formula\": %zu, \"dsa_index_formula\": %zu, "
                   "\"swa_formula\": %zu}", i ? ", " : "", n, a.full, a.n_full, a.index, a.n_dsa,
                   a.ring, a.n_ring, total, f.full, f.index, f.ring);
        else
            printf("  %7d %12zu [%11zu] %12zu [%11zu] %12zu [%11zu] %12zu\n", n, a.full, f.full,
                   a.index, f.index, a.ring, f.ring, total);
    }
    if (json) printf("]");
    return PRL_OK;
}

static int bench_decode(int argc, char **argv)
{
    decode_args a = {.config = PRL_SOURCE_DIR "/configs/models/tiny.json", .python = "/usr/bin/python3",
                     .reference = PRL_SOURCE_DIR "/reference/pangu_ref.py", .batches = "1,16",
                     .prompt_len = 32, .new_tokens = 64, .rounds = 5, .warmup = 1, .seed = 1};
    cli_opt opts[] = {
        {"config", OPT_STR, &a.config, "CONFIG", "model config, random weights (default configs/models/tiny.json)", 0, 0},
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "a checkpoint instead of --config", 0, 0},
        {"batch", OPT_STR, &a.batches, "LIST", "batch sizes, comma-separated (default 1,16)", 0, 0},
        {"prompt-len", OPT_INT, &a.prompt_len, "P", "prompt tokens (default 32)", 0, 0},
        {"new-tokens", OPT_INT, &a.new_tokens, "N", "generated tokens per sequence (default 64)", 0, 0},
        {"rounds", OPT_INT, &a.rounds, "R", "timed generations per engine (default 5)", 0, 0},
        {"warmup", OPT_INT, &a.warmup, "N", "untimed generations first (default 1)", 0, 0},
        {"precision", OPT_STR, &a.precision, "P", "prl's infer preset: fp32 (default), bf16, fp16, aligned", 0, 0},
        {"mla", OPT_STR, &a.mla, "FORM", "absorbed or naive (both engines; default: the preset's)", 0, 0},
        {"matmul", OPT_STR, &a.matmul, "KIND", "prl's matmul kind: gemv, gemm, blas", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads for both engines (default: all CPUs)", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "seed of the weights and prompts (default 1)", 0, 0},
        {"python", OPT_STR, &a.python, "PATH", "python with torch (default /usr/bin/python3)", 0, 0},
        {"reference", OPT_STR, &a.reference, "FILE", "reference script (default reference/pangu_ref.py)", 0, 0},
        {"no-reference", OPT_FLAG, &a.no_reference, NULL, "time prl only", 0, 0},
        {"spec", OPT_INT, &a.spec, "D", "also time self-speculative decoding with D MTP drafts "
         "(needs num_nextn_predict_layers >= D)", 0, 0},
        {"spec-vocab", OPT_INT, &a.spec_vocab, "S", "with --spec: the drafts' head covers token ids "
         "[0, S) only (default 0 = all)", 0, 0},
        {"prompts", OPT_STR, &a.prompts, "FILE", "real prompts: JSONL as prl generate --input (e.g. "
         "prl tasks generate --split eval); every batch size decodes them all, stopping at <|eos|>/<|end|>; "
         "prl only", 0, 0},
        {"temperature", OPT_DOUBLE, &a.temperature, "T", "sampling temperature (default 0 = greedy); "
         "> 0 is prl only", 0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl bench decode [--config CONFIG|--ckpt DIR] [--batch 1,16] [--json]",
                       "Times greedy KV-cached decoding of prl's infer path and of the PyTorch "
                       "reference on the same weights, prompts, threads, BLAS core and MLA form.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (a.prompt_len < 1 || a.new_tokens < 2 || a.rounds < 1 || a.warmup < 0 || a.spec < 0 ||
        !(a.temperature >= 0))
        return cli_failf("bench", 2, "--prompt-len >= 1, --new-tokens >= 2, --rounds >= 1, --warmup >= 0, "
                         "--spec >= 0, --temperature >= 0");
    /* the reference times greedy decoding of equal-length random prompts only */
    if (a.prompts || a.temperature > 0) a.no_reference = 1;
    int batches[16], nb = 0;
    for (const char *p = a.batches; *p && nb < 16;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || (*end && *end != ','))
            return cli_failf("bench", 2, "--batch '%s': expected comma-separated sizes in [1, 256]", a.batches);
        batches[nb++] = (int)v;
        p = *end ? end + 1 : end;
    }
    prl_infer_options io;
    if (prl_infer_options_preset(&io, a.precision ? a.precision : "fp32") ||
        prl_infer_options_set(&io, NULL, a.mla, a.matmul))
        return cli_failf("bench", 2, "%s", prl_error_message());
    if (cli_setup_blas("bench", a.threads)) return 1;
    char dir[] = "/tmp/prl-bench-decode-XXXXXX";
    if (!mkdtemp(dir)) return cli_failf("bench", 1, "cannot make a temporary directory: %m");
    prl_model m;
    prl_tokenizer *tok = NULL;
    const char *ckpt = a.ckpt;
    char made[sizeof dir + 16];
    if (a.ckpt) {
        if (cli_load_checkpoint(a.ckpt, &m, &tok)) return cli_fail("bench");
    } else { /* random weights, saved so the reference reads the very same ones */
        prl_config cfg;
        if (prl_config_load(&cfg, a.config) || prl_model_init(&m, &cfg)) return cli_fail("bench");
        prl_model_init_weights(&m, a.seed);
        snprintf(made, sizeof made, "%s/ckpt", dir);
        if (prl_checkpoint_save(&m, NULL, NULL, NULL, made)) return cli_fail("bench");
        ckpt = made;
    }
    if (!a.prompts && a.prompt_len + a.new_tokens > m.cfg.max_position_embeddings)
        return cli_failf("bench", 2, "--prompt-len + --new-tokens = %d exceeds max_position_embeddings %d",
                         a.prompt_len + a.new_tokens, m.cfg.max_position_embeddings);
    decode_result res[16] = {0};
    for (int i = 0; i < nb; i++) {
        if (bench_decode_batch(&a, &m, tok, ckpt, dir, io, batches[i], &res[i])) return cli_fail("bench");
        fprintf(stderr, "bench: batch %d done\n", batches[i]);
    }
    char desc[128];
    prl_infer_options_describe(&io, desc, sizeof desc);
    io.max_batch = 1, io.max_len = 2;
    prl_infer *probe = NULL;
    if (prl_infer_init(&probe, &m, &io)) return cli_fail("bench");
    int ctx = a.prompt_len + a.new_tokens;
    size_t kv = prl_infer_kv_bytes_per_token(probe), kv_seq = prl_infer_kv_bytes(probe, ctx);
    prl_infer_free(probe);
    const prl_config *c = &m.cfg;
    int full_layers = c->num_hidden_layers - c->n_swa_layers;
    /* a DSA layer also caches its indexer key (index_head_dim floats per token) */
    size_t kv_formula = ((size_t)(c->kv_lora_rank + c->qk_rope_head_dim) * full_layers +
                         (size_t)c->index_head_dim * c->n_dsa_layers) * sizeof(float);
    if (a.json) printf("{\"model\": \"%s\", \"infer\": \"%s\", \"threads\": %d, \"blas_core\": \"%s\", "
                       "\"prompt_len\": %d, \"new_tokens\": %d, \"rounds\": %d, \"kv_bytes_per_token\": %zu, "
                       "\"kv_bytes_formula\": %zu, \"kv_bytes_per_sequence\": %zu",
                       a.ckpt ? a.ckpt : a.config, desc, prl_blas_threads(), prl_blas_core(), a.prompt_len,
                       a.new_tokens, a.rounds, kv, kv_formula, kv_seq);
    else printf("model %s, %s, threads %d, blas %s, prompt %d + %d new tokens, medians of %d rounds\n"
                "  KV cache: %zu bytes/token in the %d whole-context layers (formula ((kv_lora_rank + "
                "qk_rope_head_dim) x those layers + index_head_dim x %d DSA layers) x 4 = %zu); %d "
                "sliding-window layers keep at most W rows; one sequence of %d tokens holds %zu bytes\n",
                a.ckpt ? a.ckpt : a.config, desc, prl_blas_threads(), prl_blas_core(), a.prompt_len,
                a.new_tokens, a.rounds, kv, full_layers, c->n_dsa_layers, kv_formula, c->n_swa_layers,
                ctx, kv_seq);
    if (print_kv_by_context(&m, io, a.json)) return cli_fail("bench");
    if (a.json) printf(", \"results\": [");
    for (int i = 0; i < nb; i++) {
        decode_result *d = &res[i];
        double toks = (double)d->plain_tokens; /* the first token comes with the prefill */
        double prl_tps = toks / d->prl_decode, ref_tps = d->ref_decode > 0 ? (double)d->batch * a.new_tokens / d->ref_decode : 0;
        if (a.json) {
            printf("%s{\"batch\": %d, \"prl_prefill_s\": %.5f, \"prl_decode_s\": %.5f, \"prl_decode_tokens_per_s\": %.1f, "
                   "\"torch_prefill_s\": %.5f, \"torch_decode_s\": %.5f, \"torch_decode_tokens_per_s\": %.1f, "
                   "\"ratio_prl_over_torch\": %.2f, \"torch_kv_bytes_per_token\": %zu, \"greedy_tokens_agree\": %d, "
                   "\"reference\": \"%s\"", i ? ", " : "", d->batch, d->prl_prefill, d->prl_decode, prl_tps,
                   d->ref_prefill, d->ref_decode, ref_tps, ref_tps > 0 ? prl_tps / ref_tps : 0, d->ref_kv_bytes,
                   d->greedy_agree, a.no_reference ? "skipped" : d->ref_info);
            if (a.spec > 0)
                printf(", \"spec_drafts\": %d, \"spec_decode_s\": %.5f, \"spec_decode_tokens_per_s\": %.1f, "
                       "\"spec_speedup_median\": %.3f, \"spec_acceptance\": %.4f, "
                       "\"spec_tokens_per_sequence_step\": %.3f, \"spec_greedy_tokens_agree\": %d, "
                       "\"spec_tokens_equal_plain\": %ld, \"plain_tokens\": %ld, \"sequences\": %d",
                       a.spec, d->spec_decode, d->spec_tokens / d->spec_decode, d->spec_speedup,
                       d->spec.drafted ? (double)d->spec.accepted / d->spec.drafted : 0,
                       d->spec.steps ? (double)d->spec.emitted / d->spec.steps : 0, d->spec_agree,
                       d->spec_equal, d->plain_tokens + d->n_seq, d->n_seq);
            printf("}");
            continue;
        }
        printf("  batch %3d: prl %8.1f tokens/s (prefill %.4f s)", d->batch, prl_tps, d->prl_prefill);
        if (ref_tps > 0)
            printf("   pytorch %8.1f tokens/s (prefill %.4f s)   ratio %.1fx   greedy tokens agree %d/%d",
                   ref_tps, d->ref_prefill, prl_tps / ref_tps, d->greedy_agree, a.new_tokens);
        printf("\n");
        if (a.spec > 0)
            printf("             speculative (%d drafts) %8.1f tokens/s   speed-up %.2fx (median of "
                   "per-round ratios)   acceptance %.1f%% (%ld/%ld drafts)   %.2f tokens per "
                   "sequence step   tokens equal plain's %ld/%ld (%d sequences)\n",
                   a.spec, d->spec_tokens / d->spec_decode, d->spec_speedup,
                   d->spec.drafted ? 100.0 * d->spec.accepted / d->spec.drafted : 0.0,
                   d->spec.accepted, d->spec.drafted,
                   d->spec.steps ? (double)d->spec.emitted / d->spec.steps : 0.0, d->spec_equal,
                   d->plain_tokens + d->n_seq, d->n_seq);
        if (a.spec > 0 && d->spec.passes > 0 && d->plain.passes > 0) {
            double pp = 1e3 * d->plain.pass_s / d->plain.passes, n = (double)d->spec.passes;
            printf("             profile per pass: plain %.3f ms; speculative %.3f ms = %.2fx plain "
                   "(MTP drafts %.3f, verify %.3f, accept %.3f ms)\n", pp, 1e3 * d->spec.pass_s / n,
                   1e3 * d->spec.pass_s / n / pp, 1e3 * d->spec.draft_s / n, 1e3 * d->spec.verify_s / n,
                   1e3 * d->spec.accept_s / n);
        }
    }
    if (a.json) printf("]}\n");
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    return 0;
}

/* ---------------------------------------------------------------- bench sandbox ---- */

/* The bare spawn: fork, execve the same interpreter, argv and clean environment the sandbox
** uses, read stdout to EOF, wait. Returns 0 when it printed "1\n" and exited 0. */
static int bare_spawn(const char *python, const char *file)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return -1;
    const char *argv[] = {python, "-I", "-B", "-u", file, NULL};
    const char *envp[] = {"PATH=/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp", "LANG=C.UTF-8", "USER=sandbox",
                          "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=1",
                          "OPENBLAS_NUM_THREADS=1", NULL};
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        execve(python, (char *const *)argv, (char *const *)envp);
        _exit(127);
    }
    close(p[1]);
    char buf[64];
    size_t n = 0;
    ssize_t got;
    while ((got = read(p[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)got;
    close(p[0]);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0) return -1;
    buf[n] = 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 && !strcmp(buf, "1\n") ? 0 : -1;
}

static int isolated_run(prl_sandbox *sb, const prl_sandbox_request *req)
{
    prl_sandbox_result res;
    prl_status st = prl_sandbox_run(sb, 0, req, &res);
    int ok = st == PRL_OK && res.status == PRL_SANDBOX_STATUS_OK && !strcmp(res.out, "1\n");
    if (!ok) fprintf(stderr, "bench: isolated run failed: %s: %s\n", prl_sandbox_status_name(res.status), res.reason);
    prl_sandbox_result_free(&res);
    return ok ? 0 : -1;
}

/* Runs per second over one round of `secs` seconds. */
static double round_rate(prl_sandbox *sb, const prl_sandbox_request *req, const char *python,
                         const char *file, double secs, int *count)
{
    double t0 = prl_now(), t;
    int n = 0;
    do {
        if ((sb ? isolated_run(sb, req) : bare_spawn(python, file)) != 0) return -1;
        n++;
        t = prl_now();
    } while (t - t0 < secs);
    *count += n;
    return n / (t - t0);
}

static int bench_sandbox(int argc, char **argv)
{
    double seconds = 10, round_s = 0.5;
    int json = 0;
    const char *python = "/usr/bin/python3";
    cli_opt opts[] = {
        {"seconds", OPT_DOUBLE, &seconds, "S", "total measuring time (default 10)", 0, 0},
        {"round", OPT_DOUBLE, &round_s, "S", "length of one round (default 0.5)", 0, 0},
        {"python", OPT_STR, &python, "PATH", "interpreter (default /usr/bin/python3)", 0, 0},
        {"json", OPT_FLAG, &json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl bench sandbox [--seconds S] [--json]",
                       "Executions per second of a trivial python3 program (print(1)) with full isolation "
                       "and with a bare fork/exec+wait, in alternating rounds; medians and their ratio "
                       "(goal: isolated >= 60% of bare).", NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (!(seconds > 0) || !(round_s > 0) || seconds < 2 * round_s)
        return cli_failf("bench", 2, "--seconds must be >= 2 x --round and both positive");
    static const char program[] = "print(1)\n";
    char dir[] = "/tmp/prl-bench-sandbox.XXXXXX", file[64];
    if (!mkdtemp(dir)) return cli_failf("bench", 1, "mkdtemp: %m");
    snprintf(file, sizeof file, "%s/main.py", dir);
    prl_sandbox_caps caps;
    prl_sandbox_options opt;
    prl_sandbox_options_default(&opt);
    prl_sandbox *sb = NULL;
    prl_status st = prl_file_write_sync(file, program, sizeof program - 1);
    if (st == PRL_OK) st = prl_sandbox_probe(&caps);
    opt.caps = &caps;
    opt.python3 = python;
    opt.uid_base = 200000u + (unsigned)getpid(); /* see cmd_sandbox.c */
    if (st == PRL_OK) st = prl_sandbox_init(&sb, &opt);
    if (st) {
        unlink(file), rmdir(dir);
        return cli_fail("bench");
    }
    prl_sandbox_request req = {.lang = "python3", .program = program, .program_len = sizeof program - 1};
    prl_sandbox_limits_default(&req.limits);
    /* Warm both paths (page cache, first cgroup writes), then alternate rounds so drift in
    ** the shared machine's speed hits both alike. */
    int n_iso = 0, n_bare = 0, warm = 0;
    if (round_rate(sb, &req, python, file, 0.2, &warm) < 0 || round_rate(NULL, NULL, python, file, 0.2, &warm) < 0)
        rc = 1;
    int rounds = (int)(seconds / round_s / 2);
    double *iso = calloc((size_t)rounds, sizeof *iso), *bare = calloc((size_t)rounds, sizeof *bare);
    for (int r = 0; rc == 0 && r < rounds; r++) {
        iso[r] = round_rate(sb, &req, python, file, round_s, &n_iso);
        bare[r] = round_rate(NULL, NULL, python, file, round_s, &n_bare);
        if (iso[r] < 0 || bare[r] < 0) rc = 1;
    }
    unsigned layers = prl_sandbox_layers(sb);
    prl_sandbox_free(sb);
    unlink(file), rmdir(dir);
    if (rc) {
        free(iso), free(bare);
        return cli_failf("bench", 1, "a run failed (see above)");
    }
    double mi = median(iso, rounds), mb = median(bare, rounds), ratio = mi / mb;
    free(iso), free(bare);
    const double goal = 0.6;
    if (json) {
        printf("{\"program\": \"print(1)\", \"python\": \"%s\", \"rounds\": %d, \"round_seconds\": %.2f, "
               "\"isolated_runs\": %d, \"bare_runs\": %d, \"isolated_execs_per_s\": %.2f, "
               "\"bare_execs_per_s\": %.2f, \"ratio_isolated_over_bare\": %.3f, \"goal_ratio\": %.2f, "
               "\"goal_met\": %s, \"layers\": [",
               python, rounds, round_s, n_iso, n_bare, mi, mb, ratio, goal, ratio >= goal ? "true" : "false");
        for (int i = 0, first = 1; i < PRL_SANDBOX_N_LAYERS; i++)
            if (layers & (1u << i)) printf("%s\"%s\"", first ? "" : ", ", prl_sandbox_layer_name(1u << i)), first = 0;
        printf("]}\n");
    } else {
        printf("python3 print(1): %d rounds of %.1f s each way, alternating (medians)\n", rounds, round_s);
        printf("  isolated  %7.2f execs/s   (%d runs; layers:", mi, n_iso);
        for (int i = 0; i < PRL_SANDBOX_N_LAYERS; i++)
            if (layers & (1u << i)) printf(" %s", prl_sandbox_layer_name(1u << i));
        printf(")\n  bare      %7.2f execs/s   (%d runs; fork + execve + wait)\n", mb, n_bare);
        printf("  ratio isolated/bare = %.2f   goal >= %.2f: %s\n", ratio, goal, ratio >= goal ? "met" : "NOT met");
    }
    return 0;
}

/* --------------------------------------------------------------- bench pipeline ---- */

typedef struct pipe_args {
    const char *init, *domain;
    int steps, batch, group, max_new, threads, async_threads, skip, rounds, keep, json;
    double lr;
    uint64_t seed;
} pipe_args;

/* One mode's stage times over every measured step of every round. */
typedef struct pipe_mode {
    const char *name;     /* sync | async */
    int threads;          /* of the rollout worker and of the trainer */
    double *roll, *train, *interval;
    int n;
    double roll_m, train_m, interval_m, slowest, ratio;
} pipe_mode;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* The job both modes run: the same seed, prompts and sizes; only mode and threads differ.
** Checkpoints other than the newest few are pruned by the controller as in any run. */
static prl_status pipe_write_job(const pipe_args *a, const char *path, const char *name, const pipe_mode *m)
{
    json_t *job = json_pack("{s:{s:s,s:I},s:{s:s},s:{s:s,s:i},s:{s:i,s:i,s:i,s:i},s:{s:i},s:{s:f},"
                            "s:{s:i,s:s,s:i}}",
                            "run", "name", name, "seed", (json_int_t)a->seed,
                            "model", "init", a->init,
                            "task", "domain", a->domain, "train_problems", 256,
                            "rollout", "batch_prompts", a->batch, "group_size", a->group,
                            "max_new_tokens", a->max_new, "threads", m->threads,
                            "trainer", "threads", m->threads,
                            "optim", "lr", a->lr,
                            "controller", "steps", a->steps, "mode", m->name, "max_lag", 1);
    int bad = !job || json_dump_file(job, path, JSON_INDENT(1));
    json_decref(job);
    return bad ? prl_error_set(PRL_ERR_IO, "cannot write %s", path) : PRL_OK;
}

/* `/proc/self/exe run JOB --runs DIR` with its output in DIR/NAME.log; 0 when it finished. */
static prl_status pipe_run(const char *dir, const char *name)
{
    char job[1200], runs[1200], log[1200];
    snprintf(job, sizeof job, "%s/%s.json", dir, name);
    snprintf(runs, sizeof runs, "%s/runs", dir);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return prl_error_set(PRL_ERR_IO, "cannot write %s: %m", log);
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO);
        execl("/proc/self/exe", "prl", "run", job, "--runs", runs, (char *)NULL);
        _exit(127);
    }
    close(fd);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0) return prl_error_set(PRL_ERR_IO, "cannot run prl run: %m");
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        return prl_error_set(PRL_ERR_IO, "`prl run %s` failed (exit %d): see %s", job,
                             WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), log);
    return PRL_OK;
}

/* Append the stage times of steps [skip, last] of run NAME in DIR/runs/NAME/run.db. */
static prl_status pipe_collect(const char *dir, const char *name, int skip, pipe_mode *m)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/runs/%s/run.db", dir, name);
    prl_store *db = NULL;
    prl_store_run run = {0};
    int64_t last = -1;
    prl_status rc = prl_store_open(path, &db);
    if (!rc) rc = prl_store_run_get(db, name, &run);
    if (!rc) rc = prl_store_step_last(db, run.id, &last);
    for (int64_t s = skip; !rc && s <= last; s++) {
        char *text = NULL;
        if ((rc = prl_store_step_metrics(db, run.id, s, &text))) break;
        json_error_t je;
        json_t *j = json_loads(text, 0, &je);
        free(text);
        double v[5];
        static const char *keys[5] = {"rollout_s", "rollout_wait_s", "score_tail_s", "train_s", "interval_s"};
        for (int k = 0; k < 5; k++) v[k] = json_number_value(json_object_get(j, keys[k]));
        json_decref(j);
        /* the rollout stage: from its first lease to the last score */
        m->roll[m->n] = v[0] - v[1] + v[2], m->train[m->n] = v[3], m->interval[m->n] = v[4];
        m->n++;
    }
    prl_store_run_free(&run);
    prl_store_close(db);
    return rc;
}

static void pipe_summarise(pipe_mode *m)
{
    m->roll_m = median(m->roll, m->n), m->train_m = median(m->train, m->n);
    m->interval_m = median(m->interval, m->n);
    m->slowest = m->roll_m > m->train_m ? m->roll_m : m->train_m;
    m->ratio = m->slowest > 0 ? m->interval_m / m->slowest : 0;
}

static int bench_pipeline(int argc, char **argv)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    pipe_args a = {.domain = "general", .steps = 8, .batch = 8, .group = 4, .max_new = 64, .skip = 1,
                   .rounds = 1, .lr = 1e-5, .seed = 1};
    cli_opt opts[] = {
        {"init", OPT_STR, &a.init, "CKPT", "the policy to start from (a checkpoint with tokenizer.json)", 1, 0},
        {"domain", OPT_STR, &a.domain, "D", "task domain (default general)", 0, 0},
        {"steps", OPT_INT, &a.steps, "N", "steps per run (default 8)", 0, 0},
        {"skip", OPT_INT, &a.skip, "N", "warm-up steps left out of the medians (default 1)", 0, 0},
        {"batch", OPT_INT, &a.batch, "B", "prompts per step (default 8)", 0, 0},
        {"group", OPT_INT, &a.group, "G", "samples per prompt (default 4)", 0, 0},
        {"max-new-tokens", OPT_INT, &a.max_new, "N", "tokens per response (default 64)", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "sync mode: threads of the rollout worker and of the trainer "
                                               "(they alternate; default: all CPUs)", 0, 0},
        {"async-threads", OPT_INT, &a.async_threads, "N", "async mode: threads of each (they run at "
                                                          "once; default: half the CPUs, at least 1)", 0, 0},
        {"rounds", OPT_INT, &a.rounds, "R", "sync and async runs, alternating (default 1)", 0, 0},
        {"lr", OPT_DOUBLE, &a.lr, "LR", "learning rate (default 1e-5)", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "run seed of both modes (default 1)", 0, 0},
        {"keep", OPT_FLAG, &a.keep, NULL, "keep the temporary runs directory (its path is printed)", 0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl bench pipeline --init CKPT [--steps N] [--batch B --group G] [--json]",
                       "Runs the same GRPO job with `prl run` in sync mode and in async mode (max_lag 1) and "
                       "prints per mode the medians of the rollout stage (first lease to last score), the "
                       "train stage (the trainer's wall time) and the step interval (commit to commit), "
                       "interval / slowest stage, and the sync/async speed-up. Goal: async interval <= "
                       "1.2 x its slowest stage.", NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (a.steps < 1 || a.skip < 0 || a.skip >= a.steps || a.batch < 1 || a.group < 1 || a.max_new < 1 ||
        a.rounds < 1 || a.threads < 0 || a.async_threads < 0)
        return cli_failf("bench", 2, "--steps, --batch, --group, --max-new-tokens, --rounds must be >= 1 "
                         "and --skip in [0, --steps)");
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/tokenizer.json", a.init);
    if (access(probe, R_OK)) return cli_failf("bench", 2, "--init %s: no tokenizer.json there", a.init);
    pipe_mode modes[2] = {{.name = "sync", .threads = a.threads ? a.threads : (int)(ncpu > 0 ? ncpu : 1)},
                          {.name = "async", .threads = a.async_threads ? a.async_threads
                                                                       : (int)(ncpu > 1 ? ncpu / 2 : 1)}};
    int per_mode = a.rounds * (a.steps - a.skip);
    for (int k = 0; k < 2; k++) {
        modes[k].roll = calloc((size_t)per_mode, sizeof(double));
        modes[k].train = calloc((size_t)per_mode, sizeof(double));
        modes[k].interval = calloc((size_t)per_mode, sizeof(double));
    }
    char dir[] = "/tmp/prl-bench-pipeline-XXXXXX";
    if (!mkdtemp(dir)) return cli_failf("bench", 1, "cannot make a temporary directory: %m");
    prl_status st = PRL_OK;
    /* Rounds alternate the modes, so drift in the shared machine's speed hits both alike. */
    for (int r = 0; !st && r < a.rounds; r++)
        for (int k = 0; !st && k < 2; k++) {
            pipe_mode *m = &modes[k];
            char name[32], job[1200];
            snprintf(name, sizeof name, "%s-%d", m->name, r + 1);
            snprintf(job, sizeof job, "%s/%s.json", dir, name);
            fprintf(stderr, "bench: round %d/%d: %s mode, %d steps of %d x %d, %d thread(s) per role\n", r + 1,
                    a.rounds, m->name, a.steps, a.batch, a.group, m->threads);
            double t0 = prl_now();
            st = pipe_write_job(&a, job, name, m);
            if (!st) st = pipe_run(dir, name);
            if (!st) st = pipe_collect(dir, name, a.skip, m);
            if (!st) fprintf(stderr, "bench: round %d/%d: %s mode took %.1f s\n", r + 1, a.rounds, m->name,
                             prl_now() - t0);
        }
    if (st) {
        fprintf(stderr, "prl bench: %s (runs kept in %s)\n", prl_error_message(), dir);
        return 1;
    }
    for (int k = 0; k < 2; k++) pipe_summarise(&modes[k]);
    const pipe_mode *sy = &modes[0], *as = &modes[1];
    double speedup = as->interval_m > 0 ? sy->interval_m / as->interval_m : 0;
    const double goal = 1.2;
    int pass = as->ratio > 0 && as->ratio <= goal;
    if (a.json) {
        printf("{\"init\": \"%s\", \"domain\": \"%s\", \"steps\": %d, \"skip\": %d, \"rounds\": %d, \"batch\": %d, "
               "\"group\": %d, \"max_new_tokens\": %d, \"seed\": %llu, \"modes\": [",
               a.init, a.domain, a.steps, a.skip, a.rounds, a.batch, a.group, a.max_new,
               (unsigned long long)a.seed);
        for (int k = 0; k < 2; k++) {
            const pipe_mode *m = &modes[k];
            printf("%s{\"mode\": \"%s\", \"threads\": %d, \"steps_measured\": %d, \"rollout_s\": %.3f, "
                   "\"train_s\": %.3f, \"interval_s\": %.3f, \"slowest_stage\": \"%s\", \"slowest_s\": %.3f, "
                   "\"ratio_interval_over_slowest\": %.3f}", k ? ", " : "", m->name, m->threads, m->n,
                   m->roll_m, m->train_m, m->interval_m, m->roll_m > m->train_m ? "rollout" : "train",
                   m->slowest, m->ratio);
        }
        printf("], \"speedup_sync_over_async\": %.3f, \"goal_ratio\": %.2f, \"goal_met\": %s}\n", speedup, goal,
               pass ? "true" : "false");
    } else {
        printf("%s, %s, %d steps of %d prompts x %d samples (max %d new tokens), seed %llu; medians over "
               "steps %d..%d of %d round(s)\n", a.init, a.domain, a.steps, a.batch, a.group, a.max_new,
               (unsigned long long)a.seed, a.skip + 1, a.steps, a.rounds);
        printf("  mode   threads  rollout+score  train    interval  slowest        interval/slowest\n");
        for (int k = 0; k < 2; k++) {
            const pipe_mode *m = &modes[k];
            printf("  %-5s  %7d  %11.2f s  %5.2f s  %6.2f s  %-7s %5.2f s  %.2f\n", m->name, m->threads,
                   m->roll_m, m->train_m, m->interval_m, m->roll_m > m->train_m ? "rollout" : "train",
                   m->slowest, m->ratio);
        }
        printf("  speed-up sync/async interval = %.2fx\n", speedup);
        printf("  goal: async interval <= %.1f x slowest stage: %.2f  %s\n", goal, as->ratio, pass ? "PASS" : "MISS");
    }
    for (int k = 0; k < 2; k++) free(modes[k].roll), free(modes[k].train), free(modes[k].interval);
    if (a.keep) fprintf(stderr, "bench: runs kept in %s\n", dir);
    else nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[2], "train")) return bench_train(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "decode")) return bench_decode(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "sandbox")) return bench_sandbox(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "pipeline")) return bench_pipeline(argc, argv);
    FILE *out = argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) ? stdout : stderr;
    fprintf(out, "usage: prl bench train [options]     training step vs PyTorch (prl bench train --help)\n"
                 "       prl bench decode [options]    KV-cached decoding vs PyTorch (prl bench decode --help)\n"
                 "       prl bench sandbox [options]   sandboxed vs bare executions (prl bench sandbox --help)\n"
                 "       prl bench pipeline [options]  prl run in sync vs async mode (prl bench pipeline --help)\n");
    return out == stdout ? 0 : 2;
}
