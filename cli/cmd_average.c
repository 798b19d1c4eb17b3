/*
** cmd_average.c — `prl average`: the element-wise mean of several checkpoints' weights
** (latest-weight averaging), written as a new checkpoint.
**
** Why: a greedy-decoded policy can swing between neighbouring checkpoints of one run (docs/
** results/2026-11-30.md, the OPD top-k runs: a student's Coding share went 12% → 125% → 84% at
** v300/v400/v500). The mean of the last few kept checkpoints is a steadier policy than any
** one of them.
**
** Every input must be the same model: the canonical config.json texts and the tokenizer.json
** bytes of each input equal the first's, or the command stops naming the file. The sum runs in
** double over the inputs in the order given (a fixed reduction order), and the mean is rounded
** to fp32 once. One input model is resident at a time, beside a double accumulator.
*/
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_INPUTS = 64 };

/* The input `dir` (model m, tokenizer t or NULL) is the same model as the first input
** (config `first_cfg`, tokenizer.json text `first_tok`/`first_tok_n`, NULL without one): else
** an error naming the file that differs. */
static prl_status same_model(const char *dir, const prl_model *m, const prl_tokenizer *t,
                             const char *first_dir, const char *first_cfg, const char *first_tok,
                             size_t first_tok_n)
{
    char *cfg = prl_config_to_json(&m->cfg);
    int same = cfg && !strcmp(cfg, first_cfg);
    free(cfg);
    if (!same)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s/config.json is another model config than "
                             "%s/config.json: only checkpoints of one model can be averaged",
                             dir, first_dir);
    if (!first_tok != !t)
        return prl_error_set(PRL_ERR_CONFIG,
                             "%s %s a tokenizer.json and %s %s: only checkpoints "
                             "with one tokenizer can be averaged",
                             dir, t ? "has" : "lacks", first_dir, first_tok ? "has" : "lacks");
    if (!t) return PRL_OK;
    char path[1200], *tok = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    prl_status rc = prl_file_read(path, &tok, &n);
    if (!rc && (n != first_tok_n || memcmp(tok, first_tok, n)))
        rc = prl_error_set(PRL_ERR_CONFIG,
                           "%s differs from %s/tokenizer.json: only checkpoints "
                           "with one tokenizer can be averaged",
                           path, first_dir);
    free(tok);
    return rc;
}

/* The first input's config (canonical JSON) and tokenizer.json text (NULL without one). */
static prl_status first_identity(const char *dir, const prl_model *m, const prl_tokenizer *tok,
                                 char **cfg, char **tok_text, size_t *tok_n)
{
    *cfg = prl_config_to_json(&m->cfg);
    *tok_text = NULL, *tok_n = 0;
    if (!*cfg) return prl_error_set(PRL_ERR_NOMEM, "%s/config.json: out of memory", dir);
    if (!tok) return PRL_OK;
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    return prl_file_read(path, tok_text, tok_n);
}

/* The averaged values of a model: its parameters, then its routers' selection biases (kept
** beside the parameters; the bias balancing rule moves them during training). */
static size_t n_values(const prl_model *m)
{
    return m->n_params + (size_t)m->n_moe_all * (size_t)m->cfg.n_routed_experts;
}

static void accumulate(double *acc, const prl_model *m, int first)
{
    size_t np = m->n_params, n = n_values(m);
    for (size_t j = 0; j < n; j++) {
        double v = j < np ? m->params[j] : m->router_bias[j - np];
        acc[j] = first ? v : acc[j] + v;
    }
}

static void store_mean(prl_model *m, const double *acc, int n_inputs)
{
    size_t np = m->n_params, n = n_values(m);
    for (size_t j = 0; j < n; j++) {
        double v = acc[j] / n_inputs;
        if (j < np) m->params[j] = (prl_real)v;
        else m->router_bias[j - np] = (prl_real)v;
    }
}

/* The state.json of the result: what it is the mean of. */
static char *average_state(const char **in, int n)
{
    json_t *o = json_object(), *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_string(in[i]));
    json_object_set_new(o, "averaged_from", a);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Sum the inputs into acc (double, n_values) in the order given, checking each against the
** first; on return `first` holds the first input (for its layout and tokenizer). */
static prl_status sum_inputs(const char **in, int n, prl_model *first, prl_tokenizer **tok,
                             double **acc)
{
    prl_status rc = prl_checkpoint_load_tokenizer(first, in[0], tok);
    if (rc) return rc;
    char *cfg = NULL, *tok_text = NULL;
    size_t tok_n = 0;
    rc = first_identity(in[0], first, *tok, &cfg, &tok_text, &tok_n);
    *acc = rc ? NULL : malloc(n_values(first) * sizeof **acc);
    if (!rc && !*acc)
        rc = prl_error_set(PRL_ERR_NOMEM, "%zu parameters: out of memory", first->n_params);
    if (!rc) accumulate(*acc, first, 1);
    for (int i = 1; !rc && i < n; i++) {
        prl_model m;
        prl_tokenizer *t = NULL;
        memset(&m, 0, sizeof m);
        if ((rc = prl_checkpoint_load_tokenizer(&m, in[i], &t))) break;
        rc = same_model(in[i], &m, t, in[0], cfg, tok_text, tok_n);
        if (!rc) accumulate(*acc, &m, 0);
        prl_model_free(&m);
        prl_tokenizer_free(t);
        if (!rc) fprintf(stderr, "prl average: %d/%d %s\n", i + 1, n, in[i]);
    }
    free(cfg), free(tok_text);
    return rc;
}

int cmd_average(int argc, char **argv)
{
    const char *out = NULL, *in[MAX_INPUTS];
    int n = 0;
    cli_opt opts[] = {
        {"out", OPT_STR, &out, "DIR", "checkpoint directory to write (must not exist)", 1, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 2, opts,
                       "prl average --out DIR CKPT CKPT [CKPT...]   (2 to 64 checkpoints)",
                       "Writes the element-wise mean of the checkpoints' weights (summed in double "
                       "in the order given, rounded to fp32 once) as a checkpoint with the first "
                       "input's config.json and tokenizer.json; state.json lists the inputs. Every "
                       "input must have the same model config and tokenizer; one given k times "
                       "counts k times (a weighted mean). No optimizer state "
                       "is written: the result is for eval, generate, score or as model.init.",
                       in, MAX_INPUTS, &n);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (n < 2) return cli_failf("average", 2, "needs at least 2 checkpoints, got %d", n);
    if (cli_require_new("average", "out", out)) return 2;
    prl_model first;
    prl_tokenizer *tok = NULL;
    double *acc = NULL;
    memset(&first, 0, sizeof first);
    prl_status st = sum_inputs(in, n, &first, &tok, &acc);
    if (!st) {
        store_mean(&first, acc, n);
        char *state = average_state(in, n);
        st = prl_checkpoint_save(&first, NULL, state, tok, out);
        free(state);
    }
    if (!st)
        fprintf(stderr, "prl average: mean of %d checkpoints, %zu parameters -> %s\n", n,
                first.n_params, out);
    free(acc);
    prl_tokenizer_free(tok);
    if (first.params) prl_model_free(&first);
    return st ? cli_fail("average") : 0;
}
