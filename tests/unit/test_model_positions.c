/* test_model_positions.c - decoder mRoPE positions and the ViT window index.
 *
 * mRoPE: hand-worked cases (text-image-text, adjacent images with t > 1, an image at the
 * start, several sequences sharing the image cursor) and the errors.  Window index: a
 * hand-worked non-divisible grid, and random grids against a literal transcription of
 * Qwen2.5-VL's get_window_index (padding with -100, the (t, nh, ws, nw, ws) -> (t, nh,
 * nw, ws, ws) permutation, unique_consecutive of the boundaries). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "model/model.h"
#include "support/testutil.h"

#define I 99 /* image token id in these cases */

static void expect_pos(const int *tokens, int S, const int *grids, int n_images,
                       const int *want_t, const int *want_h, const int *want_w, int cursor0,
                       int cursor1)
{
    int *pos = tu_ialloc((size_t)3 * S);
    int cursor = cursor0;
    hearth_err err;
    int rc = model_mrope_positions(pos, tokens, S, I, grids, n_images, 2, &cursor, &err);
    if (rc)
        fail_msg("model_mrope_positions: %s", err.msg);
    for (int i = 0; i < S; i++) {
        if (pos[i] != want_t[i] || pos[S + i] != want_h[i] || pos[2 * S + i] != want_w[i])
            fail_msg("position %d: got (t,h,w) = (%d,%d,%d), want (%d,%d,%d)", i, pos[i],
                     pos[S + i], pos[2 * S + i], want_t[i], want_h[i], want_w[i]);
    }
    assert_int_equal(cursor, cursor1);
    free(pos);
}

static void test_mrope_text_image_text(void **state)
{
    (void)state;
    /* grid 1x4x6 patches -> 1x2x3 merged tokens, offset 3 (after three text tokens);
     * text resumes at max(3 + 0, 3 + 1, 3 + 2) + 1 = 6 */
    static const int grid[] = { 1, 4, 6 };
    static const int tok[] = { 5, 6, 7, I, I, I, I, I, I, 8, 9 };
    static const int t[] = { 0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7 };
    static const int h[] = { 0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7 };
    static const int w[] = { 0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7 };
    expect_pos(tok, 11, grid, 1, t, h, w, 0, 1);
}

static void test_mrope_two_images_video(void **state)
{
    (void)state;
    /* A: 2x2x4 -> 2x1x2 tokens at offset 1 (t = 1,1,2,2; w = 1,2,1,2), max 2;
     * B: 1x2x2 -> one token right after A at offset 3; text resumes at 4 */
    static const int grid[] = { 2, 2, 4, 1, 2, 2 };
    static const int tok[] = { 3, I, I, I, I, I, 4 };
    static const int t[] = { 0, 1, 1, 2, 2, 3, 4 };
    static const int h[] = { 0, 1, 1, 1, 1, 3, 4 };
    static const int w[] = { 0, 1, 2, 1, 2, 3, 4 };
    expect_pos(tok, 7, grid, 2, t, h, w, 0, 2);
}

static void test_mrope_image_first_and_cursor(void **state)
{
    (void)state;
    /* Sequence 2 of a batch: its image is the batch's image 1 (cursor 1 -> 2).
     * grid 1x6x2 -> 3x1 tokens at offset 0 (h = 0,1,2), text resumes at 3. */
    static const int grid[] = { 1, 2, 2, 1, 6, 2, 1, 2, 2 };
    static const int tok[] = { I, I, I, 1, 2 };
    static const int t[] = { 0, 0, 0, 3, 4 };
    static const int h[] = { 0, 1, 2, 3, 4 };
    static const int w[] = { 0, 0, 0, 3, 4 };
    expect_pos(tok, 5, grid, 3, t, h, w, 1, 2);
    /* text only: 0 .. S-1 on every row, cursor untouched */
    static const int tok2[] = { 1, 2, 3, 4 };
    static const int r2[] = { 0, 1, 2, 3 };
    expect_pos(tok2, 4, grid, 3, r2, r2, r2, 3, 3);
}

static void expect_error(const int *tokens, int S, const int *grids, int n_images,
                         const char *what)
{
    int pos[64];
    int cursor = 0;
    hearth_err err = { { 0 } };
    int rc = model_mrope_positions(pos, tokens, S, I, grids, n_images, 2, &cursor, &err);
    if (rc >= 0)
        fail_msg("%s: no error", what);
    assert_true(err.msg[0] != 0);
}

static void test_mrope_errors(void **state)
{
    (void)state;
    static const int grid[] = { 1, 4, 4 };      /* 4 tokens */
    static const int cut[] = { 1, I, I, I };    /* runs past the end */
    expect_error(cut, 4, grid, 1, "truncated image");
    static const int gap[] = { I, I, 3, I, I }; /* interrupted run */
    expect_error(gap, 5, grid, 1, "interrupted image");
    static const int extra[] = { I, I, I, I, I }; /* a fifth image token, no image left */
    expect_error(extra, 5, grid, 1, "no image left");
    static const int odd[] = { 1, 6, 3 };       /* w not a multiple of the merge */
    static const int tok[] = { I, I, I };
    expect_error(tok, 3, odd, 1, "grid not divisible");
}

/* ---- window index ------------------------------------------------------------------- */

static void test_window_index_hand(void **state)
{
    (void)state;
    /* image 0: 6x10 patches = 3x5 units, windows of 2x2 units:
     *   [0,1,5,6] [2,3,7,8] [4,9] / [10,11] [12,13] [14]
     * image 1: t = 2 frames of 2x2 units, one window each: [15..18], [19..22] */
    static const int grid[] = { 1, 6, 10, 2, 4, 4 };
    static const int want_idx[] = { 0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14,
                                    15, 16, 17, 18, 19, 20, 21, 22 };
    static const int want_cu[] = { 0, 16, 32, 40, 48, 56, 60, 76, 92 };
    int idx[23], cu[24];
    int nw = vit_window_index(idx, cu, grid, 2, 2, 2);
    assert_int_equal(nw, 8);
    for (int i = 0; i < 23; i++)
        assert_int_equal(idx[i], want_idx[i]);
    for (int i = 0; i <= 8; i++)
        assert_int_equal(cu[i], want_cu[i]);
    /* frames: 60 patches, then 16 and 16 */
    int fr[4];
    assert_int_equal(vit_frame_seqlens(fr, grid, 2), 3);
    assert_int_equal(fr[1], 60);
    assert_int_equal(fr[2], 76);
    assert_int_equal(fr[3], 92);
    /* no windows: identity order, one window per frame */
    nw = vit_window_index(idx, cu, grid, 2, 2, 0);
    assert_int_equal(nw, 3);
    for (int i = 0; i < 23; i++)
        assert_int_equal(idx[i], i);
    for (int i = 0; i <= 3; i++)
        assert_int_equal(cu[i], fr[i]);
}

/* Qwen2.5-VL get_window_index, transcribed step by step. */
static int qwen_window_index(int *out_idx, int *out_cu, const int *grid, int n, int merge,
                             int ws)
{
    int m2 = merge * merge;
    int n_idx = 0, n_cu = 0, id0 = 0;
    int *cu = tu_ialloc(4096);
    cu[n_cu++] = 0;
    for (int i = 0; i < n; i++) {
        int gt = grid[3 * i], lh = grid[3 * i + 1] / merge, lw = grid[3 * i + 2] / merge;
        int pad_h = ws - lh % ws, pad_w = ws - lw % ws;
        int nh = (lh + pad_h) / ws, nw = (lw + pad_w) / ws;
        int Hp = lh + pad_h, Wp = lw + pad_w;
        int *padded = tu_ialloc((size_t)gt * Hp * Wp);
        for (int t = 0; t < gt; t++)
            for (int y = 0; y < Hp; y++)
                for (int x = 0; x < Wp; x++)
                    padded[(t * Hp + y) * Wp + x] =
                        y < lh && x < lw ? t * lh * lw + y * lw + x : -100;
        /* reshape (t, nh, ws, nw, ws), permute (0, 1, 3, 2, 4) */
        for (int t = 0; t < gt; t++)
            for (int a = 0; a < nh; a++)
                for (int b = 0; b < nw; b++) {
                    int cnt = 0;
                    for (int yy = 0; yy < ws; yy++)
                        for (int xx = 0; xx < ws; xx++) {
                            int v = padded[(t * Hp + a * ws + yy) * Wp + b * ws + xx];
                            if (v != -100) {
                                out_idx[n_idx++] = v + id0;
                                cnt++;
                            }
                        }
                    cu[n_cu] = cu[n_cu - 1] + cnt * m2;
                    n_cu++;
                }
        id0 += gt * lh * lw;
        free(padded);
    }
    /* unique_consecutive */
    int k = 0;
    for (int j = 0; j < n_cu; j++)
        if (j == 0 || cu[j] != cu[j - 1])
            out_cu[k++] = cu[j];
    free(cu);
    return k - 1;
}

static void test_window_index_vs_qwen(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh();
    for (int rep = 0; rep < 200; rep++) {
        int merge = tu_randint(&rng, 1, 4), ws = tu_randint(&rng, 1, 5);
        int n = tu_randint(&rng, 1, 5);
        int grid[15], units = 0;
        for (int i = 0; i < n; i++) {
            grid[3 * i] = tu_randint(&rng, 1, 4);
            grid[3 * i + 1] = merge * tu_randint(&rng, 1, 9);
            grid[3 * i + 2] = merge * tu_randint(&rng, 1, 9);
            units += grid[3 * i] * grid[3 * i + 1] * grid[3 * i + 2] / (merge * merge);
        }
        int *a = tu_ialloc((size_t)units), *b = tu_ialloc((size_t)units);
        int *ca = tu_ialloc((size_t)units + 1), *cb = tu_ialloc((size_t)units + 1);
        int na = vit_window_index(a, ca, grid, n, merge, ws);
        int nb = qwen_window_index(b, cb, grid, n, merge, ws);
        if (na != nb || memcmp(a, b, (size_t)units * sizeof(int)) ||
            memcmp(ca, cb, ((size_t)na + 1) * sizeof(int)))
            fail_msg("window index differs from Qwen's for merge %d ws %d, %d images (seed "
                     "%llu)", merge, ws, n, (unsigned long long)rng.seed);
        free(a);
        free(b);
        free(ca);
        free(cb);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mrope_text_image_text),
        cmocka_unit_test(test_mrope_two_images_video),
        cmocka_unit_test(test_mrope_image_first_and_cursor),
        cmocka_unit_test(test_mrope_errors),
        cmocka_unit_test(test_window_index_hand),
        cmocka_unit_test(test_window_index_vs_qwen),
    };
    return cmocka_run_group_tests_name("model_positions", tests, NULL, NULL);
}
