/* cli.c - the command table of `hearth` and the parser it drives.  See cli.h. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cmd.h"
#include "shape/fields.h"
#include "shape/version.h"

#define FORMAT_HELP "output format: table, csv or json (default table)"
#define SET_HELP "override a key of the spec, VALUE in YAML (a scalar or a flow list): a " \
    "base run-config key (train.lr=1e-3 or base.train.lr=1e-3), resources.KEY, " \
    "matrix.KEY=[a,b], or a top-level key (name, repeat, where, ...); repeatable, the " \
    "last one of a key wins"

/* How the slurmrest backend is reached (submit, bench layers). */
#define REST_OPTS \
    { "rest-url", 0, "URL", NULL, "slurmrest: slurmrestd's address, http://HOST:PORT or " \
      "unix:/PATH (default $HEARTH_SLURMREST_URL)" }, \
    { "rest-token-file", 0, "FILE", NULL, "slurmrest: file holding a JWT from `scontrol " \
      "token`, mode 600 or stricter (default $HEARTH_SLURMREST_TOKEN_FILE, else the token " \
      "in $SLURM_JWT)" }

const hcli_opt hcli_global_opts[] = {
    { "db", 0, "FILE", NULL, "results database (default $HEARTH_DB, else the config file's "
      "db, else ./hearth.db)" },
    { "runs-dir", 0, "DIR", NULL, "run directories (default $HEARTH_RUNS_DIR, else the config "
      "file's runs_dir, else runs/ beside the database)" },
    { "help", 'h', NULL, NULL, "show this help and exit" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt plan_opts_tab[] = {
    { "set", 0, "KEY=VALUE", NULL, SET_HELP },
    { "format", 0, "FMT", "table|json", "output format: table or json (default table)" },
    { "force", 0, NULL, NULL, "plan points again even when their runs already completed" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt submit_opts[] = {
    { "set", 0, "KEY=VALUE", NULL, SET_HELP " (the experiment records the spec with the "
      "overrides applied)" },
    { "backend", 0, "NAME", "local|slurm|slurmrest", "where jobs run (default $HEARTH_BACKEND, "
      "else the config file's backend, else local)" },
    REST_OPTS,
    { "jobs", 'j', "N", NULL, "run at most N jobs at once (default: CPUs / cpus_per_task)" },
    { "dry-run", 'n', NULL, NULL, "show what would be created and run; change nothing" },
    { "force", 0, NULL, NULL, "run points again even when their runs already completed" },
    { "detach", 'd', NULL, NULL, "return at once; a background runner finishes the sweep "
      "(log: RUNS_DIR/EXPERIMENT/runner.log)" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt status_opts[] = {
    { "all", 'a', NULL, NULL, "without EXP: also list archived experiments (`hearth "
      "archive`), with an archived column" },
    { "tag", 0, "TAG", NULL, "without EXP: only the experiments tagged TAG (`hearth tag`)" },
    { "format", 0, "FMT", "table|csv|json", FORMAT_HELP },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt format_opts[] = {
    { "format", 0, "FMT", "table|csv|json", FORMAT_HELP },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt rm_opts[] = {
    { "delete-runs", 0, NULL, NULL, "also delete the run directories (RUNS_DIR/EXP, every "
      "log, checkpoint and result file in it); without it they stay" },
    { "force", 'f', NULL, NULL, "cancel the runs whose jobs are still alive (as `hearth "
      "cancel` does) instead of refusing; a working runner still refuses" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt wait_opts[] = {
    { "timeout", 0, "SECONDS", NULL, "give up after this long (exit 1; default: no limit)" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt no_opts[] = {
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt resume_opts[] = {
    { "jobs", 'j', "N", NULL, "run at most N jobs at once (default: CPUs / cpus_per_task)" },
    { "include-cancelled", 0, NULL, NULL, "also run the runs that were cancelled (`hearth "
      "cancel`) again, each from its checkpoint when it has one" },
    { "detach", 'd', NULL, NULL, "return at once; a background runner finishes the sweep" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt logs_opts[] = {
    { "follow", 'f', NULL, NULL, "keep printing new output until the run ends" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt query_opts_tab[] = {
    { "experiment", 'e', "EXP", NULL, "only this experiment's runs (archived or not)" },
    { "all", 'a', NULL, NULL, "also the runs of archived experiments (`hearth archive`)" },
    { "order", 0, "KEY", NULL, "order by KEY ascending, or -KEY descending" },
    { "limit", 0, "N", NULL, "at most N rows" },
    { "columns", 0, "A,B,...", NULL, "columns to show: run fields, result fields, config keys" },
    { "format", 0, "FMT", "table|csv|json", FORMAT_HELP },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt show_opts[] = {
    { "format", 0, "FMT", "table|csv|json", FORMAT_HELP },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt top_opts[] = {
    { "by", 0, "KEY", NULL, "rank by KEY (default tokens_per_s; -KEY/+KEY force the order)" },
    { "filter", 0, "EXPR", NULL, "only runs where EXPR is true" },
    { "limit", 0, "N", NULL, "at most N rows (default 10)" },
    { "columns", 0, "A,B,...", NULL, "columns to show" },
    { "format", 0, "FMT", "table|csv|json", FORMAT_HELP },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt export_opts[] = {
    { "format", 0, "FMT", "csv|json|table", "output format: csv, json or table (default csv)" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt check_opts_tab[] = {
    { "against", 0, "EXP", NULL, "baseline: the completed runs of experiment EXP (default: "
      "the best earlier runs of each point in other experiments)" },
    { "reference", 0, "FILE", NULL, "baseline: a reference file (YAML or JSON; "
      "docs/check.md)" },
    { "write-reference", 0, "FILE", NULL, "record EXP's per-point medians as a reference "
      "file instead of checking" },
    { "tol", 0, "FIG=PCT,...", NULL, "tolerances in percent, or off (defaults: "
      "tokens_per_s 5, step_ms_median 5, mfu 5, peak_mem_bytes 5, final_loss 2)" },
    { "figures", 0, "A,B,...", NULL, "figures to compare (default all: tokens_per_s, "
      "step_ms_median, mfu, peak_mem_bytes, final_loss)" },
    { "strict", 0, NULL, NULL, "also fail when a point has no baseline or no completed run, "
      "or a reference point was not run" },
    { "format", 0, "FMT", "table|csv|json", FORMAT_HELP },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt select_opts[] = {
    { "model", 0, "M", NULL, "model preset" },
    { "seq", 0, "S", NULL, "fp8: token count the policy is for (required); encoder: "
      "sequence length (default the run config's)" },
    { "gpu", 0, "NAME", NULL, "fp8: layer benchmarks of this GPU (default the newest set)" },
    { "threshold", 0, "X", NULL, "fp8: least speedup that earns FP8 (default 1.05)" },
    { "max-err", 0, "E", NULL, "fp8: largest FP8 relative error accepted (default 0.1)" },
    { "allow", 0, "LIST", NULL, "fp8: also allow FP8 for lm_head, router, edges (first and "
      "last decoder layer), comma-separated" },
    { "out", 'o', "FILE", NULL, "fp8: the policy file to write (required)" },
    { "set", 0, "KEY=VALUE", NULL, "fp8: a run config key of the run the policy is for "
      "(as hearth-train --set: train.micro_batch, data.images_max, ...); with --set, each "
      "component's token count is that of one rank's micro batch, as `precision.fp8: "
      "auto` resolves it, and --seq is train.seq_len" },
    { "gpus", 0, "N", NULL, "encoder: ranks (required)" },
    { "layout", 0, "K=V,...", NULL, "encoder: fix the decoder layout and batch (tp, pp, vpp, "
      "cp, ep, sp, micro_batch, global_batch); default: every tp x pp" },
    { "device", 0, "DEV", "cuda|cpu", "encoder: device of the runs to match (default cuda)" },
    { "repeat", 0, "N", NULL, "encoder: runs per point in the printed sweep (default 3)" },
    { "format", 0, "FMT", "table|csv|json", "encoder: " FORMAT_HELP },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt bench_opts[] = {
    { "model", 0, "M", NULL, "layers: model preset to benchmark (instead of a SPEC)" },
    { "device", 0, "DEV", "cuda|cpu", "layers --model: the device to measure on (default "
      "cuda; cpu times the fp32 reference against the FP8 emulation, for tests)" },
    { "trainer", 0, "PATH", NULL, "layers --model: hearth-train to run (default the one "
      "beside hearth)" },
    { "set", 0, "KEY=VALUE", NULL, "layers SPEC: " SET_HELP },
    { "backend", 0, "NAME", "local|slurm|slurmrest", "layers: where the benchmark's job runs "
      "(default $HEARTH_BACKEND, else the config file's backend, else local)" },
    { "timeout", 0, "SECONDS", NULL, "layers: cancel the job and fail when it has not ended "
      "after this long (default: no limit)" },
    REST_OPTS,
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt report_opts[] = {
    { "svg", 0, "FILE", NULL, "write the charts as one SVG file" },
    { "html", 0, "FILE", NULL, "write a self-contained HTML page: the charts and tables" },
    { "runs", 0, "ID,ID,...", NULL, "draw the loss curves of these runs (default: the best "
      "by tokens/s)" },
    { "best", 0, "N", NULL, "without --runs: the loss curves of the N best runs (default 5)" },
    { NULL, 0, NULL, NULL, NULL },
};

static const hcli_opt man_opts[] = {
    { "trainer", 0, "PATH", NULL, "hearth-train: the trainer whose --help to convert "
      "(default the one beside hearth)" },
    { NULL, 0, NULL, NULL, NULL },
};

const hcli_cmd hcli_commands[] = {
    { "plan", "SPEC", 1, 1, "expand a spec into points: kept, pruned (with the rule), skipped",
      "Expands the experiment spec's matrix, checks every point against the layout rules "
      "and skips points whose runs already completed in the database.", plan_opts_tab, cmd_plan },
    { "submit", "SPEC", 1, 1, "create the spec's runs and run them",
      "Records the experiment, writes each new run's config and job script into "
      "RUNS_DIR/EXPERIMENT/RUN-ID/ and runs the jobs (the local backend runs them here, "
      "in the foreground unless --detach).  Points whose runs already completed are "
      "skipped unless --force.  Safe to kill and run again: finished runs are recorded, "
      "running jobs are waited for, and no completed point runs twice.",
      submit_opts, cmd_submit },
    { "status", "[EXP]", 0, 1, "runs per state, per experiment (or the runs of EXP)",
      "Without EXP, one line per experiment in the order they were created: its runs per "
      "state (a cancelled run counts as cancelled, never as failed), its tags, when it was "
      "created and the runner working on it, if any.  Archived experiments are left out "
      "unless --all.  With EXP, one line per run of EXP (archived or not).", status_opts,
      cmd_status },
    { "wait", "EXP", 1, 1, "block until no run of EXP is in flight",
      "Exit 0 when every point of EXP has a completed run, 1 when some have none (or when no runner is left to finish the runs in flight).", wait_opts, cmd_wait },
    { "cancel", "EXP|RUN...", 1, -1, "cancel the unfinished runs of an experiment, or runs",
      NULL, no_opts, cmd_cancel },
    { "resume", "EXP", 1, 1, "finish an experiment's sweep: recover and run its pending runs",
      "Like running submit again without the spec: finished jobs are recorded (from "
      "RUN_DIR/exit_code, or from the trainer's result.json when the job script died before "
      "it), live ones waited for, vanished ones replaced, pending ones run.  Runs interrupted "
      "with their runner (SIGINT, SIGTERM or SIGHUP to `hearth submit` or `hearth resume`, "
      "e.g. Ctrl-C) are requeued, not cancelled, and continue from their checkpoint when "
      "they left one (the trainer writes one on SIGTERM), else from the start.  Runs "
      "cancelled with `hearth cancel` stay cancelled unless --include-cancelled.", resume_opts,
      cmd_resume },
    { "rm", "EXP...", 1, -1, "remove experiments (run directories only with "
      "--delete-runs)",
      "Removes each EXP with all its runs, their history, metrics and results, its tags and "
      "the `auto` decisions made for it, in one transaction: all of it or nothing.  Asks "
      "nothing.  Refused (exit 1, nothing removed) while a runner works on EXP, and while "
      "runs of EXP are submitted or running unless --force.  The run directories stay "
      "unless --delete-runs, and `hearth ingest RUNS_DIR/EXP` records them again (so does "
      "a plain `hearth ingest`).  Prints what it removed.", rm_opts, cmd_rm },
    { "archive", "EXP...", 1, -1, "hide experiments from `status` and `query` listings",
      "An archived experiment keeps every run and result: plan dedup, `check` baselines "
      "and `select` still use them, and commands that name it (status EXP, top, report, "
      "export, query -e) work as before.  `status --all` and `query --all` list it.",
      no_opts, cmd_archive },
    { "unarchive", "EXP...", 1, -1, "list archived experiments again", NULL, no_opts,
      cmd_unarchive },
    { "tag", "EXP TAG...", 2, -1, "tag an experiment (`status --tag TAG` lists a tag's)",
      "A tag is 1 to 64 characters of A-Z a-z 0-9 . _ : @ + - and does not start with -.  "
      "Tagging twice changes nothing.", no_opts, cmd_tag },
    { "untag", "EXP TAG...", 2, -1, "remove tags from an experiment", NULL, no_opts,
      cmd_untag },
    { "logs", "RUN", 1, 1, "print a run's stdout and stderr", NULL, logs_opts, cmd_logs },
    { "query", "[FILTER]", 0, 1, "runs matching a filter expression, as a table, CSV or JSON",
      "FILTER is an expression over run fields, result fields and config keys, e.g. "
      "'parallel.tp >= 2 and tokens_per_s > 1000'.", query_opts_tab, cmd_query },
    { "show", "RUN", 1, 1, "one run: record, result, metrics summary, config, history", NULL,
      show_opts, cmd_show },
    { "compare", "RUN RUN", 2, 2, "two runs: config differences and result ratios", NULL,
      show_opts, cmd_compare },
    { "top", "EXP", 1, 1, "an experiment's completed runs, best first", NULL, top_opts,
      cmd_top },
    { "export", "EXP", 1, 1, "every run of an experiment with all fields and config keys",
      NULL, export_opts, cmd_export },
    { "ingest", "[DIR...]", 0, -1, "record run directories in the database: rebuilds a "
      "lost one",
      "Records every run found in DIR (a run directory, RUNS_DIR/EXPERIMENT or RUNS_DIR; "
      "default the runs directory) that the database lacks: its experiment, config, state "
      "and results, from job.json, run.yaml and the job's files.  This is how a database "
      "that was deleted or replaced comes back (docs/database.md).  Runs the database has "
      "already are left as they are and counted, so running it twice records nothing "
      "twice.  Runs that had started are settled as `resume` would find them (ended ones "
      "recorded, live ones left running); then `hearth resume EXP` finishes the sweep.  "
      "An experiment whose runner is still working is left alone.", no_opts, cmd_ingest },
    { "check", "EXP", 1, 1, "hold an experiment's figures against a baseline: exit 1 on a "
      "regression",
      "Compares each point's median tokens/s, step time, MFU, peak memory and final loss "
      "over its repeats (the spread shown beside) with a baseline's: the best earlier "
      "runs of the same config hash in other experiments, --against EXP2, or --reference "
      "FILE.  Points match by config hash.  A figure worse than the baseline by more than "
      "its tolerance is REGRESSED.  Exit 0 when all are within tolerance, 1 on a "
      "regression (with --strict also when a point has no baseline), 2 on a usage error "
      "(docs/check.md).", check_opts_tab, cmd_check },
    { "bench", "ingest FILE...|layers [SPEC]", 1, -1, "record layer benchmarks "
      "(layer_bench.json)",
      "`bench ingest FILE...` records layer_bench.json files (docs/select.md); the same "
      "file twice is recorded once.  `bench layers SPEC` or `bench layers --model M` runs "
      "`hearth-train --bench-layers` as one job of the backend (local: on this machine; "
      "slurm, slurmrest: one task on one node, with one GPU on cuda), waits for it, and "
      "records the file it wrote, with the GPU, build and date that measured it.  From a "
      "SPEC it measures the first point the plan keeps, with that point's model, device, "
      "layout, resources, setup lines and trainer.  A job that fails records nothing; the "
      "error names the job and its log (RUNS_DIR/bench-layers/NAME-TIME/stderr.log).",
      bench_opts, cmd_bench },
    { "select", "fp8|encoder", 1, 1, "choose an FP8 policy or an encoder layout from "
      "measurements",
      "`select fp8 --model M --seq S --out FILE` writes the selective FP8 policy that the "
      "newest layer benchmarks of M support.  `select encoder --model M --gpus N` ranks "
      "the encoder layouts by measured tokens/s of completed runs, the cost model filling "
      "in where none ran, and prints the sweep that would measure the rest.  Both record "
      "the decision with its evidence (docs/select.md).", select_opts, cmd_select },
    { "report", "EXP", 1, 1, "an experiment's results as charts: SVG, HTML",
      "Draws tokens/s per config (the median of its repeats, min-max as an error bar), "
      "tokens/s over nodes or devices when those vary, the loss curves of chosen runs and "
      "the experiment's selection decisions with their evidence (docs/report.md).  Each "
      "file is replaced whole or not at all.", report_opts, cmd_report },
    { "config", "show", 1, 1, "the effective defaults and where each came from",
      "Defaults come from the command line, else the environment, else the config file "
      "($XDG_CONFIG_HOME/hearth/config.yaml, else ~/.config/hearth/config.yaml), else "
      "built-in values (docs/hearth-config.md).", format_opts, cmd_config },
    { "completion", "bash|zsh|experiments|runs", 1, 1, "print the shell completion script",
      "Generated from the same command table as the parser: `hearth completion bash > "
      "/usr/share/bash-completion/completions/hearth`, or `source <(hearth completion "
      "bash)`; for zsh, save it as _hearth in a directory of $fpath.  The scripts complete "
      "EXP and RUN arguments with the names in the database (`hearth completion "
      "experiments|runs` prints them, one a line; the --db of the command line being "
      "completed is used).", no_opts,
      cmd_completion },
    { "man", "hearth|hearth-train|hearth-spec", 1, 1, "print a manual page (roff)",
      "hearth(1) from the command table, hearth-train(1) from `hearth-train --help`, "
      "hearth-spec(5) from the spec and run-config key tables: `hearth man hearth | man "
      "-l -`.  `make install` installs all three.", man_opts, cmd_man },
    { NULL, NULL, 0, 0, NULL, NULL, NULL, NULL },
};

const hcli_cmd *hcli_find(const char *name)
{
    for (const hcli_cmd *c = hcli_commands; c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

void hcli_print_usage(FILE *f)
{
    fprintf(f, "usage: hearth [--db FILE] [--runs-dir DIR] COMMAND [ARGS] [OPTIONS]\n\n"
               "Plans, runs and records sweeps of hearth-train runs.\n\ncommands:\n");
    for (const hcli_cmd *c = hcli_commands; c->name; c++) {
        char head[64];
        snprintf(head, sizeof head, "%s %s", c->name, c->args);
        fprintf(f, "  %-22s %s\n", head, c->summary);
    }
    fprintf(f, "\nglobal options:\n");
    for (const hcli_opt *o = hcli_global_opts; o->name; o++) {
        char head[64];
        snprintf(head, sizeof head, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        fprintf(f, "  %-22s %s\n", head, o->help);
    }
    fprintf(f, "\nexit status: 0 ok, 1 some runs failed (check: a figure regressed), 2 usage "
               "or spec error.\n"
               "'hearth COMMAND --help' describes a command.\n");
}

/* Writes `text` wrapped at 80 columns, continuation lines indented by `indent`, the first
 * line starting at column `col`. */
static void print_wrapped(FILE *f, const char *text, int indent, int col)
{
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        size_t w = strcspn(p, " ");
        if (col > indent && col + 1 + (int)w > 80) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)w, p);
        col += (int)w;
        p += w;
    }
    fputc('\n', f);
}

static void print_opts(const hcli_opt *opts, FILE *f)
{
    for (const hcli_opt *o = opts; o->name; o++) {
        char head[80];
        int n = 0;
        if (o->short_name)
            n = snprintf(head, sizeof head, "-%c, ", o->short_name);
        else
            n = snprintf(head, sizeof head, "    ");
        snprintf(head + n, sizeof head - (size_t)n, "--%s%s%s", o->name, o->arg ? " " : "",
                 o->arg ? o->arg : "");
        fprintf(f, "  %-24s ", head);
        if (strlen(head) > 24)
            fprintf(f, "\n%*s", 27, "");
        print_wrapped(f, o->help, 27, 27);
    }
}

void hcli_print_command_help(const hcli_cmd *cmd, FILE *f)
{
    fprintf(f, "usage: hearth %s %s [OPTIONS]\n\n%c%s.\n", cmd->name, cmd->args,
            toupper((unsigned char)cmd->summary[0]), cmd->summary + 1);
    if (cmd->help)
        print_wrapped(f, cmd->help, 0, 0);
    if (cmd->opts[0].name) {
        fprintf(f, "\noptions:\n");
        print_opts(cmd->opts, f);
    }
    fprintf(f, "\nglobal options:\n");
    print_opts(hcli_global_opts, f);
}

static int opt_index(const hcli_opt *opts, const char *name, size_t len, char short_name)
{
    for (int i = 0; opts[i].name; i++) {
        if (short_name ? opts[i].short_name == short_name
                       : strlen(opts[i].name) == len && memcmp(opts[i].name, name, len) == 0)
            return i;
    }
    return -1;
}

static int n_opts(const hcli_opt *opts)
{
    int n = 0;
    while (opts[n].name)
        n++;
    return n;
}

static int check_choice(const hcli_opt *o, const char *v)
{
    if (!o->choices)
        return 1;
    size_t len = strlen(v);
    for (const char *p = o->choices; *p; ) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && memcmp(p, v, n) == 0)
            return 1;
        p += n + (bar ? 1 : 0);
    }
    return 0;
}

static int usage_error(const char *cmd, const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "hearth%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry 'hearth %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
    return HCLI_EXIT_USAGE;
}

/* "unknown command 'stauts' (did you mean 'status'?)": the same suggestion as for a
 * misspelt spec or config key (shape/fields.h). */
static int unknown_command(const char *name)
{
    field_suggestion sg;
    field_suggest_init(&sg);
    for (const hcli_cmd *c = hcli_commands; c->name; c++)
        field_suggest_add(&sg, name, c->name);
    field_suggest_add(&sg, name, "help");
    const char *best = field_suggest_result(&sg, name);
    char hint[200] = "";
    if (best)
        snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
    return usage_error(NULL, "unknown command '%s'%s", name, hint);
}

/* Global options live in gvals[], the command's in vals[]. */
typedef struct {
    const hcli_cmd *cmd;
    const char **vals;
    const char *gvals[8];
    char **pos;
    int npos;
    int *occ_opt;             /* every command option given, in order: its index ... */
    const char **occ_val;     /* ... and value (repeatable options such as --set) */
    int n_occ;
} parsed;

/* Handles one option argument at argv[*i]; returns 0 or an exit code. */
static int parse_option(parsed *p, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    const char *cmdname = p->cmd ? p->cmd->name : NULL;
    const hcli_opt *tables[2] = { p->cmd ? p->cmd->opts : NULL, hcli_global_opts };
    const char **stores[2] = { p->vals, p->gvals };
    int is_long = a[1] == '-';
    const char *name = a + (is_long ? 2 : 1);
    const char *eq = is_long ? strchr(name, '=') : NULL;
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    for (int t = 0; t < 2; t++) {
        if (!tables[t])
            continue;
        int k = is_long ? opt_index(tables[t], name, len, 0) : opt_index(tables[t], NULL, 0, name[0]);
        if (k < 0)
            continue;
        const hcli_opt *o = &tables[t][k];
        const char *val;
        if (!o->arg) {
            if (eq || (!is_long && name[1]))
                return usage_error(cmdname, "option %s takes no value%s", a, "");
            val = "";
        } else if (eq) {
            val = eq + 1;
        } else if (!is_long && name[1]) {
            val = name + 1;
        } else if (*i + 1 < argc) {
            val = argv[++*i];
        } else {
            return usage_error(cmdname, "option %s needs a value (%s)", a, o->arg);
        }
        if (o->arg && !check_choice(o, val)) {
            char opt[128];
            snprintf(opt, sizeof opt, "--%s %s", o->name, val);
            return usage_error(cmdname, "%s: expected one of %s", opt, o->choices);
        }
        stores[t][k] = val;
        if (t == 0) {
            p->occ_opt[p->n_occ] = k;
            p->occ_val[p->n_occ++] = val;
        }
        return 0;
    }
    char shown[128];
    snprintf(shown, sizeof shown, "%.*s", (int)(is_long ? len + 2 : 2), a);
    return usage_error(cmdname, "unknown option %s%s", shown,
                       p->cmd ? "" : " (global options come before or after the command)");
}

int hcli_main(int argc, char **argv)
{
    parsed p = { 0 };
    p.pos = calloc((size_t)argc + 1, sizeof *p.pos);
    p.occ_opt = calloc((size_t)argc + 1, sizeof *p.occ_opt);
    p.occ_val = calloc((size_t)argc + 1, sizeof *p.occ_val);
    const char **vals = NULL;
    int rc = 0, no_more_opts = 0, want_help = 0;
    if (!p.pos || !p.occ_opt || !p.occ_val) {
        fprintf(stderr, "hearth: out of memory\n");
        free(p.pos);
        free(p.occ_opt);
        free(p.occ_val);
        return HCLI_EXIT_FAILED;
    }
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (!no_more_opts && strcmp(a, "--") == 0) {
            no_more_opts = 1;
        } else if (!no_more_opts && a[0] == '-' && a[1]) {
            if (!p.cmd && strcmp(a, "--version") == 0) {
                /* The same release and git description as hearth-train's (version.h). */
                const char *git = version_git_describe();
                printf("hearth %s%s%s%s\n", version_release(), git ? " (" : "", git ? git : "",
                       git ? ")" : "");
                free(p.pos);
                free(p.occ_opt);
                free(p.occ_val);
                return HCLI_EXIT_OK;
            }
            rc = parse_option(&p, argc, argv, &i);
        } else if (!p.cmd) {
            if (strcmp(a, "help") == 0) {
                want_help = 1;
                if (i + 1 < argc && hcli_find(argv[i + 1]))
                    p.cmd = hcli_find(argv[++i]);
                break;
            }
            p.cmd = hcli_find(a);
            if (!p.cmd)
                rc = unknown_command(a);
            else if (!(vals = calloc((size_t)n_opts(p.cmd->opts) + 1, sizeof *vals)))
                rc = HCLI_EXIT_FAILED;
            p.vals = vals;
        } else {
            p.pos[p.npos++] = argv[i];
        }
    }
    int help_idx = opt_index(hcli_global_opts, "help", 4, 0);
    if (!rc && (want_help || p.gvals[help_idx])) {
        if (p.cmd)
            hcli_print_command_help(p.cmd, stdout);
        else
            hcli_print_usage(stdout);
    } else if (!rc && !p.cmd) {
        hcli_print_usage(stderr);
        rc = HCLI_EXIT_USAGE;
    } else if (!rc && (p.npos < p.cmd->min_args ||
                       (p.cmd->max_args >= 0 && p.npos > p.cmd->max_args))) {
        rc = usage_error(p.cmd->name, "expected %s, got %s", p.cmd->args,
                         p.npos < p.cmd->min_args ? "too few arguments"
                                                  : "too many arguments");
    } else if (!rc) {
        hcli_ctx c = { 0 };
        c.cmd = p.cmd;
        c.argc = p.npos;
        c.argv = p.pos;
        c.values = vals;
        c.occ_opt = p.occ_opt;
        c.occ_val = p.occ_val;
        c.n_occ = p.n_occ;
        /* Defaults: command line > environment > config file > built-in (user_config.h). */
        ucfg cfg;
        hearth_err err = { { 0 } };
        int crc = ucfg_load(&cfg, NULL, &err);
        if (!crc)
            crc = ucfg_set_cmdline(&cfg, UCFG_DB, p.gvals[opt_index(hcli_global_opts, "db", 2, 0)],
                                   "--db", &err);
        if (!crc)
            crc = ucfg_set_cmdline(&cfg, UCFG_RUNS_DIR,
                                   p.gvals[opt_index(hcli_global_opts, "runs-dir", 8, 0)],
                                   "--runs-dir", &err);
        if (!crc)
            crc = ucfg_export_env(&cfg, &err);
        if (crc) {
            fprintf(stderr, "hearth: %s\n", err.msg);
            rc = crc == HERR_CONFIG ? HCLI_EXIT_USAGE : HCLI_EXIT_FAILED;
        } else {
            c.cfg = &cfg;
            c.db_path = ucfg_get(&cfg, UCFG_DB);
            c.runs_dir_opt = ucfg_get(&cfg, UCFG_RUNS_DIR);
            rc = p.cmd->run(&c);
        }
        ucfg_free(&cfg);
    }
    free(vals);
    free(p.pos);
    free(p.occ_opt);
    free(p.occ_val);
    return rc;
}

const char *hcli_get(const hcli_ctx *c, const char *name)
{
    int k = opt_index(c->cmd->opts, name, strlen(name), 0);
    return k < 0 ? NULL : c->values[k];
}

int hcli_count(const hcli_ctx *c, const char *name)
{
    int k = opt_index(c->cmd->opts, name, strlen(name), 0), n = 0;
    for (int i = 0; k >= 0 && i < c->n_occ; i++)
        n += c->occ_opt[i] == k;
    return n;
}

const char *hcli_get_nth(const hcli_ctx *c, const char *name, int nth)
{
    int k = opt_index(c->cmd->opts, name, strlen(name), 0);
    for (int i = 0; k >= 0 && i < c->n_occ; i++)
        if (c->occ_opt[i] == k && nth-- == 0)
            return c->occ_val[i];
    return NULL;
}

int hcli_flag(const hcli_ctx *c, const char *name)
{
    return hcli_get(c, name) != NULL;
}

int hcli_get_long(const hcli_ctx *c, const char *name, long def, long min, long *out,
                  hearth_err *err)
{
    const char *v = hcli_get(c, name);
    if (!v) {
        *out = def;
        return 0;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < min)
        return herr_set(err, HERR_CONFIG, "--%s %s: expected an integer >= %ld", name, v, min);
    *out = x;
    return 0;
}

int hcli_runs_dir(const hcli_ctx *c, char *buf, size_t size, hearth_err *err)
{
    char rel[PATH_MAX];
    if (c->runs_dir_opt && *c->runs_dir_opt) {
        snprintf(rel, sizeof rel, "%s", c->runs_dir_opt);
    } else {
        const char *slash = strrchr(c->db_path, '/');
        if (slash)
            snprintf(rel, sizeof rel, "%.*s/runs", (int)(slash - c->db_path), c->db_path);
        else
            snprintf(rel, sizeof rel, "runs");
        if (slash == c->db_path)
            snprintf(rel, sizeof rel, "/runs");
    }
    if (rel[0] == '/') {
        if ((size_t)snprintf(buf, size, "%s", rel) >= size)
            return herr_set(err, HERR_CONFIG, "%s: path too long", rel);
        return 0;
    }
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return herr_set(err, HERR_IO, "getcwd: %s", strerror(errno));
    if ((size_t)snprintf(buf, size, "%s/%s", cwd, rel) >= size)
        return herr_set(err, HERR_CONFIG, "%s: path too long", rel);
    return 0;
}

int hcli_fail(const hcli_ctx *c, int rc, const hearth_err *err)
{
    fprintf(stderr, "hearth %s: %s\n", c->cmd->name, err->msg);
    return rc == HERR_CONFIG ? HCLI_EXIT_USAGE : HCLI_EXIT_FAILED;
}
