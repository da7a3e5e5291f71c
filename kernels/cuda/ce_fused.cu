/* ce_fused.cu - softmax cross-entropy over bf16 logits for large vocabularies, without an
 * fp32 copy of the logits.  One block per row:
 *   forward: one pass, online max/sum of exp (each thread keeps a running (max, sum) and
 *     rescales its sum when the max grows), then a block max and a block sum of the
 *     rescaled sums; writes the loss and the row's logsumexp.
 *   backward: one pass, p = exp(l - lse) from the saved lse, written as bf16 over the
 *     logits (in place) or into another buffer.
 * Rows start at any 2-byte address (V is arbitrary), so each row is split into a scalar
 * head up to the first 16-byte boundary, 16-byte vectors (8 bf16), and a scalar tail.
 * Each thread sees the same elements in the same order on every run, and the block
 * reductions have a fixed order: deterministic. */
#include "cuda/kcuda_internal.h"

#include <stdint.h>

#define CE_THREADS 512
#define CE_UNROLL 4 /* vectors in flight per thread: enough bytes in flight for HBM */
#define L2E 1.4426950408889634f

typedef __nv_bfloat16 bf;

/* A vector of 8 bf16 -inf: padding that changes neither the max nor the sum. */
#define BF16X2_NEG_INF 0xff80ff80u

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* Elements before the first 16-byte boundary of row p (clamped to V). */
__device__ __forceinline__ int row_head(const void *p, int V)
{
    int h = (int)(((16u - ((uintptr_t)p & 15u)) & 15u) >> 1);
    return h < V ? h : V;
}

/* Running (max, sum of exp(x - max)) of one thread.  mL = max * log2(e), kept so that
 * exp(x - max) is one fma and one exp2; while max is -inf, mL is 0 and every term
 * exp2(-inf) = 0. */
struct online {
    float m, s, mL;
};

__device__ __forceinline__ void online_init(online *o)
{
    o->m = -INFINITY;
    o->s = 0.0f;
    o->mL = 0.0f;
}

/* Folds n values (n small, unrolled) whose maximum is mx into o. */
__device__ __forceinline__ void online_raise(online *o, float mx)
{
    if (mx > o->m) {
        o->s *= exp2f((o->m - mx) * L2E); /* m = -inf: s is 0 and stays 0 */
        o->m = mx;
        o->mL = mx * L2E;
    }
}

__device__ __forceinline__ float ex(float x, float mL) { return exp2f(fmaf(x, L2E, -mL)); }

/* Block-wide logsumexp of the threads' (m, s) pairs; every thread gets (max, sum). */
__device__ __forceinline__ void online_block(const online *o, float *M, float *S)
{
    float mx = kcuda_block_max(o->m);
    float s = o->m == -INFINITY ? 0.0f : o->s * exp2f((o->m - mx) * L2E);
    *S = kcuda_block_sum(s);
    *M = mx;
}

/* One row's (max, sum of exp) over l[0, V). */
__device__ void row_online(const bf *l, int V, float *M, float *S)
{
    online o;
    online_init(&o);
    const uint16_t *raw = (const uint16_t *)l;
    int head = row_head(l, V);
    int nvec = (V - head) >> 3, tail0 = head + (nvec << 3);
    /* head and tail: at most 7 + 7 scalars, taken by the first threads */
    int tid = threadIdx.x;
    if (tid < head) {
        float x = __uint_as_float((uint32_t)raw[tid] << 16);
        online_raise(&o, x);
        o.s += ex(x, o.mL);
    }
    if (tid < V - tail0) {
        float x = __uint_as_float((uint32_t)raw[tail0 + tid] << 16);
        online_raise(&o, x);
        o.s += ex(x, o.mL);
    }
    const uint4 *vp = (const uint4 *)(raw + head);
    for (int k0 = tid; k0 < nvec; k0 += CE_UNROLL * blockDim.x) {
        uint4 v[CE_UNROLL];
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            int k = k0 + u * blockDim.x;
            if (k < nvec)
                v[u] = __ldcs(vp + k); /* read once: do not keep it in L2 */
            else
                v[u] = make_uint4(BF16X2_NEG_INF, BF16X2_NEG_INF, BF16X2_NEG_INF,
                                  BF16X2_NEG_INF);
        }
        float mx = -INFINITY;
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int q = 0; q < 4; q++)
                mx = fmaxf(mx, fmaxf(bf_lo(w[q]), bf_hi(w[q])));
        }
        online_raise(&o, mx);
        float s = 0.0f;
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int q = 0; q < 4; q++)
                s += ex(bf_lo(w[q]), o.mL) + ex(bf_hi(w[q]), o.mL);
        }
        o.s += s;
    }
    online_block(&o, M, S);
}

/* Row class: 0 = compute, 1 = ignored, 2 = invalid target (for the whole vocabulary). */
__device__ __forceinline__ int row_class(int t, int V, int ignore_index)
{
    if (t == ignore_index)
        return 1;
    return (t < 0 || t >= V) ? 2 : 0;
}

/* ld: elements between the starts of two rows (>= Vs) */
__global__ void ce_partial_kernel(float *losses, float *lse, float *rowmax, float *rowsum,
                                  float *tlogit, const bf *logits, size_t ld,
                                  const int *targets, int V, int v0, int Vs, int ignore_index)
{
    int i = blockIdx.x, t = targets[i];
    int cls = row_class(t, V, ignore_index); /* uniform across the block */
    if (cls != 0) {
        if (threadIdx.x == 0) {
            if (losses)
                losses[i] = cls == 1 ? 0.0f : __int_as_float(0x7fc00000);
            if (lse)
                lse[i] = 0.0f;
            if (rowmax) {
                rowmax[i] = 0.0f;
                rowsum[i] = 0.0f;
                tlogit[i] = 0.0f;
            }
        }
        return;
    }
    const bf *l = logits + (size_t)i * ld;
    float M, S;
    row_online(l, Vs, &M, &S);
    if (threadIdx.x == 0) {
        int tl = t - v0;
        float xt = (tl >= 0 && tl < Vs) ? __bfloat162float(l[tl]) : 0.0f;
        if (losses) {
            float ls = M + logf(S);
            losses[i] = ls - xt;
            lse[i] = ls;
        } else {
            rowmax[i] = M;
            rowsum[i] = S;
            tlogit[i] = xt;
        }
    }
}

/* Writes 8 gradients for the columns c0..c0+7 of the slice. */
__device__ __forceinline__ uint4 grad8(uint4 v, int c0, int tl, float lseL, float d)
{
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        int c = c0 + 2 * q;
        float g0 = d * (ex(bf_lo(w[q]), lseL) - (c == tl ? 1.0f : 0.0f));
        float g1 = d * (ex(bf_hi(w[q]), lseL) - (c + 1 == tl ? 1.0f : 0.0f));
        __nv_bfloat162 h = __floats2bfloat162_rn(g0, g1); /* .x = g0 (low half) */
        w[q] = *(uint32_t *)&h;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__global__ void ce_bwd_kernel(bf *dlogits, const bf *logits, size_t ld, const float *lse,
                              const int *targets, const float *dlosses, int V, int v0, int Vs,
                              int ignore_index)
{
    int i = blockIdx.x, t = targets[i], tid = threadIdx.x;
    const bf *l = logits + (size_t)i * ld;
    bf *dl = dlogits + (size_t)i * ld;
    uint16_t *draw = (uint16_t *)dl;
    if (row_class(t, V, ignore_index) != 0) { /* zeros: the buffer may hold the logits */
        for (int j = tid; j < Vs; j += blockDim.x)
            draw[j] = 0;
        return;
    }
    int tl = t - v0; /* outside [0,Vs): no onehot in this slice */
    float d = dlosses[i], lseL = lse[i] * L2E;
    const uint16_t *raw = (const uint16_t *)l;
    int same = (((uintptr_t)l ^ (uintptr_t)dl) & 15u) == 0;
    int head = same ? row_head(l, Vs) : Vs; /* differently aligned buffers: all scalar */
    int nvec = (Vs - head) >> 3, tail0 = head + (nvec << 3);
    for (int j = tid; j < head; j += blockDim.x) {
        float g = d * (ex(__uint_as_float((uint32_t)raw[j] << 16), lseL) - (j == tl ? 1.0f : 0.0f));
        dl[j] = __float2bfloat16_rn(g);
    }
    for (int j = tail0 + tid; j < Vs; j += blockDim.x) {
        float g = d * (ex(__uint_as_float((uint32_t)raw[j] << 16), lseL) - (j == tl ? 1.0f : 0.0f));
        dl[j] = __float2bfloat16_rn(g);
    }
    const uint4 *vp = (const uint4 *)(raw + head);
    uint4 *dp = (uint4 *)(draw + head);
    for (int k0 = tid; k0 < nvec; k0 += CE_UNROLL * blockDim.x) {
        uint4 v[CE_UNROLL];
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            int k = k0 + u * blockDim.x;
            if (k < nvec)
                v[u] = __ldcs(vp + k);
        }
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            int k = k0 + u * blockDim.x;
            if (k < nvec) /* each element is read before it is written, by this thread */
                __stcs(dp + k, grad8(v[u], head + (k << 3), tl, lseL, d));
        }
    }
}

static int ce_args(kcuda_ctx *ctx, const char *fn, const void *a, const void *b, int N, int V,
                   int v0, int Vs)
{
    if (N <= 0 || V <= 0 || Vs <= 0 || v0 < 0 || v0 > V - Vs)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bad shape N=%d V=%d v0=%d Vs=%d", fn, N, V, v0,
                          Vs);
    if (((uintptr_t)a | (uintptr_t)b) & 1u)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bf16 pointer not 2-byte aligned", fn);
    return KCUDA_OK;
}

extern "C" int kcuda_ce_forward_bf16_ld(kcuda_ctx *ctx, float *losses, float *lse,
                                        const kcuda_bf16 *logits, int ld, const int *targets,
                                        int N, int V, int ignore_index)
{
    int rc = ce_args(ctx, "kcuda_ce_forward_bf16", logits, NULL, N, V, 0, V);
    if (rc < 0)
        return rc;
    if (!losses || !lse || !logits || !targets || ld < V)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_ce_forward_bf16: NULL argument or ld %d < V %d",
                          ld, V);
    ce_partial_kernel<<<N, CE_THREADS, 0, ctx->stream>>>(losses, lse, NULL, NULL, NULL,
                                                         (const bf *)logits, (size_t)ld, targets,
                                                         V, 0, V, ignore_index);
    return kcuda_check_launch(ctx, "ce_partial_kernel(forward)");
}

extern "C" int kcuda_ce_forward_bf16(kcuda_ctx *ctx, float *losses, float *lse,
                                     const kcuda_bf16 *logits, const int *targets, int N, int V,
                                     int ignore_index)
{
    return kcuda_ce_forward_bf16_ld(ctx, losses, lse, logits, V, targets, N, V, ignore_index);
}

extern "C" int kcuda_ce_vocab_partial_bf16(kcuda_ctx *ctx, float *rowmax, float *rowsum,
                                           float *tlogit, const kcuda_bf16 *logits,
                                           const int *targets, int N, int V, int v0, int Vs,
                                           int ignore_index)
{
    int rc = ce_args(ctx, "kcuda_ce_vocab_partial_bf16", logits, NULL, N, V, v0, Vs);
    if (rc < 0)
        return rc;
    if (!rowmax || !rowsum || !tlogit || !logits || !targets)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_ce_vocab_partial_bf16: NULL argument");
    ce_partial_kernel<<<N, CE_THREADS, 0, ctx->stream>>>(NULL, NULL, rowmax, rowsum, tlogit,
                                                         (const bf *)logits, (size_t)Vs, targets,
                                                         V, v0, Vs, ignore_index);
    return kcuda_check_launch(ctx, "ce_partial_kernel(vocab)");
}

/* One thread per row; the ranks are combined in rank order (deterministic). */
__global__ void ce_combine_kernel(float *losses, float *lse, const float *rowmax,
                                  const float *rowsum, const float *tlogit, const int *targets,
                                  int N, int V, int R, int ignore_index)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N)
        return;
    int cls = row_class(targets[i], V, ignore_index);
    if (cls != 0) {
        losses[i] = cls == 1 ? 0.0f : __int_as_float(0x7fc00000);
        lse[i] = 0.0f;
        return;
    }
    float M = -INFINITY, S = 0.0f, xt = 0.0f;
    for (int r = 0; r < R; r++)
        M = fmaxf(M, rowmax[(size_t)r * N + i]);
    for (int r = 0; r < R; r++) {
        float s = rowsum[(size_t)r * N + i];
        S += s > 0.0f ? s * exp2f((rowmax[(size_t)r * N + i] - M) * L2E) : 0.0f;
        xt += tlogit[(size_t)r * N + i];
    }
    float ls = M + logf(S);
    losses[i] = ls - xt;
    lse[i] = ls;
}

extern "C" int kcuda_ce_vocab_combine(kcuda_ctx *ctx, float *losses, float *lse,
                                      const float *rowmax, const float *rowsum,
                                      const float *tlogit, const int *targets, int N, int V,
                                      int R, int ignore_index)
{
    if (N <= 0 || V <= 0 || R <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_ce_vocab_combine: bad shape N=%d V=%d R=%d",
                          N, V, R);
    if (!losses || !lse || !rowmax || !rowsum || !tlogit || !targets)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_ce_vocab_combine: NULL argument");
    ce_combine_kernel<<<(N + 255) / 256, 256, 0, ctx->stream>>>(losses, lse, rowmax, rowsum,
                                                                tlogit, targets, N, V, R,
                                                                ignore_index);
    return kcuda_check_launch(ctx, "ce_combine_kernel");
}

/* The backward over rows ld elements apart (ld >= Vs). */
static int ce_backward(kcuda_ctx *ctx, kcuda_bf16 *dlogits, const kcuda_bf16 *logits, int ld,
                       const float *lse, const int *targets, const float *dlosses, int N, int V,
                       int v0, int Vs, int ignore_index)
{
    int rc = ce_args(ctx, "kcuda_ce_backward_bf16", logits, dlogits, N, V, v0, Vs);
    if (rc < 0)
        return rc;
    if (!dlogits || !logits || !lse || !targets || !dlosses || ld < Vs)
        return kcuda_fail(ctx, KCUDA_EARG,
                          "kcuda_ce_backward_bf16: NULL argument or ld %d < Vs %d", ld, Vs);
    ce_bwd_kernel<<<N, CE_THREADS, 0, ctx->stream>>>((bf *)dlogits, (const bf *)logits,
                                                     (size_t)ld, lse, targets, dlosses, V, v0,
                                                     Vs, ignore_index);
    return kcuda_check_launch(ctx, "ce_bwd_kernel");
}

extern "C" int kcuda_ce_vocab_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dlogits,
                                            const kcuda_bf16 *logits, const float *lse,
                                            const int *targets, const float *dlosses, int N,
                                            int V, int v0, int Vs, int ignore_index)
{
    return ce_backward(ctx, dlogits, logits, Vs, lse, targets, dlosses, N, V, v0, Vs,
                       ignore_index);
}

extern "C" int kcuda_ce_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dlogits,
                                      const kcuda_bf16 *logits, const float *lse,
                                      const int *targets, const float *dlosses, int N, int V,
                                      int ignore_index)
{
    return ce_backward(ctx, dlogits, logits, V, lse, targets, dlosses, N, V, 0, V, ignore_index);
}

extern "C" int kcuda_ce_backward_bf16_ld(kcuda_ctx *ctx, kcuda_bf16 *dlogits,
                                         const kcuda_bf16 *logits, int ld, const float *lse,
                                         const int *targets, const float *dlosses, int N, int V,
                                         int ignore_index)
{
    return ce_backward(ctx, dlogits, logits, ld, lse, targets, dlosses, N, V, 0, V,
                       ignore_index);
}
