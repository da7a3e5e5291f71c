/* test_orch_expand.c - matrix expansion: counts for product / zip / include / exclude /
 * where against counts worked out by hand, random small specs against a brute-force
 * enumeration written independently here (counts and the exact order of points), and the
 * error of a `where` that fails while points are expanded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "expand.h"
#include "support/spectest.h"
#include "support/testutil.h"

static unsigned g_seed;

/* Expands everything and returns the number of points (and the stats). */
static uint64_t count_points(const spec *s, expand_stats *st)
{
    expand_iter *it = NULL;
    hearth_err err = {{0}};
    assert_int_equal(expand_create(&it, s, NULL, NULL, &err), 0);
    expand_point pt;
    uint64_t n = 0;
    int rc;
    while ((rc = expand_next(it, &pt, &err)) == 1) {
        assert_int_equal(pt.seq, n);
        n++;
    }
    if (rc != 0)
        fail_msg("expand: %s", err.msg);
    if (st)
        expand_get_stats(it, st);
    expand_free(it);
    return n;
}

static uint64_t count_text(const char *text, expand_stats *st)
{
    spec *s = spt_parse_ok(text);
    uint64_t n = count_points(s, st);
    uint64_t cand = expand_candidates(s);
    if (st)
        assert_int_equal(st->candidates, cand);
    spec_free(s);
    return n;
}

static void test_counts_by_hand(void **state)
{
    (void)state;
    expand_stats st;
    /* no matrix: the base alone */
    assert_int_equal(count_text("name: x\n", NULL), 1);
    /* product 3 x 2 x 4 = 24 */
    assert_int_equal(count_text("name: x\nmatrix:\n  train.lr: [1e-3, 3e-4, 1e-4]\n"
                                "  train.seed: [1, 2]\n  train.steps: [1, 2, 3, 4]\n", NULL),
                     24);
    /* zip of 3 pairs times a matrix of 2 = 6; two zip groups (3 and 2) times 2 = 12 */
    assert_int_equal(count_text("name: x\nmatrix: {train.seed: [1, 2]}\n"
                                "zip:\n  - {parallel.tp: [1, 2, 4], parallel.pp: [4, 2, 1]}\n",
                                NULL), 6);
    assert_int_equal(count_text("name: x\nmatrix: {train.seed: [1, 2]}\n"
                                "zip:\n  - {parallel.tp: [1, 2, 4], parallel.pp: [4, 2, 1]}\n"
                                "  - {train.lr: [1, 2], train.min_lr: [0, 0]}\n", NULL), 12);
    /* includes add points; alone they replace the base point */
    assert_int_equal(count_text("name: x\nmatrix: {train.seed: [1, 2, 3]}\n"
                                "include: [{train.seed: 9}, {train.lr: 1, train.steps: 2}]\n",
                                NULL), 5);
    assert_int_equal(count_text("name: x\ninclude: [{train.seed: 9}, {train.seed: 8}]\n", NULL),
                     2);
    /* exclude: {seed: 1} drops 1/3 of 3x2x4 = 8; {seed: 2, steps: 3} drops 2 more */
    assert_int_equal(count_text("name: x\nmatrix:\n  train.seed: [1, 2, 3]\n"
                                "  train.lr: [1, 2]\n  train.steps: [1, 2, 3, 4]\n"
                                "exclude: [{train.seed: 1}, {train.seed: 2, train.steps: 3}]\n",
                                &st), 24 - 8 - 2);
    assert_int_equal(st.excluded, 10);
    /* exclude compares values, not spellings: 1e-3 == 0.001; and applies to includes too */
    assert_int_equal(count_text("name: x\nmatrix: {train.lr: [1e-3, 2e-3]}\n"
                                "include: [{train.lr: 0.001, train.seed: 5}]\n"
                                "exclude: [{train.lr: 0.001}]\n", NULL), 1);
    /* values compare as the key's type: for a string key, 1 and '1' are the same string */
    assert_int_equal(count_text("name: x\nmatrix: {data.path: [1, a, 2]}\n"
                                "exclude: [{data.path: '1'}]\nwhere: data.path != '2'\n", NULL),
                     1);
    /* where over a 4x4 product: tp * pp <= 4 holds for (1,1)(1,2)(1,4)(2,1)(2,2)(4,1) */
    assert_int_equal(count_text("name: x\nmatrix:\n  parallel.tp: [1, 2, 4, 8]\n"
                                "  parallel.pp: [1, 2, 4, 8]\n"
                                "where: parallel.tp * parallel.pp <= 4\n", &st), 6);
    assert_int_equal(st.filtered, 10);
    /* where reads keys the point does not set from the base, and resources */
    assert_int_equal(count_text("name: x\nbase: {train: {steps: 3}}\nresources: {nodes: 2}\n"
                                "matrix: {train.seed: [1, 2, 3, 4, 5, 6]}\n"
                                "where: train.seed * train.steps > 6 and resources.nodes == 2\n",
                                NULL), 4);
    /* where and exclude together, plus a zip and an include */
    assert_int_equal(count_text("name: x\nmatrix: {train.seed: [1, 2, 3]}\n"
                                "zip: [{train.steps: [1, 2], train.warmup: [0, 1]}]\n"
                                "include: [{train.seed: 7, train.steps: 1, train.warmup: 0}]\n"
                                "exclude: [{train.steps: 2, train.seed: 3}]\n"
                                "where: train.seed + train.steps != 3\n", NULL),
                     /* 6 candidates: (1,1)(1,2)(2,1)(2,2)(3,1)(3,2) + (7,1) ;
                      * exclude drops (3,2); where drops seed+steps==3: (1,2)(2,1) */
                     7 - 1 - 2);
}

static void test_order_and_values(void **state)
{
    (void)state;
    spec *s = spt_parse_ok("name: x\nmatrix:\n  train.seed: [1, 2]\n  train.lr: [0.1, 0.2, 0.3]\n"
                       "zip: [{parallel.tp: [1, 2], parallel.pp: [2, 1]}]\n"
                       "include: [{model.decoder.mrope_section: [8, 12, 12]}]\n");
    expand_iter *it = NULL;
    hearth_err err;
    assert_int_equal(expand_create(&it, s, NULL, NULL, &err), 0);
    expand_point pt;
    int n = 0;
    while (expand_next(it, &pt, &err) == 1) {
        if (n < 12) {
            assert_int_equal(pt.n, 4);
            assert_int_equal(pt.include, 0);
            /* last wheel (the zip) fastest, then lr, then seed */
            char want[64];
            snprintf(want, sizeof want, "%d", n / 6 + 1);
            assert_string_equal(expand_point_get(&pt, "train.seed")->text, want);
            snprintf(want, sizeof want, "0.%d", n / 2 % 3 + 1);
            assert_string_equal(expand_point_get(&pt, "train.lr")->text, want);
            snprintf(want, sizeof want, "%d", n % 2 + 1);
            assert_string_equal(expand_point_get(&pt, "parallel.tp")->text, want);
            snprintf(want, sizeof want, "%d", 2 - n % 2);
            assert_string_equal(expand_point_get(&pt, "parallel.pp")->text, want);
        } else {
            assert_int_equal(pt.include, 1);
            assert_int_equal(pt.n, 1);
            assert_string_equal(pt.kv[0].key, "model.decoder.mrope_section");
            assert_string_equal(pt.kv[0].value->text, "[8, 12, 12]");
        }
        n++;
    }
    assert_int_equal(n, 13);
    /* after the end, it stays at the end */
    assert_int_equal(expand_next(it, &pt, &err), 0);
    expand_free(it);
    spec_free(s);
}

/* A where that fails on some point is reported at the spec's FILE:LINE:COL. */
static void test_where_runtime_error(void **state)
{
    (void)state;
    spec *s = spt_parse_ok("name: x\nmatrix: {train.steps: [3, 2, 1]}\n"
                       "where: \"8 / (train.steps - 1) > 1\"\n");
    expand_iter *it = NULL;
    hearth_err err = {{0}};
    assert_int_equal(expand_create(&it, s, NULL, NULL, &err), 0);
    expand_point pt;
    assert_int_equal(expand_next(it, &pt, &err), 1);
    assert_int_equal(expand_next(it, &pt, &err), 1);
    assert_int_equal(expand_next(it, &pt, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "t.yaml:3:11: where: division by zero (point 3)");
    expand_free(it);
    spec_free(s);
}

/* ---- random specs against brute force ----------------------------------------------- */

static const char *const pool[] = {
    "train.seed", "train.steps", "train.warmup", "train.micro_batch", "data.images_max",
    "train.checkpoint_every", "train.measure_from", "data.images_min",
};
#define NPOOL 8

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return (*s >> 16) & 0x7fff;
}

typedef struct {
    int key;             /* index into pool */
    int n;
    int v[4];
} axis_t;

typedef struct {
    int n;
    int key[2], v[2];
} entry_t;

typedef struct {
    int n_axes;                 /* matrix axes */
    axis_t ax[3];
    int n_zip;
    int zip_len[2];
    int zip_n[2];
    axis_t zip[2][2];           /* members share zip_len */
    int n_inc, n_exc;
    entry_t inc[3], exc[3];
    int where_kind;             /* 0 none, 1 a + 2b >= T, 2 a != v or b < w */
    int wa, wb, wt, wv;
    int base[NPOOL];
} rspec;

static void gen(unsigned *s, rspec *r)
{
    memset(r, 0, sizeof *r);
    int used[NPOOL] = {0};
    for (int k = 0; k < NPOOL; k++)
        r->base[k] = (int)(rnd(s) % 5) + 1;
    r->n_axes = (int)(rnd(s) % 4);
    for (int a = 0; a < r->n_axes; a++) {
        int k;
        do
            k = (int)(rnd(s) % NPOOL);
        while (used[k]);
        used[k] = 1;
        r->ax[a].key = k;
        r->ax[a].n = (int)(rnd(s) % 4) + 1;
        for (int i = 0; i < r->ax[a].n; i++)
            r->ax[a].v[i] = (int)(rnd(s) % 5) + 1;
    }
    r->n_zip = (int)(rnd(s) % 3);
    for (int g = 0; g < r->n_zip; g++) {
        r->zip_len[g] = (int)(rnd(s) % 3) + 1;
        r->zip_n[g] = (int)(rnd(s) % 2) + 1;
        for (int m = 0; m < r->zip_n[g]; m++) {
            int k, tries = 0;
            do
                k = (int)(rnd(s) % NPOOL);
            while (used[k] && ++tries < 100);
            if (used[k]) {   /* pool exhausted: fewer members */
                r->zip_n[g] = m;
                break;
            }
            used[k] = 1;
            r->zip[g][m].key = k;
            r->zip[g][m].n = r->zip_len[g];
            for (int i = 0; i < r->zip_len[g]; i++)
                r->zip[g][m].v[i] = (int)(rnd(s) % 5) + 1;
        }
        if (r->zip_n[g] == 0) {
            r->n_zip = g;
            break;
        }
    }
    r->n_inc = (int)(rnd(s) % 3);
    r->n_exc = (int)(rnd(s) % 3);
    for (int e = 0; e < r->n_inc + r->n_exc; e++) {
        entry_t *en = e < r->n_inc ? &r->inc[e] : &r->exc[e - r->n_inc];
        en->n = (int)(rnd(s) % 2) + 1;
        en->key[0] = (int)(rnd(s) % NPOOL);
        en->key[1] = (en->key[0] + 1 + (int)(rnd(s) % (NPOOL - 1))) % NPOOL;
        for (int i = 0; i < en->n; i++)
            en->v[i] = (int)(rnd(s) % 5) + 1;
    }
    r->where_kind = (int)(rnd(s) % 3);
    r->wa = (int)(rnd(s) % NPOOL);
    r->wb = (int)(rnd(s) % NPOOL);
    r->wt = (int)(rnd(s) % 15);
    r->wv = (int)(rnd(s) % 5) + 1;
}

static void app(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void app(char *buf, size_t n, const char *fmt, ...)
{
    size_t used = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, n - used, fmt, ap);
    va_end(ap);
}

static void axis_yaml(char *buf, size_t n, const axis_t *a)
{
    app(buf, n, "%s: [", pool[a->key]);
    for (int i = 0; i < a->n; i++)
        app(buf, n, "%s%d", i ? ", " : "", a->v[i]);
    app(buf, n, "]");
}

static void to_yaml(const rspec *r, char *buf, size_t n)
{
    buf[0] = '\0';
    app(buf, n, "name: r\nbase:\n");
    for (int k = 0; k < NPOOL; k++)
        app(buf, n, "  %s: %d\n", pool[k], r->base[k]);
    if (r->n_axes) {
        app(buf, n, "matrix:\n");
        for (int a = 0; a < r->n_axes; a++) {
            app(buf, n, "  ");
            axis_yaml(buf, n, &r->ax[a]);
            app(buf, n, "\n");
        }
    }
    if (r->n_zip) {
        app(buf, n, "zip:\n");
        for (int g = 0; g < r->n_zip; g++) {
            app(buf, n, "  - {");
            for (int m = 0; m < r->zip_n[g]; m++) {
                app(buf, n, "%s", m ? ", " : "");
                axis_yaml(buf, n, &r->zip[g][m]);
            }
            app(buf, n, "}\n");
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        int cnt = pass ? r->n_exc : r->n_inc;
        if (!cnt)
            continue;
        app(buf, n, "%s:\n", pass ? "exclude" : "include");
        for (int e = 0; e < cnt; e++) {
            const entry_t *en = pass ? &r->exc[e] : &r->inc[e];
            app(buf, n, "  - {");
            for (int i = 0; i < en->n; i++)
                app(buf, n, "%s%s: %d", i ? ", " : "", pool[en->key[i]], en->v[i]);
            app(buf, n, "}\n");
        }
    }
    if (r->where_kind == 1)
        app(buf, n, "where: %s + 2 * %s >= %d\n", pool[r->wa], pool[r->wb], r->wt);
    else if (r->where_kind == 2)
        app(buf, n, "where: '%s != %d or %s < %d'\n", pool[r->wa], r->wv, pool[r->wb], r->wv);
}

/* The expected points, as full assignments of the pool, in order. */
static int brute(const rspec *r, int (*out)[NPOOL], int cap)
{
    int n = 0;
    /* wheels: matrix axes then zip groups */
    int radix[5], nw = 0;
    for (int a = 0; a < r->n_axes; a++)
        radix[nw++] = r->ax[a].n;
    for (int g = 0; g < r->n_zip; g++)
        radix[nw++] = r->zip_len[g];
    long total = 1;
    for (int w = 0; w < nw; w++)
        total *= radix[w];
    if (nw == 0 && r->n_inc > 0)
        total = 0;
    for (long c = 0; c < total + r->n_inc; c++) {
        int v[NPOOL];
        memcpy(v, r->base, sizeof v);
        if (c < total) {
            /* mixed radix, last wheel least significant */
            long rest = c;
            for (int w = nw - 1; w >= 0; w--) {
                int d = (int)(rest % radix[w]);
                rest /= radix[w];
                if (w < r->n_axes) {
                    v[r->ax[w].key] = r->ax[w].v[d];
                } else {
                    int g = w - r->n_axes;
                    for (int m = 0; m < r->zip_n[g]; m++)
                        v[r->zip[g][m].key] = r->zip[g][m].v[d];
                }
            }
        } else {
            const entry_t *en = &r->inc[c - total];
            for (int i = 0; i < en->n; i++)
                v[en->key[i]] = en->v[i];
        }
        int drop = 0;
        for (int e = 0; e < r->n_exc && !drop; e++) {
            int all = 1;
            for (int i = 0; i < r->exc[e].n; i++)
                all &= v[r->exc[e].key[i]] == r->exc[e].v[i];
            drop = all;
        }
        if (drop)
            continue;
        if (r->where_kind == 1 && !(v[r->wa] + 2 * v[r->wb] >= r->wt))
            continue;
        if (r->where_kind == 2 && !(v[r->wa] != r->wv || v[r->wb] < r->wv))
            continue;
        if (n < cap)
            memcpy(out[n], v, sizeof v);
        n++;
    }
    return n;
}

static void test_random_against_brute_force(void **state)
{
    (void)state;
    unsigned s = g_seed;
    enum { CAP = 4096 };
    int (*want)[NPOOL] = malloc(CAP * sizeof *want);
    char *yaml = malloc(8192);
    for (int iter = 0; iter < 300; iter++) {
        rspec r;
        gen(&s, &r);
        to_yaml(&r, yaml, 8192);
        int n_want = brute(&r, want, CAP);
        spec *sp = spt_parse_ok(yaml);
        expand_iter *it = NULL;
        hearth_err err;
        assert_int_equal(expand_create(&it, sp, NULL, NULL, &err), 0);
        expand_point pt;
        int n = 0, rc;
        while ((rc = expand_next(it, &pt, &err)) == 1) {
            if (n < n_want && n < CAP) {
                /* every key the point sets has the expected value */
                for (int k = 0; k < pt.n; k++) {
                    int key = -1;
                    for (int q = 0; q < NPOOL; q++)
                        if (strcmp(pool[q], pt.kv[k].key) == 0)
                            key = q;
                    assert_true(key >= 0);
                    if (atoi(pt.kv[k].value->text) != want[n][key])
                        fail_msg("point %d key %s = %s, want %d (seed %u, iter %d)\n%s", n,
                                 pool[key], pt.kv[k].value->text, want[n][key], g_seed, iter,
                                 yaml);
                }
            }
            n++;
        }
        if (rc != 0)
            fail_msg("expand: %s (seed %u)\n%s", err.msg, g_seed, yaml);
        if (n != n_want)
            fail_msg("%d points, brute force says %d (seed %u, iter %d)\n%s", n, n_want, g_seed,
                     iter, yaml);
        expand_free(it);
        spec_free(sp);
    }
    free(want);
    free(yaml);
}

/* A large product streams in constant memory; stats add up. */
static void test_large_stream(void **state)
{
    (void)state;
    char yaml[4096] = "name: big\nmatrix:\n";
    const char *keys[] = {"train.seed", "train.steps", "train.warmup", "train.micro_batch",
                          "data.images_max"};
    for (int k = 0; k < 5; k++) {
        app(yaml, sizeof yaml, "  %s: [", keys[k]);
        for (int v = 1; v <= 10; v++)
            app(yaml, sizeof yaml, "%s%d", v > 1 ? ", " : "", v);
        app(yaml, sizeof yaml, "]\n");
    }
    app(yaml, sizeof yaml, "where: train.seed + train.steps > 10\n");
    expand_stats st;
    uint64_t n = count_text(yaml, &st);
    /* pairs (a, b) in 1..10 with a + b > 10: 55 of 100 */
    assert_int_equal(n, 55000);
    assert_int_equal(st.candidates, 100000);
    assert_int_equal(st.filtered, 45000);
    assert_int_equal(st.points + st.filtered + st.excluded, st.candidates);
}

/* A matrix of `keys` keys with `vals` integer values each (1..vals), then `tail`. */
static char *wide_spec(int keys, int vals, const char *tail)
{
    static const char *const names[] = {
        "train.seed", "train.steps", "train.warmup", "train.micro_batch", "train.global_batch",
        "train.seq_len", "train.checkpoint_every", "data.images_min", "data.images_max",
        "train.measure_from",
    };
    assert_true(keys <= (int)(sizeof names / sizeof *names));
    size_t cap = 4096 + (size_t)keys * (size_t)vals * 8;
    char *yaml = malloc(cap);
    assert_non_null(yaml);
    snprintf(yaml, cap, "name: big\nmatrix:\n");
    for (int k = 0; k < keys; k++) {
        app(yaml, cap, "  %s: [", names[k]);
        for (int v = 1; v <= vals; v++)
            app(yaml, cap, "%s%d", v > 1 ? ", " : "", v);
        app(yaml, cap, "]\n");
    }
    app(yaml, cap, "%s", tail);
    return yaml;
}

/* Refused before any candidate is made (expand_create fails; nothing to iterate), with the
 * count, the list lengths, the limit and how to raise it in the message. */
static void expect_too_big(const char *yaml, const char *count, const char *lens,
                           const char *limit)
{
    spec *s = spt_parse_ok(yaml);
    expand_iter *it = (expand_iter *)1;
    hearth_err err = { { 0 } };
    assert_int_equal(expand_create(&it, s, NULL, NULL, &err), HERR_CONFIG);
    assert_null(it);
    const char *want[] = { "t.yaml: matrix: ", count, lens, limit, "max_points: N" };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(err.msg, want[i]))
            fail_msg("message '%s' lacks '%s'", err.msg, want[i]);
    spec_free(s);
}

/* 10^9 points and 2^40 points (whose where keeps nothing) are refused at once; a product
 * past 2^64 saturates instead of wrapping to a small count; max_points raises the limit,
 * and include entries count. */
static void test_size_limit(void **state)
{
    (void)state;
    char *y = wide_spec(9, 10, "");
    expect_too_big(y, "1000000000 candidate points",
                   "(10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10)", "max_points 100000");
    free(y);
    y = wide_spec(10, 16, "where: \"false\"\n");
    expect_too_big(y, "1099511627776 candidate points", "(16 x 16 x", "max_points 100000");
    free(y);
    /* 100^10 = 10^20 > 2^64: counted as UINT64_MAX, not as 10^20 mod 2^64 */
    y = wide_spec(10, 100, "max_points: 9223372036854775807\n");
    spec *s = spt_parse_ok(y);
    assert_true(expand_candidates(s) == UINT64_MAX);
    spec_free(s);
    expect_too_big(y, "2^64 or more candidate points", "(100 x 100 x",
                   "max_points 9223372036854775807");
    free(y);

    const char *inc = "include: [{train.seed: 7}, {train.seed: 8}, {train.seed: 9}]\n";
    char tail[200];
    snprintf(tail, sizeof tail, "max_points: 11\n%s", inc);
    y = wide_spec(2, 3, tail);
    expect_too_big(y, "12 candidate points", "(3 x 3 + 3 include entries)", "max_points 11");
    free(y);
    snprintf(tail, sizeof tail, "max_points: 12\n%s", inc);
    y = wide_spec(2, 3, tail);
    assert_int_equal(count_text(y, NULL), 12);
    free(y);
    y = wide_spec(6, 10, "");    /* 10^6: just over the default */
    expect_too_big(y, "1000000 candidate points", "(10 x", "max_points 100000");
    free(y);

    spec *bad = NULL;
    hearth_err err = { { 0 } };
    const char *zero = "name: x\nmax_points: 0\n";
    assert_int_equal(spec_parse(&bad, "t.yaml", zero, strlen(zero), &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "t.yaml:2:13: max_points: expected an integer between 1"));
}

int main(void)
{
    g_seed = tu_seed_noted();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_by_hand),
        cmocka_unit_test(test_order_and_values),
        cmocka_unit_test(test_where_runtime_error),
        cmocka_unit_test(test_random_against_brute_force),
        cmocka_unit_test(test_large_stream),
        cmocka_unit_test(test_size_limit),
    };
    return cmocka_run_group_tests_name("orch_expand", tests, NULL, NULL);
}
