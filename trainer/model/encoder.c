/* encoder.c - the ViT encoder (Qwen2.5-VL vision tower) and the projector around it.
 *
 * Forward:
 *   1. Window order (vit_window_index): merge units (merge^2 patches) of every image and
 *      frame are reordered so that the patches of each attention window are contiguous.
 *      The pixels are permuted before the patch embedding, which is per patch, so this is
 *      the same as Qwen's reordering of hidden states right after it.
 *   2. Patch embedding: a linear without bias over [C, temporal_patch, patch, patch]
 *      (Conv3d with stride = kernel).
 *   3. 2-D RoPE angles per patch from its (row, column) in the image's patch grid, in the
 *      same window order (theta = encoder.rope_theta).
 *   4. Blocks (block.c, bidirectional): layers in encoder.full_attn attend within each
 *      frame (h*w patches), the others within each window.  No final norm.
 *   5. Projector (projector.c), which also undoes the window order.
 * Backward runs the projector, then (unless frozen) the blocks and the patch embedding's
 * weight gradient.  Pixels get no gradient. */
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

static int grow(void **p, size_t n, size_t elem)
{
    void *q = realloc(*p, (n ? n : 1) * elem);
    if (!q)
        return -1;
    *p = q;
    return 0;
}

/* A device buffer of n elements in place of *p (whose contents are not kept). */
static int grow_dev(kdev *dev, void **p, size_t n, size_t elem)
{
    kdev_release(dev, *p);
    *p = NULL;
    return kdev_alloc(dev, p, (n ? n : 1) * elem) ? -1 : 0;
}

void encoder_free(model *m)
{
    encoder_part *e = &m->enc;
    kdev *dev = m->dev;
    stack_free(&e->st);
    free(e->pix);
    free(e->cos);
    free(e->sin);
    free(e->pos_hw);
    free(e->unit_rc);
    free(e->win_idx);
    free(e->cu_win);
    free(e->cu_frame);
    kdev_release(dev, e->pix_d);
    kdev_release(dev, e->cos_d);
    kdev_release(dev, e->sin_d);
    kdev_release(dev, e->win_idx_d);
    kdev_release(dev, e->cu_win_d);
    kdev_release(dev, e->cu_frame_d);
    kdev_release(dev, m->proj.fbuf);
    kdev_release(dev, m->img_feat);
    kdev_release(dev, m->dimg_feat);
}

static int reserve(model *m, int P, int U, hearth_err *err)
{
    encoder_part *e = &m->enc;
    int rc;
    if ((rc = stack_reserve(&e->st, P, err)) || (rc = projector_reserve(&m->proj, U, err)))
        return rc;
    kdev *dev = m->dev;
    if (P > e->cap_patches) {
        size_t n = (size_t)P, half = (size_t)e->st.c.D / 2;
        e->cap_patches = 0;
        /* Units, frames and windows never outnumber patches, so P bounds every array. */
        if (grow((void **)&e->pix, n * e->patch_dim, sizeof(float)) ||
            grow((void **)&e->cos, n * half, sizeof(float)) ||
            grow((void **)&e->sin, n * half, sizeof(float)) ||
            grow((void **)&e->pos_hw, 2 * n, sizeof(int)) ||
            grow((void **)&e->unit_rc, 2 * n, sizeof(int)) ||
            grow((void **)&e->win_idx, n, sizeof(int)) ||
            grow((void **)&e->cu_win, n + 1, sizeof(int)) ||
            grow((void **)&e->cu_frame, n + 1, sizeof(int)) ||
            grow_dev(dev, (void **)&e->pix_d, n * e->patch_dim, sizeof(float)) ||
            grow_dev(dev, (void **)&e->cos_d, n * half, sizeof(float)) ||
            grow_dev(dev, (void **)&e->sin_d, n * half, sizeof(float)) ||
            grow_dev(dev, (void **)&e->win_idx_d, n, sizeof(int)) ||
            grow_dev(dev, (void **)&e->cu_win_d, n + 1, sizeof(int)) ||
            grow_dev(dev, (void **)&e->cu_frame_d, n + 1, sizeof(int)))
            return herr_set(err, HERR_NOMEM, "encoder: out of memory for %d patches", P);
        e->cap_patches = P;
    }
    if (U > m->cap_img_units) {
        size_t n = (size_t)U * m->proj.out;
        m->cap_img_units = 0;
        if (grow_dev(dev, (void **)&m->img_feat, n, sizeof(float)) ||
            grow_dev(dev, (void **)&m->dimg_feat, n, sizeof(float)))
            return herr_set(err, HERR_NOMEM, "encoder: out of memory for %d image tokens", U);
        m->cap_img_units = U;
    }
    return 0;
}

int encoder_forward(model *m, int n_images, const int *grid_thw, const float *pixels,
                    hearth_err *err)
{
    encoder_part *e = &m->enc;
    const encoder_shape *es = e->sh;
    int merge = es->spatial_merge, m2 = merge * merge;
    long P = 0, U = 0;
    for (int i = 0; i < n_images; i++) {
        const int *g = grid_thw + 3 * i;
        if (g[0] < 1 || g[1] < 1 || g[2] < 1 || g[1] % merge || g[2] % merge)
            return herr_set(err, HERR_RUNTIME, "encoder: image %d has grid %dx%dx%d; need "
                            "positive sizes with h and w multiples of spatial_merge %d", i,
                            g[0], g[1], g[2], merge);
        P += (long)g[0] * g[1] * g[2];
        if (P > (1L << 28))
            return herr_set(err, HERR_RUNTIME, "encoder: too many patches in one batch");
    }
    U = P / m2;
    int rc = reserve(m, (int)P, (int)U, err);
    if (rc)
        return rc;
    e->n_images = n_images;
    e->n_patches = (int)P;
    e->n_units = (int)U;
    e->n_windows = vit_window_index(e->win_idx, e->cu_win, grid_thw, n_images, merge, e->ws);
    e->n_frames = vit_frame_seqlens(e->cu_frame, grid_thw, n_images);

    /* Top-left patch (row, column) of every unit, original order. */
    int u = 0;
    for (int i = 0; i < n_images; i++) {
        const int *g = grid_thw + 3 * i;
        for (int t = 0; t < g[0]; t++)
            for (int hb = 0; hb < g[1] / merge; hb++)
                for (int wb = 0; wb < g[2] / merge; wb++, u++) {
                    e->unit_rc[2 * u] = hb * merge;
                    e->unit_rc[2 * u + 1] = wb * merge;
                }
    }
    /* Pixels and patch positions in window order. */
    size_t unit_floats = (size_t)m2 * e->patch_dim;
    for (u = 0; u < U; u++) {
        int src = e->win_idx[u];
        memcpy(e->pix + (size_t)u * unit_floats, pixels + (size_t)src * unit_floats,
               unit_floats * sizeof(float));
        for (int mh = 0; mh < merge; mh++)
            for (int mw = 0; mw < merge; mw++) {
                int p = u * m2 + mh * merge + mw;
                e->pos_hw[2 * p] = e->unit_rc[2 * src] + mh;
                e->pos_hw[2 * p + 1] = e->unit_rc[2 * src + 1] + mw;
            }
    }
    kcpu_rope_table_2d(e->cos, e->sin, e->pos_hw, (int)P, e->st.c.D, (float)es->s.rope_theta);

    kdev *dev = m->dev;
    size_t half = (size_t)e->st.c.D / 2;
    if ((rc = dev_upload(dev, e->pix_d, e->pix, (size_t)P * e->patch_dim * sizeof(float),
                         err)) ||
        (rc = dev_upload(dev, e->cos_d, e->cos, (size_t)P * half * sizeof(float), err)) ||
        (rc = dev_upload(dev, e->sin_d, e->sin, (size_t)P * half * sizeof(float), err)) ||
        (rc = dev_upload(dev, e->win_idx_d, e->win_idx, (size_t)U * sizeof(int), err)) ||
        (rc = dev_upload(dev, e->cu_win_d, e->cu_win, ((size_t)e->n_windows + 1) * sizeof(int),
                         err)) ||
        (rc = dev_upload(dev, e->cu_frame_d, e->cu_frame,
                         ((size_t)e->n_frames + 1) * sizeof(int), err)))
        return herr_prefix(err, rc, "encoder");
    kdev_matmul_forward(dev, e->st.xs[0], e->pix_d, e->patch_w, NULL, (int)P, e->patch_dim,
                        e->st.c.H);
    e->ctx = (stack_ctx){
        .N = (int)P, .N_local = (int)P, .cos = e->cos_d, .sin = e->sin_d,
        .cu = e->cu_win_d, .nseq = e->n_windows,
        .max_seq = max_seqlen(e->cu_win, e->n_windows),
        .cu_full = e->cu_frame_d, .nseq_full = e->n_frames,
        .max_seq_full = max_seqlen(e->cu_frame, e->n_frames),
    };
    double aux = 0;
    if ((rc = stack_forward(&e->st, &e->ctx, &aux, err)))
        return rc;
    return projector_forward(&m->proj, e->st.xs[e->st.L], m->img_feat, e->win_idx_d, (int)U,
                             err);
}

int encoder_backward(model *m, hearth_err *err)
{
    encoder_part *e = &m->enc;
    int train_enc = !e->sh->s.freeze;
    int rc = projector_backward(&m->proj, e->st.xs[e->st.L], m->dimg_feat,
                                train_enc ? e->st.sc.dres : NULL, e->win_idx_d, e->n_units,
                                err);
    if (rc || !train_enc)
        return rc;
    rc = stack_backward(&e->st, &e->ctx, 0.0f, err);
    if (rc)
        return rc;
    kdev_matmul_backward(m->dev, NULL, e->patch_gw, NULL, e->st.sc.dres, e->pix_d,
                         e->patch_w, e->n_patches, e->patch_dim, e->st.c.H);
    return dev_check(m->dev, err);
}

/* ---- the encoder API (model_par.h) ------------------------------------------------------ */

int model_encode_forward(model *m, int n_images, const int *grid_thw, const float *pixels,
                         hearth_err *err)
{
    m->enc.n_units = 0;
    if (!m->enc.present)
        return herr_set(err, HERR_RUNTIME, "model: this model holds no vision encoder");
    if (n_images < 0 || (n_images > 0 && (!grid_thw || !pixels)))
        return herr_set(err, HERR_RUNTIME, "model: %d images without grids or pixels",
                        n_images);
    if (n_images == 0)
        return 0;
    return encoder_forward(m, n_images, grid_thw, pixels, err);
}

float *model_img_feat(model *m, int *n_units)
{
    if (n_units)
        *n_units = m->enc.n_units;
    return m->img_feat;
}

float *model_img_grad(model *m)
{
    return m->dimg_feat;
}

int model_encode_backward(model *m, hearth_err *err)
{
    if (!m->enc.present || m->enc.n_units == 0)
        return 0;
    return encoder_backward(m, err);
}
