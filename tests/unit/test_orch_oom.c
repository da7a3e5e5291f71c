/* test_orch_oom.c - allocation-failure injection on the orchestrator's parse -> plan -> DB
 * paths: a spec is read (spec_parse), planned (plan_run) with its runs created in the
 * results database (sweep_create_run, one transaction as `hearth submit` does), one run
 * directory is ingested (ingest_run) and the runs are queried (query_runs).  The same
 * sequence runs again and again with allocation number N failing (N = 1, 2, ... up to the
 * number of allocations the sequence makes), each time on a fresh copy of the same
 * database.  Each time: either a clean error (a herr code and a message) with the database
 * exactly as it was before the failing step, or success with exactly the content of the
 * run without failures; no crash (ASan/UBSan in `make test-san`) and no leak (LeakSanitizer
 * checks after every N there).
 *
 * The injection wraps malloc, calloc, realloc, strdup, strndup, asprintf and vasprintf at
 * link time (-Wl,--wrap, Makefile), so it reaches every call site in the hearth libraries
 * and this file; a second sweep also fails SQLite's own allocations (SQLITE_CONFIG_MALLOC).
 * Allocations inside libyaml and Jansson are not failed.
 *
 * `make test` checks the first N of each step and some spread evenly over the rest of it,
 * from a random offset (seed printed; HEARTH_TEST_SEED replays it), under a minute under
 * ASan; HEARTH_TEST_OOM_FULL=1 checks every N (docs/fuzzing.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "db.h"
#include "ingest.h"
#include "plan.h"
#include "query.h"
#include "runs_db.h"
#include "spec.h"
#include "sweep.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define OOM_LEAK_CHECK() __lsan_do_recoverable_leak_check()
#else
#define OOM_LEAK_CHECK() 0
#endif

/* ---- the injector: the wrapped allocators count while armed and fail call fail_at ---- */

static int oom_armed;
static int oom_sqlite;      /* SQLite's own allocations count (and fail) too */
static long oom_calls;      /* allocations while armed */
static long oom_fail_at;    /* 0: none fails */
static int oom_failed;      /* the failing allocation happened */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_vasprintf(char **out, const char *fmt, va_list ap);

static int oom_fail(void)
{
    if (!oom_armed)
        return 0;
    if (++oom_calls != oom_fail_at)
        return 0;
    oom_failed = 1;
    return 1;
}

void *__wrap_malloc(size_t n) { return oom_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return oom_fail() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return oom_fail() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return oom_fail() ? NULL : __real_strdup(s); }
char *__wrap_strndup(const char *s, size_t n) { return oom_fail() ? NULL : __real_strndup(s, n); }

int __wrap_vasprintf(char **out, const char *fmt, va_list ap)
{
    if (oom_fail())
        return -1;
    return __real_vasprintf(out, fmt, ap);
}

int __wrap_asprintf(char **out, const char *fmt, ...)
{
    if (oom_fail())
        return -1;
    va_list ap;
    va_start(ap, fmt);
    int r = __real_vasprintf(out, fmt, ap);
    va_end(ap);
    return r;
}

/* SQLite's allocator (SQLITE_CONFIG_MALLOC), wrapped around its default one. */
static sqlite3_mem_methods sqlite_default;

static void *sqlite_malloc(int n)
{
    return oom_sqlite && oom_fail() ? NULL : sqlite_default.xMalloc(n);
}

static void *sqlite_realloc(void *p, int n)
{
    return oom_sqlite && oom_fail() ? NULL : sqlite_default.xRealloc(p, n);
}

static void sqlite_free(void *p) { sqlite_default.xFree(p); }
static int sqlite_size(void *p) { return sqlite_default.xSize(p); }
static int sqlite_roundup(int n) { return sqlite_default.xRoundup(n); }
static int sqlite_init(void *app) { return sqlite_default.xInit(app); }
static void sqlite_shutdown(void *app) { sqlite_default.xShutdown(app); }

/* Before SQLite is first used: its allocations then go through the injector too (they
 * count only while oom_sqlite is set). */
static int sqlite_wrap_allocator(void)
{
    static sqlite3_mem_methods wrapped = { sqlite_malloc, sqlite_free, sqlite_realloc,
                                           sqlite_size, sqlite_roundup, sqlite_init,
                                           sqlite_shutdown, NULL };
    if (sqlite3_config(SQLITE_CONFIG_GETMALLOC, &sqlite_default) != SQLITE_OK)
        return -1;
    wrapped.pAppData = sqlite_default.pAppData;
    return sqlite3_config(SQLITE_CONFIG_MALLOC, &wrapped) == SQLITE_OK ? 0 : -1;
}

static void oom_arm(long fail_at)
{
    oom_calls = 0;
    oom_fail_at = fail_at;
    oom_failed = 0;
    oom_armed = 1;
}

static void oom_disarm(void) { oom_armed = 0; }

/* ---- the scenario ----------------------------------------------------------------------- */

static const char spec_text[] =
    "name: oom\n"
    "base:\n"
    "  model: tiny-vlm\n"
    "  train: {steps: 3, seq_len: 32, micro_batch: 1, global_batch: 1}\n"
    "resources: {time: \"10:00\", setup: [echo one, echo two]}\n"
    "matrix:\n"
    "  train.lr: [1.0e-3, 2.0e-3, 3.0e-3]\n"
    "  train.seed: [1, 2]\n"
    "zip:\n"
    "  - {train.warmup: [0, 1], train.measure_from: [1, 2]}\n"
    "include: [{train.lr: 5.0e-3, train.seed: 9}]\n"
    "exclude: [{train.lr: 3.0e-3, train.seed: 2}]\n"
    "where: \"train.lr < 4e-3 or train.seed == 9\"\n"
    "retries: 1\n";

typedef struct {
    char dir[256];
    char pristine[320];      /* the database every sequence starts from */
    char work[320];          /* its copy that a sequence changes */
    char exp_dir[320];
    char tmpl_name[4096];
    char *tmpl;
} fixture;

/* Steps of a sequence; a failure is reported with the step it happened in. */
enum { STEP_OPEN, STEP_PLAN, STEP_INGEST, STEP_QUERY, STEP_DONE };

typedef struct {
    hearth_db *db;
    const spec *s;
    const fixture *f;
    hearth_err *err;
    long created;
    char first_run[64];
} create_ctx;

static int completed_fn(void *ctx, const char *hash, int *count, hearth_err *err)
{
    create_ctx *c = ctx;
    long done = 0;
    int rc = runs_db_count_by_hash(c->db, c->s->name, hash, &done, NULL, err);
    *count = (int)done;
    return rc;
}

/* As `hearth submit` creates a kept point's runs (cmd_submit.c). */
static int create_fn(void *ctx, const plan_point *p)
{
    create_ctx *c = ctx;
    if (p->status != PLAN_KEPT)
        return 0;
    long active = 0;
    int rc = runs_db_count_by_hash(c->db, c->s->name, p->hash, NULL, &active, c->err);
    if (rc || p->runs - active <= 0)
        return rc;
    char *json = run_config_canonical_json(p->config, c->err);
    if (!json)
        return HERR_NOMEM;
    rundir_job j;
    memset(&j, 0, sizeof j);
    j.experiment = (char *)c->s->name;
    j.backend = "local";
    j.trainer = "/bin/true";
    j.workdir = (char *)c->f->dir;
    j.n_setup = c->s->resources.n_setup;
    j.setup = (char **)c->s->resources.setup;
    j.config_hash = (char *)p->hash;
    j.cpus_per_task = 1;
    j.time_limit_s = 600;
    j.retries = c->s->retries;
    j.repeat = c->s->repeat;
    j.pack = 1;
    j.nodes = 1;
    char *id = NULL;
    rc = sweep_create_run(c->db, &j, json, c->f->exp_dir, c->f->tmpl_name, c->f->tmpl, &id,
                          c->err);
    if (!rc && c->created++ == 0)
        snprintf(c->first_run, sizeof c->first_run, "%s", id);
    free(id);
    free(json);
    return rc;
}

/* The trainer's outputs in a run directory (written with the injector off). */
static void write_outputs(const char *run_dir, const char *hash)
{
    char path[600], text[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    assert_int_equal(tu_write_text(path,
        "{\"step\":1,\"loss\":6.5,\"lr\":0.001,\"step_ms\":10,\"tokens\":32}\n"
        "{\"step\":2,\"loss\":6.25,\"lr\":0.001,\"step_ms\":11,\"tokens\":32,\"custom\":[1,2]}\n"
        "{\"step\":3,\"loss\":6.0,\"lr\":0.001,\"step_ms\":9,\"tokens\":32}\n"), 0);
    snprintf(path, sizeof path, "%s/result.json", run_dir);
    snprintf(text, sizeof text,
             "{\"config_hash\": \"%s\", \"steps\": 3, \"step_ms_median\": 10, "
             "\"tokens_per_s\": 3200, \"final_loss\": 6.0, \"exit_status\": \"done\", "
             "\"device\": \"cpu\", \"device_count\": 1, \"nodes\": 1, "
             "\"versions\": {\"hearth\": \"test\"}, \"extra_key\": 1}\n", hash);
    assert_int_equal(tu_write_text(path, text), 0);
    snprintf(path, sizeof path, "%s/exit_code", run_dir);
    assert_int_equal(tu_write_text(path, "0\n"), 0);
}

/* Every table's rows (times left out: they differ between sequences; SQLite's own tables
 * too: db_close refreshes the planner statistics in sqlite_stat1), as one string. */
static char *db_dump(const char *path)
{
    sqlite3 *s;
    assert_int_equal(sqlite3_open_v2(path, &s, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    assert_non_null(f);
    sqlite3_stmt *tables;
    assert_int_equal(sqlite3_prepare_v2(s, "SELECT name FROM sqlite_master WHERE type = "
                                           "'table' AND name NOT LIKE 'sqlite\\_%' "
                                           "ESCAPE '\\' ORDER BY name", -1, &tables, NULL),
                     SQLITE_OK);
    while (sqlite3_step(tables) == SQLITE_ROW) {
        char sql[256];
        snprintf(sql, sizeof sql, "SELECT * FROM \"%s\" ORDER BY 1, 2",
                 (const char *)sqlite3_column_text(tables, 0));
        sqlite3_stmt *rows;
        if (sqlite3_prepare_v2(s, sql, -1, &rows, NULL) != SQLITE_OK)   /* one column */
            continue;
        fprintf(f, "[%s]\n", (const char *)sqlite3_column_text(tables, 0));
        while (sqlite3_step(rows) == SQLITE_ROW) {
            for (int c = 0; c < sqlite3_column_count(rows); c++) {
                const char *name = sqlite3_column_name(rows, c);
                size_t n = strlen(name);
                if (strcmp(name, "at") == 0 || (n > 3 && strcmp(name + n - 3, "_at") == 0))
                    continue;
                const unsigned char *t = sqlite3_column_text(rows, c);
                fprintf(f, "%s|", t ? (const char *)t : "NULL");
            }
            fputc('\n', f);
        }
        sqlite3_finalize(rows);
    }
    sqlite3_finalize(tables);
    sqlite3_stmt *chk;
    assert_int_equal(sqlite3_prepare_v2(s, "PRAGMA integrity_check", -1, &chk, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(chk), SQLITE_ROW);
    fprintf(f, "integrity: %s\n", (const char *)sqlite3_column_text(chk, 0));
    sqlite3_finalize(chk);
    sqlite3_close(s);
    fclose(f);
    return out;
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        assert_int_equal(fwrite(buf, 1, n, b), n);
    fclose(a);
    assert_int_equal(fclose(b), 0);
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return type == FTW_DP ? rmdir(path) : unlink(path);
}

/* A fresh copy of the pristine database (no WAL left from the last sequence) and no run
 * directories (removed here: a shell per sequence would be most of the test's time). */
static void reset(const fixture *f)
{
    char p[400];
    snprintf(p, sizeof p, "%s-wal", f->work);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", f->work);
    unlink(p);
    copy_file(f->pristine, f->work);
    if (access(f->exp_dir, F_OK) == 0)
        assert_int_equal(nftw(f->exp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

typedef struct {
    long first[STEP_DONE + 1];   /* allocation count at the start of each step (and the end) */
    int step;               /* STEP_DONE, or the step that failed */
    int rc;
    char msg[sizeof(((hearth_err *)0)->msg)];
    char *before;           /* the dump before the failing step (NULL when none failed) */
    char *query_out;        /* what the query wrote (malloc'd; NULL when it did not run) */
    size_t query_len;
} outcome;

/* One sequence with allocation `fail_at` failing (0: none). */
static void sequence(const fixture *f, long fail_at, outcome *o)
{
    memset(o, 0, sizeof *o);
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    spec *s = NULL;
    create_ctx cc;
    memset(&cc, 0, sizeof cc);
    o->before = db_dump(f->work);
    oom_arm(fail_at);
    o->step = STEP_OPEN;
    o->first[STEP_OPEN] = oom_calls;
    o->rc = db_open(f->work, &db, &err);
    if (!o->rc)
        o->rc = spec_parse(&s, "oom.yaml", spec_text, strlen(spec_text), &err);
    if (o->rc)
        goto out;
    o->step = STEP_PLAN;
    o->first[STEP_PLAN] = oom_calls;
    cc.db = db;
    cc.s = s;
    cc.f = f;
    cc.err = &err;
    plan_opts po;
    memset(&po, 0, sizeof po);
    po.already_completed = completed_fn;
    po.completed_ctx = &cc;
    plan_counts pc;
    if ((o->rc = db_tx_begin(db, &err)) == 0) {
        int r = runs_db_experiment_upsert(db, s->name, "oom.yaml", spec_text, NULL, &err);
        if (!r)
            r = plan_run(s, &po, create_fn, &cc, &pc, &err);
        o->rc = db_tx_end(db, r, &err);
    }
    if (o->rc)
        goto out;
    oom_disarm();
    free(o->before);
    o->before = NULL;
    char run_dir[512];
    snprintf(run_dir, sizeof run_dir, "%s/%s", f->exp_dir, cc.first_run);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_sqlite(db), "SELECT config_hash FROM runs WHERE "
                                        "run_id = ?1", -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_text(st, 1, cc.first_run, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    write_outputs(run_dir, (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    o->before = db_dump(f->work);
    oom_armed = 1;
    o->step = STEP_INGEST;
    o->first[STEP_INGEST] = oom_calls;
    ingest_summary sum;
    if ((o->rc = ingest_run(db, cc.first_run, NULL, &sum, &err)))
        goto out;
    oom_disarm();
    free(o->before);
    o->before = db_dump(f->work);
    FILE *qout = open_memstream(&o->query_out, &o->query_len);
    assert_non_null(qout);
    oom_armed = 1;
    o->step = STEP_QUERY;
    o->first[STEP_QUERY] = oom_calls;
    query_opts qo = { "train.lr >= 2e-3 and final_loss < 7 or train.seed == 9", "oom",
                      "-tokens_per_s", 0, "run_id,state,train.lr,train.seed,final_loss",
                      REPORT_CSV, 0 };
    long rows = 0;
    o->rc = query_runs(db, &qo, qout, &rows, &err);
    oom_disarm();
    fclose(qout);
    if (o->rc)
        goto out;
    o->step = STEP_DONE;
    o->first[STEP_DONE] = oom_calls;
    free(o->before);
    o->before = NULL;
out:
    db_close(db);
    spec_free(s);
    oom_disarm();
    snprintf(o->msg, sizeof o->msg, "%s", err.msg);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f || tu_tmpdir_make(f->dir, sizeof f->dir, "oom"))
        return -1;
    snprintf(f->pristine, sizeof f->pristine, "%s/pristine.db", f->dir);
    snprintf(f->work, sizeof f->work, "%s/work.db", f->dir);
    snprintf(f->exp_dir, sizeof f->exp_dir, "%s/runs/oom", f->dir);
    hearth_err err = { { 0 } };
    hearth_db *db = NULL;
    /* The pristine database already holds another experiment with a run. */
    run_new rn = { "other", "{\"train\":{\"steps\":1}}",
                   "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", NULL };
    if (db_open(f->pristine, &db, &err) ||
        runs_db_experiment_upsert(db, "other", NULL, NULL, NULL, &err) ||
        runs_db_insert(db, &rn, NULL, NULL, &err) ||
        sweep_load_template("local", f->tmpl_name, sizeof f->tmpl_name, &f->tmpl, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    /* One file, no WAL beside it: the copy is the whole database. */
    sqlite3_exec(db_sqlite(db), "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    db_close(db);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tu_tmpdir_remove(f->dir);
    free(f->tmpl);
    free(f);
    return 0;
}

static const char *step_name(int step)
{
    static const char *const names[] = { "open/parse", "plan/create", "ingest", "query",
                                         "done" };
    return names[step];
}

/* The reference sequence, then each chosen N: per step the first `dense` allocations and
 * `spread` more spread evenly over the rest of the step, or every N with
 * HEARTH_TEST_OOM_FULL. */
static void sweep(fixture *f, int with_sqlite, long dense, long spread)
{
    oom_sqlite = with_sqlite;
    /* The reference: no failure. */
    reset(f);
    outcome ref;
    sequence(f, 0, &ref);
    if (ref.step != STEP_DONE)
        fail_msg("the sequence fails without injection at %s: %s", step_name(ref.step),
                 ref.msg);
    long total = oom_calls;
    char *want = db_dump(f->work);
    assert_true(total > 100);
    assert_non_null(strstr(want, "[runs]"));
    /* The query selects some runs, not all (a dropped filter would show). */
    assert_non_null(strstr(ref.query_out, "run_id,state,train.lr"));
    assert_non_null(strstr(ref.query_out, "oom-"));

    int full = getenv("HEARTH_TEST_OOM_FULL") != NULL;
    long *ns = calloc((size_t)total, sizeof *ns), n_ns = 0;
    assert_non_null(ns);
    /* The spread ones start at a fresh random offset every run (seed printed). */
    tu_rng rng = tu_rng_fresh_noted();
    for (int st = STEP_OPEN; st < STEP_DONE; st++) {
        long lo = ref.first[st] + 1, hi = ref.first[st + 1];   /* this step's N */
        long rest = hi - lo + 1 - dense, stride = rest / spread + 1;
        long offset = rest > 0 ? (long)(tu_next(&rng) % (uint64_t)stride) : 0;
        for (long n = lo; n <= hi; n++) {
            long k = n - lo;
            if (full || k < dense || (k - dense) % stride == offset)
                ns[n_ns++] = n;
        }
    }
    long checked = 0, errors = 0, tolerated = 0;
    long per_step[STEP_DONE + 1] = { 0 };
    for (long i = 0; i < n_ns; i++) {
        long n = ns[i];
        reset(f);
        outcome o;
        sequence(f, n, &o);
        checked++;
        if (!oom_failed)
            fail_msg("N=%ld: allocation %ld never happened (the sequence made %ld)", n, n,
                     oom_calls);
        if (OOM_LEAK_CHECK())
            fail_msg("N=%ld: memory leaked (failed at %s: %s)", n, step_name(o.step), o.msg);
        per_step[o.step]++;
        char *got = db_dump(f->work);
        if (o.step == STEP_DONE) {
            /* The failure was tolerated: the result must be the same as without it. */
            tolerated++;
            if (strcmp(got, want) != 0)
                fail_msg("N=%ld: succeeded, but the database differs from the reference:\n"
                         "--- got\n%s\n--- want\n%s", n, got, want);
            if (strcmp(o.query_out, ref.query_out) != 0)
                fail_msg("N=%ld: succeeded, but the query wrote something else:\n--- got\n"
                         "%s--- want\n%s", n, o.query_out, ref.query_out);
        } else {
            errors++;
            if (o.rc >= 0 || !o.msg[0])
                fail_msg("N=%ld: failed at %s without a clean error (rc %d, '%s')", n,
                         step_name(o.step), o.rc, o.msg);
            if (strcmp(got, o.before) != 0)
                fail_msg("N=%ld: %s failed (%s) and changed the database:\n--- got\n%s\n"
                         "--- before\n%s", n, step_name(o.step), o.msg, got, o.before);
        }
        free(got);
        free(o.before);
        free(o.query_out);
    }
    printf("# %s: %ld allocations in the sequence (open/parse %ld, plan/create %ld, ingest %ld, "
           "query %ld); N checked: %ld (%s): %ld clean errors (open/parse %ld, plan/create "
           "%ld, ingest %ld, query %ld), %ld tolerated\n",
           with_sqlite ? "hearth's and SQLite's allocations" : "hearth's allocations", total,
           ref.first[STEP_PLAN] - ref.first[STEP_OPEN],
           ref.first[STEP_INGEST] - ref.first[STEP_PLAN],
           ref.first[STEP_QUERY] - ref.first[STEP_INGEST],
           ref.first[STEP_DONE] - ref.first[STEP_QUERY], checked,
           full ? "all" : "the first ones of each step and some spread over its rest", errors,
           per_step[STEP_OPEN], per_step[STEP_PLAN], per_step[STEP_INGEST],
           per_step[STEP_QUERY], tolerated);
    free(ns);
    free(want);
    free(ref.query_out);
    oom_sqlite = 0;
}

static void test_every_allocation_fails_in_turn(void **state)
{
    sweep(*state, 0, 60, 30);
}

/* The same with SQLite's allocations failing too: hearth must turn SQLITE_NOMEM (from any
 * statement, commit or rollback) into a clean error. */
static void test_sqlite_allocations_fail_too(void **state)
{
    sweep(*state, 1, 25, 25);
}

int main(void)
{
    if (sqlite_wrap_allocator() != 0) {
        fprintf(stderr, "cannot wrap SQLite's allocator\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_allocation_fails_in_turn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sqlite_allocations_fail_too, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
