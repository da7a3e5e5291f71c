#include "data_synth.h"

#include <stdlib.h>
#include <string.h>

/* Per-channel colour levels; class c takes levels (c & 3), (c >> 2) & 3 and
 * ((c & 3) + (c >> 2)) & 3 for its three channels, so (channel 0, channel 1) alone already
 * tell the 16 classes apart.  Noise is uniform in [-NOISE, NOISE]: per pixel it hides
 * the class, over a patch it averages out. */
static const float level[4] = { -0.75f, -0.25f, 0.25f, 0.75f };
#define NOISE 0.5f

/* Text before an image and text segments: random lengths in these ranges. */
#define PRE_TEXT_MIN 1
#define PRE_TEXT_MAX 4
#define SEG_MIN 2
#define SEG_MAX 8

/* ---- a tiny counter-based PRNG (splitmix64) ----------------------------------------
 * Integer arithmetic only, so samples are bitwise identical on every machine. */
typedef struct {
    uint64_t s;
} srng;

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t srng_next(srng *r)
{
    r->s += 0x9e3779b97f4a7c15ULL;
    return mix64(r->s);
}

/* Uniform in [0, n) (n > 0); the modulo bias is below 2^-32 for the small n used here. */
static int srng_below(srng *r, int n)
{
    return (int)(srng_next(r) % (uint64_t)n);
}

/* Uniform in [-1, 1) from 24 random bits: exact in float. */
static float srng_sym(srng *r)
{
    return (float)(int32_t)(srng_next(r) >> 40) / 8388608.0f - 1.0f;
}

static srng srng_for_sample(uint64_t seed, uint64_t index)
{
    srng r = { mix64(seed ^ 0x6a09e667f3bcc909ULL) ^ mix64(index + 0x3c6ef372fe94f82bULL) };
    return r;
}

/* ---- parameters --------------------------------------------------------------------- */

static int unit_px(const synth_params *p)
{
    return p->patch * p->merge;
}

/* A side of px pixels in merge units, rounded to the nearest (at least one). */
static int px_to_units(const synth_params *p, int px)
{
    int u = unit_px(p);
    int g = (px + u / 2) / u;
    return g < 1 ? 1 : g;
}

static int units_min(const synth_params *p)
{
    return px_to_units(p, p->px_min);
}

/* Tokens one image block takes at the least: one text token, the image, SEP, class seq. */
static int min_block(const synth_params *p)
{
    int g = units_min(p);
    return PRE_TEXT_MIN + g * g + 1 + SYNTH_CLASS_LEN;
}

void synth_params_geometry(synth_params *p, const run_config *c)
{
    memset(p, 0, sizeof *p);
    p->seed = c->train.seed;
    p->seq_len = c->train.seq_len;
    p->vocab = c->model.decoder.vocab;
    p->image_token_id = c->model.decoder.image_token_id;
    if (c->model.encoder.present) {
        p->in_channels = c->model.encoder.in_channels;
        p->patch = c->model.encoder.patch;
        p->temporal_patch = c->model.encoder.temporal_patch;
        p->merge = c->model.encoder.spatial_merge;
    }
}

int synth_params_from_config(synth_params *p, const run_config *c, hearth_err *err)
{
    synth_params_geometry(p, c);
    if (c->model.encoder.present) {
        p->images_min = c->data.images_min;
        p->images_max = c->data.images_max;
        p->px_min = c->data.image_px_min;
        p->px_max = c->data.image_px_max;
    }
    if (p->seq_len < 2)
        return herr_set(err, HERR_CONFIG, "train.seq_len: the synthetic data needs at least "
                        "2 tokens per sequence, got %d", p->seq_len);
    int need_vocab = SYNTH_SYMBOLS +
                     (p->image_token_id >= 0 && p->image_token_id <= SYNTH_SYMBOLS ? 1 : 0);
    if (p->vocab < need_vocab)
        return herr_set(err, HERR_CONFIG, "decoder.vocab: the synthetic data needs %d token "
                        "ids, the model has %d", need_vocab, p->vocab);
    if (!c->model.encoder.present)
        return 0;
    if (p->images_min < 0 || p->images_max < p->images_min)
        return herr_set(err, HERR_CONFIG, "data.images_min: need 0 <= images_min <= "
                        "images_max, got %d and %d", p->images_min, p->images_max);
    if (p->px_min < 1 || p->px_max < p->px_min)
        return herr_set(err, HERR_CONFIG, "data.image_px_min: need 1 <= image_px_min <= "
                        "image_px_max, got %d and %d", p->px_min, p->px_max);
    if (p->in_channels < 1 || p->patch < 1 || p->temporal_patch < 1 || p->merge < 1)
        return herr_set(err, HERR_CONFIG, "encoder: in_channels, patch, temporal_patch and "
                        "spatial_merge must be positive");
    long need = 1 + (long)p->images_min * min_block(p);
    if (need > p->seq_len) {
        int s = units_min(p) * unit_px(p);
        return herr_set(err, HERR_CONFIG, "data.images_min: %d images of at least %dx%d px "
                        "need %ld tokens with their text, more than train.seq_len %d",
                        p->images_min, s, s, need, p->seq_len);
    }
    return 0;
}

int synth_token(const synth_params *p, int symbol)
{
    return symbol >= p->image_token_id && p->image_token_id >= 0 ? symbol + 1 : symbol;
}

int synth_class_of_means(const float *m, int channels)
{
    if (channels < 2)
        return -1;
    int l[2];
    for (int ch = 0; ch < 2; ch++) {
        int best = 0;
        for (int k = 1; k < 4; k++) {
            float dk = m[ch] - level[k], db = m[ch] - level[best];
            if (dk * dk < db * db)
                best = k;
        }
        l[ch] = best;
    }
    return l[0] | (l[1] << 2);
}

/* ---- buffers ------------------------------------------------------------------------ */

static int grow(void **buf, size_t *cap, size_t need, size_t elem, hearth_err *err)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*buf, n * elem);
    if (!q)
        return herr_set(err, HERR_NOMEM, "synthetic data: out of memory (%zu bytes)",
                        n * elem);
    *buf = q;
    *cap = n;
    return 0;
}

int synth_batch_reserve(synth_batch *b, size_t n_tokens, size_t n_images, size_t n_pixels,
                        size_t n_scratch, hearth_err *err)
{
    size_t cap = b->cap_tokens;
    int rc = grow((void **)&b->tokens, &cap, n_tokens, sizeof(int), err);
    if (!rc && cap != b->cap_tokens) {      /* targets follow tokens' capacity */
        int *q = realloc(b->targets, cap * sizeof(int));
        if (!q)
            return herr_set(err, HERR_NOMEM, "data: out of memory");
        b->targets = q;
        b->cap_tokens = cap;
    }
    size_t icap = b->cap_images;
    if (!rc)
        rc = grow((void **)&b->grid_thw, &icap, n_images, 3 * sizeof(int), err);
    if (!rc && icap != b->cap_images) {     /* image_class follows grid_thw's capacity */
        int *q = realloc(b->image_class, icap * sizeof(int));
        if (!q)
            return herr_set(err, HERR_NOMEM, "data: out of memory");
        b->image_class = q;
        b->cap_images = icap;
    }
    if (!rc)
        rc = grow((void **)&b->pixels, &b->cap_pixels, n_pixels, sizeof(float), err);
    if (!rc)
        rc = grow((void **)&b->scratch, &b->cap_scratch, n_scratch, sizeof(float), err);
    return rc;
}

void synth_batch_free(synth_batch *b)
{
    if (!b)
        return;
    free(b->tokens);
    free(b->targets);
    free(b->grid_thw);
    free(b->image_class);
    free(b->pixels);
    free(b->scratch);
    memset(b, 0, sizeof *b);
}

vlm_batch synth_view(const synth_batch *b)
{
    vlm_batch v = {
        .n_seq = b->n_seq, .seq_len = b->seq_len,
        .tokens = b->tokens, .targets = b->targets,
        .n_images = b->n_images, .grid_thw = b->grid_thw, .pixels = b->pixels,
    };
    return v;
}

/* ---- one sample ------------------------------------------------------------------------ */

void synth_patchify(float *out, const float *frame, int C, int gh, int gw, int P, int T,
                    int m)
{
    int H = gh * P, W = gw * P;
    for (int bh = 0; bh < gh / m; bh++)
        for (int bw = 0; bw < gw / m; bw++)
            for (int mh = 0; mh < m; mh++)
                for (int mw = 0; mw < m; mw++) {
                    int row = bh * m + mh, col = bw * m + mw;
                    for (int ch = 0; ch < C; ch++)
                        for (int t = 0; t < T; t++)
                            for (int py = 0; py < P; py++) {
                                const float *src = frame + (size_t)ch * H * W +
                                                   (size_t)(row * P + py) * W + (size_t)col * P;
                                memcpy(out, src, (size_t)P * sizeof(float));
                                out += P;
                            }
                }
}

/* Appends one image of class c, gh x gw patches, to the batch's pixels: the frame in
 * [C][H][W], then patches in Qwen2-VL's (t, h/m, w/m, m_h, m_w) order, each
 * [C, temporal_patch, patch, patch] with the frame repeated in time. */
static int add_image(synth_batch *b, const synth_params *p, srng *r, int c, int gh, int gw,
                     hearth_err *err)
{
    int P = p->patch, T = p->temporal_patch, C = p->in_channels, m = p->merge;
    int H = gh * P, W = gw * P;
    size_t frame = (size_t)C * H * W;
    size_t patches = (size_t)gh * gw;
    int rc;
    if ((rc = grow((void **)&b->scratch, &b->cap_scratch, frame, sizeof(float), err)) ||
        (rc = grow((void **)&b->pixels, &b->cap_pixels,
                   (b->n_patches + patches) * b->patch_dim, sizeof(float), err)))
        return rc;
    for (int ch = 0; ch < C; ch++) {
        int lv = ch == 0 ? (c & 3) : ch == 1 ? ((c >> 2) & 3) : (((c & 3) + (c >> 2) + ch - 2) & 3);
        float mean = level[lv];
        float *f = b->scratch + (size_t)ch * H * W;
        for (size_t i = 0; i < (size_t)H * W; i++)
            f[i] = mean + NOISE * srng_sym(r);
    }
    synth_patchify(b->pixels + b->n_patches * b->patch_dim, b->scratch, C, gh, gw, P, T, m);
    b->n_patches += patches;
    return 0;
}

/* Writes a text segment of len tokens at tok[pos..]; marks its start unpredictable. */
static void put_text(const synth_params *p, srng *r, int *tok, unsigned char *pred, int pos,
                     int len)
{
    int k = srng_below(r, SYNTH_TEXT_SYMBOLS);
    for (int i = 0; i < len; i++) {
        tok[pos + i] = synth_token(p, SYNTH_TEXT_FIRST + k);
        pred[pos + i] = i > 0;
        k = (SYNTH_TEXT_MUL * k + SYNTH_TEXT_ADD) % SYNTH_TEXT_SYMBOLS;
    }
}

static int fill_sample(synth_batch *b, const synth_params *p, uint64_t index, int *tok,
                       int *tgt, unsigned char *pred, hearth_err *err)
{
    srng r = srng_for_sample(p->seed, index);
    const int S = p->seq_len;
    int n_img = p->images_min + srng_below(&r, p->images_max - p->images_min + 1);
    int pos = 0;
    tok[pos] = synth_token(p, SYNTH_SYM_BOS);
    pred[pos++] = 0;
    for (int i = 0; i < n_img; i++) {
        int reserve = i < p->images_min - 1 ? (p->images_min - 1 - i) * min_block(p) : 0;
        int avail = S - pos - reserve;
        int span = p->px_max - p->px_min + 1;
        int uh = px_to_units(p, p->px_min + srng_below(&r, span));
        int uw = px_to_units(p, p->px_min + srng_below(&r, span));
        int c = srng_below(&r, SYNTH_CLASSES);
        int pre = PRE_TEXT_MIN + srng_below(&r, PRE_TEXT_MAX - PRE_TEXT_MIN + 1);
        if (pre + uh * uw + 1 + SYNTH_CLASS_LEN > avail) {
            pre = PRE_TEXT_MIN;
            uh = uw = units_min(p);
            if (min_block(p) > avail)
                break;      /* only optional images get here (checked at setup) */
        }
        put_text(p, &r, tok, pred, pos, pre);
        pos += pre;
        for (int k = 0; k < uh * uw; k++) {
            tok[pos] = p->image_token_id;
            pred[pos++] = 0;
        }
        tok[pos] = synth_token(p, SYNTH_SYM_SEP);
        pred[pos++] = 0;
        for (int j = 0; j < SYNTH_CLASS_LEN; j++) {
            tok[pos] = synth_token(p, SYNTH_CLASS_FIRST + c * SYNTH_CLASS_LEN + j);
            pred[pos++] = 1;
        }
        size_t old_cap = b->cap_images;
        int rc = grow((void **)&b->grid_thw, &b->cap_images, (size_t)b->n_images + 1,
                      3 * sizeof(int), err);
        if (rc)
            return rc;
        if (b->cap_images != old_cap) {   /* image_class follows grid_thw's capacity */
            int *q = realloc(b->image_class, b->cap_images * sizeof(int));
            if (!q) {
                b->cap_images = old_cap;
                return herr_set(err, HERR_NOMEM, "synthetic data: out of memory");
            }
            b->image_class = q;
        }
        int *g = b->grid_thw + 3 * b->n_images;
        g[0] = 1;
        g[1] = uh * p->merge;
        g[2] = uw * p->merge;
        b->image_class[b->n_images++] = c;
        if ((rc = add_image(b, p, &r, c, g[1], g[2], err)))
            return rc;
    }
    while (pos < S) {
        int len = SEG_MIN + srng_below(&r, SEG_MAX - SEG_MIN + 1);
        if (len > S - pos)
            len = S - pos;
        put_text(p, &r, tok, pred, pos, len);
        pos += len;
    }
    for (int i = 0; i < S; i++) {
        tgt[i] = i + 1 < S && pred[i + 1] ? tok[i + 1] : -1;
        b->n_targets += tgt[i] != -1;
    }
    return 0;
}

int synth_fill(synth_batch *b, const synth_params *p, uint64_t first_index, int n_samples,
               hearth_err *err)
{
    if (n_samples < 1 || p->seq_len < 2)
        return herr_set(err, HERR_RUNTIME, "synthetic data: bad batch request (%d samples "
                        "of %d tokens)", n_samples, p->seq_len);
    size_t n = (size_t)n_samples * p->seq_len;
    size_t cap = b->cap_tokens;
    int rc = grow((void **)&b->tokens, &cap, n, sizeof(int), err);
    if (!rc) {
        int *q = realloc(b->targets, cap * sizeof(int));
        if (!q)
            return herr_set(err, HERR_NOMEM, "synthetic data: out of memory");
        b->targets = q;
        b->cap_tokens = cap;
    }
    if (rc)
        return rc;
    unsigned char *pred = malloc((size_t)p->seq_len);
    if (!pred)
        return herr_set(err, HERR_NOMEM, "synthetic data: out of memory");
    b->n_seq = n_samples;
    b->seq_len = p->seq_len;
    b->n_images = 0;
    b->n_patches = 0;
    b->n_targets = 0;
    b->patch_dim = (size_t)p->in_channels * p->temporal_patch * p->patch * p->patch;
    for (int s = 0; s < n_samples && !rc; s++)
        rc = fill_sample(b, p, first_index + (uint64_t)s, b->tokens + (size_t)s * p->seq_len,
                         b->targets + (size_t)s * p->seq_len, pred, err);
    free(pred);
    return rc;
}
