/* moe_route.h - the router's work on one token, shared by the cpu reference
 * (kernels/cpu/moe.c) and the cuda kernel (kernels/cuda/kdev_cuda_moe.cu), so that both
 * compute the same probabilities and choices with the same code (up to the last ulp of
 * each device's exp).
 *
 * probs p[E] = softmax(z[E]) (max subtracted, the sum in double); the K largest in
 * descending order by repeated selection (a strict '>' scanning upwards keeps the lower
 * index on ties) into idx[K]; w[K] = the chosen probabilities renormalised over them.
 *
 * The backward of one token, from its probabilities p[E], choices idx[K], weights w[K],
 * their gradient dw[K] (NULL: none) and a[E], the aux term of dL/dp (the same for every
 * token).  With S = sum_j p_{i_j} and gw = sum_j dw_j w_j:
 *   dp_e = a_e + [e = i_j] (dw_j - gw) / S,   dz_e += p_e (dp_e - sum_k p_k dp_k). */
#ifndef HEARTH_MOE_ROUTE_H
#define HEARTH_MOE_ROUTE_H

#include <math.h>

#ifdef __CUDACC__
#define MOE_ROUTE_FN static inline __host__ __device__
#else
#define MOE_ROUTE_FN static inline
#endif

MOE_ROUTE_FN void moe_route_token(int *idx, float *w, float *p, const float *z, int E, int K)
{
    float mx = z[0];
    for (int e = 1; e < E; e++)
        mx = z[e] > mx ? z[e] : mx;
    double s = 0;
    for (int e = 0; e < E; e++)
        s += exp((double)z[e] - mx);
    for (int e = 0; e < E; e++)
        p[e] = (float)(exp((double)z[e] - mx) / s);
    double chosen = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= idx[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        idx[j] = best;
        chosen += p[best];
    }
    for (int j = 0; j < K; j++)
        w[j] = (float)(p[idx[j]] / chosen);
}

MOE_ROUTE_FN void moe_route_token_backward(float *dz, const float *p, const int *idx,
                                           const float *w, const float *dw, const double *a,
                                           int E, int K)
{
    double S = 0, gw = 0, dot = 0;
    for (int j = 0; j < K; j++) {
        S += p[idx[j]];
        if (dw)
            gw += (double)dw[j] * w[j];
    }
    for (int e = 0; e < E; e++)
        dot += p[e] * a[e];
    if (dw)
        for (int j = 0; j < K; j++)
            dot += p[idx[j]] * ((dw[j] - gw) / S);
    for (int e = 0; e < E; e++) {
        double dp = a[e];
        if (dw)
            for (int j = 0; j < K; j++)
                if (idx[j] == e)
                    dp += (dw[j] - gw) / S;
        dz[e] += (float)(p[e] * (dp - dot));
    }
}

#endif
