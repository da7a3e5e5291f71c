/* check_ref.h - reference files of `hearth check`: per-point figures, with optional
 * tolerances, that a sweep is held against (docs/check.md has the format).
 *
 *   # written by hearth check demo --write-reference ref.yaml
 *   hearth_reference: 1
 *   experiment: demo                   # informative
 *   tolerances: {tokens_per_s: 3}      # optional: percent or off, for every point
 *   points:
 *     - config_hash: 3f1c...           # 64 hex digits: the point
 *       label: "parallel.tp=2"         # informative
 *       runs: 3                        # informative
 *       tokens_per_s: 15234.5          # a figure: a number, or null / absent (none)
 *       step_ms_median: 42.1
 *       mfu: null
 *       peak_mem_bytes: 1234567
 *       final_loss: 5.61
 *       tolerances: {final_loss: off}  # optional: this point's own
 *
 * JSON with the same keys is read as well (it is YAML).  Unknown keys are errors, so a
 * misspelt figure or tolerance cannot silently go unchecked.  Errors: HERR_IO when the
 * file cannot be read; HERR_CONFIG "FILE:LINE:COL: key: what is wrong".
 *
 * Ownership: check_ref_load fills a check_set (check_db.h) that the caller frees with
 * check_set_free; the points' source is "reference". */
#ifndef HEARTH_CHECK_REF_H
#define HEARTH_CHECK_REF_H

#include "check.h"
#include "check_db.h"

/* Reads `path` into *points and the file-wide tolerances into *tols (unset where the file
 * sets none). */
int check_ref_load(const char *path, check_set *points, check_tols *tols, hearth_err *err);

/* Writes the points that have completed runs (their medians) as a reference file,
 * atomically; `experiment` is recorded.  Tolerances are not written: the defaults apply
 * until someone adds some. */
int check_ref_write(const char *path, const char *experiment, const check_set *points,
                    hearth_err *err);

#endif
