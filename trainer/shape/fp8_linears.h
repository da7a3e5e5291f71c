/* fp8_linears.h - the linear layers of a run's model as an FP8 plan sees them: each
 * (component, kind) with one rank's shard shape and the token count a policy's ranges are
 * matched against (docs/fp8.md "Which linears").
 *
 * Part of the pure model-shape/layout rules module.  The trainer's layer benchmark
 * (--bench-layers) times these shapes; the trainer and the orchestrator's plan count how
 * many of them a plan puts in FP8, to say when a policy matches no linear of the run. */
#ifndef HEARTH_FP8_LINEARS_H
#define HEARTH_FP8_LINEARS_H

#include <stdint.h>

#include "shape/fp8_plan.h"
#include "shape/run_config.h"

/* Tokens through each component's linears in one micro batch on one rank.  decoder:
 * seq_len x micro_batch / cp (the router, the experts and the LM head match this count
 * too); encoder: patches, from the synthetic data's mean image count and mean image side
 * (rounded to whole merge units, at most seq_len - 1 units per sequence): images vary per
 * micro batch, this is the typical count; projector: merged units (patches /
 * spatial_merge^2).  0 where the component is absent or the data has no images. */
typedef struct {
    int64_t decoder, encoder, projector;
} fp8_micro_tokens;
void fp8_micro_tokens_of(const run_config *c, fp8_micro_tokens *t);

/* One kind of linear of a component: out[rows, N] = in[rows, K] . W[N, K]^T on one rank. */
typedef struct {
    int comp, kind;       /* fp8_comp, fp8_kind_id */
    int tp;               /* the component's tensor-parallel size (a policy rule's tp) */
    int K, N;             /* in and out features of this rank's shard (model_par.h) */
    int64_t tokens;       /* the micro batch's tokens of the component (fp8_micro_tokens) */
    int64_t rows;         /* rows of one call: tokens, or for a routed expert the mean rows
                             routed to one expert (tokens x top_k / experts, >= 1) */
    int layers;           /* how many layers hold it (1 for the projector and the LM head) */
} fp8_linear;

#define FP8_LINEARS_MAX 16

/* The linears of c's model, one per (component, kind), encoder then projector then
 * decoder; returns how many were written to out (at most FP8_LINEARS_MAX). */
int fp8_linears_of(const run_config *c, fp8_linear *out);

/* How many linears of c's model (every layer counted) plan p computes in FP8 at the
 * micro batch's token counts (fp8_micro_tokens).  0 for a plan that matches none. */
int fp8_plan_count(const fp8_plan *p, const run_config *c);

#endif
