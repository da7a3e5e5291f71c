/* norm.c - RMSNorm and LayerNorm.  Row statistics are accumulated in double; the
 * per-column weight/bias gradients are reductions over rows, so they are computed in a
 * second loop that splits columns over threads and walks rows in order. */
#include "kernels.h"

#include <math.h>

#define NORM_COLS 64
#define PAR_ROWS(N, C) ((size_t)(N) * (size_t)(C) >= 16384)

void kcpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                          int N, int C, float eps)
{
#pragma omp parallel for schedule(static) if (PAR_ROWS(N, C))
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        double ss = 0;
        for (int c = 0; c < C; c++)
            ss += (double)x[c] * x[c];
        double r = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++)
            y[c] = (float)(x[c] * r * weight[c]);
        if (rstd)
            rstd[i] = (float)r;
    }
}

/* y = x * r * w, r = (mean(x^2) + eps)^(-1/2):
 *   dx_c = r * w_c * dy_c - x_c * r^3 / C * sum_k dy_k w_k x_k,   dw_c = sum_rows dy_c x_c r */
void kcpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C)
{
    if (dinp) {
#pragma omp parallel for schedule(static) if (PAR_ROWS(N, C))
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            float *dx = dinp + (size_t)i * C;
            double r = rstd[i], dot = 0;
            for (int c = 0; c < C; c++)
                dot += (double)dy[c] * weight[c] * x[c];
            double k = r * r * r * dot / C;
            for (int c = 0; c < C; c++)
                dx[c] += (float)(r * weight[c] * dy[c] - x[c] * k);
        }
    }
    if (dweight) {
        int blocks = (C + NORM_COLS - 1) / NORM_COLS;
#pragma omp parallel for schedule(static) if (PAR_ROWS(N, C))
        for (int b = 0; b < blocks; b++) {
            int c0 = b * NORM_COLS, nc = C - c0 < NORM_COLS ? C - c0 : NORM_COLS;
            double acc[NORM_COLS] = {0};
            for (int i = 0; i < N; i++) {
                const float *x = inp + (size_t)i * C + c0, *dy = dout + (size_t)i * C + c0;
                double r = rstd[i];
                for (int c = 0; c < nc; c++)
                    acc[c] += (double)dy[c] * x[c] * r;
            }
            for (int c = 0; c < nc; c++)
                dweight[c0 + c] += (float)acc[c];
        }
    }
}

void kcpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps)
{
#pragma omp parallel for schedule(static) if (PAR_ROWS(N, C))
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        double s = 0, v = 0;
        for (int c = 0; c < C; c++)
            s += x[c];
        double mu = s / C;
        for (int c = 0; c < C; c++)
            v += (x[c] - mu) * (x[c] - mu); /* two passes: no cancellation */
        double r = 1.0 / sqrt(v / C + eps);
        for (int c = 0; c < C; c++)
            y[c] = (float)((x[c] - mu) * r * weight[c] + (bias ? bias[c] : 0.0f));
        if (mean)
            mean[i] = (float)mu;
        if (rstd)
            rstd[i] = (float)r;
    }
}

/* xhat = (x - mean) * r, y = xhat * w + b, g = dy * w:
 *   dx = r * (g - mean(g) - xhat * mean(g * xhat)),  dw = sum_rows dy * xhat,  db = sum_rows dy */
void kcpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C)
{
    if (dinp) {
#pragma omp parallel for schedule(static) if (PAR_ROWS(N, C))
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            float *dx = dinp + (size_t)i * C;
            double mu = mean[i], r = rstd[i], sg = 0, sgx = 0;
            for (int c = 0; c < C; c++) {
                double g = (double)dy[c] * weight[c];
                sg += g;
                sgx += g * ((x[c] - mu) * r);
            }
            sg /= C;
            sgx /= C;
            for (int c = 0; c < C; c++) {
                double xhat = (x[c] - mu) * r;
                dx[c] += (float)(r * ((double)dy[c] * weight[c] - sg - xhat * sgx));
            }
        }
    }
    if (dweight || dbias) {
        int blocks = (C + NORM_COLS - 1) / NORM_COLS;
#pragma omp parallel for schedule(static) if (PAR_ROWS(N, C))
        for (int b = 0; b < blocks; b++) {
            int c0 = b * NORM_COLS, nc = C - c0 < NORM_COLS ? C - c0 : NORM_COLS;
            double aw[NORM_COLS] = {0}, ab[NORM_COLS] = {0};
            for (int i = 0; i < N; i++) {
                const float *x = inp + (size_t)i * C + c0, *dy = dout + (size_t)i * C + c0;
                double mu = mean[i], r = rstd[i];
                for (int c = 0; c < nc; c++) {
                    aw[c] += dy[c] * ((x[c] - mu) * r);
                    ab[c] += dy[c];
                }
            }
            for (int c = 0; c < nc; c++) {
                if (dweight)
                    dweight[c0 + c] += (float)aw[c];
                if (dbias)
                    dbias[c0 + c] += (float)ab[c];
            }
        }
    }
}
