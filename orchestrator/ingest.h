/* ingest.h - recording a run directory's trainer outputs (DESIGN.md, "Trainer outputs")
 * into the results database.
 *
 * Reads RUN_DIR/metrics.jsonl (one JSON object per step), RUN_DIR/result.json and
 * RUN_DIR/exit_code (written by the job script).  All of it is recorded in one transaction
 * (nested in the caller's, if any): either everything a run directory says is recorded, or
 * nothing changes.
 *
 * Idempotent: a file that is present replaces what was recorded from it before (metrics
 * of a step written twice, e.g. after a requeue from a checkpoint, keep the later line);
 * a file that is absent leaves the recorded rows alone, so cleaning up run directories
 * never loses results.
 *
 * Errors name the place: "RUN_DIR/metrics.jsonl:LINE:COL: what" for JSON syntax,
 * "RUN_DIR/metrics.jsonl:LINE: key: what" for a wrong value; the database is unchanged.
 * An unterminated last line of metrics.jsonl that does not parse is a step being written
 * (or cut off by a kill): it is skipped and reported in `truncated_tail`. */
#ifndef HEARTH_INGEST_H
#define HEARTH_INGEST_H

#include "db.h"

typedef struct {
    int has_metrics;      /* metrics.jsonl was present */
    long metric_rows;     /* steps recorded from it */
    int truncated_tail;   /* its last line was incomplete and skipped */
    int has_result;       /* result.json was present and recorded */
    int result_exit_code; /* the hearth-train exit code its exit_status stands for ("done" 0,
                             "failed" 1, "diverged" 3; DESIGN.md, "Exit codes"), -1 when
                             there is no result.json or no such exit_status: how a trainer
                             ended whose job script died before writing exit_code */
    int has_exit_code;    /* exit_code was present */
    int exit_code;        /* its value (also stored as runs.exit_code) */
} ingest_summary;

/* Ingests run `run_id` from `run_dir`, or from the run's recorded directory when run_dir
 * is NULL.  `out` may be NULL.  An unknown run fails with HERR_CONFIG; malformed files
 * with HERR_CONFIG and the place; unreadable ones with HERR_IO. */
int ingest_run(hearth_db *db, const char *run_id, const char *run_dir, ingest_summary *out,
               hearth_err *err);

#endif
