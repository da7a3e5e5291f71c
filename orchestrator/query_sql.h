/* query_sql.h - builds the parameterised SELECT behind `hearth query`, `top` and `export`:
 * a filter in the expression language (expr.h), output columns, an order and a limit.
 *
 * Names are resolved, never pasted: a name is a run field or a result field (the whitelist
 * in db_fields.h, whose own SQL text is used) or a config key, which becomes a join on
 * run_config_kv with the key's id as a bound parameter.  Literals are bound parameters.
 * Write `run.NAME`, `result.NAME` or `config.KEY` to choose when a bare name is both a
 * field and a config key (e.g. `device`); a bare ambiguous name is an error.
 *
 * The query's shape (which table drives it) is chosen from counts of matching index
 * entries, since SQLite alone cannot tell a 1% filter from a 25% one; the rows are the same
 * whatever the shape.
 *
 * Semantics follow expr.h: comparisons with a missing value (null) are false, `not` of a
 * false-or-null condition is true, `/` is real division.  Where the language would stop
 * with a type error that only the data reveals (a config key holding numbers in some runs
 * and strings in others; division by zero), a run simply does not match.  Type errors the
 * schema already shows (a text field compared with a number, arithmetic on strings, ...)
 * are reported with the column of the operator, as expr_eval does. */
#ifndef HEARTH_QUERY_SQL_H
#define HEARTH_QUERY_SQL_H

#include <stddef.h>

#include "db.h"
#include "report_fmt.h"

typedef struct qsql qsql;

qsql *qsql_new(hearth_db *db);
void qsql_free(qsql *q);

/* Restricts to runs whose filter expression is true.  `name` prefixes messages
 * ("filter:1:COL: ..."). */
int qsql_filter(qsql *q, const char *expr_text, const char *name, hearth_err *err);
/* Restricts to one experiment's runs. */
int qsql_experiment(qsql *q, const char *experiment, hearth_err *err);
/* Leaves out the runs of archived experiments (`hearth archive`). */
void qsql_hide_archived(qsql *q);
/* Restricts to runs in state `state` (bound). */
int qsql_state(qsql *q, const char *state, hearth_err *err);
/* Adds an output column; `label` (may be NULL: the name) is its header. */
int qsql_column(qsql *q, const char *name, const char *label, hearth_err *err);
/* Adds comma-separated columns ("a, b,c"); `what` names the option in messages. */
int qsql_columns(qsql *q, const char *list, const char *what, hearth_err *err);
/* Orders by "KEY" (ascending) or "-KEY" (descending); missing values last.  Several calls
 * add further keys; the run order breaks ties. */
int qsql_order(qsql *q, const char *spec, const char *what, hearth_err *err);
/* Orders best first by KEY: descending when higher is better (tokens_per_s, mfu, config
 * keys), ascending when lower is better (step times, memory, loss).  "-KEY" / "+KEY" force
 * descending / ascending. */
int qsql_order_best(qsql *q, const char *spec, const char *what, hearth_err *err);
void qsql_limit(qsql *q, long limit);
/* The planner's probe limit (see plan() in query_sql.c): a conjunct matching fewer index
 * entries than this drives the query.  Tests set small values to reach every plan with
 * little data; the default suits large databases. */
void qsql_probe_cap(qsql *q, long cap);

/* Prepares the statement (the caller finalizes it).  Column 0 is runs.id; the output
 * columns follow and are read with qsql_cells. */
int qsql_prepare(qsql *q, sqlite3_stmt **out, hearth_err *err);
size_t qsql_ncols(const qsql *q);
const char *const *qsql_labels(const qsql *q);
/* Converts the current row to cells (text borrowed from the statement until it steps). */
void qsql_cells(const qsql *q, sqlite3_stmt *st, report_cell *cells);
/* The SQL text built so far (for tests and --explain style debugging); NULL before
 * qsql_prepare. */
const char *qsql_text(const qsql *q);

/* Resolves `name` as a filter, column or order would: 1 when it is a config key, 0 when
 * a run or result field, or HERR_CONFIG when unknown or ambiguous (message in err). */
int qsql_is_config_key(qsql *q, const char *name, hearth_err *err);

#endif
