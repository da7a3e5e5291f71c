/* safetensors_write.c - the writer: tensors added by reference or converted, written
 * atomically as one file or shards with an index (safetensors.h). */
#include "safetensors.h"
#include "kernels.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "outputs.h"
#include "safetensors_internal.h"

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
    if (st_shape_bytes(dtype, ndim, shape, &numel, nbytes) != 0)
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
            uint16_t h = dtype == ST_BF16 ? kcpu_bf16_encode(src[i]) : st_f32_to_f16(src[i]);
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
