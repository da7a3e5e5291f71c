/* hearth-train: trains a vision-language model from a run config (see cli.h, run.h). */
#include <stdio.h>

#include "bench_layers.h"
#include "bootstrap.h"
#include "cli.h"
#include "kdev.h"
#include "plan_memory.h"
#include "run.h"
#include "shape/version.h"

int main(int argc, char **argv)
{
    cli_args a;
    hearth_err err = { { 0 } };
    int rc = cli_parse(&a, argc, argv, &err);
    if (rc) {
        fprintf(stderr, "hearth-train: %s\n", err.msg);
        fprintf(stderr, "Try 'hearth-train --help'.\n");
        cli_args_free(&a);
        return RUN_EXIT_USAGE;
    }
    if (a.help) {
        cli_usage(stdout);
        cli_args_free(&a);
        return RUN_EXIT_DONE;
    }
    if (a.version) {
        printf("%s\n", version_line());
        cli_args_free(&a);
        return RUN_EXIT_DONE;
    }
    if (a.capabilities) {
        /* what `hearth plan` asks before it keeps device: cuda points */
        printf("{\"devices\": [\"cpu\"%s]}\n", kdev_cuda_available() ? ", \"cuda\"" : "");
        cli_args_free(&a);
        return RUN_EXIT_DONE;
    }
    if (a.plan_memory) {
        rc = plan_memory_main(&a, stdout, stderr);
        cli_args_free(&a);
        return rc;
    }
    if (a.bench_layers) {
        rc = bench_layers_main(&a, stdout, stderr);
        cli_args_free(&a);
        return rc;
    }
    if (a.check_bootstrap) {
        cli_args_free(&a);
        return bootstrap_check_main(stdout, stderr);
    }
    rc = run_main(&a);
    cli_args_free(&a);
    return rc;
}
