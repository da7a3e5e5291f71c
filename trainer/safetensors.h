/* safetensors.h - reading and writing the safetensors format (Hugging Face checkpoints,
 * and the per-rank shards of hearth-train's own training checkpoints).
 *
 * Format (https://huggingface.co/docs/safetensors): 8 bytes little-endian u64 N, then N
 * bytes of JSON header {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]},
 * ..., "__metadata__": {"key": "string value", ...}}, then the data block; offsets are
 * relative to the data block, tensors are raw little-endian row-major.  The header may be
 * padded with spaces.  A sharded checkpoint is a directory with
 * model.safetensors.index.json ({"metadata": {...}, "weight_map": {"name": "file"}}) and
 * the files it names; an unsharded one holds model.safetensors.
 *
 * Reading maps the file (mmap): tensors are views into the mapping, valid until the file
 * or set is closed.  Tensor data may be unaligned (it follows a header of any length):
 * read it with memcpy or st_tensor_to_f32.  Every header is validated before use, as
 * strictly as the reference implementation: offsets inside the data block, tensors
 * tiling it without overlap, gap or trailing bytes, sizes equal to dtype size * shape
 * (no overflow), known dtypes, names unique, metadata values strings, header at most
 * 100 MB.  A file that cannot be opened or mapped is HERR_IO; a malformed one is
 * HERR_CONFIG; either message names the file and, where one is at fault, the tensor.
 *
 * Writing: a writer collects tensors (borrowed or converted copies), then writes the file
 * atomically (PATH.tmp, fsync, rename; nothing is left behind on failure). */
#ifndef HEARTH_SAFETENSORS_H
#define HEARTH_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "shape/err.h"

#define ST_MAX_DIMS 8
#define ST_NAME_MAX 256

typedef enum {
    ST_F32,
    ST_BF16,
    ST_F16,
    ST_F64,
    ST_I64,
    ST_I32,
    ST_U8,
    ST_I8,
    ST_BOOL,
    ST_DTYPE_COUNT
} st_dtype;

/* "F32", "BF16", ...; NULL for an invalid value. */
const char *st_dtype_name(st_dtype d);
/* Bytes per element; 0 for an invalid value. */
size_t st_dtype_size(st_dtype d);

/* Scalar conversions (values as little-endian bit patterns).  fp32 -> F16 rounds to
 * nearest, ties to even, overflowing to infinity; NaN stays a (quiet) NaN.  F16 -> fp32
 * is exact, subnormals included.  BF16: kcpu_bf16_encode / kcpu_bf16_decode (kernels.h). */
uint16_t st_f32_to_f16(float x);
float st_f16_to_f32(uint16_t h);

typedef struct {
    char name[ST_NAME_MAX];
    st_dtype dtype;
    int ndim;                   /* 0 = scalar */
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    const void *data;           /* view into the mapped file */
    size_t nbytes;
} st_tensor;

/* ---- reading one file ---- */
typedef struct st_file st_file;

/* Maps and validates path.  *out is NULL on error. */
int st_file_open(st_file **out, const char *path, hearth_err *err);
/* Unmaps; every st_tensor of f becomes invalid.  NULL is fine. */
void st_file_close(st_file *f);
int st_file_count(const st_file *f);
/* Tensors in data-offset order; zero-size tensors sharing an offset in header order (so a
 * file of st_writer_write gives back the add order). */
const st_tensor *st_file_at(const st_file *f, int i);
/* NULL when absent. */
const st_tensor *st_file_find(const st_file *f, const char *name);
/* A "__metadata__" value, or NULL.  Owned by f. */
const char *st_file_metadata(const st_file *f, const char *key);

/* ---- reading a checkpoint directory (sharded or not) ---- */
typedef struct st_set st_set;

/* Opens DIR/model.safetensors.index.json and every file its weight_map names (plain
 * names inside DIR only), or else DIR/model.safetensors.  A tensor named by the index but
 * absent from its file, present in two files, or held by a file but missing from the
 * weight_map is an error naming the tensor and the files.  The index's "metadata" is not
 * checked (Hugging Face writers disagree on total_size).  *out is NULL on error. */
int st_set_open(st_set **out, const char *dir, hearth_err *err);
/* Closes every file; every st_tensor of s becomes invalid.  NULL is fine. */
void st_set_close(st_set *s);
int st_set_count(const st_set *s);
/* Files in name order (model-00001-of-... first), each in data-offset order. */
const st_tensor *st_set_at(const st_set *s, int i);
/* NULL when absent. */
const st_tensor *st_set_find(const st_set *s, const char *name);
/* A "__metadata__" value of the first file (st_writer_write_dir gives every shard the
 * same metadata), or NULL.  Owned by s. */
const char *st_set_metadata(const st_set *s, const char *key);

/* Converts t (F32, BF16, F16 or F64) to fp32 into out[n]; n must equal t->numel.
 * BF16/F16 -> fp32 is exact; F64 is rounded to nearest. */
int st_tensor_to_f32(const st_tensor *t, float *out, size_t n, hearth_err *err);

/* ---- writing ---- */
typedef struct st_writer st_writer;

int st_writer_init(st_writer **out, hearth_err *err);
/* Frees the writer and its own copies (not borrowed data).  NULL is fine. */
void st_writer_free(st_writer *w);
/* Adds a tensor whose bytes (raw little-endian) stay owned by the caller until the last
 * st_writer_write/_write_dir returns.  Names are non-empty UTF-8 below ST_NAME_MAX bytes,
 * not "__metadata__"; ndim is 0..ST_MAX_DIMS (shape may be NULL when 0), dimensions
 * >= 0.  Duplicate names, bad names or shapes and shape/nbytes mismatches are HERR_CONFIG
 * and leave the writer as it was. */
int st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim,
                  const int64_t *shape, const void *data, size_t nbytes, hearth_err *err);
/* Adds fp32 values converted to dtype (F32, BF16 round-to-nearest-even, F16); the
 * writer keeps its own copy. */
int st_writer_add_f32(st_writer *w, const char *name, st_dtype dtype, int ndim,
                      const int64_t *shape, const float *src, hearth_err *err);
/* Sets a "__metadata__" string (copied; a later call with the same key replaces it). */
int st_writer_metadata(st_writer *w, const char *key, const char *value, hearth_err *err);
/* Tensors are written in the order they were added, the header padded so that the data
 * block starts 8-aligned.  PATH.tmp is written, fsynced and renamed to PATH, then the
 * directory is fsynced; on failure PATH.tmp is removed and PATH is untouched.  The writer
 * may be written more than once. */
int st_writer_write(st_writer *w, const char *path, hearth_err *err);
/* Writes DIR/model.safetensors when the tensor bytes (headers not counted) fit in
 * max_shard_bytes (0 = no limit), else shards greedily in add order into
 * DIR/model-0000K-of-0000N.safetensors of at most max_shard_bytes tensor bytes each (a
 * larger single tensor gets its own file), each with the writer's metadata, and then
 * DIR/model.safetensors.index.json ({"metadata": {"total_size": sum of tensor bytes},
 * "weight_map": ...}), written last and atomically.  A stale file of the other layout is
 * removed afterwards.  Each file is atomic, the directory as a whole is not: write into a
 * fresh DIR (and rename it) when a crash must not leave a mixed one.  On failure before
 * the index is written, the shards this call wrote are removed.  DIR must exist. */
int st_writer_write_dir(st_writer *w, const char *dir, size_t max_shard_bytes,
                        hearth_err *err);

#endif
