/* plan.h - `hearth plan`: every point of a spec resolved, validated, hashed and deduplicated.
 *
 * For each point of the streamed expansion (expand.h): the run config is resolved from the
 * spec's `base` (read once) plus the point's overrides (converted once per spec value, see
 * shape/run_config_override.h), the layout rules are checked (shape module; a point that
 * breaks one is *pruned* with the rule's name and message; a point whose model shape is
 * inconsistent is pruned with rule "shape"), and the resolved config is hashed
 * (run_config_hash).  A valid point is *skipped* when `repeat` runs of its hash are already
 * completed (the caller's `already_completed`, i.e. the results DB), unless `force`; or when
 * an earlier point of the same spec resolved to the same config.  Otherwise it is *kept*
 * with `runs` = repeat - completed runs to submit (repeat with force).
 *
 * `where` and `exclude` see the resolved values (defaults, `auto`, the preset), so
 * `where: model.decoder.heads % parallel.tp == 0` works without sweeping heads.
 * On cuda, ranks = resources.nodes x resources.gpus_per_node (DESIGN.md).
 *
 * Two ways to use it: plan_run() streams points to a callback (O(1) memory in the number of
 * points, apart from the set of seen hashes: 16 bytes per kept point); plan_collect() keeps
 * a summary of every point for the formatters. */
#ifndef HEARTH_PLAN_H
#define HEARTH_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "expand.h"
#include "shape/run_config.h"
#include "spec.h"

typedef enum { PLAN_KEPT = 0, PLAN_PRUNED = 1, PLAN_SKIPPED = 2 } plan_status;

/* A point's resources: the spec's, with the point's resources.* overrides and defaults
 * (nodes 1, gpus_per_node 1, cpus_per_task 1, max_concurrent 0 = no limit).  Strings are
 * borrowed from the spec (NULL when not given). */
typedef struct {
    int64_t nodes, gpus_per_node, cpus_per_task, max_concurrent;
    const char *time, *partition, *account, *qos, *constraint;
} plan_resources;

/* One point as plan_run() hands it to the callback; valid during the call only. */
typedef struct {
    uint64_t index;             /* 0-based among the points of the expansion */
    plan_status status;
    const expand_point *pt;     /* the overrides */
    const run_config *config;   /* resolved (for a "shape" prune: the config part only) */
    char hash[65];              /* "" when pruned */
    const char *rule;           /* pruned: the rule's name, else NULL */
    char reason[1024];          /* pruned: the rule's message; skipped: why */
    int completed;              /* runs of this hash completed before (0 with force) */
    int runs;                   /* kept: runs to submit; else 0 */
    uint64_t duplicate_of;      /* skipped as a duplicate: that point's index, else UINT64_MAX */
    plan_resources res;
} plan_point;

typedef struct {
    uint64_t candidates;        /* before exclude/where */
    uint64_t excluded, filtered;
    uint64_t points;            /* after exclude/where = kept + pruned + skipped */
    uint64_t kept, pruned, skipped;
    uint64_t runs;              /* runs to submit over the kept points */
} plan_counts;

/* Looks up how many completed runs of `hash` exist; returns 0, or a negative herr_code. */
typedef int (*plan_completed_fn)(void *ctx, const char *hash, int *count, hearth_err *err);

typedef struct {
    plan_completed_fn already_completed;   /* NULL: nothing completed yet */
    void *completed_ctx;
    int force;                  /* ignore completed runs (in-spec duplicates still skip) */
    int no_hash;                /* skip hashing and dedup (validity only: faster) */
    /* Called for every point whose config resolved, before the layout rules: resolves the
     * spec's `auto` values (select_auto.h) and may change *cfg.  A spec with `auto` values
     * (spec.any_auto) cannot be planned without it. */
    int (*resolve_auto)(void *ctx, const expand_point *pt, run_config *cfg, hearth_err *err);
    void *auto_ctx;
    /* The spec's trainer: at the first device: cuda point the plan asks it what it can run
     * (trainer_caps.h) and, when its build lacks the cuda backend, prunes the cuda points
     * by rule trainer_has_cuda.  NULL: not asked. */
    const char *trainer_path;
} plan_opts;

/* Called for every point; a non-zero return stops the plan and is returned by plan_run. */
typedef int (*plan_point_fn)(void *ctx, const plan_point *p);

/* Plans `s`.  Returns 0, a negative herr_code (with err: a base or preset that cannot be
 * read, an error evaluating where, a DB error), or the callback's non-zero value.
 * `cb` and `counts` may be NULL. */
int plan_run(const spec *s, const plan_opts *opts, plan_point_fn cb, void *ctx,
             plan_counts *counts, hearth_err *err);

/* A summary of one point, kept by plan_collect. */
typedef struct {
    uint64_t index;
    plan_status status;
    int include;                /* from include entry N (1-based), else 0 */
    int n;
    expand_kv *kv;              /* copies of the point's (key, value) pairs; values borrowed */
    char hash[65];
    const char *rule;           /* static string from the shape module */
    char *reason;               /* malloc'd, or NULL */
    int completed, runs;
    plan_resources res;
} plan_entry;

typedef struct {
    const spec *s;              /* borrowed: must outlive the result */
    plan_counts counts;
    int n, cap;
    plan_entry *e;
} plan_result;

/* Runs the plan and keeps every point.  Free with plan_result_free. */
int plan_collect(const spec *s, const plan_opts *opts, plan_result *out, hearth_err *err);
void plan_result_free(plan_result *r);

/* `hearth plan` output: counts first (kept / pruned / skipped), then the kept points, the
 * pruned ones with their rule and reason, the skipped ones with why. */
int plan_format_table(const plan_result *r, FILE *f);
/* One JSON object: {"experiment", "counts", "kept": [...], "pruned": [... "rule", "reason"],
 * "skipped": [... "reason"]}; each point has "index" (1-based), "overrides" (typed values),
 * "resources", and "hash" / "runs" / "completed" where they apply. */
int plan_format_json(const plan_result *r, FILE *f);

const char *plan_status_name(plan_status s);

#endif
