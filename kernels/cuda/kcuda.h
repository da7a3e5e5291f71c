/* kcuda.h - the CUDA kernels of Hearth (kernels/cuda/), the same entry points as the
 * fp32 CPU reference in kernels.h under the kcuda_ prefix.  This is the first slice:
 * matmul (cuBLASLt), RMSNorm, SwiGLU, softmax cross-entropy and AdamW.
 *
 * Conventions (in addition to kernels.h's, which all hold here: row-major contiguous
 * tensors, backward functions ADD (+=) into every gradient, NULL = gradient not wanted):
 *   - Every tensor pointer is a DEVICE pointer (cudaMalloc); nothing here copies to or
 *     from the host, and nothing allocates except kcuda_ctx_create.
 *   - Every call takes a kcuda_ctx and is enqueued on the context's stream (the one given
 *     to kcuda_ctx_create; NULL = the legacy default stream).  Calls return when the work
 *     is enqueued; synchronise the stream before reading results on the host.
 *   - _bf16 entry points store tensors in bf16 (kcuda_bf16, bit-identical to
 *     __nv_bfloat16) and accumulate in fp32; row statistics (rstd) and parameter-sized
 *     reductions that several rows feed (dweight of RMSNorm) are fp32.  _f32 entry points
 *     are fp32 throughout (TF32 is never used: they are the reference-grade path).
 *   - Errors: every function returns 0 or a negative KCUDA_E* code and then leaves a
 *     message in the context (kcuda_ctx_errmsg).  Launch errors are checked after each
 *     launch; errors of the asynchronous work itself show at the next synchronisation.
 *     Nothing here calls exit() or abort().
 *   - No global mutable state: the cuBLASLt handle, its workspace and the per-shape
 *     algorithm cache live in the context.  A context is used by one host thread at a
 *     time.
 */
#ifndef HEARTH_KCUDA_H
#define HEARTH_KCUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t kcuda_bf16;                 /* bf16 bits, as __nv_bfloat16 */
typedef struct CUstream_st *kcuda_stream;    /* = cudaStream_t, without the CUDA headers */
typedef struct kcuda_ctx kcuda_ctx;

enum {
    KCUDA_OK = 0,
    KCUDA_EARG = -1,     /* invalid argument (shape <= 0, NULL required pointer) */
    KCUDA_ECUDA = -2,    /* a CUDA runtime call or kernel launch failed */
    KCUDA_ECUBLAS = -3,  /* a cuBLASLt call failed */
    KCUDA_ENOALGO = -4,  /* cuBLASLt found no algorithm for this shape/alignment */
    KCUDA_ENOMEM = -5    /* host or device allocation failed */
};

/* Creates a context on the current device: cuBLASLt handle, workspace_bytes of device
 * workspace (0 = 32 MiB) and an empty algorithm cache; work goes to `stream`.
 * On failure returns a negative code, *out = NULL, and (if errbuf) a message there.
 * The caller frees the context with kcuda_ctx_free (NULL is fine). */
int kcuda_ctx_create(kcuda_ctx **out, kcuda_stream stream, size_t workspace_bytes,
                     char *errbuf, size_t errlen);
void kcuda_ctx_free(kcuda_ctx *ctx);
/* The message of the last failed call on ctx ("" when none); owned by ctx. */
const char *kcuda_ctx_errmsg(const kcuda_ctx *ctx);
/* Algorithm-cache statistics (for tests and benchmarks): entries, hits, misses. */
void kcuda_ctx_gemm_stats(const kcuda_ctx *ctx, int *entries, long *hits, long *misses);

/* ---- matmul (cuBLASLt) -------------------------------------------------------
 * out[M,N] = inp[M,K] . weight[N,K]^T (+ bias[N]); weight as torch.nn.Linear.
 * Backward: dinp[M,K] += dout . weight; dweight[N,K] += dout^T . inp;
 *           dbias[N] += column sums of dout (fp32 accumulation).
 * The bf16 versions store bf16 and accumulate in fp32 inside cuBLASLt (dweight/dinp
 * are accumulated into bf16 storage with beta = 1). */
int kcuda_matmul_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, const kcuda_bf16 *inp,
                              const kcuda_bf16 *weight, const kcuda_bf16 *bias,
                              int M, int K, int N);
int kcuda_matmul_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, kcuda_bf16 *dweight,
                               kcuda_bf16 *dbias, const kcuda_bf16 *dout,
                               const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                               int M, int K, int N);
int kcuda_matmul_forward_f32(kcuda_ctx *ctx, float *out, const float *inp,
                             const float *weight, const float *bias, int M, int K, int N);
int kcuda_matmul_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight,
                              int M, int K, int N);

/* ---- RMSNorm -------------------------------------------------------------------
 * out = inp * rstd * weight, rstd[N] = 1/sqrt(mean(inp^2) + eps) (fp32, saved).
 * Backward: dinp += ...; dweight[C] += sum over rows of dout * inp * rstd.  dweight is
 * fp32 in both versions (it sums over all rows: bf16 storage would lose the small
 * contributions); the reduction order is fixed, so results are deterministic. */
int kcuda_rmsnorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, float *rstd,
                               const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                               int N, int C, float eps);
int kcuda_rmsnorm_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, float *dweight,
                                const kcuda_bf16 *dout, const kcuda_bf16 *inp,
                                const kcuda_bf16 *weight, const float *rstd, int N, int C);
int kcuda_rmsnorm_forward_f32(kcuda_ctx *ctx, float *out, float *rstd, const float *inp,
                              const float *weight, int N, int C, float eps);
int kcuda_rmsnorm_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight,
                               const float *dout, const float *inp, const float *weight,
                               const float *rstd, int N, int C);

/* ---- SwiGLU --------------------------------------------------------------------
 * inp [N, 2F]: gate in columns [0,F), up in [F,2F); out [N,F] = silu(gate) * up.
 * Backward: dinp [N,2F] += (d gate, d up). */
int kcuda_swiglu_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, const kcuda_bf16 *inp,
                              int N, int F);
int kcuda_swiglu_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, const kcuda_bf16 *dout,
                               const kcuda_bf16 *inp, int N, int F);
int kcuda_swiglu_forward_f32(kcuda_ctx *ctx, float *out, const float *inp, int N, int F);
int kcuda_swiglu_backward_f32(kcuda_ctx *ctx, float *dinp, const float *dout,
                              const float *inp, int N, int F);

/* ---- softmax cross-entropy (fp32 logits) --------------------------------------
 * As kcpu_crossentropy_*: losses[i] = logsumexp(logits[i,:]) - logits[i,targets[i]],
 * 0 for ignore_index rows, NaN for a target outside [0,V).  Backward:
 * dlogits[i,:] += dlosses[i] * (softmax - onehot); nothing for ignored/invalid rows.
 * targets and dlosses are device arrays. */
int kcuda_crossentropy_forward_f32(kcuda_ctx *ctx, float *losses, const float *logits,
                                   const int *targets, int N, int V, int ignore_index);
int kcuda_crossentropy_backward_f32(kcuda_ctx *ctx, float *dlogits, const float *logits,
                                    const int *targets, const float *dlosses, int N, int V,
                                    int ignore_index);

/* ---- AdamW (fp32 master weights) ----------------------------------------------
 * As kcpu_adamw_update on fp32 param/grad/m/v; when param_bf16 is not NULL the updated
 * parameters are also written there rounded to bf16 (the copy the bf16 forward reads). */
int kcuda_adamw_update(kcuda_ctx *ctx, float *param, kcuda_bf16 *param_bf16,
                       const float *grad, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int step);

#ifdef __cplusplus
}
#endif

#endif
