#include "cli.h"

#include <stdlib.h>
#include <string.h>

void cli_usage(FILE *f)
{
    fputs("usage: hearth-train --config FILE --out DIR [--set KEY=VALUE]...\n"
          "       hearth-train --set model=PRESET [--set KEY=VALUE]... --out DIR\n"
          "       hearth-train --check-bootstrap\n"
          "       hearth-train --help | --version\n"
          "\n"
          "Trains the model described by the run config FILE (YAML) and writes\n"
          "DIR/metrics.jsonl, DIR/result.json, DIR/config.json and DIR/train.log.\n"
          "\n"
          "  --config FILE      run config (optional when --set names the model)\n"
          "  --out DIR          run directory, created if missing\n"
          "  --set KEY=VALUE    override a config key, dotted (train.steps=10); repeatable,\n"
          "                     applied in order after the file\n"
          "  --check-bootstrap  join the job (PMIx under srun --mpi=pmix or mpirun, else\n"
          "                     RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, else one rank),\n"
          "                     exchange a blob with every rank, print what arrived;\n"
          "                     exit 0 only if every rank saw the same consistent blobs\n"
          "  --help             this text\n"
          "  --version          print the version\n"
          "\n"
          "exit status: 0 done, 1 runtime failure, 2 usage or config error,\n"
          "             3 diverged (loss NaN or infinite)\n", f);
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
        } else if (opt_value("--config", argc, argv, &i, &val, err, &rc)) {
            if (rc)
                return rc;
            if (a->config)
                return herr_set(err, HERR_CONFIG, "--config: given twice");
            if (!*val)
                return herr_set(err, HERR_CONFIG, "--config: empty file name");
            a->config = val;
        } else if (opt_value("--out", argc, argv, &i, &val, err, &rc)) {
            if (rc)
                return rc;
            if (a->out_dir)
                return herr_set(err, HERR_CONFIG, "--out: given twice");
            if (!*val)
                return herr_set(err, HERR_CONFIG, "--out: empty directory name");
            a->out_dir = val;
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
    if (a->check_bootstrap) {
        if (a->config || a->out_dir || a->n_ovr)
            return herr_set(err, HERR_CONFIG, "--check-bootstrap: takes no other option");
        return 0;
    }
    if (!a->out_dir)
        return herr_set(err, HERR_CONFIG, "--out: missing (the run directory is required)");
    if (!a->config && a->n_ovr == 0)
        return herr_set(err, HERR_CONFIG, "--config: missing (give a run config, or at "
                        "least --set model=PRESET)");
    return 0;
}
