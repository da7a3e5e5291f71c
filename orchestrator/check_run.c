/* check_run.c - holding an experiment's points against a baseline and writing the
 * verdicts.  See check_run.h. */
#include "check_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check_db.h"
#include "check_ref.h"

enum {
    COL_POINT, COL_FIGURE, COL_RUNS, COL_MEDIAN, COL_SPREAD, COL_BASELINE, COL_BASE_RUNS,
    COL_BASE_MEDIAN, COL_BASE_SPREAD, COL_CHANGE, COL_TOL, COL_VERDICT,
    /* CSV and JSON only */
    COL_HASH, COL_MIN, COL_MAX, COL_BASE_MIN, COL_BASE_MAX, N_COLS
};

static const char *const col_names[N_COLS] = {
    "point", "figure", "runs", "median", "spread_pct", "baseline", "base_runs",
    "base_median", "base_spread_pct", "change_pct", "tol_pct", "verdict",
    "config_hash", "min", "max", "base_min", "base_max",
};

static report_cell real_cell(double x)
{
    report_cell c = { CELL_NULL, 0, 0, NULL };
    if (isfinite(x)) {
        c.kind = CELL_REAL;
        c.d = x;
    }
    return c;
}

static report_cell text_cell(const char *s)
{
    report_cell c = { s ? CELL_TEXT : CELL_NULL, 0, 0, s };
    return c;
}

static report_cell int_cell(size_t n)
{
    report_cell c = { CELL_INT, (int64_t)n, 0, NULL };
    return c;
}

/* The spread of repeats relative to their median, in percent (NaN with fewer than two). */
static double spread_pct(const stats_summary *s)
{
    if (s->n < 2 || !isfinite(s->min) || !isfinite(s->max) || s->median == 0)
        return NAN;
    return (s->max - s->min) / fabs(s->median) * 100.0;
}

/* Percentages in a table are for reading: two decimals are plenty. */
static double shown_pct(double x, report_format fmt)
{
    /* + 0.0 turns a rounded -0 into 0. */
    return fmt == REPORT_TABLE && isfinite(x) ? round(x * 100.0) / 100.0 + 0.0 : x;
}

/* The cells of one row; `fig` < 0 for a point-level row, `base` NULL without one. */
static int write_row(report *r, report_format fmt, const check_point *p, const char *label,
                     const check_point *base, int fig, double tol, check_verdict v,
                     double change, hearth_err *err)
{
    report_cell c[N_COLS];
    for (int i = 0; i < N_COLS; i++)
        c[i] = text_cell(NULL);
    c[COL_POINT] = text_cell(label);
    c[COL_HASH] = text_cell(p ? p->hash : base->hash);
    c[COL_VERDICT] = text_cell(check_verdict_name(v));
    c[COL_BASELINE] = text_cell(base ? base->source : NULL);
    if (p)
        c[COL_RUNS] = int_cell(p->n_runs);
    if (base)
        c[COL_BASE_RUNS] = int_cell(base->n_runs);
    if (fig >= 0) {
        c[COL_FIGURE] = text_cell(check_figure_get((check_figure)fig)->name);
        const stats_summary *s = &p->fig[fig];
        c[COL_MEDIAN] = real_cell(s->median);
        c[COL_MIN] = real_cell(s->min);
        c[COL_MAX] = real_cell(s->max);
        c[COL_SPREAD] = real_cell(shown_pct(spread_pct(s), fmt));
        if (base) {
            const stats_summary *b = &base->fig[fig];
            c[COL_BASE_MEDIAN] = real_cell(b->median);
            c[COL_BASE_MIN] = real_cell(b->min);
            c[COL_BASE_MAX] = real_cell(b->max);
            c[COL_BASE_SPREAD] = real_cell(shown_pct(spread_pct(b), fmt));
        }
        c[COL_CHANGE] = real_cell(shown_pct(change, fmt));
        if (isinf(change))
            c[COL_CHANGE] = (report_cell){ CELL_REAL, 0, change, NULL };
        c[COL_TOL] = real_cell(tol >= 0 ? tol : NAN);
    }
    return report_row(r, c, err);
}

/* The baseline of point p: from the reference or --against set, else the history. */
static int baseline_of(hearth_db *db, const char *experiment, const check_opts *o,
                       check_set *bset, const check_point *p, check_point *hist,
                       const check_point **base, hearth_err *err)
{
    *base = NULL;
    if (o->against || o->reference) {
        check_point *b = check_set_find(bset, p->hash);
        *base = b && (b->n_runs || o->reference) ? b : NULL;
        return 0;
    }
    int rc = check_db_history(db, experiment, p, hist, err);
    if (rc > 0)
        *base = hist;
    return rc < 0 ? rc : 0;
}

/* The rows of one point of the experiment. */
static int check_point_rows(report *r, const check_opts *o, const check_tols *file_tols,
                            const check_point *p, const check_point *base,
                            check_summary *sum, hearth_err *err)
{
    const char *label = p->label ? p->label : p->hash;
    if (!p->n_runs) {
        sum->no_result++;
        return write_row(r, o->format, p, label, base, -1, 0, CHECK_NO_RESULT, NAN, err);
    }
    if (!base)
        sum->no_baseline++;
    check_tols tols;
    check_tols_defaults(&tols);
    check_tols_merge(&tols, file_tols);
    if (base)
        check_tols_merge(&tols, &base->tols);
    check_tols_merge(&tols, &o->tols);
    for (int f = 0; f < CHECK_N_FIGURES; f++) {
        if (!o->figures[f])
            continue;
        double change = NAN;
        check_verdict v = check_judge((check_figure)f, p->fig[f].median,
                                      base ? base->fig[f].median : NAN, tols.pct[f], &change);
        sum->regressed += v == CHECK_REGRESSED;
        int rc = write_row(r, o->format, p, label, base, f, tols.pct[f], v, change, err);
        if (rc)
            return rc;
    }
    return 0;
}

int check_run(hearth_db *db, const char *experiment, const check_opts *o, FILE *out,
              check_summary *sum, hearth_err *err)
{
    memset(sum, 0, sizeof *sum);
    check_set exp = { 0 }, bset = { 0 };
    check_tols file_tols;
    check_tols_unset(&file_tols);
    int rc = check_db_experiment(db, experiment, 1, &exp, err);
    if (!rc && o->against)
        rc = check_db_experiment(db, o->against, 0, &bset, err);
    if (!rc && o->reference)
        rc = check_ref_load(o->reference, &bset, &file_tols, err);
    report *r = NULL;
    if (!rc) {
        size_t ncols = o->format == REPORT_TABLE ? COL_HASH : N_COLS;
        if (!(r = report_begin(out, o->format, ncols, col_names)))
            rc = herr_set(err, HERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < exp.n && !rc; i++) {
        check_point hist, *p = &exp.v[i];
        const check_point *base;
        rc = baseline_of(db, experiment, o, &bset, p, &hist, &base, err);
        if (!rc)
            rc = check_point_rows(r, o, &file_tols, p, base, sum, err);
        if (base == &hist)
            free(hist.source);
        sum->points++;
    }
    /* A reference names the points a sweep should have: those missing are shown. */
    for (size_t i = 0; o->reference && i < bset.n && !rc; i++) {
        const check_point *b = &bset.v[i];
        if (check_set_find(&exp, b->hash))
            continue;
        sum->not_run++;
        sum->points++;
        rc = write_row(r, o->format, NULL, b->label ? b->label : b->hash, b, -1, 0,
                       CHECK_NOT_RUN, NAN, err);
    }
    if (r && !rc)
        rc = report_end(r, err);
    else
        report_abort(r);
    check_set_free(&exp);
    check_set_free(&bset);
    return rc;
}

void check_summary_print(const check_summary *s, FILE *out)
{
    fprintf(out, "%ld point%s: %ld figure%s REGRESSED, %ld point%s without baseline",
            s->points, s->points == 1 ? "" : "s", s->regressed, s->regressed == 1 ? "" : "s",
            s->no_baseline, s->no_baseline == 1 ? "" : "s");
    if (s->no_result)
        fprintf(out, ", %ld without a completed run", s->no_result);
    if (s->not_run)
        fprintf(out, ", %ld reference point%s not run", s->not_run,
                s->not_run == 1 ? "" : "s");
    fputc('\n', out);
}
