/*
** batch.c — one step's samples as a packed batch (grpo.h): allocation, the one set of checks
** of every size and value (a batch arrives in a `train` message from another process, and
** OPD's `teach` items reuse it: roles/msg/train.c), and whether it fits a model.
*/
#include "grpo/grpo.h"
#include "replay/replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

prl_status prl_grpo_batch_init(prl_grpo_batch *b, int n, size_t n_tokens, size_t n_response)
{
    memset(b, 0, sizeof *b);
    if (n < 1 || n_tokens > INT32_MAX || n_response > n_tokens)
        return prl_error_set(PRL_ERR_ARG,
                             "grpo batch: %d samples, %zu tokens, %zu response "
                             "tokens",
                             n, n_tokens, n_response);
    b->n = n, b->n_tokens = n_tokens, b->n_response = n_response;
    b->tokens = calloc(n_tokens ? n_tokens : 1, sizeof *b->tokens);
    b->offsets = calloc((size_t)n + 1, sizeof *b->offsets);
    b->prompt_lens = calloc((size_t)n, sizeof *b->prompt_lens);
    b->rewards = calloc((size_t)n, sizeof *b->rewards);
    b->groups = calloc((size_t)n, sizeof *b->groups);
    b->logprobs = calloc(n_response ? n_response : 1, sizeof *b->logprobs);
    b->mask = calloc(n_response ? n_response : 1, sizeof *b->mask);
    if (!b->tokens || !b->offsets || !b->prompt_lens || !b->rewards || !b->groups || !b->logprobs ||
        !b->mask) {
        prl_grpo_batch_free(b);
        return prl_error_set(PRL_ERR_NOMEM, "grpo batch of %d samples", n);
    }
    return PRL_OK;
}

void prl_grpo_batch_free(prl_grpo_batch *b)
{
    if (!b) return;
    free(b->tokens);
    free(b->offsets);
    free(b->prompt_lens);
    free(b->rewards);
    free(b->groups);
    free(b->logprobs);
    free(b->mask);
    free(b->route_rows);
    free(b->routes);
    memset(b, 0, sizeof *b);
}

prl_status prl_grpo_batch_routes_init(prl_grpo_batch *b, int route_moe, int route_k, int width,
                                      size_t rows)
{
    free(b->route_rows), free(b->routes);
    b->route_moe = route_moe, b->route_k = route_k, b->route_width = width;
    b->routes_bytes = rows * (size_t)(route_moe > 0 ? route_moe : 0) *
                      (size_t)(route_k > 0 ? route_k : 0) * (size_t)(width > 0 ? width : 0);
    b->route_rows = calloc((size_t)b->n, sizeof *b->route_rows);
    b->routes = calloc(b->routes_bytes ? b->routes_bytes : 1, 1);
    if (!b->route_rows || !b->routes) {
        free(b->route_rows), free(b->routes);
        b->route_rows = NULL, b->routes = NULL, b->routes_bytes = 0;
        return prl_error_set(PRL_ERR_NOMEM, "routes of %zu rows", rows);
    }
    return PRL_OK;
}

/* offsets, prompt_lens and the response count (the layout every other check relies on). */
static prl_status check_layout(const prl_grpo_batch *b)
{
    if (b->n < 1) return prl_error_set(PRL_ERR_FORMAT, "count: %d samples (need >= 1)", b->n);
    if (b->offsets[0] != 0)
        return prl_error_set(PRL_ERR_FORMAT, "offsets: sample 0 starts at %d, not 0",
                             b->offsets[0]);
    size_t response = 0;
    for (int i = 0; i < b->n; i++) {
        int64_t len = (int64_t)b->offsets[i + 1] - b->offsets[i];
        if (len < 2)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "offsets: sample %d spans [%d, %d): offsets must "
                                 "increase by >= 2 (a prompt and a response)",
                                 i, b->offsets[i], b->offsets[i + 1]);
        if (b->prompt_lens[i] < 1 || b->prompt_lens[i] >= len)
            return prl_error_set(PRL_ERR_FORMAT,
                                 "prompt_lens: sample %d has prompt length %d, "
                                 "not in [1, %lld) (its length)",
                                 i, b->prompt_lens[i], (long long)len);
        response += (size_t)(len - b->prompt_lens[i]);
    }
    if ((size_t)b->offsets[b->n] != b->n_tokens)
        return prl_error_set(PRL_ERR_FORMAT,
                             "offsets: the last offset %d differs from the %zu "
                             "tokens",
                             b->offsets[b->n], b->n_tokens);
    if (response != b->n_response)
        return prl_error_set(PRL_ERR_FORMAT,
                             "logprobs: %zu response log-probs, but the samples "
                             "have %zu response tokens",
                             b->n_response, response);
    return PRL_OK;
}

/* Values: token ids >= 0, finite rewards, finite log-probs <= 0, mask bytes 0 or 1. */
static prl_status check_values(const prl_grpo_batch *b)
{
    size_t first = 0; /* the running index of the response tokens */
    for (int i = 0; i < b->n; i++) {
        if (!isfinite(b->rewards[i]))
            return prl_error_set(PRL_ERR_FORMAT, "rewards: sample %d has reward %g", i,
                                 b->rewards[i]);
        for (int32_t t = b->offsets[i]; t < b->offsets[i + 1]; t++)
            if (b->tokens[t] < 0)
                return prl_error_set(PRL_ERR_FORMAT, "tokens: sample %d position %d has id %d", i,
                                     t - b->offsets[i], b->tokens[t]);
        int len = b->offsets[i + 1] - b->offsets[i] - b->prompt_lens[i];
        for (int j = 0; j < len; j++, first++) {
            float lp = b->logprobs[first];
            if (!(isfinite(lp) && lp <= 0))
                return prl_error_set(PRL_ERR_FORMAT,
                                     "logprobs: sample %d response token %d has "
                                     "log-prob %g (must be finite and <= 0)",
                                     i, j, lp);
            if (b->mask[first] > 1)
                return prl_error_set(PRL_ERR_FORMAT,
                                     "mask: sample %d response token %d is %d "
                                     "(must be 0 or 1)",
                                     i, j, b->mask[first]);
        }
    }
    return PRL_OK;
}

/* Routes, when present: each sample's record (0 rows: none) of the batch's shape passes the
** one route-record check (replay/record.c), and the records' bytes add up. */
static prl_status check_routes(const prl_grpo_batch *b)
{
    if (!b->route_rows && !b->routes) return PRL_OK;
    if (!b->route_rows || !b->routes)
        return prl_error_set(PRL_ERR_FORMAT,
                             "routes: frames 'route_rows' and 'routes' go together");
    prl_route_shape one = {1, b->route_moe, b->route_k, b->route_width}; /* the dimensions */
    prl_status rc = prl_route_shape_check(&one, prl_route_shape_bytes(&one), 2);
    if (rc) return prl_error_wrap(rc, "routes: ");
    size_t bytes = 0;
    for (int i = 0; i < b->n; i++) {
        prl_route_shape s = {b->route_rows[i], b->route_moe, b->route_k, b->route_width};
        size_t n_tokens = (size_t)(b->offsets[i + 1] - b->offsets[i]);
        if (s.rows && (rc = prl_route_shape_check(&s, prl_route_shape_bytes(&s), n_tokens)))
            return prl_error_wrap(rc, "route_rows: sample %d: ", i);
        if (s.rows < 0)
            return prl_error_set(PRL_ERR_FORMAT, "route_rows: sample %d has %d route rows", i,
                                 s.rows);
        bytes += prl_route_shape_bytes(&s);
    }
    if (bytes != b->routes_bytes)
        return prl_error_set(PRL_ERR_FORMAT,
                             "routes: %zu bytes, but the samples' records of %d x "
                             "%d ids of %d bytes need %zu",
                             b->routes_bytes, b->route_moe, b->route_k, b->route_width, bytes);
    return PRL_OK;
}

prl_status prl_grpo_batch_check(const prl_grpo_batch *b)
{
    prl_status rc = check_layout(b);
    if (!rc) rc = check_values(b);
    return rc ? rc : check_routes(b);
}

void prl_grpo_batch_response(const prl_grpo_batch *b, int i, size_t *first, int *len)
{
    /* the response tokens before sample i: its offset minus the prompts before it */
    size_t prompts = 0;
    for (int k = 0; k < i; k++) prompts += (size_t)b->prompt_lens[k];
    *first = (size_t)b->offsets[i] - prompts;
    *len = b->offsets[i + 1] - b->offsets[i] - b->prompt_lens[i];
}

prl_status prl_grpo_batch_fits(const prl_model *m, const prl_grpo_batch *b)
{
    for (int i = 0; i < b->n; i++) {
        int len = b->offsets[i + 1] - b->offsets[i];
        if (len > m->cfg.max_position_embeddings)
            return prl_error_set(PRL_ERR_RANGE,
                                 "sample %d has %d tokens, more than the model's "
                                 "context of %d",
                                 i, len, m->cfg.max_position_embeddings);
        for (int t = 0; t < len; t++)
            if (b->tokens[b->offsets[i] + t] >= m->cfg.vocab_size)
                return prl_error_set(PRL_ERR_RANGE,
                                     "sample %d position %d has token %d "
                                     "outside the vocabulary of %d",
                                     i, t, b->tokens[b->offsets[i] + t], m->cfg.vocab_size);
    }
    return PRL_OK;
}
