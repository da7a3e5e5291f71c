/* run.h - one hearth-train run from parsed arguments to exit status: run directory and
 * log, config, the training loop, metrics.jsonl / config.json / result.json.
 *
 * Nothing is written until the run is accepted: a config that cannot be used (unknown
 * key, wrong type, impossible shape, missing preset, bad --set, unsupported device or
 * layout), a run directory that holds an earlier run's results without --resume or
 * --force, a checkpoint that does not fit the run and a bad --init-from are reported on
 * stderr only; the directory is not created and an existing one is left as it was (its
 * train.log, config.json and metrics.jsonl included). */
#ifndef HEARTH_RUN_H
#define HEARTH_RUN_H

#include "cli.h"

enum {
    RUN_EXIT_DONE = 0,
    RUN_EXIT_FAILED = 1,      /* runtime failure */
    RUN_EXIT_USAGE = 2,       /* usage or config error */
    RUN_EXIT_DIVERGED = 3,    /* loss NaN or infinite */
    RUN_EXIT_PREEMPTED = 75,  /* reserved: preempted after a checkpoint (requeue me) */
};

/* Runs the training that a describes; returns the process exit status. */
int run_main(const cli_args *a);

#endif
