/* stop_signal.h - SIGINT, SIGTERM and SIGHUP as a request to stop the work in progress
 * (a sweep, a benchmark job) cleanly instead of killing the process. */
#ifndef HEARTH_STOP_SIGNAL_H
#define HEARTH_STOP_SIGNAL_H

#include <signal.h>

/* Installs the handlers; returns the flag they set to 1 (the only state a signal handler
 * may touch: process-wide, as signals are).  Calling it again returns the same flag. */
volatile sig_atomic_t *stop_signal_catch(void);

#endif
