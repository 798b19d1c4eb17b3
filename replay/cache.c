/*
** cache.c — the Cached R3 route cache of a multi-turn episode (replay.h; shared/spec/rl.md
** §3.5): the routes of a position are the ones the inference engine produced the first time
** that position went through it, kept across every later turn's re-prefill.
*/
#include "replay/replay.h"

#include <stdlib.h>
#include <string.h>

void prl_route_cache_init(prl_route_cache *c) { memset(c, 0, sizeof *c); }

void prl_route_cache_free(prl_route_cache *c)
{
    if (!c) return;
    free(c->ids), free(c->rows);
    memset(c, 0, sizeof *c);
}

static prl_status reserve(prl_route_cache *c, int n)
{
    if (n <= c->cap) return PRL_OK;
    int cap = c->cap ? c->cap : 256;
    while (cap < n) cap *= 2;
    int32_t *ids = realloc(c->ids, (size_t)cap * sizeof *ids);
    if (ids) c->ids = ids;
    uint8_t *rows = realloc(c->rows, (size_t)cap * c->row_bytes);
    if (rows) c->rows = rows;
    if (!ids || !rows) return prl_error_set(PRL_ERR_NOMEM, "route cache of %d positions", cap);
    c->cap = cap;
    return PRL_OK;
}

prl_status prl_route_cache_merge(prl_route_cache *c, const int32_t *ids, int n_ids,
                                 const uint8_t *routes, int n_rows, size_t row_bytes,
                                 prl_route_cache_stats *st)
{
    prl_route_cache_stats s = {0};
    if (n_rows < 0 || n_rows > n_ids || row_bytes == 0)
        return prl_error_set(PRL_ERR_ARG, "route cache: %d route rows of %zu bytes for %d tokens",
                             n_rows, row_bytes, n_ids);
    if (c->n > 0 && row_bytes != c->row_bytes)
        return prl_error_set(PRL_ERR_ARG, "route cache: rows of %zu bytes, the cache holds %zu",
                             row_bytes, c->row_bytes);
    c->row_bytes = row_bytes;
    /* validity: a cached row stands only while every token up to it is unchanged */
    int same = 0, upto = c->n < n_ids ? c->n : n_ids;
    while (same < upto && c->ids[same] == ids[same]) same++;
    s.discarded = c->n - same;
    c->n = same;
    int overlap = c->n < n_rows ? c->n : n_rows;
    for (int p = 0; p < overlap; p++) /* first-seen wins: only note the drift */
        s.changed +=
            memcmp(c->rows + (size_t)p * row_bytes, routes + (size_t)p * row_bytes, row_bytes) != 0;
    s.kept = overlap;
    if (n_rows > c->n) {
        prl_status rc = reserve(c, n_rows);
        if (rc) return rc;
        memcpy(c->ids + c->n, ids + c->n, (size_t)(n_rows - c->n) * sizeof *ids);
        memcpy(c->rows + (size_t)c->n * row_bytes, routes + (size_t)c->n * row_bytes,
               (size_t)(n_rows - c->n) * row_bytes);
        s.added = n_rows - c->n;
        c->n = n_rows;
    }
    if (st) *st = s;
    return PRL_OK;
}
