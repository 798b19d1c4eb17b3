/*
** compare.c — the drivers of prl diagnose: the train path against prl's infer path or against
** an external dump, op by op through the tensor hooks, plus routes and log-probs.
**
** Infer side: sequences run in groups of max_batch through prl_infer_generate (prefill of the
** prompt, then the response teacher-forced one decode step per token, the way a rollout
** produced it); a hook copies every op's rows into a per-request buffer [request][position]
** (prl_infer_hook_rows says which row is which). Then each sequence of the group runs through
** the train path (B = 1), whose hook compares each op, as it is computed, with the buffered
** rows: train-side tensors are never stored. The last token is never fed to the infer path,
** so ops are compared on positions [0, n − 1).
**
** External side: the same train hook reads the op from DIR/seq-<i>.safetensors instead.
*/
#include "diagnose/diagnose.h"

#include "engine/ops.h" /* prl_logprob_forward: the train path's own log-softmax */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ sequences ------- */

prl_status prl_diag_check_seqs(const prl_model *m, const prl_diag_seq *seqs, int n)
{
    const prl_config *c = &m->cfg;
    if (n < 1) return prl_error_set(PRL_ERR_ARG, "no sequences to diagnose");
    for (int i = 0; i < n; i++) {
        const prl_diag_seq *s = &seqs[i];
        const char *lb = s->label ? s->label : "sequence";
        if (s->n < 2)
            return prl_error_set(PRL_ERR_RANGE, "%s: %d tokens; a sequence needs at least 2", lb,
                                 s->n);
        if (s->n > c->max_position_embeddings)
            return prl_error_set(PRL_ERR_RANGE,
                                 "%s: %d tokens exceed the context "
                                 "(max_position_embeddings %d)",
                                 lb, s->n, c->max_position_embeddings);
        if (s->prompt_len < 1 || s->prompt_len >= s->n)
            return prl_error_set(PRL_ERR_RANGE,
                                 "%s: prompt length %d not in [1, %d) (at least one "
                                 "response token is needed)",
                                 lb, s->prompt_len, s->n);
        for (int t = 0; t < s->n; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= c->vocab_size)
                return prl_error_set(PRL_ERR_RANGE,
                                     "%s: token id %d at position %d out of the "
                                     "vocabulary [0, %d)",
                                     lb, s->tokens[t], t, c->vocab_size);
    }
    return PRL_OK;
}

/* ------------------------------------------------------------------ report ---------- */

void prl_diag_report_free(prl_diag_report *r)
{
    if (!r) return;
    free(r->ops);
    free(r->routing);
    memset(r, 0, sizeof *r);
}

/* Index of op `name` in the report, appended on first sight (so ops keep the train path's
** execution order); -1 when out of memory. */
static int report_op(prl_diag_report *r, const char *name)
{
    for (int i = 0; i < r->n_ops; i++)
        if (!strcmp(r->ops[i].name, name)) return i;
    prl_diag_op *ops = realloc(r->ops, (size_t)(r->n_ops + 1) * sizeof *ops);
    if (!ops) return -1;
    r->ops = ops;
    prl_diag_op *op = &ops[r->n_ops];
    memset(op, 0, sizeof *op);
    snprintf(op->name, sizeof op->name, "%s", name);
    if (sscanf(name, "L%d.", &op->layer) != 1) op->layer = -1;
    return r->n_ops++;
}

static void report_finish(prl_diag_report *r)
{
    r->first = -1;
    for (int i = 0; i < r->n_ops && r->first < 0; i++) {
        const prl_diag_op *op = &r->ops[i];
        if (!op->missing && op->count + op->nonfinite > 0 &&
            !(prl_diag_op_rel_l2(op) <= r->threshold))
            r->first = i;
    }
}

/* Routing slots, one per MoE layer in layer order. */
static prl_status report_routing_init(prl_diag_report *r, const prl_model *m)
{
    r->n_routing = m->n_moe;
    r->routing = calloc((size_t)(m->n_moe > 0 ? m->n_moe : 1), sizeof *r->routing);
    if (!r->routing) return prl_error_set(PRL_ERR_NOMEM, "routing statistics");
    for (int l = 0, i = 0; l < m->cfg.num_hidden_layers; l++)
        if (prl_config_is_moe(&m->cfg, l)) r->routing[i++].layer = l;
    return PRL_OK;
}

/* ------------------------------------------------------------------ train side ------ */

/* The other side's rows of op `name` ([*rows][cols]) for the current sequence, NULL when it
** has none (or on an error, which it records in *err). */
typedef const float *(*other_tensor_fn)(void *ctx, const char *name, int64_t cols, int64_t *rows,
                                        prl_status *err);

typedef struct train_hook_ctx {
    prl_diag_report *rep;
    other_tensor_fn tensor;
    void *ctx;
    prl_status err;
} train_hook_ctx;

static int train_hook(void *user, const char *name, const prl_real *data, int ndim,
                      const int64_t *shape)
{
    train_hook_ctx *c = user;
    int i = report_op(c->rep, name);
    if (i < 0) {
        c->err = prl_error_set(PRL_ERR_NOMEM, "op table");
        return 1;
    }
    int64_t rows = 0, cols = ndim == 2 ? shape[1] : 1;
    const float *b = c->tensor(c->ctx, name, cols, &rows, &c->err);
    if (c->err) return 1;
    if (!b) {
        c->rep->ops[i].missing = 1;
        return 0;
    }
    if (rows > shape[0]) rows = shape[0];
    prl_diag_op_add(&c->rep->ops[i], data, b, (size_t)rows * (size_t)cols);
    return 0;
}

/* One sequence through the train path (B = 1) with `hook`: lp[t] = log p(tokens[t+1]) for
** t < n − 1; routes (may be NULL) get [n_moe][n][K]. */
static prl_status train_pass(prl_model *m, const prl_diag_seq *s, double tau, prl_tensor_hook hook,
                             void *user, float *lp, int32_t *routes)
{
    int32_t *targets = malloc((size_t)s->n * sizeof *targets);
    if (!targets) return prl_error_set(PRL_ERR_NOMEM, "targets of %s", s->label);
    for (int t = 0; t < s->n; t++) targets[t] = t + 1 < s->n ? s->tokens[t + 1] : -1;
    prl_batch b = {.B = 1, .T = s->n, .tokens = s->tokens, .targets = targets, .temperature = tau};
    prl_model_set_hook(m, hook, user);
    prl_status rc = prl_model_logprobs(m, &b, lp);
    prl_model_set_hook(m, NULL, NULL);
    free(targets);
    if (rc) return prl_error_wrap(rc, "%s: train path: ", s->label);
    if (routes)
        memcpy(routes, prl_model_routes(m),
               (size_t)m->n_moe * s->n * m->cfg.num_experts_per_tok * sizeof *routes);
    return PRL_OK;
}

/* Response log-probs of the train pass: out[t − P] = lp[t − 1] for t in [P, n). */
static void response_lp(const prl_diag_seq *s, const float *lp, float *out)
{
    for (int t = s->prompt_len; t < s->n; t++) out[t - s->prompt_len] = lp[t - 1];
}

/* ------------------------------------------------------------------ infer side ------ */

typedef struct cap_entry {
    char name[64];
    int64_t cols;
    float *data; /* [slots][tmax][cols] */
} cap_entry;

/* The infer path's op rows of one prl_infer_generate call, by request and position. */
typedef struct capture {
    const prl_infer *eng;
    int slots, tmax;
    int n;
    cap_entry *e;
    int failed;
    int req; /* the request prl_diag's train hook is comparing (capture_tensor) */
    int64_t rows;
} capture;

static cap_entry *capture_entry(capture *c, const char *name, int64_t cols)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].name, name)) return c->e[i].cols == cols ? &c->e[i] : NULL;
    cap_entry *e = realloc(c->e, (size_t)(c->n + 1) * sizeof *e);
    if (!e) return NULL;
    c->e = e;
    e = &c->e[c->n];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->cols = cols;
    e->data = calloc((size_t)c->slots * c->tmax * (size_t)cols, sizeof(float));
    if (!e->data) return NULL;
    c->n++;
    return e;
}

static int capture_hook(void *user, const char *name, const prl_real *data, int ndim,
                        const int64_t *shape)
{
    capture *c = user;
    int64_t cols = ndim == 2 ? shape[1] : 1;
    cap_entry *e = capture_entry(c, name, cols);
    if (!e) {
        c->failed = 1;
        return 0;
    }
    const int32_t *req, *pos;
    prl_infer_hook_rows(c->eng, &req, &pos);
    for (int64_t r = 0; r < shape[0]; r++)
        if (req[r] >= 0 && req[r] < c->slots && pos[r] >= 0 && pos[r] < c->tmax)
            memcpy(e->data + ((size_t)req[r] * c->tmax + pos[r]) * cols, data + r * cols,
                   (size_t)cols * sizeof(float));
    return 0;
}

static const float *capture_tensor(void *ctx, const char *name, int64_t cols, int64_t *rows,
                                   prl_status *err)
{
    capture *c = ctx;
    (void)err;
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].name, name) && c->e[i].cols == cols) {
            *rows = c->rows;
            return c->e[i].data + (size_t)c->req * c->tmax * cols;
        }
    return NULL;
}

static void capture_free(capture *c)
{
    for (int i = 0; i < c->n; i++) free(c->e[i].data);
    free(c->e);
    memset(c, 0, sizeof *c);
}

static void describe_infer(char *out, size_t n, const prl_infer_options *io, int threads)
{
    char knobs[128];
    prl_infer_options_describe(io, knobs, sizeof knobs);
    snprintf(out, n, "infer %s batch=%d threads=%d", knobs, io->max_batch,
             threads > 0 ? threads : prl_pool_threads());
}

/* Requests of sequences [g0, g1): prefill the prompt, teacher-force the response. */
static void make_requests(const prl_diag_seq *seqs, int g0, int g1, prl_gen_request *q)
{
    for (int i = g0; i < g1; i++)
        q[i - g0] = (prl_gen_request){.prompt = seqs[i].tokens,
                                      .prompt_len = seqs[i].prompt_len,
                                      .seq_id = (uint64_t)i,
                                      .forced = seqs[i].tokens + seqs[i].prompt_len,
                                      .n_forced = seqs[i].n - seqs[i].prompt_len};
}

static int max_len_of(const prl_diag_seq *seqs, int n)
{
    int mx = 2;
    for (int i = 0; i < n; i++) mx = seqs[i].n > mx ? seqs[i].n : mx;
    return mx;
}

/* Work buffers of one sequence. */
typedef struct seq_bufs {
    float *lp, *lp_train, *lp_other;      /* [maxn] */
    int32_t *routes_train, *routes_other; /* [n_moe][maxn][K] */
} seq_bufs;

static prl_status seq_bufs_init(seq_bufs *b, const prl_model *m, int maxn)
{
    size_t nr = (size_t)(m->n_moe > 0 ? m->n_moe : 1) * maxn * m->cfg.num_experts_per_tok;
    b->lp = malloc((size_t)maxn * sizeof(float));
    b->lp_train = malloc((size_t)maxn * sizeof(float));
    b->lp_other = malloc((size_t)maxn * sizeof(float));
    b->routes_train = malloc(nr * sizeof(int32_t));
    b->routes_other = malloc(nr * sizeof(int32_t));
    if (!b->lp || !b->lp_train || !b->lp_other || !b->routes_train || !b->routes_other)
        return prl_error_set(PRL_ERR_NOMEM, "buffers for sequences of %d tokens", maxn);
    return PRL_OK;
}

static void seq_bufs_free(seq_bufs *b)
{
    free(b->lp), free(b->lp_train), free(b->lp_other), free(b->routes_train), free(b->routes_other);
}

/* Routes of an infer result: [n_route_tokens][n_moe][K] into out. */
static prl_status infer_routes(const prl_model *m, const prl_gen_result *r, const prl_diag_seq *s,
                               int32_t *out)
{
    size_t n_ids = (size_t)r->n_route_tokens * m->n_moe * m->cfg.num_experts_per_tok;
    prl_status rc = prl_routes_unpack(out, r->routes, n_ids, m->cfg.n_routed_experts);
    return rc ? prl_error_wrap(rc, "%s: infer routes: ", s->label) : PRL_OK;
}

/* Compare one sequence's routes: train [n_moe][n][K], other [tokens][n_moe][K]. */
static void add_routes(prl_diag_report *rep, const prl_model *m, const prl_diag_seq *s,
                       const int32_t *train, const int32_t *other, int tokens)
{
    int K = m->cfg.num_experts_per_tok, nm = m->n_moe;
    for (int i = 0; i < nm; i++)
        prl_diag_routing_add(&rep->routing[i], train + (size_t)i * s->n * K, (size_t)K,
                             other + (size_t)i * K, (size_t)nm * K, tokens, K);
}

/* One group of sequences through the infer path; results[i − g0] per sequence. */
static prl_status infer_group(prl_infer *eng, const prl_diag_seq *seqs, int g0, int g1, double tau,
                              prl_gen_result *res)
{
    prl_gen_request *q = malloc((size_t)(g1 - g0) * sizeof *q);
    if (!q) return prl_error_set(PRL_ERR_NOMEM, "requests");
    make_requests(seqs, g0, g1, q);
    prl_sample_params sp;
    prl_sample_params_default(&sp);
    sp.temperature = tau;
    prl_status rc = prl_infer_generate(eng, q, g1 - g0, &sp, res, NULL, NULL);
    free(q);
    return rc ? prl_error_wrap(rc, "infer path, sequences %s..%s: ", seqs[g0].label,
                               seqs[g1 - 1].label)
              : PRL_OK;
}

/* Infer log-probs of the response: out[t − P] for t in [P, n). */
static void infer_response_lp(const prl_diag_seq *s, const prl_gen_result *r, float *out)
{
    for (int t = s->prompt_len; t < s->n; t++)
        out[t - s->prompt_len] = r->logprobs[t - s->prompt_len];
}

/* Build the infer engine for (io, threads) over sequences of up to maxn tokens. */
static prl_status infer_open(prl_infer **eng, const prl_model *m, const prl_infer_options *io,
                             int threads, int maxn)
{
    if (threads > 0 && threads != prl_pool_threads()) prl_blas_set_threads(threads);
    prl_infer_options o = *io;
    o.max_len = maxn;
    return prl_infer_init(eng, m, &o);
}

prl_status prl_diag_compare_infer(prl_model *m, const prl_infer_options *io, int threads,
                                  const prl_diag_seq *seqs, int n, double threshold,
                                  double temperature, prl_diag_report *out)
{
    memset(out, 0, sizeof *out);
    prl_status rc = prl_diag_check_seqs(m, seqs, n);
    if (rc) return rc;
    int maxn = max_len_of(seqs, n), batch = io->max_batch > 0 ? io->max_batch : 1;
    out->threshold = threshold, out->temperature = temperature, out->n_seqs = n;
    describe_infer(out->other, sizeof out->other, io, threads);
    prl_infer *eng = NULL;
    seq_bufs sb = {0};
    capture cap = {0};
    prl_gen_result *res = calloc((size_t)batch, sizeof *res);
    rc = res ? report_routing_init(out, m) : prl_error_set(PRL_ERR_NOMEM, "results");
    if (!rc) rc = seq_bufs_init(&sb, m, maxn);
    if (!rc) rc = infer_open(&eng, m, io, threads, maxn);
    if (!rc && prl_infer_fault(eng))
        snprintf(out->fault, sizeof out->fault, "%s", prl_infer_fault(eng));
    cap = (capture){.eng = eng, .slots = batch, .tmax = maxn};
    for (int g0 = 0; !rc && g0 < n; g0 += batch) {
        int g1 = g0 + batch < n ? g0 + batch : n;
        prl_infer_set_hook(eng, capture_hook, &cap);
        rc = infer_group(eng, seqs, g0, g1, temperature, res);
        prl_infer_set_hook(eng, NULL, NULL);
        if (!rc && cap.failed) rc = prl_error_set(PRL_ERR_NOMEM, "captured infer tensors");
        for (int i = g0; !rc && i < g1; i++) {
            const prl_diag_seq *s = &seqs[i];
            const prl_gen_result *r = &res[i - g0];
            cap.req = i - g0, cap.rows = s->n - 1;
            train_hook_ctx hc = {.rep = out, .tensor = capture_tensor, .ctx = &cap};
            rc = train_pass(m, s, temperature, train_hook, &hc, sb.lp, sb.routes_train);
            if (!rc && hc.err) rc = hc.err;
            if (!rc) rc = infer_routes(m, r, s, sb.routes_other);
            if (rc) break;
            add_routes(out, m, s, sb.routes_train, sb.routes_other, r->n_route_tokens);
            response_lp(s, sb.lp, sb.lp_train);
            infer_response_lp(s, r, sb.lp_other);
            prl_diag_logprob_add(&out->lp, sb.lp_train, sb.lp_other, s->n - s->prompt_len);
            out->n_tokens += s->n;
        }
        for (int i = g0; i < g1; i++) prl_gen_result_free(&res[i - g0]);
    }
    capture_free(&cap);
    prl_infer_free(eng);
    seq_bufs_free(&sb);
    free(res);
    if (rc) {
        prl_diag_report_free(out);
        return rc;
    }
    report_finish(out);
    return PRL_OK;
}

/* ------------------------------------------------------------------ external side --- */

typedef struct ext_ctx {
    prl_safetensors st;
    const char *path;
    float *buf;
    size_t cap;
} ext_ctx;

/* Tensor `name` of the current dump file as float [rows][cols] (in ext->buf). */
static const float *ext_tensor(void *ctx, const char *name, int64_t cols, int64_t *rows,
                               prl_status *err)
{
    ext_ctx *x = ctx;
    const prl_safetensors_tensor *t = prl_safetensors_find(&x->st, name);
    if (!t) return NULL;
    if (t->ndim != 2 || t->shape[1] != cols) {
        *err = prl_error_set(PRL_ERR_FORMAT,
                             "%s: tensor %s has %d dims (last %lld); expected "
                             "[tokens, %lld]",
                             x->path, name, t->ndim,
                             (long long)(t->ndim ? t->shape[t->ndim - 1] : 0), (long long)cols);
        return NULL;
    }
    if (t->numel > x->cap) {
        float *b = realloc(x->buf, t->numel * sizeof *b);
        if (!b) {
            *err = prl_error_set(PRL_ERR_NOMEM, "%s: tensor %s", x->path, name);
            return NULL;
        }
        x->buf = b, x->cap = t->numel;
    }
    if ((*err = prl_safetensors_read_f32(&x->st, name, t->shape, 2, x->buf))) return NULL;
    *rows = t->shape[0];
    return x->buf;
}

/* An I32 tensor of exactly `numel` elements into out (unaligned little-endian data). */
static prl_status ext_read_i32(const ext_ctx *x, const char *name, size_t numel, int32_t *out,
                               int *present)
{
    const prl_safetensors_tensor *t = prl_safetensors_find(&x->st, name);
    *present = t != NULL;
    if (!t) return PRL_OK;
    if (t->dtype != PRL_DTYPE_I32 || t->numel != numel)
        return prl_error_set(PRL_ERR_FORMAT,
                             "%s: tensor %s must be I32 with %zu elements (has %s, "
                             "%zu)",
                             x->path, name, numel, prl_dtype_name(t->dtype), t->numel);
    memcpy(out, t->data, numel * sizeof *out);
    return PRL_OK;
}

/* The dump's tokens must be the sequence's. */
static prl_status ext_check_tokens(const ext_ctx *x, const prl_diag_seq *s, int32_t *scratch)
{
    const prl_safetensors_tensor *t = prl_safetensors_find(&x->st, "tokens");
    if (t && t->numel != (size_t)s->n)
        return prl_error_set(PRL_ERR_FORMAT,
                             "%s: %zu tokens, but %s has %d: the dump is of other "
                             "tokens",
                             x->path, t->numel, s->label, s->n);
    int present;
    prl_status rc = ext_read_i32(x, "tokens", (size_t)s->n, scratch, &present);
    if (rc) return rc;
    if (!present)
        return prl_error_set(PRL_ERR_FORMAT, "%s: no `tokens` tensor (I32 [%d]) for %s", x->path,
                             s->n, s->label);
    for (int t = 0; t < s->n; t++)
        if (scratch[t] != s->tokens[t])
            return prl_error_set(PRL_ERR_FORMAT,
                                 "%s: token %d is %d, but %s has %d there: the dump "
                                 "is of other tokens",
                                 x->path, t, scratch[t], s->label, s->tokens[t]);
    return PRL_OK;
}

/* Routes L<l>.moe.routes [n][K] of every MoE layer into out [n][n_moe][K]; *have = 0 if any
** layer lacks them. */
static prl_status ext_routes(const ext_ctx *x, const prl_model *m, const prl_diag_seq *s,
                             int32_t *out, int32_t *scratch, int *have)
{
    int K = m->cfg.num_experts_per_tok, nm = m->n_moe;
    *have = nm > 0;
    for (int l = 0, i = 0; l < m->cfg.num_hidden_layers && *have; l++) {
        if (!prl_config_is_moe(&m->cfg, l)) continue;
        char name[64];
        snprintf(name, sizeof name, "L%d.moe.routes", l);
        prl_status rc = ext_read_i32(x, name, (size_t)s->n * K, scratch, have);
        if (rc) return rc;
        for (int t = 0; *have && t < s->n; t++)
            for (int k = 0; k < K; k++) {
                int32_t v = scratch[t * K + k];
                if (v < 0 || v >= m->cfg.n_routed_experts)
                    return prl_error_set(PRL_ERR_FORMAT,
                                         "%s: %s[%d][%d] = %d is not an expert in "
                                         "[0, %d)",
                                         x->path, name, t, k, v, m->cfg.n_routed_experts);
                out[((size_t)t * nm + i) * K + k] = v;
            }
        i++;
    }
    return PRL_OK;
}

/* Log-probs of the response from the dump's final.logits; *have = 0 without them. */
static prl_status ext_logprobs(ext_ctx *x, const prl_model *m, const prl_diag_seq *s, double tau,
                               float *out, int *have)
{
    int64_t rows = 0;
    prl_status err = PRL_OK;
    const float *lg = ext_tensor(x, "final.logits", m->cfg.vocab_size, &rows, &err);
    *have = lg != NULL;
    if (err || !lg) return err;
    if (rows < s->n - 1)
        return prl_error_set(PRL_ERR_FORMAT, "%s: final.logits has %lld rows for %d tokens",
                             x->path, (long long)rows, s->n);
    for (int t = s->prompt_len; t < s->n; t++) {
        prl_real lse;
        out[t - s->prompt_len] = (float)prl_logprob_forward(
            &lse, lg + (size_t)(t - 1) * m->cfg.vocab_size, m->cfg.vocab_size, s->tokens[t], tau);
    }
    return PRL_OK;
}

/* Sequence i against DIR/seq-<i>.safetensors. */
static prl_status ext_sequence(prl_model *m, const char *dir, int i, const prl_diag_seq *s,
                               double tau, ext_ctx *x, seq_bufs *sb, int32_t *scratch,
                               prl_diag_report *out, int *any_routes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/seq-%d.safetensors", dir, i);
    x->path = path;
    prl_status rc = prl_safetensors_open(&x->st, path);
    if (rc) return prl_error_wrap(rc, "external dump for %s: ", s->label);
    int have_routes = 0, have_lp = 0;
    rc = ext_check_tokens(x, s, scratch);
    train_hook_ctx hc = {.rep = out, .tensor = ext_tensor, .ctx = x};
    if (!rc) rc = train_pass(m, s, tau, train_hook, &hc, sb->lp, sb->routes_train);
    if (!rc && hc.err) rc = hc.err;
    if (!rc) rc = ext_routes(x, m, s, sb->routes_other, scratch, &have_routes);
    if (!rc && have_routes) add_routes(out, m, s, sb->routes_train, sb->routes_other, s->n);
    *any_routes |= have_routes;
    if (!rc) rc = ext_logprobs(x, m, s, tau, sb->lp_other, &have_lp);
    if (!rc && have_lp) {
        response_lp(s, sb->lp, sb->lp_train);
        prl_diag_logprob_add(&out->lp, sb->lp_train, sb->lp_other, s->n - s->prompt_len);
    }
    prl_safetensors_free(&x->st);
    return rc;
}

prl_status prl_diag_compare_external(prl_model *m, const char *dir, const prl_diag_seq *seqs, int n,
                                     double threshold, double temperature, prl_diag_report *out)
{
    memset(out, 0, sizeof *out);
    prl_status rc = prl_diag_check_seqs(m, seqs, n);
    if (rc) return rc;
    int maxn = max_len_of(seqs, n), any_routes = 0;
    out->threshold = threshold, out->temperature = temperature, out->n_seqs = n;
    snprintf(out->other, sizeof out->other, "external %s", dir);
    seq_bufs sb = {0};
    ext_ctx x = {0};
    int32_t *scratch = malloc((size_t)maxn * (m->cfg.num_experts_per_tok + 1) * sizeof *scratch);
    rc = scratch ? report_routing_init(out, m) : prl_error_set(PRL_ERR_NOMEM, "scratch");
    if (!rc) rc = seq_bufs_init(&sb, m, maxn);
    for (int i = 0; !rc && i < n; i++) {
        rc = ext_sequence(m, dir, i, &seqs[i], temperature, &x, &sb, scratch, out, &any_routes);
        out->n_tokens += seqs[i].n;
    }
    int compared = 0;
    for (int i = 0; !rc && i < out->n_ops; i++) compared |= !out->ops[i].missing;
    if (!rc && !compared)
        rc = prl_error_set(PRL_ERR_FORMAT,
                           "%s/seq-0.safetensors holds none of the hook tensors "
                           "(L0.attn.q, ..., final.logits): nothing to compare",
                           dir);
    free(x.buf);
    free(scratch);
    seq_bufs_free(&sb);
    if (rc) {
        prl_diag_report_free(out);
        return rc;
    }
    if (!any_routes) {
        free(out->routing);
        out->routing = NULL, out->n_routing = 0;
    }
    report_finish(out);
    return PRL_OK;
}

/* ------------------------------------------------------------------ sweep ----------- */

void prl_diag_sweep_free(prl_diag_sweep *s)
{
    if (!s) return;
    free(s->rows);
    memset(s, 0, sizeof *s);
}

/* The train path's response log-probs and routes of every sequence, computed once. */
typedef struct train_ref {
    float **lp;       /* [n][n_i − P_i] */
    int32_t **routes; /* [n][n_moe][n_i][K] */
    int n;
} train_ref;

static void train_ref_free(train_ref *t)
{
    for (int i = 0; i < t->n; i++)
        free(t->lp ? t->lp[i] : NULL), free(t->routes ? t->routes[i] : NULL);
    free(t->lp), free(t->routes);
    memset(t, 0, sizeof *t);
}

static prl_status train_ref_init(train_ref *t, prl_model *m, const prl_diag_seq *seqs, int n,
                                 double tau, seq_bufs *sb)
{
    t->lp = calloc((size_t)n, sizeof *t->lp);
    t->routes = calloc((size_t)n, sizeof *t->routes);
    if (!t->lp || !t->routes) return prl_error_set(PRL_ERR_NOMEM, "train log-probs");
    t->n = n;
    size_t K = (size_t)m->cfg.num_experts_per_tok;
    for (int i = 0; i < n; i++) {
        const prl_diag_seq *s = &seqs[i];
        size_t nr = (size_t)m->n_moe * s->n * K;
        t->lp[i] = malloc((size_t)(s->n - s->prompt_len) * sizeof(float));
        t->routes[i] = malloc((nr ? nr : 1) * sizeof(int32_t));
        if (!t->lp[i] || !t->routes[i]) return prl_error_set(PRL_ERR_NOMEM, "train log-probs");
        prl_status rc = train_pass(m, s, tau, NULL, NULL, sb->lp, t->routes[i]);
        if (rc) return rc;
        response_lp(s, sb->lp, t->lp[i]);
    }
    return PRL_OK;
}

/* One infer configuration against the reference: mean/max |d| and the routes that differ. */
static prl_status sweep_one(prl_model *m, const prl_infer_options *io, int threads,
                            const prl_diag_seq *seqs, int n, double tau, const train_ref *ref,
                            seq_bufs *sb, prl_diag_sweep_row *row)
{
    int maxn = max_len_of(seqs, n), batch = io->max_batch > 0 ? io->max_batch : 1;
    prl_infer *eng = NULL;
    prl_gen_result *res = calloc((size_t)batch, sizeof *res);
    prl_status rc =
        res ? infer_open(&eng, m, io, threads, maxn) : prl_error_set(PRL_ERR_NOMEM, "results");
    describe_infer(row->config, sizeof row->config, io, threads);
    prl_diag_logprob lp = {0};
    prl_diag_report rt = {0};
    if (!rc) rc = report_routing_init(&rt, m);
    for (int g0 = 0; !rc && g0 < n; g0 += batch) {
        int g1 = g0 + batch < n ? g0 + batch : n;
        rc = infer_group(eng, seqs, g0, g1, tau, res);
        for (int i = g0; !rc && i < g1; i++) {
            const prl_gen_result *r = &res[i - g0];
            rc = infer_routes(m, r, &seqs[i], sb->routes_other);
            if (rc) break;
            add_routes(&rt, m, &seqs[i], ref->routes[i], sb->routes_other, r->n_route_tokens);
            infer_response_lp(&seqs[i], r, sb->lp_other);
            prl_diag_logprob_add(&lp, ref->lp[i], sb->lp_other, seqs[i].n - seqs[i].prompt_len);
        }
        for (int i = g0; i < g1 && res; i++) prl_gen_result_free(&res[i - g0]);
    }
    long pairs = 0, differ = 0;
    for (int i = 0; i < rt.n_routing; i++)
        pairs += rt.routing[i].tokens, differ += rt.routing[i].differ;
    row->mean_abs = lp.n ? lp.sum_abs / lp.n : 0;
    row->max_abs = lp.max_abs;
    row->route_differ = pairs ? (double)differ / pairs : 0;
    prl_diag_report_free(&rt);
    prl_infer_free(eng);
    free(res);
    return rc;
}

static const char *const sweep_precisions[] = {"fp32", "bf16", "fp16"};
static const char *const sweep_mla[] = {"absorbed", "naive"};
static const char *const sweep_matmul[] = {"gemv", "gemm", "blas"}; /* prl_matmul_kind order */

/* The knob settings to try: each differs from the baseline in one knob. */
static int sweep_plan(const prl_infer_options *io, int threads, int n, prl_diag_sweep_row *rows,
                      prl_infer_options *opts, int *thr)
{
    int k = 0;
#define ADD(KNOB, VALUE, FIELD, V, T)                                                              \
    do {                                                                                           \
        opts[k] = *io, opts[k].FIELD = (V), thr[k] = (T);                                          \
        snprintf(rows[k].knob, sizeof rows[k].knob, "%s", KNOB);                                   \
        snprintf(rows[k].value, sizeof rows[k].value, "%s", VALUE);                                \
        k++;                                                                                       \
    } while (0)
    ADD("baseline", "", precision, io->precision, threads);
    for (int p = 0; p < 3; p++)
        if (p != (int)io->precision || io->w8a8) {
            ADD("precision", sweep_precisions[p], precision, (prl_precision)p, threads);
            opts[k - 1].w8a8 = 0, opts[k - 1].smooth = NULL; /* float instead of INT8 */
        }
    /* W8A8: each module kind alone quantized (the others fp32), its own share of the mismatch */
    static const char *const kinds[] = {"q_b_proj only", "o_proj only", "dense_mlp only",
                                        "routed_experts only", "bf16_rest only"};
    for (int b = 0; b < 5 && io->w8a8; b++) ADD("w8a8", kinds[b], w8a8, 1 << b, threads);
    for (int f = 0; f < 2; f++)
        if (f != (int)io->mla) ADD("mla", sweep_mla[f], mla, (prl_mla_form)f, threads);
    for (int x = 0; x < 3; x++)
        if (x != (int)io->matmul)
            ADD("matmul", sweep_matmul[x], matmul, (prl_matmul_kind)x, threads);
    int other_batch = io->max_batch > 1 ? 1 : (n < 8 ? n : 8);
    if (other_batch != io->max_batch) {
        char v[16];
        snprintf(v, sizeof v, "%d", other_batch);
        ADD("batch", v, max_batch, other_batch, threads);
    }
    int other_threads = threads > 1 ? 1 : 2;
    char v[16];
    snprintf(v, sizeof v, "%d", other_threads);
    ADD("threads", v, max_batch, io->max_batch, other_threads);
#undef ADD
    return k;
}

prl_status prl_diag_sweep_run(prl_model *m, const prl_infer_options *io, int threads,
                              const prl_diag_seq *seqs, int n, double temperature,
                              prl_diag_sweep *out)
{
    memset(out, 0, sizeof *out);
    prl_status rc = prl_diag_check_seqs(m, seqs, n);
    if (rc) return rc;
    if (threads <= 0) threads = prl_pool_threads();
    enum { MAX_ROWS = 16 };
    prl_infer_options opts[MAX_ROWS];
    int thr[MAX_ROWS];
    out->rows = calloc(MAX_ROWS, sizeof *out->rows);
    if (!out->rows) return prl_error_set(PRL_ERR_NOMEM, "sweep");
    out->n = sweep_plan(io, threads, n, out->rows, opts, thr);
    seq_bufs sb = {0};
    train_ref ref = {0};
    rc = seq_bufs_init(&sb, m, max_len_of(seqs, n));
    if (!rc) rc = train_ref_init(&ref, m, seqs, n, temperature, &sb);
    for (int i = 0; !rc && i < out->n; i++)
        rc = sweep_one(m, &opts[i], thr[i], seqs, n, temperature, &ref, &sb, &out->rows[i]);
    for (int i = 0; !rc && i < out->n; i++)
        out->rows[i].delta = out->rows[i].mean_abs - out->rows[0].mean_abs;
    if (prl_pool_threads() != threads) prl_blas_set_threads(threads);
    train_ref_free(&ref);
    seq_bufs_free(&sb);
    if (rc) prl_diag_sweep_free(out);
    return rc;
}
