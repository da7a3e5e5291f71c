/* kdev_cuda_fp8.cu - FP8 emulation on the device: amax (reduced on the device, read back
 * to a host float or left in a device float) and the quantise-dequantise of kernels/cpu/fp8.c, ported operation for
 * operation (kcuda_fp8.cuh), so that every finite result has the cpu backend's bits.  NaN
 * results are NaN on both, though their payload may differ (the GPU returns the canonical
 * NaN). */
#include "cuda/kdev_cuda_internal.h"
#include "cuda/kcuda_fp8.cuh"

#include <math.h>
#include <stdint.h>

#define AMAX_THREADS 256 /* a power of two: the tree halves it */
#define AMAX_BLOCKS 1024

/* Block-wide max of |x| with NaN kept as a flag (kcpu_amax: NaN when any element is). */
__device__ void cuda_amax_block(float m, int nan, float *out)
{
    __shared__ float pm[AMAX_THREADS];
    __shared__ int pn[AMAX_THREADS];
    pm[threadIdx.x] = m;
    pn[threadIdx.x] = nan;
    __syncthreads();
    for (int h = AMAX_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) {
            float o = pm[threadIdx.x + h];
            pm[threadIdx.x] = o > pm[threadIdx.x] ? o : pm[threadIdx.x];
            pn[threadIdx.x] |= pn[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = pn[0] ? NAN : pm[0];
}

__global__ void cuda_amax_partial_kernel(float *part, const float *x, size_t n)
{
    float m = 0.0f;
    int nan = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float a = fabsf(x[i]);
        nan |= isnan(a);
        m = a > m ? a : m;
    }
    cuda_amax_block(m, nan, part + blockIdx.x);
}

/* One block over the partials (a NaN partial stands for a NaN element). */
__global__ void cuda_amax_final_kernel(float *out, const float *part, int nparts)
{
    float m = 0.0f;
    int nan = 0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) {
        float a = part[i];
        nan |= isnan(a);
        m = a > m ? a : m;
    }
    cuda_amax_block(m, nan, out);
}

int cuda_amax(kdev *d, float *amax, const float *x, size_t n, int to_device)
{
    static const char op[] = "amax";
    if (!n && to_device)
        return cuda_err(d, cudaMemsetAsync(amax, 0, sizeof *amax, cuda_stream(d)), op);
    if (!n) {
        *amax = 0.0f;
        return 0;
    }
    size_t nb = (n + AMAX_THREADS - 1) / AMAX_THREADS;
    int blocks = nb < AMAX_BLOCKS ? (int)nb : AMAX_BLOCKS;
    void *ws;
    int rc = cuda_scratch(d, (size_t)(blocks + 1) * sizeof(float), &ws, op);
    if (rc)
        return rc;
    float *part = (float *)ws, *res = to_device ? amax : part + blocks;
    cudaStream_t st = cuda_stream(d);
    cuda_amax_partial_kernel<<<blocks, AMAX_THREADS, 0, st>>>(part, x, n);
    if ((rc = cuda_launched(d, op)))
        return rc;
    cuda_amax_final_kernel<<<1, AMAX_THREADS, 0, st>>>(res, part, blocks);
    if ((rc = cuda_launched(d, op)))
        return rc;
    return to_device ? 0 : cuda_download(d, amax, res, sizeof *amax);
}

/* ---- quantise-dequantise (the rounding: kcuda_fp8.cuh) ---------------------------------- */

__global__ void cuda_fp8_qdq_kernel(float *out, const float *x, size_t n, float scale,
                                    kcuda_fp8_fmt F)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = __fdiv_rn(kcuda_fp8_round(__fmul_rn(x[i], scale), F), scale);
}

int cuda_fp8_qdq(kdev *d, float *out, const float *x, size_t n, float scale, kfp8_format f)
{
    if (f != KFP8_E4M3 && f != KFP8_E5M2)
        return kdev_fail(d, HERR_ARG, "fp8_qdq: unknown format %d", (int)f);
    if (!n)
        return 0;
    kcuda_fp8_fmt F = kcuda_fp8_fmt_of(f == KFP8_E4M3 ? KCUDA_FP8_E4M3 : KCUDA_FP8_E5M2);
    cuda_fp8_qdq_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream(d)>>>(out, x, n, scale, F);
    return cuda_launched(d, "fp8_qdq");
}
