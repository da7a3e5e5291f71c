/* err.h - error codes and the error message buffer used across Hearth.
 *
 * Functions that can fail return 0 on success or a negative herr_code, and write a
 * human-readable message into a caller-provided hearth_err.  User errors follow
 * DESIGN.md: "FILE:LINE:COL: key: what is wrong" (or "--set KEY: ..." for overrides).
 * Context is added on the way up with herr_prefix(). */
#ifndef HEARTH_ERR_H
#define HEARTH_ERR_H

#include <stddef.h>

#include "kerr.h"   /* herr_code: the one set of error codes (kernels/kerr.h) */

typedef struct hearth_err {
    char msg[1024];
} hearth_err;

/* Writes the message (printf format) and returns code, so that callers can write
 * `return herr_set(err, HERR_CONFIG, "...", ...);`.  err may be NULL. */
int herr_set(hearth_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " (printf format) to the current message; returns code. */
int herr_prefix(hearth_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
