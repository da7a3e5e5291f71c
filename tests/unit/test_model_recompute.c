/* test_model_recompute.c - activation recomputation (stack_shape.recompute) on the CPU
 * model: with `selective` or `full` the backward rebuilds the dropped activations with
 * the forward's own code, so loss and every gradient must be BITWISE those without
 * recomputation, while the activation arena shrinks (full < selective < none).
 *
 * Shapes: the tiny-vlm and tiny-vlm-moe presets, the hand-filled GPT-2-like shape
 * (LayerNorm, GELU, learned positions) and random feature mixes (qk_norm, windows,
 * MoE with shared experts, frozen components), fresh parameters and batches each run;
 * recomputation set on the encoder, the decoder or both.  The layouts (tp with sequence
 * parallelism, ep, a2a overlap) are covered by test_ptrain_overlap.c's recompute case.
 *
 * FP8 (model/fp8.h): every linear in FP8 with delayed scaling over a history of 4, several
 * steps of two micro batches each (the ring wraps, so the history decides the scales) and
 * a plain SGD update between steps: with recomputation the layers replay their forward's
 * scales, so every micro batch's loss, every step's gradients and the amax histories and
 * their positions after every step are BITWISE those of the same FP8 run without it; also
 * with every micro batch in two sequence chunks (parallel.chunks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/fp8.h"
#include "model/model.h"
#include "support/testutil.h"
#include "test_model_util.h"

typedef struct {
    double loss, aux;
    float *grads;
    size_t n, act_bytes;
} grad_run;

/* A model of sh with the given recomputation per component. */
static model *model_with_recompute(model_shape sh, int enc_rec, int dec_rec, uint64_t seed)
{
    sh.encoder.s.recompute = enc_rec;
    sh.decoder.s.recompute = dec_rec;
    model *m;
    hearth_err err;
    if (model_create(&m, &sh, seed, &err))
        fail_msg("model_create: %s", err.msg);
    return m;
}

/* Forward+backward of b on a model of sh with the given recomputation per component. */
static void run_one(model_shape sh, int enc_rec, int dec_rec, uint64_t seed,
                    const tm_batch *tb, const tu_rng *prng, grad_run *out)
{
    model *m = model_with_recompute(sh, enc_rec, dec_rec, seed);
    hearth_err err;
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

/* The preset's shape (the test fails if it does not load). */
static model_shape preset_shape(const char *name)
{
    model_shape sh;
    hearth_err err;
    if (preset_load(&sh, name, &err))
        fail_msg("preset %s: %s", name, err.msg);
    return sh;
}

static void check_preset(const char *name)
{
    model_shape sh = preset_shape(name);
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

/* ---- FP8 ---------------------------------------------------------------------------- */

enum { FP8_STEPS = 3, FP8_MICRO = 2, FP8_HISTORY = 4 };

typedef struct {
    double loss[FP8_STEPS * FP8_MICRO], aux[FP8_STEPS * FP8_MICRO];
    float *grads[FP8_STEPS], *hist[FP8_STEPS];     /* after each step */
    int *pos[FP8_STEPS];
    size_t n, n_hist, n_pos;
} fp8_run;

static void fp8_run_free(fp8_run *r)
{
    for (int s = 0; s < FP8_STEPS; s++) {
        free(r->grads[s]);
        free(r->hist[s]);
        free(r->pos[s]);
    }
}

/* FP8_STEPS steps of FP8_MICRO micro batches (tb[step * FP8_MICRO + k]) on a model of sh
 * with every linear in FP8 and the given recomputation, each micro batch in K sequence
 * chunks (K = 1: whole); p -= 0.01 g between steps. */
static void fp8_run_one(model_shape sh, int enc_rec, int dec_rec, int K, uint64_t seed,
                        const tm_batch *tb, const tu_rng *prng, fp8_run *out)
{
    model *m = model_with_recompute(sh, enc_rec, dec_rec, seed);
    hearth_err err;
    fp8_plan plan = { .all = 1, .history = FP8_HISTORY };
    if (model_set_fp8(m, &plan, &err))
        fail_msg("model_set_fp8: %s", err.msg);
    tu_rng r = *prng;
    tm_randomize_params(m, &r);
    memset(out, 0, sizeof *out);
    out->n = model_param_count(m);
    for (int s = 0; s < FP8_STEPS; s++) {
        model_zero_grad(m);
        for (int k = 0; k < FP8_MICRO; k++) {
            const tm_batch *b = &tb[s * FP8_MICRO + k];
            int nt = 0;
            for (int i = 0; i < b->b.n_seq * b->b.seq_len; i++)
                nt += b->targets[i] != -1;
            model_stats st;
            if (model_forward_backward_chunks(m, &b->b, K, nt ? 1.0f / (float)nt : 1.0f,
                                              K > 1 ? 0.0f : 0.1f, &st, &err))
                fail_msg("step %d micro batch %d: %s", s + 1, k, err.msg);
            out->loss[s * FP8_MICRO + k] = st.loss_sum;
            out->aux[s * FP8_MICRO + k] = st.aux_loss;
        }
        float *g = model_grads(m), *p = model_params(m), *hist;
        int *pos;
        if (model_fp8_state(m, &hist, &out->n_hist, &pos, &out->n_pos, &err))
            fail_msg("model_fp8_state: %s", err.msg);
        assert_true(out->n_hist > 0 && out->n_pos > 0);
        out->grads[s] = tu_fdup(g, out->n);
        out->hist[s] = tu_fdup(hist, out->n_hist);
        out->pos[s] = tu_ialloc(out->n_pos);
        memcpy(out->pos[s], pos, out->n_pos * sizeof *pos);
        for (size_t i = 0; i < out->n; i++)
            p[i] -= 0.01f * g[i];
    }
    model_free(m);
}

static void fp8_check_shape(const model_shape *sh, const tm_batch *tb, int K, tu_rng *rng)
{
    uint64_t seed = tu_next(rng);
    tu_rng prng = *rng;
    tu_next(rng);
    fp8_run none;
    fp8_run_one(*sh, RECOMPUTE_NONE, RECOMPUTE_NONE, K, seed, tb, &prng, &none);
    /* FP8 is really on: amax entered the histories, and more than one per ring */
    size_t filled = 0;
    for (size_t i = 0; i < none.n_hist; i++)
        filled += none.hist[FP8_STEPS - 1][i] > 0.0f;
    assert_true(filled > none.n_pos);
    static const int recs[2] = { RECOMPUTE_SELECTIVE, RECOMPUTE_FULL };
    static const char *rec_names[2] = { "selective", "full" };
    static const char *where[3] = { "encoder", "decoder", "both" };
    for (int ri = 0; ri < 2; ri++)
        for (int w = 0; w < 3; w++) {
            if (w != 1 && !sh->encoder.present)
                continue;
            int enc = w != 1 ? recs[ri] : RECOMPUTE_NONE;
            int dec = w != 0 ? recs[ri] : RECOMPUTE_NONE;
            fp8_run r;
            fp8_run_one(*sh, enc, dec, K, seed, tb, &prng, &r);
            assert_int_equal(r.n, none.n);
            assert_int_equal(r.n_hist, none.n_hist);
            assert_int_equal(r.n_pos, none.n_pos);
            for (int s = 0; s < FP8_STEPS; s++) {
                for (int k = 0; k < FP8_MICRO; k++) {
                    int i = s * FP8_MICRO + k;
                    if (r.loss[i] != none.loss[i] || r.aux[i] != none.aux[i])
                        fail_msg("%s fp8 chunks %d, %s on the %s: step %d micro batch %d "
                                 "loss %.17g aux %.17g, without recomputation %.17g %.17g "
                                 "(seed %llu)", sh->name, K, rec_names[ri], where[w], s + 1,
                                 k, r.loss[i],
                                 r.aux[i], none.loss[i], none.aux[i],
                                 (unsigned long long)rng->seed);
                }
                for (size_t i = 0; i < none.n; i++)
                    if (memcmp(&r.grads[s][i], &none.grads[s][i], sizeof(float)))
                        fail_msg("%s fp8 chunks %d, %s on the %s: step %d gradient %zu is "
                                 "%.9g, without recomputation %.9g (seed %llu)", sh->name, K,
                                 rec_names[ri], where[w], s + 1, i, r.grads[s][i],
                                 none.grads[s][i], (unsigned long long)rng->seed);
                if (memcmp(r.hist[s], none.hist[s], none.n_hist * sizeof(float)) ||
                    memcmp(r.pos[s], none.pos[s], none.n_pos * sizeof(int)))
                    fail_msg("%s fp8 chunks %d, %s on the %s: step %d amax histories or "
                             "positions differ from those without recomputation (seed %llu)",
                             sh->name, K, rec_names[ri], where[w], s + 1,
                             (unsigned long long)rng->seed);
            }
            fp8_run_free(&r);
        }
    printf("# %-14s fp8 delayed (history %d), chunks %d: %d steps x %d micro batches "
           "bitwise equal with recomputation\n", sh->name, FP8_HISTORY, K, FP8_STEPS,
           FP8_MICRO);
    fp8_run_free(&none);
}

static void fp8_check_preset(const char *name, int K)
{
    model_shape sh = preset_shape(name);
    tu_rng rng = tu_rng_fresh_noted();
    static const int grids[] = { 1, 6, 4, 2, 2, 2 };
    static const int seqs[] = { 0, 0 };
    tm_batch tb[FP8_STEPS * FP8_MICRO];
    for (int i = 0; i < FP8_STEPS * FP8_MICRO; i++)
        tm_make_batch(&tb[i], &sh, &rng, 1, 24, 2, grids, seqs);
    fp8_check_shape(&sh, tb, K, &rng);
    for (int i = 0; i < FP8_STEPS * FP8_MICRO; i++)
        tm_free_batch(&tb[i]);
}

static void test_fp8_tiny_vlm(void **state)
{
    (void)state;
    fp8_check_preset("tiny-vlm", 1);
}

static void test_fp8_tiny_vlm_moe(void **state)
{
    (void)state;
    fp8_check_preset("tiny-vlm-moe", 1);
}

/* Sequence chunks: every chunk runs on an object of its own (the model or a clone kept in
 * it), whose saved scales its recomputation replays. */
static void test_fp8_tiny_vlm_chunks(void **state)
{
    (void)state;
    fp8_check_preset("tiny-vlm", 2);
}

static void test_fp8_gpt2_like(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    model_shape sh = tm_shape_gpt2();
    tm_batch tb[FP8_STEPS * FP8_MICRO];
    for (int i = 0; i < FP8_STEPS * FP8_MICRO; i++)
        tm_make_batch(&tb[i], &sh, &rng, 2, 12, 0, NULL, NULL);
    fp8_check_shape(&sh, tb, 1, &rng);
    for (int i = 0; i < FP8_STEPS * FP8_MICRO; i++)
        tm_free_batch(&tb[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_vlm),
        cmocka_unit_test(test_tiny_vlm_moe),
        cmocka_unit_test(test_gpt2_like),
        cmocka_unit_test(test_random_mixes),
        cmocka_unit_test(test_fp8_tiny_vlm),
        cmocka_unit_test(test_fp8_tiny_vlm_moe),
        cmocka_unit_test(test_fp8_tiny_vlm_chunks),
        cmocka_unit_test(test_fp8_gpt2_like),
    };
    return cmocka_run_group_tests_name("model_recompute", tests, NULL, NULL);
}
