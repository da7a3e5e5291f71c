/* test_fp8_policy.c - the FP8 policy file (fp8_policy.h): a valid policy becomes the plan
 * it says, and every kind of mistake is refused with FILE:LINE:COL, the key and the
 * reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_policy.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

static char g_dir[512];

static int setup(void **state)
{
    (void)state;
    return tu_tmpdir_make(g_dir, sizeof g_dir, "fp8_policy") ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return tu_tmpdir_remove(g_dir) ? -1 : 0;
}

/* Writes text to DIR/name and loads it for model "tiny-vlm" on "cpu". */
static int load(const char *name, const char *text, fp8_plan *p, hearth_err *err,
                char *path, size_t n)
{
    snprintf(path, n, "%s/%s", g_dir, name);
    assert_int_equal(tu_write_text(path, text), 0);
    return fp8_policy_load(p, path, "tiny-vlm", "contrib/models/tiny-vlm.yaml", "cpu", err);
}

static const char *good =
    "version: 1\n"
    "gpu: cpu\n"
    "model: tiny-vlm\n"
    "threshold: 1.05\n"
    "rules:\n"
    "  - {component: decoder, kind: fc1, tp: 2, min_tokens: 2048, measured_speedup: 1.31}\n"
    "  - component: encoder\n"
    "    kind: qkv\n"
    "    tp: 1\n"
    "    min_tokens: 512\n"
    "    max_tokens: 8192\n"
    "    measured_speedup: 1.07\n"
    "  - {component: projector, kind: fc2, tp: 1, min_tokens: 0}\n"
    "  - {component: decoder, kind: expert_fc1, tp: 2, min_tokens: 4096, measured_speedup: 1.5}\n"
    "keep_bf16: [lm_head, router, decoder.layers.0, decoder.layers.last, encoder.fc2,\n"
    "            projector]\n"
    "scaling: {recipe: delayed, history: 32, margin: 1}\n";

static void test_good_policy(void **state)
{
    (void)state;
    fp8_plan p;
    hearth_err err = { { 0 } };
    char path[600];
    if (load("good.yaml", good, &p, &err, path, sizeof path))
        fail_msg("%s", err.msg);
    assert_int_equal(p.all, 0);
    assert_int_equal(p.n_rules, 4);
    assert_int_equal(p.rules[0].comp, FP8_COMP_DECODER);
    assert_int_equal(p.rules[0].kind, FP8_FC1);
    assert_int_equal(p.rules[0].tp, 2);
    assert_int_equal(p.rules[0].min_tokens, 2048);
    assert_true(p.rules[0].speedup == 1.31);
    assert_int_equal(p.rules[1].max_tokens, 8192);
    assert_int_equal(p.rules[3].kind, FP8_EXPERT_FC1);
    assert_int_equal(p.n_keep, 6);
    assert_int_equal(p.history, 32);
    assert_int_equal(p.margin, 1);
    assert_int_equal(p.current, 0);
    int D = FP8_COMP_DECODER;
    assert_true(fp8_plan_uses(&p, D, FP8_FC1, 2, 4, 2, 2048));
    assert_false(fp8_plan_uses(&p, D, FP8_FC1, 0, 4, 2, 4096));         /* layers.0 */
    assert_false(fp8_plan_uses(&p, D, FP8_FC1, 3, 4, 2, 4096));         /* layers.last */
    assert_true(fp8_plan_uses(&p, FP8_COMP_ENCODER, FP8_QKV, 1, 2, 1, 600));
    assert_false(fp8_plan_uses(&p, FP8_COMP_PROJECTOR, FP8_FC2, FP8_ANY, 1, 1, 99));
    fp8_plan_clear(&p);

    /* defaults: no scaling block, empty rules */
    const char *empty = "version: 1\ngpu: cpu\nmodel: tiny-vlm\nthreshold: 1.1\nrules: []\n";
    if (load("empty.yaml", empty, &p, &err, path, sizeof path))
        fail_msg("%s", err.msg);
    assert_int_equal(p.n_rules, 0);
    assert_int_equal(p.n_keep, 0);
    assert_int_equal(p.history, FP8_DEFAULT_HISTORY);
    fp8_plan_clear(&p);
    /* the model as the config gives it is accepted too */
    const char *given = "version: 1\ngpu: cpu\nmodel: contrib/models/tiny-vlm.yaml\nrules:\n"
                        "scaling: {recipe: current}\n";
    if (load("given.yaml", given, &p, &err, path, sizeof path))
        fail_msg("%s", err.msg);
    assert_int_equal(p.current, 1);
    fp8_plan_clear(&p);
    /* a file as `hearth select fp8 --gpu cpu` writes it (docs/select.md) */
    const char *sel =
        "# Selective FP8 policy written by `hearth select fp8` (docs/select.md).\n"
        "version: 1\n"
        "gpu: \"cpu\"\n"
        "model: \"tiny-vlm\"\n"
        "threshold: 1.05\n"
        "# selected for 128 tokens per micro batch\n"
        "rules:\n"
        "  - {component: decoder, kind: fc1, tp: 1, min_tokens: 64, max_tokens: 512, "
        "measured_speedup: 1.5000}\n"
        "  - {component: decoder, kind: expert_fc1, tp: 1, min_tokens: 64, max_tokens: 512, "
        "measured_speedup: 1.5000}\n"
        "keep_bf16: [lm_head, router, decoder.layers.first, decoder.layers.last]\n";
    if (load("select.yaml", sel, &p, &err, path, sizeof path))
        fail_msg("%s", err.msg);
    assert_int_equal(p.n_rules, 2);
    assert_int_equal(p.n_keep, 4);
    assert_true(fp8_plan_uses(&p, D, FP8_EXPERT_FC1, 1, 4, 1, 128));
    assert_false(fp8_plan_uses(&p, D, FP8_EXPERT_FC1, 1, 4, 1, 513));
    assert_false(fp8_plan_uses(&p, D, FP8_FC1, 0, 4, 1, 128));          /* first */
    assert_false(fp8_plan_uses(&p, D, FP8_FC1, 3, 4, 1, 128));          /* last */
    assert_false(fp8_plan_uses(&p, D, FP8_QKV, 1, 4, 1, 128));          /* no rule */
    fp8_plan_clear(&p);
}

typedef struct {
    const char *text;
    const char *at;         /* the error points at the first occurrence of this text */
    const char *key;
    const char *why;        /* a phrase of the reason */
} bad_case;

/* "LINE:COL" of the first occurrence of at in text (1-based). */
static void line_col(const char *text, const char *at, int *line, int *col)
{
    const char *p = strstr(text, at);
    assert_non_null(p);
    *line = 1;
    const char *bol = text;
    for (const char *q = text; q < p; q++)
        if (*q == '\n') {
            (*line)++;
            bol = q + 1;
        }
    *col = (int)(p - bol) + 1;
}

static void test_bad_policies(void **state)
{
    (void)state;
    const bad_case cases[] = {
        { "version: 1\ngpu: NVIDIA H200\nmodel: tiny-vlm\nrules: []\n", "NVIDIA", "gpu",
          "measured on \"NVIDIA H200\", this run is on \"cpu\"" },
        { "version: 1\ngpu: cpu\nmodel: qwen2.5-vl-3b\nrules: []\n", "qwen2.5", "model",
          "for model \"qwen2.5-vl-3b\", this run trains \"tiny-vlm\"" },
        { "version: 2\ngpu: cpu\nmodel: tiny-vlm\nrules: []\n", "2", "version",
          "policy version 1" },
        { "gpu: cpu\nmodel: tiny-vlm\nrules: []\n", "gpu", "version", "missing" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\n", "version", "rules", "missing" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules: []\nthreshhold: 1\n",
          "threshhold", "threshhold", "unknown key" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules:\n"
          "  - {component: decoder, kind: gate_up, tp: 1, min_tokens: 1}\n",
          "gate_up", "rules[0].kind", "decoder has no linear kind \"gate_up\"" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules:\n"
          "  - {component: projector, kind: qkv, tp: 1, min_tokens: 1}\n",
          "qkv", "rules[0].kind", "projector has no linear kind \"qkv\"" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules:\n"
          "  - {component: vision, kind: qkv, tp: 1, min_tokens: 1}\n",
          "vision", "rules[0].component", "unknown component \"vision\"" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules:\n"
          "  - {component: decoder, kind: qkv, tp: 0, min_tokens: 1}\n",
          "0,", "rules[0].tp", "integer >= 1" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules:\n"
          "  - {component: decoder, kind: qkv, tp: 1}\n", "{comp", "rules[0].min_tokens",
          "missing" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules:\n"
          "  - {component: decoder, kind: qkv, tp: 1, min_tokens: 9, max_tokens: 3}\n",
          "3}", "rules[0].max_tokens", "integer >= 9" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules:\n"
          "  - {component: decoder, kind: qkv, tp: 1, min_tokens: 1, speedup: 2}\n",
          "speedup", "rules[0].speedup", "unknown key" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules: []\n"
          "keep_bf16: [lm_head, decoder.layers.x]\n",
          "decoder.layers.x", "keep_bf16[1]", "index, first or last" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules: []\nkeep_bf16: [head]\n",
          "head]", "keep_bf16[0]", "expected a kind" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules: []\nscaling: {recipe: jit}\n",
          "jit", "scaling.recipe", "delayed or current" },
        { "version: 1\ngpu: cpu\nmodel: tiny-vlm\nrules: {a: 1}\n", "{a", "rules",
          "expected a list" },
        { "- 1\n- 2\n", "- 1", "policy", "expected a mapping" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fp8_plan p;
        hearth_err err = { { 0 } };
        char path[600], name[32], want[700];
        snprintf(name, sizeof name, "bad%zu.yaml", i);
        int rc = load(name, cases[i].text, &p, &err, path, sizeof path);
        if (rc != HERR_CONFIG)
            fail_msg("case %zu: rc %d (%s)", i, rc, err.msg);
        int line, col;
        line_col(cases[i].text, cases[i].at, &line, &col);
        snprintf(want, sizeof want, "%s:%d:%d: %s: ", path, line, col, cases[i].key);
        if (strncmp(err.msg, want, strlen(want)) || !strstr(err.msg, cases[i].why))
            fail_msg("case %zu: got \"%s\"; want \"%s...%s\"", i, err.msg, want,
                     cases[i].why);
        assert_null(p.rules);                   /* nothing left to free on failure */
        assert_null(p.keep);
    }
    /* a missing file */
    fp8_plan p;
    hearth_err err = { { 0 } };
    char path[600];
    snprintf(path, sizeof path, "%s/nope.yaml", g_dir);
    assert_int_equal(fp8_policy_load(&p, path, "tiny-vlm", NULL, "cpu", &err), HERR_IO);
    assert_non_null(strstr(err.msg, "precision.fp8_policy"));
    assert_non_null(strstr(err.msg, "nope.yaml"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_policy),
        cmocka_unit_test(test_bad_policies),
    };
    return cmocka_run_group_tests_name("fp8_policy", tests, setup, teardown);
}
