/* gpt_gpu_step.cu - forward, backward and optimizer step of the GPU decoder (gpt_gpu.h):
 * the sequence of kcuda calls over the arena that gpt_gpu.cu lays out. */
#include "gpu/gpt_gpu_internal.h"
#include "gpu/gpt_gpu_kernels.h"

/* ---- forward ----------------------------------------------------------------------- */

#define K(call, what)                                                                   \
    do {                                                                                \
        if ((rc = gg_k(g, (call), what)))                                               \
            return rc;                                                                  \
    } while (0)
#define CU(call, what)                                                                  \
    do {                                                                                \
        if ((rc = gg_cuda(g, (call), what)))                                            \
            return rc;                                                                  \
    } while (0)

static const kcuda_bf16 *W(const gpt_gpu *g, const gg_tensor *t) { return g->p16 + t->off; }

/* Forward of micro batch `micro`; adds its loss sum into *loss_acc. */
static int forward(gpt_gpu *g, int micro)
{
    const gpt_gpu_config *c = &g->c;
    int N = g->N, C = c->hidden, F = c->ffn, V = g->Vp, H = c->heads, D = g->D, rc;
    float eps = c->norm_eps;
    const int *ids = g->ids + (size_t)micro * N, *tgt = g->tgt + (size_t)micro * N;

    K(kcuda_embedding_forward_bf16(g->kc, g->tok, ids, W(g, &g->t[g->t_embed]), N, C), "embedding");
    K(kcuda_embedding_forward_bf16(g->kc, g->pos, g->pos_ids, W(g, &g->t[g->t_pos]), N, C),
      "positions");
    for (int l = 0; l < c->layers; l++) {
        gg_layer *y = &g->L[l];
        /* resid = previous residual stream + previous MLP output (tokens + positions for
         * the first block), normalised in the same pass. */
        const kcuda_bf16 *x = l ? g->L[l - 1].mid : g->tok, *r = l ? g->tmp : g->pos;
        K(kcuda_residual_layernorm_forward_bf16(g->kc, y->ln1, y->resid, y->mean1, y->rstd1, x, r,
                                                W(g, lt(g, l, T_LN1W)), W(g, lt(g, l, T_LN1B)),
                                                N, C, eps), "ln1");
        /* q, k, v as three GEMMs over the row blocks of the fused weight: attention wants
         * each contiguous. */
        const kcuda_bf16 *wqkv = W(g, lt(g, l, T_QKVW)), *bqkv = W(g, lt(g, l, T_QKVB));
        kcuda_bf16 *qkv[3] = {y->q, y->k, y->v};
        for (int j = 0; j < 3; j++)
            K(kcuda_matmul_forward_bf16(g->kc, qkv[j], y->ln1, wqkv + (size_t)j * C * C,
                                        bqkv + (size_t)j * C, N, C, C), "qkv");
        K(kcuda_attention_forward_bf16(g->kc, y->att, y->lse, y->q, y->k, y->v, g->cu,
                                       c->micro_batch, c->seq_len, H, H, D, 1), "attention");
        K(kcuda_matmul_forward_bf16(g->kc, g->tmp, y->att, W(g, lt(g, l, T_PROJW)),
                                    W(g, lt(g, l, T_PROJB)), N, C, C), "proj");
        K(kcuda_residual_layernorm_forward_bf16(g->kc, y->ln2, y->mid, y->mean2, y->rstd2,
                                                y->resid, g->tmp, W(g, lt(g, l, T_LN2W)),
                                                W(g, lt(g, l, T_LN2B)), N, C, eps), "ln2");
        K(kcuda_matmul_forward_bf16(g->kc, y->fc1, y->ln2, W(g, lt(g, l, T_FC1W)),
                                    W(g, lt(g, l, T_FC1B)), N, C, F), "fc1");
        K(kcuda_gelu_forward_bf16(g->kc, y->gel, y->fc1, (size_t)N * F, 0), "gelu");
        K(kcuda_matmul_forward_bf16(g->kc, g->tmp, y->gel, W(g, lt(g, l, T_FC2W)),
                                    W(g, lt(g, l, T_FC2B)), N, F, C), "fc2");
    }
    K(kcuda_residual_layernorm_forward_bf16(g->kc, g->lnf, g->resid_f, g->meanf, g->rstdf,
                                            g->L[c->layers - 1].mid, g->tmp,
                                            W(g, &g->t[g->t_lnfw]), W(g, &g->t[g->t_lnfb]), N, C,
                                            eps), "final norm");
    /* Logits over the padded width Vp; the padding columns get GG_PAD_LOGIT. */
    K(kcuda_matmul_forward_bf16(g->kc, g->logits, g->lnf, W(g, &g->t[g->t_embed]), g->head_bias,
                                N, C, V), "lm head");
    K(kcuda_ce_forward_bf16(g->kc, g->losses, g->lse_ce, g->logits, tgt, N, V, -1),
      "cross-entropy");
    CU(ggk_sum_acc(g->stream, g->loss_acc, g->losses, N), "loss sum");
    return 0;
}

/* ---- backward ---------------------------------------------------------------------- */

static float *G(const gpt_gpu *g, const gg_tensor *t) { return g->g32 + t->off; }
static kcuda_bf16 *G16(const gpt_gpu *g, const gg_tensor *t) { return g->g16 + t->off; }

/* Linear backward: dinp += dout.W (bf16), dW (bf16 arena) += dout^T.inp, fp32 dbias. */
static int linear_backward(gpt_gpu *g, kcuda_bf16 *dinp, const gg_tensor *w, const gg_tensor *bias,
                           size_t row0, const kcuda_bf16 *dout, const kcuda_bf16 *inp, int M,
                           int Kd, int Nd)
{
    int rc;
    K(kcuda_matmul_backward_bf16(g->kc, dinp, G16(g, w) + row0 * Kd, NULL, dout, inp,
                                 W(g, w) + row0 * Kd, M, Kd, Nd), "linear backward");
    if (bias)
        CU(ggk_bias_grad(g->stream, G(g, bias) + row0, dout, g->bias_part, M, Nd), "bias grad");
    return 0;
}

/* Backward of the micro batch whose forward just ran (activations in the arena). */
static int backward(gpt_gpu *g, int micro)
{
    const gpt_gpu_config *c = &g->c;
    int N = g->N, C = c->hidden, F = c->ffn, V = g->Vp, H = c->heads, D = g->D, rc;
    size_t NC = (size_t)N * C * sizeof(kcuda_bf16), NF = (size_t)N * F * sizeof(kcuda_bf16);
    const int *ids = g->ids + (size_t)micro * N, *tgt = g->tgt + (size_t)micro * N;
    cudaStream_t s = g->stream;

    /* Cross-entropy writes dlogits over the logits (in place). */
    K(kcuda_ce_backward_bf16(g->kc, g->logits, g->logits, g->lse_ce, tgt, g->dlosses, N, V, -1),
      "cross-entropy backward");
    CU(cudaMemsetAsync(g->dtmp, 0, NC, s), "memset");
    K(kcuda_matmul_backward_bf16(g->kc, g->dtmp, G16(g, &g->t[g->t_embed]), NULL, g->logits,
                                 g->lnf, W(g, &g->t[g->t_embed]), N, C, V), "lm head backward");
    CU(cudaMemsetAsync(g->dresid, 0, NC, s), "memset");
    K(kcuda_layernorm_backward_bf16(g->kc, g->dresid, G(g, &g->t[g->t_lnfw]),
                                    G(g, &g->t[g->t_lnfb]), g->dtmp, g->resid_f,
                                    W(g, &g->t[g->t_lnfw]), g->meanf, g->rstdf, N, C),
      "final norm backward");
    for (int l = c->layers - 1; l >= 0; l--) {
        gg_layer *y = &g->L[l];
        /* dresid = d(mid + mlp out): the MLP's output gradient and mid's, both. */
        CU(cudaMemsetAsync(g->dgel, 0, NF, s), "memset");
        if ((rc = linear_backward(g, g->dgel, lt(g, l, T_FC2W), lt(g, l, T_FC2B), 0, g->dresid,
                                  y->gel, N, F, C)))
            return rc;
        CU(cudaMemsetAsync(g->dfc1, 0, NF, s), "memset");
        K(kcuda_gelu_backward_bf16(g->kc, g->dfc1, g->dgel, y->fc1, (size_t)N * F, 0),
          "gelu backward");
        CU(cudaMemsetAsync(g->dtmp, 0, NC, s), "memset");
        if ((rc = linear_backward(g, g->dtmp, lt(g, l, T_FC1W), lt(g, l, T_FC1B), 0, g->dfc1,
                                  y->ln2, N, C, F)))
            return rc;
        K(kcuda_layernorm_backward_bf16(g->kc, g->dresid, G(g, lt(g, l, T_LN2W)),
                                        G(g, lt(g, l, T_LN2B)), g->dtmp, y->mid,
                                        W(g, lt(g, l, T_LN2W)), y->mean2, y->rstd2, N, C),
          "ln2 backward");
        /* dresid = d mid = d(resid + attention out). */
        CU(cudaMemsetAsync(g->dtmp, 0, NC, s), "memset");
        if ((rc = linear_backward(g, g->dtmp, lt(g, l, T_PROJW), lt(g, l, T_PROJB), 0, g->dresid,
                                  y->att, N, C, C)))
            return rc;
        CU(cudaMemsetAsync(g->dq, 0, NC, s), "memset");
        CU(cudaMemsetAsync(g->dk, 0, NC, s), "memset");
        CU(cudaMemsetAsync(g->dv, 0, NC, s), "memset");
        K(kcuda_attention_backward_bf16(g->kc, g->dq, g->dk, g->dv, g->dtmp, y->q, y->k, y->v,
                                        y->att, y->lse, g->cu, c->micro_batch, c->seq_len, H, H,
                                        D, 1), "attention backward");
        CU(cudaMemsetAsync(g->dtmp, 0, NC, s), "memset");
        const kcuda_bf16 *dqkv[3] = {g->dq, g->dk, g->dv};
        for (int j = 0; j < 3; j++)
            if ((rc = linear_backward(g, g->dtmp, lt(g, l, T_QKVW), lt(g, l, T_QKVB),
                                      (size_t)j * C, dqkv[j], y->ln1, N, C, C)))
                return rc;
        K(kcuda_layernorm_backward_bf16(g->kc, g->dresid, G(g, lt(g, l, T_LN1W)),
                                        G(g, lt(g, l, T_LN1B)), g->dtmp, y->resid,
                                        W(g, lt(g, l, T_LN1W)), y->mean1, y->rstd1, N, C),
          "ln1 backward");
    }
    /* dresid = d(tokens + positions). */
    K(kcuda_embedding_backward_bf16(g->kc, G(g, &g->t[g->t_embed]), g->dresid, ids, N, C),
      "embedding backward");
    K(kcuda_embedding_backward_bf16(g->kc, G(g, &g->t[g->t_pos]), g->dresid, g->pos_ids, N, C),
      "positions backward");
    /* The GEMMs' bf16 gradients of this micro batch into the fp32 ones. */
    CU(ggk_flush_bf16_grads(s, g->g32, g->g16, g->P), "gradient flush");
    return 0;
}

/* ---- the step ---------------------------------------------------------------------- */

static int read_loss(gpt_gpu *g, int n_targets, double *loss)
{
    double sum = 0;
    int rc;
    CU(cudaMemcpyAsync(&sum, g->loss_acc, sizeof sum, cudaMemcpyDeviceToHost, g->stream),
       "read loss");
    CU(cudaStreamSynchronize(g->stream), "step");
    *loss = n_targets ? sum / n_targets : 0.0;
    return 0;
}

int gpt_gpu_forward(gpt_gpu *g, int micro, double *loss)
{
    int rc;
    if (gg_no_device(g))
        return KCUDA_EARG;
    if (micro < 0 || micro >= g->c.max_micro)
        return gg_fail(g, KCUDA_EARG, "micro batch %d out of range", micro);
    CU(cudaMemsetAsync(g->loss_acc, 0, sizeof(double), g->stream), "memset");
    if ((rc = forward(g, micro)))
        return rc;
    return read_loss(g, g->n_targets[micro], loss);
}

int gpt_gpu_forward_backward(gpt_gpu *g, int n_micro, double *loss)
{
    int rc, total = 0;
    if (gg_no_device(g))
        return KCUDA_EARG;
    if (n_micro < 1 || n_micro > g->c.max_micro)
        return gg_fail(g, KCUDA_EARG, "n_micro %d out of range [1,%d]", n_micro, g->c.max_micro);
    for (int i = 0; i < n_micro; i++)
        total += g->n_targets[i];
    cudaStream_t s = g->stream;
    CU(cudaMemsetAsync(g->loss_acc, 0, sizeof(double), s), "memset");
    CU(cudaMemsetAsync(g->g32, 0, g->P * sizeof(float), s), "memset");
    CU(cudaMemsetAsync(g->g16, 0, g->P * sizeof(kcuda_bf16), s), "memset");
    /* d loss / d token loss = 1 / (targets in the step); ignored rows are skipped by CE. */
    CU(ggk_fill_f32(s, g->dlosses, (size_t)g->N, total ? 1.0f / (float)total : 0.0f), "fill");
    for (int i = 0; i < n_micro; i++)
        if ((rc = forward(g, i)) || (rc = backward(g, i)))
            return rc;
    return loss ? read_loss(g, total, loss) : 0;
}

int gpt_gpu_update(gpt_gpu *g, const gpt_gpu_adamw *o, int step)
{
    int rc;
    const float *clip = NULL;
    if (gg_no_device(g))
        return KCUDA_EARG;
    if (o->max_norm > 0) {
        K(kcuda_multi_sumsq_f32(g->kc, g->sumsq, g->d_sumsq_desc, g->nt), "grad norm");
        K(kcuda_clip_factor(g->kc, g->clip, g->sumsq, o->max_norm), "clip factor");
        clip = g->clip;
    }
    K(kcuda_multi_adamw_update(g->kc, g->d_adam_desc, g->nt, clip, o->lr, o->beta1, o->beta2,
                               o->eps, o->weight_decay, step), "adamw");
    return 0;
}

int gpt_gpu_step(gpt_gpu *g, int n_micro, const gpt_gpu_adamw *opt, int step, double *loss)
{
    int rc = gpt_gpu_forward_backward(g, n_micro, NULL);
    if (rc || (rc = gpt_gpu_update(g, opt, step)))
        return rc;
    if (!loss)
        return 0;
    int total = 0;
    for (int i = 0; i < n_micro; i++)
        total += g->n_targets[i];
    return read_loss(g, total, loss);
}
