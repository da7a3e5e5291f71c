/* prep_run.c - the preparation run: records processed in parallel windows, shards
 * written in order to temporary files, renamed and the manifest written once all
 * succeeded (prep.h). */
#include "prep/prep.h"

#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "file_digest.h"
#include "outputs.h"
#include "shard_format.h"

/* Records decoded at once per thread: enough to keep every thread busy between the
 * in-order writes, few enough to bound memory by a handful of images per thread. */
#define WINDOW_PER_JOB 4

typedef struct {
    const model_shape *m;
    const prep_opts *o;
    long min_px, max_px;
    int factor;                     /* patch * merge */
} prep_ctx;

/* One processed record: expanded tokens, grids and resized pixels. */
typedef struct {
    int rc;
    hearth_err err;
    int32_t *tokens;
    uint32_t n_tokens, n_images;
    uint32_t *grids;                /* [n_images * 2] */
    uint8_t **px;                   /* [n_images] RGB [gh*P][gw*P][3] */
} done_rec;

static void done_free(done_rec *d)
{
    free(d->tokens);
    free(d->grids);
    for (uint32_t i = 0; d->px && i < d->n_images; i++)
        free(d->px[i]);
    free(d->px);
    memset(d, 0, sizeof *d);
}

static int process_image(const prep_ctx *c, const char *path, uint8_t **out, uint32_t *grid,
                         hearth_err *err)
{
    prep_image img;
    int oh, ow, P = c->m->encoder.patch;
    int rc = prep_image_load(&img, path, err);
    if (rc)
        return rc;
    if ((rc = prep_smart_resize(img.h, img.w, c->factor, c->min_px, c->max_px, &oh, &ow,
                                err))) {
        free(img.px);
        return herr_prefix(err, rc, "%s", path);
    }
    *out = malloc((size_t)oh * ow * 3);
    if (!*out)
        rc = herr_set(err, HERR_NOMEM, "%s: out of memory", path);
    else
        rc = prep_resize(img.px, img.h, img.w, *out, oh, ow, err);
    free(img.px);
    grid[0] = (uint32_t)(oh / P);
    grid[1] = (uint32_t)(ow / P);
    return rc;
}

static int process_record(const prep_ctx *c, const prep_record *r, done_rec *d)
{
    const char *file = c->o->inputs[r->file];
    int merge = c->m->encoder.spatial_merge, itok = c->m->decoder.image_token_id;
    d->n_images = (uint32_t)r->n_images;
    d->grids = calloc(2 * (size_t)r->n_images + 1, sizeof *d->grids);
    d->px = calloc((size_t)r->n_images + 1, sizeof *d->px);
    if (!d->grids || !d->px)
        return herr_set(&d->err, HERR_NOMEM, "%s:%ld: out of memory", file, r->line);
    size_t total = (size_t)r->n_tokens;
    for (int k = 0; k < r->n_images; k++) {
        int rc = process_image(c, r->images[k], &d->px[k], d->grids + 2 * k, &d->err);
        if (rc)
            return herr_prefix(&d->err, rc, "%s:%ld: images[%d]", file, r->line, k);
        total += (size_t)d->grids[2 * k] * d->grids[2 * k + 1] / (size_t)(merge * merge) - 1;
    }
    if (total > INT32_MAX / 4)
        return herr_set(&d->err, HERR_CONFIG, "%s:%ld: %zu tokens after expanding the "
                        "images: too many", file, r->line, total);
    d->tokens = malloc(total * sizeof *d->tokens);
    if (!d->tokens)
        return herr_set(&d->err, HERR_NOMEM, "%s:%ld: out of memory", file, r->line);
    size_t at = 0;
    int img = 0;
    for (int i = 0; i < r->n_tokens; i++) {
        if (r->tokens[i] != itok) {
            d->tokens[at++] = r->tokens[i];
            continue;
        }
        size_t n = (size_t)d->grids[2 * img] * d->grids[2 * img + 1] / (size_t)(merge * merge);
        for (size_t k = 0; k < n; k++)
            d->tokens[at++] = itok;
        img++;
    }
    d->n_tokens = (uint32_t)at;
    return 0;
}

/* ---- shard files -------------------------------------------------------------------- */

typedef struct {
    FILE *f;
    char tmp[4096];
    uint64_t *offsets;              /* record starts */
    size_t n, cap;
    uint64_t pos;
} shard_out;

typedef struct {
    const char *dir;
    shard_out cur;                  /* cur.f != NULL: a shard is open */
    shard_entry *entries;           /* finished shards */
    char (*tmps)[4096];             /* their temporary files */
    int n_shards, cap_shards;
    int has_tmp;                    /* cur.tmp exists on disk */
} shard_set;

static int out_write(shard_out *s, const void *p, size_t n, hearth_err *err)
{
    if (n && fwrite(p, 1, n, s->f) != n)
        return herr_set(err, HERR_IO, "%s: write failed: %s", s->tmp, strerror(errno));
    s->pos += n;
    return 0;
}

static int shard_begin(shard_set *ss, hearth_err *err)
{
    shard_out *s = &ss->cur;
    char name[64];
    shard_file_name(name, sizeof name, ss->n_shards);
    if (snprintf(s->tmp, sizeof s->tmp, "%s/.%s.tmp", ss->dir, name) >= (int)sizeof s->tmp)
        return herr_set(err, HERR_IO, "%s: path too long", ss->dir);
    s->f = fopen(s->tmp, "wbx");
    if (!s->f)
        return herr_set(err, HERR_IO, "%s: cannot create: %s", s->tmp, strerror(errno));
    ss->has_tmp = 1;
    s->n = 0;
    s->pos = 0;
    static const unsigned char zero[SHARD_HEADER_BYTES];
    return out_write(s, zero, sizeof zero, err);   /* the header comes last */
}

static int shard_append(shard_set *ss, const done_rec *d, const prep_ctx *c, hearth_err *err)
{
    shard_out *s = &ss->cur;
    if (s->n == s->cap) {
        size_t ncap = s->cap ? 2 * s->cap : 256;
        uint64_t *q = realloc(s->offsets, ncap * sizeof *q);
        if (!q)
            return herr_set(err, HERR_NOMEM, "%s: out of memory", s->tmp);
        s->offsets = q;
        s->cap = ncap;
    }
    s->offsets[s->n++] = s->pos;
    int P = c->m->encoder.patch;
    uint32_t counts[2] = { d->n_tokens, d->n_images };
    uint64_t start = s->pos;
    int rc;
    if ((rc = out_write(s, counts, sizeof counts, err)) ||
        (rc = out_write(s, d->tokens, 4 * (size_t)d->n_tokens, err)) ||
        (rc = out_write(s, d->grids, 8 * (size_t)d->n_images, err)))
        return rc;
    for (uint32_t k = 0; k < d->n_images; k++)
        if ((rc = out_write(s, d->px[k], (size_t)d->grids[2 * k] * P * d->grids[2 * k + 1] *
                                             P * 3, err)))
            return rc;
    static const unsigned char zero[8];
    return out_write(s, zero, (8 - (s->pos - start) % 8) % 8, err);
}

/* Writes the index and header, fsyncs and closes the open shard, and records it. */
static int shard_finish(shard_set *ss, const prep_ctx *c, hearth_err *err)
{
    shard_out *s = &ss->cur;
    if (ss->n_shards == ss->cap_shards) {
        int ncap = ss->cap_shards ? 2 * ss->cap_shards : 16;
        shard_entry *e = realloc(ss->entries, (size_t)ncap * sizeof *e);
        if (e)
            ss->entries = e;
        char(*t)[4096] = e ? realloc(ss->tmps, (size_t)ncap * sizeof *t) : NULL;
        if (!e || !t)
            return herr_set(err, HERR_NOMEM, "%s: out of memory", s->tmp);
        ss->tmps = t;
        ss->cap_shards = ncap;
    }
    shard_header h = { .version = SHARD_VERSION, .channels = 3, .n_records = s->n,
                       .index_offset = s->pos,
                       .image_token_id = c->m->decoder.image_token_id,
                       .patch = c->m->encoder.patch, .merge = c->m->encoder.spatial_merge };
    h.file_size = s->pos + 8 * ((uint64_t)s->n + 1);
    uint64_t end = s->pos;
    unsigned char head[SHARD_HEADER_BYTES];
    shard_header_encode(head, &h);
    int rc;
    if ((rc = out_write(s, s->offsets, 8 * s->n, err)) ||
        (rc = out_write(s, &end, 8, err)))
        return rc;
    if (fflush(s->f) || fseek(s->f, 0, SEEK_SET) ||
        fwrite(head, 1, sizeof head, s->f) != sizeof head || fflush(s->f) ||
        fsync(fileno(s->f)))
        return herr_set(err, HERR_IO, "%s: write failed: %s", s->tmp, strerror(errno));
    FILE *f = s->f;
    s->f = NULL;
    if (fclose(f))
        return herr_set(err, HERR_IO, "%s: close failed: %s", s->tmp, strerror(errno));
    shard_entry *e = &ss->entries[ss->n_shards];
    memset(e, 0, sizeof *e);
    shard_file_name(e->file, sizeof e->file, ss->n_shards);
    e->records = s->n;
    long long bytes = 0;
    if ((rc = file_sha256(s->tmp, &bytes, e->sha256, err)))
        return rc;
    e->bytes = (uint64_t)bytes;
    memcpy(ss->tmps[ss->n_shards], s->tmp, sizeof s->tmp);
    ss->n_shards++;
    ss->has_tmp = 0;
    return 0;
}

/* Removes every file of the failed run. */
static void shard_set_discard(shard_set *ss)
{
    if (ss->cur.f)
        fclose(ss->cur.f);
    if (ss->has_tmp)
        unlink(ss->cur.tmp);
    for (int k = 0; k < ss->n_shards; k++)
        unlink(ss->tmps[k]);
}

static void shard_set_free(shard_set *ss)
{
    free(ss->cur.offsets);
    free(ss->entries);
    free(ss->tmps);
}

/* Renames the temporary shards to their names; on failure, removes the renamed ones. */
static int shard_set_publish(shard_set *ss, hearth_err *err)
{
    for (int k = 0; k < ss->n_shards; k++) {
        char dst[4200];
        snprintf(dst, sizeof dst, "%s/%s", ss->dir, ss->entries[k].file);
        if (rename(ss->tmps[k], dst) != 0) {
            int rc = herr_set(err, HERR_IO, "%s: rename failed: %s", dst, strerror(errno));
            for (int j = 0; j < k; j++) {
                snprintf(dst, sizeof dst, "%s/%s", ss->dir, ss->entries[j].file);
                unlink(dst);
            }
            for (int j = k; j < ss->n_shards; j++)
                unlink(ss->tmps[j]);
            ss->n_shards = 0;
            return rc;
        }
    }
    return 0;
}

/* ---- progress ----------------------------------------------------------------------- */

typedef struct {
    FILE *f;
    int tty;
    double last;
} progress;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void progress_show(progress *p, size_t done, size_t total, int shards, int final)
{
    if (!p->f)
        return;
    double t = now_s();
    if (!final && t - p->last < (p->tty ? 0.2 : 5.0))
        return;
    p->last = t;
    fprintf(p->f, "%sprep: %zu/%zu records (%d%%), %d shard%s%s", p->tty ? "\r" : "", done,
            total, total ? (int)(100 * done / total) : 100, shards, shards == 1 ? "" : "s",
            p->tty && !final ? "" : "\n");
    fflush(p->f);
}

/* ---- the run -------------------------------------------------------------------------- */

static int check_out_dir(const char *dir, hearth_err *err)
{
    int rc = outputs_mkdir_p(dir, err);
    if (rc)
        return rc;
    DIR *d = opendir(dir);
    if (!d)
        return herr_set(err, HERR_IO, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            closedir(d);
            return herr_set(err, HERR_CONFIG, "%s: the output directory is not empty (%s)",
                            dir, e->d_name);
        }
    closedir(d);
    return 0;
}

static int check_model(const model_shape *m, const prep_opts *o, hearth_err *err)
{
    if (!m->encoder.present)
        return herr_set(err, HERR_CONFIG, "--model %s: the model has no image encoder",
                        m->name);
    if (m->encoder.in_channels != 3)
        return herr_set(err, HERR_CONFIG, "--model %s: encoder.in_channels is %d; images "
                        "are RGB (3)", m->name, m->encoder.in_channels);
    if (m->decoder.image_token_id < 0 || m->decoder.image_token_id >= m->decoder.vocab)
        return herr_set(err, HERR_CONFIG, "--model %s: decoder.image_token_id %d is not in "
                        "the vocabulary", m->name, m->decoder.image_token_id);
    if (o->pad_token_id < 0 || o->pad_token_id >= m->decoder.vocab ||
        o->pad_token_id == m->decoder.image_token_id)
        return herr_set(err, HERR_CONFIG, "--pad-token %d: must be a text token of the model "
                        "([0, %d) but not the image token)", o->pad_token_id,
                        m->decoder.vocab);
    if (o->n_inputs < 1)
        return herr_set(err, HERR_CONFIG, "--in: at least one JSONL file is needed");
    return 0;
}

/* Processes and writes every record; the shards stay temporary. */
static int write_all(const prep_ctx *c, const prep_records *rs, shard_set *ss,
                     hearth_err *err)
{
    int jobs = c->o->jobs > 0 ? c->o->jobs : omp_get_num_procs();
    size_t window = (size_t)jobs * WINDOW_PER_JOB;
    size_t per_shard = (size_t)(c->o->shard_records > 0 ? c->o->shard_records
                                                        : PREP_SHARD_RECORDS_DEFAULT);
    done_rec *done = calloc(window, sizeof *done);
    if (!done)
        return herr_set(err, HERR_NOMEM, "out of memory");
    progress pg = { .f = c->o->progress, .tty = c->o->progress && isatty(fileno(c->o->progress)),
                    .last = now_s() };
    int rc = 0;
    for (size_t base = 0; base < rs->n && !rc; base += window) {
        size_t n = rs->n - base < window ? rs->n - base : window;
#pragma omp parallel for schedule(dynamic, 1) num_threads(jobs)
        for (size_t i = 0; i < n; i++)
            done[i].rc = process_record(c, &rs->rec[base + i], &done[i]);
        for (size_t i = 0; i < n && !rc; i++) {     /* in input order */
            if (done[i].rc) {
                *err = done[i].err;
                rc = done[i].rc;
                break;
            }
            if (!ss->cur.f && (rc = shard_begin(ss, err)))
                break;
            if ((rc = shard_append(ss, &done[i], c, err)))
                break;
            if (ss->cur.n == per_shard)
                rc = shard_finish(ss, c, err);
        }
        for (size_t i = 0; i < n; i++)
            done_free(&done[i]);
        if (!rc)
            progress_show(&pg, base + n, rs->n, ss->n_shards, 0);
    }
    if (!rc && ss->cur.f)
        rc = shard_finish(ss, c, err);
    if (!rc)
        progress_show(&pg, rs->n, rs->n, ss->n_shards, 1);
    free(done);
    return rc;
}

int prep_run(const prep_opts *o, const model_shape *m, hearth_err *err)
{
    int rc = check_model(m, o, err);
    if (rc)
        return rc;
    prep_ctx c = { .m = m, .o = o,
                   .min_px = o->min_pixels > 0 ? o->min_pixels : PREP_MIN_PIXELS_DEFAULT,
                   .max_px = o->max_pixels > 0 ? o->max_pixels : PREP_MAX_PIXELS_DEFAULT,
                   .factor = m->encoder.patch * m->encoder.spatial_merge };
    if (c.min_px > c.max_px)
        return herr_set(err, HERR_CONFIG, "--min-pixels %ld is above --max-pixels %ld",
                        c.min_px, c.max_px);
    prep_records rs = { 0 };
    for (int i = 0; i < o->n_inputs && !rc; i++)
        rc = prep_read_jsonl(&rs, o->inputs[i], i, m->decoder.vocab, m->decoder.image_token_id,
                             err);
    if (!rc && rs.n == 0)
        rc = herr_set(err, HERR_CONFIG, "--in: no records in the input");
    if (!rc)
        rc = check_out_dir(o->out_dir, err);
    if (rc) {
        prep_records_free(&rs);
        return rc;
    }
    shard_set ss = { .dir = o->out_dir };
    rc = write_all(&c, &rs, &ss, err);
    if (rc)
        shard_set_discard(&ss);
    else
        rc = shard_set_publish(&ss, err);
    if (!rc) {
        shard_manifest man = { .vocab = m->decoder.vocab,
                               .image_token_id = m->decoder.image_token_id,
                               .patch = m->encoder.patch, .merge = m->encoder.spatial_merge,
                               .channels = 3, .pad_token_id = o->pad_token_id,
                               .min_pixels = c.min_px, .max_pixels = c.max_px,
                               .records = rs.n, .n_shards = ss.n_shards,
                               .shards = ss.entries };
        snprintf(man.resample, sizeof man.resample, "%s", PREP_RESAMPLE_NAME);
        if ((rc = shard_manifest_write(o->out_dir, &man, err)))
            for (int k = 0; k < ss.n_shards; k++) {
                char dst[4200];
                snprintf(dst, sizeof dst, "%s/%s", o->out_dir, ss.entries[k].file);
                unlink(dst);
            }
    }
    shard_set_free(&ss);
    prep_records_free(&rs);
    return rc;
}
