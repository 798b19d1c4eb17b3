/*
** reply.c — the JSON bodies the gateway answers (internal.h, docs/gateway.md "Replies"):
** chat completions and completions, whole or as stream chunks, in OpenAI's shapes, plus
** `token_ids` (every sampled id, the stop id included: what the run records) and
** `episode_id` on each choice; errors as {"error": {"message", "type", "param", "code"}};
** the model list. Called under gw.mu (the tokenizer is read).
*/
#include "roles/gateway/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static json_t *str_or_null(const char *s) { return s && *s ? json_string(s) : json_null(); }

char *gw_error_json(const gw_error *e)
{
    json_t *o = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type", e->type,
                          "param", str_or_null(e->param), "code", str_or_null(e->code));
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return t;
}

const char *gw_finish_reason(int stop)
{
    return stop == PRL_STOP_TOKEN || stop == PRL_STOP_STRING ? "stop" : "length";
}

/* Token id as {"token", "bytes"} parts: its bytes' UTF-8 view and the bytes themselves. */
static json_t *token_text(gw *g, int32_t id, json_t **bytes)
{
    const uint8_t *b = NULL;
    size_t n = 0;
    char *view = NULL;
    size_t vl = 0;
    if (prl_tokenizer_token_bytes(g->tok, id, &b, &n)) b = NULL, n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; *bytes && i < n; i++) json_array_append_new(*bytes, json_integer(b[i]));
    }
    if (prl_utf8_view((const char *)b, n, &view, &vl) < 0) return json_string("");
    json_t *s = json_stringn(view, vl);
    free(view);
    return s;
}

/* Chat logprobs entries of choice c for tokens [from, to). */
static json_t *chat_logprobs(gw *g, const gw_job *j, const gw_choice *c, int from, int to)
{
    json_t *content = json_array();
    for (int i = from; content && i < to; i++) {
        json_t *bytes = NULL, *tok = token_text(g, c->tokens[i], &bytes), *top = json_array();
        for (int t = 0; top && t < j->top; t++) {
            int32_t id = c->top_ids[(size_t)i * j->top + t];
            if (id < 0) break;
            json_t *tb = NULL, *tt = token_text(g, id, &tb);
            json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", tt, "logprob",
                                                 (double)c->top_lp[(size_t)i * j->top + t], "bytes",
                                                 tb));
        }
        json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:o}", "token", tok, "logprob",
                                                 (double)c->logprobs[i], "bytes", bytes,
                                                 "top_logprobs", top));
    }
    return json_pack("{s:o}", "content", content);
}

/* Completions logprobs of choice c for tokens [from, to): tokens, token_logprobs,
** top_logprobs ({token: logprob} per position, null without) and text_offset (from offset). */
static json_t *completion_logprobs(gw *g, const gw_job *j, const gw_choice *c, int from, int to,
                                   size_t offset)
{
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (int i = from; i < to; i++) {
        json_t *tok = token_text(g, c->tokens[i], NULL);
        json_array_append_new(offs, json_integer((json_int_t)offset));
        offset += json_string_length(tok);
        json_array_append_new(toks, tok);
        json_array_append_new(lps, json_real(c->logprobs[i]));
        json_t *top = json_object();
        for (int t = 0; top && t < j->top; t++) {
            int32_t id = c->top_ids[(size_t)i * j->top + t];
            if (id < 0) break;
            json_t *tt = token_text(g, id, NULL);
            json_object_set_new(top, json_string_value(tt),
                                json_real(c->top_lp[(size_t)i * j->top + t]));
            json_decref(tt);
        }
        json_array_append_new(tops, j->top ? top : json_null());
        if (!j->top) json_decref(top);
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs",
                     tops, "text_offset", offs);
}

static json_t *ids_json(const int32_t *v, int from, int to)
{
    json_t *a = json_array();
    for (int i = from; a && i < to; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *usage_json(const gw_job *j)
{
    long done = 0;
    for (int i = 0; i < j->n; i++) done += j->c[i].n;
    long prompt = j->n ? j->c[0].prompt_len : 0;
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                     (json_int_t)done, "total_tokens", (json_int_t)(prompt + done));
}

static json_t *envelope(const gw *g, const gw_request *r, const gw_job *j, const char *id,
                        const char *object)
{
    char fp[32];
    snprintf(fp, sizeof fp, "prl-v%lld", (long long)j->version);
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:I}", "id", id, "object", object, "created",
                     (json_int_t)time(NULL), "model", r->model, "system_fingerprint", fp,
                     "policy_version", (json_int_t)j->version);
    (void)g;
}

char *gw_reply_completion(gw *g, const gw_request *r, const gw_job *j, const char *id,
                          const char *const *episodes)
{
    int chat = r->kind == GW_CHAT;
    json_t *o = envelope(g, r, j, id, chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    for (int i = 0; o && choices && i < j->n; i++) {
        const gw_choice *c = &j->c[i];
        size_t len = 0;
        char *text = gw_choice_text(g, j, c, &len);
        if (!text) continue;
        json_t *ch = json_pack("{s:i,s:s}", "index", i, "finish_reason", gw_finish_reason(c->stop));
        if (chat)
            json_object_set_new(ch, "message",
                                json_pack("{s:s,s:s%}", "role", "assistant", "content", text, len));
        else json_object_set_new(ch, "text", json_stringn(text, len));
        free(text);
        json_t *lp = !r->logprobs ? json_null()
                     : chat       ? chat_logprobs(g, j, c, 0, c->n)
                                  : completion_logprobs(g, j, c, 0, c->n, strlen(r->prompt));
        json_object_set_new(ch, "logprobs", lp);
        json_object_set_new(ch, "token_ids", ids_json(c->tokens, 0, c->n));
        if (episodes && episodes[i])
            json_object_set_new(ch, "episode_id", json_string(episodes[i]));
        json_array_append_new(choices, ch);
    }
    if (o)
        json_object_set_new(o, "choices", choices), json_object_set_new(o, "usage", usage_json(j));
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return t;
}

char *gw_reply_chunk(gw *g, const gw_request *r, const gw_job *j, const char *id, int index,
                     const char *text, size_t len, int from, int to, const char *finish, int first,
                     const char *episode)
{
    int chat = r->kind == GW_CHAT;
    const gw_choice *c = &j->c[index];
    json_t *o = envelope(g, r, j, id, chat ? "chat.completion.chunk" : "text_completion");
    json_t *ch = json_pack("{s:i,s:o}", "index", index, "finish_reason", str_or_null(finish));
    if (chat) {
        json_t *delta = json_object();
        if (first) json_object_set_new(delta, "role", json_string("assistant"));
        if (text && len) json_object_set_new(delta, "content", json_stringn(text, len));
        else if (first) json_object_set_new(delta, "content", json_string(""));
        json_object_set_new(ch, "delta", delta);
    } else {
        json_object_set_new(ch, "text", json_stringn(text ? text : "", text ? len : 0));
    }
    json_t *lp = !r->logprobs || from >= to ? json_null()
                 : chat                     ? chat_logprobs(g, j, c, from, to)
                                            : completion_logprobs(g, j, c, from, to, 0);
    json_object_set_new(ch, "logprobs", lp);
    json_object_set_new(ch, "token_ids", ids_json(c->tokens, from, to));
    if (episode) json_object_set_new(ch, "episode_id", json_string(episode));
    json_object_set_new(o, "choices", json_pack("[o]", ch));
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return t;
}

char *gw_reply_usage_chunk(const gw_request *r, const gw_job *j, const char *id)
{
    json_t *o =
        json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", id, "object",
                  r->kind == GW_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                  (json_int_t)time(NULL), "model", r->model, "choices", "usage", usage_json(j));
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return t;
}

char *gw_reply_models(const gw *g)
{
    json_t *o =
        json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", g->model_name,
                  "object", "model", "created", (json_int_t)0, "owned_by", "prl");
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return t;
}
