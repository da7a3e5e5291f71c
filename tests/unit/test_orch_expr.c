/* test_orch_expr.c - the expression language: precedence (random trees printed with the
 * fewest parentheses, against a direct evaluation of the tree), types, errors with their
 * columns, keys, null, and strings that look like shell or SQL injections. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "expr.h"
#include "support/testutil.h"

static unsigned g_seed;

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

/* Keys for the lookup: a small table of typed values. */
typedef struct {
    const char *key;
    expr_value v;
} kv;

typedef struct {
    const kv *t;
    int n;
} table;

static int table_lookup(void *ctx, const char *key, expr_value *out, hearth_err *err)
{
    (void)err;
    const table *tb = ctx;
    for (int i = 0; i < tb->n; i++) {
        if (strcmp(tb->t[i].key, key) == 0) {
            *out = tb->t[i].v;
            return 0;
        }
    }
    return EXPR_UNKNOWN_KEY;
}

static double eval_num(const char *src, const table *tb)
{
    expr_node *e = NULL;
    hearth_err err = {{0}};
    int col = -1;
    int rc = expr_parse(src, "t", &e, &col, &err);
    if (rc)
        fail_msg("parse '%s': %s (seed %u)", src, err.msg, g_seed);
    expr_value v;
    rc = expr_eval(e, table_lookup, (void *)tb, "t", &v, &col, &err);
    if (rc)
        fail_msg("eval '%s': %s (seed %u)", src, err.msg, g_seed);
    expr_free(e);
    assert_int_equal(v.type, EXPR_V_NUM);
    return v.num;
}

static int eval_cond(const char *src, const table *tb)
{
    expr_node *e = NULL;
    hearth_err err = {{0}};
    int rc = expr_parse(src, "t", &e, NULL, &err);
    if (rc)
        fail_msg("parse '%s': %s (seed %u)", src, err.msg, g_seed);
    int b = -1;
    rc = expr_eval_bool(e, table_lookup, (void *)tb, "t", &b, NULL, &err);
    if (rc)
        fail_msg("eval '%s': %s (seed %u)", src, err.msg, g_seed);
    expr_free(e);
    return b;
}

/* Expects `src` to fail (at parse or at evaluation) at column `col` with `needle` in the
 * message, and checks the "t:1:COL: " prefix. */
static void expect_error(const char *src, const table *tb, int col, const char *needle)
{
    expr_node *e = NULL;
    hearth_err err = {{0}};
    int ecol = -1;
    int rc = expr_parse(src, "t", &e, &ecol, &err);
    if (rc == 0) {
        expr_value v;
        rc = expr_eval(e, table_lookup, (void *)tb, "t", &v, &ecol, &err);
        if (rc == 0) {
            int b;
            rc = expr_eval_bool(e, table_lookup, (void *)tb, "t", &b, &ecol, &err);
        }
        expr_free(e);
    } else {
        assert_null(e);
    }
    if (rc == 0)
        fail_msg("'%s' should fail with '%s'", src, needle);
    assert_int_equal(rc, HERR_CONFIG);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "t:1:%d: ", col);
    if (ecol != col || strncmp(err.msg, prefix, strlen(prefix)) != 0 ||
        !strstr(err.msg, needle))
        fail_msg("'%s': got col %d '%s', want col %d and '%s'", src, ecol, err.msg, col,
                 needle);
}

/* --- precedence: random arithmetic trees -------------------------------------------- */

typedef struct tnode {
    char op;          /* 0 leaf, or + - * % ~ (unary minus) */
    long long val;
    struct tnode *l, *r;
} tnode;

static tnode *tree_gen(unsigned *s, int depth)
{
    tnode *t = calloc(1, sizeof *t);
    if (depth == 0 || rnd(s) % 4 == 0) {
        t->val = rnd(s) % 9 + 1;   /* small enough that 16 leaves multiplied stay exact */
        return t;
    }
    static const char ops[] = "+-*%~";
    t->op = ops[rnd(s) % 5];
    if (t->op == '%') {
        /* keep the divisor a leaf so that it is never zero */
        t->l = tree_gen(s, depth - 1);
        t->r = calloc(1, sizeof *t->r);
        t->r->val = rnd(s) % 9 + 1;
        return t;
    }
    t->l = tree_gen(s, depth - 1);
    if (t->op != '~')
        t->r = tree_gen(s, depth - 1);
    return t;
}

static long long tree_eval(const tnode *t)
{
    switch (t->op) {
    case 0: return t->val;
    case '+': return tree_eval(t->l) + tree_eval(t->r);
    case '-': return tree_eval(t->l) - tree_eval(t->r);
    case '*': return tree_eval(t->l) * tree_eval(t->r);
    case '%': return tree_eval(t->l) % tree_eval(t->r);
    default: return -tree_eval(t->l);
    }
}

static int prec(char op)
{
    switch (op) {
    case '+': case '-': return 1;
    case '*': case '%': return 2;
    case '~': return 3;
    default: return 4;
    }
}

/* Appends to a bounded buffer (the printed trees are far smaller than it). */
static void app(char *buf, size_t n, const char *s)
{
    size_t used = strlen(buf), add = strlen(s);
    assert_true(used + add < n);
    memcpy(buf + used, s, add + 1);
}

/* Prints with the fewest parentheses that the documented precedence allows: a child is
 * wrapped when it binds looser, or equally on the right of a left-associative operator. */
static void tree_print(const tnode *t, char *buf, size_t n, int full)
{
    buf[0] = '\0';
    if (!t->op) {
        snprintf(buf, n, "%lld", t->val);
        return;
    }
    char *a = malloc(n), *b = malloc(n);
    tree_print(t->l, a, n, full);
    int wrap_l = full || prec(t->l->op) < prec(t->op);
    if (t->op == '~') {
        /* "--" is not a token, so keep a space: "- -3" */
        app(buf, n, wrap_l ? "-(" : "- ");
        app(buf, n, a);
        app(buf, n, wrap_l ? ")" : "");
    } else {
        tree_print(t->r, b, n, full);
        int wrap_r = full || prec(t->r->op) <= prec(t->op);
        char op[4] = {' ', t->op, ' ', 0};
        app(buf, n, wrap_l ? "(" : "");
        app(buf, n, a);
        app(buf, n, wrap_l ? ")" : "");
        app(buf, n, op);
        app(buf, n, wrap_r ? "(" : "");
        app(buf, n, b);
        app(buf, n, wrap_r ? ")" : "");
    }
    free(a);
    free(b);
}

static void tree_free(tnode *t)
{
    if (!t)
        return;
    tree_free(t->l);
    tree_free(t->r);
    free(t);
}

static void test_precedence_random(void **state)
{
    (void)state;
    unsigned s = g_seed;
    table tb = {NULL, 0};
    for (int i = 0; i < 400; i++) {
        tnode *t = tree_gen(&s, 4);
        char minimal[8192], full[8192];
        tree_print(t, minimal, sizeof minimal, 0);
        tree_print(t, full, sizeof full, 1);
        double want = (double)tree_eval(t);
        double got_min = eval_num(minimal, &tb), got_full = eval_num(full, &tb);
        if (got_min != want || got_full != want)
            fail_msg("'%s' = %g, '%s' = %g, want %g (seed %u)", minimal, got_min, full,
                     got_full, want, g_seed);
        tree_free(t);
    }
}

static void test_precedence_logic(void **state)
{
    (void)state;
    unsigned s = g_seed ^ 0x5a5a;
    for (int i = 0; i < 300; i++) {
        int a = (int)(rnd(&s) % 5), b = (int)(rnd(&s) % 5), c = (int)(rnd(&s) % 5);
        kv t[] = {{"x.a", {EXPR_V_NUM, a, NULL, 0}}, {"x.b", {EXPR_V_NUM, b, NULL, 0}},
                  {"c", {EXPR_V_NUM, c, NULL, 0}}};
        table tb = {t, 3};
        /* loosest first: or, and, not, comparisons, + -, * / %, unary - */
        assert_int_equal(eval_cond("not x.a < x.b or x.b < c and c < x.a", &tb),
                         !(a < b) || ((b < c) && (c < a)));
        assert_int_equal(eval_cond("not (x.a < x.b or x.b < c) and c <= x.a", &tb),
                         !((a < b) || (b < c)) && (c <= a));
        assert_int_equal(eval_cond("x.a + x.b * c == (x.a + x.b) * c or not not false", &tb),
                         a + b * c == (a + b) * c);
        assert_int_equal(eval_cond("x.a * 2 - c >= -x.b - 1 and x.a != c", &tb),
                         a * 2 - c >= -b - 1 && a != c);
        assert_true(eval_num("x.a / 4 + c / 2", &tb) == a / 4.0 + c / 2.0);
        if (b)
            assert_true(eval_num("(x.a + 7) % x.b", &tb) == (double)((a + 7) % b));
    }
}

static void test_literals_and_types(void **state)
{
    (void)state;
    kv t[] = {{"parallel.tp", {EXPR_V_NUM, 4, NULL, 0}},
              {"model.preset", {EXPR_V_STR, 0, "tiny-vlm", 0}},
              {"flag", {EXPR_V_BOOL, 0, NULL, 1}},
              {"mfu", {EXPR_V_NULL, 0, NULL, 0}}};
    table tb = {t, 4};
    assert_true(eval_num("1.5e2 + .5 - 1E-1", &tb) == 1.5e2 + .5 - 1E-1);
    assert_int_equal(eval_cond("model.preset == 'tiny-vlm'", &tb), 1);
    assert_int_equal(eval_cond("model.preset == \"tiny-vlm\"", &tb), 1);
    assert_int_equal(eval_cond("model.preset < 'tiny-vlm-moe'", &tb), 1);
    assert_int_equal(eval_cond("flag and parallel.tp == 4", &tb), 1);
    assert_int_equal(eval_cond("flag == true and not (flag == false)", &tb), 1);
    /* null: comparisons false, arithmetic null, conditions false */
    assert_int_equal(eval_cond("mfu > 0.5", &tb), 0);
    assert_int_equal(eval_cond("mfu <= 0.5", &tb), 0);
    assert_int_equal(eval_cond("mfu * 2 > 1 or parallel.tp == 4", &tb), 1);
    assert_int_equal(eval_cond("not mfu", &tb), 1);
    /* short circuit protects the right side */
    assert_int_equal(eval_cond("parallel.tp == 1 and 8 / (parallel.tp - 4) > 1", &tb), 0);
    assert_int_equal(eval_cond("parallel.tp == 4 or 8 / (parallel.tp - 4) > 1", &tb), 1);
    /* escapes inside strings */
    assert_int_equal(eval_cond("'a\\'b' == \"a'b\"", &tb), 1);
}

static void test_type_errors(void **state)
{
    (void)state;
    kv t[] = {{"parallel.tp", {EXPR_V_NUM, 4, NULL, 0}},
              {"model.preset", {EXPR_V_STR, 0, "tiny-vlm", 0}},
              {"flag", {EXPR_V_BOOL, 0, NULL, 1}}};
    table tb = {t, 3};
    expect_error("parallel.tp == 'x'", &tb, 13, "cannot compare a number with a string");
    expect_error("model.preset + 1", &tb, 14, "'+' needs numbers, got string and number");
    expect_error("flag < true", &tb, 6, "needs numbers or strings");
    expect_error("not parallel.tp", &tb, 1, "'not' needs a condition");
    expect_error("flag and 3", &tb, 6, "'and' needs a condition");
    expect_error("parallel.tp + 1", &tb, 13, "expected a condition");
    expect_error("1 / (parallel.tp - 4) > 0", &tb, 3, "division by zero");
    expect_error("parallel.tp % 0 == 0", &tb, 13, "modulo by zero");
    expect_error("7.5 % 2 == 0", &tb, 5, "needs integers");
    expect_error("-model.preset == 1", &tb, 1, "unary '-' needs a number");
    expect_error("parallel.pp == 1", &tb, 1, "unknown key 'parallel.pp'");
    expect_error("flag and nodes > 1", &tb, 10, "unknown key 'nodes'");
}

static void test_syntax_errors(void **state)
{
    (void)state;
    table tb = {NULL, 0};
    expect_error("(a + b", &tb, 7, "expected ')'");
    expect_error("a +* b", &tb, 4, "expected a value, got '*'");
    expect_error("a = b", &tb, 3, "use '=='");
    expect_error("a && b", &tb, 3, "use 'and'");
    expect_error("a || b", &tb, 3, "use 'or'");
    expect_error("!a", &tb, 1, "use 'not'");
    expect_error("1 < 2 < 3", &tb, 7, "cannot be chained");
    expect_error("name == 'abc", &tb, 9, "unterminated string");
    expect_error("a..b == 1", &tb, 3, "expected a name after '.'");
    expect_error("a. == 1", &tb, 3, "expected a name after '.'");
    expect_error("a == 1)", &tb, 7, "unmatched ')'");
    expect_error("a b", &tb, 3, "expected an operator or the end, got 'b'");
    expect_error("", &tb, 1, "empty expression");
    expect_error("   ", &tb, 1, "empty expression");
    expect_error("(1 \n ", &tb, 3, "expected ')'");
    expect_error("12abc > 1", &tb, 1, "malformed number");
    expect_error("x == 1;", &tb, 7, "unexpected character ';'");
    expect_error("x == `id`", &tb, 6, "unexpected character '`'");
    expect_error("x == $HOME", &tb, 6, "unexpected character '$'");
    expect_error("tp == 1 and", &tb, 12, "expected a value, got end of expression");
    expect_error("((1)", &tb, 5, "expected ')' to close '(' at column 1");
    /* the documented example format: the column counts from 1 in the expression */
    expr_node *e = NULL;
    hearth_err err = {{0}};
    int col = 0;
    assert_int_equal(expr_parse("(parallel.tp  x", "where", &e, &col, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "where:1:15: expected ')' to close '(' at column 1, got 'x'");
    assert_int_equal(col, 15);
    /* without a name, the bare message and the column */
    assert_int_equal(expr_parse("1 +", NULL, &e, &col, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "expected a value, got end of expression");
    assert_int_equal(col, 4);
}

static void test_nesting_limits(void **state)
{
    (void)state;
    size_t n = 20000;
    char *s = malloc(3 * n + 8);
    /* deep parentheses */
    for (size_t i = 0; i < n; i++)
        s[i] = '(';
    strcpy(s + n, "1");
    expr_node *e = NULL;
    hearth_err err = {{0}};
    assert_int_equal(expr_parse(s, NULL, &e, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "too deeply nested"));
    /* long left-leaning chain */
    char *p = s;
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "1+");
    strcpy(p, "1");
    assert_int_equal(expr_parse(s, NULL, &e, NULL, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "too deeply nested"));
    /* many nots */
    p = s;
    for (size_t i = 0; i < n / 4; i++)
        p += sprintf(p, "not ");
    strcpy(p, "true");
    assert_int_equal(expr_parse(s, NULL, &e, NULL, &err), HERR_CONFIG);
    /* but a moderately long flat condition is fine */
    p = s;
    for (int i = 0; i < 200; i++)
        p += sprintf(p, "%sa%d == %d", i ? " or " : "", i, i);
    assert_int_equal(expr_parse(s, NULL, &e, NULL, &err), 0);
    expr_free(e);
    free(s);
}

typedef struct {
    char keys[8][32];
    int cols[8];
    int n;
} keyrec;

static int record_key(void *ctx, const char *key, int col)
{
    keyrec *r = ctx;
    if (r->n < 8) {
        snprintf(r->keys[r->n], sizeof r->keys[0], "%s", key);
        r->cols[r->n] = col;
    }
    r->n++;
    return 0;
}

static int stop_at_second(void *ctx, const char *key, int col)
{
    (void)key;
    (void)col;
    return ++*(int *)ctx == 2 ? 7 : 0;
}

static void test_keys(void **state)
{
    (void)state;
    expr_node *e = NULL;
    hearth_err err = {{0}};
    const char *src = "parallel.tp * parallel.pp <= resources.nodes and not train.lr > 1e-3";
    assert_int_equal(expr_parse(src, NULL, &e, NULL, &err), 0);
    keyrec r = {.n = 0};
    assert_int_equal(expr_keys(e, record_key, &r), 0);
    assert_int_equal(r.n, 4);
    const char *want[] = {"parallel.tp", "parallel.pp", "resources.nodes", "train.lr"};
    for (int i = 0; i < 4; i++) {
        assert_string_equal(r.keys[i], want[i]);
        assert_int_equal(r.cols[i], (int)(strstr(src, want[i]) - src) + 1);
    }
    int count = 0;
    assert_int_equal(expr_keys(e, stop_at_second, &count), 7);
    assert_int_equal(count, 2);
    /* the AST is what callers walk */
    assert_int_equal(e->kind, EXPR_BINARY);
    assert_int_equal(e->op, EXPR_OP_AND);
    assert_string_equal(expr_op_name(e->op), "and");
    assert_int_equal(expr_op_class(e->lhs->op), 1);
    assert_int_equal(e->rhs->kind, EXPR_UNARY);
    assert_int_equal(e->rhs->op, EXPR_OP_NOT);
    expr_free(e);
}

/* Strings that look like shell or SQL stay one string literal, byte for byte. */
static void test_injection_is_data(void **state)
{
    (void)state;
    static const char *payloads[] = {
        "x; rm -rf / #",
        "$(touch /tmp/pwned)",
        "`id`",
        "a' OR '1'='1",
        "'; DROP TABLE runs; --",
        "\" or \"\"=\"",
        "\\\\ back\\slash",
        "line\nbreak",
    };
    for (size_t i = 0; i < sizeof payloads / sizeof payloads[0]; i++) {
        /* quote with single quotes, escaping ' and \ */
        char src[256], lit[200];
        char *q = lit;
        for (const char *c = payloads[i]; *c; c++) {
            if (*c == '\'' || *c == '\\')
                *q++ = '\\';
            *q++ = *c;
        }
        *q = '\0';
        snprintf(src, sizeof src, "name == '%s'", lit);
        expr_node *e = NULL;
        hearth_err err = {{0}};
        if (expr_parse(src, NULL, &e, NULL, &err))
            fail_msg("'%s': %s", src, err.msg);
        assert_int_equal(e->kind, EXPR_BINARY);
        assert_int_equal(e->rhs->kind, EXPR_STR);
        assert_string_equal(e->rhs->str, payloads[i]);
        kv t[] = {{"name", {EXPR_V_STR, 0, payloads[i], 0}}};
        table tb = {t, 1};
        int b = -1;
        assert_int_equal(expr_eval_bool(e, table_lookup, &tb, NULL, &b, NULL, &err), 0);
        assert_int_equal(b, 1);
        kv t2[] = {{"name", {EXPR_V_STR, 0, "other", 0}}};
        table tb2 = {t2, 1};
        assert_int_equal(expr_eval_bool(e, table_lookup, &tb2, NULL, &b, NULL, &err), 0);
        assert_int_equal(b, 0);
        expr_free(e);
    }
    /* unquoted, the same text cannot even parse */
    expr_node *e = NULL;
    hearth_err err = {{0}};
    assert_int_equal(expr_parse("name == x; DROP TABLE runs", NULL, &e, NULL, &err),
                     HERR_CONFIG);
    assert_null(e);
}

static void test_value_from_text(void **state)
{
    (void)state;
    unsigned s = g_seed ^ 0x777;
    for (int i = 0; i < 100; i++) {
        char buf[64];
        double x = ((double)rnd(&s) - 16384.0) / (rnd(&s) % 100 + 1);
        snprintf(buf, sizeof buf, "%.17g", x);
        expr_value v;
        expr_value_from_text(buf, 0, &v);
        assert_int_equal(v.type, EXPR_V_NUM);
        assert_true(v.num == x);
        expr_value_from_text(buf, 1, &v);
        assert_int_equal(v.type, EXPR_V_STR);
        assert_string_equal(v.str, buf);
    }
    expr_value a, b;
    expr_value_from_text("true", 0, &a);
    assert_int_equal(a.type, EXPR_V_BOOL);
    assert_int_equal(a.boolean, 1);
    static const char *strings[] = {"auto", "inf", "nan", "0x10", " 1", "1 ", "1e", "-", "",
                                    "[16, 24, 24]", "tiny-vlm"};
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++) {
        expr_value_from_text(strings[i], 0, &a);
        assert_int_equal(a.type, EXPR_V_STR);
    }
    expr_value_from_text("1e-3", 0, &a);
    expr_value_from_text("0.001", 0, &b);
    assert_true(expr_value_equal(&a, &b));
    expr_value_from_text("0.001", 1, &b);
    assert_false(expr_value_equal(&a, &b));
}

int main(void)
{
    g_seed = tu_seed_noted();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precedence_random),
        cmocka_unit_test(test_precedence_logic),
        cmocka_unit_test(test_literals_and_types),
        cmocka_unit_test(test_type_errors),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_nesting_limits),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_injection_is_data),
        cmocka_unit_test(test_value_from_text),
    };
    return cmocka_run_group_tests_name("orch_expr", tests, NULL, NULL);
}
