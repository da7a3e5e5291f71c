/* backend.h - where job scripts run: submit one, learn when jobs end, cancel one.
 *
 * The sweep (sweep.h) drives every backend through this interface; `local` runs jobs as
 * processes of this machine (backend_local.c); `slurm` (sbatch/squeue/scontrol/scancel,
 * backend_slurm.c) and `slurmrest` (slurmrestd through libcurl, backend_slurmrest.c) run
 * them as Slurm jobs, with one mapping of Slurm's states (slurm_state.h).
 *
 * A job is a rendered job script in its run directory (rundir.h).  The job id is the
 * backend's own (local: the pid of the job script, which leads its own process group;
 * Slurm: the job id).  A job must outlive the hearth process that submitted it: a later
 * hearth finds it again from the run directory and its job id (backend_track) and waits
 * for it, which is what makes `hearth submit` safe to kill and run again.
 *
 * The exit status of a job comes from RUN_DIR/exit_code, written by the job script, so it
 * is known whichever process watches the job. */
#ifndef HEARTH_BACKEND_H
#define HEARTH_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "shape/err.h"

#define BACKEND_JOB_ID_MAX 64

/* What a backend needs to run or find one job. */
typedef struct {
    const char *run_id;
    const char *run_dir;      /* absolute */
    const char *script;       /* RUN_DIR/job.sh */
    int cpus_per_task;
    int64_t time_limit_s;     /* wall-time limit; 0: none */
    int max_concurrent;       /* at most this many of a submit_many batch at once; 0: any */
    const char *dependency;   /* Slurm only: start once these jobs ended (sbatch --dependency,
                                 e.g. "afterok:12:13_4"), killed when that cannot be; NULL:
                                 none.  The sweep sets it only for the slurm backend. */
} backend_job;

typedef enum {
    BACKEND_EXITED = 0,       /* the job script ended on its own (exit code below) */
    BACKEND_TIMEOUT,          /* ended by its wall-time limit */
    BACKEND_CANCELLED,        /* ended by backend_cancel */
    BACKEND_VANISHED,         /* gone without leaving an exit code (killed, node lost) */
    BACKEND_REQUEUE,          /* ended by the scheduler through no fault of its own (Slurm:
                                 NODE_FAIL, PREEMPTED, BOOT_FAIL): run it again */
} backend_end;

/* One job that ended, as backend_poll reports it. */
typedef struct {
    void *tag;                /* the caller's tag from backend_submit / backend_track */
    char job_id[BACKEND_JOB_ID_MAX];
    backend_end how;
    int has_exit_code;        /* RUN_DIR/exit_code (or, failing that, the wait status) */
    int exit_code;
} backend_event;

typedef struct backend backend;

typedef struct {
    const char *name;
    /* Starts a job; fills job_id.  The job is then tracked until poll reports its end. */
    int (*submit)(backend *b, const backend_job *job, void *tag,
                  char job_id[BACKEND_JOB_ID_MAX], hearth_err *err);
    /* Optional (NULL: the caller submits one by one).  Starts jobs[0..n) at once (Slurm: as
     * job arrays, consecutive jobs of one shape in one array), in order: *done receives how
     * many started (job_ids[0..*done) filled, tracked with tags[i]); when *done < n the
     * rest did not start and err says why (a negative herr_code is returned). */
    int (*submit_many)(backend *b, const backend_job *jobs, void *const *tags, size_t n,
                       char (*job_ids)[BACKEND_JOB_ID_MAX], size_t *done, hearth_err *err);
    /* Finds a job started by an earlier process.  job_id may be "" or NULL when the earlier
     * process died before recording it.  Returns 1 when the job is still alive (it is now
     * tracked, and job_id is filled when it was empty), 0 when it is gone (not tracked). */
    int (*track)(backend *b, const backend_job *job, const char *job_id, void *tag,
                 char job_id_out[BACKEND_JOB_ID_MAX], hearth_err *err);
    /* Waits up to timeout_ms for tracked jobs to end (enforcing wall-time limits) and
     * reports up to `cap` of those that did in ev[0..*n).  Returns 0 or a herr_code. */
    int (*poll)(backend *b, int timeout_ms, backend_event *ev, size_t cap, size_t *n,
                hearth_err *err);
    /* Ends a job, tracked or not: asks it to stop, and kills it after a grace period.
     * A tracked job is reported by poll as BACKEND_CANCELLED; an untracked one is waited
     * for here (up to the grace period).  Returns 1 when the job was alive, 0 when not. */
    int (*cancel)(backend *b, const backend_job *job, const char *job_id, hearth_err *err);
    /* Whether the job is alive (tracked or not): 1, 0, or a negative herr_code. */
    int (*alive)(backend *b, const backend_job *job, const char *job_id, hearth_err *err);
    /* Number of tracked jobs. */
    size_t (*tracked)(const backend *b);
    void (*free)(backend *b);
} backend_ops;

struct backend {
    const backend_ops *ops;
};

/* Opens backend `name` ("local", "slurm", "slurmrest": its URL and token file from the
 * environment, see backend_slurmrest_create); HERR_CONFIG for an unknown one. */
int backend_open(const char *name, backend **out, hearth_err *err);
void backend_free(backend *b);

/* The local backend.  grace_ms: between SIGTERM and SIGKILL (<= 0: 10 s, or
 * $HEARTH_KILL_GRACE_MS when set).  A job has ended once its script wrote RUN_DIR/exit_code:
 * processes of its group still left a second later (strays of the trainer) get SIGTERM,
 * then SIGKILL, and the job is reported with that exit code, never as a timeout. */
int backend_local_create(backend **out, int grace_ms, hearth_err *err);

/* The Slurm backend (sbatch, squeue, scontrol, scancel from PATH; backend_slurm.c).  It
 * polls at most every $HEARTH_SLURM_POLL_MS (default 2000) ms. */
int backend_slurm_create(backend **out, hearth_err *err);

/* The slurmrestd backend (libcurl; backend_slurmrest.c): the same jobs as the Slurm
 * backend, submitted one by one (no arrays).  url: "http://HOST:PORT" or "unix:/PATH"
 * (NULL or "": $HEARTH_SLURMREST_URL); token_file: a JWT from `scontrol token` in a file
 * only its owner may access (NULL or "": $HEARTH_SLURMREST_TOKEN_FILE).  The token is read
 * here, kept in memory and sent only as a request header.  It polls at most every
 * $HEARTH_SLURMREST_POLL_MS (else $HEARTH_SLURM_POLL_MS, else 2000) ms, one GET of the job
 * listing per cycle. */
int backend_slurmrest_create(backend **out, const char *url, const char *token_file,
                             hearth_err *err);

/* Helpers shared by the backends and the commands that wait on them. */
double backend_clock_s(void);            /* monotonic seconds */
void backend_sleep_ms(int ms);           /* sleeps the full time, across signals */
/* Pacing of a batched poller (one query for all jobs per cycle): returns 1 when a query is
 * due now and stamps *last_query; otherwise sleeps until the next query is due (or at most
 * timeout_ms; with no jobs, timeout_ms) and returns 1 only if it has become due. */
int backend_poll_due(double *last_query, int interval_ms, size_t n_jobs, int timeout_ms);
/* For a backend whose job script starts the trainer once: HERR_CONFIG (naming the
 * resources and `backend`) when the run's job.json asks for several processes (a cuda run
 * of nodes x gpus_per_node > 1 ranks needs `srun --mpi=pmix`: the sbatch backend).  A
 * job.json that cannot be read is left to the job itself to report. */
int backend_check_one_process(const char *run_dir, const char *backend, hearth_err *err);

#endif
