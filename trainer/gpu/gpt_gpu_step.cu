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
/* From here on the work is of kind GGP_x (the optional profile; nothing when off). */
#define MARK(x)                                                                         \
    do {                                                                                \
        if ((rc = gg_prof_mark(g, GGP_##x)))                                            \
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

    MARK(EMBED_FWD);
    K(kcuda_embedding_forward_bf16(g->kc, g->tok, ids, W(g, &g->t[g->t_embed]), N, C), "embedding");
    K(kcuda_embedding_forward_bf16(g->kc, g->pos, g->pos_ids, W(g, &g->t[g->t_pos]), N, C),
      "positions");
    for (int l = 0; l < c->layers; l++) {
        gg_layer *y = &g->L[l];
        /* resid = previous residual stream + previous MLP output (tokens + positions for
         * the first block), normalised in the same pass. */
        const kcuda_bf16 *x = l ? g->L[l - 1].mid : g->tok, *r = l ? g->tmp : g->pos;
        MARK(LN_FWD);
        K(kcuda_residual_layernorm_forward_bf16(g->kc, y->ln1, y->resid, y->mean1, y->rstd1, x, r,
                                                W(g, lt(g, l, T_LN1W)), W(g, lt(g, l, T_LN1B)),
                                                N, C, eps), "ln1");
        /* q, k, v as three GEMMs over the row blocks of the fused weight: attention wants
         * each contiguous. */
        const kcuda_bf16 *wqkv = W(g, lt(g, l, T_QKVW)), *bqkv = W(g, lt(g, l, T_QKVB));
        kcuda_bf16 *qkv[3] = {y->q, y->k, y->v};
        MARK(QKV_FWD);
        for (int j = 0; j < 3; j++)
            K(kcuda_matmul_forward_bf16(g->kc, qkv[j], y->ln1, wqkv + (size_t)j * C * C,
                                        bqkv + (size_t)j * C, N, C, C), "qkv");
        MARK(ATT_FWD);
        K(kcuda_attention_forward_bf16(g->kc, y->att, y->lse, y->q, y->k, y->v, g->cu,
                                       c->micro_batch, c->seq_len, H, H, D, 1), "attention");
        MARK(PROJ_FWD);
        K(kcuda_matmul_forward_bf16(g->kc, g->tmp, y->att, W(g, lt(g, l, T_PROJW)),
                                    W(g, lt(g, l, T_PROJB)), N, C, C), "proj");
        MARK(LN_FWD);
        K(kcuda_residual_layernorm_forward_bf16(g->kc, y->ln2, y->mid, y->mean2, y->rstd2,
                                                y->resid, g->tmp, W(g, lt(g, l, T_LN2W)),
                                                W(g, lt(g, l, T_LN2B)), N, C, eps), "ln2");
        MARK(FC1_FWD);
        K(kcuda_matmul_forward_bf16(g->kc, y->fc1, y->ln2, W(g, lt(g, l, T_FC1W)),
                                    W(g, lt(g, l, T_FC1B)), N, C, F), "fc1");
        MARK(GELU_FWD);
        K(kcuda_gelu_forward_bf16(g->kc, y->gel, y->fc1, (size_t)N * F, 0), "gelu");
        MARK(FC2_FWD);
        K(kcuda_matmul_forward_bf16(g->kc, g->tmp, y->gel, W(g, lt(g, l, T_FC2W)),
                                    W(g, lt(g, l, T_FC2B)), N, F, C), "fc2");
    }
    MARK(LN_FWD);
    K(kcuda_residual_layernorm_forward_bf16(g->kc, g->lnf, g->resid_f, g->meanf, g->rstdf,
                                            g->L[c->layers - 1].mid, g->tmp,
                                            W(g, &g->t[g->t_lnfw]), W(g, &g->t[g->t_lnfb]), N, C,
                                            eps), "final norm");
    /* Logits over the padded width Vp; the padding columns get GG_PAD_LOGIT. */
    MARK(HEAD_FWD);
    K(kcuda_matmul_forward_bf16(g->kc, g->logits, g->lnf, W(g, &g->t[g->t_embed]), g->head_bias,
                                N, C, V), "lm head");
    MARK(CE_FWD);
    K(kcuda_ce_forward_bf16(g->kc, g->losses, g->lse_ce, g->logits, tgt, N, V, -1),
      "cross-entropy");
    CU(ggk_sum_acc(g->stream, g->loss_acc, g->losses, N), "loss sum");
    return 0;
}

/* ---- backward ---------------------------------------------------------------------- */

static float *G(const gpt_gpu *g, const gg_tensor *t) { return g->g32 + t->off; }

/* Linear backward, rows [row0, row0 + Nd) of weight w (and bias):
 *   dinp = dout.W (dinp_acc = 0) or dinp += dout.W (bf16),
 *   dW += dout^T.inp straight into the fp32 gradient,
 *   dbias += column sums (fp32): written by the dW GEMM's epilogue into scratch and added
 *   (a vector of Nd), or, where cuBLASLt does not offer that epilogue, a separate
 *   two-pass reduction over dout.
 * Separate launches for dinp and dW, so that the profile can tell them apart. */
static int linear_backward(gpt_gpu *g, kcuda_bf16 *dinp, int dinp_acc, const gg_tensor *w,
                           const gg_tensor *bias, size_t row0, const kcuda_bf16 *dout,
                           const kcuda_bf16 *inp, int M, int Kd, int Nd, int k_dinp, int k_dw)
{
    int rc;
    const kcuda_bf16 *wt = W(g, w) + row0 * Kd;
    float *dw = G(g, w) + row0 * Kd;
    if ((rc = gg_prof_mark(g, k_dinp)))
        return rc;
    K(kcuda_matmul_backward_bf16_f32w(g->kc, dinp, dinp_acc, NULL, NULL, dout, inp, wt, M, Kd,
                                      Nd), "linear backward (dinp)");
    if ((rc = gg_prof_mark(g, k_dw)))
        return rc;
    if (bias && !g->no_bgradb) {
        rc = kcuda_matmul_backward_bf16_f32w(g->kc, NULL, 0, dw, g->bias_part, dout, inp, wt, M,
                                             Kd, Nd);
        if (rc == KCUDA_OK) {
            MARK(BIAS_GRAD);
            CU(ggk_add_f32(g->stream, G(g, bias) + row0, g->bias_part, Nd), "bias grad");
            return 0;
        }
        if (rc != KCUDA_ENOALGO && rc != KCUDA_ECUBLAS)
            return gg_k(g, rc, "linear backward (dW + bias)");
        g->no_bgradb = 1;   /* nothing was computed: the unfused path below */
    }
    K(kcuda_matmul_backward_bf16_f32w(g->kc, NULL, 0, dw, NULL, dout, inp, wt, M, Kd, Nd),
      "linear backward (dW)");
    if (bias) {
        MARK(BIAS_GRAD);
        CU(ggk_bias_grad(g->stream, G(g, bias) + row0, dout, g->bias_part, M, Nd), "bias grad");
    }
    return 0;
}

/* LayerNorm backward: dresid += the input gradient (kcuda), the weight and bias gradients
 * by ggk_ln_param_grad (a fast two-pass reduction) when the shape allows, else by kcuda. */
static int ln_backward(gpt_gpu *g, kcuda_bf16 *dresid, const gg_tensor *w, const gg_tensor *b,
                       const kcuda_bf16 *dout, const kcuda_bf16 *inp, const float *mean,
                       const float *rstd)
{
    int N = g->N, C = g->c.hidden, rc;
    int fast = ggk_ln_param_grad_ok(C, dout, inp);
    MARK(LN_BWD);
    K(kcuda_layernorm_backward_bf16(g->kc, dresid, fast ? NULL : G(g, w), fast ? NULL : G(g, b),
                                    dout, inp, W(g, w), mean, rstd, N, C), "layernorm backward");
    if (fast) {
        MARK(LN_PGRAD);
        CU(ggk_ln_param_grad(g->stream, G(g, w), G(g, b), dout, inp, mean, rstd, g->bias_part,
                             N, C), "layernorm parameter gradients");
    }
    return 0;
}

/* Backward of the micro batch whose forward just ran (activations in the arena).  The
 * GEMMs overwrite their dinp outputs (no zeroing); only the outputs of kernels that add
 * (layernorm into the residual gradient, attention) are zeroed first. */
static int backward(gpt_gpu *g, int micro)
{
    const gpt_gpu_config *c = &g->c;
    int N = g->N, C = c->hidden, F = c->ffn, V = g->Vp, H = c->heads, D = g->D, rc;
    size_t NC = (size_t)N * C * sizeof(kcuda_bf16);
    const int *ids = g->ids + (size_t)micro * N, *tgt = g->tgt + (size_t)micro * N;
    cudaStream_t s = g->stream;

    /* Cross-entropy writes dlogits over the logits (in place). */
    MARK(CE_BWD);
    K(kcuda_ce_backward_bf16(g->kc, g->logits, g->logits, g->lse_ce, tgt, g->dlosses, N, V, -1),
      "cross-entropy backward");
    if ((rc = linear_backward(g, g->dtmp, 0, &g->t[g->t_embed], NULL, 0, g->logits, g->lnf, N,
                              C, V, GGP_HEAD_DINP, GGP_HEAD_DW)))
        return rc;
    MARK(ZERO);
    CU(cudaMemsetAsync(g->dresid, 0, NC, s), "memset");
    if ((rc = ln_backward(g, g->dresid, &g->t[g->t_lnfw], &g->t[g->t_lnfb], g->dtmp,
                          g->resid_f, g->meanf, g->rstdf)))
        return rc;
    for (int l = c->layers - 1; l >= 0; l--) {
        gg_layer *y = &g->L[l];
        /* dresid = d(mid + mlp out): the MLP's output gradient and mid's, both. */
        if ((rc = linear_backward(g, g->dgel, 0, lt(g, l, T_FC2W), lt(g, l, T_FC2B), 0,
                                  g->dresid, y->gel, N, F, C, GGP_FC2_DINP, GGP_FC2_DW)))
            return rc;
        MARK(GELU_BWD);
        CU(ggk_gelu_backward_set(s, g->dfc1, g->dgel, y->fc1, (size_t)N * F), "gelu backward");
        if ((rc = linear_backward(g, g->dtmp, 0, lt(g, l, T_FC1W), lt(g, l, T_FC1B), 0, g->dfc1,
                                  y->ln2, N, C, F, GGP_FC1_DINP, GGP_FC1_DW)))
            return rc;
        if ((rc = ln_backward(g, g->dresid, lt(g, l, T_LN2W), lt(g, l, T_LN2B), g->dtmp, y->mid,
                              y->mean2, y->rstd2)))
            return rc;
        /* dresid = d mid = d(resid + attention out). */
        if ((rc = linear_backward(g, g->dtmp, 0, lt(g, l, T_PROJW), lt(g, l, T_PROJB), 0,
                                  g->dresid, y->att, N, C, C, GGP_PROJ_DINP, GGP_PROJ_DW)))
            return rc;
        MARK(ZERO);
        CU(cudaMemsetAsync(g->dq, 0, 3 * NC, s), "memset");   /* dq, dk, dv: adjacent */
        MARK(ATT_BWD);
        K(kcuda_attention_backward_bf16(g->kc, g->dq, g->dk, g->dv, g->dtmp, y->q, y->k, y->v,
                                        y->att, y->lse, g->cu, c->micro_batch, c->seq_len, H, H,
                                        D, 1), "attention backward");
        /* d ln1 = sum over q, k, v: the first GEMM overwrites, the others add. */
        const kcuda_bf16 *dqkv[3] = {g->dq, g->dk, g->dv};
        for (int j = 0; j < 3; j++)
            if ((rc = linear_backward(g, g->dtmp, j > 0, lt(g, l, T_QKVW), lt(g, l, T_QKVB),
                                      (size_t)j * C, dqkv[j], y->ln1, N, C, C, GGP_QKV_DINP,
                                      GGP_QKV_DW)))
                return rc;
        if ((rc = ln_backward(g, g->dresid, lt(g, l, T_LN1W), lt(g, l, T_LN1B), g->dtmp,
                              y->resid, y->mean1, y->rstd1)))
            return rc;
    }
    /* dresid = d(tokens + positions). */
    MARK(EMBED_BWD);
    K(kcuda_embedding_backward_bf16(g->kc, G(g, &g->t[g->t_embed]), g->dresid, ids, N, C),
      "embedding backward");
    K(kcuda_embedding_backward_bf16(g->kc, G(g, &g->t[g->t_pos]), g->dresid, g->pos_ids, N, C),
      "positions backward");
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
    MARK(ZERO);
    CU(cudaMemsetAsync(g->loss_acc, 0, sizeof(double), g->stream), "memset");
    if ((rc = forward(g, micro)) || (rc = gg_prof_mark(g, GGP_IDLE)))
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
    MARK(ZERO);
    CU(cudaMemsetAsync(g->loss_acc, 0, sizeof(double), s), "memset");
    CU(cudaMemsetAsync(g->g32, 0, g->P * sizeof(float), s), "memset");
    /* d loss / d token loss = 1 / (targets in the step); ignored rows are skipped by CE. */
    CU(ggk_fill_f32(s, g->dlosses, (size_t)g->N, total ? 1.0f / (float)total : 0.0f), "fill");
    for (int i = 0; i < n_micro; i++)
        if ((rc = forward(g, i)) || (rc = backward(g, i)))
            return rc;
    MARK(IDLE);
    return loss ? read_loss(g, total, loss) : 0;
}

int gpt_gpu_update(gpt_gpu *g, const gpt_gpu_adamw *o, int step)
{
    int rc;
    const float *clip = NULL;
    if (gg_no_device(g))
        return KCUDA_EARG;
    if (o->max_norm > 0) {
        MARK(CLIP);
        K(kcuda_multi_sumsq_f32(g->kc, g->sumsq, g->d_sumsq_desc, g->nt), "grad norm");
        K(kcuda_clip_factor(g->kc, g->clip, g->sumsq, o->max_norm), "clip factor");
        clip = g->clip;
    }
    MARK(ADAMW);
    K(kcuda_multi_adamw_update(g->kc, g->d_adam_desc, g->nt, clip, o->lr, o->beta1, o->beta2,
                               o->eps, o->weight_decay, step), "adamw");
    MARK(IDLE);
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
