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
    int recompute;    /* 0 none, 1 selective, 2 full (set from the run config) */
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
    int moe_shared_ffn;    /* shared-expert intermediate width, 0 = none */
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
 * $HEARTH_MODELS, then the directory of the running binary's ../../contrib/models and
 * ../share/hearth/models, then ./contrib/models) or as a path when `name_or_path`
 * contains '/' or ends in .yaml, and parses it.  Errors name FILE:LINE:COL. */
int preset_load(model_shape *out, const char *name_or_path, hearth_err *err);

/* Checks the internal consistency of a shape (head_dim * heads, kv_heads | heads,
 * mrope sections, even head_dim for RoPE, MoE fields, ...).  The message names the
 * offending dotted key ("decoder.kv_heads: ..."). */
int shape_validate(const model_shape *m, hearth_err *err);

/* Parameter counts (every tensor, embeddings included; tied embeddings counted once). */
typedef struct {
    int64_t encoder;
    int64_t projector;
    int64_t decoder;       /* embeddings, blocks, final norm, LM head */
    int64_t total;
    int64_t active;        /* per token: only top_k of the routed experts */
} shape_params;
void shape_count_params(const model_shape *m, shape_params *out);

/* Analytic training FLOPs (forward + backward = 3x forward, matmuls and attention
 * scores only) per decoder token at sequence length seq_len; the encoder is charged
 * per image patch. */
typedef struct {
    double decoder_per_token;
    double encoder_per_patch;
    double projector_per_patch;
} shape_flops;
void shape_count_flops(const model_shape *m, int seq_len, shape_flops *out);

#endif
