/* model_shape.h - the shape of a vision-language model, as read from a preset.
 *
 * Part of the pure model-shape/layout rules module (trainer/shape/): no kernels, no
 * communication, no I/O beyond reading a preset file.  The orchestrator links it too.
 *
 * A preset (contrib/models/NAME.yaml) has three top-level mappings, `encoder`,
 * `projector` and `decoder` (encoder and projector absent for text-only models such as
 * gpt2-124m), plus `name`.  Field names in YAML are the struct member names below,
 * nested as written (e.g. `decoder.moe.experts`, `encoder.rope_theta`). */
#ifndef HEARTH_MODEL_SHAPE_H
#define HEARTH_MODEL_SHAPE_H

#include <stdint.h>

#include "shape/err.h"

typedef enum { NORM_RMSNORM = 0, NORM_LAYERNORM = 1 } norm_kind;
typedef enum { MLP_SWIGLU = 0, MLP_GELU = 1 } mlp_kind;
/* rope: 1-D RoPE; mrope: multimodal RoPE with [t,h,w] sections; rope2d: 2-D RoPE over
 * (row, column) of vision patches; learned: a learned absolute position table. */
typedef enum { POS_ROPE = 0, POS_MROPE = 1, POS_ROPE2D = 2, POS_LEARNED = 3 } pos_kind;
/* GELU flavour where mlp == MLP_GELU: tanh approximation (GPT-2) or exact erf. */
typedef enum { GELU_TANH = 0, GELU_ERF = 1 } gelu_kind;

/* Activation recomputation of a stack (docs/config.md "train.recompute"). */
typedef enum { RECOMPUTE_NONE = 0, RECOMPUTE_SELECTIVE = 1, RECOMPUTE_FULL = 2 } recompute_kind;

#define SHAPE_MAX_FULL_ATTN 64

/* One transformer stack (the encoder's ViT blocks or the decoder's LLM blocks). */
typedef struct {
    int layers;
    int hidden;
    int ffn;          /* dense MLP intermediate width */
    int heads;
    int kv_heads;     /* == heads unless grouped-query attention */
    int head_dim;
    norm_kind norm;
    float norm_eps;
    mlp_kind mlp;
    gelu_kind gelu;
    int bias_qkv;     /* bias on the q/k/v projections */
    int bias_proj;    /* bias on the attention output projection */
    int bias_mlp;     /* bias on the MLP linears */
    int qk_norm;      /* RMSNorm over head_dim on q and k (Qwen3) */
    pos_kind pos;
    int mrope_section[3]; /* pos == POS_MROPE: frequencies per [t,h,w]; sum = head_dim/2 */
    double rope_theta;
    int recompute;    /* recompute_kind (set from the run config) */
    int freeze;       /* parameters are not updated (set from the run config) */
} stack_shape;

typedef struct {
    int present;
    stack_shape s;
    int in_channels;       /* 3 */
    int patch;             /* patch side in pixels (14) */
    int temporal_patch;    /* frames per patch (2 for Qwen2.5-VL; images are repeated) */
    int spatial_merge;     /* merge side (2): spatial_merge^2 patches -> one decoder token */
    int window_px;         /* window side in pixels for windowed attention; 0 = none */
    int n_full_attn;       /* layers listed in full_attn use full attention */
    int full_attn[SHAPE_MAX_FULL_ATTN];
} encoder_shape;

/* Projector (Qwen2.5-VL patch merger): norm over the encoder width, then
 * spatial_merge^2 * encoder.hidden -> hidden -> decoder.hidden MLP. */
typedef struct {
    int present;
    int hidden;            /* MLP intermediate width */
    norm_kind norm;
    float norm_eps;
    gelu_kind gelu;
    int bias;
} projector_shape;

typedef struct {
    stack_shape s;
    int vocab;
    int tied_embeddings;
    int max_positions;     /* learned positions: table length */
    int image_token_id;    /* placeholder id of image tokens in the text stream */
    /* mixture of experts; experts == 0 means dense */
    int moe_experts;
    int moe_top_k;
    int moe_ffn;           /* per-expert intermediate width */
    int moe_shared_ffn;    /* shared-expert width, 0 = none; its output is added to the
                              routed experts' (no gate), MoE layers only */
    int moe_every;         /* MoE in layers where (layer % moe_every) == moe_every - 1; 1 = all */
    float moe_aux_coef;    /* load-balancing loss coefficient */
} decoder_shape;

typedef struct {
    char name[64];
    encoder_shape encoder;
    projector_shape projector;
    decoder_shape decoder;
} model_shape;

/* Finds a preset by name (looked up as DIR/NAME.yaml in the preset search path:
 * $HEARTH_MODELS (':'-separated directories), then the directory of the running binary's
 * ../../contrib/models and ../share/hearth/models, then ./contrib/models) or as a path
 * when `name_or_path` contains '/' or ends in .yaml, and parses it: defaults for omitted
 * keys (docs/config.md), `auto` values derived, shape_validate applied.  Errors name
 * FILE:LINE:COL; a missing name reads 'preset "NAME" not found (searched: DIRS)'. */
int preset_load(model_shape *out, const char *name_or_path, hearth_err *err);

/* Checks the internal consistency of a shape (head_dim * heads, kv_heads | heads,
 * mrope sections, even head_dim for RoPE, MoE fields, ...).  The message names the
 * offending dotted key ("decoder.kv_heads: ..."). */
int shape_validate(const model_shape *m, hearth_err *err);

/* Parameter counts (every tensor, embeddings included; tied embeddings counted once).
 * What exists (docs/config.md "Parameter and FLOP counts" has the formulas):
 *   encoder: patch embedding [hidden, in_channels*temporal_patch*patch^2] without bias;
 *     per block 2 norms, q/k/v/o (+ biases), qk_norm weights, MLP (+ biases); no final
 *     norm (the projector's norm follows).
 *   projector: norm over encoder.hidden, [merge^2*enc.hidden -> hidden -> dec.hidden]
 *     (+ biases).
 *   decoder: token embedding, learned position table (pos == learned), per block 2
 *     norms, attention as above, dense MLP or MoE (router [hidden, experts] without
 *     bias, experts, and a shared expert of width moe_shared_ffn that is simply added to
 *     the routed output: no gate), final norm, LM head (none when tied, no bias).
 *   A norm is hidden weights (rmsnorm) or weights + biases (layernorm); qk_norm is an
 *   RMSNorm of head_dim weights each for q and k. */
typedef struct {
    int64_t encoder;
    int64_t projector;
    int64_t decoder;       /* embeddings, blocks, final norm, LM head */
    int64_t total;
    int64_t active;        /* per token: only top_k of the routed experts */
    int64_t decoder_active;/* the decoder's share of active (the "A3B" of a MoE name) */
} shape_params;
void shape_count_params(const model_shape *m, shape_params *out);

/* Analytic training FLOPs (forward + backward = 3x forward, matmuls and attention
 * scores only), Megatron/PaLM convention: 6 x (matmul weights a token passes through:
 * attention and MLP linears, top_k experts and the router, the LM head; not the
 * embedding lookup, norms or biases) + 12 x layers x heads x head_dim x (tokens
 * attended), without halving for the causal mask.
 *   decoder_per_token: per decoder token at sequence length seq_len.
 *   encoder: an image of N patches costs N * encoder_per_patch + N^2 * encoder_per_patch_sq:
 *     encoder_per_patch has the linears (patch embedding included) and windowed layers'
 *     attention with (window_px/patch)^2 patches per window (an upper bound for images
 *     smaller than a window); encoder_per_patch_sq has the full-attention layers
 *     (every layer when window_px == 0).
 *   projector_per_patch: the projector's linears per encoder patch. */
typedef struct {
    double decoder_per_token;
    double encoder_per_patch;
    double encoder_per_patch_sq;
    double projector_per_patch;
} shape_flops;
void shape_count_flops(const model_shape *m, int seq_len, shape_flops *out);

#endif
