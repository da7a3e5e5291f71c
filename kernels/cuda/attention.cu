/* attention.cu - flash attention forward and backward (the FA2 scheme), bf16 storage,
 * fp32 accumulation, tensor cores through mma.sync m16n8k16 (bf16 in, fp32 out).
 * Same semantics as kcpu_attention_* (kernels.h): variable-length sequences through
 * cu_seqlens, grouped-query heads, optional causal mask, scale 1/sqrt(D), lse saved.
 * Scores exist only as per-warp 16 x 64 (or 16 x 32) register tiles: never S x S.
 *
 * Forward (one block of NW warps per (sequence, query head, 16*NW-query tile); each warp
 * owns 16 query rows; NW = 8 for D <= 80 on inputs longer than one 64-row tile, else 4):
 * for each 64-key tile, S = Q K^T on tensor cores, running row max m and row sum l in the
 * log2 domain (exp2 of scores pre-multiplied by scale*log2(e)), O rescaled and O += P V
 * with P taken straight from the S accumulators (the m16n8 accumulator layout of two
 * adjacent 8-column tiles is the m16k16 A-operand layout).  End: O /= l,
 * lse = ln2 * (m + log2 l).
 *
 * Backward, deterministic (no atomics; every output element has one writer that visits
 * its inputs in a fixed order):
 *   delta kernel  D_i = sum_d dO_i O_i (fp32, in the context's workspace);
 *   dk/dv kernel  one block per (sequence, kv head, 64-key tile); each warp owns 16 keys
 *                 and keeps dK, dV in registers while it loops over the query heads of the
 *                 group and over query tiles: S^T = K Q^T, P^T = exp2(S^T - lse),
 *                 dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q.
 *                 Under the causal mask the first key tiles carry most of the work, so
 *                 there the block has 8 warps in two halves that take the two 32-query
 *                 halves of each 64-query step; the second half's sums are added to the
 *                 first's through shared memory at the end (a fixed order).
 *                 When that gives too few blocks (GQA: few kv heads), the group's query
 *                 heads are split over several blocks that write fp32 partial sums to the
 *                 workspace, and a reduce kernel adds them in a fixed order;
 *   dq kernel     one block per (sequence, query head, 64-query tile), looping over key
 *                 tiles: S, P, dP = dO V^T, dS, dQ += dS K.
 * Recomputing S and dP in the dq kernel costs 2 of the 7 tile products; the price of
 * determinism (FA2's fp32 atomics into a dQ buffer avoid it).
 * Query tiles are the slowest grid dimension, the heaviest (under a causal mask) first,
 * so that the long blocks of every head start in the first wave.
 *
 * Shared memory: every tile is stored as in global memory, row-major [token][D], rows
 * padded by 8 bf16 (16 bytes), filled by cp.async (16 bytes a thread, rows past the end of
 * a sequence zero-filled by the copy itself, never read from global memory) and read by
 * ldmatrix: plain for A operands and for B operands stored [n][k] (K in Q K^T), .trans for
 * B operands stored [k][n] (V in P V, K in dS K, Q and dO in the dk/dv products).  With
 * the padding the 8 row addresses of one 8x8 matrix hit 8 different 16-byte bank groups.
 * The next K/V tile (forward, dq) or Q/dO tile (dk/dv) is copied while the current one is
 * multiplied (two buffers).  Probabilities of rows or keys past the end of a sequence and
 * of masked keys are 0; the mask is evaluated only on tiles that cross the diagonal or the
 * end of the sequence. */
#include "cuda/kcuda_internal.h"

#include <math.h>
#include <stdint.h>

typedef __nv_bfloat16 bf;

#define BK 64        /* key rows per tile (4 warps x 16 in the dk/dv kernel) */
#define BQD 64       /* query rows per block of the dq kernel (4 warps x 16) */
#define PAD 8        /* bf16 of padding per shared-memory row */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* ---- PTX wrappers ------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Four 8x8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i (16 bytes
 * each, 16-byte aligned); r[i] gets this lane's pair of matrix i (row lane/4, columns
 * 2*(lane%4), +1), or with .trans the pair (rows 2*(lane%4), +1; column lane/4). */
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const bf *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const bf *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* 16 bytes global -> shared, asynchronous; zeros when !ok (src is then not read). */
__device__ __forceinline__ void cp_async16(bf *dst, const bf *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(ok ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async4(float *dst, const float *src, bool ok)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(ok ? 4 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most N of this thread's committed copy groups are still in flight (a
 * __syncthreads after it makes every thread's copies visible to the block). */
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* 2^x, one MUFU.EX2 (exp2f adds a denormal range fix-up around it); results below 2^-126
 * flush to 0, which no probability here notices. */
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

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

/* The A fragment of columns 16*kc.. of a 16-row row-major tile (row stride lda):
 * matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
 * are a0..a3. */
__device__ __forceinline__ void load_afrag(uint32_t (&a)[4], const bf *A, int lda, int kc,
                                           int lane)
{
    ldsm4(a, A + (lane & 15) * lda + (lane >> 4) * 8 + kc * 16);
}

template <int KC>
__device__ __forceinline__ void load_afrags(uint32_t (&a)[KC][4], const bf *A, int lda, int lane)
{
#pragma unroll
    for (int kc = 0; kc < KC; kc++)
        load_afrag(a[kc], A, lda, kc, lane);
}

/* acc[16 x 8*NT] += a . B[k chunk kc], B stored n-major ([n][k], row stride ldb): one
 * ldmatrix gives b0, b1 of n-tiles 2j and 2j+1 (matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
 * (n 8-15, k 0-7), (n 8-15, k 8-15)).  NT is even. */
template <int NT>
__device__ __forceinline__ void mma_bn(float (&acc)[NT][4], const uint32_t (&a)[4],
                                       const bf *B, int ldb, int kc, int lane)
{
    const bf *pb = B + ((lane & 7) + ((lane >> 4) << 3)) * ldb + ((lane >> 3) & 1) * 8 +
                   kc * 16;
#pragma unroll
    for (int j = 0; j < NT / 2; j++) {
        uint32_t b[4];
        ldsm4(b, pb + j * 16 * ldb);
        mma16816(acc[2 * j], a, b[0], b[1]);
        mma16816(acc[2 * j + 1], a, b[2], b[3]);
    }
}

/* As mma_bn, B stored k-major ([k][n], row stride ldb), through ldmatrix.trans: matrices
 * (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15). */
template <int NT>
__device__ __forceinline__ void mma_bk(float (&acc)[NT][4], const uint32_t (&a)[4],
                                       const bf *B, int ldb, int kc, int lane)
{
    const bf *pb = B + ((lane & 15) + kc * 16) * ldb + (lane >> 4) * 8;
#pragma unroll
    for (int j = 0; j < NT / 2; j++) {
        uint32_t b[4];
        ldsm4t(b, pb + j * 16);
        mma16816(acc[2 * j], a, b[0], b[1]);
        mma16816(acc[2 * j + 1], a, b[2], b[3]);
    }
}

/* acc[16 x 8*NT] += A[16 x 16*KC] . B, A row-major in shared memory (row stride lda),
 * B n-major [8*NT][16*KC] (row stride ldb). */
template <int KC, int NT>
__device__ __forceinline__ void warp_mma_ss(float (&acc)[NT][4], const bf *A, int lda,
                                            const bf *B, int ldb, int lane)
{
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t a[4];
        load_afrag(a, A, lda, kc, lane);
        mma_bn<NT>(acc, a, B, ldb, kc, lane);
    }
}

/* acc[16 x 8*NT] += A . B, A given as fragments (load_afrags), B n-major in shared memory. */
template <int KC, int NT>
__device__ __forceinline__ void warp_mma_rf(float (&acc)[NT][4], const uint32_t (&a)[KC][4],
                                            const bf *B, int ldb, int lane)
{
#pragma unroll
    for (int kc = 0; kc < KC; kc++)
        mma_bn<NT>(acc, a[kc], B, ldb, kc, lane);
}

/* acc[16 x 8*NT] += P[16 x 16*KC] . B, P given as the accumulator tiles of an earlier
 * product (p[2*KC][4], rounded to bf16 here), B k-major [16*KC][8*NT] in shared memory
 * (row stride ldb): the tile as stored from global memory, [token][D]. */
template <int KC, int NT>
__device__ __forceinline__ void warp_mma_rs(float (&acc)[NT][4], const float (&p)[2 * KC][4],
                                            const bf *B, int ldb, int lane)
{
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        uint32_t a[4];
        a[0] = pack_bf16(p[2 * kc][0], p[2 * kc][1]);
        a[1] = pack_bf16(p[2 * kc][2], p[2 * kc][3]);
        a[2] = pack_bf16(p[2 * kc + 1][0], p[2 * kc + 1][1]);
        a[3] = pack_bf16(p[2 * kc + 1][2], p[2 * kc + 1][3]);
        mma_bk<NT>(acc, a, B, ldb, kc, lane);
    }
}

/* ---- tile loads and stores --------------------------------------------------------- */

/* Starts copying a rows x D tile from global memory (token r at g + r * gstride, 16-byte
 * aligned) into shared memory s[r][c] (row stride ld) with the block's NTH threads; rows
 * r >= valid become zeros (valid >= 1, so g itself is readable).  A warp copies whole
 * rows: coalesced. */
template <int D, int NTH>
__device__ __forceinline__ void load_tile_async(bf *s, int ld, const bf *g, size_t gstride,
                                                int rows, int valid)
{
    constexpr int C8 = D / 8;
    for (int i = threadIdx.x; i < rows * C8; i += NTH) {
        int r = i / C8, c = (i % C8) * 8;
        bool ok = r < valid;
        cp_async16(s + r * ld + c, ok ? g + (size_t)r * gstride + c : g, ok);
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

/* Two buffers of a K tile and a V tile; the Q tile (at most 128 rows) first lands in the
 * second buffer, until its fragments are in registers. */
template <int D>
constexpr size_t fwd_smem()
{
    return (size_t)4 * BK * (D + PAD) * sizeof(bf);
}

/* Blocks per SM that the register budget is cut to (ptxas -v: no or a few bytes of
 * spills); the shared memory allows at least as many. */
constexpr int fwd_min_blocks(int D, int NW) { return NW == 8 ? 2 : D == 64 ? 4 : 3; }

/* grid (nseq, Hq, query tiles of 16*NW rows).  sl2 = scale * log2(e). */
template <int D, int NW>
__global__ void __launch_bounds__(32 * NW, fwd_min_blocks(D, NW))
    attn_fwd_kernel(bf *out, float *lse, const bf *q, const bf *k, const bf *v, const int *cu,
                    int Hq, int Hkv, int causal, float sl2, int ldq, int ldk, int ldv)
{
    constexpr int NTH = 32 * NW, BQ = 16 * NW, LD = D + PAD, KC = D / 16, NT = BK / 8,
                  DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    static_assert(BQ <= 2 * BK, "the Q tile fits in one K, V buffer");
    bf *Kb = (bf *)smem, *Qs = Kb + 2 * BK * LD; /* buffer b: K at Kb + 2*b*BK*LD, V after */

    int start, L;
    seq_range(cu, &start, &L);
    /* the last query tiles have the most keys under a causal mask: start them first */
    const int q0 = (int)(gridDim.z - 1 - blockIdx.z) * BQ, h = blockIdx.y;
    if (q0 >= L)
        return;
    const int kvh = h / (Hq / Hkv);
    const size_t qs = ldq, ks = ldk, vs = ldv, os = (size_t)Hq * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int row0 = q0 + warp * 16 + (lane >> 2); /* rows of c0,c1; row0 + 8: c2,c3 */
    const int kend = causal ? min(L, q0 + BQ) : L, ntiles = (kend + BK - 1) / BK;
    const bf *kg = k + (size_t)start * ks + (size_t)kvh * D;
    const bf *vg = v + (size_t)start * vs + (size_t)kvh * D;

    load_tile_async<D, NTH>(Qs, LD, q + (size_t)(start + q0) * qs + (size_t)h * D, qs, BQ,
                            min(BQ, L - q0));
    cp_async_commit();
    load_tile_async<D, NTH>(Kb, LD, kg, ks, BK, min(BK, L));
    load_tile_async<D, NTH>(Kb + BK * LD, LD, vg, vs, BK, min(BK, L));
    cp_async_commit();
    cp_async_wait<1>(); /* Q is in; the first K, V tile may still be on its way */
    __syncthreads();
    uint32_t qf[KC][4]; /* this warp's 16 query rows, read once */
    load_afrags<KC>(qf, Qs + warp * 16 * LD, LD, lane);
    __syncthreads(); /* the second buffer is free for the next K, V tile */
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        const int k0 = it * BK;
        const bf *Ks = Kb + (it & 1) * 2 * BK * LD, *Vs = Ks + BK * LD;
        if (it + 1 < ntiles) {
            /* the other buffer was last read in iteration it - 1, which ended with a barrier */
            const int k1 = k0 + BK;
            bf *nk = Kb + ((it + 1) & 1) * 2 * BK * LD;
            load_tile_async<D, NTH>(nk, LD, kg + (size_t)k1 * ks, ks, BK, min(BK, L - k1));
            load_tile_async<D, NTH>(nk + BK * LD, LD, vg + (size_t)k1 * vs, vs, BK,
                                    min(BK, L - k1));
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
        warp_mma_rf<KC, NT>(s, qf, Ks, LD, lane);

        /* keys past the end, or (causal) after some row of this warp */
        const bool edge = k0 + BK > L || (causal && k0 + BK - 1 > q0 + warp * 16);
        /* row maxima of the raw scores (the scale is positive), scaled once per row */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                if (edge) {
                    int col = k0 + nt * 8 + 2 * t + (r & 1), row = row0 + 8 * (r >> 1);
                    if (col >= L || (causal && col > row))
                        s[nt][r] = -INFINITY;
                }
                mx[r >> 1] = fmaxf(mx[r >> 1], s[nt][r]);
            }
        float base[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            /* the 4 threads of a quad hold one row */
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            mx[i] = fmaxf(m[i], mx[i] * sl2);
            base[i] = mx[i] == -INFINITY ? 0.0f : mx[i]; /* a row with nothing visible yet */
            alpha[i] = fast_exp2(m[i] - base[i]);
            m[i] = mx[i];
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float p = fast_exp2(fmaf(s[nt][r], sl2, -base[r >> 1]));
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
        warp_mma_rs<BK / 16, DT>(o, s, Vs, LD, lane);
        __syncthreads(); /* this buffer is refilled in the next iteration */
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
    store_rows<DT>(out + (size_t)h * D, os, start, row0, L, o, 1.0f, 0, lane);
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

/* Q, dO tiles, then K and V in two buffers each. */
template <int D>
constexpr size_t dq_smem()
{
    return (size_t)(2 * BQD + 4 * BK) * (D + PAD) * sizeof(bf);
}

/* Blocks per SM of the dq kernel: what its shared memory allows, the register budget
 * cut to match. */
constexpr int dq_min_blocks(int D) { return D == 64 ? 4 : D == 80 ? 3 : 2; }

/* dq += scale * sum_j dS_ij k_j; grid (nseq, Hq, query tiles), 4 warps. */
template <int D>
__global__ void __launch_bounds__(128, dq_min_blocks(D)) attn_dq_kernel(bf *dq, const bf *dout, const bf *q,
                                                      const bf *k, const bf *v,
                                                      const float *lse, const float *delta,
                                                      const int *cu, int Hq, int Hkv,
                                                      int causal, float sl2, float scale,
                                                      int ldq, int ldk, int ldv)
{
    constexpr int NTH = 128, LD = D + PAD, KC = D / 16, NT = BK / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Qs = (bf *)smem, *dOs = Qs + BQD * LD, *Kb = dOs + BQD * LD, *Vb = Kb + 2 * BK * LD;

    int start, L;
    seq_range(cu, &start, &L);
    const int q0 = (int)(gridDim.z - 1 - blockIdx.z) * BQD, h = blockIdx.y;
    if (q0 >= L)
        return;
    const int kvh = h / (Hq / Hkv);
    const size_t qs = ldq, ks = ldk, vs = ldv, os = (size_t)Hq * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int row0 = q0 + warp * 16 + (lane >> 2);
    const int kend = causal ? min(L, q0 + BQD) : L, ntiles = (kend + BK - 1) / BK;
    const bf *kg = k + (size_t)start * ks + (size_t)kvh * D;
    const bf *vg = v + (size_t)start * vs + (size_t)kvh * D;

    load_tile_async<D, NTH>(Qs, LD, q + (size_t)(start + q0) * qs + (size_t)h * D, qs, BQD,
                            min(BQD, L - q0));
    load_tile_async<D, NTH>(dOs, LD, dout + (size_t)(start + q0) * os + (size_t)h * D, os,
                            BQD, min(BQD, L - q0));
    load_tile_async<D, NTH>(Kb, LD, kg, ks, BK, min(BK, L));
    load_tile_async<D, NTH>(Vb, LD, vg, vs, BK, min(BK, L));
    cp_async_commit();
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

    for (int it = 0; it < ntiles; it++) {
        const int k0 = it * BK;
        const bf *Ks = Kb + (it & 1) * BK * LD, *Vs = Vb + (it & 1) * BK * LD;
        if (it + 1 < ntiles) {
            const int k1 = k0 + BK, nb = ((it + 1) & 1) * BK * LD;
            load_tile_async<D, NTH>(Kb + nb, LD, kg + (size_t)k1 * ks, ks, BK, min(BK, L - k1));
            load_tile_async<D, NTH>(Vb + nb, LD, vg + (size_t)k1 * vs, vs, BK, min(BK, L - k1));
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                s[i][r] = dp[i][r] = 0.0f;
        warp_mma_ss<KC, NT>(s, Qs + warp * 16 * LD, LD, Ks, LD, lane);
        warp_mma_ss<KC, NT>(dp, dOs + warp * 16 * LD, LD, Vs, LD, lane);
        const bool edge = k0 + BK > L || (causal && k0 + BK - 1 > q0 + warp * 16);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int col = k0 + nt * 8 + 2 * t + (r & 1), row = row0 + 8 * (r >> 1);
                bool ok = !edge || (col < L && !(causal && col > row));
                float p = ok ? fast_exp2(fmaf(s[nt][r], sl2, -lse2[r >> 1])) : 0.0f;
                s[nt][r] = p * (dp[nt][r] - dl[r >> 1]); /* dS without the scale */
            }
        warp_mma_rs<BK / 16, DT>(acc, s, Ks, LD, lane);
        __syncthreads(); /* this buffer is refilled in the next iteration */
    }
    store_rows<DT>(dq + (size_t)h * D, qs, start, row0, L, acc, scale, 1, lane);
}

/* K, V; Q and dO in two buffers of 32*HALVES rows each; lse and delta likewise (fp32). */
template <int D, int HALVES>
constexpr size_t dkdv_smem()
{
    return (size_t)(2 * BK + 4 * 32 * HALVES) * (D + PAD) * sizeof(bf) +
           (size_t)4 * 32 * HALVES * sizeof(float);
}

/* Blocks per SM that the register budget of the dk/dv kernel is cut to (no spills). */
constexpr int dkdv_min_blocks(int D, int HALVES)
{
    return HALVES == 2 ? (D == 64 ? 2 : 1) : D == 64 ? 4 : D == 80 ? 3 : 2;
}

/* dk += scale * sum dS^T q, dv += sum P^T dout over the query heads of the group;
 * grid (nseq, Hkv * hsplit, key tiles), 4 * HALVES warps: warp w owns keys 16*(w%4).. of
 * the tile for the 32 queries 32*(w/4).. of each step of 32*HALVES queries.  With
 * hsplit > 1 the group's query heads are split into hsplit consecutive ranges, one per
 * block, and each block stores its fp32 partial sums in part (split-major,
 * [hsplit][2][tokens][Hkv][D], dk then dv) for attn_dkdv_reduce_kernel, which adds them
 * in split order. */
template <int D, int HALVES>
__global__ void __launch_bounds__(128 * HALVES, dkdv_min_blocks(D, HALVES))
    attn_dkdv_kernel(bf *dk, bf *dv, float *part, size_t part_stride, int hsplit,
                     const bf *dout, const bf *q, const bf *k, const bf *v, const float *lse,
                     const float *delta, const int *cu, int Hq, int Hkv, int causal, float sl2,
                     float scale, int ldq, int ldk, int ldv)
{
    constexpr int NTH = 128 * HALVES, BQB = 32 * HALVES, LD = D + PAD, KC = D / 16,
                  NT = 32 / 8, DT = D / 8;
    static_assert(HALVES == 1 || 128 * D * sizeof(float) <= 4 * BQB * LD * sizeof(bf),
                  "the query buffers hold the second half's sums");
    extern __shared__ __align__(16) unsigned char smem[];
    bf *Ks = (bf *)smem, *Vs = Ks + BK * LD, *Qb = Vs + BK * LD, *dOb = Qb + 2 * BQB * LD;
    float *lse_b = (float *)(dOb + 2 * BQB * LD), *dl_b = lse_b + 2 * BQB;

    int start, L;
    seq_range(cu, &start, &L);
    /* the first key tiles have most work under a causal mask: start them first */
    const int k0 = blockIdx.z * BK, kvh = blockIdx.y / hsplit, sp = blockIdx.y % hsplit;
    if (k0 >= L)
        return;
    const int group = Hq / Hkv, hn = group / hsplit, h0 = kvh * group + sp * hn;
    const size_t qs = ldq, ks = ldk, vs = ldv, os = (size_t)Hq * D, ps = (size_t)Hkv * D;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int half = warp >> 2, kw = warp & 3;
    const int key0 = k0 + kw * 16 + (lane >> 2); /* keys of c0,c1; key0 + 8: c2,c3 */
    /* steps: (head, query tile) pairs, heads outer; under the causal mask queries before
     * k0 see none of these keys */
    const int qbeg = causal ? k0 : 0, nqt = (L - qbeg + BQB - 1) / BQB, nsteps = hn * nqt;

    load_tile_async<D, NTH>(Ks, LD, k + (size_t)(start + k0) * ks + (size_t)kvh * D, ks, BK,
                            min(BK, L - k0));
    load_tile_async<D, NTH>(Vs, LD, v + (size_t)(start + k0) * vs + (size_t)kvh * D, vs, BK,
                            min(BK, L - k0));
    cp_async_commit();
    auto load_step = [&](int step, int buf) {
        const int h = h0 + step / nqt, q0 = qbeg + (step % nqt) * BQB;
        load_tile_async<D, NTH>(Qb + buf * BQB * LD, LD,
                                q + (size_t)(start + q0) * qs + (size_t)h * D, qs, BQB,
                                min(BQB, L - q0));
        load_tile_async<D, NTH>(dOb + buf * BQB * LD, LD,
                                dout + (size_t)(start + q0) * os + (size_t)h * D, os, BQB,
                                min(BQB, L - q0));
        if (threadIdx.x < 2 * BQB) {
            const int i = threadIdx.x % BQB, row = q0 + i;
            const bool isd = threadIdx.x >= BQB;
            const size_t at = (size_t)(start + min(row, L - 1)) * Hq + h;
            cp_async4((isd ? dl_b : lse_b) + buf * BQB + i, (isd ? delta : lse) + at, row < L);
        }
        cp_async_commit();
    };
    load_step(0, 0);

    float dka[DT][4], dva[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            dka[i][r] = dva[i][r] = 0.0f;

    for (int it = 0; it < nsteps; it++) {
        if (it + 1 < nsteps) {
            /* the other buffer was last read in iteration it - 1, which ended with a barrier */
            load_step(it + 1, (it + 1) & 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int buf = it & 1, qh = qbeg + (it % nqt) * BQB + half * 32;
        const bf *Qs = Qb + (buf * BQB + half * 32) * LD, *dOs = dOb + (buf * BQB + half * 32) * LD;
        const float *ls = lse_b + buf * BQB + half * 32, *dls = dl_b + buf * BQB + half * 32;

        float st[NT][4], dpt[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                st[i][r] = dpt[i][r] = 0.0f;
        warp_mma_ss<KC, NT>(st, Ks + kw * 16 * LD, LD, Qs, LD, lane);
        warp_mma_ss<KC, NT>(dpt, Vs + kw * 16 * LD, LD, dOs, LD, lane);
        /* queries or keys past the end, or (causal) a key after some query */
        const bool edge = qh + 32 > L || k0 + kw * 16 + 16 > L ||
                          (causal && k0 + kw * 16 + 15 > qh);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int qi = nt * 8 + 2 * t + (r & 1), key = key0 + 8 * (r >> 1);
                int row = qh + qi;
                bool ok = !edge || (key < L && row < L && !(causal && key > row));
                float p = ok ? fast_exp2(fmaf(st[nt][r], sl2, -ls[qi] * LOG2E)) : 0.0f;
                st[nt][r] = p;
                dpt[nt][r] = p * (dpt[nt][r] - dls[qi]); /* dS^T without the scale */
            }
        warp_mma_rs<2, DT>(dva, st, dOs, LD, lane);
        warp_mma_rs<2, DT>(dka, dpt, Qs, LD, lane);
        __syncthreads(); /* this buffer is refilled in the next iteration */
    }

    if constexpr (HALVES == 2) {
        /* the second half's sums go through the (now unused) query buffers, which hold
         * them: 128 threads x D floats <= 4 * 64 rows x (D + 8) bf16 */
        float *red = (float *)Qb;
        const int slot = kw * 32 + lane;
        if (half) {
#pragma unroll
            for (int i = 0; i < DT; i++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    red[(i * 4 + r) * 128 + slot] = dka[i][r];
                    red[((DT + i) * 4 + r) * 128 + slot] = dva[i][r];
                }
        }
        __syncthreads();
        if (half)
            return;
#pragma unroll
        for (int i = 0; i < DT; i++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                dka[i][r] += red[(i * 4 + r) * 128 + slot];
                dva[i][r] += red[((DT + i) * 4 + r) * 128 + slot];
            }
    }
    if (part) {
        float *pk = part + (size_t)(2 * sp) * part_stride + (size_t)kvh * D;
        store_rows_f32<DT>(pk, ps, start, key0, L, dka, scale, lane);
        store_rows_f32<DT>(pk + part_stride, ps, start, key0, L, dva, 1.0f, lane);
        return;
    }
    if (dk)
        store_rows<DT>(dk + (size_t)kvh * D, ks, start, key0, L, dka, scale, 1, lane);
    if (dv)
        store_rows<DT>(dv + (size_t)kvh * D, vs, start, key0, L, dva, 1.0f, 1, lane);
}

/* dk, dv [tokens, Hkv, D] (rows ldk, ldv apart) += the sum over splits of part (see
 * attn_dkdv_kernel), in split order; grid (nseq, ceil(max_seqlen / 4)), 256 threads, 4
 * tokens per block. */
__global__ void __launch_bounds__(256) attn_dkdv_reduce_kernel(bf *dk, bf *dv,
                                                               const float *part,
                                                               size_t part_stride, int hsplit,
                                                               const int *cu, int HD, int ldk,
                                                               int ldv)
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
            size_t ko = (size_t)(start + row) * ldk + e, vo = (size_t)(start + row) * ldv + e;
            if (dk)
                dk[ko] = __float2bfloat16_rn(__bfloat162float(dk[ko]) + sk);
            if (dv)
                dv[vo] = __float2bfloat16_rn(__bfloat162float(dv[vo]) + sv);
        }
    }
}

/* ---- host side --------------------------------------------------------------------- */

struct attn_shape {
    const int *cu;
    int nseq, max_seqlen, Hq, Hkv, D, causal;
    float scale, sl2;
    int ldq, ldk, ldv;   /* row strides of q (dq), k (dk), v (dv); out and dout: Hq * D */
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
    a.ldq = Hq * D;
    a.ldk = a.ldv = Hkv * D;
    return a;
}

/* Row strides given (0: contiguous), each at least its rows' width and a multiple of 8
 * elements (the tiles' 16-byte loads). */
static int set_strides(kcuda_ctx *ctx, const char *fn, attn_shape *a, int ldq, int ldk,
                       int ldv)
{
    if (ldq)
        a->ldq = ldq;
    if (ldk)
        a->ldk = ldk;
    if (ldv)
        a->ldv = ldv;
    if (a->ldq < a->Hq * a->D || a->ldk < a->Hkv * a->D || a->ldv < a->Hkv * a->D ||
        a->ldq % 8 || a->ldk % 8 || a->ldv % 8)
        return kcuda_fail(ctx, KCUDA_EARG, "%s: row strides %d, %d, %d: each must cover its "
                          "heads and be a multiple of 8", fn, a->ldq, a->ldk, a->ldv);
    return KCUDA_OK;
}

/* Sets the dynamic shared-memory limit (above the default 48 KiB) and the carveout, and
 * launches. */
template <typename K, typename... Args>
static int launch(kcuda_ctx *ctx, const char *what, K kernel, dim3 grid, int threads,
                  size_t smem, Args... args)
{
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    /* all of L1 as shared memory: the blocks per SM that the tiles allow (these kernels
     * stream through shared memory, little goes through L1) */
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 (int)cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess)
        return kcuda_fail(ctx, KCUDA_ECUDA, "%s: cudaFuncSetAttribute: %s", what,
                          cudaGetErrorString(e));
    kernel<<<grid, threads, smem, ctx->stream>>>(args...);
    return kcuda_check_launch(ctx, what);
}

template <int D>
static int fwd(kcuda_ctx *ctx, const attn_shape *a, bf *out, float *lse, const bf *q,
               const bf *k, const bf *v)
{
    /* 8 warps share each K, V tile where the registers allow two such blocks per SM and
     * the sequences fill more than one 64-row tile */
    if constexpr (D <= 80) {
        if (a->max_seqlen > 64) {
            dim3 grid(a->nseq, a->Hq, (a->max_seqlen + 127) / 128);
            return launch(ctx, "attn_fwd_kernel", attn_fwd_kernel<D, 8>, grid, 256,
                          fwd_smem<D>(), out, lse, q, k, v, a->cu, a->Hq, a->Hkv, a->causal,
                          a->sl2, a->ldq, a->ldk, a->ldv);
        }
    }
    dim3 grid(a->nseq, a->Hq, (a->max_seqlen + 63) / 64);
    return launch(ctx, "attn_fwd_kernel", attn_fwd_kernel<D, 4>, grid, 128, fwd_smem<D>(),
                  out, lse, q, k, v, a->cu, a->Hq, a->Hkv, a->causal, a->sl2, a->ldq, a->ldk,
                  a->ldv);
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
        dim3 grid(a->nseq, a->Hq, (a->max_seqlen + BQD - 1) / BQD);
        if ((rc = launch(ctx, "attn_dq_kernel", attn_dq_kernel<D>, grid, 128, dq_smem<D>(), dq,
                         dout, q, k, v, lse, delta, a->cu, a->Hq, a->Hkv, a->causal, a->sl2,
                         a->scale, a->ldq, a->ldk, a->ldv)) < 0)
            return rc;
    }
    if (dk || dv) {
        int hs = sc->hsplit;
        float *part = hs > 1 ? sc->part : NULL;
        dim3 grid(a->nseq, a->Hkv * hs, (a->max_seqlen + BK - 1) / BK);
        /* under the causal mask the work per key tile falls linearly from the first tile
         * to the last: 8 warps halve the longest blocks */
        if (a->causal)
            rc = launch(ctx, "attn_dkdv_kernel", attn_dkdv_kernel<D, 2>, grid, 256,
                        dkdv_smem<D, 2>(), dk, dv, part, sc->part_stride, hs, dout, q, k, v,
                        lse, delta, a->cu, a->Hq, a->Hkv, a->causal, a->sl2, a->scale, a->ldq,
                        a->ldk, a->ldv);
        else
            rc = launch(ctx, "attn_dkdv_kernel", attn_dkdv_kernel<D, 1>, grid, 128,
                        dkdv_smem<D, 1>(), dk, dv, part, sc->part_stride, hs, dout, q, k, v,
                        lse, delta, a->cu, a->Hq, a->Hkv, a->causal, a->sl2, a->scale, a->ldq,
                        a->ldk, a->ldv);
        if (rc < 0)
            return rc;
        if (hs > 1) {
            dim3 rgrid(a->nseq, (a->max_seqlen + 3) / 4);
            attn_dkdv_reduce_kernel<<<rgrid, 256, 0, ctx->stream>>>(
                dk, dv, part, sc->part_stride, hs, a->cu, a->Hkv * D, a->ldk, a->ldv);
            return kcuda_check_launch(ctx, "attn_dkdv_reduce_kernel");
        }
    }
    return KCUDA_OK;
}

extern "C" int kcuda_attention_forward_bf16(kcuda_ctx *ctx, kcuda_bf16 *out, float *lse,
                                            const kcuda_bf16 *q, const kcuda_bf16 *k,
                                            const kcuda_bf16 *v, const int *cu_seqlens,
                                            int nseq, int max_seqlen, int Hq, int Hkv, int D,
                                            int causal)
{
    return kcuda_attention_forward_bf16_ld(ctx, out, lse, q, k, v, 0, 0, 0, cu_seqlens, nseq,
                                           max_seqlen, Hq, Hkv, D, causal);
}

extern "C" int kcuda_attention_forward_bf16_ld(kcuda_ctx *ctx, kcuda_bf16 *out, float *lse,
                                               const kcuda_bf16 *q, const kcuda_bf16 *k,
                                               const kcuda_bf16 *v, int ldq, int ldk, int ldv,
                                               const int *cu_seqlens, int nseq, int max_seqlen,
                                               int Hq, int Hkv, int D, int causal)
{
    const char *fn = "kcuda_attention_forward_bf16";
    attn_shape a = make_shape(cu_seqlens, nseq, max_seqlen, Hq, Hkv, D, causal);
    int rc = check_shape(ctx, fn, &a);
    if (rc < 0 || (rc = set_strides(ctx, fn, &a, ldq, ldk, ldv)) < 0)
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

extern "C" int kcuda_attention_backward_bf16(kcuda_ctx *ctx, kcuda_bf16 *dq, kcuda_bf16 *dk,
                                             kcuda_bf16 *dv, const kcuda_bf16 *dout,
                                             const kcuda_bf16 *q, const kcuda_bf16 *k,
                                             const kcuda_bf16 *v, const kcuda_bf16 *out,
                                             const float *lse, const int *cu_seqlens, int nseq,
                                             int max_seqlen, int Hq, int Hkv, int D, int causal)
{
    return kcuda_attention_backward_bf16_ld(ctx, dq, dk, dv, dout, q, k, v, out, lse, 0, 0, 0,
                                            cu_seqlens, nseq, max_seqlen, Hq, Hkv, D, causal);
}

extern "C" int kcuda_attention_backward_bf16_ld(kcuda_ctx *ctx, kcuda_bf16 *dq, kcuda_bf16 *dk,
                                                kcuda_bf16 *dv, const kcuda_bf16 *dout,
                                                const kcuda_bf16 *q, const kcuda_bf16 *k,
                                                const kcuda_bf16 *v, const kcuda_bf16 *out,
                                                const float *lse, int ldq, int ldk, int ldv,
                                                const int *cu_seqlens, int nseq,
                                                int max_seqlen, int Hq, int Hkv, int D,
                                                int causal)
{
    const char *fn = "kcuda_attention_backward_bf16";
    attn_shape a = make_shape(cu_seqlens, nseq, max_seqlen, Hq, Hkv, D, causal);
    int rc = check_shape(ctx, fn, &a);
    if (rc < 0 || (rc = set_strides(ctx, fn, &a, ldq, ldk, ldv)) < 0)
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
    attn_scratch sc = {NULL, NULL, 0, 1};
    if ((rc = scratch_plan(ctx, fn, &a, &sc)) < 0)
        return rc;
    dim3 dgrid(nseq, (max_seqlen + 7) / 8);
    attn_delta_kernel<<<dgrid, 256, 0, ctx->stream>>>(sc.delta, (const bf *)dout,
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
