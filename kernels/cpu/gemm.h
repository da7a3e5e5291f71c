/* gemm.h - the single-threaded blocked matrix product behind kcpu_matmul_* and the
 * attention kernels (internal to kernels/cpu/).
 *
 *   C[i*ldc + j] (+)= sum_k A(i,k) * B(k,j)   for i < M, j < N
 *   A(i,k) = a[i*rsa + k*csa],  B(k,j) = b[k*rsb + j*csb]
 *
 * Arbitrary strides let one routine serve A.B, A.B^T and A^T.B: both operands are packed
 * into contiguous panels before the register-tiled inner kernel runs.
 *
 * Numerics (the reason this is one routine): every C element is computed as
 *     t_0 = sum over k in [0, KC) in increasing k, starting from 0;  C = t_0 (or C += t_0)
 *     t_b = sum over k in [b*KC, (b+1)*KC) likewise;                  C += t_b
 * with separate multiply and add (no FMA contraction: -std=c11 implies
 * -ffp-contract=off).  That order does not depend on the tiling, the SIMD width picked
 * at run time or the caller's thread count, so results are bitwise reproducible and the
 * same for a sub-block computed on its own as inside a larger product. */
#ifndef HEARTH_KCPU_GEMM_H
#define HEARTH_KCPU_GEMM_H

#include <stddef.h>

#define KGEMM_KC 256 /* depth of one K block: fixes the summation order (see above) */

/* accumulate: 0 overwrites C (C = product), 1 adds to it.  Uses about 170 KiB of stack
 * for packing buffers.  Any of M, N may be 0; K == 0 gives C = 0 (or leaves C). */
void kgemm_serial(float *c, ptrdiff_t ldc, const float *a, ptrdiff_t rsa, ptrdiff_t csa,
                  const float *b, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K,
                  int accumulate);

/* The tile sizes one serial call is efficient on; parallel callers split C into tiles
 * of about this size (any split gives the same bits). */
#define KGEMM_TILE_M 96
#define KGEMM_TILE_N 128

/* For tests: force one instance (the bits must not depend on it).  An instance the CPU
 * lacks falls back to SSE2. */
enum { KGEMM_ISA_AUTO = 0, KGEMM_ISA_SSE2 = 1, KGEMM_ISA_AVX2 = 2 };
void kgemm_serial_isa(int isa, float *c, ptrdiff_t ldc, const float *a, ptrdiff_t rsa,
                      ptrdiff_t csa, const float *b, ptrdiff_t rsb, ptrdiff_t csb, int M,
                      int N, int K, int accumulate);
int kgemm_has_avx2(void);

/* A name for the instruction set the inner kernel uses ("avx2" or "sse2"), for reports. */
const char *kgemm_isa(void);

#endif
