/* cli.h - the `hearth` command line: ONE table of commands (name, synopsis, options with
 * their help, handler) that drives argument parsing, `hearth --help`, `hearth CMD --help`,
 * and the generated shell completion and manual pages (cli_doc.h).
 *
 *   hearth [GLOBAL OPTIONS] COMMAND [ARGS] [OPTIONS]
 *
 * Global options (accepted before or after the command): --db FILE (else $HEARTH_DB, else
 * the config file's db, else ./hearth.db), --runs-dir DIR (default: $HEARTH_RUNS_DIR, the
 * config file's runs_dir, else runs/ beside the database file), --help.
 * Options take their value as `--opt VALUE` or `--opt=VALUE` (short: `-j 4`, `-j4`);
 * `--` ends the options.
 *
 * Exit codes: 0 ok; 1 some runs failed (or the command failed at run time: a database or
 * file error); 2 usage or spec error.
 *
 * (Symbols are prefixed hcli_ because trainer/cli.h is hearth-train's command line.) */
#ifndef HEARTH_ORCH_CLI_H
#define HEARTH_ORCH_CLI_H

#include <stdio.h>

#include "shape/err.h"
#include "user_config.h"

enum { HCLI_EXIT_OK = 0, HCLI_EXIT_FAILED = 1, HCLI_EXIT_USAGE = 2 };

/* One option of a command. */
typedef struct {
    const char *name;         /* long name without "--" */
    char short_name;          /* 0: none */
    const char *arg;          /* metavar of its value ("N", "FILE"); NULL: a flag */
    const char *choices;      /* "table|csv|json" (checked, and for completion); NULL: free */
    const char *help;
} hcli_opt;

typedef struct hcli_ctx hcli_ctx;

typedef struct {
    const char *name;
    const char *args;         /* synopsis of the positional arguments ("SPEC", "[EXP]") */
    int min_args, max_args;   /* max_args -1: no limit */
    const char *summary;      /* one line, for `hearth --help` */
    const char *help;         /* a paragraph for `hearth CMD --help`; may be NULL */
    const hcli_opt *opts;     /* terminated by an entry with name NULL */
    int (*run)(hcli_ctx *c);  /* returns the exit code */
} hcli_cmd;

/* Every command (terminated by name NULL), and the global options. */
extern const hcli_cmd hcli_commands[];
extern const hcli_opt hcli_global_opts[];

/* What a handler gets. */
struct hcli_ctx {
    const hcli_cmd *cmd;
    int argc;                 /* positional arguments */
    char **argv;
    const char *db_path;      /* --db, $HEARTH_DB, the config file's db or ./hearth.db */
    const char *runs_dir_opt; /* --runs-dir, $HEARTH_RUNS_DIR or the config file's, or NULL */
    const ucfg *cfg;          /* the effective defaults (user_config.h) */
    /* private: per option of cmd->opts, its last value ("" for a flag) or NULL */
    const char **values;
    /* private: every option of cmd->opts given, in command-line order (hcli_get_nth) */
    const int *occ_opt;
    const char *const *occ_val;
    int n_occ;
};

/* Parses argv (argv[0] is the program) and runs the command; returns the exit code. */
int hcli_main(int argc, char **argv);

/* The value of option `name` of the running command, or NULL when not given. */
const char *hcli_get(const hcli_ctx *c, const char *name);
/* How many times option `name` was given, and its nth value (0-based) in command-line
 * order, or NULL: a repeatable option (--set) reads every value, the others the last. */
int hcli_count(const hcli_ctx *c, const char *name);
const char *hcli_get_nth(const hcli_ctx *c, const char *name, int nth);
/* Whether flag `name` was given. */
int hcli_flag(const hcli_ctx *c, const char *name);
/* Option `name` as an integer >= min (def when not given); HERR_CONFIG otherwise. */
int hcli_get_long(const hcli_ctx *c, const char *name, long def, long min, long *out,
                  hearth_err *err);

/* The runs directory: --runs-dir, else runs/ beside the database file; made absolute
 * (relative to the working directory).  Fills buf. */
int hcli_runs_dir(const hcli_ctx *c, char *buf, size_t size, hearth_err *err);

/* Prints "hearth CMD: MESSAGE" to stderr and returns the exit code for herr code `rc`:
 * HERR_CONFIG -> 2, anything else -> 1. */
int hcli_fail(const hcli_ctx *c, int rc, const hearth_err *err);

void hcli_print_usage(FILE *f);
void hcli_print_command_help(const hcli_cmd *cmd, FILE *f);
const hcli_cmd *hcli_find(const char *name);

#endif
