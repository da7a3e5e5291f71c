/* mem_plan_parts.h - pieces of the memory plan shared by mem_plan.c (the rank, its
 * tensors and optimizer buckets, the pipeline replay) and mem_plan_act.c (the activation
 * arenas).  Not a public API. */
#ifndef HEARTH_MEM_PLAN_PARTS_H
#define HEARTH_MEM_PLAN_PARTS_H

#include <stdint.h>

#include "shape/mem_plan.h"

/* One stack's local sizes on a rank (the model's stack_cfg after stack_cfg_split). */
typedef struct {
    const stack_shape *s;
    int H, Hq, Hkv, D, QD, KD, QKV, F, Fu;
    int E, K, Fm, Fs, El, ep;
    int tp, kv_rep;
    int every;              /* MoE in layers gl % every == every - 1 (E > 0) */
    int sp;                 /* sequence parallel on (decoder, tp > 1) */
    int cp;                 /* context parallel size (decoder; 1 for the encoder) */
    int chunks;             /* parallel.chunks (decoder; 1 for the encoder) */
    int gpu;                /* device cuda: the head holds more logits at once */
} mp_stack;

/* Elements of activation buffers, per category (floats and ints apart: their sizes
 * differ on cuda), and the doubles of the cross-entropy. */
typedef struct {
    int64_t f[MEM_CATEGORIES];
    int64_t i[MEM_CATEGORIES];
    int64_t lse_doubles;
    int64_t logit_floats;   /* logits (dlogits in place), losses, cmax: fp32 everywhere */
    int64_t arena_floats;   /* the block arenas (model_stack_activation_bytes / 4) */
} mp_elems;

/* Fills the local sizes of a stack split over tp and ep (E = 0: dense). */
void mp_stack_init(mp_stack *st, const stack_shape *s, int tp, int sp, int E, int K, int Fm,
                   int Fs, int ep, int every);

/* The block arena of L layers (global indices first ..) for N tokens, Nl of them local
 * (stack_take in trainer/model/block.c, each buffer rounded up to 16 elements): MoE
 * buffers to MEM_MOE, the rest to `cat`. */
void mp_stack_arena(mp_elems *el, const mp_stack *st, int L, int first, int64_t N,
                    int64_t Nl, mem_category cat);

/* The key/value cache of sequence chunks (parallel.chunks; decoder.c chunk_cache_begin),
 * held once per model chunk (by the slot owning the parameters): L layers, N tokens of
 * one chunk on this rank.  Nothing when chunks == 1. */
int64_t mp_chunk_cache(mp_elems *el, const mp_stack *st, int L, int64_t N);   /* floats */

/* A decoder stage's own per-micro-batch buffers (decoder.c take/reserve) for N tokens of
 * this rank (Nf of the micro batch: N = Nf / cp, or Nf / chunks):
 * ids, positions, RoPE tables, the tp partial embedding, the final norm and the head's
 * chunk (local vocabulary rows Vl, chunk rows from the largest slice Vmax). */
void mp_stage_buffers(mp_elems *el, const mp_stack *st, int has_head, int64_t N, int64_t Nf,
                      int64_t Nl, int64_t Vl, int64_t Vmax);

/* The MoE exchange buffers under ep > 1 (moe.c, grown to the received rows R per micro
 * batch): R (3 H + 3 Fm) of the stack scratch plus R (H + 3 Fm) per MoE layer. */
void mp_moe_exchange(mp_elems *el, const mp_stack *st, int L, int first, int64_t R);

/* One encode of P patches, U merge units: encoder arena, projector arena, pixels in
 * window order, RoPE tables, index arrays and the projector output and its gradient. */
void mp_encode_buffers(mp_elems *el, const mp_stack *st, const model_shape *m, int64_t P,
                       int64_t U);

#endif
