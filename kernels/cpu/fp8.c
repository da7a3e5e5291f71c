/* fp8.c - FP8 (E4M3, E5M2) emulation on fp32: rounding, saturation, per-tensor scaling.
 *
 * The rounding works on the value, not the bit pattern: the quantum of |x| (the spacing of
 * representable values in its binade, or the subnormal spacing below the smallest normal)
 * is a power of two, so |x| / quantum is exact in double and rint() (round to nearest,
 * ties to even, the default rounding mode) gives the mantissa integer directly.  A carry
 * into the next binade needs no special case because the result is rebuilt from its value. */
#include <math.h>
#include <string.h>

#include "kernels.h"

typedef struct {
    int mbits, bias;
    float max;
    int has_inf;
} fp8_fmt;

static const fp8_fmt FMT[2] = {
    { 3, 7, KFP8_E4M3_MAX, 0 },
    { 2, 15, KFP8_E5M2_MAX, 1 },
};

float kcpu_fp8_max(kfp8_format f)
{
    return FMT[f].max;
}

/* Code of a finite value v >= 0 that is exactly representable and <= max. */
static uint8_t pack(double v, const fp8_fmt *F)
{
    int emin = 1 - F->bias;
    if (v < ldexp(1.0, emin))                       /* subnormal (or zero) */
        return (uint8_t)ldexp(v, F->mbits - emin);
    int e;
    double fr = frexp(v, &e);                       /* v = fr * 2^e, fr in [0.5, 1) */
    int E = e - 1;
    int mant = (int)(ldexp(fr, F->mbits + 1)) - (1 << F->mbits);
    return (uint8_t)(((E + F->bias) << F->mbits) | mant);
}

uint8_t kcpu_fp8_encode(float x, kfp8_format f)
{
    const fp8_fmt *F = &FMT[f];
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    if (isnan(x))
        return sign | 0x7f;
    if (isinf(x))
        return F->has_inf ? (uint8_t)(sign | (0x1f << 2)) : (uint8_t)(sign | 0x7f);
    double a = fabs((double)x);
    if (a >= F->max)
        return sign | pack(F->max, F);
    int emin = 1 - F->bias, e;
    int E = a < ldexp(1.0, emin) ? emin : (frexp(a, &e), e - 1);
    double q = ldexp(1.0, E - F->mbits);            /* spacing of values near a */
    double v = rint(a / q) * q;
    if (v > F->max)
        v = F->max;
    return sign | pack(v, F);
}

float kcpu_fp8_decode(uint8_t code, kfp8_format f)
{
    const fp8_fmt *F = &FMT[f];
    int ebits = 7 - F->mbits;
    int ef = (code & 0x7f) >> F->mbits, mant = code & ((1 << F->mbits) - 1);
    float s = code & 0x80 ? -1.0f : 1.0f;
    if (F->has_inf && ef == (1 << ebits) - 1)
        return mant ? NAN : s * INFINITY;
    if (!F->has_inf && (code & 0x7f) == 0x7f)
        return NAN;
    if (ef == 0)
        return s * (float)ldexp(mant, 1 - F->bias - F->mbits);
    return s * (float)ldexp((1 << F->mbits) + mant, ef - F->bias - F->mbits);
}

float kcpu_amax(const float *x, size_t n)
{
    float m = 0.0f;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        nan |= a != a;
        m = a > m ? a : m;
    }
    return nan ? NAN : m;
}

float kcpu_fp8_scale(float amax, kfp8_format f, int margin, float prev)
{
    if (!(amax > 0.0f) || isinf(amax))
        return prev;
    float s = (float)ldexp((double)FMT[f].max / (double)amax, -margin);
    return isfinite(s) && s > 0.0f ? s : prev;
}

void kcpu_fp8_history_push(float *hist, int H, int *pos, float amax)
{
    hist[*pos] = amax;
    *pos = (*pos + 1) % H;
}

float kcpu_fp8_history_amax(const float *hist, int H)
{
    return kcpu_amax(hist, (size_t)H);
}

/* decode(encode(x)) without the byte, on the fp32 bits (the hot path of qdq): in the
 * normal range, round-to-nearest-even of the fp32 mantissa to mbits bits (a carry moves
 * into the exponent, as it should); below the smallest normal, adding and subtracting
 * c = 2^(emin - mbits + 23) rounds to a multiple of the subnormal spacing (fp32 addition
 * rounds to nearest even). */
static float round_fp8(float x, const fp8_fmt *F, float min_normal, float c)
{
    float a = fabsf(x);
    if (!(a < F->max)) {
        if (isnan(a))
            return x;
        if (isinf(a))
            return F->has_inf ? x : NAN;
        return copysignf(F->max, x);
    }
    float v;
    if (a < min_normal) {
        v = (a + c) - c;
    } else {
        uint32_t b;
        int sh = 23 - F->mbits;
        memcpy(&b, &a, sizeof b);
        b += ((1u << (sh - 1)) - 1) + ((b >> sh) & 1);
        b &= ~((1u << sh) - 1);
        memcpy(&v, &b, sizeof v);
    }
    return copysignf(v > F->max ? F->max : v, x);
}

void kcpu_fp8_qdq(float *out, const float *x, size_t n, float scale, kfp8_format f)
{
    const fp8_fmt *F = &FMT[f];
    float min_normal = (float)ldexp(1.0, 1 - F->bias);
    float c = (float)ldexp(1.0, 1 - F->bias - F->mbits + 23);
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++)
        out[i] = round_fp8(x[i] * scale, F, min_normal, c) / scale;
}
