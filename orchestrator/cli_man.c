/* cli_man.c - manual pages generated from the command, spec and run-config tables, and
 * from hearth-train's --help text.  See cli_doc.h. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_doc.h"
#include "shape/fields.h"
#include "spec.h"
#include "user_config.h"
#include "shape/version.h"

void cli_doc_roff_text(FILE *out, const char *text)
{
    int bol = 1;
    for (const char *p = text; *p; p++) {
        if (bol && (*p == '.' || *p == '\''))
            fputs("\\&", out);
        if (*p == '\\')
            fputs("\\e", out);
        else if (*p == '-')
            fputs("\\-", out);
        else
            fputc(*p, out);
        bol = *p == '\n';
    }
}

static void th(FILE *out, const char *name, int section, const char *manual)
{
    char upper[64];
    size_t i = 0;
    for (; name[i] && i + 1 < sizeof upper; i++)
        upper[i] = (char)toupper((unsigned char)name[i]);
    upper[i] = 0;
    fprintf(out, ".TH ");
    cli_doc_roff_text(out, upper);
    fprintf(out, " %d \"\" \"hearth %s\" \"%s\"\n", section, version_release(), manual);
}

/* ".TP" + "\fB--name\fR \fIARG\fR" (and the short form) + the help text. */
static void roff_opt(FILE *out, const hcli_opt *o)
{
    fprintf(out, ".TP\n");
    if (o->short_name)
        fprintf(out, "\\fB\\-%c\\fR, ", o->short_name);
    fprintf(out, "\\fB\\-\\-");
    cli_doc_roff_text(out, o->name);
    fprintf(out, "\\fR");
    if (o->arg) {
        fprintf(out, " \\fI");
        cli_doc_roff_text(out, o->arg);
        fprintf(out, "\\fR");
    }
    fputc('\n', out);
    cli_doc_roff_text(out, o->help);
    if (o->choices) {
        fprintf(out, " (one of: ");
        for (const char *p = o->choices; *p; p++) {
            if (*p == '|')
                fputs(", ", out);
            else if (*p == '-')
                fputs("\\-", out);
            else
                fputc(*p, out);
        }
        fputc(')', out);
    }
    fputc('\n', out);
}

static int finish(FILE *out, const char *what, hearth_err *err)
{
    if (fflush(out) || ferror(out))
        return herr_set(err, HERR_IO, "writing %s failed", what);
    return 0;
}

int cli_doc_man_hearth(FILE *out, hearth_err *err)
{
    th(out, "hearth", 1, "User Commands");
    fprintf(out, ".SH NAME\nhearth \\- plan, run and record sweeps of hearth\\-train runs\n"
                 ".SH SYNOPSIS\n.B hearth\n[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR "
                 "[\\fIARGS\\fR] [\\fIOPTIONS\\fR]\n.br\n.B hearth\n[\\fICOMMAND\\fR] "
                 "\\fB\\-\\-help\\fR\n.br\n.B hearth \\-\\-version\n"
                 ".SH DESCRIPTION\n"
                 "\\fBhearth\\fR expands an experiment spec (\\fBhearth\\-spec\\fR(5)) into "
                 "points, runs \\fBhearth\\-train\\fR(1) for each through a backend (local, "
                 "Slurm or slurmrestd), records every run, its result and per\\-step metrics "
                 "in an SQLite results database, and reads them back as tables, CSV, JSON "
                 "or charts.\nGlobal options are accepted before or after the command; "
                 "options take their value as \\fB\\-\\-opt VALUE\\fR or "
                 "\\fB\\-\\-opt=VALUE\\fR; \\fB\\-\\-\\fR ends the options.\n"
                 ".SH COMMANDS\n");
    for (const hcli_cmd *c = hcli_commands; c->name; c++) {
        fprintf(out, ".SS \"hearth ");
        cli_doc_roff_text(out, c->name);
        fputc(' ', out);
        cli_doc_roff_text(out, c->args);
        fprintf(out, "\"\n");
        char *s = strdup(c->summary);
        if (s && *s)
            s[0] = (char)toupper((unsigned char)s[0]);
        cli_doc_roff_text(out, s ? s : c->summary);
        free(s);
        fprintf(out, ".\n");
        if (c->help) {
            cli_doc_roff_text(out, c->help);
            fputc('\n', out);
        }
        if (c->opts[0].name) {
            fprintf(out, ".RS\n");
            for (const hcli_opt *o = c->opts; o->name; o++)
                roff_opt(out, o);
            fprintf(out, ".RE\n");
        }
    }
    fprintf(out, ".SH GLOBAL OPTIONS\n");
    for (const hcli_opt *o = hcli_global_opts; o->name; o++)
        roff_opt(out, o);
    fprintf(out, ".TP\n\\fB\\-\\-version\\fR\nprint the version (with the git description "
                 "of the build) and exit\n");
    fprintf(out, ".SH ENVIRONMENT\nEach default below is taken from the command line, "
                 "else the environment, else the configuration file, else the built\\-in "
                 "value (\\fBhearth config show\\fR prints them with their sources).  An "
                 "empty variable counts as unset.\n");
    for (int k = 0; k < UCFG_N; k++) {
        fprintf(out, ".TP\n.B ");
        cli_doc_roff_text(out, ucfg_env((ucfg_key)k));
        fprintf(out, "\n");
        cli_doc_roff_text(out, ucfg_help((ucfg_key)k));
        fprintf(out, " (config file key \\fB");
        cli_doc_roff_text(out, ucfg_name((ucfg_key)k));
        fprintf(out, "\\fR");
        if (ucfg_builtin((ucfg_key)k)) {
            fprintf(out, ", default \\fB");
            cli_doc_roff_text(out, ucfg_builtin((ucfg_key)k));
            fprintf(out, "\\fR");
        }
        fprintf(out, ")\n");
    }
    fprintf(out, ".TP\n.B HEARTH_TEMPLATES\ndirectories (colon\\-separated) searched first "
                 "for job\\-script templates\n"
                 ".SH FILES\n.TP\n.I $XDG_CONFIG_HOME/hearth/config.yaml\n"
                 "defaults (else \\fI~/.config/hearth/config.yaml\\fR): keys \\fBdb\\fR, "
                 "\\fBruns_dir\\fR, \\fBbackend\\fR, a \\fBslurm\\fR section (\\fBpartition"
                 "\\fR, \\fBaccount\\fR, \\fBqos\\fR, \\fBconstraint\\fR) and a \\fBslurmrest"
                 "\\fR section (\\fBurl\\fR, \\fBtoken_file\\fR)\n"
                 ".TP\n.I hearth.db\nthe results database, unless configured otherwise\n"
                 ".TP\n.I runs/EXPERIMENT/RUN\\-ID/\na run's directory beside the database: "
                 "run.yaml, job.sh, job.json, logs and the trainer's outputs\n"
                 ".TP\n.I runs/bench\\-layers/NAME\\-TIME/\na layer benchmark's directory "
                 "(\\fBhearth bench layers\\fR): the same files as a run's, its job's "
                 "layer_bench.json, and its log stderr.log; no run\n"
                 ".SH EXIT STATUS\n0 success; 1 some runs failed (\\fBcheck\\fR: a figure "
                 "regressed beyond its tolerance), or a runtime failure (database, files); "
                 "2 usage, spec or configuration error.\n"
                 ".SH SEE ALSO\n\\fBhearth\\-train\\fR(1), \\fBhearth\\-spec\\fR(5)\n");
    return finish(out, "the manual page", err);
}

/* ---- hearth-spec(5) ------------------------------------------------------------------ */

static const struct { const char *key, *doc; } spec_docs[] = {
    { "name", "the experiment's name (required): letters, digits, '.', '_' and '\\-', starting "
              "with a letter or digit; runs are named NAME\\-SEQ" },
    { "trainer", "the trainer to run (default: hearth\\-train beside hearth)" },
    { "base", "the run config every point starts from: a mapping of the run config keys "
              "below (a preset in \\fBmodel\\fR, \\fBtrain.*\\fR, \\fBparallel.*\\fR, ...)" },
    { "resources", "what each job gets: the resources keys below" },
    { "matrix", "a mapping of dotted keys to lists of values; the points are their cartesian "
                "product in spec order, the last key varying fastest" },
    { "zip", "a list of groups (mappings of dotted keys to lists of one length) whose lists "
             "advance together" },
    { "include", "a list of extra points (mappings of dotted keys to values)" },
    { "exclude", "a list of mappings: a point matching every key of one is dropped" },
    { "where", "an expression over the point's keys (e.g. \"parallel.tp * parallel.pp <= 8\"); "
               "points where it is false are dropped" },
    { "repeat", "runs per point (default 1): repeats share a config hash" },
    { "retries", "further attempts of a failed run (default 0)" },
    { "max_points", "the most candidate points the spec may expand to (default 100000): the "
                    "product of the \\fBmatrix\\fR and \\fBzip\\fR list lengths plus the "
                    "\\fBinclude\\fR entries, counted before \\fBexclude\\fR and "
                    "\\fBwhere\\fR; a spec over it is refused before any point is made, "
                    "naming the count" },
    { "after", "a mapping {experiment: NAME, on: ok|any}: start only after that experiment's "
               "runs ended (all completed, or ended at all)" },
    { "auto", "how \\fBauto\\fR values resolve: {fp8: {threshold: X, max_err: Y}}, the "
              "speedup (>= 1, default 1.05) and the largest FP8 error (default 0.1) that "
              "\\fBprecision.fp8: auto\\fR asks of a layer kind in the layer benchmarks" },
    { "nodes", "nodes per job (cuda runs)" },
    { "gpus_per_node", "GPUs per node (cuda runs; one rank per GPU)" },
    { "cpus_per_task", "CPU threads of a CPU run (the local backend runs CPUs / cpus_per_task "
                       "jobs at once)" },
    { "max_concurrent", "at most this many of the experiment's jobs at once" },
    { "time", "wall\\-time limit per run, in Slurm's format (MM, MM:SS, HH:MM:SS, D\\-HH, ...)" },
    { "partition", "Slurm partition (default: the config file's slurm.partition)" },
    { "account", "Slurm account (default: the config file's slurm.account)" },
    { "qos", "Slurm quality of service (default: the config file's slurm.qos)" },
    { "constraint", "Slurm node constraint (default: the config file's slurm.constraint)" },
    { "setup", "shell lines the job script runs before the trainer (not swept)" },
    { "sbatch", "extra sbatch options, passed as they are (not swept)" },
    { "retry_timeout", "a run that hit its time limit is retried too (not swept)" },
    { "pack", "Slurm: up to this many runs of one shape one after another in one job (not "
              "swept)" },
    { "gpu_mem", "GiB of memory per GPU: device cuda points whose predicted peak memory "
                 "(hearth\\-train \\-\\-plan\\-memory) exceeds it are pruned by rule "
                 "fits_gpu_mem (not swept)" },
};

/* The documentation of a spec key, or NULL (the test of the pages checks there is none). */
static const char *spec_doc(const char *key)
{
    for (size_t i = 0; i < sizeof spec_docs / sizeof *spec_docs; i++)
        if (strcmp(spec_docs[i].key, key) == 0)
            return spec_docs[i].doc;
    return NULL;
}

static void spec_key_list(FILE *out, spec_key_group g, const char *prefix, const char *type)
{
    for (const char *const *k = spec_keys(g); k && *k; k++) {
        fprintf(out, ".TP\n\\fB%s", prefix);
        cli_doc_roff_text(out, *k);
        fprintf(out, "\\fR%s%s\n", type ? " " : "", type ? type : "");
        const char *doc = spec_doc(*k);
        if (doc)
            fputs(doc, out);   /* roff already */
        else
            fputs("(undocumented)", out);
        fputc('\n', out);
    }
}

static const char *type_name(const field_desc *f)
{
    switch (f->type) {
    case FT_INT: case FT_I64: return "integer";
    case FT_DOUBLE: case FT_FLOAT: return "number";
    case FT_BOOL: case FT_BIAS_ALL: return "boolean";
    case FT_ENUM: return "one of";
    case FT_STR: return "string";
    case FT_INT3: return "list of 3 integers";
    case FT_INTLIST: return "list of integers";
    }
    return "value";
}

static void field_list(FILE *out, const field_desc *t, int n, const char *prefix)
{
    for (int i = 0; i < n; i++) {
        const field_desc *f = &t[i];
        fprintf(out, ".TP\n\\fB");
        cli_doc_roff_text(out, prefix);
        cli_doc_roff_text(out, f->key);
        fprintf(out, "\\fR (%s", type_name(f));
        if (f->type == FT_ENUM && f->names)
            for (int k = 0; f->names[k]; k++) {
                fputs(k ? ", " : " ", out);
                cli_doc_roff_text(out, f->names[k]);
            }
        if (f->def) {
            fputs("; default ", out);
            cli_doc_roff_text(out, f->def);
        } else {
            fputs("; required", out);
        }
        fputs(")\n", out);
        cli_doc_roff_text(out, f->doc && *f->doc ? f->doc : "(undocumented)");
        fputc('\n', out);
    }
}

int cli_doc_man_spec(FILE *out, hearth_err *err)
{
    th(out, "hearth-spec", 5, "File Formats");
    fprintf(out, ".SH NAME\nhearth\\-spec \\- the experiment spec that hearth plans and "
                 "submits\n"
                 ".SH SYNOPSIS\n.nf\nname: lr\\-sweep\nbase:\n  model: tiny\\-vlm\n  train: "
                 "{steps: 60, seq_len: 48}\nresources: {time: \"10:00\", cpus_per_task: 1}\n"
                 "matrix:\n  train.lr: [1e\\-3, 3e\\-3]\n  train.seed: [1, 2]\nrepeat: 2\n.fi\n"
                 ".SH DESCRIPTION\nAn experiment spec is a YAML file read by \\fBhearth plan"
                 "\\fR and \\fBhearth submit\\fR.  Its \\fBbase\\fR is a run config; "
                 "\\fBmatrix\\fR, \\fBzip\\fR and \\fBinclude\\fR sweep dotted keys of it (or "
                 "\\fBresources.\\fR keys), \\fBexclude\\fR and \\fBwhere\\fR drop points, and "
                 "points that break a layout rule are pruned with the rule named.  Every key "
                 "and every swept value is checked when the spec is read; errors read "
                 "\\fIFILE\\fR:\\fILINE\\fR:\\fICOL\\fR: \\fIKEY\\fR: what is wrong.\n"
                 ".SH TOP\\-LEVEL KEYS\n");
    spec_key_list(out, SPEC_KEYS_TOP, "", NULL);
    fprintf(out, ".SH RESOURCES\nKeys of \\fBresources\\fR; the swept ones may also be "
                 "written as \\fBresources.\\fIKEY\\fR in \\fBmatrix\\fR, \\fBzip\\fR and "
                 "\\fBinclude\\fR.\n");
    spec_key_list(out, SPEC_KEYS_RES_INT, "", "(integer)");
    spec_key_list(out, SPEC_KEYS_RES_STR, "", "(string)");
    spec_key_list(out, SPEC_KEYS_RES_LIST, "", "(list of strings)");
    spec_key_list(out, SPEC_KEYS_RES_BOOL, "", "(boolean)");
    spec_key_list(out, SPEC_KEYS_RES_SPEC_INT, "", "(integer)");
    spec_key_list(out, SPEC_KEYS_RES_SPEC_NUM, "", "(number)");
    fprintf(out, ".SH RUN CONFIG KEYS\nThe keys of \\fBbase\\fR and of swept points "
                 "(dotted).  \\fBmodel\\fR names a preset; its shape keys follow as "
                 "\\fBmodel.\\fIKEY\\fR.  A default \\fBauto\\fR is derived from other keys.\n");
    int n = 0;
    const field_desc *t = config_fields(&n);
    field_list(out, t, n, "");
    fprintf(out, ".SS \"Model keys\"\n");
    t = model_fields(&n);
    field_list(out, t, n, "model.");
    fprintf(out, ".SH OVERRIDES\n\\fBhearth plan\\fR and \\fBhearth submit\\fR take "
                 "\\fB\\-\\-set\\fR \\fIKEY\\fR=\\fIVALUE\\fR (repeatable, the last of a "
                 "key wins): \\fIKEY\\fR is a top\\-level key, \\fBbase.\\fIKEY\\fR or a bare "
                 "run\\-config key (a base key), \\fBresources.\\fIKEY\\fR, "
                 "\\fBmatrix.\\fIKEY\\fR or \\fBafter.\\fIKEY\\fR; \\fIVALUE\\fR is YAML "
                 "(\\fBmatrix.train.lr=[1e\\-3,3e\\-3]\\fR).  An override is checked like the "
                 "line it replaces; its errors name \\fB\\-\\-set\\fR \\fIKEY\\fR instead of "
                 "a line.  \\fBsubmit\\fR records the spec with the overrides applied.\n");
    fprintf(out, ".SH SEE ALSO\n\\fBhearth\\fR(1), \\fBhearth\\-train\\fR(1)\n");
    return finish(out, "the manual page", err);
}

/* ---- hearth-train(1) from its help text ------------------------------------------------ */

/* Indentation of a line (spaces). */
static int indent_of(const char *l)
{
    int n = 0;
    while (l[n] == ' ')
        n++;
    return n;
}

/* An option line "  --opt ARG   text": the head (up to two spaces) and where the text
 * starts.  Returns 0 when the line is not one. */
static int option_line(const char *l, size_t *head_len, const char **text)
{
    int ind = indent_of(l);
    if (ind < 1 || ind > 4 || l[ind] != '-')
        return 0;
    const char *gap = strstr(l + ind, "  ");
    *head_len = gap ? (size_t)(gap - (l + ind)) : strlen(l + ind);
    *text = gap ? gap + strspn(gap, " ") : l + ind + *head_len;
    return 1;
}

/* "--opt ARG" in bold option, italic argument. */
static void roff_head(FILE *out, const char *h, size_t n)
{
    char *s = strndup(h, n);
    if (!s)
        return;
    char *p = s;
    while (*p) {
        size_t w = strcspn(p, " ,|");
        char save = p[w];
        p[w] = 0;
        int opt = p[0] == '-';
        fprintf(out, opt ? "\\fB" : "\\fI");
        cli_doc_roff_text(out, p);
        fprintf(out, "\\fR");
        p[w] = save;
        p += w;
        while (*p == ' ' || *p == ',' || *p == '|')
            fputc(*p++, out);
    }
    free(s);
}

int cli_doc_help2man(const char *help, const char *prog, int section, const char *see_also,
                     FILE *out, hearth_err *err)
{
    char *text = strdup(help);
    if (!text)
        return herr_set(err, HERR_NOMEM, "out of memory");
    /* Lines, split in place. */
    size_t n = 0, cap = 64;
    char **lines = malloc(cap * sizeof *lines);
    for (char *p = text; lines && *p;) {
        if (n == cap) {
            char **g = realloc(lines, (cap *= 2) * sizeof *lines);
            if (!g) {
                free(lines);
                lines = NULL;
                break;
            }
            lines = g;
        }
        lines[n++] = p;
        char *nl = strchr(p, '\n');
        if (!nl)
            break;
        *nl = 0;
        p = nl + 1;
    }
    if (!lines) {
        free(text);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    size_t i = 0;
    if (n == 0 || strncmp(lines[0], "usage: ", 7) != 0) {
        free(lines);
        free(text);
        return herr_set(err, HERR_CONFIG, "%s --help: expected 'usage: ' first", prog);
    }
    /* SYNOPSIS: the usage line and every following non-blank line. */
    size_t syn_end = 1;
    while (syn_end < n && lines[syn_end][0])
        syn_end++;
    /* DESCRIPTION: the next paragraph. */
    size_t desc = syn_end;
    while (desc < n && !lines[desc][0])
        desc++;
    size_t desc_end = desc, hl;
    const char *t;
    while (desc_end < n && lines[desc_end][0] && !option_line(lines[desc_end], &hl, &t))
        desc_end++;
    /* NAME: the description's first sentence, lowercased first letter. */
    th(out, prog, section, "User Commands");
    fprintf(out, ".SH NAME\n");
    cli_doc_roff_text(out, prog);
    fprintf(out, " \\- ");
    char first[512] = "";
    for (size_t k = desc; k < desc_end; k++) {
        size_t len = strlen(first);
        snprintf(first + len, sizeof first - len, "%s%s", len ? " " : "", lines[k] + indent_of(lines[k]));
    }
    char *dot = strstr(first, ". ");
    if (dot)
        dot[0] = 0;
    else if ((dot = strrchr(first, '.')) && !dot[1])
        dot[0] = 0;
    if (first[0])
        first[0] = (char)tolower((unsigned char)first[0]);
    cli_doc_roff_text(out, first);
    fprintf(out, "\n.SH SYNOPSIS\n.nf\n");
    for (i = 0; i < syn_end; i++) {
        const char *l = i == 0 ? lines[0] + 7 : lines[i] + indent_of(lines[i]);
        fprintf(out, "%s", i && strncmp(l, prog, strlen(prog)) ? "    " : "");
        roff_head(out, l, strlen(l));
        fputc('\n', out);
    }
    fprintf(out, ".fi\n.SH DESCRIPTION\n");
    for (size_t k = desc; k < desc_end; k++) {
        cli_doc_roff_text(out, lines[k] + indent_of(lines[k]));
        fputc('\n', out);
    }
    /* OPTIONS and EXIT STATUS. */
    int in_opts = 0;
    for (i = desc_end; i < n; i++) {
        if (!lines[i][0])
            continue;
        if (option_line(lines[i], &hl, &t)) {
            if (!in_opts)
                fprintf(out, ".SH OPTIONS\n");
            in_opts = 1;
            fprintf(out, ".TP\n");
            roff_head(out, lines[i] + indent_of(lines[i]), hl);
            fputc('\n', out);
            cli_doc_roff_text(out, t);
            fputc('\n', out);
        } else if (strncmp(lines[i], "exit status:", 12) == 0) {
            fprintf(out, ".SH EXIT STATUS\n");
            cli_doc_roff_text(out, lines[i] + 12 + strspn(lines[i] + 12, " "));
            fputc('\n', out);
            while (i + 1 < n && lines[i + 1][0] && indent_of(lines[i + 1]) > 0) {
                i++;
                fprintf(out, ".br\n");
                cli_doc_roff_text(out, lines[i] + indent_of(lines[i]));
                fputc('\n', out);
            }
        } else {
            /* A continuation line of an option, or a paragraph of its own. */
            if (!in_opts || indent_of(lines[i]) == 0)
                fprintf(out, ".PP\n");
            cli_doc_roff_text(out, lines[i] + indent_of(lines[i]));
            fputc('\n', out);
        }
    }
    if (see_also)
        fprintf(out, ".SH SEE ALSO\n%s\n", see_also);
    free(lines);
    free(text);
    return finish(out, "the manual page", err);
}
