/* shape_check.c - internal consistency of a model shape (shape_validate). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "shape/model_shape.h"
#include "shape/shape_internal.h"

static const char *pos_name(pos_kind p)
{
    switch (p) {
    case POS_ROPE: return "rope";
    case POS_MROPE: return "mrope";
    case POS_ROPE2D: return "rope2d";
    case POS_LEARNED: return "learned";
    }
    return "?";
}

/* Fills *iss (key = P+k, others = P+o1, P+o2 where given) and returns 1. */
static int fail(shape_issue *iss, const char *p, const char *k, const char *o1, const char *o2,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int fail(shape_issue *iss, const char *p, const char *k, const char *o1, const char *o2,
                const char *fmt, ...)
{
    memset(iss, 0, sizeof *iss);
    snprintf(iss->key, sizeof iss->key, "%s%s", p, k);
    if (o1)
        snprintf(iss->others[0], sizeof iss->others[0], "%s%s", p, o1);
    if (o2)
        snprintf(iss->others[1], sizeof iss->others[1], "%s%s", p, o2);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(iss->msg, sizeof iss->msg, fmt, ap);
    va_end(ap);
    return 1;
}

static int check_stack(const stack_shape *s, const char *p, int is_encoder, shape_issue *iss)
{
    /* Ranges first: shape_validate may see a struct that did not come from a preset. */
    const struct { const char *k; int v; } pos[] = {
        { "layers", s->layers }, { "hidden", s->hidden }, { "heads", s->heads },
        { "kv_heads", s->kv_heads }, { "head_dim", s->head_dim },
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v < 1)
            return fail(iss, p, pos[i].k, NULL, NULL, "must be >= 1, got %d", pos[i].v);
    if (!(s->norm_eps > 0))
        return fail(iss, p, "norm_eps", NULL, NULL, "must be > 0");
    if (s->heads % s->kv_heads)
        return fail(iss, p, "kv_heads", "heads", NULL,
                    "kv_heads %d must divide heads %d", s->kv_heads, s->heads);
    if (is_encoder && (long)s->heads * s->head_dim != s->hidden)
        return fail(iss, p, "head_dim", "heads", "hidden",
                    "heads %d x head_dim %d = %ld must equal hidden %d in the encoder",
                    s->heads, s->head_dim, (long)s->heads * s->head_dim, s->hidden);
    if (is_encoder && s->pos != POS_ROPE2D)
        return fail(iss, p, "pos", NULL, NULL,
                    "the encoder takes rope2d positions only, got %s", pos_name(s->pos));
    if (!is_encoder && s->pos == POS_ROPE2D)
        return fail(iss, p, "pos", NULL, NULL,
                    "rope2d is for vision patches; the decoder takes rope, mrope or learned");
    if ((s->pos == POS_ROPE || s->pos == POS_MROPE) && s->head_dim % 2)
        return fail(iss, p, "head_dim", "pos", NULL,
                    "%s needs an even head_dim, got %d", pos_name(s->pos), s->head_dim);
    if (s->pos == POS_ROPE2D && s->head_dim % 4)
        return fail(iss, p, "head_dim", "pos", NULL,
                    "rope2d needs head_dim divisible by 4, got %d", s->head_dim);
    if (s->pos == POS_MROPE) {
        const int *m = s->mrope_section;
        if (m[0] + m[1] + m[2] != s->head_dim / 2)
            return fail(iss, p, "mrope_section", "head_dim", "pos",
                        "sections [%d, %d, %d] sum to %d, must be head_dim / 2 = %d",
                        m[0], m[1], m[2], m[0] + m[1] + m[2], s->head_dim / 2);
    }
    return 0;
}

int shape_check(const model_shape *m, shape_issue *iss)
{
    const encoder_shape *e = &m->encoder;
    const decoder_shape *d = &m->decoder;
    if (m->projector.present && !e->present)
        return fail(iss, "", "projector.hidden", NULL, NULL,
                    "a projector needs an encoder section");
    if (e->present) {
        if (!m->projector.present)
            return fail(iss, "", "encoder.layers", NULL, NULL,
                        "an encoder needs a projector section");
        if (check_stack(&e->s, "encoder.", 1, iss))
            return 1;
        if (e->s.ffn < 1)
            return fail(iss, "encoder.", "ffn", NULL, NULL,
                        "the encoder's blocks are dense: give ffn > 0");
        if (e->patch < 1 || e->spatial_merge < 1 || e->temporal_patch < 1 || e->in_channels < 1)
            return fail(iss, "encoder.", "patch", "spatial_merge", "temporal_patch",
                        "patch, spatial_merge, temporal_patch and in_channels must be >= 1");
        if (e->n_full_attn < 0 || e->n_full_attn > SHAPE_MAX_FULL_ATTN)
            return fail(iss, "encoder.", "full_attn", NULL, NULL, "at most %d layers",
                        SHAPE_MAX_FULL_ATTN);
        if (m->projector.hidden < 1)
            return fail(iss, "", "projector.hidden", NULL, NULL, "must be >= 1");
        int unit = e->patch * e->spatial_merge;
        if (e->window_px && e->window_px % unit)
            return fail(iss, "encoder.", "window_px", "patch", "spatial_merge",
                        "must be a multiple of patch x spatial_merge = %d, got %d", unit,
                        e->window_px);
        for (int i = 0; i < e->n_full_attn; i++) {
            if (e->full_attn[i] >= e->s.layers)
                return fail(iss, "encoder.", "full_attn", "layers", NULL,
                            "layer %d does not exist (layers %d, counted from 0)",
                            e->full_attn[i], e->s.layers);
            if (i && e->full_attn[i] <= e->full_attn[i - 1])
                return fail(iss, "encoder.", "full_attn", NULL, NULL,
                            "layers must be listed in increasing order, without repeats");
        }
    }
    if (check_stack(&d->s, "decoder.", 0, iss))
        return 1;
    if (d->vocab < 1)
        return fail(iss, "decoder.", "vocab", NULL, NULL, "must be >= 1, got %d", d->vocab);
    if (d->s.pos == POS_LEARNED && d->max_positions < 1)
        return fail(iss, "decoder.", "max_positions", "pos", NULL,
                    "learned positions need max_positions >= 1");
    int moe = d->moe_experts > 0;
    if (moe) {
        if (d->moe_top_k < 1 || d->moe_top_k > d->moe_experts)
            return fail(iss, "decoder.", "moe.top_k", "moe.experts", NULL,
                        "must be between 1 and moe.experts %d, got %d", d->moe_experts,
                        d->moe_top_k);
        if (d->moe_ffn < 1)
            return fail(iss, "decoder.", "moe.ffn", "moe.experts", NULL,
                        "MoE needs a per-expert width moe.ffn > 0");
        if (d->moe_every > d->s.layers)
            return fail(iss, "decoder.", "moe.every", "layers", NULL,
                        "every %d > layers %d leaves no MoE layer", d->moe_every, d->s.layers);
    } else if (d->moe_shared_ffn) {
        return fail(iss, "decoder.", "moe.shared_ffn", "moe.experts", NULL,
                    "a shared expert needs moe.experts > 0");
    }
    if ((!moe || d->moe_every > 1) && d->s.ffn < 1)
        return fail(iss, "decoder.", "ffn", moe ? "moe.every" : "moe.experts", NULL,
                    "dense layers need ffn > 0");
    if (e->present && d->image_token_id < 0)
        return fail(iss, "decoder.", "image_token_id", NULL, NULL,
                    "a model with an encoder needs the id of its image tokens");
    if (d->image_token_id >= d->vocab)
        return fail(iss, "decoder.", "image_token_id", "vocab", NULL,
                    "must be below vocab %d, got %d", d->vocab, d->image_token_id);
    return 0;
}

int shape_validate(const model_shape *m, hearth_err *err)
{
    shape_issue iss;
    if (!shape_check(m, &iss))
        return 0;
    return herr_set(err, HERR_CONFIG, "%s: %s", iss.key, iss.msg);
}
