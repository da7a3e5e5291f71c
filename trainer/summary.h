/* summary.h - the run's summary statistics for result.json, from the per-step stats.
 *
 * Throughput and step-time percentiles count the steps (numbered from 1) from
 * train.measure_from on; the earlier ones are warm-up.  When no step reached
 * measure_from (a run shorter than its warm-up), every step run is counted instead, so
 * a short run still reports numbers. */
#ifndef HEARTH_SUMMARY_H
#define HEARTH_SUMMARY_H

#include "shape/err.h"
#include "shape/model_shape.h"
#include "train.h"

typedef struct {
    int measure_from;
    shape_flops flops_model;
    int n, cap;
    int *step;
    double *step_ms;
    long *tokens;
    double *flops;           /* training FLOPs of each step (shape_count_flops) */
    double last_loss;        /* NaN before the first step */
} run_summary;

/* What result.json reports about the steps.  NaN where there is nothing to report. */
typedef struct {
    int steps;               /* steps run (the last one included even when it diverged) */
    int measured;            /* steps counted in the numbers below */
    double step_ms_median, step_ms_p10, step_ms_p90;
    double tokens_per_s;
    double flops_per_token;  /* the steps' training FLOPs (decoder, encoder, projector)
                                per decoder token */
    double final_loss;
} summary_numbers;

void summary_init(run_summary *s, int measure_from, const shape_flops *flops);
/* The training FLOPs of one step by shape_count_flops' model: decoder per token, encoder
 * N*per_patch + N^2*per_patch_sq per image of N patches, projector per patch. */
double summary_step_flops(const shape_flops *f, const train_step_stats *st);
void summary_free(run_summary *s);
int summary_add(run_summary *s, const train_step_stats *st, hearth_err *err);
/* summary_add with the step's numbers given directly (a resumed run restores the steps
 * before its checkpoint this way). */
int summary_push(run_summary *s, int step, double step_ms, long tokens, double flops,
                 double loss, hearth_err *err);
void summary_compute(const run_summary *s, summary_numbers *out);

/* Linear interpolation between closest ranks (numpy's default) over sorted[0..n-1],
 * q in [0, 1].  NaN when n == 0. */
double summary_percentile(const double *sorted, int n, double q);

#endif
