/*
** cmd_generate.c — `prl generate`: sample completions with the infer path.
**
** Prompts come from --prompt TEXT (one user message, or raw text with --raw) or from a JSONL
** file of {"prompt": "..."}, {"messages": [...]} or {"ids": [...]} lines. Each prompt gets --n
** samples; sample j of prompt i is sequence i·n + j, whose draws are seeded from (seed,
** sequence, position), so its tokens do not depend on batch size or thread count. Output:
** the decoded text per sample, or with --json one object per sample (docs/infer.md).
*/
#include "cli/cli.h"

#include <math.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct gen_args {
    const char *ckpt, *prompt, *input, *precision, *mla, *matmul, *stop, *mode;
    double temperature, top_p;
    int n, top_k, max_new, batch, raw, ignore_eos, json, routes, threads, quiet, spec, spec_vocab;
    uint64_t seed;
} gen_args;

typedef struct progress_state {
    double t0, last;
    int quiet;
} progress_state;

static void on_progress(void *user, int finished, int total, long tokens)
{
    progress_state *p = user;
    double now = prl_now();
    if (p->quiet || (now - p->last < 2.0 && finished < total)) return;
    p->last = now;
    fprintf(stderr, "generate: %d/%d sequences done, %ld tokens, %.0f tokens/s\n", finished, total,
            tokens, tokens / (now - p->t0 + 1e-9));
}

static char *hex(const uint8_t *b, size_t n)
{
    char *s = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) snprintf(s + 2 * i, 3, "%02x", b[i]);
    s[2 * n] = 0;
    return s;
}

/* Samples of a model whose output is not finite (finite weights whose logits overflow) are
** noise with NaN log-probs: an error naming the first one instead of printing them. */
static prl_status check_finite(const gen_args *a, const prl_gen_result *res, int total)
{
    for (int i = 0; i < total; i++)
        for (int t = 0; t < res[i].n; t++)
            if (!isfinite(res[i].logprobs[t]))
                return prl_error_set(PRL_ERR_NUMERIC,
                                     "prompt %d sample %d: the log-prob of generated token %d is "
                                     "%s: the model's output is not finite",
                                     i / a->n, i % a->n, t,
                                     isnan(res[i].logprobs[t]) ? "NaN" : "infinite");
    return PRL_OK;
}

static void print_sample(const gen_args *a, const prl_tokenizer *tok, const prl_model *m, int p,
                         int j, const prl_gen_request *q, const prl_gen_result *r)
{
    char *text = NULL;
    size_t tlen = 0;
    if (tok)
        prl_tokenizer_decode(tok, r->tokens, (size_t)r->n, PRL_TOKENIZER_SKIP_SPECIAL, &text,
                             &tlen);
    double sum = 0;
    for (int i = 0; i < r->n; i++) sum += r->logprobs[i];
    if (!a->json) {
        printf("[prompt %d sample %d] %d tokens, stop %s, sum log-prob %.4f\n%.*s\n", p, j, r->n,
               prl_stop_reason_name(r->stop), sum, (int)tlen, text ? text : "");
        free(text);
        return;
    }
    json_t *o = json_object(), *jt = json_array(), *jl = json_array();
    for (int i = 0; i < r->n; i++) {
        json_array_append_new(jt, json_integer(r->tokens[i]));
        json_array_append_new(jl, json_real(r->logprobs[i]));
    }
    json_object_set_new(o, "prompt_index", json_integer(p));
    json_object_set_new(o, "sample", json_integer(j));
    json_object_set_new(o, "seq_id", json_integer((json_int_t)q->seq_id));
    json_object_set_new(o, "prompt_len", json_integer(q->prompt_len));
    json_object_set_new(o, "tokens", jt);
    json_object_set_new(o, "logprobs", jl);
    json_object_set_new(o, "stop", json_string(prl_stop_reason_name(r->stop)));
    char *view = NULL; /* JSON strings are UTF-8: the text's UTF-8 view (tokens are exact) */
    if (text && prl_utf8_view(text, tlen, &view, &tlen) >= 0)
        json_object_set_new(o, "text", json_stringn(view, tlen));
    free(view);
    if (a->routes) {
        json_t *jr = json_object();
        char *h = hex(r->routes, r->routes_bytes);
        json_object_set_new(jr, "n_tokens", json_integer(r->n_route_tokens));
        json_object_set_new(jr, "n_moe_layers", json_integer(m->n_moe));
        json_object_set_new(jr, "k", json_integer(m->cfg.num_experts_per_tok));
        json_object_set_new(jr, "bytes_per_id",
                            json_integer(prl_routes_width(m->cfg.n_routed_experts)));
        json_object_set_new(jr, "hex", json_string(h));
        json_object_set_new(o, "routes", jr);
        free(h);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    printf("%s\n", s);
    free(s);
    json_decref(o);
    free(text);
}

static int run(const gen_args *a, prl_model *m, const prl_tokenizer *tok, prl_infer_options *io)
{
    cli_prompts pl = {0};
    prl_tasks_mode mode = PRL_MODE_DEFAULT;
    if (a->mode && prl_tasks_mode_parse(a->mode, &mode))
        return cli_failf("generate", 2, "--mode: %s", prl_error_message());
    if (cli_prompts_read(a->prompt, a->input, a->raw, mode, tok, &pl)) return cli_fail("generate");
    int total = pl.n * a->n;
    prl_gen_request *reqs = calloc((size_t)total, sizeof *reqs);
    prl_gen_result *res = calloc((size_t)total, sizeof *res);
    for (int p = 0; p < pl.n; p++)
        for (int j = 0; j < a->n; j++)
            reqs[p * a->n + j] = (prl_gen_request){.prompt = pl.ids[p],
                                                   .prompt_len = pl.len[p],
                                                   .seq_id = (uint64_t)p * a->n + j};
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    int32_t stop_ids[2] = {PRL_TOKEN_EOS, PRL_TOKEN_END}; /* prl's ids when there is no tokenizer */
    int n_stops = 2;
    if (tok && a->raw) { /* raw text ends at eos only */
        stop_ids[0] = prl_tokenizer_role_id(tok, PRL_ROLE_EOS);
        n_stops = stop_ids[0] >= 0;
    } else if (tok) {
        n_stops = prl_tokenizer_stop_ids(tok, stop_ids);
    } else if (a->raw) {
        n_stops = 1;
    }
    const char *stops[1] = {a->stop};
    sp.temperature = a->temperature, sp.top_k = a->top_k, sp.top_p = a->top_p, sp.seed = a->seed;
    sp.max_new_tokens = a->max_new;
    sp.stop_ids = stop_ids, sp.n_stop_ids = a->ignore_eos ? 0 : n_stops;
    sp.stop_strings = stops, sp.n_stop_strings = a->stop ? 1 : 0, sp.tok = tok;
    sp.vocab_limit = tok ? prl_tokenizer_vocab_size(tok) : 0; /* only ids it can decode */
    prl_infer *e = NULL;
    int rc = 0;
    progress_state ps = {.t0 = prl_now(), .last = prl_now(), .quiet = a->quiet};
    char desc[128];
    prl_infer_options_describe(io, desc, sizeof desc);
    if (prl_infer_init(&e, m, io) ||
        prl_infer_generate(e, reqs, total, &sp, res, on_progress, &ps) ||
        check_finite(a, res, total)) {
        rc = cli_fail("generate");
    } else {
        double dt = prl_now() - ps.t0;
        long toks = 0;
        for (int i = 0; i < total; i++) toks += res[i].n;
        if (!a->quiet)
            fprintf(stderr,
                    "generate: %d sequences, %ld new tokens in %.2f s (%.0f tokens/s; %s, "
                    "batch %d)\n",
                    total, toks, dt, toks / (dt + 1e-9), desc, io->max_batch);
        for (int i = 0; i < total; i++)
            print_sample(a, tok, m, i / a->n, i % a->n, &reqs[i], &res[i]);
    }
    for (int i = 0; i < total; i++) prl_gen_result_free(&res[i]);
    free(res), free(reqs);
    prl_infer_free(e);
    cli_prompts_free(&pl);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    gen_args a = {.n = 1, .temperature = 1.0, .top_p = 1.0, .max_new = 128, .batch = 16};
    cli_opt opts[] = {
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "checkpoint directory", 1, 0},
        {"prompt", OPT_STR, &a.prompt, "TEXT", "one prompt (a user message; raw text with --raw)",
         0, 0},
        {"input", OPT_STR, &a.input, "FILE",
         "JSONL of {\"prompt\": ...}, {\"messages\": [...]} or {\"ids\": [...]}", 0, 0},
        {"n", OPT_INT, &a.n, "N", "samples per prompt (default 1)", 0, 0},
        {"temperature", OPT_DOUBLE, &a.temperature, "T",
         "sampling temperature; 0 = greedy (default 1)", 0, 0},
        {"top-k", OPT_INT, &a.top_k, "K", "sample among the K most likely tokens (default 0 = off)",
         0, 0},
        {"top-p", OPT_DOUBLE, &a.top_p, "P", "nucleus sampling mass in (0, 1] (default 1 = off)", 0,
         0},
        {"seed", OPT_U64, &a.seed, "S", "sampling seed (default 0)", 0, 0},
        {"max-new-tokens", OPT_INT, &a.max_new, "N", "tokens to generate at most (default 128)", 0,
         0},
        {"stop", OPT_STR, &a.stop, "TEXT", "stop once the output contains TEXT", 0, 0},
        {"ignore-eos", OPT_FLAG, &a.ignore_eos, NULL, "do not stop at <|eos|> / <|end|>", 0, 0},
        {"mode", OPT_STR, &a.mode, "M",
         "think or no_think: each chat prompt's last user message ends in the /think or "
         "/no_think switch (docs/tasks.md \"Modes\"; default: the prompts as they are)",
         0, 0},
        {"raw", OPT_FLAG, &a.raw, NULL, "prompts are plain text after <|bos|>, not a chat turn", 0,
         0},
        {"precision", OPT_STR, &a.precision, "P",
         "fp32 (default), bf16, fp16, w8a8 (INT8 linears) or aligned (bitwise = train path)", 0, 0},
        {"mla", OPT_STR, &a.mla, "FORM", "absorbed or naive (overrides the preset)", 0, 0},
        {"matmul", OPT_STR, &a.matmul, "KIND", "gemv, gemm or blas (overrides the preset)", 0, 0},
        {"batch", OPT_INT, &a.batch, "B", "sequences decoded together (default 16)", 0, 0},
        {"spec", OPT_INT, &a.spec, "D",
         "self-speculative decoding with D MTP drafts per step "
         "(default 0 = off; the model needs num_nextn_predict_layers >= D)",
         0, 0},
        {"spec-vocab", OPT_INT, &a.spec_vocab, "S",
         "with --spec: the drafts' head covers token ids "
         "[0, S) only, a cheaper draft; the output is unchanged (default 0 = all)",
         0, 0},
        {"routes", OPT_FLAG, &a.routes, NULL, "with --json: add each sample's MoE routes (hex)", 0,
         0},
        {"json", OPT_FLAG, &a.json, NULL, "one JSON object per sample", 0, 0},
        {"quiet", OPT_FLAG, &a.quiet, NULL, "no progress on stderr", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0},
        {0},
    };
    int rc = cli_parse(
        argc, argv, 2, opts,
        "prl generate --ckpt DIR --prompt TEXT|--input FILE.jsonl [--n N --temperature T "
        "--top-p P --seed S --precision fp32|bf16|fp16|w8a8|aligned --json]",
        "Samples completions with the infer path (KV cache, continuous batching).", NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (!a.prompt == !a.input)
        return cli_failf("generate", 2, "give exactly one of --prompt and --input");
    if (a.n < 1) return cli_failf("generate", 2, "--n %d must be >= 1", a.n);
    if (a.routes && !a.json) return cli_failf("generate", 2, "--routes needs --json");
    prl_infer_options io;
    if (cli_infer_options("generate", &io, a.precision, a.mla, a.matmul)) return 2;
    io.max_batch = a.batch, io.spec_drafts = a.spec, io.spec_draft_vocab = a.spec_vocab;
    prl_sample_params check;
    prl_sample_params_default(&check);
    check.temperature = a.temperature, check.top_k = a.top_k, check.top_p = a.top_p;
    check.max_new_tokens = a.max_new;
    if (prl_sample_params_check(&check, 1 << 30))
        return cli_failf("generate", 2, "%s", prl_error_message());
    if (cli_setup_blas("generate", a.threads)) return 1;
    prl_model m;
    prl_tokenizer *tok = NULL;
    if (prl_checkpoint_load_tokenizer(&m, a.ckpt, &tok)) return cli_fail("generate");
    rc = run(&a, &m, tok, &io);
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    return rc;
}
