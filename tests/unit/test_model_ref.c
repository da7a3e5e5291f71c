/* test_model_ref.c - the model's forward against a naive double-precision reference.
 *
 * The reference is written from the architecture description, not from the model's
 * code: the encoder runs in the ORIGINAL patch order with attention masks computed from
 * geometry (same window = same (image, frame, row / window, column / window) in merge
 * units; full-attention layers: same frame), 2-D RoPE from each patch's (row, column);
 * the decoder recomputes mRoPE positions with Qwen2-VL's get_rope_index loop; attention
 * is a plain masked softmax; MoE routing is a plain top-k.  The reordering into windows,
 * cu_seqlens, the inverse permutation, the image fill and the head chunking of the model
 * are therefore checked against an independent computation.
 *
 * Compared: the summed token loss (relative 3e-6: fp32 against double typically differ
 * by 1e-8 .. 2e-7), the MoE aux loss, and the projector output (image features) row by
 * row (relative L2 2e-5). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "model/model.h"
#include "support/testutil.h"
#include "test_model_util.h"

typedef struct {
    const model *m;
    const float *P;
} ref;

static const float *W(const ref *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const float *W(const ref *r, const char *fmt, ...)
{
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const model_tensor *t = model_tensor_find(r->m, name);
    return t ? r->P + t->offset : NULL;
}

static double *dalloc(size_t n) { return tu_dalloc(n ? n : 1); }

/* out[M,N] = in[M,K] w[N,K]^T + b */
static void linear(double *out, const double *in, const float *w, const float *b, int M,
                   int K, int N)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = b ? b[j] : 0;
            for (int k = 0; k < K; k++)
                s += in[(size_t)i * K + k] * w[(size_t)j * K + k];
            out[(size_t)i * N + j] = s;
        }
}

static void norm(double *out, const double *in, int M, int C, norm_kind kind, const float *w,
                 const float *b, double eps)
{
    for (int i = 0; i < M; i++) {
        const double *x = in + (size_t)i * C;
        double mu = 0, v = 0;
        if (kind == NORM_LAYERNORM) {
            for (int c = 0; c < C; c++)
                mu += x[c];
            mu /= C;
        }
        for (int c = 0; c < C; c++)
            v += (x[c] - mu) * (x[c] - mu);
        double r = 1 / sqrt(v / C + eps);
        for (int c = 0; c < C; c++)
            out[(size_t)i * C + c] = (x[c] - mu) * r * w[c] + (b ? b[c] : 0);
    }
}

static double gelu(double x, gelu_kind k)
{
    if (k == GELU_ERF)
        return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double silu(double x) { return x / (1 + exp(-x)); }

/* Rotate-half RoPE on x [N, H, D] with angles [N, D/2]. */
static void rope(double *x, const double *ang, int N, int H, int D)
{
    int h2 = D / 2;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            double *v = x + ((size_t)n * H + h) * D;
            for (int j = 0; j < h2; j++) {
                double c = cos(ang[(size_t)n * h2 + j]), s = sin(ang[(size_t)n * h2 + j]);
                double a = v[j], b = v[j + h2];
                v[j] = a * c - b * s;
                v[j + h2] = b * c + a * s;
            }
        }
}

/* Masked softmax attention: query i sees key j iff grp[i] == grp[j] (and j <= i when
 * causal). */
static void attention(double *out, const double *q, const double *k, const double *v, int N,
                      int Hq, int Hkv, int D, const long *grp, int causal)
{
    double *s = dalloc((size_t)N);
    for (int h = 0; h < Hq; h++) {
        int hk = h / (Hq / Hkv);
        for (int i = 0; i < N; i++) {
            double mx = -INFINITY;
            for (int j = 0; j < N; j++) {
                s[j] = -INFINITY;
                if (grp[j] != grp[i] || (causal && j > i))
                    continue;
                double d = 0;
                for (int c = 0; c < D; c++)
                    d += q[((size_t)i * Hq + h) * D + c] * k[((size_t)j * Hkv + hk) * D + c];
                s[j] = d / sqrt((double)D);
                if (s[j] > mx)
                    mx = s[j];
            }
            double z = 0;
            for (int j = 0; j < N; j++) {
                s[j] = s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                z += s[j];
            }
            for (int c = 0; c < D; c++) {
                double a = 0;
                for (int j = 0; j < N; j++)
                    a += s[j] * v[((size_t)j * Hkv + hk) * D + c];
                out[((size_t)i * Hq + h) * D + c] = a / z;
            }
        }
    }
    free(s);
}

/* swiglu MLP: down(silu(gate x) * up x) with fused gate|up weight [2F, H] */
static void swiglu_mlp(double *out, const double *x, const float *w1, const float *b1,
                       const float *w2, const float *b2, int N, int H, int F)
{
    double *u = dalloc((size_t)N * 2 * F), *a = dalloc((size_t)N * F);
    linear(u, x, w1, b1, N, H, 2 * F);
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++)
            a[(size_t)n * F + f] = silu(u[(size_t)n * 2 * F + f]) * u[(size_t)n * 2 * F + F + f];
    linear(out, a, w2, b2, N, F, H);
    free(u);
    free(a);
}

/* MoE MLP of one layer; returns aux. */
static double moe(const ref *r, const char *pre, double *out, const double *x, int N, int H,
                  const decoder_shape *ds)
{
    int E = ds->moe_experts, K = ds->moe_top_k, Fm = ds->moe_ffn;
    const float *wr = W(r, "%s.mlp.router.weight", pre);
    const float *w1 = W(r, "%s.mlp.experts.gate_up.weight", pre);
    const float *w2 = W(r, "%s.mlp.experts.down.weight", pre);
    double *lg = dalloc((size_t)N * E), *y = dalloc((size_t)H), *P = dalloc((size_t)E);
    double *cnt = dalloc((size_t)E);
    linear(lg, x, wr, NULL, N, H, E);
    memset(out, 0, (size_t)N * H * sizeof(double));
    for (int n = 0; n < N; n++) {
        double *p = lg + (size_t)n * E, mx = -INFINITY, z = 0;
        for (int e = 0; e < E; e++)
            mx = fmax(mx, p[e]);
        for (int e = 0; e < E; e++)
            z += (p[e] = exp(p[e] - mx));
        for (int e = 0; e < E; e++) {
            p[e] /= z;
            P[e] += p[e] / N;
        }
        int sel[16];
        double ws = 0;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int used = 0;
                for (int q = 0; q < j; q++)
                    used |= sel[q] == e;
                if (!used && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            sel[j] = best;
            ws += p[best];
            cnt[best] += 1.0 / N;
        }
        for (int j = 0; j < K; j++) {
            int e = sel[j];
            swiglu_mlp(y, x + (size_t)n * H, w1 + (size_t)e * 2 * Fm * H, NULL,
                       w2 + (size_t)e * H * Fm, NULL, 1, H, Fm);
            for (int c = 0; c < H; c++)
                out[(size_t)n * H + c] += p[e] / ws * y[c];
        }
    }
    if (ds->moe_shared_ffn > 0) {
        double *ys = dalloc((size_t)N * H);
        swiglu_mlp(ys, x, W(r, "%s.mlp.shared.gate_up.weight", pre), NULL,
                   W(r, "%s.mlp.shared.down.weight", pre), NULL, N, H, ds->moe_shared_ffn);
        for (size_t i = 0; i < (size_t)N * H; i++)
            out[i] += ys[i];
        free(ys);
    }
    double aux = 0;
    for (int e = 0; e < E; e++)
        aux += cnt[e] * P[e];
    free(lg);
    free(y);
    free(P);
    free(cnt);
    return aux * E;
}

/* One block on x [N, H] in place; returns the MoE aux loss (0 when dense). */
static double ref_block(const ref *r, const char *comp, int l, const stack_shape *s, double *x,
                    int N, const double *ang, const long *grp, int causal, int is_moe,
                    const decoder_shape *ds)
{
    char pre[64];
    snprintf(pre, sizeof pre, "%s.layers.%d", comp, l);
    int H = s->hidden, Hq = s->heads, Hkv = s->kv_heads, D = s->head_dim;
    int QKV = (Hq + 2 * Hkv) * D;
    double *h = dalloc((size_t)N * H), *qkv = dalloc((size_t)N * QKV);
    double *q = dalloc((size_t)N * Hq * D), *k = dalloc((size_t)N * Hkv * D);
    double *v = dalloc((size_t)N * Hkv * D), *att = dalloc((size_t)N * Hq * D);
    double *o = dalloc((size_t)N * H);
    norm(h, x, N, H, s->norm, W(r, "%s.attn_norm.weight", pre), W(r, "%s.attn_norm.bias", pre),
         s->norm_eps);
    linear(qkv, h, W(r, "%s.attn.qkv.weight", pre), W(r, "%s.attn.qkv.bias", pre), N, H, QKV);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < QKV; c++) {
            double val = qkv[(size_t)n * QKV + c];
            if (c < Hq * D)
                q[(size_t)n * Hq * D + c] = val;
            else if (c < (Hq + Hkv) * D)
                k[(size_t)n * Hkv * D + c - Hq * D] = val;
            else
                v[(size_t)n * Hkv * D + c - (Hq + Hkv) * D] = val;
        }
    if (s->qk_norm) {
        double *t = dalloc((size_t)N * Hq * D);
        norm(t, q, N * Hq, D, NORM_RMSNORM, W(r, "%s.attn.q_norm.weight", pre), NULL,
             s->norm_eps);
        memcpy(q, t, (size_t)N * Hq * D * sizeof(double));
        norm(t, k, N * Hkv, D, NORM_RMSNORM, W(r, "%s.attn.k_norm.weight", pre), NULL,
             s->norm_eps);
        memcpy(k, t, (size_t)N * Hkv * D * sizeof(double));
        free(t);
    }
    if (ang) {
        rope(q, ang, N, Hq, D);
        rope(k, ang, N, Hkv, D);
    }
    attention(att, q, k, v, N, Hq, Hkv, D, grp, causal);
    linear(o, att, W(r, "%s.attn.proj.weight", pre), W(r, "%s.attn.proj.bias", pre), N,
           Hq * D, H);
    for (size_t i = 0; i < (size_t)N * H; i++)
        x[i] += o[i];
    norm(h, x, N, H, s->norm, W(r, "%s.mlp_norm.weight", pre), W(r, "%s.mlp_norm.bias", pre),
         s->norm_eps);
    double aux = 0;
    if (is_moe) {
        aux = moe(r, pre, o, h, N, H, ds);
    } else if (s->mlp == MLP_SWIGLU) {
        swiglu_mlp(o, h, W(r, "%s.mlp.gate_up.weight", pre), W(r, "%s.mlp.gate_up.bias", pre),
                   W(r, "%s.mlp.down.weight", pre), W(r, "%s.mlp.down.bias", pre), N, H,
                   s->ffn);
    } else {
        double *u = dalloc((size_t)N * s->ffn);
        linear(u, h, W(r, "%s.mlp.fc1.weight", pre), W(r, "%s.mlp.fc1.bias", pre), N, H,
               s->ffn);
        for (size_t i = 0; i < (size_t)N * s->ffn; i++)
            u[i] = gelu(u[i], s->gelu);
        linear(o, u, W(r, "%s.mlp.fc2.weight", pre), W(r, "%s.mlp.fc2.bias", pre), N, s->ffn,
               H);
        free(u);
    }
    for (size_t i = 0; i < (size_t)N * H; i++)
        x[i] += o[i];
    free(h);
    free(qkv);
    free(q);
    free(k);
    free(v);
    free(att);
    free(o);
    return aux;
}

/* Encoder + projector in the original order: feat [units, decoder hidden]. */
static double *ref_encoder(const ref *r, const model_shape *sh, const vlm_batch *b, int *units)
{
    const encoder_shape *e = &sh->encoder;
    int m = e->spatial_merge, m2 = m * m, H = e->s.hidden, D = e->s.head_dim;
    int pd = e->in_channels * e->temporal_patch * e->patch * e->patch;
    int ws = e->window_px ? e->window_px / e->patch / m : 0;
    int P = 0;
    for (int i = 0; i < b->n_images; i++)
        P += b->grid_thw[3 * i] * b->grid_thw[3 * i + 1] * b->grid_thw[3 * i + 2];
    long *win = calloc((size_t)P, sizeof(long)), *frame = calloc((size_t)P, sizeof(long));
    double *ang = dalloc((size_t)P * D / 2);
    int p = 0;
    for (int i = 0; i < b->n_images; i++) {
        const int *g = b->grid_thw + 3 * i;
        for (int t = 0; t < g[0]; t++)
            for (int hb = 0; hb < g[1] / m; hb++)
                for (int wb = 0; wb < g[2] / m; wb++)
                    for (int mh = 0; mh < m; mh++)
                        for (int mw = 0; mw < m; mw++, p++) {
                            int row = hb * m + mh, col = wb * m + mw;
                            frame[p] = (long)i * 1000 + t;
                            win[p] = ws ? ((frame[p] * 1000 + hb / ws) * 1000 + wb / ws)
                                        : frame[p];
                            for (int j = 0; j < D / 4; j++) {
                                double f = pow(e->s.rope_theta, -2.0 * j / (D / 2));
                                ang[(size_t)p * D / 2 + j] = row * f;
                                ang[(size_t)p * D / 2 + D / 4 + j] = col * f;
                            }
                        }
    }
    double *x = dalloc((size_t)P * H), *pix = dalloc((size_t)P * pd);
    for (size_t i = 0; i < (size_t)P * pd; i++)
        pix[i] = b->pixels[i];
    linear(x, pix, W(r, "encoder.patch_embed.weight"), NULL, P, pd, H);
    for (int l = 0; l < e->s.layers; l++) {
        int full = ws == 0;
        for (int j = 0; j < e->n_full_attn; j++)
            full |= e->full_attn[j] == l;
        ref_block(r, "encoder", l, &e->s, x, P, ang, full ? frame : win, 0, 0, NULL);
    }
    /* projector: norm per patch, merge^2 consecutive patches, fc1, gelu, fc2 */
    const projector_shape *pj = &sh->projector;
    int U = P / m2, Hd = sh->decoder.s.hidden;
    double *hn = dalloc((size_t)P * H), *f1 = dalloc((size_t)U * pj->hidden);
    double *feat = dalloc((size_t)U * Hd);
    norm(hn, x, P, H, pj->norm, W(r, "projector.norm.weight"), W(r, "projector.norm.bias"),
         pj->norm_eps);
    linear(f1, hn, W(r, "projector.fc1.weight"), W(r, "projector.fc1.bias"), U, m2 * H,
           pj->hidden);
    for (size_t i = 0; i < (size_t)U * pj->hidden; i++)
        f1[i] = gelu(f1[i], pj->gelu);
    linear(feat, f1, W(r, "projector.fc2.weight"), W(r, "projector.fc2.bias"), U, pj->hidden,
           Hd);
    free(win);
    free(frame);
    free(ang);
    free(x);
    free(pix);
    free(hn);
    free(f1);
    *units = U;
    return feat;
}

/* Qwen2-VL get_rope_index for one sequence, written as HF's loop: find the next image
 * token, text run before it, the image block, and the tail. */
static void ref_mrope(int *t, int *h, int *w, const int *tok, int S, int img,
                      const int *grid, int merge, int *cursor)
{
    int st = 0, n = 0, last_max = -1;
    for (;;) {
        int ed = st;
        while (ed < S && tok[ed] != img)
            ed++;
        if (ed >= S)
            break;
        const int *g = grid + 3 * (*cursor)++;
        int gt = g[0], gh = g[1] / merge, gw = g[2] / merge;
        int st_idx = last_max + 1, text_len = ed - st;
        for (int i = 0; i < text_len; i++, n++)
            t[n] = h[n] = w[n] = st_idx + i;
        last_max = st_idx + text_len - 1;
        for (int a = 0; a < gt; a++)
            for (int bb = 0; bb < gh; bb++)
                for (int c = 0; c < gw; c++, n++) {
                    t[n] = a + text_len + st_idx;
                    h[n] = bb + text_len + st_idx;
                    w[n] = c + text_len + st_idx;
                    if (t[n] > last_max)
                        last_max = t[n];
                    if (h[n] > last_max)
                        last_max = h[n];
                    if (w[n] > last_max)
                        last_max = w[n];
                }
        st = ed + gt * gh * gw;
    }
    for (int i = 0; st + i < S; i++, n++)
        t[n] = h[n] = w[n] = last_max + 1 + i;
}

typedef struct {
    double loss, aux;
    double *feat;
    int units;
} ref_out;

static ref_out ref_forward(const model *m, const model_shape *sh, const vlm_batch *b)
{
    ref r = { m, model_params((model *)m) };
    ref_out out = { 0 };
    const decoder_shape *ds = &sh->decoder;
    const stack_shape *s = &ds->s;
    if (sh->encoder.present && b->n_images > 0)
        out.feat = ref_encoder(&r, sh, b, &out.units);
    int S = b->seq_len, N = b->n_seq * S, H = s->hidden, D = s->head_dim, V = ds->vocab;
    int img = sh->encoder.present ? ds->image_token_id : -1;
    double *x = dalloc((size_t)N * H);
    const float *emb = W(&r, "decoder.embed.weight"), *pe = W(&r, "decoder.pos_embed.weight");
    for (int i = 0, k = 0; i < N; i++)
        for (int c = 0; c < H; c++) {
            double v = b->tokens[i] == img ? out.feat[(size_t)k * H + c]
                                           : emb[(size_t)b->tokens[i] * H + c];
            if (pe)
                v += pe[(size_t)(i % S) * H + c];
            x[(size_t)i * H + c] = v;
            if (c == H - 1 && b->tokens[i] == img)
                k++;
        }
    double *ang = NULL;
    if (s->pos == POS_ROPE || s->pos == POS_MROPE) {
        ang = dalloc((size_t)N * D / 2);
        int *pt = tu_ialloc((size_t)S), *ph = tu_ialloc((size_t)S), *pw = tu_ialloc((size_t)S);
        int cursor = 0;
        for (int q = 0; q < b->n_seq; q++) {
            if (s->pos == POS_MROPE) {
                ref_mrope(pt, ph, pw, b->tokens + (size_t)q * S, S, img, b->grid_thw,
                          sh->encoder.present ? sh->encoder.spatial_merge : 1, &cursor);
            } else {
                for (int i = 0; i < S; i++)
                    pt[i] = ph[i] = pw[i] = i;
            }
            for (int i = 0; i < S; i++)
                for (int j = 0; j < D / 2; j++) {
                    const int *sec = s->mrope_section;
                    int pos = s->pos == POS_ROPE ? pt[i]
                              : j < sec[0]          ? pt[i]
                              : j < sec[0] + sec[1] ? ph[i]
                                                    : pw[i];
                    ang[((size_t)q * S + i) * D / 2 + j] = pos * pow(s->rope_theta, -2.0 * j / D);
                }
        }
        free(pt);
        free(ph);
        free(pw);
    }
    long *grp = calloc((size_t)N, sizeof(long));
    for (int i = 0; i < N; i++)
        grp[i] = i / S;
    for (int l = 0; l < s->layers; l++) {
        int is_moe = ds->moe_experts > 0 && l % ds->moe_every == ds->moe_every - 1;
        out.aux += ref_block(&r, "decoder", l, s, x, N, ang, grp, 1, is_moe, ds);
    }
    double *hf = dalloc((size_t)N * H), *lg = dalloc((size_t)V);
    norm(hf, x, N, H, s->norm, W(&r, "decoder.final_norm.weight"),
         W(&r, "decoder.final_norm.bias"), s->norm_eps);
    const float *head = ds->tied_embeddings ? emb : W(&r, "decoder.lm_head.weight");
    for (int i = 0; i < N; i++) {
        int y = b->targets[i];
        if (y == -1)
            continue;
        linear(lg, hf + (size_t)i * H, head, NULL, 1, H, V);
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, lg[v]);
        for (int v = 0; v < V; v++)
            z += exp(lg[v] - mx);
        out.loss += mx + log(z) - lg[y];
    }
    free(x);
    free(ang);
    free(grp);
    free(hf);
    free(lg);
    return out;
}

static void compare(const model_shape *sh, int n_seq, int seq_len, int n_images,
                    const int *grids, const int *img_seq)
{
    tu_rng rng = tu_rng_fresh();
    tm_batch tb;
    tm_make_batch(&tb, sh, &rng, n_seq, seq_len, n_images, grids, img_seq);
    model *m;
    hearth_err err;
    if (model_create(&m, sh, tu_next(&rng), &err))
        fail_msg("model_create: %s", err.msg);
    tm_randomize_params(m, &rng);
    model_stats st;
    if (model_forward(m, &tb.b, &st, &err))
        fail_msg("model_forward: %s", err.msg);
    ref_out ro = ref_forward(m, sh, &tb.b);

    if (getenv("HEARTH_TEST_VERBOSE"))
        printf("# %s: loss %.9g reference %.9g (rel %.2g), aux %.9g reference %.9g\n",
               sh->name, st.loss_sum, ro.loss, fabs(st.loss_sum - ro.loss) / fabs(ro.loss),
               st.aux_loss, ro.aux);
    char what[128];
    snprintf(what, sizeof what, "%s: loss %.9g vs reference %.9g, rel diff", sh->name,
             st.loss_sum, ro.loss);
    TU_ASSERT_LE(fabs(st.loss_sum - ro.loss) / fabs(ro.loss), 3e-6, &rng, what);
    snprintf(what, sizeof what, "%s: aux %.9g vs reference %.9g, diff", sh->name, st.aux_loss,
             ro.aux);
    TU_ASSERT_LE(fabs(st.aux_loss - ro.aux), 1e-5 * (1 + fabs(ro.aux)), &rng, what);
    if (n_images) {
        assert_int_equal(m->enc.n_units, ro.units);
        int Hd = sh->decoder.s.hidden;
        for (int u = 0; u < ro.units; u++) {
            double e = tu_rel_l2(m->img_feat + (size_t)u * Hd, ro.feat + (size_t)u * Hd,
                                 (size_t)Hd);
            snprintf(what, sizeof what, "%s: image token %d, rel L2 error", sh->name, u);
            TU_ASSERT_LE(e, 2e-5, &rng, what);
        }
    }
    free(ro.feat);
    model_free(m);
    tm_free_batch(&tb);
}

static void test_ref_gpt2(void **state)
{
    (void)state;
    model_shape sh = tm_shape_gpt2();
    compare(&sh, 2, 13, 0, NULL, NULL);
}

static void test_ref_vlm(void **state)
{
    (void)state;
    model_shape sh = tm_shape_vlm();
    static const int grids[] = { 1, 6, 10, 2, 4, 4, 1, 2, 2, 1, 10, 6 };
    static const int seqs[] = { 0, 0, 1, 2 };
    compare(&sh, 3, 32, 4, grids, seqs);
}

static void test_ref_vlm_no_window(void **state)
{
    (void)state;
    model_shape sh = tm_shape_vlm();
    sh.encoder.window_px = 0;
    sh.decoder.s.pos = POS_ROPE;
    static const int grids[] = { 1, 4, 6, 2, 2, 2 };
    static const int seqs[] = { 0, 1 };
    compare(&sh, 2, 16, 2, grids, seqs);
}

static void test_ref_vlm_moe(void **state)
{
    (void)state;
    model_shape sh = tm_shape_vlm_moe();
    static const int grids[] = { 1, 4, 6, 2, 2, 4, 1, 2, 2 };
    static const int seqs[] = { 0, 1, 1 };
    compare(&sh, 2, 24, 3, grids, seqs);
}

static void test_ref_presets(void **state)
{
    (void)state;
    static const char *names[] = { "tiny-vlm", "tiny-vlm-moe" };
    for (int i = 0; i < 2; i++) {
        model_shape sh;
        hearth_err err;
        if (preset_load(&sh, names[i], &err))
            fail_msg("preset %s: %s", names[i], err.msg);
        /* 16-patch window side 2 units: 6x10 patches has 2x3 windows of unequal sizes */
        static const int grids[] = { 1, 6, 10, 2, 4, 4 };
        static const int seqs[] = { 0, 1 };
        compare(&sh, 2, 20, 2, grids, seqs);
    }
}

int main(void)
{
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_gpt2),
        cmocka_unit_test(test_ref_vlm),
        cmocka_unit_test(test_ref_vlm_no_window),
        cmocka_unit_test(test_ref_vlm_moe),
        cmocka_unit_test(test_ref_presets),
    };
    return cmocka_run_group_tests_name("model_ref", tests, NULL, NULL);
}
