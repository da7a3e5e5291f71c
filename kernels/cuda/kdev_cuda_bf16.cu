/* kdev_cuda_bf16.cu - fp32 <-> bf16 conversions and bf16 scratch buffers for the ops
 * that run on bf16 kernels at the precision BF16 (kdev_cuda_attn16.cu, kdev_cuda_gemm16.cu).
 * Conversions round to nearest even (__float2bfloat16_rn) and are elementwise: the same
 * bits on every run. */
#include "cuda/kdev_cuda_internal.h"
#include "cuda/kcuda_internal.h"

#include <cuda_bf16.h>

#define CVT_THREADS 256

__global__ void cuda_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* The same, four elements per thread (16-byte loads, 8-byte stores): src 16-byte and dst
 * 8-byte aligned, n4 = n / 4 groups; the caller converts the tail. */
__global__ void cuda_to_bf16_x4_kernel(__nv_bfloat162 *dst, const float4 *src, size_t n4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = src[i];
        dst[2 * i] = __floats2bfloat162_rn(v.x, v.y);
        dst[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
    }
}

/* dst = (accumulate ? dst : 0) + fp32(src) */
__global__ void cuda_from_bf16_kernel(float *dst, const __nv_bfloat16 *src, size_t n,
                                      int accumulate)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = __bfloat162float(src[i]);
        dst[i] = accumulate ? dst[i] + v : v;
    }
}

/* The same, four elements per thread: dst 16-byte and src 8-byte aligned. */
__global__ void cuda_from_bf16_x4_kernel(float4 *dst, const __nv_bfloat162 *src, size_t n4,
                                         int accumulate)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float2 a = __bfloat1622float2(src[2 * i]), b = __bfloat1622float2(src[2 * i + 1]);
        float4 v = make_float4(a.x, a.y, b.x, b.y);
        if (accumulate) {
            float4 o = dst[i];
            v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
        }
        dst[i] = v;
    }
}

/* Whether p is a multiple of `bytes` (a power of two). */
static int aligned(const void *p, size_t bytes)
{
    return ((uintptr_t)p & (bytes - 1)) == 0;
}

/* dst[r * pitch + c] = src[r * cols + c]; the pad columns [cols, pitch) get zeros.  Rows
 * on the grid's y (a grid-stride loop past 65535), columns on x: no per-element division. */
__global__ void cuda_to_bf16_pitched_kernel(__nv_bfloat16 *dst, const float *src, size_t rows,
                                            int cols, int pitch)
{
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *in = src + r * (size_t)cols;
        __nv_bfloat16 *o = dst + r * (size_t)pitch;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < pitch;
             c += gridDim.x * blockDim.x)
            o[c] = __float2bfloat16_rn(c < cols ? in[c] : 0.0f);
    }
}

/* dst[r * cols + c] = src[r * pitch + c] for c < cols (fp32): a pitched block back into
 * packed rows. */
__global__ void cuda_unpitch_kernel(float *dst, const float *src, size_t rows, int cols,
                                    int pitch)
{
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *in = src + r * (size_t)pitch;
        float *o = dst + r * (size_t)cols;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols;
             c += gridDim.x * blockDim.x)
            o[c] = in[c];
    }
}

/* The grid of a rows x cols kernel above. */
static dim3 rows_grid(size_t rows, int cols)
{
    unsigned x = (unsigned)((cols + CVT_THREADS - 1) / CVT_THREADS);
    return dim3(x ? x : 1, (unsigned)(rows < 65535 ? rows : 65535));
}

int cuda_to_bf16_pitched(kdev *d, kcuda_bf16 *dst, int pitch, const float *src, size_t rows,
                         int cols, const char *op)
{
    if (rows == 0 || cols <= 0)
        return 0;
    cuda_to_bf16_pitched_kernel<<<rows_grid(rows, pitch), CVT_THREADS, 0, cuda_stream(d)>>>(
        (__nv_bfloat16 *)dst, src, rows, cols, pitch);
    return cuda_launched(d, op);
}

int cuda_unpitch(kdev *d, float *dst, const float *src, size_t rows, int cols, int pitch,
                 const char *op)
{
    if (rows == 0 || cols <= 0)
        return 0;
    cuda_unpitch_kernel<<<rows_grid(rows, cols), CVT_THREADS, 0, cuda_stream(d)>>>(
        dst, src, rows, cols, pitch);
    return cuda_launched(d, op);
}

/* Elementwise conversions: the bulk four elements per thread where the pointers allow
 * (the same roundings, so the same bits), the tail (n % 4) one per thread. */
int cuda_to_bf16(kdev *d, kcuda_bf16 *dst, const float *src, size_t n, const char *op)
{
    if (n == 0)
        return 0;
    size_t done = 0;
    if (aligned(src, 16) && aligned(dst, 8) && n >= 4) {
        size_t n4 = n / 4;
        cuda_to_bf16_x4_kernel<<<cuda_blocks(n4, CVT_THREADS), CVT_THREADS, 0,
                                 cuda_stream(d)>>>((__nv_bfloat162 *)dst, (const float4 *)src,
                                                   n4);
        done = 4 * n4;
    }
    if (done < n)
        cuda_to_bf16_kernel<<<cuda_blocks(n - done, CVT_THREADS), CVT_THREADS, 0,
                              cuda_stream(d)>>>((__nv_bfloat16 *)dst + done, src + done,
                                                n - done);
    return cuda_launched(d, op);
}

int cuda_from_bf16(kdev *d, float *dst, const kcuda_bf16 *src, size_t n, int accumulate,
                     const char *op)
{
    if (n == 0 || !dst)
        return 0;
    size_t done = 0;
    if (aligned(dst, 16) && aligned(src, 8) && n >= 4) {
        size_t n4 = n / 4;
        cuda_from_bf16_x4_kernel<<<cuda_blocks(n4, CVT_THREADS), CVT_THREADS, 0,
                                   cuda_stream(d)>>>((float4 *)dst,
                                                     (const __nv_bfloat162 *)src, n4,
                                                     accumulate);
        done = 4 * n4;
    }
    if (done < n)
        cuda_from_bf16_kernel<<<cuda_blocks(n - done, CVT_THREADS), CVT_THREADS, 0,
                                cuda_stream(d)>>>(dst + done,
                                                  (const __nv_bfloat16 *)src + done, n - done,
                                                  accumulate);
    return cuda_launched(d, op);
}

/* n bf16 buffers of the given element counts, carved from the scratch. */
int cuda_carve_bf16(kdev *d, kcuda_bf16 **p, const size_t *count, int n, const char *op)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += cuda_align256(count[i] * sizeof(kcuda_bf16));
    void *base;
    int rc = cuda_scratch(d, total ? total : 256, &base, op);
    if (rc)
        return rc;
    char *c = (char *)base;
    for (int i = 0; i < n; i++) {
        p[i] = (kcuda_bf16 *)c;
        c += cuda_align256(count[i] * sizeof(kcuda_bf16));
    }
    return 0;
}


int cuda_act_f32(kdev *d, float **x, const float *src, size_t n, const char *op)
{
    *x = NULL;
    if (!cuda_act16(d, src) || n == 0)
        return 0;
    float *t = NULL;
    int rc = cuda_err(d, cudaMallocAsync((void **)&t, n * sizeof(float), cuda_stream(d)), op);
    if (rc)
        return rc;
    *x = t;
    return cuda_from_bf16(d, t, (const kcuda_bf16 *)src, n, 0, op);
}

int cuda_act_f32_free(kdev *d, float *x, int rc)
{
    if (x)
        cudaFreeAsync(x, cuda_stream(d));
    return rc;
}

/* dst[r * dpitch + c] = src[r * spitch + c] converted from TI to TO, W columns a thread
 * (one 16- or 8-byte access each side) where rows allow it. */
template <typename TO, typename TI, int W>
__global__ void cuda_rows_convert_kernel(TO *dst, size_t dpitch, const TI *src, size_t spitch,
                                         size_t rows, size_t cols)
{
    size_t nv = cols / W;
    for (size_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const TI *in = src + r * spitch;
        TO *o = dst + r * dpitch;
        for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < nv;
             c += (size_t)gridDim.x * blockDim.x) {
            float f[W];
            kcuda_ldw<W>(f, in + c * W);
            kcuda_stw<W>(o + c * W, f);
        }
    }
}

template <typename TO, typename TI>
static int rows_convert(kdev *d, TO *dst, size_t dpitch, const TI *src, size_t spitch,
                        size_t rows, size_t cols, const char *op)
{
    /* 4 columns a thread: 16 bytes of fp32, 8 of bf16 */
    int vec = cols % 4 == 0 && dpitch % 4 == 0 && spitch % 4 == 0 &&
              aligned(src, 4 * sizeof(TI)) && aligned(dst, 4 * sizeof(TO));
    size_t w = vec ? cols / 4 : cols;
    unsigned gx = (unsigned)((w + CVT_THREADS - 1) / CVT_THREADS);
    dim3 grid(gx < 65535 ? gx : 65535, (unsigned)(rows < 65535 ? rows : 65535));
    if (vec)
        cuda_rows_convert_kernel<TO, TI, 4><<<grid, CVT_THREADS, 0, cuda_stream(d)>>>(
            dst, dpitch, src, spitch, rows, cols);
    else
        cuda_rows_convert_kernel<TO, TI, 1><<<grid, CVT_THREADS, 0, cuda_stream(d)>>>(
            dst, dpitch, src, spitch, rows, cols);
    return cuda_launched(d, op);
}

int cuda_act_copy_2d(kdev *d, float *dst, size_t dpitch, const float *src, size_t spitch,
                     size_t rows, size_t cols)
{
    static const char op[] = "act_copy_2d";
    int d16 = cuda_act16(d, dst), s16 = cuda_act16(d, src);
    if (!rows || !cols)
        return 0;
    if (d16 == s16) {   /* the same type: a copy of bytes */
        size_t e = d16 ? sizeof(kcuda_bf16) : sizeof(float);
        return cuda_copy_2d(d, dst, dpitch * e, src, spitch * e, cols * e, rows);
    }
    typedef __nv_bfloat16 bf;
    if (d16)
        return rows_convert(d, (bf *)dst, dpitch, src, spitch, rows, cols, op);
    return rows_convert(d, dst, dpitch, (const bf *)src, spitch, rows, cols, op);
}
