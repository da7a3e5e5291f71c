/* cmd_bench.c - `hearth bench ingest FILE...` and `hearth bench layers SPEC|--model M`:
 * layer benchmarks into the results database (docs/select.md).  `bench layers` runs its
 * job through a backend (bench_run.h) and ingests the file the job left. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_run.h"
#include "cmd.h"
#include "render.h"
#include "select_auto.h"
#include "select_db.h"
#include "select_fp8.h"
#include "stop_signal.h"
#include "trainer_caps.h"

static int ingest_files(hearth_db *db, int n, char **files, hearth_err *err)
{
    for (int i = 0; i < n; i++) {
        select_bench_set b;
        int added = 0;
        int rc = select_bench_ingest(db, files[i], 0, &added, &b, err);
        if (rc)
            return rc;
        printf("%s: %s on %s%s%s, %zu rows%s\n", files[i], b.model, b.gpu,
               b.device[0] ? ", device " : "", b.device, b.n,
               added ? "" : " (already recorded)");
        if (select_fp8_cpu_warning(&b))
            fprintf(stderr, "hearth: warning: %s: %s\n", files[i], select_fp8_cpu_warning(&b));
        select_bench_set_free(&b);
    }
    return 0;
}

/* What `bench layers` measures and the job that measures it. */
typedef struct {
    const spec *s;            /* the SPEC form's spec, else NULL */
    run_config cfg;
    char hash[65];
    rundir_job job;           /* strings borrowed from the command line, the spec, trainer */
    char trainer[PATH_MAX];
    int found;                /* SPEC: a point was kept */
    char pruned[1200];        /* SPEC: why the first pruned point was, for the error */
} bench_target;

/* plan_run's callback: the first kept point is the one measured (returns 1 to stop).  The
 * point lives only during the call; its resources' strings are the spec's. */
static int take_point(void *ctx, const plan_point *p)
{
    bench_target *t = ctx;
    if (p->status == PLAN_PRUNED && !t->pruned[0])
        snprintf(t->pruned, sizeof t->pruned, "; the first point was pruned by rule %s: %s",
                 p->rule ? p->rule : "?", p->reason);
    if (p->status != PLAN_KEPT)
        return 0;
    t->found = 1;
    t->cfg = *p->config;
    snprintf(t->hash, sizeof t->hash, "%s", p->hash);
    cmd_job_of_point(t->s, p, &t->job);
    return 1;
}

/* SPEC: the first point its plan keeps (its base with each matrix key's first value,
 * after exclude, where and the layout rules; `auto` values resolved as `hearth plan`
 * does; completed runs are not skipped), with its resources, setup lines and trainer. */
static int target_from_spec(hcli_ctx *c, hearth_db *db, const char *path, spec **s,
                            bench_target *t, hearth_err *err)
{
    char runs_dir[PATH_MAX], policy_dir[PATH_MAX + 16];
    select_auto *sa = NULL;
    int rc = cmd_load_spec(c, path, s, err);
    if (!rc)
        rc = trainer_find(*s, t->trainer, sizeof t->trainer, err);
    if (!rc && !(rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, err))) {
        snprintf(policy_dir, sizeof policy_dir, "%.4000s/policies", runs_dir);
        rc = select_auto_create(&sa, db, *s, policy_dir, 0, 0, err);
    }
    if (!rc) {
        plan_opts po = { 0 };
        po.force = 1;
        po.resolve_auto = select_auto_resolve;
        po.auto_ctx = sa;
        po.trainer_path = t->trainer;
        t->s = *s;
        cmd_job_defaults(c, &t->job);
        rc = plan_run(*s, &po, take_point, t, NULL, err);
        rc = rc == 1 ? 0 : rc;
    }
    select_auto_free(sa);
    if (!rc && !t->found)
        rc = herr_set(err, HERR_CONFIG, "%s: the plan keeps no point to benchmark%s "
                      "(`hearth plan %s` shows every point)", path, t->pruned, path);
    return rc;
}

/* --model M [--device D] [--trainer PATH]: the model's defaults on device D, the user's
 * Slurm defaults. */
static int target_from_model(hcli_ctx *c, const char *model, bench_target *t,
                             hearth_err *err)
{
    const char *device = hcli_get(c, "device") ? hcli_get(c, "device") : "cuda";
    if (strcmp(device, "cuda") && strcmp(device, "cpu"))
        return herr_set(err, HERR_CONFIG, "--device %s: expected cuda or cpu", device);
    config_override ovr[] = { { "model", model }, { "device", device } };
    int rc = run_config_load(&t->cfg, NULL, ovr, 2, 0, err);
    if (!rc)
        rc = run_config_hash(&t->cfg, t->hash, err);
    if (rc)
        return rc;
    char path[PATH_MAX];
    if (hcli_get(c, "trainer")) {
        snprintf(path, sizeof path, "%s", hcli_get(c, "trainer"));
    } else {
        char dir[PATH_MAX];
        if ((rc = render_exe_dir(dir, sizeof dir, err)))
            return rc;
        snprintf(path, sizeof path, "%.4000s/hearth-train", dir);
    }
    /* absolute: the job runs in its own directory, maybe on another node */
    if (!realpath(path, t->trainer))
        return herr_set(err, HERR_CONFIG, "%s: %s", path, strerror(errno));
    cmd_job_defaults(c, &t->job);
    t->job.cpus_per_task = 1;
    return 0;
}

static int bench_layers(hcli_ctx *c, hearth_db *db, hearth_err *err)
{
    const char *model = hcli_get(c, "model"), *spec_path = c->argc > 1 ? c->argv[1] : NULL;
    if (spec_path && (model || hcli_get(c, "device") || hcli_get(c, "trainer")))
        return herr_set(err, HERR_CONFIG, "bench layers %s: --%s: a SPEC names the model, "
                        "device and trainer itself (change them with --set KEY=VALUE)",
                        spec_path, model ? "model" : hcli_get(c, "device") ? "device"
                                                                            : "trainer");
    if (!spec_path && !model)
        return herr_set(err, HERR_CONFIG, "bench layers: expected SPEC or --model M");
    if (!spec_path && hcli_count(c, "set"))
        return herr_set(err, HERR_CONFIG, "--set: overrides keys of a SPEC (bench layers "
                        "SPEC --set KEY=VALUE), not of --model");
    bench_target t;
    memset(&t, 0, sizeof t);
    spec *s = NULL;
    char runs_dir[PATH_MAX], dir[PATH_MAX], file[PATH_MAX + 32], workdir[PATH_MAX];
    const char *backend = cmd_backend_name(c);
    long timeout = 0;
    int rc = hcli_get_long(c, "timeout", 0, 1, &timeout, err);
    if (!rc)
        rc = spec_path ? target_from_spec(c, db, spec_path, &s, &t, err)
                       : target_from_model(c, model, &t, err);
    if (!rc)
        rc = hcli_runs_dir(c, runs_dir, sizeof runs_dir, err);
    if (!rc && !getcwd(workdir, sizeof workdir))
        rc = herr_set(err, HERR_IO, "getcwd: %s", strerror(errno));
    char *json = rc ? NULL : run_config_canonical_json(&t.cfg, err);
    if (!rc && !json)
        rc = HERR_RUNTIME;
    if (!rc) {
        t.job.trainer = t.trainer;
        t.job.workdir = workdir;
        t.job.config_hash = t.hash;
        /* One task on one node, one GPU on cuda: the benchmark measures one rank's shard
         * of each layer on one device, whatever the layout's size. */
        t.job.nodes = 1;
        t.job.gpus_per_node = t.cfg.device == DEVICE_CUDA ? 1 : 0;
        bench_run_opts o = { .backend = backend, .runs_dir = runs_dir, .config_json = json,
                             .name = t.cfg.model.name[0] ? t.cfg.model.name
                                                          : t.cfg.model_preset,
                             .job = &t.job, .timeout_s = timeout, .progress = stderr,
                             .stop = stop_signal_catch() };
        rc = bench_run_job(&o, dir, sizeof dir, err);
    }
    free(json);
    spec_free(s);
    if (rc)
        return rc;
    snprintf(file, sizeof file, "%s/layer_bench.json", dir);
    char *files[] = { file };
    return ingest_files(db, 1, files, err);
}

int cmd_bench(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    const char *what = c->argv[0];
    int ingest = strcmp(what, "ingest") == 0;
    if (!ingest && strcmp(what, "layers") != 0) {
        herr_set(&err, HERR_CONFIG, "expected `bench ingest FILE...` or `bench layers`, got '%s'",
                 what);
        return hcli_fail(c, HERR_CONFIG, &err);
    }
    if (ingest && c->argc < 2) {
        herr_set(&err, HERR_CONFIG, "bench ingest: expected FILE...");
        return hcli_fail(c, HERR_CONFIG, &err);
    }
    if (!ingest && c->argc > 2) {
        herr_set(&err, HERR_CONFIG, "bench layers: expected one SPEC (or --model M), got %d "
                 "arguments", c->argc - 1);
        return hcli_fail(c, HERR_CONFIG, &err);
    }
    static const char *const layers_only[] = { "model", "backend", "trainer", "device", "set",
                                               "timeout", "rest-url", "rest-token-file" };
    for (size_t i = 0; ingest && i < sizeof layers_only / sizeof *layers_only; i++)
        if (hcli_count(c, layers_only[i])) {
            herr_set(&err, HERR_CONFIG, "--%s applies to `bench layers`", layers_only[i]);
            return hcli_fail(c, HERR_CONFIG, &err);
        }
    hearth_db *db = NULL;
    int code = cmd_open_db(c, 1, &db);
    if (code)
        return code;
    int rc = ingest ? ingest_files(db, c->argc - 1, c->argv + 1, &err) : bench_layers(c, db, &err);
    if (!rc && fflush(stdout))
        rc = herr_set(&err, HERR_IO, "writing the output failed");
    db_close(db);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}
