/* norm.cu - RMSNorm forward/backward, bf16 or fp32 storage, fp32 arithmetic.
 * One block per row for the row-wise parts; the weight gradient sums rows in two passes:
 * fixed chunks of rows into fp32 partials in the context workspace (chunks x columns
 * threads), then one thread per column adds the chunks in order (deterministic, no
 * atomics).  One thread per column over every row, the fallback when the workspace is too
 * small for the partials, leaves most of the GPU idle (a head dim of 128 over 65536 rows
 * for qk_norm). */
#include "cuda/kcuda_internal.h"

#define ROW_THREADS 256

template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *weight, int C,
                                   float eps)
{
    const T *x = inp + (size_t)blockIdx.x * C;
    T *y = out + (size_t)blockIdx.x * C;
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

/* dx_c += r w_c dy_c - x_c r^3/C sum_k dy_k w_k x_k */
template <typename T>
__global__ void rmsnorm_bwd_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight,
                                        const float *rstd, int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const T *x = inp + off, *dy = dout + off;
    T *dx = dinp + off;
    float r = rstd[blockIdx.x], dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += kcuda_ld(dy + c) * kcuda_ld(weight + c) * kcuda_ld(x + c);
    dot = kcuda_block_sum(dot);
    float k = r * r * r * dot / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        kcuda_st(dx + c, kcuda_ld(dx + c) + r * kcuda_ld(weight + c) * kcuda_ld(dy + c) -
                             kcuda_ld(x + c) * k);
}

template <typename T>
__global__ void rmsnorm_bwd_dweight_kernel(float *dweight, const T *dout, const T *inp,
                                           const float *rstd, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = 0.0f;
    for (int i = 0; i < N; i++) {
        size_t o = (size_t)i * C + c;
        s += kcuda_ld(dout + o) * kcuda_ld(inp + o) * rstd[i];
    }
    dweight[c] += s;
}

#define DW_CHUNK_ROWS 256
#define DW_MAX_CHUNKS 128

template <typename T>
__global__ void rmsnorm_bwd_dweight_partial_kernel(float *part, const T *dout, const T *inp,
                                                   const float *rstd, int N, int C, int rows)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
    if (c >= C)
        return;
    int i0 = k * rows, i1 = i0 + rows < N ? i0 + rows : N;
    float s = 0.0f;
    for (int i = i0; i < i1; i++) {
        size_t o = (size_t)i * C + c;
        s += kcuda_ld(dout + o) * kcuda_ld(inp + o) * rstd[i];
    }
    part[(size_t)k * C + c] = s;
}

__global__ void rmsnorm_bwd_dweight_sum_kernel(float *dweight, const float *part, int chunks,
                                               int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++)
        s += part[(size_t)k * C + c];
    dweight[c] += s;
}

template <typename T>
static int bwd_dweight(kcuda_ctx *ctx, float *dweight, const T *dout, const T *inp,
                       const float *rstd, int N, int C)
{
    int chunks = (N + DW_CHUNK_ROWS - 1) / DW_CHUNK_ROWS;
    if (chunks > DW_MAX_CHUNKS)
        chunks = DW_MAX_CHUNKS;
    unsigned cols = (unsigned)((C + 127) / 128);
    if (chunks <= 1 || sizeof(float) * (size_t)chunks * (size_t)C > ctx->workspace_bytes) {
        rmsnorm_bwd_dweight_kernel<T><<<cols, 128, 0, ctx->stream>>>(dweight, dout, inp, rstd,
                                                                     N, C);
        return kcuda_check_launch(ctx, "rmsnorm_bwd_dweight_kernel");
    }
    int rows = (N + chunks - 1) / chunks;
    chunks = (N + rows - 1) / rows;
    float *part = (float *)ctx->workspace;
    rmsnorm_bwd_dweight_partial_kernel<T><<<dim3(cols, (unsigned)chunks), 128, 0,
                                            ctx->stream>>>(part, dout, inp, rstd, N, C, rows);
    int rc = kcuda_check_launch(ctx, "rmsnorm_bwd_dweight_partial_kernel");
    if (rc < 0)
        return rc;
    rmsnorm_bwd_dweight_sum_kernel<<<cols, 128, 0, ctx->stream>>>(dweight, part, chunks, C);
    return kcuda_check_launch(ctx, "rmsnorm_bwd_dweight_sum_kernel");
}

template <typename T>
static int fwd(kcuda_ctx *ctx, T *out, float *rstd, const T *inp, const T *weight, int N,
               int C, float eps)
{
    if (N <= 0 || C <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_rmsnorm_forward: bad shape N=%d C=%d", N, C);
    rmsnorm_fwd_kernel<T><<<N, ROW_THREADS, 0, ctx->stream>>>(out, rstd, inp, weight, C, eps);
    return kcuda_check_launch(ctx, "rmsnorm_fwd_kernel");
}

template <typename T>
static int bwd(kcuda_ctx *ctx, T *dinp, float *dweight, const T *dout, const T *inp,
               const T *weight, const float *rstd, int N, int C)
{
    int rc;
    if (N <= 0 || C <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_rmsnorm_backward: bad shape N=%d C=%d", N, C);
    if (dinp) {
        rmsnorm_bwd_dinp_kernel<T><<<N, ROW_THREADS, 0, ctx->stream>>>(dinp, dout, inp, weight,
                                                                         rstd, C);
        if ((rc = kcuda_check_launch(ctx, "rmsnorm_bwd_dinp_kernel")) < 0)
            return rc;
    }
    if (dweight)
        return bwd_dweight<T>(ctx, dweight, dout, inp, rstd, N, C);
    return KCUDA_OK;
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
    return bwd<bf>(ctx, (bf *)dinp, dweight, (const bf *)dout, (const bf *)inp,
                   (const bf *)weight, rstd, N, C);
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
    return bwd<float>(ctx, dinp, dweight, dout, inp, weight, rstd, N, C);
}
