/* select_encoder.h - ranking encoder layouts (uniform, hetero_tp(etp), hetero_dp,
 * full_separation with and without offload) for fixed model, ranks and decoder layouts
 * (docs/select.md, "hearth select encoder").
 *
 * A candidate is measured when completed runs match it exactly: device, ranks, sequence
 * length, micro batch (and global batch when asked), decoder tp/pp/vpp/cp, strategy,
 * encoder tp and offload.  Its number is the median tokens/s over those runs, with the
 * min..max spread.  Every candidate also gets the cost model's prediction
 * (select_cost.h); an unmeasured one is ranked by it.  Measured and predicted numbers are
 * ranked together: the output says which is which.
 *
 * Pure apart from what the caller passes in (runs read by select_db.h).  Ownership:
 * select_encoder_rank fills a result that select_encoder_result_free releases. */
#ifndef HEARTH_SELECT_ENCODER_H
#define HEARTH_SELECT_ENCODER_H

#include <stddef.h>
#include <stdio.h>

#include "select_cost.h"
#include "select_db.h"
#include "shape/run_config.h"

typedef struct {
    run_config cfg;            /* the candidate's resolved config (valid) */
    int n_measured;
    double measured, measured_min, measured_max;   /* tokens/s over matching runs */
    double predicted;          /* tokens/s, cost model */
    double predicted_step_s;
    double embedding_bytes;
    double score;              /* measured when n_measured, else predicted */
} select_enc_cand;

typedef struct {
    size_t n;                  /* best first */
    select_enc_cand *c;
    size_t n_measured;         /* candidates with runs */
    select_cost_rates rates;
} select_enc_result;

/* The rates for predicting configs like `c`: the median achieved FLOP/s per GPU
 * (flops_per_token x tokens_per_s_per_gpu) of runs on the same device, else the layer
 * benchmarks' decoder rows (b may be NULL), else nominal; rates->source says which. */
void select_encoder_rates(const run_config *c, const select_run *runs, size_t n_runs,
                          const select_bench_set *b, select_cost_rates *rates);

/* Ranks every valid encoder layout of each base config (bases[i]: resolved configs that
 * differ in the decoder layout; their encoder settings are ignored).  `match_global_batch`:
 * a run must also have the base's global batch. */
int select_encoder_rank(const run_config *bases, size_t n_bases, const select_run *runs,
                        size_t n_runs, const select_cost_rates *rates, int match_global_batch,
                        select_enc_result *out, hearth_err *err);
void select_encoder_result_free(select_enc_result *r);

/* "hetero_tp(etp 2)", "full_separation+offload", ...: the candidate's encoder layout. */
void select_encoder_label(const run_config *c, char *buf, size_t size);

/* The spec (YAML) of a sweep that would measure the unmeasured candidates (`repeat`
 * runs each; the global batch fixed when `with_global_batch`, else each layout's auto);
 * nothing when every candidate is measured.  Returns 0 or -1 on a write error. */
int select_encoder_write_sweep(const select_enc_result *r, const char *model, int repeat,
                               int with_global_batch, FILE *f);

/* The candidates as JSON evidence, and a choice as a decision (JSON texts, malloc'd;
 * NULL when out of memory). */
char *select_encoder_evidence_json(const select_enc_result *r);
char *select_encoder_decision_json(const run_config *c);

#endif
