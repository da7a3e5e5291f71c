/* rng.c - see rng.h. */
#include "model/rng.h"

#include <math.h>

static uint64_t finalize(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void hrng_init(hrng *r, uint64_t seed)
{
    r->state = seed;
    r->has_spare = 0;
    r->spare = 0;
}

uint64_t hrng_next(hrng *r)
{
    r->state += 0x9e3779b97f4a7c15ULL;
    return finalize(r->state);
}

double hrng_uniform(hrng *r)
{
    return (double)(hrng_next(r) >> 11) * 0x1.0p-53;
}

double hrng_normal(hrng *r)
{
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    /* u1 in (0, 1] so that log(u1) is finite. */
    double u1 = 1.0 - hrng_uniform(r);
    double u2 = hrng_uniform(r);
    double rad = sqrt(-2.0 * log(u1));
    double ang = 2.0 * M_PI * u2;
    r->spare = rad * sin(ang);
    r->has_spare = 1;
    return rad * cos(ang);
}

uint64_t hrng_mix(uint64_t a, uint64_t b)
{
    return finalize(finalize(a + 0x9e3779b97f4a7c15ULL) ^ (b * 0xd1b54a32d192ed03ULL + 1));
}

uint64_t hrng_hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}
