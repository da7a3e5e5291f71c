/* user_config.h - the user's defaults for `hearth`: $XDG_CONFIG_HOME/hearth/config.yaml
 * (else ~/.config/hearth/config.yaml), environment variables and the command line.
 *
 *     db: ~/hearth/results.db           # HEARTH_DB          --db
 *     runs_dir: /scratch/me/runs        # HEARTH_RUNS_DIR    --runs-dir
 *     backend: slurm                    # HEARTH_BACKEND     submit/bench --backend
 *     slurm:                            # used when the spec's resources do not say
 *       partition: gpu                  # HEARTH_SLURM_PARTITION
 *       account: proj42                 # HEARTH_SLURM_ACCOUNT
 *       qos: normal                     # HEARTH_SLURM_QOS
 *       constraint: h100                # HEARTH_SLURM_CONSTRAINT
 *     slurmrest:
 *       url: http://head:6820           # HEARTH_SLURMREST_URL          --rest-url
 *       token_file: ~/.slurm-token      # HEARTH_SLURMREST_TOKEN_FILE   --rest-token-file
 *
 * Precedence: command line > environment > config file > built-in default.  An empty
 * environment variable counts as unset.  A leading "~/" in a path value (db, runs_dir,
 * token_file) of the file is the home directory.  A missing file is no error; an
 * unknown key, a value of the wrong type (a list or mapping for a string; a section that
 * is not a mapping) or a backend that does not exist is HERR_CONFIG; a key written
 * without a value means its built-in default.  Errors read
 * "FILE:LINE:COL: KEY: what is wrong".  The token file's path is configured, never the
 * token itself.
 *
 * Ownership: ucfg_load fills a caller's ucfg with copies of every value; ucfg_free
 * releases them.  No global state: the command line passes the ucfg to the commands. */
#ifndef HEARTH_USER_CONFIG_H
#define HEARTH_USER_CONFIG_H

#include <stddef.h>

#include "shape/err.h"

typedef enum { UCFG_DB = 0, UCFG_RUNS_DIR, UCFG_BACKEND, UCFG_SLURM_PARTITION,
               UCFG_SLURM_ACCOUNT, UCFG_SLURM_QOS, UCFG_SLURM_CONSTRAINT, UCFG_REST_URL,
               UCFG_REST_TOKEN_FILE, UCFG_N } ucfg_key;

typedef enum { UCFG_BUILTIN = 0, UCFG_FILE, UCFG_ENV, UCFG_CMDLINE } ucfg_source;

typedef struct {
    char *value;             /* NULL: unset */
    ucfg_source source;
    char *where;             /* "FILE:LINE:COL", "$HEARTH_DB", "--db"; NULL when built in */
} ucfg_value;

typedef struct {
    char *path;              /* the config file looked for */
    int found;               /* it exists */
    ucfg_value v[UCFG_N];
} ucfg;

/* The key's name as written in the file ("slurm.partition"), its environment variable,
 * its built-in default (NULL: none) and a line of help.  NULL for an out-of-range key. */
const char *ucfg_name(ucfg_key k);
const char *ucfg_env(ucfg_key k);
const char *ucfg_builtin(ucfg_key k);
const char *ucfg_help(ucfg_key k);

/* The config file's path: $XDG_CONFIG_HOME/hearth/config.yaml, else
 * $HOME/.config/hearth/config.yaml; HERR_CONFIG when neither variable is set. */
int ucfg_path(char *buf, size_t size, hearth_err *err);

/* Built-in defaults, then the file at `path` (NULL: ucfg_path), then the environment. */
int ucfg_load(ucfg *c, const char *path, hearth_err *err);
/* Reads YAML text (named `name` in messages) over c's values; for ucfg_load and tests. */
int ucfg_parse(ucfg *c, const char *name, const char *text, size_t len, hearth_err *err);
/* A value given on the command line as `flag` ("--db"); value NULL leaves k alone. */
int ucfg_set_cmdline(ucfg *c, ucfg_key k, const char *value, const char *flag,
                     hearth_err *err);
/* The effective value of k, or NULL when unset (c NULL: the built-in default). */
const char *ucfg_get(const ucfg *c, ucfg_key k);
/* "command line (--db)", "environment ($HEARTH_DB)", "FILE:LINE:COL", "built-in" or
 * "unset" into buf. */
void ucfg_describe_source(const ucfg *c, ucfg_key k, char *buf, size_t size);
/* Sets the environment variables of the slurmrest values that came from the file, since
 * the slurmrest backend (and a detached runner, a child process) reads the environment;
 * the command line's --rest-url/--rest-token-file overwrite them later. */
int ucfg_export_env(const ucfg *c, hearth_err *err);
void ucfg_free(ucfg *c);

#endif
