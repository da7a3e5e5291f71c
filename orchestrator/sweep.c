/* sweep.c - the runner loop: reconcile, launch, poll, ingest, transition, retry.
 * See sweep.h. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ingest.h"
#include "progress.h"
#include "render.h"
#include "run_state.h"
#include "runs_db.h"
#include "shape/file_read.h"
#include "sweep.h"

/* A run whose job is in flight; its address is the backend's tag. */
typedef struct {
    char *run_id;
    char *run_dir;
    char script[4200];
    rundir_job job;
    char job_id[BACKEND_JOB_ID_MAX];
    char *dependency;         /* backend_job.dependency (malloc'd), or NULL */
} flight;

typedef struct {
    hearth_db *db;
    backend *b;
    const sweep_opts *o;
    sweep_result *res;
    hearth_err *err;
    flight **fl;
    size_t nfl, capfl;
    char **queue;
    size_t qn, qi;
    int limit;
    int need_reload;
    double last_reload;
    char *tmpl;
    char tmpl_name[256];
    progress prog;            /* the [N/T] line and messages (progress.h) */
    flight **batch;           /* submitted state recorded, waiting for submit_many */
    size_t nbatch, capbatch;
    int stopping;             /* o->stop was seen: jobs cancelled now are interrupted */
} sweeper;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

long sweep_in_flight(const long c[])
{
    return c[RUN_PENDING] + c[RUN_SUBMITTED] + c[RUN_RUNNING] + c[RUN_REQUEUED];
}

/* ---- progress and messages ------------------------------------------------------------- */

static void show_progress(sweeper *sw)
{
    sweep_result *r = sw->res;
    long failed = r->failed + r->timeout;
    long started = r->completed + failed + r->cancelled + (long)sw->nfl;
    long total = started + (long)(sw->qn - sw->qi);
    if (total == 0 && !sw->prog.line[0])
        return;   /* nothing to run: no "[0/0]" line */
    progress_counts(&sw->prog, started, total, (long)sw->nfl, r->completed, failed,
                    r->cancelled);
}

static void say(sweeper *sw, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(sweeper *sw, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    progress_say(&sw->prog, "%s", msg);
}

static void count_end(sweeper *sw, run_state s)
{
    switch (s) {
    case RUN_COMPLETED: sw->res->completed++; break;
    case RUN_TIMEOUT: sw->res->timeout++; break;
    case RUN_CANCELLED: sw->res->cancelled++; break;
    default: sw->res->failed++; break;
    }
}

/* ---- state changes ----------------------------------------------------------------------- */

/* Moves a run to `to`: 0 done, 1 when its current state no longer allows it (another
 * process changed it: a cancel, another runner), or a negative herr_code. */
static int move(sweeper *sw, const char *run_id, run_state to, const run_transition *t)
{
    hearth_err e;
    int rc = runs_db_transition(sw->db, run_id, to, t, &e);
    if (!rc)
        return 0;
    run_info ri;
    memset(&ri, 0, sizeof ri);
    hearth_err e2;
    int g = runs_db_get(sw->db, run_id, &ri, &e2);
    int stale = g == 1 && !run_state_can_transition(ri.state, to);
    run_info_free(&ri);
    if (stale)
        return 1;
    *sw->err = e;
    return rc;
}

static void flight_free(flight *f)
{
    if (!f)
        return;
    free(f->run_id);
    free(f->run_dir);
    free(f->dependency);
    rundir_job_free(&f->job);
    free(f);
}

static int flight_new(flight **out, const run_info *ri, hearth_err *err)
{
    flight *f = calloc(1, sizeof *f);
    if (f) {
        f->run_id = strdup(ri->run_id);
        f->run_dir = ri->run_dir ? strdup(ri->run_dir) : NULL;
    }
    if (!f || !f->run_id || (ri->run_dir && !f->run_dir)) {
        flight_free(f);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    if (f->run_dir)
        rundir_path(f->script, sizeof f->script, f->run_dir, "job.sh", NULL);
    *out = f;
    return 0;
}

static void backend_job_of(const flight *f, backend_job *bj)
{
    bj->run_id = f->run_id;
    bj->run_dir = f->run_dir;
    bj->script = f->script;
    bj->cpus_per_task = f->job.cpus_per_task;
    bj->time_limit_s = f->job.time_limit_s;
    bj->max_concurrent = f->job.max_concurrent;
    bj->dependency = f->dependency;
}

static int flights_add(sweeper *sw, flight *f)
{
    if (sw->nfl == sw->capfl) {
        size_t cap = sw->capfl ? 2 * sw->capfl : 16;
        flight **g = realloc(sw->fl, cap * sizeof *g);
        if (!g)
            return herr_set(sw->err, HERR_NOMEM, "out of memory");
        sw->fl = g;
        sw->capfl = cap;
    }
    sw->fl[sw->nfl++] = f;
    return 0;
}

static void flights_remove(sweeper *sw, flight *f)
{
    for (size_t i = 0; i < sw->nfl; i++)
        if (sw->fl[i] == f) {
            sw->fl[i] = sw->fl[--sw->nfl];
            return;
        }
}

/* A run that cannot even be started: failed with the reason. */
static int fail_run(sweeper *sw, const char *run_id, const char *why)
{
    run_transition t = { .note = why };
    int rc = move(sw, run_id, RUN_FAILED, &t);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        count_end(sw, RUN_FAILED);
        say(sw, "%s failed: %s", run_id, why);
    }
    return 0;
}

/* ---- replacement runs -------------------------------------------------------------------- */

int sweep_load_template(const char *backend_name, char *name, size_t name_size, char **text,
                        hearth_err *err)
{
    char file[128], path[4096];
    /* slurm and slurmrest both run sbatch scripts */
    const char *t = backend_name ? backend_name : "local";
    if (strncmp(t, "slurm", 5) == 0)
        t = "sbatch";
    snprintf(file, sizeof file, "%s.sh.tmpl", t);
    int rc = render_find_template(file, path, sizeof path, err);
    if (!rc)
        rc = file_read_bounded(path, FILE_READ_MAX_TEXT, text, NULL, err);
    if (!rc)
        snprintf(name, name_size, "%s", path);
    return rc;
}

/* Moves a directory that is in the way of a new run aside (a database that was deleted
 * while its run directories stayed): never mix two runs' files. */
static int move_aside(const char *dir, hearth_err *err)
{
    struct stat st;
    if (lstat(dir, &st))
        return 0;
    char to[4300];
    for (int i = 0; i < 1000; i++) {
        snprintf(to, sizeof to, "%s.stale-%lld-%d", dir, (long long)time(NULL), i);
        if (lstat(to, &st) && errno == ENOENT) {
            if (rename(dir, to))
                return herr_set(err, HERR_IO, "%s: %s", dir, strerror(errno));
            return 0;
        }
    }
    return herr_set(err, HERR_IO, "%s: cannot move the old directory aside", dir);
}

int sweep_create_run(hearth_db *db, const rundir_job *job, const char *config_json,
                     const char *exp_dir, const char *tmpl_name, const char *tmpl,
                     char **run_id, hearth_err *err)
{
    char *id = NULL, run_dir[4200];
    rundir_job j = *job;
    run_new r = { job->experiment, config_json, job->config_hash, NULL };
    int rc = db_tx_begin(db, err);
    if (rc)
        return rc;
    rc = runs_db_insert(db, &r, &id, NULL, err);
    if (!rc && (size_t)snprintf(run_dir, sizeof run_dir, "%s/%s", exp_dir, id) >= sizeof run_dir)
        rc = herr_set(err, HERR_IO, "%s/%s: path too long", exp_dir, id);
    if (!rc)
        rc = move_aside(run_dir, err);
    if (!rc) {
        j.run_id = id;
        rc = rundir_write(run_dir, &j, config_json, tmpl_name, tmpl, err);
    }
    if (!rc)
        rc = runs_db_set_run_dir(db, id, run_dir, err);
    rc = db_tx_end(db, rc, err);
    if (rc || !run_id)
        free(id);
    else
        *run_id = id;
    return rc;
}

/* A vanished run's point gets a new run, unless enough of its runs completed or are on
 * their way. */
static int replace_run(sweeper *sw, const char *run_id, const rundir_job *job)
{
    long completed = 0, active = 0;
    int rc = runs_db_count_by_hash(sw->db, sw->o->experiment, job->config_hash, &completed,
                                   &active, sw->err);
    if (rc || completed + active >= job->repeat)
        return rc;
    run_info ri;
    memset(&ri, 0, sizeof ri);
    rc = runs_db_get(sw->db, run_id, &ri, sw->err);
    if (rc <= 0 || !ri.config_json || !ri.run_dir) {
        run_info_free(&ri);
        return rc < 0 ? rc : 0;
    }
    if (!sw->tmpl)
        rc = sweep_load_template(job->backend, sw->tmpl_name, sizeof sw->tmpl_name, &sw->tmpl,
                                 sw->err);
    char exp_dir[4200];
    snprintf(exp_dir, sizeof exp_dir, "%s", ri.run_dir);
    char *slash = strrchr(exp_dir, '/');
    if (slash)
        *slash = 0;
    char *id = NULL;
    if (!rc)
        rc = sweep_create_run(sw->db, job, ri.config_json, exp_dir, sw->tmpl_name, sw->tmpl,
                              &id, sw->err);
    if (!rc) {
        sw->res->replaced++;
        say(sw, "%s: its point gets a new run, %s", run_id, id);
    }
    free(id);
    run_info_free(&ri);
    return rc;
}

/* ---- ending a run ------------------------------------------------------------------------ */

/* The exit code a vanished job's trainer left in result.json (ingest.h), -1 when there is
 * none to trust: the directory could not be ingested, or result.json is absent or says
 * nothing the trainer writes. */
static int result_exit_code(const ingest_summary *sum, const hearth_err *ierr)
{
    return ierr ? -1 : sum->result_exit_code;
}

/* The state a job's end leads to, with *code (the exit code to record, -1: none) and the
 * note for the history.  `ierr`: why the run directory could not be ingested, NULL when it
 * was.  Retries are decided by the caller. */
static run_state end_state(const flight *f, const backend_event *ev, const ingest_summary *sum,
                           const hearth_err *ierr, int *code, char *note, size_t size)
{
    *code = ev->has_exit_code ? ev->exit_code : -1;
    switch (ev->how) {
    case BACKEND_CANCELLED:
        snprintf(note, size, "cancelled");
        return RUN_CANCELLED;
    case BACKEND_TIMEOUT:
        snprintf(note, size, "wall-time limit of %llds reached", (long long)f->job.time_limit_s);
        return RUN_TIMEOUT;
    case BACKEND_REQUEUE:
        snprintf(note, size, "ended by the scheduler (node failure or preemption)");
        return RUN_REQUEUED;
    case BACKEND_VANISHED:
        if (result_exit_code(sum, ierr) >= 0) {
            /* The job script died (killed with its runner) but its trainer went on to the
             * end: the trainer's own summary says how the run ended. */
            *code = result_exit_code(sum, ierr);
            snprintf(note, size, "exit code %d from result.json (the job script ended "
                     "without writing exit_code)", *code);
            return run_state_for_exit_code(*code);
        }
        if (*code >= 0)
            snprintf(note, size, "job process vanished (status %d)", *code);
        else
            snprintf(note, size, "job process vanished");
        return RUN_FAILED;
    default:
        break;
    }
    snprintf(note, size, "exit code %d", *code);
    run_state to = run_state_for_exit_code(*code);
    if (to != RUN_COMPLETED)
        return to;
    /* Exit 0 is only the launcher's word: a run is completed by its recorded results. */
    if (ierr) {
        snprintf(note, size, "exit code 0, but its outputs could not be recorded: %.1000s",
                 ierr->msg);
        return RUN_FAILED;
    }
    if (!sum->has_result) {
        snprintf(note, size, "exit 0 but no result.json");
        return RUN_FAILED;
    }
    return RUN_COMPLETED;
}

/* Records how a job ended, its run directory already ingested (`sum`; `ierr` says why it
 * could not be, NULL when it was): the state, or another attempt. */
static int record_end(sweeper *sw, flight *f, const backend_event *ev,
                      const ingest_summary *sum, const hearth_err *ierr)
{
    run_info ri;
    memset(&ri, 0, sizeof ri);
    int rc = runs_db_get(sw->db, f->run_id, &ri, sw->err);
    if (rc <= 0) {
        run_info_free(&ri);
        return rc < 0 ? rc : 0;
    }
    if (run_state_is_terminal(ri.state)) {   /* ended by someone else: `hearth cancel` */
        count_end(sw, ri.state);
        run_info_free(&ri);
        return 0;
    }
    int code;
    char note[1200];
    if (sw->stopping && ev->how == BACKEND_CANCELLED) {
        /* Cancelled by this runner because it was told to stop, not by anyone's choice
         * about the run: the next runner continues it. */
        run_transition t = { .has_exit_code = ev->has_exit_code, .exit_code = ev->exit_code,
                             .note = SWEEP_NOTE_INTERRUPTED };
        rc = move(sw, f->run_id, RUN_REQUEUED, &t);
        if (rc == 0) {
            sw->res->interrupted++;
            say(sw, "%s interrupted%s; `hearth resume %s` continues it", f->run_id,
                rundir_has_checkpoint(f->run_dir) ? " after a checkpoint" : "",
                sw->o->experiment);
        }
        run_info_free(&ri);
        return rc < 0 ? rc : 0;
    }
    run_state to = end_state(f, ev, sum, ierr, &code, note, sizeof note);
    if (ierr && to != RUN_COMPLETED)
        say(sw, "%s: %s", f->run_id, ierr->msg);
    if (ev->how == BACKEND_VANISHED && to == RUN_COMPLETED)   /* else said below */
        say(sw, "%s: its job script is gone, but its trainer finished: %s", f->run_id, note);
    run_transition t = { .has_exit_code = code >= 0, .exit_code = code, .note = note };
    int retryable = sweep_retryable(to, code, f->job.retry_timeout);
    /* Attempts that ended without failing (interrupted, reopened) use up no retry. */
    long interrupted = 0, reopened = 0;
    rc = 0;
    if (retryable && (rc = runs_db_count_events(sw->db, f->run_id, RUN_REQUEUED,
                                                SWEEP_NOTE_INTERRUPTED, &interrupted,
                                                sw->err)) == 0)
        rc = runs_db_count_events(sw->db, f->run_id, RUN_REQUEUED, SWEEP_NOTE_REOPENED,
                                  &reopened, sw->err);
    long spared = interrupted + reopened;
    if (rc) {
        run_info_free(&ri);
        return rc;
    }
    if (retryable && ri.attempts - spared < 1 + f->job.retries) {
        char rnote[1300];
        snprintf(rnote, sizeof rnote, "%s; attempt %d of %d, retrying", note, ri.attempts,
                 1 + f->job.retries);
        t.note = rnote;
        rc = move(sw, f->run_id, RUN_REQUEUED, &t);
        if (rc == 0) {
            sw->res->retried++;
            sw->need_reload = 1;
            say(sw, "%s: %s", f->run_id, rnote);
        }
        run_info_free(&ri);
        return rc < 0 ? rc : 0;
    }
    if (to == RUN_REQUEUED)
        to = RUN_FAILED;   /* preempted with no retries left */
    /* A timeout with no retries left stays a timeout. */
    rc = move(sw, f->run_id, to, &t);
    if (rc == 0) {
        count_end(sw, to);
        if (to == RUN_TIMEOUT)
            say(sw, "%s timed out after %llds (%s/stderr.log)", f->run_id,
                (long long)f->job.time_limit_s, f->run_dir);
        else if (to == RUN_FAILED)
            say(sw, "%s failed: %s (%s/stderr.log)", f->run_id, note, f->run_dir);
    } else if (rc == 1) {
        run_info now;
        memset(&now, 0, sizeof now);
        if (runs_db_get(sw->db, f->run_id, &now, sw->err) == 1)
            count_end(sw, now.state);
        run_info_free(&now);
        rc = 0;
    }
    run_info_free(&ri);
    return rc < 0 ? rc : 0;
}

/* Records how a job ended: ingest, then the state (or another attempt). */
static int finish(sweeper *sw, flight *f, const backend_event *ev)
{
    ingest_summary sum;
    hearth_err ierr;
    int irc = ingest_run(sw->db, f->run_id, f->run_dir, &sum, &ierr);
    return record_end(sw, f, ev, &sum, irc ? &ierr : NULL);
}

int sweep_retryable(run_state to, int exit_code, int retry_timeout)
{
    switch (to) {
    case RUN_FAILED: return exit_code != 2;
    case RUN_REQUEUED: return 1;
    case RUN_TIMEOUT: return retry_timeout != 0;
    default: return 0;
    }
}

/* ---- after: another experiment first ------------------------------------------------------ */

enum { AFTER_GO = 0, AFTER_WAIT = 1, AFTER_FAILED = 2, AFTER_DEPEND = 3 };

int sweep_points_missing(hearth_db *db, const char *exp, long *missing, long *runs,
                         hearth_err *err)
{
    static const char sql[] =
        "SELECT COUNT(*), COALESCE(SUM(n), 0) FROM (SELECT SUM(r.state = 'completed') AS done,"
        " COUNT(*) AS n FROM runs r JOIN experiments e ON e.id = r.experiment_id"
        " WHERE e.name = ?1 GROUP BY r.config_hash) WHERE done = 0";
    static const char sql_runs[] =
        "SELECT COUNT(*) FROM runs r JOIN experiments e ON e.id = r.experiment_id"
        " WHERE e.name = ?1";
    sqlite3_stmt *st;
    *missing = *runs = 0;
    int rc = db_prepare(db, sql, &st, err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, exp, -1, SQLITE_TRANSIENT);
    int step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        *missing = sqlite3_column_int64(st, 0);
    db_stmt_done(st);
    if (step != SQLITE_ROW)
        return db_fail(db, err, "counting points without a completed run");
    if ((rc = db_prepare(db, sql_runs, &st, err)))
        return rc;
    sqlite3_bind_text(st, 1, exp, -1, SQLITE_TRANSIENT);
    step = sqlite3_step(st);
    if (step == SQLITE_ROW)
        *runs = sqlite3_column_int64(st, 0);
    db_stmt_done(st);
    if (step != SQLITE_ROW)
        return db_fail(db, err, "counting runs");
    return 0;
}

/* `after` an experiment still in flight, as a native Slurm dependency: "afterok:ID:ID..."
 * (or afterany) on its live jobs, in *dep (malloc'd), so that this run can be queued now.
 * Only when this sweep and every in-flight run of the other experiment are on the slurm
 * backend with a recorded job, and nothing would make Slurm's answer differ from the
 * runner's: no run of it waiting to be (re)submitted, none that could still be retried
 * (a retry is a new job, which the dependency would not wait for), and for afterok none
 * that already ended other than completed.  Returns 1 with *dep, 0 when the runner must
 * wait itself, or a negative herr_code. */
static int after_native(sweeper *sw, const rundir_job *job, const long c[], char **dep)
{
    *dep = NULL;
    if (strcmp(sw->b->ops->name, "slurm") != 0 || c[RUN_PENDING] || c[RUN_REQUEUED])
        return 0;
    if (!job->after_any && (c[RUN_FAILED] || c[RUN_CANCELLED] || c[RUN_TIMEOUT]))
        return 0;
    run_info *v = NULL;
    size_t n = 0;
    int rc = runs_db_list(sw->db, job->after_experiment,
                          (1u << RUN_SUBMITTED) | (1u << RUN_RUNNING), &v, &n, sw->err);
    if (rc)
        return rc;
    size_t len = 16;
    int ok = n > 0;
    for (size_t i = 0; ok && i < n; i++) {
        const run_info *r = &v[i];
        rundir_job oj;
        hearth_err e;
        ok = r->backend && strcmp(r->backend, "slurm") == 0 && r->backend_job_id &&
             r->backend_job_id[0] && strlen(r->backend_job_id) < BACKEND_JOB_ID_MAX &&
             r->run_dir && rundir_job_read(r->run_dir, &oj, &e) == 0;
        if (!ok)
            break;
        ok = r->attempts >= 1 + oj.retries;   /* no retry left that Slurm would not see */
        rundir_job_free(&oj);
        len += strlen(r->backend_job_id) + 1;
    }
    char *s = ok ? malloc(len) : NULL;
    if (s) {
        size_t off = (size_t)sprintf(s, "%s", job->after_any ? "afterany" : "afterok");
        for (size_t i = 0; i < n; i++)
            off += (size_t)sprintf(s + off, ":%s", v[i].backend_job_id);
    }
    runs_db_list_free(v, n);
    if (ok && !s)
        return herr_set(sw->err, HERR_NOMEM, "out of memory");
    *dep = s;
    return ok;
}

static int after_check(sweeper *sw, const rundir_job *job, char **dep, char *why,
                       size_t size)
{
    int64_t id;
    int rc = runs_db_experiment_find(sw->db, job->after_experiment, &id, sw->err);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        snprintf(why, size, "after: experiment %s is not in the database",
                 job->after_experiment);
        return AFTER_FAILED;
    }
    long c[RUN_STATE_COUNT];
    if ((rc = runs_db_state_counts(sw->db, job->after_experiment, c, sw->err)))
        return rc;
    if (sweep_in_flight(c) > 0) {
        rc = after_native(sw, job, c, dep);
        return rc < 0 ? rc : rc ? AFTER_DEPEND : AFTER_WAIT;
    }
    if (job->after_any)
        return AFTER_GO;
    long missing = 0, runs = 0;
    if ((rc = sweep_points_missing(sw->db, job->after_experiment, &missing, &runs, sw->err)))
        return rc;
    if (runs == 0 || missing > 0) {
        snprintf(why, size, "after: experiment %s did not end ok (%ld of its points have no "
                 "completed run)", job->after_experiment, runs ? missing : 0);
        return AFTER_FAILED;
    }
    return AFTER_GO;
}

/* ---- starting a run ----------------------------------------------------------------------- */

/* Launches one queued run: 0 (launched, or nothing to do for it), 1 (it must wait for
 * another experiment: keep it queued), or a negative herr_code. */
static int launch(sweeper *sw, const char *run_id)
{
    run_info ri;
    memset(&ri, 0, sizeof ri);
    int rc = runs_db_get(sw->db, run_id, &ri, sw->err);
    if (rc <= 0 || (ri.state != RUN_PENDING && ri.state != RUN_REQUEUED)) {
        run_info_free(&ri);
        return rc < 0 ? rc : 0;
    }
    flight *f = NULL;
    if ((rc = flight_new(&f, &ri, sw->err))) {
        run_info_free(&ri);
        return rc;
    }
    hearth_err jerr;
    if (!f->run_dir) {
        rc = fail_run(sw, run_id, "no run directory recorded");
        goto done;
    }
    if (rundir_job_read(f->run_dir, &f->job, &jerr)) {
        rc = fail_run(sw, run_id, jerr.msg);
        goto done;
    }
    if (f->job.after_experiment) {
        char why[512] = "";
        int a = after_check(sw, &f->job, &f->dependency, why, sizeof why);
        if (a < 0 || a == AFTER_WAIT) {
            rc = a < 0 ? a : 1;
            goto done;
        }
        if (a == AFTER_FAILED) {
            run_transition t = { .note = why };
            if ((rc = move(sw, run_id, RUN_CANCELLED, &t)) == 0) {
                count_end(sw, RUN_CANCELLED);
                say(sw, "%s cancelled: %s", run_id, why);
            }
            rc = rc < 0 ? rc : 0;
            goto done;
        }
    }
    if (ri.state == RUN_REQUEUED && ri.attempts >= 1 &&
        rundir_archive_attempt(f->run_dir, ri.attempts + 1,
                               (ri.has_exit_code && ri.exit_code == 75) ||
                                   rundir_has_checkpoint(f->run_dir), &jerr)) {
        rc = fail_run(sw, run_id, jerr.msg);
        goto done;
    }
    run_transition t = { .backend = sw->b->ops->name, .note = ri.attempts ? "retry" : NULL };
    if ((rc = move(sw, run_id, RUN_SUBMITTED, &t))) {
        rc = rc < 0 ? rc : 0;
        goto done;
    }
    if (sw->b->ops->submit_many) {
        /* Started with the others of this round by batch_submit. */
        if (sw->nbatch == sw->capbatch) {
            size_t cap = sw->capbatch ? 2 * sw->capbatch : 64;
            flight **g = realloc(sw->batch, cap * sizeof *g);
            if (!g) {
                rc = herr_set(sw->err, HERR_NOMEM, "out of memory");
                goto done;
            }
            sw->batch = g;
            sw->capbatch = cap;
        }
        sw->batch[sw->nbatch++] = f;
        f = NULL;
        rc = 0;
        goto done;
    }
    backend_job bj;
    backend_job_of(f, &bj);
    if (sw->b->ops->submit(sw->b, &bj, f, f->job_id, &jerr)) {
        rc = fail_run(sw, run_id, jerr.msg);
        goto done;
    }
    if ((rc = flights_add(sw, f))) {
        sw->b->ops->cancel(sw->b, &bj, f->job_id, NULL);
        goto done;
    }
    flight *started = f;
    f = NULL;   /* owned by the flight list now */
    run_transition tr = { .job_id = started->job_id };
    int m = move(sw, run_id, RUN_RUNNING, &tr);
    if (m == 1) /* cancelled while it was being started: stop it again */
        sw->b->ops->cancel(sw->b, &bj, started->job_id, NULL);
    rc = m < 0 ? m : 0;
done:
    flight_free(f);
    run_info_free(&ri);
    return rc;
}

/* Starts the runs launch() collected, with one submit_many: each started one is in flight
 * and running, the others failed with the backend's reason. */
static int batch_submit(sweeper *sw)
{
    size_t n = sw->nbatch;
    if (n == 0)
        return 0;
    backend_job *bj = calloc(n, sizeof *bj);
    void **tags = calloc(n, sizeof *tags);
    char (*ids)[BACKEND_JOB_ID_MAX] = calloc(n, sizeof *ids);
    int rc = 0;
    if (!bj || !tags || !ids)
        rc = herr_set(sw->err, HERR_NOMEM, "out of memory");
    size_t done = 0;
    hearth_err jerr = { { 0 } };
    if (!rc) {
        for (size_t i = 0; i < n; i++) {
            backend_job_of(sw->batch[i], &bj[i]);
            tags[i] = sw->batch[i];
        }
        if (sw->b->ops->submit_many(sw->b, bj, tags, n, ids, &done, &jerr) == 0)
            done = n;
    }
    for (size_t i = 0; i < n; i++) {
        flight *f = sw->batch[i];
        int r = 0;
        if (rc || i >= done) {
            r = fail_run(sw, f->run_id, rc ? sw->err->msg : jerr.msg);
            flight_free(f);
        } else {
            snprintf(f->job_id, sizeof f->job_id, "%s", ids[i]);
            if ((r = flights_add(sw, f))) {
                sw->b->ops->cancel(sw->b, &bj[i], f->job_id, NULL);
                flight_free(f);
            } else {
                run_transition tr = { .job_id = f->job_id };
                int m = move(sw, f->run_id, RUN_RUNNING, &tr);
                if (m == 1)   /* cancelled while it was being started: stop it again */
                    sw->b->ops->cancel(sw->b, &bj[i], f->job_id, NULL);
                r = m < 0 ? m : 0;
            }
        }
        if (r && !rc)
            rc = r;
    }
    sw->nbatch = 0;
    free(bj);
    free(tags);
    free(ids);
    return rc;
}

/* ---- reconciling what an earlier process left -------------------------------------------- */

static int reconcile_one(sweeper *sw, const run_info *ri)
{
    if (ri->backend && strcmp(ri->backend, sw->b->ops->name) != 0)
        return 0;   /* another backend's job */
    if (!ri->run_dir)
        return fail_run(sw, ri->run_id, "no run directory recorded");
    flight *f = NULL;
    hearth_err jerr;
    int rc = flight_new(&f, ri, sw->err);
    if (rc)
        return rc;
    if (rundir_job_read(f->run_dir, &f->job, &jerr)) {
        flight_free(f);
        return fail_run(sw, ri->run_id, jerr.msg);
    }
    backend_job bj;
    backend_job_of(f, &bj);
    int alive = sw->b->ops->track(sw->b, &bj, ri->backend_job_id, f, f->job_id, sw->err);
    if (alive < 0) {
        flight_free(f);
        return alive;
    }
    if (alive) {
        if ((rc = flights_add(sw, f))) {
            flight_free(f);
            return rc;
        }
        say(sw, "%s: its job (%s %s) is still running; waiting for it", ri->run_id,
            strcmp(sw->b->ops->name, "local") ? "job" : "pid", f->job_id);
        if (ri->state == RUN_SUBMITTED) {
            run_transition t = { .job_id = f->job_id };
            rc = move(sw, ri->run_id, RUN_RUNNING, &t);
        }
        return rc < 0 ? rc : 0;
    }
    /* It ended while no runner watched it: recorded from the exit_code its job script
     * wrote, or from the trainer's result.json when the script died before the trainer
     * ended (killed together with its runner). */
    backend_event ev;
    memset(&ev, 0, sizeof ev);
    ev.how = BACKEND_VANISHED;
    if (rundir_exit_code(f->run_dir, &ev.exit_code)) {
        ev.how = BACKEND_EXITED;
        ev.has_exit_code = 1;
    }
    ingest_summary sum;
    hearth_err ierr;
    int irc = ingest_run(sw->db, ri->run_id, ri->run_dir, &sum, &ierr);
    if (ev.how == BACKEND_EXITED || result_exit_code(&sum, irc ? &ierr : NULL) >= 0) {
        rc = record_end(sw, f, &ev, &sum, irc ? &ierr : NULL);
        flight_free(f);
        return rc;
    }
    /* Neither alive nor finished: its job died with the machine or was killed outright. */
    run_transition t = { .note = "job process vanished" };
    rc = move(sw, ri->run_id, RUN_FAILED, &t);
    if (rc == 0) {
        sw->res->vanished++;
        say(sw, "%s failed: job process vanished", ri->run_id);
        rc = replace_run(sw, ri->run_id, &f->job);
    }
    flight_free(f);
    return rc < 0 ? rc : 0;
}

static int reconcile(sweeper *sw)
{
    run_info *v = NULL;
    size_t n = 0;
    int rc = runs_db_list(sw->db, sw->o->experiment,
                          (1u << RUN_SUBMITTED) | (1u << RUN_RUNNING), &v, &n, sw->err);
    for (size_t i = 0; !rc && i < n; i++)
        rc = reconcile_one(sw, &v[i]);
    runs_db_list_free(v, n);
    return rc;
}

/* ---- the queue ---------------------------------------------------------------------------- */

static void queue_clear(sweeper *sw)
{
    for (size_t i = 0; i < sw->qn; i++)
        free(sw->queue[i]);
    free(sw->queue);
    sw->queue = NULL;
    sw->qn = sw->qi = 0;
}

static int queue_load(sweeper *sw)
{
    run_info *v = NULL;
    size_t n = 0;
    queue_clear(sw);
    int rc = runs_db_list(sw->db, sw->o->experiment,
                          (1u << RUN_PENDING) | (1u << RUN_REQUEUED), &v, &n, sw->err);
    if (!rc && n) {
        sw->queue = calloc(n, sizeof *sw->queue);
        if (!sw->queue)
            rc = herr_set(sw->err, HERR_NOMEM, "out of memory");
        for (size_t i = 0; !rc && i < n; i++) {
            if (!(sw->queue[i] = strdup(v[i].run_id)))
                rc = herr_set(sw->err, HERR_NOMEM, "out of memory");
            else
                sw->qn++;
        }
    }
    runs_db_list_free(v, n);
    sw->need_reload = 0;
    sw->last_reload = now_s();
    return rc;
}

/* Jobs at once: the option, else CPUs / cpus_per_task of the first queued run, capped by
 * its resources.max_concurrent. */
static void choose_limit(sweeper *sw)
{
    rundir_job j;
    int have = 0;
    for (size_t i = sw->qi; i < sw->qn && !have; i++) {
        run_info ri;
        memset(&ri, 0, sizeof ri);
        hearth_err e;
        if (runs_db_get(sw->db, sw->queue[i], &ri, &e) == 1 && ri.run_dir &&
            rundir_job_read(ri.run_dir, &j, &e) == 0)
            have = 1;
        run_info_free(&ri);
    }
    if (!have && sw->nfl) {
        have = rundir_job_copy(&j, &sw->fl[0]->job, NULL) == 0;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1)
        cpus = 1;
    int limit = sw->o->jobs;
    int queued = strcmp(sw->b->ops->name, "local") != 0;   /* a scheduler queues them */
    if (limit <= 0 && queued)
        limit = 1000000;
    if (limit <= 0)
        limit = (int)(cpus / (have && j.cpus_per_task > 0 ? j.cpus_per_task : 1));
    /* A backend that submits batches throttles them itself (Slurm: array %N). */
    if (have && j.max_concurrent > 0 && limit > j.max_concurrent && !sw->b->ops->submit_many)
        limit = j.max_concurrent;
    sw->limit = limit < 1 ? 1 : limit;
    if (have)
        rundir_job_free(&j);
}

int sweep_run(hearth_db *db, backend *b, const sweep_opts *o, sweep_result *res,
              hearth_err *err)
{
    sweeper sw;
    memset(&sw, 0, sizeof sw);
    memset(res, 0, sizeof *res);
    sw.db = db;
    sw.b = b;
    sw.o = o;
    progress_init(&sw.prog, o->progress, o->progress_tty, PROGRESS_PLAIN_INTERVAL_S);
    sw.res = res;
    sw.err = err;
    int rc = reconcile(&sw);
    if (!rc && o->once) {
        /* One look at the jobs reconcile found: ingest those that ended, leave the rest. */
        backend_event ev1[32];
        size_t n = 0;
        if (sw.nfl)
            rc = b->ops->poll(b, 0, ev1, sizeof ev1 / sizeof ev1[0], &n, err);
        for (size_t i = 0; i < n && !rc; i++) {
            flight *f = ev1[i].tag;
            flights_remove(&sw, f);
            rc = finish(&sw, f, &ev1[i]);
            flight_free(f);
        }
        for (size_t i = 0; i < sw.nfl; i++)
            flight_free(sw.fl[i]);
        free(sw.fl);
        free(sw.tmpl);
        return rc;
    }
    if (!rc)
        rc = queue_load(&sw);
    if (!rc)
        choose_limit(&sw);
    int stopping = 0, waiting_after = 0;
    backend_event ev[32];
    while (!rc) {
        /* Every write checks the file too (db.h), but a sweep whose jobs run for hours
         * writes nothing meanwhile: each tick notices a deleted database at once. */
        if ((rc = db_check_file(db, err)))
            break;
        if (o->stop && *o->stop && !stopping) {
            stopping = sw.stopping = 1;
            say(&sw, "stopping: interrupting %zu running job(s); pending runs stay pending; "
                "`hearth resume %s` continues them all", sw.nfl, o->experiment);
            for (size_t i = 0; i < sw.nfl; i++) {
                backend_job bj;
                backend_job_of(sw.fl[i], &bj);
                b->ops->cancel(b, &bj, sw.fl[i]->job_id, NULL);
            }
        }
        waiting_after = 0;
        while (!stopping && !rc && sw.nfl + sw.nbatch < (size_t)sw.limit) {
            if (sw.qi >= sw.qn && (sw.need_reload || now_s() - sw.last_reload >= 2.0)) {
                if ((rc = queue_load(&sw)))
                    break;
            }
            if (sw.qi >= sw.qn)
                break;
            int r = launch(&sw, sw.queue[sw.qi]);
            if (r < 0)
                rc = r;
            else if (r == 1) {
                waiting_after = 1;
                break;
            } else {
                sw.qi++;
            }
        }
        if (sw.nbatch) {
            int r = batch_submit(&sw);
            if (!rc)
                rc = r;
        }
        if (rc)
            break;
        show_progress(&sw);
        if (sw.nfl == 0) {
            if (stopping)
                break;
            if (!waiting_after) {
                if ((rc = queue_load(&sw)))
                    break;
                if (sw.qn == 0)
                    break;
                continue;
            }
        }
        size_t n = 0;
        if ((rc = b->ops->poll(b, waiting_after ? 500 : 200, ev, sizeof ev / sizeof ev[0],
                               &n, err)))
            break;
        for (size_t i = 0; i < n && !rc; i++) {
            flight *f = ev[i].tag;
            flights_remove(&sw, f);
            rc = finish(&sw, f, &ev[i]);
            flight_free(f);
        }
    }
    show_progress(&sw);
    progress_end(&sw.prog);
    long c[RUN_STATE_COUNT];
    hearth_err e2;
    if (runs_db_state_counts(db, o->experiment, c, &e2) == 0)
        res->pending = c[RUN_PENDING] + c[RUN_REQUEUED] - res->interrupted;
    if (res->pending < 0)
        res->pending = 0;
    res->total = res->completed + res->failed + res->timeout + res->cancelled + res->vanished +
                 res->interrupted;
    /* On an error, jobs still running are left alone: they keep their lock and a later
     * `hearth resume` takes them over. */
    for (size_t i = 0; i < sw.nfl; i++)
        flight_free(sw.fl[i]);
    free(sw.fl);
    for (size_t i = 0; i < sw.nbatch; i++)
        flight_free(sw.batch[i]);
    free(sw.batch);
    queue_clear(&sw);
    free(sw.tmpl);
    return rc;
}

int sweep_reopen_cancelled(hearth_db *db, const char *experiment, long *n, hearth_err *err)
{
    run_info *v = NULL;
    size_t nv = 0;
    long done = 0;
    int rc = runs_db_list(db, experiment, 1u << RUN_CANCELLED, &v, &nv, err);
    for (size_t i = 0; !rc && i < nv; i++) {
        run_transition t = { .note = SWEEP_NOTE_REOPENED };
        if (!(rc = runs_db_transition(db, v[i].run_id, RUN_REQUEUED, &t, err)))
            done++;
    }
    runs_db_list_free(v, nv);
    if (n)
        *n = done;
    return rc;
}

/* ---- where an experiment's runs live, and its runner lock --------------------------------- */

int sweep_experiment_dir(hearth_db *db, const char *experiment, const char *runs_dir,
                         char *buf, size_t size, hearth_err *err)
{
    /* The first run with a directory: reads one row, however large the experiment. */
    static const char sql[] =
        "SELECT r.run_dir FROM runs r JOIN experiments e ON e.id = r.experiment_id"
        " WHERE e.name = ?1 AND r.run_dir IS NOT NULL ORDER BY r.id LIMIT 1";
    sqlite3_stmt *st;
    int rc = db_prepare(db, sql, &st, err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, experiment, -1, SQLITE_TRANSIENT);
    int step = sqlite3_step(st), found = 0;
    if (step == SQLITE_ROW) {
        const char *dir = (const char *)sqlite3_column_text(st, 0);
        const char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash && slash != dir) {
            snprintf(buf, size, "%.*s", (int)(slash - dir), dir);
            found = 1;
        }
    }
    db_stmt_done(st);
    if (step != SQLITE_ROW && step != SQLITE_DONE)
        return db_fail(db, err, "finding the experiment's run directory");
    if (!found && (size_t)snprintf(buf, size, "%s/%s", runs_dir, experiment) >= size)
        return herr_set(err, HERR_IO, "%s/%s: path too long", runs_dir, experiment);
    return 0;
}

/* The runner's record in its lock file: "PID HOST\n".  *o->pid is 0 when the file says
 * nothing usable: a runner that has just created the file and not yet written it. */
static void read_owner(int fd, sweep_lock_owner *o)
{
    char buf[320];
    memset(o, 0, sizeof *o);
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return;
    buf[n] = 0;
    int pid = 0;
    char host[sizeof o->host];
    host[0] = 0;
    if (sscanf(buf, "%d %255s", &pid, host) < 1 || pid <= 0)
        return;
    o->pid = (pid_t)pid;
    snprintf(o->host, sizeof o->host, "%s", host);
}

/* Whether the recorded owner can be the process holding the lock.  A record of this host
 * whose pid is gone is stale: the lock is held by a process that records nothing (a
 * `hearth wait` or `hearth status` looking, which holds it for an instant), or by a runner
 * that has not written its record yet. */
static int owner_plausible(const sweep_lock_owner *o)
{
    if (o->pid <= 0)
        return 0;
    char me[sizeof o->host];
    if (o->host[0] && (gethostname(me, sizeof me) || strncmp(me, o->host, sizeof me) != 0))
        return 1;   /* another host's process: cannot be checked from here */
    return !(kill(o->pid, 0) && errno == ESRCH);
}

void sweep_lock_owner_format(const sweep_lock_owner *o, char *buf, size_t size)
{
    if (o->pid <= 0)
        snprintf(buf, size, "pid unknown");
    else if (o->host[0])
        snprintf(buf, size, "pid %d on %s", (int)o->pid, o->host);
    else
        snprintf(buf, size, "pid %d", (int)o->pid);
}

int sweep_lock_acquire(const char *exp_dir, int wait, FILE *msg, int *fd,
                       sweep_lock_owner *holder, hearth_err *err)
{
    char path[4200];
    int rc = rundir_mkdirs(exp_dir, err);
    if (!rc)
        rc = rundir_path(path, sizeof path, exp_dir, "runner.lock", err);
    if (rc)
        return rc;
    int lfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lfd < 0)
        return herr_set(err, HERR_IO, "%s: %s", path, strerror(errno));
    sweep_lock_owner said;   /* the holder last named on msg */
    memset(&said, 0, sizeof said);
    int tries = 0, said_unknown = 0;
    while (flock(lfd, LOCK_EX | LOCK_NB)) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            int e = errno;
            close(lfd);
            return herr_set(err, HERR_IO, "%s: flock: %s", path, strerror(e));
        }
        sweep_lock_owner other;
        read_owner(lfd, &other);
        int known = owner_plausible(&other);
        if (!known)
            other.pid = 0;
        /* Without `wait` the holder is asked for again while its record is not there yet
         * (it is written right after the lock is taken): about a second at most. */
        if (!wait && (known || ++tries > 50)) {
            if (holder)
                *holder = other;
            close(lfd);
            return 1;
        }
        if (holder)
            *holder = other;
        /* Said when the holder is known and another than last said; a holder that never
         * records itself (not a hearth runner) is said once, after a few seconds. */
        if (wait && msg && known && (other.pid != said.pid || strcmp(other.host, said.host))) {
            char who[320];
            sweep_lock_owner_format(&other, who, sizeof who);
            fprintf(msg, "hearth: another runner (%s) is working on this experiment; "
                    "waiting for it to finish\n", who);
            fflush(msg);
            said = other;
        } else if (wait && msg && !known && !said.pid && !said_unknown && ++tries > 25) {
            fprintf(msg, "hearth: another process holds %s (it recorded no pid); waiting "
                    "for it to let go\n", path);
            fflush(msg);
            said_unknown = 1;
        }
        struct timespec ts = { 0, (wait ? 200 : 20) * 1000000L };
        nanosleep(&ts, NULL);
    }
    /* Written over the old record, then cut to length: the file is never empty in
     * between, so that a runner asking who holds the lock never reads nothing. */
    char host[256] = "";
    if (gethostname(host, sizeof host) || strpbrk(host, " \n"))
        host[0] = 0;
    host[sizeof host - 1] = 0;
    char line[320];
    int len = snprintf(line, sizeof line, "%d%s%s\n", (int)getpid(), host[0] ? " " : "", host);
    if (pwrite(lfd, line, (size_t)len, 0) != len || ftruncate(lfd, len)) {
        /* the record is only informational */
    }
    *fd = lfd;
    return 0;
}

void sweep_lock_release(int fd)
{
    if (fd >= 0)
        close(fd);
}

int sweep_lock_held(const char *exp_dir, sweep_lock_owner *owner)
{
    char path[4200];
    if (rundir_path(path, sizeof path, exp_dir, "runner.lock", NULL))
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int held = 0;
    if (flock(fd, LOCK_SH | LOCK_NB)) {
        held = errno == EWOULDBLOCK;
        if (held && owner) {
            read_owner(fd, owner);
            if (!owner_plausible(owner))
                owner->pid = 0;
        }
    } else {
        flock(fd, LOCK_UN);
    }
    close(fd);
    return held;
}
