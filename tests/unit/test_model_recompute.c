/* test_model_recompute.c - activation recomputation (stack_shape.recompute) on the CPU
 * model: with `selective` or `full` the backward rebuilds the dropped activations with
 * the forward's own code, so loss and every gradient must be BITWISE those without
 * recomputation, while the activation arena shrinks (full < selective < none).
 *
 * Shapes: the tiny-vlm and tiny-vlm-moe presets, the hand-filled GPT-2-like shape
 * (LayerNorm, GELU, learned positions) and random feature mixes (qk_norm, windows,
 * MoE with shared experts, frozen components), fresh parameters and batches each run;
 * recomputation set on the encoder, the decoder or both.  The layouts (tp with sequence
 * parallelism, ep, a2a overlap) are covered by test_ptrain_overlap.c's recompute case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "support/testutil.h"
#include "test_model_util.h"

typedef struct {
    double loss, aux;
    float *grads;
    size_t n, act_bytes;
} grad_run;

/* Forward+backward of b on a model of sh with the given recomputation per component. */
static void run_one(model_shape sh, int enc_rec, int dec_rec, uint64_t seed,
                    const tm_batch *tb, const tu_rng *prng, grad_run *out)
{
    sh.encoder.s.recompute = enc_rec;
    sh.decoder.s.recompute = dec_rec;
    model *m;
    hearth_err err;
    if (model_create(&m, &sh, seed, &err))
        fail_msg("model_create: %s", err.msg);
    tu_rng r = *prng;   /* the same parameter perturbation for every run */
    tm_randomize_params(m, &r);
    model_zero_grad(m);
    model_stats st;
    int nt = 0;
    for (int i = 0; i < tb->b.n_seq * tb->b.seq_len; i++)
        nt += tb->targets[i] != -1;
    if (model_forward_backward(m, &tb->b, nt ? 1.0f / (float)nt : 1.0f, 0.1f, &st, &err))
        fail_msg("model_forward_backward: %s", err.msg);
    out->loss = st.loss_sum;
    out->aux = st.aux_loss;
    out->n = model_param_count(m);
    out->grads = tu_fdup(model_grads(m), out->n);
    out->act_bytes = model_stack_activation_bytes(m);
    model_free(m);
}

static void check_shape(const model_shape *sh, tm_batch *tb, tu_rng *rng)
{
    uint64_t seed = tu_next(rng);
    tu_rng prng = *rng;
    tu_next(rng);
    grad_run none, sel, full, dec_only;
    run_one(*sh, RECOMPUTE_NONE, RECOMPUTE_NONE, seed, tb, &prng, &none);
    run_one(*sh, RECOMPUTE_SELECTIVE, RECOMPUTE_SELECTIVE, seed, tb, &prng, &sel);
    run_one(*sh, RECOMPUTE_FULL, RECOMPUTE_FULL, seed, tb, &prng, &full);
    run_one(*sh, RECOMPUTE_NONE, RECOMPUTE_FULL, seed, tb, &prng, &dec_only);
    const grad_run *runs[3] = { &sel, &full, &dec_only };
    static const char *names[3] = { "selective", "full", "decoder full" };
    for (int k = 0; k < 3; k++) {
        if (runs[k]->loss != none.loss || runs[k]->aux != none.aux)
            fail_msg("%s %s: loss %.17g aux %.17g, without recomputation %.17g %.17g "
                     "(seed %llu)", sh->name, names[k], runs[k]->loss, runs[k]->aux,
                     none.loss, none.aux, (unsigned long long)rng->seed);
        for (size_t i = 0; i < none.n; i++)
            if (memcmp(&runs[k]->grads[i], &none.grads[i], sizeof(float)))
                fail_msg("%s %s: gradient %zu is %.9g, without recomputation %.9g "
                         "(seed %llu)", sh->name, names[k], i, runs[k]->grads[i],
                         none.grads[i], (unsigned long long)rng->seed);
    }
    printf("# %-14s activations: none %zu B, selective %zu B, full %zu B\n", sh->name,
           none.act_bytes, sel.act_bytes, full.act_bytes);
    /* a stack saves when it has layers to share one set of buffers */
    int dec2 = sh->decoder.s.layers >= 2;
    int enc2 = sh->encoder.present && sh->encoder.s.layers >= 2;
    if (dec2 || enc2) {
        assert_true(sel.act_bytes < none.act_bytes);
        assert_true(full.act_bytes < sel.act_bytes);
    }
    if (dec2)
        assert_true(dec_only.act_bytes < none.act_bytes);
    for (int k = 0; k < 3; k++)
        free(runs[k]->grads);
    free(none.grads);
}

static void check_preset(const char *name)
{
    model_shape sh;
    hearth_err err;
    if (preset_load(&sh, name, &err))
        fail_msg("preset %s: %s", name, err.msg);
    tu_rng rng = tu_rng_fresh_noted();
    static const int grids[] = { 1, 6, 4, 2, 2, 2 };
    static const int seqs[] = { 0, 0 };
    tm_batch tb;
    tm_make_batch(&tb, &sh, &rng, 1, 24, 2, grids, seqs);
    check_shape(&sh, &tb, &rng);
    tm_free_batch(&tb);
}

static void test_tiny_vlm(void **state)
{
    (void)state;
    check_preset("tiny-vlm");
}

static void test_tiny_vlm_moe(void **state)
{
    (void)state;
    check_preset("tiny-vlm-moe");
}

static void test_gpt2_like(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    model_shape sh = tm_shape_gpt2();
    tm_batch tb;
    tm_make_batch(&tb, &sh, &rng, 2, 12, 0, NULL, NULL);
    check_shape(&sh, &tb, &rng);
    tm_free_batch(&tb);
}

static void test_random_mixes(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    for (int rep = 0; rep < 4; rep++) {
        model_shape sh;
        tm_batch tb;
        tm_random_case(&sh, &tb, &rng, rep);
        check_shape(&sh, &tb, &rng);
        tm_free_batch(&tb);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_vlm),
        cmocka_unit_test(test_tiny_vlm_moe),
        cmocka_unit_test(test_gpt2_like),
        cmocka_unit_test(test_random_mixes),
    };
    return cmocka_run_group_tests_name("model_recompute", tests, NULL, NULL);
}
