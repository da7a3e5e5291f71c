/* moe.c - the mixture-of-experts MLP of a decoder block (Qwen2-MoE / Qwen3-MoE style).
 *
 *   logits = h Wr^T                       router, no bias            [N, E]
 *   probs, topk_idx, topk_w, aux = kcpu_moe_router(logits)   top-K, renormalised weights
 *   rows grouped by expert (kcpu_moe_plan, stable in token order), permuted copies of h
 *   per expert e: y_e = down_e(silu(gate_e x) * up_e x)      swiglu, no biases
 *   out = sum_j topk_w[t,j] * y[slot(t,j)]                   (kcpu_moe_unpermute)
 *       + down_s(silu(gate_s h) * up_s h)                    shared expert when Fs > 0
 *
 * The shared expert is added ungated (Qwen2-MoE multiplies it by sigmoid(h w_g); we do
 * not have that gate).  Expert and shared linears have no biases, whatever bias_mlp says.
 * The load-balancing loss of the layer is returned; its gradient enters the router
 * backward with weight aux_scale.
 *
 * Parallelism.  Tensor parallelism does not split this layer: the experts are small and
 * many, so cutting each one over tp would make every expert matmul tiny; instead every
 * tp rank runs the whole layer on all tokens (block.c gathers them under sp) and gets
 * the same result.  Expert parallelism (c->ep > 1) spreads the experts over ranks that
 * run *different* tokens: after the plan groups this rank's rows by expert, the rows of
 * ep rank j's experts are one contiguous block, so one all_to_allv sends them (the
 * per-expert counts go first, so that every rank knows what arrives).  Arrivals are
 * source-major ([rank][local expert]); they are regrouped expert-major so that each
 * local expert runs one matmul over all its rows, then the outputs travel back the same
 * way and the ordinary unpermute weights them.  The backward repeats the trip for the
 * output gradient and returns the input gradient rows.  Router, aux loss and shared
 * expert stay per rank, on its own tokens.
 *
 * The layer is written as the four nodes of internal.h (route, dispatch, experts,
 * combine; the backward likewise), so that block.c can interleave two micro batches
 * between them; moe_forward / moe_backward run them in order. */
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

static void zero(kdev *dev, float *x, size_t n)
{
    kdev_zero(dev, x, n * sizeof *x);
}

void moe_take(const stack_cfg *c, block *b, farena *fa, iarena *ia, iarena *ih, int N)
{
    size_t n = (size_t)N, nk = n * c->K;
    b->logits = fa_take(fa, n * c->E);
    b->probs = fa_take(fa, n * c->E);
    b->cp_cnt = fa_take(fa, (size_t)c->E);
    b->topk_w = fa_take(fa, nk);
    b->topk_idx = ia_take(ia, nk);
    b->offsets = ia_take(ia, (size_t)c->E + 1);
    b->off_h = ia_take(ih, (size_t)c->E + 1);
    b->row_src = ia_take(ia, nk);
    b->slot_row = ia_take(ia, nk);
    b->xp = fa_take(fa, nk * c->H);
    /* Under ep the experts run on the received rows (ep_buf) instead. */
    b->ue = c->ep > 1 ? NULL : fa_take(fa, nk * 2 * c->Fm);
    b->ae = c->ep > 1 ? NULL : fa_take(fa, nk * c->Fm);
    b->ye = fa_take(fa, nk * c->H);
    b->ep_cnt = c->ep > 1 ? ia_take(ih, (size_t)2 * c->E) : NULL;
    b->ep_off = c->ep > 1 ? ia_take(ih, (size_t)c->El + 1) : NULL;
    b->us = c->Fs > 0 ? fa_take(fa, n * 2 * c->Fs) : NULL;
    b->as = c->Fs > 0 ? fa_take(fa, n * c->Fs) : NULL;
}

void moe_take_scratch(const stack_cfg *c, stack_scratch *sc, farena *fa, int N)
{
    size_t n = (size_t)N, nk = n * c->K;
    sc->dye = fa_take(fa, nk * c->H);
    sc->dae = c->ep > 1 ? NULL : fa_take(fa, nk * c->Fm);
    sc->due = c->ep > 1 ? NULL : fa_take(fa, nk * 2 * c->Fm);
    sc->dxp = fa_take(fa, nk * c->H);
    sc->dtopk = fa_take(fa, nk);
    sc->dlogits = fa_take(fa, n * c->E);
    sc->shared_out = c->Fs > 0 ? fa_take(fa, n * c->H) : NULL;
}

/* Pinned routing (model_pin_routing, for gradient checks): the given experts replace
 * the top-k choice; their weights are renormalised over the pinned experts' probabilities
 * and the aux loss counts the pinned assignments, exactly as the router kernel does for
 * its own choice, so that the router backward applies unchanged.  Returns aux. */
static float pin_routing(block *b, int N, int E, int K)
{
    memcpy(b->topk_idx, b->pin, (size_t)N * K * sizeof(int));
    for (int t = 0; t < N; t++) {
        const float *pr = b->probs + (size_t)t * E;
        const int *idx = b->topk_idx + (size_t)t * K;
        double chosen = 0;
        for (int j = 0; j < K; j++)
            chosen += pr[idx[j]];
        for (int j = 0; j < K; j++)
            b->topk_w[(size_t)t * K + j] = (float)(pr[idx[j]] / chosen);
    }
    double a = 0;
    for (int e = 0; e < E; e++) {
        double f = 0, P = 0;
        for (size_t i = 0; i < (size_t)N * K; i++)
            f += b->topk_idx[i] == e;
        for (int t = 0; t < N; t++)
            P += b->probs[(size_t)t * E + e];
        a += (f / N) * (P / N);
    }
    return N > 0 ? (float)(E * a) : 0.0f;
}

/* Context parallelism (model_par.h): the aux loss is E sum_e f_e P_e over the whole
 * micro batch, whose tokens are spread over the cp group.  The routed-pair counts and the
 * probability sums per expert, and the token count, are summed over the group; every cp
 * rank then has the single-rank aux (up to the order of the sums), and keeps the counts
 * and the token count for the backward. */
static int cp_aux(block *b, int N, int E, int K, float *aux, hearth_err *err)
{
    double *s = calloc((size_t)2 * E + 1, sizeof *s);
    if (!s)
        return herr_set(err, HERR_NOMEM, "moe: out of memory");
    for (size_t i = 0; i < (size_t)N * K; i++)
        s[b->topk_idx[i]] += 1.0;
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++)
            s[E + e] += b->probs[(size_t)t * E + e];
    s[2 * E] = N;
    int rc = comm_allreduce(b->cp, s, s, (size_t)2 * E + 1, COMM_F64, COMM_SUM, err);
    if (rc) {
        free(s);
        return herr_prefix(err, rc, "moe: aux loss over cp");
    }
    double Nt = s[2 * E], a = 0;
    for (int e = 0; e < E; e++) {
        a += (s[e] / Nt) * (s[E + e] / Nt);
        b->cp_cnt[e] = (float)s[e];   /* counts < 2^24: exact */
    }
    b->cp_n = (int)Nt;
    *aux = Nt > 0 ? (float)(E * a) : 0.0f;
    free(s);
    return 0;
}

/* The aux term of the router backward with the group's counts (what
 * kcpu_moe_router_backward adds for daux, with f_e and N of the whole micro batch):
 * dL/dp_e = daux E f_e / N_total, dL/dz_e = p_e (dL/dp_e - sum_k p_k dL/dp_k). */
static void cp_aux_backward(const block *b, float *dlogits, float daux, int N, int E)
{
    if (daux == 0.0f || b->cp_n <= 0)
        return;
    double Nt = b->cp_n;
    for (int t = 0; t < N; t++) {
        const float *p = b->probs + (size_t)t * E;
        double dot = 0;
        for (int e = 0; e < E; e++)
            dot += p[e] * ((double)daux * E * (b->cp_cnt[e] / Nt) / Nt);
        float *dz = dlogits + (size_t)t * E;
        for (int e = 0; e < E; e++)
            dz[e] += (float)(p[e] * ((double)daux * E * (b->cp_cnt[e] / Nt) / Nt - dot));
    }
}

/* ---- the experts ----------------------------------------------------------------
 * Local expert e (weights at index e of the block's [El] arrays) runs on rows
 * [off[e], off[e+1]) of x; u, a, y are the gate|up, activation and output rows. */
static int experts_forward(const stack_cfg *c, const block_params *p, const int *off,
                           int ne, const float *x, float *u, float *a, float *y,
                           hearth_err *err)
{
    int H = c->H, Fm = c->Fm;
    for (int e = 0; e < ne; e++) {
        size_t r0 = (size_t)off[e];
        int n = off[e + 1] - off[e];
        if (n == 0)
            continue;
        const float *w1 = p->exp_fc1_w + (size_t)e * 2 * Fm * H;
        const float *w2 = p->exp_fc2_w + (size_t)e * H * Fm;
        int rc = fp8_linear_forward(c->dev, p->fp8, FP8_EXPERT_FC1, e, 0, u + r0 * 2 * Fm,
                                    x + r0 * H, w1, NULL, n, H, 2 * Fm, err);
        if (rc)
            return rc;
        kdev_swiglu_forward(c->dev, a + r0 * Fm, u + r0 * 2 * Fm, n, Fm);
        if ((rc = fp8_linear_forward(c->dev, p->fp8, FP8_EXPERT_FC2, e, 0, y + r0 * H, a + r0 * Fm,
                                     w2, NULL, n, Fm, H, err)))
            return rc;
    }
    return 0;
}

/* dy -> dx (accumulated, like da and du, which the caller zeroes) and the weight
 * gradients of the local experts. */
static int experts_backward(const stack_cfg *c, const block *b, const int *off, int ne,
                            const float *dy, const float *x, const float *u,
                            const float *a, float *da, float *du, float *dx, hearth_err *err)
{
    const block_params *p = &b->p, *g = &b->g;
    int H = c->H, Fm = c->Fm;
    for (int e = 0; e < ne; e++) {
        size_t r0 = (size_t)off[e];
        int n = off[e + 1] - off[e];
        if (n == 0)
            continue;
        size_t o1 = (size_t)e * 2 * Fm * H, o2 = (size_t)e * H * Fm;
        int rc = fp8_linear_backward(c->dev, p->fp8, FP8_EXPERT_FC2, e, da + r0 * Fm,
                                     g->exp_fc2_w ? g->exp_fc2_w + o2 : NULL, NULL,
                                     dy + r0 * H, a + r0 * Fm, p->exp_fc2_w + o2, n, Fm, H,
                                     err);
        if (rc)
            return rc;
        kdev_swiglu_backward(c->dev, du + r0 * 2 * Fm, da + r0 * Fm, u + r0 * 2 * Fm, n, Fm);
        if ((rc = fp8_linear_backward(c->dev, p->fp8, FP8_EXPERT_FC1, e, dx + r0 * H,
                                      g->exp_fc1_w ? g->exp_fc1_w + o1 : NULL, NULL,
                                      du + r0 * 2 * Fm, x + r0 * H, p->exp_fc1_w + o1, n, H,
                                      2 * Fm, err)))
            return rc;
    }
    return 0;
}

/* ---- expert parallel exchange ------------------------------------------------------ */

/* Grows a device buffer, keeping its contents. */
static int grow(kdev *dev, float **buf, size_t *cap, size_t n, hearth_err *err)
{
    if (n <= *cap && *buf)
        return 0;
    float *p;
    int rc = dev_alloc(dev, (void **)&p, (n ? n : 1) * sizeof *p, "expert rows", err);
    if (rc)
        return herr_prefix(err, rc, "moe");
    if (*buf)
        kdev_copy(dev, p, *buf, *cap * sizeof *p);
    kdev_release(dev, *buf);
    *buf = p;
    *cap = n ? n : 1;
    return 0;
}

/* Rows received from rank j for local expert i (b->ep_cnt, see internal.h). */
static int rcnt(const stack_cfg *c, const block *b, int j, int i)
{
    return b->ep_cnt[c->E + j * c->El + i];
}

/* all_to_allv of H-wide rows between the plan side (this rank's rows in expert order:
 * ep rank j's experts are rows [offsets[j El], offsets[(j+1) El])) and the expert side
 * (the rows received, source-major).  back = 0: plan -> expert side; 1: the way back.
 * w: 4 ep scratch entries. */
static int exchange(comm *ep, const stack_cfg *c, const block *b, const float *send,
                    float *recv, int back, size_t *w, hearth_err *err)
{
    int P = c->ep, El = c->El;
    size_t H = (size_t)c->H, q = 0;
    size_t *pc = w, *pd = w + P, *qc = w + 2 * P, *qd = w + 3 * P;
    for (int j = 0; j < P; j++) {
        pd[j] = (size_t)b->off_h[j * El] * H;
        pc[j] = (size_t)(b->off_h[(j + 1) * El] - b->off_h[j * El]) * H;
        size_t r = 0;
        for (int i = 0; i < El; i++)
            r += (size_t)rcnt(c, b, j, i);
        qd[j] = q * H;
        qc[j] = r * H;
        q += r;
    }
    if (back)
        return comm_all_to_allv(ep, send, qc, qd, recv, pc, pd, COMM_F32, err);
    return comm_all_to_allv(ep, send, pc, pd, recv, qc, qd, COMM_F32, err);
}

/* Received rows, source-major ([rank j][local expert i]) <-> expert-major ([i][j]), the
 * order of b->ep_off.  w: ep scratch entries. */
static void regroup(const stack_cfg *c, const block *b, float *dst, const float *src,
                    int to_expert, size_t *w)
{
    int P = c->ep, El = c->El;
    size_t H = (size_t)c->H, s = 0, e = 0;
    for (int j = 0; j < P; j++) {
        w[j] = s;
        for (int i = 0; i < El; i++)
            s += (size_t)rcnt(c, b, j, i);
    }
    for (int i = 0; i < El; i++)
        for (int j = 0; j < P; j++) {
            size_t n = (size_t)rcnt(c, b, j, i);
            if (n) {
                if (to_expert)
                    kdev_copy(c->dev, dst + e * H, src + w[j] * H, n * H * sizeof *dst);
                else
                    kdev_copy(c->dev, dst + w[j] * H, src + e * H, n * H * sizeof *dst);
            }
            w[j] += n;
            e += n;
        }
}

/* Scratch of the exchange for R received rows: stage [R, H] (rows as they travel),
 * y [R, H] (expert outputs; backward: their gradient), dx [R, H], da [R, Fm],
 * du [R, 2 Fm]. */
static int ep_scratch(const stack_cfg *c, stack_scratch *sc, size_t R, float **stage,
                      float **y, float **dx, float **da, float **du, hearth_err *err)
{
    size_t H = (size_t)c->H, Fm = (size_t)c->Fm;
    int rc = grow(c->dev, &sc->ep_buf, &sc->ep_cap, R * (3 * H + 3 * Fm), err);
    if (rc)
        return rc;
    *stage = sc->ep_buf;
    *y = *stage + R * H;
    *dx = *y + R * H;
    *da = *dx + R * H;
    *du = *da + R * Fm;
    return 0;
}

/* ---- the nodes ------------------------------------------------------------------------
 * The layer runs as four nodes (internal.h), so that with parallel.a2a_overlap another
 * micro batch's compute can sit between them while the rows travel.  Each node reads and
 * writes only this block's buffers and its stack's scratch; which node ran last is not
 * checked (block.c calls them in order).  Under ep the exchanges' scratch (stage rows and
 * the expert outputs) lives in sc->ep_buf, sized in the first node and left alone until
 * the last one, so it is re-derived rather than carried. */

/* The exchange's index scratch: 4 ep entries. */
static size_t *ep_index(const stack_cfg *c, hearth_err *err)
{
    size_t *w = malloc((size_t)4 * c->ep * sizeof *w);
    if (!w)
        herr_set(err, HERR_NOMEM, "moe: out of memory");
    return w;
}

int moe_forward_route(const stack_cfg *c, block *b, stack_scratch *sc, comm *ep, int N,
                      hearth_err *err)
{
    const block_params *p = &b->p;
    int H = c->H, E = c->E, K = c->K, El = c->El, P = c->ep;
    kdev *dev = c->dev;
    float aux = 0;

    /* Pinned routing and the cp statistics are host loops over the router's outputs. */
    if ((b->pin || b->cp) && kdev_get_kind(dev) != KDEV_CPU)
        return herr_set(err, HERR_CONFIG, "moe: pinned routing and context parallelism run "
                        "on the cpu device only");
    int rc = fp8_linear_forward(dev, p->fp8, FP8_ROUTER, 0, N, b->logits, b->h2, p->router_w,
                                NULL, N, H, E, err);
    if (rc)
        return rc;
    kdev_moe_router_forward(dev, b->topk_idx, b->topk_w, b->probs, sc->aux_d, b->logits, N,
                            E, K);
    kdev_download(dev, &aux, sc->aux_d, sizeof aux);
    if (b->pin)
        aux = pin_routing(b, N, E, K);
    if (b->cp && (rc = cp_aux(b, N, E, K, &aux, err)))
        return rc;
    b->aux = aux;
    kdev_moe_plan(dev, b->offsets, b->row_src, b->slot_row, b->topk_idx, N, E, K);
    kdev_moe_permute_forward(dev, b->xp, b->h2, b->row_src, N, K, H);
    /* The experts' row ranges size host-side loops (one matmul per expert). */
    kdev_download(dev, b->off_h, b->offsets, ((size_t)E + 1) * sizeof(int));
    if ((rc = dev_check(dev, err)) || P <= 1)
        return rc;
    /* The per-expert counts go first, so that every rank knows what arrives. */
    int *scnt = b->ep_cnt;
    for (int e = 0; e < E; e++)
        scnt[e] = b->off_h[e + 1] - b->off_h[e];
    rc = comm_all_to_all(ep, scnt, b->ep_cnt + E, (size_t)El, COMM_I32, err);
    if (rc)
        return rc;
    b->ep_off[0] = 0;
    for (int i = 0; i < El; i++) {
        int n = 0;
        for (int j = 0; j < P; j++)
            n += rcnt(c, b, j, i);
        b->ep_off[i + 1] = b->ep_off[i] + n;
    }
    size_t R = (size_t)b->ep_off[El], Hs = (size_t)H, Fm = (size_t)c->Fm;
    b->ep_rows = (int)R;
    float *stage, *y, *dx, *da, *du;
    if ((rc = grow(dev, &b->ep_buf, &b->ep_cap, R * (Hs + 3 * Fm), err)) ||
        (rc = ep_scratch(c, sc, R, &stage, &y, &dx, &da, &du, err)))
        return rc;
    b->xr = b->ep_buf;
    b->ur = b->xr + R * Hs;
    b->ar = b->ur + R * 2 * Fm;
    return 0;
}

/* One exchange of rows over the ep group with its own index arrays (exchange above). */
static int ep_exchange(comm *ep, const stack_cfg *c, const block *b, const float *send,
                       float *recv, int back, hearth_err *err)
{
    size_t *w = ep_index(c, err);
    if (!w)
        return HERR_NOMEM;
    int rc = exchange(ep, c, b, send, recv, back, w, err);
    free(w);
    return rc;
}

int moe_forward_dispatch(const stack_cfg *c, block *b, stack_scratch *sc, comm *ep,
                         hearth_err *err)
{
    return c->ep <= 1 ? 0 : ep_exchange(ep, c, b, b->xp, sc->ep_buf, 0, err);
}

int moe_forward_experts(const stack_cfg *c, block *b, stack_scratch *sc, hearth_err *err)
{
    if (c->ep <= 1) {
        return experts_forward(c, &b->p, b->off_h, c->E, b->xp, b->ue, b->ae, b->ye, err);
    }
    size_t *w = ep_index(c, err);
    if (!w)
        return HERR_NOMEM;
    float *stage = sc->ep_buf, *y = stage + (size_t)b->ep_rows * c->H;
    regroup(c, b, b->xr, stage, 1, w);
    int rc = experts_forward(c, &b->p, b->ep_off, c->El, b->xr, b->ur, b->ar, y, err);
    regroup(c, b, stage, y, 0, w);
    free(w);
    return rc;
}

int moe_forward_combine(const stack_cfg *c, block *b, stack_scratch *sc, comm *ep,
                        float *out, int N, hearth_err *err)
{
    const block_params *p = &b->p;
    int H = c->H, K = c->K, Fs = c->Fs;
    if (c->ep > 1) {
        int rc = ep_exchange(ep, c, b, sc->ep_buf, b->ye, 1, err);
        if (rc)
            return rc;
    }
    kdev_moe_unpermute_forward(c->dev, out, b->ye, b->topk_w, b->slot_row, N, K, H);
    if (Fs > 0) {
        int rc = fp8_linear_forward(c->dev, p->fp8, FP8_SHARED_FC1, 0, N, b->us, b->h2, p->sh_fc1_w,
                                    NULL, N, H, 2 * Fs, err);
        if (rc)
            return rc;
        kdev_swiglu_forward(c->dev, b->as, b->us, N, Fs);
        if ((rc = fp8_linear_forward(c->dev, p->fp8, FP8_SHARED_FC2, 0, N, sc->shared_out, b->as,
                                     p->sh_fc2_w, NULL, N, Fs, H, err)))
            return rc;
        kdev_accumulate(c->dev, out, sc->shared_out, (size_t)N * H);
    }
    return 0;
}

int moe_backward_unpermute(const stack_cfg *c, block *b, stack_scratch *sc,
                           const float *dout, int N, hearth_err *err)
{
    int H = c->H, K = c->K;
    size_t nk = (size_t)N * K;
    zero(c->dev, sc->dye, nk * H);
    zero(c->dev, sc->dtopk, nk);
    kdev_moe_unpermute_backward(c->dev, sc->dye, sc->dtopk, dout, b->ye, b->topk_w,
                                b->slot_row, N, K, H);
    if (c->ep <= 1)
        return 0;
    float *stage, *dy, *dx, *da, *du;
    return ep_scratch(c, sc, (size_t)b->ep_rows, &stage, &dy, &dx, &da, &du, err);
}

int moe_backward_dispatch(const stack_cfg *c, block *b, stack_scratch *sc, comm *ep,
                          hearth_err *err)
{
    return c->ep <= 1 ? 0 : ep_exchange(ep, c, b, sc->dye, sc->ep_buf, 0, err);
}

int moe_backward_experts(const stack_cfg *c, block *b, stack_scratch *sc, int N,
                         hearth_err *err)
{
    size_t H = (size_t)c->H, Fm = (size_t)c->Fm;
    if (c->ep <= 1) {
        size_t nk = (size_t)N * c->K;
        zero(c->dev, sc->dae, nk * Fm);
        zero(c->dev, sc->due, nk * 2 * Fm);
        zero(c->dev, sc->dxp, nk * H);
        return experts_backward(c, b, b->off_h, c->E, sc->dye, b->xp, b->ue, b->ae,
                                sc->dae, sc->due, sc->dxp, err);
    }
    size_t R = (size_t)b->ep_rows;
    float *stage, *dy, *dx, *da, *du;
    int rc = ep_scratch(c, sc, R, &stage, &dy, &dx, &da, &du, err);
    if (rc)
        return rc;
    size_t *w = ep_index(c, err);
    if (!w)
        return HERR_NOMEM;
    regroup(c, b, dy, stage, 1, w);
    zero(c->dev, da, R * Fm);
    zero(c->dev, du, R * 2 * Fm);
    zero(c->dev, dx, R * H);
    rc = experts_backward(c, b, b->ep_off, c->El, dy, b->xr, b->ur, b->ar, da, du, dx, err);
    regroup(c, b, stage, dx, 0, w);
    free(w);
    return rc;
}

int moe_backward_combine(const stack_cfg *c, block *b, stack_scratch *sc, comm *ep,
                         const float *dout, float *dh, int N, float aux_scale,
                         hearth_err *err)
{
    const block_params *p = &b->p, *g = &b->g;
    int H = c->H, E = c->E, K = c->K, Fs = c->Fs;
    if (c->ep > 1) {
        int rc = ep_exchange(ep, c, b, sc->ep_buf, sc->dxp, 1, err);
        if (rc)
            return rc;
    }
    kdev_moe_permute_backward(c->dev, dh, sc->dxp, b->row_src, N, K, H);

    zero(c->dev, sc->dlogits, (size_t)N * E);
    kdev_moe_router_backward(c->dev, sc->dlogits, sc->dtopk, b->cp ? 0.0f : aux_scale,
                             b->probs, b->topk_idx, b->topk_w, N, E, K);
    if (b->cp)
        cp_aux_backward(b, sc->dlogits, aux_scale, N, E);
    int rc = fp8_linear_backward(c->dev, p->fp8, FP8_ROUTER, 0, dh, g->router_w, NULL, sc->dlogits,
                                 b->h2, p->router_w, N, H, E, err);
    if (rc)
        return rc;

    if (Fs > 0) {
        zero(c->dev, sc->da, (size_t)N * Fs);
        if ((rc = fp8_linear_backward(c->dev, p->fp8, FP8_SHARED_FC2, 0, sc->da, g->sh_fc2_w, NULL,
                                      dout, b->as, p->sh_fc2_w, N, Fs, H, err)))
            return rc;
        zero(c->dev, sc->du, (size_t)N * 2 * Fs);
        kdev_swiglu_backward(c->dev, sc->du, sc->da, b->us, N, Fs);
        if ((rc = fp8_linear_backward(c->dev, p->fp8, FP8_SHARED_FC1, 0, dh, g->sh_fc1_w, NULL,
                                      sc->du, b->h2, p->sh_fc1_w, N, H, 2 * Fs, err)))
            return rc;
    }
    return 0;
}

/* ---- the layer in one go --------------------------------------------------------------- */

int moe_forward(const stack_cfg *c, block *b, stack_scratch *sc, comm *ep, float *out,
                int N, double *aux_out, hearth_err *err)
{
    int rc;
    if ((rc = moe_forward_route(c, b, sc, ep, N, err)) ||
        (rc = moe_forward_dispatch(c, b, sc, ep, err)) ||
        (rc = moe_forward_experts(c, b, sc, err)) ||
        (rc = moe_forward_combine(c, b, sc, ep, out, N, err)))
        return rc;
    *aux_out = b->aux;
    return 0;
}

int moe_backward(const stack_cfg *c, block *b, stack_scratch *sc, comm *ep,
                 const float *dout, float *dh, int N, float aux_scale, hearth_err *err)
{
    int rc;
    if ((rc = moe_backward_unpermute(c, b, sc, dout, N, err)) ||
        (rc = moe_backward_dispatch(c, b, sc, ep, err)) ||
        (rc = moe_backward_experts(c, b, sc, N, err)) ||
        (rc = moe_backward_combine(c, b, sc, ep, dout, dh, N, aux_scale, err)))
        return rc;
    return 0;
}
