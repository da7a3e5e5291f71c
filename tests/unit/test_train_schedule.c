/* test_train_schedule.c - the warmup + cosine learning-rate schedule.
 * Random schedules from a clock seed (printed; HEARTH_TEST_SEED replays one). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <math.h>

#include <cmocka.h>

#include "schedule.h"
#include "support/testutil.h"

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}

static lr_schedule random_schedule(void)
{
    lr_schedule s;
    s.lr = 1e-5 + tu_uniform(&g_rng) * 1e-2;
    s.min_lr = tu_next(&g_rng) % 4 == 0 ? 0.0 : s.lr * tu_uniform(&g_rng) * 0.5;
    s.steps = 2 + (int)(tu_next(&g_rng) % 2000);
    s.warmup = tu_next(&g_rng) % 4 == 0 ? 0 : (int)(tu_next(&g_rng) % (uint64_t)s.steps);
    return s;
}

static void near(double got, double want, const char *what, int step)
{
    if (fabs(got - want) > 1e-12 * fmax(1.0, fabs(want)))
        fail_msg("%s at step %d: got %.17g, want %.17g", what, step, got, want);
}

/* Warmup is linear from lr/warmup at step 1 to lr at step warmup. */
static void test_warmup(void **state)
{
    (void)state;
    for (int t = 0; t < 200; t++) {
        lr_schedule s = random_schedule();
        for (int i = 1; i <= s.warmup; i++)
            near(schedule_lr(&s, i), s.lr * i / s.warmup, "warmup", i);
        if (s.warmup > 0) {
            assert_true(schedule_lr(&s, 1) > 0);
            near(schedule_lr(&s, s.warmup), s.lr, "end of warmup", s.warmup);
        }
    }
}

/* After warmup the cosine falls from lr, passes (lr+min)/2 half way, reaches min_lr on
 * the last step and stays there; it never rises and stays within [min_lr, lr]. */
static void test_cosine(void **state)
{
    (void)state;
    for (int t = 0; t < 200; t++) {
        lr_schedule s = random_schedule();
        near(schedule_lr(&s, s.steps), s.min_lr, "last step", s.steps);
        near(schedule_lr(&s, s.steps + 1 + (int)(tu_next(&g_rng) % 1000)), s.min_lr, "after end",
             s.steps);
        if ((s.steps - s.warmup) % 2 == 0) {
            int mid = s.warmup + (s.steps - s.warmup) / 2;
            near(schedule_lr(&s, mid), 0.5 * (s.lr + s.min_lr), "half way", mid);
        }
        double prev = s.lr;
        for (int i = s.warmup + 1; i <= s.steps; i++) {
            double lr = schedule_lr(&s, i);
            if (lr > prev + 1e-15 || lr < s.min_lr - 1e-15 || lr > s.lr + 1e-15)
                fail_msg("step %d: lr %.17g after %.17g (lr %g min %g warmup %d steps %d)", i,
                         lr, prev, s.lr, s.min_lr, s.warmup, s.steps);
            prev = lr;
        }
        /* just after warmup the decay has barely started */
        if (s.steps - s.warmup >= 2 && s.min_lr < s.lr) {
            double first = schedule_lr(&s, s.warmup + 1);
            double p = 1.0 / (s.steps - s.warmup);
            near(first, s.min_lr + (s.lr - s.min_lr) * 0.5 * (1 + cos(M_PI * p)), "first decay",
                 s.warmup + 1);
            assert_true(first > s.min_lr);
        }
    }
}

/* No warmup: step 1 runs just below the peak; out-of-range steps clamp. */
static void test_no_warmup(void **state)
{
    (void)state;
    lr_schedule s = random_schedule();
    s.warmup = 0;
    s.min_lr = 0.5 * s.lr;
    double p = 1.0 / s.steps;
    near(schedule_lr(&s, 1), s.min_lr + (s.lr - s.min_lr) * 0.5 * (1 + cos(M_PI * p)), "step 1", 1);
    near(schedule_lr(&s, 0), schedule_lr(&s, 1), "step 0 clamps to 1", 0);
    near(schedule_lr(&s, s.steps), s.min_lr, "end", s.steps);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_warmup, setup_seed),
        cmocka_unit_test_setup(test_cosine, setup_seed),
        cmocka_unit_test_setup(test_no_warmup, setup_seed),
    };
    return cmocka_run_group_tests_name("train_schedule", tests, NULL, NULL);
}
