/* bf16.c - fp32 <-> bf16 scalar conversions (kernels.h): the rounding a GPU's
 * __float2bfloat16_rn applies, for host-side copies of bf16 data (checkpoint export,
 * activation memory uploads). */
#include <string.h>

#include "kernels.h"

uint16_t kcpu_bf16_encode(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        /* NaN: keep sign and top payload bits, force the quiet bit so that a payload held
         * only in the low 16 bits cannot turn into infinity. */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest, ties to even: add just under half an ulp, plus one when the kept
     * part is odd.  A carry into the exponent is the correct rounding (up to infinity). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float kcpu_bf16_decode(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
