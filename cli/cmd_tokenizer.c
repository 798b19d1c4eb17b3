/*
** cmd_tokenizer.c — `prl tokenizer train|encode|decode`.
*/
#include "cli/cli.h"
#include "sft/sft.h"

#include <stdlib.h>
#include <string.h>

static char *read_all(const char *path, size_t *len)
{
    char *text = NULL;
    return prl_file_read(path, &text, len) == PRL_OK ? text : NULL;
}

static int train(int argc, char **argv)
{
    const char *data = NULL, *text = NULL, *out = NULL;
    int vocab = 4096;
    cli_opt opts[] = {
        {"data", OPT_STR, &data, "FILE", "chat JSONL: trains on every message content", 0, 0},
        {"text", OPT_STR, &text, "FILE", "plain text file: trains on it as one text", 0, 0},
        {"vocab", OPT_INT, &vocab, "N",
         "vocabulary size incl. 16 specials and 256 bytes (default 4096)", 0, 0},
        {"out", OPT_STR, &out, "FILE", "new tokenizer.json to write (must not exist)", 1, 0},
        {0},
    };
    int rc = cli_parse(
        argc, argv, 3, opts, "prl tokenizer train (--data FILE.jsonl | --text FILE) --out FILE",
        "Learns a byte-level BPE tokenizer (digits always single tokens).", NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (!data == !text) return cli_failf("tokenizer", 2, "give exactly one of --data or --text");
    if (cli_require_new("tokenizer", "out", out)) return 2;
    char **texts = NULL;
    size_t n = 0, len = 0;
    prl_status st = PRL_OK;
    if (data) {
        st = prl_sft_read_texts(data, &texts, &n);
    } else {
        texts = malloc(sizeof *texts);
        texts[0] = read_all(text, &len);
        n = texts[0] ? 1 : 0;
        if (!texts[0]) st = PRL_ERR_IO;
    }
    prl_tokenizer *tok = NULL;
    double t0 = prl_now();
    if (st == PRL_OK) st = prl_tokenizer_train((const char *const *)texts, NULL, n, vocab, &tok);
    if (st == PRL_OK) st = prl_tokenizer_save(tok, out);
    if (st == PRL_OK)
        fprintf(stderr, "prl tokenizer: %d tokens from %zu texts in %.1fs -> %s\n",
                prl_tokenizer_vocab_size(tok), n, prl_now() - t0, out);
    for (size_t i = 0; i < n; i++) free(texts[i]);
    free(texts);
    prl_tokenizer_free(tok);
    return st ? cli_fail("tokenizer") : 0;
}

static int encode(int argc, char **argv)
{
    const char *path = NULL, *text = NULL, *file = NULL;
    int json = 0, special = 0;
    cli_opt opts[] = {
        {"tokenizer", OPT_STR, &path, "FILE", "tokenizer.json", 1, 0},
        {"text", OPT_STR, &text, "STR", "text to encode", 0, 0},
        {"file", OPT_STR, &file, "FILE", "file to encode", 0, 0},
        {"special", OPT_FLAG, &special, NULL,
         "turn special-token strings like <|end|> into their ids", 0, 0},
        {"json", OPT_FLAG, &json, NULL, "print a JSON array", 0, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts,
                       "prl tokenizer encode --tokenizer FILE (--text STR | --file FILE)",
                       "Prints the token ids of a text.", NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    if (!text == !file) return cli_failf("tokenizer", 2, "give exactly one of --text or --file");
    prl_tokenizer *tok = NULL;
    if (prl_tokenizer_load(path, &tok)) return cli_fail("tokenizer");
    size_t len = 0;
    char *owned = file ? read_all(file, &len) : NULL;
    if (file && !owned) {
        prl_tokenizer_free(tok);
        return cli_fail("tokenizer");
    }
    if (text) len = strlen(text);
    int32_t *ids = NULL;
    size_t n = 0;
    prl_status st = prl_tokenizer_encode(tok, text ? text : owned, len,
                                         special ? PRL_TOKENIZER_SPECIAL : 0, &ids, &n);
    if (st == PRL_OK) {
        printf(json ? "[" : "");
        for (size_t i = 0; i < n; i++)
            printf(json ? "%s%d" : "%s%d", i ? (json ? "," : " ") : "", ids[i]);
        printf(json ? "]\n" : "\n");
    }
    free(ids);
    free(owned);
    prl_tokenizer_free(tok);
    return st ? cli_fail("tokenizer") : 0;
}

static int decode(int argc, char **argv)
{
    const char *path = NULL, *list = NULL;
    cli_opt opts[] = {
        {"tokenizer", OPT_STR, &path, "FILE", "tokenizer.json", 1, 0},
        {"ids", OPT_STR, &list, "IDS", "token ids separated by spaces or commas", 1, 0},
        {0},
    };
    int rc = cli_parse(argc, argv, 3, opts, "prl tokenizer decode --tokenizer FILE --ids \"1 2 3\"",
                       "Prints the text of a list of token ids.", NULL, 0, NULL);
    if (rc) return rc == CLI_HELP ? 0 : 2;
    size_t cap = strlen(list) + 1, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    for (const char *p = list; *p;) {
        if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
            p++;
            continue;
        }
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffff) {
            free(ids);
            return cli_failf("tokenizer", 2, "--ids: '%.20s' is not a token id", p);
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    prl_tokenizer *tok = NULL;
    if (prl_tokenizer_load(path, &tok)) {
        free(ids);
        return cli_fail("tokenizer");
    }
    char *text = NULL;
    size_t len = 0;
    prl_status st = prl_tokenizer_decode(tok, ids, n, 0, &text, &len);
    if (st == PRL_OK) {
        fwrite(text, 1, len, stdout);
        printf("\n");
    }
    free(text);
    free(ids);
    prl_tokenizer_free(tok);
    return st ? cli_fail("tokenizer") : 0;
}

int cmd_tokenizer(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[2], "train")) return train(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "encode")) return encode(argc, argv);
    if (argc >= 3 && !strcmp(argv[2], "decode")) return decode(argc, argv);
    FILE *out =
        argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) ? stdout : stderr;
    if (out == stderr && argc >= 3)
        fprintf(stderr, "prl tokenizer: unknown subcommand '%s'%s\n", argv[2],
                cli_did_you_mean(argv[2], "train|encode|decode"));
    fprintf(out, "usage: prl tokenizer train|encode|decode [options]   (--help on each)\n");
    return out == stdout ? 0 : 2;
}
