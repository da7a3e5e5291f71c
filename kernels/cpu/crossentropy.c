/* crossentropy.c - softmax cross-entropy over a vocabulary, stable: the row maximum is
 * subtracted before exp and the row sum is accumulated in double.
 *
 * A target outside [0, V) that is not ignore_index is a caller bug; rather than read out
 * of bounds the row gets loss NaN (so the step is flagged as diverged) and no gradient. */
#include "kernels.h"

#include <math.h>

/* log(sum exp(x)) of one row, in double. */
static double row_lse(const float *x, int V)
{
    float mx = -INFINITY;
    for (int j = 0; j < V; j++)
        mx = x[j] > mx ? x[j] : mx;
    double s = 0;
    for (int j = 0; j < V; j++)
        s += exp((double)x[j] - mx);
    return mx + log(s);
}

void kcpu_crossentropy_forward(float *losses, const float *logits, const int *targets,
                               int N, int V, int ignore_index)
{
#pragma omp parallel for schedule(static) if ((size_t)N * V >= 16384)
    for (int i = 0; i < N; i++) {
        int t = targets[i];
        if (t == ignore_index)
            losses[i] = 0.0f;
        else if (t < 0 || t >= V)
            losses[i] = NAN;
        else {
            const float *x = logits + (size_t)i * V;
            losses[i] = (float)(row_lse(x, V) - x[t]);
        }
    }
}

void kcpu_crossentropy_backward(float *dlogits, const float *logits, const int *targets,
                                const float *dlosses, int N, int V, int ignore_index)
{
#pragma omp parallel for schedule(static) if ((size_t)N * V >= 16384)
    for (int i = 0; i < N; i++) {
        int t = targets[i];
        if (t == ignore_index || t < 0 || t >= V)
            continue;
        const float *x = logits + (size_t)i * V;
        float *dx = dlogits + (size_t)i * V;
        double lse = row_lse(x, V), dl = dlosses[i];
        for (int j = 0; j < V; j++) {
            double p = exp((double)x[j] - lse);
            dx[j] += (float)(dl * (j == t ? p - 1.0 : p));
        }
    }
}
