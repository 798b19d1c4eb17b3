/*
** prompts.c — generation prompts as token ids: one text (a user turn, or raw text after
** <|bos|>) or a JSONL file of {"prompt": "..."}, {"messages": [...]} or {"ids": [...]} lines.
** Shared by `prl generate` and `prl bench decode --prompts` so both read the same formats.
*/
#include "cli/cli.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void cli_prompts_free(cli_prompts *p)
{
    for (int i = 0; i < p->n; i++) free(p->ids[i]);
    free(p->ids), free(p->len);
    memset(p, 0, sizeof *p);
}

static void prompts_add(cli_prompts *p, int32_t *ids, size_t n)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->ids = realloc(p->ids, (size_t)p->cap * sizeof *p->ids);
        p->len = realloc(p->len, (size_t)p->cap * sizeof *p->len);
        PRL_ASSERT(p->ids && p->len);
    }
    p->ids[p->n] = ids, p->len[p->n++] = (int)n;
}

/* Chat turns as a generation prompt, the last user message ending in mode's switch. */
static prl_status encode_moded(const prl_tokenizer *tok, json_t *messages, prl_tasks_mode mode,
                               const char *file, int line, int32_t **ids, size_t *n)
{
    json_t *copy = json_deep_copy(messages);
    prl_status rc = copy ? prl_tasks_mode_apply(copy, mode) : prl_error_set(PRL_ERR_NOMEM, "mode");
    prl_chat_message *cm = NULL;
    size_t nm = 0;
    if (rc == PRL_OK) rc = cli_json_messages(copy, file, line, &cm, &nm);
    if (rc == PRL_OK) rc = prl_tokenizer_encode_chat_prompt(tok, cm, nm, 0, ids, n);
    free(cm);
    json_decref(copy);
    return rc;
}

/* A user message as a chat generation prompt, or raw text after the tokenizer's bos (none
** when it has no bos, as Qwen's). */
static prl_status encode_text(const prl_tokenizer *tok, const char *text, int raw,
                              prl_tasks_mode mode, int32_t **ids, size_t *n)
{
    if (!raw && mode != PRL_MODE_DEFAULT) {
        json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", text);
        prl_status rc = msgs ? encode_moded(tok, msgs, mode, "--prompt", 0, ids, n)
                             : prl_error_set(PRL_ERR_NOMEM, "prompt");
        json_decref(msgs);
        return rc;
    }
    if (!raw) {
        prl_chat_message msg = {.role = "user", .content = text};
        return prl_tokenizer_encode_chat_prompt(tok, &msg, 1, 0, ids, n);
    }
    if (mode != PRL_MODE_DEFAULT)
        return prl_error_set(PRL_ERR_ARG, "a mode needs chat prompts, not raw text");
    int32_t *body;
    size_t nb;
    prl_status rc = prl_tokenizer_encode(tok, text, strlen(text), 0, &body, &nb);
    if (rc) return rc;
    int32_t bos = prl_tokenizer_role_id(tok, PRL_ROLE_BOS);
    size_t head = bos >= 0;
    *ids = malloc((nb + head + 1) * sizeof **ids);
    if (!*ids) {
        free(body);
        return prl_error_set(PRL_ERR_NOMEM, "prompt of %zu tokens", nb);
    }
    if (head) (*ids)[0] = bos;
    memcpy(*ids + head, body, nb * sizeof *body);
    *n = nb + head;
    free(body);
    return PRL_OK;
}

static prl_status line_prompt(json_t *obj, const prl_tokenizer *tok, const char *file, int raw,
                              prl_tasks_mode mode, int line, int32_t **ids, size_t *n)
{
    json_t *v;
    int done = 0;
    prl_status rc = cli_jsonl_ids_line(obj, tok, file, line, "text prompts need", ids, n, &done);
    if (rc == PRL_OK && done && mode != PRL_MODE_DEFAULT) {
        free(*ids), *ids = NULL, *n = 0;
        return prl_error_set(PRL_ERR_FORMAT, "%s:%d: an \"ids\" line cannot take a mode", file,
                             line);
    }
    if (rc || done) return rc;
    if ((v = json_object_get(obj, "prompt")) && json_is_string(v)) {
        rc = encode_text(tok, json_string_value(v), raw, mode, ids, n);
    } else if ((v = json_object_get(obj, "messages")) && json_is_array(v) &&
               mode != PRL_MODE_DEFAULT) {
        rc = encode_moded(tok, v, mode, file, line, ids, n);
    } else if ((v = json_object_get(obj, "messages")) && json_is_array(v)) {
        prl_chat_message *cm;
        size_t nm;
        if ((rc = cli_json_messages(v, file, line, &cm, &nm))) return rc;
        rc = prl_tokenizer_encode_chat_prompt(tok, cm, nm, 0, ids, n);
        free(cm);
    } else {
        return prl_error_set(PRL_ERR_FORMAT,
                             "%s:%d: a line needs \"prompt\", \"messages\" or \"ids\"", file, line);
    }
    return rc ? prl_error_wrap(rc, "%s:%d: ", file, line) : PRL_OK;
}

typedef struct prompts_ctx {
    const prl_tokenizer *tok;
    const char *file;
    int raw;
    prl_tasks_mode mode;
    cli_prompts *out;
} prompts_ctx;

static prl_status add_line(void *user, json_t *obj, int line, int *go)
{
    prompts_ctx *c = user;
    int32_t *ids = NULL;
    size_t n = 0;
    (void)go;
    prl_status rc = line_prompt(obj, c->tok, c->file, c->raw, c->mode, line, &ids, &n);
    if (rc == PRL_OK) prompts_add(c->out, ids, n);
    return rc;
}

prl_status cli_prompts_read(const char *text, const char *file, int raw, prl_tasks_mode mode,
                            const prl_tokenizer *tok, cli_prompts *out)
{
    if (text) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (!tok)
            return prl_error_set(PRL_ERR_ARG,
                                 "a text prompt needs a tokenizer.json in the checkpoint");
        prl_status rc = encode_text(tok, text, raw, mode, &ids, &n);
        if (rc == PRL_OK) prompts_add(out, ids, n);
        return rc;
    }
    prompts_ctx c = {.tok = tok, .file = file, .raw = raw, .mode = mode, .out = out};
    prl_status rc = cli_jsonl_for_each(file, add_line, &c);
    if (rc == PRL_OK && out->n == 0) rc = prl_error_set(PRL_ERR_FORMAT, "%s: no prompts", file);
    return rc;
}
