/* prep.h - data set preparation (`hearth-prep`, docs/data.md): JSONL records of tokens
 * and image paths -> shards of expanded tokens and resized RGB pixels (shard_format.h)
 * that `data.kind: shards` reads (data_shards.h).
 *
 * Input: one JSON object per line, {"tokens": [ints], "images": ["a.png", ...]}, image
 * paths relative to the JSONL file's directory; each image k stands where the k-th
 * model.decoder.image_token_id is in tokens (exactly one placeholder per image).  Prep
 * decodes each image (PNG through libpng, JPEG through libjpeg-turbo, told apart by their
 * signature), resizes it as Qwen2-VL's smart_resize decides (prep_smart_resize) with an
 * antialiased bilinear filter (prep_resize) and replaces its placeholder with
 * (grid_h/merge) * (grid_w/merge) image tokens.
 *
 * Records are processed in parallel (OpenMP, `jobs` threads) in windows and written in
 * input order, so the output is byte-identical for any number of jobs.  Shards are
 * written to temporary files, fsynced, and renamed only once every record succeeded;
 * the manifest comes last.  A failure removes every file this run wrote. */
#ifndef HEARTH_PREP_H
#define HEARTH_PREP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shape/err.h"
#include "shape/model_shape.h"

/* Qwen2-VL's image processor defaults. */
#define PREP_MIN_PIXELS_DEFAULT (56L * 56)
#define PREP_MAX_PIXELS_DEFAULT (28L * 28 * 1280)
#define PREP_SHARD_RECORDS_DEFAULT 1024
#define PREP_RESAMPLE_NAME "bilinear-antialias"

/* ---- images ------------------------------------------------------------------------ */

/* A decoded image: interleaved RGB bytes [h][w][3], owned (free(px)). */
typedef struct {
    int h, w;
    uint8_t *px;
} prep_image;

/* Decodes a PNG or JPEG file held in memory into RGB (alpha dropped, grey expanded, as
 * PIL's convert("RGB") does).  A damaged or truncated file is an error (libjpeg's
 * "corrupt data" warnings included), the message naming `name`. */
int prep_image_decode(prep_image *out, const unsigned char *data, size_t len,
                      const char *name, hearth_err *err);
/* Reads and decodes the file at path. */
int prep_image_load(prep_image *out, const char *path, hearth_err *err);

/* Qwen2-VL's smart_resize: height and width rounded (half to even) to multiples of
 * factor (at least one), then scaled down or up keeping the aspect ratio until
 * h*w lies in [min_pixels, max_pixels].  HERR_CONFIG when the aspect ratio exceeds 200
 * (Qwen2-VL's limit) or the bounds admit no size. */
int prep_smart_resize(int h, int w, int factor, long min_pixels, long max_pixels, int *oh,
                      int *ow, hearth_err *err);

/* Resamples RGB src [h][w][3] into dst [oh][ow][3] with a separable triangle (bilinear)
 * filter whose support widens with the downscale factor (antialiased, like PIL's
 * BILINEAR), pixel centres aligned (align_corners=False); both passes in float, rounded
 * once at the end.  Same size: an exact copy.  HERR_NOMEM for its filter tables. */
int prep_resize(const uint8_t *src, int h, int w, uint8_t *dst, int oh, int ow,
                hearth_err *err);

/* ---- input records -------------------------------------------------------------------- */

typedef struct {
    int file;               /* index into the inputs */
    long line;              /* 1-based line of the JSONL file */
    int32_t *tokens;        /* [n_tokens], with one placeholder per image */
    int n_tokens;
    char **images;          /* [n_images] paths, resolved against the file's directory */
    int n_images;
} prep_record;

typedef struct {
    prep_record *rec;       /* [n], owned */
    size_t n, cap;
} prep_records;

/* Appends the records of JSONL file `path` (input number file_index), checking each
 * line: a JSON object, tokens a non-empty array of ints in [0, vocab), images an array
 * of strings (may be absent), as many image_token_id placeholders as images.  Errors
 * read "PATH:LINE: what is wrong". */
int prep_read_jsonl(prep_records *rs, const char *path, int file_index, int vocab,
                    int image_token_id, hearth_err *err);
void prep_records_free(prep_records *rs);

/* ---- the whole run ------------------------------------------------------------------ */

typedef struct {
    const char *const *inputs;   /* JSONL files, in order */
    int n_inputs;
    const char *out_dir;         /* created when missing; must be empty */
    long shard_records;          /* records per shard (0: default) */
    int jobs;                    /* threads (0: one per CPU) */
    long min_pixels, max_pixels; /* 0: the defaults above */
    int pad_token_id;            /* written to the manifest for the reader */
    FILE *progress;              /* progress lines (NULL: none); one updating line when
                                    it is a terminal, else a line every few seconds */
} prep_opts;

/* Prepares the data set for model m.  On error nothing of this run is left in out_dir
 * (the directory itself stays when it was created). */
int prep_run(const prep_opts *o, const model_shape *m, hearth_err *err);

#endif
