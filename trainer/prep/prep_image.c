/* prep_image.c - decoding (libpng, libjpeg-turbo), smart_resize and resampling. */
#include "prep/prep.h"

#include <errno.h>
#include <jpeglib.h>
#include <math.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Larger images are refused before their pixels are allocated. */
#define PREP_MAX_IMAGE_PIXELS (1L << 28)

static int check_dims(long h, long w, const char *name, hearth_err *err)
{
    if (h < 1 || w < 1 || h * w > PREP_MAX_IMAGE_PIXELS)
        return herr_set(err, HERR_CONFIG, "%s: image size %ldx%ld is out of range", name, w,
                        h);
    return 0;
}

static int decode_png(prep_image *out, const unsigned char *data, size_t len,
                      const char *name, hearth_err *err)
{
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, data, len))
        return herr_set(err, HERR_CONFIG, "%s: bad PNG: %s", name, img.message);
    int rc = check_dims(img.height, img.width, name, err);
    if (rc) {
        png_image_free(&img);
        return rc;
    }
    /* RGBA, then alpha dropped: the colour values as stored, as PIL's convert("RGB"). */
    img.format = PNG_FORMAT_RGBA;
    size_t n = (size_t)img.width * img.height;
    uint8_t *rgba = malloc(n * 4), *rgb = malloc(n * 3);
    if (!rgba || !rgb) {
        png_image_free(&img);
        free(rgba);
        free(rgb);
        return herr_set(err, HERR_NOMEM, "%s: out of memory", name);
    }
    if (!png_image_finish_read(&img, NULL, rgba, 0, NULL)) {
        rc = herr_set(err, HERR_CONFIG, "%s: bad PNG: %s", name, img.message);
        free(rgba);
        free(rgb);
        return rc;
    }
    for (size_t i = 0; i < n; i++)
        memcpy(rgb + 3 * i, rgba + 4 * i, 3);
    free(rgba);
    out->h = (int)img.height;
    out->w = (int)img.width;
    out->px = rgb;
    return 0;
}

/* libjpeg reports errors through a callback that must not return: jump back. */
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err_ctx;

static void jpeg_fail(j_common_ptr cinfo)
{
    jpeg_err_ctx *e = (jpeg_err_ctx *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jump, 1);
}

/* Warnings (level -1) are damaged data ("Premature end of JPEG file", "Corrupt JPEG
 * data"): libjpeg would fill in grey and go on; a data set must not. */
static void jpeg_message(j_common_ptr cinfo, int level)
{
    if (level < 0)
        jpeg_fail(cinfo);
}

static int decode_jpeg(prep_image *out, const unsigned char *data, size_t len,
                       const char *name, hearth_err *err)
{
    struct jpeg_decompress_struct cinfo;
    jpeg_err_ctx je;
    /* volatile: changed between setjmp and a longjmp back to it */
    uint8_t *volatile rgb = NULL;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jpeg_fail;
    je.pub.emit_message = jpeg_message;
    if (setjmp(je.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(rgb);
        return herr_set(err, HERR_CONFIG, "%s: bad JPEG: %s", name, je.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;
    int rc = check_dims(cinfo.image_height, cinfo.image_width, name, err);
    if (rc) {
        jpeg_destroy_decompress(&cinfo);
        return rc;
    }
    jpeg_start_decompress(&cinfo);
    size_t stride = (size_t)cinfo.output_width * 3;
    rgb = malloc(stride * cinfo.output_height);
    if (!rgb) {
        jpeg_destroy_decompress(&cinfo);
        return herr_set(err, HERR_NOMEM, "%s: out of memory", name);
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = rgb + stride * cinfo.output_scanline;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    out->h = (int)cinfo.output_height;
    out->w = (int)cinfo.output_width;
    out->px = rgb;
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

int prep_image_decode(prep_image *out, const unsigned char *data, size_t len,
                      const char *name, hearth_err *err)
{
    static const unsigned char png_sig[8] = { 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n' };
    memset(out, 0, sizeof *out);
    if (len >= 8 && memcmp(data, png_sig, 8) == 0)
        return decode_png(out, data, len, name, err);
    if (len >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
        return decode_jpeg(out, data, len, name, err);
    return herr_set(err, HERR_CONFIG, "%s: neither a PNG nor a JPEG file", name);
}

int prep_image_load(prep_image *out, const char *path, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return herr_set(err, HERR_CONFIG, "%s: cannot open image: %s", path, strerror(errno));
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? 2 * cap : 1 << 16;
            unsigned char *q = realloc(buf, ncap);
            if (!q) {
                rc = herr_set(err, HERR_NOMEM, "%s: out of memory", path);
                break;
            }
            buf = q;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                rc = herr_set(err, HERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (!rc)
        rc = prep_image_decode(out, buf, len, path, err);
    free(buf);
    return rc;
}

/* ---- smart_resize ------------------------------------------------------------------- */

int prep_smart_resize(int h, int w, int factor, long min_pixels, long max_pixels, int *oh,
                      int *ow, hearth_err *err)
{
    if (h < 1 || w < 1 || factor < 1)
        return herr_set(err, HERR_CONFIG, "image size %dx%d: nothing to resize", w, h);
    double big = h > w ? h : w, small = h > w ? w : h;
    if (big / small > 200)
        return herr_set(err, HERR_CONFIG, "image size %dx%d: aspect ratio above 200", w, h);
    if ((long)factor * factor > max_pixels)
        return herr_set(err, HERR_CONFIG, "max_pixels %ld is below one %dx%d unit",
                        max_pixels, factor, factor);
    /* Python's round() is half to even, as is nearbyint in the default rounding mode. */
    double f = factor;
    long hb = (long)nearbyint(h / f) * factor, wb = (long)nearbyint(w / f) * factor;
    if (hb < factor)
        hb = factor;
    if (wb < factor)
        wb = factor;
    if (hb * wb > max_pixels) {
        double beta = sqrt((double)h * w / (double)max_pixels);
        hb = (long)floor(h / beta / f) * factor;
        wb = (long)floor(w / beta / f) * factor;
        if (hb < factor)
            hb = factor;
        if (wb < factor)
            wb = factor;
    } else if (hb * wb < min_pixels) {
        double beta = sqrt((double)min_pixels / ((double)h * w));
        hb = (long)ceil(h * beta / f) * factor;
        wb = (long)ceil(w * beta / f) * factor;
    }
    if (hb * wb > max_pixels || hb > 65536 || wb > 65536)
        return herr_set(err, HERR_CONFIG, "image size %dx%d: no multiple of %d fits in "
                        "[%ld, %ld] pixels", w, h, factor, min_pixels, max_pixels);
    *oh = (int)hb;
    *ow = (int)wb;
    return 0;
}

/* ---- resampling ------------------------------------------------------------------------ */

/* Per output index: the first input index, the tap count and normalised weights
 * (taps at most ksize), as PIL's precompute_coeffs does for its triangle filter. */
typedef struct {
    int *first, *count;
    float *w;                       /* [out][ksize] */
    int ksize;
} taps;

static int taps_make(taps *t, int in, int out)
{
    double scale = (double)in / out;
    double fscale = scale > 1.0 ? scale : 1.0;
    double support = fscale;        /* the triangle's support is 1, widened by the scale */
    t->ksize = (int)ceil(support) * 2 + 1;
    t->first = malloc((size_t)out * sizeof(int));
    t->count = malloc((size_t)out * sizeof(int));
    t->w = calloc((size_t)out * t->ksize, sizeof(float));
    if (!t->first || !t->count || !t->w)
        return -1;
    for (int i = 0; i < out; i++) {
        double center = (i + 0.5) * scale;
        int lo = (int)floor(center - support + 0.5), hi = (int)floor(center + support + 0.5);
        if (lo < 0)
            lo = 0;
        if (hi > in)
            hi = in;
        int n = hi - lo;
        if (n > t->ksize)
            n = t->ksize;
        double sum = 0.0;
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < n; j++) {
                double x = (j + lo - center + 0.5) / fscale;
                double v = 1.0 - fabs(x);
                v = v > 0.0 ? v : 0.0;
                if (pass == 0)
                    sum += v;
                else
                    t->w[(size_t)i * t->ksize + j] = (float)(sum > 0.0 ? v / sum : 0.0);
            }
        t->first[i] = lo;
        t->count[i] = n;
    }
    return 0;
}

static void taps_free(taps *t)
{
    free(t->first);
    free(t->count);
    free(t->w);
}

int prep_resize(const uint8_t *src, int h, int w, uint8_t *dst, int oh, int ow,
                hearth_err *err)
{
    if (h == oh && w == ow) {
        memcpy(dst, src, (size_t)h * w * 3);
        return 0;
    }
    int rc = 0;
    taps th = { 0 }, tv = { 0 };
    float *mid = malloc((size_t)h * ow * 3 * sizeof(float));
    if (!mid || taps_make(&th, w, ow) || taps_make(&tv, h, oh)) {
        rc = herr_set(err, HERR_NOMEM, "resize %dx%d -> %dx%d: out of memory", w, h, ow, oh);
        goto out;
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < ow; x++) {
            const float *wt = th.w + (size_t)x * th.ksize;
            const uint8_t *s = src + ((size_t)y * w + th.first[x]) * 3;
            float acc[3] = { 0, 0, 0 };
            for (int k = 0; k < th.count[x]; k++)
                for (int c = 0; c < 3; c++)
                    acc[c] += wt[k] * s[3 * k + c];
            memcpy(mid + ((size_t)y * ow + x) * 3, acc, sizeof acc);
        }
    for (int y = 0; y < oh; y++) {
        const float *wt = tv.w + (size_t)y * tv.ksize;
        for (int x = 0; x < ow; x++) {
            float acc[3] = { 0, 0, 0 };
            for (int k = 0; k < tv.count[y]; k++) {
                const float *m = mid + ((size_t)(tv.first[y] + k) * ow + x) * 3;
                for (int c = 0; c < 3; c++)
                    acc[c] += wt[k] * m[c];
            }
            for (int c = 0; c < 3; c++) {
                float v = floorf(acc[c] + 0.5f);
                dst[((size_t)y * ow + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
out:
    taps_free(&th);
    taps_free(&tv);
    free(mid);
    return rc;
}
