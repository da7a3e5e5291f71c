/* cli.h - hearth-train's command line.
 *
 *   hearth-train --config FILE --out DIR [--set KEY=VALUE]...
 *   hearth-train --set model=tiny-vlm --out DIR          (no file: overrides only)
 *   hearth-train ... --resume DIR                         (continue from a checkpoint)
 *   hearth-train --resume RUN_DIR --out RUN_DIR           (the checkpoint's own config)
 *   hearth-train ... --force                              (replace DIR's earlier results)
 *   hearth-train ... --init-from HF_DIR --export-hf DIR   (Hugging Face checkpoints)
 *   hearth-train --plan-memory --config FILE [--set KEY=VALUE]...  (plan_memory.h)
 *   hearth-train --bench-layers --config FILE --out DIR   (bench_layers.h)
 *   hearth-train --check-bootstrap                        (see bootstrap.h)
 *   hearth-train --help | --version
 *
 * Options also take the --opt=VALUE form.  Usage errors are HERR_CONFIG (exit 2). */
#ifndef HEARTH_CLI_H
#define HEARTH_CLI_H

#include <stdio.h>

#include "shape/err.h"
#include "shape/run_config.h"

typedef struct {
    const char *config;        /* borrowed from argv; NULL = overrides only, or with
                                  --resume the checkpoint's config plus overrides */
    const char *out_dir;       /* borrowed from argv */
    const char *resume;        /* --resume DIR (run or checkpoint directory); borrowed */
    const char *init_from;     /* --init-from DIR (Hugging Face checkpoint); borrowed */
    const char *export_hf;     /* --export-hf DIR; borrowed */
    const char *export_dtype;  /* --export-dtype f32|bf16; NULL = f32; borrowed */
    config_override *ovr;      /* [n_ovr]; keys and values point into ovr_text */
    int n_ovr;
    char **ovr_text;           /* [n_ovr] malloc'd copies "KEY\0VALUE" */
    int help, version;
    int force;                 /* --force: replace the results of an earlier run in
                                  --out (refused without it, or --resume) */
    int check_bootstrap;       /* --check-bootstrap: no --out or config needed */
    int capabilities;          /* --capabilities: print what the build runs, exit */
    int bench_layers;          /* --bench-layers: the layer benchmark into DIR, no
                                  training (bench_layers.h) */
    int plan_memory;           /* --plan-memory: print the memory plan, train nothing;
                                  --out is not needed (and not created when given) */
} cli_args;

/* Parses argv; on success the caller frees with cli_args_free (also after an error). */
int cli_parse(cli_args *a, int argc, char **argv, hearth_err *err);
void cli_args_free(cli_args *a);
void cli_usage(FILE *f);

#endif
