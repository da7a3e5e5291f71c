/* ptrun.h - a short multi-rank training run for the unit tests: the ranks of a run
 * config as threads (parallel/ptrain_local.h), a few steps, then the parameters gathered
 * into one full model, to compare against a single-rank run or another layout.
 *
 * No cmocka dependency (the bench links the support files too). */
#ifndef HEARTH_PTRUN_H
#define HEARTH_PTRUN_H

#include "model/model.h"
#include "shape/err.h"
#include "train.h"

/* Runs `steps` steps of cfg's layout (timeout_ms per collective, 0: none); loss[s] and
 * grad_norm[s] get rank 0's statistics of step s.  *full gets a new model of cfg's shape
 * holding the gathered parameters (the caller frees it with model_free).  0, or a
 * negative herr code with err set ("create: ", "step N: " or "gather: " before the
 * cause); then *full is NULL and nothing is left running. */
int ptrun_train(const run_config *cfg, int steps, int timeout_ms, double *loss,
                double *grad_norm, model **full, hearth_err *err);

#endif
