/* crossentropy.cu - softmax cross-entropy over fp32 logits, one block per row:
 * max, then the sum of exp(l - max) in fp32, then the loss (forward) or the gradient
 * (backward, which recomputes max and sum rather than saving them). */
#include "cuda/kcuda_internal.h"

#define CE_THREADS 512

/* Row max and log of the shifted sum; every thread gets both. */
__device__ __forceinline__ void row_stats(const float *l, int V, float *mx, float *lsum)
{
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        m = fmaxf(m, l[j]);
    m = kcuda_block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        s += expf(l[j] - m);
    s = kcuda_block_sum(s);
    *mx = m;
    *lsum = logf(s);
}

__global__ void ce_fwd_kernel(float *losses, const float *logits, const int *targets, int V,
                              int ignore_index)
{
    int i = blockIdx.x, t = targets[i];
    if (t == ignore_index) { /* uniform across the block: no barrier is skipped by some */
        if (threadIdx.x == 0)
            losses[i] = 0.0f;
        return;
    }
    if (t < 0 || t >= V) {
        if (threadIdx.x == 0)
            losses[i] = __int_as_float(0x7fc00000); /* NaN: the step reads as diverged */
        return;
    }
    const float *l = logits + (size_t)i * V;
    float m, ls;
    row_stats(l, V, &m, &ls);
    if (threadIdx.x == 0)
        losses[i] = m + ls - l[t];
}

__global__ void ce_bwd_kernel(float *dlogits, const float *logits, const int *targets,
                              const float *dlosses, int V, int ignore_index)
{
    int i = blockIdx.x, t = targets[i];
    if (t == ignore_index || t < 0 || t >= V)
        return;
    const float *l = logits + (size_t)i * V;
    float *dl = dlogits + (size_t)i * V;
    float m, ls, d = dlosses[i];
    row_stats(l, V, &m, &ls);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float p = expf(l[j] - m - ls);
        dl[j] += d * (p - (j == t ? 1.0f : 0.0f));
    }
}

extern "C" int kcuda_crossentropy_forward_f32(kcuda_ctx *ctx, float *losses,
                                              const float *logits, const int *targets, int N,
                                              int V, int ignore_index)
{
    if (N <= 0 || V <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_crossentropy_forward_f32: bad shape N=%d V=%d",
                          N, V);
    ce_fwd_kernel<<<N, CE_THREADS, 0, ctx->stream>>>(losses, logits, targets, V, ignore_index);
    return kcuda_check_launch(ctx, "ce_fwd_kernel");
}

extern "C" int kcuda_crossentropy_backward_f32(kcuda_ctx *ctx, float *dlogits,
                                               const float *logits, const int *targets,
                                               const float *dlosses, int N, int V,
                                               int ignore_index)
{
    if (N <= 0 || V <= 0)
        return kcuda_fail(ctx, KCUDA_EARG,
                          "kcuda_crossentropy_backward_f32: bad shape N=%d V=%d", N, V);
    ce_bwd_kernel<<<N, CE_THREADS, 0, ctx->stream>>>(dlogits, logits, targets, dlosses, V,
                                                     ignore_index);
    return kcuda_check_launch(ctx, "ce_bwd_kernel");
}
