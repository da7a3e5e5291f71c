/* kernels.h - the compute kernels of Hearth, fp32 CPU reference (kernels/cpu/).
 *
 * This API knows nothing of models or parallelism.  kernels/cuda/ provides the same
 * entry points under the kcuda_ prefix, on device buffers, and is tested against these.
 *
 * Conventions (every function):
 *   - Tensors are row-major and contiguous; shapes are given in [brackets].
 *   - The caller owns every buffer; nothing here allocates memory that outlives a call.
 *   - Backward functions ADD (+=) into every gradient they produce, so that branches
 *     (residuals, tied weights, gradient accumulation) compose; callers zero first.
 *     A gradient pointer may be NULL when that gradient is not wanted.
 *   - Results are bitwise identical for any OpenMP thread count: parallel loops only
 *     split independent outputs, never a reduction.
 *   - No heap allocation: tiles live on the stack (up to about 200 KiB per calling
 *     thread, in the matmul/attention tiles), so callers' threads need ordinary stacks.
 *   - Index arguments (ids, targets, topk_idx, cu_seqlens) are trusted: the model
 *     validates them once on input.
 */
#ifndef HEARTH_KERNELS_H
#define HEARTH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- matmul ------------------------------------------------------------------
 * out[M,N] = inp[M,K] . weight[N,K]^T (+ bias[N] when bias != NULL).
 * weight is stored [out_features, in_features] as in torch.nn.Linear.
 * Backward: dinp[M,K] += dout . weight;  dweight[N,K] += dout^T . inp;
 *           dbias[N] += column sums of dout. */
void kcpu_matmul_forward(float *out, const float *inp, const float *weight,
                         const float *bias, int M, int K, int N);
void kcpu_matmul_backward(float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight,
                          int M, int K, int N);

/* ---- elementwise ---------------------------------------------------------- */
void kcpu_add(float *out, const float *a, const float *b, size_t n); /* out = a + b (out may alias) */
void kcpu_accumulate(float *dst, const float *src, size_t n);        /* dst += src */
void kcpu_scale(float *x, size_t n, float s);                        /* x *= s */

/* ---- embedding -----------------------------------------------------------
 * out[N,C] = table[ids[i], :].  Backward: dtable[ids[i], :] += dout[i, :], tokens in order;
 * a token with ids[i] < 0 contributes nothing (a row outside this rank's slice). */
void kcpu_embedding_forward(float *out, const int *ids, const float *table, int N, int C);
void kcpu_embedding_backward(float *dtable, const float *dout, const int *ids, int N, int C);

/* ---- normalisation ---------------------------------------------------------
 * RMSNorm: out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps), saved [N].
 * LayerNorm: out = (inp - mean) * rstd * weight + bias, mean and rstd saved [N].
 * (LayerNorm's bias may be NULL: no bias.  Row statistics are accumulated in double.) */
void kcpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                          int N, int C, float eps);
void kcpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);
void kcpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps);
void kcpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);

/* ---- rotary position embedding -------------------------------------------
 * Angles come as cos/sin tables [N, D/2] (one row per token).  Pairing is
 * "rotate half" as in Llama/Qwen: element i pairs with element i + D/2, both
 * rotated by angle i.  x is [N, H, D] and is rotated in place.  The backward
 * rotates the gradient by the opposite angle, in place (it does not accumulate). */
void kcpu_rope_forward(float *x, const float *cos, const float *sin, int N, int H, int D);
void kcpu_rope_backward(float *dx, const float *cos, const float *sin, int N, int H, int D);

/* Table builders.  inv_freq[j] = theta^(-2j/D) for j < D/2.
 * 1-D: angle[n][j] = pos[n] * inv_freq[j].
 * mRoPE (Qwen2-VL): pos3 is [3, N] (temporal, height, width rows); frequency j takes
 *   its position from row 0 for j < s0, row 1 for j < s0+s1, else row 2;
 *   s0 + s1 + s2 must equal D/2.
 * 2-D (Qwen2-VL/2.5-VL vision): pos_hw is [N, 2]; with q = D/4 and
 *   f[j] = theta^(-2j/(D/2)) for j < q: angle[n][j] = h[n]*f[j], angle[n][q+j] = w[n]*f[j].
 *   (D % 4 == 0 there; otherwise the last pair gets angle 0.)
 * Angles and cos/sin are computed in double and rounded once. */
void kcpu_rope_table_1d(float *cos, float *sin, const int *pos, int N, int D, float theta);
void kcpu_rope_table_mrope(float *cos, float *sin, const int *pos3, const int sections[3],
                           int N, int D, float theta);
void kcpu_rope_table_2d(float *cos, float *sin, const int *pos_hw, int N, int D, float theta);

/* ---- attention --------------------------------------------------------------
 * Variable-length multi-head attention with grouped-query heads.
 * q [N, Hq, D]; k, v [N, Hkv, D]; Hq % Hkv == 0 (query head h reads kv head h / (Hq/Hkv)).
 * Tokens [cu_seqlens[s], cu_seqlens[s+1]) form sequence s (nseq sequences, cu_seqlens[0]=0,
 * cu_seqlens[nseq]=N); attention never crosses sequences.  causal != 0 masks keys after the
 * query.  scale = 1/sqrt(D).  out [N, Hq, D]; lse [N, Hq] is the log-sum-exp of the scaled
 * scores, saved for the backward, which recomputes probabilities from it (no N x N matrix
 * is kept between forward and backward). */
void kcpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, const int *cu_seqlens, int nseq, int Hq, int Hkv,
                            int D, int causal);
void kcpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                             const float *q, const float *k, const float *v, const float *out,
                             const float *lse, const int *cu_seqlens, int nseq, int Hq,
                             int Hkv, int D, int causal);
/* The same with the rows of q, k, v ldq, ldk, ldv elements apart (dq, dk, dv as theirs; 0:
 * contiguous, Hq*D or Hkv*D): e.g. the column blocks of the fused qkv linear's rows, read
 * and written in place.  out, dout and lse stay contiguous. */
void kcpu_attention_forward_ld(float *out, float *lse, const float *q, const float *k,
                               const float *v, int ldq, int ldk, int ldv,
                               const int *cu_seqlens, int nseq, int Hq, int Hkv, int D,
                               int causal);
void kcpu_attention_backward_ld(float *dq, float *dk, float *dv, const float *dout,
                                const float *q, const float *k, const float *v,
                                const float *out, const float *lse, int ldq, int ldk, int ldv,
                                const int *cu_seqlens, int nseq, int Hq, int Hkv, int D,
                                int causal);

/* ---- attention over key blocks (context parallelism) -------------------------
 * The attention above with the queries and the keys given as separate token sets of the
 * same nseq sequences: q [Nq, Hq, D] with sequence s at rows [q_cu[s], q_cu[s+1]);
 * k, v [Nk, Hkv, D] with sequence s at rows [k_cu[s], k_cu[s+1]).  q_pos[Nq] and
 * k_pos[Nk] are the tokens' positions inside their sequence (increasing within one
 * sequence's rows); causal masks keys with k_pos > q_pos.  D <= KCPU_ATTENTION_BLOCK_MAX_D
 * (larger D: the forward does nothing).
 *   forward  MERGES the block into a running result (online softmax): out [Nq, Hq, D] and
 *            lse [Nq, Hq] hold the attention over the blocks seen so far; start with
 *            lse = -INFINITY (out is then not read).  A query that sees no key of the
 *            block is left as it was.  After every block of the sequence, out and lse
 *            are kcpu_attention_forward's up to fp32 rounding.
 *   backward ACCUMULATES this block's share into dq [Nq, Hq, D], dk, dv [Nk, Hkv, D]
 *            (any may be NULL), from out and lse of the complete forward; summed over
 *            every block it is kcpu_attention_backward's gradient. */
#define KCPU_ATTENTION_BLOCK_MAX_D 512
void kcpu_attention_block_forward(float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int *q_cu, const int *q_pos,
                                  const int *k_cu, const int *k_pos, int nseq, int Hq,
                                  int Hkv, int D, int causal);
void kcpu_attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v,
                                   const float *out, const float *lse, const int *q_cu,
                                   const int *q_pos, const int *k_cu, const int *k_pos,
                                   int nseq, int Hq, int Hkv, int D, int causal);

/* ---- activations -------------------------------------------------------------
 * SwiGLU: inp [N, 2F] holds gate in columns [0,F) and up in [F,2F); out [N,F] = silu(gate)*up.
 * GELU: tanh approximation (GPT-2's gelu_new) or exact erf form (torch.nn.GELU()). */
typedef enum { KGELU_TANH = 0, KGELU_ERF = 1 } kgelu_kind;
void kcpu_swiglu_forward(float *out, const float *inp, int N, int F);
void kcpu_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F);
void kcpu_gelu_forward(float *out, const float *inp, size_t n, kgelu_kind kind);
void kcpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n,
                        kgelu_kind kind);

/* ---- softmax cross-entropy ----------------------------------------------------
 * losses[i] = logsumexp(logits[i,:]) - logits[i, targets[i]]; rows whose target equals
 * ignore_index get loss 0.  Backward: dlogits[i,:] += dlosses[i] * (softmax(logits[i,:]) -
 * onehot(targets[i])), nothing for ignored rows.  Computed in a numerically stable way
 * (max subtraction, double accumulation of the row sum).  A target outside [0, V) that is
 * not ignore_index gives loss NaN (so the step reads as diverged) and no gradient. */
void kcpu_crossentropy_forward(float *losses, const float *logits, const int *targets,
                               int N, int V, int ignore_index);
void kcpu_crossentropy_backward(float *dlogits, const float *logits, const int *targets,
                                const float *dlosses, int N, int V, int ignore_index);

/* ---- optimizer ------------------------------------------------------------------
 * AdamW with decoupled weight decay (Loshchilov & Hutter), bias-corrected; step counts
 * from 1.  param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param). */
void kcpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       int step);
/* Sum of squares accumulated in double, in a fixed order (blocked partial sums). */
double kcpu_sumsq(const float *x, size_t n);
/* Global-norm clipping: given the global norm, the factor to multiply gradients by
 * (1 when norm <= max_norm or max_norm <= 0, else max_norm / (norm + 1e-6) as in
 * torch.nn.utils.clip_grad_norm_; NaN for a NaN norm). */
float kcpu_clip_factor(double global_norm, float max_norm);

/* ---- mixture of experts ----------------------------------------------------------
 * Router: probs[N,E] = softmax(logits[N,E]); per token the K largest probabilities (ties:
 * lower expert index first) give topk_idx[N,K] in descending order and
 * topk_w[N,K] = p / sum of the K chosen p (renormalised).
 * aux = E * sum_e f_e * P_e with f_e = (number of (token, slot) pairs routed to e) / N and
 * P_e = mean over tokens of probs[:, e] (Switch/Qwen load balancing; f is constant).
 * Backward: dlogits[N,E] += gradient of (sum topk_w * dtopk_w + daux * aux).
 * aux may be NULL (not wanted); dtopk_w may be NULL (aux term only).  Needs K <= E. */
void kcpu_moe_router_forward(int *topk_idx, float *topk_w, float *probs, float *aux,
                             const float *logits, int N, int E, int K);
void kcpu_moe_router_backward(float *dlogits, const float *dtopk_w, float daux,
                              const float *probs, const int *topk_idx, const float *topk_w,
                              int N, int E, int K);

/* Permutation plan: the N*K (token, slot) pairs grouped by expert, stable in token order.
 * offsets[E+1]: rows of expert e are [offsets[e], offsets[e+1]);
 * row_src[r] = t*K + j for the pair placed at row r; slot_row[t*K + j] = r (inverse). */
void kcpu_moe_plan(int *offsets, int *row_src, int *slot_row, const int *topk_idx,
                   int N, int E, int K);
/* permute: out[r, :] = inp[row_src[r] / K, :], out [N*K, C]. Backward: dinp += gather-sum. */
void kcpu_moe_permute_forward(float *out, const float *inp, const int *row_src, int N, int K,
                              int C);
void kcpu_moe_permute_backward(float *dinp, const float *dout, const int *row_src, int N,
                               int K, int C);
/* unpermute: out[t, :] = sum_j topk_w[t,j] * expert_out[slot_row[t*K+j], :], out [N, C].
 * Backward: dexpert_out[slot_row[t*K+j]] += topk_w[t,j] * dout[t];
 *           dtopk_w[t,j] += dot(dout[t], expert_out[slot_row[t*K+j]]). */
void kcpu_moe_unpermute_forward(float *out, const float *expert_out, const float *topk_w,
                                const int *slot_row, int N, int K, int C);
void kcpu_moe_unpermute_backward(float *dexpert_out, float *dtopk_w, const float *dout,
                                 const float *expert_out, const float *topk_w,
                                 const int *slot_row, int N, int K, int C);

/* ---- bf16 scalars (bf16.c) ---------------------------------------------------------
 * fp32 -> bf16 bits rounds to nearest, ties to even, overflowing to infinity; NaN stays a
 * (quiet) NaN.  bf16 -> fp32 is exact. */
uint16_t kcpu_bf16_encode(float x);
float kcpu_bf16_decode(uint16_t h);

/* ---- FP8 emulation (fp8.c) --------------------------------------------------------
 * The two OCP FP8 formats, stored as one byte (sign, exponent, mantissa):
 *   E4M3: bias 7, max 448, no infinities, NaN = S.1111.111 (0x7f / 0xff);
 *   E5M2: bias 15, max 57344, IEEE-like: inf = S.11111.00, NaN = S.11111.{01,10,11}.
 * Both have subnormals (exponent field 0).  Encoding rounds to nearest, ties to even, and
 * saturates finite values beyond max to +-max (Transformer Engine's cast); NaN encodes as
 * 0x7f (either format, sign kept); +-inf encodes as E5M2 +-inf and as E4M3 NaN (a
 * non-finite input stays non-finite, so a diverging step still reads as diverged).
 * Per-tensor scaling: q = encode(x * scale), x' = decode(q) / scale, with
 * scale = fp8_max / amax / 2^margin. */
typedef enum { KFP8_E4M3 = 0, KFP8_E5M2 = 1 } kfp8_format;
#define KFP8_E4M3_MAX 448.0f
#define KFP8_E5M2_MAX 57344.0f

float kcpu_fp8_max(kfp8_format f);
uint8_t kcpu_fp8_encode(float x, kfp8_format f);
float kcpu_fp8_decode(uint8_t code, kfp8_format f);     /* exact (every code is a float) */
/* max |x[i]|; NaN when some x[i] is NaN; 0 for n == 0. */
float kcpu_amax(const float *x, size_t n);
/* fp8_max(f) / amax / 2^margin; `prev` when amax is 0, NaN or inf or the result is not
 * finite (the scale then stays what it was, as in Transformer Engine). */
float kcpu_fp8_scale(float amax, kfp8_format f, int margin, float prev);
/* Delayed scaling's amax history: a ring of H values, zero-initialised by the caller.
 * push stores amax at *pos and advances it; history_amax is the max over the ring
 * (0 while empty). */
void kcpu_fp8_history_push(float *hist, int H, int *pos, float amax);
float kcpu_fp8_history_amax(const float *hist, int H);
/* out[i] = decode(encode(x[i] * scale)) / scale (quantise-dequantise; out may alias x).
 * The product x * scale is rounded to fp32 first, as on the GPU. */
void kcpu_fp8_qdq(float *out, const float *x, size_t n, float scale, kfp8_format f);

#ifdef __cplusplus
}
#endif

#endif
