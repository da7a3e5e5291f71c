/* adamw.c - the AdamW update, the sum of squares for the global gradient norm, and the
 * clipping factor.  Per-element arithmetic is done in double and rounded once. */
#include "kernels.h"

#include <math.h>

#define PAR_MIN 65536

void kcpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       int step)
{
    double b1 = beta1, b2 = beta2;
    double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    ptrdiff_t len = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (ptrdiff_t i = 0; i < len; i++) {
        double g = grad[i];
        double mi = b1 * m[i] + (1.0 - b1) * g;
        double vi = b2 * v[i] + (1.0 - b2) * g * g;
        m[i] = (float)mi;
        v[i] = (float)vi;
        double upd = (mi / bc1) / (sqrt(vi / bc2) + eps) + (double)weight_decay * param[i];
        param[i] = (float)(param[i] - lr * upd);
    }
}

/* Fixed blocks of SUMSQ_BLOCK elements, each summed in order; block sums are added in
 * block order.  Rounds of up to SUMSQ_ROUND blocks run in parallel into a stack array,
 * so the order (and so the result) is the same for any thread count. */
#define SUMSQ_BLOCK 8192
#define SUMSQ_ROUND 256

double kcpu_sumsq(const float *x, size_t n)
{
    double total = 0, part[SUMSQ_ROUND];
    size_t nblocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    for (size_t b0 = 0; b0 < nblocks; b0 += SUMSQ_ROUND) {
        int nb = nblocks - b0 < SUMSQ_ROUND ? (int)(nblocks - b0) : SUMSQ_ROUND;
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int b = 0; b < nb; b++) {
            size_t i0 = (b0 + (size_t)b) * SUMSQ_BLOCK;
            size_t i1 = i0 + SUMSQ_BLOCK < n ? i0 + SUMSQ_BLOCK : n;
            double s = 0;
            for (size_t i = i0; i < i1; i++)
                s += (double)x[i] * x[i];
            part[b] = s;
        }
        for (int b = 0; b < nb; b++)
            total += part[b];
    }
    return total;
}

/* As torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6) when norm > max_norm.
 * A NaN norm gives a NaN factor (the caller's loss check reports the divergence). */
float kcpu_clip_factor(double global_norm, float max_norm)
{
    if (max_norm <= 0.0f || global_norm <= (double)max_norm)
        return 1.0f;
    return (float)((double)max_norm / (global_norm + 1e-6));
}
