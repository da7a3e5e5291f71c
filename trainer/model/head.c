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
 * one chunk (whose logits are still in the buffer).
 *
 * With the vocabulary whole on one rank and the head not in FP8, a chunk goes through
 * kdev_head_ce_forward/backward instead: the same composition on the cpu, bit for bit,
 * and on a GPU the fused head whose logits never exist in fp32 (d->logits is then its
 * workspace). */
#include "model/internal.h"

static kdev *st_dev(const decoder_part *d)
{
    return d->st.c.dev;
}

/* Whether the head runs as one fused device op (see above). */
static int head_fused(const decoder_part *d)
{
    return d->tp == 1 && !fp8_linear_uses(d->head_fp8, FP8_LM_HEAD, d->n_tokens);
}

/* Rows r0 .. r0 + n - 1 of the target rows into hc, and their logits. */
static int chunk_logits(decoder_part *d, int r0, int n, hearth_err *err)
{
    kdev *dev = d->st.c.dev;
    int H = d->st.c.H, Vl = d->v1 - d->v0;
    kdev_gather_rows(dev, d->hc, d->hf, d->trow_d + r0, n, H);
    if (head_fused(d))
        return kdev_head_ce_forward(dev, d->logits, d->lse_d + r0, d->losses + r0, d->cmax,
                                    d->csum_d, d->hc, d->head_w, d->ttgt_d + r0, n, H, Vl)
                   ? dev_check(dev, err)
                   : 0;
    return fp8_linear_forward(dev, d->head_fp8, FP8_LM_HEAD, 0, d->n_tokens, d->logits, d->hc,
                              d->head_w, NULL, n, H, Vl, err);
}

/* Cross-entropy of the chunk's n rows: d->losses and d->lse_d from row r0 on, on the
 * device (the statistics reduced over tp there); nothing comes back to the host before
 * head_forward has every chunk's losses. */
static int chunk_loss(decoder_part *d, int r0, int n, hearth_err *err)
{
    kdev *dev = d->st.c.dev;
    int Vl = d->v1 - d->v0, rc;
    kdev_ce_rowmax(dev, d->cmax, d->logits, n, Vl);
    if (d->tp > 1 &&
        (rc = comm_allreduce(d->tp_comm, d->cmax, d->cmax, (size_t)n, COMM_F32, COMM_MAX,
                             err)))
        return herr_prefix(err, rc, "decoder: cross-entropy");
    kdev_ce_rowsum(dev, d->csum_d, d->logits, d->cmax, d->ttgt_d + r0, d->v0, n, Vl);
    if (d->tp > 1 &&
        (rc = comm_allreduce(d->tp_comm, d->csum_d, d->csum_d, 2 * (size_t)n, COMM_F64,
                             COMM_SUM, err)))
        return herr_prefix(err, rc, "decoder: cross-entropy");
    kdev_ce_finish(dev, d->lse_d + r0, d->losses + r0, d->cmax, d->csum_d, n);
    return 0;
}

int head_forward(decoder_part *d, double *loss, hearth_err *err)
{
    int nt = d->n_targets, chunk = d->cap_chunk, rc;
    double sum = 0;
    d->n_chunks = 0;
    for (int r0 = 0; r0 < nt; r0 += chunk, d->n_chunks++) {
        int n = nt - r0 < chunk ? nt - r0 : chunk;
        if ((rc = chunk_logits(d, r0, n, err)) ||
            (!head_fused(d) && (rc = chunk_loss(d, r0, n, err))))
            return rc;
    }
    /* The one host read of the head: every target row's loss, summed in row order. */
    kdev_download(st_dev(d), d->losses_h, d->losses, (size_t)nt * sizeof(float));
    if ((rc = dev_check(st_dev(d), err)))
        return rc;
    for (int r = 0; r < nt; r++)
        sum += d->losses_h[r];
    *loss = sum;
    return 0;
}

int head_backward(decoder_part *d, float loss_scale, hearth_err *err)
{
    kdev *dev = d->st.c.dev;
    int nt = d->n_targets, chunk = d->cap_chunk, H = d->st.c.H, Vl = d->v1 - d->v0, rc;
    kdev_zero(dev, d->dhf, (size_t)d->n_tokens * H * sizeof(float));
    for (int r0 = 0; r0 < nt; r0 += chunk) {
        int n = nt - r0 < chunk ? nt - r0 : chunk;
        if (d->n_chunks > 1 && (rc = chunk_logits(d, r0, n, err)))
            return rc;
        kdev_zero(dev, d->dhc, (size_t)n * H * sizeof(float));
        if (head_fused(d)) {
            kdev_head_ce_backward(dev, d->dhc, d->head_gw, d->logits, d->lse_d + r0,
                                  d->ttgt_d + r0, (double)loss_scale, d->hc, d->head_w, n, H,
                                  Vl);
        } else {
            /* the gradient over the logits: each element is read before it is written */
            kdev_ce_grad(dev, d->logits, d->logits, d->lse_d + r0, d->ttgt_d + r0, d->v0,
                         (double)loss_scale, n, Vl);
            if ((rc = fp8_linear_backward(dev, d->head_fp8, FP8_LM_HEAD, 0, d->dhc,
                                          d->head_gw, NULL, d->logits, d->hc, d->head_w, n, H,
                                          Vl, err)))
                return rc;
        }
        kdev_scatter_rows(dev, d->dhf, d->dhc, d->trow_d + r0, n, H);
    }
    return dev_check(dev, err);
}
