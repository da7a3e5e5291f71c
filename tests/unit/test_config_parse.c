/* test_config_parse.c - reading run configs (trainer/shape/run_config.h): defaults as
 * docs/config.md states them, `auto` values, overrides, and the exact text of every
 * class of error.  Random inputs use a fresh seed (printed on failure). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shape/fields.h"
#include "shape/run_config.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

#define MAX_SETS 32

/* Parses `yaml` (NULL: no file) with raw "KEY=VALUE" overrides (NULL-terminated). */
static int parse(run_config *c, const char *yaml, const char *const *sets, int single,
                 hearth_err *err)
{
    config_override o[MAX_SETS] = { { 0 } };
    int n = 0;
    for (; sets && sets[n]; n++) {
        o[n].key = sets[n];
        o[n].value = NULL;
    }
    if (yaml)
        return run_config_parse(c, "run.yaml", yaml, o, n, single, err);
    return run_config_load(c, NULL, o, n, single, err);
}

static run_config *parse_ok(const char *yaml, const char *const *sets, uint64_t seed)
{
    static run_config c;
    hearth_err err = { { 0 } };
    if (parse(&c, yaml, sets, 0, &err))
        fail_msg("parse failed: %s (seed %llu)\n%s", err.msg, (unsigned long long)seed,
                 yaml ? yaml : "");
    return &c;
}

static void hash_of(const run_config *c, char out[65])
{
    hearth_err err = { { 0 } };
    assert_int_equal(run_config_hash(c, out, &err), 0);
}

/* Expects a HERR_CONFIG whose message is exactly `want` (or starts with it when
 * `prefix` is set). */
static void expect(const char *yaml, const char *const *sets, int single, const char *want,
                   int prefix)
{
    run_config c;
    hearth_err err = { { 0 } };
    int rc = parse(&c, yaml, sets, single, &err);
    if (rc != HERR_CONFIG)
        fail_msg("expected '%s', got rc %d\n%s", want, rc, yaml ? yaml : "");
    int ok = prefix ? strncmp(err.msg, want, strlen(want)) == 0 : strcmp(err.msg, want) == 0;
    if (!ok)
        fail_msg("message\n  '%s'\nexpected%s\n  '%s'", err.msg, prefix ? " to start with" : "",
                 want);
}

/* ---- docs/config.md ------------------------------------------------------------------ */

static char *read_docs(void)
{
    const char *paths[] = { "docs/config.md", "../../docs/config.md" };
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 64);
    char near_exe[4200] = "";
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = 0;
        snprintf(near_exe, sizeof near_exe, "%s/../../docs/config.md", exe);
    }
    for (int i = 0; i < 3; i++) {
        const char *p = i < 2 ? paths[i] : near_exe;
        FILE *f = p[0] ? fopen(p, "rb") : NULL;
        if (!f)
            continue;
        char *buf = calloc(1, 1 << 20);
        assert_non_null(buf);
        size_t got = fread(buf, 1, (1 << 20) - 1, f);
        buf[got] = 0;
        fclose(f);
        return buf;
    }
    fail_msg("docs/config.md not found (run from the repository root)");
    return NULL;
}

/* Every key of both tables is documented. */
static void test_docs_list_every_key(void **state)
{
    (void)state;
    char *docs = read_docs();
    int n;
    const field_desc *t = config_fields(&n);
    for (int i = 0; i < n; i++) {
        char k[200];
        snprintf(k, sizeof k, "`%s`", t[i].key);
        if (!strstr(docs, k))
            fail_msg("docs/config.md does not mention run-config key %s", k);
    }
    t = model_fields(&n);
    for (int i = 0; i < n; i++) {
        char k[200];
        snprintf(k, sizeof k, "`%s`", t[i].key);
        if (!strstr(docs, k))
            fail_msg("docs/config.md does not mention preset key %s", k);
    }
    free(docs);
}

/* The next unescaped '|' after p (markdown cells may contain "\\|"). */
static const char *next_cell(const char *p)
{
    for (p++; *p && *p != '\n'; p++)
        if (*p == '|' && p[-1] != '\\')
            return p;
    return NULL;
}

/* The run-config table of docs/config.md: each documented plain default, written out
 * with --set, leaves the resolved config unchanged (same hash), and a different value
 * changes it. */
static void test_docs_defaults(void **state)
{
    (void)state;
    char *docs = read_docs();
    const char *start = strstr(docs, "## Run config keys");
    const char *end = start ? strstr(start, "## Model preset keys") : NULL;
    assert_non_null(start);
    assert_non_null(end);
    char base[65];
    hash_of(parse_ok("model: tiny-vlm\n", NULL, 0), base);
    int checked = 0;
    for (const char *line = start; line && line < end; line = strchr(line + 1, '\n')) {
        /* "| `key` | type | `default` | meaning |" */
        const char *l = line + 1;
        if (strncmp(l, "| `", 3) != 0)
            continue;
        char key[128], def[128];
        if (sscanf(l, "| `%127[^`]` |", key) != 1 || !strncmp(key, "model", 5))
            continue;
        const char *cell = next_cell(l);        /* the type cell */
        cell = cell ? next_cell(cell) : NULL;   /* the default cell */
        assert_non_null(cell);
        if (sscanf(cell, "| `%127[^`]`", def) != 1)
            fail_msg("no default for %s in docs/config.md", key);
        char set[300];
        snprintf(set, sizeof set, "%s=%s", key, strcmp(def, "\"\"") == 0 ? "" : def);
        const char *sets[] = { set, NULL };
        char h[65];
        hash_of(parse_ok("model: tiny-vlm\n", sets, 0), h);
        if (strcmp(h, base) != 0)
            fail_msg("docs/config.md: %s = %s is not the default", key, def);
        checked++;
    }
    /* every run-config key except model.*; `model` rows are skipped above */
    int n;
    config_fields(&n);
    assert_int_equal(checked, n);
    free(docs);
}

/* ---- auto values ------------------------------------------------------------------- */

static void test_auto_values(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    for (int iter = 0; iter < 40; iter++) {
        int tp = 1 << tu_randint(&r, 0, 3), pp = 1 << tu_randint(&r, 0, 2);
        int cp = tu_randint(&r, 1, 3), dp = tu_randint(&r, 1, 4);
        int mb = tu_randint(&r, 1, 5), ranks = tp * pp * cp * dp;
        double lr = tu_uniform(&r) * 1e-2;
        char yaml[1024];
        snprintf(yaml, sizeof yaml,
                 "model: tiny-vlm\nranks: %d\nparallel: {tp: %d, pp: %d, cp: %d}\n"
                 "train: {micro_batch: %d, lr: %.17g, seq_len: 96}\n", ranks, tp, pp, cp, mb, lr);
        run_config *c = parse_ok(yaml, NULL, r.seed);
        assert_int_equal(c->parallel.dp, dp);
        assert_int_equal(c->parallel.encoder.tp, tp);       /* uniform */
        assert_int_equal(c->train.global_batch, mb * dp);
        assert_int_equal(c->comm, COMM_LOCAL);
        if (!(fabs(c->train.min_lr - lr / 10) <= 1e-14 * lr))
            fail_msg("min_lr %.17g for lr %.17g (seed %llu)", c->train.min_lr, lr,
                     (unsigned long long)r.seed);
    }
    /* encoder tp per strategy; comm on cuda */
    const char *s1[] = { "parallel.encoder.strategy=hetero_tp", "parallel.tp=4", "ranks=4", NULL };
    assert_int_equal(parse_ok("model: tiny-vlm", s1, 0)->parallel.encoder.tp, 2);
    const char *s2[] = { "parallel.encoder.strategy=hetero_dp", "parallel.tp=4", "ranks=4", NULL };
    assert_int_equal(parse_ok("model: tiny-vlm", s2, 0)->parallel.encoder.tp, 1);
    const char *s3[] = { "parallel.encoder.strategy=full_separation", "parallel.tp=2",
                         "ranks=2", "parallel.encoder.tp=auto", NULL };
    assert_int_equal(parse_ok("model: tiny-vlm", s3, 0)->parallel.encoder.tp, 1);
    const char *s4[] = { "device=cuda", NULL };
    assert_int_equal(parse_ok("model: tiny-vlm", s4, 0)->comm, COMM_NCCL);
    const char *s5[] = { "device=cuda", "comm=local", NULL };
    assert_int_equal(parse_ok("model: tiny-vlm", s5, 0)->comm, COMM_LOCAL);
    /* model recompute follows train.recompute unless set */
    const char *s6[] = { "train.recompute=full", "model.encoder.recompute=none", NULL };
    run_config *c = parse_ok("model: tiny-vlm", s6, 0);
    assert_int_equal(c->model.decoder.s.recompute, RECOMPUTE_FULL);
    assert_int_equal(c->model.encoder.s.recompute, RECOMPUTE_NONE);
    assert_int_equal(c->train.recompute, RECOMPUTE_FULL);
}

/* ---- overrides ------------------------------------------------------------------- */

static void test_overrides(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    for (int iter = 0; iter < 30; iter++) {
        int a = tu_randint(&r, 1, 100000), b = tu_randint(&r, 1, 100000);
        int layers = 2 * tu_randint(&r, 1, 6), enc = tu_randint(&r, 2, 5);
        int experts = 2 * tu_randint(&r, 1, 5);
        char yaml[512], s_b[64], s_l[64], s_x[64];
        snprintf(yaml, sizeof yaml,
                 "model:\n  preset: tiny-vlm-moe\n  encoder: {layers: %d, freeze: true}\n"
                 "  decoder.moe.experts: %d\ntrain:\n  steps: %d\n", enc, experts, a);
        run_config *c = parse_ok(yaml, NULL, r.seed);
        assert_int_equal(c->train.steps, a);
        assert_int_equal(c->model.encoder.s.layers, enc);
        assert_int_equal(c->model.encoder.s.freeze, 1);
        assert_int_equal(c->model.decoder.s.freeze, 0);
        assert_int_equal(c->model.decoder.moe_experts, experts);
        assert_string_equal(c->model_preset, "tiny-vlm-moe");
        /* --set wins over the file, and a later --set over an earlier one */
        snprintf(s_b, sizeof s_b, "train.steps=%d", b);
        snprintf(s_l, sizeof s_l, "model.decoder.layers=%d", layers);
        snprintf(s_x, sizeof s_x, "model.decoder.moe={experts: %d, top_k: 1}", experts + 2);
        const char *sets[] = { "train.steps=1", s_b, s_l, s_x, "model.decoder.bias=true", NULL };
        c = parse_ok(yaml, sets, r.seed);
        assert_int_equal(c->train.steps, b);
        assert_int_equal(c->model.decoder.s.layers, layers);
        assert_int_equal(c->model.decoder.moe_experts, experts + 2);
        assert_int_equal(c->model.decoder.moe_top_k, 1);
        assert_true(c->model.decoder.s.bias_qkv && c->model.decoder.s.bias_proj &&
                    c->model.decoder.s.bias_mlp);
    }
    /* Without a file, the overrides name everything. */
    const char *sets[] = { "model=gpt2-124m", "train.seq_len=1024", "data.path=", NULL };
    run_config *c = parse_ok(NULL, sets, 0);
    assert_string_equal(c->model.name, "gpt2-124m");
    assert_int_equal(c->train.seq_len, 1024);
    assert_string_equal(c->data.path, "");
    const char *l3[] = { "model.decoder.mrope_section=[4, 14, 14]", NULL };
    c = parse_ok("model: tiny-vlm", l3, 0);
    assert_int_equal(c->model.decoder.s.mrope_section[0], 4);
    assert_int_equal(c->model.decoder.s.mrope_section[2], 14);
}

static char tmpdir[256];

static int setup_tmp(void **state)
{
    (void)state;
    return tu_tmpdir_make(tmpdir, sizeof tmpdir, "test-config");
}

static int teardown_tmp(void **state)
{
    (void)state;
    return tu_tmpdir_remove(tmpdir);
}

static void test_load_file(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    char path[512];
    snprintf(path, sizeof path, "%s/run.yaml", tmpdir);
    int steps = tu_randint(&r, 1, 1000);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "model: tiny-vlm\ntrain:\n  steps: %d\n  warmup: 7\n", steps);
    fclose(f);
    run_config c;
    hearth_err err = { { 0 } };
    assert_int_equal(run_config_load(&c, path, NULL, 0, 0, &err), 0);
    assert_int_equal(c.train.warmup, 7);
    config_override bad = { "train.warmup", "x" };
    assert_int_equal(run_config_load(&c, path, &bad, 1, 0, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "--set train.warmup: expected an integer, got \"x\"");
    config_override o = { "train.warmup", "3" };
    assert_int_equal(run_config_load(&c, path, &o, 1, 0, &err), 0);
    assert_int_equal(c.train.steps, steps);
    assert_int_equal(c.train.warmup, 3);
    snprintf(path, sizeof path, "%s/missing.yaml", tmpdir);
    assert_int_equal(run_config_load(&c, path, NULL, 0, 0, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "missing.yaml: cannot open"));
    /* Not a file that ends (read until memory ran out) and not a preset that does. */
    assert_int_equal(run_config_load(&c, "/dev/zero", NULL, 0, 0, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "/dev/zero: not a regular file (a character device)");
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "model: /dev/zero\n");
    fclose(f);
    assert_int_equal(run_config_load(&c, path, NULL, 0, 0, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "/dev/zero: not a regular file"));
}

/* ---- errors ---------------------------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    /* wrong type, unknown key (with a hint), missing or unreadable preset */
    expect("model: tiny-vlm\ntrain:\n  steps: ten\n", NULL, 0,
           "run.yaml:3:10: train.steps: expected an integer, got \"ten\"", 0);
    expect("model: tiny-vlm\ntrain:\n  lr: [1]\n", NULL, 0,
           "run.yaml:3:7: train.lr: expected a number, got a list", 0);
    expect("model: tiny-vlm\n\ntrain:\n  stepz: 3\n", NULL, 0,
           "run.yaml:4:3: train.stepz: unknown key (did you mean train.steps?)", 0);
    expect("model: tiny-vlm\nsteps: 3\n", NULL, 0,
           "run.yaml:2:1: steps: unknown key (did you mean train.steps?)", 0);
    expect("model: tiny-vlm\nmodel.decoder.layer: 3\n", NULL, 0,
           "run.yaml:2:1: model.decoder.layer: unknown key (did you mean model.decoder.layers?)", 0);
    expect("model: tiny-vlm\nfoo: {bar: 1}\n", NULL, 0, "run.yaml:2:1: foo: unknown key", 0);
    expect("model: nope\n", NULL, 0,
           "run.yaml:1:8: model: preset \"nope\" not found (searched: ", 1);
    expect("model:\n  preset: nope\n", NULL, 0,
           "run.yaml:2:11: model.preset: preset \"nope\" not found (searched: ", 1);
    {   /* a misspelt preset name is answered with the preset that exists */
        run_config *c = calloc(1, sizeof *c);
        hearth_err e = {{0}};
        assert_non_null(c);
        assert_int_equal(run_config_parse(c, "run.yaml", "model: tiny-vlmm\n", NULL, 0, 0, &e),
                         HERR_CONFIG);
        if (!strstr(e.msg, "run.yaml:1:8: model: preset \"tiny-vlmm\" not found (searched: ") ||
            !strstr(e.msg, "; did you mean 'tiny-vlm'?"))
            fail_msg("got '%s'", e.msg);
        free(c);
    }
    expect("model: [tiny-vlm]\n", NULL, 0,
           "run.yaml:1:8: model: expected a preset name or path, got a list", 0);
    expect("model: /nonexistent/x.yaml\n", NULL, 0,
           "run.yaml:1:8: model: preset file \"/nonexistent/x.yaml\" cannot be read: ", 1);
    /* missing model */
    expect("train: {steps: 3}\n", NULL, 0,
           "run.yaml: model: required: a preset name (model: NAME) or a mapping with model.preset", 0);
    expect(NULL, NULL, 0, "model: required: give --set model=NAME", 0);
    /* impossible shapes, at the override that caused them */
    expect("model:\n  preset: tiny-vlm\n  decoder: {kv_heads: 3}\n", NULL, 0,
           "run.yaml:3:23: model.decoder.kv_heads: kv_heads 3 must divide heads 4", 0);
    expect("model: tiny-vlm\nmodel.decoder.mrope_section: [8, 8, 8]\n", NULL, 0,
           "run.yaml:2:30: model.decoder.mrope_section: sections [8, 8, 8] sum to 24, "
           "must be head_dim / 2 = 32", 0);
    expect("model: tiny-vlm\nmodel.encoder.heads: 3\n", NULL, 0,
           "run.yaml:2:22: model.encoder.heads: with this value, encoder.kv_heads: kv_heads 4 "
           "must divide heads 3", 0);
    expect("model: tiny-vlm\nmodel.encoder: {heads: 2, kv_heads: 2}\n", NULL, 0,
           "run.yaml:2:24: model.encoder.heads: with this value, encoder.head_dim: heads 2 x "
           "head_dim 64 = 128 must equal hidden 256 in the encoder", 0);
    expect("model: gpt2-124m\nmodel.encoder.layers: 3\n", NULL, 0,
           "run.yaml:2:23: model.encoder.layers: the preset \"gpt2-124m\" has no encoder", 0);
    expect("model: tiny-vlm\nmodel.decoder.freeze: maybe\n", NULL, 0,
           "run.yaml:2:23: model.decoder.freeze: expected a boolean (true or false), got \"maybe\"", 0);
    /* bad --set: unknown key, bad value, missing '=', empty key, bad YAML */
    const char *b1[] = { "train.lrr=3", NULL };
    expect("model: tiny-vlm", b1, 0, "--set train.lrr: unknown key (did you mean train.lr?)", 0);
    const char *b2[] = { "train.lr=fast", NULL };
    expect("model: tiny-vlm", b2, 0, "--set train.lr: expected a number, got \"fast\"", 0);
    const char *b3[] = { "train.lr", NULL };
    expect("model: tiny-vlm", b3, 0, "--set train.lr: expected KEY=VALUE", 0);
    const char *b4[] = { "=3", NULL };
    expect("model: tiny-vlm", b4, 0, "--set =3: expected KEY=VALUE", 0);
    const char *b5[] = { "model.decoder.mrope_section=[1,2", NULL };
    expect("model: tiny-vlm", b5, 0, "--set model.decoder.mrope_section: cannot read the value "
           "\"[1,2\" (", 1);
    const char *b6[] = { "parallel.encoder.strategy=sideways", NULL };
    expect("model: tiny-vlm", b6, 0, "--set parallel.encoder.strategy: expected one of "
           "uniform|hetero_tp|hetero_dp|full_separation, got \"sideways\"", 0);
    const char *b7[] = { "train=5", NULL };
    expect("model: tiny-vlm", b7, 0, "--set train: expected a mapping, got \"5\"", 0);
    const char *b8[] = { "model.decoder.heads=5", NULL };
    expect("model: tiny-vlm", b8, 0,
           "--set model.decoder.heads: with this value, decoder.kv_heads: kv_heads 2 must "
           "divide heads 5", 0);
    /* ranges, quoted numbers, twice in one file, YAML syntax */
    expect("model: tiny-vlm\ntrain: {steps: 0}\n", NULL, 0,
           "run.yaml:2:16: train.steps: must be >= 1, got 0", 0);
    expect("model: tiny-vlm\ntrain: {seq_len: \"5\"}\n", NULL, 0,
           "run.yaml:2:18: train.seq_len: expected an integer, got the string \"5\"", 0);
    expect("model: tiny-vlm\ntrain:\n  steps: 3\ntrain.steps: 4\n", NULL, 0,
           "run.yaml:4:14: train.steps: set twice (first at 3:10 as train.steps)", 0);
    expect("model: tiny-vlm\nmodel.preset: tiny-vlm\n", NULL, 0,
           "run.yaml:2:15: model.preset: set twice (first at 1:8 as model)", 0);
    expect("model: tiny-vlm\ntrain: {steps: 5\n", NULL, 0,
           "run.yaml:3:1: YAML syntax error: ", 1);
    expect("- model\n", NULL, 0, "run.yaml:1:1: expected a mapping of keys at the top", 0);

    /* A random integer key given a word: the message names it and the word's place. */
    tu_rng r = tu_rng_fresh();
    int n;
    const field_desc *t = config_fields(&n);
    for (int iter = 0; iter < 20; iter++) {
        int i;
        do
            i = tu_randint(&r, 0, n);
        while (t[i].type != FT_INT);
        char yaml[512], want[512];
        int pad = tu_randint(&r, 0, 4);
        snprintf(yaml, sizeof yaml, "model: tiny-vlm\n%s:%*s word%d\n", t[i].key, pad, "", iter);
        snprintf(want, sizeof want, "run.yaml:2:%d: %s: expected an integer%s, got \"word%d\"",
                 (int)strlen(t[i].key) + 3 + pad, t[i].key,
                 (t[i].flags & FIELD_AUTO) ? " or auto" : "", iter);
        expect(yaml, NULL, 0, want, 0);
    }
}

/* The single-rank trainer refuses any other layout, naming the key. */
static void test_single_rank(void **state)
{
    (void)state;
    expect("model: tiny-vlm\nparallel:\n  tp: 2\n", NULL, 1,
           "run.yaml:3:7: parallel.tp: 2: this hearth-train supports a single rank only so far", 0);
    expect("model: tiny-vlm\nranks: 4\n", NULL, 1,
           "run.yaml:2:8: ranks: 4: this hearth-train supports a single rank only so far", 0);
    const char *s1[] = { "parallel.encoder.strategy=hetero_dp", NULL };
    expect("model: tiny-vlm\n", s1, 1, "--set parallel.encoder.strategy: hetero_dp: this "
           "hearth-train supports a single rank only so far", 0);
    const char *s2[] = { "parallel.sp=true", NULL };
    expect("model: tiny-vlm\n", s2, 1, "--set parallel.sp: true: this hearth-train supports a "
           "single rank only so far", 0);
    run_config c;
    hearth_err err = { { 0 } };
    assert_int_equal(parse(&c, "model: tiny-vlm-moe\nparallel: {dp: 1, ep: 1}\n", NULL, 1, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_list_every_key),
        cmocka_unit_test(test_docs_defaults),
        cmocka_unit_test(test_auto_values),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test_setup_teardown(test_load_file, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_single_rank),
    };
    return cmocka_run_group_tests_name("config_parse", tests, NULL, NULL);
}
