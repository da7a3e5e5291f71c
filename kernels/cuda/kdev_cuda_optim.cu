/* kdev_cuda_optim.cu - the optimizer's ops: AdamW (the kcuda kernel, fp32 arithmetic with
 * the bias corrections from the host in double; the reference uses double per element, a
 * few ulps apart) and the sum of squares in double, read back to a host double.
 *
 * The sum runs in two stages whose shapes depend only on n: a grid of at most SUMSQ_BLOCKS
 * blocks, each thread summing a fixed stride, each block a fixed tree; then one block adds
 * the block sums by the same tree.  Same bits on every run and every GPU. */
#include "cuda/kdev_cuda_internal.h"

#define SUMSQ_THREADS 256 /* a power of two */
#define SUMSQ_BLOCKS 1024

__device__ void cuda_sum_block(double s, double *out)
{
    __shared__ double part[SUMSQ_THREADS];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int h = SUMSQ_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h)
            part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = part[0];
}

__global__ void cuda_sumsq_partial_kernel(double *part, const float *x, size_t n)
{
    double s = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        s += (double)x[i] * x[i];
    cuda_sum_block(s, part + blockIdx.x);
}

__global__ void cuda_sum_final_kernel(double *out, const double *part, int nparts)
{
    double s = 0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x)
        s += part[i];
    cuda_sum_block(s, out);
}

int cuda_sumsq(kdev *d, double *out, const float *x, size_t n)
{
    static const char op[] = "sumsq";
    if (!n) {
        *out = 0.0;
        return 0;
    }
    size_t nb = (n + SUMSQ_THREADS - 1) / SUMSQ_THREADS;
    int blocks = nb < SUMSQ_BLOCKS ? (int)nb : SUMSQ_BLOCKS;
    void *ws;
    int rc = cuda_scratch(d, (size_t)(blocks + 1) * sizeof(double), &ws, op);
    if (rc)
        return rc;
    double *part = (double *)ws, *res = part + blocks;
    cudaStream_t st = cuda_stream(d);
    cuda_sumsq_partial_kernel<<<blocks, SUMSQ_THREADS, 0, st>>>(part, x, n);
    if ((rc = cuda_launched(d, op)))
        return rc;
    cuda_sum_final_kernel<<<1, SUMSQ_THREADS, 0, st>>>(res, part, blocks);
    if ((rc = cuda_launched(d, op)))
        return rc;
    return cuda_download(d, out, res, sizeof *out);
}

/* The multi-tensor ops: descriptors built on the host and uploaded into the scratch, then
 * kcuda's multi-tensor kernels (fixed chunking and reduction order: deterministic). */
int cuda_sumsq_multi(kdev *d, double *out, const float *const *x, const size_t *n, int count)
{
    static const char op[] = "sumsq_multi";
    *out = 0.0;
    if (count <= 0)
        return 0;
    kcuda_tensor_f32 *h = (kcuda_tensor_f32 *)malloc((size_t)count * sizeof *h);
    if (!h)
        return kdev_fail(d, HERR_NOMEM, "%s: out of host memory", op);
    for (int i = 0; i < count; i++) {
        h[i].p = x[i];
        h[i].n = n[i];
    }
    size_t db = cuda_align256((size_t)count * sizeof *h);
    void *ws;
    int rc = cuda_scratch(d, db + sizeof(double), &ws, op);
    kcuda_tensor_f32 *desc = (kcuda_tensor_f32 *)ws;
    double *res = (double *)((char *)ws + db);
    if (!rc)
        rc = cuda_upload(d, desc, h, (size_t)count * sizeof *h);
    free(h);
    if (!rc)
        rc = cuda_kc(d, kcuda_multi_sumsq_f32(cuda_st(d)->k, res, desc, count), op);
    return rc ? rc : cuda_download(d, out, res, sizeof *out);
}

int cuda_adamw_multi(kdev *d, const kdev_adamw_tensor *t, int count, float clip, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int step)
{
    static const char op[] = "adamw_multi";
    if (count <= 0)
        return 0;
    kcuda_adamw_tensor *h = (kcuda_adamw_tensor *)malloc((size_t)count * sizeof *h);
    if (!h)
        return kdev_fail(d, HERR_NOMEM, "%s: out of host memory", op);
    for (int i = 0; i < count; i++) {
        h[i].param = t[i].param;
        h[i].param_bf16 = NULL;
        h[i].grad = t[i].grad;
        h[i].m = t[i].m;
        h[i].v = t[i].v;
        h[i].n = t[i].n;
        h[i].decay = t[i].decay;
    }
    size_t db = cuda_align256((size_t)count * sizeof *h);
    void *ws;
    int rc = cuda_scratch(d, db + sizeof(float), &ws, op);
    kcuda_adamw_tensor *desc = (kcuda_adamw_tensor *)ws;
    float *dclip = (float *)((char *)ws + db);
    if (!rc)
        rc = cuda_upload(d, desc, h, (size_t)count * sizeof *h);
    if (!rc)
        rc = cuda_upload(d, dclip, &clip, sizeof clip);
    free(h);
    if (!rc)
        rc = cuda_kc(d, kcuda_multi_adamw_update(cuda_st(d)->k, desc, count,
                                                 clip != 1.0f ? dclip : NULL, lr, beta1, beta2,
                                                 eps, weight_decay, step),
                     op);
    return rc;
}

int cuda_adamw_update(kdev *d, float *param, const float *grad, float *m, float *v, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      int step)
{
    if (!n)
        return 0;
    return cuda_kc(d, kcuda_adamw_update(cuda_st(d)->k, param, NULL, grad, m, v, n, lr, beta1,
                                         beta2, eps, weight_decay, step),
                   "adamw_update");
}
