/* dbtest.h - helpers for the unit tests that work on a real results database.
 *
 * dbt_random_hash and dbt_flatten are plain functions (dbtest.c).  dbt_sql_int and
 * dbt_sql_text assert with cmocka, so they are static inline here: the bench links every
 * support .c file but not cmocka, and only test files include this header. */
#ifndef HEARTH_DBTEST_H
#define HEARTH_DBTEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "db.h"
#include "tests/unit/support/testutil.h"

/* 64 random lowercase hex digits and a NUL: a well-formed config hash. */
void dbt_random_hash(tu_rng *r, char out[65]);
/* The test's own flattening of a config (independent of config_kv.c / flat_json.c): every
 * leaf of `o` (empty objects included) is set in `out` under its dotted key, prefixed by
 * `prefix` ("" at the top). */
void dbt_flatten(json_t *o, const char *prefix, json_t *out);

/* The first column of the first row of `sql` (which must return a row), as an integer. */
static inline long long dbt_sql_int(hearth_db *db, const char *sql)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_sqlite(db), sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    long long v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* The same as text ("" for NULL); the caller frees it. */
static inline char *dbt_sql_text(hearth_db *db, const char *sql)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_sqlite(db), sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    const unsigned char *t = sqlite3_column_text(st, 0);
    char *s = strdup(t ? (const char *)t : "");
    sqlite3_finalize(st);
    return s;
}

#endif
