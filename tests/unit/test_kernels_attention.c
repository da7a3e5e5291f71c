/* test_kernels_attention.c - varlen GQA attention: forward and lse against a double
 * loop, dq/dk/dv against central differences of the double forward, causal and not,
 * GQA ratios 1..4, sequences of length 1 up to several key/query blocks. */
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
    const float *q, *k, *v, *w;
    const int *cu;
    int nseq, Hq, Hkv, D, causal;
    double *out, *lse, *s;   /* s: scratch for one row of scores */
} attn_ctx;

static void ref_attention(attn_ctx *c)
{
    int D = c->D, group = c->Hq / c->Hkv;
    double scale = 1.0 / sqrt((double)D);
    for (int sq = 0; sq < c->nseq; sq++)
        for (int h = 0; h < c->Hq; h++) {
            int g = h / group;
            for (int i = c->cu[sq]; i < c->cu[sq + 1]; i++) {
                int jend = c->causal ? i + 1 : c->cu[sq + 1];
                const float *qi = c->q + ((size_t)i * c->Hq + h) * D;
                double mx = -INFINITY, sum = 0;
                for (int j = c->cu[sq]; j < jend; j++) {
                    const float *kj = c->k + ((size_t)j * c->Hkv + g) * D;
                    double d = 0;
                    for (int e = 0; e < D; e++)
                        d += (double)qi[e] * kj[e];
                    c->s[j] = d * scale;
                    mx = fmax(mx, c->s[j]);
                }
                for (int j = c->cu[sq]; j < jend; j++)
                    sum += exp(c->s[j] - mx);
                double *o = c->out + ((size_t)i * c->Hq + h) * D;
                for (int e = 0; e < D; e++)
                    o[e] = 0;
                for (int j = c->cu[sq]; j < jend; j++) {
                    double p = exp(c->s[j] - mx) / sum;
                    const float *vj = c->v + ((size_t)j * c->Hkv + g) * D;
                    for (int e = 0; e < D; e++)
                        o[e] += p * vj[e];
                }
                c->lse[(size_t)i * c->Hq + h] = mx + log(sum);
            }
        }
}

static double attn_loss(void *p)
{
    attn_ctx *c = p;
    ref_attention(c);
    return tu_dot_fd(c->w, c->out, (size_t)c->cu[c->nseq] * c->Hq * c->D);
}

static void check_attention(tu_rng *rng, const int *lens, int nseq, int Hq, int Hkv, int D,
                            int causal, size_t fd_samples)
{
    int *cu = tu_ialloc(nseq + 1);
    for (int s = 0; s < nseq; s++)
        cu[s + 1] = cu[s] + lens[s];
    int N = cu[nseq];
    size_t nq = (size_t)N * Hq * D, nk = (size_t)N * Hkv * D;
    float *q = tu_falloc(nq), *k = tu_falloc(nk), *v = tu_falloc(nk), *w = tu_falloc(nq);
    float *out = tu_falloc(nq), *lse = tu_falloc((size_t)N * Hq);
    float *dq = tu_falloc(nq), *dk = tu_falloc(nk), *dv = tu_falloc(nk);
    tu_fill_normal(rng, q, nq, 0, 1);
    tu_fill_normal(rng, k, nk, 0, 1);
    tu_fill_normal(rng, v, nk, 0, 1);
    tu_fill_uniform(rng, w, nq, -1, 1);
    tu_fill_uniform(rng, out, nq, 7, 8); /* forward overwrites */
    attn_ctx c = {q, k, v, w, cu, nseq, Hq, Hkv, D, causal,
                  tu_dalloc(nq), tu_dalloc((size_t)N * Hq), tu_dalloc(N)};
    ref_attention(&c);
    kcpu_attention_forward(out, lse, q, k, v, cu, nseq, Hq, Hkv, D, causal);
    char what[128];
    snprintf(what, sizeof what, "attention nseq=%d N=%d Hq=%d Hkv=%d D=%d causal=%d", nseq, N,
             Hq, Hkv, D, causal);
    TU_ASSERT_LE(tu_rel_l2(out, c.out, nq), 1e-5, rng, what);
    TU_ASSERT_LE(tu_rel_l2(lse, c.lse, (size_t)N * Hq), 1e-6, rng, what);

    if (fd_samples) {
        kcpu_attention_backward(dq, dk, dv, w, q, k, v, out, lse, cu, nseq, Hq, Hkv, D, causal);
        /* atol: with one key per query dq and dk are exactly 0 and come out as float noise */
        tu_fd_opts o = {.tol = 1e-3, .atol = 1e-6, .max_samples = fd_samples};
        TU_ASSERT_FD(q, nq, dq, attn_loss, &c, &o, rng, "attention dq");
        TU_ASSERT_FD(k, nk, dk, attn_loss, &c, &o, rng, "attention dk");
        TU_ASSERT_FD(v, nk, dv, attn_loss, &c, &o, rng, "attention dv");

        /* accumulate: a second call doubles; each NULL-free subset gives the same bits */
        float *g[3] = {tu_fdup(dq, nq), tu_fdup(dk, nk), tu_fdup(dv, nk)};
        float *r[3] = {dq, dk, dv};
        size_t len[3] = {nq, nk, nk};
        kcpu_attention_backward(g[0], g[1], g[2], w, q, k, v, out, lse, cu, nseq, Hq, Hkv, D,
                                causal);
        for (int t = 0; t < 3; t++) {
            for (size_t i = 0; i < len[t]; i++)
                r[t][i] *= 2;
            TU_ASSERT_LE(tu_rel_l2_ff(g[t], r[t], len[t]), 1e-6, rng, "attention accumulate");
            for (size_t i = 0; i < len[t]; i++)
                r[t][i] *= 0.5f;
            memset(g[t], 0, len[t] * sizeof(float));
        }
        kcpu_attention_backward(g[0], NULL, NULL, w, q, k, v, out, lse, cu, nseq, Hq, Hkv, D,
                                causal);
        kcpu_attention_backward(NULL, g[1], NULL, w, q, k, v, out, lse, cu, nseq, Hq, Hkv, D,
                                causal);
        kcpu_attention_backward(NULL, NULL, g[2], w, q, k, v, out, lse, cu, nseq, Hq, Hkv, D,
                                causal);
        kcpu_attention_backward(NULL, NULL, NULL, w, q, k, v, out, lse, cu, nseq, Hq, Hkv, D,
                                causal);
        for (int t = 0; t < 3; t++) {
            TU_ASSERT_BITWISE(g[t], r[t], len[t], rng, "attention backward with NULLs");
            free(g[t]);
        }
    }
    free(cu), free(q), free(k), free(v), free(w), free(out), free(lse);
    free(dq), free(dk), free(dv), free(c.out), free(c.lse), free(c.s);
}

static void test_forward_backward(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    for (int causal = 0; causal < 2; causal++) {
        int lens1[1] = {1};
        check_attention(&rng, lens1, 1, 2, 1, 8, causal, 50);
        int lens3[3] = {5, 1, 11 + tu_randint(&rng, 0, 20)};
        check_attention(&rng, lens3, 3, 3, 3, 7, causal, 150);      /* MHA, odd D */
        check_attention(&rng, lens3, 3, 4, 2, 16, causal, 150);     /* GQA 2 */
        int lens2[2] = {70 + tu_randint(&rng, 0, 10), 3};           /* > one 64-block */
        check_attention(&rng, lens2, 2, 4, 1, 5, causal, 60);       /* GQA 4 */
    }
}

/* Larger shapes, forward only: several query and key blocks, head_dim of real models. */
static void test_forward_large(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int lens[3] = {130 + tu_randint(&rng, 0, 80), 64, 1};
    for (int causal = 0; causal < 2; causal++)
        check_attention(&rng, lens, 3, 6, 2, 64, causal, 0);
}

static void test_threads(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int lens[3] = {100, 37, 1}, cu[4] = {0};
    for (int s = 0; s < 3; s++)
        cu[s + 1] = cu[s] + lens[s];
    int N = cu[3], Hq = 4, Hkv = 2, D = 24;
    size_t nq = (size_t)N * Hq * D, nk = (size_t)N * Hkv * D;
    float *q = tu_falloc(nq), *k = tu_falloc(nk), *v = tu_falloc(nk), *dout = tu_falloc(nq);
    tu_fill_normal(&rng, q, nq, 0, 1);
    tu_fill_normal(&rng, k, nk, 0, 1);
    tu_fill_normal(&rng, v, nk, 0, 1);
    tu_fill_normal(&rng, dout, nq, 0, 1);
    for (int causal = 0; causal < 2; causal++) {
        float *r[2][5];
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t + 1);
            r[t][0] = tu_falloc(nq), r[t][1] = tu_falloc((size_t)N * Hq);
            r[t][2] = tu_falloc(nq), r[t][3] = tu_falloc(nk), r[t][4] = tu_falloc(nk);
            kcpu_attention_forward(r[t][0], r[t][1], q, k, v, cu, 3, Hq, Hkv, D, causal);
            kcpu_attention_backward(r[t][2], r[t][3], r[t][4], dout, q, k, v, r[t][0], r[t][1],
                                    cu, 3, Hq, Hkv, D, causal);
        }
        omp_set_num_threads(2);
        size_t len[5] = {nq, (size_t)N * Hq, nq, nk, nk};
        for (int i = 0; i < 5; i++)
            TU_ASSERT_BITWISE(r[0][i], r[1][i], len[i], &rng, "attention 1 vs 2 threads");
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < 5; i++)
                free(r[t][i]);
    }
    free(q), free(k), free(v), free(dout);
}

/* Attention on fused rows (q, k, v the column blocks of [N, (Hq + 2 Hkv) D], the
 * gradients added into fused rows of their own: kcpu_attention_*_ld) is bitwise the
 * contiguous attention on the same values; the fused gradient's columns outside q, k, v
 * (a padded row) stay untouched. */
static void test_row_strides(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int lens[3] = {1, 9 + tu_randint(&rng, 0, 60), 70}, cu[4] = {0};
    for (int s = 0; s < 3; s++)
        cu[s + 1] = cu[s] + lens[s];
    int N = cu[3], Hq = 4, Hkv = 2, D = 8, QD = Hq * D, KD = Hkv * D;
    int ld = QD + 2 * KD + 3;   /* 3 pad columns */
    size_t nq = (size_t)N * QD, nk = (size_t)N * KD, nf = (size_t)N * ld;
    float *f = tu_falloc(nf), *q = tu_falloc(nq), *k = tu_falloc(nk), *v = tu_falloc(nk);
    float *dout = tu_falloc(nq), *df = tu_falloc(nf), *df0 = tu_falloc(nf);
    tu_fill_normal(&rng, f, nf, 0, 1);
    tu_fill_normal(&rng, dout, nq, 0, 1);
    tu_fill_normal(&rng, df, nf, 0, 1);
    memcpy(df0, df, nf * sizeof(float));
    for (int i = 0; i < N; i++) {
        memcpy(q + (size_t)i * QD, f + (size_t)i * ld, QD * sizeof(float));
        memcpy(k + (size_t)i * KD, f + (size_t)i * ld + QD, KD * sizeof(float));
        memcpy(v + (size_t)i * KD, f + (size_t)i * ld + QD + KD, KD * sizeof(float));
    }
    for (int causal = 0; causal < 2; causal++) {
        float *o[2] = {tu_falloc(nq), tu_falloc(nq)};
        float *l[2] = {tu_falloc((size_t)N * Hq), tu_falloc((size_t)N * Hq)};
        float *dq = tu_falloc(nq), *dk = tu_falloc(nk), *dv = tu_falloc(nk);
        for (size_t i = 0; i < nq; i++)   /* the fused gradient's starting values */
            dq[i] = df0[(i / QD) * ld + i % QD];
        for (size_t i = 0; i < nk; i++) {
            dk[i] = df0[(i / KD) * ld + QD + i % KD];
            dv[i] = df0[(i / KD) * ld + QD + KD + i % KD];
        }
        memcpy(df, df0, nf * sizeof(float));
        kcpu_attention_forward(o[0], l[0], q, k, v, cu, 3, Hq, Hkv, D, causal);
        kcpu_attention_forward_ld(o[1], l[1], f, f + QD, f + QD + KD, ld, ld, ld, cu, 3, Hq, Hkv,
                                  D, causal);
        TU_ASSERT_BITWISE(o[0], o[1], nq, &rng, "out on fused rows");
        TU_ASSERT_BITWISE(l[0], l[1], (size_t)N * Hq, &rng, "lse on fused rows");
        kcpu_attention_backward(dq, dk, dv, dout, q, k, v, o[0], l[0], cu, 3, Hq, Hkv, D,
                                causal);
        kcpu_attention_backward_ld(df, df + QD, df + QD + KD, dout, f, f + QD, f + QD + KD,
                                   o[1], l[1], ld, ld, ld, cu, 3, Hq, Hkv, D, causal);
        for (int i = 0; i < N; i++) {
            const float *r = df + (size_t)i * ld;
            TU_ASSERT_BITWISE(dq + (size_t)i * QD, r, (size_t)QD, &rng, "dq in fused rows");
            TU_ASSERT_BITWISE(dk + (size_t)i * KD, r + QD, (size_t)KD, &rng, "dk in fused rows");
            TU_ASSERT_BITWISE(dv + (size_t)i * KD, r + QD + KD, (size_t)KD, &rng,
                              "dv in fused rows");
            TU_ASSERT_BITWISE(df0 + (size_t)i * ld + QD + 2 * KD, r + QD + 2 * KD, 3, &rng,
                              "pad columns untouched");
        }
        free(o[0]), free(o[1]), free(l[0]), free(l[1]), free(dq), free(dk), free(dv);
    }
    free(f), free(q), free(k), free(v), free(dout), free(df), free(df0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_backward),
        cmocka_unit_test(test_forward_large),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_row_strides),
    };
    return cmocka_run_group_tests_name("kernels_attention", tests, NULL, NULL);
}
