/* testutil.c - see testutil.h. */
#include "tests/unit/support/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tu_rng_init(tu_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->seed = seed;
}

tu_rng tu_rng_fresh(void)
{
    /* A counter makes two generators created in the same nanosecond differ. */
    static uint64_t counter;
    tu_rng r;
    const char *env = getenv("HEARTH_TEST_SEED");
    uint64_t seed;
    if (env && *env) {
        seed = strtoull(env, NULL, 10); /* replay: every generator gets this seed */
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;
        x ^= ++counter * 0x2545f4914f6cdd1dull;
        seed = splitmix64(&x) % 1000000000000ull; /* short enough to type */
    }
    tu_rng_init(&r, seed);
    return r;
}

tu_rng tu_rng_fresh_noted(void)
{
    tu_rng r = tu_rng_fresh();
    printf("# HEARTH_TEST_SEED=%llu\n", (unsigned long long)r.seed);
    return r;
}

unsigned tu_seed_noted(void)
{
    const char *env = getenv("HEARTH_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("# seed %u (set HEARTH_TEST_SEED to repeat)\n", seed);
    return seed;
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tu_next(tu_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1.0p-53; }

double tu_normal(tu_rng *r)
{
    double u1 = tu_uniform(r), u2 = tu_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

int tu_randint(tu_rng *r, int lo, int hi)
{
    if (hi <= lo)
        return lo;
    return lo + (int)(tu_next(r) % (uint64_t)(hi - lo));
}

void tu_fill_uniform(tu_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * tu_uniform(r));
}

void tu_fill_normal(tu_rng *r, float *x, size_t n, float mean, float std)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(mean + std * tu_normal(r));
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "testutil: out of memory (%zu x %zu bytes)\n", n, size);
        abort();
    }
    return p;
}

float *tu_falloc(size_t n) { return xcalloc(n, sizeof(float)); }
double *tu_dalloc(size_t n) { return xcalloc(n, sizeof(double)); }
int *tu_ialloc(size_t n) { return xcalloc(n, sizeof(int)); }

float *tu_fdup(const float *x, size_t n)
{
    float *y = tu_falloc(n);
    if (n)
        memcpy(y, x, n * sizeof *y);
    return y;
}

double tu_rel_l2(const float *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i]))
            return INFINITY;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double tu_rel_l2_ff(const float *got, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i]))
            return INFINITY;
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double tu_max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = d; /* also propagates NaN */
    }
    return m;
}

int tu_bitwise_equal(const float *a, const float *b, size_t n)
{
    return n == 0 || memcmp(a, b, n * sizeof *a) == 0;
}

double tu_dot_fd(const float *w, const double *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)w[i] * x[i];
    return s;
}

int tu_fdcheck(float *param, size_t n, const float *grad, tu_loss_fn loss, void *ctx,
               const tu_fd_opts *opt, tu_rng *rng, tu_fd_result *res)
{
    double eps = opt && opt->eps > 0 ? opt->eps : 1e-3;
    double tol = opt && opt->tol > 0 ? opt->tol : 1e-3;
    double atol = opt ? opt->atol : 0;
    size_t m = opt && opt->max_samples && opt->max_samples < n ? opt->max_samples : n;

    memset(res, 0, sizeof *res);
    if (m == 0) {
        snprintf(res->msg, sizeof res->msg, "nothing to check");
        return 0;
    }
    size_t *idx = xcalloc(m, sizeof *idx);
    double *fd = xcalloc(m, sizeof *fd);
    for (size_t s = 0; s < m; s++)
        idx[s] = m == n ? s : (size_t)(tu_next(rng) % n);

    double sumsq = 0;
    for (size_t s = 0; s < m; s++) {
        size_t i = idx[s];
        float p0 = param[i];
        /* An absolute step (the loss's curvature does not scale with the entry); where it
         * is below the float spacing, one ulp each way. */
        float pp = (float)(p0 + eps), pm = (float)(p0 - eps);
        if (pp == p0)
            pp = nextafterf(p0, INFINITY);
        if (pm == p0)
            pm = nextafterf(p0, -INFINITY);
        param[i] = pp;
        double lp = loss(ctx);
        param[i] = pm;
        double lm = loss(ctx);
        param[i] = p0;
        fd[s] = (lp - lm) / ((double)pp - (double)pm);
        sumsq += fd[s] * fd[s];
    }
    double rms = sqrt(sumsq / (double)m);

    double num = 0, den = 0;
    res->checked = m;
    for (size_t s = 0; s < m; s++) {
        double g = grad[idx[s]];
        double d = fabs(g - fd[s]);
        double ratio = d / (tol * (fabs(fd[s]) + rms) + atol + 1e-300);
        if (!isfinite(g) || !isfinite(fd[s]))
            ratio = INFINITY;
        if (!(ratio <= 1.0))
            res->failed++;
        if (!(ratio <= res->max_ratio) || s == 0) {
            res->max_ratio = ratio;
            res->worst = idx[s];
            res->worst_grad = g;
            res->worst_fd = fd[s];
        }
        num += d * d;
        den += fd[s] * fd[s];
    }
    res->rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    snprintf(res->msg, sizeof res->msg,
             "%zu/%zu entries off; worst [%zu] grad %.6g vs fd %.6g (ratio %.3g, tol %.2g); "
             "rel L2 %.3g",
             res->failed, res->checked, res->worst, res->worst_grad, res->worst_fd,
             res->max_ratio, tol, res->rel_l2);
    if (getenv("HEARTH_TEST_VERBOSE"))
        fprintf(stderr, "fdcheck: %s\n", res->msg);
    free(idx);
    free(fd);
    return res->failed ? 1 : 0;
}
