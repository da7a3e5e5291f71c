/* norm.cu - RMSNorm forward/backward, bf16 or fp32 storage, fp32 arithmetic.  One block
 * per row forward; the backward is norm_backward.cu's. */
#include "cuda/kcuda_internal.h"

#define ROW_THREADS 256

/* TO: the output's type (T, or bf16 from fp32: kdev's activation memory) */
template <typename T, typename TO = T>
__global__ void rmsnorm_fwd_kernel(TO *out, float *rstd, const T *inp, const T *weight, int C,
                                   float eps)
{
    const T *x = inp + (size_t)blockIdx.x * C;
    TO *y = out + (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = kcuda_ld(x + c);
        ss += v * v;
    }
    ss = kcuda_block_sum(ss);
    float r = rsqrtf(ss / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        kcuda_st(y + c, kcuda_ld(x + c) * r * kcuda_ld(weight + c));
    if (rstd && threadIdx.x == 0)
        rstd[blockIdx.x] = r;
}

template <typename T, typename TO = T>
static int fwd(kcuda_ctx *ctx, TO *out, float *rstd, const T *inp, const T *weight, int N,
               int C, float eps)
{
    if (N <= 0 || C <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_rmsnorm_forward: bad shape N=%d C=%d", N, C);
    rmsnorm_fwd_kernel<T, TO><<<N, ROW_THREADS, 0, ctx->stream>>>(out, rstd, inp, weight, C,
                                                                  eps);
    return kcuda_check_launch(ctx, "rmsnorm_fwd_kernel");
}

typedef __nv_bfloat16 bf;

extern "C" int kcuda_rmsnorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, float *rstd,
                                          const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                          int N, int C, float eps)
{
    return fwd<bf>(ctx, (bf *)out, rstd, (const bf *)inp, (const bf *)weight, N, C, eps);
}

extern "C" int kcuda_rmsnorm_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, float *dweight,
                                           const kcuda_bf16 *dout, const kcuda_bf16 *inp,
                                           const kcuda_bf16 *weight, const float *rstd, int N,
                                           int C)
{
    return kcuda_norm_backward_bf16(ctx, dinp, dweight, NULL, dout, inp, weight, NULL, rstd, N,
                                    C, "kcuda_rmsnorm_backward");
}

extern "C" int kcuda_rmsnorm_forward_f32(kcuda_ctx *ctx, float *out, float *rstd,
                                         const float *inp, const float *weight, int N, int C,
                                         float eps)
{
    return fwd<float>(ctx, out, rstd, inp, weight, N, C, eps);
}

extern "C" int kcuda_rmsnorm_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight,
                                          const float *dout, const float *inp,
                                          const float *weight, const float *rstd, int N, int C)
{
    return kcuda_norm_backward_f32(ctx, dinp, dweight, NULL, dout, inp, weight, NULL, rstd, N,
                                   C, "kcuda_rmsnorm_backward");
}

extern "C" int kcuda_rmsnorm_forward_f32_bf16out(kcuda_ctx *ctx, kcuda_bf16 *out, float *rstd,
                                                 const float *inp, const float *weight, int N,
                                                 int C, float eps)
{
    return fwd<float, bf>(ctx, (bf *)out, rstd, inp, weight, N, C, eps);
}
