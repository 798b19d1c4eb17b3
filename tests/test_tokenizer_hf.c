/*
** test_tokenizer_hf.c — Check tests for imported Hugging Face tokenizers (engine/tokenizer_hf*.c)
** on small tokenizer.json files built here, each case with ids worked out by hand: prl's own
** file without its "prl" object imports and encodes identically; every Split behavior and
** invert; added tokens (special or not, lstrip/rstrip, single_word, normalized); NFKC;
** byte_fallback, unk and fuse_unk; Metaspace; the post-processor's bos; unsupported constructs
** named in the error; invalid UTF-8; the three chat templates (ids, loss mask, roles, turns)
** and an unknown one; save writing the original files back; prl's roles.
** Real tokenizer.json files against Hugging Face's tokenizers.js: test_hf_tokenizers.sh.
*/
#include "engine/engine.h"
#include "tests/check_util.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- fixtures --------- */

static char tmpdir[256];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/prl_test_tokenizer_hf_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void) { check_remove_tree(tmpdir); }

/* GPT-2's byte-level character of byte b, as UTF-8 in out (written independently of the
** engine: printable Latin-1 stands for itself, the other 68 bytes for U+0100.. in order). */
static void bl_char(int b, char out[3])
{
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int cp = b, k = 0;
    if (!printable) {
        for (int x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
}

/* A byte-level BPE tokenizer.json: byte b is id b, then `words` (byte-level strings) as ids
** 256.., no merges unless given; pre_tokenizer, normalizer and added tokens from the caller
** (stolen; NULL = null / none). ignore_merges lets a word of the vocabulary be one token, so
** a test sees the pre-tokenizer's words directly. */
static json_t *byte_level_json(const char *const *words, json_t *pre, json_t *norm, json_t *added,
                               json_t *merges)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[3];
        bl_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    for (int i = 0; words && words[i]; i++)
        json_object_set_new(vocab, words[i], json_integer(256 + i));
    json_t *seq = json_pack("{s:s, s:[]}", "type", "Sequence", "pretokenizers");
    if (pre) json_array_append_new(json_object_get(seq, "pretokenizers"), pre);
    json_array_append_new(json_object_get(seq, "pretokenizers"),
                          json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                                    0, "trim_offsets", 0, "use_regex", 0));
    return json_pack("{s:s, s:o, s:o, s:o, s:n, s:{s:s}, s:{s:s, s:n, s:b, s:b, s:o, s:o}}",
                     "version", "1.0", "added_tokens", added ? added : json_array(), "normalizer",
                     norm ? norm : json_null(), "pre_tokenizer", seq, "post_processor", "decoder",
                     "type", "ByteLevel", "model", "type", "BPE", "unk_token", "byte_fallback", 0,
                     "ignore_merges", 1, "vocab", vocab, "merges", merges ? merges : json_array());
}

static json_t *added_token(int id, const char *content, int special)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                     special);
}

/* Write root (stolen) as DIR/tokenizer.json (DIR = tmpdir/sub), config (stolen, may be NULL)
** as DIR/tokenizer_config.json; the tokenizer.json path in path. */
static void write_files(const char *sub, json_t *root, json_t *config, char *path, size_t cap)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    mkdir(dir, 0755);
    snprintf(path, cap, "%s/tokenizer.json", dir);
    ck_assert_int_eq(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
    if (config) {
        char cp[340];
        snprintf(cp, sizeof cp, "%s/tokenizer_config.json", dir);
        ck_assert_int_eq(json_dump_file(config, cp, 0), 0);
        json_decref(config);
    }
}

static prl_tokenizer *load(const char *sub, json_t *root, json_t *config)
{
    char path[320];
    write_files(sub, root, config, path, sizeof path);
    prl_tokenizer *tok = NULL;
    assert_ok(prl_tokenizer_load(path, &tok));
    ck_assert(prl_tokenizer_is_imported(tok));
    return tok;
}

/* Encoding text gives exactly want[0..n) (terminated by -1). */
static void expect_ids(const prl_tokenizer *tok, const char *text, unsigned flags,
                       const int32_t *want)
{
    int32_t *ids = NULL;
    size_t n = 0, k = 0;
    assert_ok(prl_tokenizer_encode(tok, text, strlen(text), flags, &ids, &n));
    while (want[k] >= 0) k++;
    char got[512] = "";
    for (size_t i = 0; i < n && strlen(got) < 480; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), " %d", ids[i]);
    ck_assert_msg(n == k, "\"%s\": %zu ids (%s), want %zu", text, n, got, k);
    for (size_t i = 0; i < k; i++)
        ck_assert_msg(ids[i] == want[i], "\"%s\": id %zu is %d, want %d (%s)", text, i, ids[i],
                      want[i], got);
    free(ids);
}

/* decode(encode(text)) == text. */
static void expect_round_trip(const prl_tokenizer *tok, const char *text, unsigned flags)
{
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    char *back = NULL;
    assert_ok(prl_tokenizer_encode(tok, text, strlen(text), flags, &ids, &n));
    assert_ok(prl_tokenizer_decode(tok, ids, n, 0, &back, &len));
    ck_assert_str_eq(back, text);
    free(ids);
    free(back);
}

static void expect_load_error(const char *sub, json_t *root, json_t *config, const char *needle)
{
    char path[320];
    write_files(sub, root, config, path, sizeof path);
    prl_tokenizer *tok = (prl_tokenizer *)1;
    ck_assert_int_eq(prl_tokenizer_load(path, &tok), PRL_ERR_FORMAT);
    ck_assert_ptr_null(tok);
    assert_msg_has(path);
    assert_msg_has(needle);
}

/* ---------------------------------------------------------------- cases ------------ */

/* prl's own tokenizer.json is shaped as Hugging Face's: without its "prl" object it is imported
** (Split regex by PCRE2, byte-level BPE) and must encode exactly as prl's rule does. */
START_TEST(test_prl_file_imports_identically)
{
    const char *texts[] = {"the model merges the token, the tokens merged 12345 times!\n\n"
                           "  café naïve über Straße 日本語 данные  \t x = y + 1;"};
    size_t lens[] = {strlen(texts[0])};
    prl_tokenizer *own = NULL, *imp = NULL;
    assert_ok(prl_tokenizer_train(texts, lens, 1, 330, &own));
    char path[320];
    snprintf(path, sizeof path, "%s/own.json", tmpdir);
    assert_ok(prl_tokenizer_save(own, path));
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    ck_assert_ptr_nonnull(root);
    json_object_del(root, "prl");
    imp = load("imported", root, NULL);
    ck_assert_int_eq(prl_tokenizer_vocab_size(imp), prl_tokenizer_vocab_size(own));
    const char *probe = "The models merge tokens: 2024-12-02, <|user|> café  \n\n\tü 日本 <|end|>x";
    for (unsigned flags = 0; flags <= PRL_TOKENIZER_SPECIAL; flags += PRL_TOKENIZER_SPECIAL) {
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        assert_ok(prl_tokenizer_encode(own, probe, strlen(probe), flags, &a, &na));
        assert_ok(prl_tokenizer_encode(imp, probe, strlen(probe), flags, &b, &nb));
        ck_assert_uint_eq(na, nb);
        ck_assert_int_eq(memcmp(a, b, na * sizeof *a), 0);
        free(a), free(b);
        expect_round_trip(imp, probe, flags);
    }
    ck_assert_int_eq(prl_tokenizer_token_id(imp, "<|user|>"), PRL_TOKEN_USER);
    prl_tokenizer_free(own);
    prl_tokenizer_free(imp);
}
END_TEST

/* "ab12cd34" split on [0-9]+ (or [0-9]) by each behavior; words 256.. are ab, cd, 12, 34,
** ab12, 12cd, cd34, 1, 2 (single digits are bytes '1' = 49, '2' = 50). */
static prl_tokenizer *split_tokenizer(const char *sub, const char *re, const char *behavior,
                                      int invert)
{
    static const char *const words[] = {"ab", "cd", "12", "34", "ab12", "12cd", "cd34", NULL};
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", re,
                              "behavior", behavior, "invert", invert);
    return load(sub, byte_level_json(words, split, NULL, NULL, NULL), NULL);
}

START_TEST(test_split_behaviors)
{
    enum { AB = 256, CD, N12, N34, AB12, N12CD, CD34 };
    static const struct {
        const char *re, *behavior;
        int invert;
        int32_t want[8];
    } cases[] = {
        {"[0-9]+", "Isolated", 0, {AB, N12, CD, N34, -1}},
        {"[0-9]+", "Removed", 0, {AB, CD, -1}},
        {"[0-9]+", "Removed", 1, {N12, N34, -1}},
        {"[0-9]+", "MergedWithPrevious", 0, {AB12, CD34, -1}},
        {"[0-9]+", "MergedWithNext", 0, {AB, N12CD, N34, -1}},
        {"[0-9]", "Isolated", 0, {AB, '1', '2', CD, '3', '4', -1}},
        {"[0-9]", "Contiguous", 0, {AB, N12, CD, N34, -1}},
        {"[a-z]+", "MergedWithNext", 1, {AB, N12CD, N34, -1}}, /* digits are the matches now */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sub[32];
        snprintf(sub, sizeof sub, "split%zu", i);
        prl_tokenizer *tok = split_tokenizer(sub, cases[i].re, cases[i].behavior, cases[i].invert);
        expect_ids(tok, "ab12cd34", 0, cases[i].want);
        prl_tokenizer_free(tok);
    }
    /* a String pattern is literal (Gemma's Split on " "): "1." matches only itself */
    static const char *const words[] = {"ab", "cd", "12", "34", "ab12", "12cd", "cd34", NULL};
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String",
                              "1.", "behavior", "MergedWithPrevious", "invert", 0);
    prl_tokenizer *tok =
        load("split_string", byte_level_json(words, split, NULL, NULL, NULL), NULL);
    expect_ids(tok, "ab1.cd34", 0, (const int32_t[]){'a', 'b', '1', '.', CD34, -1});
    expect_ids(tok, "ab12", 0, (const int32_t[]){AB12, -1});
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_added_tokens)
{
    static const char *const words[] = {"ab", NULL};
    json_t *added = json_array();
    json_array_append_new(added, added_token(300, "<|x|>", 1));
    json_array_append_new(added, added_token(301, "<|x|>y", 0)); /* longest wins */
    json_t *strip = added_token(302, "[S]", 0);
    json_object_set_new(strip, "lstrip", json_true());
    json_object_set_new(strip, "rstrip", json_true());
    json_array_append_new(added, strip);
    json_t *word = added_token(303, "zz", 0);
    json_object_set_new(word, "single_word", json_true());
    json_array_append_new(added, word);
    prl_tokenizer *tok =
        load("added", byte_level_json(words, NULL, NULL, added, json_pack("[s]", "a b")), NULL);
    ck_assert_int_eq(prl_tokenizer_vocab_size(tok), 304);
    /* special tokens only with PRL_TOKENIZER_SPECIAL; non-special always */
    expect_ids(tok, "ab<|x|>ab", PRL_TOKENIZER_SPECIAL, (const int32_t[]){256, 300, 256, -1});
    expect_ids(tok, "<|x|>", 0, (const int32_t[]){'<', '|', 'x', '|', '>', -1});
    expect_ids(tok, "<|x|>yab", 0, (const int32_t[]){301, 256, -1});
    /* lstrip/rstrip take the spaces around the token */
    expect_ids(tok, "ab  [S]  ab", 0, (const int32_t[]){256, 302, 256, -1});
    /* single_word: not inside a word */
    expect_ids(tok, "ab zz ab", 0, (const int32_t[]){256, ' ', 303, ' ', 256, -1});
    expect_ids(tok, "abzz", 0, (const int32_t[]){256, 'z', 'z', -1});
    ck_assert_int_eq(prl_tokenizer_token_id(tok, "[S]"), 302);
    /* SKIP_SPECIAL drops special added tokens only */
    int32_t ids[] = {256, 300, 303};
    char *text = NULL;
    size_t len = 0;
    assert_ok(prl_tokenizer_decode(tok, ids, 3, PRL_TOKENIZER_SKIP_SPECIAL, &text, &len));
    ck_assert_str_eq(text, "abzz");
    free(text);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_normalizers)
{
    static const char *const words[] = {"fi", NULL};
    json_t *norm =
        json_pack("{s:s, s:[{s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence", "normalizers",
                  "type", "NFKC", "type", "Replace", "pattern", "String", "x", "content", "fi");
    prl_tokenizer *tok = load("norm", byte_level_json(words, NULL, norm, NULL, NULL), NULL);
    expect_ids(tok, "\xEF\xAC\x81", 0, (const int32_t[]){256, -1}); /* U+FB01 ligature fi */
    expect_ids(tok, "x", 0, (const int32_t[]){256, -1});
    prl_tokenizer_free(tok);
    /* a normalized added token is looked for in normalized text */
    json_t *added = json_array();
    json_t *a = added_token(300, "\xEF\xAC\x81!", 0); /* "ﬁ!" normalizes to "fi!" */
    json_object_set_new(a, "normalized", json_true());
    json_array_append_new(added, a);
    norm = json_pack("{s:s}", "type", "NFKC");
    tok = load("norm2", byte_level_json(words, NULL, norm, added, NULL), NULL);
    expect_ids(tok, "fi!", 0, (const int32_t[]){300, -1});
    prl_tokenizer_free(tok);
}
END_TEST

/* A character-level (sentencepiece-style) BPE: ▁ a b ▁a ab ▁ab, <unk>, <0x00>..<0xFF>. */
static json_t *char_level_json(int byte_fallback, json_t *pre, json_t *dec)
{
    json_t *vocab = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "<unk>", 0, "\xE2\x96\x81", 1,
                              "a", 2, "b", 3,
                              "\xE2\x96\x81"
                              "a",
                              4, "ab", 5,
                              "\xE2\x96\x81"
                              "ab",
                              6);
    for (int b = 0; byte_fallback && b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_object_set_new(vocab, name, json_integer(7 + b));
    }
    json_t *merges = json_pack("[[s, s], s, s]", "\xE2\x96\x81", "a", "a b",
                               "\xE2\x96\x81"
                               "a b");
    json_t *added = json_array();
    json_array_append_new(added, added_token(0, "<unk>", 1));
    return json_pack("{s:o, s:n, s:o, s:n, s:o, s:{s:s, s:s, s:b, s:b, s:o, s:o}}", "added_tokens",
                     added, "normalizer", "pre_tokenizer", pre, "post_processor", "decoder", dec,
                     "model", "type", "BPE", "unk_token", "<unk>", "byte_fallback", byte_fallback,
                     "fuse_unk", 1, "vocab", vocab, "merges", merges);
}

START_TEST(test_byte_fallback_metaspace_unk)
{
    json_t *pre = json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement",
                            "\xE2\x96\x81", "prepend_scheme", "always", "split", 1);
    json_t *dec = json_pack("{s:s, s:[{s:s}, {s:s, s:s, s:s}]}", "type", "Sequence", "decoders",
                            "type", "ByteFallback", "type", "Metaspace", "replacement",
                            "\xE2\x96\x81", "prepend_scheme", "always");
    prl_tokenizer *tok = load("fallback", char_level_json(1, pre, dec), NULL);
    /* "ab ab€": ▁ab ▁ab then € (E2 82 AC) as three byte tokens 7 + byte */
    expect_ids(tok, "ab ab\xE2\x82\xAC", 0,
               (const int32_t[]){6, 6, 7 + 0xE2, 7 + 0x82, 7 + 0xAC, -1});
    expect_round_trip(tok, "ab ab\xE2\x82\xAC ba", 0);
    prl_tokenizer_free(tok);
    /* no byte_fallback: unknown characters are <unk>, runs of them fused */
    pre = json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", "\xE2\x96\x81",
                    "prepend_scheme", "always", "split", 1);
    dec = json_pack("{s:s, s:s, s:s}", "type", "Metaspace", "replacement", "\xE2\x96\x81",
                    "prepend_scheme", "always");
    tok = load("unk", char_level_json(0, pre, dec), NULL);
    expect_ids(tok, "a\xE2\x82\xAC\xE2\x82\xAC b", 0, (const int32_t[]){4, 0, 1, 3, -1});
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_UNK), 0);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_post_processor_bos)
{
    json_t *root = char_level_json(1, json_null(),
                                   json_pack("{s:s, s:s, s:s}", "type", "Metaspace", "replacement",
                                             "\xE2\x96\x81", "prepend_scheme", "first"));
    json_array_append_new(json_object_get(root, "added_tokens"), added_token(263, "<s>", 1));
    json_object_set_new(
        root, "post_processor",
        json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}", "type",
                  "TemplateProcessing", "single", "SpecialToken", "id", "<s>", "type_id", 0,
                  "Sequence", "id", "A", "type_id", 0, "special_tokens", "<s>", "id", "<s>", "ids",
                  263, "tokens", "<s>"));
    json_object_set_new(root, "normalizer",
                        json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence",
                                  "normalizers", "type", "Prepend", "prepend", "\xE2\x96\x81",
                                  "type", "Replace", "pattern", "String", " ", "content",
                                  "\xE2\x96\x81"));
    prl_tokenizer *tok = load("post", root, NULL);
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_BOS), 263);
    expect_ids(tok, "ab ab", PRL_TOKENIZER_ADD_SPECIAL, (const int32_t[]){263, 6, 6, -1});
    expect_ids(tok, "ab ab", 0, (const int32_t[]){6, 6, -1});
    expect_round_trip(tok, "ab ab", 0);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_unsupported_named)
{
    json_t *r = byte_level_json(NULL, json_pack("{s:s}", "type", "Punctuation"), NULL, NULL, NULL);
    expect_load_error("u1", r, NULL, "pre_tokenizer type 'Punctuation' is not supported");
    r = byte_level_json(NULL, NULL, json_pack("{s:s}", "type", "Lowercase"), NULL, NULL);
    expect_load_error("u2", r, NULL, "normalizer type 'Lowercase' is not supported");
    r = byte_level_json(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(json_object_get(r, "model"), "type", json_string("WordPiece"));
    expect_load_error("u3", r, NULL, "model type 'WordPiece' is not supported");
    r = byte_level_json(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(json_object_get(r, "model"), "continuing_subword_prefix",
                        json_string("##"));
    expect_load_error("u4", r, NULL, "continuing_subword_prefix");
    r = byte_level_json(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(r, "decoder", json_pack("{s:s}", "type", "CTC"));
    expect_load_error("u5", r, NULL, "decoder type 'CTC' is not supported");
    r = byte_level_json(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(r, "post_processor", json_pack("{s:s}", "type", "BertProcessing"));
    expect_load_error("u6", r, NULL, "post_processor type 'BertProcessing' is not supported");
    r = byte_level_json(NULL,
                        json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "Regex",
                                  "(unclosed", "behavior", "Isolated"),
                        NULL, NULL, NULL);
    expect_load_error("u7", r, NULL, "(unclosed");
    r = byte_level_json(NULL, NULL, NULL, NULL, json_pack("[s]", "a q"));
    expect_load_error("u8", r, NULL, "merges[0] \"a q\": the result \"aq\" is not in model.vocab");
    /* an id far beyond the tokens' count is refused, not a table of that many entries (a
    ** fuzzed file asked for 4.7 GB: tests/fuzz/corpus/tokenizer/regress-oom-sparse-ids.json) */
    r = byte_level_json(NULL, NULL, NULL, NULL, NULL);
    json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), "far",
                        json_integer(588888888));
    expect_load_error("u9", r, NULL, "token id 588888888 is far beyond");
}
END_TEST

START_TEST(test_invalid_utf8)
{
    prl_tokenizer *tok = load("utf8", byte_level_json(NULL, NULL, NULL, NULL, NULL), NULL);
    int32_t *ids = (int32_t *)1;
    size_t n = 1;
    ck_assert_int_eq(prl_tokenizer_encode(tok, "ab\xFF", 3, 0, &ids, &n), PRL_ERR_ARG);
    assert_msg_has("not valid UTF-8 at byte 2");
    ck_assert_ptr_null(ids);
    prl_tokenizer_free(tok);
}
END_TEST

/* ---- chat templates ---------------------------------------------------------------- */

/* A byte-level tokenizer with the given markers as special added tokens 300.. and a
** tokenizer_config.json holding chat_template and the *_token entries. */
static prl_tokenizer *chat_tokenizer(const char *sub, const char *const *markers, const char *tpl,
                                     const char *bos, const char *eos)
{
    json_t *added = json_array();
    for (int i = 0; markers[i]; i++)
        json_array_append_new(added, added_token(300 + i, markers[i], 1));
    json_t *config = json_pack("{s:s}", "chat_template", tpl);
    if (bos) json_object_set_new(config, "bos_token", json_pack("{s:s}", "content", bos));
    json_object_set_new(config, "eos_token", eos ? json_string(eos) : json_null());
    return load(sub, byte_level_json(NULL, NULL, NULL, added, NULL), config);
}

/* Append the bytes of s as ids (the test tokenizers have no merges: one id per byte). */
static size_t put_bytes(int32_t *w, size_t n, const char *s)
{
    for (; *s; s++) w[n++] = (uint8_t)*s;
    return n;
}

/* encode_chat of [system?, user "hi", assistant "ok"] equals want; mask is 1 exactly on
** [m0, m1). */
static void expect_chat(const prl_tokenizer *tok, const prl_chat_message *msgs, size_t n_msgs,
                        const int32_t *want, size_t n_want, size_t m0, size_t m1)
{
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    assert_ok(prl_tokenizer_encode_chat(tok, msgs, n_msgs, 0, &ids, &mask, &n));
    ck_assert_uint_eq(n, n_want);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(ids[i] == want[i], "chat id %zu is %d, want %d", i, ids[i], want[i]);
        ck_assert_msg(mask[i] == (i >= m0 && i < m1), "mask %zu is %d", i, mask[i]);
    }
    free(ids);
    free(mask);
}

static void expect_prompt_tail(const prl_tokenizer *tok, const int32_t *tail, size_t n_tail)
{
    prl_chat_message m = {"user", "hi"};
    int32_t *ids = NULL;
    size_t n = 0;
    assert_ok(prl_tokenizer_encode_chat_prompt(tok, &m, 1, 0, &ids, &n));
    ck_assert_uint_ge(n, n_tail);
    for (size_t i = 0; i < n_tail; i++) ck_assert_int_eq(ids[n - n_tail + i], tail[i]);
    free(ids);
}

START_TEST(test_chat_chatml)
{
    static const char *const markers[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", NULL};
    prl_tokenizer *tok = chat_tokenizer(
        "chatml", markers,
        "{% for m in messages %}{{'<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n'}}"
        "{% endfor %}",
        NULL, "<|im_end|>");
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_BOS), -1);
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_END), 301);
    int32_t stops[2];
    ck_assert_int_eq(prl_tokenizer_stop_ids(tok, stops), 1); /* eos is the end of turn */
    prl_chat_message msgs[] = {{"user", "hi"}, {"assistant", "ok"}};
    int32_t want[32];
    size_t n = 0, m0, m1;
    want[n++] = 300, n = put_bytes(want, n, "user\nhi"), want[n++] = 301,
    n = put_bytes(want, n, "\n");
    want[n++] = 300, n = put_bytes(want, n, "assistant\n"), m0 = n, n = put_bytes(want, n, "ok");
    want[n++] = 301, m1 = n, n = put_bytes(want, n, "\n");
    expect_chat(tok, msgs, 2, want, n, m0, m1);
    expect_prompt_tail(
        tok, (const int32_t[]){300, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', '\n'}, 11);
    /* a tool turn after the model's <|im_end|> */
    prl_chat_message tool = {"tool", "42"};
    int32_t *ids = NULL;
    size_t k = 0;
    assert_ok(prl_tokenizer_encode_chat_turn(tok, &tool, 0, &ids, &k));
    int32_t tw[32];
    size_t t = put_bytes(tw, 0, "\n");
    tw[t++] = 300, t = put_bytes(tw, t, "tool\n42"), tw[t++] = 301, t = put_bytes(tw, t, "\n");
    tw[t++] = 300, t = put_bytes(tw, t, "assistant\n");
    ck_assert_uint_eq(k, t);
    ck_assert_int_eq(memcmp(ids, tw, t * sizeof *ids), 0);
    free(ids);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_chat_llama3)
{
    static const char *const markers[] = {"<|begin_of_text|>",   "<|end_of_text|>",
                                          "<|start_header_id|>", "<|end_header_id|>",
                                          "<|eot_id|>",          NULL};
    prl_tokenizer *tok = chat_tokenizer(
        "llama3", markers,
        "{% for m in messages %}{{'<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + "
        "m['content'] | trim + '<|eot_id|>'}}{% endfor %}",
        "<|begin_of_text|>", "<|end_of_text|>");
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_BOS), 300);
    int32_t stops[2];
    ck_assert_int_eq(prl_tokenizer_stop_ids(tok, stops), 2);
    ck_assert_int_eq(stops[0], 304);
    ck_assert_int_eq(stops[1], 301);
    prl_chat_message msgs[] = {{"user", " hi\n"}, {"assistant", "ok"}};
    int32_t want[40];
    size_t n = 0, m0, m1;
    want[n++] = 300;
    want[n++] = 302, n = put_bytes(want, n, "user"), want[n++] = 303,
    n = put_bytes(want, n, "\n\nhi");
    want[n++] = 304;
    want[n++] = 302, n = put_bytes(want, n, "assistant"), want[n++] = 303;
    n = put_bytes(want, n, "\n\n"), m0 = n, n = put_bytes(want, n, "ok"), want[n++] = 304, m1 = n;
    expect_chat(tok, msgs, 2, want, n, m0, m1);
    expect_prompt_tail(
        tok,
        (const int32_t[]){304, 302, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', 303, '\n', '\n'},
        14);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_chat_deepseek)
{
    static const char *const markers[] = {
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",    "<｜User｜>",
        "<｜Assistant｜>",         "<｜tool▁outputs▁begin｜>", "<｜tool▁output▁begin｜>",
        "<｜tool▁output▁end｜>",   "<｜tool▁outputs▁end｜>",   NULL};
    prl_tokenizer *tok = chat_tokenizer(
        "deepseek", markers, "{{bos_token}}{{ns.system_prompt}}<｜User｜><｜Assistant｜>",
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
    prl_chat_message msgs[] = {{"system", "S"},
                               {"user", "hi"},
                               {"assistant", "ok"},
                               {"tool", "7"},
                               {"assistant", "!"}};
    int32_t want[40];
    size_t n = 0;
    want[n++] = 300, n = put_bytes(want, n, "S");
    want[n++] = 302, n = put_bytes(want, n, "hi");
    want[n++] = 303, n = put_bytes(want, n, "ok"), want[n++] = 301;
    want[n++] = 304, want[n++] = 305, n = put_bytes(want, n, "7"), want[n++] = 306, want[n++] = 307;
    n = put_bytes(want, n, "!"), want[n++] = 301; /* no <｜Assistant｜> after tool outputs */
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t k = 0;
    assert_ok(prl_tokenizer_encode_chat(tok, msgs, 5, 0, &ids, &mask, &k));
    ck_assert_uint_eq(k, n);
    ck_assert_int_eq(memcmp(ids, want, n * sizeof *ids), 0);
    static const uint8_t want_mask[] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1};
    ck_assert_int_eq(memcmp(mask, want_mask, n), 0);
    free(ids);
    free(mask);
    expect_prompt_tail(tok, (const int32_t[]){302, 'h', 'i', 303}, 4);
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_chat_unknown_template)
{
    static const char *const markers[] = {"<s>", NULL};
    json_t *added = json_array();
    json_array_append_new(added, added_token(300, markers[0], 1));
    json_t *config = json_pack("{s:s}", "chat_template", "[INST] {{ m.content }} [/INST]");
    /* the tokenizer loads and encodes; chat encoding names the file and the known shapes */
    prl_tokenizer *tok = load("unknown", byte_level_json(NULL, NULL, NULL, added, NULL), config);
    expect_ids(tok, "a", 0, (const int32_t[]){'a', -1});
    prl_chat_message m = {"user", "hi"};
    int32_t *ids = NULL;
    size_t n = 0;
    ck_assert_int_eq(prl_tokenizer_encode_chat_prompt(tok, &m, 1, 0, &ids, &n), PRL_ERR_FORMAT);
    assert_msg_has("unknown/tokenizer_config.json: chat_template is not one prl recognises");
    assert_msg_has("ChatML");
    prl_tokenizer_free(tok);
    /* no tokenizer_config.json: loads; chat encoding says why it cannot */
    tok = load("noconfig", byte_level_json(NULL, NULL, NULL, NULL, NULL), NULL);
    ck_assert_int_eq(prl_tokenizer_encode_chat_prompt(tok, &m, 1, 0, &ids, &n), PRL_ERR_FORMAT);
    assert_msg_has("tokenizer_config.json");
    assert_msg_has("Llama-3");
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_save_writes_original)
{
    static const char *const markers[] = {"<|im_start|>", "<|im_end|>", NULL};
    prl_tokenizer *tok =
        chat_tokenizer("orig", markers, "<|im_start|>x<|im_end|>", NULL, "<|im_end|>");
    char dir[300], out[320], src[320];
    snprintf(dir, sizeof dir, "%s/saved", tmpdir);
    mkdir(dir, 0755);
    snprintf(out, sizeof out, "%s/tokenizer.json", dir);
    assert_ok(prl_tokenizer_save(tok, out));
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        size_t na, nb;
        snprintf(src, sizeof src, "%s/orig/%s", tmpdir, names[i]);
        snprintf(out, sizeof out, "%s/%s", dir, names[i]);
        char *a = check_read_file(src, &na), *b = check_read_file(out, &nb);
        ck_assert_uint_eq(na, nb);
        ck_assert_int_eq(memcmp(a, b, na), 0);
        free(a), free(b);
    }
    prl_tokenizer_free(tok);
}
END_TEST

START_TEST(test_prl_roles)
{
    prl_tokenizer *tok = NULL;
    assert_ok(prl_tokenizer_init_bytes(&tok));
    ck_assert(!prl_tokenizer_is_imported(tok));
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_PAD), PRL_TOKEN_PAD);
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_BOS), PRL_TOKEN_BOS);
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_EOS), PRL_TOKEN_EOS);
    ck_assert_int_eq(prl_tokenizer_role_id(tok, PRL_ROLE_UNK), -1);
    int32_t stops[2];
    ck_assert_int_eq(prl_tokenizer_stop_ids(tok, stops), 2);
    ck_assert_int_eq(stops[0], PRL_TOKEN_END);
    ck_assert_int_eq(stops[1], PRL_TOKEN_EOS);
    ck_assert_int_eq(prl_tokenizer_token_id(tok, "<|user|>"), PRL_TOKEN_USER);
    /* the tool turn of an agent loop: <|tool|> content <|end|> <|assistant|> */
    prl_chat_message m = {"tool", "ok"};
    int32_t *ids = NULL;
    size_t n = 0;
    assert_ok(prl_tokenizer_encode_chat_turn(tok, &m, 0, &ids, &n));
    int32_t want[] = {PRL_TOKEN_TOOL, PRL_TOKENIZER_BYTE0 + 'o', PRL_TOKENIZER_BYTE0 + 'k',
                      PRL_TOKEN_END, PRL_TOKEN_ASSISTANT};
    ck_assert_uint_eq(n, 5);
    ck_assert_int_eq(memcmp(ids, want, sizeof want), 0);
    free(ids);
    prl_tokenizer_free(tok);
}
END_TEST

static Suite *hf_suite(void)
{
    Suite *s = suite_create("tokenizer_hf");
    TCase *tc = tcase_create("import");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_prl_file_imports_identically);
    tcase_add_test(tc, test_split_behaviors);
    tcase_add_test(tc, test_added_tokens);
    tcase_add_test(tc, test_normalizers);
    tcase_add_test(tc, test_byte_fallback_metaspace_unk);
    tcase_add_test(tc, test_post_processor_bos);
    tcase_add_test(tc, test_unsupported_named);
    tcase_add_test(tc, test_invalid_utf8);
    tcase_add_test(tc, test_save_writes_original);
    tcase_add_test(tc, test_prl_roles);
    suite_add_tcase(s, tc);
    tc = tcase_create("chat");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_chat_chatml);
    tcase_add_test(tc, test_chat_llama3);
    tcase_add_test(tc, test_chat_deepseek);
    tcase_add_test(tc, test_chat_unknown_template);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return check_run(hf_suite()); }
