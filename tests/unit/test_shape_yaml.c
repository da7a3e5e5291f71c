/* test_shape_yaml.c - the YAML reader (trainer/shape/yaml_tree.h): marks, scalars,
 * anchors, and the errors it reports.  Random inputs from a fresh seed (printed on
 * failure; HEARTH_TEST_SEED replays). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shape/yaml_tree.h"
#include "support/testutil.h"

static yaml_tree *parse_ok(const char *text, tu_rng *r)
{
    yaml_tree *t = NULL;
    hearth_err err = { { 0 } };
    if (yaml_tree_parse(&t, "t.yaml", text, strlen(text), &err))
        fail_msg("parse failed: %s (seed %llu)\n%s", err.msg, (unsigned long long)r->seed, text);
    return t;
}

static void parse_fails(const char *text, const char *want)
{
    yaml_tree *t = NULL;
    hearth_err err = { { 0 } };
    int rc = yaml_tree_parse(&t, "t.yaml", text, strlen(text), &err);
    if (rc == 0) {
        yaml_tree_free(t);
        fail_msg("expected an error containing '%s' for:\n%s", want, text);
    }
    assert_int_equal(rc, HERR_CONFIG);
    assert_null(t);
    if (!strstr(err.msg, want))
        fail_msg("message '%s' lacks '%s'", err.msg, want);
}

/* Random keys at random places: every pair and value remembers its line and column. */
static void test_marks(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    for (int iter = 0; iter < 20; iter++) {
        int n = tu_randint(&r, 1, 12);
        char text[4096] = "";
        int key_line[12], key_col[12], val_col[12], nested[12];
        long vals[12];
        int line = 1;
        for (int i = 0; i < n; i++) {
            int blank = tu_randint(&r, 0, 3);
            for (int b = 0; b < blank; b++, line++)
                strcat(text, "\n");
            nested[i] = tu_randint(&r, 0, 2);
            vals[i] = (long)tu_randint(&r, -1000000, 1000000);
            char buf[128];
            if (nested[i]) {
                /* key:\n<indent>v: value */
                int ind = tu_randint(&r, 1, 6);
                snprintf(buf, sizeof buf, "k%d:\n%*sv: %ld\n", i, ind, "", vals[i]);
                key_line[i] = line;
                key_col[i] = 1;
                val_col[i] = ind + 4;
                line += 2;
            } else {
                int sp = tu_randint(&r, 1, 5);
                snprintf(buf, sizeof buf, "k%d:%*s%ld\n", i, sp, "", vals[i]);
                key_line[i] = line;
                key_col[i] = 1;
                val_col[i] = (int)strlen("k") + (i >= 10 ? 2 : 1) + 1 + sp + 1;
                line += 1;
            }
            strcat(text, buf);
        }
        yaml_tree *t = parse_ok(text, &r);
        assert_non_null(t->root);
        assert_int_equal(t->root->kind, YAML_TREE_MAP);
        assert_int_equal(t->root->n_pairs, n);
        for (int i = 0; i < n; i++) {
            const yaml_tree_pair *p = &t->root->pairs[i];
            char want[16];
            snprintf(want, sizeof want, "k%d", i);
            assert_string_equal(p->key, want);
            if (p->line != key_line[i] || p->col != key_col[i])
                fail_msg("key %d at %d:%d, expected %d:%d (seed %llu)\n%s", i, p->line, p->col,
                         key_line[i], key_col[i], (unsigned long long)r.seed, text);
            const yaml_tree_node *v = p->value;
            if (nested[i]) {
                assert_int_equal(v->kind, YAML_TREE_MAP);
                v = yaml_tree_get(v, "v");
                assert_non_null(v);
                assert_int_equal(v->line, key_line[i] + 1);
            } else {
                assert_int_equal(v->line, key_line[i]);
            }
            if (v->col != val_col[i])
                fail_msg("value %d at column %d, expected %d (seed %llu)\n%s", i, v->col,
                         val_col[i], (unsigned long long)r.seed, text);
            int64_t got;
            assert_int_equal(yaml_tree_as_int(v, &got), 1);
            assert_int_equal(got, vals[i]);
        }
        yaml_tree_free(t);
    }
}

static yaml_tree_node scalar(const char *text, int quoted)
{
    yaml_tree_node n = { .kind = YAML_TREE_SCALAR, .text = (char *)text, .len = strlen(text),
                         .quoted = quoted };
    return n;
}

static void test_scalars(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    char buf[64];
    for (int i = 0; i < 2000; i++) {
        int64_t v = (int64_t)tu_next(&r) >> tu_randint(&r, 0, 63);
        snprintf(buf, sizeof buf, "%" PRId64, v);
        yaml_tree_node n = scalar(buf, 0);
        int64_t got = 0;
        assert_int_equal(yaml_tree_as_int(&n, &got), 1);
        assert_true(got == v);
        double d;
        assert_int_equal(yaml_tree_as_double(&n, &d), 1);   /* integers are numbers too */
        n.quoted = 1;
        assert_int_equal(yaml_tree_as_int(&n, &got), 0);     /* "5" is a string */

        double x = (tu_uniform(&r) - 0.5) * pow(10, tu_randint(&r, -30, 30));
        snprintf(buf, sizeof buf, "%.17g", x);
        n = scalar(buf, 0);
        assert_int_equal(yaml_tree_as_double(&n, &d), 1);
        assert_true(d == x);
    }
    const char *not_numbers[] = { "", "1.2.3", "0x10", ".inf", "-.inf", ".nan", "nan", "inf",
                                  "1e", "+", "-", ".", "e5", "1,5", "1 2", "ten", "1e5x" };
    for (size_t i = 0; i < sizeof not_numbers / sizeof *not_numbers; i++) {
        yaml_tree_node n = scalar(not_numbers[i], 0);
        double d;
        int64_t v;
        if (yaml_tree_as_double(&n, &d) != 0)
            fail_msg("'%s' read as a number", not_numbers[i]);
        assert_int_equal(yaml_tree_as_int(&n, &v), 0);
    }
    const char *doubles[] = { ".5", "-.5", "5.", "1e3", "1E-3", "+2.5e+2" };
    const double dv[] = { .5, -.5, 5., 1e3, 1e-3, 250 };
    for (size_t i = 0; i < sizeof doubles / sizeof *doubles; i++) {
        yaml_tree_node n = scalar(doubles[i], 0);
        double d;
        assert_int_equal(yaml_tree_as_double(&n, &d), 1);
        assert_true(d == dv[i]);
    }
    yaml_tree_node big = scalar("99999999999999999999", 0), huge = scalar("1e999", 0);
    int64_t v;
    double d;
    assert_int_equal(yaml_tree_as_int(&big, &v), -1);
    assert_int_equal(yaml_tree_as_double(&huge, &d), -1);

    const char *t[] = { "true", "True", "TRUE" }, *f[] = { "false", "False", "FALSE" };
    for (int i = 0; i < 3; i++) {
        int b = -1;
        yaml_tree_node n = scalar(t[i], 0);
        assert_int_equal(yaml_tree_as_bool(&n, &b), 1);
        assert_int_equal(b, 1);
        n = scalar(f[i], 0);
        assert_int_equal(yaml_tree_as_bool(&n, &b), 1);
        assert_int_equal(b, 0);
        n.quoted = 1;
        assert_int_equal(yaml_tree_as_bool(&n, &b), 0);
    }
    const char *not_bools[] = { "yes", "no", "on", "1", "tRUE", "" };
    for (size_t i = 0; i < sizeof not_bools / sizeof *not_bools; i++) {
        int b;
        yaml_tree_node n = scalar(not_bools[i], 0);
        assert_int_equal(yaml_tree_as_bool(&n, &b), 0);
    }
    const char *nulls[] = { "", "~", "null", "Null", "NULL" };
    for (size_t i = 0; i < 5; i++) {
        yaml_tree_node n = scalar(nulls[i], 0);
        assert_true(yaml_tree_is_null(&n));
        n.quoted = 1;
        assert_false(yaml_tree_is_null(&n));
    }
}

static void test_document(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    yaml_tree *t = parse_ok("a: 'x'\nb: \"y\"\nc: |\n  block\nd: !!str 7\ne: 7\nf:\ng: [1, [2, 3], {h: 4}]\n", &r);
    const yaml_tree_node *root = t->root;
    assert_int_equal(yaml_tree_get(root, "a")->quoted, 1);
    assert_int_equal(yaml_tree_get(root, "b")->quoted, 1);
    assert_int_equal(yaml_tree_get(root, "c")->quoted, 1);
    assert_string_equal(yaml_tree_get(root, "c")->text, "block\n");
    assert_int_equal(yaml_tree_get(root, "d")->quoted, 1);
    assert_int_equal(yaml_tree_get(root, "e")->quoted, 0);
    assert_true(yaml_tree_is_null(yaml_tree_get(root, "f")));
    const yaml_tree_node *g = yaml_tree_get(root, "g");
    assert_int_equal(g->kind, YAML_TREE_SEQ);
    assert_int_equal(g->n_items, 3);
    assert_int_equal(g->items[1]->kind, YAML_TREE_SEQ);
    assert_int_equal(g->items[2]->kind, YAML_TREE_MAP);
    assert_null(yaml_tree_get(root, "zz"));
    assert_null(yaml_tree_get(g, "a"));
    char buf[96];
    yaml_tree_describe(yaml_tree_get(root, "a"), buf, sizeof buf);
    assert_string_equal(buf, "the string \"x\"");
    yaml_tree_describe(yaml_tree_get(root, "e"), buf, sizeof buf);
    assert_string_equal(buf, "\"7\"");
    yaml_tree_describe(g, buf, sizeof buf);
    assert_string_equal(buf, "a list");
    yaml_tree_describe(root, buf, sizeof buf);
    assert_string_equal(buf, "a mapping");
    yaml_tree_describe(yaml_tree_get(root, "f"), buf, sizeof buf);
    assert_string_equal(buf, "nothing");
    yaml_tree_free(t);

    /* Anchors: an alias is a copy of the anchored node, at the alias's position. */
    t = parse_ok("base: &b {x: 1, y: [2, 3]}\nother: *b\n", &r);
    const yaml_tree_node *o = yaml_tree_get(t->root, "other");
    assert_int_equal(o->kind, YAML_TREE_MAP);
    assert_int_equal(o->line, 2);
    assert_int_equal(o->col, 8);
    assert_string_equal(yaml_tree_get(o, "x")->text, "1");
    assert_int_equal(yaml_tree_get(o, "y")->n_items, 2);
    assert_ptr_not_equal(o, yaml_tree_get(t->root, "base"));
    yaml_tree_free(t);

    /* An empty document has no root. */
    t = parse_ok("# only a comment\n", &r);
    assert_null(t->root);
    yaml_tree_free(t);
}

static void test_errors(void **state)
{
    (void)state;
    parse_fails("a: 1\nb: 2\na: 3\n", "t.yaml:3:1: a: duplicate key (first at 1:1)");
    parse_fails("? [1, 2]\n: x\n", "t.yaml:1:3: mapping keys must be plain scalars");
    parse_fails("a: 1\n---\nb: 2\n", "only one YAML document");
    parse_fails("a: *nope\n", "t.yaml:1:4: unknown anchor *nope");
    parse_fails("a: &x [1, *x]\n", "unknown anchor *x");
    parse_fails("a: [1, 2\n", "t.yaml:2:1: YAML syntax error:");
    parse_fails("a: b: c\n", "t.yaml:1:5: YAML syntax error: mapping values are not allowed");

    /* Nesting and alias bombs are bounded. */
    char deep[1024];
    memset(deep, '[', 400);
    deep[400] = 0;
    parse_fails(deep, "nesting deeper than 200 levels");
    char bomb[2048] = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
    for (int i = 1; i < 8; i++) {
        char line[256];
        snprintf(line, sizeof line, "a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n",
                 i, i, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
        strcat(bomb, line);
    }
    parse_fails(bomb, "more than 1000000 nodes");

    yaml_tree *t = NULL;
    hearth_err err = { { 0 } };
    assert_int_equal(yaml_tree_load(&t, "/nonexistent/dir/x.yaml", &err), HERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/dir/x.yaml: cannot open"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_marks),
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_document),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("shape_yaml", tests, NULL, NULL);
}
