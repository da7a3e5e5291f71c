/* ptrain_ckpt.c - one rank's checkpoint file in a parallel layout (ptrain.h). */
#include "parallel/ptrain_internal.h"

#include <stdio.h>

#include "ckpt_state.h"

/* What a step of this rank depends on: its chunks, then its optimizer moments.  Empty
 * optimizer parts (a bucket with no tensors on this rank) are left out. */
static int list_state(ptrain *t, ckpt_items *l, hearth_err *err)
{
    char prefix[32] = "";
    int rc = 0;
    for (int v = 0; !rc && v < t->vpp; v++) {
        if (t->vpp > 1)
            snprintf(prefix, sizeof prefix, "chunk%d/", v);
        rc = ckpt_items_add_model(l, t->chunk[v], prefix, err);
    }
    for (int i = 0; !rc && i < param_sync_state_count(t->sync); i++) {
        const char *name;
        size_t n;
        float *a = param_sync_state_at(t->sync, i, &name, &n);
        if (n)
            rc = ckpt_items_add(l, name, ST_F32, a, n, 0, NULL, err);
    }
    return rc;
}

static int save_or_load(ptrain *t, const char *dir, int load, int step, hearth_err *err)
{
    char path[4200];
    ckpt_items l;
    ckpt_items_init(&l);
    int rc = ckpt_rank_path(path, sizeof path, dir, t->rank, err);
    if (!rc)
        rc = list_state(t, &l, err);
    if (!rc)
        rc = load ? ckpt_items_read(&l, path, step, err)
                  : ckpt_items_write(&l, path, t->step, err);
    ckpt_items_free(&l);
    if (!rc && load)
        t->step = step;
    return rc;
}

int ptrain_save(ptrain *t, const char *dir, hearth_err *err)
{
    return save_or_load(t, dir, 0, 0, err);
}

int ptrain_load(ptrain *t, const char *dir, int step, hearth_err *err)
{
    return save_or_load(t, dir, 1, step, err);
}
