/* gpt_gpu_kernels.h - small device kernels of the GPU training step that kernels/cuda
 * does not have: fp32 bias and LayerNorm parameter gradients, an overwriting GELU
 * backward, fills, loss sums.  Every
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
/* dinp = dout * gelu'(inp), GELU in its tanh form (kcuda_gelu_backward_bf16's formula,
 * kind 0) but OVERWRITING dinp: no zeroing pass before.  All three 16-byte aligned. */
cudaError_t ggk_gelu_backward_set(cudaStream_t s, kcuda_bf16 *dinp, const kcuda_bf16 *dout,
                                  const kcuda_bf16 *inp, size_t n);
/* dbias[N] += column sums of dout[M,N], fp32, deterministic: fixed row chunks summed in
 * row order into scratch, then the chunks in order. */
cudaError_t ggk_bias_grad(cudaStream_t s, float *dbias, const kcuda_bf16 *dout, float *scratch,
                          int M, int N);
/* LayerNorm weight and bias gradients, fp32, the same two-pass fixed-order scheme as
 * ggk_bias_grad: dweight[N] += sum over rows of dout * (inp - mean) * rstd, dbias[N] +=
 * sum over rows of dout (dout, inp [M,N]; mean, rstd [M] from the forward).  scratch:
 * 2 * ggk_bias_scratch(M, N) floats.  Needs ggk_ln_param_grad_ok (N a multiple of 8,
 * 16-byte aligned rows).  Used instead of kcuda_layernorm_backward_bf16's own parameter
 * reduction, which sums each column by one thread over up to 1024 rows: a few hundred
 * GB/s at B 64 x T 1024. */
int ggk_ln_param_grad_ok(int N, const kcuda_bf16 *dout, const kcuda_bf16 *inp);
cudaError_t ggk_ln_param_grad(cudaStream_t s, float *dweight, float *dbias,
                              const kcuda_bf16 *dout, const kcuda_bf16 *inp, const float *mean,
                              const float *rstd, float *scratch, int M, int N);
/* y[i] += x[i] for i < n (small vectors: a fused bias gradient into its accumulator). */
cudaError_t ggk_add_f32(cudaStream_t s, float *y, const float *x, int n);
/* *acc += sum of x[0..n) in double, one block, fixed order. */
cudaError_t ggk_sum_acc(cudaStream_t s, double *acc, const float *x, int n);

#endif
