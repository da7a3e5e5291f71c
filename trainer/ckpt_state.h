/* ckpt_state.h - one rank's training state as a list of named arrays, written to and read
 * from that rank's checkpoint file (rank-RRRRR.safetensors, docs/checkpoints.md).
 *
 * The trainers (train.c for one rank, parallel/ptrain_ckpt.c for a layout) list what a
 * step depends on: parameters ("param/<tensor>"), AdamW moments ("adam_m/...",
 * "adam_v/..."), the FP8 amax histories ("fp8/amax_history", "fp8/history_pos"), each
 * under a prefix per model chunk where a rank has several.  Writing puts them in one
 * safetensors file in list order with the step as metadata; reading requires the file
 * to hold exactly the listed names, each with the listed dtype and element count, and
 * copies the values back in place.
 *
 * Ownership: the list borrows the arrays (they must stay valid until the write or read
 * returns); ckpt_items_free frees only the list. */
#ifndef HEARTH_CKPT_STATE_H
#define HEARTH_CKPT_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "safetensors.h"
#include "shape/err.h"

typedef struct {
    char name[ST_NAME_MAX];
    st_dtype dtype;             /* ST_F32 or ST_I32 */
    void *data;                 /* borrowed */
    size_t numel;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
} ckpt_item;

typedef struct {
    ckpt_item *v;
    int n, cap;
} ckpt_items;

void ckpt_items_init(ckpt_items *l);
void ckpt_items_free(ckpt_items *l);

/* Adds one array: dims[0..ndim) when their product is numel, else a 1-D [numel]. */
int ckpt_items_add(ckpt_items *l, const char *name, st_dtype dtype, void *data, size_t numel,
                   int ndim, const int64_t *dims, hearth_err *err);
/* Adds m's parameters as PREFIX"param/<tensor>" and, when m has an FP8 plan,
 * PREFIX"fp8/amax_history" and PREFIX"fp8/history_pos" (m must own its histories). */
int ckpt_items_add_model(ckpt_items *l, model *m, const char *prefix, hearth_err *err);
/* The same with the parameters read from / written to p, a host array of the model's
 * layout (a model on another device than the cpu is saved through such a copy). */
int ckpt_items_add_model_at(ckpt_items *l, model *m, float *p, const char *prefix,
                            hearth_err *err);

/* DIR/rank-RRRRR.safetensors into out[0..n); HERR_IO when too long. */
int ckpt_rank_path(char *out, size_t n, const char *dir, int rank, hearth_err *err);

/* Writes the arrays to `path` (safetensors, atomically: the writer's temp file, fsync,
 * rename) with metadata "step" = step and "format" = CKPT_STATE_FORMAT. */
#define CKPT_STATE_FORMAT "hearth-train-state-1"
int ckpt_items_write(const ckpt_items *l, const char *path, int step, hearth_err *err);
/* Reads `path` back into the arrays.  HERR_IO when it cannot be opened or parsed,
 * HERR_CONFIG when its contents do not match the list or its step is not `step` (the
 * message names the file and the tensor). */
int ckpt_items_read(const ckpt_items *l, const char *path, int step, hearth_err *err);

#endif
