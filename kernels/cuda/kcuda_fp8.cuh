/* kcuda_fp8.cuh - the FP8 rounding of kernels/cpu/fp8.c (round_fp8) on the device, shared
 * by the quantise-dequantise of the cuda device backend (kdev_cuda_fp8.cu) and the
 * quantisation in front of the FP8 GEMMs (gemm_fp8.cu), so that the emulation and the
 * real FP8 path round every value the same way, and both as the cpu backend does.
 *
 * Ported operation for operation with explicitly rounded fp32 intrinsics (no contraction
 * into FMAs): every finite result has the cpu's bits.  In the normal range,
 * round-to-nearest-even of the fp32 mantissa to mbits bits on the bit pattern; below the
 * smallest normal, (a + c) - c with c = 2^(emin - mbits + 23) rounds to the subnormal
 * spacing; finite values beyond max saturate; NaN stays NaN; inf stays inf in E5M2 and
 * becomes NaN in E4M3 (no infinities there). */
#ifndef HEARTH_KCUDA_FP8_CUH
#define HEARTH_KCUDA_FP8_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/kcuda.h"

struct kcuda_fp8_fmt {
    int mbits, bias, has_inf;
    float max, min_normal, c;
    float sub_inv;            /* 1 / the subnormal spacing, 2^(mbits - emin): exact */
};

/* The constants of format f (KCUDA_FP8_E4M3 or KCUDA_FP8_E5M2), on the host. */
static inline kcuda_fp8_fmt kcuda_fp8_fmt_of(int f)
{
    int e4 = f == KCUDA_FP8_E4M3;
    int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15;
    kcuda_fp8_fmt F;
    F.mbits = mbits;
    F.bias = bias;
    F.has_inf = !e4;
    F.max = e4 ? 448.0f : 57344.0f;
    F.min_normal = (float)ldexp(1.0, 1 - bias);
    F.c = (float)ldexp(1.0, 1 - bias - mbits + 23);
    F.sub_inv = (float)ldexp(1.0, mbits - (1 - bias));
    return F;
}

/* x rounded to the nearest value of format F (a float that F represents exactly). */
__device__ __forceinline__ float kcuda_fp8_round(float x, const kcuda_fp8_fmt F)
{
    float a = fabsf(x);
    if (!(a < F.max)) {
        if (isnan(a))
            return x;
        if (isinf(a))
            return F.has_inf ? x : NAN;
        return copysignf(F.max, x);
    }
    float v;
    if (a < F.min_normal) {
        v = __fsub_rn(__fadd_rn(a, F.c), F.c);
    } else {
        uint32_t b = __float_as_uint(a);
        int sh = 23 - F.mbits;
        b += ((1u << (sh - 1)) - 1) + ((b >> sh) & 1);
        b &= ~((1u << sh) - 1);
        v = __uint_as_float(b);
    }
    return copysignf(v > F.max ? F.max : v, x);
}

/* The code of v = kcuda_fp8_round(y, F) (exactly representable), with the sign of
 * `sign_of` (y, or a value of y's sign): kcpu_fp8_encode(y) bit for bit, NaN codes
 * (sign | 0x7f) included. */
__device__ __forceinline__ uint8_t kcuda_fp8_code(float v, float sign_of, const kcuda_fp8_fmt F)
{
    uint8_t sign = signbit(sign_of) ? 0x80 : 0x00;
    float a = fabsf(v);
    if (isnan(a))
        return sign | 0x7f;
    if (isinf(a))                                   /* E5M2 only: E4M3 rounds inf to NaN */
        return sign | (uint8_t)(0x1f << 2);
    if (a < F.min_normal)                           /* subnormal or zero: the spacing count */
        return sign | (uint8_t)__float2uint_rz(__fmul_rn(a, F.sub_inv));
    uint32_t b = __float_as_uint(a);
    int e = (int)(b >> 23) - 127 + F.bias;
    uint32_t mant = (b >> (23 - F.mbits)) & ((1u << F.mbits) - 1);
    return sign | (uint8_t)(((uint32_t)e << F.mbits) | mant);
}

#endif
