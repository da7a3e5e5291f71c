/* check.h - the judgement behind `hearth check`: which figures of a run are compared, in
 * which direction each one is better, how repeats are summarised, how tolerances are
 * written and how a current value is judged against a baseline.  Pure: no database, no
 * files (check_db.h reads points, check_ref.h reference files).
 *
 * Figures are result fields (DESIGN.md, "Trainer outputs"), named as `hearth query`
 * names them:
 *
 *   tokens_per_s     higher is better   default tolerance 5 %
 *   step_ms_median   lower is better    5 %
 *   mfu              higher is better   5 %
 *   peak_mem_bytes   lower is better    5 %
 *   final_loss       lower is better    2 %
 *
 * A tolerance is the percentage by which the current median may be worse than the
 * baseline's (relative to the baseline's magnitude) before it counts as a regression;
 * being better by any amount never fails.  "off" disables the gate for a figure (it is
 * still shown).  Repeats of a point are summarised by their median, with min and max as
 * the spread; non-finite values (a CPU run's null mfu) are left out.
 *
 * Errors: HERR_CONFIG with the offending text for a malformed tolerance list. */
#ifndef HEARTH_CHECK_H
#define HEARTH_CHECK_H

#include <stddef.h>

#include "shape/err.h"

typedef enum {
    CHECK_TOKENS_PER_S = 0,
    CHECK_STEP_MS,
    CHECK_MFU,
    CHECK_PEAK_MEM,
    CHECK_FINAL_LOSS,
    CHECK_N_FIGURES
} check_figure;

typedef struct {
    const char *name;        /* the result field: "tokens_per_s" */
    int higher_better;       /* 1: more is better (throughput, MFU); 0: less is better */
    double default_tol;      /* percent */
} check_figure_info;

const check_figure_info *check_figure_get(check_figure f);
/* The figure named by the first `len` bytes of `name`, or -1. */
int check_figure_find(const char *name, size_t len);


/* Tolerances per figure: a percentage >= 0, CHECK_TOL_OFF, or CHECK_TOL_UNSET (the next
 * layer decides: the command line over a reference point over the reference file over
 * the built-in defaults). */
#define CHECK_TOL_OFF (-1.0)
#define CHECK_TOL_UNSET (-2.0)
typedef struct {
    double pct[CHECK_N_FIGURES];
} check_tols;

void check_tols_unset(check_tols *t);
void check_tols_defaults(check_tols *t);
/* Every figure set in `over` replaces the one in `t`. */
void check_tols_merge(check_tols *t, const check_tols *over);
/* One tolerance value: "5", "2.5", "5%" or "off"; 0 or HERR_CONFIG naming `what`. */
int check_tol_value(const char *text, const char *what, double *pct, hearth_err *err);
/* "FIGURE=PCT,FIGURE=PCT" (as --tol takes it) into `t`; HERR_CONFIG names the bad item
 * and, for an unknown figure, the figures there are. */
int check_tols_parse(const char *spec, check_tols *t, hearth_err *err);
/* Which figures to check: "a,b" (NULL or "": all).  want[f] is set to 0 or 1. */
int check_figures_parse(const char *spec, int want[CHECK_N_FIGURES], hearth_err *err);

typedef enum {
    CHECK_OK = 0,        /* within tolerance */
    CHECK_IMPROVED,      /* better than the baseline by more than the tolerance */
    CHECK_REGRESSED,     /* worse by more than the tolerance: the gate fails */
    CHECK_NO_BASELINE,   /* no baseline value for this point and figure */
    CHECK_NO_VALUE,      /* the point has no value for this figure */
    CHECK_UNGATED,       /* tolerance off: compared, never fails */
    CHECK_NO_RESULT,     /* (a whole point) no completed run with a result */
    CHECK_NOT_RUN,       /* (a whole point) in the reference file, not in the experiment */
} check_verdict;

const char *check_verdict_name(check_verdict v);

/* Judges current median `cur` against baseline median `base` for figure f with
 * tolerance `tol` (a percentage or CHECK_TOL_OFF).  *change_pct gets the relative change
 * (cur - base) / |base| * 100 (NaN when either is missing; when base is 0: 0 if cur is
 * 0 too, else +-inf).  A non-finite cur gives CHECK_NO_VALUE, a non-finite base
 * CHECK_NO_BASELINE. */
check_verdict check_judge(check_figure f, double cur, double base, double tol,
                          double *change_pct);

#endif
