/* gpt_gpu.cu - the GPU decoder (gpt_gpu.h): tensor table, arena plan, creation, host copies. */
#include "gpu/gpt_gpu.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpt_gpu_internal.h"
#include "gpu/gpt_gpu_kernels.h"

int gg_fail(gpt_gpu *g, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->msg, sizeof g->msg, fmt, ap);
    va_end(ap);
    return code;
}

int gg_cuda(gpt_gpu *g, cudaError_t e, const char *what)
{
    return e == cudaSuccess ? 0 : gg_fail(g, KCUDA_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

int gg_k(gpt_gpu *g, int rc, const char *what)
{
    return rc >= 0 ? 0 : gg_fail(g, rc, "%s: %s", what, kcuda_ctx_errmsg(g->kc));
}

/* Host -> device copy in the model's stream, complete on return (a plain cudaMemcpy from
 * pageable memory may return before its DMA ends, unordered with a non-blocking stream). */
static int h2d(gpt_gpu *g, void *dst, const void *src, size_t bytes, const char *what)
{
    int rc = gg_cuda(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream), what);
    return rc ? rc : gg_cuda(g, cudaStreamSynchronize(g->stream), what);
}

const char *gpt_gpu_errmsg(const gpt_gpu *g) { return g ? g->msg : ""; }
int gpt_gpu_tensor_decay(const gpt_gpu *g, int i) { return g->t[i].decay; }
int gpt_gpu_tensor_count(const gpt_gpu *g) { return g->nt; }
const char *gpt_gpu_tensor_name(const gpt_gpu *g, int i) { return g->t[i].name; }
size_t gpt_gpu_tensor_numel(const gpt_gpu *g, int i) { return g->t[i].n; }
void *gpt_gpu_stream(const gpt_gpu *g) { return (void *)g->stream; }
void gpt_gpu_fused_bias_grad(gpt_gpu *g, int on) { g->no_bgradb = !on; }

size_t gpt_gpu_param_count(const gpt_gpu *g)
{
    size_t n = 0;
    for (int i = 0; i < g->nt; i++)
        n += g->t[i].n;
    return n;
}

void gpt_gpu_memory(const gpt_gpu *g, size_t *state_bytes, size_t *activation_bytes)
{
    if (state_bytes)
        *state_bytes = g->state_bytes;
    if (activation_bytes)
        *activation_bytes = g->arena_bytes;
}

/* ---- the tensor table ------------------------------------------------------------ */

/* reserve: elements held in memory (>= numel; the padded embedding table). */
static int add_tensor(gpt_gpu *g, const char *name, int64_t d0, int64_t d1, int decay,
                      size_t reserve)
{
    gg_tensor *t = &g->t[g->nt];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = d1 ? 2 : 1;
    t->dims[0] = d0;
    t->dims[1] = d1;
    t->n = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    t->off = g->P;
    t->decay = decay;
    reserve = reserve > t->n ? reserve : t->n;
    g->P += (reserve + GG_ALIGN_ELEMS - 1) / GG_ALIGN_ELEMS * GG_ALIGN_ELEMS;
    return g->nt++;
}

/* The CPU model's names and order (trainer/model/model.h): decay on matrices and
 * embeddings, not on norms and biases. */
static void build_table(gpt_gpu *g)
{
    const gpt_gpu_config *c = &g->c;
    int64_t C = c->hidden, F = c->ffn;
    char nm[96];
    g->t_embed = add_tensor(g, "decoder.embed.weight", c->vocab, C, 1, (size_t)g->Vp * C);
    g->t_pos = add_tensor(g, "decoder.pos_embed.weight", c->max_positions, C, 1, 0);
    g->t_layer0 = g->nt;
    for (int l = 0; l < c->layers; l++) {
#define ADD(suffix, d0, d1, dec)                                                     \
    do {                                                                             \
        snprintf(nm, sizeof nm, "decoder.layers.%d.%s", l, suffix);                  \
        add_tensor(g, nm, d0, d1, dec, 0);                                           \
    } while (0)
        ADD("attn_norm.weight", C, 0, 0);
        ADD("attn_norm.bias", C, 0, 0);
        ADD("attn.qkv.weight", 3 * C, C, 1);
        ADD("attn.qkv.bias", 3 * C, 0, 0);
        ADD("attn.proj.weight", C, C, 1);
        ADD("attn.proj.bias", C, 0, 0);
        ADD("mlp_norm.weight", C, 0, 0);
        ADD("mlp_norm.bias", C, 0, 0);
        ADD("mlp.fc1.weight", F, C, 1);
        ADD("mlp.fc1.bias", F, 0, 0);
        ADD("mlp.fc2.weight", C, F, 1);
        ADD("mlp.fc2.bias", C, 0, 0);
#undef ADD
    }
    g->t_lnfw = add_tensor(g, "decoder.final_norm.weight", C, 0, 0, 0);
    g->t_lnfb = add_tensor(g, "decoder.final_norm.bias", C, 0, 0, 0);
}


/* ---- the activation arena -------------------------------------------------------- */

typedef struct {
    char *base;   /* NULL while sizing */
    size_t used;
} gg_bump;

static void *take(gg_bump *b, size_t bytes)
{
    size_t off = (b->used + 255) & ~(size_t)255;
    b->used = off + bytes;
    return b->base ? b->base + off : NULL;
}

#define TAKE_BF(b, n) ((kcuda_bf16 *)take(b, (size_t)(n) * sizeof(kcuda_bf16)))
#define TAKE_F(b, n) ((float *)take(b, (size_t)(n) * sizeof(float)))
#define TAKE_I(b, n) ((int *)take(b, (size_t)(n) * sizeof(int)))

/* Lays the arena out (or, with b->base NULL, only measures it). */
static void plan(gpt_gpu *g, gg_bump *b)
{
    const gpt_gpu_config *c = &g->c;
    size_t N = (size_t)g->N, C = (size_t)c->hidden, F = (size_t)c->ffn;
    size_t V = (size_t)g->Vp, H = (size_t)c->heads;
    for (int l = 0; l < c->layers; l++) {
        gg_layer *y = &g->L[l];
        y->resid = TAKE_BF(b, N * C);
        y->ln1 = TAKE_BF(b, N * C);
        y->q = TAKE_BF(b, N * C);
        y->k = TAKE_BF(b, N * C);
        y->v = TAKE_BF(b, N * C);
        y->att = TAKE_BF(b, N * C);
        y->mid = TAKE_BF(b, N * C);
        y->ln2 = TAKE_BF(b, N * C);
        y->fc1 = TAKE_BF(b, N * F);
        y->gel = TAKE_BF(b, N * F);
        y->mean1 = TAKE_F(b, N);
        y->rstd1 = TAKE_F(b, N);
        y->lse = TAKE_F(b, N * H);
        y->mean2 = TAKE_F(b, N);
        y->rstd2 = TAKE_F(b, N);
    }
    g->resid_f = TAKE_BF(b, N * C);
    g->lnf = TAKE_BF(b, N * C);
    g->logits = TAKE_BF(b, N * V);
    g->head_bias = TAKE_BF(b, V);
    g->tok = TAKE_BF(b, N * C);
    g->pos = TAKE_BF(b, N * C);
    g->tmp = TAKE_BF(b, N * C);
    g->dresid = TAKE_BF(b, N * C);
    g->dtmp = TAKE_BF(b, N * C);
    /* dq, dk, dv adjacent: one zeroing pass before the attention backward adds. */
    g->dq = TAKE_BF(b, 3 * N * C);
    g->dk = b->base ? g->dq + N * C : NULL;
    g->dv = b->base ? g->dk + N * C : NULL;
    g->dgel = TAKE_BF(b, N * F);
    g->dfc1 = TAKE_BF(b, N * F);
    g->meanf = TAKE_F(b, N);
    g->rstdf = TAKE_F(b, N);
    g->losses = TAKE_F(b, N);
    g->lse_ce = TAKE_F(b, N);
    g->dlosses = TAKE_F(b, N);
    /* Scratch of the bias gradients (one [chunks, width] array) and of the LayerNorm
     * parameter gradients (two [chunks, C] arrays). */
    size_t widest = F > 3 * C ? F : 3 * C;
    widest = widest > 2 * C ? widest : 2 * C;
    g->bias_part = TAKE_F(b, ggk_bias_scratch(g->N, (int)widest));
    g->clip = TAKE_F(b, 1);
    g->ids = TAKE_I(b, (size_t)c->max_micro * N);
    g->tgt = TAKE_I(b, (size_t)c->max_micro * N);
    g->pos_ids = TAKE_I(b, N);
    g->cu = TAKE_I(b, (size_t)c->micro_batch + 1);
    g->loss_acc = (double *)take(b, sizeof(double));
    g->sumsq = (double *)take(b, sizeof(double));
}

/* ---- creation ---------------------------------------------------------------------- */

/* Round to nearest even, as __float2bfloat16_rn (NaN kept quiet). */
static kcuda_bf16 to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (kcuda_bf16)((u >> 16) | 0x40);
    return (kcuda_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return ((rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* Host initial values of every tensor into h[P] (padding zero). */
static void init_host(const gpt_gpu *g, float *h, uint64_t seed)
{
    uint64_t s = seed;
    float out_scale = 1.0f / sqrtf(2.0f * (float)g->c.layers);
    for (int i = 0; i < g->nt; i++) {
        const gg_tensor *t = &g->t[i];
        float *p = h + t->off;
        int is_norm_w = strstr(t->name, "norm.weight") != NULL;
        if (t->ndim == 1) {
            for (size_t j = 0; j < t->n; j++)
                p[j] = is_norm_w ? 1.0f : 0.0f;
            continue;
        }
        float sd = 0.02f;
        if (strstr(t->name, "attn.proj.weight") || strstr(t->name, "mlp.fc2.weight"))
            sd *= out_scale;
        for (size_t j = 0; j < t->n; j += 2) {
            double u1 = rng_unit(&s), u2 = rng_unit(&s), r = sqrt(-2.0 * log(u1));
            p[j] = (float)(sd * r * cos(6.283185307179586 * u2));
            if (j + 1 < t->n)
                p[j + 1] = (float)(sd * r * sin(6.283185307179586 * u2));
        }
    }
}

static int check_config(const gpt_gpu_config *c, char *errbuf, size_t errlen)
{
    const char *why = NULL;
    if (c->layers < 1 || c->hidden < 1 || c->heads < 1 || c->ffn < 1 || c->vocab < 1 ||
        c->micro_batch < 1 || c->seq_len < 1 || c->max_micro < 1)
        why = "every size must be positive";
    else if (c->hidden % c->heads)
        why = "hidden must be a multiple of heads";
    else if (c->hidden / c->heads != 64 && c->hidden / c->heads != 80 &&
             c->hidden / c->heads != 128)
        why = "head_dim must be 64, 80 or 128 (flash attention)";
    else if (c->seq_len > c->max_positions)
        why = "seq_len exceeds max_positions";
    else if ((double)c->micro_batch * c->seq_len * (c->ffn > c->hidden ? c->ffn : c->hidden) >
             2147483647.0 * 8)
        why = "micro batch too large (token and element counts must fit the kernels' ints)";
    if (why && errbuf && errlen)
        snprintf(errbuf, errlen, "gpt_gpu_create: %s", why);
    return why ? KCUDA_EARG : 0;
}

/* The host-side description: tensor table and arena size (no device touched). */
static int skeleton(gpt_gpu **out, const gpt_gpu_config *cfg, char *errbuf, size_t errlen)
{
    *out = NULL;
    int rc = check_config(cfg, errbuf, errlen);
    if (rc)
        return rc;
    gpt_gpu *g = (gpt_gpu *)calloc(1, sizeof *g);
    if (!g)
        return KCUDA_ENOMEM;
    g->c = *cfg;
    g->D = cfg->hidden / cfg->heads;
    g->N = cfg->micro_batch * cfg->seq_len;
    g->Vp = (cfg->vocab + GG_VOCAB_ALIGN - 1) / GG_VOCAB_ALIGN * GG_VOCAB_ALIGN;
    g->t = (gg_tensor *)calloc((size_t)(4 + T_PER_LAYER * cfg->layers), sizeof *g->t);
    g->L = (gg_layer *)calloc((size_t)cfg->layers, sizeof *g->L);
    g->n_targets = (int *)calloc((size_t)cfg->max_micro, sizeof(int));
    if (!g->t || !g->L || !g->n_targets) {
        if (errbuf && errlen)
            snprintf(errbuf, errlen, "gpt_gpu: out of host memory");
        gpt_gpu_free(g);
        return KCUDA_ENOMEM;
    }
    build_table(g);
    gg_bump b = {NULL, 0};
    plan(g, &b);
    g->arena_bytes = b.used;
    g->state_bytes = g->P * (4 * sizeof(float) + sizeof(kcuda_bf16));
    *out = g;
    return 0;
}

int gpt_gpu_plan(gpt_gpu **out, const gpt_gpu_config *cfg, char *errbuf, size_t errlen)
{
    return skeleton(out, cfg, errbuf, errlen);
}

int gpt_gpu_create(gpt_gpu **out, const gpt_gpu_config *cfg, uint64_t seed, char *errbuf,
                   size_t errlen)
{
    gpt_gpu *g = NULL;
    int rc = skeleton(&g, cfg, errbuf, errlen);
    if (rc)
        return rc;
    float *h = NULL;
    int *hi = NULL;
    kcuda_tensor_f32 *sd = NULL;
    kcuda_adamw_tensor *ad = NULL;
    gg_bump b = {NULL, 0};
    if ((rc = gg_cuda(g, cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking),
                      "cudaStreamCreate")))
        goto fail;
    if ((rc = kcuda_ctx_create(&g->kc, (kcuda_stream)g->stream, GG_WORKSPACE, g->msg,
                               sizeof g->msg)) < 0)
        goto fail;

    /* Parameter-shaped state: p32, g32, m, v (fp32) and p16 (bf16). */
    {
        size_t P = g->P;
        void **bufs[5] = {(void **)&g->p32, (void **)&g->g32, (void **)&g->m, (void **)&g->v,
                          (void **)&g->p16};
        size_t es[5] = {4, 4, 4, 4, 2};
        for (int i = 0; i < 5; i++) {
            if ((rc = gg_cuda(g, cudaMalloc(bufs[i], P * es[i]), "cudaMalloc(state)")))
                goto fail;
            if ((rc = gg_cuda(g, cudaMemsetAsync(*bufs[i], 0, P * es[i], g->stream),
                              "cudaMemset(state)")))
                goto fail;
        }
    }
    if ((rc = gg_cuda(g, cudaMalloc(&g->arena, g->arena_bytes), "cudaMalloc(activations)")))
        goto fail;
    /* All bits set: NaN in fp32 and bf16, so that reading anything a step did not write
     * first shows in the loss (one pass over the arena, once). */
    if ((rc = gg_cuda(g, cudaMemsetAsync(g->arena, 0xff, g->arena_bytes, g->stream),
                      "cudaMemset(activations)")))
        goto fail;
    b.base = (char *)g->arena;
    b.used = 0;
    plan(g, &b);

    /* Initial parameters, position ids, sequence boundaries, optimizer descriptors. */
    h = (float *)calloc(g->P, sizeof *h);
    hi = (int *)malloc(((size_t)g->N + cfg->micro_batch + 1) * sizeof *hi);
    sd = (kcuda_tensor_f32 *)malloc((size_t)g->nt * sizeof *sd);
    ad = (kcuda_adamw_tensor *)malloc((size_t)g->nt * sizeof *ad);
    if (!h || !hi || !sd || !ad) {
        rc = gg_fail(g, KCUDA_ENOMEM, "gpt_gpu_create: out of host memory");
        goto fail;
    }
    init_host(g, h, seed);
    for (int i = 0; i < g->nt; i++)
        if ((rc = gpt_gpu_set_param(g, i, h + g->t[i].off)))
            goto fail;
    for (int i = 0; i < g->N; i++)
        hi[i] = i % cfg->seq_len;
    for (int i = 0; i <= cfg->micro_batch; i++)
        hi[g->N + i] = i * cfg->seq_len;
    if ((rc = h2d(g, g->pos_ids, hi, (size_t)g->N * sizeof(int), "upload positions")) ||
        (rc = h2d(g, g->cu, hi + g->N, (size_t)(cfg->micro_batch + 1) * sizeof(int),
                  "upload cu_seqlens")))
        goto fail;
    {
        kcuda_bf16 *hb = (kcuda_bf16 *)calloc((size_t)g->Vp, sizeof *hb);
        if (!hb) {
            rc = gg_fail(g, KCUDA_ENOMEM, "gpt_gpu_create: out of host memory");
            goto fail;
        }
        for (int j = cfg->vocab; j < g->Vp; j++)
            hb[j] = to_bf16(GG_PAD_LOGIT);
        rc = h2d(g, g->head_bias, hb, (size_t)g->Vp * sizeof *hb, "upload head bias");
        free(hb);
        if (rc)
            goto fail;
    }
    for (int i = 0; i < g->nt; i++) {
        const gg_tensor *t = &g->t[i];
        sd[i].p = g->g32 + t->off;
        sd[i].n = t->n;
        ad[i].param = g->p32 + t->off;
        ad[i].param_bf16 = g->p16 + t->off;
        ad[i].grad = g->g32 + t->off;
        ad[i].m = g->m + t->off;
        ad[i].v = g->v + t->off;
        ad[i].n = t->n;
        ad[i].decay = t->decay;
    }
    if ((rc = gg_cuda(g, cudaMalloc(&g->d_sumsq_desc, (size_t)g->nt * sizeof *sd), "cudaMalloc")) ||
        (rc = gg_cuda(g, cudaMalloc(&g->d_adam_desc, (size_t)g->nt * sizeof *ad), "cudaMalloc")) ||
        (rc = h2d(g, g->d_sumsq_desc, sd, (size_t)g->nt * sizeof *sd, "upload descriptors")) ||
        (rc = h2d(g, g->d_adam_desc, ad, (size_t)g->nt * sizeof *ad, "upload descriptors")))
        goto fail;
    free(h);
    free(hi);
    free(sd);
    free(ad);
    *out = g;
    return 0;
fail:
    if (errbuf && errlen)
        snprintf(errbuf, errlen, "%s", g->msg);
    free(h);
    free(hi);
    free(sd);
    free(ad);
    gpt_gpu_free(g);
    return rc < 0 ? rc : KCUDA_ECUDA;
}

void gpt_gpu_free(gpt_gpu *g)
{
    if (!g)
        return;
    if (g->stream)
        cudaStreamSynchronize(g->stream);
    gg_prof_free(g);
    void *dev[8] = {g->arena, g->p32, g->g32, g->m, g->v, g->p16, g->d_sumsq_desc,
                    g->d_adam_desc};
    for (int i = 0; i < 8; i++)
        if (dev[i])
            cudaFree(dev[i]);
    kcuda_ctx_free(g->kc);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    free(g->t);
    free(g->L);
    free(g->n_targets);
    free(g);
}

/* ---- host copies ------------------------------------------------------------------- */

int gg_no_device(gpt_gpu *g)
{
    return g->kc ? 0 : gg_fail(g, KCUDA_EARG, "a planned model has no device state");
}

static int bad_index(gpt_gpu *g, int i)
{
    if (gg_no_device(g))
        return KCUDA_EARG;
    return i < 0 || i >= g->nt ? gg_fail(g, KCUDA_EARG, "tensor index %d out of range", i) : 0;
}

int gpt_gpu_set_param(gpt_gpu *g, int i, const float *host)
{
    int rc = bad_index(g, i);
    if (rc)
        return rc;
    const gg_tensor *t = &g->t[i];
    kcuda_bf16 *tmp = (kcuda_bf16 *)malloc(t->n * sizeof *tmp);
    if (!tmp)
        return gg_fail(g, KCUDA_ENOMEM, "out of host memory");
    for (size_t j = 0; j < t->n; j++)
        tmp[j] = to_bf16(host[j]);
    if (!(rc = h2d(g, g->p32 + t->off, host, t->n * 4, "set_param")))
        rc = h2d(g, g->p16 + t->off, tmp, t->n * 2, "set_param");
    free(tmp);
    return rc;
}

static int get(gpt_gpu *g, int i, const float *base, float *host)
{
    int rc = bad_index(g, i);
    if (rc || (rc = gg_cuda(g, cudaStreamSynchronize(g->stream), "sync")))
        return rc;
    if ((rc = gg_cuda(g, cudaMemcpyAsync(host, base + g->t[i].off, g->t[i].n * 4,
                                         cudaMemcpyDeviceToHost, g->stream), "download")))
        return rc;
    return gg_cuda(g, cudaStreamSynchronize(g->stream), "download");
}

int gpt_gpu_get_param(gpt_gpu *g, int i, float *host) { return get(g, i, g->p32, host); }
int gpt_gpu_get_grad(gpt_gpu *g, int i, float *host) { return get(g, i, g->g32, host); }

int gpt_gpu_load_batch(gpt_gpu *g, int micro, const int *tokens, const int *targets)
{
    if (gg_no_device(g))
        return KCUDA_EARG;
    if (micro < 0 || micro >= g->c.max_micro)
        return gg_fail(g, KCUDA_EARG, "micro batch %d out of range [0,%d)", micro, g->c.max_micro);
    int n = 0;
    for (int i = 0; i < g->N; i++) {
        if (tokens[i] < 0 || tokens[i] >= g->c.vocab)
            return gg_fail(g, KCUDA_EARG, "token %d at %d outside the vocabulary", tokens[i], i);
        n += targets[i] != -1;
    }
    g->n_targets[micro] = n;
    size_t bytes = (size_t)g->N * sizeof(int), off = (size_t)micro * g->N;
    int rc = h2d(g, g->ids + off, tokens, bytes, "load batch");
    return rc ? rc : h2d(g, g->tgt + off, targets, bytes, "load batch");
}
