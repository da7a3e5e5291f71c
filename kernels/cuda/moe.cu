/* moe.cu - mixture-of-experts on the GPU: router (softmax, top-k, load-balancing loss),
 * the permutation plan, permute/unpermute of bf16 rows, and the experts' SwiGLU MLPs as
 * one cuBLASLt GEMM per expert.  Semantics of kcpu_moe_* (kernels.h); the differences are
 * listed in kcuda.h.
 *
 * Everything is deterministic: no floating-point atomics; sums over tokens or columns run
 * in a fixed order; the plan is a stable counting sort done by one block (the pair count
 * N*K is tens of thousands: one block sorts it in microseconds, and a multi-block sort
 * would need scratch memory that the API does not own). */
#include "cuda/kcuda_internal.h"

#include <limits.h>
#include <stdint.h>

typedef __nv_bfloat16 bf;

#define MOE_MAX_E 1024   /* the router keeps one taken-bit per (lane, 32 experts) */
#define MOE_MAX_K 32     /* one top-k slot per lane */
#define ROUTER_WARPS 8
#define PLAN_THREADS 1024
#define ROW_THREADS 128

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v; /* the xor tree gives every lane the same bits */
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- router ----------------------------------------------------------------------- */

/* One warp per token; the token's probabilities sit in shared memory while the top-k is
 * chosen by K rounds of a warp arg-max (larger value, then lower index: the reference's
 * tie rule). */
__global__ void router_fwd_kernel(int *topk_idx, float *topk_w, float *probs,
                                  const float *logits, int N, int E, int K)
{
    extern __shared__ float rsh[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x * ROUTER_WARPS + warp;
    if (t >= N) /* warp-uniform, and no block barrier follows */
        return;
    float *p = rsh + (size_t)warp * E;
    const float *z = logits + (size_t)t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) {
        float v = z[e];
        p[e] = v;
        mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    float s = 0.0f;
    for (int e = lane; e < E; e += 32)
        s += expf(p[e] - mx);
    s = warp_sum(s);
    for (int e = lane; e < E; e += 32) {
        float v = expf(p[e] - mx) / s;
        p[e] = v;
        probs[(size_t)t * E + e] = v;
    }
    __syncwarp();
    uint32_t taken = 0; /* bit q: expert lane + 32 q is chosen */
    float chosen = 0.0f, myp = 0.0f;
    int myidx = 0;
    for (int j = 0; j < K; j++) {
        float bv = -1.0f; /* probabilities are >= 0 */
        int bi = INT_MAX;
        for (int q = 0, e = lane; e < E; q++, e += 32)
            if (!((taken >> q) & 1u) && p[e] > bv) {
                bv = p[e];
                bi = e;
            }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi == INT_MAX) /* NaN probabilities: take the lowest free expert */
            for (int e = 0; e < E; e++)
                if (!((__shfl_sync(0xffffffffu, taken, e & 31) >> (e >> 5)) & 1u)) {
                    bi = e;
                    bv = p[e];
                    break;
                }
        if ((bi & 31) == lane)
            taken |= 1u << (bi >> 5);
        chosen += bv;
        if (lane == j) {
            myidx = bi;
            myp = bv;
        }
    }
    if (lane < K) {
        topk_idx[(size_t)t * K + lane] = myidx;
        topk_w[(size_t)t * K + lane] = myp / chosen;
    }
}

/* One block: counts[e] (pairs per expert) and aux = E/N^2 * sum_e counts_e * sum_t p[t,e].
 * Thread (g, e) sums the tokens t = g (mod G) of column e (coalesced over e); the G partial
 * sums of a column are then added in g order. */
__global__ void router_aux_kernel(int *counts, float *aux, const float *probs,
                                  const int *topk_idx, int N, int E, int K)
{
    extern __shared__ float ash[];
    int G = blockDim.x / E, tid = threadIdx.x;
    int *cnt = (int *)(ash + (size_t)G * E);
    for (int e = tid; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < N * K; i += blockDim.x) {
        int e = topk_idx[i];
        if (e >= 0 && e < E)
            atomicAdd(&cnt[e], 1); /* integer: exact in any order */
    }
    if (tid < G * E) {
        int g = tid / E, e = tid % E;
        float s = 0.0f;
        for (int t = g; t < N; t += G)
            s += probs[(size_t)t * E + e];
        ash[tid] = s;
    }
    __syncthreads();
    float term = 0.0f;
    for (int e = tid; e < E; e += blockDim.x) {
        float P = 0.0f;
        for (int g = 0; g < G; g++)
            P += ash[g * E + e];
        counts[e] = cnt[e];
        term += (float)cnt[e] * P;
    }
    float tot = kcuda_block_sum(term);
    if (tid == 0 && aux)
        *aux = (float)E * (tot / ((float)N * (float)N));
}

/* With S = sum_j p_{i_j}, gw = sum_j dw_j w_j and a_e = daux E counts_e / N^2:
 *   dp_e = a_e + [e = i_j] (dw_j - gw) / S,   dz_e += p_e (dp_e - sum_k p_k dp_k). */
__global__ void router_bwd_kernel(float *dlogits, const float *dtopk_w, float daux,
                                  const float *probs, const int *topk_idx, const float *topk_w,
                                  const int *counts, int N, int E, int K)
{
    extern __shared__ float bsh[];
    float *a = bsh;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        a[e] = counts ? daux * (float)E * ((float)counts[e] / (float)N) / (float)N : 0.0f;
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x * ROUTER_WARPS + warp;
    if (t >= N)
        return;
    float *dp = bsh + E + (size_t)warp * E;
    const float *p = probs + (size_t)t * E;
    for (int e = lane; e < E; e += 32)
        dp[e] = a[e];
    int idx = lane < K ? topk_idx[(size_t)t * K + lane] : 0;
    float pj = lane < K ? p[idx] : 0.0f;
    float dwj = (lane < K && dtopk_w) ? dtopk_w[(size_t)t * K + lane] : 0.0f;
    float wj = lane < K ? topk_w[(size_t)t * K + lane] : 0.0f;
    float S = warp_sum(pj), gw = warp_sum(dwj * wj);
    __syncwarp();
    if (dtopk_w && lane < K)
        dp[idx] += (dwj - gw) / S; /* the K chosen experts are distinct: no conflict */
    __syncwarp();
    float dot = 0.0f;
    for (int e = lane; e < E; e += 32)
        dot += p[e] * dp[e];
    dot = warp_sum(dot);
    float *dz = dlogits + (size_t)t * E;
    for (int e = lane; e < E; e += 32)
        dz[e] += p[e] * (dp[e] - dot);
}

static int router_args(kcuda_ctx *ctx, const char *fn, int N, int E, int K)
{
    if (N <= 0 || E <= 0 || K <= 0 || K > E || E > MOE_MAX_E || K > MOE_MAX_K)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bad shape N=%d E=%d K=%d (K<=E<=%d, K<=%d)",
                          fn, N, E, K, MOE_MAX_E, MOE_MAX_K);
    return KCUDA_OK;
}

/* Opts a kernel into more than 48 KB of dynamic shared memory when it needs it. */
static int smem_opt_in(kcuda_ctx *ctx, const void *fn, size_t bytes, const char *what)
{
    if (bytes <= 48u * 1024u)
        return KCUDA_OK;
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)bytes);
    if (e != cudaSuccess)
        return kcuda_fail(ctx, KCUDA_ECUDA, "%s: %zu bytes of shared memory: %s", what, bytes,
                          cudaGetErrorString(e));
    return KCUDA_OK;
}

extern "C" int kcuda_moe_router_forward(kcuda_ctx *ctx, int *topk_idx, float *topk_w,
                                        float *probs, int *counts, float *aux,
                                        const float *logits, int N, int E, int K)
{
    int rc = router_args(ctx, "kcuda_moe_router_forward", N, E, K);
    if (rc < 0)
        return rc;
    if (!topk_idx || !topk_w || !probs || !counts || !logits)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_moe_router_forward: NULL argument");
    size_t sh = (size_t)ROUTER_WARPS * E * sizeof(float);
    if ((rc = smem_opt_in(ctx, (const void *)router_fwd_kernel, sh, "router_fwd_kernel")) < 0)
        return rc;
    router_fwd_kernel<<<(N + ROUTER_WARPS - 1) / ROUTER_WARPS, ROUTER_WARPS * 32, sh,
                        ctx->stream>>>(topk_idx, topk_w, probs, logits, N, E, K);
    if ((rc = kcuda_check_launch(ctx, "router_fwd_kernel")) < 0)
        return rc;
    int threads = PLAN_THREADS;
    size_t ash = ((size_t)(threads / E) * E + E) * sizeof(float);
    router_aux_kernel<<<1, threads, ash, ctx->stream>>>(counts, aux, probs, topk_idx, N, E, K);
    return kcuda_check_launch(ctx, "router_aux_kernel");
}

extern "C" int kcuda_moe_router_backward(kcuda_ctx *ctx, float *dlogits, const float *dtopk_w,
                                         float daux, const float *probs, const int *topk_idx,
                                         const float *topk_w, const int *counts, int N, int E,
                                         int K)
{
    int rc = router_args(ctx, "kcuda_moe_router_backward", N, E, K);
    if (rc < 0)
        return rc;
    if (!dlogits || !probs || !topk_idx || !topk_w || (daux != 0.0f && !counts))
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_moe_router_backward: NULL argument");
    size_t sh = (size_t)(ROUTER_WARPS + 1) * E * sizeof(float);
    if ((rc = smem_opt_in(ctx, (const void *)router_bwd_kernel, sh, "router_bwd_kernel")) < 0)
        return rc;
    router_bwd_kernel<<<(N + ROUTER_WARPS - 1) / ROUTER_WARPS, ROUTER_WARPS * 32, sh,
                        ctx->stream>>>(dlogits, dtopk_w, daux, probs, topk_idx, topk_w,
                                       daux != 0.0f ? counts : NULL, N, E, K);
    return kcuda_check_launch(ctx, "router_bwd_kernel");
}

/* ---- plan --------------------------------------------------------------------------
 * Counting sort in one block.  The pairs are taken in tiles of blockDim.x, in order; a
 * pair's row is its expert's cursor + the pairs of the same expert in earlier warps of
 * the tile (per-warp counts in shared memory) + those in earlier lanes of its warp
 * (__match_any_sync).  Then the cursors advance by the tile's counts. */
__global__ void plan_kernel(int *offsets, int *row_src, int *slot_row, const int *topk_idx,
                            int P, int E)
{
    extern __shared__ int psh[];
    int *cur = psh, *wc = psh + E;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    for (int e = tid; e < E; e += blockDim.x)
        cur[e] = 0;
    __syncthreads();
    for (int i = tid; i < P; i += blockDim.x) {
        int e = topk_idx[i];
        if (e >= 0 && e < E)
            atomicAdd(&cur[e], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int run = 0;
        for (int e = 0; e < E; e++) {
            int c = cur[e];
            offsets[e] = run;
            cur[e] = run;
            run += c;
        }
        offsets[E] = run;
    }
    __syncthreads();
    for (int base = 0; base < P; base += blockDim.x) {
        for (int x = tid; x < nw * E; x += blockDim.x)
            wc[x] = 0;
        __syncthreads();
        int i = base + tid;
        int e = i < P ? topk_idx[i] : -1;
        int valid = e >= 0 && e < E;
        unsigned peers = __match_any_sync(0xffffffffu, valid ? e : -1);
        int rank = __popc(peers & ((1u << lane) - 1u));
        if (valid && rank == 0)
            wc[warp * E + e] = __popc(peers);
        __syncthreads();
        if (valid) {
            int r = cur[e] + rank;
            for (int w = 0; w < warp; w++)
                r += wc[w * E + e];
            row_src[r] = i;
            slot_row[i] = r;
        }
        __syncthreads();
        for (int x = tid; x < E; x += blockDim.x) {
            int s = 0;
            for (int w = 0; w < nw; w++)
                s += wc[w * E + x];
            cur[x] += s;
        }
        __syncthreads();
    }
}

extern "C" int kcuda_moe_plan(kcuda_ctx *ctx, int *offsets, int *row_src, int *slot_row,
                              const int *topk_idx, int N, int E, int K)
{
    if (N <= 0 || E <= 0 || K <= 0 || E > MOE_MAX_E || (long)N * K > INT_MAX)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_moe_plan: bad shape N=%d E=%d K=%d", N, E, K);
    if (!offsets || !row_src || !slot_row || !topk_idx)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_moe_plan: NULL argument");
    size_t sh = (size_t)(1 + PLAN_THREADS / 32) * E * sizeof(int);
    int rc = smem_opt_in(ctx, (const void *)plan_kernel, sh, "plan_kernel");
    if (rc < 0)
        return rc;
    plan_kernel<<<1, PLAN_THREADS, sh, ctx->stream>>>(offsets, row_src, slot_row, topk_idx,
                                                      N * K, E);
    return kcuda_check_launch(ctx, "plan_kernel");
}

/* ---- permute / unpermute -------------------------------------------------------------
 * Rows of C bf16: W = 8 columns per access (one 16-byte vector) when C is a multiple of 8
 * and every row pointer is 16-byte aligned, else W = 1. */
template <int W>
__device__ __forceinline__ void ldw(float *f, const bf *p)
{
    if (W == 8) {
        uint4 v = *(const uint4 *)p;
        uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            f[2 * q] = __uint_as_float(w[q] << 16);
            f[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
        }
    } else {
        f[0] = __bfloat162float(*p);
    }
}

template <int W>
__device__ __forceinline__ void stw(bf *p, const float *f)
{
    if (W == 8) {
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * q], f[2 * q + 1]);
            w[q] = *(uint32_t *)&h;
        }
        *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
        *p = __float2bfloat16_rn(f[0]);
    }
}

/* out[r,:] = inp[row_src[r] / K, :]: a copy, bits preserved. */
template <int W>
__global__ void permute_fwd_kernel(bf *out, const bf *inp, const int *row_src, int K, int C)
{
    int r = blockIdx.x;
    const bf *src = inp + (size_t)(row_src[r] / K) * C;
    bf *dst = out + (size_t)r * C;
    for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
        if (W == 8)
            *(uint4 *)(dst + c) = *(const uint4 *)(src + c);
        else
            dst[c] = src[c];
    }
}

/* dinp[t,:] += sum_j dout[slot_row[t*K+j], :], j in order. */
template <int W>
__global__ void permute_bwd_kernel(bf *dinp, const bf *dout, const int *slot_row, int K, int C)
{
    int t = blockIdx.x;
    bf *d = dinp + (size_t)t * C;
    for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
        float acc[W], x[W];
        ldw<W>(acc, d + c);
        for (int j = 0; j < K; j++) {
            ldw<W>(x, dout + (size_t)slot_row[(size_t)t * K + j] * C + c);
#pragma unroll
            for (int q = 0; q < W; q++)
                acc[q] += x[q];
        }
        stw<W>(d + c, acc);
    }
}

/* out[t,:] = sum_j topk_w[t,j] * expert_out[slot_row[t*K+j], :], j in order. */
template <int W>
__global__ void unpermute_fwd_kernel(bf *out, const bf *eo, const float *topk_w,
                                     const int *slot_row, int K, int C)
{
    int t = blockIdx.x;
    for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
        float acc[W], x[W];
#pragma unroll
        for (int q = 0; q < W; q++)
            acc[q] = 0.0f;
        for (int j = 0; j < K; j++) {
            float w = topk_w[(size_t)t * K + j];
            ldw<W>(x, eo + (size_t)slot_row[(size_t)t * K + j] * C + c);
#pragma unroll
            for (int q = 0; q < W; q++)
                acc[q] += w * x[q];
        }
        stw<W>(out + (size_t)t * C + c, acc);
    }
}

/* dexpert_out[row_j] += w_j dout[t];  dtopk_w[t,j] += dot(dout[t], expert_out[row_j]).
 * Each expert row belongs to one (token, slot): one block writes it. */
template <int W>
__global__ void unpermute_bwd_kernel(bf *deo, float *dtopk_w, const bf *dout, const bf *eo,
                                     const float *topk_w, const int *slot_row, int K, int C)
{
    int t = blockIdx.x;
    const bf *g = dout + (size_t)t * C;
    for (int j = 0; j < K; j++) {
        size_t row = (size_t)slot_row[(size_t)t * K + j];
        float w = topk_w[(size_t)t * K + j], dot = 0.0f;
        for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
            float gv[W], x[W];
            ldw<W>(gv, g + c);
            if (deo) {
                ldw<W>(x, deo + row * C + c);
#pragma unroll
                for (int q = 0; q < W; q++)
                    x[q] += w * gv[q];
                stw<W>(deo + row * C + c, x);
            }
            if (dtopk_w) {
                ldw<W>(x, eo + row * C + c);
#pragma unroll
                for (int q = 0; q < W; q++)
                    dot += gv[q] * x[q];
            }
        }
        if (dtopk_w) { /* uniform: every thread takes part in the block sum */
            dot = kcuda_block_sum(dot);
            if (threadIdx.x == 0)
                dtopk_w[(size_t)t * K + j] += dot;
        }
    }
}

static int rows_vec(int C, const void *a, const void *b, const void *c)
{
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return C % 8 == 0 && (x & 15u) == 0;
}

static int rows_args(kcuda_ctx *ctx, const char *fn, int N, int K, int C)
{
    if (N <= 0 || K <= 0 || C <= 0 || (long)N * K > INT_MAX)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bad shape N=%d K=%d C=%d", fn, N, K, C);
    return KCUDA_OK;
}

extern "C" int kcuda_moe_permute_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out,
                                              const kcuda_bf16 *inp, const int *row_src, int N,
                                              int K, int C)
{
    int rc = rows_args(ctx, "kcuda_moe_permute_forward_bf16", N, K, C);
    if (rc < 0)
        return rc;
    if (rows_vec(C, out, inp, NULL))
        permute_fwd_kernel<8><<<N * K, ROW_THREADS, 0, ctx->stream>>>((bf *)out, (const bf *)inp,
                                                                      row_src, K, C);
    else
        permute_fwd_kernel<1><<<N * K, ROW_THREADS, 0, ctx->stream>>>((bf *)out, (const bf *)inp,
                                                                      row_src, K, C);
    return kcuda_check_launch(ctx, "permute_fwd_kernel");
}

extern "C" int kcuda_moe_permute_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp,
                                               const kcuda_bf16 *dout, const int *slot_row,
                                               int N, int K, int C)
{
    int rc = rows_args(ctx, "kcuda_moe_permute_backward_bf16", N, K, C);
    if (rc < 0)
        return rc;
    if (rows_vec(C, dinp, dout, NULL))
        permute_bwd_kernel<8><<<N, ROW_THREADS, 0, ctx->stream>>>((bf *)dinp, (const bf *)dout,
                                                                  slot_row, K, C);
    else
        permute_bwd_kernel<1><<<N, ROW_THREADS, 0, ctx->stream>>>((bf *)dinp, (const bf *)dout,
                                                                  slot_row, K, C);
    return kcuda_check_launch(ctx, "permute_bwd_kernel");
}

extern "C" int kcuda_moe_unpermute_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out,
                                                const kcuda_bf16 *expert_out,
                                                const float *topk_w, const int *slot_row, int N,
                                                int K, int C)
{
    int rc = rows_args(ctx, "kcuda_moe_unpermute_forward_bf16", N, K, C);
    if (rc < 0)
        return rc;
    if (rows_vec(C, out, expert_out, NULL))
        unpermute_fwd_kernel<8><<<N, ROW_THREADS, 0, ctx->stream>>>(
            (bf *)out, (const bf *)expert_out, topk_w, slot_row, K, C);
    else
        unpermute_fwd_kernel<1><<<N, ROW_THREADS, 0, ctx->stream>>>(
            (bf *)out, (const bf *)expert_out, topk_w, slot_row, K, C);
    return kcuda_check_launch(ctx, "unpermute_fwd_kernel");
}

extern "C" int kcuda_moe_unpermute_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dexpert_out,
                                                 float *dtopk_w, const kcuda_bf16 *dout,
                                                 const kcuda_bf16 *expert_out,
                                                 const float *topk_w, const int *slot_row,
                                                 int N, int K, int C)
{
    int rc = rows_args(ctx, "kcuda_moe_unpermute_backward_bf16", N, K, C);
    if (rc < 0)
        return rc;
    if (!dexpert_out && !dtopk_w)
        return KCUDA_OK;
    if (rows_vec(C, dexpert_out, dout, expert_out))
        unpermute_bwd_kernel<8><<<N, ROW_THREADS, 0, ctx->stream>>>(
            (bf *)dexpert_out, dtopk_w, (const bf *)dout, (const bf *)expert_out, topk_w,
            slot_row, K, C);
    else
        unpermute_bwd_kernel<1><<<N, ROW_THREADS, 0, ctx->stream>>>(
            (bf *)dexpert_out, dtopk_w, (const bf *)dout, (const bf *)expert_out, topk_w,
            slot_row, K, C);
    return kcuda_check_launch(ctx, "unpermute_bwd_kernel");
}

/* ---- expert MLPs ---------------------------------------------------------------------- */

static int experts_args(kcuda_ctx *ctx, const char *fn, const int *off, int E, int H, int Fm)
{
    if (E <= 0 || H <= 0 || Fm <= 0 || !off)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bad shape E=%d H=%d Fm=%d", fn, E, H, Fm);
    if (off[0] != 0)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: offsets[0] = %d, want 0", fn, off[0]);
    for (int e = 0; e < E; e++)
        if (off[e + 1] < off[e])
            return kcuda_fail(ctx, KCUDA_EARG, "%s: offsets decrease at expert %d", fn, e);
    return KCUDA_OK;
}

extern "C" int kcuda_moe_experts_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *yp, kcuda_bf16 *hp,
                                              kcuda_bf16 *ap, const kcuda_bf16 *xp,
                                              const kcuda_bf16 *gate_up, const kcuda_bf16 *down,
                                              const int *offsets_host, int E, int H, int Fm)
{
    const int *off = offsets_host;
    int rc = experts_args(ctx, "kcuda_moe_experts_forward_bf16", off, E, H, Fm);
    if (rc < 0 || off[E] == 0)
        return rc;
    size_t F2 = 2 * (size_t)Fm;
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (n > 0 && (rc = kcuda_matmul_forward_bf16(ctx, hp + (size_t)off[e] * F2,
                                                     xp + (size_t)off[e] * H,
                                                     gate_up + (size_t)e * F2 * H, NULL, n, H,
                                                     (int)F2)) < 0)
            return rc;
    }
    if ((rc = kcuda_swiglu_forward_bf16(ctx, ap, hp, off[E], Fm)) < 0)
        return rc;
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (n > 0 && (rc = kcuda_matmul_forward_bf16(ctx, yp + (size_t)off[e] * H,
                                                     ap + (size_t)off[e] * Fm,
                                                     down + (size_t)e * H * Fm, NULL, n, Fm,
                                                     H)) < 0)
            return rc;
    }
    return KCUDA_OK;
}

extern "C" int kcuda_moe_experts_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dxp,
                                               kcuda_bf16 *dgate_up, kcuda_bf16 *ddown,
                                               kcuda_bf16 *dap, kcuda_bf16 *dhp,
                                               const kcuda_bf16 *dyp, const kcuda_bf16 *xp,
                                               const kcuda_bf16 *hp, const kcuda_bf16 *ap,
                                               const kcuda_bf16 *gate_up,
                                               const kcuda_bf16 *down, const int *offsets_host,
                                               int E, int H, int Fm)
{
    const int *off = offsets_host;
    int rc = experts_args(ctx, "kcuda_moe_experts_backward_bf16", off, E, H, Fm);
    if (rc < 0 || off[E] == 0)
        return rc;
    size_t F2 = 2 * (size_t)Fm, R = (size_t)off[E];
    /* the GEMM and SwiGLU backwards accumulate: the scratch starts at zero */
    cudaError_t ce = cudaMemsetAsync(dap, 0, R * Fm * sizeof(bf), ctx->stream);
    if (ce == cudaSuccess)
        ce = cudaMemsetAsync(dhp, 0, R * F2 * sizeof(bf), ctx->stream);
    if (ce != cudaSuccess)
        return kcuda_fail(ctx, KCUDA_ECUDA, "kcuda_moe_experts_backward_bf16: memset: %s",
                          cudaGetErrorString(ce));
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (n > 0 && (rc = kcuda_matmul_backward_bf16(
                          ctx, dap + (size_t)off[e] * Fm,
                          ddown ? ddown + (size_t)e * H * Fm : NULL, NULL,
                          dyp + (size_t)off[e] * H, ap + (size_t)off[e] * Fm,
                          down + (size_t)e * H * Fm, n, Fm, H)) < 0)
            return rc;
    }
    if ((rc = kcuda_swiglu_backward_bf16(ctx, dhp, dap, hp, (int)R, Fm, 1)) < 0)
        return rc;
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (n > 0 && (dxp || dgate_up) &&
            (rc = kcuda_matmul_backward_bf16(
                 ctx, dxp ? dxp + (size_t)off[e] * H : NULL,
                 dgate_up ? dgate_up + (size_t)e * F2 * H : NULL, NULL,
                 dhp + (size_t)off[e] * F2, xp + (size_t)off[e] * H,
                 gate_up + (size_t)e * F2 * H, n, H, (int)F2)) < 0)
            return rc;
    }
    return KCUDA_OK;
}
