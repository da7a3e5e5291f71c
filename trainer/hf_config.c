#include "hf_config.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "outputs.h"
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

int hf_config_read(model_shape *out, const char *dir, hearth_err *err)
{
    char file[4096];
    snprintf(file, sizeof file, "%s/config.json", dir);
    json_t *root;
    int rc = file_read_json(file, FILE_READ_MAX_TEXT, 0, &root, err);
    if (rc)
        return rc == HERR_IO ? HERR_CONFIG : rc;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "hf:%.58s", dir);
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    json_t *vis = json_object_get(root, "vision_config");
    if (mt && strcmp(mt, "qwen2_5_vl") != 0)
        rc = herr_set(err, HERR_CONFIG, "%s: model_type: \"%s\" is not supported (expected "
                      "qwen2_5_vl)", file, mt);
    else if (!json_is_object(vis))
        rc = herr_set(err, HERR_CONFIG, "%s: vision_config: missing (a Qwen2.5-VL config "
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
    const char *act = json_string_value(json_object_get(vis, "hidden_act"));
    if (!rc && act && strcmp(act, "silu") != 0)
        rc = herr_set(err, HERR_CONFIG, "%s: vision_config.hidden_act: \"%s\" is not "
                      "supported (Qwen2.5-VL uses silu)", file, act);
    json_decref(root);
    if (rc)
        return rc;
    arch_fill(out);
    if ((rc = shape_validate(out, err)))
        return herr_prefix(err, rc, "%s", file);
    return 0;
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

int hf_config_check(const model_shape *sh, const model_shape *hf, const char *file,
                    hearth_err *err)
{
    for (int i = 0; i < N_FIELDS; i++) {
        const hf_field *f = &FIELDS[i];
        double a = field_get(hf, f), b = field_get(sh, f);
        if (a != b)
            return herr_set(err, HERR_CONFIG, "%s: %s%s is %.9g, the run's %s is %.9g", file,
                            section_prefix(f->sec), f->key, a, f->ours, b);
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
    json_t *j = f->type == HF_BOOL ? json_boolean(v != 0) :
                f->type == HF_INT ? json_integer((json_int_t)v) : json_real(v);
    json_object_set_new(o, f->key, j);
}

static json_t *int_array(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

int hf_config_write(const model_shape *sh, const char *dir, const char *torch_dtype,
                    hearth_err *err)
{
    int rc = hf_config_check_arch(sh, err);
    if (rc)
        return rc;
    json_t *root = json_object(), *vis = json_object(), *rs = json_object();
    if (!root || !vis || !rs) {
        json_decref(root);
        json_decref(vis);
        json_decref(rs);
        return herr_set(err, HERR_NOMEM, "config.json: out of memory");
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
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (!text)
        return herr_set(err, HERR_NOMEM, "config.json: out of memory");
    rc = outputs_write_atomic(dir, "config.json", text, err);
    free(text);
    return rc;
}
