/*
** http.c — the gateway's HTTP server on libmicrohttpd (internal.h, docs/gateway.md): one
** thread per connection (a reply may wait for its generation), bodies bounded by max_body
** (a larger Content-Length, or a body that grows past it, gets 413 at once), idle
** connections closed after client_timeout, every failure an OpenAI-shaped JSON error.
** Streaming replies are server-sent events fed by the engine's progress; a client that goes
** away mid-stream loses its stream, never its episode: the turn is recorded when the
** generation ends, read or not.
*/
#include "roles/gateway/internal.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gw_http {
    struct MHD_Daemon *d;
    gw *g;
    char bound[128];
};

typedef struct conn_state { /* one request's body, gathered across upload calls */
    char *body;
    size_t len, cap;
    int refused;      /* a response is queued already */
    int too_large;    /* the body grew past max_body: the rest is read and dropped */
    size_t discarded; /* bytes dropped so far */
} conn_state;

/* A body that grew past the bound is read to its end (libmicrohttpd answers only then) up to
** this much more; a client that keeps sending after that is disconnected. */
enum { DISCARD_LIMIT = 64 << 20 };

/* ---------------------------------------------------------------- responses -------- */

static enum MHD_Result respond(struct MHD_Connection *conn, int status, char *json)
{
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                              "\"param\":null,\"code\":null}}";
    struct MHD_Response *r =
        json ? MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ok = MHD_queue_response(conn, json ? (unsigned)status : 500, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result respond_error(gw *g, struct MHD_Connection *conn, const gw_error *e)
{
    pthread_mutex_lock(&g->mu);
    g->refused++;
    pthread_mutex_unlock(&g->mu);
    return respond(conn, e->status, gw_error_json(e));
}

static enum MHD_Result fail(gw *g, struct MHD_Connection *conn, int status, const char *type,
                            const char *code, const char *msg)
{
    gw_error e;
    gw_fail(&e, status, type, NULL, code, "%s", msg);
    return respond_error(g, conn, &e);
}

/* ---------------------------------------------------------------- streams ---------- */

typedef struct stream {
    gw *g;
    gw_request r;
    gw_job *j;
    char id[48];
    const char *episodes[GW_MAX_N];
    int sent_tokens[GW_MAX_N];   /* tokens whose logprobs went out */
    size_t sent_bytes[GW_MAX_N]; /* raw text bytes that went out */
    int started[GW_MAX_N], finished[GW_MAX_N];
    int recorded, phase; /* phase 0: choices, 1: usage, 2: [DONE], 3: over */
    char *frame;
    size_t frame_len, frame_at;
} stream;

/* Bytes of raw[0..len) safe to send before the choice is finished: no incomplete UTF-8
** sequence at the end, and nothing a stop string may still start in. */
static size_t safe_end(const stream *s, const char *raw, size_t len)
{
    size_t hold = 0;
    for (int i = 0; i < s->j->n_stop; i++) {
        size_t k = strlen(s->j->stop[i]);
        if (k - 1 > hold) hold = k - 1;
    }
    size_t end = len > hold ? len - hold : 0;
    for (size_t back = 0; back < 4 && back < end; back++) { /* a sequence cut at the end */
        unsigned char c = (unsigned char)raw[end - 1 - back];
        if ((c & 0xC0) == 0x80) continue;
        int need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if ((size_t)need > back + 1) end -= back + 1;
        break;
    }
    return end;
}

static void set_frame(stream *s, char *json)
{
    free(s->frame);
    s->frame = NULL, s->frame_len = s->frame_at = 0;
    if (!json) return;
    size_t n = strlen(json);
    s->frame = malloc(n + 9);
    if (s->frame)
        memcpy(s->frame, "data: ", 6), memcpy(s->frame + 6, json, n),
            memcpy(s->frame + 6 + n, "\n\n", 3), s->frame_len = n + 8;
    free(json);
}

/* The next chunk of choice i when it has news (under g->mu); NULL: none. */
static char *choice_chunk(stream *s, int i)
{
    gw *g = s->g;
    gw_job *j = s->j;
    gw_choice *c = &j->c[i];
    int done = j->done == 1;
    if (s->finished[i] || (!done && c->n == s->sent_tokens[i] && s->started[i])) return NULL;
    size_t rl = 0;
    char *raw = gw_choice_raw(g, c, c->n, &rl);
    if (!raw) return NULL;
    size_t cut = gw_stop_cut(j, raw, rl), end = done ? cut : safe_end(s, raw, cut);
    if (end < s->sent_bytes[i]) end = s->sent_bytes[i];
    size_t vl = 0;
    char *view = gw_view(raw + s->sent_bytes[i], end - s->sent_bytes[i], &vl);
    free(raw);
    char *chunk =
        gw_reply_chunk(g, &s->r, j, s->id, i, view, vl, s->sent_tokens[i], c->n,
                       done ? gw_finish_reason(c->stop) : NULL, !s->started[i], s->episodes[i]);
    free(view);
    s->sent_bytes[i] = end, s->sent_tokens[i] = c->n, s->started[i] = 1, s->finished[i] = done;
    return chunk;
}

/* Record the turn once the generation is over (whether or not the client still reads). */
static void stream_record(stream *s)
{
    if (s->recorded) return;
    while (!s->j->done) gw_engine_wait(s->g, s->j, 1.0);
    gw_episodes_record(s->g, &s->r, s->j);
    s->recorded = 1;
}

/* The next SSE frame (under g->mu); 0 when the stream is over. */
static int next_frame(stream *s)
{
    for (;;) {
        if (s->phase == 0) {
            for (int i = 0; i < s->j->n; i++) {
                char *chunk = choice_chunk(s, i);
                if (chunk) {
                    set_frame(s, chunk);
                    return 1;
                }
            }
            if (s->j->done == -1) {
                gw_error e;
                gw_fail(&e, 500, "server_error", NULL, NULL, "generation failed: %s", s->j->why);
                stream_record(s);
                set_frame(s, gw_error_json(&e));
                s->phase = 2;
                return 1;
            }
            if (s->j->done == 1) {
                stream_record(s);
                s->phase = 1;
                continue;
            }
            if (s->g->quit) return 0;
            gw_engine_wait(s->g, s->j, 1.0);
        } else if (s->phase == 1) {
            s->phase = 2;
            if (s->r.include_usage) {
                set_frame(s, gw_reply_usage_chunk(&s->r, s->j, s->id));
                return 1;
            }
        } else if (s->phase == 2) {
            free(s->frame);
            s->frame = strdup("data: [DONE]\n\n");
            s->frame_len = s->frame ? 14 : 0, s->frame_at = 0;
            s->phase = 3;
            return 1;
        } else {
            return 0;
        }
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream *s = cls;
    (void)pos;
    pthread_mutex_lock(&s->g->mu);
    while (s->frame_at >= s->frame_len)
        if (!next_frame(s)) {
            pthread_mutex_unlock(&s->g->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
    size_t k = s->frame_len - s->frame_at < max ? s->frame_len - s->frame_at : max;
    memcpy(buf, s->frame + s->frame_at, k);
    s->frame_at += k;
    pthread_mutex_unlock(&s->g->mu);
    return (ssize_t)k;
}

static void stream_free(void *cls)
{
    stream *s = cls;
    pthread_mutex_lock(&s->g->mu);
    stream_record(s); /* the client may have gone: the episode keeps its turn */
    pthread_mutex_unlock(&s->g->mu);
    gw_job_free(s->j);
    gw_request_free(&s->r);
    free(s->frame), free(s);
}

/* ---------------------------------------------------------------- completions ------ */

static enum MHD_Result completions(gw *g, struct MHD_Connection *conn, gw_kind kind,
                                   const conn_state *cs)
{
    gw_request r;
    gw_error e;
    const char *hdr = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Episode-Id");
    if (gw_request_parse(cs->body, cs->len, kind, hdr, &r, &e)) return respond_error(g, conn, &e);
    if (strcmp(r.model, g->model_name)) {
        gw_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                "the model '%s' does not exist: this gateway serves '%s' (GET /v1/models)", r.model,
                g->model_name);
        gw_request_free(&r);
        return respond_error(g, conn, &e);
    }
    gw_job *j = calloc(1, sizeof *j);
    if (!j) {
        gw_request_free(&r);
        return fail(g, conn, 500, "server_error", NULL, "out of memory");
    }
    pthread_mutex_lock(&g->mu);
    if (gw_episodes_begin(g, &r, j, &e)) {
        pthread_mutex_unlock(&g->mu);
        gw_job_free(j);
        gw_request_free(&r);
        return respond_error(g, conn, &e);
    }
    char id[48];
    snprintf(id, sizeof id, "%s-%llu", kind == GW_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)g->requests + 1);
    const char *eps[GW_MAX_N];
    for (int i = 0; i < j->n; i++) eps[i] = j->c[i].ep ? j->c[i].ep->id : NULL;
    gw_engine_submit(g, j);
    g->served++;
    if (r.stream) {
        stream *s = calloc(1, sizeof *s);
        struct MHD_Response *resp = s ? MHD_create_response_from_callback(
                                            MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free)
                                      : NULL;
        if (!resp) { /* the turn is still recorded when its generation ends */
            while (!j->done) gw_engine_wait(g, j, 1.0);
            gw_episodes_record(g, &r, j);
            pthread_mutex_unlock(&g->mu);
            free(s), gw_job_free(j), gw_request_free(&r);
            return fail(g, conn, 500, "server_error", NULL, "out of memory");
        }
        *s = (stream){.g = g, .r = r, .j = j};
        snprintf(s->id, sizeof s->id, "%s", id);
        memcpy(s->episodes, eps, sizeof eps);
        pthread_mutex_unlock(&g->mu);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(conn, 200, resp);
        MHD_destroy_response(resp);
        return ok;
    }
    while (!j->done) gw_engine_wait(g, j, 1.0);
    gw_episodes_record(g, &r, j);
    char *body = j->done == 1 ? gw_reply_completion(g, &r, j, id, eps) : NULL;
    char why[300];
    snprintf(why, sizeof why, "generation failed: %s", j->why);
    int failed = j->done != 1;
    pthread_mutex_unlock(&g->mu);
    gw_job_free(j);
    gw_request_free(&r);
    if (failed) return fail(g, conn, 500, "server_error", NULL, why);
    return respond(conn, 200, body);
}

/* ---------------------------------------------------------------- episodes --------- */

static enum MHD_Result claim(gw *g, struct MHD_Connection *conn, const conn_state *cs)
{
    gw_error e;
    double wait_s = 0;
    if (gw_claim_parse(cs->body, cs->len, &wait_s, &e)) return respond_error(g, conn, &e);
    if (!g->connected)
        return fail(g, conn, 404, "invalid_request_error", "no_run",
                    "this gateway serves a checkpoint alone: it has no groups to play");
    pthread_mutex_lock(&g->mu);
    double t_end = prl_now() + wait_s;
    char *body = gw_group_claim(g);
    while (!body && !g->quit && prl_now() < t_end) {
        gw_engine_wait(g, NULL, t_end - prl_now() < 1 ? t_end - prl_now() : 1);
        body = gw_group_claim(g);
    }
    pthread_mutex_unlock(&g->mu);
    if (!body)
        return fail(g, conn, 503, "unavailable", "no_group",
                    "no group to play right now (the run may be training): try again");
    return respond(conn, 200, body);
}

/* /v1/episodes/{id}[/reward|/end] */
static enum MHD_Result episode(gw *g, struct MHD_Connection *conn, const char *method,
                               const char *rest, const conn_state *cs)
{
    char id[GW_ID_MAX + 1];
    const char *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    if (n == 0 || n >= sizeof id)
        return fail(g, conn, 404, "invalid_request_error", "unknown_url", "no such episode path");
    memcpy(id, rest, n), id[n] = 0;
    const char *action = slash ? slash + 1 : "";
    gw_error e;
    char *body = NULL;
    int st = 0;
    if (!strcmp(method, "GET") && !*action) {
        pthread_mutex_lock(&g->mu);
        body = gw_episode_json(g, id, &e);
        pthread_mutex_unlock(&g->mu);
        st = body ? 0 : e.status;
    } else if (!strcmp(method, "POST") && (!strcmp(action, "reward") || !strcmp(action, "end"))) {
        double reward = 0;
        int posted = !strcmp(action, "reward");
        st = posted ? gw_reward_parse(cs->body, cs->len, &reward, &e) : 0;
        if (!st) {
            pthread_mutex_lock(&g->mu);
            st = gw_episode_end(g, id, posted, reward, &body, &e);
            pthread_mutex_unlock(&g->mu);
        }
    } else {
        return fail(g, conn, 404, "invalid_request_error", "unknown_url",
                    "episodes take GET /v1/episodes/ID, POST .../reward or POST .../end");
    }
    return st ? respond_error(g, conn, &e) : respond(conn, 200, body);
}

/* ---------------------------------------------------------------- routing ---------- */

static enum MHD_Result route(gw *g, struct MHD_Connection *conn, const char *url,
                             const char *method, const conn_state *cs)
{
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/v1/completions")) {
        if (!post)
            return fail(g, conn, 405, "invalid_request_error", "method_not_allowed",
                        "use POST for completions");
        return completions(g, conn, url[4] == 'c' && url[5] == 'h' ? GW_CHAT : GW_COMPLETION, cs);
    }
    if (!strcmp(url, "/v1/models") && get) return respond(conn, 200, gw_reply_models(g));
    if (!strncmp(url, "/v1/models/", 11) && get) {
        if (strcmp(url + 11, g->model_name))
            return fail(g, conn, 404, "invalid_request_error", "model_not_found",
                        "no such model: GET /v1/models lists the one served");
        char *list = gw_reply_models(g);
        json_t *o = list ? json_loads(list, 0, NULL) : NULL;
        free(list);
        char *one =
            o ? json_dumps(json_array_get(json_object_get(o, "data"), 0), JSON_COMPACT) : NULL;
        json_decref(o);
        return respond(conn, 200, one);
    }
    if (!strcmp(url, "/v1/groups") && post) return claim(g, conn, cs);
    if (!strncmp(url, "/v1/episodes/", 13)) return episode(g, conn, method, url + 13, cs);
    if (!strcmp(url, "/health") && get) {
        pthread_mutex_lock(&g->mu);
        json_t *o = json_pack("{s:s,s:I,s:I,s:I}", "status", g->infer ? "ok" : "loading",
                              "policy_version", (json_int_t)g->version, "served",
                              (json_int_t)g->served, "refused", (json_int_t)g->refused);
        pthread_mutex_unlock(&g->mu);
        char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        return respond(conn, 200, t);
    }
    return fail(g, conn, 404, "invalid_request_error", "unknown_url",
                "unknown path: the gateway serves /v1/chat/completions, /v1/completions, "
                "/v1/models, /v1/groups and /v1/episodes/ID (docs/gateway.md)");
}

static enum MHD_Result too_large(gw *g, struct MHD_Connection *conn, conn_state *cs)
{
    char msg[128];
    snprintf(msg, sizeof msg, "the request body is larger than the %zu bytes allowed", g->max_body);
    cs->refused = 1;
    return fail(g, conn, 413, "invalid_request_error", "request_too_large", msg);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    gw *g = cls;
    (void)version;
    conn_state *cs = *con_cls;
    if (!cs) { /* the headers: refuse a declared body that is too large before reading it */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        *con_cls = cs;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > g->max_body) return too_large(g, conn, cs);
        return MHD_YES;
    }
    if (*upload_size) {
        size_t k = *upload_size;
        *upload_size = 0;
        if (cs->refused) return MHD_YES;
        if (cs->too_large || cs->len + k > g->max_body) {
            cs->too_large = 1, cs->discarded += k;
            free(cs->body), cs->body = NULL, cs->len = cs->cap = 0;
            return cs->discarded > DISCARD_LIMIT ? MHD_NO : MHD_YES;
        }
        if (cs->len + k + 1 > cs->cap) {
            size_t cap = cs->cap ? cs->cap : 4096;
            while (cap < cs->len + k + 1) cap *= 2;
            char *b = realloc(cs->body, cap);
            if (!b) return MHD_NO;
            cs->body = b, cs->cap = cap;
        }
        memcpy(cs->body + cs->len, upload_data, k);
        cs->len += k;
        return MHD_YES;
    }
    if (cs->refused) return MHD_YES;
    if (cs->too_large) return too_large(g, conn, cs);
    return route(g, conn, url, method, cs);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)cls, (void)conn, (void)why;
    conn_state *cs = *con_cls;
    if (cs) free(cs->body), free(cs);
    *con_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fputs("[gateway] http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---------------------------------------------------------------- server ----------- */

prl_status gw_http_start(gw *g, const char *bind, int allow_remote, gw_http **out, char *bound,
                         size_t n)
{
    *out = NULL;
    const char *colon = strrchr(bind, ':');
    char host[128];
    size_t hl = colon ? (size_t)(colon - bind) : 0;
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || hl == 0 || hl >= sizeof host || !colon[1] || *end || port < 0 || port > 65535)
        return prl_error_set(PRL_ERR_ARG, "--bind %s: must be HOST:PORT (port 0..65535)", bind);
    memcpy(host, bind, hl), host[hl] = 0;
    if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
    int v6 = host[0] == '[';
    if (v6) memmove(host, host + 1, strlen(host)), host[strlen(host) - 1] = 0;
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
    int ok = v6 ? inet_pton(AF_INET6, host, &a6.sin6_addr) : inet_pton(AF_INET, host, &a4.sin_addr);
    if (ok != 1)
        return prl_error_set(PRL_ERR_ARG, "--bind %s: '%s' is not an IP address", bind, host);
    int loop = v6 ? IN6_IS_ADDR_LOOPBACK(&a6.sin6_addr) : (ntohl(a4.sin_addr.s_addr) >> 24) == 127;
    if (!loop && !allow_remote)
        return prl_error_set(PRL_ERR_ARG,
                             "--bind %s is not a loopback address: the gateway serves other "
                             "hosts only when allowed (gateway.allow_remote, --allow-remote)",
                             bind);
    gw_http *h = calloc(1, sizeof *h);
    if (!h) return prl_error_set(PRL_ERR_NOMEM, "http server");
    h->g = g;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    h->d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, g, MHD_OPTION_EXTERNAL_LOGGER, on_log, g,
        MHD_OPTION_SOCK_ADDR, v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(g->client_timeout > 1 ? g->client_timeout : 1),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)512, MHD_OPTION_NOTIFY_COMPLETED, on_completed, g,
        MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return prl_error_set(PRL_ERR_IO, "cannot serve HTTP on %s (in use, or not this host's)",
                             bind);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(h->bound, sizeof h->bound, v6 ? "http://[%s]:%u" : "http://%s:%u", host,
             di ? (unsigned)di->port : (unsigned)port);
    snprintf(bound, n, "%s", h->bound);
    *out = h;
    return PRL_OK;
}

void gw_http_stop(gw_http *h)
{
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
