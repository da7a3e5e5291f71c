/* kdev_cuda_fp8gemm.cu - kdev's FP8 linear (kdev_fp8_matmul_*) on the FP8 tensor cores:
 * the operands quantised to FP8 bytes (kcuda_fp8_quantise: the rounding of the cpu's
 * emulation, bit for bit), then cuBLASLt's FP8 GEMM (kcuda_matmul_fp8), fp32 out.
 *   forward:  qx = Q4(x, sx), qw = Q4(w, sw), as stored (both K-major already)
 *             out = (qx . qw^T) / sx / sw, then + bias in fp32 (kdev_add_bias's kernel)
 *   backward: qd = Q(dy, sd), its transpose qdT, and the transposes qwT = Q4(w)^T,
 *             qxT = Q4(x)^T (the FP8 GEMM reduces over K-major operands only)
 *             dinp += (qd . qwT^T) / sd / sw;   dw += (qdT . qxT^T) / sd / sx
 * The dequantisation factors 1/s are the GEMM's alpha (the scales are the host's: no
 * copy enters the stream).  The FP8 copies live in the device scratch: one byte
 * per element, a quarter of the emulation's fp32 copies.
 *
 * Shapes.  cuBLASLt's FP8 kernels want every dimension a multiple of 16 (16-byte rows of
 * FP8 codes) and 16-byte aligned outputs (kcuda_matmul_fp8_fits): other products return
 * HERR_NOALGO before anything is written, and kdev.c runs the emulation (quantise-
 * dequantise in fp32, then the device's ordinary GEMM) in their place.  A model's
 * hidden and ffn widths are multiples of 16; its token counts mostly are. */
#include "cuda/kdev_cuda_internal.h"

static_assert((int)KFP8_E4M3 == KCUDA_FP8_E4M3 && (int)KFP8_E5M2 == KCUDA_FP8_E5M2,
              "kcuda numbers the FP8 formats as kernels.h");

/* n byte buffers of count[i] bytes (0: NULL), carved from the device scratch at 256-byte
 * boundaries (cuBLASLt wants 16). */
static int carve(kdev *d, uint8_t **b, const size_t *count, int n, const char *op)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += cuda_align256(count[i]);
    void *p;
    int rc = cuda_scratch(d, total, &p, op);
    if (rc)
        return rc;
    uint8_t *at = (uint8_t *)p;
    for (int i = 0; i < n; i++) {
        b[i] = count[i] ? at : NULL;
        at += cuda_align256(count[i]);
    }
    return 0;
}

/* amax (a device float, NULL: not wanted) = x's amax, by cuda_amax (a max taken inside the
 * quantise kernel, one atomicMax per warp on one address, made an H100's decoder fc1
 * layer 0.88x bf16 where this is 1.04x).  Every amax of a call is recorded before the
 * scratch is carved: cuda_amax's partial maxima use the scratch's start too. */
static int record_amax(kdev *d, float *amax, const float *x, size_t n)
{
    return amax ? cuda_amax(d, amax, x, n, 1) : 0;
}

/* x's codes (and transposed codes). */
static int quantise(kdev *d, uint8_t *q, uint8_t *qt, const float *x, int rows, int cols,
                    float scale, kfp8_format f, const char *op)
{
    return cuda_kc(d, kcuda_fp8_quantise(cuda_st(d)->k, q, qt, x, rows, cols, scale, (int)f),
                   op);
}

int cuda_fp8_matmul_forward(kdev *d, float *ws, float *out, const float *inp, const float *w,
                            const float *bias, int M, int K, int N, float sx, float sw,
                            const kdev_fp8_amax *amax)
{
    static const char op[] = "fp8_matmul_forward";
    (void)ws;   /* the emulation's: the FP8 bytes live in the device scratch */
    if (int rc = cuda_no_act16(d, op, "inp", inp))
        return rc;
    if (!kcuda_matmul_fp8_fits(out, M, N, K))
        return HERR_NOALGO;
    size_t count[2] = { (size_t)M * K, (size_t)N * K };
    uint8_t *b[2];   /* qx, qw */
    int rc = record_amax(d, amax ? amax->x : NULL, inp, count[0]);
    if (!rc)
        rc = record_amax(d, amax ? amax->w : NULL, w, count[1]);
    if (!rc)
        rc = carve(d, b, count, 2, op);
    if (!rc)
        rc = quantise(d, b[0], NULL, inp, M, K, sx, KFP8_E4M3, op);
    if (!rc)
        rc = quantise(d, b[1], NULL, w, N, K, sw, KFP8_E4M3, op);
    if (rc)
        return rc;
    rc = kcuda_matmul_fp8(cuda_st(d)->k, out, b[0], KCUDA_FP8_E4M3, b[1], KCUDA_FP8_E4M3,
                          (1.0f / sx) * (1.0f / sw), M, N, K, 0);
    if (rc == KCUDA_ENOALGO)   /* out untouched: the emulation runs instead */
        return HERR_NOALGO;
    if ((rc = cuda_kc(d, rc, op)))
        return rc;
    return bias ? cuda_add_bias(d, out, bias, M, N) : 0;
}

int cuda_fp8_matmul_backward(kdev *d, float *ws, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, int M, int K, int N, float sx,
                             float sw, float sd, kfp8_format fd, const kdev_fp8_amax *amax)
{
    static const char op[] = "fp8_matmul_backward";
    (void)ws;
    if (int rc = cuda_no_act16(d, op, "inp", inp))
        return rc;
    if (!dinp && !dw)
        return 0;
    if (fd != KFP8_E4M3 && fd != KFP8_E5M2)
        return kdev_fail(d, HERR_ARG, "%s: unknown gradient format %d", op, (int)fd);
    if ((dinp && !kcuda_matmul_fp8_fits(dinp, M, K, N)) ||
        (dw && !kcuda_matmul_fp8_fits(dw, N, K, M)))
        return HERR_NOALGO;
    size_t count[4] = { dinp ? (size_t)M * N : 0, dw ? (size_t)N * M : 0,
                        dinp ? (size_t)K * N : 0, dw ? (size_t)K * M : 0 };
    uint8_t *b[4];   /* qd, qdT, qwT, qxT */
    int rc = record_amax(d, amax ? amax->dy : NULL, dout, (size_t)M * N);
    if (!rc)
        rc = carve(d, b, count, 4, op);
    if (!rc)   /* dy read once for both of its copies */
        rc = quantise(d, b[0], b[1], dout, M, N, sd, fd, op);
    if (!rc && dinp)
        rc = quantise(d, NULL, b[2], w, N, K, sw, KFP8_E4M3, op);
    if (!rc && dw)
        rc = quantise(d, NULL, b[3], inp, M, K, sx, KFP8_E4M3, op);
    if (rc)
        return rc;
    kcuda_ctx *k = cuda_st(d)->k;
    if (dinp) {
        rc = kcuda_matmul_fp8(k, dinp, b[0], (int)fd, b[2], KCUDA_FP8_E4M3,
                              (1.0f / sd) * (1.0f / sw), M, K, N, 1);
        if (rc == KCUDA_ENOALGO)   /* nothing accumulated yet: the emulation instead */
            return HERR_NOALGO;
        if ((rc = cuda_kc(d, rc, op)))
            return rc;
    }
    if (dw) {
        rc = kcuda_matmul_fp8(k, dw, b[1], (int)fd, b[3], KCUDA_FP8_E4M3,
                              (1.0f / sd) * (1.0f / sx), N, K, M, 1);
        if (rc == KCUDA_ENOALGO && !dinp)
            return HERR_NOALGO;
        if (rc == KCUDA_ENOALGO)   /* dinp is accumulated: a fallback would add it twice */
            return kdev_fail(d, HERR_DEVLIB, "%s: %s (after dinp was accumulated)", op,
                             kcuda_ctx_errmsg(k));
        return cuda_kc(d, rc, op);
    }
    return 0;
}
