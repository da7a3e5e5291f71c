/* rebuild.c - runs recorded again from their run directories.  See rebuild.h. */
#include "rebuild.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ingest.h"
#include "rundir.h"
#include "runs_db.h"

static int exists(const char *dir, const char *name)
{
    char p[PATH_MAX + 64];
    struct stat st;
    return (size_t)snprintf(p, sizeof p, "%s/%s", dir, name) < sizeof p && stat(p, &st) == 0;
}

/* The N of "<experiment>-N", or -1 when run_id is not that. */
static long seq_of(const char *run_id, const char *experiment)
{
    size_t n = strlen(experiment);
    if (strncmp(run_id, experiment, n) != 0 || run_id[n] != '-' || !run_id[n + 1])
        return -1;
    char *end;
    errno = 0;
    long v = strtol(run_id + n + 1, &end, 10);
    return *end || errno || v < 1 || run_id[n + 1] == '+' ? -1 : v;
}

void rebuild_dirs_free(rebuild_dirs *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->v[i].dir);
        free(d->v[i].experiment);
    }
    free(d->v);
    memset(d, 0, sizeof *d);
}

/* Adds run directory `dir` (job.json read for its experiment and number), once.  A layer
 * benchmark's directory (rundir.h) is no run: passed over (returns 1) when found by a
 * scan, an error when named. */
static int add_dir(rebuild_dirs *d, size_t *cap, const char *dir, int named, hearth_err *err)
{
    char *abs = realpath(dir, NULL);
    if (!abs)
        return herr_set(err, HERR_IO, "%s: %s", dir, strerror(errno));
    for (size_t i = 0; i < d->n; i++)
        if (strcmp(d->v[i].dir, abs) == 0) {
            free(abs);
            return 0;
        }
    rundir_job j;
    int rc = rundir_job_read(abs, &j, err);
    if (rc) {
        free(abs);
        return rc;
    }
    if (j.bench_layers) {
        rundir_job_free(&j);
        free(abs);
        if (!named)
            return 1;
        return herr_set(err, HERR_CONFIG, "%s: a layer benchmark's directory, not a run's: "
                        "`hearth bench ingest %s/layer_bench.json` records its file", dir, dir);
    }
    long seq = seq_of(j.run_id, j.experiment);
    if (seq < 0)
        rc = herr_set(err, HERR_CONFIG, "%s/job.json: run_id %s is not <experiment>-<number> "
                      "of experiment %s", abs, j.run_id, j.experiment);
    if (!rc && d->n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        rebuild_dir *v = realloc(d->v, c * sizeof *v);
        if (!v)
            rc = herr_set(err, HERR_NOMEM, "out of memory");
        else {
            d->v = v;
            *cap = c;
        }
    }
    if (rc) {
        rundir_job_free(&j);
        free(abs);
        return rc;
    }
    d->v[d->n].dir = abs;
    d->v[d->n].experiment = j.experiment;   /* taken over from j */
    d->v[d->n].seq = seq;
    j.experiment = NULL;
    d->n++;
    rundir_job_free(&j);
    return 0;
}

/* The subdirectories of `dir` that hold job.json (depth 1), or, when `deeper`, those of
 * its subdirectories (depth 2).  Returns how many were added, or an error. */
static long scan(rebuild_dirs *d, size_t *cap, const char *dir, int deeper, hearth_err *err)
{
    DIR *dp = opendir(dir);
    if (!dp)
        return herr_set(err, HERR_IO, "%s: %s", dir, strerror(errno));
    long found = 0;
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(dp))) {
        if (e->d_name[0] == '.')
            continue;
        char sub[PATH_MAX];
        struct stat st;
        if ((size_t)snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name) >= sizeof sub ||
            stat(sub, &st) || !S_ISDIR(st.st_mode))
            continue;
        if (exists(sub, "job.json")) {
            if ((rc = add_dir(d, cap, sub, 0, err)) == 0)
                found++;
            rc = rc > 0 ? 0 : rc;
        } else if (deeper) {
            long n = scan(d, cap, sub, 0, err);
            if (n < 0)
                rc = (int)n;
            else
                found += n;
        }
    }
    closedir(dp);
    return rc ? rc : found;
}

/* By experiment and run number, so that runs get their rows (and ids) in run order, as
 * `submit` gave them. */
static int by_run(const void *a, const void *b)
{
    const rebuild_dir *x = a, *y = b;
    int c = strcmp(x->experiment, y->experiment);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

int rebuild_find(const char *const *paths, size_t n_paths, rebuild_dirs *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < n_paths; i++) {
        struct stat st;
        if (stat(paths[i], &st)) {
            rc = herr_set(err, HERR_CONFIG, "%s: %s", paths[i], strerror(errno));
        } else if (!S_ISDIR(st.st_mode)) {
            rc = herr_set(err, HERR_CONFIG, "%s: not a directory", paths[i]);
        } else if (exists(paths[i], "job.json")) {
            rc = add_dir(out, &cap, paths[i], 1, err);
        } else {
            long n = scan(out, &cap, paths[i], 1, err);
            if (n == 0)
                rc = herr_set(err, HERR_CONFIG, "%s: no run directories (folders holding "
                              "job.json) in it or in its subfolders", paths[i]);
            else if (n < 0)
                rc = (int)n;
        }
    }
    if (rc)
        rebuild_dirs_free(out);
    else if (out->n > 1)
        qsort(out->v, out->n, sizeof *out->v, by_run);
    return rc;
}

/* The highest N of RUN_DIR/attempt-N/: the attempts before the current one. */
static int earlier_attempts(const char *run_dir)
{
    DIR *dp = opendir(run_dir);
    if (!dp)
        return 0;
    int most = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        int n = 0;
        char tail;
        if (sscanf(e->d_name, "attempt-%d%c", &n, &tail) == 1 && n > most)
            most = n;
    }
    closedir(dp);
    return most;
}

/* Whether the run's current attempt got as far as its job starting: the job script or
 * the trainer wrote something. */
static int started(const char *run_dir)
{
    static const char *const marks[] = { "exit_code", "result.json", "metrics.jsonl",
                                         "stdout.log", "job.lock" };
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
        if (exists(run_dir, marks[i]))
            return 1;
    return 0;
}

/* The run as the database has it: 1 with its hash (malloc'd), 0 when absent. */
static int known_hash(hearth_db *db, const char *run_id, char **hash, hearth_err *err)
{
    static const char sql[] = "SELECT config_hash FROM runs WHERE run_id = ?1";
    sqlite3_stmt *st;
    int rc = db_row_text(db, sql, run_id, &st, "reading a run", err);
    if (rc == 1) {
        const unsigned char *h = sqlite3_column_text(st, 0);
        *hash = strdup(h ? (const char *)h : "");
        db_stmt_done(st);
        if (!*hash)
            return herr_set(err, HERR_NOMEM, "out of memory");
    }
    return rc;
}

int rebuild_run(hearth_db *db, const char *run_dir, rebuild_run_info *info, hearth_err *err)
{
    rebuild_run_info tmp;
    if (!info)
        info = &tmp;
    memset(info, 0, sizeof *info);
    rundir_job j;
    char *json = NULL, *hash = NULL;
    int rc = rundir_job_read(run_dir, &j, err);
    if (rc)
        return rc;
    long seq = seq_of(j.run_id, j.experiment);
    if (seq < 0) {
        rc = herr_set(err, HERR_CONFIG, "%s/job.json: run_id %s is not <experiment>-<number> "
                      "of experiment %s", run_dir, j.run_id, j.experiment);
        goto out;
    }
    if ((rc = known_hash(db, j.run_id, &hash, err)) < 0)
        goto out;
    if (rc == 1) {
        rc = 0;
        info->outcome = REBUILD_KNOWN;
        if (strcmp(hash, j.config_hash) != 0)
            rc = herr_set(err, HERR_CONFIG, "%s: run %s is recorded in %s with config hash "
                          "%.12s, but its run directory has %.12s; the recorded run is left "
                          "as it is", run_dir, j.run_id, db_path(db), hash, j.config_hash);
        goto out;
    }
    if ((rc = rundir_config_read(run_dir, j.config_hash, &json, err)))
        goto out;
    int before = earlier_attempts(run_dir), now = started(run_dir);
    char note[PATH_MAX + 64];
    snprintf(note, sizeof note, "recorded again from %s (hearth ingest)", run_dir);
    run_restore r = { 0 };
    r.experiment = j.experiment;
    r.run_id = j.run_id;
    r.seq = seq;
    r.config_json = json;
    r.config_hash = j.config_hash;
    r.run_dir = run_dir;
    r.state = now ? RUN_RUNNING : before ? RUN_REQUEUED : RUN_PENDING;
    r.attempts = before + now;
    r.backend = r.attempts ? j.backend : NULL;
    r.note = note;
    if ((rc = runs_db_restore(db, &r, err)))
        goto out;
    info->outcome = REBUILD_RECORDED;
    info->state = r.state;
    if (now) {
        /* The results come back at once; how the run ended is the reconcile's to say
         * (rebuild.h), from these same files. */
        ingest_summary sum;
        if (ingest_run(db, j.run_id, run_dir, &sum, &info->ingest_err) == 0) {
            info->metric_rows = sum.metric_rows;
            info->has_result = sum.has_result;
        } else if (db_file_lost(db)) {
            rc = herr_set(err, HERR_IO, "%s", info->ingest_err.msg);
        } else {
            info->ingest_failed = 1;
        }
    }
out:
    free(json);
    free(hash);
    rundir_job_free(&j);
    return rc;
}
