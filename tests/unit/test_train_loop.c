/* test_train_loop.c - the training loop on tiny-vlm: the loss falls on the learnable
 * synthetic task, runs are bitwise reproducible (seeds, thread counts), micro-batch
 * accumulation equals one big batch, frozen parameters stay put, divergence stops.
 *
 * Seeds come from the clock (printed; HEARTH_TEST_SEED replays a failure). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data_synth.h"
#include "support/runcfg.h"
#include "support/testutil.h"
#include "train.h"

static uint64_t g_seed;

static int setup_seed(void **state)
{
    (void)state;
    g_seed = tu_rng_fresh_noted().seed;
    return 0;
}

/* The task as the tests train it: short sequences, 1-2 small images (1-4 tokens each),
 * one micro batch of 4, so that a step takes tens of milliseconds.  The loss test's
 * lr/warmup are tuned here: the loss ends near 0.1% of its start, image-conditioned
 * tokens included (tried over several seeds). */
static const char *base_yaml =
    "model: tiny-vlm\n"
    "train:\n"
    "  steps: 300\n"
    "  seq_len: 32\n"
    "  micro_batch: 4\n"
    "  global_batch: 4\n"
    "  lr: 3.0e-3\n"
    "  min_lr: 3.0e-4\n"
    "  warmup: 20\n"
    "  weight_decay: 0.0\n"
    "  grad_clip: 1.0\n"
    "data:\n"
    "  images_min: 1\n"
    "  images_max: 2\n"
    "  image_px_min: 16\n"
    "  image_px_max: 32\n";

/* Parses base_yaml with KEY=VALUE overrides (NULL-terminated) and train.seed = seed. */
static void make_config(run_config *c, uint64_t seed, const char *const *kv)
{
    runcfg_list l;
    runcfg_init(&l);
    runcfg_add_seed(&l, seed);
    runcfg_add_kv(&l, kv, -1);
    hearth_err err = { { 0 } };
    if (runcfg_parse(c, base_yaml, &l, 1, &err))
        fail_msg("config: %s", err.msg);
}

/* A new config (the caller frees it) from make_config with the test's seed. */
static run_config *new_config(const char *const *kv)
{
    run_config *c = calloc(1, sizeof *c);
    assert_non_null(c);
    make_config(c, g_seed, kv);
    return c;
}

/* A copy of the model's parameters (*np of them); the caller frees it. */
static float *params_copy(model *m, size_t *np)
{
    *np = model_param_count(m);
    float *p = malloc(*np * sizeof(float));
    assert_non_null(p);
    memcpy(p, model_params(m), *np * sizeof(float));
    return p;
}

static trainer *make_trainer(const run_config *c)
{
    trainer *t = NULL;
    hearth_err err = { { 0 } };
    if (trainer_create(&t, c, &err))
        fail_msg("trainer_create: %s", err.msg);
    return t;
}

static int step(trainer *t, train_step_stats *st)
{
    hearth_err err = { { 0 } };
    int rc = trainer_step(t, st, &err);
    if (rc < 0)
        fail_msg("trainer_step: %s", err.msg);
    return rc;
}

/* Runs n steps, recording loss and grad norm. */
static void run_steps(const run_config *c, int n, double *loss, double *gnorm)
{
    trainer *t = make_trainer(c);
    for (int i = 0; i < n; i++) {
        train_step_stats st;
        assert_int_equal(step(t, &st), 0);
        assert_int_equal(st.step, i + 1);
        loss[i] = st.loss;
        if (gnorm)
            gnorm[i] = st.grad_norm;
    }
    trainer_free(t);
}

/* The mean loss of the image-conditioned tokens only (the class token that follows an
 * image's SEP) on samples never trained on: ln(16) for a model blind to the images. */
static double image_token_loss(trainer *t, const run_config *c)
{
    synth_params p;
    hearth_err err = { { 0 } };
    assert_int_equal(synth_params_from_config(&p, c, &err), 0);
    synth_batch b = { 0 };
    assert_int_equal(synth_fill(&b, &p, 1000000000ULL, 32, &err), 0);
    int sep = synth_token(&p, SYNTH_SYM_SEP);
    for (int i = 0; i < b.n_seq * b.seq_len; i++)
        if (b.tokens[i] != sep)
            b.targets[i] = -1;
    vlm_batch v = synth_view(&b);
    model_stats ms;
    memset(&ms, 0, sizeof ms);
    if (model_forward(trainer_model(t), &v, &ms, &err))
        fail_msg("model_forward: %s", err.msg);
    assert_int_equal(ms.n_targets, b.n_images);
    synth_batch_free(&b);
    return ms.loss_sum / ms.n_targets;
}

/* Sanitizer builds run a step about ten times slower; there the loss test trains 100
 * steps (the loss reaches 1-2% of its start by then in plain runs; the image-conditioned
 * tokens are still being learnt, 0.6-1.4 nats against ln 16 = 2.77 for a blind model),
 * and the plain build trains the full 300 (image tokens near 0.01 nats).  The numbers are
 * bitwise the same in both builds. */
#if defined(__SANITIZE_ADDRESS__)
static const char *const loss_steps[] = { "train.steps=100", NULL };
#else
static const char *const loss_steps[] = { "train.steps=300", NULL };
#endif
/* A model blind to the images cannot go below ln 16 on the image-conditioned tokens.
 * Most seeds reach ~0.01 nats in 300 steps, but an occasional seed plateaus for a while
 * (seen: 2.11 nats at step 300 with HEARTH_TEST_SEED=250756646), so the bound sits at
 * 0.8 ln 16: still far from what a blind model can reach. */
#define IMAGE_LOSS_MAX (0.8 * log(16.0))

/* tiny-vlm, 300 steps on the synthetic task: the loss ends below 25% of the first, and
 * the model has learnt to read the images (encoder -> projector -> decoder works). */
static void test_loss_falls(void **state)
{
    (void)state;
    run_config *c = new_config(loss_steps);
    trainer *t = make_trainer(c);
    double img0 = image_token_loss(t, c);
    double first = 0, last = 0, last10 = 0;
    for (int i = 0; i < c->train.steps; i++) {
        train_step_stats st;
        assert_int_equal(step(t, &st), 0);
        if (i == 0)
            first = st.loss;
        if (i >= c->train.steps - 10)
            last10 += st.loss / 10;
        last = st.loss;
        if (i % 50 == 0 || i == c->train.steps - 1)
            print_message("# step %d loss %.6f grad_norm %.4f lr %.3g\n", st.step, st.loss,
                          st.grad_norm, st.lr);
    }
    print_message("# first %.6f last %.6f mean of last 10 %.6f (%.1f%%)\n", first, last,
                  last10, 100 * last10 / first);
    if (!(last10 < 0.25 * first))
        fail_msg("loss fell from %.6f to %.6f only (%.1f%% of the start, want < 25%%)", first,
                 last10, 100 * last10 / first);
    double img1 = image_token_loss(t, c);
    print_message("# image-conditioned tokens: loss %.6f -> %.6f (blind: ln 16 = %.4f)\n",
                  img0, img1, log(16.0));
    if (!(img1 < IMAGE_LOSS_MAX))
        fail_msg("image-conditioned loss %.6f: the model does not read the images", img1);
    trainer_free(t);
    free(c);
}

/* The first step (from 0) at which two runs' losses or gradient norms differ in any bit,
 * or -1 when none does. */
static int first_bit_diff(const double *l1, const double *g1, const double *l2,
                          const double *g2, int n)
{
    for (int i = 0; i < n; i++)
        if (memcmp(&l1[i], &l2[i], sizeof(double)) || memcmp(&g1[i], &g2[i], sizeof(double)))
            return i;
    return -1;
}

/* Same seed: bitwise-identical losses, norms and parameters; another seed: other losses. */
static void test_reproducible(void **state)
{
    (void)state;
    enum { N = 4 };
    run_config *c = new_config(NULL);
    double l1[N], l2[N], g1[N], g2[N], l3[N];
    run_steps(c, N, l1, g1);
    run_steps(c, N, l2, g2);
    int d = first_bit_diff(l1, g1, l2, g2, N);
    if (d >= 0)
        fail_msg("step %d: loss %.17g vs %.17g, grad norm %.17g vs %.17g", d + 1, l1[d],
                 l2[d], g1[d], g2[d]);
    make_config(c, g_seed + 1, NULL);
    run_steps(c, N, l3, NULL);
    int differ = 0;
    for (int i = 0; i < N; i++)
        differ += l1[i] != l3[i];
    if (differ < N)
        fail_msg("seeds %llu and %llu share %d of %d losses", (unsigned long long)g_seed,
                 (unsigned long long)g_seed + 1, N - differ, N);
    free(c);
}

/* The thread count does not change a bit (kernels split outputs, never reductions). */
static void test_threads_bitwise(void **state)
{
    (void)state;
    enum { N = 2 };
    run_config *c = new_config(NULL);
    int saved = omp_get_max_threads();
    double l1[N], l2[N], g1[N], g2[N];
    omp_set_num_threads(1);
    run_steps(c, N, l1, g1);
    omp_set_num_threads(saved > 1 ? saved : 2);
    run_steps(c, N, l2, g2);
    omp_set_num_threads(saved);
    int d = first_bit_diff(l1, g1, l2, g2, N);
    if (d >= 0)
        fail_msg("step %d: 1 thread loss %.17g norm %.17g, more threads %.17g %.17g", d + 1,
                 l1[d], g1[d], l2[d], g2[d]);
    free(c);
}

static double rel(double a, double b)
{
    return fabs(a - b) / fmax(fabs(a), fmax(fabs(b), 1e-30));
}

/* One micro batch of 4 or four of 1 or two of 2: the same step up to rounding, which
 * checks loss_scale (1/targets of the whole step) and the accumulation.  Compared: the
 * loss and gradient norm of two steps and the whole (clipped) gradient of the first.
 * Parameters are not compared: AdamW's first step is nearly sign(g) * lr, so entries
 * whose true gradient is zero (the k bias under softmax) move by rounding noise. */
static void test_micro_batches(void **state)
{
    (void)state;
    const char *mb1[] = { "train.micro_batch=1", "train.global_batch=4", NULL };
    const char *mb2[] = { "train.micro_batch=2", "train.global_batch=4", NULL };
    const char *mb4[] = { "train.micro_batch=4", "train.global_batch=4", NULL };
    const char *const *variants[3] = { mb1, mb2, mb4 };
    double loss[3][2], gn[3][2];
    float *grads[3];
    size_t np = 0;
    run_config *c = calloc(1, sizeof *c);
    assert_non_null(c);
    for (int v = 0; v < 3; v++) {
        make_config(c, g_seed, variants[v]);
        trainer *t = make_trainer(c);
        model *m = trainer_model(t);
        np = model_param_count(m);
        grads[v] = malloc(np * sizeof(float));
        assert_non_null(grads[v]);
        for (int i = 0; i < 2; i++) {
            train_step_stats st;
            assert_int_equal(step(t, &st), 0);
            loss[v][i] = st.loss;
            gn[v][i] = st.grad_norm;
            if (i == 0)
                memcpy(grads[v], model_grads(m), np * sizeof(float));
        }
        trainer_free(t);
    }
    for (int v = 1; v < 3; v++) {
        for (int i = 0; i < 2; i++)
            if (rel(loss[v][i], loss[0][i]) > 1e-5 || rel(gn[v][i], gn[0][i]) > 1e-4)
                fail_msg("variant %d step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g", v,
                         i + 1, loss[v][i], loss[0][i], gn[v][i], gn[0][i]);
        double d2 = 0, n2 = 0;
        for (size_t k = 0; k < np; k++) {
            double d = (double)grads[v][k] - grads[0][k];
            d2 += d * d;
            n2 += (double)grads[0][k] * grads[0][k];
        }
        if (getenv("HEARTH_TEST_VERBOSE"))
            print_message("# variant %d: relative gradient difference %g\n", v, sqrt(d2 / n2));
        if (!(n2 > 0) || sqrt(d2 / n2) > 1e-5)
            fail_msg("variant %d: gradients differ by %g (relative L2)", v, sqrt(d2 / n2));
    }
    for (int v = 0; v < 3; v++)
        free(grads[v]);
    free(c);
}

/* A frozen encoder is never updated; the rest is. */
static void test_frozen(void **state)
{
    (void)state;
    const char *kv[] = { "model.encoder.freeze=true", NULL };
    run_config *c = new_config(kv);
    trainer *t = make_trainer(c);
    model *m = trainer_model(t);
    size_t np;
    float *before = params_copy(m, &np);
    for (int i = 0; i < 2; i++) {
        train_step_stats st;
        assert_int_equal(step(t, &st), 0);
    }
    int frozen = 0, moved = 0;
    for (int i = 0; i < model_tensor_count(m); i++) {
        const model_tensor *tt = model_tensor_at(m, i);
        int same = !memcmp(before + tt->offset, model_params(m) + tt->offset,
                           tt->numel * sizeof(float));
        if (tt->frozen) {
            frozen++;
            if (!same)
                fail_msg("frozen tensor %s changed", tt->name);
        } else {
            moved += !same;
        }
        if (!strncmp(tt->name, "encoder.", 8) && !tt->frozen)
            fail_msg("%s is not marked frozen", tt->name);
    }
    assert_true(frozen > 0);
    assert_true(moved > 0);
    free(before);
    trainer_free(t);
    free(c);
}

/* A learning rate and weight decay that blow the weights up: the loss turns non-finite,
 * trainer_step says TRAIN_DIVERGED and leaves the parameters of that step alone. */
static void test_diverges(void **state)
{
    (void)state;
    const char *kv[] = { "train.lr=1000", "train.weight_decay=1000", "train.warmup=0",
                         "train.grad_clip=0", NULL };
    run_config *c = new_config(kv);
    trainer *t = make_trainer(c);
    model *m = trainer_model(t);
    size_t np;
    float *before = params_copy(m, &np);
    int rc = 0, i;
    train_step_stats st;
    for (i = 0; i < 30 && rc == 0; i++) {
        memcpy(before, model_params(m), np * sizeof(float));
        rc = step(t, &st);
    }
    if (rc != TRAIN_DIVERGED)
        fail_msg("no divergence in 30 steps (loss %g)", st.loss);
    assert_true(train_nonfinite(st.loss) || train_nonfinite(st.grad_norm));
    assert_int_equal(st.step, i);
    assert_int_equal(trainer_steps_done(t), i - 1);
    assert_memory_equal(before, model_params(m), np * sizeof(float));
    free(before);
    trainer_free(t);
    free(c);
}

/* The trainer's own checks: images that cannot fit in seq_len are a config error. */
static void test_config_checks(void **state)
{
    (void)state;
    const char *kv[] = { "train.seq_len=8", "data.images_min=2", "data.images_max=2", NULL };
    run_config *c = new_config(kv);
    trainer *t = NULL;
    hearth_err err = { { 0 } };
    assert_int_equal(trainer_create(&t, c, &err), HERR_CONFIG);
    assert_null(t);
    assert_non_null(strstr(err.msg, "data.images_min"));
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_reproducible, setup_seed),
        cmocka_unit_test_setup(test_threads_bitwise, setup_seed),
        cmocka_unit_test_setup(test_micro_batches, setup_seed),
        cmocka_unit_test_setup(test_frozen, setup_seed),
        cmocka_unit_test_setup(test_diverges, setup_seed),
        cmocka_unit_test_setup(test_config_checks, setup_seed),
        cmocka_unit_test_setup(test_loss_falls, setup_seed),
    };
    return cmocka_run_group_tests_name("train_loop", tests, NULL, NULL);
}
