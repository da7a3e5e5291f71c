/* test_orch_db.c - the results database: migrations (user_version, WAL, no-op reopen,
 * embedded text equal to db/migrations), the run state transition table against an
 * expectation written here independently (pure and through the database), run inserts
 * with their flattened config, atomic rollback, plan dedup counts, listing.
 * Every test uses a fresh SQLite file in a temporary directory and fresh random data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "config_kv.h"
#include "db.h"
#include "db_migrations.h"
#include "run_state.h"
#include "runs_db.h"
#include "tests/unit/support/dbtest.h"
#include "tests/unit/support/testutil.h"
#include "tests/unit/support/tmpdir.h"

/* ---- helpers ------------------------------------------------------------------------------ */

typedef struct {
    char dir[256];
    char path[300];
    hearth_db *db;
    tu_rng rng;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (tu_tmpdir_make(f->dir, sizeof f->dir, "db"))
        return -1;
    snprintf(f->path, sizeof f->path, "%s/test.db", f->dir);
    f->rng = tu_rng_fresh();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    db_close(f->db);
    tu_tmpdir_remove(f->dir);
    free(f);
    return 0;
}

#define CHECK(call, f)                                                                     \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ < 0)                                                                       \
            fail_msg("%s failed (%d): %s (seed %llu)", #call, rc_, err.msg,                \
                     (unsigned long long)(f)->rng.seed);                                   \
    } while (0)

static void open_db(fixture *f)
{
    hearth_err err = {{0}};
    if (db_open(f->path, &f->db, &err))
        fail_msg("db_open: %s", err.msg);
}

/* One value of an SQL query returning an integer. */
/* A random nested config object: numbers (int and real), strings, bools, nulls, lists,
 * nested objects, a few keys shared by every config so that key interning is exercised. */
static json_t *random_config(tu_rng *r, int depth)
{
    json_t *o = json_object();
    if (depth == 0) {
        json_object_set_new(o, "model", json_string("tiny-vlm"));
        json_t *p = json_object();
        json_object_set_new(p, "tp", json_integer(1 << tu_randint(r, 0, 3)));
        json_object_set_new(p, "sp", json_boolean(tu_randint(r, 0, 2)));
        json_object_set_new(o, "parallel", p);
    }
    int n = tu_randint(r, 1, depth == 0 ? 8 : 4);
    for (int i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%d_%d", depth, tu_randint(r, 0, 12));
        json_t *v;
        switch (tu_randint(r, 0, depth < 2 ? 7 : 6)) {
        case 0: v = json_integer(tu_randint(r, -1000, 1000)); break;
        case 1: v = json_real(tu_normal(r) * 1e3); break;
        case 2: {
            char s[16];
            snprintf(s, sizeof s, "s%d", tu_randint(r, 0, 50));
            v = json_string(s);
            break;
        }
        case 3: v = json_boolean(tu_randint(r, 0, 2)); break;
        case 4: v = json_null(); break;
        case 5: v = json_pack("[iii]", tu_randint(r, 0, 9), tu_randint(r, 0, 9), 3); break;
        default: v = random_config(r, depth + 1); break;
        }
        json_object_set_new(o, key, v);
    }
    return o;
}

/* Checks run pk's kv rows against the expected leaves. */
static void check_kv(hearth_db *db, int64_t pk, json_t *cfg, const char *id, tu_rng *rng)
{
    json_t *want = json_object();
    dbt_flatten(cfg, "", want);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_sqlite(db),
                                        "SELECT k.key, kv.num, kv.txt, kv.flag FROM run_config_kv kv "
                                        "JOIN config_keys k ON k.id = kv.key_id WHERE kv.run = ?1",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(st, 1, pk);
    size_t rows = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        rows++;
        const char *key = (const char *)sqlite3_column_text(st, 0);
        json_t *v = json_object_get(want, key);
        if (!v)
            fail_msg("%s: unexpected key %s (seed %llu)", id, key, (unsigned long long)rng->seed);
        int tn = sqlite3_column_type(st, 1), tt = sqlite3_column_type(st, 2),
            tf = sqlite3_column_type(st, 3);
        int ok;
        if (json_is_number(v)) {
            ok = tn != SQLITE_NULL && tt == SQLITE_NULL && tf == SQLITE_NULL &&
                 sqlite3_column_double(st, 1) == json_number_value(v);
        } else if (json_is_string(v)) {
            ok = tn == SQLITE_NULL && tf == SQLITE_NULL && tt != SQLITE_NULL &&
                 strcmp((const char *)sqlite3_column_text(st, 2), json_string_value(v)) == 0;
        } else if (json_is_boolean(v)) {
            ok = tn == SQLITE_NULL && tt == SQLITE_NULL && tf != SQLITE_NULL &&
                 sqlite3_column_int(st, 3) == json_is_true(v);
        } else if (json_is_null(v)) {
            ok = tn == SQLITE_NULL && tt == SQLITE_NULL && tf == SQLITE_NULL;
        } else {
            json_error_t je;
            json_t *back = tt == SQLITE_NULL ? NULL
                           : json_loads((const char *)sqlite3_column_text(st, 2), JSON_DECODE_ANY, &je);
            ok = tn == SQLITE_NULL && tf == SQLITE_NULL && back && json_equal(back, v);
            json_decref(back);
        }
        if (!ok)
            fail_msg("%s: key %s stored wrongly (seed %llu)", id, key,
                     (unsigned long long)rng->seed);
    }
    sqlite3_finalize(st);
    assert_int_equal(rows, json_object_size(want));
    json_decref(want);
}

/* ---- migrations ------------------------------------------------------------------------- */

static void test_migrations(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    int v = -1;
    assert_int_equal(db_schema_version(f->db, &v, &err), 0);
    assert_true(db_schema_latest() >= 1);
    assert_int_equal(v, db_schema_latest());
    assert_int_equal(v, db_migrations_count);
    char *mode = dbt_sql_text(f->db, "PRAGMA journal_mode");
    assert_string_equal(mode, "wal");
    free(mode);
    assert_int_equal(dbt_sql_int(f->db, "PRAGMA foreign_keys"), 1);
    assert_true(dbt_sql_int(f->db, "PRAGMA busy_timeout") > 0);
    static const char *const tables[] = {"experiments", "runs", "run_events", "config_keys",
                                         "run_config_kv", "metrics", "results", "layer_bench",
                                         "selections"};
    for (size_t i = 0; i < sizeof tables / sizeof *tables; i++) {
        char sql[200];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='%s'",
                 tables[i]);
        if (dbt_sql_int(f->db, sql) != 1)
            fail_msg("table %s missing", tables[i]);
    }
    char *schema1 = dbt_sql_text(f->db, "SELECT group_concat(sql, ';') FROM "
                                    "(SELECT sql FROM sqlite_master WHERE name NOT LIKE 'sqlite%' ORDER BY name)");
    /* Some data, then reopen: nothing changes. */
    assert_int_equal(runs_db_experiment_upsert(f->db, "e", NULL, "spec", NULL, &err), 0);
    db_close(f->db);
    f->db = NULL;
    open_db(f);
    assert_int_equal(db_schema_version(f->db, &v, &err), 0);
    assert_int_equal(v, db_schema_latest());
    char *schema2 = dbt_sql_text(f->db, "SELECT group_concat(sql, ';') FROM "
                                    "(SELECT sql FROM sqlite_master WHERE name NOT LIKE 'sqlite%' ORDER BY name)");
    assert_string_equal(schema1, schema2);
    free(schema1);
    free(schema2);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM experiments"), 1);

    /* A file from a newer hearth is refused. */
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", db_schema_latest() + 1 + tu_randint(&f->rng, 0, 5));
    assert_int_equal(db_exec(f->db, sql, &err), 0);
    db_close(f->db);
    f->db = NULL;
    hearth_db *db = NULL;
    assert_true(db_open(f->path, &db, &err) < 0);
    assert_null(db);
    assert_non_null(strstr(err.msg, "newer"));

    /* Not a database at all. */
    char junk[300];
    snprintf(junk, sizeof junk, "%s/junk.db", f->dir);
    FILE *j = fopen(junk, "w");
    for (int i = 0; i < 4096; i++)
        fputc((int)(tu_next(&f->rng) & 0xff) | 1, j);
    fclose(j);
    assert_true(db_open(junk, &db, &err) < 0);
    assert_non_null(strstr(err.msg, junk));
}

/* A database left at schema 4 with layer benchmark rows: opening it runs 0005, which
 * rebuilds layer_bench to take the shared expert's kinds; every row (and its fp8_err)
 * survives, the index is back, a shared_fc1 row goes in, an unknown kind still fails. */
static void test_migration_keeps_layer_bench(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    sqlite3 *raw = NULL;
    assert_int_equal(sqlite3_open(f->path, &raw), SQLITE_OK);
    assert_int_equal(sqlite3_exec(raw, "PRAGMA foreign_keys = ON", NULL, NULL, NULL), SQLITE_OK);
    for (int i = 0; i < 4; i++)
        if (sqlite3_exec(raw, db_migrations[i].sql, NULL, NULL, NULL) != SQLITE_OK)
            fail_msg("%s: %s", db_migrations[i].file, sqlite3_errmsg(raw));
    int n = 1 + tu_randint(&f->rng, 0, 20);
    char sql[400];
    assert_int_equal(sqlite3_exec(raw, "PRAGMA user_version = 4; INSERT INTO layer_bench_sets "
                                       "(source, content_sha256, gpu, model) VALUES "
                                       "('f.json', 'abc', 'H100', 'm')",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    double err_sum = 0;
    for (int i = 0; i < n; i++) {
        double e = tu_randint(&f->rng, 1, 1000) / 1e5;
        err_sum += e;
        snprintf(sql, sizeof sql,
                 "INSERT INTO layer_bench (bench, component, kind, tp, tokens, bf16_ms, "
                 "fp8_ms, repeats, fp8_err) VALUES (1, 'decoder', 'fc1', 1, %d, 1.5, 1.0, 3, "
                 "%.5f)", 16 * (i + 1), e);
        assert_int_equal(sqlite3_exec(raw, sql, NULL, NULL, NULL), SQLITE_OK);
    }
    snprintf(sql, sizeof sql, "INSERT INTO layer_bench (bench, component, kind, tp, tokens, "
                              "bf16_ms, fp8_ms, repeats) VALUES (1, 'decoder', 'shared_fc1', 1, "
                              "16, 1.5, 1.0, 3)");
    assert_int_not_equal(sqlite3_exec(raw, sql, NULL, NULL, NULL), SQLITE_OK);   /* schema 4 */
    sqlite3_close(raw);

    open_db(f);
    int v = -1;
    assert_int_equal(db_schema_version(f->db, &v, &err), 0);
    assert_int_equal(v, db_schema_latest());
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM layer_bench WHERE bench = 1 AND "
                                        "kind = 'fc1'"),
                     n);
    char *sum = dbt_sql_text(f->db, "SELECT printf('%.5f', sum(fp8_err)) FROM layer_bench");
    char want[32];
    snprintf(want, sizeof want, "%.5f", err_sum);
    assert_string_equal(sum, want);
    free(sum);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM sqlite_master WHERE type = "
                                        "'index' AND name = 'layer_bench_by_set'"),
                     1);
    assert_int_equal(db_exec(f->db, sql, &err), 0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM layer_bench WHERE kind = "
                                        "'shared_fc1'"),
                     1);
    assert_true(db_exec(f->db, "INSERT INTO layer_bench (bench, component, kind, tp, tokens, "
                               "bf16_ms, fp8_ms, repeats) VALUES (1, 'decoder', 'shared_fc3', "
                               "1, 32, 1.5, 1.0, 3)",
                        &err) < 0);
    /* the rows still belong to their set: removing it removes them */
    assert_int_equal(db_exec(f->db, "DELETE FROM layer_bench_sets WHERE id = 1", &err), 0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM layer_bench"), 0);
}

/* The generated C file must carry exactly the files' text. */
static void test_embedded_migrations_match_files(void **state)
{
    (void)state;
    const char *dirs[] = {"db/migrations", "../db/migrations", "../../db/migrations"};
    DIR *d = NULL;
    const char *dir = NULL;
    for (size_t i = 0; i < 3 && !d; i++)
        if ((d = opendir(dirs[i])))
            dir = dirs[i];
    if (!d)
        fail_msg("db/migrations not found from the working directory");
    int files = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 9 || strcmp(de->d_name + n - 4, ".sql") != 0)
            continue;
        files++;
        int found = 0;
        for (int i = 0; i < db_migrations_count; i++) {
            if (strcmp(db_migrations[i].file, de->d_name) != 0)
                continue;
            found = 1;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            FILE *fp = fopen(path, "rb");
            assert_non_null(fp);
            fseek(fp, 0, SEEK_END);
            long len = ftell(fp);
            fseek(fp, 0, SEEK_SET);
            char *text = calloc(1, (size_t)len + 1);
            assert_int_equal(fread(text, 1, (size_t)len, fp), (size_t)len);
            fclose(fp);
            if (strcmp(text, db_migrations[i].sql) != 0)
                fail_msg("%s differs from the embedded copy: run db/gen_migrations.sh > "
                         "orchestrator/db_migrations.c", path);
            assert_int_equal(db_migrations[i].version, atoi(de->d_name));
            free(text);
        }
        if (!found)
            fail_msg("%s/%s is not embedded: run db/gen_migrations.sh", dir, de->d_name);
    }
    closedir(d);
    assert_int_equal(files, db_migrations_count);
    for (int i = 0; i < db_migrations_count; i++)
        assert_int_equal(db_migrations[i].version, i + 1);
}

/* ---- transitions -------------------------------------------------------------------------- */

/* The expectation, written from DESIGN.md and run_state.h's documentation, not from the
 * table: "from to" pairs that must be accepted.  Everything else must be refused. */
static const char *const legal[] = {
    "pending submitted", "pending cancelled", "pending failed",
    "submitted running", "submitted requeued", "submitted completed", "submitted failed",
    "submitted cancelled", "submitted timeout",
    "running completed", "running failed", "running cancelled", "running timeout",
    "running requeued",
    "requeued submitted", "requeued cancelled", "requeued failed",
    "cancelled requeued",   /* hearth resume --include-cancelled only */
};
static const char *const state_names[] = {"pending", "submitted", "running", "requeued",
                                          "completed", "failed", "cancelled", "timeout"};

static int expect_legal(const char *from, const char *to)
{
    char pair[64];
    snprintf(pair, sizeof pair, "%s %s", from, to);
    for (size_t i = 0; i < sizeof legal / sizeof *legal; i++)
        if (strcmp(legal[i], pair) == 0)
            return 1;
    return 0;
}

static void test_transition_table(void **state)
{
    (void)state;
    assert_int_equal(RUN_STATE_COUNT, 8);
    for (int a = 0; a < RUN_STATE_COUNT; a++) {
        run_state s;
        hearth_err err = {{0}};
        assert_int_equal(run_state_parse(state_names[a], &s, &err), 0);
        assert_string_equal(run_state_name(s), state_names[a]);
        for (int b = 0; b < RUN_STATE_COUNT; b++) {
            run_state t;
            assert_int_equal(run_state_parse(state_names[b], &t, &err), 0);
            int want = expect_legal(state_names[a], state_names[b]);
            if (run_state_can_transition(s, t) != want)
                fail_msg("%s -> %s: table says %d, expected %d", state_names[a],
                         state_names[b], !want, want);
            int rc = run_state_check_transition(s, t, &err);
            assert_int_equal(rc == 0, want);
            if (!want) {
                char needle[64];
                snprintf(needle, sizeof needle, "%s -> %s", state_names[a], state_names[b]);
                assert_non_null(strstr(err.msg, needle));
            }
        }
    }
    run_state s;
    hearth_err err = {{0}};
    assert_true(run_state_parse("bogus", &s, &err) < 0);
    assert_int_equal(run_state_for_exit_code(0), RUN_COMPLETED);
    assert_int_equal(run_state_for_exit_code(75), RUN_REQUEUED);
    tu_rng r = tu_rng_fresh();
    int code = 1 + tu_randint(&r, 0, 250);
    assert_int_equal(run_state_for_exit_code(code), code == 75 ? RUN_REQUEUED : RUN_FAILED);
}

/* A path of legal transitions from pending to `target` (by the expectation). */
static int path_to(const char *target, const char **path, int max)
{
    /* BFS over the expectation graph. */
    int prev[8], seen[8] = {0}, queue[8], qh = 0, qt = 0;
    queue[qt++] = 0;
    seen[0] = 1;
    prev[0] = -1;
    while (qh < qt) {
        int u = queue[qh++];
        for (int v = 0; v < 8; v++)
            if (!seen[v] && expect_legal(state_names[u], state_names[v])) {
                seen[v] = 1;
                prev[v] = u;
                queue[qt++] = v;
            }
    }
    int t = -1;
    for (int i = 0; i < 8; i++)
        if (strcmp(state_names[i], target) == 0)
            t = i;
    int rev[8], n = 0;
    for (int v = t; v > 0; v = prev[v])
        rev[n++] = v;
    assert_true(n <= max);
    for (int i = 0; i < n; i++)
        path[i] = state_names[rev[n - 1 - i]];
    return n;
}

static void test_transitions_in_db(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    CHECK(runs_db_experiment_upsert(f->db, "tx", NULL, NULL, NULL, &err), f);
    /* Every (from, to) pair in random order, each on a fresh run. */
    int order[64];
    for (int i = 0; i < 64; i++)
        order[i] = i;
    for (int i = 63; i > 0; i--) {
        int j = tu_randint(&f->rng, 0, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int k = 0; k < 64; k++) {
        const char *from = state_names[order[k] / 8], *to = state_names[order[k] % 8];
        char hash[65], *id = NULL;
        dbt_random_hash(&f->rng, hash);
        run_new rn = {"tx", "{\"a\":1}", hash, NULL};
        CHECK(runs_db_insert(f->db, &rn, &id, NULL, &err), f);
        const char *path[8];
        int n = path_to(from, path, 8);
        for (int i = 0; i < n; i++) {
            run_state s;
            CHECK(run_state_parse(path[i], &s, &err), f);
            run_transition t = {0};
            t.job_id = "job-1";
            t.backend = "local";
            if (runs_db_transition(f->db, id, s, &t, &err))
                fail_msg("path to %s: %s (seed %llu)", from, err.msg,
                         (unsigned long long)f->rng.seed);
        }
        run_info ri;
        assert_int_equal(runs_db_get(f->db, id, &ri, &err), 1);
        assert_string_equal(run_state_name(ri.state), from);
        int attempts = ri.attempts;
        run_info_free(&ri);
        long long events = dbt_sql_int(f->db, "SELECT count(*) FROM run_events");
        run_state to_s;
        CHECK(run_state_parse(to, &to_s, &err), f);
        run_transition t = {.has_exit_code = 1, .exit_code = 7, .note = "test"};
        int rc = runs_db_transition(f->db, id, to_s, &t, &err);
        int want = expect_legal(from, to);
        if ((rc == 0) != want)
            fail_msg("%s -> %s in the db: rc %d (%s), expected %s (seed %llu)", from, to, rc,
                     err.msg, want ? "accepted" : "refused", (unsigned long long)f->rng.seed);
        assert_int_equal(runs_db_get(f->db, id, &ri, &err), 1);
        if (want) {
            assert_string_equal(run_state_name(ri.state), to);
            assert_int_equal(ri.attempts, attempts + (strcmp(to, "submitted") == 0));
            assert_true(ri.has_exit_code && ri.exit_code == 7);
            assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM run_events"), events + 1);
            if (strcmp(to, "running") == 0)
                assert_non_null(ri.started_at);
            if (run_state_is_terminal(to_s))
                assert_non_null(ri.ended_at);
        } else {
            char needle[80];
            snprintf(needle, sizeof needle, "%s -> %s", from, to);
            assert_non_null(strstr(err.msg, needle));
            assert_non_null(strstr(err.msg, id));
            assert_string_equal(run_state_name(ri.state), from);
            assert_int_equal(ri.attempts, attempts);
            assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM run_events"), events);
        }
        run_info_free(&ri);
        free(id);
    }
    /* Unknown run. */
    assert_true(runs_db_transition(f->db, "tx-999999", RUN_SUBMITTED, NULL, &err) < 0);
    assert_non_null(strstr(err.msg, "tx-999999"));
}

/* A requeue cycle keeps the history of job ids. */
static void test_requeue_history(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    CHECK(runs_db_experiment_upsert(f->db, "rq", NULL, NULL, NULL, &err), f);
    char hash[65], *id = NULL;
    dbt_random_hash(&f->rng, hash);
    run_new rn = {"rq", "{\"x\":true}", hash, "/tmp/x"};
    CHECK(runs_db_insert(f->db, &rn, &id, NULL, &err), f);
    int cycles = tu_randint(&f->rng, 1, 5);
    char job[32];
    for (int c = 0; c < cycles; c++) {
        snprintf(job, sizeof job, "%d", 1000 + c);
        run_transition t = {.backend = "slurm", .job_id = job};
        CHECK(runs_db_transition(f->db, id, RUN_SUBMITTED, &t, &err), f);
        CHECK(runs_db_transition(f->db, id, RUN_RUNNING, NULL, &err), f);
        run_transition q = {.has_exit_code = 1, .exit_code = 75, .note = "preempted"};
        CHECK(runs_db_transition(f->db, id, c + 1 < cycles ? RUN_REQUEUED : RUN_COMPLETED,
                                 c + 1 < cycles ? &q : NULL, &err), f);
    }
    run_info ri;
    assert_int_equal(runs_db_get(f->db, id, &ri, &err), 1);
    assert_int_equal(ri.attempts, cycles);
    assert_string_equal(ri.backend_job_id, job);
    assert_string_equal(ri.backend, "slurm");
    assert_false(ri.has_exit_code);   /* the last attempt's code was never given */
    assert_string_equal(ri.run_dir, "/tmp/x");
    run_info_free(&ri);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(DISTINCT backend_job_id) FROM run_events"),
                     cycles);
    free(id);
}

/* ---- inserts ------------------------------------------------------------------------------ */

static void test_insert_flattens_config(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    int n_exp = tu_randint(&f->rng, 1, 4);
    int expected_seq[4] = {0};
    for (int e = 0; e < n_exp; e++) {
        char name[16];
        snprintf(name, sizeof name, "exp%d", e);
        CHECK(runs_db_experiment_upsert(f->db, name, "spec.yaml", "text", NULL, &err), f);
    }
    int n_runs = tu_randint(&f->rng, 5, 40);
    for (int i = 0; i < n_runs; i++) {
        int e = tu_randint(&f->rng, 0, n_exp);
        char name[16], hash[65], *id = NULL;
        snprintf(name, sizeof name, "exp%d", e);
        dbt_random_hash(&f->rng, hash);
        json_t *cfg = random_config(&f->rng, 0);
        char *text = json_dumps(cfg, JSON_COMPACT);
        run_new rn = {name, text, hash, NULL};
        int64_t pk;
        CHECK(runs_db_insert(f->db, &rn, &id, &pk, &err), f);
        char want_id[32];
        snprintf(want_id, sizeof want_id, "%s-%d", name, ++expected_seq[e]);
        assert_string_equal(id, want_id);

        /* The kv rows equal the test's own flattening. */
        check_kv(f->db, pk, cfg, id, &f->rng);
        free(text);
        json_decref(cfg);
        free(id);
    }
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM runs"), n_runs);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM runs WHERE state = 'pending'"), n_runs);
    /* Types recorded per key. */
    assert_int_equal(dbt_sql_int(f->db, "SELECT types FROM config_keys WHERE key = 'parallel.tp'"),
                     CFG_T_NUM);
    assert_int_equal(dbt_sql_int(f->db, "SELECT types FROM config_keys WHERE key = 'model'"),
                     CFG_T_STR);

    /* Bad inputs change nothing. */
    char hash[65];
    dbt_random_hash(&f->rng, hash);
    run_new bad1 = {"exp0", "[1,2]", hash, NULL};
    assert_int_equal(runs_db_insert(f->db, &bad1, NULL, NULL, &err), HERR_CONFIG);
    run_new bad2 = {"exp0", "{\"a\":", hash, NULL};
    assert_int_equal(runs_db_insert(f->db, &bad2, NULL, NULL, &err), HERR_CONFIG);
    run_new bad3 = {"exp0", "{\"a\":1}", "XYZ", NULL};
    assert_int_equal(runs_db_insert(f->db, &bad3, NULL, NULL, &err), HERR_CONFIG);
    run_new bad4 = {"nope", "{\"a\":1}", hash, NULL};
    assert_int_equal(runs_db_insert(f->db, &bad4, NULL, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "nope"));
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM runs"), n_runs);
}

/* A rolled-back batch leaves nothing, and the interned key cache does not keep ids that
 * were rolled back (the next insert would break the foreign key). */
static void test_rollback_is_atomic(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    CHECK(runs_db_experiment_upsert(f->db, "rb", NULL, NULL, NULL, &err), f);
    long long runs0 = dbt_sql_int(f->db, "SELECT count(*) FROM runs");
    CHECK(db_tx_begin(f->db, &err), f);
    int n = tu_randint(&f->rng, 2, 10);
    for (int i = 0; i < n; i++) {
        char hash[65];
        dbt_random_hash(&f->rng, hash);
        char cfg[128];
        snprintf(cfg, sizeof cfg, "{\"fresh_%d\":{\"key\":%d}}", i, tu_randint(&f->rng, 0, 99));
        run_new rn = {"rb", cfg, hash, NULL};
        CHECK(runs_db_insert(f->db, &rn, NULL, NULL, &err), f);
    }
    assert_int_equal(db_tx_depth(f->db), 1);
    assert_int_equal(db_tx_end(f->db, HERR_RUNTIME, &err), HERR_RUNTIME);
    assert_int_equal(db_tx_depth(f->db), 0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM runs"), runs0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM run_config_kv"), 0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM config_keys"), 0);
    /* Same keys again, committed this time. */
    for (int i = 0; i < n; i++) {
        char hash[65];
        dbt_random_hash(&f->rng, hash);
        char cfg[128];
        snprintf(cfg, sizeof cfg, "{\"fresh_%d\":{\"key\":%d}}", i, i);
        run_new rn = {"rb", cfg, hash, NULL};
        CHECK(runs_db_insert(f->db, &rn, NULL, NULL, &err), f);
    }
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM run_config_kv"), n);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    /* A nested failure dooms the whole transaction: even an outer "commit" rolls back,
     * so nothing partial is ever recorded. */
    long long before = dbt_sql_int(f->db, "SELECT count(*) FROM runs");
    CHECK(db_tx_begin(f->db, &err), f);
    char hash[65];
    dbt_random_hash(&f->rng, hash);
    run_new ok = {"rb", "{\"outer\":1}", hash, NULL};
    CHECK(runs_db_insert(f->db, &ok, NULL, NULL, &err), f);
    run_new bad = {"rb", "{\"inner\":1}", "not-a-hash", NULL};
    assert_int_equal(runs_db_insert(f->db, &bad, NULL, NULL, &err), HERR_CONFIG);
    run_new ok2 = {"rb", "{\"inner\":2}", hash, NULL};
    CHECK(runs_db_insert(f->db, &ok2, NULL, NULL, &err), f);
    /* a failure inside a nested level */
    CHECK(db_tx_begin(f->db, &err), f);
    assert_int_equal(db_tx_end(f->db, HERR_IO, &err), HERR_IO);
    assert_int_equal(db_tx_end(f->db, 0, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "nothing was recorded"));
    assert_int_equal(db_tx_depth(f->db), 0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM runs"), before);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM config_keys WHERE key = 'outer'"), 0);
    /* and the connection is usable afterwards */
    CHECK(runs_db_insert(f->db, &ok, NULL, NULL, &err), f);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM runs"), before + 1);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
}

/* ---- dedup counts and listing ------------------------------------------------------------ */

static void test_counts_and_list(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    const char *exps[] = {"a", "b"};
    for (int e = 0; e < 2; e++)
        CHECK(runs_db_experiment_upsert(f->db, exps[e], NULL, NULL, NULL, &err), f);
    int n_hash = tu_randint(&f->rng, 3, 12);
    char (*hashes)[65] = calloc((size_t)n_hash, 65);
    for (int i = 0; i < n_hash; i++)
        dbt_random_hash(&f->rng, hashes[i]);
    /* expected[e][h] completed / active */
    long comp[2][12] = {{0}}, act[2][12] = {{0}};
    long states[2][RUN_STATE_COUNT] = {{0}};
    int n_runs = tu_randint(&f->rng, 20, 80);
    for (int i = 0; i < n_runs; i++) {
        int e = tu_randint(&f->rng, 0, 2), h = tu_randint(&f->rng, 0, n_hash);
        char *id = NULL;
        run_new rn = {exps[e], "{\"p\":{\"q\":1}}", hashes[h], NULL};
        CHECK(runs_db_insert(f->db, &rn, &id, NULL, &err), f);
        /* Drive to a random reachable state. */
        const char *target = state_names[tu_randint(&f->rng, 0, 8)];
        const char *path[8];
        int n = path_to(target, path, 8);
        for (int k = 0; k < n; k++) {
            run_state s;
            CHECK(run_state_parse(path[k], &s, &err), f);
            CHECK(runs_db_transition(f->db, id, s, NULL, &err), f);
        }
        run_state ts;
        CHECK(run_state_parse(target, &ts, &err), f);
        states[e][ts]++;
        if (ts == RUN_COMPLETED)
            comp[e][h]++;
        else if (!run_state_is_terminal(ts))
            act[e][h]++;
        free(id);
    }
    const char **hp = malloc((size_t)n_hash * sizeof *hp);
    for (int i = 0; i < n_hash; i++)
        hp[i] = hashes[i];
    long *c = calloc((size_t)n_hash, sizeof *c), *a = calloc((size_t)n_hash, sizeof *a);
    for (int e = -1; e < 2; e++) {
        CHECK(runs_db_count_by_hashes(f->db, e < 0 ? NULL : exps[e], hp, (size_t)n_hash, c, a,
                                      &err), f);
        for (int h = 0; h < n_hash; h++) {
            long wc = e < 0 ? comp[0][h] + comp[1][h] : comp[e][h];
            long wa = e < 0 ? act[0][h] + act[1][h] : act[e][h];
            if (c[h] != wc || a[h] != wa)
                fail_msg("hash %d exp %d: completed %ld/%ld active %ld/%ld (seed %llu)", h, e,
                         c[h], wc, a[h], wa, (unsigned long long)f->rng.seed);
            long one_c, one_a;
            CHECK(runs_db_count_by_hash(f->db, e < 0 ? NULL : exps[e], hashes[h], &one_c,
                                        &one_a, &err), f);
            assert_int_equal(one_c, wc);
            assert_int_equal(one_a, wa);
        }
    }
    char unknown[65];
    dbt_random_hash(&f->rng, unknown);
    long uc = -1, ua = -1;
    CHECK(runs_db_count_by_hash(f->db, NULL, unknown, &uc, &ua, &err), f);
    assert_int_equal(uc, 0);
    assert_int_equal(ua, 0);
    CHECK(runs_db_count_by_hash(f->db, "no-such-exp", hashes[0], &uc, &ua, &err), f);
    assert_int_equal(uc + ua, 0);

    for (int e = 0; e < 2; e++) {
        long counts[RUN_STATE_COUNT];
        CHECK(runs_db_state_counts(f->db, exps[e], counts, &err), f);
        for (int s = 0; s < RUN_STATE_COUNT; s++)
            assert_int_equal(counts[s], states[e][s]);
        run_info *v;
        size_t n;
        CHECK(runs_db_list(f->db, exps[e], 0, &v, &n, &err), f);
        long total = 0;
        for (int s = 0; s < RUN_STATE_COUNT; s++)
            total += states[e][s];
        assert_int_equal((long)n, total);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(v[i].seq, (int)i + 1);
            assert_string_equal(v[i].experiment, exps[e]);
            assert_null(v[i].config_json);
        }
        runs_db_list_free(v, n);
        unsigned mask = (1u << RUN_COMPLETED) | (1u << RUN_PENDING);
        CHECK(runs_db_list(f->db, exps[e], mask, &v, &n, &err), f);
        assert_int_equal((long)n, states[e][RUN_COMPLETED] + states[e][RUN_PENDING]);
        for (size_t i = 0; i < n; i++)
            assert_true(mask & (1u << v[i].state));
        runs_db_list_free(v, n);
    }
    free(c);
    free(a);
    free(hp);
    free(hashes);
}

/* Two connections: WAL lets one read while the other writes. */
static void test_two_connections(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    hearth_db *other = NULL;
    if (db_open(f->path, &other, &err))
        fail_msg("second open: %s", err.msg);
    CHECK(runs_db_experiment_upsert(f->db, "w", NULL, NULL, NULL, &err), f);
    CHECK(db_tx_begin(f->db, &err), f);
    char hash[65];
    dbt_random_hash(&f->rng, hash);
    run_new rn = {"w", "{\"a\":1}", hash, NULL};
    CHECK(runs_db_insert(f->db, &rn, NULL, NULL, &err), f);
    /* The reader sees the last committed state while the writer's transaction is open. */
    long counts[RUN_STATE_COUNT];
    CHECK(runs_db_state_counts(other, "w", counts, &err), f);
    assert_int_equal(counts[RUN_PENDING], 0);
    CHECK(db_tx_end(f->db, 0, &err), f);
    CHECK(runs_db_state_counts(other, "w", counts, &err), f);
    assert_int_equal(counts[RUN_PENDING], 1);
    db_close(other);
}

/* ---- the database file deleted or replaced under an open connection --------------------- */

static void unlink_db(const char *path, const char *suffix)
{
    char p[400];
    snprintf(p, sizeof p, "%s%s", path, suffix);
    unlink(p);
}

static int file_exists(const char *path, const char *suffix)
{
    char p[400];
    snprintf(p, sizeof p, "%s%s", path, suffix);
    return access(p, F_OK) == 0;
}

/* Deleted with its -wal and -shm (`rm hearth.db*`): every later write fails with HERR_IO
 * naming the file, instead of going into an unlinked inode. */
static void test_file_deleted(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    CHECK(runs_db_experiment_upsert(f->db, "before", NULL, NULL, NULL, &err), f);
    assert_int_equal(db_check_file(f->db, &err), 0);
    assert_int_equal(db_file_lost(f->db), 0);
    unlink_db(f->path, "");
    unlink_db(f->path, "-wal");
    unlink_db(f->path, "-shm");
    assert_int_equal(db_check_file(f->db, &err), HERR_IO);
    assert_non_null(strstr(err.msg, f->path));
    assert_non_null(strstr(err.msg, "was deleted while hearth was using it"));
    assert_int_equal(db_file_lost(f->db), 1);
    memset(&err, 0, sizeof err);
    assert_int_equal(runs_db_experiment_upsert(f->db, "after", NULL, NULL, NULL, &err), HERR_IO);
    assert_non_null(strstr(err.msg, f->path));

    /* A new database at the same path (what `hearth ingest` makes) keeps its commits when
     * the old connection closes: the old one must not delete the new -wal and -shm. */
    hearth_db *fresh = NULL;
    if (db_open(f->path, &fresh, &err))
        fail_msg("reopen: %s", err.msg);
    CHECK(runs_db_experiment_upsert(fresh, "rebuilt", NULL, NULL, NULL, &err), f);
    db_close(f->db);
    f->db = NULL;
    assert_true(file_exists(f->path, "-wal"));
    assert_true(file_exists(f->path, "-shm"));
    assert_int_equal(db_check_file(fresh, &err), 0);
    db_close(fresh);
    open_db(f);
    int64_t id;
    assert_int_equal(runs_db_experiment_find(f->db, "rebuilt", &id, &err), 1);
    assert_int_equal(runs_db_experiment_find(f->db, "before", &id, &err), 0);
}

/* Replaced by another file (a copy moved over it): "replaced", and the write transaction
 * that was open when it happened does not commit. */
static void test_file_replaced(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    char other[320];
    snprintf(other, sizeof other, "%s/other.db", f->dir);
    open_db(f);
    hearth_db *o = NULL;
    if (db_open(other, &o, &err))
        fail_msg("db_open other: %s", err.msg);
    db_close(o);
    CHECK(db_tx_begin(f->db, &err), f);
    CHECK(runs_db_experiment_upsert(f->db, "inside", NULL, NULL, NULL, &err), f);
    assert_int_equal(rename(other, f->path), 0);
    assert_int_equal(db_tx_end(f->db, 0, &err), HERR_IO);
    assert_non_null(strstr(err.msg, f->path));
    assert_non_null(strstr(err.msg, "was replaced while hearth was using it"));
    assert_int_equal(db_tx_depth(f->db), 0);
    assert_int_equal(db_tx_begin(f->db, &err), HERR_IO);
}

/* Only the -wal deleted: its commits not yet in the file would be lost just the same. */
static void test_wal_deleted(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    CHECK(runs_db_experiment_upsert(f->db, "a", NULL, NULL, NULL, &err), f);
    assert_true(file_exists(f->path, "-wal"));
    unlink_db(f->path, "-wal");
    assert_int_equal(runs_db_experiment_upsert(f->db, "b", NULL, NULL, NULL, &err), HERR_IO);
    assert_non_null(strstr(err.msg, f->path));
}

/* Ordinary use never looks lost: writes, other connections opening and closing (the last
 * of them must not take the -wal away from under us), a reopen. */
static void test_file_kept(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    open_db(f);
    for (int i = 0; i < 5; i++) {
        hearth_db *other = NULL;
        if (db_open(f->path, &other, &err))
            fail_msg("second open: %s", err.msg);
        char name[32];
        snprintf(name, sizeof name, "e%d", i);
        CHECK(runs_db_experiment_upsert(other, name, NULL, NULL, NULL, &err), f);
        db_close(other);
        CHECK(runs_db_experiment_upsert(f->db, name, "spec.yaml", NULL, NULL, &err), f);
        CHECK(db_check_file(f->db, &err), f);
    }
    db_close(f->db);
    open_db(f);
    CHECK(db_check_file(f->db, &err), f);
    CHECK(runs_db_experiment_upsert(f->db, "last", NULL, NULL, NULL, &err), f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_migrations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migration_keeps_layer_bench, setup, teardown),
        cmocka_unit_test(test_embedded_migrations_match_files),
        cmocka_unit_test(test_transition_table),
        cmocka_unit_test_setup_teardown(test_transitions_in_db, setup, teardown),
        cmocka_unit_test_setup_teardown(test_requeue_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_insert_flattens_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollback_is_atomic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_counts_and_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_connections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_deleted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_replaced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wal_deleted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_kept, setup, teardown),
    };
    return cmocka_run_group_tests_name("orch_db", tests, NULL, NULL);
}
