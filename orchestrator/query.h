/* query.h - the reading commands of `hearth`: query, top, export, show, compare.
 *
 * Each writes its report to `out` in the requested format (report_fmt.h) and returns 0 or
 * a negative herr_code: HERR_CONFIG for user errors (a bad filter with its column, an
 * unknown key, column, run or experiment), HERR_RUNTIME for database failures, HERR_IO
 * when writing failed.
 *
 * Names in filters, --columns, --order and --by are run fields (run_id, experiment, seq,
 * state, config_hash, attempts, exit_code, backend, job_id, run_dir, created_at,
 * submitted_at, started_at, ended_at), result fields (result.json: steps, step_ms_median,
 * step_ms_p10, step_ms_p90, tokens_per_s, tokens_per_s_per_gpu, flops_per_token, mfu,
 * peak_mem_bytes, final_loss, exit_status, device, device_count, nodes, versions) or
 * dotted config keys of the resolved run config ("parallel.tp"); see query_sql.h for
 * `run.` / `result.` / `config.` prefixes and the filter semantics.  Nothing a user writes
 * is ever part of SQL text. */
#ifndef HEARTH_QUERY_H
#define HEARTH_QUERY_H

#include <stdio.h>

#include "db.h"
#include "report_fmt.h"

typedef struct {
    const char *filter;       /* expression (expr.h) or NULL: every run */
    const char *experiment;   /* only this experiment's runs, or NULL */
    const char *order;        /* "KEY" ascending, "-KEY" descending, or NULL: run order */
    long limit;               /* > 0: at most this many rows */
    const char *columns;      /* "a,b,c" or NULL: run_id, experiment, state, tokens_per_s,
                                 step_ms_median, mfu, peak_mem_bytes, final_loss */
    report_format format;
    int archived;             /* also runs of archived experiments (shown anyway when
                                 `experiment` names one) */
} query_opts;

/* hearth query.  *n_rows (may be NULL) receives the number of rows written. */
int query_runs(hearth_db *db, const query_opts *o, FILE *out, long *n_rows, hearth_err *err);

typedef struct {
    const char *by;           /* NULL: tokens_per_s.  Best first: descending when higher is
                                 better, ascending for step times, memory and loss;
                                 "-KEY" / "+KEY" force the direction */
    const char *filter;       /* optional further filter */
    long limit;               /* 0: 10 */
    const char *columns;      /* NULL: run_id, the config keys that differ between the
                                 experiment's completed runs, the `by` key and the main
                                 result fields */
    report_format format;
} query_top_opts;

/* The config keys whose values differ between experiment exp's completed runs (or that
 * only some of them set), sorted, at most max: keys[0..*n) malloc'd, freed by the caller
 * (none left on error). */
int query_varying_keys(hearth_db *db, int64_t exp, int max, char **keys, int *n,
                       hearth_err *err);

/* hearth top EXP: the experiment's completed runs, best first. */
int query_top(hearth_db *db, const char *experiment, const query_top_opts *o, FILE *out,
              hearth_err *err);

/* hearth export EXP: every run of the experiment with every run field, result field and
 * config key (config keys named like a field are written "config.KEY"). */
int query_export(hearth_db *db, const char *experiment, report_format fmt, FILE *out,
                 hearth_err *err);

/* hearth show RUN: the run's record, result, resolved config (flattened), a summary of
 * its metrics and its state history.  Sections "run", "result", "metrics", "config",
 * "events": in a table one after another, in CSV as section,key,value rows, in JSON one
 * object with an object per section. */
int query_show(hearth_db *db, const char *run_id, report_format fmt, FILE *out,
               hearth_err *err);

/* hearth compare A B: the config keys whose values differ (or exist in one run only), and
 * every result field side by side with the ratio B/A for numbers.  In a table two
 * sections; in CSV section,key,a,b,ratio rows; in JSON {"a", "b", "config": [...],
 * "results": [...]}. */
int query_compare(hearth_db *db, const char *run_a, const char *run_b, report_format fmt,
                  FILE *out, hearth_err *err);

#endif
