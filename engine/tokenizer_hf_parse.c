/*
** tokenizer_hf_parse.c — the components of an imported Hugging Face tokenizer.json parsed into
** steps (tokenizer_int.h): "normalizer", "pre_tokenizer" and "decoder", with their Sequences
** flattened and their regexes compiled by PCRE2 in UTF + UCP mode, the nearest engine to the
** Oniguruma that Hugging Face compiles them with. A construct prl does not implement is an
** error naming it ("pre_tokenizer type 'Punctuation' is not supported"). Running the steps is
** tokenizer_hf_steps.c.
*/
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/tokenizer_int.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's pre-tokenization regex (ByteLevel with use_regex). */
static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static prl_status compile(const char *pattern, size_t len, uint32_t extra, const char *where,
                          pcre2_code **out)
{
    int err;
    PCRE2_SIZE at;
    /* a literal (a String pattern) takes no UCP: PCRE2 rejects the combination */
    uint32_t opts = PCRE2_UTF | (extra & PCRE2_LITERAL ? 0 : PCRE2_UCP) | extra;
    *out = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &at, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return prl_error_set(PRL_ERR_FORMAT, "%s: regex /%s/ does not compile at offset %zu: %s",
                             where, pattern, (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* the interpreter runs when JIT is absent */
    return PRL_OK;
}

/* ============================================================ parsing ================= */

static prl_status push_step(hf_step **steps, size_t *n, hf_step s)
{
    hf_step *p = realloc(*steps, (*n + 1) * sizeof *p);
    if (!p) return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory");
    p[(*n)++] = s;
    *steps = p;
    return PRL_OK;
}

void tok__hf_steps_free(hf_step *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        pcre2_code_free(s[i].re);
        free(s[i].text);
        free(s[i].pattern);
    }
    free(s);
}

static prl_status dup_string(const json_t *v, const char *where, char **out, size_t *len)
{
    if (!json_is_string(v)) return prl_error_set(PRL_ERR_FORMAT, "%s is not a string", where);
    *len = json_string_length(v);
    *out = malloc(*len + 1);
    if (!*out) return prl_error_set(PRL_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(*out, json_string_value(v), *len + 1);
    return PRL_OK;
}

/* A "pattern" object: {"Regex": "..."} compiled, or {"String": "..."} kept literal (literal =
** 1) or compiled as a literal regex (literal = 0). */
static prl_status parse_pattern(const json_t *pat, const char *where, int literal, hf_step *s)
{
    const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    if (json_is_string(re))
        return compile(json_string_value(re), json_string_length(re), 0, where,
                       (pcre2_code **)&s->re);
    if (!json_is_string(str))
        return prl_error_set(PRL_ERR_FORMAT, "%s.pattern needs \"Regex\" or \"String\"", where);
    if (literal) return dup_string(str, where, &s->pattern, &s->pattern_len);
    if (json_string_length(str) == 0)
        return prl_error_set(PRL_ERR_FORMAT, "%s.pattern is an empty string", where);
    return compile(json_string_value(str), json_string_length(str), PCRE2_LITERAL, where,
                   (pcre2_code **)&s->re);
}

static const char *type_of(const json_t *v)
{
    return json_string_value(json_object_get(v, "type"));
}

static prl_status unsupported(const char *what, const json_t *v)
{
    const char *t = type_of(v);
    if (!t) return prl_error_set(PRL_ERR_FORMAT, "%s has no \"type\"", what);
    return prl_error_set(PRL_ERR_FORMAT, "%s type '%s' is not supported", what, t);
}

static prl_status parse_norm(const json_t *v, hf_tokenizer *hf)
{
    const char *t = type_of(v);
    hf_step s = {0};
    prl_status rc = PRL_OK;
    if (t && strcmp(t, "Sequence") == 0) {
        const json_t *list = json_object_get(v, "normalizers"), *x;
        size_t i;
        if (!json_is_array(list))
            return prl_error_set(PRL_ERR_FORMAT, "normalizer Sequence needs \"normalizers\"");
        json_array_foreach(list, i, x) if ((rc = parse_norm(x, hf))) return rc;
        return PRL_OK;
    }
    if (t && strcmp(t, "NFC") == 0) s.kind = HF_NFC;
    else if (t && strcmp(t, "NFD") == 0) s.kind = HF_NFD;
    else if (t && strcmp(t, "NFKC") == 0) s.kind = HF_NFKC;
    else if (t && strcmp(t, "NFKD") == 0) s.kind = HF_NFKD;
    else if (t && strcmp(t, "Prepend") == 0) {
        s.kind = HF_PREPEND;
        rc = dup_string(json_object_get(v, "prepend"), "normalizer Prepend.prepend", &s.text,
                        &s.text_len);
    } else if (t && strcmp(t, "Replace") == 0) {
        s.kind = HF_REPLACE;
        rc = parse_pattern(json_object_get(v, "pattern"), "normalizer Replace", 1, &s);
        if (!rc)
            rc = dup_string(json_object_get(v, "content"), "normalizer Replace.content", &s.text,
                            &s.text_len);
    } else return unsupported("normalizer", v);
    if (!rc) rc = push_step(&hf->norm, &hf->n_norm, s);
    if (rc) pcre2_code_free(s.re), free(s.text), free(s.pattern);
    return rc;
}

prl_status tok__hf_parse_normalizer(const json_t *v, hf_tokenizer *hf)
{
    return json_is_null(v) || !v ? PRL_OK : parse_norm(v, hf);
}

static prl_status parse_behavior(const json_t *v, const char *where, hf_behavior *out)
{
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    const char *b = json_string_value(v);
    for (int i = 0; b && i < 5; i++)
        if (strcmp(b, names[i]) == 0) {
            *out = (hf_behavior)i;
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_FORMAT, "%s: behavior '%s' is not supported", where,
                         b ? b : "(missing)");
}

/* Metaspace's prepend scheme: "always" / "first" / "never", or the older add_prefix_space. */
static int prepend_scheme(const json_t *v)
{
    const char *s = json_string_value(json_object_get(v, "prepend_scheme"));
    if (s)
        return strcmp(s, "never") == 0   ? HF_PREPEND_NEVER
               : strcmp(s, "first") == 0 ? HF_PREPEND_FIRST
                                         : HF_PREPEND_ALWAYS;
    const json_t *a = json_object_get(v, "add_prefix_space");
    return !a || json_is_true(a) ? HF_PREPEND_ALWAYS : HF_PREPEND_NEVER;
}

static prl_status parse_metaspace(const json_t *v, const char *where, hf_step *s)
{
    s->kind = HF_METASPACE;
    s->flag = prepend_scheme(v);
    const json_t *sp = json_object_get(v, "split");
    s->split = !sp || json_is_true(sp);
    prl_status rc = dup_string(json_object_get(v, "replacement"), where, &s->text, &s->text_len);
    if (!rc && tok__utf8_len((uint8_t)s->text[0]) != s->text_len)
        rc = prl_error_set(PRL_ERR_FORMAT, "%s: replacement must be one character", where);
    return rc;
}

static prl_status parse_pre(const json_t *v, hf_tokenizer *hf)
{
    const char *t = type_of(v);
    hf_step s = {0};
    prl_status rc = PRL_OK;
    if (t && strcmp(t, "Sequence") == 0) {
        const json_t *list = json_object_get(v, "pretokenizers"), *x;
        size_t i;
        if (!json_is_array(list))
            return prl_error_set(PRL_ERR_FORMAT, "pre_tokenizer Sequence needs \"pretokenizers\"");
        json_array_foreach(list, i, x) if ((rc = parse_pre(x, hf))) return rc;
        return PRL_OK;
    }
    if (t && strcmp(t, "Split") == 0) {
        s.kind = HF_SPLIT;
        rc = parse_pattern(json_object_get(v, "pattern"), "pre_tokenizer Split", 0, &s);
        if (!rc)
            rc = parse_behavior(json_object_get(v, "behavior"), "pre_tokenizer Split", &s.behavior);
        s.invert = json_is_true(json_object_get(v, "invert"));
    } else if (t && strcmp(t, "ByteLevel") == 0) {
        s.kind = HF_BYTE_LEVEL;
        s.flag = json_is_true(json_object_get(v, "add_prefix_space"));
        const json_t *ur = json_object_get(v, "use_regex");
        if (!ur || json_is_true(ur))
            rc = compile(GPT2_REGEX, sizeof GPT2_REGEX - 1, 0, "pre_tokenizer ByteLevel",
                         (pcre2_code **)&s.re);
        hf->byte_level = 1;
    } else if (t && strcmp(t, "Digits") == 0) {
        s.kind = HF_DIGITS; /* Hugging Face splits on char::is_numeric: \p{N} */
        s.behavior =
            json_is_true(json_object_get(v, "individual_digits")) ? HF_ISOLATED : HF_CONTIGUOUS;
        rc = compile("\\p{N}", 5, 0, "pre_tokenizer Digits", (pcre2_code **)&s.re);
    } else if (t && strcmp(t, "Metaspace") == 0) {
        rc = parse_metaspace(v, "pre_tokenizer Metaspace", &s);
    } else return unsupported("pre_tokenizer", v);
    if (!rc) rc = push_step(&hf->pre, &hf->n_pre, s);
    if (rc) pcre2_code_free(s.re), free(s.text), free(s.pattern);
    return rc;
}

prl_status tok__hf_parse_pre_tokenizer(const json_t *v, hf_tokenizer *hf)
{
    return json_is_null(v) || !v ? PRL_OK : parse_pre(v, hf);
}

static prl_status parse_dec(const json_t *v, hf_tokenizer *hf)
{
    const char *t = type_of(v);
    hf_step s = {0};
    prl_status rc = PRL_OK;
    if (t && strcmp(t, "Sequence") == 0) {
        const json_t *list = json_object_get(v, "decoders"), *x;
        size_t i;
        if (!json_is_array(list))
            return prl_error_set(PRL_ERR_FORMAT, "decoder Sequence needs \"decoders\"");
        json_array_foreach(list, i, x) if ((rc = parse_dec(x, hf))) return rc;
        return PRL_OK;
    }
    int joined = hf->dec_join > 0; /* a ByteLevel or Fuse came before: one joined text now */
    if (t && strcmp(t, "ByteLevel") == 0) s.kind = HF_BYTE_LEVEL;
    else if (t && strcmp(t, "ByteFallback") == 0) s.kind = HF_BYTE_FALLBACK;
    else if (t && strcmp(t, "Fuse") == 0) s.kind = HF_FUSE;
    else if (t && strcmp(t, "Strip") == 0) {
        s.kind = HF_STRIP;
        s.start = (int)json_integer_value(json_object_get(v, "start"));
        s.stop = (int)json_integer_value(json_object_get(v, "stop"));
        rc = dup_string(json_object_get(v, "content"), "decoder Strip.content", &s.text,
                        &s.text_len);
        if (!rc && (s.text_len == 0 || tok__utf8_len((uint8_t)s.text[0]) != s.text_len))
            rc = prl_error_set(PRL_ERR_FORMAT, "decoder Strip.content must be one character");
    } else if (t && strcmp(t, "Replace") == 0) {
        s.kind = HF_REPLACE;
        rc = parse_pattern(json_object_get(v, "pattern"), "decoder Replace", 1, &s);
        if (!rc)
            rc = dup_string(json_object_get(v, "content"), "decoder Replace.content", &s.text,
                            &s.text_len);
    } else if (t && strcmp(t, "Metaspace") == 0) {
        rc = parse_metaspace(v, "decoder Metaspace", &s);
        if (s.flag != HF_PREPEND_NEVER) hf->dec_strip_first = 1;
    } else return unsupported("decoder", v);
    /* after a join the text is edited in place, so it may only shrink */
    int shrinks = s.kind == HF_STRIP || s.kind == HF_FUSE ||
                  (s.kind == HF_REPLACE && !s.re && s.text_len <= s.pattern_len);
    if (!rc && joined && !shrinks)
        rc = prl_error_set(PRL_ERR_FORMAT,
                           "decoder type '%s' after ByteLevel or Fuse is "
                           "not supported (only Strip, Fuse and a shrinking String Replace)",
                           t);
    if (!rc) rc = push_step(&hf->dec, &hf->n_dec, s);
    if (rc) {
        pcre2_code_free(s.re), free(s.text), free(s.pattern);
        return rc;
    }
    if (!joined && (s.kind == HF_BYTE_LEVEL || s.kind == HF_FUSE)) hf->dec_join = hf->n_dec;
    return PRL_OK;
}

prl_status tok__hf_parse_decoder(const json_t *v, hf_tokenizer *hf)
{
    if (json_is_null(v) || !v)
        return prl_error_set(PRL_ERR_FORMAT, "decoder null is not supported "
                                             "(Hugging Face would join tokens with spaces)");
    prl_status rc = parse_dec(v, hf);
    if (!rc && hf->dec_join == 0) hf->dec_join = hf->n_dec; /* all per token */
    return rc;
}
