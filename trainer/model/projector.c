/* projector.c - Qwen2.5-VL's patch merger.
 *
 *   hn = norm(x)                         per patch, over the encoder width
 *   view hn as [U, merge^2 * enc_hidden] (the merge^2 patches of a unit are adjacent)
 *   y  = fc2(gelu(fc1(hn)))              biases per projector.bias
 *
 * The encoder runs in window order; the merged tokens are put back into the original
 * (per-image row-major) unit order here, which is Qwen's final argsort(window_index). */
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

static void take(projector_part *pj, farena *fa, int U)
{
    size_t u = (size_t)U, P = u * pj->merge2, c = (size_t)(pj->in / pj->merge2);
    pj->hn = fa_take(fa, P * c);
    pj->mean = fa_take(fa, P);
    pj->rstd = fa_take(fa, P);
    pj->f1 = fa_take(fa, u * pj->hidden);
    pj->g1 = fa_take(fa, u * pj->hidden);
    pj->y = fa_take(fa, u * pj->out);
    pj->dy = fa_take(fa, u * pj->out);
    pj->dg1 = fa_take(fa, u * pj->hidden);
    pj->df1 = fa_take(fa, u * pj->hidden);
    pj->dhn = fa_take(fa, P * c);
}

int projector_reserve(projector_part *pj, int n_units, hearth_err *err)
{
    if (n_units <= pj->cap_units && pj->fbuf)
        return 0;
    farena fa = { NULL, 0 };
    take(pj, &fa, n_units);
    kdev_release(pj->dev, pj->fbuf);
    pj->fbuf = NULL;
    pj->cap_units = 0;
    int rc = dev_alloc(pj->dev, (void **)&pj->fbuf, fa.used * sizeof(float), "projector", err);
    if (rc)
        return herr_prefix(err, rc, "projector: %d tokens", n_units);
    fa.base = pj->fbuf;
    fa.used = 0;
    take(pj, &fa, n_units);
    pj->cap_units = n_units;
    return 0;
}

static kgelu_kind gelu_of(const projector_shape *s)
{
    return s->gelu == GELU_ERF ? KGELU_ERF : KGELU_TANH;
}

int projector_forward(projector_part *pj, const float *x, float *y_orig, const int *win_idx,
                      int U, hearth_err *err)
{
    int C = pj->in / pj->merge2, P = U * pj->merge2;
    kdev *dev = pj->dev;
    norm_forward(dev, pj->sh->norm, pj->hn, pj->mean, pj->rstd, x, pj->norm_w, pj->norm_b, P, C,
                 pj->sh->norm_eps);
    int rc = fp8_linear_forward(dev, pj->fp8, FP8_FC1, 0, U, pj->f1, pj->hn, pj->fc1_w, pj->fc1_b,
                                U, pj->in, pj->hidden, err);
    if (rc)
        return rc;
    kdev_gelu_forward(dev, pj->g1, pj->f1, (size_t)U * pj->hidden, gelu_of(pj->sh));
    if ((rc = fp8_linear_forward(dev, pj->fp8, FP8_FC2, 0, U, pj->y, pj->g1, pj->fc2_w, pj->fc2_b,
                                 U, pj->hidden, pj->out, err)))
        return rc;
    kdev_scatter_rows(dev, y_orig, pj->y, win_idx, U, pj->out);
    return dev_check(dev, err);
}

int projector_backward(projector_part *pj, const float *x, const float *dy_orig, float *dx,
                       const int *win_idx, int U, hearth_err *err)
{
    int C = pj->in / pj->merge2, P = U * pj->merge2;
    kdev *dev = pj->dev;
    kdev_gather_rows(dev, pj->dy, dy_orig, win_idx, U, pj->out);
    kdev_zero(dev, pj->dg1, (size_t)U * pj->hidden * sizeof(float));
    int rc = fp8_linear_backward(dev, pj->fp8, FP8_FC2, 0, pj->dg1, pj->fc2_gw, pj->fc2_gb, pj->dy,
                                 pj->g1, pj->fc2_w, U, pj->hidden, pj->out, err);
    if (rc)
        return rc;
    kdev_zero(dev, pj->df1, (size_t)U * pj->hidden * sizeof(float));
    kdev_gelu_backward(dev, pj->df1, pj->dg1, pj->f1, (size_t)U * pj->hidden, gelu_of(pj->sh));
    kdev_zero(dev, pj->dhn, (size_t)P * C * sizeof(float));
    if ((rc = fp8_linear_backward(dev, pj->fp8, FP8_FC1, 0, pj->dhn, pj->fc1_gw, pj->fc1_gb, pj->df1,
                                  pj->hn, pj->fc1_w, U, pj->in, pj->hidden, err)))
        return rc;
    if (dx)
        kdev_zero(dev, dx, (size_t)P * C * sizeof(float));
    norm_backward(dev, pj->sh->norm, dx, pj->norm_gw, pj->norm_gb, pj->dhn, x, pj->norm_w,
                  pj->mean, pj->rstd, P, C);
    return dev_check(dev, err);
}
