/* attention_v1.cu - the first flash attention implementation (plain 32-bit fragment
 * loads, transposed shared-memory copies, no cp.async pipelining, 4-warp dk/dv blocks),
 * kept unchanged as kcuda_attention_v1_*_bf16 so that the benchmark can compare it side
 * by side with attention.cu.  Same contract as kcuda_attention_*_bf16 (kcuda.h); see
 * attention.cu for the scheme.  Everything lives in namespace attn_v1 so that its kernel
 * templates do not collide with those of attention.cu at link time. */
#include "cuda/kcuda_internal.h"

#include <math.h>
#include <stdint.h>

namespace attn_v1 {

typedef __nv_bfloat16 bf;

#define NTHR 128     /* 4 warps per block */
#define BQ 64        /* query rows per block: forward and dq kernels (4 warps x 16) */
#define BK 64        /* key rows per tile (4 warps x 16 in the dk/dv kernel) */
#define BQB 32       /* query rows per step of the dk/dv kernel */
#define PAD 8        /* bf16 of padding per shared-memory row */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* ---- warp-level tensor-core helpers ------------------------------------------------ */

/* c[16x8] += a[16x16] . b[16x8]; fragments as in the PTX ISA for m16n8k16 bf16, with
 * g = lane / 4, t = lane % 4:
 *   a0 (row g, cols 2t,2t+1)  a1 (row g+8, cols 2t..)  a2 (row g, cols 2t+8..)  a3 (g+8, 2t+8..)
 *   b0 (rows 2t,2t+1, col g)  b1 (rows 2t+8.., col g)
 *   c0,c1 (row g, cols 2t,2t+1)  c2,c3 (row g+8, cols 2t,2t+1) */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld32(const bf *p) { return *(const uint32_t *)p; }

/* Two floats as a bf16 pair, the first in the low half (the lower column index). */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

__device__ __forceinline__ float bf_lo(uint32_t w)
{
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)(w & 0xffffu)));
}

__device__ __forceinline__ float bf_hi(uint32_t w)
{
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)(w >> 16)));
}

/* acc[16 x 8*NT] += A[16 x 16*KC] . B, A row-major in shared memory (row stride lda),
 * B stored n-major [8*NT][16*KC] (row stride ldb). */
template <int KC, int NT>
__device__ __forceinline__ void warp_mma_ss(float (&acc)[NT][4], const bf *A, int lda,
                                            const bf *B, int ldb, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const bf *pa = A + g * lda + 2 * t, *pb = B + g * ldb + 2 * t;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t a[4];
        a[0] = ld32(pa + kc * 16);
        a[1] = ld32(pa + 8 * lda + kc * 16);
        a[2] = ld32(pa + kc * 16 + 8);
        a[3] = ld32(pa + 8 * lda + kc * 16 + 8);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma16816(acc[nt], a, ld32(pb + nt * 8 * ldb + kc * 16),
                     ld32(pb + nt * 8 * ldb + kc * 16 + 8));
    }
}

/* The A fragments of a 16 x 16*KC row-major tile in shared memory (row stride lda), for
 * operands used against many B tiles. */
template <int KC>
__device__ __forceinline__ void load_afrags(uint32_t (&a)[KC][4], const bf *A, int lda, int lane)
{
    const bf *pa = A + (lane >> 2) * lda + 2 * (lane & 3);
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        a[kc][0] = ld32(pa + kc * 16);
        a[kc][1] = ld32(pa + 8 * lda + kc * 16);
        a[kc][2] = ld32(pa + kc * 16 + 8);
        a[kc][3] = ld32(pa + 8 * lda + kc * 16 + 8);
    }
}

/* acc[16 x 8*NT] += A . B, A given as fragments (load_afrags), B n-major in shared memory. */
template <int KC, int NT>
__device__ __forceinline__ void warp_mma_rf(float (&acc)[NT][4], const uint32_t (&a)[KC][4],
                                            const bf *B, int ldb, int lane)
{
    const bf *pb = B + (lane >> 2) * ldb + 2 * (lane & 3);
#pragma unroll
    for (int kc = 0; kc < KC; kc++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma16816(acc[nt], a[kc], ld32(pb + nt * 8 * ldb + kc * 16),
                     ld32(pb + nt * 8 * ldb + kc * 16 + 8));
}

/* acc[16 x 8*NT] += P[16 x 16*KC] . B, P given as the accumulator tiles of an earlier
 * product (p[2*KC][4], rounded to bf16 here), B n-major in shared memory. */
template <int KC, int NT>
__device__ __forceinline__ void warp_mma_rs(float (&acc)[NT][4], const float (&p)[2 * KC][4],
                                            const bf *B, int ldb, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const bf *pb = B + g * ldb + 2 * t;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t a[4];
        a[0] = pack_bf16(p[2 * kc][0], p[2 * kc][1]);
        a[1] = pack_bf16(p[2 * kc][2], p[2 * kc][3]);
        a[2] = pack_bf16(p[2 * kc + 1][0], p[2 * kc + 1][1]);
        a[3] = pack_bf16(p[2 * kc + 1][2], p[2 * kc + 1][3]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma16816(acc[nt], a, ld32(pb + nt * 8 * ldb + kc * 16),
                     ld32(pb + nt * 8 * ldb + kc * 16 + 8));
    }
}

/* ---- tile loads -------------------------------------------------------------------- */

/* rows x D tile from global (token r at g + r * gstride, 16-byte aligned) into shared
 * memory: row-major s[r][c] (row stride ld) when s != NULL, transposed st[c][r] (row
 * stride ldt) when st != NULL.  Rows r >= valid are zero.  rows is a multiple of 32. */
template <int D>
__device__ __forceinline__ void load_tile(bf *s, int ld, bf *st, int ldt, const bf *g,
                                          size_t gstride, int rows, int valid)
{
    constexpr int C8 = D / 8;
    for (int i = threadIdx.x; i < rows * C8; i += NTHR) {
        /* row-major only: a warp reads whole rows (coalesced); with a transposed copy, a
         * warp takes one 8-column chunk of 32 rows, so that its transposed 2-byte stores
         * go to consecutive addresses rather than all to one bank */
        int r = st ? i % rows : i / C8, c = (st ? i / rows : i % C8) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < valid)
            v = *(const uint4 *)(g + (size_t)r * gstride + c);
        if (s)
            *(uint4 *)(s + r * ld + c) = v;
        if (st) {
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                st[(c + 2 * j) * ldt + r] = __ushort_as_bfloat16((unsigned short)(w[j] & 0xffffu));
                st[(c + 2 * j + 1) * ldt + r] = __ushort_as_bfloat16((unsigned short)(w[j] >> 16));
            }
        }
    }
}

/* dst[16 x 8*NT] (rows row0 and row0+8 of this thread, clipped at L) = or += s * acc,
 * bf16; row r of the tile is token (start + r) at dst + (start + r) * stride. */
template <int NT>
__device__ __forceinline__ void store_rows(bf *dst, size_t stride, int start, int row0, int L,
                                           const float (&acc)[NT][4], float s, int add,
                                           int lane)
{
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int row = row0 + 8 * i;
        if (row >= L)
            continue;
        uint32_t *p = (uint32_t *)(dst + (size_t)(start + row) * stride + 2 * t);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float x0 = acc[nt][2 * i] * s, x1 = acc[nt][2 * i + 1] * s;
            if (add) {
                uint32_t old = p[nt * 4];
                x0 += bf_lo(old);
                x1 += bf_hi(old);
            }
            p[nt * 4] = pack_bf16(x0, x1);
        }
    }
}

/* As store_rows, into fp32 storage, plain stores. */
template <int NT>
__device__ __forceinline__ void store_rows_f32(float *dst, size_t stride, int start, int row0,
                                               int L, const float (&acc)[NT][4], float s,
                                               int lane)
{
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int row = row0 + 8 * i;
        if (row >= L)
            continue;
        float2 *p = (float2 *)(dst + (size_t)(start + row) * stride + 2 * t);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            p[nt * 4] = make_float2(acc[nt][2 * i] * s, acc[nt][2 * i + 1] * s);
    }
}

/* Block (blockIdx.x = sequence) -> start and length of its sequence. */
__device__ __forceinline__ void seq_range(const int *cu, int *start, int *L)
{
    *start = cu[blockIdx.x];
    *L = cu[blockIdx.x + 1] - *start;
}

/* ---- forward ----------------------------------------------------------------------- */

template <int D>
constexpr size_t fwd_smem()
{
    return ((size_t)BQ * (D + PAD) + (size_t)BK * (D + PAD) + (size_t)D * (BK + PAD)) * sizeof(bf);
}

/* grid (nseq, query tiles, Hq).  sl2 = scale * log2(e). */
template <int D>
__global__ void __launch_bounds__(NTHR) attn_fwd_kernel(bf *out, float *lse, const bf *q,
                                                        const bf *k, const bf *v,
                                                        const int *cu, int Hq, int Hkv,
                                                        int causal, float sl2)
{
    constexpr int LD = D + PAD, LDT = BK + PAD, KC = D / 16, NT = BK / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Qs = (bf *)smem, *Ks = Qs + BQ * LD, *Vt = Ks + BK * LD;

    int start, L;
    seq_range(cu, &start, &L);
    /* the last query tiles have the most keys under a causal mask: start them first */
    const int q0 = (int)(gridDim.y - 1 - blockIdx.y) * BQ, h = blockIdx.z;
    if (q0 >= L)
        return;
    const int kvh = h / (Hq / Hkv);
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int row0 = q0 + warp * 16 + (lane >> 2); /* rows of c0,c1; row0 + 8: c2,c3 */

    load_tile<D>(Qs, LD, NULL, 0, q + (size_t)(start + q0) * qs + (size_t)h * D, qs, BQ,
                 min(BQ, L - q0));
    __syncthreads();
    uint32_t qf[KC][4]; /* this warp's 16 query rows, read once */
    load_afrags<KC>(qf, Qs + warp * 16 * LD, LD, lane);
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

    const int kend = causal ? min(L, q0 + BQ) : L;
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads(); /* the previous tile is no longer read */
        const size_t koff = (size_t)(start + k0) * ks + (size_t)kvh * D;
        load_tile<D>(Ks, LD, NULL, 0, k + koff, ks, BK, min(BK, L - k0));
        load_tile<D>(NULL, 0, Vt, LDT, v + koff, ks, BK, min(BK, L - k0));
        __syncthreads();

        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        warp_mma_rf<KC, NT>(s, qf, Ks, LD, lane);

        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int col = k0 + nt * 8 + 2 * t + (r & 1), row = row0 + 8 * (r >> 1);
                float x = s[nt][r] * sl2;
                if (col >= L || (causal && col > row))
                    x = -INFINITY;
                s[nt][r] = x;
                mx[r >> 1] = fmaxf(mx[r >> 1], x);
            }
        float base[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            /* the 4 threads of a quad hold one row */
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            base[i] = mx[i] == -INFINITY ? 0.0f : mx[i]; /* a row with nothing visible yet */
            alpha[i] = exp2f(m[i] - base[i]);
            m[i] = mx[i];
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float p = exp2f(s[nt][r] - base[r >> 1]);
                s[nt][r] = p;
                rs[r >> 1] += p;
            }
        /* l stays a per-thread partial sum until the end (alpha is the same in a quad) */
        l[0] = l[0] * alpha[0] + rs[0];
        l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
        for (int i = 0; i < DT; i++) {
            o[i][0] *= alpha[0];
            o[i][1] *= alpha[0];
            o[i][2] *= alpha[1];
            o[i][3] *= alpha[1];
        }
        warp_mma_rs<BK / 16, DT>(o, s, Vt, LDT, lane);
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    /* every row below L sees at least key 0, so l > 0 there */
    float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
#pragma unroll
    for (int i = 0; i < DT; i++) {
        o[i][0] *= inv[0];
        o[i][1] *= inv[0];
        o[i][2] *= inv[1];
        o[i][3] *= inv[1];
    }
    store_rows<DT>(out + (size_t)h * D, qs, start, row0, L, o, 1.0f, 0, lane);
    if (lse && t == 0)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int row = row0 + 8 * i;
            if (row < L)
                lse[(size_t)(start + row) * Hq + h] = (m[i] + log2f(l[i])) * LN2;
        }
}

/* ---- backward ---------------------------------------------------------------------- */

/* delta[tok, h] = sum_d dout * out; grid (nseq, ceil(max_seqlen / 8)), 8 warps, one
 * token per warp. */
__global__ void __launch_bounds__(256) attn_delta_kernel(float *delta, const bf *dout,
                                                         const bf *out, const int *cu, int Hq,
                                                         int D)
{
    int start, L;
    seq_range(cu, &start, &L);
    const int row = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= L)
        return;
    for (int h = 0; h < Hq; h++) {
        size_t off = ((size_t)(start + row) * Hq + h) * D;
        float sum = 0.0f;
        for (int d = lane; d < D; d += 32)
            sum += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0)
            delta[(size_t)(start + row) * Hq + h] = sum;
    }
}

template <int D>
constexpr size_t dq_smem()
{
    return ((size_t)4 * BQ * (D + PAD) + (size_t)D * (BK + PAD)) * sizeof(bf);
}

/* dq += scale * sum_j dS_ij k_j; grid (nseq, query tiles, Hq). */
template <int D>
__global__ void __launch_bounds__(NTHR) attn_dq_kernel(bf *dq, const bf *dout, const bf *q,
                                                       const bf *k, const bf *v,
                                                       const float *lse, const float *delta,
                                                       const int *cu, int Hq, int Hkv,
                                                       int causal, float sl2, float scale)
{
    constexpr int LD = D + PAD, LDT = BK + PAD, KC = D / 16, NT = BK / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Qs = (bf *)smem, *dOs = Qs + BQ * LD, *Ks = dOs + BQ * LD, *Vs = Ks + BK * LD;
    bf *Kt = Vs + BK * LD;

    int start, L;
    seq_range(cu, &start, &L);
    const int q0 = (int)(gridDim.y - 1 - blockIdx.y) * BQ, h = blockIdx.z;
    if (q0 >= L)
        return;
    const int kvh = h / (Hq / Hkv);
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int row0 = q0 + warp * 16 + (lane >> 2);

    const size_t qoff = (size_t)(start + q0) * qs + (size_t)h * D;
    load_tile<D>(Qs, LD, NULL, 0, q + qoff, qs, BQ, min(BQ, L - q0));
    load_tile<D>(dOs, LD, NULL, 0, dout + qoff, qs, BQ, min(BQ, L - q0));
    float lse2[2], dl[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int row = row0 + 8 * i;
        size_t at = (size_t)(start + row) * Hq + h;
        lse2[i] = row < L ? lse[at] * LOG2E : 0.0f;
        dl[i] = row < L ? delta[at] : 0.0f;
    }
    float acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    const int kend = causal ? min(L, q0 + BQ) : L;
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads();
        const size_t koff = (size_t)(start + k0) * ks + (size_t)kvh * D;
        load_tile<D>(Ks, LD, Kt, LDT, k + koff, ks, BK, min(BK, L - k0));
        load_tile<D>(Vs, LD, NULL, 0, v + koff, ks, BK, min(BK, L - k0));
        __syncthreads();

        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                s[i][r] = dp[i][r] = 0.0f;
        warp_mma_ss<KC, NT>(s, Qs + warp * 16 * LD, LD, Ks, LD, lane);
        warp_mma_ss<KC, NT>(dp, dOs + warp * 16 * LD, LD, Vs, LD, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int col = k0 + nt * 8 + 2 * t + (r & 1), row = row0 + 8 * (r >> 1);
                bool ok = col < L && !(causal && col > row);
                float p = ok ? exp2f(s[nt][r] * sl2 - lse2[r >> 1]) : 0.0f;
                s[nt][r] = p * (dp[nt][r] - dl[r >> 1]); /* dS without the scale */
            }
        warp_mma_rs<BK / 16, DT>(acc, s, Kt, LDT, lane);
    }
    store_rows<DT>(dq + (size_t)h * D, qs, start, row0, L, acc, scale, 1, lane);
}

template <int D>
constexpr size_t dkdv_smem()
{
    return ((size_t)2 * BK * (D + PAD) + (size_t)2 * BQB * (D + PAD) +
            (size_t)2 * D * (BQB + PAD)) * sizeof(bf) + 2 * BQB * sizeof(float);
}

/* dk += scale * sum dS^T q, dv += sum P^T dout over the query heads of the group;
 * grid (nseq, key tiles, Hkv * hsplit).  With hsplit > 1 the group's query heads are
 * split into hsplit consecutive ranges, one per block, and each block stores its fp32
 * partial sums in part (split-major, [hsplit][2][tokens][Hkv][D], dk then dv) for
 * attn_dkdv_reduce_kernel, which adds them in split order. */
template <int D>
__global__ void __launch_bounds__(NTHR) attn_dkdv_kernel(bf *dk, bf *dv, float *part,
                                                         size_t part_stride, int hsplit,
                                                         const bf *dout, const bf *q,
                                                         const bf *k, const bf *v,
                                                         const float *lse, const float *delta,
                                                         const int *cu, int Hq, int Hkv,
                                                         int causal, float sl2, float scale)
{
    constexpr int LD = D + PAD, LDT = BQB + PAD, KC = D / 16, NT = BQB / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Ks = (bf *)smem, *Vs = Ks + BK * LD, *Qs = Vs + BK * LD, *dOs = Qs + BQB * LD;
    bf *Qt = dOs + BQB * LD, *dOt = Qt + D * LDT;
    float *lse_s = (float *)(dOt + D * LDT), *dl_s = lse_s + BQB;

    int start, L;
    seq_range(cu, &start, &L);
    /* the first key tiles have most work under a causal mask */
    const int k0 = blockIdx.y * BK, kvh = blockIdx.z / hsplit, sp = blockIdx.z % hsplit;
    if (k0 >= L)
        return;
    const int group = Hq / Hkv, hn = group / hsplit, h0 = kvh * group + sp * hn;
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int key0 = k0 + warp * 16 + (lane >> 2); /* keys of c0,c1; key0 + 8: c2,c3 */

    const size_t koff = (size_t)(start + k0) * ks + (size_t)kvh * D;
    load_tile<D>(Ks, LD, NULL, 0, k + koff, ks, BK, min(BK, L - k0));
    load_tile<D>(Vs, LD, NULL, 0, v + koff, ks, BK, min(BK, L - k0));
    float dka[DT][4], dva[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            dka[i][r] = dva[i][r] = 0.0f;

    for (int h = h0; h < h0 + hn; h++) {
        /* under the causal mask queries before k0 see none of these keys */
        for (int q0 = causal ? k0 : 0; q0 < L; q0 += BQB) {
            __syncthreads();
            const size_t qoff = (size_t)(start + q0) * qs + (size_t)h * D;
            load_tile<D>(Qs, LD, Qt, LDT, q + qoff, qs, BQB, min(BQB, L - q0));
            load_tile<D>(dOs, LD, dOt, LDT, dout + qoff, qs, BQB, min(BQB, L - q0));
            if (threadIdx.x < BQB) {
                int row = q0 + threadIdx.x;
                size_t at = (size_t)(start + row) * Hq + h;
                lse_s[threadIdx.x] = row < L ? lse[at] * LOG2E : 0.0f;
                dl_s[threadIdx.x] = row < L ? delta[at] : 0.0f;
            }
            __syncthreads();

            float st[NT][4], dpt[NT][4];
#pragma unroll
            for (int i = 0; i < NT; i++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    st[i][r] = dpt[i][r] = 0.0f;
            warp_mma_ss<KC, NT>(st, Ks + warp * 16 * LD, LD, Qs, LD, lane);
            warp_mma_ss<KC, NT>(dpt, Vs + warp * 16 * LD, LD, dOs, LD, lane);
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    int qi = nt * 8 + 2 * t + (r & 1), key = key0 + 8 * (r >> 1);
                    int row = q0 + qi;
                    bool ok = key < L && row < L && !(causal && key > row);
                    float p = ok ? exp2f(st[nt][r] * sl2 - lse_s[qi]) : 0.0f;
                    st[nt][r] = p;
                    dpt[nt][r] = p * (dpt[nt][r] - dl_s[qi]); /* dS^T without the scale */
                }
            warp_mma_rs<BQB / 16, DT>(dva, st, dOt, LDT, lane);
            warp_mma_rs<BQB / 16, DT>(dka, dpt, Qt, LDT, lane);
        }
    }
    if (part) {
        float *pk = part + (size_t)(2 * sp) * part_stride + (size_t)kvh * D;
        store_rows_f32<DT>(pk, ks, start, key0, L, dka, scale, lane);
        store_rows_f32<DT>(pk + part_stride, ks, start, key0, L, dva, 1.0f, lane);
        return;
    }
    if (dk)
        store_rows<DT>(dk + (size_t)kvh * D, ks, start, key0, L, dka, scale, 1, lane);
    if (dv)
        store_rows<DT>(dv + (size_t)kvh * D, ks, start, key0, L, dva, 1.0f, 1, lane);
}

/* dk, dv [tokens, Hkv, D] += the sum over splits of part (see attn_dkdv_kernel), in split
 * order; grid (nseq, ceil(max_seqlen / 4)), 256 threads, 4 tokens per block. */
__global__ void __launch_bounds__(256) attn_dkdv_reduce_kernel(bf *dk, bf *dv,
                                                               const float *part,
                                                               size_t part_stride, int hsplit,
                                                               const int *cu, int HD)
{
    int start, L;
    seq_range(cu, &start, &L);
    for (int r = 0; r < 4; r++) {
        int row = blockIdx.y * 4 + r;
        if (row >= L)
            return;
        size_t base = (size_t)(start + row) * HD;
        for (int e = threadIdx.x; e < HD; e += blockDim.x) {
            float sk = 0.0f, sv = 0.0f;
            for (int s = 0; s < hsplit; s++) {
                sk += part[(size_t)(2 * s) * part_stride + base + e];
                sv += part[(size_t)(2 * s + 1) * part_stride + base + e];
            }
            if (dk)
                dk[base + e] = __float2bfloat16_rn(__bfloat162float(dk[base + e]) + sk);
            if (dv)
                dv[base + e] = __float2bfloat16_rn(__bfloat162float(dv[base + e]) + sv);
        }
    }
}

/* ---- host side --------------------------------------------------------------------- */

struct attn_shape {
    const int *cu;
    int nseq, max_seqlen, Hq, Hkv, D, causal;
    float scale, sl2;
};

static int misaligned(const void *p, uintptr_t a) { return p && ((uintptr_t)p & (a - 1)); }

static int check_shape(kcuda_ctx *ctx, const char *fn, const attn_shape *a)
{
    if (!a->cu || a->nseq <= 0 || a->max_seqlen < 0 || a->Hq <= 0 || a->Hkv <= 0 ||
        a->Hq % a->Hkv != 0 || a->Hq > 65535 || (long)a->max_seqlen > 65535L * 8)
        return kcuda_fail(ctx, KCUDA_EARG,
                          "%s: bad shape nseq=%d max_seqlen=%d Hq=%d Hkv=%d", fn, a->nseq,
                          a->max_seqlen, a->Hq, a->Hkv);
    if (a->D != 64 && a->D != 80 && a->D != 128)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: head dim %d not supported (64, 80, 128)", fn,
                          a->D);
    return KCUDA_OK;
}

static attn_shape make_shape(const int *cu, int nseq, int max_seqlen, int Hq, int Hkv, int D,
                             int causal)
{
    attn_shape a;
    a.cu = cu;
    a.nseq = nseq;
    a.max_seqlen = max_seqlen;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.D = D;
    a.causal = causal != 0;
    a.scale = (float)(1.0 / sqrt((double)D));
    a.sl2 = a.scale * LOG2E;
    return a;
}

/* Sets the dynamic shared-memory limit (above the default 48 KiB) and launches. */
template <typename K, typename... Args>
static int launch(kcuda_ctx *ctx, const char *what, K kernel, dim3 grid, size_t smem,
                  Args... args)
{
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess)
        return kcuda_fail(ctx, KCUDA_ECUDA, "%s: cudaFuncSetAttribute: %s", what,
                          cudaGetErrorString(e));
    kernel<<<grid, NTHR, smem, ctx->stream>>>(args...);
    return kcuda_check_launch(ctx, what);
}

template <int D>
static int fwd(kcuda_ctx *ctx, const attn_shape *a, bf *out, float *lse, const bf *q,
               const bf *k, const bf *v)
{
    dim3 grid(a->nseq, (a->max_seqlen + BQ - 1) / BQ, a->Hq);
    return launch(ctx, "attn_fwd_kernel", attn_fwd_kernel<D>, grid, fwd_smem<D>(), out, lse,
                  q, k, v, a->cu, a->Hq, a->Hkv, a->causal, a->sl2);
}

/* The backward's scratch in the context's workspace: delta [tokens, Hq] fp32, then (when
 * hsplit > 1) the dk/dv partials [hsplit][2][tokens, Hkv, D] fp32, with tokens bounded by
 * nseq * max_seqlen. */
struct attn_scratch {
    float *delta, *part;
    size_t part_stride; /* elements of one [tokens, Hkv, D] partial */
    int hsplit;
};

/* A dk/dv block owns a kv head's key tile for all query heads of its group: with few kv
 * heads (GQA) and short inputs that is too few blocks to fill the GPU, so the group's
 * query heads are split over up to DKDV_SPLIT_TARGET blocks in all, as far as the
 * workspace holds the partial sums. */
#define DKDV_SPLIT_TARGET 512

static int scratch_plan(kcuda_ctx *ctx, const char *fn, const attn_shape *a,
                        attn_scratch *sc)
{
    size_t tokens = (size_t)a->nseq * (size_t)a->max_seqlen;
    size_t dbytes = (tokens * (size_t)a->Hq * sizeof(float) + 255) & ~(size_t)255;
    if (dbytes > ctx->workspace_bytes)
        return kcuda_fail(ctx, KCUDA_ENOMEM,
                          "%s: needs %zu bytes of context workspace (nseq*max_seqlen*Hq*4), "
                          "has %zu",
                          fn, dbytes, ctx->workspace_bytes);
    sc->delta = (float *)ctx->workspace;
    sc->part = (float *)((char *)ctx->workspace + dbytes);
    sc->part_stride = tokens * (size_t)a->Hkv * (size_t)a->D;
    sc->hsplit = 1;
    size_t avail = ctx->workspace_bytes - dbytes, per = 2 * sc->part_stride * sizeof(float);
    long blocks = (long)a->nseq * ((a->max_seqlen + BK - 1) / BK) * a->Hkv;
    int group = a->Hq / a->Hkv;
    for (int c = 2; c <= group && blocks * sc->hsplit < DKDV_SPLIT_TARGET; c++) {
        if (group % c)
            continue;
        if ((size_t)c * per > avail)
            break;
        sc->hsplit = c;
    }
    return KCUDA_OK;
}

template <int D>
static int bwd(kcuda_ctx *ctx, const attn_shape *a, bf *dq, bf *dk, bf *dv, const bf *dout,
               const bf *q, const bf *k, const bf *v, const float *lse,
               const attn_scratch *sc)
{
    const float *delta = sc->delta;
    int rc;
    if (dq) {
        dim3 grid(a->nseq, (a->max_seqlen + BQ - 1) / BQ, a->Hq);
        if ((rc = launch(ctx, "attn_dq_kernel", attn_dq_kernel<D>, grid, dq_smem<D>(), dq,
                         dout, q, k, v, lse, delta, a->cu, a->Hq, a->Hkv, a->causal, a->sl2,
                         a->scale)) < 0)
            return rc;
    }
    if (dk || dv) {
        int hs = sc->hsplit;
        float *part = hs > 1 ? sc->part : NULL;
        dim3 grid(a->nseq, (a->max_seqlen + BK - 1) / BK, a->Hkv * hs);
        if ((rc = launch(ctx, "attn_dkdv_kernel", attn_dkdv_kernel<D>, grid, dkdv_smem<D>(),
                         dk, dv, part, sc->part_stride, hs, dout, q, k, v, lse, delta, a->cu,
                         a->Hq, a->Hkv, a->causal, a->sl2, a->scale)) < 0)
            return rc;
        if (hs > 1) {
            dim3 rgrid(a->nseq, (a->max_seqlen + 3) / 4);
            attn_dkdv_reduce_kernel<<<rgrid, 256, 0, ctx->stream>>>(
                dk, dv, part, sc->part_stride, hs, a->cu, a->Hkv * D);
            return kcuda_check_launch(ctx, "attn_dkdv_reduce_kernel");
        }
    }
    return KCUDA_OK;
}

} /* namespace attn_v1 */

using namespace attn_v1;

extern "C" int kcuda_attention_v1_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, float *lse,
                                            const kcuda_bf16 *q, const kcuda_bf16 *k,
                                            const kcuda_bf16 *v, const int *cu_seqlens,
                                            int nseq, int max_seqlen, int Hq, int Hkv, int D,
                                            int causal)
{
    const char *fn = "kcuda_attention_v1_forward_bf16";
    attn_v1::attn_shape a = make_shape(cu_seqlens, nseq, max_seqlen, Hq, Hkv, D, causal);
    int rc = check_shape(ctx, fn, &a);
    if (rc < 0)
        return rc;
    if (!out || !q || !k || !v)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: NULL tensor", fn);
    if (misaligned(out, 16) || misaligned(q, 16) || misaligned(k, 16) || misaligned(v, 16) ||
        misaligned(lse, 4))
        return kcuda_fail(ctx, KCUDA_EARG, "%s: tensors must be 16-byte aligned", fn);
    if (max_seqlen == 0)
        return KCUDA_OK;
    bf *o = (bf *)out;
    const bf *qq = (const bf *)q, *kk = (const bf *)k, *vv = (const bf *)v;
    switch (D) {
    case 64: return fwd<64>(ctx, &a, o, lse, qq, kk, vv);
    case 80: return fwd<80>(ctx, &a, o, lse, qq, kk, vv);
    default: return fwd<128>(ctx, &a, o, lse, qq, kk, vv);
    }
}

extern "C" int kcuda_attention_v1_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dq, kcuda_bf16 *dk,
                                             kcuda_bf16 *dv, const kcuda_bf16 *dout,
                                             const kcuda_bf16 *q, const kcuda_bf16 *k,
                                             const kcuda_bf16 *v, const kcuda_bf16 *out,
                                             const float *lse, const int *cu_seqlens, int nseq,
                                             int max_seqlen, int Hq, int Hkv, int D, int causal)
{
    const char *fn = "kcuda_attention_v1_backward_bf16";
    attn_v1::attn_shape a = make_shape(cu_seqlens, nseq, max_seqlen, Hq, Hkv, D, causal);
    int rc = check_shape(ctx, fn, &a);
    if (rc < 0)
        return rc;
    if (!dq && !dk && !dv)
        return KCUDA_OK;
    if (!dout || !q || !k || !v || !out || !lse)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: NULL tensor", fn);
    if (misaligned(dout, 16) || misaligned(q, 16) || misaligned(k, 16) || misaligned(v, 16) ||
        misaligned(out, 2) || misaligned(lse, 4) || misaligned(dq, 4) || misaligned(dk, 4) ||
        misaligned(dv, 4))
        return kcuda_fail(ctx, KCUDA_EARG, "%s: misaligned tensor (q, k, v, dout: 16 bytes)",
                          fn);
    if (max_seqlen == 0)
        return KCUDA_OK;
    /* scratch in the workspace: the work on the context's stream is ordered, so nothing
     * else uses the workspace meanwhile */
    attn_v1::attn_scratch sc = {NULL, NULL, 0, 1};
    if ((rc = scratch_plan(ctx, fn, &a, &sc)) < 0)
        return rc;
    dim3 dgrid(nseq, (max_seqlen + 7) / 8);
    attn_v1::attn_delta_kernel<<<dgrid, 256, 0, ctx->stream>>>(sc.delta, (const bf *)dout,
                                                      (const bf *)out, cu_seqlens, Hq, D);
    if ((rc = kcuda_check_launch(ctx, "attn_delta_kernel")) < 0)
        return rc;
    bf *gq = (bf *)dq, *gk = (bf *)dk, *gv = (bf *)dv;
    const bf *go = (const bf *)dout, *qq = (const bf *)q, *kk = (const bf *)k,
             *vv = (const bf *)v;
    switch (D) {
    case 64: return bwd<64>(ctx, &a, gq, gk, gv, go, qq, kk, vv, lse, &sc);
    case 80: return bwd<80>(ctx, &a, gq, gk, gv, go, qq, kk, vv, lse, &sc);
    default: return bwd<128>(ctx, &a, gq, gk, gv, go, qq, kk, vv, lse, &sc);
    }
}
