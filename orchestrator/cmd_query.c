/* cmd_query.c - the reading commands (`query`, `show`, `compare`, `top`, `export`): thin
 * wrappers over query.h, which never puts user text into SQL. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "query.h"

int cmd_open_db(hcli_ctx *c, int create, hearth_db **db)
{
    hearth_err err = { { 0 } };
    *db = NULL;
    if (!create && access(c->db_path, F_OK) != 0) {
        herr_set(&err, HERR_CONFIG, "%s: no such database (`hearth submit` creates it; "
                 "--db FILE or $HEARTH_DB names another)", c->db_path);
        return hcli_fail(c, HERR_CONFIG, &err);
    }
    int rc = db_open(c->db_path, db, &err);
    return rc ? hcli_fail(c, rc, &err) : 0;
}

/* --format, with `def` when not given. */
static int format_of(hcli_ctx *c, report_format def, report_format *fmt, hearth_err *err)
{
    const char *f = hcli_get(c, "format");
    *fmt = def;
    return f ? report_format_parse(f, fmt, err) : 0;
}

/* Opens the database, runs `fn`, and turns its result into an exit code. */
static int finish(hcli_ctx *c, hearth_db *db, int rc, hearth_err *err)
{
    if (!rc && fflush(stdout))
        rc = herr_set(err, HERR_IO, "writing the output failed");
    db_close(db);
    return rc ? hcli_fail(c, rc, err) : HCLI_EXIT_OK;
}

int cmd_query(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    query_opts o;
    memset(&o, 0, sizeof o);
    int rc = format_of(c, REPORT_TABLE, &o.format, &err);
    if (!rc)
        rc = hcli_get_long(c, "limit", 0, 1, &o.limit, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    o.filter = c->argc ? c->argv[0] : NULL;
    o.experiment = hcli_get(c, "experiment");
    o.order = hcli_get(c, "order");
    o.columns = hcli_get(c, "columns");
    hearth_db *db;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    return finish(c, db, query_runs(db, &o, stdout, NULL, &err), &err);
}

int cmd_show(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    report_format fmt;
    int rc = format_of(c, REPORT_TABLE, &fmt, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    hearth_db *db;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    return finish(c, db, query_show(db, c->argv[0], fmt, stdout, &err), &err);
}

int cmd_compare(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    report_format fmt;
    int rc = format_of(c, REPORT_TABLE, &fmt, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    hearth_db *db;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    return finish(c, db, query_compare(db, c->argv[0], c->argv[1], fmt, stdout, &err), &err);
}

int cmd_top(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    query_top_opts o;
    memset(&o, 0, sizeof o);
    int rc = format_of(c, REPORT_TABLE, &o.format, &err);
    if (!rc)
        rc = hcli_get_long(c, "limit", 0, 1, &o.limit, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    o.by = hcli_get(c, "by");
    o.filter = hcli_get(c, "filter");
    o.columns = hcli_get(c, "columns");
    hearth_db *db;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    return finish(c, db, query_top(db, c->argv[0], &o, stdout, &err), &err);
}

int cmd_export(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    report_format fmt;
    int rc = format_of(c, REPORT_CSV, &fmt, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    hearth_db *db;
    int code = cmd_open_db(c, 0, &db);
    if (code)
        return code;
    return finish(c, db, query_export(db, c->argv[0], fmt, stdout, &err), &err);
}
