/* test_kernels_matmul.c - kcpu_matmul_* and the GEMM core behind them: forward against a
 * double-precision loop, backward against central differences of a double forward,
 * accumulation, NULL gradients, thread-count and instruction-set independence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdev.h"
#include "kernels.h"
#include "kernels/cpu/gemm.h"
#include "support/testutil.h"

/* out = inp . weight^T + bias in double */
static void ref_matmul(double *out, const float *inp, const float *weight, const float *bias,
                       int M, int K, int N)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0;
            for (int k = 0; k < K; k++)
                s += (double)inp[(size_t)m * K + k] * weight[(size_t)n * K + k];
            out[(size_t)m * N + n] = s;
        }
}

typedef struct {
    const float *inp, *weight, *bias, *w;
    int M, K, N;
    double *out;
} mm_ctx;

/* L = sum w * (inp . weight^T + bias), evaluated in double */
static double mm_loss(void *p)
{
    mm_ctx *c = p;
    ref_matmul(c->out, c->inp, c->weight, c->bias, c->M, c->K, c->N);
    return tu_dot_fd(c->w, c->out, (size_t)c->M * c->N);
}

static void check_forward(tu_rng *rng, int M, int K, int N, int with_bias)
{
    float *inp = tu_falloc((size_t)M * K), *w = tu_falloc((size_t)N * K);
    float *b = with_bias ? tu_falloc((size_t)N) : NULL;
    float *out = tu_falloc((size_t)M * N);
    double *ref = tu_dalloc((size_t)M * N);
    tu_fill_uniform(rng, inp, (size_t)M * K, -1, 1);
    tu_fill_uniform(rng, w, (size_t)N * K, -1, 1);
    if (b)
        tu_fill_uniform(rng, b, (size_t)N, -1, 1);
    tu_fill_uniform(rng, out, (size_t)M * N, -9, 9); /* forward must overwrite */
    kcpu_matmul_forward(out, inp, w, b, M, K, N);
    ref_matmul(ref, inp, w, b, M, K, N);
    char what[96];
    snprintf(what, sizeof what, "matmul forward %dx%dx%d bias=%d", M, K, N, with_bias);
    TU_ASSERT_LE(tu_rel_l2(out, ref, (size_t)M * N), 1e-5, rng, what);
    free(inp), free(w), free(b), free(out), free(ref);
}

static void test_forward(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    /* odd sizes around and across the tiles (MR 4/6, NR 8/16, MC 72, NC 96, KC 256) */
    check_forward(&rng, 1, 1, 1, 1);
    check_forward(&rng, 7, 13, 5, 0);
    check_forward(&rng, 37, 29, 41, 1);
    check_forward(&rng, 101, 263, 131, 1); /* K spans two K blocks */
    check_forward(&rng, 3, 517, 200, 0);   /* three K blocks, thin M */
    check_forward(&rng, 1 + tu_randint(&rng, 0, 150), 1 + tu_randint(&rng, 0, 300),
                  1 + tu_randint(&rng, 0, 150), tu_randint(&rng, 0, 2));
}

static void test_zero_k(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    float bias[5], out[15], dummy[1] = {0};
    tu_fill_uniform(&rng, bias, 5, -1, 1);
    tu_fill_uniform(&rng, out, 15, -1, 1);
    kcpu_matmul_forward(out, dummy, dummy, bias, 3, 0, 5);
    for (int i = 0; i < 15; i++)
        assert_true(out[i] == bias[i % 5]);
}

static void test_backward_fd(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    for (int rep = 0; rep < 2; rep++) {
        int M = rep ? 1 + tu_randint(&rng, 0, 40) : 23;
        int K = rep ? 1 + tu_randint(&rng, 0, 300) : 270;
        int N = rep ? 1 + tu_randint(&rng, 0, 40) : 19;
        float *inp = tu_falloc((size_t)M * K), *wt = tu_falloc((size_t)N * K);
        float *b = tu_falloc((size_t)N), *w = tu_falloc((size_t)M * N);
        float *dinp = tu_falloc((size_t)M * K), *dw = tu_falloc((size_t)N * K);
        float *db = tu_falloc((size_t)N);
        tu_fill_uniform(&rng, inp, (size_t)M * K, -1, 1);
        tu_fill_uniform(&rng, wt, (size_t)N * K, -1, 1);
        tu_fill_uniform(&rng, b, (size_t)N, -1, 1);
        tu_fill_uniform(&rng, w, (size_t)M * N, -1, 1);
        kcpu_matmul_backward(dinp, dw, db, w, inp, wt, M, K, N);

        mm_ctx c = {inp, wt, b, w, M, K, N, tu_dalloc((size_t)M * N)};
        tu_fd_opts o = {.tol = 1e-4, .max_samples = 150};
        TU_ASSERT_FD(inp, (size_t)M * K, dinp, mm_loss, &c, &o, &rng, "matmul dinp");
        TU_ASSERT_FD(wt, (size_t)N * K, dw, mm_loss, &c, &o, &rng, "matmul dweight");
        TU_ASSERT_FD(b, (size_t)N, db, mm_loss, &c, &o, &rng, "matmul dbias");
        free(inp), free(wt), free(b), free(w), free(dinp), free(dw), free(db), free(c.out);
    }
}

/* Backward twice from zero = 2x backward once (to rounding); NULL pointers skip that
 * gradient and leave the others unchanged. */
static void test_accumulate_and_null(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int M = 45, K = 300, N = 33;
    size_t nx = (size_t)M * K, nw = (size_t)N * K;
    float *inp = tu_falloc(nx), *wt = tu_falloc(nw), *dout = tu_falloc((size_t)M * N);
    tu_fill_uniform(&rng, inp, nx, -1, 1);
    tu_fill_uniform(&rng, wt, nw, -1, 1);
    tu_fill_uniform(&rng, dout, (size_t)M * N, -1, 1);
    float *d1[3] = {tu_falloc(nx), tu_falloc(nw), tu_falloc(N)};
    float *d2[3] = {tu_falloc(nx), tu_falloc(nw), tu_falloc(N)};
    size_t len[3] = {nx, nw, (size_t)N};
    kcpu_matmul_backward(d1[0], d1[1], d1[2], dout, inp, wt, M, K, N);
    kcpu_matmul_backward(d2[0], d2[1], d2[2], dout, inp, wt, M, K, N);
    kcpu_matmul_backward(d2[0], d2[1], d2[2], dout, inp, wt, M, K, N);
    for (int t = 0; t < 3; t++) {
        for (size_t i = 0; i < len[t]; i++)
            d1[t][i] *= 2;
        TU_ASSERT_LE(tu_rel_l2_ff(d2[t], d1[t], len[t]), 1e-6, &rng, "matmul accumulate");
    }
    /* each gradient alone equals the corresponding one computed together */
    for (int t = 0; t < 3; t++) {
        float *g = tu_falloc(len[t]);
        kcpu_matmul_backward(t == 0 ? g : NULL, t == 1 ? g : NULL, t == 2 ? g : NULL, dout,
                             inp, wt, M, K, N);
        for (size_t i = 0; i < len[t]; i++)
            d1[t][i] *= 0.5f; /* back to the single backward (exact: power of two) */
        TU_ASSERT_BITWISE(g, d1[t], len[t], &rng, "matmul backward with NULLs");
        free(g);
    }
    kcpu_matmul_backward(NULL, NULL, NULL, dout, inp, wt, M, K, N);
    for (int t = 0; t < 3; t++)
        free(d1[t]), free(d2[t]);
    free(inp), free(wt), free(dout);
}

static void test_threads_bitwise(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int M = 203, K = 301, N = 157;
    size_t nx = (size_t)M * K, nw = (size_t)N * K, no = (size_t)M * N;
    float *inp = tu_falloc(nx), *wt = tu_falloc(nw), *b = tu_falloc(N), *dout = tu_falloc(no);
    tu_fill_uniform(&rng, inp, nx, -1, 1);
    tu_fill_uniform(&rng, wt, nw, -1, 1);
    tu_fill_uniform(&rng, b, N, -1, 1);
    tu_fill_uniform(&rng, dout, no, -1, 1);
    float *r[2][4];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        r[t][0] = tu_falloc(no), r[t][1] = tu_falloc(nx), r[t][2] = tu_falloc(nw);
        r[t][3] = tu_falloc(N);
        kcpu_matmul_forward(r[t][0], inp, wt, b, M, K, N);
        kcpu_matmul_backward(r[t][1], r[t][2], r[t][3], dout, inp, wt, M, K, N);
    }
    omp_set_num_threads(2);
    TU_ASSERT_BITWISE(r[0][0], r[1][0], no, &rng, "matmul forward 1 vs 2 threads");
    TU_ASSERT_BITWISE(r[0][1], r[1][1], nx, &rng, "matmul dinp 1 vs 2 threads");
    TU_ASSERT_BITWISE(r[0][2], r[1][2], nw, &rng, "matmul dweight 1 vs 2 threads");
    TU_ASSERT_BITWISE(r[0][3], r[1][3], N, &rng, "matmul dbias 1 vs 2 threads");
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 4; i++)
            free(r[t][i]);
    free(inp), free(wt), free(b), free(dout);
}

/* The GEMM core with every stride pattern, both instruction sets (same bits), and a
 * sub-block computed alone equal to the same block inside a larger product. */
static void test_gemm_core(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int M = 1 + tu_randint(&rng, 0, 120), N = 1 + tu_randint(&rng, 0, 120);
    int K = 1 + tu_randint(&rng, 0, 600);
    float *a = tu_falloc((size_t)M * K), *b = tu_falloc((size_t)K * N);
    tu_fill_uniform(&rng, a, (size_t)M * K, -1, 1);
    tu_fill_uniform(&rng, b, (size_t)K * N, -1, 1);
    float *c0 = tu_falloc((size_t)M * N);
    double *ref = tu_dalloc((size_t)M * N);
    for (int trans = 0; trans < 4; trans++) {
        int ta = trans & 1, tb = trans >> 1;
        /* A stored [M,K] or [K,M]; B stored [K,N] or [N,K] */
        ptrdiff_t rsa = ta ? 1 : K, csa = ta ? M : 1, rsb = tb ? 1 : N, csb = tb ? K : 1;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int k = 0; k < K; k++)
                    s += (double)a[i * rsa + k * csa] * b[k * rsb + j * csb];
                ref[(size_t)i * N + j] = s;
            }
        float *c[2] = {tu_falloc((size_t)M * N), tu_falloc((size_t)M * N)};
        for (int isa = 0; isa < 2; isa++)
            kgemm_serial_isa(isa ? KGEMM_ISA_AVX2 : KGEMM_ISA_SSE2, c[isa], N, a, rsa, csa, b,
                             rsb, csb, M, N, K, 0);
        TU_ASSERT_LE(tu_rel_l2(c[0], ref, (size_t)M * N), 1e-5, &rng, "gemm vs double");
        TU_ASSERT_BITWISE(c[0], c[1], (size_t)M * N, &rng, "gemm sse2 vs avx2");
        /* a sub-block on its own */
        int i0 = tu_randint(&rng, 0, M), j0 = tu_randint(&rng, 0, N);
        int mi = M - i0, nj = N - j0;
        float *sub = tu_falloc((size_t)mi * nj);
        kgemm_serial(sub, nj, a + i0 * rsa, rsa, csa, b + j0 * csb, rsb, csb, mi, nj, K, 0);
        for (int i = 0; i < mi; i++)
            TU_ASSERT_BITWISE(sub + (size_t)i * nj, c[0] + (size_t)(i0 + i) * N + j0,
                              (size_t)nj, &rng, "gemm sub-block");
        free(sub), free(c[0]), free(c[1]);
    }
    free(a), free(b), free(c0), free(ref);
}

/* kdev_matmul_forward_residual on the cpu: bitwise the product into a scratch followed
 * by kdev_add (what the model ran before it), with and without a bias. */
static void test_forward_residual(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int M = 1 + tu_randint(&rng, 0, 40), K = 1 + tu_randint(&rng, 0, 70), N = 33;
    float *inp = tu_falloc((size_t)M * K), *w = tu_falloc((size_t)N * K), *b = tu_falloc(N);
    float *res = tu_falloc((size_t)M * N), *tmp = tu_falloc((size_t)M * N);
    float *want = tu_falloc((size_t)M * N), *got = tu_falloc((size_t)M * N);
    tu_fill_normal(&rng, inp, (size_t)M * K, 0, 1);
    tu_fill_normal(&rng, w, (size_t)N * K, 0, 1);
    tu_fill_normal(&rng, b, N, 0, 1);
    tu_fill_normal(&rng, res, (size_t)M * N, 0, 1);
    kdev *d = NULL;
    char err[256];
    assert_int_equal(kdev_create(&d, KDEV_CPU, err, sizeof err), 0);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const float *bias = with_bias ? b : NULL;
        assert_int_equal(kdev_matmul_forward(d, tmp, inp, w, bias, M, K, N), 0);
        assert_int_equal(kdev_add(d, want, res, tmp, (size_t)M * N), 0);
        assert_int_equal(kdev_matmul_forward_residual(d, got, res, inp, w, bias, M, K, N), 0);
        TU_ASSERT_BITWISE(want, got, (size_t)M * N, &rng, "residual forward");
    }
    kdev_free(d);
    free(inp), free(w), free(b), free(res), free(tmp), free(want), free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_zero_k),
        cmocka_unit_test(test_backward_fd),
        cmocka_unit_test(test_accumulate_and_null),
        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_gemm_core),
        cmocka_unit_test(test_forward_residual),
    };
    return cmocka_run_group_tests_name("kernels_matmul", tests, NULL, NULL);
}
