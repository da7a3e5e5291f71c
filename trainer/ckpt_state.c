/* ckpt_state.c - one rank's state arrays to and from its checkpoint file (ckpt_state.h). */
#include "ckpt_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/fp8.h"

void ckpt_items_init(ckpt_items *l)
{
    memset(l, 0, sizeof *l);
}

void ckpt_items_free(ckpt_items *l)
{
    free(l->v);
    memset(l, 0, sizeof *l);
}

int ckpt_items_add(ckpt_items *l, const char *name, st_dtype dtype, void *data, size_t numel,
                   int ndim, const int64_t *dims, hearth_err *err)
{
    if (strlen(name) >= ST_NAME_MAX)
        return herr_set(err, HERR_RUNTIME, "checkpoint: tensor name too long: %s", name);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        ckpt_item *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return herr_set(err, HERR_NOMEM, "checkpoint: out of memory");
        l->v = v;
        l->cap = cap;
    }
    ckpt_item *it = &l->v[l->n];
    memset(it, 0, sizeof *it);
    snprintf(it->name, sizeof it->name, "%s", name);
    it->dtype = dtype;
    it->data = data;
    it->numel = numel;
    size_t prod = 1;
    for (int i = 0; i < ndim && ndim <= ST_MAX_DIMS; i++)
        prod *= (size_t)dims[i];
    if (ndim >= 1 && ndim <= ST_MAX_DIMS && prod == numel) {
        it->ndim = ndim;
        memcpy(it->shape, dims, (size_t)ndim * sizeof *dims);
    } else {
        it->ndim = 1;
        it->shape[0] = (int64_t)numel;
    }
    l->n++;
    return 0;
}

int ckpt_items_add_model(ckpt_items *l, model *m, const char *prefix, hearth_err *err)
{
    return ckpt_items_add_model_at(l, m, model_params(m), prefix, err);
}

int ckpt_items_add_model_at(ckpt_items *l, model *m, float *p, const char *prefix,
                            hearth_err *err)
{
    char name[ST_NAME_MAX + 32];
    int rc;
    for (int i = 0; i < model_tensor_count(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        snprintf(name, sizeof name, "%sparam/%s", prefix, t->name);
        if ((rc = ckpt_items_add(l, name, ST_F32, p + t->offset, t->numel, t->ndim, t->dims,
                                 err)))
            return rc;
    }
    float *hist;
    int *pos;
    size_t n_hist, n_pos;
    if ((rc = model_fp8_state(m, &hist, &n_hist, &pos, &n_pos, err)))
        return rc;
    if (!hist)
        return 0;
    snprintf(name, sizeof name, "%sfp8/amax_history", prefix);
    if ((rc = ckpt_items_add(l, name, ST_F32, hist, n_hist, 0, NULL, err)))
        return rc;
    snprintf(name, sizeof name, "%sfp8/history_pos", prefix);
    return ckpt_items_add(l, name, ST_I32, pos, n_pos, 0, NULL, err);
}

int ckpt_rank_path(char *out, size_t n, const char *dir, int rank, hearth_err *err)
{
    if (snprintf(out, n, "%s/rank-%05d.safetensors", dir, rank) >= (int)n)
        return herr_set(err, HERR_IO, "%s: path too long", dir);
    return 0;
}

static size_t item_bytes(const ckpt_item *it)
{
    return it->numel * st_dtype_size(it->dtype);
}

int ckpt_items_write(const ckpt_items *l, const char *path, int step, hearth_err *err)
{
    st_writer *w = NULL;
    char text[32];
    snprintf(text, sizeof text, "%d", step);
    int rc = st_writer_init(&w, err);
    if (!rc)
        rc = st_writer_metadata(w, "format", CKPT_STATE_FORMAT, err);
    if (!rc)
        rc = st_writer_metadata(w, "step", text, err);
    for (int i = 0; !rc && i < l->n; i++) {
        const ckpt_item *it = &l->v[i];
        rc = st_writer_add(w, it->name, it->dtype, it->ndim, it->shape, it->data,
                           item_bytes(it), err);
    }
    if (!rc)
        rc = st_writer_write(w, path, err);
    st_writer_free(w);
    return rc;
}

int ckpt_items_read(const ckpt_items *l, const char *path, int step, hearth_err *err)
{
    st_file *f = NULL;
    int rc = st_file_open(&f, path, err);
    if (rc)
        return rc;
    const char *fmt = st_file_metadata(f, "format");
    const char *st = st_file_metadata(f, "step");
    char want[32];
    snprintf(want, sizeof want, "%d", step);
    if (!fmt || strcmp(fmt, CKPT_STATE_FORMAT))
        rc = herr_set(err, HERR_CONFIG, "%s: not a hearth-train state file (metadata format "
                      "%s, expected %s)", path, fmt ? fmt : "missing", CKPT_STATE_FORMAT);
    else if (!st || strcmp(st, want))
        rc = herr_set(err, HERR_CONFIG, "%s: holds step %s, the manifest says %d", path,
                      st ? st : "(none)", step);
    else if (st_file_count(f) != l->n)
        rc = herr_set(err, HERR_CONFIG, "%s: holds %d tensors, this layout has %d (another "
                      "model or layout)", path, st_file_count(f), l->n);
    for (int i = 0; !rc && i < l->n; i++) {
        const ckpt_item *it = &l->v[i];
        const st_tensor *t = st_file_find(f, it->name);
        if (!t)
            rc = herr_set(err, HERR_CONFIG, "%s: tensor %s: missing", path, it->name);
        else if (t->dtype != it->dtype || t->numel != it->numel ||
                 t->nbytes != item_bytes(it))
            rc = herr_set(err, HERR_CONFIG, "%s: tensor %s: %s with %zu elements, expected "
                          "%s with %zu", path, it->name, st_dtype_name(t->dtype), t->numel,
                          st_dtype_name(it->dtype), it->numel);
        else if (t->nbytes)
            memcpy(it->data, t->data, t->nbytes);
    }
    st_file_close(f);
    return rc;
}
