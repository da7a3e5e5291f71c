/* hf_weights.h - Qwen2.5-VL checkpoints (Hugging Face safetensors) in and out of a full
 * single-rank model.
 *
 * Names (ours -> transformers'; hub checkpoints use these legacy names, newer
 * transformers versions may save "model.visual." / "model.language_model." instead of
 * "visual." / "model.", which are read too):
 *   encoder.patch_embed.weight [H, C*T*P*P]    visual.patch_embed.proj.weight [H, C, T, P, P]
 *   encoder.layers.L.attn_norm / mlp_norm        visual.blocks.L.norm1 / norm2
 *   encoder.layers.L.attn.qkv / attn.proj        visual.blocks.L.attn.qkv / attn.proj
 *   encoder.layers.L.mlp.gate_up (rows: gate, up) visual.blocks.L.mlp.gate_proj ++ up_proj
 *   encoder.layers.L.mlp.down                    visual.blocks.L.mlp.down_proj
 *   projector.norm / fc1 / fc2                   visual.merger.ln_q / mlp.0 / mlp.2
 *   decoder.embed                                model.embed_tokens
 *   decoder.layers.L.attn_norm / mlp_norm        model.layers.L.input_layernorm /
 *                                                post_attention_layernorm
 *   decoder.layers.L.attn.qkv (rows: q, k, v)    model.layers.L.self_attn.q_proj ++ k_proj
 *                                                ++ v_proj (weights and biases)
 *   decoder.layers.L.attn.proj                   model.layers.L.self_attn.o_proj
 *   decoder.layers.L.mlp.gate_up / mlp.down      model.layers.L.mlp.gate_proj ++ up_proj /
 *                                                down_proj
 *   decoder.final_norm / decoder.lm_head         model.norm / lm_head (untied only; a tied
 *                                                checkpoint's lm_head.weight is ignored)
 * Every tensor of the model must be found with the right element count and every
 * checkpoint tensor must be used (unknown names are an error naming the first one). */
#ifndef HEARTH_HF_WEIGHTS_H
#define HEARTH_HF_WEIGHTS_H

#include "hf_config.h"
#include "model/model.h"
#include "safetensors.h"
#include "shape/err.h"

/* Up to HF_MAX_PARTS checkpoint tensors are concatenated by rows into one of ours. */
#define HF_MAX_PARTS 3

/* The transformers names of our tensor `ours` (legacy layout), concatenated by rows in
 * this order.  Returns the count (1..HF_MAX_PARTS), or 0 when the tensor has no
 * Qwen2.5-VL counterpart. */
int hf_weights_names(const char *ours, char names[HF_MAX_PARTS][ST_NAME_MAX]);

/* Reads DIR (sharded or not; F32/BF16/F16) into the parameters of m, a single-rank model
 * whose shape hf_config_check accepted.  On error m's parameters may be partly
 * overwritten (the caller discards the model). */
int hf_weights_load(model *m, const char *dir, hearth_err *err);

/* Writes m's parameters to DIR (created if missing) as transformers' names, dtype F32 or
 * BF16 (round to nearest even), shards of at most max_shard_bytes (0: one file), plus
 * config.json (hf_config_write: src's as read when the model came from one, else made
 * from the shape; src may be NULL).  Every file is written atomically. */
int hf_weights_export(model *m, const hf_config *src, const char *dir, st_dtype dtype,
                      size_t max_shard_bytes, hearth_err *err);

#endif
