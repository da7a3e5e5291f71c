/* norm_backward.cu - the LayerNorm and RMSNorm backward in one pass over the rows
 * (kcuda_internal.h: kcuda_norm_backward_*), bf16 or fp32 storage, fp32 arithmetic.
 *
 * With xhat = (x - mean) r (RMSNorm: mean 0) and g = dy w:
 *   dx    += r (g - mean(g) - xhat mean(g xhat))      (RMSNorm: no mean(g) term)
 *   dw    += sum over rows of dy xhat,   db += sum over rows of dy
 * A fixed grid of blocks walks the rows (block b: rows b, b + grid, ...), one row at a
 * time: the block reads the row's x and dy once for both the row reductions and its
 * threads' column sums, which stay in registers (each thread owns the same columns in
 * every row).  At the end each block writes its column sums to the context workspace,
 * and one thread per column adds the blocks' sums in block order (double).  The grid
 * depends only on N, C and the workspace size: the same bits on every call, with or
 * without dx.  Reading x and dy once is what this is for: the separate row and column
 * kernels it replaces read them twice, the column one a row at a time per thread. */
#include "cuda/kcuda_internal.h"

/* Most blocks a call uses: enough to fill an H100 several times over at 256 threads. */
#define NB_MAX_BLOCKS 1024
/* Most W-element groups a thread owns in a row (the kernel's register arrays). */
#define NB_MAX_SLOTS 8

template <typename T, int W, int S, bool CENTER>
__global__ void norm_bwd_kernel(T *dinp, float *pw, float *pb, const T *dout, const T *inp,
                                const T *weight, const float *mean, const float *rstd, int N,
                                int C)
{
    float aw[S][W], ab[S][W];
#pragma unroll
    for (int s = 0; s < S; s++)
#pragma unroll
        for (int j = 0; j < W; j++)
            aw[s][j] = ab[s][j] = 0.0f;
    for (int i = blockIdx.x; i < N; i += gridDim.x) {
        size_t off = (size_t)i * C;
        float mu = CENTER ? mean[i] : 0.0f, r = rstd[i], sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int s = 0; s < S; s++) {
            int c = (threadIdx.x + s * blockDim.x) * W;
            if (c < C) {
                float a[W], g[W], w[W];
                kcuda_ldw<W>(a, inp + off + c);
                kcuda_ldw<W>(g, dout + off + c);
                kcuda_ldw<W>(w, weight + c);
#pragma unroll
                for (int j = 0; j < W; j++) {
                    float xh = (a[j] - mu) * r, gj = g[j] * w[j];
                    sg += gj;
                    sgx += gj * xh;
                    aw[s][j] += g[j] * xh;
                    ab[s][j] += g[j];
                }
            }
        }
        if (!dinp) /* the same for the whole block: no thread waits below alone */
            continue;
        sg = CENTER ? kcuda_block_sum(sg) / (float)C : 0.0f;
        sgx = kcuda_block_sum(sgx) / (float)C;
#pragma unroll
        for (int s = 0; s < S; s++) {
            int c = (threadIdx.x + s * blockDim.x) * W;
            if (c < C) { /* the row again, from L1/L2: this thread just read it */
                float a[W], g[W], w[W], d[W];
                kcuda_ldw<W>(a, inp + off + c);
                kcuda_ldw<W>(g, dout + off + c);
                kcuda_ldw<W>(w, weight + c);
                kcuda_ldw<W>(d, dinp + off + c);
#pragma unroll
                for (int j = 0; j < W; j++)
                    d[j] += r * (g[j] * w[j] - sg - (a[j] - mu) * r * sgx);
                kcuda_stw<W>(dinp + off + c, d);
            }
        }
    }
    if (!pw)
        return;
#pragma unroll
    for (int s = 0; s < S; s++) {
        int c = (threadIdx.x + s * blockDim.x) * W;
        if (c < C)
#pragma unroll
            for (int j = 0; j < W; j++) {
                pw[(size_t)blockIdx.x * C + c + j] = aw[s][j];
                if (pb)
                    pb[(size_t)blockIdx.x * C + c + j] = ab[s][j];
            }
    }
}

/* dweight[c] += the blocks' sums of column c in block order (dbias likewise). */
__global__ void norm_bwd_cols_kernel(float *dweight, float *dbias, const float *pw,
                                     const float *pb, int blocks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double sw = 0.0, sb = 0.0;
    for (int b = 0; b < blocks; b++) {
        sw += pw[(size_t)b * C + c];
        if (pb)
            sb += pb[(size_t)b * C + c];
    }
    if (dweight)
        dweight[c] += (float)sw;
    if (dbias)
        dbias[c] += (float)sb;
}

template <typename T, int W, bool CENTER>
static void launch(kcuda_ctx *ctx, int blocks, int threads, int slots, T *dinp, float *pw,
                   float *pb, const T *dout, const T *inp, const T *weight, const float *mean,
                   const float *rstd, int N, int C)
{
#define NB_LAUNCH(S)                                                                          \
    norm_bwd_kernel<T, W, S, CENTER><<<blocks, threads, 0, ctx->stream>>>(                    \
        dinp, pw, pb, dout, inp, weight, mean, rstd, N, C)
    if (slots <= 1)
        NB_LAUNCH(1);
    else if (slots <= 2)
        NB_LAUNCH(2);
    else if (slots <= 4)
        NB_LAUNCH(4);
    else
        NB_LAUNCH(8);
#undef NB_LAUNCH
}

template <typename T>
static int norm_bwd(kcuda_ctx *ctx, T *dinp, float *dweight, float *dbias, const T *dout,
                    const T *inp, const T *weight, const float *mean, const float *rstd, int N,
                    int C, const char *fn)
{
    if (N <= 0 || C <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bad shape N=%d C=%d", fn, N, C);
    if (!dout || !inp || !weight || !rstd)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: NULL tensor", fn);
    const bool vec = kcuda_vec_ok<T>(C, dinp, dout, inp, weight);
    const int W = vec ? kcuda_vec<T>::n : 1, groups = C / W;
    /* one thread per group up to 256 (a multiple of 32, as kcuda_block_sum needs), more
     * only where a thread would otherwise own more than NB_MAX_SLOTS groups */
    int threads = (groups + 31) / 32 * 32;
    if (threads > 256)
        threads = 256;
    if (groups > threads * NB_MAX_SLOTS)
        threads = (groups + 32 * NB_MAX_SLOTS - 1) / (32 * NB_MAX_SLOTS) * 32;
    if (threads > 1024)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: rows of %d elements are too wide", fn, C);
    int slots = (groups + threads - 1) / threads;
    /* the blocks' column sums (the weight's, then the bias's where there is one): as
     * many blocks as the workspace holds sums for */
    int sums = dbias ? 2 : dweight ? 1 : 0;
    if (!sums && !dinp)
        return KCUDA_OK;
    size_t per_block = sizeof(float) * (size_t)C * (size_t)(sums ? sums : 1);
    size_t fit = ctx->workspace_bytes / per_block;
    int blocks = N < NB_MAX_BLOCKS ? N : NB_MAX_BLOCKS;
    if (sums && (size_t)blocks > fit)
        blocks = (int)fit;
    if (blocks < 1)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: %zu bytes of workspace hold no column sums "
                          "of %d elements", fn, ctx->workspace_bytes, C);
    float *pw = NULL, *pb = NULL;
    if (sums) {
        pw = (float *)ctx->workspace;
        pb = dbias ? pw + (size_t)blocks * C : NULL;
    }
    if (vec && mean)
        launch<T, kcuda_vec<T>::n, true>(ctx, blocks, threads, slots, dinp, pw, pb, dout, inp,
                                         weight, mean, rstd, N, C);
    else if (vec)
        launch<T, kcuda_vec<T>::n, false>(ctx, blocks, threads, slots, dinp, pw, pb, dout,
                                          inp, weight, mean, rstd, N, C);
    else if (mean)
        launch<T, 1, true>(ctx, blocks, threads, slots, dinp, pw, pb, dout, inp, weight, mean,
                           rstd, N, C);
    else
        launch<T, 1, false>(ctx, blocks, threads, slots, dinp, pw, pb, dout, inp, weight,
                            mean, rstd, N, C);
    int rc = kcuda_check_launch(ctx, "norm_bwd_kernel");
    if (rc < 0 || !sums)
        return rc;
    norm_bwd_cols_kernel<<<(C + 255) / 256, 256, 0, ctx->stream>>>(dweight, dbias, pw, pb,
                                                                    blocks, C);
    return kcuda_check_launch(ctx, "norm_bwd_cols_kernel");
}

typedef __nv_bfloat16 bf;

int kcuda_norm_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            const float *mean, const float *rstd, int N, int C, const char *fn)
{
    return norm_bwd<float>(ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, fn);
}

int kcuda_norm_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, float *dweight, float *dbias,
                             const kcuda_bf16 *dout, const kcuda_bf16 *inp,
                             const kcuda_bf16 *weight, const float *mean, const float *rstd,
                             int N, int C, const char *fn)
{
    return norm_bwd<bf>(ctx, (bf *)dinp, dweight, dbias, (const bf *)dout, (const bf *)inp,
                        (const bf *)weight, mean, rstd, N, C, fn);
}
