/*
** cmd_diagnose.c — `prl diagnose`: where the train path and the infer path (or another
** engine's dump) disagree on the same tokens. The measuring is diagnose/; this file reads the
** sequences (a run's samples from run.db, or a JSONL file), parses the options and prints.
**
** Sequences: --run runs/NAME takes up to --n samples of --step (default: the latest step with
** samples), prompt and response as the rollout produced them; --jsonl FILE takes lines as
** `prl score` does ({"ids": [...], "prompt_len": P}, {"text": ...}, {"messages": [...]}).
*/
#include "cli/cli.h"
#include "diagnose/diagnose.h"
#include "store/store.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct diag_args {
    const char *ckpt, *run, *jsonl, *external, *html, *precision, *mla, *matmul;
    int step, n, batch, threads, json, sweep, step_seen;
    int calibrate; /* w8a8: SmoothQuant factors from this many sequences after the compared */
    double threshold, temperature;
} diag_args;

/* Owned sequences and their labels. */
typedef struct seq_list {
    prl_diag_seq *s;
    int n, cap;
} seq_list;

static void seq_list_free(seq_list *l)
{
    for (int i = 0; i < l->n; i++) free((void *)l->s[i].tokens), free((void *)l->s[i].label);
    free(l->s);
    memset(l, 0, sizeof *l);
}

/* Append a copy of ids[0, n) (ownership of `ids` passes to the list). */
static prl_status seq_list_add(seq_list *l, int32_t *ids, int n, int prompt_len, const char *label)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        prl_diag_seq *s = realloc(l->s, (size_t)cap * sizeof *s);
        if (!s) return free(ids), prl_error_set(PRL_ERR_NOMEM, "sequences");
        l->s = s, l->cap = cap;
    }
    char *lb = strdup(label);
    if (!lb) return free(ids), prl_error_set(PRL_ERR_NOMEM, "sequences");
    l->s[l->n++] = (prl_diag_seq){.tokens = ids, .n = n, .prompt_len = prompt_len, .label = lb};
    return PRL_OK;
}

typedef struct jsonl_ctx {
    const char *path;
    const prl_tokenizer *tok;
    int max_n;
    seq_list *out;
} jsonl_ctx;

static prl_status jsonl_one(void *user, json_t *obj, int line, int *go)
{
    jsonl_ctx *c = user;
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    prl_status st = cli_jsonl_sequence(obj, c->tok, c->path, line, &ids, &mask, &n);
    int P = st == PRL_OK ? cli_jsonl_prompt_len(obj, mask, n) : 0;
    free(mask);
    char label[512];
    snprintf(label, sizeof label, "%s:%d", c->path, line);
    if (st == PRL_OK) st = seq_list_add(c->out, ids, (int)n, P, label);
    *go = c->out->n < c->max_n;
    return st;
}

/* Up to max_n lines of a JSONL file. */
static prl_status load_jsonl(const char *path, const prl_tokenizer *tok, int max_n, seq_list *out)
{
    jsonl_ctx c = {.path = path, .tok = tok, .max_n = max_n, .out = out};
    prl_status st = cli_jsonl_for_each(path, jsonl_one, &c);
    if (st == PRL_OK && out->n == 0) st = prl_error_set(PRL_ERR_FORMAT, "%s: no sequences", path);
    return st;
}

/* Up to max_n samples of one step of runs/NAME/run.db (the run's name is the directory's). */
static prl_status load_run(const char *dir, int step_arg, int step_seen, int max_n, seq_list *out)
{
    char path[4096], name[256];
    snprintf(path, sizeof path, "%s/run.db", dir);
    const char *slash = strrchr(dir, '/');
    snprintf(name, sizeof name, "%s", slash && slash[1] ? slash + 1 : dir);
    if (slash && !slash[1]) { /* runs/NAME/ */
        const char *b = slash;
        while (b > dir && b[-1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(slash - b), b);
    }
    if (access(path, R_OK) != 0) return prl_error_set(PRL_ERR_IO, "cannot read %s: %m", path);
    prl_store *db = NULL;
    prl_store_run run = {0};
    prl_store_sample *smp = NULL;
    size_t ns = 0;
    int64_t step = step_arg;
    prl_status rc = prl_store_open(path, &db);
    if (!rc) rc = prl_store_run_get(db, name, &run);
    if (!rc && !step_seen) {
        rc = prl_store_sample_last_step(db, run.id, &step);
        if (!rc && step < 0)
            rc = prl_error_set(PRL_ERR_RANGE, "%s: run %s has no samples", path, name);
    }
    if (!rc) rc = prl_store_samples_for_step(db, run.id, step, -1, &smp, &ns);
    if (!rc && ns == 0)
        rc = prl_error_set(PRL_ERR_RANGE, "%s: run %s has no samples at step %lld", path, name,
                           (long long)step);
    for (size_t i = 0; !rc && i < ns && out->n < max_n; i++) {
        const prl_store_sample *s = &smp[i];
        int32_t *ids = malloc((size_t)(s->n_tokens > 0 ? s->n_tokens : 1) * sizeof *ids);
        if (!ids) {
            rc = prl_error_set(PRL_ERR_NOMEM, "sample tokens");
            break;
        }
        memcpy(ids, s->tokens, (size_t)s->n_tokens * sizeof *ids);
        char label[512];
        snprintf(label, sizeof label, "%s step %lld prompt %s sample %d", name, (long long)s->step,
                 s->prompt_id, s->sample_index);
        rc = seq_list_add(out, ids, s->n_tokens, s->prompt_len, label);
    }
    prl_store_samples_free(smp, ns);
    prl_store_run_free(&run);
    prl_store_close(db);
    return rc ? prl_error_wrap(rc, "--run %s: ", dir) : PRL_OK;
}

static int check_args(const diag_args *a)
{
    if (!!a->run == !!a->jsonl)
        return cli_failf("diagnose", 2, "give exactly one of --run and --jsonl");
    if (a->step_seen && !a->run) return cli_failf("diagnose", 2, "--step applies to --run only");
    if (a->n < 1) return cli_failf("diagnose", 2, "--n %d must be >= 1", a->n);
    if (a->batch < 1 || a->batch > 4096)
        return cli_failf("diagnose", 2, "--batch %d not in [1, 4096]", a->batch);
    if (a->threads < 0) return cli_failf("diagnose", 2, "--threads %d must be >= 0", a->threads);
    if (!(a->threshold >= 0)) return cli_failf("diagnose", 2, "--threshold must be >= 0");
    if (!(a->temperature > 0)) return cli_failf("diagnose", 2, "--temperature must be > 0");
    if (a->calibrate < 0 || a->calibrate > 4096)
        return cli_failf("diagnose", 2, "--calibrate %d not in [0, 4096]", a->calibrate);
    if (a->calibrate && (!a->precision || strcmp(a->precision, "w8a8")))
        return cli_failf("diagnose", 2, "--calibrate needs --precision w8a8");
    if (a->external && !a->sweep && (a->precision || a->mla || a->matmul))
        return cli_failf("diagnose", 2,
                         "--precision, --mla and --matmul set the infer path, which "
                         "--external replaces (with --sweep they set the sweep's baseline)");
    return 0;
}

/* --calibrate: SmoothQuant factors from sequences [first, l->n) of the list (each prefilled
** whole), a summary on stderr. */
static prl_status calibrate(const prl_model *m, const prl_infer_options *io, const seq_list *l,
                            int first, prl_w8a8_smooth **out)
{
    int n = l->n - first;
    if (n < 1)
        return prl_error_set(
            PRL_ERR_ARG, "--calibrate: the source has no sequences after the %d compared", first);
    prl_gen_request *q = calloc((size_t)n, sizeof *q);
    if (!q) return prl_error_set(PRL_ERR_NOMEM, "calibration prompts");
    for (int i = 0; i < n; i++)
        q[i] = (prl_gen_request){.prompt = l->s[first + i].tokens,
                                 .prompt_len = l->s[first + i].n - 1, /* room for one token */
                                 .seq_id = (uint64_t)i};
    prl_w8a8_calib c;
    prl_status rc = prl_w8a8_calibrate(out, m, io, q, n, &c);
    free(q);
    if (!rc)
        fprintf(stderr,
                "diagnose: SmoothQuant on %d calibration sequences: %d INT8 linears, %d smoothed "
                "(alpha 0/.25/.5/.75/1: %d/%d/%d/%d/%d); summed output MSE %.4g -> %.4g\n",
                n, c.linears, c.smoothed, c.alpha_count[0], c.alpha_count[1], c.alpha_count[2],
                c.alpha_count[3], c.alpha_count[4], c.mse_plain, c.mse_smooth);
    return rc;
}

/* Print the report (and sweep) as asked; write the HTML page. */
static prl_status emit_output(const diag_args *a, const prl_diag_report *r, const prl_diag_sweep *s)
{
    if (a->json) {
        json_t *o = prl_diag_to_json(r, s);
        json_object_set_new(o, "ckpt", json_string(a->ckpt));
        json_object_set_new(o, "source", json_string(a->run ? a->run : a->jsonl));
        char *text = json_dumps(o, JSON_INDENT(1) | JSON_REAL_PRECISION(9));
        json_decref(o);
        if (!text) return prl_error_set(PRL_ERR_NOMEM, "JSON output");
        printf("%s\n", text);
        free(text);
    } else {
        printf("prl diagnose: %s (%s)\n", a->run ? a->run : a->jsonl, a->ckpt);
        prl_diag_print(stdout, r, s);
    }
    return a->html ? prl_diag_write_html(a->html, r, s) : PRL_OK;
}

int cmd_diagnose(int argc, char **argv)
{
    diag_args a = {.n = 8, .batch = 8, .threshold = 1e-4, .temperature = 1.0};
    cli_opt opts[] = {
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "checkpoint directory", 1, 0},
        {"run", OPT_STR, &a.run, "DIR", "take sequences from the run's samples (runs/NAME)", 0, 0},
        {"step", OPT_INT, &a.step, "S", "--run: the step (default: the latest with samples)", 0, 0},
        {"jsonl", OPT_STR, &a.jsonl, "FILE",
         "take sequences from JSONL ({\"ids\": [...], \"prompt_len\": P}, "
         "{\"text\": ...} or {\"messages\": [...]})",
         0, 0},
        {"n", OPT_INT, &a.n, "N", "at most N sequences (default 8)", 0, 0},
        {"calibrate", OPT_INT, &a.calibrate, "C",
         "with --precision w8a8: SmoothQuant factors searched on the C sequences after the N "
         "compared (default 0 = no smoothing)",
         0, 0},
        {"precision", OPT_STR, &a.precision, "P",
         "infer path: fp32 (default), bf16, fp16, w8a8 or aligned", 0, 0},
        {"mla", OPT_STR, &a.mla, "FORM", "infer path: absorbed or naive (overrides the preset)", 0,
         0},
        {"matmul", OPT_STR, &a.matmul, "KIND",
         "infer path: gemm, gemv or blas (overrides the preset)", 0, 0},
        {"batch", OPT_INT, &a.batch, "B", "infer path: sequences decoded together (default 8)", 0,
         0},
        {"threads", OPT_INT, &a.threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0},
        {"threshold", OPT_DOUBLE, &a.threshold, "X",
         "an op diverges when its relative L2 exceeds X "
         "(default 1e-4; 0: any difference)",
         0, 0},
        {"temperature", OPT_DOUBLE, &a.temperature, "T",
         "log-probs of softmax(logits / T) (default 1)", 0, 0},
        {"sweep", OPT_FLAG, &a.sweep, NULL,
         "also switch the infer knobs one at a time and attribute "
         "the mean |d log-prob| to each",
         0, 0},
        {"external", OPT_STR, &a.external, "DIR",
         "compare with another engine's dump "
         "(DIR/seq-<i>.safetensors, docs/diagnose.md)",
         0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the report as JSON (schema prl.diagnose/1)", 0, 0},
        {"html", OPT_STR, &a.html, "FILE", "write an HTML report with plots", 0, 0},
        {0},
    };
    int rc =
        cli_parse(argc, argv, 2, opts,
                  "prl diagnose --ckpt DIR (--run runs/NAME [--step S] | --jsonl FILE) [--n N] "
                  "[--precision P] [--sweep] [--external DIR] [--json] [--html FILE]",
                  "Runs the train path and the infer path (or reads another engine's dump) on "
                  "the same tokens with tensor hooks and shows where they disagree: per layer "
                  "and op the max abs difference, relative L2 and PCC, the first op above the "
                  "threshold, routing overlap per MoE layer and a histogram of per-token "
                  "log-prob differences (docs/diagnose.md).",
                  NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    a.step_seen = opts[2].seen;
    if ((rc = check_args(&a))) return rc;
    if (a.html && cli_require_new("diagnose", "html", a.html)) return 2; /* before the work */
    prl_infer_options io;
    if (cli_infer_options("diagnose", &io, a.precision, a.mla, a.matmul)) return 2;
    io.max_batch = a.batch;
    if (cli_setup_blas("diagnose", a.threads)) return 1;
    int threads = prl_pool_threads();
    prl_model m;
    prl_tokenizer *tok = NULL;
    if (prl_checkpoint_load_tokenizer(&m, a.ckpt, &tok)) return cli_fail("diagnose");
    seq_list seqs = {0};
    prl_diag_report rep = {0};
    prl_diag_sweep sw = {0};
    int want = a.n + a.calibrate;
    prl_w8a8_smooth *smooth = NULL;
    prl_status st = a.run ? load_run(a.run, a.step, a.step_seen, want, &seqs)
                          : load_jsonl(a.jsonl, tok, want, &seqs);
    int all = seqs.n;
    if (!st && a.calibrate) {
        st = seqs.n > a.n ? calibrate(&m, &io, &seqs, a.n, &smooth)
                          : calibrate(&m, &io, &seqs, seqs.n, &smooth);
        io.smooth = smooth;
        seqs.n = seqs.n < a.n ? seqs.n : a.n; /* the compared ones */
    }
    if (!st && a.external)
        st = prl_diag_compare_external(&m, a.external, seqs.s, seqs.n, a.threshold, a.temperature,
                                       &rep);
    else if (!st)
        st = prl_diag_compare_infer(&m, &io, threads, seqs.s, seqs.n, a.threshold, a.temperature,
                                    &rep);
    if (!st && a.sweep)
        st = prl_diag_sweep_run(&m, &io, threads, seqs.s, seqs.n, a.temperature, &sw);
    if (!st) st = emit_output(&a, &rep, a.sweep ? &sw : NULL);
    prl_diag_sweep_free(&sw);
    prl_diag_report_free(&rep);
    seqs.n = all;
    seq_list_free(&seqs);
    prl_w8a8_smooth_free(smooth);
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    return st ? cli_fail("diagnose") : 0;
}
