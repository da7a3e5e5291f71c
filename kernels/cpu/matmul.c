/* matmul.c - the linear layer: out = inp . weight^T + bias and its backward.
 *
 * All three products go through kgemm_serial on tiles of the output; OpenMP hands out
 * whole output tiles, so every element is summed by one thread in the fixed order that
 * gemm.h describes and the result does not depend on the thread count. */
#include "kernels.h"

#include "cpu/gemm.h"

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

void kcpu_matmul_forward(float *out, const float *inp, const float *weight,
                         const float *bias, int M, int K, int N)
{
    if (M <= 0 || N <= 0)
        return;
    int tm = ceil_div(M, KGEMM_TILE_M), tn = ceil_div(N, KGEMM_TILE_N);
    int jobs = tm * tn;
#pragma omp parallel for schedule(dynamic, 1) if (jobs > 1)
    for (int job = 0; job < jobs; job++) {
        int i0 = (job / tn) * KGEMM_TILE_M, j0 = (job % tn) * KGEMM_TILE_N;
        int mt = M - i0 < KGEMM_TILE_M ? M - i0 : KGEMM_TILE_M;
        int nt = N - j0 < KGEMM_TILE_N ? N - j0 : KGEMM_TILE_N;
        float *c = out + (ptrdiff_t)i0 * N + j0;
        /* A = inp rows, B(k, j) = weight[j][k] */
        kgemm_serial(c, N, inp + (ptrdiff_t)i0 * K, K, 1, weight + (ptrdiff_t)j0 * K, 1, K,
                     mt, nt, K, 0);
        if (bias)
            for (int i = 0; i < mt; i++)
                for (int j = 0; j < nt; j++)
                    c[(ptrdiff_t)i * N + j] += bias[j0 + j];
    }
}

/* Column sums of dout for columns [j0, j0+nt), accumulated in double in row order. */
#define DBIAS_COLS 64
static void dbias_block(float *dbias, const float *dout, int M, int N, int j0)
{
    double acc[DBIAS_COLS] = {0};
    int nt = N - j0 < DBIAS_COLS ? N - j0 : DBIAS_COLS;
    for (int i = 0; i < M; i++) {
        const float *row = dout + (ptrdiff_t)i * N + j0;
        for (int j = 0; j < nt; j++)
            acc[j] += row[j];
    }
    for (int j = 0; j < nt; j++)
        dbias[j0 + j] += (float)acc[j];
}

void kcpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int M, int K, int N)
{
    if (M <= 0 || N <= 0)
        return;
    /* Job list: dinp tiles [M x K], then dweight tiles [N x K], then dbias column blocks.
     * The three outputs are disjoint, so they can share one parallel loop. */
    int kt = ceil_div(K, KGEMM_TILE_N);
    int jobs_dinp = dinp ? ceil_div(M, KGEMM_TILE_M) * kt : 0;
    int jobs_dw = dweight ? ceil_div(N, KGEMM_TILE_M) * kt : 0;
    int jobs_db = dbias ? ceil_div(N, DBIAS_COLS) : 0;
    int jobs = jobs_dinp + jobs_dw + jobs_db;
#pragma omp parallel for schedule(dynamic, 1) if (jobs > 1)
    for (int job = 0; job < jobs; job++) {
        if (job < jobs_dinp) {
            int i0 = (job / kt) * KGEMM_TILE_M, j0 = (job % kt) * KGEMM_TILE_N;
            int mt = M - i0 < KGEMM_TILE_M ? M - i0 : KGEMM_TILE_M;
            int nt = K - j0 < KGEMM_TILE_N ? K - j0 : KGEMM_TILE_N;
            /* dinp[i][j] += sum_n dout[i][n] * weight[n][j] */
            kgemm_serial(dinp + (ptrdiff_t)i0 * K + j0, K, dout + (ptrdiff_t)i0 * N, N, 1,
                         weight + j0, K, 1, mt, nt, N, 1);
        } else if (job < jobs_dinp + jobs_dw) {
            int t = job - jobs_dinp;
            int i0 = (t / kt) * KGEMM_TILE_M, j0 = (t % kt) * KGEMM_TILE_N;
            int mt = N - i0 < KGEMM_TILE_M ? N - i0 : KGEMM_TILE_M;
            int nt = K - j0 < KGEMM_TILE_N ? K - j0 : KGEMM_TILE_N;
            /* dweight[n][j] += sum_m dout[m][n] * inp[m][j] */
            kgemm_serial(dweight + (ptrdiff_t)i0 * K + j0, K, dout + i0, 1, N, inp + j0, K, 1,
                         mt, nt, M, 1);
        } else {
            int t = job - jobs_dinp - jobs_dw;
            dbias_block(dbias, dout, M, N, t * DBIAS_COLS);
        }
    }
}
