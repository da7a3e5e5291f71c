/* hf_config.h - a Hugging Face Qwen2.5-VL config.json and hearth's model_shape.
 *
 * Field mapping (config.json, flat legacy layout or with a nested "text_config"):
 *   hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
 *   num_key_value_heads, rms_norm_eps, rope_theta, vocab_size, tie_word_embeddings,
 *   max_position_embeddings, rope_scaling.mrope_section  -> decoder.*
 *   image_token_id                                        -> decoder.image_token_id
 *   vision_config.{depth, hidden_size, intermediate_size, num_heads, patch_size,
 *   temporal_patch_size, spatial_merge_size, window_size, fullatt_block_indexes,
 *   in_chans|in_channels, out_hidden_size}                -> encoder.*, projector
 * Fixed by the Qwen2.5-VL architecture (and so required of the shape): RMSNorm
 * everywhere (vision and merger eps 1e-6), SwiGLU MLPs (SiLU), biases on the vision
 * q/k/v/proj/MLP and on the decoder q/k/v only, 2-D vision RoPE with theta 10000, a
 * merger of RMSNorm + Linear(m^2*H, m^2*H) + GELU(erf) + Linear(m^2*H, out_hidden_size)
 * with biases, mRoPE in the decoder, dense MLPs, full attention in every decoder layer.
 *
 * Every other key of config.json is classified (the table in hf_config.c, docs/hf.md):
 * known to change nothing hearth computes (accepted and written back as read), known to
 * change the model (refused unless it holds the value that changes nothing, e.g.
 * use_sliding_window false, hidden_act silu, rope type default/mrope), or unknown
 * (accepted and listed in hf_config.unknown for a warning: refusing keys that a newer
 * transformers adds would refuse real checkpoints).
 *
 * Token ids beside image_token_id that transformers needs for mRoPE are written relative
 * to it, as in Qwen's vocabulary, when a config is made from a model alone:
 * vision_start = image - 3, vision_end = image - 2, video = image + 1. */
#ifndef HEARTH_HF_CONFIG_H
#define HEARTH_HF_CONFIG_H

#include "shape/err.h"
#include "shape/model_shape.h"

#define HF_VISION_START_OFFSET (-3)
#define HF_VISION_END_OFFSET (-2)
#define HF_VIDEO_OFFSET 1

struct json_t;

/* A config.json as read.  Owns json and unknown; hf_config_free releases both. */
typedef struct {
    model_shape shape;      /* the model the file describes */
    char file[4200];        /* DIR/config.json, for messages */
    struct json_t *json;    /* the whole file as parsed: written back on export */
    char *unknown;          /* "text_config.foo, bar": keys hearth does not know, or NULL */
} hf_config;

/* Reads and classifies DIR/config.json into a new *out (shape name "hf:DIR"; every
 * field the file does not set keeps the Qwen2.5-VL value).  Errors name the file and
 * the key, with the value and the rule it breaks (HERR_CONFIG), or the read failure
 * (HERR_CONFIG naming FILE:LINE:COL); *out is NULL then. */
int hf_config_load(hf_config **out, const char *dir, hearth_err *err);
void hf_config_free(hf_config *c);   /* NULL-safe */

/* hf_config_load keeping only the shape. */
int hf_config_read(model_shape *out, const char *dir, hearth_err *err);

/* Checks that `sh` is a Qwen2.5-VL shape (the fixed parts above) and equals `hf` (read
 * by hf_config_read from `file`) field by field; the first difference is HERR_CONFIG
 * "FILE: vision_config.depth is 4, the run's model.encoder.layers is 32". */
int hf_config_check(const model_shape *sh, const model_shape *hf, const char *file,
                    hearth_err *err);

/* Checks only the fixed Qwen2.5-VL architecture parts of sh (export needs no file). */
int hf_config_check_arch(const model_shape *sh, hearth_err *err);

/* Writes DIR/config.json for sh (atomically), torch_dtype naming the weights' dtype
 * ("float32" or "bfloat16").  With src (the config the model was read from; sh must
 * pass hf_config_check against it) the file is src's, every key and value as read, in
 * its order and number text, with only its dtype keys ("torch_dtype", "dtype") set to
 * torch_dtype; without src it is made from sh (sorted keys, floats in their shortest
 * form: rms_norm_eps 1e-05, not 9.99999974737875e-06). */
int hf_config_write(const model_shape *sh, const hf_config *src, const char *dir,
                    const char *torch_dtype, hearth_err *err);

#endif
