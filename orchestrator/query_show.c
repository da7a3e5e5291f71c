/* query_show.c - hearth show RUN and hearth compare A B.  See query.h.
 *
 * Both collect their rows (section, key, values) first and then render them in the chosen
 * format, so the three formats always carry the same content. */
#include "query.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "config_kv.h"
#include "db_fields.h"
#include "runs_db.h"

/* One row of a section: up to 4 values. */
typedef struct {
    const char *section;   /* static */
    char *key;
    report_cell v[4];
    char *texts[4];        /* owned text of v[i] */
} entry;

typedef struct {
    entry *v;
    size_t n, cap;
    int oom;
} entries;

static void entries_free(entries *e)
{
    for (size_t i = 0; i < e->n; i++) {
        free(e->v[i].key);
        for (int k = 0; k < 4; k++)
            free(e->v[i].texts[k]);
    }
    free(e->v);
    memset(e, 0, sizeof *e);
}

/* Appends a row with `nv` values; text values are copied. */
static entry *entries_add(entries *e, const char *section, const char *key,
                          const report_cell *vals, int nv)
{
    if (e->oom)
        return NULL;
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 64;
        entry *n = realloc(e->v, cap * sizeof *n);
        if (!n) {
            e->oom = 1;
            return NULL;
        }
        e->v = n;
        e->cap = cap;
    }
    entry *x = &e->v[e->n];
    memset(x, 0, sizeof *x);
    x->section = section;
    if (!(x->key = strdup(key))) {
        e->oom = 1;
        return NULL;
    }
    for (int i = 0; i < nv; i++) {
        x->v[i] = vals[i];
        if ((vals[i].kind == CELL_TEXT || vals[i].kind == CELL_JSON) && vals[i].s) {
            if (!(x->texts[i] = strdup(vals[i].s))) {
                free(x->key);
                for (int k = 0; k < i; k++)
                    free(x->texts[k]);
                e->oom = 1;
                return NULL;
            }
            x->v[i].s = x->texts[i];
        }
    }
    e->n++;
    return x;
}

/* A JSON value as a cell; arrays/objects as compact JSON text in *tmp (caller frees). */
static report_cell json_cell(json_t *v, char **tmp)
{
    report_cell c;
    memset(&c, 0, sizeof c);
    *tmp = NULL;
    if (!v)
        return c;
    switch (json_typeof(v)) {
    case JSON_INTEGER: c.kind = CELL_INT; c.i = json_integer_value(v); break;
    case JSON_REAL: c.kind = CELL_REAL; c.d = json_real_value(v); break;
    case JSON_STRING: c.kind = CELL_TEXT; c.s = json_string_value(v); break;
    case JSON_TRUE: c.kind = CELL_BOOL; c.i = 1; break;
    case JSON_FALSE: c.kind = CELL_BOOL; c.i = 0; break;
    case JSON_NULL: break;
    default:
        *tmp = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
        c.kind = *tmp ? CELL_JSON : CELL_NULL;
        c.s = *tmp;
        break;
    }
    return c;
}

static report_cell cell_of_column(sqlite3_stmt *st, int i, int json_text)
{
    report_cell c;
    memset(&c, 0, sizeof c);
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_INTEGER: c.kind = CELL_INT; c.i = sqlite3_column_int64(st, i); break;
    case SQLITE_FLOAT: c.kind = CELL_REAL; c.d = sqlite3_column_double(st, i); break;
    case SQLITE_NULL: break;
    default:
        c.kind = json_text ? CELL_JSON : CELL_TEXT;
        c.s = (const char *)sqlite3_column_text(st, i);
        break;
    }
    return c;
}

static report_cell text_cell(const char *s)
{
    report_cell c;
    memset(&c, 0, sizeof c);
    c.kind = s ? CELL_TEXT : CELL_NULL;
    c.s = s;
    return c;
}

static report_cell int_cell(int64_t i)
{
    report_cell c;
    memset(&c, 0, sizeof c);
    c.kind = CELL_INT;
    c.i = i;
    return c;
}

/* The run's result fields, in db_result_fields order (all null without a result). */
static int read_result(hearth_db *db, int64_t run, report_cell *cells, char **texts,
                       int *has, hearth_err *err)
{
    static const char sql[] =
        "SELECT steps, step_ms_median, step_ms_p10, step_ms_p90, tokens_per_s, "
        "tokens_per_s_per_gpu, flops_per_token, mfu, peak_mem_bytes, final_loss, exit_status, "
        "device, device_count, nodes, versions FROM results WHERE run = ?1";
    size_t n = db_result_fields.n;
    for (size_t i = 0; i < n; i++) {
        memset(&cells[i], 0, sizeof cells[i]);
        texts[i] = NULL;
    }
    *has = 0;
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, run, &st, err);
    if (rc)
        return rc;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *has = 1;
        rc = 0;
        for (size_t i = 0; i < n; i++) {
            cells[i] = cell_of_column(st, (int)i, db_result_fields.v[i].kind == FIELD_JSON);
            if (cells[i].s) {
                if (!(texts[i] = strdup(cells[i].s)))
                    rc = herr_set(err, HERR_NOMEM, "out of memory");
                cells[i].s = texts[i];
            }
        }
    } else {
        rc = rc == SQLITE_DONE ? 0 : db_fail(db, err, "reading a result");
    }
    db_stmt_done(st);
    return rc;
}

static int load_run(hearth_db *db, const char *run_id, run_info *ri, json_t **config,
                    hearth_err *err)
{
    int rc = runs_db_get(db, run_id, ri, err);
    if (rc < 0)
        return rc;
    if (rc == 0)
        return herr_set(err, HERR_CONFIG, "no run named '%s'", run_id);
    json_error_t jerr;
    *config = json_loads(ri->config_json, 0, &jerr);
    if (!*config) {
        run_info_free(ri);
        return herr_set(err, HERR_RUNTIME, "run %s: stored config is not JSON: %s", run_id,
                        jerr.text);
    }
    return 0;
}

/* ---- rendering ---------------------------------------------------------------------------- */

/* Table: each section as a titled table; CSV: one table with a leading section column;
 * JSON: written by the callers (their shapes differ). */
static int render_sections(const entries *e, const char *const *sections, int n_sections,
                           const char *const *val_names, int nv, const int *section_nv,
                           report_format fmt, FILE *out, hearth_err *err)
{
    if (fmt == REPORT_CSV) {
        const char *names[6] = {"section", "key"};
        for (int i = 0; i < nv; i++)
            names[2 + i] = val_names[i];
        report *r = report_begin(out, fmt, (size_t)(2 + nv), names);
        if (!r)
            return herr_set(err, HERR_NOMEM, "out of memory");
        for (size_t i = 0; i < e->n; i++) {
            report_cell row[6];
            row[0] = text_cell(e->v[i].section);
            row[1] = text_cell(e->v[i].key);
            for (int k = 0; k < nv; k++)
                row[2 + k] = e->v[i].v[k];
            int rc = report_row(r, row, err);
            if (rc) {
                report_abort(r);
                return rc;
            }
        }
        return report_end(r, err);
    }
    for (int s = 0; s < n_sections; s++) {
        fprintf(out, "%s%s\n", s ? "\n" : "", sections[s]);
        const char *names[5] = {"key"};
        int snv = section_nv ? section_nv[s] : nv;
        for (int i = 0; i < snv; i++)
            names[1 + i] = val_names[i];
        report *r = report_begin(out, REPORT_TABLE, (size_t)(1 + snv), names);
        if (!r)
            return herr_set(err, HERR_NOMEM, "out of memory");
        for (size_t i = 0; i < e->n; i++) {
            if (strcmp(e->v[i].section, sections[s]) != 0)
                continue;
            report_cell row[5];
            row[0] = text_cell(e->v[i].key);
            for (int k = 0; k < snv; k++)
                row[1 + k] = e->v[i].v[k];
            int rc = report_row(r, row, err);
            if (rc) {
                report_abort(r);
                return rc;
            }
        }
        int rc = report_end(r, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* Writes one cell as a JSON value (through a one-off report cell writer). */
static void json_value(FILE *out, const report_cell *c)
{
    switch (c->kind) {
    case CELL_NULL: fputs("null", out); break;
    case CELL_INT: fprintf(out, "%lld", (long long)c->i); break;
    case CELL_BOOL: fputs(c->i ? "true" : "false", out); break;
    case CELL_REAL: report_write_real(out, c->d, "null"); break;
    case CELL_TEXT: report_write_json_string(out, c->s); break;
    case CELL_JSON: fputs(c->s && *c->s ? c->s : "null", out); break;
    }
}

static int finish_stream(FILE *out, hearth_err *err)
{
    if (fflush(out) != 0 || ferror(out))
        return herr_set(err, HERR_IO, "error writing the report");
    return 0;
}

/* ---- show --------------------------------------------------------------------------------- */

typedef struct {
    entries *e;
} show_ctx;

static int show_config_leaf(void *ctx, const char *key, json_t *v, int type, hearth_err *err)
{
    (void)type;
    show_ctx *c = ctx;
    char *tmp;
    report_cell cell = json_cell(v, &tmp);
    entries_add(c->e, "config", key, &cell, 1);
    free(tmp);
    return c->e->oom ? herr_set(err, HERR_NOMEM, "out of memory") : 0;
}

static int show_metrics(hearth_db *db, int64_t run, entries *e, hearth_err *err)
{
    static const char sql[] =
        "SELECT count(*), min(step), max(step), avg(step_ms), max(peak_mem_bytes), "
        "(SELECT loss FROM metrics WHERE run = ?1 ORDER BY step ASC LIMIT 1), "
        "(SELECT loss FROM metrics WHERE run = ?1 ORDER BY step DESC LIMIT 1) "
        "FROM metrics WHERE run = ?1";
    static const char *const names[] = {
        "steps_recorded", "first_step", "last_step", "step_ms_mean", "peak_mem_bytes_max",
        "first_loss", "last_loss",
    };
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, run, &st, err);
    if (rc)
        return rc;
    if (sqlite3_step(st) == SQLITE_ROW) {
        for (int i = 0; i < 7; i++) {
            report_cell c = cell_of_column(st, i, 0);
            entries_add(e, "metrics", names[i], &c, 1);
        }
        rc = e->oom ? herr_set(err, HERR_NOMEM, "out of memory") : 0;
    } else {
        rc = db_fail(db, err, "summarising metrics");
    }
    db_stmt_done(st);
    return rc;
}

static int show_events(hearth_db *db, int64_t run, entries *e, hearth_err *err)
{
    static const char sql[] =
        "SELECT at, from_state, to_state, attempt, backend_job_id, exit_code, note "
        "FROM run_events WHERE run = ?1 ORDER BY id";
    sqlite3_stmt *st;
    int rc = db_prepare_int64(db, sql, run, &st, err);
    if (rc)
        return rc;
    long n = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        char key[32], *text = NULL;
        snprintf(key, sizeof key, "%ld", ++n);
        const char *job = (const char *)sqlite3_column_text(st, 4);
        const char *note = (const char *)sqlite3_column_text(st, 6);
        char exitbuf[32] = "";
        if (sqlite3_column_type(st, 5) != SQLITE_NULL)
            snprintf(exitbuf, sizeof exitbuf, ", exit %d", sqlite3_column_int(st, 5));
        if (asprintf(&text, "%s %s -> %s (attempt %d%s%s%s)%s%s",
                     (const char *)sqlite3_column_text(st, 0),
                     (const char *)sqlite3_column_text(st, 1),
                     (const char *)sqlite3_column_text(st, 2), sqlite3_column_int(st, 3),
                     job ? ", job " : "", job ? job : "", exitbuf, note ? ": " : "",
                     note ? note : "") < 0) {
            rc = SQLITE_NOMEM;
            break;
        }
        report_cell c = text_cell(text);
        entries_add(e, "events", key, &c, 1);
        free(text);
        if (e->oom) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    rc = db_rows_end(db, rc, "reading run events", err);
    db_stmt_done(st);
    return rc;
}

static int show_collect(hearth_db *db, const run_info *ri, json_t *config, entries *e,
                        hearth_err *err)
{
    report_cell c;
    c = text_cell(ri->run_id); entries_add(e, "run", "run_id", &c, 1);
    c = text_cell(ri->experiment); entries_add(e, "run", "experiment", &c, 1);
    c = int_cell(ri->seq); entries_add(e, "run", "seq", &c, 1);
    c = text_cell(run_state_name(ri->state)); entries_add(e, "run", "state", &c, 1);
    c = text_cell(ri->config_hash); entries_add(e, "run", "config_hash", &c, 1);
    c = int_cell(ri->attempts); entries_add(e, "run", "attempts", &c, 1);
    c = ri->has_exit_code ? int_cell(ri->exit_code) : text_cell(NULL);
    entries_add(e, "run", "exit_code", &c, 1);
    c = text_cell(ri->backend); entries_add(e, "run", "backend", &c, 1);
    c = text_cell(ri->backend_job_id); entries_add(e, "run", "job_id", &c, 1);
    c = text_cell(ri->run_dir); entries_add(e, "run", "run_dir", &c, 1);
    c = text_cell(ri->created_at); entries_add(e, "run", "created_at", &c, 1);
    c = text_cell(ri->submitted_at); entries_add(e, "run", "submitted_at", &c, 1);
    c = text_cell(ri->started_at); entries_add(e, "run", "started_at", &c, 1);
    c = text_cell(ri->ended_at); entries_add(e, "run", "ended_at", &c, 1);
    if (e->oom)
        return herr_set(err, HERR_NOMEM, "out of memory");

    report_cell res[32];
    char *texts[32];
    int has;
    int rc = read_result(db, ri->pk, res, texts, &has, err);
    for (size_t i = 0; rc == 0 && has && i < db_result_fields.n; i++)
        entries_add(e, "result", db_result_fields.v[i].name, &res[i], 1);
    for (size_t i = 0; i < db_result_fields.n; i++)
        free(texts[i]);
    if (rc)
        return rc;
    if (e->oom)
        return herr_set(err, HERR_NOMEM, "out of memory");
    if ((rc = show_metrics(db, ri->pk, e, err)))
        return rc;
    show_ctx sc = {e};
    if ((rc = config_flatten(config, show_config_leaf, &sc, err)))
        return rc;
    return show_events(db, ri->pk, e, err);
}

int query_show(hearth_db *db, const char *run_id, report_format fmt, FILE *out,
               hearth_err *err)
{
    run_info ri;
    json_t *config;
    int rc = load_run(db, run_id, &ri, &config, err);
    if (rc)
        return rc;
    entries e = {0};
    rc = show_collect(db, &ri, config, &e, err);
    static const char *const sections[] = {"run", "result", "metrics", "config", "events"};
    static const char *const val_names[] = {"value"};
    if (rc == 0 && fmt != REPORT_JSON) {
        rc = render_sections(&e, sections, 5, val_names, 1, NULL, fmt, out, err);
    } else if (rc == 0) {
        fputc('{', out);
        for (int s = 0; s < 5; s++) {
            fprintf(out, "%s\"%s\":{", s ? ",\n" : "\n", sections[s]);
            int first = 1;
            for (size_t i = 0; i < e.n; i++) {
                if (strcmp(e.v[i].section, sections[s]) != 0)
                    continue;
                if (!first)
                    fputc(',', out);
                first = 0;
                report_write_json_string(out, e.v[i].key);
                fputc(':', out);
                json_value(out, &e.v[i].v[0]);
            }
            fputc('}', out);
        }
        fputs("\n}\n", out);
        rc = finish_stream(out, err);
    }
    entries_free(&e);
    json_decref(config);
    run_info_free(&ri);
    return rc;
}

/* ---- compare ------------------------------------------------------------------------------ */

typedef struct {
    json_t *flat;   /* key -> value */
} flat_ctx;

static int flat_leaf(void *ctx, const char *key, json_t *v, int type, hearth_err *err)
{
    (void)type;
    flat_ctx *c = ctx;
    if (json_object_set(c->flat, key, v))
        return herr_set(err, HERR_NOMEM, "out of memory");
    return 0;
}

static int flatten(json_t *config, json_t **out, hearth_err *err)
{
    flat_ctx c = {json_object()};
    if (!c.flat)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int rc = config_flatten(config, flat_leaf, &c, err);
    if (rc) {
        json_decref(c.flat);
        return rc;
    }
    *out = c.flat;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys of both flattened configs whose values differ, sorted. */
static int config_diff(json_t *fa, json_t *fb, entries *e, hearth_err *err)
{
    size_t cap = json_object_size(fa) + json_object_size(fb), n = 0;
    const char **keys = malloc((cap ? cap : 1) * sizeof *keys);
    if (!keys)
        return herr_set(err, HERR_NOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(fa, k, v) {
        if (!json_equal(v, json_object_get(fb, k)))
            keys[n++] = k;
    }
    json_object_foreach(fb, k, v) {
        if (!json_object_get(fa, k))
            keys[n++] = k;
    }
    qsort(keys, n, sizeof *keys, cmp_str);
    for (size_t i = 0; i < n; i++) {
        char *ta, *tb;
        report_cell vals[2];
        vals[0] = json_cell(json_object_get(fa, keys[i]), &ta);
        vals[1] = json_cell(json_object_get(fb, keys[i]), &tb);
        entries_add(e, "config", keys[i], vals, 2);
        free(ta);
        free(tb);
    }
    free(keys);
    return e->oom ? herr_set(err, HERR_NOMEM, "out of memory") : 0;
}

static int cell_number(const report_cell *c, double *x)
{
    if (c->kind == CELL_INT) {
        *x = (double)c->i;
        return 1;
    }
    if (c->kind == CELL_REAL) {
        *x = c->d;
        return 1;
    }
    return 0;
}

int query_compare(hearth_db *db, const char *run_a, const char *run_b, report_format fmt,
                  FILE *out, hearth_err *err)
{
    run_info ra, rb;
    json_t *ca, *cb, *fa = NULL, *fb = NULL;
    int rc = load_run(db, run_a, &ra, &ca, err);
    if (rc)
        return rc;
    if ((rc = load_run(db, run_b, &rb, &cb, err))) {
        json_decref(ca);
        run_info_free(&ra);
        return rc;
    }
    entries e = {0};
    if ((rc = flatten(ca, &fa, err)) == 0 && (rc = flatten(cb, &fb, err)) == 0)
        rc = config_diff(fa, fb, &e, err);

    report_cell res_a[32], res_b[32];
    char *texts_a[32] = {0}, *texts_b[32] = {0};
    int has_a = 0, has_b = 0;
    if (rc == 0)
        rc = read_result(db, ra.pk, res_a, texts_a, &has_a, err);
    if (rc == 0)
        rc = read_result(db, rb.pk, res_b, texts_b, &has_b, err);
    for (size_t i = 0; rc == 0 && i < db_result_fields.n; i++) {
        report_cell vals[3];
        vals[0] = res_a[i];
        vals[1] = res_b[i];
        memset(&vals[2], 0, sizeof vals[2]);
        double x, y;
        if (cell_number(&res_a[i], &x) && cell_number(&res_b[i], &y) && x != 0) {
            vals[2].kind = CELL_REAL;
            vals[2].d = y / x;
        }
        entries_add(&e, "results", db_result_fields.v[i].name, vals, 3);
        if (e.oom)
            rc = herr_set(err, HERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < 32; i++) {
        free(texts_a[i]);
        free(texts_b[i]);
    }

    if (rc == 0 && fmt != REPORT_JSON) {
        static const char *const sections[] = {"config", "results"};
        const char *vn[3] = {ra.run_id, rb.run_id, "ratio"};
        if (fmt == REPORT_CSV) {
            vn[0] = "a";
            vn[1] = "b";
        }
        static const int section_nv[] = {2, 3};
        rc = render_sections(&e, sections, 2, vn, 3, section_nv, fmt, out, err);
    } else if (rc == 0) {
        fputs("{\"a\":", out);
        report_write_json_string(out, ra.run_id);
        fputs(",\"b\":", out);
        report_write_json_string(out, rb.run_id);
        static const char *const sections[] = {"config", "results"};
        for (int s = 0; s < 2; s++) {
            fprintf(out, ",\n\"%s\":[", sections[s]);
            int first = 1;
            for (size_t i = 0; i < e.n; i++) {
                if (strcmp(e.v[i].section, sections[s]) != 0)
                    continue;
                fputs(first ? "\n{\"key\":" : ",\n{\"key\":", out);
                first = 0;
                report_write_json_string(out, e.v[i].key);
                fputs(",\"a\":", out);
                json_value(out, &e.v[i].v[0]);
                fputs(",\"b\":", out);
                json_value(out, &e.v[i].v[1]);
                if (s == 1) {
                    fputs(",\"ratio\":", out);
                    json_value(out, &e.v[i].v[2]);
                }
                fputc('}', out);
            }
            fputs(first ? "]" : "\n]", out);
        }
        fputs("}\n", out);
        rc = finish_stream(out, err);
    }
    entries_free(&e);
    json_decref(fa);
    json_decref(fb);
    json_decref(ca);
    json_decref(cb);
    run_info_free(&ra);
    run_info_free(&rb);
    return rc;
}
