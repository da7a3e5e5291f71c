/* cmd.h - the handlers of `hearth`'s commands (cmd_*.c), named by the table in cli.c.
 * Each takes the parsed command line and returns the exit code (cli.h). */
#ifndef HEARTH_CMD_H
#define HEARTH_CMD_H

#include "backend.h"
#include "cli.h"
#include "db.h"
#include "plan.h"
#include "rundir.h"
#include "runs_db.h"
#include "spec.h"

int cmd_plan(hcli_ctx *c);
int cmd_submit(hcli_ctx *c);
int cmd_status(hcli_ctx *c);
int cmd_wait(hcli_ctx *c);
int cmd_cancel(hcli_ctx *c);
int cmd_resume(hcli_ctx *c);
int cmd_logs(hcli_ctx *c);
int cmd_rm(hcli_ctx *c);
int cmd_archive(hcli_ctx *c);
int cmd_unarchive(hcli_ctx *c);
int cmd_tag(hcli_ctx *c);
int cmd_untag(hcli_ctx *c);
int cmd_query(hcli_ctx *c);
int cmd_show(hcli_ctx *c);
int cmd_compare(hcli_ctx *c);
int cmd_top(hcli_ctx *c);
int cmd_export(hcli_ctx *c);
int cmd_ingest(hcli_ctx *c);
int cmd_check(hcli_ctx *c);
int cmd_bench(hcli_ctx *c);
int cmd_select(hcli_ctx *c);
int cmd_report(hcli_ctx *c);
int cmd_config(hcli_ctx *c);
int cmd_completion(hcli_ctx *c);
int cmd_man(hcli_ctx *c);

/* Running an experiment's sweep (submit, resume): in the foreground, or in a detached
 * runner (its log in EXP_DIR/runner.log) when `detach`. */
typedef struct {
    const char *experiment;
    const char *exp_dir;       /* RUNS_DIR/EXP: the runner lock and log live here */
    const char *backend;
    long jobs;                 /* 0: CPUs / cpus_per_task */
    int detach;
    int detached;              /* set in the detached runner itself */
} cmd_run_opts;
int cmd_run_sweep(hcli_ctx *c, const cmd_run_opts *ro);

/* Cancels one run that is not finished yet (`hearth cancel`, `hearth rm --force`): its
 * state becomes cancelled, then its job is ended through the backend (opened into *bk on
 * first use; the caller frees it) and what it left is ingested.  Prints "RUN: cancelled".
 * A run that ended meanwhile is left as it is. */
int cmd_cancel_run(hearth_db *db, const run_info *ri, backend **bk, hearth_err *err);

/* Reads the spec at `path` (the command's argument) with its --set overrides (spec.h). */
int cmd_load_spec(hcli_ctx *c, const char *path, spec **s, hearth_err *err);

/* The backend the command names (--backend, else the user's default, user_config.h; NULL:
 * local), with --rest-url / --rest-token-file passed on to the slurmrest backend through
 * the environment. */
const char *cmd_backend_name(const hcli_ctx *c);

/* A job's Slurm defaults from the user's config (partition, account, qos, constraint;
 * borrowed strings). */
void cmd_job_defaults(const hcli_ctx *c, rundir_job *j);

/* A job's fields from plan point p of spec s (submit, bench layers): its config hash,
 * resources (over the defaults already in *j), setup lines, extra sbatch options, and
 * the launch (cuda: nodes x gpus_per_node tasks; cpu: one).  Strings stay borrowed from
 * s and p. */
void cmd_job_of_point(const spec *s, const plan_point *p, rundir_job *j);

/* Opens the command's database (creating it when `create`; else a missing file is an
 * error naming it, exit 2).  Returns 0, or the exit code after printing the error. */
int cmd_open_db(hcli_ctx *c, int create, hearth_db **db);

#endif
