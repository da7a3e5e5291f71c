/* test_kernels_crossentropy.c - softmax cross-entropy with ignored rows. */
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

typedef struct {
    const float *logits, *w;
    const int *targets;
    int N, V, ignore;
    double *loss;
} ce_ctx;

/* loss_i = log sum_j exp(x_ij) - x_it, via the shifted form in double */
static void ref_ce(ce_ctx *c)
{
    for (int i = 0; i < c->N; i++) {
        const float *x = c->logits + (size_t)i * c->V;
        if (c->targets[i] == c->ignore) {
            c->loss[i] = 0;
            continue;
        }
        double mx = x[0], s = 0;
        for (int j = 1; j < c->V; j++)
            mx = fmax(mx, x[j]);
        for (int j = 0; j < c->V; j++)
            s += exp(x[j] - mx);
        c->loss[i] = mx + log(s) - x[c->targets[i]];
    }
}

static double ce_loss(void *p)
{
    ce_ctx *c = p;
    ref_ce(c);
    return tu_dot_fd(c->w, c->loss, c->N);
}

static void check_ce(tu_rng *rng, int N, int V, int ignore, float offset)
{
    size_t n = (size_t)N * V;
    float *logits = tu_falloc(n), *w = tu_falloc(N), *loss = tu_falloc(N);
    float *dl = tu_falloc(n);
    int *targets = tu_ialloc(N);
    tu_fill_normal(rng, logits, n, offset, 3.0f);
    tu_fill_uniform(rng, w, N, -1, 1);
    for (int i = 0; i < N; i++)
        do
            targets[i] = tu_uniform(rng) < 0.3 ? ignore : tu_randint(rng, 0, V);
        while (i == 0 && targets[i] == ignore); /* at least one real row */
    if (N > 1)
        targets[N - 1] = ignore;        /* and one ignored */
    ce_ctx c = {logits, w, targets, N, V, ignore, tu_dalloc(N)};
    ref_ce(&c);
    tu_fill_uniform(rng, loss, N, 5, 6); /* forward must overwrite, ignored rows too */
    kcpu_crossentropy_forward(loss, logits, targets, N, V, ignore);
    TU_ASSERT_LE(tu_rel_l2(loss, c.loss, N), 1e-6, rng, "crossentropy forward");
    for (int i = 0; i < N; i++)
        if (targets[i] == ignore)
            assert_true(loss[i] == 0.0f);

    kcpu_crossentropy_backward(dl, logits, targets, w, N, V, ignore);
    tu_fd_opts o = {.tol = 1e-4, .max_samples = 400};
    TU_ASSERT_FD(logits, n, dl, ce_loss, &c, &o, rng, "crossentropy dlogits");
    for (int i = 0; i < N; i++)
        if (targets[i] == ignore)
            for (int j = 0; j < V; j++)
                assert_true(dl[(size_t)i * V + j] == 0.0f);
    /* accumulate */
    float *d2 = tu_fdup(dl, n);
    kcpu_crossentropy_backward(d2, logits, targets, w, N, V, ignore);
    for (size_t i = 0; i < n; i++)
        dl[i] *= 2;
    TU_ASSERT_LE(tu_rel_l2_ff(d2, dl, n), 1e-6, rng, "crossentropy accumulate");
    free(logits), free(w), free(loss), free(dl), free(d2), free(targets), free(c.loss);
}

static void test_crossentropy(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    check_ce(&rng, 1, 1, -100, 0);
    check_ce(&rng, 5, 17, -1, 0);
    check_ce(&rng, 1 + tu_randint(&rng, 0, 40), 2 + tu_randint(&rng, 0, 300), -100, 0);
    /* an ignore_index that is also a valid class (e.g. a pad token id) */
    check_ce(&rng, 20, 50, tu_randint(&rng, 0, 50), 0);
    /* large logits: naive exp would overflow float */
    check_ce(&rng, 9, 101, -1, 500.0f);
}

static void test_bad_target(void **state)
{
    (void)state;
    float logits[6] = {1, 2, 3, 4, 5, 6}, loss[2], dl[6] = {0}, w[2] = {1, 1};
    int targets[2] = {3, 1};
    kcpu_crossentropy_forward(loss, logits, targets, 2, 3, -100);
    assert_true(isnan(loss[0]) && isfinite(loss[1]));
    kcpu_crossentropy_backward(dl, logits, targets, w, 2, 3, -100);
    for (int j = 0; j < 3; j++)
        assert_true(dl[j] == 0.0f);
}

static void test_threads(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 67, V = 1001;
    size_t n = (size_t)N * V;
    float *logits = tu_falloc(n), *w = tu_falloc(N);
    int *targets = tu_ialloc(N);
    tu_fill_normal(&rng, logits, n, 0, 2);
    tu_fill_uniform(&rng, w, N, -1, 1);
    for (int i = 0; i < N; i++)
        targets[i] = tu_randint(&rng, -1, V);
    float *r[2][2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        r[t][0] = tu_falloc(N), r[t][1] = tu_falloc(n);
        kcpu_crossentropy_forward(r[t][0], logits, targets, N, V, -1);
        kcpu_crossentropy_backward(r[t][1], logits, targets, w, N, V, -1);
    }
    omp_set_num_threads(2);
    TU_ASSERT_BITWISE(r[0][0], r[1][0], N, &rng, "crossentropy forward 1 vs 2 threads");
    TU_ASSERT_BITWISE(r[0][1], r[1][1], n, &rng, "crossentropy backward 1 vs 2 threads");
    for (int t = 0; t < 2; t++)
        free(r[t][0]), free(r[t][1]);
    free(logits), free(w), free(targets);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crossentropy),
        cmocka_unit_test(test_bad_target),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name("kernels_crossentropy", tests, NULL, NULL);
}
