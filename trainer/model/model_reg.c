/* model_reg.c - the parameter table of a (local) model: which tensors exist, their
 * shards of the full tensors (model_par.h), their initialisation, and the pointers the
 * components keep into the flat parameter and gradient arrays.
 *
 * The table is built by running the same registration code more than once: the sizing
 * pass only counts tensors and floats; then the flat arrays are allocated; the fill pass
 * writes the table, initialises every tensor and hands out pointers; a clone's bind pass
 * only hands out pointers into its owner's arrays.  One code path for every pass keeps
 * the layout impossible to get out of step. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "model/model_shard.h"
#include "model/rng.h"

#define INIT_STD 0.02
#define INIT_CHUNK 65536  /* elements per random stream (see init_normal) */

typedef enum { INIT_NORMAL = 0, INIT_ONES = 1, INIT_ZEROS = 2 } init_kind;
typedef enum { PASS_SIZE = 0, PASS_FILL = 1, PASS_BIND = 2 } reg_pass;

typedef struct {
    model *m;
    reg_pass pass;
    int count;
    size_t offset;
    uint64_t seed;
    float *host;    /* the fill pass: the parameters are initialised here, then uploaded */
    int frozen;     /* the component being registered is frozen */
    int nomem;      /* the fill pass could not allocate a full tensor */
} reg_ctx;

/* Which part of the full tensor a rank holds (model_par.h).  NULL: the whole tensor,
 * replicated over the component's tp group. */
typedef struct {
    int nseg;                       /* 0: all rows */
    int64_t row0[3], rows[3];       /* row blocks of the [rows, cols] view */
    int64_t col0, ncols;            /* ncols 0: all columns */
    int kv_rep;
    int split;                      /* split by tp (not replicated over it) */
    int partial;                    /* gradient partial over tp */
    int expert, tied_copy;
} shard_req;

/* Normal(0, std) values of the FULL tensor `name`: streams keyed by the tensor's name and
 * a chunk index, so a tensor's values do not depend on which other tensors exist, on the
 * order they are registered in, on the number of threads, or on the layout. */
static void init_normal(float *p, size_t numel, double std, uint64_t seed, const char *name)
{
    uint64_t key = hrng_mix(seed, hrng_hash_str(name));
    long chunks = (long)((numel + INIT_CHUNK - 1) / INIT_CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (long c = 0; c < chunks; c++) {
        hrng g;
        hrng_init(&g, hrng_mix(key, (uint64_t)c));
        size_t i1 = (size_t)(c + 1) * INIT_CHUNK < numel ? (size_t)(c + 1) * INIT_CHUNK : numel;
        for (size_t i = (size_t)c * INIT_CHUNK; i < i1; i++)
            p[i] = (float)(std * hrng_normal(&g));
    }
}

static void shard_of(model_shard *sh, int64_t *ldims, int ndim, const int64_t *dims,
                     const shard_req *q)
{
    model_shard_whole(sh, ndim, dims);
    sh->tp_replicated = 1;
    for (int i = 0; i < 4; i++)
        ldims[i] = sh->dims[i];
    if (!q)
        return;
    if (q->nseg) {
        sh->nseg = q->nseg;
        for (int i = 0; i < q->nseg; i++) {
            sh->seg_row0[i] = q->row0[i];
            sh->seg_rows[i] = q->rows[i];
        }
    }
    if (q->ncols) {
        sh->col0 = q->col0;
        sh->ncols = q->ncols;
    }
    sh->kv_rep = q->kv_rep > 1 ? q->kv_rep : 1;
    sh->tp_partial = q->partial;
    sh->tp_replicated = !q->split && !q->partial;
    sh->expert = q->expert;
    sh->tied_copy = q->tied_copy;
    int64_t R = 0;
    for (int i = 0; i < sh->nseg; i++)
        R += sh->seg_rows[i];
    if (ndim >= 2 && sh->ncols != sh->cols)
        ldims[ndim - 1] = sh->ncols;
    if (R != sh->rows)
        ldims[0] = R / (sh->rows / dims[0]);
    if (R == sh->rows && sh->ncols == sh->cols) {
        /* The whole tensor (a group of one): one segment, as model.h promises, and
         * nothing split. */
        sh->tp_replicated = !q->partial;
        sh->nseg = 1;
        sh->seg_row0[0] = 0;
        sh->seg_rows[0] = sh->rows;
        sh->kv_rep = 1;
    }
}

/* Registers one tensor; returns its parameter pointer (NULL in the sizing pass) and
 * stores its gradient pointer in *grad (NULL in the sizing pass and for frozen
 * components).  dims are the FULL tensor's. */
static float *reg(reg_ctx *r, float **grad, init_kind init, double std, const shard_req *q,
                  int ndim, const int64_t *dims, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

static float *reg(reg_ctx *r, float **grad, init_kind init, double std, const shard_req *q,
                  int ndim, const int64_t *dims, const char *fmt, ...)
{
    model_shard sh;
    int64_t ldims[4];
    shard_of(&sh, ldims, ndim, dims, q);
    size_t numel = model_shard_numel(&sh);
    size_t off = r->offset;
    r->offset += numel;
    int idx = r->count++;
    if (grad)
        *grad = NULL;
    if (r->pass == PASS_SIZE)
        return NULL;
    model *m = r->m;
    if (grad && !r->frozen)
        *grad = m->grads + off;
    if (r->pass == PASS_BIND)
        return m->params + off;

    model_tensor *t = &m->tensors[idx];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->offset = off;
    t->numel = numel;
    t->ndim = ndim;
    for (int i = 0; i < 4; i++)
        t->dims[i] = ldims[i];
    t->decay = ndim >= 2;
    t->frozen = r->frozen;
    t->shard = sh;

    float *p = r->host + off;
    if (init == INIT_NORMAL) {
        size_t full = model_shard_full_numel(&sh);
        if (full == numel) {
            init_normal(p, numel, std, r->seed, t->name);
        } else {
            /* A shard takes the values the single-rank model would have: draw the full
             * tensor, keep this rank's part. */
            float *tmp = malloc(full * sizeof *tmp);
            if (!tmp) {
                r->nomem = 1;
                return m->params + off;
            }
            init_normal(tmp, full, std, r->seed, t->name);
            model_shard_extract(&sh, tmp, p);
            free(tmp);
        }
    } else {
        float v = init == INIT_ONES ? 1.0f : 0.0f;
        for (size_t i = 0; i < numel; i++)
            p[i] = v;
    }
    return m->params + off;
}

#define DIMS(...) ((const int64_t[]){ __VA_ARGS__ })
#define NDIMS(...) ((int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)))
#define REG(r, g, init, std, q, name, ...)                                                 \
    reg((r), (g), (init), (std), (q), NDIMS(__VA_ARGS__), DIMS(__VA_ARGS__), "%s", (name))

/* A norm's weight (ones) and, for layernorm, bias (zeros), named PREFIX.weight/.bias. */
static void reg_norm(reg_ctx *r, norm_kind kind, int C, const shard_req *q, float **w,
                     float **gw, float **b, float **gb, const char *prefix)
{
    char name[96];
    snprintf(name, sizeof name, "%s.weight", prefix);
    *w = REG(r, gw, INIT_ONES, 0, q, name, C);
    *b = *gb = NULL;
    if (kind == NORM_LAYERNORM) {
        snprintf(name, sizeof name, "%s.bias", prefix);
        *b = REG(r, gb, INIT_ZEROS, 0, q, name, C);
    }
}

/* A linear layer PREFIX.weight [out, in] (normal(0, std)) and optional PREFIX.bias
 * [out]; qw / qb say the weight's and the bias's shards (full dims given). */
static void reg_linear(reg_ctx *r, int out, int in, int bias, double std,
                       const shard_req *qw, const shard_req *qb, float **w, float **gw,
                       float **b, float **gb, const char *prefix)
{
    char name[96];
    snprintf(name, sizeof name, "%s.weight", prefix);
    *w = REG(r, gw, INIT_NORMAL, std, qw, name, out, in);
    if (b)
        *b = *gb = NULL;
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", prefix);
        *b = REG(r, gb, INIT_ZEROS, 0, qb, name, out);
    }
}

/* One block, global layer index gl of `layers`; sp: the decoder's sequence parallel
 * (norms and row-parallel biases then see local tokens only). */
static void reg_block(reg_ctx *r, const stack_cfg *c, block *blk, const char *comp, int gl,
                      int layers, int sp)
{
    const stack_shape *s = c->s;
    block_params *p = &blk->p, *g = &blk->g;
    double out_std = INIT_STD / sqrt(2.0 * layers);
    int D = c->D, H = c->H, tp = c->tp, t = c->t;
    int QDf = c->Hq_full * D, KDf = c->Hkv_full * D, Ff = c->F_full;
    int Fuf = s->mlp == MLP_SWIGLU ? 2 * Ff : Ff;
    char pre[96], name[128];
    snprintf(pre, sizeof pre, "%s.layers.%d", comp, gl);
#define NM(suffix) (snprintf(name, sizeof name, "%s.%s", pre, (suffix)), name)

    /* Replicated over tp; under sp partial (local tokens only). */
    shard_req rep_sp = { .partial = sp && tp > 1 };
    /* q, k, v rows of the local heads. */
    shard_req qkv = {
        .nseg = 3, .row0 = { (int64_t)c->q0 * D, QDf + (int64_t)c->kv0 * D,
                             QDf + KDf + (int64_t)c->kv0 * D },
        .rows = { c->QD, c->KD, c->KD }, .kv_rep = c->kv_rep, .split = 1,
    };
    shard_req qk_norm = { .partial = tp > 1 };
    shard_req proj = { .col0 = (int64_t)c->q0 * D, .ncols = c->QD, .split = 1 };
    shard_req down = { .col0 = (int64_t)t * c->F, .ncols = c->F, .split = 1 };
    shard_req up = { .nseg = 1, .row0 = { (int64_t)t * c->F }, .rows = { c->F }, .split = 1 };
    if (s->mlp == MLP_SWIGLU)
        up = (shard_req){ .nseg = 2, .row0 = { (int64_t)t * c->F, Ff + (int64_t)t * c->F },
                          .rows = { c->F, c->F }, .split = 1 };

    reg_norm(r, s->norm, H, &rep_sp, &p->attn_norm_w, &g->attn_norm_w, &p->attn_norm_b,
             &g->attn_norm_b, NM("attn_norm"));
    reg_linear(r, QDf + 2 * KDf, H, s->bias_qkv, INIT_STD, &qkv, &qkv, &p->qkv_w, &g->qkv_w,
               &p->qkv_b, &g->qkv_b, NM("attn.qkv"));
    if (s->qk_norm) {
        p->q_norm_w = REG(r, &g->q_norm_w, INIT_ONES, 0, &qk_norm, NM("attn.q_norm.weight"),
                          D);
        p->k_norm_w = REG(r, &g->k_norm_w, INIT_ONES, 0, &qk_norm, NM("attn.k_norm.weight"),
                          D);
    }
    reg_linear(r, H, QDf, s->bias_proj, out_std, &proj, &rep_sp, &p->proj_w, &g->proj_w,
               &p->proj_b, &g->proj_b, NM("attn.proj"));
    reg_norm(r, s->norm, H, &rep_sp, &p->mlp_norm_w, &g->mlp_norm_w, &p->mlp_norm_b,
             &g->mlp_norm_b, NM("mlp_norm"));
    if (blk->moe) {
        /* Computed tp-redundantly; experts split over ep. */
        int E = c->E, Fm = c->Fm;
        shard_req eup = { .nseg = 1, .row0 = { (int64_t)c->E0 * 2 * Fm },
                          .rows = { (int64_t)c->El * 2 * Fm }, .expert = 1 };
        shard_req edown = { .nseg = 1, .row0 = { (int64_t)c->E0 * H },
                            .rows = { (int64_t)c->El * H }, .expert = 1 };
        p->router_w = REG(r, &g->router_w, INIT_NORMAL, INIT_STD, NULL,
                          NM("mlp.router.weight"), E, H);
        p->exp_fc1_w = REG(r, &g->exp_fc1_w, INIT_NORMAL, INIT_STD, &eup,
                           NM("mlp.experts.gate_up.weight"), E, 2 * Fm, H);
        p->exp_fc2_w = REG(r, &g->exp_fc2_w, INIT_NORMAL, out_std, &edown,
                           NM("mlp.experts.down.weight"), E, H, Fm);
        if (c->Fs > 0) {
            p->sh_fc1_w = REG(r, &g->sh_fc1_w, INIT_NORMAL, INIT_STD, NULL,
                              NM("mlp.shared.gate_up.weight"), 2 * c->Fs, H);
            p->sh_fc2_w = REG(r, &g->sh_fc2_w, INIT_NORMAL, out_std, NULL,
                              NM("mlp.shared.down.weight"), H, c->Fs);
        }
    } else {
        int swiglu = s->mlp == MLP_SWIGLU;
        reg_linear(r, Fuf, H, s->bias_mlp, INIT_STD, &up, &up, &p->fc1_w, &g->fc1_w,
                   &p->fc1_b, &g->fc1_b, NM(swiglu ? "mlp.gate_up" : "mlp.fc1"));
        reg_linear(r, H, Ff, s->bias_mlp, out_std, &down, &rep_sp, &p->fc2_w, &g->fc2_w,
                   &p->fc2_b, &g->fc2_b, NM(swiglu ? "mlp.down" : "mlp.fc2"));
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
        e->patch_w = REG(r, &e->patch_gw, INIT_NORMAL, INIT_STD, NULL,
                         "encoder.patch_embed.weight", e->st.c.H, e->patch_dim);
        for (int l = 0; l < e->st.L; l++)
            reg_block(r, &e->st.c, &e->st.layers[l], "encoder", l, e->st.L, 0);
    }
    if (m->proj.present) {
        projector_part *pj = &m->proj;
        /* The projector has no freeze switch of its own: it trains whenever it exists
         * (the usual recipe freezes the ViT and trains the merger). */
        r->frozen = 0;
        reg_norm(r, pj->sh->norm, pj->in / pj->merge2, NULL, &pj->norm_w, &pj->norm_gw,
                 &pj->norm_b, &pj->norm_gb, "projector.norm");
        reg_linear(r, pj->hidden, pj->in, pj->sh->bias, INIT_STD, NULL, NULL, &pj->fc1_w,
                   &pj->fc1_gw, &pj->fc1_b, &pj->fc1_gb, "projector.fc1");
        reg_linear(r, pj->out, pj->hidden, pj->sh->bias, INIT_STD, NULL, NULL, &pj->fc2_w,
                   &pj->fc2_gw, &pj->fc2_b, &pj->fc2_gb, "projector.fc2");
    }
    decoder_part *d = &m->dec;
    if (!d->present)
        return;
    const decoder_shape *ds = &sh->decoder;
    int H = ds->s.hidden, sp = d->sp && d->tp > 1;
    r->frozen = ds->s.freeze != 0;
    shard_req vocab = { .nseg = 1, .row0 = { d->v0 }, .rows = { d->v1 - d->v0 }, .split = 1 };
    shard_req rep_sp = { .partial = sp };
    d->embed_w = d->embed_gw = NULL;
    if (d->has_embed)
        d->embed_w = REG(r, &d->embed_gw, INIT_NORMAL, INIT_STD, &vocab,
                         "decoder.embed.weight", ds->vocab, H);
    d->pos_w = d->pos_gw = NULL;
    if (d->has_embed && ds->s.pos == POS_LEARNED)
        d->pos_w = REG(r, &d->pos_gw, INIT_NORMAL, INIT_STD, NULL, "decoder.pos_embed.weight",
                       ds->max_positions, H);
    int first = m->par.first_layer;
    for (int l = 0; l < d->st.L; l++)
        reg_block(r, &d->st.c, &d->st.layers[l], "decoder", first + l, ds->s.layers, sp);
    d->norm_w = d->norm_b = d->norm_gw = d->norm_gb = d->head_w = d->head_gw = NULL;
    if (!d->has_head)
        return;
    reg_norm(r, ds->s.norm, H, &rep_sp, &d->norm_w, &d->norm_gw, &d->norm_b, &d->norm_gb,
             "decoder.final_norm");
    if (ds->tied_embeddings && d->has_embed) {
        d->head_w = d->embed_w;
        d->head_gw = d->embed_gw;
    } else if (ds->tied_embeddings) {
        /* The last stage's own copy of the embedding shard, kept equal by summing the
         * two gradients (model_par.h). */
        vocab.tied_copy = 1;
        d->head_w = REG(r, &d->head_gw, INIT_NORMAL, INIT_STD, &vocab, "decoder.embed.weight",
                        ds->vocab, H);
    } else {
        d->head_w = REG(r, &d->head_gw, INIT_NORMAL, INIT_STD, &vocab,
                        "decoder.lm_head.weight", ds->vocab, H);
    }
}

int model_reg_build(model *m, uint64_t seed, hearth_err *err)
{
    reg_ctx r = { .m = m, .pass = PASS_SIZE, .seed = seed };
    reg_all(&r);
    m->n_params = r.offset;
    m->n_tensors = r.count;
    size_t bytes = m->n_params * sizeof(float);
    m->tensors = calloc(r.count ? (size_t)r.count : 1, sizeof *m->tensors);
    float *host = malloc(bytes ? bytes : 1);
    int rc = 0;
    if (!m->tensors || !host)
        rc = herr_set(err, HERR_NOMEM, "model: out of memory for %zu parameters", r.offset);
    if (!rc)
        rc = dev_alloc(m->dev, (void **)&m->params, bytes, "parameters", err);
    if (!rc)
        rc = dev_alloc(m->dev, (void **)&m->grads, bytes, "gradients", err);
    if (rc) {
        free(host);
        return rc;
    }
    /* Initialised on the host and uploaded: one seed, one set of weights on every device. */
    r = (reg_ctx){ .m = m, .pass = PASS_FILL, .seed = seed, .host = host };
    reg_all(&r);
    if (r.nomem)
        rc = herr_set(err, HERR_NOMEM, "model: out of memory initialising a shard");
    else
        rc = dev_upload(m->dev, m->params, host, bytes, err);
    free(host);
    return rc;
}

void model_reg_bind(model *m)
{
    reg_ctx r = { .m = m, .pass = PASS_BIND };
    reg_all(&r);
}
