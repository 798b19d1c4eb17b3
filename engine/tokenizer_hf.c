/*
** tokenizer_hf.c — importing a Hugging Face tokenizer.json (one without prl's "prl" object):
** the BPE model (vocabulary, merges in both the "a b" and the ["a", "b"] form, byte-level or
** byte_fallback alphabets, ignore_merges, unk), the added tokens, the post-processor's tokens,
** and each token's decoded bytes; the pipeline components are parsed by tokenizer_hf_steps.c
** and the chat template by tokenizer_hf_chat.c. Saving writes the original bytes back, so an
** exported checkpoint carries the user's file unchanged.
**
** The imported tokenizer reuses prl's core: tok_bytes holds each id's decoded bytes (what
** decode concatenates), merges/ranks the merge table on ids, so the BPE loop of
** tokenizer_encode.c runs unchanged. A byte-level vocabulary is stored as raw bytes (GPT-2's
** byte<->unicode map is a bijection, so BPE over mapped characters is BPE over bytes).
*/
#include "engine/tokenizer_int.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ============================================================ helpers ================= */

/* GPT-2 byte-level string -> bytes (out has room for n); 0 if a character is outside the
** alphabet (such a token, e.g. "<｜User｜>", is kept as its UTF-8). */
static int byte_level_bytes(const uint8_t *s, size_t n, uint8_t *out, size_t *m)
{
    *m = 0;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        if (s[i] < 0x80) cp = s[i++];
        else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n) {
            cp = (unsigned)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F);
            i += 2;
        } else return 0;
        int printable =
            (cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF);
        if (printable) {
            out[(*m)++] = (uint8_t)cp;
            continue;
        }
        if (cp < 0x100 || cp >= 0x100 + 68) return 0;
        int k = (int)cp - 0x100, b = 0; /* the k-th non-printable byte */
        for (; b < 256; b++) {
            int pr = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            if (!pr && k-- == 0) break;
        }
        out[(*m)++] = (uint8_t)b;
    }
    return 1;
}

/* A *_token entry of tokenizer_config.json: a string or {"content": ...}; NULL if none. */
static const char *token_content(const json_t *v)
{
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

void tok__hf_free(hf_tokenizer *hf)
{
    if (!hf) return;
    free(hf->json);
    free(hf->config);
    free(hf->config_path);
    tok__bytes_map_free(&hf->model_ids);
    free(hf->model_bytes);
    free(hf->is_special);
    tok__hf_steps_free(hf->norm, hf->n_norm);
    tok__hf_steps_free(hf->pre, hf->n_pre);
    tok__hf_steps_free(hf->dec, hf->n_dec);
    free(hf->added);
    free(hf->added_bytes);
    free(hf->by_byte);
    free(hf);
}

/* ============================================================ model =================== */

static prl_status check_model_options(const json_t *model)
{
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type) return prl_error_set(PRL_ERR_FORMAT, "model.type is missing");
    if (strcmp(type, "BPE") != 0)
        return prl_error_set(PRL_ERR_FORMAT, "model type '%s' is not supported (only BPE)", type);
    const json_t *d = json_object_get(model, "dropout");
    if (d && !json_is_null(d) && json_number_value(d) != 0)
        return prl_error_set(PRL_ERR_FORMAT,
                             "model.dropout %g is not supported (encoding must "
                             "be deterministic)",
                             json_number_value(d));
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return prl_error_set(PRL_ERR_FORMAT, "model.%s \"%s\" is not supported (only null)",
                                 affixes[i], json_string_value(v) ? json_string_value(v) : "?");
    }
    return PRL_OK;
}

/* Unused ids a vocabulary may have below its largest id. */
enum { MAX_ID_HOLES = 1 << 16 };

/* The largest id of model.vocab and added_tokens, checking each is a non-negative integer. */

static prl_status max_id(const json_t *vocab, const json_t *added, int32_t *out)
{
    long long mx = -1;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab[\"%s\"] is not a token id", key);
        if (json_integer_value(v) > mx) mx = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v)
    {
        const json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX || !json_is_string(json_object_get(v, "content")))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "added_tokens[%zu] needs an integer \"id\" and a "
                                 "string \"content\"",
                                 i);
        if (json_integer_value(id) > mx) mx = json_integer_value(id);
    }
    if (mx < 0) return prl_error_set(PRL_ERR_FORMAT, "model.vocab is empty");
    /* the tables are indexed by id: ids far beyond the tokens' count would make them huge
    ** (a fuzzed file asked for 4.7 GB); real vocabularies are dense, with a few holes */
    long long n = (long long)json_object_size(vocab) + (long long)json_array_size(added);
    if (mx >= n + MAX_ID_HOLES)
        return prl_error_set(PRL_ERR_FORMAT,
                             "token id %lld is far beyond the %lld tokens of model.vocab and "
                             "added_tokens (ids must be dense, at most %d unused)",
                             mx, n, MAX_ID_HOLES);
    *out = (int32_t)mx;
    return PRL_OK;
}

/* model.vocab -> hf->model_ids (BPE's strings: raw bytes when byte-level) and each id's
** tokenizer.json string in str[id] (borrowed from the JSON). */
static prl_status load_vocab(hf_tokenizer *hf, const json_t *vocab, const char **str,
                             size_t *str_len)
{
    size_t total = 1;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) total += strlen(key);
    hf->model_bytes = malloc(total);
    if (!hf->model_bytes) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
    size_t off = 0;
    json_object_foreach((json_t *)vocab, key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        size_t n = strlen(key), m = n;
        uint8_t *dst = hf->model_bytes + off;
        int word = hf->byte_level ? byte_level_bytes((const uint8_t *)key, n, dst, &m) : 1;
        if (!hf->byte_level || !word) memcpy(dst, key, n), m = n;
        if (str[id])
            return prl_error_set(PRL_ERR_FORMAT, "model.vocab: id %d is both \"%s\" and \"%s\"",
                                 (int)id, str[id], key);
        str[id] = key, str_len[id] = n;
        off += m;
        /* BPE never builds the empty string, nor (byte-level) a string outside the alphabet,
        ** such as DeepSeek's "<｜User｜>" in the vocabulary: neither is a word to look up */
        if (m == 0 || !word) continue;
        bytes_entry *e;
        int added;
        prl_status rc = tok__bytes_map_upsert(&hf->model_ids, dst, m, id, &e, &added);
        if (rc) return rc;
    }
    return PRL_OK;
}

static int32_t model_id(const hf_tokenizer *hf, const uint8_t *s, size_t n)
{
    return (int32_t)tok__bytes_map_get(&hf->model_ids, s, n);
}

/* One merge entry ("a b" or ["a", "b"]) -> its two strings. */
static prl_status merge_strings(const json_t *m, size_t i, char *buf, size_t cap, const char **a,
                                const char **b)
{
    if (json_is_string(m)) {
        size_t n = json_string_length(m);
        if (n + 1 > cap) return prl_error_set(PRL_ERR_FORMAT, "merges[%zu] is too long", i);
        memcpy(buf, json_string_value(m), n + 1);
        char *sp = strchr(buf, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "merges[%zu] \"%s\" is not \"left right\" (two "
                                 "tokens, one space)",
                                 i, json_string_value(m));
        *sp = '\0';
        *a = buf, *b = sp + 1;
        return PRL_OK;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        return PRL_OK;
    }
    return prl_error_set(PRL_ERR_FORMAT,
                         "merges[%zu] is neither \"left right\" nor [\"left\", "
                         "\"right\"]",
                         i);
}

/* model.merges in rank order. As in the Rust crate's map, a pair listed twice keeps its last
** rank. */
static prl_status load_merges(prl_tokenizer *t, const json_t *vocab, const json_t *merges)
{
    if (!json_is_array(merges))
        return prl_error_set(PRL_ERR_FORMAT, "model.merges is missing or not an array");
    size_t longest = 1;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) if (strlen(key) > longest) longest = strlen(key);
    size_t cap = 4 * longest + 8;
    char *buf = malloc(cap), *joined = malloc(cap);
    prl_status rc = buf && joined ? PRL_OK : prl_error_set(PRL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(merges) && !rc; i++) {
        const char *a = "", *b = "";
        if ((rc = merge_strings(json_array_get(merges, i), i, buf, cap, &a, &b))) break;
        const json_t *ja = json_object_get(vocab, a), *jb = json_object_get(vocab, b);
        size_t na = strlen(a), nb = strlen(b);
        if (!ja || !jb) {
            rc =
                prl_error_set(PRL_ERR_FORMAT, "merges[%zu] \"%s %s\": \"%s\" is not in model.vocab",
                              i, a, b, ja ? b : a);
            break;
        }
        if (na + nb + 1 > cap) {
            rc = prl_error_set(PRL_ERR_FORMAT, "merges[%zu]: result is not in model.vocab", i);
            break;
        }
        memcpy(joined, a, na);
        memcpy(joined + na, b, nb + 1);
        const json_t *jr = json_object_get(vocab, joined);
        if (!jr) {
            rc = prl_error_set(PRL_ERR_FORMAT,
                               "merges[%zu] \"%s %s\": the result \"%s\" is not in "
                               "model.vocab",
                               i, a, b, joined);
            break;
        }
        int32_t l = (int32_t)json_integer_value(ja), r = (int32_t)json_integer_value(jb);
        if (!tok__grow_array(&t->merges, &t->merges_cap, t->n_merges + 1, 3 * sizeof(int32_t))) {
            rc = prl_error_set(PRL_ERR_NOMEM, "out of memory (merges)");
            break;
        }
        int32_t *slot;
        int added;
        if ((rc = tok__pair_map_upsert(&t->ranks, tok__pair_key(l, r), 0, &slot, &added))) break;
        *slot = (int32_t)t->n_merges; /* a repeated pair: the later rank wins */
        int32_t *m = t->merges + 3 * t->n_merges++;
        m[0] = l, m[1] = r, m[2] = (int32_t)json_integer_value(jr);
    }
    free(buf);
    free(joined);
    return rc;
}

/* ============================================================ added tokens ============ */

static int by_length_desc(const void *x, const void *y)
{
    const hf_added *a = x, *b = y;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static prl_status load_added(hf_tokenizer *hf, const json_t *arr, const char **str, size_t *str_len)
{
    size_t n = json_array_size(arr), total = 1;
    hf->added = calloc(n + 1, sizeof *hf->added);
    for (size_t i = 0; i < n; i++)
        total += 4 * json_string_length(json_object_get(json_array_get(arr, i), "content")) + 16;
    hf->added_bytes = malloc(total);
    if (!hf->added || !hf->added_bytes) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
    hf_run *run = NULL;
    prl_status rc = tok__hf_run_new(&run);
    size_t off = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const json_t *t = json_array_get(arr, i);
        const json_t *c = json_object_get(t, "content");
        hf_added *a = &hf->added[hf->n_added];
        a->id = (int32_t)json_integer_value(json_object_get(t, "id"));
        a->special = json_is_true(json_object_get(t, "special"));
        a->normalized = json_is_true(json_object_get(t, "normalized"));
        a->lstrip = json_is_true(json_object_get(t, "lstrip"));
        a->rstrip = json_is_true(json_object_get(t, "rstrip"));
        a->single_word = json_is_true(json_object_get(t, "single_word"));
        str[a->id] = json_string_value(c), str_len[a->id] = json_string_length(c);
        hf->is_special[a->id] = a->special;
        if (json_string_length(c) == 0) continue; /* matches nothing */
        uint8_t *norm = NULL;
        size_t nn = json_string_length(c);
        /* a normalized token is looked for in normalized text, so as its normalized form */
        if (a->normalized)
            rc = tok__hf_normalize(hf, run, (const uint8_t *)json_string_value(c), nn, &norm, &nn);
        if (rc) break;
        if (off + nn > total) {
            free(norm);
            rc = prl_error_set(PRL_ERR_FORMAT, "added_tokens[%zu]: normalized content too long", i);
            break;
        }
        memcpy(hf->added_bytes + off, norm ? norm : (const uint8_t *)json_string_value(c), nn);
        free(norm);
        a->content = hf->added_bytes + off, a->len = nn;
        off += nn;
        hf->n_added++;
    }
    tok__hf_run_free(run);
    if (rc) return rc;
    qsort(hf->added, hf->n_added, sizeof *hf->added, by_length_desc);
    /* group by first byte (a stable counting sort keeps longest first within a group) */
    hf->by_byte = malloc((hf->n_added + 1) * sizeof *hf->by_byte);
    if (!hf->by_byte) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
    uint32_t count[257] = {0};
    for (size_t i = 0; i < hf->n_added; i++) count[hf->added[i].content[0] + 1]++;
    for (int b = 0; b < 256; b++) count[b + 1] += count[b];
    memcpy(hf->by_byte_start, count, sizeof count);
    for (size_t i = 0; i < hf->n_added; i++)
        hf->by_byte[count[hf->added[i].content[0]]++] = (uint32_t)i;
    return PRL_OK;
}

/* ============================================================ post-processor ========== */

static prl_status post_tokens(hf_tokenizer *hf, const json_t *pp)
{
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!pp || json_is_null(pp)) return PRL_OK;
    if (!type) return prl_error_set(PRL_ERR_FORMAT, "post_processor has no \"type\"");
    if (strcmp(type, "ByteLevel") == 0) return PRL_OK; /* offsets only: no tokens */
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(pp, "processors"), *x;
        size_t i;
        json_array_foreach(list, i, x)
        {
            prl_status rc = post_tokens(hf, x);
            if (rc) return rc;
        }
        return PRL_OK;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return prl_error_set(PRL_ERR_FORMAT, "post_processor type '%s' is not supported", type);
    const json_t *single = json_object_get(pp, "single"),
                 *specials = json_object_get(pp, "special_tokens");
    int after = 0;
    size_t i;
    const json_t *piece;
    json_array_foreach(single, i, piece)
    {
        if (json_object_get(piece, "Sequence")) {
            after = 1;
            continue;
        }
        const char *name =
            json_string_value(json_object_get(json_object_get(piece, "SpecialToken"), "id"));
        const json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return prl_error_set(PRL_ERR_FORMAT,
                                 "post_processor TemplateProcessing: single[%zu] "
                                 "names no special token with ids",
                                 i);
        size_t k;
        const json_t *id;
        json_array_foreach(ids, k, id)
        {
            int32_t *dst = after ? hf->post_post : hf->post_pre;
            int *n = after ? &hf->n_post_post : &hf->n_post_pre;
            if (*n == 4)
                return prl_error_set(PRL_ERR_FORMAT, "post_processor TemplateProcessing: more "
                                                     "than 4 tokens on one side");
            dst[(*n)++] = (int32_t)json_integer_value(id);
        }
    }
    return PRL_OK;
}

/* ============================================================ load ==================== */

static prl_status read_config(hf_tokenizer *hf, const char *path, json_t **config)
{
    *config = NULL;
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    hf->config_path = malloc(dir + sizeof "tokenizer_config.json");
    if (!hf->config_path) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
    memcpy(hf->config_path, path, dir);
    strcpy(hf->config_path + dir, "tokenizer_config.json");
    FILE *f = fopen(hf->config_path, "rb");
    if (!f) return PRL_OK; /* optional: no roles beyond the post-processor, no chat */
    fclose(f);
    prl_status rc = prl_file_read(hf->config_path, &hf->config, &hf->config_len);
    if (rc) return rc;
    json_error_t err; /* integers as reals: model_max_length can be 1e30 */
    *config = json_loadb(hf->config, hf->config_len, JSON_DECODE_INT_AS_REAL, &err);
    if (!*config)
        return prl_error_set(PRL_ERR_FORMAT, "%s: line %d column %d: %s", hf->config_path, err.line,
                             err.column, err.text);
    return PRL_OK;
}

/* Roles from tokenizer_config.json's *_token entries (bos also from the post-processor). */
static prl_status load_roles(prl_tokenizer *t, const json_t *config)
{
    static const char *const keys[] = {"pad_token", "bos_token", "eos_token", "unk_token"};
    static const prl_tokenizer_role roles[] = {PRL_ROLE_PAD, PRL_ROLE_BOS, PRL_ROLE_EOS,
                                               PRL_ROLE_UNK};
    for (int r = 0; r < PRL_ROLE_COUNT; r++) t->roles[r] = -1;
    if (t->hf->n_post_pre) t->roles[PRL_ROLE_BOS] = t->hf->post_pre[0];
    if (t->hf->unk_id >= 0) t->roles[PRL_ROLE_UNK] = t->hf->unk_id;
    for (int i = 0; config && i < 4; i++) {
        const char *c = token_content(json_object_get(config, keys[i]));
        if (!c) continue;
        int32_t id = prl_tokenizer_token_id(t, c);
        if (id < 0)
            return prl_error_set(PRL_ERR_FORMAT, "%s: %s \"%s\" is not a token of tokenizer.json",
                                 t->hf->config_path, keys[i], c);
        t->roles[roles[i]] = id;
    }
    return PRL_OK;
}

static prl_status build(prl_tokenizer *t, const json_t *root, const json_t *config)
{
    hf_tokenizer *hf = t->hf;
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return prl_error_set(PRL_ERR_FORMAT, "\"model\" is missing or not an object");
    prl_status rc = check_model_options(model);
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!rc && !json_is_object(vocab))
        rc = prl_error_set(PRL_ERR_FORMAT, "model.vocab is missing or not an object");
    if (!rc && added && !json_is_array(added))
        rc = prl_error_set(PRL_ERR_FORMAT, "\"added_tokens\" is not an array");
    if (!rc) rc = tok__hf_parse_normalizer(json_object_get(root, "normalizer"), hf);
    if (!rc) rc = tok__hf_parse_pre_tokenizer(json_object_get(root, "pre_tokenizer"), hf);
    if (!rc) rc = tok__hf_parse_decoder(json_object_get(root, "decoder"), hf);
    if (!rc) rc = post_tokens(hf, json_object_get(root, "post_processor"));
    int32_t top = 0;
    if (!rc) rc = max_id(vocab, added, &top);
    if (rc) return rc;
    size_t V = (size_t)top + 1;
    for (int i = 0; i < hf->n_post_pre + hf->n_post_post; i++) {
        int32_t id = i < hf->n_post_pre ? hf->post_pre[i] : hf->post_post[i - hf->n_post_pre];
        if (id < 0 || (size_t)id >= V)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "post_processor: token id %d is outside the vocabulary [0, %zu)",
                                 (int)id, V);
    }
    const char **str = calloc(V, sizeof *str);
    size_t *str_len = calloc(V, sizeof *str_len);
    hf->is_special = calloc(V, 1);
    if (!str || !str_len || !hf->is_special) rc = prl_error_set(PRL_ERR_NOMEM, "out of memory");
    hf->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    hf->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    hf->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    if (!rc) rc = load_vocab(hf, vocab, str, str_len);
    if (!rc && added) rc = load_added(hf, added, str, str_len);
    hf_run *run = NULL;
    if (!rc) rc = tok__hf_run_new(&run);
    for (size_t id = 0; id < V && !rc; id++) { /* each id's decoded bytes */
        uint8_t *b = NULL;
        size_t n = 0;
        rc = tok__hf_decode_token(hf, run, (const uint8_t *)(str[id] ? str[id] : ""), str_len[id],
                                  &b, &n);
        if (!rc) rc = tok__add_token(t, b, n);
        free(b);
    }
    tok__hf_run_free(run);
    if (!rc) rc = load_merges(t, vocab, json_object_get(model, "merges"));
    /* the first symbols of a word: bytes (byte-level) or <0xXX> (byte_fallback) */
    for (int b = 0; b < 256 && !rc; b++) {
        uint8_t byte = (uint8_t)b;
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        const json_t *fb = json_object_get(vocab, name);
        hf->byte_id[b] = hf->byte_level ? model_id(hf, &byte, 1)
                         : fb           ? (int32_t)json_integer_value(fb)
                                        : -1;
    }
    hf->unk_id = -1;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (!rc && unk) {
        const json_t *u = json_object_get(vocab, unk);
        if (!u)
            rc = prl_error_set(PRL_ERR_FORMAT, "model.unk_token \"%s\" is not in model.vocab", unk);
        else hf->unk_id = (int32_t)json_integer_value(u);
    }
    free(str);
    free(str_len);
    if (!rc) rc = load_roles(t, config);
    if (!rc) rc = tok__hf_chat_setup(t, config);
    return rc;
}

prl_status tok__hf_load(const json_t *root, const char *path, const char *text, size_t len,
                        prl_tokenizer **out)
{
    *out = NULL;
    prl_tokenizer *t = calloc(1, sizeof *t);
    hf_tokenizer *hf = calloc(1, sizeof *hf);
    char *copy = malloc(len + 1);
    if (!t || !hf || !copy) {
        free(t), free(hf), free(copy);
        return prl_error_set(PRL_ERR_NOMEM, "out of memory");
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    hf->json = copy, hf->json_len = len;
    t->hf = hf;
    json_t *config = NULL;
    prl_status rc = read_config(hf, path, &config);
    if (!rc) rc = build(t, root, config);
    json_decref(config);
    if (rc) {
        prl_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return PRL_OK;
}

prl_status tok__hf_save(const prl_tokenizer *tok, const char *path)
{
    const hf_tokenizer *hf = tok->hf;
    prl_status rc = prl_file_write_atomic(path, hf->json, hf->json_len);
    if (rc || !hf->config) return rc;
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char *cp = malloc(dir + sizeof "tokenizer_config.json");
    if (!cp) return prl_error_set(PRL_ERR_NOMEM, "out of memory");
    memcpy(cp, path, dir);
    strcpy(cp + dir, "tokenizer_config.json");
    rc = prl_file_write_atomic(cp, hf->config, hf->config_len);
    free(cp);
    return rc;
}
