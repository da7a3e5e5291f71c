/* bench_vit_balance.c - quality and speed of the ViT data-parallel balance.
 *
 * For several image counts and rank counts: random images (patch counts of real ViT
 * inputs, a few to thousands, a long tail of large ones), owners skewed towards low ranks
 * (as when microbatches of uneven size land on the encoding ranks), linear coefficient
 * 4 * hidden (1280).  Prints one row each: images, ranks, imbalance before and after, the
 * lower bound of the imbalance (max(largest image, total / ranks) / mean - 1), images
 * moved, and the time per call (median of repeats).
 *
 * Usage: bench_vit_balance [seed]        Exit status 1 when a call fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "parallel/vit_balance.h"
#include "tests/unit/support/testutil.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    tu_rng rng;
    tu_rng_init(&rng, argc > 1 ? strtoull(argv[1], NULL, 10) : 12345);
    static const int images[] = {64, 512, 4096, 32768};
    static const int ranks[] = {2, 8, 32, 128};
    const double coef = 4.0 * 1280;
    const int rounds = 32, reps = 7;

    printf("%8s %6s %10s %10s %10s %8s %12s\n", "images", "ranks", "before", "after", "bound",
           "moved", "ms/call");
    for (size_t a = 0; a < sizeof images / sizeof *images; a++)
        for (size_t b = 0; b < sizeof ranks / sizeof *ranks; b++) {
            int n = images[a], r = ranks[b];
            int64_t *p = malloc((size_t)n * sizeof *p);
            int *owner = malloc((size_t)n * sizeof *owner), *assign = malloc((size_t)n * sizeof *assign);
            if (!p || !owner || !assign)
                return 1;
            double total = 0, big = 0;
            for (int i = 0; i < n; i++) {
                p[i] = tu_randint(&rng, 0, 8) == 0 ? tu_randint(&rng, 1024, 8193)
                                                   : tu_randint(&rng, 16, 1025);
                int o = tu_randint(&rng, 0, r);
                owner[i] = tu_randint(&rng, 0, 2) ? o / 2 : o;
                double c = vit_balance_cost(p[i], coef);
                total += c;
                big = c > big ? c : big;
            }
            double t[16];
            vit_balance_stats st;
            hearth_err err;
            for (int k = 0; k < reps; k++) {
                double t0 = now_s();
                if (vit_balance_assign(p, owner, n, r, coef, rounds, assign, &st, &err)) {
                    fprintf(stderr, "bench_vit_balance: %s\n", err.msg);
                    return 1;
                }
                t[k] = now_s() - t0;
            }
            qsort(t, (size_t)reps, sizeof *t, cmp_double);
            double mean = total / r, bound = (big > mean ? big : mean) / mean - 1;
            printf("%8d %6d %10.4f %10.4f %10.4f %8d %12.3f\n", n, r, st.before, st.after, bound,
                   st.moved, 1e3 * t[reps / 2]);
            free(p);
            free(owner);
            free(assign);
        }
    return 0;
}
