/* test_orch_check.c - `hearth check`: repeat statistics, tolerance parsing, the direction
 * of every figure, and over a real results database the grouping of runs into points,
 * matching by config hash, the history baseline (best earlier experiment, never the
 * experiment itself or later runs), --against, reference files written and read back,
 * and the verdicts as the JSON output carries them.
 * Random values are checked against the test's own computations (seed printed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <jansson.h>

#include "check.h"
#include "check_db.h"
#include "check_ref.h"
#include "check_run.h"
#include "db.h"
#include "ingest.h"
#include "runs_db.h"
#include "tests/unit/support/dbtest.h"
#include "tests/unit/support/testutil.h"
#include "tests/unit/support/tmpdir.h"

/* ---- pure logic ------------------------------------------------------------------------ */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_stats(void **state)
{
    (void)state;
    double v[] = { 3, NAN, 1, 2, INFINITY };
    stats_summary s;
    stats_summarize(v, 5, &s);
    assert_int_equal(s.n, 3);
    assert_true(s.median == 2 && s.min == 1 && s.max == 3);
    double e[] = { 4, 1, 3, 2 };
    stats_summarize(e, 4, &s);
    assert_true(s.n == 4 && s.median == 2.5 && s.min == 1 && s.max == 4);
    stats_summarize(e, 0, &s);
    assert_true(s.n == 0 && isnan(s.median) && isnan(s.min) && isnan(s.max));
    /* Random sets against a plain sort: the median is the middle, or the mean of the two. */
    tu_rng r = tu_rng_fresh_noted();
    for (int it = 0; it < 200; it++) {
        size_t n = (size_t)tu_randint(&r, 1, 12), k = 0;
        double x[12], ref[12];
        for (size_t i = 0; i < n; i++) {
            x[i] = tu_randint(&r, 0, 5) == 0 ? NAN : tu_normal(&r) * 100;
            if (isfinite(x[i]))
                ref[k++] = x[i];
        }
        stats_summarize(x, n, &s);
        assert_int_equal(s.n, k);
        if (!k)
            continue;
        qsort(ref, k, sizeof *ref, cmp_d);
        double med = k % 2 ? ref[k / 2] : (ref[k / 2 - 1] + ref[k / 2]) / 2;
        assert_true(s.median == med && s.min == ref[0] && s.max == ref[k - 1]);
    }
}

static void test_tolerances_parse(void **state)
{
    (void)state;
    hearth_err err = { { 0 } };
    check_tols t;
    check_tols_unset(&t);
    assert_int_equal(check_tols_parse("tokens_per_s=3,final_loss=off,mfu=2.5%", &t, &err), 0);
    assert_true(t.pct[CHECK_TOKENS_PER_S] == 3 && t.pct[CHECK_FINAL_LOSS] == CHECK_TOL_OFF &&
                t.pct[CHECK_MFU] == 2.5 && t.pct[CHECK_STEP_MS] == CHECK_TOL_UNSET);
    check_tols d;
    check_tols_defaults(&d);
    assert_true(d.pct[CHECK_TOKENS_PER_S] == 5 && d.pct[CHECK_STEP_MS] == 5 &&
                d.pct[CHECK_MFU] == 5 && d.pct[CHECK_PEAK_MEM] == 5 &&
                d.pct[CHECK_FINAL_LOSS] == 2);
    check_tols_merge(&d, &t);
    assert_true(d.pct[CHECK_TOKENS_PER_S] == 3 && d.pct[CHECK_STEP_MS] == 5 &&
                d.pct[CHECK_FINAL_LOSS] == CHECK_TOL_OFF);
    assert_int_equal(check_tols_parse("tps=3", &t, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "unknown figure 'tps'"));
    assert_non_null(strstr(err.msg, "peak_mem_bytes"));
    assert_int_equal(check_tols_parse("mfu", &t, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "expected FIGURE=PCT"));
    assert_int_equal(check_tols_parse("mfu=-1", &t, &err), HERR_CONFIG);
    assert_int_equal(check_tols_parse("mfu=5x", &t, &err), HERR_CONFIG);
    assert_int_equal(check_tols_parse("mfu=", &t, &err), HERR_CONFIG);
    assert_int_equal(check_tols_parse("mfu=nan", &t, &err), HERR_CONFIG);
    int want[CHECK_N_FIGURES];
    assert_int_equal(check_figures_parse(NULL, want, &err), 0);
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        assert_int_equal(want[f], 1);
    assert_int_equal(check_figures_parse("mfu,final_loss", want, &err), 0);
    assert_true(!want[CHECK_TOKENS_PER_S] && want[CHECK_MFU] && want[CHECK_FINAL_LOSS]);
    assert_int_equal(check_figures_parse("mfu,loss", want, &err), HERR_CONFIG);
}

static void test_judge_direction(void **state)
{
    (void)state;
    double ch;
    /* Throughput: less is worse. */
    assert_int_equal(check_judge(CHECK_TOKENS_PER_S, 94, 100, 5, &ch), CHECK_REGRESSED);
    assert_true(fabs(ch + 6) < 1e-12);
    assert_int_equal(check_judge(CHECK_TOKENS_PER_S, 95, 100, 5, &ch), CHECK_OK);
    assert_int_equal(check_judge(CHECK_TOKENS_PER_S, 106, 100, 5, &ch), CHECK_IMPROVED);
    /* Step time, memory, loss: more is worse. */
    assert_int_equal(check_judge(CHECK_STEP_MS, 106, 100, 5, &ch), CHECK_REGRESSED);
    assert_int_equal(check_judge(CHECK_STEP_MS, 94, 100, 5, &ch), CHECK_IMPROVED);
    assert_int_equal(check_judge(CHECK_PEAK_MEM, 105, 100, 5, &ch), CHECK_OK);
    assert_int_equal(check_judge(CHECK_FINAL_LOSS, 5.15, 5, 2, &ch), CHECK_REGRESSED);
    assert_int_equal(check_judge(CHECK_MFU, 0.38, 0.4, 4, &ch), CHECK_REGRESSED);
    /* Missing values, zero baselines, off. */
    assert_int_equal(check_judge(CHECK_MFU, NAN, 0.4, 5, &ch), CHECK_NO_VALUE);
    assert_true(isnan(ch));
    assert_int_equal(check_judge(CHECK_MFU, 0.4, NAN, 5, &ch), CHECK_NO_BASELINE);
    assert_int_equal(check_judge(CHECK_FINAL_LOSS, 0, 0, 2, &ch), CHECK_OK);
    assert_true(ch == 0);
    assert_int_equal(check_judge(CHECK_FINAL_LOSS, 0.1, 0, 2, &ch), CHECK_REGRESSED);
    assert_true(isinf(ch) && ch > 0);
    assert_int_equal(check_judge(CHECK_TOKENS_PER_S, 1, 100, CHECK_TOL_OFF, &ch), CHECK_UNGATED);
    /* Random: the verdict follows from the change, the tolerance and the direction. */
    tu_rng r = tu_rng_fresh_noted();
    for (int it = 0; it < 2000; it++) {
        check_figure f = (check_figure)tu_randint(&r, 0, CHECK_N_FIGURES);
        double base = (tu_uniform(&r) + 0.01) * 1000 * (tu_randint(&r, 0, 4) ? 1 : -1);
        double cur = base * (1 + (tu_uniform(&r) - 0.5) * 0.4);
        double tol = tu_randint(&r, 0, 11);
        check_verdict v = check_judge(f, cur, base, tol, &ch);
        double better = (cur - base) / fabs(base) * 100;
        if (!check_figure_get(f)->higher_better)
            better = -better;
        check_verdict want = better < -tol - 1e-6 ? CHECK_REGRESSED
                           : better > tol + 1e-6 ? CHECK_IMPROVED : CHECK_OK;
        if (fabs(fabs(better) - tol) > 1e-6)   /* away from the boundary */
            assert_int_equal(v, want);
    }
}

/* ---- over a real database -------------------------------------------------------------- */

typedef struct {
    char dir[256];
    char path[300];
    hearth_db *db;
    char hash[4][65];   /* points: hash[0..2] shared by experiments, hash[3] only in "cur" */
} fixture;

/* Adds a run of experiment exp with config {"ranks": ranks} under `hash`, moved to
 * `state`; with a result of these figures when tps is finite. */
static void add_run(fixture *f, const char *exp, const char *hash, int ranks,
                    const char *state, double tps, double step_ms, double loss,
                    const char *created_at)
{
    hearth_err err = { { 0 } };
    char cfg[64], *run_id = NULL, rdir[512];
    snprintf(cfg, sizeof cfg, "{\"ranks\":%d,\"train\":{\"lr\":0.001}}", ranks);
    run_new rn = { exp, cfg, hash, NULL };
    assert_int_equal(runs_db_insert(f->db, &rn, &run_id, NULL, &err), 0);
    snprintf(rdir, sizeof rdir, "%s/%s", f->dir, run_id);
    mkdir(rdir, 0755);
    assert_int_equal(runs_db_set_run_dir(f->db, run_id, rdir, &err), 0);
    const char *path[] = { "submitted", "running", state, NULL };
    for (int k = 0; path[k] && strcmp(state, "pending") != 0; k++) {
        run_state s;
        assert_int_equal(run_state_parse(path[k], &s, &err), 0);
        assert_int_equal(runs_db_transition(f->db, run_id, s, NULL, &err), 0);
    }
    if (isfinite(tps)) {
        json_t *o = json_pack("{s:s, s:i, s:f, s:f, s:n, s:I, s:f}", "config_hash", hash,
                              "steps", 3, "tokens_per_s", tps, "step_ms_median", step_ms,
                              "mfu", "peak_mem_bytes", (json_int_t)1000000, "final_loss",
                              loss);
        char p[600];
        snprintf(p, sizeof p, "%s/result.json", rdir);
        char *t = json_dumps(o, JSON_REAL_PRECISION(17));
        assert_int_equal(tu_write_text(p, t), 0);
        free(t);
        json_decref(o);
        assert_int_equal(ingest_run(f->db, run_id, NULL, NULL, &err), 0);
    }
    if (created_at) {
        char q[300];
        snprintf(q, sizeof q, "UPDATE runs SET created_at = '%s' WHERE run_id = '%s'",
                 created_at, run_id);
        assert_int_equal(db_exec(f->db, q, &err), 0);
    }
    free(run_id);
}

/* Experiments, oldest first:
 *   old    (2020): hash0 at 900 tokens/s,                hash1 at 500
 *   best   (2021): hash0 at 1000, 1100, 1200 (median 1100)
 *   cur    (2022): hash0 at 1000, 1040, 990 (median 1000), hash1 at 400 (a regression
 *                  against old), hash2 failed only, hash3 completed (no other experiment)
 *   later  (2023): hash0 at 5000 (after cur: never cur's baseline)            */
static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (tu_tmpdir_make(f->dir, sizeof f->dir, "check"))
        return -1;
    snprintf(f->path, sizeof f->path, "%s/test.db", f->dir);
    hearth_err err = { { 0 } };
    if (db_open(f->path, &f->db, &err))
        return -1;
    tu_rng r = tu_rng_fresh();
    for (int i = 0; i < 4; i++)
        dbt_random_hash(&r, f->hash[i]);
    const char *exps[] = { "old", "best", "cur", "later" };
    for (int e = 0; e < 4; e++)
        if (runs_db_experiment_upsert(f->db, exps[e], NULL, NULL, NULL, &err))
            return -1;
    *state = f;
    const char *h0 = f->hash[0], *h1 = f->hash[1], *h2 = f->hash[2], *h3 = f->hash[3];
    add_run(f, "old", h0, 1, "completed", 900, 10, 5, "2020-01-01T00:00:00.000Z");
    add_run(f, "old", h1, 2, "completed", 500, 20, 5, "2020-01-01T00:00:01.000Z");
    add_run(f, "best", h0, 1, "completed", 1000, 9, 5, "2021-01-01T00:00:00.000Z");
    add_run(f, "best", h0, 1, "completed", 1200, 8, 5, "2021-01-01T00:00:01.000Z");
    add_run(f, "best", h0, 1, "completed", 1100, 9, 5, "2021-01-01T00:00:02.000Z");
    add_run(f, "cur", h0, 1, "completed", 1000, 9, 5, "2022-01-01T00:00:00.000Z");
    add_run(f, "cur", h1, 2, "completed", 400, 25, 5, "2022-01-01T00:00:01.000Z");
    add_run(f, "cur", h0, 1, "completed", 1040, 9, 5, "2022-01-01T00:00:02.000Z");
    add_run(f, "cur", h2, 4, "failed", NAN, 0, 0, "2022-01-01T00:00:03.000Z");
    add_run(f, "cur", h0, 1, "completed", 990, 9, 5, "2022-01-01T00:00:04.000Z");
    add_run(f, "cur", h3, 8, "completed", 300, 30, 5, "2022-01-01T00:00:05.000Z");
    add_run(f, "later", h0, 1, "completed", 5000, 1, 5, "2023-01-01T00:00:00.000Z");
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

static void test_points(void **state)
{
    fixture *f = *state;
    hearth_err err = { { 0 } };
    check_set s = { 0 };
    assert_int_equal(check_db_experiment(f->db, "cur", 1, &s, &err), 0);
    /* Every hash of cur, in the order of its first run, failed-only ones included. */
    assert_int_equal(s.n, 4);
    for (int i = 0; i < 4; i++)
        assert_string_equal(s.v[i].hash, f->hash[i]);
    assert_int_equal(s.v[0].n_runs, 3);
    assert_true(s.v[0].fig[CHECK_TOKENS_PER_S].median == 1000 &&
                s.v[0].fig[CHECK_TOKENS_PER_S].min == 990 &&
                s.v[0].fig[CHECK_TOKENS_PER_S].max == 1040);
    assert_int_equal(s.v[0].fig[CHECK_MFU].n, 0);   /* null mfu: no value */
    assert_int_equal(s.v[2].n_runs, 0);
    assert_string_equal(s.v[0].label, "ranks=1");
    assert_string_equal(s.v[3].label, "ranks=8");
    check_set_free(&s);
    assert_int_equal(check_db_experiment(f->db, "nosuch", 0, &s, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "no experiment named 'nosuch'"));
    check_set_free(&s);
}

static void test_history(void **state)
{
    fixture *f = *state;
    hearth_err err = { { 0 } };
    check_set s = { 0 };
    check_point b;
    assert_int_equal(check_db_experiment(f->db, "cur", 0, &s, &err), 0);
    /* hash0: "best" (median 1100) beats "old" (900); "later" is newer than cur's runs. */
    assert_int_equal(check_db_history(f->db, "cur", &s.v[0], &b, &err), 1);
    assert_string_equal(b.source, "best");
    assert_int_equal(b.n_runs, 3);
    assert_true(b.fig[CHECK_TOKENS_PER_S].median == 1100);
    free(b.source);
    assert_int_equal(check_db_history(f->db, "cur", &s.v[1], &b, &err), 1);
    assert_string_equal(b.source, "old");
    free(b.source);
    /* hash3 ran nowhere else. */
    assert_int_equal(check_db_history(f->db, "cur", &s.v[3], &b, &err), 0);
    check_set_free(&s);
    /* From "later", every earlier experiment counts, and the best is still "best". */
    assert_int_equal(check_db_experiment(f->db, "later", 0, &s, &err), 0);
    assert_int_equal(check_db_history(f->db, "later", &s.v[0], &b, &err), 1);
    assert_string_equal(b.source, "best");
    free(b.source);
    check_set_free(&s);
}

/* Runs check_run with JSON output and returns the parsed rows. */
static json_t *run_json(fixture *f, const char *exp, const check_opts *o0,
                        check_summary *sum)
{
    check_opts o = *o0;
    o.format = REPORT_JSON;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    hearth_err err = { { 0 } };
    int rc = check_run(f->db, exp, &o, m, sum, &err);
    fclose(m);
    if (rc)
        fprintf(stderr, "check_run: %s\n", err.msg);
    assert_int_equal(rc, 0);
    json_error_t je;
    json_t *rows = json_loads(buf, 0, &je);
    if (!rows)
        fprintf(stderr, "not JSON (%s):\n%s\n", je.text, buf);
    assert_non_null(rows);
    free(buf);
    return rows;
}

/* The verdict of (point label, figure) in rows, or NULL. */
static const char *verdict(json_t *rows, const char *point, const char *figure)
{
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *p = json_string_value(json_object_get(row, "point"));
        const char *fg = json_string_value(json_object_get(row, "figure"));
        if (p && strcmp(p, point) == 0 &&
            ((!figure && !fg) || (figure && fg && strcmp(fg, figure) == 0)))
            return json_string_value(json_object_get(row, "verdict"));
    }
    return NULL;
}

static void opts_init(check_opts *o)
{
    memset(o, 0, sizeof *o);
    check_tols_unset(&o->tols);
    for (int f = 0; f < CHECK_N_FIGURES; f++)
        o->figures[f] = 1;
}

static void test_run_history_and_against(void **state)
{
    fixture *f = *state;
    check_opts o;
    check_summary sum;
    opts_init(&o);
    json_t *rows = run_json(f, "cur", &o, &sum);
    /* 1000 against best's 1100: -9.1 %, beyond 5 %. */
    assert_string_equal(verdict(rows, "ranks=1", "tokens_per_s"), "REGRESSED");
    assert_string_equal(verdict(rows, "ranks=1", "step_ms_median"), "ok");      /* 9 vs 9 */
    assert_string_equal(verdict(rows, "ranks=1", "mfu"), "no value");
    assert_string_equal(verdict(rows, "ranks=2", "tokens_per_s"), "REGRESSED"); /* 400/500 */
    assert_string_equal(verdict(rows, "ranks=2", "step_ms_median"), "REGRESSED");
    assert_string_equal(verdict(rows, "ranks=4", NULL), "no result");
    assert_string_equal(verdict(rows, "ranks=8", "tokens_per_s"), "no baseline");
    assert_int_equal(sum.points, 4);
    assert_int_equal(sum.regressed, 3);
    assert_int_equal(sum.no_baseline, 1);
    assert_int_equal(sum.no_result, 1);
    /* The row carries the medians, the spread and the change. */
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        if (strcmp(json_string_value(json_object_get(row, "point")), "ranks=1") ||
            strcmp(json_string_value(json_object_get(row, "figure")), "tokens_per_s"))
            continue;
        assert_true(json_number_value(json_object_get(row, "median")) == 1000);
        assert_true(json_number_value(json_object_get(row, "min")) == 990);
        assert_true(json_number_value(json_object_get(row, "base_median")) == 1100);
        assert_true(fabs(json_number_value(json_object_get(row, "spread_pct")) - 5) < 1e-9);
        assert_true(fabs(json_number_value(json_object_get(row, "change_pct")) +
                         100.0 / 11) < 1e-9);
        assert_string_equal(json_string_value(json_object_get(row, "baseline")), "best");
    }
    json_decref(rows);
    /* A wider tolerance lets ranks=1 pass; off ungates a figure. */
    hearth_err err = { { 0 } };
    assert_int_equal(check_tols_parse("tokens_per_s=10,step_ms_median=off", &o.tols, &err), 0);
    rows = run_json(f, "cur", &o, &sum);
    assert_string_equal(verdict(rows, "ranks=1", "tokens_per_s"), "ok");
    assert_string_equal(verdict(rows, "ranks=2", "tokens_per_s"), "REGRESSED");
    assert_string_equal(verdict(rows, "ranks=2", "step_ms_median"), "ungated");
    assert_int_equal(sum.regressed, 1);
    json_decref(rows);
    /* --against old: hash0 at 1000 vs 900 is an improvement; nothing of hash3 in old. */
    opts_init(&o);
    o.against = "old";
    rows = run_json(f, "cur", &o, &sum);
    assert_string_equal(verdict(rows, "ranks=1", "tokens_per_s"), "improved");
    assert_string_equal(verdict(rows, "ranks=8", "tokens_per_s"), "no baseline");
    json_decref(rows);
    /* Only some figures. */
    opts_init(&o);
    assert_int_equal(check_figures_parse("final_loss", o.figures, &err), 0);
    rows = run_json(f, "cur", &o, &sum);
    assert_null(verdict(rows, "ranks=1", "tokens_per_s"));
    assert_string_equal(verdict(rows, "ranks=1", "final_loss"), "ok");
    assert_int_equal(sum.regressed, 0);
    json_decref(rows);
}

static void test_reference_files(void **state)
{
    fixture *f = *state;
    hearth_err err = { { 0 } };
    char ref[400];
    snprintf(ref, sizeof ref, "%s/ref.yaml", f->dir);
    /* Written from "best", read back: the points with runs, their medians. */
    check_set s = { 0 }, back = { 0 };
    assert_int_equal(check_db_experiment(f->db, "best", 1, &s, &err), 0);
    assert_int_equal(check_ref_write(ref, "best", &s, &err), 0);
    check_tols ft;
    assert_int_equal(check_ref_load(ref, &back, &ft, &err), 0);
    assert_int_equal(back.n, 1);
    assert_string_equal(back.v[0].hash, f->hash[0]);
    assert_int_equal(back.v[0].n_runs, 3);
    for (int g = 0; g < CHECK_N_FIGURES; g++) {
        assert_int_equal(back.v[0].fig[g].n, s.v[0].fig[g].n ? 1 : 0);
        if (s.v[0].fig[g].n)
            assert_true(back.v[0].fig[g].median == s.v[0].fig[g].median);
        assert_true(ft.pct[g] == CHECK_TOL_UNSET);
    }
    check_set_free(&s);
    check_set_free(&back);
    /* Against it: cur's hash0 regresses; cur's other points have no baseline. */
    check_opts o;
    check_summary sum;
    opts_init(&o);
    o.reference = ref;
    json_t *rows = run_json(f, "cur", &o, &sum);
    assert_string_equal(verdict(rows, "ranks=1", "tokens_per_s"), "REGRESSED");
    assert_string_equal(verdict(rows, "ranks=2", "tokens_per_s"), "no baseline");
    json_decref(rows);
    /* Tolerances in the file: top-level and per point, the point's winning; --tol over
     * both.  A point that cur lacks is "not run". */
    char text[2000];
    snprintf(text, sizeof text,
             "hearth_reference: 1\n"
             "tolerances: {tokens_per_s: 1, step_ms_median: off}\n"
             "points:\n"
             "  - config_hash: %s\n"
             "    tokens_per_s: 1050\n"
             "    tolerances: {tokens_per_s: 10}\n"
             "  - config_hash: %s\n"
             "    tokens_per_s: 300\n"
             "    step_ms_median: 1\n"
             "  - {config_hash: \"%064d\", label: gone, tokens_per_s: 1}\n",
             f->hash[0], f->hash[3], 0);
    assert_int_equal(tu_write_text(ref, text), 0);
    rows = run_json(f, "cur", &o, &sum);
    assert_string_equal(verdict(rows, "ranks=1", "tokens_per_s"), "ok");     /* -4.8 % < 10 */
    assert_string_equal(verdict(rows, "ranks=8", "step_ms_median"), "ungated");
    assert_string_equal(verdict(rows, "ranks=8", "tokens_per_s"), "ok");
    assert_string_equal(verdict(rows, "gone", NULL), "not run");
    assert_int_equal(sum.not_run, 1);
    assert_int_equal(sum.regressed, 0);
    json_decref(rows);
    assert_int_equal(check_tols_parse("tokens_per_s=2", &o.tols, &err), 0);
    rows = run_json(f, "cur", &o, &sum);
    assert_string_equal(verdict(rows, "ranks=1", "tokens_per_s"), "REGRESSED");
    json_decref(rows);
}

/* A bad reference file: the error names FILE:LINE:COL and the key. */
static void expect_ref_error(fixture *f, const char *text, const char *want)
{
    char ref[400];
    snprintf(ref, sizeof ref, "%s/bad.yaml", f->dir);
    assert_int_equal(tu_write_text(ref, text), 0);
    check_set s = { 0 };
    check_tols t;
    hearth_err err = { { 0 } };
    int rc = check_ref_load(ref, &s, &t, &err);
    check_set_free(&s);
    if (rc != HERR_CONFIG || !strstr(err.msg, want))
        fprintf(stderr, "got %d '%s', want '%s'\n", rc, err.msg, want);
    assert_int_equal(rc, HERR_CONFIG);
    assert_non_null(strstr(err.msg, want));
}

static void test_reference_errors(void **state)
{
    fixture *f = *state;
    char h[65];
    memset(h, 'a', 64);
    h[64] = 0;
    char t[600];
    expect_ref_error(f, "points: []\n", "hearth_reference: missing");
    expect_ref_error(f, "hearth_reference: 2\npoints: []\n", "bad.yaml:1:19: hearth_reference");
    expect_ref_error(f, "hearth_reference: 1\npoints:\n  - config_hash: abc\n",
                     "bad.yaml:3:18: config_hash: expected 64 lowercase hex digits");
    snprintf(t, sizeof t, "hearth_reference: 1\npoints:\n  - config_hash: %s\n    tps: 3\n", h);
    expect_ref_error(f, t, "bad.yaml:4:5: tps: unknown key of a point");
    snprintf(t, sizeof t, "hearth_reference: 1\npoints:\n  - config_hash: %s\n"
             "    tokens_per_s: fast\n", h);
    expect_ref_error(f, t, "bad.yaml:4:19: tokens_per_s: expected a number or null");
    snprintf(t, sizeof t, "hearth_reference: 1\ntolerances: {mfu: lots}\npoints:\n"
             "  - config_hash: %s\n", h);
    expect_ref_error(f, t, "bad.yaml:2:19: tolerances: mfu");
    snprintf(t, sizeof t, "hearth_reference: 1\npoints:\n  - config_hash: %s\n"
             "  - config_hash: %s\n", h, h);
    expect_ref_error(f, t, "bad.yaml:4:18: config_hash: this point is listed twice");
    expect_ref_error(f, "hearth_reference: 1\npoint: []\n", "bad.yaml:2:1: point: unknown key");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_tolerances_parse),
        cmocka_unit_test(test_judge_direction),
        cmocka_unit_test_setup_teardown(test_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_history_and_against, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reference_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reference_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
