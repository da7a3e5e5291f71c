/* chunk_attn.c - attention of one sequence chunk (parallel.chunks, model_par.h,
 * docs/parallel/chunks.md) against the key/value cache of the earlier chunks of its
 * micro batch (internal.h chunk_cache).
 *
 * Every chunk holds the same C tokens of each sequence, so every cached block has the
 * query block's shape and the sequence boundaries cu serve both.  Positions come from
 * cc->pos; the causal mask is decided by them exactly as in the unchunked attention, so
 * the result is kcpu_attention_forward's over the whole sequences up to the order of the
 * fp32 sums (the same kernel the cp ring uses).
 *   forward   blocks 0 .. j-1 from the cache (wholly in the past: unmasked), then the
 *             chunk's own (causal), merged into (att, lse) by the online softmax; the
 *             chunk's k, v then go to slot j (not for the last chunk, which nobody reads).
 *             A recomputed forward (train.recompute) writes the same values again.
 *   backward  chunks run K-1 .. 0.  The first (chunk K-1) zeroes the gradient slots of
 *             the layer; each chunk adds its queries' share of the cached keys' gradients
 *             into their slots, then its own slot, complete since every later chunk is
 *             done, into its dk, dv. */
#include <math.h>

#include "model/internal.h"

void chunk_attention_forward(kdev *dev, const chunk_cache *cc, int l, int j, float *att,
                             float *lse, const float *q, const float *k, const float *v,
                             const int *cu, int nseq, int N, int Hq, int Hkv, int D,
                             int causal)
{
    const int *qpos = cc->pos + (size_t)j * N;
    int C = cc->C;   /* every sequence has C tokens in every chunk */
    kdev_fill(dev, lse, (size_t)N * Hq, -INFINITY);
    for (int i = 0; i < j; i++)
        kdev_attention_block_forward(dev, att, lse, q, chunk_cache_at(cc, l, 0, i),
                                     chunk_cache_at(cc, l, 1, i), cu, qpos, cu,
                                     cc->pos + (size_t)i * N, nseq, C, C, Hq, Hkv, D, causal);
    kdev_attention_block_forward(dev, att, lse, q, k, v, cu, qpos, cu, qpos, nseq, C, C, Hq,
                                 Hkv, D, causal);
    if (j < cc->K - 1) {
        kdev_copy(dev, chunk_cache_at(cc, l, 0, j), k, (size_t)N * Hkv * D * sizeof(float));
        kdev_copy(dev, chunk_cache_at(cc, l, 1, j), v, (size_t)N * Hkv * D * sizeof(float));
    }
}

void chunk_attention_backward(kdev *dev, const chunk_cache *cc, int l, int j, float *dq,
                              float *dk, float *dv, const float *datt, const float *q,
                              const float *k, const float *v, const float *att,
                              const float *lse, const int *cu, int nseq, int N, int Hq,
                              int Hkv, int D, int causal)
{
    size_t nk = (size_t)N * Hkv * D;
    const int *qpos = cc->pos + (size_t)j * N;
    int C = cc->C;
    if (j == cc->K - 1)
        for (int i = 0; i < j; i++) {
            kdev_zero(dev, chunk_cache_at(cc, l, 2, i), nk * sizeof(float));
            kdev_zero(dev, chunk_cache_at(cc, l, 3, i), nk * sizeof(float));
        }
    kdev_attention_block_backward(dev, dq, dk, dv, datt, q, k, v, att, lse, cu, qpos, cu,
                                  qpos, nseq, C, C, Hq, Hkv, D, causal);
    for (int i = 0; i < j; i++)
        kdev_attention_block_backward(dev, dq, chunk_cache_at(cc, l, 2, i),
                                      chunk_cache_at(cc, l, 3, i), datt, q,
                                      chunk_cache_at(cc, l, 0, i), chunk_cache_at(cc, l, 1, i),
                                      att, lse, cu, qpos, cu, cc->pos + (size_t)i * N, nseq, C,
                                      C, Hq, Hkv, D, causal);
    if (j < cc->K - 1) {
        kdev_accumulate(dev, dk, chunk_cache_at(cc, l, 2, j), nk);
        kdev_accumulate(dev, dv, chunk_cache_at(cc, l, 3, j), nk);
    }
}
