/* layernorm.cu - LayerNorm forward/backward and the fused residual-add + norm forwards
 * (RMSNorm and LayerNorm), bf16 or fp32 storage, fp32 arithmetic and row statistics.
 * One block per row; the backward is norm_backward.cu's. */
#include "cuda/kcuda_internal.h"

/* One thread per W-element group up to 256 (a multiple of 32, as kcuda_block_sum needs):
 * narrow rows get small blocks, whose reductions are cheaper. */
static int row_threads(int C, int W)
{
    int items = (C / W + 31) / 32 * 32;
    return items < 256 ? items : 256;
}

/* kern<T, W> on N blocks, W = 16 bytes of T when every row pointer allows it, else 1. */
#define LAUNCH_ROWS(kern, vec, N, C, ...)                                                   \
    do {                                                                                    \
        const int W_ = kcuda_vec<T>::n;                                                     \
        if (vec)                                                                            \
            kern<T, W_><<<N, row_threads(C, W_), 0, ctx->stream>>>(__VA_ARGS__);            \
        else                                                                                \
            kern<T, 1><<<N, row_threads(C, 1), 0, ctx->stream>>>(__VA_ARGS__);              \
    } while (0)

/* ---- forward ------------------------------------------------------------------- */

/* Every row loop below walks the row the same way, W elements (one 16-byte access when
 * W > 1) at a time: a thread re-reads only elements it read or wrote itself. */
#define ROW_LOOP(c) for (int c = threadIdx.x * W; c < C; c += blockDim.x * W)

__device__ __forceinline__ float round_as(float v, const float *) { return v; }
__device__ __forceinline__ float round_as(float v, const __nv_bfloat16 *)
{
    return __bfloat162float(__float2bfloat16_rn(v));
}

/* The second and third passes re-read the row (from L1/L2, it was just read). */
template <typename T, int W, typename TO>
__device__ void layernorm_row(TO *y, float *mean, float *rstd, const T *x, const T *weight,
                              const T *bias, int C, float eps, float s)
{
    float mu = kcuda_block_sum(s) / (float)C, v = 0.0f;
    ROW_LOOP(c) {
        float a[W];
        kcuda_ldw<W>(a, x + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            v += (a[j] - mu) * (a[j] - mu); /* two passes: no cancellation */
    }
    float r = rsqrtf(kcuda_block_sum(v) / (float)C + eps);
    ROW_LOOP(c) {
        float a[W], w[W], b[W];
        kcuda_ldw<W>(a, x + c);
        kcuda_ldw<W>(w, weight + c);
        if (bias)
            kcuda_ldw<W>(b, bias + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            a[j] = (a[j] - mu) * r * w[j] + (bias ? b[j] : 0.0f);
        kcuda_stw<W>(y + c, a);
    }
    if (threadIdx.x == 0) {
        if (mean)
            mean[blockIdx.x] = mu;
        if (rstd)
            rstd[blockIdx.x] = r;
    }
}

/* TO: the output's type (T, or bf16 from fp32: kdev's activation memory) */
template <typename T, int W, typename TO = T>
__global__ void layernorm_fwd_kernel(TO *out, float *mean, float *rstd, const T *inp,
                                     const T *weight, const T *bias, int C, float eps)
{
    size_t off = (size_t)blockIdx.x * C;
    float s = 0.0f;
    ROW_LOOP(c) {
        float a[W];
        kcuda_ldw<W>(a, inp + off + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            s += a[j];
    }
    layernorm_row<T, W, TO>(out + off, mean, rstd, inp + off, weight, bias, C, eps, s);
}

/* sum[c..c+W) = x + r rounded to T, also left in a[] (sum may alias x or r: the thread
 * reads its elements before it writes them). */
template <typename T, int W>
__device__ __forceinline__ void residual_add(float *a, T *sum, const T *x, const T *r, int c)
{
    float b[W];
    kcuda_ldw<W>(a, x + c);
    kcuda_ldw<W>(b, r + c);
#pragma unroll
    for (int j = 0; j < W; j++)
        a[j] = round_as(a[j] + b[j], sum);
    kcuda_stw<W>(sum + c, a);
}

template <typename T, int W>
__global__ void residual_layernorm_fwd_kernel(T *out, T *sum, float *mean, float *rstd,
                                              const T *x, const T *r, const T *weight,
                                              const T *bias, int C, float eps)
{
    size_t off = (size_t)blockIdx.x * C;
    float s = 0.0f;
    ROW_LOOP(c) {
        float a[W];
        residual_add<T, W>(a, sum + off, x + off, r + off, c);
#pragma unroll
        for (int j = 0; j < W; j++)
            s += a[j];
    }
    layernorm_row<T, W, T>(out + off, mean, rstd, (const T *)sum + off, weight, bias, C, eps,
                           s);
}

/* The arithmetic of norm.cu's rmsnorm_fwd_kernel, on the rounded sum. */
template <typename T, int W>
__global__ void residual_rmsnorm_fwd_kernel(T *out, T *sum, float *rstd, const T *x,
                                            const T *r, const T *weight, int C, float eps)
{
    size_t off = (size_t)blockIdx.x * C;
    float ss = 0.0f;
    ROW_LOOP(c) {
        float a[W];
        residual_add<T, W>(a, sum + off, x + off, r + off, c);
#pragma unroll
        for (int j = 0; j < W; j++)
            ss += a[j] * a[j];
    }
    float rs = rsqrtf(kcuda_block_sum(ss) / (float)C + eps);
    ROW_LOOP(c) {
        float a[W], w[W];
        kcuda_ldw<W>(a, sum + off + c);
        kcuda_ldw<W>(w, weight + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            a[j] = a[j] * rs * w[j];
        kcuda_stw<W>(out + off + c, a);
    }
    if (rstd && threadIdx.x == 0)
        rstd[blockIdx.x] = rs;
}

/* ---- host side ------------------------------------------------------------------ */

static int bad_shape(kcuda_ctx *ctx, const char *fn, int N, int C)
{
    return kcuda_fail(ctx, KCUDA_EARG, "%s: bad shape N=%d C=%d", fn, N, C);
}

template <typename T>
static int ln_fwd(kcuda_ctx *ctx, T *out, float *mean, float *rstd, const T *inp,
                  const T *weight, const T *bias, int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return bad_shape(ctx, "kcuda_layernorm_forward", N, C);
    if (!out || !inp || !weight)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_layernorm_forward: NULL tensor");
    LAUNCH_ROWS(layernorm_fwd_kernel, kcuda_vec_ok<T>(C, out, inp, weight, bias), N, C, out,
                mean, rstd, inp, weight, bias, C, eps);
    return kcuda_check_launch(ctx, "layernorm_fwd_kernel");
}

typedef __nv_bfloat16 bf;

extern "C" int kcuda_layernorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, float *mean,
                                            float *rstd, const kcuda_bf16 *inp,
                                            const kcuda_bf16 *weight, const kcuda_bf16 *bias,
                                            int N, int C, float eps)
{
    return ln_fwd<bf>(ctx, (bf *)out, mean, rstd, (const bf *)inp, (const bf *)weight,
                      (const bf *)bias, N, C, eps);
}

extern "C" int kcuda_layernorm_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, float *dweight,
                                             float *dbias, const kcuda_bf16 *dout,
                                             const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                             const float *mean, const float *rstd, int N, int C)
{
    if (!mean)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_layernorm_backward: NULL tensor");
    return kcuda_norm_backward_bf16(ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                                    N, C, "kcuda_layernorm_backward");
}

extern "C" int kcuda_layernorm_forward_f32(kcuda_ctx *ctx, float *out, float *mean, float *rstd,
                                           const float *inp, const float *weight,
                                           const float *bias, int N, int C, float eps)
{
    return ln_fwd<float>(ctx, out, mean, rstd, inp, weight, bias, N, C, eps);
}

extern "C" int kcuda_layernorm_forward_f32_bf16out(kcuda_ctx *ctx, kcuda_bf16 *out,
                                                   float *mean, float *rstd, const float *inp,
                                                   const float *weight, const float *bias,
                                                   int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return bad_shape(ctx, "kcuda_layernorm_forward", N, C);
    if (!out || !inp || !weight)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_layernorm_forward: NULL tensor");
    typedef float T;   /* 4 fp32 in, 4 bf16 (8 bytes) out per access */
    LAUNCH_ROWS(layernorm_fwd_kernel, kcuda_vec_ok<T>(C, out, inp, weight, bias), N, C, (bf *)out,
                mean, rstd, inp, weight, bias, C, eps);
    return kcuda_check_launch(ctx, "layernorm_fwd_kernel");
}

extern "C" int kcuda_layernorm_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight,
                                            float *dbias, const float *dout, const float *inp,
                                            const float *weight, const float *mean,
                                            const float *rstd, int N, int C)
{
    if (!mean)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_layernorm_backward: NULL tensor");
    return kcuda_norm_backward_f32(ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                   C, "kcuda_layernorm_backward");
}

extern "C" int kcuda_residual_rmsnorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out,
                                                   kcuda_bf16 *sum, float *rstd,
                                                   const kcuda_bf16 *x, const kcuda_bf16 *r,
                                                   const kcuda_bf16 *weight, int N, int C,
                                                   float eps)
{
    if (N <= 0 || C <= 0)
        return bad_shape(ctx, "kcuda_residual_rmsnorm_forward_bf16", N, C);
    if (!out || !sum || !x || !r || !weight)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_residual_rmsnorm_forward_bf16: NULL tensor");
    typedef bf T;
    LAUNCH_ROWS(residual_rmsnorm_fwd_kernel, kcuda_vec_ok<T>(C, out, sum, x, r, weight), N, C,
                (T *)out, (T *)sum, rstd, (const T *)x, (const T *)r, (const T *)weight, C, eps);
    return kcuda_check_launch(ctx, "residual_rmsnorm_fwd_kernel");
}

extern "C" int kcuda_residual_layernorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out,
                                                     kcuda_bf16 *sum, float *mean, float *rstd,
                                                     const kcuda_bf16 *x, const kcuda_bf16 *r,
                                                     const kcuda_bf16 *weight,
                                                     const kcuda_bf16 *bias, int N, int C,
                                                     float eps)
{
    if (N <= 0 || C <= 0)
        return bad_shape(ctx, "kcuda_residual_layernorm_forward_bf16", N, C);
    if (!out || !sum || !x || !r || !weight)
        return kcuda_fail(ctx, KCUDA_EARG,
                          "kcuda_residual_layernorm_forward_bf16: NULL tensor");
    typedef bf T;
    LAUNCH_ROWS(residual_layernorm_fwd_kernel,
                kcuda_vec_ok<T>(C, out, sum, x, r, weight) && kcuda_vec_ok<T>(C, bias), N, C,
                (T *)out, (T *)sum, mean, rstd, (const T *)x, (const T *)r, (const T *)weight,
                (const T *)bias, C, eps);
    return kcuda_check_launch(ctx, "residual_layernorm_fwd_kernel");
}
