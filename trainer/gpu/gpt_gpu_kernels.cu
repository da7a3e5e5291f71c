/* gpt_gpu_kernels.cu - the step's small kernels (gpt_gpu_kernels.h). */
#include "gpu/gpt_gpu_kernels.h"

#include <cuda_bf16.h>

__global__ void fill_kernel(float *x, size_t n, float v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}

cudaError_t ggk_fill_f32(cudaStream_t s, float *x, size_t n, float v)
{
    if (n == 0)
        return cudaSuccess;
    size_t blocks = (n + 255) / 256;
    fill_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, s>>>(x, n, v);
    return cudaGetLastError();
}

/* GELU (tanh form) derivative, the formula of kernels/cuda/gelu.cu. */
__device__ __forceinline__ float gelu_tanh_grad(float x)
{
    const float k = 0.7978845608028654f, c = 0.044715f;
    float t = tanhf(k * (x + c * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
}

/* Eight elements per thread and iteration (16-byte accesses), the tail one by one. */
__global__ void gelu_bwd_set_kernel(__nv_bfloat16 *dinp, const __nv_bfloat16 *dout,
                                    const __nv_bfloat16 *inp, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x, n8 = n / 8;
    size_t t0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (size_t i = t0; i < n8; i += stride) {
        uint4 a = ((const uint4 *)inp)[i], g = ((const uint4 *)dout)[i], d;
        const __nv_bfloat162 *a2 = (const __nv_bfloat162 *)&a, *g2 = (const __nv_bfloat162 *)&g;
        __nv_bfloat162 *d2 = (__nv_bfloat162 *)&d;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 x = __bfloat1622float2(a2[j]), y = __bfloat1622float2(g2[j]);
            d2[j] = __floats2bfloat162_rn(y.x * gelu_tanh_grad(x.x), y.y * gelu_tanh_grad(x.y));
        }
        ((uint4 *)dinp)[i] = d;
    }
    for (size_t i = n8 * 8 + t0; i < n; i += stride)
        dinp[i] = __float2bfloat16_rn(__bfloat162float(dout[i]) *
                                      gelu_tanh_grad(__bfloat162float(inp[i])));
}

cudaError_t ggk_gelu_backward_set(cudaStream_t s, kcuda_bf16 *dinp, const kcuda_bf16 *dout,
                                  const kcuda_bf16 *inp, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    size_t blocks = (n / 8 + 255) / 256;
    blocks = blocks < 1 ? 1 : blocks > 65536 ? 65536 : blocks;
    gelu_bwd_set_kernel<<<(unsigned)blocks, 256, 0, s>>>(
        (__nv_bfloat16 *)dinp, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)inp, n);
    return cudaGetLastError();
}

/* Pass 1: block (x, y) sums columns [32x, 32x+32) over rows [y*R, y*R+R): 8 row lanes of
 * 32 columns, each lane strided by 8 rows, then the 8 lanes in order. */
__global__ void bias_part_kernel(float *part, const __nv_bfloat16 *dout, int M, int N)
{
    __shared__ float s[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * GGK_BIAS_ROWS, r1 = min(M, r0 + GGK_BIAS_ROWS);
    float acc = 0.0f;
    if (c < N)
        for (int r = r0 + threadIdx.y; r < r1; r += 8)
            acc += __bfloat162float(dout[(size_t)r * N + c]);
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < N) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++)
            t += s[k][threadIdx.x];
        part[(size_t)blockIdx.y * N + c] = t;
    }
}

/* Pass 1 with 16-byte loads (N a multiple of 8, dout 16-byte aligned): block (x, y) sums
 * columns [256x, 256x+256) over the same row chunk, each thread 8 adjacent columns; the
 * same order as bias_part_kernel (8 row lanes strided by 8 rows, then the lanes in
 * order), so the same sums. */
__global__ void bias_part8_kernel(float *part, const __nv_bfloat16 *dout, int M, int N)
{
    __shared__ float s[8][32 * 8 + 4];
    int c = (blockIdx.x * 32 + threadIdx.x) * 8;
    int r0 = blockIdx.y * GGK_BIAS_ROWS, r1 = min(M, r0 + GGK_BIAS_ROWS);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c < N) {
#pragma unroll 8
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            uint4 v = *(const uint4 *)(dout + (size_t)r * N + c);
            const __nv_bfloat162 *b = (const __nv_bfloat162 *)&v;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(b[j]);
                acc[2 * j] += f.x;
                acc[2 * j + 1] += f.y;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        s[threadIdx.y][threadIdx.x * 8 + j] = acc[j];
    __syncthreads();
    /* All 256 threads finish one column each of the block's 256. */
    int t = threadIdx.y * 32 + threadIdx.x, col = blockIdx.x * 256 + t;
    if (col < N) {
        float sum = 0.0f;
        for (int k = 0; k < 8; k++)
            sum += s[k][t];
        part[(size_t)blockIdx.y * N + col] = sum;
    }
}

__global__ void bias_finish_kernel(float *dbias, const float *part, int chunks, int N)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= N)
        return;
    float t = 0.0f;
    for (int k = 0; k < chunks; k++)
        t += part[(size_t)k * N + c];
    dbias[c] += t;
}

cudaError_t ggk_bias_grad(cudaStream_t s, float *dbias, const kcuda_bf16 *dout, float *scratch,
                          int M, int N)
{
    int chunks = (M + GGK_BIAS_ROWS - 1) / GGK_BIAS_ROWS;
    dim3 block(32, 8);
    if (N % 8 == 0 && (uintptr_t)dout % 16 == 0)
        bias_part8_kernel<<<dim3((N + 255) / 256, chunks), block, 0, s>>>(
            scratch, (const __nv_bfloat16 *)dout, M, N);
    else
        bias_part_kernel<<<dim3((N + 31) / 32, chunks), block, 0, s>>>(
            scratch, (const __nv_bfloat16 *)dout, M, N);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    bias_finish_kernel<<<(N + 255) / 256, 256, 0, s>>>(dbias, scratch, chunks, N);
    return cudaGetLastError();
}

/* LayerNorm parameter gradients, pass 1: as bias_part8_kernel, with the normalised input
 * xhat = (x - mean) * rstd of each row: part_w += dy * xhat, part_b += dy.  The two
 * partial arrays are scratch [chunks, N] and scratch + chunks * N. */
__global__ void ln_part8_kernel(float *part, const __nv_bfloat16 *dout, const __nv_bfloat16 *inp,
                                const float *mean, const float *rstd, int M, int N, int chunks)
{
    __shared__ float sw[8][32 * 8 + 4], sb[8][32 * 8 + 4];
    int c = (blockIdx.x * 32 + threadIdx.x) * 8;
    int r0 = blockIdx.y * GGK_BIAS_ROWS, r1 = min(M, r0 + GGK_BIAS_ROWS);
    float aw[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ab[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c < N) {
#pragma unroll 4
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            uint4 dv = *(const uint4 *)(dout + (size_t)r * N + c);
            uint4 xv = *(const uint4 *)(inp + (size_t)r * N + c);
            const __nv_bfloat162 *d2 = (const __nv_bfloat162 *)&dv;
            const __nv_bfloat162 *x2 = (const __nv_bfloat162 *)&xv;
            float mu = mean[r], rs = rstd[r];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 d = __bfloat1622float2(d2[j]), x = __bfloat1622float2(x2[j]);
                aw[2 * j] += d.x * ((x.x - mu) * rs);
                aw[2 * j + 1] += d.y * ((x.y - mu) * rs);
                ab[2 * j] += d.x;
                ab[2 * j + 1] += d.y;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        sw[threadIdx.y][threadIdx.x * 8 + j] = aw[j];
        sb[threadIdx.y][threadIdx.x * 8 + j] = ab[j];
    }
    __syncthreads();
    int t = threadIdx.y * 32 + threadIdx.x, col = blockIdx.x * 256 + t;
    if (col < N) {
        float w = 0.0f, b = 0.0f;
        for (int k = 0; k < 8; k++) {
            w += sw[k][t];
            b += sb[k][t];
        }
        part[(size_t)blockIdx.y * N + col] = w;
        part[((size_t)chunks + blockIdx.y) * N + col] = b;
    }
}

int ggk_ln_param_grad_ok(int N, const kcuda_bf16 *dout, const kcuda_bf16 *inp)
{
    return N % 8 == 0 && (uintptr_t)dout % 16 == 0 && (uintptr_t)inp % 16 == 0;
}

cudaError_t ggk_ln_param_grad(cudaStream_t s, float *dweight, float *dbias,
                              const kcuda_bf16 *dout, const kcuda_bf16 *inp, const float *mean,
                              const float *rstd, float *scratch, int M, int N)
{
    int chunks = (M + GGK_BIAS_ROWS - 1) / GGK_BIAS_ROWS;
    ln_part8_kernel<<<dim3((N + 255) / 256, chunks), dim3(32, 8), 0, s>>>(
        scratch, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)inp, mean, rstd, M, N,
        chunks);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    bias_finish_kernel<<<(N + 255) / 256, 256, 0, s>>>(dweight, scratch, chunks, N);
    if ((e = cudaGetLastError()) != cudaSuccess)
        return e;
    bias_finish_kernel<<<(N + 255) / 256, 256, 0, s>>>(dbias, scratch + (size_t)chunks * N,
                                                        chunks, N);
    return cudaGetLastError();
}

__global__ void add_kernel(float *y, const float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

cudaError_t ggk_add_f32(cudaStream_t s, float *y, const float *x, int n)
{
    if (n <= 0)
        return cudaSuccess;
    add_kernel<<<(n + 255) / 256, 256, 0, s>>>(y, x, n);
    return cudaGetLastError();
}

__global__ void sum_acc_kernel(double *acc, const float *x, int n)
{
    __shared__ double s[1024];
    double t = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        t += x[i];
    s[threadIdx.x] = t;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *acc += s[0];
}

cudaError_t ggk_sum_acc(cudaStream_t s, double *acc, const float *x, int n)
{
    sum_acc_kernel<<<1, 1024, 0, s>>>(acc, x, n);
    return cudaGetLastError();
}
