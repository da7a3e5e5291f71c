/* test_orch_exp_db.c - experiments as a user manages them, on a real results database:
 * removing one takes exactly its runs and everything hanging off them (history, config
 * keys, metrics, results, tags, decisions) and leaves every other experiment's rows as
 * they were; it is refused while runs are live and all-or-nothing when a step fails;
 * archive and unarchive (and `query` leaving archived experiments out unless asked), tags
 * and their checks, and the listing's filters and counts, held against counts kept by the
 * test itself.  Fresh random data in every test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "db.h"
#include "query.h"
#include "run_state.h"
#include "runs_db.h"
#include "tests/unit/support/dbtest.h"
#include "tests/unit/support/testutil.h"
#include "tests/unit/support/tmpdir.h"

typedef struct {
    char dir[256];
    char path[300];
    hearth_db *db;
    tu_rng rng;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (tu_tmpdir_make(f->dir, sizeof f->dir, "expdb"))
        return -1;
    snprintf(f->path, sizeof f->path, "%s/test.db", f->dir);
    f->rng = tu_rng_fresh();
    hearth_err err = {{0}};
    if (db_open(f->path, &f->db, &err)) {
        fprintf(stderr, "db_open: %s\n", err.msg);
        return -1;
    }
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

/* The transitions that lead from pending to each state (written here from DESIGN.md). */
static int path_to(run_state to, run_state *path)
{
    switch (to) {
    case RUN_PENDING: return 0;
    case RUN_SUBMITTED: path[0] = RUN_SUBMITTED; return 1;
    case RUN_RUNNING: path[0] = RUN_SUBMITTED; path[1] = RUN_RUNNING; return 2;
    case RUN_REQUEUED:
        path[0] = RUN_SUBMITTED; path[1] = RUN_RUNNING; path[2] = RUN_REQUEUED; return 3;
    case RUN_COMPLETED:
        path[0] = RUN_SUBMITTED; path[1] = RUN_RUNNING; path[2] = RUN_COMPLETED; return 3;
    case RUN_FAILED: path[0] = RUN_SUBMITTED; path[1] = RUN_FAILED; return 2;
    case RUN_CANCELLED: path[0] = RUN_CANCELLED; return 1;
    case RUN_TIMEOUT:
        path[0] = RUN_SUBMITTED; path[1] = RUN_RUNNING; path[2] = RUN_TIMEOUT; return 3;
    default: return 0;
    }
}

static long long sql_int(hearth_db *db, const char *fmt, const char *arg)
{
    char sql[512];
    snprintf(sql, sizeof sql, fmt, arg);
    return dbt_sql_int(db, sql);
}

/* Rows of each table that hang off experiment `name` (by name, so that they can be counted
 * after it is gone: a leftover row of a removed experiment would show). */
typedef struct {
    long long runs, events, kv, metrics, results, tags, decisions, benches;
} owned;

static owned owned_by(hearth_db *db, const char *name)
{
    owned o;
    o.runs = sql_int(db, "SELECT count(*) FROM runs WHERE run_id LIKE '%s-%%'", name);
    o.events = sql_int(db, "SELECT count(*) FROM run_events v JOIN runs r ON r.id = v.run "
                           "WHERE r.run_id LIKE '%s-%%'", name);
    o.kv = sql_int(db, "SELECT count(*) FROM run_config_kv k JOIN runs r ON r.id = k.run "
                       "WHERE r.run_id LIKE '%s-%%'", name);
    o.metrics = sql_int(db, "SELECT count(*) FROM metrics m JOIN runs r ON r.id = m.run "
                            "WHERE r.run_id LIKE '%s-%%'", name);
    o.results = sql_int(db, "SELECT count(*) FROM results s JOIN runs r ON r.id = s.run "
                            "WHERE r.run_id LIKE '%s-%%'", name);
    o.tags = sql_int(db, "SELECT count(*) FROM experiment_tags t JOIN experiments e ON "
                         "e.id = t.experiment WHERE e.name = '%s'", name);
    o.decisions = sql_int(db, "SELECT count(*) FROM decisions WHERE experiment = '%s'", name);
    o.benches = sql_int(db, "SELECT count(*) FROM layer_bench_sets b JOIN runs r ON "
                            "r.id = b.run WHERE r.run_id LIKE '%s-%%'", name);
    return o;
}

static void owned_equal(owned a, owned b, const char *what, tu_rng *rng)
{
    if (memcmp(&a, &b, sizeof a) != 0)
        fail_msg("%s: runs %lld/%lld events %lld/%lld kv %lld/%lld metrics %lld/%lld "
                 "results %lld/%lld tags %lld/%lld decisions %lld/%lld benches %lld/%lld "
                 "(seed %llu)", what, a.runs, b.runs, a.events, b.events, a.kv, b.kv,
                 a.metrics, b.metrics, a.results, b.results, a.tags, b.tags, a.decisions,
                 b.decisions, a.benches, b.benches, (unsigned long long)rng->seed);
}

/* Experiment `name` with random runs in random states (none live unless `live`), metrics
 * and results for some, tags and decisions; counts[] receives its runs per state. */
static void populate(fixture *f, const char *name, int live, long counts[RUN_STATE_COUNT])
{
    hearth_err err = {{0}};
    CHECK(runs_db_experiment_upsert(f->db, name, NULL, "spec", NULL, &err), f);
    for (int s = 0; s < RUN_STATE_COUNT; s++)
        counts[s] = 0;
    int n = tu_randint(&f->rng, 3, 20);
    for (int i = 0; i < n; i++) {
        char hash[65], cfg[128], *id = NULL;
        int64_t pk = 0;
        dbt_random_hash(&f->rng, hash);
        snprintf(cfg, sizeof cfg, "{\"train\":{\"lr\":%d,\"seed\":%d},\"k%d\":true}",
                 tu_randint(&f->rng, 1, 9), i, tu_randint(&f->rng, 0, 5));
        run_new rn = {name, cfg, hash, NULL};
        CHECK(runs_db_insert(f->db, &rn, &id, &pk, &err), f);
        run_state to;
        do
            to = (run_state)tu_randint(&f->rng, 0, RUN_STATE_COUNT);
        while (!live && (to == RUN_SUBMITTED || to == RUN_RUNNING));
        run_state path[4];
        int np = path_to(to, path);
        for (int k = 0; k < np; k++)
            CHECK(runs_db_transition(f->db, id, path[k], NULL, &err), f);
        counts[to]++;
        char sql[256];
        int steps = tu_randint(&f->rng, 0, 5);
        for (int s = 1; s <= steps; s++) {
            snprintf(sql, sizeof sql, "INSERT INTO metrics (run, step, loss) VALUES "
                     "(%lld, %d, %g)", (long long)pk, s, 1.0 / s);
            CHECK(db_exec(f->db, sql, &err), f);
        }
        if (to == RUN_COMPLETED) {
            snprintf(sql, sizeof sql, "INSERT INTO results (run, steps, tokens_per_s) VALUES "
                     "(%lld, %d, %d)", (long long)pk, steps, tu_randint(&f->rng, 1, 1000));
            CHECK(db_exec(f->db, sql, &err), f);
        }
        if (tu_randint(&f->rng, 0, 4) == 0) {
            snprintf(sql, sizeof sql, "INSERT INTO layer_bench_sets (run, source, "
                     "content_sha256, gpu, model) VALUES (%lld, 'x', '%s', 'H100', 'm')",
                     (long long)pk, hash);
            CHECK(db_exec(f->db, sql, &err), f);
        }
        free(id);
    }
    int nt = tu_randint(&f->rng, 0, 4);
    for (int i = 0; i < nt; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "t%d", tu_randint(&f->rng, 0, 6));
        CHECK(runs_db_experiment_tag(f->db, name, tag, 1, NULL, &err), f);
    }
    int nd = tu_randint(&f->rng, 1, 4);
    for (int i = 0; i < nd; i++) {
        char sql[256];
        snprintf(sql, sizeof sql, "INSERT INTO decisions (kind, experiment, subject, "
                 "decision, method, evidence) VALUES ('fp8', '%s', '{}', 'off', 'none', "
                 "'{}')", name);
        CHECK(db_exec(f->db, sql, &err), f);
    }
}

/* ---- remove ------------------------------------------------------------------------------ */

static void test_remove_takes_exactly_one(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    long ca[RUN_STATE_COUNT], cb[RUN_STATE_COUNT];
    populate(f, "a", 0, ca);
    populate(f, "b", tu_randint(&f->rng, 0, 2), cb);
    /* A decision of no experiment (hearth select) stays too. */
    CHECK(db_exec(f->db, "INSERT INTO decisions (kind, subject, decision, method, evidence) "
                         "VALUES ('encoder', '{}', 'uniform', 'none', '{}')", &err), f);
    owned a0 = owned_by(f->db, "a"), b0 = owned_by(f->db, "b");
    long long benches = dbt_sql_int(f->db, "SELECT count(*) FROM layer_bench_sets");
    long long keys = dbt_sql_int(f->db, "SELECT count(*) FROM config_keys");

    experiment_removed got = {-1, -1};
    CHECK(runs_db_experiment_remove(f->db, "a", &got, &err), f);
    assert_int_equal(got.runs, a0.runs);
    assert_int_equal(got.decisions, a0.decisions);
    owned none = {0, 0, 0, 0, 0, 0, 0, 0};
    owned_equal(owned_by(f->db, "a"), none, "a after rm", &f->rng);
    owned_equal(owned_by(f->db, "b"), b0, "b after rm a", &f->rng);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM experiments WHERE name = 'a'"), 0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM decisions WHERE experiment "
                                        "IS NULL"), 1);
    /* Layer benchmarks are measurements of a GPU, not of the experiment: they stay. */
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM layer_bench_sets"), benches);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM layer_bench_sets WHERE run "
                                        "IS NULL"), a0.benches);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM config_keys"), keys);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    long cnt[RUN_STATE_COUNT];
    CHECK(runs_db_state_counts(f->db, "b", cnt, &err), f);
    assert_memory_equal(cnt, cb, sizeof cnt);

    /* The name is free again: a new experiment starts at run 1. */
    assert_int_equal(runs_db_experiment_remove(f->db, "a", NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "no experiment named 'a'"));
    CHECK(runs_db_experiment_upsert(f->db, "a", NULL, NULL, NULL, &err), f);
    char hash[65], *id = NULL;
    dbt_random_hash(&f->rng, hash);
    run_new rn = {"a", "{\"x\":1}", hash, NULL};
    CHECK(runs_db_insert(f->db, &rn, &id, NULL, &err), f);
    assert_string_equal(id, "a-1");
    free(id);
}

static void test_remove_refused_while_live(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    long c[RUN_STATE_COUNT];
    populate(f, "live", 0, c);
    /* One live run at least. */
    char hash[65], *id = NULL;
    dbt_random_hash(&f->rng, hash);
    run_new rn = {"live", "{\"x\":2}", hash, NULL};
    CHECK(runs_db_insert(f->db, &rn, &id, NULL, &err), f);
    CHECK(runs_db_transition(f->db, id, RUN_SUBMITTED, NULL, &err), f);
    int running = tu_randint(&f->rng, 0, 2);
    if (running)
        CHECK(runs_db_transition(f->db, id, RUN_RUNNING, NULL, &err), f);
    owned before = owned_by(f->db, "live");
    assert_int_equal(runs_db_experiment_remove(f->db, "live", NULL, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "submitted or running"));
    owned_equal(owned_by(f->db, "live"), before, "refused rm", &f->rng);
    assert_int_equal(db_tx_depth(f->db), 0);
    /* Once the run is over, it goes. */
    CHECK(runs_db_transition(f->db, id, RUN_CANCELLED, NULL, &err), f);
    CHECK(runs_db_experiment_remove(f->db, "live", NULL, &err), f);
    assert_int_equal(owned_by(f->db, "live").runs, 0);
    free(id);
}

/* A step that fails after others succeeded rolls every one of them back. */
static void test_remove_is_atomic(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    long c[RUN_STATE_COUNT];
    populate(f, "keep", 0, c);
    CHECK(db_exec(f->db, "INSERT INTO decisions (kind, experiment, subject, decision, method, "
                         "evidence) VALUES ('fp8', 'keep', '{}', 'off', 'none', '{}')", &err), f);
    owned before = owned_by(f->db, "keep");
    /* The decisions go first; the experiment's own deletion then fails. */
    CHECK(db_exec(f->db, "CREATE TEMP TRIGGER no_rm BEFORE DELETE ON experiments BEGIN "
                         "SELECT RAISE(ABORT, 'refused by the test'); END", &err), f);
    assert_true(runs_db_experiment_remove(f->db, "keep", NULL, &err) < 0);
    assert_non_null(strstr(err.msg, "refused by the test"));
    owned_equal(owned_by(f->db, "keep"), before, "failed rm", &f->rng);
    /* Inside a caller's transaction that fails later, nothing is removed either. */
    CHECK(db_exec(f->db, "DROP TRIGGER no_rm", &err), f);
    CHECK(db_tx_begin(f->db, &err), f);
    CHECK(runs_db_experiment_remove(f->db, "keep", NULL, &err), f);
    assert_int_equal(db_tx_end(f->db, HERR_IO, &err), HERR_IO);
    owned_equal(owned_by(f->db, "keep"), before, "rolled-back rm", &f->rng);
}

/* ---- archive, tags, listing --------------------------------------------------------------- */

static int listed(const experiment_info *v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].name, name) == 0)
            return (int)i;
    return -1;
}

static void test_archive(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    long c[RUN_STATE_COUNT];
    populate(f, "old", 0, c);
    populate(f, "new", 0, c);
    int changed = -1;
    CHECK(runs_db_experiment_archive(f->db, "old", 1, &changed, &err), f);
    assert_int_equal(changed, 1);
    CHECK(runs_db_experiment_archive(f->db, "old", 1, &changed, &err), f);
    assert_int_equal(changed, 0);
    assert_int_equal(runs_db_experiment_archive(f->db, "nope", 1, &changed, &err), HERR_CONFIG);
    assert_int_equal(changed, 0);

    experiment_info *v;
    size_t n;
    CHECK(runs_db_experiment_list(f->db, NULL, &v, &n, &err), f);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].name, "new");
    assert_null(v[0].archived_at);
    runs_db_experiment_list_free(v, n);
    experiment_filter all = {1, NULL};
    CHECK(runs_db_experiment_list(f->db, &all, &v, &n, &err), f);
    assert_int_equal(n, 2);
    assert_string_equal(v[0].name, "old");   /* creation order */
    assert_non_null(v[0].archived_at);
    runs_db_experiment_list_free(v, n);
    /* Archiving keeps every run: plan dedup still sees them. */
    long long runs = dbt_sql_int(f->db, "SELECT count(*) FROM runs r JOIN experiments e ON "
                                        "e.id = r.experiment_id WHERE e.name = 'old'");
    assert_true(runs > 0);

    CHECK(runs_db_experiment_archive(f->db, "old", 0, &changed, &err), f);
    assert_int_equal(changed, 1);
    CHECK(runs_db_experiment_archive(f->db, "old", 0, &changed, &err), f);
    assert_int_equal(changed, 0);
    CHECK(runs_db_experiment_list(f->db, NULL, &v, &n, &err), f);
    assert_int_equal(n, 2);
    runs_db_experiment_list_free(v, n);
}

/* The rows `hearth query` prints for these options. */
static long query_rows(fixture *f, const char *experiment, int archived)
{
    hearth_err err = {{0}};
    char *out = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&out, &len);
    assert_non_null(m);
    query_opts o = {.experiment = experiment, .columns = "run_id", .format = REPORT_CSV,
                    .archived = archived};
    long rows = -1;
    CHECK(query_runs(f->db, &o, m, &rows, &err), f);
    fclose(m);
    free(out);
    return rows;
}

static void test_query_hides_archived(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    long ca[RUN_STATE_COUNT], cb[RUN_STATE_COUNT], na = 0, nb = 0;
    populate(f, "shown", 1, ca);
    populate(f, "hidden", 1, cb);
    for (int s = 0; s < RUN_STATE_COUNT; s++) {
        na += ca[s];
        nb += cb[s];
    }
    assert_int_equal(query_rows(f, NULL, 0), na + nb);
    CHECK(runs_db_experiment_archive(f->db, "hidden", 1, NULL, &err), f);
    assert_int_equal(query_rows(f, NULL, 0), na);
    assert_int_equal(query_rows(f, NULL, 1), na + nb);
    /* Naming the experiment shows it, archived or not. */
    assert_int_equal(query_rows(f, "hidden", 0), nb);
    assert_int_equal(query_rows(f, "shown", 0), na);
    CHECK(runs_db_experiment_archive(f->db, "hidden", 0, NULL, &err), f);
    assert_int_equal(query_rows(f, NULL, 0), na + nb);
}

static void test_tags(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    static const char *const bad[] = {"", "-x", "a b", "a,b", "é", "x\n", "$(rm)", "a;b"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (runs_db_tag_check(bad[i], &err) != HERR_CONFIG)
            fail_msg("tag '%s' accepted", bad[i]);
    char longtag[70];
    memset(longtag, 'a', 65);
    longtag[65] = 0;
    assert_int_equal(runs_db_tag_check(longtag, &err), HERR_CONFIG);
    longtag[64] = 0;
    CHECK(runs_db_tag_check(longtag, &err), f);
    CHECK(runs_db_tag_check("v1.2_rc-3:gpu@site+x", &err), f);

    const char *names[] = {"e0", "e1", "e2", "e3"};
    int has[4][5] = {{0}};
    CHECK(runs_db_experiment_upsert(f->db, names[0], NULL, NULL, NULL, &err), f);
    CHECK(runs_db_experiment_upsert(f->db, names[1], NULL, NULL, NULL, &err), f);
    CHECK(runs_db_experiment_upsert(f->db, names[2], NULL, NULL, NULL, &err), f);
    CHECK(runs_db_experiment_upsert(f->db, names[3], NULL, NULL, NULL, &err), f);
    for (int i = 0; i < 60; i++) {
        int e = tu_randint(&f->rng, 0, 4), t = tu_randint(&f->rng, 0, 5);
        int add = tu_randint(&f->rng, 0, 3) != 0, changed = -1;
        char tag[8];
        snprintf(tag, sizeof tag, "t%d", t);
        CHECK(runs_db_experiment_tag(f->db, names[e], tag, add, &changed, &err), f);
        assert_int_equal(changed, add ? !has[e][t] : has[e][t]);
        has[e][t] = add;
    }
    int changed = -1;
    assert_int_equal(runs_db_experiment_tag(f->db, "nope", "t1", 1, &changed, &err),
                     HERR_CONFIG);
    assert_int_equal(runs_db_experiment_tag(f->db, "e0", "bad tag", 1, &changed, &err),
                     HERR_CONFIG);
    assert_int_equal(changed, 0);
    if (tu_randint(&f->rng, 0, 2))
        CHECK(runs_db_experiment_archive(f->db, "e3", 1, NULL, &err), f);
    int e3_archived = dbt_sql_int(f->db, "SELECT archived_at IS NOT NULL FROM experiments "
                                         "WHERE name = 'e3'") != 0;

    /* Every experiment's tags, sorted; every tag filter selects exactly its experiments. */
    experiment_filter all = {1, NULL};
    experiment_info *v;
    size_t n;
    CHECK(runs_db_experiment_list(f->db, &all, &v, &n, &err), f);
    assert_int_equal(n, 4);
    for (int e = 0; e < 4; e++) {
        char want[64] = "";
        for (int t = 0; t < 5; t++)
            if (has[e][t])
                snprintf(want + strlen(want), sizeof want - strlen(want), "%st%d",
                         want[0] ? "," : "", t);
        int i = listed(v, n, names[e]);
        assert_true(i >= 0);
        if (strcmp(v[i].tags ? v[i].tags : "", want) != 0)
            fail_msg("%s: tags '%s', want '%s' (seed %llu)", names[e], v[i].tags, want,
                     (unsigned long long)f->rng.seed);
    }
    runs_db_experiment_list_free(v, n);
    for (int t = 0; t < 5; t++) {
        char tag[8];
        snprintf(tag, sizeof tag, "t%d", t);
        for (int arch = 0; arch < 2; arch++) {
            experiment_filter ft = {arch, tag};
            CHECK(runs_db_experiment_list(f->db, &ft, &v, &n, &err), f);
            size_t want = 0;
            for (int e = 0; e < 4; e++) {
                int in = has[e][t] && (arch || e != 3 || !e3_archived);
                want += (size_t)in;
                if ((listed(v, n, names[e]) >= 0) != in)
                    fail_msg("--tag %s (archived %d): %s wrongly %s (seed %llu)", tag, arch,
                             names[e], in ? "missing" : "listed",
                             (unsigned long long)f->rng.seed);
            }
            assert_int_equal(n, want);
            runs_db_experiment_list_free(v, n);
        }
    }
    experiment_filter badf = {0, "no way"};
    assert_int_equal(runs_db_experiment_list(f->db, &badf, &v, &n, &err), HERR_CONFIG);
    /* Removing an experiment removes its tags. */
    CHECK(runs_db_experiment_remove(f->db, "e1", NULL, &err), f);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM experiment_tags t LEFT JOIN "
                                        "experiments e ON e.id = t.experiment WHERE e.id IS NULL"),
                     0);
}

static void test_list_counts(void **state)
{
    fixture *f = *state;
    hearth_err err = {{0}};
    int ne = tu_randint(&f->rng, 1, 6);
    long want[6][RUN_STATE_COUNT];
    char names[6][16];
    for (int e = 0; e < ne; e++) {
        snprintf(names[e], sizeof names[e], "x%d", e);
        populate(f, names[e], 1, want[e]);
    }
    CHECK(runs_db_experiment_upsert(f->db, "empty", NULL, NULL, NULL, &err), f);
    experiment_info *v;
    size_t n;
    CHECK(runs_db_experiment_list(f->db, NULL, &v, &n, &err), f);
    assert_int_equal(n, (size_t)ne + 1);
    for (int e = 0; e < ne; e++) {
        assert_string_equal(v[e].name, names[e]);
        assert_non_null(v[e].created_at);
        for (int s = 0; s < RUN_STATE_COUNT; s++)
            if (v[e].counts[s] != want[e][s])
                fail_msg("%s %s: %ld, want %ld (seed %llu)", names[e],
                         run_state_name((run_state)s), v[e].counts[s], want[e][s],
                         (unsigned long long)f->rng.seed);
    }
    assert_string_equal(v[ne].name, "empty");
    for (int s = 0; s < RUN_STATE_COUNT; s++)
        assert_int_equal(v[ne].counts[s], 0);
    runs_db_experiment_list_free(v, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_remove_takes_exactly_one, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_refused_while_live, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_is_atomic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_archive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_query_hides_archived, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_counts, setup, teardown),
    };
    return cmocka_run_group_tests_name("orch_exp_db", tests, NULL, NULL);
}
