/* test_kernels_elementwise.c - add/accumulate/scale and the embedding lookup. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "support/testutil.h"

static void test_add_accumulate_scale(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    size_t sizes[3] = {1, 1 + (size_t)tu_randint(&rng, 0, 1000), 70001}; /* last: parallel */
    for (int s = 0; s < 3; s++) {
        size_t n = sizes[s];
        float *a = tu_falloc(n), *b = tu_falloc(n), *out = tu_falloc(n), *x = tu_falloc(n);
        tu_fill_uniform(&rng, a, n, -3, 3);
        tu_fill_uniform(&rng, b, n, -3, 3);
        float sc = (float)(tu_uniform(&rng) * 4 - 2);
        kcpu_add(out, a, b, n);
        for (size_t i = 0; i < n; i++)
            assert_true(out[i] == a[i] + b[i]);
        memcpy(x, a, n * sizeof *x);
        kcpu_add(x, x, b, n); /* out aliases a */
        TU_ASSERT_BITWISE(x, out, n, &rng, "kcpu_add aliased");
        memcpy(x, a, n * sizeof *x);
        kcpu_accumulate(x, b, n);
        TU_ASSERT_BITWISE(x, out, n, &rng, "kcpu_accumulate");
        memcpy(x, a, n * sizeof *x);
        kcpu_scale(x, n, sc);
        for (size_t i = 0; i < n; i++)
            assert_true(x[i] == a[i] * sc);
        free(a), free(b), free(out), free(x);
    }
}

typedef struct {
    const float *table, *w;
    const int *ids;
    int N, C;
} emb_ctx;

static double emb_loss(void *p)
{
    emb_ctx *c = p;
    double s = 0;
    for (int i = 0; i < c->N; i++)
        for (int j = 0; j < c->C; j++)
            s += (double)c->w[(size_t)i * c->C + j] * c->table[(size_t)c->ids[i] * c->C + j];
    return s;
}

static void test_embedding(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int V = 11 + tu_randint(&rng, 0, 20), N = 1 + tu_randint(&rng, 0, 60);
    int C = 1 + tu_randint(&rng, 0, 150);
    float *table = tu_falloc((size_t)V * C), *out = tu_falloc((size_t)N * C);
    float *w = tu_falloc((size_t)N * C), *dt = tu_falloc((size_t)V * C);
    int *ids = tu_ialloc(N);
    tu_fill_uniform(&rng, table, (size_t)V * C, -1, 1);
    tu_fill_uniform(&rng, w, (size_t)N * C, -1, 1);
    for (int i = 0; i < N; i++)
        ids[i] = tu_randint(&rng, 0, V / 2); /* many repeats */
    kcpu_embedding_forward(out, ids, table, N, C);
    for (int i = 0; i < N; i++)
        assert_memory_equal(out + (size_t)i * C, table + (size_t)ids[i] * C, C * sizeof(float));

    kcpu_embedding_backward(dt, w, ids, N, C);
    emb_ctx c = {table, w, ids, N, C};
    tu_fd_opts o = {.tol = 1e-5};
    TU_ASSERT_FD(table, (size_t)V * C, dt, emb_loss, &c, &o, &rng, "embedding dtable");
    /* accumulate: a second call doubles (from zero) */
    float *dt2 = tu_fdup(dt, (size_t)V * C);
    kcpu_embedding_backward(dt2, w, ids, N, C);
    for (size_t i = 0; i < (size_t)V * C; i++)
        dt[i] *= 2;
    TU_ASSERT_LE(tu_rel_l2_ff(dt2, dt, (size_t)V * C), 1e-6, &rng, "embedding accumulate");
    free(table), free(out), free(w), free(dt), free(dt2), free(ids);
}

static void test_embedding_threads(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int V = 50, N = 300, C = 257;
    float *dout = tu_falloc((size_t)N * C);
    int *ids = tu_ialloc(N);
    tu_fill_uniform(&rng, dout, (size_t)N * C, -1, 1);
    for (int i = 0; i < N; i++)
        ids[i] = tu_randint(&rng, 0, V);
    float *d[2] = {tu_falloc((size_t)V * C), tu_falloc((size_t)V * C)};
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        kcpu_embedding_backward(d[t], dout, ids, N, C);
    }
    omp_set_num_threads(2);
    TU_ASSERT_BITWISE(d[0], d[1], (size_t)V * C, &rng, "embedding backward 1 vs 2 threads");
    free(d[0]), free(d[1]), free(dout), free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_accumulate_scale),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_embedding_threads),
    };
    return cmocka_run_group_tests_name("kernels_elementwise", tests, NULL, NULL);
}
