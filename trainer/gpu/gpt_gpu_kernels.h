/* gpt_gpu_kernels.h - small device kernels of the GPU training step that kernels/cuda
 * does not have: gradient precision conversion, fp32 bias gradients, loss sums.  Every
 * function enqueues on `stream` and returns the launch error (cudaSuccess = 0).  Not part
 * of the model's API (gpt_gpu.h). */
#ifndef HEARTH_GPT_GPU_KERNELS_H
#define HEARTH_GPT_GPU_KERNELS_H

#include <cuda_runtime.h>

#include "cuda/kcuda.h"

/* Rows per chunk of the two-pass bias gradient; the scratch holds one fp32 partial per
 * chunk and column: ggk_bias_scratch(M, N) floats. */
#define GGK_BIAS_ROWS 512
static inline size_t ggk_bias_scratch(int M, int N)
{
    return (size_t)((M + GGK_BIAS_ROWS - 1) / GGK_BIAS_ROWS) * (size_t)N;
}

/* x[i] = v for i < n. */
cudaError_t ggk_fill_f32(cudaStream_t s, float *x, size_t n, float v);
/* g32[i] += g16[i]; g16[i] = 0 (n a multiple of 8, both 16-byte aligned). */
cudaError_t ggk_flush_bf16_grads(cudaStream_t s, float *g32, kcuda_bf16 *g16, size_t n);
/* dbias[N] += column sums of dout[M,N], fp32, deterministic: fixed row chunks summed in
 * row order into scratch, then the chunks in order. */
cudaError_t ggk_bias_grad(cudaStream_t s, float *dbias, const kcuda_bf16 *dout, float *scratch,
                          int M, int N);
/* *acc += sum of x[0..n) in double, one block, fixed order. */
cudaError_t ggk_sum_acc(cudaStream_t s, double *acc, const float *x, int n);

#endif
