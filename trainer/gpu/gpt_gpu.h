/* gpt_gpu.h - the dense GPT-2-style decoder trained on one GPU in bf16 (kernels/cuda).
 *
 * The model: token embedding + learned positions, `layers` blocks of
 *   h = LN1(x); q,k,v = h.Wq^T+bq, ...; a = causal flash attention(q,k,v);
 *   x = x + a.Wo^T + bo; h2 = LN2(x); x = x + fc2(gelu_tanh(fc1(h2)))
 * then a final LayerNorm, the LM head tied to the token embedding and the fused bf16
 * softmax cross-entropy.  Tensor names, layouts and initialisation are those of the CPU
 * reference model (trainer/model/model.h) for the gpt2-124m preset, so that parameters
 * can be moved between the two by name.
 *
 * Precision: fp32 master weights, bf16 working copies (what the kernels read), fp32
 * AdamW moments.  Activations are bf16; norm statistics, attention log-sum-exps and the
 * losses are fp32.  Gradients:
 *   - matmul weight gradients are accumulated by cuBLASLt straight into the fp32
 *     gradients (bf16 operands, fp32 accumulation and fp32 output with beta = 1), so that
 *     accumulation over micro batches is fp32 with no conversion pass;
 *   - biases (the weight-gradient GEMM's BGRADB epilogue where cuBLASLt offers it, else
 *     a deterministic two-pass column sum), LayerNorm weights/biases (two-pass column
 *     sums) and the embedding/position tables (deterministic sorted scatter) are
 *     accumulated in fp32 directly;
 *   - the tied embedding gets both: the head's GEMM gradient plus the scatter.
 * The global gradient norm, the clip factor and AdamW run on the device
 * (kcuda_multi_sumsq_f32, kcuda_clip_factor, kcuda_multi_adamw_update): a step needs no
 * host synchronisation unless the loss is read.
 *
 * The LM head runs over the vocabulary padded to a multiple of 64 (aligned GEMM rows); the
 * padding columns get -inf logits, so the loss and gradients are those of the real
 * vocabulary (gpt_gpu_internal.h says how).
 *
 * Memory: gpt_gpu_create allocates everything up front -- parameters, gradients, moments,
 * and ONE activation arena planned from (micro_batch, seq_len) -- so that no step
 * allocates.  Every activation of the forward is kept for the backward (no recompute).
 *
 * Ownership: gpt_gpu_create returns an object freed by gpt_gpu_free; host arrays passed
 * in are copied and stay the caller's.  Errors: negative return codes (the KCUDA_E*
 * values of kcuda.h) with a message in gpt_gpu_errmsg.  One host thread at a time. */
#ifndef HEARTH_GPT_GPU_H
#define HEARTH_GPT_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int layers, hidden, heads, ffn, vocab, max_positions;
    float norm_eps;
    int micro_batch, seq_len;   /* sequences per micro batch, tokens per sequence */
    int max_micro;              /* micro batches one step may accumulate (batch slots) */
} gpt_gpu_config;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float max_norm;             /* global gradient-norm clip; <= 0: no clipping */
} gpt_gpu_adamw;

typedef struct gpt_gpu gpt_gpu;

/* Creates the model on the current device with parameters initialised from `seed`
 * (normal(0, 0.02) matrices and embeddings, output projections scaled by
 * 1/sqrt(2*layers), LayerNorm weights 1, biases 0).  head_dim = hidden / heads must be
 * 64, 80 or 128; seq_len <= max_positions.  On failure *out = NULL and errbuf says why. */
int gpt_gpu_create(gpt_gpu **out, const gpt_gpu_config *cfg, uint64_t seed, char *errbuf,
                   size_t errlen);
/* Only the host-side description of the same model (no device needed): the tensor table
 * and memory plan below work on it, everything that touches the device fails with
 * KCUDA_EARG.  Freed by gpt_gpu_free.  For sizing (which micro batch fits) and tests. */
int gpt_gpu_plan(gpt_gpu **out, const gpt_gpu_config *cfg, char *errbuf, size_t errlen);
void gpt_gpu_free(gpt_gpu *g);
const char *gpt_gpu_errmsg(const gpt_gpu *g);

/* The parameter tensors, in a fixed order, named as the CPU model names them. */
int gpt_gpu_tensor_count(const gpt_gpu *g);
const char *gpt_gpu_tensor_name(const gpt_gpu *g, int i);
size_t gpt_gpu_tensor_numel(const gpt_gpu *g, int i);
int gpt_gpu_tensor_decay(const gpt_gpu *g, int i);   /* AdamW weight decay applies */
size_t gpt_gpu_param_count(const gpt_gpu *g);
/* Bytes of device memory held: parameters+gradients+moments, and the activation arena. */
void gpt_gpu_memory(const gpt_gpu *g, size_t *state_bytes, size_t *activation_bytes);

/* Host <-> device copies of one tensor (synchronous).  set_param writes the fp32 master
 * and its bf16 copy; get_grad reads the fp32 gradient of the last forward_backward. */
int gpt_gpu_set_param(gpt_gpu *g, int i, const float *host);
int gpt_gpu_get_param(gpt_gpu *g, int i, float *host);
int gpt_gpu_get_grad(gpt_gpu *g, int i, float *host);

/* Copies micro batch `micro` (< max_micro) of micro_batch*seq_len tokens and targets
 * (-1 = no loss at this position) to the device.  Tokens must lie in [0, vocab). */
int gpt_gpu_load_batch(gpt_gpu *g, int micro, const int *tokens, const int *targets);

/* Forward of one loaded micro batch only; *loss = mean token loss (synchronises). */
int gpt_gpu_forward(gpt_gpu *g, int micro, double *loss);

/* Zeroes the gradients, then forward and backward of micro batches 0..n_micro-1, the
 * gradient being that of (sum of token losses) / (target tokens over the n_micro).
 * Enqueued only; *loss (may be NULL) = that mean loss, which synchronises. */
int gpt_gpu_forward_backward(gpt_gpu *g, int n_micro, double *loss);

/* Global gradient norm, clip, AdamW (step counts from 1).  Enqueued only. */
int gpt_gpu_update(gpt_gpu *g, const gpt_gpu_adamw *opt, int step);

/* forward_backward + update.  *loss may be NULL (no synchronisation). */
int gpt_gpu_step(gpt_gpu *g, int n_micro, const gpt_gpu_adamw *opt, int step, double *loss);

/* Bias gradients: on (the default), the weight-gradient GEMM's epilogue computes them
 * (cuBLASLt BGRADB) where cuBLASLt offers it, else a separate reduction pass over the
 * output gradient; off, always the separate pass.  Both give the same gradient up to fp32
 * summation order; the switch is there to time one against the other. */
void gpt_gpu_fused_bias_grad(gpt_gpu *g, int on);

/* Per-phase timing of the step, off by default.  gpt_gpu_profile(g, 1) creates CUDA events
 * and from then on every entry point records one at each change of the kind of work
 * (embedding, layernorm, each GEMM's forward/dinp/dW, attention, ...): the phases tile
 * the stream's timeline.  While on, the step may synchronise (when its event pool fills);
 * off (gpt_gpu_profile(g, 0), the default) it records no event and never synchronises.
 * gpt_gpu_profile_read synchronises, writes the milliseconds spent in each kind since the
 * previous read into ms[0..n) (kinds past n are dropped), resets the sums and returns the
 * number of kinds (gpt_gpu_profile_kinds) or a negative code.  gpt_gpu_profile_name(i):
 * a static name, NULL out of range. */
int gpt_gpu_profile(gpt_gpu *g, int on);
int gpt_gpu_profile_read(gpt_gpu *g, double *ms, int n);
int gpt_gpu_profile_kinds(void);
const char *gpt_gpu_profile_name(int kind);

/* The stream the model's work goes to (cudaStream_t), for timing with events. */
void *gpt_gpu_stream(const gpt_gpu *g);

#ifdef __cplusplus
}
#endif

#endif
