/* kdev_cuda_internal.h - what the files of the cuda device backend share (kdev_cuda*.cu):
 * the state behind d->impl, the error helpers and the ops each file defines.  Not part
 * of any API: the backend is reached only through its ops table (kdev_backend.h).
 *
 * Files, one job each:
 *   kdev_cuda.cu         state, errors, scratch, the ops table and the exported entry
 *   kdev_cuda_mem.cu     memory: alloc/release (with the pointer -> size map), copies, sync
 *   kdev_cuda_ops.cu     rows, elementwise, and the ops that are existing kcuda kernels
 *   kdev_cuda_ce.cu      the vocabulary-parallel cross-entropy pieces
 *   kdev_cuda_fp8.cu     amax and the fp8 quantise-dequantise
 *   kdev_cuda_optim.cu   AdamW and the sum of squares
 *   kdev_cuda_attn.cu    attention and block attention, fp32
 *   kdev_cuda_moe.cu     mixture-of-experts routing and permutations, fp32
 *   kdev_cuda_gemm16.cu, kdev_cuda_attn16.cu, kdev_cuda_bf16.cu   the precision BF16
 *   kdev_cuda_head.cu    the LM head with its cross-entropy on bf16 logits
 *   kdev_cuda_fp8gemm.cu the FP8 linear on FP8 tensor cores (kcuda's gemm_fp8.cu)
 *
 * Determinism: every kernel here gives the same bits on every run (no floating-point
 * atomics; reductions in a fixed order that depends only on the shapes). */
#ifndef HEARTH_KDEV_CUDA_INTERNAL_H
#define HEARTH_KDEV_CUDA_INTERNAL_H

#include <cuda_runtime.h>

#include "kdev_backend.h"
#include "cuda/kcuda.h"

/* Ops of one file called from another: hidden, so that only the entry point leaves the
 * shared library (the version script says the same at link time). */
#define CUDA_PRIVATE __attribute__((visibility("hidden")))

/* One kdev_alloc'd block in the pointer -> size map (open addressing, linear probing). */
typedef struct {
    void *p;
    size_t bytes;
} cuda_block;

typedef struct {
    cudaStream_t stream;   /* every op is enqueued here */
    kcuda_ctx *k;          /* the kcuda kernels' context, on the same stream */
    cuda_block *map;       /* live allocations; NULL p = empty slot */
    size_t map_cap, map_used;
    size_t current, peak;  /* bytes of kdev_alloc, as the cpu backend counts them */
    cuda_block *act;       /* bf16 activation memory (kdev_alloc_act at BF16), unordered */
    size_t act_n, act_cap;
    void *scratch;         /* device scratch for reductions and index work, grown on need */
    kdev_precision prec;   /* kdev_set_precision */
    cudaEvent_t *marks;    /* profile: KDEV_PROF_MARKS events, made on first use */
    size_t scratch_bytes;
    char hw[256];          /* cudaDeviceProp.name */
} cuda_state;

static inline cuda_state *cuda_st(const kdev *d)
{
    return (cuda_state *)d->impl;
}

static inline cudaStream_t cuda_stream(const kdev *d)
{
    return cuda_st(d)->stream;
}

/* ---- errors (kdev_cuda.cu) ------------------------------------------------------------
 * cuda_err: 0 for cudaSuccess, else the message "<op>: <CUDA's words>" in d and
 * HERR_NOMEM (allocation) or HERR_DEVICE.  cuda_launched: the same for the last launch.
 * cuda_kc: a kcuda call's result, its context's message under the op's name. */
CUDA_PRIVATE int cuda_err(kdev *d, cudaError_t e, const char *op);
CUDA_PRIVATE int cuda_launched(kdev *d, const char *op);
CUDA_PRIVATE int cuda_kc(kdev *d, int rc, const char *op);
/* A device scratch buffer of at least `bytes` (valid until the next call of an op; used
 * in stream order, so consecutive ops may share it).  Growing it waits for the stream. */
CUDA_PRIVATE int cuda_scratch(kdev *d, size_t bytes, void **p, const char *op);

/* Grid of a grid-stride loop over n items with `threads` per block: bounded, so that any
 * n fits; never 0 blocks. */
static inline unsigned cuda_blocks(size_t n, int threads)
{
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b == 0)
        b = 1;
    return (unsigned)(b < 65536 ? b : 65536);
}

/* Round up to 256 bytes: scratch carve-outs keep CUB's and vector alignment. */
static inline size_t cuda_align256(size_t b)
{
    return (b + 255) & ~(size_t)255;
}

/* ---- the ops, by file ------------------------------------------------------------------ */

/* kdev_cuda_mem.cu */
CUDA_PRIVATE int cuda_alloc(kdev *d, void **p, size_t bytes);
CUDA_PRIVATE void cuda_release(kdev *d, void *p);
CUDA_PRIVATE void cuda_release_all(kdev *d);
CUDA_PRIVATE int cuda_upload(kdev *d, void *dst, const void *host, size_t bytes);
CUDA_PRIVATE int cuda_download(kdev *d, void *host, const void *src, size_t bytes);
CUDA_PRIVATE int cuda_copy(kdev *d, void *dst, const void *src, size_t bytes);
CUDA_PRIVATE int cuda_copy_2d(kdev *d, void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t rows);
CUDA_PRIVATE int cuda_zero(kdev *d, void *p, size_t bytes);
CUDA_PRIVATE size_t cuda_act_bytes(const kdev *d);
CUDA_PRIVATE int cuda_alloc_act(kdev *d, void **p, size_t count);
/* Whether p lies in bf16 activation memory (a scan of the few activation blocks). */
CUDA_PRIVATE int cuda_act16(const kdev *d, const void *p);
CUDA_PRIVATE int cuda_act_copy_2d(kdev *d, float *dst, size_t dpitch, const float *src,
                                  size_t spitch, size_t rows, size_t cols);
/* HERR_ARG, naming the op and the argument, when p lies in bf16 activation memory: for
 * the ops that read and write fp32 only (kdev.h, "activation memory"). */
CUDA_PRIVATE int cuda_no_act16(kdev *d, const char *op, const char *arg, const void *p);
CUDA_PRIVATE int cuda_sync(kdev *d);
CUDA_PRIVATE void cuda_mem_stats(const kdev *d, size_t *peak, size_t *current);

/* kdev_cuda_ops.cu */
CUDA_PRIVATE int cuda_fill(kdev *d, float *x, size_t n, float value);
CUDA_PRIVATE int cuda_gather_rows(kdev *d, float *dst, const float *src, const int *idx,
                                  int n, int C);
CUDA_PRIVATE int cuda_scatter_rows(kdev *d, float *dst, const float *src, const int *idx,
                                   int n, int C);
CUDA_PRIVATE int cuda_add_bias(kdev *d, float *x, const float *bias, int n, int C);
CUDA_PRIVATE int cuda_matmul_forward(kdev *d, float *out, const float *inp,
                                     const float *weight, const float *bias, const float *res,
                                     int M, int K, int N);
CUDA_PRIVATE int cuda_matmul_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                                      const float *dout, const float *inp,
                                      const float *weight, int M, int K, int N, int set);
CUDA_PRIVATE int cuda_add(kdev *d, float *out, const float *a, const float *b, size_t n);
CUDA_PRIVATE int cuda_accumulate(kdev *d, float *dst, const float *src, size_t n);
CUDA_PRIVATE int cuda_scale(kdev *d, float *x, size_t n, float s);
CUDA_PRIVATE int cuda_embedding_forward(kdev *d, float *out, const int *ids,
                                        const float *table, int N, int C);
CUDA_PRIVATE int cuda_embedding_backward(kdev *d, float *dtable, const float *dout,
                                         const int *ids, int N, int C);
CUDA_PRIVATE int cuda_rmsnorm_forward(kdev *d, float *out, float *rstd, const float *inp,
                                      const float *weight, int N, int C, float eps);
CUDA_PRIVATE int cuda_rmsnorm_backward(kdev *d, float *dinp, float *dweight,
                                       const float *dout, const float *inp,
                                       const float *weight, const float *rstd, int N, int C);
CUDA_PRIVATE int cuda_layernorm_forward(kdev *d, float *out, float *mean, float *rstd,
                                        const float *inp, const float *weight,
                                        const float *bias, int N, int C, float eps);
CUDA_PRIVATE int cuda_layernorm_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                                         const float *dout, const float *inp,
                                         const float *weight, const float *mean,
                                         const float *rstd, int N, int C);
CUDA_PRIVATE int cuda_rope_forward(kdev *d, float *x, const float *cos, const float *sin,
                                   int N, int H, int D);
CUDA_PRIVATE int cuda_rope_backward(kdev *d, float *dx, const float *cos, const float *sin,
                                    int N, int H, int D);
CUDA_PRIVATE int cuda_swiglu_forward(kdev *d, float *out, const float *inp, int N, int F);
CUDA_PRIVATE int cuda_swiglu_backward(kdev *d, float *dinp, const float *dout,
                                      const float *inp, int N, int F, int set);
CUDA_PRIVATE int cuda_gelu_forward(kdev *d, float *out, const float *inp, size_t n,
                                   kgelu_kind kind);
CUDA_PRIVATE int cuda_gelu_backward(kdev *d, float *dinp, const float *dout,
                                    const float *inp, size_t n, kgelu_kind kind, int set);

/* kdev_cuda_ce.cu */
CUDA_PRIVATE int cuda_ce_rowmax(kdev *d, float *mx, const float *logits, int n, int Vl);
CUDA_PRIVATE int cuda_ce_rowsum(kdev *d, double *sums, const float *logits, const float *mx,
                                const int *targets, int v0, int n, int Vl);
CUDA_PRIVATE int cuda_ce_grad(kdev *d, float *dlogits, const float *logits,
                              const double *lse, const int *targets, int v0, double dl,
                              int n, int Vl);
CUDA_PRIVATE int cuda_ce_finish(kdev *d, double *lse, float *losses, const float *mx,
                                const double *sums, int n);

/* kdev_cuda_fp8.cu */
CUDA_PRIVATE int cuda_amax(kdev *d, float *amax, const float *x, size_t n, int to_device);
CUDA_PRIVATE int cuda_fp8_qdq(kdev *d, float *out, const float *x, size_t n, float scale,
                              kfp8_format f);

/* kdev_cuda_optim.cu */
CUDA_PRIVATE int cuda_adamw_update(kdev *d, float *param, const float *grad, float *m,
                                   float *v, size_t n, float lr, float beta1, float beta2,
                                   float eps, float weight_decay, int step);
CUDA_PRIVATE int cuda_sumsq(kdev *d, double *out, const float *x, size_t n);
CUDA_PRIVATE int cuda_sumsq_multi(kdev *d, double *out, const float *const *x,
                                  const size_t *n, int count);
CUDA_PRIVATE int cuda_adamw_multi(kdev *d, const kdev_adamw_tensor *t, int count, float clip,
                                  float lr, float beta1, float beta2, float eps,
                                  float weight_decay, int step);

/* kdev_cuda_attn.cu */
CUDA_PRIVATE int cuda_attention_forward(kdev *d, float *out, float *lse, const float *q,
                                        const float *k, const float *v, int ldq, int ldk,
                                        int ldv, const int *cu_seqlens, int nseq,
                                        int max_seqlen, int N, int Hq, int Hkv, int D,
                                        int causal);
CUDA_PRIVATE int cuda_attention_backward(kdev *d, float *dq, float *dk, float *dv,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *out, const float *lse,
                                         int ldq, int ldk, int ldv, const int *cu_seqlens,
                                         int nseq, int max_seqlen, int N, int Hq, int Hkv,
                                         int D, int causal, int set);

/* kdev_cuda_bf16.cu: dst (bf16) = src rounded; dst = (accumulate ? dst : 0) + src (fp32
 * from bf16; nothing when dst is NULL); n bf16 buffers of count[i] elements carved from
 * the device scratch at 256-byte boundaries (valid until the next op that uses it). */
CUDA_PRIVATE int cuda_to_bf16(kdev *d, kcuda_bf16 *dst, const float *src, size_t n,
                              const char *op);
CUDA_PRIVATE int cuda_from_bf16(kdev *d, float *dst, const kcuda_bf16 *src, size_t n,
                                int accumulate, const char *op);
/* src [rows, cols] into dst with rows `pitch` >= cols elements apart, pad zeroed. */
CUDA_PRIVATE int cuda_to_bf16_pitched(kdev *d, kcuda_bf16 *dst, int pitch, const float *src,
                                      size_t rows, int cols, const char *op);
/* dst [rows, cols] (fp32, packed) = the first cols columns of src, rows `pitch` apart. */
CUDA_PRIVATE int cuda_unpitch(kdev *d, float *dst, const float *src, size_t rows, int cols,
                              int pitch, const char *op);
CUDA_PRIVATE int cuda_carve_bf16(kdev *d, kcuda_bf16 **p, const size_t *count, int n,
                                 const char *op);
/* Where src lies in bf16 activation memory: *x = a new fp32 copy of its n values (a
 * stream-ordered allocation, outside the scratch, for the rare fp32 fallbacks); else
 * *x = NULL.  cuda_act_f32_free releases *x in stream order and returns rc. */
CUDA_PRIVATE int cuda_act_f32(kdev *d, float **x, const float *src, size_t n, const char *op);
CUDA_PRIVATE int cuda_act_f32_free(kdev *d, float *x, int rc);

/* kdev_cuda_gemm16.cu: kdev's matmul at the precision BF16: operands converted to bf16,
 * fp32 outputs and gradients straight from cuBLASLt (bf16 A/B, fp32 C).  HERR_NOALGO
 * when cuBLASLt has no algorithm for a shape (the caller then runs it in fp32 math). */
/* res (fp32, or NULL): added to the product in the GEMM's epilogue (out fp32). */
CUDA_PRIVATE int cuda_matmul16_forward(kdev *d, float *out, const float *inp,
                                       const float *weight, const float *bias,
                                       const float *res, int M, int K, int N);
/* set: dinp written, not added to. */
CUDA_PRIVATE int cuda_matmul16_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp,
                                        const float *weight, int M, int K, int N, int set);
/* The same backward from dout16 instead of dout when dout == NULL: bf16 rows of
 * cuda_pitch8(N) elements, the pad columns zero, outside the scratch; then dbias must be
 * NULL. */
CUDA_PRIVATE int cuda_matmul16_backward_from(kdev *d, float *dinp, float *dweight,
                                             float *dbias, const float *dout,
                                             const kcuda_bf16 *dout16, const float *inp,
                                             const float *weight, int M, int K, int N,
                                             int set);
/* N rounded up to a multiple of 8: bf16 rows of 16-byte multiples. */
static inline int cuda_pitch8(int N)
{
    return (N + 7) & ~7;
}

/* kdev_cuda_head.cu: kdev_head_ce_* at the precision BF16 (HERR_NOALGO elsewhere). */
CUDA_PRIVATE int cuda_head_ce_forward(kdev *d, float *ws, double *lse, float *losses,
                                      float *mx, double *sums, const float *inp,
                                      const float *w, const int *targets, int n, int K, int V);
CUDA_PRIVATE int cuda_head_ce_backward(kdev *d, float *dinp, float *dw, float *ws,
                                       const double *lse, const int *targets, double dl,
                                       const float *inp, const float *w, int n, int K, int V);

/* kdev_cuda_attn16.cu: the attention above on the bf16 flash kernels of kcuda (the
 * precision BF16; head dims kcuda_attention16_fits): q, k, v (and out, dout) converted to
 * bf16 in the device scratch, outputs converted back (the backward accumulates). */
CUDA_PRIVATE int cuda_attention16_fits(int D);
/* ldq, ldk, ldv: the strides of tensors in activation memory (resolved, non-zero); those
 * in fp32 memory are contiguous. */
CUDA_PRIVATE int cuda_attention16_forward(kdev *d, float *out, float *lse, const float *q,
                                          const float *k, const float *v, int ldq, int ldk,
                                          int ldv, const int *cu_seqlens, int nseq,
                                          int max_seqlen, int N, int Hq, int Hkv, int D,
                                          int causal);
CUDA_PRIVATE int cuda_attention16_backward(kdev *d, float *dq, float *dk, float *dv,
                                           const float *dout, const float *q, const float *k,
                                           const float *v, const float *out, const float *lse,
                                           int ldq, int ldk, int ldv, const int *cu_seqlens,
                                           int nseq, int max_seqlen, int N, int Hq, int Hkv,
                                           int D, int causal, int set);
CUDA_PRIVATE int cuda_attention_block_forward(kdev *d, float *out, float *lse,
                                              const float *q, const float *k, const float *v,
                                              const int *q_cu, const int *q_pos,
                                              const int *k_cu, const int *k_pos, int nseq,
                                              int max_q, int max_k, int Hq, int Hkv, int D,
                                              int causal);
CUDA_PRIVATE int cuda_attention_block_backward(kdev *d, float *dq, float *dk, float *dv,
                                               const float *dout, const float *q,
                                               const float *k, const float *v,
                                               const float *out, const float *lse,
                                               const int *q_cu, const int *q_pos,
                                               const int *k_cu, const int *k_pos, int nseq,
                                               int max_q, int max_k, int Hq, int Hkv, int D,
                                               int causal);

/* kdev_cuda_moe.cu */
CUDA_PRIVATE int cuda_moe_router_forward(kdev *d, int *topk_idx, float *topk_w, float *probs,
                                         float *aux, const float *logits, int N, int E,
                                         int K);
CUDA_PRIVATE int cuda_moe_router_backward(kdev *d, float *dlogits, const float *dtopk_w,
                                          float daux, const float *probs,
                                          const int *topk_idx, const float *topk_w, int N,
                                          int E, int K);
CUDA_PRIVATE int cuda_moe_plan(kdev *d, int *offsets, int *row_src, int *slot_row,
                               const int *topk_idx, int N, int E, int K);
CUDA_PRIVATE int cuda_moe_permute_forward(kdev *d, float *out, const float *inp,
                                          const int *row_src, int N, int K, int C);
CUDA_PRIVATE int cuda_moe_permute_backward(kdev *d, float *dinp, const float *dout,
                                           const int *row_src, int N, int K, int C);
CUDA_PRIVATE int cuda_moe_unpermute_forward(kdev *d, float *out, const float *expert_out,
                                            const float *topk_w, const int *slot_row, int N,
                                            int K, int C);
CUDA_PRIVATE int cuda_moe_unpermute_backward(kdev *d, float *dexpert_out, float *dtopk_w,
                                             const float *dout, const float *expert_out,
                                             const float *topk_w, const int *slot_row, int N,
                                             int K, int C);

/* kdev_cuda_fp8gemm.cu: kdev_fp8_matmul_* through cuBLASLt's FP8 GEMMs; HERR_NOALGO
 * having done nothing for shapes it does not take (kdev.c then runs the emulation). */
CUDA_PRIVATE int cuda_fp8_matmul_forward(kdev *d, float *ws, float *out, const float *inp,
                                         const float *w, const float *bias, int M, int K,
                                         int N, float sx, float sw,
                                         const kdev_fp8_amax *amax);
CUDA_PRIVATE int cuda_fp8_matmul_backward(kdev *d, float *ws, float *dinp, float *dw,
                                          const float *dout, const float *inp, const float *w,
                                          int M, int K, int N, float sx, float sw, float sd,
                                          kfp8_format fd, const kdev_fp8_amax *amax);

/* ---- device helpers -------------------------------------------------------------------- */
#ifdef __CUDACC__
/* Warp sums by the xor butterfly: every lane forms the same additions (a + b == b + a
 * exactly), so every lane gets the same bits, on every run. */
__device__ __forceinline__ float cuda_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double cuda_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
#endif

#endif
