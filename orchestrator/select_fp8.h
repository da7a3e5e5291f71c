/* select_fp8.h - the selective FP8 policy, derived from layer benchmark rows
 * (docs/select.md, "hearth select fp8").
 *
 * For each (component, kind, tp) of the rows, the speedup bf16_ms / fp8_ms and the FP8
 * error (fp8_err) at the target token count decide: FP8 iff speedup >= threshold and
 * error <= max_err.  A row without a measured error (older files) is judged on its speed
 * alone, and its verdict says the error is unknown.  Between two measured token counts
 * the speedup is the LOWER of the two neighbours' (conservative: never better than what
 * was measured on either side; the error likewise the HIGHER of the two); outside the measured range there is no rule (no
 * extrapolation), so that kind stays bf16.  The LM head and the router stay bf16 unless
 * allowed, and the first and last decoder layers likewise (`keep_bf16`).
 *
 * A rule covers the contiguous token range around the target over which every measured
 * count keeps the threshold and the tolerance: [min_tokens, max_tokens], both measured
 * counts.
 *
 * Pure: no I/O.  Ownership: select_fp8_derive fills a policy that select_fp8_policy_free
 * releases; the YAML and JSON texts are malloc'd for the caller to free. */
#ifndef HEARTH_SELECT_FP8_H
#define HEARTH_SELECT_FP8_H

#include <stdio.h>

#include "select.h"
#include "shape/err.h"
#include "shape/fp8_plan.h"

typedef struct {
    double threshold;          /* > 0; the CLI's default is 1.05 */
    double max_err;            /* > 0: the largest FP8 relative error accepted
                                  (SELECT_FP8_MAX_ERR by default) */
    long tokens;               /* the token count the policy is for (>= 1) */
    long encoder_tokens;       /* > 0: the encoder's count (patches), else `tokens` */
    long projector_tokens;     /* > 0: the projector's count (merged units), else `tokens` */
    int allow_lm_head, allow_router, allow_edges;
} select_fp8_opts;

/* The default error tolerance.  A correct FP8 linear on normally distributed operands is
 * off by about 0.04 (forward, E4M3) to 0.06 (gradients, E5M2's 2 mantissa bits) in
 * relative L2; 0.1 refuses what is worse than the formats' own rounding (outliers that a
 * per-tensor scale crushes, a broken kernel). */
#define SELECT_FP8_THRESHOLD 1.05
#define SELECT_FP8_MAX_ERR 0.1

/* Parses --allow's comma list (lm_head, router, edges) into o; HERR_CONFIG names an
 * unknown word. */
int select_fp8_parse_allow(const char *list, select_fp8_opts *o, hearth_err *err);

typedef enum {
    FP8_WHY_FASTER = 0,        /* speedup >= threshold: a rule */
    FP8_WHY_SLOWER,            /* speedup below the threshold */
    FP8_WHY_OUT_OF_RANGE,      /* target outside the measured token counts */
    FP8_WHY_EXCLUDED,          /* lm_head / router without --allow */
    FP8_WHY_ERROR,             /* fast enough, but the FP8 error is above max_err */
} select_fp8_why;

/* The verdict on one (component, kind, tp) group: the evidence of the policy. */
typedef struct {
    char component[16], kind[16];
    int tp;
    select_fp8_why why;
    double speedup;            /* conservative at the target; 0 when out of range */
    double err;                /* conservative FP8 error at the target; < 0 unknown */
    long lo_tokens, hi_tokens; /* measured counts bracketing the target (equal: exact) */
    long min_measured, max_measured;
    long min_tokens, max_tokens;   /* FP8_WHY_FASTER: the rule's range */
} select_fp8_eval;

typedef struct {
    size_t n;                  /* groups, sorted by component, kind, tp */
    select_fp8_eval *e;
    size_t n_rules;            /* groups with why == FP8_WHY_FASTER */
    int n_keep;
    const char *keep_bf16[4];  /* static names: lm_head, router, decoder.layers.first|last */
} select_fp8_policy;

/* Derives the policy from b's rows.  Rows with a non-positive time are ignored (the
 * ingest refuses them anyway). */
int select_fp8_derive(const select_bench_set *b, const select_fp8_opts *o,
                      select_fp8_policy *out, hearth_err *err);
void select_fp8_policy_free(select_fp8_policy *p);

/* The policy as the trainer's plan (shape/fp8_plan.h): its rules and keep_bf16 entries,
 * so that fp8_plan_count can tell whether it matches any linear of a run.  Clear *out
 * with fp8_plan_clear. */
int select_fp8_plan(const select_fp8_policy *p, fp8_plan *out, hearth_err *err);

/* The warning for benchmarks measured on the cpu (NULL for any other set): their
 * speedups say nothing about a GPU. */
const char *select_fp8_cpu_warning(const select_bench_set *b);

/* The policy file (YAML; docs/select.md "Policy file").  NULL when out of memory. */
char *select_fp8_yaml(const select_bench_set *b, const select_fp8_opts *o,
                      const select_fp8_policy *p);
/* The decision and its evidence as JSON objects (for the decisions table). */
char *select_fp8_decision_json(const select_fp8_policy *p);
char *select_fp8_evidence_json(const select_bench_set *b, const select_fp8_opts *o,
                               const select_fp8_policy *p);

const char *select_fp8_why_text(select_fp8_why w);

/* The evidence as a table: the set (model, GPU, device, build, date, versions) and each
 * group's speedup, error, measured bracket and verdict; every line starts with indent.
 * (cmd_select.c: `select fp8` and the plan's `auto` values print the same.) */
void select_fp8_print(const select_bench_set *b, const select_fp8_opts *o,
                      const select_fp8_policy *p, const char *indent, FILE *f);

#endif
