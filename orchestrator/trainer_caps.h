/* trainer_caps.h - the trainer a spec runs, and what that build can run.
 *
 * `hearth plan` and `hearth submit` ask the trainer itself (`hearth-train --capabilities`,
 * one JSON line: {"devices": ["cpu", "cuda"]}) rather than guess from this binary's
 * build, since the trainer of a spec may be another build; a device: cuda point whose
 * trainer lacks the cuda backend is pruned by rule `trainer_has_cuda` instead of failing
 * every run at submit. */
#ifndef HEARTH_TRAINER_CAPS_H
#define HEARTH_TRAINER_CAPS_H

#include <stddef.h>

#include "shape/err.h"
#include "spec.h"

typedef struct {
    int known;      /* the trainer answered --capabilities */
    int cuda;       /* it lists the cuda device */
} trainer_caps;

/* The trainer of s: its `trainer` (relative to the working directory), else hearth-train
 * beside this program; written absolute into out.  HERR_CONFIG naming the spec's file when
 * it is not an executable file. */
int trainer_find(const spec *s, char *out, size_t size, hearth_err *err);

/* Runs argv[0] with argv, stdout and stderr to `log` (NULL: inherited); returns its exit
 * status (128 + signal when killed), or -1 when it could not run. */
int trainer_run_wait(char *const argv[], const char *log);

/* Asks `trainer --capabilities`.  A trainer that cannot say (an older build, a failure)
 * leaves caps->known 0, and nothing is pruned on its account. */
void trainer_caps_query(const char *trainer, trainer_caps *caps);

#endif
