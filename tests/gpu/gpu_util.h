/* gpu_util.h - helpers of the GPU test and benchmark programs (tests/gpu, contrib/bench):
 * host bf16 rounding, device uploads/downloads, poisoning, relative L2.  Test code only:
 * a failed CUDA call here prints and returns a sentinel rather than aborting. */
#ifndef HEARTH_GPU_UTIL_H
#define HEARTH_GPU_UTIL_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kcuda.h"

/* Round-to-nearest-even fp32 -> bf16 bits (NaN kept quiet). */
static inline kcuda_bf16 gu_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (kcuda_bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (kcuda_bf16)(u >> 16);
}

static inline float gu_from_bf16(kcuda_bf16 b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* xorshift64*: fresh inputs per run, the seed printed so a failure can be replayed. */
static inline uint64_t gu_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static inline float gu_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((gu_next(s) >> 40) * (1.0 / 16777216.0));
}

/* n random values in [lo,hi); rounded to bf16-representable values when bf16 != 0, so
 * that the CPU reference sees exactly what the GPU reads. */
static inline float *gu_rand(uint64_t *s, size_t n, float lo, float hi, int bf16)
{
    float *h = (float *)malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        float v = gu_uniform(s, lo, hi);
        h[i] = bf16 ? gu_from_bf16(gu_to_bf16(v)) : v;
    }
    return h;
}

static inline int gu_ck(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        printf("# CUDA error in %s: %s\n", what, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

/* Device copy of h[n], as fp32 or bf16 (bf16 != 0).  NULL on failure. */
static inline void *gu_upload(const float *h, size_t n, int bf16)
{
    void *d = NULL;
    size_t es = bf16 ? 2 : 4;
    if (gu_ck(cudaMalloc(&d, n * es), "cudaMalloc"))
        return NULL;
    if (bf16) {
        kcuda_bf16 *t = (kcuda_bf16 *)malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            t[i] = gu_to_bf16(h[i]);
        int bad = gu_ck(cudaMemcpy(d, t, n * 2, cudaMemcpyHostToDevice), "upload");
        free(t);
        if (bad) {
            cudaFree(d);
            return NULL;
        }
    } else if (gu_ck(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice), "upload")) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

/* A device buffer of n elements filled with NaN (all bits set: NaN in fp32 and bf16),
 * so that any element a kernel fails to write shows. */
static inline void *gu_poisoned(size_t n, int bf16)
{
    void *d = NULL;
    size_t bytes = n * (bf16 ? 2 : 4);
    if (gu_ck(cudaMalloc(&d, bytes), "cudaMalloc"))
        return NULL;
    if (gu_ck(cudaMemset(d, 0xff, bytes), "cudaMemset")) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

/* Host fp32 copy of a device buffer (freed by the caller); NULL on failure. */
static inline float *gu_download(const void *d, size_t n, int bf16)
{
    float *h = (float *)malloc(n * sizeof *h);
    if (gu_ck(cudaDeviceSynchronize(), "sync before download")) {
        free(h);
        return NULL;
    }
    if (bf16) {
        kcuda_bf16 *t = (kcuda_bf16 *)malloc(n * 2);
        int bad = gu_ck(cudaMemcpy(t, d, n * 2, cudaMemcpyDeviceToHost), "download");
        for (size_t i = 0; !bad && i < n; i++)
            h[i] = gu_from_bf16(t[i]);
        free(t);
        if (bad) {
            free(h);
            return NULL;
        }
    } else if (gu_ck(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost), "download")) {
        free(h);
        return NULL;
    }
    return h;
}

/* ||got - ref|| / ||ref|| in double; NaN anywhere in got gives NaN (never passes). */
static inline double gu_rel_l2(const float *got, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (den == 0)
        return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

#endif
