/* plan_memory.h - hearth-train --plan-memory (the memory plan of shape/mem_plan.h as a
 * table) and the figures of result.json's "memory" object (docs/memory.md).
 *
 * Nothing is trained or written: the config is loaded and checked as for a run
 * (run_config_load), then every pipeline stage's largest rank is planned. */
#ifndef HEARTH_PLAN_MEMORY_H
#define HEARTH_PLAN_MEMORY_H

#include <stdio.h>

#include "cli.h"
#include "shape/err.h"
#include "shape/mem_plan.h"
#include "shape/run_config.h"

/* Loads the config of `a`, prints the table to out; errors (bad config) go to errf as
 * "hearth-train: MESSAGE".  Returns the exit status: 0, or 2 for a usage or config
 * error, 1 for anything else. */
int plan_memory_main(const cli_args *a, FILE *out, FILE *errf);

/* Writes the table of a resolved config to out. */
int plan_memory_print(FILE *out, const run_config *c, hearth_err *err);

/* What result.json reports (outputs.h run_result.memory). */
typedef struct {
    mem_rank_plan peak;             /* the rank with the largest predicted total */
    long long process_predicted;    /* what this process holds: every rank's total with
                                       comm local (ranks are threads), else rank 0's (the
                                       process that writes result.json) */
    long long measured_bytes;       /* getrusage(RUSAGE_SELF) ru_maxrss, in bytes */
    const char *measured_source;    /* what measured_bytes is (static text) */
} run_memory;

/* Fills *m for a resolved config: the plan and this process's max RSS so far. */
int plan_memory_result(run_memory *m, const run_config *c, hearth_err *err);

#endif
