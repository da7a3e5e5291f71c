/* safetensors.c - one safetensors file over mmap: strict header validation, lookup,
 * conversion to fp32 (safetensors.h).  Directories: safetensors_set.c; writing:
 * safetensors_write.c. */
#include "safetensors.h"
#include "kernels.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "outputs.h"
#include "safetensors_internal.h"
#include "shape/file_read.h"

/* Parser state of one tensor entry, before sorting by offset. */
typedef struct {
    st_tensor t;
    uint64_t begin, end;
    int pos;                /* place in the header */
} raw_tensor;

static int cmp_raw_offset(const void *a, const void *b)
{
    const raw_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    /* Zero-size tensors share offsets: keep the header's (the writer's add) order. */
    return x->pos - y->pos;
}

int st_cmp_tensor_name(const void *a, const void *b)
{
    const st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static const st_tensor *find_by_name(const st_tensor *const *by_name, int n, const char *name)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(by_name[mid]->name, name);
        if (c == 0)
            return by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* A JSON integer in [0, INT64_MAX], or -1. */
static int json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_metadata(const char *path, json_t *meta, hearth_err *err)
{
    if (!json_is_object(meta))
        return herr_set(err, HERR_CONFIG, "%s: \"%s\" is not an object", path, ST_META_KEY);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v))
            return herr_set(err, HERR_CONFIG, "%s: \"%s\" key \"%s\": value is not a string",
                            path, ST_META_KEY, k);
    }
    return 0;
}

/* Fills r from the header entry `name` -> v; data_len bounds the offsets. */
static int parse_tensor(const char *path, const char *name, json_t *v, uint64_t data_len,
                        raw_tensor *r, hearth_err *err)
{
    if (name[0] == '\0')
        return herr_set(err, HERR_CONFIG, "%s: a tensor has an empty name", path);
    if (strlen(name) >= ST_NAME_MAX)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%.64s...\": name longer than %d bytes",
                        path, name, ST_NAME_MAX - 1);
    memset(r, 0, sizeof *r);
    strcpy(r->t.name, name);
    if (!json_is_object(v))
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": entry is not an object", path,
                        name);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 &&
            strcmp(k, "data_offsets") != 0)
            return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": unknown key \"%s\"", path,
                            name, k);
    }
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": dtype missing or not a string",
                        path, name);
    if (st_dtype_parse(json_string_value(dt), &r->t.dtype) != 0)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": unknown dtype \"%s\"", path, name,
                        json_string_value(dt));
    if (!json_is_array(sh))
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": shape missing or not an array",
                        path, name);
    if (json_array_size(sh) > ST_MAX_DIMS)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": %zu dimensions, at most %d",
                        path, name, json_array_size(sh), ST_MAX_DIMS);
    r->t.ndim = (int)json_array_size(sh);
    for (int i = 0; i < r->t.ndim; i++) {
        uint64_t d;
        if (json_u64(json_array_get(sh, (size_t)i), &d) != 0)
            return herr_set(err, HERR_CONFIG,
                            "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path,
                            name, i);
        r->t.shape[i] = (int64_t)d;
    }
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        json_u64(json_array_get(off, 0), &r->begin) != 0 ||
        json_u64(json_array_get(off, 1), &r->end) != 0)
        return herr_set(err, HERR_CONFIG,
                        "%s: tensor \"%s\": data_offsets is not two non-negative integers", path,
                        name);
    if (r->begin > r->end)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": data_offsets [%llu, %llu] end "
                        "before they begin", path, name, (unsigned long long)r->begin,
                        (unsigned long long)r->end);
    if (r->end > data_len)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": data_offsets [%llu, %llu] run "
                        "past the data block of %llu bytes (truncated file?)", path, name,
                        (unsigned long long)r->begin, (unsigned long long)r->end,
                        (unsigned long long)data_len);
    if (st_shape_bytes(r->t.dtype, r->t.ndim, r->t.shape, &r->t.numel, &r->t.nbytes) != 0)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": shape overflows the byte count",
                        path, name);
    if ((uint64_t)r->t.nbytes != r->end - r->begin)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": %s shape needs %zu bytes but "
                        "data_offsets [%llu, %llu] hold %llu", path, name,
                        st_dtype_name(r->t.dtype), r->t.nbytes, (unsigned long long)r->begin,
                        (unsigned long long)r->end,
                        (unsigned long long)(r->end - r->begin));
    return 0;
}

/* Parses and validates the header text; fills f->root, f->meta, f->t, f->n, f->by_name. */
static int parse_header(st_file *f, const char *text, size_t len, const uint8_t *data,
                        uint64_t data_len, hearth_err *err)
{
    const char *path = f->path;
    json_error_t jerr;
    /* Duplicate keys would silently keep one of two tensors: refuse them. */
    f->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root)
        return herr_set(err, HERR_CONFIG, "%s: header is not valid JSON (byte %d): %s", path,
                        jerr.position, jerr.text);
    if (!json_is_object(f->root))
        return herr_set(err, HERR_CONFIG, "%s: header is not a JSON object", path);
    size_t cap = json_object_size(f->root);
    raw_tensor *raw = calloc(cap ? cap : 1, sizeof *raw);
    if (!raw)
        return herr_set(err, HERR_NOMEM, "%s: out of memory", path);
    int n = 0, rc = 0;
    const char *k;
    json_t *v;
    json_object_foreach(f->root, k, v) {
        if (strcmp(k, ST_META_KEY) == 0) {
            if ((rc = parse_metadata(path, v, err)) != 0)
                goto out;
            f->meta = v;
            continue;
        }
        if ((rc = parse_tensor(path, k, v, data_len, &raw[n], err)) != 0)
            goto out;
        raw[n].pos = n;
        n++;
    }
    qsort(raw, (size_t)n, sizeof *raw, cmp_raw_offset);
    /* Tensors must tile the data block exactly, as the reference implementation requires:
     * a gap or trailing bytes mean a header that does not describe the file. */
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        if (raw[i].begin < pos) {
            rc = herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": data_offsets [%llu, %llu] "
                          "overlap tensor \"%s\"", path, raw[i].t.name,
                          (unsigned long long)raw[i].begin, (unsigned long long)raw[i].end,
                          raw[i - 1].t.name);
            goto out;
        }
        if (raw[i].begin > pos) {
            rc = herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": %llu unused bytes before its "
                          "data_offsets [%llu, %llu]", path, raw[i].t.name,
                          (unsigned long long)(raw[i].begin - pos),
                          (unsigned long long)raw[i].begin, (unsigned long long)raw[i].end);
            goto out;
        }
        pos = raw[i].end;
    }
    if (pos != data_len) {
        rc = herr_set(err, HERR_CONFIG, "%s: %llu bytes after the last tensor's data", path,
                      (unsigned long long)(data_len - pos));
        goto out;
    }
    f->t = calloc(n ? (size_t)n : 1, sizeof *f->t);
    f->by_name = calloc(n ? (size_t)n : 1, sizeof *f->by_name);
    if (!f->t || !f->by_name) {
        rc = herr_set(err, HERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        f->t[i] = raw[i].t;
        f->t[i].data = data + raw[i].begin;
        f->by_name[i] = &f->t[i];
    }
    f->n = n;
    qsort(f->by_name, (size_t)n, sizeof *f->by_name, st_cmp_tensor_name);
out:
    free(raw);
    return rc;
}

int st_file_open(st_file **out, const char *path, hearth_err *err)
{
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return herr_set(err, HERR_NOMEM, "%s: out of memory", path);
    }
    int rc = 0;
    int fd;
    struct stat sb;
    if ((rc = file_open_regular(path, &fd, &sb, err)))
        goto fail;
    if (sb.st_size < 8) {
        rc = herr_set(err, HERR_CONFIG, "%s: too short to hold the 8-byte header length",
                      path);
        close(fd);
        goto fail;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        rc = herr_set(err, HERR_IO, "%s: too large to map", path);
        close(fd);
        goto fail;
    }
    f->map_len = (size_t)sb.st_size;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        rc = herr_set(err, HERR_IO, "%s: cannot map: %s", path, strerror(errno));
        goto fail;
    }
    const uint8_t *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | p[i];
    if (hlen > f->map_len - 8) {
        rc = herr_set(err, HERR_CONFIG, "%s: header length %llu exceeds the %zu bytes after "
                      "it (truncated or not a safetensors file)", path,
                      (unsigned long long)hlen, f->map_len - 8);
        goto fail;
    }
    if (hlen > ST_HEADER_MAX) {
        rc = herr_set(err, HERR_CONFIG, "%s: header length %llu is over the limit of %llu",
                      path, (unsigned long long)hlen, (unsigned long long)ST_HEADER_MAX);
        goto fail;
    }
    const uint8_t *data = p + 8 + hlen;
    if ((rc = parse_header(f, (const char *)p + 8, (size_t)hlen, data,
                           f->map_len - 8 - hlen, err)) != 0)
        goto fail;
    *out = f;
    return 0;
fail:
    st_file_close(f);
    return rc;
}

void st_file_close(st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_len);
    json_decref(f->root);
    free(f->t);
    free(f->by_name);
    free(f->path);
    free(f);
}

int st_file_count(const st_file *f)
{
    return f->n;
}

const st_tensor *st_file_at(const st_file *f, int i)
{
    return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const st_tensor *st_file_find(const st_file *f, const char *name)
{
    return find_by_name(f->by_name, f->n, name);
}

const char *st_file_metadata(const st_file *f, const char *key)
{
    return f->meta ? json_string_value(json_object_get(f->meta, key)) : NULL;
}

int st_tensor_to_f32(const st_tensor *t, float *out, size_t n, hearth_err *err)
{
    if (n != t->numel)
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": %zu elements, not %zu", t->name,
                        t->numel, n);
    /* The data may be unaligned (it follows a header of any length): copy bytewise. */
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case ST_F32:
        memcpy(out, p, n * sizeof *out);
        return 0;
    case ST_BF16:
    case ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            out[i] = t->dtype == ST_BF16 ? kcpu_bf16_decode(h) : st_f16_to_f32(h);
        }
        return 0;
    case ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, sizeof d);
            out[i] = (float)d;
        }
        return 0;
    default:
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": dtype %s is not floating point",
                        t->name, st_dtype_name(t->dtype));
    }
}
