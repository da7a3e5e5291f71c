#include "shard_format.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "outputs.h"
#include "shape/file_read.h"

static void put32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

void shard_header_encode(unsigned char out[SHARD_HEADER_BYTES], const shard_header *h)
{
    memset(out, 0, SHARD_HEADER_BYTES);
    memcpy(out, SHARD_MAGIC, 8);
    put32(out + 8, h->version);
    put32(out + 12, h->channels);
    put64(out + 16, h->n_records);
    put64(out + 24, h->index_offset);
    put64(out + 32, h->file_size);
    put32(out + 40, (uint32_t)h->image_token_id);
    put32(out + 44, (uint32_t)h->patch);
    put32(out + 48, (uint32_t)h->merge);
}

int shard_header_check(shard_header *h, const unsigned char *file, size_t size,
                       const char *path, hearth_err *err)
{
    if (size < SHARD_HEADER_BYTES)
        return herr_set(err, HERR_IO, "%s: truncated shard (%zu bytes, the header alone "
                        "is %d)", path, size, SHARD_HEADER_BYTES);
    if (memcmp(file, SHARD_MAGIC, 8) != 0)
        return herr_set(err, HERR_IO, "%s: not a hearth shard (wrong magic)", path);
    h->version = get32(file + 8);
    h->channels = get32(file + 12);
    h->n_records = get64(file + 16);
    h->index_offset = get64(file + 24);
    h->file_size = get64(file + 32);
    h->image_token_id = (int32_t)get32(file + 40);
    h->patch = (int32_t)get32(file + 44);
    h->merge = (int32_t)get32(file + 48);
    if (h->version != SHARD_VERSION)
        return herr_set(err, HERR_IO, "%s: shard format version %u, this build reads %d",
                        path, h->version, SHARD_VERSION);
    if (h->file_size != size)
        return herr_set(err, HERR_IO, "%s: truncated or damaged shard: %zu bytes, its "
                        "header says %llu", path, size, (unsigned long long)h->file_size);
    if (h->channels < 1 || h->patch < 1 || h->merge < 1)
        return herr_set(err, HERR_IO, "%s: bad shard header (channels %u, patch %d, merge "
                        "%d)", path, h->channels, h->patch, h->merge);
    uint64_t n = h->n_records;
    if (h->index_offset < SHARD_HEADER_BYTES || h->index_offset % 8 ||
        n > (size - SHARD_HEADER_BYTES) / 8 ||
        h->index_offset + 8 * (n + 1) != size)
        return herr_set(err, HERR_IO, "%s: bad shard index (%llu records at offset %llu in "
                        "%zu bytes)", path, (unsigned long long)n,
                        (unsigned long long)h->index_offset, size);
    const unsigned char *ix = file + h->index_offset;
    uint64_t prev = SHARD_HEADER_BYTES;
    for (uint64_t r = 0; r <= n; r++) {
        uint64_t o = get64(ix + 8 * r);
        if ((r == 0 && o != SHARD_HEADER_BYTES) || o < prev || o % 8 ||
            o > h->index_offset || (r == n && o != h->index_offset) ||
            (r > 0 && o == prev))
            return herr_set(err, HERR_IO, "%s: bad shard index entry %llu (offset %llu)",
                            path, (unsigned long long)r, (unsigned long long)o);
        prev = o;
    }
    return 0;
}

size_t shard_record_bytes(uint32_t n_tokens, uint32_t n_images, const uint32_t *grids,
                          int patch, int channels)
{
    size_t b = 8 + 4 * (size_t)n_tokens + 8 * (size_t)n_images;
    for (uint32_t i = 0; i < n_images; i++)
        b += (size_t)grids[2 * i] * patch * grids[2 * i + 1] * patch * (size_t)channels;
    return (b + 7) & ~(size_t)7;
}

int shard_record_get(shard_record *r, const unsigned char *file, const shard_header *h,
                     uint64_t index, const char *path, hearth_err *err)
{
    if (index >= h->n_records)
        return herr_set(err, HERR_RUNTIME, "%s: record %llu of %llu", path,
                        (unsigned long long)index, (unsigned long long)h->n_records);
    const unsigned char *ix = file + h->index_offset;
    uint64_t a = get64(ix + 8 * index), b = get64(ix + 8 * (index + 1));
    size_t span = (size_t)(b - a);
    const unsigned char *p = file + a;
    if (span < 8)
        return herr_set(err, HERR_IO, "%s: record %llu: truncated", path,
                        (unsigned long long)index);
    r->n_tokens = get32(p);
    r->n_images = get32(p + 4);
    size_t fixed = 8 + 4 * (size_t)r->n_tokens + 8 * (size_t)r->n_images;
    if (r->n_tokens > span / 4 || r->n_images > span / 8 || fixed > span)
        return herr_set(err, HERR_IO, "%s: record %llu: %u tokens and %u images do not fit "
                        "its %zu bytes", path, (unsigned long long)index, r->n_tokens,
                        r->n_images, span);
    /* Records start 8-aligned, so the int32/uint32 arrays are aligned in the mapping. */
    r->tokens = (const int32_t *)(const void *)(p + 8);
    r->grids = (const uint32_t *)(const void *)(p + 8 + 4 * (size_t)r->n_tokens);
    r->pixels = p + fixed;
    for (uint32_t i = 0; i < 2 * r->n_images; i++)
        if (r->grids[i] == 0 || r->grids[i] > 65536 ||
            r->grids[i] % (uint32_t)h->merge)
            return herr_set(err, HERR_IO, "%s: record %llu: bad image grid %u", path,
                            (unsigned long long)index, r->grids[i]);
    if (shard_record_bytes(r->n_tokens, r->n_images, r->grids, h->patch,
                           (int)h->channels) != span)
        return herr_set(err, HERR_IO, "%s: record %llu: its images do not match its %zu "
                        "bytes", path, (unsigned long long)index, span);
    return 0;
}

void shard_file_name(char *buf, size_t size, int k)
{
    snprintf(buf, size, "shard-%05d.bin", k);
}

/* ---- manifest ------------------------------------------------------------------------ */

int shard_manifest_write(const char *dir, const shard_manifest *m, hearth_err *err)
{
    json_t *shards = json_array();
    for (int k = 0; shards && k < m->n_shards; k++) {
        const shard_entry *e = &m->shards[k];
        json_array_append_new(shards, json_pack("{s:s, s:I, s:I, s:s}", "file", e->file,
                                                "records", (json_int_t)e->records,
                                                "bytes", (json_int_t)e->bytes,
                                                "sha256", e->sha256));
    }
    json_t *model = json_pack("{s:i, s:i, s:i, s:i, s:i}", "vocab", m->vocab,
                              "image_token_id", m->image_token_id, "patch", m->patch,
                              "spatial_merge", m->merge, "in_channels", m->channels);
    json_t *root = json_pack("{s:s, s:i, s:o, s:i, s:I, s:I, s:s, s:I, s:o}",
                             "format", SHARD_MANIFEST_FORMAT, "version", SHARD_VERSION,
                             "model", model, "pad_token_id", m->pad_token_id,
                             "min_pixels", (json_int_t)m->min_pixels,
                             "max_pixels", (json_int_t)m->max_pixels,
                             "resample", m->resample, "records", (json_int_t)m->records,
                             "shards", shards);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return herr_set(err, HERR_NOMEM, "%s/%s: out of memory", dir, SHARD_MANIFEST_NAME);
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return herr_set(err, HERR_NOMEM, "%s/%s: out of memory", dir, SHARD_MANIFEST_NAME);
    }
    memcpy(line + n, "\n", 2);
    int rc = outputs_write_atomic(dir, SHARD_MANIFEST_NAME, line, err);
    free(line);
    return rc;
}

/* An integer member of obj, checked to lie in [lo, hi]. */
static int get_int(json_t *obj, const char *key, const char *where, long lo, long hi,
                   long *out, const char *path, hearth_err *err)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return herr_set(err, HERR_IO, "%s: %s%s: expected an integer in [%ld, %ld]", path,
                        where, key, lo, hi);
    *out = (long)json_integer_value(v);
    return 0;
}

int shard_manifest_read(shard_manifest *m, const char *dir, hearth_err *err)
{
    memset(m, 0, sizeof *m);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, SHARD_MANIFEST_NAME) >= (int)sizeof path)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    json_t *root;
    int rc = file_read_json(path, FILE_READ_MAX_TEXT, 0, &root, err);
    if (rc == HERR_IO)
        return herr_prefix(err, rc, "the data set's manifest");
    if (rc)
        return rc == HERR_CONFIG ? HERR_IO : rc;
    json_t *fmt = json_object_get(root, "format"), *model = json_object_get(root, "model");
    json_t *shards = json_object_get(root, "shards");
    json_t *res = json_object_get(root, "resample");
    long v[12];
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), SHARD_MANIFEST_FORMAT))
        rc = herr_set(err, HERR_IO, "%s: format: expected \"%s\"", path,
                      SHARD_MANIFEST_FORMAT);
    else if (!json_is_object(model))
        rc = herr_set(err, HERR_IO, "%s: model: expected an object", path);
    else if (!json_is_array(shards))
        rc = herr_set(err, HERR_IO, "%s: shards: expected an array", path);
    if (!rc)
        rc = get_int(root, "version", "", SHARD_VERSION, SHARD_VERSION, &v[0], path, err);
    static const struct { int in_model; const char *key; long lo, hi; } keys[] = {
        { 1, "vocab", 1, INT32_MAX }, { 1, "image_token_id", -1, INT32_MAX },
        { 1, "patch", 1, 65536 }, { 1, "spatial_merge", 1, 64 }, { 1, "in_channels", 1, 4 },
        { 0, "pad_token_id", 0, INT32_MAX }, { 0, "min_pixels", 0, LONG_MAX },
        { 0, "max_pixels", 0, LONG_MAX }, { 0, "records", 0, LONG_MAX },
    };
    for (int i = 0; !rc && i < (int)(sizeof keys / sizeof keys[0]); i++)
        rc = get_int(keys[i].in_model ? model : root, keys[i].key,
                     keys[i].in_model ? "model." : "", keys[i].lo, keys[i].hi, &v[i + 1],
                     path, err);
    if (!rc) {
        m->vocab = (int)v[1];
        m->image_token_id = (int)v[2];
        m->patch = (int)v[3];
        m->merge = (int)v[4];
        m->channels = (int)v[5];
        m->pad_token_id = (int)v[6];
        m->min_pixels = v[7];
        m->max_pixels = v[8];
        m->records = (uint64_t)v[9];
        snprintf(m->resample, sizeof m->resample, "%s",
                 json_is_string(res) ? json_string_value(res) : "");
        m->n_shards = (int)json_array_size(shards);
        m->shards = calloc(m->n_shards ? (size_t)m->n_shards : 1, sizeof *m->shards);
        if (!m->shards)
            rc = herr_set(err, HERR_NOMEM, "%s: out of memory", path);
    }
    uint64_t total = 0;
    for (int k = 0; !rc && k < m->n_shards; k++) {
        json_t *e = json_array_get(shards, (size_t)k);
        json_t *f = json_object_get(e, "file"), *h = json_object_get(e, "sha256");
        char where[32];
        snprintf(where, sizeof where, "shards[%d].", k);
        if (!json_is_string(f) || strlen(json_string_value(f)) >= sizeof m->shards[k].file ||
            strchr(json_string_value(f), '/') || !json_string_value(f)[0]) {
            rc = herr_set(err, HERR_IO, "%s: %sfile: expected a file name", path, where);
            break;
        }
        if ((rc = get_int(e, "records", where, 1, LONG_MAX, &v[10], path, err)) ||
            (rc = get_int(e, "bytes", where, SHARD_HEADER_BYTES, LONG_MAX, &v[11], path,
                          err)))
            break;
        snprintf(m->shards[k].file, sizeof m->shards[k].file, "%s", json_string_value(f));
        snprintf(m->shards[k].sha256, sizeof m->shards[k].sha256, "%s",
                 json_is_string(h) ? json_string_value(h) : "");
        m->shards[k].records = (uint64_t)v[10];
        m->shards[k].bytes = (uint64_t)v[11];
        total += m->shards[k].records;
    }
    if (!rc && total != m->records)
        rc = herr_set(err, HERR_IO, "%s: records: %llu, but the shards hold %llu", path,
                      (unsigned long long)m->records, (unsigned long long)total);
    json_decref(root);
    return rc;
}

void shard_manifest_free(shard_manifest *m)
{
    if (!m)
        return;
    free(m->shards);
    memset(m, 0, sizeof *m);
}
