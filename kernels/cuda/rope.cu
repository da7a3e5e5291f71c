/* rope.cu - rotary position embedding in place on [N, H, D], "rotate half" pairing, from
 * fp32 cos/sin tables [N, D/2] built on the host (kcpu_rope_table_*: 1-D, mRoPE and 2-D
 * RoPE differ only in the tables).  One thread per (token, head, pair); fp32 arithmetic.
 * An odd D leaves the last element alone, as the CPU reference does. */
#include "cuda/kcuda_internal.h"

/* sign = +1: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s); sign = -1 rotates back (the
 * backward: the rotation is orthogonal, its gradient is the opposite rotation).
 * One thread per W consecutive pairs of one head (W > 1: 16-byte accesses of both halves,
 * W/4 float4 of the tables); consecutive threads take consecutive pairs, so reads of
 * both halves and of the token's table row coalesce. */
template <typename T, int W>
__global__ void rope_kernel(T *x, const float *cos, const float *sin, size_t groups, int H,
                            int D, float sign)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= groups)
        return;
    int half = D / 2, gph = half / W, i = (int)(t % gph) * W;
    size_t nh = t / gph, n = nh / H;
    float c[W], s[W], x1[W], x2[W];
#pragma unroll
    for (int j = 0; j < W; j += 4) {
        if constexpr (W == 1) {
            c[0] = cos[n * half + i];
            s[0] = sin[n * half + i];
        } else {
            float4 cv = *(const float4 *)(cos + n * half + i + j);
            float4 sv = *(const float4 *)(sin + n * half + i + j);
            c[j] = cv.x, c[j + 1] = cv.y, c[j + 2] = cv.z, c[j + 3] = cv.w;
            s[j] = sv.x, s[j + 1] = sv.y, s[j + 2] = sv.z, s[j + 3] = sv.w;
        }
    }
    T *v = x + nh * D + i;
    kcuda_ldw<W>(x1, v);
    kcuda_ldw<W>(x2, v + half);
    float y1[W], y2[W];
#pragma unroll
    for (int j = 0; j < W; j++) {
        float sj = sign * s[j];
        y1[j] = x1[j] * c[j] - x2[j] * sj;
        y2[j] = x2[j] * c[j] + x1[j] * sj;
    }
    kcuda_stw<W>(v, y1);
    kcuda_stw<W>(v + half, y2);
}

template <typename T>
static int rope(kcuda_ctx *ctx, T *x, const float *cos, const float *sin, int N, int H, int D,
                float sign, const char *fn)
{
    if (N <= 0 || H <= 0 || D <= 0)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: bad shape N=%d H=%d D=%d", fn, N, H, D);
    if (!x || !cos || !sin)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: NULL tensor", fn);
    size_t pairs = (size_t)N * H * (D / 2);
    if (pairs == 0) /* D = 1: nothing pairs */
        return KCUDA_OK;
    /* rows of x (D elements) and of the tables (D/2 floats) stay 16-byte aligned when D is
     * even and D/2 a multiple of the vector width (which is >= 4) */
    const int W = kcuda_vec<T>::n;
    if (D % 2 == 0 && kcuda_vec_ok<T>(D / 2, x, cos, sin)) {
        size_t groups = pairs / W;
        rope_kernel<T, W><<<(unsigned)((groups + 255) / 256), 256, 0, ctx->stream>>>(
            x, cos, sin, groups, H, D, sign);
    } else {
        rope_kernel<T, 1><<<(unsigned)((pairs + 255) / 256), 256, 0, ctx->stream>>>(
            x, cos, sin, pairs, H, D, sign);
    }
    return kcuda_check_launch(ctx, "rope_kernel");
}

typedef __nv_bfloat16 bf;

extern "C" int kcuda_rope_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *x, const float *cos,
                                       const float *sin, int N, int H, int D)
{
    return rope<bf>(ctx, (bf *)x, cos, sin, N, H, D, 1.0f, "kcuda_rope_forward_bf16");
}

extern "C" int kcuda_rope_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dx, const float *cos,
                                        const float *sin, int N, int H, int D)
{
    return rope<bf>(ctx, (bf *)dx, cos, sin, N, H, D, -1.0f, "kcuda_rope_backward_bf16");
}

extern "C" int kcuda_rope_forward_f32(kcuda_ctx *ctx, float *x, const float *cos,
                                      const float *sin, int N, int H, int D)
{
    return rope<float>(ctx, x, cos, sin, N, H, D, 1.0f, "kcuda_rope_forward_f32");
}

extern "C" int kcuda_rope_backward_f32(kcuda_ctx *ctx, float *dx, const float *cos,
                                       const float *sin, int N, int H, int D)
{
    return rope<float>(ctx, dx, cos, sin, N, H, D, -1.0f, "kcuda_rope_backward_f32");
}
