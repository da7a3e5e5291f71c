/* cmd_experiment.c - experiments as things a user manages: `hearth rm`, `archive`,
 * `unarchive`, `tag`, `untag`.  (`hearth status` lists them: cmd_status.c.) */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"
#include "rundir.h"
#include "runs_db.h"
#include "sweep.h"

/* Every experiment named on the command line must exist before anything changes, so that
 * a misspelt name in a list does not leave the list half done (exit 2). */
static int need_experiments(hcli_ctx *c, hearth_db *db, int n, hearth_err *err)
{
    for (int i = 0; i < n; i++) {
        int rc = runs_db_experiment_find(db, c->argv[i], NULL, err);
        if (rc == 0)
            return herr_set(err, HERR_CONFIG, "no experiment named '%s' in %s", c->argv[i],
                            c->db_path);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- rm ---------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    char exp_dir[PATH_MAX];    /* where its run directories are (sweep_experiment_dir) */
    int have_dir;              /* exp_dir exists */
    int lock;                  /* its runner lock, held while removing; -1: none */
    char trash[PATH_MAX + 64]; /* --delete-runs: exp_dir renamed here until the database
                                  removal commits; "" when nothing was moved */
    long inside, outside;      /* runs whose directory is / is not under exp_dir */
    experiment_removed removed;
} rm_job;

/* A live runner is never overridden, --force or not: it would go on starting runs of an
 * experiment that no longer exists.  Holding the lock ourselves also keeps a runner from
 * starting while the experiment is being removed. */
static int rm_lock(rm_job *j, hearth_err *err)
{
    struct stat st;
    j->have_dir = stat(j->exp_dir, &st) == 0 && S_ISDIR(st.st_mode);
    if (!j->have_dir)
        return 0;   /* no directory: no runner ever started, and none holds a lock */
    sweep_lock_owner holder;
    memset(&holder, 0, sizeof holder);
    int rc = sweep_lock_acquire(j->exp_dir, 0, NULL, &j->lock, &holder, err);
    if (rc == 1) {
        char who[320];
        sweep_lock_owner_format(&holder, who, sizeof who);
        return herr_set(err, HERR_RUNTIME, "a runner (%s) is working on %s; stop it first "
                        "(`hearth cancel %s` cancels its runs, and the runner ends with them)",
                        who, j->name, j->name);
    }
    return rc;
}

/* Runs whose job is alive (submitted or running) are refused unless --force, which cancels
 * them as `hearth cancel` does; pending runs are only rows and go with the experiment. */
static int rm_live_runs(hearth_db *db, rm_job *j, int force, hearth_err *err)
{
    run_info *v = NULL;
    size_t n = 0;
    backend *bk = NULL;
    int rc = runs_db_list(db, j->name, (1u << RUN_SUBMITTED) | (1u << RUN_RUNNING), &v, &n,
                          err);
    if (!rc && n && !force)
        rc = herr_set(err, HERR_RUNTIME, "%s has %zu run%s submitted or running, with live "
                      "jobs: `hearth cancel %s` first, or `hearth rm --force %s` cancels them",
                      j->name, n, n == 1 ? "" : "s", j->name, j->name);
    for (size_t i = 0; !rc && i < n; i++)
        rc = cmd_cancel_run(db, &v[i], &bk, err);
    backend_free(bk);
    runs_db_list_free(v, n);
    return rc;
}

/* How many runs have their directory in exp_dir, and how many elsewhere (ingested from
 * another place): those are never deleted, only named. */
static int rm_count_dirs(hearth_db *db, rm_job *j, hearth_err *err)
{
    run_info *v = NULL;
    size_t n = 0, len = strlen(j->exp_dir);
    int rc = runs_db_list(db, j->name, 0, &v, &n, err);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!v[i].run_dir)
            continue;
        if (strncmp(v[i].run_dir, j->exp_dir, len) == 0 && v[i].run_dir[len] == '/')
            j->inside++;
        else
            j->outside++;
    }
    runs_db_list_free(v, n);
    return rc;
}

/* --delete-runs, before the database changes: the experiment's directory is renamed to a
 * hidden sibling (one atomic step, and `hearth ingest` skips hidden names), so that a
 * failed database removal can put it back whole. */
static int rm_set_aside(rm_job *j, hearth_err *err)
{
    /* A directory holding none of its runs is not known to be this experiment's (another
     * database's experiment of the same name may use it): left alone. */
    if (!j->have_dir || !j->inside)
        return 0;
    const char *slash = strrchr(j->exp_dir, '/');
    if (!slash || strcmp(slash + 1, j->name) != 0)
        return herr_set(err, HERR_RUNTIME, "%s: its run directories are not in a directory "
                        "named after the experiment; remove them yourself (nothing was "
                        "removed)", j->exp_dir);
    snprintf(j->trash, sizeof j->trash, "%.*s/.%s.removing.%ld", (int)(slash - j->exp_dir),
             j->exp_dir, j->name, (long)getpid());
    if (rename(j->exp_dir, j->trash)) {
        int e = errno;
        j->trash[0] = 0;
        return herr_set(err, HERR_IO, "%s: %s (nothing was removed)", j->exp_dir,
                        strerror(e));
    }
    return 0;
}

static int rm_one(hcli_ctx *c, hearth_db *db, rm_job *j, hearth_err *err)
{
    int force = hcli_flag(c, "force"), delete_runs = hcli_flag(c, "delete-runs");
    char runs_dir[PATH_MAX];
    int rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, err);
    if (!rc)
        rc = sweep_experiment_dir(db, j->name, runs_dir, j->exp_dir, sizeof j->exp_dir, err);
    if (!rc)
        rc = rm_lock(j, err);
    if (!rc)
        rc = rm_live_runs(db, j, force, err);
    if (!rc)
        rc = rm_count_dirs(db, j, err);
    if (!rc && delete_runs)
        rc = rm_set_aside(j, err);
    if (!rc && (rc = runs_db_experiment_remove(db, j->name, &j->removed, err)) && j->trash[0] &&
        rename(j->trash, j->exp_dir))
        herr_prefix(err, rc, "%s could not be moved back from %s (%s)", j->exp_dir, j->trash,
                    strerror(errno));
    if (!rc && j->trash[0] && (rc = rundir_remove_tree(j->trash, err)))
        herr_prefix(err, rc, "%s was removed from the database, but deleting its run "
                    "directories stopped; what is left is in %s", j->name, j->trash);
    sweep_lock_release(j->lock);
    j->lock = -1;
    return rc;
}

static void rm_report(const rm_job *j, int delete_runs)
{
    printf("removed %s: %ld run%s", j->name, j->removed.runs, j->removed.runs == 1 ? "" : "s");
    if (j->removed.decisions)
        printf(", %ld decision%s", j->removed.decisions, j->removed.decisions == 1 ? "" : "s");
    if (!j->have_dir || !j->inside)
        printf("\n");
    else if (delete_runs)
        printf("; deleted %s\n", j->exp_dir);
    else
        printf("; its run directories stay in %s (`hearth ingest %s` records them again)\n",
               j->exp_dir, j->exp_dir);
    if (j->outside)
        printf("%s: %ld run director%s outside %s left in place\n", j->name, j->outside,
               j->outside == 1 ? "y" : "ies", j->exp_dir);
}

int cmd_rm(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    int rc = need_experiments(c, db, c->argc, &err);
    for (int i = 0; !rc && i < c->argc; i++) {
        rm_job j;
        memset(&j, 0, sizeof j);
        j.name = c->argv[i];
        j.lock = -1;
        if (!(rc = rm_one(c, db, &j, &err)))
            rm_report(&j, hcli_flag(c, "delete-runs"));
        fflush(stdout);
    }
    db_close(db);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}

/* ---- archive, unarchive, tag, untag ---------------------------------------------------- */

/* Changes of several experiments or tags are one transaction: all or none. */
static int archive_all(hcli_ctx *c, int archived)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    int *changed = calloc((size_t)c->argc, sizeof *changed);
    int rc = changed ? need_experiments(c, db, c->argc, &err)
                     : herr_set(&err, HERR_NOMEM, "out of memory");
    if (!rc && !(rc = db_tx_begin(db, &err))) {
        for (int i = 0; !rc && i < c->argc; i++)
            rc = runs_db_experiment_archive(db, c->argv[i], archived, &changed[i], &err);
        rc = db_tx_end(db, rc, &err);
    }
    for (int i = 0; !rc && i < c->argc; i++)
        printf("%s: %s%s\n", c->argv[i], changed[i] ? "" : "already ",
               archived ? "archived" : "not archived");
    free(changed);
    db_close(db);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}

int cmd_archive(hcli_ctx *c)
{
    return archive_all(c, 1);
}

int cmd_unarchive(hcli_ctx *c)
{
    return archive_all(c, 0);
}

static int tag_all(hcli_ctx *c, int add)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    const char *exp = c->argv[0];
    int rc = 0;
    for (int i = 1; !rc && i < c->argc; i++)
        rc = runs_db_tag_check(c->argv[i], &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    int *changed = calloc((size_t)c->argc, sizeof *changed);
    rc = changed ? need_experiments(c, db, 1, &err) : herr_set(&err, HERR_NOMEM, "out of memory");
    if (!rc && !(rc = db_tx_begin(db, &err))) {
        for (int i = 1; !rc && i < c->argc; i++)
            rc = runs_db_experiment_tag(db, exp, c->argv[i], add, &changed[i], &err);
        rc = db_tx_end(db, rc, &err);
    }
    for (int i = 1; !rc && i < c->argc; i++)
        printf("%s: %s%s %s\n", exp, changed[i] ? "" : add ? "already " : "not ",
               add ? "tagged" : changed[i] ? "untagged" : "tagged", c->argv[i]);
    free(changed);
    db_close(db);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}

int cmd_tag(hcli_ctx *c)
{
    return tag_all(c, 1);
}

int cmd_untag(hcli_ctx *c)
{
    return tag_all(c, 0);
}
