/*
** cmd_sft.c — `prl sft`: supervised fine-tuning on chat JSONL.
**
** Starts from a model config (random init) or a checkpoint, takes the tokenizer from
** --tokenizer, the checkpoint, or trains one on the data; prints a progress line
** (loss, tokens/s, ETA) and writes the result as a checkpoint directory.
*/
#include "cli/cli.h"
#include "sft/sft.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct sft_args {
    const char *data, *model, *ckpt, *out, *tokenizer, *optimizer, *schedule;
    int steps, batch, seq, accum, warmup, threads, log_every, save_every, resume;
    double lr, min_lr_ratio, weight_decay, grad_clip, expert_clip;
    uint64_t seed;
} sft_args;

static void print_progress(void *user, const prl_sft_progress *p)
{
    (void)user;
    char eta[32], el[32];
    prl_format_duration(eta, sizeof eta, p->eta_s);
    prl_format_duration(el, sizeof el, p->elapsed_s);
    fprintf(stderr, "step %d/%d  loss %.4f  lr %.2e  gnorm %.3f  tok/s %.0f  elapsed %s  eta %s\n",
            p->step, p->steps, p->loss, p->lr, p->grad_norm, p->tokens_per_s, el, eta);
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
    if (a->ckpt) {
        snprintf(path, sizeof path, "%s/tokenizer.json", a->ckpt);
        if (file_exists(path)) return prl_tokenizer_load(path, tok);
    }
    char **texts = NULL;
    size_t n = 0;
    prl_status rc = prl_sft_read_texts(a->data, &texts, &n);
    if (rc) return rc;
    double t0 = prl_now();
    rc = prl_tokenizer_train((const char *const *)texts, NULL, n, vocab_size, tok);
    if (rc == PRL_OK)
        fprintf(stderr, "tokenizer: trained on %zu texts of %s: %d tokens in %.1fs\n", n,
                a->data, prl_tokenizer_vocab_size(*tok), prl_now() - t0);
    for (size_t i = 0; i < n; i++) free(texts[i]);
    free(texts);
    return rc;
}

static prl_status build_optim(const sft_args *a, prl_optim_config *oc)
{
    prl_optim_config_default(oc);
    if (!strcmp(a->optimizer, "muon")) oc->kind = PRL_OPTIM_MUON;
    else if (!strcmp(a->optimizer, "adamw")) oc->kind = PRL_OPTIM_ADAMW;
    else return prl_error_set(PRL_ERR_ARG, "--optimizer must be muon or adamw, got '%s'", a->optimizer);
    if (!strcmp(a->schedule, "cosine")) oc->schedule = PRL_LR_COSINE;
    else if (!strcmp(a->schedule, "constant")) oc->schedule = PRL_LR_CONSTANT;
    else return prl_error_set(PRL_ERR_ARG, "--schedule must be cosine or constant, got '%s'", a->schedule);
    oc->lr = a->lr;
    oc->warmup_steps = a->warmup;
    oc->total_steps = a->steps;
    oc->min_lr_ratio = a->min_lr_ratio;
    oc->weight_decay = a->weight_decay;
    oc->grad_clip = a->grad_clip;
    oc->expert_clip = a->expert_clip;
    return PRL_OK;
}

static char *state_json(const sft_args *a, const prl_sft_data *d)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:i, s:i, s:i, s:I, s:I}", "job", "sft", "data", a->data,
                          "seed", (json_int_t)a->seed, "batch", a->batch, "seq", a->seq, "accum",
                          a->accum, "examples", (json_int_t)d->n, "loss_tokens",
                          (json_int_t)d->n_loss_tokens);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static int run(const sft_args *a)
{
    if (cli_setup_blas("sft", a->threads)) return 1;
    prl_model m = {0};
    prl_optim o = {0};
    prl_tokenizer *tok = NULL;
    prl_sft_data d = {0};
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
    }
    if (st == PRL_OK) st = build_optim(a, &oc);
    if (st == PRL_OK) st = get_tokenizer(a, m.cfg.vocab_size, &tok);
    if (st == PRL_OK && prl_tokenizer_vocab_size(tok) > m.cfg.vocab_size)
        st = prl_error_set(PRL_ERR_CONFIG, "tokenizer has %d tokens but the model's vocab_size is %d",
                           prl_tokenizer_vocab_size(tok), m.cfg.vocab_size);
    if (st == PRL_OK) st = prl_sft_data_load(&d, a->data, tok, a->seq);
    if (st == PRL_OK) st = prl_optim_init(&o, &m, &oc);
    if (st == PRL_OK && a->resume) {
        st = prl_checkpoint_load_optim(&o, &m, a->ckpt, NULL);
        o.cfg.total_steps = (int)o.step + a->steps; /* the schedule spans the whole run */
    }
    if (st == PRL_OK) {
        fprintf(stderr, "sft: %d examples (%zu tokens, %zu trained, %d truncated to %d), model %zu "
                "parameters, %s, %d steps of %d x %d x %d\n", d.n, d.n_tokens, d.n_loss_tokens,
                d.n_truncated, a->seq, m.n_params, a->optimizer, a->steps, a->accum, a->batch, a->seq);
        prl_sft_config sc = {.batch = a->batch, .seq = a->seq, .accum = a->accum,
                             .seed = a->seed, .log_every = a->log_every};
        int64_t end = o.step + a->steps;
        while (st == PRL_OK && o.step < end) {
            int64_t chunk = a->save_every > 0 ? a->save_every - o.step % a->save_every : end - o.step;
            sc.steps = (int)(chunk < end - o.step ? chunk : end - o.step);
            st = prl_sft_train(&m, &o, &d, &sc, print_progress, NULL);
            if (st == PRL_OK) {
                state = state_json(a, &d);
                st = prl_checkpoint_save(&m, &o, state, tok, a->out);
                free(state);
                if (st == PRL_OK) fprintf(stderr, "sft: saved step %lld to %s\n", (long long)o.step, a->out);
            }
        }
    }
    prl_sft_data_free(&d);
    prl_tokenizer_free(tok);
    prl_optim_free(&o);
    prl_model_free(&m);
    return st ? cli_fail("sft") : 0;
}

int cmd_sft(int argc, char **argv)
{
    sft_args a = {.optimizer = "muon", .schedule = "cosine", .steps = 200, .batch = 8, .seq = 128,
                  .accum = 1, .warmup = 10, .log_every = 10, .lr = 3e-3, .min_lr_ratio = 0.1,
                  .weight_decay = 0.1, .grad_clip = 1.0, .seed = 1};
    cli_opt opts[] = {
        {"data", OPT_STR, &a.data, "FILE", "chat JSONL: {\"messages\": [{\"role\", \"content\"}, ...]} per line", 1, 0},
        {"model", OPT_STR, &a.model, "CONFIG", "start from a random init of this config", 0, 0},
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "start from this checkpoint", 0, 0},
        {"out", OPT_STR, &a.out, "DIR", "checkpoint directory to write", 1, 0},
        {"tokenizer", OPT_STR, &a.tokenizer, "FILE", "tokenizer.json (default: the checkpoint's, else trained on the data)", 0, 0},
        {"steps", OPT_INT, &a.steps, "N", "optimizer steps to run (with --resume: steps added to the run; default 200)", 0, 0},
        {"batch", OPT_INT, &a.batch, "B", "sequences per micro-batch (default 8)", 0, 0},
        {"seq", OPT_INT, &a.seq, "T", "sequence length; longer examples are truncated (default 128)", 0, 0},
        {"accum", OPT_INT, &a.accum, "K", "micro-batches per step (default 1)", 0, 0},
        {"optimizer", OPT_STR, &a.optimizer, "NAME", "muon (hidden matrices; AdamW for the rest) or adamw (default muon)", 0, 0},
        {"lr", OPT_DOUBLE, &a.lr, "LR", "peak learning rate (default 3e-3)", 0, 0},
        {"schedule", OPT_STR, &a.schedule, "NAME", "cosine or constant (default cosine)", 0, 0},
        {"warmup", OPT_INT, &a.warmup, "N", "linear warm-up steps (default 10)", 0, 0},
        {"min-lr-ratio", OPT_DOUBLE, &a.min_lr_ratio, "R", "final lr / peak lr for cosine (default 0.1)", 0, 0},
        {"weight-decay", OPT_DOUBLE, &a.weight_decay, "WD", "decoupled weight decay (default 0.1)", 0, 0},
        {"grad-clip", OPT_DOUBLE, &a.grad_clip, "C", "global gradient-norm bound, 0 = off (default 1)", 0, 0},
        {"expert-clip", OPT_DOUBLE, &a.expert_clip, "C", "per routed expert gradient-norm bound, 0 = off", 0, 0},
        {"seed", OPT_U64, &a.seed, "S", "seed of the init and the data order (default 1)", 0, 0},
        {"threads", OPT_INT, &a.threads, "N", "threads (default: PRL_THREADS or all CPUs)", 0, 0},
        {"log-every", OPT_INT, &a.log_every, "N", "progress line every N steps (default 10)", 0, 0},
        {"save-every", OPT_INT, &a.save_every, "N", "also save every N steps (default: at the end)", 0, 0},
        {"resume", OPT_FLAG, &a.resume, NULL, "continue --ckpt's optimizer state and data order", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 2, opts,
                       "prl sft --data FILE.jsonl (--model CONFIG | --ckpt DIR) --out DIR [options]",
                       "Supervised fine-tuning with the loss on assistant tokens only. Runs are "
                       "deterministic: the same seed gives a bitwise-identical checkpoint, for any "
                       "thread count.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (!a.model == !a.ckpt) return cli_failf("sft", 2, "give exactly one of --model CONFIG or --ckpt DIR");
    if (a.resume && !a.ckpt) return cli_failf("sft", 2, "--resume needs --ckpt");
    if (a.steps < 1 || a.batch < 1 || a.seq < 2 || a.accum < 1 || a.log_every < 1 || a.save_every < 0 || a.warmup < 0)
        return cli_failf("sft", 2, "--steps, --batch, --accum, --log-every must be >= 1, --seq >= 2, "
                         "--save-every and --warmup >= 0");
    return run(&a);
}
