/* ptrain.c - one rank's trainer: creation of its model chunks and groups, and the step
 * (ptrain.h).  The pipeline and the encoder strategies live in ptrain_pipe.c and
 * ptrain_encode.c. */
#include "parallel/ptrain_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp8_policy.h"
#include "kernels.h"
#include "model/model_shard.h"
#include "parallel/dp_balance.h"

double pt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int pt_grow(void **p, size_t *cap, size_t n, size_t elem, hearth_err *err)
{
    if (n <= *cap && *p)
        return 0;
    size_t want = n > 2 * *cap ? n : 2 * *cap;
    void *q = realloc(*p, (want ? want : 1) * elem);
    if (!q)
        return herr_set(err, HERR_NOMEM, "parallel trainer: out of memory (%zu x %zu bytes)",
                        want, elem);
    *p = q;
    *cap = want;
    return 0;
}

/* A group handle as the model wants it: NULL for a group of one. */
static comm *group_or_null(const parallel_state *ps, ps_group_kind k)
{
    return ps && ps->size[k] > 1 ? ps->group[k] : NULL;
}

static int create_chunks(ptrain *t, uint64_t seed, hearth_err *err)
{
    const model_shape *sh = &t->cfg.model;
    int L = sh->decoder.s.layers, pp = t->lay.pp, p = t->dec->coords.p;
    int per = L / t->n_virtual;
    t->chunk = calloc((size_t)t->vpp, sizeof *t->chunk);
    if (!t->chunk)
        return herr_set(err, HERR_NOMEM, "parallel trainer: out of memory");
    for (int v = 0; v < t->vpp; v++) {
        int vs = v * pp + p;
        model_par par;
        memset(&par, 0, sizeof par);
        par.has_decoder = 1;
        par.tp = group_or_null(t->dec, PS_TP);
        par.sp = t->cfg.parallel.sp;
        par.ep = group_or_null(t->dec, PS_EP);
        par.cp = group_or_null(t->dec, PS_CP);
        par.first_layer = vs * per;
        par.n_layers = per;
        par.has_embed = vs == 0;
        par.has_head = vs == t->n_virtual - 1;
        par.has_encoder = v == 0 && t->has_encoder;
        par.enc_tp = par.has_encoder ? group_or_null(t->enc, PS_TP) : NULL;
        int rc = model_create_par(&t->chunk[v], sh, &par, seed, err);
        if (rc)
            return herr_prefix(err, rc, "rank %d, model chunk %d", t->rank, v);
    }
    /* Before any activation clone exists: clones share the chunks' amax histories. */
    return fp8_plan_install(t->chunk, t->vpp, &t->cfg, TRAIN_CPU_DEVICE_NAME, err);
}

int ptrain_create(ptrain **out, const run_config *cfg, comm *world, hearth_err *err)
{
    *out = NULL;
    int mb = cfg->train.micro_batch, gb = cfg->train.global_batch;
    if (mb < 1 || gb < 1 || gb % mb)
        return herr_set(err, HERR_CONFIG, "train.global_batch: must be a positive multiple "
                        "of train.micro_batch (%d), got %d", mb, gb);
    ptrain *t = calloc(1, sizeof *t);
    if (!t)
        return herr_set(err, HERR_NOMEM, "parallel trainer: out of memory");
    t->cfg = *cfg;
    t->world = world;
    t->rank = comm_rank(world);
    ps_layout_from_config(cfg, &t->lay);
    int rc = ps_layout_check(&t->lay, err);
    if (!rc && comm_size(world) != t->lay.world)
        rc = herr_set(err, HERR_CONFIG, "ranks: the layout needs %d ranks, the world has %d",
                      t->lay.world, comm_size(world));
    if (!rc)
        rc = data_source_create(&t->src, cfg, err);
    if (rc) {
        free(t);
        return rc;
    }
    t->data = *data_source_params(t->src);
    t->sched = (lr_schedule){ .lr = cfg->train.lr, .min_lr = cfg->train.min_lr,
                              .warmup = cfg->train.warmup, .steps = cfg->train.steps };
    t->M = gb / mb;
    t->vpp = cfg->parallel.vpp > 1 ? cfg->parallel.vpp : 1;
    t->n_virtual = t->lay.pp * t->vpp;
    t->Hd = cfg->model.decoder.s.hidden;
    float coef = cfg->model.decoder.moe_experts > 0 ? cfg->model.decoder.moe_aux_coef : 0.0f;
    t->aux_scale = coef / (float)t->M;
    *out = t;

    if (t->M % t->lay.dp)
        return herr_set(err, HERR_CONFIG, "train.global_batch: %d micro batches do not split "
                        "over dp %d", t->M, t->lay.dp);
    t->M_local = t->M / t->lay.dp;
    if (cfg->model.decoder.s.layers % t->n_virtual)
        return herr_set(err, HERR_CONFIG, "model.decoder.layers: %d layers do not split into "
                        "pp x vpp = %d stages", cfg->model.decoder.s.layers, t->n_virtual);
    if ((rc = parallel_state_create(&t->dec, &t->lay, PS_DECODER, world, err)) ||
        (rc = parallel_state_create(&t->enc, &t->lay, PS_ENCODER, world, err)))
        return rc;
    t->has_encoder = cfg->model.encoder.present && t->enc->present;
    if ((rc = create_chunks(t, cfg->train.seed, err)))
        return rc;
    param_sync_opts po = { .distributed_optimizer = cfg->parallel.distributed_optimizer,
                           .beta1 = TRAIN_ADAM_BETA1, .beta2 = TRAIN_ADAM_BETA2,
                           .eps = TRAIN_ADAM_EPS };
    if ((rc = param_sync_create(&t->sync, t->chunk, t->vpp, t->dec, t->enc, world, &po,
                                err)))
        return herr_prefix(err, rc, "rank %d", t->rank);
    t->micro = calloc((size_t)t->M_local, sizeof *t->micro);
    t->mb_index = calloc((size_t)t->M_local, sizeof *t->mb_index);
    t->mb_cost = calloc((size_t)t->M, sizeof *t->mb_cost);
    t->mb_rank = calloc((size_t)t->M, sizeof *t->mb_rank);
    if (!t->micro || !t->mb_index || !t->mb_cost || !t->mb_rank)
        return herr_set(err, HERR_NOMEM, "parallel trainer: out of memory");
    if ((rc = pt_pipe_init(t, err)) || (rc = pt_encode_init(t, err)))
        return rc;
    return 0;
}

void ptrain_free(ptrain *t)
{
    if (!t)
        return;
    pt_encode_free(t);
    pt_pipe_free(t);
    if (t->micro)
        for (int j = 0; j < t->M_local; j++) {
            synth_batch_free(&t->micro[j].data);
            free(t->micro[j].img_off);
            free(t->micro[j].pix_off);
            free(t->micro[j].img);
            free(t->micro[j].img_grad);
        }
    free(t->micro);
    free(t->mb_index);
    free(t->mb_cost);
    free(t->mb_rank);
    synth_batch_free(&t->probe);
    param_sync_free(t->sync);
    if (t->chunk)
        for (int v = 0; v < t->vpp; v++)
            model_free(t->chunk[v]);
    free(t->chunk);
    parallel_state_free(t->enc);
    parallel_state_free(t->dec);
    data_source_free(t->src);
    free(t);
}

int ptrain_scatter(ptrain *t, const model *full, hearth_err *err)
{
    for (int v = 0; v < t->vpp; v++) {
        int rc = model_shard_load_full(t->chunk[v], full, err);
        if (rc)
            return herr_prefix(err, rc, "chunk %d", v);
    }
    return 0;
}

model *ptrain_model(ptrain *t)
{
    return t->chunk ? t->chunk[0] : NULL;
}

/* The estimated cost of one micro batch (its images; every sequence runs through the
 * decoder at seq_len, padding included, so the decoder adds the same to each). */
static double micro_cost(const synth_batch *b, const shape_flops *fl, double decoder)
{
    double c = decoder;
    for (int i = 0; i < b->n_images; i++) {
        const int *g = b->grid_thw + 3 * i;
        double n = (double)g[0] * g[1] * g[2];
        c += n * (fl->encoder_per_patch + fl->projector_per_patch) +
             n * n * fl->encoder_per_patch_sq;
    }
    return c;
}

/* Which micro batches of the step this DP rank trains: its plain share, or with
 * data.balance the share dp_balance gives it by cost (every rank reads every micro
 * batch of the step for its size and decides alike). */
static int plan_micro(ptrain *t, hearth_err *err)
{
    int d = t->dec->coords.d, dp = t->lay.dp, rc;
    if (!t->cfg.data.balance || dp == 1) {
        for (int j = 0; j < t->M_local; j++)
            t->mb_index[j] = d * t->M_local + j;
        return 0;
    }
    int mb = t->cfg.train.micro_batch, gb = t->cfg.train.global_batch;
    shape_flops fl;
    shape_count_flops(&t->cfg.model, t->data.seq_len, &fl);
    double decoder = fl.decoder_per_token * (double)mb * t->data.seq_len;
    for (int m = 0; m < t->M; m++) {
        uint64_t first = data_source_first(t->step, gb, mb, t->M_local, m / t->M_local,
                                           m % t->M_local);
        if ((rc = data_source_fill(t->src, &t->probe, first, mb, err)))
            return herr_prefix(err, rc, "data.balance");
        t->mb_cost[m] = micro_cost(&t->probe, &fl, decoder);
    }
    if ((rc = dp_balance_assign(t->mb_cost, t->M, dp, DP_BALANCE_ROUNDS, t->mb_rank, NULL,
                                err)))
        return rc;
    int j = 0;
    for (int m = 0; m < t->M; m++)
        if (t->mb_rank[m] == d)
            t->mb_index[j++] = m;
    return 0;
}

/* Materialises micro batch j of this DP rank for the step, with its image offsets. */
static int fill_micro(ptrain *t, int j, hearth_err *err)
{
    pt_micro *mi = &t->micro[j];
    int mb = t->cfg.train.micro_batch;
    int m = t->mb_index[j];   /* micro batch m of the step: the plain share of DP rank
                                 m / M_local */
    uint64_t first = data_source_first(t->step, t->cfg.train.global_batch, mb, t->M_local,
                                       m / t->M_local, m % t->M_local);
    int rc = data_source_fill(t->src, &mi->data, first, mb, err);
    if (rc)
        return rc;
    mi->view = synth_view(&mi->data);
    int n = mi->data.n_images;
    if ((rc = pt_grow((void **)&mi->img_off, &mi->cap_img_off, (size_t)n + 1,
                      sizeof(size_t), err)) ||
        (rc = pt_grow((void **)&mi->pix_off, &mi->cap_pix_off, (size_t)n + 1,
                      sizeof(size_t), err)))
        return rc;
    int m2 = t->data.merge * t->data.merge;
    mi->img_off[0] = mi->pix_off[0] = 0;
    for (int i = 0; i < n; i++) {
        const int *g = mi->data.grid_thw + 3 * i;
        size_t patches = (size_t)g[0] * g[1] * g[2];
        mi->pix_off[i + 1] = mi->pix_off[i] + patches;
        mi->img_off[i + 1] = mi->img_off[i] + patches / (size_t)m2;
    }
    mi->n_units = (int)mi->img_off[n];
    size_t rows = (size_t)mi->n_units * (size_t)t->Hd;
    if ((rc = pt_grow((void **)&mi->img, &mi->cap_img, rows, sizeof(float), err)) ||
        (rc = pt_grow((void **)&mi->img_grad, &mi->cap_img_grad, rows, sizeof(float), err)))
        return rc;
    return 0;
}

int ptrain_step(ptrain *t, train_step_stats *st, hearth_err *err)
{
    double t0 = pt_now_ms();
    memset(st, 0, sizeof *st);
    st->step = t->step + 1;
    st->lr = schedule_lr(&t->sched, st->step);
    st->tokens = (long)t->cfg.train.global_batch * t->data.seq_len;

    /* Counts of the whole global batch: one rank per DP index contributes. */
    const ps_coords *k = &t->dec->coords;
    int canonical = k->t == 0 && k->c == 0 && k->p == 0;
    double counts[4] = { 0, 0, 0, 0 };   /* targets, patches, patches^2, images */
    int rc = plan_micro(t, err);
    if (rc)
        return rc;
    for (int j = 0; j < t->M_local; j++) {
        if ((rc = fill_micro(t, j, err)))
            return rc;
        const synth_batch *b = &t->micro[j].data;
        for (int i = 0; canonical && i < b->n_images; i++) {
            const int *g = b->grid_thw + 3 * i;
            double n = (double)g[0] * g[1] * g[2];
            counts[2] += n * n;
        }
        if (canonical) {
            counts[0] += (double)b->n_targets;
            counts[1] += (double)b->n_patches;
            counts[3] += b->n_images;
        }
    }
    if ((rc = comm_allreduce(t->world, counts, counts, 4, COMM_F64, COMM_SUM, err)))
        return rc;
    st->target_tokens = (long)counts[0];
    st->patches = (long)counts[1];
    st->patches_sq = counts[2];
    st->images = (int)counts[3];
    t->loss_scale = st->target_tokens > 0 ? 1.0f / (float)st->target_tokens : 0.0f;

    for (int v = 0; v < t->vpp; v++)
        model_zero_grad(t->chunk[v]);
    t->loss_sum = t->aux_sum = t->enc_ms = t->dec_ms = 0;
    if ((rc = pt_encode_step_begin(t, err)) || (rc = pt_pipe_run(t, err)) ||
        (rc = pt_encode_step_end(t, err)))
        return herr_prefix(err, rc, "rank %d, step %d", t->rank, st->step);

    /* The loss lives on the last stage, MoE losses on every stage; tp ranks agree, and so
     * do cp ranks (the model sums both over cp), so (t, c) = (0, 0) speaks for them. */
    int speaks = k->t == 0 && k->c == 0;
    double sums[2] = { speaks ? t->loss_sum : 0, speaks ? t->aux_sum : 0 };
    if ((rc = comm_allreduce(t->world, sums, sums, 2, COMM_F64, COMM_SUM, err)))
        return rc;
    st->loss = st->target_tokens > 0 ? sums[0] / (double)st->target_tokens : 0.0;
    st->aux_loss = sums[1] / t->M;
    st->encoder_ms = t->enc_ms;
    st->decoder_ms = t->dec_ms;
    if ((rc = param_sync_reduce(t->sync, &st->grad_norm, err)))
        return herr_prefix(err, rc, "rank %d, step %d", t->rank, st->step);
    if (train_nonfinite(st->loss) || train_nonfinite(st->grad_norm)) {
        st->step_ms = pt_now_ms() - t0;
        return TRAIN_DIVERGED;
    }
    float clip = kcpu_clip_factor(st->grad_norm, (float)t->cfg.train.grad_clip);
    t->step++;
    if ((rc = param_sync_step(t->sync, t->step, (float)st->lr,
                              (float)t->cfg.train.weight_decay, clip, err)))
        return herr_prefix(err, rc, "rank %d, step %d", t->rank, st->step);
    st->step_ms = pt_now_ms() - t0;
    return 0;
}

int ptrain_gather(ptrain *t, model *full, float *dst, hearth_err *err)
{
    return param_sync_gather(t->sync, full, dst, err);
}
