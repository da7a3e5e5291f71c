/* test_shape_presets.c - the shipped presets, parameter and FLOP counts, preset errors
 * and shape checks (trainer/shape/model_shape.h).
 *
 * Parameter counts are checked three ways: against published totals (GPT-2 small and the
 * Hugging Face Qwen2.5-VL checkpoints), and for random shapes against a counter written
 * here tensor by tensor.  Random inputs use a fresh seed (printed on failure). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shape/model_shape.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

static const char *const presets[] = { "tiny-vlm", "tiny-vlm-moe", "qwen2.5-vl-3b",
                                       "qwen2.5-vl-7b", "qwen3-vl-30b-a3b", "gpt2-124m" };

static model_shape load(const char *name)
{
    model_shape m;
    hearth_err err = { { 0 } };
    if (preset_load(&m, name, &err))
        fail_msg("preset %s: %s", name, err.msg);
    return m;
}

static void test_presets_load(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        model_shape m = load(presets[i]);
        hearth_err err = { { 0 } };
        if (shape_validate(&m, &err))
            fail_msg("%s: %s", presets[i], err.msg);
        assert_string_equal(m.name, presets[i]);
        int text_only = strcmp(presets[i], "gpt2-124m") == 0;
        assert_int_equal(m.encoder.present, !text_only);
        assert_int_equal(m.projector.present, !text_only);
        assert_int_equal(m.decoder.s.recompute, 0);
        assert_int_equal(m.decoder.s.freeze, 0);
    }
    /* The tiny presets split as DESIGN.md promises. */
    for (int k = 0; k < 2; k++) {
        model_shape m = load(presets[k]);
        const stack_shape *s[2] = { &m.encoder.s, &m.decoder.s };
        for (int j = 0; j < 2; j++) {
            assert_int_equal(s[j]->head_dim, 64);
            assert_int_equal(s[j]->hidden % 64, 0);
            for (int tp = 1; tp <= 4; tp *= 2) {
                assert_int_equal(s[j]->heads % tp, 0);
                assert_true(s[j]->kv_heads % tp == 0 || tp % s[j]->kv_heads == 0);
                assert_int_equal(s[j]->ffn % tp, 0);
            }
        }
        assert_int_equal(m.decoder.s.layers % 4, 0);   /* pp 2 x vpp 2 */
        assert_int_equal(m.projector.hidden % 64, 0);
        assert_int_equal(m.decoder.vocab % 64, 0);
        if (k == 1)
            assert_int_equal(m.decoder.moe_experts % 4, 0);
    }
    /* A path works as well as a name, and so does $HEARTH_MODELS. */
    char path[4096];
    hearth_err err = { { 0 } };
    model_shape m;
    snprintf(path, sizeof path, "contrib/models/tiny-vlm.yaml");
    if (access(path, R_OK) == 0) {
        assert_int_equal(preset_load(&m, path, &err), 0);
        assert_string_equal(m.name, "tiny-vlm");
    }
}

/* ---- an independent parameter counter: one tensor at a time ---------------------- */

typedef struct {
    int64_t n;
} acc;

static void tensor(acc *a, int64_t rows, int64_t cols)
{
    a->n += rows * cols;
}

static void norm(acc *a, norm_kind k, int64_t w)
{
    tensor(a, 1, w);             /* weight */
    if (k == NORM_LAYERNORM)
        tensor(a, 1, w);         /* bias */
}

static void linear(acc *a, int64_t in, int64_t out, int bias)
{
    tensor(a, out, in);
    if (bias)
        tensor(a, 1, out);
}

static void mlp(acc *a, const stack_shape *s, int64_t ffn)
{
    if (s->mlp == MLP_SWIGLU) {
        linear(a, s->hidden, ffn, s->bias_mlp);   /* gate */
        linear(a, s->hidden, ffn, s->bias_mlp);   /* up */
    } else {
        linear(a, s->hidden, ffn, s->bias_mlp);   /* fc1 */
    }
    linear(a, ffn, s->hidden, s->bias_mlp);       /* down / fc2 */
}

static void block_attn(acc *a, const stack_shape *s)
{
    norm(a, s->norm, s->hidden);
    linear(a, s->hidden, (int64_t)s->heads * s->head_dim, s->bias_qkv);      /* q */
    linear(a, s->hidden, (int64_t)s->kv_heads * s->head_dim, s->bias_qkv);   /* k */
    linear(a, s->hidden, (int64_t)s->kv_heads * s->head_dim, s->bias_qkv);   /* v */
    if (s->qk_norm) {
        tensor(a, 1, s->head_dim);
        tensor(a, 1, s->head_dim);
    }
    linear(a, (int64_t)s->heads * s->head_dim, s->hidden, s->bias_proj);     /* o */
    norm(a, s->norm, s->hidden);
}

static void reference_count(const model_shape *m, shape_params *p)
{
    memset(p, 0, sizeof *p);
    acc e = { 0 }, pr = { 0 }, d = { 0 }, da = { 0 };
    if (m->encoder.present) {
        const encoder_shape *en = &m->encoder;
        tensor(&e, en->s.hidden, (int64_t)en->in_channels * en->temporal_patch * en->patch * en->patch);
        for (int l = 0; l < en->s.layers; l++) {
            block_attn(&e, &en->s);
            mlp(&e, &en->s, en->s.ffn);
        }
        norm(&pr, m->projector.norm, en->s.hidden);
        linear(&pr, (int64_t)en->spatial_merge * en->spatial_merge * en->s.hidden,
               m->projector.hidden, m->projector.bias);
        linear(&pr, m->projector.hidden, m->decoder.s.hidden, m->projector.bias);
    }
    const decoder_shape *dc = &m->decoder;
    const stack_shape *s = &dc->s;
    for (int pass = 0; pass < 2; pass++) {
        acc *a = pass ? &da : &d;
        tensor(a, dc->vocab, s->hidden);
        if (s->pos == POS_LEARNED)
            tensor(a, dc->max_positions, s->hidden);
        for (int l = 0; l < s->layers; l++) {
            block_attn(a, s);
            int is_moe = dc->moe_experts > 0 && l % dc->moe_every == dc->moe_every - 1;
            if (!is_moe) {
                mlp(a, s, s->ffn);
                continue;
            }
            tensor(a, s->hidden, dc->moe_experts);   /* router */
            for (int x = 0; x < (pass ? dc->moe_top_k : dc->moe_experts); x++)
                mlp(a, s, dc->moe_ffn);
            if (dc->moe_shared_ffn)
                mlp(a, s, dc->moe_shared_ffn);
        }
        norm(a, s->norm, s->hidden);
        if (!dc->tied_embeddings)
            tensor(a, dc->vocab, s->hidden);
    }
    p->encoder = e.n;
    p->projector = pr.n;
    p->decoder = d.n;
    p->decoder_active = da.n;
    p->total = e.n + pr.n + d.n;
    p->active = e.n + pr.n + da.n;
}

static void check_counts(const model_shape *m, const char *what, uint64_t seed)
{
    shape_params got, want;
    shape_count_params(m, &got);
    reference_count(m, &want);
    if (memcmp(&got, &want, sizeof got))
        fail_msg("%s: total %" PRId64 " vs %" PRId64 ", active %" PRId64 " vs %" PRId64
                 ", encoder %" PRId64 " vs %" PRId64 ", projector %" PRId64 " vs %" PRId64
                 " (seed %llu)", what, got.total, want.total, got.active, want.active,
                 got.encoder, want.encoder, got.projector, want.projector,
                 (unsigned long long)seed);
}

static void test_published_counts(void **state)
{
    (void)state;
    shape_params p;
    model_shape m = load("gpt2-124m");
    shape_count_params(&m, &p);
    assert_int_equal(p.total, 124439808);           /* GPT-2 small, tied LM head */
    assert_int_equal(p.encoder + p.projector, 0);
    m = load("qwen2.5-vl-3b");
    shape_count_params(&m, &p);
    assert_int_equal(p.total, 3754622976LL);        /* Qwen/Qwen2.5-VL-3B-Instruct */
    assert_int_equal(p.active, p.total);
    m = load("qwen2.5-vl-7b");
    shape_count_params(&m, &p);
    assert_int_equal(p.total, 8292166656LL);        /* Qwen/Qwen2.5-VL-7B-Instruct */
    m = load("qwen3-vl-30b-a3b");
    shape_count_params(&m, &p);
    assert_true(p.total > 30000000000LL && p.total < 31500000000LL);
    assert_true(p.decoder_active > 3000000000LL && p.decoder_active < 3500000000LL);
    assert_true(p.active > p.decoder_active && p.active < 4000000000LL);
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++) {
        m = load(presets[i]);
        check_counts(&m, presets[i], 0);
    }
}

/* A random shape (not necessarily valid: counting must not care). */
static model_shape random_shape(tu_rng *r)
{
    model_shape m;
    memset(&m, 0, sizeof m);
    stack_shape *st[2] = { &m.encoder.s, &m.decoder.s };
    for (int j = 0; j < 2; j++) {
        stack_shape *s = st[j];
        s->layers = tu_randint(r, 1, 9);
        s->heads = tu_randint(r, 1, 9);
        s->kv_heads = tu_randint(r, 1, s->heads + 1);
        s->head_dim = 2 * tu_randint(r, 1, 40);
        s->hidden = tu_randint(r, 1, 600);
        s->ffn = tu_randint(r, 1, 700);
        s->norm = (norm_kind)tu_randint(r, 0, 2);
        s->mlp = (mlp_kind)tu_randint(r, 0, 2);
        s->bias_qkv = tu_randint(r, 0, 2);
        s->bias_proj = tu_randint(r, 0, 2);
        s->bias_mlp = tu_randint(r, 0, 2);
        s->qk_norm = tu_randint(r, 0, 2);
        s->pos = (pos_kind)tu_randint(r, 0, 4);
    }
    m.encoder.present = m.projector.present = tu_randint(r, 0, 2);
    if (!m.encoder.present)
        memset(&m.encoder, 0, sizeof m.encoder);
    m.encoder.in_channels = tu_randint(r, 1, 4);
    m.encoder.patch = tu_randint(r, 1, 17);
    m.encoder.temporal_patch = tu_randint(r, 1, 3);
    m.encoder.spatial_merge = tu_randint(r, 1, 4);
    m.projector.hidden = tu_randint(r, 1, 900);
    m.projector.norm = (norm_kind)tu_randint(r, 0, 2);
    m.projector.bias = tu_randint(r, 0, 2);
    decoder_shape *d = &m.decoder;
    d->vocab = tu_randint(r, 1, 5000);
    d->tied_embeddings = tu_randint(r, 0, 2);
    d->max_positions = tu_randint(r, 1, 3000);
    if (tu_randint(r, 0, 2)) {
        d->moe_experts = tu_randint(r, 1, 17);
        d->moe_top_k = tu_randint(r, 1, d->moe_experts + 1);
        d->moe_ffn = tu_randint(r, 1, 300);
        d->moe_shared_ffn = tu_randint(r, 0, 2) * tu_randint(r, 1, 300);
        d->moe_every = tu_randint(r, 1, 4);
    }
    return m;
}

static void test_random_counts(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    for (int i = 0; i < 300; i++) {
        model_shape m = random_shape(&r);
        check_counts(&m, "random shape", r.seed);
    }
}

/* FLOPs against the formulas written out here from the published architectures. */
static void test_flops(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    shape_flops f;
    int seq = tu_randint(&r, 1, 4097);
    model_shape m = load("gpt2-124m");
    shape_count_flops(&m, seq, &f);
    /* 12 blocks of qkv 768x2304, proj 768x768, fc 768x3072 and 3072x768; LM head. */
    double n = 12.0 * (768.0 * 2304 + 768.0 * 768 + 2 * 768.0 * 3072) + 50257.0 * 768;
    double want = 6 * n + 12.0 * 12 * 12 * 64 * seq;
    if (f.decoder_per_token != want)
        fail_msg("gpt2 at seq_len %d: %.17g, expected %.17g (seed %llu)", seq,
                 f.decoder_per_token, want, (unsigned long long)r.seed);
    assert_true(f.encoder_per_patch == 0 && f.encoder_per_patch_sq == 0 &&
                f.projector_per_patch == 0);

    m = load("qwen2.5-vl-3b");
    shape_count_flops(&m, seq, &f);
    double dec = 36.0 * (2048.0 * 2048 + 2 * 2048.0 * 256 + 2048.0 * 2048 + 3 * 2048.0 * 11008) +
                 151936.0 * 2048;
    assert_true(f.decoder_per_token == 6 * dec + 12.0 * 36 * 16 * 128 * seq);
    /* Encoder: patch embedding 1280 x (3*2*14*14), 32 blocks; 28 windowed layers attend
     * 8x8 = 64 patches, 4 full layers attend the whole image. */
    double enc = 1280.0 * 1176 + 32.0 * (1280.0 * 3840 + 1280.0 * 1280 + 3 * 1280.0 * 3420);
    assert_true(f.encoder_per_patch == 6 * enc + 12.0 * 28 * 1280 * 64);
    assert_true(f.encoder_per_patch_sq == 12.0 * 4 * 1280);
    assert_true(f.projector_per_patch == 6 * (5120.0 * 5120 + 5120.0 * 2048) / 4);

    /* MoE: top_k experts and the router per token. */
    m = load("tiny-vlm-moe");
    shape_count_flops(&m, seq, &f);
    double moe = 4.0 * (256.0 * 256 + 2 * 256.0 * 128 + 256.0 * 256 + 256.0 * 8 +
                        2 * 3 * 256.0 * 256) + 1024.0 * 256;
    assert_true(f.decoder_per_token == 6 * moe + 12.0 * 4 * 4 * 64 * seq);
}

/* ---- preset files with mistakes ----------------------------------------------------- */

static char tmpdir[256];

static int setup_tmp(void **state)
{
    (void)state;
    return tu_tmpdir_make(tmpdir, sizeof tmpdir, "test-shape");
}

static int teardown_tmp(void **state)
{
    (void)state;
    return tu_tmpdir_remove(tmpdir);
}

static const char *write_preset(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.yaml", tmpdir, name);
    assert_int_equal(tu_write_text(path, text), 0);
    return path;
}

static void expect_error(const char *name, const char *text, const char *want)
{
    const char *path = write_preset(name, text);
    model_shape m;
    hearth_err err = { { 0 } };
    int rc = preset_load(&m, path, &err);
    if (rc != HERR_CONFIG)
        fail_msg("%s: expected an error '%s', got rc %d", name, want, rc);
    char full[1024];
    snprintf(full, sizeof full, "%s%s", path, want);
    if (strcmp(err.msg, full) != 0)
        fail_msg("message\n  '%s'\nexpected\n  '%s'", err.msg, full);
}

#define DEC "decoder:\n  layers: 2\n  hidden: 64\n  heads: 4\n  ffn: 128\n  vocab: 100\n"

static void test_preset_errors(void **state)
{
    (void)state;
    expect_error("a", DEC "  layerz: 3\n", ":7:3: decoder.layerz: unknown key (did you mean decoder.layers?)");
    expect_error("b", DEC "  heads: four\n", ":7:3: decoder.heads: duplicate key (first at 4:3)");
    expect_error("b2", "decoder:\n  heads: four\n", ":2:10: decoder.heads: expected an integer, got \"four\"");
    expect_error("c", DEC "  norm: batchnorm\n", ":7:9: decoder.norm: expected one of rmsnorm|layernorm, got \"batchnorm\"");
    expect_error("d", DEC "  kv_heads: 3\n", ":7:13: decoder.kv_heads: kv_heads 3 must divide heads 4");
    expect_error("e", "decoder:\n  layers: 2\n  hidden: 64\n  heads: 4\n  ffn: 128\n",
                 ": decoder.vocab: required, but not given");
    expect_error("f", DEC "  recompute: full\n", ":7:14: decoder.recompute: a training choice, not part "
                 "of a preset: set model.decoder.recompute in the run config");
    expect_error("g", DEC "  pos: mrope\n  mrope_section: [8, 8, 8]\n",
                 ":8:18: decoder.mrope_section: sections [8, 8, 8] sum to 24, must be head_dim / 2 = 8");
    expect_error("h", DEC "  pos: mrope\n  mrope_section: [8, 8]\n",
                 ":8:18: decoder.mrope_section: expected a list of 3 integers, got a list of 2 items");
    expect_error("i", DEC "  hidden_size: 1\n", ":7:3: decoder.hidden_size: unknown key");
    expect_error("j", DEC "  norm_eps: 0\n", ":7:13: decoder.norm_eps: must be > 0 and <= 1, got 0");
    expect_error("k", "decoder:\n  heads: 3\n  heads: 3\n", ":3:3: decoder.heads: duplicate key (first at 2:3)");
    expect_error("l", "decoder:\n  layers: 2\n  hidden: 64\n  heads: 3\n  ffn: 128\n  vocab: 100\n",
                 ":4:10: decoder.heads: hidden 64 is not a multiple of heads 3: give decoder.head_dim");
    expect_error("m", DEC "encoder:\n  layers: 1\n  hidden: 64\n  heads: 4\n  ffn: 64\n",
                 ":8:11: encoder.layers: an encoder needs a projector section");
    expect_error("n", DEC "projector: 5\n", ":7:12: projector: expected a mapping, got \"5\"");
    expect_error("o", DEC "  moe: {experts: 4, top_k: 5, ffn: 8}\n",
                 ":7:28: decoder.moe.top_k: must be between 1 and moe.experts 4, got 5");
    expect_error("p", DEC "  pos: learned\n", ": decoder.max_positions: learned positions need max_positions >= 1");
    expect_error("q", DEC "  image_token_id: 100\n", ":7:19: decoder.image_token_id: must be below vocab 100, got 100");
    expect_error("r", DEC "  bias: maybe\n", ":7:9: decoder.bias: expected a boolean (true or false) or a mapping, got \"maybe\"");
    expect_error("s", "[1, 2]\n", ":1:1: expected a mapping of keys at the top");
    expect_error("t", "decoder:\n  moe:\n    top_k: 1\n    top_k: 2\n", ":4:5: decoder.moe.top_k: duplicate key (first at 3:5)");
    expect_error("u", "decoder:\n  vocab: 1e3\n", ":2:10: decoder.vocab: expected an integer, got \"1e3\"");

    /* `bias: true` is short for all three biases; a name defaults to the file name. */
    const char *path = write_preset("shorthand", DEC "  bias: true\n");
    model_shape m;
    hearth_err err = { { 0 } };
    assert_int_equal(preset_load(&m, path, &err), 0);
    assert_true(m.decoder.s.bias_qkv && m.decoder.s.bias_proj && m.decoder.s.bias_mlp);
    assert_string_equal(m.name, "shorthand");
    assert_int_equal(m.decoder.s.kv_heads, 4);
    assert_int_equal(m.decoder.s.head_dim, 16);
    assert_false(m.encoder.present);

    /* Lookup by name through $HEARTH_MODELS; a missing name lists where it looked. */
    char *old = getenv("HEARTH_MODELS") ? strdup(getenv("HEARTH_MODELS")) : NULL;
    setenv("HEARTH_MODELS", tmpdir, 1);
    assert_int_equal(preset_load(&m, "shorthand", &err), 0);
    assert_string_equal(m.name, "shorthand");
    assert_int_equal(preset_load(&m, "no-such-preset", &err), HERR_CONFIG);
    char want[600];
    snprintf(want, sizeof want, "preset \"no-such-preset\" not found (searched: %s, ", tmpdir);
    if (strncmp(err.msg, want, strlen(want)) != 0)
        fail_msg("'%s' does not start with '%s'", err.msg, want);
    assert_non_null(strstr(err.msg, "./contrib/models)"));
    if (old) {
        setenv("HEARTH_MODELS", old, 1);
        free(old);
    } else {
        unsetenv("HEARTH_MODELS");
    }
    assert_int_equal(preset_load(&m, "/nonexistent/x.yaml", &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "preset file \"/nonexistent/x.yaml\" cannot be read"));
}

/* Breaking one consistency property of a valid shape makes shape_validate name it. */
static void test_validate(void **state)
{
    (void)state;
    tu_rng r = tu_rng_fresh();
    for (int iter = 0; iter < 200; iter++) {
        model_shape m = load(tu_randint(&r, 0, 2) ? "tiny-vlm-moe" : "qwen2.5-vl-3b");
        int moe = m.decoder.moe_experts > 0;
        const char *key = NULL;
        switch (tu_randint(&r, 0, 12)) {
        case 0: m.decoder.s.kv_heads = m.decoder.s.heads + 1; key = "decoder.kv_heads"; break;
        case 1: m.encoder.s.head_dim += 4; key = "encoder.head_dim"; break;
        case 2: m.decoder.s.mrope_section[tu_randint(&r, 0, 3)] += tu_randint(&r, 1, 5);
                key = "decoder.mrope_section"; break;
        case 3: m.encoder.s.pos = POS_MROPE; key = "encoder.pos"; break;
        case 4: m.decoder.s.pos = POS_ROPE2D; key = "decoder.pos"; break;
        case 5: m.encoder.window_px += 1; key = "encoder.window_px"; break;
        case 6: m.encoder.full_attn[0] = m.encoder.s.layers; key = "encoder.full_attn"; break;
        case 7: m.decoder.image_token_id = m.decoder.vocab + tu_randint(&r, 0, 9);
                key = "decoder.image_token_id"; break;
        case 8: m.decoder.image_token_id = -1; key = "decoder.image_token_id"; break;
        case 9: if (moe) { m.decoder.moe_top_k = m.decoder.moe_experts + 1; key = "decoder.moe.top_k"; }
                else { m.decoder.moe_shared_ffn = 64; key = "decoder.moe.shared_ffn"; } break;
        case 10: m.decoder.s.heads = 0; key = "decoder.heads"; break;
        default: m.projector.present = 0; key = "encoder.layers"; break;
        }
        hearth_err err = { { 0 } };
        assert_int_equal(shape_validate(&m, &err), HERR_CONFIG);
        char prefix[80];
        snprintf(prefix, sizeof prefix, "%s: ", key);
        if (strncmp(err.msg, prefix, strlen(prefix)) != 0)
            fail_msg("expected '%s...', got '%s' (seed %llu)", prefix, err.msg,
                     (unsigned long long)r.seed);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_load),
        cmocka_unit_test(test_published_counts),
        cmocka_unit_test(test_random_counts),
        cmocka_unit_test(test_flops),
        cmocka_unit_test_setup_teardown(test_preset_errors, setup_tmp, teardown_tmp),
        cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests_name("shape_presets", tests, NULL, NULL);
}
