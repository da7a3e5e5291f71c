/* test_model_par.c - the local model of one rank (model_par.h) against the single-rank
 * model.
 *
 * Layouts (pipeline stages, tensor parallel with and without sequence parallelism, GQA
 * with fewer kv heads than tp ranks, tied and untied heads, dense and MoE decoders, the
 * encoder split over the tp group or replicated) run as rank threads on the local
 * communicator: every rank builds its local model with model_create_par, encodes (stage
 * 0), runs its decoder stage with activations passed between stages by send/recv, two
 * micro batches in flight (the second on a clone), and the backward.  Checked against
 * the single-rank model on the same micro batches (synthetic data, parameters moved to
 * fresh random values of a healthy scale, identical on both sides):
 *   - initial parameters: every shard is bitwise the slice of the full model's tensor;
 *   - the loss and the target count, equal on every tp rank of the last stage;
 *   - every gradient of the full model, assembled from the shards (model_shard_place;
 *     tp-partial copies, kv segments and the tied copy summed; replicated tensors
 *     taken from tp rank 0), within 1e-5 relative (L2) per tensor.
 * Expert parallelism: ep ranks each run their own micro batches (the reference runs them
 * all; dense gradients sum over those ranks).  Also: an encoder-only local model against
 * the single-rank encoder (bitwise), and the errors of impossible splits and of stage
 * calls out of order.
 * Rank threads never call cmocka: they record a result and the main thread checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <math.h>
#include <omp.h>

#include "comm/comm.h"
#include "data_synth.h"
#include "kernels.h"
#include "model/model.h"
#include "model/model_par.h"
#include "model/model_shard.h"
#include "support/ranks.h"
#include "support/shapebatch.h"
#include "support/stagepar.h"
#include "support/testutil.h"
#include "test_model_util.h"

#define MAXR 8
#define NMB 2          /* micro batches in flight (the second on a clone) */
#define TAG_FWD 1
#define TAG_BWD 2

static tu_rng g_rng;

static int setup_seed(void **state)
{
    (void)state;
    g_rng = tu_rng_fresh_noted();
    return 0;
}

/* ---- shapes: the presets, shrunk -------------------------------------------------- */

static void shrink_stack(stack_shape *s, int layers, int hidden, int ffn, int heads, int kv,
                         int hd)
{
    s->layers = layers;
    s->hidden = hidden;
    s->ffn = ffn;
    s->heads = heads;
    s->kv_heads = kv;
    s->head_dim = hd;
}

static model_shape tiny_preset(const char *name)
{
    model_shape sh;
    hearth_err err;
    if (preset_load(&sh, name, &err))
        fail_msg("preset %s: %s", name, err.msg);
    shrink_stack(&sh.encoder.s, 2, 64, 96, 4, 4, 16);
    sh.projector.hidden = 64;
    decoder_shape *d = &sh.decoder;
    shrink_stack(&d->s, 3, 64, 96, 4, 2, 16);
    d->s.mrope_section[0] = 2;
    d->s.mrope_section[1] = 3;
    d->s.mrope_section[2] = 3;
    d->vocab = 130;                 /* not divisible by 4: uneven vocabulary slices */
    d->image_token_id = 129;
    if (d->moe_experts) {
        d->moe_experts = 4;
        d->moe_ffn = 32;
        d->moe_shared_ffn = 32;
        d->moe_every = 2;           /* MoE at global layer 1 only */
    }
    return sh;
}

/* GPT-2-like: layernorm, gelu, learned positions, biases everywhere, tied head. */
static model_shape tiny_gpt2(void)
{
    model_shape sh = tm_shape_gpt2();
    sh.decoder.s.layers = 3;
    sh.decoder.vocab = 101;
    sh.decoder.max_positions = 32;
    return sh;
}

/* ---- one layout ------------------------------------------------------------------- */

typedef struct {
    const model_shape *sh;
    int tp, pp, sp;
    int ep;                         /* data-parallel ranks forming the expert-parallel group;
                                       each runs its own micro batches */
    int enc_own;                    /* 1: the encoder is not split (enc_tp NULL) */
    int layers[4];                  /* decoder layers per stage */
    uint64_t seed;
    const model *ref;               /* parameters to copy (the randomised full model) */
    const model *init;              /* the full model as model_create made it */
    vlm_batch b[4][NMB];            /* [ep rank][micro batch] */
    float loss_scale, aux_scale;
    /* per rank */
    model *m[MAXR], *clone[MAXR];
    int init_ok[MAXR];              /* parameters were the full model's slices */
    double loss[MAXR][NMB];         /* by rank */
    int nt[MAXR][NMB];
    int rc[MAXR];
    hearth_err err[MAXR];
} layout;

/* Checks that the initial values are the full model's slices (bitwise) and that the
 * table matches the full model's; then loads the reference's parameters. */
static int load_params(layout *L, model *m)
{
    int ok = 1;
    const float *rp = model_params((model *)L->ref), *ip = model_params((model *)L->init);
    for (int i = 0; i < model_tensor_count(m); i++) {
        const model_tensor *T = model_tensor_at(m, i);
        const model_tensor *R = model_tensor_find(L->ref, T->name);
        if (!R || model_shard_full_numel(&T->shard) != R->numel ||
            model_shard_numel(&T->shard) != T->numel)
            return 0;
        float *p = model_params(m) + T->offset;
        float *want = tu_falloc(T->numel);
        model_shard_extract(&T->shard, ip + R->offset, want);
        ok &= memcmp(want, p, T->numel * sizeof(float)) == 0;
        free(want);
        model_shard_extract(&T->shard, rp + R->offset, p);
    }
    return ok;
}

static int run_rank(void *ctx, int rank, comm *world, hearth_err *err)
{
    layout *L = ctx;
    ranks_grid g;
    ranks_grid_place(&g, rank, L->tp, L->ep);
    int tp = L->tp, e = g.e, s = g.s, rc = 0;
    int step = tp * L->ep;          /* rank distance between neighbouring stages */
    comm *tpc = NULL, *encc = NULL, *epc = NULL;
    if ((rc = ranks_grid_groups(&g, world, &tpc, &epc, err)))
        return rc;
    if (tp > 1 && s == 0 && !L->enc_own &&
        (rc = comm_group_create(world, g.tp_ranks, tp, &encc, err)))
        goto out;
    int first_layer = 0;
    for (int i = 0; i < s; i++)
        first_layer += L->layers[i];
    model_par par;
    stagepar_decoder(&par, tpc, epc, L->sp, s, L->pp, first_layer, L->layers[s]);
    par.has_encoder = s == 0 && L->sh->encoder.present;
    par.enc_tp = encc;
    if ((rc = model_create_par(&L->m[rank], L->sh, &par, L->seed, err)))
        goto out;
    model *m = L->m[rank];
    if ((rc = model_clone(&L->clone[rank], m, err)))
        goto out;
    L->init_ok[rank] = load_params(L, m);

    model *obj[NMB] = { m, L->clone[rank] };
    int H = L->sh->decoder.s.hidden;
    float *xin = NULL, *dy = NULL;
    size_t nl = 0;
    for (int k = 0; k < NMB && !rc; k++) {
        const vlm_batch *b = &L->b[e][k];
        const float *img = NULL;
        int nu = 0;
        if (par.has_encoder && b->n_images > 0) {
            if ((rc = model_encode_forward(obj[k], b->n_images, b->grid_thw, b->pixels, err)))
                break;
            img = model_img_feat(obj[k], &nu);
        }
        nl = (size_t)model_local_tokens(m, b->n_seq * b->seq_len) * H;
        free(xin);
        xin = tu_falloc(nl);
        if (s > 0 && (rc = comm_recv(world, xin, nl, COMM_F32, rank - step, TAG_FWD, err)))
            break;
        model_stats st;
        if ((rc = model_stage_forward(obj[k], b, img, nu, s > 0 ? xin : NULL, &st, err)))
            break;
        L->loss[rank][k] = st.loss_sum;
        L->nt[rank][k] = st.n_targets;
        if (s < L->pp - 1) {
            size_t n;
            const float *out = model_stage_output(obj[k], &n);
            if (n != nl) {
                rc = herr_set(err, HERR_RUNTIME, "stage output %zu floats, expected %zu", n,
                              nl);
                break;
            }
            rc = comm_send(world, out, n, COMM_F32, rank + step, TAG_FWD, err);
        }
    }
    for (int k = 0; k < NMB && !rc; k++) {
        const vlm_batch *b = &L->b[e][k];
        nl = (size_t)model_local_tokens(m, b->n_seq * b->seq_len) * H;
        int nu = 0;
        if (par.has_encoder && b->n_images > 0)
            model_img_feat(obj[k], &nu);
        float *ig = nu > 0 ? model_img_grad(obj[k]) : NULL;
        if (s < L->pp - 1) {
            free(dy);
            dy = tu_falloc(nl);
            if ((rc = comm_recv(world, dy, nl, COMM_F32, rank + step, TAG_BWD, err)) ||
                (rc = model_stage_backward(obj[k], dy, 0.0f, L->aux_scale, ig, err)))
                break;
        } else if ((rc = model_stage_backward(obj[k], NULL, L->loss_scale, L->aux_scale, ig,
                                              err))) {
            break;
        }
        if (s > 0) {
            size_t n;
            const float *g = model_stage_input_grad(obj[k], &n);
            if ((rc = comm_send(world, g, n, COMM_F32, rank - step, TAG_BWD, err)))
                break;
        }
        if (nu > 0 && (rc = model_encode_backward(obj[k], err)))
            break;
    }
    free(xin);
    free(dy);
out:
    comm_free(epc);
    comm_free(encc);
    comm_free(tpc);
    return rc;
}

/* A synthetic micro batch of n_seq sequences. */
static void make_batch(synth_batch *sb, const model_shape *sh, uint64_t seed, uint64_t first,
                       int n_seq, int seq_len)
{
    synth_params p;
    shapebatch_params(&p, sh, seed, seq_len, 40);
    hearth_err err;
    if (synth_fill(sb, &p, first, n_seq, &err))
        fail_msg("synth_fill: %s", err.msg);
}

static void check_layout(const model_shape *sh, int tp, int pp, int ep, int sp, int enc_own,
                         const char *what)
{
    layout *L = calloc(1, sizeof *L);
    assert_non_null(L);
    L->sh = sh;
    L->tp = tp;
    L->pp = pp;
    L->ep = ep;
    L->sp = sp;
    L->enc_own = enc_own;
    int nl = sh->decoder.s.layers;
    for (int s = 0; s < pp; s++)
        L->layers[s] = nl / pp + (s < nl % pp);
    L->seed = tu_next(&g_rng);
    uint64_t data_seed = tu_next(&g_rng);

    /* The reference: the full model, then parameters of a healthy scale. */
    model *ref = NULL, *init = NULL;
    hearth_err err;
    if (model_create(&ref, sh, L->seed, &err) || model_create(&init, sh, L->seed, &err))
        fail_msg("%s: model_create: %s", what, err.msg);
    tm_randomize_params(ref, &g_rng);
    L->ref = ref;
    L->init = init;

    synth_batch sb[4][NMB];
    memset(sb, 0, sizeof sb);
    int n_targets = 0;
    for (int e = 0; e < ep; e++)
        for (int k = 0; k < NMB; k++) {
            make_batch(&sb[e][k], sh, data_seed, (uint64_t)(e * NMB + k) * 2, 2, 32);
            L->b[e][k] = synth_view(&sb[e][k]);
            n_targets += (int)sb[e][k].n_targets;
        }
    L->loss_scale = 1.0f / (float)n_targets;
    L->aux_scale = sh->decoder.moe_experts ? 0.05f : 0.0f;

    /* The reference sees every micro batch of every ep rank. */
    double ref_loss[4][NMB];
    model_zero_grad(ref);
    for (int e = 0; e < ep; e++)
        for (int k = 0; k < NMB; k++) {
            model_stats st;
            if (model_forward_backward(ref, &L->b[e][k], L->loss_scale, L->aux_scale, &st,
                                       &err))
                fail_msg("%s: reference: %s", what, err.msg);
            ref_loss[e][k] = st.loss_sum;
        }

    int n = tp * pp * ep;
    if (ranks_run(n, 20000, run_rank, L, L->rc, L->err, &err))
        fail_msg("%s: %s", what, err.msg);
    for (int r = 0; r < n; r++)
        if (L->rc[r])
            fail_msg("%s: rank %d failed (%d): %s (seed %llu)", what, r, L->rc[r],
                     L->err[r].msg, (unsigned long long)g_rng.seed);

    for (int r = 0; r < n; r++)
        if (!L->init_ok[r])
            fail_msg("%s: rank %d: initial parameters are not the full model's slices", what,
                     r);

    /* Loss: the last stage's, equal on its tp ranks. */
    for (int e = 0; e < ep; e++)
        for (int k = 0; k < NMB; k++)
            for (int t = 0; t < tp; t++) {
                int r0 = ((pp - 1) * ep + e) * tp, r = r0 + t;
                double d = fabs(L->loss[r][k] - ref_loss[e][k]) / fabs(ref_loss[e][k]);
                if (d > 1e-5 || L->nt[r][k] != (int)sb[e][k].n_targets)
                    fail_msg("%s: micro batch %d rank %d: loss %.9g (%d targets), reference "
                             "%.9g (%ld)", what, k, r, L->loss[r][k], L->nt[r][k],
                             ref_loss[e][k], sb[e][k].n_targets);
                if (L->loss[r][k] != L->loss[r0][k])
                    fail_msg("%s: the loss differs between tp ranks", what);
            }

    /* Gradients assembled from the shards. */
    size_t np = model_param_count(ref);
    float *acc = tu_falloc(np), *tmp = tu_falloc(np);
    int *seen = calloc((size_t)model_tensor_count(ref), sizeof(int));
    for (int r = 0; r < n; r++) {
        model *m = L->m[r];
        int t = r % tp;
        for (int i = 0; i < model_tensor_count(m); i++) {
            const model_tensor *T = model_tensor_at(m, i);
            const model_tensor *R = model_tensor_find(ref, T->name);
            int ri = (int)(R - model_tensor_at(ref, 0));
            seen[ri] = 1;
            /* Replicas: once.  An encoder that is not split is replicated over the
             * decoder's tp ranks (each encodes every image). */
            int enc = strncmp(T->name, "encoder.", 8) == 0 ||
                      strncmp(T->name, "projector.", 10) == 0;
            if ((T->shard.tp_replicated || (enc && L->enc_own)) && t != 0)
                continue;
            memset(tmp, 0, R->numel * sizeof(float));
            model_shard_place(&T->shard, model_grads(m) + T->offset, tmp);
            kcpu_accumulate(acc + R->offset, tmp, R->numel);
        }
    }
    for (int i = 0; i < model_tensor_count(ref); i++) {
        const model_tensor *R = model_tensor_at(ref, i);
        if (!seen[i])
            fail_msg("%s: no rank holds %s", what, R->name);
        if (R->frozen)
            continue;
        double e = tu_rel_l2_ff(acc + R->offset, model_grads(ref) + R->offset, R->numel);
        if (!(e <= 1e-5))
            fail_msg("%s: gradient of %s: relative error %.3g (seed %llu)", what, R->name, e,
                     (unsigned long long)g_rng.seed);
    }

    free(seen);
    free(acc);
    free(tmp);
    for (int r = 0; r < n; r++) {
        model_free(L->clone[r]);
        model_free(L->m[r]);
    }
    for (int e = 0; e < ep; e++)
        for (int k = 0; k < NMB; k++)
            synth_batch_free(&sb[e][k]);
    model_free(init);
    model_free(ref);
    free(L);
}

/* ---- tests ------------------------------------------------------------------------- */

static void test_pipeline(void **state)
{
    (void)state;
    model_shape vlm = tiny_preset("tiny-vlm"), moe = tiny_preset("tiny-vlm-moe");
    model_shape gpt = tiny_gpt2();
    check_layout(&vlm, 1, 1, 1, 0, 0, "tiny-vlm tp1 pp1");
    check_layout(&vlm, 1, 2, 1, 0, 0, "tiny-vlm pp2");
    check_layout(&vlm, 1, 3, 1, 0, 0, "tiny-vlm pp3");
    check_layout(&moe, 1, 2, 1, 0, 0, "tiny-vlm-moe pp2");
    check_layout(&gpt, 1, 3, 1, 0, 0, "gpt2 pp3");
}

static void test_tensor_parallel(void **state)
{
    (void)state;
    model_shape vlm = tiny_preset("tiny-vlm"), moe = tiny_preset("tiny-vlm-moe");
    model_shape gpt = tiny_gpt2();
    check_layout(&vlm, 2, 1, 1, 0, 0, "tiny-vlm tp2");
    check_layout(&vlm, 2, 2, 1, 1, 0, "tiny-vlm tp2 pp2 sp");
    check_layout(&vlm, 4, 1, 1, 1, 1, "tiny-vlm tp4 sp (kv heads 2 < tp)");
    check_layout(&moe, 2, 2, 1, 0, 0, "tiny-vlm-moe tp2 pp2");
    check_layout(&moe, 4, 1, 1, 1, 0, "tiny-vlm-moe tp4 sp");
    check_layout(&gpt, 2, 2, 1, 1, 0, "gpt2 tp2 pp2 sp");
    check_layout(&gpt, 4, 2, 1, 0, 0, "gpt2 tp4 pp2");
    /* A vocabulary large enough for the head to run in chunks (decoder.c sizes them
     * for 4 Mi logits): the backward recomputes each chunk's logits, and the chunks
     * must agree across tp ranks whose vocabulary slices differ in size. */
    gpt.decoder.vocab = 200003;
    check_layout(&gpt, 2, 1, 1, 1, 0, "gpt2 tp2 sp, chunked head");
}

/* Experts split over ep ranks, each with its own micro batches: the reference runs
 * them all; dense gradients are summed over the ep ranks (data parallel), expert rows
 * are placed. */
static void test_expert_parallel(void **state)
{
    (void)state;
    model_shape moe = tiny_preset("tiny-vlm-moe");
    check_layout(&moe, 1, 1, 2, 0, 0, "tiny-vlm-moe ep2");
    check_layout(&moe, 2, 2, 2, 1, 0, "tiny-vlm-moe tp2 pp2 ep2 sp");
    check_layout(&moe, 1, 1, 4, 0, 0, "tiny-vlm-moe ep4");
}

/* An encoder-only local model (has_decoder = 0) is the single-rank model's encoder and
 * projector, bit for bit, through the encoder API. */
static void test_encoder_only(void **state)
{
    (void)state;
    model_shape vlm = tiny_preset("tiny-vlm");
    uint64_t seed = tu_next(&g_rng);
    model_par par;
    memset(&par, 0, sizeof par);
    par.has_encoder = 1;
    model *m = NULL, *ref = NULL;
    hearth_err err;
    assert_int_equal(model_create_par(&m, &vlm, &par, seed, &err), 0);
    assert_int_equal(model_create(&ref, &vlm, seed, &err), 0);
    assert_int_equal(model_get_par(m)->has_decoder, 0);
    int n_enc = 0;
    for (int i = 0; i < model_tensor_count(ref); i++)
        n_enc += strncmp(model_tensor_at(ref, i)->name, "decoder.", 8) != 0;
    assert_int_equal(model_tensor_count(m), n_enc);
    for (int i = 0; i < model_tensor_count(m); i++) {
        const model_tensor *T = model_tensor_at(m, i);
        const model_tensor *R = model_tensor_find(ref, T->name);
        assert_non_null(R);
        assert_int_equal(T->numel, R->numel);
        assert_memory_equal(model_params(m) + T->offset, model_params(ref) + R->offset,
                            T->numel * sizeof(float));
    }
    synth_batch sb;
    memset(&sb, 0, sizeof sb);
    make_batch(&sb, &vlm, tu_next(&g_rng), 0, 2, 32);
    vlm_batch b = synth_view(&sb);
    model *both[2] = { m, ref };
    int nu[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(model_encode_forward(both[k], b.n_images, b.grid_thw, b.pixels, &err),
                         0);
    const float *f0 = model_img_feat(m, &nu[0]), *f1 = model_img_feat(ref, &nu[1]);
    assert_true(nu[0] > 0);
    assert_int_equal(nu[0], nu[1]);
    assert_memory_equal(f0, f1, (size_t)nu[0] * vlm.decoder.s.hidden * sizeof(float));
    size_t ng = (size_t)nu[0] * vlm.decoder.s.hidden;
    float *g = tu_falloc(ng);
    tu_fill_normal(&g_rng, g, ng, 0.0f, 1.0f);
    for (int k = 0; k < 2; k++) {
        memcpy(model_img_grad(both[k]), g, ng * sizeof(float));
        assert_int_equal(model_encode_backward(both[k], &err), 0);
    }
    for (int i = 0; i < model_tensor_count(m); i++) {
        const model_tensor *T = model_tensor_at(m, i);
        const model_tensor *R = model_tensor_find(ref, T->name);
        assert_memory_equal(model_grads(m) + T->offset, model_grads(ref) + R->offset,
                            T->numel * sizeof(float));
    }
    model_stats st;
    assert_int_equal(model_stage_forward(m, &b, NULL, 0, NULL, &st, &err), HERR_RUNTIME);
    free(g);
    synth_batch_free(&sb);
    model_free(m);
    model_free(ref);
}

/* Splits that cannot be made and stage calls out of order fail with a message. */
static void test_errors(void **state)
{
    (void)state;
    model_shape vlm = tiny_preset("tiny-vlm");
    hearth_err err;
    comm_world *w3 = NULL, *w2 = NULL;
    comm *c3 = NULL, *c2 = NULL;
    assert_int_equal(comm_local_world_create(&w3, 3, NULL, &err), 0);
    assert_int_equal(comm_local_world_rank(w3, 0, &c3, &err), 0);
    assert_int_equal(comm_local_world_create(&w2, 2, NULL, &err), 0);
    assert_int_equal(comm_local_world_rank(w2, 0, &c2, &err), 0);
    model_par par;
    model *m = NULL;

    model_par_single(&par, &vlm);
    par.tp = c3;
    assert_int_equal(model_create_par(&m, &vlm, &par, 1, &err), HERR_CONFIG);
    assert_null(m);
    assert_non_null(strstr(err.msg, "decoder.heads"));

    model_par_single(&par, &vlm);
    par.first_layer = 2;
    par.n_layers = 2;
    assert_int_equal(model_create_par(&m, &vlm, &par, 1, &err), HERR_CONFIG);
    assert_null(m);

    /* Sequence parallel needs the tokens divisible by tp (checked before any
     * collective); a later stage needs its input; a backward needs a forward. */
    synth_batch sb;
    memset(&sb, 0, sizeof sb);
    make_batch(&sb, &vlm, 7, 0, 1, 33);
    vlm_batch b = synth_view(&sb);
    model_par_single(&par, &vlm);
    par.tp = c2;
    par.sp = 1;
    par.has_encoder = 0;
    par.has_embed = 0;
    assert_int_equal(model_create_par(&m, &vlm, &par, 1, &err), 0);
    assert_int_equal(model_local_tokens(m, 64), 32);
    model_stats st;
    float x[1];
    assert_int_equal(model_stage_forward(m, &b, NULL, 0, x, &st, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "divisible"));
    model_free(m);
    model_par_single(&par, &vlm);
    par.has_embed = 0;
    par.has_encoder = 0;
    assert_int_equal(model_create_par(&m, &vlm, &par, 1, &err), 0);
    assert_int_equal(model_stage_forward(m, &b, NULL, 0, NULL, &st, &err), HERR_RUNTIME);
    assert_int_equal(model_stage_backward(m, NULL, 1.0f, 0.0f, NULL, &err), HERR_RUNTIME);
    model_free(m);

    synth_batch_free(&sb);
    comm_free(c2);
    comm_free(c3);
    comm_local_world_free(w2);
    comm_local_world_free(w3);
}

int main(void)
{
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_pipeline, setup_seed),
        cmocka_unit_test_setup(test_tensor_parallel, setup_seed),
        cmocka_unit_test_setup(test_expert_parallel, setup_seed),
        cmocka_unit_test_setup(test_encoder_only, setup_seed),
        cmocka_unit_test_setup(test_errors, setup_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
