/* bench_run.c - `hearth-train --bench-layers` as one job of a backend.  See bench_run.h. */
#include "bench_run.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "sweep.h"
#include "trainer_caps.h"

/* How long the job may take to end once cancelled (--timeout) before hearth stops waiting
 * for the backend to say so. */
#define CANCEL_WAIT_S 120.0

/* The trainer says what it can do in its --help; do not pretend it benchmarks.  The help
 * goes to DIR/help.txt. */
static int check_trainer(const char *trainer, const char *dir, hearth_err *err)
{
    char log[4200];
    if (access(trainer, X_OK))
        return herr_set(err, HERR_CONFIG, "%s: not an executable file", trainer);
    int rc = rundir_path(log, sizeof log, dir, "help.txt", err);
    if (rc)
        return rc;
    char *argv[] = { (char *)trainer, "--help", NULL };
    trainer_run_wait(argv, log);
    FILE *f = fopen(log, "re");
    char line[512];
    int has_flag = 0;
    while (f && fgets(line, sizeof line, f))
        has_flag |= strstr(line, "--bench-layers") != NULL;
    if (f)
        fclose(f);
    if (has_flag)
        return 0;
    return herr_set(err, HERR_CONFIG, "%s has no --bench-layers mode (this trainer cannot "
                    "benchmark layers yet): measure them elsewhere and record the "
                    "layer_bench.json with `hearth bench ingest FILE`", trainer);
}

/* A new directory RUNS_DIR/bench-layers/NAME-TIME (then -TIME.2, ...: two benchmarks in
 * one second never share one); its last component, the job's name, in id. */
static int make_dir(const bench_run_opts *o, char *dir, size_t size, char *id, size_t id_size,
                    hearth_err *err)
{
    char parent[4200], name[128];
    size_t n = 0;
    /* The model may be a preset's path: keep the name one path component of safe bytes. */
    for (const char *p = o->name; *p && n + 1 < 100; p++)
        name[n++] = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
                           *p) ? *p : '_';
    name[n] = 0;
    if ((size_t)snprintf(parent, sizeof parent, "%s/bench-layers", o->runs_dir) >= sizeof parent)
        return herr_set(err, HERR_IO, "%s/bench-layers: path too long", o->runs_dir);
    int rc = rundir_mkdirs(parent, err);
    long now = (long)time(NULL);
    for (int k = 1; !rc && k < 1000; k++) {
        char base[200];
        if (k == 1)
            snprintf(base, sizeof base, "%s-%ld", name, now);
        else
            snprintf(base, sizeof base, "%s-%ld.%d", name, now, k);
        if ((size_t)snprintf(dir, size, "%s/%s", parent, base) >= size)
            return herr_set(err, HERR_IO, "%s/%s: path too long", parent, base);
        if (mkdir(dir, 0755) == 0) {
            snprintf(id, id_size, "bench-layers-%s", base);
            return 0;
        }
        if (errno != EEXIST)
            return herr_set(err, HERR_IO, "%s: %s", dir, strerror(errno));
    }
    return rc ? rc : herr_set(err, HERR_IO, "%s: no free directory name", parent);
}

/* The first line of RUN_DIR/NAME without its newline into buf ("" when there is none). */
static void read_line(const char *dir, const char *name, char *buf, size_t size)
{
    char path[4200];
    buf[0] = 0;
    if (rundir_path(path, sizeof path, dir, name, NULL))
        return;
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    if (!fgets(buf, (int)size, f))
        buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
}

/* The last non-empty line of RUN_DIR/stderr.log (the trainer's reason, as a rule). */
static void last_log_line(const char *dir, char *buf, size_t size)
{
    char path[4200], line[512];
    buf[0] = 0;
    if (rundir_path(path, sizeof path, dir, "stderr.log", NULL))
        return;
    FILE *f = fopen(path, "re");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0])
            snprintf(buf, size, "%s", line);
    }
    if (f)
        fclose(f);
}

/* Why hearth cancelled the job (wait_job's *gave_up). */
enum { KEPT = 0, TIMED_OUT = 1, INTERRUPTED = 2 };

/* How a job that did not end with exit 0 ended, for the error. */
static void describe_end(const backend_event *ev, int gave_up, long timeout_s, char *buf,
                         size_t size)
{
    switch (ev->how) {
    case BACKEND_EXITED:
        if (ev->has_exit_code)
            snprintf(buf, size, "failed with exit code %d", ev->exit_code);
        else
            snprintf(buf, size, "ended without an exit code");
        return;
    case BACKEND_TIMEOUT:
        snprintf(buf, size, "reached its wall-time limit");
        return;
    case BACKEND_CANCELLED:
        if (gave_up == INTERRUPTED)
            snprintf(buf, size, "was cancelled: hearth was interrupted");
        else if (gave_up)
            snprintf(buf, size, "did not end within --timeout %lds and was cancelled",
                     timeout_s);
        else
            snprintf(buf, size, "was cancelled");
        return;
    case BACKEND_VANISHED:
        snprintf(buf, size, "vanished without an exit code (killed, or its node was lost)");
        return;
    case BACKEND_REQUEUE:
        snprintf(buf, size, "was ended by the scheduler (node failure or preemption)");
        return;
    }
    snprintf(buf, size, "ended");
}

/* Waits for the one tracked job: a line when it starts on a node (the sbatch job script
 * writes RUN_DIR/nodes as it starts), cancelled once timeout_s has passed or *o->stop is
 * set (*gave_up says which).  Fills *ev. */
static int wait_job(backend *b, const bench_run_opts *o, const backend_job *bj,
                    const char *job_id, backend_event *ev, int *gave_up, hearth_err *err)
{
    double start = backend_clock_s(), cancelled_at = 0;
    int running = 0;
    *gave_up = KEPT;
    for (;;) {
        size_t n = 0;
        int rc = b->ops->poll(b, 1000, ev, 1, &n, err);
        if (rc)
            return rc;
        if (n)
            return 0;
        char nodes[256];
        if (!running && (read_line(bj->run_dir, "nodes", nodes, sizeof nodes), nodes[0])) {
            running = 1;
            fprintf(o->progress, "hearth: bench layers: job %s running on %s\n", job_id, nodes);
            fflush(o->progress);
        }
        double now = backend_clock_s();
        int timed_out = o->timeout_s > 0 && now - start >= (double)o->timeout_s;
        if (!*gave_up && (timed_out || (o->stop && *o->stop))) {
            if (timed_out)
                fprintf(o->progress, "hearth: bench layers: job %s still running after %lds: "
                        "cancelling it\n", job_id, o->timeout_s);
            else
                fprintf(o->progress, "hearth: bench layers: interrupted: cancelling job %s\n",
                        job_id);
            fflush(o->progress);
            *gave_up = timed_out ? TIMED_OUT : INTERRUPTED;
            cancelled_at = now;
            if ((rc = b->ops->cancel(b, bj, job_id, err)) < 0)
                return herr_prefix(err, rc, "cancelling job %s", job_id);
        }
        if (*gave_up && now - cancelled_at > CANCEL_WAIT_S)
            return herr_set(err, HERR_RUNTIME, "job %s was cancelled (%s), and %.0fs later "
                            "the %s backend still reports it alive", job_id,
                            *gave_up == INTERRUPTED ? "hearth was interrupted" : "--timeout",
                            CANCEL_WAIT_S, b->ops->name);
    }
}

int bench_run_job(const bench_run_opts *o, char *dir, size_t size, hearth_err *err)
{
    char id[256], script[4200], tmpl_name[4096];
    char *tmpl = NULL;
    const char *bname = o->backend ? o->backend : "local";
    backend *b = NULL;
    /* an unknown backend (or slurmrest without its URL) before anything is written */
    int rc = backend_open(bname, &b, err);
    if (!rc)
        rc = make_dir(o, dir, size, id, sizeof id, err);
    if (rc) {
        backend_free(b);
        return rc;
    }
    if ((rc = check_trainer(o->job->trainer, dir, err))) {
        hearth_err e;
        rundir_remove_tree(dir, &e);   /* nothing ran: leave no directory behind */
        backend_free(b);
        return rc;
    }
    rundir_job j = *o->job;
    j.run_id = id;
    j.experiment = "bench-layers";
    j.backend = (char *)bname;
    j.bench_layers = 1;
    j.retries = 0;
    j.repeat = 1;
    j.max_concurrent = 0;
    j.pack = 1;
    j.after_experiment = NULL;
    if (!(rc = sweep_load_template(bname, tmpl_name, sizeof tmpl_name, &tmpl, err)) &&
        !(rc = rundir_write(dir, &j, o->config_json, tmpl_name, tmpl, err)))
        rc = rundir_path(script, sizeof script, dir, "job.sh", err);
    free(tmpl);
    if (rc) {
        backend_free(b);
        return rc;
    }
    backend_job bj = { .run_id = id, .run_dir = dir, .script = script,
                       .cpus_per_task = j.cpus_per_task, .time_limit_s = j.time_limit_s };
    char job_id[BACKEND_JOB_ID_MAX] = "";
    if ((rc = b->ops->submit(b, &bj, NULL, job_id, err))) {
        backend_free(b);
        return herr_prefix(err, rc, "bench layers: submitting %s through the %s backend",
                           script, bname);
    }
    fprintf(o->progress, "hearth: bench layers: job %s submitted (%s backend; %s)\n", job_id,
            bname, dir);
    fflush(o->progress);
    double start = backend_clock_s();
    backend_event ev;
    int gave_up = 0;
    rc = wait_job(b, o, &bj, job_id, &ev, &gave_up, err);
    backend_free(b);
    if (rc)
        return herr_prefix(err, rc, "bench layers: waiting for job %s (%s backend; its log: "
                           "%s/stderr.log)", job_id, bname, dir);
    if (ev.how == BACKEND_EXITED && ev.has_exit_code && ev.exit_code == 0) {
        fprintf(o->progress, "hearth: bench layers: job %s ended with exit code 0 after %.0fs\n",
                job_id, backend_clock_s() - start);
        fflush(o->progress);
        return 0;
    }
    char how[160], last[512];
    describe_end(&ev, gave_up, o->timeout_s, how, sizeof how);
    last_log_line(dir, last, sizeof last);
    return herr_set(err, HERR_RUNTIME, "bench layers: job %s (%s backend) %s; nothing was "
                    "recorded; its log: %s/stderr.log%s%s", job_id, bname, how, dir,
                    last[0] ? ", which ends: " : "", last);
}
