/* test_model_core.c - the model's bookkeeping and contracts: the tensor table (names,
 * layout, flags, parameter count against the shape module), initialisation statistics,
 * determinism (seeds, thread counts, batch-size history), gradient accumulation and
 * scaling, forward-only, freezing, and error reporting. */
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

#include "kernels.h"
#include "model/model.h"
#include "model/rng.h"
#include "support/testutil.h"
#include "test_model_util.h"

static model *make(const model_shape *sh, uint64_t seed)
{
    model *m;
    hearth_err err;
    if (model_create(&m, sh, seed, &err))
        fail_msg("model_create(%s): %s", sh->name, err.msg);
    return m;
}

static void fb(model *m, const vlm_batch *b, float ls, float as, model_stats *st)
{
    hearth_err err;
    if (model_forward_backward(m, b, ls, as, st, &err))
        fail_msg("model_forward_backward: %s", err.msg);
}

/* The standard VLM test batch: 3 images (non-square, t = 2, small) over 2 sequences. */
static void vlm_batch_make(tm_batch *tb, const model_shape *sh, tu_rng *r)
{
    static const int grids[] = { 1, 6, 10, 2, 4, 4, 1, 2, 2 };
    static const int seqs[] = { 0, 0, 1 };
    tm_make_batch(tb, sh, r, 2, 32, 3, grids, seqs);
}

/* ---- tensor table -------------------------------------------------------------------- */

static void check_table(const model_shape *sh)
{
    model *m = make(sh, 1);
    int n = model_tensor_count(m);
    size_t next = 0;
    for (int i = 0; i < n; i++) {
        const model_tensor *t = model_tensor_at(m, i);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= (size_t)t->dims[d];
        if (t->offset != next || numel != t->numel || t->numel == 0)
            fail_msg("%s: tensor %s at offset %zu (want %zu), numel %zu (dims give %zu)",
                     sh->name, t->name, t->offset, next, t->numel, numel);
        next += t->numel;
        assert_int_equal(t->decay, t->ndim >= 2);
        int enc = strncmp(t->name, "encoder.", 8) == 0;
        int dec = strncmp(t->name, "decoder.", 8) == 0;
        int proj = strncmp(t->name, "projector.", 10) == 0;
        assert_true(enc || dec || proj);
        assert_int_equal(t->frozen, (enc && sh->encoder.s.freeze) || (dec && sh->decoder.s.freeze));
        assert_ptr_equal(model_tensor_find(m, t->name), t);
        for (int j = 0; j < i; j++)
            if (strcmp(model_tensor_at(m, j)->name, t->name) == 0)
                fail_msg("duplicate tensor name %s", t->name);
    }
    assert_int_equal(next, model_param_count(m));
    assert_null(model_tensor_at(m, n));
    assert_null(model_tensor_find(m, "no.such.tensor"));

    /* the shape module counts the same parameters, independently */
    shape_params sp;
    shape_count_params(sh, &sp);
    assert_int_equal((int64_t)model_param_count(m), sp.total);

    /* names and dims the checkpoint import will rely on */
    const decoder_shape *d = &sh->decoder;
    const stack_shape *s = &d->s;
    const model_tensor *t = model_tensor_find(m, "decoder.embed.weight");
    assert_non_null(t);
    assert_int_equal(t->dims[0], d->vocab);
    assert_int_equal(t->dims[1], s->hidden);
    t = model_tensor_find(m, "decoder.layers.0.attn.qkv.weight");
    assert_non_null(t);
    assert_int_equal(t->dims[0], (s->heads + 2 * s->kv_heads) * s->head_dim);
    assert_int_equal(t->dims[1], s->hidden);
    assert_int_equal(model_tensor_find(m, "decoder.lm_head.weight") == NULL, d->tied_embeddings);
    assert_non_null(model_tensor_find(m, "decoder.final_norm.weight"));
    if (d->moe_experts > 0) {
        char name[96];
        snprintf(name, sizeof name, "decoder.layers.%d.mlp.experts.gate_up.weight",
                 d->moe_every - 1);
        t = model_tensor_find(m, name);
        assert_non_null(t);
        assert_int_equal(t->ndim, 3);
        assert_int_equal(t->dims[0], d->moe_experts);
        assert_int_equal(t->dims[1], 2 * d->moe_ffn);
        assert_int_equal(t->dims[2], s->hidden);
        snprintf(name, sizeof name, "decoder.layers.%d.mlp.router.weight", d->moe_every - 1);
        assert_non_null(model_tensor_find(m, name));
    }
    if (sh->encoder.present) {
        const encoder_shape *e = &sh->encoder;
        t = model_tensor_find(m, "encoder.patch_embed.weight");
        assert_non_null(t);
        assert_int_equal(t->dims[0], e->s.hidden);
        assert_int_equal(t->dims[1], e->in_channels * e->temporal_patch * e->patch * e->patch);
        t = model_tensor_find(m, "projector.fc1.weight");
        assert_non_null(t);
        assert_int_equal(t->dims[1], e->spatial_merge * e->spatial_merge * e->s.hidden);
        assert_non_null(model_tensor_find(m, "projector.norm.weight"));
    }
    model_free(m);
}

static void test_tensor_table(void **state)
{
    (void)state;
    model_shape a = tm_shape_gpt2(), b = tm_shape_vlm(), c = tm_shape_vlm_moe();
    check_table(&a);
    check_table(&b);
    check_table(&c);
    c.encoder.s.freeze = 1;
    check_table(&c);
    b.decoder.s.freeze = 1;
    check_table(&b);
    static const char *presets[] = { "tiny-vlm", "tiny-vlm-moe" };
    for (int i = 0; i < 2; i++) {
        model_shape sh;
        hearth_err err;
        if (preset_load(&sh, presets[i], &err))
            fail_msg("%s", err.msg);
        check_table(&sh);
    }
}

/* ---- initialisation ------------------------------------------------------------------ */

static void test_init(void **state)
{
    (void)state;
    model_shape sh = tm_shape_vlm_moe();
    model *m = make(&sh, 42);
    const float *P = model_params(m);
    for (int i = 0; i < model_tensor_count(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        const float *p = P + t->offset;
        size_t nl = strlen(t->name);
        int bias = strcmp(t->name + nl - 5, ".bias") == 0;
        if (t->ndim == 1) {
            float want = bias ? 0.0f : 1.0f;
            for (size_t j = 0; j < t->numel; j++)
                if (p[j] != want)
                    fail_msg("%s[%zu] = %g, want %g", t->name, j, p[j], want);
            continue;
        }
        int layers = strncmp(t->name, "encoder", 7) == 0 ? sh.encoder.s.layers
                                                         : sh.decoder.s.layers;
        int out = strstr(t->name, "attn.proj.weight") || strstr(t->name, "down.weight");
        double want = 0.02 / (out ? sqrt(2.0 * layers) : 1.0);
        double s1 = 0, s2 = 0;
        for (size_t j = 0; j < t->numel; j++) {
            s1 += p[j];
            s2 += (double)p[j] * p[j];
        }
        double n = (double)t->numel, mean = s1 / n, sd = sqrt(s2 / n - mean * mean);
        /* 5 sigma of the sampling error of the standard deviation and of the mean */
        if (fabs(sd - want) > 5 * want / sqrt(2 * n) + 1e-9 || fabs(mean) > 5 * want / sqrt(n))
            fail_msg("%s: mean %g std %g, want 0 and %g", t->name, mean, sd, want);
    }
    /* distinct tensors get distinct streams */
    const model_tensor *a = model_tensor_find(m, "decoder.layers.0.attn.qkv.weight");
    const model_tensor *b = model_tensor_find(m, "decoder.layers.1.attn.qkv.weight");
    assert_false(tu_bitwise_equal(P + a->offset, P + b->offset, a->numel));
    model_free(m);
}

static void test_rng(void **state)
{
    (void)state;
    hrng a, b;
    hrng_init(&a, 7);
    hrng_init(&b, 7);
    double s1 = 0, s2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = hrng_normal(&a);
        assert_true(x == hrng_normal(&b));
        s1 += x;
        s2 += x * x;
    }
    assert_true(fabs(s1 / n) < 5 / sqrt(n));
    assert_true(fabs(s2 / n - 1) < 5 * sqrt(2.0 / n));
    for (int i = 0; i < 1000; i++) {
        double u = hrng_uniform(&a);
        assert_true(u >= 0 && u < 1);
    }
    assert_true(hrng_mix(1, 2) != hrng_mix(2, 1));
    assert_true(hrng_hash_str("a") != hrng_hash_str("b"));
}

/* ---- determinism --------------------------------------------------------------------- */

static void test_determinism(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    model_shape sh = tm_shape_vlm_moe();
    tm_batch tb;
    vlm_batch_make(&tb, &sh, &rng);
    uint64_t seed = tu_next(&rng);
    model *a = make(&sh, seed), *b = make(&sh, seed), *c = make(&sh, seed + 1);
    size_t P = model_param_count(a);
    TU_ASSERT_BITWISE(model_params(a), model_params(b), P, &rng, "same seed, parameters");
    assert_false(tu_bitwise_equal(model_params(a), model_params(c), P));

    model_stats sa, sb, sc;
    omp_set_num_threads(1);
    fb(a, &tb.b, 0.01f, 0.1f, &sa);
    omp_set_num_threads(2);
    fb(b, &tb.b, 0.01f, 0.1f, &sb);
    fb(c, &tb.b, 0.01f, 0.1f, &sc);
    omp_set_num_threads(1);
    assert_true(sa.loss_sum == sb.loss_sum);
    assert_true(sa.aux_loss == sb.aux_loss);
    TU_ASSERT_BITWISE(model_grads(a), model_grads(b), P, &rng,
                      "same seed, 1 and 2 threads, gradients");
    assert_true(sa.loss_sum != sc.loss_sum);
    assert_false(tu_bitwise_equal(model_grads(a), model_grads(c), P));
    model_free(a);
    model_free(b);
    model_free(c);
    tm_free_batch(&tb);
}

/* A model that saw a larger batch first gives the same bits as a fresh one. */
static void test_batch_growth(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    model_shape sh = tm_shape_vlm_moe();
    tm_batch small, big;
    static const int g1[] = { 1, 4, 4 };
    static const int s1[] = { 0 };
    static const int g2[] = { 1, 6, 10, 2, 4, 4, 1, 2, 2, 1, 10, 6 };
    static const int s2[] = { 0, 0, 1, 2 };
    tm_make_batch(&small, &sh, &rng, 1, 12, 1, g1, s1);
    tm_make_batch(&big, &sh, &rng, 3, 40, 4, g2, s2);
    uint64_t seed = tu_next(&rng);
    model *a = make(&sh, seed), *b = make(&sh, seed);
    model_stats sa, sb;
    fb(a, &big.b, 0.01f, 0.1f, &sa);
    model_zero_grad(a);
    fb(a, &small.b, 0.01f, 0.1f, &sa);
    fb(b, &small.b, 0.01f, 0.1f, &sb);
    assert_true(sa.loss_sum == sb.loss_sum);
    TU_ASSERT_BITWISE(model_grads(a), model_grads(b), model_param_count(a), &rng,
                      "after a larger batch, gradients");
    /* and growing again works */
    fb(b, &big.b, 0.01f, 0.1f, &sb);
    model_free(a);
    model_free(b);
    tm_free_batch(&small);
    tm_free_batch(&big);
}

/* ---- the loss contract ----------------------------------------------------------------- */

static void test_accumulate_and_scale(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    model_shape sh = tm_shape_vlm_moe();
    tm_batch tb;
    vlm_batch_make(&tb, &sh, &rng);
    model *m = make(&sh, tu_next(&rng));
    size_t P = model_param_count(m);
    model_stats st, st2;

    fb(m, &tb.b, 0.02f, 0.1f, &st);
    float *g1 = tu_fdup(model_grads(m), P);
    /* stats */
    int nt = 0;
    for (int i = 0; i < tb.b.n_seq * tb.b.seq_len; i++)
        nt += tb.targets[i] != -1;
    assert_int_equal(st.n_targets, nt);
    assert_true(st.loss_sum > 0 && st.aux_loss > 0);
    assert_true(st.encoder_ms > 0 && st.decoder_ms > 0);
    /* forward only: same loss bits, gradients untouched */
    hearth_err err;
    if (model_forward(m, &tb.b, &st2, &err))
        fail_msg("%s", err.msg);
    assert_true(st.loss_sum == st2.loss_sum && st.aux_loss == st2.aux_loss);
    TU_ASSERT_BITWISE(model_grads(m), g1, P, &rng, "forward leaves gradients");
    /* accumulation: a second call adds the same gradient again */
    fb(m, &tb.b, 0.02f, 0.1f, &st2);
    float *g2x = tu_falloc(P);
    for (size_t i = 0; i < P; i++)
        g2x[i] = 2 * g1[i];
    TU_ASSERT_LE(tu_rel_l2_ff(model_grads(m), g2x, P), 1e-6, &rng, "accumulated gradient");
    /* scaling: the objective is linear in loss_scale and aux_scale */
    model_zero_grad(m);
    fb(m, &tb.b, 0.0f, 0.1f, &st2);
    float *ga = tu_fdup(model_grads(m), P);
    model_zero_grad(m);
    fb(m, &tb.b, 0.02f, 0.0f, &st2);
    for (size_t i = 0; i < P; i++)
        ga[i] += model_grads(m)[i];
    TU_ASSERT_LE(tu_rel_l2_ff(ga, g1, P), 1e-5, &rng, "loss + aux gradients add up");
    model_zero_grad(m);
    fb(m, &tb.b, 0.04f, 0.2f, &st2);
    for (size_t i = 0; i < P; i++)
        g2x[i] = 2 * g1[i];
    TU_ASSERT_LE(tu_rel_l2_ff(model_grads(m), g2x, P), 1e-6, &rng, "doubled scales");
    free(g1);
    free(g2x);
    free(ga);
    model_free(m);
    tm_free_batch(&tb);
}

/* The routing introspection: top_k per token per MoE layer. */
static void test_routing_snapshot(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    model_shape sh = tm_shape_vlm_moe();
    tm_batch tb;
    vlm_batch_make(&tb, &sh, &rng);
    model *m = make(&sh, tu_next(&rng));
    assert_int_equal(model_last_routing(m, NULL, 0), 0);
    model_stats st;
    fb(m, &tb.b, 0.01f, 0.0f, &st);
    int moe_layers = sh.decoder.s.layers / sh.decoder.moe_every;
    size_t n = model_last_routing(m, NULL, 0);
    assert_int_equal(n, (size_t)moe_layers * 64 * sh.decoder.moe_top_k);
    int *r = tu_ialloc(n);
    assert_int_equal(model_last_routing(m, r, n), n);
    for (size_t i = 0; i < n; i++)
        assert_true(r[i] >= 0 && r[i] < sh.decoder.moe_experts);
    for (size_t i = 0; i < n; i += 2)
        assert_true(r[i] != r[i + 1]);

    /* pinning the routing it chose changes nothing */
    hearth_err err;
    model_stats sp;
    if (model_pin_routing(m, r, n, &err) || model_forward(m, &tb.b, &sp, &err))
        fail_msg("%s", err.msg);
    assert_true(sp.loss_sum == st.loss_sum);
    TU_ASSERT_LE(fabs(sp.aux_loss - st.aux_loss), 1e-6 * st.aux_loss, &rng, "pinned aux");
    /* another routing is used as given: every token to experts (0, 1) */
    int *q = tu_ialloc(n), *got = tu_ialloc(n);
    for (size_t i = 0; i < n; i++)
        q[i] = (int)(i % 2);
    if (model_pin_routing(m, q, n, &err) || model_forward(m, &tb.b, &sp, &err))
        fail_msg("%s", err.msg);
    model_last_routing(m, got, n);
    assert_memory_equal(got, q, n * sizeof(int));
    assert_true(sp.loss_sum != st.loss_sum);
    /* a batch of another size, an expert out of range */
    tm_batch small;
    static const int g1[] = { 1, 2, 2 };
    static const int s1[] = { 0 };
    tm_make_batch(&small, &sh, &rng, 1, 8, 1, g1, s1);
    assert_true(model_forward(m, &small.b, &sp, &err) < 0);
    q[3] = sh.decoder.moe_experts;
    assert_true(model_pin_routing(m, q, n, &err) < 0);
    /* unpinned again */
    if (model_pin_routing(m, NULL, 0, &err) || model_forward(m, &tb.b, &sp, &err))
        fail_msg("%s", err.msg);
    assert_true(sp.loss_sum == st.loss_sum);
    tm_free_batch(&small);
    free(q);
    free(got);
    free(r);
    model_free(m);
    tm_free_batch(&tb);
}

/* ---- freezing ------------------------------------------------------------------------ */

static int is_comp(const model_tensor *t, const char *comp)
{
    return strncmp(t->name, comp, strlen(comp)) == 0;
}

static void test_freeze(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    model_shape sh = tm_shape_vlm();
    tm_batch tb;
    vlm_batch_make(&tb, &sh, &rng);
    uint64_t seed = tu_next(&rng);
    model *full = make(&sh, seed);
    model_stats st;
    fb(full, &tb.b, 0.01f, 0.0f, &st);

    for (int which = 0; which < 2; which++) {
        model_shape fs = sh;
        if (which == 0)
            fs.encoder.s.freeze = 1;
        else
            fs.decoder.s.freeze = 1;
        model *m = make(&fs, seed);
        model_stats st2;
        fb(m, &tb.b, 0.01f, 0.0f, &st2);
        assert_true(st.loss_sum == st2.loss_sum);
        const char *frozen = which == 0 ? "encoder." : "decoder.";
        for (int i = 0; i < model_tensor_count(m); i++) {
            const model_tensor *t = model_tensor_at(m, i);
            const float *g = model_grads(m) + t->offset;
            if (is_comp(t, frozen)) {
                assert_true(t->frozen);
                for (size_t j = 0; j < t->numel; j++)
                    if (g[j] != 0)
                        fail_msg("frozen %s has gradient %g", t->name, g[j]);
            } else if (!tu_bitwise_equal(g, model_grads(full) + t->offset, t->numel)) {
                /* everything else trains exactly as in the unfrozen model */
                fail_msg("%s: gradient differs when %s is frozen (seed %llu)", t->name,
                         frozen, (unsigned long long)rng.seed);
            }
        }
        model_free(m);
    }
    model_free(full);
    tm_free_batch(&tb);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void expect_fail(model *m, const vlm_batch *b, const char *needle)
{
    hearth_err err = { { 0 } };
    model_stats st;
    int rc = model_forward_backward(m, b, 1.0f, 0.0f, &st, &err);
    if (rc >= 0)
        fail_msg("expected an error mentioning '%s'", needle);
    if (!strstr(err.msg, needle))
        fail_msg("error '%s' does not mention '%s'", err.msg, needle);
}

static void test_errors(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    model_shape sh = tm_shape_vlm();
    tm_batch tb;
    vlm_batch_make(&tb, &sh, &rng);
    model *m = make(&sh, 1);
    int img = sh.decoder.image_token_id;

    /* one image token too many */
    int i0 = 0;
    while (tb.tokens[i0] == img)
        i0++;
    int save = tb.tokens[i0];
    tb.tokens[i0] = img;
    expect_fail(m, &tb.b, "image");
    tb.tokens[i0] = save;
    /* a token and a target outside the vocabulary */
    tb.tokens[i0] = sh.decoder.vocab + 3;
    expect_fail(m, &tb.b, "vocabulary");
    tb.tokens[i0] = save;
    save = tb.targets[i0];
    tb.targets[i0] = -2;
    expect_fail(m, &tb.b, "target");
    tb.targets[i0] = save;
    /* a grid that is not a multiple of the merge */
    tb.grid[2] = 9;
    expect_fail(m, &tb.b, "spatial_merge");
    tb.grid[2] = 10;
    /* and the batch is fine again */
    model_stats st;
    fb(m, &tb.b, 1.0f, 0.0f, &st);

    /* images for a text-only model; learned positions too short */
    model_shape g = tm_shape_gpt2();
    model *t = make(&g, 1);
    vlm_batch b = tb.b;
    expect_fail(t, &b, "encoder");
    tm_batch tt;
    tm_make_batch(&tt, &g, &rng, 1, g.decoder.max_positions + 1, 0, NULL, NULL);
    expect_fail(t, &tt.b, "positions");
    model_free(t);
    tm_free_batch(&tt);

    /* shapes the model refuses */
    hearth_err err;
    model *bad;
    model_shape s2 = tm_shape_vlm();
    s2.decoder.s.kv_heads = 3;
    assert_true(model_create(&bad, &s2, 1, &err) < 0);
    assert_non_null(strstr(err.msg, "kv_heads"));
    s2 = tm_shape_vlm();
    s2.decoder.s.mrope_section[0] = 3;
    assert_true(model_create(&bad, &s2, 1, &err) < 0);
    assert_non_null(strstr(err.msg, "mrope_section"));
    s2 = tm_shape_vlm_moe();
    s2.decoder.moe_top_k = 5;
    assert_true(model_create(&bad, &s2, 1, &err) < 0);
    assert_non_null(strstr(err.msg, "top_k"));

    model_free(m);
    tm_free_batch(&tb);
}

/* ---- random shapes ----------------------------------------------------------------------
 * Small random shapes and batches through forward and backward: finite results and, under
 * the sanitizers, no out-of-bounds access in any combination of features. */

static void test_random_shapes(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    for (int rep = 0; rep < 12; rep++) {
        model_shape sh;
        tm_batch tb;
        tm_random_case(&sh, &tb, &rng, rep);
        model *m = make(&sh, tu_next(&rng));
        model_stats st;
        fb(m, &tb.b, 0.1f, 0.1f, &st);
        if (!isfinite(st.loss_sum) || !isfinite(st.aux_loss) ||
            !isfinite(kcpu_sumsq(model_grads(m), model_param_count(m))))
            fail_msg("random shape %d: non-finite loss or gradients (seed %llu)", rep,
                     (unsigned long long)rng.seed);
        model_free(m);
        tm_free_batch(&tb);
    }
}

int main(void)
{
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_batch_growth),
        cmocka_unit_test(test_accumulate_and_scale),
        cmocka_unit_test(test_routing_snapshot),
        cmocka_unit_test(test_freeze),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_random_shapes),
    };
    return cmocka_run_group_tests_name("model_core", tests, NULL, NULL);
}
