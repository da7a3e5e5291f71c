/* bench_matmul.c - times kcpu_matmul_forward (blocked, packed, SIMD) against a naive
 * triple loop on tiny-vlm shapes, with one thread and with all threads.
 *
 * Usage: bench_matmul [runs]     (default 5 timed runs per case; the median is printed)
 * Before timing, each shape checks that the two agree (relative L2 error).  Exit status
 * is 1 when they disagree. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels.h"
#include "kernels/cpu/gemm.h"
#include "tests/unit/support/testutil.h"

/* out[m][n] = bias[n] + sum_k inp[m][k] * weight[n][k]: the textbook loop, rows split
 * over threads so that the all-threads row compares like with like. */
static void naive_matmul(float *out, const float *inp, const float *weight, const float *bias,
                         int M, int K, int N)
{
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float s = bias ? bias[n] : 0.0f;
            for (int k = 0; k < K; k++)
                s += inp[(size_t)m * K + k] * weight[(size_t)n * K + k];
            out[(size_t)m * N + n] = s;
        }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef void (*matmul_fn)(float *, const float *, const float *, const float *, int, int, int);

static double median_seconds(matmul_fn fn, float *out, const float *inp, const float *w,
                             const float *bias, int M, int K, int N, int runs)
{
    double t[64];
    fn(out, inp, w, bias, M, K, N); /* warm caches and threads */
    for (int r = 0; r < runs; r++) {
        double t0 = now_s();
        fn(out, inp, w, bias, M, K, N);
        t[r] = now_s() - t0;
    }
    qsort(t, (size_t)runs, sizeof t[0], cmp_double);
    return t[runs / 2];
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 5;
    if (runs < 1 || runs > 64) {
        fprintf(stderr, "usage: %s [runs 1..64]\n", argv[0]);
        return 2;
    }
    static const struct { int M, K, N; const char *what; } shapes[] = {
        {512, 256, 768, "qkv"},
        {512, 256, 1024, "LM head"},
        {1024, 512, 512, "mlp"},
        {509, 251, 767, "odd"},
    };
    int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    int maxthreads = omp_get_max_threads();
    int thread_counts[2] = {1, maxthreads};
    int nthread_counts = maxthreads > 1 ? 2 : 1;
    tu_rng rng = tu_rng_fresh();
    int bad = 0;

    printf("kernel ISA: %s, %d runs per case (median), up to %d threads\n", kgemm_isa(), runs,
           maxthreads);
    printf("%-22s %7s | %13s | %15s | %7s\n", "shape MxKxN", "threads", "naive GFLOP/s",
           "blocked GFLOP/s", "speedup");
    for (int s = 0; s < nshapes; s++) {
        int M = shapes[s].M, K = shapes[s].K, N = shapes[s].N;
        float *inp = tu_falloc((size_t)M * K), *w = tu_falloc((size_t)N * K);
        float *bias = tu_falloc((size_t)N);
        float *o1 = tu_falloc((size_t)M * N), *o2 = tu_falloc((size_t)M * N);
        tu_fill_uniform(&rng, inp, (size_t)M * K, -1, 1);
        tu_fill_uniform(&rng, w, (size_t)N * K, -1, 1);
        tu_fill_uniform(&rng, bias, (size_t)N, -1, 1);
        naive_matmul(o1, inp, w, bias, M, K, N);
        kcpu_matmul_forward(o2, inp, w, bias, M, K, N);
        double err = tu_rel_l2_ff(o2, o1, (size_t)M * N);
        if (!(err <= 1e-5)) {
            printf("%dx%dx%d: blocked and naive disagree, rel err %.3g (seed %llu)\n", M, K, N,
                   err, (unsigned long long)rng.seed);
            bad = 1;
        }
        double flop = 2.0 * M * K * N;
        for (int tc = 0; tc < nthread_counts; tc++) {
            omp_set_num_threads(thread_counts[tc]);
            double tn = median_seconds(naive_matmul, o1, inp, w, bias, M, K, N, runs);
            double tb = median_seconds(kcpu_matmul_forward, o2, inp, w, bias, M, K, N, runs);
            char name[64];
            snprintf(name, sizeof name, "%dx%dx%d %s", M, K, N, shapes[s].what);
            printf("%-22s %7d | %13.2f | %15.2f | %6.1fx\n", name, thread_counts[tc],
                   flop / tn * 1e-9, flop / tb * 1e-9, tn / tb);
        }
        omp_set_num_threads(maxthreads);
        free(inp);
        free(w);
        free(bias);
        free(o1);
        free(o2);
    }
    return bad;
}
