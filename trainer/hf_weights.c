#include "hf_weights.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hf_config.h"

/* One mapping rule: our name pattern (one %d for the layer, or none) and its parts. */
typedef struct {
    const char *ours;
    const char *parts[HF_MAX_PARTS];
} hf_rule;

static const hf_rule RULES[] = {
    { "encoder.patch_embed.weight", { "visual.patch_embed.proj.weight" } },
    { "encoder.layers.%d.attn_norm.weight", { "visual.blocks.%d.norm1.weight" } },
    { "encoder.layers.%d.mlp_norm.weight", { "visual.blocks.%d.norm2.weight" } },
    { "encoder.layers.%d.attn.qkv.weight", { "visual.blocks.%d.attn.qkv.weight" } },
    { "encoder.layers.%d.attn.qkv.bias", { "visual.blocks.%d.attn.qkv.bias" } },
    { "encoder.layers.%d.attn.proj.weight", { "visual.blocks.%d.attn.proj.weight" } },
    { "encoder.layers.%d.attn.proj.bias", { "visual.blocks.%d.attn.proj.bias" } },
    { "encoder.layers.%d.mlp.gate_up.weight",
      { "visual.blocks.%d.mlp.gate_proj.weight", "visual.blocks.%d.mlp.up_proj.weight" } },
    { "encoder.layers.%d.mlp.gate_up.bias",
      { "visual.blocks.%d.mlp.gate_proj.bias", "visual.blocks.%d.mlp.up_proj.bias" } },
    { "encoder.layers.%d.mlp.down.weight", { "visual.blocks.%d.mlp.down_proj.weight" } },
    { "encoder.layers.%d.mlp.down.bias", { "visual.blocks.%d.mlp.down_proj.bias" } },
    { "projector.norm.weight", { "visual.merger.ln_q.weight" } },
    { "projector.fc1.weight", { "visual.merger.mlp.0.weight" } },
    { "projector.fc1.bias", { "visual.merger.mlp.0.bias" } },
    { "projector.fc2.weight", { "visual.merger.mlp.2.weight" } },
    { "projector.fc2.bias", { "visual.merger.mlp.2.bias" } },
    { "decoder.embed.weight", { "model.embed_tokens.weight" } },
    { "decoder.layers.%d.attn_norm.weight", { "model.layers.%d.input_layernorm.weight" } },
    { "decoder.layers.%d.mlp_norm.weight",
      { "model.layers.%d.post_attention_layernorm.weight" } },
    { "decoder.layers.%d.attn.qkv.weight",
      { "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
        "model.layers.%d.self_attn.v_proj.weight" } },
    { "decoder.layers.%d.attn.qkv.bias",
      { "model.layers.%d.self_attn.q_proj.bias", "model.layers.%d.self_attn.k_proj.bias",
        "model.layers.%d.self_attn.v_proj.bias" } },
    { "decoder.layers.%d.attn.proj.weight", { "model.layers.%d.self_attn.o_proj.weight" } },
    { "decoder.layers.%d.mlp.gate_up.weight",
      { "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight" } },
    { "decoder.layers.%d.mlp.down.weight", { "model.layers.%d.mlp.down_proj.weight" } },
    { "decoder.final_norm.weight", { "model.norm.weight" } },
    { "decoder.lm_head.weight", { "lm_head.weight" } },
};
#define N_RULES ((int)(sizeof RULES / sizeof RULES[0]))

/* Matches `name` against a pattern with at most one %d; *layer gets it (-1 if none). */
static int pattern_match(const char *pat, const char *name, int *layer)
{
    const char *d = strstr(pat, "%d");
    *layer = -1;
    if (!d)
        return strcmp(pat, name) == 0;
    size_t pre = (size_t)(d - pat);
    if (strncmp(pat, name, pre) != 0)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(name + pre, &end, 10);
    if (end == name + pre || errno || v < 0 || v > 1000000 || name[pre] == '+' ||
        name[pre] == '-')
        return 0;
    if (strcmp(end, d + 2) != 0)
        return 0;
    *layer = (int)v;
    return 1;
}

int hf_weights_names(const char *ours, char names[HF_MAX_PARTS][ST_NAME_MAX])
{
    for (int r = 0; r < N_RULES; r++) {
        int layer;
        if (!pattern_match(RULES[r].ours, ours, &layer))
            continue;
        int n = 0;
        for (; n < HF_MAX_PARTS && RULES[r].parts[n]; n++) {
            if (layer >= 0)
                snprintf(names[n], ST_NAME_MAX, RULES[r].parts[n], layer);
            else
                snprintf(names[n], ST_NAME_MAX, "%s", RULES[r].parts[n]);
        }
        return n;
    }
    return 0;
}

/* The newer transformers layout of a legacy name, or 0 when it has none. */
static int new_layout_name(const char *legacy, char *out, size_t cap)
{
    if (!strncmp(legacy, "visual.", 7))
        return snprintf(out, cap, "model.%s", legacy) < (int)cap;
    if (!strncmp(legacy, "model.", 6))
        return snprintf(out, cap, "model.language_model.%s", legacy + 6) < (int)cap;
    return 0;
}

static const st_tensor *set_find(const st_set *s, const char *legacy)
{
    const st_tensor *t = st_set_find(s, legacy);
    char alt[ST_NAME_MAX];
    if (!t && new_layout_name(legacy, alt, sizeof alt))
        t = st_set_find(s, alt);
    return t;
}

/* Whether checkpoint tensor `name` is one that loading m used (or may ignore). */
static int name_is_used(model *m, const char *name)
{
    if (!strcmp(name, "lm_head.weight") && model_get_shape(m)->decoder.tied_embeddings)
        return 1;
    char names[HF_MAX_PARTS][ST_NAME_MAX], alt[ST_NAME_MAX];
    for (int i = 0; i < model_tensor_count(m); i++) {
        int n = hf_weights_names(model_tensor_at(m, i)->name, names);
        for (int k = 0; k < n; k++)
            if (!strcmp(names[k], name) ||
                (new_layout_name(names[k], alt, sizeof alt) && !strcmp(alt, name)))
                return 1;
    }
    return 0;
}

/* Elements of one row of t as parts are concatenated: 1 for vectors. */
static size_t row_len(const model_tensor *t)
{
    return t->ndim == 1 ? 1 : (size_t)t->dims[t->ndim - 1];
}

int hf_weights_load(model *m, const char *dir, hearth_err *err)
{
    st_set *s;
    int rc = st_set_open(&s, dir, err);
    if (rc)
        return rc;
    float *params = model_params(m);
    char names[HF_MAX_PARTS][ST_NAME_MAX];
    for (int i = 0; !rc && i < model_tensor_count(m); i++) {
        const model_tensor *t = model_tensor_at(m, i);
        int n = hf_weights_names(t->name, names);
        if (!n) {
            rc = herr_set(err, HERR_CONFIG, "%s: tensor %s has no Qwen2.5-VL counterpart",
                          dir, t->name);
            break;
        }
        size_t cols = row_len(t), at = 0;
        for (int k = 0; !rc && k < n; k++) {
            const st_tensor *x = set_find(s, names[k]);
            if (!x)
                rc = herr_set(err, HERR_CONFIG, "%s: tensor %s (for %s) is missing", dir,
                              names[k], t->name);
            else if (x->numel > t->numel - at || (n > 1 && x->numel % cols))
                rc = herr_set(err, HERR_CONFIG, "%s: tensor %s has %zu elements, which do "
                              "not fit %s (%zu elements, rows of %zu)", dir, x->name,
                              x->numel, t->name, t->numel, cols);
            else if (!(rc = st_tensor_to_f32(x, params + t->offset + at, x->numel, err)))
                at += x->numel;
        }
        if (!rc && at != t->numel)
            rc = herr_set(err, HERR_CONFIG, "%s: %s has %zu elements, the checkpoint's "
                          "tensors for it %zu", dir, t->name, t->numel, at);
    }
    for (int i = 0; !rc && i < st_set_count(s); i++) {
        const char *name = st_set_at(s, i)->name;
        if (!name_is_used(m, name))
            rc = herr_set(err, HERR_CONFIG, "%s: tensor %s is not part of the model (another "
                          "architecture or shape?)", dir, name);
    }
    st_set_close(s);
    return rc;
}

/* Rows of each part of our tensor t (split by rows in the order of the names). */
static void part_rows(const model *m, const model_tensor *t, int n, int64_t rows[])
{
    int64_t all = (int64_t)(t->numel / row_len(t));
    if (n == 1) {
        rows[0] = all;
        return;
    }
    if (n == 2) {   /* gate, up */
        rows[0] = rows[1] = all / 2;
        return;
    }
    const stack_shape *d = &model_get_shape(m)->decoder.s;   /* q, k, v */
    rows[0] = (int64_t)d->heads * d->head_dim;
    rows[1] = rows[2] = (int64_t)d->kv_heads * d->head_dim;
}

static int add_tensor(st_writer *w, model *m, const model_tensor *t, st_dtype dtype,
                      hearth_err *err)
{
    char names[HF_MAX_PARTS][ST_NAME_MAX];
    int n = hf_weights_names(t->name, names);
    if (!n)
        return herr_set(err, HERR_CONFIG, "export: tensor %s has no Qwen2.5-VL counterpart",
                        t->name);
    const float *p = model_params(m) + t->offset;
    const encoder_shape *e = &model_get_shape(m)->encoder;
    if (!strcmp(t->name, "encoder.patch_embed.weight")) {
        /* transformers keeps the Conv3d's shape [H, C, T, P, P] */
        int64_t shape[5] = { t->dims[0], e->in_channels, e->temporal_patch, e->patch,
                             e->patch };
        return st_writer_add_f32(w, names[0], dtype, 5, shape, p, err);
    }
    int64_t rows[HF_MAX_PARTS], cols = (int64_t)row_len(t);
    part_rows(m, t, n, rows);
    for (int k = 0; k < n; k++) {
        int64_t shape[2] = { rows[k], cols };
        int rc = t->ndim == 1 ? st_writer_add_f32(w, names[k], dtype, 1, &rows[k], p, err)
                              : st_writer_add_f32(w, names[k], dtype, 2, shape, p, err);
        if (rc)
            return rc;
        p += rows[k] * cols;
    }
    return 0;
}

int hf_weights_export(model *m, const hf_config *src, const char *dir, st_dtype dtype,
                      size_t max_shard_bytes, hearth_err *err)
{
    if (dtype != ST_F32 && dtype != ST_BF16)
        return herr_set(err, HERR_CONFIG, "export: dtype must be F32 or BF16");
    /* checked before any file is written: a refused config leaves no partial export */
    int rc = src ? hf_config_check(model_get_shape(m), &src->shape, src->file, err)
                 : hf_config_check_arch(model_get_shape(m), err);
    if (rc)
        return herr_prefix(err, rc, "export");
    if (mkdir(dir, 0777) && errno != EEXIST)
        return herr_set(err, HERR_IO, "export: cannot create %s: %s", dir, strerror(errno));
    st_writer *w;
    if ((rc = st_writer_init(&w, err)))
        return rc;
    rc = st_writer_metadata(w, "format", "pt", err);
    for (int i = 0; !rc && i < model_tensor_count(m); i++)
        rc = add_tensor(w, m, model_tensor_at(m, i), dtype, err);
    if (!rc)
        rc = st_writer_write_dir(w, dir, max_shard_bytes, err);
    st_writer_free(w);
    if (!rc)
        rc = hf_config_write(model_get_shape(m), src, dir,
                             dtype == ST_BF16 ? "bfloat16" : "float32", err);
    return rc ? herr_prefix(err, rc, "export to %s", dir) : 0;
}
