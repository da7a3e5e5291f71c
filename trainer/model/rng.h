/* rng.h - a small deterministic random generator for parameter initialisation.
 *
 * splitmix64 (Steele, Lea & Flood) for the integer stream, Box-Muller for normals.  The
 * state is a plain value owned by the caller: no hidden globals, so two generators made
 * from the same seed give the same sequence on any thread.  The integer stream is
 * bitwise reproducible everywhere; normals go through libm's log/sqrt/cos/sin and are
 * reproducible for a given C library.
 *
 * Usage:
 *   hrng r;
 *   hrng_init(&r, hrng_mix(seed, hrng_hash_str("decoder.embed.weight")));
 *   double z = hrng_normal(&r);
 */
#ifndef HEARTH_MODEL_RNG_H
#define HEARTH_MODEL_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t state;     /* splitmix64 counter */
    int has_spare;      /* Box-Muller makes normals in pairs; the second is kept here */
    double spare;
} hrng;

void hrng_init(hrng *r, uint64_t seed);
uint64_t hrng_next(hrng *r);           /* 64 uniformly random bits */
double hrng_uniform(hrng *r);          /* uniform in [0, 1), 53 bits */
double hrng_normal(hrng *r);           /* standard normal N(0, 1) */

/* Derives an independent seed from two values (a seed and a stream id), so that
 * sub-streams (one per tensor, per rank, ...) do not overlap in practice. */
uint64_t hrng_mix(uint64_t a, uint64_t b);
/* FNV-1a hash of a string: a stable stream id from a name. */
uint64_t hrng_hash_str(const char *s);

#endif
