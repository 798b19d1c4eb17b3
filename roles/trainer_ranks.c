/*
** trainer_ranks.c — what rank 0 of a data-parallel trainer (`trainer.ranks` > 1) hands the
** other ranks over MPI before each step (internal.h, docs/scale-out.md "Trainer ranks"): a
** command, the job config, the `train` message as its wire frames, and the policy (its model
** config, weights, router bias, loss scaler). Only rank 0 talks to the bus and reads the
** run's disk; a rank needs nothing but MPI.
**
** Every function is collective: rank 0 sends what it holds, the other ranks receive into
** what they own, in the same order on every rank.
*/
#include "roles/internal.h"

#include <stdlib.h>
#include <string.h>

prl_status prl_ranks_bcast_text(prl_dp *d, char **text)
{
    uint64_t n = d->rank == 0 ? strlen(*text) + 1 : 0;
    prl_status rc = prl_dp_bcast(d, &n, sizeof n);
    if (rc) return rc;
    if (d->rank != 0) {
        if (n == 0 || !(*text = malloc(n)))
            return prl_error_set(PRL_ERR_NOMEM, "%llu bytes of text", (unsigned long long)n);
    }
    rc = prl_dp_bcast(d, *text, n);
    if (!rc) (*text)[n - 1] = 0;
    return rc;
}

prl_status prl_ranks_bcast_msg(prl_dp *d, const prl_bus_msg *m, prl_bus_msg *out)
{
    prl_bus_wire w;
    memset(&w, 0, sizeof w);
    prl_status rc = d->rank == 0 ? prl_bus_encode(m, &w) : PRL_OK;
    int32_t n = w.n;
    uint64_t len[PRL_BUS_MAX_PARTS] = {0};
    for (int i = 0; i < w.n; i++) len[i] = w.parts[i].len;
    /* a failed encode on rank 0 is sent as 0 parts, so every rank leaves together */
    if (rc) n = 0;
    prl_status e = prl_dp_bcast(d, &n, sizeof n);
    if (!e && (n < 0 || n > PRL_BUS_MAX_PARTS))
        e = prl_error_set(PRL_ERR_FORMAT, "a message of %d parts", (int)n);
    if (!e && n) e = prl_dp_bcast(d, len, (size_t)n * sizeof *len);
    void *buf[PRL_BUS_MAX_PARTS] = {0};
    prl_bus_part parts[PRL_BUS_MAX_PARTS];
    for (int i = 0; !e && i < n; i++) {
        if (d->rank == 0) {
            buf[i] = (void *)(uintptr_t)w.parts[i].data;
        } else if (!(buf[i] = malloc(len[i] ? len[i] : 1))) {
            e = prl_error_set(PRL_ERR_NOMEM, "message part of %llu bytes",
                              (unsigned long long)len[i]);
            break;
        }
        e = prl_dp_bcast(d, buf[i], len[i]);
        parts[i] = (prl_bus_part){.data = buf[i], .len = len[i]};
    }
    if (!e && d->rank != 0) {
        char why[256];
        e = n ? prl_bus_decode(prl_msg_registry(), parts, n, out, why, sizeof why)
              : prl_error_set(PRL_ERR_IO, "rank 0 could not encode the message");
    }
    if (d->rank != 0)
        for (int i = 0; i < n; i++) free(buf[i]);
    prl_bus_wire_free(&w);
    return rc ? rc : e;
}

prl_status prl_ranks_bcast_model(prl_dp *d, prl_model *m, int *have)
{
    prl_config cfg;
    if (d->rank == 0) cfg = m->cfg;
    prl_status rc = prl_dp_bcast(d, &cfg, sizeof cfg);
    if (rc) return rc;
    if (d->rank != 0 && (!*have || memcmp(&cfg, &m->cfg, sizeof cfg))) {
        if (*have) prl_model_free(m);
        *have = 0;
        if ((rc = prl_model_init(m, &cfg))) return rc;
        *have = 1;
    }
    size_t nb = (size_t)m->n_moe_all * m->cfg.n_routed_experts;
    rc = prl_dp_bcast(d, m->params, m->n_params * sizeof *m->params);
    if (!rc && nb) rc = prl_dp_bcast(d, m->router_bias, nb * sizeof *m->router_bias);
    if (!rc && nb) rc = prl_dp_bcast(d, m->expert_counts, nb * sizeof *m->expert_counts);
    return rc;
}
