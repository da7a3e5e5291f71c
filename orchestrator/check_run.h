/* check_run.h - `hearth check EXP`: every point of an experiment held against a
 * baseline, one row per point and figure, written as a table, CSV or JSON (report_fmt.h).
 *
 * Points are matched by config hash (check_db.h says why).  The baseline is one of
 *   - history (the default): per point, the best earlier completed runs of the same hash
 *     in other experiments (check_db_history);
 *   - another experiment (--against EXP2): its completed runs of the same hash;
 *   - a reference file (--reference FILE, check_ref.h); its points that the experiment
 *     lacks are listed as "not run".
 * Each figure's median over the point's repeats is judged against the baseline's median
 * (check_judge) with the tolerance that applies: --tol over the reference point's over
 * the reference file's over the built-in default.
 *
 * Columns (every format): point (the varying config keys), figure, runs, median,
 * spread_pct ((max - min) / median * 100 over the repeats), baseline (its source),
 * base_runs, base_median, base_spread_pct, change_pct, tol_pct (null: off), verdict;
 * CSV and JSON add config_hash, min, max, base_min, base_max.  A point without a
 * completed run, or one the experiment lacks, is one row with no figure.
 *
 * Errors: as check_db.h and check_ref.h; HERR_IO when writing failed. */
#ifndef HEARTH_CHECK_RUN_H
#define HEARTH_CHECK_RUN_H

#include <stdio.h>

#include "check.h"
#include "db.h"
#include "report_fmt.h"

typedef struct {
    const char *against;          /* --against EXP2, or NULL */
    const char *reference;        /* --reference FILE, or NULL (at most one of the two) */
    check_tols tols;              /* --tol: unset where not given */
    int figures[CHECK_N_FIGURES]; /* which figures to compare */
    report_format format;
} check_opts;

typedef struct {
    long points;          /* rows' points, "not run" ones included */
    long regressed;       /* figures beyond their tolerance */
    long no_baseline;     /* points without any baseline */
    long no_result;       /* points of the experiment without a completed run */
    long not_run;         /* reference points the experiment lacks */
} check_summary;

int check_run(hearth_db *db, const char *experiment, const check_opts *o, FILE *out,
              check_summary *sum, hearth_err *err);

/* One line for people: "3 points: 1 figure REGRESSED, 1 point without baseline". */
void check_summary_print(const check_summary *s, FILE *out);

#endif
