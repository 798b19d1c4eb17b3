/*
** tokenizer_hf_chat.c — chat encoding for imported tokenizers. tokenizer_config.json's
** chat_template is a Jinja program; prl runs none. It recognises the three common shapes by
** their distinctive strings and renders them itself:
**   ChatML (Qwen)   <|im_start|>role\n content <|im_end|>\n ... ; prompt <|im_start|>assistant\n
**                   (a Qwen template, with <tool_response>, wraps tool turns in a user turn)
**   Llama-3         bos <|start_header_id|>role<|end_header_id|>\n\n trim(content) <|eot_id|>
**                   ... ; prompt <|start_header_id|>assistant<|end_header_id|>\n\n
**   DeepSeek-V3     bos, every system text (joined by \n\n), <｜User｜>content,
**                   <｜Assistant｜>content<｜end▁of▁sentence｜>, tool outputs in
**                   <｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>…<｜tool▁output▁end｜>…
**                   <｜tool▁outputs▁end｜> (the assistant turn after them has no marker)
** Markers are emitted as ids; the text between them is encoded piece by piece, so the loss
** mask (assistant content and its end token) falls on token boundaries. This equals Hugging
** Face encoding the rendered string except where a word would cross a marker-free edge (a
** content that starts with a newline right after a role header's newline).
*/
#include "engine/tokenizer_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* chat_ids slots per shape */
enum {
    ML_START = 0, /* <|im_start|> */
    ML_END,       /* <|im_end|> */
    L3_START = 0, /* <|start_header_id|> */
    L3_HEADER_END,
    L3_EOT,
    DS_USER = 0,
    DS_ASSISTANT,
    DS_EOS,
    DS_OUTS_BEGIN,
    DS_OUT_BEGIN,
    DS_OUT_END,
    DS_OUTS_END,
    ML_QWEN_TOOL = 7 /* chat_ids[7] = 1: the template wraps tool turns in <tool_response> */
};

static const char *const SHAPES_HELP =
    "supported chat templates: ChatML (<|im_start|> ... <|im_end|>, Qwen), Llama-3 "
    "(<|start_header_id|> ... <|end_header_id|> ... <|eot_id|>) and DeepSeek-V3 (<｜User｜> "
    "... <｜Assistant｜> ... <｜end▁of▁sentence｜>)";

static prl_status need_token(prl_tokenizer *t, const char *content, int32_t *out)
{
    *out = prl_tokenizer_token_id(t, content);
    if (*out < 0)
        return prl_error_set(PRL_ERR_FORMAT,
                             "%s: the chat template uses \"%s\", which is not a token "
                             "of tokenizer.json",
                             t->hf->config_path, content);
    return PRL_OK;
}

prl_status tok__hf_chat_setup(prl_tokenizer *t, const json_t *config)
{
    hf_tokenizer *hf = t->hf;
    const json_t *tpl = config ? json_object_get(config, "chat_template") : NULL;
    if (json_is_array(tpl)) { /* [{"name": "default", "template": ...}, ...]: the default */
        const json_t *pick = json_array_get(tpl, 0), *x;
        size_t i;
        json_array_foreach(tpl, i, x)
        {
            const char *name = json_string_value(json_object_get(x, "name"));
            if (name && strcmp(name, "default") == 0) pick = x;
        }
        tpl = json_object_get(pick, "template");
    }
    const char *s = json_string_value(tpl);
    hf->chat = HF_CHAT_NONE;
    if (!s) return PRL_OK; /* chat encoding will say there is no template */
    prl_status rc = PRL_OK;
    if (strstr(s, "<|im_start|>") && strstr(s, "<|im_end|>")) {
        hf->chat = HF_CHAT_CHATML;
        rc = need_token(t, "<|im_start|>", &hf->chat_ids[ML_START]);
        if (!rc) rc = need_token(t, "<|im_end|>", &hf->chat_ids[ML_END]);
        hf->chat_ids[ML_QWEN_TOOL] = strstr(s, "<tool_response>") != NULL;
        if (!rc) t->roles[PRL_ROLE_END] = hf->chat_ids[ML_END];
    } else if (strstr(s, "<|start_header_id|>") && strstr(s, "<|end_header_id|>") &&
               strstr(s, "<|eot_id|>")) {
        hf->chat = HF_CHAT_LLAMA3;
        rc = need_token(t, "<|start_header_id|>", &hf->chat_ids[L3_START]);
        if (!rc) rc = need_token(t, "<|end_header_id|>", &hf->chat_ids[L3_HEADER_END]);
        if (!rc) rc = need_token(t, "<|eot_id|>", &hf->chat_ids[L3_EOT]);
        if (!rc) t->roles[PRL_ROLE_END] = hf->chat_ids[L3_EOT];
    } else if (strstr(s, "<｜User｜>") && strstr(s, "<｜Assistant｜>")) {
        static const char *const names[] = {"<｜User｜>",
                                            "<｜Assistant｜>",
                                            "<｜end▁of▁sentence｜>",
                                            "<｜tool▁outputs▁begin｜>",
                                            "<｜tool▁output▁begin｜>",
                                            "<｜tool▁output▁end｜>",
                                            "<｜tool▁outputs▁end｜>"};
        hf->chat = HF_CHAT_DEEPSEEK;
        for (int i = 0; i < 7 && !rc; i++) rc = need_token(t, names[i], &hf->chat_ids[i]);
        if (!rc) t->roles[PRL_ROLE_END] = hf->chat_ids[DS_EOS];
    } else {
        hf->chat = HF_CHAT_UNKNOWN; /* the tokenizer still encodes; chat encoding fails */
    }
    if (!rc && t->roles[PRL_ROLE_EOS] < 0) t->roles[PRL_ROLE_EOS] = t->roles[PRL_ROLE_END];
    return rc;
}

/* ============================================================ rendering =============== */

typedef struct chat {
    chat_buf b;
    const prl_tokenizer *tok;
    unsigned flags;
} chat;

static prl_status put_id(chat *c, int32_t id, uint8_t mask)
{
    return tok__chat_special(&c->b, id, mask);
}

/* Template text (never special) or content (the caller's flags), with mask value `mask`. */
static prl_status put_text(chat *c, const char *s, size_t n, int content, uint8_t mask)
{
    size_t from = c->b.e.n;
    unsigned saved = c->b.e.flags;
    c->b.e.flags = content ? c->flags : 0;
    prl_status rc = tok__encode_text(&c->b.e, (const uint8_t *)s, n);
    c->b.e.flags = saved;
    return rc ? rc : tok__chat_mark(&c->b, from, mask);
}

static prl_status put_str(chat *c, const char *s) { return put_text(c, s, strlen(s), 0, 0); }

/* Jinja's trim: whitespace off both ends (Llama-3 trims every content). */
static void trimmed(const char *s, size_t *a, size_t *b)
{
    size_t n = strlen(s);
    *a = 0, *b = n;
    while (*a < n && strchr(" \t\n\r\v\f", s[*a])) ++*a;
    while (*b > *a && strchr(" \t\n\r\v\f", s[*b - 1])) --*b;
}

static prl_status render_chatml(chat *c, const prl_chat_message *m, size_t n, int mode)
{
    const int32_t *k = c->tok->hf->chat_ids;
    prl_status rc = PRL_OK;
    if (mode == CHAT_TURN) rc = put_str(c, "\n"); /* the model's turn ended at <|im_end|> */
    for (size_t i = 0; i < n && !rc; i++) {
        uint8_t learn = strcmp(m[i].role, "assistant") == 0;
        int qwen_tool = k[ML_QWEN_TOOL] && strcmp(m[i].role, "tool") == 0;
        rc = put_id(c, k[ML_START], 0);
        if (!rc) rc = put_str(c, qwen_tool ? "user\n<tool_response>\n" : m[i].role);
        if (!rc && !qwen_tool) rc = put_str(c, "\n");
        if (!rc) rc = put_text(c, m[i].content, strlen(m[i].content), 1, learn);
        if (!rc && qwen_tool) rc = put_str(c, "\n</tool_response>");
        if (!rc) rc = put_id(c, k[ML_END], learn);
        if (!rc) rc = put_str(c, "\n");
    }
    if (!rc && mode != CHAT_FULL) {
        rc = put_id(c, k[ML_START], 0);
        if (!rc) rc = put_str(c, "assistant\n");
    }
    return rc;
}

static prl_status render_llama3(chat *c, const prl_chat_message *m, size_t n, int mode)
{
    const int32_t *k = c->tok->hf->chat_ids;
    int32_t bos = c->tok->roles[PRL_ROLE_BOS];
    prl_status rc = PRL_OK;
    if (mode != CHAT_TURN && bos >= 0) rc = put_id(c, bos, 0);
    for (size_t i = 0; i <= n && !rc; i++) {
        if (i == n && mode == CHAT_FULL) break;
        const char *role = i < n ? m[i].role : "assistant";
        rc = put_id(c, k[L3_START], 0);
        if (!rc) rc = put_str(c, role);
        if (!rc) rc = put_id(c, k[L3_HEADER_END], 0);
        if (!rc) rc = put_str(c, "\n\n");
        if (rc || i == n) break; /* the generation prompt's open header */
        uint8_t learn = strcmp(role, "assistant") == 0;
        size_t a, b;
        trimmed(m[i].content, &a, &b);
        rc = put_text(c, m[i].content + a, b - a, 1, learn);
        if (!rc) rc = put_id(c, k[L3_EOT], learn);
    }
    return rc;
}

static prl_status render_deepseek(chat *c, const prl_chat_message *m, size_t n, int mode)
{
    const int32_t *k = c->tok->hf->chat_ids;
    int32_t bos = c->tok->roles[PRL_ROLE_BOS];
    prl_status rc = PRL_OK;
    if (mode != CHAT_TURN) {
        if (bos >= 0) rc = put_id(c, bos, 0);
        int first = 1; /* the system texts come first, joined by blank lines */
        for (size_t i = 0; i < n && !rc; i++) {
            if (strcmp(m[i].role, "system") != 0) continue;
            if (!first) rc = put_str(c, "\n\n");
            if (!rc) rc = put_text(c, m[i].content, strlen(m[i].content), 1, 0);
            first = 0;
        }
    }
    int in_tool = 0; /* inside a run of tool outputs */
    for (size_t i = 0; i < n && !rc; i++) {
        const char *r = m[i].role;
        if (strcmp(r, "tool") == 0) {
            rc = in_tool ? put_str(c, "\n") : put_id(c, k[DS_OUTS_BEGIN], 0);
            if (!rc) rc = put_id(c, k[DS_OUT_BEGIN], 0);
            if (!rc) rc = put_text(c, m[i].content, strlen(m[i].content), 1, 0);
            if (!rc) rc = put_id(c, k[DS_OUT_END], 0);
            in_tool = 1;
            continue;
        }
        if (in_tool) rc = put_id(c, k[DS_OUTS_END], 0);
        if (rc) break;
        if (strcmp(r, "user") == 0) {
            rc = put_id(c, k[DS_USER], 0);
            if (!rc) rc = put_text(c, m[i].content, strlen(m[i].content), 1, 0);
        } else if (strcmp(r, "assistant") == 0) {
            if (!in_tool) rc = put_id(c, k[DS_ASSISTANT], 0);
            if (!rc) rc = put_text(c, m[i].content, strlen(m[i].content), 1, 1);
            if (!rc) rc = put_id(c, k[DS_EOS], 1);
        }
        in_tool = 0; /* system turns were placed first */
    }
    if (!rc && in_tool) rc = put_id(c, k[DS_OUTS_END], 0);
    if (!rc && mode != CHAT_FULL && !in_tool) rc = put_id(c, k[DS_ASSISTANT], 0);
    return rc;
}

prl_status tok__hf_encode_chat(const prl_tokenizer *tok, const prl_chat_message *msgs,
                               size_t n_msgs, unsigned flags, int mode, int32_t **ids,
                               uint8_t **loss_mask, size_t *n_ids)
{
    const hf_tokenizer *hf = tok->hf;
    if (hf->chat == HF_CHAT_UNKNOWN)
        return prl_error_set(PRL_ERR_FORMAT, "%s: chat_template is not one prl recognises (%s)",
                             hf->config_path, SHAPES_HELP);
    if (hf->chat == HF_CHAT_NONE)
        return prl_error_set(PRL_ERR_FORMAT, "%s: %s; chat encoding needs its chat_template (%s)",
                             hf->config_path,
                             hf->config ? "there is no chat_template" : "not found", SHAPES_HELP);
    chat c = {.tok = tok, .flags = flags & (PRL_TOKENIZER_SPECIAL | PRL_TOKENIZER_NAIVE)};
    size_t total = 64;
    for (size_t i = 0; i < n_msgs; i++) total += strlen(msgs[i].content) + 16;
    prl_status rc = tok__encoder_init(&c.b.e, tok, c.flags, total, 0);
    if (rc) return rc;
    rc = hf->chat == HF_CHAT_CHATML   ? render_chatml(&c, msgs, n_msgs, mode)
         : hf->chat == HF_CHAT_LLAMA3 ? render_llama3(&c, msgs, n_msgs, mode)
                                      : render_deepseek(&c, msgs, n_msgs, mode);
    if (!rc) rc = tok__chat_mark(&c.b, c.b.e.n, 0); /* a mask even for an empty result */
    if (rc) {
        free(c.b.mask);
        tok__encoder_free(&c.b.e);
        return rc;
    }
    if (loss_mask) *loss_mask = c.b.mask;
    else free(c.b.mask);
    tok__encoder_take(&c.b.e, ids, n_ids);
    return PRL_OK;
}
