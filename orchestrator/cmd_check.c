/* cmd_check.c - `hearth check EXP`: the performance gate (check_run.h), and
 * `--write-reference FILE`, which records a good experiment as a reference (check_ref.h).
 * Exit 0 when every figure is within its tolerance, 1 when one regressed (or, with
 * --strict, a point has no baseline, no completed run or was not run), 2 usage errors. */
#include <string.h>

#include "check_db.h"
#include "check_ref.h"
#include "check_run.h"
#include "cmd.h"

/* The options, checked before the database is opened. */
static int parse_opts(hcli_ctx *c, check_opts *o, hearth_err *err)
{
    memset(o, 0, sizeof *o);
    o->against = hcli_get(c, "against");
    o->reference = hcli_get(c, "reference");
    check_tols_unset(&o->tols);
    const char *fmt = hcli_get(c, "format"), *tol = hcli_get(c, "tol");
    const char *wref = hcli_get(c, "write-reference");
    int rc = fmt ? report_format_parse(fmt, &o->format, err) : 0;
    if (!rc && o->against && o->reference)
        rc = herr_set(err, HERR_CONFIG, "--against and --reference: give one baseline");
    if (!rc && wref && (o->against || o->reference || tol))
        rc = herr_set(err, HERR_CONFIG, "--write-reference records EXP; it takes no "
                      "baseline or tolerance");
    if (!rc && ((o->against && !*o->against) || (o->reference && !*o->reference) ||
                (wref && !*wref)))
        rc = herr_set(err, HERR_CONFIG, "--against, --reference and --write-reference need "
                      "a name");
    if (!rc && o->against && strcmp(o->against, c->argv[0]) == 0)
        rc = herr_set(err, HERR_CONFIG, "--against %s: an experiment is its own baseline",
                      o->against);
    if (!rc && tol)
        rc = check_tols_parse(tol, &o->tols, err);
    if (!rc)
        rc = check_figures_parse(hcli_get(c, "figures"), o->figures, err);
    return rc;
}

static int write_reference(hcli_ctx *c, hearth_db *db, const char *path, hearth_err *err)
{
    check_set s = { 0 };
    int rc = check_db_experiment(db, c->argv[0], 1, &s, err);
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++)
        n += s.v[i].n_runs > 0;
    if (!rc && !n)
        rc = herr_set(err, HERR_CONFIG, "experiment '%s' has no completed run with a result: "
                      "nothing to record", c->argv[0]);
    if (!rc)
        rc = check_ref_write(path, c->argv[0], &s, err);
    if (!rc)
        printf("wrote %zu point%s of %s to %s\n", n, n == 1 ? "" : "s", c->argv[0], path);
    check_set_free(&s);
    return rc;
}

int cmd_check(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    check_opts o;
    int rc = parse_opts(c, &o, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    hearth_db *db;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    const char *wref = hcli_get(c, "write-reference");
    check_summary sum;
    rc = wref ? write_reference(c, db, wref, &err)
              : check_run(db, c->argv[0], &o, stdout, &sum, &err);
    db_close(db);
    if (!rc && fflush(stdout))
        rc = herr_set(&err, HERR_IO, "writing the output failed");
    if (rc)
        return hcli_fail(c, rc, &err);
    if (wref)
        return HCLI_EXIT_OK;
    /* CSV and JSON stay machine-readable: the summary goes to stderr there. */
    check_summary_print(&sum, o.format == REPORT_TABLE ? stdout : stderr);
    int failed = sum.regressed > 0 ||
                 (hcli_flag(c, "strict") && sum.no_baseline + sum.no_result + sum.not_run > 0);
    return failed ? HCLI_EXIT_FAILED : HCLI_EXIT_OK;
}
