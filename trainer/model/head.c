/* head.c - the LM head and softmax cross-entropy, vocabulary-parallel (model_par.h).
 *
 * Each tp rank holds the head rows of its vocabulary slice [v0, v1) and computes those
 * logits only; the cross-entropy of a row needs three numbers reduced over tp: the row
 * maximum (MAX), the sum of exp(logit - max) (SUM, in double) and the target logit (SUM;
 * only the rank owning the target contributes).  Logits are never gathered.  With one
 * rank the arithmetic is kcpu_crossentropy_*'s, operation for operation, so the
 * single-rank model computes what the kernel would.
 *
 * Only rows with a target go through the head, in chunks of a fixed number of rows so
 * that the logits buffer stays bounded for large vocabularies.  The forward keeps each
 * row's log-sum-exp; the backward recomputes a chunk's logits, unless all rows fitted in
 * one chunk (whose logits are still in the buffer). */
#include <math.h>
#include <string.h>

#include "model/internal.h"

/* Rows r0 .. r0 + n - 1 of the target rows into hc / tchunk, and their logits. */
static int chunk_logits(decoder_part *d, int r0, int n, hearth_err *err)
{
    int H = d->st.c.H, Vl = d->v1 - d->v0;
    for (int r = 0; r < n; r++) {
        int i = d->trow[r0 + r];
        memcpy(d->hc + (size_t)r * H, d->hf + (size_t)i * H, (size_t)H * sizeof(float));
        d->tchunk[r] = d->tgt[i];
    }
    return fp8_linear_forward(d->head_fp8, FP8_LM_HEAD, 0, d->n_tokens, d->logits, d->hc,
                              d->head_w, NULL, n, H, Vl, err);
}

/* Cross-entropy of the chunk's n rows: d->losses, and d->lse from row r0 on. */
static int chunk_loss(decoder_part *d, int r0, int n, hearth_err *err)
{
    int Vl = d->v1 - d->v0, rc;
    int par = (size_t)n * (size_t)Vl >= 16384;
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < n; r++) {
        const float *x = d->logits + (size_t)r * Vl;
        float mx = -INFINITY;
        for (int j = 0; j < Vl; j++)
            mx = x[j] > mx ? x[j] : mx;
        d->cmax[r] = mx;
    }
    if (d->tp > 1 &&
        (rc = comm_allreduce(d->tp_comm, d->cmax, d->cmax, (size_t)n, COMM_F32, COMM_MAX,
                             err)))
        return herr_prefix(err, rc, "decoder: cross-entropy");
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < n; r++) {
        const float *x = d->logits + (size_t)r * Vl;
        float mx = d->cmax[r];
        double s = 0;
        for (int j = 0; j < Vl; j++)
            s += exp((double)x[j] - mx);
        int t = d->tchunk[r];
        d->csum[r] = s;
        d->csum[n + r] = t >= d->v0 && t < d->v1 ? (double)x[t - d->v0] : 0.0;
    }
    if (d->tp > 1 &&
        (rc = comm_allreduce(d->tp_comm, d->csum, d->csum, 2 * (size_t)n, COMM_F64, COMM_SUM,
                             err)))
        return herr_prefix(err, rc, "decoder: cross-entropy");
    for (int r = 0; r < n; r++) {
        double lse = d->cmax[r] + log(d->csum[r]);
        d->lse[r0 + r] = lse;
        d->losses[r] = (float)(lse - d->csum[n + r]);
    }
    return 0;
}

int head_forward(decoder_part *d, double *loss, hearth_err *err)
{
    int nt = d->n_targets, chunk = d->cap_chunk, rc;
    double sum = 0;
    d->n_chunks = 0;
    for (int r0 = 0; r0 < nt; r0 += chunk, d->n_chunks++) {
        int n = nt - r0 < chunk ? nt - r0 : chunk;
        if ((rc = chunk_logits(d, r0, n, err)) || (rc = chunk_loss(d, r0, n, err)))
            return rc;
        for (int r = 0; r < n; r++)
            sum += d->losses[r];
    }
    *loss = sum;
    return 0;
}

int head_backward(decoder_part *d, float loss_scale, hearth_err *err)
{
    int nt = d->n_targets, chunk = d->cap_chunk, H = d->st.c.H, Vl = d->v1 - d->v0, rc;
    double dl = loss_scale;
    memset(d->dhf, 0, (size_t)d->n_tokens * H * sizeof(float));
    for (int r0 = 0; r0 < nt; r0 += chunk) {
        int n = nt - r0 < chunk ? nt - r0 : chunk;
        if (d->n_chunks > 1 && (rc = chunk_logits(d, r0, n, err)))
            return rc;
#pragma omp parallel for schedule(static) if ((size_t)n * Vl >= 16384)
        for (int r = 0; r < n; r++) {
            const float *x = d->logits + (size_t)r * Vl;
            float *dx = d->dlogits + (size_t)r * Vl;
            double lse = d->lse[r0 + r];
            int t = d->tchunk[r] - d->v0;   /* outside [0, Vl): not this rank's */
            for (int j = 0; j < Vl; j++) {
                double p = exp((double)x[j] - lse);
                dx[j] = (float)(dl * (j == t ? p - 1.0 : p));
            }
        }
        memset(d->dhc, 0, (size_t)n * H * sizeof(float));
        if ((rc = fp8_linear_backward(d->head_fp8, FP8_LM_HEAD, 0, d->dhc, d->head_gw, NULL,
                                      d->dlogits, d->hc, d->head_w, n, H, Vl, err)))
            return rc;
        for (int r = 0; r < n; r++)
            memcpy(d->dhf + (size_t)d->trow[r0 + r] * H, d->dhc + (size_t)r * H,
                   (size_t)H * sizeof(float));
    }
    return 0;
}
