/* test_kernels_activation.c - SwiGLU and GELU (tanh and erf forms). */
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
    int kind;           /* -1 swiglu, else kgelu_kind */
    const float *inp, *w;
    int N, F;           /* gelu: N*F elements */
    double *out;
} act_ctx;

static void ref_act(act_ctx *c)
{
    for (int n = 0; n < c->N; n++)
        for (int f = 0; f < c->F; f++) {
            double y;
            if (c->kind < 0) {
                double g = c->inp[(size_t)n * 2 * c->F + f];
                double u = c->inp[(size_t)n * 2 * c->F + c->F + f];
                y = g / (1.0 + exp(-g)) * u;
            } else {
                double x = c->inp[(size_t)n * c->F + f];
                if (c->kind == KGELU_ERF)
                    y = 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
                else
                    y = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
            }
            c->out[(size_t)n * c->F + f] = y;
        }
}

static double act_loss(void *p)
{
    act_ctx *c = p;
    ref_act(c);
    return tu_dot_fd(c->w, c->out, (size_t)c->N * c->F);
}

static void check_act(tu_rng *rng, int kind, int N, int F)
{
    size_t nin = (size_t)N * F * (kind < 0 ? 2 : 1), nout = (size_t)N * F;
    float *inp = tu_falloc(nin), *w = tu_falloc(nout), *out = tu_falloc(nout);
    float *din = tu_falloc(nin);
    tu_fill_uniform(rng, inp, nin, -6, 6);
    tu_fill_uniform(rng, w, nout, -1, 1);
    act_ctx c = {kind, inp, w, N, F, tu_dalloc(nout)};
    ref_act(&c);
    const char *name = kind < 0 ? "swiglu" : kind == KGELU_ERF ? "gelu erf" : "gelu tanh";
    if (kind < 0) {
        kcpu_swiglu_forward(out, inp, N, F);
        kcpu_swiglu_backward(din, w, inp, N, F);
    } else {
        kcpu_gelu_forward(out, inp, nout, (kgelu_kind)kind);
        kcpu_gelu_backward(din, w, inp, nout, (kgelu_kind)kind);
    }
    TU_ASSERT_LE(tu_rel_l2(out, c.out, nout), 1e-6, rng, name);
    tu_fd_opts o = {.tol = 1e-4, .max_samples = 400};
    TU_ASSERT_FD(inp, nin, din, act_loss, &c, &o, rng, name);
    /* accumulate */
    float *d2 = tu_fdup(din, nin);
    if (kind < 0)
        kcpu_swiglu_backward(d2, w, inp, N, F);
    else
        kcpu_gelu_backward(d2, w, inp, nout, (kgelu_kind)kind);
    for (size_t i = 0; i < nin; i++)
        din[i] *= 2;
    TU_ASSERT_LE(tu_rel_l2_ff(d2, din, nin), 1e-6, rng, name);
    free(inp), free(w), free(out), free(din), free(d2), free(c.out);
}

static void test_swiglu(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    check_act(&rng, -1, 1, 1);
    check_act(&rng, -1, 1 + tu_randint(&rng, 0, 30), 1 + tu_randint(&rng, 0, 90));
}

static void test_gelu(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    for (int kind = 0; kind < 2; kind++) {
        check_act(&rng, kind, 1, 1);
        check_act(&rng, kind, 1 + tu_randint(&rng, 0, 30), 1 + tu_randint(&rng, 0, 90));
    }
    /* the two forms are different functions (they agree only to ~1e-3) */
    float x = 1.3f, a, b;
    kcpu_gelu_forward(&a, &x, 1, KGELU_TANH);
    kcpu_gelu_forward(&b, &x, 1, KGELU_ERF);
    assert_true(a != b && fabsf(a - b) < 1e-2f);
}

static void test_threads(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 64, F = 300;
    size_t n = (size_t)N * F;
    float *inp = tu_falloc(2 * n), *dout = tu_falloc(n);
    tu_fill_uniform(&rng, inp, 2 * n, -5, 5);
    tu_fill_uniform(&rng, dout, n, -1, 1);
    float *r[2][4];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        r[t][0] = tu_falloc(n), r[t][1] = tu_falloc(2 * n);
        r[t][2] = tu_falloc(2 * n), r[t][3] = tu_falloc(2 * n);
        kcpu_swiglu_forward(r[t][0], inp, N, F);
        kcpu_swiglu_backward(r[t][1], dout, inp, N, F);
        kcpu_gelu_forward(r[t][2], inp, 2 * n, KGELU_TANH);
        kcpu_gelu_backward(r[t][3], inp, inp, 2 * n, KGELU_ERF);
    }
    omp_set_num_threads(2);
    size_t len[4] = {n, 2 * n, 2 * n, 2 * n};
    for (int i = 0; i < 4; i++)
        TU_ASSERT_BITWISE(r[0][i], r[1][i], len[i], &rng, "activation 1 vs 2 threads");
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 4; i++)
            free(r[t][i]);
    free(inp), free(dout);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name("kernels_activation", tests, NULL, NULL);
}
