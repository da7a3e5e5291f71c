/* stats.h - the summary of repeated measurements that reports, checks and selections
 * show: median, min and max of the finite values. */
#ifndef HEARTH_STATS_H
#define HEARTH_STATS_H

#include <stddef.h>

typedef struct {
    size_t n;                  /* the finite values among the input */
    double median, min, max;   /* NaN when n is 0 */
} stats_summary;

/* The summary of v[0..n); v is reordered (its finite values first, sorted). */
void stats_summarize(double *v, size_t n, stats_summary *out);

#endif
