/* kdev_cuda_attn16.cu - attention at the precision BF16 (kdev_set_precision): the fp32
 * tensors of kdev's attention ops run through kcuda's bf16 flash-attention kernels
 * (kernels/cuda/attention.cu: tiled, tensor cores, deterministic).
 *
 *   forward:  q, k, v -> bf16 copies; kcuda_attention_forward_bf16; out <- fp32(out16),
 *             lse fp32 as the kernel writes it.
 *   backward: q, k, v, out, dout -> bf16; dq16, dk16, dv16 zeroed (the kernel adds);
 *             kcuda_attention_backward_bf16 with the forward's lse; dq, dk, dv += fp32 of
 *             them (kdev's backward accumulates; its _set form writes them).
 * The copies live in the device scratch (kdev_cuda.cu), carved at 256-byte boundaries
 * (the kernels want 16-byte aligned rows).  Everything is in stream order and nothing
 * here synchronises.  The conversions round to nearest even, as __float2bfloat16_rn.
 * q, k, v and out in bf16 activation memory (kdev.h) are the kernels' bf16 operands as
 * they lie: not converted either way; there q, k, v (and their gradients) may have rows
 * of their own stride (kdev_attention_forward_ld), which the kernels read and write in
 * place.  Tensors in fp32 memory are contiguous here. */
#include "cuda/kdev_cuda_internal.h"

/* Scratch for the bf16 copies of src[i] (count[i] elements), except where src[i] lies in
 * bf16 activation memory: then b[i] is src[i] itself and src[i] becomes NULL (nothing to
 * convert). */
static int carve_act16(kdev *d, kcuda_bf16 **b, size_t *count, const float **src, int n,
                       const char *op)
{
    kcuda_bf16 *own[8];
    int act[8] = { 0 };
    for (int i = 0; i < n; i++)
        if (src[i] && cuda_act16(d, src[i])) {
            act[i] = 1;
            count[i] = 0;
        }
    int rc = cuda_carve_bf16(d, own, count, n, op);
    for (int i = 0; i < n; i++) {
        b[i] = act[i] ? (kcuda_bf16 *)src[i] : own[i];
        if (act[i])
            src[i] = NULL;
    }
    return rc;
}

int cuda_attention16_fits(int D)
{
    return D == 64 || D == 80 || D == 128;   /* the head dims of kcuda's flash kernels */
}

/* The kernels' row stride of tensor p: its own (ld) where it lies in activation memory
 * (read in place), else its rows' width w (a contiguous bf16 copy). */
static int stride16(kdev *d, const float *p, int ld, int w)
{
    return p && cuda_act16(d, p) ? ld : w;
}

int cuda_attention16_forward(kdev *d, float *out, float *lse, const float *q, const float *k,
                             const float *v, int ldq, int ldk, int ldv, const int *cu_seqlens,
                             int nseq, int max_seqlen, int N, int Hq, int Hkv, int D,
                             int causal)
{
    static const char op[] = "attention_forward (bf16)";
    if (N <= 0 || nseq <= 0 || max_seqlen <= 0)
        return 0;
    int wq = Hq * D, wk = Hkv * D;
    size_t nq = (size_t)N * wq, nk = (size_t)N * wk;
    int sq = stride16(d, q, ldq, wq), sk = stride16(d, k, ldk, wk), sv = stride16(d, v, ldv, wk);
    const float *src[4] = { q, k, v, out };
    size_t count[4] = { nq, nk, nk, nq };
    kcuda_bf16 *b[4];   /* q, k, v, out */
    int rc = carve_act16(d, b, count, src, 4, op);
    for (int i = 0; !rc && i < 3; i++)
        if (src[i])
            rc = cuda_to_bf16(d, b[i], src[i], count[i], op);
    if (!rc)
        rc = cuda_kc(d, kcuda_attention_forward_bf16_ld(cuda_st(d)->k, b[3], lse, b[0], b[1],
                                                        b[2], sq, sk, sv, cu_seqlens, nseq,
                                                        max_seqlen, Hq, Hkv, D, causal),
                     op);
    return rc || !src[3] ? rc : cuda_from_bf16(d, out, b[3], nq, 0, op);
}

int cuda_attention16_backward(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                              const float *q, const float *k, const float *v,
                              const float *out, const float *lse, int ldq, int ldk, int ldv,
                              const int *cu_seqlens, int nseq, int max_seqlen, int N, int Hq,
                              int Hkv, int D, int causal, int set)
{
    static const char op[] = "attention_backward (bf16)";
    if (N <= 0 || nseq <= 0 || max_seqlen <= 0 || (!dq && !dk && !dv))
        return 0;
    int wq = Hq * D, wk = Hkv * D;
    size_t nq = (size_t)N * wq, nk = (size_t)N * wk;
    /* one stride for an input and its gradient: both in place, or both contiguous (the
     * caller, cuda_attention_backward, sends strided pairs here only in activation memory) */
    int sq = stride16(d, q, ldq, wq), sk = stride16(d, k, ldk, wk), sv = stride16(d, v, ldv, wk);
    int ld[3] = { sq, sk, sv }, w[3] = { wq, wk, wk };
    /* the gradients: where one lies in bf16 activation memory the kernel adds into it
     * (zeroed first when it is to be set), else into a zeroed bf16 copy added or written
     * back */
    float *g[3] = { dq, dk, dv };
    const float *src[8] = { q, k, v, out, dout, dq, dk, dv };
    size_t count[8] = { nq, nk, nk, nq, nq, dq ? nq : 0, dk ? nk : 0, dv ? nk : 0 };
    size_t n[3] = { count[5], count[6], count[7] };
    kcuda_bf16 *b[8];   /* q, k, v, out, dout, dq, dk, dv */
    int rc = carve_act16(d, b, count, src, 8, op);
    for (int i = 0; !rc && i < 5; i++)
        if (src[i])
            rc = cuda_to_bf16(d, b[i], src[i], count[i], op);
    for (int i = 0; !rc && i < 3; i++) {
        if (!n[i] || !(src[5 + i] || set))   /* a copy, or activation memory to be set */
            continue;
        size_t e = sizeof(kcuda_bf16);
        int own = src[5 + i] != NULL;   /* the contiguous copy */
        rc = cuda_err(d, own ? cudaMemsetAsync(b[5 + i], 0, n[i] * e, cuda_stream(d))
                             : cudaMemset2DAsync(b[5 + i], (size_t)ld[i] * e, 0,
                                                 (size_t)w[i] * e, (size_t)N, cuda_stream(d)),
                      op);
    }
    if (!rc)
        rc = cuda_kc(d, kcuda_attention_backward_bf16_ld(cuda_st(d)->k, dq ? b[5] : NULL,
                                                         dk ? b[6] : NULL, dv ? b[7] : NULL,
                                                         b[4], b[0], b[1], b[2], b[3], lse, sq,
                                                         sk, sv, cu_seqlens, nseq, max_seqlen,
                                                         Hq, Hkv, D, causal),
                     op);
    for (int i = 0; !rc && i < 3; i++)
        if (src[5 + i])
            rc = cuda_from_bf16(d, g[i], b[5 + i], n[i], !set, op);
    return rc;
}
