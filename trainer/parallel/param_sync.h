/* param_sync.h - gradients and parameters across the ranks of a layout: gradient
 * reduction, the global gradient norm, AdamW (replicated or ZeRO-1 sharded), and the full
 * parameters gathered back into the single-rank layout.
 *
 * Input: the tensors of this rank's local models (model_par.h), each with its
 * model_shard (model.h), and the rank's decoder and encoder parallel states
 * (parallel_state.h).  Where each tensor's gradient is summed:
 *   1. shard.tp_partial: over the component's TP group (decoder: decoder TP; encoder and
 *      projector: encoder TP);
 *   2. shard.kv_rep > 1: the k and v row segments over the kv_rep consecutive ranks of that
 *      TP group that share the kv head (t / kv_rep equal);
 *   3. a tied embedding and its last-stage copy (shard.tied_copy): over the two ranks
 *      holding them (the first and last pipeline stage, same t, c, d);
 *   4. replicas: encoder and projector tensors over the encoder DP group; decoder routed
 *      experts (shard.expert) over EDP; every other decoder tensor over DP_CP.
 * Step 4 is an allreduce, or with the distributed optimizer a reduce-scatter: each rank
 * of the replica group then owns 1/n of that group's flattened gradients, keeps AdamW
 * state for that part only, updates it, and all-gathers the updated parameters.
 * Each step makes one collective per group: the tensors reduced over a group are
 * flattened in tensor order (models in the given order) into one buffer, padded with
 * zeros to a multiple of the group size for the reduce-scatter.  Because the reductions
 * of comm.h run in group-rank order and reduce_scatter's chunk equals the same chunk of
 * an allreduce, both optimizers see bitwise the same reduced gradients.
 *
 * What the shard fields must satisfy (checked at create, HERR_RUNTIME otherwise): a
 * tensor name starts with "encoder.", "projector." or "decoder." (its component);
 * kv_rep > 1 comes with 3 row segments (q, k, v) and is the same for all tensors of a
 * component and divides its TP size; a tied copy is a decoder tensor with pp > 1.  The
 * first stage's partner of the tied copy is the tensor named "decoder.embed.weight" on
 * pipeline rank 0 when the shape has tied embeddings and pp > 1.
 *
 * The global gradient norm counts every element of the FULL model once: a tensor
 * replicated over tp (shard.tp_replicated) on tp rank 0 only, a kv segment on the first
 * of its kv_rep ranks, a tied copy not at all, replicas on one rank (or each rank its own
 * ZeRO part); the partial sums of squares are summed over the world.  Sums run in a fixed
 * order so the result is identical on every rank.
 *
 * Frozen tensors take no part in anything.  AdamW is the single-rank trainer's (train.h:
 * betas, eps, decay only on tensors with decay set), applied elementwise after scaling
 * gradients by the clip factor, so every layout updates exactly like one rank up to the
 * order of floating-point sums.
 *
 * Ownership: param_sync_create copies the tensor list (shard fields are read once, at
 * create), creates the extra groups it needs (kv-replica and tied-embedding groups, only
 * where a rank has such tensors; their members always do too, so every member creates
 * them in the same order) from `world` and allocates optimizer state (zero moments) and
 * the flat buffers; param_sync_free frees those.  Models, parallel states and `world` are borrowed and
 * must outlive it.  Every rank of the world calls create, reduce and step in the same
 * order (they are collective over the world). */
#ifndef HEARTH_PARAM_SYNC_H
#define HEARTH_PARAM_SYNC_H

#include "comm/comm.h"
#include "model/model.h"
#include "parallel/parallel_state.h"
#include "shape/err.h"

typedef struct param_sync param_sync;

typedef struct {
    int distributed_optimizer;   /* ZeRO-1: reduce-scatter, sharded AdamW, all-gather */
    float beta1, beta2, eps;     /* TRAIN_ADAM_* */
} param_sync_opts;

/* models: this rank's local models (one per virtual pipeline chunk; their parameter and
 * gradient arrays are the ones synchronised).  dec and enc are this rank's parallel
 * states (enc->present == 0 when the rank holds no encoder).  opts NULL: replicated
 * optimizer with train.h's AdamW constants. */
int param_sync_create(param_sync **out, model *const *models, int n_models,
                      const parallel_state *dec, const parallel_state *enc, comm *world,
                      const param_sync_opts *opts, hearth_err *err);
void param_sync_free(param_sync *s);

/* After the last backward of a step: reduces the gradients (steps 1-4 above) and sets
 * *grad_norm to the global L2 norm, identical on every rank.  Afterwards the models'
 * gradient arrays hold the reduced gradients; with the distributed optimizer only in the
 * rank's own part of each replica bucket (elsewhere: after steps 1-3 only).  Frozen
 * tensors' gradients are not read or written. */
int param_sync_reduce(param_sync *s, double *grad_norm, hearth_err *err);

/* AdamW step `step` (from 1) with learning rate lr, weight decay wd (on tensors with
 * `decay` only) and gradients scaled by clip (kcpu_clip_factor) first; with the
 * distributed optimizer each rank updates its part and the parameters are all-gathered.
 * The gradients are those of the last param_sync_reduce (kept inside; later changes to
 * the models' gradient arrays are not seen); a step without a reduce since the previous
 * step fails with HERR_RUNTIME.  The update is elementwise kcpu_adamw_update, so for
 * the same reduced gradients and clip factor it is bitwise the single-rank trainer's.
 * Afterwards every replica of a tensor holds bitwise the same values. */
int param_sync_step(param_sync *s, int step, float lr, float wd, float clip,
                    hearth_err *err);

/* Gathers every tensor of the full model into `full` (the parameter array of a
 * single-rank model of the same shape, whose tensor table `full_model` gives the
 * offsets by name; model_param_count(full_model) floats, overwritten).  Frozen tensors
 * included.  Each element is written by its one canonical rank (the rule of the norm,
 * with replica 0 of each replica group), other ranks add zeros, and one allreduce over
 * the world sums them, so the values are exact.  Collective over the world; every rank
 * gets the result.  For tests and checkpoints. */
int param_sync_gather(param_sync *s, model *full_model, float *full, hearth_err *err);

/* The optimizer state this rank keeps, as arrays for checkpoints: i in
 * [0, param_sync_state_count) gives the array's name ("adam_m/dp_cp", "adam_v/expert_dp",
 * ...: the AdamW moments of the rank's own part of each replica bucket, all of the bucket
 * without the distributed optimizer), its data (owned by s; written by a restore) and
 * its length.  The same layout always lists the same arrays in the same order. */
int param_sync_state_count(const param_sync *s);
float *param_sync_state_at(param_sync *s, int i, const char **name, size_t *n);

#endif
