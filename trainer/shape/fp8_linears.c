/* fp8_linears.c - the linears of a run's model and the count a plan puts in FP8
 * (fp8_linears.h). */
#include "shape/fp8_linears.h"

#include <math.h>

void fp8_micro_tokens_of(const run_config *c, fp8_micro_tokens *t)
{
    const encoder_shape *e = &c->model.encoder;
    int cp = c->parallel.cp > 0 ? c->parallel.cp : 1;
    t->decoder = (int64_t)c->train.seq_len * c->train.micro_batch / cp;
    t->encoder = t->projector = 0;
    if (!e->present || c->data.images_max < 1)
        return;
    /* one merge unit is (patch x merge) px on a side; sides round as data_synth.c does */
    int u = e->patch * e->spatial_merge;
    int px = (c->data.image_px_min + c->data.image_px_max) / 2;
    int side = (px + u / 2) / u;
    if (side < 1)
        side = 1;
    double units = (c->data.images_min + c->data.images_max) / 2.0 * side * side;
    double room = c->train.seq_len > 1 ? c->train.seq_len - 1 : 0;
    t->projector = llround(fmin(units, room) * c->train.micro_batch);
    t->encoder = t->projector * e->spatial_merge * e->spatial_merge;
}

/* q heads split over tp, kv heads too where there are enough, else one kv head a rank. */
static int qkv_rows(const stack_shape *s, int tp)
{
    int kv = s->kv_heads >= tp ? s->kv_heads / tp : 1;
    return (s->heads / tp + 2 * kv) * s->head_dim;
}

static int mlp_in(const stack_shape *s) { return s->mlp == MLP_SWIGLU ? 2 : 1; }

/* The attention and dense MLP linears of a stack. */
static int stack_linears(fp8_linear *o, int comp, const stack_shape *s, int tp,
                         int64_t tokens, int dense_layers)
{
    int n = 0;
    o[n++] = (fp8_linear){ comp, FP8_QKV, tp, s->hidden, qkv_rows(s, tp), tokens, tokens,
                           s->layers };
    o[n++] = (fp8_linear){ comp, FP8_PROJ, tp, s->heads / tp * s->head_dim, s->hidden,
                           tokens, tokens, s->layers };
    if (dense_layers > 0) {
        o[n++] = (fp8_linear){ comp, FP8_FC1, tp, s->hidden, mlp_in(s) * s->ffn / tp, tokens,
                               tokens, dense_layers };
        o[n++] = (fp8_linear){ comp, FP8_FC2, tp, s->ffn / tp, s->hidden, tokens, tokens,
                               dense_layers };
    }
    return n;
}

static int is_moe_layer(const decoder_shape *d, int l)
{
    return d->moe_experts > 0 && d->moe_every > 0 && l % d->moe_every == d->moe_every - 1;
}

int fp8_linears_of(const run_config *c, fp8_linear *o)
{
    const model_shape *m = &c->model;
    fp8_micro_tokens t;
    fp8_micro_tokens_of(c, &t);
    int n = 0, tp = c->parallel.tp > 0 ? c->parallel.tp : 1;
    if (m->encoder.present) {
        int etp = c->parallel.encoder.tp > 0 ? c->parallel.encoder.tp : 1;
        n += stack_linears(o + n, FP8_COMP_ENCODER, &m->encoder.s, etp, t.encoder,
                           m->encoder.s.layers);
    }
    if (m->projector.present) {
        int K = m->encoder.spatial_merge * m->encoder.spatial_merge * m->encoder.s.hidden;
        int H = m->projector.hidden;
        o[n++] = (fp8_linear){ FP8_COMP_PROJECTOR, FP8_FC1, 1, K, H, t.projector,
                               t.projector, 1 };
        o[n++] = (fp8_linear){ FP8_COMP_PROJECTOR, FP8_FC2, 1, H, m->decoder.s.hidden,
                               t.projector, t.projector, 1 };
    }
    const decoder_shape *d = &m->decoder;
    const stack_shape *s = &d->s;
    int moe = 0;
    for (int l = 0; l < s->layers; l++)
        moe += is_moe_layer(d, l);
    n += stack_linears(o + n, FP8_COMP_DECODER, s, tp, t.decoder, s->layers - moe);
    if (moe) {
        int64_t rows = t.decoder * d->moe_top_k / d->moe_experts;
        if (rows < 1)
            rows = 1;
        const int D = FP8_COMP_DECODER;
        o[n++] = (fp8_linear){ D, FP8_ROUTER, tp, s->hidden, d->moe_experts, t.decoder,
                               t.decoder, moe };
        o[n++] = (fp8_linear){ D, FP8_EXPERT_FC1, tp, s->hidden, 2 * d->moe_ffn, t.decoder,
                               rows, moe };
        o[n++] = (fp8_linear){ D, FP8_EXPERT_FC2, tp, d->moe_ffn, s->hidden, t.decoder, rows,
                               moe };
        if (d->moe_shared_ffn > 0) {
            o[n++] = (fp8_linear){ D, FP8_SHARED_FC1, tp, s->hidden, 2 * d->moe_shared_ffn,
                                   t.decoder, t.decoder, moe };
            o[n++] = (fp8_linear){ D, FP8_SHARED_FC2, tp, d->moe_shared_ffn, s->hidden,
                                   t.decoder, t.decoder, moe };
        }
    }
    o[n++] = (fp8_linear){ FP8_COMP_DECODER, FP8_LM_HEAD, tp, s->hidden,
                           (d->vocab + tp - 1) / tp, t.decoder, t.decoder, 1 };
    return n;
}

/* Whether layer l of the component holds linear `kind` (dense and MoE decoder layers
 * differ). */
static int layer_has(const run_config *c, const fp8_linear *x, int l)
{
    if (x->comp != FP8_COMP_DECODER)
        return 1;
    int moe = is_moe_layer(&c->model.decoder, l);
    switch (x->kind) {
    case FP8_FC1: case FP8_FC2: return !moe;
    case FP8_QKV: case FP8_PROJ: return 1;
    default: return moe;
    }
}

int fp8_plan_count(const fp8_plan *p, const run_config *c)
{
    fp8_linear lin[FP8_LINEARS_MAX];
    int n = fp8_linears_of(c, lin), count = 0;
    for (int i = 0; i < n; i++) {
        const fp8_linear *x = &lin[i];
        int L = x->comp == FP8_COMP_ENCODER ? c->model.encoder.s.layers
                                            : c->model.decoder.s.layers;
        /* the projector and the LM head have no layer index (keep_bf16 layers skip them) */
        if (x->comp == FP8_COMP_PROJECTOR || x->kind == FP8_LM_HEAD) {
            count += fp8_plan_uses(p, x->comp, x->kind, FP8_ANY, L, x->tp, x->tokens);
            continue;
        }
        for (int l = 0; l < L; l++)
            count += layer_has(c, x, l) &&
                     fp8_plan_uses(p, x->comp, x->kind, l, L, x->tp, x->tokens);
    }
    return count;
}
