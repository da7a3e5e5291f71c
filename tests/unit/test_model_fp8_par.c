/* test_model_fp8_par.c - emulated FP8 under tensor parallelism (model/fp8.h): with every
 * linear kind in FP8 (the LM head and the router included), tp = 2 layouts of a dense and
 * a MoE model (threads on the local communicator) run the amax reductions over the tp
 * group in step on both ranks and compute what one rank computes, up to FP8's own
 * sensitivity.  Two micro batches, so the second runs on delayed scales.  The amax
 * histories must be identical on both ranks and close to the single rank's.
 *
 * Why the bounds are loose.  FP8 rounding is discontinuous: an element that fp32
 * reordering moves across a rounding midpoint jumps by up to a quarter of its value
 * (E5M2), and the layers after it spread that, so two layouts of the same FP8 model differ
 * by a random amount up to the size of the FP8 effect itself (seen: losses 1e-8 .. 4e-4,
 * gradients 1e-7 .. 0.13 relative).  The bounds catch wrong shards, wrong scales and
 * mismatched collectives (errors of order 1), not the reordering.
 *
 * Seeds come from the clock (printed; HEARTH_TEST_SEED replays a failure). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <math.h>

#include "comm/comm.h"
#include "data_synth.h"
#include "model/fp8.h"
#include "model/model.h"
#include "model/model_par.h"
#include "model/model_shard.h"
#include "support/ranks.h"
#include "support/shapebatch.h"
#include "support/stagepar.h"
#include "support/testutil.h"

#define TP 2
#define NMB 2

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}

/* tiny-vlm(-moe), narrowed so that a step is fast. */
static model_shape small(const char *name)
{
    model_shape sh;
    hearth_err err;
    if (preset_load(&sh, name, &err))
        fail_msg("preset %s: %s", name, err.msg);
    sh.encoder.s.layers = 2;
    sh.decoder.s.layers = 2;
    if (sh.decoder.moe_experts)
        sh.decoder.moe_every = 1;
    return sh;
}

/* Every kind of every component in FP8 at tp 1 and tp 2. */
static fp8_rule g_rules[2 * FP8_COMPS * FP8_KINDS];
static fp8_plan every_kind(void)
{
    int n = 0;
    for (int tp = 1; tp <= 2; tp++)
        for (int c = 0; c < FP8_COMPS; c++)
            for (int k = 0; k < FP8_KINDS; k++)
                g_rules[n++] = (fp8_rule){ c, k, tp, 0, 0, 1.0 };
    return (fp8_plan){ .rules = g_rules, .n_rules = n, .history = 4 };
}

typedef struct {
    const model_shape *sh;
    uint64_t seed;
    const fp8_plan *plan;
    vlm_batch b[NMB];
    float loss_scale, aux_scale;
    model *m[TP];
    double loss[TP][NMB];
    int rc[TP];
    hearth_err err[TP];
} tp_run;

static int run_rank(void *ctx, int t, comm *world, hearth_err *err)
{
    tp_run *R = ctx;
    int ranks[TP] = { 0, 1 };
    comm *tpc = NULL, *encc = NULL;
    int rc = comm_group_create(world, ranks, TP, &tpc, err);
    if (rc || (rc = comm_group_create(world, ranks, TP, &encc, err)))
        goto out;
    model_par par;
    stagepar_decoder(&par, tpc, NULL, 0, 0, 1, 0, R->sh->decoder.s.layers);
    par.has_encoder = 1;
    par.enc_tp = encc;
    if ((rc = model_create_par(&R->m[t], R->sh, &par, R->seed, err)) ||
        (rc = model_set_fp8(R->m[t], R->plan, err)))
        goto out;
    model *m = R->m[t];
    for (int k = 0; k < NMB && !rc; k++) {
        const vlm_batch *b = &R->b[k];
        int nu = 0;
        const float *img = NULL;
        if (b->n_images > 0) {
            if ((rc = model_encode_forward(m, b->n_images, b->grid_thw, b->pixels, err)))
                break;
            img = model_img_feat(m, &nu);
        }
        model_stats st;
        if ((rc = model_stage_forward(m, b, img, nu, NULL, &st, err)))
            break;
        R->loss[t][k] = st.loss_sum;
        float *ig = nu > 0 ? model_img_grad(m) : NULL;
        if ((rc = model_stage_backward(m, NULL, R->loss_scale, R->aux_scale, ig, err)))
            break;
        if (nu > 0 && (rc = model_encode_backward(m, err)))
            break;
    }
out:
    comm_free(encc);
    comm_free(tpc);
    return rc;
}

/* The amax reductions: every tp rank ends with the same amax histories, bit for bit
 * (a split linear's amax is the max over the group; without the reduction each rank
 * would record its own shard's maximum), and they are the single rank's up to the
 * reordering of the activations.  Gradient maxima are sensitive to it (an E5M2 rounding
 * step is 12.5%, and the largest element moves with it: single entries differ by up to
 * 2x), so the comparison with one rank is on the median entry.  Returns that median
 * relative difference. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double check_amax(tp_run *R, model *ref, const char *preset)
{
    float *h[TP], *h1;
    int *pos[TP], *pos1;
    size_t n[TP], np[TP], n1, np1;
    hearth_err err;
    if (model_fp8_state(ref, &h1, &n1, &pos1, &np1, &err))
        fail_msg("%s: %s", preset, err.msg);
    for (int t = 0; t < TP; t++)
        if (model_fp8_state(R->m[t], &h[t], &n[t], &pos[t], &np[t], &err))
            fail_msg("%s rank %d: %s", preset, t, err.msg);
    assert_true(n1 > 0);
    assert_int_equal(n[0], n1);
    double *dev = calloc(n1, sizeof *dev);
    assert_non_null(dev);
    size_t nz = 0;
    for (size_t i = 0; i < n1; i++) {
        for (int t = 1; t < TP; t++)
            if (memcmp(&h[t][i], &h[0][i], sizeof(float)))
                fail_msg("%s: amax history entry %zu: rank %d has %.9g, rank 0 %.9g", preset,
                         i, t, h[t][i], h[0][i]);
        if (h1[i] != 0)
            dev[nz++] = fabs((double)h[0][i] - h1[i]) / fabs((double)h1[i]);
    }
    assert_true(nz > 0);
    qsort(dev, nz, sizeof *dev, cmp_double);
    double median = dev[nz / 2];
    free(dev);
    if (median > 0.02)
        fail_msg("%s: amax histories differ from the single rank's by %.3g (median entry)",
                 preset, median);
    return median;
}

static void check(const char *preset)
{
    model_shape sh = small(preset);
    fp8_plan plan = every_kind();
    tp_run *R = calloc(1, sizeof *R);
    assert_non_null(R);
    R->sh = &sh;
    R->seed = tu_next(&g_rng);
    R->plan = &plan;
    synth_params p;              /* tiny-vlm(-moe) have an encoder: every sample gets images */
    shapebatch_params(&p, &sh, tu_next(&g_rng), 32, 32);
    synth_batch sb[NMB];
    memset(sb, 0, sizeof sb);
    hearth_err err = { { 0 } };
    long targets = 0;
    for (int k = 0; k < NMB; k++) {
        if (synth_fill(&sb[k], &p, (uint64_t)k * 2, 2, &err))
            fail_msg("synth_fill: %s", err.msg);
        R->b[k] = synth_view(&sb[k]);
        targets += sb[k].n_targets;
    }
    R->loss_scale = 1.0f / (float)targets;
    R->aux_scale = sh.decoder.moe_experts ? 0.01f : 0.0f;

    /* the single rank */
    model *ref = NULL;
    if (model_create(&ref, &sh, R->seed, &err) || model_set_fp8(ref, &plan, &err))
        fail_msg("single rank: %s", err.msg);
    double loss1[NMB];
    for (int k = 0; k < NMB; k++) {
        model_stats st;
        if (model_forward_backward(ref, &R->b[k], R->loss_scale, R->aux_scale, &st, &err))
            fail_msg("single rank: %s", err.msg);
        loss1[k] = st.loss_sum;
    }
    /* fp32, for the size of the FP8 effect */
    model *ref32 = NULL;
    if (model_create(&ref32, &sh, R->seed, &err))
        fail_msg("fp32: %s", err.msg);
    double loss32[NMB];
    for (int k = 0; k < NMB; k++) {
        model_stats st;
        if (model_forward_backward(ref32, &R->b[k], R->loss_scale, R->aux_scale, &st, &err))
            fail_msg("fp32: %s", err.msg);
        loss32[k] = st.loss_sum;
    }

    if (ranks_run(TP, 60000, run_rank, R, R->rc, R->err, &err))
        fail_msg("%s: %s", preset, err.msg);
    for (int t = 0; t < TP; t++)
        if (R->rc[t])
            fail_msg("%s rank %d: %s", preset, t, R->err[t].msg);

    double dl = 0, d32 = 0, worst = 0;
    for (int k = 0; k < NMB; k++) {
        assert_true(R->loss[1][k] == R->loss[0][k]);
        dl = fmax(dl, fabs(R->loss[0][k] - loss1[k]) / loss1[k]);
        d32 = fmax(d32, fabs(loss1[k] - loss32[k]) / loss32[k]);
    }
    /* Gradients of every tensor whose shard holds complete values (split or replicated,
     * not a partial sum over tp). */
    const float *g1 = model_grads(ref);
    for (int t = 0; t < TP; t++) {
        model *m = R->m[t];
        for (int i = 0; i < model_tensor_count(m); i++) {
            const model_tensor *T = model_tensor_at(m, i);
            const model_tensor *F = model_tensor_find(ref, T->name);
            assert_non_null(F);
            if (T->shard.tp_partial || T->shard.kv_rep > 1)
                continue;
            float *want = tu_falloc(T->numel);
            model_shard_extract(&T->shard, g1 + F->offset, want);
            double e = tu_rel_l2_ff(model_grads(m) + T->offset, want, T->numel);
            if (e > worst)
                worst = e;
            if (e > 0.5)
                fail_msg("%s rank %d %s: gradient relative error %.3g", preset, t, T->name, e);
            free(want);
        }
    }
    double amax_dev = check_amax(R, ref, preset);
    print_message("# %s tp %d: loss %.3g from one rank (FP8 vs fp32: %.3g), worst gradient "
                  "%.3g, amax histories %.3g\n", preset, TP, dl, d32, worst, amax_dev);
    assert_true(d32 > 0);                       /* FP8 was on */
    assert_true(dl < 0.01);
    for (int t = 0; t < TP; t++)
        model_free(R->m[t]);
    model_free(ref);
    model_free(ref32);
    for (int k = 0; k < NMB; k++)
        synth_batch_free(&sb[k]);
    free(R);
}

static void test_tp_dense(void **state)
{
    (void)state;
    check("tiny-vlm");
}

static void test_tp_moe(void **state)
{
    (void)state;
    check("tiny-vlm-moe");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_dense),
        cmocka_unit_test(test_tp_moe),
    };
    return cmocka_run_group_tests_name("model_fp8_par", tests, setup_seed, NULL);
}
