/* cp_attn.c - attention under context parallelism (model_par.h, docs/parallel/cp.md):
 * the ring exchange of key/value blocks over the cp group.
 *
 * Every cp rank holds the same number N of local tokens (two chunks of every sequence),
 * so every block has the shape of the local one and the ring moves fixed-size messages.
 * Step i of the ring gives rank c the block of rank (c - i) mod cp: its own first, then
 * each block passed on by the previous rank.  The positions of any rank's tokens are
 * known everywhere (ctx->cp_pos), so only k and v travel.
 *   forward   cp - 1 shifts of [k | v]; each block merged into (att, lse) with
 *             kcpu_attention_block_forward (online softmax; a block wholly in the future
 *             of every query costs only the position test).
 *   backward  the block travels as [k | v | dk | dv]: each rank adds its queries' share of
 *             dk and dv to the accumulators of the block it holds and passes it on; after
 *             cp shifts every block is back at its owner with the contributions of every
 *             rank's queries.  dq stays local.
 * Every rank of the group makes the same sequence of sendrecvs (one per shift). */
#include <math.h>

#include "model/internal.h"

#define CP_TAG 0x4350   /* "CP" */

int cp_attention_forward(kdev *dev, comm *cp, float *ring, float *att, float *lse,
                         const float *q, const float *k, const float *v, const int *cu,
                         int nseq, int max_seq, const int *cp_pos, int N, int Hq, int Hkv,
                         int D, hearth_err *err)
{
    int n = comm_size(cp), c = comm_rank(cp);
    size_t kd = (size_t)N * Hkv * D;
    float *cur = ring, *nxt = ring + 2 * kd;
    kdev_fill(dev, lse, (size_t)N * Hq, -INFINITY);
    kdev_copy(dev, cur, k, kd * sizeof(float));
    kdev_copy(dev, cur + kd, v, kd * sizeof(float));
    for (int step = 0; step < n; step++) {
        int src = ((c - step) % n + n) % n;
        if (step + 1 < n) {
            int rc = comm_sendrecv(cp, cur, 2 * kd, (c + 1) % n, nxt, 2 * kd, (c + n - 1) % n,
                                   COMM_F32, CP_TAG, err);
            if (rc)
                return herr_prefix(err, rc, "decoder: context-parallel attention");
        }
        kdev_attention_block_forward(dev, att, lse, q, cur, cur + kd, cu,
                                     cp_pos + (size_t)c * N, cu, cp_pos + (size_t)src * N,
                                     nseq, max_seq, max_seq, Hq, Hkv, D, 1);
        float *t = cur;
        cur = nxt;
        nxt = t;
    }
    return dev_check(dev, err);
}

int cp_attention_backward(kdev *dev, comm *cp, float *ring, float *dq, float *dk, float *dv,
                          const float *datt, const float *q, const float *k, const float *v,
                          const float *att, const float *lse, const int *cu, int nseq,
                          int max_seq, const int *cp_pos, int N, int Hq, int Hkv, int D,
                          hearth_err *err)
{
    int n = comm_size(cp), c = comm_rank(cp);
    size_t kd = (size_t)N * Hkv * D;
    float *cur = ring, *nxt = ring + 4 * kd;
    kdev_copy(dev, cur, k, kd * sizeof(float));
    kdev_copy(dev, cur + kd, v, kd * sizeof(float));
    kdev_zero(dev, cur + 2 * kd, 2 * kd * sizeof(float));
    for (int step = 0; step < n; step++) {
        int src = ((c - step) % n + n) % n;
        kdev_attention_block_backward(dev, dq, cur + 2 * kd, cur + 3 * kd, datt, q, cur,
                                      cur + kd, att, lse, cu, cp_pos + (size_t)c * N, cu,
                                      cp_pos + (size_t)src * N, nseq, max_seq, max_seq, Hq,
                                      Hkv, D, 1);
        int rc = comm_sendrecv(cp, cur, 4 * kd, (c + 1) % n, nxt, 4 * kd, (c + n - 1) % n,
                               COMM_F32, CP_TAG, err);
        if (rc)
            return herr_prefix(err, rc, "decoder: context-parallel attention backward");
        float *t = cur;
        cur = nxt;
        nxt = t;
    }
    /* cur is this rank's own block again, carrying every rank's share */
    kdev_accumulate(dev, dk, cur + 2 * kd, kd);
    kdev_accumulate(dev, dv, cur + 3 * kd, kd);
    return dev_check(dev, err);
}
