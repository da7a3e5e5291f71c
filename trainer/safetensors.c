/* safetensors.c - see safetensors.h.  Layout: dtypes and conversions, header validation
 * and st_file, st_set (one file or a sharded index), the writer. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "outputs.h"

/* The reference implementation refuses larger headers; so do we, before allocating. */
#define ST_HEADER_MAX ((uint64_t)100 * 1000 * 1000)
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_META_KEY "__metadata__"

/* ---- dtypes and conversions ------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} dtype_info[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4},  [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2},
    [ST_F64] = {"F64", 8},  [ST_I64] = {"I64", 8},   [ST_I32] = {"I32", 4},
    [ST_U8] = {"U8", 1},    [ST_I8] = {"I8", 1},     [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(st_dtype d)
{
    return (unsigned)d < ST_DTYPE_COUNT ? dtype_info[d].name : NULL;
}

size_t st_dtype_size(st_dtype d)
{
    return (unsigned)d < ST_DTYPE_COUNT ? dtype_info[d].size : 0;
}

static int dtype_parse(const char *s, st_dtype *out)
{
    for (int d = 0; d < ST_DTYPE_COUNT; d++)
        if (strcmp(s, dtype_info[d].name) == 0) {
            *out = (st_dtype)d;
            return 0;
        }
    return -1;
}

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t st_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        /* NaN: keep sign and top payload bits, force the quiet bit so that a payload held
         * only in the low 16 bits cannot turn into infinity. */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest, ties to even: add just under half an ulp, plus one when the kept
     * part is odd.  A carry into the exponent is the correct rounding (up to infinity). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float st_bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

/* Rounds m >> shift to nearest, ties to even (shift in 1..31). */
static uint32_t shift_rne(uint32_t m, int shift)
{
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return q;
}

uint16_t st_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u)   /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    /* 65520 is halfway between 65504 (largest finite, odd mantissa) and 2^16: ties to
     * even go up, so everything from there on is infinity. */
    if (ax >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    int e = (int)(ax >> 23);
    uint32_t mant = ax & 0x7fffffu;
    if (e >= 113)   /* normal half: exponent e - 127 >= -14 */
        return (uint16_t)(sign | shift_rne((uint32_t)(e - 112) << 23 | mant, 13));
    /* Subnormal half (or zero): value = m * 2^(e-150) in units of 2^-24 is
     * m >> (126 - e); a result of 0x400 is the smallest normal, encoded correctly. */
    if (e == 0)   /* fp32 subnormals are far below half an f16 subnormal */
        return sign;
    int shift = 126 - e;
    if (shift > 24)
        return sign;
    return (uint16_t)(sign | shift_rne(mant | 0x800000u, shift));
}

float st_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (e == 0) {   /* zero or subnormal: mant * 2^-24, exact in fp32 */
        float v = (float)mant * 0x1p-24f;
        return f32_from_bits(f32_bits(v) | sign);
    }
    if (e == 31)
        return f32_from_bits(sign | 0x7f800000u | mant << 13);
    return f32_from_bits(sign | (e + 112) << 23 | mant << 13);
}

/* numel of shape and numel * dtype size, or -1 on overflow. */
static int shape_bytes(st_dtype dtype, int ndim, const int64_t *shape, size_t *numel,
                       size_t *nbytes)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d > SIZE_MAX || (d != 0 && n > SIZE_MAX / d))
            return -1;
        n *= (size_t)d;
    }
    size_t sz = st_dtype_size(dtype);
    if (n > SIZE_MAX / sz)
        return -1;
    *numel = n;
    *nbytes = n * sz;
    return 0;
}

/* ---- reading one file ------------------------------------------------------------- */

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

static int cmp_tensor_name(const void *a, const void *b)
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
    if (dtype_parse(json_string_value(dt), &r->t.dtype) != 0)
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
    if (shape_bytes(r->t.dtype, r->t.ndim, r->t.shape, &r->t.numel, &r->t.nbytes) != 0)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": shape overflows the byte count",
                        path, name);
    if ((uint64_t)r->t.nbytes != r->end - r->begin)
        return herr_set(err, HERR_CONFIG, "%s: tensor \"%s\": %s shape needs %zu bytes but "
                        "data_offsets [%llu, %llu] hold %llu", path, name,
                        dtype_info[r->t.dtype].name, r->t.nbytes, (unsigned long long)r->begin,
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
    qsort(f->by_name, (size_t)n, sizeof *f->by_name, cmp_tensor_name);
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
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = herr_set(err, HERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        rc = herr_set(err, HERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        goto fail;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_size < 8) {
        rc = herr_set(err, HERR_CONFIG, "%s: %s", path, S_ISREG(sb.st_mode)
                      ? "too short to hold the 8-byte header length" : "not a regular file");
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

/* ---- reading a checkpoint directory ---------------------------------------------- */

struct st_set {
    st_file **files;        /* sorted by file name */
    int nfiles;
    const st_tensor **t;    /* file order, then data-offset order */
    const st_tensor **by_name;
    int *file_of;           /* file_of[i]: index into files of by_name[i] */
    int n;
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Index of the file holding by_name entry `t`, for messages. */
static const char *set_file_name(const st_set *s, int i)
{
    const char *p = s->files[s->file_of[i]]->path, *slash = strrchr(p, '/');
    return slash ? slash + 1 : p;
}

/* Collects every tensor of s->files into s->t and s->by_name; a name held by two files
 * is an error naming both. */
static int set_collect(st_set *s, hearth_err *err)
{
    int n = 0;
    for (int i = 0; i < s->nfiles; i++)
        n += s->files[i]->n;
    s->t = calloc(n ? (size_t)n : 1, sizeof *s->t);
    s->by_name = calloc(n ? (size_t)n : 1, sizeof *s->by_name);
    s->file_of = calloc(n ? (size_t)n : 1, sizeof *s->file_of);
    if (!s->t || !s->by_name || !s->file_of)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < s->nfiles; i++)
        for (int j = 0; j < s->files[i]->n; j++)
            s->t[k++] = &s->files[i]->t[j];
    s->n = n;
    memcpy(s->by_name, s->t, (size_t)n * sizeof *s->t);
    qsort(s->by_name, (size_t)n, sizeof *s->by_name, cmp_tensor_name);
    /* Which file each tensor lives in: the tensor pointer lies inside that file's array. */
    for (int i = 0; i < n; i++)
        for (int f = 0; f < s->nfiles; f++)
            if (s->by_name[i] >= s->files[f]->t && s->by_name[i] < s->files[f]->t + s->files[f]->n) {
                s->file_of[i] = f;
                break;
            }
    for (int i = 1; i < n; i++)
        if (strcmp(s->by_name[i - 1]->name, s->by_name[i]->name) == 0)
            return herr_set(err, HERR_CONFIG, "tensor \"%s\" is in both %s and %s",
                            s->by_name[i]->name, set_file_name(s, i - 1), set_file_name(s, i));
    return 0;
}

static int set_find_index(const st_set *s, const char *name)
{
    int lo = 0, hi = s->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(s->by_name[mid]->name, name);
        if (c == 0)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* Opens the files named by the index's weight_map and checks that the map and the
 * files agree tensor by tensor. */
static int set_open_index(st_set *s, const char *dir, const char *ipath, hearth_err *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return herr_set(err, HERR_CONFIG, "%s:%d:%d: %s", ipath, jerr.line, jerr.column,
                        jerr.text);
    int rc = 0;
    const char **names = NULL;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        rc = herr_set(err, HERR_CONFIG, "%s: no \"weight_map\" object", ipath);
        goto out;
    }
    size_t nw = json_object_size(wm);
    names = calloc(nw ? nw : 1, sizeof *names);
    if (!names) {
        rc = herr_set(err, HERR_NOMEM, "out of memory");
        goto out;
    }
    size_t nn = 0;
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        const char *fn = json_string_value(v);
        /* Only plain names inside dir: an index must not reach elsewhere. */
        if (!fn || !fn[0] || strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0) {
            rc = herr_set(err, HERR_CONFIG, "%s: weight_map \"%s\": not a file name in the "
                          "directory", ipath, k);
            goto out;
        }
        names[nn++] = fn;
    }
    qsort(names, nn, sizeof *names, cmp_str);
    size_t nu = 0;
    for (size_t i = 0; i < nn; i++)
        if (nu == 0 || strcmp(names[nu - 1], names[i]) != 0)
            names[nu++] = names[i];
    s->files = calloc(nu ? nu : 1, sizeof *s->files);
    if (!s->files) {
        rc = herr_set(err, HERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nu; i++) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= (int)sizeof path) {
            rc = herr_set(err, HERR_IO, "%s: path too long", dir);
            goto out;
        }
        if ((rc = st_file_open(&s->files[i], path, err)) != 0)
            goto out;
        s->nfiles++;
    }
    if ((rc = set_collect(s, err)) != 0) {
        herr_prefix(err, rc, "%s", dir);
        goto out;
    }
    json_object_foreach(wm, k, v) {
        int i = set_find_index(s, k);
        const char *fn = json_string_value(v);
        if (i < 0) {
            rc = herr_set(err, HERR_CONFIG, "%s: weight_map puts tensor \"%s\" in %s, which "
                          "does not hold it", ipath, k, fn);
            goto out;
        }
        if (strcmp(set_file_name(s, i), fn) != 0) {
            rc = herr_set(err, HERR_CONFIG, "%s: weight_map puts tensor \"%s\" in %s, but it "
                          "is in %s", ipath, k, fn, set_file_name(s, i));
            goto out;
        }
    }
    if ((size_t)s->n != nw)   /* every map entry matched one tensor: the rest are extra */
        for (int i = 0; i < s->n; i++)
            if (!json_object_get(wm, s->by_name[i]->name)) {
                rc = herr_set(err, HERR_CONFIG, "%s: tensor \"%s\" of %s is not in the "
                              "weight_map", ipath, s->by_name[i]->name, set_file_name(s, i));
                goto out;
            }
out:
    free(names);
    json_decref(root);
    return rc;
}

int st_set_open(st_set **out, const char *dir, hearth_err *err)
{
    *out = NULL;
    st_set *s = calloc(1, sizeof *s);
    if (!s)
        return herr_set(err, HERR_NOMEM, "out of memory");
    char path[4096];
    int rc;
    if (snprintf(path, sizeof path, "%s/%s", dir, ST_INDEX_NAME) >= (int)sizeof path) {
        rc = herr_set(err, HERR_IO, "%s: path too long", dir);
        goto fail;
    }
    if (access(path, F_OK) == 0) {
        if ((rc = set_open_index(s, dir, path, err)) != 0)
            goto fail;
    } else {
        snprintf(path, sizeof path, "%s/%s", dir, ST_SINGLE_NAME);
        if (access(path, F_OK) != 0) {
            rc = herr_set(err, HERR_IO, "%s: neither %s nor %s found", dir, ST_INDEX_NAME,
                          ST_SINGLE_NAME);
            goto fail;
        }
        if (!(s->files = calloc(1, sizeof *s->files))) {
            rc = herr_set(err, HERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((rc = st_file_open(&s->files[0], path, err)) != 0)
            goto fail;
        s->nfiles = 1;
        if ((rc = set_collect(s, err)) != 0)
            goto fail;
    }
    *out = s;
    return 0;
fail:
    st_set_close(s);
    return rc;
}

void st_set_close(st_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nfiles; i++)
        st_file_close(s->files[i]);
    free(s->files);
    free(s->t);
    free(s->by_name);
    free(s->file_of);
    free(s);
}

int st_set_count(const st_set *s)
{
    return s->n;
}

const st_tensor *st_set_at(const st_set *s, int i)
{
    return i >= 0 && i < s->n ? s->t[i] : NULL;
}

const st_tensor *st_set_find(const st_set *s, const char *name)
{
    int i = set_find_index(s, name);
    return i < 0 ? NULL : s->by_name[i];
}

const char *st_set_metadata(const st_set *s, const char *key)
{
    return s->nfiles > 0 ? st_file_metadata(s->files[0], key) : NULL;
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
            out[i] = t->dtype == ST_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
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

/* ---- writing ---------------------------------------------------------------------- */

typedef struct {
    char name[ST_NAME_MAX];
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
    void *own;              /* the writer's converted copy, or NULL */
} wr_tensor;

struct st_writer {
    wr_tensor *t;
    int n, cap;
    json_t *names;          /* set of added names, for the duplicate check */
    json_t *meta;           /* "__metadata__", insertion-ordered */
};

int st_writer_init(st_writer **out, hearth_err *err)
{
    *out = NULL;
    st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->names = json_object()) || !(w->meta = json_object())) {
        st_writer_free(w);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    *out = w;
    return 0;
}

void st_writer_free(st_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n; i++)
        free(w->t[i].own);
    free(w->t);
    json_decref(w->names);
    json_decref(w->meta);
    free(w);
}

/* Checks name/dtype/shape and appends an entry without data; *nbytes = its size. */
static int writer_push(st_writer *w, const char *name, st_dtype dtype, int ndim,
                       const int64_t *shape, size_t *nbytes, hearth_err *err)
{
    if (!name || !name[0] || strlen(name) >= ST_NAME_MAX || strcmp(name, ST_META_KEY) == 0)
        return herr_set(err, HERR_CONFIG, "tensor name \"%.64s\": empty, reserved or longer "
                        "than %d bytes", name ? name : "", ST_NAME_MAX - 1);
    if ((unsigned)dtype >= ST_DTYPE_COUNT)
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": invalid dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > ST_MAX_DIMS || (ndim > 0 && !shape))
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": %d dimensions, 0..%d allowed", name,
                        ndim, ST_MAX_DIMS);
    size_t numel;
    if (shape_bytes(dtype, ndim, shape, &numel, nbytes) != 0)
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": negative dimension or byte count "
                        "overflow", name);
    if (json_object_get(w->names, name))
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": added twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        wr_tensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t)
            return herr_set(err, HERR_NOMEM, "out of memory");
        w->t = t;
        w->cap = cap;
    }
    if (json_object_set_new(w->names, name, json_true()) != 0)
        return herr_set(err, HERR_CONFIG, "tensor \"%.64s\": name is not valid UTF-8 (or out "
                        "of memory)", name);
    wr_tensor *e = &w->t[w->n++];
    memset(e, 0, sizeof *e);
    strcpy(e->name, name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = shape[i];
    e->nbytes = *nbytes;
    return 0;
}

/* Drops the last entry (a tensor refused after writer_push accepted its name). */
static void writer_pop(st_writer *w)
{
    wr_tensor *e = &w->t[--w->n];
    json_object_del(w->names, e->name);
    free(e->own);
}

int st_writer_add(st_writer *w, const char *name, st_dtype dtype, int ndim,
                  const int64_t *shape, const void *data, size_t nbytes, hearth_err *err)
{
    size_t want;
    int rc = writer_push(w, name, dtype, ndim, shape, &want, err);
    if (rc != 0)
        return rc;
    if (want != nbytes) {
        writer_pop(w);
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": shape needs %zu bytes of %s, got %zu",
                        name, want, st_dtype_name(dtype), nbytes);
    }
    if (nbytes > 0 && !data) {
        writer_pop(w);
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": no data", name);
    }
    w->t[w->n - 1].data = data;
    return 0;
}

int st_writer_add_f32(st_writer *w, const char *name, st_dtype dtype, int ndim,
                      const int64_t *shape, const float *src, hearth_err *err)
{
    if (dtype != ST_F32 && dtype != ST_BF16 && dtype != ST_F16)
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": cannot convert fp32 to %s",
                        name ? name : "", st_dtype_name(dtype) ? st_dtype_name(dtype) : "?");
    size_t nbytes;
    int rc = writer_push(w, name, dtype, ndim, shape, &nbytes, err);
    if (rc != 0)
        return rc;
    wr_tensor *e = &w->t[w->n - 1];
    size_t numel = nbytes / st_dtype_size(dtype);
    if (numel > 0 && !src) {
        writer_pop(w);
        return herr_set(err, HERR_CONFIG, "tensor \"%s\": no data", name);
    }
    uint8_t *buf = malloc(nbytes ? nbytes : 1);
    if (!buf) {
        writer_pop(w);
        return herr_set(err, HERR_NOMEM, "tensor \"%s\": out of memory for %zu bytes", name,
                        nbytes);
    }
    if (dtype == ST_F32) {
        memcpy(buf, src, nbytes);
    } else {
        for (size_t i = 0; i < numel; i++) {
            uint16_t h = dtype == ST_BF16 ? st_f32_to_bf16(src[i]) : st_f32_to_f16(src[i]);
            buf[2 * i] = (uint8_t)(h & 0xff);
            buf[2 * i + 1] = (uint8_t)(h >> 8);
        }
    }
    e->own = buf;
    e->data = buf;
    return 0;
}

int st_writer_metadata(st_writer *w, const char *key, const char *value, hearth_err *err)
{
    if (!key || !value)
        return herr_set(err, HERR_CONFIG, "metadata: NULL key or value");
    if (json_object_set_new(w->meta, key, json_string(value)) != 0)
        return herr_set(err, HERR_CONFIG, "metadata \"%s\": not valid UTF-8 or out of memory",
                        key);
    return 0;
}

/* The padded header (without the length prefix) for tensors [lo, hi) of w. */
static char *writer_header(const st_writer *w, int lo, int hi, size_t *len, hearth_err *err)
{
    json_t *root = json_object();
    int bad = !root;
    if (!bad && json_object_size(w->meta) > 0)
        bad = json_object_set(root, ST_META_KEY, w->meta) != 0;
    size_t pos = 0;
    for (int i = lo; i < hi && !bad; i++) {
        const wr_tensor *e = &w->t[i];
        json_t *sh = json_array();
        bad = !sh;
        for (int d = 0; d < e->ndim && !bad; d++)
            bad = json_array_append_new(sh, json_integer(e->shape[d])) != 0;
        json_t *ent = json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(e->dtype),
                                "shape", sh, "data_offsets", (json_int_t)pos,
                                (json_int_t)(pos + e->nbytes));
        /* json_pack's "o" steals sh even on failure. */
        bad = bad || !ent || json_object_set_new(root, e->name, ent) != 0;
        pos += e->nbytes;
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) {
        herr_set(err, HERR_NOMEM, "out of memory building the header");
        return NULL;
    }
    /* Pad with spaces so that the data block starts 8-aligned in the file. */
    size_t n = strlen(text), padded = (n + 8 + 7) / 8 * 8 - 8;
    char *p = realloc(text, padded + 1);
    if (!p) {
        free(text);
        herr_set(err, HERR_NOMEM, "out of memory building the header");
        return NULL;
    }
    memset(p + n, ' ', padded - n);
    p[padded] = '\0';
    *len = padded;
    return p;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        /* Large tensors: stay well below the per-call limit of write(2). */
        size_t chunk = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        ssize_t k = write(fd, p, chunk);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* Writes tensors [lo, hi) of w to path through path.tmp (fsync, rename, fsync of the
 * directory).  On failure the temporary file is removed. */
static int writer_write_range(const st_writer *w, int lo, int hi, const char *path,
                              hearth_err *err)
{
    size_t hlen;
    char *header = writer_header(w, lo, hi, &hlen, err);
    if (!header)
        return HERR_NOMEM;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(header);
        return herr_set(err, HERR_IO, "%s: path too long", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        free(header);
        return herr_set(err, HERR_IO, "%s: cannot create: %s", tmp, strerror(e));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int bad = write_all(fd, len8, 8) != 0 || write_all(fd, header, hlen) != 0;
    free(header);
    for (int i = lo; i < hi && !bad; i++)
        bad = write_all(fd, w->t[i].data, w->t[i].nbytes) != 0;
    const char *what = "write";
    if (!bad && fsync(fd) != 0) {
        bad = 1;
        what = "fsync";
    }
    int e = errno;
    if (close(fd) != 0 && !bad) {
        bad = 1;
        what = "close";
        e = errno;
    }
    if (!bad && rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return herr_set(err, HERR_IO, "%s: cannot rename into place: %s", path, strerror(e));
    }
    if (bad) {
        unlink(tmp);
        return herr_set(err, HERR_IO, "%s: %s failed: %s", tmp, what, strerror(e));
    }
    /* The rename is durable only once the directory entry is synced. */
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == path)
        strcpy(dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

int st_writer_write(st_writer *w, const char *path, hearth_err *err)
{
    return writer_write_range(w, 0, w->n, path, err);
}

/* Removes DIR/NAME if present: a stale file of the other layout would shadow or confuse
 * the checkpoint just written. */
static int remove_stale(const char *dir, const char *name, hearth_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (unlink(path) != 0 && errno != ENOENT)
        return herr_set(err, HERR_IO, "%s: cannot remove stale file: %s", path,
                        strerror(errno));
    return 0;
}

int st_writer_write_dir(st_writer *w, const char *dir, size_t max_shard_bytes,
                        hearth_err *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, ST_INDEX_NAME) >= (int)sizeof path)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    /* Greedy shards in add order: shard k holds tensors [first[k], first[k + 1]). */
    int *first = malloc(((size_t)w->n + 1) * sizeof *first);
    if (!first)
        return herr_set(err, HERR_NOMEM, "out of memory");
    int nshards = 0;
    size_t cur = 0, total = 0;
    for (int i = 0; i < w->n; i++) {
        size_t b = w->t[i].nbytes;
        if (nshards == 0 ||
            (max_shard_bytes > 0 && cur > 0 &&
             (cur > max_shard_bytes || b > max_shard_bytes - cur))) {
            first[nshards++] = i;
            cur = 0;
        }
        cur += b;
        total += b;
    }
    first[nshards] = w->n;
    int rc = 0;
    if (nshards <= 1) {
        snprintf(path, sizeof path, "%s/%s", dir, ST_SINGLE_NAME);
        if ((rc = writer_write_range(w, 0, w->n, path, err)) == 0)
            rc = remove_stale(dir, ST_INDEX_NAME, err);
        free(first);
        return rc;
    }
    if (nshards > 99999) {
        free(first);
        return herr_set(err, HERR_CONFIG, "%s: %d shards, at most 99999", dir, nshards);
    }
    json_t *wm = json_object();
    json_t *index = wm ? json_pack("{s:{s:I}, s:o}", "metadata", "total_size",
                                   (json_int_t)total, "weight_map", wm) : NULL;
    if (!index) {
        free(first);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    int written = 0;
    for (int k = 0; k < nshards && rc == 0; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nshards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = writer_write_range(w, first[k], first[k + 1], path, err);
        written += rc == 0;
        for (int i = first[k]; i < first[k + 1] && rc == 0; i++)
            if (json_object_set_new(wm, w->t[i].name, json_string(name)) != 0)
                rc = herr_set(err, HERR_NOMEM, "out of memory");
    }
    /* The index goes last: it is what makes the new shards the checkpoint. */
    char *text = rc == 0 ? json_dumps(index, JSON_INDENT(2)) : NULL;
    if (rc == 0 && !text)
        rc = herr_set(err, HERR_NOMEM, "out of memory");
    if (rc == 0)
        rc = outputs_write_atomic(dir, ST_INDEX_NAME, text, err);
    if (rc == 0)
        rc = remove_stale(dir, ST_SINGLE_NAME, err);
    else   /* without the index the shards of this call are only clutter */
        for (int k = 0; k < written; k++) {
            snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, k + 1,
                     nshards);
            unlink(path);
        }
    free(text);
    json_decref(index);
    free(first);
    return rc;
}
