/* runlog.h - the run's progress log: every line goes to stderr and to DIR/train.log.
 *
 * The log is opened before the config is read, so that a config error leaves its message
 * in the run directory too (the orchestrator shows it from there).  Lines are flushed as
 * they are written: a killed run keeps everything it said. */
#ifndef HEARTH_RUNLOG_H
#define HEARTH_RUNLOG_H

#include <stdio.h>

#include "shape/err.h"

typedef struct {
    FILE *file;      /* DIR/train.log, or NULL: stderr only */
    int quiet;       /* nonzero: nothing on stderr (tests) */
} runlog;

/* Opens DIR/train.log for appending (a requeued run keeps its history). */
int runlog_open(runlog *l, const char *dir, hearth_err *err);
void runlog_close(runlog *l);
/* One line; the newline is added. */
void runlog_printf(runlog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
