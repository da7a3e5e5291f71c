/* cmd_submit.c - `hearth submit SPEC`: record the experiment, create the runs its plan
 * keeps, and run them (sweep.h), in the foreground or in a detached runner.  Also the
 * runner part shared with `hearth resume`. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "cmd.h"
#include "plan.h"
#include "runs_db.h"
#include "select_auto.h"
#include "spec.h"
#include "stop_signal.h"
#include "sweep.h"
#include "trainer_caps.h"

/* The runner: lock, sweep, summary.  `ready` (or -1) gets one byte once the lock is taken
 * or waited for, so that a detaching parent returns only when `hearth wait` can see the
 * runner. */
static int runner(hcli_ctx *c, const cmd_run_opts *ro, int ready)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    backend *b = NULL;
    int lock = -1;
    int rc = sweep_lock_acquire(ro->exp_dir, 0, NULL, &lock, NULL, &err);
    if (rc == 1) {
        if (ready >= 0) {
            if (write(ready, "w", 1) < 0) {
                /* the parent stops waiting when the pipe closes */
            }
            close(ready);
            ready = -1;
        }
        rc = sweep_lock_acquire(ro->exp_dir, 1, stderr, &lock, NULL, &err);
    }
    if (ready >= 0) {
        if (write(ready, "r", 1) < 0) {
            /* see above */
        }
        close(ready);
    }
    if (rc)
        return hcli_fail(c, rc, &err);
    volatile sig_atomic_t *stop_requested = stop_signal_catch();
    /* submit (or resume) found the database a moment ago: a file missing now was deleted,
     * and opening would make an empty one that knows no runs. */
    int lost = access(c->db_path, F_OK) != 0;
    if (lost)
        rc = herr_set(&err, HERR_IO, "%s: the results database was deleted before the sweep "
                      "started", c->db_path);
    else
        rc = db_open(c->db_path, &db, &err);
    if (!rc)
        rc = backend_open(ro->backend, &b, &err);
    sweep_result res;
    memset(&res, 0, sizeof res);
    if (!rc) {
        sweep_opts so = { 0 };
        so.experiment = ro->experiment;
        so.jobs = (int)ro->jobs;
        so.progress = stderr;
        so.progress_tty = !ro->detached && isatty(2);
        so.stop = stop_requested;
        rc = sweep_run(db, b, &so, &res, &err);
    }
    if (rc && (lost || (db && db_file_lost(db)))) {
        /* The jobs in flight go on and write their run directories; tell how to get the
         * database back from those. */
        char hint[sizeof err.msg];
        snprintf(hint, sizeof hint, ". Every run's files are in %s: `hearth --db %s ingest "
                 "%s` records them in a new database, then `hearth --db %s resume %s` "
                 "finishes the sweep", ro->exp_dir, c->db_path, ro->exp_dir, c->db_path,
                 ro->experiment);
        size_t len = strlen(err.msg);
        snprintf(err.msg + len, sizeof err.msg - len, "%s", hint);
    }
    backend_free(b);
    db_close(db);
    sweep_lock_release(lock);
    if (rc)
        return hcli_fail(c, rc, &err);
    printf("%s: %ld completed, %ld failed, %ld timeout, %ld cancelled", ro->experiment,
           res.completed, res.failed, res.timeout, res.cancelled);
    if (res.retried)
        printf(", %ld retried", res.retried);
    if (res.interrupted)
        printf(", %ld interrupted", res.interrupted);
    if (res.vanished)
        printf(", %ld vanished (%ld replaced by new runs)", res.vanished, res.replaced);
    if (res.pending)
        printf(", %ld still pending", res.pending);
    printf(" (runs in %s)\n", ro->exp_dir);
    if (res.interrupted || (*stop_requested && res.pending))
        printf("`hearth resume %s` continues the interrupted and pending runs\n",
               ro->experiment);
    fflush(stdout);
    if (*stop_requested)
        return HCLI_EXIT_FAILED;
    return res.failed || res.timeout || res.cancelled ? HCLI_EXIT_FAILED : HCLI_EXIT_OK;
}

int cmd_run_sweep(hcli_ctx *c, const cmd_run_opts *ro)
{
    if (!ro->detach)
        return runner(c, ro, -1);
    char log[PATH_MAX + 32];
    hearth_err err = { { 0 } };
    int rc = rundir_mkdirs(ro->exp_dir, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    snprintf(log, sizeof log, "%s/runner.log", ro->exp_dir);
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int pipefd[2];
    if (logfd < 0 || nullfd < 0 || pipe2(pipefd, O_CLOEXEC)) {
        herr_set(&err, HERR_IO, "%s: %s", log, strerror(errno));
        return hcli_fail(c, HERR_IO, &err);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        herr_set(&err, HERR_RUNTIME, "fork: %s", strerror(errno));
        return hcli_fail(c, HERR_RUNTIME, &err);
    }
    if (pid == 0) {
        /* The detached runner: its own session, no terminal, output into runner.log. */
        close(pipefd[0]);
        setsid();
        dup2(nullfd, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        close(nullfd);
        close(logfd);
        cmd_run_opts child = *ro;
        child.detached = 1;
        fprintf(stderr, "hearth: runner %d started for experiment %s\n", (int)getpid(),
                ro->experiment);
        int code = runner(c, &child, pipefd[1]);
        fflush(stdout);
        fflush(stderr);
        _exit(code);
    }
    close(pipefd[1]);
    close(logfd);
    close(nullfd);
    char byte = 0;
    ssize_t n;
    while ((n = read(pipefd[0], &byte, 1)) < 0 && errno == EINTR)
        ;
    close(pipefd[0]);
    if (n != 1) {
        herr_set(&err, HERR_RUNTIME, "the detached runner (pid %d) ended at once; see %s",
                 (int)pid, log);
        return hcli_fail(c, HERR_RUNTIME, &err);
    }
    printf("%s: runner started (pid %d)%s; log: %s\n", ro->experiment, (int)pid,
           byte == 'w' ? ", waiting for the experiment's current runner" : "", log);
    printf("`hearth wait %s` waits for it; `hearth status %s` shows progress\n",
           ro->experiment, ro->experiment);
    return HCLI_EXIT_OK;
}

/* ---- creating runs ----------------------------------------------------------------------- */

typedef struct {
    hearth_db *db;
    const spec *s;
    rundir_job base;
    const char *exp_dir;
    const char *tmpl_name, *tmpl;
    int dry_run;
    long created, points_in_flight, points_new;
    hearth_err *err;
} create_ctx;

static int completed_in_experiment(void *ctx, const char *hash, int *count, hearth_err *err)
{
    create_ctx *cc = ctx;
    long done = 0;
    int rc = runs_db_count_by_hash(cc->db, cc->s->name, hash, &done, NULL, err);
    *count = done > 1000000000L ? 1000000000 : (int)done;
    return rc;
}

/* plan_run's callback: the runs a kept point still needs (its `runs` minus those already
 * on their way), each with its run directory. */
static int create_point(void *ctx, const plan_point *p)
{
    create_ctx *cc = ctx;
    if (p->status != PLAN_KEPT)
        return 0;
    long active = 0;
    int rc = cc->db ? runs_db_count_by_hash(cc->db, cc->s->name, p->hash, NULL, &active,
                                            cc->err)
                    : 0;
    if (rc)
        return rc;
    long n = (long)p->runs - active;
    if (n <= 0) {
        cc->points_in_flight++;
        return 0;
    }
    cc->points_new++;
    if (cc->dry_run) {
        cc->created += n;
        printf("  +%ld  %.12s ", n, p->hash);
        for (int i = 0; i < p->pt->n; i++)
            printf(" %s=%s", p->pt->kv[i].key, p->pt->kv[i].value->text);
        printf("\n");
        return 0;
    }
    char *json = run_config_canonical_json(p->config, cc->err);
    if (!json)
        return HERR_RUNTIME;
    rundir_job j = cc->base;
    cmd_job_of_point(cc->s, p, &j);
    for (long i = 0; !rc && i < n; i++) {
        rc = sweep_create_run(cc->db, &j, json, cc->exp_dir, cc->tmpl_name, cc->tmpl, NULL,
                              cc->err);
        if (!rc)
            cc->created++;
    }
    free(json);
    return rc;
}

void cmd_job_of_point(const spec *s, const plan_point *p, rundir_job *j)
{
    j->config_hash = (char *)p->hash;
    j->cpus_per_task = p->res.cpus_per_task > 0 ? (int)p->res.cpus_per_task : 1;
    int64_t limit = 0;
    j->time_limit_s = p->res.time && spec_time_seconds(p->res.time, &limit) == 0 ? limit : 0;
    j->max_concurrent = p->res.max_concurrent > 0 ? (int)p->res.max_concurrent : 0;
    /* The spec's resources, else the user's defaults (cmd_job_defaults). */
    if (p->res.partition)
        j->partition = (char *)p->res.partition;
    if (p->res.account)
        j->account = (char *)p->res.account;
    if (p->res.qos)
        j->qos = (char *)p->res.qos;
    if (p->res.constraint)
        j->constraint = (char *)p->res.constraint;
    j->n_setup = s->resources.n_setup;
    j->setup = (char **)s->resources.setup;
    j->n_sbatch = s->resources.n_sbatch;   /* not a matrix key: the spec's list */
    j->sbatch = (char **)s->resources.sbatch;
    j->retry_timeout = s->resources.retry_timeout;   /* not a matrix key either */
    j->pack = s->resources.pack > 1 ? (int)s->resources.pack : 1;   /* nor this */
    /* A CPU run is one task on one node; a cuda run one task per GPU (rundir.h). */
    int cuda = p->config->device == DEVICE_CUDA;
    j->nodes = cuda ? (int)p->res.nodes : 1;
    j->gpus_per_node = cuda ? (int)p->res.gpus_per_node : 0;
}

void cmd_job_defaults(const hcli_ctx *c, rundir_job *j)
{
    j->partition = (char *)ucfg_get(c->cfg, UCFG_SLURM_PARTITION);
    j->account = (char *)ucfg_get(c->cfg, UCFG_SLURM_ACCOUNT);
    j->qos = (char *)ucfg_get(c->cfg, UCFG_SLURM_QOS);
    j->constraint = (char *)ucfg_get(c->cfg, UCFG_SLURM_CONSTRAINT);
}

const char *cmd_backend_name(const hcli_ctx *c)
{
    /* --rest-url / --rest-token-file become the environment variables they stand for, so
     * that every backend_open of this process (and of a detached runner) finds them.  The
     * token file's path is not secret; the token itself is read by the backend only. */
    const char *rest_url = hcli_get(c, "rest-url"), *rest_tok = hcli_get(c, "rest-token-file");
    if (rest_url)
        setenv("HEARTH_SLURMREST_URL", rest_url, 1);
    if (rest_tok)
        setenv("HEARTH_SLURMREST_TOKEN_FILE", rest_tok, 1);
    return hcli_get(c, "backend") ? hcli_get(c, "backend") : ucfg_get(c->cfg, UCFG_BACKEND);
}

int cmd_submit(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    spec *s = NULL;
    hearth_db *db = NULL;
    char *tmpl = NULL, *spec_real = NULL;
    char runs_dir[PATH_MAX], exp_dir[PATH_MAX], trainer[PATH_MAX], workdir[PATH_MAX];
    char tmpl_name[PATH_MAX];
    long jobs = 0;
    const char *backend_name = cmd_backend_name(c);
    int dry = hcli_flag(c, "dry-run"), code = HCLI_EXIT_OK;
    backend *probe = NULL;
    select_auto *sa = NULL;   /* `auto` values of the spec (docs/select.md) */
    char policy_dir[PATH_MAX + 16];

    int rc = cmd_load_spec(c, c->argv[0], &s, &err);
    if (rc) {
        rc = HERR_CONFIG;   /* an unreadable spec is a usage error too */
        goto fail;
    }
    if ((rc = hcli_get_long(c, "jobs", 0, 1, &jobs, &err)) ||
        (rc = backend_open(backend_name, &probe, &err)) ||
        (rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, &err)) ||
        (rc = trainer_find(s, trainer, sizeof trainer, &err)))
        goto fail;
    backend_free(probe);
    probe = NULL;
    if (!getcwd(workdir, sizeof workdir)) {
        rc = herr_set(&err, HERR_IO, "getcwd: %s", strerror(errno));
        goto fail;
    }
    if (!dry || access(c->db_path, F_OK) == 0) {
        if ((rc = db_open(c->db_path, &db, &err)))
            goto fail;
    }
    if (s->after_experiment && db) {
        int64_t id;
        rc = runs_db_experiment_find(db, s->after_experiment, &id, &err);
        char at[300];
        spec_position_format(s, s->after_line, s->after_col, at, sizeof at);
        if (rc == 0)
            rc = herr_set(&err, HERR_CONFIG, "%s: after: experiment %s is not in %s", at,
                          s->after_experiment, c->db_path);
        if (rc < 0)
            goto fail;
        rc = 0;
    }
    if (db) {
        if ((rc = sweep_experiment_dir(db, s->name, runs_dir, exp_dir, sizeof exp_dir, &err)))
            goto fail;
    } else {
        snprintf(exp_dir, sizeof exp_dir, "%.3000s/%s", runs_dir, s->name);
    }
    if (!dry) {
        /* the spec as planned: with --set overrides, the file with them applied */
        spec_real = realpath(c->argv[0], NULL);
        if ((rc = runs_db_experiment_upsert(db, s->name, spec_real ? spec_real : c->argv[0],
                                            s->text, NULL, &err)) ||
            (rc = sweep_load_template(backend_name, tmpl_name, sizeof tmpl_name, &tmpl, &err)))
            goto fail;
    }

    create_ctx cc;
    memset(&cc, 0, sizeof cc);
    cc.db = db;
    cc.s = s;
    cc.exp_dir = exp_dir;
    cc.tmpl_name = tmpl_name;
    cc.tmpl = tmpl;
    cc.dry_run = dry;
    cc.err = &err;
    cc.base.experiment = (char *)s->name;
    cc.base.backend = (char *)backend_name;
    cmd_job_defaults(c, &cc.base);
    cc.base.trainer = trainer;
    cc.base.workdir = workdir;
    cc.base.retries = s->retries;
    cc.base.repeat = s->repeat;
    cc.base.after_experiment = (char *)s->after_experiment;
    cc.base.after_any = s->after_on == SPEC_AFTER_ANY;
    plan_opts po = { 0 };
    po.already_completed = db ? completed_in_experiment : NULL;
    po.completed_ctx = &cc;
    po.force = hcli_flag(c, "force");
    po.trainer_path = trainer;
    snprintf(policy_dir, sizeof policy_dir, "%s/policies", runs_dir);
    if ((rc = select_auto_create(&sa, db, s, policy_dir, !dry, 0, &err)))
        goto fail;
    po.resolve_auto = select_auto_resolve;
    po.auto_ctx = sa;
    plan_counts pc;
    memset(&pc, 0, sizeof pc);
    /* Counting a point's runs and creating the missing ones is one write transaction, so
     * that two submits of one experiment at once cannot both see a point without runs
     * and both create them; a failure part way records none of the runs. */
    int in_tx = db && !dry;
    if (in_tx && (rc = db_tx_begin(db, &err)))
        goto fail;
    rc = plan_run(s, &po, create_point, &cc, &pc, &err);
    if (!rc && !dry)
        rc = select_auto_record(sa, s->name, &err);
    if (in_tx)
        rc = db_tx_end(db, rc, &err);
    if (rc)
        goto fail;
    fprintf(stderr, "hearth: %s: %llu points: %llu kept, %llu pruned, %llu skipped; %ld new "
            "run%s%s", s->name, (unsigned long long)pc.points, (unsigned long long)pc.kept,
            (unsigned long long)pc.pruned, (unsigned long long)pc.skipped, cc.created,
            cc.created == 1 ? "" : "s", dry ? " would be created" : "");
    if (cc.points_in_flight)
        fprintf(stderr, " (%ld point%s already on their way)", cc.points_in_flight,
                cc.points_in_flight == 1 ? "" : "s");
    fprintf(stderr, "\n");
    if (pc.pruned)
        fprintf(stderr, "hearth: `hearth plan %s` shows why points were pruned\n", c->argv[0]);
    if (dry) {
        printf("dry run: %ld run%s in %s would be created; nothing was changed\n", cc.created,
               cc.created == 1 ? "" : "s", exp_dir);
        goto done;
    }
    db_close(db);
    db = NULL;
    cmd_run_opts ro = { 0 };
    ro.experiment = s->name;
    ro.exp_dir = exp_dir;
    ro.backend = backend_name;
    ro.jobs = jobs;
    ro.detach = hcli_flag(c, "detach");
    code = cmd_run_sweep(c, &ro);
    goto done;
fail:
    code = hcli_fail(c, rc, &err);
done:
    select_auto_free(sa);
    backend_free(probe);
    db_close(db);
    spec_free(s);
    free(spec_real);
    free(tmpl);
    return code;
}
