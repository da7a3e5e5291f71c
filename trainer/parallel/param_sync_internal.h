/* param_sync_internal.h - the state shared by param_sync*.c (not part of the API).
 *
 * Every tensor of the local models is described once (ps_tensor).  Trainable tensors are
 * listed in two kinds of buckets:
 *   ps_sum     a plain allreduce of some gradient ranges over one group (steps 1-3 of
 *              param_sync.h: tp partial sums, kv segments, the tied embedding pair);
 *   ps_bucket  the replica group of step 4: the tensors' gradients and parameters
 *              flattened in tensor order into one buffer (padded to a multiple of the
 *              group size), with AdamW state for the rank's own part [lo, hi) of it
 *              (the whole buffer without the distributed optimizer). */
#ifndef HEARTH_PARAM_SYNC_INTERNAL_H
#define HEARTH_PARAM_SYNC_INTERNAL_H

#include <stddef.h>

#include "parallel/param_sync.h"

typedef struct {
    model_tensor t;        /* copy of the tensor's table entry */
    float *p, *g;          /* its parameters and gradients in its model's arrays */
    int comp;              /* PS_DECODER or PS_ENCODER (encoder and projector) */
    int tp_index;          /* rank in the component's TP group */
    int replica_index;     /* rank in the replica group (enc DP, EDP or DP_CP) */
    int bucket;            /* index into ps->rep, -1 when frozen */
    size_t flat;           /* offset of its elements in the bucket's flat buffers */
    size_t norm_n;         /* leading elements this rank counts in the norm (and writes
                              in a gather) once the replica rule says it may */
} ps_tensor;

typedef struct {
    comm *c;               /* borrowed or owned (see ps_sum.owned) */
    int owned;             /* created here (kv and tied groups) */
    int kv_rep;            /* kv sums: the group size */
    int n;                 /* ranges */
    float **ptr;
    size_t *len;
    size_t total;
    float *buf;
} ps_sum;

typedef struct {
    comm *c;               /* borrowed from a parallel state; NULL: this rank alone */
    int size, rank;
    size_t total;          /* elements of the bucket's tensors */
    size_t chunk;          /* padded / size */
    size_t lo, hi;         /* the rank's own part (ZeRO: its chunk clipped to total) */
    int *ti;               /* tensor indices in bucket order */
    int n;
    float *g, *p;          /* [size * chunk] */
    float *m, *v;          /* [hi - lo], AdamW moments of the own part */
} ps_bucket;

enum { PS_REP_ENC = 0, PS_REP_EXPERT = 1, PS_REP_DENSE = 2, PS_REP_KINDS };
enum { PS_SUM_TP_ENC, PS_SUM_TP_DEC, PS_SUM_KV_ENC, PS_SUM_KV_DEC, PS_SUM_TIED, PS_SUM_KINDS };

struct param_sync {
    param_sync_opts opts;
    comm *world;
    const parallel_state *dec, *enc;
    ps_tensor *tensors;
    int n_tensors;
    ps_sum sum[PS_SUM_KINDS];
    ps_bucket rep[PS_REP_KINDS];
    int reduced;           /* a reduce happened since the last step */
};

/* Packs the gradient ranges, allreduces them over the group and unpacks them. */
int ps_sum_run(ps_sum *s, hearth_err *err);

#endif
