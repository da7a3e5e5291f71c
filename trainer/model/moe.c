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
 * backward with weight aux_scale. */
#include <string.h>

#include "model/internal.h"

static void zero(float *x, size_t n)
{
    if (n)
        memset(x, 0, n * sizeof *x);
}

void moe_take(const stack_cfg *c, block *b, farena *fa, iarena *ia, int N)
{
    size_t n = (size_t)N, nk = n * c->K;
    b->logits = fa_take(fa, n * c->E);
    b->probs = fa_take(fa, n * c->E);
    b->topk_w = fa_take(fa, nk);
    b->topk_idx = ia_take(ia, nk);
    b->offsets = ia_take(ia, (size_t)c->E + 1);
    b->row_src = ia_take(ia, nk);
    b->slot_row = ia_take(ia, nk);
    b->xp = fa_take(fa, nk * c->H);
    b->ue = fa_take(fa, nk * 2 * c->Fm);
    b->ae = fa_take(fa, nk * c->Fm);
    b->ye = fa_take(fa, nk * c->H);
    b->us = c->Fs > 0 ? fa_take(fa, n * 2 * c->Fs) : NULL;
    b->as = c->Fs > 0 ? fa_take(fa, n * c->Fs) : NULL;
}

void moe_take_scratch(const stack_cfg *c, stack_scratch *sc, farena *fa, int N)
{
    size_t n = (size_t)N, nk = n * c->K;
    sc->dye = fa_take(fa, nk * c->H);
    sc->dae = fa_take(fa, nk * c->Fm);
    sc->due = fa_take(fa, nk * 2 * c->Fm);
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

double moe_forward(const stack_cfg *c, block *b, stack_scratch *sc, float *out, int N)
{
    const block_params *p = &b->p;
    int H = c->H, E = c->E, K = c->K, Fm = c->Fm, Fs = c->Fs;
    float aux = 0;

    kcpu_matmul_forward(b->logits, b->h2, p->router_w, NULL, N, H, E);
    kcpu_moe_router_forward(b->topk_idx, b->topk_w, b->probs, &aux, b->logits, N, E, K);
    if (b->pin)
        aux = pin_routing(b, N, E, K);
    kcpu_moe_plan(b->offsets, b->row_src, b->slot_row, b->topk_idx, N, E, K);
    kcpu_moe_permute_forward(b->xp, b->h2, b->row_src, N, K, H);
    for (int e = 0; e < E; e++) {
        size_t r0 = (size_t)b->offsets[e];
        int n = b->offsets[e + 1] - b->offsets[e];
        if (n == 0)
            continue;
        const float *w1 = p->exp_fc1_w + (size_t)e * 2 * Fm * H;
        const float *w2 = p->exp_fc2_w + (size_t)e * H * Fm;
        kcpu_matmul_forward(b->ue + r0 * 2 * Fm, b->xp + r0 * H, w1, NULL, n, H, 2 * Fm);
        kcpu_swiglu_forward(b->ae + r0 * Fm, b->ue + r0 * 2 * Fm, n, Fm);
        kcpu_matmul_forward(b->ye + r0 * H, b->ae + r0 * Fm, w2, NULL, n, Fm, H);
    }
    kcpu_moe_unpermute_forward(out, b->ye, b->topk_w, b->slot_row, N, K, H);
    if (Fs > 0) {
        kcpu_matmul_forward(b->us, b->h2, p->sh_fc1_w, NULL, N, H, 2 * Fs);
        kcpu_swiglu_forward(b->as, b->us, N, Fs);
        kcpu_matmul_forward(sc->shared_out, b->as, p->sh_fc2_w, NULL, N, Fs, H);
        kcpu_accumulate(out, sc->shared_out, (size_t)N * H);
    }
    return aux;
}

void moe_backward(const stack_cfg *c, block *b, stack_scratch *sc, const float *dout,
                  float *dh, int N, float aux_scale)
{
    const block_params *p = &b->p, *g = &b->g;
    int H = c->H, E = c->E, K = c->K, Fm = c->Fm, Fs = c->Fs;
    size_t nk = (size_t)N * K;

    zero(sc->dye, nk * H);
    zero(sc->dtopk, nk);
    kcpu_moe_unpermute_backward(sc->dye, sc->dtopk, dout, b->ye, b->topk_w, b->slot_row, N,
                                K, H);
    zero(sc->dae, nk * Fm);
    zero(sc->due, nk * 2 * Fm);
    zero(sc->dxp, nk * H);
    for (int e = 0; e < E; e++) {
        size_t r0 = (size_t)b->offsets[e];
        int n = b->offsets[e + 1] - b->offsets[e];
        if (n == 0)
            continue;
        size_t o1 = (size_t)e * 2 * Fm * H, o2 = (size_t)e * H * Fm;
        kcpu_matmul_backward(sc->dae + r0 * Fm, g->exp_fc2_w ? g->exp_fc2_w + o2 : NULL, NULL,
                             sc->dye + r0 * H, b->ae + r0 * Fm, p->exp_fc2_w + o2, n, Fm, H);
        kcpu_swiglu_backward(sc->due + r0 * 2 * Fm, sc->dae + r0 * Fm, b->ue + r0 * 2 * Fm, n,
                             Fm);
        kcpu_matmul_backward(sc->dxp + r0 * H, g->exp_fc1_w ? g->exp_fc1_w + o1 : NULL, NULL,
                             sc->due + r0 * 2 * Fm, b->xp + r0 * H, p->exp_fc1_w + o1, n, H,
                             2 * Fm);
    }
    kcpu_moe_permute_backward(dh, sc->dxp, b->row_src, N, K, H);

    zero(sc->dlogits, (size_t)N * E);
    kcpu_moe_router_backward(sc->dlogits, sc->dtopk, aux_scale, b->probs, b->topk_idx,
                             b->topk_w, N, E, K);
    kcpu_matmul_backward(dh, g->router_w, NULL, sc->dlogits, b->h2, p->router_w, N, H, E);

    if (Fs > 0) {
        zero(sc->da, (size_t)N * Fs);
        kcpu_matmul_backward(sc->da, g->sh_fc2_w, NULL, dout, b->as, p->sh_fc2_w, N, Fs, H);
        zero(sc->du, (size_t)N * 2 * Fs);
        kcpu_swiglu_backward(sc->du, sc->da, b->us, N, Fs);
        kcpu_matmul_backward(dh, g->sh_fc1_w, NULL, sc->du, b->h2, p->sh_fc1_w, N, H, 2 * Fs);
    }
}
