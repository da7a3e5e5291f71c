/* safetensors_dtype.c - dtypes, bf16/f16 conversions and shape sizes (safetensors.h). */
#include "safetensors.h"

#include <limits.h>
#include <string.h>

#include "safetensors_internal.h"

/* ---- dtypes and conversions ------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} dtype_info[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4},  [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2},
    [ST_F64] = {"F64", 8},  [ST_I64] = {"I64", 8},   [ST_I32] = {"I32", 4},
    [ST_U8] = {"U8", 1},    [ST_I8] = {"I8", 1},     [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(st_dtype d)
{
    return (unsigned)d < ST_DTYPE_COUNT ? dtype_info[d].name : NULL;
}

size_t st_dtype_size(st_dtype d)
{
    return (unsigned)d < ST_DTYPE_COUNT ? dtype_info[d].size : 0;
}

int st_dtype_parse(const char *s, st_dtype *out)
{
    for (int d = 0; d < ST_DTYPE_COUNT; d++)
        if (strcmp(s, dtype_info[d].name) == 0) {
            *out = (st_dtype)d;
            return 0;
        }
    return -1;
}

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Rounds m >> shift to nearest, ties to even (shift in 1..31). */
static uint32_t shift_rne(uint32_t m, int shift)
{
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return q;
}

uint16_t st_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u)   /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    /* 65520 is halfway between 65504 (largest finite, odd mantissa) and 2^16: ties to
     * even go up, so everything from there on is infinity. */
    if (ax >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    int e = (int)(ax >> 23);
    uint32_t mant = ax & 0x7fffffu;
    if (e >= 113)   /* normal half: exponent e - 127 >= -14 */
        return (uint16_t)(sign | shift_rne((uint32_t)(e - 112) << 23 | mant, 13));
    /* Subnormal half (or zero): value = m * 2^(e-150) in units of 2^-24 is
     * m >> (126 - e); a result of 0x400 is the smallest normal, encoded correctly. */
    if (e == 0)   /* fp32 subnormals are far below half an f16 subnormal */
        return sign;
    int shift = 126 - e;
    if (shift > 24)
        return sign;
    return (uint16_t)(sign | shift_rne(mant | 0x800000u, shift));
}

float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (e == 0) {   /* zero or subnormal: mant * 2^-24, exact in fp32 */
        float v = (float)mant * 0x1p-24f;
        return f32_from_bits(f32_bits(v) | sign);
    }
    if (e == 31)
        return f32_from_bits(sign | 0x7f800000u | mant << 13);
    return f32_from_bits(sign | (e + 112) << 23 | mant << 13);
}

int st_shape_bytes(st_dtype dtype, int ndim, const int64_t *shape, size_t *numel,
                       size_t *nbytes)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d > SIZE_MAX || (d != 0 && n > SIZE_MAX / d))
            return -1;
        n *= (size_t)d;
    }
    size_t sz = st_dtype_size(dtype);
    if (n > SIZE_MAX / sz)
        return -1;
    *numel = n;
    *nbytes = n * sz;
    return 0;
}
