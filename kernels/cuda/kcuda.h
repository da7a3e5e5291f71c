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

#include "kerr.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t kcuda_bf16;                 /* bf16 bits, as __nv_bfloat16 */
typedef struct CUstream_st *kcuda_stream;    /* = cudaStream_t, without the CUDA headers */
typedef struct kcuda_ctx kcuda_ctx;

/* The project's error codes (kerr.h) under the names these kernels have always used. */
enum {
    KCUDA_OK = HERR_OK,
    KCUDA_EARG = HERR_ARG,         /* invalid argument (shape <= 0, NULL required pointer) */
    KCUDA_ECUDA = HERR_DEVICE,     /* a CUDA runtime call or kernel launch failed */
    KCUDA_ECUBLAS = HERR_DEVLIB,   /* a cuBLASLt call failed */
    KCUDA_ENOALGO = HERR_NOALGO,   /* cuBLASLt found no algorithm for this shape/alignment */
    KCUDA_ENOMEM = HERR_NOMEM      /* host or device allocation failed */
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
/* How the _f32 GEMMs multiply: KCUDA_F32_EXACT (the default: fp32 math, never TF32) or
 * KCUDA_F32_BF16 (the operands rounded to bf16 on the tensor cores, fp32 accumulation
 * and output: CUBLAS_COMPUTE_32F_FAST_16BF; a shape cuBLASLt has no such algorithm for
 * runs exactly).  Applies to later calls on ctx. */
enum { KCUDA_F32_EXACT = 0, KCUDA_F32_BF16 = 1 };
void kcuda_ctx_set_f32_math(kcuda_ctx *ctx, int math);
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

/* bf16 operands, fp32 outputs (fp32 accumulation): out[M,N] = inp . weight^T (+ bias[N],
 * fp32), written; dinp[M,K] += dout . weight; dweight[N,K] += dout^T . inp.  dout's rows
 * are ldd >= N elements apart (a pitch padded to 8 elements keeps the bf16 rows 16-byte
 * aligned whatever N is, e.g. a vocabulary of 50257).  The f32 backward's bias gradient sums the rows in
 * two passes (fixed row chunks into workspace partials, then the chunks in order:
 * deterministic; 4 * N * chunks bytes of workspace, chunks <= 128). */
int kcuda_matmul_forward_bf16_f32out(kcuda_ctx *ctx, float *out, const kcuda_bf16 *inp,
                                     const kcuda_bf16 *weight, const float *bias, int M, int K,
                                     int N);
/* out = res + inp . weight^T (+ bias): the residual added in the GEMM's epilogue (res
 * fp32 [M, N], read through cuBLASLt's C; out may be res itself). */
int kcuda_matmul_forward_bf16_f32res(kcuda_ctx *ctx, float *out, const float *res,
                                     const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                     const float *bias, int M, int K, int N);
/* dinp += (accumulate) or = the product. */
int kcuda_matmul_dinp_bf16_f32out(kcuda_ctx *ctx, float *dinp, const kcuda_bf16 *dout,
                                  int ldd, const kcuda_bf16 *weight, int M, int K, int N,
                                  int accumulate);
int kcuda_matmul_dweight_bf16_f32out(kcuda_ctx *ctx, float *dweight, const kcuda_bf16 *dout,
                                     int ldd, const kcuda_bf16 *inp, int M, int K, int N);
/* The bias gradient of kcuda_matmul_backward_f32 in two calls around the GEMMs, its one
 * pass over the fp32 dout[M,N] also writing the GEMMs' bf16 operand:
 *   to_bf16: part = the column sums of fixed row chunks (kcuda_bias_partials_floats(M, N)
 *            floats of device memory, the caller's) and cvt = bf16(dout), rows `pitch`
 *            >= N apart, pad columns zero;
 *   add:     dbias[N] += the chunks' sums in order (deterministic). */
size_t kcuda_bias_partials_floats(int M, int N);
int kcuda_bias_partials_to_bf16(kcuda_ctx *ctx, float *part, const float *dout, int M, int N,
                                kcuda_bf16 *cvt, int pitch);
int kcuda_bias_partials_add(kcuda_ctx *ctx, float *dbias, const float *part, int M, int N);
/* The same partial sums from a bf16 dout [M, N] (rows N apart), nothing converted. */
int kcuda_bias_partials_bf16(kcuda_ctx *ctx, float *part, const kcuda_bf16 *dout, int M, int N);

/* ---- RMSNorm -------------------------------------------------------------------
 * out = inp * rstd * weight, rstd[N] = 1/sqrt(mean(inp^2) + eps) (fp32, saved).
 * Backward: dinp += ...; dweight[C] += sum over rows of dout * inp * rstd.  dweight is
 * fp32 in both versions (it sums over all rows: bf16 storage would lose the small
 * contributions); the reduction order is fixed, so results are deterministic (two passes
 * over fixed row chunks, 4 * C * chunks bytes of workspace, chunks <= 128). */
int kcuda_rmsnorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, float *rstd,
                               const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                               int N, int C, float eps);
int kcuda_rmsnorm_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, float *dweight,
                                const kcuda_bf16 *dout, const kcuda_bf16 *inp,
                                const kcuda_bf16 *weight, const float *rstd, int N, int C);
int kcuda_rmsnorm_forward_f32(kcuda_ctx *ctx, float *out, float *rstd, const float *inp,
                              const float *weight, int N, int C, float eps);
/* fp32 input and weight, bf16 output (an activation stored in bf16, kdev.h). */
int kcuda_rmsnorm_forward_f32_bf16out(kcuda_ctx *ctx, kcuda_bf16 *out, float *rstd,
                                      const float *inp, const float *weight, int N, int C,
                                      float eps);
int kcuda_rmsnorm_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight,
                               const float *dout, const float *inp, const float *weight,
                               const float *rstd, int N, int C);

/* ---- SwiGLU --------------------------------------------------------------------
 * inp [N, 2F]: gate in columns [0,F), up in [F,2F); out [N,F] = silu(gate) * up.
 * Backward: dinp [N,2F] += (d gate, d up), or = with accumulate 0. */
int kcuda_swiglu_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, const kcuda_bf16 *inp,
                              int N, int F);
int kcuda_swiglu_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, const kcuda_bf16 *dout,
                               const kcuda_bf16 *inp, int N, int F, int accumulate);
int kcuda_swiglu_forward_f32(kcuda_ctx *ctx, float *out, const float *inp, int N, int F);
int kcuda_swiglu_forward_f32_bf16out(kcuda_ctx *ctx, kcuda_bf16 *out, const float *inp,
                                     int N, int F);
int kcuda_swiglu_backward_f32(kcuda_ctx *ctx, float *dinp, const float *dout,
                              const float *inp, int N, int F, int accumulate);
/* fp32 inp; dinp and dout each fp32 or bf16 (*_bf16 set): activations stored in bf16
 * beside it (kdev.h's activation memory). */
int kcuda_swiglu_backward_f32in(kcuda_ctx *ctx, void *dinp, int dinp_bf16, const void *dout,
                                int dout_bf16, const float *inp, int N, int F, int accumulate);

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

/* ---- elementwise, normalisation and optimizer kernels -------------------------
 * Same semantics as the kcpu_ functions of the same name (kernels.h); bf16 storage with
 * fp32 arithmetic unless said otherwise.  Some of these use the context's workspace
 * (kcuda_ctx_create's workspace_bytes) as scratch, in stream order, as the GEMMs do;
 * the sizes they need are stated, and a call whose need exceeds it fails with
 * KCUDA_ENOMEM before launching anything.
 *
 * LayerNorm: out = (inp - mean) * rstd * weight + bias (bias may be NULL); mean and rstd
 * [N] are fp32 (either may be NULL in the forward; the backward needs both).  Backward:
 * dinp += ..., dweight[C] += sum_rows dout * xhat, dbias[C] += sum_rows dout (fp32, any
 * may be NULL).  The column sums run in two passes (fixed row chunks into workspace
 * partials, then the chunks in order): deterministic; workspace 16 * C * chunks bytes
 * with chunks = min(64, ceil(N / 64)), falling back to one pass when that does not fit. */
int kcuda_layernorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, float *mean, float *rstd,
                                 const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                 const kcuda_bf16 *bias, int N, int C, float eps);
int kcuda_layernorm_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, float *dweight,
                                  float *dbias, const kcuda_bf16 *dout, const kcuda_bf16 *inp,
                                  const kcuda_bf16 *weight, const float *mean,
                                  const float *rstd, int N, int C);
int kcuda_layernorm_forward_f32(kcuda_ctx *ctx, float *out, float *mean, float *rstd,
                                const float *inp, const float *weight, const float *bias,
                                int N, int C, float eps);
int kcuda_layernorm_forward_f32_bf16out(kcuda_ctx *ctx, kcuda_bf16 *out, float *mean,
                                        float *rstd, const float *inp, const float *weight,
                                        const float *bias, int N, int C, float eps);
int kcuda_layernorm_backward_f32(kcuda_ctx *ctx, float *dinp, float *dweight, float *dbias,
                                 const float *dout, const float *inp, const float *weight,
                                 const float *mean, const float *rstd, int N, int C);

/* Fused residual add + norm: sum = x + r (rounded to the storage type, written), then
 * out = norm(sum) from the stored (rounded) sum, as the plain forward would compute it
 * from that sum (up to fp32 summation order).  sum may alias x or r
 * (the in-place residual-stream update).  The backward of these is the plain backward
 * with inp = sum and dinp = the gradient of the residual stream: it accumulates (+=) the
 * norm's input gradient into it, e.g. kcuda_rmsnorm_backward_bf16(ctx, dresid, dweight,
 * dout, sum, weight, rstd, N, C); d x = d r = that gradient. */
int kcuda_residual_rmsnorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, kcuda_bf16 *sum,
                                        float *rstd, const kcuda_bf16 *x, const kcuda_bf16 *r,
                                        const kcuda_bf16 *weight, int N, int C, float eps);
int kcuda_residual_layernorm_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, kcuda_bf16 *sum,
                                          float *mean, float *rstd, const kcuda_bf16 *x,
                                          const kcuda_bf16 *r, const kcuda_bf16 *weight,
                                          const kcuda_bf16 *bias, int N, int C, float eps);

/* RoPE, in place on x [N, H, D] from fp32 cos/sin tables [N, D/2] built on the host by
 * kcpu_rope_table_1d/_mrope/_2d and uploaded ("rotate half" pairing; the three kinds
 * differ only in the tables).  The backward rotates by the opposite angle, in place. */
int kcuda_rope_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *x, const float *cos, const float *sin,
                            int N, int H, int D);
int kcuda_rope_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dx, const float *cos,
                             const float *sin, int N, int H, int D);
int kcuda_rope_forward_f32(kcuda_ctx *ctx, float *x, const float *cos, const float *sin, int N,
                           int H, int D);
int kcuda_rope_backward_f32(kcuda_ctx *ctx, float *dx, const float *cos, const float *sin,
                            int N, int H, int D);

/* GELU over n elements; kind as kgelu_kind in kernels.h (0 = tanh approximation,
 * 1 = exact erf).  Backward: dinp += dout * gelu'(inp), or = with accumulate 0. */
int kcuda_gelu_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, const kcuda_bf16 *inp, size_t n,
                            int kind);
int kcuda_gelu_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, const kcuda_bf16 *dout,
                             const kcuda_bf16 *inp, size_t n, int kind, int accumulate);
int kcuda_gelu_forward_f32(kcuda_ctx *ctx, float *out, const float *inp, size_t n, int kind);
int kcuda_gelu_forward_f32_bf16out(kcuda_ctx *ctx, kcuda_bf16 *out, const float *inp,
                                   size_t n, int kind);
int kcuda_gelu_backward_f32(kcuda_ctx *ctx, float *dinp, const float *dout, const float *inp,
                            size_t n, int kind, int accumulate);
/* fp32 inp; dinp and dout each fp32 or bf16 (*_bf16 set), as the SwiGLU one. */
int kcuda_gelu_backward_f32in(kcuda_ctx *ctx, void *dinp, int dinp_bf16, const void *dout,
                              int dout_bf16, const float *inp, size_t n, int kind,
                              int accumulate);

/* Embedding: out[N,C] = table[ids[i], :] (ids a device array, trusted to lie in the
 * table, as in kernels.h).  Backward: dtable[ids[i], :] += dout[i, :] into an fp32 table,
 * deterministic: the (id, token) pairs are radix-sorted (stable) in the workspace, and
 * each distinct id's row is summed by one thread per column in token order, starting
 * from the old value, as kcpu_embedding_backward does.  Workspace: 12 * N bytes plus the
 * sort's scratch (CUB's; a few KiB plus about 8 * N). */
int kcuda_embedding_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, const int *ids,
                                 const kcuda_bf16 *table, int N, int C);
int kcuda_embedding_backward_bf16(kcuda_ctx *ctx, float *dtable, const kcuda_bf16 *dout,
                                  const int *ids, int N, int C);
int kcuda_embedding_forward_f32(kcuda_ctx *ctx, float *out, const int *ids, const float *table,
                                int N, int C);
int kcuda_embedding_backward_f32(kcuda_ctx *ctx, float *dtable, const float *dout,
                                 const int *ids, int N, int C);

/* Multi-tensor kernels: one launch over many tensors, described by a DEVICE array of
 * descriptors (built and uploaded once by the caller; the buffers they point to persist
 * across steps).  The tensors are cut into fixed chunks of KCUDA_MT_CHUNK elements; a
 * fixed number of blocks (independent of the GPU) walks the chunks, so results are the
 * same on every run and every device.  Workspace: 4 * (ntensors + 1) bytes plus, for the
 * sum of squares, 8 * 1024 bytes. */
#define KCUDA_MT_CHUNK 16384

typedef struct {
    const float *p;
    size_t n;
} kcuda_tensor_f32;

/* *sumsq (one device double, overwritten) = sum over the tensors of kcpu_sumsq, i.e. the
 * squared global gradient norm.  Double accumulation, fixed order: per-chunk sums, then
 * per-block sums, then one block adds the block sums in a fixed tree. */
int kcuda_multi_sumsq_f32(kcuda_ctx *ctx, double *sumsq, const kcuda_tensor_f32 *tensors,
                          int ntensors);
/* *factor (one device float) = kcpu_clip_factor(sqrt(*sumsq), max_norm), computed on the
 * device so that clipping needs no host synchronisation.  sumsq may be the result of an
 * all-reduce of the ranks' kcuda_multi_sumsq_f32 outputs. */
int kcuda_clip_factor(kcuda_ctx *ctx, float *factor, const double *sumsq, float max_norm);

typedef struct {
    float *param;            /* fp32 master weights [n], updated */
    kcuda_bf16 *param_bf16;  /* bf16 working copy [n], rewritten; NULL = none */
    const float *grad;       /* fp32 gradient [n], read */
    float *m, *v;            /* fp32 moments [n], updated */
    size_t n;
    int decay;               /* nonzero: weight_decay applies to this tensor */
} kcuda_adamw_tensor;

/* For every tensor: g = grad * clip (fp32 product, as kcpu_scale), then exactly the
 * arithmetic of kcpu_adamw_update (double per element, no contraction, one rounding per
 * stored value) with weight decay weight_decay or 0 by the tensor's flag.  clip is a
 * device float (e.g. kcuda_clip_factor's output) or NULL for 1. */
int kcuda_multi_adamw_update(kcuda_ctx *ctx, const kcuda_adamw_tensor *tensors, int ntensors,
                             const float *clip, float lr, float beta1, float beta2, float eps,
                             float weight_decay, int step);

/* ---- fused cross-entropy (bf16 logits) ----------------------------------------
 * As kcpu_crossentropy_* on bf16 logits [N,V], without any fp32 copy of the logits:
 *   forward: one pass over each row (online max and sum of exp, fp32), writes
 *     losses[i] (fp32) and lse[i] = logsumexp(logits[i,:]) (fp32, what the backward
 *     reads).  ignore_index rows: loss 0, lse 0, the row is not read.  A target
 *     outside [0,V) that is not ignore_index: loss NaN, lse 0.
 *   backward: dlogits[i,:] = dlosses[i] * (softmax(logits[i,:]) - onehot(targets[i]))
 *     in bf16, from the saved lse (one read, one write per element).  It WRITES (=, not
 *     +=): dlogits may be the logits buffer itself (in place) or a bf16 buffer of the
 *     same shape that does not overlap it.  Ignored and invalid rows are written as zeros.
 * Rows are independent and each row is reduced in a fixed order: results are
 * deterministic.  logits/dlogits need 2-byte alignment only (any V). */
int kcuda_ce_forward_bf16(kcuda_ctx *ctx, float *losses, float *lse, const kcuda_bf16 *logits,
                          const int *targets, int N, int V, int ignore_index);
int kcuda_ce_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dlogits, const kcuda_bf16 *logits,
                           const float *lse, const int *targets, const float *dlosses,
                           int N, int V, int ignore_index);
/* The same over rows ld >= V elements apart (e.g. padded to 16-byte rows; the columns
 * [V, ld) are neither read nor written). */
int kcuda_ce_forward_bf16_ld(kcuda_ctx *ctx, float *losses, float *lse, const kcuda_bf16 *logits,
                             int ld, const int *targets, int N, int V, int ignore_index);
int kcuda_ce_backward_bf16_ld(kcuda_ctx *ctx, kcuda_bf16 *dlogits, const kcuda_bf16 *logits,
                              int ld, const float *lse, const int *targets,
                              const float *dlosses, int N, int V, int ignore_index);

/* Vocab-parallel building blocks: a rank holds the columns [v0, v0+Vs) of a vocabulary
 * of V, as a contiguous bf16 [N,Vs] slice.
 *   partial: rowmax[i] = max over the slice, rowsum[i] = sum exp(l - rowmax[i]),
 *     tlogit[i] = logits[i, targets[i]-v0] when the target falls in the slice, else 0.
 *     Ignored/invalid rows: 0, 0, 0 (their slice is not read).
 *   combine: after the R ranks' partials are gathered as [R,N] arrays (rank-major),
 *     losses and lse as kcuda_ce_forward_bf16 defines them (equal up to the order of
 *     the sums; tlogit is summed over ranks: only the owner's is nonzero).
 *   backward: as kcuda_ce_backward_bf16 on the slice, the onehot at targets[i]-v0. */
int kcuda_ce_vocab_partial_bf16(kcuda_ctx *ctx, float *rowmax, float *rowsum, float *tlogit,
                                const kcuda_bf16 *logits, const int *targets, int N, int V,
                                int v0, int Vs, int ignore_index);
int kcuda_ce_vocab_combine(kcuda_ctx *ctx, float *losses, float *lse, const float *rowmax,
                           const float *rowsum, const float *tlogit, const int *targets, int N,
                           int V, int R, int ignore_index);
int kcuda_ce_vocab_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dlogits, const kcuda_bf16 *logits,
                                 const float *lse, const int *targets, const float *dlosses,
                                 int N, int V, int v0, int Vs, int ignore_index);

/* ---- mixture of experts ------------------------------------------------------------
 * As kcpu_moe_* (kernels.h), with these differences:
 *   - router: fp32 logits/probs/weights (routing decisions want fp32).  The forward also
 *     writes counts[E] (pairs routed to each expert), which the backward's aux term
 *     reads instead of recounting; aux (device scalar) may be NULL.  daux is a host
 *     value.  Needs 1 <= K <= E <= 1024 and K <= 32.  Ties in probability: lower expert
 *     index first, as the reference.
 *   - plan: one block, deterministic and stable in (token, slot) order; needs E <= 1024.
 *     Pairs naming an expert outside [0,E) are left out (their rows are not written).
 *   - permute/unpermute move bf16 rows with fp32 sums; topk_w/dtopk_w are fp32.  The
 *     permute backward gathers through slot_row (not row_src), so that every token row
 *     sums its K copies in slot order with no atomics: deterministic.
 *   - expert MLPs: E SwiGLU MLPs over the expert-ordered rows xp [R,H] (R = offsets[E]):
 *       hp = xp_e . gate_up[e]^T  [n_e, 2Fm]   (gate_up [E, 2Fm, H]; gate rows [0,Fm))
 *       ap = swiglu(hp)           [n_e, Fm]
 *       yp = ap . down[e]^T       [n_e, H]     (down [E, H, Fm])
 *     one cuBLASLt GEMM per non-empty expert through kcuda_matmul_*; the group sizes come
 *     from offsets_host (a HOST copy of the plan's offsets[E+1]), so nothing synchronises.
 *     hp and ap are saved for the backward.  Backward: dxp, dgate_up, ddown += ...;
 *     dap [R,Fm] and dhp [R,2Fm] are caller scratch (overwritten). */
int kcuda_moe_router_forward(kcuda_ctx *ctx, int *topk_idx, float *topk_w, float *probs,
                             int *counts, float *aux, const float *logits, int N, int E,
                             int K);
int kcuda_moe_router_backward(kcuda_ctx *ctx, float *dlogits, const float *dtopk_w, float daux,
                              const float *probs, const int *topk_idx, const float *topk_w,
                              const int *counts, int N, int E, int K);
int kcuda_moe_plan(kcuda_ctx *ctx, int *offsets, int *row_src, int *slot_row,
                   const int *topk_idx, int N, int E, int K);
int kcuda_moe_permute_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, const kcuda_bf16 *inp,
                                   const int *row_src, int N, int K, int C);
int kcuda_moe_permute_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dinp, const kcuda_bf16 *dout,
                                    const int *slot_row, int N, int K, int C);
int kcuda_moe_unpermute_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out,
                                     const kcuda_bf16 *expert_out, const float *topk_w,
                                     const int *slot_row, int N, int K, int C);
int kcuda_moe_unpermute_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dexpert_out, float *dtopk_w,
                                      const kcuda_bf16 *dout, const kcuda_bf16 *expert_out,
                                      const float *topk_w, const int *slot_row, int N, int K,
                                      int C);
int kcuda_moe_experts_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *yp, kcuda_bf16 *hp,
                                   kcuda_bf16 *ap, const kcuda_bf16 *xp,
                                   const kcuda_bf16 *gate_up, const kcuda_bf16 *down,
                                   const int *offsets_host, int E, int H, int Fm);
int kcuda_moe_experts_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dxp, kcuda_bf16 *dgate_up,
                                    kcuda_bf16 *ddown, kcuda_bf16 *dap, kcuda_bf16 *dhp,
                                    const kcuda_bf16 *dyp, const kcuda_bf16 *xp,
                                    const kcuda_bf16 *hp, const kcuda_bf16 *ap,
                                    const kcuda_bf16 *gate_up, const kcuda_bf16 *down,
                                    const int *offsets_host, int E, int H, int Fm);

/* ---- attention (flash attention, bf16) -------------------------------------------
 * As kcpu_attention_forward/backward: q [N, Hq, D]; k, v [N, Hkv, D]; out [N, Hq, D];
 * lse [N, Hq] fp32 (natural log of the sum of exp(scale * q.k), scale = 1/sqrt(D)).
 * cu_seqlens is a DEVICE array of nseq + 1 ints (cu_seqlens[0] = 0); max_seqlen must be
 * >= every sequence length (it sizes the grid).  Query head h reads kv head
 * h / (Hq / Hkv); causal != 0 masks keys after the query.  Windowed attention is a
 * cu_seqlens with one sequence per window.  D is 64, 80 or 128.  q, k, v, out and dout
 * must be 16-byte aligned (cudaMalloc'd tensors are).
 * Forward: lse may be NULL (inference).  Backward: dq [N,Hq,D], dk, dv [N,Hkv,D] += the
 * gradients (bf16 storage, fp32 accumulation; NULL = not wanted); it needs lse from the
 * forward and needs nseq * max_seqlen * Hq * 4 bytes of the context's workspace
 * (KCUDA_ENOMEM when the workspace is smaller); with GQA and few blocks it also uses the
 * rest of the workspace, when large enough, for fp32 partial sums of dk/dv over split
 * query-head ranges.  Results are deterministic: no atomics, fixed summation orders. */
int kcuda_attention_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, float *lse,
                                 const kcuda_bf16 *q, const kcuda_bf16 *k, const kcuda_bf16 *v,
                                 const int *cu_seqlens, int nseq, int max_seqlen, int Hq,
                                 int Hkv, int D, int causal);
int kcuda_attention_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dq, kcuda_bf16 *dk,
                                  kcuda_bf16 *dv, const kcuda_bf16 *dout, const kcuda_bf16 *q,
                                  const kcuda_bf16 *k, const kcuda_bf16 *v,
                                  const kcuda_bf16 *out, const float *lse,
                                  const int *cu_seqlens, int nseq, int max_seqlen, int Hq,
                                  int Hkv, int D, int causal);
/* The same with the rows of q, k, v (and dq, dk, dv) ldq, ldk, ldv elements apart (0:
 * contiguous; else at least the rows' width and a multiple of 8): the column blocks of a
 * fused qkv tensor read, and its gradient's written, in place.  out, dout: contiguous. */
int kcuda_attention_forward_bf16_ld(kcuda_ctx *ctx, kcuda_bf16 *out, float *lse,
                                    const kcuda_bf16 *q, const kcuda_bf16 *k,
                                    const kcuda_bf16 *v, int ldq, int ldk, int ldv,
                                    const int *cu_seqlens, int nseq, int max_seqlen, int Hq,
                                    int Hkv, int D, int causal);
int kcuda_attention_backward_bf16_ld(kcuda_ctx *ctx, kcuda_bf16 *dq, kcuda_bf16 *dk,
                                     kcuda_bf16 *dv, const kcuda_bf16 *dout,
                                     const kcuda_bf16 *q, const kcuda_bf16 *k,
                                     const kcuda_bf16 *v, const kcuda_bf16 *out,
                                     const float *lse, int ldq, int ldk, int ldv,
                                     const int *cu_seqlens, int nseq, int max_seqlen, int Hq,
                                     int Hkv, int D, int causal);

/* ---- matmul: fp32 weight gradients ------------------------------------------------
 * kcuda_matmul_backward_bf16 for training with fp32 gradient accumulation: dweight [N,K]
 * is FP32 and dweight += dout^T . inp comes straight out of cuBLASLt (bf16 A/B, fp32 C/D,
 * fp32 accumulation: no rounding of the gradient to bf16, no conversion pass).
 * dinp [M,K] bf16: dinp_accumulate != 0 adds into it (dinp += dout . weight), 0 overwrites
 * it (dinp = dout . weight: no zeroing pass needed before).  Either may be NULL.
 * dbias_set (fp32 [N], may be NULL; needs dweight): the column sums of dout, WRITTEN (=,
 * not added) by the dweight GEMM's epilogue (cuBLASLt BGRADB), so that the bias gradient
 * costs no pass of its own.  cuBLASLt does not offer that epilogue for every type, shape
 * and alignment: then the call returns KCUDA_ENOALGO (or KCUDA_ECUBLAS) having computed
 * nothing, and the caller falls back to dbias_set = NULL and a separate reduction. */
int kcuda_matmul_backward_bf16_f32w(kcuda_ctx *ctx, kcuda_bf16 *dinp, int dinp_accumulate,
                                    float *dweight, float *dbias_set, const kcuda_bf16 *dout,
                                    const kcuda_bf16 *inp, const kcuda_bf16 *weight, int M,
                                    int K, int N);

/* GELU (cuBLASLt's, the tanh form) in the GEMM's epilogue, all bf16: the forward writes
 * pre = inp . weight^T + bias and out = gelu(pre); the backward's dinp = (dout . weight) *
 * gelu'(pre) (written).  Shapes as kcuda_matmul_forward_bf16 / the dinp product. */
int kcuda_matmul_forward_bf16_gelu(kcuda_ctx *ctx, kcuda_bf16 *out, kcuda_bf16 *pre,
                                   const kcuda_bf16 *inp, const kcuda_bf16 *weight,
                                   const kcuda_bf16 *bias, int M, int K, int N);
int kcuda_matmul_dinp_bf16_dgelu(kcuda_ctx *ctx, kcuda_bf16 *dinp, const kcuda_bf16 *dout,
                                 const kcuda_bf16 *weight, const kcuda_bf16 *pre, int M, int K,
                                 int N);

/* ---- FP8 GEMMs (gemm_fp8.cu) --------------------------------------------------------
 * The two OCP FP8 formats, one byte each, numbered as kernels.h's kfp8_format. */
enum { KCUDA_FP8_E4M3 = 0, KCUDA_FP8_E5M2 = 1 };
/* Quantises x [rows, cols] (fp32, row-major): the code of x[r, c] * scale in format fmt,
 * rounded exactly as kernels/cpu/fp8.c rounds (kcpu_fp8_encode(x * scale), bit for bit:
 * nearest even, finite values beyond max saturated, NaN kept with its sign, inf to E5M2
 * inf or E4M3 NaN).  q (may be NULL): the codes row-major [rows, cols]; qt (may be NULL):
 * the transpose [cols, rows], the copy a product reducing over the rows needs (FP8 GEMMs
 * want both operands K-major). */
int kcuda_fp8_quantise(kcuda_ctx *ctx, uint8_t *q, uint8_t *qt, const float *x, int rows,
                       int cols, float scale, int fmt);
/* out[R, C] = (a[R, Kd] . b[C, Kd]^T) * alpha, or += that when accumulate: FP8 codes a
 * (format fa) and b (fb), both row-major with the reduction dimension Kd contiguous
 * (cuBLASLt's "TN", the one FP8 layout of Hopper), fp32 accumulation and fp32 out; alpha
 * is the product of the operands' dequantisation factors (1/scale each).  Not both E5M2
 * (cuBLASLt has no such kernel).  KCUDA_ENOALGO having done nothing when kcuda_matmul_fp8_fits says
 * no, or cuBLASLt has no algorithm (a GPU before sm_89). */
int kcuda_matmul_fp8(kcuda_ctx *ctx, float *out, const uint8_t *a, int fa, const uint8_t *b,
                     int fb, float alpha, int R, int C, int Kd, int accumulate);
/* Whether cuBLASLt's FP8 kernels take this product: R, C and Kd multiples of 16 (the
 * operands' rows 16-byte multiples, as their tensor cores need) and out 16-byte aligned
 * (the FP8 operands this library quantises into its own buffers are). */
int kcuda_matmul_fp8_fits(const float *out, int R, int C, int Kd);

#ifdef __cplusplus
}
#endif

#endif
