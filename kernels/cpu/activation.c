/* activation.c - SwiGLU and GELU (tanh and erf forms), evaluated in double per element
 * and rounded once. */
#include "kernels.h"

#include <math.h>

#define PAR_MIN 16384

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

void kcpu_swiglu_forward(float *out, const float *inp, int N, int F)
{
#pragma omp parallel for schedule(static) if ((size_t)N * F >= PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F;
        float *y = out + (size_t)n * F;
        for (int f = 0; f < F; f++)
            y[f] = (float)(g[f] * sigmoid(g[f]) * u[f]);
    }
}

/* y = g s(g) u:  dy/dg = u s (1 + g (1 - s)),  dy/du = g s */
void kcpu_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F)
{
#pragma omp parallel for schedule(static) if ((size_t)N * F >= PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F, *dy = dout + (size_t)n * F;
        float *dg = dinp + (size_t)n * 2 * F, *du = dg + F;
        for (int f = 0; f < F; f++) {
            double s = sigmoid(g[f]);
            dg[f] += (float)(dy[f] * u[f] * s * (1.0 + g[f] * (1.0 - s)));
            du[f] += (float)(dy[f] * g[f] * s);
        }
    }
}

#define GELU_K 0.7978845608028654      /* sqrt(2/pi) */
#define GELU_C 0.044715
#define INV_SQRT2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327

static double gelu(double x, kgelu_kind kind)
{
    if (kind == KGELU_ERF)
        return 0.5 * x * (1.0 + erf(x * INV_SQRT2));
    return 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_C * x * x * x)));
}

static double gelu_grad(double x, kgelu_kind kind)
{
    if (kind == KGELU_ERF)
        return 0.5 * (1.0 + erf(x * INV_SQRT2)) + x * exp(-0.5 * x * x) * INV_SQRT_2PI;
    double t = tanh(GELU_K * (x + GELU_C * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
}

void kcpu_gelu_forward(float *out, const float *inp, size_t n, kgelu_kind kind)
{
    ptrdiff_t len = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (ptrdiff_t i = 0; i < len; i++)
        out[i] = (float)gelu(inp[i], kind);
}

void kcpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n,
                        kgelu_kind kind)
{
    ptrdiff_t len = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (ptrdiff_t i = 0; i < len; i++)
        dinp[i] += (float)(dout[i] * gelu_grad(inp[i], kind));
}
