/* test_orch_spec.c - reading experiment specs: a full spec read back field by field, and
 * each class of error with its exact "FILE:LINE:COL: key: what" message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "spec.h"
#include "support/spectest.h"
#include "support/testutil.h"

static unsigned g_seed;

/* The error must be exactly `want` (when want ends in '*', only that prefix). */
static void expect_error(const char *text, const char *want)
{
    spec *s = NULL;
    hearth_err err = {{0}};
    int rc = spec_parse(&s, "t.yaml", text, strlen(text), &err);
    if (rc == 0) {
        spec_free(s);
        fail_msg("should fail with '%s'\n--- spec:\n%s", want, text);
    }
    assert_null(s);
    assert_int_equal(rc, HERR_CONFIG);
    size_t n = strlen(want);
    int ok = want[n - 1] == '*' ? strncmp(err.msg, want, n - 1) == 0 : strcmp(err.msg, want) == 0;
    if (!ok)
        fail_msg("got  '%s'\nwant '%s'\n--- spec:\n%s", err.msg, want, text);
}

static void test_full_spec(void **state)
{
    (void)state;
    const char *text =
        "name: lr-sweep\n"
        "trainer: build/bin/hearth-train\n"
        "base:\n"
        "  model: tiny-vlm\n"
        "  train: {steps: 5, seq_len: 64}\n"
        "resources:\n"
        "  nodes: 2\n"
        "  gpus_per_node: 8\n"
        "  time: \"1-02:03:04\"\n"
        "  partition: gpu\n"
        "  max_concurrent: 4\n"
        "  setup: [module load cuda, echo hi]\n"
        "  sbatch: [--exclusive]\n"
        "  retry_timeout: true\n"
        "matrix:\n"
        "  train.lr: [1e-3, 3e-4, 1e-4]\n"
        "  model.decoder.mrope_section: [[16, 24, 24], [8, 28, 28]]\n"
        "  resources.nodes: [1, 2]\n"
        "  model.preset: [tiny-vlm]\n"
        "zip:\n"
        "  - {parallel.tp: [1, 2], parallel.pp: [2, 1]}\n"
        "include:\n"
        "  - {train.lr: 1e-2, train.seed: 7}\n"
        "exclude:\n"
        "  - {train.lr: 3e-4, resources.nodes: 2}\n"
        "where: 'parallel.tp * parallel.pp <= resources.nodes * 8'\n"
        "repeat: 3\n"
        "retries: 2\n"
        "after: {experiment: warmup, on: any}\n";
    spec *s = spt_parse_ok(text);
    assert_string_equal(s->name, "lr-sweep");
    assert_string_equal(s->trainer, "build/bin/hearth-train");
    assert_non_null(s->base);
    assert_int_equal(s->resources.nodes, 2);
    assert_int_equal(s->resources.gpus_per_node, 8);
    assert_string_equal(s->resources.time, "1-02:03:04");
    assert_string_equal(s->resources.partition, "gpu");
    assert_int_equal(s->resources.max_concurrent, 4);
    assert_int_equal(s->resources.n_setup, 2);
    assert_string_equal(s->resources.setup[0], "module load cuda");
    assert_int_equal(s->resources.n_sbatch, 1);
    assert_int_equal(s->resources.retry_timeout, 1);
    assert_int_equal(s->n_matrix, 4);
    assert_string_equal(s->matrix[0].key, "train.lr");
    assert_int_equal(s->matrix[0].n_values, 3);
    assert_string_equal(s->matrix[0].values[1].text, "3e-4");
    assert_int_equal(s->matrix[0].line, 16);
    assert_int_equal(s->matrix[0].col, 3);
    assert_string_equal(s->matrix[1].values[1].text, "[8, 28, 28]");
    assert_string_equal(s->matrix[3].key, "model");   /* model.preset is canonicalised */
    assert_int_equal(s->n_zip, 1);
    assert_int_equal(s->zip[0].n_axes, 2);
    assert_string_equal(s->zip[0].axes[1].key, "parallel.pp");
    assert_int_equal(s->n_include, 1);
    assert_int_equal(s->include[0].n, 2);
    assert_string_equal(s->include[0].settings[1].key, "train.seed");
    assert_int_equal(s->n_exclude, 1);
    assert_non_null(s->where);
    assert_int_equal(s->where_line, 26);
    assert_int_equal(s->where_col, 9);
    assert_int_equal(s->repeat, 3);
    assert_int_equal(s->retries, 2);
    assert_string_equal(s->after_experiment, "warmup");
    assert_int_equal(s->after_on, SPEC_AFTER_ANY);
    spec_free(s);

    /* defaults */
    s = spt_parse_ok("name: x\n");
    assert_int_equal(s->repeat, 1);
    assert_int_equal(s->retries, 0);
    assert_null(s->base);
    assert_null(s->where);
    assert_int_equal(s->n_matrix, 0);
    assert_int_equal(s->resources.retry_timeout, 0);
    assert_int_equal(s->resources.pack, 0);
    spec_free(s);
    s = spt_parse_ok("name: x\nresources: {retry_timeout: false}\n");
    assert_int_equal(s->resources.retry_timeout, 0);
    spec_free(s);
    s = spt_parse_ok("name: x\nresources: {pack: 3, time: '00:10:00'}\n");
    assert_int_equal(s->resources.pack, 3);
    assert_true(s->resources.gpu_mem == 0);   /* not given: no limit */
    spec_free(s);
}

static void test_unknown_keys(void **state)
{
    (void)state;
    expect_error("name: x\nmatrx:\n  train.lr: [1]\n",
                 "t.yaml:2:1: matrx: unknown key (did you mean 'matrix'?)");
    expect_error("name: x\nfoo: 1\n", "t.yaml:2:1: foo: unknown key");
    expect_error("name: x\ntrain.lr: 1\n",
                 "t.yaml:2:1: train.lr: unknown key (run-config keys go under base: or matrix:)");
    expect_error("name: x\nmatrix:\n  parallel.tpp: [1, 2]\n",
                 "t.yaml:3:3: parallel.tpp: unknown key in matrix (did you mean 'parallel.tp'?)");
    expect_error("name: x\nmatrix:\n  train.learning_rate: [1]\n",
                 "t.yaml:3:3: train.learning_rate: unknown key in matrix*");
    expect_error("name: x\nmatrix:\n  train: [1]\n",
                 "t.yaml:3:3: train: not a run-config value key in matrix*");
    expect_error("name: x\nmatrix:\n  model.decoder.hiden: [64]\n",
                 "t.yaml:3:3: model.decoder.hiden: not a run-config value key in matrix "
                 "(did you mean 'model.decoder.hidden'?)");
    expect_error("name: x\nzip:\n  - {train.lr: [1], trian.seed: [2]}\n",
                 "t.yaml:3:21: trian.seed: unknown key in zip (did you mean 'train.seed'?)");
    expect_error("name: x\ninclude:\n  - train.lr: 1\n    parallel.ttp: 2\n",
                 "t.yaml:4:5: parallel.ttp: unknown key in include (did you mean 'parallel.tp'?)");
    expect_error("name: x\nexclude:\n  - {resources.node: 2}\n",
                 "t.yaml:3:6: resources.node: unknown key in exclude (did you mean "
                 "'resources.nodes'?)");
    expect_error("name: x\nmatrix:\n  resources.setup: [[a]]\n",
                 "t.yaml:3:3: resources.setup: matrix cannot be swept (set it under resources)");
    expect_error("name: x\nresources:\n  gpus_per_nod: 2\n",
                 "t.yaml:3:3: resources.gpus_per_nod: unknown key (did you mean "
                 "'resources.gpus_per_node'?)");
    expect_error("name: x\nafter: {experimnt: a}\n",
                 "t.yaml:2:9: after: unknown key 'experimnt' (did you mean 'experiment'?)");
}

static void test_wrong_types(void **state)
{
    (void)state;
    expect_error("name: x\nrepeat: two\n",
                 "t.yaml:2:9: repeat: expected an integer between 1 and 1000000, got \"two\"");
    expect_error("name: x\nrepeat: 0\n",
                 "t.yaml:2:9: repeat: expected an integer between 1 and 1000000, got \"0\"");
    expect_error("name: x\nretries: -1\n",
                 "t.yaml:2:10: retries: expected an integer between 0 and 1000, got \"-1\"");
    expect_error("name: [a]\n", "t.yaml:1:7: name: expected a string, got a list");
    expect_error("name: 'a b'\n", "t.yaml:1:7: name: must be 1 to 64 letters*");
    expect_error("name: ../etc\n", "t.yaml:1:7: name: must be 1 to 64 letters*");
    expect_error("trainer: x\n", "t.yaml: name: required, but not given");
    expect_error("name: x\nbase: [1]\n",
                 "t.yaml:2:7: base: expected a run config (a mapping), got a list");
    expect_error("name: x\nmatrix: [1, 2]\n",
                 "t.yaml:2:9: matrix: expected a mapping of dotted keys to lists, got a list");
    expect_error("name: x\nmatrix:\n  train.lr: 1e-3\n",
                 "t.yaml:3:13: train.lr: expected a non-empty list of values in matrix, "
                 "got \"1e-3\"");
    expect_error("name: x\nmatrix:\n  train.lr: []\n",
                 "t.yaml:3:13: train.lr: expected a non-empty list of values in matrix, "
                 "got an empty list");
    expect_error("name: x\nmatrix:\n  parallel.tp: [1, two]\n",
                 "t.yaml:3:20: parallel.tp: expected an integer, got \"two\"");
    expect_error("name: x\nmatrix:\n  parallel.dp: [auto, 0]\n",
                 "t.yaml:3:23: parallel.dp: must be between 1 and 1048576, got 0");
    expect_error("name: x\nmatrix:\n  precision.fp8: [off, sometimes]\n",
                 "t.yaml:3:24: precision.fp8: expected one of off|all|selective, got "
                 "\"sometimes\"");
    expect_error("name: x\nmatrix:\n  model.decoder.mrope_section: [16, 24, 24]\n",
                 "t.yaml:3:33: model.decoder.mrope_section: expected a list of 3 integers, got "
                 "\"16\" (each matrix value of a list key is a list: write [[a, b, c], ...])");
    expect_error("name: x\nmatrix:\n  model: [tiny-vlm, [a]]\n",
                 "t.yaml:3:21: model: expected a preset name or path, got a list");
    expect_error("name: x\ninclude:\n  - {train.steps: 1.5}\n",
                 "t.yaml:3:19: train.steps: expected an integer, got \"1.5\"");
    expect_error("name: x\ninclude: [{}]\n", "t.yaml:2:11: include[0]: expected at least one key");
    expect_error("name: x\nexclude: {a: 1}\n",
                 "t.yaml:2:10: exclude: expected a list of mappings, got a mapping");
    expect_error("name: x\nresources:\n  nodes: 0\n",
                 "t.yaml:3:10: resources.nodes: expected an integer >= 1, got \"0\"");
    expect_error("name: x\nresources:\n  time: '25:61:00:00'\n",
                 "t.yaml:3:9: resources.time: expected a Slurm time*");
    expect_error("name: x\nresources:\n  retry_timeout: sometimes\n",
                 "t.yaml:3:18: resources.retry_timeout: expected true or false, got "
                 "\"sometimes\"");
    expect_error("name: x\nresources:\n  pack: 0\n",
                 "t.yaml:3:9: resources.pack: expected an integer >= 1, got \"0\"");
    expect_error("name: x\nresources:\n  pack: many\n",
                 "t.yaml:3:9: resources.pack: expected an integer >= 1, got \"many\"");
    expect_error("name: x\nmatrix:\n  resources.pack: [1, 2]\n", "t.yaml:3:3: resources.pack: unknown key in matrix");
    expect_error("name: x\nresources:\n  gpu_mem: 0\n",
                 "t.yaml:3:12: resources.gpu_mem: expected a number of GiB > 0, got \"0\"");
    expect_error("name: x\nresources:\n  gpu_mem: lots\n",
                 "t.yaml:3:12: resources.gpu_mem: expected a number of GiB > 0, got \"lots\"");
    expect_error("name: x\nmatrix:\n  resources.gpu_mem: [40, 80]\n",
                 "t.yaml:3:3: resources.gpu_mem: unknown key in matrix");
    expect_error("name: x\nresources:\n  retry_timeout: 3\n",
                 "t.yaml:3:18: resources.retry_timeout: expected true or false, got \"3\"");
    expect_error("name: x\nresources:\n  setup: echo hi\n",
                 "t.yaml:3:10: resources.setup: expected a list of strings, got \"echo hi\"");
    expect_error("name: x\nresources:\n  setup: [[a]]\n",
                 "t.yaml:3:11: resources.setup: expected a string, got a list");
    expect_error("name: x\nmatrix:\n  resources.time: ['1:00:00', soon]\n",
                 "t.yaml:3:31: resources.time: expected a Slurm time*");
    expect_error("name: x\nafter: {experiment: a, on: maybe}\n",
                 "t.yaml:2:28: after.on: expected ok or any, got \"maybe\"");
    expect_error("name: x\nafter: {on: ok}\n",
                 "t.yaml:2:8: after.experiment: required, but not given");
    expect_error("name: x\nwhere: 3\n",
                 "t.yaml:2:8: where: expected a condition (true/false), got a number");
    expect_error("name: x\nwhere: parallel.tp + 1\n",
                 "t.yaml:2:20: where: expected a condition (true/false), got a number");
    expect_error("name: x\nwhere: [a]\n",
                 "t.yaml:2:8: where: expected an expression (a string), got a list");
    expect_error("name: x\nmatrix: {train.lr: [1]}\n: x\n", "t.yaml:*");   /* YAML syntax */
}

static void test_zip_and_duplicates(void **state)
{
    (void)state;
    expect_error("name: x\nzip:\n  - train.lr: [1, 2, 3]\n    train.seed: [1, 2]\n",
                 "t.yaml:4:5: zip[0]: train.seed has 2 values but train.lr has 3; the lists of "
                 "a zip group must have equal lengths");
    expect_error("name: x\nzip:\n  - {train.lr: [1]}\n  - {train.seed: [1], parallel.tp: [1, 2]}\n",
                 "t.yaml:4:23: zip[1]: parallel.tp has 2 values but train.seed has 1; the lists "
                 "of a zip group must have equal lengths");
    expect_error("name: x\nmatrix:\n  train.lr: [1]\nzip:\n  - {train.lr: [1]}\n",
                 "t.yaml:5:6: train.lr: already swept at line 3");
    expect_error("name: x\nmatrix:\n  model: [a]\n  model.preset: [b]\n",
                 "t.yaml:4:3: model.preset: already swept at line 3");
    expect_error("name: x\ninclude:\n  - {model: a, model.preset: b}\n",
                 "t.yaml:3:16: model.preset: given twice in include[0]");
    expect_error("name: x\nzip: [[1]]\n",
                 "t.yaml:2:7: zip[0]: expected a mapping of dotted keys to lists, got a list");
}

static void test_where_errors(void **state)
{
    (void)state;
    /* plain scalar: the expression starts at the scalar */
    expect_error("name: x\nwhere: parallel.tp > 1 and (train.lr < 1\n",
                 "t.yaml:2:41: where: expected ')' to close '(' at column 21, got end of "
                 "expression");
    /* quoted: one column further */
    expect_error("name: x\nwhere: \"parallel.tp >> 1\"\n",
                 "t.yaml:2:22: where: expected a value, got '>'");
    expect_error("name: x\nwhere:   'parallel.tp = 1'\n",
                 "t.yaml:2:23: where: '=' is not an operator, use '=='");
    /* literal block: lines of the expression are lines of the file */
    expect_error("name: x\nwhere: |\n    parallel.tp > 1 and\n    train.lr <\n",
                 "t.yaml:4:15: where: expected a value, got end of expression");
    expect_error("name: x\nwhere: |\n  parallel.tp > 1 and\n    train.lr < 1 and ranks ==\n",
                 "t.yaml:4:30: where: expected a value, got end of expression");
    /* unknown keys, at their own column */
    expect_error("name: x\nwhere: 'parallel.tp > 1 and parallel.tpp < 4'\n",
                 "t.yaml:2:29: where: unknown key 'parallel.tpp' (did you mean 'parallel.tp'?)");
    expect_error("name: x\nwhere: resources.nodez > 1\n",
                 "t.yaml:2:8: where: unknown key 'resources.nodez' (did you mean "
                 "'resources.nodes'?)");
    expect_error("name: x\nwhere: '  '\n", "t.yaml:2:9: where: empty expression");
    /* types are checked against the keys' types when the spec is read */
    expect_error("name: x\nwhere: parallel.tp == 'x'\n",
                 "t.yaml:2:20: where: '==' cannot compare a number with a string");
    expect_error("name: x\nwhere: precision.fp8 > 1\n",
                 "t.yaml:2:22: where: '>' cannot compare a string with a number");
    expect_error("name: x\nwhere: parallel.sp and train.lr\n",
                 "t.yaml:2:20: where: 'and' needs a condition (true/false), got a number");
    expect_error("name: x\nwhere: resources.partition * 2 > 1\n",
                 "t.yaml:2:28: where: '*' needs numbers, got string and number");
    spec *s = spt_parse_ok("name: x\nwhere: model == 'tiny-vlm' and not parallel.sp and "
                       "model.decoder.moe.experts % parallel.ep == 0\n");
    spec_free(s);
}

static void test_time_format(void **state)
{
    (void)state;
    unsigned s = g_seed;
    for (int i = 0; i < 200; i++) {
        s = s * 1103515245u + 12345u;
        int64_t d = (s >> 8) % 5, h = (s >> 12) % 24, m = (s >> 18) % 60, sec = (s >> 24) % 60;
        char buf[64];
        int64_t got = -1;
        snprintf(buf, sizeof buf, "%lld-%02lld:%02lld:%02lld", (long long)d, (long long)h,
                 (long long)m, (long long)sec);
        if (d + h + m + sec == 0)
            continue;
        assert_int_equal(spec_time_seconds(buf, &got), 0);
        assert_int_equal(got, ((d * 24 + h) * 60 + m) * 60 + sec);
        snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)h, (long long)m,
                 (long long)sec);
        if (h + m + sec) {
            assert_int_equal(spec_time_seconds(buf, &got), 0);
            assert_int_equal(got, (h * 60 + m) * 60 + sec);
        }
        snprintf(buf, sizeof buf, "%lld:%02lld", (long long)m, (long long)sec);
        if (m + sec) {
            assert_int_equal(spec_time_seconds(buf, &got), 0);
            assert_int_equal(got, m * 60 + sec);
        }
        snprintf(buf, sizeof buf, "%lld-%lld", (long long)d, (long long)h);
        if (d + h) {
            assert_int_equal(spec_time_seconds(buf, &got), 0);
            assert_int_equal(got, (d * 24 + h) * 3600);
        }
    }
    assert_int_equal(spec_time_seconds("90", NULL), 0);
    static const char *bad[] = {"", "0", "1:2:3:4", "a", "1-", "-1", "1::2", "1:", "1 h",
                                "00:00:00", "1-2-3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (spec_time_seconds(bad[i], NULL) == 0)
            fail_msg("'%s' should not be a time", bad[i]);
}

static void test_key_known(void **state)
{
    (void)state;
    char hint[200];
    static const char *good[] = {"train.lr", "parallel.encoder.strategy", "model",
                                 "model.preset", "model.decoder.heads",
                                 "model.decoder.moe.experts", "model.encoder.bias",
                                 "resources.nodes", "resources.time", "ranks", "device"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (!spec_key_known(good[i], hint, sizeof hint))
            fail_msg("'%s' should be known", good[i]);
    static const char *bad[] = {"train", "parallel.encoder", "resources.setup", "model.decoder",
                                "resources", "decoder.heads", "train.lr.x", "'; DROP"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (spec_key_known(bad[i], hint, sizeof hint))
            fail_msg("'%s' should be unknown", bad[i]);
    assert_true(spec_key_known("train.lrr", hint, sizeof hint) == 0);
    assert_string_equal(hint, " (did you mean 'train.lr'?)");
}

/* spec_load reads files and reports unreadable ones. */
static void test_load_file(void **state)
{
    (void)state;
    char path[] = "/tmp/hearth-spec-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "name: filed\nmatrix:\n  train.seed: [1, 2]\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    spec *s = NULL;
    hearth_err err = {{0}};
    assert_int_equal(spec_load(&s, path, &err), 0);
    assert_string_equal(s->name, "filed");
    assert_string_equal(s->file, path);
    spec_free(s);
    unlink(path);
    assert_int_equal(spec_load(&s, path, &err), HERR_IO);
    assert_non_null(strstr(err.msg, path));
}

int main(void)
{
    g_seed = tu_seed_noted();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_spec),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_zip_and_duplicates),
        cmocka_unit_test(test_where_errors),
        cmocka_unit_test(test_time_format),
        cmocka_unit_test(test_key_known),
        cmocka_unit_test(test_load_file),
    };
    return cmocka_run_group_tests_name("orch_spec", tests, NULL, NULL);
}
