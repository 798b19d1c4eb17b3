/*
** hf_tokenize.c — the prl side of tests/test_hf_tokenizers.sh: load a tokenizer.json, encode
** every {"text"} line of a corpus (special strings become their ids, as Hugging Face does),
** and write one line per document: {"ids": [...], "add": [...], "rt": 0|1} where "add" is the
** encoding with the post-processor's tokens (PRL_TOKENIZER_ADD_SPECIAL, first 64 documents
** only) and rt says whether decode(encode(text)) gave the text back byte for byte.
**
** With a chat file, also each {"messages"} line through the tokenizer's chat template: one
** line {"full": [...], "mask": [...], "prompt": [...], "prompt_all": [...]} per conversation:
** prl_tokenizer_encode_chat of all messages with its loss mask, the generation prompt of the
** messages before the last, and the generation prompt after all of them.
**
** usage: hf_tokenize TOKENIZER.json CORPUS.jsonl OUT.jsonl [CHAT.jsonl CHAT_OUT.jsonl]
*/
#include "engine/engine.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what)
{
    fprintf(stderr, "hf_tokenize: %s: %s\n", what, prl_error_message());
    return 1;
}

static void put_ids(FILE *f, const char *key, const int32_t *ids, size_t n)
{
    fprintf(f, "\"%s\": [", key);
    for (size_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", (int)ids[i]);
    fputc(']', f);
}

/* What an agent loop holds after the model's turn k-1 and the tool turn k (the prompt of the
** messages before k-1, the model's tokens with its end of turn, encode_chat_turn of message
** k) must be the generation prompt of messages 0..k, which training and scoring see. */
static int agent_turn_consistent(const prl_tokenizer *tok, const prl_chat_message *msgs, size_t k)
{
    int32_t *a = NULL, *b = NULL, *c = NULL, *want = NULL;
    size_t na = 0, nb = 0, nc = 0, nw = 0;
    int32_t end = prl_tokenizer_role_id(tok, PRL_ROLE_END);
    const char *reply = msgs[k - 1].content;
    if (prl_tokenizer_encode_chat_prompt(tok, msgs, k - 1, 0, &a, &na) ||
        prl_tokenizer_encode(tok, reply, strlen(reply), 0, &b, &nb) ||
        prl_tokenizer_encode_chat_turn(tok, &msgs[k], 0, &c, &nc) ||
        prl_tokenizer_encode_chat_prompt(tok, msgs, k + 1, 0, &want, &nw)) {
        fprintf(stderr, "hf_tokenize: agent turn: %s\n", prl_error_message());
        return 0;
    }
    int ok = na + nb + 1 + nc == nw && memcmp(want, a, na * sizeof *a) == 0 &&
             memcmp(want + na, b, nb * sizeof *b) == 0 && want[na + nb] == end &&
             memcmp(want + na + nb + 1, c, nc * sizeof *c) == 0;
    if (!ok) fprintf(stderr, "hf_tokenize: agent turn before message %zu differs\n", k);
    free(a), free(b), free(c), free(want);
    return ok;
}

/* The chat file: every conversation in the three chat encodings. */
static int chat(const prl_tokenizer *tok, const char *in_path, const char *out_path)
{
    FILE *in = fopen(in_path, "r"), *out = fopen(out_path, "w");
    if (!in || !out) {
        fprintf(stderr, "hf_tokenize: cannot open %s or %s\n", in_path, out_path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0, n_conv = 0, n_turns = 0, n_turn_bad = 0;
    for (ssize_t len; (len = getline(&line, &cap, in)) > 0; n_conv++) {
        json_error_t err;
        json_t *doc = json_loadb(line, (size_t)len, 0, &err);
        prl_chat_message *msgs = NULL;
        size_t nm = 0, n = 0, np = 0, na = 0;
        if (prl_chat_from_json(json_object_get(doc, "messages"), in_path, &msgs, &nm))
            return fail("chat");
        int32_t *ids = NULL, *prompt = NULL, *all = NULL;
        uint8_t *mask = NULL;
        if (prl_tokenizer_encode_chat(tok, msgs, nm, 0, &ids, &mask, &n) ||
            prl_tokenizer_encode_chat_prompt(tok, msgs, nm - 1, 0, &prompt, &np) ||
            prl_tokenizer_encode_chat_prompt(tok, msgs, nm, 0, &all, &na))
            return fail("chat");
        fputc('{', out);
        put_ids(out, "full", ids, n);
        fputs(", \"mask\": [", out);
        for (size_t i = 0; i < n; i++) fprintf(out, i ? ",%d" : "%d", mask[i]);
        fputs("], ", out);
        put_ids(out, "prompt", prompt, np);
        fputs(", ", out);
        put_ids(out, "prompt_all", all, na);
        fputs("}\n", out);
        free(ids), free(mask), free(prompt), free(all);
        for (size_t k = 2; k < nm; k++) /* every tool turn that follows a model turn */
            if (strcmp(msgs[k].role, "tool") == 0 && strcmp(msgs[k - 1].role, "assistant") == 0) {
                n_turns++;
                n_turn_bad += !agent_turn_consistent(tok, msgs, k);
            }
        free(msgs);
        json_decref(doc);
    }
    free(line);
    fclose(in);
    if (fclose(out)) return 1;
    fprintf(stderr,
            "hf_tokenize: %zu conversations through the chat template; agent loop (prompt, "
            "model turn, encode_chat_turn) == the prompt of the longer conversation for %zu of "
            "%zu tool turns\n",
            n_conv, n_turns - n_turn_bad, n_turns);
    return n_turn_bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: hf_tokenize TOKENIZER.json CORPUS.jsonl OUT.jsonl "
                        "[CHAT.jsonl CHAT_OUT.jsonl]\n");
        return 2;
    }
    prl_tokenizer *tok = NULL;
    double t0 = prl_now();
    if (prl_tokenizer_load(argv[1], &tok)) return fail(argv[1]);
    double t_load = prl_now() - t0;
    FILE *in = fopen(argv[2], "r"), *out = fopen(argv[3], "w");
    if (!in || !out) {
        fprintf(stderr, "hf_tokenize: cannot open %s or %s\n", argv[2], argv[3]);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0, docs = 0, bytes = 0, tokens = 0, lossless = 0;
    double t_enc = 0;
    for (ssize_t len; (len = getline(&line, &cap, in)) > 0;) {
        json_error_t err;
        json_t *doc = json_loadb(line, (size_t)len, 0, &err);
        const char *text = json_string_value(json_object_get(doc, "text"));
        if (!text) {
            fprintf(stderr, "hf_tokenize: %s line %zu: no \"text\"\n", argv[2], docs + 1);
            return 1;
        }
        size_t n_text = json_string_length(json_object_get(doc, "text")), n = 0;
        int32_t *ids = NULL;
        double t1 = prl_now();
        if (prl_tokenizer_encode(tok, text, n_text, PRL_TOKENIZER_SPECIAL, &ids, &n))
            return fail("encode");
        t_enc += prl_now() - t1;
        char *back = NULL;
        size_t n_back = 0;
        if (prl_tokenizer_decode(tok, ids, n, 0, &back, &n_back)) return fail("decode");
        int rt = n_back == n_text && memcmp(back, text, n_text) == 0;
        fputc('{', out);
        put_ids(out, "ids", ids, n);
        if (docs < 64) {
            int32_t *add = NULL;
            size_t n_add = 0;
            if (prl_tokenizer_encode(tok, text, n_text,
                                     PRL_TOKENIZER_SPECIAL | PRL_TOKENIZER_ADD_SPECIAL, &add,
                                     &n_add))
                return fail("encode");
            fputs(", ", out);
            put_ids(out, "add", add, n_add);
            free(add);
        }
        fprintf(out, ", \"rt\": %d}\n", rt);
        docs++, bytes += n_text, tokens += n, lossless += (size_t)rt;
        free(ids);
        free(back);
        json_decref(doc);
    }
    free(line);
    fclose(in);
    if (fclose(out)) return 1;
    fprintf(stderr,
            "hf_tokenize: %s: vocab %d, loaded in %.2fs; %zu documents, %zu bytes -> %zu "
            "tokens in %.2fs (%.1f MB/s); decode(encode(x)) == x for %zu\n",
            argv[1], prl_tokenizer_vocab_size(tok), t_load, docs, bytes, tokens, t_enc,
            bytes / 1e6 / (t_enc > 0 ? t_enc : 1e-9), lossless);
    int rc = argc == 6 ? chat(tok, argv[4], argv[5]) : 0;
    prl_tokenizer_free(tok);
    return rc;
}
