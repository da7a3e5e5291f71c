/* param_sync_gather.c - the full model's parameters from every rank's shards
 * (param_sync.h).  Every element of the full model has exactly one canonical writer (the
 * rule of the norm: replica 0, tp rank 0 for replicated tensors, the first rank of a kv
 * group for the k and v rows, never a tied copy); all other ranks contribute zeros, so one
 * allreduce sum over the world reproduces the values exactly. */
#include "parallel/param_sync_internal.h"

#include <string.h>

#include "model/model_shard.h"

int param_sync_gather(param_sync *s, model *full_model, float *full, hearth_err *err)
{
    size_t n = model_param_count(full_model);
    memset(full, 0, n * sizeof(float));
    int bad = 0;
    for (int i = 0; i < s->n_tensors && !bad; i++) {
        const ps_tensor *pt = &s->tensors[i];
        if (pt->replica_index != 0 || pt->norm_n == 0)
            continue;
        const model_tensor *ft = model_tensor_find(full_model, pt->t.name);
        if (!ft || ft->numel != model_shard_full_numel(&pt->t.shard)) {
            /* Still join the collective below, so the other ranks do not wait forever. */
            bad = herr_set(err, HERR_RUNTIME, "param_sync: gather: %s %s in the full model",
                           pt->t.name, ft ? "has another size" : "is missing");
            break;
        }
        model_shard sh = pt->t.shard;
        if (pt->norm_n < pt->t.numel)
            sh.nseg = 1;   /* q rows only: another rank writes the shared k and v rows */
        model_shard_place(&sh, pt->p, full + ft->offset);
    }
    int rc = comm_allreduce(s->world, full, full, n, COMM_F32, COMM_SUM, err);
    if (bad)
        return bad;
    return rc ? herr_prefix(err, rc, "param_sync: gather") : 0;
}
