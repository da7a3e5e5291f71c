/* ptrain_encode.c - the encoder strategies (DESIGN.md "encoder strategies";
 * docs/parallel/).
 *
 * Grouped (uniform, hetero_tp, hetero_dp): stage 0's decoder TP group holds R = tp / etp
 * encoder replicas (replica r: the ranks with t / etp == r, an encoder TP group of etp
 * ranks).  Micro batches are encoded in groups of R: when the first micro batch of a group
 * reaches the embedding, replica r encodes micro batch first + r (none past the end: a mock
 * that encodes nothing), and one all_gatherv over the decoder TP group, fed by each
 * replica's leader (t % etp == 0), gives every tp rank every embedding of the group.
 * uniform is R = 1: the whole TP group encodes each micro batch, no gather.  The gradient
 * of the image rows reaches the embedding with each micro batch's backward (the same on
 * every tp rank); after the group's last micro batch, each replica runs its encoder
 * backward once, on the images it encoded.
 *
 * full_separation: before the pipeline, the model-parallel group (tp x pp ranks) splits
 * all micro batches of the step (micro j to MP rank j % size; the rest are mocks), and one
 * all_gatherv over the MP group routes the variable-size embeddings to everyone.  With
 * offload they are kept packed in a separate buffer and copied into one working buffer
 * right before each micro batch's stage-0 forward (on GPU: pinned host memory and a copy
 * stream).  After the pipeline, the image gradients (on stage 0) are broadcast over the MP
 * group from its rank 0 and each rank runs its encoder backward once.
 *
 * ViT balance (parallel.encoder.balance): the images of a group are reassigned across
 * its encoding ranks by cost patches^2 + c * patches (vit_balance_assign; c from the
 * encoder's FLOP counts), and the gather puts each image's rows back into the micro batch
 * that owns it.  Every rank computes the same assignment from the same data, so nothing
 * about it is communicated.  Encoder outputs do not depend on which images share a batch,
 * so results are the same with and without it. */
#include "parallel/ptrain_internal.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/vit_balance.h"
#include "shape/model_shape.h"

#define BALANCE_ROUNDS 8

int pt_encode_init(ptrain *t, hearth_err *err)
{
    const run_config *c = &t->cfg;
    t->enc_mode = PT_ENC_NONE;
    t->enc_me = -1;
    if (!c->model.encoder.present || !t->has_encoder)
        return 0;
    if (c->parallel.encoder.strategy == ENC_FULL_SEPARATION) {
        t->enc_mode = PT_ENC_FULL_SEPARATION;
        t->enc_group_size = t->M_local;
        t->enc_n_ranks = t->dec->size[PS_MP];
        t->enc_me = t->dec->index[PS_MP];
    } else {
        int etp = t->lay.enc_tp, tk = t->dec->coords.t;
        t->enc_mode = PT_ENC_GROUPED;
        t->enc_n_ranks = t->lay.tp / etp;
        t->enc_group_size = t->enc_n_ranks;
        t->enc_me = tk / etp;
    }
    shape_flops fl;
    shape_count_flops(&c->model, c->train.seq_len, &fl);
    t->enc_linear = fl.encoder_per_patch_sq > 0 ? fl.encoder_per_patch / fl.encoder_per_patch_sq
                                                : 1e12;
    t->groups = calloc((size_t)(t->M_local > 0 ? t->M_local : 1), sizeof *t->groups);
    if (!t->groups)
        return herr_set(err, HERR_NOMEM, "encoder: out of memory");
    return 0;
}

void pt_encode_free(ptrain *t)
{
    if (t->groups)
        for (int j = 0; j < t->M_local; j++)
            free(t->groups[j].mine);
    free(t->groups);
    for (int i = 0; i < t->n_enc_pool; i++)
        model_free(t->enc_pool[i]);
    free(t->enc_pool);
    free(t->enc_pool_busy);
    free(t->assign);
    free(t->owner);
    free(t->patches);
    free(t->grids);
    free(t->pixels);
    free(t->rows);
    free(t->counts);
    free(t->offload);
    free(t->offload_off);
    free(t->img_work);
}

/* ---- encoder activation slots --------------------------------------------------------- */

static int pool_take(ptrain *t, model **out, hearth_err *err)
{
    for (int i = 0; i < t->n_enc_pool; i++)
        if (!t->enc_pool_busy[i]) {
            t->enc_pool_busy[i] = 1;
            *out = t->enc_pool[i];
            return 0;
        }
    int n = t->n_enc_pool;
    model **p = realloc(t->enc_pool, (size_t)(n + 1) * sizeof *p);
    if (!p)
        return herr_set(err, HERR_NOMEM, "encoder: out of memory for slots");
    t->enc_pool = p;
    int *b = realloc(t->enc_pool_busy, (size_t)(n + 1) * sizeof *b);
    if (!b)
        return herr_set(err, HERR_NOMEM, "encoder: out of memory for slots");
    t->enc_pool_busy = b;
    int rc = model_clone(&p[n], t->chunk[0], err);
    if (rc)
        return herr_prefix(err, rc, "encoder slot %d", n);
    b[n] = 1;
    t->n_enc_pool = n + 1;
    *out = p[n];
    return 0;
}

static void pool_give(ptrain *t, model *m)
{
    for (int i = 0; i < t->n_enc_pool; i++)
        if (t->enc_pool[i] == m)
            t->enc_pool_busy[i] = 0;
}

/* ---- assignment ------------------------------------------------------------------------ */

/* The images of micro batches [first, first + count): owner = (j - first) % n_ranks
 * (full_separation: j % n_ranks, the same for first = 0), then balanced when asked.
 * Fills t->assign in (micro, image) order; returns the image count. */
static int assign_group(ptrain *t, int first, int count, hearth_err *err)
{
    int n = 0;
    for (int j = first; j < first + count; j++)
        n += t->micro[j].data.n_images;
    int rc;
    if ((rc = pt_grow((void **)&t->assign, &t->cap_assign, (size_t)n + 1, sizeof(int), err)) ||
        (rc = pt_grow((void **)&t->owner, &t->cap_owner, (size_t)n + 1, sizeof(int), err)) ||
        (rc = pt_grow((void **)&t->patches, &t->cap_patches, (size_t)n + 1, sizeof(int64_t),
                      err)))
        return rc;
    int k = 0;
    for (int j = first; j < first + count; j++) {
        const synth_batch *b = &t->micro[j].data;
        for (int i = 0; i < b->n_images; i++, k++) {
            const int *g = b->grid_thw + 3 * i;
            t->owner[k] = (j - first) % t->enc_n_ranks;
            t->patches[k] = (int64_t)g[0] * g[1] * g[2];
        }
    }
    if (t->cfg.parallel.encoder.balance && t->enc_n_ranks > 1) {
        rc = vit_balance_assign(t->patches, t->owner, n, t->enc_n_ranks, t->enc_linear,
                                BALANCE_ROUNDS, t->assign, NULL, err);
        if (rc)
            return herr_prefix(err, rc, "ViT balance");
    } else {
        memcpy(t->assign, t->owner, (size_t)n * sizeof(int));
    }
    return n;
}

/* Visits the images of a group assigned to encoding rank r, in encoding order. */
#define FOR_ASSIGNED(t, first, count, r, ...)                                              \
    do {                                                                                   \
        int k_ = 0;                                                                        \
        for (int j_ = (first); j_ < (first) + (count); j_++)                               \
            for (int i_ = 0; i_ < (t)->micro[j_].data.n_images; i_++, k_++)                \
                if ((t)->assign[k_] == (r)) {                                              \
                    int micro = j_, image = i_;                                            \
                    __VA_ARGS__;                                                           \
                }                                                                          \
    } while (0)

static size_t units_of(const ptrain *t, int j, int i)
{
    return t->micro[j].img_off[i + 1] - t->micro[j].img_off[i];
}

/* ---- encode / gather / backward of one group --------------------------------------------- */

/* Encodes this rank's images of group g (if any) into a slot g->m, which then holds
 * the activations until the group's backward. */
static int encode_mine(ptrain *t, pt_enc_group *g, hearth_err *err)
{
    g->n_mine = 0;
    g->units = 0;
    g->m = NULL;
    int n = 0;
    size_t npix = 0;
    FOR_ASSIGNED(t, g->first, g->count, t->enc_me, {
        n++;
        npix += t->micro[micro].pix_off[image + 1] - t->micro[micro].pix_off[image];
    });
    if (n == 0)
        return 0;
    size_t pdim = t->micro[g->first].data.patch_dim, cap_mine = (size_t)g->cap_mine;
    int rc;
    if ((rc = pt_grow((void **)&g->mine, &cap_mine, (size_t)n, sizeof *g->mine, err)) ||
        (rc = pt_grow((void **)&t->grids, &t->cap_grids, 3 * (size_t)n, sizeof(int), err)) ||
        (rc = pt_grow((void **)&t->pixels, &t->cap_pixels, npix * pdim, sizeof(float), err)))
        return rc;
    g->cap_mine = (int)cap_mine;
    size_t at = 0;
    FOR_ASSIGNED(t, g->first, g->count, t->enc_me, {
        const pt_micro *mi = &t->micro[micro];
        size_t p0 = mi->pix_off[image], np = mi->pix_off[image + 1] - p0;
        memcpy(t->grids + 3 * g->n_mine, mi->data.grid_thw + 3 * image, 3 * sizeof(int));
        memcpy(t->pixels + at * pdim, mi->data.pixels + p0 * pdim, np * pdim * sizeof(float));
        at += np;
        g->mine[g->n_mine].micro = micro;
        g->mine[g->n_mine].image = image;
        g->n_mine++;
        g->units += (int)units_of(t, micro, image);
    });
    if ((rc = pool_take(t, &g->m, err)) ||
        (rc = model_encode_forward(g->m, n, t->grids, t->pixels, err)))
        return herr_prefix(err, rc, "encoder");
    return 0;
}

/* Puts rows (images of encoding rank r in encoding order, packed) into the micro
 * batches' embedding buffers; returns the rows consumed. */
static size_t place_rows(ptrain *t, const pt_enc_group *g, int r, const float *rows)
{
    size_t Hd = (size_t)t->Hd, at = 0;
    FOR_ASSIGNED(t, g->first, g->count, r, {
        pt_micro *mi = &t->micro[micro];
        size_t u = units_of(t, micro, image);
        memcpy(mi->img + mi->img_off[image] * Hd, rows + at * Hd, u * Hd * sizeof(float));
        at += u;
    });
    return at;
}

static size_t units_assigned(const ptrain *t, const pt_enc_group *g, int r)
{
    size_t u = 0;
    FOR_ASSIGNED(t, g->first, g->count, r, u += units_of(t, micro, image));
    return u;
}

/* Every rank of `group` gets every encoding rank's rows; encoding rank r's rows come from
 * group rank r * stride (its leader); the other ranks send nothing. */
static int gather_rows(ptrain *t, const pt_enc_group *g, comm *group, int stride,
                       hearth_err *err)
{
    int n = comm_size(group), me = comm_rank(group), rc;
    if ((rc = pt_grow((void **)&t->counts, &t->cap_counts, (size_t)n, sizeof(size_t), err)))
        return rc;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        t->counts[i] = i % stride == 0 ? units_assigned(t, g, i / stride) * (size_t)t->Hd : 0;
        total += t->counts[i];
    }
    if ((rc = pt_grow((void **)&t->rows, &t->cap_rows, total, sizeof(float), err)))
        return rc;
    const float *mine = NULL;
    size_t n_send = t->counts[me];
    if (n_send) {
        int u;
        mine = model_img_feat(g->m, &u);
    }
    if ((rc = comm_all_gatherv(group, mine, n_send, t->rows, t->counts, NULL, COMM_F32, err)))
        return herr_prefix(err, rc, "encoder: gathering embeddings");
    size_t at = 0;
    for (int r = 0; r * stride < n; r++)
        at += place_rows(t, g, r, t->rows + at * (size_t)t->Hd);
    return 0;
}

/* The encoder backward of this rank's images of g, from the micro batches' img_grad. */
static int backward_mine(ptrain *t, pt_enc_group *g, hearth_err *err)
{
    if (!g->m)
        return 0;
    size_t Hd = (size_t)t->Hd, at = 0;
    float *dst = model_img_grad(g->m);
    for (int k = 0; k < g->n_mine; k++) {
        const pt_image *im = &g->mine[k];
        const pt_micro *mi = &t->micro[im->micro];
        size_t u = units_of(t, im->micro, im->image);
        memcpy(dst + at * Hd, mi->img_grad + mi->img_off[im->image] * Hd,
               u * Hd * sizeof(float));
        at += u;
    }
    int rc = model_encode_backward(g->m, err);
    pool_give(t, g->m);
    g->m = NULL;
    return rc ? herr_prefix(err, rc, "encoder backward") : 0;
}

/* ---- grouped strategies ------------------------------------------------------------------- */

static int grouped_encode(ptrain *t, int first, hearth_err *err)
{
    pt_enc_group *g = &t->groups[first];
    g->active = 1;
    g->first = first;
    g->count = t->M_local - first < t->enc_group_size ? t->M_local - first : t->enc_group_size;
    int rc = assign_group(t, first, g->count, err);
    if (rc < 0 || (rc = encode_mine(t, g, err)))
        return rc;
    if (t->enc_n_ranks == 1) {    /* uniform: every tp rank computed the same rows */
        if (g->m)
            place_rows(t, g, 0, model_img_feat(g->m, NULL));
        return 0;
    }
    return gather_rows(t, g, t->dec->group[PS_TP], t->lay.enc_tp, err);
}

/* ---- full separation ---------------------------------------------------------------------- */

static int fullsep_begin(ptrain *t, hearth_err *err)
{
    pt_enc_group *g = &t->groups[0];
    g->active = 1;
    g->first = 0;
    g->count = t->M_local;
    int rc = assign_group(t, 0, t->M_local, err);
    if (rc < 0 || (rc = encode_mine(t, g, err)) ||
        (rc = gather_rows(t, g, t->dec->group[PS_MP], 1, err)))
        return rc;
    if (!t->cfg.parallel.encoder.offload)
        return 0;
    /* Offload: the step's embeddings leave the working set, packed per micro batch. */
    size_t Hd = (size_t)t->Hd, total = 0;
    if ((rc = pt_grow((void **)&t->offload_off, &t->cap_offload_off, (size_t)t->M_local + 1,
                      sizeof(size_t), err)))
        return rc;
    for (int j = 0; j < t->M_local; j++) {
        t->offload_off[j] = total;
        total += (size_t)t->micro[j].n_units * Hd;
    }
    t->offload_off[t->M_local] = total;
    if ((rc = pt_grow((void **)&t->offload, &t->cap_offload, total, sizeof(float), err)))
        return rc;
    for (int j = 0; j < t->M_local; j++) {
        pt_micro *mi = &t->micro[j];
        memcpy(t->offload + t->offload_off[j], mi->img,
               (size_t)mi->n_units * Hd * sizeof(float));
        free(mi->img);
        mi->img = NULL;
        mi->cap_img = 0;
    }
    return 0;
}

/* Phase 3: the image gradients of stage 0 to every encoding rank, then the backward. */
static int fullsep_end(ptrain *t, hearth_err *err)
{
    size_t Hd = (size_t)t->Hd, total = 0;
    for (int j = 0; j < t->M_local; j++)
        total += (size_t)t->micro[j].n_units * Hd;
    int rc = pt_grow((void **)&t->rows, &t->cap_rows, total, sizeof(float), err);
    if (rc)
        return rc;
    comm *mp = t->dec->group[PS_MP];
    size_t at = 0;
    if (comm_rank(mp) == 0)
        for (int j = 0; j < t->M_local; j++) {
            size_t n = (size_t)t->micro[j].n_units * Hd;
            memcpy(t->rows + at, t->micro[j].img_grad, n * sizeof(float));
            at += n;
        }
    if ((rc = comm_broadcast(mp, t->rows, total, COMM_F32, 0, err)))
        return herr_prefix(err, rc, "encoder: scattering embedding gradients");
    at = 0;
    for (int j = 0; j < t->M_local; j++) {
        size_t n = (size_t)t->micro[j].n_units * Hd;
        memcpy(t->micro[j].img_grad, t->rows + at, n * sizeof(float));
        at += n;
    }
    return backward_mine(t, &t->groups[0], err);
}

/* ---- hooks called by the step and the pipeline ---------------------------------------------- */

int pt_encode_step_begin(ptrain *t, hearth_err *err)
{
    if (t->enc_mode == PT_ENC_FULL_SEPARATION)
        return fullsep_begin(t, err);
    return 0;
}

int pt_encode_before_forward(ptrain *t, int j, const float **img, hearth_err *err)
{
    pt_micro *mi = &t->micro[j];
    int rc;
    *img = NULL;
    if (t->enc_mode == PT_ENC_GROUPED && j % t->enc_group_size == 0 &&
        (rc = grouped_encode(t, j, err)))
        return rc;
    if (t->enc_mode == PT_ENC_NONE || mi->n_units == 0)
        return 0;
    *img = mi->img;
    if (t->enc_mode == PT_ENC_FULL_SEPARATION && t->cfg.parallel.encoder.offload) {
        /* Prefetch: the working buffer holds one micro batch at a time. */
        size_t n = (size_t)mi->n_units * (size_t)t->Hd;
        if ((rc = pt_grow((void **)&t->img_work, &t->cap_img_work, n, sizeof(float), err)))
            return rc;
        memcpy(t->img_work, t->offload + t->offload_off[j], n * sizeof(float));
        *img = t->img_work;
    }
    return 0;
}

int pt_encode_after_backward(ptrain *t, int j, hearth_err *err)
{
    if (t->enc_mode != PT_ENC_GROUPED)
        return 0;
    pt_enc_group *g = &t->groups[j - j % t->enc_group_size];
    if (!g->active || j != g->first + g->count - 1)
        return 0;
    g->active = 0;
    return backward_mine(t, g, err);
}

int pt_encode_step_end(ptrain *t, hearth_err *err)
{
    if (t->enc_mode == PT_ENC_FULL_SEPARATION)
        return fullsep_end(t, err);
    return 0;
}
