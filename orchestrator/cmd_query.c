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

/* The common start of every reading command: --format (`def` when not given), --limit
 * when `limit` is not NULL, then the database.  Returns 0 with *db open, or the exit code
 * to return (the failure already reported). */
static int begin(hcli_ctx *c, report_format def, report_format *fmt, long *limit,
                 hearth_db **db)
{
    hearth_err err = { { 0 } };
    *db = NULL;
    int rc = format_of(c, def, fmt, &err);
    if (!rc && limit)
        rc = hcli_get_long(c, "limit", 0, 1, limit, &err);
    if (rc)
        return hcli_fail(c, rc, &err);
    return cmd_open_db(c, 0, db);
}

/* Closes the database after the command's query and turns its result into an exit code. */
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
    hearth_db *db;
    int code = begin(c, REPORT_TABLE, &o.format, &o.limit, &db);
    if (code)
        return code;
    o.filter = c->argc ? c->argv[0] : NULL;
    o.experiment = hcli_get(c, "experiment");
    o.archived = hcli_flag(c, "all");
    o.order = hcli_get(c, "order");
    o.columns = hcli_get(c, "columns");
    return finish(c, db, query_runs(db, &o, stdout, NULL, &err), &err);
}

/* show, compare and export: --format and the positional arguments, nothing else. */
typedef enum { READ_SHOW, READ_COMPARE, READ_EXPORT } read_cmd;

static int read_cmd_run(hcli_ctx *c, read_cmd which, report_format def)
{
    hearth_err err = { { 0 } };
    report_format fmt;
    hearth_db *db;
    int code = begin(c, def, &fmt, NULL, &db);
    if (code)
        return code;
    int rc;
    switch (which) {
    case READ_SHOW:
        rc = query_show(db, c->argv[0], fmt, stdout, &err);
        break;
    case READ_COMPARE:
        rc = query_compare(db, c->argv[0], c->argv[1], fmt, stdout, &err);
        break;
    default:
        rc = query_export(db, c->argv[0], fmt, stdout, &err);
        break;
    }
    return finish(c, db, rc, &err);
}

int cmd_show(hcli_ctx *c)
{
    return read_cmd_run(c, READ_SHOW, REPORT_TABLE);
}

int cmd_compare(hcli_ctx *c)
{
    return read_cmd_run(c, READ_COMPARE, REPORT_TABLE);
}

int cmd_top(hcli_ctx *c)
{
    hearth_err err = { { 0 } };
    query_top_opts o;
    memset(&o, 0, sizeof o);
    hearth_db *db;
    int code = begin(c, REPORT_TABLE, &o.format, &o.limit, &db);
    if (code)
        return code;
    o.by = hcli_get(c, "by");
    o.filter = hcli_get(c, "filter");
    o.columns = hcli_get(c, "columns");
    return finish(c, db, query_top(db, c->argv[0], &o, stdout, &err), &err);
}

int cmd_export(hcli_ctx *c)
{
    return read_cmd_run(c, READ_EXPORT, REPORT_CSV);
}
