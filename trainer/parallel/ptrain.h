/* ptrain.h - one rank's trainer in a parallel layout (decoder tp/sp/pp/vpp/dp/ep, the
 * encoder's own strategy, the distributed optimizer).
 *
 * The step is the single-rank trainer's (train.h: data, loss scale, clipping, AdamW and
 * its schedule), spread over the ranks:
 *   1. data: the step's M = global_batch / micro_batch micro batches; DP rank d takes
 *      micro batches [d*M/dp, (d+1)*M/dp); every rank of a model-parallel group
 *      materialises the same ones (synthetic samples are a pure function of their index).
 *      The loss scale is 1 / (target tokens of the whole global batch).
 *   2. the encoder, by strategy (ptrain_encode.c; docs/parallel/);
 *   3. the decoder pipeline: each stage runs its pp_schedule op list (1F1B, interleaved
 *      when vpp > 1), activations travel by send/recv in the PP group, one activation
 *      slot (a model clone) per micro batch in flight (ptrain_pipe.c);
 *   4. gradients and AdamW through param_sync.
 * Every rank returns the same step statistics (losses and counts are reduced over the
 * world), except the timings, which are the rank's own.
 *
 * Ownership: ptrain_create copies the config and borrows `world` (this rank's handle on
 * the whole world, size cfg->ranks), which must outlive the trainer; ptrain_free frees
 * everything else.  Every rank creates, steps and gathers in lockstep (collective). */
#ifndef HEARTH_PTRAIN_H
#define HEARTH_PTRAIN_H

#include "comm/comm.h"
#include "model/model.h"
#include "shape/err.h"
#include "shape/run_config.h"
#include "train.h"

typedef struct ptrain ptrain;

/* Errors: HERR_CONFIG for a layout this build cannot run (the message names the rule or
 * key), others as the parts report them. */
int ptrain_create(ptrain **out, const run_config *cfg, comm *world, hearth_err *err);
void ptrain_free(ptrain *t);

/* One step (steps count from 1).  0, TRAIN_DIVERGED (update not applied, on every rank
 * alike) or a negative herr code. */
int ptrain_step(ptrain *t, train_step_stats *st, hearth_err *err);

/* The full model's parameters gathered into dst, laid out as the parameter array of
 * `full` (a single-rank model of the same shape; dst may be model_params(full)).
 * Collective; every rank gets the result. */
int ptrain_gather(ptrain *t, model *full, float *dst, hearth_err *err);

/* Sets this rank's parameters (every model chunk) to its shard of the parameters of
 * `full`, a single-rank model of the same shape (e.g. loaded from a Hugging Face
 * checkpoint).  Optimizer state is untouched.  Not collective. */
int ptrain_scatter(ptrain *t, const model *full, hearth_err *err);

/* This rank's checkpoint file DIR/rank-RRRRR.safetensors (ckpt_state.h): its model
 * chunks' parameters and FP8 histories ("param/...", "fp8/..."; prefixed "chunkV/" when
 * the rank has vpp > 1 chunks) and its optimizer state (param_sync_state_at).  Not
 * collective: each rank writes or reads its own file; ptrain_load sets the steps done to
 * `step`. */
int ptrain_save(ptrain *t, const char *dir, hearth_err *err);
int ptrain_load(ptrain *t, const char *dir, int step, hearth_err *err);

/* This rank's first model chunk (for inspection). */
model *ptrain_model(ptrain *t);

#endif
