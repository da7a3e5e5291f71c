/* internal.h - the model's internal structures, shared by the files of trainer/model/.
 *
 * Not part of the model API (model.h); tests include it to reach the pieces worth testing
 * on their own (the ViT window index, the projector output m->img_feat).
 *
 * Layout of the work:
 *   model.c      lifecycle (single-rank, local models of one rank, clones), the
 *                single-rank forward/backward composed of the encoder and stage APIs
 *   model_reg.c  the parameter table: tensors, shards, initialisation
 *   block.c      one transformer block (encoder and decoder alike) and a stack of them
 *   moe.c        the mixture-of-experts MLP of a block
 *   encoder.c    ViT: patch embedding, window reordering, 2-D RoPE, the encoder stack;
 *                the encoder API of model_par.h
 *   projector.c  patch merger
 *   decoder.c    a decoder pipeline stage: embedding, image fill, positions, decoder
 *                stack, final norm (model_stage_* of model_par.h)
 *   head.c       the vocabulary-parallel LM head and cross-entropy
 *   cp_attn.c    attention under context parallelism (the key/value ring)
 *   chunk_attn.c attention of one sequence chunk against the cached earlier chunks
 *   positions.c  mRoPE positions, the ViT window index
 */
#ifndef HEARTH_MODEL_INTERNAL_H
#define HEARTH_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "kdev.h"
#include "kernels.h"
#include "model/fp8.h"
#include "model/model.h"
#include "model/model_par.h"

/* ---- the device ----------------------------------------------------------------------
 * Every tensor of the model (parameters, gradients, activations, and the per-batch index
 * arrays and RoPE tables that kernels read) lives on the model's device (kdev.h); the
 * index arrays and tables are built in host arrays and uploaded.  Device calls are
 * enqueued without checking each one; dev_check turns the device's first failure into
 * the model's error at the end of each step of work (kdev_status). */
int dev_check(kdev *dev, hearth_err *err);
/* kdev_alloc / kdev_release of n floats or ints, with the model's error message. */
int dev_alloc(kdev *dev, void **p, size_t bytes, const char *what, hearth_err *err);
/* Uploads n ints (or floats) of a host array into a device array. */
int dev_upload(kdev *dev, void *dst, const void *host, size_t bytes, hearth_err *err);
/* The longest sequence of the boundaries cu[0..nseq] (what GPU attention sizes its grid
 * with). */
int max_seqlen(const int *cu, int nseq);

/* ---- bump allocation of activation buffers ------------------------------------------
 * Buffers are carved from one allocation in two passes: a sizing pass with base == NULL
 * (every take returns NULL and only counts), then the real pass.  Each take is rounded up
 * to 16 elements, so buffers start 64 bytes apart from the allocation's base. */
typedef struct {
    float *base;
    size_t used;
} farena;
typedef struct {
    int *base;
    size_t used;
} iarena;

static inline float *fa_take(farena *a, size_t n)
{
    float *p = a->base ? a->base + a->used : NULL;
    a->used += (n + 15) & ~(size_t)15;
    return p;
}
/* The same over activation memory of esz-byte elements (kdev_act_bytes). */
typedef struct {
    char *base;
    size_t used, esz;
} aarena;
static inline float *aa_take(aarena *a, size_t n)
{
    float *p = a->base ? (float *)(a->base + a->used * a->esz) : NULL;
    a->used += (n + 15) & ~(size_t)15;
    return p;
}
static inline int *ia_take(iarena *a, size_t n)
{
    int *p = a->base ? a->base + a->used : NULL;
    a->used += (n + 15) & ~(size_t)15;
    return p;
}

/* ---- one transformer block --------------------------------------------------------- */

/* Parameters of one block.  The same struct holds pointers into the parameter array
 * and, separately, into the gradient array (all NULL there when the component is
 * frozen).  A NULL member is a tensor the shape does not have. */
typedef struct {
    float *attn_norm_w, *attn_norm_b;
    float *qkv_w, *qkv_b;           /* [(Hq + 2 Hkv) D, H]: q rows, then k, then v */
    float *q_norm_w, *k_norm_w;     /* [D] (qk_norm) */
    float *proj_w, *proj_b;         /* [H, Hq D] */
    float *mlp_norm_w, *mlp_norm_b;
    float *fc1_w, *fc1_b;           /* dense: gate_up [2F, H] (swiglu) or fc1 [F, H] (gelu) */
    float *fc2_w, *fc2_b;           /* dense: down/fc2 [H, F] */
    float *router_w;                /* MoE: [E, H] */
    float *exp_fc1_w;               /* MoE: [E][2 Fm, H] gate|up per expert */
    float *exp_fc2_w;               /* MoE: [E][H, Fm] */
    float *sh_fc1_w, *sh_fc2_w;     /* MoE shared expert: [2 Fs, H], [H, Fs] */
    fp8_layer *fp8;                 /* not a tensor: the layer's FP8 state (fp8.h), in p
                                       only; NULL = fp32 linears */
} block_params;

/* What a stack of blocks needs to know, derived once from its stack_shape. */
typedef struct {
    const stack_shape *s;
    kdev *dev;              /* the device the stack runs on (the model's, borrowed) */
    int H, Hq, Hkv, D;
    int QD, KD, QKV;        /* Hq D, Hkv D, QD + 2 KD */
    int F, Fu;              /* dense MLP width; width of its first linear (2F or F) */
    int E, K, Fm, Fs;       /* MoE: experts, top_k, expert width, shared width */
    int rope;               /* rotate q and k with the context's tables */
    int causal;
    kgelu_kind gelu;
    /* The split of this rank (model_par.h; stack_cfg_split).  Hq, Hkv, QD, KD, QKV, F, Fu
     * above are then the LOCAL sizes; the full ones are kept here.  Whole stack: tp = 1,
     * ep = 1, q0 = kv0 = E0 = 0, kv_rep = 1, El = E. */
    int tp, t;              /* tensor-parallel size and rank */
    int Hq_full, Hkv_full, F_full;
    int q0, kv0;            /* first local q head, first local kv head (global indices) */
    int kv_rep;             /* ranks sharing one kv head (tp / Hkv_full when tp > Hkv_full) */
    int ep, E0, El;         /* expert parallel: experts [E0, E0 + El) of E are local */
} stack_cfg;

/* One block's parameters and saved activations (forward -> backward). */
typedef struct {
    int moe;                /* this layer's MLP is the MoE one */
    int full_attn;          /* attends over ctx->cu_full rather than ctx->cu */
    block_params p, g;
    /* attention half */
    /* h1, q, k, v, att, h2 and a may lie in activation memory (stack.act): only the kdev
     * ops that take an "act" argument touch them there. */
    float *h1, *mean1, *rstd1;      /* pre-norm output and its statistics */
    float *qr, *kr, *qrs, *krs;     /* qk_norm: q, k before the norm, norm rstd */
    float *q, *k, *v;               /* attention inputs (after qk_norm and RoPE) */
    float *att, *lse;               /* attention output [N, Hq D] and log-sum-exp */
    float *x1;                      /* residual stream after attention */
    /* MLP half */
    float *h2, *mean2, *rstd2;
    float *u, *a;                   /* dense: first linear output, activation output */
    float *logits, *probs, *topk_w; /* MoE router [N,E], [N,E], [N,K] */
    int *topk_idx, *offsets, *row_src, *slot_row;   /* device */
    int *off_h;                     /* host: offsets as downloaded after the plan */
    float *xp, *ue, *ae, *ye;       /* MoE expert rows: input, gate|up, act, output */
    float *us, *as;                 /* MoE shared expert: gate|up, act */
    const int *pin;                 /* MoE: pinned top-k experts [N, K], or NULL */
    double aux;                     /* MoE load-balancing loss of the last forward */
    /* MoE under expert parallelism (ep > 1): rows received for the local experts */
    int *ep_cnt;                    /* host [2E]: rows sent per expert, then rows received
                                       from ep rank j for local expert i at E + j El + i */
    int *ep_off;                    /* host [El + 1]: received rows grouped by local expert */
    int ep_rows;                    /* rows received (sum of the received counts) */
    float *xr, *ur, *ar;            /* received rows: input, gate|up, act (in ep_buf) */
    float *ep_buf;                  /* owned, grown on demand (ep_cap floats) */
    size_t ep_cap;
    /* MoE under context parallelism: the aux loss is over the whole micro batch, so its
     * statistics are reduced over this group (NULL = not split) */
    comm *cp;
    float *cp_cnt;                  /* [E] routed pairs per expert over the cp group */
    int cp_n;                       /* tokens over the cp group */
} block;

/* Backward scratch shared by the blocks of a stack (sized for the largest layer). */
typedef struct {
    float *qkv;             /* forward: qkv linear output */
    float *dqkv;            /* backward: its gradient (qkv itself, or activation memory:
                               block.c ACT_DQKV); dq, dk, dv and du may lie there too */
    float *tmp;             /* [N, H]: linear outputs before the residual add; dh */
    float *dq, *dk, *dv, *dqr, *dkr, *datt;
    float *du, *da;         /* dense / shared-expert MLP gradients */
    float *dye, *dae, *due, *dxp, *dtopk, *dlogits;   /* MoE */
    float *shared_out;      /* MoE: [N, H] shared-expert output before it is added */
    float *dres;            /* [N_local, H]: gradient of the residual stream */
    const float *dmoe;      /* MoE backward: the layer's output gradient (dres, gathered
                               under sp), from its first backward node to its last */
    float *dgat;            /* sp: [N, H] dres gathered over tp (else NULL) */
    float *ep_buf;          /* MoE under ep: exchange scratch, owned, grown on demand */
    size_t ep_cap;
    float *aux_d;           /* MoE: the router's aux loss (one float; owned, outside the
                               arena, whose size the memory plan predicts exactly) */
    float *ring;            /* cp: [8 N KD] key/value (and gradient) blocks of the ring */
} stack_scratch;

typedef struct {
    stack_cfg c;
    /* Communication of a split stack (model_par.h); NULL groups = size 1.  sp: the
     * residual stream holds ctx->N_local tokens of this rank (sequence parallel). */
    comm *tp_comm, *ep_comm;
    comm *cp_comm;          /* context parallel (decoder): attention over the ring; NULL =
                               size 1 */
    int sp;
    int L;
    block *layers;          /* [L] */
    float **xs;             /* [L + 1]: xs[l] is layer l's input, xs[L] the stack output */
    stack_scratch sc;
    int cap;                /* tokens the buffers are sized for */
    float *fbuf;                    /* device: the activation arena */
    int *ibuf;                      /* device: the MoE index arena */
    int *ibuf_h;                    /* host: the MoE plan's offsets as downloaded (one
                                       [E + 1] array per layer) */
    size_t fbuf_floats;             /* size of fbuf (the activation arena) */
    /* Activation memory (kdev_alloc_act: bf16 on a GPU at BF16, else fp32) for the
     * buffers the stack's consumers all take in the device's activation type: the bits
     * STACK_ACT_* of `act` (stack_reserve decides; block.c act_buffers says which). */
    float *abuf;
    size_t abuf_bytes;
    unsigned act;
    int qkv_rows;                   /* attention on the qkv linear's rows in place (block.c
                                       qkv_in_place; stack_reserve decides) */
    int chunked;                    /* sequence chunks run this stack (set by the owner) */
} stack;

/* Sequence chunks (parallel.chunks, docs/parallel/chunks.md): the per-layer key/value
 * cache of the micro batch in flight, owned by the decoder part of the model that owns
 * the parameters (clones, which run the other chunks, borrow it).  Chunk j (0 <= j < K)
 * holds C = seq_len / K tokens of every sequence, Nc = n_seq C in all, sequence by
 * sequence.  Slots 0 .. K-2 (the last chunk's keys are never read by a later one):
 *   k, v     written by chunk j's attention forward, read by chunks > j;
 *   dk, dv   zeroed by chunk K-1's attention backward, accumulated by chunks > j,
 *            added to chunk j's own dk, dv when its backward reaches the layer. */
typedef struct {
    int K, Nc, L, KD;               /* what buf is laid out for */
    int C;                          /* tokens of a sequence in one chunk */
    float *buf;                     /* device: [L][4][K - 1][Nc KD]: k, v, dk, dv */
    size_t cap;                     /* floats in buf */
    int *pos;                       /* device: [K][Nc]: position in its sequence of every
                                       token of every chunk */
    size_t cap_pos;
} chunk_cache;

/* Slot i of array w (0 k, 1 v, 2 dk, 3 dv) of layer l. */
static inline float *chunk_cache_at(const chunk_cache *cc, int l, int w, int i)
{
    return cc->buf + (((size_t)l * 4 + (size_t)w) * (size_t)(cc->K - 1) + (size_t)i) *
                         (size_t)cc->Nc * (size_t)cc->KD;
}

/* Attention of chunk j (chunk_attn.c) of layer l: its N queries against the cached keys
 * of chunks 0 .. j-1 and its own (causal within the chunk), keys of slot j stored for
 * the later chunks (forward: att, lse overwritten); backward (chunks in reverse order):
 * dq, dk, dv accumulated, the cached keys' gradients into their slots, slot j's added to
 * dk, dv.  D <= KCPU_ATTENTION_BLOCK_MAX_D. */
void chunk_attention_forward(kdev *dev, const chunk_cache *cc, int l, int j, float *att,
                             float *lse, const float *q, const float *k, const float *v,
                             const int *cu, int nseq, int N, int Hq, int Hkv, int D,
                             int causal);
void chunk_attention_backward(kdev *dev, const chunk_cache *cc, int l, int j, float *dq,
                              float *dk, float *dv, const float *datt, const float *q,
                              const float *k, const float *v, const float *att,
                              const float *lse, const int *cu, int nseq, int N, int Hq,
                              int Hkv, int D, int causal);

/* Per-call context: sequences and RoPE tables for this batch. */
typedef struct {
    int N;                          /* tokens of the micro batch (attention sees all) */
    int N_local;                    /* tokens in this rank's residual stream: N / tp under
                                       sequence parallelism, else N */
    /* Every array here is on the stack's device. */
    const float *cos, *sin;         /* [N, D/2] when the stack uses RoPE */
    const int *cu;                  /* [nseq + 1] sequence boundaries of ordinary layers */
    int nseq, max_seq;              /* max_seq: the longest of those sequences */
    const int *cu_full;             /* [nseq_full + 1] for layers with full_attn set */
    int nseq_full, max_seq_full;
    const int *cp_pos;              /* context parallel: [cp][N] the position inside its
                                       sequence of every local token of every cp rank
                                       (all ranks hold N tokens, sequences at cu); NULL
                                       when the stack is not split by cp */
    const chunk_cache *cc;          /* sequence chunks: the micro batch's cache, NULL when
                                       the micro batch is not chunked (cc->K == 1) */
    int chunk;                      /* this call's chunk (cc != NULL) */
} stack_ctx;

/* Attention of the N local queries against the keys of every rank of the cp group
 * (cp_attn.c): the same result as kcpu_attention_forward/backward (causal) on the whole
 * sequences, for this rank's rows.  ring holds 8 N Hkv D floats of scratch.  Forward:
 * att, lse overwritten.  Backward: dq, dk, dv accumulated. */
int cp_attention_forward(kdev *dev, comm *cp, float *ring, float *att, float *lse,
                         const float *q, const float *k, const float *v, const int *cu,
                         int nseq, int max_seq, const int *cp_pos, int N, int Hq, int Hkv,
                         int D, hearth_err *err);
int cp_attention_backward(kdev *dev, comm *cp, float *ring, float *dq, float *dk, float *dv,
                          const float *datt, const float *q, const float *k, const float *v,
                          const float *att, const float *lse, const int *cu, int nseq,
                          int max_seq, const int *cp_pos, int N, int Hq, int Hkv, int D,
                          hearth_err *err);

/* Fills the derived sizes.  moe_* are 0 for a dense stack. */
void stack_cfg_init(stack_cfg *c, kdev *dev, const stack_shape *s, int causal, int E, int K,
                    int Fm, int Fs);
/* Makes c describe rank t of tp and rank e of ep (model_par.h says what is split how).
 * HERR_CONFIG naming `comp` ("decoder", "encoder") and the dimension when the split is
 * impossible: heads % tp, kv_heads % tp (tp <= kv_heads) or tp % kv_heads (tp >
 * kv_heads), ffn % tp, experts % ep. */
int stack_cfg_split(stack_cfg *c, const char *comp, int tp, int t, int ep, int e,
                    hearth_err *err);
/* Allocates the layer array (parameters are attached by the caller). */
int stack_init(stack *st, const stack_cfg *c, int layers, hearth_err *err);
void stack_free(stack *st);
/* Makes the activation buffers hold N tokens (grows, never shrinks). */
int stack_reserve(stack *st, int N, hearth_err *err);
/* Forward over st->xs[0] (written by the caller; ctx->N_local rows) into st->xs[L];
 * *aux gets the sum of the MoE layers' load-balancing losses.  Fails only when a
 * collective of a split stack fails. */
int stack_forward(stack *st, const stack_ctx *ctx, double *aux, hearth_err *err);
/* Backward: st->sc.dres holds d(loss)/d(xs[L]) on entry and d(loss)/d(xs[0]) on exit.
 * Parameter gradients go where the blocks' g pointers say (none when NULL). */
int stack_backward(stack *st, const stack_ctx *ctx, float aux_scale, hearth_err *err);

/* Two micro batches through two stacks of the same layers (a model and its clone: same
 * parameters and gradients, own activations), interleaved node by node so that on GPU the
 * MoE all-to-alls of one hide under the other's compute (parallel.a2a_overlap).  A MoE
 * block runs as four nodes,
 *   forward   0 attention, mlp norm, router, permute, counts exchange
 *             1 dispatch: routed rows to the experts' owners (all_to_allv)
 *             2 the local experts
 *             3 combine: rows back (all_to_allv), unpermute, shared expert, residual
 *   backward  0 output gradient (gathered under sp), unpermute backward
 *             1 gradient rows to the experts' owners (all_to_allv)
 *             2 the local experts' backward
 *             3 rows back (all_to_allv), permute, router and shared-expert backward, mlp
 *               norm and attention backward
 * and a dense block as one node 0.  Per layer the pair runs
 *   x0 x1 y0 x2 y1 x3 y2 y3      (x = st[0]'s micro batch, y = st[1]'s)
 * (layers in reverse for the backward), which every rank of a tp and ep group must do
 * alike.  Each micro batch's arithmetic is that of stack_forward / stack_backward, and
 * every parameter gradient gets x's contribution before y's, as in two sequential calls:
 * the results are bitwise those of stack_forward(st[0]) ... stack_backward(st[1]) in
 * either sequential order (x forward, x backward, y forward, y backward, or both forwards
 * first).  st[1] == NULL runs st[0] alone (stack_forward, stack_backward). */
int stack_forward_pair(stack *const st[2], const stack_ctx *const ctx[2], double aux[2],
                       hearth_err *err);
int stack_backward_pair(stack *const st[2], const stack_ctx *const ctx[2], float aux_scale,
                        hearth_err *err);

/* The MoE MLP of one block on h = blk->h2: out [N, H] (overwritten); *aux gets the
 * load-balancing loss.  ep: the expert-parallel group when c->ep > 1 (else unused).
 * Fails only when a collective or an allocation fails. */
int moe_forward(const stack_cfg *c, block *blk, stack_scratch *sc, comm *ep, float *out,
                int N, double *aux, hearth_err *err);
/* dout [N, H] -> dh [N, H] (accumulated), parameter gradients into blk->g. */
int moe_backward(const stack_cfg *c, block *blk, stack_scratch *sc, comm *ep,
                 const float *dout, float *dh, int N, float aux_scale, hearth_err *err);
/* The same layer as the nodes of stack_forward_pair, in order (moe_forward and
 * moe_backward are exactly these four calls).  Forward: route (router, plan, permute;
 * under ep the counts exchange and the buffers of the received rows; blk->aux),
 * dispatch, experts, combine (out [N, H] overwritten).  Backward: unpermute (from dout
 * [N, H], which must stay valid until combine), dispatch, experts, combine (dh [N, H]
 * accumulated, parameter gradients into blk->g).  Dispatch and combine are the
 * all_to_allvs under ep (nothing to send when ep == 1). */
int moe_forward_route(const stack_cfg *c, block *blk, stack_scratch *sc, comm *ep, int N,
                      hearth_err *err);
int moe_forward_dispatch(const stack_cfg *c, block *blk, stack_scratch *sc, comm *ep,
                         hearth_err *err);
int moe_forward_experts(const stack_cfg *c, block *blk, stack_scratch *sc, hearth_err *err);
int moe_forward_combine(const stack_cfg *c, block *blk, stack_scratch *sc, comm *ep,
                        float *out, int N, hearth_err *err);
int moe_backward_unpermute(const stack_cfg *c, block *blk, stack_scratch *sc,
                           const float *dout, int N, hearth_err *err);
int moe_backward_dispatch(const stack_cfg *c, block *blk, stack_scratch *sc, comm *ep,
                          hearth_err *err);
int moe_backward_experts(const stack_cfg *c, block *blk, stack_scratch *sc, int N,
                         hearth_err *err);
int moe_backward_combine(const stack_cfg *c, block *blk, stack_scratch *sc, comm *ep,
                         const float *dout, float *dh, int N, float aux_scale,
                         hearth_err *err);
/* Floats/ints the MoE layer and its scratch take for N tokens (sizing, see block.c). */
void moe_take(const stack_cfg *c, block *blk, farena *fa, iarena *ia, iarena *ih, int N);
void moe_take_scratch(const stack_cfg *c, stack_scratch *sc, farena *fa, int N);

/* Normalisation of a stack or the projector: rmsnorm (mean unused) or layernorm. */
void norm_forward(kdev *dev, norm_kind kind, float *out, float *mean, float *rstd,
                  const float *inp, const float *w, const float *b, int N, int C, float eps);
void norm_backward(kdev *dev, norm_kind kind, float *dinp, float *dw, float *db,
                   const float *dout, const float *inp, const float *w, const float *mean,
                   const float *rstd, int N, int C);

/* ---- ViT window index (Qwen2.5-VL get_window_index) ----------------------------------
 * Merge units (spatial_merge^2 patches that become one decoder token) of every image and
 * every temporal frame are cut into windows of ws x ws units anchored at the frame's top
 * left (the last row/column of windows is smaller when the grid is not divisible),
 * windows in row-major order, units inside a window in row-major order.
 *   win_idx[n_units]: win_idx[u] = the unit (global index in the original, per-image
 *                     (t, h/merge, w/merge) order) placed at window-order position u;
 *   cu_win[n_windows + 1]: window boundaries in patches (n_units * merge^2 total).
 * ws <= 0 means no windows: identity order, one window per frame.
 * Returns n_windows; the arrays must hold n_units and n_units + 1 entries.  Grids must be
 * positive with h and w divisible by merge (checked by the caller). */
int vit_window_index(int *win_idx, int *cu_win, const int *grid_thw, int n_images,
                     int merge, int ws);
/* Frame boundaries in patches: cu[n_frames + 1], frames = sum of grid_t; returns it. */
int vit_frame_seqlens(int *cu, const int *grid_thw, int n_images);

/* ---- components ---------------------------------------------------------------------- */

typedef struct {
    int present;
    const encoder_shape *sh;
    stack st;
    float *patch_w, *patch_gw;      /* [hidden, patch_dim] */
    int patch_dim;
    int ws;                         /* window side in merge units (0: none) */
    /* per-batch state, grown on demand: host arrays, and the device copies of what the
     * kernels read (suffix _d) */
    int cap_patches;
    int n_patches, n_units, n_images, n_frames, n_windows;
    float *pix;                     /* [P, patch_dim] pixels in window order */
    float *cos, *sin;               /* [P, D/2] */
    int *pos_hw, *unit_rc, *win_idx, *cu_win, *cu_frame;
    float *pix_d, *cos_d, *sin_d;
    int *win_idx_d, *cu_win_d, *cu_frame_d;
    stack_ctx ctx;                  /* of the last forward, for the backward */
} encoder_part;

typedef struct {
    int present;
    const projector_shape *sh;
    kdev *dev;
    int in, hidden, out, merge2;
    float *norm_w, *norm_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    float *norm_gw, *norm_gb, *fc1_gw, *fc1_gb, *fc2_gw, *fc2_gb;
    int cap_units;
    float *hn, *mean, *rstd;        /* [P, in], [P], [P] */
    float *f1, *g1, *y;             /* [U, hidden], [U, hidden], [U, out] (window order) */
    float *dy, *dg1, *df1, *dhn;
    float *fbuf;                    /* device */
    fp8_layer *fp8;                 /* FP8 state of fc1/fc2 (fp8.h); NULL = fp32 */
} projector_part;

typedef struct {
    int present;                    /* this rank holds decoder layers (model_par.has_decoder) */
    const decoder_shape *sh;
    stack st;
    /* The split of this rank (model_par.h): tp group size and rank, local vocabulary rows
     * [v0, v1) of the embedding and head, sequence parallel, context-parallel group size
     * and rank. */
    comm *tp_comm, *cp_comm;
    int tp, t, sp, v0, v1, cp, c;
    int has_embed, has_head;
    float *embed_w, *embed_gw;      /* [v1 - v0, H] */
    float *pos_w, *pos_gw;          /* learned: [max_positions, H] */
    float *norm_w, *norm_b, *norm_gw, *norm_gb;
    float *head_w, *head_gw;        /* the embedding (or its last-stage copy) when tied */
    int cap_tokens, cap_chunk;
    /* the pending micro batch (model_stage_forward -> model_stage_backward); begun:
     * model_stage_forward_begin done, its stack not run yet */
    int pending, begun;
    int n_tokens, n_local, row0;    /* N (this cp rank's tokens: the micro batch's / cp),
                                       local rows, first local row */
    int n_full, n_img;              /* tokens and image tokens of the whole micro batch */
    int seq_len, n_targets, n_chunks;   /* n_targets: of this rank's N tokens */
    int n_targets_all;              /* of the whole micro batch (summed over cp) */
    int seq_chunk, seq_chunks;      /* sequence chunks: this object's chunk of the next
                                       micro batch (model_stage_set_chunk), K */
    int cap_local;                  /* N the buffers are sized for (with cap_tokens) */
    chunk_cache cc;                 /* the owner's: the chunks' key/value cache */
    stack_ctx ctx;
    /* host: built per micro batch */
    int *ids;                       /* [N] token ids, -1 at image tokens */
    int *tgt;                       /* [N] targets */
    int *imgk;                      /* [N] image row of an image token, else -1 */
    int *lrow;                      /* [N] the token's row in the micro batch (cp: its
                                       chunk's; else the identity) */
    int *cp_pos;                    /* cp > 1: [cp][N] (stack_ctx.cp_pos) */
    int *cu, *pos3, *pos1, *trow, *ttgt;
    int *erow;                      /* [N] the token's row of the embedding slice, or -1 */
    int *prow;                      /* [N] learned positions: the token's position row */
    int *imgdst;                    /* [n_full] image row k -> its local row of the stack
                                       input, or -1 */
    float *cos, *sin;               /* [n_full, D/2] */
    float *cosl, *sinl;             /* cp > 1: [N, D/2] the local rows of cos, sin */
    float *losses_h;                /* [N] every target row's loss, as downloaded */
    /* device: the copies of what kernels read, and the activations */
    int *cp_pos_d, *cu_d, *trow_d, *ttgt_d, *erow_d, *prow_d, *imgk_d, *imgdst_d;
    float *cos_d, *sin_d;           /* [N, D/2] the local rows */
    float *xg;                      /* [N, H]: partial embeddings, gathered gradients */
    float *pbuf;                    /* learned positions: [N, H] the rows to add */
    float *hl, *hf, *meanf, *rstdf; /* final norm output (local rows, gathered), stats */
    float *dhf, *dhl;               /* [N, H] head input gradient, its local rows */
    float *hc, *logits, *dhc;    /* head chunk buffers (the backward's dlogits: logits) */
    float *losses;                  /* [N] the loss of every target row */
    float *cmax;                    /* [chunk] row maxima */
    double *lse_d;                  /* [N] log-sum-exp of every target row */
    double *csum_d;                 /* [2 chunk] sums of exponentials, target logits */
    float *fbuf;                    /* device: float arena */
    int *ibuf;                      /* host: int arena */
    int *ibuf_d;                    /* device: int arena */
    float *hbuf;                    /* host: float arena (tables, head statistics) */
    double *dbuf_d;                 /* device: lse_d, csum_d */
    fp8_layer *head_fp8;            /* FP8 state of the LM head (fp8.h); NULL = fp32 */
} decoder_part;

struct model {
    model_shape shape;
    model_par par;
    kdev *dev;                      /* par.dev, or a cpu device of its own (own_dev) */
    int own_dev;
    model *owner;                   /* model_clone: the model whose arrays are borrowed */
    size_t n_params;
    float *params, *grads;          /* device */
    model_tensor *tensors;
    int n_tensors;
    encoder_part enc;
    projector_part proj;
    decoder_part dec;
    float *img_feat, *dimg_feat;    /* device [U, decoder H]: projector output, original
                                       order, and its gradient */
    int cap_img_units;
    int *pin_route;                 /* host: model_pin_routing: expert indices, or NULL */
    size_t n_pin;
    struct fp8_model *fp8;          /* model_set_fp8 (fp8_model.c); NULL = no FP8 */
    model **chunk_objs;             /* model_forward_backward_chunks: clones running
                                       chunks 1 .. n_chunk_objs (owned) */
    int n_chunk_objs;
};

/* Encoder + projector forward of n_images images into m->img_feat (m->enc.n_units rows,
 * original image order); backward from m->dimg_feat.  The encoder backward is skipped
 * when it is frozen (the projector still trains). */
int encoder_forward(model *m, int n_images, const int *grid_thw, const float *pixels,
                    hearth_err *err);
int encoder_backward(model *m, hearth_err *err);
/* Releases the encoder's and the projector's buffers (encoder.c). */
void encoder_free(model *m);
/* Projector on x [U * merge^2, in / merge^2] (encoder output, window order): y_orig
 * [U, out] in the original unit order (row win_idx[u] gets window unit u; win_idx is a
 * device array).  The backward
 * takes dy_orig in the original order, accumulates parameter gradients and, when dx is
 * not NULL, overwrites dx [U * merge^2, in / merge^2] with the input gradient. */
int projector_reserve(projector_part *pj, int n_units, hearth_err *err);
int projector_forward(projector_part *pj, const float *x, float *y_orig, const int *win_idx,
                      int n_units, hearth_err *err);
int projector_backward(projector_part *pj, const float *x, const float *dy_orig,
                       float *dx, const int *win_idx, int n_units, hearth_err *err);

/* The parameter table (model_reg.c): builds m->tensors, m->params, m->grads for the
 * parts set up in m (values as the full model from `seed` would have them, sliced), or,
 * for a clone whose arrays are its owner's, only points the parts into them. */
int model_reg_build(model *m, uint64_t seed, hearth_err *err);
void model_reg_bind(model *m);

/* The vocabulary-parallel LM head and cross-entropy (head.c) over the pending micro
 * batch's target rows of d->hf: forward returns the loss sum (identical on every tp rank)
 * and keeps what the backward needs; the backward writes d->dhf (partial over tp, zero
 * outside target rows) and accumulates the head's gradient. */
int head_forward(decoder_part *d, double *loss, hearth_err *err);
/* Releases the decoder part's buffers and its stack (decoder.c). */
void decoder_free(decoder_part *d);
int head_backward(decoder_part *d, float loss_scale, hearth_err *err);

#endif
