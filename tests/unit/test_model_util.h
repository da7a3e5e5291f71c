/* test_model_util.h - helpers shared by the test_model_*.c files (header only): small
 * hand-filled model shapes and a random batch builder.
 *
 * Shapes are tiny but have every architecture feature of the presets they stand for; the
 * batch builder places whole images at random places in random sequences (adjacent
 * images included) with random text around them. */
#ifndef HEARTH_TEST_MODEL_UTIL_H
#define HEARTH_TEST_MODEL_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "support/testutil.h"

static inline void tm_stack(stack_shape *s, int layers, int hidden, int ffn, int heads, int kv,
                     int hd)
{
    memset(s, 0, sizeof *s);
    s->layers = layers;
    s->hidden = hidden;
    s->ffn = ffn;
    s->heads = heads;
    s->kv_heads = kv;
    s->head_dim = hd;
    s->norm = NORM_RMSNORM;
    s->norm_eps = 1e-6f;
    s->mlp = MLP_SWIGLU;
    s->gelu = GELU_ERF;
    s->pos = POS_ROPE;
    s->rope_theta = 10000.0;
}

/* GPT-2: LayerNorm, GELU (tanh), learned positions, biases everywhere, tied head. */
static inline model_shape tm_shape_gpt2(void)
{
    model_shape m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "test-gpt2");
    stack_shape *s = &m.decoder.s;
    tm_stack(s, 2, 32, 64, 4, 4, 8);
    s->norm = NORM_LAYERNORM;
    s->norm_eps = 1e-5f;
    s->mlp = MLP_GELU;
    s->gelu = GELU_TANH;
    s->bias_qkv = s->bias_proj = s->bias_mlp = 1;
    s->pos = POS_LEARNED;
    m.decoder.vocab = 53;
    m.decoder.tied_embeddings = 1;
    m.decoder.max_positions = 24;
    m.decoder.image_token_id = -1;
    return m;
}

/* Qwen2.5-VL-like: windowed ViT (window 2x2 merge units, full attention in layer 1),
 * 2x2 merge, temporal patch 2; decoder with GQA, mRoPE, q/k/v biases, untied head. */
static inline model_shape tm_shape_vlm(void)
{
    model_shape m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "test-vlm");
    encoder_shape *e = &m.encoder;
    e->present = 1;
    tm_stack(&e->s, 3, 32, 48, 2, 2, 16);
    e->s.bias_qkv = e->s.bias_proj = e->s.bias_mlp = 1;
    e->s.pos = POS_ROPE2D;
    e->in_channels = 3;
    e->patch = 2;
    e->temporal_patch = 2;
    e->spatial_merge = 2;
    e->window_px = 8;           /* 8 px / 2 px / 2 = windows of 2 x 2 units */
    e->n_full_attn = 1;
    e->full_attn[0] = 1;
    projector_shape *p = &m.projector;
    p->present = 1;
    p->hidden = 48;
    p->norm = NORM_RMSNORM;
    p->norm_eps = 1e-6f;
    p->gelu = GELU_ERF;
    p->bias = 1;
    stack_shape *s = &m.decoder.s;
    tm_stack(s, 2, 32, 64, 4, 2, 8);
    s->bias_qkv = 1;
    s->pos = POS_MROPE;
    s->mrope_section[0] = 2;
    s->mrope_section[1] = 1;
    s->mrope_section[2] = 1;
    s->rope_theta = 1000000.0;
    m.decoder.vocab = 61;
    m.decoder.tied_embeddings = 0;
    m.decoder.image_token_id = 60;
    return m;
}

/* Qwen3-VL-MoE-like: the VLM above with a MoE decoder (4 experts, top 2, shared expert,
 * MoE in every second layer), qk_norm, tied head, a LayerNorm/tanh projector without
 * biases, no ViT biases. */
static inline model_shape tm_shape_vlm_moe(void)
{
    model_shape m = tm_shape_vlm();
    snprintf(m.name, sizeof m.name, "test-vlm-moe");
    m.encoder.s.bias_qkv = m.encoder.s.bias_proj = m.encoder.s.bias_mlp = 0;
    m.encoder.s.layers = 2;
    m.encoder.full_attn[0] = 0;
    m.projector.norm = NORM_LAYERNORM;
    m.projector.gelu = GELU_TANH;
    m.projector.bias = 0;
    stack_shape *s = &m.decoder.s;
    s->layers = 4;
    s->bias_qkv = 0;
    s->qk_norm = 1;
    m.decoder.tied_embeddings = 1;
    m.decoder.moe_experts = 4;
    m.decoder.moe_top_k = 2;
    m.decoder.moe_ffn = 16;
    m.decoder.moe_shared_ffn = 24;
    m.decoder.moe_every = 2;
    m.decoder.moe_aux_coef = 0.01f;
    return m;
}

/* Moves the parameters away from the initialisation to generic values of a healthy
 * scale (uniform distributions, cheap to draw, with these standard deviations):
 * matrices 1/sqrt(fan_in), embeddings 0.3, norm weights 1 +- 0.2, biases 0.1.
 * At the 0.02 initialisation the gradients of the encoder, deep behind small weights,
 * are within the fp32 noise of the loss and would not be tested. */
static inline void tm_randomize_params(model *m, tu_rng *r)
{
    float *P = model_params(m);
    for (int t = 0; t < model_tensor_count(m); t++) {
        const model_tensor *T = model_tensor_at(m, t);
        float *p = P + T->offset;
        size_t nl = strlen(T->name);
        int bias = nl > 5 && strcmp(T->name + nl - 5, ".bias") == 0;
        int embed = strstr(T->name, "embed.weight") || strstr(T->name, "lm_head");
        double mean = 0, sd;
        if (bias)
            sd = 0.1;
        else if (T->ndim == 1)
            mean = 1, sd = 0.2;
        else if (embed && !strstr(T->name, "patch_embed"))
            sd = 0.3;
        else
            sd = 1.0 / sqrt((double)T->dims[T->ndim - 1]);
        double a = sd * sqrt(3.0);
        tu_fill_uniform(r, p, T->numel, (float)(mean - a), (float)(mean + a));
    }
}

/* ---- batches ------------------------------------------------------------------------- */

typedef struct {
    int *tokens, *targets, *grid;
    float *pixels;
    vlm_batch b;
} tm_batch;

static inline int tm_image_tokens(const model_shape *sh, const int *g)
{
    int m = sh->encoder.spatial_merge;
    return g[0] * (g[1] / m) * (g[2] / m);
}

/* n_seq sequences of seq_len tokens; image i (grid grids[3i..]) goes into sequence
 * img_seq[i] (non-decreasing).  Text tokens avoid image_token_id; targets are random
 * tokens at a fraction of the text positions, -1 elsewhere (always at image tokens). */
static inline void tm_make_batch(tm_batch *t, const model_shape *sh, tu_rng *r, int n_seq,
                          int seq_len, int n_images, const int *grids, const int *img_seq)
{
    size_t N = (size_t)n_seq * seq_len;
    int V = sh->decoder.vocab, img = sh->decoder.image_token_id;
    memset(t, 0, sizeof *t);
    t->tokens = tu_ialloc(N);
    t->targets = tu_ialloc(N);
    t->grid = tu_ialloc((size_t)(n_images ? n_images : 1) * 3);
    size_t patches = 0, pd = 0;
    if (n_images) {
        memcpy(t->grid, grids, (size_t)n_images * 3 * sizeof(int));
        pd = (size_t)sh->encoder.in_channels * sh->encoder.temporal_patch *
             sh->encoder.patch * sh->encoder.patch;
        for (int i = 0; i < n_images; i++)
            patches += (size_t)grids[3 * i] * grids[3 * i + 1] * grids[3 * i + 2];
    }
    t->pixels = tu_falloc(patches * pd + 1);
    tu_fill_normal(r, t->pixels, patches * pd, 0.0f, 1.0f);

    for (size_t i = 0; i < N; i++) {
        int tok;
        do
            tok = tu_randint(r, 0, V);
        while (tok == img);
        t->tokens[i] = tok;
        t->targets[i] = tu_uniform(r) < 0.8 ? tu_randint(r, 0, V) : -1;
    }
    int i0 = 0;
    for (int s = 0; s < n_seq; s++) {
        int i1 = i0;
        while (i1 < n_images && img_seq[i1] == s)
            i1++;
        int need = 0;
        for (int i = i0; i < i1; i++)
            need += tm_image_tokens(sh, grids + 3 * i);
        int free_ = seq_len - need;
        if (free_ < 0)
            free_ = 0;   /* the test made a mistake; the model will report it */
        /* Cut the free text into i1 - i0 + 1 gaps at random. */
        int pos = s * seq_len;
        for (int i = i0; i < i1; i++) {
            int gap = tu_randint(r, 0, free_ + 1);
            if (i == i0 && gap == 0 && free_ > 0)
                gap = 1;   /* text first: exercises the offset of the image positions */
            free_ -= gap;
            pos += gap;
            int n = tm_image_tokens(sh, grids + 3 * i);
            for (int k = 0; k < n && pos < (s + 1) * seq_len; k++, pos++) {
                t->tokens[pos] = img;
                t->targets[pos] = -1;
            }
        }
        i0 = i1;
    }
    t->b = (vlm_batch){
        .n_seq = n_seq, .seq_len = seq_len, .tokens = t->tokens, .targets = t->targets,
        .n_images = n_images, .grid_thw = t->grid, .pixels = t->pixels,
    };
}

static inline void tm_free_batch(tm_batch *t)
{
    free(t->tokens);
    free(t->targets);
    free(t->grid);
    free(t->pixels);
    memset(t, 0, sizeof *t);
}

/* ---- random shapes ----------------------------------------------------------------------
 * A small random shape with a random mix of features (norms, MLPs, biases, qk_norm,
 * positions, MoE, windows, freezing) and a random batch for it. */

static inline void tm_random_stack(stack_shape *s, tu_rng *r, int enc)
{
    int kv = tu_randint(r, 1, 3), hq = kv * tu_randint(r, 1, 3);
    int hd = 4 * tu_randint(r, 1, 4);
    tm_stack(s, tu_randint(r, enc ? 0 : 1, 3), 8 * tu_randint(r, 1, 5),
             8 * tu_randint(r, 1, 5), hq, enc ? hq : kv, hd);
    s->norm = tu_randint(r, 0, 2) ? NORM_LAYERNORM : NORM_RMSNORM;
    s->mlp = tu_randint(r, 0, 2) ? MLP_GELU : MLP_SWIGLU;
    s->gelu = tu_randint(r, 0, 2) ? GELU_ERF : GELU_TANH;
    s->bias_qkv = tu_randint(r, 0, 2);
    s->bias_proj = tu_randint(r, 0, 2);
    s->bias_mlp = tu_randint(r, 0, 2);
    s->qk_norm = tu_randint(r, 0, 2);
}

static inline void tm_random_case(model_shape *out, tm_batch *tb, tu_rng *rng, int rep)
{
    model_shape sh;
    memset(&sh, 0, sizeof sh);
    snprintf(sh.name, sizeof sh.name, "random-%d", rep);
    decoder_shape *d = &sh.decoder;
    tm_random_stack(&d->s, rng, 0);
    d->vocab = tu_randint(rng, 8, 40);
    d->tied_embeddings = tu_randint(rng, 0, 2);
    d->max_positions = 64;
    d->image_token_id = d->vocab - 1;
    int pos = tu_randint(rng, 0, 3);
    d->s.pos = pos == 0 ? POS_ROPE : pos == 1 ? POS_MROPE : POS_LEARNED;
    int half = d->s.head_dim / 2;
    d->s.mrope_section[0] = half / 2;
    d->s.mrope_section[1] = (half - half / 2) / 2;
    d->s.mrope_section[2] = half - d->s.mrope_section[0] - d->s.mrope_section[1];
    if (tu_randint(rng, 0, 2)) {
        d->moe_experts = tu_randint(rng, 1, 5);
        d->moe_top_k = tu_randint(rng, 1, d->moe_experts + 1);
        d->moe_ffn = 4 * tu_randint(rng, 1, 4);
        d->moe_shared_ffn = tu_randint(rng, 0, 2) * 8;
        d->moe_every = tu_randint(rng, 1, 3);
    }
    int images = tu_randint(rng, 0, 2);
    if (images) {
        encoder_shape *e = &sh.encoder;
        e->present = 1;
        tm_random_stack(&e->s, rng, 1);
        e->s.pos = POS_ROPE2D;
        e->in_channels = tu_randint(rng, 1, 4);
        e->patch = tu_randint(rng, 1, 3);
        e->temporal_patch = tu_randint(rng, 1, 3);
        e->spatial_merge = tu_randint(rng, 1, 3);
        e->window_px = e->patch * e->spatial_merge * tu_randint(rng, 0, 3);
        e->n_full_attn = e->s.layers ? tu_randint(rng, 0, 2) : 0;
        e->full_attn[0] = e->s.layers ? tu_randint(rng, 0, e->s.layers) : 0;
        projector_shape *p = &sh.projector;
        p->present = 1;
        p->hidden = 8 * tu_randint(rng, 1, 4);
        p->norm = tu_randint(rng, 0, 2) ? NORM_LAYERNORM : NORM_RMSNORM;
        p->norm_eps = 1e-6f;
        p->gelu = tu_randint(rng, 0, 2) ? GELU_ERF : GELU_TANH;
        p->bias = tu_randint(rng, 0, 2);
        sh.encoder.s.freeze = tu_randint(rng, 0, 3) == 0;
    }
    d->s.freeze = tu_randint(rng, 0, 4) == 0;

    int n_img = images ? tu_randint(rng, 1, 4) : 0, grids[9], seqs[3];
    int n_seq = tu_randint(rng, 1, 3), S = 24;
    for (int i = 0; i < n_img; i++) {
        int m = sh.encoder.spatial_merge;
        grids[3 * i] = tu_randint(rng, 1, 3);
        grids[3 * i + 1] = m * tu_randint(rng, 1, 3);
        grids[3 * i + 2] = m * tu_randint(rng, 1, 3);
        seqs[i] = n_seq == 1 ? 0 : i * n_seq / n_img;
    }
    tm_make_batch(tb, &sh, rng, n_seq, S, n_img, grids, seqs);
    *out = sh;
}

#endif
