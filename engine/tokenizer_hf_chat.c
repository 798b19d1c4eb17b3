/*
** tokenizer_hf_chat.c — chat encoding for imported tokenizers. tokenizer_config.json's
** chat_template is a Jinja program; prl runs none. It recognises the three common shapes by
** their distinctive strings and renders them itself:
**   ChatML (Qwen)   <|im_start|>role\n content <|im_end|>\n ... ; prompt <|im_start|>assistant\n
**                   (a Qwen template, with <tool_response>, wraps a run of tool turns in one
**                   user turn; Qwen3's gives the final assistant turn <think>\n\n</think>\n\n)
**   Llama-3         bos <|start_header_id|>role<|end_header_id|>\n\n trim(content) <|eot_id|>
**                   ... ; prompt <|start_header_id|>assistant<|end_header_id|>\n\n
**   DeepSeek-V3     bos, every system text (joined by \n\n), <｜User｜>content,
**                   <｜Assistant｜>content<｜end▁of▁sentence｜>, tool outputs in
**                   <｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>…<｜tool▁output▁end｜>…
**                   and the assistant turn after them opens with <｜tool▁outputs▁end｜>
** Markers are emitted as ids; the text between two markers (template text and content) is
** encoded as one piece, as Hugging Face encodes the rendered string, and cut only where the
** loss mask (assistant content and its end token) begins, so the mask falls on token
** boundaries. That cut is the one place prl can differ from Hugging Face: a word that would
** cross it (an assistant content starting with a newline right after "assistant\n").
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
    DS_OUTS_END
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
        hf->chat_qwen_tool = strstr(s, "<tool_response>") != NULL;
        hf->chat_qwen_think = strstr(s, "<think>") && strstr(s, "reasoning_content");
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
    char *pend; /* text since the last marker with one mask value, encoded as one piece */
    size_t pend_n, pend_cap;
    uint8_t pend_mask;
    const uint8_t *no_loss; /* [n_msgs] 1: an assistant turn not trained on, or NULL */
} chat;

/* The mask value of message i's content: an assistant's, unless it is a masked step. */
static uint8_t learns(const chat *c, const prl_chat_message *m, size_t i)
{
    return strcmp(m[i].role, "assistant") == 0 && !(c->no_loss && c->no_loss[i]);
}

/* Encode the pending text (template text and content together, as Hugging Face encodes the
** rendered string) with its mask value. */
static prl_status flush(chat *c)
{
    if (!c->pend_n) return PRL_OK;
    size_t from = c->b.e.n;
    prl_status rc = tok__encode_text(&c->b.e, (const uint8_t *)c->pend, c->pend_n);
    c->pend_n = 0;
    return rc ? rc : tok__chat_mark(&c->b, from, c->pend_mask);
}

static prl_status put_id(chat *c, int32_t id, uint8_t mask)
{
    prl_status rc = flush(c);
    return rc ? rc : tok__chat_special(&c->b, id, mask);
}

/* Text with mask value `mask`; a change of mask value cuts the pending piece. */
static prl_status put_text(chat *c, const char *s, size_t n, uint8_t mask)
{
    prl_status rc = c->pend_n && mask != c->pend_mask ? flush(c) : PRL_OK;
    if (rc) return rc;
    if (!tok__grow_array(&c->pend, &c->pend_cap, c->pend_n + n + 1, 1))
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer chat: out of memory");
    memcpy(c->pend + c->pend_n, s, n);
    c->pend_n += n;
    c->pend_mask = mask;
    return PRL_OK;
}

static prl_status put_str(chat *c, const char *s) { return put_text(c, s, strlen(s), 0); }

/* Jinja's trim: whitespace off both ends (Llama-3 trims every content). */
static void trimmed(const char *s, size_t *a, size_t *b)
{
    size_t n = strlen(s);
    *a = 0, *b = n;
    while (*a < n && strchr(" \t\n\r\v\f", s[*a])) ++*a;
    while (*b > *a && strchr(" \t\n\r\v\f", s[*b - 1])) --*b;
}

/* The index of the last user message (Qwen3's last_query_index: a user turn that is not a
** wrapped tool response), or -1. */
static long last_query(const prl_chat_message *m, size_t n)
{
    for (size_t i = n; i-- > 0;)
        if (strcmp(m[i].role, "user") == 0 && strncmp(m[i].content, "<tool_response>", 15) != 0)
            return (long)i;
    return -1;
}

static prl_status render_chatml(chat *c, const prl_chat_message *m, size_t n, int mode)
{
    const hf_tokenizer *hf = c->tok->hf;
    const int32_t *k = hf->chat_ids;
    long lq = last_query(m, n);
    prl_status rc = PRL_OK;
    if (mode == CHAT_TURN) rc = put_str(c, "\n"); /* the model's turn ended at <|im_end|> */
    for (size_t i = 0; i < n && !rc; i++) {
        uint8_t learn = learns(c, m, i);
        const char *content = m[i].content;
        if (hf->chat_qwen_tool && strcmp(m[i].role, "tool") == 0) {
            /* Qwen: a run of tool turns is one user turn of <tool_response> blocks */
            if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) {
                rc = put_id(c, k[ML_START], 0);
                if (!rc) rc = put_str(c, "user");
            }
            if (!rc) rc = put_str(c, "\n<tool_response>\n");
            if (!rc) rc = put_text(c, content, strlen(content), 0);
            if (!rc) rc = put_str(c, "\n</tool_response>");
            if (!rc && (i + 1 == n || strcmp(m[i + 1].role, "tool") != 0)) {
                rc = put_id(c, k[ML_END], 0);
                if (!rc) rc = put_str(c, "\n");
            }
            continue;
        }
        rc = put_id(c, k[ML_START], 0);
        if (!rc) rc = put_str(c, m[i].role);
        if (!rc) rc = put_str(c, "\n");
        /* Qwen3: the final assistant turn after the last query carries an (empty) thinking
        ** block, which the model writes itself, so it is learned */
        int assistant = strcmp(m[i].role, "assistant") == 0; /* the same text when masked */
        if (!rc && assistant && hf->chat_qwen_think && (long)i > lq && i + 1 == n) {
            rc = put_text(c, "<think>\n\n</think>\n\n", 19, learn);
            while (*content == '\n') content++;
        }
        if (!rc) rc = put_text(c, content, strlen(content), learn);
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
        uint8_t learn = learns(c, m, i);
        size_t a, b;
        trimmed(m[i].content, &a, &b);
        rc = put_text(c, m[i].content + a, b - a, learn);
        if (!rc) rc = put_id(c, k[L3_EOT], learn);
    }
    return rc;
}

/* DeepSeek-V3's template, including its quirks: a user turn after tool outputs does not close
** them, and only the first run of tool outputs opens with <｜tool▁outputs▁begin｜>. */
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
            if (!rc) rc = put_text(c, m[i].content, strlen(m[i].content), 0);
            first = 0;
        }
    }
    int is_tool = 0, output_first = 1;
    for (size_t i = 0; i < n && !rc; i++) {
        const char *r = m[i].role, *content = m[i].content;
        if (strcmp(r, "user") == 0) {
            is_tool = 0;
            rc = put_id(c, k[DS_USER], 0);
            if (!rc) rc = put_text(c, content, strlen(content), 0);
        } else if (strcmp(r, "assistant") == 0) {
            uint8_t learn = learns(c, m, i);
            rc = put_id(c, k[is_tool ? DS_OUTS_END : DS_ASSISTANT], 0);
            if (!rc) rc = put_text(c, content, strlen(content), learn);
            if (!rc) rc = put_id(c, k[DS_EOS], learn);
            is_tool = 0;
        } else if (strcmp(r, "tool") == 0) {
            is_tool = 1;
            rc = output_first ? put_id(c, k[DS_OUTS_BEGIN], 0) : put_str(c, "\n");
            output_first = 0;
            if (!rc) rc = put_id(c, k[DS_OUT_BEGIN], 0);
            if (!rc) rc = put_text(c, content, strlen(content), 0);
            if (!rc) rc = put_id(c, k[DS_OUT_END], 0);
        } /* system turns were placed first */
    }
    if (!rc && is_tool) rc = put_id(c, k[DS_OUTS_END], 0);
    if (!rc && mode != CHAT_FULL && !is_tool) rc = put_id(c, k[DS_ASSISTANT], 0);
    return rc;
}

prl_status tok__hf_encode_chat(const prl_tokenizer *tok, const prl_chat_message *msgs,
                               size_t n_msgs, const uint8_t *no_loss, unsigned flags, int mode,
                               int32_t **ids, uint8_t **loss_mask, size_t *n_ids)
{
    const hf_tokenizer *hf = tok->hf;
    if (hf->chat == HF_CHAT_UNKNOWN)
        return prl_error_set(PRL_ERR_FORMAT, "%s: chat_template is not one prl recognises (%s)",
                             hf->config_path, SHAPES_HELP);
    if (hf->chat == HF_CHAT_NONE)
        return prl_error_set(PRL_ERR_FORMAT, "%s: %s; chat encoding needs its chat_template (%s)",
                             hf->config_path,
                             hf->config ? "there is no chat_template" : "not found", SHAPES_HELP);
    chat c = {.tok = tok, .no_loss = no_loss};
    size_t total = 64;
    for (size_t i = 0; i < n_msgs; i++) total += strlen(msgs[i].content) + 16;
    /* the caller's flags for template text too: it holds no special strings (markers are
    ** emitted as ids), and non-special added tokens (<tool_response>) match either way */
    prl_status rc = tok__encoder_init(
        &c.b.e, tok, flags & (PRL_TOKENIZER_SPECIAL | PRL_TOKENIZER_NAIVE), total, 0);
    if (rc) return rc;
    rc = hf->chat == HF_CHAT_CHATML   ? render_chatml(&c, msgs, n_msgs, mode)
         : hf->chat == HF_CHAT_LLAMA3 ? render_llama3(&c, msgs, n_msgs, mode)
                                      : render_deepseek(&c, msgs, n_msgs, mode);
    if (!rc) rc = flush(&c);
    if (!rc) rc = tok__chat_mark(&c.b, c.b.e.n, 0); /* a mask even for an empty result */
    free(c.pend);
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
