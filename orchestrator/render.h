/* render.h - job-script templates (templates/NAME.tmpl) rendered with shell-quoted values.
 *
 * A template is text with placeholders `{{NAME}}` (NAME: [A-Z0-9_]+).  Each placeholder is
 * replaced by its variable's value written as ONE single-quoted shell word, so that no value
 * (an experiment name, a data path, a trainer path from a spec) can ever inject shell: a
 * value `$(touch x); rm -rf /` becomes the inert word '$(touch x); rm -rf /'.  Placeholders
 * must therefore stand where a whole shell word goes, never inside quotes.
 *
 * The only exception is a variable the caller marks `raw` (resources.setup: shell lines by
 * design), inserted as is.  The template decides nothing about quoting; the caller's
 * variable table does, so a template edit cannot turn a quoted value into a raw one.
 *
 * An unknown placeholder, or an unterminated `{{`, is an error naming the template's line:
 * a typo in a template must not silently produce a script that runs something else. */
#ifndef HEARTH_RENDER_H
#define HEARTH_RENDER_H

#include <stddef.h>

#include "shape/err.h"

typedef struct {
    const char *name;    /* "RUN_DIR" */
    const char *value;   /* any bytes up to NUL */
    int raw;             /* 1: inserted as is (shell by design); 0: single-quoted */
} render_var;

/* Renders `tmpl` (named `tmpl_name` in messages) into a malloc'd string *out (the caller
 * frees it).  Returns 0, HERR_CONFIG for a bad or unknown placeholder, HERR_NOMEM. */
int render_template(const char *tmpl_name, const char *tmpl, const render_var *vars,
                    size_t n_vars, char **out, hearth_err *err);

/* The single-quoted shell word for `s` ('' for the empty string; ' written as '\'').
 * Returns a malloc'd string, or NULL when out of memory. */
char *render_shell_quote(const char *s);

/* Finds template `name` ("local.sh.tmpl"): $HEARTH_TEMPLATES (':'-separated), then the
 * running binary's ../../templates (the build tree) and ../share/hearth/templates (an
 * install), then ./templates.  Fills `path`; HERR_IO naming the places searched. */
int render_find_template(const char *name, char *path, size_t size, hearth_err *err);

/* The directory of the running binary (readlink /proc/self/exe), for the default trainer
 * (build/bin/hearth-train beside build/bin/hearth) and the template search. */
int render_exe_dir(char *dir, size_t size, hearth_err *err);

#endif
