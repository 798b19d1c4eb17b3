/*
** cmd_sft.c — `prl sft`: supervised fine-tuning on chat JSONL.
**
** Starts from a model config (random init) or a checkpoint, takes the tokenizer from
** --tokenizer, the checkpoint, or trains one on the data; prints a progress line
** (loss, tokens/s, ETA) and writes the result as a checkpoint directory. A recipe may start
** from another run's weights with DSA layers added and warm their indexers up first
** (post-hoc sparsification, docs/recipes.md).
*/
#include "cli/cli.h"
#include "job/recipe.h"
#include "sft/sft.h"
#include "tasks/tasks.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct sft_args {
    const char *data, *model, *ckpt, *out, *tokenizer, *optimizer, *schedule;
    const char *precision, *loss_scale; /* train precision; scaler preset, "off" or NULL (auto) */
    const char *init_from; /* recipe: weights of this checkpoint into --model's config */
    const char *metrics;   /* one JSON line per step appended here (NULL: none) */
    const char *heldout;   /* recipe, DSA conversion: eval-split demos for the held-out loss */
    int dsa_warmup;        /* recipe: DSA indexer warm-up steps before the SFT steps */
    double dsa_warmup_lr;
    int dsa_dense; /* recipe: the first N SFT steps in the DSA dense stage (from scratch) */
    int steps, batch, seq, accum, warmup, threads, log_every, save_every, resume, group, special;
    int pack;        /* packed rows (prl_sft_config.pack) */
    int mask_errors; /* mask the assistant turns the environment rejected (PRL_SFT_MASK_ERRORS) */
    int vocab;       /* tokenizer trained on the data: vocabulary size (0: the model's) */
    double lr, min_lr_ratio, weight_decay, grad_clip, expert_clip;
    uint64_t seed;
} sft_args;

/* One step's line of the metrics file (docs/formats.md "SFT metrics"); a failure is printed
** once and the file left alone after it, as the checkpoint matters more than the log. */
static void append_metrics(const char **path, const prl_sft_progress *p)
{
    char line[640];
    snprintf(line, sizeof line,
             "{\"step\": %d, \"steps\": %d, \"loss\": %.6f, \"balance_loss\": %.6g, "
             "\"z_loss\": %.6g, \"mtp_loss\": %.6g, \"index_loss\": %.6g, \"lr\": %.6g, "
             "\"grad_norm\": %.6g, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, "
             "\"loss_scale\": %g, \"skipped\": %ld}",
             p->step, p->steps, p->loss, p->balance_loss, p->z_loss, p->mtp_loss, p->index_loss,
             p->lr, p->grad_norm, p->tokens_per_s, p->elapsed_s, p->loss_scale, p->skipped);
    if (prl_file_append_line(*path, line)) {
        fprintf(stderr, "sft: metrics: %s (no more lines are written)\n", prl_error_message());
        *path = NULL;
    }
}

/* user: the metrics file's path (const char **: every step is appended to it; the path is
** cleared after a failure), or NULL (progress lines only). */
static void print_progress(void *user, const prl_sft_progress *p)
{
    const char **metrics = user;
    if (metrics && *metrics) append_metrics(metrics, p);
    if (!p->log_line) return;
    char eta[32], el[32];
    prl_format_duration(eta, sizeof eta, p->eta_s);
    prl_format_duration(el, sizeof el, p->elapsed_s);
    char scale[64] = "", ikl[32] = "", mtp[32] = "";
    if (p->loss_scale > 0)
        snprintf(scale, sizeof scale, "  scale %g  skipped %ld", p->loss_scale, p->skipped);
    if (p->index_loss != 0) snprintf(ikl, sizeof ikl, "  index_kl %.4f", p->index_loss);
    if (p->mtp_loss != 0) snprintf(mtp, sizeof mtp, "  mtp %.4f", p->mtp_loss);
    fprintf(stderr,
            "step %d/%d  loss %.4f%s%s  lr %.2e  gnorm %.3f%s  tok/s %.0f  elapsed %s  eta %s\n",
            p->step, p->steps, p->loss, mtp, ikl, p->lr, p->grad_norm, scale, p->tokens_per_s, el,
            eta);
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The tokenizer: --tokenizer, else the checkpoint's, else trained on the data. */
static prl_status get_tokenizer(const sft_args *a, int vocab_size, prl_tokenizer **tok)
{
    char path[4096];
    if (a->tokenizer) return prl_tokenizer_load(a->tokenizer, tok);
    const char *ckpt = a->ckpt ? a->ckpt : a->init_from; /* the tokenizer its weights know */
    if (ckpt) {
        snprintf(path, sizeof path, "%s/tokenizer.json", ckpt);
        if (file_exists(path)) return prl_tokenizer_load(path, tok);
    }
    char **texts = NULL;
    size_t n = 0;
    prl_status rc = prl_sft_read_texts(a->data, &texts, &n);
    if (rc) return rc;
    double t0 = prl_now();
    rc = prl_tokenizer_train((const char *const *)texts, NULL, n,
                             a->vocab > 0 ? a->vocab : vocab_size, tok);
    if (rc == PRL_OK)
        fprintf(stderr, "tokenizer: trained on %zu texts of %s: %d tokens in %.1fs\n", n, a->data,
                prl_tokenizer_vocab_size(*tok), prl_now() - t0);
    for (size_t i = 0; i < n; i++) free(texts[i]);
    free(texts);
    return rc;
}

static prl_status build_optim(const sft_args *a, prl_optim_config *oc)
{
    prl_optim_config_default(oc);
    if (!strcmp(a->optimizer, "muon")) oc->kind = PRL_OPTIM_MUON;
    else if (!strcmp(a->optimizer, "adamw")) oc->kind = PRL_OPTIM_ADAMW;
    else
        return prl_error_set(PRL_ERR_ARG, "--optimizer must be muon or adamw, got '%s'",
                             a->optimizer);
    if (!strcmp(a->schedule, "cosine")) oc->schedule = PRL_LR_COSINE;
    else if (!strcmp(a->schedule, "constant")) oc->schedule = PRL_LR_CONSTANT;
    else
        return prl_error_set(PRL_ERR_ARG, "--schedule must be cosine or constant, got '%s'",
                             a->schedule);
    oc->lr = a->lr;
    oc->warmup_steps = a->warmup;
    oc->total_steps = a->steps;
    oc->min_lr_ratio = a->min_lr_ratio;
    oc->weight_decay = a->weight_decay;
    oc->grad_clip = a->grad_clip;
    oc->expert_clip = a->expert_clip;
    return PRL_OK;
}

/* --precision and --loss-scale: the model's precision and, for fp16 by default or with a
** preset named, a dynamic loss scaler (*on = 1). Errors name the flag. */
static prl_status set_precision(const sft_args *a, prl_model *m, prl_loss_scaler *s, int *on)
{
    prl_precision p;
    prl_status rc = prl_precision_parse(&p, a->precision ? a->precision : "fp32");
    if (rc) return prl_error_wrap(rc, "--precision: ");
    if ((rc = prl_model_set_precision(m, p))) return rc;
    const char *preset = a->loss_scale ? a->loss_scale : "torch";
    *on = a->loss_scale ? strcmp(a->loss_scale, "off") != 0 : p == PRL_PRECISION_FP16;
    if (!*on) return PRL_OK;
    prl_loss_scaler_config sc;
    rc = prl_loss_scaler_config_preset(&sc, preset);
    if (!rc) rc = prl_loss_scaler_init(s, &sc);
    return rc ? prl_error_wrap(rc, "--loss-scale (or off): ") : PRL_OK;
}

static char *state_json(const sft_args *a, const prl_sft_data *d)
{
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:i, s:i, s:i, s:I, s:I}", "job", "sft", "data", a->data, "seed",
                  (json_int_t)a->seed, "batch", a->batch, "seq", a->seq, "accum", a->accum,
                  "examples", (json_int_t)d->n, "loss_tokens", (json_int_t)d->n_loss_tokens);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Token-mean cross-entropy and DSA indexer KL of the model on n_eval examples of d taken
** every d->n/n_eval-th (so every domain and length is in), in batches of a->batch; the
** before/after figure of a post-hoc sparsification. The KL is the mean over the batches. */
static prl_status eval_loss(prl_model *m, const prl_sft_data *d, int n_eval, const sft_args *a,
                            double *ce, double *ikl)
{
    prl_batch_buf bb;
    prl_status st = prl_batch_buf_init(&bb, a->batch, a->seq);
    double sum = 0, kl = 0;
    long n = 0;
    int batches = 0, stride = n_eval > 0 ? d->n / n_eval : 1;
    for (int i0 = 0; st == PRL_OK && i0 < n_eval; i0 += a->batch, batches++) {
        int B = n_eval - i0 < a->batch ? n_eval - i0 : a->batch;
        for (int i = 0; i < B; i++) {
            const prl_sft_example *e = &d->ex[(size_t)(i0 + i) * stride];
            prl_batch_buf_set_row(&bb, a->seq, i, e->ids, e->n < a->seq ? e->n : a->seq, e->mask);
        }
        prl_batch b = prl_batch_buf_view(&bb, B, a->seq);
        for (int i = 0; i < B * a->seq; i++) bb.weights[i] = bb.targets[i] >= 0 ? -1.0f : 0.0f;
        prl_forward_stats fs;
        st = prl_model_forward(m, &b, NULL, &fs);
        sum += fs.lm_loss, n += fs.n_targets, kl += fs.index_loss;
    }
    prl_batch_buf_free(&bb);
    *ce = n ? sum / n : 0, *ikl = batches ? kl / batches : 0;
    return st;
}

/* The losses at one point of a DSA run: on 4 batches spread over the training data and, for a
** conversion recipe, on every held-out example (h: eval-split demonstrations, problems the
** generator never puts in the training split; NULL or empty: none). */
static void report_eval(prl_model *m, const prl_sft_data *d, const prl_sft_data *h,
                        const sft_args *a, const char *when)
{
    double ce, ikl;
    const char *stage = m->cfg.dsa_stage == PRL_DSA_DENSE ? "dense" : "sparse";
    int n_train = 4 * a->batch < d->n ? 4 * a->batch : d->n;
    if (eval_loss(m, d, n_train, a, &ce, &ikl) == PRL_OK)
        fprintf(stderr,
                "sft: eval (%d examples spread over the data) %s: loss %.4f, index_kl %.4f (%s "
                "stage)\n",
                n_train, when, ce, ikl, stage);
    if (h && h->n > 0 && eval_loss(m, h, h->n, a, &ce, &ikl) == PRL_OK)
        fprintf(stderr,
                "sft: held-out eval (%d eval-split demos) %s: loss %.4f, index_kl %.4f (%s "
                "stage)\n",
                h->n, when, ce, ikl, stage);
}

/* How sparse top-k is on these examples (each cut to seq): the share of the causal (query, key)
** pairs a DSA layer keeps, and of the positions that see only a subset of their keys. A top-k
** at or above the longest example is dense attention under another name. */
static void report_sparsity(const prl_sft_data *h, int topk, int seq)
{
    double pairs = 0, kept = 0, pos = 0, cut = 0;
    for (int i = 0; i < h->n; i++) {
        int n = h->ex[i].n < seq ? h->ex[i].n : seq;
        for (int t = 0; t < n; t++) pairs += t + 1, kept += t + 1 < topk ? t + 1 : topk;
        pos += n, cut += n > topk ? n - topk : 0;
    }
    if (h->n > 0)
        fprintf(stderr,
                "sft: held-out: %d demos, %.1f tokens on average; top-%d keeps %.1f%% of the "
                "causal key pairs, %.1f%% of the positions see a subset of their keys\n",
                h->n, pos / h->n, topk, 100 * kept / pairs, 100 * cut / pos);
}

/* The DSA warm-up of a post-hoc sparsification (docs/recipes.md): the loaded model runs with
** dense attention and only its indexers learn (AdamW, constant lr, no decay) to match the
** dense attention distribution; then the config's sparse stage takes over for the SFT steps.
** Losses are reported as loaded (dense and sparse), after the warm-up and at the end. */
static prl_status dsa_warmup(prl_model *m, const prl_sft_data *d, const prl_sft_data *h,
                             const sft_args *a, const prl_sft_config *sc)
{
    if (m->cfg.n_dsa_layers == 0)
        return prl_error_set(PRL_ERR_CONFIG,
                             "dsa.warmup_steps = %d but the model config has no "
                             "'dsa_layers'",
                             a->dsa_warmup);
    m->cfg.dsa_stage = PRL_DSA_DENSE;
    report_eval(m, d, h, a, "as loaded, full attention");
    m->cfg.dsa_stage = PRL_DSA_SPARSE;
    report_eval(m, d, h, a, "as loaded, sparse attention, indexer untrained");
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.kind = PRL_OPTIM_ADAMW, oc.lr = a->dsa_warmup_lr, oc.schedule = PRL_LR_CONSTANT;
    oc.warmup_steps = 0, oc.weight_decay = 0, oc.total_steps = a->dsa_warmup;
    m->cfg.dsa_stage = PRL_DSA_DENSE, m->cfg.dsa_freeze_main = 1;
    prl_optim o;
    prl_status st = prl_optim_init(&o, m, &oc);
    prl_sft_config wc = *sc;
    wc.steps = a->dsa_warmup;
    fprintf(stderr,
            "sft: DSA warm-up, %d steps: dense attention, only the indexers learn (lr %g)\n",
            a->dsa_warmup, a->dsa_warmup_lr);
    if (st == PRL_OK) st = prl_sft_train(m, &o, d, &wc, print_progress, NULL);
    prl_optim_free(&o);
    m->cfg.dsa_stage = PRL_DSA_SPARSE, m->cfg.dsa_freeze_main = 0;
    if (st == PRL_OK) report_eval(m, d, h, a, "after the warm-up, sparse attention");
    if (st == PRL_OK)
        fprintf(stderr, "sft: sparse adaptation, %d steps: every tensor learns\n", a->steps);
    return st;
}

/* dsa.dense_steps (a DSA model trained from scratch, docs/recipes.md): the first steps run the
** dense stage with every tensor learning, the main model from the LM loss and the indexers
** from their KL over the full attention distribution, so that the sparse stage that follows
** selects with a trained indexer rather than a random one. */
static prl_status dsa_dense_start(prl_model *m, const sft_args *a)
{
    if (m->cfg.n_dsa_layers == 0)
        return prl_error_set(PRL_ERR_CONFIG,
                             "dsa.dense_steps = %d but the model config has no "
                             "'dsa_layers'",
                             a->dsa_dense);
    m->cfg.dsa_stage = PRL_DSA_DENSE, m->cfg.dsa_freeze_main = 0;
    fprintf(stderr, "sft: DSA dense stage, steps 1-%d: dense attention, every tensor learns\n",
            a->dsa_dense);
    return PRL_OK;
}

static int run(const sft_args *a)
{
    if (cli_setup_blas("sft", a->threads)) return 1;
    prl_model m = {0};
    prl_optim o = {0};
    prl_tokenizer *tok = NULL;
    prl_sft_data d = {0}, h = {0};
    prl_optim_config oc;
    char *state = NULL;
    prl_status st;
    if (a->ckpt) {
        st = prl_checkpoint_load(&m, a->ckpt);
    } else {
        prl_config cfg;
        st = prl_config_load(&cfg, a->model);
        if (st == PRL_OK) st = prl_model_init(&m, &cfg);
        if (st == PRL_OK) prl_model_init_weights(&m, a->seed);
        int fresh = 0;
        if (st == PRL_OK && a->init_from)
            st = prl_checkpoint_load_weights(&m, a->init_from, &fresh);
        if (st == PRL_OK && a->init_from)
            fprintf(stderr, "sft: weights from %s; %d new tensors (DSA indexers, MTP modules)\n",
                    a->init_from, fresh);
    }
    if (st == PRL_OK) st = build_optim(a, &oc);
    if (st == PRL_OK) st = get_tokenizer(a, m.cfg.vocab_size, &tok);
    if (st == PRL_OK && prl_tokenizer_vocab_size(tok) > m.cfg.vocab_size)
        st = prl_error_set(PRL_ERR_CONFIG,
                           "tokenizer has %d tokens but the model's vocab_size is %d",
                           prl_tokenizer_vocab_size(tok), m.cfg.vocab_size);
    if (st == PRL_OK)
        st = prl_sft_data_load(&d, a->data, tok, a->seq,
                               (a->special ? PRL_TOKENIZER_SPECIAL : 0u) |
                                   (a->mask_errors ? PRL_SFT_MASK_ERRORS : 0u));
    if (st == PRL_OK && a->heldout)
        st = prl_sft_data_load(&h, a->heldout, tok, a->seq,
                               (a->special ? PRL_TOKENIZER_SPECIAL : 0u) |
                                   (a->mask_errors ? PRL_SFT_MASK_ERRORS : 0u));
    if (st == PRL_OK && a->heldout && m.cfg.n_dsa_layers > 0)
        report_sparsity(&h, m.cfg.index_topk, a->seq);
    if (st == PRL_OK && d.n_masked_steps > 0)
        fprintf(stderr, "sft: %d rejected assistant steps masked (kept as context, mask 0)\n",
                d.n_masked_steps);
    if (st == PRL_OK) st = prl_optim_init(&o, &m, &oc);
    prl_loss_scaler scaler;
    int scaler_on = 0;
    if (st == PRL_OK) st = set_precision(a, &m, &scaler, &scaler_on);
    if (st == PRL_OK && a->resume) {
        st = prl_checkpoint_load_optim(&o, &m, a->ckpt, NULL);
        o.cfg.total_steps = (int)o.step + a->steps; /* the schedule spans the whole run */
    }
    if (st == PRL_OK) {
        fprintf(stderr,
                "sft: %d examples (%zu tokens, %zu trained, %d truncated to %d), model %zu "
                "parameters, %s, %d steps of %d x %d x %d\n",
                d.n, d.n_tokens, d.n_loss_tokens, d.n_truncated, a->seq, m.n_params, a->optimizer,
                a->steps, a->accum, a->batch, a->seq);
        prl_sft_config sc = {.batch = a->batch,
                             .seq = a->seq,
                             .accum = a->accum,
                             .seed = a->seed,
                             .log_every = a->log_every,
                             .group = a->group,
                             .pack = a->pack,
                             .scaler = scaler_on ? &scaler : NULL};
        if (a->dsa_warmup > 0) st = dsa_warmup(&m, &d, &h, a, &sc);
        int64_t end = o.step + a->steps, dense_end = o.step + a->dsa_dense;
        const char *metrics = a->metrics;
        sc.run_last = end;
        sc.run_first = o.step, sc.run_start_s = prl_now(); /* one ETA across the saves */
        if (st == PRL_OK && a->dsa_dense > 0) st = dsa_dense_start(&m, a);
        while (st == PRL_OK && o.step < end) {
            int64_t chunk =
                a->save_every > 0 ? a->save_every - o.step % a->save_every : end - o.step;
            if (o.step < dense_end && dense_end - o.step < chunk) chunk = dense_end - o.step;
            sc.steps = (int)(chunk < end - o.step ? chunk : end - o.step);
            st = prl_sft_train(&m, &o, &d, &sc, print_progress, &metrics);
            if (st == PRL_OK && a->dsa_dense > 0 && o.step == dense_end) {
                report_eval(&m, &d, NULL, a, "after the dense stage, dense attention");
                m.cfg.dsa_stage = PRL_DSA_SPARSE; /* the checkpoint's config says sparse */
                report_eval(&m, &d, NULL, a, "after the dense stage, sparse attention");
                fprintf(stderr, "sft: DSA sparse stage, steps %lld-%lld\n", (long long)o.step + 1,
                        (long long)end);
            }
            if (st == PRL_OK) {
                state = state_json(a, &d);
                st = prl_checkpoint_save(&m, &o, state, tok, a->out);
                free(state);
                if (st == PRL_OK)
                    fprintf(stderr, "sft: saved step %lld to %s\n", (long long)o.step, a->out);
            }
        }
    }
    if (st == PRL_OK && a->dsa_warmup > 0)
        report_eval(&m, &d, &h, a, "after the sparse adaptation");
    else if (st == PRL_OK && a->dsa_dense > 0)
        report_eval(&m, &d, NULL, a, "at the end, sparse attention");
    prl_sft_data_free(&d);
    prl_sft_data_free(&h);
    prl_tokenizer_free(tok);
    prl_optim_free(&o);
    prl_model_free(&m);
    return st ? cli_fail("sft") : 0;
}

/* ------------------------------------------------------------------ recipes -------- */

/* Held-out examples per (domain, difficulty) of a DSA conversion recipe: 16 each of the cells
** the recipe trains on (192 for the 12 cells of configs/dsa-convert.json). */
enum { DSA_HELDOUT_PER_CELL = 16 };

/* The demos of the recipe, every (domain, difficulty) in order, written to `path`: the
** recipe's counts of the train split, or (heldout) DSA_HELDOUT_PER_CELL of the eval split for
** each cell the recipe has, problems the train split never holds (docs/tasks.md "Splits"). */
static prl_status write_demos(const prl_sft_recipe *r, int heldout, const char *path, int *n_lines)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return prl_error_set(PRL_ERR_NOMEM, "demos");
    prl_status st = PRL_OK;
    *n_lines = 0;
    for (int d = 0; st == PRL_OK && d < PRL_RECIPE_DOMAINS; d++)
        for (int k = 1; st == PRL_OK && k <= PRL_RECIPE_LEVELS; k++) {
            prl_tasks_config c;
            prl_tasks_config_default(&c, (prl_task_domain)d);
            c.difficulty = k;
            c.n = r->demos[d][k - 1];
            if (heldout) {
                c.split = PRL_SPLIT_EVAL;
                c.n = c.n > 0 ? DSA_HELDOUT_PER_CELL : 0;
            }
            c.seed = r->seed;
            c.demos = 1;
            c.error_rate = r->error_rate;
            c.tool_rate = r->tool_rate;
            c.think_rate = r->think_rate;
            if (c.n > 0) st = prl_tasks_write_jsonl(&c, mem);
            *n_lines += c.n;
        }
    if (fclose(mem) != 0 && st == PRL_OK) st = prl_error_set(PRL_ERR_NOMEM, "buffering demos");
    if (st == PRL_OK) st = prl_file_write_atomic(path, text, len);
    free(text);
    return st;
}

/* Hash of what makes the checkpoint: the resolved recipe without run.name and run.dir (where
** it goes is not what it is: a run dir can be moved) and the bytes of the model config it
** names (hex, 16 digits). */
static prl_status recipe_hash(prl_sft_recipe *r, char out[17])
{
    char *name = r->name, *dir = r->dir, *cfg = NULL;
    r->name = r->dir = "";
    char *resolved = prl_sft_recipe_to_json(r);
    r->name = name, r->dir = dir;
    size_t len = 0;
    prl_status st = resolved ? prl_file_read(r->model_config, &cfg, &len)
                             : prl_error_set(PRL_ERR_NOMEM, "recipe");
    if (st) {
        free(resolved);
        return st;
    }
    uint64_t h = prl_checksum64(resolved, strlen(resolved), 0x726563697065);
    free(resolved);
    h = prl_checksum64(cfg, len, h);
    free(cfg);
    /* the starting weights are part of what the run depends on */
    if (*r->init_from && (st = prl_checkpoint_weights_hash(r->init_from, h, &h))) return st;
    snprintf(out, 17, "%016" PRIx64, h);
    return PRL_OK;
}

static int up_to_date(const char *dir, const char *hash)
{
    char path[4096], *old = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/ckpt/model.safetensors", dir);
    if (!file_exists(path)) return 0;
    snprintf(path, sizeof path, "%s/recipe.hash", dir);
    if (!file_exists(path) || prl_file_read(path, &old, &len)) return 0;
    int same = len >= 16 && !strncmp(old, hash, 16);
    free(old);
    return same;
}

static prl_status make_dirs(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++) {
        int end = *s == 0;
        if (*s == '/' || end) {
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return prl_error_set(PRL_ERR_IO, "cannot create %s: %m", p);
            if (end) return PRL_OK;
            *s = '/';
        }
    }
}

/* A recipe's run.dir is its own: absent, empty, or made by a recipe (it has recipe.json). A
** folder of the user's is refused before anything is written. */
static prl_status check_recipe_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? PRL_OK : prl_error_set(PRL_ERR_IO, "cannot read %s: %m", dir);
    int empty = 1, recipe = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            empty = 0;
            recipe |= !strcmp(e->d_name, "recipe.json");
        }
    closedir(d);
    if (empty || recipe) return PRL_OK;
    return prl_error_set(PRL_ERR_IO,
                         "run.dir %s holds files that no recipe made (no recipe.json): "
                         "choose a new run.dir",
                         dir);
}

/* `prl sft --config FILE`: demos -> tokenizer -> SFT into <run.dir>/ckpt (docs/recipes.md). */
static int run_recipe(const char *file, int threads, int force)
{
    prl_sft_recipe r;
    prl_status st = prl_sft_recipe_default(&r);
    if (st == PRL_OK) st = prl_sft_recipe_load(&r, file);
    if (st) {
        prl_sft_recipe_free(&r);
        cli_fail("sft");
        return 2;
    }
    char *resolved = prl_sft_recipe_to_json(&r), hash[17] = "", data[4096], out[4096], path[4096];
    if (!resolved) st = prl_error_set(PRL_ERR_NOMEM, "recipe");
    if (st == PRL_OK) st = recipe_hash(&r, hash);
    if (st == PRL_OK && !force && up_to_date(r.dir, hash)) {
        fprintf(stderr, "sft: %s/ckpt is up to date (recipe %s, hash %s); nothing to do\n", r.dir,
                file, hash);
        free(resolved);
        prl_sft_recipe_free(&r);
        return 0;
    }
    snprintf(data, sizeof data, "%s/demos.jsonl", r.dir);
    snprintf(out, sizeof out, "%s/ckpt", r.dir);
    snprintf(path, sizeof path, "%s/recipe.hash", r.dir);
    if (st == PRL_OK) st = check_recipe_dir(r.dir);
    if (st == PRL_OK) st = make_dirs(r.dir);
    if (st == PRL_OK && unlink(path) != 0 && errno != ENOENT) /* stale until the run finishes */
        st = prl_error_set(PRL_ERR_IO, "cannot remove %s: %m", path);
    char rpath[4096], mpath[4096];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", r.dir); /* the recipe's: made anew */
    if (st == PRL_OK && unlink(mpath) != 0 && errno != ENOENT)
        st = prl_error_set(PRL_ERR_IO, "cannot remove %s: %m", mpath);
    snprintf(rpath, sizeof rpath, "%s/recipe.json", r.dir);
    if (st == PRL_OK) st = prl_file_write_atomic(rpath, resolved, strlen(resolved));
    int n_demos = 0;
    double t0 = prl_now();
    if (st == PRL_OK) st = write_demos(&r, 0, data, &n_demos);
    char hpath[4096] = "";
    int n_held = 0;
    if (st == PRL_OK && r.dsa_warmup_steps > 0) { /* a conversion: held-out loss, base vs DSA */
        snprintf(hpath, sizeof hpath, "%s/heldout.jsonl", r.dir);
        st = write_demos(&r, 1, hpath, &n_held);
    }
    if (st) {
        free(resolved);
        prl_sft_recipe_free(&r);
        return cli_fail("sft");
    }
    fprintf(stderr, "sft: recipe %s (hash %s): %d demos in %s (%.1fs)\n", file, hash, n_demos, data,
            prl_now() - t0);
    if (*hpath)
        fprintf(stderr, "sft: %d held-out demos (eval split, not trained on) in %s\n", n_held,
                hpath);
    sft_args a = {.data = data,
                  .model = r.model_config,
                  .out = out,
                  .metrics = mpath,
                  .heldout = *hpath ? hpath : NULL,
                  .optimizer = r.optimizer,
                  .schedule = r.schedule,
                  .steps = r.steps,
                  .batch = r.batch,
                  .seq = r.seq,
                  .accum = r.accum,
                  .warmup = r.warmup,
                  .threads = threads,
                  .log_every = r.steps >= 20 ? r.steps / 20 : 1,
                  .group = r.group,
                  .pack = r.pack,
                  .special = r.special_tokens,
                  .mask_errors = r.mask_errors,
                  .vocab = r.vocab_size,
                  .lr = r.lr,
                  .min_lr_ratio = r.min_lr_ratio,
                  .weight_decay = r.weight_decay,
                  .grad_clip = r.grad_clip,
                  .expert_clip = r.expert_clip,
                  .seed = r.seed,
                  .init_from = *r.init_from ? r.init_from : NULL,
                  .dsa_warmup = r.dsa_warmup_steps,
                  .dsa_warmup_lr = r.dsa_warmup_lr,
                  .dsa_dense = r.dsa_dense_steps};
    int rc = run(&a);
    if (rc == 0) {
        char line[20];
        snprintf(line, sizeof line, "%s\n", hash);
        if (prl_file_write_atomic(path, line, strlen(line))) rc = cli_fail("sft");
        else
            fprintf(stderr, "sft: recipe done in %.1fs: %s (hash in %s)\n", prl_now() - t0, out,
                    path);
    }
    free(resolved);
    prl_sft_recipe_free(&r);
    return rc;
}

int cmd_sft(int argc, char **argv)
{
    const char *config = NULL;
    int force = 0;
    sft_args a = {.optimizer = "muon",
                  .schedule = "cosine",
                  .precision = "fp32",
                  .steps = 200,
                  .batch = 8,
                  .seq = 128,
                  .accum = 1,
                  .warmup = 10,
                  .log_every = 10,
                  .lr = 3e-3,
                  .min_lr_ratio = 0.1,
                  .weight_decay = 0.1,
                  .grad_clip = 1.0,
                  .seed = 1};
    cli_opt opts[] = {
        {"config", OPT_STR, &config, "FILE",
         "run an SFT recipe (configs/sft-base.json, docs/recipes.md): demos, tokenizer and SFT "
         "into <run.dir>/ckpt; only --threads and --force go with it",
         0, 0},
        {"force", OPT_FLAG, &force, NULL,
         "with --config: run even if the checkpoint matches the recipe's hash", 0, 0},
        {"data", OPT_STR, &a.data, "FILE",
         "chat JSONL: {\"messages\": [{\"role\", \"content\"}, ...]} per line (required without "
         "--config)",
         0, 0},
        {"model", OPT_STR, &a.model, "CONFIG", "start from a random init of this config", 0, 0},
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "start from this checkpoint", 0, 0},
        {"out", OPT_STR, &a.out, "DIR",
         "new checkpoint directory to write (must not exist; required without --config)", 0, 0},
        {"tokenizer", OPT_STR, &a.tokenizer, "FILE",
         "tokenizer.json (default: the checkpoint's, else trained on the data)", 0, 0},
        {"steps", OPT_INT, &a.steps, "N",
         "optimizer steps to run (with --resume: steps added to the run; default 200)", 0, 0},
        {"batch", OPT_INT, &a.batch, "B", "sequences per micro-batch (default 8)", 0, 0},
        {"seq", OPT_INT, &a.seq, "T",
         "sequence length; longer examples are truncated (default 128)", 0, 0},
        {"group", OPT_INT, &a.group, "G",
         "group by length: windows of G batches sorted by length, each micro-batch only as wide as "
         "its longest example (default 0 = off)",
         0, 0},
        {"pack", OPT_FLAG, &a.pack, NULL,
         "pack several examples into each row of --seq positions, each attending only to itself "
         "(docs/model.md \"Packed sequences\"; not with --group)",
         0, 0},
        {"special-tokens", OPT_FLAG, &a.special, NULL,
         "trusted data: special-token strings in contents (<|tool_call|> ...) become their ids, as "
         "the model emits them",
         0, 0},
        {"mask-errors", OPT_FLAG, &a.mask_errors, NULL,
         "mask the assistant turns the environment rejected (the next tool reply starts with "
         "\"error: \"); marked steps (\"mask\": true, \"error\": true) are masked always",
         0, 0},
        {"accum", OPT_INT, &a.accum, "K", "micro-batches per step (default 1)", 0, 0},
        {"optimizer", OPT_STR, &a.optimizer, "NAME",
         "muon (hidden matrices; AdamW for the rest) or adamw (default muon)", 0, 0},
        {"lr", OPT_DOUBLE, &a.lr, "LR", "peak learning rate (default 3e-3)", 0, 0},
        {"schedule", OPT_STR, &a.schedule, "NAME", "cosine or constant (default cosine)", 0, 0},
        {"warmup", OPT_INT, &a.warmup, "N", "linear warm-up steps (default 10)", 0, 0},
        {"min-lr-ratio", OPT_DOUBLE, &a.min_lr_ratio, "R",
         "final lr / peak lr for cosine (default 0.1)", 0, 0},
        {"weight-decay", OPT_DOUBLE, &a.weight_decay, "WD", "decoupled weight decay (default 0.1)",
         0, 0},
        {"grad-clip", OPT_DOUBLE, &a.grad_clip, "C",
         "global gradient-norm bound, 0 = off (default 1)", 0, 0},
        {"expert-clip", OPT_DOUBLE, &a.expert_clip, "C",
         "per routed expert gradient-norm bound, 0 = off", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "seed of the init and the data order (default 1)", 0, 0},
        {"precision", OPT_STR, &a.precision, "P",
         "train path arithmetic: fp32 (default), bf16 or fp16 (docs/model.md)", 0, 0},
        {"loss-scale", OPT_STR, &a.loss_scale, "NAME",
         "dynamic loss scaler: torch, megatron, verl_fsdp, verl_megatron or off (default: torch "
         "with fp16, off otherwise)",
         0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0},
        {"log-every", OPT_INT, &a.log_every, "N", "progress line every N steps (default 10)", 0, 0},
        {"save-every", OPT_INT, &a.save_every, "N", "also save every N steps (default: at the end)",
         0, 0},
        {"metrics", OPT_STR, &a.metrics, "FILE",
         "new file: one JSON line per step (loss, lr, grad norm, tokens/s, ...)", 0, 0},
        {"resume", OPT_FLAG, &a.resume, NULL, "continue --ckpt's optimizer state and data order", 0,
         0},
        {0},
    };
    int rc =
        cli_parse(argc, argv, 2, opts,
                  "prl sft --data FILE.jsonl (--model CONFIG | --ckpt DIR) --out DIR [options]\n"
                  "       prl sft --config RECIPE.json [--threads N] [--force]",
                  "Supervised fine-tuning with the loss on assistant tokens only. Runs are "
                  "deterministic: the same seed gives a bitwise-identical checkpoint, for any "
                  "thread count.",
                  NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (config) {
        for (const cli_opt *o = opts; o->name; o++)
            if (o->seen && strcmp(o->name, "config") && strcmp(o->name, "threads") &&
                strcmp(o->name, "force"))
                return cli_failf("sft", 2, "--%s cannot be used with --config (the recipe sets it)",
                                 o->name);
        return run_recipe(config, a.threads, force);
    }
    if (force) return cli_failf("sft", 2, "--force goes with --config");
    if (!a.data || !a.out)
        return cli_failf("sft", 2, "--data and --out are required (or --config)");
    if (!a.model == !a.ckpt)
        return cli_failf("sft", 2, "give exactly one of --model CONFIG or --ckpt DIR");
    if (a.resume && !a.ckpt) return cli_failf("sft", 2, "--resume needs --ckpt");
    if (cli_require_new("sft", "out", a.out)) return 2;
    if (a.metrics && cli_require_new("sft", "metrics", a.metrics)) return 2;
    if (a.steps < 1 || a.batch < 1 || a.seq < 2 || a.accum < 1 || a.log_every < 1 ||
        a.save_every < 0 || a.warmup < 0 || a.group < 0)
        return cli_failf("sft", 2,
                         "--steps, --batch, --accum, --log-every must be >= 1, --seq >= 2, "
                         "--save-every, --warmup and --group >= 0");
    if (a.pack && a.group > 0) return cli_failf("sft", 2, "--pack and --group are exclusive");
    return run(&a);
}
