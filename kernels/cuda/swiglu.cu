/* swiglu.cu - SwiGLU forward/backward: out = silu(gate) * up, one thread per output. */
#include "cuda/kcuda_internal.h"

template <typename T, typename TO = T>
__global__ void swiglu_fwd_kernel(TO *out, const T *inp, int N, int F)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F)
        return;
    size_t row = i / F, col = i % F;
    const T *in = inp + row * 2 * F;
    float g = kcuda_ld(in + col), u = kcuda_ld(in + F + col);
    float s = 1.0f / (1.0f + expf(-g));
    kcuda_st(out + i, g * s * u);
}

/* d gate = dy * up * s * (1 + g (1 - s)),  d up = dy * g * s */
template <typename T, typename TO = T, typename TD = T>
__global__ void swiglu_bwd_kernel(TO *dinp, const TD *dout, const T *inp, int N, int F, int acc)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F)
        return;
    size_t row = i / F, col = i % F;
    const T *in = inp + row * 2 * F;
    TO *din = dinp + row * 2 * F;
    float g = kcuda_ld(in + col), u = kcuda_ld(in + F + col), dy = kcuda_ld(dout + i);
    float s = 1.0f / (1.0f + expf(-g));
    float dg = dy * u * s * (1.0f + g * (1.0f - s)), du = dy * g * s;
    kcuda_st(din + col, acc ? kcuda_ld(din + col) + dg : dg);
    kcuda_st(din + F + col, acc ? kcuda_ld(din + F + col) + du : du);
}

/* TO: the output's type (T, or bf16 from fp32: kdev's activation memory) */
template <typename T, typename TO = T>
static int fwd(kcuda_ctx *ctx, TO *out, const T *inp, int N, int F)
{
    if (N <= 0 || F <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_swiglu_forward: bad shape N=%d F=%d", N, F);
    size_t n = (size_t)N * F;
    swiglu_fwd_kernel<T, TO><<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(out, inp, N,
                                                                                   F);
    return kcuda_check_launch(ctx, "swiglu_fwd_kernel");
}

/* TO, TD: dinp's and dout's types (T, or bf16 beside an fp32 inp: kdev's activation
 * memory). */
template <typename T, typename TO = T, typename TD = T>
static int bwd(kcuda_ctx *ctx, TO *dinp, const TD *dout, const T *inp, int N, int F, int acc)
{
    if (N <= 0 || F <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_swiglu_backward: bad shape N=%d F=%d", N, F);
    size_t n = (size_t)N * F;
    swiglu_bwd_kernel<T, TO, TD><<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(
        dinp, dout, inp, N, F, acc);
    return kcuda_check_launch(ctx, "swiglu_bwd_kernel");
}

typedef __nv_bfloat16 bf;

extern "C" int kcuda_swiglu_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out,
                                         const kcuda_bf16 *inp, int N, int F)
{
    return fwd<bf>(ctx, (bf *)out, (const bf *)inp, N, F);
}

extern "C" int kcuda_swiglu_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp,
                                          const kcuda_bf16 *dout, const kcuda_bf16 *inp, int N,
                                          int F, int accumulate)
{
    return bwd<bf>(ctx, (bf *)dinp, (const bf *)dout, (const bf *)inp, N, F, accumulate);
}

extern "C" int kcuda_swiglu_forward_f32(kcuda_ctx *ctx, float *out, const float *inp, int N,
                                        int F)
{
    return fwd<float>(ctx, out, inp, N, F);
}

extern "C" int kcuda_swiglu_backward_f32(kcuda_ctx *ctx, float *dinp, const float *dout,
                                         const float *inp, int N, int F, int accumulate)
{
    return bwd<float>(ctx, dinp, dout, inp, N, F, accumulate);
}

extern "C" int kcuda_swiglu_forward_f32_bf16out(kcuda_ctx *ctx, kcuda_bf16 *out,
                                                const float *inp, int N, int F)
{
    return fwd<float, bf>(ctx, (bf *)out, inp, N, F);
}

extern "C" int kcuda_swiglu_backward_f32in(kcuda_ctx *ctx, void *dinp, int dinp_bf16,
                                           const void *dout, int dout_bf16, const float *inp,
                                           int N, int F, int accumulate)
{
    if (dinp_bf16 && dout_bf16)
        return bwd<float, bf, bf>(ctx, (bf *)dinp, (const bf *)dout, inp, N, F, accumulate);
    if (dinp_bf16)
        return bwd<float, bf, float>(ctx, (bf *)dinp, (const float *)dout, inp, N, F,
                                     accumulate);
    if (dout_bf16)
        return bwd<float, float, bf>(ctx, (float *)dinp, (const bf *)dout, inp, N, F,
                                     accumulate);
    return bwd<float>(ctx, (float *)dinp, (const float *)dout, inp, N, F, accumulate);
}
