/* test_kernels_rope.c - RoPE tables against the formulas written out directly (1-D,
 * Qwen2-VL mRoPE sections, Qwen2.5-VL vision 2-D), the rotation against a double loop,
 * the backward against central differences and as the inverse rotation. */
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

#include "kernels.h"
#include "support/testutil.h"

/* max |table - cos/sin(angle)| with angle(n, j) given by the caller's formula */
typedef double (*angle_fn)(int n, int j, const void *ctx);

static double table_err(const float *cs, const float *sn, int N, int half, angle_fn f,
                        const void *ctx)
{
    double e = 0;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < half; j++) {
            double a = f(n, j, ctx);
            e = fmax(e, fabs(cs[(size_t)n * half + j] - cos(a)));
            e = fmax(e, fabs(sn[(size_t)n * half + j] - sin(a)));
        }
    return e;
}

typedef struct {
    const int *pos;
    int N, D, sec[3];
    double theta;
} tab_ctx;

/* 1-D: pos[n] / theta^(2j/D) */
static double angle_1d(int n, int j, const void *p)
{
    const tab_ctx *c = p;
    return c->pos[n] / pow(c->theta, (2.0 * j) / c->D);
}

/* mRoPE: frequency j reads temporal for j < s0, height for j < s0+s1, width after */
static double angle_mrope(int n, int j, const void *p)
{
    const tab_ctx *c = p;
    int row;
    if (j < c->sec[0])
        row = 0;
    else if (j < c->sec[0] + c->sec[1])
        row = 1;
    else
        row = 2;
    return c->pos[row * c->N + n] / pow(c->theta, (2.0 * j) / c->D);
}

/* Qwen2.5-VL vision: rotary dim D/2 with freqs 1/theta^(2i/(D/2)), i < D/4; the
 * angles of a patch are [h * freqs, w * freqs] */
static double angle_2d(int n, int j, const void *p)
{
    const tab_ctx *c = p;
    int q = c->D / 4;
    int axis = j < q ? 0 : 1, i = j % q;
    double freq = 1.0 / pow(c->theta, (2.0 * i) / (c->D / 2));
    return c->pos[n * 2 + axis] * freq;
}

static void test_tables(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 1 + tu_randint(&rng, 0, 40);
    int Ds[3] = {4, 64, 4 * (1 + tu_randint(&rng, 0, 40))};
    for (int d = 0; d < 3; d++) {
        int D = Ds[d], half = D / 2;
        float theta = d == 1 ? 10000.0f : (float)(100 + tu_uniform(&rng) * 1e6);
        int *pos = tu_ialloc((size_t)3 * N);
        for (int i = 0; i < 3 * N; i++)
            pos[i] = tu_randint(&rng, 0, 5000);
        float *cs = tu_falloc((size_t)N * half), *sn = tu_falloc((size_t)N * half);
        tab_ctx c = {pos, N, D, {0, 0, 0}, theta};

        kcpu_rope_table_1d(cs, sn, pos, N, D, theta);
        TU_ASSERT_LE(table_err(cs, sn, N, half, angle_1d, &c), 2e-7, &rng, "rope table 1d");

        c.sec[0] = tu_randint(&rng, 0, half + 1);
        c.sec[1] = tu_randint(&rng, 0, half - c.sec[0] + 1);
        c.sec[2] = half - c.sec[0] - c.sec[1];
        kcpu_rope_table_mrope(cs, sn, pos, c.sec, N, D, theta);
        TU_ASSERT_LE(table_err(cs, sn, N, half, angle_mrope, &c), 2e-7, &rng,
                     "rope table mrope");

        kcpu_rope_table_2d(cs, sn, pos, N, D, theta); /* pos read as [N, 2] */
        TU_ASSERT_LE(table_err(cs, sn, N, half, angle_2d, &c), 2e-7, &rng, "rope table 2d");
        free(pos), free(cs), free(sn);
    }
    /* Qwen2-VL's own sections for head_dim 128: [16, 24, 24] */
    int pos3[3] = {3, 5, 7}, sec[3] = {16, 24, 24};
    float cs[64], sn[64];
    kcpu_rope_table_mrope(cs, sn, pos3, sec, 1, 128, 1e6f);
    assert_true(fabs(cs[15] - cos(3 / pow(1e6, 30.0 / 128))) < 1e-7);
    assert_true(fabs(cs[16] - cos(5 / pow(1e6, 32.0 / 128))) < 1e-7);
    assert_true(fabs(cs[39] - cos(5 / pow(1e6, 78.0 / 128))) < 1e-7);
    assert_true(fabs(cs[40] - cos(7 / pow(1e6, 80.0 / 128))) < 1e-7);
}

typedef struct {
    const float *x, *cs, *sn, *w;
    int N, H, D;
    double *out;
} rope_ctx;

static void ref_rope(rope_ctx *c)
{
    int half = c->D / 2;
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->H; h++) {
            const float *x = c->x + ((size_t)n * c->H + h) * c->D;
            double *y = c->out + ((size_t)n * c->H + h) * c->D;
            for (int i = 0; i < half; i++) {
                double co = c->cs[(size_t)n * half + i], si = c->sn[(size_t)n * half + i];
                y[i] = x[i] * co - x[i + half] * si;
                y[i + half] = x[i + half] * co + x[i] * si;
            }
        }
}

static double rope_loss(void *p)
{
    rope_ctx *c = p;
    ref_rope(c);
    return tu_dot_fd(c->w, c->out, (size_t)c->N * c->H * c->D);
}

static void test_rotate(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 1 + tu_randint(&rng, 0, 50), H = 1 + tu_randint(&rng, 0, 5);
    int D = 2 * (1 + tu_randint(&rng, 0, 40));
    int half = D / 2;
    size_t n = (size_t)N * H * D;
    int *pos = tu_ialloc(N);
    for (int i = 0; i < N; i++)
        pos[i] = tu_randint(&rng, 0, 4000);
    float *cs = tu_falloc((size_t)N * half), *sn = tu_falloc((size_t)N * half);
    kcpu_rope_table_1d(cs, sn, pos, N, D, 10000.0f);
    float *x = tu_falloc(n), *w = tu_falloc(n);
    tu_fill_uniform(&rng, x, n, -1, 1);
    tu_fill_uniform(&rng, w, n, -1, 1);
    rope_ctx c = {x, cs, sn, w, N, H, D, tu_dalloc(n)};
    ref_rope(&c);
    float *y = tu_fdup(x, n);
    kcpu_rope_forward(y, cs, sn, N, H, D);
    TU_ASSERT_LE(tu_rel_l2(y, c.out, n), 1e-6, &rng, "rope forward");

    /* backward = gradient of sum(w * rope(x)) with respect to x */
    float *g = tu_fdup(w, n);
    kcpu_rope_backward(g, cs, sn, N, H, D);
    tu_fd_opts o = {.tol = 1e-5, .max_samples = 300};
    TU_ASSERT_FD(x, n, g, rope_loss, &c, &o, &rng, "rope backward");

    /* and it is the inverse rotation: backward(forward(x)) = x */
    kcpu_rope_backward(y, cs, sn, N, H, D);
    TU_ASSERT_LE(tu_rel_l2_ff(y, x, n), 1e-6, &rng, "rope backward(forward(x))");
    free(pos), free(cs), free(sn), free(x), free(w), free(c.out), free(y), free(g);
}

static void test_threads(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 200, H = 3, D = 64;
    size_t n = (size_t)N * H * D;
    float *cs = tu_falloc((size_t)N * D / 2), *sn = tu_falloc((size_t)N * D / 2);
    tu_fill_uniform(&rng, cs, (size_t)N * D / 2, -1, 1);
    tu_fill_uniform(&rng, sn, (size_t)N * D / 2, -1, 1);
    float *x = tu_falloc(n);
    tu_fill_uniform(&rng, x, n, -1, 1);
    float *r[2] = {tu_fdup(x, n), tu_fdup(x, n)};
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        kcpu_rope_forward(r[t], cs, sn, N, H, D);
        kcpu_rope_backward(r[t], cs, sn, N, H, D);
        kcpu_rope_forward(r[t], cs, sn, N, H, D);
    }
    omp_set_num_threads(2);
    TU_ASSERT_BITWISE(r[0], r[1], n, &rng, "rope 1 vs 2 threads");
    free(cs), free(sn), free(x), free(r[0]), free(r[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_rotate),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name("kernels_rope", tests, NULL, NULL);
}
