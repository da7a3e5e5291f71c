/* gemm.c - blocked single-threaded GEMM (see gemm.h), instantiated for SSE2 (the x86-64
 * baseline every build can run) and AVX2 (picked at run time when the CPU has it).
 * Neither instance uses FMA, so both produce the same bits. */
#include "cpu/gemm.h"

#include <string.h>

/* Cache blocking: an MC x KC block of A and a KC x NC block of B are packed; a KC x NR
 * panel of B stays in L1 while the MC x KC block of A streams from L2.  MC and NC are
 * multiples of every instance's MR and NR.  About 168 KiB of stack in total. */
#define KGEMM_MC 72
#define KGEMM_NC 96

/* Vector loads are only made from the packed panels, which are 64-byte aligned (C, which
 * has no alignment guarantee, goes through memcpy); may_alias because they read floats. */
typedef float kv4 __attribute__((vector_size(16), aligned(16), may_alias));
typedef float kv8 __attribute__((vector_size(32), aligned(32), may_alias));

#define GT_NAME(x) x##_sse2
#define GT_ATTR
#define GT_VEC kv4
#define GT_VL 4
#define GT_MR 4
#define GT_NR 8
#include "cpu/gemm_tmpl.h"
#undef GT_NAME
#undef GT_ATTR
#undef GT_VEC
#undef GT_VL
#undef GT_MR
#undef GT_NR

#if defined(__x86_64__) && defined(__GNUC__)
#define KGEMM_HAVE_AVX2 1
#define GT_NAME(x) x##_avx2
#define GT_ATTR __attribute__((target("avx2")))
#define GT_VEC kv8
#define GT_VL 8
#define GT_MR 6
#define GT_NR 16
#include "cpu/gemm_tmpl.h"
#undef GT_NAME
#undef GT_ATTR
#undef GT_VEC
#undef GT_VL
#undef GT_MR
#undef GT_NR
#endif

static int use_avx2(void)
{
#ifdef KGEMM_HAVE_AVX2
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

const char *kgemm_isa(void) { return use_avx2() ? "avx2" : "sse2"; }

void kgemm_serial_isa(int isa, float *c, ptrdiff_t ldc, const float *a, ptrdiff_t rsa,
                      ptrdiff_t csa, const float *b, ptrdiff_t rsb, ptrdiff_t csb, int M,
                      int N, int K, int accumulate)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        if (!accumulate)
            for (int i = 0; i < M; i++)
                memset(c + i * ldc, 0, (size_t)N * sizeof *c);
        return;
    }
#ifdef KGEMM_HAVE_AVX2
    if (isa != KGEMM_ISA_SSE2 && use_avx2()) {
        gemm_avx2(c, ldc, a, rsa, csa, b, rsb, csb, M, N, K, accumulate);
        return;
    }
#endif
    gemm_sse2(c, ldc, a, rsa, csa, b, rsb, csb, M, N, K, accumulate);
}

void kgemm_serial(float *c, ptrdiff_t ldc, const float *a, ptrdiff_t rsa, ptrdiff_t csa,
                  const float *b, ptrdiff_t rsb, ptrdiff_t csb, int M, int N, int K,
                  int accumulate)
{
    kgemm_serial_isa(KGEMM_ISA_AUTO, c, ldc, a, rsa, csa, b, rsb, csb, M, N, K, accumulate);
}

int kgemm_has_avx2(void) { return use_avx2(); }
