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

#include "hf_config.h"
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
    if (hf_weights_export(m, sub, ST_F32, 64 * 1024, &err))
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
    if (hf_weights_export(m, sub, ST_BF16, 0, &err))
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_checkpoint),
        cmocka_unit_test(test_export_roundtrip),
        cmocka_unit_test(test_bad_checkpoints),
        cmocka_unit_test(test_config_mismatch),
        cmocka_unit_test(test_preset_names),
    };
    return cmocka_run_group_tests_name("hf_parity", tests, NULL, NULL);
}
