/* stats.c - median, min and max of measurements (stats.h). */
#include "stats.h"

#include <math.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void stats_summarize(double *v, size_t n, stats_summary *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i]))
            v[k++] = v[i];
    out->n = k;
    out->median = out->min = out->max = NAN;
    if (!k)
        return;
    qsort(v, k, sizeof *v, cmp_double);
    out->min = v[0];
    out->max = v[k - 1];
    out->median = k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}
