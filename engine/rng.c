/*
** rng.c — counter-based random streams, a 64-bit checksum, the monotonic clock and durations.
**
** A stream's key is a hash of (seed, a, b, c, purpose); draw i is hash(key, i). Nothing is
** carried between draws except the counter, so a draw depends only on its coordinates:
** that is what makes every sample and every initial weight reproducible regardless of
** batching, ordering or thread count.
*/
#include "engine/engine.h"

#include <stdio.h>
#include <time.h>

#include <math.h>

uint64_t prl_hash64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

void prl_rng_init(prl_rng *r, uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t purpose)
{
    uint64_t k = prl_hash64(seed);
    k = prl_hash64(k ^ a);
    k = prl_hash64(k ^ (b + 0x632be59bd9b4e019ULL));
    k = prl_hash64(k ^ (c + 0x8cb92ba72f3d8dd7ULL));
    k = prl_hash64(k ^ (purpose + 0x3c6ef372fe94f82aULL));
    r->key = k;
    r->counter = 0;
}

uint64_t prl_rng_u64(prl_rng *r) { return prl_hash64(r->key ^ prl_hash64(r->counter++)); }

double prl_rng_uniform(prl_rng *r)
{
    return (double)(prl_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

double prl_rng_normal(prl_rng *r)
{
    double u1 = prl_rng_uniform(r);
    double u2 = prl_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/* FNV-1a over bytes, finished with the splitmix finaliser: not cryptographic, just a strong
** integrity check for checkpoints and bus frames. */
uint64_t prl_checksum64(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ULL ^ seed;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = 0;
        for (int j = 0; j < 8; j++) w |= (uint64_t)p[i + j] << (8 * j);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return prl_hash64(h ^ n);
}

double prl_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void prl_format_duration(char *out, size_t n, double s)
{
    if (!(s >= 0)) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, t % 3600 / 60);
    else if (t >= 60) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, n, "%lds", t);
}
