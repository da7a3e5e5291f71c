/* rebuild.h - recording runs again from their run directories: how a results database
 * that was deleted, replaced or lost is rebuilt (`hearth ingest DIR...`).
 *
 * A run directory (rundir.h) holds all that its database rows hold: job.json names the
 * run, its experiment, backend and config hash; run.yaml is the resolved config; the job
 * and the trainer wrote exit_code, result.json and metrics.jsonl; attempt-N/ keeps the
 * earlier attempts.  What it cannot tell is recorded as little as possible:
 *   - a run that never started (none of exit_code, result.json, metrics.jsonl,
 *     stdout.log, job.lock) is `pending` (`requeued` when an attempt-N/ exists);
 *   - a started run is recorded `running`, with attempts = 1 + its attempt-N/ folders, and
 *     its outputs are ingested (ingest.h).  How it ended is then settled by the runner's
 *     own reconcile (sweep.h: a live job is waited for, an exit code or a result.json
 *     ends it, a vanished job is replaced), the same rules as after a killed runner;
 *   - the spec text and the history before this rebuild are not in the directory and
 *     are not restored; a cancelled or timed-out run comes back as failed.
 *
 * Idempotent, and never overwriting: a run whose id the database has already is left as
 * it is (counted as `known`); if its config hash differs from the directory's, that is an
 * error naming both.  Every run is recorded in its own transaction. */
#ifndef HEARTH_REBUILD_H
#define HEARTH_REBUILD_H

#include <stddef.h>

#include "db.h"
#include "run_state.h"

/* A run directory found: its absolute path, and job.json's experiment and run number
 * (the N of its id "<experiment>-N"). */
typedef struct {
    char *dir;
    char *experiment;
    long seq;
} rebuild_dir;

/* Run directories sorted by experiment, then run number.  Free with rebuild_dirs_free. */
typedef struct {
    rebuild_dir *v;
    size_t n;
} rebuild_dirs;

/* Collects the run directories (those holding job.json) under each of `paths`: a run
 * directory itself, an experiment directory (RUNS_DIR/EXP) or a runs directory
 * (RUNS_DIR).  A path that is none of these, or holds no run directory, fails with
 * HERR_CONFIG naming it; an unreadable job.json with its error. */
int rebuild_find(const char *const *paths, size_t n_paths, rebuild_dirs *out,
                 hearth_err *err);
void rebuild_dirs_free(rebuild_dirs *d);

typedef enum {
    REBUILD_RECORDED,         /* the run was missing and is recorded now */
    REBUILD_KNOWN,            /* the database has it already: left alone */
} rebuild_outcome;

typedef struct {
    rebuild_outcome outcome;
    run_state state;          /* as recorded (REBUILD_RECORDED) */
    long metric_rows;         /* steps ingested from metrics.jsonl */
    int has_result;           /* result.json was ingested */
    int ingest_failed;        /* its outputs could not be ingested (why: ingest_err); the
                                 run is recorded all the same, and the reconcile ends it
                                 with that message, as a runner would */
    hearth_err ingest_err;
} rebuild_run_info;

/* Records the run of `run_dir` (see above).  `info` may be NULL.  A malformed job.json or
 * run.yaml fails with HERR_CONFIG or HERR_IO naming the file, and the database is
 * unchanged for that run. */
int rebuild_run(hearth_db *db, const char *run_dir, rebuild_run_info *info, hearth_err *err);

#endif
