/*
** sft.c — chat JSONL loading, seeded batching and the SFT training loop.
**
** Batch layout: B sequences of T positions, right-padded with <|pad|>, or with packing B rows
** each holding as many whole examples as fit (prl_batch.pos restarts at each). Position t of
** a sequence predicts token t+1, and is trained iff token t+1 has loss mask 1. The weight of
** each trained position is −1/(trained positions in the whole step), so the step's loss is
** the token-mean cross-entropy over all micro-batches of the step.
*/
#include "sft/sft.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Calls fn(user, line_no, messages array) for every non-blank line. */
typedef prl_status (*line_fn)(void *user, const char *path, int line_no, json_t *messages);

static prl_status for_each_chat(const char *path, line_fn fn, void *user)
{
    FILE *f = fopen(path, "rb");
    if (!f) return prl_error_set(PRL_ERR_IO, "cannot open %s: %m", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int line_no = 0;
    prl_status rc = PRL_OK;
    while (rc == PRL_OK && (len = getline(&line, &cap, f)) >= 0) {
        line_no++;
        size_t i = 0;
        while (i < (size_t)len &&
               (line[i] == ' ' || line[i] == '\t' || line[i] == '\n' || line[i] == '\r'))
            i++;
        if (i == (size_t)len) continue;
        json_error_t err;
        json_t *obj = json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES, &err);
        if (!obj) {
            rc = prl_error_set(PRL_ERR_FORMAT, "%s:%d: invalid JSON: %s (column %d)", path, line_no,
                               err.text, err.column);
            break;
        }
        json_t *msgs = json_object_get(obj, "messages");
        if (!json_is_object(obj) || !json_is_array(msgs) || json_array_size(msgs) == 0) {
            rc = prl_error_set(PRL_ERR_FORMAT,
                               "%s:%d: each line must be an object with a "
                               "non-empty \"messages\" array",
                               path, line_no);
        } else {
            size_t k;
            json_t *msg;
            json_array_foreach(msgs, k, msg)
            {
                json_t *role = json_object_get(msg, "role"),
                       *content = json_object_get(msg, "content");
                if (!json_is_string(role) || !json_is_string(content)) {
                    rc = prl_error_set(PRL_ERR_FORMAT,
                                       "%s:%d: message %zu needs string \"role\" "
                                       "and \"content\"",
                                       path, line_no, k);
                    break;
                }
            }
            if (rc == PRL_OK) rc = fn(user, path, line_no, msgs);
        }
        json_decref(obj);
    }
    free(line);
    if (rc == PRL_OK && ferror(f)) rc = prl_error_set(PRL_ERR_IO, "read error in %s", path);
    fclose(f);
    return rc;
}

typedef struct text_list {
    char **v;
    size_t n, cap;
} text_list;

static prl_status collect_texts(void *user, const char *path, int line_no, json_t *msgs)
{
    (void)path, (void)line_no;
    text_list *t = user;
    size_t k;
    json_t *msg;
    json_array_foreach(msgs, k, msg)
    {
        if (t->n == t->cap) {
            t->cap = t->cap ? 2 * t->cap : 256;
            char **v = realloc(t->v, t->cap * sizeof *v);
            if (!v) return prl_error_set(PRL_ERR_NOMEM, "reading texts");
            t->v = v;
        }
        t->v[t->n] = strdup(json_string_value(json_object_get(msg, "content")));
        if (!t->v[t->n]) return prl_error_set(PRL_ERR_NOMEM, "reading texts");
        t->n++;
    }
    return PRL_OK;
}

prl_status prl_sft_read_texts(const char *path, char ***texts, size_t *n_texts)
{
    text_list t = {0};
    prl_status rc = for_each_chat(path, collect_texts, &t);
    if (rc) {
        for (size_t i = 0; i < t.n; i++) free(t.v[i]);
        free(t.v);
        t = (text_list){0};
    }
    *texts = t.v;
    *n_texts = t.n;
    return rc;
}

typedef struct load_ctx {
    prl_sft_data *d;
    const prl_tokenizer *tok;
    int max_len, cap;
    unsigned flags;      /* the tokenizer's */
    unsigned mask_flags; /* PRL_SFT_MASK_ERRORS */
} load_ctx;

/* A boolean key of a message: 0 if absent; -1 (error set) if not a boolean or on a role it
** cannot mark. */
static int flag_of(json_t *msg, const char *key, const char *role, const char *path, int line_no,
                   size_t k)
{
    json_t *v = json_object_get(msg, key);
    if (!v) return 0;
    const char *r = json_string_value(json_object_get(msg, "role"));
    if (!json_is_boolean(v) || strcmp(r, role) != 0) {
        prl_error_set(PRL_ERR_FORMAT,
                      "%s:%d: message %zu: \"%s\" must be true or false, on a%s %s message "
                      "(docs/formats.md \"Masked steps\")",
                      path, line_no, k, key, role[0] == 'a' ? "n" : "", role);
        return -1;
    }
    return json_is_true(v);
}

/* Which assistant turns are rejected steps (no_loss[k] = 1): marked "mask": true, or answered
** by a tool message marked "error": true, or with PRL_SFT_MASK_ERRORS by one whose content
** starts with "error: " (the environment's rejection). Counts them into *n_masked. */
static prl_status mark_steps(json_t *msgs, const prl_chat_message *cm, uint8_t *no_loss,
                             size_t n_msgs, unsigned flags, const char *path, int line_no,
                             int *n_masked)
{
    for (size_t k = 0; k < n_msgs; k++) {
        json_t *msg = json_array_get(msgs, k);
        int mask = flag_of(msg, "mask", "assistant", path, line_no, k);
        int error = flag_of(msg, "error", "tool", path, line_no, k);
        if (mask < 0 || error < 0) return PRL_ERR_FORMAT;
        int rejected = error || ((flags & PRL_SFT_MASK_ERRORS) && !strcmp(cm[k].role, "tool") &&
                                 !strncmp(cm[k].content, "error: ", 7));
        if (mask) no_loss[k] = 1;
        if (rejected && k > 0 && !strcmp(cm[k - 1].role, "assistant")) no_loss[k - 1] = 1;
    }
    for (size_t k = 0; k < n_msgs; k++) *n_masked += no_loss[k];
    return PRL_OK;
}

static prl_status encode_line(void *user, const char *path, int line_no, json_t *msgs)
{
    load_ctx *c = user;
    size_t n_msgs = json_array_size(msgs);
    prl_chat_message *cm = calloc(n_msgs, sizeof *cm);
    uint8_t *no_loss = calloc(n_msgs, 1);
    if (!cm || !no_loss) {
        free(cm), free(no_loss);
        return prl_error_set(PRL_ERR_NOMEM, "encoding %s", path);
    }
    for (size_t k = 0; k < n_msgs; k++) {
        json_t *msg = json_array_get(msgs, k);
        cm[k].role = json_string_value(json_object_get(msg, "role"));
        cm[k].content = json_string_value(json_object_get(msg, "content"));
    }
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    int n_masked = 0;
    if (mark_steps(msgs, cm, no_loss, n_msgs, c->mask_flags, path, line_no, &n_masked)) {
        free(cm), free(no_loss); /* the error names the line */
        return PRL_ERR_FORMAT;
    }
    prl_status rc =
        prl_tokenizer_encode_chat_steps(c->tok, cm, n_msgs, no_loss, c->flags, &ids, &mask, &n);
    free(cm), free(no_loss);
    if (rc) return prl_error_wrap(rc, "%s:%d: ", path, line_no);
    prl_sft_data *d = c->d;
    if ((int)n > c->max_len) {
        n = (size_t)c->max_len;
        d->n_truncated++;
    }
    size_t trained = 0;
    for (size_t i = 1; i < n; i++) trained += mask[i];
    if (trained == 0) {
        free(ids);
        free(mask);
        return prl_error_set(PRL_ERR_FORMAT, "%s:%d: no assistant tokens to train on%s", path,
                             line_no, d->n_truncated ? " (after truncation)" : "");
    }
    if (d->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 256;
        prl_sft_example *ex = realloc(d->ex, (size_t)c->cap * sizeof *ex);
        if (!ex) {
            free(ids);
            free(mask);
            return prl_error_set(PRL_ERR_NOMEM, "loading %s", path);
        }
        d->ex = ex;
    }
    d->ex[d->n++] = (prl_sft_example){.ids = ids, .mask = mask, .n = (int)n};
    d->n_tokens += n;
    d->n_loss_tokens += trained;
    d->n_masked_steps += n_masked;
    return PRL_OK;
}

prl_status prl_sft_data_load(prl_sft_data *d, const char *path, const prl_tokenizer *tok,
                             int max_len, unsigned flags)
{
    memset(d, 0, sizeof *d);
    if (max_len < 2) return prl_error_set(PRL_ERR_ARG, "sequence length %d must be >= 2", max_len);
    load_ctx c = {.d = d,
                  .tok = tok,
                  .max_len = max_len,
                  .flags = flags & PRL_TOKENIZER_SPECIAL,
                  .mask_flags = flags & PRL_SFT_MASK_ERRORS};
    prl_status rc = for_each_chat(path, encode_line, &c);
    if (rc == PRL_OK && d->n == 0) rc = prl_error_set(PRL_ERR_FORMAT, "%s: no examples", path);
    if (rc) prl_sft_data_free(d);
    return rc;
}

void prl_sft_data_free(prl_sft_data *d)
{
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        free(d->ex[i].ids);
        free(d->ex[i].mask);
    }
    free(d->ex);
    memset(d, 0, sizeof *d);
}

/* ------------------------------------------------------------------ batching -------- */

/* Example index at global position g: a fresh seeded permutation per epoch, optionally
** grouped by length (prl_sft_config.group). */
typedef struct order {
    int *perm, *tmp;
    const prl_sft_data *d;
    int n, batch, group;
    int64_t epoch;
    uint64_t seed;
} order;

static void shuffle(int *v, int n, prl_rng *r)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(prl_rng_u64(r) % (uint64_t)(i + 1));
        int t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* Sort v[0..n) by example length, stable (insertion sort: windows are small). */
static void sort_by_length(int *v, int n, const prl_sft_data *d)
{
    for (int i = 1; i < n; i++) {
        int x = v[i], j = i;
        for (; j > 0 && d->ex[v[j - 1]].n > d->ex[x].n; j--) v[j] = v[j - 1];
        v[j] = x;
    }
}

/* One window of the grouped order: sorted by length, then its batches in a shuffled order. */
static void group_window(order *o, int w0, int w1, prl_rng *r)
{
    int n = w1 - w0, B = o->batch, nb = (n + B - 1) / B;
    sort_by_length(o->perm + w0, n, o->d);
    int *bi = o->tmp + n; /* batch order after the copy of the window */
    for (int k = 0; k < nb; k++) bi[k] = k;
    shuffle(bi, nb, r);
    memcpy(o->tmp, o->perm + w0, (size_t)n * sizeof(int));
    int at = w0;
    for (int k = 0; k < nb; k++)
        for (int i = bi[k] * B; i < (bi[k] + 1) * B && i < n; i++) o->perm[at++] = o->tmp[i];
}

static int order_at(order *o, int64_t g)
{
    int64_t epoch = g / o->n;
    if (epoch != o->epoch) {
        prl_rng r;
        prl_rng_init(&r, o->seed, (uint64_t)epoch, 0, 0, PRL_RNG_SHUFFLE);
        for (int i = 0; i < o->n; i++) o->perm[i] = i;
        shuffle(o->perm, o->n, &r);
        int W = o->group * o->batch;
        for (int w0 = 0; o->group > 0 && w0 < o->n; w0 += W)
            group_window(o, w0, w0 + W < o->n ? w0 + W : o->n, &r);
        o->epoch = epoch;
    }
    return o->perm[g % o->n];
}

/* Fill micro-batch `mb` of step `step` with rows of *T_out positions (c->seq, or with grouping
** the longest example rounded up to 8); ex[B] gets each row's example. Returns its
** trained-position count. */
static int fill_batch(prl_batch_buf *bb, int *ex, const prl_sft_data *d, const prl_sft_config *c,
                      order *o, int64_t step, int mb, int *T_out)
{
    int B = c->batch, T = c->seq, trained = 0, longest = 1;
    for (int i = 0; i < B; i++) {
        ex[i] = order_at(o, (step * c->accum + mb) * (int64_t)B + i);
        if (d->ex[ex[i]].n > longest) longest = d->ex[ex[i]].n;
    }
    if (c->group > 0 && (longest + 7) / 8 * 8 < T) T = (longest + 7) / 8 * 8;
    *T_out = T;
    for (int i = 0; i < B; i++) {
        const prl_sft_example *e = &d->ex[ex[i]];
        trained += prl_batch_buf_set_row(bb, T, i, e->ids, e->n < T ? e->n : T, e->mask);
    }
    return trained;
}

/* ------------------------------------------------------------------ packing -------- */

/* Example e at column c0 of row i of a packed view with T positions: its tokens, positions
** 0..n-1 (prl_batch.pos), and the targets of its own next tokens (its last position predicts
** nothing, not the next example's first token). Returns its trained-position count. */
static int pack_example(prl_batch_buf *bb, int32_t *pos, int T, int i, int c0,
                        const prl_sft_example *e, int n)
{
    int trained = 0;
    for (int t = 0; t < n; t++) {
        size_t idx = (size_t)i * T + c0 + t;
        int on = t + 1 < n && e->mask[t + 1];
        bb->tokens[idx] = e->ids[t];
        bb->targets[idx] = on ? e->ids[t + 1] : -1;
        bb->weights[idx] = 0;
        pos[idx] = t;
        trained += on;
    }
    return trained;
}

/* One packed micro-batch (prl_sft_config.pack) from order position *next on: B rows of
** c->seq positions, each filled greedily with the next examples while they fit, the rest
** padding. Advances *next past the examples used; bb NULL only advances it (a resumed run
** replays the packing of the steps before it). Returns the trained-position count. */
static int fill_packed(prl_batch_buf *bb, int32_t *pos, const prl_sft_data *d,
                       const prl_sft_config *c, order *o, int64_t *next)
{
    int B = c->batch, T = c->seq, trained = 0;
    for (int i = 0; i < B; i++) {
        int used = 0;
        for (;;) {
            const prl_sft_example *e = &d->ex[order_at(o, *next)];
            int n = e->n < T ? e->n : T;
            if (used > 0 && used + n > T) break;
            if (bb) trained += pack_example(bb, pos, T, i, used, e, n);
            used += n, ++*next;
            if (used == T) break;
        }
        if (!bb) continue;
        bb->lens[i] = used;
        for (int t = used; t < T; t++) {
            size_t idx = (size_t)i * T + t;
            bb->tokens[idx] = PRL_TOKEN_PAD, bb->targets[idx] = -1, bb->weights[idx] = 0;
            pos[idx] = -1;
        }
    }
    return trained;
}

prl_status prl_sft_train(prl_model *m, prl_optim *o, const prl_sft_data *d, const prl_sft_config *c,
                         prl_sft_progress_fn progress, void *user)
{
    if (c->batch < 1 || c->seq < 2 || c->steps < 0 || c->accum < 1 || c->log_every < 1 ||
        c->group < 0)
        return prl_error_set(PRL_ERR_ARG,
                             "sft: batch %d, seq %d, steps %d, accum %d, log_every "
                             "%d must be positive, group %d >= 0",
                             c->batch, c->seq, c->steps, c->accum, c->log_every, c->group);
    if (c->pack && c->group > 0)
        return prl_error_set(PRL_ERR_ARG, "sft: packing needs group 0 (group is %d)", c->group);
    int B = c->batch, T = c->seq;
    prl_batch_buf *bb = calloc((size_t)c->accum, sizeof *bb);
    int *Ts = calloc((size_t)c->accum, sizeof *Ts), *ex = malloc((size_t)B * sizeof *ex);
    order ord = {.perm = malloc((size_t)d->n * sizeof(int)),
                 .d = d,
                 .n = d->n,
                 .batch = B,
                 .group = c->group,
                 .epoch = -1,
                 .seed = c->seed};
    if (c->group > 0) /* a window's copy, then its batch order */
        ord.tmp = malloc(((size_t)c->group * B + (size_t)c->group + 1) * sizeof(int));
    prl_status rc = bb && Ts && ex && ord.perm && (c->group == 0 || ord.tmp)
                        ? PRL_OK
                        : prl_error_set(PRL_ERR_NOMEM, "sft batches");
    for (int a = 0; rc == PRL_OK && a < c->accum; a++) rc = prl_batch_buf_init(&bb[a], B, T);
    int32_t *pos = NULL; /* packing: the positions of every micro-batch, [accum][B*T] */
    int64_t next = 0;    /* packing: order position of the next example */
    if (rc == PRL_OK && c->pack && !(pos = malloc((size_t)c->accum * B * T * sizeof *pos)))
        rc = prl_error_set(PRL_ERR_NOMEM, "sft packed batches");
    for (int64_t s = 0; rc == PRL_OK && c->pack && s < o->step; s++)
        for (int a = 0; a < c->accum; a++) fill_packed(NULL, NULL, d, c, &ord, &next);
    int whole_run = c->run_start_s > 0; /* this call is one chunk of a longer run */
    double t_start = whole_run ? c->run_start_s : prl_now();
    int64_t first = whole_run ? c->run_first : o->step, last = o->step + c->steps;
    int64_t run_last = c->run_last > last ? c->run_last : last;
    int skips_in_a_row = 0;
    while (rc == PRL_OK && o->step < last) {
        int64_t step = o->step; /* the data of a step skipped by the loss scaler is redrawn */
        double t0 = prl_now();
        int trained = 0, tokens = 0;
        int64_t step_next = next; /* a step the loss scaler skips is redone with its data */
        for (int a = 0; a < c->accum; a++)
            if (c->pack)
                trained += fill_packed(&bb[a], pos + (size_t)a * B * T, d, c, &ord, &next),
                    Ts[a] = T;
            else trained += fill_batch(&bb[a], ex, d, c, &ord, step, a, &Ts[a]);
        prl_model_zero_grad(m);
        prl_forward_stats sum = {0};
        for (int a = 0; rc == PRL_OK && a < c->accum; a++) {
            for (int i = 0; i < B * Ts[a]; i++)
                bb[a].weights[i] = bb[a].targets[i] >= 0 ? -1.0f / (float)trained : 0.0f;
            for (int i = 0; i < B; i++) tokens += bb[a].lens[i];
            prl_batch b = prl_batch_buf_view(&bb[a], B, Ts[a]);
            b.pos = c->pack ? pos + (size_t)a * B * T : NULL;
            b.with_mtp = 1; /* the MTP modules (if any) train beside the trunk */
            b.loss_scale = c->scaler ? c->scaler->scale : 0;
            prl_forward_stats st;
            rc = prl_model_forward(m, &b, NULL, &st);
            if (rc == PRL_OK) rc = prl_model_backward(m, &b);
            sum.loss += st.loss, sum.lm_loss += st.lm_loss;
            sum.balance_loss += st.balance_loss, sum.z_loss += st.z_loss;
            sum.mtp_loss += st.mtp_loss;
            sum.index_loss += st.index_loss;
        }
        if (rc) break;
        if (!isfinite(sum.loss)) {
            rc = prl_error_set(PRL_ERR_NUMERIC, "sft: loss is %g at step %lld", sum.loss,
                               (long long)step);
            break;
        }
        prl_optim_stats os;
        int skipped;
        if ((rc = prl_optim_step_scaled(o, m, c->scaler, &os, &skipped))) break;
        if (skipped) { /* 64 back-offs in a row: no fp16 overflow any more, but NaN or inf */
            next = step_next;
            if (++skips_in_a_row == 64)
                rc = prl_error_set(PRL_ERR_NUMERIC,
                                   "sft: 64 loss-scale overflows in a row at step "
                                   "%lld (scale %g): the gradients are not finite at any scale",
                                   (long long)step, c->scaler->scale);
            continue;
        }
        skips_in_a_row = 0;
        prl_model_update_router_bias(m);
        double t1 = prl_now();
        int done = (int)(step + 1 - first);
        if (progress) {
            prl_sft_progress p = {
                .step = (int)(step + 1),
                .steps = (int)run_last,
                .loss = sum.lm_loss,
                .balance_loss = sum.balance_loss / c->accum,
                .z_loss = sum.z_loss / c->accum,
                .mtp_loss = sum.mtp_loss,
                .index_loss = sum.index_loss / c->accum,
                .lr = os.lr,
                .grad_norm = os.grad_norm,
                .tokens_per_s = tokens / (t1 - t0),
                .tokens = tokens,
                .elapsed_s = t1 - t_start,
                .loss_scale = c->scaler ? c->scaler->scale : 0,
                .skipped = c->scaler ? c->scaler->skipped : 0,
                .log_line = done % c->log_every == 0 || step + 1 == run_last,
            };
            p.eta_s = p.elapsed_s / done * (double)(run_last - step - 1);
            progress(user, &p);
        }
    }
    for (int a = 0; bb && a < c->accum; a++) prl_batch_buf_free(&bb[a]);
    free(bb), free(Ts), free(ex), free(pos);
    free(ord.perm);
    free(ord.tmp);
    return rc;
}
