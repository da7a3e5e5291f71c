/* model.h - the vision-language model, on any device of kdev.h (docs/device.md).
 *
 * encoder (ViT: patch embedding, blocks with 2-D RoPE and windowed/full attention) ->
 * projector (patch merger: norm, spatial_merge^2 concat, MLP) -> decoder (token
 * embedding with image positions filled by projector outputs, blocks with GQA attention
 * and the preset's positions, dense or MoE MLP, final norm, LM head, cross-entropy over
 * text targets).  Forward and backward are written out by hand on the device interface
 * (kernels/kdev.h); the cpu device is the fp32 reference.
 *
 * Ownership: model_create allocates everything the model needs (parameters, gradients,
 * activation buffers grown on demand); model_free releases it.  Batches are borrowed. */
#ifndef HEARTH_MODEL_H
#define HEARTH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "shape/err.h"
#include "shape/model_shape.h"

/* Tensor names (table order: encoder, projector, decoder; layers in order):
 *   encoder.patch_embed.weight                 [enc_hidden, C*temporal_patch*patch*patch]
 *   {encoder,decoder}.layers.L.attn_norm.{weight,bias}       bias only for layernorm
 *   {...}.layers.L.attn.qkv.{weight,bias}       [(Hq+2Hkv)*D, hidden]: q rows, k rows, v rows
 *   {...}.layers.L.attn.q_norm.weight, .attn.k_norm.weight   [D] (qk_norm)
 *   {...}.layers.L.attn.proj.{weight,bias}      [hidden, Hq*D]
 *   {...}.layers.L.mlp_norm.{weight,bias}
 *   {...}.layers.L.mlp.gate_up.{weight,bias}    swiglu [2F, hidden]: gate rows, then up rows
 *   {...}.layers.L.mlp.down.{weight,bias}       swiglu [hidden, F]
 *   {...}.layers.L.mlp.fc1.{weight,bias}, .mlp.fc2.{weight,bias}   gelu MLP
 *   decoder.layers.L.mlp.router.weight          MoE [E, hidden]
 *   decoder.layers.L.mlp.experts.gate_up.weight [E, 2*moe_ffn, hidden]
 *   decoder.layers.L.mlp.experts.down.weight    [E, hidden, moe_ffn]
 *   decoder.layers.L.mlp.shared.gate_up.weight, .mlp.shared.down.weight   (shared_ffn > 0)
 *   projector.norm.{weight,bias}, projector.fc1.{weight,bias}, projector.fc2.{weight,bias}
 *   decoder.embed.weight [vocab, hidden], decoder.pos_embed.weight [max_positions, hidden]
 *   (learned positions), decoder.final_norm.{weight,bias}, decoder.lm_head.weight
 *   (untied only; tied heads use decoder.embed.weight).
 * MoE layers have no MLP biases and an ungated shared expert.  What the backward needs is
 * kept, except what stack_shape.recompute drops (selective: norm outputs and the dense MLP
 * activation; full: all of a block's activations but its input and the MoE routing),
 * which the backward recomputes layer by layer, bitwise as the forward had it. */

/* Which slice of the full tensor a rank's tensor is, and how its gradient is reduced
 * (model_par.h says what is split how).  The full tensor is viewed as [rows, cols] with
 * cols = its last dimension (1 for a 1-D tensor) and rows = numel / cols; the local
 * tensor is the row blocks seg_row0[i] .. seg_row0[i] + seg_rows[i] - 1 for i < nseg,
 * concatenated in that order, restricted to the columns col0 .. col0 + ncols - 1, stored
 * row-major.  The single-rank model has nseg = 1 covering everything. */
typedef struct {
    int ndim;
    int64_t dims[4];        /* the full tensor's shape */
    int64_t rows, cols;     /* its [rows, cols] view */
    int nseg;               /* 1..3 */
    int64_t seg_row0[3], seg_rows[3];
    int64_t col0, ncols;
    int kv_rep;             /* > 1 (qkv weight/bias only): segments 1 and 2 (k and v rows)
                               are replicated over kv_rep consecutive ranks of the tp group
                               (those sharing the kv head); gradients summed there */
    int tp_partial;         /* the gradient is a partial sum over the component's tp group */
    int tp_replicated;      /* identical on every rank of the component's tp group (count it
                               once in norms); 0 for tensors split by tp */
    int expert;             /* routed expert weights: replicas live in the EDP group */
    int tied_copy;          /* the last stage's copy of a tied embedding shard (pp > 1) */
} model_shard;

/* One named parameter tensor, a view into the flat parameter/gradient arrays. */
typedef struct {
    char name[96];      /* e.g. "decoder.layers.3.attn.qkv.weight" */
    size_t offset;      /* in floats, into model_params()/model_grads() */
    size_t numel;
    int ndim;
    int64_t dims[4];
    int decay;          /* AdamW weight decay applies (matrices and embeddings) */
    int frozen;         /* belongs to a frozen component: never updated */
    model_shard shard;  /* this tensor's place in the full tensor (model_par.h) */
} model_tensor;

/* One micro batch.  Text: n_seq sequences of seq_len tokens, packed row-major.
 * Every image contributes grid_t*grid_h*grid_w/spatial_merge^2 consecutive tokens equal to
 * image_token_id in the text, in image order; the images' pixels are packed in the same
 * order as Qwen2-VL's processor flattens them: per image, patches in (t, h/merge, w/merge,
 * merge_h, merge_w) order, each patch [in_channels, temporal_patch, patch, patch]. */
typedef struct {
    int n_seq, seq_len;
    const int *tokens;      /* [n_seq * seq_len] */
    const int *targets;     /* [n_seq * seq_len]; -1 = no loss at this position */
    int n_images;
    const int *grid_thw;    /* [n_images * 3]: temporal, height, width in patches */
    const float *pixels;    /* [total patches, in_channels*temporal_patch*patch*patch] */
} vlm_batch;

typedef struct {
    double loss_sum;        /* sum of cross-entropy over target tokens */
    int n_targets;          /* number of target tokens (targets != -1) */
    double aux_loss;        /* sum over MoE layers of the load-balancing loss (unscaled) */
    double encoder_ms;      /* wall time spent in encoder + projector, forward and backward */
    double decoder_ms;      /* wall time spent in the decoder, forward and backward */
} model_stats;

typedef struct model model;

/* Creates the model with parameters initialised from `seed` (normal(0, 0.02) for
 * matrices and embeddings, output projections scaled by 1/sqrt(2*layers), ones for norm
 * weights, zeros for biases); identical seeds give bitwise-identical parameters. */
int model_create(model **out, const model_shape *shape, uint64_t seed, hearth_err *err);
void model_free(model *m);

const model_shape *model_get_shape(const model *m);
size_t model_param_count(const model *m);
/* The flat parameter and gradient arrays [model_param_count], in the memory of the
 * model's device (model_device; on the cpu device, host memory). */
float *model_params(model *m);
float *model_grads(model *m);
/* The device the model runs on (model_par.dev, or the cpu device it created). */
struct kdev *model_device(const model *m);
int model_tensor_count(const model *m);
const model_tensor *model_tensor_at(const model *m, int i);
const model_tensor *model_tensor_find(const model *m, const char *name);

void model_zero_grad(model *m);

/* Forward and backward of one micro batch.  Gradients ACCUMULATE:
 *   grads += d/dparams ( loss_scale * sum of token losses + aux_scale * aux_loss ).
 * The trainer passes loss_scale = 1 / (target tokens in the whole step) and
 * aux_scale = moe_aux_coef / (micro batches in the step). */
int model_forward_backward(model *m, const vlm_batch *b, float loss_scale, float aux_scale,
                           model_stats *stats, hearth_err *err);

/* model_forward_backward with every sequence cut into K chunks of seq_len / K tokens run
 * one after the other (parallel.chunks, docs/parallel/chunks.md): the encoder once, the
 * chunks' forwards 0 .. K-1, their backwards K-1 .. 0, the encoder backward.  The same
 * loss and gradients as K = 1 up to fp32 reordering; activations are kept per chunk, plus
 * the key/value cache.  The K - 1 clones running chunks 1 .. K-1 are kept in m (freed with
 * it).  K <= 1 is model_forward_backward. */
int model_forward_backward_chunks(model *m, const vlm_batch *b, int K, float loss_scale,
                                  float aux_scale, model_stats *stats, hearth_err *err);

/* Forward only (no gradients touched).
 * Both functions OVERWRITE *stats (which may be NULL) with this micro batch's numbers. */
int model_forward(model *m, const vlm_batch *b, model_stats *stats, hearth_err *err);

/* The MoE routing of the last forward: the top-k expert indices of every MoE layer
 * ([tokens, top_k] per layer, layers in order), up to cap of them copied into out (out
 * may be NULL).  Returns the total count (0 for a dense model).  For tests: finite
 * differences must skip perturbations that change the routing. */
size_t model_last_routing(const model *m, int *out, size_t cap);

/* Bytes of the encoder's and decoder's block activation arenas as last reserved (what
 * train.recompute / model.*.recompute shrink): for tests and memory reports. */
size_t model_stack_activation_bytes(const model *m);
/* Bytes of the key/value cache of sequence chunks (parallel.chunks) this model owns (0
 * for a clone, which borrows its owner's, and without chunks). */
size_t model_chunk_cache_bytes(const model *m);

/* The decoder's final-norm output of the last forward, [*n_tokens, *hidden] row-major
 * (every position, image tokens included; under context parallelism this rank's
 * positions, model_par.h): the LM head's input, so logits = hidden x head weight^T, in the
 * device's memory.  For checks against other implementations.  NULL when this model holds
 * no LM head or has not run a forward.  Valid until the next forward. */
const float *model_last_hidden(const model *m, int *n_tokens, int *hidden);

/* For gradient checks: makes later forwards use these top-k experts (the layout of
 * model_last_routing, for a batch of the same size) instead of choosing them, so that the
 * loss is a smooth function of the parameters around the pinned point.  idx == NULL
 * unpins.  The copy is owned by the model; on error the previous pin stays.  A forward on
 * a batch of another size fails while pinned. */
int model_pin_routing(model *m, const int *idx, size_t n, hearth_err *err);

/* Multimodal RoPE positions (Qwen2-VL get_rope_index) for one sequence:
 * pos3 [3, seq_len].  Text tokens advance all three rows together; an image's tokens
 * take (t, h, w) of their merged grid offset by the running position; the text after an
 * image continues from max(position)+1.  `img_cursor` is the index of the first image
 * whose tokens may appear in this sequence and is advanced past the images consumed. */
int model_mrope_positions(int *pos3, const int *tokens, int seq_len, int image_token_id,
                          const int *grid_thw, int n_images, int spatial_merge,
                          int *img_cursor, hearth_err *err);

#endif
