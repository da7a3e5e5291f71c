/* cmd_status.c - following and steering runs: `hearth status`, `wait`, `cancel`, `resume`,
 * `logs`. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cmd.h"
#include "ingest.h"
#include "progress.h"
#include "report_fmt.h"
#include "run_state.h"
#include "runs_db.h"
#include "sweep.h"


/* An experiment named on the command line must exist: exit 2 otherwise. */
static int need_experiment(hcli_ctx *c, hearth_db *db, const char *name, hearth_err *err)
{
    int64_t id;
    int rc = runs_db_experiment_find(db, name, &id, err);
    if (rc == 0)
        return herr_set(err, HERR_CONFIG, "no experiment named '%s' in %s", name, c->db_path);
    return rc < 0 ? rc : 0;
}

static int format_of(hcli_ctx *c, report_format *fmt, hearth_err *err)
{
    const char *f = hcli_get(c, "format");
    *fmt = REPORT_TABLE;
    return f ? report_format_parse(f, fmt, err) : 0;
}

/* ---- status ------------------------------------------------------------------------------ */

static report_cell int_cell(long v)
{
    report_cell x = { .kind = CELL_INT, .i = v };
    return x;
}

static report_cell text_cell(const char *s)
{
    report_cell x = { .kind = s ? CELL_TEXT : CELL_NULL, .s = s };
    return x;
}

/* `hearth status` without EXP: one line per experiment (archived ones with --all, only
 * those tagged T with --tag T).  The archived column is there only with --all: without it,
 * it would be empty on every line. */
static int status_experiments(hcli_ctx *c, hearth_db *db, report_format fmt, hearth_err *err)
{
    char runs_dir[PATH_MAX];
    int rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, err);
    if (rc)
        return rc;
    experiment_filter f = { hcli_flag(c, "all"), hcli_get(c, "tag") };
    experiment_info *v = NULL;
    size_t n = 0;
    if ((rc = runs_db_experiment_list(db, &f, &v, &n, err)))
        return rc;
    const char *names[6 + RUN_STATE_COUNT];
    size_t nc = 0;
    names[nc++] = "experiment";
    names[nc++] = "runs";
    for (int s = 0; s < RUN_STATE_COUNT; s++)
        names[nc++] = run_state_name((run_state)s);
    names[nc++] = "tags";
    names[nc++] = "created";
    if (f.archived)
        names[nc++] = "archived";
    names[nc++] = "runner";
    report *r = report_begin(stdout, fmt, nc, names);
    if (!r)
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        const experiment_info *e = &v[i];
        report_cell cells[6 + RUN_STATE_COUNT];
        size_t k = 0;
        long total = 0;
        cells[k++] = text_cell(e->name);
        for (int s = 0; s < RUN_STATE_COUNT; s++)
            total += e->counts[s];
        cells[k++] = int_cell(total);
        for (int s = 0; s < RUN_STATE_COUNT; s++)
            cells[k++] = int_cell(e->counts[s]);
        cells[k++] = text_cell(e->tags);
        cells[k++] = text_cell(e->created_at);
        if (f.archived)
            cells[k++] = text_cell(e->archived_at);
        char dir[PATH_MAX], who[320];
        sweep_lock_owner owner;
        memset(&owner, 0, sizeof owner);
        int held = sweep_experiment_dir(db, e->name, runs_dir, dir, sizeof dir, err) == 0 &&
                   sweep_lock_held(dir, &owner);
        sweep_lock_owner_format(&owner, who, sizeof who);
        cells[k++] = text_cell(held ? who : NULL);
        rc = report_row(r, cells, err);
    }
    runs_db_experiment_list_free(v, n);
    if (rc) {
        report_abort(r);
        return rc;
    }
    return report_end(r, err);
}

static int status_runs(hearth_db *db, const char *exp, report_format fmt, hearth_err *err)
{
    static const char *const names[] = { "run_id", "state", "attempts", "exit_code", "job_id",
                                         "started_at", "ended_at", "run_dir" };
    run_info *v = NULL;
    size_t n = 0;
    int rc = runs_db_list(db, exp, 0, &v, &n, err);
    if (rc)
        return rc;
    report *r = report_begin(stdout, fmt, sizeof names / sizeof *names, names);
    if (!r)
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        report_cell cells[8] = {
            text_cell(v[i].run_id), text_cell(run_state_name(v[i].state)),
            int_cell(v[i].attempts),
            v[i].has_exit_code ? int_cell(v[i].exit_code) : text_cell(NULL),
            text_cell(v[i].backend_job_id), text_cell(v[i].started_at),
            text_cell(v[i].ended_at), text_cell(v[i].run_dir),
        };
        rc = report_row(r, cells, err);
    }
    runs_db_list_free(v, n);
    if (rc) {
        report_abort(r);
        return rc;
    }
    return report_end(r, err);
}

/* The backend the experiment's runs were submitted to (job.json of its first run); buf
 * keeps its value ("local") when that cannot be told. */
static void experiment_backend(hearth_db *db, const char *exp, char *buf, size_t size)
{
    run_info *v = NULL;
    size_t nv = 0;
    hearth_err e;
    if (runs_db_list(db, exp, 0, &v, &nv, &e) == 0 && nv && v[0].run_dir) {
        rundir_job j;
        if (rundir_job_read(v[0].run_dir, &j, &e) == 0) {
            if (j.backend)
                snprintf(buf, size, "%s", j.backend);
            rundir_job_free(&j);
        }
    }
    runs_db_list_free(v, nv);
}

/* `hearth status EXP` of an experiment on a queued backend (Slurm) that no runner is
 * following: one look at its jobs, as a runner would take (one batched poll), so that
 * ended jobs are ingested and a job submitted but never recorded is adopted.  A local
 * experiment is left to `hearth resume`.  Failures are reported, not fatal. */
static void status_refresh(hcli_ctx *c, hearth_db *db, const char *exp)
{
    char backend_name[64] = "local", runs_dir[PATH_MAX], exp_dir[PATH_MAX];
    hearth_err err = { { 0 } };
    long counts[RUN_STATE_COUNT];
    experiment_backend(db, exp, backend_name, sizeof backend_name);
    if (strcmp(backend_name, "local") == 0 ||
        runs_db_state_counts(db, exp, counts, &err) ||
        counts[RUN_SUBMITTED] + counts[RUN_RUNNING] == 0 ||
        hcli_runs_dir(c, runs_dir, sizeof runs_dir, &err) ||
        sweep_experiment_dir(db, exp, runs_dir, exp_dir, sizeof exp_dir, &err))
        return;
    int lock = -1;
    if (sweep_lock_acquire(exp_dir, 0, NULL, &lock, NULL, &err) != 0)
        return;   /* a runner follows the jobs: the database is current */
    backend *b = NULL;
    int rc = backend_open(backend_name, &b, &err);
    if (!rc) {
        sweep_opts so = { 0 };
        so.experiment = exp;
        so.once = 1;
        so.progress = stderr;
        sweep_result res;
        rc = sweep_run(db, b, &so, &res, &err);
    }
    backend_free(b);
    sweep_lock_release(lock);
    if (rc)
        fprintf(stderr, "hearth status: could not look at the jobs of %s: %s\n", exp, err.msg);
}

int cmd_status(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    report_format fmt;
    int rc = format_of(c, &fmt, &err);
    if (!rc && c->argc && (hcli_flag(c, "all") || hcli_get(c, "tag")))
        rc = herr_set(&err, HERR_CONFIG, "--all and --tag choose experiments to list; not "
                      "with EXP");
    if (rc)
        return hcli_fail(c, rc, &err);
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    if (c->argc == 0)
        rc = status_experiments(c, db, fmt, &err);
    else if (!(rc = need_experiment(c, db, c->argv[0], &err))) {
        status_refresh(c, db, c->argv[0]);
        rc = status_runs(db, c->argv[0], fmt, &err);
    }
    db_close(db);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}

/* ---- wait ------------------------------------------------------------------------------- */

int cmd_wait(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    const char *exp = c->argv[0];
    long timeout = 0;
    char runs_dir[PATH_MAX], exp_dir[PATH_MAX];
    int rc = hcli_get_long(c, "timeout", 0, 0, &timeout, &err);
    if (!rc)
        rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    if ((rc = need_experiment(c, db, exp, &err)) ||
        (rc = sweep_experiment_dir(db, exp, runs_dir, exp_dir, sizeof exp_dir, &err))) {
        db_close(db);
        return hcli_fail(c, rc, &err);
    }
    int orphan_checks = 0;
    double until = timeout > 0 ? backend_clock_s() + (double)timeout : 0;
    progress prog;
    progress_init(&prog, stderr, isatty(2), PROGRESS_PLAIN_INTERVAL_S);
    long counts[RUN_STATE_COUNT];
    for (;;) {
        if ((rc = runs_db_state_counts(db, exp, counts, &err)))
            break;
        long total = 0, failed = counts[RUN_FAILED] + counts[RUN_TIMEOUT];
        for (int s = 0; s < RUN_STATE_COUNT; s++)
            total += counts[s];
        long in_flight = sweep_in_flight(counts);
        progress_counts(&prog, total - counts[RUN_PENDING] - counts[RUN_REQUEUED], total,
                        counts[RUN_SUBMITTED] + counts[RUN_RUNNING], counts[RUN_COMPLETED],
                        failed, counts[RUN_CANCELLED]);
        if (in_flight == 0) {
            /* Ok when every point has a completed run: a failed run whose point ran again
             * (a retry as a new run, a replaced vanished job) does not count. */
            long missing = 0, runs = 0;
            progress_end(&prog);
            rc = sweep_points_missing(db, exp, &missing, &runs, &err);
            db_close(db);
            if (rc)
                return hcli_fail(c, rc, &err);
            if (missing)
                fprintf(stderr, "hearth wait: %ld point%s of %s %s no completed run\n",
                        missing, missing == 1 ? "" : "s", exp, missing == 1 ? "has" : "have");
            return missing ? HCLI_EXIT_FAILED : HCLI_EXIT_OK;
        }
        /* Runs in flight with nobody to run them would be waited for forever. */
        orphan_checks = sweep_lock_held(exp_dir, NULL) ? 0 : orphan_checks + 1;
        if (orphan_checks >= 4) {
            rc = herr_set(&err, HERR_RUNTIME, "no runner is working on %s (%ld runs in "
                          "flight); `hearth resume %s` continues the sweep", exp, in_flight,
                          exp);
            break;
        }
        if (until > 0 && backend_clock_s() >= until) {
            rc = herr_set(&err, HERR_RUNTIME, "gave up after %lds with %ld runs in flight",
                          timeout, in_flight);
            break;
        }
        backend_sleep_ms(500);
    }
    progress_end(&prog);
    db_close(db);
    return hcli_fail(c, rc, &err);
}

/* ---- cancel ----------------------------------------------------------------------------- */

/* The state first (so that no runner starts it or retries it), then its job. */
int cmd_cancel_run(hearth_db *db, const run_info *ri, backend **bk, hearth_err *err)
{
    if (run_state_is_terminal(ri->state))
        return 0;
    run_transition t = { .note = "hearth cancel" };
    hearth_err terr;
    if (runs_db_transition(db, ri->run_id, RUN_CANCELLED, &t, &terr)) {
        run_info now;
        memset(&now, 0, sizeof now);
        int g = runs_db_get(db, ri->run_id, &now, err);
        int ended = g == 1 && run_state_is_terminal(now.state);
        if (ended)
            printf("%s: already %s\n", ri->run_id, run_state_name(now.state));
        run_info_free(&now);
        if (ended)
            return 0;
        *err = terr;
        return HERR_RUNTIME;
    }
    if ((ri->state == RUN_SUBMITTED || ri->state == RUN_RUNNING) && ri->run_dir) {
        if (!*bk) {
            int rc = backend_open(ri->backend, bk, err);
            if (rc)
                return rc;
        }
        char script[PATH_MAX + 16];
        snprintf(script, sizeof script, "%s/job.sh", ri->run_dir);
        backend_job bj = { ri->run_id, ri->run_dir, script, 1, 0, 0, NULL };
        int rc = (*bk)->ops->cancel(*bk, &bj, ri->backend_job_id, err);
        if (rc < 0)
            return rc;
        hearth_err ierr;
        ingest_run(db, ri->run_id, ri->run_dir, NULL, &ierr);
    }
    printf("%s: cancelled\n", ri->run_id);
    return 0;
}

int cmd_cancel(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    backend *bk = NULL;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    int rc = 0;
    for (int i = 0; !rc && i < c->argc; i++) {
        run_info ri;
        memset(&ri, 0, sizeof ri);
        int found = runs_db_get(db, c->argv[i], &ri, &err);
        if (found < 0) {
            rc = found;
        } else if (found) {
            rc = cmd_cancel_run(db, &ri, &bk, &err);
        } else {
            int64_t id;
            int e = runs_db_experiment_find(db, c->argv[i], &id, &err);
            if (e == 0)
                rc = herr_set(&err, HERR_CONFIG, "no run or experiment named '%s'",
                              c->argv[i]);
            else if (e < 0)
                rc = e;
            /* Queued runs first, so that a runner starts none of them meanwhile. */
            unsigned masks[2] = { (1u << RUN_PENDING) | (1u << RUN_REQUEUED),
                                  (1u << RUN_SUBMITTED) | (1u << RUN_RUNNING) };
            for (int pass = 0; !rc && pass < 2; pass++) {
                run_info *v = NULL;
                size_t n = 0;
                rc = runs_db_list(db, c->argv[i], masks[pass], &v, &n, &err);
                for (size_t k = 0; !rc && k < n; k++)
                    rc = cmd_cancel_run(db, &v[k], &bk, &err);
                runs_db_list_free(v, n);
            }
        }
        run_info_free(&ri);
    }
    backend_free(bk);
    db_close(db);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}

/* ---- resume ------------------------------------------------------------------------------ */

int cmd_resume(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    char runs_dir[PATH_MAX], exp_dir[PATH_MAX];
    long jobs = 0;
    int rc = hcli_get_long(c, "jobs", 0, 1, &jobs, &err);
    if (!rc)
        rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    rc = need_experiment(c, db, c->argv[0], &err);
    if (!rc)
        rc = sweep_experiment_dir(db, c->argv[0], runs_dir, exp_dir, sizeof exp_dir, &err);
    char backend_name[64] = "local";
    if (!rc)
        experiment_backend(db, c->argv[0], backend_name, sizeof backend_name);
    /* Cancelled runs come back only when asked for: a cancel is a user's decision.  (Runs
     * interrupted with their runner were never cancelled: they are requeued, sweep.h.)
     * Reopened before the runner takes the lock; a runner working on the experiment
     * meanwhile picks them up like runs added by a second submit. */
    long reopened = 0;
    if (!rc && hcli_flag(c, "include-cancelled") &&
        !(rc = sweep_reopen_cancelled(db, c->argv[0], &reopened, &err)) && reopened)
        fprintf(stderr, "hearth: %s: %ld cancelled run%s reopened\n", c->argv[0], reopened,
                reopened == 1 ? "" : "s");
    db_close(db);
    if (rc)
        return hcli_fail(c, rc, &err);
    cmd_run_opts ro = { 0 };
    ro.experiment = c->argv[0];
    ro.exp_dir = exp_dir;
    ro.backend = backend_name;
    ro.jobs = jobs;
    ro.detach = hcli_flag(c, "detach");
    return cmd_run_sweep(c, &ro);
}

/* ---- logs ------------------------------------------------------------------------------- */

/* Copies what `path` holds beyond *off to `to`. */
static void copy_new(const char *path, off_t *off, FILE *to)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[65536];
    ssize_t n;
    while ((n = pread(fd, buf, sizeof buf, *off)) > 0) {
        fwrite(buf, 1, (size_t)n, to);
        *off += n;
    }
    close(fd);
    fflush(to);
}

int cmd_logs(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    run_info ri;
    memset(&ri, 0, sizeof ri);
    int rc = runs_db_get(db, c->argv[0], &ri, &err);
    if (rc == 0)
        rc = herr_set(&err, HERR_CONFIG, "no run named '%s' in %s", c->argv[0], c->db_path);
    else if (rc == 1 && !ri.run_dir)
        rc = herr_set(&err, HERR_RUNTIME, "%s has no run directory", c->argv[0]);
    else if (rc == 1)
        rc = 0;
    if (rc) {
        run_info_free(&ri);
        db_close(db);
        return hcli_fail(c, rc, &err);
    }
    char out_path[PATH_MAX + 16], err_path[PATH_MAX + 16], script[PATH_MAX + 16];
    snprintf(out_path, sizeof out_path, "%s/stdout.log", ri.run_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.log", ri.run_dir);
    snprintf(script, sizeof script, "%s/job.sh", ri.run_dir);
    off_t oo = 0, eo = 0;
    int follow = hcli_flag(c, "follow");
    backend *b = NULL;
    if (follow && (rc = backend_open(ri.backend, &b, &err))) {
        run_info_free(&ri);
        db_close(db);
        return hcli_fail(c, rc, &err);
    }
    backend_job bj = { ri.run_id, ri.run_dir, script, 1, 0, 0, NULL };
    for (;;) {
        copy_new(out_path, &oo, stdout);
        copy_new(err_path, &eo, stderr);
        if (!follow)
            break;
        run_info now;
        memset(&now, 0, sizeof now);
        if ((rc = runs_db_get(db, ri.run_id, &now, &err)) < 0)
            break;
        rc = 0;
        int ended = run_state_is_terminal(now.state) &&
                    b->ops->alive(b, &bj, now.backend_job_id, &err) != 1;
        run_info_free(&now);
        if (ended) {
            copy_new(out_path, &oo, stdout);
            copy_new(err_path, &eo, stderr);
            break;
        }
        backend_sleep_ms(250);
    }
    backend_free(b);
    run_info_free(&ri);
    db_close(db);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}
