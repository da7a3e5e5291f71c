#include "cli.h"

#include <stdlib.h>
#include <string.h>

void cli_usage(FILE *f)
{
    fputs("usage: hearth-train --config FILE --out DIR [--set KEY=VALUE]...\n"
          "                    [--resume DIR | --force]\n"
          "                    [--init-from HF_DIR] [--export-hf DIR [--export-dtype T]]\n"
          "       hearth-train --set model=PRESET [--set KEY=VALUE]... --out DIR\n"
          "       hearth-train --resume RUN_DIR --out RUN_DIR [--set KEY=VALUE]...\n"
          "       hearth-train --plan-memory [--config FILE] [--set KEY=VALUE]...\n"
          "       hearth-train --bench-layers [--config FILE] [--set KEY=VALUE]... --out DIR\n"
          "       hearth-train --check-bootstrap\n"
          "       hearth-train --help | --version\n"
          "\n"
          "Trains the model described by the run config FILE (YAML) and writes\n"
          "DIR/metrics.jsonl, DIR/result.json, DIR/config.json and DIR/train.log.\n"
          "\n"
          "  --config FILE      run config (optional when --set names the model, or with\n"
          "                     --resume: then the checkpoint's own config)\n"
          "  --out DIR          run directory, created if missing; one that holds an\n"
          "                     earlier run's results (result.json, metrics.jsonl or\n"
          "                     checkpoints/latest) is refused unless --resume or --force.\n"
          "                     A run refused for its config, its directory or its\n"
          "                     checkpoint writes nothing\n"
          "  --set KEY=VALUE    override a config key, dotted (train.steps=10); repeatable,\n"
          "                     applied in order after the file\n"
          "  --resume DIR       continue from a checkpoint: DIR is a checkpoint directory\n"
          "                     or a run directory (its checkpoints/latest); the config\n"
          "                     must be the checkpoint's, which is used when no --config\n"
          "                     is given (docs/checkpoints.md)\n"
          "  --force            replace the results of an earlier run in DIR: its\n"
          "                     result.json and checkpoints are removed when training\n"
          "                     starts, metrics.jsonl and config.json are rewritten\n"
          "  --init-from DIR    start from a Hugging Face Qwen2.5-VL checkpoint (config.json\n"
          "                     and safetensors, sharded or not); its config must match\n"
          "                     the run's model shape\n"
          "  --export-hf DIR    at the end, write the parameters as a Hugging Face\n"
          "                     Qwen2.5-VL checkpoint (config.json + safetensors)\n"
          "  --export-dtype T   f32 (default, lossless) or bf16 for --export-hf\n"
          "  --plan-memory      print the predicted peak memory per pipeline stage and rank\n"
          "                     (parameters, gradients, optimizer, activations, ...;\n"
          "                     docs/memory.md) and exit without training or writing DIR\n"
          "  --bench-layers     time forward + backward of each linear layer kind of the\n"
          "                     run's model at its shapes and tp, at token counts around\n"
          "                     the micro batch's, baseline against FP8 (quantisation\n"
          "                     included), with the FP8 results' relative error; writes\n"
          "                     DIR/layer_bench.json (docs/select.md) and trains nothing.\n"
          "                     On device cpu: the fp32 reference against the FP8\n"
          "                     emulation (the speedups say nothing about a GPU)\n"
          "  --capabilities     print what this build can run, as one JSON line\n"
          "                     ({\"devices\": [\"cpu\", \"cuda\"]}: cuda when its backend\n"
          "                     library is installed beside the program) and exit\n"
          "  --check-bootstrap  join the job (PMIx under srun --mpi=pmix or mpirun, else\n"
          "                     RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, else one rank),\n"
          "                     exchange a blob with every rank, print what arrived;\n"
          "                     exit 0 only if every rank saw the same consistent blobs\n"
          "  --help             this text\n"
          "  --version          print the version\n"
          "\n"
          "exit status: 0 done, 1 runtime failure, 2 usage or config error,\n"
          "             3 diverged (loss NaN or infinite),\n"
          "             75 preempted (SIGTERM, SIGUSR2, SIGINT or SIGHUP) after writing a\n"
          "             checkpoint\n", f);
}

void cli_args_free(cli_args *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->n_ovr; i++)
        free(a->ovr_text[i]);
    free(a->ovr_text);
    free(a->ovr);
    memset(a, 0, sizeof *a);
}

static int add_override(cli_args *a, const char *kv, hearth_err *err)
{
    const char *eq = strchr(kv, '=');
    if (!eq)
        return herr_set(err, HERR_CONFIG, "--set %s: expected KEY=VALUE", kv);
    if (eq == kv)
        return herr_set(err, HERR_CONFIG, "--set %s: empty KEY, expected KEY=VALUE", kv);
    config_override *o = realloc(a->ovr, (size_t)(a->n_ovr + 1) * sizeof *o);
    if (!o)
        return herr_set(err, HERR_NOMEM, "out of memory");
    a->ovr = o;
    char **t = realloc(a->ovr_text, (size_t)(a->n_ovr + 1) * sizeof *t);
    if (!t)
        return herr_set(err, HERR_NOMEM, "out of memory");
    a->ovr_text = t;
    char *copy = strdup(kv);
    if (!copy)
        return herr_set(err, HERR_NOMEM, "out of memory");
    size_t k = (size_t)(eq - kv);
    copy[k] = '\0';
    a->ovr_text[a->n_ovr] = copy;
    a->ovr[a->n_ovr].key = copy;
    a->ovr[a->n_ovr].value = copy + k + 1;
    a->n_ovr++;
    return 0;
}

/* Matches "--name VALUE" or "--name=VALUE"; *val is set and *i advanced. */
static int opt_value(const char *name, int argc, char **argv, int *i, const char **val,
                     hearth_err *err, int *rc)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0)
        return 0;
    if (arg[n] == '=') {
        *val = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        *rc = herr_set(err, HERR_CONFIG, "%s: missing value", name);
        return 1;
    }
    *val = argv[++*i];
    return 1;
}

/* The options taking one string value, each given at most once. */
static int string_option(cli_args *a, int argc, char **argv, int *i, hearth_err *err,
                         int *rc)
{
    struct {
        const char *name, *what;
        const char **slot;
    } opts[] = {
        { "--config", "file name", &a->config },
        { "--out", "directory name", &a->out_dir },
        { "--resume", "directory name", &a->resume },
        { "--init-from", "directory name", &a->init_from },
        { "--export-hf", "directory name", &a->export_hf },
        { "--export-dtype", "dtype", &a->export_dtype },
    };
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        const char *val = NULL;
        if (!opt_value(opts[k].name, argc, argv, i, &val, err, rc))
            continue;
        if (*rc)
            return 1;
        if (*opts[k].slot)
            *rc = herr_set(err, HERR_CONFIG, "%s: given twice", opts[k].name);
        else if (!*val)
            *rc = herr_set(err, HERR_CONFIG, "%s: empty %s", opts[k].name, opts[k].what);
        else
            *opts[k].slot = val;
        return 1;
    }
    return 0;
}

int cli_parse(cli_args *a, int argc, char **argv, hearth_err *err)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL;
        int rc = 0;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            a->help = 1;
        } else if (!strcmp(arg, "--version")) {
            a->version = 1;
        } else if (!strcmp(arg, "--check-bootstrap")) {
            a->check_bootstrap = 1;
        } else if (!strcmp(arg, "--force")) {
            a->force = 1;
        } else if (!strcmp(arg, "--plan-memory")) {
            a->plan_memory = 1;
        } else if (!strcmp(arg, "--bench-layers")) {
            a->bench_layers = 1;
        } else if (!strcmp(arg, "--capabilities")) {
            a->capabilities = 1;
        } else if (string_option(a, argc, argv, &i, err, &rc)) {
            if (rc)
                return rc;
        } else if (opt_value("--set", argc, argv, &i, &val, err, &rc)) {
            if (rc)
                return rc;
            if ((rc = add_override(a, val, err)))
                return rc;
        } else if (arg[0] == '-') {
            return herr_set(err, HERR_CONFIG, "%s: unknown option", arg);
        } else {
            return herr_set(err, HERR_CONFIG, "%s: unexpected argument", arg);
        }
    }
    if (a->help || a->version)
        return 0;
    if (a->capabilities) {
        if (argc > 2)
            return herr_set(err, HERR_CONFIG, "--capabilities: takes no other option");
        return 0;
    }
    if (a->check_bootstrap) {
        if (a->config || a->out_dir || a->n_ovr || a->resume || a->force || a->plan_memory)
            return herr_set(err, HERR_CONFIG, "--check-bootstrap: takes no other option");
        return 0;
    }
    /* the modes that only read a config: no run to resume, start from or export */
    if (a->plan_memory || a->bench_layers) {
        const char *mode = a->plan_memory ? "--plan-memory" : "--bench-layers";
        if (a->resume || a->force || a->init_from || a->export_hf || a->export_dtype ||
            (a->plan_memory && a->bench_layers))
            return herr_set(err, HERR_CONFIG, "%s: takes only --config, --set and --out%s",
                            mode, a->plan_memory ? " (which it ignores)" : "");
        if (a->bench_layers && !a->out_dir)
            return herr_set(err, HERR_CONFIG, "--out: missing (the benchmark's directory)");
        if (!a->config && a->n_ovr == 0)
            return herr_set(err, HERR_CONFIG, "--config: missing (give a run config, or at "
                            "least --set model=PRESET)");
        return 0;
    }
    if (!a->out_dir)
        return herr_set(err, HERR_CONFIG, "--out: missing (the run directory is required)");
    if (a->export_dtype && strcmp(a->export_dtype, "f32") && strcmp(a->export_dtype, "bf16"))
        return herr_set(err, HERR_CONFIG, "--export-dtype: %s: expected f32 or bf16",
                        a->export_dtype);
    if (a->export_dtype && !a->export_hf)
        return herr_set(err, HERR_CONFIG, "--export-dtype: needs --export-hf DIR");
    if (a->force && a->resume)
        return herr_set(err, HERR_CONFIG, "--force: not with --resume (a resumed run "
                        "continues the results in its directory)");
    if (!a->config && a->n_ovr == 0 && !a->resume)
        return herr_set(err, HERR_CONFIG, "--config: missing (give a run config, or at "
                        "least --set model=PRESET, or --resume a checkpoint)");
    return 0;
}
