/* bench_gpu_util.h - what the GPU benchmarks (contrib/bench/bench_..._gpu.cu) share: the opening
 * of main (device probe, properties for the header line, a kcuda context), random device
 * inputs and the median of event-timed calls.  Benchmark code only (C++: compiled by nvcc). */
#ifndef HEARTH_BENCH_GPU_UTIL_H
#define HEARTH_BENCH_GPU_UTIL_H

#include <cuda_bf16.h>
#include <time.h>

#include "tests/gpu/gpu_util.h"

/* 1 = go on: device 0's properties in *prop (for the "# <name>, <n> SMs" header) and a
 * default context in *k (kcuda_ctx_free by the caller).  0 = no CUDA device, said in one
 * line "<prog>: no CUDA device" (exit 0).  -1 = no context, the reason printed (exit 1). */
static inline int bg_open(const char *prog, cudaDeviceProp *prop, kcuda_ctx **k)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("%s: no CUDA device\n", prog);
        return 0;
    }
    cudaGetDeviceProperties(prop, 0);
    char err[256];
    if (kcuda_ctx_create(k, NULL, 0, err, sizeof err) < 0) {
        printf("%s\n", err);
        return -1;
    }
    return 1;
}

/* A fresh non-zero seed for the random inputs. */
static inline uint64_t bg_seed(void) { return (uint64_t)time(NULL) | 1; }

/* A hash of (i, seed) as a uniform value in [0, 1): inputs made on the device, so that
 * filling gigabytes costs no host time. */
static __device__ inline float bg_unit(size_t i, uint64_t seed)
{
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    return (float)(h >> 40) / 16777216.0f;
}

static __global__ void bg_fill_bf16_kernel(__nv_bfloat16 *x, size_t n, uint64_t seed, float lo,
                                           float hi)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = __float2bfloat16_rn(lo + (hi - lo) * bg_unit(i, seed));
}

static __global__ void bg_fill_f32_kernel(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = lo + (hi - lo) * bg_unit(i, seed);
}

/* x[n] (bf16 or fp32 on the device) = random values in [lo, hi), on stream 0. */
static inline void bg_fill_bf16(void *x, size_t n, uint64_t seed, float lo, float hi)
{
    bg_fill_bf16_kernel<<<(unsigned)((n + 255) / 256), 256>>>((__nv_bfloat16 *)x, n, seed, lo,
                                                              hi);
}

static inline void bg_fill_f32(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    bg_fill_f32_kernel<<<(unsigned)((n + 255) / 256), 256>>>(x, n, seed, lo, hi);
}

static inline int bg_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of reps calls of f() (a kcuda code, < 0 = error), each timed alone
 * with events on the default stream, after `warm` untimed calls; -1 on an error.  When f
 * fails and k is not NULL, "# <what>: <k's message>" is printed. */
template <typename F>
static float bg_median_ms(kcuda_ctx *k, const char *what, int warm, int reps, F f)
{
    cudaEvent_t e0, e1;
    float *ms = (float *)malloc((size_t)reps * sizeof *ms), med = -1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    int r;
    for (r = -warm; ms && r < reps; r++) {
        cudaEventRecord(e0, 0);
        int rc = f();
        cudaEventRecord(e1, 0);
        if (rc < 0) {
            if (k)
                printf("# %s: %s\n", what, kcuda_ctx_errmsg(k));
            break;
        }
        if (gu_ck(cudaEventSynchronize(e1), what))
            break;
        if (r >= 0)
            cudaEventElapsedTime(&ms[r], e0, e1);
    }
    if (ms && r == reps) {
        qsort(ms, reps, sizeof ms[0], bg_cmp_float);
        med = ms[reps / 2];
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    free(ms);
    return med;
}

#endif
