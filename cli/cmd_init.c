/*
** cmd_init.c — `prl init`: a randomly initialised checkpoint from a model config.
*/
#include "cli/cli.h"

int cmd_init(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *tokenizer = NULL;
    uint64_t seed = 1;
    cli_opt opts[] = {
        {"model", OPT_STR, &model, "CONFIG", "model config.json (openpangu_v2 keys)", 1, 0},
        {"out", OPT_STR, &out, "DIR", "new checkpoint directory to write (must not exist)", 1, 0},
        {"seed", OPT_U64, &seed, "S", "initialisation seed (default 1)", 0, 0},
        {"tokenizer", OPT_STR, &tokenizer, "FILE", "tokenizer.json to store beside the weights", 0,
         0},
        {0},
    };
    int rc = cli_parse(argc, argv, 2, opts, "prl init --model CONFIG --out DIR [--seed S]",
                       "Builds the model described by CONFIG, draws its weights from the seed, and "
                       "writes a checkpoint directory (config.json, model.safetensors).",
                       NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (cli_require_new("init", "out", out)) return 2;
    prl_config cfg;
    prl_model m;
    if (prl_config_load(&cfg, model)) return cli_fail("init");
    if (prl_model_init(&m, &cfg)) return cli_fail("init");
    prl_model_init_weights(&m, seed);
    prl_tokenizer *tok = NULL;
    if (tokenizer && prl_tokenizer_load(tokenizer, &tok)) {
        prl_model_free(&m);
        return cli_fail("init");
    }
    if (tok && prl_tokenizer_vocab_size(tok) > cfg.vocab_size) {
        prl_model_free(&m);
        prl_tokenizer_free(tok);
        return cli_failf("init", 1, "tokenizer %s has %d tokens, more than vocab_size %d of %s",
                         tokenizer, prl_tokenizer_vocab_size(tok), cfg.vocab_size, model);
    }
    prl_status st = prl_checkpoint_save(&m, NULL, NULL, tok, out);
    prl_tokenizer_free(tok);
    if (st) {
        prl_model_free(&m);
        return cli_fail("init");
    }
    fprintf(stderr, "prl init: %zu parameters, seed %llu -> %s\n", m.n_params,
            (unsigned long long)seed, out);
    prl_model_free(&m);
    return 0;
}
