#include "data_shards.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/rng.h"
#include "shard_format.h"
#include "shape/file_read.h"

typedef struct {
    char path[4096];
    const unsigned char *map;       /* the whole file, read-only */
    size_t size;
    shard_header h;
} shard_map;

struct data_shards {
    shard_manifest man;
    shard_map *shards;              /* [man.n_shards] */
    uint64_t *first;                /* [n_shards + 1]: first record of each shard */
    synth_params geo;               /* seed and sample geometry (synth_params_geometry) */
};

/* ---- the shuffle -------------------------------------------------------------------- */

uint64_t data_shards_permute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t pos)
{
    if (n <= 1)
        return 0;
    /* A balanced Feistel network on the smallest even number of bits covering n is a
     * bijection of [0, 2^bits); walking the cycle until the value lands below n makes it
     * a bijection of [0, n) (at most 4x more values than n, so few steps). */
    int bits = 64 - __builtin_clzll(n - 1);
    if (bits < 2)
        bits = 2;
    bits += bits & 1;
    int half = bits / 2;
    uint64_t mask = half >= 64 ? ~0ULL : (1ULL << half) - 1;
    uint64_t key = hrng_mix(seed, epoch ^ 0x5348524453ULL);
    uint64_t x = pos;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = hrng_mix(key + round, r) & mask;
            uint64_t nl = r;
            r = l ^ f;
            l = nl;
        }
        x = (l << half) | r;
    } while (x >= n);
    return x;
}

uint64_t data_shards_records(const data_shards *d)
{
    return d->man.records;
}

uint64_t data_shards_record_of(const data_shards *d, uint64_t sample)
{
    uint64_t n = d->man.records;
    return data_shards_permute(d->geo.seed, sample / n, n, sample % n);
}

/* ---- open / close ------------------------------------------------------------------- */

static int map_shard(shard_map *s, const char *dir, const shard_entry *e, hearth_err *err)
{
    if (snprintf(s->path, sizeof s->path, "%s/%s", dir, e->file) >= (int)sizeof s->path)
        return herr_set(err, HERR_IO, "%s/%s: path too long", dir, e->file);
    int fd;
    struct stat sb;
    int rc = file_open_regular(s->path, &fd, &sb, err);
    if (rc)
        return rc;
    if ((uint64_t)sb.st_size != e->bytes) {
        close(fd);
        return herr_set(err, HERR_IO, "%s: %lld bytes, the manifest says %llu (truncated or "
                        "replaced)", s->path, (long long)sb.st_size,
                        (unsigned long long)e->bytes);
    }
    s->size = (size_t)sb.st_size;
    void *p = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
    int e2 = errno;
    close(fd);
    if (p == MAP_FAILED)
        return herr_set(err, HERR_IO, "%s: mmap failed: %s", s->path, strerror(e2));
    s->map = p;
    return 0;
}

/* The manifest's geometry must be the model's; errors name the manifest and the key. */
static int check_model(const data_shards *d, const char *dir, hearth_err *err)
{
    const shard_manifest *m = &d->man;
    const char *key = NULL;
    long have = 0, want = 0;
    if (m->vocab != d->geo.vocab)
        key = "vocab", have = m->vocab, want = d->geo.vocab;
    else if (m->image_token_id != d->geo.image_token_id)
        key = "image_token_id", have = m->image_token_id, want = d->geo.image_token_id;
    else if (m->patch != d->geo.patch)
        key = "patch", have = m->patch, want = d->geo.patch;
    else if (m->merge != d->geo.merge)
        key = "spatial_merge", have = m->merge, want = d->geo.merge;
    else if (m->channels != d->geo.in_channels)
        key = "in_channels", have = m->channels, want = d->geo.in_channels;
    if (key)
        return herr_set(err, HERR_CONFIG, "%s/%s: model.%s is %ld, the run's model has %ld "
                        "(prepare the data for this model)", dir, SHARD_MANIFEST_NAME, key,
                        have, want);
    if (m->records == 0)
        return herr_set(err, HERR_CONFIG, "%s/%s: the data set has no records", dir,
                        SHARD_MANIFEST_NAME);
    if (m->pad_token_id >= d->geo.vocab || m->pad_token_id == d->geo.image_token_id)
        return herr_set(err, HERR_CONFIG, "%s/%s: pad_token_id %d is not a text token of "
                        "the model", dir, SHARD_MANIFEST_NAME, m->pad_token_id);
    return 0;
}

int data_shards_open(data_shards **out, const run_config *cfg, hearth_err *err)
{
    *out = NULL;
    const char *dir = cfg->data.path;
    if (!cfg->model.encoder.present)
        return herr_set(err, HERR_CONFIG, "data.kind: shards needs a model with an encoder");
    if (cfg->train.seq_len < 2)
        return herr_set(err, HERR_CONFIG, "train.seq_len: need at least 2, got %d",
                        cfg->train.seq_len);
    data_shards *d = calloc(1, sizeof *d);
    if (!d)
        return herr_set(err, HERR_NOMEM, "data: out of memory");
    synth_params_geometry(&d->geo, cfg);
    int rc = shard_manifest_read(&d->man, dir, err);
    if (!rc)
        rc = check_model(d, dir, err);
    if (!rc) {
        d->shards = calloc((size_t)d->man.n_shards, sizeof *d->shards);
        d->first = calloc((size_t)d->man.n_shards + 1, sizeof *d->first);
        if (!d->shards || !d->first)
            rc = herr_set(err, HERR_NOMEM, "data: out of memory");
    }
    for (int k = 0; !rc && k < d->man.n_shards; k++) {
        shard_map *s = &d->shards[k];
        const shard_entry *e = &d->man.shards[k];
        if ((rc = map_shard(s, dir, e, err)) ||
            (rc = shard_header_check(&s->h, s->map, s->size, s->path, err)))
            break;
        if (s->h.n_records != e->records || s->h.image_token_id != d->geo.image_token_id ||
            s->h.patch != d->geo.patch || s->h.merge != d->geo.merge ||
            (int)s->h.channels != d->geo.in_channels)
            rc = herr_set(err, HERR_IO, "%s: its header does not match %s/%s (records %llu, "
                          "manifest %llu)", s->path, dir, SHARD_MANIFEST_NAME,
                          (unsigned long long)s->h.n_records,
                          (unsigned long long)e->records);
        d->first[k + 1] = d->first[k] + e->records;
    }
    if (rc) {
        data_shards_close(d);
        return herr_prefix(err, rc, "data.path");
    }
    *out = d;
    return 0;
}

void data_shards_close(data_shards *d)
{
    if (!d)
        return;
    for (int k = 0; d->shards && k < d->man.n_shards; k++)
        if (d->shards[k].map)
            munmap((void *)d->shards[k].map, d->shards[k].size);
    free(d->shards);
    free(d->first);
    shard_manifest_free(&d->man);
    free(d);
}

/* ---- samples ------------------------------------------------------------------------ */

/* The shard holding global record `rec`, and the record's index inside it. */
static const shard_map *locate(const data_shards *d, uint64_t rec, uint64_t *local)
{
    int lo = 0, hi = d->man.n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->first[mid] <= rec)
            lo = mid;
        else
            hi = mid - 1;
    }
    *local = rec - d->first[lo];
    return &d->shards[lo];
}

/* Where the sample's tokens end (<= seq_len) and how many of its images it keeps:
 * walks the record's tokens, checking that each image has its block of consecutive
 * image tokens and that every token is in the vocabulary. */
static int plan_cut(const data_shards *d, const shard_record *r, const shard_map *s,
                    uint64_t local, int *cut, int *kept, hearth_err *err)
{
    int m2 = d->geo.merge * d->geo.merge, S = d->geo.seq_len;
    uint32_t pos = 0, img = 0;
    *cut = -1;
    *kept = 0;
    while (pos < r->n_tokens) {
        int32_t t = r->tokens[pos];
        if (t < 0 || t >= d->geo.vocab)
            return herr_set(err, HERR_IO, "%s: record %llu: token %d at position %u is "
                            "outside the vocabulary [0, %d)", s->path,
                            (unsigned long long)local, t, pos, d->geo.vocab);
        if (t != d->geo.image_token_id) {
            if (*cut < 0 && pos >= (uint32_t)S)
                *cut = S;
            pos++;
            continue;
        }
        if (img >= r->n_images)
            return herr_set(err, HERR_IO, "%s: record %llu: more image tokens than its %u "
                            "images take", s->path, (unsigned long long)local, r->n_images);
        uint32_t cnt = r->grids[2 * img] * r->grids[2 * img + 1] / (uint32_t)m2;
        if (cnt > r->n_tokens - pos)
            return herr_set(err, HERR_IO, "%s: record %llu: image %u needs %u tokens, the "
                            "record ends first", s->path, (unsigned long long)local, img,
                            cnt);
        for (uint32_t k = 0; k < cnt; k++)
            if (r->tokens[pos + k] != d->geo.image_token_id)
                return herr_set(err, HERR_IO, "%s: record %llu: image %u's %u tokens are "
                                "not consecutive", s->path, (unsigned long long)local, img,
                                cnt);
        if (*cut < 0 && pos + cnt > (uint32_t)S)
            *cut = (int)pos;        /* this image does not fit: end before it */
        if (*cut < 0)
            (*kept)++;
        pos += cnt;
        img++;
    }
    if (img != r->n_images)
        return herr_set(err, HERR_IO, "%s: record %llu: %u images but tokens for %u",
                        s->path, (unsigned long long)local, r->n_images, img);
    if (*cut < 0)
        *cut = (int)r->n_tokens < S ? (int)r->n_tokens : S;
    return 0;
}

/* Normalises an image's interleaved RGB bytes px [H][W][C] into frame [C][H][W]. */
static void normalise(const data_shards *d, float *frame, const uint8_t *px, int H, int W)
{
    static const float mean[3] = DATA_CLIP_MEAN, stdv[3] = DATA_CLIP_STD;
    int C = d->geo.in_channels;
    for (int c = 0; c < C; c++) {
        float mu = mean[c % 3], sd = stdv[c % 3];
        float *f = frame + (size_t)c * H * W;
        for (size_t i = 0; i < (size_t)H * W; i++)
            f[i] = ((float)px[i * (size_t)C + (size_t)c] / 255.0f - mu) / sd;
    }
}

static int fill_one(const data_shards *d, synth_batch *b, uint64_t sample, int *tok,
                    int *tgt, hearth_err *err)
{
    uint64_t local;
    const shard_map *s = locate(d, data_shards_record_of(d, sample), &local);
    shard_record r;
    int cut, kept, rc;
    if ((rc = shard_record_get(&r, s->map, &s->h, local, s->path, err)) ||
        (rc = plan_cut(d, &r, s, local, &cut, &kept, err)))
        return rc;
    const int S = d->geo.seq_len, P = d->geo.patch, C = d->geo.in_channels;
    for (int i = 0; i < S; i++)
        tok[i] = i < cut ? r.tokens[i] : d->man.pad_token_id;
    for (int i = 0; i < S; i++) {
        int next_ok = i + 1 < cut && tok[i + 1] != d->geo.image_token_id;
        tgt[i] = next_ok ? tok[i + 1] : -1;
        b->n_targets += next_ok;
    }
    size_t patch_dim = b->patch_dim;
    const uint8_t *px = r.pixels;
    for (int k = 0; k < kept; k++) {
        int gh = (int)r.grids[2 * k], gw = (int)r.grids[2 * k + 1];
        int H = gh * P, W = gw * P;
        size_t patches = (size_t)gh * gw;
        if ((rc = synth_batch_reserve(b, 0, (size_t)b->n_images + 1,
                                      (b->n_patches + patches) * patch_dim,
                                      (size_t)C * H * W, err)))
            return rc;
        normalise(d, b->scratch, px, H, W);
        synth_patchify(b->pixels + b->n_patches * patch_dim, b->scratch, C, gh, gw, P,
                       d->geo.temporal_patch, d->geo.merge);
        int *g = b->grid_thw + 3 * b->n_images;
        g[0] = 1;
        g[1] = gh;
        g[2] = gw;
        b->image_class[b->n_images++] = -1;
        b->n_patches += patches;
        px += (size_t)H * W * C;
    }
    return 0;
}

int data_shards_fill(const data_shards *d, synth_batch *b, uint64_t first, int n,
                     hearth_err *err)
{
    if (n < 1)
        return herr_set(err, HERR_RUNTIME, "data: bad batch request (%d samples)", n);
    const int S = d->geo.seq_len;
    int rc = synth_batch_reserve(b, (size_t)n * S, 0, 0, 0, err);
    if (rc)
        return rc;
    b->n_seq = n;
    b->seq_len = S;
    b->n_images = 0;
    b->n_patches = 0;
    b->n_targets = 0;
    const synth_params *g = &d->geo;
    b->patch_dim = (size_t)g->in_channels * g->temporal_patch * g->patch * g->patch;
    for (int i = 0; i < n && !rc; i++)
        rc = fill_one(d, b, first + (uint64_t)i, b->tokens + (size_t)i * S,
                      b->targets + (size_t)i * S, err);
    return rc;
}
