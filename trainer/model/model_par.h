/* model_par.h - the model split over ranks: one rank's shard of the VLM.
 *
 * A rank holds a *local model*: the same code as the single-rank model (model.h), built
 * from the full shape and a model_par that says which part this rank holds and which
 * groups it talks to.  Parameters are this rank's shards of the full tensors, named as
 * the full tensors (global layer indices), each with a model_shard saying which slice of
 * the full tensor it is and how its gradient must be reduced (see model.h).
 *
 * What is split, and how (tp = size of the component's tensor-parallel group, t = rank):
 *   attention   qkv column-parallel by heads: q heads [t*Hq/tp, (t+1)*Hq/tp); kv heads
 *               [t*Hkv/tp, ...) when tp <= Hkv, else the single kv head t*Hkv/tp that
 *               this rank's q heads use (replicated over the tp/Hkv ranks sharing it:
 *               model_shard.kv_rep); proj row-parallel (columns of the same q heads),
 *               outputs summed over tp, bias added once after the sum.
 *               q_norm/k_norm weights are replicated but see only local heads: their
 *               gradients are partial over tp (model_shard.tp_partial).
 *   dense MLP   gate_up / fc1 column-parallel (gate rows and up rows each split in tp
 *               contiguous blocks), down / fc2 row-parallel.  Requires ffn % tp == 0.
 *   MoE MLP     not split by tp: every tp rank computes the MoE layer over all tokens of
 *               the micro batch (identical results, identical gradients).  Experts are
 *               split over the ep group: rank e holds experts [e*E/ep, (e+1)*E/ep);
 *               routed rows go to their expert's owner with all_to_allv and come back
 *               the same way.  The router and the shared expert are replicated.
 *   embedding   vocab-parallel: rows [v0, v1) with v0 = t*V/tp (integer division,
 *               so any V works); lookups outside the range give zeros and the partial
 *               embeddings are summed over tp.
 *   LM head     vocab-parallel the same way, with a parallel cross-entropy (max, sum of
 *               exponentials and the target logit reduced over tp), so logits are never
 *               gathered.  Tied: the head is the embedding shard.  With pp > 1 and tied
 *               embeddings the last stage holds its own copy of the embedding shard
 *               (model_shard.tied_copy), kept equal by summing the two gradients.
 *   norms, biases of row-parallel linears, positions table, projector, patch embedding:
 *               replicated.
 *   sequence parallel (decoder only, par.sp): the residual stream, norms and the
 *               dropout-free elementwise work hold tokens [t*N/tp, (t+1)*N/tp) of the
 *               micro batch's N tokens (N % tp == 0 required); all-gather before the
 *               column-parallel linears, reduce-scatter after the row-parallel ones.
 *               Norm weights/biases and row-parallel biases then see local tokens only:
 *               their gradients are partial over tp (model_shard.tp_partial).
 *   context parallel (decoder only, par.cp; docs/parallel/cp.md): every sequence of
 *               seq_len tokens is cut into 2 cp equal chunks and cp rank c holds chunks c
 *               and 2 cp - 1 - c of every sequence (the rank's N / cp tokens, sequence by
 *               sequence, the two chunks in order; under sp further split by tp as
 *               above).  Everything per token (embedding, norms, MLP, MoE, residuals,
 *               head) runs on those tokens; positions are computed for the whole sequence
 *               and the local rows taken.  Attention passes key/value blocks around the
 *               cp group (cp_attn.c) with the causal mask from the global positions.
 *               Every parameter gradient is then partial over cp (summed with the data-
 *               parallel replicas over DP_CP); the loss and target counts are summed over
 *               cp, and the MoE aux loss reduces its router statistics over cp, so the
 *               stats are the whole micro batch's on every cp rank.
 *   pipeline    the decoder layers [first_layer, first_layer + n_layers) of a stage; the
 *               embedding (and learned positions) on the stage with has_embed, the final
 *               norm and head on the stage with has_head.  Stage activations are
 *               [local tokens, hidden] (local tokens = N/cp/tp under sp, else N/cp).
 *   encoder     (has_encoder) the ViT with its own tp group (enc_tp), no sp; projector
 *               replicated.  Which images a rank encodes is the caller's business.
 *
 * Ownership: model_par holds borrowed comm handles; they must outlive the model.
 * Every model created with model_create_par on the ranks of a group must make the same
 * sequence of collective calls: the caller runs the same micro batches in the same order
 * on every member of a tp / ep group. */
#ifndef HEARTH_MODEL_PAR_H
#define HEARTH_MODEL_PAR_H

#include "comm/comm.h"
#include "kdev.h"
#include "model/model.h"

typedef struct {
    /* decoder */
    int has_decoder;          /* 0: encoder (+projector) only (full_separation ranks off
                                 stage 0 still hold a decoder; this is for tests) */
    comm *tp;                 /* decoder tensor-parallel group; NULL = size 1 */
    int sp;                   /* sequence parallel over tp */
    comm *ep;                 /* expert-parallel group; NULL = size 1 (all experts) */
    comm *cp;                 /* context-parallel group; NULL = size 1 */
    int first_layer;          /* global index of this stage's first decoder layer */
    int n_layers;             /* decoder layers on this stage (>= 1 when has_decoder) */
    int has_embed;            /* token embedding (+ learned positions) here */
    int has_head;             /* final norm + LM head + loss here */
    /* encoder and projector */
    int has_encoder;
    comm *enc_tp;             /* encoder tensor-parallel group; NULL = size 1 */
    /* where the model's tensors live and its work runs (kdev.h); NULL = a cpu device the
     * model creates and owns.  Borrowed: it must outlive the model. */
    kdev *dev;
} model_par;

/* The model_par of the single-rank model: everything, no groups.  model_create is
 * model_create_par with it, and model_forward_backward is model_encode_forward,
 * model_stage_forward, model_stage_backward, model_encode_backward on that model. */
void model_par_single(model_par *p, const model_shape *full);

/* Creates this rank's local model.  Parameters are initialised as model_create would
 * initialise the FULL model with `seed`, then sliced (so every layout starts from the
 * single-rank parameters bit for bit).  HERR_CONFIG when the shape cannot be split this
 * way (the message names the dimension, e.g. "decoder.ffn 96 is not divisible by tp 5"). */
int model_create_par(model **out, const model_shape *full, const model_par *par,
                     uint64_t seed, hearth_err *err);

/* A second set of activation buffers on the same parameters and gradients: the caller
 * runs one in-flight micro batch per clone (pipeline 1F1B, deferred encoder backward).
 * The clone borrows owner's parameters, gradients and groups; free it with model_free
 * before the owner. */
int model_clone(model **out, model *owner, hearth_err *err);

const model_par *model_get_par(const model *m);

/* ---- the encoder (+ projector) ---------------------------------------------------------
 * Encodes n_images images (grid_thw, pixels as in vlm_batch) into model_img_feat:
 * one row of decoder width per merged unit, images in the given order.  Activations are
 * kept in this model object for model_encode_backward (one pending encode per object). */
int model_encode_forward(model *m, int n_images, const int *grid_thw, const float *pixels,
                         hearth_err *err);
/* rows [n_units, decoder hidden]; *n_units set when not NULL.  Valid until the next
 * encode on this object. */
float *model_img_feat(model *m, int *n_units);
/* The gradient of the last encode's output, [n_units, decoder hidden], written by the
 * caller before model_encode_backward (which reads it). */
float *model_img_grad(model *m);
/* Backward of the last encode: accumulates encoder (unless frozen) and projector
 * gradients. */
int model_encode_backward(model *m, hearth_err *err);

/* ---- one pipeline stage of the decoder -----------------------------------------------
 * Forward of micro batch b on this stage.
 *   has_embed: embeds b->tokens; image-token rows take img (rows in image order,
 *              n_img_rows of them, decoder hidden; may be NULL when there are none).
 *              Under cp every image row of the micro batch is passed; the stage takes
 *              the rows at its tokens.
 *   else:      x_in holds the previous stage's output [local tokens, hidden].
 *   has_head:  computes the loss: stats->loss_sum and n_targets are the whole micro
 *              batch's (equal on every tp rank), aux_loss this stage's MoE layers'.
 *   else:      the output is model_stage_output.
 * The stage keeps its activations for model_stage_backward (one pending micro batch per
 * object; use clones for more). */
int model_stage_forward(model *m, const vlm_batch *b, const float *img, int n_img_rows,
                        const float *x_in, model_stats *stats, hearth_err *err);
/* Sequence chunks (parallel.chunks, docs/parallel/chunks.md): the next stage forward on
 * this object runs chunk `chunk` (of n_chunks K) of every sequence: seq_len / K tokens
 * per sequence (the stage activations, model_local_tokens, are per chunk).  The chunks
 * of one micro batch run on distinct objects of one owner (the model and its clones) in
 * the order 0 .. K-1 forward and K-1 .. 0 backward, with no other micro batch's chunk on
 * these objects in between: attention keeps the earlier chunks' keys and values, and
 * their gradients, in a per-layer cache held by the owner (one micro batch in flight per
 * owner).  The embedding stage takes every image row of the micro batch, as under cp;
 * its backward writes the rows at the chunk's tokens, and chunk K-1's (the first) zeroes
 * the others first, so after chunk 0 img_grad is complete.  K = 1 (the default) is the
 * unchunked stage.  HERR_CONFIG with cp > 1. */
int model_stage_set_chunk(model *m, int chunk, int n_chunks, hearth_err *err);
/* [local tokens, hidden]; valid until the next stage call on this object. */
const float *model_stage_output(const model *m, size_t *n_floats);
/* Backward of the pending micro batch.  has_head: starts from the loss with loss_scale;
 * else dy is the gradient of this stage's output.  aux_scale weights the MoE loss.
 * Gradients accumulate into the parameters' gradients.
 *   has_embed: the gradient of the image rows is written to img_grad (n_img_rows rows,
 *              NULL when not needed); else model_stage_input_grad is the gradient of
 *              x_in.  Under cp: the rows at this rank's tokens, zeros elsewhere (the
 *              encoder gradient is then partial over cp). */
int model_stage_backward(model *m, const float *dy, float loss_scale, float aux_scale,
                         float *img_grad, hearth_err *err);
/* [local tokens, hidden]; valid until the next stage call on this object.  Under sp,
 * img_grad still gets every image row on every tp rank. */
const float *model_stage_input_grad(const model *m, size_t *n_floats);

/* ---- two micro batches at once (parallel.a2a_overlap) ----------------------------------
 * The stage forward in two halves: model_stage_forward is model_stage_forward_begin
 * followed by model_stage_forward_pair({m, NULL}).  Begin takes what model_stage_forward
 * takes and does the part before the decoder layers (checks, positions, the embedding and
 * image rows, or the copy of x_in; img and x_in are not read after it returns, so the
 * caller may reuse them for the next micro batch); the pair call runs the layers and the
 * head.
 *
 * model_stage_forward_pair(m, stats): m[0] and m[1] are two begun objects of the same
 * stage (a model and its clone, or two clones; m[1] NULL: m[0] alone), each carrying its
 * own micro batch.  Their decoder layers run interleaved: a MoE layer is cut into
 * attention / dispatch / experts / combine nodes and the two micro batches alternate so
 * that one's all_to_allv sits between the other's compute (on GPU the all-to-all would go
 * on a communication stream; on the local backend the order is all that changes).  Dense
 * layers run whole, one micro batch after the other.  stats[i] as model_stage_forward's
 * for m[i] (stats may be NULL).  Afterwards both are pending, as after
 * model_stage_forward.
 *
 * model_stage_backward_pair(m, dy, loss_scale, aux_scale, img_grad): the backward of two
 * pending objects of one stage (m[1] NULL: m[0] alone, which is model_stage_backward),
 * interleaved the same way; dy[i] and img_grad[i] as model_stage_backward's for m[i].
 *
 * Results.  Each micro batch's arithmetic is unchanged, and every parameter gradient
 * gets m[0]'s contribution before m[1]'s, as when the two run one after the other (the
 * head first, then the layers, then the embedding); so outputs, losses, input gradients
 * and parameter gradients are bitwise those of the sequential calls.  The one exception
 * is a tied head and embedding on the same stage: the pair adds both heads' gradients
 * before both embeddings' (the sequential order interleaves them), which is the same sum
 * in another fp32 order.  Every rank of a tp and ep group must pair the same micro
 * batches (the collectives run in node order). */
int model_stage_forward_begin(model *m, const vlm_batch *b, const float *img, int n_img_rows,
                              const float *x_in, hearth_err *err);
int model_stage_forward_pair(model *const m[2], model_stats stats[2], hearth_err *err);
int model_stage_backward_pair(model *const m[2], const float *const dy[2], float loss_scale,
                              float aux_scale, float *const img_grad[2], hearth_err *err);

/* Tokens this rank holds in the stage activations for a micro batch of n tokens
 * (n / cp / tp under sp, else n / cp; with sequence chunks n / K for cp: the chunk's, K
 * as last set by model_stage_set_chunk). */
int model_local_tokens(const model *m, int n_tokens);

#endif
