/*
** bench_sft.c — `prl bench sft`: SFT tokens/s with and without packing, side by side.
**
** One run trains the same checkpoint on the same chat JSONL in three batch layouts, in
** alternating rounds so that drift in the (shared) machine's speed hits all alike: padded
** (every row seq wide, one example per row), grouped (rows sorted by length in windows of G
** batches, each micro-batch only as wide as its longest example: the SFT recipe's default)
** and packed (prl_sft_config.pack: whole examples appended to rows of seq positions). Every
** run starts from the checkpoint's weights and a fresh optimizer at step 0, so each round
** sees the same data. A step's tokens are its real (non-padding) tokens; the printed rate is
** the median over every timed step of every round, and the ratios are packed over the other
** two.
*/
#include "cli/bench.h"
#include "sft/sft.h"

#include <stdlib.h>
#include <string.h>

typedef struct sft_bench_args {
    const char *ckpt, *data;
    int batch, seq, steps, warmup, rounds, group, threads, special, json;
} sft_bench_args;

enum { MODE_PADDED, MODE_GROUPED, MODE_PACKED, N_MODES };
static const char *const mode_name[N_MODES] = {"padded", "grouped", "packed"};

/* Per-step samples of one mode over all rounds. */
typedef struct samples {
    double *tps, *tokens;
    int n, skip; /* samples kept; steps of the current run still to skip (warm-up) */
} samples;

static void record_step(void *user, const prl_sft_progress *p)
{
    samples *s = user;
    if (s->skip > 0) {
        s->skip--;
        return;
    }
    s->tps[s->n] = p->tokens_per_s;
    s->tokens[s->n++] = p->tokens;
}

/* One run of mode `mode`: the master weights into m, a fresh AdamW, warm-up + steps steps. */
static prl_status run_mode(prl_model *m, const prl_real *master, const prl_sft_data *d,
                           const sft_bench_args *a, int mode, samples *s)
{
    memcpy(m->params, master, m->n_params * sizeof *master);
    prl_optim o;
    prl_optim_config oc;
    prl_optim_config_default(&oc);
    oc.lr = 1e-4;
    prl_status rc = prl_optim_init(&o, m, &oc);
    if (rc) return rc;
    prl_sft_config c = {.batch = a->batch,
                        .seq = a->seq,
                        .steps = a->warmup + a->steps,
                        .accum = 1,
                        .seed = 1,
                        .log_every = 1,
                        .group = mode == MODE_GROUPED ? a->group : 0,
                        .pack = mode == MODE_PACKED};
    s->skip = a->warmup;
    rc = prl_sft_train(m, &o, d, &c, record_step, s);
    prl_optim_free(&o);
    return rc;
}

static double mean(const double *v, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    return n ? sum / n : 0;
}

/* Train all modes in alternating rounds and print the medians. */
static prl_status bench(prl_model *m, const prl_sft_data *d, const sft_bench_args *a)
{
    int n = a->rounds * a->steps;
    prl_real *master = malloc(m->n_params * sizeof *master);
    samples s[N_MODES];
    prl_status rc = master ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "bench sft");
    for (int k = 0; k < N_MODES; k++) {
        s[k] = (samples){.tps = calloc((size_t)n, sizeof(double)),
                         .tokens = calloc((size_t)n, sizeof(double))};
        if (!s[k].tps || !s[k].tokens) rc = prl_error_set(PRL_ERR_NOMEM, "bench sft");
    }
    if (rc == PRL_OK) memcpy(master, m->params, m->n_params * sizeof *master);
    for (int r = 0; rc == PRL_OK && r < a->rounds; r++)
        for (int k = 0; rc == PRL_OK && k < N_MODES; k++) {
            rc = run_mode(m, master, d, a, k, &s[k]);
            fprintf(stderr, "bench: round %d/%d %s done\n", r + 1, a->rounds, mode_name[k]);
        }
    double tps[N_MODES], tok[N_MODES];
    for (int k = 0; rc == PRL_OK && k < N_MODES; k++) {
        tok[k] = mean(s[k].tokens, s[k].n);
        tps[k] = bench_median(s[k].tps, s[k].n);
    }
    if (rc == PRL_OK && a->json) {
        printf("{\"batch\": %d, \"seq\": %d, \"group\": %d, \"threads\": %d, \"steps_timed\": %d",
               a->batch, a->seq, a->group, prl_blas_threads(), n);
        for (int k = 0; k < N_MODES; k++)
            printf(", \"%s_tokens_per_s\": %.1f, \"%s_tokens_per_step\": %.1f", mode_name[k],
                   tps[k], mode_name[k], tok[k]);
        printf(", \"ratio_packed_over_padded\": %.3f, \"ratio_packed_over_grouped\": %.3f}\n",
               tps[MODE_PACKED] / tps[MODE_PADDED], tps[MODE_PACKED] / tps[MODE_GROUPED]);
    } else if (rc == PRL_OK) {
        printf("sft %s on %s: batch %d x %d, threads %d, blas %s; medians of %d steps per layout "
               "(%d rounds)\n",
               a->ckpt, a->data, a->batch, a->seq, prl_blas_threads(), prl_blas_core(), n,
               a->rounds);
        for (int k = 0; k < N_MODES; k++)
            printf("  %-8s %8.1f tokens/s   %7.1f real tokens/step (of %d positions)\n",
                   mode_name[k], tps[k], tok[k], a->batch * a->seq);
        printf("  packed / padded = %.2fx   packed / grouped (G = %d) = %.2fx\n",
               tps[MODE_PACKED] / tps[MODE_PADDED], a->group, tps[MODE_PACKED] / tps[MODE_GROUPED]);
    }
    for (int k = 0; k < N_MODES; k++) free(s[k].tps), free(s[k].tokens);
    free(master);
    return rc;
}

int cmd_bench_sft(int argc, char **argv)
{
    sft_bench_args a = {.batch = 16, .seq = 256, .steps = 5, .warmup = 1, .rounds = 3, .group = 32};
    cli_opt opts[] = {
        {"ckpt", OPT_STR, &a.ckpt, "DIR", "checkpoint with a tokenizer (required)", 0, 0},
        {"data", OPT_STR, &a.data, "FILE", "chat JSONL (required; e.g. a recipe's demos.jsonl)", 0,
         0},
        {"batch", OPT_INT, &a.batch, "B", "rows per step (default 16)", 0, 0},
        {"seq", OPT_INT, &a.seq, "T", "positions per row (default 256)", 0, 0},
        {"steps", OPT_INT, &a.steps, "N", "timed steps per layout and round (default 5)", 0, 0},
        {"warmup", OPT_INT, &a.warmup, "N", "untimed steps before them (default 1)", 0, 0},
        {"rounds", OPT_INT, &a.rounds, "R", "alternating rounds (default 3)", 0, 0},
        {"group", OPT_INT, &a.group, "G", "the grouped layout's windows (default 32)", 0, 0},
        {"special-tokens", OPT_FLAG, &a.special, NULL,
         "trusted data: special-token strings become their ids (as the SFT recipe loads demos)", 0,
         0},
        {"threads", OPT_INT, &a.threads, "N", "threads (default: all CPUs)", 0, 0},
        {"json", OPT_FLAG, &a.json, NULL, "print the results as JSON", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl bench sft --ckpt DIR --data FILE.jsonl [options]",
                       "SFT tokens/s of the same checkpoint and data padded one example per row, "
                       "grouped by length, and packed (several examples per row, each attending "
                       "only to itself), in alternating rounds; medians and ratios.",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (!a.ckpt || !a.data) return cli_failf("bench", 2, "--ckpt and --data are required");
    if (a.batch < 1 || a.seq < 2 || a.steps < 1 || a.warmup < 0 || a.rounds < 1 || a.group < 1)
        return cli_failf("bench", 2,
                         "--batch, --steps, --rounds, --group must be >= 1, --seq >= 2, "
                         "--warmup >= 0");
    if (cli_setup_blas("bench", a.threads)) return 1;
    prl_model m;
    prl_tokenizer *tok = NULL;
    if (prl_checkpoint_load_tokenizer(&m, a.ckpt, &tok)) return cli_fail("bench");
    prl_sft_data d;
    prl_status st =
        tok ? prl_sft_data_load(&d, a.data, tok, a.seq, a.special ? PRL_TOKENIZER_SPECIAL : 0)
            : prl_error_set(PRL_ERR_ARG, "%s has no tokenizer.json", a.ckpt);
    if (st == PRL_OK) {
        fprintf(stderr, "bench: %d examples, %zu tokens (%d truncated to %d)\n", d.n, d.n_tokens,
                d.n_truncated, a.seq);
        st = bench(&m, &d, &a);
        prl_sft_data_free(&d);
    }
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    return st ? cli_fail("bench") : 0;
}
