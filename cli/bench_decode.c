/*
** bench_decode.c — `prl bench decode`: prl's infer path against the PyTorch reference.
**
** Greedy KV-cached generation of the same prompts (random token ids from the seed, written
** to a file both engines read) at each batch size, prl's infer path against
** reference/pangu_ref.py bench-decode with the same config, weights, threads, BLAS core and
** MLA form; prefill and decode timed apart (prl's prefill is a run with one new token),
** medians over rounds, decode tokens/s and their ratio, KV-cache bytes per token, and the
** caches as allocated at contexts 64..512 (whole-context, DSA indexer, SWA rings). With
** --spec, self-speculative decoding timed against plain decoding on the same requests; with
** --precision-compare P, an engine of preset P (e.g. w8a8) timed against the --precision one.
*/
#include "cli/bench.h"

#include <jansson.h>
#include <math.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

typedef struct decode_args {
    const char *config, *ckpt, *python, *reference, *batches, *precision, *mla, *matmul;
    int prompt_len, new_tokens, rounds, warmup, threads, json, no_reference;
    int spec;            /* > 0: also time self-speculative decoding with this many MTP drafts */
    int spec_vocab;      /* > 0: the drafts' head covers ids [0, spec_vocab) */
    const char *prompts; /* JSONL of real prompts (generate's formats) instead of random ids */
    double temperature;  /* 0 = greedy */
    uint64_t seed;
    int group; /* > 1: random prompts repeat in groups of this many (a GRPO group), and the
               ** prefill is also timed with each request prefilling its own prompt */
    const char *compare; /* --precision-compare: a second preset timed against --precision */
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

/* ---- the memory-bandwidth bound ---------------------------------------------------------
** A decode step reads every weight it uses once, so tokens/s ≤ B · bandwidth / bytes read per
** step. The bandwidth is measured here, in the same run, by summing a 512 MiB buffer over the
** same pool of threads (median of 5 passes); the bytes are the fp32 weights a step touches:
** everything but the embedding table (one row per token) and the MTP modules, with each MoE
** layer's routed experts counted as E·(1 − (1 − K/E)^B), the experts B tokens touch on average
** under uniform routing. */
typedef struct bw_ctx {
    const float *x;
    size_t n;
    int tasks;
    double part[64];
} bw_ctx;

static void bw_task(void *ctx, int task)
{
    bw_ctx *c = ctx;
    size_t lo = c->n * (size_t)task / (size_t)c->tasks,
           hi = c->n * (size_t)(task + 1) / (size_t)c->tasks;
    float acc[8] = {0};
    for (size_t i = lo; i + 8 <= hi; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += c->x[i + j];
    c->part[task] = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

/* Read bandwidth in bytes/s (0 when the buffer cannot be had). */
static double measure_bandwidth(void)
{
    bw_ctx c = {.n = (size_t)128 << 20, .tasks = 2 * prl_pool_threads()};
    if (c.tasks > 64) c.tasks = 64;
    float *x = malloc(c.n * sizeof *x);
    if (!x) return 0;
    for (size_t i = 0; i < c.n; i++) x[i] = (float)(i & 7);
    c.x = x;
    double t[5];
    for (int r = 0; r < 5; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        prl_parallel_for(c.tasks, bw_task, &c);
        clock_gettime(CLOCK_MONOTONIC, &b);
        t[r] = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    }
    free(x);
    return (double)c.n * sizeof(float) / bench_median(t, 5);
}

/* fp32 bytes of weights one decode step of B sequences reads (see above). */
static double step_weight_bytes(const prl_model *m, int B)
{
    const prl_config *c = &m->cfg;
    double bytes = 0, expert = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const prl_param_info *p = &m->tensors[i];
        if (p->layer >= c->num_hidden_layers) continue; /* MTP: not used by plain decoding */
        if (p->kind == PRL_PARAM_EMBED) bytes += (double)B * (double)p->shape[1] * 4;
        else if (p->expert >= 0) expert += (double)p->numel * 4;
        else bytes += (double)p->numel * 4;
    }
    double E = c->n_routed_experts, K = c->num_experts_per_tok;
    double touched = E > 0 ? E * (1 - pow(1 - K / E, B)) : 0;
    return bytes + (E > 0 ? expert * touched / E : 0);
}

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
    double own_prefill;               /* --group: median prefill without the shared prefill */
    long shared_prefills;             /* --group: prompts copied from a twin in one prefill */
    double cmp_decode, cmp_speedup;   /* --precision-compare: its median decode time, median of
                                      ** per-round ratios of its decode tokens/s to the main's */
    long cmp_tokens, cmp_equal;       /* its decode tokens (last round); greedy tokens equal */
    int cmp_agree;                    /* leading tokens of sequence 0 equal to the main's */
} decode_result;

/* Seconds of prl's generation of at most n_new tokens for every request of `run`; *steps_s
** (may be NULL) the part of them in decode steps (the engine's own pass timer: prefills
** excluded); *decoded (may be NULL) gets the tokens made after each sequence's first (which
** comes with the prefill); tokens (may be NULL) gets sequence i's tokens at [i·n_new ..],
** lens[i] their count. */
static prl_status prl_generate_time(prl_infer *e, const decode_run *run, int n_new, double *seconds,
                                    double *steps_s, long *decoded, int32_t *tokens, int *lens)
{
    prl_sample_params sp = run->sp;
    sp.max_new_tokens = n_new;
    sp.stop_ids = run->stop_ids;
    prl_gen_result *r = calloc((size_t)run->n, sizeof *r);
    double pass0 = prl_infer_spec_stats(e).pass_s, t0 = prl_now();
    prl_status rc = prl_infer_generate(e, run->q, run->n, &sp, r, NULL, NULL);
    *seconds = prl_now() - t0;
    if (steps_s) *steps_s = prl_infer_spec_stats(e).pass_s - pass0;
    if (decoded) *decoded = 0;
    for (int i = 0; rc == PRL_OK && i < run->n; i++) {
        if (decoded) *decoded += r[i].n - 1;
        if (tokens)
            memcpy(tokens + (size_t)i * n_new, r[i].tokens, (size_t)r[i].n * sizeof *tokens);
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
    json_t *root;
    prl_status rc = bench_reference(
        a->python, a->reference, &root, NULL,
        "bench-decode --ckpt '%s' --prompts '%s' --new-tokens %d --threads %d "
        "--rounds %d --warmup %d --mla %s --json",
        ckpt, prompts, a->new_tokens, prl_blas_threads(), a->rounds, a->warmup, mla);
    if (rc) return rc;
    json_t *pre = json_object_get(root, "prefill_seconds_median"),
           *dec = json_object_get(root, "decode_seconds_median");
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
    snprintf(d->ref_info, sizeof d->ref_info, "torch %s",
             json_is_string(ver) ? json_string_value(ver) : "?");
    json_decref(root);
    return PRL_OK;
}

/* Leading tokens of sequence 0 that two runs share, and tokens equal at the same place over
** every sequence (greedy speculative decoding must give plain decoding's tokens exactly). */
static void tokens_compare(int *agree, long *equal, const int32_t *x, const int *xl,
                           const int32_t *y, const int *yl, int n_seq, int N)
{
    *agree = 0;
    while (*agree < xl[0] && *agree < yl[0] && x[*agree] == y[*agree]) ++*agree;
    *equal = 0;
    for (int i = 0; i < n_seq; i++)
        for (int t = 0; t < xl[i] && t < yl[i]; t++)
            *equal += x[(size_t)i * N + t] == y[(size_t)i * N + t];
}

static prl_spec_stats stats_since(const prl_infer *e, prl_spec_stats b)
{
    prl_spec_stats a = prl_infer_spec_stats(e);
    return (prl_spec_stats){.drafted = a.drafted - b.drafted,
                            .accepted = a.accepted - b.accepted,
                            .steps = a.steps - b.steps,
                            .emitted = a.emitted - b.emitted,
                            .passes = a.passes - b.passes,
                            .pass_s = a.pass_s - b.pass_s,
                            .draft_s = a.draft_s - b.draft_s,
                            .verify_s = a.verify_s - b.verify_s,
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
    double *ratio = calloc((size_t)a->rounds, sizeof *ratio), all = 0;
    int32_t *want = calloc((size_t)n * N, sizeof *want), *got = calloc((size_t)n * N, sizeof *got);
    int *want_len = calloc((size_t)n, sizeof *want_len),
        *got_len = calloc((size_t)n, sizeof *got_len);
    for (int w = 0; !rc && w < a->warmup; w++)
        rc = prl_generate_time(e, run, N, &all, NULL, NULL, NULL, NULL);
    prl_spec_stats before = rc ? (prl_spec_stats){0} : prl_infer_spec_stats(e);
    prl_spec_stats plain_before = prl_infer_spec_stats(plain);
    for (int i = 0; !rc && i < a->rounds; i++) {
        rc = prl_generate_time(plain, run, N, &all, &ps[i], &d->plain_tokens, want, want_len);
        if (!rc) rc = prl_generate_time(e, run, N, &all, &ss[i], &d->spec_tokens, got, got_len);
        if (!rc) ratio[i] = (d->spec_tokens / ss[i]) / (d->plain_tokens / ps[i]);
    }
    if (!rc) {
        d->spec = stats_since(e, before), d->plain = stats_since(plain, plain_before);
        d->spec_decode = bench_median(ss, a->rounds),
        d->spec_speedup = bench_median(ratio, a->rounds);
        tokens_compare(&d->spec_agree, &d->spec_equal, want, want_len, got, got_len, n, N);
    }
    prl_infer_free(e);
    free(ps), free(ss), free(ratio), free(want), free(got), free(want_len), free(got_len);
    return rc;
}

/* --precision-compare: an engine of preset a->compare against engine `main` on the same
** requests, in alternate rounds (decode steps by the engine's pass timer, as above): its median decode time, the
** median of the per-round ratios of decode tokens/s (compare / main), and how many greedy
** tokens equal the main engine's. */
static prl_status bench_compare(const decode_args *a, prl_model *m, prl_infer_options io,
                                prl_infer *main_e, const decode_run *run, decode_result *d)
{
    int N = a->new_tokens, n = run->n;
    prl_infer_options co;
    prl_status rc = prl_infer_options_preset(&co, a->compare);
    co.mla = io.mla, co.matmul = io.matmul, co.max_batch = io.max_batch, co.max_len = io.max_len;
    prl_infer *e = NULL;
    if (!rc) rc = prl_infer_init(&e, m, &co);
    double *ms = calloc((size_t)a->rounds, sizeof *ms), *cs = calloc((size_t)a->rounds, sizeof *cs);
    double *ratio = calloc((size_t)a->rounds, sizeof *ratio), all = 0;
    int32_t *want = calloc((size_t)n * N, sizeof *want), *got = calloc((size_t)n * N, sizeof *got);
    int *want_len = calloc((size_t)n, sizeof *want_len),
        *got_len = calloc((size_t)n, sizeof *got_len);
    long main_tokens = 0;
    for (int w = 0; !rc && w < a->warmup; w++)
        rc = prl_generate_time(e, run, N, &all, NULL, NULL, NULL, NULL);
    for (int i = 0; !rc && i < a->rounds; i++) {
        rc = prl_generate_time(main_e, run, N, &all, &ms[i], &main_tokens, want, want_len);
        if (!rc) rc = prl_generate_time(e, run, N, &all, &cs[i], &d->cmp_tokens, got, got_len);
        if (!rc) ratio[i] = (d->cmp_tokens / cs[i]) / (main_tokens / ms[i]);
    }
    if (!rc) {
        d->cmp_decode = bench_median(cs, a->rounds),
        d->cmp_speedup = bench_median(ratio, a->rounds);
        tokens_compare(&d->cmp_agree, &d->cmp_equal, want, want_len, got, got_len, n, N);
    }
    prl_infer_free(e);
    free(ms), free(cs), free(ratio), free(want), free(got), free(want_len), free(got_len);
    return rc;
}

/* The requests of one batch size: B random prompts of prompt_len ids (written to `file` for
** the reference), or every prompt of --prompts. *max_prompt gets the longest. */
static prl_status decode_requests(const decode_args *a, const prl_model *m,
                                  const prl_tokenizer *tok, int B, const char *file,
                                  decode_run *run, int32_t **ids, cli_prompts *pl, int *max_prompt)
{
    prl_sample_params_default(&run->sp);
    run->sp.temperature = a->temperature, run->sp.seed = a->seed;
    run->stop_ids[0] = PRL_TOKEN_EOS, run->stop_ids[1] = PRL_TOKEN_END; /* prl's, no tokenizer */
    int n_stops = tok ? prl_tokenizer_stop_ids(tok, run->stop_ids) : 2;
    if (a->prompts) {
        prl_status rc = cli_prompts_read(NULL, a->prompts, 0, PRL_MODE_DEFAULT, tok, pl);
        if (rc) return rc;
        run->n = pl->n, run->sp.n_stop_ids = n_stops;
        run->sp.vocab_limit = tok ? prl_tokenizer_vocab_size(tok) : 0;
        run->q = calloc((size_t)run->n, sizeof *run->q);
        *max_prompt = 0;
        for (int i = 0; i < run->n; i++) {
            run->q[i] = (prl_gen_request){.prompt = pl->ids[i],
                                          .prompt_len = pl->len[i],
                                          .seq_id = (uint64_t)i};
            *max_prompt = pl->len[i] > *max_prompt ? pl->len[i] : *max_prompt;
        }
        return PRL_OK;
    }
    int P = a->prompt_len;
    *ids = malloc((size_t)B * P * sizeof **ids);
    prl_rng r;
    prl_rng_init(&r, a->seed, (uint64_t)B, 0, 0, PRL_RNG_TEST);
    for (int i = 0; i < B * P; i++)
        (*ids)[i] = 16 + (int32_t)(prl_rng_u64(&r) % (uint64_t)(m->cfg.vocab_size - 16));
    for (int b = 0; a->group > 1 && b < B; b++) /* a group's sequences share its first prompt */
        memcpy(*ids + (size_t)b * P, *ids + (size_t)(b - b % a->group) * P,
               (size_t)P * sizeof **ids);
    run->n = B, run->sp.n_stop_ids = 0, *max_prompt = P;
    run->q = calloc((size_t)B, sizeof *run->q);
    for (int b = 0; b < B; b++)
        run->q[b] = (prl_gen_request){.prompt = *ids + (size_t)b * P,
                                      .prompt_len = P,
                                      .seq_id = (uint64_t)b};
    return write_prompts(file, *ids, B, P);
}

/* --group: the prefill (one generated token) timed in alternating rounds with the shared
** prefill (engine e) and with each request prefilling its own prompt, medians. */
static prl_status bench_own_prefill(const decode_args *a, const prl_model *m, prl_infer_options io,
                                    prl_infer *e, const decode_run *run, decode_result *d)
{
    io.no_shared_prefill = 1;
    prl_infer *own = NULL;
    prl_status rc = prl_infer_init(&own, m, &io);
    double *sh = calloc((size_t)a->rounds, sizeof *sh), *ow = calloc((size_t)a->rounds, sizeof *ow);
    long before = prl_infer_spec_stats(e).shared_prefills;
    for (int i = 0; !rc && i < a->rounds; i++) {
        rc = prl_generate_time(e, run, 1, &sh[i], NULL, NULL, NULL, NULL);
        if (!rc) rc = prl_generate_time(own, run, 1, &ow[i], NULL, NULL, NULL, NULL);
    }
    if (!rc) {
        d->prl_prefill = bench_median(sh, a->rounds), d->own_prefill = bench_median(ow, a->rounds);
        d->shared_prefills = (prl_infer_spec_stats(e).shared_prefills - before) / a->rounds;
    }
    prl_infer_free(own);
    free(sh), free(ow);
    return rc;
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
        rc = prl_error_set(PRL_ERR_ARG,
                           "prompt %d + --new-tokens %d exceeds max_position_embeddings %d", P, N,
                           m->cfg.max_position_embeddings);
    if (!rc) rc = prl_infer_init(&e, m, &io);
    double *pre = calloc((size_t)a->rounds, sizeof *pre),
           *all = calloc((size_t)a->rounds, sizeof *all), t;
    long *dec = calloc((size_t)a->rounds, sizeof *dec);
    for (int w = 0; !rc && w < a->warmup; w++)
        rc = prl_generate_time(e, &run, N, &t, NULL, NULL, NULL, NULL);
    /* prl's rounds straddle the reference's, so drift of the shared machine hits both */
    int half = a->rounds / 2;
    for (int i = 0; !rc && i < half; i++) {
        rc = prl_generate_time(e, &run, 1, &pre[i], NULL, NULL, NULL, NULL);
        if (!rc) rc = prl_generate_time(e, &run, N, &t, &all[i], &dec[i], tokens, NULL);
    }
    d->batch = B, d->n_seq = run.n;
    if (!rc && !a->no_reference)
        rc =
            ref_decode(a, ckpt, prompts, io.mla == PRL_MLA_NAIVE ? "naive" : "absorbed", d, tokens);
    for (int i = half; !rc && i < a->rounds; i++) {
        rc = prl_generate_time(e, &run, 1, &pre[i], NULL, NULL, NULL, NULL);
        if (!rc) rc = prl_generate_time(e, &run, N, &t, &all[i], &dec[i], tokens, NULL);
    }
    if (!rc) {
        d->prl_prefill = bench_median(pre, a->rounds);
        d->prl_decode = bench_median(all, a->rounds);
        d->plain_tokens = dec[a->rounds - 1];
    }
    if (!rc && a->spec > 0) rc = bench_spec(a, m, io, e, &run, d);
    if (!rc && a->compare) rc = bench_compare(a, m, io, e, &run, d);
    if (!rc && a->group > 1) rc = bench_own_prefill(a, m, io, e, &run, d);
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
    size_t row =
        ((size_t)(c->kv_lora_rank + c->qk_rope_head_dim) +
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
    else
        printf("  KV cache by context, one sequence, as allocated (formula: whole-context layers "
               "n x %s x layers; indexer n x index_head_dim x DSA layers; SWA min(n, W) x %s x "
               "layers; x 4 bytes):\n  %7s %26s %26s %26s %12s\n",
               row, row, "context", "whole-context [formula]", "DSA indexer [formula]",
               "SWA rings [formula]", "total");
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
            printf(
                "%s{\"context\": %d, \"whole_context_bytes\": %zu, \"whole_context_layers\": %d, "
                "\"dsa_index_bytes\": %zu, \"dsa_layers\": %d, \"swa_bytes\": %zu, \"swa_layers\": "
                "%d, "
                "\"total_bytes\": %zu, \"whole_context_formula\": %zu, \"dsa_index_formula\": %zu, "
                "\"swa_formula\": %zu}",
                i ? ", " : "", n, a.full, a.n_full, a.index, a.n_dsa, a.ring, a.n_ring, total,
                f.full, f.index, f.ring);
        else
            printf("  %7d %12zu [%11zu] %12zu [%11zu] %12zu [%11zu] %12zu\n", n, a.full, f.full,
                   a.index, f.index, a.ring, f.ring, total);
    }
    if (json) printf("]");
    return PRL_OK;
}

int cmd_bench_decode(int argc, char **argv)
{
    decode_args a = {.config = PRL_SOURCE_DIR "/configs/models/tiny.json",
                     .python = "/usr/bin/python3",
                     .reference = PRL_SOURCE_DIR "/reference/pangu_ref.py",
                     .batches = "1,16",
                     .group = 1,
                     .prompt_len = 32,
                     .new_tokens = 64,
                     .rounds = 5,
                     .warmup = 1,
                     .seed = 1};
    cli_opt opts[] = {
        {"config", OPT_STR, &a.config, "CONFIG",
         "model config, random weights (default configs/models/tiny.json)", 0, 0},
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "a checkpoint instead of --config", 0, 0},
        {"batch", OPT_STR, &a.batches, "LIST", "batch sizes, comma-separated (default 1,16)", 0, 0},
        {"prompt-len", OPT_INT, &a.prompt_len, "P", "prompt tokens (default 32)", 0, 0},
        {"new-tokens", OPT_INT, &a.new_tokens, "N", "generated tokens per sequence (default 64)", 0,
         0},
        {"rounds", OPT_INT, &a.rounds, "R", "timed generations per engine (default 5)", 0, 0},
        {"warmup", OPT_INT, &a.warmup, "N", "untimed generations first (default 1)", 0, 0},
        {"precision", OPT_STR, &a.precision, "P",
         "prl's infer preset: fp32 (default), bf16, fp16, w8a8, aligned", 0, 0},
        {"precision-compare", OPT_STR, &a.compare, "P",
         "also time preset P (e.g. w8a8) against --precision in alternate rounds: tokens/s, "
         "ratio, greedy tokens equal",
         0, 0},
        {"mla", OPT_STR, &a.mla, "FORM", "absorbed or naive (both engines; default: the preset's)",
         0, 0},
        {"matmul", OPT_STR, &a.matmul, "KIND", "prl's matmul kind: gemv, gemm, blas", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads for both engines (default: all CPUs)", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "seed of the weights and prompts (default 1)", 0, 0},
        {"group", OPT_INT, &a.group, "G",
         "random prompts repeat in groups of G; the prefill is also timed without the shared "
         "prefill (default 1)",
         0, 0},
        {"python", OPT_STR, &a.python, "PATH", "python with torch (default /usr/bin/python3)", 0,
         0},
        {"reference", OPT_STR, &a.reference, "FILE",
         "reference script (default reference/pangu_ref.py)", 0, 0},
        {"no-reference", OPT_FLAG, &a.no_reference, NULL, "time prl only", 0, 0},
        {"spec", OPT_INT, &a.spec, "D",
         "also time self-speculative decoding with D MTP drafts "
         "(needs num_nextn_predict_layers >= D)",
         0, 0},
        {"spec-vocab", OPT_INT, &a.spec_vocab, "S",
         "with --spec: the drafts' head covers token ids "
         "[0, S) only (default 0 = all)",
         0, 0},
        {"prompts", OPT_STR, &a.prompts, "FILE",
         "real prompts: JSONL as prl generate --input (e.g. "
         "prl tasks generate --split eval); every batch size decodes them all, stopping at "
         "<|eos|>/<|end|>; "
         "prl only",
         0, 0},
        {"temperature", OPT_DOUBLE, &a.temperature, "T",
         "sampling temperature (default 0 = greedy); "
         "> 0 is prl only",
         0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts,
                       "prl bench decode [--config CONFIG|--ckpt DIR] [--batch 1,16] [--json]",
                       "Times greedy KV-cached decoding of prl's infer path and of the PyTorch "
                       "reference on the same weights, prompts, threads, BLAS core and MLA form.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (a.prompt_len < 1 || a.new_tokens < 2 || a.rounds < 1 || a.warmup < 0 || a.spec < 0 ||
        !(a.temperature >= 0))
        return cli_failf("bench", 2,
                         "--prompt-len >= 1, --new-tokens >= 2, --rounds >= 1, --warmup >= 0, "
                         "--spec >= 0, --temperature >= 0");
    if (a.group < 1 || a.group > 256 || (a.group > 1 && a.prompts))
        return cli_failf("bench", 2, "--group must be in 1..256, and only with random prompts");
    /* the reference times greedy decoding of equal-length random prompts only */
    if (a.prompts || a.temperature > 0) a.no_reference = 1;
    int batches[16], nb = 0;
    for (const char *p = a.batches; *p && nb < 16;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || (*end && *end != ','))
            return cli_failf("bench", 2, "--batch '%s': expected comma-separated sizes in [1, 256]",
                             a.batches);
        batches[nb++] = (int)v;
        p = *end ? end + 1 : end;
    }
    prl_infer_options io;
    if (cli_infer_options("bench", &io, a.precision, a.mla, a.matmul)) return 2;
    prl_infer_options cmp_io;
    if (a.compare && prl_infer_options_preset(&cmp_io, a.compare))
        return cli_failf("bench", 2, "--precision-compare: %s", prl_error_message());
    if (cli_setup_blas("bench", a.threads)) return 1;
    const char *dir = bench_tmpdir("decode");
    if (!dir) return cli_fail("bench");
    prl_model m;
    prl_tokenizer *tok = NULL;
    const char *ckpt = a.ckpt;
    char made[600];
    if (a.ckpt) {
        if (prl_checkpoint_load_tokenizer(&m, a.ckpt, &tok)) return cli_fail("bench");
    } else { /* random weights, saved so the reference reads the very same ones */
        prl_config cfg;
        if (prl_config_load(&cfg, a.config) || prl_model_init(&m, &cfg)) return cli_fail("bench");
        prl_model_init_weights(&m, a.seed);
        snprintf(made, sizeof made, "%s/ckpt", dir);
        if (prl_checkpoint_save(&m, NULL, NULL, NULL, made)) return cli_fail("bench");
        ckpt = made;
    }
    if (!a.prompts && a.prompt_len + a.new_tokens > m.cfg.max_position_embeddings)
        return cli_failf("bench", 2,
                         "--prompt-len + --new-tokens = %d exceeds max_position_embeddings %d",
                         a.prompt_len + a.new_tokens, m.cfg.max_position_embeddings);
    decode_result res[16] = {0};
    for (int i = 0; i < nb; i++) {
        if (bench_decode_batch(&a, &m, tok, ckpt, dir, io, batches[i], &res[i]))
            return cli_fail("bench");
        fprintf(stderr, "bench: batch %d done\n", batches[i]);
    }
    double bandwidth = measure_bandwidth();
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
                         (size_t)c->index_head_dim * c->n_dsa_layers) *
                        sizeof(float);
    if (a.json)
        printf(
            "{\"model\": \"%s\", \"infer\": \"%s\", \"threads\": %d, \"blas_core\": \"%s\", "
            "\"prompt_len\": %d, \"new_tokens\": %d, \"rounds\": %d, \"kv_bytes_per_token\": %zu, "
            "\"kv_bytes_formula\": %zu, \"kv_bytes_per_sequence\": %zu, "
            "\"read_bandwidth_bytes_per_s\": %.0f",
            a.ckpt ? a.ckpt : a.config, desc, prl_blas_threads(), prl_blas_core(), a.prompt_len,
            a.new_tokens, a.rounds, kv, kv_formula, kv_seq, bandwidth);
    else
        printf(
            "model %s, %s, threads %d, blas %s, prompt %d + %d new tokens, medians of %d rounds\n"
            "  KV cache: %zu bytes/token in the %d whole-context layers (formula ((kv_lora_rank + "
            "qk_rope_head_dim) x those layers + index_head_dim x %d DSA layers) x 4 = %zu); %d "
            "sliding-window layers keep at most W rows; one sequence of %d tokens holds %zu "
            "bytes\n",
            a.ckpt ? a.ckpt : a.config, desc, prl_blas_threads(), prl_blas_core(), a.prompt_len,
            a.new_tokens, a.rounds, kv, full_layers, c->n_dsa_layers, kv_formula, c->n_swa_layers,
            ctx, kv_seq);
    if (!a.json)
        printf("  memory read bandwidth %.2f GB/s (measured now, %d threads); a decode step reads "
               "%.1f MB of fp32 weights at batch 1\n",
               bandwidth / 1e9, prl_pool_threads(), step_weight_bytes(&m, 1) / 1e6);
    if (print_kv_by_context(&m, io, a.json)) return cli_fail("bench");
    if (a.json) printf(", \"results\": [");
    for (int i = 0; i < nb; i++) {
        decode_result *d = &res[i];
        double toks = (double)d->plain_tokens; /* the first token comes with the prefill */
        double prl_tps = toks / d->prl_decode,
               ref_tps = d->ref_decode > 0 ? (double)d->batch * a.new_tokens / d->ref_decode : 0;
        double bound = bandwidth * d->batch / step_weight_bytes(&m, d->batch);
        if (a.json) {
            printf("%s{\"batch\": %d, \"prl_prefill_s\": %.5f, \"prl_decode_s\": %.5f, "
                   "\"prl_decode_tokens_per_s\": %.1f, "
                   "\"torch_prefill_s\": %.5f, \"torch_decode_s\": %.5f, "
                   "\"torch_decode_tokens_per_s\": %.1f, "
                   "\"ratio_prl_over_torch\": %.2f, \"torch_kv_bytes_per_token\": %zu, "
                   "\"greedy_tokens_agree\": %d, "
                   "\"reference\": \"%s\", \"bandwidth_bound_tokens_per_s\": %.1f",
                   i ? ", " : "", d->batch, d->prl_prefill, d->prl_decode, prl_tps, d->ref_prefill,
                   d->ref_decode, ref_tps, ref_tps > 0 ? prl_tps / ref_tps : 0, d->ref_kv_bytes,
                   d->greedy_agree, a.no_reference ? "skipped" : d->ref_info, bound);
            if (a.group > 1)
                printf(
                    ", \"group\": %d, \"own_prefill_s\": %.5f, \"shared_prefill_speedup\": %.3f, "
                    "\"shared_prefills\": %ld",
                    a.group, d->own_prefill, d->own_prefill / d->prl_prefill, d->shared_prefills);
            if (a.compare)
                printf(", \"compare_precision\": \"%s\", \"compare_decode_s\": %.5f, "
                       "\"compare_decode_tokens_per_s\": %.1f, \"compare_speedup_median\": %.3f, "
                       "\"compare_greedy_tokens_agree\": %d, \"compare_tokens_equal\": %ld, "
                       "\"compare_tokens\": %ld",
                       a.compare, d->cmp_decode, d->cmp_tokens / d->cmp_decode, d->cmp_speedup,
                       d->cmp_agree, d->cmp_equal, d->plain_tokens + d->n_seq);
            if (a.spec > 0)
                printf(", \"spec_drafts\": %d, \"spec_decode_s\": %.5f, "
                       "\"spec_decode_tokens_per_s\": %.1f, "
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
        printf("  batch %3d: prl %8.1f tokens/s (prefill %.4f s; %.0f%% of the bandwidth bound "
               "%.1f)",
               d->batch, prl_tps, d->prl_prefill, 100 * prl_tps / bound, bound);
        if (ref_tps > 0)
            printf("   pytorch %8.1f tokens/s (prefill %.4f s)   ratio %.1fx   greedy tokens agree "
                   "%d/%d",
                   ref_tps, d->ref_prefill, prl_tps / ref_tps, d->greedy_agree, a.new_tokens);
        printf("\n");
        if (a.group > 1)
            printf("             prefill of %d prompts in groups of %d: shared %.4f s, each its "
                   "own %.4f s, speed-up %.2fx (%ld copied from a twin)\n",
                   d->n_seq, a.group, d->prl_prefill, d->own_prefill,
                   d->own_prefill / d->prl_prefill, d->shared_prefills);
        if (a.compare)
            printf("             %s %8.1f tokens/s   speed-up %.2fx (median of per-round ratios "
                   "to %s)   greedy tokens equal %ld/%ld (%d sequences; sequence 0 agrees for "
                   "%d)\n",
                   a.compare, d->cmp_tokens / d->cmp_decode, d->cmp_speedup,
                   a.precision ? a.precision : "fp32", d->cmp_equal, d->plain_tokens + d->n_seq,
                   d->n_seq, d->cmp_agree);
        if (a.spec > 0)
            printf(
                "             speculative (%d drafts) %8.1f tokens/s   speed-up %.2fx (median of "
                "per-round ratios)   acceptance %.1f%% (%ld/%ld drafts)   %.2f tokens per "
                "sequence step   tokens equal plain's %ld/%ld (%d sequences)\n",
                a.spec, d->spec_tokens / d->spec_decode, d->spec_speedup,
                d->spec.drafted ? 100.0 * d->spec.accepted / d->spec.drafted : 0.0,
                d->spec.accepted, d->spec.drafted,
                d->spec.steps ? (double)d->spec.emitted / d->spec.steps : 0.0, d->spec_equal,
                d->plain_tokens + d->n_seq, d->n_seq);
        if (a.spec > 0 && d->spec.passes > 0 && d->plain.passes > 0) {
            double pp = 1e3 * d->plain.pass_s / d->plain.passes, n = (double)d->spec.passes;
            printf(
                "             profile per pass: plain %.3f ms; speculative %.3f ms = %.2fx plain "
                "(MTP drafts %.3f, verify %.3f, accept %.3f ms)\n",
                pp, 1e3 * d->spec.pass_s / n, 1e3 * d->spec.pass_s / n / pp,
                1e3 * d->spec.draft_s / n, 1e3 * d->spec.verify_s / n, 1e3 * d->spec.accept_s / n);
        }
    }
    if (a.json) printf("]}\n");
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    return 0;
}
