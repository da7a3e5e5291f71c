/* gelu.cu - GELU forward/backward, tanh approximation or exact erf form, bf16 or fp32
 * storage, fp32 arithmetic (the formulas of kernels/cpu/activation.c).  Grid-stride
 * loops: a bounded grid serves any n, including n >= 2^32.  16-byte accesses when all
 * pointers are 16-byte aligned. */
#include "cuda/kcuda_internal.h"

#define GELU_K 0.7978845608028654f      /* sqrt(2/pi) */
#define GELU_C 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

__device__ __forceinline__ float gelu(float x, int erf_kind)
{
    if (erf_kind)
        return 0.5f * x * (1.0f + erff(x * INV_SQRT2));
    return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x, int erf_kind)
{
    if (erf_kind)
        return 0.5f * (1.0f + erff(x * INV_SQRT2)) + x * expf(-0.5f * x * x) * INV_SQRT_2PI;
    float t = tanhf(GELU_K * (x + GELU_C * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}

/* Elements [0, nv * W) in W-element groups (16-byte accesses when W > 1), the rest one by
 * one by the same grid. */
template <typename T, int W, typename TO = T>
__global__ void gelu_fwd_kernel(TO *out, const T *inp, size_t n, int erf_kind)
{
    size_t stride = (size_t)gridDim.x * blockDim.x, nv = n / W;
    size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t v = t0; v < nv; v += stride) {
        float a[W];
        kcuda_ldw<W>(a, inp + v * W);
#pragma unroll
        for (int j = 0; j < W; j++)
            a[j] = gelu(a[j], erf_kind);
        kcuda_stw<W>(out + v * W, a);
    }
    for (size_t i = nv * W + t0; i < n; i += stride)
        kcuda_st(out + i, gelu(kcuda_ld(inp + i), erf_kind));
}

/* TO, TD: dinp's and dout's types (T, or bf16 beside an fp32 inp: kdev's activation
 * memory). */
template <typename T, int W, typename TO = T, typename TD = T>
__global__ void gelu_bwd_kernel(TO *dinp, const TD *dout, const T *inp, size_t n, int erf_kind,
                                int acc)
{
    size_t stride = (size_t)gridDim.x * blockDim.x, nv = n / W;
    size_t t0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t v = t0; v < nv; v += stride) {
        float a[W], g[W], d[W];
        kcuda_ldw<W>(a, inp + v * W);
        kcuda_ldw<W>(g, dout + v * W);
        if (acc)
            kcuda_ldw<W>(d, dinp + v * W);
#pragma unroll
        for (int j = 0; j < W; j++)
            d[j] = (acc ? d[j] : 0.0f) + g[j] * gelu_grad(a[j], erf_kind);
        kcuda_stw<W>(dinp + v * W, d);
    }
    for (size_t i = nv * W + t0; i < n; i += stride)
        kcuda_st(dinp + i, (acc ? kcuda_ld(dinp + i) : 0.0f) +
                               kcuda_ld(dout + i) * gelu_grad(kcuda_ld(inp + i), erf_kind));
}

#define GELU_THREADS 256
#define GELU_MAX_BLOCKS 65536

static unsigned gelu_blocks(size_t n, int W)
{
    size_t b = (n / W + GELU_THREADS - 1) / GELU_THREADS;
    if (b == 0)
        b = 1;
    return (unsigned)(b < GELU_MAX_BLOCKS ? b : GELU_MAX_BLOCKS);
}

static int gelu_args(kcuda_ctx *ctx, const void *a, const void *b, int kind, const char *fn)
{
    if (kind != 0 && kind != 1)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: unknown GELU kind %d", fn, kind);
    if (!a || !b)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: NULL tensor", fn);
    return KCUDA_OK;
}

/* TO: the output's type (T, or bf16 from fp32: kdev's activation memory); W follows the
 * input's 16-byte access. */
template <typename T, typename TO = T>
static int fwd(kcuda_ctx *ctx, TO *out, const T *inp, size_t n, int kind)
{
    int rc = gelu_args(ctx, out, inp, kind, "kcuda_gelu_forward");
    if (rc < 0 || n == 0)
        return rc;
    const int W = kcuda_vec<T>::n;
    if (kcuda_vec_ok<T>(0, out, inp))
        gelu_fwd_kernel<T, W, TO><<<gelu_blocks(n, W), GELU_THREADS, 0, ctx->stream>>>(
            out, inp, n, kind);
    else
        gelu_fwd_kernel<T, 1, TO><<<gelu_blocks(n, 1), GELU_THREADS, 0, ctx->stream>>>(
            out, inp, n, kind);
    return kcuda_check_launch(ctx, "gelu_fwd_kernel");
}

template <typename T, typename TO = T, typename TD = T>
static int bwd(kcuda_ctx *ctx, TO *dinp, const TD *dout, const T *inp, size_t n, int kind,
               int acc)
{
    int rc = gelu_args(ctx, dinp, dout, kind, "kcuda_gelu_backward");
    if (rc < 0 || n == 0)
        return rc;
    if (!inp)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_gelu_backward: NULL tensor");
    const int W = kcuda_vec<T>::n;
    if (kcuda_vec_ok<T>(0, dinp, dout, inp))
        gelu_bwd_kernel<T, W, TO, TD><<<gelu_blocks(n, W), GELU_THREADS, 0, ctx->stream>>>(
            dinp, dout, inp, n, kind, acc);
    else
        gelu_bwd_kernel<T, 1, TO, TD><<<gelu_blocks(n, 1), GELU_THREADS, 0, ctx->stream>>>(
            dinp, dout, inp, n, kind, acc);
    return kcuda_check_launch(ctx, "gelu_bwd_kernel");
}

typedef __nv_bfloat16 bf;

extern "C" int kcuda_gelu_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, const kcuda_bf16 *inp,
                                       size_t n, int kind)
{
    return fwd<bf>(ctx, (bf *)out, (const bf *)inp, n, kind);
}

extern "C" int kcuda_gelu_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp,
                                        const kcuda_bf16 *dout, const kcuda_bf16 *inp, size_t n,
                                        int kind, int accumulate)
{
    return bwd<bf>(ctx, (bf *)dinp, (const bf *)dout, (const bf *)inp, n, kind, accumulate);
}

extern "C" int kcuda_gelu_forward_f32(kcuda_ctx *ctx, float *out, const float *inp, size_t n,
                                      int kind)
{
    return fwd<float>(ctx, out, inp, n, kind);
}

extern "C" int kcuda_gelu_backward_f32(kcuda_ctx *ctx, float *dinp, const float *dout,
                                       const float *inp, size_t n, int kind, int accumulate)
{
    return bwd<float>(ctx, dinp, dout, inp, n, kind, accumulate);
}

extern "C" int kcuda_gelu_forward_f32_bf16out(kcuda_ctx *ctx, kcuda_bf16 *out, const float *inp,
                                              size_t n, int kind)
{
    return fwd<float, bf>(ctx, (bf *)out, inp, n, kind);
}

extern "C" int kcuda_gelu_backward_f32in(kcuda_ctx *ctx, void *dinp, int dinp_bf16,
                                         const void *dout, int dout_bf16, const float *inp,
                                         size_t n, int kind, int accumulate)
{
    if (dinp_bf16 && dout_bf16)
        return bwd<float, bf, bf>(ctx, (bf *)dinp, (const bf *)dout, inp, n, kind, accumulate);
    if (dinp_bf16)
        return bwd<float, bf, float>(ctx, (bf *)dinp, (const float *)dout, inp, n, kind,
                                     accumulate);
    if (dout_bf16)
        return bwd<float, float, bf>(ctx, (float *)dinp, (const bf *)dout, inp, n, kind,
                                     accumulate);
    return bwd<float>(ctx, (float *)dinp, (const float *)dout, inp, n, kind, accumulate);
}
