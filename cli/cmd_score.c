/*
** cmd_score.c — `prl score`: per-token log-probs of given sequences on the train path.
**
** Input: JSONL, one sequence per line as {"ids": [...]}, {"text": "..."} or
** {"messages": [...]} (chat template). Output: for each line, the log-prob of every token
** given the ones before it (the first token has none).
**
** --path infer scores the same tokens the way a rollout produced them: the prompt is
** prefilled and every later token fed one decode step at a time (teacher forcing), with the
** infer path's precision and knobs. The prompt is the text before the first assistant token
** (chat input), else "prompt_len" of the line, else the first token.
**
** --logits FILE writes the train path's logits, one F32 tensor "line.N" [tokens, vocab] per
** input line, so another implementation (the PyTorch reference, transformers) can be
** compared with prl on an imported checkpoint.
*/
#include "cli/cli.h"

#include <math.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct score_args {
    const char *ckpt, *input, *path, *precision, *mla, *matmul, *logits;
    double temperature;
    int json, threads;
} score_args;

static prl_status score_line(prl_model *m, const int32_t *ids, size_t n, double temperature,
                             const score_args *a, int line, float *lp)
{
    if ((int)n > m->cfg.max_position_embeddings)
        return prl_error_set(PRL_ERR_RANGE, "%s:%d: %zu tokens exceed max_position_embeddings %d",
                             a->input, line, n, m->cfg.max_position_embeddings);
    int32_t *targets = malloc(n * sizeof *targets);
    for (size_t i = 0; i < n; i++) targets[i] = i + 1 < n ? ids[i + 1] : -1;
    int32_t len = (int32_t)n;
    prl_batch b = {.B = 1,
                   .T = (int)n,
                   .tokens = ids,
                   .lens = &len,
                   .targets = targets,
                   .temperature = temperature};
    prl_status rc = prl_model_logprobs(m, &b, lp);
    free(targets);
    if (rc) return prl_error_wrap(rc, "%s:%d: ", a->input, line);
    return PRL_OK;
}

/* The infer path: prefill ids[0, P), then teacher-force ids[P, n); lp[i-1] scores ids[i]. */
static prl_status score_line_infer(prl_infer *e, const int32_t *ids, size_t n, int P,
                                   double temperature, const score_args *a, int line, float *lp)
{
    if (P < 1 || (size_t)P > n)
        return prl_error_set(PRL_ERR_RANGE, "%s:%d: prompt length %d not in [1, %zu]", a->input,
                             line, P, n);
    prl_gen_request q = {.prompt = ids, .prompt_len = P, .forced = ids + P, .n_forced = (int)n - P};
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    sp.temperature = temperature;
    prl_gen_result r;
    prl_status rc = prl_infer_generate(e, &q, 1, &sp, &r, NULL, NULL);
    if (rc) return prl_error_wrap(rc, "%s:%d: ", a->input, line);
    for (size_t i = 1; i < n; i++)
        lp[i - 1] = (int)i < P ? r.prompt_logprobs[i] : r.logprobs[i - P];
    prl_gen_result_free(&r);
    return PRL_OK;
}

/* A log-prob that is not finite (finite weights whose logits overflow) would print as "nan"
** or vanish from the JSON: an error naming the line and the token instead. */
static prl_status check_finite(const score_args *a, int line, const float *lp, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (!isfinite(lp[i]))
            return prl_error_set(PRL_ERR_NUMERIC,
                                 "%s:%d: the log-prob of token %zu is %s: the model's output is "
                                 "not finite",
                                 a->input, line, i + 1, isnan(lp[i]) ? "NaN" : "infinite");
    return PRL_OK;
}

static void print_result(const score_args *a, int line, const int32_t *ids, const uint8_t *mask,
                         size_t n, const float *lp)
{
    double sum = 0, asum = 0;
    int an = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        sum += lp[i];
        if (mask && mask[i + 1]) asum += lp[i], an++;
    }
    if (!a->json) {
        printf("line %d: %zu tokens, sum log-prob %.6f, mean %.6f", line, n, sum,
               n > 1 ? sum / (double)(n - 1) : 0.0);
        if (mask) printf("; assistant tokens %d, mean log-prob %.6f", an, an ? asum / an : 0.0);
        printf("\n");
        return;
    }
    json_t *o = json_object(), *jid = json_array(), *jlp = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(jid, json_integer(ids[i]));
        json_array_append_new(jlp, i == 0 ? json_null() : json_real(lp[i - 1]));
    }
    json_object_set_new(o, "line", json_integer(line));
    json_object_set_new(o, "ids", jid);
    json_object_set_new(o, "logprobs", jlp);
    json_object_set_new(o, "sum", json_real(sum));
    if (mask) {
        json_t *jm = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(jm, json_integer(mask[i]));
        json_object_set_new(o, "assistant_mask", jm);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    printf("%s\n", s);
    free(s);
    json_decref(o);
}

#define LOGITS_MAX_BYTES ((size_t)4 << 30)

typedef struct score_ctx {
    const score_args *a;
    prl_model *m;
    prl_infer *eng;
    const prl_tokenizer *tok;
    int infer;
    prl_safetensors_writer logits; /* --logits: one tensor per line */
    float **kept;                  /* their data, owned */
    int n_kept;
    size_t kept_bytes;
} score_ctx;

/* Keep the last forward's logits [n, V] as tensor "line.N" for --logits. */
static prl_status keep_logits(score_ctx *c, int line, size_t n)
{
    size_t V = (size_t)c->m->cfg.vocab_size;
    /* the file is rendered in memory: bounded so a large input fails clearly, not by OOM */
    if ((c->kept_bytes += n * V * sizeof(float)) > LOGITS_MAX_BYTES)
        return prl_error_set(PRL_ERR_RANGE,
                             "--logits: line %d brings the logits past %d GiB; score fewer or "
                             "shorter lines",
                             line, (int)(LOGITS_MAX_BYTES >> 30));
    float **grown = realloc(c->kept, (size_t)(c->n_kept + 1) * sizeof *grown);
    if (!grown) return prl_error_set(PRL_ERR_NOMEM, "--logits");
    c->kept = grown;
    float *x = malloc(n * V * sizeof *x + 1);
    if (!x) return prl_error_set(PRL_ERR_NOMEM, "--logits");
    c->kept[c->n_kept++] = x;
    const prl_real *src = prl_model_logits(c->m);
    for (size_t i = 0; i < n * V; i++) x[i] = (float)src[i];
    char name[32];
    snprintf(name, sizeof name, "line.%d", line);
    int64_t shape[2] = {(int64_t)n, (int64_t)V};
    return prl_safetensors_writer_add(&c->logits, name, PRL_DTYPE_F32, shape, 2, x);
}

/* One input line: score it on the chosen path and print the result. */
static prl_status score_one(void *user, json_t *obj, int line, int *go)
{
    score_ctx *c = user;
    const score_args *a = c->a;
    (void)go;
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    prl_status st = cli_jsonl_sequence(obj, c->tok, a->input, line, &ids, &mask, &n);
    int P = st == PRL_OK ? cli_jsonl_prompt_len(obj, mask, n) : 0;
    float *lp = st == PRL_OK ? malloc(n * sizeof *lp) : NULL;
    if (st == PRL_OK && !lp) st = prl_error_set(PRL_ERR_NOMEM, "%s:%d: log-probs", a->input, line);
    if (st == PRL_OK && c->infer)
        st = score_line_infer(c->eng, ids, n, P, a->temperature, a, line, lp);
    else if (st == PRL_OK) st = score_line(c->m, ids, n, a->temperature, a, line, lp);
    if (st == PRL_OK) st = check_finite(a, line, lp, n);
    if (st == PRL_OK && a->logits) st = keep_logits(c, line, n);
    if (st == PRL_OK) print_result(a, line, ids, mask, n, lp);
    free(ids);
    free(mask);
    free(lp);
    return st;
}

int cmd_score(int argc, char **argv)
{
    score_args a = {.temperature = 1.0, .path = "train"};
    cli_opt opts[] = {
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "checkpoint directory", 1, 0},
        {"input", OPT_STR, &a.input, "FILE",
         "JSONL of {\"ids\": [...]}, {\"text\": ...} or {\"messages\": [...]}", 1, 0},
        {"temperature", OPT_DOUBLE, &a.temperature, "T",
         "log-probs of softmax(logits / T) (default 1)", 0, 0},
        {"path", OPT_STR, &a.path, "NAME", "engine path to score with: train (default) or infer", 0,
         0},
        {"precision", OPT_STR, &a.precision, "P",
         "infer path: fp32 (default), bf16, fp16, w8a8 or aligned", 0, 0},
        {"mla", OPT_STR, &a.mla, "FORM", "infer path: absorbed or naive (overrides the preset)", 0,
         0},
        {"matmul", OPT_STR, &a.matmul, "KIND",
         "infer path: gemv, gemm or blas (overrides the preset)", 0, 0},
        {"json", OPT_FLAG, &a.json, NULL,
         "one JSON object per line: ids, logprobs (null first), sum", 0, 0},
        {"logits", OPT_STR, &a.logits, "FILE",
         "train path: also write every line's logits to FILE.safetensors (a new file)", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 2, opts,
                       "prl score --ckpt DIR --input FILE.jsonl [--path train|infer] [--json] "
                       "[--logits FILE]",
                       "Scores every token of every input sequence with the model's train path or "
                       "its infer path (prefill + teacher-forced decode).",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    int infer = !strcmp(a.path, "infer");
    if (!infer && strcmp(a.path, "train") != 0)
        return cli_failf("score", 2, "--path %s: choose train or infer", a.path);
    if (!infer && (a.precision || a.mla || a.matmul))
        return cli_failf("score", 2, "--precision, --mla and --matmul apply to --path infer only");
    if (infer && a.logits) return cli_failf("score", 2, "--logits applies to --path train only");
    if (a.logits && cli_require_new("score", "logits", a.logits)) return 2;
    prl_infer_options io;
    if (cli_infer_options("score", &io, a.precision, a.mla, a.matmul)) return 2;
    if (!(a.temperature > 0)) return cli_failf("score", 2, "--temperature must be > 0");
    if (cli_setup_blas("score", a.threads)) return 1;
    prl_model m;
    prl_tokenizer *tok = NULL;
    if (prl_checkpoint_load_tokenizer(&m, a.ckpt, &tok)) return cli_fail("score");
    prl_infer *eng = NULL;
    io.max_batch = 1;
    if (infer && prl_infer_init(&eng, &m, &io)) {
        prl_tokenizer_free(tok);
        prl_model_free(&m);
        return cli_fail("score");
    }
    score_ctx sc = {.a = &a, .m = &m, .eng = eng, .tok = tok, .infer = infer};
    prl_safetensors_writer_init(&sc.logits);
    prl_status st = cli_jsonl_for_each(a.input, score_one, &sc);
    if (st == PRL_OK && a.logits) st = prl_safetensors_writer_save(&sc.logits, a.logits);
    prl_safetensors_writer_free(&sc.logits);
    for (int i = 0; i < sc.n_kept; i++) free(sc.kept[i]);
    free(sc.kept);
    prl_infer_free(eng);
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    return st ? cli_fail("score") : 0;
}
