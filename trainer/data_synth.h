/* data_synth.h - a deterministic synthetic vision-language data set with a learnable task.
 *
 * Every sample is a pure function of (seed, sample index): no hidden state, bitwise
 * reproducible, so a run can be replayed or sharded over ranks by index alone.
 *
 * One sample is one sequence of seq_len tokens:
 *
 *   BOS  text  [image tokens] SEP class-seq  text  [image tokens] SEP class-seq  text ...
 *
 * - Each image has a hidden class c (SYNTH_CLASSES of them).  Its pixels are a
 *   class-dependent mean colour per channel plus uniform noise, so c can be read from the
 *   image and from nothing else.
 * - Right after an image's placeholder tokens come a SEP token and the image's class
 *   sequence: SYNTH_CLASS_LEN symbols c*L, c*L+1, ... (see below).  SEP predicts the
 *   first one, which only the image tells; the others follow from the previous token.
 * - Text segments start at a random symbol k of SYNTH_TEXT_SYMBOLS and continue with
 *   k' = (SYNTH_TEXT_MUL * k + SYNTH_TEXT_ADD) mod SYNTH_TEXT_SYMBOLS: predictable from the
 *   previous token.
 * - targets[i] = tokens[i+1] where that token is predictable from what precedes it,
 *   else -1: at every image token (like Qwen's labels), before a segment's random
 *   start, before an image, and at the last position.  Image-conditioned targets: one per
 *   image (at SEP); everything else is learnable from the previous token.
 *
 * Symbols map to token ids 0, 1, 2, ... skipping the decoder's image_token_id:
 *   symbol 0 = BOS, 1 = SEP, 2 .. 1 + C*L = class sequences, then the text symbols.
 *
 * Images: the count is uniform in [images_min, images_max]; each side is drawn uniformly
 * in [image_px_min, image_px_max] pixels and rounded to the nearest multiple of
 * patch*spatial_merge (at least one), height and width independently (non-square images
 * happen).  An image is a still: grid_t = 1 and every patch repeats the frame
 * temporal_patch times, as Qwen2-VL does.
 * Images that do not fit in seq_len are shrunk to the smallest size, then dropped (never
 * below images_min; the parameters are checked so that images_min always fit).
 * Pixels are packed in Qwen2-VL's order (see model.h's vlm_batch). */
#ifndef HEARTH_DATA_SYNTH_H
#define HEARTH_DATA_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "shape/err.h"
#include "shape/run_config.h"

#define SYNTH_CLASSES 16
#define SYNTH_CLASS_LEN 4
#define SYNTH_TEXT_SYMBOLS 32
#define SYNTH_TEXT_MUL 5
#define SYNTH_TEXT_ADD 3
#define SYNTH_SYM_BOS 0
#define SYNTH_SYM_SEP 1
#define SYNTH_CLASS_FIRST 2
#define SYNTH_TEXT_FIRST (SYNTH_CLASS_FIRST + SYNTH_CLASSES * SYNTH_CLASS_LEN)
#define SYNTH_SYMBOLS (SYNTH_TEXT_FIRST + SYNTH_TEXT_SYMBOLS)

typedef struct {
    uint64_t seed;
    int seq_len;
    int images_min, images_max;     /* 0 and 0 when the model has no encoder */
    int px_min, px_max;
    int vocab, image_token_id;
    int in_channels, patch, temporal_patch, merge;
} synth_params;

/* The sample geometry of a config without the synthetic generator's checks (seed,
 * seq_len, vocab, image token, and the encoder's channels, patch, temporal patch and
 * merge when the model has an encoder; image counts and sizes 0).  Any source of samples
 * shares it (data_shards.h). */
void synth_params_geometry(synth_params *p, const run_config *c);

/* Takes the data and shape fields of a resolved config and checks that samples can be
 * made: vocab large enough for the symbols, images_min smallest images fit in seq_len.
 * Errors are HERR_CONFIG with a message naming the key. */
int synth_params_from_config(synth_params *p, const run_config *c, hearth_err *err);

/* A micro batch: n_seq samples, buffers grown on demand and owned here. */
typedef struct {
    int n_seq, seq_len;
    int *tokens, *targets;          /* [n_seq * seq_len] */
    int n_images;
    int *grid_thw;                  /* [n_images * 3] */
    int *image_class;               /* [n_images]: the hidden class, for tests */
    float *pixels;                  /* [n_patches * patch_dim] */
    size_t n_patches, patch_dim;
    long n_targets;                 /* positions with targets != -1 */
    size_t cap_tokens, cap_images, cap_pixels;
    float *scratch;                 /* one image in [C][H][W] before patchifying */
    size_t cap_scratch;
} synth_batch;

/* Makes room for n_tokens tokens and targets, n_images grids and image classes,
 * n_pixels floats of pixels and n_scratch floats of scratch; contents are kept.  For
 * other sources that fill a synth_batch (data_shards.h). */
int synth_batch_reserve(synth_batch *b, size_t n_tokens, size_t n_images, size_t n_pixels,
                        size_t n_scratch, hearth_err *err);

/* Fills b with samples first_index .. first_index + n_samples - 1. */
int synth_fill(synth_batch *b, const synth_params *p, uint64_t first_index, int n_samples,
               hearth_err *err);
/* A view of b for model_forward_backward; valid while b is unchanged. */
vlm_batch synth_view(const synth_batch *b);
void synth_batch_free(synth_batch *b);

/* Cuts one still frame [C][H][W] (H = gh*P, W = gw*P) into patches in Qwen2-VL's order,
 * (h/m, w/m, m_h, m_w), each [C, T, P, P] with the frame repeated T times:
 * out [gh*gw, C*T*P*P]. */
void synth_patchify(float *out, const float *frame, int C, int gh, int gw, int P, int T,
                    int m);

/* Token id of a symbol (skips image_token_id). */
int synth_token(const synth_params *p, int symbol);
/* The class a colour mean belongs to: the inverse of the pixel rule, for tests. */
int synth_class_of_means(const float *channel_means, int channels);

#endif
