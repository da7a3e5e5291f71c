/* test_model_chunks.c - sequence chunks (parallel.chunks, docs/parallel/chunks.md) on the
 * CPU model: model_forward_backward_chunks with K = 2 and 4 must give the loss, the
 * target count and every parameter gradient of K = 1 (model_forward_backward) up to the
 * order of the fp32 sums.
 *
 * Shapes: tiny-vlm with its mRoPE decoder and with plain RoPE, with images (the encoder
 * runs once, its gradient gathered from every chunk's image rows); with full
 * recomputation (the recomputed forward writes the cache again); the GPT-2-like shape
 * (learned positions, LayerNorm, GELU).  Fresh parameters, tokens, targets, images
 * (count, grids, sequences) and sequence length each run.  No MoE shape here: a top-k
 * routing tie broken differently by a 1e-7 difference would change a gradient by O(1)
 * (a flaky test); chunks do not touch the MoE code, which is per token.
 *
 * Tolerances: the loss sum is a sum of the same per-token losses, whose attention
 * differs only in the order of the online-softmax merges: relative 1e-5 (observed
 * ~1e-7).  Gradients: relative L2 over the whole gradient vector 1e-4 (observed ~1e-6);
 * fp32 reordering of sums over 64-token chunks stays orders of magnitude below, while a
 * missing key block or a lost dk/dv contribution changes the gradient by O(1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "support/testutil.h"
#include "test_model_util.h"

typedef struct {
    double loss;
    int n_targets;
    float *grads;
    size_t n;
} chunk_run;

static void run_k(const model_shape *sh, int K, uint64_t seed, const tm_batch *tb,
                  const tu_rng *prng, float aux_scale, chunk_run *out)
{
    model *m;
    hearth_err err;
    if (model_create(&m, sh, seed, &err))
        fail_msg("model_create: %s", err.msg);
    tu_rng r = *prng;   /* the same parameter perturbation for every K */
    tm_randomize_params(m, &r);
    model_zero_grad(m);
    int nt = 0;
    for (int i = 0; i < tb->b.n_seq * tb->b.seq_len; i++)
        nt += tb->targets[i] != -1;
    model_stats st;
    /* twice on the same model: the second call reuses the clones and the cache */
    for (int rep = 0; rep < 2; rep++) {
        model_zero_grad(m);
        if (model_forward_backward_chunks(m, &tb->b, K, nt ? 1.0f / (float)nt : 1.0f,
                                          aux_scale, &st, &err))
            fail_msg("K %d: %s", K, err.msg);
    }
    out->loss = st.loss_sum;
    out->n_targets = st.n_targets;
    out->n = model_param_count(m);
    out->grads = tu_fdup(model_grads(m), out->n);
    model_free(m);
}

static void check(const model_shape *sh, const tm_batch *tb, tu_rng *rng, float aux_scale,
                  const char *what)
{
    uint64_t seed = tu_next(rng);
    tu_rng prng = *rng;
    tu_next(rng);
    chunk_run ref;
    run_k(sh, 1, seed, tb, &prng, aux_scale, &ref);
    assert_true(ref.loss > 0);
    static const int ks[] = { 2, 4 };
    for (int i = 0; i < 2; i++) {
        if (tb->b.seq_len % ks[i])
            continue;
        chunk_run got;
        run_k(sh, ks[i], seed, tb, &prng, aux_scale, &got);
        double rel = fabs(got.loss - ref.loss) / fabs(ref.loss);
        double grel = tu_rel_l2_ff(got.grads, ref.grads, ref.n);
        printf("# %s K %d: loss rel %.3g, gradient rel L2 %.3g\n", what, ks[i], rel, grel);
        if (got.n_targets != ref.n_targets || !(rel <= 1e-5) || !(grel <= 1e-4))
            fail_msg("%s K %d: targets %d vs %d, loss %.17g vs %.17g (rel %.3g), gradient "
                     "rel L2 %.3g (seed %llu)", what, ks[i], got.n_targets, ref.n_targets,
                     got.loss, ref.loss, rel, grel, (unsigned long long)rng->seed);
        free(got.grads);
    }
    free(ref.grads);
}

/* tiny-vlm-like batch: 2 sequences of 32 or 64 tokens, 0 to 3 random images. */
static void vlm_batch_make(tm_batch *tb, const model_shape *sh, tu_rng *rng)
{
    static const int pool[][3] = { { 1, 2, 2 }, { 1, 4, 2 }, { 1, 2, 4 }, { 1, 4, 4 },
                                   { 2, 2, 2 } };
    int S = tu_randint(rng, 0, 2) ? 64 : 32, n_seq = 2;
    int n_img = tu_randint(rng, 0, 4), grids[9], seqs[3], used[2] = { 0, 0 };
    int n = 0;
    for (int i = 0; i < n_img; i++) {
        const int *g = pool[tu_randint(rng, 0, 5)];
        int sq = n ? seqs[n - 1] + tu_randint(rng, 0, 2 - seqs[n - 1]) : tu_randint(rng, 0, 2);
        int tok = tm_image_tokens(sh, g);
        if (used[sq] + tok > S / 2)
            continue;
        used[sq] += tok;
        memcpy(grids + 3 * n, g, sizeof pool[0]);
        seqs[n++] = sq;
    }
    tm_make_batch(tb, sh, rng, n_seq, S, n, grids, seqs);
}

static void check_vlm(pos_kind pos, int recompute, const char *what)
{
    model_shape sh;
    hearth_err err;
    if (preset_load(&sh, "tiny-vlm", &err))
        fail_msg("%s", err.msg);
    sh.decoder.s.pos = pos;
    sh.decoder.s.recompute = recompute;
    tu_rng rng = tu_rng_fresh_noted();
    tm_batch tb;
    vlm_batch_make(&tb, &sh, &rng);
    check(&sh, &tb, &rng, 0.0f, what);
    tm_free_batch(&tb);
}

static void test_mrope_images(void **state)
{
    (void)state;
    check_vlm(POS_MROPE, RECOMPUTE_NONE, "tiny-vlm mrope");
}

static void test_rope_images(void **state)
{
    (void)state;
    check_vlm(POS_ROPE, RECOMPUTE_NONE, "tiny-vlm rope");
}

static void test_recompute_full(void **state)
{
    (void)state;
    check_vlm(POS_MROPE, RECOMPUTE_FULL, "tiny-vlm mrope, full recompute");
}

static void test_gpt2_like(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    model_shape sh = tm_shape_gpt2();
    tm_batch tb;
    tm_make_batch(&tb, &sh, &rng, 2, 16, 0, NULL, NULL);
    check(&sh, &tb, &rng, 0.0f, "gpt2-like");
    tm_free_batch(&tb);
}

/* chunks that do not divide the sequence are refused, not mis-split */
static void test_refuses_bad_split(void **state)
{
    (void)state;
    model_shape sh = tm_shape_gpt2();
    tu_rng rng = tu_rng_fresh_noted();
    tm_batch tb;
    tm_make_batch(&tb, &sh, &rng, 1, 12, 0, NULL, NULL);
    model *m;
    hearth_err err;
    if (model_create(&m, &sh, 1, &err))
        fail_msg("%s", err.msg);
    assert_int_not_equal(model_forward_backward_chunks(m, &tb.b, 5, 1.0f, 0.0f, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "divisible"));
    model_free(m);
    tm_free_batch(&tb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mrope_images),
        cmocka_unit_test(test_rope_images),
        cmocka_unit_test(test_recompute_full),
        cmocka_unit_test(test_gpt2_like),
        cmocka_unit_test(test_refuses_bad_split),
    };
    return cmocka_run_group_tests_name("model_chunks", tests, NULL, NULL);
}
