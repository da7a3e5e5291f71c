/* test_train_outputs.c - metrics.jsonl lines, result.json, atomic writes, the summary
 * statistics.  Random values from a clock seed (printed; HEARTH_TEST_SEED replays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "outputs.h"
#include "summary.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}


static train_step_stats random_stats(int step)
{
    train_step_stats st;
    memset(&st, 0, sizeof st);
    st.step = step;
    st.loss = tu_uniform(&g_rng) * 10;
    st.grad_norm = tu_uniform(&g_rng) * 5;
    st.lr = tu_uniform(&g_rng) * 1e-3;
    st.step_ms = 1 + tu_uniform(&g_rng) * 100;
    st.encoder_ms = tu_uniform(&g_rng) * 10;
    st.decoder_ms = tu_uniform(&g_rng) * 10;
    st.tokens = 1 + (long)(tu_next(&g_rng) % 100000);
    st.patches = (long)(tu_next(&g_rng) % 1000);
    st.patches_sq = (double)st.patches * (double)(tu_next(&g_rng) % 100);
    return st;
}

static void check_keys(json_t *o, const char *const *keys, int n)
{
    assert_true(json_is_object(o));
    assert_int_equal(json_object_size(o), n);
    int i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        (void)v;
        assert_string_equal(k, keys[i]);   /* DESIGN.md's order */
        i++;
    }
}

static const char *const metric_keys[] = {
    "step", "loss", "grad_norm", "lr", "step_ms", "tokens", "tokens_per_s",
    "encoder_ms", "decoder_ms", "peak_mem_bytes",
};

/* A metrics line has exactly DESIGN.md's keys, and reals read back bit for bit. */
static void test_metrics_line(void **state)
{
    (void)state;
    for (int t = 0; t < 50; t++) {
        train_step_stats st = random_stats((int)(tu_next(&g_rng) % 100000));
        long long peak = (long long)(tu_next(&g_rng) >> 20);
        char *s = metrics_line(&st, peak);
        assert_non_null(s);
        assert_null(strchr(s, '\n'));
        json_error_t je;
        json_t *o = json_loads(s, 0, &je);
        assert_non_null(o);
        check_keys(o, metric_keys, 10);
        assert_int_equal(json_integer_value(json_object_get(o, "step")), st.step);
        double loss = json_real_value(json_object_get(o, "loss"));
        if (memcmp(&loss, &st.loss, sizeof loss))
            fail_msg("loss %.17g read back as %.17g from %s", st.loss, loss, s);
        assert_true(json_real_value(json_object_get(o, "grad_norm")) == st.grad_norm);
        assert_int_equal(json_integer_value(json_object_get(o, "tokens")), st.tokens);
        assert_int_equal(json_integer_value(json_object_get(o, "peak_mem_bytes")), peak);
        double tps = json_real_value(json_object_get(o, "tokens_per_s"));
        assert_true(fabs(tps - st.tokens / (st.step_ms / 1e3)) <= 1e-9 * tps);
        json_decref(o);
        free(s);
    }
    /* NaN and inf become null */
    train_step_stats st = random_stats(3);
    st.loss = NAN;
    st.grad_norm = INFINITY;
    char *s = metrics_line(&st, 1);
    assert_non_null(s);
    assert_non_null(strstr(s, "\"loss\":null"));
    assert_non_null(strstr(s, "\"grad_norm\":null"));
    free(s);
}

static void test_percentile(void **state)
{
    (void)state;
    for (int t = 0; t < 100; t++) {
        int n = 1 + (int)(tu_next(&g_rng) % 50);
        double *a = malloc((size_t)n * sizeof *a);
        assert_non_null(a);
        for (int i = 0; i < n; i++)
            a[i] = (i ? a[i - 1] : 0) + tu_uniform(&g_rng);   /* sorted */
        assert_true(summary_percentile(a, n, 0) == a[0]);
        assert_true(summary_percentile(a, n, 1) == a[n - 1]);
        double med = n % 2 ? a[n / 2] : 0.5 * (a[n / 2 - 1] + a[n / 2]);
        assert_true(fabs(summary_percentile(a, n, 0.5) - med) < 1e-12);
        double q = tu_uniform(&g_rng);
        double p = summary_percentile(a, n, q);
        int k = (int)floor(q * (n - 1));
        assert_true(p >= a[k] && p <= a[k + 1 < n ? k + 1 : k]);
        free(a);
    }
    assert_true(isnan(summary_percentile(NULL, 0, 0.5)));
}

/* Throughput counts steps from measure_from; with none that far, every step. */
static void test_summary(void **state)
{
    (void)state;
    int n = 3 + (int)(tu_next(&g_rng) % 30), from = 1 + (int)(tu_next(&g_rng) % (uint64_t)n);
    shape_flops fl = { .decoder_per_token = 1e6 * tu_uniform(&g_rng), .encoder_per_patch = 1e5,
                       .encoder_per_patch_sq = 1e3 * tu_uniform(&g_rng),
                       .projector_per_patch = 1e4 };
    run_summary s;
    summary_init(&s, from, &fl);
    hearth_err err = { { 0 } };
    double tokens = 0, ms = 0, flops = 0;
    for (int i = 0; i < n; i++) {
        train_step_stats st = random_stats(i + 1);
        assert_int_equal(summary_add(&s, &st, &err), 0);
        if (i + 1 >= from) {
            tokens += st.tokens;
            ms += st.step_ms;
            flops += st.tokens * fl.decoder_per_token + st.patches * 1.1e5 +
                     st.patches_sq * fl.encoder_per_patch_sq;
        }
    }
    summary_numbers num;
    summary_compute(&s, &num);
    assert_int_equal(num.steps, n);
    assert_int_equal(num.measured, n - from + 1);
    assert_true(fabs(num.tokens_per_s - tokens / (ms / 1e3)) <= 1e-9 * num.tokens_per_s);
    assert_true(fabs(num.flops_per_token - flops / tokens) <= 1e-9 * num.flops_per_token);
    assert_true(num.step_ms_p10 <= num.step_ms_median && num.step_ms_median <= num.step_ms_p90);
    summary_free(&s);

    summary_init(&s, n + 5, &fl);     /* shorter than its warm-up: every step counts */
    for (int i = 0; i < n; i++) {
        train_step_stats st = random_stats(i + 1);
        assert_int_equal(summary_add(&s, &st, &err), 0);
    }
    summary_compute(&s, &num);
    assert_int_equal(num.measured, n);
    assert_false(isnan(num.step_ms_median));
    summary_free(&s);

    summary_init(&s, 1, &fl);         /* no step at all */
    summary_compute(&s, &num);
    assert_int_equal(num.steps, 0);
    assert_true(isnan(num.final_loss) && isnan(num.tokens_per_s));
    summary_free(&s);
}

static const char *const result_keys[] = {
    "config_hash", "steps", "step_ms_median", "step_ms_p10", "step_ms_p90", "tokens_per_s",
    "tokens_per_s_per_gpu", "flops_per_token", "mfu", "peak_mem_bytes", "final_loss",
    "exit_status", "device", "device_count", "nodes", "versions", "memory",
};

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 16);
    if (buf)
        buf[fread(buf, 1, (1 << 16) - 1, f)] = 0;
    fclose(f);
    return buf;
}

/* result.json: exactly the keys, written atomically into a directory made on demand. */
static void test_result_file(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/hearth-test-out.XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char dir[512];
    snprintf(dir, sizeof dir, "%s/a/b/run", tmpl);
    hearth_err err = { { 0 } };
    assert_int_equal(outputs_mkdir_p(dir, &err), 0);
    assert_int_equal(outputs_mkdir_p(dir, &err), 0);   /* again: fine */

    run_result r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < 64; i++)
        r.config_hash[i] = "0123456789abcdef"[tu_next(&g_rng) % 16];
    r.num.steps = (int)(tu_next(&g_rng) % 1000);
    r.num.step_ms_median = tu_uniform(&g_rng);
    r.num.step_ms_p10 = r.num.step_ms_p90 = r.num.tokens_per_s = tu_uniform(&g_rng);
    r.num.flops_per_token = 1e9;
    r.num.final_loss = NAN;
    r.tokens_per_s_per_gpu = r.num.tokens_per_s;
    r.mfu = NAN;
    r.peak_mem_bytes = outputs_peak_mem_bytes();
    assert_true(r.peak_mem_bytes > 0);
    r.exit_status = tu_next(&g_rng) % 2 ? "done" : "diverged";
    r.device = "cpu";
    r.device_count = r.nodes = 1;
    assert_int_equal(result_write(dir, &r, &err), 0);

    char path[600];
    snprintf(path, sizeof path, "%s/result.json", dir);
    char *text = read_all(path);
    assert_non_null(text);
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    assert_non_null(o);
    check_keys(o, result_keys, 17);
    assert_string_equal(json_string_value(json_object_get(o, "config_hash")), r.config_hash);
    assert_int_equal(json_integer_value(json_object_get(o, "steps")), r.num.steps);
    assert_true(json_is_null(json_object_get(o, "mfu")));
    assert_true(json_is_null(json_object_get(o, "final_loss")));
    assert_string_equal(json_string_value(json_object_get(o, "exit_status")), r.exit_status);
    json_t *v = json_object_get(o, "versions");
    assert_true(json_is_object(v));
    assert_non_null(json_object_get(v, "git_describe"));
    assert_true(json_is_null(json_object_get(v, "cuda")));
    assert_true(json_is_null(json_object_get(v, "cublaslt")));
    assert_true(json_is_null(json_object_get(v, "nccl")));
    assert_true(json_is_null(json_object_get(o, "memory")));   /* no figures given */
    json_decref(o);
    free(text);

    /* with figures: the memory object carries them (random, read back exactly) */
    run_memory mem;
    memset(&mem, 0, sizeof mem);
    mem.peak.total = (int64_t)(tu_next(&g_rng) >> 12);
    mem.peak.rank = (int)(tu_next(&g_rng) % 64);
    mem.peak.p = (int)(tu_next(&g_rng) % 8);
    for (int k = 0; k < MEM_CATEGORIES; k++)
        mem.peak.bytes[k] = (int64_t)(tu_next(&g_rng) >> 20);
    mem.peak.host_bytes = (int64_t)(tu_next(&g_rng) >> 20);
    mem.process_predicted = (long long)(tu_next(&g_rng) >> 12);
    mem.measured_bytes = outputs_peak_mem_bytes();
    mem.measured_source = "test";
    r.memory = &mem;
    r.cuda_version = "13.0";   /* a GPU run's versions and MFU are written as given */
    r.cublaslt_version = "13.1.0";
    r.mfu = tu_uniform(&g_rng);
    assert_int_equal(result_write(dir, &r, &err), 0);
    text = read_all(path);
    assert_non_null(text);
    o = json_loads(text, 0, &je);
    assert_non_null(o);
    check_keys(o, result_keys, 17);
    v = json_object_get(o, "versions");
    assert_string_equal(json_string_value(json_object_get(v, "cuda")), "13.0");
    assert_string_equal(json_string_value(json_object_get(v, "cublaslt")), "13.1.0");
    assert_true(json_real_value(json_object_get(o, "mfu")) == r.mfu);
    json_t *mo = json_object_get(o, "memory");
    assert_true(json_is_object(mo));
    assert_int_equal(json_object_size(mo), 8);
    assert_int_equal(json_integer_value(json_object_get(mo, "predicted_peak_bytes")),
                     mem.peak.total);
    assert_int_equal(json_integer_value(json_object_get(mo, "predicted_peak_rank")),
                     mem.peak.rank);
    assert_int_equal(json_integer_value(json_object_get(mo, "predicted_peak_stage")),
                     mem.peak.p);
    assert_int_equal(json_integer_value(json_object_get(mo, "predicted_host_bytes")),
                     mem.peak.host_bytes);
    assert_int_equal(json_integer_value(json_object_get(mo, "predicted_process_bytes")),
                     mem.process_predicted);
    assert_int_equal(json_integer_value(json_object_get(mo, "measured_peak_bytes")),
                     mem.measured_bytes);
    assert_string_equal(json_string_value(json_object_get(mo, "measured_source")), "test");
    json_t *cat = json_object_get(mo, "predicted_by_category");
    assert_int_equal(json_object_size(cat), MEM_CATEGORIES);
    for (int k = 0; k < MEM_CATEGORIES; k++)
        assert_int_equal(json_integer_value(json_object_get(cat, mem_category_name(
                             (mem_category)k))), mem.peak.bytes[k]);
    json_decref(o);
    free(text);

    /* no temp file left behind; a rewrite replaces the content */
    snprintf(path, sizeof path, "%s/.result.json.tmp", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(outputs_write_atomic(dir, "result.json", "{}\n", &err), 0);
    snprintf(path, sizeof path, "%s/result.json", dir);
    text = read_all(path);
    assert_string_equal(text, "{}\n");
    free(text);
    unlink(path);

    /* a file where the directory should be is an error */
    snprintf(path, sizeof path, "%s/file", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_not_equal(outputs_mkdir_p(path, &err), 0);
    unlink(path);
    for (int up = 0; up < 3; up++) {     /* run, b, a */
        rmdir(dir);
        *strrchr(dir, '/') = '\0';
    }
    assert_int_equal(rmdir(tmpl), 0);
}

/* What makes a directory one that holds an earlier run's results: a non-empty
 * result.json, metrics.jsonl or checkpoints/latest; empty files (a run that died before
 * its first step) and other files do not. */
static void test_earlier_results(void **state)
{
    (void)state;
    char root[512], dir[600], path[700];
    assert_int_equal(tu_tmpdir_make(root, sizeof root, "earlier"), 0);
    snprintf(dir, sizeof dir, "%s/run", root);
    assert_null(outputs_earlier_results(dir));            /* missing */
    hearth_err err = { { 0 } };
    assert_int_equal(outputs_mkdir_p(dir, &err), 0);
    assert_null(outputs_earlier_results(dir));            /* empty */
    static const char *const other[] = { "train.log", "config.json", "stdout.log" };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        assert_int_equal(outputs_write_atomic(dir, other[i], "x\n", &err), 0);
    assert_int_equal(outputs_write_atomic(dir, "metrics.jsonl", "", &err), 0);
    assert_int_equal(outputs_write_atomic(dir, "result.json", "", &err), 0);
    assert_null(outputs_earlier_results(dir));
    static const char *const results[] = { "checkpoints/latest", "metrics.jsonl",
                                           "result.json" };
    for (size_t i = 0; i < sizeof results / sizeof results[0]; i++) {
        if (i == 0) {
            snprintf(path, sizeof path, "%s/checkpoints", dir);
            assert_int_equal(outputs_mkdir_p(path, &err), 0);
        }
        snprintf(path, sizeof path, "%s/%s", dir, results[i]);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("step-00000001\n", f);
        fclose(f);
        /* result.json is named before metrics.jsonl before checkpoints/latest */
        assert_string_equal(outputs_earlier_results(dir), results[i]);
    }
    assert_int_equal(tu_tmpdir_remove(root), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_metrics_line, setup_seed),
        cmocka_unit_test_setup(test_percentile, setup_seed),
        cmocka_unit_test_setup(test_summary, setup_seed),
        cmocka_unit_test_setup(test_result_file, setup_seed),
        cmocka_unit_test_setup(test_earlier_results, setup_seed),
    };
    return cmocka_run_group_tests_name("train_outputs", tests, NULL, NULL);
}
