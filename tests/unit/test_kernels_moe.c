/* test_kernels_moe.c - MoE router (softmax, top-k with ties, renormalised weights,
 * load-balancing loss) and its exact backward; the permutation plan; permute/unpermute
 * forward, roundtrip and backward. */
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

/* ---- router ------------------------------------------------------------------- */

/* The router loss as a double function of the logits, with the top-k choice held fixed
 * (it is piecewise constant: the gradient flows through the chosen probabilities, and f
 * in the aux loss is a constant). */
typedef struct {
    const float *logits, *dtopk_w;
    const int *idx;
    float daux;
    int N, E, K;
    double *p, *w, aux;
} router_ctx;

static void ref_router(router_ctx *c)
{
    int N = c->N, E = c->E, K = c->K;
    for (int t = 0; t < N; t++) {
        const float *z = c->logits + (size_t)t * E;
        double mx = z[0], s = 0;
        for (int e = 1; e < E; e++)
            mx = fmax(mx, z[e]);
        for (int e = 0; e < E; e++)
            s += exp(z[e] - mx);
        for (int e = 0; e < E; e++)
            c->p[(size_t)t * E + e] = exp(z[e] - mx) / s;
        double S = 0;
        for (int j = 0; j < K; j++)
            S += c->p[(size_t)t * E + c->idx[t * K + j]];
        for (int j = 0; j < K; j++)
            c->w[t * K + j] = c->p[(size_t)t * E + c->idx[t * K + j]] / S;
    }
    double aux = 0;
    for (int e = 0; e < E; e++) {
        double f = 0, P = 0;
        for (int i = 0; i < N * K; i++)
            f += c->idx[i] == e;
        for (int t = 0; t < N; t++)
            P += c->p[(size_t)t * E + e];
        aux += (f / N) * (P / N);
    }
    c->aux = E * aux;
}

static double router_loss(void *p)
{
    router_ctx *c = p;
    ref_router(c);
    return tu_dot_fd(c->dtopk_w, c->w, (size_t)c->N * c->K) + (double)c->daux * c->aux;
}

/* top-k of one row of float probabilities, written out the obvious way: sort indices by
 * (probability descending, index ascending) */
static void ref_topk(int *idx, const float *p, int E, int K)
{
    int order[512];
    for (int e = 0; e < E; e++)
        order[e] = e;
    for (int a = 1; a < E; a++) /* insertion sort, stable */
        for (int b = a; b > 0 && p[order[b]] > p[order[b - 1]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    memcpy(idx, order, (size_t)K * sizeof *idx);
}

static void check_router(tu_rng *rng, int N, int E, int K, int ties)
{
    size_t ne = (size_t)N * E, nk = (size_t)N * K;
    float *logits = tu_falloc(ne), *probs = tu_falloc(ne), *tw = tu_falloc(nk);
    float *dtw = tu_falloc(nk), *dl = tu_falloc(ne), aux = -1;
    int *idx = tu_ialloc(nk), *ridx = tu_ialloc(K);
    tu_fill_normal(rng, logits, ne, 0, 2);
    if (ties) /* coarse values: many exact ties */
        for (size_t i = 0; i < ne; i++)
            logits[i] = (float)tu_randint(rng, 0, 3);
    tu_fill_uniform(rng, dtw, nk, -1, 1);
    kcpu_moe_router_forward(idx, tw, probs, &aux, logits, N, E, K);

    router_ctx c = {logits, dtw, idx, (float)tu_uniform(rng) + 0.5f, N, E, K,
                    tu_dalloc(ne), tu_dalloc(nk), 0};
    ref_router(&c);
    TU_ASSERT_LE(tu_rel_l2(probs, c.p, ne), 1e-6, rng, "router probs");
    for (int t = 0; t < N; t++) {
        ref_topk(ridx, probs + (size_t)t * E, E, K);
        if (memcmp(ridx, idx + (size_t)t * K, (size_t)K * sizeof(int)) != 0)
            fail_msg("router top-k of token %d differs (seed %llu)", t,
                     (unsigned long long)rng->seed);
    }
    TU_ASSERT_LE(tu_rel_l2(tw, c.w, nk), 1e-6, rng, "router topk_w");
    TU_ASSERT_LE(fabs(aux - c.aux) / c.aux, 1e-6, rng, "router aux");

    if (!ties) {
        kcpu_moe_router_backward(dl, dtw, c.daux, probs, idx, tw, N, E, K);
        tu_fd_opts o = {.tol = 1e-4, .atol = 1e-7, .max_samples = 300};
        TU_ASSERT_FD(logits, ne, dl, router_loss, &c, &o, rng, "router dlogits");
        /* each term alone: topk part (daux = 0), aux part (dtopk_w = NULL) */
        float *d1 = tu_falloc(ne), *d2 = tu_falloc(ne);
        kcpu_moe_router_backward(d1, dtw, 0.0f, probs, idx, tw, N, E, K);
        kcpu_moe_router_backward(d2, NULL, c.daux, probs, idx, tw, N, E, K);
        for (size_t i = 0; i < ne; i++)
            d1[i] += d2[i];
        TU_ASSERT_LE(tu_rel_l2_ff(d1, dl, ne), 1e-5, rng, "router backward terms");
        /* accumulate */
        memcpy(d1, dl, ne * sizeof *d1);
        kcpu_moe_router_backward(d1, dtw, c.daux, probs, idx, tw, N, E, K);
        for (size_t i = 0; i < ne; i++)
            dl[i] *= 2;
        TU_ASSERT_LE(tu_rel_l2_ff(d1, dl, ne), 1e-6, rng, "router accumulate");
        free(d1), free(d2);
    }
    free(logits), free(probs), free(tw), free(dtw), free(dl), free(idx), free(ridx);
    free(c.p), free(c.w);
}

static void test_router(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    check_router(&rng, 1, 2, 1, 0);
    check_router(&rng, 13, 8, 2, 0);
    check_router(&rng, 1 + tu_randint(&rng, 0, 40), 4 + tu_randint(&rng, 0, 30), 1 + tu_randint(&rng, 0, 4), 0);
    check_router(&rng, 9, 7, 7, 0); /* K = E: weights are the probabilities */
    check_router(&rng, 30, 9, 3, 1);
}

static void test_router_ties(void **state)
{
    (void)state;
    float logits[2 * 6] = {1, 1, 1, 1, 1, 1, 0, 2, 0, 2, 0, 2};
    int idx[2 * 3];
    float tw[2 * 3], probs[2 * 6];
    kcpu_moe_router_forward(idx, tw, probs, NULL, logits, 2, 6, 3);
    int want[6] = {0, 1, 2, 1, 3, 5};
    assert_memory_equal(idx, want, sizeof want);
    for (int j = 0; j < 6; j++)
        assert_true(fabsf(tw[j] - 1.0f / 3) < 1e-7f);
}

/* ---- plan, permute, unpermute ------------------------------------------------------ */

static void random_topk(tu_rng *rng, int *idx, int N, int E, int K)
{
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = tu_randint(rng, 0, E);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= idx[t * K + i] == e;
            } while (dup);
            idx[t * K + j] = e;
        }
}

static void test_plan(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 1 + tu_randint(&rng, 0, 60), E = 2 + tu_randint(&rng, 0, 10);
    int K = 1 + tu_randint(&rng, 0, E < 4 ? E : 4);
    int *idx = tu_ialloc((size_t)N * K), *off = tu_ialloc(E + 1);
    int *src = tu_ialloc((size_t)N * K), *slot = tu_ialloc((size_t)N * K);
    random_topk(&rng, idx, N, E, K);
    kcpu_moe_plan(off, src, slot, idx, N, E, K);
    assert_int_equal(off[0], 0);
    assert_int_equal(off[E], N * K);
    for (int e = 0; e < E; e++) {
        int count = 0;
        for (int i = 0; i < N * K; i++)
            count += idx[i] == e;
        assert_int_equal(off[e + 1] - off[e], count);
        for (int r = off[e]; r < off[e + 1]; r++) {
            assert_int_equal(idx[src[r]], e);             /* grouped by expert */
            if (r > off[e])
                assert_true(src[r] > src[r - 1]);         /* stable: token order */
        }
    }
    for (int i = 0; i < N * K; i++)
        assert_int_equal(src[slot[i]], i);                /* inverse */
    free(idx), free(off), free(src), free(slot);
}

typedef struct {
    const float *x, *w, *topk_w;
    const int *src, *slot;
    int N, K, C, unpermute;
    double *out;
} perm_ctx;

static double perm_loss(void *p)
{
    perm_ctx *c = p;
    if (c->unpermute) { /* out[t] = sum_j topk_w[t,j] * x[slot[t,j]] */
        for (int t = 0; t < c->N; t++)
            for (int e = 0; e < c->C; e++) {
                double s = 0;
                for (int j = 0; j < c->K; j++)
                    s += (double)c->topk_w[t * c->K + j] *
                         c->x[(size_t)c->slot[t * c->K + j] * c->C + e];
                c->out[(size_t)t * c->C + e] = s;
            }
        return tu_dot_fd(c->w, c->out, (size_t)c->N * c->C);
    }
    for (int r = 0; r < c->N * c->K; r++)
        for (int e = 0; e < c->C; e++)
            c->out[(size_t)r * c->C + e] = c->x[(size_t)(c->src[r] / c->K) * c->C + e];
    return tu_dot_fd(c->w, c->out, (size_t)c->N * c->K * c->C);
}

static void test_permute(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 1 + tu_randint(&rng, 0, 40), E = 3 + tu_randint(&rng, 0, 8);
    int K = 1 + tu_randint(&rng, 0, 3), C = 1 + tu_randint(&rng, 0, 70);
    size_t nr = (size_t)N * K, nx = (size_t)N * C;
    int *idx = tu_ialloc(nr), *off = tu_ialloc(E + 1), *src = tu_ialloc(nr), *slot = tu_ialloc(nr);
    random_topk(&rng, idx, N, E, K);
    kcpu_moe_plan(off, src, slot, idx, N, E, K);
    float *x = tu_falloc(nx), *rows = tu_falloc(nr * C), *back = tu_falloc(nx);
    float *tw = tu_falloc(nr), *wr = tu_falloc(nr * C), *wx = tu_falloc(nx);
    tu_fill_uniform(&rng, x, nx, -1, 1);
    tu_fill_uniform(&rng, tw, nr, 0.1f, 1);
    for (int t = 0; t < N; t++) { /* renormalise like the router */
        float s = 0;
        for (int j = 0; j < K; j++)
            s += tw[t * K + j];
        for (int j = 0; j < K; j++)
            tw[t * K + j] /= s;
    }
    tu_fill_uniform(&rng, wr, nr * C, -1, 1);
    tu_fill_uniform(&rng, wx, nx, -1, 1);

    kcpu_moe_permute_forward(rows, x, src, N, K, C);
    for (size_t r = 0; r < nr; r++)
        assert_memory_equal(rows + r * C, x + (size_t)(src[r] / K) * C, C * sizeof(float));
    /* roundtrip: weights summing to one bring the tokens back */
    kcpu_moe_unpermute_forward(back, rows, tw, slot, N, K, C);
    TU_ASSERT_LE(tu_rel_l2_ff(back, x, nx), 1e-6, &rng, "permute/unpermute roundtrip");

    tu_fd_opts o = {.tol = 1e-5, .max_samples = 300};
    /* permute backward */
    float *dx = tu_falloc(nx);
    kcpu_moe_permute_backward(dx, wr, src, N, K, C);
    perm_ctx pc = {x, wr, tw, src, slot, N, K, C, 0, tu_dalloc(nr * C)};
    TU_ASSERT_FD(x, nx, dx, perm_loss, &pc, &o, &rng, "permute backward");
    /* unpermute backward: expert rows and weights */
    float *drows = tu_falloc(nr * C), *dtw = tu_falloc(nr);
    kcpu_moe_unpermute_backward(drows, dtw, wx, rows, tw, slot, N, K, C);
    perm_ctx uc = {rows, wx, tw, src, slot, N, K, C, 1, pc.out};
    TU_ASSERT_FD(rows, nr * C, drows, perm_loss, &uc, &o, &rng, "unpermute dexpert_out");
    TU_ASSERT_FD(tw, nr, dtw, perm_loss, &uc, &o, &rng, "unpermute dtopk_w");

    /* accumulate and NULL pointers */
    float *d2 = tu_fdup(dx, nx), *dr2 = tu_falloc(nr * C), *dt2 = tu_fdup(dtw, nr);
    kcpu_moe_permute_backward(d2, wr, src, N, K, C);
    kcpu_moe_unpermute_backward(dr2, NULL, wx, rows, tw, slot, N, K, C);
    kcpu_moe_unpermute_backward(NULL, dt2, wx, rows, tw, slot, N, K, C);
    TU_ASSERT_BITWISE(dr2, drows, nr * C, &rng, "unpermute dexpert_out alone");
    kcpu_moe_unpermute_backward(dr2, NULL, wx, rows, tw, slot, N, K, C);
    for (size_t i = 0; i < nr * C; i++)
        drows[i] *= 2;
    TU_ASSERT_LE(tu_rel_l2_ff(dr2, drows, nr * C), 1e-6, &rng, "unpermute accumulate");
    for (size_t i = 0; i < nx; i++)
        dx[i] *= 2;
    for (size_t i = 0; i < nr; i++)
        dtw[i] *= 2;
    TU_ASSERT_LE(tu_rel_l2_ff(d2, dx, nx), 1e-6, &rng, "permute accumulate");
    TU_ASSERT_LE(tu_rel_l2_ff(dt2, dtw, nr), 1e-6, &rng, "unpermute accumulate");
    free(idx), free(off), free(src), free(slot), free(x), free(rows), free(back), free(tw);
    free(wr), free(wx), free(dx), free(pc.out), free(drows), free(dtw), free(d2), free(dr2);
    free(dt2);
}

static void test_threads(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    int N = 300, E = 64, K = 4, C = 200;
    size_t ne = (size_t)N * E, nk = (size_t)N * K;
    float *logits = tu_falloc(ne), *dtw = tu_falloc(nk), *x = tu_falloc((size_t)N * C);
    float *dout = tu_falloc(nk * C);
    tu_fill_normal(&rng, logits, ne, 0, 1);
    tu_fill_uniform(&rng, dtw, nk, -1, 1);
    tu_fill_uniform(&rng, x, (size_t)N * C, -1, 1);
    tu_fill_uniform(&rng, dout, nk * C, -1, 1);
    float *r[2][7];
    float aux[2];
    int *off = tu_ialloc(E + 1), *src = tu_ialloc(nk), *slot = tu_ialloc(nk), *idx = tu_ialloc(nk);
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        float **o = r[t];
        o[0] = tu_falloc(ne), o[1] = tu_falloc(nk), o[2] = tu_falloc(ne);
        o[3] = tu_falloc((size_t)N * C), o[4] = tu_falloc(nk * C), o[5] = tu_falloc((size_t)N * C);
        o[6] = tu_falloc(nk * C);
        kcpu_moe_router_forward(idx, o[1], o[0], &aux[t], logits, N, E, K);
        kcpu_moe_router_backward(o[2], dtw, 0.7f, o[0], idx, o[1], N, E, K);
        kcpu_moe_plan(off, src, slot, idx, N, E, K);
        kcpu_moe_permute_backward(o[3], dout, src, N, K, C);
        kcpu_moe_permute_forward(o[4], x, src, N, K, C);
        kcpu_moe_unpermute_forward(o[5], o[4], o[1], slot, N, K, C);
        kcpu_moe_unpermute_backward(o[6], NULL, o[5], o[4], o[1], slot, N, K, C);
    }
    omp_set_num_threads(2);
    size_t len[7] = {ne, nk, ne, (size_t)N * C, nk * C, (size_t)N * C, nk * C};
    for (int i = 0; i < 7; i++)
        TU_ASSERT_BITWISE(r[0][i], r[1][i], len[i], &rng, "moe 1 vs 2 threads");
    assert_true(aux[0] == aux[1]);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 7; i++)
            free(r[t][i]);
    free(logits), free(dtw), free(x), free(dout), free(off), free(src), free(slot), free(idx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_router_ties),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_permute),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name("kernels_moe", tests, NULL, NULL);
}
