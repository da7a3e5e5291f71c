/* kerr.h - the error codes of Hearth, one set for kernels, model, trainer and
 * orchestrator.
 *
 * A function that can fail returns 0 or one of these negative codes; the message lives
 * with the caller's context (hearth_err in trainer/shape/err.h, the device's message in
 * kdev.h).  Defined here, at the bottom of the layering, so that the kernels report the
 * same codes as everything above them without including anything of the trainer. */
#ifndef HEARTH_KERR_H
#define HEARTH_KERR_H

typedef enum {
    HERR_OK = 0,
    HERR_ARG = -1,      /* invalid argument to an API (a caller's bug, not user input) */
    HERR_CONFIG = -2,   /* bad user input: config, preset, --set, command line */
    HERR_IO = -3,       /* a file could not be read or written */
    HERR_NOMEM = -4,    /* allocation failed (host or device memory) */
    HERR_RUNTIME = -5,  /* anything else that went wrong while running */
    HERR_DEVICE = -6,   /* a device runtime call or kernel launch failed (CUDA) */
    HERR_DEVLIB = -7,   /* a device library call failed (cuBLASLt) */
    HERR_NOALGO = -8,   /* the device library has no algorithm for this shape/alignment */
} herr_code;

#endif
