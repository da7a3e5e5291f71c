/* cmd_doc.c - `hearth completion bash|zsh` and `hearth man PAGE`: the generated shell
 * completion and manual pages (cli_doc.h) on stdout; `hearth completion experiments|runs`:
 * the names those scripts complete. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_doc.h"
#include "cmd.h"
#include "render.h"
#include "runs_db.h"
#include "strbuf.h"

static void print_name(void *ctx, const char *name)
{
    fprintf(ctx, "%s\n", name);
}

/* `completion experiments|runs`: the names the completion scripts offer for EXP and RUN
 * arguments, one a line.  Without a database there are none, and no error: a shell
 * completing a word must not print one. */
static int completion_names(hcli_ctx *c, int runs)
{
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    if (access(c->db_path, F_OK) != 0)
        return HCLI_EXIT_OK;
    int rc = db_open(c->db_path, &db, &err);
    if (!rc)
        rc = runs_db_names(db, runs, print_name, stdout, &err);
    db_close(db);
    if (!rc && fflush(stdout))
        rc = herr_set(&err, HERR_IO, "writing the names failed");
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}

int cmd_completion(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    if (strcmp(c->argv[0], "experiments") == 0 || strcmp(c->argv[0], "runs") == 0)
        return completion_names(c, strcmp(c->argv[0], "runs") == 0);
    int rc = cli_doc_completion(c->argv[0], stdout, &err);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}

/* The output of `TRAINER --help` (malloc'd into *out). */
static int trainer_help(const char *trainer, char **out, hearth_err *err)
{
    char *q = render_shell_quote(trainer);
    char *cmd = NULL;
    if (!q || asprintf(&cmd, "%s --help", q) < 0) {
        free(q);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    free(q);
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p)
        return herr_set(err, HERR_IO, "%s --help: cannot run it", trainer);
    strbuf b = { 0 };
    char buf[4096];
    size_t n;
    int rc = 0;
    while (!rc && (n = fread(buf, 1, sizeof buf, p)) > 0)
        rc = strbuf_add(&b, buf, n);
    int st = pclose(p);
    if (rc)
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    else if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !b.s)
        rc = herr_set(err, HERR_IO, "%s --help failed (is it hearth-train? --trainer PATH "
                      "names another)", trainer);
    if (rc) {
        free(b.s);
        return rc;
    }
    *out = b.s;
    return 0;
}

int cmd_man(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    const char *page = c->argv[0];
    int rc;
    if (strcmp(page, "hearth") == 0) {
        rc = cli_doc_man_hearth(stdout, &err);
    } else if (strcmp(page, "hearth-spec") == 0) {
        rc = cli_doc_man_spec(stdout, &err);
    } else if (strcmp(page, "hearth-train") == 0) {
        char path[PATH_MAX], dir[PATH_MAX];
        const char *trainer = hcli_get(c, "trainer");
        rc = 0;
        if (!trainer) {
            rc = render_exe_dir(dir, sizeof dir, &err);
            snprintf(path, sizeof path, "%.*s/hearth-train", (int)(sizeof path - 16), dir);
            trainer = path;
        }
        char *help = NULL;
        if (!rc)
            rc = trainer_help(trainer, &help, &err);
        if (!rc)
            rc = cli_doc_help2man(help, "hearth-train", 1,
                                  "\\fBhearth\\fR(1), \\fBhearth\\-spec\\fR(5)", stdout, &err);
        free(help);
    } else {
        rc = herr_set(&err, HERR_CONFIG, "no manual page '%s' (expected hearth, hearth-train "
                      "or hearth-spec)", page);
    }
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}
