/* model_shard.h - moving a tensor's shard in and out of the full tensor (model.h's
 * model_shard says which slice a rank holds).  Pure index arithmetic, no communication. */
#ifndef HEARTH_MODEL_SHARD_H
#define HEARTH_MODEL_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* The shard that is the whole tensor of ndim dims (single rank). */
void model_shard_whole(model_shard *sh, int ndim, const int64_t *dims);
/* Elements of the shard: (sum of seg_rows) * ncols. */
size_t model_shard_numel(const model_shard *sh);
/* Elements of the full tensor: rows * cols. */
size_t model_shard_full_numel(const model_shard *sh);
/* local = the shard's elements of full, in the shard's order (model.h). */
void model_shard_extract(const model_shard *sh, const float *full, float *local);
/* Writes local into its place in full; elements outside the shard are untouched. */
void model_shard_place(const model_shard *sh, const float *local, float *full);

/* Sets every parameter tensor of `local` (a rank's model, or a single-rank one) to its
 * shard of the same-named tensor of `full` (a single-rank model of the same shape).
 * HERR_RUNTIME naming the tensor when full lacks it or its size differs. */
int model_shard_load_full(model *local, const model *full, hearth_err *err);

#endif
