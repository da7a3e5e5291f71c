/* ctx.cu - the kcuda context: stream, cuBLASLt handle, workspace, errors. */
#include "cuda/kcuda_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define DEFAULT_WORKSPACE (32u << 20)

int kcuda_fail(kcuda_ctx *ctx, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->msg, sizeof ctx->msg, fmt, ap);
    va_end(ap);
    return code;
}

int kcuda_check_launch(kcuda_ctx *ctx, const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return kcuda_fail(ctx, KCUDA_ECUDA, "%s: %s", what, cudaGetErrorString(e));
    return KCUDA_OK;
}

static int create_fail(char *errbuf, size_t errlen, int code, const char *what,
                       const char *why)
{
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "kcuda_ctx_create: %s: %s", what, why);
    return code;
}

int kcuda_ctx_create(kcuda_ctx **out, kcuda_stream stream, size_t workspace_bytes,
                     char *errbuf, size_t errlen)
{
    *out = NULL;
    kcuda_ctx *ctx = (kcuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx)
        return create_fail(errbuf, errlen, KCUDA_ENOMEM, "calloc", "out of memory");
    ctx->stream = (cudaStream_t)stream;
    ctx->workspace_bytes = workspace_bytes ? workspace_bytes : DEFAULT_WORKSPACE;
    cublasStatus_t bs = cublasLtCreate(&ctx->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        free(ctx);
        return create_fail(errbuf, errlen, KCUDA_ECUBLAS, "cublasLtCreate",
                           cublasLtGetStatusString(bs));
    }
    cudaError_t e = cudaMalloc(&ctx->workspace, ctx->workspace_bytes);
    if (e != cudaSuccess) {
        cublasLtDestroy(ctx->lt);
        free(ctx);
        return create_fail(errbuf, errlen, KCUDA_ENOMEM, "cudaMalloc(workspace)",
                           cudaGetErrorString(e));
    }
    *out = ctx;
    return KCUDA_OK;
}

void kcuda_ctx_free(kcuda_ctx *ctx)
{
    if (!ctx)
        return;
    for (int i = 0; i < KCUDA_GEMM_CACHE; i++) {
        struct kcuda_gemm_entry *e = &ctx->cache[i];
        if (!e->used)
            continue;
        cublasLtMatrixLayoutDestroy(e->lc);
        cublasLtMatrixLayoutDestroy(e->lb);
        cublasLtMatrixLayoutDestroy(e->la);
        cublasLtMatmulDescDestroy(e->op);
    }
    cudaFree(ctx->workspace);
    cublasLtDestroy(ctx->lt);
    free(ctx);
}

const char *kcuda_ctx_errmsg(const kcuda_ctx *ctx)
{
    return ctx->msg;
}

void kcuda_ctx_set_f32_math(kcuda_ctx *ctx, int math)
{
    ctx->f32_math = math == KCUDA_F32_BF16 ? KCUDA_F32_BF16 : KCUDA_F32_EXACT;
}

void kcuda_ctx_gemm_stats(const kcuda_ctx *ctx, int *entries, long *hits, long *misses)
{
    if (entries)
        *entries = ctx->cache_entries;
    if (hits)
        *hits = ctx->cache_hits;
    if (misses)
        *misses = ctx->cache_misses;
}
