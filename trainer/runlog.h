/* runlog.h - the run's progress log: every line goes to stderr and to DIR/train.log.
 *
 * The log starts before the config is read, without a file: lines go to stderr and are
 * held in memory until runlog_open, so that a run refused before it writes anything (a bad
 * config, a run directory holding results, a checkpoint that does not fit) leaves no
 * train.log behind and touches no earlier run's log.  Once open, lines are flushed as
 * they are written: a killed run keeps everything it said. */
#ifndef HEARTH_RUNLOG_H
#define HEARTH_RUNLOG_H

#include <stdio.h>

#include "shape/err.h"

typedef struct {
    FILE *file;      /* DIR/train.log once opened, else NULL */
    FILE *held;      /* before: the lines so far (a memory stream; NULL: stderr only) */
    char *held_text; /* held's buffer */
    size_t held_len;
    int quiet;       /* nonzero: nothing on stderr (tests) */
} runlog;

/* A log without a file yet; release with runlog_close. */
void runlog_init(runlog *l);
/* Opens DIR/train.log for appending (a requeued run keeps its history) and writes the
 * lines held so far into it. */
int runlog_open(runlog *l, const char *dir, hearth_err *err);
/* Closes the file and drops the lines held (NULL-safe). */
void runlog_close(runlog *l);
/* One line; the newline is added. */
void runlog_printf(runlog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
