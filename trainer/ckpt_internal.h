/* ckpt_internal.h - helpers shared by ckpt.c (writing) and ckpt_read.c (resuming). */
#ifndef HEARTH_CKPT_INTERNAL_H
#define HEARTH_CKPT_INTERNAL_H

#include <stddef.h>

#include "shape/err.h"

/* "step-%08d": the name of a complete checkpoint directory. */
#define CKPT_DIR_FMT "step-%08d"
#define CKPT_MANIFEST "manifest.json"
#define CKPT_LATEST "latest"

/* Parses a complete checkpoint directory name; the step, or -1 when name is not one. */
int ckpt_dir_step(const char *name);

#endif
