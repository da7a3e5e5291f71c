/* embedding.cu - embedding lookup and its deterministic scatter-add backward.
 * The backward must not use float atomics (their order, and so the rounding, varies from
 * run to run when tokens share an id).  Instead the (id, token) pairs are radix-sorted
 * (CUB, stable: equal ids stay in token order) in the context workspace, and each
 * distinct id's row is owned by one block per column tile, which adds the tokens' rows
 * in token order starting from the old value: the exact summation order of
 * kcpu_embedding_backward. */
#include "cuda/kcuda_internal.h"

#include <cub/device/device_radix_sort.cuh>

static int col_threads(int C)
{
    int t = (C + 31) / 32 * 32;
    return t < 256 ? t : 256;
}

template <typename T>
__global__ void embedding_fwd_kernel(T *out, const int *ids, const T *table, int C)
{
    const T *src = table + (size_t)ids[blockIdx.x] * C;
    T *dst = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dst[c] = src[c];
}

__global__ void iota_kernel(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = i;
}

/* Block (j, tile): when sorted position j starts a run of equal ids, sums that run's
 * dout rows over the tile's columns; other blocks return at once. */
template <typename T>
__global__ void embedding_bwd_kernel(float *dtable, const T *dout, const int *sorted_ids,
                                     const int *sorted_tok, int N, int C)
{
    int j = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    int id = sorted_ids[j];
    if ((j > 0 && sorted_ids[j - 1] == id) || c >= C)
        return;
    float *dst = dtable + (size_t)id * C + c;
    float acc = *dst;
#pragma unroll 4
    for (int k = j; k < N && sorted_ids[k] == id; k++)
        acc += kcuda_ld(dout + (size_t)sorted_tok[k] * C + c);
    *dst = acc;
}

template <typename T>
static int fwd(kcuda_ctx *ctx, T *out, const int *ids, const T *table, int N, int C)
{
    if (N <= 0 || C <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_embedding_forward: bad shape N=%d C=%d", N, C);
    if (!out || !ids || !table)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_embedding_forward: NULL tensor");
    embedding_fwd_kernel<T><<<N, col_threads(C), 0, ctx->stream>>>(out, ids, table, C);
    return kcuda_check_launch(ctx, "embedding_fwd_kernel");
}

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

template <typename T>
static int bwd(kcuda_ctx *ctx, float *dtable, const T *dout, const int *ids, int N, int C)
{
    int rc;
    if (N <= 0 || C <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_embedding_backward: bad shape N=%d C=%d", N,
                          C);
    if (!dtable || !dout || !ids)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_embedding_backward: NULL tensor");
    /* workspace: sorted ids | token iota | sorted tokens | sort scratch */
    size_t arr = align256((size_t)N * sizeof(int)), scratch = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, scratch, ids, (int *)NULL,
                                                    (const int *)NULL, (int *)NULL, N, 0, 32,
                                                    ctx->stream);
    if (e != cudaSuccess)
        return kcuda_fail(ctx, KCUDA_ECUDA, "kcuda_embedding_backward: sort size: %s",
                          cudaGetErrorString(e));
    if (3 * arr + scratch > ctx->workspace_bytes)
        return kcuda_fail(ctx, KCUDA_ENOMEM,
                          "kcuda_embedding_backward: N=%d needs %zu bytes of workspace, the "
                          "context has %zu",
                          N, 3 * arr + scratch, ctx->workspace_bytes);
    char *ws = (char *)ctx->workspace;
    int *sorted_ids = (int *)ws, *iota = (int *)(ws + arr), *sorted_tok = (int *)(ws + 2 * arr);
    iota_kernel<<<(N + 255) / 256, 256, 0, ctx->stream>>>(iota, N);
    if ((rc = kcuda_check_launch(ctx, "iota_kernel")) < 0)
        return rc;
    /* stable: tokens of one id keep their order (CUB orders signed keys correctly) */
    e = cub::DeviceRadixSort::SortPairs(ws + 3 * arr, scratch, ids, sorted_ids,
                                        (const int *)iota, sorted_tok, N, 0, 32, ctx->stream);
    if (e != cudaSuccess)
        return kcuda_fail(ctx, KCUDA_ECUDA, "kcuda_embedding_backward: sort: %s",
                          cudaGetErrorString(e));
    int threads = col_threads(C);
    dim3 grid(N, (C + threads - 1) / threads);
    embedding_bwd_kernel<T><<<grid, threads, 0, ctx->stream>>>(dtable, dout, sorted_ids,
                                                               sorted_tok, N, C);
    return kcuda_check_launch(ctx, "embedding_bwd_kernel");
}

typedef __nv_bfloat16 bf;

extern "C" int kcuda_embedding_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, const int *ids,
                                            const kcuda_bf16 *table, int N, int C)
{
    return fwd<bf>(ctx, (bf *)out, ids, (const bf *)table, N, C);
}

extern "C" int kcuda_embedding_backward_bf16(kcuda_ctx *ctx, float *dtable,
                                             const kcuda_bf16 *dout, const int *ids, int N,
                                             int C)
{
    return bwd<bf>(ctx, dtable, (const bf *)dout, ids, N, C);
}

extern "C" int kcuda_embedding_forward_f32(kcuda_ctx *ctx, float *out, const int *ids,
                                           const float *table, int N, int C)
{
    return fwd<float>(ctx, out, ids, table, N, C);
}

extern "C" int kcuda_embedding_backward_f32(kcuda_ctx *ctx, float *dtable, const float *dout,
                                            const int *ids, int N, int C)
{
    return bwd<float>(ctx, dtable, dout, ids, N, C);
}
