/* gemm_tmpl.h - one instance of the blocked GEMM, included by gemm.c once per
 * instruction set with these macros defined:
 *   GT_NAME(x)  name of x in this instance     GT_ATTR  function attributes (target)
 *   GT_VEC      vector type of GT_VL floats     GT_MR, GT_NR  register tile (GT_NR % GT_VL == 0)
 * Every instance computes the same bits (see gemm.h); they differ only in speed. */

#define GT_NV (GT_NR / GT_VL)

/* Panels are packed MR (resp. NR) wide, k-major, zero padded at the edges, so the inner
 * kernel reads both operands contiguously and never branches on the tile size. */
static GT_ATTR void GT_NAME(pack_a)(float *restrict dst, const float *a, ptrdiff_t rsa,
                                    ptrdiff_t csa, int mc, int kc)
{
    for (int ir = 0; ir < mc; ir += GT_MR) {
        int mr = mc - ir < GT_MR ? mc - ir : GT_MR;
        float *d = dst + (size_t)ir * kc;
        const float *src = a + ir * rsa;
        if (csa == 1) {
            for (int i = 0; i < mr; i++)
                for (int p = 0; p < kc; p++)
                    d[p * GT_MR + i] = src[i * rsa + p];
        } else {
            for (int p = 0; p < kc; p++)
                for (int i = 0; i < mr; i++)
                    d[p * GT_MR + i] = src[i * rsa + p * csa];
        }
        for (int i = mr; i < GT_MR; i++)
            for (int p = 0; p < kc; p++)
                d[p * GT_MR + i] = 0.0f;
    }
}

static GT_ATTR void GT_NAME(pack_b)(float *restrict dst, const float *b, ptrdiff_t rsb,
                                    ptrdiff_t csb, int kc, int nc)
{
    for (int jr = 0; jr < nc; jr += GT_NR) {
        int nr = nc - jr < GT_NR ? nc - jr : GT_NR;
        float *d = dst + (size_t)jr * kc;
        const float *src = b + jr * csb;
        if (rsb == 1) {
            for (int j = 0; j < nr; j++)
                for (int p = 0; p < kc; p++)
                    d[p * GT_NR + j] = src[j * csb + p];
        } else {
            for (int p = 0; p < kc; p++)
                for (int j = 0; j < nr; j++)
                    d[p * GT_NR + j] = src[p * rsb + j * csb];
        }
        for (int j = nr; j < GT_NR; j++)
            for (int p = 0; p < kc; p++)
                d[p * GT_NR + j] = 0.0f;
    }
}

/* acc[i][j] = sum_p a[p][i] * b[p][j] over one K block, then C = acc or C += acc. */
static inline GT_ATTR void GT_NAME(micro)(int kc, const float *restrict ap,
                                          const float *restrict bp, float *restrict c,
                                          ptrdiff_t ldc, int mr, int nr, int add)
{
    GT_VEC acc[GT_MR][GT_NV];
#pragma GCC unroll 16
    for (int i = 0; i < GT_MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < GT_NV; v++)
            acc[i][v] = (GT_VEC){0};

    for (int p = 0; p < kc; p++) {
        GT_VEC bv[GT_NV];
#pragma GCC unroll 4
        for (int v = 0; v < GT_NV; v++)
            bv[v] = *(const GT_VEC *)(bp + p * GT_NR + v * GT_VL);
#pragma GCC unroll 16
        for (int i = 0; i < GT_MR; i++) {
            float av = ap[p * GT_MR + i];
#pragma GCC unroll 4
            for (int v = 0; v < GT_NV; v++)
                acc[i][v] += bv[v] * av;
        }
    }

    if (mr == GT_MR && nr == GT_NR) {
#pragma GCC unroll 16
        for (int i = 0; i < GT_MR; i++)
#pragma GCC unroll 4
            for (int v = 0; v < GT_NV; v++) {
                float *dst = c + i * ldc + v * GT_VL;
                GT_VEC cv;
                if (add) {
                    memcpy(&cv, dst, sizeof cv);
                    cv += acc[i][v];
                } else {
                    cv = acc[i][v];
                }
                memcpy(dst, &cv, sizeof cv);
            }
    } else {
        float tmp[GT_MR * GT_NR] __attribute__((aligned(64)));
        for (int i = 0; i < GT_MR; i++)
            for (int v = 0; v < GT_NV; v++)
                memcpy(tmp + i * GT_NR + v * GT_VL, &acc[i][v], sizeof acc[i][v]);
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) {
                if (add)
                    c[i * ldc + j] += tmp[i * GT_NR + j];
                else
                    c[i * ldc + j] = tmp[i * GT_NR + j];
            }
    }
}

static GT_ATTR void GT_NAME(gemm)(float *c, ptrdiff_t ldc, const float *a, ptrdiff_t rsa,
                                  ptrdiff_t csa, const float *b, ptrdiff_t rsb,
                                  ptrdiff_t csb, int M, int N, int K, int accumulate)
{
    float apack[KGEMM_MC * KGEMM_KC] __attribute__((aligned(64)));
    float bpack[KGEMM_KC * KGEMM_NC] __attribute__((aligned(64)));

    for (int jc = 0; jc < N; jc += KGEMM_NC) {
        int nc = N - jc < KGEMM_NC ? N - jc : KGEMM_NC;
        for (int pc = 0; pc < K; pc += KGEMM_KC) {
            int kc = K - pc < KGEMM_KC ? K - pc : KGEMM_KC;
            int add = accumulate || pc > 0;
            GT_NAME(pack_b)(bpack, b + pc * rsb + jc * csb, rsb, csb, kc, nc);
            for (int ic = 0; ic < M; ic += KGEMM_MC) {
                int mc = M - ic < KGEMM_MC ? M - ic : KGEMM_MC;
                GT_NAME(pack_a)(apack, a + ic * rsa + pc * csa, rsa, csa, mc, kc);
                for (int jr = 0; jr < nc; jr += GT_NR) {
                    int nr = nc - jr < GT_NR ? nc - jr : GT_NR;
                    for (int ir = 0; ir < mc; ir += GT_MR) {
                        int mr = mc - ir < GT_MR ? mc - ir : GT_MR;
                        GT_NAME(micro)(kc, apack + (size_t)ir * kc, bpack + (size_t)jr * kc,
                                       c + (ic + ir) * ldc + jc + jr, ldc, mr, nr, add);
                    }
                }
            }
        }
    }
}

#undef GT_NV
