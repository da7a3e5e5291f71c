/* kdev_cuda_ops.cu - the row ops, the elementwise ops (add, accumulate, scale, fill), and
 * the ops whose kcuda fp32 kernel has exactly the kernels.h semantics (matmul, norms,
 * RoPE, SwiGLU, GELU, embedding forward), called through the device's kcuda context.
 *
 * Empty shapes are no-ops, as in the cpu backend (the kcuda kernels refuse them).  The
 * embedding backward is written here: kdev's skips ids < 0, which kcuda's does not. */
#include "cuda/kdev_cuda_internal.h"

#include <cub/device/device_radix_sort.cuh>

#define THREADS 256

/* Threads for one row of C floats: a multiple of 32 up to THREADS. */
static int row_threads(int C)
{
    int t = (C + 31) / 32 * 32;
    return t < THREADS ? (t > 0 ? t : 32) : THREADS;
}

/* ---- rows ------------------------------------------------------------------------------ */

/* Block r: row r of dst from row idx[r] of src, or zeros for idx[r] < 0. */
__global__ void cuda_gather_kernel(float *dst, const float *src, const int *idx, int C)
{
    int i = idx[blockIdx.x];
    float *o = dst + (size_t)blockIdx.x * C;
    const float *in = i >= 0 ? src + (size_t)i * C : NULL;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = in ? in[c] : 0.0f;
}

/* Block r: row idx[r] of dst from row r of src (the targets are distinct: no conflicts). */
__global__ void cuda_scatter_kernel(float *dst, const float *src, const int *idx, int C)
{
    int i = idx[blockIdx.x];
    if (i < 0)
        return;
    float *o = dst + (size_t)i * C;
    const float *in = src + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = in[c];
}

__global__ void cuda_add_bias_kernel(float *x, const float *bias, size_t n, int C)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] += bias[i % (size_t)C];
}

int cuda_gather_rows(kdev *d, float *dst, const float *src, const int *idx, int n, int C)
{
    if (n <= 0 || C <= 0)
        return 0;
    if (int rc = cuda_no_act16(d, "gather_rows", "src", src))
        return rc;
    cuda_gather_kernel<<<n, row_threads(C), 0, cuda_stream(d)>>>(dst, src, idx, C);
    return cuda_launched(d, "gather_rows");
}

int cuda_scatter_rows(kdev *d, float *dst, const float *src, const int *idx, int n, int C)
{
    if (n <= 0 || C <= 0)
        return 0;
    cuda_scatter_kernel<<<n, row_threads(C), 0, cuda_stream(d)>>>(dst, src, idx, C);
    return cuda_launched(d, "scatter_rows");
}

int cuda_add_bias(kdev *d, float *x, const float *bias, int n, int C)
{
    if (n <= 0 || C <= 0)
        return 0;
    size_t total = (size_t)n * (size_t)C;
    cuda_add_bias_kernel<<<cuda_blocks(total, THREADS), THREADS, 0, cuda_stream(d)>>>(
        x, bias, total, C);
    return cuda_launched(d, "add_bias");
}

/* ---- elementwise: one fp32 operation per element, the bits of the cpu backend's ------- */

__global__ void cuda_add_kernel(float *out, const float *a, const float *b, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = a[i] + b[i];
}

__global__ void cuda_fill_kernel(float *x, size_t n, float value)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = value;
}

__global__ void cuda_scale_kernel(float *x, size_t n, float s)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] *= s;
}

int cuda_add(kdev *d, float *out, const float *a, const float *b, size_t n)
{
    if (!n)
        return 0;
    int rc = cuda_no_act16(d, "add", "out", out);
    if (!rc)
        rc = cuda_no_act16(d, "add", "a", a);
    if (!rc)
        rc = cuda_no_act16(d, "add", "b", b);
    if (rc)
        return rc;
    cuda_add_kernel<<<cuda_blocks(n, THREADS), THREADS, 0, cuda_stream(d)>>>(out, a, b, n);
    return cuda_launched(d, "add");
}

int cuda_accumulate(kdev *d, float *dst, const float *src, size_t n)
{
    if (!n)
        return 0;
    cuda_add_kernel<<<cuda_blocks(n, THREADS), THREADS, 0, cuda_stream(d)>>>(dst, dst, src, n);
    return cuda_launched(d, "accumulate");
}

int cuda_fill(kdev *d, float *x, size_t n, float value)
{
    if (!n)
        return 0;
    cuda_fill_kernel<<<cuda_blocks(n, THREADS), THREADS, 0, cuda_stream(d)>>>(x, n, value);
    return cuda_launched(d, "fill");
}

int cuda_scale(kdev *d, float *x, size_t n, float s)
{
    if (!n)
        return 0;
    cuda_scale_kernel<<<cuda_blocks(n, THREADS), THREADS, 0, cuda_stream(d)>>>(x, n, s);
    return cuda_launched(d, "scale");
}

/* ---- matmul (cuBLASLt through kcuda, fp32 without TF32) ----------------------------- */

/* dbias[j] += sum over rows of dout[:, j], one thread per column, rows in order (used
 * where kcuda is not called: K == 0). */
__global__ void cuda_dbias_kernel(float *dbias, const float *dout, int M, int N)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N)
        return;
    double s = 0;
    for (int i = 0; i < M; i++)
        s += dout[(size_t)i * N + j];
    dbias[j] += (float)s;
}

/* The forward into fp32 memory, or into bf16 activation memory where the bf16 GEMM
 * writes it (kdev_cuda_gemm16.cu); HERR_NOALGO for such an out elsewhere.  res (fp32
 * out only): added in the bf16 GEMM's epilogue, after the fp32 GEMM by a pass. */
static int forward(kdev *d, float *out, const float *inp, const float *weight,
                   const float *bias, const float *res, int M, int K, int N)
{
    if (cuda_st(d)->prec == KDEV_PREC_BF16) {
        int rc = cuda_matmul16_forward(d, out, inp, weight, bias, res, M, K, N);
        if (rc != HERR_NOALGO || cuda_act16(d, out))   /* fp32 operands below */
            return rc;
    }
    float *x = NULL;   /* an fp32 copy of inp where it is bf16 activation memory */
    int rc = cuda_act_f32(d, &x, inp, (size_t)M * K, "matmul_forward");
    if (!rc)
        rc = cuda_kc(d, kcuda_matmul_forward_f32(cuda_st(d)->k, out, x ? x : inp, weight, bias,
                                                 M, K, N),
                     "matmul_forward");
    if (!rc && res)
        rc = cuda_add(d, out, res, out, (size_t)M * N);
    return cuda_act_f32_free(d, x, rc);
}

int cuda_matmul_forward(kdev *d, float *out, const float *inp, const float *weight,
                        const float *bias, const float *res, int M, int K, int N)
{
    if (M <= 0 || N <= 0)
        return 0;
    if (res) {   /* the sum is fp32 */
        if (int rc = cuda_no_act16(d, "matmul_forward", "out", out))
            return rc;
        if (int rc = cuda_no_act16(d, "matmul_forward", "res", res))
            return rc;
    }
    if (K <= 0) { /* an empty product: out = bias (or 0) */
        if (int rc = cuda_no_act16(d, "matmul_forward", "out", out))
            return rc;
        int rc = cuda_zero(d, out, (size_t)M * N * sizeof(float));
        if (!rc && bias)
            rc = cuda_add_bias(d, out, bias, M, N);
        return rc || !res ? rc : cuda_add(d, out, res, out, (size_t)M * N);
    }
    int rc = forward(d, out, inp, weight, bias, res, M, K, N);
    if (rc != HERR_NOALGO)
        return rc;
    /* out in bf16 activation memory that no bf16 GEMM writes: an fp32 copy, rounded */
    float *t = NULL;
    size_t n = (size_t)M * N;
    rc = cuda_err(d, cudaMallocAsync((void **)&t, n * sizeof(float), cuda_stream(d)),
                  "matmul_forward");
    if (!rc)
        rc = forward(d, t, inp, weight, bias, NULL, M, K, N);
    if (!rc)
        rc = cuda_to_bf16(d, (kcuda_bf16 *)out, t, n, "matmul_forward");
    return cuda_act_f32_free(d, t, rc);
}

/* The backward with dinp in fp32 memory, or in bf16 activation memory where the bf16
 * GEMM writes it (kdev_cuda_gemm16.cu); HERR_NOALGO for such a dinp elsewhere. */
static int backward(kdev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                    const float *inp, const float *weight, int M, int K, int N, int set)
{
    int rc;
    if (cuda_st(d)->prec == KDEV_PREC_BF16) {
        /* HERR_NOALGO comes before anything is added: safe to redo in fp32 operands */
        rc = cuda_matmul16_backward(d, dinp, dweight, dbias, dout, inp, weight, M, K, N, set);
        if (rc != HERR_NOALGO || cuda_act16(d, dinp))
            return rc;
    }
    /* the fp32 GEMMs accumulate: a dinp to be set is zeroed first */
    if (set && dinp) {
        rc = cuda_err(d, cudaMemsetAsync(dinp, 0, (size_t)M * K * sizeof(float), cuda_stream(d)),
                      "matmul_backward");
        if (rc)
            return rc;
    }
    /* fp32 copies of inp and dout where they are bf16 activation memory */
    float *x = NULL, *g = NULL;
    rc = dweight ? cuda_act_f32(d, &x, inp, (size_t)M * K, "matmul_backward") : 0;
    if (!rc)
        rc = cuda_act_f32(d, &g, dout, (size_t)M * N, "matmul_backward");
    if (!rc)
        rc = cuda_kc(d, kcuda_matmul_backward_f32(cuda_st(d)->k, dinp, dweight, dbias,
                                                  g ? g : dout, x ? x : inp, weight, M, K, N),
                     "matmul_backward");
    return cuda_act_f32_free(d, g, cuda_act_f32_free(d, x, rc));
}

int cuda_matmul_backward(kdev *d, float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int M, int K, int N, int set)
{
    if (M <= 0 || N <= 0)
        return 0;
    if (K <= 0) {
        if (!dbias)
            return 0;
        if (int rc = cuda_no_act16(d, "matmul_backward", "dout", dout))
            return rc;
        cuda_dbias_kernel<<<(N + THREADS - 1) / THREADS, THREADS, 0, cuda_stream(d)>>>(
            dbias, dout, M, N);
        return cuda_launched(d, "matmul_backward: dbias");
    }
    if (!dinp && !dweight && !dbias)
        return 0;
    int rc = backward(d, dinp, dweight, dbias, dout, inp, weight, M, K, N, set);
    if (rc != HERR_NOALGO)
        return rc;
    /* dinp in bf16 activation memory that no bf16 GEMM writes (padded shapes): through an
     * fp32 copy (its values first when they are added to), rounded back */
    float *t = NULL;
    size_t n = (size_t)M * K;
    if (set)
        rc = cuda_err(d, cudaMallocAsync((void **)&t, n * sizeof(float), cuda_stream(d)),
                      "matmul_backward");
    else
        rc = cuda_act_f32(d, &t, dinp, n, "matmul_backward");
    if (!rc)
        rc = backward(d, t, dweight, dbias, dout, inp, weight, M, K, N, set);
    if (!rc)
        rc = cuda_to_bf16(d, (kcuda_bf16 *)dinp, t, n, "matmul_backward");
    return cuda_act_f32_free(d, t, rc);
}

/* ---- embedding ------------------------------------------------------------------------ */

int cuda_embedding_forward(kdev *d, float *out, const int *ids, const float *table, int N,
                           int C)
{
    if (N <= 0 || C <= 0)
        return 0;
    return cuda_kc(d, kcuda_embedding_forward_f32(cuda_st(d)->k, out, ids, table, N, C),
                   "embedding_forward");
}

__global__ void cuda_iota_kernel(int *v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = i;
}

/* Block (j, column tile): when sorted position j starts the run of an id >= 0, adds that
 * run's dout rows into the id's row, tokens in order, one add per token starting from the
 * old value: kcpu_embedding_backward's exact order, so the same bits.  Runs of ids < 0
 * (they sort first) contribute nothing. */
__global__ void cuda_embedding_bwd_kernel(float *dtable, const float *dout,
                                          const int *sorted_ids, const int *sorted_tok, int N,
                                          int C)
{
    int j = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    int id = sorted_ids[j];
    if (id < 0 || (j > 0 && sorted_ids[j - 1] == id) || c >= C)
        return;
    float *dst = dtable + (size_t)id * C + c;
    float acc = *dst;
    for (int k = j; k < N && sorted_ids[k] == id; k++)
        acc += dout[(size_t)sorted_tok[k] * C + c];
    *dst = acc;
}

int cuda_embedding_backward(kdev *d, float *dtable, const float *dout, const int *ids, int N,
                            int C)
{
    static const char op[] = "embedding_backward";
    if (N <= 0 || C <= 0)
        return 0;
    cudaStream_t st = cuda_stream(d);
    /* scratch: sorted ids | token numbers | sorted tokens | the sort's own scratch */
    size_t arr = cuda_align256((size_t)N * sizeof(int)), sort_bytes = 0;
    int rc = cuda_err(d, cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, ids, (int *)NULL,
                                                         (const int *)NULL, (int *)NULL, N, 0,
                                                         32, st),
                      "embedding_backward: sort size");
    void *ws;
    if (rc || (rc = cuda_scratch(d, 3 * arr + sort_bytes, &ws, op)))
        return rc;
    char *b = (char *)ws;
    int *sorted_ids = (int *)b, *tok = (int *)(b + arr), *sorted_tok = (int *)(b + 2 * arr);
    cuda_iota_kernel<<<(N + THREADS - 1) / THREADS, THREADS, 0, st>>>(tok, N);
    if ((rc = cuda_launched(d, "embedding_backward: iota")))
        return rc;
    /* stable: the tokens of one id keep their order; signed keys sort correctly */
    rc = cuda_err(d, cub::DeviceRadixSort::SortPairs(b + 3 * arr, sort_bytes, ids, sorted_ids,
                                                     (const int *)tok, sorted_tok, N, 0, 32,
                                                     st),
                  "embedding_backward: sort");
    if (rc)
        return rc;
    int threads = row_threads(C);
    dim3 grid((unsigned)N, (unsigned)((C + threads - 1) / threads));
    cuda_embedding_bwd_kernel<<<grid, threads, 0, st>>>(dtable, dout, sorted_ids, sorted_tok,
                                                        N, C);
    return cuda_launched(d, op);
}

/* ---- norms, RoPE, activations: the kcuda fp32 kernels ---------------------------------
 * Their semantics are kernels.h's: forward statistics may be NULL (LayerNorm) or are
 * written, backward gradients are added, NULL gradients skipped; the arithmetic is fp32
 * where the reference uses double (differences of a few ulps). */

int cuda_rmsnorm_forward(kdev *d, float *out, float *rstd, const float *inp,
                         const float *weight, int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return 0;
    if (int rc = cuda_no_act16(d, "rmsnorm_forward", "inp", inp))
        return rc;
    if (cuda_act16(d, out))
        return cuda_kc(d, kcuda_rmsnorm_forward_f32_bf16out(cuda_st(d)->k, (kcuda_bf16 *)out, rstd,
                                                            inp, weight, N, C, eps),
                       "rmsnorm_forward");
    return cuda_kc(d, kcuda_rmsnorm_forward_f32(cuda_st(d)->k, out, rstd, inp, weight, N, C,
                                                eps),
                   "rmsnorm_forward");
}

int cuda_rmsnorm_backward(kdev *d, float *dinp, float *dweight, const float *dout,
                          const float *inp, const float *weight, const float *rstd, int N,
                          int C)
{
    if (N <= 0 || C <= 0 || (!dinp && !dweight))
        return 0;
    int rc = cuda_no_act16(d, "rmsnorm_backward", "inp", inp);
    if (!rc)
        rc = cuda_no_act16(d, "rmsnorm_backward", "dout", dout);
    if (rc)
        return rc;
    return cuda_kc(d, kcuda_rmsnorm_backward_f32(cuda_st(d)->k, dinp, dweight, dout, inp,
                                                 weight, rstd, N, C),
                   "rmsnorm_backward");
}

int cuda_layernorm_forward(kdev *d, float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return 0;
    if (int rc = cuda_no_act16(d, "layernorm_forward", "inp", inp))
        return rc;
    if (cuda_act16(d, out))
        return cuda_kc(d, kcuda_layernorm_forward_f32_bf16out(cuda_st(d)->k, (kcuda_bf16 *)out,
                                                              mean, rstd, inp, weight, bias, N,
                                                              C, eps),
                       "layernorm_forward");
    return cuda_kc(d, kcuda_layernorm_forward_f32(cuda_st(d)->k, out, mean, rstd, inp, weight,
                                                  bias, N, C, eps),
                   "layernorm_forward");
}

int cuda_layernorm_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            const float *mean, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || (!dinp && !dweight && !dbias))
        return 0;
    int rc = cuda_no_act16(d, "layernorm_backward", "inp", inp);
    if (!rc)
        rc = cuda_no_act16(d, "layernorm_backward", "dout", dout);
    if (rc)
        return rc;
    return cuda_kc(d, kcuda_layernorm_backward_f32(cuda_st(d)->k, dinp, dweight, dbias, dout,
                                                   inp, weight, mean, rstd, N, C),
                   "layernorm_backward");
}

int cuda_rope_forward(kdev *d, float *x, const float *cos, const float *sin, int N, int H,
                      int D)
{
    if (N <= 0 || H <= 0 || D <= 1)
        return 0;
    if (cuda_act16(d, x))
        return cuda_kc(d, kcuda_rope_forward_bf16(cuda_st(d)->k, (kcuda_bf16 *)x, cos, sin, N, H,
                                                  D),
                       "rope_forward");
    return cuda_kc(d, kcuda_rope_forward_f32(cuda_st(d)->k, x, cos, sin, N, H, D),
                   "rope_forward");
}

int cuda_rope_backward(kdev *d, float *dx, const float *cos, const float *sin, int N, int H,
                       int D)
{
    if (N <= 0 || H <= 0 || D <= 1)
        return 0;
    if (cuda_act16(d, dx))
        return cuda_kc(d, kcuda_rope_backward_bf16(cuda_st(d)->k, (kcuda_bf16 *)dx, cos, sin, N,
                                                   H, D),
                       "rope_backward");
    return cuda_kc(d, kcuda_rope_backward_f32(cuda_st(d)->k, dx, cos, sin, N, H, D),
                   "rope_backward");
}

/* An activation's input in bf16 activation memory goes with its other tensors there too
 * (the all-bf16 kernels): 1 when inp lies there and a, b too, 0 when inp does not,
 * HERR_ARG when only inp does. */
static int all_act16(kdev *d, const char *op, const float *inp, const float *a,
                     const float *b)
{
    if (!cuda_act16(d, inp))
        return 0;
    if (cuda_act16(d, a) && cuda_act16(d, b))
        return 1;
    return kdev_fail(d, HERR_ARG, "%s: inp lies in bf16 activation memory but not every "
                     "other tensor does", op);
}

int cuda_swiglu_forward(kdev *d, float *out, const float *inp, int N, int F)
{
    if (N <= 0 || F <= 0)
        return 0;
    if (int rc = all_act16(d, "swiglu_forward", inp, out, out))
        return rc > 0 ? cuda_kc(d, kcuda_swiglu_forward_bf16(cuda_st(d)->k, (kcuda_bf16 *)out,
                                                             (const kcuda_bf16 *)inp, N, F),
                                "swiglu_forward")
                      : rc;
    if (cuda_act16(d, out))
        return cuda_kc(d, kcuda_swiglu_forward_f32_bf16out(cuda_st(d)->k, (kcuda_bf16 *)out, inp,
                                                           N, F),
                       "swiglu_forward");
    return cuda_kc(d, kcuda_swiglu_forward_f32(cuda_st(d)->k, out, inp, N, F),
                   "swiglu_forward");
}

int cuda_swiglu_backward(kdev *d, float *dinp, const float *dout, const float *inp, int N,
                         int F, int set)
{
    if (N <= 0 || F <= 0)
        return 0;
    if (int rc = all_act16(d, "swiglu_backward", inp, dinp, dout))
        return rc > 0 ? cuda_kc(d, kcuda_swiglu_backward_bf16(cuda_st(d)->k, (kcuda_bf16 *)dinp,
                                                              (const kcuda_bf16 *)dout,
                                                              (const kcuda_bf16 *)inp, N, F,
                                                              !set),
                                "swiglu_backward")
                      : rc;
    return cuda_kc(d, kcuda_swiglu_backward_f32in(cuda_st(d)->k, dinp, cuda_act16(d, dinp), dout,
                                                  cuda_act16(d, dout), inp, N, F, !set),
                   "swiglu_backward");
}

int cuda_gelu_forward(kdev *d, float *out, const float *inp, size_t n, kgelu_kind kind)
{
    if (!n)
        return 0;
    if (int rc = all_act16(d, "gelu_forward", inp, out, out))
        return rc > 0 ? cuda_kc(d, kcuda_gelu_forward_bf16(cuda_st(d)->k, (kcuda_bf16 *)out,
                                                           (const kcuda_bf16 *)inp, n,
                                                           (int)kind),
                                "gelu_forward")
                      : rc;
    if (cuda_act16(d, out))
        return cuda_kc(d, kcuda_gelu_forward_f32_bf16out(cuda_st(d)->k, (kcuda_bf16 *)out, inp, n,
                                                         (int)kind),
                       "gelu_forward");
    return cuda_kc(d, kcuda_gelu_forward_f32(cuda_st(d)->k, out, inp, n, (int)kind),
                   "gelu_forward");
}

int cuda_gelu_backward(kdev *d, float *dinp, const float *dout, const float *inp, size_t n,
                       kgelu_kind kind, int set)
{
    if (!n)
        return 0;
    if (int rc = all_act16(d, "gelu_backward", inp, dinp, dout))
        return rc > 0 ? cuda_kc(d, kcuda_gelu_backward_bf16(cuda_st(d)->k, (kcuda_bf16 *)dinp,
                                                            (const kcuda_bf16 *)dout,
                                                            (const kcuda_bf16 *)inp, n,
                                                            (int)kind, !set),
                                "gelu_backward")
                      : rc;
    return cuda_kc(d, kcuda_gelu_backward_f32in(cuda_st(d)->k, dinp, cuda_act16(d, dinp), dout,
                                                cuda_act16(d, dout), inp, n, (int)kind, !set),
                   "gelu_backward");
}
