/* slurm_state.h - what Slurm's job states and exit codes mean to hearth: the one mapping
 * shared by the sbatch backend (backend_slurm.c) and the slurmrestd one
 * (backend_slurmrest.c), so that both report a job's end the same way. */
#ifndef HEARTH_SLURM_STATE_H
#define HEARTH_SLURM_STATE_H

#include "backend.h"

typedef enum {
    SLURM_ST_ALIVE,       /* pending, running, completing, suspended... */
    SLURM_ST_DONE,        /* COMPLETED, FAILED, OUT_OF_MEMORY: ended on its own */
    SLURM_ST_CANCELLED,   /* CANCELLED (by anyone) */
    SLURM_ST_TIMEOUT,     /* TIMEOUT, DEADLINE */
    SLURM_ST_REQUEUE,     /* NODE_FAIL, PREEMPTED, BOOT_FAIL: not the job's fault */
    SLURM_ST_UNKNOWN,     /* Slurm does not know the job (any more), or an unknown name */
} slurm_state;

/* Slurm's job state name (squeue %T, scontrol JobState, slurmrestd's job_state;
 * "CANCELLED by 0" counts as CANCELLED) to its class. */
slurm_state slurm_state_classify(const char *state);

/* RUN_DIR/exit_code when it is job `job_id`'s: the job script writes its id to
 * exit_code.job just before.  0 when absent or another job's (a late write of an earlier,
 * killed attempt must not pass for this one's); 1 with *code. */
int slurm_job_exit_code(const char *run_dir, const char *job_id, int *code);

/* A raw wait status (slurmrestd's exit_code, sacct's "ExitCode" before splitting) to an
 * exit code: the exit status, or 128 + signal for a job killed by a signal. */
int slurm_wait_status_code(long long raw);

/* Fills ev for tracked job `job_id` of run directory `run_dir` that Slurm reports in class
 * `st`: the exit code from RUN_DIR/exit_code, else `slurm_code` (>= 0: what Slurm said; -1:
 * nothing), and how it ended.  `cancelled`: hearth asked to cancel it. */
void slurm_state_event(const char *run_dir, const char *job_id, void *tag, slurm_state st,
                       int slurm_code, int cancelled, backend_event *ev);

#endif
