/* fp8_policy.h - precision.fp8 as an FP8 plan (model/fp8.h): `all`, or `selective` with
 * the policy file precision.fp8_policy (docs/fp8.md has the format).
 *
 * The policy names the model and the GPU it was measured on; the trainer refuses a policy
 * for another model (neither the preset's name nor the model as the config gives it) or
 * another device ("cpu" on the CPU path, the GPU's name on CUDA).  Errors read
 * "FILE:LINE:COL: key: what is wrong".
 *
 * Ownership: the plan's arrays belong to the caller (fp8_plan_clear). */
#ifndef HEARTH_FP8_POLICY_H
#define HEARTH_FP8_POLICY_H

#include "model/fp8.h"
#include "shape/err.h"
#include "shape/run_config.h"

/* Reads the policy file at `path` into *out (rules, keep_bf16, scaling), checking that it
 * is for `model_name` (or `model_given`, may be NULL) and for `gpu`.  HERR_IO when it
 * cannot be read, HERR_CONFIG for anything wrong in it. */
int fp8_policy_load(fp8_plan *out, const char *path, const char *model_name,
                    const char *model_given, const char *gpu, hearth_err *err);

/* The plan of a run config on `gpu`: off -> a plan using nothing; all -> every linear but
 * the router and the LM head; selective -> the policy file. */
int fp8_plan_from_config(fp8_plan *out, const run_config *cfg, const char *gpu,
                         hearth_err *err);

/* Builds the plan of cfg on `gpu` and installs it on each of the n models (model_set_fp8:
 * before any clone is made).  A config with fp8 off installs nothing. */
int fp8_plan_install(model *const *models, int n, const run_config *cfg, const char *gpu,
                     hearth_err *err);

#endif
