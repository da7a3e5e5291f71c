/* cmd_ingest.c - `hearth ingest [DIR...]`: record run directories in the database, the way
 * back from a database that was deleted or replaced (rebuild.h).
 *
 * Per experiment: its runner lock is taken first (a live runner owns its runs: they are
 * left to it), the runs missing from the database are recorded, and those that had
 * started are settled by one reconcile through the experiment's backend (sweep.h, `once`),
 * exactly as `hearth resume` would find them.  Runs the database has already are left
 * alone and counted, so running it twice changes nothing. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cmd.h"
#include "rebuild.h"
#include "rundir.h"
#include "runs_db.h"
#include "sweep.h"

typedef struct {
    long recorded, known, failed;   /* runs */
} ingest_totals;

/* One reconcile of the experiment's started runs through its backend (job.json of
 * `run_dir`): ended jobs are recorded from their files, live ones left running. */
static int settle(hearth_db *db, const char *experiment, const char *run_dir,
                  hearth_err *err)
{
    rundir_job j;
    int rc = rundir_job_read(run_dir, &j, err);
    if (rc)
        return rc;
    backend *b = NULL;
    if ((rc = backend_open(j.backend, &b, err)) == 0) {
        sweep_opts so = { 0 };
        so.experiment = experiment;
        so.once = 1;
        so.progress = stderr;
        sweep_result res;
        rc = sweep_run(db, b, &so, &res, err);
    }
    backend_free(b);
    rundir_job_free(&j);
    return rc;
}

/* The runs of dirs->v[from, to) (one experiment, its directory exp_dir), under its lock. */
static int ingest_experiment(hearth_db *db, const rebuild_dirs *d, size_t from,
                             size_t to, ingest_totals *t, hearth_err *err)
{
    const char *exp = d->v[from].experiment;
    char exp_dir[PATH_MAX];
    const char *slash = strrchr(d->v[from].dir, '/');
    snprintf(exp_dir, sizeof exp_dir, "%.*s", (int)(slash - d->v[from].dir), d->v[from].dir);
    int lock = -1;
    sweep_lock_owner holder;
    memset(&holder, 0, sizeof holder);
    int rc = sweep_lock_acquire(exp_dir, 0, NULL, &lock, &holder, err);
    if (rc == 1) {
        char who[320];
        sweep_lock_owner_format(&holder, who, sizeof who);
        fprintf(stderr, "hearth ingest: %s: a runner (%s) is working on this experiment "
                "and records its runs itself; its run directories (%zu) are left alone\n", exp,
                who, to - from);
        t->failed += (long)(to - from);
        return 0;
    }
    if (rc)
        return rc;
    long recorded = 0, started = 0;
    for (size_t i = from; i < to && !rc; i++) {
        rebuild_run_info info;
        hearth_err e;
        int r = rebuild_run(db, d->v[i].dir, &info, &e);
        if (r && db_file_lost(db)) {
            *err = e;
            rc = r;
        } else if (r) {
            fprintf(stderr, "hearth ingest: %s\n", e.msg);
            t->failed++;
        } else if (info.outcome == REBUILD_KNOWN) {
            t->known++;
        } else {
            recorded++;
            started += info.state == RUN_RUNNING;
            if (info.ingest_failed)
                fprintf(stderr, "hearth ingest: %s\n", info.ingest_err.msg);
        }
    }
    if (!rc && started)
        rc = settle(db, exp, d->v[from].dir, err);
    sweep_lock_release(lock);
    t->recorded += recorded;
    return rc;
}

int cmd_ingest(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    char runs_dir[PATH_MAX];
    const char *deflt[1] = { runs_dir };
    const char *const *paths = (const char *const *)c->argv;
    size_t n_paths = (size_t)c->argc;
    int rc = 0;
    if (n_paths == 0) {
        if ((rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, &err)))
            return hcli_fail(c, rc, &err);
        paths = deflt;
        n_paths = 1;
    }
    rebuild_dirs d;
    if ((rc = rebuild_find(paths, n_paths, &d, &err)))
        return hcli_fail(c, rc, &err);
    hearth_db *db = NULL;
    int code = cmd_open_db(c, 1, &db);
    if (code) {
        rebuild_dirs_free(&d);
        return code;
    }
    ingest_totals t;
    memset(&t, 0, sizeof t);
    size_t n_exp = 0;
    for (size_t from = 0, to; !rc && from < d.n; from = to) {
        for (to = from + 1; to < d.n && strcmp(d.v[to].experiment, d.v[from].experiment) == 0;
             to++)
            ;
        rc = ingest_experiment(db, &d, from, to, &t, &err);
        n_exp++;
    }
    /* What each experiment holds now, and what is left to do. */
    for (size_t i = 0; !rc && i < d.n; i++) {
        if (i > 0 && strcmp(d.v[i].experiment, d.v[i - 1].experiment) == 0)
            continue;
        long counts[RUN_STATE_COUNT];
        if ((rc = runs_db_state_counts(db, d.v[i].experiment, counts, &err)))
            break;
        printf("%s: %ld completed, %ld failed, %ld timeout, %ld cancelled, %ld in flight\n",
               d.v[i].experiment, counts[RUN_COMPLETED], counts[RUN_FAILED],
               counts[RUN_TIMEOUT], counts[RUN_CANCELLED], sweep_in_flight(counts));
        if (sweep_in_flight(counts))
            printf("  `hearth resume %s` runs or waits for the runs in flight\n",
                   d.v[i].experiment);
    }
    db_close(db);
    if (rc) {
        rebuild_dirs_free(&d);
        return hcli_fail(c, rc, &err);
    }
    fprintf(stderr, "hearth ingest: %zu run director%s of %zu experiment%s: %ld recorded, "
            "%ld already in %s (left as they were)%s\n", d.n, d.n == 1 ? "y" : "ies", n_exp,
            n_exp == 1 ? "" : "s", t.recorded, t.known, c->db_path,
            t.failed ? ", some not recorded (see above)" : "");
    rebuild_dirs_free(&d);
    return t.failed ? HCLI_EXIT_FAILED : HCLI_EXIT_OK;
}
