/* fp8.h - FP8 linears of the model, emulated on the fp32 CPU path (precision.fp8).
 *
 * A linear that the plan puts in FP8 computes as the FP8 GEMM would: its operands are
 * quantised and dequantised (kernels.h, kcpu_fp8_qdq) and the product accumulates in fp32.
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
#include "shape/err.h"

typedef enum { FP8_COMP_ENCODER = 0, FP8_COMP_PROJECTOR, FP8_COMP_DECODER, FP8_COMPS } fp8_comp;

/* Linear kinds (the names of policies and layer benchmarks).  fc1 is the swiglu gate_up,
 * fc2 its down projection. */
typedef enum {
    FP8_QKV = 0, FP8_PROJ, FP8_FC1, FP8_FC2, FP8_EXPERT_FC1, FP8_EXPERT_FC2, FP8_SHARED_FC1,
    FP8_SHARED_FC2, FP8_ROUTER, FP8_LM_HEAD, FP8_KINDS
} fp8_kind_id;

const char *fp8_comp_name(int comp);      /* "encoder", ... */
const char *fp8_kind_name(int kind);      /* "qkv", ..., "lm_head" */
int fp8_comp_parse(const char *s);        /* -1 when unknown */
int fp8_kind_parse(const char *s);

#define FP8_ANY (-1)
#define FP8_LAST_LAYER (-2)

/* A linear kind of a component in FP8 from min_tokens tokens (of the micro batch through
 * that layer) up to max_tokens (0: no upper bound), when the component's tp is tp. */
typedef struct {
    int comp, kind, tp;
    int64_t min_tokens, max_tokens;
    double speedup;                       /* evidence, not used by the decision */
} fp8_rule;

/* Linears kept in high precision whatever the rules say: comp, kind and layer (global
 * index within the component, or FP8_LAST_LAYER) each FP8_ANY or a value. */
typedef struct {
    int comp, kind, layer;
} fp8_keep;

typedef struct {
    int all;              /* every linear except the router and the LM head */
    fp8_rule *rules;
    int n_rules;
    fp8_keep *keep;
    int n_keep;
    int history;          /* amax history length (>= 1) */
    int margin;           /* scale = fp8_max / amax / 2^margin */
    int current;          /* current scaling instead of delayed */
} fp8_plan;

#define FP8_DEFAULT_HISTORY 16

/* Frees the rule and keep arrays (owned by the plan) and zeroes it. */
void fp8_plan_clear(fp8_plan *p);
/* Whether a linear of `kind` in layer `layer` (FP8_ANY for the projector and the head) of
 * `comp`, which has n_layers layers and tensor-parallel size tp, runs in FP8 for a micro
 * batch of `tokens` tokens.  keep_bf16 wins over rules and over `all`. */
int fp8_plan_uses(const fp8_plan *p, int comp, int kind, int layer, int n_layers, int tp,
                  int64_t tokens);

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
/* model_clone's part: the clone gets its own scales and scratch over the owner's
 * histories.  model_free's part: frees m's FP8 state. */
int fp8_model_clone(model *clone, const model *owner, hearth_err *err);
void fp8_model_free(model *m);

#endif
