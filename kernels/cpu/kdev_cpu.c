/* kdev_cpu.c - the cpu device backend: kernels/cpu behind kdev.h.
 *
 * Device memory is host memory, so uploads and downloads are copies and nothing is
 * asynchronous.  Every op is the kcpu_ function of its name; the few ops that kernels.h
 * lacks (rows, bias, the vocabulary-parallel cross-entropy pieces) are written here in
 * plain C with the same determinism rule: threads split independent outputs only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdev_backend.h"

/* Every allocation carries its size in front, for the memory statistics. */
#define HDR 64

typedef struct {
    size_t current, peak;
    double *marks;          /* profile: host clock of each mark, ms (made on first use) */
} cpu_state;

static int cpu_init(kdev *d)
{
    d->impl = calloc(1, sizeof(cpu_state));
    return d->impl ? 0 : kdev_fail(d, HERR_NOMEM, "out of memory");
}

static void cpu_fini(kdev *d)
{
    cpu_state *s = d->impl;
    if (s)
        free(s->marks);
    free(d->impl);
    d->impl = NULL;
}

static int cpu_lib_version(const kdev *d, kdev_lib lib)
{
    (void)d;
    (void)lib;
    return 0;
}

static const char *cpu_hw_name(const kdev *d)
{
    (void)d;
    return "cpu";
}

static int cpu_alloc(kdev *d, void **p, size_t bytes)
{
    cpu_state *s = d->impl;
    char *b = calloc(1, HDR + bytes);
    if (!b)
        return kdev_fail(d, HERR_NOMEM, "out of memory for %zu bytes", bytes);
    memcpy(b, &bytes, sizeof bytes);
    s->current += bytes;
    if (s->current > s->peak)
        s->peak = s->current;
    *p = b + HDR;
    return 0;
}

static void cpu_release(kdev *d, void *p)
{
    cpu_state *s = d->impl;
    char *b = (char *)p - HDR;
    size_t bytes;
    memcpy(&bytes, b, sizeof bytes);
    s->current -= bytes;
    free(b);
}

static void cpu_mem_stats(const kdev *d, size_t *peak, size_t *current)
{
    const cpu_state *s = d->impl;
    *peak = s->peak;
    *current = s->current;
}

static int cpu_copy(kdev *d, void *dst, const void *src, size_t bytes)
{
    (void)d;
    if (bytes)
        memcpy(dst, src, bytes);
    return 0;
}

static int cpu_copy_2d(kdev *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t rows)
{
    (void)d;
    for (size_t r = 0; r < rows && width; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return 0;
}

static int cpu_zero(kdev *d, void *p, size_t bytes)
{
    (void)d;
    if (bytes)
        memset(p, 0, bytes);
    return 0;
}

static int cpu_fill(kdev *d, float *x, size_t n, float value)
{
    (void)d;
    for (size_t i = 0; i < n; i++)
        x[i] = value;
    return 0;
}

static int cpu_sync(kdev *d)
{
    (void)d;
    return 0;
}

static int cpu_set_precision(kdev *d, kdev_precision p)
{
    if (p != KDEV_PREC_FP32)
        return kdev_fail(d, HERR_CONFIG, "the cpu device computes in fp32 only");
    return 0;
}

/* Activations are fp32 on the cpu: activation memory is ordinary memory. */
static size_t cpu_act_bytes(const kdev *d)
{
    (void)d;
    return sizeof(float);
}

static int cpu_alloc_act(kdev *d, void **p, size_t count)
{
    return cpu_alloc(d, p, count * sizeof(float));
}

static int cpu_act_copy_2d(kdev *d, float *dst, size_t dpitch, const float *src,
                           size_t spitch, size_t rows, size_t cols)
{
    return cpu_copy_2d(d, dst, dpitch * sizeof(float), src, spitch * sizeof(float),
                       cols * sizeof(float), rows);
}

/* The cpu runs each op when it is called: the host clock is the op's time. */
static int cpu_prof_mark(kdev *d, int i)
{
    cpu_state *s = d->impl;
    if (!s->marks && !(s->marks = malloc(KDEV_PROF_MARKS * sizeof *s->marks)))
        return kdev_fail(d, HERR_NOMEM, "profile: out of memory");
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    s->marks[i] = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
    return 0;
}

static int cpu_prof_read(kdev *d, double *ms, int n)
{
    cpu_state *s = d->impl;
    for (int i = 0; i + 1 < n; i++)
        ms[i] = s->marks[i + 1] - s->marks[i];
    s->marks[0] = s->marks[n - 1];
    return 0;
}

static int cpu_gather_rows(kdev *d, float *dst, const float *src, const int *idx, int n,
                           int C)
{
    (void)d;
    size_t row = (size_t)C * sizeof(float);
    for (int r = 0; r < n; r++) {
        if (idx[r] >= 0)
            memcpy(dst + (size_t)r * C, src + (size_t)idx[r] * C, row);
        else
            memset(dst + (size_t)r * C, 0, row);
    }
    return 0;
}

static int cpu_scatter_rows(kdev *d, float *dst, const float *src, const int *idx, int n,
                            int C)
{
    (void)d;
    for (int r = 0; r < n; r++)
        if (idx[r] >= 0)
            memcpy(dst + (size_t)idx[r] * C, src + (size_t)r * C, (size_t)C * sizeof(float));
    return 0;
}

static int cpu_add_bias(kdev *d, float *x, const float *bias, int n, int C)
{
    (void)d;
    for (int r = 0; r < n; r++)
        kcpu_accumulate(x + (size_t)r * C, bias, (size_t)C);
    return 0;
}

/* With res: the product, then res added (bitwise the caller's matmul into a scratch and
 * add of the two). */
static int cpu_matmul_forward(kdev *d, float *out, const float *inp, const float *weight,
                              const float *bias, const float *res, int M, int K, int N)
{
    (void)d;
    kcpu_matmul_forward(out, inp, weight, bias, M, K, N);
    if (res && M > 0 && N > 0)
        kcpu_add(out, res, out, (size_t)M * N);
    return 0;
}

/* set: dinp zeroed, then the accumulating reference (bitwise a zero-then-add caller's). */
static void zero_if(int set, float *x, size_t n)
{
    if (set && x && n)
        memset(x, 0, n * sizeof *x);
}

static int cpu_matmul_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               int M, int K, int N, int set)
{
    (void)d;
    zero_if(set, dinp, M > 0 && K > 0 ? (size_t)M * K : 0);
    kcpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, M, K, N);
    return 0;
}

static int cpu_add(kdev *d, float *out, const float *a, const float *b, size_t n)
{
    (void)d;
    kcpu_add(out, a, b, n);
    return 0;
}

static int cpu_accumulate(kdev *d, float *dst, const float *src, size_t n)
{
    (void)d;
    kcpu_accumulate(dst, src, n);
    return 0;
}

static int cpu_scale(kdev *d, float *x, size_t n, float s)
{
    (void)d;
    kcpu_scale(x, n, s);
    return 0;
}

static int cpu_embedding_forward(kdev *d, float *out, const int *ids, const float *table,
                                 int N, int C)
{
    (void)d;
    kcpu_embedding_forward(out, ids, table, N, C);
    return 0;
}

static int cpu_embedding_backward(kdev *d, float *dtable, const float *dout, const int *ids,
                                  int N, int C)
{
    (void)d;
    kcpu_embedding_backward(dtable, dout, ids, N, C);
    return 0;
}

static int cpu_rmsnorm_forward(kdev *d, float *out, float *rstd, const float *inp,
                               const float *weight, int N, int C, float eps)
{
    (void)d;
    kcpu_rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
    return 0;
}

static int cpu_rmsnorm_backward(kdev *d, float *dinp, float *dweight, const float *dout,
                                const float *inp, const float *weight, const float *rstd,
                                int N, int C)
{
    (void)d;
    kcpu_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
    return 0;
}

static int cpu_layernorm_forward(kdev *d, float *out, float *mean, float *rstd,
                                 const float *inp, const float *weight, const float *bias,
                                 int N, int C, float eps)
{
    (void)d;
    kcpu_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
    return 0;
}

static int cpu_layernorm_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight,
                                  const float *mean, const float *rstd, int N, int C)
{
    (void)d;
    kcpu_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    return 0;
}

static int cpu_rope_forward(kdev *d, float *x, const float *cos, const float *sin, int N,
                            int H, int D)
{
    (void)d;
    kcpu_rope_forward(x, cos, sin, N, H, D);
    return 0;
}

static int cpu_rope_backward(kdev *d, float *dx, const float *cos, const float *sin, int N,
                             int H, int D)
{
    (void)d;
    kcpu_rope_backward(dx, cos, sin, N, H, D);
    return 0;
}

static int cpu_attention_forward(kdev *d, float *out, float *lse, const float *q,
                                 const float *k, const float *v, int ldq, int ldk, int ldv,
                                 const int *cu_seqlens, int nseq, int max_seqlen, int N, int Hq,
                                 int Hkv, int D, int causal)
{
    (void)d;
    (void)max_seqlen;
    (void)N;
    kcpu_attention_forward_ld(out, lse, q, k, v, ldq, ldk, ldv, cu_seqlens, nseq, Hq, Hkv, D,
                              causal);
    return 0;
}

/* rows x cols of x (rows ld apart, 0: cols) set to zero. */
static void zero_rows(float *x, int rows, int cols, int ld)
{
    if (!x || rows <= 0)
        return;
    if (ld <= 0 || ld == cols) {
        memset(x, 0, (size_t)rows * cols * sizeof(float));
        return;
    }
    for (int r = 0; r < rows; r++)
        memset(x + (size_t)r * ld, 0, (size_t)cols * sizeof(float));
}

static int cpu_attention_backward(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, int ldq, int ldk, int ldv,
                                  const int *cu_seqlens, int nseq, int max_seqlen, int N,
                                  int Hq, int Hkv, int D, int causal, int set)
{
    (void)d;
    (void)max_seqlen;
    if (set) {   /* the reference adds: to zeros, the same bits as a zeroing pass first */
        zero_rows(dq, N, Hq * D, ldq);
        zero_rows(dk, N, Hkv * D, ldk);
        zero_rows(dv, N, Hkv * D, ldv);
    }
    kcpu_attention_backward_ld(dq, dk, dv, dout, q, k, v, out, lse, ldq, ldk, ldv, cu_seqlens,
                               nseq, Hq, Hkv, D, causal);
    return 0;
}

static int cpu_attention_block_forward(kdev *d, float *out, float *lse, const float *q,
                                       const float *k, const float *v, const int *q_cu,
                                       const int *q_pos, const int *k_cu, const int *k_pos,
                                       int nseq, int max_q, int max_k, int Hq, int Hkv, int D,
                                       int causal)
{
    (void)max_q;
    (void)max_k;
    if (D > KCPU_ATTENTION_BLOCK_MAX_D)
        return kdev_fail(d, HERR_ARG, "block attention: head dim %d > %d", D,
                         KCPU_ATTENTION_BLOCK_MAX_D);
    kcpu_attention_block_forward(out, lse, q, k, v, q_cu, q_pos, k_cu, k_pos, nseq, Hq, Hkv,
                                 D, causal);
    return 0;
}

static int cpu_attention_block_backward(kdev *d, float *dq, float *dk, float *dv,
                                        const float *dout, const float *q, const float *k,
                                        const float *v, const float *out, const float *lse,
                                        const int *q_cu, const int *q_pos, const int *k_cu,
                                        const int *k_pos, int nseq, int max_q, int max_k,
                                        int Hq, int Hkv, int D, int causal)
{
    (void)max_q;
    (void)max_k;
    if (D > KCPU_ATTENTION_BLOCK_MAX_D)
        return kdev_fail(d, HERR_ARG, "block attention: head dim %d > %d", D,
                         KCPU_ATTENTION_BLOCK_MAX_D);
    kcpu_attention_block_backward(dq, dk, dv, dout, q, k, v, out, lse, q_cu, q_pos, k_cu,
                                  k_pos, nseq, Hq, Hkv, D, causal);
    return 0;
}

static int cpu_swiglu_forward(kdev *d, float *out, const float *inp, int N, int F)
{
    (void)d;
    kcpu_swiglu_forward(out, inp, N, F);
    return 0;
}

static int cpu_swiglu_backward(kdev *d, float *dinp, const float *dout, const float *inp,
                               int N, int F, int set)
{
    (void)d;
    zero_if(set, dinp, N > 0 && F > 0 ? (size_t)N * 2 * F : 0);
    kcpu_swiglu_backward(dinp, dout, inp, N, F);
    return 0;
}

static int cpu_gelu_forward(kdev *d, float *out, const float *inp, size_t n, kgelu_kind kind)
{
    (void)d;
    kcpu_gelu_forward(out, inp, n, kind);
    return 0;
}

static int cpu_gelu_backward(kdev *d, float *dinp, const float *dout, const float *inp,
                             size_t n, kgelu_kind kind, int set)
{
    (void)d;
    zero_if(set, dinp, n);
    kcpu_gelu_backward(dinp, dout, inp, n, kind);
    return 0;
}

/* Below this many logits a parallel region costs more than it saves. */
#define CE_PAR_MIN 16384

static int cpu_ce_rowmax(kdev *d, float *mx, const float *logits, int n, int Vl)
{
    (void)d;
#pragma omp parallel for schedule(static) if ((size_t)n * (size_t)Vl >= CE_PAR_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * Vl;
        float m = -INFINITY;
        for (int j = 0; j < Vl; j++)
            m = x[j] > m ? x[j] : m;
        mx[r] = m;
    }
    return 0;
}

static int cpu_ce_rowsum(kdev *d, double *sums, const float *logits, const float *mx,
                         const int *targets, int v0, int n, int Vl)
{
    (void)d;
#pragma omp parallel for schedule(static) if ((size_t)n * (size_t)Vl >= CE_PAR_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * Vl;
        float m = mx[r];
        double s = 0;
        for (int j = 0; j < Vl; j++)
            s += exp((double)x[j] - m);
        int t = targets[r] - v0;
        sums[r] = s;
        sums[n + r] = t >= 0 && t < Vl ? (double)x[t] : 0.0;
    }
    return 0;
}

static int cpu_ce_grad(kdev *d, float *dlogits, const float *logits, const double *lse,
                       const int *targets, int v0, double dl, int n, int Vl)
{
    (void)d;
#pragma omp parallel for schedule(static) if ((size_t)n * (size_t)Vl >= CE_PAR_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * Vl;
        float *dx = dlogits + (size_t)r * Vl;
        double l = lse[r];
        int t = targets[r] - v0;   /* outside [0, Vl): not this slice's */
        for (int j = 0; j < Vl; j++) {
            double p = exp((double)x[j] - l);
            dx[j] = (float)(dl * (j == t ? p - 1.0 : p));
        }
    }
    return 0;
}

static int cpu_ce_finish(kdev *d, double *lse, float *losses, const float *mx,
                         const double *sums, int n)
{
    (void)d;
    for (int r = 0; r < n; r++) {
        lse[r] = mx[r] + log(sums[r]);
        losses[r] = (float)(lse[r] - sums[n + r]);
    }
    return 0;
}

/* The fused LM head is its composition on the cpu (kdev.c builds it). */
static int cpu_head_ce_forward(kdev *d, float *ws, double *lse, float *losses, float *mx,
                               double *sums, const float *inp, const float *w,
                               const int *targets, int n, int K, int V)
{
    (void)d, (void)ws, (void)lse, (void)losses, (void)mx, (void)sums, (void)inp, (void)w;
    (void)targets, (void)n, (void)K, (void)V;
    return HERR_NOALGO;
}

static int cpu_head_ce_backward(kdev *d, float *dinp, float *dw, float *ws, const double *lse,
                                const int *targets, double dl, const float *inp,
                                const float *w, int n, int K, int V)
{
    (void)d, (void)dinp, (void)dw, (void)ws, (void)lse, (void)targets, (void)dl, (void)inp;
    (void)w, (void)n, (void)K, (void)V;
    return HERR_NOALGO;
}

static int cpu_moe_router_forward(kdev *d, int *topk_idx, float *topk_w, float *probs,
                                  float *aux, const float *logits, int N, int E, int K)
{
    (void)d;
    kcpu_moe_router_forward(topk_idx, topk_w, probs, aux, logits, N, E, K);
    return 0;
}

static int cpu_moe_router_backward(kdev *d, float *dlogits, const float *dtopk_w, float daux,
                                   const float *probs, const int *topk_idx,
                                   const float *topk_w, int N, int E, int K)
{
    (void)d;
    kcpu_moe_router_backward(dlogits, dtopk_w, daux, probs, topk_idx, topk_w, N, E, K);
    return 0;
}

static int cpu_moe_plan(kdev *d, int *offsets, int *row_src, int *slot_row,
                        const int *topk_idx, int N, int E, int K)
{
    (void)d;
    kcpu_moe_plan(offsets, row_src, slot_row, topk_idx, N, E, K);
    return 0;
}

static int cpu_moe_permute_forward(kdev *d, float *out, const float *inp, const int *row_src,
                                   int N, int K, int C)
{
    (void)d;
    kcpu_moe_permute_forward(out, inp, row_src, N, K, C);
    return 0;
}

static int cpu_moe_permute_backward(kdev *d, float *dinp, const float *dout,
                                    const int *row_src, int N, int K, int C)
{
    (void)d;
    kcpu_moe_permute_backward(dinp, dout, row_src, N, K, C);
    return 0;
}

static int cpu_moe_unpermute_forward(kdev *d, float *out, const float *expert_out,
                                     const float *topk_w, const int *slot_row, int N, int K,
                                     int C)
{
    (void)d;
    kcpu_moe_unpermute_forward(out, expert_out, topk_w, slot_row, N, K, C);
    return 0;
}

static int cpu_moe_unpermute_backward(kdev *d, float *dexpert_out, float *dtopk_w,
                                      const float *dout, const float *expert_out,
                                      const float *topk_w, const int *slot_row, int N, int K,
                                      int C)
{
    (void)d;
    kcpu_moe_unpermute_backward(dexpert_out, dtopk_w, dout, expert_out, topk_w, slot_row, N,
                                K, C);
    return 0;
}

static int cpu_amax(kdev *d, float *amax, const float *x, size_t n, int to_device)
{
    (void)d;
    (void)to_device;   /* the cpu's device memory is the host's */
    *amax = kcpu_amax(x, n);
    return 0;
}

static int cpu_fp8_qdq(kdev *d, float *out, const float *x, size_t n, float scale,
                       kfp8_format f)
{
    (void)d;
    kcpu_fp8_qdq(out, x, n, scale, f);
    return 0;
}

/* The FP8 linear is its emulation on the cpu (kdev.c composes it). */
static int cpu_fp8_matmul_forward(kdev *d, float *ws, float *out, const float *inp,
                                  const float *w, const float *bias, int M, int K, int N,
                                  float sx, float sw, const kdev_fp8_amax *amax)
{
    (void)d, (void)ws, (void)out, (void)inp, (void)w, (void)bias, (void)M, (void)K, (void)N;
    (void)sx, (void)sw, (void)amax;
    return HERR_NOALGO;
}

static int cpu_fp8_matmul_backward(kdev *d, float *ws, float *dinp, float *dw,
                                   const float *dout, const float *inp, const float *w, int M,
                                   int K, int N, float sx, float sw, float sd, kfp8_format fd,
                                   const kdev_fp8_amax *amax)
{
    (void)d, (void)ws, (void)dinp, (void)dw, (void)dout, (void)inp, (void)w, (void)M, (void)K;
    (void)N, (void)sx, (void)sw, (void)sd, (void)fd, (void)amax;
    return HERR_NOALGO;
}

static int cpu_adamw_update(kdev *d, float *param, const float *grad, float *m, float *v,
                            size_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int step)
{
    (void)d;
    kcpu_adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    return 0;
}

static int cpu_sumsq(kdev *d, double *out, const float *x, size_t n)
{
    (void)d;
    *out = kcpu_sumsq(x, n);
    return 0;
}

static int cpu_sumsq_multi(kdev *d, double *out, const float *const *x, const size_t *n,
                           int count)
{
    (void)d;
    double ss = 0.0;
    for (int i = 0; i < count; i++)
        ss += kcpu_sumsq(x[i], n[i]);
    *out = ss;
    return 0;
}

static int cpu_adamw_multi(kdev *d, const kdev_adamw_tensor *t, int count, float clip,
                           float lr, float beta1, float beta2, float eps, float weight_decay,
                           int step)
{
    (void)d;
    for (int i = 0; i < count; i++) {
        if (clip != 1.0f)
            kcpu_scale(t[i].grad, t[i].n, clip);
        kcpu_adamw_update(t[i].param, t[i].grad, t[i].m, t[i].v, t[i].n, lr, beta1, beta2, eps,
                          t[i].decay ? weight_decay : 0.0f, step);
    }
    return 0;
}

static const kdev_ops cpu_ops = {
    .abi = KDEV_ABI,
    .name = "cpu",
    .init = cpu_init,
    .fini = cpu_fini,
    .hw_name = cpu_hw_name,
    .lib_version = cpu_lib_version,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .copy_2d = cpu_copy_2d,
    .zero = cpu_zero,
    .fill = cpu_fill,
    .sync = cpu_sync,
    .set_precision = cpu_set_precision,
    .act_bytes = cpu_act_bytes,
    .alloc_act = cpu_alloc_act,
    .act_copy_2d = cpu_act_copy_2d,
    .mem_stats = cpu_mem_stats,
    .prof_mark = cpu_prof_mark,
    .prof_read = cpu_prof_read,
    .gather_rows = cpu_gather_rows,
    .scatter_rows = cpu_scatter_rows,
    .add_bias = cpu_add_bias,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .scale = cpu_scale,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_block_forward = cpu_attention_block_forward,
    .attention_block_backward = cpu_attention_block_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .ce_rowmax = cpu_ce_rowmax,
    .ce_rowsum = cpu_ce_rowsum,
    .ce_grad = cpu_ce_grad,
    .ce_finish = cpu_ce_finish,
    .head_ce_forward = cpu_head_ce_forward,
    .head_ce_backward = cpu_head_ce_backward,
    .moe_router_forward = cpu_moe_router_forward,
    .moe_router_backward = cpu_moe_router_backward,
    .moe_plan = cpu_moe_plan,
    .moe_permute_forward = cpu_moe_permute_forward,
    .moe_permute_backward = cpu_moe_permute_backward,
    .moe_unpermute_forward = cpu_moe_unpermute_forward,
    .moe_unpermute_backward = cpu_moe_unpermute_backward,
    .amax = cpu_amax,
    .fp8_qdq = cpu_fp8_qdq,
    .fp8_matmul_forward = cpu_fp8_matmul_forward,
    .fp8_matmul_backward = cpu_fp8_matmul_backward,
    .adamw_update = cpu_adamw_update,
    .sumsq = cpu_sumsq,
    .sumsq_multi = cpu_sumsq_multi,
    .adamw_multi = cpu_adamw_multi,
};

const kdev_ops *kdev_cpu_ops(void)
{
    return &cpu_ops;
}
