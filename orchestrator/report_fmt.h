/* report_fmt.h - tables of results written as an aligned text table, CSV or JSON; shared
 * by `hearth query`, `top`, `export`, `show` and `compare`.
 *
 *   table: a header line, a rule, one line per row; numbers right-aligned, text left,
 *          null as "-"; control characters in text are shown as '?', so a stored value
 *          cannot drive the terminal.
 *   csv:   RFC 4180: a header row, fields quoted when they contain , " CR or LF (or begin
 *          or end with a space); null is an empty field.
 *   json:  an array of objects, one per row, keys in column order; numbers in their
 *          shortest round-trip form, non-finite numbers and nulls as null.
 *
 * CSV and JSON rows are written as they come (an export of many runs needs no memory);
 * the table is buffered until report_end because column widths depend on every row. */
#ifndef HEARTH_REPORT_FMT_H
#define HEARTH_REPORT_FMT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shape/err.h"

typedef enum { REPORT_TABLE = 0, REPORT_CSV, REPORT_JSON } report_format;

/* "table", "csv" or "json"; else HERR_CONFIG naming the choices. */
int report_format_parse(const char *name, report_format *out, hearth_err *err);
const char *report_format_name(report_format f);

typedef enum {
    CELL_NULL = 0,
    CELL_INT,
    CELL_REAL,
    CELL_TEXT,
    CELL_BOOL,   /* `i` is 0 or 1: true/false */
    CELL_JSON,   /* `s` is JSON text, embedded as is in JSON output (text elsewhere) */
} cell_kind;

typedef struct {
    cell_kind kind;
    int64_t i;
    double d;
    const char *s;   /* borrowed: copied when the writer needs to keep it */
} report_cell;

typedef struct report report;

/* Starts a report with `ncols` columns named `names` (copied).  Returns NULL when out of
 * memory. */
report *report_begin(FILE *out, report_format fmt, size_t ncols, const char *const *names);
/* Adds a row of ncols cells. */
int report_row(report *r, const report_cell *cells, hearth_err *err);
/* Writes what is buffered, the JSON closing bracket, checks the stream for write errors
 * and frees r (also on failure).  r may be NULL (then returns HERR_NOMEM). */
int report_end(report *r, hearth_err *err);
/* Frees r without writing anything more (after an error elsewhere). */
void report_abort(report *r);

/* Writes a number in its shortest form that reads back to the same double ("%.17g" at
 * most); non-finite values as `nonfinite`. */
void report_write_real(FILE *out, double x, const char *nonfinite);
/* Writes s as a JSON string literal. */
void report_write_json_string(FILE *out, const char *s);

#endif
