/* cmd_plan.c - `hearth plan SPEC`: the spec's points, kept / pruned / skipped (plan.h),
 * deduplicated against the experiment's completed runs when the database exists. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "plan.h"
#include "runs_db.h"
#include "select_auto.h"
#include "spec.h"
#include "trainer_caps.h"

typedef struct {
    hearth_db *db;
    const char *experiment;
} completed_ctx;

/* plan's dedup: completed runs of the hash in this experiment. */
static int completed_in_experiment(void *ctx, const char *hash, int *count, hearth_err *err)
{
    completed_ctx *cc = ctx;
    long done = 0;
    int rc = runs_db_count_by_hash(cc->db, cc->experiment, hash, &done, NULL, err);
    *count = done > 1000000000L ? 1000000000 : (int)done;
    return rc;
}

int cmd_load_spec(hcli_ctx *c, const char *path, spec **s, hearth_err *err)
{
    int n = hcli_count(c, "set");
    const char **sets = calloc((size_t)n + 1, sizeof *sets);
    if (!sets)
        return herr_set(err, HERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        sets[i] = hcli_get_nth(c, "set", i);
    int rc = spec_load_set(s, path, sets, n, err);
    free(sets);
    return rc;
}

int cmd_plan(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    spec *s = NULL;
    int rc = cmd_load_spec(c, c->argv[0], &s, &err);
    if (rc)
        return hcli_fail(c, HERR_CONFIG, &err);
    const char *fmt = hcli_get(c, "format");
    hearth_db *db = NULL;
    /* Planning never creates a database: without one nothing has completed yet. */
    if (access(c->db_path, F_OK) == 0 && (rc = db_open(c->db_path, &db, &err))) {
        spec_free(s);
        return hcli_fail(c, rc, &err);
    }
    completed_ctx cc = { db, s->name };
    char runs_dir[4096], policy_dir[4200];
    select_auto *sa = NULL;
    if (!(rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, &err))) {
        snprintf(policy_dir, sizeof policy_dir, "%s/policies", runs_dir);
        rc = select_auto_create(&sa, db, s, policy_dir, 0, 1, &err);
    }
    if (rc) {
        db_close(db);
        spec_free(s);
        return hcli_fail(c, rc, &err);
    }
    plan_opts opts = { 0 };
    opts.resolve_auto = select_auto_resolve;
    opts.auto_ctx = sa;
    opts.already_completed = db ? completed_in_experiment : NULL;
    opts.completed_ctx = &cc;
    opts.force = hcli_flag(c, "force");
    /* the plan asks the spec's trainer what it can run; one that cannot be found is
     * submit's error, not the plan's */
    char trainer[PATH_MAX];
    hearth_err terr;
    if (trainer_find(s, trainer, sizeof trainer, &terr) == 0)
        opts.trainer_path = trainer;
    plan_result r;
    memset(&r, 0, sizeof r);
    rc = plan_collect(s, &opts, &r, &err);
    if (!rc) {
        int wrc = fmt && strcmp(fmt, "json") == 0 ? plan_format_json(&r, stdout)
                                                   : plan_format_table(&r, stdout);
        /* the auto values' evidence and the cost estimate follow the table */
        if (!wrc && !(fmt && strcmp(fmt, "json") == 0))
            rc = select_auto_print(sa, &r, stdout, &err);
        if (!rc && (wrc || fflush(stdout)))
            rc = herr_set(&err, HERR_IO, "writing the plan failed");
    }
    plan_result_free(&r);
    select_auto_free(sa);
    db_close(db);
    spec_free(s);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}
