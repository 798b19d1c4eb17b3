/*
** record.c — the shape of a sample's route record (replay.h): its size, the one check every
** receiver of a record applies (the controller on a `result`, the trainer's batch on a
** `train`), and its JSON form.
*/
#include "replay/replay.h"

#include <jansson.h>

size_t prl_route_shape_bytes(const prl_route_shape *s)
{
    if (s->rows < 0 || s->moe < 0 || s->k < 0 || s->width < 0) return 0;
    return (size_t)s->rows * (size_t)s->moe * (size_t)s->k * (size_t)s->width;
}

prl_status prl_route_shape_check(const prl_route_shape *s, size_t bytes, size_t n_tokens)
{
    if (s->rows < 1 || n_tokens < 2 || (size_t)s->rows > n_tokens - 1)
        return prl_error_set(PRL_ERR_FORMAT,
                             "route record: %d rows for %zu tokens (need 1 .. "
                             "tokens - 1)",
                             s->rows, n_tokens);
    if (s->moe < 1 || s->moe > PRL_MAX_LAYERS || s->k < 1 || s->k > 256 ||
        (s->width != 1 && s->width != 2))
        return prl_error_set(PRL_ERR_FORMAT,
                             "route record: route_moe %d, route_k %d, route_width "
                             "%d (need 1..%d, 1..256, 1 or 2)",
                             s->moe, s->k, s->width, PRL_MAX_LAYERS);
    size_t want = prl_route_shape_bytes(s);
    if (bytes != want)
        return prl_error_set(PRL_ERR_FORMAT,
                             "route record: shape [%d][%d][%d] x %d needs %zu "
                             "bytes, got %zu",
                             s->rows, s->moe, s->k, s->width, want, bytes);
    return PRL_OK;
}

json_t *prl_route_shape_json(const prl_route_shape *s)
{
    return json_pack("[i,i,i,i]", s->rows, s->moe, s->k, s->width);
}

prl_status prl_route_shape_from_json(const json_t *v, prl_route_shape *s)
{
    int d[4];
    for (size_t i = 0; i < 4; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < INT32_MIN ||
            json_integer_value(e) > INT32_MAX)
            return prl_error_set(PRL_ERR_FORMAT, "route shape: not an array of four integers");
        d[i] = (int)json_integer_value(e);
    }
    if (json_array_size(v) != 4)
        return prl_error_set(PRL_ERR_FORMAT, "route shape: not an array of four integers");
    *s = (prl_route_shape){d[0], d[1], d[2], d[3]};
    return PRL_OK;
}
