/* select_cost.h - the analytic step-time model that `select encoder`, `auto` and the plan's
 * GPU-hours estimate fall back on where no run measured a layout (docs/select.md, "Cost
 * model").
 *
 * Compute: the model's training FLOPs (shape_count_flops: decoder per token, encoder per
 * patch and per patch², projector per patch) at one effective FLOP rate per GPU.  Images
 * per micro batch follow the config's synthetic data (mean image count, mean side rounded to
 * patch x merge).  Communication: the bytes per rank of docs/parallel/<strategy>.md (encoder
 * TP allreduces, embedding routing or gather/broadcast, encoder and decoder gradient
 * reductions) over one link bandwidth; offload adds device<->host copies at the host
 * bandwidth.  Pipeline: (M + (pp-1)/vpp) x the slowest stage's time per micro batch, stage 0
 * carrying the encoder for uniform / hetero_tp / hetero_dp; full_separation encodes outside
 * the pipeline, its ceil(M/G) micro batches per rank.  No overlap, no latencies.
 *
 * Pure: no I/O. */
#ifndef HEARTH_SELECT_COST_H
#define HEARTH_SELECT_COST_H

#include "select.h"
#include "shape/run_config.h"

typedef struct {
    double flops_per_s;       /* effective training FLOP/s of one GPU (or CPU rank) */
    double link_bytes_per_s;  /* between ranks */
    double host_bytes_per_s;  /* device <-> pinned host (offload) */
    char source[96];          /* where flops_per_s came from, for the output */
} select_cost_rates;

typedef struct {
    double step_s;
    double tokens_per_s;
    double encoder_s, decoder_s, comm_s, bubble_s;   /* parts of step_s (per step) */
    double embedding_bytes;   /* embedding rows a rank holds on the device at the peak */
} select_cost;

/* Nominal rates for a device: cuda 4e14 FLOP/s (40% of a Hopper GPU's dense bf16 peak),
 * 2e11 B/s links, 2.5e10 B/s host copies; cpu 1e9 FLOP/s (one rank of the fp32 reference
 * path), 1e10 B/s, 1e10 B/s. */
void select_cost_nominal(device_kind d, select_cost_rates *r);

/* The effective bf16 FLOP rate that layer benchmark rows of the decoder's linears (qkv,
 * proj, fc1, fc2) show for model shape m: sum of their FLOPs over sum of their times.
 * Returns 0 (and leaves *flops_per_s) when the rows have none. */
int select_cost_rate_from_bench(const model_shape *m, const select_bench_set *b,
                                double *flops_per_s);

/* Predicts one step of config c (resolved, valid). */
void select_cost_predict(const run_config *c, const select_cost_rates *r, select_cost *out);

#endif
