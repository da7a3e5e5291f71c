/* mem_plan.h - predicted peak memory per rank of a resolved run config (docs/memory.md).
 *
 * Part of the pure model-shape/layout rules module: no allocation of model memory, no
 * kernels, no communication.  hearth-train prints it (--plan-memory) and writes it into
 * result.json; the orchestrator's plan prunes layouts that do not fit resources.gpu_mem.
 *
 * What is counted, per rank (its decoder tp rank t and pipeline rank p decide it; the cp
 * and dp coordinates only pick which part of a sharded optimizer bucket it owns):
 *   params      this rank's shards of the parameters of its vpp model chunks (model_par.h:
 *               heads/ffn/vocab split by tp, experts by ep, the encoder by the encoder's
 *               tp where this rank holds it, the tied head copy on the last stage)
 *   grads       a gradient per local parameter (frozen ones included: the array is whole)
 *   optimizer   AdamW m and v, plus fp32 master weights on cuda, for the rank's own part
 *               of each replica bucket (encoder DP, expert DP, dense DP x CP): all of it,
 *               or 1/n of it (rounded up) with parallel.distributed_optimizer (ZeRO-1)
 *   opt_buffers the flat gradient and parameter buckets of the optimizer's collectives
 *               (cpu) and the packing buffers of the tp-partial / kv-replica /
 *               tied-embedding gradient sums
 *   activations the decoder blocks' activation and backward-scratch arenas, one per micro
 *               batch in flight on each chunk (the pipeline schedule's count, see below),
 *               after train.recompute (block.c: selective shares norm outputs and the MLP
 *               activation across layers, full shares everything but the layer inputs)
 *   moe         MoE routing and expert-row buffers of those arenas, plus, under ep > 1,
 *               the received-row exchange buffers (an ESTIMATE: balanced routing, every
 *               ep rank receives N * top_k rows per micro batch)
 *   logits      the LM head's chunked logits and their gradient, the cross-entropy's
 *               statistics (last stage only), per micro batch in flight
 *   stage       the rest of a stage's per-micro-batch buffers: token ids, positions, RoPE
 *               tables, the tp partial embedding, the final norm, the received stage input
 *   encoder     encoder + projector activations of the encodes pending at once (uniform /
 *               hetero_tp / hetero_dp: a group per R = tp / encoder.tp micro batches on
 *               stage 0, held until the group's last backward; full_separation: one
 *               encode of this rank's share of all micro batches of the step, every rank)
 *   embeddings  image embeddings and their gradients kept per micro batch of the step, and
 *               the gather buffer; with parallel.encoder.offload the step's embeddings
 *               move to host memory (host_bytes) and one working micro batch stays
 *   inputs      the step's micro batches as materialised: token ids, targets, pixels
 * Image counts and sizes are data-dependent: the plan takes the largest the data.* keys
 * allow (images_max images of image_px_max pixels per sequence, bounded by seq_len), so
 * encoder, embedding and input figures are upper bounds for synthetic data.
 *
 * Tokens: a micro batch has micro_batch * seq_len tokens; context parallelism divides the
 * decoder's tokens by parallel.cp (tokens per rank = seq_len / cp), sequence parallelism
 * divides the residual stream by tp.
 *
 * Pipeline: the op list of pp_schedule.h is replayed for the rank's stage: 1F1B keeps up
 * to min(pp - p, M) micro batches of stage p in flight, interleaved (vpp > 1) more, per
 * chunk as the schedule has them (M = micro batches of this dp rank; units of two under
 * parallel.a2a_overlap with MoE).
 *
 * Bytes per element:
 *   device cpu   fp32 (4 bytes) for everything; ints 4; the cross-entropy's log-sum-exp
 *                in double.  For the CPU trainer params, grads, optimizer, opt_buffers and
 *                the activation arenas are exactly what it allocates (test_mem_plan).
 *   device cuda  ASSUMED: bf16 (2) compute weights and activations (logits 4: the
 *                cross-entropy runs in fp32), fp32 gradients (4), fp32 master weights, m and
 *                v (12 per owned element); gradients reduced in place in their contiguous
 *                buffer and parameters all-gathered into the bf16 weights (Megatron's
 *                distributed optimizer), so opt_buffers holds only the gradient-sum
 *                packing.  Element counts are the CPU trainer's; CUDA workspaces
 *                (cuBLASLt, NCCL, the caching allocator's fragmentation) are not counted,
 *                so leave headroom.
 * Host-side data (the run config, the op lists, small index arrays) is not counted. */
#ifndef HEARTH_MEM_PLAN_H
#define HEARTH_MEM_PLAN_H

#include <stdint.h>

#include "shape/err.h"
#include "shape/run_config.h"

typedef enum {
    MEM_PARAMS = 0,
    MEM_GRADS,
    MEM_OPTIMIZER,
    MEM_OPT_BUFFERS,
    MEM_ACTIVATIONS,
    MEM_MOE,
    MEM_LOGITS,
    MEM_STAGE,
    MEM_ENCODER,
    MEM_EMBEDDINGS,
    MEM_INPUTS,
    MEM_CATEGORIES
} mem_category;

/* "params", "grads", "optimizer", "opt_buffers", "activations", "moe", "logits", "stage",
 * "encoder", "embeddings", "inputs". */
const char *mem_category_name(mem_category k);

/* One rank's prediction.  Counts are elements (what the trainer allocates), bytes apply
 * the device's bytes per element. */
typedef struct {
    int rank;                   /* world rank */
    int t, c, d, p;             /* its decoder tp, cp, dp and pipeline coordinates */
    int has_encoder;            /* holds encoder + projector parameters */
    int encodes;                /* runs encodes (and how many at most at once: enc_slots) */
    int enc_slots;
    int slots;                  /* decoder micro batches in flight, summed over chunks */
    int64_t params;             /* local parameter elements, all chunks */
    int64_t opt_owned;          /* elements whose AdamW state this rank keeps */
    int64_t stack_arena_floats; /* sum over decoder slots and encoder slots of the block
                                   arenas: what model_stack_activation_bytes / 4 sums to */
    int64_t chunk_cache_floats; /* parallel.chunks: the key/value caches (one per model
                                   chunk, in bytes[MEM_ACTIVATIONS]): what
                                   model_chunk_cache_bytes / 4 sums to */
    int64_t bytes[MEM_CATEGORIES];
    int64_t total;              /* sum of bytes[] (device memory) */
    int64_t host_bytes;         /* offloaded to host memory (full_separation + offload) */
} mem_rank_plan;

/* The prediction for world rank `rank` of a resolved, valid config (run_config_load /
 * _parse succeeded).  HERR_CONFIG when the rank is out of range or the layout cannot be
 * planned (the message names the key). */
int mem_plan_rank(const run_config *c, int rank, mem_rank_plan *out, hearth_err *err);

/* The rank with the largest total in pipeline stage p (ranks of a stage differ only by
 * their tp rank's vocabulary slice; cp and dp coordinates 0 are taken, whose optimizer
 * part is the largest). */
int mem_plan_stage(const run_config *c, int p, mem_rank_plan *out, hearth_err *err);

/* The largest total over every stage (ties: the lowest rank). */
int mem_plan_peak(const run_config *c, mem_rank_plan *out, hearth_err *err);

/* Rule fits_gpu_mem (docs/config.md), the orchestrator's plan-time check of a device
 * cuda run against resources.gpu_mem: the predicted peak of every rank must fit
 * gpu_mem_gib GiB (2^30 bytes).  Returns 0 when it fits, when the device is not cuda or
 * when gpu_mem_gib <= 0 (no limit); else HERR_CONFIG with "rule fits_gpu_mem: rank R
 * (pipeline stage P, tp rank T) needs X GiB, more than resources.gpu_mem Y GiB (...)". */
int mem_plan_check_gpu_mem(const run_config *c, double gpu_mem_gib, hearth_err *err);

#endif
