/* kdev_cuda_gemm16.cu - kdev's matmul at the precision BF16: the fp32 operands are
 * converted to bf16 in the device scratch once per call and multiplied by cuBLASLt with
 * bf16 A/B and fp32 C (fp32 accumulation): the tensor cores' bf16 rate, where fp32
 * operands with CUBLAS_COMPUTE_32F_FAST_16BF re-read and convert them inside the GEMM.
 *   forward:  out = bf16(inp) . bf16(weight)^T (+ bias, fp32 epilogue)
 *   backward: dinp += bf16(dout) . bf16(weight); dweight += bf16(dout)^T . bf16(inp), both
 *             fp32 out of cuBLASLt; dbias += column sums of the fp32 dout.
 * Weights are converted per call (a few MB per GEMM: small beside the activations); the
 * conversions round to nearest even and cost one read and a half-size write each.
 * The bf16 operands' rows must be 16-byte multiples: K a multiple of 8 (else the call is
 * left to the fp32-operand path: HERR_NOALGO before anything is written, so that a GEMM
 * of the pair never fails after the other has added its part); dout, whose rows are N
 * long (a vocabulary of 50257 in the LM head), is converted with its rows padded to a
 * multiple of 8 (zeros), which the GEMMs read through their leading dimension. */
#include "cuda/kdev_cuda_internal.h"

static int fits(int K)
{
    return K % 8 == 0;
}

static int pitch8(int N)
{
    return (N + 7) & ~7;
}

int cuda_matmul16_forward(kdev *d, float *out, const float *inp, const float *weight,
                          const float *bias, int M, int K, int N)
{
    static const char op[] = "matmul_forward (bf16)";
    if (!fits(K))
        return HERR_NOALGO;
    size_t count[2] = { (size_t)M * K, (size_t)N * K };
    kcuda_bf16 *b[2];   /* inp, weight */
    int rc = cuda_carve_bf16(d, b, count, 2, op);
    if (!rc)
        rc = cuda_to_bf16(d, b[0], inp, count[0], op);
    if (!rc)
        rc = cuda_to_bf16(d, b[1], weight, count[1], op);
    if (rc)
        return rc;
    rc = kcuda_matmul_forward_bf16_f32out(cuda_st(d)->k, out, b[0], b[1], bias, M, K, N);
    return rc == KCUDA_ENOALGO ? HERR_NOALGO : cuda_kc(d, rc, op);
}

int cuda_matmul16_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight, int M,
                           int K, int N)
{
    static const char op[] = "matmul_backward (bf16)";
    if (!fits(K))
        return HERR_NOALGO;
    kcuda_ctx *k = cuda_st(d)->k;
    int ldd = pitch8(N);
    size_t count[3] = { (size_t)M * ldd, dweight ? (size_t)M * K : 0, dinp ? (size_t)N * K : 0 };
    kcuda_bf16 *b[3];   /* dout, inp, weight */
    int rc = 0;
    if (dinp || dweight) {
        rc = cuda_carve_bf16(d, b, count, 3, op);
        if (!rc)
            rc = cuda_to_bf16_pitched(d, b[0], ldd, dout, (size_t)M, N, op);
        if (!rc && dweight)
            rc = cuda_to_bf16(d, b[1], inp, count[1], op);
        if (!rc && dinp)
            rc = cuda_to_bf16(d, b[2], weight, count[2], op);
        if (rc)
            return rc;
    }
    if (dinp) {
        rc = kcuda_matmul_dinp_bf16_f32out(k, dinp, b[0], ldd, b[2], M, K, N);
        if (rc)
            return rc == KCUDA_ENOALGO ? HERR_NOALGO : cuda_kc(d, rc, op);
    }
    if (dweight) {
        rc = kcuda_matmul_dweight_bf16_f32out(k, dweight, b[0], ldd, b[1], M, K, N);
        if (rc)   /* dinp is done: finishing in fp32 math would add it twice */
            return cuda_kc(d, rc, op);
    }
    if (dbias)
        rc = cuda_kc(d, kcuda_matmul_backward_f32(k, NULL, NULL, dbias, dout, NULL, NULL, M, K,
                                                  N),
                     op);
    return rc;
}
