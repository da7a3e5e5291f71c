/* gemm_fp8.cu - FP8 GEMMs through cuBLASLt and the quantisation in front of them
 * (kcuda.h, "FP8 GEMMs").
 *
 * Layout.  cuBLASLt's FP8 kernels on Hopper take A transposed and B not ("TN"): in
 * row-major words, both operands K-major.  The row-major out[R, C] is the column-major
 * out^T[C, R], so
 *   out^T[C, R] = op_T(A = b, column-major [Kd, C]) . (B = a, column-major [Kd, R])
 * with m = C, n = R, k = Kd, lda = ldb = Kd, ldc = C; A's scale is b's, B's is a's.
 *
 * Types.  D = alpha * op(A) op(B) + beta * C, compute 32F, fp32 C and D: cuBLASLt's FP8 table pairs fp32 C/D with any FP8 A/B except E5M2 x E5M2 (its
 * fp32-output bias epilogue wants a bf16 bias, so biases are added by the caller).
 * FAST_ACCUM stays off: cuBLASLt then promotes the tensor cores' partial sums into fp32
 * at short intervals, which keeps the products close to the fp32 emulation's.
 *
 * Scales.  The dequantisation factors (1/scale of each operand) enter as alpha, their
 * product, a host float: the operands are per-tensor scaled, so alpha * op(A) op(B) is
 * the product cuBLASLt's A/B scale pointers would give, without device floats to keep
 * aligned: cuBLASLt 13.1 on an H100 finds an algorithm when a scale pointer is 4 bytes
 * into an allocation and then refuses to run it (NOT_SUPPORTED), while it runs the GEMM
 * with each scale at the start of an allocation, and without scale pointers
 * (contrib/dev/fp8_lt_probe.cu).
 *
 * Descriptors and the chosen algorithm are cached in the context's GEMM cache (gemm.cu)
 * under dtypes of their own. */
#include "cuda/kcuda_fp8.cuh"
#include "cuda/kcuda_internal.h"

#include <string.h>

/* gemm.cu's dtypes are small; FP8 keys are DT_FP8 + 2 * fa + fb (per operand format). */
enum { DT_FP8 = 16 };

#define LT(call, what)                                                                    \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            rc = kcuda_fail(ctx, KCUDA_ECUBLAS, "kcuda_matmul_fp8: %s: %s", what,         \
                            cublasLtGetStatusString(s_));                                 \
            goto done;                                                                    \
        }                                                                                 \
    } while (0)

/* ---- quantisation -----------------------------------------------------------------------
 * One block per 32 x 32 tile: its rows are read once (coalesced), the codes go to q in
 * place and through shared memory to qt transposed (coalesced too). */
#define QT_TILE 32
#define QT_ROWS 8

__global__ void fp8_quantise_kernel(uint8_t *q, uint8_t *qt, const float *x,
                                    int rows, int cols, float scale, kcuda_fp8_fmt F)
{
    __shared__ uint8_t tile[QT_TILE][QT_TILE + 4]; /* +4: a row stride of 9 words, no conflicts */
    int r0 = blockIdx.x * QT_TILE, c0 = blockIdx.y * QT_TILE;
    int c = c0 + threadIdx.x;
    for (int j = threadIdx.y; j < QT_TILE; j += QT_ROWS) {
        int r = r0 + j;
        if (r < rows && c < cols) {
            size_t i = (size_t)r * cols + c;
            /* the sign from x: the GPU's x * scale of a NaN is the canonical (positive)
             * NaN, the cpu's keeps x's sign (scale > 0, so signs agree otherwise) */
            float xi = x[i];
            uint8_t code = kcuda_fp8_code(kcuda_fp8_round(__fmul_rn(xi, scale), F), xi, F);
            if (q)
                q[i] = code;
            tile[j][threadIdx.x] = code;
        }
    }
    if (!qt) /* the same for the whole block: no thread waits below alone */
        return;
    __syncthreads();
    int r = r0 + threadIdx.x;
    for (int j = threadIdx.y; j < QT_TILE; j += QT_ROWS) {
        int cc = c0 + j;
        if (cc < cols && r < rows)
            qt[(size_t)cc * rows + r] = tile[threadIdx.x][j];
    }
}

extern "C" int kcuda_fp8_quantise(kcuda_ctx *ctx, uint8_t *q, uint8_t *qt, const float *x,
                                  int rows, int cols, float scale, int fmt)
{
    if (rows <= 0 || cols <= 0 || (fmt != KCUDA_FP8_E4M3 && fmt != KCUDA_FP8_E5M2))
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_fp8_quantise: bad arguments rows=%d "
                          "cols=%d fmt=%d", rows, cols, fmt);
    unsigned ct = (unsigned)((cols + QT_TILE - 1) / QT_TILE);
    if (ct > 65535) /* the column tiles are grid.y */
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_fp8_quantise: %d columns are too many",
                          cols);
    dim3 grid((unsigned)((rows + QT_TILE - 1) / QT_TILE), ct), block(QT_TILE, QT_ROWS);
    fp8_quantise_kernel<<<grid, block, 0, ctx->stream>>>(q, qt, x, rows, cols, scale,
                                                         kcuda_fp8_fmt_of(fmt));
    return kcuda_check_launch(ctx, "fp8_quantise_kernel");
}

/* ---- the GEMM ------------------------------------------------------------------------ */

extern "C" int kcuda_matmul_fp8_fits(const float *out, int R, int C, int Kd)
{
    return R > 0 && C > 0 && Kd > 0 && R % 16 == 0 && C % 16 == 0 && Kd % 16 == 0 &&
           (uintptr_t)out % 16 == 0;
}

static cudaDataType_t fp8_type(int f)
{
    return f == KCUDA_FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

static struct kcuda_gemm_key fp8_key(int fa, int fb, int R, int C, int Kd, int accumulate)
{
    struct kcuda_gemm_key key;
    memset(&key, 0, sizeof key); /* the cache compares every byte */
    key.dtype = DT_FP8 + 2 * fa + fb;
    key.transa = (int)CUBLAS_OP_T;
    key.transb = (int)CUBLAS_OP_N;
    key.m = C;
    key.n = R;
    key.k = Kd;
    key.epilogue = (int)CUBLASLT_EPILOGUE_DEFAULT;
    key.beta1 = accumulate != 0;
    key.align = 16;
    return key;
}

/* Runs op: out = alpha * (b . a^T) (+ out when beta is 1), column-major words. */
static int fp8_run(kcuda_ctx *ctx, cublasLtMatmulDesc_t op, const cublasLtMatmulAlgo_t *algo,
                   cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                   cublasLtMatrixLayout_t lc, float *out, const uint8_t *a, const uint8_t *b,
                   float alpha, float beta)
{
    /* Some cuBLASLt builds offer an algorithm and then refuse to run it (NOT_SUPPORTED,
     * nothing launched): that is "no FP8 GEMM here" as well, so the caller's emulation
     * runs instead of the step failing. */
    cublasStatus_t s = cublasLtMatmul(ctx->lt, op, &alpha, b, la, a, lb, &beta, out, lc, out,
                                      lc, algo, ctx->workspace, ctx->workspace_bytes,
                                      ctx->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED)
        return kcuda_fail(ctx, KCUDA_ENOALGO, "kcuda_matmul_fp8: cublasLtMatmul: %s",
                          cublasLtGetStatusString(s));
    if (s != CUBLAS_STATUS_SUCCESS)
        return kcuda_fail(ctx, KCUDA_ECUBLAS, "kcuda_matmul_fp8: cublasLtMatmul: %s",
                          cublasLtGetStatusString(s));
    return KCUDA_OK;
}

/* cuBLASLt's choice for op over the layouts: 0, or KCUDA_ENOALGO when it has none (no
 * FP8 kernels on this GPU, or none for the shape). */
static int fp8_heuristic(kcuda_ctx *ctx, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                         cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                         cublasLtMatmulHeuristicResult_t *res, const char *shape)
{
    int rc = KCUDA_OK, found = 0;
    uint32_t al = 16;
    cublasLtMatmulPreference_t pref = NULL;
    if ((rc = kcuda_lt_preference(ctx, al, &pref)) < 0)
        goto done;
    {
        /* NOT_SUPPORTED is how cuBLASLt says "no FP8 here" on older GPUs */
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, lc, lc, pref, 1,
                                                          res, &found);
        if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found < 1))
            rc = kcuda_fail(ctx, KCUDA_ENOALGO, "kcuda_matmul_fp8: cuBLASLt has no FP8 "
                            "algorithm for %s", shape);
        else
            LT(s, "cublasLtMatmulAlgoGetHeuristic");
    }
done:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return rc;
}

extern "C" int kcuda_matmul_fp8(kcuda_ctx *ctx, float *out, const uint8_t *a, int fa,
                                const uint8_t *b, int fb, float alpha, int R, int C, int Kd,
                                int accumulate)
{
    int rc = KCUDA_OK;
    char shape[96];
    snprintf(shape, sizeof shape, "out[%d, %d] over %d (formats %d, %d)", R, C, Kd, fa, fb);
    if ((fa != KCUDA_FP8_E4M3 && fa != KCUDA_FP8_E5M2) ||
        (fb != KCUDA_FP8_E4M3 && fb != KCUDA_FP8_E5M2) || !a || !b)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_matmul_fp8: bad arguments for %s", shape);
    if (!kcuda_matmul_fp8_fits(out, R, C, Kd) || (fa == KCUDA_FP8_E5M2 && fb == fa) ||
        ((uintptr_t)a | (uintptr_t)b) % 16)
        return kcuda_fail(ctx, KCUDA_ENOALGO, "kcuda_matmul_fp8: cuBLASLt's FP8 kernels do "
                          "not take %s (16-multiple shapes and 16-byte pointers; not both "
                          "E5M2)", shape);
    float beta = accumulate ? 1.0f : 0.0f;
    struct kcuda_gemm_key key = fp8_key(fa, fb, R, C, Kd, accumulate);
    struct kcuda_gemm_entry *slot = kcuda_gemm_cache_slot(ctx, &key);
    if (slot && slot->used) {
        ctx->cache_hits++;
        return fp8_run(ctx, slot->op, &slot->algo, slot->la, slot->lb, slot->lc, out, a, b,
                       alpha, beta);
    }
    ctx->cache_misses++;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulHeuristicResult_t res;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc create");
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
       "set TRANSA");
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
       "set TRANSB");
    LT(cublasLtMatrixLayoutCreate(&la, fp8_type(fb), Kd, C, Kd), "layout A");
    LT(cublasLtMatrixLayoutCreate(&lb, fp8_type(fa), Kd, R, Kd), "layout B");
    LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, C, R, C), "layout C");
    if ((rc = fp8_heuristic(ctx, op, la, lb, lc, &res, shape)))
        goto done;
    if (slot) { /* the entry takes the descriptors over */
        kcuda_gemm_cache_fill(ctx, slot, &key, &res.algo, &op, &la, &lb, &lc);
        rc = fp8_run(ctx, slot->op, &slot->algo, slot->la, slot->lb, slot->lc, out, a, b,
                     alpha, beta);
    } else { /* table full: the answer used once, uncached */
        rc = fp8_run(ctx, op, &res.algo, la, lb, lc, out, a, b, alpha, beta);
    }
done:
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (op)
        cublasLtMatmulDescDestroy(op);
    return rc;
}
