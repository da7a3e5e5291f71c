/* select_auto.h - `auto` values of a spec resolved at plan time from the results database
 * (docs/select.md, "auto in specs"), and the plan's cost estimate.
 *
 *   parallel.encoder.strategy: auto  -> the best candidate of select_encoder_rank() for
 *       the point's model, ranks, sequence, batch and decoder layout (measured runs first
 *       in weight, the cost model where none ran); sets the encoder tp and offload too.
 *   precision.fp8: auto -> `selective` with a policy derived (select_fp8.h, threshold
 *       1.05, at seq_len x micro_batch tokens) from the newest layer benchmarks of the
 *       model, when some kind earns FP8; else `off`, with the reason.  The policy file is
 *       POLICY_DIR/fp8-<sha256 prefix of its text>.yaml, so a point's config hash names
 *       its policy; it is written only when `write_policies`.
 *
 * Plug select_auto_resolve into plan_opts.resolve_auto with the select_auto object as its
 * context.  Ownership: select_auto_create / select_auto_free. */
#ifndef HEARTH_SELECT_AUTO_H
#define HEARTH_SELECT_AUTO_H

#include <stdint.h>
#include <stdio.h>

#include "db.h"
#include "expand.h"
#include "plan.h"
#include "shape/run_config.h"
#include "spec.h"

typedef struct select_auto select_auto;

/* db may be NULL (nothing measured: the cost model decides, fp8 auto is off).
 * policy_dir: where fp8 policies go (RUNS_DIR/policies).  `estimate`: keep a step-time
 * estimate of every point (24 bytes each) for select_auto_print. */
int select_auto_create(select_auto **out, hearth_db *db, const spec *s, const char *policy_dir,
                       int write_policies, int estimate, hearth_err *err);
void select_auto_free(select_auto *a);

/* plan_opts.resolve_auto. */
int select_auto_resolve(void *ctx, const expand_point *pt, run_config *cfg, hearth_err *err);

/* How point `index` resolved: NULL when it had no `auto` value.  The texts say the value
 * and its evidence. */
typedef struct {
    uint64_t index;
    unsigned which;                /* SPEC_AUTO_* */
    char hash[65];                 /* the resolved config's hash ("" when it broke a rule) */
    char encoder[256], fp8[256];   /* "" when not auto */
    char *subject;                 /* JSON texts for the decisions table */
    char *enc_decision, *enc_evidence, *fp8_decision, *fp8_evidence;
    char *fp8_table;               /* the fp8 evidence as printed lines (NULL: none) */
    const char *fp8_warning;       /* static text printed as a warning (NULL: none) */
    const char *enc_method, *fp8_method;
} select_auto_note;
const select_auto_note *select_auto_note_of(const select_auto *a, uint64_t index);

/* Records in `decisions` what the `auto` values of every valid point resolved to, with
 * the evidence, for `experiment` and the point's config hash; a decision already recorded
 * for the same experiment, hash and kind is not recorded again. */
int select_auto_record(select_auto *a, const char *experiment, hearth_err *err);

/* Prints the auto values with their evidence for the kept points of r, then the estimated
 * GPU-hours of the kept runs: from prior completed runs of the same config hash where
 * there are some, else the cost model; says how many of each. */
int select_auto_print(select_auto *a, const plan_result *r, FILE *f, hearth_err *err);

#endif
