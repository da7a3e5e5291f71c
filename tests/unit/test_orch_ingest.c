/* test_orch_ingest.c - ingest of run directories: values recorded exactly, idempotence
 * (twice gives the same rows), malformed files (metrics line, result.json, exit_code)
 * name FILE:LINE and leave the database unchanged, truncated last lines, absent files,
 * duplicate steps, a config hash that belongs to another run, result.json's exit_status
 * as an exit code.
 * Fresh random data in a real SQLite file in a temporary directory every run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "db.h"
#include "flat_json.h"
#include "ingest.h"
#include "runs_db.h"
#include "tests/unit/support/dbtest.h"
#include "tests/unit/support/testutil.h"
#include "tests/unit/support/tmpdir.h"

typedef struct {
    char dir[256];
    char path[300];
    char run_dir[300];
    char hash[65];
    char *run_id;
    hearth_db *db;
    tu_rng rng;
} fixture;

static const char *const metric_keys[] = {"loss", "grad_norm", "lr", "step_ms", "tokens",
                                          "tokens_per_s", "encoder_ms", "decoder_ms",
                                          "peak_mem_bytes"};
#define N_METRIC_KEYS 9

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (tu_tmpdir_make(f->dir, sizeof f->dir, "ingest"))
        return -1;
    snprintf(f->path, sizeof f->path, "%s/test.db", f->dir);
    snprintf(f->run_dir, sizeof f->run_dir, "%s/run", f->dir);
    mkdir(f->run_dir, 0755);
    f->rng = tu_rng_fresh();
    hearth_err err = {{0}};
    if (db_open(f->path, &f->db, &err))
        return -1;
    dbt_random_hash(&f->rng, f->hash);
    run_new rn = {"ing", "{\"train\":{\"steps\":10}}", f->hash, f->run_dir};
    if (runs_db_experiment_upsert(f->db, "ing", NULL, NULL, NULL, &err) ||
        runs_db_insert(f->db, &rn, &f->run_id, NULL, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    db_close(f->db);
    free(f->run_id);
    tu_tmpdir_remove(f->dir);
    free(f);
    return 0;
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(tu_write_text(path, text), 0);
}

/* Random metrics: `steps` objects with every field (some null, some integers written as
 * reals, some extra keys).  Returns the JSON lines text; *rows gets the parsed objects. */
static char *random_metrics(tu_rng *r, int steps, json_t **rows)
{
    json_t *arr = json_array();
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    int step = tu_randint(r, 0, 5);
    for (int i = 0; i < steps; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(step));
        step += tu_randint(r, 1, 3);
        for (int k = 0; k < N_METRIC_KEYS; k++) {
            if (tu_randint(r, 0, 10) == 0)
                continue;   /* missing */
            json_t *v;
            if (tu_randint(r, 0, 12) == 0)
                v = json_null();
            else if (strcmp(metric_keys[k], "tokens") == 0 ||
                     strcmp(metric_keys[k], "peak_mem_bytes") == 0)
                v = json_integer((json_int_t)(tu_next(r) % 1000000000000ull));
            else
                v = json_real(tu_normal(r) * pow(10, tu_randint(r, -6, 7)));
            json_object_set_new(o, metric_keys[k], v);
        }
        if (tu_randint(r, 0, 6) == 0)
            json_object_set_new(o, "future_field", json_integer(tu_randint(r, 0, 100)));
        char *line = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
        fprintf(m, "%s%s\n", tu_randint(r, 0, 4) == 0 ? "  " : "", line);
        free(line);
        json_array_append_new(arr, o);
    }
    fclose(m);
    *rows = arr;
    return text;
}

static json_t *random_result(tu_rng *r, const char *hash)
{
    json_t *o = json_pack("{s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:f, s:i, s:s, s:i, s:i}",
                          "config_hash", hash, "steps", tu_randint(r, 1, 1000),
                          "step_ms_median", 10 + 100 * tu_uniform(r),
                          "step_ms_p10", 10 * tu_uniform(r), "step_ms_p90", 200 * tu_uniform(r),
                          "tokens_per_s", 1e5 * tu_uniform(r),
                          "tokens_per_s_per_gpu", 1e4 * tu_uniform(r),
                          "flops_per_token", 1e9 * tu_uniform(r),
                          "peak_mem_bytes", (json_int_t)(tu_next(r) % 100000000000ull),
                          "final_loss", 10 * tu_uniform(r), "exit_status", tu_randint(r, 0, 4),
                          "device", tu_randint(r, 0, 2) ? "cpu" : "NVIDIA H200",
                          "device_count", tu_randint(r, 1, 9), "nodes", tu_randint(r, 1, 3));
    json_object_set_new(o, "mfu", tu_randint(r, 0, 2) ? json_null() : json_real(tu_uniform(r)));
    json_object_set_new(o, "versions", json_pack("{s:s, s:n}", "git", "v0.1-3-gabc", "cuda"));
    return o;
}

/* Everything recorded for the run, as one text (for before/after comparisons). */
static char *dump_db(hearth_db *db)
{
    static const char *const queries[] = {
        "SELECT quote(run), quote(step), quote(loss), quote(grad_norm), quote(lr), "
        "quote(step_ms), quote(tokens), quote(tokens_per_s), quote(encoder_ms), "
        "quote(decoder_ms), quote(peak_mem_bytes), quote(extra) FROM metrics ORDER BY run, step",
        "SELECT quote(run), quote(steps), quote(step_ms_median), quote(step_ms_p10), "
        "quote(step_ms_p90), quote(tokens_per_s), quote(tokens_per_s_per_gpu), "
        "quote(flops_per_token), quote(mfu), quote(peak_mem_bytes), quote(final_loss), "
        "quote(exit_status), quote(device), quote(device_count), quote(nodes), "
        "quote(versions), quote(extra) FROM results ORDER BY run",
        "SELECT quote(run_id), quote(exit_code), quote(state) FROM runs ORDER BY id",
    };
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    for (size_t q = 0; q < 3; q++) {
        sqlite3_stmt *st;
        assert_int_equal(sqlite3_prepare_v2(db_sqlite(db), queries[q], -1, &st, NULL),
                         SQLITE_OK);
        while (sqlite3_step(st) == SQLITE_ROW) {
            for (int i = 0; i < sqlite3_column_count(st); i++)
                fprintf(m, "%s|", (const char *)sqlite3_column_text(st, i));
            fputc('\n', m);
        }
        sqlite3_finalize(st);
        fputs("--\n", m);
    }
    fclose(m);
    return text;
}

/* The stored metrics equal the generated rows, field by field. */
static void check_metrics(fixture *f, json_t *rows)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_sqlite(f->db),
                                        "SELECT step, loss, grad_norm, lr, step_ms, tokens, "
                                        "tokens_per_s, encoder_ms, decoder_ms, peak_mem_bytes, "
                                        "extra FROM metrics ORDER BY step",
                                        -1, &st, NULL),
                     SQLITE_OK);
    size_t i = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *o = json_array_get(rows, i++);
        assert_non_null(o);
        assert_int_equal(sqlite3_column_int64(st, 0), json_integer_value(json_object_get(o, "step")));
        for (int k = 0; k < N_METRIC_KEYS; k++) {
            json_t *v = json_object_get(o, metric_keys[k]);
            int col = 1 + k;
            if (!v || json_is_null(v)) {
                if (sqlite3_column_type(st, col) != SQLITE_NULL)
                    fail_msg("step %zu %s: expected null (seed %llu)", i, metric_keys[k],
                             (unsigned long long)f->rng.seed);
            } else if (sqlite3_column_double(st, col) != json_number_value(v)) {
                fail_msg("step %zu %s: %.17g stored, %.17g written (seed %llu)", i,
                         metric_keys[k], sqlite3_column_double(st, col), json_number_value(v),
                         (unsigned long long)f->rng.seed);
            }
        }
        json_t *fut = json_object_get(o, "future_field");
        if (fut) {
            json_error_t je;
            json_t *extra = json_loads((const char *)sqlite3_column_text(st, 10), 0, &je);
            assert_non_null(extra);
            assert_true(json_equal(json_object_get(extra, "future_field"), fut));
            json_decref(extra);
        } else {
            assert_int_equal(sqlite3_column_type(st, 10), SQLITE_NULL);
        }
    }
    sqlite3_finalize(st);
    assert_int_equal(i, json_array_size(rows));
}

static void test_ingest_exact_and_idempotent(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    json_t *rows;
    int steps = tu_randint(&f->rng, 1, 300);
    char *text = random_metrics(&f->rng, steps, &rows);
    write_file(f->run_dir, "metrics.jsonl", text);
    json_t *res = random_result(&f->rng, f->hash);
    char *rtext = json_dumps(res, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    write_file(f->run_dir, "result.json", rtext);
    int code = tu_randint(&f->rng, 0, 3) == 0 ? 75 : tu_randint(&f->rng, 0, 4);
    char ctext[32];
    snprintf(ctext, sizeof ctext, "%d\n", code);
    write_file(f->run_dir, "exit_code", ctext);

    ingest_summary sum;
    if (ingest_run(f->db, f->run_id, NULL, &sum, &err))
        fail_msg("ingest: %s (seed %llu)", err.msg, (unsigned long long)f->rng.seed);
    assert_true(sum.has_metrics);
    assert_int_equal(sum.metric_rows, steps);
    assert_false(sum.truncated_tail);
    assert_true(sum.has_result);
    assert_true(sum.has_exit_code);
    assert_int_equal(sum.exit_code, code);
    check_metrics(f, rows);

    /* result.json field by field */
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_sqlite(f->db),
                                        "SELECT steps, tokens_per_s, mfu, peak_mem_bytes, device, "
                                        "versions, exit_status FROM results",
                                        -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(st, 0), json_integer_value(json_object_get(res, "steps")));
    assert_true(sqlite3_column_double(st, 1) == json_real_value(json_object_get(res, "tokens_per_s")));
    json_t *mfu = json_object_get(res, "mfu");
    if (json_is_null(mfu))
        assert_int_equal(sqlite3_column_type(st, 2), SQLITE_NULL);
    else
        assert_true(sqlite3_column_double(st, 2) == json_real_value(mfu));
    assert_int_equal(sqlite3_column_int64(st, 3),
                     json_integer_value(json_object_get(res, "peak_mem_bytes")));
    assert_string_equal((const char *)sqlite3_column_text(st, 4),
                        json_string_value(json_object_get(res, "device")));
    json_error_t je;
    json_t *ver = json_loads((const char *)sqlite3_column_text(st, 5), 0, &je);
    assert_true(json_equal(ver, json_object_get(res, "versions")));
    json_decref(ver);
    assert_int_equal(sqlite3_column_type(st, 6), SQLITE_INTEGER);
    sqlite3_finalize(st);
    run_info ri;
    assert_int_equal(runs_db_get(f->db, f->run_id, &ri, &err), 1);
    assert_true(ri.has_exit_code && ri.exit_code == code);
    run_info_free(&ri);

    /* Twice: identical rows. */
    char *before = dump_db(f->db);
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, &sum, &err), 0);
    char *after = dump_db(f->db);
    assert_string_equal(before, after);
    free(after);

    /* Files gone: the recorded rows stay. */
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", f->run_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/result.json", f->run_dir);
    unlink(path);
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, &sum, &err), 0);
    assert_false(sum.has_metrics);
    assert_false(sum.has_result);
    after = dump_db(f->db);
    assert_string_equal(before, after);
    free(after);
    free(before);

    free(rtext);
    json_decref(res);
    free(text);
    json_decref(rows);
}

/* Replaces line `target` (1-based) of text with `bad`. */
static char *replace_line(const char *text, int target, const char *bad)
{
    char *out = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&out, &len);
    int line = 1;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (line == target)
            fputs(bad, m);
        else
            fwrite(p, 1, n, m);
        fputc('\n', m);
        line++;
        p += n + (nl ? 1 : 0);
    }
    fclose(m);
    return out;
}

static void test_malformed_metrics_line(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    /* A first good ingest, so that "unchanged" means "still the old rows". */
    json_t *rows;
    char *good = random_metrics(&f->rng, tu_randint(&f->rng, 2, 50), &rows);
    write_file(f->run_dir, "metrics.jsonl", good);
    write_file(f->run_dir, "exit_code", "0\n");
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, NULL, &err), 0);
    json_decref(rows);
    char *before = dump_db(f->db);

    static const char *const bad_lines[] = {
        "{\"step\": 3, \"loss\": }",              /* syntax */
        "{\"step\": 3, \"loss\": NaN}",           /* not JSON */
        "{\"loss\": 1.5}",                         /* step missing */
        "{\"step\": \"3\"}",                       /* step not an integer */
        "{\"step\": -1}",                          /* negative step */
        "{\"step\": 3, \"loss\": \"low\"}",        /* wrong type */
        "{\"step\": 3, \"tokens\": 1.5}",          /* integer field with a fraction */
        "[1, 2, 3]",                               /* not an object */
        "{\"step\": 3, \"step\": 4}",              /* duplicate key */
    };
    for (size_t b = 0; b < sizeof bad_lines / sizeof *bad_lines; b++) {
        char *text = random_metrics(&f->rng, tu_randint(&f->rng, 2, 40), &rows);
        int n = (int)json_array_size(rows);
        int target = tu_randint(&f->rng, 1, n + 1);
        char *broken = replace_line(text, target, bad_lines[b]);
        write_file(f->run_dir, "metrics.jsonl", broken);
        write_file(f->run_dir, "exit_code", "1\n");   /* would change runs.exit_code */
        int rc = ingest_run(f->db, f->run_id, NULL, NULL, &err);
        if (rc != HERR_CONFIG)
            fail_msg("bad line '%s' at %d accepted (rc %d) (seed %llu)", bad_lines[b], target,
                     rc, (unsigned long long)f->rng.seed);
        char where[400];
        snprintf(where, sizeof where, "%s/metrics.jsonl:%d:", f->run_dir, target);
        if (!strstr(err.msg, where))
            fail_msg("message '%s' does not name %s (seed %llu)", err.msg, where,
                     (unsigned long long)f->rng.seed);
        char *after = dump_db(f->db);
        if (strcmp(before, after) != 0)
            fail_msg("database changed by a failed ingest of '%s' (seed %llu)", bad_lines[b],
                     (unsigned long long)f->rng.seed);
        free(after);
        free(broken);
        free(text);
        json_decref(rows);
    }
    free(before);
    free(good);
}

static void test_malformed_result_and_exit_code(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    json_t *rows;
    char *good = random_metrics(&f->rng, tu_randint(&f->rng, 1, 20), &rows);
    char *before = dump_db(f->db);
    /* Good metrics + a bad result: nothing at all is recorded. */
    write_file(f->run_dir, "metrics.jsonl", good);
    int line = tu_randint(&f->rng, 2, 6);
    /* The syntax error sits on line `line`. */
    char fixed[512] = "{\n";
    for (int i = 2; i < line; i++) {
        char l[64];
        snprintf(l, sizeof l, "  \"x%d\": 1,\n", i);
        strcat(fixed, l);
    }
    strcat(fixed, "  \"tokens_per_s\": ,\n}\n");
    write_file(f->run_dir, "result.json", fixed);
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, NULL, &err), HERR_CONFIG);
    char where[400];
    snprintf(where, sizeof where, "%s/result.json:%d:", f->run_dir, line);
    if (!strstr(err.msg, where))
        fail_msg("'%s' does not name %s", err.msg, where);
    char *after = dump_db(f->db);
    assert_string_equal(before, after);
    free(after);

    /* Wrong type in result.json. */
    write_file(f->run_dir, "result.json", "{\"tokens_per_s\": \"fast\"}\n");
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "result.json"));
    assert_non_null(strstr(err.msg, "tokens_per_s"));
    after = dump_db(f->db);
    assert_string_equal(before, after);
    free(after);

    /* A result of another run. */
    char other[65];
    do
        dbt_random_hash(&f->rng, other);
    while (strcmp(other, f->hash) == 0);
    char text[256];
    snprintf(text, sizeof text, "{\"config_hash\": \"%s\", \"steps\": 3}\n", other);
    write_file(f->run_dir, "result.json", text);
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "config_hash"));
    after = dump_db(f->db);
    assert_string_equal(before, after);
    free(after);

    /* A bad exit_code file. */
    snprintf(text, sizeof text, "{\"config_hash\": \"%s\", \"steps\": 3}\n", f->hash);
    write_file(f->run_dir, "result.json", text);
    static const char *const bad_codes[] = {"", "abc\n", "1 2\n", "99999999999\n", "0x1\n"};
    write_file(f->run_dir, "exit_code", bad_codes[tu_randint(&f->rng, 0, 5)]);
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, NULL, &err), HERR_CONFIG);
    snprintf(where, sizeof where, "%s/exit_code:1:", f->run_dir);
    assert_non_null(strstr(err.msg, where));
    after = dump_db(f->db);
    assert_string_equal(before, after);
    free(after);

    /* Now everything valid: recorded. */
    write_file(f->run_dir, "exit_code", " 3 \n");
    ingest_summary sum;
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, &sum, &err), 0);
    assert_int_equal(sum.exit_code, 3);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM results"), 1);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM metrics"), (long long)json_array_size(rows));
    check_metrics(f, rows);

    /* Unknown run, missing directory. */
    assert_int_equal(ingest_run(f->db, "ing-424242", NULL, NULL, &err), HERR_CONFIG);
    free(before);
    free(good);
    json_decref(rows);
}

/* A last line being written (no newline, incomplete) is skipped; the rest is recorded. */
static void test_truncated_tail_and_duplicates(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    json_t *rows;
    int steps = tu_randint(&f->rng, 2, 30);
    char *text = random_metrics(&f->rng, steps, &rows);
    size_t len = strlen(text);
    char *cut = malloc(len + 64);
    memcpy(cut, text, len);
    const char *partial = "{\"step\": 999999, \"loss\": 1.2";
    size_t plen = (size_t)tu_randint(&f->rng, 1, (int)strlen(partial));
    memcpy(cut + len, partial, plen);
    cut[len + plen] = '\0';
    write_file(f->run_dir, "metrics.jsonl", cut);
    ingest_summary sum;
    if (ingest_run(f->db, f->run_id, NULL, &sum, &err))
        fail_msg("%s (seed %llu)", err.msg, (unsigned long long)f->rng.seed);
    assert_true(sum.truncated_tail);
    assert_int_equal(sum.metric_rows, steps);
    check_metrics(f, rows);

    /* A step written twice (a requeued run resumed from a checkpoint): the later wins. */
    json_t *last = json_array_get(rows, json_array_size(rows) - 1);
    json_int_t step = json_integer_value(json_object_get(last, "step"));
    double loss = tu_normal(&f->rng);
    char dup[128];
    snprintf(dup, sizeof dup, "{\"step\": %lld, \"loss\": %.17g}\n", (long long)step, loss);
    char *twice = malloc(len + sizeof dup);
    memcpy(twice, text, len);
    strcpy(twice + len, dup);
    write_file(f->run_dir, "metrics.jsonl", twice);
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, &sum, &err), 0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM metrics"), steps);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_sqlite(f->db),
                                        "SELECT loss, step_ms FROM metrics WHERE step = ?1", -1,
                                        &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(st, 1, step);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_true(sqlite3_column_double(st, 0) == loss);
    assert_int_equal(sqlite3_column_type(st, 1), SQLITE_NULL);
    sqlite3_finalize(st);

    /* Ingest from another directory given explicitly. */
    char other[400];
    snprintf(other, sizeof other, "%s/elsewhere", f->dir);
    mkdir(other, 0755);
    write_file(other, "metrics.jsonl", "{\"step\": 1}\n\n{\"step\": 2}\n");
    assert_int_equal(ingest_run(f->db, f->run_id, other, &sum, &err), 0);
    assert_int_equal(sum.metric_rows, 2);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM metrics"), 2);
    free(twice);
    free(cut);
    free(text);
    json_decref(rows);
}

/* The fast line reader converts numbers exactly like strtod (and so like jansson), and
 * refuses what is not JSON. */
static void test_fast_numbers(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    char buf[128];
    for (int t = 0; t < 200000; t++) {
        size_t n = 0;
        if (tu_randint(&r, 0, 3) == 0)
            buf[n++] = '-';
        int int_digits = tu_randint(&r, 1, tu_randint(&r, 0, 4) == 0 ? 25 : 8);
        for (int i = 0; i < int_digits; i++)
            buf[n++] = (char)('0' + (i == 0 && int_digits > 1 ? tu_randint(&r, 1, 10)
                                                               : tu_randint(&r, 0, 10)));
        int frac = tu_randint(&r, 0, 3);
        if (frac) {
            buf[n++] = '.';
            int fd = tu_randint(&r, 1, tu_randint(&r, 0, 4) == 0 ? 25 : 10);
            for (int i = 0; i < fd; i++)
                buf[n++] = (char)('0' + tu_randint(&r, 0, 10));
        }
        int has_exp = tu_randint(&r, 0, 3) == 0;
        if (has_exp)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s%d",
                                  tu_randint(&r, 0, 2) ? "e" : "E",
                                  (const char *[]){"", "+", "-"}[tu_randint(&r, 0, 3)],
                                  tu_randint(&r, 0, 330));
        buf[n] = '\0';
        int is_int;
        int64_t iv;
        double dv;
        int rc = fj_number(buf, n, &is_int, &iv, &dv);
        double want = strtod(buf, NULL);
        int integral = !frac && !has_exp;
        if (rc) {
            /* allowed to decline only big integers and overflowing reals */
            if (!(integral && int_digits > 18) && !(isinf(want)))
                fail_msg("fj_number declined '%s' (seed %llu)", buf, (unsigned long long)r.seed);
            continue;
        }
        assert_int_equal(is_int, integral);
        if (integral) {   /* JSON integers, as jansson reads them ("-0" is 0) */
            assert_true(iv == strtoll(buf, NULL, 10));
            want = (double)iv;
        }
        if (memcmp(&dv, &want, sizeof dv) != 0)
            fail_msg("fj_number('%s') = %.17g, strtod = %.17g (seed %llu)", buf, dv, want,
                     (unsigned long long)r.seed);
    }
    static const char *const bad[] = {"01", "1.", ".5", "-", "1e", "+1", "1e+", "--1", "1.2.3",
                                      "0x10", "inf", "NaN", "", "1 ", "00.1", "-01"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int is_int;
        int64_t iv;
        double dv;
        if (fj_number(bad[i], strlen(bad[i]), &is_int, &iv, &dv) == 0)
            fail_msg("fj_number accepted '%s'", bad[i]);
    }
    /* Objects: what it accepts, jansson reads the same way; the rest it leaves to jansson. */
    static const char *const objs[] = {
        "{\"step\": 1, \"loss\": 2.5e-3}", " { } ", "{\"a\":null,\"b\":true,\"c\":false}",
        "{\"a\":1,}", "{\"a\" 1}", "{\"a\":[1]}", "{\"a\":\"s\"}", "{\"a\\u0041\":1}",
        "{\"a\":1} x", "[1]", "{\"a\":1", "{\"a\":-0.0}", "{\"a\":1e999}",
    };
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) {
        fj_member m[8];
        int cnt = fj_parse(objs[i], strlen(objs[i]), m, 8);
        json_error_t je;
        json_t *j = json_loads(objs[i], 0, &je);
        if (cnt < 0) {
            json_decref(j);
            continue;
        }
        if (!j)
            fail_msg("fj_parse accepted invalid JSON '%s'", objs[i]);
        assert_int_equal((size_t)cnt, json_object_size(j));
        for (int k = 0; k < cnt; k++) {
            char key[32];
            snprintf(key, sizeof key, "%.*s", (int)m[k].key_len, m[k].key);
            json_t *v = json_object_get(j, key);
            assert_non_null(v);
            switch (m[k].type) {
            case FJ_NULL: assert_true(json_is_null(v)); break;
            case FJ_TRUE: assert_true(json_is_true(v)); break;
            case FJ_FALSE: assert_true(json_is_false(v)); break;
            case FJ_INT: assert_true(json_is_integer(v) && json_integer_value(v) == m[k].i); break;
            case FJ_REAL: assert_true(json_is_real(v) && json_real_value(v) == m[k].d); break;
            }
        }
        json_decref(j);
    }
}

/* result.json's exit_status as the hearth-train exit code it stands for: what a run is
 * recorded from when its job script died before writing exit_code. */
static void test_result_exit_status(void **state)
{
    fixture *f = *state;
    static const struct {
        const char *status;   /* JSON text of the value; NULL: no exit_status */
        int code;
    } cases[] = { { "\"done\"", 0 }, { "\"failed\"", 1 }, { "\"diverged\"", 3 },
                  { "\"preempted\"", -1 }, { "0", -1 }, { NULL, -1 } };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[400];
        snprintf(text, sizeof text, "{\"config_hash\": \"%s\", \"steps\": 3%s%s}", f->hash,
                 cases[i].status ? ", \"exit_status\": " : "",
                 cases[i].status ? cases[i].status : "");
        write_file(f->run_dir, "result.json", text);
        ingest_summary sum;
        hearth_err err = {{0}};
        if (ingest_run(f->db, f->run_id, NULL, &sum, &err))
            fail_msg("ingest: %s", err.msg);
        assert_true(sum.has_result);
        if (sum.result_exit_code != cases[i].code)
            fail_msg("exit_status %s: exit code %d, want %d", cases[i].status ? cases[i].status
                     : "absent", sum.result_exit_code, cases[i].code);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/result.json", f->run_dir);
    unlink(path);
    ingest_summary sum;
    hearth_err err = {{0}};
    assert_int_equal(ingest_run(f->db, f->run_id, NULL, &sum, &err), 0);
    assert_false(sum.has_result);
    assert_int_equal(sum.result_exit_code, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ingest_exact_and_idempotent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_metrics_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_result_and_exit_code, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_tail_and_duplicates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_result_exit_status, setup, teardown),
        cmocka_unit_test(test_fast_numbers),
    };
    return cmocka_run_group_tests_name("orch_ingest", tests, NULL, NULL);
}
