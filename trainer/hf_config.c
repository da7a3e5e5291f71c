#include "hf_config.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_json.h"
#include "outputs.h"
#include "shape/canon_json.h"
#include "shape/file_read.h"

/* Where a config.json key lives. */
typedef enum { SEC_TEXT, SEC_VISION, SEC_TOP } hf_section;
typedef enum { HF_INT, HF_FLOAT, HF_DOUBLE, HF_BOOL } hf_type;

typedef struct {
    hf_section sec;
    const char *key;        /* config.json key inside its section */
    hf_type type;
    size_t off;             /* into model_shape */
    const char *ours;       /* the run config's dotted name */
    int required;
    double dflt;            /* when not required and absent */
} hf_field;

#define OFF(f) offsetof(model_shape, f)

static const hf_field FIELDS[] = {
    { SEC_TEXT, "hidden_size", HF_INT, OFF(decoder.s.hidden), "model.decoder.hidden", 1, 0 },
    { SEC_TEXT, "intermediate_size", HF_INT, OFF(decoder.s.ffn), "model.decoder.ffn", 1, 0 },
    { SEC_TEXT, "num_hidden_layers", HF_INT, OFF(decoder.s.layers), "model.decoder.layers", 1,
      0 },
    { SEC_TEXT, "num_attention_heads", HF_INT, OFF(decoder.s.heads), "model.decoder.heads", 1,
      0 },
    { SEC_TEXT, "num_key_value_heads", HF_INT, OFF(decoder.s.kv_heads),
      "model.decoder.kv_heads", 1, 0 },
    { SEC_TEXT, "vocab_size", HF_INT, OFF(decoder.vocab), "model.decoder.vocab", 1, 0 },
    { SEC_TEXT, "rms_norm_eps", HF_FLOAT, OFF(decoder.s.norm_eps), "model.decoder.norm_eps", 0,
      1e-6 },
    { SEC_TEXT, "rope_theta", HF_DOUBLE, OFF(decoder.s.rope_theta), "model.decoder.rope_theta",
      0, 1e6 },
    { SEC_TEXT, "max_position_embeddings", HF_INT, OFF(decoder.max_positions),
      "model.decoder.max_positions", 0, 32768 },
    { SEC_TOP, "tie_word_embeddings", HF_BOOL, OFF(decoder.tied_embeddings),
      "model.decoder.tied_embeddings", 0, 0 },
    { SEC_TOP, "image_token_id", HF_INT, OFF(decoder.image_token_id),
      "model.decoder.image_token_id", 0, 151655 },
    { SEC_VISION, "depth", HF_INT, OFF(encoder.s.layers), "model.encoder.layers", 1, 0 },
    { SEC_VISION, "hidden_size", HF_INT, OFF(encoder.s.hidden), "model.encoder.hidden", 1, 0 },
    { SEC_VISION, "intermediate_size", HF_INT, OFF(encoder.s.ffn), "model.encoder.ffn", 1, 0 },
    { SEC_VISION, "num_heads", HF_INT, OFF(encoder.s.heads), "model.encoder.heads", 1, 0 },
    { SEC_VISION, "patch_size", HF_INT, OFF(encoder.patch), "model.encoder.patch", 0, 14 },
    { SEC_VISION, "temporal_patch_size", HF_INT, OFF(encoder.temporal_patch),
      "model.encoder.temporal_patch", 0, 2 },
    { SEC_VISION, "spatial_merge_size", HF_INT, OFF(encoder.spatial_merge),
      "model.encoder.spatial_merge", 0, 2 },
    { SEC_VISION, "window_size", HF_INT, OFF(encoder.window_px), "model.encoder.window_px", 0,
      112 },
    { SEC_VISION, "in_chans", HF_INT, OFF(encoder.in_channels), "model.encoder.in_channels", 0,
      3 },
};
#define N_FIELDS ((int)(sizeof FIELDS / sizeof FIELDS[0]))

static const char *section_prefix(hf_section s)
{
    return s == SEC_VISION ? "vision_config." : "";
}

/* The section object a field is read from (the text part may be nested). */
static json_t *section_of(json_t *root, hf_section s)
{
    if (s == SEC_VISION)
        return json_object_get(root, "vision_config");
    if (s == SEC_TEXT) {
        json_t *t = json_object_get(root, "text_config");
        return json_is_object(t) ? t : root;
    }
    return root;
}

static double field_get(const model_shape *sh, const hf_field *f)
{
    const char *p = (const char *)sh + f->off;
    switch (f->type) {
    case HF_FLOAT:
        return *(const float *)p;
    case HF_DOUBLE:
        return *(const double *)p;
    default:
        return *(const int *)p;
    }
}

static void field_set(model_shape *sh, const hf_field *f, double v)
{
    char *p = (char *)sh + f->off;
    switch (f->type) {
    case HF_FLOAT:
        *(float *)p = (float)v;
        break;
    case HF_DOUBLE:
        *(double *)p = v;
        break;
    default:
        *(int *)p = (int)v;
    }
}

/* Reads one field; an integer must be an integer, a bool a bool (or 0/1). */
static int field_read(model_shape *sh, const hf_field *f, json_t *sec, const char *file,
                      hearth_err *err)
{
    json_t *j = sec ? json_object_get(sec, f->key) : NULL;
    if (!j || json_is_null(j)) {
        if (f->required)
            return herr_set(err, HERR_CONFIG, "%s: %s%s: missing", file,
                            section_prefix(f->sec), f->key);
        field_set(sh, f, f->dflt);
        return 0;
    }
    double v;
    if (f->type == HF_BOOL && json_is_boolean(j))
        v = json_is_true(j);
    else if (json_is_integer(j))
        v = (double)json_integer_value(j);
    else if ((f->type == HF_FLOAT || f->type == HF_DOUBLE) && json_is_real(j))
        v = json_real_value(j);
    else
        return herr_set(err, HERR_CONFIG, "%s: %s%s: expected %s", file,
                        section_prefix(f->sec), f->key,
                        f->type == HF_BOOL ? "true or false" :
                        f->type == HF_INT ? "an integer" : "a number");
    if (f->type == HF_INT && (v < 0 || v > 1e9))
        return herr_set(err, HERR_CONFIG, "%s: %s%s: %g is out of range", file,
                        section_prefix(f->sec), f->key, v);
    field_set(sh, f, v);
    return 0;
}

/* Reads a JSON array of n.. ints (at most cap) into out; *n gets the count. */
static int int_list(json_t *a, int *out, int cap, int *n, const char *file, const char *key,
                    hearth_err *err)
{
    if (!json_is_array(a) || json_array_size(a) > (size_t)cap)
        return herr_set(err, HERR_CONFIG, "%s: %s: expected a list of at most %d integers",
                        file, key, cap);
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x))
            return herr_set(err, HERR_CONFIG, "%s: %s[%zu]: expected an integer", file, key,
                            i);
        out[i] = (int)json_integer_value(x);
    }
    *n = (int)json_array_size(a);
    return 0;
}

/* The architecture parts config.json does not carry. */
static void arch_fill(model_shape *sh)
{
    stack_shape *e = &sh->encoder.s, *d = &sh->decoder.s;
    sh->encoder.present = 1;
    e->kv_heads = e->heads;
    e->head_dim = e->heads > 0 ? e->hidden / e->heads : 0;
    e->norm = NORM_RMSNORM;
    e->norm_eps = 1e-6f;
    e->mlp = MLP_SWIGLU;
    e->bias_qkv = e->bias_proj = e->bias_mlp = 1;
    e->pos = POS_ROPE2D;
    e->rope_theta = 10000.0;
    sh->projector.present = 1;
    sh->projector.hidden = sh->encoder.spatial_merge * sh->encoder.spatial_merge * e->hidden;
    sh->projector.norm = NORM_RMSNORM;
    sh->projector.norm_eps = 1e-6f;
    sh->projector.gelu = GELU_ERF;
    sh->projector.bias = 1;
    d->head_dim = d->heads > 0 ? d->hidden / d->heads : 0;
    d->norm = NORM_RMSNORM;
    d->mlp = MLP_SWIGLU;
    d->bias_qkv = 1;
    d->bias_proj = d->bias_mlp = 0;
    d->pos = POS_MROPE;
    sh->decoder.moe_every = 1;
}

/* ---- every key of config.json, classified ---------------------------------------------
 * A Qwen2.5-VL config.json (and the Qwen3-VL keys a mislabelled one may carry) holds keys
 * of four kinds.  Read: mapped to the shape above.  Ignored: known to change nothing
 * hearth computes (written back as read on export).  Checked: they change the model, so
 * only the value that changes nothing is accepted and any other is refused, naming the
 * key, its value and the rule.  Unknown: not in this table; accepted with a warning,
 * since a newer transformers adds keys and refusing them would refuse real checkpoints.
 * null counts as absent everywhere (transformers then uses its default). */

/* Where a key may stand: the top level, the text model (top level too in the legacy
 * layout), the vision tower, the text or the vision RoPE parameters. */
enum { IN_TOP = 1, IN_TEXT = 2, IN_VISION = 4, IN_ROPE = 8, IN_VROPE = 16 };
#define IN_CFG (IN_TOP | IN_TEXT | IN_VISION)   /* transformers' generic config keys */

typedef enum {
    RULE_READ,      /* read into the shape; `sub`: an object walked as that section */
    RULE_IGNORE,    /* changes nothing hearth computes */
    RULE_STRINGS,   /* one of the space-separated words of `allowed` */
    RULE_NUMBER,    /* equal to `num` */
    RULE_FALSE,     /* false */
    RULE_EMPTY,     /* 0, false, [] or {} */
    RULE_ABSENT,    /* any value is refused */
    RULE_SPECIAL    /* depends on other keys: text_rules() */
} key_rule;

typedef struct {
    unsigned where;
    const char *key;
    key_rule rule;
    const char *allowed;
    double num;
    unsigned sub;
    const char *why;    /* refused: the rule broken; ignored: why that is safe */
} hf_key;

#define WHY_SLIDING "hearth's decoder attends over the whole sequence in every layer"
#define WHY_ROPE "hearth's decoder RoPE is mRoPE without scaling (rope type default or mrope)"
#define WHY_VROPE "Qwen2.5-VL's vision RoPE is the 2-D one with theta 10000, which hearth's " \
    "encoder mapping fixes"
#define WHY_GENERIC "transformers' generic config (output, generation, task and tokenizer " \
    "settings): no effect on the forward pass or the loss"
#define WHY_TOKENS "names a token of the data (hearth places images by image_token_id " \
    "alone); kept as read on export"
#define WHY_MOE "a mixture-of-experts setting (num_experts is refused: Qwen2.5-VL is dense)"
#define WHY_SCALED "a parameter of scaled RoPE types, which are refused by rope type"

static const hf_key KEYS[] = {
    /* read */
    { IN_TOP, "model_type", RULE_READ, NULL, 0, 0, "checked first: qwen2_5_vl" },
    { IN_TOP, "text_config", RULE_READ, NULL, 0, IN_TEXT, NULL },
    { IN_TOP, "vision_config", RULE_READ, NULL, 0, IN_VISION, NULL },
    { IN_TOP | IN_TEXT, "image_token_id", RULE_READ, NULL, 0, 0, NULL },
    { IN_TOP | IN_TEXT, "tie_word_embeddings", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT | IN_VISION, "hidden_size", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT | IN_VISION, "intermediate_size", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT, "num_hidden_layers", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT, "num_attention_heads", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT, "num_key_value_heads", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT, "vocab_size", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT, "rms_norm_eps", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT | IN_ROPE, "rope_theta", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT, "max_position_embeddings", RULE_READ, NULL, 0, 0, NULL },
    { IN_TEXT, "rope_scaling", RULE_READ, NULL, 0, IN_ROPE, NULL },
    { IN_TEXT, "rope_parameters", RULE_READ, NULL, 0, IN_ROPE, NULL },
    { IN_ROPE, "mrope_section", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "depth", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "num_heads", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "patch_size", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "temporal_patch_size", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "spatial_merge_size", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "window_size", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "fullatt_block_indexes", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "in_chans", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "in_channels", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "out_hidden_size", RULE_READ, NULL, 0, 0, NULL },
    { IN_VISION, "rope_parameters", RULE_READ, NULL, 0, IN_VROPE, NULL },

    /* change the model: only the value that changes nothing */
    { IN_TEXT, "model_type", RULE_STRINGS, "qwen2_5_vl_text qwen2_5_vl", 0, 0,
      "hearth maps Qwen2.5-VL's language model only" },
    { IN_VISION, "model_type", RULE_STRINGS, "qwen2_5_vl qwen2_5_vl_vision", 0, 0,
      "hearth maps Qwen2.5-VL's vision tower only" },
    { IN_TEXT | IN_VISION, "hidden_act", RULE_STRINGS, "silu", 0, 0,
      "Qwen2.5-VL's MLPs are SwiGLU with SiLU; hearth maps no other activation" },
    { IN_CFG, "attention_dropout", RULE_NUMBER, NULL, 0, 0,
      "hearth's attention has no dropout" },
    { IN_ROPE, "type", RULE_STRINGS, "default mrope", 0, 0, WHY_ROPE },
    { IN_ROPE, "rope_type", RULE_STRINGS, "default mrope", 0, 0, WHY_ROPE },
    { IN_ROPE, "factor", RULE_NUMBER, NULL, 1, 0, WHY_ROPE },
    { IN_ROPE, "mrope_interleaved", RULE_FALSE, NULL, 0, 0,
      "hearth's mRoPE gives t, h and w contiguous blocks of frequencies (Qwen2.5-VL), "
      "not interleaved ones (Qwen3-VL)" },
    { IN_CFG | IN_ROPE | IN_VROPE, "partial_rotary_factor", RULE_NUMBER, NULL, 1, 0,
      "hearth's RoPE rotates the whole head" },
    { IN_VISION | IN_VROPE, "rope_theta", RULE_NUMBER, NULL, 10000, 0, WHY_VROPE },
    { IN_VROPE, "rope_type", RULE_STRINGS, "default axial", 0, 0, WHY_VROPE },
    { IN_TEXT, "use_sliding_window", RULE_SPECIAL, NULL, 0, 0, WHY_SLIDING },
    { IN_TEXT, "sliding_window", RULE_SPECIAL, NULL, 0, 0, WHY_SLIDING },
    { IN_TEXT, "max_window_layers", RULE_SPECIAL, NULL, 0, 0, WHY_SLIDING },
    { IN_TEXT, "layer_types", RULE_SPECIAL, NULL, 0, 0, WHY_SLIDING },
    { IN_TEXT, "head_dim", RULE_SPECIAL, NULL, 0, 0,
      "Qwen2.5-VL's attention has head_dim = hidden_size / num_attention_heads" },
    { IN_TEXT, "attention_bias", RULE_ABSENT, NULL, 0, 0,
      "Qwen2.5-VL has biases on q/k/v and none on o_proj (attention_bias is a Qwen3 key)" },
    { IN_TEXT, "num_experts", RULE_EMPTY, NULL, 0, 0,
      "Qwen2.5-VL is dense; hearth maps no mixture-of-experts checkpoint" },
    { IN_VISION, "deepstack_visual_indexes", RULE_EMPTY, NULL, 0, 0,
      "hearth's vision tower feeds the decoder at its input only (no DeepStack mergers)" },
    { IN_VISION, "num_position_embeddings", RULE_EMPTY, NULL, 0, 0,
      "Qwen2.5-VL's vision tower has no learned position embedding" },
    { IN_CFG, "quantization_config", RULE_ABSENT, NULL, 0, 0,
      "hearth reads f32, bf16 and f16 weights only" },
    { IN_CFG, "pruned_heads", RULE_EMPTY, NULL, 0, 0, "hearth's attention keeps every head" },

    /* change nothing hearth computes */
    { IN_CFG, "initializer_range", RULE_IGNORE, NULL, 0, 0,
      "initialises only weights the checkpoint replaces" },
    { IN_CFG, "use_cache", RULE_IGNORE, NULL, 0, 0, "generation only" },
    { IN_CFG, "bos_token_id", RULE_IGNORE, NULL, 0, 0, WHY_TOKENS },
    { IN_CFG, "eos_token_id", RULE_IGNORE, NULL, 0, 0, WHY_TOKENS },
    { IN_CFG, "pad_token_id", RULE_IGNORE, NULL, 0, 0, WHY_TOKENS },
    { IN_TOP | IN_TEXT, "vision_start_token_id", RULE_IGNORE, NULL, 0, 0, WHY_TOKENS },
    { IN_TOP | IN_TEXT, "vision_end_token_id", RULE_IGNORE, NULL, 0, 0, WHY_TOKENS },
    { IN_TOP | IN_TEXT, "vision_token_id", RULE_IGNORE, NULL, 0, 0, WHY_TOKENS },
    { IN_TOP | IN_TEXT, "video_token_id", RULE_IGNORE, NULL, 0, 0, WHY_TOKENS },
    { IN_VISION, "tokens_per_second", RULE_IGNORE, NULL, 0, 0,
      "scales the temporal positions of video frames; hearth trains on images" },
    { IN_VISION, "spatial_patch_size", RULE_IGNORE, NULL, 0, 0,
      "an old alias of patch_size that transformers does not read" },
    { IN_CFG, "architectures", RULE_IGNORE, NULL, 0, 0, "names the class to load" },
    { IN_CFG, "torch_dtype", RULE_IGNORE, NULL, 0, 0,
      "the weights' dtype (the safetensors header is what is read); set on export" },
    { IN_CFG, "dtype", RULE_IGNORE, NULL, 0, 0,
      "the weights' dtype (the safetensors header is what is read); set on export" },
    { IN_CFG, "transformers_version", RULE_IGNORE, NULL, 0, 0, "provenance" },
    { IN_CFG, "_name_or_path", RULE_IGNORE, NULL, 0, 0, "provenance" },
    { IN_CFG, "_commit_hash", RULE_IGNORE, NULL, 0, 0, "provenance" },
    { IN_CFG, "_attn_implementation", RULE_IGNORE, NULL, 0, 0,
      "which attention kernel; the same math" },
    { IN_CFG, "attn_implementation", RULE_IGNORE, NULL, 0, 0,
      "which attention kernel; the same math" },
    { IN_CFG, "_attn_implementation_autoset", RULE_IGNORE, NULL, 0, 0,
      "which attention kernel; the same math" },
    { IN_CFG, "use_bfloat16", RULE_IGNORE, NULL, 0, 0, "a storage hint" },
    { IN_CFG, "output_router_logits", RULE_IGNORE, NULL, 0, 0, WHY_MOE },
    { IN_TEXT, "num_experts_per_tok", RULE_IGNORE, NULL, 0, 0, WHY_MOE },
    { IN_TEXT, "moe_intermediate_size", RULE_IGNORE, NULL, 0, 0, WHY_MOE },
    { IN_TEXT, "decoder_sparse_step", RULE_IGNORE, NULL, 0, 0, WHY_MOE },
    { IN_TEXT, "norm_topk_prob", RULE_IGNORE, NULL, 0, 0, WHY_MOE },
    { IN_TEXT, "router_aux_loss_coef", RULE_IGNORE, NULL, 0, 0, WHY_MOE },
    { IN_TEXT, "shared_expert_intermediate_size", RULE_IGNORE, NULL, 0, 0, WHY_MOE },
    { IN_TEXT, "mlp_only_layers", RULE_IGNORE, NULL, 0, 0, WHY_MOE },
    { IN_ROPE | IN_VROPE, "original_max_position_embeddings", RULE_IGNORE, NULL, 0, 0,
      WHY_SCALED },
    { IN_ROPE | IN_VROPE, "attention_factor", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
    { IN_ROPE | IN_VROPE, "beta_fast", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
    { IN_ROPE | IN_VROPE, "beta_slow", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
    { IN_ROPE | IN_VROPE, "low_freq_factor", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
    { IN_ROPE | IN_VROPE, "high_freq_factor", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
    { IN_ROPE | IN_VROPE, "short_factor", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
    { IN_ROPE | IN_VROPE, "long_factor", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
    { IN_ROPE | IN_VROPE, "mscale", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
    { IN_ROPE | IN_VROPE, "mscale_all_dim", RULE_IGNORE, NULL, 0, 0, WHY_SCALED },
};
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

/* transformers' PretrainedConfig keys: output, generation, task and tokenizer settings
 * that Qwen2.5-VL's forward pass never reads (older versions save them all) */
static const char *const GENERIC_KEYS[] = {
    "return_dict", "output_hidden_states", "output_attentions", "torchscript",
    "tf_legacy_loss", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
    "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder",
    "finetuning_task", "id2label", "label2id", "tokenizer_class", "prefix", "sep_token_id",
    "decoder_start_token_id", "task_specific_params", "problem_type", "max_length",
    "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens",
};
#define N_GENERIC ((int)(sizeof GENERIC_KEYS / sizeof GENERIC_KEYS[0]))

static const hf_key GENERIC = { IN_CFG, "", RULE_IGNORE, NULL, 0, 0, WHY_GENERIC };

static const hf_key *key_find(unsigned where, const char *key)
{
    for (int i = 0; i < N_KEYS; i++)
        if ((KEYS[i].where & where) && !strcmp(KEYS[i].key, key))
            return &KEYS[i];
    for (int i = 0; (where & IN_CFG) && i < N_GENERIC; i++)
        if (!strcmp(GENERIC_KEYS[i], key))
            return &GENERIC;
    return NULL;
}

typedef struct {
    const char *file;
    const model_shape *sh;  /* the fields read (rules that depend on them) */
    canon_buf unknown;      /* ", "-separated dotted names */
    hearth_err *err;
} walk_ctx;

/* `word` is one of the space-separated words of `list` */
static int word_in(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, " ");
        if (k == n && !strncmp(p, word, n))
            return 1;
        p += k + (p[k] == ' ');
    }
    return 0;
}

/* "FILE: NAME: VALUE is not supported: WHY" */
static int refuse(walk_ctx *w, const char *name, const json_t *v, const char *why)
{
    char *text = hf_json_dump(v, 0);
    int rc = herr_set(w->err, HERR_CONFIG, "%s: %s: %.80s%s is not supported: %s", w->file,
                      name, text ? text : "?", text && strlen(text) > 80 ? "..." : "", why);
    free(text);
    return rc;
}

static int rule_check(walk_ctx *w, const hf_key *k, const json_t *v, const char *name)
{
    int ok = 1;
    switch (k->rule) {
    case RULE_STRINGS:
        ok = json_is_string(v) && word_in(k->allowed, json_string_value(v));
        break;
    case RULE_NUMBER:
        ok = json_is_number(v) && json_number_value(v) == k->num;
        break;
    case RULE_FALSE:
        ok = json_is_false(v);
        break;
    case RULE_EMPTY:
        ok = json_is_false(v) || (json_is_integer(v) && !json_integer_value(v)) ||
             (json_is_array(v) && !json_array_size(v)) ||
             (json_is_object(v) && !json_object_size(v));
        break;
    case RULE_ABSENT:
        ok = 0;
        break;
    default:
        break;
    }
    return ok ? 0 : refuse(w, name, v, k->why);
}

static void note_unknown(walk_ctx *w, const char *name)
{
    if (w->unknown.len)
        canon_put(&w->unknown, ", ", 2);
    canon_put(&w->unknown, name, strlen(name));
}

/* Checks every key of obj, a section `where` named by `prefix` ("" or "text_config."),
 * and walks the objects it holds. */
static int walk(walk_ctx *w, json_t *obj, unsigned where, const char *prefix)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, key);
        const hf_key *k = key_find(where, key);
        if (!k) {
            note_unknown(w, name);
            continue;
        }
        int rc = json_is_null(v) ? 0 : rule_check(w, k, v, name);
        if (!rc && k->sub && json_is_object(v)) {
            char sub[260];
            snprintf(sub, sizeof sub, "%s.", name);
            rc = walk(w, v, k->sub, sub);
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int is_set(const json_t *v)
{
    return v && !json_is_null(v);
}

/* The text-model keys whose rule depends on other keys, in sec (named by prefix). */
static int text_rules(walk_ctx *w, json_t *sec, const char *prefix)
{
    const stack_shape *d = &w->sh->decoder.s;
    char name[256], why[256];
    json_t *v = json_object_get(sec, "head_dim");
    int hd = d->heads > 0 ? d->hidden / d->heads : 0;
    if (is_set(v) && !(json_is_integer(v) && json_integer_value(v) == hd)) {
        snprintf(name, sizeof name, "%shead_dim", prefix);
        snprintf(why, sizeof why, "Qwen2.5-VL's attention has head_dim = hidden_size / "
                 "num_attention_heads = %d", hd);
        return refuse(w, name, v, why);
    }
    /* transformers 5 lists each layer's attention; any sliding layer is refused even
     * where its sliding_window is unset, as versions disagree on what that means */
    v = json_object_get(sec, "layer_types");
    if (is_set(v) && !json_is_array(v)) {
        snprintf(name, sizeof name, "%slayer_types", prefix);
        return refuse(w, name, v, "expected a list of \"full_attention\"; " WHY_SLIDING);
    }
    for (size_t i = 0; is_set(v) && i < json_array_size(v); i++) {
        const char *s = json_string_value(json_array_get(v, i));
        if (!s || strcmp(s, "full_attention")) {
            snprintf(name, sizeof name, "%slayer_types[%zu]", prefix, i);
            return refuse(w, name, json_array_get(v, i), WHY_SLIDING);
        }
    }
    /* older transformers: layers from max_window_layers on (default 80) use a window of
     * sliding_window tokens when use_sliding_window is true */
    v = json_object_get(sec, "use_sliding_window");
    snprintf(name, sizeof name, "%suse_sliding_window", prefix);
    if (is_set(v) && !json_is_boolean(v))
        return herr_set(w->err, HERR_CONFIG, "%s: %s: expected true or false", w->file, name);
    json_t *sw = json_object_get(sec, "sliding_window");
    json_t *mwl = json_object_get(sec, "max_window_layers");
    long long from = !is_set(mwl) ? 80 : json_is_integer(mwl) ? json_integer_value(mwl) : 0;
    if (json_is_true(v) && is_set(sw) && from < d->layers) {
        char *s = hf_json_dump(sw, 0);
        snprintf(why, sizeof why, "with sliding_window %.32s and max_window_layers %lld, "
                 "layers %lld..%d would attend to a window; " WHY_SLIDING, s ? s : "?",
                 from, from < 0 ? 0 : from, d->layers - 1);
        free(s);
        return refuse(w, name, v, why);
    }
    return 0;
}

/* Classifies every key of root (hf_config.h); unknown keys are added to w->unknown. */
static int keys_check(walk_ctx *w, json_t *root)
{
    json_t *text = json_object_get(root, "text_config");
    /* the top level holds the text model's keys in the legacy layout, and copies of them
     * (which transformers ignores) in some nested files: checked alike */
    int rc = walk(w, root, IN_TOP | IN_TEXT, "");
    if (!rc)
        rc = text_rules(w, root, "");
    if (!rc && json_is_object(text))
        rc = text_rules(w, text, "text_config.");
    return rc;
}

void hf_config_free(hf_config *c)
{
    if (!c)
        return;
    json_decref(c->json);
    free(c->unknown);
    free(c);
}

/* The shape of root (read from file): the mapped fields, then every other key checked. */
static int shape_read(model_shape *out, json_t *root, const char *file, char **unknown,
                      hearth_err *err)
{
    int rc = 0;
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    json_t *vis = json_object_get(root, "vision_config");
    if (mt && strcmp(mt, "qwen2_5_vl") != 0)
        return herr_set(err, HERR_CONFIG, "%s: model_type: \"%s\" is not supported: hearth "
                        "reads Qwen2.5-VL checkpoints (qwen2_5_vl) only", file, mt);
    if (!json_is_object(vis))
        return herr_set(err, HERR_CONFIG, "%s: vision_config: missing (a Qwen2.5-VL config "
                        "has one)", file);
    for (int i = 0; !rc && i < N_FIELDS; i++)
        rc = field_read(out, &FIELDS[i], section_of(root, FIELDS[i].sec), file, err);
    /* aliases newer files use */
    json_t *ic = json_object_get(vis, "in_channels");
    if (!rc && json_is_integer(ic))
        out->encoder.in_channels = (int)json_integer_value(ic);
    json_t *fa = json_object_get(vis, "fullatt_block_indexes");
    if (!rc && fa)
        rc = int_list(fa, out->encoder.full_attn, SHAPE_MAX_FULL_ATTN,
                      &out->encoder.n_full_attn, file, "vision_config.fullatt_block_indexes",
                      err);
    json_t *text = section_of(root, SEC_TEXT);
    /* mRoPE sections and theta: rope_scaling (older files) or rope_parameters (newer) */
    json_t *rs = json_object_get(text, "rope_scaling");
    if (!json_is_object(rs))
        rs = json_object_get(text, "rope_parameters");
    if (!json_is_object(rs))
        rs = json_object_get(root, "rope_scaling");
    json_t *theta = json_object_get(rs, "rope_theta");
    if (!rc && !json_object_get(text, "rope_theta") && json_is_number(theta))
        out->decoder.s.rope_theta = json_number_value(theta);
    json_t *tie = json_object_get(text, "tie_word_embeddings");
    if (!rc && !json_object_get(root, "tie_word_embeddings") && json_is_boolean(tie))
        out->decoder.tied_embeddings = json_is_true(tie);
    int nsec = 0;
    if (!rc)
        rc = int_list(json_object_get(rs, "mrope_section"), out->decoder.s.mrope_section, 3,
                      &nsec, file, "rope_scaling.mrope_section", err);
    if (!rc && nsec != 3)
        rc = herr_set(err, HERR_CONFIG, "%s: rope_scaling.mrope_section: expected 3 values, "
                      "got %d", file, nsec);
    json_t *oh = json_object_get(vis, "out_hidden_size");
    if (!rc && json_is_integer(oh) && json_integer_value(oh) != out->decoder.s.hidden)
        rc = herr_set(err, HERR_CONFIG, "%s: vision_config.out_hidden_size: %lld differs from "
                      "hidden_size %d", file, (long long)json_integer_value(oh),
                      out->decoder.s.hidden);
    if (rc)
        return rc;
    walk_ctx w = { .file = file, .sh = out, .err = err };
    rc = keys_check(&w, root);
    if (!rc && w.unknown.len)
        *unknown = canon_buf_finish(&w.unknown);
    else
        canon_buf_free(&w.unknown);
    if (rc)
        return rc;
    arch_fill(out);
    if ((rc = shape_validate(out, err)))
        return herr_prefix(err, rc, "%s", file);
    return 0;
}

int hf_config_load(hf_config **out, const char *dir, hearth_err *err)
{
    *out = NULL;
    hf_config *c = calloc(1, sizeof *c);
    if (!c)
        return herr_set(err, HERR_NOMEM, "%s/config.json: out of memory", dir);
    snprintf(c->file, sizeof c->file, "%s/config.json", dir);
    snprintf(c->shape.name, sizeof c->shape.name, "hf:%.58s", dir);
    int rc = file_read_json(c->file, FILE_READ_MAX_TEXT, 0, &c->json, err);
    if (rc == HERR_IO)
        rc = HERR_CONFIG;
    if (!rc && !json_is_object(c->json))
        rc = herr_set(err, HERR_CONFIG, "%s: expected a JSON object", c->file);
    if (!rc)
        rc = shape_read(&c->shape, c->json, c->file, &c->unknown, err);
    if (rc) {
        hf_config_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int hf_config_read(model_shape *out, const char *dir, hearth_err *err)
{
    hf_config *c;
    int rc = hf_config_load(&c, dir, err);
    if (!rc)
        *out = c->shape;
    hf_config_free(c);
    return rc;
}

int hf_config_check_arch(const model_shape *sh, hearth_err *err)
{
    const stack_shape *e = &sh->encoder.s, *d = &sh->decoder.s;
    const char *bad = NULL;
    if (!sh->encoder.present || !sh->projector.present)
        bad = "model.encoder: a Qwen2.5-VL model has an encoder and a projector";
    else if (e->norm != NORM_RMSNORM || d->norm != NORM_RMSNORM ||
             sh->projector.norm != NORM_RMSNORM)
        bad = "norm: Qwen2.5-VL uses rmsnorm everywhere";
    else if (e->norm_eps != 1e-6f || sh->projector.norm_eps != 1e-6f)
        bad = "model.encoder.norm_eps: Qwen2.5-VL's vision norms use 1e-6";
    else if (e->mlp != MLP_SWIGLU || d->mlp != MLP_SWIGLU)
        bad = "mlp: Qwen2.5-VL uses swiglu";
    else if (!e->bias_qkv || !e->bias_proj || !e->bias_mlp)
        bad = "model.encoder.bias: Qwen2.5-VL's vision blocks have all biases";
    else if (!d->bias_qkv || d->bias_proj || d->bias_mlp)
        bad = "model.decoder.bias: Qwen2.5-VL has biases on q/k/v only";
    else if (e->qk_norm || d->qk_norm)
        bad = "qk_norm: Qwen2.5-VL has none";
    else if (e->pos != POS_ROPE2D || e->rope_theta != 10000.0)
        bad = "model.encoder.pos: Qwen2.5-VL's vision RoPE is rope2d with theta 10000";
    else if (d->pos != POS_MROPE)
        bad = "model.decoder.pos: Qwen2.5-VL uses mrope";
    else if (e->kv_heads != e->heads)
        bad = "model.encoder.kv_heads: Qwen2.5-VL's vision attention is not grouped";
    else if (e->head_dim * e->heads != e->hidden || d->head_dim * d->heads != d->hidden)
        bad = "head_dim: Qwen2.5-VL has head_dim = hidden / heads";
    else if (sh->projector.hidden !=
             sh->encoder.spatial_merge * sh->encoder.spatial_merge * e->hidden)
        bad = "model.projector.hidden: Qwen2.5-VL's merger is spatial_merge^2 * "
              "encoder.hidden wide";
    else if (sh->projector.gelu != GELU_ERF || !sh->projector.bias)
        bad = "model.projector: Qwen2.5-VL's merger uses exact (erf) GELU and biases";
    else if (sh->decoder.moe_experts)
        bad = "model.decoder.moe: Qwen2.5-VL is dense";
    if (bad)
        return herr_set(err, HERR_CONFIG, "not a Qwen2.5-VL shape: %s", bad);
    return 0;
}

/* A field's value as its JSON text would read: floats and doubles in their shortest
 * form (1e-05, not 9.999999747e-06). */
static void field_text(const model_shape *sh, const hf_field *f, char *out)
{
    const char *p = (const char *)sh + f->off;
    if (f->type == HF_FLOAT)
        hf_json_format_real(hf_json_float_value(*(const float *)p), out);
    else if (f->type == HF_DOUBLE)
        hf_json_format_real(*(const double *)p, out);
    else if (f->type == HF_BOOL)
        strcpy(out, *(const int *)p ? "true" : "false");
    else
        sprintf(out, "%d", *(const int *)p);
}

int hf_config_check(const model_shape *sh, const model_shape *hf, const char *file,
                    hearth_err *err)
{
    for (int i = 0; i < N_FIELDS; i++) {
        const hf_field *f = &FIELDS[i];
        char a[40], b[40];
        if (field_get(hf, f) != field_get(sh, f)) {
            field_text(hf, f, a);
            field_text(sh, f, b);
            return herr_set(err, HERR_CONFIG, "%s: %s%s is %s, the run's %s is %s", file,
                            section_prefix(f->sec), f->key, a, f->ours, b);
        }
    }
    const encoder_shape *x = &hf->encoder, *y = &sh->encoder;
    int same = x->n_full_attn == y->n_full_attn;
    for (int i = 0; same && i < x->n_full_attn; i++)
        same = x->full_attn[i] == y->full_attn[i];
    if (!same)
        return herr_set(err, HERR_CONFIG, "%s: vision_config.fullatt_block_indexes differ "
                        "from the run's model.encoder.full_attn", file);
    for (int i = 0; i < 3; i++)
        if (hf->decoder.s.mrope_section[i] != sh->decoder.s.mrope_section[i])
            return herr_set(err, HERR_CONFIG, "%s: rope_scaling.mrope_section differs from "
                            "the run's model.decoder.mrope_section", file);
    return hf_config_check_arch(sh, err);
}

static void set_field(json_t *root, json_t *vis, const hf_field *f, const model_shape *sh)
{
    json_t *o = f->sec == SEC_VISION ? vis : root;
    double v = field_get(sh, f);
    /* a float field is written as the decimal it was most likely given as (1e-05), not
     * as the float's exact binary value widened to double */
    json_t *j = f->type == HF_BOOL ? json_boolean(v != 0) :
                f->type == HF_INT ? json_integer((json_int_t)v) :
                f->type == HF_FLOAT ? json_real(hf_json_float_value((float)v)) : json_real(v);
    json_object_set_new(o, f->key, j);
}

static json_t *int_array(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* config.json made from sh alone (no file it was read from) */
static json_t *config_make(const model_shape *sh, const char *torch_dtype)
{
    json_t *root = json_object(), *vis = json_object(), *rs = json_object();
    if (!root || !vis || !rs) {
        json_decref(root);
        json_decref(vis);
        json_decref(rs);
        return NULL;
    }
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("Qwen2_5_VLForConditionalGeneration"));
    json_object_set_new(root, "architectures", arch);
    json_object_set_new(root, "model_type", json_string("qwen2_5_vl"));
    json_object_set_new(root, "torch_dtype", json_string(torch_dtype));
    json_object_set_new(root, "hidden_act", json_string("silu"));
    json_object_set_new(root, "attention_dropout", json_real(0.0));
    json_object_set_new(root, "use_sliding_window", json_false());
    json_object_set_new(root, "use_cache", json_true());
    for (int i = 0; i < N_FIELDS; i++)
        set_field(root, vis, &FIELDS[i], sh);
    int img = sh->decoder.image_token_id;
    json_object_set_new(root, "vision_start_token_id", json_integer(img + HF_VISION_START_OFFSET));
    json_object_set_new(root, "vision_end_token_id", json_integer(img + HF_VISION_END_OFFSET));
    json_object_set_new(root, "video_token_id", json_integer(img + HF_VIDEO_OFFSET));
    json_object_set_new(rs, "type", json_string("mrope"));
    json_object_set_new(rs, "mrope_section", int_array(sh->decoder.s.mrope_section, 3));
    json_object_set_new(root, "rope_scaling", rs);
    json_object_set_new(vis, "model_type", json_string("qwen2_5_vl"));
    json_object_set_new(vis, "hidden_act", json_string("silu"));
    json_object_set_new(vis, "out_hidden_size", json_integer(sh->decoder.s.hidden));
    json_object_set_new(vis, "fullatt_block_indexes",
                        int_array(sh->encoder.full_attn, sh->encoder.n_full_attn));
    json_object_set_new(vis, "in_channels", json_integer(sh->encoder.in_channels));
    json_object_set_new(vis, "tokens_per_second", json_integer(2));
    json_object_set_new(root, "vision_config", vis);
    return root;
}

/* src's config.json with its dtype keys naming the exported weights' dtype */
static json_t *config_from(const hf_config *src, const char *torch_dtype)
{
    json_t *root = json_deep_copy(src->json);
    if (!root)
        return NULL;
    static const char *const sections[] = { NULL, "text_config", "vision_config" };
    static const char *const keys[] = { "torch_dtype", "dtype" };
    int top = 0;
    for (int s = 0; s < 3; s++) {
        json_t *o = sections[s] ? json_object_get(root, sections[s]) : root;
        for (int k = 0; json_is_object(o) && k < 2; k++)
            if (json_is_string(json_object_get(o, keys[k]))) {
                json_object_set_new(o, keys[k], json_string(torch_dtype));
                top += !s;
            }
    }
    /* a loader asking for the saved dtype ("auto") must find the one written */
    if (!top)
        json_object_set_new(root, "torch_dtype", json_string(torch_dtype));
    return root;
}

int hf_config_write(const model_shape *sh, const hf_config *src, const char *dir,
                    const char *torch_dtype, hearth_err *err)
{
    int rc = src ? hf_config_check(sh, &src->shape, src->file, err)
                 : hf_config_check_arch(sh, err);
    if (rc)
        return rc;
    json_t *root = src ? config_from(src, torch_dtype) : config_make(sh, torch_dtype);
    if (!root)
        return herr_set(err, HERR_NOMEM, "config.json: out of memory");
    /* transformers writes sorted keys; a file read keeps its own order */
    char *text = hf_json_dump(root, HF_JSON_INDENT | HF_JSON_NEWLINE |
                                    (src ? 0 : HF_JSON_SORT_KEYS));
    json_decref(root);
    if (!text)
        return herr_set(err, HERR_NOMEM, "config.json: out of memory");
    rc = outputs_write_atomic(dir, "config.json", text, err);
    free(text);
    return rc;
}
