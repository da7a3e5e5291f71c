/* multi_tensor.cu - one launch over many fp32 tensors: the sum of squares for the global
 * gradient norm, the clipping factor, and AdamW on fp32 master weights with a bf16
 * working copy.
 *
 * The tensors come as a device array of descriptors.  A one-block plan kernel writes the
 * exclusive prefix of each tensor's chunk count (KCUDA_MT_CHUNK elements a chunk) into the
 * workspace; then MT_BLOCKS blocks take chunks k = blockIdx.x, + MT_BLOCKS, ... and find
 * each chunk's tensor by binary search in the prefix.  MT_BLOCKS is a constant, not the
 * device's SM count, so the order of every sum is fixed by the tensor sizes alone. */
#include "cuda/kcuda_internal.h"

#include <cub/block/block_scan.cuh>
#include <math.h>
#include <stdint.h>

#define CH KCUDA_MT_CHUNK
#define MT_BLOCKS 1024
#define MT_THREADS 256
#define PLAN_THREADS 1024

template <typename D>
__global__ void mt_plan_kernel(int *prefix, const D *tensors, int ntensors)
{
    typedef cub::BlockScan<int, PLAN_THREADS> Scan;
    __shared__ typename Scan::TempStorage tmp;
    int carry = 0;
    for (int base = 0; base < ntensors; base += PLAN_THREADS) {
        int t = base + threadIdx.x, excl, agg;
        int cnt = t < ntensors ? (int)((tensors[t].n + CH - 1) / CH) : 0;
        Scan(tmp).ExclusiveSum(cnt, excl, agg);
        if (t < ntensors)
            prefix[t] = carry + excl;
        carry += agg;
        __syncthreads(); /* tmp is reused by the next tile */
    }
    if (threadIdx.x == 0)
        prefix[ntensors] = carry;
}

/* The tensor of chunk k: the largest t with prefix[t] <= k (empty tensors, whose prefix
 * equals the next one's, are skipped that way).  Needs 0 <= k < prefix[ntensors]. */
__device__ __forceinline__ int mt_find(const int *prefix, int ntensors, int k)
{
    int lo = 0, hi = ntensors - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (prefix[mid] <= k)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* ---- sum of squares ------------------------------------------------------------- */

__device__ __forceinline__ double block_sum_f64(double v, double *part)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < nw; w++) /* one fixed order */
        t += part[w];
    return t;
}

__global__ void mt_sumsq_kernel(double *partial, const kcuda_tensor_f32 *tensors, int ntensors,
                                const int *prefix)
{
    __shared__ double part[32];
    int total = prefix[ntensors];
    double s = 0.0;
    for (int k = blockIdx.x; k < total; k += gridDim.x) {
        int t = mt_find(prefix, ntensors, k);
        size_t start = (size_t)(k - prefix[t]) * CH, n = tensors[t].n - start;
        int len = n < CH ? (int)n : CH;
        const float *x = tensors[t].p + start;
        int i0 = 0;
        if (aligned16(x)) {
            const float4 *x4 = (const float4 *)x;
            for (int i = threadIdx.x; i < len / 4; i += blockDim.x) {
                float4 q = x4[i];
                s += (double)q.x * q.x + (double)q.y * q.y + (double)q.z * q.z +
                     (double)q.w * q.w;
            }
            i0 = len / 4 * 4;
        }
        for (int i = i0 + threadIdx.x; i < len; i += blockDim.x)
            s += (double)x[i] * x[i];
    }
    s = block_sum_f64(s, part);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

/* One block of MT_BLOCKS threads adds the block sums in a fixed tree. */
__global__ void mt_sumsq_final_kernel(double *sumsq, const double *partial)
{
    __shared__ double part[32];
    double s = block_sum_f64(partial[threadIdx.x], part);
    if (threadIdx.x == 0)
        *sumsq = s;
}

/* As kcpu_clip_factor(sqrt(*sumsq), max_norm); a NaN norm gives NaN. */
__global__ void clip_factor_kernel(float *factor, const double *sumsq, float max_norm)
{
    double norm = sqrt(*sumsq);
    if (max_norm <= 0.0f || norm <= (double)max_norm)
        *factor = 1.0f;
    else
        *factor = (float)((double)max_norm / (norm + 1e-6));
}

/* ---- AdamW ------------------------------------------------------------------------ */

struct adamw_hyper {
    double b1, omb1, b2, omb2, bc1, bc2, eps, lr, wd;
};

/* kcpu_adamw_update's arithmetic, operation by operation, with explicit rounding
 * intrinsics so that nvcc does not contract into FMAs: the result is the CPU's. */
__device__ __forceinline__ void adamw_elem(float &p, float &m, float &v, float grad, float clip,
                                           const adamw_hyper &h, double wd)
{
    double g = (double)__fmul_rn(grad, clip); /* kcpu_scale's fp32 product */
    double mi = __dadd_rn(__dmul_rn(h.b1, (double)m), __dmul_rn(h.omb1, g));
    double vi = __dadd_rn(__dmul_rn(h.b2, (double)v), __dmul_rn(__dmul_rn(h.omb2, g), g));
    m = __double2float_rn(mi);
    v = __double2float_rn(vi);
    double upd = __dadd_rn(__ddiv_rn(__ddiv_rn(mi, h.bc1),
                                     __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, h.bc2)), h.eps)),
                           __dmul_rn(wd, (double)p));
    p = __double2float_rn(__dsub_rn((double)p, __dmul_rn(h.lr, upd)));
}

__global__ void mt_adamw_kernel(const kcuda_adamw_tensor *tensors, int ntensors,
                                const int *prefix, const float *clip_p, adamw_hyper h)
{
    int total = prefix[ntensors];
    float clip = clip_p ? *clip_p : 1.0f;
    for (int k = blockIdx.x; k < total; k += gridDim.x) {
        int t = mt_find(prefix, ntensors, k);
        kcuda_adamw_tensor d = tensors[t];
        size_t start = (size_t)(k - prefix[t]) * CH, n = d.n - start;
        int len = n < CH ? (int)n : CH;
        float *P = d.param + start, *M = d.m + start, *V = d.v + start;
        const float *G = d.grad + start;
        __nv_bfloat16 *B = d.param_bf16 ? (__nv_bfloat16 *)d.param_bf16 + start : NULL;
        double wd = d.decay ? h.wd : 0.0;
        int i0 = 0;
        if (aligned16(P) && aligned16(M) && aligned16(V) && aligned16(G) &&
            ((uintptr_t)B & 7) == 0) {
            for (int i = threadIdx.x; i < len / 4; i += blockDim.x) {
                float4 p = ((float4 *)P)[i], m = ((float4 *)M)[i], v = ((float4 *)V)[i];
                float4 g = ((const float4 *)G)[i];
                adamw_elem(p.x, m.x, v.x, g.x, clip, h, wd);
                adamw_elem(p.y, m.y, v.y, g.y, clip, h, wd);
                adamw_elem(p.z, m.z, v.z, g.z, clip, h, wd);
                adamw_elem(p.w, m.w, v.w, g.w, clip, h, wd);
                ((float4 *)P)[i] = p;
                ((float4 *)M)[i] = m;
                ((float4 *)V)[i] = v;
                if (B) {
                    __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y);
                    __nv_bfloat162 hi = __floats2bfloat162_rn(p.z, p.w);
                    uint2 u;
                    u.x = *(uint32_t *)&lo;
                    u.y = *(uint32_t *)&hi;
                    ((uint2 *)B)[i] = u;
                }
            }
            i0 = len / 4 * 4;
        }
        for (int i = i0 + threadIdx.x; i < len; i += blockDim.x) {
            float p = P[i], m = M[i], v = V[i];
            adamw_elem(p, m, v, G[i], clip, h, wd);
            P[i] = p;
            M[i] = m;
            V[i] = v;
            if (B)
                B[i] = __float2bfloat16_rn(p);
        }
    }
}

/* ---- host side ------------------------------------------------------------------- */

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* Checks the list, reserves the prefix in the workspace and launches the plan. */
template <typename D>
static int mt_plan(kcuda_ctx *ctx, int **prefix, const D *tensors, int ntensors, size_t extra,
                   const char *fn)
{
    if (ntensors < 0 || (ntensors > 0 && !tensors))
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bad tensor list (%d tensors)", fn, ntensors);
    size_t need = align256(((size_t)ntensors + 1) * sizeof(int)) + extra;
    if (need > ctx->workspace_bytes)
        return kcuda_fail(ctx, KCUDA_ENOMEM, "%s: %d tensors need %zu bytes of workspace, the "
                          "context has %zu", fn, ntensors, need, ctx->workspace_bytes);
    *prefix = (int *)ctx->workspace;
    mt_plan_kernel<D><<<1, PLAN_THREADS, 0, ctx->stream>>>(*prefix, tensors, ntensors);
    return kcuda_check_launch(ctx, "mt_plan_kernel");
}

extern "C" int kcuda_multi_sumsq_f32(kcuda_ctx *ctx, double *sumsq,
                                     const kcuda_tensor_f32 *tensors, int ntensors)
{
    int *prefix = NULL, rc;
    if (!sumsq)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_multi_sumsq_f32: NULL output");
    if ((rc = mt_plan(ctx, &prefix, tensors, ntensors, MT_BLOCKS * sizeof(double),
                      "kcuda_multi_sumsq_f32")) < 0)
        return rc;
    double *partial =
        (double *)((char *)ctx->workspace + align256(((size_t)ntensors + 1) * sizeof(int)));
    /* with no tensors every block writes a zero partial: the total is 0 */
    mt_sumsq_kernel<<<MT_BLOCKS, MT_THREADS, 0, ctx->stream>>>(partial, tensors, ntensors,
                                                               prefix);
    if ((rc = kcuda_check_launch(ctx, "mt_sumsq_kernel")) < 0)
        return rc;
    mt_sumsq_final_kernel<<<1, MT_BLOCKS, 0, ctx->stream>>>(sumsq, partial);
    return kcuda_check_launch(ctx, "mt_sumsq_final_kernel");
}

extern "C" int kcuda_clip_factor(kcuda_ctx *ctx, float *factor, const double *sumsq,
                                 float max_norm)
{
    if (!factor || !sumsq)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_clip_factor: NULL pointer");
    clip_factor_kernel<<<1, 1, 0, ctx->stream>>>(factor, sumsq, max_norm);
    return kcuda_check_launch(ctx, "clip_factor_kernel");
}

extern "C" int kcuda_multi_adamw_update(kcuda_ctx *ctx, const kcuda_adamw_tensor *tensors,
                                        int ntensors, const float *clip, float lr, float beta1,
                                        float beta2, float eps, float weight_decay, int step)
{
    int *prefix = NULL, rc;
    if (step < 1)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_multi_adamw_update: step %d < 1", step);
    if (ntensors == 0)
        return KCUDA_OK;
    if ((rc = mt_plan(ctx, &prefix, tensors, ntensors, 0, "kcuda_multi_adamw_update")) < 0)
        return rc;
    /* the host half of kcpu_adamw_update, in the same double arithmetic */
    adamw_hyper h;
    h.b1 = beta1;
    h.b2 = beta2;
    h.omb1 = 1.0 - h.b1;
    h.omb2 = 1.0 - h.b2;
    h.bc1 = 1.0 - pow(h.b1, step);
    h.bc2 = 1.0 - pow(h.b2, step);
    h.eps = eps;
    h.lr = lr;
    h.wd = weight_decay;
    mt_adamw_kernel<<<MT_BLOCKS, MT_THREADS, 0, ctx->stream>>>(tensors, ntensors, prefix, clip,
                                                               h);
    return kcuda_check_launch(ctx, "mt_adamw_kernel");
}
