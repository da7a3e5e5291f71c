/* test_train_ckpt.c - training checkpoints (ckpt.h): resuming reproduces the
 * uninterrupted run bit for bit, bad checkpoints are refused with clear errors, a crash
 * while writing leaves the previous checkpoint usable, metrics.jsonl keeps each step once.
 *
 * Bitwise: a run of STEPS steps writes a checkpoint after a random step K (1..STEPS-1)
 * and after the last; a fresh trainer resumed from the K checkpoint runs the remaining
 * steps and writes its own last checkpoint.  The per-step losses must be equal as
 * doubles and the two final checkpoints' rank files equal byte for byte (sha256 from the
 * manifests): parameters, AdamW moments (ZeRO shards included) and FP8 amax histories.
 * Models are tiny-vlm / tiny-vlm-moe shrunk to keep the test fast; train.seed and K are
 * fresh every run (printed; HEARTH_TEST_SEED replays). */
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
#include <jansson.h>

#include "ckpt.h"
#include "ckpt_state.h"
#include "outputs.h"
#include "support/runcfg.h"
#include "support/testutil.h"
#include "support/tmpdir.h"
#include "train.h"

#define STEPS 3

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}

/* Small widths (the presets' are for CPU runs, not for tests under ASan). */
static const char *base_yaml =
    "train:\n"
    "  steps: 3\n"
    "  seq_len: 16\n"
    "  lr: 1.0e-3\n"
    "  warmup: 1\n"
    "  weight_decay: 0.1\n"
    "  grad_clip: 1.0\n"
    "data:\n"
    "  images_min: 0\n"
    "  images_max: 1\n"
    "  image_px_min: 16\n"
    "  image_px_max: 16\n";

static const char *const small[] = {
    "model.decoder.vocab=128", "model.decoder.image_token_id=127",
    "model.decoder.hidden=128", "model.decoder.ffn=128", "model.decoder.heads=2",
    "model.encoder.hidden=128", "model.encoder.ffn=128", "model.encoder.heads=2",
    "model.encoder.kv_heads=2", "model.projector.hidden=128",
};
#define N_SMALL ((int)(sizeof small / sizeof small[0]))

/* cfg from base_yaml, the small widths, kv[0..n) and a fresh seed. */
static void make_config(run_config *c, const char *const *kv, int n)
{
    runcfg_list l;
    runcfg_init(&l);
    runcfg_add_kv(&l, small, N_SMALL);
    runcfg_add_kv(&l, kv, n);
    runcfg_add_seed(&l, tu_next(&g_rng) % 100000);
    hearth_err err = { { 0 } };
    if (runcfg_parse(c, base_yaml, &l, 0, &err))
        fail_msg("config: %s", err.msg);
}

static trainer *make_trainer(const run_config *c)
{
    hearth_err err = { { 0 } };
    trainer *t = NULL;
    if (trainer_create(&t, c, &err))
        fail_msg("trainer_create: %s", err.msg);
    return t;
}

static void step(trainer *t, double *loss)
{
    hearth_err err = { { 0 } };
    train_step_stats st;
    int rc = trainer_step(t, &st, &err);
    if (rc)
        fail_msg("step %d: rc %d %s", trainer_steps_done(t) + 1, rc, err.msg);
    *loss = st.loss;
}

static void write_ckpt(const char *run_dir, trainer *t, const run_config *c,
                       const ckpt_write_opts *o)
{
    hearth_err err = { { 0 } };
    char hash[65];
    run_summary sum;
    summary_init(&sum, 1, NULL);
    if (run_config_hash(c, hash, &err) ||
        ckpt_write(run_dir, t, c, hash, &sum, o, NULL, 0, &err))
        fail_msg("ckpt_write: %s", err.msg);
    summary_free(&sum);
}

/* Loads the checkpoint `path` names into a new trainer; NULL and err set on failure. */
static trainer *resume_from(const char *path, const run_config *c, int *step_out,
                            hearth_err *err)
{
    char dir[4400];
    trainer *t = make_trainer(c);
    run_summary sum;
    summary_init(&sum, 1, NULL);
    int rc = ckpt_resolve(path, dir, sizeof dir, err);
    if (!rc)
        rc = ckpt_read(dir, t, c, &sum, step_out, err);
    summary_free(&sum);
    if (rc) {
        trainer_free(t);
        return NULL;
    }
    return t;
}

/* The files[] digests of a manifest as one string (malloc'd). */
static char *manifest_digests(const char *ckpt_dir)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/manifest.json", ckpt_dir);
    json_t *m = json_load_file(path, 0, NULL);
    assert_non_null(m);
    json_t *files = json_object_get(m, "files");
    size_t n = json_array_size(files);
    assert_true(n >= 1);
    char *s = calloc(n, 80);
    for (size_t i = 0; i < n; i++)
        strcat(s, json_string_value(json_object_get(json_array_get(files, i), "sha256")));
    json_decref(m);
    return s;
}

/* The bitwise resume property for one config (kv). */
static void check_resume(const char *const *kv, int n)
{
    run_config c;
    make_config(&c, kv, n);
    int k = 1 + (int)(tu_next(&g_rng) % (STEPS - 1));
    char root[512], a[600], b[600], fa[700], fb[700];
    assert_int_equal(tu_tmpdir_make(root, sizeof root, "ckpt"), 0);
    snprintf(a, sizeof a, "%s/a", root);
    snprintf(b, sizeof b, "%s/b", root);
    mkdir(a, 0777);
    mkdir(b, 0777);
    double la[STEPS], lb[STEPS];
    trainer *t = make_trainer(&c);
    for (int s = 1; s <= STEPS; s++) {
        step(t, &la[s - 1]);
        if (s == k || s == STEPS)
            write_ckpt(a, t, &c, NULL);
    }
    trainer_free(t);

    char kdir[700];
    snprintf(kdir, sizeof kdir, "%s/checkpoints/step-%08d", a, k);
    hearth_err err = { { 0 } };
    int got = -1;
    t = resume_from(kdir, &c, &got, &err);
    if (!t)
        fail_msg("resume from step %d: %s", k, err.msg);
    assert_int_equal(got, k);
    assert_int_equal(trainer_steps_done(t), k);
    for (int s = k + 1; s <= STEPS; s++)
        step(t, &lb[s - 1]);
    write_ckpt(b, t, &c, NULL);
    trainer_free(t);

    for (int s = k + 1; s <= STEPS; s++)
        if (memcmp(&la[s - 1], &lb[s - 1], sizeof(double)))
            fail_msg("step %d after resuming from %d: loss %.17g, uninterrupted %.17g "
                     "(seed %llu)", s, k, lb[s - 1], la[s - 1],
                     (unsigned long long)g_rng.seed);
    snprintf(fa, sizeof fa, "%s/checkpoints/step-%08d", a, STEPS);
    snprintf(fb, sizeof fb, "%s/checkpoints/step-%08d", b, STEPS);
    char *da = manifest_digests(fa), *db = manifest_digests(fb);
    if (strcmp(da, db))
        fail_msg("the state after step %d differs between the uninterrupted run and the run "
                 "resumed from step %d (seed %llu)", STEPS, k, (unsigned long long)g_rng.seed);
    free(da);
    free(db);
    assert_int_equal(tu_tmpdir_remove(root), 0);
}

#define KV(...) ((const char *const[]){ __VA_ARGS__ })
#define NKV(...) ((int)(sizeof KV(__VA_ARGS__) / sizeof(const char *)))
#define RESUME(...) check_resume(KV(__VA_ARGS__), NKV(__VA_ARGS__))

static void test_resume_single(void **state)
{
    (void)state;
    RESUME("model=tiny-vlm", "train.global_batch=2", "train.micro_batch=1");
    RESUME("model=tiny-vlm-moe", "train.global_batch=2", "train.micro_batch=1");
}

static void test_resume_single_fp8(void **state)
{
    (void)state;
    RESUME("model=tiny-vlm", "precision.fp8=all", "train.global_batch=2",
           "train.micro_batch=1");
}

static void test_resume_tp2(void **state)
{
    (void)state;
    RESUME("model=tiny-vlm", "ranks=2", "parallel.tp=2", "precision.fp8=all",
           "train.global_batch=2", "train.micro_batch=1");
}

static void test_resume_pp2_vpp2(void **state)
{
    (void)state;
    RESUME("model=tiny-vlm", "ranks=2", "parallel.pp=2", "parallel.vpp=2",
           "train.global_batch=2", "train.micro_batch=1");
}

static void test_resume_dp2_zero(void **state)
{
    (void)state;
    RESUME("model=tiny-vlm", "ranks=2", "parallel.dp=2", "parallel.distributed_optimizer=true",
           "train.global_batch=2", "train.micro_batch=1");
}

static void test_resume_ep2(void **state)
{
    (void)state;
    RESUME("model=tiny-vlm-moe", "ranks=2", "parallel.dp=2", "parallel.ep=2",
           "train.global_batch=2", "train.micro_batch=1");
}

static void test_resume_full_separation(void **state)
{
    (void)state;
    RESUME("model=tiny-vlm", "ranks=2", "parallel.pp=2", "train.global_batch=2",
           "train.micro_batch=1", "parallel.encoder.strategy=full_separation",
           "parallel.encoder.tp=1");
}

static void test_resume_cp2(void **state)
{
    (void)state;
    RESUME("model=tiny-vlm-moe", "ranks=2", "parallel.cp=2", "train.global_batch=2",
           "train.micro_batch=1");
}

/* ---- refusals ----------------------------------------------------------------------- */

typedef struct {
    char root[512], run[600], ck[700], rank0[800];
    run_config c;
} fixture;

/* One single-rank run of 2 steps with a checkpoint after each (so step 1 and 2 exist). */
static void fixture_make(fixture *f)
{
    memset(f, 0, sizeof *f);
    make_config(&f->c, KV("model=tiny-vlm", "train.global_batch=1", "train.micro_batch=1"), 3);
    assert_int_equal(tu_tmpdir_make(f->root, sizeof f->root, "ckpt"), 0);
    snprintf(f->run, sizeof f->run, "%s/run", f->root);
    mkdir(f->run, 0777);
    trainer *t = make_trainer(&f->c);
    double loss;
    for (int s = 1; s <= 2; s++) {
        step(t, &loss);
        write_ckpt(f->run, t, &f->c, NULL);
    }
    trainer_free(t);
    snprintf(f->ck, sizeof f->ck, "%s/checkpoints/step-00000002", f->run);
    snprintf(f->rank0, sizeof f->rank0, "%s/rank-00000.safetensors", f->ck);
}

static void expect_refused(const char *path, const run_config *c, const char *want1,
                           const char *want2)
{
    hearth_err err = { { 0 } };
    int step = -1;
    trainer *t = resume_from(path, c, &step, &err);
    if (t) {
        trainer_free(t);
        fail_msg("a bad checkpoint was accepted (expected an error with '%s')", want1);
    }
    if (!strstr(err.msg, want1) || (want2 && !strstr(err.msg, want2)))
        fail_msg("error '%s' does not name '%s'%s%s", err.msg, want1, want2 ? " and " : "",
                 want2 ? want2 : "");
}

static long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static void test_corrupt_byte(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    long n = file_size(f.rank0);
    assert_true(n > 100);
    long at = (long)(tu_next(&g_rng) % (uint64_t)n);
    FILE *fp = fopen(f.rank0, "r+b");
    assert_non_null(fp);
    fseek(fp, at, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, at, SEEK_SET);
    fputc(ch ^ (1 << (tu_next(&g_rng) % 8)), fp);
    fclose(fp);
    expect_refused(f.run, &f.c, "rank-00000.safetensors", "sha256 mismatch");
    assert_int_equal(tu_tmpdir_remove(f.root), 0);
}

static void test_truncated(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    long n = file_size(f.rank0);
    assert_int_equal(truncate(f.rank0, (off_t)(tu_next(&g_rng) % (uint64_t)n)), 0);
    expect_refused(f.ck, &f.c, "rank-00000.safetensors", "truncated");
    assert_int_equal(tu_tmpdir_remove(f.root), 0);
}

static void test_missing_file(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    assert_int_equal(unlink(f.rank0), 0);
    expect_refused(f.run, &f.c, "rank-00000.safetensors", "missing");
    char m[800];
    snprintf(m, sizeof m, "%s/manifest.json", f.ck);
    assert_int_equal(tu_write_text(m, "{\"format\": "), 0);
    expect_refused(f.run, &f.c, "manifest.json", "not valid JSON");
    assert_int_equal(tu_tmpdir_remove(f.root), 0);
}

static void test_other_config(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    run_config c = f.c;
    c.train.lr *= 2;
    expect_refused(f.run, &c, "other config", "train.lr");
    c = f.c;
    c.train.steps += 1;
    expect_refused(f.run, &c, "other config", "train.steps");
    c = f.c;
    c.model.decoder.s.layers = 2;
    expect_refused(f.run, &c, "other config", "model.decoder.layers");
    /* The free keys may differ. */
    c = f.c;
    c.train.checkpoint_every = 5;
    c.train.measure_from = 2;
    hearth_err err = { { 0 } };
    int got = -1;
    trainer *t = resume_from(f.run, &c, &got, &err);
    if (!t)
        fail_msg("checkpoint_every/measure_from changed: %s", err.msg);
    assert_int_equal(got, 2);
    trainer_free(t);
    expect_refused(f.root, &f.c, "neither a checkpoint", NULL);
    assert_int_equal(tu_tmpdir_remove(f.root), 0);
}

/* --resume without --config trains the checkpoint's own config: read back from the
 * manifest it hashes as saved, --set applies on top, and a changed key is refused as
 * with --config. */
static void test_read_config(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    hearth_err err = { { 0 } };
    run_config c;
    char want[65], got[65];
    if (ckpt_read_config(f.ck, NULL, 0, &c, &err))
        fail_msg("ckpt_read_config: %s", err.msg);
    assert_int_equal(run_config_hash(&f.c, want, &err), 0);
    assert_int_equal(run_config_hash(&c, got, &err), 0);
    assert_string_equal(got, want);
    int step = -1;
    trainer *t = resume_from(f.run, &c, &step, &err);
    if (!t)
        fail_msg("the checkpoint's own config: %s", err.msg);
    assert_int_equal(step, 2);
    trainer_free(t);
    /* a free key on top: still resumable; another key: refused, naming it */
    config_override free_key = { "train.checkpoint_every", "7" };
    assert_int_equal(ckpt_read_config(f.ck, &free_key, 1, &c, &err), 0);
    assert_int_equal(c.train.checkpoint_every, 7);
    t = resume_from(f.run, &c, &step, &err);
    if (!t)
        fail_msg("checkpoint_every on top: %s", err.msg);
    trainer_free(t);
    config_override steps = { "train.steps", "10" };
    assert_int_equal(ckpt_read_config(f.ck, &steps, 1, &c, &err), 0);
    expect_refused(f.run, &c, "other config", "train.steps is 3 in the checkpoint, 10 now");
    /* a manifest without its config names what is missing */
    char m[800];
    snprintf(m, sizeof m, "%s/manifest.json", f.ck);
    json_t *o = json_load_file(m, 0, NULL);
    assert_non_null(o);
    json_object_del(o, "config");
    assert_int_equal(json_dump_file(o, m, 0), 0);
    json_decref(o);
    assert_int_equal(ckpt_read_config(f.ck, NULL, 0, &c, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "manifest.json: config: missing"));
    assert_int_equal(tu_tmpdir_remove(f.root), 0);
}

/* --force: the earlier run's checkpoints go (latest first), whatever else is kept. */
static void test_remove_all(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    hearth_err err = { { 0 } };
    char p[800], dir[4400];
    snprintf(p, sizeof p, "%s/checkpoints/step-00000009.tmp", f.run);   /* a crash's */
    assert_int_equal(mkdir(p, 0777), 0);
    snprintf(p, sizeof p, "%s/other", f.run);
    assert_int_equal(tu_write_text(p, "kept\n"), 0);
    assert_int_equal(ckpt_remove_all(f.run, &err), 0);
    assert_int_equal(file_size(p), 5);
    snprintf(p, sizeof p, "%s/checkpoints", f.run);
    assert_int_equal(file_size(p), -1);
    assert_int_equal(ckpt_resolve(f.run, dir, sizeof dir, &err), HERR_CONFIG);
    assert_int_equal(ckpt_remove_all(f.run, &err), 0);   /* none: fine */
    /* something hearth did not write stays, with its directory */
    assert_int_equal(mkdir(p, 0777), 0);
    snprintf(p, sizeof p, "%s/checkpoints/notes.txt", f.run);
    assert_int_equal(tu_write_text(p, "mine\n"), 0);
    assert_int_equal(ckpt_remove_all(f.run, &err), 0);
    assert_int_equal(file_size(p), 5);
    assert_int_equal(tu_tmpdir_remove(f.root), 0);
}

/* A crash after each stage of writing step 3 leaves step 2 (via latest) loadable; the
 * keep-2 rule deletes step 1 once step 2 is complete. */
static void test_crash_stages(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f);
    char p[800];
    snprintf(p, sizeof p, "%s/checkpoints/step-00000001", f.run);
    assert_int_equal(file_size(p) >= 0, 1);   /* keep 2: steps 1 and 2 */
    for (int stage = 1; stage <= 3; stage++) {
        hearth_err err = { { 0 } };
        int got = -1;
        trainer *t = resume_from(f.run, &f.c, &got, &err);
        if (!t)
            fail_msg("stage %d: %s", stage, err.msg);
        assert_int_equal(got, 2);
        double loss;
        step(t, &loss);
        ckpt_write_opts o = { .stop_after = stage };
        write_ckpt(f.run, t, &f.c, &o);
        trainer_free(t);
        t = resume_from(f.run, &f.c, &got, &err);
        if (!t)
            fail_msg("after a crash at stage %d: %s", stage, err.msg);
        assert_int_equal(got, 2);
        trainer_free(t);
    }
    /* Completing step 3 now: latest moves, step 1 goes, the leftovers too. */
    hearth_err err = { { 0 } };
    int got = -1;
    trainer *t = resume_from(f.run, &f.c, &got, &err);
    assert_non_null(t);
    double loss;
    step(t, &loss);
    write_ckpt(f.run, t, &f.c, NULL);
    trainer_free(t);
    t = resume_from(f.run, &f.c, &got, &err);
    assert_non_null(t);
    assert_int_equal(got, 3);
    trainer_free(t);
    assert_int_equal(file_size(p), -1);
    snprintf(p, sizeof p, "%s/checkpoints/step-00000003.tmp", f.run);
    assert_int_equal(file_size(p), -1);
    snprintf(p, sizeof p, "%s/checkpoints/step-00000002/manifest.json", f.run);
    assert_true(file_size(p) > 0);
    assert_int_equal(tu_tmpdir_remove(f.root), 0);
}

static void test_metrics_resume(void **state)
{
    (void)state;
    char root[512], path[600];
    assert_int_equal(tu_tmpdir_make(root, sizeof root, "ckpt"), 0);
    int n = 3 + (int)(tu_next(&g_rng) % 5), keep = 1 + (int)(tu_next(&g_rng) % (uint64_t)n);
    metrics_file mf = { 0 };
    hearth_err err = { { 0 } };
    assert_int_equal(metrics_open(&mf, root, &err), 0);
    for (int s = 1; s <= n; s++) {
        train_step_stats st;
        memset(&st, 0, sizeof st);
        st.step = s;
        st.loss = tu_uniform(&g_rng);
        assert_int_equal(metrics_append(&mf, &st, 0, &err), 0);
    }
    fputs("{\"step\": 99, \"lo", mf.f);     /* torn by a kill */
    metrics_close(&mf);
    assert_int_equal(metrics_open_resume(&mf, root, keep, &err), 0);
    train_step_stats st;
    memset(&st, 0, sizeof st);
    st.step = keep + 1;
    assert_int_equal(metrics_append(&mf, &st, 0, &err), 0);
    metrics_close(&mf);
    snprintf(path, sizeof path, "%s/metrics.jsonl", root);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char line[4096];
    int count = 0;
    while (fgets(line, sizeof line, fp)) {
        json_t *o = json_loads(line, 0, NULL);
        assert_non_null(o);
        assert_int_equal(json_integer_value(json_object_get(o, "step")), ++count);
        json_decref(o);
    }
    fclose(fp);
    assert_int_equal(count, keep + 1);
    assert_int_equal(tu_tmpdir_remove(root), 0);
}

int main(void)
{
    if (getenv("HEARTH_TEST_FILTER"))   /* e.g. test_resume_cp2: one test */
        cmocka_set_test_filter(getenv("HEARTH_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_resume_single, setup_seed),
        cmocka_unit_test_setup(test_resume_single_fp8, setup_seed),
        cmocka_unit_test_setup(test_resume_tp2, setup_seed),
        cmocka_unit_test_setup(test_resume_pp2_vpp2, setup_seed),
        cmocka_unit_test_setup(test_resume_dp2_zero, setup_seed),
        cmocka_unit_test_setup(test_resume_ep2, setup_seed),
        cmocka_unit_test_setup(test_resume_full_separation, setup_seed),
        cmocka_unit_test_setup(test_resume_cp2, setup_seed),
        cmocka_unit_test_setup(test_corrupt_byte, setup_seed),
        cmocka_unit_test_setup(test_truncated, setup_seed),
        cmocka_unit_test_setup(test_missing_file, setup_seed),
        cmocka_unit_test_setup(test_other_config, setup_seed),
        cmocka_unit_test_setup(test_read_config, setup_seed),
        cmocka_unit_test_setup(test_remove_all, setup_seed),
        cmocka_unit_test_setup(test_crash_stages, setup_seed),
        cmocka_unit_test_setup(test_metrics_resume, setup_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
