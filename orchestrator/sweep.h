/* sweep.h - the runner: brings an experiment's runs to an end through a backend.
 *
 * sweep_run() first *reconciles* what an earlier, possibly killed, hearth left behind (every
 * run of the experiment that is submitted or running):
 *   - the job is still alive (backend_track): it is waited for like one of ours;
 *   - it ended and left RUN_DIR/exit_code: it is ingested and finished as usual;
 *   - it ended without exit_code but its trainer wrote a result.json that ingests and
 *     names its exit_status (the job script was killed, the trainer went on to the end):
 *     it is finished as if exit_code held the code that status stands for;
 *   - otherwise the run failed ("job process vanished") and its point gets a new run
 *     (when the point has fewer than `repeat` runs completed or on their way).
 * Then it runs the pending (and requeued) runs with at most `jobs` at once, in run order:
 * each run goes pending -> submitted -> running (job id recorded) -> its end, where the run
 * directory is ingested (ingest.h) and the state set from the exit code
 * (run_state_for_exit_code), the wall-time limit (timeout) or a cancel.  A job the backend
 * saw vanish is recorded from its result.json in the same way.  Exit 0 completes a run only
 * when its outputs were recorded and include result.json: otherwise it failed ("exit 0 but
 * no result.json"), like any other failure.
 *
 * Retries: a run that fails (any exit code but 2, a usage/config error that would only fail
 * again; a timeout only with resources.retry_timeout: true) or is preempted (exit 75, or
 * the scheduler's NODE_FAIL/PREEMPTED/BOOT_FAIL) gets another attempt of the
 * same run while its attempts <= retries: running -> requeued -> submitted, the previous
 * attempt's logs moved to RUN_DIR/attempt-N/.  Once the retries are used up it is failed.
 *
 * Every state change goes through runs_db_transition, which refuses what the table in
 * run_state.c forbids; a run that another process ended meanwhile (`hearth cancel`) is left
 * as it is.  Runs added to the experiment while the sweep runs (a second `submit`) are
 * picked up when the queue runs dry.
 *
 * One runner per experiment: sweep_lock_acquire takes RUNS_DIR/EXP/runner.lock (flock, so a
 * killed runner releases it; the file records "PID HOST" of the holder, for messages), and
 * `hearth wait` uses it to tell a live sweep from an abandoned one.
 *
 * Interrupted (opts.stop set: the runner got SIGINT, SIGTERM or SIGHUP): no run is started,
 * running jobs are cancelled, and a run whose job ended by that cancel is *interrupted*: it
 * goes running -> requeued (note SWEEP_NOTE_INTERRUPTED), not cancelled, so that the next
 * runner (`hearth resume`) continues it, from its checkpoint when it left one (the
 * trainer writes one on SIGTERM; the job script passes --resume).  An interruption is not
 * a failure: it uses up none of the run's retries.  Runs cancelled on purpose (`hearth
 * cancel`) stay cancelled; sweep_reopen_cancelled brings them back for `hearth resume
 * --include-cancelled`. */
#ifndef HEARTH_SWEEP_H
#define HEARTH_SWEEP_H

#include <signal.h>
#include <stdio.h>
#include <sys/types.h>

#include "backend.h"
#include "db.h"
#include "run_state.h"
#include "rundir.h"

typedef struct {
    const char *experiment;
    int jobs;                        /* at most this many at once; <= 0: CPUs / cpus_per_task */
    FILE *progress;                  /* live progress and per-run messages; NULL: quiet */
    int progress_tty;                /* rewrite one line with \r instead of printing lines */
    volatile sig_atomic_t *stop;     /* when set: cancel running jobs, start no more */
    int once;                        /* reconcile and poll once, start nothing (what
                                        `hearth status` does for a queued backend) */
} sweep_opts;

typedef struct {
    long total;                      /* runs this sweep brought to an end, or tried to */
    long completed, failed, timeout, cancelled;
    long pending;                    /* left pending (stopped, or waiting on `after`) */
    long vanished;                   /* found failed by reconcile ("job process vanished"):
                                        their points got new runs, so they are not counted
                                        in `failed` */
    long interrupted;                /* requeued because the sweep was stopped: the next
                                        runner continues them (not in `pending`) */
    long retried;                    /* further attempts started */
    long replaced;                   /* vanished runs given a new run */
} sweep_result;

int sweep_run(hearth_db *db, backend *b, const sweep_opts *o, sweep_result *res,
              hearth_err *err);

/* The history notes of attempts that ended without failing, so that they use up no retry:
 * a run interrupted with its runner, and a cancelled run reopened by `hearth resume
 * --include-cancelled`. */
#define SWEEP_NOTE_INTERRUPTED "interrupted: its runner was stopped by a signal"
#define SWEEP_NOTE_REOPENED "reopened by hearth resume --include-cancelled"

/* Moves every cancelled run of `experiment` back to requeued, so that the next sweep
 * runs it again (from its checkpoint when it has one).  *n (may be NULL) receives how
 * many. */
int sweep_reopen_cancelled(hearth_db *db, const char *experiment, long *n, hearth_err *err);

/* Creates one new run of an experiment: the database row (pending) and its run directory
 * RUNS_EXP_DIR/<run-id>/ with run.yaml, job.json and job.sh (template text `tmpl`), all in
 * one transaction: either both exist or neither.  job->run_id is ignored (the database
 * assigns it).  *run_id (may be NULL) receives the id, malloc'd. */
int sweep_create_run(hearth_db *db, const rundir_job *job, const char *config_json,
                     const char *exp_dir, const char *tmpl_name, const char *tmpl,
                     char **run_id, hearth_err *err);

/* The job-script template of a backend ("local" -> local.sh.tmpl): found and read.
 * *text is malloc'd. */
int sweep_load_template(const char *backend_name, char *name, size_t name_size, char **text,
                        hearth_err *err);

/* The directory holding an experiment's runs: the parent of its first run's directory, or
 * RUNS_DIR/EXP when it has none.  Fills buf. */
int sweep_experiment_dir(hearth_db *db, const char *experiment, const char *runs_dir,
                         char *buf, size_t size, hearth_err *err);

/* Who holds a runner lock, as the runner recorded it in the lock file ("PID HOST").
 * pid is 0 when unknown: the holder recorded nothing (yet), or the record is stale. */
typedef struct {
    pid_t pid;
    char host[256];   /* "" when not recorded */
} sweep_lock_owner;

/* "pid N on HOST", "pid N" or "pid unknown", into buf. */
void sweep_lock_owner_format(const sweep_lock_owner *o, char *buf, size_t size);

/* Takes the experiment's runner lock in `exp_dir` (created when missing) and records this
 * process in it (pid and host name).  Returns 0 with *fd set, or 1 when another process
 * holds it and !wait (*holder, may be NULL, says who when known); with `wait`, blocks
 * until it is free, naming the holder on `msg` (may be NULL) once it is known, and again
 * when another runner takes over meanwhile. */
int sweep_lock_acquire(const char *exp_dir, int wait, FILE *msg, int *fd,
                       sweep_lock_owner *holder, hearth_err *err);
void sweep_lock_release(int fd);
/* 1 when a runner holds the lock (*owner, may be NULL, who when known), 0 when none does. */
int sweep_lock_held(const char *exp_dir, sweep_lock_owner *owner);

/* An experiment's points (config hashes) that have no completed run (*missing), and its
 * runs (*runs).  An experiment ended ok when it has runs and no point is missing. */
int sweep_points_missing(hearth_db *db, const char *experiment, long *missing, long *runs,
                         hearth_err *err);

/* Runs in flight: pending, submitted, running, requeued. */
long sweep_in_flight(const long counts[]);

/* Whether a run that ended in state `to` (RUN_FAILED, RUN_TIMEOUT, RUN_REQUEUED...) with
 * `exit_code` (-1: none) deserves another attempt, retries permitting: a failure but exit 2
 * (a usage/config error that would only fail again), a requeue (node failure, preemption),
 * and a timeout only when `retry_timeout` (resources.retry_timeout) is set. */
int sweep_retryable(run_state to, int exit_code, int retry_timeout);

#endif
