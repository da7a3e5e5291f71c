/* kcuda_internal.h - what the kernels/cuda/ files share: the context's layout and the
 * error helpers.  Not part of the API. */
#ifndef HEARTH_KCUDA_INTERNAL_H
#define HEARTH_KCUDA_INTERNAL_H

#include "cuda/kcuda.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* One cached heuristic choice per (dtype, transposes, m, n, k, epilogue, accumulate,
 * alignment).  A small open table: GEMM shapes of a model are few (tens). */
#define KCUDA_GEMM_CACHE 128

struct kcuda_gemm_key {
    int dtype, transa, transb, m, n, k, epilogue, beta1, align;
    int fast;               /* fp32 operands on bf16 tensor cores (kcuda_ctx_set_f32_math) */
};

/* The descriptors are kept with the algorithm: creating them costs host time on every
 * call, which small GEMMs (tens of microseconds) notice.  Owned by the context. */
struct kcuda_gemm_entry {
    int used;
    struct kcuda_gemm_key key;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
};

struct kcuda_ctx {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    struct kcuda_gemm_entry cache[KCUDA_GEMM_CACHE];
    int f32_math;           /* KCUDA_F32_* of the _f32 GEMMs */
    int cache_entries;
    long cache_hits, cache_misses;
    char msg[256];
};

/* The cache entry of key (gemm.cu): the one holding it, else a free one (used == 0) to
 * fill, else NULL (table full).  Keys of other GEMM files use dtypes of their own. */
struct kcuda_gemm_entry *kcuda_gemm_cache_slot(kcuda_ctx *ctx, const struct kcuda_gemm_key *key);
/* Fills a free entry with key and algo; the entry takes *op and the layouts over (they
 * are NULL afterwards, so the caller's cleanup leaves them alone). */
void kcuda_gemm_cache_fill(kcuda_ctx *ctx, struct kcuda_gemm_entry *slot,
                           const struct kcuda_gemm_key *key, const cublasLtMatmulAlgo_t *algo,
                           cublasLtMatmulDesc_t *op, cublasLtMatrixLayout_t *la,
                           cublasLtMatrixLayout_t *lb, cublasLtMatrixLayout_t *lc);

/* A cuBLASLt heuristic preference (gemm.cu): the context's workspace as the limit, every
 * operand `align` bytes aligned.  Freed by the caller; NULL on failure. */
int kcuda_lt_preference(kcuda_ctx *ctx, uint32_t align, cublasLtMatmulPreference_t *pref);

int kcuda_fail(kcuda_ctx *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Checks the last launch error; returns 0 or KCUDA_ECUDA with a message naming `what`. */
int kcuda_check_launch(kcuda_ctx *ctx, const char *what);

/* The LayerNorm (mean given) or RMSNorm (mean NULL) backward (norm_backward.cu): dinp
 * (may be NULL) += the input gradient, dweight/dbias (may be NULL) += the column sums;
 * the context workspace holds the blocks' sums.  fn names the caller in errors. */
int kcuda_norm_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            const float *mean, const float *rstd, int N, int C, const char *fn);
int kcuda_norm_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, float *dweight, float *dbias,
                             const kcuda_bf16 *dout, const kcuda_bf16 *inp,
                             const kcuda_bf16 *weight, const float *mean, const float *rstd,
                             int N, int C, const char *fn);

/* Block-wide sum of one float per thread (blockDim.x a multiple of 32, <= 1024).
 * Every thread gets the total.  Uses 33 floats of shared memory. */
__device__ __forceinline__ float kcuda_block_sum(float v)
{
    __shared__ float part[33];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < nw; w++) /* same order in every thread: identical totals */
        t += part[w];
    return t;
}

__device__ __forceinline__ float kcuda_block_max(float v)
{
    __shared__ float part[33];
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int w = 0; w < nw; w++)
        t = fmaxf(t, part[w]);
    return t;
}

/* Storage conversions, so that templates read and write either type. */
__device__ __forceinline__ float kcuda_ld(const float *p) { return *p; }
__device__ __forceinline__ float kcuda_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void kcuda_st(float *p, float v) { *p = v; }
__device__ __forceinline__ void kcuda_st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* ---- W-element access (elementwise/normalisation kernels) ----------------------
 * kcuda_ldw<W>/kcuda_stw<W> move W consecutive elements to/from fp32 registers: one
 * scalar access for W = 1, one 16-byte access for W = 16 / sizeof(T) (the pointer must
 * then be 16-byte aligned).  Kernels templated on W pick the vector width on the host
 * with kcuda_vec_ok. */
template <typename T>
struct kcuda_vec {
    enum { n = 16 / sizeof(T) };
};

__device__ __forceinline__ void kcuda_ld16(float *f, const float *p)
{
    float4 v = *(const float4 *)p;
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
}

__device__ __forceinline__ void kcuda_ld16(float *f, const __nv_bfloat16 *p)
{
    uint4 v = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ void kcuda_st16(float *p, const float *f)
{
    *(float4 *)p = make_float4(f[0], f[1], f[2], f[3]);
}

__device__ __forceinline__ void kcuda_st16(__nv_bfloat16 *p, const float *f)
{
    uint4 v;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&v;
#pragma unroll
    for (int i = 0; i < 4; i++)
        h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *(uint4 *)p = v;
}

/* 4 bf16 in one 8-byte load. */
__device__ __forceinline__ void kcuda_ld8(float *f, const __nv_bfloat16 *p)
{
    uint2 v = *(const uint2 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
    float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
}

/* W elements of T: one load of W * sizeof(T) bytes (16, or 8 for 4 bf16). */
template <int W, typename T>
__device__ __forceinline__ void kcuda_ldw(float *f, const T *p)
{
    if constexpr (W == 1)
        f[0] = kcuda_ld(p);
    else if constexpr (W * sizeof(T) == 8)
        kcuda_ld8(f, p);
    else
        kcuda_ld16(f, p);
}

/* 4 bf16 in one 8-byte store (fp32 rows of W = 4 written as bf16). */
__device__ __forceinline__ void kcuda_st8(__nv_bfloat16 *p, const float *f)
{
    uint2 v;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&v;
    h[0] = __floats2bfloat162_rn(f[0], f[1]);
    h[1] = __floats2bfloat162_rn(f[2], f[3]);
    *(uint2 *)p = v;
}

/* W elements of T: one store of W * sizeof(T) bytes (16, or 8 for 4 bf16; the pointer
 * aligned to that). */
template <int W, typename T>
__device__ __forceinline__ void kcuda_stw(T *p, const float *f)
{
    if constexpr (W == 1)
        kcuda_st(p, f[0]);
    else if constexpr (W * sizeof(T) == 8)
        kcuda_st8(p, f);
    else
        kcuda_st16(p, f);
}

/* 16-byte access is possible for rows of C elements at these pointers (NULL ignored). */
template <typename T>
static inline bool kcuda_vec_ok(long C, const void *a, const void *b = 0, const void *c = 0,
                                const void *d = 0, const void *e = 0)
{
    const void *ps[5] = {a, b, c, d, e};
    if (C % kcuda_vec<T>::n)
        return false;
    for (int i = 0; i < 5; i++)
        if (((size_t)ps[i] & 15) != 0)
            return false;
    return true;
}
/* ---- end of W-element access ---- */

#endif
