/* test_orch_select_encoder.c - encoder layout selection and `auto` values at plan time, on
 * a real results database with synthetic completed runs:
 *   - the measured best wins; medians and spreads are those of the matching runs only
 *     (runs of another sequence length or rank count do not count);
 *   - candidates without runs get the cost model's number and say so, and outrank
 *     measured ones that are slower;
 *   - `parallel.encoder.strategy: auto` and `precision.fp8: auto` in a spec resolve at plan
 *     time to the same config hash as the explicit choice, the policy file is written, the
 *     decisions are recorded once; without a database fp8 auto is off with the reason.
 * Fresh random throughputs every run (the seed is printed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "plan.h"
#include "runs_db.h"
#include "select_auto.h"
#include "select_db.h"
#include "select_encoder.h"
#include "shape/yaml_tree.h"
#include "tests/unit/support/dbtest.h"
#include "tests/unit/support/spectest.h"
#include "tests/unit/support/testutil.h"
#include "tests/unit/support/tmpdir.h"

typedef struct {
    char dir[256], path[300];
    hearth_db *db;
    tu_rng rng;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f || tu_tmpdir_make(f->dir, sizeof f->dir, "selenc"))
        return -1;
    snprintf(f->path, sizeof f->path, "%s/h.db", f->dir);
    hearth_err err = {{0}};
    if (db_open(f->path, &f->db, &err) ||
        runs_db_experiment_upsert(f->db, "prior", NULL, NULL, NULL, &err))
        return -1;
    f->rng = tu_rng_fresh_noted();
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

/* tiny-vlm on `ranks` GPUs (FP8 needs cuda), decoder tp 2, the given encoder layout. */
static void config(run_config *c, int ranks, int seq, const char *strategy, int etp,
                   int offload)
{
    char yaml[512];
    snprintf(yaml, sizeof yaml, "model: tiny-vlm\ndevice: cuda\nranks: %d\ntrain: {seq_len: %d}\n"
             "parallel: {tp: 2, encoder: {strategy: %s, tp: %d, offload: %s}}\n", ranks, seq,
             strategy, etp, offload ? "true" : "false");
    hearth_err err = {{0}};
    if (run_config_parse(c, "t.yaml", yaml, NULL, 0, 0, &err))
        fail_msg("%s\n%s", err.msg, yaml);
}

/* A completed run of config c with tokens_per_s `tps`. */
static void add_run(hearth_db *db, const run_config *c, double tps)
{
    hearth_err err = {{0}};
    char hash[65];
    char *json = run_config_canonical_json(c, &err);
    assert_non_null(json);
    assert_int_equal(run_config_hash(c, hash, &err), 0);
    run_new rn = { "prior", json, hash, NULL };
    char *id = NULL;
    int64_t pk = 0;
    assert_int_equal(runs_db_insert(db, &rn, &id, &pk, &err), 0);
    assert_int_equal(runs_db_transition(db, id, RUN_SUBMITTED, NULL, &err), 0);
    assert_int_equal(runs_db_transition(db, id, RUN_RUNNING, NULL, &err), 0);
    assert_int_equal(runs_db_transition(db, id, RUN_COMPLETED, NULL, &err), 0);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db_sqlite(db), "INSERT INTO results (run, tokens_per_s, "
                                        "step_ms_median, steps) VALUES (?1, ?2, ?3, 2)", -1,
                                        &st, NULL), SQLITE_OK);
    sqlite3_bind_int64(st, 1, pk);
    sqlite3_bind_double(st, 2, tps);
    sqlite3_bind_double(st, 3, 1e3 * c->train.global_batch * c->train.seq_len / tps);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    free(json);
    free(id);
}

typedef struct {
    const char *strategy;
    int etp, offload;
} layout;

/* tp 2 on 4 ranks: every encoder layout the rules allow */
static const layout layouts[] = {
    { "uniform", 2, 0 }, { "hetero_tp", 1, 0 }, { "hetero_dp", 1, 0 },
    { "full_separation", 1, 0 }, { "full_separation", 1, 1 },
};
#define N_LAYOUTS 5

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const select_enc_cand *find_cand(const select_enc_result *r, const layout *l)
{
    for (size_t i = 0; i < r->n; i++) {
        const run_config *c = &r->c[i].cfg;
        if (strcmp(encoder_strategy_name(c->parallel.encoder.strategy), l->strategy) == 0 &&
            c->parallel.encoder.tp == l->etp && !c->parallel.encoder.offload == !l->offload)
            return &r->c[i];
    }
    return NULL;
}

/* Measures a random proper subset of layouts (3 runs each) at `scale` tokens/s, ranks them, and
 * checks every candidate against the runs written here. */
static void rank_and_check(fixture *f, double scale, int *top_measured)
{
    tu_rng *r = &f->rng;
    int measured[N_LAYOUTS] = { 0 };
    double med[N_LAYOUTS], lo[N_LAYOUTS], hi[N_LAYOUTS];
    int any = 0, all = 1;
    for (int i = 0; i < N_LAYOUTS; i++) {
        measured[i] = tu_randint(r, 0, 2);
        /* at least one measured and one predicted layout (both cases need a rival) */
        if (i == N_LAYOUTS - 1 && !any)
            measured[i] = 1;
        if (i == N_LAYOUTS - 1 && all)
            measured[i] = 0;
        any |= measured[i];
        all &= measured[i];
        if (!measured[i])
            continue;
        double v[3];
        run_config c;
        config(&c, 4, 64, layouts[i].strategy, layouts[i].etp, layouts[i].offload);
        for (int k = 0; k < 3; k++) {
            v[k] = scale * (1 + tu_uniform(r));
            add_run(f->db, &c, v[k]);
        }
        qsort(v, 3, sizeof v[0], dbl_cmp);
        med[i] = v[1];
        lo[i] = v[0];
        hi[i] = v[2];
        /* decoys: the same layout at another sequence length and rank count */
        run_config d;
        config(&d, 4, 128, layouts[i].strategy, layouts[i].etp, layouts[i].offload);
        add_run(f->db, &d, 1e15);
        config(&d, 2, 64, layouts[i].strategy, layouts[i].etp, layouts[i].offload);
        add_run(f->db, &d, 1e15);
    }
    hearth_err err = {{0}};
    select_run *runs = NULL;
    size_t n_runs = 0;
    assert_int_equal(select_runs_of_model(f->db, "tiny-vlm", &runs, &n_runs, &err), 0);
    run_config base;
    config(&base, 4, 64, "uniform", 2, 0);
    select_cost_rates rates;
    select_encoder_rates(&base, runs, n_runs, NULL, &rates);
    select_enc_result res;
    assert_int_equal(select_encoder_rank(&base, 1, runs, n_runs, &rates, 0, &res, &err), 0);
    assert_int_equal(res.n, N_LAYOUTS);
    size_t n_meas = 0;
    for (int i = 0; i < N_LAYOUTS; i++) {
        const select_enc_cand *k = find_cand(&res, &layouts[i]);
        if (!k)
            fail_msg("layout %s etp %d offload %d missing", layouts[i].strategy,
                     layouts[i].etp, layouts[i].offload);
        assert_true(k->predicted > 0);
        if (measured[i]) {
            n_meas++;
            assert_int_equal(k->n_measured, 3);
            assert_true(k->measured == med[i] && k->measured_min == lo[i] &&
                        k->measured_max == hi[i]);
            assert_true(k->score == med[i]);
        } else {
            assert_int_equal(k->n_measured, 0);
            assert_true(k->score == k->predicted);
        }
    }
    assert_int_equal(res.n_measured, n_meas);
    for (size_t i = 1; i < res.n; i++)
        assert_true(res.c[i - 1].score >= res.c[i].score);
    *top_measured = res.c[0].n_measured > 0;
    /* the sweep names exactly the unmeasured layouts */
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    assert_int_equal(select_encoder_write_sweep(&res, "tiny-vlm", 3, 0, m), 0);
    fclose(m);
    if (n_meas < N_LAYOUTS) {
        spec *s = spt_parse_ok(text);
        assert_int_equal(s->n_include, N_LAYOUTS - (int)n_meas);
        spec_free(s);
    }
    free(text);
    select_encoder_result_free(&res);
    free(runs);
}

static void test_measured_best(void **state)
{
    fixture *f = *state;
    int top_measured = 0;
    /* far above what the cost model predicts for tiny-vlm */
    rank_and_check(f, 1e12, &top_measured);
    assert_true(top_measured);
}

static void test_model_fills_in(void **state)
{
    fixture *f = *state;
    int top_measured = 1;
    /* far below: the predicted layouts outrank the measured ones, and say so */
    rank_and_check(f, 1e-6, &top_measured);
    assert_false(top_measured);
}

/* ---- auto at plan time ---------------------------------------------------------------- */

static const char auto_spec[] =
    "name: a\n"
    "base:\n"
    "  model: tiny-vlm\n"
    "  device: cuda\n"
    "  train: {seq_len: 64}\n"
    "  parallel: {tp: 2, encoder: {strategy: auto}}\n"
    "  precision: {fp8: auto}\n"
    "resources: {gpus_per_node: 4}\n"
    "matrix:\n"
    "  parallel.encoder.strategy: [auto, uniform]\n";

typedef struct {
    int n;
    char hash[4][65];
    uint64_t index[4];
} kept;

static int collect_kept(void *ctx, const plan_point *p)
{
    kept *k = ctx;
    if (p->status == PLAN_KEPT && k->n < 4) {
        snprintf(k->hash[k->n], 65, "%s", p->hash);
        k->index[k->n++] = p->index;
    }
    return 0;
}

static void explicit_hash(const char *strategy, int etp, const char *policy, char out[65])
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "model: tiny-vlm\ndevice: cuda\nranks: 4\ntrain: {seq_len: 64}\n"
             "parallel: {tp: 2, encoder: {strategy: %s, tp: %d}}\n"
             "precision: {fp8: %s, fp8_policy: \"%s\"}\n", strategy, etp,
             policy ? "selective" : "off", policy ? policy : "");
    run_config c;
    hearth_err err = {{0}};
    if (run_config_parse(&c, "x.yaml", yaml, NULL, 0, 0, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(run_config_hash(&c, out, &err), 0);
}

static void test_auto_at_plan_time(void **state)
{
    fixture *f = *state;
    tu_rng *r = &f->rng;
    hearth_err err = {{0}};
    /* hetero_dp measured far above anything else */
    run_config c;
    config(&c, 4, 64, "hetero_dp", 1, 0);
    for (int k = 0; k < 3; k++)
        add_run(f->db, &c, 1e12 * (1 + tu_uniform(r)));
    config(&c, 4, 64, "uniform", 2, 0);
    add_run(f->db, &c, 1e3 * (1 + tu_uniform(r)));
    /* layer benchmarks where the decoder's fc1 gains around 64 tokens */
    char bench[300];
    snprintf(bench, sizeof bench, "%s/layer_bench.json", f->dir);
    char text[1024];
    double sp = 1.2 + tu_uniform(r);
    snprintf(text, sizeof text,
             "{\"gpu\": \"NVIDIA H200\", \"model\": \"tiny-vlm\", \"rows\": ["
             "{\"component\": \"decoder\", \"kind\": \"fc1\", \"tp\": 2, \"tokens\": 16, "
             "\"bf16_ms\": 1, \"fp8_ms\": %.17g, \"repeats\": 10},"
             "{\"component\": \"decoder\", \"kind\": \"fc1\", \"tp\": 2, \"tokens\": 4096, "
             "\"bf16_ms\": 10, \"fp8_ms\": %.17g, \"repeats\": 10},"
             "{\"component\": \"decoder\", \"kind\": \"qkv\", \"tp\": 2, \"tokens\": 16, "
             "\"bf16_ms\": 1, \"fp8_ms\": 2, \"repeats\": 10}]}", 1 / sp, 10 / sp);
    assert_int_equal(tu_write_text(bench, text), 0);
    assert_int_equal(select_bench_ingest(f->db, bench, 0, NULL, NULL, &err), 0);

    spec *s = spt_parse_ok(auto_spec);
    assert_int_equal(s->base_auto, SPEC_AUTO_ENCODER | SPEC_AUTO_FP8);
    /* without the resolver the plan refuses */
    plan_opts po = { 0 };
    assert_int_equal(plan_run(s, &po, NULL, NULL, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "auto"));

    char policy_dir[400];
    snprintf(policy_dir, sizeof policy_dir, "%s/policies", f->dir);
    select_auto *sa = NULL;
    assert_int_equal(select_auto_create(&sa, f->db, s, policy_dir, 1, 1, &err), 0);
    po.resolve_auto = select_auto_resolve;
    po.auto_ctx = sa;
    kept k = { 0 };
    if (plan_run(s, &po, collect_kept, &k, NULL, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(k.n, 2);
    const select_auto_note *n0 = select_auto_note_of(sa, k.index[0]);
    const select_auto_note *n1 = select_auto_note_of(sa, k.index[1]);
    assert_non_null(n0);
    assert_non_null(n1);
    assert_non_null(strstr(n0->encoder, "hetero_dp"));
    assert_non_null(strstr(n0->encoder, "measured"));
    assert_int_equal(n1->encoder[0], '\0');   /* point 2 says uniform itself */
    const char *pol = strstr(n0->fp8, "(policy ");
    assert_non_null(pol);
    char policy[512];
    snprintf(policy, sizeof policy, "%.*s", (int)(strlen(pol + 8) - 1), pol + 8);
    assert_int_equal(access(policy, R_OK), 0);
    yaml_tree *t = NULL;
    assert_int_equal(yaml_tree_load(&t, policy, &err), 0);
    assert_int_equal(yaml_tree_get(t->root, "rules")->n_items, 1);   /* fc1, not qkv */
    yaml_tree_free(t);
    char want[65];
    explicit_hash("hetero_dp", 1, policy, want);
    assert_string_equal(k.hash[0], want);
    assert_string_equal(n0->hash, want);
    explicit_hash("uniform", 2, policy, want);
    assert_string_equal(k.hash[1], want);

    assert_int_equal(select_auto_record(sa, "a", &err), 0);
    assert_int_equal(select_auto_record(sa, "a", &err), 0);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM decisions WHERE experiment = 'a' "
                                 "AND kind = 'encoder'"), 1);
    assert_int_equal(dbt_sql_int(f->db, "SELECT count(*) FROM decisions WHERE experiment = 'a' "
                                 "AND kind = 'fp8' AND method = 'measured'"), 2);
    select_auto_free(sa);

    /* no database: the cost model picks the layout, fp8 is off with the reason */
    assert_int_equal(select_auto_create(&sa, NULL, s, policy_dir, 0, 0, &err), 0);
    po.auto_ctx = sa;
    memset(&k, 0, sizeof k);
    assert_int_equal(plan_run(s, &po, collect_kept, &k, NULL, &err), 0);
    n0 = select_auto_note_of(sa, k.index[0]);
    assert_non_null(strstr(n0->encoder, "predicted"));
    assert_non_null(strstr(n0->fp8, "precision.fp8=off: no layer benchmarks"));
    select_auto_free(sa);
    spec_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_measured_best, setup, teardown),
        cmocka_unit_test_setup_teardown(test_model_fills_in, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auto_at_plan_time, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
