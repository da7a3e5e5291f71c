/* cmd_report.c - `hearth report EXP --svg FILE --html FILE`: an experiment's results as
 * pictures (report_page.h) from what report_data.h reads.  Each file is written whole to
 * a temporary name and renamed, so a failure never leaves a half-written report. */
#include <stdlib.h>

#include "cmd.h"
#include "report_page.h"
#include "rundir.h"

/* How many runs' loss curves the report draws when --runs is not given. */
#define DEFAULT_BEST 5

int cmd_report(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    const char *svg_path = hcli_get(c, "svg"), *html_path = hcli_get(c, "html");
    long best = DEFAULT_BEST;
    int rc = hcli_get_long(c, "best", DEFAULT_BEST, 1, &best, &err);
    if (!rc && !svg_path && !html_path)
        rc = herr_set(&err, HERR_CONFIG, "nothing to write: give --svg FILE, --html FILE "
                      "or both");
    if (!rc && ((svg_path && !*svg_path) || (html_path && !*html_path)))
        rc = herr_set(&err, HERR_CONFIG, "--svg and --html need a file name");
    if (rc)
        return hcli_fail(c, rc, &err);
    hearth_db *db;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    report_data data;
    char *svg = NULL, *html = NULL;
    size_t svg_len = 0, html_len = 0;
    rc = report_data_load(db, c->argv[0], hcli_get(c, "runs"), best, &data, &err);
    db_close(db);
    if (!rc)
        rc = report_page_svg(&data, &svg, &svg_len, &err);
    if (!rc && html_path)
        rc = report_page_html(&data, svg, &html, &html_len, &err);
    /* Both texts are complete before either file is written. */
    if (!rc && svg_path)
        rc = rundir_write_file(svg_path, svg, svg_len, 0644, &err);
    if (!rc && html_path)
        rc = rundir_write_file(html_path, html, html_len, 0644, &err);
    report_data_free(&data);
    free(svg);
    free(html);
    return rc ? hcli_fail(c, rc, &err) : HCLI_EXIT_OK;
}
