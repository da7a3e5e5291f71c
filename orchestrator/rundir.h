/* rundir.h - the files `hearth submit` writes into a run directory, and reading them back.
 *
 *   runs/<experiment>/<run-id>/
 *     run.yaml     the resolved run config (hearth-train --config run.yaml)
 *     job.json     how to run it: trainer, working directory, setup lines, cpus, wall time,
 *                  retries... (so that `resume`, the crash-recovery of a later `submit` and
 *                  a replacement run need nothing but the run directory and the database)
 *     job.sh       the job script rendered from templates/<backend>.sh.tmpl
 *   (a layer benchmark's directory, RUNS_DIR/bench-layers/NAME/, holds the same three:
 *   its job runs the trainer with --bench-layers and leaves layer_bench.json)
 *   written later by the job: stdout.log, stderr.log, exit_code, job.lock (local backend),
 *   and the trainer's metrics.jsonl, result.json, config.json, train.log.
 *
 * run.yaml is the canonical JSON of the resolved config (JSON is YAML; the canonical form
 * is itself a run config).  rundir_write checks that run.yaml reads back to the same
 * config hash before anything runs.
 *
 * Every file is written to a temporary name and renamed, so a crash never leaves a
 * half-written one. */
#ifndef HEARTH_RUNDIR_H
#define HEARTH_RUNDIR_H

#include <stdint.h>

#include "shape/err.h"

typedef struct {
    char *run_id;
    char *experiment;
    char *backend;            /* "local" */
    char *trainer;            /* absolute path of hearth-train */
    char *workdir;            /* the job's working directory (where submit ran) */
    int n_setup;
    char **setup;             /* resources.setup lines */
    char *config_hash;
    int cpus_per_task;        /* >= 1 */
    int64_t time_limit_s;     /* 0: none */
    int retries;              /* further attempts after a failure */
    int repeat;               /* runs wanted per point (for replacement runs) */
    int max_concurrent;       /* 0: no limit */
    int retry_timeout;        /* resources.retry_timeout: a timeout is retried (job.json
                                 "retry_timeout"; absent: false) */
    char *after_experiment;   /* NULL: none */
    int after_any;            /* after.on: any (else ok) */
    /* Slurm only (job.json "slurm"): resources.partition, .account, .qos, .constraint
     * (NULL: unset) and resources.sbatch (extra sbatch options, passed as they are). */
    char *partition, *account, *qos, *constraint;
    int n_sbatch;
    char **sbatch;
    int pack;                 /* resources.pack (job.json slurm.pack; absent: 1): up to this
                                 many runs of one shape run one after another in one job */
    /* How the trainer is launched (job.json "launch"; absent: a CPU run).  A CPU run is one
     * task of cpus_per_task threads on one node: nodes 1, gpus_per_node 0.  A device cuda
     * run is one task per GPU: resources.nodes x resources.gpus_per_node tasks (ranks),
     * started by `srun --mpi=pmix` on Slurm. */
    int nodes;                /* >= 1 */
    int gpus_per_node;        /* 0: a CPU run */
    /* The job runs `hearth-train --bench-layers` (`hearth bench layers`) instead of a
     * training run: job.json "mode": "bench-layers" (absent: a run).  Such a directory is
     * a layer benchmark's, never a run's: `hearth ingest` passes it over. */
    int bench_layers;
} rundir_job;

void rundir_job_free(rundir_job *j);
/* Deep copy (strings duplicated); the caller frees *out with rundir_job_free. */
int rundir_job_copy(rundir_job *out, const rundir_job *in, hearth_err *err);

/* Reads RUN_DIR/job.json (HERR_IO when missing, HERR_CONFIG when malformed). */
int rundir_job_read(const char *run_dir, rundir_job *out, hearth_err *err);

/* Creates `run_dir` (and its parents) and writes run.yaml, job.json and job.sh (0755),
 * the script rendered from the template text `tmpl` (named tmpl_name in messages).
 * `config_json` is the run's canonical config JSON. */
int rundir_write(const char *run_dir, const rundir_job *j, const char *config_json,
                 const char *tmpl_name, const char *tmpl, hearth_err *err);

/* run.yaml's text for a canonical config JSON (see above).  malloc'd; NULL with err. */
char *rundir_config_yaml(const char *config_json, hearth_err *err);

/* RUN_DIR/run.yaml read back (rebuilding a database, rebuild.h): the canonical JSON of the
 * config it holds in *json (malloc'd), which must have config hash `hash` (job.json's);
 * HERR_IO when unreadable, HERR_CONFIG naming the file when malformed or of another hash. */
int rundir_config_read(const char *run_dir, const char *hash, char **json, hearth_err *err);

/* RUN_DIR/exit_code: returns 1 and stores the code, 0 when the file is absent or does not
 * hold a number (a job that never got to write it). */
int rundir_exit_code(const char *run_dir, int *code);

/* 1 when RUN_DIR/checkpoints/latest exists: the next attempt resumes from that
 * checkpoint (the job script passes --resume RUN_DIR; docs/checkpoints.md). */
int rundir_has_checkpoint(const char *run_dir);

/* Before attempt `attempt` (2, 3, ...) of a run: moves the previous attempt's stdout.log,
 * stderr.log, exit_code and result.json (and, unless `keep_outputs`, metrics.jsonl,
 * train.log and config.json) into RUN_DIR/attempt-<attempt-1>/.  A preempted run keeps its
 * outputs (its checkpoint lives there and the trainer continues from it); its result.json
 * goes all the same, so that a later attempt is never recorded from an earlier one's. */
int rundir_archive_attempt(const char *run_dir, int attempt, int keep_outputs,
                           hearth_err *err);

/* mkdir -p. */
int rundir_mkdirs(const char *path, hearth_err *err);
/* rm -r: removes `path` and everything under it without following symbolic links (a link
 * is removed, never what it points to).  A missing path is fine.  On an error the part not
 * yet removed stays, and the message names the entry that could not be removed. */
int rundir_remove_tree(const char *path, hearth_err *err);
/* Writes `len` bytes atomically (temporary file + rename) with mode `mode`. */
int rundir_write_file(const char *path, const char *data, size_t len, int mode,
                      hearth_err *err);

/* "RUN_DIR/NAME" into buf; HERR_IO when it does not fit. */
int rundir_path(char *buf, size_t size, const char *run_dir, const char *name,
                hearth_err *err);

#endif
