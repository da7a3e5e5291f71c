/* safetensors_internal.h - what the files of the safetensors module share:
 *   safetensors_dtype.c  dtypes, bf16/f16 conversions, shape sizes
 *   safetensors.c        one file: header validation, st_file, st_tensor_to_f32
 *   safetensors_set.c    a checkpoint directory: one file or a sharded index (st_set)
 *   safetensors_write.c  the writer (st_writer) */
#ifndef HEARTH_SAFETENSORS_INTERNAL_H
#define HEARTH_SAFETENSORS_INTERNAL_H

#include <jansson.h>

#include "safetensors.h"

/* The reference implementation refuses larger headers; so do we, before allocating. */
#define ST_HEADER_MAX ((uint64_t)100 * 1000 * 1000)
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_META_KEY "__metadata__"

struct st_file {
    char *path;
    void *map;
    size_t map_len;
    json_t *meta;           /* the "__metadata__" object (a reference into root), or NULL */
    json_t *root;
    st_tensor *t;           /* in data-offset order */
    const st_tensor **by_name;
    int n;
};

/* The dtype named s ("F32", "BF16", ...): 0, or -1 when unknown. */
int st_dtype_parse(const char *s, st_dtype *out);
/* numel of shape and numel * dtype size, or -1 on overflow. */
int st_shape_bytes(st_dtype dtype, int ndim, const int64_t *shape, size_t *numel,
                   size_t *nbytes);
/* qsort comparator of const st_tensor * by name. */
int st_cmp_tensor_name(const void *a, const void *b);

#endif
