/* kdev_cuda.cu - the cuda device backend: its state (one stream, a kcuda context on it,
 * the allocation map, a scratch buffer), the error helpers, the ops table and the entry
 * point that kernels/kdev.c finds with dlsym (KDEV_CUDA_ENTRY).
 *
 * The device is the CUDA device current when kdev_create runs: a rank that owns one GPU
 * selects it first (cudaSetDevice) and every call here then stays on it. */
#include "cuda/kdev_cuda_internal.h"

#include <cublasLt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The scratch starts small (reductions need a few KiB) and grows on the first op that
 * needs more (attention backward, embedding backward, MoE permutation inverses). */
#define SCRATCH_INIT (64u << 10)

int cuda_err(kdev *d, cudaError_t e, const char *op)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError(); /* clear a non-sticky error so that later calls may work */
    return kdev_fail(d, e == cudaErrorMemoryAllocation ? HERR_NOMEM : HERR_DEVICE, "%s: %s",
                     op, cudaGetErrorString(e));
}

int cuda_launched(kdev *d, const char *op)
{
    return cuda_err(d, cudaGetLastError(), op);
}

int cuda_kc(kdev *d, int rc, const char *op)
{
    if (rc >= 0)
        return 0;
    return kdev_fail(d, rc, "%s: %s", op, kcuda_ctx_errmsg(cuda_st(d)->k));
}

int cuda_scratch(kdev *d, size_t bytes, void **p, const char *op)
{
    cuda_state *s = cuda_st(d);
    if (bytes > s->scratch_bytes) {
        size_t want = s->scratch_bytes * 2 > bytes ? s->scratch_bytes * 2 : bytes;
        /* earlier ops of the stream may still read the old buffer */
        int rc = cuda_err(d, cudaStreamSynchronize(s->stream), op);
        if (rc)
            return rc;
        cudaFree(s->scratch);
        s->scratch = NULL;
        s->scratch_bytes = 0;
        cudaError_t e = cudaMalloc(&s->scratch, want);
        if (e != cudaSuccess) {
            s->scratch = NULL;
            (void)cudaGetLastError();
            return kdev_fail(d, HERR_NOMEM, "%s: %zu bytes of device scratch: %s", op, want,
                             cudaGetErrorString(e));
        }
        s->scratch_bytes = want;
    }
    *p = s->scratch;
    return 0;
}

static void cuda_fini(kdev *d)
{
    cuda_state *s = cuda_st(d);
    if (!s)
        return;
    if (s->stream)
        cudaStreamSynchronize(s->stream);
    cuda_release_all(d); /* blocks the caller did not release: not leaked past the device */
    free(s->map);
    free(s->act);
    if (s->marks)
        for (int k = 0; k < KDEV_PROF_MARKS; k++)
            if (s->marks[k])
                cudaEventDestroy(s->marks[k]);
    free(s->marks);
    cudaFree(s->scratch);
    kcuda_ctx_free(s->k);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    free(s);
    d->impl = NULL;
}

static int cuda_init(kdev *d)
{
    int ndev = 0, dev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        (void)cudaGetLastError();
        return kdev_fail(d, HERR_DEVICE, "no CUDA device answers (%s)",
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!s)
        return kdev_fail(d, HERR_NOMEM, "init: out of host memory");
    d->impl = s;
    int rc;
    cudaDeviceProp prop;
    if ((rc = cuda_err(d, cudaGetDevice(&dev), "init: cudaGetDevice")) ||
        (rc = cuda_err(d, cudaGetDeviceProperties(&prop, dev), "init: cudaGetDeviceProperties")))
        goto fail;
    snprintf(s->hw, sizeof s->hw, "%s", prop.name);
    /* non-blocking: the legacy default stream of other code in the process never
     * serialises with this device's work */
    if ((rc = cuda_err(d, cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                       "init: cudaStreamCreate")))
        goto fail;
    {
        char err[256];
        int krc = kcuda_ctx_create(&s->k, (kcuda_stream)s->stream, 0, err, sizeof err);
        if (krc < 0) {
            rc = kdev_fail(d, krc, "init: %s", err);
            goto fail;
        }
    }
    if ((rc = cuda_err(d, cudaMalloc(&s->scratch, SCRATCH_INIT), "init: scratch")))
        goto fail;
    s->scratch_bytes = SCRATCH_INIT;
    return 0;
fail:
    cuda_fini(d);
    return rc;
}

static const char *cuda_hw_name(const kdev *d)
{
    return cuda_st(d)->hw;
}

static int cuda_lib_version(const kdev *d, kdev_lib lib)
{
    (void)d;
    int v = 0;
    if (lib == KDEV_LIB_CUDA_RUNTIME && cudaRuntimeGetVersion(&v) != cudaSuccess)
        v = 0;
    if (lib == KDEV_LIB_CUBLASLT)
        v = (int)cublasLtGetVersion();
    return v;
}

static int cuda_prof_mark(kdev *d, int i)
{
    cuda_state *s = cuda_st(d);
    if (!s->marks) {
        s->marks = (cudaEvent_t *)calloc(KDEV_PROF_MARKS, sizeof *s->marks);
        if (!s->marks)
            return kdev_fail(d, HERR_NOMEM, "profile: out of memory");
        for (int k = 0; k < KDEV_PROF_MARKS; k++) {
            int rc = cuda_err(d, cudaEventCreate(&s->marks[k]), "profile: cudaEventCreate");
            if (rc)
                return rc;
        }
    }
    return cuda_err(d, cudaEventRecord(s->marks[i], s->stream), "profile: cudaEventRecord");
}

static int cuda_prof_read(kdev *d, double *ms, int n)
{
    cuda_state *s = cuda_st(d);
    int rc = cuda_err(d, cudaEventSynchronize(s->marks[n - 1]), "profile: synchronize");
    for (int i = 0; !rc && i + 1 < n; i++) {
        float t = 0;
        rc = cuda_err(d, cudaEventElapsedTime(&t, s->marks[i], s->marks[i + 1]),
                      "profile: cudaEventElapsedTime");
        ms[i] = t;
    }
    cudaEvent_t last = s->marks[n - 1];   /* becomes mark 0 */
    s->marks[n - 1] = s->marks[0];
    s->marks[0] = last;
    return rc;
}

static int cuda_set_precision(kdev *d, kdev_precision p)
{
    if (p != KDEV_PREC_FP32 && p != KDEV_PREC_BF16)
        return kdev_fail(d, HERR_ARG, "set_precision: unknown precision %d", (int)p);
    if (cuda_st(d)->act_n && p != cuda_st(d)->prec)
        return kdev_fail(d, HERR_CONFIG, "set_precision: bf16 activation memory is held "
                         "(release it first)");
    cuda_st(d)->prec = p;
    kcuda_ctx_set_f32_math(cuda_st(d)->k, p == KDEV_PREC_BF16 ? KCUDA_F32_BF16 : KCUDA_F32_EXACT);
    return 0;
}

/* In kdev_ops order (C++ wants designators in declaration order). */
static const kdev_ops cuda_ops = {
    .abi = KDEV_ABI,
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
    .hw_name = cuda_hw_name,
    .lib_version = cuda_lib_version,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .copy_2d = cuda_copy_2d,
    .zero = cuda_zero,
    .fill = cuda_fill,
    .sync = cuda_sync,
    .set_precision = cuda_set_precision,
    .act_bytes = cuda_act_bytes,
    .alloc_act = cuda_alloc_act,
    .act_copy_2d = cuda_act_copy_2d,
    .mem_stats = cuda_mem_stats,
    .prof_mark = cuda_prof_mark,
    .prof_read = cuda_prof_read,
    .gather_rows = cuda_gather_rows,
    .scatter_rows = cuda_scatter_rows,
    .add_bias = cuda_add_bias,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .add = cuda_add,
    .accumulate = cuda_accumulate,
    .scale = cuda_scale,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .attention_block_forward = cuda_attention_block_forward,
    .attention_block_backward = cuda_attention_block_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .ce_rowmax = cuda_ce_rowmax,
    .ce_rowsum = cuda_ce_rowsum,
    .ce_grad = cuda_ce_grad,
    .ce_finish = cuda_ce_finish,
    .head_ce_forward = cuda_head_ce_forward,
    .head_ce_backward = cuda_head_ce_backward,
    .moe_router_forward = cuda_moe_router_forward,
    .moe_router_backward = cuda_moe_router_backward,
    .moe_plan = cuda_moe_plan,
    .moe_permute_forward = cuda_moe_permute_forward,
    .moe_permute_backward = cuda_moe_permute_backward,
    .moe_unpermute_forward = cuda_moe_unpermute_forward,
    .moe_unpermute_backward = cuda_moe_unpermute_backward,
    .amax = cuda_amax,
    .fp8_qdq = cuda_fp8_qdq,
    .fp8_matmul_forward = cuda_fp8_matmul_forward,
    .fp8_matmul_backward = cuda_fp8_matmul_backward,
    .adamw_update = cuda_adamw_update,
    .sumsq = cuda_sumsq,
    .sumsq_multi = cuda_sumsq_multi,
    .adamw_multi = cuda_adamw_multi,
};

extern "C" __attribute__((visibility("default"))) const kdev_ops *KDEV_CUDA_ENTRY(void)
{
    return &cuda_ops;
}
