/* shape_count.c - exact parameter counts and analytic FLOPs of a model shape.
 * The conventions are documented at shape_count_params/shape_count_flops in
 * model_shape.h; everything is computed in int64 (products of table-bounded ints). */
#include <string.h>

#include "shape/model_shape.h"

static int64_t norm_params(norm_kind k, int64_t width)
{
    return k == NORM_LAYERNORM ? 2 * width : width;
}

/* Matrix weights of q, k, v and o. */
static int64_t attn_weights(const stack_shape *s)
{
    int64_t h = s->hidden, q = (int64_t)s->heads * s->head_dim,
            kv = (int64_t)s->kv_heads * s->head_dim;
    return h * (q + 2 * kv) + q * h;
}

static int64_t attn_params(const stack_shape *s)
{
    int64_t q = (int64_t)s->heads * s->head_dim, kv = (int64_t)s->kv_heads * s->head_dim;
    int64_t p = attn_weights(s);
    if (s->bias_qkv)
        p += q + 2 * kv;
    if (s->bias_proj)
        p += s->hidden;
    if (s->qk_norm)
        p += 2 * (int64_t)s->head_dim;
    return p;
}

static int64_t mlp_weights(const stack_shape *s, int64_t ffn)
{
    return (s->mlp == MLP_SWIGLU ? 3 : 2) * (int64_t)s->hidden * ffn;
}

static int64_t mlp_params(const stack_shape *s, int64_t ffn)
{
    if (ffn <= 0)
        return 0;
    int64_t p = mlp_weights(s, ffn);
    if (s->bias_mlp)
        p += (s->mlp == MLP_SWIGLU ? 2 : 1) * ffn + s->hidden;
    return p;
}

static int moe_layers(const decoder_shape *d)
{
    if (d->moe_experts <= 0 || d->moe_every <= 0)
        return 0;
    return d->s.layers / d->moe_every;
}

static int64_t patch_dim(const encoder_shape *e)
{
    return (int64_t)e->in_channels * e->temporal_patch * e->patch * e->patch;
}

void shape_count_params(const model_shape *m, shape_params *out)
{
    memset(out, 0, sizeof *out);
    const encoder_shape *e = &m->encoder;
    const projector_shape *pr = &m->projector;
    const decoder_shape *d = &m->decoder;
    const stack_shape *ds = &d->s;
    if (e->present) {
        const stack_shape *s = &e->s;
        int64_t block = 2 * norm_params(s->norm, s->hidden) + attn_params(s) +
                        mlp_params(s, s->ffn);
        out->encoder = (int64_t)s->hidden * patch_dim(e) + s->layers * block;
    }
    if (pr->present) {
        int64_t in = (int64_t)e->spatial_merge * e->spatial_merge * e->s.hidden;
        out->projector = norm_params(pr->norm, e->s.hidden) + in * pr->hidden +
                         (int64_t)pr->hidden * ds->hidden;
        if (pr->bias)
            out->projector += pr->hidden + ds->hidden;
    }
    int64_t h = ds->hidden;
    int64_t embed = (int64_t)d->vocab * h;
    if (ds->pos == POS_LEARNED)
        embed += (int64_t)d->max_positions * h;
    int64_t head = d->tied_embeddings ? 0 : (int64_t)d->vocab * h;
    int n_moe = moe_layers(d), n_dense = ds->layers - n_moe;
    int64_t common = 2 * norm_params(ds->norm, h) + attn_params(ds);
    int64_t expert = mlp_params(ds, d->moe_ffn);
    int64_t moe_fixed = n_moe ? h * d->moe_experts + mlp_params(ds, d->moe_shared_ffn) : 0;
    int64_t fixed = embed + head + norm_params(ds->norm, h) + ds->layers * common +
                    n_dense * mlp_params(ds, ds->ffn) + n_moe * moe_fixed;
    out->decoder = fixed + (int64_t)n_moe * d->moe_experts * expert;
    out->decoder_active = fixed + (int64_t)n_moe * d->moe_top_k * expert;
    out->total = out->encoder + out->projector + out->decoder;
    out->active = out->encoder + out->projector + out->decoder_active;
}

void shape_count_flops(const model_shape *m, int seq_len, shape_flops *out)
{
    memset(out, 0, sizeof *out);
    const encoder_shape *e = &m->encoder;
    const decoder_shape *d = &m->decoder;
    const stack_shape *ds = &d->s;

    /* Decoder: weights a token passes through, then attention over seq_len keys. */
    int n_moe = moe_layers(d), n_dense = ds->layers - n_moe;
    double w = (double)ds->layers * (double)attn_weights(ds) +
               (double)n_dense * (double)mlp_weights(ds, ds->ffn) +
               (double)d->vocab * ds->hidden;
    if (n_moe)
        w += (double)n_moe * ((double)ds->hidden * d->moe_experts +
                              (double)d->moe_top_k * (double)mlp_weights(ds, d->moe_ffn) +
                              (double)mlp_weights(ds, d->moe_shared_ffn));
    double qdim = (double)ds->heads * ds->head_dim;
    out->decoder_per_token = 6.0 * w + 12.0 * ds->layers * qdim * seq_len;

    if (e->present) {
        const stack_shape *s = &e->s;
        double ew = (double)s->hidden * (double)patch_dim(e) +
                    (double)s->layers * ((double)attn_weights(s) + (double)mlp_weights(s, s->ffn));
        double eq = (double)s->heads * s->head_dim;
        int n_full = e->window_px > 0 ? e->n_full_attn : s->layers;
        int n_window = s->layers - n_full;
        double side = e->patch > 0 ? (double)e->window_px / e->patch : 0;
        out->encoder_per_patch = 6.0 * ew + 12.0 * n_window * eq * side * side;
        out->encoder_per_patch_sq = 12.0 * n_full * eq;
    }
    if (m->projector.present && e->spatial_merge > 0) {
        double merge2 = (double)e->spatial_merge * e->spatial_merge;
        double pw = merge2 * e->s.hidden * m->projector.hidden +
                    (double)m->projector.hidden * ds->hidden;
        out->projector_per_patch = 6.0 * pw / merge2;
    }
}
