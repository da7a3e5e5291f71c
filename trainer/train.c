#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_state.h"
#include "data_source.h"
#include "fp8_policy.h"
#include "hf_config.h"
#include "hf_weights.h"
#include "kdev.h"
#include "kernels.h"
#include "model/model_par.h"
#include "parallel/ptrain_local.h"
#include "schedule.h"

/* How long a rank of a multi-rank layout may wait in one collective before the run is
 * declared stuck (a rank that fails on its own stops the others at once). */
#define TRAIN_COMM_TIMEOUT_MS (30 * 60 * 1000)

struct trainer {
    ptrain_local *par;               /* ranks > 1: the layout's ranks as threads */
    model *m;
    data_source *src;                /* the samples (data.kind) */
    synth_params data;               /* their geometry: data_source_params(src) */
    lr_schedule sched;
    int global_batch, micro_batch, n_micro;
    double weight_decay, grad_clip;
    float aux_coef;
    int chunks;                      /* parallel.chunks: sequence chunks per micro batch */
    kdev *dev;                       /* the device of device: cuda (owned); NULL = the
                                        model's own cpu device */
    float *adam_m, *adam_v;          /* [param count] on the model's device, zero at start */
    kdev_adamw_tensor *opt;          /* the tensors that train, in table order: AdamW's */
    const float **gx;                /* ... and the gradient norm's view of them */
    size_t *gn;
    int n_opt;
    float *host;                     /* device other than the cpu: [3][param count] host
                                        copies of parameters and moments for checkpoint
                                        and Hugging Face I/O, made on first use */
    synth_batch *micro;              /* [n_micro], refilled every step */
    int step;                        /* steps completed */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int train_nonfinite(double x)
{
    return isnan(x) || isinf(x);
}

static int optimizer_tensors(trainer *t);

int trainer_create(trainer **out, const run_config *cfg, hearth_err *err)
{
    *out = NULL;
    int mb = cfg->train.micro_batch, gb = cfg->train.global_batch;
    if (mb < 1 || gb < 1 || gb % mb)
        return herr_set(err, HERR_CONFIG, "train.global_batch: must be a positive multiple "
                        "of train.micro_batch (%d), got %d", mb, gb);
    if (cfg->train.steps < 0)
        return herr_set(err, HERR_CONFIG, "train.steps: must be >= 0, got %d",
                        cfg->train.steps);
    trainer *t = calloc(1, sizeof *t);
    if (!t)
        return herr_set(err, HERR_NOMEM, "trainer: out of memory");
    int rc;
    if (cfg->ranks > 1) {
        if ((rc = ptrain_local_create(&t->par, cfg, TRAIN_COMM_TIMEOUT_MS, err))) {
            free(t);
            return rc;
        }
        *out = t;
        return 0;
    }
    rc = data_source_create(&t->src, cfg, err);
    if (rc) {
        free(t);
        return rc;
    }
    t->data = *data_source_params(t->src);
    t->sched = (lr_schedule){ .lr = cfg->train.lr, .min_lr = cfg->train.min_lr,
                              .warmup = cfg->train.warmup, .steps = cfg->train.steps };
    t->global_batch = gb;
    t->micro_batch = mb;
    t->n_micro = gb / mb;
    t->weight_decay = cfg->train.weight_decay;
    t->grad_clip = cfg->train.grad_clip;
    t->chunks = cfg->parallel.chunks;
    t->aux_coef = cfg->model.decoder.moe_experts > 0 ? cfg->model.decoder.moe_aux_coef : 0.0f;
    if (cfg->device == DEVICE_CUDA) {
        char msg[512];
        if ((rc = kdev_create(&t->dev, KDEV_CUDA, msg, sizeof msg))) {
            trainer_free(t);
            return herr_set(err, rc == HERR_CONFIG ? HERR_CONFIG : HERR_RUNTIME, "%s", msg);
        }
        if (cfg->precision.compute == COMPUTE_BF16 &&
            (rc = kdev_set_precision(t->dev, KDEV_PREC_BF16))) {
            rc = herr_set(err, rc, "precision.compute: %s", kdev_errmsg(t->dev));
            trainer_free(t);
            return rc;
        }
    }
    model_par par;
    model_par_single(&par, &cfg->model);
    par.dev = t->dev;
    if ((rc = model_create_par(&t->m, &cfg->model, &par, cfg->train.seed, err)) ||
        (rc = fp8_plan_install(&t->m, 1, cfg, TRAIN_CPU_DEVICE_NAME, err))) {
        herr_prefix(err, rc, "model");
        trainer_free(t);
        return rc;
    }
    size_t n = model_param_count(t->m);
    kdev *dev = model_device(t->m);
    t->micro = calloc((size_t)t->n_micro, sizeof *t->micro);
    if (!t->micro || kdev_alloc(dev, (void **)&t->adam_m, n * sizeof(float)) ||
        kdev_alloc(dev, (void **)&t->adam_v, n * sizeof(float)) || optimizer_tensors(t)) {
        trainer_free(t);
        return herr_set(err, HERR_NOMEM, "optimizer state: out of memory (%zu parameters)", n);
    }
    *out = t;
    return 0;
}

void trainer_free(trainer *t)
{
    if (!t)
        return;
    ptrain_local_free(t->par);
    if (t->micro)
        for (int i = 0; i < t->n_micro; i++)
            synth_batch_free(&t->micro[i]);
    free(t->micro);
    if (t->m) {
        kdev_release(model_device(t->m), t->adam_m);
        kdev_release(model_device(t->m), t->adam_v);
    }
    free(t->host);
    free(t->opt);
    free(t->gx);
    free(t->gn);
    model_free(t->m);
    kdev_free(t->dev);
    data_source_free(t->src);
    free(t);
}

int trainer_steps_done(const trainer *t)
{
    return t->step;
}

model *trainer_model(trainer *t)
{
    return t->par ? ptrain_local_model(t->par) : t->m;
}

/* The device's first failure as the trainer's error. */
static int device_check(kdev *dev, hearth_err *err)
{
    int rc = kdev_status(dev);
    return rc ? herr_set(err, rc, "device %s: %s", kdev_name(dev), kdev_errmsg(dev)) : 0;
}

/* The tensors that train (not frozen), in table order, as the multi-tensor ops see them;
 * their addresses never change.  Nonzero on allocation failure. */
static int optimizer_tensors(trainer *t)
{
    model *m = t->m;
    int n = model_tensor_count(m);
    float *p = model_params(m), *g = model_grads(m);
    t->opt = calloc(n > 0 ? (size_t)n : 1, sizeof *t->opt);
    t->gx = calloc(n > 0 ? (size_t)n : 1, sizeof *t->gx);
    t->gn = calloc(n > 0 ? (size_t)n : 1, sizeof *t->gn);
    if (!t->opt || !t->gx || !t->gn)
        return -1;
    for (int i = 0; i < n; i++) {
        const model_tensor *tt = model_tensor_at(m, i);
        if (tt->frozen)
            continue;
        t->opt[t->n_opt] = (kdev_adamw_tensor){ .param = p + tt->offset, .grad = g + tt->offset,
                                                .m = t->adam_m + tt->offset,
                                                .v = t->adam_v + tt->offset, .n = tt->numel,
                                                .decay = tt->decay };
        t->gx[t->n_opt] = g + tt->offset;
        t->gn[t->n_opt++] = tt->numel;
    }
    return 0;
}

/* Global L2 norm over the gradients of the tensors that train, summed in tensor order
 * (each sum of squares is itself order-fixed), so the norm is reproducible bit for bit. */
static int grad_norm(trainer *t, double *norm, hearth_err *err)
{
    kdev *dev = model_device(t->m);
    double ss = 0.0;
    kdev_sumsq_multi(dev, &ss, t->gx, t->gn, t->n_opt);
    *norm = sqrt(ss);
    return device_check(dev, err);
}

static int optimizer_update(trainer *t, float lr, float clip, hearth_err *err)
{
    kdev *dev = model_device(t->m);
    kdev_adamw_multi(dev, t->opt, t->n_opt, clip, lr, TRAIN_ADAM_BETA1, TRAIN_ADAM_BETA2,
                     TRAIN_ADAM_EPS, (float)t->weight_decay, t->step);
    return device_check(dev, err);
}

int trainer_step(trainer *t, train_step_stats *st, hearth_err *err)
{
    if (t->par) {
        int rc = ptrain_local_step(t->par, st, err);
        if (rc == 0)
            t->step++;
        return rc;
    }
    double t0 = now_ms();
    memset(st, 0, sizeof *st);
    st->step = t->step + 1;
    st->lr = schedule_lr(&t->sched, st->step);
    st->tokens = (long)t->global_batch * t->data.seq_len;

    /* All micro batches first: the loss scale needs the step's target count. */
    for (int k = 0; k < t->n_micro; k++) {
        uint64_t first = data_source_first(st->step - 1, t->global_batch, t->micro_batch,
                                           t->n_micro, 0, k);
        int rc = data_source_fill(t->src, &t->micro[k], first, t->micro_batch, err);
        if (rc)
            return rc;
        st->target_tokens += t->micro[k].n_targets;
        st->patches += (long)t->micro[k].n_patches;
        st->images += t->micro[k].n_images;
        for (int i = 0; i < t->micro[k].n_images; i++) {
            const int *g = t->micro[k].grid_thw + 3 * i;
            double n = (double)g[0] * g[1] * g[2];
            st->patches_sq += n * n;
        }
    }
    float loss_scale = st->target_tokens > 0 ? 1.0f / (float)st->target_tokens : 0.0f;
    float aux_scale = t->aux_coef / (float)t->n_micro;

    model_zero_grad(t->m);
    double loss_sum = 0.0, aux_sum = 0.0;
    for (int k = 0; k < t->n_micro; k++) {
        vlm_batch b = synth_view(&t->micro[k]);
        model_stats ms;
        memset(&ms, 0, sizeof ms);
        int rc = model_forward_backward_chunks(t->m, &b, t->chunks, loss_scale,
                                               aux_scale, &ms, err);
        if (rc)
            return herr_prefix(err, rc, "micro batch %d", k);
        if (ms.n_targets != t->micro[k].n_targets)
            return herr_set(err, HERR_RUNTIME, "step %d, micro batch %d: the model counted "
                            "%d target tokens, the data has %ld", st->step, k, ms.n_targets,
                            t->micro[k].n_targets);
        loss_sum += ms.loss_sum;
        aux_sum += ms.aux_loss;
        st->encoder_ms += ms.encoder_ms;
        st->decoder_ms += ms.decoder_ms;
    }
    st->loss = st->target_tokens > 0 ? loss_sum / (double)st->target_tokens : 0.0;
    st->aux_loss = aux_sum / t->n_micro;
    int rc = grad_norm(t, &st->grad_norm, err);
    if (rc)
        return rc;
    if (train_nonfinite(st->loss) || train_nonfinite(st->grad_norm)) {
        st->step_ms = now_ms() - t0;
        return TRAIN_DIVERGED;
    }
    float clip = kcpu_clip_factor(st->grad_norm, (float)t->grad_clip);
    t->step++;
    if ((rc = optimizer_update(t, (float)st->lr, clip, err)))
        return rc;
    st->step_ms = now_ms() - t0;
    return 0;
}

int trainer_device_peak(const trainer *t, long long *bytes)
{
    if (t->par || !t->m || kdev_get_kind(model_device(t->m)) == KDEV_CPU)
        return 0;
    size_t peak;
    kdev_mem_stats(model_device(t->m), &peak, NULL);
    *bytes = (long long)peak;
    return 1;
}

int trainer_profile_start(trainer *t, hearth_err *err)
{
    if (t->par || !t->m)
        return herr_set(err, HERR_CONFIG, "HEARTH_PROFILE: the per-op profile covers "
                        "single-rank runs");
    return kdev_profile_start(model_device(t->m)) ? device_check(model_device(t->m), err) : 0;
}

int trainer_profile_report(trainer *t, char *buf, size_t len, hearth_err *err)
{
    if (t->par || !t->m)
        return herr_set(err, HERR_CONFIG, "HEARTH_PROFILE: no profile");
    kdev *dev = model_device(t->m);
    return kdev_profile_report(dev, buf, len) < 0 ? device_check(dev, err) : 0;
}

const char *trainer_device_name(const trainer *t)
{
    return t->par || !t->m ? "cpu" : kdev_hw_name(model_device(t->m));
}

int trainer_lib_version(const trainer *t, kdev_lib lib)
{
    return t->par || !t->m ? 0 : kdev_lib_version(model_device(t->m), lib);
}

int trainer_ranks(const trainer *t)
{
    return t->par ? ptrain_local_ranks(t->par) : 1;
}

/* Where checkpoint and Hugging Face I/O read and write the parameters and moments: the
 * arrays themselves on the cpu device, else host copies (t->host, [3][n]). */
static int host_state(trainer *t, float **p, float **m, float **v, hearth_err *err)
{
    if (kdev_get_kind(model_device(t->m)) == KDEV_CPU) {
        *p = model_params(t->m);
        *m = t->adam_m;
        *v = t->adam_v;
        return 0;
    }
    size_t n = model_param_count(t->m);
    if (!t->host && !(t->host = malloc((n > 0 ? 3 * n : 1) * sizeof(float))))
        return herr_set(err, HERR_NOMEM, "trainer: out of memory for a host copy of %zu "
                        "parameters", n);
    *p = t->host;
    *m = t->host + n;
    *v = t->host + 2 * n;
    return 0;
}

/* Device <-> host copies of parameters and moments (nothing to do on the cpu device). */
static int host_sync(trainer *t, int to_host, hearth_err *err)
{
    kdev *dev = model_device(t->m);
    if (kdev_get_kind(dev) == KDEV_CPU)
        return 0;
    size_t bytes = model_param_count(t->m) * sizeof(float);
    float *dst[3] = { model_params(t->m), t->adam_m, t->adam_v }, *h[3];
    int rc = host_state(t, &h[0], &h[1], &h[2], err);
    for (int k = 0; !rc && k < 3; k++)
        if (to_host ? kdev_download(dev, h[k], dst[k], bytes)
                    : kdev_upload(dev, dst[k], h[k], bytes))
            rc = device_check(dev, err);
    return rc;
}

/* The single-rank state: the model, then the AdamW moments of every tensor. */
static int list_state(trainer *t, ckpt_items *l, hearth_err *err)
{
    float *hp, *hm, *hv;
    int rc = host_state(t, &hp, &hm, &hv, err);
    if (!rc)
        rc = ckpt_items_add_model_at(l, t->m, hp, "", err);
    char name[ST_NAME_MAX + 16];
    for (int k = 0; !rc && k < 2; k++)
        for (int i = 0; !rc && i < model_tensor_count(t->m); i++) {
            const model_tensor *tt = model_tensor_at(t->m, i);
            snprintf(name, sizeof name, "%s/%s", k ? "adam_v" : "adam_m", tt->name);
            rc = ckpt_items_add(l, name, ST_F32, (k ? hv : hm) + tt->offset, tt->numel,
                                tt->ndim, tt->dims, err);
        }
    return rc;
}

/* The single-rank checkpoint file of dir: its state list written (save) or read (load). */
static int single_rank_io(trainer *t, const char *dir, int step, int save, hearth_err *err)
{
    char path[4200];
    ckpt_items l;
    ckpt_items_init(&l);
    int rc = ckpt_rank_path(path, sizeof path, dir, 0, err);
    if (!rc)
        rc = list_state(t, &l, err);
    if (!rc && save)
        rc = host_sync(t, 1, err);
    if (!rc)
        rc = save ? ckpt_items_write(&l, path, step, err) : ckpt_items_read(&l, path, step, err);
    if (!rc && !save)
        rc = host_sync(t, 0, err);
    ckpt_items_free(&l);
    return rc;
}

int trainer_save(trainer *t, const char *dir, hearth_err *err)
{
    if (t->par)
        return ptrain_local_save(t->par, dir, err);
    return single_rank_io(t, dir, t->step, 1, err);
}

int trainer_load(trainer *t, const char *dir, int step, hearth_err *err)
{
    int rc = t->par ? ptrain_local_load(t->par, dir, step, err)
                    : single_rank_io(t, dir, step, 0, err);
    if (!rc)
        t->step = step;
    return rc;
}

/* A single-rank model of shape sh for moving whole checkpoints in and out of the
 * layout's shards (its initial values are overwritten). */
static int full_model(model **out, const model_shape *sh, hearth_err *err)
{
    int rc = model_create(out, sh, 0, err);
    return rc ? herr_prefix(err, rc, "full model") : 0;
}

int trainer_init_from_hf(trainer *t, const model_shape *sh, const hf_config *src,
                         const char *dir, hearth_err *err)
{
    int rc = hf_config_check(sh, &src->shape, src->file, err);
    if (rc)
        return rc;
    if (!t->par && kdev_get_kind(model_device(t->m)) == KDEV_CPU)
        return hf_weights_load(t->m, dir, err);
    model *full;
    if ((rc = full_model(&full, sh, err)))
        return rc;
    rc = hf_weights_load(full, dir, err);
    if (!rc && t->par)
        rc = ptrain_local_scatter(t->par, full, err);
    else if (!rc && kdev_upload(model_device(t->m), model_params(t->m), model_params(full),
                                model_param_count(t->m) * sizeof(float)))
        rc = device_check(model_device(t->m), err);
    model_free(full);
    return rc;
}

int trainer_export_hf(trainer *t, const model_shape *sh, const hf_config *src,
                      const char *dir, st_dtype dtype, hearth_err *err)
{
    if (!t->par && kdev_get_kind(model_device(t->m)) == KDEV_CPU)
        return hf_weights_export(t->m, src, dir, dtype, HF_EXPORT_SHARD_BYTES, err);
    model *full;
    int rc = full_model(&full, sh, err);
    if (rc)
        return rc;
    if (t->par)
        rc = ptrain_local_gather(t->par, full, err);
    else if (kdev_download(model_device(t->m), model_params(full), model_params(t->m),
                           model_param_count(t->m) * sizeof(float)))
        rc = device_check(model_device(t->m), err);
    if (!rc)
        rc = hf_weights_export(full, src, dir, dtype, HF_EXPORT_SHARD_BYTES, err);
    model_free(full);
    return rc;
}
