/*
** tokenizer_chat.c — chat encoding for SFT and rollouts: the turns of a conversation as
** <|bos|>, role token, content, <|end|> ... with a loss mask on the assistant's tokens (or
** ending in an open assistant turn, for a prompt), and prl_chat_from_json for the JSON
** "messages" arrays of the data files. Imported tokenizers use their chat template
** (tokenizer_hf_chat.c) through the same entry points.
*/
#include "engine/tokenizer_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ============================================================ chat encoding =========== */

/* The turn-start token of a role name, or -1. */
static int32_t role_token(const char *role)
{
    static const char *const names[] = {"system", "user", "assistant", "tool"};
    static const int32_t ids[] = {PRL_TOKEN_SYSTEM, PRL_TOKEN_USER, PRL_TOKEN_ASSISTANT,
                                  PRL_TOKEN_TOOL};
    for (int i = 0; role && i < 4; i++)
        if (strcmp(role, names[i]) == 0) return ids[i];
    return -1;
}

/* Give the tokens appended since `from` the mask value v. */
prl_status tok__chat_mark(chat_buf *b, size_t from, uint8_t v)
{
    if (!tok__grow_array(&b->mask, &b->mask_cap, b->e.n, 1))
        return prl_error_set(PRL_ERR_NOMEM, "tokenizer chat: out of memory");
    memset(b->mask + from, v, b->e.n - from);
    return PRL_OK;
}

prl_status tok__chat_special(chat_buf *b, int32_t id, uint8_t v)
{
    size_t from = b->e.n;
    prl_status rc = tok__encoder_emit(&b->e, &id, 1);
    return rc ? rc : tok__chat_mark(b, from, v);
}

static prl_status chat_check(const prl_chat_message *msgs, size_t n_msgs, size_t *total)
{
    *total = 0;
    if (!msgs && n_msgs) return prl_error_set(PRL_ERR_ARG, "tokenizer chat: msgs is NULL");
    for (size_t i = 0; i < n_msgs; i++) {
        if (role_token(msgs[i].role) < 0)
            return prl_error_set(PRL_ERR_ARG,
                                 "tokenizer chat: message %zu has unknown role "
                                 "\"%s\" (expected system, user, assistant or tool)",
                                 i, msgs[i].role ? msgs[i].role : "(null)");
        if (!msgs[i].content)
            return prl_error_set(PRL_ERR_ARG,
                                 "tokenizer chat: message %zu (%s) has NULL "
                                 "content",
                                 i, msgs[i].role);
        *total += strlen(msgs[i].content) + 2;
    }
    return PRL_OK;
}

/* The shared body of encode_chat (CHAT_FULL), encode_chat_prompt (CHAT_PROMPT) and
** encode_chat_turn (CHAT_TURN: no bos, one turn, the assistant opening). */
static prl_status chat_encode(const prl_tokenizer *tok, const prl_chat_message *msgs, size_t n_msgs,
                              const uint8_t *no_loss, unsigned flags, int mode, int32_t **ids,
                              uint8_t **loss_mask, size_t *n_ids)
{
    int prompt = mode == CHAT_PROMPT, turn = mode == CHAT_TURN;
    if (ids) *ids = NULL;
    if (loss_mask) *loss_mask = NULL;
    if (n_ids) *n_ids = 0;
    if (!tok || !ids || !n_ids) return prl_error_set(PRL_ERR_ARG, "tokenizer chat: NULL argument");
    size_t total;
    prl_status rc = chat_check(msgs, n_msgs, &total);
    if (rc) return rc;
    if (tok->hf)
        return tok__hf_encode_chat(tok, msgs, n_msgs, no_loss, flags, mode, ids, loss_mask, n_ids);
    chat_buf b = {0};
    if ((rc = tok__encoder_init(&b.e, tok, flags & (PRL_TOKENIZER_SPECIAL | PRL_TOKENIZER_NAIVE),
                                total, 0)))
        return rc;
    if (!turn) rc = tok__chat_special(&b, PRL_TOKEN_BOS, 0);
    for (size_t i = 0; i < n_msgs && !rc; i++) {
        uint8_t learn = role_token(msgs[i].role) == PRL_TOKEN_ASSISTANT && !(no_loss && no_loss[i]);
        rc = tok__chat_special(&b, role_token(msgs[i].role), 0);
        size_t from = b.e.n;
        if (!rc)
            rc = tok__encode_text(&b.e, (const uint8_t *)msgs[i].content, strlen(msgs[i].content));
        if (!rc) rc = tok__encoder_emit(&b.e, &(int32_t){PRL_TOKEN_END}, 1);
        if (!rc) rc = tok__chat_mark(&b, from, learn); /* content and <|end|> */
    }
    if (!rc && (prompt || turn)) rc = tok__chat_special(&b, PRL_TOKEN_ASSISTANT, 0);
    if (!rc && mode == CHAT_FULL) {
        int last_assistant = n_msgs > 0 &&
                             role_token(msgs[n_msgs - 1].role) == PRL_TOKEN_ASSISTANT &&
                             !(no_loss && no_loss[n_msgs - 1]);
        rc = tok__chat_special(&b, PRL_TOKEN_EOS, (uint8_t)last_assistant);
    }
    if (rc) {
        free(b.mask);
        tok__encoder_free(&b.e);
        return rc;
    }
    if (loss_mask) *loss_mask = b.mask;
    else free(b.mask);
    tok__encoder_take(&b.e, ids, n_ids);
    return PRL_OK;
}

prl_status prl_tokenizer_encode_chat(const prl_tokenizer *tok, const prl_chat_message *msgs,
                                     size_t n_msgs, unsigned flags, int32_t **ids,
                                     uint8_t **loss_mask, size_t *n_ids)
{
    return chat_encode(tok, msgs, n_msgs, NULL, flags, CHAT_FULL, ids, loss_mask, n_ids);
}

prl_status prl_tokenizer_encode_chat_steps(const prl_tokenizer *tok, const prl_chat_message *msgs,
                                           size_t n_msgs, const uint8_t *no_loss, unsigned flags,
                                           int32_t **ids, uint8_t **loss_mask, size_t *n_ids)
{
    return chat_encode(tok, msgs, n_msgs, no_loss, flags, CHAT_FULL, ids, loss_mask, n_ids);
}

prl_status prl_chat_from_json(const json_t *v, const char *where, prl_chat_message **msgs,
                              size_t *n)
{
    *msgs = NULL, *n = 0;
    if (!json_is_array(v))
        return prl_error_set(PRL_ERR_FORMAT, "%s: the messages are not a JSON array", where);
    size_t nm = json_array_size(v);
    prl_chat_message *cm = calloc(nm + 1, sizeof *cm);
    if (!cm) return prl_error_set(PRL_ERR_NOMEM, "%s: messages", where);
    for (size_t i = 0; i < nm; i++) {
        json_t *msg = json_array_get(v, i);
        cm[i].role = json_string_value(json_object_get(msg, "role"));
        cm[i].content = json_string_value(json_object_get(msg, "content"));
        if (!cm[i].role || !cm[i].content) {
            free(cm);
            return prl_error_set(PRL_ERR_FORMAT, "%s: message %zu needs string role and content",
                                 where, i);
        }
    }
    *msgs = cm, *n = nm;
    return PRL_OK;
}

prl_status prl_tokenizer_encode_chat_prompt(const prl_tokenizer *tok, const prl_chat_message *msgs,
                                            size_t n_msgs, unsigned flags, int32_t **ids,
                                            size_t *n_ids)
{
    return chat_encode(tok, msgs, n_msgs, NULL, flags, CHAT_PROMPT, ids, NULL, n_ids);
}

prl_status prl_tokenizer_encode_chat_turn(const prl_tokenizer *tok, const prl_chat_message *msg,
                                          unsigned flags, int32_t **ids, size_t *n_ids)
{
    if (msg && msg->role && strcmp(msg->role, "assistant") == 0) {
        if (ids) *ids = NULL;
        if (n_ids) *n_ids = 0;
        return prl_error_set(PRL_ERR_ARG, "tokenizer chat: a turn after the model's is not the "
                                          "assistant's");
    }
    return chat_encode(tok, msg, 1, NULL, flags, CHAT_TURN, ids, NULL, n_ids);
}
