/* model_fields.c - the keys of a model preset (fields.h), one row per model_shape field.
 * Defaults and ranges here are the ones docs/config.md lists. */
#include <stddef.h>

#include "shape/fields.h"
#include "shape/model_shape.h"

static const char *const norm_names[] = { "rmsnorm", "layernorm", NULL };
static const char *const mlp_names[] = { "swiglu", "gelu", NULL };
static const char *const gelu_names[] = { "tanh", "erf", NULL };
static const char *const pos_names[] = { "rope", "mrope", "rope2d", "learned", NULL };
static const char *const recompute_names[] = { "none", "selective", "full", NULL };

#define OFF(m) offsetof(model_shape, m)
#define W 4194304.0   /* widest width accepted (keeps every product inside int64) */

/* The rows of one transformer stack; P is the key prefix, S the stack_shape member. */
#define STACK_ROWS(P, S, C, POS_DEF)                                                       \
    { .key = P "layers", .type = FT_INT, .off = OFF(S.layers), .min = 1, .max = 10000,     \
      .comp = C, .doc = "number of transformer blocks" },                                 \
    { .key = P "hidden", .type = FT_INT, .off = OFF(S.hidden), .min = 1, .max = W,         \
      .comp = C, .doc = "residual width" },                                               \
    { .key = P "ffn", .type = FT_INT, .off = OFF(S.ffn), .min = 0, .max = W, .def = "0",   \
      .comp = C, .doc = "dense MLP intermediate width (needed where a block is dense)" },  \
    { .key = P "heads", .type = FT_INT, .off = OFF(S.heads), .min = 1, .max = 4096,        \
      .comp = C, .doc = "attention (query) heads" },                                      \
    { .key = P "kv_heads", .type = FT_INT, .off = OFF(S.kv_heads), .min = 1, .max = 4096,  \
      .def = "auto", .flags = FIELD_AUTO, .comp = C,                                      \
      .doc = "key/value heads (grouped-query attention); auto = heads" },                 \
    { .key = P "head_dim", .type = FT_INT, .off = OFF(S.head_dim), .min = 1, .max = 4096,  \
      .def = "auto", .flags = FIELD_AUTO, .comp = C, .doc = "width of one head; auto = hidden / heads" }, \
    { .key = P "norm", .type = FT_ENUM, .off = OFF(S.norm), .names = norm_names,           \
      .def = "rmsnorm", .comp = C, .doc = "normalisation" },                              \
    { .key = P "norm_eps", .type = FT_FLOAT, .off = OFF(S.norm_eps), .min = 0, .max = 1,   \
      .def = "1e-6", .flags = FIELD_GT_MIN, .comp = C, .doc = "normalisation epsilon" },   \
    { .key = P "mlp", .type = FT_ENUM, .off = OFF(S.mlp), .names = mlp_names,              \
      .def = "swiglu", .comp = C, .doc = "MLP kind" },                                    \
    { .key = P "gelu", .type = FT_ENUM, .off = OFF(S.gelu), .names = gelu_names,           \
      .def = "erf", .comp = C, .doc = "GELU flavour where mlp is gelu" },                 \
    { .key = P "bias", .type = FT_BIAS_ALL, .flags = FIELD_NO_JSON, .comp = C,             \
      .doc = "shorthand: true/false sets bias.qkv, bias.proj and bias.mlp" },             \
    { .key = P "bias.qkv", .type = FT_BOOL, .off = OFF(S.bias_qkv), .def = "false",        \
      .comp = C, .doc = "bias on the q/k/v projections" },                                \
    { .key = P "bias.proj", .type = FT_BOOL, .off = OFF(S.bias_proj), .def = "false",      \
      .comp = C, .doc = "bias on the attention output projection" },                      \
    { .key = P "bias.mlp", .type = FT_BOOL, .off = OFF(S.bias_mlp), .def = "false",        \
      .comp = C, .doc = "bias on the MLP linears" },                                      \
    { .key = P "qk_norm", .type = FT_BOOL, .off = OFF(S.qk_norm), .def = "false",          \
      .comp = C, .doc = "RMSNorm over head_dim on q and k" },                             \
    { .key = P "pos", .type = FT_ENUM, .off = OFF(S.pos), .names = pos_names,              \
      .def = POS_DEF, .comp = C, .doc = "positions" },                                    \
    { .key = P "mrope_section", .type = FT_INT3, .off = OFF(S.mrope_section), .min = 0,    \
      .max = 4096, .def = "[0, 0, 0]", .comp = C,                                         \
      .doc = "mrope: rotary frequencies for [t, h, w], summing to head_dim / 2" },        \
    { .key = P "rope_theta", .type = FT_DOUBLE, .off = OFF(S.rope_theta), .min = 0,        \
      .max = 1e15, .def = "10000", .flags = FIELD_GT_MIN, .comp = C, .doc = "RoPE base" }, \
    { .key = P "recompute", .type = FT_ENUM, .off = OFF(S.recompute),                      \
      .names = recompute_names, .def = "auto", .flags = FIELD_AUTO | FIELD_RUN_ONLY,      \
      .comp = C, .doc = "run config only: activation recomputation; auto = train.recompute" }, \
    { .key = P "freeze", .type = FT_BOOL, .off = OFF(S.freeze), .def = "false",            \
      .flags = FIELD_RUN_ONLY, .comp = C, .doc = "run config only: do not update the parameters" }

static const field_desc rows[] = {
    { .key = "name", .type = FT_STR, .off = OFF(name), .size = sizeof(((model_shape *)0)->name),
      .def = "auto", .flags = FIELD_AUTO, .doc = "preset name; auto = the file name without .yaml" },

    STACK_ROWS("encoder.", encoder.s, COMP_ENCODER, "rope2d"),
    { .key = "encoder.in_channels", .type = FT_INT, .off = OFF(encoder.in_channels), .min = 1,
      .max = 64, .def = "3", .comp = COMP_ENCODER, .doc = "image channels" },
    { .key = "encoder.patch", .type = FT_INT, .off = OFF(encoder.patch), .min = 1, .max = 1024,
      .def = "14", .comp = COMP_ENCODER, .doc = "patch side in pixels" },
    { .key = "encoder.temporal_patch", .type = FT_INT, .off = OFF(encoder.temporal_patch),
      .min = 1, .max = 64, .def = "2", .comp = COMP_ENCODER, .doc = "frames per patch" },
    { .key = "encoder.spatial_merge", .type = FT_INT, .off = OFF(encoder.spatial_merge),
      .min = 1, .max = 64, .def = "2", .comp = COMP_ENCODER,
      .doc = "merge side: spatial_merge^2 patches make one decoder token" },
    { .key = "encoder.window_px", .type = FT_INT, .off = OFF(encoder.window_px), .min = 0,
      .max = 65536, .def = "0", .comp = COMP_ENCODER,
      .doc = "window side in pixels for windowed attention; 0 = every layer attends fully" },
    { .key = "encoder.full_attn", .type = FT_INTLIST, .off = OFF(encoder.full_attn),
      .size = SHAPE_MAX_FULL_ATTN, .count_off = OFF(encoder.n_full_attn), .min = 0,
      .max = 9999, .def = "[]", .comp = COMP_ENCODER,
      .doc = "layers (from 0) with full attention when window_px > 0" },

    { .key = "projector.hidden", .type = FT_INT, .off = OFF(projector.hidden), .min = 1,
      .max = W, .def = "auto", .flags = FIELD_AUTO, .comp = COMP_PROJECTOR,
      .doc = "MLP intermediate width; auto = spatial_merge^2 * encoder.hidden" },
    { .key = "projector.norm", .type = FT_ENUM, .off = OFF(projector.norm), .names = norm_names,
      .def = "rmsnorm", .comp = COMP_PROJECTOR, .doc = "norm over encoder.hidden before merging" },
    { .key = "projector.norm_eps", .type = FT_FLOAT, .off = OFF(projector.norm_eps), .min = 0,
      .max = 1, .def = "1e-6", .flags = FIELD_GT_MIN, .comp = COMP_PROJECTOR,
      .doc = "normalisation epsilon" },
    { .key = "projector.gelu", .type = FT_ENUM, .off = OFF(projector.gelu), .names = gelu_names,
      .def = "erf", .comp = COMP_PROJECTOR, .doc = "GELU flavour between the two linears" },
    { .key = "projector.bias", .type = FT_BOOL, .off = OFF(projector.bias), .def = "false",
      .comp = COMP_PROJECTOR, .doc = "biases on both linears" },

    STACK_ROWS("decoder.", decoder.s, COMP_DECODER, "rope"),
    { .key = "decoder.vocab", .type = FT_INT, .off = OFF(decoder.vocab), .min = 1,
      .max = 16777216, .comp = COMP_DECODER, .doc = "vocabulary size" },
    { .key = "decoder.tied_embeddings", .type = FT_BOOL, .off = OFF(decoder.tied_embeddings),
      .def = "false", .comp = COMP_DECODER, .doc = "LM head shares the token embedding" },
    { .key = "decoder.max_positions", .type = FT_INT, .off = OFF(decoder.max_positions),
      .min = 0, .max = 16777216, .def = "0", .comp = COMP_DECODER,
      .doc = "learned positions: table length (needed then); informative otherwise" },
    { .key = "decoder.image_token_id", .type = FT_INT, .off = OFF(decoder.image_token_id),
      .min = -1, .max = 16777216, .def = "-1", .comp = COMP_DECODER,
      .doc = "placeholder id of image tokens; -1 = none (needed with an encoder)" },
    { .key = "decoder.moe.experts", .type = FT_INT, .off = OFF(decoder.moe_experts), .min = 0,
      .max = 4096, .def = "0", .comp = COMP_DECODER, .doc = "routed experts; 0 = dense" },
    { .key = "decoder.moe.top_k", .type = FT_INT, .off = OFF(decoder.moe_top_k), .min = 0,
      .max = 4096, .def = "0", .comp = COMP_DECODER, .doc = "experts per token" },
    { .key = "decoder.moe.ffn", .type = FT_INT, .off = OFF(decoder.moe_ffn), .min = 0,
      .max = W, .def = "0", .comp = COMP_DECODER, .doc = "per-expert intermediate width" },
    { .key = "decoder.moe.shared_ffn", .type = FT_INT, .off = OFF(decoder.moe_shared_ffn),
      .min = 0, .max = W, .def = "0", .comp = COMP_DECODER,
      .doc = "shared-expert intermediate width; 0 = none" },
    { .key = "decoder.moe.every", .type = FT_INT, .off = OFF(decoder.moe_every), .min = 1,
      .max = 10000, .def = "1", .comp = COMP_DECODER,
      .doc = "MoE in layers l with l % every == every - 1" },
    { .key = "decoder.moe.aux_coef", .type = FT_FLOAT, .off = OFF(decoder.moe_aux_coef),
      .min = 0, .max = 1000, .def = "0.01", .comp = COMP_DECODER,
      .doc = "load-balancing loss coefficient" },
};

const field_desc *model_fields(int *n)
{
    *n = (int)(sizeof rows / sizeof rows[0]);
    return rows;
}
