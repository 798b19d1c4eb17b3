/*
** replay.c — replay modes, route records, the per-(layer, position) replay choice and the
** routing metrics (replay.h; shared/spec/rl.md §3.1–§3.4, §6; docs/replay.md).
** Everything is plain loops in a fixed order: no threads, no allocation.
*/
#include "replay/replay.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------------ modes ----------- */

static const char *const mode_names[] = {"none", "r2", "r3", "masked_r3"};

const char *prl_replay_mode_name(prl_replay_mode m)
{
    return (unsigned)m < sizeof mode_names / sizeof mode_names[0] ? mode_names[m] : "?";
}

prl_status prl_replay_mode_parse(const char *s, prl_replay_mode *out)
{
    for (int i = 0; i < (int)(sizeof mode_names / sizeof mode_names[0]); i++)
        if (s && strcmp(s, mode_names[i]) == 0) {
            *out = (prl_replay_mode)i;
            return PRL_OK;
        }
    return prl_error_set(PRL_ERR_CONFIG, "replay mode '%s' (choices: none, r2, r3, masked_r3)",
                         s ? s : "(null)");
}

/* ------------------------------------------------------------------ records --------- */

int prl_replay_overlap(const int32_t *a, const int32_t *b, int K)
{
    int n = 0;
    for (int i = 0; i < K; i++) {
        int dup = 0, hit = 0;
        for (int j = 0; j < i; j++) dup |= a[j] == a[i];
        for (int j = 0; j < K && !dup; j++) hit |= b[j] == a[i];
        n += hit;
    }
    return n;
}

prl_status prl_replay_record_unpack(int32_t *out, const uint8_t *rec, int rows, int n_moe, int K,
                                    int width, int E)
{
    if (width != prl_routes_width(E))
        return prl_error_set(PRL_ERR_FORMAT,
                             "route record: %d bytes per id, the model's %d "
                             "experts need %d",
                             width, E, prl_routes_width(E));
    enum { MAX_K = 256 };
    int32_t row[MAX_K]; /* one row of K ids */
    if (K < 1 || K > MAX_K) return prl_error_set(PRL_ERR_FORMAT, "route record: K = %d", K);
    for (int p = 0; p < rows; p++)
        for (int l = 0; l < n_moe; l++) {
            size_t at = ((size_t)p * n_moe + l) * K; /* token-major in the record */
            if (prl_routes_unpack(row, rec + at * width, (size_t)K, E))
                return prl_error_set(PRL_ERR_FORMAT,
                                     "route record: position %d MoE layer %d: "
                                     "an expert id outside [0, %d)",
                                     p, l, E);
            if (prl_replay_overlap(row, row, K) != K)
                return prl_error_set(PRL_ERR_FORMAT,
                                     "route record: position %d MoE layer %d "
                                     "repeats an expert id",
                                     p, l);
            memcpy(out + ((size_t)l * rows + p) * K, row, (size_t)K * sizeof *row);
        }
    return PRL_OK;
}

/* ------------------------------------------------------------------ choosing -------- */

static void set_native(int32_t *row, int K)
{
    for (int k = 0; k < K; k++) row[k] = PRL_ROUTE_NATIVE;
}

void prl_replay_choose(int32_t *out, const int32_t *native, const int32_t *recorded, int rows,
                       int K, prl_replay_mode mode, double tau, prl_replay_layer_stats *st)
{
    for (int p = 0; p < rows; p++) {
        const int32_t *nat = native + (size_t)p * K;
        const int32_t *rec = recorded ? recorded + (size_t)p * K : NULL;
        int32_t *o = out + (size_t)p * K;
        double ov = 0;
        if (rec) {
            ov = (double)prl_replay_overlap(nat, rec, K) / K;
            st->overlap += ov, st->compared++;
        }
        const int32_t *use = NULL;
        if (mode == PRL_REPLAY_R2) use = nat;
        else if (mode == PRL_REPLAY_R3) use = rec;
        else if (mode == PRL_REPLAY_MASKED_R3 && rec && ov >= tau) use = rec;
        if (use) memcpy(o, use, (size_t)K * sizeof *o), st->replayed++;
        else set_native(o, K);
        st->rows++;
    }
}

/* ------------------------------------------------------------------ entropy --------- */

void prl_replay_count(double *counts, const int32_t *routes, int rows, int K)
{
    for (size_t i = 0; i < (size_t)rows * K; i++) counts[routes[i]] += 1;
}

double prl_replay_entropy(const double *counts, int E)
{
    double total = 0, h = 0;
    for (int e = 0; e < E; e++) total += counts[e];
    if (!(total > 0)) return 0;
    for (int e = 0; e < E; e++)
        if (counts[e] > 0) h -= counts[e] / total * log(counts[e] / total);
    return h;
}

int prl_replay_entropy_alarm(const double *counts, int E, double fraction)
{
    double total = 0;
    for (int e = 0; e < E; e++) total += counts[e];
    if (E < 2 || !(total > 0)) return 0;
    return prl_replay_entropy(counts, E) < fraction * log((double)E);
}
