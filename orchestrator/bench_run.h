/* bench_run.h - `hearth-train --bench-layers` as one job of a backend (`hearth bench
 * layers`): on this machine (local) or on a node of the cluster (slurm, slurmrest).
 *
 * The benchmark's directory, RUNS_DIR/bench-layers/NAME-TIME/, is written like a run's
 * (rundir.h: run.yaml, job.json with mode bench-layers, job.sh rendered from the backend's
 * template), so the job is started, followed and cancelled by the same backend code as
 * the runs of `hearth submit` (backend.h), with the same sbatch options for the same
 * resources.  It is no run: the runs table never hears of it, and `hearth ingest` passes
 * its directory over.  What it leaves is DIR/layer_bench.json, which the caller ingests
 * (select_db.h); its log is DIR/stderr.log (the trainer's progress) beside stdout.log. */
#ifndef HEARTH_BENCH_RUN_H
#define HEARTH_BENCH_RUN_H

#include <signal.h>
#include <stddef.h>
#include <stdio.h>

#include "rundir.h"

typedef struct {
    const char *backend;       /* "local", "slurm", "slurmrest" (NULL: local) */
    const char *runs_dir;      /* the directory goes into RUNS_DIR/bench-layers/ */
    const char *name;          /* NAME of the directory: what is measured (the model) */
    const char *config_json;   /* the run config to measure with (canonical JSON) */
    /* trainer, workdir, config_hash, cpus_per_task, time_limit_s, Slurm resources, setup
     * lines and launch (nodes 1; gpus_per_node 1 on cuda, else 0); the rest is set here. */
    const rundir_job *job;
    long timeout_s;            /* give up (and cancel the job) after this long; 0: never */
    volatile sig_atomic_t *stop; /* once set (stop_signal.h): cancel the job; NULL: never */
    FILE *progress;            /* the job's id, its start and its end, a line each */
} bench_run_opts;

/* Checks that the trainer has a --bench-layers mode (its --help), writes the directory,
 * submits its job through the backend and waits for it to end.  Returns 0 when the job
 * ended with exit 0, with its directory (holding layer_bench.json) in dir; otherwise a
 * herr_code: HERR_CONFIG for a trainer without the mode or a bad config, HERR_RUNTIME for
 * a job that failed, was cancelled (--timeout, or *stop set: an interrupted hearth cancels
 * its job rather than leave it running unrecorded), timed out or vanished, naming the job
 * id and the log (the directory then stays, for the log). */
int bench_run_job(const bench_run_opts *o, char *dir, size_t size, hearth_err *err);

#endif
