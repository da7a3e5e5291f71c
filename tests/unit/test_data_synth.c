/* test_data_synth.c - the synthetic data set: determinism, layout invariants, the task.
 *
 * Parameters are drawn fresh from a seed taken from the clock (printed, and settable with
 * HEARTH_TEST_SEED to replay a failure). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data_synth.h"
#include "support/testutil.h"

static uint64_t g_seed;
static uint64_t g_state;

static uint64_t rnd(void)
{
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int rnd_in(int lo, int hi)
{
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

/* A config with random data parameters for a Qwen-like encoder (patch 14, merge 2,
 * temporal 2), small enough that images_min always fit. */
static void random_config(run_config *c)
{
    memset(c, 0, sizeof *c);
    c->model.encoder.present = 1;
    c->model.encoder.in_channels = 3;
    c->model.encoder.patch = rnd_in(0, 1) ? 14 : 8;
    c->model.encoder.temporal_patch = rnd_in(1, 2);
    c->model.encoder.spatial_merge = rnd_in(1, 2);
    c->model.decoder.vocab = rnd_in(SYNTH_SYMBOLS + 1, 1200);
    /* sometimes inside the symbol range, to exercise the skip */
    c->model.decoder.image_token_id = rnd_in(0, 1) ? rnd_in(0, SYNTH_SYMBOLS)
                                                   : c->model.decoder.vocab - 1;
    c->train.seed = rnd();
    c->data.kind = DATA_SYNTHETIC;
    int unit = c->model.encoder.patch * c->model.encoder.spatial_merge;
    c->data.image_px_min = rnd_in(1, 2 * unit);
    c->data.image_px_max = c->data.image_px_min + rnd_in(0, 3 * unit);
    c->data.images_min = rnd_in(0, 2);
    c->data.images_max = c->data.images_min + rnd_in(0, 3);
    int g = (c->data.image_px_min + unit / 2) / unit;
    g = g < 1 ? 1 : g;
    int block = 1 + g * g + 1 + SYNTH_CLASS_LEN;
    c->train.seq_len = 1 + c->data.images_min * block + rnd_in(0, 120);
    if (c->train.seq_len < 2)
        c->train.seq_len = 2;
}

/* A random valid config and the synthesis parameters derived from it. */
static void random_params(run_config *c, synth_params *p)
{
    random_config(c);
    hearth_err err = { { 0 } };
    if (synth_params_from_config(p, c, &err)) {
        fail_msg("params rejected: %s", err.msg);
    }
}

static int setup_seed(void **state)
{
    (void)state;
    g_seed = tu_rng_fresh_noted().seed;
    g_state = g_seed;
    return 0;
}

/* memcmp that accepts empty (possibly NULL) ranges. */
static int same(const void *a, const void *b, size_t bytes)
{
    return bytes == 0 || !memcmp(a, b, bytes);
}

static int fill(synth_batch *b, const synth_params *p, uint64_t first, int n)
{
    hearth_err err = { { 0 } };
    int rc = synth_fill(b, p, first, n, &err);
    if (rc)
        print_message("# synth_fill: %s\n", err.msg);
    return rc;
}

static size_t seq_image_patches(const synth_batch *b, int from, int to)
{
    size_t n = 0;
    for (int i = from; i < to; i++)
        n += (size_t)b->grid_thw[3 * i] * b->grid_thw[3 * i + 1] * b->grid_thw[3 * i + 2];
    return n;
}

/* Same (seed, index) -> same bytes, whatever batch the sample is made in. */
static void test_deterministic(void **state)
{
    (void)state;
    for (int trial = 0; trial < 20; trial++) {
        run_config c;
        synth_params p;
        random_params(&c, &p);
        synth_batch a = { 0 }, b = { 0 }, one = { 0 };
        uint64_t first = rnd() % 1000000;
        int n = rnd_in(1, 6);
        if (fill(&a, &p, first, n) || fill(&b, &p, first, n)) {
            fail();
        }
        size_t nt = (size_t)n * p.seq_len;
        if (!same(a.tokens, b.tokens, nt * sizeof(int)) ||
            !same(a.targets, b.targets, nt * sizeof(int)) || a.n_images != b.n_images ||
            a.n_patches != b.n_patches ||
            !same(a.grid_thw, b.grid_thw, 3 * (size_t)a.n_images * sizeof(int)) ||
            !same(a.pixels, b.pixels, a.n_patches * a.patch_dim * sizeof(float))) {
            fail_msg("two fills of the same samples differ");
        }
        /* The last sample alone equals the last sample of the batch (no hidden state). */
        if (fill(&one, &p, first + (uint64_t)n - 1, 1)) {
            fail();
        }
        size_t off = (size_t)(n - 1) * p.seq_len;
        int img0 = a.n_images - one.n_images;
        size_t pat0 = a.n_patches - one.n_patches;
        if (!same(one.tokens, a.tokens + off, p.seq_len * sizeof(int)) ||
            !same(one.targets, a.targets + off, p.seq_len * sizeof(int)) || img0 < 0 ||
            (one.n_images > 0 &&
             (!same(one.grid_thw, a.grid_thw + 3 * img0, 3 * (size_t)one.n_images * sizeof(int)) ||
              !same(one.pixels, a.pixels + pat0 * a.patch_dim,
                    one.n_patches * one.patch_dim * sizeof(float))))) {
            fail_msg("sample %llu differs between batches", (unsigned long long)(first + n - 1));
        }
        synth_batch_free(&a);
        synth_batch_free(&b);
        synth_batch_free(&one);
    }
}

/* Another seed (or another index) gives other samples. */
static void test_seed_changes_data(void **state)
{
    (void)state;
    run_config c;
    random_config(&c);
    c.data.images_min = 1;
    c.data.images_max = 2;
    c.data.image_px_min = c.data.image_px_max =
        c.model.encoder.patch * c.model.encoder.spatial_merge;
    c.train.seq_len = 64;
    synth_params p, q;
    hearth_err err = { { 0 } };
    assert_int_equal(synth_params_from_config(&p, &c, &err), 0);
    c.train.seed ^= 1 + (rnd() & 0xffff);
    assert_int_equal(synth_params_from_config(&q, &c, &err), 0);
    synth_batch a = { 0 }, b = { 0 }, d = { 0 };
    uint64_t first = rnd() % 1000;
    assert_int_equal(fill(&a, &p, first, 4), 0);
    assert_int_equal(fill(&b, &q, first, 4), 0);
    assert_int_equal(fill(&d, &p, first + 4, 4), 0);
    size_t nt = 4 * (size_t)p.seq_len;
    size_t np = a.n_patches < b.n_patches ? a.n_patches : b.n_patches;
    if (same(a.tokens, b.tokens, nt * sizeof(int)) &&
        same(a.pixels, b.pixels, np * a.patch_dim * sizeof(float))) {
        fail_msg("seeds %llu and %llu give the same data", (unsigned long long)p.seed,
                 (unsigned long long)q.seed);
    }
    if (!memcmp(a.tokens, d.tokens, nt * sizeof(int))) {
        fail_msg("samples %llu.. and %llu.. are equal", (unsigned long long)first,
                 (unsigned long long)first + 4);
    }
    synth_batch_free(&a);
    synth_batch_free(&b);
    synth_batch_free(&d);
}

static int text_next(const synth_params *p, int tok)
{
    for (int k = 0; k < SYNTH_TEXT_SYMBOLS; k++)
        if (synth_token(p, SYNTH_TEXT_FIRST + k) == tok)
            return synth_token(p, SYNTH_TEXT_FIRST +
                                      (SYNTH_TEXT_MUL * k + SYNTH_TEXT_ADD) % SYNTH_TEXT_SYMBOLS);
    return -2;
}

/* Layout invariants: image token runs match the grids in order, targets are shifted
 * tokens or -1 (always -1 at image tokens), the class sequence follows each image and
 * matches the image's colour, sizes respect the config. */
static void check_layout(const run_config *c, const synth_params *p, const synth_batch *b)
{
    const int S = p->seq_len, m = p->merge;
    int unit = p->patch * m;
    int umin = (p->px_min + unit / 2) / unit, umax = (p->px_max + unit / 2) / unit;
    umin = umin < 1 ? 1 : umin;
    umax = umax < 1 ? 1 : umax;
    int img = 0;
    long targets = 0;
    for (int s = 0; s < b->n_seq; s++) {
        const int *tok = b->tokens + (size_t)s * S, *tgt = b->targets + (size_t)s * S;
        int img_first = img;
        assert_int_equal(tok[0], synth_token(p, SYNTH_SYM_BOS));
        assert_int_equal(tgt[S - 1], -1);
        for (int i = 0; i < S; i++) {
            assert_true(tok[i] >= 0 && tok[i] < c->model.decoder.vocab);
            if (tgt[i] != -1) {
                targets++;
                assert_int_equal(tgt[i], tok[i + 1]);
                assert_int_not_equal(tok[i], p->image_token_id);
                int nx = text_next(p, tok[i]);
                if (nx != -2)
                    assert_int_equal(tgt[i], nx);   /* the text rule */
            }
        }
        for (int i = 0; i < S;) {
            if (tok[i] != p->image_token_id) {
                i++;
                continue;
            }
            int run = 0;
            while (i + run < S && tok[i + run] == p->image_token_id) {
                assert_int_equal(tgt[i + run], -1);
                run++;
            }
            assert_true(img < b->n_images);
            const int *g = b->grid_thw + 3 * img;
            assert_int_equal(g[0], 1);
            assert_int_equal(g[1] % m, 0);
            assert_int_equal(g[2] % m, 0);
            assert_true(g[1] / m >= umin && g[1] / m <= umax);
            assert_true(g[2] / m >= umin && g[2] / m <= umax);
            assert_int_equal(run, g[0] * g[1] * g[2] / (m * m));
            /* SEP, then the class sequence of this image; SEP predicts the class. */
            int cls = b->image_class[img];
            int j = i + run;
            assert_true(j + SYNTH_CLASS_LEN < S);
            assert_int_equal(tok[j], synth_token(p, SYNTH_SYM_SEP));
            for (int k = 0; k < SYNTH_CLASS_LEN; k++)
                assert_int_equal(tok[j + 1 + k],
                                 synth_token(p, SYNTH_CLASS_FIRST + cls * SYNTH_CLASS_LEN + k));
            assert_int_equal(tgt[j], tok[j + 1]);
            assert_int_equal(tgt[i - 1], -1);       /* the image's start is not predictable */
            img++;
            i += run;
        }
        int n_img = img - img_first;
        assert_true(n_img >= p->images_min && n_img <= p->images_max);
    }
    assert_int_equal(img, b->n_images);
    assert_int_equal(targets, b->n_targets);
    assert_int_equal(seq_image_patches(b, 0, b->n_images), b->n_patches);
    assert_int_equal(b->patch_dim, (size_t)p->in_channels * p->temporal_patch * p->patch * p->patch);
    /* Each image's colour tells its class; frames repeat in time. */
    const float *px = b->pixels;
    for (int i = 0; i < b->n_images; i++) {
        size_t np = seq_image_patches(b, i, i + 1);
        double sum[8] = { 0 };
        int PP = p->patch * p->patch;
        for (size_t q = 0; q < np; q++, px += b->patch_dim)
            for (int ch = 0; ch < p->in_channels; ch++)
                for (int t = 0; t < p->temporal_patch; t++) {
                    const float *fr = px + ((size_t)ch * p->temporal_patch + t) * PP;
                    if (t > 0)
                        assert_memory_equal(fr, fr - PP, PP * sizeof(float));
                    for (int k = 0; k < PP; k++)
                        sum[ch] += fr[k];
                }
        float mean[8];
        for (int ch = 0; ch < p->in_channels; ch++)
            mean[ch] = (float)(sum[ch] / ((double)np * p->temporal_patch * PP));
        assert_int_equal(synth_class_of_means(mean, p->in_channels), b->image_class[i]);
    }
}

static void test_layout(void **state)
{
    (void)state;
    for (int trial = 0; trial < 40; trial++) {
        run_config c;
        synth_params p;
        random_params(&c, &p);
        synth_batch b = { 0 };
        if (fill(&b, &p, rnd() % 100000, rnd_in(1, 5))) {
            fail();
        }
        check_layout(&c, &p, &b);
        synth_batch_free(&b);
    }
}

/* Pixels follow Qwen2-VL's patch order: a frame whose pixels encode (channel, y, x) is
 * patchified, and every element is checked against the index arithmetic of the
 * processor's reshape (t, h/m, m, P, w/m, m, P) -> (t, h/m, w/m, m, m, C, T, P, P). */
static void test_patch_order(void **state)
{
    (void)state;
    for (int trial = 0; trial < 10; trial++) {
        int m = rnd_in(1, 3), P = rnd_in(1, 6), T = rnd_in(1, 3), C = rnd_in(1, 4);
        int gh = m * rnd_in(1, 4), gw = m * rnd_in(1, 4);
        int H = gh * P, W = gw * P;
        float *frame = malloc((size_t)C * H * W * sizeof(float));
        float *out = malloc((size_t)gh * gw * C * T * P * P * sizeof(float));
        assert_non_null(frame);
        assert_non_null(out);
        for (int ch = 0; ch < C; ch++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    frame[((size_t)ch * H + y) * W + x] = (float)((ch * 1000 + y) * 1000 + x);
        synth_patchify(out, frame, C, gh, gw, P, T, m);
        size_t dim = (size_t)C * T * P * P;
        for (int q = 0; q < gh * gw; q++) {
            int mw = q % m, mh = (q / m) % m, bw = (q / (m * m)) % (gw / m),
                bh = q / (m * m) / (gw / m);
            for (size_t e = 0; e < dim; e++) {
                int px = (int)(e % P), py = (int)(e / P % P), ch = (int)(e / ((size_t)P * P * T));
                int y = (bh * m + mh) * P + py, x = (bw * m + mw) * P + px;
                float want = (float)((ch * 1000 + y) * 1000 + x);
                if (out[q * dim + e] != want) {
                    fail_msg("m=%d P=%d T=%d C=%d grid %dx%d: patch %d element %zu is %g, "
                             "want %g", m, P, T, C, gh, gw, q, e, out[q * dim + e], want);
                }
            }
        }
        free(frame);
        free(out);
    }
}

/* Sizes vary over the range, non-square images happen, counts cover the range. */
static void test_sizes_vary(void **state)
{
    (void)state;
    run_config c;
    random_config(&c);
    int unit = c.model.encoder.patch * c.model.encoder.spatial_merge;
    c.data.image_px_min = unit;
    c.data.image_px_max = 4 * unit;
    c.data.images_min = 0;
    c.data.images_max = 3;
    c.train.seq_len = 400;
    synth_params p;
    hearth_err err = { { 0 } };
    assert_int_equal(synth_params_from_config(&p, &c, &err), 0);
    synth_batch b = { 0 };
    assert_int_equal(fill(&b, &p, rnd() % 100000, 64), 0);
    int seen_side[5] = { 0 }, non_square = 0, counts[4] = { 0 };
    for (int i = 0; i < b.n_images; i++) {
        int h = b.grid_thw[3 * i + 1] / p.merge, w = b.grid_thw[3 * i + 2] / p.merge;
        assert_true(h >= 1 && h <= 4 && w >= 1 && w <= 4);
        seen_side[h] = seen_side[w] = 1;
        non_square += h != w;
    }
    for (int s = 0, img = 0; s < b.n_seq; s++) {
        int n = 0;
        for (int i = 0; i < p.seq_len; i++)
            n += b.tokens[s * p.seq_len + i] == p.image_token_id &&
                 (i == 0 || b.tokens[s * p.seq_len + i - 1] != p.image_token_id);
        counts[n]++;
        img += n;
    }
    assert_true(non_square > 0);
    for (int k = 1; k <= 4; k++)
        assert_true(seen_side[k]);
    for (int k = 0; k <= 3; k++)
        assert_true(counts[k] > 0);
    synth_batch_free(&b);
}

/* Params that cannot fit are rejected with the key named; text-only models get no images. */
static void test_params_checked(void **state)
{
    (void)state;
    run_config c;
    random_config(&c);
    synth_params p;
    hearth_err err = { { 0 } };
    c.data.images_min = c.data.images_max = 3;
    c.train.seq_len = 10;
    assert_int_equal(synth_params_from_config(&p, &c, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "data.images_min"));
    random_config(&c);
    c.model.decoder.vocab = SYNTH_SYMBOLS - 1;
    assert_int_equal(synth_params_from_config(&p, &c, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "vocab"));
    random_config(&c);
    c.model.encoder.present = 0;
    c.data.images_min = 2;
    c.data.images_max = 4;
    /* random_config sizes the sequence for its own images (as short as 2 tokens without
     * them): room for text with predictable tokens, so that targets must exist */
    c.train.seq_len = 64 + rnd_in(0, 120);
    assert_int_equal(synth_params_from_config(&p, &c, &err), 0);
    synth_batch b = { 0 };
    assert_int_equal(fill(&b, &p, 7, 3), 0);
    assert_int_equal(b.n_images, 0);
    assert_int_equal(b.n_patches, 0);
    assert_true(b.n_targets > 0);
    synth_batch_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_deterministic, setup_seed),
        cmocka_unit_test_setup(test_seed_changes_data, setup_seed),
        cmocka_unit_test_setup(test_layout, setup_seed),
        cmocka_unit_test_setup(test_patch_order, setup_seed),
        cmocka_unit_test_setup(test_sizes_vary, setup_seed),
        cmocka_unit_test_setup(test_params_checked, setup_seed),
    };
    return cmocka_run_group_tests_name("data_synth", tests, NULL, NULL);
}
