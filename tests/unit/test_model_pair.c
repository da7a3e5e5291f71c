/* test_model_pair.c - two micro batches through one pipeline stage as a pair
 * (model_stage_forward_pair / model_stage_backward_pair, parallel.a2a_overlap) against
 * the same two micro batches run one after the other.
 *
 * Layouts run as rank threads on the local communicator (tp x ep x pp, MoE decoders with
 * and without dense layers, sequence parallel, pipeline stages).  Every rank builds its
 * local model and a clone, moves the parameters to random values of a healthy scale
 * (the same generator on every rank), and runs its two micro batches (random, different
 * per ep rank) twice, from the same random non-zero gradients:
 *   sequential: model_stage_forward of both (the second on the clone), then
 *               model_stage_backward of both;
 *   pair:       model_stage_forward_begin of both, model_stage_forward_pair,
 *               model_stage_backward_pair;
 * with stage inputs and output gradients passed between stages by send/recv.  Checked
 * bitwise: losses, target counts, aux losses, stage outputs, input gradients, and every
 * parameter gradient, except the documented exception, a tied embedding and head on the
 * same stage, whose gradient must agree to 1e-6 relative.  Also: pair calls out of order
 * or on objects of different stages fail cleanly.
 * Rank threads never call cmocka: they record a result and the main thread checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "model/model.h"
#include "model/model_par.h"
#include "support/ranks.h"
#include "support/stagepar.h"
#include "support/testutil.h"
#include "test_model_util.h"

#define MAXR 8
#define NMB 2
#define NSEQ 2
#define SEQ 16

typedef struct {
    const char *name;
    model_shape sh;
    int tp, ep, pp, sp;
    uint64_t param_seed;
    tm_batch b[4][NMB];             /* [ep rank][micro batch] */
    /* per rank, per run (0 sequential, 1 pair) */
    double loss[MAXR][2][NMB], aux[MAXR][2][NMB];
    int nt[MAXR][2][NMB];
    float *out[MAXR][2][NMB], *dx[MAXR][2][NMB], *grads[MAXR][2];
    size_t n_out[MAXR], n_params[MAXR];
    int tied_here[MAXR];            /* tied embedding and head on this rank's stage */
    size_t tied_off[MAXR], tied_n[MAXR];
    int rc[MAXR];
    hearth_err err[MAXR];
} layout;

static int tag(int run, int grad, int k)
{
    return 1 + run * 8 + grad * 4 + k;
}

/* One run of both micro batches on obj[0], obj[1]; pair = 0 sequential, 1 pair. */
static int run_once(layout *L, int rank, comm *world, model *const obj[NMB], int pair,
                    hearth_err *err)
{
    int tp = L->tp, ep = L->ep, e = rank / tp % ep, s = rank / tp / ep, step = tp * ep;
    int H = L->sh.decoder.s.hidden, first = s == 0, last = s == L->pp - 1, rc = 0;
    size_t nl = (size_t)model_local_tokens(obj[0], NSEQ * SEQ) * H;
    float *xin[NMB], *dy[NMB];
    model_stats st[NMB];
    for (int k = 0; k < NMB; k++) {
        xin[k] = tu_falloc(nl);
        dy[k] = tu_falloc(nl);
    }
    for (int k = 0; k < NMB && !rc; k++) {
        const vlm_batch *b = &L->b[e][k].b;
        if (!first && (rc = comm_recv(world, xin[k], nl, COMM_F32, rank - step,
                                      tag(pair, 0, k), err)))
            break;
        rc = pair ? model_stage_forward_begin(obj[k], b, NULL, 0, first ? NULL : xin[k], err)
                  : model_stage_forward(obj[k], b, NULL, 0, first ? NULL : xin[k], &st[k],
                                        err);
    }
    if (!rc && pair)
        rc = model_stage_forward_pair(obj, st, err);
    for (int k = 0; k < NMB && !rc; k++) {
        L->loss[rank][pair][k] = st[k].loss_sum;
        L->aux[rank][pair][k] = st[k].aux_loss;
        L->nt[rank][pair][k] = st[k].n_targets;
        if (last)
            continue;
        size_t n;
        const float *y = model_stage_output(obj[k], &n);
        memcpy(L->out[rank][pair][k], y, n * sizeof *y);
        rc = comm_send(world, y, n, COMM_F32, rank + step, tag(pair, 0, k), err);
    }
    for (int k = 0; k < NMB && !rc; k++)
        if (!last)
            rc = comm_recv(world, dy[k], nl, COMM_F32, rank + step, tag(pair, 1, k), err);
    const float *dys[NMB] = { last ? NULL : dy[0], last ? NULL : dy[1] };
    float *const ig[NMB] = { NULL, NULL };
    if (!rc && pair)
        rc = model_stage_backward_pair(obj, dys, 1.0f / 64, 0.5f, ig, err);
    for (int k = 0; k < NMB && !rc && !pair; k++)
        rc = model_stage_backward(obj[k], dys[k], 1.0f / 64, 0.5f, NULL, err);
    for (int k = 0; k < NMB && !rc && !first; k++) {
        size_t n;
        const float *g = model_stage_input_grad(obj[k], &n);
        memcpy(L->dx[rank][pair][k], g, n * sizeof *g);
        rc = comm_send(world, g, n, COMM_F32, rank - step, tag(pair, 1, k), err);
    }
    if (!rc)
        memcpy(L->grads[rank][pair], model_grads(obj[0]),
               L->n_params[rank] * sizeof(float));
    for (int k = 0; k < NMB; k++) {
        free(xin[k]);
        free(dy[k]);
    }
    return rc;
}

static int run_rank(void *ctx, int rank, comm *world, hearth_err *err)
{
    layout *L = ctx;
    ranks_grid g;
    ranks_grid_place(&g, rank, L->tp, L->ep);
    int s = g.s, rc;
    comm *tpc = NULL, *epc = NULL;
    model *m = NULL, *clone = NULL;
    if ((rc = ranks_grid_groups(&g, world, &tpc, &epc, err)))
        return rc;
    int nl = L->sh.decoder.s.layers;
    model_par par;
    stagepar_decoder(&par, tpc, epc, L->sp, s, L->pp, s * (nl / L->pp), nl / L->pp);
    if ((rc = model_create_par(&m, &L->sh, &par, L->param_seed, err)) ||
        (rc = model_clone(&clone, m, err)))
        goto out;
    tu_rng r;
    tu_rng_init(&r, L->param_seed);
    tm_randomize_params(m, &r);
    L->n_params[rank] = model_param_count(m);
    L->n_out[rank] = (size_t)model_local_tokens(m, NSEQ * SEQ) * L->sh.decoder.s.hidden;
    for (int p = 0; p < 2; p++) {
        L->grads[rank][p] = tu_falloc(L->n_params[rank]);
        for (int k = 0; k < NMB; k++) {
            L->out[rank][p][k] = tu_falloc(L->n_out[rank]);
            L->dx[rank][p][k] = tu_falloc(L->n_out[rank]);
        }
    }
    const model_tensor *T = model_tensor_find(m, "decoder.embed.weight");
    L->tied_here[rank] = L->sh.decoder.tied_embeddings && par.has_embed && par.has_head;
    if (T) {
        L->tied_off[rank] = T->offset;
        L->tied_n[rank] = T->numel;
    }
    /* Both runs start from the same non-zero gradients, as after earlier micro batches:
     * from zero, two contributions would sum alike in either order. */
    float *g0 = tu_falloc(L->n_params[rank]);
    tu_fill_normal(&r, g0, L->n_params[rank], 0.0f, 1.0f);
    model *const obj[NMB] = { m, clone };
    for (int p = 0; p < 2 && !rc; p++) {
        memcpy(model_grads(m), g0, L->n_params[rank] * sizeof(float));
        rc = run_once(L, rank, world, obj, p, err);
    }
    free(g0);
out:
    model_free(clone);
    model_free(m);
    comm_free(epc);
    comm_free(tpc);
    return rc;
}

/* A MoE decoder without the encoder (the pair starts after the image rows are in). */
static model_shape moe_shape(int every, int tied)
{
    model_shape sh = tm_shape_vlm_moe();
    sh.encoder.present = 0;
    sh.projector.present = 0;
    sh.decoder.moe_every = every;
    sh.decoder.tied_embeddings = tied;
    return sh;
}

static void run_layout(const char *name, model_shape sh, int tp, int ep, int pp, int sp)
{
    tu_rng rng = tu_rng_fresh();
    layout *L = calloc(1, sizeof *L);
    assert_non_null(L);
    L->name = name;
    L->sh = sh;
    L->tp = tp;
    L->ep = ep;
    L->pp = pp;
    L->sp = sp;
    L->param_seed = tu_next(&rng);
    int nr = tp * ep * pp;
    assert_true(nr <= MAXR);
    for (int e = 0; e < ep; e++)
        for (int k = 0; k < NMB; k++)
            tm_make_batch(&L->b[e][k], &L->sh, &rng, NSEQ, SEQ, 0, NULL, NULL);
    hearth_err err;
    if (ranks_run(nr, 60000, run_rank, L, L->rc, L->err, &err))
        fail_msg("%s: %s", name, err.msg);
    for (int r = 0; r < nr; r++)
        if (L->rc[r])
            fail_msg("%s: rank %d failed (%d): %s", name, r, L->rc[r], L->err[r].msg);

    char msg[160];
    int compared = 0;
    for (int r = 0; r < nr; r++) {
        for (int k = 0; k < NMB; k++) {
            snprintf(msg, sizeof msg, "%s: rank %d micro batch %d", name, r, k);
            if (L->loss[r][0][k] != L->loss[r][1][k] || L->aux[r][0][k] != L->aux[r][1][k] ||
                L->nt[r][0][k] != L->nt[r][1][k])
                fail_msg("%s: loss %.17g / %.17g, aux %.17g / %.17g, targets %d / %d", msg,
                         L->loss[r][0][k], L->loss[r][1][k], L->aux[r][0][k],
                         L->aux[r][1][k], L->nt[r][0][k], L->nt[r][1][k]);
            if (L->sh.decoder.moe_every == 1)
                assert_true(L->aux[r][0][k] > 0);
            if (!tu_bitwise_equal(L->out[r][0][k], L->out[r][1][k], L->n_out[r]))
                fail_msg("%s: stage outputs differ", msg);
            if (!tu_bitwise_equal(L->dx[r][0][k], L->dx[r][1][k], L->n_out[r]))
                fail_msg("%s: input gradients differ", msg);
        }
        const float *g0 = L->grads[r][0], *g1 = L->grads[r][1];
        size_t n = L->n_params[r], a = n, b = n;
        if (L->tied_here[r]) {
            /* The documented exception: heads' and embeddings' contributions in another
             * order. */
            a = L->tied_off[r];
            b = a + L->tied_n[r];
            double rel = tu_rel_l2_ff(g1 + a, g0 + a, b - a);
            snprintf(msg, sizeof msg, "%s: rank %d tied embedding gradient", name, r);
            TU_ASSERT_LE(rel, 1e-6, &rng, msg);
        }
        if (!tu_bitwise_equal(g0, g1, a) || !tu_bitwise_equal(g0 + b, g1 + b, n - b))
            fail_msg("%s: rank %d: parameter gradients differ (max %.3g)", name, r,
                     tu_max_abs_diff(g0, g1, n));
        double norm = 0;
        for (size_t i = 0; i < n; i++)
            norm += (double)g0[i] * g0[i];
        assert_true(norm > 0);
        compared++;
    }
    assert_int_equal(compared, nr);

    for (int r = 0; r < nr; r++)
        for (int p = 0; p < 2; p++) {
            free(L->grads[r][p]);
            for (int k = 0; k < NMB; k++) {
                free(L->out[r][p][k]);
                free(L->dx[r][p][k]);
            }
        }
    for (int e = 0; e < ep; e++)
        for (int k = 0; k < NMB; k++)
            tm_free_batch(&L->b[e][k]);
    free(L);
}

static void test_pair_ep2(void **state)
{
    (void)state;
    run_layout("ep2, every layer MoE", moe_shape(1, 0), 1, 2, 1, 0);
}

static void test_pair_tp2_ep2_sp(void **state)
{
    (void)state;
    run_layout("tp2 ep2 sp, dense and MoE layers", moe_shape(2, 0), 2, 2, 1, 1);
}

static void test_pair_pp2_ep2_tied(void **state)
{
    (void)state;
    run_layout("pp2 ep2 tied", moe_shape(1, 1), 1, 2, 2, 0);
}

static void test_pair_one_rank_tied(void **state)
{
    (void)state;
    run_layout("one rank tied", moe_shape(2, 1), 1, 1, 1, 0);
}

/* Out of order, or not a pair of one stage: an error, not a crash. */
static void test_pair_misuse(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    model_shape sh = moe_shape(1, 0);
    model_par par;
    model_par_single(&par, &sh);
    model *a = NULL, *b = NULL, *other = NULL;
    hearth_err err;
    assert_int_equal(model_create_par(&a, &sh, &par, 7, &err), 0);
    assert_int_equal(model_clone(&b, a, &err), 0);
    assert_int_equal(model_create_par(&other, &sh, &par, 7, &err), 0);
    tm_batch tb;
    tm_make_batch(&tb, &sh, &rng, NSEQ, SEQ, 0, NULL, NULL);
    model_stats st[2];

    model *const pair[2] = { a, b };
    assert_int_equal(model_stage_forward_pair(pair, st, &err), HERR_RUNTIME);
    assert_int_equal(model_stage_forward_begin(a, &tb.b, NULL, 0, NULL, &err), 0);
    assert_int_equal(model_stage_forward_begin(other, &tb.b, NULL, 0, NULL, &err), 0);
    model *const strangers[2] = { a, other };
    assert_int_equal(model_stage_forward_pair(strangers, st, &err), HERR_RUNTIME);
    model *const twice[2] = { a, a };
    assert_int_equal(model_stage_forward_pair(twice, st, &err), HERR_RUNTIME);
    const float *dy[2] = { NULL, NULL };
    float *const ig[2] = { NULL, NULL };
    assert_int_equal(model_stage_backward_pair(pair, dy, 1.0f, 0.0f, ig, &err),
                     HERR_RUNTIME);
    /* Still usable afterwards. */
    assert_int_equal(model_stage_forward_begin(b, &tb.b, NULL, 0, NULL, &err), 0);
    assert_int_equal(model_stage_forward_pair(pair, st, &err), 0);
    assert_int_equal(st[0].n_targets, st[1].n_targets);
    assert_true(st[0].loss_sum == st[1].loss_sum);
    assert_int_equal(model_stage_backward_pair(pair, dy, 1.0f, 0.0f, ig, &err), 0);
    tm_free_batch(&tb);
    model_free(other);
    model_free(b);
    model_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pair_ep2),
        cmocka_unit_test(test_pair_tp2_ep2_sp),
        cmocka_unit_test(test_pair_pp2_ep2_tied),
        cmocka_unit_test(test_pair_one_rank_tied),
        cmocka_unit_test(test_pair_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
