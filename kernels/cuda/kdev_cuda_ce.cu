/* kdev_cuda_ce.cu - the vocabulary-parallel cross-entropy pieces (kdev.h): row maximum,
 * row sum of exp in double with the target's logit, and the gradient of a slice.
 *
 * One block per row.  Each thread walks the columns j = tid, tid + T, ... in order, then
 * the block combines the T partials by a shared-memory tree whose shape depends only on
 * T: the same bits on every run (the cpu backend sums the row left to right, so the two
 * differ by double rounding only). */
#include "cuda/kdev_cuda_internal.h"

#define CE_THREADS 256 /* a power of two: the trees halve it */

/* max as the reference takes it: a NaN never replaces the running value */
__device__ __forceinline__ float cuda_ce_max(float m, float x)
{
    return x > m ? x : m;
}

__global__ void cuda_ce_rowmax_kernel(float *mx, const float *logits, int Vl)
{
    __shared__ float part[CE_THREADS];
    const float *x = logits + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < Vl; j += CE_THREADS)
        m = cuda_ce_max(m, x[j]);
    part[threadIdx.x] = m;
    __syncthreads();
    for (int h = CE_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h)
            part[threadIdx.x] = cuda_ce_max(part[threadIdx.x], part[threadIdx.x + h]);
        __syncthreads();
    }
    if (threadIdx.x == 0)
        mx[blockIdx.x] = part[0];
}

__global__ void cuda_ce_rowsum_kernel(double *sums, const float *logits, const float *mx,
                                      const int *targets, int v0, int n, int Vl)
{
    __shared__ double part[CE_THREADS];
    int r = blockIdx.x;
    const float *x = logits + (size_t)r * Vl;
    float m = mx[r];
    double s = 0;
    for (int j = threadIdx.x; j < Vl; j += CE_THREADS)
        s += exp((double)x[j] - m);
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = CE_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h)
            part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int t = targets[r] - v0;
        sums[r] = part[0];
        sums[n + r] = t >= 0 && t < Vl ? (double)x[t] : 0.0;
    }
}

__global__ void cuda_ce_grad_kernel(float *dlogits, const float *logits, const double *lse,
                                    const int *targets, int v0, double dl, int Vl)
{
    int r = blockIdx.x;
    const float *x = logits + (size_t)r * Vl;
    float *dx = dlogits + (size_t)r * Vl;
    double l = lse[r];
    int t = targets[r] - v0; /* outside [0, Vl): not this slice's */
    /* The exponent's argument in double (x - lse cancels), the exponential in fp32: the
     * double exp made this memory-bound pass compute-bound (4.7 ms for 16384 x 50257 on
     * an H100); the result differs from the reference's by fp32 rounding. */
    float g = (float)dl;
    for (int j = threadIdx.x; j < Vl; j += CE_THREADS) {
        float p = expf((float)((double)x[j] - l));
        dx[j] = g * (j == t ? p - 1.0f : p);
    }
}

int cuda_ce_rowmax(kdev *d, float *mx, const float *logits, int n, int Vl)
{
    if (n <= 0)
        return 0;
    cuda_ce_rowmax_kernel<<<n, CE_THREADS, 0, cuda_stream(d)>>>(mx, logits, Vl < 0 ? 0 : Vl);
    return cuda_launched(d, "ce_rowmax");
}

int cuda_ce_rowsum(kdev *d, double *sums, const float *logits, const float *mx,
                   const int *targets, int v0, int n, int Vl)
{
    if (n <= 0)
        return 0;
    cuda_ce_rowsum_kernel<<<n, CE_THREADS, 0, cuda_stream(d)>>>(sums, logits, mx, targets, v0,
                                                                n, Vl < 0 ? 0 : Vl);
    return cuda_launched(d, "ce_rowsum");
}

int cuda_ce_grad(kdev *d, float *dlogits, const float *logits, const double *lse,
                 const int *targets, int v0, double dl, int n, int Vl)
{
    if (n <= 0 || Vl <= 0)
        return 0;
    cuda_ce_grad_kernel<<<n, CE_THREADS, 0, cuda_stream(d)>>>(dlogits, logits, lse, targets, v0,
                                                              dl, Vl);
    return cuda_launched(d, "ce_grad");
}

__global__ void cuda_ce_finish_kernel(double *lse, float *losses, const float *mx,
                                      const double *sums, int n)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n)
        return;
    double l = (double)mx[r] + log(sums[r]);
    lse[r] = l;
    losses[r] = (float)(l - sums[n + r]);
}

int cuda_ce_finish(kdev *d, double *lse, float *losses, const float *mx, const double *sums,
                   int n)
{
    if (n <= 0)
        return 0;
    cuda_ce_finish_kernel<<<(n + 255) / 256, 256, 0, cuda_stream(d)>>>(lse, losses, mx, sums, n);
    return cuda_launched(d, "ce_finish");
}
