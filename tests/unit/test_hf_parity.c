/* test_hf_parity.c - Qwen2.5-VL checkpoints from Hugging Face transformers in and out.
 *
 * tests/data/hf-qwen2.5-vl-tiny holds a small random Qwen2.5-VL saved by transformers
 * (contrib/hf/qwen_parity.py make: 4 windowed/full ViT layers, 2 decoder layers, bf16
 * weights, two images of which one is not divisible by the window) and the logits and
 * loss transformers computed in fp32 on fixed inputs.  hearth loads it and must reproduce
 * both (relative 1e-4); its export must load back bit for bit; bad checkpoints and
 * configs must be refused with a message naming the tensor or key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "hf_config.h"
#include "hf_json.h"
#include "hf_weights.h"
#include "model/model.h"
#include "safetensors.h"
#include "support/testutil.h"
#include "support/tmpdir.h"

#define FIXTURE "tests/data/hf-qwen2.5-vl-tiny"
#define TOL 1e-4

typedef struct {
    st_file *f;
    int n, n_images;
    int *tokens, *targets, *grid;
    float *pixels;
    const st_tensor *logits;
    double loss;
} parity_inputs;

static int *ints_of(const st_tensor *t)
{
    assert_true(t->dtype == ST_I64);
    int *out = tu_ialloc(t->numel);
    const int64_t *v = t->data;
    for (size_t i = 0; i < t->numel; i++)
        out[i] = (int)v[i];
    return out;
}

static const st_tensor *need(st_file *f, const char *name)
{
    const st_tensor *t = st_file_find(f, name);
    if (!t)
        fail_msg("parity.safetensors: no %s", name);
    return t;
}

static void inputs_load(parity_inputs *p)
{
    hearth_err err;
    memset(p, 0, sizeof *p);
    if (st_file_open(&p->f, FIXTURE "/parity.safetensors", &err))
        fail_msg("%s", err.msg);
    const st_tensor *ids = need(p->f, "input_ids"), *lab = need(p->f, "labels");
    p->n = (int)ids->numel;
    p->tokens = ints_of(ids);
    int *labels = ints_of(lab);
    /* transformers shifts: position i predicts labels[i + 1]; -100 means none */
    p->targets = tu_ialloc((size_t)p->n);
    for (int i = 0; i < p->n; i++)
        p->targets[i] = i + 1 < p->n && labels[i + 1] != -100 ? labels[i + 1] : -1;
    free(labels);
    const st_tensor *g = need(p->f, "image_grid_thw");
    p->n_images = (int)g->shape[0];
    p->grid = ints_of(g);
    const st_tensor *px = need(p->f, "pixel_values");
    p->pixels = tu_falloc(px->numel);
    if (st_tensor_to_f32(px, p->pixels, px->numel, &err))
        fail_msg("%s", err.msg);
    p->logits = need(p->f, "logits");
    float loss;
    if (st_tensor_to_f32(need(p->f, "loss"), &loss, 1, &err))
        fail_msg("%s", err.msg);
    p->loss = loss;
}

static void inputs_free(parity_inputs *p)
{
    free(p->tokens);
    free(p->targets);
    free(p->grid);
    free(p->pixels);
    st_file_close(p->f);
}

static model *load_model(const char *dir)
{
    model_shape sh;
    hearth_err err;
    model *m;
    if (hf_config_read(&sh, dir, &err))
        fail_msg("%s", err.msg);
    if (model_create(&m, &sh, 1, &err))
        fail_msg("model_create: %s", err.msg);
    if (hf_weights_load(m, dir, &err))
        fail_msg("%s", err.msg);
    return m;
}

/* Forward on the fixture's inputs: the mean loss and the relative L2 error of the logits
 * (final hidden x embedding^T in double) against transformers'. */
static void forward_compare(model *m, const parity_inputs *p, double *loss_rel,
                            double *logits_rel)
{
    vlm_batch b = { .n_seq = 1, .seq_len = p->n, .tokens = p->tokens, .targets = p->targets,
                    .n_images = p->n_images, .grid_thw = p->grid, .pixels = p->pixels };
    model_stats st;
    hearth_err err;
    if (model_forward(m, &b, &st, &err))
        fail_msg("model_forward: %s", err.msg);
    double loss = st.loss_sum / st.n_targets;
    *loss_rel = fabs(loss - p->loss) / fabs(p->loss);

    int n, H;
    const float *h = model_last_hidden(m, &n, &H);
    assert_non_null(h);
    assert_int_equal(n, p->n);
    const model_tensor *e = model_tensor_find(m, "decoder.embed.weight");
    assert_non_null(e);
    int V = (int)e->dims[0];
    assert_int_equal((int)p->logits->numel, n * V);
    float *ref = tu_falloc(p->logits->numel);
    if (st_tensor_to_f32(p->logits, ref, p->logits->numel, &err))
        fail_msg("%s", err.msg);
    const float *w = model_params(m) + e->offset;
    double d2 = 0, r2 = 0;
    for (int i = 0; i < n; i++)
        for (int v = 0; v < V; v++) {
            double z = 0;
            for (int k = 0; k < H; k++)
                z += (double)h[(size_t)i * H + k] * w[(size_t)v * H + k];
            double r = ref[(size_t)i * V + v];
            d2 += (z - r) * (z - r);
            r2 += r * r;
        }
    *logits_rel = sqrt(d2 / r2);
    free(ref);
}

static void test_transformers_checkpoint(void **state)
{
    (void)state;
    parity_inputs p;
    inputs_load(&p);
    model *m = load_model(FIXTURE);
    double lr, gr;
    forward_compare(m, &p, &lr, &gr);
    printf("# loss relative %.3e, logits relative L2 %.3e (transformers fp32)\n", lr, gr);
    assert_true(lr <= TOL);
    assert_true(gr <= TOL);
    model_free(m);
    inputs_free(&p);
}

/* Export (random parameters: fresh each run) and load back: bitwise equal in F32; in
 * BF16 equal to the parameters rounded to bf16; the config reads back to the same shape;
 * sharding splits the file and still loads. */
static void test_export_roundtrip(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    model *m = load_model(FIXTURE);
    size_t np = model_param_count(m);
    tu_fill_normal(&rng, model_params(m), np, 0.0f, 0.5f);
    char dir[256], sub[300];
    hearth_err err;
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "hfexp"), 0);

    snprintf(sub, sizeof sub, "%s/f32", dir);
    if (hf_weights_export(m, NULL, sub, ST_F32, 64 * 1024, &err))
        fail_msg("%s", err.msg);
    model_shape a, b;
    if (hf_config_read(&a, sub, &err) || hf_config_read(&b, FIXTURE, &err))
        fail_msg("%s", err.msg);
    if (hf_config_check(model_get_shape(m), &a, sub, &err))
        fail_msg("exported config: %s", err.msg);
    char idx[400];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", sub);
    FILE *f = fopen(idx, "r");
    assert_non_null(f);   /* 64 KiB shards: the export is sharded */
    fclose(f);
    model *m2 = load_model(sub);
    assert_true(tu_bitwise_equal(model_params(m), model_params(m2), np));
    model_free(m2);

    snprintf(sub, sizeof sub, "%s/bf16", dir);
    if (hf_weights_export(m, NULL, sub, ST_BF16, 0, &err))
        fail_msg("%s", err.msg);
    m2 = load_model(sub);
    const float *x = model_params(m), *y = model_params(m2);
    for (size_t i = 0; i < np; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;   /* round to nearest even */
        float r;
        memcpy(&r, &u, 4);
        if (r != y[i])
            fail_msg("bf16 export: parameter %zu: %.9g read back as %.9g (expected %.9g)", i,
                     x[i], y[i], r);
    }
    model_free(m2);
    model_free(m);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* Copies FIXTURE's config and writes model.safetensors with every tensor of the fixture
 * except `drop` (NULL: none) and plus `extra` (NULL: none). */
static void write_variant(const char *dir, const char *drop, const char *extra,
                          int64_t shrink_first)
{
    hearth_err err;
    st_file *src;
    if (st_file_open(&src, FIXTURE "/model.safetensors", &err))
        fail_msg("%s", err.msg);
    st_writer *w;
    assert_int_equal(st_writer_init(&w, &err), 0);
    assert_int_equal(st_writer_metadata(w, "format", "pt", &err), 0);
    for (int i = 0; i < st_file_count(src); i++) {
        const st_tensor *t = st_file_at(src, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        int64_t shape[ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        size_t nb = t->nbytes;
        if (shrink_first && i == 0) {
            nb = nb / (size_t)shape[0] * (size_t)(shape[0] - shrink_first);
            shape[0] -= shrink_first;
        }
        if (st_writer_add(w, t->name, t->dtype, t->ndim, shape, t->data, nb, &err))
            fail_msg("%s", err.msg);
    }
    if (extra) {
        static const float one = 1.0f;
        int64_t s1 = 1;
        assert_int_equal(st_writer_add(w, extra, ST_F32, 1, &s1, &one, 4, &err), 0);
    }
    char path[400], cmd[1000];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_writer_write(w, path, &err))
        fail_msg("%s", err.msg);
    st_writer_free(w);
    st_file_close(src);
    snprintf(cmd, sizeof cmd, "cp " FIXTURE "/config.json %s/config.json", dir);
    assert_int_equal(system(cmd), 0);
}

static void expect_load_error(const char *dir, const char *needle)
{
    model_shape sh;
    hearth_err err;
    model *m;
    if (hf_config_read(&sh, FIXTURE, &err) || model_create(&m, &sh, 1, &err))
        fail_msg("%s", err.msg);
    int rc = hf_weights_load(m, dir, &err);
    if (rc == 0 || !strstr(err.msg, needle))
        fail_msg("expected an error naming \"%s\", got rc %d: %s", needle, rc,
                 rc ? err.msg : "(none)");
    model_free(m);
}

static void test_bad_checkpoints(void **state)
{
    (void)state;
    char dir[256];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "hfbad"), 0);
    write_variant(dir, "model.layers.1.self_attn.k_proj.weight", NULL, 0);
    expect_load_error(dir, "model.layers.1.self_attn.k_proj.weight");
    write_variant(dir, NULL, "visual.blocks.9.norm1.weight", 0);
    expect_load_error(dir, "visual.blocks.9.norm1.weight");
    write_variant(dir, NULL, NULL, 1);   /* first tensor one row short */
    expect_load_error(dir, "elements");
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* A config whose fields differ from the run's shape: the message names both keys. */
static void test_config_mismatch(void **state)
{
    (void)state;
    model_shape hf, run;
    hearth_err err;
    if (hf_config_read(&hf, FIXTURE, &err))
        fail_msg("%s", err.msg);
    run = hf;
    assert_int_equal(hf_config_check(&run, &hf, "config.json", &err), 0);
    run.encoder.s.layers = 5;
    assert_int_not_equal(hf_config_check(&run, &hf, "config.json", &err), 0);
    assert_non_null(strstr(err.msg, "vision_config.depth"));
    assert_non_null(strstr(err.msg, "model.encoder.layers"));
    run = hf;
    run.decoder.s.kv_heads = 4;
    assert_int_not_equal(hf_config_check(&run, &hf, "config.json", &err), 0);
    assert_non_null(strstr(err.msg, "num_key_value_heads"));
    run = hf;
    run.decoder.s.bias_proj = 1;
    assert_int_not_equal(hf_config_check(&run, &hf, "config.json", &err), 0);
    assert_non_null(strstr(err.msg, "model.decoder.bias"));
    run = hf;
    run.projector.gelu = GELU_TANH;
    assert_int_not_equal(hf_config_check(&run, &hf, "config.json", &err), 0);
    assert_non_null(strstr(err.msg, "model.projector"));

    char dir[256], path[400];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "hfcfg"), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_text(path, "{\"model_type\": \"qwen2_5_vl\", \"vision_config\": "
                                         "{\"depth\": 2}, \"hidden_size\": \"wide\"}"), 0);
    assert_int_not_equal(hf_config_read(&hf, dir, &err), 0);
    assert_non_null(strstr(err.msg, "hidden_size"));
    assert_int_equal(tu_write_text(path, "{\"model_type\": \"llama\"}"), 0);
    assert_int_not_equal(hf_config_read(&hf, dir, &err), 0);
    assert_non_null(strstr(err.msg, "llama"));
    assert_int_equal(tu_write_text(path, "{\"model_type\": "), 0);
    assert_int_not_equal(hf_config_read(&hf, dir, &err), 0);
    assert_non_null(strstr(err.msg, "config.json:1:"));
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* Every tensor of the real presets has a transformers name: the 3B and 7B shapes map
 * completely (their parameter counts equal the hub checkpoints', test_shape_presets). */
static void test_preset_names(void **state)
{
    (void)state;
    static const char *presets[] = { "qwen2.5-vl-3b", "qwen2.5-vl-7b" };
    for (size_t k = 0; k < 2; k++) {
        model_shape sh;
        hearth_err err;
        if (preset_load(&sh, presets[k], &err))
            fail_msg("%s", err.msg);
        if (hf_config_check_arch(&sh, &err))
            fail_msg("%s: %s", presets[k], err.msg);
    }
    char names[HF_MAX_PARTS][ST_NAME_MAX];
    assert_int_equal(hf_weights_names("decoder.layers.12.attn.qkv.bias", names), 3);
    assert_string_equal(names[2], "model.layers.12.self_attn.v_proj.bias");
    assert_int_equal(hf_weights_names("encoder.layers.31.mlp.gate_up.weight", names), 2);
    assert_string_equal(names[1], "visual.blocks.31.mlp.up_proj.weight");
    assert_int_equal(hf_weights_names("decoder.layers.1.mlp.experts.down.weight", names), 0);
    assert_int_equal(hf_weights_names("decoder.layers.x.attn.qkv.bias", names), 0);
}


/* The whole text of a file (malloc'd). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (n + 2 > cap)
            buf = realloc(buf, cap = cap ? 2 * cap : 4096);
        assert_non_null(buf);
        buf[n++] = (char)c;
    }
    fclose(f);
    if (!buf)
        buf = malloc(1);
    buf[n] = '\0';
    return buf;
}

/* Sets the dotted `path` of root to the JSON text `value` (NULL: deletes it). */
static void json_set_path(json_t *root, const char *path, const char *value)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *o = root;
    char *key = buf, *dot;
    while ((dot = strchr(key, '.'))) {
        *dot = '\0';
        json_t *n = json_object_get(o, key);
        if (!n) {
            n = json_object();
            json_object_set_new(o, key, n);
        }
        o = n;
        key = dot + 1;
    }
    if (!value) {
        json_object_del(o, key);
        return;
    }
    json_error_t je;
    json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
    if (!v)
        fail_msg("bad test value %s: %s", value, je.text);
    json_object_set_new(o, key, v);
}

/* Writes DIR/config.json: `base`'s config with up to 3 (path, value) changes. */
#define MAX_EDITS 3
typedef struct {
    const char *path, *value;
} config_edit;

static void config_variant(const char *dir, const char *base, const config_edit *edits)
{
    char src[400], dst[400];
    snprintf(src, sizeof src, "%s/config.json", base);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(src, 0, &je);
    if (!root)
        fail_msg("%s: %s", src, je.text);
    for (int i = 0; i < MAX_EDITS && edits[i].path; i++)
        json_set_path(root, edits[i].path, edits[i].value);
    char *text = hf_json_dump(root, HF_JSON_INDENT | HF_JSON_NEWLINE);
    assert_non_null(text);
    assert_int_equal(tu_write_text(dst, text), 0);
    free(text);
    json_decref(root);
}

typedef struct {
    config_edit edits[MAX_EDITS];
    const char *key, *value;   /* what the refusal must name */
} refusal;

/* Each config.json key that changes the model, with a value that changes it: refused,
 * the message naming the key, the value and "not supported" with the rule. */
static void test_config_keys_refused(void **state)
{
    (void)state;
    static const refusal cases[] = {
        { { { "text_config.rope_parameters.rope_type", "\"linear\"" },
            { "text_config.rope_parameters.factor", "4.0" } },
          "text_config.rope_parameters.rope_type", "\"linear\"" },
        { { { "text_config.rope_parameters", NULL },
            { "rope_scaling", "{\"type\": \"linear\", \"factor\": 4.0, "
                              "\"mrope_section\": [2, 3, 3]}" } },
          "rope_scaling.type", "\"linear\"" },
        { { { "text_config.rope_parameters.factor", "4.0" } },
          "text_config.rope_parameters.factor", "4.0" },
        { { { "text_config.rope_parameters.mrope_interleaved", "true" } },
          "text_config.rope_parameters.mrope_interleaved", "true" },
        { { { "text_config.partial_rotary_factor", "0.5" } },
          "text_config.partial_rotary_factor", "0.5" },
        { { { "text_config.use_sliding_window", "true" },
            { "text_config.sliding_window", "8" },
            { "text_config.max_window_layers", "1" } },
          "text_config.use_sliding_window", "true" },
        { { { "use_sliding_window", "true" }, { "sliding_window", "8" },
            { "max_window_layers", "0" } },
          "use_sliding_window", "sliding_window 8" },
        { { { "text_config.layer_types", "[\"full_attention\", \"sliding_attention\"]" } },
          "text_config.layer_types[1]", "\"sliding_attention\"" },
        { { { "text_config.hidden_act", "\"gelu\"" } }, "text_config.hidden_act", "\"gelu\"" },
        { { { "vision_config.hidden_act", "\"gelu_pytorch_tanh\"" } },
          "vision_config.hidden_act", "\"gelu_pytorch_tanh\"" },
        { { { "vision_config.rope_theta", "500.0" } }, "vision_config.rope_theta", "500.0" },
        { { { "vision_config.rope_parameters.rope_theta", "500.0" } },
          "vision_config.rope_parameters.rope_theta", "500.0" },
        { { { "vision_config.rope_parameters.rope_type", "\"dynamic\"" } },
          "vision_config.rope_parameters.rope_type", "\"dynamic\"" },
        { { { "text_config.attention_dropout", "0.1" } },
          "text_config.attention_dropout", "0.1" },
        { { { "text_config.head_dim", "8" } }, "text_config.head_dim", "8" },
        { { { "text_config.attention_bias", "false" } },
          "text_config.attention_bias", "false" },
        { { { "text_config.num_experts", "4" } }, "text_config.num_experts", "4" },
        { { { "vision_config.deepstack_visual_indexes", "[1]" } },
          "vision_config.deepstack_visual_indexes", "[1]" },
        { { { "vision_config.num_position_embeddings", "64" } },
          "vision_config.num_position_embeddings", "64" },
        { { { "quantization_config", "{\"quant_method\": \"fp8\"}" } },
          "quantization_config", "fp8" },
        { { { "pruned_heads", "{\"0\": [1]}" } }, "pruned_heads", "[1]" },
        { { { "text_config.model_type", "\"qwen3_vl_text\"" } },
          "text_config.model_type", "\"qwen3_vl_text\"" },
        { { { "vision_config.model_type", "\"qwen3_vl\"" } },
          "vision_config.model_type", "\"qwen3_vl\"" },
        { { { "model_type", "\"qwen3_vl_moe\"" } }, "model_type", "qwen3_vl_moe" },
        { { { "text_config.use_sliding_window", "1" } },
          "text_config.use_sliding_window", "expected true or false" },
    };
    char dir[256];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "hfkeys"), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const refusal *c = &cases[i];
        config_variant(dir, FIXTURE, c->edits);
        model_shape sh;
        hearth_err err;
        int rc = hf_config_read(&sh, dir, &err);
        char key[300];
        snprintf(key, sizeof key, ": %s: ", c->key);
        if (rc != HERR_CONFIG || !strstr(err.msg, key) || !strstr(err.msg, c->value))
            fail_msg("case %zu (%s): expected a refusal naming \"%s\" and \"%s\", got rc %d: "
                     "%s", i, c->key, c->key, c->value, rc, rc ? err.msg : "(accepted)");
        if (!strstr(c->value, "expected") && !strstr(err.msg, "not supported"))
            fail_msg("case %zu: the message names no rule: %s", i, err.msg);
    }
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

typedef struct {
    config_edit edits[MAX_EDITS];
    const char *unknown;       /* expected hf_config.unknown (NULL: none) */
} acceptance;

/* The values of those keys that change nothing are accepted (the normal case of real
 * checkpoints); unknown keys are accepted and listed by their dotted names. */
static void test_config_keys_accepted(void **state)
{
    (void)state;
    static const acceptance cases[] = {
        { { { NULL, NULL } }, NULL },
        { { { "text_config.rope_parameters.rope_type", "\"mrope\"" } }, NULL },
        { { { "text_config.rope_parameters", NULL },
            { "rope_scaling", "{\"type\": \"mrope\", \"mrope_section\": [2, 3, 3]}" } },
          NULL },
        { { { "text_config.rope_parameters", NULL },
            { "text_config.rope_scaling", "{\"type\": \"default\", \"rope_type\": "
                                          "\"default\", \"mrope_section\": [2, 3, 3]}" } },
          NULL },
        { { { "text_config.use_sliding_window", "false" },
            { "text_config.sliding_window", "32768" },
            { "text_config.max_window_layers", "0" } }, NULL },
        { { { "text_config.use_sliding_window", "true" },
            { "text_config.sliding_window", "4096" },
            { "text_config.max_window_layers", "80" } }, NULL },
        { { { "text_config.hidden_act", "\"silu\"" }, { "vision_config.rope_theta", "10000.0" },
            { "text_config.head_dim", "16" } }, NULL },
        { { { "text_config.num_experts", "0" },
            { "vision_config.deepstack_visual_indexes", "[]" },
            { "text_config.rope_parameters.factor", "1.0" } }, NULL },
        { { { "text_config.attention_dropout", "0.0" },
            { "text_config.rope_parameters.mrope_interleaved", "false" },
            { "quantization_config", "null" } }, NULL },
        { { { "foo_bar", "1" } }, "foo_bar" },
        { { { "vision_config.baz", "\"x\"" }, { "text_config.rope_parameters.qux", "2" } },
          "text_config.rope_parameters.qux, vision_config.baz" },
    };
    char dir[256];
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "hfkeys"), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        config_variant(dir, FIXTURE, cases[i].edits);
        hf_config *c;
        hearth_err err;
        if (hf_config_load(&c, dir, &err))
            fail_msg("case %zu: refused: %s", i, err.msg);
        const char *want = cases[i].unknown;
        if (want ? !c->unknown || strcmp(c->unknown, want) : c->unknown != NULL)
            fail_msg("case %zu: unknown keys \"%s\", expected \"%s\"", i,
                     c->unknown ? c->unknown : "(none)", want ? want : "(none)");
        hf_config_free(c);
    }
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* The hub's Qwen2.5-VL-3B/7B config.json files: every key known, the shapes equal the
 * presets, written back byte for byte.  Qwen3-VL-30B-A3B's is refused by model_type and,
 * labelled qwen2_5_vl, by the first key that changes the model. */
static void test_real_configs(void **state)
{
    (void)state;
    static const char *const names[] = { "qwen2.5-vl-3b", "qwen2.5-vl-7b" };
    char tmp[256], dir[300], path[400];
    assert_int_equal(tu_tmpdir_make(tmp, sizeof tmp, "hfreal"), 0);
    for (int k = 0; k < 2; k++) {
        hf_config *c;
        model_shape preset;
        hearth_err err;
        snprintf(dir, sizeof dir, "tests/data/hf-configs/%s", names[k]);
        if (hf_config_load(&c, dir, &err) || preset_load(&preset, names[k], &err))
            fail_msg("%s: %s", names[k], err.msg);
        if (c->unknown)
            fail_msg("%s: unknown keys %s", names[k], c->unknown);
        if (hf_config_check(&preset, &c->shape, c->file, &err))
            fail_msg("%s: %s", names[k], err.msg);
        if (hf_config_write(&preset, c, tmp, "bfloat16", &err))
            fail_msg("%s: %s", names[k], err.msg);
        snprintf(path, sizeof path, "%s/config.json", tmp);
        char *a = slurp(c->file), *b = slurp(path);
        assert_string_equal(a, b);
        free(a);
        free(b);
        hf_config_free(c);
    }
    model_shape sh;
    hearth_err err;
    assert_int_equal(hf_config_read(&sh, "tests/data/hf-configs/qwen3-vl-30b-a3b", &err),
                     HERR_CONFIG);
    assert_non_null(strstr(err.msg, "model_type: \"qwen3_vl_moe\" is not supported"));
    static const config_edit relabel[MAX_EDITS] = { { "model_type", "\"qwen2_5_vl\"" } };
    config_variant(tmp, "tests/data/hf-configs/qwen3-vl-30b-a3b", relabel);
    assert_int_equal(hf_config_read(&sh, tmp, &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "text_config.attention_bias: false is not supported"));
    assert_int_equal(tu_tmpdir_remove(tmp), 0);
}

/* Export writes config.json as it was read (numbers in their own text: rms_norm_eps
 * 1e-05, tokens_per_second 4), only the dtype following the weights; a config made from
 * a shape alone writes floats in their shortest form. */
static void test_config_export_exact(void **state)
{
    (void)state;
    char dir[256], src[300], out[300], path[400];
    hearth_err err;
    assert_int_equal(tu_tmpdir_make(dir, sizeof dir, "hfexact"), 0);
    snprintf(src, sizeof src, "%s/src", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    assert_int_equal(mkdir(src, 0777), 0);
    static const config_edit eps[MAX_EDITS] = { { "text_config.rms_norm_eps", "1e-05" } };
    config_variant(src, FIXTURE, eps);
    hf_config *c;
    if (hf_config_load(&c, src, &err))
        fail_msg("%s", err.msg);
    assert_true(c->shape.decoder.s.norm_eps == 1e-5f);
    model *m;
    if (model_create(&m, &c->shape, 1, &err))
        fail_msg("%s", err.msg);
    if (hf_weights_export(m, c, out, ST_BF16, 0, &err))
        fail_msg("%s", err.msg);
    snprintf(path, sizeof path, "%s/config.json", out);
    char *a = slurp(c->file), *b = slurp(path);
    assert_string_equal(a, b);   /* the fixture's dtype is bfloat16 already */
    assert_non_null(strstr(b, "\"rms_norm_eps\": 1e-05,"));
    assert_non_null(strstr(b, "\"tokens_per_second\": 4,"));
    free(b);
    if (hf_weights_export(m, c, out, ST_F32, 0, &err))
        fail_msg("%s", err.msg);
    b = slurp(path);
    char *d = strstr(a, "\"dtype\": \"bfloat16\"");
    assert_non_null(d);
    size_t pre = (size_t)(d - a);
    assert_int_equal(strncmp(a, b, pre), 0);
    assert_int_equal(strncmp(b + pre, "\"dtype\": \"float32\"", 18), 0);
    assert_string_equal(a + pre + 19, b + pre + 18);
    free(b);

    /* no source: made from the shape */
    if (hf_weights_export(m, NULL, out, ST_F32, 0, &err))
        fail_msg("%s", err.msg);
    b = slurp(path);
    assert_non_null(strstr(b, "\"rms_norm_eps\": 1e-05,"));
    assert_non_null(strstr(b, "\"rope_theta\": 1000000.0,"));
    model_shape back;
    if (hf_config_read(&back, out, &err) || hf_config_check(&c->shape, &back, path, &err))
        fail_msg("%s", err.msg);
    free(a);
    free(b);
    model_free(m);

    /* a run whose shape differs from the source is not exported with it */
    model_shape other = c->shape;
    other.decoder.s.norm_eps = 1e-6f;
    assert_int_equal(hf_config_write(&other, c, out, "float32", &err), HERR_CONFIG);
    assert_non_null(strstr(err.msg, "rms_norm_eps is 1e-05, the run's model.decoder.norm_eps "
                                    "is 1e-06"));
    hf_config_free(c);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
}

/* Numbers and strings as Python's json.dumps writes them. */
static void test_json_python_text(void **state)
{
    (void)state;
    static const struct {
        double v;
        const char *text;
    } reals[] = {
        { 1e-6, "1e-06" }, { 1e-5, "1e-05" }, { 1e6, "1000000.0" }, { 0.02, "0.02" },
        { 0.0001, "0.0001" }, { 1e16, "1e+16" }, { 1e15, "1000000000000000.0" },
        { 1.5e-7, "1.5e-07" }, { 0.1, "0.1" }, { -2.5, "-2.5" }, { 0.0, "0.0" },
        { 123456789.125, "123456789.125" }, { 5e-324, "5e-324" },
        { 1.7976931348623157e308, "1.7976931348623157e+308" }, { 10000.0, "10000.0" },
        { 9.999999747378752e-06, "9.999999747378752e-06" },
    };
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        char t[40];
        hf_json_format_real(reals[i].v, t);
        if (strcmp(t, reals[i].text))
            fail_msg("%.17g: \"%s\", Python writes \"%s\"", reals[i].v, t, reals[i].text);
    }
    assert_true(hf_json_float_value(1e-5f) == 1e-5);
    json_t *s = json_string("a\"\\\n\x7f\xc3\xa9\xf0\x9f\x98\x80/");
    char *text = hf_json_dump(s, 0);
    assert_string_equal(text, "\"a\\\"\\\\\\n\\u007f\\u00e9\\ud83d\\ude00/\"");
    free(text);
    json_decref(s);
    json_t *o = json_pack("{s:[], s:{}, s:[i, b, n]}", "b", "a", "c", 1, 1);
    text = hf_json_dump(o, HF_JSON_INDENT | HF_JSON_SORT_KEYS | HF_JSON_NEWLINE);
    assert_string_equal(text, "{\n  \"a\": {},\n  \"b\": [],\n  \"c\": [\n    1,\n    true,\n"
                              "    null\n  ]\n}\n");
    free(text);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_checkpoint),
        cmocka_unit_test(test_export_roundtrip),
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_config_mismatch),
        cmocka_unit_test(test_preset_names),
        cmocka_unit_test(test_config_keys_refused),
        cmocka_unit_test(test_config_keys_accepted),
        cmocka_unit_test(test_real_configs),
        cmocka_unit_test(test_config_export_exact),
        cmocka_unit_test(test_json_python_text),
    };
    return cmocka_run_group_tests_name("hf_parity", tests, NULL, NULL);
}
