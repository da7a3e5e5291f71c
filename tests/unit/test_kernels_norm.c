/* test_kernels_norm.c - RMSNorm and LayerNorm: forward and saved statistics against a
 * double loop, every gradient against central differences of a double forward. */
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
    int layer;          /* 0 rmsnorm, 1 layernorm */
    const float *inp, *weight, *bias, *w;
    int N, C;
    float eps;
    double *out, *mean, *rstd;
} norm_ctx;

static void ref_norm(norm_ctx *c)
{
    for (int i = 0; i < c->N; i++) {
        const float *x = c->inp + (size_t)i * c->C;
        double mu = 0, v = 0;
        if (c->layer) {
            for (int j = 0; j < c->C; j++)
                mu += x[j];
            mu /= c->C;
        }
        for (int j = 0; j < c->C; j++)
            v += (x[j] - mu) * (x[j] - mu);
        double r = 1.0 / sqrt(v / c->C + (double)c->eps);
        for (int j = 0; j < c->C; j++)
            c->out[(size_t)i * c->C + j] =
                (x[j] - mu) * r * c->weight[j] + (c->bias ? c->bias[j] : 0.0);
        c->mean[i] = mu;
        c->rstd[i] = r;
    }
}

static double norm_loss(void *p)
{
    norm_ctx *c = p;
    ref_norm(c);
    return tu_dot_fd(c->w, c->out, (size_t)c->N * c->C);
}

static void check_norm(tu_rng *rng, int layer, int N, int C)
{
    size_t n = (size_t)N * C;
    float *inp = tu_falloc(n), *wt = tu_falloc(C), *b = layer ? tu_falloc(C) : NULL;
    float *w = tu_falloc(n), *out = tu_falloc(n), *mean = tu_falloc(N), *rstd = tu_falloc(N);
    float *dinp = tu_falloc(n), *dw = tu_falloc(C), *db = tu_falloc(C);
    tu_fill_normal(rng, inp, n, 0.3f, 1.5f);
    tu_fill_uniform(rng, wt, C, 0.5f, 1.5f);
    if (b)
        tu_fill_uniform(rng, b, C, -1, 1);
    tu_fill_uniform(rng, w, n, -1, 1);
    float eps = 1e-5f;
    norm_ctx c = {layer, inp, wt, b, w, N, C, eps, tu_dalloc(n), tu_dalloc(N), tu_dalloc(N)};
    ref_norm(&c);
    char what[64];
    snprintf(what, sizeof what, "%s N=%d C=%d", layer ? "layernorm" : "rmsnorm", N, C);
    if (layer) {
        kcpu_layernorm_forward(out, mean, rstd, inp, wt, b, N, C, eps);
        TU_ASSERT_LE(tu_rel_l2(mean, c.mean, N), 1e-6, rng, what);
    } else {
        kcpu_rmsnorm_forward(out, rstd, inp, wt, N, C, eps);
    }
    TU_ASSERT_LE(tu_rel_l2(out, c.out, n), 1e-6, rng, what);
    TU_ASSERT_LE(tu_rel_l2(rstd, c.rstd, N), 1e-6, rng, what);

    if (layer)
        kcpu_layernorm_backward(dinp, dw, db, w, inp, wt, mean, rstd, N, C);
    else
        kcpu_rmsnorm_backward(dinp, dw, w, inp, wt, rstd, N, C);
    tu_fd_opts o = {.tol = 1e-4, .max_samples = 200};
    TU_ASSERT_FD(inp, n, dinp, norm_loss, &c, &o, rng, "norm dinp");
    TU_ASSERT_FD(wt, C, dw, norm_loss, &c, &o, rng, "norm dweight");
    if (layer)
        TU_ASSERT_FD(b, C, db, norm_loss, &c, &o, rng, "norm dbias");

    /* accumulate: second call doubles; NULL gradients skipped, the rest unchanged */
    float *g[3] = {tu_fdup(dinp, n), tu_fdup(dw, C), tu_fdup(db, C)};
    size_t len[3] = {n, (size_t)C, (size_t)C};
    if (layer)
        kcpu_layernorm_backward(g[0], g[1], g[2], w, inp, wt, mean, rstd, N, C);
    else
        kcpu_rmsnorm_backward(g[0], g[1], w, inp, wt, rstd, N, C);
    float *ref[3] = {dinp, dw, db};
    for (int t = 0; t < (layer ? 3 : 2); t++) {
        for (size_t i = 0; i < len[t]; i++)
            ref[t][i] *= 2;
        TU_ASSERT_LE(tu_rel_l2_ff(g[t], ref[t], len[t]), 1e-6, rng, "norm accumulate");
        for (size_t i = 0; i < len[t]; i++)
            ref[t][i] *= 0.5f;
        memset(g[t], 0, len[t] * sizeof(float));
    }
    for (int t = 0; t < (layer ? 3 : 2); t++) {
        float *x = tu_falloc(len[t]);
        if (layer)
            kcpu_layernorm_backward(t == 0 ? x : NULL, t == 1 ? x : NULL, t == 2 ? x : NULL, w,
                                    inp, wt, mean, rstd, N, C);
        else
            kcpu_rmsnorm_backward(t == 0 ? x : NULL, t == 1 ? x : NULL, w, inp, wt, rstd, N, C);
        TU_ASSERT_BITWISE(x, ref[t], len[t], rng, "norm backward with NULLs");
        free(x);
    }
    for (int t = 0; t < 3; t++)
        free(g[t]);
    free(inp), free(wt), free(b), free(w), free(out), free(mean), free(rstd);
    free(dinp), free(dw), free(db), free(c.out), free(c.mean), free(c.rstd);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    /* Not C = 1: y = x / sqrt(x^2 + eps) is flat there and its tiny gradient comes out of
     * a cancellation that the float-saved rstd limits to ~1e-3 relative. */
    check_norm(&rng, 0, 1, 3);
    check_norm(&rng, 0, 7, 33);
    check_norm(&rng, 0, 1 + tu_randint(&rng, 0, 30), 8 + tu_randint(&rng, 0, 200));
}

static void test_layernorm(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    /* Not C = 2 (outputs are +-1 whatever the input: the same flat case as above). */
    check_norm(&rng, 1, 1, 4);
    check_norm(&rng, 1, 9, 65);
    check_norm(&rng, 1, 1 + tu_randint(&rng, 0, 30), 8 + tu_randint(&rng, 0, 200));
}

static void test_threads(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 97, C = 333;
    size_t n = (size_t)N * C;
    float *inp = tu_falloc(n), *wt = tu_falloc(C), *b = tu_falloc(C), *dout = tu_falloc(n);
    tu_fill_normal(&rng, inp, n, 0, 1);
    tu_fill_uniform(&rng, wt, C, 0.5f, 1.5f);
    tu_fill_uniform(&rng, b, C, -1, 1);
    tu_fill_uniform(&rng, dout, n, -1, 1);
    float *r[2][8];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        float **x = r[t];
        x[0] = tu_falloc(n), x[1] = tu_falloc(N), x[2] = tu_falloc(N), x[3] = tu_falloc(n);
        x[4] = tu_falloc(C), x[5] = tu_falloc(C), x[6] = tu_falloc(n), x[7] = tu_falloc(C);
        kcpu_layernorm_forward(x[0], x[1], x[2], inp, wt, b, N, C, 1e-5f);
        kcpu_layernorm_backward(x[3], x[4], x[5], dout, inp, wt, x[1], x[2], N, C);
        kcpu_rmsnorm_backward(x[6], x[7], dout, inp, wt, x[2], N, C);
    }
    omp_set_num_threads(2);
    size_t len[8] = {n, (size_t)N, (size_t)N, n, (size_t)C, (size_t)C, n, (size_t)C};
    for (int i = 0; i < 8; i++)
        TU_ASSERT_BITWISE(r[0][i], r[1][i], len[i], &rng, "norm 1 vs 2 threads");
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 8; i++)
            free(r[t][i]);
    free(inp), free(wt), free(b), free(dout);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name("kernels_norm", tests, NULL, NULL);
}
