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

/* Eight elements per thread: one 16-byte bf16 load/store, two 16-byte fp32 loads/stores. */
__global__ void flush_kernel(float *g32, __nv_bfloat16 *g16, size_t n8)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 h = ((const uint4 *)g16)[i];
        const __nv_bfloat162 *b = (const __nv_bfloat162 *)&h;
        float4 *f = (float4 *)g32 + 2 * i;
        float4 lo = f[0], hi = f[1];
        float2 t0 = __bfloat1622float2(b[0]), t1 = __bfloat1622float2(b[1]);
        float2 t2 = __bfloat1622float2(b[2]), t3 = __bfloat1622float2(b[3]);
        lo.x += t0.x;
        lo.y += t0.y;
        lo.z += t1.x;
        lo.w += t1.y;
        hi.x += t2.x;
        hi.y += t2.y;
        hi.z += t3.x;
        hi.w += t3.y;
        f[0] = lo;
        f[1] = hi;
        ((uint4 *)g16)[i] = make_uint4(0, 0, 0, 0);
    }
}

cudaError_t ggk_flush_bf16_grads(cudaStream_t s, float *g32, kcuda_bf16 *g16, size_t n)
{
    size_t n8 = n / 8;
    if (n8 == 0)
        return cudaSuccess;
    size_t blocks = (n8 + 255) / 256;
    flush_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, s>>>(
        g32, (__nv_bfloat16 *)g16, n8);
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
    dim3 grid((N + 31) / 32, chunks), block(32, 8);
    bias_part_kernel<<<grid, block, 0, s>>>(scratch, (const __nv_bfloat16 *)dout, M, N);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    bias_finish_kernel<<<(N + 255) / 256, 256, 0, s>>>(dbias, scratch, chunks, N);
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
