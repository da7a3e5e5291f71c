/* cmd_config.c - `hearth config show`: the effective defaults (user_config.h), each with
 * where it came from, as a table, CSV or JSON. */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "report_fmt.h"

int cmd_config(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    report_format fmt = REPORT_TABLE;
    const char *f = hcli_get(c, "format");
    int rc = f ? report_format_parse(f, &fmt, &err) : 0;
    if (!rc && strcmp(c->argv[0], "show") != 0)
        rc = herr_set(&err, HERR_CONFIG, "unknown subcommand '%s' (expected show)", c->argv[0]);
    if (rc)
        return hcli_fail(c, rc, &err);
    static const char *const names[] = { "key", "value", "source", "env" };
    report *r = report_begin(stdout, fmt, 4, names);
    for (int k = 0; r && !rc && k < UCFG_N; k++) {
        char src[4400];
        ucfg_describe_source(c->cfg, (ucfg_key)k, src, sizeof src);
        const char *v = ucfg_get(c->cfg, (ucfg_key)k);
        report_cell cells[4] = {
            { CELL_TEXT, 0, 0, ucfg_name((ucfg_key)k) },
            { v ? CELL_TEXT : CELL_NULL, 0, 0, v },
            { CELL_TEXT, 0, 0, src },
            { CELL_TEXT, 0, 0, ucfg_env((ucfg_key)k) },
        };
        rc = report_row(r, cells, &err);
    }
    if (rc)
        report_abort(r);
    else
        rc = report_end(r, &err);
    if (!rc && fmt == REPORT_TABLE)
        printf("\nconfig file: %s%s\n", c->cfg->path, c->cfg->found ? "" : " (not found)");
    if (!rc && fflush(stdout))
        rc = herr_set(&err, HERR_IO, "writing the output failed");
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}
