/*
** test_tokenizer.c — Check tests for engine/tokenizer*.c.
**
** Covers: the vocabulary layout; the pre-tokenization rule against an independent reference
** (a greedy matcher written like the tokenizer.json regex); byte round trips on random data
** (NULs, invalid UTF-8); the fast encoder against the naive reference loop; digit splitting;
** a hand-computed training example (with a count tie) and trainer determinism; special
** tokens; decode errors; chat encoding and its loss mask; save/load round trips and the
** rejection of corrupted files (status and message); parallel encoding == serial encoding on
** 200+ varied inputs with 1..4 threads and small windows.
**
** Longer than ~800 lines on purpose: one Check suite per module, whose cases share the
** fixtures and helpers at its top (split by case, they would be repeated or moved to a header
** with one reader).
*/
#include "engine/engine.h"
#include "tests/check_util.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers ---------- */

static uint64_t rnd(prl_rng *r, uint64_t n) { return prl_rng_u64(r) % n; }

static const char *const WORDS[] = {
    "the",    "of",     "and",    "to",     "in",     "is",     "was",    "for",  "that",
    "with",   "model",  "token",  "merge",  "expert", "router", "train",  "loss", "reward",
    "hug",    "pug",    "pun",    "bun",    "hugs",   "The",    "Model",  "café", "naïve",
    "über",   "Straße", "日本語", "данные", "λόγος",  "aaaa",   "zzzzzz", "if",   "else",
    "return", "int",    "printf", "x",      "y",      "i",      "j",      "tool", "call"};

/* Text in the style of prose with numbers, punctuation, code, UTF-8 and odd whitespace. */
static char *make_corpus(uint64_t seed, size_t target, size_t *len)
{
    prl_rng r;
    prl_rng_init(&r, seed, 1, 2, 3, PRL_RNG_TEST);
    char *s = malloc(target + 64);
    ck_assert_ptr_nonnull(s);
    size_t n = 0;
    const size_t n_words = sizeof WORDS / sizeof WORDS[0];
    while (n < target) {
        uint64_t k = rnd(&r, 100);
        const char *piece;
        char num[24];
        if (k < 70) {
            piece = WORDS[rnd(&r, n_words) % (rnd(&r, 2) ? n_words : 12)];
        } else if (k < 78) {
            snprintf(num, sizeof num, "%llu", (unsigned long long)rnd(&r, 100000));
            piece = num;
        } else {
            static const char *const punct[] = {",",  ".",  "!",    "?",  "(",  ")",   "...", "{",
                                                "};", "\n", "\n\n", "  ", "\t", " - ", "\"",  "=="};
            piece = punct[rnd(&r, 16)];
        }
        size_t pl = strlen(piece);
        if (n + pl + 1 > target + 63) break;
        if (n > 0 && k < 78 && rnd(&r, 10) < 8) s[n++] = ' ';
        memcpy(s + n, piece, pl);
        n += pl;
    }
    s[n] = '\0';
    *len = n;
    return s;
}

/* A tokenizer trained on 300 KB of make_corpus text. */
static prl_tokenizer *trained(int32_t vocab)
{
    size_t len;
    char *c = make_corpus(7, 300000, &len);
    const char *texts[1] = {c};
    prl_tokenizer *tok = NULL;
    assert_ok(prl_tokenizer_train(texts, &len, 1, vocab, &tok));
    free(c);
    return tok;
}

static void encode_ok(const prl_tokenizer *tok, const void *t, size_t n, unsigned flags,
                      int32_t **ids, size_t *n_ids)
{
    assert_ok(prl_tokenizer_encode(tok, t, n, flags, ids, n_ids));
    ck_assert_ptr_nonnull(*ids);
}

static void assert_round_trip(const prl_tokenizer *tok, const uint8_t *t, size_t n, unsigned flags)
{
    int32_t *ids;
    size_t n_ids;
    encode_ok(tok, t, n, flags, &ids, &n_ids);
    char *back;
    size_t back_len;
    assert_ok(prl_tokenizer_decode(tok, ids, n_ids, 0, &back, &back_len));
    ck_assert_uint_eq(back_len, n);
    ck_assert_msg(memcmp(back, t, n) == 0, "decode(encode(s)) != s for %zu bytes", n);
    ck_assert_int_eq(back[back_len], '\0');
    free(ids);
    free(back);
}

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* ---------------------------------------------------------------- layout ----------- */

START_TEST(test_layout)
{
    prl_tokenizer *tok = NULL;
    assert_ok(prl_tokenizer_init_bytes(&tok));
    ck_assert_int_eq(prl_tokenizer_vocab_size(tok), 272);
    ck_assert_uint_eq(prl_tokenizer_n_merges(tok), 0);
    static const char *const names[16] = {
        "<|pad|>",        "<|bos|>",        "<|eos|>",        "<|system|>",
        "<|user|>",       "<|assistant|>",  "<|tool|>",       "<|end|>",
        "<|tool_call|>",  "<|/tool_call|>", "<|think|>",      "<|/think|>",
        "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>", "<|reserved_3|>"};
    size_t longest = 0;
    for (int32_t i = 0; i < 16; i++) {
        ck_assert_str_eq(prl_tokenizer_special_name(i), names[i]);
        ck_assert_int_eq(prl_tokenizer_special_id(names[i]), i);
        const uint8_t *b;
        size_t n;
        assert_ok(prl_tokenizer_token_bytes(tok, i, &b, &n));
        ck_assert(n == strlen(names[i]) && memcmp(b, names[i], n) == 0);
        if (n > longest) longest = n;
    }
    ck_assert_uint_eq(longest, 14); /* tokenizer_int.h's SPECIAL_MAX_LEN */
    ck_assert_int_eq(PRL_TOKEN_ASSISTANT, 5);
    ck_assert_int_eq(PRL_TOKEN_END, 7);
    ck_assert_int_eq(PRL_TOKEN_THINK_END, 11);
    ck_assert_ptr_null(prl_tokenizer_special_name(16));
    ck_assert_ptr_null(prl_tokenizer_special_name(-1));
    ck_assert_int_eq(prl_tokenizer_special_id("<|nope|>"), -1);
    for (int b = 0; b < 256; b++) {
        const uint8_t *p;
        size_t n;
        assert_ok(prl_tokenizer_token_bytes(tok, 16 + b, &p, &n));
        ck_assert(n == 1 && p[0] == b);
    }
    ck_assert_int_eq(prl_tokenizer_token_bytes(tok, 272, NULL, NULL), PRL_ERR_RANGE);
    assert_msg_has("272");
    ck_assert_int_eq(prl_tokenizer_merge(tok, 0, NULL, NULL, NULL), PRL_ERR_RANGE);
    /* Without merges every byte is one token. */
    int32_t *ids;
    size_t n;
    encode_ok(tok, "ab\0\xff", 4, 0, &ids, &n);
    ck_assert_uint_eq(n, 4);
    ck_assert(ids[0] == 16 + 'a' && ids[1] == 16 + 'b' && ids[2] == 16 && ids[3] == 16 + 255);
    free(ids);
    prl_tokenizer_free(tok);
    prl_tokenizer_free(NULL);
}
END_TEST

/* ---------------------------------------------------------------- pre-tokenization - */

/* Independent reference of the chunk grammar, written like the regex alternation in
** tokenizer.json: [0-9] | ' '?L+ | ' '?P+ | W+ that leaves its last ' ' to a following L/P
** | W+. */
static int cls(uint8_t c)
{
    if (c >= '0' && c <= '9') return 'D';
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return 'L';
    if (c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r') return 'W';
    return 'P';
}

static size_t ref_chunk_end(const uint8_t *t, size_t n, size_t i)
{
    int c = cls(t[i]);
    if (c == 'D') return i + 1;
    size_t j = i;
    if (t[i] == ' ' && i + 1 < n && (cls(t[i + 1]) == 'L' || cls(t[i + 1]) == 'P')) {
        int k = cls(t[i + 1]);
        j = i + 1;
        while (j < n && cls(t[j]) == k) j++;
        return j;
    }
    while (j < n && cls(t[j]) == c) j++;
    if (c == 'W' && j < n && j - i >= 2 && t[j - 1] == ' ' &&
        (cls(t[j]) == 'L' || cls(t[j]) == 'P'))
        j--;
    return j;
}

static void expect_chunks(const char *text, const char *const *chunks)
{
    size_t n = strlen(text), p = 0, k = 0;
    while (p < n) {
        size_t q = prl_tokenizer_chunk_end(text, n, p);
        ck_assert_msg(chunks[k] != NULL, "\"%s\": extra chunk at %zu", text, p);
        ck_assert_msg(q - p == strlen(chunks[k]) && memcmp(text + p, chunks[k], q - p) == 0,
                      "\"%s\": chunk %zu is \"%.*s\", expected \"%s\"", text, k, (int)(q - p),
                      text + p, chunks[k]);
        p = q;
        k++;
    }
    ck_assert_msg(chunks[k] == NULL, "\"%s\": missing chunk \"%s\"", text, chunks[k]);
}

START_TEST(test_pretokenize_examples)
{
    expect_chunks("hello world", (const char *[]){"hello", " world", NULL});
    expect_chunks("12345", (const char *[]){"1", "2", "3", "4", "5", NULL});
    expect_chunks("x1y 22", (const char *[]){"x", "1", "y", " ", "2", "2", NULL});
    expect_chunks("a  b", (const char *[]){"a", " ", " b", NULL});
    expect_chunks("  1", (const char *[]){"  ", "1", NULL});
    expect_chunks("foo...bar", (const char *[]){"foo", "...", "bar", NULL});
    expect_chunks("a ...b", (const char *[]){"a", " ...", "b", NULL});
    expect_chunks("\n\nabc", (const char *[]){"\n\n", "abc", NULL});
    expect_chunks("\t a", (const char *[]){"\t", " a", NULL});
    expect_chunks("end.  ", (const char *[]){"end", ".", "  ", NULL});
    expect_chunks("caf\xc3\xa9!", (const char *[]){"caf\xc3\xa9", "!", NULL});
    expect_chunks(" \xff\xfe", (const char *[]){" \xff\xfe", NULL});
    expect_chunks("x \n y", (const char *[]){"x", " \n", " y", NULL});
    expect_chunks("<|user|>", (const char *[]){"<|", "user", "|>", NULL});
    ck_assert_uint_eq(prl_tokenizer_chunk_end("a\0b", 3, 0), 1);
    ck_assert_uint_eq(prl_tokenizer_chunk_end("a\0\x01"
                                              "b",
                                              4, 1),
                      3); /* NUL is P */
    ck_assert_uint_eq(prl_tokenizer_chunk_end("ab", 2, 5), 2);
}
END_TEST

START_TEST(test_pretokenize_reference)
{
    static const uint8_t alphabet[] = {'a', 'Z',  '7',  ' ',  ' ',  '\n', '\t', '.',
                                       '!', 0xc3, 0xa9, 0x00, '\r', '<',  '|'};
    prl_rng r;
    prl_rng_init(&r, 11, 0, 0, 0, PRL_RNG_TEST);
    uint8_t t[64];
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = 1 + rnd(&r, sizeof t);
        for (size_t i = 0; i < n; i++) t[i] = alphabet[rnd(&r, sizeof alphabet)];
        for (size_t p = 0; p < n;) {
            size_t q = prl_tokenizer_chunk_end(t, n, p), e = ref_chunk_end(t, n, p);
            ck_assert_msg(q == e, "iter %d: chunk at %zu ends at %zu, reference %zu", iter, p, q,
                          e);
            p = q;
        }
    }
}
END_TEST

/* ---------------------------------------------------------------- encode/decode ---- */

START_TEST(test_round_trip_random_bytes)
{
    prl_tokenizer *bytes = NULL, *tok = trained(1024);
    assert_ok(prl_tokenizer_init_bytes(&bytes));
    prl_rng r;
    prl_rng_init(&r, 12, 0, 0, 0, PRL_RNG_TEST);
    uint8_t *t = malloc(70000);
    for (int iter = 0; iter < 300; iter++) {
        size_t n = iter == 0 ? 0 : rnd(&r, iter % 10 == 0 ? 70000 : 300);
        int mode = (int)rnd(&r, 3);
        for (size_t i = 0; i < n; i++) /* uniform bytes, ASCII-heavy, or long runs */
            t[i] = mode == 0   ? (uint8_t)rnd(&r, 256)
                   : mode == 1 ? (uint8_t) " aeiou\n\x00\xc3\xa9\xff.<|>"[rnd(&r, 15)]
                               : (i && rnd(&r, 8) ? t[i - 1] : (uint8_t)rnd(&r, 256));
        assert_round_trip(bytes, t, n, 0);
        assert_round_trip(tok, t, n, 0);
        assert_round_trip(tok, t, n, PRL_TOKENIZER_SPECIAL);
    }
    free(t);
    prl_tokenizer_free(bytes);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_fast_matches_naive)
{
    prl_tokenizer *tok = trained(1500);
    size_t len;
    char *c = make_corpus(99, 200000, &len);
    int32_t *fast, *naive;
    size_t nf, nn;
    encode_ok(tok, c, len, 0, &fast, &nf);
    encode_ok(tok, c, len, PRL_TOKENIZER_NAIVE, &naive, &nn);
    ck_assert(ids_equal(fast, nf, naive, nn));
    ck_assert_uint_lt(nf, len / 2); /* the merges compress the text they were trained on */
    free(fast);
    free(naive);
    /* Long single chunks (heap path, no cache) and short texts (no cache). */
    char run[5000];
    for (int k = 0; k < 3; k++) {
        memset(run, "a z"[k], sizeof run);
        encode_ok(tok, run, sizeof run, 0, &fast, &nf);
        encode_ok(tok, run, sizeof run, PRL_TOKENIZER_NAIVE, &naive, &nn);
        ck_assert(ids_equal(fast, nf, naive, nn));
        free(fast);
        free(naive);
    }
    /* 30000 distinct random words: more chunks than the chunk cache holds (it clears). */
    prl_rng r;
    prl_rng_init(&r, 14, 0, 0, 0, PRL_RNG_TEST);
    char *words = malloc(400000);
    size_t wl = 0;
    for (int w = 0; w < 30000; w++) {
        size_t k = 2 + rnd(&r, 12);
        words[wl++] = ' ';
        for (size_t i = 0; i < k; i++) words[wl++] = "etaoinshrdlu"[rnd(&r, 12)];
    }
    encode_ok(tok, words, wl, 0, &fast, &nf);
    encode_ok(tok, words, wl, PRL_TOKENIZER_NAIVE, &naive, &nn);
    ck_assert(ids_equal(fast, nf, naive, nn));
    free(fast);
    free(naive);
    free(words);
    encode_ok(tok, "the model", 9, 0, &fast, &nf);
    encode_ok(tok, "the model", 9, PRL_TOKENIZER_NAIVE, &naive, &nn);
    ck_assert(ids_equal(fast, nf, naive, nn));
    ck_assert_uint_eq(nf, 2); /* "the", " model" are learned */
    free(fast);
    free(naive);
    free(c);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_digits_never_merge)
{
    /* Train on digit-heavy text: digit pairs would dominate if they could merge. */
    char *t = malloc(200001);
    for (int i = 0; i < 200000; i++) t[i] = (char)('0' + (i * 7 / 3) % 10);
    t[200000] = '\0';
    const char *texts[2] = {t, "ab ab ab 1 2 3 12345 abc"};
    prl_tokenizer *tok = NULL;
    assert_ok(prl_tokenizer_train(texts, NULL, 2, 400, &tok));
    for (int32_t id = 272; id < prl_tokenizer_vocab_size(tok); id++) {
        const uint8_t *b;
        size_t n;
        assert_ok(prl_tokenizer_token_bytes(tok, id, &b, &n));
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(!(b[i] >= '0' && b[i] <= '9'), "token %d contains a digit", id);
    }
    int32_t *ids;
    size_t n;
    encode_ok(tok, "12345", 5, 0, &ids, &n);
    ck_assert_uint_eq(n, 5);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ids[i], 16 + '1' + i);
    free(ids);
    prl_tokenizer_free(tok);
    tok = trained(1024);
    encode_ok(tok, "x=12345;", 8, 0, &ids, &n);
    ck_assert_uint_eq(n, 8); /* "x", "=", 5 digits, ";" */
    ck_assert_int_eq(ids[2], 16 + '1');
    ck_assert_int_eq(ids[6], 16 + '5');
    free(ids);
    prl_tokenizer_free(tok);
    free(t);
}
END_TEST

START_TEST(test_special_tokens)
{
    prl_tokenizer *tok = trained(800);
    const char *s = "hi<|user|>x<|/think|><|nope|><|end|";
    int32_t *ids;
    size_t n;
    encode_ok(tok, s, strlen(s), PRL_TOKENIZER_SPECIAL, &ids, &n);
    int n_special = 0;
    for (size_t i = 0; i < n; i++) n_special += ids[i] < 16;
    ck_assert_int_eq(n_special, 2);
    int found_user = 0, found_think = 0;
    for (size_t i = 0; i < n; i++) {
        found_user |= ids[i] == PRL_TOKEN_USER;
        found_think |= ids[i] == PRL_TOKEN_THINK_END;
    }
    ck_assert(found_user && found_think);
    char *back;
    size_t bl;
    assert_ok(prl_tokenizer_decode(tok, ids, n, 0, &back, &bl));
    ck_assert_str_eq(back, s);
    free(back);
    assert_ok(prl_tokenizer_decode(tok, ids, n, PRL_TOKENIZER_SKIP_SPECIAL, &back, &bl));
    ck_assert_str_eq(back, "hix<|nope|><|end|");
    free(back);
    free(ids);
    /* Without the flag special strings are plain bytes. */
    encode_ok(tok, s, strlen(s), 0, &ids, &n);
    for (size_t i = 0; i < n; i++) ck_assert_int_ge(ids[i], 16);
    free(ids);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_decode_invalid_ids)
{
    prl_tokenizer *tok = trained(600);
    char *text = (char *)1;
    size_t len = 99;
    int32_t bad1[] = {20, 30, 600};
    ck_assert_int_eq(prl_tokenizer_decode(tok, bad1, 3, 0, &text, &len), PRL_ERR_RANGE);
    assert_msg_has("token id 600");
    assert_msg_has("position 2");
    assert_msg_has("[0, 600)");
    ck_assert_ptr_null(text);
    ck_assert_uint_eq(len, 0);
    int32_t bad2[] = {-1};
    ck_assert_int_eq(prl_tokenizer_decode(tok, bad2, 1, 0, &text, &len), PRL_ERR_RANGE);
    assert_msg_has("token id -1");
    int32_t ok[] = {599, 16, 0};
    assert_ok(prl_tokenizer_decode(tok, ok, 3, 0, &text, &len));
    free(text);
    assert_ok(prl_tokenizer_decode(tok, NULL, 0, 0, &text, &len));
    ck_assert_uint_eq(len, 0);
    ck_assert_str_eq(text, "");
    free(text);
    ck_assert_int_eq(prl_tokenizer_decode(NULL, ok, 1, 0, &text, &len), PRL_ERR_ARG);
    prl_tokenizer_free(tok);
}
END_TEST

/* ---------------------------------------------------------------- training --------- */

static prl_tokenizer *train_strings(const char *const *texts, size_t n, int32_t vocab)
{
    prl_tokenizer *tok = NULL;
    assert_ok(prl_tokenizer_train(texts, NULL, n, vocab, &tok));
    return tok;
}

/* The Hugging Face course example: hug x10, pug x5, pun x12, bun x4, hugs x5.
** Pair counts start at ug 20, pu 17, un 16, hu 15, gs 5, bu 4, so the merges are:
**   u+g (20) -> 272, u+n (16) -> 273, h+ug (15) -> 274, p+un (12) -> 275,
**   then a tie at 5 between p+ug (ids 128, 272) and hug+s (274, 131): the lower left id
**   wins, p+ug -> 276, then hug+s -> 277, b+un (4) -> 278, and no pair is left.
** The tokenizer trained on these words with a vocabulary cap of `vocab` ids. */
static prl_tokenizer *train_hand_example(int32_t vocab)
{
    const char *texts[36];
    size_t k = 0;
    for (int i = 0; i < 5; i++) texts[k++] = "hugs";
    for (int i = 0; i < 4; i++) texts[k++] = "bun";
    for (int i = 0; i < 12; i++) texts[k++] = "pun";
    for (int i = 0; i < 5; i++) texts[k++] = "pug";
    for (int i = 0; i < 10; i++) texts[k++] = "hug";
    return train_strings(texts, k, vocab);
}

/* The hand example: its merges in order, a merged token and an encoding; then the vocabulary
** cap, and a pure tie. */
START_TEST(test_train_hand_example)
{
    prl_tokenizer *tok = train_hand_example(1000);
    const int32_t h = 16 + 'h', u = 16 + 'u', g = 16 + 'g', n = 16 + 'n', p = 16 + 'p',
                  b = 16 + 'b', s = 16 + 's';
    const int32_t want[7][3] = {{u, g, 272},   {u, n, 273},   {h, 272, 274}, {p, 273, 275},
                                {p, 272, 276}, {274, s, 277}, {b, 273, 278}};
    ck_assert_uint_eq(prl_tokenizer_n_merges(tok), 7);
    ck_assert_int_eq(prl_tokenizer_vocab_size(tok), 279); /* stopped early: no pairs left */
    for (size_t r = 0; r < 7; r++) {
        int32_t l, rr, res;
        assert_ok(prl_tokenizer_merge(tok, r, &l, &rr, &res));
        ck_assert_msg(l == want[r][0] && rr == want[r][1] && res == want[r][2],
                      "merge %zu is %d+%d->%d, expected %d+%d->%d", r, l, rr, res, want[r][0],
                      want[r][1], want[r][2]);
    }
    const uint8_t *bytes;
    size_t len;
    assert_ok(prl_tokenizer_token_bytes(tok, 277, &bytes, &len));
    ck_assert(len == 4 && memcmp(bytes, "hugs", 4) == 0);
    int32_t *ids;
    size_t ni;
    encode_ok(tok, "hug pug hugs", 12, 0, &ids, &ni);
    ck_assert_uint_eq(ni, 5); /* "hug", " pug", " hugs": no merge takes the space */
    ck_assert(ids[0] == 274 && ids[1] == 16 + ' ' && ids[2] == 276 && ids[3] == 16 + ' ' &&
              ids[4] == 277);
    free(ids);
    prl_tokenizer_free(tok);

    /* The same merges with a vocabulary cap of 276: four merges only. */
    tok = train_hand_example(276);
    ck_assert_uint_eq(prl_tokenizer_n_merges(tok), 4);
    ck_assert_int_eq(prl_tokenizer_vocab_size(tok), 276);
    prl_tokenizer_free(tok);

    /* A pure tie: (a,b) and (c,d) once each; (a,b) has the lower ids whatever the order. */
    tok = train_strings((const char *[]){"cd", "ab"}, 2, 273);
    int32_t l, r, res;
    assert_ok(prl_tokenizer_merge(tok, 0, &l, &r, &res));
    ck_assert(l == 16 + 'a' && r == 16 + 'b' && res == 272);
    prl_tokenizer_free(tok);
}
END_TEST

static void assert_same_tokenizer(const prl_tokenizer *a, const prl_tokenizer *b)
{
    ck_assert_int_eq(prl_tokenizer_vocab_size(a), prl_tokenizer_vocab_size(b));
    ck_assert_uint_eq(prl_tokenizer_n_merges(a), prl_tokenizer_n_merges(b));
    for (size_t r = 0; r < prl_tokenizer_n_merges(a); r++) {
        int32_t x[3], y[3];
        assert_ok(prl_tokenizer_merge(a, r, &x[0], &x[1], &x[2]));
        assert_ok(prl_tokenizer_merge(b, r, &y[0], &y[1], &y[2]));
        ck_assert_msg(memcmp(x, y, sizeof x) == 0, "merge %zu differs", r);
    }
    for (int32_t id = 0; id < prl_tokenizer_vocab_size(a); id++) {
        const uint8_t *p, *q;
        size_t n, m;
        assert_ok(prl_tokenizer_token_bytes(a, id, &p, &n));
        assert_ok(prl_tokenizer_token_bytes(b, id, &q, &m));
        ck_assert_msg(n == m && memcmp(p, q, n) == 0, "token %d differs", id);
    }
}

START_TEST(test_train_deterministic)
{
    /* The same texts, cut into pieces at chunk boundaries and given in two orders, must
    ** give identical tokenizers; so must a second run. */
    size_t len;
    char *c = make_corpus(5, 400000, &len);
    enum { PIECES = 50 };
    const char *fwd[PIECES], *rev[PIECES];
    size_t lf[PIECES], lr[PIECES], at = 0;
    for (int i = 0; i < PIECES; i++) {
        size_t end = i == PIECES - 1 ? len : (size_t)(i + 1) * (len / PIECES);
        while (end < len && end > at && c[end - 1] != '\n') end++; /* "\n" ends a chunk ... */
        while (end < len && c[end] == '\n') end++;                 /* ... and its run */
        fwd[i] = c + at, lf[i] = end - at;
        rev[PIECES - 1 - i] = c + at, lr[PIECES - 1 - i] = end - at;
        at = end;
    }
    ck_assert_uint_eq(at, len);
    prl_tokenizer *a = NULL, *b = NULL, *d = NULL, *whole = NULL;
    assert_ok(prl_tokenizer_train(fwd, lf, PIECES, 2000, &a));
    assert_ok(prl_tokenizer_train(rev, lr, PIECES, 2000, &b));
    assert_ok(prl_tokenizer_train(fwd, lf, PIECES, 2000, &d));
    const char *one[1] = {c};
    assert_ok(prl_tokenizer_train(one, &len, 1, 2000, &whole));
    ck_assert_int_eq(prl_tokenizer_vocab_size(a), 2000);
    assert_same_tokenizer(a, b);
    assert_same_tokenizer(a, d);
    assert_same_tokenizer(a, whole);
    prl_tokenizer_free(a);
    prl_tokenizer_free(b);
    prl_tokenizer_free(d);
    prl_tokenizer_free(whole);
    free(c);
}
END_TEST

START_TEST(test_train_errors)
{
    prl_tokenizer *tok = (prl_tokenizer *)1;
    const char *texts[1] = {"abc"};
    ck_assert_int_eq(prl_tokenizer_train(texts, NULL, 1, 271, &tok), PRL_ERR_ARG);
    assert_msg_has("vocab_size 271");
    ck_assert_ptr_null(tok);
    const char *nulls[2] = {"a", NULL};
    ck_assert_int_eq(prl_tokenizer_train(nulls, NULL, 2, 300, &tok), PRL_ERR_ARG);
    assert_msg_has("texts[1]");
    /* Empty input is fine: the base vocabulary. */
    assert_ok(prl_tokenizer_train(NULL, NULL, 0, 300, &tok));
    ck_assert_int_eq(prl_tokenizer_vocab_size(tok), 272);
    prl_tokenizer_free(tok);
}
END_TEST

/* ---------------------------------------------------------------- chat ------------- */

/* Append the ids of a plain encode to (seq, mask). */
static void append_encoded(const prl_tokenizer *tok, const char *s, unsigned flags, int32_t *seq,
                           uint8_t *mask, size_t *n, uint8_t m)
{
    int32_t *ids;
    size_t k;
    encode_ok(tok, s, strlen(s), flags, &ids, &k);
    for (size_t i = 0; i < k; i++) seq[*n] = ids[i], mask[(*n)++] = m;
    free(ids);
}

static void push(int32_t *seq, uint8_t *mask, size_t *n, int32_t id, uint8_t m)
{
    seq[*n] = id;
    mask[(*n)++] = m;
}

START_TEST(test_chat_mask)
{
    prl_tokenizer *tok = trained(1024);
    const prl_chat_message msgs[] = {{"system", "You are a helpful model."},
                                     {"user", "What is 12+30?"},
                                     {"assistant", "<|think|>12+30=42<|/think|>The answer is 42."},
                                     {"tool", "{\"ok\": true}"},
                                     {"assistant", "Done."}};
    for (int special = 0; special < 2; special++) {
        unsigned flags = special ? PRL_TOKENIZER_SPECIAL : 0;
        for (size_t n_msgs = 0; n_msgs <= 5; n_msgs++) {
            int32_t want[512];
            uint8_t want_mask[512];
            size_t n = 0;
            push(want, want_mask, &n, PRL_TOKEN_BOS, 0);
            for (size_t i = 0; i < n_msgs; i++) {
                int assistant = strcmp(msgs[i].role, "assistant") == 0;
                int32_t role = strcmp(msgs[i].role, "system") == 0 ? PRL_TOKEN_SYSTEM
                               : strcmp(msgs[i].role, "user") == 0 ? PRL_TOKEN_USER
                               : assistant                         ? PRL_TOKEN_ASSISTANT
                                                                   : PRL_TOKEN_TOOL;
                push(want, want_mask, &n, role, 0);
                append_encoded(tok, msgs[i].content, flags, want, want_mask, &n,
                               (uint8_t)assistant);
                push(want, want_mask, &n, PRL_TOKEN_END, (uint8_t)assistant);
            }
            int last_assistant = n_msgs == 3 || n_msgs == 5;
            push(want, want_mask, &n, PRL_TOKEN_EOS, (uint8_t)last_assistant);

            int32_t *ids;
            uint8_t *mask;
            size_t got;
            assert_ok(prl_tokenizer_encode_chat(tok, msgs, n_msgs, flags, &ids, &mask, &got));
            ck_assert_uint_eq(got, n);
            for (size_t i = 0; i < n; i++) {
                ck_assert_msg(ids[i] == want[i], "n_msgs %zu: token %zu is %d, expected %d", n_msgs,
                              i, ids[i], want[i]);
                ck_assert_msg(mask[i] == want_mask[i],
                              "n_msgs %zu: mask %zu is %d, expected "
                              "%d",
                              n_msgs, i, mask[i], want_mask[i]);
            }
            free(ids);
            free(mask);

            /* The prompt variant: same prefix, <|assistant|> instead of <|eos|>. */
            assert_ok(prl_tokenizer_encode_chat_prompt(tok, msgs, n_msgs, flags, &ids, &got));
            ck_assert_uint_eq(got, n);
            ck_assert(memcmp(ids, want, (n - 1) * sizeof *ids) == 0);
            ck_assert_int_eq(ids[n - 1], PRL_TOKEN_ASSISTANT);
            free(ids);
        }
    }
    /* With SPECIAL, <|think|> in assistant content is one masked token. */
    int32_t *ids;
    uint8_t *mask;
    size_t got;
    assert_ok(
        prl_tokenizer_encode_chat(tok, msgs + 2, 1, PRL_TOKENIZER_SPECIAL, &ids, &mask, &got));
    ck_assert(ids[0] == PRL_TOKEN_BOS && ids[1] == PRL_TOKEN_ASSISTANT &&
              ids[2] == PRL_TOKEN_THINK && mask[2] == 1 && mask[1] == 0 && mask[0] == 0);
    ck_assert(ids[got - 2] == PRL_TOKEN_END && mask[got - 2] == 1);
    ck_assert(ids[got - 1] == PRL_TOKEN_EOS && mask[got - 1] == 1);
    free(ids);
    free(mask);
    /* loss_mask may be NULL. */
    assert_ok(prl_tokenizer_encode_chat(tok, msgs, 2, 0, &ids, NULL, &got));
    free(ids);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_chat_errors)
{
    prl_tokenizer *tok = trained(600);
    int32_t *ids = (int32_t *)1;
    uint8_t *mask = (uint8_t *)1;
    size_t n = 9;
    const prl_chat_message bad[] = {{"user", "hi"}, {"bot", "hello"}};
    ck_assert_int_eq(prl_tokenizer_encode_chat(tok, bad, 2, 0, &ids, &mask, &n), PRL_ERR_ARG);
    assert_msg_has("message 1");
    assert_msg_has("\"bot\"");
    ck_assert(ids == NULL && mask == NULL && n == 0);
    ck_assert_int_eq(prl_tokenizer_encode_chat_prompt(tok, bad, 2, 0, &ids, &n), PRL_ERR_ARG);
    assert_msg_has("\"bot\"");
    const prl_chat_message nul[] = {{"assistant", NULL}};
    ck_assert_int_eq(prl_tokenizer_encode_chat(tok, nul, 1, 0, &ids, &mask, &n), PRL_ERR_ARG);
    assert_msg_has("message 0");
    const prl_chat_message norole[] = {{NULL, "x"}};
    ck_assert_int_eq(prl_tokenizer_encode_chat(tok, norole, 1, 0, &ids, &mask, &n), PRL_ERR_ARG);
    assert_msg_has("(null)");
    prl_tokenizer_free(tok);
}
END_TEST

/* ---------------------------------------------------------------- files ------------ */

static char tmpdir[256];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/prl_test_tokenizer_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) { check_remove_tree(tmpdir); }

START_TEST(test_save_load_round_trip)
{
    make_tmpdir();
    prl_tokenizer *tok = trained(2048), *back = NULL;
    char path[300], path2[300];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
    snprintf(path2, sizeof path2, "%s/again.json", tmpdir);
    assert_ok(prl_tokenizer_save(tok, path));
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ck_assert_int_ne(access(tmp, F_OK), 0); /* renamed away */
    assert_ok(prl_tokenizer_load(path, &back));
    assert_same_tokenizer(tok, back);
    size_t len;
    char *c = make_corpus(31, 100000, &len);
    for (unsigned flags = 0; flags < 2; flags++) {
        int32_t *a, *b;
        size_t na, nb;
        encode_ok(tok, c, len, flags, &a, &na);
        encode_ok(back, c, len, flags, &b, &nb);
        ck_assert(ids_equal(a, na, b, nb));
        free(a);
        free(b);
    }
    /* Saving the loaded tokenizer gives the same bytes; the file looks like HF's. */
    assert_ok(prl_tokenizer_save(back, path2));
    size_t l1, l2;
    char *f1 = check_read_file(path, &l1), *f2 = check_read_file(path2, &l2);
    ck_assert(l1 == l2 && memcmp(f1, f2, l1) == 0);
    json_error_t err;
    json_t *root = json_loads(f1, 0, &err);
    ck_assert_ptr_nonnull(root);
    json_t *model = json_object_get(root, "model");
    ck_assert_str_eq(json_string_value(json_object_get(model, "type")), "BPE");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(model, "vocab"), "Ġ")),
                     16 + ' '); /* GPT-2 byte-to-unicode: ' ' is U+0120 */
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(model, "vocab"), "a")),
                     16 + 'a');
    ck_assert_uint_eq(json_object_size(json_object_get(model, "vocab")), 2048 - 16);
    ck_assert_uint_eq(json_array_size(json_object_get(model, "merges")),
                      prl_tokenizer_n_merges(tok));
    ck_assert_uint_eq(json_array_size(json_object_get(root, "added_tokens")), 16);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(root, "prl"), "format_version")), 1);
    json_decref(root);
    free(f1);
    free(f2);
    free(c);
    prl_tokenizer_free(tok);
    prl_tokenizer_free(back);
    /* The base tokenizer (no merges) round-trips too. */
    assert_ok(prl_tokenizer_init_bytes(&tok));
    assert_ok(prl_tokenizer_save(tok, path));
    assert_ok(prl_tokenizer_load(path, &back));
    assert_same_tokenizer(tok, back);
    prl_tokenizer_free(tok);
    prl_tokenizer_free(back);
    remove_tmpdir();
}
END_TEST

START_TEST(test_save_errors)
{
    prl_tokenizer *tok = NULL;
    assert_ok(prl_tokenizer_init_bytes(&tok));
    ck_assert_int_eq(prl_tokenizer_save(tok, "/nonexistent_dir_prl/tokenizer.json"), PRL_ERR_IO);
    assert_msg_has("/nonexistent_dir_prl/tokenizer.json.tmp");
    ck_assert_int_eq(prl_tokenizer_save(NULL, "x.json"), PRL_ERR_ARG);
    prl_tokenizer_free(tok);
}
END_TEST

/* The hand example saved as JSON, to be corrupted by each case. */
static json_t *hand_json(void)
{
    prl_tokenizer *tok = train_hand_example(1000);
    char path[300];
    snprintf(path, sizeof path, "%s/hand.json", tmpdir);
    assert_ok(prl_tokenizer_save(tok, path));
    prl_tokenizer_free(tok);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    ck_assert_ptr_nonnull(root);
    return root;
}

/* Write text to case.json and expect load to fail with `code` and a message holding the path
** and both needles. */
static void expect_load_fail_text(const char *text, prl_status code, const char *n1, const char *n2)
{
    char path[300];
    snprintf(path, sizeof path, "%s/case.json", tmpdir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    prl_tokenizer *tok = (prl_tokenizer *)1;
    prl_status rc = prl_tokenizer_load(path, &tok);
    ck_assert_msg(rc == code, "expected %s for \"%s\", got %s (%s)", prl_status_name(code), n1,
                  prl_status_name(rc), prl_error_message());
    ck_assert_ptr_null(tok);
    assert_msg_has(path);
    if (n1) assert_msg_has(n1);
    if (n2) assert_msg_has(n2);
}

static void expect_load_fail(json_t *root, const char *n1, const char *n2)
{
    char *text = json_dumps(root, 0);
    expect_load_fail_text(text, PRL_ERR_FORMAT, n1, n2);
    free(text);
    json_decref(root);
}

static json_t *vocab_of(json_t *root)
{
    return json_object_get(json_object_get(root, "model"), "vocab");
}

static json_t *merges_of(json_t *root)
{
    return json_object_get(json_object_get(root, "model"), "merges");
}

/* The byte-level tokenizer saved at `path` and read back as JSON (to add merges by hand). */
static json_t *bytes_json(const char *path)
{
    prl_tokenizer *base = NULL;
    assert_ok(prl_tokenizer_init_bytes(&base));
    assert_ok(prl_tokenizer_save(base, path));
    prl_tokenizer_free(base);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    ck_assert_ptr_nonnull(root);
    return root;
}

/* Write `root` (released) to `path` and load it: the load must succeed. */
static prl_tokenizer *load_json(json_t *root, const char *path)
{
    ck_assert_int_eq(json_dump_file(root, path, 0), 0);
    json_decref(root);
    prl_tokenizer *tok = NULL;
    assert_ok(prl_tokenizer_load(path, &tok));
    return tok;
}

START_TEST(test_load_rejects_corrupt_files)
{
    make_tmpdir();
    json_t *r;

    /* The unmodified file loads. */
    r = hand_json();
    char path[300], *text = json_dumps(r, 0);
    snprintf(path, sizeof path, "%s/good.json", tmpdir);
    prl_tokenizer *tok = load_json(r, path);
    ck_assert_int_eq(prl_tokenizer_vocab_size(tok), 279);
    prl_tokenizer_free(tok);

    /* Not JSON / truncated / missing file. */
    text[strlen(text) / 2] = '\0';
    expect_load_fail_text(text, PRL_ERR_FORMAT, "line 1", NULL);
    free(text);
    expect_load_fail_text("[1, 2]", PRL_ERR_FORMAT, "top level", NULL);
    ck_assert_int_eq(prl_tokenizer_load("/nonexistent_prl/tokenizer.json", &tok), PRL_ERR_IO);
    assert_msg_has("/nonexistent_prl/tokenizer.json");

    /* prl object and format version. (A file without the "prl" object is imported as a
    ** Hugging Face tokenizer.json: test_tokenizer_hf.c.) */
    r = hand_json();
    json_object_set_new(json_object_get(r, "prl"), "format_version", json_integer(2));
    expect_load_fail(r, "format_version is 2", "newer");
    r = hand_json();
    json_object_set_new(json_object_get(r, "prl"), "format_version", json_string("1"));
    expect_load_fail(r, "format_version", "not an integer");
    r = hand_json();
    json_object_set_new(json_object_get(r, "prl"), "split_digits", json_false());
    expect_load_fail(r, "split_digits", NULL);
    r = hand_json();
    json_object_set_new(json_object_get(r, "prl"), "vocab_size", json_integer(280));
    expect_load_fail(r, "vocab_size", "279");

    /* Special tokens. */
    r = hand_json();
    json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 3), "content",
                        json_string("<|sys|>"));
    expect_load_fail(r, "\"<|sys|>\"", "\"<|system|>\"");
    r = hand_json();
    json_array_remove(json_object_get(r, "added_tokens"), 7);
    expect_load_fail(r, "special id 7", "<|end|>");
    r = hand_json();
    json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 2), "id",
                        json_integer(1));
    expect_load_fail(r, "duplicate id 1", NULL);

    /* Model type and vocabulary. */
    r = hand_json();
    json_object_set_new(json_object_get(r, "model"), "type", json_string("WordPiece"));
    expect_load_fail(r, "model.type", "BPE");
    r = hand_json();
    json_object_set_new(vocab_of(r), "ug", json_integer(275)); /* "pun" has 275 */
    expect_load_fail(r, "duplicate id 275", "\"ug\"");
    r = hand_json();
    json_object_set_new(vocab_of(r), "bun", json_integer(300)); /* 278 becomes a hole */
    expect_load_fail(r, "no token with id 278", "\"bun\" has id 300");
    r = hand_json();
    json_object_set_new(vocab_of(r), "pug", json_string("276"));
    expect_load_fail(r, "\"pug\"", "not an integer");
    r = hand_json();
    json_object_set_new(vocab_of(r), "a", json_integer(16 + 'b'));
    json_object_set_new(vocab_of(r), "b", json_integer(16 + 'a'));
    expect_load_fail(r, "must be the single byte", NULL);
    r = hand_json();
    json_object_set_new(vocab_of(r), "zz", json_integer(279)); /* no merge creates it */
    expect_load_fail(r, "id 279 is not created by any merge", NULL);
    r = hand_json();
    json_object_set_new(vocab_of(r), "ug", json_integer(273)); /* swap ug <-> un */
    json_object_set_new(vocab_of(r), "un", json_integer(272));
    expect_load_fail(r, "merges[0] creates id 273", "next new id is 272");
    r = hand_json();
    json_object_set_new(vocab_of(r), "x\xc3\xbf\xc3\xbf", json_integer(279)); /* not ASCII */
    json_object_del(vocab_of(r), "x\xc3\xbf\xc3\xbf");
    json_object_set_new(vocab_of(r), "\xe2\x82\xac\xe2\x82\xac", json_integer(279)); /* € */
    expect_load_fail(r, "not a byte-level token string", "id 279");

    /* Merges. */
    r = hand_json();
    json_array_append_new(merges_of(r), json_string("zz q"));
    expect_load_fail(r, "merges[7]", "unknown token \"zz\"");
    r = hand_json();
    json_array_append_new(merges_of(r), json_string("hug s x"));
    expect_load_fail(r, "merges[7]", "left right");
    r = hand_json();
    json_array_append_new(merges_of(r), json_integer(5));
    expect_load_fail(r, "merges[7]", NULL);
    r = hand_json();
    json_array_append_new(merges_of(r), json_string("h u"));
    expect_load_fail(r, "merges[7]", "not in model.vocab");
    r = hand_json();
    json_array_append_new(merges_of(r), json_string("u g"));
    expect_load_fail(r, "merges[7]", "duplicate merge");
    r = hand_json();
    { /* swap merges 0 and 2: "h ug" now comes before "u g" creates "ug" */
        json_t *m = merges_of(r), *m0 = json_incref(json_array_get(m, 0));
        json_array_set(m, 0, json_array_get(m, 2));
        json_array_set_new(m, 2, m0);
    }
    expect_load_fail(r, "merges[0] uses token id 272", "before the merge that creates it");
    r = hand_json();
    json_array_remove(merges_of(r), 6);
    expect_load_fail(r, "id 278 is not created by any merge", NULL);

    /* A merge whose result already exists reuses that id (as Hugging Face does): "h u" makes
    ** hu = 279, then "hu g" spells "hug", which is 274. */
    r = hand_json();
    json_object_set_new(vocab_of(r), "hu", json_integer(279));
    json_array_append_new(merges_of(r), json_string("h u"));
    json_array_append_new(merges_of(r), json_string("hu g"));
    json_object_set_new(json_object_get(r, "prl"), "vocab_size", json_integer(280));
    tok = load_json(r, path);
    ck_assert_int_eq(prl_tokenizer_vocab_size(tok), 280);
    ck_assert_uint_eq(prl_tokenizer_n_merges(tok), 9);
    int32_t ml, mr, mres;
    assert_ok(prl_tokenizer_merge(tok, 8, &ml, &mr, &mres));
    ck_assert(ml == 279 && mr == 16 + 'g' && mres == 274);
    prl_tokenizer_free(tok);

    /* Duplicate keys are caught by the parser. */
    expect_load_fail_text("{\"prl\": {}, \"prl\": {}}", PRL_ERR_FORMAT, "duplicate", NULL);

    /* The [left, right] merge form of newer HF files is accepted. */
    r = hand_json();
    json_array_set_new(merges_of(r), 0, json_pack("[ss]", "u", "g"));
    tok = load_json(r, path);
    prl_tokenizer_free(tok);
    remove_tmpdir();
}
END_TEST

/* ---------------------------------------------------------------- parallel --------- */

/* Inputs built from segments that stress window edges: long digit, letter, space and
** punctuation runs, multi-byte UTF-8, special strings, random bytes and corpus text. */
static size_t make_varied(prl_rng *r, uint8_t *t, size_t target, const char *corpus,
                          size_t corpus_len)
{
    size_t n = 0;
    static const char *const utf8[] = {"é", "日本", "€", "😀", "данные", "\xc3", "\xa9"};
    static const char *const specials[] = {
        "<|user|>", "<|end|>", "<|/tool_call|>", "<|reserved_3|>", "<|", "|>", "<|think"};
    while (n < target) {
        size_t room = target - n, k = 1 + rnd(r, rnd(r, 4) == 0 ? 3000 : 40);
        if (k > room) k = room;
        switch (rnd(r, 9)) {
        case 0:
            for (size_t i = 0; i < k; i++) t[n++] = (uint8_t)('0' + rnd(r, 10));
            break;
        case 1:
            for (size_t i = 0; i < k; i++) t[n++] = (uint8_t)("aab"[rnd(r, 3)]);
            break;
        case 2:
            for (size_t i = 0; i < k; i++) t[n++] = (uint8_t)(" \n\t "[rnd(r, 4)]);
            break;
        case 3:
            for (size_t i = 0; i < k; i++) t[n++] = (uint8_t)(".,!-"[rnd(r, 4)]);
            break;
        case 4: {
            const char *u = utf8[rnd(r, 7)];
            for (size_t i = 0; i < k && n + strlen(u) <= target; i++, n += strlen(u))
                memcpy(t + n, u, strlen(u));
            break;
        }
        case 5: {
            const char *s = specials[rnd(r, 7)];
            if (strlen(s) <= room) memcpy(t + n, s, strlen(s)), n += strlen(s);
            else t[n++] = '<';
            break;
        }
        case 6:
            for (size_t i = 0; i < k; i++) t[n++] = (uint8_t)rnd(r, 256);
            break;
        case 7: t[n++] = ' '; break;
        default: {
            size_t at = rnd(r, corpus_len - 4000);
            k = k * 20 > room ? room : k * 20;
            if (k > 4000) k = 4000;
            memcpy(t + n, corpus + at, k);
            n += k;
        }
        }
    }
    return n;
}

START_TEST(test_parallel_equals_serial)
{
    prl_tokenizer *tok = trained(1500);
    size_t corpus_len;
    char *corpus = make_corpus(3, 200000, &corpus_len);
    prl_rng r;
    prl_rng_init(&r, 13, 0, 0, 0, PRL_RNG_TEST);
    enum { MAX_LEN = 200000, N_INPUTS = 220 };
    uint8_t *t = malloc(MAX_LEN);
    size_t total_grows = 0, total_windows = 0, total_bytes = 0;
    static const size_t chunks[] = {17, 40, 64, 100, 333, 1000, 4096, 0};
    static const size_t overlaps[] = {1, 8, 33, 100, 256, 0};
    for (int iter = 0; iter < N_INPUTS; iter++) {
        /* lengths from a few bytes to 200 KB, log-uniform-ish */
        size_t target = iter < 3 ? (size_t)iter * 7 : 1 + rnd(&r, (size_t)1 << (4 + iter % 14));
        if (target > MAX_LEN) target = MAX_LEN;
        if (iter % 20 == 19) target = MAX_LEN;
        size_t n = make_varied(&r, t, target, corpus, corpus_len);
        total_bytes += n;
        unsigned flags = rnd(&r, 2) ? PRL_TOKENIZER_SPECIAL : 0;
        int32_t *serial;
        size_t ns;
        encode_ok(tok, t, n, flags, &serial, &ns);
        for (int threads = 1; threads <= 4; threads++) {
            prl_tokenizer_parallel_opts o = {threads, chunks[rnd(&r, 8)], overlaps[rnd(&r, 6)]};
            if (n > 20000 && o.chunk_bytes && o.chunk_bytes < 333) o.chunk_bytes = 333;
            int32_t *par;
            size_t np;
            prl_tokenizer_parallel_stats st;
            prl_status rc = prl_tokenizer_encode_parallel(tok, t, n, flags, &o, &par, &np, &st);
            ck_assert_msg(rc == PRL_OK, "%s", prl_error_message());
            ck_assert_ptr_nonnull(par);
            if (!ids_equal(serial, ns, par, np)) {
                size_t i = 0;
                while (i < ns && i < np && serial[i] == par[i]) i++;
                ck_abort_msg("input %d (%zu bytes, flags %u, %d threads, chunk %zu, overlap "
                             "%zu): tokens differ from index %zu (serial %zu, parallel %zu)",
                             iter, n, flags, threads, o.chunk_bytes, o.overlap_bytes, i, ns, np);
            }
            total_grows += st.n_grows;
            total_windows += st.n_windows;
            free(par);
        }
        free(serial);
    }
    /* The inputs must have exercised both the joins and the growth path. */
    ck_assert_uint_gt(total_windows, 10000);
    ck_assert_uint_gt(total_grows, 100);
    ck_assert_uint_gt(total_bytes, 3000000);
    free(t);
    free(corpus);
    prl_tokenizer_free(tok);
}
END_TEST

/* A tokenizer whose merges read right to left: "a b" -> ab, "a ab" -> aab, ... up to
** a^k b (and no "a a"), so in a long run a^n b the serial encoding is n - k single a's and
** one a^k b token. A window that starts inside the last k a's sees a shorter a^j b and single
** a's before it: it shares token boundaries with its left neighbour at places where the
** serial encoding has none. Joining at mere token agreements would go wrong here; joining
** at chunk starts (and growing) must not. */
static prl_tokenizer *right_to_left_tokenizer(int k)
{
    make_tmpdir();
    char path[300];
    snprintf(path, sizeof path, "%s/rtl.json", tmpdir);
    json_t *root = bytes_json(path);
    json_t *vocab = vocab_of(root), *merges = merges_of(root);
    char *prev = strdup("b"), *cur = malloc((size_t)k + 2);
    for (int j = 1; j <= k; j++) {
        memset(cur, 'a', (size_t)j);
        cur[j] = 'b', cur[j + 1] = '\0';
        json_object_set_new(vocab, cur, json_integer(271 + j));
        char m[2 + 1024 + 2];
        snprintf(m, sizeof m, "a %s", prev);
        json_array_append_new(merges, json_string(m));
        free(prev);
        prev = strdup(cur);
    }
    free(prev);
    free(cur);
    json_object_set_new(json_object_get(root, "prl"), "vocab_size", json_integer(272 + k));
    prl_tokenizer *tok = load_json(root, path);
    remove_tmpdir();
    return tok;
}

/* Doubling merges a+a, aa+aa, ... up to a^1024: tokens much longer than all the base
** tokens together, merged with themselves (the loader's scratch must fit left + right). */
START_TEST(test_load_long_self_merges)
{
    make_tmpdir();
    char path[300];
    snprintf(path, sizeof path, "%s/double.json", tmpdir);
    json_t *root = bytes_json(path);
    char half[1025], full[2051];
    for (int j = 1; j <= 10; j++) {
        size_t h = (size_t)1 << (j - 1);
        memset(half, 'a', h);
        half[h] = '\0';
        memset(full, 'a', 2 * h);
        full[2 * h] = '\0';
        json_object_set_new(vocab_of(root), full, json_integer(271 + j));
        snprintf(full, sizeof full, "%s %s", half, half);
        json_array_append_new(merges_of(root), json_string(full));
    }
    json_object_set_new(json_object_get(root, "prl"), "vocab_size", json_integer(282));
    prl_tokenizer *tok = load_json(root, path);
    /* a^1024 + a^1024 is not in the vocab: rejected (and the check must not overrun). */
    json_error_t err;
    root = json_load_file(path, 0, &err);
    ck_assert_ptr_nonnull(root);
    memset(full, 'a', 1024);
    full[1024] = ' ';
    memset(full + 1025, 'a', 1024);
    full[2049] = '\0';
    json_array_append_new(merges_of(root), json_string(full));
    char *text = json_dumps(root, 0);
    json_decref(root);
    expect_load_fail_text(text, PRL_ERR_FORMAT, "merges[10]", "not in model.vocab");
    free(text);
    remove_tmpdir();
    char run[3000];
    memset(run, 'a', sizeof run);
    int32_t *ids, *par;
    size_t n, np;
    encode_ok(tok, run, 1024, 0, &ids, &n);
    ck_assert(n == 1 && ids[0] == 281);
    free(ids);
    encode_ok(tok, run, sizeof run, 0, &ids, &n); /* 3000 = 2 * 1024 + 512+256+128+32+16+8 */
    ck_assert_uint_eq(n, 8);
    ck_assert(ids[0] == 281 && ids[1] == 281 && ids[2] == 280 && ids[7] == 274);
    prl_tokenizer_parallel_opts o = {2, 100, 20};
    assert_ok(prl_tokenizer_encode_parallel(tok, run, sizeof run, 0, &o, &par, &np, NULL));
    ck_assert(ids_equal(ids, n, par, np));
    free(ids);
    free(par);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_parallel_right_to_left_merges)
{
    enum { K = 600 };
    prl_tokenizer *tok = right_to_left_tokenizer(K);
    ck_assert_int_eq(prl_tokenizer_vocab_size(tok), 272 + K);
    prl_rng r;
    prl_rng_init(&r, 21, 0, 0, 0, PRL_RNG_TEST);
    char *t = malloc(100000);
    for (int iter = 0; iter < 30; iter++) {
        size_t n = 0;
        while (n < 90000) { /* runs a^m b with m around K, separated by spaces */
            size_t m = 1 + rnd(&r, 2 * K);
            memset(t + n, 'a', m);
            n += m;
            t[n++] = 'b';
            t[n++] = ' ';
        }
        int32_t *serial, *par;
        size_t ns, np;
        encode_ok(tok, t, n, 0, &serial, &ns);
        prl_tokenizer_parallel_opts o = {1 + iter % 4, 50 + rnd(&r, 300), 8 + rnd(&r, 200)};
        assert_ok(prl_tokenizer_encode_parallel(tok, t, n, 0, &o, &par, &np, NULL));
        ck_assert_msg(ids_equal(serial, ns, par, np), "iter %d: parallel != serial", iter);
        free(serial);
        free(par);
    }
    /* The serial encoding itself: a^700 b is 100 a's then one a^600 b token. */
    memset(t, 'a', 700);
    t[700] = 'b';
    int32_t *ids;
    size_t n;
    encode_ok(tok, t, 701, 0, &ids, &n);
    ck_assert_uint_eq(n, 101);
    ck_assert_int_eq(ids[100], 271 + K);
    free(ids);
    free(t);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_parallel_defaults_and_errors)
{
    prl_tokenizer *tok = trained(1024);
    size_t len;
    char *c = make_corpus(17, 600000, &len);
    int32_t *a, *b;
    size_t na, nb;
    prl_tokenizer_parallel_stats st;
    encode_ok(tok, c, len, 0, &a, &na);
    assert_ok(prl_tokenizer_encode_parallel(tok, c, len, 0, NULL, &b, &nb, &st));
    ck_assert(ids_equal(a, na, b, nb));
    size_t chunk = len / 8 > 65536 ? len / 8 : 65536; /* default: max(64 KiB, len / 4T) */
    ck_assert_uint_eq(st.n_windows, (len + chunk - 1) / chunk);
    free(b);
    /* The window edges of a few thousand windows all join without growing: prose has a
    ** chunk boundary in every 256-byte overlap. */
    prl_tokenizer_parallel_opts o = {3, 200, 0};
    assert_ok(prl_tokenizer_encode_parallel(tok, c, len, 0, &o, &b, &nb, &st));
    ck_assert(ids_equal(a, na, b, nb));
    ck_assert_uint_eq(st.n_grows, 0);
    free(b);
    /* A single huge chunk forces growth and still matches. */
    memset(c, 'a', len);
    free(a);
    encode_ok(tok, c, len, 0, &a, &na);
    o = (prl_tokenizer_parallel_opts){4, 10000, 64};
    assert_ok(prl_tokenizer_encode_parallel(tok, c, len, 0, &o, &b, &nb, &st));
    ck_assert(ids_equal(a, na, b, nb));
    ck_assert_uint_gt(st.n_grows, 0);
    ck_assert_uint_le(st.bytes_reencoded, 3 * len);
    free(b);
    free(a);
    /* Empty text, bad options. */
    assert_ok(prl_tokenizer_encode_parallel(tok, "", 0, 0, NULL, &b, &nb, NULL));
    ck_assert_uint_eq(nb, 0);
    ck_assert_ptr_nonnull(b);
    free(b);
    o.n_threads = 0;
    ck_assert_int_eq(prl_tokenizer_encode_parallel(tok, c, len, 0, &o, &b, &nb, NULL), PRL_ERR_ARG);
    assert_msg_has("n_threads 0");
    ck_assert_ptr_null(b);
    free(c);
    prl_tokenizer_free(tok);
}
END_TEST

/* ---------------------------------------------------------------- suite ------------ */

/* prl_utf8_view: valid text unchanged; each byte that does not start a valid sequence (a
** stray continuation, an overlong C0 80, a surrogate ED A0 80, a sequence cut short at the end)
** becomes U+FFFD, and the count says how many. */
START_TEST(test_utf8_view)
{
    static const struct {
        const char *in;
        size_t n;
        const char *out;
        long replaced;
    } cases[] = {
        {"plain ascii", 11, "plain ascii", 0},
        {"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 14,
         "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 0},
        {"a\x80"
         "b",
         3,
         "a\xEF\xBF\xBD"
         "b",
         1},
        {"\xC0\x80", 2, "\xEF\xBF\xBD\xEF\xBF\xBD", 2},
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 3},
        {"ok\xE2\x82", 4, "ok\xEF\xBF\xBD\xEF\xBF\xBD", 2},
        {"", 0, "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        size_t len = 99;
        long r = prl_utf8_view(cases[i].in, cases[i].n, &out, &len);
        ck_assert_msg(r == cases[i].replaced, "case %zu: %ld replacements", i, r);
        ck_assert_uint_eq(len, strlen(cases[i].out));
        ck_assert_str_eq(out, cases[i].out);
        free(out);
    }
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_layout);
    tcase_add_test(tc, test_pretokenize_examples);
    tcase_add_test(tc, test_pretokenize_reference);
    tcase_add_test(tc, test_round_trip_random_bytes);
    tcase_add_test(tc, test_fast_matches_naive);
    tcase_add_test(tc, test_digits_never_merge);
    tcase_add_test(tc, test_special_tokens);
    tcase_add_test(tc, test_decode_invalid_ids);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    tc = tcase_create("train");
    tcase_add_test(tc, test_train_hand_example);
    tcase_add_test(tc, test_train_deterministic);
    tcase_add_test(tc, test_train_errors);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    tc = tcase_create("chat");
    tcase_add_test(tc, test_chat_mask);
    tcase_add_test(tc, test_chat_errors);
    suite_add_tcase(s, tc);

    tc = tcase_create("files");
    tcase_add_test(tc, test_save_load_round_trip);
    tcase_add_test(tc, test_save_errors);
    tcase_add_test(tc, test_load_rejects_corrupt_files);
    tcase_add_test(tc, test_load_long_self_merges);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    tc = tcase_create("parallel");
    tcase_add_test(tc, test_parallel_equals_serial);
    tcase_add_test(tc, test_parallel_right_to_left_merges);
    tcase_add_test(tc, test_parallel_defaults_and_errors);
    tcase_add_test(tc, test_utf8_view);
    tcase_set_timeout(tc, 600);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(tokenizer_suite()); }
