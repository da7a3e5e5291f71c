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
    free(pj->fbuf);
    pj->fbuf = calloc(fa.used ? fa.used : 1, sizeof(float));
    if (!pj->fbuf) {
        pj->cap_units = 0;
        return herr_set(err, HERR_NOMEM, "projector: out of memory for %d tokens", n_units);
    }
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
    norm_forward(pj->sh->norm, pj->hn, pj->mean, pj->rstd, x, pj->norm_w, pj->norm_b, P, C,
                 pj->sh->norm_eps);
    int rc = fp8_linear_forward(pj->fp8, FP8_FC1, 0, U, pj->f1, pj->hn, pj->fc1_w, pj->fc1_b,
                                U, pj->in, pj->hidden, err);
    if (rc)
        return rc;
    kcpu_gelu_forward(pj->g1, pj->f1, (size_t)U * pj->hidden, gelu_of(pj->sh));
    if ((rc = fp8_linear_forward(pj->fp8, FP8_FC2, 0, U, pj->y, pj->g1, pj->fc2_w, pj->fc2_b,
                                 U, pj->hidden, pj->out, err)))
        return rc;
    for (int u = 0; u < U; u++)
        memcpy(y_orig + (size_t)win_idx[u] * pj->out, pj->y + (size_t)u * pj->out,
               (size_t)pj->out * sizeof(float));
    return 0;
}

int projector_backward(projector_part *pj, const float *x, const float *dy_orig, float *dx,
                       const int *win_idx, int U, hearth_err *err)
{
    int C = pj->in / pj->merge2, P = U * pj->merge2;
    for (int u = 0; u < U; u++)
        memcpy(pj->dy + (size_t)u * pj->out, dy_orig + (size_t)win_idx[u] * pj->out,
               (size_t)pj->out * sizeof(float));
    memset(pj->dg1, 0, (size_t)U * pj->hidden * sizeof(float));
    int rc = fp8_linear_backward(pj->fp8, FP8_FC2, 0, pj->dg1, pj->fc2_gw, pj->fc2_gb, pj->dy,
                                 pj->g1, pj->fc2_w, U, pj->hidden, pj->out, err);
    if (rc)
        return rc;
    memset(pj->df1, 0, (size_t)U * pj->hidden * sizeof(float));
    kcpu_gelu_backward(pj->df1, pj->dg1, pj->f1, (size_t)U * pj->hidden, gelu_of(pj->sh));
    memset(pj->dhn, 0, (size_t)P * C * sizeof(float));
    if ((rc = fp8_linear_backward(pj->fp8, FP8_FC1, 0, pj->dhn, pj->fc1_gw, pj->fc1_gb, pj->df1,
                                  pj->hn, pj->fc1_w, U, pj->in, pj->hidden, err)))
        return rc;
    if (dx)
        memset(dx, 0, (size_t)P * C * sizeof(float));
    norm_backward(pj->sh->norm, dx, pj->norm_gw, pj->norm_gb, pj->dhn, x, pj->norm_w,
                  pj->mean, pj->rstd, P, C);
    return 0;
}
