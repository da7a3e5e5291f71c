/* kdev.h - the device under the model: one object and one ops table per backend.
 *
 * The model, the optimizer and the parallel code call these functions and never a
 * backend's kernels directly; a backend implements the table (kdev_backend.h):
 *   cpu   kernels/cpu, the plain-C fp32 reference, bitwise deterministic (kdev_cpu.c);
 *   cuda  kernels/cuda on one GPU, one stream (kernels/cuda/kdev_cuda.cu; only where
 *         nvcc built it, see kdev_cuda_available).
 * No backend knows a model; no model logic lives in a backend.
 *
 * Memory.  Every tensor pointer passed below is DEVICE memory of the same device
 * (kdev_alloc); on the cpu backend that is host memory.  The only ways in and out are
 * kdev_upload / kdev_download.  Element types: float (fp32) unless said otherwise, int
 * for index arrays, double where a reduction needs it, and the activation type in
 * activation memory (kdev_alloc_act, below).
 *
 * Semantics.  Each op is the kernels.h function of the same name (kcpu_*): the same
 * shapes, the same accumulate-into-gradients (+=) rule, NULL = gradient not wanted.  The
 * cpu backend IS that function; other backends are tested against it op by op
 * (tests/gpu/test_kdev_gpu.cu).  Ops that kernels.h lacks are specified here.
 *
 * Ordering and errors.  Calls are enqueued in order on the device's one stream and return
 * when enqueued; kdev_download and kdev_sync wait for everything before them.  Every
 * function returns 0 or a negative herr_code (kerr.h) and then leaves a message in the
 * device (kdev_errmsg).  An asynchronous failure may show at a later call.  Nothing
 * here calls exit().  A device is used by one host thread at a time; thread ranks each
 * create their own.
 *
 * Ownership: kdev_create returns a device freed by kdev_free (NULL is fine); memory from
 * kdev_alloc is freed by kdev_release on the same device, before kdev_free. */
#ifndef HEARTH_KDEV_H
#define HEARTH_KDEV_H

#include <stddef.h>
#include <stdint.h>

#include "kerr.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KDEV_CPU = 0, KDEV_CUDA = 1 } kdev_kind;

typedef struct kdev kdev;
typedef struct kdev_ops kdev_ops;

/* Creates a device of `kind`.  cuda: on the current CUDA device, with its own stream and
 * kernel context; HERR_CONFIG when this build has no CUDA backend, HERR_DEVICE when no
 * GPU answers.  On failure *out = NULL and errbuf (if not NULL) says why. */
int kdev_create(kdev **out, kdev_kind kind, char *errbuf, size_t errlen);
void kdev_free(kdev *d);

kdev_kind kdev_get_kind(const kdev *d);
const char *kdev_name(const kdev *d);           /* "cpu", "cuda" */
/* The first failure since creation or the last kdev_status_clear (0 when none): calls
 * also leave their failure here, so that a caller may enqueue a run of calls and check
 * once at the end, as with a CUDA stream.  kdev_errmsg: its message ("" when none), owned
 * by d. */
int kdev_status(const kdev *d);
void kdev_status_clear(kdev *d);
const char *kdev_errmsg(const kdev *d);
/* Whether this build has the cuda backend (nvcc was found when it was built). */
int kdev_cuda_available(void);
/* A description of the hardware for logs and result.json ("NVIDIA H100 80GB HBM3"; the
 * cpu backend: "cpu"); owned by d. */
const char *kdev_hw_name(const kdev *d);
/* The version of a library the backend runs on, as the library numbers it (CUDA runtime
 * 13000 = 13.0; cuBLASLt 130100 = 13.1.0); 0 where the backend has none (the cpu). */
typedef enum { KDEV_LIB_CUDA_RUNTIME = 0, KDEV_LIB_CUBLASLT = 1 } kdev_lib;
int kdev_lib_version(const kdev *d, kdev_lib lib);

/* ---- memory ---------------------------------------------------------------------------
 * alloc: `bytes` of zeroed device memory (bytes == 0 gives a valid unique pointer).
 * release: NULL is fine.  upload/download copy host <-> device (download waits for the
 * stream); copy is device -> device (regions must not overlap).  copy_2d copies `rows`
 * rows of `width` bytes from src (rows `spitch` bytes apart) to dst (`dpitch` apart),
 * device to device.  zero: bytes of device memory set to 0. */
int kdev_alloc(kdev *d, void **p, size_t bytes);
void kdev_release(kdev *d, void *p);
int kdev_upload(kdev *d, void *dst, const void *host, size_t bytes);
int kdev_download(kdev *d, void *host, const void *src, size_t bytes);
int kdev_copy(kdev *d, void *dst, const void *src, size_t bytes);
int kdev_copy_2d(kdev *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                 size_t width, size_t rows);
int kdev_zero(kdev *d, void *p, size_t bytes);
/* x[i] = value for i < n (floats). */
int kdev_fill(kdev *d, float *x, size_t n, float value);
/* The precision of the device's matrix work.  FP32 (the default): exact fp32 arithmetic.
 * BF16: GEMM operands and attention inputs rounded to bf16 for the tensor cores, fp32
 * accumulation, every tensor still stored in fp32 (a GPU's fast path; results agree with
 * FP32 to bf16 rounding).  The cpu backend has FP32 only: BF16 gives HERR_CONFIG. */
typedef enum { KDEV_PREC_FP32 = 0, KDEV_PREC_BF16 = 1 } kdev_precision;
int kdev_set_precision(kdev *d, kdev_precision p);

/* ---- activation memory ---------------------------------------------------------------
 * Memory from kdev_alloc_act holds elements of the device's activation type, kdev_act_bytes
 * wide: fp32 (4) on the cpu and at FP32, bf16 (2, bits of round-to-nearest-even) on cuda
 * at BF16: half the bytes every producer writes and every consumer reads.  A pointer into
 * activation memory is passed where a float pointer is declared, and only where an op
 * below marks the argument "act": those ops read or write it in the activation type (an
 * act argument may also be ordinary fp32 memory), and a backend refuses activation memory
 * of another type than fp32 elsewhere (HERR_ARG), so that it is never read as floats.  Offsets into it count kdev_act_bytes per element
 * (kdev_act_at).  The type is fixed when the memory is allocated: kdev_set_precision
 * fails (HERR_CONFIG) while activation memory of the other type is held.
 * act_upload / act_download: n fp32 values into / out of activation memory (rounded to
 * the type; both wait, as kdev_upload / kdev_download). */
size_t kdev_act_bytes(const kdev *d);
int kdev_alloc_act(kdev *d, void **p, size_t count);
int kdev_act_upload(kdev *d, void *dst, const float *host, size_t n);
int kdev_act_download(kdev *d, float *host, const void *src, size_t n);
/* act_copy_2d: rows x cols elements from src (act; rows spitch elements apart) to dst
 * (act; rows dpitch apart), converted where one side is fp32 memory and the other
 * activation memory of another type: the split of fused rows (q, k, v of the qkv GEMM's
 * output) and their gradients' merge.  Regions must not overlap. */
int kdev_act_copy_2d(kdev *d, float *dst, size_t dpitch, const float *src, size_t spitch,
                     size_t rows, size_t cols);
/* Element i of activation memory at p. */
static inline float *kdev_act_at(const kdev *d, float *p, size_t i)
{
    return (float *)((char *)p + i * kdev_act_bytes(d));
}

/* Per-op profile.  kdev_profile_start: from now on every op marks the stream (a CUDA
 * event; the host clock on the cpu backend), so the ops tile the stream's timeline: an
 * op is charged from its own mark to the next op's (a GPU idling while the host prepares
 * the next call charges the op before it).  Marks are read in batches, which waits for
 * the stream now and then: profiled runs are a little slower, unprofiled ones pay
 * nothing.  kdev_profile_report: flushes and writes a table (op, calls, ms, share of the
 * total, most expensive first) into buf (NUL-terminated, truncated to len); returns the
 * total ms or a negative code.  The profile is freed with the device. */
int kdev_profile_start(kdev *d);
double kdev_profile_report(kdev *d, char *buf, size_t len);

/* Waits for every call enqueued so far. */
int kdev_sync(kdev *d);
/* Peak bytes of device memory this device has held through kdev_alloc since creation
 * (the cpu backend counts the same way), and the bytes held now. */
void kdev_mem_stats(const kdev *d, size_t *peak, size_t *current);

/* ---- rows ------------------------------------------------------------------------------
 * gather:      dst[r, :] = src[idx[r], :] for r < n; idx[r] < 0 writes a zero row.
 * scatter:     dst[idx[r], :] = src[r, :] for r < n with idx[r] >= 0 (the idx >= 0 must be
 *              distinct); other rows of dst are untouched.
 * add_bias:    x[r, :] += bias for every row of x [n, C] (in fp32, row by row). */
int kdev_gather_rows(kdev *d, float *dst, const float *src, const int *idx, int n, int C);
int kdev_scatter_rows(kdev *d, float *dst, const float *src, const int *idx, int n, int C);
int kdev_add_bias(kdev *d, float *x, const float *bias, int n, int C);

/* ---- kernels.h, on the device --------------------------------------------------------
 * act: matmul_forward inp; matmul_backward dinp, dout, inp; rmsnorm/layernorm_forward out;
 * rope_forward x, rope_backward dx; attention_forward q, k, v, out and attention_backward
 * every tensor but lse; swiglu/gelu_forward out and their backward's dinp and dout (see
 * "activation memory"). */
int kdev_matmul_forward(kdev *d, float *out, const float *inp, const float *weight,
                        const float *bias, int M, int K, int N);
/* out = res + inp . weight^T (+ bias): a linear whose output joins the residual stream,
 * res and out fp32 [M, N] (not activation memory; out is neither res nor inp).  A GPU adds
 * res in the GEMM's epilogue; the cpu adds it after the product, bitwise the matmul into
 * a scratch followed by kdev_add(out, res, scratch).  res NULL: kdev_matmul_forward. */
int kdev_matmul_forward_residual(kdev *d, float *out, const float *res, const float *inp,
                                 const float *weight, const float *bias, int M, int K, int N);
int kdev_matmul_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight, int M,
                         int K, int N);
/* As kdev_matmul_backward, except that dinp is written (=), not added to (dweight and
 * dbias still accumulate): a dinp the caller would zero first needs no zeroing. */
int kdev_matmul_backward_set(kdev *d, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, int M,
                             int K, int N);
int kdev_add(kdev *d, float *out, const float *a, const float *b, size_t n);
int kdev_accumulate(kdev *d, float *dst, const float *src, size_t n);
int kdev_scale(kdev *d, float *x, size_t n, float s);
int kdev_embedding_forward(kdev *d, float *out, const int *ids, const float *table, int N,
                           int C);
/* As kcpu_embedding_backward, except that tokens with ids[i] < 0 contribute nothing. */
int kdev_embedding_backward(kdev *d, float *dtable, const float *dout, const int *ids,
                            int N, int C);
int kdev_rmsnorm_forward(kdev *d, float *out, float *rstd, const float *inp,
                         const float *weight, int N, int C, float eps);
int kdev_rmsnorm_backward(kdev *d, float *dinp, float *dweight, const float *dout,
                          const float *inp, const float *weight, const float *rstd, int N,
                          int C);
int kdev_layernorm_forward(kdev *d, float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C, float eps);
int kdev_layernorm_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            const float *mean, const float *rstd, int N, int C);
int kdev_rope_forward(kdev *d, float *x, const float *cos, const float *sin, int N, int H,
                      int D);
int kdev_rope_backward(kdev *d, float *dx, const float *cos, const float *sin, int N, int H,
                       int D);
/* Attention: cu_seqlens is a device array; max_seqlen >= every sequence's length (a GPU
 * sizes its grid with it); N = cu_seqlens[nseq], the rows of q (what a GPU converts for
 * its bf16 kernels).  The cpu backend reads neither. */
int kdev_attention_forward(kdev *d, float *out, float *lse, const float *q, const float *k,
                           const float *v, const int *cu_seqlens, int nseq, int max_seqlen,
                           int N, int Hq, int Hkv, int D, int causal);
int kdev_attention_backward(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v,
                            const float *out, const float *lse, const int *cu_seqlens,
                            int nseq, int max_seqlen, int N, int Hq, int Hkv, int D,
                            int causal);
/* The same with dq, dk, dv written instead of added to (their rows N, as for the forward):
 * no zeroing pass before it. */
int kdev_attention_backward_set(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                                const float *q, const float *k, const float *v,
                                const float *out, const float *lse, const int *cu_seqlens,
                                int nseq, int max_seqlen, int N, int Hq, int Hkv, int D,
                                int causal);
/* The same with the rows of q, k, v ldq, ldk, ldv elements apart, and dq, dk, dv like
 * them (0: contiguous, Hq*D or Hkv*D): attention on the column blocks of the fused qkv
 * linear's rows and its gradient written into the fused gradient's, with no split or merge
 * copies.  out, dout and lse stay contiguous.  The cpu is bitwise its contiguous form; a
 * GPU reads and writes such rows in place where they lie in activation memory, and goes
 * through contiguous copies elsewhere. */
int kdev_attention_forward_ld(kdev *d, float *out, float *lse, const float *q, const float *k,
                              const float *v, int ldq, int ldk, int ldv, const int *cu_seqlens,
                              int nseq, int max_seqlen, int N, int Hq, int Hkv, int D,
                              int causal);
int kdev_attention_backward_ld_set(kdev *d, float *dq, float *dk, float *dv,
                                   const float *dout, const float *q, const float *k,
                                   const float *v, const float *out, const float *lse, int ldq,
                                   int ldk, int ldv, const int *cu_seqlens, int nseq,
                                   int max_seqlen, int N, int Hq, int Hkv, int D, int causal);
/* Block attention (context parallelism, sequence chunks); the index arrays are device
 * arrays; max_q, max_k >= the longest sequence's rows in q_cu and k_cu. */
int kdev_attention_block_forward(kdev *d, float *out, float *lse, const float *q,
                                 const float *k, const float *v, const int *q_cu,
                                 const int *q_pos, const int *k_cu, const int *k_pos,
                                 int nseq, int max_q, int max_k, int Hq, int Hkv, int D,
                                 int causal);
int kdev_attention_block_backward(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, const int *q_cu,
                                  const int *q_pos, const int *k_cu, const int *k_pos,
                                  int nseq, int max_q, int max_k, int Hq, int Hkv, int D,
                                  int causal);
int kdev_swiglu_forward(kdev *d, float *out, const float *inp, int N, int F);
int kdev_swiglu_backward(kdev *d, float *dinp, const float *dout, const float *inp, int N,
                         int F);
int kdev_gelu_forward(kdev *d, float *out, const float *inp, size_t n, kgelu_kind kind);
int kdev_gelu_backward(kdev *d, float *dinp, const float *dout, const float *inp, size_t n,
                       kgelu_kind kind);
/* The activations' backward with dinp written (=), not added to. */
int kdev_swiglu_backward_set(kdev *d, float *dinp, const float *dout, const float *inp, int N,
                             int F);
int kdev_gelu_backward_set(kdev *d, float *dinp, const float *dout, const float *inp,
                           size_t n, kgelu_kind kind);

/* ---- vocabulary-parallel cross-entropy pieces ------------------------------------------
 * A rank holds the columns [v0, v0 + Vl) of the logits of n rows, logits [n, Vl].
 *   rowmax:   mx[r] = max_j logits[r, j]  (-inf for Vl == 0).
 *   rowsum:   sums[r] = sum_j exp((double)logits[r, j] - mx[r]) (double, in a fixed order
 *             per backend: deterministic), and
 *             sums[n + r] = logits[r, targets[r] - v0] (as double) when the target falls in
 *             the slice, else 0.
 *   grad:     dlogits[r, j] = (float)(dl * (p - [j == targets[r] - v0])), p =
 *             exp((double)logits[r, j] - lse[r]); WRITTEN, not added; dlogits may be
 *             logits itself (each element is read before it is written).
 * mx, sums, lse and targets are device arrays. */
int kdev_ce_rowmax(kdev *d, float *mx, const float *logits, int n, int Vl);
int kdev_ce_rowsum(kdev *d, double *sums, const float *logits, const float *mx,
                   const int *targets, int v0, int n, int Vl);
int kdev_ce_grad(kdev *d, float *dlogits, const float *logits, const double *lse,
                 const int *targets, int v0, double dl, int n, int Vl);
/*   finish:   lse[r] = mx[r] + log(sums[r]) and losses[r] = (float)(lse[r] - sums[n + r]),
 *             in double, from rowmax's and rowsum's outputs (reduced over the ranks that
 *             hold the vocabulary, if several). */
int kdev_ce_finish(kdev *d, double *lse, float *losses, const float *mx, const double *sums,
                   int n);

/* ---- the LM head with its cross-entropy, fused ------------------------------------------
 * For n rows inp[n, K] whose targets all lie in a vocabulary [0, V) held whole by this
 * device (no vocabulary split over ranks), head weight w[V, K]:
 *   head_ce_forward:  the logits inp . w^T into ws, then lse (n doubles) and losses (n
 *                     floats) as kdev_ce_rowmax, kdev_ce_rowsum (v0 = 0) and kdev_ce_finish
 *                     define them; mx (n floats) and sums (2n doubles) are scratch.
 *   head_ce_backward: from ws and lse as the forward of the same rows left them:
 *                     dinp[n, K] += G . w and dw[V, K] += G^T . inp, G = kdev_ce_grad's
 *                     gradient (dl) of those logits; ws is overwritten.
 * ws holds n * V floats; what it holds between the two calls is the backend's (the cpu:
 * the fp32 logits; a GPU at precision BF16: bf16 logits in padded rows and its own row
 * statistics).  The cpu backend is exactly the composition of the ops named (the model's
 * vocabulary-parallel path at one rank computes the same, bit for bit). */
int kdev_head_ce_forward(kdev *d, float *ws, double *lse, float *losses, float *mx,
                         double *sums, const float *inp, const float *w, const int *targets,
                         int n, int K, int V);
int kdev_head_ce_backward(kdev *d, float *dinp, float *dw, float *ws, const double *lse,
                          const int *targets, double dl, const float *inp, const float *w,
                          int n, int K, int V);

/* ---- mixture of experts (kernels.h kcpu_moe_*) ------------------------------------------
 * aux: a DEVICE float (may be NULL).  The plan's offsets are a device array; callers that
 * need them on the host download them. */
int kdev_moe_router_forward(kdev *d, int *topk_idx, float *topk_w, float *probs, float *aux,
                            const float *logits, int N, int E, int K);
int kdev_moe_router_backward(kdev *d, float *dlogits, const float *dtopk_w, float daux,
                             const float *probs, const int *topk_idx, const float *topk_w,
                             int N, int E, int K);
int kdev_moe_plan(kdev *d, int *offsets, int *row_src, int *slot_row, const int *topk_idx,
                  int N, int E, int K);
int kdev_moe_permute_forward(kdev *d, float *out, const float *inp, const int *row_src,
                             int N, int K, int C);
int kdev_moe_permute_backward(kdev *d, float *dinp, const float *dout, const int *row_src,
                              int N, int K, int C);
int kdev_moe_unpermute_forward(kdev *d, float *out, const float *expert_out,
                               const float *topk_w, const int *slot_row, int N, int K, int C);
int kdev_moe_unpermute_backward(kdev *d, float *dexpert_out, float *dtopk_w, const float *dout,
                                const float *expert_out, const float *topk_w,
                                const int *slot_row, int N, int K, int C);

/* ---- FP8 emulation (kernels.h) ----------------------------------------------------------
 * amax: *amax (a HOST float) = kcpu_amax(x, n); waits for the stream.  (An FP8 GEMM
 * records its operands' amax on the device without a wait: kdev_fp8_amax.) */
int kdev_amax(kdev *d, float *amax, const float *x, size_t n);
int kdev_fp8_qdq(kdev *d, float *out, const float *x, size_t n, float scale, kfp8_format f);

/* ---- FP8 GEMMs --------------------------------------------------------------------------
 * The FP8 linear of trainer/model/fp8.h, with Q(t, s, f) = kdev_fp8_qdq(t, s, f) and the
 * per-tensor scales sx, sw, sd as HOST floats (kcpu_fp8_scale's quantisation factors):
 *   fp8_matmul_forward:   out = Q(inp, sx, E4M3) . Q(w, sw, E4M3)^T (+ bias), written
 *   fp8_matmul_backward:  dinp += Q(dout, sd, fd) . Q(w, sw, E4M3)
 *                         dw   += Q(dout, sd, fd)^T . Q(inp, sx, E4M3)   (NULL: not wanted;
 *                         no bias gradient: kdev_matmul_backward's, from the fp32 dout)
 * The cpu backend is exactly kdev_fp8_qdq of the operands into ws and then
 * kdev_matmul_forward/backward (the emulation, composed in kdev.c), which every backend
 * without an FP8 GEMM for the arguments gets too.  The cuda backend quantises to FP8
 * bytes with the same rounding and multiplies on the FP8 tensor cores (cuBLASLt, where
 * M, K and N are multiples of 16), fp32 accumulation: the same quantised values, products
 * that differ from the cpu's by the order of the fp32 sums and by dequantising the sum
 * (times 1/sx/sw) rather than each operand.
 * ws: the emulation's fp32 scratch, forward M*K + N*K floats, backward M*N + (dw ? M*K :
 * 0) + (dinp ? N*K : 0).  ws == NULL: only an FP8 GEMM may run; where the backend has none
 * the call returns HERR_NOALGO having done nothing, and the device's status stays as it
 * was (not a failure), so that a caller allocates ws only where it is needed.
 * amax (may be NULL, and each of its pointers): DEVICE floats that the call also sets to
 * kcpu_amax of its operands (forward: x = inp's, w = w's; backward: dy = dout's), in
 * stream order, without waiting: a caller that needs them later reads many with one
 * kdev_download. */
typedef struct {
    float *x, *w, *dy;
} kdev_fp8_amax;
int kdev_fp8_matmul_forward(kdev *d, float *ws, float *out, const float *inp, const float *w,
                            const float *bias, int M, int K, int N, float sx, float sw,
                            const kdev_fp8_amax *amax);
int kdev_fp8_matmul_backward(kdev *d, float *ws, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, int M, int K, int N, float sx,
                             float sw, float sd, kfp8_format fd, const kdev_fp8_amax *amax);

/* ---- optimizer --------------------------------------------------------------------------
 * sumsq: *out (a HOST double) = kcpu_sumsq(x, n); waits for the stream. */
int kdev_adamw_update(kdev *d, float *param, const float *grad, float *m, float *v, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      int step);
int kdev_sumsq(kdev *d, double *out, const float *x, size_t n);

/* The same over many tensors in one call (a GPU runs each as one launch with one host
 * round trip instead of one per tensor).  The arrays describe device tensors and are
 * host memory, read during the call.
 *   sumsq_multi: *out (HOST double) = sum over i in order of kdev_sumsq(x[i], n[i]) (the
 *                cpu exactly so; a GPU in its own fixed order).
 *   adamw_multi: for each tensor, g = grad * clip (clip != 1; the cpu scales the gradient
 *                in place as kdev_scale, a GPU on the fly), then kdev_adamw_update with
 *                weight_decay where decay is set, else 0. */
typedef struct {
    float *param;
    float *grad;
    float *m, *v;
    size_t n;
    int decay;
} kdev_adamw_tensor;
int kdev_sumsq_multi(kdev *d, double *out, const float *const *x, const size_t *n, int count);
int kdev_adamw_multi(kdev *d, const kdev_adamw_tensor *t, int count, float clip, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int step);

#ifdef __cplusplus
}
#endif

#endif
