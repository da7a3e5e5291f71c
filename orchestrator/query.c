/* query.c - hearth query, top and export.  See query.h. */
#include "query.h"

#include <stdlib.h>
#include <string.h>

#include "config_kv.h"
#include "db_fields.h"
#include "query_sql.h"
#include "runs_db.h"

static const char default_columns[] =
    "run_id,experiment,state,tokens_per_s,step_ms_median,mfu,peak_mem_bytes,final_loss";

/* At most this many differing config keys join top's default columns. */
#define TOP_MAX_KEYS 8

/* Runs the prepared query and writes every row. */
static int emit(hearth_db *db, qsql *q, report_format fmt, FILE *out, long *n_rows,
                hearth_err *err)
{
    sqlite3_stmt *st;
    int rc = qsql_prepare(q, &st, err);
    if (rc)
        return rc;
    size_t n = qsql_ncols(q);
    report_cell *cells = calloc(n ? n : 1, sizeof *cells);
    report *r = cells ? report_begin(out, fmt, n, qsql_labels(q)) : NULL;
    if (!r) {
        free(cells);
        sqlite3_finalize(st);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    long rows = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        qsql_cells(q, st, cells);
        if ((rc = report_row(r, cells, err)))
            break;
        rows++;
    }
    rc = db_rows_end(db, rc, "running a query", err);
    sqlite3_finalize(st);
    free(cells);
    if (rc)
        report_abort(r);
    else
        rc = report_end(r, err);
    if (n_rows)
        *n_rows = rows;
    return rc;
}

int query_runs(hearth_db *db, const query_opts *o, FILE *out, long *n_rows, hearth_err *err)
{
    if (n_rows)
        *n_rows = 0;
    qsql *q = qsql_new(db);
    if (!q)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = qsql_filter(q, o->filter, "filter", err);
    if (!rc && o->experiment)
        rc = qsql_experiment(q, o->experiment, err);
    else if (!rc && !o->archived)
        qsql_hide_archived(q);
    if (!rc)
        rc = qsql_columns(q, o->columns ? o->columns : default_columns, "--columns", err);
    if (!rc && o->order && *o->order)
        rc = qsql_order(q, o->order, "--order", err);
    if (!rc) {
        qsql_limit(q, o->limit);
        rc = emit(db, q, o->format, out, n_rows, err);
    }
    qsql_free(q);
    return rc;
}

static int need_experiment(hearth_db *db, const char *experiment, int64_t *id,
                           hearth_err *err)
{
    int rc = runs_db_experiment_find(db, experiment, id, err);
    if (rc < 0)
        return rc;
    if (rc == 0)
        return herr_set(err, HERR_CONFIG, "no experiment named '%s'", experiment);
    return 0;
}

/* The label for config key `key`: the key itself, or "config.KEY" when that name is also
 * a run or result field. */
static char *key_label(const char *key)
{
    if (db_field_find(&db_run_fields, key) || db_field_find(&db_result_fields, key)) {
        char *s = NULL;
        return asprintf(&s, "config.%s", key) < 0 ? NULL : s;
    }
    return strdup(key);
}

int query_varying_keys(hearth_db *db, int64_t exp, int max, char **keys, int *n,
                       hearth_err *err)
{
    static const char sql[] =
        "SELECT k.key FROM runs r JOIN run_config_kv kv ON kv.run = r.id "
        "JOIN config_keys k ON k.id = kv.key_id "
        "WHERE r.experiment_id = ?1 AND r.state = 'completed' GROUP BY kv.key_id "
        "HAVING count(DISTINCT coalesce(kv.num, kv.txt, kv.flag)) > 1 "
        "OR count(*) < (SELECT count(*) FROM runs WHERE experiment_id = ?1 "
        "AND state = 'completed') ORDER BY k.key LIMIT ?2";
    sqlite3_stmt *st;
    *n = 0;
    int rc = db_prepare_int64(db, sql, exp, &st, err);
    if (rc)
        return rc;
    sqlite3_bind_int(st, 2, max);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && *n < max) {
        if (!(keys[*n] = strdup((const char *)sqlite3_column_text(st, 0)))) {
            rc = SQLITE_NOMEM;
            break;
        }
        (*n)++;
    }
    /* SQLITE_ROW: max reached, the rest is left out. */
    rc = db_rows_end(db, rc == SQLITE_ROW ? SQLITE_DONE : rc, "finding varying config keys",
                     err);
    db_stmt_done(st);
    if (rc) {
        for (int i = 0; i < *n; i++)
            free(keys[i]);
        *n = 0;
    }
    return rc;
}

/* Adds the config keys whose values differ between the experiment's completed runs. */
static int add_varying_keys(hearth_db *db, qsql *q, int64_t exp, hearth_err *err)
{
    /* Collect first: qsql_column reads the database with other statements. */
    char *keys[TOP_MAX_KEYS];
    int n = 0;
    int rc = query_varying_keys(db, exp, TOP_MAX_KEYS, keys, &n, err);
    for (int i = 0; i < n; i++) {
        if (rc == 0) {
            char *name = NULL, *label = key_label(keys[i]);
            if (!label || asprintf(&name, "config.%s", keys[i]) < 0)
                rc = herr_set(err, HERR_NOMEM, "out of memory");
            else
                rc = qsql_column(q, name, label, err);
            free(name);
            free(label);
        }
        free(keys[i]);
    }
    return rc;
}

int query_top(hearth_db *db, const char *experiment, const query_top_opts *o, FILE *out,
              hearth_err *err)
{
    int64_t exp;
    int rc = need_experiment(db, experiment, &exp, err);
    if (rc)
        return rc;
    const char *by = o->by && *o->by ? o->by : "tokens_per_s";
    qsql *q = qsql_new(db);
    if (!q)
        return herr_set(err, HERR_NOMEM, "out of memory");
    rc = qsql_experiment(q, experiment, err);
    if (!rc)
        rc = qsql_state(q, "completed", err);
    if (!rc)
        rc = qsql_filter(q, o->filter, "filter", err);
    if (!rc)
        rc = qsql_order_best(q, by, "--by", err);
    if (!rc && o->columns) {
        rc = qsql_columns(q, o->columns, "--columns", err);
    } else if (!rc) {
        rc = qsql_column(q, "run_id", NULL, err);
        if (!rc)
            rc = add_varying_keys(db, q, exp, err);
        const char *by_name = by + (*by == '-' || *by == '+');
        static const char *const main_fields[] = {
            "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "step_ms_median",
            "peak_mem_bytes", "final_loss",
        };
        int by_listed = 0;
        for (size_t i = 0; i < sizeof main_fields / sizeof *main_fields; i++)
            by_listed |= strcmp(by_name, main_fields[i]) == 0;
        if (!rc && !by_listed && strcmp(by_name, "run_id") != 0)
            rc = qsql_column(q, by_name, NULL, err);
        for (size_t i = 0; !rc && i < sizeof main_fields / sizeof *main_fields; i++)
            rc = qsql_column(q, main_fields[i], NULL, err);
    }
    if (!rc) {
        qsql_limit(q, o->limit > 0 ? o->limit : 10);
        rc = emit(db, q, o->format, out, NULL, err);
    }
    qsql_free(q);
    return rc;
}

/* ---- export ------------------------------------------------------------------------------ */

typedef struct {
    int64_t id;
    int types;
    char *label;
} export_key;

static void export_keys_free(export_key *k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(k[i].label);
    free(k);
}

/* The config keys used by the experiment's runs, sorted by name. */
static int export_keys(hearth_db *db, int64_t exp, export_key **out, size_t *n,
                       hearth_err *err)
{
    static const char sql[] =
        "SELECT k.id, k.types, k.key FROM config_keys k WHERE k.id IN "
        "(SELECT DISTINCT kv.key_id FROM runs r JOIN run_config_kv kv ON kv.run = r.id "
        "WHERE r.experiment_id = ?1) ORDER BY k.key";
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, exp, &st, err);
    if (rc)
        return rc;
    export_key *v = NULL;
    size_t len = 0, cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (len == cap) {
            cap = cap ? 2 * cap : 64;
            export_key *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = SQLITE_NOMEM;
                break;
            }
            v = nv;
        }
        v[len].id = sqlite3_column_int64(st, 0);
        v[len].types = sqlite3_column_int(st, 1);
        if (!(v[len].label = key_label((const char *)sqlite3_column_text(st, 2)))) {
            rc = SQLITE_NOMEM;
            break;
        }
        len++;
    }
    rc = db_rows_end(db, rc, "listing config keys", err);
    db_stmt_done(st);
    if (rc) {
        export_keys_free(v, len);
        return rc;
    }
    *out = v;
    *n = len;
    return 0;
}

/* Fills cells[0..nk) with run `run`'s config values (text copied into texts[]). */
static int export_config_cells(hearth_db *db, int64_t run, const export_key *keys,
                               const size_t *col_of, int64_t max_id, report_cell *cells,
                               char **texts, size_t nk, hearth_err *err)
{
    static const char sql[] =
        "SELECT key_id, num, txt, flag FROM run_config_kv WHERE run = ?1";
    for (size_t i = 0; i < nk; i++) {
        memset(&cells[i], 0, sizeof cells[i]);
        free(texts[i]);
        texts[i] = NULL;
    }
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, run, &st, err);
    if (rc)
        return rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(st, 0);
        if (id < 0 || id > max_id || col_of[id] == (size_t)-1)
            continue;
        size_t c = col_of[id];
        report_cell *cell = &cells[c];
        if (sqlite3_column_type(st, 3) != SQLITE_NULL) {
            cell->kind = CELL_BOOL;
            cell->i = sqlite3_column_int(st, 3) != 0;
        } else if (sqlite3_column_type(st, 1) == SQLITE_INTEGER) {
            cell->kind = CELL_INT;
            cell->i = sqlite3_column_int64(st, 1);
        } else if (sqlite3_column_type(st, 1) == SQLITE_FLOAT) {
            cell->kind = CELL_REAL;
            cell->d = sqlite3_column_double(st, 1);
        } else if (sqlite3_column_type(st, 2) != SQLITE_NULL) {
            if (!(texts[c] = strdup((const char *)sqlite3_column_text(st, 2)))) {
                rc = SQLITE_NOMEM;
                break;
            }
            int t = keys[c].types;
            cell->kind = (t & CFG_T_JSON) && !(t & CFG_T_STR) ? CELL_JSON : CELL_TEXT;
            cell->s = texts[c];
        }
    }
    rc = db_rows_end(db, rc, "reading a run's config", err);
    db_stmt_done(st);
    return rc;
}

int query_export(hearth_db *db, const char *experiment, report_format fmt, FILE *out,
                 hearth_err *err)
{
    int64_t exp;
    int rc = need_experiment(db, experiment, &exp, err);
    if (rc)
        return rc;
    export_key *keys = NULL;
    size_t nk = 0;
    if ((rc = export_keys(db, exp, &keys, &nk, err)))
        return rc;
    qsql *q = qsql_new(db);
    if (!q) {
        export_keys_free(keys, nk);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    rc = qsql_experiment(q, experiment, err);
    /* Prefixed names: a config key called like a field must not make them ambiguous. */
    for (size_t i = 0; !rc && i < db_run_fields.n; i++) {
        char name[64];
        snprintf(name, sizeof name, "run.%s", db_run_fields.v[i].name);
        rc = qsql_column(q, name, db_run_fields.v[i].name, err);
    }
    for (size_t i = 0; !rc && i < db_result_fields.n; i++) {
        char name[64];
        snprintf(name, sizeof name, "result.%s", db_result_fields.v[i].name);
        rc = qsql_column(q, name, db_result_fields.v[i].name, err);
    }
    sqlite3_stmt *st = NULL;
    if (!rc)
        rc = qsql_prepare(q, &st, err);
    size_t nf = qsql_ncols(q), n = nf + nk;
    int64_t max_id = 0;
    for (size_t i = 0; i < nk; i++)
        if (keys[i].id > max_id)
            max_id = keys[i].id;
    size_t *col_of = NULL;
    report_cell *cells = NULL;
    char **texts = NULL;
    const char **labels = NULL;
    report *r = NULL;
    if (!rc) {
        col_of = malloc((size_t)(max_id + 1) * sizeof *col_of);
        cells = calloc(n ? n : 1, sizeof *cells);
        texts = calloc(nk ? nk : 1, sizeof *texts);
        labels = calloc(n ? n : 1, sizeof *labels);
        if (!col_of || !cells || !texts || !labels)
            rc = herr_set(err, HERR_NOMEM, "out of memory");
    }
    if (!rc) {
        for (int64_t i = 0; i <= max_id; i++)
            col_of[i] = (size_t)-1;
        for (size_t i = 0; i < nk; i++)
            col_of[keys[i].id] = i;
        for (size_t i = 0; i < nf; i++)
            labels[i] = qsql_labels(q)[i];
        for (size_t i = 0; i < nk; i++)
            labels[nf + i] = keys[i].label;
        if (!(r = report_begin(out, fmt, n, labels)))
            rc = herr_set(err, HERR_NOMEM, "out of memory");
    }
    while (!rc && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        rc = export_config_cells(db, sqlite3_column_int64(st, 0), keys, col_of, max_id,
                                 cells + nf, texts, nk, err);
        if (!rc) {
            qsql_cells(q, st, cells);
            rc = report_row(r, cells, err);
        }
    }
    rc = db_rows_end(db, rc, "exporting runs", err);
    if (r) {
        if (rc)
            report_abort(r);
        else
            rc = report_end(r, err);
    }
    for (size_t i = 0; texts && i < nk; i++)
        free(texts[i]);
    free(texts);
    free(labels);
    free(cells);
    free(col_of);
    sqlite3_finalize(st);
    qsql_free(q);
    export_keys_free(keys, nk);
    return rc;
}
