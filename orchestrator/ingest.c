/* ingest.c - metrics.jsonl, result.json and exit_code into the database.  See ingest.h. */
#include "ingest.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db_fields.h"
#include "flat_json.h"
#include "shape/file_read.h"

/* Column order: db_metric_fields, then extra. */
static const char metrics_sql[] =
    "INSERT OR REPLACE INTO metrics (run, step, loss, grad_norm, lr, step_ms, tokens, "
    "tokens_per_s, encoder_ms, decoder_ms, peak_mem_bytes, extra) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
/* Column order: db_result_fields, then extra. */
static const char results_sql[] =
    "INSERT OR REPLACE INTO results (run, steps, step_ms_median, step_ms_p10, step_ms_p90, "
    "tokens_per_s, tokens_per_s_per_gpu, flops_per_token, mfu, peak_mem_bytes, final_loss, "
    "exit_status, device, device_count, nodes, versions, extra) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)";

typedef struct {
    hearth_db *db;
    int64_t run;
    const char *dir;
    const char *hash;      /* the run's config hash */
    char path[PATH_MAX];
    hearth_err *err;
} ingest_ctx;

/* Puts the path of the run directory's file `name` in c->path; *present is 0 when the
 * trainer has not written it (yet), which is no error. */
static int output_path(ingest_ctx *c, const char *name, int *present)
{
    *present = 0;
    if ((size_t)snprintf(c->path, sizeof c->path, "%s/%s", c->dir, name) >= sizeof c->path)
        return herr_set(c->err, HERR_IO, "%s/%s: path too long", c->dir, name);
    struct stat sb;
    *present = stat(c->path, &sb) == 0 || errno != ENOENT;
    return 0;
}

/* Opens the run directory's file `name` for reading (its path left in c->path), refusing
 * anything but a regular file (shape/file_read.h).  A file the trainer has not written
 * (yet) is no error: 0 with *f NULL. */
static int open_output(ingest_ctx *c, const char *name, FILE **f)
{
    *f = NULL;
    int present, fd;
    int rc = output_path(c, name, &present);
    if (rc || !present || (rc = file_open_regular(c->path, &fd, NULL, c->err)))
        return rc;
    if (!(*f = fdopen(fd, "r"))) {
        int e = errno;
        close(fd);
        return herr_set(c->err, HERR_IO, "%s: %s", c->path, strerror(e));
    }
    return 0;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a bool";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Binds v as field f's value at parameter i.  Returns 0 or a message (static text) saying
 * what was expected. */
static const char *bind_field(sqlite3_stmt *st, int i, const db_field *f, json_t *v,
                              char **to_free)
{
    if (json_is_null(v)) {
        sqlite3_bind_null(st, i);
        return NULL;
    }
    switch (f->kind) {
    case FIELD_INT:
        if (json_is_integer(v)) {
            sqlite3_bind_int64(st, i, json_integer_value(v));
            return NULL;
        }
        if (json_is_real(v)) {
            double x = json_real_value(v);
            if (x == floor(x) && fabs(x) < 9.0e15) {
                sqlite3_bind_int64(st, i, (sqlite3_int64)x);
                return NULL;
            }
        }
        return "expected an integer";
    case FIELD_REAL:
        if (json_is_number(v)) {
            sqlite3_bind_double(st, i, json_number_value(v));
            return NULL;
        }
        return "expected a number";
    case FIELD_TEXT:
        if (json_is_string(v)) {
            sqlite3_bind_text(st, i, json_string_value(v), (int)json_string_length(v),
                              SQLITE_STATIC);
            return NULL;
        }
        return "expected a string";
    case FIELD_ANY:
        if (json_is_integer(v))
            sqlite3_bind_int64(st, i, json_integer_value(v));
        else if (json_is_real(v))
            sqlite3_bind_double(st, i, json_real_value(v));
        else if (json_is_string(v))
            sqlite3_bind_text(st, i, json_string_value(v), (int)json_string_length(v),
                              SQLITE_STATIC);
        else if (json_is_boolean(v))
            sqlite3_bind_int(st, i, json_is_true(v));
        else
            return "expected a number, string or bool";
        return NULL;
    case FIELD_JSON:
        *to_free = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!*to_free)
            return "out of memory";
        sqlite3_bind_text(st, i, *to_free, -1, SQLITE_STATIC);
        return NULL;
    }
    return "unsupported field";
}

/* Binds the fields of object `obj` that `t` knows at parameters first.., collects the
 * others into a JSON object bound at parameter `extra_i` (NULL when none).  `skip` is a
 * key handled by the caller.  On a bad value returns HERR_CONFIG with "WHERE: key: what". */
static int bind_object(ingest_ctx *c, sqlite3_stmt *st, const db_field_table *t, int first,
                       int extra_i, json_t *obj, const char *skip, const char *where,
                       char **frees, char **extra_text)
{
    json_t *extra = NULL;
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (skip && strcmp(key, skip) == 0)
            continue;
        const db_field *f = db_field_find(t, key);
        if (!f) {
            if (!extra && !(extra = json_object()))
                return herr_set(c->err, HERR_NOMEM, "out of memory");
            if (json_object_set(extra, key, v)) {
                json_decref(extra);
                return herr_set(c->err, HERR_NOMEM, "out of memory");
            }
            continue;
        }
        size_t idx = (size_t)(f - t->v);
        const char *bad = bind_field(st, first + (int)idx, f, v, &frees[idx]);
        if (bad) {
            json_decref(extra);
            if (strcmp(bad, "out of memory") == 0)
                return herr_set(c->err, HERR_NOMEM, "out of memory");
            return herr_set(c->err, HERR_CONFIG, "%s: %s: %s, got %s", where, key, bad,
                            json_type_name(v));
        }
    }
    if (extra) {
        *extra_text = json_dumps(extra, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(extra);
        if (!*extra_text)
            return herr_set(c->err, HERR_NOMEM, "out of memory");
        sqlite3_bind_text(st, extra_i, *extra_text, -1, SQLITE_STATIC);
    }
    return 0;
}

static void free_all(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i]);
        v[i] = NULL;
    }
}

/* One line of metrics.jsonl. */
static int metrics_line(ingest_ctx *c, sqlite3_stmt *st, json_t *obj, long line)
{
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%ld", c->path, line);
    if (!json_is_object(obj))
        return herr_set(c->err, HERR_CONFIG, "%s: expected a JSON object, got %s", where,
                        json_type_name(obj));
    json_t *step = json_object_get(obj, "step");
    if (!step)
        return herr_set(c->err, HERR_CONFIG, "%s: step: missing", where);
    if (!json_is_integer(step) || json_integer_value(step) < 0)
        return herr_set(c->err, HERR_CONFIG, "%s: step: expected an integer >= 0, got %s",
                        where, json_type_name(step));
    char *frees[16] = {0}, *extra = NULL;
    sqlite3_bind_int64(st, 1, c->run);
    sqlite3_bind_int64(st, 2, json_integer_value(step));
    int rc = bind_object(c, st, &db_metric_fields, 3, 12, obj, "step", where, frees, &extra);
    if (rc == 0 && sqlite3_step(st) != SQLITE_DONE)
        rc = db_fail(c->db, c->err, "recording metrics");
    db_stmt_done(st);
    free_all(frees, db_metric_fields.n);
    free(extra);
    return rc;
}

/* The fast path for a line in the usual shape (flat, known keys, right types): binds it
 * and returns 1, or returns 0 with nothing bound when the full path must handle the line
 * (which also reports any error). */
static int metrics_line_fast(ingest_ctx *c, sqlite3_stmt *st, const char *s, size_t n)
{
    fj_member m[24];
    int cnt = fj_parse(s, n, m, 24);
    if (cnt < 0)
        return 0;
    unsigned seen = 0;
    int has_step = 0;
    for (int k = 0; k < cnt; k++) {
        if (m[k].key_len == 4 && memcmp(m[k].key, "step", 4) == 0) {
            if (has_step || m[k].type != FJ_INT || m[k].i < 0)
                goto full;
            has_step = 1;
            sqlite3_bind_int64(st, 2, m[k].i);
            continue;
        }
        size_t f = 0;
        for (; f < db_metric_fields.n; f++) {
            const char *name = db_metric_fields.v[f].name;
            if (strlen(name) == m[k].key_len && memcmp(name, m[k].key, m[k].key_len) == 0)
                break;
        }
        if (f == db_metric_fields.n || (seen & (1u << f)))
            goto full;
        seen |= 1u << f;
        int param = 3 + (int)f;
        if (m[k].type == FJ_NULL)
            continue;
        if (db_metric_fields.v[f].kind == FIELD_INT) {
            if (m[k].type != FJ_INT)
                goto full;
            sqlite3_bind_int64(st, param, m[k].i);
        } else {
            if (m[k].type != FJ_INT && m[k].type != FJ_REAL)
                goto full;
            sqlite3_bind_double(st, param, m[k].d);
        }
    }
    if (!has_step)
        goto full;
    sqlite3_bind_int64(st, 1, c->run);
    return 1;
full:
    sqlite3_clear_bindings(st);
    return 0;
}

static int ingest_metrics(ingest_ctx *c, ingest_summary *sum)
{
    FILE *f;
    int rc = open_output(c, "metrics.jsonl", &f);
    if (rc || !f)
        return rc;
    sum->has_metrics = 1;
    static const char del_sql[] = "DELETE FROM metrics WHERE run = ?1";
    sqlite3_stmt *st;
    if ((rc = db_prepare(c->db, del_sql, &st, c->err)) == 0) {
        sqlite3_bind_int64(st, 1, c->run);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = db_fail(c->db, c->err, "replacing metrics");
        db_stmt_done(st);
    }
    if (rc == 0)
        rc = db_prepare(c->db, metrics_sql, &st, c->err);
    char *buf = NULL;
    size_t cap = 0;
    long line = 0;
    ssize_t len;
    while (rc == 0 && (len = getline(&buf, &cap, f)) >= 0) {
        line++;
        int terminated = len > 0 && buf[len - 1] == '\n';
        size_t n = (size_t)len;
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
                         buf[n - 1] == '\t'))
            n--;
        size_t lead = 0;
        while (lead < n && (buf[lead] == ' ' || buf[lead] == '\t'))
            lead++;
        if (lead == n)
            continue;   /* blank line */
        if (metrics_line_fast(c, st, buf + lead, n - lead)) {
            if (sqlite3_step(st) != SQLITE_DONE)
                rc = db_fail(c->db, c->err, "recording metrics");
            db_stmt_done(st);
            sum->metric_rows += rc == 0;
            continue;
        }
        json_error_t jerr;
        json_t *obj = json_loadb(buf + lead, n - lead, JSON_REJECT_DUPLICATES, &jerr);
        if (!obj) {
            if (!terminated) {   /* a step still being written, or cut off */
                sum->truncated_tail = 1;
                break;
            }
            rc = herr_set(c->err, HERR_CONFIG, "%s:%ld:%d: %s", c->path, line,
                          jerr.column + (int)lead, jerr.text);
            break;
        }
        rc = metrics_line(c, st, obj, line);
        json_decref(obj);
        if (rc == 0)
            sum->metric_rows++;
    }
    if (rc == 0 && ferror(f))
        rc = herr_set(c->err, HERR_IO, "%s: read error", c->path);
    free(buf);
    fclose(f);
    return rc;
}

/* The hearth-train exit code (DESIGN.md, "Exit codes") that result.json's exit_status
 * stands for, -1 for a value the trainer does not write. */
static int status_exit_code(const json_t *status)
{
    static const struct {
        const char *name;
        int code;
    } codes[] = { { "done", 0 }, { "failed", 1 }, { "diverged", 3 } };
    const char *s = json_string_value(status);   /* NULL when absent or not a string */
    for (size_t i = 0; s && i < sizeof codes / sizeof *codes; i++)
        if (strcmp(s, codes[i].name) == 0)
            return codes[i].code;
    return -1;
}

static int ingest_result(ingest_ctx *c, ingest_summary *sum)
{
    int present;
    int rc = output_path(c, "result.json", &present);
    if (rc || !present)
        return rc;
    json_t *obj;
    if ((rc = file_read_json(c->path, FILE_READ_MAX_TEXT, JSON_REJECT_DUPLICATES, &obj,
                             c->err)))
        return rc;
    char where[PATH_MAX + 8];
    snprintf(where, sizeof where, "%s", c->path);
    if (!json_is_object(obj)) {
        rc = herr_set(c->err, HERR_CONFIG, "%s: expected a JSON object, got %s", where,
                      json_type_name(obj));
        json_decref(obj);
        return rc;
    }
    /* The trainer hashes the config it ran with; a different hash means this directory
     * belongs to another run. */
    json_t *h = json_object_get(obj, "config_hash");
    if (h && !json_is_null(h) &&
        (!json_is_string(h) || strcmp(json_string_value(h), c->hash) != 0)) {
        rc = herr_set(c->err, HERR_CONFIG, "%s: config_hash: %s%s%s does not match the run's "
                      "config hash %s", where, json_is_string(h) ? "'" : "",
                      json_is_string(h) ? json_string_value(h) : json_type_name(h),
                      json_is_string(h) ? "'" : "", c->hash);
        json_decref(obj);
        return rc;
    }
    sqlite3_stmt *st;
    if ((rc = db_prepare(c->db, results_sql, &st, c->err))) {
        json_decref(obj);
        return rc;
    }
    char *frees[32] = {0}, *extra = NULL;
    sqlite3_bind_int64(st, 1, c->run);
    rc = bind_object(c, st, &db_result_fields, 2, 17, obj, "config_hash", where, frees,
                     &extra);
    if (rc == 0 && sqlite3_step(st) != SQLITE_DONE)
        rc = db_fail(c->db, c->err, "recording a result");
    db_stmt_done(st);
    free_all(frees, db_result_fields.n);
    free(extra);
    if (rc == 0) {
        sum->has_result = 1;
        sum->result_exit_code = status_exit_code(json_object_get(obj, "exit_status"));
    }
    json_decref(obj);
    return rc;
}

static int ingest_exit_code(ingest_ctx *c, ingest_summary *sum)
{
    FILE *f;
    int rc = open_output(c, "exit_code", &f);
    if (rc || !f)
        return rc;
    char buf[64];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    int bad_read = ferror(f);
    fclose(f);
    if (bad_read)
        return herr_set(c->err, HERR_IO, "%s: read error", c->path);
    buf[n] = '\0';
    char *p = buf, *end;
    while (*p == ' ' || *p == '\t')
        p++;
    errno = 0;
    long v = strtol(p, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')
        end++;
    if (end == p || *end || errno || v < INT_MIN || v > INT_MAX)
        return herr_set(c->err, HERR_CONFIG, "%s:1: expected an integer exit status", c->path);
    static const char sql[] = "UPDATE runs SET exit_code = ?2 WHERE id = ?1";
    sqlite3_stmt *st;
    if ((rc = db_prepare_int64(c->db, sql, c->run, &st, c->err)))
        return rc;
    sqlite3_bind_int(st, 2, (int)v);
    rc = db_step_done(c->db, st, "recording an exit code", c->err);
    if (rc == 0) {
        sum->has_exit_code = 1;
        sum->exit_code = (int)v;
    }
    return rc;
}

/* Reads the run's key, hash and (when dir is NULL) directory. */
static int find_run(hearth_db *db, const char *run_id, int64_t *pk, char **hash, char **dir,
                    hearth_err *err)
{
    static const char sql[] = "SELECT id, config_hash, run_dir FROM runs WHERE run_id = ?1";
    sqlite3_stmt *st;
    int rc = db_row_text(db, sql, run_id, &st, "reading a run", err);
    if (rc != 1)
        return rc ? rc : herr_set(err, HERR_CONFIG, "no run named '%s'", run_id);
    *pk = sqlite3_column_int64(st, 0);
    const char *h = (const char *)sqlite3_column_text(st, 1);
    const char *d = (const char *)sqlite3_column_text(st, 2);
    *hash = strdup(h ? h : "");
    *dir = d ? strdup(d) : NULL;
    rc = *hash && (!d || *dir) ? 0 : herr_set(err, HERR_NOMEM, "out of memory");
    db_stmt_done(st);
    return rc;
}

int ingest_run(hearth_db *db, const char *run_id, const char *run_dir, ingest_summary *out,
               hearth_err *err)
{
    ingest_summary sum;
    memset(&sum, 0, sizeof sum);
    sum.result_exit_code = -1;
    if (out)
        *out = sum;
    int64_t pk = 0;
    char *hash = NULL, *dir = NULL;
    int rc = find_run(db, run_id, &pk, &hash, &dir, err);
    if (rc == 0 && !run_dir && !dir)
        rc = herr_set(err, HERR_CONFIG, "run %s has no run directory recorded", run_id);
    if (rc) {
        free(hash);
        free(dir);
        return rc;
    }
    ingest_ctx *c = malloc(sizeof *c);
    if (!c) {
        free(hash);
        free(dir);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    c->db = db;
    c->run = pk;
    c->dir = run_dir ? run_dir : dir;
    c->hash = hash;
    c->err = err;
    if ((rc = db_tx_begin(db, err)) == 0) {
        int r = ingest_exit_code(c, &sum);
        if (r == 0)
            r = ingest_result(c, &sum);
        if (r == 0)
            r = ingest_metrics(c, &sum);
        rc = db_tx_end(db, r, err);
    }
    free(c);
    free(hash);
    free(dir);
    if (rc == 0 && out)
        *out = sum;
    return rc;
}
