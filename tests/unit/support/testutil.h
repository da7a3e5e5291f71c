/* testutil.h - shared helpers for the unit tests (and contrib/bench): a seeded random
 * generator whose seed is reported on failure, relative-error comparisons, and a
 * central finite-difference gradient checker.
 *
 * Seeds: tu_rng_fresh() returns a generator with a new seed from the clock and a counter,
 * so every run uses fresh inputs; with HEARTH_TEST_SEED=S in the environment every
 * tu_rng_fresh() starts from S, which replays a failing test (one generator per test).
 * The TU_ASSERT_* macros print the seed of the generator they are given.
 *
 * This file has no cmocka dependency (the bench links it too); only the TU_ASSERT_*
 * macros need <cmocka.h>, included before this header in the test file. */
#ifndef HEARTH_TESTUTIL_H
#define HEARTH_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* ---- random numbers ---------------------------------------------------------- */
typedef struct {
    uint64_t s[4];   /* xoshiro256** state */
    uint64_t seed;   /* the seed it was started from (reported on failure) */
} tu_rng;

void tu_rng_init(tu_rng *r, uint64_t seed);
tu_rng tu_rng_fresh(void);                      /* HEARTH_TEST_SEED or clock ^ counter */
/* tu_rng_fresh, and its seed printed on stdout as a TAP comment ("# HEARTH_TEST_SEED=S"),
 * for tests that keep one generator per test and report the seed up front. */
tu_rng tu_rng_fresh_noted(void);
/* A 32-bit seed for a test's own small generator: HEARTH_TEST_SEED, else the clock; printed
 * on stdout as "# seed S (set HEARTH_TEST_SEED to repeat)". */
unsigned tu_seed_noted(void);
uint64_t tu_next(tu_rng *r);
double tu_uniform(tu_rng *r);                   /* [0, 1) */
double tu_normal(tu_rng *r);                    /* N(0, 1) */
int tu_randint(tu_rng *r, int lo, int hi);      /* [lo, hi) */
void tu_fill_uniform(tu_rng *r, float *x, size_t n, float lo, float hi);
void tu_fill_normal(tu_rng *r, float *x, size_t n, float mean, float std);

/* ---- allocation: zeroed, never NULL (aborts the test program when out of memory) ---- */
float *tu_falloc(size_t n);
double *tu_dalloc(size_t n);
int *tu_ialloc(size_t n);
float *tu_fdup(const float *x, size_t n);

/* ---- comparisons ------------------------------------------------------------------
 * Relative L2 error ||got - ref|| / ||ref|| (absolute when ref is all zeros).  NaN or
 * inf anywhere gives +inf, so `!(err <= tol)` catches it. */
double tu_rel_l2(const float *got, const double *ref, size_t n);
double tu_rel_l2_ff(const float *got, const float *ref, size_t n);
double tu_max_abs_diff(const float *a, const float *b, size_t n);
int tu_bitwise_equal(const float *a, const float *b, size_t n);
/* sum_i w[i] * x[i] in double: the random linear functional used for gradient checks */
double tu_dot_fd(const float *w, const double *x, size_t n);

/* ---- finite-difference gradient check ------------------------------------------------
 * `loss` evaluates a scalar from the current contents of `param` (which the checker
 * perturbs in place and restores exactly).  For each checked entry i the central
 * difference (L(p_i + h) - L(p_i - h)) / (p_i+ - p_i-) uses the float values actually
 * stored, so rounding of the perturbed parameter does not bias it.  Entry i passes when
 *     |grad[i] - fd[i]| <= tol * (|fd[i]| + rms(fd)) + atol
 * where rms(fd) is over all checked entries (a scale that keeps near-zero entries from
 * failing on noise).  Kernel tests evaluate the loss in double on the fp32 inputs;
 * whole-model checks in float want a larger eps and tol. */
typedef double (*tu_loss_fn)(void *ctx);

typedef struct {
    double eps;          /* absolute perturbation; 0 means 1e-3 */
    double tol;          /* relative tolerance; 0 means 1e-3 */
    double atol;         /* absolute slack, default 0 */
    size_t max_samples;  /* 0: every entry; else this many random entries */
} tu_fd_opts;

typedef struct {
    size_t checked;      /* entries compared */
    size_t failed;       /* entries over tolerance */
    double max_ratio;    /* max over entries of |grad - fd| / (tol*(|fd| + rms) + atol) */
    double rel_l2;       /* ||grad - fd|| / ||fd|| over the checked entries */
    size_t worst;        /* index of the entry with max_ratio */
    double worst_grad, worst_fd;
    char msg[256];       /* one-line summary, filled always */
} tu_fd_result;

/* Returns 0 when every checked entry passes, 1 otherwise (res->msg says why; with
 * HEARTH_TEST_VERBOSE set in the environment it is printed to stderr always). */
int tu_fdcheck(float *param, size_t n, const float *grad, tu_loss_fn loss, void *ctx,
               const tu_fd_opts *opt, tu_rng *rng, tu_fd_result *res);

/* ---- assertion macros (need <cmocka.h>) ------------------------------------------- */
#define TU_ASSERT_LE(val, tol, rng, what)                                                  \
    do {                                                                                   \
        double tu_v_ = (val), tu_t_ = (tol);                                               \
        if (!(tu_v_ <= tu_t_))                                                             \
            fail_msg("%s: %.4g > %.4g (seed %llu; replay with HEARTH_TEST_SEED=%llu)",     \
                     (what), tu_v_, tu_t_, (unsigned long long)(rng)->seed,                \
                     (unsigned long long)(rng)->seed);                                     \
    } while (0)

#define TU_ASSERT_FD(param, n, grad, loss, ctx, opt, rng, what)                            \
    do {                                                                                   \
        tu_fd_result tu_r_;                                                                \
        if (tu_fdcheck((param), (n), (grad), (loss), (ctx), (opt), (rng), &tu_r_))         \
            fail_msg("%s: %s (seed %llu; replay with HEARTH_TEST_SEED=%llu)", (what),      \
                     tu_r_.msg, (unsigned long long)(rng)->seed,                           \
                     (unsigned long long)(rng)->seed);                                     \
    } while (0)

#define TU_ASSERT_BITWISE(a, b, n, rng, what)                                              \
    do {                                                                                   \
        if (!tu_bitwise_equal((a), (b), (n)))                                              \
            fail_msg("%s: not bitwise equal, max |diff| %.4g (seed %llu)", (what),         \
                     tu_max_abs_diff((a), (b), (n)), (unsigned long long)(rng)->seed);     \
    } while (0)

#endif
