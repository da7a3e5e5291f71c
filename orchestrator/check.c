/* check.c - figures, repeat statistics, tolerances and verdicts of `hearth check`.  See
 * check.h. */
#include "check.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Throughput-like figures get 5 %: run-to-run noise of a few percent is common on a busy
 * cluster.  The final loss of a fixed seed barely moves, so 2 % already means a change
 * in the numerics. */
static const check_figure_info figures[CHECK_N_FIGURES] = {
    { "tokens_per_s", 1, 5.0 },
    { "step_ms_median", 0, 5.0 },
    { "mfu", 1, 5.0 },
    { "peak_mem_bytes", 0, 5.0 },
    { "final_loss", 0, 2.0 },
};

/* A change within this many percent of the tolerance is taken as on the boundary:
 * (95 - 100) / 100 * 100 is not exactly -5 in binary floating point. */
#define TOL_SLACK 1e-9

const check_figure_info *check_figure_get(check_figure f)
{
    return f >= 0 && f < CHECK_N_FIGURES ? &figures[f] : NULL;
}

int check_figure_find(const char *name, size_t len)
{
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        if (strlen(figures[f].name) == len && memcmp(figures[f].name, name, len) == 0)
            return f;
    return -1;
}

void check_tols_unset(check_tols *t)
{
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        t->pct[f] = CHECK_TOL_UNSET;
}

void check_tols_defaults(check_tols *t)
{
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        t->pct[f] = figures[f].default_tol;
}

void check_tols_merge(check_tols *t, const check_tols *over)
{
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        if (over->pct[f] != CHECK_TOL_UNSET)
            t->pct[f] = over->pct[f];
}

int check_tol_value(const char *text, const char *what, double *pct, hearth_err *err)
{
    if (strcmp(text, "off") == 0) {
        *pct = CHECK_TOL_OFF;
        return 0;
    }
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    if (end != text && *end == '%')
        end++;
    if (end == text || *end || errno || !isfinite(x) || x < 0)
        return herr_set(err, HERR_CONFIG, "%s: '%s': expected a percentage >= 0 (5, 2.5%%) "
                        "or off", what, text);
    *pct = x;
    return 0;
}

/* "tokens_per_s, step_ms_median, ..." for messages. */
static void figure_list(char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = 0;
    for (int f = 0; f < CHECK_N_FIGURES && used < size; f++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", f ? ", " : "",
                                 figures[f].name);
}

static int unknown_figure(const char *name, size_t len, const char *what, hearth_err *err)
{
    char names[160];
    figure_list(names, sizeof names);
    return herr_set(err, HERR_CONFIG, "%s: unknown figure '%.*s' (figures: %s)", what,
                    (int)len, name, names);
}

int check_tols_parse(const char *spec, check_tols *t, hearth_err *err)
{
    for (const char *p = spec; *p; ) {
        size_t n = strcspn(p, ",");
        const char *eq = memchr(p, '=', n);
        if (!eq)
            return herr_set(err, HERR_CONFIG, "--tol: '%.*s': expected FIGURE=PCT", (int)n, p);
        int f = check_figure_find(p, (size_t)(eq - p));
        if (f < 0)
            return unknown_figure(p, (size_t)(eq - p), "--tol", err);
        char val[64], what[96];
        size_t vlen = n - (size_t)(eq + 1 - p);
        snprintf(val, sizeof val, "%.*s", (int)(vlen < sizeof val ? vlen : sizeof val - 1),
                 eq + 1);
        snprintf(what, sizeof what, "--tol %s", figures[f].name);
        int rc = check_tol_value(val, what, &t->pct[f], err);
        if (rc)
            return rc;
        p += n + (p[n] == ',');
    }
    return 0;
}

int check_figures_parse(const char *spec, int want[CHECK_N_FIGURES], hearth_err *err)
{
    int all = !spec || !*spec;
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        want[f] = all;
    for (const char *p = all ? "" : spec; *p; ) {
        size_t n = strcspn(p, ",");
        int f = check_figure_find(p, n);
        if (f < 0)
            return unknown_figure(p, n, "--figures", err);
        want[f] = 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

const char *check_verdict_name(check_verdict v)
{
    switch (v) {
    case CHECK_OK: return "ok";
    case CHECK_IMPROVED: return "improved";
    case CHECK_REGRESSED: return "REGRESSED";
    case CHECK_NO_BASELINE: return "no baseline";
    case CHECK_NO_VALUE: return "no value";
    case CHECK_UNGATED: return "ungated";
    case CHECK_NO_RESULT: return "no result";
    case CHECK_NOT_RUN: return "not run";
    }
    return "?";
}

check_verdict check_judge(check_figure f, double cur, double base, double tol,
                          double *change_pct)
{
    *change_pct = NAN;
    if (!isfinite(cur))
        return CHECK_NO_VALUE;
    if (!isfinite(base))
        return CHECK_NO_BASELINE;
    if (base != 0)
        *change_pct = (cur - base) / fabs(base) * 100.0;
    else
        *change_pct = cur == 0 ? 0.0 : cur > 0 ? INFINITY : -INFINITY;
    if (tol < 0)
        return CHECK_UNGATED;
    /* How much better the current value is, in percent: negative when worse. */
    double better = figures[f].higher_better ? *change_pct : -*change_pct;
    if (better < -(tol + TOL_SLACK))
        return CHECK_REGRESSED;
    if (better > tol + TOL_SLACK)
        return CHECK_IMPROVED;
    return CHECK_OK;
}
