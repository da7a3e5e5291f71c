/* model.c - model lifecycle, the parameter table and its initialisation, and the
 * forward/backward driver (encoder -> projector -> decoder -> back). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/internal.h"
#include "model/model_shard.h"
#include "model/rng.h"

#define INIT_STD 0.02
#define INIT_CHUNK 65536  /* elements per random stream (see reg) */

/* ---- parameter registration ----------------------------------------------------------
 * The table is built by running the same registration code twice: pass 0 only counts
 * tensors and floats; then the flat arrays are allocated; pass 1 fills the table,
 * initialises every tensor and hands out pointers into the parameter and gradient arrays.
 * Keeping one code path for both passes makes the layout impossible to get out of step. */

typedef enum { INIT_NORMAL = 0, INIT_ONES = 1, INIT_ZEROS = 2 } init_kind;

typedef struct {
    model *m;
    int pass;
    int count;
    size_t offset;
    uint64_t seed;
    int frozen;     /* the component being registered is frozen */
} reg_ctx;

/* Registers one tensor; returns its parameter pointer (NULL in pass 0) and stores its
 * gradient pointer in *grad (NULL in pass 0 and for frozen components). */
static float *reg(reg_ctx *r, float **grad, init_kind init, double std, int ndim,
                  const int64_t *dims, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static float *reg(reg_ctx *r, float **grad, init_kind init, double std, int ndim,
                  const int64_t *dims, const char *fmt, ...)
{
    size_t numel = 1;
    for (int i = 0; i < ndim; i++)
        numel *= (size_t)dims[i];
    size_t off = r->offset;
    r->offset += numel;
    int idx = r->count++;
    if (grad)
        *grad = NULL;
    if (r->pass == 0)
        return NULL;

    model *m = r->m;
    model_tensor *t = &m->tensors[idx];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->offset = off;
    t->numel = numel;
    t->ndim = ndim;
    for (int i = 0; i < 4; i++)
        t->dims[i] = i < ndim ? dims[i] : 1;
    t->decay = ndim >= 2;
    t->frozen = r->frozen;
    model_shard_whole(&t->shard, ndim, dims);

    float *p = m->params + off;
    if (init == INIT_NORMAL) {
        /* Streams keyed by the tensor's name and a chunk index: a tensor's values do not
         * depend on which other tensors exist, on the order they are registered in, or on
         * the number of threads filling the chunks. */
        uint64_t key = hrng_mix(r->seed, hrng_hash_str(t->name));
        long chunks = (long)((numel + INIT_CHUNK - 1) / INIT_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 1)
        for (long c = 0; c < chunks; c++) {
            hrng g;
            hrng_init(&g, hrng_mix(key, (uint64_t)c));
            size_t i1 = (size_t)(c + 1) * INIT_CHUNK < numel ? (size_t)(c + 1) * INIT_CHUNK : numel;
            for (size_t i = (size_t)c * INIT_CHUNK; i < i1; i++)
                p[i] = (float)(std * hrng_normal(&g));
        }
    } else {
        float v = init == INIT_ONES ? 1.0f : 0.0f;
        for (size_t i = 0; i < numel; i++)
            p[i] = v;
    }
    if (grad && !r->frozen)
        *grad = m->grads + off;
    return p;
}

#define DIMS(...) ((const int64_t[]){ __VA_ARGS__ })
#define NDIMS(...) ((int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)))
#define REG(r, g, init, std, name, ...)                                                    \
    reg((r), (g), (init), (std), NDIMS(__VA_ARGS__), DIMS(__VA_ARGS__), "%s", (name))

/* A norm's weight (ones) and, for layernorm, bias (zeros), named PREFIX.weight/.bias. */
static void reg_norm(reg_ctx *r, norm_kind kind, int C, float **w, float **gw, float **b,
                     float **gb, const char *prefix)
{
    char name[96];
    snprintf(name, sizeof name, "%s.weight", prefix);
    *w = REG(r, gw, INIT_ONES, 0, name, C);
    *b = *gb = NULL;
    if (kind == NORM_LAYERNORM) {
        snprintf(name, sizeof name, "%s.bias", prefix);
        *b = REG(r, gb, INIT_ZEROS, 0, name, C);
    }
}

/* A linear layer PREFIX.weight [out, in] (normal(0, std)) and optional PREFIX.bias. */
static void reg_linear(reg_ctx *r, int out, int in, int bias, double std, float **w,
                       float **gw, float **b, float **gb, const char *prefix)
{
    char name[96];
    snprintf(name, sizeof name, "%s.weight", prefix);
    *w = REG(r, gw, INIT_NORMAL, std, name, out, in);
    if (b)
        *b = *gb = NULL;
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", prefix);
        *b = REG(r, gb, INIT_ZEROS, 0, name, out);
    }
}

static void reg_block(reg_ctx *r, const stack_cfg *c, block *blk, const char *comp, int l,
                      int layers)
{
    const stack_shape *s = c->s;
    block_params *p = &blk->p, *g = &blk->g;
    double out_std = INIT_STD / sqrt(2.0 * layers);
    char pre[96], name[128];
    snprintf(pre, sizeof pre, "%s.layers.%d", comp, l);
#define NM(suffix) (snprintf(name, sizeof name, "%s.%s", pre, (suffix)), name)

    reg_norm(r, s->norm, c->H, &p->attn_norm_w, &g->attn_norm_w, &p->attn_norm_b,
             &g->attn_norm_b, NM("attn_norm"));
    reg_linear(r, c->QKV, c->H, s->bias_qkv, INIT_STD, &p->qkv_w, &g->qkv_w, &p->qkv_b,
               &g->qkv_b, NM("attn.qkv"));
    if (s->qk_norm) {
        p->q_norm_w = REG(r, &g->q_norm_w, INIT_ONES, 0, NM("attn.q_norm.weight"), c->D);
        p->k_norm_w = REG(r, &g->k_norm_w, INIT_ONES, 0, NM("attn.k_norm.weight"), c->D);
    }
    reg_linear(r, c->H, c->QD, s->bias_proj, out_std, &p->proj_w, &g->proj_w, &p->proj_b,
               &g->proj_b, NM("attn.proj"));
    reg_norm(r, s->norm, c->H, &p->mlp_norm_w, &g->mlp_norm_w, &p->mlp_norm_b,
             &g->mlp_norm_b, NM("mlp_norm"));
    if (blk->moe) {
        p->router_w = REG(r, &g->router_w, INIT_NORMAL, INIT_STD, NM("mlp.router.weight"),
                          c->E, c->H);
        p->exp_fc1_w = REG(r, &g->exp_fc1_w, INIT_NORMAL, INIT_STD,
                           NM("mlp.experts.gate_up.weight"), c->E, 2 * c->Fm, c->H);
        p->exp_fc2_w = REG(r, &g->exp_fc2_w, INIT_NORMAL, out_std,
                           NM("mlp.experts.down.weight"), c->E, c->H, c->Fm);
        if (c->Fs > 0) {
            p->sh_fc1_w = REG(r, &g->sh_fc1_w, INIT_NORMAL, INIT_STD,
                              NM("mlp.shared.gate_up.weight"), 2 * c->Fs, c->H);
            p->sh_fc2_w = REG(r, &g->sh_fc2_w, INIT_NORMAL, out_std,
                              NM("mlp.shared.down.weight"), c->H, c->Fs);
        }
    } else if (s->mlp == MLP_SWIGLU) {
        reg_linear(r, c->Fu, c->H, s->bias_mlp, INIT_STD, &p->fc1_w, &g->fc1_w, &p->fc1_b,
                   &g->fc1_b, NM("mlp.gate_up"));
        reg_linear(r, c->H, c->F, s->bias_mlp, out_std, &p->fc2_w, &g->fc2_w, &p->fc2_b,
                   &g->fc2_b, NM("mlp.down"));
    } else {
        reg_linear(r, c->Fu, c->H, s->bias_mlp, INIT_STD, &p->fc1_w, &g->fc1_w, &p->fc1_b,
                   &g->fc1_b, NM("mlp.fc1"));
        reg_linear(r, c->H, c->F, s->bias_mlp, out_std, &p->fc2_w, &g->fc2_w, &p->fc2_b,
                   &g->fc2_b, NM("mlp.fc2"));
    }
#undef NM
}

static void reg_all(reg_ctx *r)
{
    model *m = r->m;
    const model_shape *sh = &m->shape;

    if (m->enc.present) {
        encoder_part *e = &m->enc;
        r->frozen = sh->encoder.s.freeze != 0;
        e->patch_w = REG(r, &e->patch_gw, INIT_NORMAL, INIT_STD, "encoder.patch_embed.weight",
                         e->st.c.H, e->patch_dim);
        for (int l = 0; l < e->st.L; l++)
            reg_block(r, &e->st.c, &e->st.layers[l], "encoder", l, e->st.L);
    }
    if (m->proj.present) {
        projector_part *pj = &m->proj;
        /* The projector has no freeze switch of its own: it trains whenever it exists
         * (the usual recipe freezes the ViT and trains the merger). */
        r->frozen = 0;
        reg_norm(r, pj->sh->norm, pj->in / pj->merge2, &pj->norm_w, &pj->norm_gw, &pj->norm_b,
                 &pj->norm_gb, "projector.norm");
        reg_linear(r, pj->hidden, pj->in, pj->sh->bias, INIT_STD, &pj->fc1_w, &pj->fc1_gw,
                   &pj->fc1_b, &pj->fc1_gb, "projector.fc1");
        reg_linear(r, pj->out, pj->hidden, pj->sh->bias, INIT_STD, &pj->fc2_w, &pj->fc2_gw,
                   &pj->fc2_b, &pj->fc2_gb, "projector.fc2");
    }
    decoder_part *d = &m->dec;
    const decoder_shape *ds = &sh->decoder;
    int H = ds->s.hidden;
    r->frozen = ds->s.freeze != 0;
    d->embed_w = REG(r, &d->embed_gw, INIT_NORMAL, INIT_STD, "decoder.embed.weight",
                     ds->vocab, H);
    d->pos_w = d->pos_gw = NULL;
    if (ds->s.pos == POS_LEARNED)
        d->pos_w = REG(r, &d->pos_gw, INIT_NORMAL, INIT_STD, "decoder.pos_embed.weight",
                       ds->max_positions, H);
    for (int l = 0; l < d->st.L; l++)
        reg_block(r, &d->st.c, &d->st.layers[l], "decoder", l, d->st.L);
    reg_norm(r, ds->s.norm, H, &d->norm_w, &d->norm_gw, &d->norm_b, &d->norm_gb,
             "decoder.final_norm");
    if (ds->tied_embeddings) {
        d->head_w = d->embed_w;
        d->head_gw = d->embed_gw;
    } else {
        d->head_w = REG(r, &d->head_gw, INIT_NORMAL, INIT_STD, "decoder.lm_head.weight",
                        ds->vocab, H);
    }
}

/* ---- shape checks ----------------------------------------------------------------------
 * What this implementation relies on for memory safety and meaning.  shape_validate (the
 * rules module) checks more; these repeat the essentials so that a hand-filled shape in a
 * test cannot crash the model. */

static int check_stack(const stack_shape *s, const char *comp, int need_ffn, hearth_err *err)
{
    if (s->layers < 0 || s->hidden < 1 || s->heads < 1 || s->kv_heads < 1 || s->head_dim < 1)
        return herr_set(err, HERR_CONFIG, "%s: layers, hidden, heads, kv_heads and head_dim "
                        "must be positive", comp);
    if (s->heads % s->kv_heads)
        return herr_set(err, HERR_CONFIG, "%s.kv_heads: %d does not divide heads %d", comp,
                        s->kv_heads, s->heads);
    if (need_ffn && s->ffn < 1)
        return herr_set(err, HERR_CONFIG, "%s.ffn: must be positive", comp);
    if (s->norm != NORM_RMSNORM && s->norm != NORM_LAYERNORM)
        return herr_set(err, HERR_CONFIG, "%s.norm: unknown kind %d", comp, (int)s->norm);
    if (s->mlp != MLP_SWIGLU && s->mlp != MLP_GELU)
        return herr_set(err, HERR_CONFIG, "%s.mlp: unknown kind %d", comp, (int)s->mlp);
    if (!(s->norm_eps > 0))
        return herr_set(err, HERR_CONFIG, "%s.norm_eps: must be positive", comp);
    if ((s->pos == POS_ROPE || s->pos == POS_MROPE) && s->head_dim % 2)
        return herr_set(err, HERR_CONFIG, "%s.head_dim: RoPE needs an even head_dim, got %d",
                        comp, s->head_dim);
    if (s->pos == POS_ROPE2D && s->head_dim % 4)
        return herr_set(err, HERR_CONFIG, "%s.head_dim: 2-D RoPE needs a multiple of 4, "
                        "got %d", comp, s->head_dim);
    if ((s->pos == POS_ROPE || s->pos == POS_MROPE || s->pos == POS_ROPE2D) &&
        !(s->rope_theta > 0))
        return herr_set(err, HERR_CONFIG, "%s.rope_theta: must be positive", comp);
    if (s->pos == POS_MROPE) {
        const int *sec = s->mrope_section;
        if (sec[0] < 0 || sec[1] < 0 || sec[2] < 0 ||
            sec[0] + sec[1] + sec[2] != s->head_dim / 2)
            return herr_set(err, HERR_CONFIG, "%s.mrope_section: [%d,%d,%d] must be "
                            "non-negative and sum to head_dim/2 = %d", comp, sec[0], sec[1],
                            sec[2], s->head_dim / 2);
    }
    return 0;
}

static int check_shape(const model_shape *sh, hearth_err *err)
{
    const decoder_shape *d = &sh->decoder;
    int rc;
    int all_moe = d->moe_experts > 0 && d->moe_every == 1;
    if ((rc = check_stack(&d->s, "decoder", !all_moe, err)))
        return rc;
    if (d->s.layers < 1)
        return herr_set(err, HERR_CONFIG, "decoder.layers: must be at least 1");
    if (d->vocab < 1)
        return herr_set(err, HERR_CONFIG, "decoder.vocab: must be positive");
    if (d->s.pos == POS_ROPE2D)
        return herr_set(err, HERR_CONFIG, "decoder.pos: rope2d is for the vision encoder");
    if (d->s.pos == POS_LEARNED && d->max_positions < 1)
        return herr_set(err, HERR_CONFIG, "decoder.max_positions: learned positions need a "
                        "positive table length");
    if (d->moe_experts < 0)
        return herr_set(err, HERR_CONFIG, "decoder.moe.experts: must not be negative");
    if (d->moe_experts > 0) {
        if (d->moe_top_k < 1 || d->moe_top_k > d->moe_experts)
            return herr_set(err, HERR_CONFIG, "decoder.moe.top_k: %d must be in [1, experts "
                            "%d]", d->moe_top_k, d->moe_experts);
        if (d->moe_ffn < 1 || d->moe_shared_ffn < 0 || d->moe_every < 1)
            return herr_set(err, HERR_CONFIG, "decoder.moe: ffn and every must be positive, "
                            "shared_ffn not negative");
    }
    if (!sh->encoder.present)
        return 0;

    const encoder_shape *e = &sh->encoder;
    if ((rc = check_stack(&e->s, "encoder", 1, err)))
        return rc;
    if (e->s.pos != POS_ROPE2D)
        return herr_set(err, HERR_CONFIG, "encoder.pos: the vision encoder uses rope2d");
    if (e->in_channels < 1 || e->patch < 1 || e->temporal_patch < 1 || e->spatial_merge < 1)
        return herr_set(err, HERR_CONFIG, "encoder: in_channels, patch, temporal_patch and "
                        "spatial_merge must be positive");
    if (e->window_px < 0 ||
        (e->window_px > 0 && e->window_px / e->patch / e->spatial_merge < 1))
        return herr_set(err, HERR_CONFIG, "encoder.window_px: %d is smaller than one merge "
                        "unit (%d px)", e->window_px, e->patch * e->spatial_merge);
    if (e->n_full_attn < 0 || e->n_full_attn > SHAPE_MAX_FULL_ATTN)
        return herr_set(err, HERR_CONFIG, "encoder.full_attn: bad count %d", e->n_full_attn);
    for (int i = 0; i < e->n_full_attn; i++)
        if (e->full_attn[i] < 0 || e->full_attn[i] >= e->s.layers)
            return herr_set(err, HERR_CONFIG, "encoder.full_attn: layer %d out of range "
                            "[0, %d)", e->full_attn[i], e->s.layers);
    if (!sh->projector.present)
        return herr_set(err, HERR_CONFIG, "projector: a model with an encoder needs one");
    const projector_shape *p = &sh->projector;
    if (p->hidden < 1 || !(p->norm_eps > 0) ||
        (p->norm != NORM_RMSNORM && p->norm != NORM_LAYERNORM))
        return herr_set(err, HERR_CONFIG, "projector: hidden and norm_eps must be positive "
                        "and norm a known kind");
    return 0;
}

/* ---- create / free ------------------------------------------------------------------- */

static int setup_parts(model *m, hearth_err *err)
{
    const model_shape *sh = &m->shape;
    const decoder_shape *ds = &sh->decoder;
    stack_cfg c;
    int rc;

    if (sh->encoder.present) {
        const encoder_shape *es = &sh->encoder;
        encoder_part *e = &m->enc;
        e->present = 1;
        e->sh = es;
        e->patch_dim = es->in_channels * es->temporal_patch * es->patch * es->patch;
        e->ws = es->window_px > 0 ? es->window_px / es->patch / es->spatial_merge : 0;
        stack_cfg_init(&c, &es->s, 0, 0, 0, 0, 0);
        if ((rc = stack_init(&e->st, &c, es->s.layers, err)))
            return rc;
        for (int l = 0; l < es->s.layers; l++) {
            /* Without windows every layer attends over whole frames. */
            int full = e->ws == 0;
            for (int i = 0; i < es->n_full_attn; i++)
                full |= es->full_attn[i] == l;
            e->st.layers[l].full_attn = full;
        }

        projector_part *pj = &m->proj;
        pj->present = 1;
        pj->sh = &sh->projector;
        pj->merge2 = es->spatial_merge * es->spatial_merge;
        pj->in = pj->merge2 * es->s.hidden;
        pj->hidden = sh->projector.hidden;
        pj->out = ds->s.hidden;
    }

    int E = ds->moe_experts;
    stack_cfg_init(&c, &ds->s, 1, E, E > 0 ? ds->moe_top_k : 0, E > 0 ? ds->moe_ffn : 0,
                   E > 0 ? ds->moe_shared_ffn : 0);
    if ((rc = stack_init(&m->dec.st, &c, ds->s.layers, err)))
        return rc;
    m->dec.sh = ds;
    for (int l = 0; l < ds->s.layers; l++)
        m->dec.st.layers[l].moe = E > 0 && l % ds->moe_every == ds->moe_every - 1;
    return 0;
}

int model_create(model **out, const model_shape *shape, uint64_t seed, hearth_err *err)
{
    *out = NULL;
    int rc = check_shape(shape, err);
    if (rc)
        return rc;
    model *m = calloc(1, sizeof *m);
    if (!m)
        return herr_set(err, HERR_NOMEM, "model: out of memory");
    m->shape = *shape;
    if ((rc = setup_parts(m, err))) {
        model_free(m);
        return rc;
    }

    reg_ctx r = { .m = m, .pass = 0, .seed = seed };
    reg_all(&r);
    m->n_params = r.offset;
    m->n_tensors = r.count;
    m->tensors = calloc((size_t)r.count, sizeof *m->tensors);
    m->params = malloc((m->n_params ? m->n_params : 1) * sizeof(float));
    m->grads = calloc(m->n_params ? m->n_params : 1, sizeof(float));
    if (!m->tensors || !m->params || !m->grads) {
        model_free(m);
        return herr_set(err, HERR_NOMEM, "model: out of memory for %zu parameters",
                        r.offset);
    }
    r = (reg_ctx){ .m = m, .pass = 1, .seed = seed };
    reg_all(&r);
    *out = m;
    return 0;
}

void model_free(model *m)
{
    if (!m)
        return;
    stack_free(&m->enc.st);
    free(m->enc.pix);
    free(m->enc.cos);
    free(m->enc.sin);
    free(m->enc.pos_hw);
    free(m->enc.unit_rc);
    free(m->enc.win_idx);
    free(m->enc.cu_win);
    free(m->enc.cu_frame);
    free(m->proj.fbuf);
    stack_free(&m->dec.st);
    free(m->dec.fbuf);
    free(m->dec.ibuf);
    free(m->img_feat);
    free(m->dimg_feat);
    free(m->pin_route);
    free(m->tensors);
    free(m->params);
    free(m->grads);
    free(m);
}

const model_shape *model_get_shape(const model *m) { return &m->shape; }
size_t model_param_count(const model *m) { return m->n_params; }
float *model_params(model *m) { return m->params; }
float *model_grads(model *m) { return m->grads; }
int model_tensor_count(const model *m) { return m->n_tensors; }

const model_tensor *model_tensor_at(const model *m, int i)
{
    return i >= 0 && i < m->n_tensors ? &m->tensors[i] : NULL;
}

const model_tensor *model_tensor_find(const model *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return &m->tensors[i];
    return NULL;
}

void model_zero_grad(model *m)
{
    if (m->n_params)
        memset(m->grads, 0, m->n_params * sizeof(float));
}

size_t model_last_routing(const model *m, int *out, size_t cap)
{
    const stack *st = &m->dec.st;
    size_t n = 0, per = (size_t)m->dec.n_tokens * (size_t)st->c.K;
    for (int l = 0; l < st->L; l++) {
        if (!st->layers[l].moe)
            continue;
        for (size_t i = 0; i < per; i++, n++)
            if (out && n < cap)
                out[n] = st->layers[l].topk_idx[i];
    }
    return n;
}

int model_pin_routing(model *m, const int *idx, size_t n, hearth_err *err)
{
    int *copy = NULL;
    if (idx) {
        int E = m->dec.st.c.E;
        for (size_t i = 0; i < n; i++)
            if (idx[i] < 0 || idx[i] >= E)
                return herr_set(err, HERR_RUNTIME, "model_pin_routing: expert %d at %zu is "
                                "not in [0, %d)", idx[i], i, E);
        copy = malloc((n ? n : 1) * sizeof(int));
        if (!copy)
            return herr_set(err, HERR_NOMEM, "model_pin_routing: out of memory");
        memcpy(copy, idx, n * sizeof(int));
    }
    free(m->pin_route);
    m->pin_route = copy;
    m->n_pin = idx ? n : 0;
    return 0;
}

/* ---- forward / backward ------------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int run(model *m, const vlm_batch *b, int train, float loss_scale, float aux_scale,
               model_stats *stats, hearth_err *err)
{
    model_stats st;
    memset(&st, 0, sizeof st);
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!b || b->n_seq < 1 || b->seq_len < 1 || !b->tokens || !b->targets)
        return herr_set(err, HERR_RUNTIME, "model: empty batch");
    if (b->n_images < 0 || (b->n_images > 0 && (!b->grid_thw || !b->pixels)))
        return herr_set(err, HERR_RUNTIME, "model: batch has %d images but no grids or "
                        "pixels", b->n_images);
    if (b->n_images > 0 && !m->enc.present)
        return herr_set(err, HERR_RUNTIME, "model: the batch has %d images but the model "
                        "has no vision encoder", b->n_images);

    int images = m->enc.present && b->n_images > 0;
    int rc;
    double t0 = now_ms();
    m->enc.n_units = 0;
    if (images && (rc = encoder_forward(m, b, err)))
        return rc;
    double t1 = now_ms();
    if ((rc = decoder_run(m, b, train, loss_scale, aux_scale, train && images, &st, err)))
        return rc;
    double t2 = now_ms();
    if (train && images && (rc = encoder_backward(m, err)))
        return rc;
    double t3 = now_ms();
    st.encoder_ms = (t1 - t0) + (t3 - t2);
    st.decoder_ms = t2 - t1;
    if (stats)
        *stats = st;
    return 0;
}

int model_forward_backward(model *m, const vlm_batch *b, float loss_scale, float aux_scale,
                           model_stats *stats, hearth_err *err)
{
    return run(m, b, 1, loss_scale, aux_scale, stats, err);
}

int model_forward(model *m, const vlm_batch *b, model_stats *stats, hearth_err *err)
{
    return run(m, b, 0, 0.0f, 0.0f, stats, err);
}
