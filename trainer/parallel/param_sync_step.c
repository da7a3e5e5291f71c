/* param_sync_step.c - gradient reduction, the global norm and the AdamW step
 * (param_sync.h). */
#include "parallel/param_sync_internal.h"

#include <math.h>
#include <string.h>

#include "kernels.h"

int ps_sum_run(ps_sum *s, hearth_err *err)
{
    if (!s->n || !s->c)
        return 0;
    size_t at = 0;
    for (int i = 0; i < s->n; i++) {
        memcpy(s->buf + at, s->ptr[i], s->len[i] * sizeof(float));
        at += s->len[i];
    }
    int rc = comm_allreduce(s->c, s->buf, s->buf, s->total, COMM_F32, COMM_SUM, err);
    if (rc)
        return rc;
    at = 0;
    for (int i = 0; i < s->n; i++) {
        memcpy(s->ptr[i], s->buf + at, s->len[i] * sizeof(float));
        at += s->len[i];
    }
    return 0;
}

static int zero_on(const param_sync *s, const ps_bucket *b)
{
    return s->opts.distributed_optimizer && b->c && b->size > 1;
}

/* Runs BODY for the piece of every tensor of the bucket that lies in [lo, hi) (flat
 * offsets a..e, tensor pt), in bucket order. */
#define FOR_OVERLAP(s, b, lo_, hi_, BODY)                                                  \
    do {                                                                                   \
        for (int k_ = 0; k_ < (b)->n; k_++) {                                              \
            ps_tensor *pt = &(s)->tensors[(b)->ti[k_]];                                    \
            size_t a = pt->flat > (lo_) ? pt->flat : (lo_);                                \
            size_t e = pt->flat + pt->t.numel < (hi_) ? pt->flat + pt->t.numel : (hi_);    \
            if (a >= e)                                                                    \
                continue;                                                                  \
            BODY;                                                                          \
        }                                                                                  \
    } while (0)

/* Step 4 for one bucket: flatten, allreduce or reduce-scatter, and write the reduced
 * part back into the models' gradients (so callers see the reduced values there). */
static int reduce_bucket(param_sync *s, ps_bucket *b, hearth_err *err)
{
    for (int k = 0; k < b->n; k++) {
        const ps_tensor *pt = &s->tensors[b->ti[k]];
        memcpy(b->g + pt->flat, pt->g, pt->t.numel * sizeof(float));
    }
    int rc = 0;
    if (zero_on(s, b)) {
        size_t padded = b->chunk * (size_t)b->size;
        memset(b->g + b->total, 0, (padded - b->total) * sizeof(float));
        rc = comm_reduce_scatter(b->c, b->g, b->g + (size_t)b->rank * b->chunk, b->chunk,
                                 COMM_F32, COMM_SUM, err);
    } else if (b->c && b->size > 1) {
        rc = comm_allreduce(b->c, b->g, b->g, b->total, COMM_F32, COMM_SUM, err);
    }
    if (rc)
        return rc;
    FOR_OVERLAP(s, b, b->lo, b->hi,
                memcpy(pt->g + (a - pt->flat), b->g + a, (e - a) * sizeof(float)));
    return 0;
}

/* This rank's share of the squared norm of one bucket: elements counted once in the full
 * model (ps_tensor.norm_n) in the rank's own part, or with a replicated optimizer the
 * whole bucket on replica 0 only. */
static double bucket_sumsq(param_sync *s, const ps_bucket *b)
{
    size_t lo = b->lo, hi = b->hi;
    if (!zero_on(s, b) && b->rank != 0)
        return 0.0;
    double ss = 0.0;
    for (int k = 0; k < b->n; k++) {
        const ps_tensor *pt = &s->tensors[b->ti[k]];
        size_t a = pt->flat > lo ? pt->flat : lo;
        size_t e = pt->flat + pt->norm_n < hi ? pt->flat + pt->norm_n : hi;
        if (a < e)
            ss += kcpu_sumsq(b->g + a, e - a);
    }
    return ss;
}

int param_sync_reduce(param_sync *s, double *grad_norm, hearth_err *err)
{
    static const char *const what[PS_SUM_KINDS] = {
        "encoder tp partial sums", "decoder tp partial sums", "encoder kv segments",
        "decoder kv segments", "tied embedding",
    };
    for (int k = 0; k < PS_SUM_KINDS; k++) {
        int rc = ps_sum_run(&s->sum[k], err);
        if (rc)
            return herr_prefix(err, rc, "param_sync: %s", what[k]);
    }
    static const char *const rep[PS_REP_KINDS] = { "encoder dp", "expert dp", "dp_cp" };
    double ss = 0.0;
    for (int k = 0; k < PS_REP_KINDS; k++) {
        int rc = reduce_bucket(s, &s->rep[k], err);
        if (rc)
            return herr_prefix(err, rc, "param_sync: %s gradients", rep[k]);
        ss += bucket_sumsq(s, &s->rep[k]);
    }
    int rc = comm_allreduce(s->world, &ss, &ss, 1, COMM_F64, COMM_SUM, err);
    if (rc)
        return herr_prefix(err, rc, "param_sync: gradient norm");
    *grad_norm = sqrt(ss);
    s->reduced = 1;
    return 0;
}

/* AdamW on the rank's part of one bucket, then the updated parameters back to every
 * replica and into the models.  The update is elementwise, so running it over the
 * flattened part, one call per tensor piece (each with its tensor's decay), gives the
 * single-rank trainer's values bit for bit for the same gradients. */
static int step_bucket(param_sync *s, ps_bucket *b, int step, float lr, float wd,
                       float clip, hearth_err *err)
{
    FOR_OVERLAP(s, b, b->lo, b->hi,
                memcpy(b->p + a, pt->p + (a - pt->flat), (e - a) * sizeof(float)));
    if (clip != 1.0f && b->hi > b->lo)
        kcpu_scale(b->g + b->lo, b->hi - b->lo, clip);
    FOR_OVERLAP(s, b, b->lo, b->hi,
                kcpu_adamw_update(b->p + a, b->g + a, b->m + (a - b->lo), b->v + (a - b->lo),
                                  e - a, lr, s->opts.beta1, s->opts.beta2, s->opts.eps,
                                  pt->t.decay ? wd : 0.0f, step));
    if (zero_on(s, b)) {
        int rc = comm_all_gather(b->c, b->p + (size_t)b->rank * b->chunk, b->p, b->chunk,
                                 COMM_F32, err);
        if (rc)
            return rc;
    }
    for (int k = 0; k < b->n; k++) {
        const ps_tensor *pt = &s->tensors[b->ti[k]];
        memcpy(pt->p, b->p + pt->flat, pt->t.numel * sizeof(float));
    }
    return 0;
}

int param_sync_step(param_sync *s, int step, float lr, float wd, float clip,
                    hearth_err *err)
{
    if (!s->reduced)
        return herr_set(err, HERR_RUNTIME, "param_sync: step %d without a reduce of its "
                        "gradients", step);
    s->reduced = 0;
    static const char *const rep[PS_REP_KINDS] = { "encoder dp", "expert dp", "dp_cp" };
    for (int k = 0; k < PS_REP_KINDS; k++) {
        int rc = step_bucket(s, &s->rep[k], step, lr, wd, clip, err);
        if (rc)
            return herr_prefix(err, rc, "param_sync: %s parameters", rep[k]);
    }
    return 0;
}
