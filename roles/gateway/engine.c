/*
** engine.c — the gateway's engine thread (internal.h): it owns the infer engine. Queued
** requests with the same sampling parameters (temperature, top_p, max_tokens, stop strings,
** top_logprobs) are generated together in one continuous batch; after every decode step the
** tokens so far are published under gw.mu, so streaming replies follow the generation. A
** policy version asked for (gw_engine_want) is loaded between batches, never during one.
**
** A choice's draws come from its sequence id (set by the caller from the episode's
** coordinates or the request's seed): the infer path samples a sequence the same way in any
** batch, so who else is being served never changes an answer.
*/
#include "roles/gateway/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void log_line(const char *fmt, const char *a)
{
    fprintf(stderr, "[gateway] ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
}

void gw_job_free(gw_job *j)
{
    if (!j) return;
    for (int i = 0; i < j->n; i++) {
        gw_choice *c = &j->c[i];
        free(c->prompt), free(c->tokens), free(c->logprobs), free(c->top_ids), free(c->top_lp);
        free(c->routes);
    }
    free(j);
}

/* ---------------------------------------------------------------- loading ---------- */

typedef struct loaded {
    prl_model *model;
    prl_tokenizer *tok;
    prl_infer *infer;
} loaded;

static void loaded_free(loaded *l)
{
    prl_infer_free(l->infer);
    prl_tokenizer_free(l->tok);
    if (l->model) prl_model_free(l->model);
    free(l->model);
    memset(l, 0, sizeof *l);
}

static void unload(gw *g)
{
    loaded l = {g->model, g->tok, g->infer};
    loaded_free(&l);
    g->infer = NULL, g->tok = NULL, g->model = NULL, g->version = -1;
}

/* Load the checkpoint at path off the lock, then swap it in under g->mu: the replies'
** threads decode and encode with g->tok under the lock. */
prl_status gw_engine_load(gw *g, int64_t v, const char *path)
{
    loaded l = {calloc(1, sizeof(prl_model)), NULL, NULL};
    prl_status rc = l.model ? prl_checkpoint_load_tokenizer(l.model, path, &l.tok)
                            : prl_error_set(PRL_ERR_NOMEM, "model");
    if (rc) { /* the loader frees what it made */
        free(l.model);
        return rc;
    }
    prl_infer_options io;
    if (!l.tok) rc = prl_error_set(PRL_ERR_FORMAT, "%s has no tokenizer.json", path);
    if (!rc) rc = prl_infer_options_preset(&io, g->precision);
    if (!rc) io.max_batch = g->max_batch, rc = prl_infer_init(&l.infer, l.model, &io);
    if (rc) {
        loaded_free(&l);
        return rc;
    }
    pthread_mutex_lock(&g->mu);
    loaded old = {g->model, g->tok, g->infer};
    g->model = l.model, g->tok = l.tok, g->infer = l.infer, g->version = v;
    g->max_len = prl_infer_get_options(l.infer)->max_len;
    snprintf(g->path, sizeof g->path, "%s", path);
    pthread_mutex_unlock(&g->mu);
    loaded_free(&old);
    return PRL_OK;
}

void gw_engine_want(gw *g, int64_t v, const char *path)
{
    if (v <= g->want_version) return; /* the newest version leased is served */
    g->want_version = v;
    snprintf(g->want_path, sizeof g->want_path, "%s", path);
    pthread_cond_broadcast(&g->cv);
}

/* ---------------------------------------------------------------- a batch ---------- */

typedef struct batch {
    gw *g;
    gw_job *jobs[256];
    int n_jobs;
    prl_gen_request *reqs;
    prl_gen_result *res;
    gw_choice **choice; /* [n_reqs] */
    int n_reqs;
    int top;
    double tau;
    int vocab;
    int32_t *top_ids; /* [n_reqs][cap][top]: filled by the logits hook */
    float *top_lp;
    int cap;
} batch;

static int same_params(const gw_job *a, const gw_job *b)
{
    if (a->temperature != b->temperature || a->top_p != b->top_p ||
        a->max_tokens != b->max_tokens || a->top != b->top || a->n_stop != b->n_stop)
        return 0;
    for (int i = 0; i < a->n_stop; i++)
        if (strcmp(a->stop[i], b->stop[i])) return 0;
    return 1;
}

/* Take the first queued job and every other with its parameters (under g->mu). */
static void take_batch(gw *g, batch *b)
{
    gw_job **pp = &g->queue, *first = g->queue;
    b->n_jobs = 0, b->n_reqs = 0;
    for (gw_job *j = g->queue; j && b->n_jobs < 256;) {
        gw_job *next = j->next;
        if (same_params(first, j) && b->n_reqs + j->n <= 256) {
            *pp = next;
            j->next = NULL;
            b->jobs[b->n_jobs++] = j;
            b->n_reqs += j->n;
        } else {
            pp = &j->next;
        }
        j = next;
    }
    g->queue_tail = NULL;
    for (gw_job *j = g->queue; j; j = j->next) g->queue_tail = j;
}

/* top_logprobs: the `top` most likely ids below the tokenizer's vocabulary at each generated
** position, log-probs under softmax(logits / τ) over the whole vocabulary (as the sampled
** token's own). Rows are mapped to (request, position) by the infer path. */
static int top_hook(void *user, const char *name, const prl_real *data, int ndim,
                    const int64_t *shape)
{
    batch *b = user;
    if (strcmp(name, "final.logits") || ndim != 2) return 0;
    const int32_t *req = NULL, *pos = NULL;
    prl_infer_hook_rows(b->g->infer, &req, &pos);
    int64_t R = shape[0], V = shape[1];
    for (int64_t r = 0; r < R; r++) {
        int k = req[r];
        if (k < 0 || k >= b->n_reqs) continue;
        int idx = pos[r] - b->reqs[k].prompt_len + 1; /* the generated token this row draws */
        if (idx < 0 || idx >= b->cap) continue;
        const prl_real *x = data + r * V;
        double mx = -INFINITY, z = 0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, x[v] / b->tau);
        for (int64_t v = 0; v < V; v++) z += exp(x[v] / b->tau - mx);
        double lz = mx + log(z);
        int32_t *ids = b->top_ids + ((size_t)k * b->cap + idx) * b->top;
        float *lp = b->top_lp + ((size_t)k * b->cap + idx) * b->top;
        for (int t = 0; t < b->top; t++) ids[t] = -1, lp[t] = -INFINITY;
        for (int64_t v = 0; v < V && v < b->vocab; v++) { /* insertion into the top list */
            float l = (float)(x[v] / b->tau - lz);
            if (l <= lp[b->top - 1]) continue;
            int t = b->top - 1;
            while (t > 0 && lp[t - 1] < l) ids[t] = ids[t - 1], lp[t] = lp[t - 1], t--;
            ids[t] = (int32_t)v, lp[t] = l;
        }
    }
    return 0;
}

/* After each decode step: copy every choice's new tokens into its job (under g->mu) and wake
** the streams. */
static void publish(void *user, int finished, int total, long tokens)
{
    batch *b = user;
    (void)finished, (void)total, (void)tokens;
    pthread_mutex_lock(&b->g->mu);
    for (int k = 0; k < b->n_reqs; k++) {
        gw_choice *c = b->choice[k];
        const prl_gen_result *r = &b->res[k];
        if (!r->tokens || r->n <= c->n) continue;
        memcpy(c->tokens + c->n, r->tokens + c->n, (size_t)(r->n - c->n) * sizeof *c->tokens);
        memcpy(c->logprobs + c->n, r->logprobs + c->n, (size_t)(r->n - c->n) * sizeof(float));
        if (b->top) {
            size_t at = ((size_t)k * b->cap + c->n) * b->top, cnt = (size_t)(r->n - c->n) * b->top;
            memcpy(c->top_ids + (size_t)c->n * b->top, b->top_ids + at, cnt * sizeof(int32_t));
            memcpy(c->top_lp + (size_t)c->n * b->top, b->top_lp + at, cnt * sizeof(float));
        }
        c->n = r->n;
    }
    pthread_cond_broadcast(&b->g->cv);
    pthread_mutex_unlock(&b->g->mu);
}

static prl_status run_batch(gw *g, batch *b)
{
    gw_job *j0 = b->jobs[0];
    b->reqs = calloc((size_t)b->n_reqs, sizeof *b->reqs);
    b->res = calloc((size_t)b->n_reqs, sizeof *b->res);
    b->choice = calloc((size_t)b->n_reqs, sizeof *b->choice);
    b->top = j0->top, b->cap = j0->max_tokens;
    b->tau = j0->temperature > 0 ? j0->temperature : 1.0;
    b->vocab = prl_tokenizer_vocab_size(g->tok);
    if (b->top) {
        size_t cells = (size_t)b->n_reqs * (size_t)b->cap * (size_t)b->top;
        b->top_ids = malloc(cells * sizeof *b->top_ids), b->top_lp = malloc(cells * sizeof(float));
    }
    if (!b->reqs || !b->res || !b->choice || (b->top && (!b->top_ids || !b->top_lp))) {
        prl_error_set(PRL_ERR_NOMEM, "a batch of %d sequences", b->n_reqs);
        pthread_mutex_lock(&g->mu); /* its requests fail; the gateway goes on */
        for (int i = 0; i < b->n_jobs; i++) {
            b->jobs[i]->done = -1;
            snprintf(b->jobs[i]->why, sizeof b->jobs[i]->why, "%s", prl_error_message());
        }
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return PRL_ERR_NOMEM;
    }
    int k = 0;
    for (int i = 0; i < b->n_jobs; i++)
        for (int c = 0; c < b->jobs[i]->n; c++, k++) {
            gw_choice *ch = &b->jobs[i]->c[c];
            b->reqs[k] = (prl_gen_request){.prompt = ch->prompt,
                                           .prompt_len = ch->prompt_len,
                                           .seq_id = ch->seq_id};
            b->choice[k] = ch;
        }
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    sp.temperature = j0->temperature, sp.top_p = j0->top_p, sp.max_new_tokens = j0->max_tokens;
    sp.seed = g->seed; /* as a rollout worker: with the sequence id, its draws */
    int32_t stops[2];
    sp.stop_ids = stops, sp.n_stop_ids = prl_tokenizer_stop_ids(g->tok, stops);
    sp.stop_strings = j0->stop, sp.n_stop_strings = j0->n_stop, sp.tok = g->tok;
    sp.vocab_limit = b->vocab;
    prl_infer_set_hook(g->infer, b->top ? top_hook : NULL, b);
    double t0 = prl_now();
    prl_status rc = prl_infer_generate(g->infer, b->reqs, b->n_reqs, &sp, b->res, publish, b);
    prl_infer_set_hook(g->infer, NULL, NULL);
    double dt = prl_now() - t0;
    if (!rc) publish(b, 0, 0, 0); /* a choice that stopped at its prefill has no decode step */
    pthread_mutex_lock(&g->mu);
    for (k = 0; !rc && k < b->n_reqs; k++) {
        gw_choice *ch = b->choice[k];
        ch->stop = (int)b->res[k].stop;
        ch->routes = b->res[k].routes, ch->routes_bytes = b->res[k].routes_bytes;
        ch->n_route_tokens = b->res[k].n_route_tokens;
        b->res[k].routes = NULL;
        g->tokens_out += (uint64_t)ch->n;
    }
    for (int i = 0; i < b->n_jobs; i++) {
        b->jobs[i]->done = rc ? -1 : 1;
        b->jobs[i]->version = g->version, b->jobs[i]->seconds = dt;
        if (rc) snprintf(b->jobs[i]->why, sizeof b->jobs[i]->why, "%s", prl_error_message());
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return rc;
}

static void batch_free(batch *b)
{
    for (int k = 0; b->res && k < b->n_reqs; k++) prl_gen_result_free(&b->res[k]);
    free(b->reqs), free(b->res), free(b->choice), free(b->top_ids), free(b->top_lp);
}

/* Fail every queued job (no policy could be loaded), under g->mu. */
static void fail_queue(gw *g, const char *why)
{
    for (gw_job *j = g->queue; j;) {
        gw_job *next = j->next;
        j->done = -1, j->next = NULL;
        snprintf(j->why, sizeof j->why, "%s", why);
        j = next;
    }
    g->queue = g->queue_tail = NULL;
    pthread_cond_broadcast(&g->cv);
}

static void *engine_main(void *arg)
{
    gw *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->quit) {
        if (g->want_version > g->version) { /* between batches only */
            int64_t v = g->want_version;
            char path[1024];
            snprintf(path, sizeof path, "%s", g->want_path);
            pthread_mutex_unlock(&g->mu);
            prl_status rc = gw_engine_load(g, v, path);
            if (rc) log_line("cannot load a policy version: %s", prl_error_message());
            else log_line("serving the policy version at %s", path);
            pthread_mutex_lock(&g->mu);
            if (rc) g->want_version = g->version, fail_queue(g, prl_error_message());
            continue;
        }
        if (!g->queue) {
            pthread_cond_wait(&g->cv, &g->mu);
            continue;
        }
        if (!g->infer) {
            fail_queue(g, "no policy version is loaded yet");
            continue;
        }
        batch b = {.g = g};
        take_batch(g, &b);
        pthread_mutex_unlock(&g->mu);
        if (run_batch(g, &b)) /* its requests got the error (500); the next batch may do */
            log_line("a batch failed: %s", prl_error_message());
        batch_free(&b);
        pthread_mutex_lock(&g->mu);
    }
    fail_queue(g, "the gateway is stopping");
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

prl_status gw_engine_start(gw *g)
{
    if (pthread_create(&g->thread, NULL, engine_main, g))
        return prl_error_set(PRL_ERR_IO, "cannot start the engine thread");
    g->thread_running = 1;
    return PRL_OK;
}

void gw_engine_stop(gw *g)
{
    pthread_mutex_lock(&g->mu);
    g->quit = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (g->thread_running) pthread_join(g->thread, NULL);
    g->thread_running = 0;
}

void gw_engine_free(gw *g) { unload(g); }

void gw_engine_submit(gw *g, gw_job *j)
{
    j->next = NULL, j->done = 0;
    if (g->queue_tail) g->queue_tail->next = j;
    else g->queue = j;
    g->queue_tail = j;
    g->requests++;
    pthread_cond_broadcast(&g->cv);
}

int gw_engine_wait(gw *g, gw_job *j, double timeout_s)
{
    (void)j; /* every change is broadcast: the caller looks at its job again */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + timeout_s;
    ts.tv_sec = (time_t)t, ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
    return pthread_cond_timedwait(&g->cv, &g->mu, &ts) == 0;
}

/* ---------------------------------------------------------------- text ------------- */

char *gw_choice_raw(gw *g, const gw_choice *c, int n, size_t *len)
{
    int32_t stops[2];
    int ns = prl_tokenizer_stop_ids(g->tok, stops), k = n;
    for (int s = 0; s < ns && k > 0; s++) /* a stop id only ever ends a turn */
        if (c->tokens[k - 1] == stops[s]) {
            k--;
            break;
        }
    char *text = NULL;
    return prl_tokenizer_decode(g->tok, c->tokens, (size_t)k, 0, &text, len) ? NULL : text;
}

char *gw_view(const char *s, size_t n, size_t *len)
{
    char *view = NULL; /* JSON carries the UTF-8 view of the bytes, as the verifier sees them */
    return prl_utf8_view(s, n, &view, len) < 0 ? NULL : view;
}

char *gw_choice_text(gw *g, const gw_job *j, const gw_choice *c, size_t *len)
{
    size_t rl = 0;
    char *raw = gw_choice_raw(g, c, c->n, &rl);
    char *view = raw ? gw_view(raw, gw_stop_cut(j, raw, rl), len) : NULL;
    free(raw);
    return view;
}

size_t gw_stop_cut(const gw_job *j, const char *text, size_t len)
{
    size_t cut = len;
    for (int i = 0; i < j->n_stop; i++) {
        const char *hit = memmem(text, len, j->stop[i], strlen(j->stop[i]));
        if (hit && (size_t)(hit - text) < cut) cut = (size_t)(hit - text);
    }
    return cut;
}
