/* test_model_fp8.c - emulated FP8 linears in the model and the training step (model/fp8.h):
 * a plan that puts nothing in FP8 is the fp32 model bit for bit; `all` and a selective
 * policy stay close to fp32 in one step and in training; the decisions of a plan.
 *
 * Seeds come from the clock (printed; HEARTH_TEST_SEED replays a failure). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "model/fp8.h"
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

/* tiny-vlm on the synthetic task, small enough for many steps on two cores. */
#ifndef FP8_TRAIN_LR
#define FP8_TRAIN_LR "1.0e-4"
#endif
static const char *base_yaml =
    "model: tiny-vlm\n"
    "train:\n"
    "  steps: 200\n"
    "  seq_len: 32\n"
    "  micro_batch: 2\n"
    "  global_batch: 4\n"
    "  lr: " FP8_TRAIN_LR "\n"
    "  min_lr: 1.0e-5\n"
    "  warmup: 20\n"
    "  weight_decay: 0.0\n"
    "  grad_clip: 1.0\n"
    "data:\n"
    "  images_min: 1\n"
    "  images_max: 2\n"
    "  image_px_min: 16\n"
    "  image_px_max: 32\n";

static void make_config(run_config *c, const char *kv)
{
    runcfg_list l;
    runcfg_init(&l);
    runcfg_add_seed(&l, g_seed);
    runcfg_add_kv(&l, &kv, kv ? 1 : 0);
    hearth_err err = { { 0 } };
    if (runcfg_parse(c, base_yaml, &l, 1, &err))
        fail_msg("config: %s", err.msg);
}

/* A trainer whose model follows `plan` (NULL: fp32). */
static trainer *make_trainer(const run_config *c, const fp8_plan *plan)
{
    trainer *t = NULL;
    hearth_err err = { { 0 } };
    if (trainer_create(&t, c, &err))
        fail_msg("trainer_create: %s", err.msg);
    if (plan && model_set_fp8(trainer_model(t), plan, &err))
        fail_msg("model_set_fp8: %s", err.msg);
    return t;
}

static void run(const run_config *c, const fp8_plan *plan, int steps, double *loss,
                float **params)
{
    trainer *t = make_trainer(c, plan);
    hearth_err err = { { 0 } };
    for (int i = 0; i < steps; i++) {
        train_step_stats st;
        if (trainer_step(t, &st, &err))
            fail_msg("step %d: %s", i + 1, err.msg);
        loss[i] = st.loss;
    }
    if (params) {
        size_t n = model_param_count(trainer_model(t));
        *params = malloc(n * sizeof(float));
        assert_non_null(*params);
        memcpy(*params, model_params(trainer_model(t)), n * sizeof(float));
    }
    trainer_free(t);
}

/* A selective plan over the decoder's dense linears and the encoder's and projector's
 * fc1, with the last decoder layer kept (what `hearth select fp8` would write). */
static fp8_rule sel_rules[] = {
    { FP8_COMP_DECODER, FP8_QKV, 1, 64, 0, 1.2 },
    { FP8_COMP_DECODER, FP8_FC1, 1, 64, 0, 1.4 },
    { FP8_COMP_DECODER, FP8_FC2, 1, 64, 0, 1.3 },
    { FP8_COMP_ENCODER, FP8_FC1, 1, 16, 0, 1.1 },
    { FP8_COMP_PROJECTOR, FP8_FC1, 1, 1, 0, 1.1 },
};
static fp8_keep sel_keep[] = { { FP8_COMP_DECODER, FP8_ANY, FP8_LAST_LAYER } };

static void test_nothing_in_fp8_is_fp32_bitwise(void **state)
{
    (void)state;
    run_config c;
    make_config(&c, NULL);
    enum { S = 3 };
    double l0[S], l1[S], l2[S];
    float *p0, *p1, *p2;
    run(&c, NULL, S, l0, &p0);
    fp8_plan empty = { .history = 4 };                  /* selective, no rule */
    run(&c, &empty, S, l1, &p1);
    /* rules that never apply: another tp, more tokens than any micro batch */
    fp8_rule never[2] = { { FP8_COMP_DECODER, FP8_FC1, 2, 0, 0, 2.0 },
                          { FP8_COMP_DECODER, FP8_FC2, 1, 1000000, 0, 2.0 } };
    fp8_plan none = { .rules = never, .n_rules = 2, .history = 4 };
    run(&c, &none, S, l2, &p2);
    trainer *t = make_trainer(&c, NULL);
    size_t n = model_param_count(trainer_model(t));
    trainer_free(t);
    for (int i = 0; i < S; i++) {
        assert_memory_equal(&l0[i], &l1[i], sizeof(double));
        assert_memory_equal(&l0[i], &l2[i], sizeof(double));
    }
    assert_memory_equal(p0, p1, n * sizeof(float));
    assert_memory_equal(p0, p2, n * sizeof(float));
    free(p0), free(p1), free(p2);
}

/* One step: FP8 changes the numbers (it is applied) but not by much. */
static void test_one_step_close(void **state)
{
    (void)state;
    run_config c;
    make_config(&c, "train.grad_clip=0");
    fp8_plan all = { .all = 1, .history = 4 };
    fp8_plan cur = { .all = 1, .current = 1, .margin = 1 };
    fp8_plan sel = { .rules = sel_rules, .n_rules = 5, .keep = sel_keep, .n_keep = 1,
                     .history = 4 };
    const fp8_plan *plans[3] = { &all, &cur, &sel };
    double l0, l1;
    trainer *t0 = make_trainer(&c, NULL);
    hearth_err err = { { 0 } };
    train_step_stats st;
    assert_int_equal(trainer_step(t0, &st, &err), 0);
    l0 = st.loss;
    model *m0 = trainer_model(t0);
    size_t n = model_param_count(m0);
    for (int k = 0; k < 3; k++) {
        trainer *t1 = make_trainer(&c, plans[k]);
        assert_int_equal(trainer_step(t1, &st, &err), 0);
        l1 = st.loss;
        const float *g0 = model_grads(m0), *g1 = model_grads(trainer_model(t1));
        double d2 = 0, r2 = 0;
        for (size_t i = 0; i < n; i++) {
            d2 += ((double)g1[i] - g0[i]) * ((double)g1[i] - g0[i]);
            r2 += (double)g0[i] * g0[i];
        }
        double rel = sqrt(d2 / r2);
        print_message("# plan %d: loss %.6f vs %.6f, gradient relative error %.4f\n", k, l1,
                      l0, rel);
        assert_true(l1 != l0);                          /* FP8 is really on */
        assert_true(fabs(l1 - l0) < 0.01 * l0);
        assert_true(rel > 0 && rel < 0.25);
        trainer_free(t1);
    }
    trainer_free(t0);
}

/* Training: the loss after STEPS steps is within 2% of fp32's (mean of the last 10).
 * 200 steps take minutes on two busy cores, so the test runs 40; docs/perf.md records the
 * 200-step runs (gaps 0.4-0.6% over five seeds; at 40 steps 0.08-0.21%).  The learning rate
 * keeps the loss far from zero (about 4.2 after 40 steps, 0.9 after 200), where a relative
 * bound means something. */
#ifndef FP8_TRAIN_STEPS
#ifdef __SANITIZE_ADDRESS__
#define FP8_TRAIN_STEPS 6         /* the sanitizers' build: memory checks, not the bound */
#else
#define FP8_TRAIN_STEPS 40
#endif
#endif
static void test_training_close(void **state)
{
    (void)state;
    run_config c;
    make_config(&c, NULL);
    enum { S = FP8_TRAIN_STEPS, TAIL = S < 20 ? S / 2 : 10 };
    static double l[3][S];
    fp8_plan all = { .all = 1, .history = 16 };
    fp8_plan sel = { .rules = sel_rules, .n_rules = 5, .keep = sel_keep, .n_keep = 1,
                     .history = 16 };
    const fp8_plan *plans[3] = { NULL, &all, &sel };
    double ms[3];
    for (int k = 0; k < 3; k++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        run(&c, plans[k], S, l[k], NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ms[k] = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6) / S;
    }
    print_message("# ms per step: fp32 %.1f all %.1f selective %.1f\n", ms[0], ms[1], ms[2]);
    double tail[3] = { 0, 0, 0 };
    for (int k = 0; k < 3; k++)
        for (int i = S - TAIL; i < S; i++)
            tail[k] += l[k][i] / TAIL;
    print_message("# %d steps: first loss %.4f, tail mean fp32 %.5f all %.5f selective "
                  "%.5f\n", S, l[0][0], tail[0], tail[1], tail[2]);
    if (S >= 40)
        assert_true(tail[0] < 0.8 * l[0][0]);           /* it trained */
    assert_true(fabs(tail[1] - tail[0]) <= 0.02 * tail[0]);
    assert_true(fabs(tail[2] - tail[0]) <= 0.02 * tail[0]);
}

static void test_plan_decisions(void **state)
{
    (void)state;
    fp8_rule r[2] = { { FP8_COMP_DECODER, FP8_FC1, 2, 1024, 0, 1.3 },
                      { FP8_COMP_ENCODER, FP8_QKV, 1, 100, 4000, 1.1 } };
    fp8_keep k[3] = { { FP8_ANY, FP8_LM_HEAD, FP8_ANY },
                      { FP8_COMP_DECODER, FP8_ANY, 0 },
                      { FP8_COMP_DECODER, FP8_FC1, FP8_LAST_LAYER } };
    fp8_plan p = { .rules = r, .n_rules = 2, .keep = k, .n_keep = 3 };
    int D = FP8_COMP_DECODER, E = FP8_COMP_ENCODER;
    assert_true(fp8_plan_uses(&p, D, FP8_FC1, 3, 8, 2, 1024));
    assert_false(fp8_plan_uses(&p, D, FP8_FC1, 3, 8, 2, 1023));     /* below min_tokens */
    assert_false(fp8_plan_uses(&p, D, FP8_FC1, 3, 8, 1, 4096));     /* another tp */
    assert_false(fp8_plan_uses(&p, D, FP8_FC2, 3, 8, 2, 4096));     /* no rule: fp32 */
    assert_false(fp8_plan_uses(&p, D, FP8_FC1, 0, 8, 2, 4096));     /* layer 0 kept */
    assert_false(fp8_plan_uses(&p, D, FP8_FC1, 7, 8, 2, 4096));     /* last layer kept */
    assert_true(fp8_plan_uses(&p, E, FP8_QKV, 7, 8, 1, 4000));
    assert_false(fp8_plan_uses(&p, E, FP8_QKV, 7, 8, 1, 4001));     /* above max_tokens */
    assert_false(fp8_plan_uses(NULL, D, FP8_FC1, 3, 8, 2, 4096));
    fp8_plan all = { .all = 1, .keep = k, .n_keep = 1 };
    assert_true(fp8_plan_uses(&all, D, FP8_EXPERT_FC2, 0, 8, 4, 1));
    assert_false(fp8_plan_uses(&all, D, FP8_ROUTER, 3, 8, 1, 4096));
    assert_false(fp8_plan_uses(&all, D, FP8_LM_HEAD, FP8_ANY, 8, 1, 4096));
    fp8_keep lm = { FP8_ANY, FP8_LM_HEAD, FP8_ANY };
    fp8_rule head = { D, FP8_LM_HEAD, 1, 0, 0, 1.5 };
    fp8_plan h = { .rules = &head, .n_rules = 1 };
    assert_true(fp8_plan_uses(&h, D, FP8_LM_HEAD, FP8_ANY, 8, 1, 10));
    h.keep = &lm;
    h.n_keep = 1;
    assert_false(fp8_plan_uses(&h, D, FP8_LM_HEAD, FP8_ANY, 8, 1, 10));
    for (int i = 0; i < FP8_KINDS; i++)
        assert_int_equal(fp8_kind_parse(fp8_kind_name(i)), i);
    for (int i = 0; i < FP8_COMPS; i++)
        assert_int_equal(fp8_comp_parse(fp8_comp_name(i)), i);
    assert_int_equal(fp8_kind_parse("gate_up"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_decisions),
        cmocka_unit_test(test_nothing_in_fp8_is_fp32_bitwise),
        cmocka_unit_test(test_one_step_close),
        cmocka_unit_test(test_training_close),
    };
    return cmocka_run_group_tests_name("model_fp8", tests, setup_seed, NULL);
}
