/* test_orch_select_fp8.c - the selective FP8 policy from synthetic layer benchmark rows:
 * the threshold at measured token counts, the conservative interpolation between them (the
 * lower neighbour's speedup), no extrapolation, the LM head / router / edge exclusions and
 * --allow, "no rule -> bf16", the policy file read back; and layer_bench.json ingest
 * (round trip, idempotence, malformed rows leave the database unchanged).
 * Fresh random rows every run (the seed is printed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "select_db.h"
#include "select_fp8.h"
#include "shape/yaml_tree.h"
#include "tests/unit/support/dbtest.h"
#include "tests/unit/support/testutil.h"
#include "tests/unit/support/tmpdir.h"

/* A group of rows of one (component, kind, tp) at increasing token counts, with random
 * speedups in [0.7, 1.6). */
static size_t make_group(tu_rng *r, select_bench_row *rows, const char *comp, const char *kind,
                         int tp, size_t n, double *speedup)
{
    long t = 256L << tu_randint(r, 0, 3);
    for (size_t i = 0; i < n; i++) {
        select_bench_row *b = &rows[i];
        memset(b, 0, sizeof *b);
        snprintf(b->component, sizeof b->component, "%s", comp);
        snprintf(b->kind, sizeof b->kind, "%s", kind);
        b->tp = tp;
        b->tokens = t;
        b->bf16_ms = 0.1 + 10 * tu_uniform(r);
        speedup[i] = 0.7 + 0.9 * tu_uniform(r);
        b->fp8_ms = b->bf16_ms / speedup[i];
        b->repeats = 10;
        t *= tu_randint(r, 2, 4);
    }
    return n;
}

static select_bench_set set_of(select_bench_row *rows, size_t n)
{
    select_bench_set b;
    memset(&b, 0, sizeof b);
    snprintf(b.gpu, sizeof b.gpu, "NVIDIA H200");
    snprintf(b.model, sizeof b.model, "qwen2.5-vl-3b");
    b.rows = rows;
    b.n = n;
    return b;
}

static const select_fp8_eval *find_eval(const select_fp8_policy *p, const char *comp,
                                        const char *kind)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->e[i].component, comp) == 0 && strcmp(p->e[i].kind, kind) == 0)
            return &p->e[i];
    return NULL;
}

/* The speedup the rows give at t, by the rule the policy documents, computed here from the
 * rows directly: the measured value at a measured count, the lower neighbour between. */
static double expected_speedup(const select_bench_row *rows, const double *s, size_t n, long t,
                               int *in_range)
{
    *in_range = t >= rows[0].tokens && t <= rows[n - 1].tokens;
    if (!*in_range)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].tokens == t)
            return s[i];
        if (i + 1 < n && rows[i].tokens < t && t < rows[i + 1].tokens)
            return s[i] < s[i + 1] ? s[i] : s[i + 1];
    }
    return 0;
}

static void test_threshold_and_interpolation(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    for (int trial = 0; trial < 300; trial++) {
        select_bench_row rows[8];
        double s[8];
        size_t n = (size_t)tu_randint(&r, 2, 8);
        make_group(&r, rows, "decoder", "fc1", 1, n, s);
        select_bench_set b = set_of(rows, n);
        select_fp8_opts o = { .threshold = 0.9 + 0.4 * tu_uniform(&r), .max_err = SELECT_FP8_MAX_ERR };
        /* at a measured count, between two, or outside the range */
        int where = tu_randint(&r, 0, 3);
        size_t i = (size_t)tu_randint(&r, 0, (int)n - 1);
        if (where == 0)
            o.tokens = rows[i].tokens;
        else if (where == 1)
            o.tokens = rows[i].tokens + 1 + tu_randint(&r, 0, (int)(rows[i + 1].tokens -
                                                                    rows[i].tokens - 1));
        else
            o.tokens = tu_randint(&r, 0, 2) ? rows[n - 1].tokens + 1 + tu_randint(&r, 0, 1000)
                                            : rows[0].tokens - 1 - tu_randint(&r, 0, 100);
        if (o.tokens < 1)
            o.tokens = rows[n - 1].tokens * 2;
        int in_range;
        double want = expected_speedup(rows, s, n, o.tokens, &in_range);
        select_fp8_policy p;
        hearth_err err = {{0}};
        assert_int_equal(select_fp8_derive(&b, &o, &p, &err), 0);
        assert_int_equal(p.n, 1);
        const select_fp8_eval *e = &p.e[0];
        if (!in_range) {
            if (e->why != FP8_WHY_OUT_OF_RANGE || p.n_rules != 0)
                fail_msg("tokens %ld outside %ld..%ld gave a verdict (seed %llu)", o.tokens,
                         rows[0].tokens, rows[n - 1].tokens, (unsigned long long)r.seed);
        } else {
            if (!(fabs(e->speedup - want) <= 1e-12 * want))
                fail_msg("speedup %.17g, want %.17g at %ld tokens (seed %llu)", e->speedup,
                         want, o.tokens, (unsigned long long)r.seed);
            int fp8 = want >= o.threshold;
            assert_int_equal(e->why == FP8_WHY_FASTER, fp8);
            assert_int_equal(p.n_rules, (size_t)fp8);
            if (fp8) {
                /* the range holds the target, every measured count in it keeps the
                 * threshold, and it cannot grow by one more measured count */
                assert_true(e->min_tokens <= o.tokens && o.tokens <= e->max_tokens);
                for (size_t k = 0; k < n; k++) {
                    int inside = rows[k].tokens >= e->min_tokens && rows[k].tokens <= e->max_tokens;
                    if (inside)
                        assert_true(s[k] >= o.threshold);
                    if (k + 1 < n && rows[k + 1].tokens == e->min_tokens)
                        assert_true(s[k] < o.threshold);
                    if (k > 0 && rows[k - 1].tokens == e->max_tokens)
                        assert_true(s[k] < o.threshold);
                }
            }
        }
        select_fp8_policy_free(&p);
    }
}

/* One neighbour above the threshold and one below: between them the verdict is bf16. */
static void test_conservative_between(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    select_bench_row rows[2];
    double s[2];
    make_group(&r, rows, "encoder", "qkv", 2, 2, s);
    double thr = 1.05 + 0.2 * tu_uniform(&r);
    int hi_first = tu_randint(&r, 0, 2);
    s[hi_first ? 0 : 1] = thr + 0.01 + tu_uniform(&r);
    s[hi_first ? 1 : 0] = thr - 0.01 - 0.2 * tu_uniform(&r);
    for (int i = 0; i < 2; i++)
        rows[i].fp8_ms = rows[i].bf16_ms / s[i];
    select_bench_set b = set_of(rows, 2);
    select_fp8_opts o = { .threshold = thr, .max_err = SELECT_FP8_MAX_ERR, .tokens = (rows[0].tokens + rows[1].tokens) / 2 };
    select_fp8_policy p;
    hearth_err err = {{0}};
    assert_int_equal(select_fp8_derive(&b, &o, &p, &err), 0);
    assert_int_equal(p.e[0].why, FP8_WHY_SLOWER);
    assert_int_equal(p.n_rules, 0);
    select_fp8_policy_free(&p);
    /* at the faster measured count itself it is fp8 */
    o.tokens = rows[hi_first ? 0 : 1].tokens;
    assert_int_equal(select_fp8_derive(&b, &o, &p, &err), 0);
    assert_int_equal(p.e[0].why, FP8_WHY_FASTER);
    select_fp8_policy_free(&p);
}

static void test_exclusions_and_allow(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    select_bench_row rows[6];
    double s[6];
    make_group(&r, rows, "decoder", "lm_head", 1, 2, s);
    make_group(&r, rows + 2, "experts", "router", 1, 2, s + 2);
    make_group(&r, rows + 4, "decoder", "fc2", 1, 2, s + 4);
    for (int i = 0; i < 6; i++) {
        rows[i].tokens = i % 2 ? 8192 : 1024;
        s[i] = 2.0 + tu_uniform(&r);   /* all clearly faster */
        rows[i].fp8_ms = rows[i].bf16_ms / s[i];
    }
    select_bench_set b = set_of(rows, 6);
    hearth_err err = {{0}};
    for (int mask = 0; mask < 8; mask++) {
        select_fp8_opts o = { .threshold = 1.05, .max_err = SELECT_FP8_MAX_ERR, .tokens = tu_randint(&r, 1024, 8193) };
        o.allow_lm_head = mask & 1;
        o.allow_router = (mask >> 1) & 1;
        o.allow_edges = (mask >> 2) & 1;
        select_fp8_policy p;
        assert_int_equal(select_fp8_derive(&b, &o, &p, &err), 0);
        assert_int_equal(find_eval(&p, "decoder", "lm_head")->why == FP8_WHY_FASTER,
                         o.allow_lm_head);
        assert_int_equal(find_eval(&p, "experts", "router")->why == FP8_WHY_FASTER,
                         o.allow_router);
        assert_int_equal(find_eval(&p, "decoder", "fc2")->why, FP8_WHY_FASTER);
        int keeps_edges = 0, keeps_head = 0;
        for (int k = 0; k < p.n_keep; k++) {
            keeps_edges += strncmp(p.keep_bf16[k], "decoder.", 8) == 0;
            keeps_head += strcmp(p.keep_bf16[k], "lm_head") == 0;
        }
        assert_int_equal(keeps_edges, o.allow_edges ? 0 : 2);
        assert_int_equal(keeps_head, !o.allow_lm_head);
        select_fp8_policy_free(&p);
    }
    select_fp8_opts o = { 0 };
    assert_int_equal(select_fp8_parse_allow("lm_head,edges", &o, &err), 0);
    assert_true(o.allow_lm_head && o.allow_edges && !o.allow_router);
    assert_int_equal(select_fp8_parse_allow("lm_head,head", &o, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "'head'"));
}

/* Everything slower than the threshold: no rule, every linear bf16, `rules: []`; the
 * policy file reads back as YAML with the documented keys. */
static void test_no_rule_and_file(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    select_bench_row rows[12];
    double s[12];
    size_t n = make_group(&r, rows, "decoder", "qkv", 1, 4, s);
    n += make_group(&r, rows + n, "projector", "fc1", 1, 4, s + n);
    for (int pass = 0; pass < 2; pass++) {
        double thr = pass ? 0.5 : 2.0;   /* above every speedup, then below every one */
        select_bench_set b = set_of(rows, n);
        select_fp8_opts o = { .threshold = thr, .max_err = SELECT_FP8_MAX_ERR, .tokens = rows[1].tokens };
        select_fp8_policy p;
        hearth_err err = {{0}};
        assert_int_equal(select_fp8_derive(&b, &o, &p, &err), 0);
        char *yaml = select_fp8_yaml(&b, &o, &p);
        assert_non_null(yaml);
        yaml_tree *t = NULL;
        assert_int_equal(yaml_tree_parse(&t, "policy.yaml", yaml, strlen(yaml), &err), 0);
        int64_t v = 0;
        assert_int_equal(yaml_tree_as_int(yaml_tree_get(t->root, "version"), &v), 1);
        assert_int_equal(v, 1);
        assert_string_equal(yaml_tree_get(t->root, "gpu")->text, "NVIDIA H200");
        assert_string_equal(yaml_tree_get(t->root, "model")->text, "qwen2.5-vl-3b");
        double th = 0;
        assert_int_equal(yaml_tree_as_double(yaml_tree_get(t->root, "threshold"), &th), 1);
        assert_true(th == thr);
        const yaml_tree_node *rules = yaml_tree_get(t->root, "rules");
        assert_non_null(rules);
        assert_int_equal(rules->kind, YAML_TREE_SEQ);
        assert_int_equal((size_t)rules->n_items, p.n_rules);
        if (!pass) {
            assert_int_equal(p.n_rules, 0);
        } else {
            /* tokens sit at group 1's second count, outside the projector's range unless
             * the ranges overlap: at least the decoder rule is there */
            assert_true(p.n_rules >= 1);
            const yaml_tree_node *r0 = rules->items[0];
            for (const char *k = "component\0kind\0tp\0min_tokens\0measured_speedup\0"; *k;
                 k += strlen(k) + 1)
                if (!yaml_tree_get(r0, k))
                    fail_msg("rule without %s:\n%s", k, yaml);
        }
        assert_int_equal(yaml_tree_get(t->root, "keep_bf16")->n_items, 4);
        yaml_tree_free(t);
        free(yaml);
        select_fp8_policy_free(&p);
    }
}

/* ---- ingest ---------------------------------------------------------------------------- */

static void write_bench(const char *path, const select_bench_row *rows, size_t n,
                        const char *bad_kind)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"gpu\": \"NVIDIA H200\", \"cuda\": \"12.6\", \"cublaslt\": 120603, "
               "\"model\": \"tiny-vlm\", \"rows\": [\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s{\"component\": \"%s\", \"kind\": \"%s\", \"tp\": %d, \"tokens\": %ld, "
                   "\"bf16_ms\": %.17g, \"fp8_ms\": %.17g, \"repeats\": %d}\n", i ? "," : "",
                rows[i].component, bad_kind && i == n - 1 ? bad_kind : rows[i].kind,
                rows[i].tp, rows[i].tokens, rows[i].bf16_ms, rows[i].fp8_ms, rows[i].repeats);
    fprintf(f, "]}\n");
    fclose(f);
}

static void test_ingest(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    char dir[256], db_path[300], file[300], bad[300];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "selfp8"), 0);
    snprintf(db_path, sizeof db_path, "%s/h.db", dir);
    snprintf(file, sizeof file, "%s/layer_bench.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    static const char *const comps[] = { "encoder", "projector", "decoder", "experts" };
    static const char *const kinds[] = { "qkv", "proj", "fc1", "fc2", "expert_fc1",
                                         "expert_fc2", "lm_head", "router" };
    select_bench_row rows[32];
    double s[8];
    size_t n = 0;
    for (int g = 0; g < 4; g++)
        n += make_group(&r, rows + n, comps[g], kinds[tu_randint(&r, 0, 8)], 1 << g, 8, s);
    write_bench(file, rows, n, NULL);
    hearth_db *db = NULL;
    hearth_err err = {{0}};
    assert_int_equal(db_open(db_path, &db, &err), 0);
    int added = -1;
    if (select_bench_ingest(db, file, 0, &added, NULL, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(added, 1);
    assert_int_equal(select_bench_ingest(db, file, 0, &added, NULL, &err), 0);
    assert_int_equal(added, 0);
    assert_int_equal(dbt_sql_int(db, "SELECT count(*) FROM layer_bench"), (long long)n);
    select_bench_set b;
    assert_int_equal(select_bench_load(db, "tiny-vlm", "NVIDIA H200", &b, &err), 1);
    assert_int_equal(b.n, n);
    assert_string_equal(b.cublaslt, "120603");
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(b.rows[i].component, rows[i].component);
        assert_string_equal(b.rows[i].kind, rows[i].kind);
        assert_int_equal(b.rows[i].tp, rows[i].tp);
        assert_int_equal(b.rows[i].tokens, rows[i].tokens);
        assert_true(b.rows[i].bf16_ms == rows[i].bf16_ms && b.rows[i].fp8_ms == rows[i].fp8_ms);
    }
    select_bench_set_free(&b);
    assert_int_equal(select_bench_load(db, "tiny-vlm", "NVIDIA A100", &b, &err), 0);
    assert_int_equal(select_bench_load(db, "qwen2.5-vl-7b", NULL, &b, &err), 0);
    /* a malformed row: named, nothing recorded */
    write_bench(bad, rows, n, "gemm");
    assert_int_equal(select_bench_ingest(db, bad, 0, &added, NULL, &err), HERR_CONFIG);
    char want[64];
    snprintf(want, sizeof want, "rows[%zu].kind", n - 1);
    assert_non_null(strstr(err.msg, want));
    /* the same row twice in a file */
    rows[n - 1] = rows[n - 2];
    write_bench(bad, rows, n, NULL);
    assert_int_equal(select_bench_ingest(db, bad, 0, &added, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "measured twice"));
    assert_int_equal(dbt_sql_int(db, "SELECT count(*) FROM layer_bench"), (long long)n);
    assert_int_equal(dbt_sql_int(db, "SELECT count(*) FROM layer_bench_sets"), 1);
    db_close(db);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threshold_and_interpolation),
        cmocka_unit_test(test_conservative_between),
        cmocka_unit_test(test_exclusions_and_allow),
        cmocka_unit_test(test_no_rule_and_file),
        cmocka_unit_test(test_ingest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
