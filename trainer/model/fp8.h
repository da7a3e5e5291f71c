/* fp8.h - FP8 linears of the model (precision.fp8).
 *
 * A linear that the plan puts in FP8 computes as the FP8 GEMM would: its operands are
 * quantised and dequantised (kernels.h, kcpu_fp8_qdq) and the product accumulates in fp32.
 * The products are device ops (kdev_fp8_matmul_*): the cpu runs exactly that emulation,
 * a GPU its FP8 GEMM on the same quantised values where the shape allows (docs/fp8.md).
 *   forward    out = Q4(x) . Q4(w)^T + b           Q4: E4M3 with a per-tensor scale
 *   backward   dx += Q5(dy) . Q4(w),  dw += Q5(dy)^T . Q4(x),  db += column sums of dy
 *              Q5: E5M2; x and w with the scales their forward used
 * The fp32 master weights are never modified; biases stay fp32.
 *
 * Scaling.  Every FP8 linear keeps three amax histories (x, w, dy) of plan.history entries,
 * shared by a model and its clones.  Delayed scaling (the default): a tensor's scale is
 * fp8_max / max(history) / 2^margin, and its own amax then enters the history; a linear's
 * first call, with an empty history, uses its own amax (current scaling).  A history entry
 * is one call: one micro batch through that linear (the GPU path records one per step).
 * plan.current: every call uses the tensor's own amax.  The LM head always uses current
 * scaling: its backward recomputes the logits chunk by chunk, and a chunk's scales must be
 * the same in both passes.
 *
 * Layout.  The amax of a linear split over the component's tensor-parallel group (qkv,
 * proj, fc1, fc2, lm_head) is reduced (max) over that group, so tp layouts quantise with
 * the single-rank scales and agree with it up to fp32 reordering, as without FP8.  Each
 * routed expert has its own histories on the rank that holds it (ep layouts agree too).
 * Data-parallel ranks see different micro batches and keep their own histories (no dp
 * reduction on the CPU path): dp > 1 agrees with one rank only up to the scales.
 *
 * Ownership: model_set_fp8 copies the plan; the model frees its FP8 state with itself. */
#ifndef HEARTH_MODEL_FP8_H
#define HEARTH_MODEL_FP8_H

#include <stdint.h>

#include "comm/comm.h"
#include "kdev.h"
#include "model/model.h"
#include "shape/fp8_plan.h"
#include "shape/err.h"

/* Makes the model's linears follow `plan` (NULL or a plan using nothing: plain fp32, the
 * arithmetic of a model without FP8, bit for bit).  Call it on a model from
 * model_create/model_create_par before making clones; clones made later share its amax
 * histories.  HERR_CONFIG on a clone. */
int model_set_fp8(model *m, const fp8_plan *plan, hearth_err *err);

/* The delayed-scaling state of m, the owner of its amax histories (model_set_fp8; not a
 * clone): *hist = the histories ([*n_hist] floats), *pos = their ring positions
 * ([*n_pos] ints), both owned by m and shared with its clones.  For checkpoints: with
 * the parameters and the optimizer state they are everything a step depends on.  A
 * model without FP8 gives NULL and 0; a clone gives HERR_RUNTIME. */
int model_fp8_state(model *m, float **hist, size_t *n_hist, int **pos, size_t *n_pos,
                    hearth_err *err);

/* ---- inside the model (the files of trainer/model/) ------------------------------------
 * An fp8_layer exists per layer (and for the projector and the head) of each model object;
 * NULL = no FP8.  The two calls below are kdev_matmul_forward / kdev_matmul_backward when
 * f is NULL or the plan leaves this linear in fp32.  e: the local expert for expert kinds, else 0.
 * tokens: the micro batch's tokens through this layer (> 0), or 0 for the last forward's
 * (the backward always uses the last forward's).  Fail on allocation or a collective. */
typedef struct fp8_layer fp8_layer;
int fp8_linear_forward(kdev *dev, fp8_layer *f, int kind, int e, int tokens, float *out,
                       const float *inp, const float *w, const float *bias, int M, int K,
                       int N, hearth_err *err);
int fp8_linear_backward(kdev *dev, fp8_layer *f, int kind, int e, float *dinp, float *dw,
                        float *db, const float *dout, const float *inp, const float *w,
                        int M, int K, int N, hearth_err *err);
/* The same with dinp written, not added to (kdev_matmul_backward_set): the caller does not
 * zero it. */
int fp8_linear_backward_set(kdev *dev, fp8_layer *f, int kind, int e, float *dinp,
                            float *dw, float *db, const float *dout, const float *inp,
                            const float *w, int M, int K, int N, hearth_err *err);
/* Replay mode, for activation recomputation (block.c, recompute_layer sets it for the
 * duration of a layer's rebuild): while on, f's forwards quantise with the scales f's
 * last forward of that linear saved, and record nothing: no amax is taken or reduced over
 * tp, no history entry or position moves, the saved scales stay.  So the rebuilt
 * activations are bitwise the forward's, the gradients those without recomputation, and
 * delayed scaling advances once per micro batch as without recomputation.  The saved
 * scales are this object's (a model or a clone), and every micro batch in flight (pipeline
 * slots, sequence chunks, encoder slots) runs on its own object, so they are the ones of
 * the forward being rebuilt: the backward relies on them the same way.  A replayed forward
 * of a linear with no forward before it fails (HERR_RUNTIME).  f NULL: nothing. */
void fp8_layer_set_replay(fp8_layer *f, int on);
/* Whether fp8_linear_forward(dev, f, kind, ., tokens, ...) would run in FP8 (tokens > 0 is
 * recorded as that forward records it). */
int fp8_linear_uses(fp8_layer *f, int kind, int tokens);
/* A linear outside any model (the layer benchmark, trainer/bench_layers.c): an
 * fp8_layer of `kind` in `comp` with tensor-parallel size tp (no tp group: one rank) whose
 * plan is one rule for that kind at every token count, with delayed scaling over a history
 * of one (training's path: the first call scales from its own amax, later ones from the
 * history, their amaxes recorded on the device), so that fp8_linear_forward/backward
 * always take the FP8 path.  Expert kinds use e = 0.
 * fp8_layer_free releases it (NULL is fine), its scratch on the device it used. */
int fp8_layer_create(fp8_layer **out, int comp, int kind, int tp, hearth_err *err);
void fp8_layer_free(fp8_layer *f);
/* model_clone's part: the clone gets its own scales and scratch over the owner's
 * histories.  model_free's part: frees m's FP8 state. */
int fp8_model_clone(model *clone, const model *owner, hearth_err *err);
void fp8_model_free(model *m);

#endif
