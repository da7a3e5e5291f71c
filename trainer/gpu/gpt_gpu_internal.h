/* gpt_gpu_internal.h - what the files of the GPU decoder step share: the model's layout
 * (tensor table, activation arena) and the error helpers.  Not part of the API. */
#ifndef HEARTH_GPT_GPU_INTERNAL_H
#define HEARTH_GPT_GPU_INTERNAL_H

#include <cuda_runtime.h>
#include <math.h>

#include "cuda/kcuda.h"
#include "gpu/gpt_gpu.h"

/* Every tensor starts on a multiple of this many elements: 256-byte aligned fp32 and
 * 128-byte aligned bf16 (cuBLASLt's fast paths, the 16-byte vector loads of kernels). */
#define GG_ALIGN_ELEMS 64
#define GG_WORKSPACE (64u << 20)
/* The LM head computes Vp = vocab rounded up to this many logits per row, so that its
 * GEMMs see 128-byte aligned rows (an odd vocabulary such as GPT-2's 50257 leaves cuBLASLt
 * only its slow unaligned kernels).  The embedding table has Vp rows in memory: rows past
 * the vocabulary are zero and never updated; the head adds a bias of -inf to their logits
 * (0 elsewhere), which the fused cross-entropy counts as exp = 0 (it treats -inf as its
 * own padding), so the softmax, the loss and every gradient are the unpadded ones: those
 * columns' dlogits are exactly 0.  (A large finite value would not do: the kernel's
 * exp2(x * log2 e - m * log2 e) of two huge equal values is a rounding error, not 0.) */
#define GG_VOCAB_ALIGN 64
#define GG_PAD_LOGIT (-INFINITY)

typedef struct {
    char name[96];
    size_t off, n;
    int ndim;
    int64_t dims[2];
    int decay;
} gg_tensor;

/* Parameter tensor indices of one block (into gpt_gpu.t). */
enum { T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_PROJW, T_PROJB, T_LN2W, T_LN2B, T_FC1W, T_FC1B,
       T_FC2W, T_FC2B, T_PER_LAYER };

/* Kinds of work the step's profile (gpt_gpu_profile.cu) times; names there, same order. */
enum {
    GGP_IDLE = -1,   /* end of an entry point: the time up to the next mark is not counted */
    GGP_EMBED_FWD, GGP_LN_FWD, GGP_QKV_FWD, GGP_ATT_FWD, GGP_PROJ_FWD, GGP_FC1_FWD,
    GGP_GELU_FWD, GGP_FC2_FWD, GGP_HEAD_FWD, GGP_CE_FWD, GGP_CE_BWD, GGP_HEAD_DINP,
    GGP_HEAD_DW, GGP_LN_BWD, GGP_FC2_DINP, GGP_FC2_DW, GGP_FC1_DINP, GGP_FC1_DW,
    GGP_PROJ_DINP, GGP_PROJ_DW, GGP_QKV_DINP, GGP_QKV_DW, GGP_BIAS_GRAD, GGP_GELU_BWD,
    GGP_ATT_BWD, GGP_EMBED_BWD, GGP_ZERO, GGP_CLIP, GGP_ADAMW, GGP_LN_PGRAD, GGP_COUNT
};
typedef struct gg_prof gg_prof;

/* What the forward keeps for the backward, per block. */
typedef struct {
    kcuda_bf16 *resid, *ln1, *q, *k, *v, *att, *mid, *ln2, *fc1, *gel;
    float *mean1, *rstd1, *lse, *mean2, *rstd2;
} gg_layer;

struct gpt_gpu {
    gpt_gpu_config c;
    int D, N;                 /* head_dim, tokens per micro batch */
    int Vp;                   /* vocab rounded up to GG_VOCAB_ALIGN: the LM head's width */
    cudaStream_t stream;
    kcuda_ctx *kc;
    char msg[320];

    int nt;
    gg_tensor *t;
    int t_embed, t_pos, t_lnfw, t_lnfb, t_layer0;
    size_t P;                 /* elements of every parameter-shaped arena */
    float *p32, *g32, *m, *v;
    kcuda_bf16 *p16;
    kcuda_tensor_f32 *d_sumsq_desc;   /* device descriptor arrays */
    kcuda_adamw_tensor *d_adam_desc;

    void *arena;
    size_t arena_bytes, state_bytes;
    gg_layer *L;
    kcuda_bf16 *resid_f, *lnf, *logits, *tok, *pos, *tmp;
    kcuda_bf16 *dresid, *dtmp, *dq, *dk, *dv, *dgel, *dfc1;
    kcuda_bf16 *head_bias;    /* [Vp]: 0 for the vocabulary, -inf past it */
    float *meanf, *rstdf, *losses, *lse_ce, *dlosses, *bias_part, *clip;
    int *ids, *tgt, *pos_ids, *cu;
    double *loss_acc, *sumsq;
    int *n_targets;           /* host, per micro batch slot */
    gg_prof *prof;            /* NULL unless gpt_gpu_profile turned timing on */
    int no_bgradb;            /* separate bias-gradient pass: turned off by the caller, or
                               * cuBLASLt refused the fused epilogue once (don't ask again) */
};

/* The message (printf format) into g->msg; returns code. */
int gg_fail(gpt_gpu *g, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* 0, or KCUDA_ECUDA with `what` and the CUDA error's text. */
int gg_cuda(gpt_gpu *g, cudaError_t e, const char *what);
/* A kcuda call's result, with the kernel's message prefixed by what was being done. */
int gg_k(gpt_gpu *g, int rc, const char *what);
/* Nonzero (with the message) when g is only a plan (gpt_gpu_plan): no device state. */
int gg_no_device(gpt_gpu *g);

/* Profile: from here on the stream's work is of `kind` (GGP_*); nothing when off. */
int gg_prof_mark(gpt_gpu *g, int kind);
void gg_prof_free(gpt_gpu *g);

/* Parameter tensor k (T_*) of block l. */
static inline const gg_tensor *lt(const gpt_gpu *g, int l, int k)
{
    return &g->t[g->t_layer0 + l * T_PER_LAYER + k];
}

#endif
