/* moe.c - mixture-of-experts routing: router (softmax, top-k, load-balancing loss),
 * the permutation plan that groups (token, slot) pairs by expert, and the gather /
 * weighted-scatter that move rows between token order and expert order.
 *
 * The router keeps per-expert statistics (E doubles) on the stack: E is the number of
 * experts of one layer (hundreds at most). */
#include "kernels.h"
#include "moe_route.h"

#include <math.h>
#include <string.h>

void kcpu_moe_router_forward(int *topk_idx, float *topk_w, float *probs, float *aux,
                             const float *logits, int N, int E, int K)
{
    if (E <= 0 || K <= 0 || K > E)
        return; /* no valid routing; the model validates E and K on load */
#pragma omp parallel for schedule(static) if ((size_t)N * E >= 16384)
    for (int t = 0; t < N; t++)
        moe_route_token(topk_idx + (size_t)t * K, topk_w + (size_t)t * K,
                        probs + (size_t)t * E, logits + (size_t)t * E, E, K);

    if (aux) {
        /* aux = E * sum_e f_e P_e, f_e = count_e / N, P_e = mean_t probs[t][e] */
        double f[E], P[E];
        for (int e = 0; e < E; e++)
            f[e] = 0, P[e] = 0;
        for (size_t i = 0; i < (size_t)N * K; i++)
            f[topk_idx[i]] += 1.0;
        for (int t = 0; t < N; t++)
            for (int e = 0; e < E; e++)
                P[e] += probs[(size_t)t * E + e];
        double a = 0;
        for (int e = 0; e < E; e++)
            a += (f[e] / N) * (P[e] / N);
        *aux = N > 0 ? (float)(E * a) : 0.0f;
    }
}

/* With p = softmax(z), S = sum_j p_{i_j}, w_j = p_{i_j} / S and gw = sum_j dw_j w_j:
 *   dL/dp_e = daux * E * f_e / N  +  [e = i_j] (dw_j - gw) / S
 *   dL/dz_e = p_e (dL/dp_e - sum_k p_k dL/dp_k)
 * The top-k choice itself is piecewise constant: it has no gradient. */
void kcpu_moe_router_backward(float *dlogits, const float *dtopk_w, float daux,
                              const float *probs, const int *topk_idx, const float *topk_w,
                              int N, int E, int K)
{
    if (N <= 0 || E <= 0 || K <= 0 || K > E)
        return;
    double a[E]; /* the aux term of dL/dp_e, the same for every token */
    for (int e = 0; e < E; e++)
        a[e] = 0;
    if (daux != 0.0f) {
        for (size_t i = 0; i < (size_t)N * K; i++)
            a[topk_idx[i]] += 1.0;
        for (int e = 0; e < E; e++)
            a[e] = (double)daux * E * (a[e] / N) / N;
    }
#pragma omp parallel for schedule(static) if ((size_t)N * E >= 16384)
    for (int t = 0; t < N; t++)
        moe_route_token_backward(dlogits + (size_t)t * E, probs + (size_t)t * E,
                                 topk_idx + (size_t)t * K, topk_w + (size_t)t * K,
                                 dtopk_w ? dtopk_w + (size_t)t * K : NULL, a, E, K);
}

/* Counting sort of the pairs by expert, stable in (token, slot) order. */
void kcpu_moe_plan(int *offsets, int *row_src, int *slot_row, const int *topk_idx,
                   int N, int E, int K)
{
    int pairs = N * K;
    memset(offsets, 0, (size_t)(E + 1) * sizeof *offsets);
    for (int i = 0; i < pairs; i++)
        offsets[topk_idx[i] + 1]++;
    for (int e = 0; e < E; e++)
        offsets[e + 1] += offsets[e];
    /* offsets[e] serves as expert e's fill cursor, which leaves it at the start of e+1;
     * shifting by one afterwards restores the starts. */
    for (int i = 0; i < pairs; i++) {
        int r = offsets[topk_idx[i]]++;
        row_src[r] = i;
        slot_row[i] = r;
    }
    for (int e = E; e > 0; e--)
        offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}

void kcpu_moe_permute_forward(float *out, const float *inp, const int *row_src, int N, int K,
                              int C)
{
    int rows = N * K;
#pragma omp parallel for schedule(static) if ((size_t)rows * C >= 65536)
    for (int r = 0; r < rows; r++)
        memcpy(out + (size_t)r * C, inp + (size_t)(row_src[r] / K) * C, (size_t)C * sizeof *out);
}

/* dinp[t] += sum of the K rows that copied token t.  Threads split columns and walk the
 * rows in order, so each element adds its K terms in row order for any thread count. */
#define PERM_COLS 64
void kcpu_moe_permute_backward(float *dinp, const float *dout, const int *row_src, int N,
                               int K, int C)
{
    int rows = N * K, blocks = (C + PERM_COLS - 1) / PERM_COLS;
#pragma omp parallel for schedule(static) if (blocks > 1 && (size_t)rows * C >= 65536)
    for (int b = 0; b < blocks; b++) {
        int c0 = b * PERM_COLS, c1 = c0 + PERM_COLS < C ? c0 + PERM_COLS : C;
        for (int r = 0; r < rows; r++) {
            float *dst = dinp + (size_t)(row_src[r] / K) * C;
            const float *src = dout + (size_t)r * C;
            for (int c = c0; c < c1; c++)
                dst[c] += src[c];
        }
    }
}

void kcpu_moe_unpermute_forward(float *out, const float *expert_out, const float *topk_w,
                                const int *slot_row, int N, int K, int C)
{
#pragma omp parallel for schedule(static) if ((size_t)N * K * C >= 65536)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int j = 0; j < K; j++)
                s += (double)topk_w[(size_t)t * K + j] *
                     expert_out[(size_t)slot_row[(size_t)t * K + j] * C + c];
            o[c] = (float)s;
        }
    }
}

/* Every expert row belongs to exactly one (token, slot), so splitting tokens over threads
 * never lets two threads touch the same row. */
void kcpu_moe_unpermute_backward(float *dexpert_out, float *dtopk_w, const float *dout,
                                 const float *expert_out, const float *topk_w,
                                 const int *slot_row, int N, int K, int C)
{
#pragma omp parallel for schedule(static) if ((size_t)N * K * C >= 65536)
    for (int t = 0; t < N; t++) {
        const float *g = dout + (size_t)t * C;
        for (int j = 0; j < K; j++) {
            size_t r = (size_t)slot_row[(size_t)t * K + j];
            if (dexpert_out) {
                float w = topk_w[(size_t)t * K + j];
                float *d = dexpert_out + r * C;
                for (int c = 0; c < C; c++)
                    d[c] += w * g[c];
            }
            if (dtopk_w) {
                const float *x = expert_out + r * C;
                double s = 0;
                for (int c = 0; c < C; c++)
                    s += (double)g[c] * x[c];
                dtopk_w[(size_t)t * K + j] += (float)s;
            }
        }
    }
}
