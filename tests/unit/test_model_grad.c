/* test_model_grad.c - whole-model gradient checks by central finite differences.
 *
 * Objective: loss_scale * sum of token losses + aux_scale * MoE aux loss, evaluated by
 * model_forward (fp32 model, loss summed in double), loss_scale = 1 / target tokens.
 *
 * Parameters are first moved to generic random values of a healthy scale
 * (tm_randomize_params): at the 0.02 initialisation the encoder's gradients are within
 * the fp32 noise of the loss and would go untested.
 *
 * Every parameter tensor is checked: on the hand-filled shapes (gpt2-like, Qwen2.5-VL-
 * like, MoE VLM, random feature mixes) a few random entries, the entries with the
 * largest analytic gradient among random candidates, and one random direction over the
 * whole tensor; on the tiny-vlm / tiny-vlm-moe presets (5 ms a forward) one direction per
 * tensor.  A frozen tensor must have an all-zero gradient instead.
 *
 * Precision: a loss evaluation carries fp32 rounding noise.  It is measured, not
 * guessed: the difference quotient at two nearly equal steps (h and h * 33/32) differs by
 * the noise alone (the truncation error moves by 6%), the worst of 8 random entries.
 * With EPS = 1e-2 (relative to max(1, |p|)) the truncation error is near 1e-4 relative.
 * A check passes when
 *     |grad - fd| <= RTOL * max(|grad|, |fd|) + ATOL * scale + NOISE_MULT * noise * EPS/h
 * with scale the tensor's RMS checked gradient (entries) or ||grad|| (directions), so a
 * near-zero entry is not failed on noise alone.  A check over the tolerance is repeated
 * with a quarter, then a 16th and a 64th of the step and passes if one does (truncation
 * error falls 16x each time, a wrong gradient stays wrong).  Correct code passes with ratios below 0.5; a broken
 * backward (a dropped factor or branch, a wrong index, a missing RoPE backward, image
 * rows leaking into the embedding gradient) fails by 2x to 100x.
 *
 * MoE: a perturbation that changes any token's top-k experts makes the loss jump.  For
 * single entries the routing is compared after every evaluation (model_last_routing); a
 * step that changes it is redone with the routing pinned to the unperturbed one
 * (model_pin_routing), with which the loss is smooth and its gradient at the base point
 * is the one the backward computes.  Directions, which move a whole tensor and change
 * some token's routing too often, are always evaluated pinned. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/model.h"
#include "support/testutil.h"
#include "test_model_util.h"

#define EPS 1e-2
#define RTOL 1e-2
#define ATOL 1e-2
#define NOISE_MULT 4
#define N_UNIFORM 3
#define N_LARGEST 2
#define N_CANDIDATES 64
#define MAX_TRIES 40
#define RETRY_MAX_DIV 64   /* smallest retry step: EPS / 64 */

typedef struct {
    model *m;
    const vlm_batch *b;
    float ls, as;
    int *route0, *route;
    size_t nroute;
    int verbose;
    int evals;
} fd_ctx;

static double objective(fd_ctx *c, int *route_changed)
{
    model_stats st;
    hearth_err err;
    c->evals++;
    int rc = model_forward(c->m, c->b, &st, &err);
    if (rc)
        fail_msg("model_forward: %s", err.msg);
    *route_changed = 0;
    if (c->nroute) {
        model_last_routing(c->m, c->route, c->nroute);
        *route_changed = memcmp(c->route, c->route0, c->nroute * sizeof(int)) != 0;
    }
    return (double)c->ls * st.loss_sum + (double)c->as * st.aux_loss;
}

/* Central difference in entry p[i] with step h. */
static int fd_step(fd_ctx *c, float *p, size_t i, double h, double *fd)
{
    float p0 = p[i];
    float pp = (float)(p0 + h), pm = (float)(p0 - h);
    int ch1, ch2;
    p[i] = pp;
    double lp = objective(c, &ch1);
    p[i] = pm;
    double lm = objective(c, &ch2);
    p[i] = p0;
    if (ch1 || ch2)
        return 0;
    *fd = (lp - lm) / ((double)pp - (double)pm);
    return 1;
}

/* Central difference in entry p[i] with step h0; when the step changes the MoE routing, it is redone
 * with the routing pinned to the unperturbed one (smaller steps would keep the routing
 * more often, but their rounding noise grows as 1/h and swamps small gradients).
 * Returns 1 when the routing stayed as it was on its own, 0 when it had to be pinned
 * (counted as a skip). */
static int fd_entry(fd_ctx *c, float *p, size_t i, double h0, double *fd)
{
    if (fd_step(c, p, i, h0, fd))
        return 1;
    hearth_err err;
    if (model_pin_routing(c->m, c->route0, c->nroute, &err))
        fail_msg("model_pin_routing: %s", err.msg);
    int ok = fd_step(c, p, i, h0, fd);
    model_pin_routing(c->m, NULL, 0, &err);
    if (!ok)
        fail_msg("the pinned routing changed");
    return 0;
}

/* Directional difference along v with step h per unit of v.  The MoE routing is pinned
 * to the unperturbed one (model_pin_routing): a perturbation of a whole tensor changes
 * some token's top-k far too often to be skipped, and with the routing held fixed the
 * loss is smooth and its gradient at the base point is the one the backward computes. */
static int fd_direction(fd_ctx *c, float *p, size_t n, const float *v, float *save, double h,
                        double *fd)
{
    hearth_err err;
    if (c->nroute && model_pin_routing(c->m, c->route0, c->nroute, &err))
        fail_msg("model_pin_routing: %s", err.msg);
    memcpy(save, p, n * sizeof(float));
    int ch1, ch2;
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(save[i] + h * v[i]);
    double lp = objective(c, &ch1);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(save[i] - h * v[i]);
    double lm = objective(c, &ch2);
    memcpy(p, save, n * sizeof(float));
    model_pin_routing(c->m, NULL, 0, &err);
    if (ch1 || ch2)
        fail_msg("the pinned routing changed");
    *fd = (lp - lm) / (2 * h);
    return 1;
}

typedef struct {
    int checked, failed, skipped;
    double worst_ratio, noise;
    char worst[256];
    char first_fail[256];
} fd_report;

static void note(fd_report *r, double ratio, const char *what, double g, double fd)
{
    r->checked++;
    char line[256];
    snprintf(line, sizeof line, "%s: grad %.6g vs fd %.6g (ratio %.3g)", what, g, fd, ratio);
    if (!(ratio <= 1.0) && r->failed++ == 0)
        snprintf(r->first_fail, sizeof r->first_fail, "%s", line);
    if (!(ratio <= r->worst_ratio)) {
        r->worst_ratio = ratio;
        snprintf(r->worst, sizeof r->worst, "%s", line);
    }
}

/* The noise of a difference quotient with step EPS: the quotient at two nearly equal
 * steps differs by the rounding noise of the loss only (the truncation error moves by
 * 3%), measured on random entries. */
static double measure_noise(fd_ctx *c, model *m, tu_rng *rng)
{
    float *P = model_params(m);
    double worst = 0;
    for (int j = 0; j < 8; j++) {
        const model_tensor *T = model_tensor_at(m, tu_randint(rng, 0, model_tensor_count(m)));
        size_t i = T->offset + (size_t)(tu_next(rng) % T->numel);
        double h = EPS * fmax(1.0, fabs((double)P[i])), f1, f2;
        if (fd_step(c, P, i, h, &f1) && fd_step(c, P, i, h * (1 + 1.0 / 32), &f2))
            worst = fmax(worst, fabs(f1 - f2) * EPS / h);
    }
    return worst > 1e-12 ? worst : 1e-12;
}

/* |grad - fd| over what is allowed (see the top of the file); scale is the tensor's RMS
 * gradient (entries) or gradient norm (directions), h the step used. */
static double entry_ratio(double g, double fd, double scale, double noise, double h)
{
    double allowed = RTOL * fmax(fabs(g), fabs(fd)) + ATOL * scale +
                     NOISE_MULT * noise * EPS / h;
    return fabs(g - fd) / allowed;
}

/* Checks every tensor of m against finite differences of the objective on b. */
static void gradcheck(model *m, const vlm_batch *b, float ls, float as, int n_uniform,
                      int n_largest, tu_rng *rng, fd_report *rep)
{
    hearth_err err;
    model_stats st;
    memset(rep, 0, sizeof *rep);
    model_zero_grad(m);
    if (model_forward_backward(m, b, ls, as, &st, &err))
        fail_msg("model_forward_backward: %s", err.msg);
    size_t P = model_param_count(m);
    float *grad = tu_fdup(model_grads(m), P);
    float *params = model_params(m);

    fd_ctx c = { .m = m, .b = b, .ls = ls, .as = as,
                 .verbose = getenv("HEARTH_TEST_VERBOSE") != NULL };
    c.nroute = model_last_routing(m, NULL, 0);
    c.route0 = tu_ialloc(c.nroute + 1);
    c.route = tu_ialloc(c.nroute + 1);
    model_last_routing(m, c.route0, c.nroute);
    double noise = measure_noise(&c, m, rng);
    rep->noise = noise;

    size_t maxn = 0;
    for (int t = 0; t < model_tensor_count(m); t++)
        if (model_tensor_at(m, t)->numel > maxn)
            maxn = model_tensor_at(m, t)->numel;
    float *v = tu_falloc(maxn), *save = tu_falloc(maxn);

    for (int t = 0; t < model_tensor_count(m); t++) {
        const model_tensor *T = model_tensor_at(m, t);
        float *p = params + T->offset;
        const float *g = grad + T->offset;
        size_t n = T->numel;
        if (T->frozen) {
            /* frozen: no gradient at all, whatever the loss says */
            for (size_t i = 0; i < n; i++)
                if (g[i] != 0)
                    fail_msg("frozen %s has gradient %g at %zu", T->name, g[i], i);
            continue;
        }
        enum { MAXS_CAP = N_UNIFORM + N_LARGEST };
        const int MAXS = n_uniform + n_largest;
        size_t idx[MAXS_CAP];
        double fd[MAXS_CAP], hs[MAXS_CAP];
        int k = 0, tries = 0;

        /* the entries with the largest |grad| among random candidates, then uniform ones */
        size_t pick[MAXS_CAP + MAX_TRIES];
        int np = 0;
        for (int j = 0; j < n_largest; j++) {
            double best = -1;
            size_t bi = 0;
            for (int q = 0; q < N_CANDIDATES; q++) {
                size_t i = (size_t)(tu_next(rng) % n);
                int dup = 0;
                for (int z = 0; z < np; z++)
                    dup |= pick[z] == i;
                if (!dup && fabs(g[i]) > best) {
                    best = fabs(g[i]);
                    bi = i;
                }
            }
            if (best >= 0)
                pick[np++] = bi;
        }
        while (np < MAXS + MAX_TRIES)
            pick[np++] = (size_t)(tu_next(rng) % n);
        for (int j = 0; j < np && k < MAXS && tries < MAX_TRIES; j++) {
            int dup = 0;
            for (int z = 0; z < k; z++)
                dup |= idx[z] == pick[j];
            if (dup && n > (size_t)MAXS)
                continue;
            tries++;
            hs[k] = EPS * fmax(1.0, fabs((double)p[pick[j]]));
            if (!fd_entry(&c, p, pick[j], hs[k], &fd[k]))
                rep->skipped++;
            idx[k++] = pick[j];
        }

        double ss = 0;
        for (int j = 0; j < k; j++)
            ss += (double)g[idx[j]] * g[idx[j]];
        double rms = k ? sqrt(ss / k) : 0;
        for (int j = 0; j < k; j++) {
            double gj = g[idx[j]];
            double ratio = entry_ratio(gj, fd[j], rms, noise, hs[j]);
            /* Over the tolerance: again with a quarter, a 16th, a 64th of the step.
             * Truncation error (strong curvature, as tiny random shapes can have) drops
             * 16x each time (the noise allowance grows with 1/h), a wrong gradient stays
             * wrong at every step. */
            for (double div = 4; ratio > 1 && div <= RETRY_MAX_DIV; div *= 4) {
                double f2;
                fd_entry(&c, p, idx[j], hs[j] / div, &f2);
                double r2 = entry_ratio(gj, f2, rms, noise, hs[j] / div);
                if (r2 < ratio) {
                    ratio = r2;
                    fd[j] = f2;
                }
            }
            char what[160];
            snprintf(what, sizeof what, "%s[%zu]", T->name, idx[j]);
            note(rep, ratio, what, gj, fd[j]);
            if (c.verbose)
                printf("# %-44s [%6zu] grad % .6e fd % .6e  ratio %.3f\n", T->name, idx[j],
                       gj, fd[j], ratio);
        }

        /* one random direction over the whole tensor: every entry moves by about
         * EPS/2 of the tensor's RMS value (at least 0.1), a 0.5% change of the tensor */
        double pss = 0;
        for (size_t i = 0; i < n; i++)
            pss += (double)p[i] * p[i];
        double h = EPS / 2 * fmax(sqrt(pss / (double)n), 0.1);
        tu_fill_uniform(rng, v, n, -1.7320508f, 1.7320508f);   /* unit variance */
        double fdd;
        fd_direction(&c, p, n, v, save, h, &fdd);
        double gd = 0, gn = 0;
        for (size_t i = 0; i < n; i++) {
            gd += (double)g[i] * v[i];
            gn += (double)g[i] * g[i];
        }
        double ratio = entry_ratio(gd, fdd, sqrt(gn), noise, h);
        for (double div = 4; ratio > 1 && div <= RETRY_MAX_DIV; div *= 4) {   /* as entries */
            double f2;
            fd_direction(&c, p, n, v, save, h / div, &f2);
            double r2 = entry_ratio(gd, f2, sqrt(gn), noise, h / div);
            if (r2 < ratio) {
                ratio = r2;
                fdd = f2;
            }
        }
        char what[160];
        snprintf(what, sizeof what, "%s (direction)", T->name);
        note(rep, ratio, what, gd, fdd);
        if (c.verbose)
            printf("# %-44s direction grad % .6e fd % .6e  ratio %.3f\n", T->name, gd, fdd,
                   ratio);
    }
    if (c.verbose)
        printf("# noise %.3g checked %d skipped %d forwards %d (%.0f ms) worst %s\n", noise,
               rep->checked, rep->skipped, c.evals,
               (double)clock() * 1e3 / CLOCKS_PER_SEC, rep->worst);
    free(grad);
    free(c.route0);
    free(c.route);
    free(v);
    free(save);
}

static void check_batch(const model_shape *sh, tm_batch *tb, tu_rng *rngp, float as,
                        int n_uniform, int n_largest)
{
    tu_rng rng = *rngp;
    int n_seq = tb->b.n_seq, seq_len = tb->b.seq_len;
    model *m;
    hearth_err err;
    uint64_t seed = tu_next(&rng);
    if (model_create(&m, sh, seed, &err))
        fail_msg("model_create: %s", err.msg);
    tm_randomize_params(m, &rng);
    int nt = 0;
    for (int i = 0; i < n_seq * seq_len; i++)
        nt += tb->targets[i] != -1;
    fd_report rep;
    gradcheck(m, &tb->b, nt ? 1.0f / (float)nt : 1.0f, as, n_uniform, n_largest, &rng, &rep);
    if (rep.failed)
        fail_msg("%s: %d of %d checks off; first: %s; worst: %s (seed %llu; replay with "
                 "HEARTH_TEST_SEED=%llu)", sh->name, rep.failed, rep.checked, rep.first_fail,
                 rep.worst, (unsigned long long)rng.seed, (unsigned long long)rng.seed);
    model_free(m);
}

static void run_check(const model_shape *sh, int n_seq, int seq_len, int n_images,
                      const int *grids, const int *img_seq, float as, int n_uniform,
                      int n_largest)
{
    tu_rng rng = tu_rng_fresh();
    tm_batch tb;
    tm_make_batch(&tb, sh, &rng, n_seq, seq_len, n_images, grids, img_seq);
    check_batch(sh, &tb, &rng, as, n_uniform, n_largest);
    tm_free_batch(&tb);
}

static void test_grad_gpt2(void **state)
{
    (void)state;
    model_shape sh = tm_shape_gpt2();
    run_check(&sh, 2, 12, 0, NULL, NULL, 0.0f, N_UNIFORM, N_LARGEST);
}

static void test_grad_vlm(void **state)
{
    (void)state;
    model_shape sh = tm_shape_vlm();
    /* non-square and non-divisible by the window (3x5 units), t = 2, a small one; two
     * images in the first sequence, one in the second */
    static const int grids[] = { 1, 6, 10, 2, 4, 4, 1, 2, 2 };
    static const int seqs[] = { 0, 0, 1 };
    run_check(&sh, 2, 32, 3, grids, seqs, 0.0f, N_UNIFORM, N_LARGEST);
}

static void test_grad_vlm_moe(void **state)
{
    (void)state;
    model_shape sh = tm_shape_vlm_moe();
    static const int grids[] = { 1, 4, 6, 2, 2, 4, 1, 2, 2 };
    static const int seqs[] = { 0, 1, 1 };
    run_check(&sh, 2, 24, 3, grids, seqs, 0.1f, N_UNIFORM, N_LARGEST);
}

/* The presets themselves (full widths; a short sequence and small images for speed):
 * one random direction per tensor, which involves every entry of it.  Single entries are
 * sampled on the hand-filled shapes above, which have the same features at a fraction of
 * the cost (a preset forward costs about 5 ms, and this binary must stay fast under
 * ASan). */
static void check_preset(const char *name, float as)
{
    model_shape sh;
    hearth_err err;
    if (preset_load(&sh, name, &err))
        fail_msg("preset %s: %s", name, err.msg);
    /* 3x2 merge units (non-square, 2x2-unit windows do not divide it) and a 2-frame
     * video of one unit per frame, in one sequence */
    static const int grids[] = { 1, 6, 4, 2, 2, 2 };
    static const int seqs[] = { 0, 0 };
    run_check(&sh, 1, 16, 2, grids, seqs, as, 0, 0);
}

static void test_grad_tiny_vlm(void **state)
{
    (void)state;
    check_preset("tiny-vlm", 0.0f);
}

static void test_grad_tiny_vlm_moe(void **state)
{
    (void)state;
    check_preset("tiny-vlm-moe", 0.1f);
}

/* Random small shapes with random feature mixes (layernorm ViT, gelu MLPs, learned
 * positions with images, no windows, freezing, top_k 1 .. E, ...). */
static void test_grad_random(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    for (int rep = 0; rep < 4; rep++) {
        model_shape sh;
        tm_batch tb;
        tm_random_case(&sh, &tb, &rng, rep);
        check_batch(&sh, &tb, &rng, 0.1f, 1, 1);
        tm_free_batch(&tb);
    }
}

int main(void)
{
    /* Results do not depend on the thread count (test_model_core checks that); one
     * thread keeps hundreds of small forwards fast on a busy machine. */
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_gpt2),
        cmocka_unit_test(test_grad_vlm),
        cmocka_unit_test(test_grad_vlm_moe),
        cmocka_unit_test(test_grad_random),
        cmocka_unit_test(test_grad_tiny_vlm),
        cmocka_unit_test(test_grad_tiny_vlm_moe),
    };
    return cmocka_run_group_tests_name("model_grad", tests, NULL, NULL);
}
