/*
** cmd_rm.c — `prl rm`: reward models (rm/rm.h, docs/reward-models.md).
**   prl rm pairs   General preference pairs from the task generator (JSONL)
**   prl rm train   a Bradley–Terry reward model from a pairs file
**   prl rm score   a reward model's score of each answer of a pairs or tasks-check file
*/
#include "cli/cli.h"
#include "rm/rm.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int pairs(int argc, char **argv)
{
    const char *out = NULL, *split = "train";
    prl_rm_pairs_options o = {.n = 1000, .seed = 1, .difficulty = 0};
    cli_opt opts[] = {
        {"out", OPT_STR, &out, "FILE", "pairs JSONL to write (must not exist)", 1, 0},
        {"n", OPT_INT, &o.n, "N", "General problems (4 pairs each; default 1000)", 0, 0},
        {"seed", OPT_U64, &o.seed, "S", "seed (default 1)", 0, 0},
        {"split", OPT_STR, &split, "S", "train or eval problems (default train)", 0, 0},
        {"difficulty", OPT_INT, &o.difficulty, "K", "1..3, or 0 for a mix (default 0)", 0, 0},
        {0},
    };
    const char *usage = "prl rm pairs --out FILE [--n N] [--seed S] [--split train|eval] "
                        "[--difficulty K]";
    const char *summary =
        "Writes General preference pairs: per problem its demonstration (chosen) against a "
        "repeated-word, an off-topic, a constraint-stuffed and a truncated answer (rejected), "
        "one line each (docs/formats.md \"Preference pairs\").";
    int rc = cli_parse(argc, argv, 3, opts, usage, summary, NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (prl_tasks_split_parse(split, &o.split))
        return cli_failf("rm", 2, "%s", prl_error_message());
    if (o.n < 1) return cli_failf("rm", 2, "--n must be >= 1, got %d", o.n);
    if (o.difficulty < 0 || o.difficulty > PRL_TASKS_MAX_DIFFICULTY)
        return cli_failf("rm", 2, "--difficulty must be 0..3, got %d", o.difficulty);
    if (cli_require_new("rm", "out", out)) return 2;
    char *text = NULL;
    size_t len = 0;
    int written = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return cli_failf("rm", 1, "out of memory");
    prl_status st = prl_rm_pairs_write(&o, mem, &written);
    if (fclose(mem) != 0 && st == PRL_OK) st = prl_error_set(PRL_ERR_NOMEM, "buffering output");
    if (st == PRL_OK) st = prl_file_write_atomic(out, text, len);
    free(text);
    if (st) return cli_fail("rm");
    fprintf(stderr, "prl rm: wrote %d pairs of %d %s problems to %s\n", written, o.n, split, out);
    return 0;
}

static int train(int argc, char **argv)
{
    prl_rm_train_options o;
    prl_rm_train_options_default(&o);
    int threads = 0;
    cli_opt opts[] = {
        {"data", OPT_STR, &o.data, "FILE", "training pairs (JSONL)", 1, 0},
        {"ckpt", OPT_STR, &o.ckpt, "DIR", "start from this checkpoint (model + tokenizer)", 0, 0},
        {"model", OPT_STR, &o.model, "CONFIG", "or a fresh model of this config.json", 0, 0},
        {"tokenizer", OPT_STR, &o.tokenizer, "FILE",
         "with --model: its tokenizer.json (default: bytes)", 0, 0},
        {"out", OPT_STR, &o.out, "DIR", "reward model checkpoint to write (must not exist)", 1, 0},
        {"eval", OPT_STR, &o.eval, "FILE", "held-out pairs (default: a share of --data)", 0, 0},
        {"holdout", OPT_INT, &o.holdout, "K",
         "without --eval: every K-th group of 4 pairs is held out (default 10)", 0, 0},
        {"steps", OPT_INT, &o.steps, "N", "optimizer steps (default 300)", 0, 0},
        {"batch", OPT_INT, &o.batch, "P", "pairs per step (default 8)", 0, 0},
        {"lr", OPT_DOUBLE, &o.lr, "LR", "AdamW learning rate (default 1e-4)", 0, 0},
        {"margin", OPT_DOUBLE, &o.margin, "M",
         "loss -log sigmoid(r_chosen - r_rejected - M) (default 0)", 0, 0},
        {"max-len", OPT_INT, &o.max_len, "T", "tokens per chat, cut at the front (default 256)", 0,
         0},
        {"seed", OPT_U64, &o.seed, "S", "seed of the head's init and the order (default 1)", 0, 0},
        {"threads", OPT_INT, &threads, "N", "threads (default: all cores)", 0, 0},
        {0},
    };
    const char *usage = "prl rm train --data PAIRS.jsonl (--ckpt DIR | --model CONFIG "
                        "[--tokenizer FILE]) --out DIR [--eval PAIRS.jsonl] [options]";
    const char *summary =
        "Trains a Bradley-Terry reward model: the model with a scalar head score.weight on the "
        "last token, loss -log sigmoid(r_chosen - r_rejected - margin). Prints and saves "
        "(state.json \"reward_model\") the held-out pair accuracy.";
    int rc = cli_parse(argc, argv, 3, opts, usage, summary, NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (!o.ckpt == !o.model) return cli_failf("rm", 2, "give --ckpt DIR or --model CONFIG");
    if (cli_require_new("rm", "out", o.out) || cli_setup_blas("rm", threads)) return 2;
    o.log = stderr;
    prl_rm_train_result res;
    if (prl_rm_train(&o, &res)) return cli_fail("rm");
    printf("held-out pair accuracy %.4f (%d pairs), loss %.4f -> %s\n", res.eval_accuracy,
           res.n_eval, res.eval_loss, o.out);
    return 0;
}

/* One line of `prl rm score`: a pairs line (both answers) or a check line ("response"). */
static prl_status score_line(void *user, json_t *obj, int line, int *go)
{
    (void)go;
    prl_rm *rm = user;
    prl_chat_message *msgs = NULL;
    size_t n = 0;
    prl_status rc = cli_json_messages(json_object_get(obj, "messages"), "input", line, &msgs, &n);
    const char *ans[2] = {json_string_value(json_object_get(obj, "chosen")),
                          json_string_value(json_object_get(obj, "rejected"))};
    int k = ans[0] && ans[1] ? 2 : 0;
    if (!k && (ans[0] = json_string_value(json_object_get(obj, "response")))) k = 1;
    if (!rc && !k)
        rc = prl_error_set(PRL_ERR_FORMAT,
                           "line %d: needs \"chosen\" and \"rejected\", or "
                           "\"response\"",
                           line);
    double s[2];
    if (!rc) rc = prl_rm_score(rm, msgs, n, ans, k, s);
    if (!rc && k == 2)
        printf("{\"line\": %d, \"chosen\": %.6f, \"rejected\": %.6f}\n", line, s[0], s[1]);
    else if (!rc) printf("{\"line\": %d, \"score\": %.6f}\n", line, s[0]);
    free(msgs);
    return rc;
}

static int score(int argc, char **argv)
{
    const char *ckpt = NULL, *input = NULL;
    cli_opt opts[] = {
        {"rm", OPT_STR, &ckpt, "DIR", "reward model checkpoint (prl rm train)", 1, 0},
        {"input", OPT_STR, &input, "FILE",
         "JSONL: pairs (chosen, rejected) or lines with \"messages\" and \"response\"", 1, 0},
        {0},
    };
    const char *usage = "prl rm score --rm DIR --input FILE";
    const char *summary = "Prints the reward model's raw score of each answer, one JSON line "
                          "per input line.";
    int rc = cli_parse(argc, argv, 3, opts, usage, summary, NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (cli_setup_blas("rm", 0)) return 2;
    prl_rm *rm = NULL;
    if (prl_rm_open(&rm, ckpt)) return cli_fail("rm");
    prl_status st = cli_jsonl_for_each(input, score_line, rm);
    prl_rm_close(rm);
    return st ? cli_fail("rm") : 0;
}

int cmd_rm(int argc, char **argv)
{
    const char *sub = argc >= 3 ? argv[2] : "";
    if (!strcmp(sub, "pairs")) return pairs(argc, argv);
    if (!strcmp(sub, "train")) return train(argc, argv);
    if (!strcmp(sub, "score")) return score(argc, argv);
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) {
        printf("usage: prl rm pairs|train|score [options]   (--help on each)\n\n"
               "  pairs  General preference pairs from the task generator\n"
               "  train  a Bradley-Terry reward model from preference pairs\n"
               "  score  a reward model's scores of answers\n");
        return 0;
    }
    if (*sub)
        return cli_failf("rm", 2, "unknown subcommand '%s'%s (pairs, train or score)", sub,
                         cli_did_you_mean(sub, "pairs|train|score"));
    return cli_failf("rm", 2, "expected a subcommand: pairs, train or score (see prl rm --help)");
}
