/* block.c - one pre-norm transformer block, forward and backward, and a stack of them.
 *
 * The same code serves the ViT encoder and the decoder; a stack_cfg (derived from the
 * stack_shape) and the per-call stack_ctx (sequence boundaries, RoPE tables) say what
 * differs.  One block:
 *
 *   h1  = norm1(x)
 *   qkv = h1 Wqkv^T (+ b)             rows of Wqkv: q heads, then k heads, then v heads
 *   q,k = qk_norm(q), qk_norm(k)      (Qwen3; RMSNorm over head_dim, one weight per stack)
 *   q,k = rope(q), rope(k)            (tables from the context; none for learned positions)
 *   att = attention(q, k, v)          varlen over ctx->cu (or ctx->cu_full), GQA, causal?
 *   x1  = x + att Wproj^T (+ b)
 *   h2  = norm2(x1)
 *   out = x1 + mlp(h2)                swiglu: down(silu(gate) * up); gelu: fc2(gelu(fc1));
 *                                     or the MoE MLP (moe.c)
 *
 * Backward keeps one residual-gradient buffer (sc.dres) and adds each branch's input
 * gradient into it through the norms' backward (which accumulate), so the residual
 * additions cost nothing.
 *
 * Split stacks (model_par.h).  Under tensor parallelism each rank owns whole heads and
 * whole MLP columns, so attention and the activation need no communication: qkv and
 * gate_up/fc1 are column-parallel (their input is replicated, their output local), and
 * proj and down/fc2 are row-parallel (their output is a partial sum, reduced once per
 * half-block).  Row-parallel biases are added after the reduction, or the sum would
 * count them tp times.  In the backward the roles swap: the input gradient of a
 * column-parallel linear is the partial sum.  Sequence parallelism keeps the residual
 * stream and the norms on N/tp rows per rank: the reduction becomes a reduce-scatter and
 * the norm output is all-gathered before the column-parallel linears (the same volume
 * as the allreduce, with the norm work and residual memory divided by tp).  The MoE MLP
 * is not split by tp (moe.c): it sees the gathered N rows and keeps its own rows.
 *
 * Nodes.  A block runs as up to four nodes (internal.h, stack_forward_pair): a dense
 * block is one, a MoE block four, cut where its all_to_allvs start, so that two micro
 * batches can be interleaved (parallel.a2a_overlap).  stack_forward and stack_backward
 * run the nodes of one micro batch in order, which is the same arithmetic. */
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

void norm_forward(kdev *dev, norm_kind kind, float *out, float *mean, float *rstd,
                  const float *inp, const float *w, const float *b, int N, int C, float eps)
{
    if (kind == NORM_LAYERNORM)
        kdev_layernorm_forward(dev, out, mean, rstd, inp, w, b, N, C, eps);
    else
        kdev_rmsnorm_forward(dev, out, rstd, inp, w, N, C, eps);
}

void norm_backward(kdev *dev, norm_kind kind, float *dinp, float *dw, float *db,
                   const float *dout, const float *inp, const float *w, const float *mean,
                   const float *rstd, int N, int C)
{
    if (kind == NORM_LAYERNORM)
        kdev_layernorm_backward(dev, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    else
        kdev_rmsnorm_backward(dev, dinp, dw, dout, inp, w, rstd, N, C);
}

static void zero(kdev *dev, float *x, size_t n)
{
    kdev_zero(dev, x, n * sizeof *x);
}

void stack_cfg_init(stack_cfg *c, kdev *dev, const stack_shape *s, int causal, int E, int K,
                    int Fm, int Fs)
{
    memset(c, 0, sizeof *c);
    c->s = s;
    c->dev = dev;
    c->H = s->hidden;
    c->Hq = s->heads;
    c->Hkv = s->kv_heads;
    c->D = s->head_dim;
    c->QD = c->Hq * c->D;
    c->KD = c->Hkv * c->D;
    c->QKV = c->QD + 2 * c->KD;
    c->F = s->ffn;
    c->Fu = s->mlp == MLP_SWIGLU ? 2 * s->ffn : s->ffn;
    c->E = E;
    c->K = K;
    c->Fm = Fm;
    c->Fs = Fs;
    c->rope = s->pos == POS_ROPE || s->pos == POS_MROPE || s->pos == POS_ROPE2D;
    c->causal = causal;
    c->gelu = s->gelu == GELU_ERF ? KGELU_ERF : KGELU_TANH;
    c->tp = 1;
    c->Hq_full = c->Hq;
    c->Hkv_full = c->Hkv;
    c->F_full = c->F;
    c->kv_rep = 1;
    c->ep = 1;
    c->El = E;
}

int stack_cfg_split(stack_cfg *c, const char *comp, int tp, int t, int ep, int e,
                    hearth_err *err)
{
    int Hq = c->Hq_full, Hkv = c->Hkv_full, F = c->F_full;
    if (tp < 1 || t < 0 || t >= tp || ep < 1 || e < 0 || e >= ep)
        return herr_set(err, HERR_CONFIG, "%s: bad split tp %d rank %d, ep %d rank %d", comp,
                        tp, t, ep, e);
    if (Hq % tp)
        return herr_set(err, HERR_CONFIG, "%s.heads %d is not divisible by tp %d", comp, Hq,
                        tp);
    if (tp <= Hkv ? Hkv % tp : tp % Hkv)
        return herr_set(err, HERR_CONFIG, "%s.kv_heads %d and tp %d: one must divide the "
                        "other", comp, Hkv, tp);
    if (F % tp)
        return herr_set(err, HERR_CONFIG, "%s.ffn %d is not divisible by tp %d", comp, F, tp);
    if (c->E % ep)
        return herr_set(err, HERR_CONFIG, "%s.moe.experts %d is not divisible by ep %d", comp,
                        c->E, ep);
    c->tp = tp;
    c->t = t;
    c->Hq = Hq / tp;
    c->q0 = t * c->Hq;
    if (tp <= Hkv) {
        c->Hkv = Hkv / tp;
        c->kv0 = t * c->Hkv;
        c->kv_rep = 1;
    } else {
        c->Hkv = 1;
        c->kv0 = t * Hkv / tp;
        c->kv_rep = tp / Hkv;
    }
    c->QD = c->Hq * c->D;
    c->KD = c->Hkv * c->D;
    c->QKV = c->QD + 2 * c->KD;
    c->F = F / tp;
    c->Fu = c->s->mlp == MLP_SWIGLU ? 2 * c->F : c->F;
    c->ep = ep;
    c->El = c->E / ep;
    c->E0 = e * c->El;
    return 0;
}

int stack_init(stack *st, const stack_cfg *c, int layers, hearth_err *err)
{
    memset(st, 0, sizeof *st);
    st->c = *c;
    st->L = layers;
    st->layers = calloc(layers > 0 ? (size_t)layers : 1, sizeof *st->layers);
    st->xs = calloc((size_t)layers + 1, sizeof *st->xs);
    if (!st->layers || !st->xs)
        return herr_set(err, HERR_NOMEM, "model: out of memory for %d layers", layers);
    return 0;
}

static void release_arenas(stack *st)
{
    kdev *dev = st->c.dev;
    kdev_release(dev, st->fbuf);
    kdev_release(dev, st->abuf);
    kdev_release(dev, st->ibuf);
    free(st->ibuf_h);
    st->fbuf = NULL;
    st->abuf = NULL;
    st->ibuf = NULL;
    st->ibuf_h = NULL;
    st->cap = 0;
}

void stack_free(stack *st)
{
    if (!st)
        return;
    kdev *dev = st->c.dev;
    for (int l = 0; st->layers && l < st->L; l++)
        kdev_release(dev, st->layers[l].ep_buf);
    kdev_release(dev, st->sc.ep_buf);
    kdev_release(dev, st->sc.aux_d);
    free(st->layers);
    free(st->xs);
    release_arenas(st);
    memset(st, 0, sizeof *st);
}

/* ---- tensor / sequence parallel plumbing -------------------------------------------- */

static int tp_on(const stack *st)
{
    return st->tp_comm && st->c.tp > 1;
}

static int sp_on(const stack *st)
{
    return st->sp && tp_on(st);
}

/* Tokens of this rank's residual stream for a micro batch of N. */
static int local_tokens(const stack *st, int N)
{
    return sp_on(st) ? N / st->c.tp : N;
}

/* This rank's rows of an [N, C] buffer: its slice under sp, else all of it. */
static float *own_rows(const stack *st, float *full, int Nl, int C)
{
    return sp_on(st) ? full + (size_t)st->c.t * Nl * C : full;
}

/* Under sp: full [N, C] gets every rank's Nl rows, this rank's from loc (which may be
 * own_rows(full)).  Else the rows are all here: *out = loc. */
static int rows_gather(stack *st, const float *loc, float *full, int Nl, int C,
                       const float **out, hearth_err *err)
{
    *out = loc;
    if (!sp_on(st))
        return 0;
    *out = full;
    return comm_all_gather(st->tp_comm, loc, full, (size_t)Nl * C, COMM_F32, err);
}

/* Partial sums [N, C] over tp -> own_rows(full) holds this rank's summed rows. */
static int rows_reduce(stack *st, float *full, int N, int Nl, int C, hearth_err *err)
{
    if (!tp_on(st))
        return 0;
    if (st->sp)
        return comm_reduce_scatter(st->tp_comm, full, own_rows(st, full, Nl, C),
                                   (size_t)Nl * C, COMM_F32, COMM_SUM, err);
    return comm_allreduce(st->tp_comm, full, full, (size_t)N * C, COMM_F32, COMM_SUM, err);
}

/* Row-parallel linear: own_rows(out) = inp [N, K] . w^T summed over tp, + bias once. */
static int row_linear_forward(stack *st, fp8_layer *f8, int kind, float *out,
                              const float *inp, const float *w, const float *bias, int N,
                              int Nl, int K, int M, hearth_err *err)
{
    int rc = fp8_linear_forward(st->c.dev, f8, kind, 0, N, out, inp, w, tp_on(st) ? NULL : bias, N, K,
                                M, err);
    if (rc || !tp_on(st))
        return rc;
    rc = rows_reduce(st, out, N, Nl, M, err);
    if (rc || !bias)
        return rc;
    kdev_add_bias(st->c.dev, own_rows(st, out, Nl, M), bias, Nl, M);
    return 0;
}

/* out [Nl, M] = res + this rank's rows of the row-parallel linear: one GEMM with the
 * residual in its epilogue where the linear is one rank's and not FP8 (bitwise the two
 * steps on the cpu), else the linear into sc.tmp and an add. */
static int residual_linear_forward(stack *st, fp8_layer *f8, int kind, float *out,
                                   const float *res, const float *inp, const float *w,
                                   const float *bias, int N, int Nl, int K, int M,
                                   hearth_err *err)
{
    kdev *dev = st->c.dev;
    if (!tp_on(st) && !fp8_linear_uses(f8, kind, N)) {
        kdev_matmul_forward_residual(dev, out, res, inp, w, bias, N, K, M);
        return 0;
    }
    float *tmp = st->sc.tmp;
    int rc = row_linear_forward(st, f8, kind, tmp, inp, w, bias, N, Nl, K, M, err);
    if (!rc)
        kdev_add(dev, out, res, own_rows(st, tmp, Nl, M), (size_t)Nl * M);
    return rc;
}

/* Its backward from dy [Nl, M] (this rank's rows of the output gradient): dinp [N, K]
 * written, dw, db accumulated.  Under sp the bias sees only the local rows (a partial gradient,
 * summed over tp by the caller of the stack). */
static int row_linear_backward(stack *st, fp8_layer *f8, int kind, float *dinp, float *dw,
                               float *db, const float *dy, const float *inp, const float *w,
                               int N, int Nl, int K, int M, hearth_err *err)
{
    const float *dyf;
    int rc = rows_gather(st, dy, st->sc.dgat, Nl, M, &dyf, err);
    if (rc)
        return rc;
    if (!sp_on(st))
        return fp8_linear_backward_set(st->c.dev, f8, kind, 0, dinp, dw, db, dyf, inp, w, N, K,
                                       M, err);
    if ((rc = fp8_linear_backward_set(st->c.dev, f8, kind, 0, dinp, dw, NULL, dyf, inp, w, N,
                                      K, M, err)))
        return rc;
    kdev_matmul_backward(st->c.dev, NULL, NULL, db, dy, NULL, NULL, Nl, K, M);
    return 0;
}

/* ---- buffers -------------------------------------------------------------------------
 * Residual-stream buffers (xs, x1, norm statistics, dres) hold Nl rows; norm outputs
 * (gathered in place under sp) and everything after them hold N. */

/* Carves every activation and scratch buffer for N tokens, Nl of them local (see
 * farena). */
/* Activations that recomputation rebuilds in the backward are carved once and shared by
 * every layer (the layer being recomputed owns them meanwhile): with `selective` the
 * norm outputs and the dense MLP activation, with `full` everything a layer keeps except
 * its input (st->xs) and the MoE routing and expert rows.  The arena is then one layer's
 * set instead of L. */
enum {
    SH_H1, SH_MEAN1, SH_RSTD1, SH_QR, SH_KR, SH_QRS, SH_KRS, SH_Q, SH_K, SH_V, SH_ATT,
    SH_LSE, SH_X1, SH_H2, SH_MEAN2, SH_RSTD2, SH_U, SH_A, SH_COUNT
};
/* Scratch in activation memory (stack.act bits past the SH_ ones): du and da, the
 * activation's input and output gradients; datt; the qkv linear's output and dq, dk, dv
 * with their merge dqkv (a buffer of its own only where the activation type is narrower
 * than fp32; else sc.qkv serves, as without). */
enum { ACT_DU = SH_COUNT, ACT_DA, ACT_DATT, ACT_QKV };

typedef struct {
    farena *fa;
    aarena *aa;
    unsigned act;               /* bit SH_x: buffer x lies in activation memory (aa) */
    unsigned share;             /* bit SH_x: buffer x is shared */
    unsigned taken;             /* bit SH_x: the shared buffer x is carved (buf[x]) */
    float *buf[SH_COUNT];       /* NULL in the sizing pass */
} layer_take;

static unsigned recompute_shared(int recompute)
{
    if (recompute == RECOMPUTE_FULL)
        return (1u << SH_COUNT) - 1;
    if (recompute == RECOMPUTE_SELECTIVE)
        return 1u << SH_H1 | 1u << SH_H2 | 1u << SH_A;
    return 0;
}

/* n elements from the arena of buffer `which` (an SH_ or ACT_ bit of lt->act). */
static float *carve(layer_take *lt, int which, size_t n)
{
    return lt->act >> which & 1u ? aa_take(lt->aa, n) : fa_take(lt->fa, n);
}

static float *take(layer_take *lt, int which, size_t n)
{
    if (!(lt->share >> which & 1u))
        return carve(lt, which, n);
    if (!(lt->taken >> which & 1u)) {
        lt->buf[which] = carve(lt, which, n);
        lt->taken |= 1u << which;
    }
    return lt->buf[which];
}

/* Column i of the first row of a buffer whose act bit is `which`: in elements of
 * activation memory where it lies there, else floats. */
static float *col_at(const stack *st, int which, float *p, size_t i)
{
    return st->act >> which & 1u ? kdev_act_at(st->c.dev, p, i) : p + i;
}

static void stack_take(stack *st, farena *fa, aarena *aa, iarena *ia, iarena *ih, int N,
                       int Nl)
{
    const stack_cfg *c = &st->c;
    size_t n = (size_t)N, nl = (size_t)Nl;
    int qkn = c->s->qk_norm;
    int any_moe = 0, any_dense = 0;
    layer_take lt = { .fa = fa, .aa = aa, .act = st->act,
                      .share = recompute_shared(c->s->recompute) };

    for (int l = 0; l <= st->L; l++)
        st->xs[l] = fa_take(fa, nl * c->H);
    for (int l = 0; l < st->L; l++) {
        block *b = &st->layers[l];
        b->h1 = take(&lt, SH_H1, n * c->H);
        b->mean1 = take(&lt, SH_MEAN1, nl);
        b->rstd1 = take(&lt, SH_RSTD1, nl);
        b->qr = qkn ? take(&lt, SH_QR, n * c->QD) : NULL;
        b->kr = qkn ? take(&lt, SH_KR, n * c->KD) : NULL;
        b->qrs = qkn ? take(&lt, SH_QRS, n * c->Hq) : NULL;
        b->krs = qkn ? take(&lt, SH_KRS, n * c->Hkv) : NULL;
        if (st->qkv_rows) {   /* q, k, v: the column blocks of the layer's qkv rows */
            b->q = take(&lt, SH_Q, n * c->QKV);
            b->k = b->q ? col_at(st, SH_Q, b->q, (size_t)c->QD) : NULL;
            b->v = b->q ? col_at(st, SH_Q, b->q, (size_t)(c->QD + c->KD)) : NULL;
        } else {
            b->q = take(&lt, SH_Q, n * c->QD);
            b->k = take(&lt, SH_K, n * c->KD);
            b->v = take(&lt, SH_V, n * c->KD);
        }
        b->att = take(&lt, SH_ATT, n * c->QD);
        b->lse = take(&lt, SH_LSE, n * c->Hq);
        b->x1 = take(&lt, SH_X1, nl * c->H);
        b->h2 = take(&lt, SH_H2, n * c->H);
        b->mean2 = take(&lt, SH_MEAN2, nl);
        b->rstd2 = take(&lt, SH_RSTD2, nl);
        if (b->moe) {
            moe_take(c, b, fa, ia, ih, N);
            any_moe = 1;
        } else {
            b->u = take(&lt, SH_U, n * c->Fu);
            b->a = take(&lt, SH_A, n * c->F);
            any_dense = 1;
        }
    }

    stack_scratch *sc = &st->sc;
    float *ep_buf = sc->ep_buf, *aux_d = sc->aux_d;     /* owned, outlive the carving */
    size_t ep_cap = sc->ep_cap;
    memset(sc, 0, sizeof *sc);
    sc->ep_buf = ep_buf;
    sc->ep_cap = ep_cap;
    sc->aux_d = aux_d;
    if (st->qkv_rows) {   /* the linear writes the layer's rows; dq, dk, dv lie in dqkv */
        sc->dqkv = carve(&lt, ACT_QKV, n * c->QKV);
        sc->tmp = fa_take(fa, n * c->H);
        sc->dq = sc->dqkv;
        sc->dk = sc->dqkv ? col_at(st, ACT_QKV, sc->dqkv, (size_t)c->QD) : NULL;
        sc->dv = sc->dqkv ? col_at(st, ACT_QKV, sc->dqkv, (size_t)(c->QD + c->KD)) : NULL;
    } else {
        sc->qkv = carve(&lt, ACT_QKV, n * c->QKV);
        sc->tmp = fa_take(fa, n * c->H);
        sc->dq = carve(&lt, ACT_QKV, n * c->QD);
        sc->dk = carve(&lt, ACT_QKV, n * c->KD);
        sc->dv = carve(&lt, ACT_QKV, n * c->KD);
        sc->dqkv = (st->act >> ACT_QKV & 1u) && aa->esz < sizeof(float)
                       ? aa_take(aa, n * c->QKV) : sc->qkv;
    }
    sc->dqr = qkn ? fa_take(fa, n * c->QD) : NULL;
    sc->dkr = qkn ? fa_take(fa, n * c->KD) : NULL;
    sc->datt = carve(&lt, ACT_DATT, n * c->QD);
    /* du/da serve the dense MLP and the MoE shared expert. */
    size_t wu = 0, wa = 0;
    if (any_dense) {
        wu = (size_t)c->Fu;
        wa = (size_t)c->F;
    }
    if (any_moe && c->Fs > 0) {
        if ((size_t)2 * c->Fs > wu)
            wu = (size_t)2 * c->Fs;
        if ((size_t)c->Fs > wa)
            wa = (size_t)c->Fs;
    }
    sc->du = carve(&lt, ACT_DU, n * wu);
    sc->da = carve(&lt, ACT_DA, n * wa);
    if (any_moe)
        moe_take_scratch(c, sc, fa, N);
    sc->dres = fa_take(fa, nl * c->H);
    sc->dgat = sp_on(st) ? fa_take(fa, n * c->H) : NULL;
    sc->ring = st->cp_comm ? fa_take(fa, 8 * n * c->KD) : NULL;
}

/* The buffers that go to activation memory (bits SH_x): the GEMM inputs h1, att, h2 and
 * the dense MLP activation a, and attention's q, k, v, which only ops taking an "act"
 * argument (kdev.h) touch: their producers (the norms, the qkv split, RoPE, attention,
 * the activation) and consumers (the linears, attention and its backward).  None where
 * another consumer reads them as floats: the collectives of tp/sp, the block attention of
 * cp and sequence chunks, the FP8 linears; h2 stays fp32 when a MoE layer routes it. */
static unsigned act_buffers(const stack *st)
{
    if (tp_on(st) || st->cp_comm || st->chunked)
        return 0;
    unsigned m = 1u << SH_H1 | 1u << SH_ATT | 1u << SH_H2 | 1u << SH_A | 1u << SH_Q |
                 1u << SH_K | 1u << SH_V | 1u << ACT_DU | 1u << ACT_DA | 1u << ACT_DATT |
                 1u << ACT_QKV;
    if (st->c.s->qk_norm)   /* dq, dk feed the q/k norms' backward */
        m &= ~(1u << ACT_QKV);
    for (int l = 0; l < st->L; l++) {
        if (st->layers[l].p.fp8)
            return 0;
        if (st->layers[l].moe)   /* the shared expert's backward zeroes du, da as floats */
            m &= ~(1u << SH_H2 | 1u << ACT_DU | 1u << ACT_DA);
    }
    /* u, the activation's input, with its gradients (the all-bf16 activation kernels) */
    if ((m >> ACT_DU & 1u) && (m >> ACT_DA & 1u))
        m |= 1u << SH_U;
    return m;
}

/* Attention reads q, k, v where the qkv linear wrote them (kdev_attention_forward_ld) and
 * writes their gradients into the fused gradient: no split or merge copies.  Where nothing
 * changes q and k between the two (no RoPE, no q/k norms) and attention is the plain one
 * (cp's ring and sequence chunks take contiguous blocks). */
static int qkv_in_place(const stack *st)
{
    return !st->c.s->qk_norm && !st->c.rope && !st->cp_comm && !st->chunked;
}

int stack_reserve(stack *st, int N, hearth_err *err)
{
    if (sp_on(st) && N % st->c.tp)
        return herr_set(err, HERR_RUNTIME, "model: %d tokens cannot be split over tp %d "
                        "(sequence parallel)", N, st->c.tp);
    unsigned act = act_buffers(st);
    int rows = qkv_in_place(st);
    if (N <= st->cap && st->fbuf && act == st->act && rows == st->qkv_rows)
        return 0;
    int Nl = local_tokens(st, N);
    kdev *dev = st->c.dev;
    release_arenas(st);
    st->act = act;
    st->qkv_rows = rows;
    farena fa = { NULL, 0 };
    aarena aa = { NULL, 0, kdev_act_bytes(dev) };
    iarena ia = { NULL, 0 }, ih = { NULL, 0 };
    stack_take(st, &fa, &aa, &ia, &ih, N, Nl);
    st->ibuf_h = calloc(ih.used ? ih.used : 1, sizeof(int));
    int rc = st->sc.aux_d ? 0 : dev_alloc(dev, (void **)&st->sc.aux_d, sizeof(float),
                                          "activations", err);
    if (!rc)
        rc = dev_alloc(dev, (void **)&st->fbuf, fa.used * sizeof(float), "activations", err);
    if (!rc && kdev_alloc_act(dev, (void **)&st->abuf, aa.used))
        rc = herr_set(err, HERR_NOMEM, "model: activations: %zu elements of activation "
                      "memory on device %s: %s", aa.used, kdev_name(dev), kdev_errmsg(dev));
    if (!rc)
        rc = dev_alloc(dev, (void **)&st->ibuf, ia.used * sizeof(int), "activations", err);
    if (!rc && !st->ibuf_h)
        rc = herr_set(err, HERR_NOMEM, "model: out of memory");
    if (rc) {
        release_arenas(st);
        return herr_prefix(err, rc, "model: activations of %d tokens (%zu floats, %zu in "
                           "activation memory)", N, fa.used, aa.used);
    }
    st->fbuf_floats = fa.used;
    st->abuf_bytes = aa.used * aa.esz;
    fa.base = st->fbuf;
    fa.used = 0;
    aa.base = (char *)st->abuf;
    aa.used = 0;
    ia.base = st->ibuf;
    ia.used = 0;
    ih.base = st->ibuf_h;
    ih.used = 0;
    stack_take(st, &fa, &aa, &ia, &ih, N, Nl);
    st->cap = N;
    return 0;
}

/* ---- forward ------------------------------------------------------------------------ */

/* Column i of the first row of qkv or dqkv (the scratch, ACT_QKV). */
static float *qkv_at(const stack *st, float *p, size_t i)
{
    return col_at(st, ACT_QKV, p, i);
}

/* The attention norm: b->h1 holds its output over all N rows (gathered under sp). */
static int attn_norm_forward(stack *st, block *b, const float *x, const stack_ctx *ctx,
                             const float **h1, hearth_err *err)
{
    const stack_cfg *c = &st->c;
    const stack_shape *s = c->s;
    int Nl = ctx->N_local;
    float *h1l = own_rows(st, b->h1, Nl, c->H);
    norm_forward(c->dev, s->norm, h1l, b->mean1, b->rstd1, x, b->p.attn_norm_w, b->p.attn_norm_b, Nl,
                 c->H, s->norm_eps);
    return rows_gather(st, h1l, b->h1, Nl, c->H, h1, err);
}

static int attn_forward(stack *st, block *b, const float *x, const stack_ctx *ctx,
                        hearth_err *err)
{
    const stack_cfg *c = &st->c;
    stack_scratch *sc = &st->sc;
    const stack_shape *s = c->s;
    const block_params *p = &b->p;
    int N = ctx->N, Nl = ctx->N_local;
    const float *h1;
    int rc = attn_norm_forward(st, b, x, ctx, &h1, err);
    if (rc)
        return rc;
    kdev *dev = c->dev;
    if ((rc = fp8_linear_forward(st->c.dev, p->fp8, FP8_QKV, 0, N,
                                 st->qkv_rows ? b->q : sc->qkv, h1, p->qkv_w, p->qkv_b, N,
                                 c->H, c->QKV, err)))
        return rc;
    const int *cu = b->full_attn ? ctx->cu_full : ctx->cu;
    int nseq = b->full_attn ? ctx->nseq_full : ctx->nseq;
    int maxs = b->full_attn ? ctx->max_seq_full : ctx->max_seq;
    if (st->qkv_rows) {
        int ld = c->QKV;
        kdev_attention_forward_ld(dev, b->att, b->lse, b->q, b->k, b->v, ld, ld, ld, cu, nseq,
                                  maxs, N, c->Hq, c->Hkv, c->D, c->causal);
        return residual_linear_forward(st, p->fp8, FP8_PROJ, b->x1, x, b->att, p->proj_w,
                                       p->proj_b, N, Nl, c->QD, c->H, err);
    }

    /* Split the fused rows into the contiguous [N, heads, D] arrays attention reads (in
     * activation memory where the stack keeps them there). */
    float *qd = s->qk_norm ? b->qr : b->q;
    float *kd = s->qk_norm ? b->kr : b->k;
    size_t row = (size_t)c->QKV;
    size_t nq = (size_t)c->QD, nk = (size_t)c->KD;
    kdev_act_copy_2d(dev, qd, nq, sc->qkv, row, (size_t)N, nq);
    kdev_act_copy_2d(dev, kd, nk, qkv_at(st, sc->qkv, nq), row, (size_t)N, nk);
    kdev_act_copy_2d(dev, b->v, nk, qkv_at(st, sc->qkv, nq + nk), row, (size_t)N, nk);
    if (s->qk_norm) {
        kdev_rmsnorm_forward(dev, b->q, b->qrs, b->qr, p->q_norm_w, N * c->Hq, c->D,
                             s->norm_eps);
        kdev_rmsnorm_forward(dev, b->k, b->krs, b->kr, p->k_norm_w, N * c->Hkv, c->D,
                             s->norm_eps);
    }
    if (c->rope) {
        kdev_rope_forward(dev, b->q, ctx->cos, ctx->sin, N, c->Hq, c->D);
        kdev_rope_forward(dev, b->k, ctx->cos, ctx->sin, N, c->Hkv, c->D);
    }
    if (st->cp_comm)
        rc = cp_attention_forward(dev, st->cp_comm, sc->ring, b->att, b->lse, b->q, b->k,
                                  b->v, cu, nseq, maxs, ctx->cp_pos, N, c->Hq, c->Hkv, c->D,
                                  err);
    else if (ctx->cc)
        chunk_attention_forward(dev, ctx->cc, (int)(b - st->layers), ctx->chunk, b->att,
                                b->lse, b->q, b->k, b->v, cu, nseq, N, c->Hq, c->Hkv, c->D,
                                c->causal);
    else
        kdev_attention_forward(dev, b->att, b->lse, b->q, b->k, b->v, cu, nseq, maxs, N,
                               c->Hq, c->Hkv, c->D, c->causal);
    if (rc)
        return rc;
    return residual_linear_forward(st, p->fp8, FP8_PROJ, b->x1, x, b->att, p->proj_w,
                                   p->proj_b, N, Nl, c->QD, c->H, err);
}

/* The mlp norm: b->h2 holds its output over all N rows (gathered under sp). */
static int mlp_norm_forward(stack *st, block *b, const stack_ctx *ctx, const float **h2,
                            hearth_err *err)
{
    const stack_cfg *c = &st->c;
    const stack_shape *s = c->s;
    int Nl = ctx->N_local;
    float *h2l = own_rows(st, b->h2, Nl, c->H);
    b->aux = 0;
    norm_forward(c->dev, s->norm, h2l, b->mean2, b->rstd2, b->x1, b->p.mlp_norm_w, b->p.mlp_norm_b,
                 Nl, c->H, s->norm_eps);
    return rows_gather(st, h2l, b->h2, Nl, c->H, h2, err);
}

/* out = x1 + this rank's rows of the MLP output (in sc.tmp). */
static void mlp_residual(stack *st, block *b, float *out, int Nl)
{
    kdev_add(st->c.dev, out, b->x1, own_rows(st, st->sc.tmp, Nl, st->c.H),
             (size_t)Nl * st->c.H);
}

static void mlp_act_forward(const stack_cfg *c, block *b, int N)
{
    if (c->s->mlp == MLP_SWIGLU)
        kdev_swiglu_forward(c->dev, b->a, b->u, N, c->F);
    else
        kdev_gelu_forward(c->dev, b->a, b->u, (size_t)N * c->F, c->gelu);
}

static int dense_mlp_forward(stack *st, block *b, float *out, const stack_ctx *ctx,
                             hearth_err *err)
{
    const stack_cfg *c = &st->c;
    const block_params *p = &b->p;
    int N = ctx->N, Nl = ctx->N_local, rc;
    const float *h2;
    if ((rc = mlp_norm_forward(st, b, ctx, &h2, err)))
        return rc;
    if ((rc = fp8_linear_forward(st->c.dev, p->fp8, FP8_FC1, 0, N, b->u, h2, p->fc1_w, p->fc1_b, N,
                                 c->H, c->Fu, err)))
        return rc;
    mlp_act_forward(c, b, N);
    return residual_linear_forward(st, p->fp8, FP8_FC2, out, b->x1, b->a, p->fc2_w, p->fc2_b,
                                   N, Nl, c->F, c->H, err);
}

/* Forward node k of layer l (internal.h: stack_forward_pair).  The MoE layer is not
 * split by tp: every tp rank runs the whole layer on the N tokens (h2 gathered) and
 * keeps its own rows. */
static int forward_node(stack *st, int l, int k, const stack_ctx *ctx, hearth_err *err)
{
    const stack_cfg *c = &st->c;
    block *b = &st->layers[l];
    int rc = 0;
    const float *h2;
    switch (k) {
    case 0:
        if ((rc = attn_forward(st, b, st->xs[l], ctx, err)))
            return rc;
        if (!b->moe)
            return dense_mlp_forward(st, b, st->xs[l + 1], ctx, err);
        if ((rc = mlp_norm_forward(st, b, ctx, &h2, err)))
            return rc;
        return moe_forward_route(c, b, &st->sc, st->ep_comm, ctx->N, err);
    case 1:
        return b->moe ? moe_forward_dispatch(c, b, &st->sc, st->ep_comm, err) : 0;
    case 2:
        return b->moe ? moe_forward_experts(c, b, &st->sc, err) : 0;
    default:
        if (!b->moe)
            return 0;
        if ((rc = moe_forward_combine(c, b, &st->sc, st->ep_comm, st->sc.tmp, ctx->N, err)))
            return rc;
        mlp_residual(st, b, st->xs[l + 1], ctx->N_local);
        return 0;
    }
}

static int check_ctx(const stack *st, const stack_ctx *ctx, hearth_err *err)
{
    if (ctx->N > st->cap || ctx->N_local != local_tokens(st, ctx->N) ||
        (sp_on(st) && ctx->N % st->c.tp) || (st->cp_comm && !ctx->cp_pos) ||
        ((st->cp_comm || ctx->cc) && (st->c.D > KCPU_ATTENTION_BLOCK_MAX_D || st->act)))
        return herr_set(err, HERR_RUNTIME, "model: stack called with %d tokens (%d local) "
                        "but reserved for %d, tp %d, sp %d", ctx->N, ctx->N_local, st->cap,
                        st->c.tp, st->sp);
    return 0;
}

#define STACK_NODES 4

/* The pair's node order within a layer: (micro batch, node), see internal.h. */
static const int pair_order[2 * STACK_NODES][2] = {
    { 0, 0 }, { 0, 1 }, { 1, 0 }, { 0, 2 }, { 1, 1 }, { 0, 3 }, { 1, 2 }, { 1, 3 },
};

static int check_pair(stack *const st[2], const stack_ctx *const ctx[2], hearth_err *err)
{
    int rc;
    for (int i = 0; i < 2; i++)
        if (st[i] && (rc = check_ctx(st[i], ctx[i], err)))
            return rc;
    if (!st[1])
        return 0;
    int same = st[0] != st[1] && st[0]->L == st[1]->L && st[0]->c.tp == st[1]->c.tp &&
               st[0]->c.ep == st[1]->c.ep && st[0]->c.E0 == st[1]->c.E0;
    for (int l = 0; same && l < st[0]->L; l++)
        same = st[0]->layers[l].moe == st[1]->layers[l].moe;
    if (!same)
        return herr_set(err, HERR_RUNTIME, "model: a pair of micro batches needs two "
                        "activation sets of the same layers");
    return 0;
}

int stack_forward_pair(stack *const st[2], const stack_ctx *const ctx[2], double aux[2],
                       hearth_err *err)
{
    int n = st[1] ? 2 : 1, rc;
    aux[0] = aux[1] = 0;
    if ((rc = check_pair(st, ctx, err)))
        return rc;
    for (int l = 0; l < st[0]->L; l++) {
        if (n == 1) {
            for (int k = 0; k < STACK_NODES; k++)
                if ((rc = forward_node(st[0], l, k, ctx[0], err)))
                    return rc;
        } else {
            /* On GPU, nodes 1 and 3 would start their all_to_allv on a communication
             * stream and the next entry's compute would run meanwhile; on the local
             * backend they simply run in this order. */
            for (int i = 0; i < 2 * STACK_NODES; i++) {
                int j = pair_order[i][0];
                if ((rc = forward_node(st[j], l, pair_order[i][1], ctx[j], err)))
                    return rc;
            }
        }
        for (int j = 0; j < n; j++)
            aux[j] += st[j]->layers[l].aux;
    }
    return dev_check(st[0]->c.dev, err);
}

int stack_forward(stack *st, const stack_ctx *ctx, double *aux, hearth_err *err)
{
    stack *const sts[2] = { st, NULL };
    const stack_ctx *const ctxs[2] = { ctx, NULL };
    double a[2];
    int rc = stack_forward_pair(sts, ctxs, a, err);
    *aux = a[0];
    return rc;
}

/* ---- recomputation ------------------------------------------------------------------ */

/* Rebuilds what recomputation dropped of layer l's activations (stack_take), with the
 * forward's own functions in the forward's order, so the values are bitwise the ones the
 * forward had (the CPU kernels are deterministic) and so are the gradients.  Collectives
 * inside (sequence-parallel gathers) run again on every rank of the group alike.  The
 * MoE routing and expert rows are kept per layer: nothing of the all-to-all reruns.
 * Under FP8 the layer's linears (qkv, proj, fc1 with `full`) replay with the scales their
 * forward used (recompute_layer). */
static int rebuild_layer(stack *st, int l, const stack_ctx *ctx, hearth_err *err)
{
    const stack_cfg *c = &st->c;
    block *b = &st->layers[l];
    int rec = c->s->recompute, rc;
    const float *h1, *h2;
    double aux = b->aux;   /* mlp_norm_forward clears it */
    if (rec == RECOMPUTE_FULL)
        rc = attn_forward(st, b, st->xs[l], ctx, err);
    else
        rc = attn_norm_forward(st, b, st->xs[l], ctx, &h1, err);
    if (rc || (rc = mlp_norm_forward(st, b, ctx, &h2, err)))
        return rc;
    b->aux = aux;
    if (b->moe)
        return 0;
    if (rec == RECOMPUTE_FULL &&
        (rc = fp8_linear_forward(st->c.dev, b->p.fp8, FP8_FC1, 0, ctx->N, b->u, h2, b->p.fc1_w,
                                 b->p.fc1_b, ctx->N, c->H, c->Fu, err)))
        return rc;
    mlp_act_forward(c, b, ctx->N);
    return 0;
}

/* rebuild_layer with the layer's FP8 linears in replay mode (fp8.h): a fresh amax would
 * give other scales (the history now holds the forward's amax) and would enter the
 * delayed-scaling history a second time. */
static int recompute_layer(stack *st, int l, const stack_ctx *ctx, hearth_err *err)
{
    if (st->c.s->recompute == RECOMPUTE_NONE)
        return 0;
    fp8_layer *f8 = st->layers[l].p.fp8;
    fp8_layer_set_replay(f8, 1);
    int rc = rebuild_layer(st, l, ctx, err);
    fp8_layer_set_replay(f8, 0);
    return rc;
}

/* ---- backward ----------------------------------------------------------------------- */

/* The mlp norm's backward from dh (sc.tmp, N rows; this rank's summed rows) into dres. */
static void mlp_norm_backward(stack *st, block *b, const stack_ctx *ctx)
{
    const stack_cfg *c = &st->c;
    stack_scratch *sc = &st->sc;
    int Nl = ctx->N_local;
    norm_backward(c->dev, c->s->norm, sc->dres, b->g.mlp_norm_w, b->g.mlp_norm_b,
                  own_rows(st, sc->tmp, Nl, c->H), b->x1, b->p.mlp_norm_w, b->mean2,
                  b->rstd2, Nl, c->H);
}

static int dense_mlp_backward(stack *st, block *b, const stack_ctx *ctx, hearth_err *err)
{
    const stack_cfg *c = &st->c;
    stack_scratch *sc = &st->sc;
    const stack_shape *s = c->s;
    const block_params *p = &b->p, *g = &b->g;
    int N = ctx->N, Nl = ctx->N_local, rc;
    float *dh = sc->tmp;   /* every gradient below is written, not added: nothing to zero */
    if ((rc = row_linear_backward(st, p->fp8, FP8_FC2, sc->da, g->fc2_w, g->fc2_b, sc->dres, b->a, p->fc2_w,
                                  N, Nl, c->F, c->H, err)))
        return rc;
    if (s->mlp == MLP_SWIGLU)
        kdev_swiglu_backward_set(c->dev, sc->du, sc->da, b->u, N, c->F);
    else
        kdev_gelu_backward_set(c->dev, sc->du, sc->da, b->u, (size_t)N * c->F, c->gelu);
    if ((rc = fp8_linear_backward_set(st->c.dev, p->fp8, FP8_FC1, 0, dh, g->fc1_w, g->fc1_b,
                                      sc->du, b->h2, p->fc1_w, N, c->H, c->Fu, err)))
        return rc;
    if ((rc = rows_reduce(st, dh, N, Nl, c->H, err)))
        return rc;
    mlp_norm_backward(st, b, ctx);
    return 0;
}


static int attn_backward(stack *st, block *b, const float *x, const stack_ctx *ctx,
                         hearth_err *err)
{
    const stack_cfg *c = &st->c;
    stack_scratch *sc = &st->sc;
    const stack_shape *s = c->s;
    const block_params *p = &b->p, *g = &b->g;
    int N = ctx->N, Nl = ctx->N_local, rc;
    size_t nq = (size_t)N * c->QD, nk = (size_t)N * c->KD;
    kdev *dev = c->dev;

    if ((rc = row_linear_backward(st, p->fp8, FP8_PROJ, sc->datt, g->proj_w, g->proj_b, sc->dres, b->att,
                                  p->proj_w, N, Nl, c->QD, c->H, err)))
        return rc;
    if (st->cp_comm || ctx->cc) {   /* the block attention adds, block by block */
        zero(dev, sc->dq, nq);
        zero(dev, sc->dk, nk);
        zero(dev, sc->dv, nk);
    }
    const int *cu = b->full_attn ? ctx->cu_full : ctx->cu;
    int nseq = b->full_attn ? ctx->nseq_full : ctx->nseq;
    int maxs = b->full_attn ? ctx->max_seq_full : ctx->max_seq;
    if (st->cp_comm &&
        (rc = cp_attention_backward(dev, st->cp_comm, sc->ring, sc->dq, sc->dk, sc->dv,
                                    sc->datt, b->q, b->k, b->v, b->att, b->lse, cu, nseq,
                                    maxs, ctx->cp_pos, N, c->Hq, c->Hkv, c->D, err)))
        return rc;
    if (!st->cp_comm && ctx->cc)
        chunk_attention_backward(dev, ctx->cc, (int)(b - st->layers), ctx->chunk, sc->dq,
                                 sc->dk, sc->dv, sc->datt, b->q, b->k, b->v, b->att, b->lse,
                                 cu, nseq, N, c->Hq, c->Hkv, c->D, c->causal);
    else if (!st->cp_comm) {
        int ld = st->qkv_rows ? c->QKV : 0;   /* dq, dk, dv: then the column blocks of dqkv */
        kdev_attention_backward_ld_set(dev, sc->dq, sc->dk, sc->dv, sc->datt, b->q, b->k, b->v,
                                       b->att, b->lse, ld, ld, ld, cu, nseq, maxs, N, c->Hq,
                                       c->Hkv, c->D, c->causal);
    }
    if (c->rope) {
        kdev_rope_backward(dev, sc->dq, ctx->cos, ctx->sin, N, c->Hq, c->D);
        kdev_rope_backward(dev, sc->dk, ctx->cos, ctx->sin, N, c->Hkv, c->D);
    }
    const float *dqd = sc->dq, *dkd = sc->dk;
    if (s->qk_norm) {
        zero(dev, sc->dqr, nq);
        zero(dev, sc->dkr, nk);
        kdev_rmsnorm_backward(dev, sc->dqr, g->q_norm_w, sc->dq, b->qr, p->q_norm_w, b->qrs,
                              N * c->Hq, c->D);
        kdev_rmsnorm_backward(dev, sc->dkr, g->k_norm_w, sc->dk, b->kr, p->k_norm_w, b->krs,
                              N * c->Hkv, c->D);
        dqd = sc->dqr;
        dkd = sc->dkr;
    }
    size_t row = (size_t)c->QKV, fq = (size_t)c->QD, fk = (size_t)c->KD;
    if (!st->qkv_rows) {   /* merge the gradients into the fused rows */
        kdev_act_copy_2d(dev, sc->dqkv, row, dqd, fq, (size_t)N, fq);
        kdev_act_copy_2d(dev, qkv_at(st, sc->dqkv, fq), row, dkd, fk, (size_t)N, fk);
        kdev_act_copy_2d(dev, qkv_at(st, sc->dqkv, fq + fk), row, sc->dv, fk, (size_t)N, fk);
    }
    float *dh = sc->tmp;
    if ((rc = fp8_linear_backward_set(st->c.dev, p->fp8, FP8_QKV, 0, dh, g->qkv_w, g->qkv_b,
                                      sc->dqkv, b->h1, p->qkv_w, N, c->H, c->QKV, err)))
        return rc;
    if ((rc = rows_reduce(st, dh, N, Nl, c->H, err)))
        return rc;
    norm_backward(dev, s->norm, sc->dres, g->attn_norm_w, g->attn_norm_b, own_rows(st, dh, Nl, c->H),
                  x, p->attn_norm_w, b->mean1, b->rstd1, Nl, c->H);
    return 0;
}

/* Backward node k of layer l (internal.h: stack_backward_pair).  The MoE layer is not
 * split by tp: the full backward on every rank (output gradient gathered under sp), no
 * reduction. */
static int backward_node(stack *st, int l, int k, const stack_ctx *ctx, float aux_scale,
                         hearth_err *err)
{
    const stack_cfg *c = &st->c;
    stack_scratch *sc = &st->sc;
    block *b = &st->layers[l];
    int rc;
    switch (k) {
    case 0:
        if (!b->moe) {
            if ((rc = dense_mlp_backward(st, b, ctx, err)))
                return rc;
            return attn_backward(st, b, st->xs[l], ctx, err);
        }
        if ((rc = rows_gather(st, sc->dres, sc->dgat, ctx->N_local, c->H, &sc->dmoe, err)))
            return rc;
        return moe_backward_unpermute(c, b, sc, sc->dmoe, ctx->N, err);
    case 1:
        return b->moe ? moe_backward_dispatch(c, b, sc, st->ep_comm, err) : 0;
    case 2:
        return b->moe ? moe_backward_experts(c, b, sc, ctx->N, err) : 0;
    default:
        if (!b->moe)
            return 0;
        zero(c->dev, sc->tmp, (size_t)ctx->N * c->H);
        if ((rc = moe_backward_combine(c, b, sc, st->ep_comm, sc->dmoe, sc->tmp, ctx->N,
                                       aux_scale, err)))
            return rc;
        mlp_norm_backward(st, b, ctx);
        return attn_backward(st, b, st->xs[l], ctx, err);
    }
}

int stack_backward_pair(stack *const st[2], const stack_ctx *const ctx[2], float aux_scale,
                        hearth_err *err)
{
    int rc;
    if ((rc = check_pair(st, ctx, err)))
        return rc;
    for (int l = st[0]->L - 1; l >= 0; l--) {
        for (int j = 0; j < 2; j++)
            if (st[j] && (rc = recompute_layer(st[j], l, ctx[j], err)))
                return rc;
        if (!st[1]) {
            for (int k = 0; k < STACK_NODES; k++)
                if ((rc = backward_node(st[0], l, k, ctx[0], aux_scale, err)))
                    return rc;
            continue;
        }
        for (int i = 0; i < 2 * STACK_NODES; i++) {
            int j = pair_order[i][0];
            if ((rc = backward_node(st[j], l, pair_order[i][1], ctx[j], aux_scale, err)))
                return rc;
        }
    }
    return dev_check(st[0]->c.dev, err);
}

int stack_backward(stack *st, const stack_ctx *ctx, float aux_scale, hearth_err *err)
{
    stack *const sts[2] = { st, NULL };
    const stack_ctx *const ctxs[2] = { ctx, NULL };
    return stack_backward_pair(sts, ctxs, aux_scale, err);
}
