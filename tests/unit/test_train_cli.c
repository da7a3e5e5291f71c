/* test_train_cli.c - hearth-train's argument parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"

#define ARGV(...) ((char *[]){ "hearth-train", __VA_ARGS__, NULL })
#define ARGC(...) ((int)(sizeof((char *[]){ "hearth-train", __VA_ARGS__ }) / sizeof(char *)))
#define PARSE(a, err, ...) cli_parse(a, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), err)

static void test_full(void **state)
{
    (void)state;
    cli_args a;
    hearth_err err = { { 0 } };
    assert_int_equal(PARSE(&a, &err, "--config", "run.yaml", "--set", "train.steps=7",
                           "--out=dir/x", "--set=train.lr=1e-3", "--set", "model.name=a=b"),
                     0);
    assert_string_equal(a.config, "run.yaml");
    assert_string_equal(a.out_dir, "dir/x");
    assert_int_equal(a.n_ovr, 3);
    assert_string_equal(a.ovr[0].key, "train.steps");
    assert_string_equal(a.ovr[0].value, "7");
    assert_string_equal(a.ovr[1].key, "train.lr");
    assert_string_equal(a.ovr[1].value, "1e-3");
    assert_string_equal(a.ovr[2].key, "model.name");   /* the first '=' splits */
    assert_string_equal(a.ovr[2].value, "a=b");
    assert_false(a.help || a.version);
    cli_args_free(&a);
}

static void test_set_only(void **state)
{
    (void)state;
    cli_args a;
    hearth_err err = { { 0 } };
    assert_int_equal(PARSE(&a, &err, "--set", "model=tiny-vlm", "--out", "d"), 0);
    assert_null(a.config);
    assert_int_equal(a.n_ovr, 1);
    cli_args_free(&a);
}

static void expect_error(int rc, const hearth_err *err, const char *needle)
{
    assert_int_equal(rc, HERR_CONFIG);
    if (!strstr(err->msg, needle))
        fail_msg("message '%s' lacks '%s'", err->msg, needle);
}

static void test_errors(void **state)
{
    (void)state;
    cli_args a;
    hearth_err err = { { 0 } };
    expect_error(PARSE(&a, &err, "--config", "run.yaml"), &err, "--out");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--out", "d"), &err, "--config");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--out", "d", "--set", "train.steps"), &err,
                 "--set train.steps: expected KEY=VALUE");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--out", "d", "--set", "=3"), &err, "--set =3");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--out", "d", "--frobnicate"), &err, "--frobnicate: unknown option");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--out", "d", "stray"), &err, "stray: unexpected argument");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--config", "a", "--out", "d", "--config", "b"), &err,
                 "given twice");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--set", "model=x", "--out"), &err, "--out: missing value");
    cli_args_free(&a);
    /* a prefix of an option is not the option */
    expect_error(PARSE(&a, &err, "--set", "model=x", "--outdir", "d"), &err, "unknown option");
    cli_args_free(&a);
}

/* --plan-memory needs a config (or --set) but no --out, and takes no checkpoint options. */
static void test_plan_memory(void **state)
{
    (void)state;
    cli_args a;
    hearth_err err = { { 0 } };
    assert_int_equal(PARSE(&a, &err, "--plan-memory", "--config", "run.yaml"), 0);
    assert_true(a.plan_memory);
    assert_null(a.out_dir);
    cli_args_free(&a);
    assert_int_equal(PARSE(&a, &err, "--set", "model=tiny-vlm", "--plan-memory", "--out", "d"),
                     0);
    assert_true(a.plan_memory);
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--plan-memory"), &err, "--config");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--plan-memory", "--config", "r", "--resume", "d"), &err,
                 "--plan-memory: takes only");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--plan-memory", "--check-bootstrap"), &err,
                 "--check-bootstrap");
    cli_args_free(&a);
}

/* --resume alone gives the config (the checkpoint's); --force replaces an earlier run's
 * results and is no option beside --resume, --plan-memory or --check-bootstrap. */
static void test_resume_force(void **state)
{
    (void)state;
    cli_args a;
    hearth_err err = { { 0 } };
    assert_int_equal(PARSE(&a, &err, "--resume", "runs/a", "--out", "runs/a"), 0);
    assert_null(a.config);
    assert_string_equal(a.resume, "runs/a");
    assert_false(a.force);
    cli_args_free(&a);
    assert_int_equal(PARSE(&a, &err, "--resume", "runs/a", "--out", "runs/a", "--set",
                           "train.checkpoint_every=5"), 0);
    assert_int_equal(a.n_ovr, 1);
    cli_args_free(&a);
    assert_int_equal(PARSE(&a, &err, "--config", "run.yaml", "--out", "d", "--force"), 0);
    assert_true(a.force);
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--config", "r", "--out", "d", "--force", "--resume", "d"),
                 &err, "--force: not with --resume");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--out", "d", "--force"), &err, "--config: missing");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--plan-memory", "--config", "r", "--force"), &err,
                 "--plan-memory: takes only");
    cli_args_free(&a);
    expect_error(PARSE(&a, &err, "--check-bootstrap", "--force"), &err,
                 "--check-bootstrap: takes no other option");
    cli_args_free(&a);
}

static void test_help_version(void **state)
{
    (void)state;
    cli_args a;
    hearth_err err = { { 0 } };
    assert_int_equal(PARSE(&a, &err, "--help"), 0);
    assert_true(a.help);
    cli_args_free(&a);
    assert_int_equal(PARSE(&a, &err, "--version"), 0);
    assert_true(a.version);
    cli_args_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_set_only),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_plan_memory),
        cmocka_unit_test(test_resume_force),
        cmocka_unit_test(test_help_version),
    };
    return cmocka_run_group_tests_name("train_cli", tests, NULL, NULL);
}
