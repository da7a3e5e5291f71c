/* model.c - model lifecycle (single-rank and local models of one rank, clones) and the
 * single-rank forward/backward, composed of the encoder and decoder-stage APIs
 * (model_par.h) on the model of model_par_single. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/internal.h"

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

static int group_size(const comm *c) { return c ? comm_size(c) : 1; }
static int group_rank(const comm *c) { return c ? comm_rank(c) : 0; }

void model_par_single(model_par *p, const model_shape *full)
{
    memset(p, 0, sizeof *p);
    p->has_decoder = 1;
    p->n_layers = full->decoder.s.layers;
    p->has_embed = 1;
    p->has_head = 1;
    p->has_encoder = full->encoder.present;
}

static int check_par(const model_shape *sh, const model_par *par, hearth_err *err)
{
    const decoder_shape *ds = &sh->decoder;
    if (par->has_decoder) {
        if (par->n_layers < 1 || par->first_layer < 0 ||
            par->first_layer + par->n_layers > ds->s.layers)
            return herr_set(err, HERR_CONFIG, "decoder: stage layers [%d, %d) are not a "
                            "non-empty part of the %d layers", par->first_layer,
                            par->first_layer + par->n_layers, ds->s.layers);
    }
    return 0;
}

/* The parts this rank holds and their stack configs (model_par.h says what is split
 * how); parameters are attached by the registration. */
static int setup_parts(model *m, hearth_err *err)
{
    const model_shape *sh = &m->shape;
    const decoder_shape *ds = &sh->decoder;
    const model_par *par = &m->par;
    stack_cfg c;
    int rc;

    if (sh->encoder.present && par->has_encoder) {
        const encoder_shape *es = &sh->encoder;
        encoder_part *e = &m->enc;
        e->present = 1;
        e->sh = es;
        e->patch_dim = es->in_channels * es->temporal_patch * es->patch * es->patch;
        e->ws = es->window_px > 0 ? es->window_px / es->patch / es->spatial_merge : 0;
        stack_cfg_init(&c, m->dev, &es->s, 0, 0, 0, 0, 0);
        if ((rc = stack_cfg_split(&c, "encoder", group_size(par->enc_tp),
                                  group_rank(par->enc_tp), 1, 0, err)) ||
            (rc = stack_init(&e->st, &c, es->s.layers, err)))
            return rc;
        e->st.tp_comm = par->enc_tp;
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
        pj->dev = m->dev;
        pj->merge2 = es->spatial_merge * es->spatial_merge;
        pj->in = pj->merge2 * es->s.hidden;
        pj->hidden = sh->projector.hidden;
        pj->out = ds->s.hidden;
    }

    decoder_part *d = &m->dec;
    d->sh = ds;
    if (!par->has_decoder)
        return 0;
    d->present = 1;
    d->tp_comm = par->tp;
    d->tp = group_size(par->tp);
    d->t = group_rank(par->tp);
    d->sp = par->sp && d->tp > 1;
    d->cp_comm = group_size(par->cp) > 1 ? par->cp : NULL;
    d->cp = group_size(par->cp);
    d->c = group_rank(par->cp);
    d->v0 = (int)((int64_t)d->t * ds->vocab / d->tp);
    d->v1 = (int)((int64_t)(d->t + 1) * ds->vocab / d->tp);
    d->has_embed = par->has_embed;
    d->has_head = par->has_head;
    int E = ds->moe_experts;
    stack_cfg_init(&c, m->dev, &ds->s, 1, E, E > 0 ? ds->moe_top_k : 0, E > 0 ? ds->moe_ffn : 0,
                   E > 0 ? ds->moe_shared_ffn : 0);
    if ((rc = stack_cfg_split(&c, "decoder", d->tp, d->t, group_size(par->ep),
                              group_rank(par->ep), err)) ||
        (rc = stack_init(&d->st, &c, par->n_layers, err)))
        return rc;
    d->st.tp_comm = par->tp;
    d->st.ep_comm = par->ep;
    d->st.sp = d->sp;
    d->st.cp_comm = d->cp_comm;
    for (int l = 0; l < par->n_layers; l++) {
        int gl = par->first_layer + l;   /* the MoE pattern follows global indices */
        d->st.layers[l].moe = E > 0 && gl % ds->moe_every == ds->moe_every - 1;
        d->st.layers[l].cp = d->st.layers[l].moe ? d->cp_comm : NULL;
    }
    return 0;
}

int model_create_par(model **out, const model_shape *full, const model_par *par,
                     uint64_t seed, hearth_err *err)
{
    *out = NULL;
    int rc = check_shape(full, err);
    if (rc || (rc = check_par(full, par, err)))
        return rc;
    model *m = calloc(1, sizeof *m);
    if (!m)
        return herr_set(err, HERR_NOMEM, "model: out of memory");
    m->shape = *full;
    m->par = *par;
    m->dev = par->dev;
    if (!m->dev) {
        char msg[256];
        if ((rc = kdev_create(&m->dev, KDEV_CPU, msg, sizeof msg))) {
            free(m);
            return herr_set(err, rc, "model: %s", msg);
        }
        m->own_dev = 1;
        m->par.dev = m->dev;
    }
    if ((rc = setup_parts(m, err)) || (rc = model_reg_build(m, seed, err))) {
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int model_create(model **out, const model_shape *shape, uint64_t seed, hearth_err *err)
{
    model_par par;
    model_par_single(&par, shape);
    return model_create_par(out, shape, &par, seed, err);
}

int model_clone(model **out, model *owner, hearth_err *err)
{
    *out = NULL;
    model *m = calloc(1, sizeof *m);
    if (!m)
        return herr_set(err, HERR_NOMEM, "model: out of memory");
    m->shape = owner->shape;
    m->par = owner->par;
    m->dev = owner->dev;
    m->owner = owner;
    int rc = setup_parts(m, err);
    if (rc) {
        model_free(m);
        return rc;
    }
    m->n_params = owner->n_params;
    m->params = owner->params;
    m->grads = owner->grads;
    m->tensors = owner->tensors;
    m->n_tensors = owner->n_tensors;
    model_reg_bind(m);
    if ((rc = fp8_model_clone(m, owner, err))) {
        model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

const model_par *model_get_par(const model *m) { return &m->par; }

void model_free(model *m)
{
    if (!m)
        return;
    encoder_free(m);
    decoder_free(&m->dec);
    free(m->pin_route);
    for (int i = 0; i < m->n_chunk_objs; i++)
        model_free(m->chunk_objs[i]);
    free(m->chunk_objs);
    kdev_release(m->dev, m->dec.cc.buf);
    kdev_release(m->dev, m->dec.cc.pos);
    fp8_model_free(m);
    if (!m->owner) {
        free(m->tensors);
        kdev_release(m->dev, m->params);
        kdev_release(m->dev, m->grads);
    }
    if (m->own_dev)
        kdev_free(m->dev);
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

kdev *model_device(const model *m) { return m->dev; }

void model_zero_grad(model *m)
{
    kdev_zero(m->dev, m->grads, m->n_params * sizeof(float));
}

size_t model_last_routing(const model *m, int *out, size_t cap)
{
    const stack *st = &m->dec.st;
    size_t n = 0, per = (size_t)m->dec.n_tokens * (size_t)st->c.K;
    for (int l = 0; l < st->L; l++) {
        if (!st->layers[l].moe)
            continue;
        if (out && n < cap)
            kdev_download(m->dev, out + n, st->layers[l].topk_idx,
                          (per < cap - n ? per : cap - n) * sizeof(int));
        n += per;
    }
    return n;
}

size_t model_stack_activation_bytes(const model *m)
{
    return (m->enc.st.fbuf_floats + m->dec.st.fbuf_floats) * sizeof(float) +
           m->enc.st.abuf_bytes + m->dec.st.abuf_bytes;
}

size_t model_chunk_cache_bytes(const model *m)
{
    return m->dec.cc.cap * sizeof(float);
}

const float *model_last_hidden(const model *m, int *n_tokens, int *hidden)
{
    const decoder_part *d = &m->dec;
    if (!d->present || !d->has_head || !d->hf || d->n_tokens <= 0)
        return NULL;
    *n_tokens = d->n_tokens;
    *hidden = d->st.c.H;
    return d->hf;
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

/* The objects running chunks 0 .. K-1: m and K-1 clones kept in m. */
static int chunk_objects(model *m, int K, hearth_err *err)
{
    if (m->n_chunk_objs >= K - 1)
        return 0;
    model **a = realloc(m->chunk_objs, (size_t)(K - 1) * sizeof *a);
    if (!a)
        return herr_set(err, HERR_NOMEM, "model: out of memory for %d chunks", K);
    m->chunk_objs = a;
    while (m->n_chunk_objs < K - 1) {
        int rc = model_clone(&a[m->n_chunk_objs], m, err);
        if (rc)
            return herr_prefix(err, rc, "model: chunk %d", m->n_chunk_objs + 1);
        m->n_chunk_objs++;
    }
    return 0;
}

/* One micro batch in K sequence chunks (K = 1: whole), on m and the K-1 clones kept in
 * it: the encoder once, the chunk forwards in order, the backwards in reverse (each
 * chunk's attention gradient reaches the earlier chunks' cached keys and values). */
static int run(model *m, const vlm_batch *b, int K, int train, float loss_scale,
               float aux_scale, model_stats *stats, hearth_err *err)
{
    model_stats st;
    memset(&st, 0, sizeof st);
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!b || b->n_seq < 1 || b->seq_len < 1 || !b->tokens || !b->targets)
        return herr_set(err, HERR_RUNTIME, "model: empty batch");
    if (K < 1 || b->seq_len % K)
        return herr_set(err, HERR_RUNTIME, "model: seq_len %d is not divisible by %d chunks",
                        b->seq_len, K);
    if (b->n_images < 0 || (b->n_images > 0 && (!b->grid_thw || !b->pixels)))
        return herr_set(err, HERR_RUNTIME, "model: batch has %d images but no grids or "
                        "pixels", b->n_images);
    if (b->n_images > 0 && !m->enc.present)
        return herr_set(err, HERR_RUNTIME, "model: the batch has %d images but the model "
                        "has no vision encoder", b->n_images);
    int rc = chunk_objects(m, K, err);
    if (rc)
        return rc;
    int images = m->enc.present && b->n_images > 0, n_units = 0;
    double t0 = now_ms();
    m->enc.n_units = 0;
    if (images && (rc = model_encode_forward(m, b->n_images, b->grid_thw, b->pixels, err)))
        return rc;
    const float *img = images ? model_img_feat(m, &n_units) : NULL;
    double t1 = now_ms();
    for (int j = 0; j < K; j++) {
        model *o = j ? m->chunk_objs[j - 1] : m;
        model_stats cs;
        if ((rc = model_stage_set_chunk(o, j, K, err)) ||
            (rc = model_stage_forward(o, b, img, n_units, NULL, &cs, err)))
            return K > 1 ? herr_prefix(err, rc, "chunk %d", j) : rc;
        st.loss_sum += cs.loss_sum;
        st.n_targets += cs.n_targets;
        st.aux_loss += cs.aux_loss;
    }
    /* Nothing flows back when the decoder is frozen and no projector waits. */
    int back = train && (!m->shape.decoder.s.freeze || images);
    for (int j = K - 1; back && j >= 0; j--) {
        model *o = j ? m->chunk_objs[j - 1] : m;
        if ((rc = model_stage_backward(o, NULL, loss_scale, aux_scale,
                                       images ? model_img_grad(m) : NULL, err)))
            return K > 1 ? herr_prefix(err, rc, "chunk %d backward", j) : rc;
    }
    double t2 = now_ms();
    if (train && images && (rc = model_encode_backward(m, err)))
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
    return run(m, b, 1, 1, loss_scale, aux_scale, stats, err);
}

int model_forward(model *m, const vlm_batch *b, model_stats *stats, hearth_err *err)
{
    return run(m, b, 1, 0, 0.0f, 0.0f, stats, err);
}

int model_forward_backward_chunks(model *m, const vlm_batch *b, int K, float loss_scale,
                                  float aux_scale, model_stats *stats, hearth_err *err)
{
    return run(m, b, K < 1 ? 1 : K, 1, loss_scale, aux_scale, stats, err);
}
