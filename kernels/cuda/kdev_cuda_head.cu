/* kdev_cuda_head.cu - kdev_head_ce_forward/backward at the precision BF16: the LM head's
 * logits exist only in bf16, in the caller's workspace, never in fp32.
 *
 *   forward:  inp and w converted to bf16 (w's rows padded with zero rows to Vp = V
 *             rounded up to 8, so that every bf16 row is a 16-byte multiple);
 *             logits16[n, Vp] = inp16 . w16^T, bf16 out of cuBLASLt (fp32 accumulation),
 *             into ws; kcuda_ce_forward_bf16_ld reads each row once (online max and sum)
 *             and writes the loss and the row's lse (fp32, kept in ws; the caller's double
 *             lse gets the same values widened).
 *   backward: (softmax - onehot) * dl written over logits16 in place, in bf16; the pad
 *             columns keep the forward's exact zeros (zero weight rows), which the
 *             backward's products over Vp columns need (kdev_cuda_gemm16.cu,
 *             cuda_matmul16_backward_from).
 * Against the fp32 path of the same op (ce pieces over fp32 logits): one GEMM writing 2
 * bytes per logit instead of 4 plus a copy, one read per pass over the logits instead of
 * four, no conversion of the gradient.  The cross-entropy agrees with the fp32 logits' to
 * bf16 rounding of the logits (the GPU's BF16 contract, kdev_set_precision).
 *
 * ws layout: logits16 [n, Vp] bf16 | lse [n] fp32 | dl [n] fp32 (each at 256 bytes); where
 * that exceeds the n * V floats the caller provides (a tiny vocabulary), or K % 8 != 0, the
 * op answers HERR_NOALGO and kdev composes it from the fp32 pieces. */
#include "cuda/kdev_cuda_internal.h"

#include <limits.h>

/* No row is ignored: every row of the head has a target. */
#define NO_IGNORE INT_MIN

struct head_ws {
    kcuda_bf16 *logits;
    float *lse, *dl;
    int Vp;
};

/* ws carved as above; 0 when it does not fit or the shape has no bf16 path. */
static int head_layout(const kdev *d, struct head_ws *h, float *ws, int n, int K, int V)
{
    if (cuda_st(d)->prec != KDEV_PREC_BF16 || K % 8 != 0 || n <= 0 || V <= 0)
        return 0;
    h->Vp = cuda_pitch8(V);
    size_t a = cuda_align256((size_t)n * h->Vp * sizeof(kcuda_bf16));
    size_t b = cuda_align256((size_t)n * sizeof(float));
    if (a + 2 * b > (size_t)n * V * sizeof(float))
        return 0;
    h->logits = (kcuda_bf16 *)ws;
    h->lse = (float *)((char *)ws + a);
    h->dl = (float *)((char *)ws + a + b);
    return 1;
}

__global__ void widen_kernel(double *dst, const float *src, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = src[i];
}

int cuda_head_ce_forward(kdev *d, float *ws, double *lse, float *losses, float *mx,
                         double *sums, const float *inp, const float *w, const int *targets,
                         int n, int K, int V)
{
    static const char op[] = "head_ce_forward (bf16)";
    (void)mx, (void)sums;
    if (int rc = cuda_no_act16(d, op, "inp", inp))
        return rc;
    struct head_ws h;
    if (!head_layout(d, &h, ws, n, K, V))
        return HERR_NOALGO;
    kcuda_ctx *k = cuda_st(d)->k;
    size_t count[2] = { (size_t)n * K, (size_t)h.Vp * K };
    kcuda_bf16 *b[2];   /* inp, w */
    int rc = cuda_carve_bf16(d, b, count, 2, op);
    if (!rc)
        rc = cuda_to_bf16(d, b[0], inp, count[0], op);
    if (!rc)
        rc = cuda_to_bf16(d, b[1], w, (size_t)V * K, op);
    if (!rc && h.Vp > V)
        rc = cuda_err(d, cudaMemsetAsync(b[1] + (size_t)V * K, 0,
                                         (size_t)(h.Vp - V) * K * sizeof(kcuda_bf16),
                                         cuda_stream(d)),
                      op);
    if (rc)
        return rc;
    rc = kcuda_matmul_forward_bf16(k, h.logits, b[0], b[1], NULL, n, K, h.Vp);
    if (rc)   /* nothing of the caller's is written yet: the composition may run */
        return rc == KCUDA_ENOALGO ? HERR_NOALGO : cuda_kc(d, rc, op);
    if ((rc = cuda_kc(d, kcuda_ce_forward_bf16_ld(k, losses, h.lse, h.logits, h.Vp, targets, n,
                                                  V, NO_IGNORE),
                      op)))
        return rc;
    widen_kernel<<<(n + 255) / 256, 256, 0, cuda_stream(d)>>>(lse, h.lse, n);
    return cuda_launched(d, op);
}

int cuda_head_ce_backward(kdev *d, float *dinp, float *dw, float *ws, const double *lse,
                          const int *targets, double dl, const float *inp, const float *w,
                          int n, int K, int V)
{
    static const char op[] = "head_ce_backward (bf16)";
    (void)lse;   /* the forward's fp32 lse in ws is what the bf16 kernel reads */
    if (int rc = cuda_no_act16(d, op, "inp", inp))
        return rc;
    struct head_ws h;
    if (!head_layout(d, &h, ws, n, K, V))
        return HERR_NOALGO;
    int rc = cuda_fill(d, h.dl, (size_t)n, (float)dl);
    if (!rc)
        rc = cuda_kc(d, kcuda_ce_backward_bf16_ld(cuda_st(d)->k, h.logits, h.logits, h.Vp,
                                                  h.lse, targets, h.dl, n, V, NO_IGNORE),
                     op);
    if (rc)
        return rc;
    rc = cuda_matmul16_backward_from(d, dinp, dw, NULL, NULL, h.logits, inp, w, n, K, V, 0);
    /* the gradient is already over ws: the composition cannot start again from logits */
    return rc == HERR_NOALGO ? kdev_fail(d, HERR_DEVICE, "%s: cuBLASLt has no bf16 "
                                         "algorithm for %d x %d x %d", op, n, K, V)
                             : rc;
}
