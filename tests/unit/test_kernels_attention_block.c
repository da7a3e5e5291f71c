/* test_kernels_attention_block.c - attention over key blocks (the context-parallel
 * pieces) against kcpu_attention_forward/backward on the whole sequences.
 *
 * Random sequences (lengths multiples of 2 cp) are cut into 2 cp chunks, rank r holding
 * chunks r and 2 cp - 1 - r of every sequence (the load-balanced causal layout).  Each
 * rank merges every rank's key block into its queries' result in ring order (its own
 * first) and accumulates the backward of every block; gathered back, out, lse, dq, dk,
 * dv must equal the full kernel's.  Tolerances: the two compute the same sums in another
 * order (fp32 dot products and a merge of normalised partial results), so relative L2
 * errors of a few 1e-7 are expected; 1e-5 leaves margin while any masking or merging
 * error (a key seen twice, a block missed, a wrong position) is of order 1e-1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "support/testutil.h"

#define TOL 1e-5

/* Global row of local row i of rank r (sequences of lengths lens, cut into 2 cp). */
static void rank_rows(int *grow, int *pos, int *cu, const int *lens, const int *gcu,
                      int nseq, int cp, int r)
{
    int n = 0;
    cu[0] = 0;
    for (int s = 0; s < nseq; s++) {
        int C = lens[s] / (2 * cp);
        int ch[2] = { r, 2 * cp - 1 - r };
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < C; j++) {
                pos[n] = ch[k] * C + j;
                grow[n++] = gcu[s] + ch[k] * C + j;
            }
        cu[s + 1] = n;
    }
}

static void gather_rows(float *dst, const float *src, const int *grow, int n, size_t w)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + i * w, src + (size_t)grow[i] * w, w * sizeof(float));
}

static void scatter_rows(float *dst, const float *src, const int *grow, int n, size_t w)
{
    for (int i = 0; i < n; i++)
        memcpy(dst + (size_t)grow[i] * w, src + i * w, w * sizeof(float));
}

static void check_case(tu_rng *rng, int nseq, int cp, int Hq, int Hkv, int D, int causal)
{
    int *lens = tu_ialloc(nseq), *gcu = tu_ialloc(nseq + 1);
    for (int s = 0; s < nseq; s++) {
        lens[s] = 2 * cp * tu_randint(rng, 1, 12);
        gcu[s + 1] = gcu[s] + lens[s];
    }
    int N = gcu[nseq], Nl = N / cp;
    size_t wq = (size_t)Hq * D, wk = (size_t)Hkv * D;
    float *q = tu_falloc(N * wq), *k = tu_falloc(N * wk), *v = tu_falloc(N * wk);
    float *dout = tu_falloc(N * wq);
    tu_fill_normal(rng, q, N * wq, 0, 1);
    tu_fill_normal(rng, k, N * wk, 0, 1);
    tu_fill_normal(rng, v, N * wk, 0, 1);
    tu_fill_normal(rng, dout, N * wq, 0, 1);
    float *out = tu_falloc(N * wq), *lse = tu_falloc((size_t)N * Hq);
    float *dq = tu_falloc(N * wq), *dk = tu_falloc(N * wk), *dv = tu_falloc(N * wk);
    int *cu = tu_ialloc(nseq + 1);
    for (int s = 0; s <= nseq; s++)
        cu[s] = gcu[s];
    kcpu_attention_forward(out, lse, q, k, v, cu, nseq, Hq, Hkv, D, causal);
    kcpu_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu, nseq, Hq, Hkv, D,
                            causal);

    /* per rank: rows, positions, local tensors */
    int *grow = tu_ialloc((size_t)cp * Nl), *pos = tu_ialloc((size_t)cp * Nl);
    int *lcu = tu_ialloc((size_t)cp * (nseq + 1));
    float *lq = tu_falloc((size_t)cp * Nl * wq), *lk = tu_falloc((size_t)cp * Nl * wk);
    float *lv = tu_falloc((size_t)cp * Nl * wk), *ldo = tu_falloc((size_t)cp * Nl * wq);
    float *lo = tu_falloc((size_t)cp * Nl * wq), *ll = tu_falloc((size_t)cp * Nl * Hq);
    float *ldq = tu_falloc((size_t)cp * Nl * wq), *ldk = tu_falloc((size_t)cp * Nl * wk);
    float *ldv = tu_falloc((size_t)cp * Nl * wk);
    for (int r = 0; r < cp; r++) {
        size_t o = (size_t)r * Nl;
        rank_rows(grow + o, pos + o, lcu + (size_t)r * (nseq + 1), lens, gcu, nseq, cp, r);
        gather_rows(lq + o * wq, q, grow + o, Nl, wq);
        gather_rows(lk + o * wk, k, grow + o, Nl, wk);
        gather_rows(lv + o * wk, v, grow + o, Nl, wk);
        gather_rows(ldo + o * wq, dout, grow + o, Nl, wq);
        for (size_t i = 0; i < (size_t)Nl * Hq; i++)
            ll[o * Hq + i] = -INFINITY;
        for (size_t i = 0; i < (size_t)Nl * wq; i++)
            lo[o * wq + i] = 1e30f;   /* not read while lse is -inf */
    }
    for (int r = 0; r < cp; r++)
        for (int step = 0; step < cp; step++) {
            int b = (r - step + cp) % cp;   /* ring order: own block first */
            size_t o = (size_t)r * Nl, ob = (size_t)b * Nl;
            kcpu_attention_block_forward(lo + o * wq, ll + o * Hq, lq + o * wq, lk + ob * wk,
                                         lv + ob * wk, lcu + (size_t)r * (nseq + 1), pos + o,
                                         lcu + (size_t)b * (nseq + 1), pos + ob, nseq, Hq,
                                         Hkv, D, causal);
        }
    for (int r = 0; r < cp; r++)
        for (int step = 0; step < cp; step++) {
            int b = (r - step + cp) % cp;
            size_t o = (size_t)r * Nl, ob = (size_t)b * Nl;
            kcpu_attention_block_backward(ldq + o * wq, ldk + ob * wk, ldv + ob * wk,
                                          ldo + o * wq, lq + o * wq, lk + ob * wk,
                                          lv + ob * wk, lo + o * wq, ll + o * Hq,
                                          lcu + (size_t)r * (nseq + 1), pos + o,
                                          lcu + (size_t)b * (nseq + 1), pos + ob, nseq, Hq,
                                          Hkv, D, causal);
        }
    float *g[5] = { tu_falloc(N * wq), tu_falloc((size_t)N * Hq), tu_falloc(N * wq),
                    tu_falloc(N * wk), tu_falloc(N * wk) };
    for (int r = 0; r < cp; r++) {
        size_t o = (size_t)r * Nl;
        scatter_rows(g[0], lo + o * wq, grow + o, Nl, wq);
        scatter_rows(g[1], ll + o * Hq, grow + o, Nl, (size_t)Hq);
        scatter_rows(g[2], ldq + o * wq, grow + o, Nl, wq);
        scatter_rows(g[3], ldk + o * wk, grow + o, Nl, wk);
        scatter_rows(g[4], ldv + o * wk, grow + o, Nl, wk);
    }
    const float *ref[5] = { out, lse, dq, dk, dv };
    size_t len[5] = { N * wq, (size_t)N * Hq, N * wq, N * wk, N * wk };
    static const char *const name[5] = { "out", "lse", "dq", "dk", "dv" };
    for (int t = 0; t < 5; t++) {
        char what[160];
        snprintf(what, sizeof what, "block attention %s: nseq %d N %d cp %d Hq %d Hkv %d D %d "
                 "causal %d", name[t], nseq, N, cp, Hq, Hkv, D, causal);
        TU_ASSERT_LE(tu_rel_l2_ff(g[t], ref[t], len[t]), TOL, rng, what);
        free(g[t]);
    }
    free(lens), free(gcu), free(cu), free(q), free(k), free(v), free(dout), free(out);
    free(lse), free(dq), free(dk), free(dv), free(grow), free(pos), free(lcu), free(lq);
    free(lk), free(lv), free(ldo), free(lo), free(ll), free(ldq), free(ldk), free(ldv);
}

static void test_ring_equals_full(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    static const int heads[][2] = { { 2, 2 }, { 4, 2 }, { 4, 1 }, { 3, 3 } };
    for (int rep = 0; rep < 6; rep++) {
        int cp = tu_randint(&rng, 1, 5);
        int hi = tu_randint(&rng, 0, 4);
        int D = 4 * tu_randint(&rng, 1, 9);
        check_case(&rng, tu_randint(&rng, 1, 4), cp, heads[hi][0], heads[hi][1], D, 1);
        check_case(&rng, tu_randint(&rng, 1, 3), cp, heads[hi][0], heads[hi][1], D, 0);
    }
}

/* A block wholly in the queries' future leaves out and lse untouched, bit for bit. */
static void test_future_block_skipped(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    int n = 8, Hq = 2, Hkv = 1, D = 8;
    float *q = tu_falloc((size_t)n * Hq * D), *k = tu_falloc((size_t)n * Hkv * D);
    float *v = tu_falloc((size_t)n * Hkv * D), *o = tu_falloc((size_t)n * Hq * D);
    float *l = tu_falloc((size_t)n * Hq);
    tu_fill_normal(&rng, q, (size_t)n * Hq * D, 0, 1);
    tu_fill_normal(&rng, k, (size_t)n * Hkv * D, 0, 1);
    tu_fill_normal(&rng, v, (size_t)n * Hkv * D, 0, 1);
    tu_fill_normal(&rng, o, (size_t)n * Hq * D, 0, 1);
    tu_fill_normal(&rng, l, (size_t)n * Hq, 0, 1);
    float *o0 = tu_fdup(o, (size_t)n * Hq * D), *l0 = tu_fdup(l, (size_t)n * Hq);
    int cu[2] = { 0, n }, qp[8], kp[8];
    for (int i = 0; i < n; i++)
        qp[i] = i, kp[i] = n + i;
    kcpu_attention_block_forward(o, l, q, k, v, cu, qp, cu, kp, 1, Hq, Hkv, D, 1);
    TU_ASSERT_BITWISE(o, o0, (size_t)n * Hq * D, &rng, "future block: out");
    TU_ASSERT_BITWISE(l, l0, (size_t)n * Hq, &rng, "future block: lse");
    free(q), free(k), free(v), free(o), free(l), free(o0), free(l0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_equals_full),
        cmocka_unit_test(test_future_block_skipped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
