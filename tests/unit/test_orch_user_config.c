/* test_orch_user_config.c - the user's defaults: random config files (flat and sectioned
 * keys, random values) read back with FILE:LINE:COL sources; random layers of file,
 * environment and command line resolve to the highest one; errors name the file, line,
 * column and key; "~/" expands; a missing file gives the built-in defaults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "strbuf.h"
#include "support/testutil.h"
#include "support/tmpdir.h"
#include "user_config.h"

static void add(strbuf *b, const char *s)
{
    assert_int_equal(strbuf_add(b, s, strlen(s)), 0);
}

/* A random value that YAML reads as a plain string: letters, digits, / . _ - and :. */
static void random_value(tu_rng *r, ucfg_key k, char *out, size_t size)
{
    static const char *const backends[] = { "local", "slurm", "slurmrest" };
    if (k == UCFG_BACKEND) {
        snprintf(out, size, "%s", backends[tu_randint(r, 0, 3)]);
        return;
    }
    static const char cs[] = "abcdefghijklmnopqrstuvwxyz0123456789/._-";
    size_t n = (size_t)tu_randint(r, 1, 24);
    out[0] = (char)('a' + tu_randint(r, 0, 26));   /* not ~ or a digit-only number */
    for (size_t i = 1; i < n && i + 1 < size; i++)
        out[i] = cs[tu_randint(r, 0, (int)sizeof cs - 1)];
    out[n < size ? n : size - 1] = 0;
}

static void clear_env(void)
{
    for (int k = 0; k < UCFG_N; k++)
        unsetenv(ucfg_env((ucfg_key)k));
}

/* Writes a config with the keys in `set` (values vals[k]), as "slurm: {partition: ...}"
 * sections or as top-level entries; line[k] receives the line of k's value. */
static void write_config(tu_rng *r, strbuf *b, const int *set, char vals[][64], int *line)
{
    int ln = 1;
    int sectioned = tu_randint(r, 0, 2);
    const char *open = NULL;
    add(b, "# a config file\n");
    ln++;
    for (int k = 0; k < UCFG_N; k++) {
        if (!set[k])
            continue;
        const char *name = ucfg_name((ucfg_key)k), *dot = strchr(name, '.');
        char buf[1024];
        if (dot && sectioned) {
            char sec[32];
            snprintf(sec, sizeof sec, "%.*s", (int)(dot - name), name);
            if (!open || strcmp(open, sec)) {
                snprintf(buf, sizeof buf, "%s:\n", sec);
                add(b, buf);
                ln++;
                open = strcmp(sec, "slurm") == 0 ? "slurm" : "slurmrest";
            }
            snprintf(buf, sizeof buf, "  %s: %s\n", dot + 1, vals[k]);
        } else {
            /* Keys come in table order, flat ones first: no flat key follows a section. */
            snprintf(buf, sizeof buf, "%s: %s\n", name, vals[k]);
            open = NULL;
        }
        add(b, buf);
        line[k] = ln++;
    }
}

static void test_random_files_and_layers(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh_noted();
    for (int iter = 0; iter < 400; iter++) {
        clear_env();
        int in_file[UCFG_N] = { 0 }, in_env[UCFG_N] = { 0 }, line[UCFG_N] = { 0 };
        char fv[UCFG_N][64], ev[UCFG_N][64], cv[UCFG_N][64];
        for (int k = 0; k < UCFG_N; k++) {
            /* Flat keys first, sections last, so that the file's order is valid YAML. */
            in_file[k] = tu_randint(&r, 0, 2);
            in_env[k] = tu_randint(&r, 0, 3) == 0;
            random_value(&r, (ucfg_key)k, fv[k], sizeof fv[k]);
            random_value(&r, (ucfg_key)k, ev[k], sizeof ev[k]);
            random_value(&r, (ucfg_key)k, cv[k], sizeof cv[k]);
            if (in_env[k])
                setenv(ucfg_env((ucfg_key)k), ev[k], 1);
        }
        strbuf b = { 0 };
        write_config(&r, &b, in_file, fv, line);
        char dir[512], path[600];
        assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "ucfg"), 0);
        snprintf(path, sizeof path, "%s/config.yaml", dir);
        assert_int_equal(tu_write_text(path, b.s), 0);
        ucfg c;
        hearth_err err = { { 0 } };
        if (ucfg_load(&c, path, &err))
            fail_msg("seed %llu: %s\n%s", (unsigned long long)r.seed, err.msg, b.s);
        assert_true(c.found);
        int on_cmd[UCFG_N] = { 0 };
        for (int k = 0; k < UCFG_N; k++)
            if (k <= UCFG_RUNS_DIR && tu_randint(&r, 0, 2)) {
                on_cmd[k] = 1;
                assert_int_equal(ucfg_set_cmdline(&c, (ucfg_key)k, cv[k], "--opt", &err), 0);
            }
        for (int k = 0; k < UCFG_N; k++) {
            const char *want = on_cmd[k] ? cv[k] : in_env[k] ? ev[k] : in_file[k] ? fv[k]
                             : ucfg_builtin((ucfg_key)k);
            const char *got = ucfg_get(&c, (ucfg_key)k);
            if ((want == NULL) != (got == NULL) || (want && strcmp(want, got)))
                fail_msg("seed %llu: %s = %s, want %s (file %d env %d cmd %d)\n%s",
                         (unsigned long long)r.seed, ucfg_name((ucfg_key)k), got ? got : "(unset)",
                         want ? want : "(unset)", in_file[k], in_env[k], on_cmd[k], b.s);
            char src[4400], want_src[800];
            ucfg_describe_source(&c, (ucfg_key)k, src, sizeof src);
            if (on_cmd[k])
                snprintf(want_src, sizeof want_src, "command line (--opt)");
            else if (in_env[k])
                snprintf(want_src, sizeof want_src, "environment ($%s)", ucfg_env((ucfg_key)k));
            else if (in_file[k])
                snprintf(want_src, sizeof want_src, "%s:%d:", path, line[k]);
            else
                snprintf(want_src, sizeof want_src, "%s", want ? "built-in" : "unset");
            if (strncmp(src, want_src, strlen(want_src)))
                fail_msg("seed %llu: %s from '%s', want '%s'", (unsigned long long)r.seed,
                         ucfg_name((ucfg_key)k), src, want_src);
        }
        ucfg_free(&c);
        free(b.s);
        assert_int_equal(tu_tmpdir_remove(dir), 0);
    }
    clear_env();
}

/* Parses `text` over the defaults; returns the error code, the message in err. */
static int parse(const char *text, ucfg *c, hearth_err *err)
{
    memset(c, 0, sizeof *c);
    return ucfg_parse(c, "cfg.yaml", text, strlen(text), err);
}

static void test_errors(void **state)
{
    (void)state;
    static const struct { const char *text, *want; } cases[] = {
        { "db: a.db\nbakend: slurm\n", "cfg.yaml:2:1: bakend: unknown key (did you mean 'backend'?)" },
        { "slurm:\n  partiton: gpu\n", "cfg.yaml:2:3: slurm.partiton: unknown key (did you mean 'slurm.partition'?)" },
        { "db: [a, b]\n", "cfg.yaml:1:5: db: expected a string, got a list" },
        { "slurmrest:\n  url: {a: 1}\n", "cfg.yaml:2:8: slurmrest.url: expected a string, got a mapping" },
        { "slurm: gpu\n", "cfg.yaml:1:8: slurm: expected a mapping, got " },
        { "backend: pbs\n", "cfg.yaml:1:10: backend: expected one of local|slurm|slurmrest, got 'pbs'" },
        { "- db\n", "cfg.yaml:1:1: expected a mapping of settings" },
        { "db: a\ndb: b\n", "cfg.yaml:2:1:" },
        { "db: 'x\n", "cfg.yaml:" },
        { "db: ''\n", "cfg.yaml:1:5: db: expected a non-empty string" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ucfg c;
        hearth_err err = { { 0 } };
        int rc = parse(cases[i].text, &c, &err);
        if (rc != HERR_CONFIG || strncmp(err.msg, cases[i].want, strlen(cases[i].want)))
            fail_msg("case %zu: rc %d, '%s', want '%s'", i, rc, err.msg, cases[i].want);
        ucfg_free(&c);
    }
    /* A bad environment value is named too. */
    setenv("HEARTH_BACKEND", "nope", 1);
    ucfg c;
    hearth_err err = { { 0 } };
    assert_int_equal(ucfg_load(&c, "/nonexistent/dir/config.yaml", &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "$HEARTH_BACKEND: backend: expected one of"));
    ucfg_free(&c);
    unsetenv("HEARTH_BACKEND");
    assert_int_equal(ucfg_load(&c, "/tmp", &err) == 0, 0);   /* a directory: unreadable */
    ucfg_free(&c);
}

static void test_defaults_home_and_path(void **state)
{
    (void)state;
    clear_env();
    ucfg c;
    hearth_err err = { { 0 } };
    assert_int_equal(ucfg_load(&c, "/nonexistent/dir/config.yaml", &err), 0);
    assert_false(c.found);
    assert_string_equal(ucfg_get(&c, UCFG_DB), "hearth.db");
    assert_string_equal(ucfg_get(&c, UCFG_BACKEND), "local");
    assert_null(ucfg_get(&c, UCFG_SLURM_ACCOUNT));
    char src[256];
    ucfg_describe_source(&c, UCFG_SLURM_ACCOUNT, src, sizeof src);
    assert_string_equal(src, "unset");
    ucfg_free(&c);

    char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    setenv("HOME", "/home/someone", 1);
    assert_int_equal(parse("db: ~/r.db\nslurmrest: {token_file: ~/t}\nslurm: {account: ~/x}\n"
                           "backend:\n", &c, &err), 0);
    assert_string_equal(c.v[UCFG_DB].value, "/home/someone/r.db");
    assert_string_equal(c.v[UCFG_REST_TOKEN_FILE].value, "/home/someone/t");
    assert_string_equal(c.v[UCFG_SLURM_ACCOUNT].value, "~/x");   /* not a path */
    assert_string_equal(c.v[UCFG_BACKEND].value, "local");       /* empty: built-in */
    ucfg_free(&c);

    char path[512];
    setenv("XDG_CONFIG_HOME", "/xdg", 1);
    assert_int_equal(ucfg_path(path, sizeof path, &err), 0);
    assert_string_equal(path, "/xdg/hearth/config.yaml");
    setenv("XDG_CONFIG_HOME", "relative", 1);   /* invalid: ignored */
    assert_int_equal(ucfg_path(path, sizeof path, &err), 0);
    assert_string_equal(path, "/home/someone/.config/hearth/config.yaml");
    unsetenv("XDG_CONFIG_HOME");
    unsetenv("HOME");
    assert_int_equal(ucfg_path(path, sizeof path, &err), HERR_CONFIG);
    if (home) {
        setenv("HOME", home, 1);
        free(home);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_files_and_layers),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_defaults_home_and_path),
    };
    return cmocka_run_group_tests_name("orch_user_config", tests, NULL, NULL);
}
