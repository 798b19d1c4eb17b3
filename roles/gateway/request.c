/*
** request.c — an HTTP body as a validated gateway request (internal.h): the fields of
** OpenAI's chat completions and completions APIs that the gateway serves, each checked, and
** for anything else an OpenAI-shaped error naming the field (docs/gateway.md "Requests").
** Pure: it reads the bytes it is given and fills the struct, so it can be fuzzed alone.
*/
#include "roles/gateway/internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gw_fail(gw_error *e, int status, const char *type, const char *param, const char *code,
            const char *fmt, ...)
{
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

#define BAD(param, ...) gw_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

void gw_request_free(gw_request *r)
{
    for (int i = 0; i < r->n_messages; i++) free(r->messages[i].role), free(r->messages[i].content);
    free(r->messages), free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* An id of [A-Za-z0-9._:-], 1..GW_ID_MAX-1 bytes. */
static int id_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= GW_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

/* The body as a JSON object, or *e. */
static json_t *load_object(const char *body, size_t len, gw_error *e)
{
    json_error_t je;
    json_t *v = len ? json_loadb(body, len, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!len) BAD(NULL, "the request body is empty: send a JSON object");
    else if (!v)
        BAD(NULL, "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
            je.column);
    else if (!json_is_object(v)) BAD(NULL, "the request body must be a JSON object");
    else return v;
    json_decref(v);
    return NULL;
}

static int get_bool(json_t *o, const char *k, int *out, gw_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return BAD(k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 0;
}

static int get_int(json_t *o, const char *k, long lo, long hi, int *has, long *out, gw_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return BAD(k, "'%s' must be an integer in [%ld, %ld]", k, lo, hi);
    *out = (long)json_integer_value(v);
    if (has) *has = 1;
    return 0;
}

static int get_real(json_t *o, const char *k, double lo, double hi, int lo_open, int *has,
                    double *out, gw_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
        return BAD(k, "'%s' must be a number in %c%g, %g]", k, lo_open ? '(' : '[', lo, hi);
    *out = x, *has = 1;
    return 0;
}

/* Text content: a string, or an array of {"type": "text", "text": ...} parts (joined). */
static int content_text(json_t *v, int i, char **out, gw_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (json_is_string(v)) {
        *out = strdup(json_string_value(v));
        return *out ? 0 : gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!json_is_array(v))
        return BAD(param, "'%s' must be a string or an array of text parts", param);
    size_t total = 1, k;
    json_t *p;
    json_array_foreach(v, k, p)
    {
        const char *t = json_string_value(json_object_get(p, "type"));
        if (!t || strcmp(t, "text") || !json_is_string(json_object_get(p, "text")))
            return BAD(param,
                       "'%s[%zu]' must be {\"type\": \"text\", \"text\": string}: only "
                       "text content is served",
                       param, k);
        total += json_string_length(json_object_get(p, "text"));
    }
    char *s = malloc(total);
    if (!s) return gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    s[0] = 0;
    size_t at = 0;
    json_array_foreach(v, k, p)
    {
        json_t *t = json_object_get(p, "text");
        memcpy(s + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    s[at] = 0;
    *out = s;
    return 0;
}

static int parse_messages(json_t *o, gw_request *r, gw_error *e)
{
    json_t *ms = json_object_get(o, "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return BAD("messages", "'messages' must be a non-empty array of {role, content}");
    if (json_array_size(ms) > GW_MAX_MESSAGES)
        return BAD("messages", "'messages' has %zu entries: at most %d", json_array_size(ms),
                   GW_MAX_MESSAGES);
    r->messages = calloc(json_array_size(ms), sizeof *r->messages);
    if (!r->messages) return gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m)
    {
        char param[48];
        snprintf(param, sizeof param, "messages[%zu].role", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role)
            return BAD(param, "'messages[%zu]' must be an object with a string 'role'", i);
        if (!strcmp(role, "developer")) role = "system"; /* OpenAI's newer name */
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool"))
            return BAD(param, "'%s' = '%s' must be system, user, assistant or tool", param, role);
        json_t *tc = json_object_get(m, "tool_calls");
        if (tc && !json_is_null(tc) && !(json_is_array(tc) && json_array_size(tc) == 0))
            return BAD("tool_calls",
                       "'messages[%zu].tool_calls': structured tool calls are not served; the "
                       "assistant's text carries the call (docs/gateway.md)",
                       i);
        r->messages[i].role = strdup(role);
        r->n_messages = (int)i + 1;
        if (!r->messages[i].role) return gw_fail(e, 500, "server_error", NULL, NULL, "no memory");
        json_t *c = json_object_get(m, "content");
        if (!c || json_is_null(c)) { /* an assistant message without content: empty text */
            if (strcmp(role, "assistant"))
                return BAD(param, "'messages[%zu].content' is required for role %s", i, role);
            r->messages[i].content = strdup("");
            if (!r->messages[i].content)
                return gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            continue;
        }
        int st = content_text(c, (int)i, &r->messages[i].content, e);
        if (st) return st;
    }
    return 0;
}

static int parse_prompt(json_t *o, gw_request *r, gw_error *e)
{
    json_t *p = json_object_get(o, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
    if (!json_is_string(p))
        return BAD("prompt", "'prompt' must be a string (or an array of one string)");
    if (json_string_length(p) == 0) return BAD("prompt", "'prompt' is empty");
    if (strlen(json_string_value(p)) != json_string_length(p))
        return BAD("prompt", "'prompt' holds a NUL character");
    r->prompt = strdup(json_string_value(p));
    return r->prompt ? 0 : gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

static int parse_stop(json_t *o, gw_request *r, gw_error *e)
{
    json_t *s = json_object_get(o, "stop");
    if (!s || json_is_null(s)) return 0;
    json_t *one = json_is_string(s) ? s : NULL;
    if (!one && (!json_is_array(s) || json_array_size(s) > GW_MAX_STOP))
        return BAD("stop", "'stop' must be a string or an array of up to %d strings", GW_MAX_STOP);
    size_t n = one ? 1 : json_array_size(s);
    for (size_t i = 0; i < n; i++) {
        json_t *v = one ? one : json_array_get(s, i);
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 256)
            return BAD("stop", "'stop' entries must be strings of 1 to 256 bytes");
        r->stop[r->n_stop] = strdup(json_string_value(v));
        if (!r->stop[r->n_stop++]) return gw_fail(e, 500, "server_error", NULL, NULL, "no memory");
    }
    return 0;
}

/* Keys the gateway reads, per kind; any other key is refused by name (as OpenAI does), and
** a few known ones are accepted only at their neutral values. */
static const char *const chat_keys[] = {"model",
                                        "messages",
                                        "n",
                                        "temperature",
                                        "top_p",
                                        "max_tokens",
                                        "max_completion_tokens",
                                        "stop",
                                        "seed",
                                        "logprobs",
                                        "top_logprobs",
                                        "stream",
                                        "stream_options",
                                        "user",
                                        "frequency_penalty",
                                        "presence_penalty",
                                        "logit_bias",
                                        "response_format",
                                        "tools",
                                        "tool_choice",
                                        "parallel_tool_calls",
                                        "metadata",
                                        "store",
                                        "service_tier",
                                        NULL};
static const char *const completion_keys[] = {"model",
                                              "prompt",
                                              "n",
                                              "temperature",
                                              "top_p",
                                              "max_tokens",
                                              "stop",
                                              "seed",
                                              "logprobs",
                                              "stream",
                                              "stream_options",
                                              "user",
                                              "echo",
                                              "best_of",
                                              "suffix",
                                              "frequency_penalty",
                                              "presence_penalty",
                                              "logit_bias",
                                              NULL};

static int known(const char *const *keys, const char *k)
{
    for (int i = 0; keys[i]; i++)
        if (!strcmp(keys[i], k)) return 1;
    return 0;
}

/* Known keys at values the gateway does not serve. */
static int neutral_values(json_t *o, gw_error *e)
{
    static const char *const zero[] = {"frequency_penalty", "presence_penalty"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(o, zero[i]);
        if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0))
            return BAD(zero[i], "'%s' is not served: only 0", zero[i]);
    }
    json_t *lb = json_object_get(o, "logit_bias");
    if (lb && !json_is_null(lb) && !(json_is_object(lb) && json_object_size(lb) == 0))
        return BAD("logit_bias", "'logit_bias' is not served");
    json_t *rf = json_object_get(o, "response_format");
    const char *rft = json_string_value(json_object_get(rf, "type"));
    if (rf && !json_is_null(rf) && !(rft && !strcmp(rft, "text")))
        return BAD("response_format", "'response_format' other than {\"type\": \"text\"} is not "
                                      "served");
    json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0))
        return BAD("tools", "'tools' is not served: describe the tools in the system message and "
                            "parse the call from the reply's text (docs/gateway.md)");
    json_t *echo = json_object_get(o, "echo"), *suffix = json_object_get(o, "suffix");
    if (json_is_true(echo)) return BAD("echo", "'echo' is not served");
    if (suffix && !json_is_null(suffix)) return BAD("suffix", "'suffix' is not served");
    return 0;
}

static int parse_common(json_t *o, gw_request *r, gw_error *e)
{
    const char *model = json_string_value(json_object_get(o, "model"));
    if (!model || !*model) return BAD("model", "'model' must be a non-empty string");
    if (strlen(model) >= sizeof r->model) return BAD("model", "'model' is too long");
    snprintf(r->model, sizeof r->model, "%s", model);
    long v = 1;
    int st = get_int(o, "n", 1, GW_MAX_N, NULL, &v, e);
    r->n = (int)v;
    if (!st) st = get_real(o, "temperature", 0, 2, 0, &r->has_temperature, &r->temperature, e);
    if (!st) st = get_real(o, "top_p", 0, 1, 1, &r->has_top_p, &r->top_p, e);
    long mt = 0;
    if (!st) st = get_int(o, "max_tokens", 1, 1 << 20, NULL, &mt, e);
    if (!st && r->kind == GW_CHAT)
        st = get_int(o, "max_completion_tokens", 1, 1 << 20, NULL, &mt, e);
    r->max_tokens = (int)mt;
    json_t *seed = json_object_get(o, "seed");
    if (!st && seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) st = BAD("seed", "'seed' must be an integer");
        r->seed = (uint64_t)json_integer_value(seed), r->has_seed = 1;
    }
    if (!st) st = get_bool(o, "stream", &r->stream, e);
    json_t *so = json_object_get(o, "stream_options");
    if (!st && so && !json_is_null(so)) {
        if (!json_is_object(so)) st = BAD("stream_options", "'stream_options' must be an object");
        else st = get_bool(so, "include_usage", &r->include_usage, e);
    }
    json_t *user = json_object_get(o, "user");
    if (!st && user && !json_is_null(user)) {
        if (!json_is_string(user) || !id_ok(json_string_value(user)))
            st = BAD("user",
                     "'user' (the episode id) must be 1 to %d characters of "
                     "[A-Za-z0-9._:-]",
                     GW_ID_MAX - 1);
        else snprintf(r->episode, sizeof r->episode, "%s", json_string_value(user));
    }
    if (!st) st = parse_stop(o, r, e);
    return st;
}

static int parse_logprobs(json_t *o, gw_request *r, gw_error *e)
{
    long top = 0;
    if (r->kind == GW_COMPLETION) { /* completions: logprobs is the count of alternatives */
        int has = 0;
        int st = get_int(o, "logprobs", 0, 5, &has, &top, e);
        r->logprobs = has, r->top_logprobs = (int)top;
        long best = r->n;
        if (!st) st = get_int(o, "best_of", 1, GW_MAX_N, NULL, &best, e);
        if (!st && best != r->n) st = BAD("best_of", "'best_of' other than n is not served");
        return st;
    }
    int st = get_bool(o, "logprobs", &r->logprobs, e);
    int has = 0;
    if (!st) st = get_int(o, "top_logprobs", 0, GW_MAX_TOP, &has, &top, e);
    if (!st && has && top > 0 && !r->logprobs)
        st = BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = (int)top;
    return st;
}

int gw_request_parse(const char *body, size_t len, gw_kind kind, const char *header_episode,
                     gw_request *r, gw_error *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind, r->n = 1;
    json_t *o = load_object(body, len, e);
    if (!o) return e->status;
    const char *k;
    json_t *v;
    int st = 0;
    json_object_foreach(o, k, v)
    {
        if (!known(kind == GW_CHAT ? chat_keys : completion_keys, k)) {
            st = BAD(k, "unrecognized request argument supplied: %s", k);
            break;
        }
    }
    if (!st) st = neutral_values(o, e);
    if (!st) st = parse_common(o, r, e);
    if (!st) st = kind == GW_CHAT ? parse_messages(o, r, e) : parse_prompt(o, r, e);
    if (!st) st = parse_logprobs(o, r, e);
    if (!st && header_episode && *header_episode) {
        if (!id_ok(header_episode))
            st = BAD(NULL, "header X-Episode-Id must be 1 to %d characters of [A-Za-z0-9._:-]",
                     GW_ID_MAX - 1);
        else snprintf(r->episode, sizeof r->episode, "%s", header_episode);
    }
    json_decref(o);
    if (st) gw_request_free(r);
    return st;
}

int gw_reward_parse(const char *body, size_t len, double *reward, gw_error *e)
{
    json_t *o = load_object(body, len, e);
    if (!o) return e->status;
    json_t *v = json_object_get(o, "reward");
    int st = 0;
    if (json_object_size(o) != 1 || !v) st = BAD("reward", "the body must be {\"reward\": number}");
    else if (!json_is_number(v) || !(json_number_value(v) >= 0) || json_number_value(v) > 1)
        st = BAD("reward", "'reward' must be a number in [0, 1]");
    else *reward = json_number_value(v);
    json_decref(o);
    return st;
}

int gw_claim_parse(const char *body, size_t len, double *wait_s, gw_error *e)
{
    *wait_s = 0;
    if (len == 0) return 0;
    json_t *o = load_object(body, len, e);
    if (!o) return e->status;
    int has = 0, st = 0;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) if (strcmp(k, "wait") && !st) st =
        BAD(k, "unrecognized argument supplied: %s", k);
    if (!st) st = get_real(o, "wait", 0, 60, 0, &has, wait_s, e);
    json_decref(o);
    return st;
}
