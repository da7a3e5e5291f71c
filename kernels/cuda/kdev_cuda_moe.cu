/* kdev_cuda_moe.cu - mixture-of-experts on the device in fp32: router (softmax, top-k,
 * load-balancing loss), the permutation plan, and permute/unpermute of fp32 rows, with the
 * semantics of kernels/cpu/moe.c.
 *
 * Ported rather than taken from kernels/cuda/moe.cu where that one differs: its router
 * computes the probabilities in fp32 (the reference in double, and a top-k choice between
 * nearly equal probabilities may then differ) and keeps a counts[] buffer kdev has not;
 * its permutes move bf16 rows.  Its plan (a stable counting sort, the reference's order
 * exactly) is reused.
 *   router:    one thread per token running the reference's own per-token code
 *              (kernels/moe_route.h): the same probabilities and choices (up to the last
 *              ulp of the device's exp); the
 *              aux loss sums each expert's probabilities over tokens in token order.
 *   permute:   a row copy; its backward adds each token's K rows in increasing row order
 *              (the reference's order, so the same bits) through the inverse of row_src,
 *              built in the scratch.
 *   unpermute: the weighted sum in double in slot order (products of two floats are exact
 *              in double: the same bits); its backward adds w * dout with explicitly
 *              rounded fp32 operations (the reference's bits) and reduces dtopk_w per warp
 *              in double.
 * No floating-point atomics anywhere; results are the same on every run. */
#include "cuda/kdev_cuda_internal.h"
#include "moe_route.h"

#include <limits.h>
#include <math.h>

#define MOE_THREADS 128
#define MOE_PLAN_MAX_E 1024 /* kcuda_moe_plan's limit */

/* ---- router ------------------------------------------------------------------------------ */

__global__ void cuda_moe_router_kernel(int *topk_idx, float *topk_w, float *probs,
                                       const float *logits, int N, int E, int K)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N)
        return;
    moe_route_token(topk_idx + (size_t)t * K, topk_w + (size_t)t * K, probs + (size_t)t * E,
                    logits + (size_t)t * E, E, K);
}

/* Pairs routed to each expert, into shared cnt[E] (integer atomics: exact in any order). */
__device__ void cuda_moe_count(int *cnt, const int *topk_idx, int pairs, int E)
{
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int e = topk_idx[i];
        if (e >= 0 && e < E)
            atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
}

/* One block: aux = E * sum_e (f_e / N) (P_e / N), P_e summed over tokens in order by the
 * thread of expert e, the terms added in expert order by thread 0 (the reference's order). */
__global__ void cuda_moe_aux_kernel(float *aux, const float *probs, const int *topk_idx, int N,
                                    int E, int K)
{
    extern __shared__ double msh[];
    double *term = msh;
    int *cnt = (int *)(msh + E);
    cuda_moe_count(cnt, topk_idx, N * K, E);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        double P = 0;
        for (int t = 0; t < N; t++)
            P += probs[(size_t)t * E + e];
        term[e] = ((double)cnt[e] / N) * (P / N);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double a = 0;
        for (int e = 0; e < E; e++)
            a += term[e];
        *aux = (float)(E * a);
    }
}

/* One block: a[e] = daux * E * (f_e / N) / N, the aux term of dL/dp_e (0 when daux == 0). */
__global__ void cuda_moe_aux_grad_kernel(double *a, float daux, const int *topk_idx, int N,
                                         int E, int K)
{
    extern __shared__ double msh[];
    int *cnt = (int *)msh;
    cuda_moe_count(cnt, topk_idx, N * K, E);
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        a[e] = daux != 0.0f ? (double)daux * E * ((double)cnt[e] / N) / N : 0.0;
}

/* One thread per token: the reference's per-token backward (kernels/moe_route.h). */
__global__ void cuda_moe_router_bwd_kernel(float *dlogits, const float *dtopk_w,
                                           const double *a, const float *probs,
                                           const int *topk_idx, const float *topk_w, int N,
                                           int E, int K)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N)
        return;
    moe_route_token_backward(dlogits + (size_t)t * E, probs + (size_t)t * E,
                             topk_idx + (size_t)t * K, topk_w + (size_t)t * K,
                             dtopk_w ? dtopk_w + (size_t)t * K : NULL, a, E, K);
}

static int cuda_moe_args(kdev *d, const char *op, int N, int E, int K)
{
    if (N < 0 || E <= 0 || K <= 0 || K > E || (long long)N * K > INT_MAX)
        return kdev_fail(d, HERR_ARG, "%s: bad shape N=%d E=%d K=%d (need 1 <= K <= E)", op,
                         N, E, K);
    return 0;
}

int cuda_moe_router_forward(kdev *d, int *topk_idx, float *topk_w, float *probs, float *aux,
                            const float *logits, int N, int E, int K)
{
    static const char op[] = "moe_router_forward";
    int rc = cuda_moe_args(d, op, N, E, K);
    if (rc)
        return rc;
    cudaStream_t st = cuda_stream(d);
    if (N > 0) {
        cuda_moe_router_kernel<<<(N + MOE_THREADS - 1) / MOE_THREADS, MOE_THREADS, 0, st>>>(
            topk_idx, topk_w, probs, logits, N, E, K);
        if ((rc = cuda_launched(d, op)))
            return rc;
    }
    if (!aux)
        return 0;
    if (N == 0) /* the reference's aux of no tokens */
        return cuda_zero(d, aux, sizeof *aux);
    size_t sh = (size_t)E * (sizeof(double) + sizeof(int));
    if (sh > 48u * 1024u)
        return kdev_fail(d, HERR_ARG, "%s: E=%d experts exceed the aux kernel's shared memory",
                         op, E);
    cuda_moe_aux_kernel<<<1, 256, sh, st>>>(aux, probs, topk_idx, N, E, K);
    return cuda_launched(d, op);
}

int cuda_moe_router_backward(kdev *d, float *dlogits, const float *dtopk_w, float daux,
                             const float *probs, const int *topk_idx, const float *topk_w,
                             int N, int E, int K)
{
    static const char op[] = "moe_router_backward";
    int rc = cuda_moe_args(d, op, N, E, K);
    if (rc || N == 0)
        return rc;
    size_t sh = (size_t)E * sizeof(int);
    if (sh > 48u * 1024u)
        return kdev_fail(d, HERR_ARG, "%s: E=%d experts exceed the kernel's shared memory", op,
                         E);
    void *ws;
    if ((rc = cuda_scratch(d, (size_t)E * sizeof(double), &ws, op)))
        return rc;
    double *a = (double *)ws;
    cudaStream_t st = cuda_stream(d);
    cuda_moe_aux_grad_kernel<<<1, 256, sh, st>>>(a, daux, topk_idx, N, E, K);
    if ((rc = cuda_launched(d, op)))
        return rc;
    cuda_moe_router_bwd_kernel<<<(N + MOE_THREADS - 1) / MOE_THREADS, MOE_THREADS, 0, st>>>(
        dlogits, dtopk_w, a, probs, topk_idx, topk_w, N, E, K);
    return cuda_launched(d, op);
}

/* ---- plan ----------------------------------------------------------------------------------- */

int cuda_moe_plan(kdev *d, int *offsets, int *row_src, int *slot_row, const int *topk_idx,
                  int N, int E, int K)
{
    static const char op[] = "moe_plan";
    if (N < 0 || E <= 0 || E > MOE_PLAN_MAX_E || K <= 0 || (long long)N * K > INT_MAX)
        return kdev_fail(d, HERR_ARG, "%s: bad shape N=%d E=%d (<= %d) K=%d", op, N, E,
                         MOE_PLAN_MAX_E, K);
    if (N == 0) /* no pairs: every expert's range is empty */
        return cuda_zero(d, offsets, (size_t)(E + 1) * sizeof(int));
    return cuda_kc(d, kcuda_moe_plan(cuda_st(d)->k, offsets, row_src, slot_row, topk_idx, N, E,
                                     K),
                   op);
}

/* ---- permute ------------------------------------------------------------------------------- */

static int cuda_moe_rows_args(kdev *d, const char *op, int N, int K)
{
    if (N < 0 || K <= 0 || (long long)N * K > INT_MAX)
        return kdev_fail(d, HERR_ARG, "%s: bad shape N=%d K=%d", op, N, K);
    return 0;
}

static int cuda_moe_row_threads(int C)
{
    int t = (C + 31) / 32 * 32;
    return t < MOE_THREADS ? t : MOE_THREADS;
}

/* Block r: out[r, :] = inp[row_src[r] / K, :]. */
__global__ void cuda_moe_permute_kernel(float *out, const float *inp, const int *row_src, int K,
                                        int C)
{
    const float *src = inp + (size_t)(row_src[blockIdx.x] / K) * C;
    float *dst = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dst[c] = src[c];
}

/* inv[row_src[r]] = r: the row of every (token, slot) pair (row_src is a permutation). */
__global__ void cuda_moe_invert_kernel(int *inv, const int *row_src, int rows)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows)
        inv[row_src[r]] = r;
}

/* Each token's K rows in increasing order (insertion sort; K is small). */
__global__ void cuda_moe_sort_rows_kernel(int *inv, int N, int K)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N)
        return;
    int *r = inv + (size_t)t * K;
    for (int i = 1; i < K; i++) {
        int v = r[i], j = i - 1;
        for (; j >= 0 && r[j] > v; j--)
            r[j + 1] = r[j];
        r[j + 1] = v;
    }
}

/* Block t: dinp[t, :] += its K rows of dout, in increasing row order, one add at a time. */
__global__ void cuda_moe_permute_bwd_kernel(float *dinp, const float *dout, const int *rows_of,
                                            int K, int C)
{
    int t = blockIdx.x;
    const int *r = rows_of + (size_t)t * K;
    float *dst = dinp + (size_t)t * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dst[c];
        for (int j = 0; j < K; j++)
            acc += dout[(size_t)r[j] * C + c];
        dst[c] = acc;
    }
}

int cuda_moe_permute_forward(kdev *d, float *out, const float *inp, const int *row_src, int N,
                             int K, int C)
{
    int rc = cuda_moe_rows_args(d, "moe_permute_forward", N, K);
    if (!rc)
        rc = cuda_no_act16(d, "moe_permute_forward", "inp", inp);
    if (rc || N == 0 || C <= 0)
        return rc;
    cuda_moe_permute_kernel<<<N * K, cuda_moe_row_threads(C), 0, cuda_stream(d)>>>(
        out, inp, row_src, K, C);
    return cuda_launched(d, "moe_permute_forward");
}

int cuda_moe_permute_backward(kdev *d, float *dinp, const float *dout, const int *row_src,
                              int N, int K, int C)
{
    static const char op[] = "moe_permute_backward";
    int rc = cuda_moe_rows_args(d, op, N, K);
    if (rc || N == 0 || C <= 0)
        return rc;
    int rows = N * K;
    void *ws;
    if ((rc = cuda_scratch(d, (size_t)rows * sizeof(int), &ws, op)))
        return rc;
    int *inv = (int *)ws;
    cudaStream_t st = cuda_stream(d);
    cuda_moe_invert_kernel<<<(rows + MOE_THREADS - 1) / MOE_THREADS, MOE_THREADS, 0, st>>>(
        inv, row_src, rows);
    if ((rc = cuda_launched(d, op)))
        return rc;
    cuda_moe_sort_rows_kernel<<<(N + MOE_THREADS - 1) / MOE_THREADS, MOE_THREADS, 0, st>>>(
        inv, N, K);
    if ((rc = cuda_launched(d, op)))
        return rc;
    cuda_moe_permute_bwd_kernel<<<N, cuda_moe_row_threads(C), 0, st>>>(dinp, dout, inv, K, C);
    return cuda_launched(d, op);
}

/* ---- unpermute ------------------------------------------------------------------------------ */

/* Block t: out[t, c] = sum_j w[t, j] * expert_out[slot_row[t, j], c], in double, slot order. */
__global__ void cuda_moe_unpermute_kernel(float *out, const float *expert_out,
                                          const float *topk_w, const int *slot_row, int K, int C)
{
    int t = blockIdx.x;
    const float *w = topk_w + (size_t)t * K;
    const int *sr = slot_row + (size_t)t * K;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        double s = 0;
        for (int j = 0; j < K; j++)
            s += (double)w[j] * expert_out[(size_t)sr[j] * C + c];
        out[(size_t)t * C + c] = (float)s;
    }
}

/* Block t: dexpert_out[slot_row[t, j], :] += w[t, j] * dout[t, :] (each expert row belongs
 * to one pair: no two blocks meet), rounded as the reference rounds. */
__global__ void cuda_moe_unpermute_dx_kernel(float *dexpert_out, const float *dout,
                                             const float *topk_w, const int *slot_row, int K,
                                             int C)
{
    int t = blockIdx.x;
    const float *g = dout + (size_t)t * C;
    for (int j = 0; j < K; j++) {
        float w = topk_w[(size_t)t * K + j];
        float *dx = dexpert_out + (size_t)slot_row[(size_t)t * K + j] * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            dx[c] = __fadd_rn(dx[c], __fmul_rn(w, g[c]));
    }
}

/* Warp per pair (t, j): dtopk_w[t, j] += dout[t] . expert_out[slot_row[t, j]] in double. */
__global__ void cuda_moe_unpermute_dw_kernel(float *dtopk_w, const float *dout,
                                             const float *expert_out, const int *slot_row,
                                             int pairs, int K, int C)
{
    int pair = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (pair >= pairs)
        return; /* warp-uniform */
    const float *g = dout + (size_t)(pair / K) * C;
    const float *x = expert_out + (size_t)slot_row[pair] * C;
    double s = 0;
    for (int c = lane; c < C; c += 32)
        s += (double)g[c] * x[c];
    s = cuda_warp_sum_d(s);
    if (lane == 0)
        dtopk_w[pair] += (float)s;
}

int cuda_moe_unpermute_forward(kdev *d, float *out, const float *expert_out,
                               const float *topk_w, const int *slot_row, int N, int K, int C)
{
    int rc = cuda_moe_rows_args(d, "moe_unpermute_forward", N, K);
    if (rc || N == 0 || C <= 0)
        return rc;
    cuda_moe_unpermute_kernel<<<N, cuda_moe_row_threads(C), 0, cuda_stream(d)>>>(
        out, expert_out, topk_w, slot_row, K, C);
    return cuda_launched(d, "moe_unpermute_forward");
}

int cuda_moe_unpermute_backward(kdev *d, float *dexpert_out, float *dtopk_w, const float *dout,
                                const float *expert_out, const float *topk_w,
                                const int *slot_row, int N, int K, int C)
{
    static const char op[] = "moe_unpermute_backward";
    int rc = cuda_moe_rows_args(d, op, N, K);
    if (rc || N == 0 || C <= 0)
        return rc;
    cudaStream_t st = cuda_stream(d);
    if (dexpert_out) {
        cuda_moe_unpermute_dx_kernel<<<N, cuda_moe_row_threads(C), 0, st>>>(
            dexpert_out, dout, topk_w, slot_row, K, C);
        if ((rc = cuda_launched(d, op)))
            return rc;
    }
    if (dtopk_w) {
        int pairs = N * K, warps = MOE_THREADS / 32;
        cuda_moe_unpermute_dw_kernel<<<(pairs + warps - 1) / warps, MOE_THREADS, 0, st>>>(
            dtopk_w, dout, expert_out, slot_row, pairs, K, C);
        if ((rc = cuda_launched(d, op)))
            return rc;
    }
    return 0;
}
