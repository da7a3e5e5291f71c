/* test_data_shards.c - data set preparation (trainer/prep) and the shard reader
 * (data_shards.h): a random data set of PNG and JPEG images and token records is
 * prepared and read back; tokens, targets, grids and pixels are checked against an
 * independent reference (direct 2-D resampling, normalisation, patch order); the shuffle,
 * rank shares, truncation, and every class of bad input.
 *
 * Fresh random inputs each run; the seed is printed (HEARTH_TEST_SEED replays it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <jpeglib.h>
#include <math.h>
#include <png.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_shards.h"
#include "data_source.h"
#include "prep/prep.h"
#include "shard_format.h"
#include "support/runcfg.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

#define MIN_PX 256L                 /* 16 x 16: one merge unit of tiny-vlm */
#define MAX_PX 2304L                /* 48 x 48 */

typedef struct {
    tu_rng rng;
    char dir[256];
    model_shape m;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->rng = tu_rng_fresh_noted();
    assert_int_equal(tu_tmpdir_make(f->dir, sizeof f->dir, "shards"), 0);
    hearth_err err;
    assert_int_equal(preset_load(&f->m, "tiny-vlm", &err), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tu_tmpdir_remove(f->dir);
    free(f);
    return 0;
}

/* ---- writing inputs ------------------------------------------------------------------ */

static void write_png(const char *path, int h, int w, const uint8_t *rgb)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)w;
    img.height = (png_uint_32)h;
    img.format = PNG_FORMAT_RGB;
    assert_true(png_image_write_to_file(&img, path, 0, rgb, 0, NULL));
}

static void write_jpeg(const char *path, int h, int w, const uint8_t *rgb)
{
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr jerr;
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    c.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, fp);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)c.next_scanline * w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(fp);
}

/* The test's own decode of a JPEG it wrote (libjpeg, no shared code with prep). */
static uint8_t *read_jpeg(const char *path, int *h, int *w)
{
    struct jpeg_decompress_struct c;
    struct jpeg_error_mgr jerr;
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    c.err = jpeg_std_error(&jerr);
    jpeg_create_decompress(&c);
    jpeg_stdio_src(&c, fp);
    jpeg_read_header(&c, TRUE);
    c.out_color_space = JCS_RGB;
    jpeg_start_decompress(&c);
    *h = (int)c.output_height;
    *w = (int)c.output_width;
    uint8_t *px = malloc((size_t)*h * *w * 3);
    while (c.output_scanline < c.output_height) {
        JSAMPROW row = px + (size_t)c.output_scanline * *w * 3;
        jpeg_read_scanlines(&c, &row, 1);
    }
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    fclose(fp);
    return px;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *p = malloc(*n + 1);
    assert_int_equal(fread(p, 1, *n, fp), *n);
    fclose(fp);
    return p;
}

/* ---- the random data set ----------------------------------------------------------- */

#define MAX_IMGS 3
typedef struct {
    int n_tokens;
    int tokens[64];                 /* with one placeholder per image */
    int n_images;
    char path[MAX_IMGS][512];
    int jpeg[MAX_IMGS];
    int h[MAX_IMGS], w[MAX_IMGS];
    uint8_t *px[MAX_IMGS];          /* the decoded source pixels */
} rec_t;

static void rec_free(rec_t *r, int n)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < r[i].n_images; k++)
            free(r[i].px[k]);
}

/* An image side: sometimes already a multiple of 16 inside the bounds (prep must copy it
 * exactly), else anything from 6 to 70 pixels. */
static void random_size(tu_rng *g, int *h, int *w)
{
    if (tu_randint(g, 0, 3) == 0) {
        *h = 16 * tu_randint(g, 1, 4);
        *w = 16 * tu_randint(g, 1, 4);
        while ((long)*h * *w > MAX_PX || (long)*h * *w < MIN_PX)
            *w = 16;
    } else {
        *h = tu_randint(g, 6, 71);
        *w = tu_randint(g, 6, 71);
    }
}

/* Writes n random records over two JSONL files (the second in a subdirectory, so image
 * paths resolve against their own file) into f->dir/in; returns the JSONL paths. */
static void make_dataset(fixture *f, rec_t *recs, int n, char jsonl[2][512])
{
    char in[300], sub[300];
    snprintf(in, sizeof in, "%s/in", f->dir);
    snprintf(sub, sizeof sub, "%s/in/sub", f->dir);
    mkdir(in, 0777);
    mkdir(sub, 0777);
    snprintf(jsonl[0], 512, "%s/a.jsonl", in);
    snprintf(jsonl[1], 512, "%s/b.jsonl", sub);
    FILE *fp[2] = { fopen(jsonl[0], "w"), fopen(jsonl[1], "w") };
    assert_non_null(fp[0]);
    assert_non_null(fp[1]);
    int itok = f->m.decoder.image_token_id, vocab = f->m.decoder.vocab;
    for (int i = 0; i < n; i++) {
        rec_t *r = &recs[i];
        memset(r, 0, sizeof *r);
        int file = i < n / 2 ? 0 : 1;
        r->n_images = tu_randint(&f->rng, 0, MAX_IMGS + 1);
        int text = tu_randint(&f->rng, 3, 20);
        int slot[MAX_IMGS];
        for (int k = 0; k < r->n_images; k++)
            slot[k] = tu_randint(&f->rng, 0, text + 1);
        /* placeholders at sorted slots among the text tokens */
        for (int a = 0; a < r->n_images; a++)
            for (int b = a + 1; b < r->n_images; b++)
                if (slot[b] < slot[a]) {
                    int t = slot[a];
                    slot[a] = slot[b];
                    slot[b] = t;
                }
        int k = 0;
        for (int t = 0; t <= text; t++) {
            while (k < r->n_images && slot[k] == t) {
                r->tokens[r->n_tokens++] = itok;
                k++;
            }
            if (t < text) {
                int v = tu_randint(&f->rng, 0, vocab - 1);   /* never the image token */
                r->tokens[r->n_tokens++] = v;
            }
        }
        fprintf(fp[file], "{\"tokens\": [");
        for (int t = 0; t < r->n_tokens; t++)
            fprintf(fp[file], "%s%d", t ? ", " : "", r->tokens[t]);
        fprintf(fp[file], "], \"images\": [");
        for (int j = 0; j < r->n_images; j++) {
            char name[64];
            r->jpeg[j] = tu_randint(&f->rng, 0, 2);
            snprintf(name, sizeof name, "img%d_%d.%s", i, j, r->jpeg[j] ? "jpg" : "png");
            snprintf(r->path[j], sizeof r->path[j], "%s/%s", file ? sub : in, name);
            random_size(&f->rng, &r->h[j], &r->w[j]);
            size_t np = (size_t)r->h[j] * r->w[j] * 3;
            uint8_t *px = malloc(np);
            /* smooth gradients plus noise: resampling has something to average */
            for (int y = 0; y < r->h[j]; y++)
                for (int x = 0; x < r->w[j]; x++)
                    for (int c = 0; c < 3; c++)
                        px[((size_t)y * r->w[j] + x) * 3 + c] =
                            (uint8_t)((x * 7 + y * 5 + c * 60 + tu_randint(&f->rng, 0, 40)) & 255);
            if (r->jpeg[j]) {
                write_jpeg(r->path[j], r->h[j], r->w[j], px);
                free(px);
                px = read_jpeg(r->path[j], &r->h[j], &r->w[j]);
            } else {
                write_png(r->path[j], r->h[j], r->w[j], px);
            }
            r->px[j] = px;
            fprintf(fp[file], "%s\"%s\"", j ? ", " : "", name);
        }
        fprintf(fp[file], "]}\n");
    }
    fclose(fp[0]);
    fclose(fp[1]);
}

static int run_prep(fixture *f, char jsonl[2][512], int n_in, const char *out, long per_shard,
                    int jobs, hearth_err *err)
{
    const char *inputs[2] = { jsonl[0], jsonl[1] };
    prep_opts o = { .inputs = inputs, .n_inputs = n_in, .out_dir = out,
                    .shard_records = per_shard, .jobs = jobs, .min_pixels = MIN_PX,
                    .max_pixels = MAX_PX };
    return prep_run(&o, &f->m, err);
}

static void shard_config(run_config *c, const char *dir, int seq_len, uint64_t seed)
{
    runcfg_list l;
    runcfg_init(&l);
    char path[600], seq[64];
    snprintf(path, sizeof path, "data.path=%s", dir);
    snprintf(seq, sizeof seq, "train.seq_len=%d", seq_len);
    runcfg_add(&l, "data.kind=shards", NULL);
    runcfg_add(&l, path, NULL);
    runcfg_add(&l, seq, NULL);
    runcfg_add_seed(&l, seed);
    hearth_err err;
    int rc = runcfg_parse(c, "model: tiny-vlm\n", &l, 1, &err);
    if (rc)
        fail_msg("config: %s", err.msg);
}

/* ---- the independent reference ------------------------------------------------------- */

static double tri(double x)
{
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Antialiased bilinear resampling written directly in 2-D and double: each output pixel
 * is the normalised triangle-weighted sum over every input pixel. */
static void ref_resize(const uint8_t *src, int h, int w, double *dst, int oh, int ow)
{
    double sy = (double)h / oh, sx = (double)w / ow;
    double fy = sy > 1 ? sy : 1, fx = sx > 1 ? sx : 1;
    for (int y = 0; y < oh; y++)
        for (int x = 0; x < ow; x++) {
            double cy = (y + 0.5) * sy, cx = (x + 0.5) * sx, acc[3] = { 0, 0, 0 }, ws = 0;
            for (int iy = 0; iy < h; iy++) {
                double wy = tri((iy + 0.5 - cy) / fy);
                if (wy == 0)
                    continue;
                for (int ix = 0; ix < w; ix++) {
                    double wx = tri((ix + 0.5 - cx) / fx);
                    if (wx == 0)
                        continue;
                    for (int c = 0; c < 3; c++)
                        acc[c] += wy * wx * src[((size_t)iy * w + ix) * 3 + c];
                    ws += wy * wx;
                }
            }
            for (int c = 0; c < 3; c++)
                dst[((size_t)y * ow + x) * 3 + c] = acc[c] / ws;
        }
}

/* Expected grid of an image (smart_resize is checked against Qwen2-VL's numbers in
 * test_smart_resize). */
static void ref_grid(int h, int w, int *oh, int *ow)
{
    hearth_err err;
    assert_int_equal(prep_smart_resize(h, w, 16, MIN_PX, MAX_PX, oh, ow, &err), 0);
}

/* Checks sample `s` of batch b (tokens, targets, its images from image index *img and
 * patch *patch on) against record r; seq_len S is large enough for the whole record. */
static void check_sample(const fixture *f, const synth_batch *b, int s, const rec_t *r,
                         int *img, size_t *patch)
{
    const int S = b->seq_len, P = f->m.encoder.patch, T = f->m.encoder.temporal_patch;
    const int m = f->m.encoder.spatial_merge, itok = f->m.decoder.image_token_id;
    const float mean[3] = DATA_CLIP_MEAN, stdv[3] = DATA_CLIP_STD;
    const int *tok = b->tokens + (size_t)s * S, *tgt = b->targets + (size_t)s * S;
    int pos = 0, k = 0;
    for (int t = 0; t < r->n_tokens; t++) {
        if (r->tokens[t] != itok) {
            assert_int_equal(tok[pos++], r->tokens[t]);
            continue;
        }
        int oh, ow;
        ref_grid(r->h[k], r->w[k], &oh, &ow);
        int gh = oh / P, gw = ow / P;
        const int *g = b->grid_thw + 3 * *img;
        assert_int_equal(g[0], 1);
        assert_int_equal(g[1], gh);
        assert_int_equal(g[2], gw);
        for (int q = 0; q < gh * gw / (m * m); q++)
            assert_int_equal(tok[pos++], itok);
        /* pixels: reference resize, normalise, Qwen2-VL patch order */
        double *rs = malloc((size_t)oh * ow * 3 * sizeof *rs);
        int exact = oh == r->h[k] && ow == r->w[k];
        ref_resize(r->px[k], r->h[k], r->w[k], rs, oh, ow);
        size_t pd = b->patch_dim;
        double worst = 0;
        long mism = 0, total = 0;
        for (int bh = 0; bh < gh / m; bh++)
            for (int bw = 0; bw < gw / m; bw++)
                for (int mh = 0; mh < m; mh++)
                    for (int mw = 0; mw < m; mw++) {
                        size_t pi = *patch + (size_t)((bh * (gw / m) + bw) * m + mh) * m + mw;
                        const float *pp = b->pixels + pi * pd;
                        for (int c = 0; c < 3; c++)
                            for (int tt = 0; tt < T; tt++)
                                for (int py = 0; py < P; py++)
                                    for (int px = 0; px < P; px++) {
                                        int y = (bh * m + mh) * P + py;
                                        int x = (bw * m + mw) * P + px;
                                        double v = rs[((size_t)y * ow + x) * 3 + c];
                                        float want = ((float)(exact ? v : floor(v + 0.5)) /
                                                          255.0f - mean[c]) / stdv[c];
                                        float got = pp[((c * T + tt) * P + py) * P + px];
                                        double d = fabs((double)got - want);
                                        if (exact && got != want)
                                            fail_msg("image %d: lossless pixel (%d,%d,%d) "
                                                     "differs: %g vs %g (seed %llu)", k, y,
                                                     x, c, got, want,
                                                     (unsigned long long)f->rng.seed);
                                        worst = d > worst ? d : worst;
                                        mism += d > 1e-5;
                                        total++;
                                    }
                    }
        free(rs);
        /* one level of 8-bit rounding (float vs double filter sums) at most */
        TU_ASSERT_LE(worst, 1.01 / 255.0 / 0.26, &f->rng, "resized pixels vs reference");
        /* and that only where the float and double sums round differently: a few percent
         * of random pixels (seen: 3%), never the half a wrong rounding rule gives */
        TU_ASSERT_LE((double)mism, total / 10.0 + 2, &f->rng, "pixels off by one level");
        *patch += (size_t)gh * gw;
        (*img)++;
        k++;
    }
    for (int i = pos; i < S; i++)
        assert_int_equal(tok[i], 0);   /* pad_token_id */
    for (int i = 0; i < S; i++) {
        int want = i + 1 < pos && tok[i + 1] != itok ? tok[i + 1] : -1;
        assert_int_equal(tgt[i], want);
    }
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_roundtrip(void **state)
{
    fixture *f = *state;
    enum { N = 14 };
    rec_t recs[N];
    char jsonl[2][512], out[512], out1[512];
    make_dataset(f, recs, N, jsonl);
    snprintf(out, sizeof out, "%s/out", f->dir);
    snprintf(out1, sizeof out1, "%s/out1", f->dir);
    hearth_err err;
    if (run_prep(f, jsonl, 2, out, 5, 3, &err))
        fail_msg("prep: %s", err.msg);
    if (run_prep(f, jsonl, 2, out1, 5, 1, &err))
        fail_msg("prep: %s", err.msg);
    /* the same bytes whatever the number of jobs */
    for (int k = 0; k < 3; k++) {
        char a[600], b[600], name[64];
        shard_file_name(name, sizeof name, k);
        snprintf(a, sizeof a, "%s/%s", out, name);
        snprintf(b, sizeof b, "%s/%s", out1, name);
        size_t na, nb;
        unsigned char *pa = read_file(a, &na), *pb = read_file(b, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(pa, pb, na);
        free(pa);
        free(pb);
    }
    shard_manifest man;
    assert_int_equal(shard_manifest_read(&man, out, &err), 0);
    assert_int_equal(man.n_shards, 3);
    assert_int_equal(man.records, N);
    assert_int_equal(man.shards[2].records, N - 10);
    shard_manifest_free(&man);

    run_config cfg;
    shard_config(&cfg, out, 256, tu_next(&f->rng) >> 2);
    data_source *src;
    if (data_source_create(&src, &cfg, &err))
        fail_msg("open: %s", err.msg);
    synth_batch b;
    memset(&b, 0, sizeof b);
    /* a whole epoch in two batches: every record once, each matching its input */
    int seen[N] = { 0 };
    data_shards *ds;
    if (data_shards_open(&ds, &cfg, &err))
        fail_msg("open: %s", err.msg);
    for (int part = 0; part < 2; part++) {
        if (data_source_fill(src, &b, (uint64_t)part * 7, 7, &err))
            fail_msg("fill: %s", err.msg);
        int img = 0;
        size_t patch = 0;
        long targets = 0;
        for (int s = 0; s < 7; s++) {
            int r = (int)data_shards_record_of(ds, (uint64_t)part * 7 + (uint64_t)s);
            seen[r]++;
            check_sample(f, &b, s, &recs[r], &img, &patch);
        }
        for (int i = 0; i < 7 * 256; i++)
            targets += b.targets[i] != -1;
        assert_int_equal(b.n_targets, targets);
        assert_int_equal(b.n_images, img);
        assert_int_equal(b.n_patches, patch);
    }
    for (int r = 0; r < N; r++)
        assert_int_equal(seen[r], 1);
    data_shards_close(ds);
    synth_batch_free(&b);
    data_source_free(src);
    rec_free(recs, N);
}

static void test_smart_resize(void **state)
{
    (void)state;
    /* Qwen2-VL's smart_resize (factor 28, 56*56 .. 28*28*1280) and small-factor cases,
     * worked out with its Python code; (24, 40) checks rounding half to even. */
    static const int cases[][7] = {
        { 1080, 1920, 28, 3136, 1003520, 728, 1316 },
        { 42, 42, 28, 3136, 1003520, 56, 56 },
        { 70, 14, 28, 3136, 1003520, 140, 28 },
        { 20, 30, 28, 3136, 1003520, 56, 84 },
        { 3000, 100, 28, 3136, 1003520, 2996, 112 },
        { 24, 40, 16, 256, 2304, 32, 32 },
        { 8, 8, 16, 256, 2304, 16, 16 },
        { 100, 70, 16, 256, 2304, 48, 32 },
    };
    hearth_err err;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int oh, ow;
        assert_int_equal(prep_smart_resize(cases[i][0], cases[i][1], cases[i][2], cases[i][3],
                                           cases[i][4], &oh, &ow, &err), 0);
        assert_int_equal(oh, cases[i][5]);
        assert_int_equal(ow, cases[i][6]);
    }
    int oh, ow;
    assert_int_equal(prep_smart_resize(10, 2500, 28, 3136, 1003520, &oh, &ow, &err),
                     HERR_CONFIG);
    assert_non_null(strstr(err.msg, "aspect ratio"));
}

static void test_shuffle(void **state)
{
    fixture *f = *state;
    static const uint64_t sizes[] = { 1, 2, 3, 7, 64, 100, 1000 };
    uint64_t seed = tu_next(&f->rng);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint64_t n = sizes[s];
        char *hit = calloc(n, 1);
        int moved = 0, differs_epoch = 0, differs_seed = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t r = data_shards_permute(seed, 3, n, i);
            assert_true(r < n);
            assert_int_equal(hit[r], 0);     /* every record once per epoch */
            hit[r] = 1;
            assert_int_equal(data_shards_permute(seed, 3, n, i), r);   /* pure */
            moved += r != i;
            differs_epoch += data_shards_permute(seed, 4, n, i) != r;
            differs_seed += data_shards_permute(seed + 1, 3, n, i) != r;
        }
        free(hit);
        if (n >= 64) {   /* a real shuffle, new every epoch and seed */
            assert_true(moved > (int)n / 2);
            assert_true(differs_epoch > (int)n / 2);
            assert_true(differs_seed > (int)n / 2);
        }
    }
}

static void test_rank_shares(void **state)
{
    fixture *f = *state;
    for (int trial = 0; trial < 20; trial++) {
        int dp = tu_randint(&f->rng, 1, 5), per = tu_randint(&f->rng, 1, 4);
        int mb = tu_randint(&f->rng, 1, 4), gb = dp * per * mb;
        int step = tu_randint(&f->rng, 0, 100);
        char *hit = calloc((size_t)gb, 1);
        for (int d = 0; d < dp; d++)
            for (int j = 0; j < per; j++) {
                uint64_t first = data_source_first(step, gb, mb, per, d, j);
                for (int s = 0; s < mb; s++) {
                    uint64_t i = first + (uint64_t)s;
                    assert_true(i >= (uint64_t)step * gb && i < (uint64_t)(step + 1) * gb);
                    assert_int_equal(hit[i - (uint64_t)step * gb], 0);   /* disjoint */
                    hit[i - (uint64_t)step * gb] = 1;
                }
            }
        for (int i = 0; i < gb; i++)
            assert_int_equal(hit[i], 1);                                  /* covering */
        free(hit);
    }
}

/* A record too long for seq_len: cut before the image that does not fit. */
static void test_truncation(void **state)
{
    fixture *f = *state;
    char jsonl[2][512], out[512], img[512];
    snprintf(jsonl[0], 512, "%s/t.jsonl", f->dir);
    snprintf(img, sizeof img, "%s/i.png", f->dir);
    snprintf(out, sizeof out, "%s/out", f->dir);
    uint8_t px[32 * 32 * 3];
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (uint8_t)tu_randint(&f->rng, 0, 256);
    write_png(img, 32, 32, px);                  /* 4 x 4 patches: 4 tokens */
    /* 5 text, image (4), 3 text, image (4), 2 text */
    tu_write_text(jsonl[0], "{\"tokens\": [1,2,3,4,5,1023,6,7,8,1023,9,10], "
                            "\"images\": [\"i.png\", \"i.png\"]}\n");
    hearth_err err;
    if (run_prep(f, jsonl, 1, out, 0, 2, &err))
        fail_msg("prep: %s", err.msg);
    static const int I = 1023, full[18] = { 1, 2, 3, 4, 5, I, I, I, I, 6, 7, 8, I, I, I, I,
                                            9, 10 };
    static const struct { int seq, tokens, images; } cases[] = {
        { 20, 18, 2 }, { 18, 18, 2 }, { 17, 17, 2 }, { 16, 16, 2 }, { 15, 12, 1 },
        { 12, 12, 1 }, { 11, 11, 1 }, { 9, 9, 1 }, { 8, 5, 0 }, { 6, 5, 0 }, { 4, 4, 0 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        run_config cfg;
        shard_config(&cfg, out, cases[c].seq, 1);
        data_source *src;
        if (data_source_create(&src, &cfg, &err))
            fail_msg("open: %s", err.msg);
        synth_batch b;
        memset(&b, 0, sizeof b);
        if (data_source_fill(src, &b, 0, 1, &err))
            fail_msg("fill: %s", err.msg);
        assert_int_equal(b.n_images, cases[c].images);
        for (int i = 0; i < cases[c].tokens; i++)
            assert_int_equal(b.tokens[i], full[i]);
        for (int i = cases[c].tokens; i < cases[c].seq; i++) {
            assert_int_equal(b.tokens[i], 0);
            assert_int_equal(b.targets[i], -1);
        }
        assert_int_equal(b.targets[cases[c].tokens - 1], -1);
        assert_int_equal(b.n_patches, 16 * cases[c].images);
        synth_batch_free(&b);
        data_source_free(src);
    }
}

/* Lists the regular files in dir (names into a buffer); the count. */
static int files_in(const char *dir, char *names, size_t size)
{
    DIR *d = opendir(dir);
    int n = 0;
    names[0] = '\0';
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))) {
            strncat(names, e->d_name, size - strlen(names) - 2);
            strcat(names, " ");
            n++;
        }
    closedir(d);
    return n;
}

/* Every class of bad input fails naming the file and line, and leaves nothing behind
 * even when earlier shards were complete (one record per shard, the bad one last). */
static void test_bad_input(void **state)
{
    fixture *f = *state;
    char good[512], trunc_png[512], trunc_jpg[512];
    snprintf(good, sizeof good, "%s/good.png", f->dir);
    snprintf(trunc_png, sizeof trunc_png, "%s/bad.png", f->dir);
    snprintf(trunc_jpg, sizeof trunc_jpg, "%s/bad.jpg", f->dir);
    uint8_t px[40 * 24 * 3];
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (uint8_t)tu_randint(&f->rng, 0, 256);
    write_png(good, 24, 40, px);
    size_t n;
    unsigned char *bytes = read_file(good, &n);
    write_file(trunc_png, bytes, n * 2 / 3);
    free(bytes);
    write_jpeg(trunc_jpg, 24, 40, px);
    bytes = read_file(trunc_jpg, &n);
    write_file(trunc_jpg, bytes, n / 2);
    free(bytes);
    const char *ok = "{\"tokens\": [1, 1023, 2], \"images\": [\"good.png\"]}\n";
    static const struct { const char *line, *want; } cases[] = {
        { "{\"tokens\": [1, 1023, 2], \"images\": [\"bad.png\"]}", "bad.png: bad PNG" },
        { "{\"tokens\": [1, 1023, 2], \"images\": [\"bad.jpg\"]}", "bad.jpg: bad JPEG" },
        { "{\"tokens\": [1, 1023, 2], \"images\": [\"none.png\"]}", "none.png: cannot open" },
        { "{\"tokens\": [1, 1024, 2], \"images\": []}", "outside the model's vocabulary" },
        { "{\"tokens\": [1, 1023, 1023], \"images\": [\"good.png\"]}", "2 image placeholder" },
        { "{\"tokens\": [1, 2], \"images\": [\"good.png\"]}", "0 image placeholder" },
        { "{\"tokens\": [1, 2], \"images\": [}", "bad JSON" },
        { "[1, 2]", "expected a JSON object" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char jsonl[2][512], out[512], text[1024], want[600];
        snprintf(jsonl[0], 512, "%s/in%zu.jsonl", f->dir, c);
        snprintf(out, sizeof out, "%s/out%zu", f->dir, c);
        snprintf(text, sizeof text, "%s%s%s\n", ok, ok, cases[c].line);
        tu_write_text(jsonl[0], text);
        hearth_err err = { { 0 } };
        int rc = run_prep(f, jsonl, 1, out, 1, 2, &err);
        assert_int_not_equal(rc, 0);
        snprintf(want, sizeof want, "%s:3", jsonl[0]);
        if (!strstr(err.msg, want) || !strstr(err.msg, cases[c].want))
            fail_msg("case %zu: message \"%s\" lacks \"%s\" or \"%s\"", c, err.msg, want,
                     cases[c].want);
        char names[1024];
        if (files_in(out, names, sizeof names))
            fail_msg("case %zu: left behind: %s", c, names);
    }
}

/* A prepared set with a damaged shard or a model it was not made for: clear errors. */
static void test_bad_shards(void **state)
{
    fixture *f = *state;
    char jsonl[2][512], out[512], shard[600], img[512];
    snprintf(jsonl[0], 512, "%s/r.jsonl", f->dir);
    snprintf(img, sizeof img, "%s/i.png", f->dir);
    snprintf(out, sizeof out, "%s/out", f->dir);
    snprintf(shard, sizeof shard, "%s/shard-00000.bin", out);
    uint8_t px[16 * 16 * 3] = { 0 };
    write_png(img, 16, 16, px);
    tu_write_text(jsonl[0], "{\"tokens\": [5, 1023, 6, 7], \"images\": [\"i.png\"]}\n"
                            "{\"tokens\": [8, 9, 10]}\n");
    hearth_err err;
    if (run_prep(f, jsonl, 1, out, 0, 1, &err))
        fail_msg("prep: %s", err.msg);
    size_t n;
    unsigned char *orig = read_file(shard, &n);
    run_config cfg;
    data_shards *d = NULL;

    /* the model differs from the manifest */
    shard_config(&cfg, out, 16, 1);
    cfg.model.decoder.image_token_id = 1000;
    assert_int_equal(data_shards_open(&d, &cfg, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "manifest.json: model.image_token_id is 1023"));
    shard_config(&cfg, out, 16, 1);
    cfg.model.encoder.patch = 14;
    assert_int_equal(data_shards_open(&d, &cfg, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "model.patch"));

    /* truncated shard */
    shard_config(&cfg, out, 16, 1);
    write_file(shard, orig, n - 8);
    assert_int_not_equal(data_shards_open(&d, &cfg, &err), 0);
    assert_non_null(strstr(err.msg, shard));
    assert_non_null(strstr(err.msg, "truncated"));

    /* wrong magic (same size) */
    unsigned char *bad = malloc(n);
    memcpy(bad, orig, n);
    bad[0] = 'X';
    write_file(shard, bad, n);
    assert_int_not_equal(data_shards_open(&d, &cfg, &err), 0);
    assert_non_null(strstr(err.msg, shard));
    assert_non_null(strstr(err.msg, "wrong magic"));

    /* a token outside the vocabulary in record 1 (its first token at offset +8) */
    memcpy(bad, orig, n);
    uint64_t off1;
    shard_header h;
    assert_int_equal(shard_header_check(&h, orig, n, shard, &err), 0);
    memcpy(&off1, orig + h.index_offset + 8, 8);
    int32_t big = 5000;
    memcpy(bad + off1 + 8, &big, 4);
    write_file(shard, bad, n);
    assert_int_equal(data_shards_open(&d, &cfg, &err), 0);
    synth_batch b;
    memset(&b, 0, sizeof b);
    int failed = 0;
    for (uint64_t s = 0; s < 2; s++)
        if (data_shards_fill(d, &b, s, 1, &err)) {
            failed++;
            assert_non_null(strstr(err.msg, shard));
            assert_non_null(strstr(err.msg, "record 1: token 5000"));
        }
    assert_int_equal(failed, 1);
    synth_batch_free(&b);
    data_shards_close(d);

    /* the index damaged */
    memcpy(bad, orig, n);
    uint64_t wild = 12345;
    memcpy(bad + h.index_offset + 8, &wild, 8);
    write_file(shard, bad, n);
    assert_int_not_equal(data_shards_open(&d, &cfg, &err), 0);
    assert_non_null(strstr(err.msg, "bad shard index"));

    /* the manifest missing */
    write_file(shard, orig, n);
    char man[600];
    snprintf(man, sizeof man, "%s/manifest.json", out);
    unlink(man);
    assert_int_not_equal(data_shards_open(&d, &cfg, &err), 0);
    assert_non_null(strstr(err.msg, "manifest.json"));
    free(bad);
    free(orig);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_smart_resize, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shuffle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rank_shares, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_shards, setup, teardown),
    };
    return cmocka_run_group_tests_name("data_shards", tests, NULL, NULL);
}
