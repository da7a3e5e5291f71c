/* select_db.c - layer benchmark sets, decisions and matching runs in the results
 * database (select_db.h). */
#include "select_db.h"
#include "shape/file_read.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/sha.h>

/* ---- layer_bench.json ------------------------------------------------------------------ */

/* A top-level string field (or null / absent when `optional`); numbers are kept as text
 * (a cuBLASLt version is often written as one). */
static int header_str(const char *file, json_t *root, const char *key, char *out, size_t size,
                      int optional, hearth_err *err)
{
    json_t *v = json_object_get(root, key);
    out[0] = '\0';
    if ((!v || json_is_null(v)) && optional)
        return 0;
    if (json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) < size) {
        snprintf(out, size, "%s", json_string_value(v));
        return 0;
    }
    if (optional && json_is_integer(v)) {
        snprintf(out, size, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return 0;
    }
    return herr_set(err, HERR_CONFIG, "%s: %s: expected a non-empty string%s", file, key,
                    optional ? " or null" : "");
}

/* device: absent (older files), or what --bench-layers writes. */
static int header_device(const char *file, const char *device, hearth_err *err)
{
    if (!device[0] || !strcmp(device, "cpu") || !strcmp(device, "cuda"))
        return 0;
    return herr_set(err, HERR_CONFIG, "%s: device: expected cpu or cuda, got \"%s\"", file,
                    device);
}

/* fp8_err: absent or null (not measured: -1), else a number >= 0. */
static int row_err(const char *file, size_t i, json_t *row, double *out, hearth_err *err)
{
    json_t *v = json_object_get(row, "fp8_err");
    *out = -1;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v) || !(json_number_value(v) >= 0) || json_number_value(v) > 1e12)
        return herr_set(err, HERR_CONFIG, "%s: rows[%zu].fp8_err: expected a relative error "
                        ">= 0 or null", file, i);
    *out = json_number_value(v);
    return 0;
}

static int row_int(const char *file, size_t i, json_t *row, const char *key, long min,
                   long *out, hearth_err *err)
{
    json_t *v = json_object_get(row, key);
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > 1L << 40)
        return herr_set(err, HERR_CONFIG, "%s: rows[%zu].%s: expected an integer >= %ld", file,
                        i, key, min);
    *out = (long)json_integer_value(v);
    return 0;
}

static int row_ms(const char *file, size_t i, json_t *row, const char *key, double *out,
                  hearth_err *err)
{
    json_t *v = json_object_get(row, key);
    if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 1e12)
        return herr_set(err, HERR_CONFIG, "%s: rows[%zu].%s: expected a time in ms > 0", file,
                        i, key);
    *out = json_number_value(v);
    return 0;
}

static int row_name(const char *file, size_t i, json_t *row, const char *key,
                    int (*known)(const char *), const char *choices, char *out, size_t size,
                    hearth_err *err)
{
    const char *s = json_string_value(json_object_get(row, key));
    if (!s || !known(s))
        return herr_set(err, HERR_CONFIG, "%s: rows[%zu].%s: expected one of %s", file, i, key,
                        choices);
    snprintf(out, size, "%s", s);
    return 0;
}

int select_bench_parse(const char *file, const char *text, size_t len, select_bench_set *out,
                       hearth_err *err)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return herr_set(err, HERR_CONFIG, "%s:%d:%d: %s", file, je.line, je.column, je.text);
    int rc = 0;
    json_t *rows = json_object_get(root, "rows");
    if (!json_is_object(root))
        rc = herr_set(err, HERR_CONFIG, "%s: expected a JSON object", file);
    else if (!(rc = header_str(file, root, "gpu", out->gpu, sizeof out->gpu, 0, err)) &&
             !(rc = header_str(file, root, "model", out->model, sizeof out->model, 0, err)) &&
             !(rc = header_str(file, root, "cuda", out->cuda, sizeof out->cuda, 1, err)) &&
             !(rc = header_str(file, root, "cublaslt", out->cublaslt, sizeof out->cublaslt, 1,
                               err)) &&
             !(rc = header_str(file, root, "device", out->device, sizeof out->device, 1,
                               err)) &&
             !(rc = header_str(file, root, "build", out->build, sizeof out->build, 1, err)) &&
             !(rc = header_str(file, root, "date", out->date, sizeof out->date, 1, err)) &&
             !(rc = header_device(file, out->device, err)) &&
             (!json_is_array(rows) || json_array_size(rows) == 0))
        rc = herr_set(err, HERR_CONFIG, "%s: rows: expected a non-empty array", file);
    if (!rc && !(out->rows = calloc(json_array_size(rows), sizeof *out->rows)))
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    for (size_t i = 0; !rc && i < json_array_size(rows); i++) {
        json_t *r = json_array_get(rows, i);
        select_bench_row *b = &out->rows[i];
        long tp = 0, repeats = 0;
        if (!json_is_object(r))
            rc = herr_set(err, HERR_CONFIG, "%s: rows[%zu]: expected an object", file, i);
        if (!rc)
            rc = row_name(file, i, r, "component", select_component_known,
                          "encoder, projector, decoder, experts", b->component,
                          sizeof b->component, err);
        if (!rc)
            rc = row_name(file, i, r, "kind", select_kind_known,
                          "qkv, proj, fc1, fc2, expert_fc1, expert_fc2, shared_fc1, shared_fc2, "
                          "router, lm_head",
                          b->kind, sizeof b->kind, err);
        if (!rc && !(rc = row_int(file, i, r, "tp", 1, &tp, err)))
            b->tp = (int)tp;
        if (!rc)
            rc = row_int(file, i, r, "tokens", 1, &b->tokens, err);
        if (!rc)
            rc = row_ms(file, i, r, "bf16_ms", &b->bf16_ms, err);
        if (!rc)
            rc = row_ms(file, i, r, "fp8_ms", &b->fp8_ms, err);
        if (!rc && !(rc = row_int(file, i, r, "repeats", 1, &repeats, err)))
            b->repeats = (int)repeats;
        if (!rc)
            rc = row_err(file, i, r, &b->fp8_err, err);
        if (!rc)
            out->n++;
    }
    json_decref(root);
    if (rc)
        select_bench_set_free(out);
    return rc;
}

int select_bench_ingest(hearth_db *db, const char *path, int64_t run, int *added,
                        select_bench_set *set, hearth_err *err)
{
    char *text = NULL;
    size_t len = 0;
    select_bench_set b;
    if (added)
        *added = 0;
    int rc = file_read_bounded(path, FILE_READ_MAX_TEXT, &text, &len, err);
    if (rc)
        return rc;
    if ((rc = select_bench_parse(path, text, len, &b, err))) {
        free(text);
        return rc;
    }
    unsigned char md[SHA256_DIGEST_LENGTH];
    char hex[2 * SHA256_DIGEST_LENGTH + 1];
    SHA256((const unsigned char *)text, len, md);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    free(text);
    sqlite3_stmt *st = NULL;
    rc = db_tx_begin(db, err);
    if (rc) {
        select_bench_set_free(&b);
        return rc;
    }
    int found = db_row_text(db, "SELECT id FROM layer_bench_sets WHERE content_sha256 = ?1", hex,
                            &st, "looking up a layer benchmark", err);
    if (found == 1)
        db_stmt_done(st);
    rc = found < 0 ? found : 0;
    if (!rc && !found) {
        if (!(rc = db_prepare(db, "INSERT INTO layer_bench_sets (run, source, content_sha256, "
                              "gpu, model, cuda_version, cublaslt_version, device, build, "
                              "measured_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                              &st, err))) {
            if (run > 0)
                sqlite3_bind_int64(st, 1, run);
            sqlite3_bind_text(st, 2, path, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, hex, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 4, b.gpu, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 5, b.model, -1, SQLITE_STATIC);
            if (b.cuda[0])
                sqlite3_bind_text(st, 6, b.cuda, -1, SQLITE_STATIC);
            if (b.cublaslt[0])
                sqlite3_bind_text(st, 7, b.cublaslt, -1, SQLITE_STATIC);
            const char *opt[3] = { b.device, b.build, b.date };
            for (int k = 0; k < 3; k++)
                if (opt[k][0])
                    sqlite3_bind_text(st, 8 + k, opt[k], -1, SQLITE_STATIC);
            rc = db_step_done(db, st, "recording a layer benchmark", err);
        }
        int64_t set_id = sqlite3_last_insert_rowid(db_sqlite(db));
        for (size_t i = 0; !rc && i < b.n; i++) {
            const select_bench_row *r = &b.rows[i];
            if ((rc = db_prepare(db, "INSERT INTO layer_bench (bench, component, kind, tp, "
                                 "tokens, bf16_ms, fp8_ms, repeats, fp8_err) VALUES "
                                 "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)", &st, err)))
                break;
            sqlite3_bind_int64(st, 1, set_id);
            sqlite3_bind_text(st, 2, r->component, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 3, r->kind, -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 4, r->tp);
            sqlite3_bind_int64(st, 5, r->tokens);
            sqlite3_bind_double(st, 6, r->bf16_ms);
            sqlite3_bind_double(st, 7, r->fp8_ms);
            sqlite3_bind_int(st, 8, r->repeats);
            if (r->fp8_err >= 0)
                sqlite3_bind_double(st, 9, r->fp8_err);
            int step = sqlite3_step(st);
            if ((step & 0xff) == SQLITE_CONSTRAINT)
                rc = herr_set(err, HERR_CONFIG, "%s: rows[%zu]: %s %s tp %d tokens %ld is "
                              "measured twice", path, i, r->component, r->kind, r->tp,
                              r->tokens);
            else if (step != SQLITE_DONE)
                rc = db_fail(db, err, "recording layer benchmark rows");
            db_stmt_done(st);
        }
        if (!rc && added)
            *added = 1;
    }
    rc = db_tx_end(db, rc, err);
    if (!rc && set)
        *set = b;
    else
        select_bench_set_free(&b);
    return rc;
}

int select_bench_load(hearth_db *db, const char *model, const char *gpu,
                      select_bench_set *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st;
    int rc = db_prepare(db, "SELECT id, gpu, model, coalesce(cuda_version, ''), "
                        "coalesce(cublaslt_version, ''), coalesce(device, ''), coalesce(build, ''), "
                        "coalesce(measured_at, '') FROM layer_bench_sets WHERE model = ?1 "
                        "AND (?2 IS NULL OR gpu = ?2) ORDER BY id DESC LIMIT 1", &st, err);
    if (rc)
        return rc;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
    if (gpu)
        sqlite3_bind_text(st, 2, gpu, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s != SQLITE_ROW) {
        db_stmt_done(st);
        return s == SQLITE_DONE ? 0 : db_fail(db, err, "reading layer benchmarks");
    }
    int64_t id = sqlite3_column_int64(st, 0);
    snprintf(out->gpu, sizeof out->gpu, "%s", (const char *)sqlite3_column_text(st, 1));
    snprintf(out->model, sizeof out->model, "%s", (const char *)sqlite3_column_text(st, 2));
    snprintf(out->cuda, sizeof out->cuda, "%s", (const char *)sqlite3_column_text(st, 3));
    snprintf(out->cublaslt, sizeof out->cublaslt, "%s", (const char *)sqlite3_column_text(st, 4));
    snprintf(out->device, sizeof out->device, "%s", (const char *)sqlite3_column_text(st, 5));
    snprintf(out->build, sizeof out->build, "%s", (const char *)sqlite3_column_text(st, 6));
    snprintf(out->date, sizeof out->date, "%s", (const char *)sqlite3_column_text(st, 7));
    db_stmt_done(st);
    if ((rc = db_prepare_int64(db, "SELECT component, kind, tp, tokens, bf16_ms, fp8_ms, "
                               "repeats, coalesce(fp8_err, -1) FROM layer_bench WHERE bench = ?1 ORDER BY id", id, &st,
                               err)))
        return rc;
    size_t cap = 0;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        if (out->n == cap) {
            select_bench_row *g = realloc(out->rows, (cap = cap * 2 + 16) * sizeof *g);
            if (!g) {
                s = SQLITE_NOMEM;
                break;
            }
            out->rows = g;
        }
        select_bench_row *r = &out->rows[out->n++];
        memset(r, 0, sizeof *r);
        snprintf(r->component, sizeof r->component, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(r->kind, sizeof r->kind, "%s", (const char *)sqlite3_column_text(st, 1));
        r->tp = sqlite3_column_int(st, 2);
        r->tokens = (long)sqlite3_column_int64(st, 3);
        r->bf16_ms = sqlite3_column_double(st, 4);
        r->fp8_ms = sqlite3_column_double(st, 5);
        r->repeats = sqlite3_column_int(st, 6);
        r->fp8_err = sqlite3_column_double(st, 7);
    }
    rc = db_rows_end(db, s, "reading layer benchmark rows", err);
    db_stmt_done(st);
    if (rc) {
        select_bench_set_free(out);
        return rc;
    }
    return 1;
}

/* ---- decisions ------------------------------------------------------------------------- */

int select_decision_record(hearth_db *db, const select_decision *d, int64_t *id,
                           hearth_err *err)
{
    sqlite3_stmt *st;
    int rc = db_prepare(db, "INSERT INTO decisions (kind, experiment, config_hash, subject, "
                        "decision, method, evidence) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)", &st,
                        err);
    if (rc)
        return rc;
    const char *v[7] = { d->kind, d->experiment, d->config_hash, d->subject, d->decision,
                         d->method, d->evidence };
    for (int i = 0; i < 7; i++)
        if (v[i])
            sqlite3_bind_text(st, i + 1, v[i], -1, SQLITE_STATIC);
    rc = db_step_done(db, st, "recording a decision", err);
    if (!rc && id)
        *id = sqlite3_last_insert_rowid(db_sqlite(db));
    return rc;
}

/* ---- runs ------------------------------------------------------------------------------ */

static int jint(json_t *o, const char *path)
{
    char key[64];
    snprintf(key, sizeof key, "%s", path);
    json_t *v = o;
    for (char *tok = strtok(key, "."); tok && v; tok = strtok(NULL, "."))
        v = json_object_get(v, tok);
    return json_is_integer(v) ? (int)json_integer_value(v) : json_is_true(v) ? 1 : 0;
}

static const char *jstr(json_t *o, const char *a, const char *b, const char *c)
{
    json_t *v = json_object_get(o, a);
    if (b)
        v = json_object_get(v, b);
    if (c)
        v = json_object_get(v, c);
    return json_is_string(v) ? json_string_value(v) : "";
}

int select_runs_of_model(hearth_db *db, const char *model, select_run **out, size_t *n,
                         hearth_err *err)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st;
    int rc = db_prepare_text(db,
        "SELECT r.run_id, r.config_json, s.tokens_per_s, coalesce(s.flops_per_token, 0), "
        "coalesce(s.tokens_per_s_per_gpu, 0), coalesce(s.step_ms_median, 0), "
        "coalesce(s.steps, 0) FROM runs r JOIN results s ON s.run = r.id "
        "WHERE r.state = 'completed' AND s.tokens_per_s > 0 AND r.id IN "
        "(SELECT k.run FROM run_config_kv k JOIN config_keys c ON c.id = k.key_id "
        "WHERE c.key = 'model.preset' AND k.txt = ?1) ORDER BY r.id", model, &st, err);
    if (rc)
        return rc;
    size_t cap = 0;
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *c = json_loads((const char *)sqlite3_column_text(st, 1), 0, NULL);
        if (!c)
            continue;   /* the runs table only holds canonical JSON; be lenient anyway */
        if (*n == cap) {
            select_run *g = realloc(*out, (cap = cap * 2 + 16) * sizeof *g);
            if (!g) {
                json_decref(c);
                s = SQLITE_NOMEM;
                break;
            }
            *out = g;
        }
        select_run *r = &(*out)[(*n)++];
        memset(r, 0, sizeof *r);
        snprintf(r->run_id, sizeof r->run_id, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(r->device, sizeof r->device, "%s", jstr(c, "device", NULL, NULL));
        snprintf(r->strategy, sizeof r->strategy, "%s",
                 jstr(c, "parallel", "encoder", "strategy"));
        r->ranks = jint(c, "ranks");
        r->seq_len = jint(c, "train.seq_len");
        r->micro_batch = jint(c, "train.micro_batch");
        r->global_batch = jint(c, "train.global_batch");
        r->tp = jint(c, "parallel.tp");
        r->pp = jint(c, "parallel.pp");
        r->vpp = jint(c, "parallel.vpp");
        r->cp = jint(c, "parallel.cp");
        r->etp = jint(c, "parallel.encoder.tp");
        r->offload = jint(c, "parallel.encoder.offload");
        r->tokens_per_s = sqlite3_column_double(st, 2);
        r->flops_per_token = sqlite3_column_double(st, 3);
        r->tokens_per_s_per_gpu = sqlite3_column_double(st, 4);
        r->step_ms = sqlite3_column_double(st, 5);
        r->steps = sqlite3_column_int(st, 6);
        json_decref(c);
    }
    rc = db_rows_end(db, s, "reading completed runs", err);
    db_stmt_done(st);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int select_runs_of_hash(hearth_db *db, const char *hash, double *median_step_ms, long *n,
                        hearth_err *err)
{
    *median_step_ms = 0;
    *n = 0;
    sqlite3_stmt *st;
    int rc = db_prepare_text(db, "SELECT s.step_ms_median FROM runs r JOIN results s ON "
                             "s.run = r.id WHERE r.config_hash = ?1 AND r.state = 'completed' "
                             "AND s.step_ms_median > 0", hash, &st, err);
    if (rc)
        return rc;
    double v[64];
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW)
        if (*n < 64)
            v[(*n)++] = sqlite3_column_double(st, 0);
    rc = db_rows_end(db, s, "reading completed runs", err);
    db_stmt_done(st);
    if (!rc && *n) {
        qsort(v, (size_t)*n, sizeof *v, dbl_cmp);
        *median_step_ms = *n % 2 ? v[*n / 2] : (v[*n / 2 - 1] + v[*n / 2]) / 2;
    }
    return rc;
}
