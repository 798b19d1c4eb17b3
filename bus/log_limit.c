/*
** log_limit.c — a rate limit for the log lines about bad messages (bus.h): a flood of garbage,
** or a worker whose every answer is refused, must not grow a log by megabytes a minute. The
** first PRL_BUS_LOG_BURST lines of a kind are written, then at most one a second; what was
** held back is said in one line before the next one written, and once more at the end.
*/
#include "bus/bus.h"

#include <stdio.h>

int prl_bus_log_limit_take(prl_bus_log_limit *l, double now, uint64_t *held)
{
    *held = 0;
    if (l->written >= PRL_BUS_LOG_BURST && now - l->last < 1.0) {
        l->held++;
        return 0;
    }
    *held = l->held;
    l->held = 0;
    l->written++;
    l->last = now;
    return 1;
}

int prl_bus_log_limit_held_line(prl_bus_log_limit *l, const char *kind, char *out, size_t n)
{
    if (!l->held) return 0;
    prl_bus_log_held_line(l->held, kind, out, n);
    l->held = 0;
    return 1;
}

void prl_bus_log_held_line(uint64_t held, const char *kind, char *out, size_t n)
{
    snprintf(out, n, "held back: %llu more '%s' lines (at most one a second after the first %d)",
             (unsigned long long)held, kind, PRL_BUS_LOG_BURST);
}
