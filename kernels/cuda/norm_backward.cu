/* norm_backward.cu - the LayerNorm and RMSNorm backward in one pass over the rows
 * (kcuda_internal.h: kcuda_norm_backward_*), bf16 or fp32 storage, fp32 arithmetic.
 *
 * With xhat = (x - mean) r (RMSNorm: mean 0) and g = dy w:
 *   dx    += r (g - mean(g) - xhat mean(g xhat))      (RMSNorm: no mean(g) term)
 *   dw    += sum over rows of dy xhat,   db += sum over rows of dy
 * x and dy are read once for both the row reductions and the column sums, which stay in
 * registers (a thread owns the same columns in every row it takes).
 *
 * Rows of up to 1024 elements with 16-byte access (512 with scalar access: odd C) take
 * norm_bwd_rows_kernel, which is every model width up to GPT-2 medium and the head-dim
 * norms: L lanes of a warp per row (32; fewer for narrow rows, so that a warp has
 * several rows in flight), the row held in registers from its loads to its dx, its
 * reductions warp shuffles: no block barrier in the row loop.  The kernel's segments of
 * L lanes take rows seg, seg + segments, ...; at the end a block adds its segments'
 * column sums in segment order through shared memory.  Wider rows take
 * norm_bwd_wide_kernel: a block per row, the row reductions block-wide.
 *
 * Each block writes its column sums to the context workspace, and norm_bwd_cols_kernel
 * adds the blocks' sums (double), many threads per column: thread row y of a block of
 * 32 columns adds a fixed range of blocks, then the rows' totals are added in row order.
 * The grid depends only on N, C and the workspace size, and every sum has a fixed order:
 * the same bits on every call, with or without dx (no float atomics anywhere). */
#include "cuda/kcuda_internal.h"

/* ---- rows of up to 32 lanes x nb_max_k groups: norm_bwd_rows_kernel ---- */

/* Warps per block.  Small blocks: the register file of an SM then holds a whole number
 * of them with little left over. */
#define NB_WARPS 4
/* Most elements a lane owns in a row: its share of the row and its column sums (2 x 2
 * floats per element) are most of the kernel's registers. */
#define NB_LANE_ELEMS 32
/* Elements per lane up to which a narrow row is spread over fewer lanes (more rows per
 * warp at a time: more bytes in flight per warp, shorter shuffle trees). */
#define NB_LANE_TARGET 16
/* The grid is sized for this many SMs (H100/H200 SXM: 132), so that all its blocks are
 * resident at once: no second wave of blocks, whose rows would finish late. */
#define NB_SMS 128

/* Blocks per SM the row kernel is built for: at most 128 registers per thread (4 blocks
 * of 128 threads) up to 24 elements per lane (C = 768 in fp32: 6 groups of 4), which
 * ptxas fits without spilling; 168 (3 blocks) above. */
__host__ __device__ constexpr int nb_rows_min_blocks(int elems)
{
    return elems <= 24 ? 4 : 3;
}

/* The most groups per lane of a kernel with 32 lanes per row (full) or fewer.  Full:
 * NB_LANE_ELEMS elements, but 16 with scalar access (odd C; 32 spill there, and such
 * rows are rare enough for the wide kernel).  Fewer: NB_LANE_TARGET elements, as a row
 * is split over fewer lanes only while it fits those; 1 for scalar access (split only
 * where the row fits in half the lanes). */
__host__ __device__ constexpr int nb_max_k(int W, bool full)
{
    return W == 1 ? (full ? 16 : 1) : (full ? NB_LANE_ELEMS : NB_LANE_TARGET) / W;
}

/* The next K instantiated above K: every one with 16-byte access (a handful), powers of
 * 2 with scalar access (odd C), where K goes up to 16. */
__host__ __device__ constexpr int nb_next_k(int W, int K)
{
    return W == 1 ? 2 * K : K + 1;
}

/* W floats from shared memory (16-byte aligned where W > 1). */
template <int W>
__device__ __forceinline__ void nb_lds(float *f, const float *p)
{
    if constexpr (W == 1)
        f[0] = p[0];
    else
#pragma unroll
        for (int j = 0; j < W; j += 4) {
            float4 v = *(const float4 *)(p + j);
            f[j] = v.x;
            f[j + 1] = v.y;
            f[j + 2] = v.z;
            f[j + 3] = v.w;
        }
}

/* K groups of W elements per lane; a row's segment of L lanes (FULL: 32, else 1 << lg),
 * lane p owning groups p, p + L, ... of the row: a warp's access covers L * W
 * consecutive elements of each of its 32 / L rows.  FULL makes L a constant, so that a
 * lane's K accesses are one address plus immediates (registers: see nb_rows_min_blocks).
 * Shared memory: the weight (fp32, read on every row: in registers it would take as many
 * as the lane's row), then the segments' column sums [segments of the block][C]. */
template <typename T, int W, int K, bool FULL, bool CENTER>
__global__ void __launch_bounds__(NB_WARPS * 32, nb_rows_min_blocks(K * W))
norm_bwd_rows_kernel(T *__restrict__ dinp, float *__restrict__ pw, float *__restrict__ pb,
                     const T *__restrict__ dout, const T *__restrict__ inp,
                     const T *__restrict__ weight, const float *__restrict__ mean,
                     const float *__restrict__ rstd, int N, int C, int lg)
{
    extern __shared__ __align__(16) float nb_smem[];
    float *wsm = nb_smem, *part = nb_smem + C;
    if (FULL)
        lg = 5; /* a constant from here on */
    const int L = 1 << lg, p = threadIdx.x & (L - 1), seg = threadIdx.x >> lg;
    const int segs = NB_WARPS * 32 >> lg;
    /* the warp's first segment: the loop below is the same for its 32 lanes, as the
     * shuffles need; lanes past the last row idle in it */
    const int wseg = (threadIdx.x & ~31) >> lg, sub = seg - wseg;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        wsm[c] = kcuda_ld(weight + c);
    __syncthreads();
    float aw[K][W], ab[K][W];
#pragma unroll
    for (int k = 0; k < K; k++)
#pragma unroll
        for (int j = 0; j < W; j++)
            aw[k][j] = ab[k][j] = 0.0f;
    /* unsigned: N + the grid's segments (at most 2^16) does not wrap */
    const unsigned stride = gridDim.x * segs;
    for (unsigned i0 = blockIdx.x * segs + wseg; i0 < (unsigned)N; i0 += stride) {
        const unsigned i = i0 + sub;
        const bool row = i < (unsigned)N;
        const T *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float mu = 0.0f, r = 0.0f;
        if (row) {
            mu = CENTER ? mean[i] : 0.0f;
            r = rstd[i];
        }
        /* all of the lane's loads first, so that they are in flight together; a slot
         * past the row's end holds zeros and adds nothing */
        float xh[K][W], g[K][W];
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = (p + k * L) * W;
            if (row && c < C) {
                kcuda_ldw<W>(xh[k], x + c);
                kcuda_ldw<W>(g[k], dy + c);
            } else {
#pragma unroll
                for (int j = 0; j < W; j++)
                    xh[k][j] = g[k][j] = 0.0f;
            }
        }
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = (p + k * L) * W;
            float w[W];
            if (c < C)
                nb_lds<W>(w, wsm + c);
            else
#pragma unroll
                for (int j = 0; j < W; j++)
                    w[j] = 0.0f;
#pragma unroll
            for (int j = 0; j < W; j++) {
                xh[k][j] = (xh[k][j] - mu) * r;
                aw[k][j] += g[k][j] * xh[k][j];
                ab[k][j] += g[k][j];
                g[k][j] *= w[j]; /* dy w from here on: all that dx needs of dy */
                sg += g[k][j];
                sgx += g[k][j] * xh[k][j];
            }
        }
        if (!dinp) /* the same for the whole grid: no lane leaves a shuffle below alone */
            continue;
        /* the row's sums over its segment's lanes, in the same order in every lane */
#pragma unroll
        for (int o = L >> 1; o > 0; o >>= 1) {
            sg += __shfl_xor_sync(0xffffffffu, sg, o);
            sgx += __shfl_xor_sync(0xffffffffu, sgx, o);
        }
        sg = CENTER ? sg / (float)C : 0.0f;
        sgx = sgx / (float)C;
        if (!row)
            continue;
        /* the increment in place of dy w, so that dx's loads take the registers of xhat */
#pragma unroll
        for (int k = 0; k < K; k++)
#pragma unroll
            for (int j = 0; j < W; j++)
                g[k][j] = r * (g[k][j] - sg - xh[k][j] * sgx);
        T *dx = dinp + (size_t)i * C;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = (p + k * L) * W;
            if (c < C)
                kcuda_ldw<W>(xh[k], dx + c);
        }
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = (p + k * L) * W;
            if (c < C) {
#pragma unroll
                for (int j = 0; j < W; j++)
                    xh[k][j] += g[k][j];
                kcuda_stw<W>(dx + c, xh[k]);
            }
        }
    }
    if (!pw)
        return;
    /* the block's column sums: its segments' added in segment order (the weight's, then
     * the bias's through the same shared memory) */
    for (int q = 0; q < (pb ? 2 : 1); q++) {
        if (q)
            __syncthreads(); /* the weight's sums are read */
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = (p + k * L) * W;
            if (c < C)
#pragma unroll
                for (int j = 0; j < W; j++)
                    part[seg * C + c + j] = q ? ab[k][j] : aw[k][j];
        }
        __syncthreads();
        float *out = (q ? pb : pw) + (size_t)blockIdx.x * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float s = 0.0f;
            for (int t = 0; t < segs; t++)
                s += part[t * C + c];
            out[c] = s;
        }
    }
}

/* Launches the kernel of the smallest instantiated K >= k. */
template <typename T, int W, bool FULL, bool CENTER, int K = 1>
static void launch_rows_k(kcuda_ctx *ctx, int k, int lg, int blocks, size_t smem, T *dinp,
                          float *pw, float *pb, const T *dout, const T *inp, const T *weight,
                          const float *mean, const float *rstd, int N, int C)
{
    if constexpr (nb_next_k(W, K) <= nb_max_k(W, FULL))
        if (k > K)
            return launch_rows_k<T, W, FULL, CENTER, nb_next_k(W, K)>(
                ctx, k, lg, blocks, smem, dinp, pw, pb, dout, inp, weight, mean, rstd, N, C);
    norm_bwd_rows_kernel<T, W, K, FULL, CENTER><<<blocks, NB_WARPS * 32, smem, ctx->stream>>>(
        dinp, pw, pb, dout, inp, weight, mean, rstd, N, C, lg);
}

template <typename T, int W, bool CENTER>
static void launch_rows(kcuda_ctx *ctx, int k, int lg, int blocks, size_t smem, T *dinp,
                        float *pw, float *pb, const T *dout, const T *inp, const T *weight,
                        const float *mean, const float *rstd, int N, int C)
{
    if (lg == 5)
        launch_rows_k<T, W, true, CENTER>(ctx, k, lg, blocks, smem, dinp, pw, pb, dout, inp,
                                          weight, mean, rstd, N, C);
    else
        launch_rows_k<T, W, false, CENTER>(ctx, k, lg, blocks, smem, dinp, pw, pb, dout, inp,
                                           weight, mean, rstd, N, C);
}

/* ---- wider rows: norm_bwd_wide_kernel, a block per row ---- */

/* Most blocks: enough to fill an H100 several times over at 256 threads. */
#define NB_MAX_BLOCKS 1024
/* Most W-element groups a thread owns in a row (the kernel's register arrays). */
#define NB_MAX_SLOTS 8

/* kcuda_block_sum of two values at once (the same order: the same bits): one pair of
 * barriers per row instead of two. */
__device__ __forceinline__ float2 nb_block_sum2(float a, float b)
{
    __shared__ float2 part[32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads(); /* part[] may still be read for the previous row */
    if (lane == 0)
        part[warp] = make_float2(a, b);
    __syncthreads();
    float2 t = make_float2(0.0f, 0.0f);
    for (int w = 0; w < nw; w++) { /* same order in every thread: identical totals */
        t.x += part[w].x;
        t.y += part[w].y;
    }
    return t;
}

/* Block b takes rows b, b + grid, ...; thread t owns groups t, t + blockDim, ... */
template <typename T, int W, int S, bool CENTER>
__global__ void norm_bwd_wide_kernel(T *dinp, float *pw, float *pb, const T *dout,
                                     const T *inp, const T *weight, const float *mean,
                                     const float *rstd, int N, int C)
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
        float2 t = nb_block_sum2(sg, sgx);
        sg = CENTER ? t.x / (float)C : 0.0f;
        sgx = t.y / (float)C;
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

template <typename T, int W, bool CENTER>
static void launch_wide(kcuda_ctx *ctx, int blocks, int threads, int slots, T *dinp,
                        float *pw, float *pb, const T *dout, const T *inp, const T *weight,
                        const float *mean, const float *rstd, int N, int C)
{
#define NB_LAUNCH(S)                                                                          \
    norm_bwd_wide_kernel<T, W, S, CENTER><<<blocks, threads, 0, ctx->stream>>>(               \
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

/* ---- the blocks' column sums ---- */

/* Thread rows of norm_bwd_cols_kernel: with 32 columns, a block of 1024 threads. */
#define NB_COL_SPLITS 32

/* dweight[c] += the blocks' sums of column c (dbias likewise), in double: thread row y
 * adds blocks [y * per, (y + 1) * per) in order, then thread row 0 the rows' totals in
 * order.  Enough threads in flight that the sums are read at L2 speed, not one thread's
 * latency per block. */
__global__ void __launch_bounds__(32 * NB_COL_SPLITS)
norm_bwd_cols_kernel(float *dweight, float *dbias, const float *pw, const float *pb,
                     int blocks, int C)
{
    __shared__ double tw[NB_COL_SPLITS][32], tb[NB_COL_SPLITS][32];
    const int x = threadIdx.x, y = threadIdx.y, c = blockIdx.x * 32 + x;
    const int per = (blocks + NB_COL_SPLITS - 1) / NB_COL_SPLITS;
    const int b0 = y * per, b1 = min(blocks, b0 + per);
    double sw = 0.0, sb = 0.0;
    if (c < C)
        for (int b = b0; b < b1; b++) {
            sw += pw[(size_t)b * C + c];
            if (pb)
                sb += pb[(size_t)b * C + c];
        }
    tw[y][x] = sw;
    tb[y][x] = sb;
    __syncthreads();
    if (y || c >= C)
        return;
    sw = sb = 0.0;
    for (int t = 0; t < NB_COL_SPLITS; t++) {
        sw += tw[t][x];
        sb += tb[t][x];
    }
    if (dweight)
        dweight[c] += (float)sw;
    if (dbias)
        dbias[c] += (float)sb;
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
    /* the blocks' column sums (the weight's, then the bias's where there is one) */
    const int sums = dbias ? 2 : dweight ? 1 : 0;
    if (!sums && !dinp)
        return KCUDA_OK;
    const bool rows = groups <= 32 * nb_max_k(W, true);
    int blocks, threads = 0, slots = 0, lg = 5, k = 0;
    if (rows) {
        /* lanes per row (1 << lg): 32, halved while the row fits in half the lanes, or
         * while a lane would then own at most NB_LANE_TARGET elements and a warp's
         * access to a row stays 128 bytes (8 lanes of 16-byte access; scalar access
         * keeps 32 lanes for that) */
        k = (groups + 31) / 32;
        while (lg > 0) {
            int half = 1 << (lg - 1), hk = (groups + half - 1) / half;
            if (groups > half && (W == 1 || half < 8 || hk * W > NB_LANE_TARGET))
                break;
            lg--;
            k = hk;
        }
        /* the K the kernel is built for (scalar access: the next power of 2), whose
         * blocks per SM bound the grid */
        int kk = 1;
        while (kk < k)
            kk = nb_next_k(W, kk);
        const int segs = NB_WARPS * 32 >> lg, most = NB_SMS * nb_rows_min_blocks(kk * W);
        blocks = (int)(((long)N + segs - 1) / segs);
        blocks = blocks < most ? blocks : most;
    } else {
        /* one thread per group up to 256 (a multiple of 32, as nb_block_sum2 needs), more
         * only where a thread would otherwise own more than NB_MAX_SLOTS groups */
        threads = (groups + 31) / 32 * 32;
        if (threads > 256)
            threads = 256;
        if (groups > threads * NB_MAX_SLOTS)
            threads = (groups + 32 * NB_MAX_SLOTS - 1) / (32 * NB_MAX_SLOTS) * 32;
        if (threads > 1024)
            return kcuda_fail(ctx, KCUDA_EARG, "%s: rows of %d elements are too wide", fn, C);
        slots = (groups + threads - 1) / threads;
        blocks = N < NB_MAX_BLOCKS ? N : NB_MAX_BLOCKS;
    }
    /* as many blocks as the workspace holds sums for */
    size_t per_block = sizeof(float) * (size_t)C * (size_t)(sums ? sums : 1);
    size_t fit = ctx->workspace_bytes / per_block;
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
    int rc;
    if (rows) {
        constexpr int V = kcuda_vec<T>::n;
        /* the weight, then the segments' column sums where there are any */
        const size_t smem = sizeof(float) * C * (1 + (sums ? NB_WARPS * 32 >> lg : 0));
        if (vec && mean)
            launch_rows<T, V, true>(ctx, k, lg, blocks, smem, dinp, pw, pb, dout, inp, weight,
                                    mean, rstd, N, C);
        else if (vec)
            launch_rows<T, V, false>(ctx, k, lg, blocks, smem, dinp, pw, pb, dout, inp, weight,
                                     mean, rstd, N, C);
        else if (mean)
            launch_rows<T, 1, true>(ctx, k, lg, blocks, smem, dinp, pw, pb, dout, inp, weight,
                                    mean, rstd, N, C);
        else
            launch_rows<T, 1, false>(ctx, k, lg, blocks, smem, dinp, pw, pb, dout, inp, weight,
                                     mean, rstd, N, C);
        rc = kcuda_check_launch(ctx, "norm_bwd_rows_kernel");
    } else {
        if (vec && mean)
            launch_wide<T, kcuda_vec<T>::n, true>(ctx, blocks, threads, slots, dinp, pw, pb,
                                                  dout, inp, weight, mean, rstd, N, C);
        else if (vec)
            launch_wide<T, kcuda_vec<T>::n, false>(ctx, blocks, threads, slots, dinp, pw, pb,
                                                   dout, inp, weight, mean, rstd, N, C);
        else if (mean)
            launch_wide<T, 1, true>(ctx, blocks, threads, slots, dinp, pw, pb, dout, inp,
                                    weight, mean, rstd, N, C);
        else
            launch_wide<T, 1, false>(ctx, blocks, threads, slots, dinp, pw, pb, dout, inp,
                                     weight, mean, rstd, N, C);
        rc = kcuda_check_launch(ctx, "norm_bwd_wide_kernel");
    }
    if (rc < 0 || !sums)
        return rc;
    norm_bwd_cols_kernel<<<(C + 31) / 32, dim3(32, NB_COL_SPLITS), 0, ctx->stream>>>(
        dweight, dbias, pw, pb, blocks, C);
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
