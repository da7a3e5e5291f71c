/* kdev_cuda_gemm16.cu - kdev's matmul at the precision BF16: the fp32 operands are
 * converted to bf16 in the device scratch once per call and multiplied by cuBLASLt with
 * bf16 A/B and fp32 C (fp32 accumulation): the tensor cores' bf16 rate, where fp32
 * operands with CUBLAS_COMPUTE_32F_FAST_16BF re-read and convert them inside the GEMM.
 *   forward:  out = bf16(inp) . bf16(weight)^T (+ bias, fp32 epilogue)
 *   backward: dinp += (or, set, =) bf16(dout) . bf16(weight); dweight += bf16(dout)^T . bf16(inp), both
 *             fp32 out of cuBLASLt; dbias += column sums of the fp32 dout.
 * Weights are converted per call (a few MB per GEMM: small beside the activations); the
 * conversions round to nearest even and cost one read and a half-size write each.
 * The bf16 operands' rows must be 16-byte multiples.  Where K is not a multiple of 8 (the
 * Qwen2.5-VL ViT's fc2 reduces over 3420), the operands are converted with their rows
 * padded to Kp = K rounded up to 8 (zeros: the products over Kp are those over K), and
 * the backward's K-wide results (dinp, dW) go through Kp-wide fp32 copies in the scratch
 * (cudaMemcpy2DAsync both ways).  dout, whose rows are N long (a vocabulary of 50257 in
 * the LM head), is converted with its rows padded to a multiple of 8 (zeros), and the
 * backward's products run over the padded width; with a bias, the same pass over dout
 * sums its columns (kcuda_bias_partials_to_bf16).  HERR_NOALGO (cuBLASLt has no
 * algorithm) comes before anything is written, so that a GEMM of the pair never fails
 * after the other has added its part.  An inp or dout in bf16 activation memory (kdev.h)
 * is the operand as it lies (rows padded into the scratch only where K, or N, % 8 != 0):
 * nothing to convert; dbias then sums dout's bf16 values. */
#include "cuda/kdev_cuda_internal.h"

/* rows x K fp32 into bf16 rows Kp >= K apart (pad zero). */
static int rows_to_bf16(kdev *d, kcuda_bf16 *dst, const float *src, size_t rows, int K,
                        int Kp, const char *op)
{
    return Kp == K ? cuda_to_bf16(d, dst, src, rows * (size_t)K, op)
                   : cuda_to_bf16_pitched(d, dst, Kp, src, rows, K, op);
}

/* The bf16 operand of src [rows, K] with rows Kp apart: src itself where it lies in bf16
 * activation memory and K == Kp, else written into dst (converted from fp32, or the
 * bf16 rows copied with zero padding). */
static int operand16(kdev *d, const kcuda_bf16 **out, kcuda_bf16 *dst, const float *src,
                     size_t rows, int K, int Kp, const char *op)
{
    *out = dst;
    if (!cuda_act16(d, src))
        return rows_to_bf16(d, dst, src, rows, K, Kp, op);
    if (Kp == K) {
        *out = (const kcuda_bf16 *)src;
        return 0;
    }
    cudaStream_t st = cuda_stream(d);
    size_t e = sizeof(kcuda_bf16);
    int rc = cuda_err(d, cudaMemsetAsync(dst, 0, rows * (size_t)Kp * e, st), op);
    return rc ? rc : cuda_err(d, cudaMemcpy2DAsync(dst, (size_t)Kp * e, src, (size_t)K * e,
                                                   (size_t)K * e, rows,
                                                   cudaMemcpyDeviceToDevice, st),
                              op);
}

/* The scratch elements operand16 needs for src. */
static size_t operand16_count(const kdev *d, const float *src, size_t rows, int K, int Kp)
{
    return cuda_act16(d, src) && K == Kp ? 0 : rows * (size_t)Kp;
}

/* rows x cols fp32 from rows `spitch` apart to rows `dpitch` apart (device to device). */
static int copy_rows(kdev *d, float *dst, int dpitch, const float *src, int spitch,
                     size_t rows, int cols, const char *op)
{
    return cuda_err(d, cudaMemcpy2DAsync(dst, (size_t)dpitch * sizeof(float), src,
                                         (size_t)spitch * sizeof(float),
                                         (size_t)cols * sizeof(float), rows,
                                         cudaMemcpyDeviceToDevice, cuda_stream(d)),
                    op);
}


/* fp32 output rows that are not 16-byte multiples (N % 4 != 0: the LM head's 50257)
 * keep cuBLASLt off its vectorised epilogues: 13.2 ms against 2.2 ms for 50264 columns
 * (16384 x 768 x 50257, H100, contrib/bench/bench_kdev_gpu).  Such a product runs over
 * Np = N rounded up to 8 columns, the weight's extra rows (and bias entries) zero, in
 * blocks of rows into the scratch, and each block's first N columns are copied to out:
 * the copy costs one more read and write of the output, the block bounds the scratch. */
#define PAD_BLOCK_FLOATS ((size_t)1 << 26)   /* 256 MiB of fp32 output per block */

static int forward_padded(kdev *d, float *out, const float *inp, const float *weight,
                          const float *bias, const float *res, int M, int K, int Kp, int N,
                          const char *op)
{
    int Np = cuda_pitch8(N);
    size_t rows = PAD_BLOCK_FLOATS / (size_t)Np;
    int R = rows < 8 ? 8 : rows > (size_t)M ? M : (int)rows;
    /* one carve (a later one would reuse the scratch from its start): the input, the
     * padded weight, the fp32 block and the padded bias, the fp32 ones as bf16 pairs */
    size_t count[4] = { operand16_count(d, inp, (size_t)M, K, Kp), (size_t)Np * Kp,
                        2 * (size_t)R * Np, bias ? 2 * (size_t)Np : 0 };
    kcuda_bf16 *b[4];
    const kcuda_bf16 *x = NULL;
    int rc = cuda_carve_bf16(d, b, count, 4, op);
    cudaStream_t st = cuda_stream(d);
    if (!rc)
        rc = operand16(d, &x, b[0], inp, (size_t)M, K, Kp, op);
    if (!rc)
        rc = rows_to_bf16(d, b[1], weight, (size_t)N, K, Kp, op);
    if (!rc)
        rc = cuda_err(d, cudaMemsetAsync(b[1] + (size_t)N * Kp, 0,
                                         (size_t)(Np - N) * Kp * sizeof(kcuda_bf16), st), op);
    float *blk = (float *)b[2], *pb = bias ? (float *)b[3] : NULL;
    if (!rc && pb)
        rc = cuda_err(d, cudaMemsetAsync(pb, 0, (size_t)Np * sizeof(float), st), op);
    if (!rc && pb)
        rc = cuda_err(d, cudaMemcpyAsync(pb, bias, (size_t)N * sizeof(float),
                                         cudaMemcpyDeviceToDevice, st), op);
    for (int r0 = 0; !rc && r0 < M; r0 += R) {
        int n = M - r0 < R ? M - r0 : R;
        rc = kcuda_matmul_forward_bf16_f32out(cuda_st(d)->k, blk, x + (size_t)r0 * Kp, b[1],
                                              pb, n, Kp, Np);
        if (rc)   /* out is written block by block: no fallback once a block is done */
            return rc == KCUDA_ENOALGO && r0 == 0 ? HERR_NOALGO : cuda_kc(d, rc, op);
        rc = cuda_unpitch(d, out + (size_t)r0 * N, blk, (size_t)n, N, Np, op);
    }
    return rc || !res ? rc : cuda_add(d, out, res, out, (size_t)M * N);
}

int cuda_matmul16_forward(kdev *d, float *out, const float *inp, const float *weight,
                          const float *bias, const float *res, int M, int K, int N)
{
    static const char op[] = "matmul_forward (bf16)";
    int Kp = cuda_pitch8(K);
    /* an out in bf16 activation memory: the GEMM's bf16 output (its bias rounded to bf16
     * for the epilogue) where no padding is needed; elsewhere the caller goes through an
     * fp32 copy */
    int out16 = cuda_act16(d, out);
    if (out16 && (Kp != K || N % 8 || res))
        return HERR_NOALGO;
    if (N % 4)
        return forward_padded(d, out, inp, weight, bias, res, M, K, Kp, N, op);
    size_t count[3] = { operand16_count(d, inp, (size_t)M, K, Kp), (size_t)N * Kp,
                        out16 && bias ? (size_t)N : 0 };
    kcuda_bf16 *b[3];   /* inp, weight, bias */
    const kcuda_bf16 *x = NULL;
    int rc = cuda_carve_bf16(d, b, count, 3, op);
    if (!rc)
        rc = operand16(d, &x, b[0], inp, (size_t)M, K, Kp, op);
    if (!rc)
        rc = rows_to_bf16(d, b[1], weight, (size_t)N, K, Kp, op);
    if (!rc && count[2])
        rc = cuda_to_bf16(d, b[2], bias, (size_t)N, op);
    if (rc)
        return rc;
    if (out16)
        rc = kcuda_matmul_forward_bf16(cuda_st(d)->k, (kcuda_bf16 *)out, x, b[1],
                                       bias ? b[2] : NULL, M, K, N);
    else if (res)   /* the residual through cuBLASLt's C: one pass over out, not three */
        rc = kcuda_matmul_forward_bf16_f32res(cuda_st(d)->k, out, res, x, b[1], bias, M, Kp, N);
    else
        rc = kcuda_matmul_forward_bf16_f32out(cuda_st(d)->k, out, x, b[1], bias, M, Kp, N);
    return rc == KCUDA_ENOALGO ? HERR_NOALGO : cuda_kc(d, rc, op);
}

/* The backward from dout in fp32 (converted here; with dbias its column sums in the same
 * pass) or, dout == NULL, from dout16: bf16 rows of cuda_pitch8(N) elements whose pad columns
 * are zero, outside the scratch (kdev_cuda_head.cu), no dbias. */
int cuda_matmul16_backward_from(kdev *d, float *dinp, float *dweight, float *dbias,
                                const float *dout, const kcuda_bf16 *dout16,
                                const float *inp, const float *weight, int M, int K, int N,
                                int set)
{
    static const char op[] = "matmul_backward (bf16)";
    kcuda_ctx *k = cuda_st(d)->k;
    cudaStream_t st = cuda_stream(d);
    /* Both products run over Np = N rounded up to 8 (dout's pad columns are zero): with
     * N % 8 != 0 as the reduction dimension of dinp, cuBLASLt takes 9.6 ms against 1.6 for
     * the padded 50264 (16384 x 768, H100, bench_kdev_gpu); dW's 50257 rows 2.6 against
     * 1.7.  The weight gets zero pad rows, dW a padded fp32 copy that takes the sum. */
    int Np = cuda_pitch8(N), Kp = cuda_pitch8(K), pad = Np != N || Kp != K;
    /* a dinp in bf16 activation memory is the bf16 GEMM's output where no padding is
     * needed; elsewhere the caller goes through an fp32 copy */
    int dinp16 = dinp && cuda_act16(d, dinp);
    if (dinp16 && pad)
        return HERR_NOALGO;
    /* dout in bf16 activation memory: the operand itself, or its rows padded */
    int act = !dout16 && cuda_act16(d, dout);
    if (act)
        dout16 = (const kcuda_bf16 *)dout;
    /* dout, inp, weight, the bias gradient's partial sums, the padded dW and the padded
     * dinp (the last three fp32, counted as bf16 pairs) */
    size_t count[6] = { act ? operand16_count(d, dout, (size_t)M, N, Np)
                            : dout16 ? 0 : (size_t)M * Np,
                        dweight ? operand16_count(d, inp, (size_t)M, K, Kp) : 0,
                        dinp ? (size_t)Np * Kp : 0,
                        dbias ? 2 * kcuda_bias_partials_floats(M, N) : 0,
                        pad && dweight ? 2 * (size_t)Np * Kp : 0,
                        Kp != K && dinp ? 2 * (size_t)M * Kp : 0 };
    kcuda_bf16 *b[6];
    const kcuda_bf16 *x = NULL;   /* inp's operand */
    float *part = NULL, *dw = pad && dweight ? NULL : dweight;
    float *di = Kp != K ? NULL : dinp;
    size_t padbytes = (size_t)(Np - N) * Kp;
    int rc = 0;
    if (dinp || dweight || act) {
        rc = cuda_carve_bf16(d, b, count, 6, op);
        const kcuda_bf16 *x0 = NULL;
        if (act && !rc)
            rc = operand16(d, &x0, b[0], dout, (size_t)M, N, Np, op);
        if (act && !rc && dbias) {   /* the column sums of the bf16 values */
            part = (float *)b[3];
            rc = cuda_kc(d, kcuda_bias_partials_bf16(k, part, dout16, M, N), op);
        }
        if (act)
            b[0] = (kcuda_bf16 *)x0;
        else if (dout16)
            b[0] = (kcuda_bf16 *)dout16;
        else if (!rc && dbias) {   /* dout read once for its conversion and its column sums */
            part = (float *)b[3];
            rc = cuda_kc(d, kcuda_bias_partials_to_bf16(k, part, dout, M, N, b[0], Np), op);
        } else if (!rc) {
            rc = cuda_to_bf16_pitched(d, b[0], Np, dout, (size_t)M, N, op);
        }
        if (!rc && dweight)
            rc = operand16(d, &x, b[1], inp, (size_t)M, K, Kp, op);
        if (!rc && dinp)
            rc = rows_to_bf16(d, b[2], weight, (size_t)N, K, Kp, op);
        if (!rc && dinp && Np != N)
            rc = cuda_err(d, cudaMemsetAsync(b[2] + (size_t)N * Kp, 0,
                                             padbytes * sizeof(kcuda_bf16), st), op);
        if (!rc && dweight && !dw) {   /* the sum goes on in the padded copy */
            dw = (float *)b[4];
            rc = copy_rows(d, dw, Kp, dweight, K, (size_t)N, K, op);
            if (!rc)
                rc = cuda_err(d, cudaMemsetAsync(dw + (size_t)N * Kp, 0,
                                                 padbytes * sizeof(float), st), op);
        }
        if (!rc && dinp && !di) {
            di = (float *)b[5];
            if (!set)
                rc = copy_rows(d, di, Kp, dinp, K, (size_t)M, K, op);
        }
        if (rc)
            return rc;
    }
    if (dinp16) {
        rc = kcuda_matmul_backward_bf16_f32w(k, (kcuda_bf16 *)dinp, !set, NULL, NULL, b[0], NULL,
                                             b[2], M, K, N);
        if (rc)
            return rc == KCUDA_ENOALGO ? HERR_NOALGO : cuda_kc(d, rc, op);
    } else if (dinp) {
        rc = kcuda_matmul_dinp_bf16_f32out(k, di, b[0], Np, b[2], M, Kp, Np, !set);
        if (rc)
            return rc == KCUDA_ENOALGO ? HERR_NOALGO : cuda_kc(d, rc, op);
        if (di != dinp && (rc = copy_rows(d, dinp, K, di, Kp, (size_t)M, K, op)))
            return rc;
    }
    if (dweight) {
        rc = kcuda_matmul_dweight_bf16_f32out(k, dw, b[0], Np, x, M, Kp, Np);
        if (rc)   /* dinp is done: finishing in fp32 math would add it twice */
            return cuda_kc(d, rc, op);
        if (dw != dweight && (rc = copy_rows(d, dweight, K, dw, Kp, (size_t)N, K, op)))
            return rc;
    }
    if (part)   /* added last: a GEMM without an algorithm above has written nothing */
        rc = cuda_kc(d, kcuda_bias_partials_add(k, dbias, part, M, N), op);
    else if (dbias)
        rc = cuda_kc(d, kcuda_matmul_backward_f32(k, NULL, NULL, dbias, dout, NULL, NULL, M, K,
                                                  N),
                     op);
    return rc;
}

int cuda_matmul16_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight, int M,
                           int K, int N, int set)
{
    return cuda_matmul16_backward_from(d, dinp, dweight, dbias, dout, NULL, inp, weight, M, K,
                                       N, set);
}
