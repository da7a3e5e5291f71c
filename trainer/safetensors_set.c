/* safetensors_set.c - a checkpoint directory: one model.safetensors or a sharded set
 * with model.safetensors.index.json (safetensors.h). */
#include "safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "outputs.h"
#include "safetensors_internal.h"
#include "shape/file_read.h"

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
    qsort(s->by_name, (size_t)n, sizeof *s->by_name, st_cmp_tensor_name);
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
    json_t *root;
    int rc = file_read_json(ipath, FILE_READ_MAX_TEXT, JSON_REJECT_DUPLICATES, &root, err);
    if (rc)
        return rc == HERR_IO ? HERR_CONFIG : rc;
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
