/* test_orch_spec_set.c - `--set KEY=VALUE` overrides of an experiment spec (spec.h,
 * spec_set.h): where each kind of key lands, the last override of a key winning, errors
 * naming the --set argument, and the recorded text (spec_emit.h) reading back to the same
 * spec. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "spec.h"

static const char base_text[] =
    "# a comment the file keeps\n"
    "name: lr\n"
    "base:\n"
    "  model: tiny-vlm\n"
    "  train: {steps: 5, lr: 1e-3}\n"
    "resources:\n"
    "  time: \"10:00\"\n"
    "matrix:\n"
    "  train.seed: [1, 2]\n";

static spec *parse_set(const char *text, const char *const *sets, int n)
{
    spec *s = NULL;
    hearth_err err = {{0}};
    if (spec_parse_set(&s, "t.yaml", text, strlen(text), sets, n, &err))
        fail_msg("unexpected error: %s", err.msg);
    return s;
}

static void expect_set_error(const char *const *sets, int n, const char *want)
{
    spec *s = NULL;
    hearth_err err = {{0}};
    int rc = spec_parse_set(&s, "t.yaml", base_text, strlen(base_text), sets, n, &err);
    if (rc == 0) {
        spec_free(s);
        fail_msg("should fail with '%s'", want);
    }
    assert_int_equal(rc, HERR_CONFIG);
    size_t len = strlen(want);
    int ok = want[len - 1] == '*' ? strncmp(err.msg, want, len - 1) == 0
                                  : strcmp(err.msg, want) == 0;
    if (!ok)
        fail_msg("got  '%s'\nwant '%s'", err.msg, want);
}

/* The text of a base key, nested or dotted. */
static const char *base_value(const spec *s, const char *section, const char *key)
{
    const yaml_tree_node *n = yaml_tree_get(s->base, section);
    if (n && n->kind == YAML_TREE_MAP)
        n = yaml_tree_get(n, key);
    if (!n) {
        char dotted[128];
        snprintf(dotted, sizeof dotted, "%s.%s", section, key);
        n = yaml_tree_get(s->base, dotted);
    }
    return n && n->kind == YAML_TREE_SCALAR ? n->text : NULL;
}

static void test_where_overrides_land(void **state)
{
    (void)state;
    const char *sets[] = {
        "train.lr=3e-3",                  /* a bare run-config key: base, nested in place */
        "base.train.seed=9",              /* base.KEY, not in the file: added */
        "resources.nodes=2",              /* resources */
        "resources.time=20:00",
        "matrix.train.lr=[1e-3, 3e-3]",   /* a new matrix axis, after the file's */
        "matrix.train.seed=[7]",          /* the file's axis replaced */
        "repeat=2",                       /* a top-level key */
        "train.steps=1",
        "train.steps=3",                  /* the last of a key wins */
    };
    spec *s = parse_set(base_text, sets, (int)(sizeof sets / sizeof sets[0]));
    assert_string_equal(base_value(s, "train", "lr"), "3e-3");
    assert_string_equal(base_value(s, "train", "seed"), "9");
    assert_string_equal(base_value(s, "train", "steps"), "3");
    assert_int_equal(s->resources.nodes, 2);
    assert_string_equal(s->resources.time, "20:00");
    assert_int_equal(s->repeat, 2);
    assert_int_equal(s->n_matrix, 2);
    assert_string_equal(s->matrix[0].key, "train.seed");
    assert_int_equal(s->matrix[0].n_values, 1);
    assert_string_equal(s->matrix[0].values[0].text, "7");
    assert_string_equal(s->matrix[1].key, "train.lr");
    assert_int_equal(s->matrix[1].n_values, 2);
    assert_string_equal(s->matrix[1].values[1].text, "3e-3");
    assert_int_equal(s->matrix[1].values[1].typed.type, EXPR_V_NUM);

    /* The recorded text names the overrides and reads back to the same spec. */
    assert_non_null(strstr(s->text, "# t.yaml with --set train.lr=3e-3 --set base.train.seed=9"));
    spec *again = parse_set(s->text, NULL, 0);
    assert_string_equal(again->text, s->text);
    assert_string_equal(base_value(again, "train", "lr"), "3e-3");
    assert_string_equal(base_value(again, "train", "steps"), "3");
    assert_int_equal(again->resources.nodes, 2);
    assert_int_equal(again->repeat, 2);
    assert_int_equal(again->n_matrix, 2);
    assert_string_equal(again->matrix[1].values[0].text, "1e-3");
    assert_int_equal(again->matrix[1].values[0].typed.type, EXPR_V_NUM);
    spec_free(again);
    spec_free(s);

    /* Without overrides the file's own text is recorded, comments and all. */
    s = parse_set(base_text, NULL, 0);
    assert_string_equal(s->text, base_text);
    spec_free(s);
}

static void test_model_and_quoting(void **state)
{
    (void)state;
    /* `model: NAME` replaced as written; a quoted value stays a string when written out */
    const char *sets[] = { "model=tiny-vlm-moe", "resources.partition='1'",
                           "where=train.lr > 1e-4" };
    spec *s = parse_set(base_text, sets, 3);
    const yaml_tree_node *m = yaml_tree_get(s->base, "model");
    assert_non_null(m);
    assert_string_equal(m->text, "tiny-vlm-moe");
    assert_string_equal(s->resources.partition, "1");
    assert_string_equal(s->where_src, "train.lr > 1e-4");
    spec *again = parse_set(s->text, NULL, 0);
    assert_string_equal(again->resources.partition, "1");
    assert_string_equal(again->where_src, "train.lr > 1e-4");
    spec_free(again);
    spec_free(s);
}

static void test_errors_name_the_argument(void **state)
{
    (void)state;
    const char *a[] = { "train.lr=abc" };
    expect_set_error(a, 1, "--set train.lr: expected a number*");
    const char *b[] = { "matrix.train.lr=1e-3" };
    expect_set_error(b, 1, "--set matrix.train.lr: expected a non-empty list of values in "
                           "matrix, got \"1e-3\"");
    const char *c[] = { "trian.lr=1" };
    expect_set_error(c, 1, "--set trian.lr: unknown key (did you mean 'train.lr'?)");
    const char *d[] = { "matrx.train.lr=[1]" };
    expect_set_error(d, 1, "--set matrx.train.lr: unknown key (did you mean 'matrix.train.lr'?)");
    const char *e[] = { "resources.nodez=2" };
    expect_set_error(e, 1, "--set resources.nodez: unknown key (did you mean 'resources.nodes'?)");
    const char *f[] = { "matrix.train.lr=[1," };
    expect_set_error(f, 1, "--set matrix.train.lr: cannot read the value \"[1,\"*");
    const char *g[] = { "nope" };
    expect_set_error(g, 1, "--set nope: expected KEY=VALUE");
    const char *h[] = { "repeat=0" };
    expect_set_error(h, 1, "--set repeat: expected an integer between 1 and 1000000, got \"0\"");
    const char *i[] = { "name.x=1" };
    expect_set_error(i, 1, "--set name.x: name is a value, with no keys below it");
    const char *j[] = { "base.trian.lr=1" };
    expect_set_error(j, 1, "--set base.trian.lr: unknown key in base (did you mean 'train.lr'?)");
    /* a misspelt preset: the override's error, with the preset it meant */
    const char *k[] = { "model=tiny-vlmm" };
    expect_set_error(k, 1, "--set model: preset \"tiny-vlmm\" not found (searched: *");
    spec *s = NULL;
    hearth_err err = {{0}};
    assert_int_equal(spec_parse_set(&s, "t.yaml", base_text, strlen(base_text), k, 1, &err),
                     HERR_CONFIG);
    assert_non_null(strstr(err.msg, "; did you mean 'tiny-vlm'?"));
    /* a file error keeps its line; the override is not blamed */
    const char *l[] = { "repeat=2" };
    const char *bad = "name: x\nrepeat: 2\nretries: -1\n";
    assert_int_equal(spec_parse_set(&s, "t.yaml", bad, strlen(bad), l, 1, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "t.yaml:3:10: retries:"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_where_overrides_land),
        cmocka_unit_test(test_model_and_quoting),
        cmocka_unit_test(test_errors_name_the_argument),
    };
    return cmocka_run_group_tests_name("orch_spec_set", tests, NULL, NULL);
}
