/* gemm.cu - matmul forward/backward through cuBLASLt, bf16 (fp32 accumulation) and
 * fp32 (no TF32).
 *
 * Row-major to cuBLASLt's column-major: a row-major [R,C] matrix is a column-major
 * [C,R] one with leading dimension C, so every product is computed transposed:
 *   out^T[N,M]    = W^T-as-stored(op T)[N,K] . inp^T[K,M]          (m=N, n=M, k=K)
 *   dinp^T[K,M]  += W-as-stored[K,N] . dout^T[N,M]                 (m=K, n=M, k=N)
 *   dW^T[K,N]    += inp^T[K,M] . (dout^T[N,M])^T                   (m=K, n=N, k=M)
 * The bias of the forward is a per-row vector of the column-major C (length m = N),
 * which is cuBLASLt's BIAS epilogue; the bias gradient of dW is the sum of dout^T over
 * k = M, cuBLASLt's BGRADB epilogue (kcuda_matmul_backward_bf16_f32w). */
#include "cuda/kcuda_internal.h"

#include <string.h>

/* DT_BF16_F32OUT: bf16 A and B, fp32 C and D (fp32 accumulation as always): weight
 * gradients accumulated straight into fp32 storage. */
enum { DT_BF16 = 0, DT_F32 = 1, DT_BF16_F32OUT = 2 };

struct gemm_args {
    int dtype;
    cublasOperation_t ta, tb;
    int m, n, k;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    void *C;
    int ldc;
    float beta;
    const void *bias; /* NULL: no epilogue */
    int bgrad;        /* with bias: BGRADB, bias[n] = column sums of op(B) over k (written) */
    const void *res;  /* beta's C where it is not the output C (same layout); NULL: C */
    /* GELU epilogues (bf16 aux of D's shape, ld aux_ld): GEMM_GELU_AUX: D = gelu(AB + bias)
     * with AB + bias stored in aux; GEMM_DGELU: D = AB * gelu'(aux) */
    int gelu;
    const void *aux;
    int aux_ld;
};

enum { GEMM_PLAIN = 0, GEMM_GELU_AUX = 1, GEMM_DGELU = 2 };

/* The largest power of two (<= 16) dividing every pointer: cuBLASLt's choice depends
 * on it, so it is part of the cache key. */
static int ptr_align(const void *a, const void *b, const void *c, const void *d)
{
    uintptr_t x = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d | 16;
    return (int)(x & (~x + 1));
}

static int key_eq(const struct kcuda_gemm_key *a, const struct kcuda_gemm_key *b)
{
    return memcmp(a, b, sizeof *a) == 0;
}

static unsigned key_hash(const struct kcuda_gemm_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    unsigned h = 2166136261u;
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

#define LT(call, what)                                                                    \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            rc = kcuda_fail(ctx, KCUDA_ECUBLAS, "%s: %s", what, cublasLtGetStatusString(s_)); \
            goto done;                                                                    \
        }                                                                                 \
    } while (0)

/* The cache slot for key: the entry holding it, else the first free slot on its probe
 * path, else NULL (table full). */
static struct kcuda_gemm_entry *cache_slot(kcuda_ctx *ctx, const struct kcuda_gemm_key *key)
{
    unsigned h = key_hash(key) % KCUDA_GEMM_CACHE;
    for (int i = 0; i < KCUDA_GEMM_CACHE; i++) {
        struct kcuda_gemm_entry *e = &ctx->cache[(h + i) % KCUDA_GEMM_CACHE];
        if (!e->used || key_eq(&e->key, key))
            return e;
    }
    return NULL;
}

/* A heuristic preference bounded by the context's workspace, every operand `align`
 * bytes aligned; on failure *pref is NULL. */
int kcuda_lt_preference(kcuda_ctx *ctx, uint32_t align, cublasLtMatmulPreference_t *pref)
{
    int rc = KCUDA_OK;
    static const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    *pref = NULL;
    LT(cublasLtMatmulPreferenceCreate(pref), "preference create");
    LT(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ctx->workspace_bytes,
                                            sizeof ctx->workspace_bytes),
       "set MAX_WORKSPACE_BYTES");
    for (int i = 0; i < 4; i++)
        LT(cublasLtMatmulPreferenceSetAttribute(*pref, which[i], &align, sizeof align),
           "set MIN_ALIGNMENT");
    return KCUDA_OK;
done:
    if (*pref)
        cublasLtMatmulPreferenceDestroy(*pref);
    *pref = NULL;
    return rc;
}

/* fast: fp32 operands rounded to bf16 on the tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF),
 * fp32 accumulation; else exact fp32 (never TF32). */
static int lt_matmul_ct(kcuda_ctx *ctx, const struct gemm_args *g, int fast)
{
    int rc = KCUDA_OK;
    cudaDataType_t dt = g->dtype == DT_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cudaDataType_t dtc = g->dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t ct = fast ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtEpilogue_t epi = g->gelu == GEMM_GELU_AUX ? (g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                 : CUBLASLT_EPILOGUE_GELU_AUX)
                             : g->gelu == GEMM_DGELU ? CUBLASLT_EPILOGUE_DGELU
                             : !g->bias              ? CUBLASLT_EPILOGUE_DEFAULT
                             : g->bgrad              ? CUBLASLT_EPILOGUE_BGRADB
                                                     : CUBLASLT_EPILOGUE_BIAS;
    float alpha = 1.0f, beta = g->beta;
    int arows = g->ta == CUBLAS_OP_N ? g->m : g->k, acols = g->ta == CUBLAS_OP_N ? g->k : g->m;
    int brows = g->tb == CUBLAS_OP_N ? g->k : g->n, bcols = g->tb == CUBLAS_OP_N ? g->n : g->k;
    cublasLtMatmulHeuristicResult_t res;
    const cublasLtMatmulAlgo_t *algo;

    struct kcuda_gemm_key key;
    memset(&key, 0, sizeof key); /* memcmp compares every byte */
    key.dtype = g->dtype;
    key.transa = (int)g->ta;
    key.transb = (int)g->tb;
    key.m = g->m;
    key.n = g->n;
    key.k = g->k;
    key.epilogue = (int)epi;
    key.beta1 = beta != 0.0f;
    key.align = ptr_align(g->A, g->B, g->C, g->bias);
    if (g->res && ptr_align(g->res, NULL, NULL, NULL) < key.align)
        key.align = ptr_align(g->res, NULL, NULL, NULL);
    if (g->aux && ptr_align(g->aux, NULL, NULL, NULL) < key.align)
        key.align = ptr_align(g->aux, NULL, NULL, NULL);
    const void *cin = g->res ? g->res : g->C;
    key.fast = fast;

    struct kcuda_gemm_entry *slot = cache_slot(ctx, &key);
    if (slot && slot->used) {
        ctx->cache_hits++;
        if (g->bias)
            LT(cublasLtMatmulDescSetAttribute(slot->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                              &g->bias, sizeof g->bias),
               "set BIAS_POINTER");
        if (g->aux)
            LT(cublasLtMatmulDescSetAttribute(slot->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &g->aux, sizeof g->aux),
               "set EPILOGUE_AUX_POINTER");
        LT(cublasLtMatmul(ctx->lt, slot->op, &alpha, g->A, slot->la, g->B, slot->lb, &beta,
                          cin, slot->lc, g->C, slot->lc, &slot->algo, ctx->workspace,
                          ctx->workspace_bytes, ctx->stream),
           "cublasLtMatmul");
        return KCUDA_OK;
    }
    ctx->cache_misses++;
    LT(cublasLtMatmulDescCreate(&op, ct, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta),
       "set TRANSA");
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb),
       "set TRANSB");
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
           "set EPILOGUE");
    if (g->aux) {
        int64_t ld = g->aux_ld;
        cudaDataType_t at = CUDA_R_16BF;
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                          sizeof g->aux),
           "set EPILOGUE_AUX_POINTER");
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                          sizeof ld),
           "set EPILOGUE_AUX_LD");
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at,
                                          sizeof at),
           "set EPILOGUE_AUX_DATA_TYPE");
    }
    if (g->bias) {
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                          sizeof g->bias),
           "set BIAS_POINTER");
        if (g->bgrad) /* the gradient in the output's type (fp32 for DT_BF16_F32OUT) */
            LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &dtc,
                                              sizeof dtc),
               "set BIAS_DATA_TYPE");
    }
    LT(cublasLtMatrixLayoutCreate(&la, dt, arows, acols, g->lda), "layout A");
    LT(cublasLtMatrixLayoutCreate(&lb, dt, brows, bcols, g->ldb), "layout B");
    LT(cublasLtMatrixLayoutCreate(&lc, dtc, g->m, g->n, g->ldc), "layout C");
    {
        uint32_t al = (uint32_t)key.align;
        int found = 0;
        if ((rc = kcuda_lt_preference(ctx, al, &pref)) < 0)
            goto done;
        LT(cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, lc, lc, pref, 1, &res, &found),
           "cublasLtMatmulAlgoGetHeuristic");
        if (found < 1) {
            rc = kcuda_fail(ctx, KCUDA_ENOALGO,
                            "cuBLASLt has no algorithm for m=%d n=%d k=%d align=%d", g->m,
                            g->n, g->k, key.align);
            goto done;
        }
    }
    algo = &res.algo;
    if (slot) { /* the entry takes the descriptors over */
        kcuda_gemm_cache_fill(ctx, slot, &key, &res.algo, &op, &la, &lb, &lc);
        LT(cublasLtMatmul(ctx->lt, slot->op, &alpha, g->A, slot->la, g->B, slot->lb, &beta,
                          cin, slot->lc, g->C, slot->lc, &slot->algo, ctx->workspace,
                          ctx->workspace_bytes, ctx->stream),
           "cublasLtMatmul");
    } else { /* table full: use the answer once, uncached */
        LT(cublasLtMatmul(ctx->lt, op, &alpha, g->A, la, g->B, lb, &beta, cin, lc, g->C, lc,
                          algo, ctx->workspace, ctx->workspace_bytes, ctx->stream),
           "cublasLtMatmul");
    }
done:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
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

static int lt_matmul(kcuda_ctx *ctx, const struct gemm_args *g)
{
    int fast = g->dtype == DT_F32 && ctx->f32_math == KCUDA_F32_BF16;
    int rc = lt_matmul_ct(ctx, g, fast);
    /* A shape the bf16 path has no algorithm for runs exactly instead. */
    if (rc == KCUDA_ENOALGO && fast)
        rc = lt_matmul_ct(ctx, g, 0);
    return rc;
}

/* dbias[n] += sum over rows of dout[:, n], deterministic without atomics: fixed chunks of
 * rows write fp32 partial column sums into the context workspace (pass 1: a thread owns
 * W = 4 adjacent columns of one chunk, 16-byte loads where the rows allow), then the
 * chunks are added in a fixed order (pass 2: 8 row groups of 32 columns a block, each
 * group a fixed stride of chunks, the groups combined in order).  Short chunks and many
 * of them keep enough loads in flight to run at memory speed: the conversion of the
 * residual gradient for the projections' GEMMs (16384 x 768 fp32) is one such pass.  One
 * thread per column over all rows (what a workspace too small for the partials falls
 * back to) leaves most of the GPU idle when M is large. */
#define BGRAD_CHUNK_ROWS 64
#define BGRAD_MAX_CHUNKS 256
#define BGRAD_GROUPS 8

/* cvt (optional): the same pass also writes dout in bf16 with rows `pitch` elements apart,
 * the pad columns [N, pitch) zero (the GEMMs' operand): one read of dout for both.  W > 1
 * needs N, pitch % W == 0 and 16-byte (fp32) / 8-byte (bf16) aligned rows. */
template <typename T, int W>
__global__ void bias_grad_partial_kernel(float *part, const T *dout, int M, int N, int rows,
                                         __nv_bfloat16 *cvt, int pitch)
{
    int c = (blockIdx.x * blockDim.x + threadIdx.x) * W, k = blockIdx.y;
    int r0 = k * rows, r1 = r0 + rows < M ? r0 + rows : M;
    if (c >= N) {
        if (cvt && c < pitch)
            for (int r = r0; r < r1; r++)
                for (int j = 0; j < W && c + j < pitch; j++)
                    cvt[(size_t)r * pitch + c + j] = __float2bfloat16_rn(0.0f);
        return;
    }
    float s[W];
#pragma unroll
    for (int j = 0; j < W; j++)
        s[j] = 0.0f;
#pragma unroll 8
    for (int r = r0; r < r1; r++) {
        float v[W];
        kcuda_ldw<W>(v, dout + (size_t)r * N + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            s[j] += v[j];
        if (cvt)
            kcuda_stw<W>(cvt + (size_t)r * pitch + c, v);
    }
#pragma unroll
    for (int j = 0; j < W; j++)
        part[(size_t)k * N + c + j] = s[j];
}

/* grid ceil(N / 32), block (32, BGRAD_GROUPS): group y adds chunks y, y + GROUPS, ... */
template <typename T>
__global__ void bias_grad_sum_kernel(T *dbias, const float *part, int chunks, int N)
{
    __shared__ float g[BGRAD_GROUPS][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < N)
        for (int k = threadIdx.y; k < chunks; k += BGRAD_GROUPS)
            s += part[(size_t)k * N + c];
    g[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y || c >= N)
        return;
    s = 0.0f;
    for (int y = 0; y < BGRAD_GROUPS; y++)
        s += g[y][threadIdx.x];
    kcuda_st(dbias + c, kcuda_ld(dbias + c) + s);
}

template <typename T>
__global__ void bias_grad_kernel(T *dbias, const T *dout, int M, int N)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= N)
        return;
    float s = 0.0f;
    for (int r = 0; r < M; r++)
        s += kcuda_ld(dout + (size_t)r * N + c);
    kcuda_st(dbias + c, kcuda_ld(dbias + c) + s);
}

/* Pass 1 over M rows in `chunks` chunks of `rows`: 4 columns a thread where the rows'
 * width and alignment allow. */
template <typename T>
static int bias_partials(kcuda_ctx *ctx, float *part, const T *dout, int M, int N, int rows,
                         int chunks, __nv_bfloat16 *cvt, int pitch)
{
    int w = cvt ? pitch : N;   /* the columns a pass covers */
    bool vec = N % 4 == 0 && w % 4 == 0 && ((uintptr_t)dout % (4 * sizeof(T))) == 0 &&
               ((uintptr_t)cvt % 8) == 0;
    int W = vec ? 4 : 1, threads = 256;
    dim3 grid((unsigned)((w / W + threads - 1) / threads), (unsigned)chunks);
    if (vec)
        bias_grad_partial_kernel<T, 4><<<grid, threads, 0, ctx->stream>>>(part, dout, M, N,
                                                                          rows, cvt, pitch);
    else
        bias_grad_partial_kernel<T, 1><<<grid, threads, 0, ctx->stream>>>(part, dout, M, N,
                                                                          rows, cvt, pitch);
    return kcuda_check_launch(ctx, "bias_grad_partial_kernel");
}

template <typename T>
static int bias_sum(kcuda_ctx *ctx, T *dbias, const float *part, int chunks, int N)
{
    bias_grad_sum_kernel<T><<<(unsigned)((N + 31) / 32), dim3(32, BGRAD_GROUPS), 0,
                              ctx->stream>>>(dbias, part, chunks, N);
    return kcuda_check_launch(ctx, "bias_grad_sum_kernel");
}

/* The row chunking of the two-pass bias gradient: chunks and rows per chunk for M rows. */
static int bias_chunks(int M, int *rows)
{
    int chunks = (M + BGRAD_CHUNK_ROWS - 1) / BGRAD_CHUNK_ROWS;
    if (chunks > BGRAD_MAX_CHUNKS)
        chunks = BGRAD_MAX_CHUNKS;
    *rows = (M + chunks - 1) / chunks;
    return (M + *rows - 1) / *rows;
}

template <typename T>
static int bias_grad(kcuda_ctx *ctx, T *dbias, const T *dout, int M, int N)
{
    int rows, chunks = bias_chunks(M, &rows);
    size_t need = sizeof(float) * (size_t)chunks * (size_t)N;
    unsigned cols = (unsigned)((N + 255) / 256);
    if (chunks <= 1 || need > ctx->workspace_bytes) {
        bias_grad_kernel<T><<<cols, 256, 0, ctx->stream>>>(dbias, dout, M, N);
        return kcuda_check_launch(ctx, "bias_grad_kernel");
    }
    float *part = (float *)ctx->workspace;
    int rc = bias_partials<T>(ctx, part, dout, M, N, rows, chunks, NULL, 0);
    return rc < 0 ? rc : bias_sum<T>(ctx, dbias, part, chunks, N);
}

static int check_shape(kcuda_ctx *ctx, const char *fn, int M, int K, int N)
{
    if (M <= 0 || K <= 0 || N <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bad shape M=%d K=%d N=%d", fn, M, K, N);
    return KCUDA_OK;
}

/* out = inp . weight^T (+ bias) (+ res, where given: cuBLASLt's C, beta 1) */
static int forward(kcuda_ctx *ctx, int dtype, void *out, const void *inp, const void *weight,
                   const void *bias, int M, int K, int N, const void *res = NULL)
{
    struct gemm_args g = {dtype, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, weight, K, inp, K,
                          out, N, res ? 1.0f : 0.0f, bias, 0, res, GEMM_PLAIN, NULL, 0};
    return lt_matmul(ctx, &g);
}

template <typename T>
static int backward(kcuda_ctx *ctx, int dtype, T *dinp, T *dweight, T *dbias, const T *dout,
                    const T *inp, const T *weight, int M, int K, int N)
{
    int rc;
    if (dinp) {
        struct gemm_args g = {dtype, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, weight, K, dout, N,
                              dinp, K, 1.0f, NULL, 0, NULL, GEMM_PLAIN, NULL, 0};
        if ((rc = lt_matmul(ctx, &g)) < 0)
            return rc;
    }
    if (dweight) {
        struct gemm_args g = {dtype, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, inp, K, dout, N,
                              dweight, K, 1.0f, NULL, 0, NULL, GEMM_PLAIN, NULL, 0};
        if ((rc = lt_matmul(ctx, &g)) < 0)
            return rc;
    }
    if (dbias)
        return bias_grad<T>(ctx, dbias, dout, M, N);
    return KCUDA_OK;
}

extern "C" int kcuda_matmul_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out,
                                         const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                         const kcuda_bf16 *bias, int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_forward_bf16", M, K, N);
    return rc < 0 ? rc : forward(ctx, DT_BF16, out, inp, weight, bias, M, K, N);
}

extern "C" int kcuda_matmul_forward_f32(kcuda_ctx *ctx, float *out, const float *inp,
                                        const float *weight, const float *bias, int M,
                                        int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_forward_f32", M, K, N);
    return rc < 0 ? rc : forward(ctx, DT_F32, out, inp, weight, bias, M, K, N);
}

extern "C" int kcuda_matmul_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp,
                                          kcuda_bf16 *dweight, kcuda_bf16 *dbias,
                                          const kcuda_bf16 *dout, const kcuda_bf16 *inp,
                                          const kcuda_bf16 *weight, int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_backward_bf16", M, K, N);
    if (rc < 0)
        return rc;
    return backward<__nv_bfloat16>(ctx, DT_BF16, (__nv_bfloat16 *)dinp,
                                   (__nv_bfloat16 *)dweight, (__nv_bfloat16 *)dbias,
                                   (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)inp,
                                   (const __nv_bfloat16 *)weight, M, K, N);
}

extern "C" int kcuda_matmul_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight,
                                         float *dbias, const float *dout, const float *inp,
                                         const float *weight, int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_backward_f32", M, K, N);
    if (rc < 0)
        return rc;
    return backward<float>(ctx, DT_F32, dinp, dweight, dbias, dout, inp, weight, M, K, N);
}

/* ---- bf16 operands, fp32 outputs ------------------------------------------------- */

extern "C" int kcuda_matmul_forward_bf16_f32out(kcuda_ctx *ctx, float *out,
                                                const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                                const float *bias, int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_forward_bf16_f32out", M, K, N);
    return rc < 0 ? rc : forward(ctx, DT_BF16_F32OUT, out, inp, weight, bias, M, K, N);
}

extern "C" int kcuda_matmul_forward_bf16_f32res(kcuda_ctx *ctx, float *out, const float *res,
                                                const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                                const float *bias, int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_forward_bf16_f32res", M, K, N);
    if (rc < 0)
        return rc;
    if (!res)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_matmul_forward_bf16_f32res: NULL res");
    return forward(ctx, DT_BF16_F32OUT, out, inp, weight, bias, M, K, N, res);
}

extern "C" int kcuda_matmul_dinp_bf16_f32out(kcuda_ctx *ctx, float *dinp,
                                             const kcuda_bf16 *dout, int ldd,
                                             const kcuda_bf16 *weight, int M, int K, int N,
                                             int accumulate)
{
    int rc = check_shape(ctx, "kcuda_matmul_dinp_bf16_f32out", M, K, N);
    if (rc < 0)
        return rc;
    if (ldd < N)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_matmul_dinp_bf16_f32out: ldd %d < N %d", ldd,
                          N);
    struct gemm_args g = {DT_BF16_F32OUT, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, weight, K, dout,
                          ldd, dinp, K, accumulate ? 1.0f : 0.0f, NULL, 0, NULL, GEMM_PLAIN,
                          NULL, 0};
    return lt_matmul(ctx, &g);
}

extern "C" int kcuda_matmul_dweight_bf16_f32out(kcuda_ctx *ctx, float *dweight,
                                                const kcuda_bf16 *dout, int ldd,
                                                const kcuda_bf16 *inp, int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_dweight_bf16_f32out", M, K, N);
    if (rc < 0)
        return rc;
    if (ldd < N)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_matmul_dweight_bf16_f32out: ldd %d < N %d",
                          ldd, N);
    struct gemm_args g = {DT_BF16_F32OUT, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, inp, K, dout,
                          ldd, dweight, K, 1.0f, NULL, 0, NULL, GEMM_PLAIN, NULL, 0};
    return lt_matmul(ctx, &g);
}

extern "C" size_t kcuda_bias_partials_floats(int M, int N)
{
    int rows;
    return M > 0 && N > 0 ? (size_t)bias_chunks(M, &rows) * (size_t)N : 0;
}

extern "C" int kcuda_bias_partials_to_bf16(kcuda_ctx *ctx, float *part, const float *dout,
                                           int M, int N, kcuda_bf16 *cvt, int pitch)
{
    int rc = check_shape(ctx, "kcuda_bias_partials_to_bf16", M, 1, N);
    if (rc < 0)
        return rc;
    if (pitch < N)
        return kcuda_fail(ctx, KCUDA_EARG, "kcuda_bias_partials_to_bf16: pitch %d < N %d",
                          pitch, N);
    int rows, chunks = bias_chunks(M, &rows);
    return bias_partials<float>(ctx, part, dout, M, N, rows, chunks, (__nv_bfloat16 *)cvt,
                                pitch);
}

extern "C" int kcuda_bias_partials_bf16(kcuda_ctx *ctx, float *part, const kcuda_bf16 *dout,
                                        int M, int N)
{
    int rc = check_shape(ctx, "kcuda_bias_partials_bf16", M, 1, N);
    if (rc < 0)
        return rc;
    int rows, chunks = bias_chunks(M, &rows);
    return bias_partials<__nv_bfloat16>(ctx, part, (const __nv_bfloat16 *)dout, M, N, rows,
                                        chunks, NULL, 0);
}

extern "C" int kcuda_bias_partials_add(kcuda_ctx *ctx, float *dbias, const float *part, int M,
                                       int N)
{
    int rc = check_shape(ctx, "kcuda_bias_partials_add", M, 1, N);
    if (rc < 0)
        return rc;
    int rows, chunks = bias_chunks(M, &rows);
    return bias_sum<float>(ctx, dbias, part, chunks, N);
}

/* ---- GELU in the epilogue ---------------------------------------------------------- */

extern "C" int kcuda_matmul_forward_bf16_gelu(kcuda_ctx *ctx, kcuda_bf16 *out, kcuda_bf16 *pre,
                                              const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                              const kcuda_bf16 *bias, int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_forward_bf16_gelu", M, K, N);
    if (rc < 0)
        return rc;
    struct gemm_args g = {DT_BF16, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, weight, K, inp, K,
                          out, N, 0.0f, bias, 0, NULL, GEMM_GELU_AUX, pre, N};
    return lt_matmul(ctx, &g);
}

extern "C" int kcuda_matmul_dinp_bf16_dgelu(kcuda_ctx *ctx, kcuda_bf16 *dinp,
                                            const kcuda_bf16 *dout, const kcuda_bf16 *weight,
                                            const kcuda_bf16 *pre, int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_dinp_bf16_dgelu", M, K, N);
    if (rc < 0)
        return rc;
    struct gemm_args g = {DT_BF16, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, weight, K, dout, N,
                          dinp, K, 0.0f, NULL, 0, NULL, GEMM_DGELU, pre, K};
    return lt_matmul(ctx, &g);
}

/* ---- matmul backward with fp32 weight gradients ---------------------------------- */

extern "C" int kcuda_matmul_backward_bf16_f32w(kcuda_ctx *ctx, kcuda_bf16 *dinp,
                                               int dinp_accumulate, float *dweight,
                                               float *dbias_set, const kcuda_bf16 *dout,
                                               const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                               int M, int K, int N)
{
    int rc = check_shape(ctx, "kcuda_matmul_backward_bf16_f32w", M, K, N);
    if (rc < 0)
        return rc;
    if (dbias_set && !dweight)
        return kcuda_fail(ctx, KCUDA_EARG,
                          "kcuda_matmul_backward_bf16_f32w: dbias_set needs dweight");
    if (dinp) {
        struct gemm_args g = {DT_BF16, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, weight, K, dout, N,
                              dinp, K, dinp_accumulate ? 1.0f : 0.0f, NULL, 0, NULL,
                              GEMM_PLAIN, NULL, 0};
        if ((rc = lt_matmul(ctx, &g)) < 0)
            return rc;
    }
    if (dweight) {
        /* B = dout (op T, [N, M] column-major), k = M: BGRADB sums dout over the rows. */
        struct gemm_args g = {DT_BF16_F32OUT, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, inp, K, dout,
                              N, dweight, K, 1.0f, dbias_set, dbias_set != NULL, NULL,
                              GEMM_PLAIN, NULL, 0};
        if ((rc = lt_matmul(ctx, &g)) < 0)
            return rc;
    }
    return KCUDA_OK;
}

/* ---- the algorithm cache, for the other GEMM files (gemm_fp8.cu) ----------------- */

struct kcuda_gemm_entry *kcuda_gemm_cache_slot(kcuda_ctx *ctx, const struct kcuda_gemm_key *key)
{
    return cache_slot(ctx, key);
}

void kcuda_gemm_cache_fill(kcuda_ctx *ctx, struct kcuda_gemm_entry *slot,
                           const struct kcuda_gemm_key *key, const cublasLtMatmulAlgo_t *algo,
                           cublasLtMatmulDesc_t *op, cublasLtMatrixLayout_t *la,
                           cublasLtMatrixLayout_t *lb, cublasLtMatrixLayout_t *lc)
{
    slot->used = 1;
    slot->key = *key;
    slot->algo = *algo;
    slot->op = *op;
    slot->la = *la;
    slot->lb = *lb;
    slot->lc = *lc;
    *op = NULL;
    *la = *lb = *lc = NULL;
    ctx->cache_entries++;
}
