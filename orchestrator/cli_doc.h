/* cli_doc.h - shell completion and manual pages generated from the tables the programs
 * themselves use, so that a new command, option or key cannot be missing from them:
 *
 *   bash, zsh completion   hcli_commands / hcli_global_opts (cli.c): commands, their
 *                          options, choices of options (--format table|csv|json), literal
 *                          subcommand words ("fp8|encoder"), files for FILE/DIR/SPEC
 *   hearth(1)              the same tables, plus the user_config.h keys (ENVIRONMENT, FILES)
 *   hearth-train(1)        hearth-train's own --help text, converted (cli_doc_help2man)
 *   hearth-spec(5)         the spec's key tables (spec_keys) and the run-config key tables
 *                          (config_fields, model_fields) with their documentation
 *
 * Output goes to a FILE; the functions return 0, HERR_CONFIG for an unknown shell or page,
 * HERR_IO when writing failed. */
#ifndef HEARTH_CLI_DOC_H
#define HEARTH_CLI_DOC_H

#include <stdio.h>

#include "shape/err.h"

/* `shell`: "bash" or "zsh". */
int cli_doc_completion(const char *shell, FILE *out, hearth_err *err);

/* hearth(1) or hearth-spec(5).  (hearth-train(1) needs the trainer's help text: below.) */
int cli_doc_man_hearth(FILE *out, hearth_err *err);
int cli_doc_man_spec(FILE *out, hearth_err *err);

/* A manual page from a program's --help text laid out as hearth-train's is:
 *   "usage: PROG ..." and indented continuation lines   -> SYNOPSIS
 *   the paragraph after it                               -> NAME (first sentence) and
 *                                                           DESCRIPTION
 *   "  --opt ARG   text" with indented continuation lines -> OPTIONS
 *   "exit status: ..." and its continuation lines        -> EXIT STATUS
 * `see_also` is written as is into SEE ALSO (may be NULL). */
int cli_doc_help2man(const char *help, const char *prog, int section, const char *see_also,
                     FILE *out, hearth_err *err);

/* Writes `text` for roff: backslashes doubled as \e, a leading '.' or '\'' guarded with
 * \&, '-' as \- (every dash in options and examples must stay a dash). */
void cli_doc_roff_text(FILE *out, const char *text);

#endif
