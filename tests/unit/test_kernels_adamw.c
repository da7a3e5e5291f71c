/* test_kernels_adamw.c - AdamW update against the formula in double over several steps,
 * decoupled weight decay, sum of squares (blocked order, thread independence), clipping. */
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

static void test_adamw_steps(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    size_t n = 1 + (size_t)tu_randint(&rng, 0, 3000);
    float *p = tu_falloc(n), *g = tu_falloc(n), *m = tu_falloc(n), *v = tu_falloc(n);
    double *rp = tu_dalloc(n), *rm = tu_dalloc(n), *rv = tu_dalloc(n);
    tu_fill_normal(&rng, p, n, 0, 0.1f);
    for (size_t i = 0; i < n; i++)
        rp[i] = p[i];
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (int step = 1; step <= 4; step++) {
        tu_fill_normal(&rng, g, n, 0, 1e-2f);
        kcpu_adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, step);
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        for (size_t i = 0; i < n; i++) {
            rm[i] = b1 * rm[i] + (1 - (double)b1) * g[i];
            rv[i] = b2 * rv[i] + (1 - (double)b2) * g[i] * g[i];
            rp[i] -= lr * ((rm[i] / bc1) / (sqrt(rv[i] / bc2) + eps) + wd * rp[i]);
        }
        TU_ASSERT_LE(tu_rel_l2(m, rm, n), 1e-6, &rng, "adamw m");
        TU_ASSERT_LE(tu_rel_l2(v, rv, n), 1e-6, &rng, "adamw v");
        TU_ASSERT_LE(tu_rel_l2(p, rp, n), 1e-6, &rng, "adamw param");
    }
    /* step 1 with bias correction moves every parameter by about lr (|mhat/sqrt(vhat)| = 1) */
    float p1[3] = {0.5f, -0.5f, 0.0f}, g1[3] = {2.0f, -1e-3f, 7.0f}, m1[3] = {0}, v1[3] = {0};
    kcpu_adamw_update(p1, g1, m1, v1, 3, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    assert_true(fabsf(p1[0] - 0.49f) < 1e-6f);
    assert_true(fabsf(p1[1] + 0.49f) < 1e-5f);
    assert_true(fabsf(p1[2] + 0.01f) < 1e-6f);
    free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv);
}

/* With zero gradients and moments only the decoupled decay acts: p *= 1 - lr*wd. */
static void test_weight_decay(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    float p[17], g[17] = {0}, m[17] = {0}, v[17] = {0};
    tu_fill_uniform(&rng, p, 17, -2, 2);
    float p0[17];
    memcpy(p0, p, sizeof p);
    kcpu_adamw_update(p, g, m, v, 17, 0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 3);
    for (int i = 0; i < 17; i++)
        assert_true(fabs(p[i] - p0[i] * (1 - 0.1 * 0.5)) < 1e-6);
}

static void test_sumsq(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    /* sizes: empty, one, off-block, and more than one parallel round (256 x 8192) */
    size_t sizes[4] = {0, 1, 8192 * 3 + 17 + (size_t)tu_randint(&rng, 0, 8192),
                       256 * 8192 + 12345};
    for (int s = 0; s < 4; s++) {
        size_t n = sizes[s];
        float *x = tu_falloc(n);
        tu_fill_normal(&rng, x, n, 0, 1);
        double ref = 0;
        for (size_t i = 0; i < n; i++)
            ref += (double)x[i] * x[i];
        double r[2];
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t + 1);
            r[t] = kcpu_sumsq(x, n);
        }
        omp_set_num_threads(2);
        assert_true(r[0] == r[1]);
        TU_ASSERT_LE(fabs(r[0] - ref), 1e-12 * (ref + 1), &rng, "sumsq");
        free(x);
    }
}

static void test_clip(void **state)
{
    (void)state;
    assert_true(kcpu_clip_factor(0.5, 1.0f) == 1.0f);
    assert_true(kcpu_clip_factor(1.0, 1.0f) == 1.0f);
    assert_true(kcpu_clip_factor(100.0, 0.0f) == 1.0f);  /* max_norm <= 0: no clipping */
    assert_true(kcpu_clip_factor(100.0, -1.0f) == 1.0f);
    assert_true(fabs(kcpu_clip_factor(4.0, 1.0f) - 0.25) < 1e-6);
    /* the clipped gradient has norm max_norm */
    tu_rng rng = tu_rng_fresh();
    float g[100];
    tu_fill_normal(&rng, g, 100, 0, 3);
    double norm = sqrt(kcpu_sumsq(g, 100));
    kcpu_scale(g, 100, kcpu_clip_factor(norm, 1.5f));
    TU_ASSERT_LE(fabs(sqrt(kcpu_sumsq(g, 100)) - 1.5), 1e-5, &rng, "clip");
    assert_true(isnan(kcpu_clip_factor(NAN, 1.0f)));
}

static void test_threads(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    size_t n = 100003;
    float *g = tu_falloc(n), *p0 = tu_falloc(n);
    tu_fill_normal(&rng, g, n, 0, 1);
    tu_fill_normal(&rng, p0, n, 0, 1);
    float *r[2][3];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        r[t][0] = tu_fdup(p0, n), r[t][1] = tu_falloc(n), r[t][2] = tu_falloc(n);
        kcpu_adamw_update(r[t][0], g, r[t][1], r[t][2], n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
        kcpu_adamw_update(r[t][0], g, r[t][1], r[t][2], n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2);
    }
    omp_set_num_threads(2);
    for (int i = 0; i < 3; i++)
        TU_ASSERT_BITWISE(r[0][i], r[1][i], n, &rng, "adamw 1 vs 2 threads");
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 3; i++)
            free(r[t][i]);
    free(g), free(p0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_steps),
        cmocka_unit_test(test_weight_decay),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name("kernels_adamw", tests, NULL, NULL);
}
