/* test_orch_render.c - job-script rendering and run-directory files: every value becomes one
 * inert shell word (random byte strings decoded back by a POSIX single-quote reader and by
 * /bin/sh itself), template errors name their line, raw values are not re-scanned, run.yaml
 * reads back to the same config hash, job.json round-trips, exit codes and attempt
 * archiving, removing a run tree without following its links. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "render.h"
#include "rundir.h"
#include "shape/file_read.h"
#include "shape/run_config.h"
#include "support/testutil.h"

/* A random string of `n` bytes from 1..255, biased towards shell metacharacters. */
static char *random_value(tu_rng *r, size_t n)
{
    static const char meta[] = "'\"`$(){}[];&|<>*?!~#\\ \t\n%^=,.-_/";
    char *s = malloc(n + 1);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++) {
        int k = tu_randint(r, 0, 3);
        s[i] = k == 0 ? (char)tu_randint(r, 1, 256)
             : k == 1 ? meta[tu_randint(r, 0, (int)sizeof meta - 1)]
                      : (char)tu_randint(r, 'a', 'z' + 1);
    }
    s[n] = 0;
    return s;
}

/* Reads one shell word made only of '...' parts and \' escapes (what render produces);
 * returns the decoded bytes, or NULL when the word has anything else in it. */
static char *unquote(const char *w)
{
    size_t n = strlen(w);
    char *out = malloc(n + 1), *o = out;
    assert_non_null(out);
    const char *p = w;
    while (*p) {
        if (*p == '\'') {
            const char *q = strchr(p + 1, '\'');
            if (!q) {
                free(out);
                return NULL;
            }
            memcpy(o, p + 1, (size_t)(q - p - 1));
            o += q - p - 1;
            p = q + 1;
        } else if (p[0] == '\\' && p[1] == '\'') {
            *o++ = '\'';
            p += 2;
        } else {
            free(out);
            return NULL;
        }
    }
    *o = 0;
    return out;
}

static void test_quote_round_trip(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    for (int t = 0; t < 2000; t++) {
        char *v = random_value(&r, (size_t)tu_randint(&r, 0, 40));
        char *q = render_shell_quote(v);
        assert_non_null(q);
        char *back = unquote(q);
        if (!back || strcmp(back, v) != 0)
            fail_msg("seed %llu: value does not come back from its quoted form %s",
                     (unsigned long long)r.seed, q);
        free(back);
        free(q);
        free(v);
    }
    char *e = render_shell_quote("");
    assert_string_equal(e, "''");
    free(e);
    e = render_shell_quote("it's");
    assert_string_equal(e, "'it'\\''s'");
    free(e);
}

/* The shell itself reads the quoted word back as the same bytes, and runs nothing. */
static void test_quote_through_sh(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    char dir[] = "/tmp/hearth-render-XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int t = 0; t < 20; t++) {
        char *v = random_value(&r, (size_t)tu_randint(&r, 1, 30));
        char *q = render_shell_quote(v);
        char tmpl[] = "cd {{DIR}} || exit 9\nprintf '%s' {{V}} > out\n";
        render_var vars[] = { { "DIR", dir, 0 }, { "V", v, 0 } };
        char *script = NULL;
        hearth_err err = {{0}};
        assert_int_equal(render_template("t", tmpl, vars, 2, &script, &err), 0);
        char path[256], out[256];
        snprintf(path, sizeof path, "%s/s.sh", dir);
        snprintf(out, sizeof out, "%s/out", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(script, f);
        fclose(f);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "/bin/sh %s", path);
        assert_int_equal(system(cmd), 0);
        char *got = NULL;
        size_t len = 0;
        assert_int_equal(file_read_bounded(out, FILE_READ_MAX_TEXT, &got, &len, &err), 0);
        if (len != strlen(v) || memcmp(got, v, len) != 0)
            fail_msg("seed %llu: sh printed %zu bytes for a %zu-byte value %s",
                     (unsigned long long)r.seed, len, strlen(v), q);
        /* Nothing but the script and its output may exist: no command ran. */
        char ls[512];
        snprintf(ls, sizeof ls, "test $(ls -A %s | wc -l) -eq 2", dir);
        if (system(ls) != 0)
            fail_msg("seed %llu: the value %s created a file", (unsigned long long)r.seed, q);
        unlink(out);
        free(got);
        free(script);
        free(q);
        free(v);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/s.sh", dir);
    unlink(path);
    rmdir(dir);
}

static void test_template_errors(void **state)
{
    (void)state;
    render_var vars[] = { { "A", "x", 0 }, { "RAW", "echo {{A}} $HOME", 1 } };
    char *out = NULL;
    hearth_err err = {{0}};
    assert_int_equal(render_template("t.tmpl", "a\nb\n{{NOPE}}\n", vars, 2, &out, &err),
                     HERR_CONFIG);
    assert_string_equal(err.msg, "t.tmpl:3: unknown placeholder {{NOPE}}");
    assert_null(out);
    assert_int_equal(render_template("t.tmpl", "x\n{{A\n", vars, 2, &out, &err), HERR_CONFIG);
    assert_string_equal(err.msg, "t.tmpl:2: bad placeholder (expected {{NAME}} with NAME in "
                                 "A-Z, 0-9, _)");
    assert_int_equal(render_template("t.tmpl", "{{a}}", vars, 2, &out, &err), HERR_CONFIG);
    /* Raw values go in as they are and are not scanned for placeholders again. */
    assert_int_equal(render_template("t.tmpl", "[{{RAW}}] [{{A}}] {", vars, 2, &out, &err), 0);
    assert_string_equal(out, "[echo {{A}} $HOME] ['x'] {");
    free(out);
}

static char *make_dir(void)
{
    char *d = strdup("/tmp/hearth-rundir-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void rm_rf(const char *d)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
}

/* run.yaml (what hearth-train reads) resolves to the hash of the config it came from, for
 * random train/data values. */
static void test_config_yaml_round_trip(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    for (int t = 0; t < 10; t++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml,
                 "model: tiny-vlm\ntrain: {steps: %d, lr: %.17g, seed: %d, seq_len: %d}\n"
                 "data: {path: \"p%d 'x' $(y)\"}\n",
                 tu_randint(&r, 1, 100), tu_uniform(&r) * 1e-2, tu_randint(&r, 0, 1000),
                 32 * tu_randint(&r, 1, 4), tu_randint(&r, 0, 99));
        run_config c, back;
        hearth_err err = {{0}};
        if (run_config_parse(&c, "t.yaml", yaml, NULL, 0, 0, &err))
            fail_msg("%s", err.msg);
        char *json = run_config_canonical_json(&c, &err);
        assert_non_null(json);
        char h1[65], h2[65];
        assert_int_equal(run_config_hash(&c, h1, &err), 0);
        char *text = rundir_config_yaml(json, &err);
        assert_non_null(text);
        if (run_config_parse(&back, "run.yaml", text, NULL, 0, 0, &err))
            fail_msg("seed %llu: run.yaml does not read back: %s", (unsigned long long)r.seed,
                     err.msg);
        assert_int_equal(run_config_hash(&back, h2, &err), 0);
        if (strcmp(h1, h2) != 0)
            fail_msg("seed %llu: hash %s became %s", (unsigned long long)r.seed, h1, h2);
        free(text);
        free(json);
    }
}

static void test_rundir_write_read(void **state)
{
    (void)state;
    char *d = make_dir();
    char run_dir[512];
    snprintf(run_dir, sizeof run_dir, "%s/exp/exp-1", d);
    run_config c;
    hearth_err err = {{0}};
    assert_int_equal(run_config_parse(&c, "t", "model: tiny-vlm\n", NULL, 0, 0, &err), 0);
    char *json = run_config_canonical_json(&c, &err);
    char hash[65];
    run_config_hash(&c, hash, &err);
    char *setup[] = { "module load x", "export A='b c'" };
    rundir_job j = { 0 };
    j.run_id = "exp-1";
    j.experiment = "exp";
    j.backend = "local";
    j.trainer = "/bin/true";
    j.workdir = d;
    j.n_setup = 2;
    j.setup = setup;
    j.config_hash = hash;
    j.cpus_per_task = 3;
    j.time_limit_s = 90;
    j.retries = 2;
    j.repeat = 4;
    j.max_concurrent = 5;
    j.retry_timeout = 1;
    j.pack = 7;
    j.after_experiment = "warmup";
    j.after_any = 1;
    char *sbatch[] = { "--mem=1G", "--export=ALL,X='a b'" };
    j.partition = "gpu";
    j.account = "proj'x";
    j.constraint = "h100&ib";
    j.n_sbatch = 2;
    j.sbatch = sbatch;
    const char *tmpl = "#!/bin/sh\nR={{RUN_DIR}}\nC={{CPUS_PER_TASK}}\n{{SETUP}}T={{TRAINER}}\n";
    assert_int_equal(rundir_write(run_dir, &j, json, "t.tmpl", tmpl, &err), 0);

    rundir_job back;
    assert_int_equal(rundir_job_read(run_dir, &back, &err), 0);
    assert_string_equal(back.run_id, "exp-1");
    assert_string_equal(back.trainer, "/bin/true");
    assert_string_equal(back.config_hash, hash);
    assert_int_equal(back.n_setup, 2);
    assert_string_equal(back.setup[1], "export A='b c'");
    assert_int_equal(back.cpus_per_task, 3);
    assert_int_equal(back.time_limit_s, 90);
    assert_int_equal(back.retries, 2);
    assert_int_equal(back.repeat, 4);
    assert_int_equal(back.max_concurrent, 5);
    assert_int_equal(back.retry_timeout, 1);
    assert_int_equal(back.pack, 7);
    assert_string_equal(back.after_experiment, "warmup");
    assert_int_equal(back.after_any, 1);
    assert_string_equal(back.partition, "gpu");
    assert_string_equal(back.account, "proj'x");
    assert_null(back.qos);
    assert_string_equal(back.constraint, "h100&ib");
    assert_int_equal(back.n_sbatch, 2);
    assert_string_equal(back.sbatch[1], "--export=ALL,X='a b'");
    rundir_job copy;
    assert_int_equal(rundir_job_copy(&copy, &back, &err), 0);
    assert_string_equal(copy.setup[0], "module load x");
    assert_string_equal(copy.partition, "gpu");
    assert_int_equal(copy.retry_timeout, 1);
    assert_int_equal(copy.pack, 7);
    assert_int_equal(copy.n_sbatch, 2);
    assert_string_equal(copy.sbatch[0], "--mem=1G");
    rundir_job_free(&copy);
    rundir_job_free(&back);

    char path[600], *text = NULL;
    snprintf(path, sizeof path, "%s/job.sh", run_dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_mode & S_IXUSR);
    assert_int_equal(file_read_bounded(path, FILE_READ_MAX_TEXT, &text, NULL, &err), 0);
    char want[1024];
    snprintf(want, sizeof want, "#!/bin/sh\nR='%s'\nC='3'\n    module load x\n    export A='b c'\n"
             "T='/bin/true'\n", run_dir);
    assert_string_equal(text, want);
    free(text);

    /* A job.json with a wrong type is an error naming the key. */
    snprintf(path, sizeof path, "%s/job.json", run_dir);
    FILE *f = fopen(path, "w");
    fputs("{\"run_id\": \"x\", \"experiment\": \"e\", \"backend\": \"local\", \"trainer\": \"t\","
          " \"workdir\": \"/\", \"config_hash\": \"h\", \"cpus_per_task\": \"many\"}", f);
    fclose(f);
    assert_int_equal(rundir_job_read(run_dir, &back, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "cpus_per_task"));
    free(json);
    rm_rf(d);
    free(d);
}

/* A hash that does not match what run.yaml reads back is refused before anything runs. */
static void test_rundir_hash_mismatch(void **state)
{
    (void)state;
    char *d = make_dir();
    run_config c;
    hearth_err err = {{0}};
    assert_int_equal(run_config_parse(&c, "t", "model: tiny-vlm\n", NULL, 0, 0, &err), 0);
    char *json = run_config_canonical_json(&c, &err);
    rundir_job j = { 0 };
    j.run_id = "e-1";
    j.experiment = "e";
    j.backend = "local";
    j.trainer = "/bin/true";
    j.workdir = d;
    j.config_hash = "0000000000000000000000000000000000000000000000000000000000000000";
    j.cpus_per_task = 1;
    j.repeat = 1;
    assert_int_equal(rundir_write(d, &j, json, "t", "x", &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "reads back with config hash"));
    free(json);
    rm_rf(d);
    free(d);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    hearth_err err;
    assert_int_equal(rundir_write_file(path, text, strlen(text), 0644, &err), 0);
}

static void test_exit_code_and_archive(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    char *d = make_dir();
    int code = -5;
    assert_int_equal(rundir_exit_code(d, &code), 0);
    int want = tu_randint(&r, 0, 256);
    char buf[16];
    snprintf(buf, sizeof buf, "%d\n", want);
    write_text(d, "exit_code", buf);
    assert_int_equal(rundir_exit_code(d, &code), 1);
    assert_int_equal(code, want);
    write_text(d, "exit_code", "-1\n");
    assert_int_equal(rundir_exit_code(d, &code), 0);
    write_text(d, "exit_code", "\n");
    assert_int_equal(rundir_exit_code(d, &code), 0);

    write_text(d, "exit_code", "1\n");
    write_text(d, "stderr.log", "boom\n");
    write_text(d, "result.json", "{}");
    hearth_err err;
    assert_int_equal(rundir_archive_attempt(d, 2, 0, &err), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/attempt-1/stderr.log", d);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/attempt-1/result.json", d);
    assert_int_equal(access(path, F_OK), 0);
    assert_int_equal(rundir_exit_code(d, &code), 0);
    /* A preempted run keeps its outputs in place for the next attempt, but not the
     * summary of the attempt that ended: a later attempt must not be recorded from it. */
    write_text(d, "exit_code", "75\n");
    write_text(d, "metrics.jsonl", "{}\n");
    write_text(d, "result.json", "{}");
    assert_int_equal(rundir_archive_attempt(d, 3, 1, &err), 0);
    snprintf(path, sizeof path, "%s/metrics.jsonl", d);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/attempt-2/exit_code", d);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/result.json", d);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/attempt-2/result.json", d);
    assert_int_equal(access(path, F_OK), 0);
    /* A run with a checkpoint resumes from it (and keeps its outputs, sweep.c). */
    assert_int_equal(rundir_has_checkpoint(d), 0);
    snprintf(path, sizeof path, "%s/checkpoints", d);
    assert_int_equal(mkdir(path, 0777), 0);
    assert_int_equal(rundir_has_checkpoint(d), 0);
    write_text(path, "latest", "step-00000002\n");
    assert_int_equal(rundir_has_checkpoint(d), 1);
    rm_rf(d);
    free(d);
}

/* rundir_remove_tree (`hearth rm --delete-runs`): a random tree goes whole; symbolic links
 * in it are removed, never followed (what they point to outside stays); a missing path is
 * fine; an entry that cannot be removed stops it with the entry named. */
static void test_remove_tree(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    char *outside = make_dir(), *d = make_dir();
    write_text(outside, "precious", "keep me\n");
    char tree[600], path[700];
    snprintf(tree, sizeof tree, "%s/exp", d);
    hearth_err err;
    int dirs = tu_randint(&r, 1, 6);
    for (int i = 0; i < dirs; i++) {
        snprintf(path, sizeof path, "%s/run-%d/attempt-1/deeper", tree, i);
        assert_int_equal(rundir_mkdirs(path, &err), 0);
        snprintf(path, sizeof path, "%s/run-%d", tree, i);
        write_text(path, "stdout.log", "x");
        snprintf(path, sizeof path, "%s/run-%d/attempt-1/deeper", tree, i);
        for (int k = tu_randint(&r, 0, 5); k > 0; k--) {
            char name[32];
            snprintf(name, sizeof name, ".f%d", k);
            write_text(path, name, "y");
        }
    }
    snprintf(path, sizeof path, "%s/link-to-dir", tree);
    assert_int_equal(symlink(outside, path), 0);
    char target[700];
    snprintf(target, sizeof target, "%s/precious", outside);
    snprintf(path, sizeof path, "%s/run-0/link-to-file", tree);
    assert_int_equal(symlink(target, path), 0);
    assert_int_equal(rundir_remove_tree(tree, &err), 0);
    assert_int_equal(access(tree, F_OK), -1);
    assert_int_equal(access(target, F_OK), 0);
    assert_int_equal(rundir_remove_tree(tree, &err), 0);   /* missing: fine */

    /* A directory whose entries cannot be removed (not for root, who may anyway). */
    if (geteuid() != 0) {
        snprintf(path, sizeof path, "%s/locked/inner", tree);
        assert_int_equal(rundir_mkdirs(path, &err), 0);
        write_text(path, "f", "z");
        assert_int_equal(chmod(path, 0555), 0);
        assert_int_equal(rundir_remove_tree(tree, &err), HERR_IO);
        assert_non_null(strstr(err.msg, "/locked/inner/f"));
        snprintf(path, sizeof path, "%s/locked/inner/f", tree);
        assert_int_equal(access(path, F_OK), 0);
        snprintf(path, sizeof path, "%s/locked/inner", tree);
        assert_int_equal(chmod(path, 0755), 0);
        assert_int_equal(rundir_remove_tree(tree, &err), 0);
        assert_int_equal(access(tree, F_OK), -1);
    }
    rm_rf(d);
    rm_rf(outside);
    free(d);
    free(outside);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quote_round_trip),
        cmocka_unit_test(test_quote_through_sh),
        cmocka_unit_test(test_template_errors),
        cmocka_unit_test(test_config_yaml_round_trip),
        cmocka_unit_test(test_rundir_write_read),
        cmocka_unit_test(test_rundir_hash_mismatch),
        cmocka_unit_test(test_exit_code_and_archive),
        cmocka_unit_test(test_remove_tree),
    };
    return cmocka_run_group_tests_name("orch_render", tests, NULL, NULL);
}
