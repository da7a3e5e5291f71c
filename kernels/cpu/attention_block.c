/* attention_block.c - attention of a set of queries against one block of keys, merged
 * into a running result: the piece context parallelism computes per ring step
 * (kernels.h "attention over key blocks").
 *
 * Forward, per (sequence, query head) and query row: the scores of the keys of the block
 * that the query may see (positions inside the sequence decide the causal mask; keys are
 * in increasing position, so the sweep stops at the first key in the query's future),
 * their maximum m, l = sum exp(s - m) (double) and o = sum exp(s - m) v / l (double);
 * the block's log-sum-exp lb = m + log(l) then merges with the running (out, lse) as
 *     M = max(lse, lb),  a = exp(lse - M),  b = exp(lb - M),
 *     out = (a out + b o) / (a + b),  lse = M + log(a + b)
 * (online softmax over blocks).  Backward, per (sequence, kv head) like attention.c:
 * P = exp(S - lse) with the FINAL lse, dP = dO V^T, D_i = dO_i . O_i (double),
 * dS = P (dP - D_i) scale, dQ += dS K, dK += dS^T Q, dV += P^T dO, all accumulated, so
 * summing the calls over every key block gives kcpu_attention_backward's gradients up to
 * the order of the sums.  Each output row is written by one thread (the item that owns
 * its sequence and head), so results do not depend on the thread count. */
#include "kernels.h"

#include <math.h>

typedef struct {
    const float *q, *k, *v;
    const int *q_cu, *q_pos, *k_cu, *k_pos;
    int Hq, Hkv, D, causal;
    float scale;
} blk_dims;

/* Keys [k0, k0 + n) of the block that a query at position qp sees: n. */
static int blk_visible(const blk_dims *a, int s, int qp, int *k0)
{
    int b = a->k_cu[s], e = a->k_cu[s + 1];
    *k0 = b;
    if (!a->causal)
        return e - b;
    int j = b;
    while (j < e && a->k_pos[j] <= qp)
        j++;
    return j - b;
}

static float blk_dot(const float *x, const float *y, int D)
{
    float s = 0.0f;
    for (int c = 0; c < D; c++)
        s += x[c] * y[c];
    return s;
}

static void blk_forward_item(float *out, float *lse, const blk_dims *a, int s, int h)
{
    double acc[KCPU_ATTENTION_BLOCK_MAX_D];
    int g = h / (a->Hq / a->Hkv), D = a->D;
    ptrdiff_t qs = (ptrdiff_t)a->Hq * D, ks = (ptrdiff_t)a->Hkv * D;
    for (int i = a->q_cu[s]; i < a->q_cu[s + 1]; i++) {
        int k0, n = blk_visible(a, s, a->q_pos[i], &k0);
        if (n == 0)
            continue;   /* the whole block is in this query's future */
        const float *qi = a->q + i * qs + (ptrdiff_t)h * D;
        /* two sweeps (max, then sums) recompute the scores instead of keeping them */
        float m = -INFINITY;
        for (int j = 0; j < n; j++) {
            float sj = blk_dot(qi, a->k + (k0 + j) * ks + (ptrdiff_t)g * D, D) * a->scale;
            m = sj > m ? sj : m;
        }
        double l = 0;
        for (int c = 0; c < D; c++)
            acc[c] = 0;
        for (int j = 0; j < n; j++) {
            ptrdiff_t ko = (k0 + j) * ks + (ptrdiff_t)g * D;
            double p = expf(blk_dot(qi, a->k + ko, D) * a->scale - m);
            const float *vj = a->v + ko;
            l += p;
            for (int c = 0; c < D; c++)
                acc[c] += p * vj[c];
        }
        double lb = m + log(l);
        float *o = out + i * qs + (ptrdiff_t)h * D;
        float *L = lse + (ptrdiff_t)i * a->Hq + h;
        if (*L == -INFINITY) {
            for (int c = 0; c < D; c++)
                o[c] = (float)(acc[c] / l);
            *L = (float)lb;
            continue;
        }
        double M = *L > lb ? *L : lb;
        double wa = exp(*L - M), wb = exp(lb - M), den = wa + wb;
        for (int c = 0; c < D; c++)
            o[c] = (float)((wa * o[c] + wb * acc[c] / l) / den);
        *L = (float)(M + log(den));
    }
}

void kcpu_attention_block_forward(float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int *q_cu, const int *q_pos,
                                  const int *k_cu, const int *k_pos, int nseq, int Hq,
                                  int Hkv, int D, int causal)
{
    blk_dims a = { q, k, v, q_cu, q_pos, k_cu, k_pos, Hq, Hkv, D, causal,
                   (float)(1.0 / sqrt((double)D)) };
    int items = nseq * Hq;
    if (D > KCPU_ATTENTION_BLOCK_MAX_D)
        return;   /* documented precondition; callers check it */
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
    for (int it = 0; it < items; it++)
        blk_forward_item(out, lse, &a, it / Hq, it % Hq);
}

typedef struct {
    float *dq, *dk, *dv;
    const float *dout, *out, *lse;
} blk_grads;

static void blk_backward_item(const blk_grads *gr, const blk_dims *a, int s, int g)
{
    int group = a->Hq / a->Hkv, D = a->D;
    ptrdiff_t qs = (ptrdiff_t)a->Hq * D, ks = (ptrdiff_t)a->Hkv * D;
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int i = a->q_cu[s]; i < a->q_cu[s + 1]; i++) {
            int k0, n = blk_visible(a, s, a->q_pos[i], &k0);
            if (n == 0)
                continue;
            ptrdiff_t qo = i * qs + (ptrdiff_t)h * D;
            const float *qi = a->q + qo, *dO = gr->dout + qo, *O = gr->out + qo;
            float l = gr->lse[(ptrdiff_t)i * a->Hq + h];
            double di = 0;
            for (int c = 0; c < D; c++)
                di += (double)dO[c] * O[c];
            for (int j = 0; j < n; j++) {
                ptrdiff_t ko = (k0 + j) * ks + (ptrdiff_t)g * D;
                const float *kj = a->k + ko, *vj = a->v + ko;
                float p = expf(blk_dot(qi, kj, D) * a->scale - l);
                float ds = (float)(p * (blk_dot(dO, vj, D) - di)) * a->scale;
                if (gr->dq)
                    for (int c = 0; c < D; c++)
                        gr->dq[qo + c] += ds * kj[c];
                if (gr->dk)
                    for (int c = 0; c < D; c++)
                        gr->dk[ko + c] += ds * qi[c];
                if (gr->dv)
                    for (int c = 0; c < D; c++)
                        gr->dv[ko + c] += p * dO[c];
            }
        }
}

void kcpu_attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v,
                                   const float *out, const float *lse, const int *q_cu,
                                   const int *q_pos, const int *k_cu, const int *k_pos,
                                   int nseq, int Hq, int Hkv, int D, int causal)
{
    if (!dq && !dk && !dv)
        return;
    blk_dims a = { q, k, v, q_cu, q_pos, k_cu, k_pos, Hq, Hkv, D, causal,
                   (float)(1.0 / sqrt((double)D)) };
    blk_grads gr = { dq, dk, dv, dout, out, lse };
    int items = nseq * Hkv;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
    for (int it = 0; it < items; it++)
        blk_backward_item(&gr, &a, it / Hkv, it % Hkv);
}
