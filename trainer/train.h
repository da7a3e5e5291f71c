/* train.h - the training step on one rank: data, forward/backward with micro-batch
 * accumulation, global-norm clipping, AdamW with the warmup+cosine schedule.
 *
 * Step s (from 1) trains on samples (s-1)*global_batch .. s*global_batch - 1 of the
 * synthetic set, in global_batch/micro_batch micro batches of micro_batch sequences.
 * Gradients of the step are those of
 *     (sum of token cross-entropies over the step's target tokens) / (target tokens)
 *   + moe_aux_coef * (mean over micro batches of the MoE load-balancing loss),
 * i.e. loss_scale = 1/targets and aux_scale = moe_aux_coef/micro_batches per micro batch.
 *
 * Optimizer (document of record): AdamW, beta1 0.9, beta2 0.95, eps 1e-8, bias-corrected
 * with the step counted from 1; weight decay train.weight_decay only on tensors marked
 * `decay` (matrices, embeddings), none on norms and biases; frozen tensors are never
 * touched and take no part in the gradient norm.  Gradients are clipped to global L2
 * norm train.grad_clip (0 = no clipping) before the update.
 *
 * Ownership: trainer_create copies what it needs from the config; trainer_free frees
 * everything, the model included. */
#ifndef HEARTH_TRAIN_H
#define HEARTH_TRAIN_H

#include <stdint.h>

#include "hf_config.h"
#include "kdev.h"
#include "model/model.h"
#include "safetensors.h"
#include "shape/err.h"
#include "shape/run_config.h"

#define TRAIN_ADAM_BETA1 0.9f
#define TRAIN_ADAM_BETA2 0.95f
#define TRAIN_ADAM_EPS 1e-8f
/* The device name FP8 policies must carry to be used on the CPU path (docs/fp8.md). */
#define TRAIN_CPU_DEVICE_NAME "cpu"

/* trainer_step's return value when the loss (or the gradient norm) is NaN or infinite:
 * the step's update was NOT applied.  Not an error: the run ends as "diverged". */
#define TRAIN_DIVERGED 1

typedef struct {
    int step;              /* from 1 */
    double loss;           /* mean cross-entropy over the step's target tokens */
    double aux_loss;       /* mean over micro batches of the MoE balancing loss (unscaled) */
    double grad_norm;      /* global L2 norm before clipping */
    double lr;             /* learning rate used by this step */
    double step_ms;        /* wall time of the whole step (data included) */
    double encoder_ms, decoder_ms;
    long tokens;           /* decoder tokens: global_batch * seq_len */
    long target_tokens;
    long patches;          /* image patches encoded */
    double patches_sq;     /* sum over images of patches^2 (full-attention cost) */
    int images;
} train_step_stats;

typedef struct trainer trainer;

/* Validates what the trainer itself needs (HERR_CONFIG: batch sizes, data parameters),
 * creates the model from train.seed and the optimizer state.  With cfg->ranks > 1 the
 * step runs on the layout's ranks as threads of this process (parallel/ptrain_local.h,
 * the `local` communicator); the single-rank code here is the reference every layout is
 * tested against (tests/unit/test_ptrain.c). */
int trainer_create(trainer **out, const run_config *cfg, hearth_err *err);
void trainer_free(trainer *t);

/* Runs the next step (steps count from 1).  Returns 0, TRAIN_DIVERGED, or a negative
 * herr code.  st is filled in every case but errors. */
int trainer_step(trainer *t, train_step_stats *st, hearth_err *err);

/* The number of steps completed so far. */
int trainer_steps_done(const trainer *t);
/* The model (multi-rank: rank 0's first chunk, a shard of the full model). */
model *trainer_model(trainer *t);

/* Training checkpoints (ckpt.h, docs/checkpoints.md).  trainer_save writes every
 * rank's state (parameters, optimizer moments, FP8 amax histories) after the steps done
 * so far to DIR/rank-RRRRR.safetensors (ckpt_rank_path), each file atomically;
 * trainer_load reads them back into a trainer created from the same config and layout,
 * which then continues with step `step` + 1 exactly as the saved run would have.
 * Collective over the ranks; the first error of any rank is returned.  After a failed
 * load the trainer's state is partly overwritten: free it. */
int trainer_save(trainer *t, const char *dir, hearth_err *err);
int trainer_load(trainer *t, const char *dir, int step, hearth_err *err);
/* The number of ranks (state files). */
int trainer_ranks(const trainer *t);
/* A trainer on a device with memory of its own (cuda): 1 and *bytes = the peak of what
 * the run allocated there (parameters, gradients, moments, activations); else 0 (the
 * process's peak RSS is the measure then). */
int trainer_device_peak(const trainer *t, long long *bytes);
/* The per-op profile of the device (kdev_profile_start / kdev_profile_report), single
 * rank: start, then the table into buf (owned by the caller). */
int trainer_profile_start(trainer *t, hearth_err *err);
int trainer_profile_report(trainer *t, char *buf, size_t len, hearth_err *err);
/* The hardware the trainer runs on, for the log ("cpu", or the GPU's name). */
const char *trainer_device_name(const trainer *t);
/* kdev_lib_version of the device the model trains on; 0 for multi-rank runs and the cpu. */
int trainer_lib_version(const trainer *t, kdev_lib lib);

/* Hugging Face Qwen2.5-VL checkpoints (hf_weights.h, hf_config.h, docs/hf.md).
 * trainer_init_from_hf checks src (the checkpoint's config.json, hf_config_load) against
 * sh (the run's model shape) and replaces the initial parameters of every rank by the
 * checkpoint's; call it before the first step.  trainer_export_hf writes the current
 * parameters (gathered from every rank) with config.json (src's as read when src is not
 * NULL, else made from sh), in shards of at most HF_EXPORT_SHARD_BYTES. */
#define HF_EXPORT_SHARD_BYTES ((size_t)5 << 30)
int trainer_init_from_hf(trainer *t, const model_shape *sh, const hf_config *src,
                         const char *dir, hearth_err *err);
int trainer_export_hf(trainer *t, const model_shape *sh, const hf_config *src,
                      const char *dir, st_dtype dtype, hearth_err *err);

/* Nonzero when x is NaN or infinite. */
int train_nonfinite(double x);

#endif
