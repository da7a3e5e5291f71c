/* model_shard.c - a shard's elements in and out of the full tensor (model_shard.h). */
#include "model/model_shard.h"

#include <string.h>

void model_shard_whole(model_shard *sh, int ndim, const int64_t *dims)
{
    memset(sh, 0, sizeof *sh);
    sh->ndim = ndim;
    int64_t n = 1;
    for (int i = 0; i < 4; i++) {
        sh->dims[i] = i < ndim ? dims[i] : 1;
        n *= sh->dims[i];
    }
    sh->cols = ndim >= 2 ? dims[ndim - 1] : 1;
    sh->rows = sh->cols ? n / sh->cols : 0;
    sh->nseg = 1;
    sh->seg_row0[0] = 0;
    sh->seg_rows[0] = sh->rows;
    sh->col0 = 0;
    sh->ncols = sh->cols;
    sh->kv_rep = 1;
}

size_t model_shard_numel(const model_shard *sh)
{
    int64_t r = 0;
    for (int i = 0; i < sh->nseg; i++)
        r += sh->seg_rows[i];
    return (size_t)(r * sh->ncols);
}

size_t model_shard_full_numel(const model_shard *sh)
{
    return (size_t)(sh->rows * sh->cols);
}

/* Calls back for every local row: its row in full and its row in local. */
#define FOR_ROWS(sh, BODY)                                                                 \
    do {                                                                                   \
        size_t lr_ = 0;                                                                    \
        for (int s_ = 0; s_ < (sh)->nseg; s_++)                                            \
            for (int64_t r_ = 0; r_ < (sh)->seg_rows[s_]; r_++, lr_++) {                   \
                size_t full_off = (size_t)(((sh)->seg_row0[s_] + r_) * (sh)->cols +        \
                                           (sh)->col0);                                    \
                size_t local_off = lr_ * (size_t)(sh)->ncols;                              \
                BODY;                                                                      \
            }                                                                              \
    } while (0)

void model_shard_extract(const model_shard *sh, const float *full, float *local)
{
    size_t bytes = (size_t)sh->ncols * sizeof(float);
    FOR_ROWS(sh, memcpy(local + local_off, full + full_off, bytes));
}

void model_shard_place(const model_shard *sh, const float *local, float *full)
{
    size_t bytes = (size_t)sh->ncols * sizeof(float);
    FOR_ROWS(sh, memcpy(full + full_off, local + local_off, bytes));
}

int model_shard_load_full(model *local, const model *full, hearth_err *err)
{
    float *dst = model_params(local);
    const float *src = model_params((model *)full);
    for (int i = 0; i < model_tensor_count(local); i++) {
        const model_tensor *t = model_tensor_at(local, i);
        const model_tensor *ft = model_tensor_find(full, t->name);
        if (!ft || ft->numel != model_shard_full_numel(&t->shard))
            return herr_set(err, HERR_RUNTIME, "%s %s in the full model", t->name,
                            ft ? "has another size" : "is missing");
        model_shard_extract(&t->shard, src + ft->offset, dst + t->offset);
    }
    return 0;
}
