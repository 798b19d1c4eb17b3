/*
** tokenizer_json.c — tokenizer.json: save in Hugging Face's layout (added tokens, the
** pre-tokenizer as a Split regex, byte-level model.vocab and model.merges, prl's own object)
** and a strict load that checks every field and rebuilds the tokenizer merge by merge
** (format in docs/tokenizer.md). A file without the "prl" object is a Hugging Face one and is
** imported by tokenizer_hf.c.
*/
#include "engine/tokenizer_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ============================================================ tokenizer.json ========== */

/* Our pre-tokenization rule as a Hugging Face Split regex (chars >= U+0080 stand for the
** bytes >= 0x80 of tokenizer.h). Descriptive: prl itself never parses it. */
static const char PRETOKENIZE_REGEX[] = "[0-9]"
                                        "| ?[A-Za-z\\x{80}-\\x{10FFFF}]+"
                                        "| ?[^\\t\\n\\x0B\\f\\r 0-9A-Za-z\\x{80}-\\x{10FFFF}]+"
                                        "|[\\t\\n\\x0B\\f\\r ]+(?= [^\\t\\n\\x0B\\f\\r 0-9])"
                                        "|[\\t\\n\\x0B\\f\\r ]+";

enum { BYTE_LEVEL_MAX_CP = 324 }; /* GPT-2's byte-level code points are all < 256 + 68 */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
** for U+0100.. in byte order, so every token is a printable string without spaces. */
static void byte_level_tables(uint16_t byte_cp[256], int16_t cp_byte[BYTE_LEVEL_MAX_CP])
{
    int extra = 0;
    for (int i = 0; i < BYTE_LEVEL_MAX_CP; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        byte_cp[b] = (uint16_t)(printable ? b : 256 + extra++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

/* Token bytes -> byte-level UTF-8 string in out (room for 2 * n + 1). */
static void byte_level_encode(const uint16_t byte_cp[256], const uint8_t *b, size_t n, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned cp = byte_cp[b[i]];
        if (cp < 0x80) {
            out[w++] = (char)cp;
        } else {
            out[w++] = (char)(0xC0 | cp >> 6);
            out[w++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[w] = '\0';
}

/* Byte-level string -> bytes in out (room for strlen(s)); 0 if s is not one. */
static int byte_level_decode(const int16_t cp_byte[BYTE_LEVEL_MAX_CP], const char *s, uint8_t *out,
                             size_t *n)
{
    const uint8_t *p = (const uint8_t *)s;
    *n = 0;
    while (*p) {
        unsigned cp;
        if (p[0] < 0x80) {
            cp = p[0];
            p += 1;
        } else if ((p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) {
            cp = (unsigned)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
            p += 2;
        } else {
            return 0;
        }
        if (cp >= BYTE_LEVEL_MAX_CP || cp_byte[cp] < 0) return 0;
        out[(*n)++] = (uint8_t)cp_byte[cp];
    }
    return 1;
}

/* ---- save ---------------------------------------------------------------------------- */

/* obj[key] = v (stolen); records failure in *ok (jansson returns NULL/-1 on no memory). */
static void jset(json_t *obj, const char *key, json_t *v, int *ok)
{
    if (!v || json_object_set_new(obj, key, v)) *ok = 0;
}

static void jappend(json_t *arr, json_t *v, int *ok)
{
    if (!v || json_array_append_new(arr, v)) *ok = 0;
}

static json_t *json_added_tokens(int *ok)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < PRL_TOKENIZER_N_SPECIAL; i++) {
        json_t *t = json_object();
        if (!t) {
            *ok = 0;
            break;
        }
        jset(t, "id", json_integer(i), ok);
        jset(t, "content", json_string(tok__special_names[i]), ok);
        jset(t, "single_word", json_false(), ok);
        jset(t, "lstrip", json_false(), ok);
        jset(t, "rstrip", json_false(), ok);
        jset(t, "normalized", json_false(), ok);
        jset(t, "special", json_true(), ok);
        jappend(arr, t, ok);
    }
    return arr;
}

static json_t *json_byte_level(int *ok)
{
    json_t *o = json_object();
    if (!o) return NULL;
    jset(o, "type", json_string("ByteLevel"), ok);
    jset(o, "add_prefix_space", json_false(), ok);
    jset(o, "trim_offsets", json_false(), ok);
    jset(o, "use_regex", json_false(), ok);
    return o;
}

static json_t *json_pre_tokenizer(int *ok)
{
    json_t *split = json_object(), *pattern = json_object(), *seq = json_object(),
           *list = json_array();
    if (split && pattern) {
        jset(pattern, "Regex", json_string(PRETOKENIZE_REGEX), ok);
        jset(split, "type", json_string("Split"), ok);
        jset(split, "pattern", pattern, ok);
        jset(split, "behavior", json_string("Isolated"), ok);
        jset(split, "invert", json_false(), ok);
    } else {
        json_decref(pattern);
        *ok = 0;
    }
    if (list) {
        jappend(list, split, ok);
        jappend(list, json_byte_level(ok), ok);
    } else {
        json_decref(split);
    }
    if (seq) {
        jset(seq, "type", json_string("Sequence"), ok);
        jset(seq, "pretokenizers", list, ok);
    } else {
        json_decref(list);
    }
    return seq;
}

/* model.vocab (ids >= 16; specials live only in added_tokens, so a merged token whose bytes
** spell "<|pad|>" cannot clash with the special) and model.merges as "left right". */
static json_t *json_model(const prl_tokenizer *tok, int *ok)
{
    uint16_t byte_cp[256];
    int16_t cp_byte[BYTE_LEVEL_MAX_CP];
    byte_level_tables(byte_cp, cp_byte);
    size_t max_len = 0;
    for (int32_t id = 0; id < tok->vocab_size; id++)
        if (tok__len(tok, id) > max_len) max_len = tok__len(tok, id);
    char *s = malloc(4 * max_len + 4);
    json_t *m = json_object(), *vocab = json_object(), *merges = json_array();
    if (!s || !m || !vocab || !merges) {
        free(s), json_decref(m), json_decref(vocab), json_decref(merges);
        *ok = 0;
        return NULL;
    }
    for (int32_t id = PRL_TOKENIZER_BYTE0; id < tok->vocab_size && *ok; id++) {
        byte_level_encode(byte_cp, tok__ptr(tok, id), tok__len(tok, id), s);
        jset(vocab, s, json_integer(id), ok);
    }
    for (size_t r = 0; r < tok->n_merges && *ok; r++) {
        const int32_t *mg = tok->merges + 3 * r;
        size_t nl = tok__len(tok, mg[0]);
        byte_level_encode(byte_cp, tok__ptr(tok, mg[0]), nl, s);
        size_t w = strlen(s);
        s[w++] = ' ';
        byte_level_encode(byte_cp, tok__ptr(tok, mg[1]), tok__len(tok, mg[1]), s + w);
        jappend(merges, json_string(s), ok);
    }
    free(s);
    jset(m, "type", json_string("BPE"), ok);
    jset(m, "dropout", json_null(), ok);
    jset(m, "unk_token", json_null(), ok);
    jset(m, "continuing_subword_prefix", json_null(), ok);
    jset(m, "end_of_word_suffix", json_null(), ok);
    jset(m, "fuse_unk", json_false(), ok);
    jset(m, "byte_fallback", json_false(), ok);
    jset(m, "ignore_merges", json_false(), ok);
    jset(m, "vocab", vocab, ok);
    jset(m, "merges", merges, ok);
    return m;
}

static json_t *json_prl(const prl_tokenizer *tok, int *ok)
{
    json_t *p = json_object();
    if (!p) return NULL;
    jset(p, "format_version", json_integer(PRL_TOKENIZER_FORMAT_VERSION), ok);
    jset(p, "split_digits", json_true(), ok);
    jset(p, "byte_offset", json_integer(PRL_TOKENIZER_BYTE0), ok);
    jset(p, "vocab_size", json_integer(tok->vocab_size), ok);
    return p;
}

static json_t *tokenizer_to_json(const prl_tokenizer *tok)
{
    int ok = 1;
    json_t *root = json_object();
    if (!root) return NULL;
    jset(root, "version", json_string("1.0"), &ok);
    jset(root, "truncation", json_null(), &ok);
    jset(root, "padding", json_null(), &ok);
    jset(root, "added_tokens", json_added_tokens(&ok), &ok);
    jset(root, "normalizer", json_null(), &ok);
    jset(root, "pre_tokenizer", json_pre_tokenizer(&ok), &ok);
    jset(root, "post_processor", json_null(), &ok);
    jset(root, "decoder", json_byte_level(&ok), &ok);
    jset(root, "model", json_model(tok, &ok), &ok);
    jset(root, "prl", json_prl(tok, &ok), &ok);
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

prl_status prl_tokenizer_save(const prl_tokenizer *tok, const char *path)
{
    if (!tok || !path) return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_save: NULL argument");
    if (tok->hf) return tok__hf_save(tok, path); /* the imported file, unchanged */
    json_t *root = tokenizer_to_json(tok);
    char *text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
    json_decref(root);
    if (!text)
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer save %s: out of memory building JSON", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps leaves no final newline; overwrite the NUL, keep len+1 */
    prl_status rc = prl_file_write_atomic(path, text, len + 1);
    free(text);
    return rc;
}

/* ---- load ---------------------------------------------------------------------------- */
/* Each check sets a message naming the JSON field and the offending value; the loader then
** prefixes the file name. */

static prl_status load_check_prl(const json_t *root)
{
    const json_t *prl = json_object_get(root, "prl");
    if (!json_is_object(prl))
        return prl_error_set(PRL_ERR_FORMAT, "no \"prl\" object (not written by prl?)");
    const json_t *v = json_object_get(prl, "format_version");
    if (!json_is_integer(v))
        return prl_error_set(PRL_ERR_FORMAT, "prl.format_version is missing or not an integer");
    if (json_integer_value(v) != PRL_TOKENIZER_FORMAT_VERSION)
        return prl_error_set(PRL_ERR_FORMAT,
                             "prl.format_version is %lld; this build reads "
                             "version %d%s",
                             (long long)json_integer_value(v), PRL_TOKENIZER_FORMAT_VERSION,
                             json_integer_value(v) > PRL_TOKENIZER_FORMAT_VERSION
                                 ? " (written by a newer prl?)"
                                 : "");
    if (!json_is_true(json_object_get(prl, "split_digits")))
        return prl_error_set(PRL_ERR_FORMAT, "prl.split_digits must be true (each digit its own "
                                             "chunk is the only pre-tokenization prl implements)");
    v = json_object_get(prl, "byte_offset");
    if (v && (!json_is_integer(v) || json_integer_value(v) != PRL_TOKENIZER_BYTE0))
        return prl_error_set(PRL_ERR_FORMAT, "prl.byte_offset must be %d", PRL_TOKENIZER_BYTE0);
    return PRL_OK;
}

static prl_status load_check_added(const json_t *root)
{
    const json_t *arr = json_object_get(root, "added_tokens");
    if (!json_is_array(arr))
        return prl_error_set(PRL_ERR_FORMAT, "\"added_tokens\" is missing or not an array");
    int seen[PRL_TOKENIZER_N_SPECIAL] = {0};
    size_t i;
    const json_t *t;
    json_array_foreach(arr, i, t)
    {
        const json_t *id = json_object_get(t, "id"), *content = json_object_get(t, "content");
        if (!json_is_integer(id) || !json_is_string(content))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "added_tokens[%zu] needs an integer \"id\" "
                                 "and a string \"content\"",
                                 i);
        long long k = json_integer_value(id);
        if (k < 0 || k >= PRL_TOKENIZER_N_SPECIAL)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "added_tokens[%zu]: id %lld is not a special "
                                 "id 0..%d",
                                 i, k, PRL_TOKENIZER_N_SPECIAL - 1);
        if (seen[k]++)
            return prl_error_set(PRL_ERR_FORMAT, "added_tokens[%zu]: duplicate id %lld", i, k);
        if (strcmp(json_string_value(content), tok__special_names[k]) != 0)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "added_tokens[%zu]: id %lld is \"%s\", "
                                 "expected \"%s\"",
                                 i, k, json_string_value(content), tok__special_names[k]);
    }
    for (int k = 0; k < PRL_TOKENIZER_N_SPECIAL; k++)
        if (!seen[k])
            return prl_error_set(PRL_ERR_FORMAT,
                                 "added_tokens: special id %d (\"%s\") is "
                                 "missing",
                                 k, tok__special_names[k]);
    return PRL_OK;
}

/* model.vocab -> tokens 16..V-1 appended to tok (which holds the 272 base tokens), checking
** ids (integers, in range, no duplicates, no holes) and strings (byte-level, bytes at their
** fixed ids, merged tokens of >= 2 bytes). */
typedef struct vocab_entry {
    const char *key;
    size_t off, len; /* decoded bytes in a shared buffer */
} vocab_entry;

static prl_status load_vocab_entries(const json_t *vocab, vocab_entry *ent, uint8_t *buf,
                                     size_t n_ids)
{
    uint16_t byte_cp[256];
    int16_t cp_byte[BYTE_LEVEL_MAX_CP];
    byte_level_tables(byte_cp, cp_byte);
    size_t off = 0;
    const char *key, *outside = NULL;
    long long outside_id = 0;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v)
    {
        if (!json_is_integer(v))
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab[\"%s\"] is not an integer id", key);
        long long id = json_integer_value(v);
        if (id < PRL_TOKENIZER_BYTE0 || id >= (long long)(PRL_TOKENIZER_BYTE0 + n_ids)) {
            if (!outside) outside = key, outside_id = id; /* reported below, with the hole */
            continue;
        }
        vocab_entry *e = &ent[id - PRL_TOKENIZER_BYTE0];
        if (e->key)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "model.vocab: duplicate id %lld (\"%s\" and "
                                 "\"%s\")",
                                 id, e->key, key);
        size_t n;
        if (!byte_level_decode(cp_byte, key, buf + off, &n) || n == 0)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "model.vocab[\"%s\"] (id %lld) is not a "
                                 "byte-level token string",
                                 key, id);
        *e = (vocab_entry){key, off, n};
        off += n;
        if (id < PRL_TOKENIZER_N_BASE && (n != 1 || buf[e->off] != id - PRL_TOKENIZER_BYTE0))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "model.vocab[\"%s\"]: id %lld must be the "
                                 "single byte 0x%02llx",
                                 key, id, id - PRL_TOKENIZER_BYTE0);
        if (id >= PRL_TOKENIZER_N_BASE && n < 2)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "model.vocab[\"%s\"]: merged id %lld is a "
                                 "single byte (bytes are ids %d..%d)",
                                 key, id, PRL_TOKENIZER_BYTE0, PRL_TOKENIZER_N_BASE - 1);
    }
    /* n entries without duplicates fill [16, 16 + n) exactly unless one lies outside it, and
    ** then some id inside is missing: name both. */
    for (size_t i = 0; i < n_ids; i++)
        if (!ent[i].key)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "model.vocab has no token with id %zu (a "
                                 "hole: %zu entries must use ids %d..%zu, but \"%s\" has id "
                                 "%lld)",
                                 i + PRL_TOKENIZER_BYTE0, n_ids, PRL_TOKENIZER_BYTE0,
                                 n_ids + PRL_TOKENIZER_BYTE0 - 1, outside ? outside : "?",
                                 outside_id);
    return PRL_OK;
}

static prl_status load_vocab(const json_t *model, prl_tokenizer *tok)
{
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return prl_error_set(PRL_ERR_FORMAT, "model.vocab is missing or not an object");
    size_t n_ids = json_object_size(vocab), total = 0;
    if (n_ids > INT32_MAX - PRL_TOKENIZER_BYTE0)
        return prl_error_set(PRL_ERR_FORMAT, "model.vocab has %zu entries", n_ids);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) total += strlen(key);
    vocab_entry *ent = calloc(n_ids + 1, sizeof *ent);
    uint8_t *buf = malloc(total + 1);
    prl_status rc = ent && buf ? load_vocab_entries(vocab, ent, buf, n_ids)
                               : prl_error_set(PRL_ERR_NOMEM, "out of memory");
    if (!rc && n_ids < 256)
        rc = prl_error_set(PRL_ERR_FORMAT,
                           "model.vocab has %zu entries; the 256 byte tokens "
                           "alone need 256",
                           n_ids);
    for (size_t i = 256; i < n_ids && !rc; i++) /* ids 272.. in order (bytes are built in) */
        rc = tok__add_token(tok, buf + ent[i].off, ent[i].len);
    free(ent);
    free(buf);
    return rc;
}

/* One merge entry ("left right" or ["left", "right"]) -> its two token ids. */
static prl_status load_merge_pair(const json_t *vocab, const json_t *m, size_t i, int32_t *l,
                                  int32_t *r)
{
    char *copy = NULL;
    const char *a, *b;
    if (json_is_string(m)) {
        copy = strdup(json_string_value(m));
        if (!copy) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
        char *sp = strchr(copy, ' ');
        if (!sp || strchr(sp + 1, ' ') || sp == copy || !sp[1]) {
            prl_status rc = prl_error_set(PRL_ERR_FORMAT,
                                          "merges[%zu] \"%s\" is not \"left "
                                          "right\" (two tokens, one space)",
                                          i, json_string_value(m));
            free(copy);
            return rc;
        }
        *sp = '\0';
        a = copy, b = sp + 1;
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        a = json_string_value(json_array_get(m, 0));
        b = json_string_value(json_array_get(m, 1));
    } else {
        return prl_error_set(PRL_ERR_FORMAT,
                             "merges[%zu] is neither \"left right\" nor "
                             "[\"left\", \"right\"]",
                             i);
    }
    const json_t *ja = json_object_get(vocab, a), *jb = json_object_get(vocab, b);
    prl_status rc = PRL_OK;
    if (!ja || !jb)
        rc = prl_error_set(PRL_ERR_FORMAT, "merges[%zu] \"%s %s\": unknown token \"%s\"", i, a, b,
                           ja ? b : a);
    else *l = (int32_t)json_integer_value(ja), *r = (int32_t)json_integer_value(jb);
    free(copy);
    return rc;
}

/* State of the merge checks: merged tokens by bytes, scratch for left + right, next new id. */
typedef struct merge_loader {
    prl_tokenizer *tok;
    bytes_map by_bytes;
    uint8_t *joined;
    int32_t next_new;
} merge_loader;

static prl_status merge_loader_init(merge_loader *L, prl_tokenizer *tok)
{
    memset(L, 0, sizeof *L);
    L->tok = tok;
    L->next_new = PRL_TOKENIZER_N_BASE;
    size_t longest = 1;
    for (int32_t id = 0; id < tok->vocab_size; id++)
        if (tok__len(tok, id) > longest) longest = tok__len(tok, id);
    L->joined = malloc(2 * longest);
    if (!L->joined) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
    prl_status rc = PRL_OK;
    for (int32_t id = PRL_TOKENIZER_N_BASE; id < tok->vocab_size && !rc; id++) {
        bytes_entry *e;
        int added;
        rc = tok__bytes_map_upsert(&L->by_bytes, tok__ptr(tok, id), tok__len(tok, id), id, &e,
                                   &added);
    }
    return rc;
}

static void merge_loader_free(merge_loader *L)
{
    free(L->joined);
    tok__bytes_map_free(&L->by_bytes);
}

/* Check and add merges[i] = m. */
static prl_status load_one_merge(merge_loader *L, const json_t *vocab, const json_t *m, size_t i)
{
    prl_tokenizer *tok = L->tok;
    int32_t l = 0, r = 0;
    prl_status rc = load_merge_pair(vocab, m, i, &l, &r);
    if (rc) return rc;
    if (l >= L->next_new || r >= L->next_new)
        return prl_error_set(PRL_ERR_FORMAT,
                             "merges[%zu] uses token id %d before the merge "
                             "that creates it",
                             i, (int)(l >= L->next_new ? l : r));
    size_t nl = tok__len(tok, l), nr = tok__len(tok, r);
    memcpy(L->joined, tok__ptr(tok, l), nl);
    memcpy(L->joined + nl, tok__ptr(tok, r), nr);
    bytes_entry *e;
    int added;
    if ((rc = tok__bytes_map_upsert(&L->by_bytes, L->joined, nl + nr, -1, &e, &added))) return rc;
    if (added) /* (the map now holds the scratch buffer as a key; it is not used again) */
        return prl_error_set(PRL_ERR_FORMAT,
                             "merges[%zu] (ids %d + %d): the result is not in "
                             "model.vocab",
                             i, (int)l, (int)r);
    int32_t res = (int32_t)e->val;
    if (res > L->next_new)
        return prl_error_set(PRL_ERR_FORMAT,
                             "merges[%zu] creates id %d but the next new id is "
                             "%d (merged ids must follow merge order)",
                             i, (int)res, (int)L->next_new);
    if (tok__pair_map_get(&tok->ranks, tok__pair_key(l, r)) >= 0)
        return prl_error_set(PRL_ERR_FORMAT, "merges[%zu]: duplicate merge of ids %d + %d", i,
                             (int)l, (int)r);
    if (res == L->next_new) L->next_new++;
    return tok__add_merge(tok, l, r, res);
}

/* model.merges, in rank order. Each merge must join two tokens that exist by then, and its
** result (looked up by bytes) must be an earlier token or exactly the next new id, so that
** ids 272..V-1 are numbered in the order their merges create them and each is created. */
static prl_status load_merges(const json_t *model, prl_tokenizer *tok)
{
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges))
        return prl_error_set(PRL_ERR_FORMAT, "model.merges is missing or not an array");
    merge_loader L;
    prl_status rc = merge_loader_init(&L, tok);
    for (size_t i = 0; i < json_array_size(merges) && !rc; i++)
        rc = load_one_merge(&L, vocab, json_array_get(merges, i), i);
    if (!rc && L.next_new != tok->vocab_size)
        rc = prl_error_set(PRL_ERR_FORMAT,
                           "model.vocab id %d is not created by any merge "
                           "(%zu merges create ids up to %d)",
                           (int)L.next_new, json_array_size(merges), (int)L.next_new - 1);
    merge_loader_free(&L);
    return rc;
}

static prl_status load_json(const json_t *root, prl_tokenizer **out)
{
    if (!json_is_object(root)) return prl_error_set(PRL_ERR_FORMAT, "top level is not an object");
    prl_status rc = load_check_prl(root);
    if (!rc) rc = load_check_added(root);
    if (rc) return rc;
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return prl_error_set(PRL_ERR_FORMAT, "\"model\" is missing or not an object");
    const json_t *type = json_object_get(model, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0)
        return prl_error_set(PRL_ERR_FORMAT, "model.type must be \"BPE\"");
    prl_tokenizer *tok = NULL;
    rc = tok__new_base(&tok);
    if (!rc) rc = load_vocab(model, tok);
    if (!rc) rc = load_merges(model, tok);
    const json_t *vs = json_object_get(json_object_get(root, "prl"), "vocab_size");
    if (!rc && vs && (!json_is_integer(vs) || json_integer_value(vs) != tok->vocab_size))
        rc = prl_error_set(PRL_ERR_FORMAT,
                           "prl.vocab_size does not match the %d ids of the "
                           "file",
                           (int)tok->vocab_size);
    if (rc) {
        prl_tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return PRL_OK;
}

prl_status prl_tokenizer_load(const char *path, prl_tokenizer **out)
{
    if (out) *out = NULL;
    if (!path || !out) return prl_error_set(PRL_ERR_ARG, "prl_tokenizer_load: NULL argument");
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        prl_status code =
            json_error_code(&err) == json_error_cannot_open_file ? PRL_ERR_IO : PRL_ERR_FORMAT;
        return prl_error_set(code, "tokenizer %s: line %d column %d: %s", path, err.line,
                             err.column, err.text);
    }
    prl_status rc;
    if (json_is_object(root) && !json_object_get(root, "prl")) { /* a Hugging Face file */
        char *text = NULL;
        size_t len = 0;
        rc = prl_file_read(path, &text, &len);
        if (!rc) rc = tok__hf_load(root, path, text, len, out);
        free(text);
    } else {
        rc = load_json(root, out);
    }
    json_decref(root);
    if (rc) return prl_error_wrap(rc, "tokenizer %s: ", path);
    return PRL_OK;
}
