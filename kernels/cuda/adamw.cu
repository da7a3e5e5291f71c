/* adamw.cu - AdamW on fp32 master weights, optionally refreshing a bf16 copy.
 * Per-element arithmetic in fp32 (the CPU reference uses double; the difference is a few
 * fp32 ulps per step).  The bias corrections are computed once on the host in double. */
#include "cuda/kcuda_internal.h"

#include <math.h>

__global__ void adamw_kernel(float *param, __nv_bfloat16 *param_bf16, const float *grad,
                             float *m, float *v, size_t n, float lr, float b1, float b2,
                             float rbc1, float rbc2, float eps, float wd)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float g = grad[i], p = param[i];
    float mi = b1 * m[i] + (1.0f - b1) * g;
    float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= lr * ((mi * rbc1) / (sqrtf(vi * rbc2) + eps) + wd * p);
    param[i] = p;
    if (param_bf16)
        param_bf16[i] = __float2bfloat16_rn(p);
}

extern "C" int kcuda_adamw_update(kcuda_ctx *ctx, float *param, kcuda_bf16 *param_bf16,
                                  const float *grad, float *m, float *v, size_t n, float lr,
                                  float beta1, float beta2, float eps, float weight_decay,
                                  int step)
{
    if (step < 1)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_adamw_update: step %d < 1", step);
    if (n == 0)
        return KCUDA_OK;
    float rbc1 = (float)(1.0 / (1.0 - pow((double)beta1, step)));
    float rbc2 = (float)(1.0 / (1.0 - pow((double)beta2, step)));
    adamw_kernel<<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(
        param, (__nv_bfloat16 *)param_bf16, grad, m, v, n, lr, beta1, beta2, rbc1, rbc2, eps,
        weight_decay);
    return kcuda_check_launch(ctx, "adamw_kernel");
}
