/* shard_format.h - the on-disk format of a prepared data set (docs/data.md): binary shard
 * files and their JSON manifest.  Shared by the writer (trainer/prep, `hearth-prep`) and
 * the reader (data_shards.h), so the layout is defined once.
 *
 * A shard (little-endian; the build refuses big-endian hosts):
 *   header   64 bytes: magic "HRTHSHRD", u32 version, u32 channels, u64 records,
 *            u64 index_offset, u64 file_size, i32 image_token_id, i32 patch, i32 merge,
 *            zero padding
 *   records  each at an 8-aligned offset: u32 n_tokens, u32 n_images,
 *            i32 tokens[n_tokens], then per image u32 grid_h, u32 grid_w (in patches),
 *            then per image uint8 RGB pixels [grid_h*patch][grid_w*patch][channels],
 *            zero padding up to a multiple of 8 bytes
 *   index    u64 offsets[records + 1] at index_offset: record r spans
 *            [offsets[r], offsets[r+1]); offsets[records] == index_offset
 * The manifest (manifest.json beside the shards) names the model geometry the data was
 * made for and every shard with its record count, size and sha256. */
#ifndef HEARTH_SHARD_FORMAT_H
#define HEARTH_SHARD_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "shape/err.h"

#define SHARD_MAGIC "HRTHSHRD"
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 64
#define SHARD_MANIFEST_NAME "manifest.json"
#define SHARD_MANIFEST_FORMAT "hearth-shards"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the shard format is little-endian and is read in place: big-endian hosts are not supported"
#endif

typedef struct {
    uint32_t version;
    uint32_t channels;
    uint64_t n_records;
    uint64_t index_offset;
    uint64_t file_size;
    int32_t image_token_id, patch, merge;
} shard_header;

/* Writes the 64-byte header. */
void shard_header_encode(unsigned char out[SHARD_HEADER_BYTES], const shard_header *h);
/* Reads and checks a shard's header and index against the file's actual size: magic,
 * version, sizes, index offsets increasing, 8-aligned and inside the record area.
 * Errors (HERR_IO) name `path`. */
int shard_header_check(shard_header *h, const unsigned char *file, size_t size,
                       const char *path, hearth_err *err);

/* One record, pointing into the mapped (or written) shard. */
typedef struct {
    uint32_t n_tokens, n_images;
    const int32_t *tokens;          /* [n_tokens] */
    const uint32_t *grids;          /* [n_images * 2]: grid_h, grid_w in patches */
    const uint8_t *pixels;          /* every image's pixels, one after the other */
} shard_record;

/* Bytes of a record with these counts and grids (padding included). */
size_t shard_record_bytes(uint32_t n_tokens, uint32_t n_images, const uint32_t *grids,
                          int patch, int channels);
/* Parses record `index` of a checked shard: its counts and grids must fill exactly its
 * index span (HERR_IO naming path and record otherwise). */
int shard_record_get(shard_record *r, const unsigned char *file, const shard_header *h,
                     uint64_t index, const char *path, hearth_err *err);

/* ---- manifest ------------------------------------------------------------------------ */
typedef struct {
    char file[64];                  /* name inside the data directory */
    uint64_t records;
    uint64_t bytes;
    char sha256[65];
} shard_entry;

typedef struct {
    int vocab, image_token_id, patch, merge, channels;
    int pad_token_id;               /* token that pads short records */
    long min_pixels, max_pixels;    /* the resize bounds prep used */
    char resample[32];              /* the resampling filter prep used */
    uint64_t records;
    int n_shards;
    shard_entry *shards;            /* [n_shards], owned (shard_manifest_free) */
} shard_manifest;

/* Writes DIR/manifest.json atomically (temp file, fsync, rename). */
int shard_manifest_write(const char *dir, const shard_manifest *m, hearth_err *err);
/* Reads DIR/manifest.json; errors name the file and the key.  Free with
 * shard_manifest_free (also after an error). */
int shard_manifest_read(shard_manifest *m, const char *dir, hearth_err *err);
void shard_manifest_free(shard_manifest *m);

/* Shard file name of shard number k ("shard-00000.bin"). */
void shard_file_name(char *buf, size_t size, int k);

#endif
