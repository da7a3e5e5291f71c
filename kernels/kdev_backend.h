/* kdev_backend.h - what a device backend provides behind kdev.h.
 *
 * kdev.c owns the device object and calls the backend through this table; a backend
 * implements every entry (none may be NULL) with the signature of the kdev_ function of
 * the same name, minus nothing: the first argument is the device.  A backend keeps its
 * state in d->impl (set by init, released by fini) and reports a failure with kdev_fail.
 *
 * The cuda backend lives in a shared library (libhearth_cuda.so, built only with nvcc)
 * that kdev_create loads on demand and asks for its table through the one exported
 * function KDEV_CUDA_ENTRY, so that a program linked with the kernels runs on a machine
 * without CUDA libraries and refuses `cuda` there with a message. */
#ifndef HEARTH_KDEV_BACKEND_H
#define HEARTH_KDEV_BACKEND_H

#include <stdarg.h>
#include <stdio.h>

#include "kdev.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KDEV_ERRMSG 512
/* The cuda backend's exported entry: const kdev_ops *KDEV_CUDA_ENTRY(void). */
#define KDEV_CUDA_ENTRY hearth_kdev_cuda_ops
#define KDEV_CUDA_ENTRY_NAME "hearth_kdev_cuda_ops"
/* Bumped whenever kdev_ops or struct kdev changes: a library of another version is
 * refused rather than called through a table of another layout. */
#define KDEV_ABI 14

struct kdev {
    const kdev_ops *ops;
    kdev_kind kind;
    void *impl;                 /* the backend's state */
    void *dl;                   /* dlopen handle of the backend's library, or NULL */
    int status;                 /* the first failure since creation or kdev_status_clear */
    struct kdev_prof *prof;     /* kdev_profile_start (kdev.c); NULL = off */
    char errmsg[KDEV_ERRMSG];   /* its message */
};

struct kdev_ops {
    int abi;                    /* KDEV_ABI */
    const char *name;
    int (*init)(kdev *d);
    void (*fini)(kdev *d);
    const char *(*hw_name)(const kdev *d);
    int (*lib_version)(const kdev *d, kdev_lib lib);

    int (*alloc)(kdev *d, void **p, size_t bytes);
    void (*release)(kdev *d, void *p);
    int (*upload)(kdev *d, void *dst, const void *host, size_t bytes);
    int (*download)(kdev *d, void *host, const void *src, size_t bytes);
    int (*copy)(kdev *d, void *dst, const void *src, size_t bytes);
    int (*copy_2d)(kdev *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                   size_t width, size_t rows);
    int (*zero)(kdev *d, void *p, size_t bytes);
    int (*fill)(kdev *d, float *x, size_t n, float value);
    int (*sync)(kdev *d);
    int (*set_precision)(kdev *d, kdev_precision p);
    size_t (*act_bytes)(const kdev *d);
    int (*alloc_act)(kdev *d, void **p, size_t count);
    int (*act_copy_2d)(kdev *d, float *dst, size_t dpitch, const float *src, size_t spitch,
                       size_t rows, size_t cols);
    void (*mem_stats)(const kdev *d, size_t *peak, size_t *current);
    /* Profile marks (kdev_profile_start): mark i at the stream's current position (i <
     * KDEV_PROF_MARKS); read: waits for mark n - 1, ms[i] = time from mark i to mark
     * i + 1 for i < n - 1, then makes mark n - 1 the new mark 0. */
    int (*prof_mark)(kdev *d, int i);
    int (*prof_read)(kdev *d, double *ms, int n);

    int (*gather_rows)(kdev *d, float *dst, const float *src, const int *idx, int n, int C);
    int (*scatter_rows)(kdev *d, float *dst, const float *src, const int *idx, int n, int C);
    int (*add_bias)(kdev *d, float *x, const float *bias, int n, int C);

    /* res: NULL, or the fp32 [M, N] added to the product (kdev_matmul_forward_residual) */
    int (*matmul_forward)(kdev *d, float *out, const float *inp, const float *weight,
                          const float *bias, const float *res, int M, int K, int N);
    /* set: dinp is written, not added to (kdev_matmul_backward_set) */
    int (*matmul_backward)(kdev *d, float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight, int M,
                           int K, int N, int set);
    int (*add)(kdev *d, float *out, const float *a, const float *b, size_t n);
    int (*accumulate)(kdev *d, float *dst, const float *src, size_t n);
    int (*scale)(kdev *d, float *x, size_t n, float s);
    int (*embedding_forward)(kdev *d, float *out, const int *ids, const float *table, int N,
                             int C);
    int (*embedding_backward)(kdev *d, float *dtable, const float *dout, const int *ids,
                              int N, int C);
    int (*rmsnorm_forward)(kdev *d, float *out, float *rstd, const float *inp,
                           const float *weight, int N, int C, float eps);
    int (*rmsnorm_backward)(kdev *d, float *dinp, float *dweight, const float *dout,
                            const float *inp, const float *weight, const float *rstd, int N,
                            int C);
    int (*layernorm_forward)(kdev *d, float *out, float *mean, float *rstd, const float *inp,
                             const float *weight, const float *bias, int N, int C, float eps);
    int (*layernorm_backward)(kdev *d, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight,
                              const float *mean, const float *rstd, int N, int C);
    int (*rope_forward)(kdev *d, float *x, const float *cos, const float *sin, int N, int H,
                        int D);
    int (*rope_backward)(kdev *d, float *dx, const float *cos, const float *sin, int N, int H,
                         int D);
    /* ldq, ldk, ldv: the row strides of q, k, v (and dq, dk, dv) as kdev_attention_forward_ld
     * has them, 0 = contiguous */
    int (*attention_forward)(kdev *d, float *out, float *lse, const float *q, const float *k,
                             const float *v, int ldq, int ldk, int ldv, const int *cu_seqlens,
                             int nseq, int max_seqlen, int N, int Hq, int Hkv, int D,
                             int causal);
    /* set: dq, dk, dv written, not added to */
    int (*attention_backward)(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                              const float *q, const float *k, const float *v,
                              const float *out, const float *lse, int ldq, int ldk, int ldv,
                              const int *cu_seqlens, int nseq, int max_seqlen, int N, int Hq,
                              int Hkv, int D, int causal, int set);
    int (*attention_block_forward)(kdev *d, float *out, float *lse, const float *q,
                                   const float *k, const float *v, const int *q_cu,
                                   const int *q_pos, const int *k_cu, const int *k_pos,
                                   int nseq, int max_q, int max_k, int Hq, int Hkv, int D,
                                   int causal);
    int (*attention_block_backward)(kdev *d, float *dq, float *dk, float *dv,
                                    const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse,
                                    const int *q_cu, const int *q_pos, const int *k_cu,
                                    const int *k_pos, int nseq, int max_q, int max_k, int Hq,
                                    int Hkv, int D, int causal);
    int (*swiglu_forward)(kdev *d, float *out, const float *inp, int N, int F);
    int (*swiglu_backward)(kdev *d, float *dinp, const float *dout, const float *inp, int N,
                           int F, int set);
    int (*gelu_forward)(kdev *d, float *out, const float *inp, size_t n, kgelu_kind kind);
    int (*gelu_backward)(kdev *d, float *dinp, const float *dout, const float *inp, size_t n,
                         kgelu_kind kind, int set);

    int (*ce_rowmax)(kdev *d, float *mx, const float *logits, int n, int Vl);
    int (*ce_rowsum)(kdev *d, double *sums, const float *logits, const float *mx,
                     const int *targets, int v0, int n, int Vl);
    int (*ce_grad)(kdev *d, float *dlogits, const float *logits, const double *lse,
                   const int *targets, int v0, double dl, int n, int Vl);
    int (*ce_finish)(kdev *d, double *lse, float *losses, const float *mx,
                     const double *sums, int n);
    /* A backend without a fused path for these arguments returns HERR_NOALGO having done
     * nothing, and kdev.c composes the op from the ones above. */
    int (*head_ce_forward)(kdev *d, float *ws, double *lse, float *losses, float *mx,
                           double *sums, const float *inp, const float *w, const int *targets,
                           int n, int K, int V);
    int (*head_ce_backward)(kdev *d, float *dinp, float *dw, float *ws, const double *lse,
                            const int *targets, double dl, const float *inp, const float *w,
                            int n, int K, int V);

    int (*moe_router_forward)(kdev *d, int *topk_idx, float *topk_w, float *probs, float *aux,
                              const float *logits, int N, int E, int K);
    int (*moe_router_backward)(kdev *d, float *dlogits, const float *dtopk_w, float daux,
                               const float *probs, const int *topk_idx, const float *topk_w,
                               int N, int E, int K);
    int (*moe_plan)(kdev *d, int *offsets, int *row_src, int *slot_row, const int *topk_idx,
                    int N, int E, int K);
    int (*moe_permute_forward)(kdev *d, float *out, const float *inp, const int *row_src,
                               int N, int K, int C);
    int (*moe_permute_backward)(kdev *d, float *dinp, const float *dout, const int *row_src,
                                int N, int K, int C);
    int (*moe_unpermute_forward)(kdev *d, float *out, const float *expert_out,
                                 const float *topk_w, const int *slot_row, int N, int K,
                                 int C);
    int (*moe_unpermute_backward)(kdev *d, float *dexpert_out, float *dtopk_w,
                                  const float *dout, const float *expert_out,
                                  const float *topk_w, const int *slot_row, int N, int K,
                                  int C);

    /* to_device: amax is a device float, written in stream order (no wait) */
    int (*amax)(kdev *d, float *amax, const float *x, size_t n, int to_device);
    int (*fp8_qdq)(kdev *d, float *out, const float *x, size_t n, float scale,
                   kfp8_format f);
    /* As head_ce: HERR_NOALGO having done nothing where the backend has no FP8 GEMM for
     * the arguments (the cpu: always), and kdev.c runs the emulation in ws. */
    int (*fp8_matmul_forward)(kdev *d, float *ws, float *out, const float *inp,
                              const float *w, const float *bias, int M, int K, int N,
                              float sx, float sw, const kdev_fp8_amax *amax);
    int (*fp8_matmul_backward)(kdev *d, float *ws, float *dinp, float *dw, const float *dout,
                               const float *inp, const float *w, int M, int K, int N,
                               float sx, float sw, float sd, kfp8_format fd,
                               const kdev_fp8_amax *amax);

    int (*adamw_update)(kdev *d, float *param, const float *grad, float *m, float *v,
                        size_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int step);
    int (*sumsq)(kdev *d, double *out, const float *x, size_t n);
    int (*sumsq_multi)(kdev *d, double *out, const float *const *x, const size_t *n,
                       int count);
    int (*adamw_multi)(kdev *d, const kdev_adamw_tensor *t, int count, float clip, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int step);
};

/* Writes the message (printf format) into d, unless an earlier failure is still pending
 * (its message is the one worth reading), and returns code. */
static inline int kdev_fail(kdev *d, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int kdev_fail(kdev *d, int code, const char *fmt, ...)
{
    if (d->status == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->errmsg, sizeof d->errmsg, fmt, ap);
        va_end(ap);
    }
    return code;
}

#define KDEV_PROF_MARKS 4096

/* The cpu backend's table (kdev_cpu.c). */
const kdev_ops *kdev_cpu_ops(void);

#ifdef __cplusplus
}
#endif

#endif
