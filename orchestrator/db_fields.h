/* db_fields.h - the fixed columns of the results database that users name: run fields,
 * result fields (result.json) and per-step metric fields (metrics.jsonl).
 *
 * These tables are the whitelist that user-given names are mapped through: a query never
 * puts a name from the command line into SQL, only the `sql` text of an entry found here
 * (or a bound parameter for config keys). */
#ifndef HEARTH_DB_FIELDS_H
#define HEARTH_DB_FIELDS_H

#include <stddef.h>

typedef enum {
    FIELD_INT,    /* integer (JSON integer, or a real with an integral value) */
    FIELD_REAL,   /* number */
    FIELD_TEXT,   /* string */
    FIELD_ANY,    /* number, string or bool, stored as written */
    FIELD_JSON,   /* any JSON value, stored as its compact text */
} field_kind;

typedef struct {
    const char *name;   /* what users write; for results and metrics also the JSON key */
    const char *sql;    /* SQL expression over r (runs), e (experiments), res (results) */
    field_kind kind;
    int better;         /* +1 higher is better, -1 lower is better, 0 no order of merit */
    int indexed;        /* result fields: the migrations give the column an index */
} db_field;

typedef struct {
    const db_field *v;
    size_t n;
} db_field_table;

/* run_id, experiment, seq, state, config_hash, attempts, exit_code, backend, job_id,
 * run_dir, created_at, submitted_at, started_at, ended_at. */
extern const db_field_table db_run_fields;
/* The result.json fields of DESIGN.md ("Trainer outputs") except config_hash, in the
 * column order of table `results` (ingest binds them in this order). */
extern const db_field_table db_result_fields;
/* The metrics.jsonl fields except `step`, in the column order of table `metrics`. */
extern const db_field_table db_metric_fields;

const db_field *db_field_find(const db_field_table *t, const char *name);

#endif
