/* select_db.h - the results database side of selection: layer benchmark sets
 * (`hearth bench ingest`), the decisions table, and the completed runs that
 * `select encoder` ranks (docs/select.md).
 *
 * Errors: 0 or a negative herr_code with the message in err; a malformed layer_bench.json
 * is HERR_CONFIG naming "FILE: rows[N].KEY: what is wrong".  Writes are atomic (db.h). */
#ifndef HEARTH_SELECT_DB_H
#define HEARTH_SELECT_DB_H

#include <stdint.h>

#include "db.h"
#include "select.h"

/* Parses layer_bench.json text (`file` names it in messages) into *out (free it with
 * select_bench_set_free). */
int select_bench_parse(const char *file, const char *text, size_t len, select_bench_set *out,
                       hearth_err *err);

/* Reads, checks and records layer_bench.json at `path` as one set, with `run` (runs.id,
 * 0: none) as its origin.  The same file content twice is recorded once: *added (may be
 * NULL) is 0 then, else 1.  *set (may be NULL) receives the parsed set. */
int select_bench_ingest(hearth_db *db, const char *path, int64_t run, int *added,
                        select_bench_set *set, hearth_err *err);

/* The newest set for `model` (on `gpu`, or on any GPU when gpu is NULL).  Returns 1 with
 * *out filled, 0 when there is none, or an error. */
int select_bench_load(hearth_db *db, const char *model, const char *gpu,
                      select_bench_set *out, hearth_err *err);

/* Records a decision (kind "encoder" or "fp8"; method measured|predicted|mixed|none);
 * subject, decision and evidence are JSON texts; experiment and config_hash may be NULL. */
typedef struct {
    const char *kind;
    const char *experiment, *config_hash;
    const char *subject, *decision, *method, *evidence;
} select_decision;
int select_decision_record(hearth_db *db, const select_decision *d, int64_t *id,
                           hearth_err *err);

/* A completed run with a throughput, as `select encoder` matches it. */
typedef struct {
    char run_id[128];
    char device[8];
    int ranks, seq_len, micro_batch, global_batch;
    int tp, pp, vpp, cp;
    char strategy[24];
    int etp, offload;
    double tokens_per_s;
    double flops_per_token, tokens_per_s_per_gpu;   /* 0 when not recorded */
    double step_ms;                                  /* step_ms_median, 0 when absent */
    int steps;
} select_run;

/* Completed runs of preset `model` with a recorded tokens_per_s, in run order.  *out is
 * malloc'd (*n entries; NULL when none). */
int select_runs_of_model(hearth_db *db, const char *model, select_run **out, size_t *n,
                         hearth_err *err);

/* Completed runs of config `hash` with a recorded step time: their median step_ms and how
 * many there were (*n 0: none). */
int select_runs_of_hash(hearth_db *db, const char *hash, double *median_step_ms, long *n,
                        hearth_err *err);

#endif
