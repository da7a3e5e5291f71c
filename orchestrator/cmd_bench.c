/* cmd_bench.c - `hearth bench ingest FILE...` and `hearth bench layers --model M`: layer
 * benchmarks into the results database (docs/select.md). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "render.h"
#include "trainer_caps.h"
#include "rundir.h"
#include "select_db.h"
#include "select_fp8.h"

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

static int bench_layers(hcli_ctx *c, hearth_db *db, hearth_err *err)
{
    const char *model = hcli_get(c, "model");
    const char *backend = hcli_get(c, "backend") ? hcli_get(c, "backend")
                                                 : ucfg_get(c->cfg, UCFG_BACKEND);
    const char *device = hcli_get(c, "device") ? hcli_get(c, "device") : "cuda";
    if (!model)
        return herr_set(err, HERR_CONFIG, "--model is required");
    if (strcmp(device, "cuda") && strcmp(device, "cpu"))
        return herr_set(err, HERR_CONFIG, "--device %s: expected cuda or cpu", device);
    char trainer[PATH_MAX], dir[PATH_MAX], out[PATH_MAX], help_log[PATH_MAX + 16];
    if (hcli_get(c, "trainer")) {
        snprintf(trainer, sizeof trainer, "%s", hcli_get(c, "trainer"));
    } else {
        int rc = render_exe_dir(dir, sizeof dir, err);
        if (rc)
            return rc;
        snprintf(trainer, sizeof trainer, "%.4000s/hearth-train", dir);
    }
    if (access(trainer, X_OK))
        return herr_set(err, HERR_CONFIG, "%s: not an executable file", trainer);
    int rc = hcli_runs_dir(c, dir, sizeof dir, err);
    if (rc)
        return rc;
    snprintf(out, sizeof out, "%.3000s/bench-layers/%.200s-%ld", dir, model, (long)time(NULL));
    if ((rc = rundir_mkdirs(out, err)))
        return rc;
    /* The trainer says what it can do in its --help; do not pretend it benchmarks. */
    snprintf(help_log, sizeof help_log, "%s/help.txt", out);
    char *help_argv[] = { trainer, "--help", NULL };
    trainer_run_wait(help_argv, help_log);
    FILE *f = fopen(help_log, "r");
    char line[512];
    int has_flag = 0;
    while (f && fgets(line, sizeof line, f))
        has_flag |= strstr(line, "--bench-layers") != NULL;
    if (f)
        fclose(f);
    if (!has_flag) {
        unlink(help_log);
        rmdir(out);   /* nothing ran: leave no directory behind */
        return herr_set(err, HERR_CONFIG, "%s has no --bench-layers mode (this trainer cannot "
                        "benchmark layers yet): measure them elsewhere and record the "
                        "layer_bench.json with `hearth bench ingest FILE`", trainer);
    }
    if (strcmp(backend, "local") != 0)
        return herr_set(err, HERR_CONFIG, "--backend %s: layer benchmarks run with the local "
                        "backend only so far (run `hearth-train --bench-layers` in a job and "
                        "`hearth bench ingest` its file)", backend);
    char set_model[300], set_device[32], log[PATH_MAX + 16], file[PATH_MAX + 32];
    snprintf(set_model, sizeof set_model, "model=%s", model);
    snprintf(set_device, sizeof set_device, "device=%s", device);
    snprintf(log, sizeof log, "%s/bench.log", out);
    char *argv[] = { trainer, "--bench-layers", "--set", set_model, "--set", set_device,
                     "--out", out, NULL };
    int code = trainer_run_wait(argv, log);
    if (code)
        return herr_set(err, HERR_RUNTIME, "%s --bench-layers failed (exit %d): see %s", trainer,
                        code, log);
    snprintf(file, sizeof file, "%s/layer_bench.json", out);
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
    if (!ingest && c->argc > 1) {
        herr_set(&err, HERR_CONFIG, "bench layers takes no FILE");
        return hcli_fail(c, HERR_CONFIG, &err);
    }
    if (ingest && (hcli_get(c, "model") || hcli_get(c, "backend") || hcli_get(c, "trainer") ||
                   hcli_get(c, "device"))) {
        herr_set(&err, HERR_CONFIG, "--model, --backend, --trainer and --device apply to "
                 "`bench layers`");
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
