/* elementwise.c - add, accumulate, scale.  Each element is independent, so the static
 * split over threads cannot change any result. */
#include "kernels.h"

#include <stddef.h>

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 65536

void kcpu_add(float *out, const float *a, const float *b, size_t n)
{
    ptrdiff_t len = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (ptrdiff_t i = 0; i < len; i++)
        out[i] = a[i] + b[i];
}

void kcpu_accumulate(float *dst, const float *src, size_t n)
{
    ptrdiff_t len = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (ptrdiff_t i = 0; i < len; i++)
        dst[i] += src[i];
}

void kcpu_scale(float *x, size_t n, float s)
{
    ptrdiff_t len = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (ptrdiff_t i = 0; i < len; i++)
        x[i] *= s;
}
