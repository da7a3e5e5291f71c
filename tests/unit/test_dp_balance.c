/* test_dp_balance.c - dp_balance_assign (trainer/parallel/dp_balance.h) on fresh random
 * costs: equal shares, never worse than the plain assignment, close to the optimum
 * (brute force on small cases: within the longest-processing-time bound 4/3), the plain
 * assignment kept when nothing beats it, determinism, and bad arguments refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/dp_balance.h"
#include "support/testutil.h"

static double max_load(const double *cost, const int *rank_of, int n, int R)
{
    double load[16] = { 0 };
    for (int m = 0; m < n; m++)
        load[rank_of[m]] += cost[m];
    double mx = 0;
    for (int r = 0; r < R; r++)
        mx = fmax(mx, load[r]);
    return mx;
}

/* The best max load over every equal-share assignment (n <= 8, R <= 4). */
static double brute(const double *cost, int n, int R, int *cur, int m, int *count)
{
    if (m == n)
        return max_load(cost, cur, n, R);
    double best = INFINITY;
    for (int r = 0; r < R; r++) {
        if (count[r] == n / R)
            continue;
        cur[m] = r;
        count[r]++;
        best = fmin(best, brute(cost, n, R, cur, m + 1, count));
        count[r]--;
    }
    return best;
}

static void test_random_costs(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    for (int rep = 0; rep < 300; rep++) {
        int R = tu_randint(&rng, 1, 5), per = tu_randint(&rng, 1, 3), n = R * per;
        double cost[16];
        for (int m = 0; m < n; m++) {
            /* quadratic in a random size, as image costs are; some zero */
            double s = tu_randint(&rng, 0, 4) ? tu_uniform(&rng) * 10 : 0;
            cost[m] = s * s + s;
        }
        int rank_of[16], again[16], plain[16], cur[16], count[4] = { 0 };
        dp_balance_stats st;
        hearth_err err;
        assert_int_equal(dp_balance_assign(cost, n, R, DP_BALANCE_ROUNDS, rank_of, &st, &err),
                         0);
        assert_int_equal(dp_balance_assign(cost, n, R, DP_BALANCE_ROUNDS, again, NULL, &err),
                         0);
        assert_memory_equal(rank_of, again, sizeof(int) * (size_t)n);
        int share[4] = { 0 };
        for (int m = 0; m < n; m++) {
            assert_true(rank_of[m] >= 0 && rank_of[m] < R);
            share[rank_of[m]]++;
            plain[m] = m / per;
        }
        for (int r = 0; r < R; r++)
            assert_int_equal(share[r], per);
        double got = max_load(cost, rank_of, n, R), pl = max_load(cost, plain, n, R);
        assert_true(got <= pl);
        if (got == pl)   /* nothing better found: the plain assignment stays */
            assert_memory_equal(rank_of, plain, sizeof(int) * (size_t)n);
        double opt = brute(cost, n, R, cur, 0, count);
        if (!(got <= opt * 4.0 / 3.0 + 1e-9))
            fail_msg("R %d n %d: max load %g, optimum %g (seed %llu)", R, n, got, opt,
                     (unsigned long long)rng.seed);
        int moved = 0;
        for (int m = 0; m < n; m++)
            moved += rank_of[m] != plain[m];
        assert_int_equal(st.moved, moved);
        assert_true(st.after <= st.before + 1e-12);
    }
}

/* A case the plain split gets badly wrong: both large ones on rank 0. */
static void test_known_case(void **state)
{
    (void)state;
    const double cost[4] = { 100, 90, 1, 2 };
    int rank_of[4];
    dp_balance_stats st;
    hearth_err err;
    assert_int_equal(dp_balance_assign(cost, 4, 2, DP_BALANCE_ROUNDS, rank_of, &st, &err), 0);
    assert_int_not_equal(rank_of[0], rank_of[1]);
    assert_true(max_load(cost, rank_of, 4, 2) == 101);
    assert_true(st.before > st.after);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    const double cost[3] = { 1, 2, 3 }, bad[2] = { 1, NAN };
    int rank_of[3];
    hearth_err err;
    assert_int_not_equal(dp_balance_assign(cost, 3, 2, 4, rank_of, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "evenly"));
    assert_int_not_equal(dp_balance_assign(bad, 2, 2, 4, rank_of, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "micro batch 1"));
    assert_int_not_equal(dp_balance_assign(cost, 3, 0, 4, rank_of, NULL, &err), 0);
    assert_int_equal(dp_balance_assign(cost, 0, 2, 4, rank_of, NULL, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_costs),
        cmocka_unit_test(test_known_case),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests_name("dp_balance", tests, NULL, NULL);
}
