/* progress.h - one progress line for long waits (`hearth submit`'s sweep, `hearth wait`,
 * and any later command that waits), which degrades to plain lines when the output is not
 * a terminal:
 *
 *   terminal: one line rewritten in place ("\r...\033[K") whenever it changes; messages
 *             (progress_say) are printed above it and the line is drawn again below.
 *   not a terminal (a log file, a pipe, CI): the line is printed when it changes, and the
 *             unchanged line again every `interval_s` seconds, so that a log shows the wait
 *             is alive without a line per poll.
 *
 * Usage: progress p; progress_init(&p, stderr, isatty(2), 30); then progress_set(&p, ...)
 * at every poll, progress_say(&p, ...) for messages and progress_end(&p) at the end.
 * The caller owns the struct (no allocation); a NULL stream makes every call a no-op. */
#ifndef HEARTH_PROGRESS_H
#define HEARTH_PROGRESS_H

#include <stdio.h>

/* How often the waits of hearth repeat an unchanged line when not on a terminal. */
#define PROGRESS_PLAIN_INTERVAL_S 30.0

typedef struct {
    FILE *f;                 /* NULL: quiet */
    int tty;                 /* rewrite one line instead of printing lines */
    double interval_s;       /* plain mode: repeat an unchanged line after this long (0: never) */
    char line[256];          /* the current line ("" before the first) */
    int open;                /* tty: the line is on the terminal without its newline */
    double last_s;           /* plain mode: when the line was last printed */
} progress;

void progress_init(progress *p, FILE *f, int tty, double interval_s);
/* Sets the line (printf format) and shows it as described above. */
void progress_set(progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same with the time given (seconds on any monotonic scale): for tests. */
void progress_line(progress *p, const char *line, double now_s);
/* The line every run-counting wait shows: "[STARTED/TOTAL] running R · done D · failed F",
 * followed by " · cancelled C" when C > 0.  `failed` counts failed and timed-out runs;
 * cancelled runs are counted apart, since a cancel is a user's decision, not a failure.
 * The part stays away when nothing was cancelled, so the usual line is unchanged. */
void progress_counts(progress *p, long started, long total, long running, long done,
                     long failed, long cancelled);
/* A message on a line of its own ("hearth: " + printf format), above the progress line. */
void progress_say(progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Finishes: on a terminal the open line gets its newline. */
void progress_end(progress *p);

#endif
