/* attention.c - variable-length grouped-query attention, blocked like flash attention:
 * scores exist only as BQ x BK tiles on the stack, never as an N x N matrix.
 *
 * Forward, per (sequence, query head) and block of BQ queries:
 *   pass 1: sweep key blocks, S = scale * Q K^T, keep the running row max m and
 *           l = sum exp(s - m) (summed in double);  lse = m + log(l)  (saved, as float)
 *   pass 2: sweep key blocks again, P = exp(S - lse), O += P V.
 * Backward, per (sequence, kv head), for the query heads of its group in order:
 *   recompute S and P = exp(S - lse) exactly as pass 2 did (same bits),
 *   dP = dO V^T,  D_i = sum_d dO_i O_i,  dS = P (dP - D_i) scale,
 *   dQ += dS K,  dK += dS^T Q,  dV += P^T dO.
 * Every output row is written by the one thread that owns its (sequence, head) item, and
 * the key/query blocks are visited in a fixed order, so results do not depend on the
 * thread count.  All products go through kgemm_serial (gemm.h). */
#include "kernels.h"

#include <math.h>

#include "cpu/gemm.h"

#define BQ 64
#define BK 64

typedef struct {
    const float *q, *k, *v;
    int Hq, Hkv, D, causal;
    float scale;
    ptrdiff_t qs, ks, vs, os;   /* row strides of q (and dq), k (dk), v (dv), out (dout) */
} attn_dims;

static attn_dims dims(const float *q, const float *k, const float *v, int ldq, int ldk,
                      int ldv, int Hq, int Hkv, int D, int causal)
{
    attn_dims a = {q, k, v, Hq, Hkv, D, causal, (float)(1.0 / sqrt((double)D)), 0, 0, 0, 0};
    a.os = (ptrdiff_t)Hq * D;
    a.qs = ldq > 0 ? ldq : a.os;
    a.ks = ldk > 0 ? ldk : (ptrdiff_t)Hkv * D;
    a.vs = ldv > 0 ? ldv : (ptrdiff_t)Hkv * D;
    return a;
}

/* S[i][j] = scale * q_{q0+i} . k_{k0+j} (absolute token indices), for one head pair. */
static void scores(float *S, const attn_dims *a, int h, int g, int q0, int nq, int k0, int nk)
{
    ptrdiff_t qs = a->qs, ks = a->ks;
    kgemm_serial(S, BK, a->q + q0 * qs + (ptrdiff_t)h * a->D, qs, 1,
                 a->k + k0 * ks + (ptrdiff_t)g * a->D, 1, ks, nq, nk, a->D, 0);
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++)
            S[i * BK + j] *= a->scale;
}

/* Keys of a block that query rq (position inside the sequence) may see: j < visible.
 * Causal: key rk0 + j is visible when rk0 + j <= rq. */
static int visible(const attn_dims *a, int rq, int rk0, int nk)
{
    if (!a->causal)
        return nk;
    int v = rq - rk0 + 1;
    return v < 0 ? 0 : v > nk ? nk : v;
}

/* P = exp(S - lse) in place, 0 where masked.  rq0/rk0: positions inside the sequence. */
static void probs(float *S, const attn_dims *a, const float *lse_row, ptrdiff_t lse_stride,
                  int rq0, int nq, int rk0, int nk)
{
    for (int i = 0; i < nq; i++) {
        float l = lse_row[i * lse_stride], *s = S + i * BK;
        int nv = visible(a, rq0 + i, rk0, nk);
        for (int j = 0; j < nv; j++)
            s[j] = expf(s[j] - l);
        for (int j = nv; j < nk; j++)
            s[j] = 0.0f;
    }
}

static void forward_item(float *out, float *lse, const attn_dims *a, int start, int L, int h)
{
    float S[BQ * BK];
    double m[BQ], l[BQ];
    int g = h / (a->Hq / a->Hkv);
    ptrdiff_t os = a->os, vs = a->vs;

    for (int rq0 = 0; rq0 < L; rq0 += BQ) {
        int nq = L - rq0 < BQ ? L - rq0 : BQ;
        int kend = a->causal ? rq0 + nq : L; /* keys this query block can see */
        for (int i = 0; i < nq; i++)
            m[i] = -INFINITY, l[i] = 0.0;
        for (int rk0 = 0; rk0 < kend; rk0 += BK) {
            int nk = kend - rk0 < BK ? kend - rk0 : BK;
            scores(S, a, h, g, start + rq0, nq, start + rk0, nk);
            for (int i = 0; i < nq; i++) {
                const float *s = S + i * BK;
                int nv = visible(a, rq0 + i, rk0, nk);
                if (nv == 0)
                    continue; /* the whole block is in this query's future */
                float bm = s[0];
                for (int j = 1; j < nv; j++)
                    bm = s[j] > bm ? s[j] : bm;
                if (bm > m[i]) {
                    l[i] *= exp(m[i] - bm);
                    m[i] = bm;
                }
                /* m is a float, so s - m is formed in float like the exp(s - lse) of
                 * pass 2; the terms are summed in double */
                float mf = (float)m[i];
                double sum = 0;
                for (int j = 0; j < nv; j++)
                    sum += expf(s[j] - mf);
                l[i] += sum;
            }
        }
        float *lse_blk = lse + (ptrdiff_t)(start + rq0) * a->Hq + h;
        for (int i = 0; i < nq; i++)
            lse_blk[(ptrdiff_t)i * a->Hq] = (float)(m[i] + log(l[i]));

        float *o = out + (ptrdiff_t)(start + rq0) * os + (ptrdiff_t)h * a->D;
        for (int rk0 = 0; rk0 < kend; rk0 += BK) {
            int nk = kend - rk0 < BK ? kend - rk0 : BK;
            scores(S, a, h, g, start + rq0, nq, start + rk0, nk);
            probs(S, a, lse_blk, a->Hq, rq0, nq, rk0, nk);
            kgemm_serial(o, os, S, BK, 1, a->v + (ptrdiff_t)(start + rk0) * vs + (ptrdiff_t)g * a->D,
                         vs, 1, nq, a->D, nk, rk0 > 0);
        }
    }
}

void kcpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, const int *cu_seqlens, int nseq, int Hq, int Hkv,
                            int D, int causal)
{
    kcpu_attention_forward_ld(out, lse, q, k, v, 0, 0, 0, cu_seqlens, nseq, Hq, Hkv, D,
                              causal);
}

void kcpu_attention_forward_ld(float *out, float *lse, const float *q, const float *k,
                               const float *v, int ldq, int ldk, int ldv,
                               const int *cu_seqlens, int nseq, int Hq, int Hkv, int D,
                               int causal)
{
    attn_dims a = dims(q, k, v, ldq, ldk, ldv, Hq, Hkv, D, causal);
    int items = nseq * Hq;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
    for (int it = 0; it < items; it++) {
        int s = it / Hq, h = it % Hq;
        int start = cu_seqlens[s], L = cu_seqlens[s + 1] - start;
        if (L > 0)
            forward_item(out, lse, &a, start, L, h);
    }
}

typedef struct {
    float *dq, *dk, *dv;
    const float *dout, *out, *lse;
} attn_grads;

static void backward_item(const attn_grads *gr, const attn_dims *a, int start, int L, int g)
{
    float P[BQ * BK], dS[BQ * BK];
    double Di[BQ];
    int group = a->Hq / a->Hkv;
    ptrdiff_t qs = a->qs, ks = a->ks, vs = a->vs, os = a->os;

    for (int h = g * group; h < (g + 1) * group; h++) {
        for (int rq0 = 0; rq0 < L; rq0 += BQ) {
            int nq = L - rq0 < BQ ? L - rq0 : BQ;
            int kend = a->causal ? rq0 + nq : L;
            ptrdiff_t qoff = (ptrdiff_t)(start + rq0) * qs + (ptrdiff_t)h * a->D;
            ptrdiff_t ooff = (ptrdiff_t)(start + rq0) * os + (ptrdiff_t)h * a->D;
            const float *dO = gr->dout + ooff, *O = gr->out + ooff, *Q = a->q + qoff;
            const float *lse_blk = gr->lse + (ptrdiff_t)(start + rq0) * a->Hq + h;
            for (int i = 0; i < nq; i++) {
                double d = 0;
                for (int c = 0; c < a->D; c++)
                    d += (double)dO[i * os + c] * O[i * os + c];
                Di[i] = d;
            }
            for (int rk0 = 0; rk0 < kend; rk0 += BK) {
                int nk = kend - rk0 < BK ? kend - rk0 : BK;
                ptrdiff_t koff = (ptrdiff_t)(start + rk0) * ks + (ptrdiff_t)g * a->D;
                ptrdiff_t voff = (ptrdiff_t)(start + rk0) * vs + (ptrdiff_t)g * a->D;
                scores(P, a, h, g, start + rq0, nq, start + rk0, nk);
                probs(P, a, lse_blk, a->Hq, rq0, nq, rk0, nk);
                /* dP = dO . V^T */
                kgemm_serial(dS, BK, dO, os, 1, a->v + voff, 1, vs, nq, nk, a->D, 0);
                for (int i = 0; i < nq; i++)
                    for (int j = 0; j < nk; j++)
                        dS[i * BK + j] =
                            (float)(P[i * BK + j] * (dS[i * BK + j] - Di[i])) * a->scale;
                if (gr->dq)
                    kgemm_serial(gr->dq + qoff, qs, dS, BK, 1, a->k + koff, ks, 1, nq, a->D, nk, 1);
                if (gr->dk)
                    kgemm_serial(gr->dk + koff, ks, dS, 1, BK, Q, qs, 1, nk, a->D, nq, 1);
                if (gr->dv)
                    kgemm_serial(gr->dv + voff, vs, P, 1, BK, dO, os, 1, nk, a->D, nq, 1);
            }
        }
    }
}

void kcpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                             const float *q, const float *k, const float *v, const float *out,
                             const float *lse, const int *cu_seqlens, int nseq, int Hq,
                             int Hkv, int D, int causal)
{
    kcpu_attention_backward_ld(dq, dk, dv, dout, q, k, v, out, lse, 0, 0, 0, cu_seqlens, nseq,
                               Hq, Hkv, D, causal);
}

void kcpu_attention_backward_ld(float *dq, float *dk, float *dv, const float *dout,
                                const float *q, const float *k, const float *v,
                                const float *out, const float *lse, int ldq, int ldk, int ldv,
                                const int *cu_seqlens, int nseq, int Hq, int Hkv, int D,
                                int causal)
{
    if (!dq && !dk && !dv)
        return;
    attn_dims a = dims(q, k, v, ldq, ldk, ldv, Hq, Hkv, D, causal);
    attn_grads gr = {dq, dk, dv, dout, out, lse};
    /* One item per (sequence, kv head): dk/dv rows of a kv head collect the
     * contributions of all query heads of its group, in head order, in one thread. */
    int items = nseq * Hkv;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
    for (int it = 0; it < items; it++) {
        int s = it / Hkv, g = it % Hkv;
        int start = cu_seqlens[s], L = cu_seqlens[s + 1] - start;
        if (L > 0)
            backward_item(&gr, &a, start, L, g);
    }
}
