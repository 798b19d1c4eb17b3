/*
** infer_generate.c — the infer path's generation driver, prl_infer_generate: continuous
** batching over the engine's cache slots (a free slot admits the next request: its prefill
** and first token; then one decode step for every active slot per pass, or a speculative
** step, infer_spec.c), token recording with log-probs and stop rules, teacher forcing, the
** results and the compact route codec they carry.
*/
#include "engine/infer_int.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ results --------- */

const char *prl_stop_reason_name(prl_stop_reason r)
{
    static const char *const names[] = {"stop_token", "length", "stop_string", "context", "forced"};
    return (unsigned)r < 5 ? names[r] : "?";
}

void prl_gen_result_free(prl_gen_result *r)
{
    if (!r) return;
    free(r->tokens), free(r->logprobs), free(r->prompt_logprobs), free(r->routes);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------------ routes ---------- */

int prl_routes_width(int n_experts) { return n_experts <= 256 ? 1 : 2; }

size_t prl_routes_pack(uint8_t *out, const int32_t *ids, size_t n_ids, int n_experts)
{
    int w = prl_routes_width(n_experts);
    for (size_t i = 0; i < n_ids; i++) {
        out[i * w] = (uint8_t)(ids[i] & 0xff);
        if (w == 2) out[i * w + 1] = (uint8_t)(ids[i] >> 8);
    }
    return n_ids * (size_t)w;
}

prl_status prl_routes_unpack(int32_t *ids, const uint8_t *in, size_t n_ids, int n_experts)
{
    int w = prl_routes_width(n_experts);
    for (size_t i = 0; i < n_ids; i++) {
        int32_t v = in[i * w] | (w == 2 ? in[i * w + 1] << 8 : 0);
        if (v >= n_experts)
            return prl_error_set(PRL_ERR_FORMAT, "route entry %zu: expert %d out of range [0, %d)",
                                 i, v, n_experts);
        ids[i] = v;
    }
    return PRL_OK;
}

/* ------------------------------------------------------------------ generation ------ */

static prl_status check_requests(const prl_infer *e, const prl_gen_request *reqs, int n)
{
    for (int i = 0; i < n; i++) {
        const prl_gen_request *q = &reqs[i];
        if (q->prompt_len < 1 || !q->prompt)
            return prl_error_set(PRL_ERR_ARG, "request %d: empty prompt", i);
        if (q->prompt_len >= e->opt.max_len)
            return prl_error_set(PRL_ERR_RANGE,
                                 "request %d: prompt of %d tokens leaves no room in "
                                 "the context of %d tokens",
                                 i, q->prompt_len, e->opt.max_len);
        if (q->forced && q->prompt_len + q->n_forced > e->opt.max_len)
            return prl_error_set(PRL_ERR_RANGE,
                                 "request %d: prompt %d + %d forced tokens exceed "
                                 "the context of %d tokens",
                                 i, q->prompt_len, q->n_forced, e->opt.max_len);
        for (int t = 0; t < q->prompt_len; t++)
            if (q->prompt[t] < 0 || q->prompt[t] >= e->V)
                return prl_error_set(PRL_ERR_RANGE,
                                     "request %d position %d: token id %d out of "
                                     "range [0, %d)",
                                     i, t, q->prompt[t], e->V);
        for (int t = 0; q->forced && t < q->n_forced; t++)
            if (q->forced[t] < 0 || q->forced[t] >= e->V)
                return prl_error_set(PRL_ERR_RANGE,
                                     "request %d forced token %d: id %d out of "
                                     "range [0, %d)",
                                     i, t, q->forced[t], e->V);
    }
    return PRL_OK;
}

static int has_stop_string(gen_state *g, const prl_gen_result *r)
{
    const prl_sample_params *sp = g->sp;
    if (sp->n_stop_strings == 0) return 0;
    char *text = NULL;
    size_t len = 0;
    if (prl_tokenizer_decode(sp->tok, r->tokens, (size_t)r->n, 0, &text, &len) != PRL_OK) return 0;
    int hit = 0;
    for (int i = 0; i < sp->n_stop_strings && !hit; i++)
        hit = memmem(text, len, sp->stop_strings[i], strlen(sp->stop_strings[i])) != NULL;
    free(text);
    return hit;
}

/* Take the next token of the request in `slot` from `logits`: sample (or the forced token),
** record it with its log-prob, decide whether the sequence stops. Returns 1 if it stopped. */
static int take_token_from(gen_state *g, int slot, const float *logits)
{
    prl_infer *e = g->e;
    slot_state *st = &e->slots[slot];
    const prl_gen_request *q = &g->reqs[st->req];
    prl_gen_result *r = &g->res[st->req];
    const prl_sample_params *sp = g->sp;
    int32_t y;
    if (q->forced) {
        y = q->forced[r->n];
    } else {
        prl_rng rng;
        prl_rng_init(&rng, sp->seed, q->seq_id, (uint64_t)st->len, 0, PRL_RNG_SAMPLE);
        y = infer__sample_row(logits, e->V, sp, &rng, g->cands);
    }
    return infer__record_token(g, slot, y, logits);
}

/* The draws of one decode step: rows of rb.logits to tokens and their log-probs. */
typedef struct draw_ctx {
    gen_state *g;
    int32_t *y;
    float *lp;
} draw_ctx;

/* Row r's token (sampled, or the forced one) and log-prob. A row's draw is seeded from its
** coordinates and reads only its own logits, so rows run on any thread in any order; each
** thread uses its own candidate scratch. */
static void draw_task(void *p, int r)
{
    draw_ctx *c = p;
    gen_state *g = c->g;
    prl_infer *e = g->e;
    const slot_state *st = &e->slots[e->rb.slot[r]];
    const prl_gen_request *q = &g->reqs[st->req];
    const prl_gen_result *res = &g->res[st->req];
    const prl_sample_params *sp = g->sp;
    const float *logits = e->rb.logits + (size_t)r * e->V;
    if (q->forced) {
        c->y[r] = q->forced[res->n];
    } else {
        prl_rng rng;
        prl_rng_init(&rng, sp->seed, q->seq_id, (uint64_t)st->len, 0, PRL_RNG_SAMPLE);
        cand *cs = g->cands + (size_t)prl_pool_worker() * e->V;
        c->y[r] = infer__sample_row_fast(logits, e->V, sp, &rng, cs);
    }
    c->lp[r] = infer__logprob(logits, e->V, c->y[r], sp->temperature > 0 ? sp->temperature : 1.0);
}

/* Record token y (at position st->len, drawn from `logits`) with its log-prob and decide
** whether the sequence stops. Returns 1 if it stopped. */
int infer__record_token(gen_state *g, int slot, int32_t y, const float *logits)
{
    double tau = g->sp->temperature > 0 ? g->sp->temperature : 1.0;
    return infer__record_token_lp(g, slot, y, infer__logprob(logits, g->e->V, y, tau));
}

int infer__record_token_lp(gen_state *g, int slot, int32_t y, float logprob)
{
    prl_infer *e = g->e;
    slot_state *st = &e->slots[slot];
    const prl_gen_request *q = &g->reqs[st->req];
    prl_gen_result *r = &g->res[st->req];
    const prl_sample_params *sp = g->sp;
    if (st->toks) st->toks[st->len] = y; /* speculative decoding: the sequence so far */
    r->tokens[r->n] = y;
    r->logprobs[r->n] = logprob;
    r->n++;
    st->last = y;
    int stop = -1;
    if (q->forced) {
        if (r->n == q->n_forced) stop = PRL_STOP_FORCED;
    } else {
        for (int i = 0; i < sp->n_stop_ids && stop < 0; i++)
            if (y == sp->stop_ids[i]) stop = PRL_STOP_TOKEN;
        if (stop < 0 && has_stop_string(g, r)) stop = PRL_STOP_STRING;
        if (stop < 0 && r->n >= sp->max_new_tokens) stop = PRL_STOP_LENGTH;
    }
    if (stop < 0 && st->len + 1 >= e->opt.max_len) stop = PRL_STOP_CONTEXT; /* no room to feed y */
    if (stop < 0) return 0;
    r->stop = (prl_stop_reason)stop;
    return 1;
}

static prl_status alloc_result(gen_state *g, int i)
{
    const prl_gen_request *q = &g->reqs[i];
    prl_gen_result *r = &g->res[i];
    int cap = q->forced ? (q->n_forced > 0 ? q->n_forced : 1) : g->sp->max_new_tokens;
    r->tokens = malloc((size_t)cap * sizeof *r->tokens);
    r->logprobs = malloc((size_t)cap * sizeof *r->logprobs);
    r->prompt_logprobs = calloc((size_t)q->prompt_len, sizeof *r->prompt_logprobs);
    r->prompt_len = q->prompt_len;
    if (!r->tokens || !r->logprobs || !r->prompt_logprobs)
        return prl_error_set(PRL_ERR_NOMEM, "results of request %d", i);
    return PRL_OK;
}

/* Pack the slot's routes into the result and free the slot. */
prl_status infer__finish(gen_state *g, int slot)
{
    prl_infer *e = g->e;
    slot_state *st = &e->slots[slot];
    prl_gen_result *r = &g->res[st->req];
    r->n_route_tokens = st->len;
    size_t n_ids = (size_t)st->len * e->n_moe * e->K;
    r->routes_bytes = n_ids * (size_t)prl_routes_width(e->E);
    r->routes = malloc(r->routes_bytes ? r->routes_bytes : 1);
    if (!r->routes) return prl_error_set(PRL_ERR_NOMEM, "routes of request %d", st->req);
    prl_routes_pack(r->routes, st->routes, n_ids, e->E);
    st->req = -1;
    return PRL_OK;
}

/* Whether request i may copy the caches of the request admitted just before it: the same
** prompt, no decode step since, and nothing that watches or extends a prefill's rows (tensor
** hooks see every row; the MTP modules keep per-slot states of their own). */
static int has_twin(const gen_state *g, int i)
{
    const prl_infer *e = g->e;
    if (g->twin_req < 0 || e->opt.no_shared_prefill || e->hook || e->Lm > 0) return 0;
    const prl_gen_request *a = &g->reqs[i], *b = &g->reqs[g->twin_req];
    return a->prompt_len == b->prompt_len &&
           !memcmp(a->prompt, b->prompt, (size_t)a->prompt_len * sizeof *a->prompt);
}

/* The prompt of request i through the trunk in `slot`; its last position's logits kept for
** a twin. Returns those logits. */
static const float *prefill(gen_state *g, int i, int slot)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    const prl_gen_request *q = &g->reqs[i];
    int P = q->prompt_len;
    for (int t = 0; t < P; t++)
        b->tok[t] = q->prompt[t], b->slot[t] = slot, b->pos[t] = t, b->req[t] = i;
    infer__forward_rows(e, P);
    infer__spec_admit(e, slot, q->prompt, P);
    double tau = g->sp->temperature > 0 ? g->sp->temperature : 1.0;
    prl_gen_result *r = &g->res[i];
    for (int t = 1; t < P; t++)
        r->prompt_logprobs[t] =
            infer__logprob(b->logits + (size_t)(t - 1) * e->V, e->V, q->prompt[t], tau);
    const float *last = b->logits + (size_t)(P - 1) * e->V;
    memcpy(g->twin_logits, last, (size_t)e->V * sizeof *last);
    g->twin_req = i, g->twin_slot = slot;
    return last;
}

/* Request i takes its twin's prefill: the same caches, log-probs and last logits. */
static const float *copy_twin(gen_state *g, int i, int slot)
{
    prl_infer *e = g->e;
    int P = g->reqs[i].prompt_len;
    infer__slot_copy(e, slot, g->twin_slot, P);
    memcpy(g->res[i].prompt_logprobs, g->res[g->twin_req].prompt_logprobs,
           (size_t)P * sizeof(float));
    g->twin_req = i, g->twin_slot = slot; /* the copy is as good a source as the original */
    e->spec.shared_prefills++;
    return g->twin_logits;
}

/* Prefill request i into a free slot (or copy its twin's) and take its first token. */
static prl_status admit(gen_state *g, int i, int slot, int *stopped)
{
    prl_infer *e = g->e;
    const prl_gen_request *q = &g->reqs[i];
    prl_status rc = alloc_result(g, i);
    if (rc) return rc;
    slot_state *st = &e->slots[slot];
    st->req = i;
    const float *last = has_twin(g, i) ? copy_twin(g, i, slot) : prefill(g, i, slot);
    st->len = q->prompt_len;
    e->spec.prefills++;
    prl_gen_result *r = &g->res[i];
    if (q->forced && q->n_forced == 0) { /* prompt log-probs only */
        r->stop = PRL_STOP_FORCED;
        *stopped = 1;
    } else {
        *stopped = take_token_from(g, slot, last);
    }
    infer__spec_prefill(g, slot); /* after the logits rows are read: it reuses the row buffers */
    return *stopped ? infer__finish(g, slot) : PRL_OK;
}

/* One decode step for every active slot (in slot order). */
static prl_status decode_step(gen_state *g, int *finished)
{
    prl_infer *e = g->e;
    rows_buf *b = &e->rb;
    int R = 0;
    for (int s = 0; s < e->opt.max_batch; s++) {
        slot_state *st = &e->slots[s];
        if (st->req < 0) continue;
        b->tok[R] = st->last, b->slot[R] = s, b->pos[R] = st->len, b->req[R] = st->req;
        R++;
    }
    if (R == 0) return PRL_OK;
    infer__forward_rows(e, R);
    for (int r = 0; r < R; r++) e->slots[b->slot[r]].len++;
    draw_ctx dc = {.g = g, .y = g->draw_y, .lp = g->draw_lp};
    prl_parallel_for(R, draw_task, &dc); /* rows in parallel; recorded below in slot order */
    for (int r = 0; r < R; r++) {
        int s = b->slot[r];
        if (infer__record_token_lp(g, s, dc.y[r], dc.lp[r])) {
            prl_status rc = infer__finish(g, s);
            if (rc) return rc;
            (*finished)++;
        }
    }
    return PRL_OK;
}

prl_status prl_infer_generate(prl_infer *e, const prl_gen_request *reqs, int n,
                              const prl_sample_params *sp, prl_gen_result *results,
                              prl_gen_progress progress, void *user)
{
    memset(results, 0, (size_t)n * sizeof *results);
    prl_status rc = prl_sample_params_check(sp, e->V);
    if (!rc) rc = check_requests(e, reqs, n);
    if (rc) return rc;
    if (prl_pool_threads() > e->att_threads)
        return prl_error_set(PRL_ERR_ARG,
                             "the pool grew to %d threads after the infer engine was "
                             "made for %d",
                             prl_pool_threads(), e->att_threads);
    gen_state g = {.e = e, .reqs = reqs, .sp = sp, .res = results, .twin_req = -1};
    g.cands = malloc((size_t)e->att_threads * e->V * sizeof *g.cands);
    g.twin_logits = malloc((size_t)e->V * sizeof *g.twin_logits);
    g.draw_y = malloc((size_t)e->opt.max_batch * sizeof *g.draw_y);
    g.draw_lp = malloc((size_t)e->opt.max_batch * sizeof *g.draw_lp);
    if (!g.cands || !g.twin_logits || !g.draw_y || !g.draw_lp) {
        free(g.cands), free(g.twin_logits), free(g.draw_y), free(g.draw_lp);
        return prl_error_set(PRL_ERR_NOMEM, "sampling scratch");
    }
    for (int s = 0; s < e->opt.max_batch; s++) e->slots[s].req = -1;
    int next = 0, finished = 0, active = 0;
    long tokens = 0;
    while (!rc && finished < n) {
        for (int s = 0; s < e->opt.max_batch && next < n && !rc; s++) {
            if (e->slots[s].req >= 0) continue;
            int stopped = 0;
            rc = admit(&g, next++, s, &stopped);
            tokens++;
            if (stopped) finished++, s--; /* the slot is free again */
        }
        if (rc) break;
        active = 0;
        for (int s = 0; s < e->opt.max_batch; s++) active += e->slots[s].req >= 0;
        if (active == 0) continue;
        double t0 = prl_now();
        g.twin_req = -1; /* the slots move on: a cache holds more than its prompt now */
        if (e->Lm > 0) {
            rc = infer__spec_step(&g, &finished, &tokens);
        } else {
            rc = decode_step(&g, &finished);
            tokens += active;
        }
        e->spec.passes++, e->spec.pass_s += prl_now() - t0;
        if (progress) progress(user, finished, n, tokens);
    }
    free(g.cands), free(g.twin_logits), free(g.draw_y), free(g.draw_lp);
    if (rc) {
        for (int i = 0; i < n; i++) prl_gen_result_free(&results[i]);
        for (int s = 0; s < e->opt.max_batch; s++) e->slots[s].req = -1;
    }
    return rc;
}
