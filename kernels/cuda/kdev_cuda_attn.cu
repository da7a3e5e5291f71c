/* kdev_cuda_attn.cu - attention in fp32 on the device: the variable-length GQA attention
 * of kcpu_attention_* and the block attention of kcpu_attention_block_* (separate query
 * and key token sets with positions; the forward merges into a running out/lse).
 *
 * Correctness and determinism over speed: one warp owns one output row and walks its
 * partners in order, so every sum has a fixed order and no atomics are needed.
 *   forward:  warp per (query row, query head); one sweep over the visible keys with an
 *             online softmax (running max m, l = sum exp(s - m), acc = sum exp(s - m) v),
 *             lse = m + log(l), out = acc / l; the block forward merges (out, lse) with
 *             the running result as kernels/cpu/attention_block.c does, in double.
 *   backward: D_i = dO_i . O_i (double, into the device scratch); then
 *             dq: warp per (query row, query head): for each visible key, p = exp(s - lse),
 *                 ds = p (dO . v - D_i) scale, dq += ds k;
 *             dk, dv: warp per (key row, kv head): for each query head of the group and
 *                 each query that sees the key, the same p and ds, dk += ds q, dv += p dO.
 * Lane l holds elements l, l + 32, ... of a row (coalesced loads); dot products are
 * lane-wise sums then a warp butterfly, which gives every lane the same bits, so the
 * scores of the dq and the dk/dv kernels agree exactly.
 *
 * Visibility: the keys of sequence s are rows [k_cu[s], k_cu[s+1]), the queries rows
 * [q_cu[s], q_cu[s+1]); a position is q_pos/k_pos[row], or row - cu[s] when the array is
 * NULL (plain attention, where q and k are the same tokens).  Causal: key visible when
 * its position <= the query's.  Positions increase within a sequence's rows, so the keys
 * a query sees are a prefix and the queries that see a key a suffix (binary searches). */
#include "cuda/kdev_cuda_internal.h"

#include <math.h>

#define ATT_WARPS 4      /* rows per block: one per warp */
#define ATT_MAX_D 512    /* kernels.h KCPU_ATTENTION_BLOCK_MAX_D; 16 elements per lane */

typedef struct {
    const float *q, *k, *v;
    const int *q_cu, *q_pos, *k_cu, *k_pos;
    int chunks;          /* blocks per sequence along the rows of the grid's x */
    int Hq, Hkv, D, causal;
    float scale;
    size_t cap;          /* rows of the D_i scratch: nseq * max_q */
} cuda_att;

__device__ __forceinline__ int cuda_att_qpos(const cuda_att &a, int s, int i)
{
    return a.q_pos ? a.q_pos[i] : i - a.q_cu[s];
}

__device__ __forceinline__ int cuda_att_kpos(const cuda_att &a, int s, int j)
{
    return a.k_pos ? a.k_pos[j] : j - a.k_cu[s];
}

/* Keys of sequence s that query row i sees: rows [*kb, *kb + n); returns n. */
__device__ int cuda_att_keys(const cuda_att &a, int s, int i, int *kb)
{
    int b = a.k_cu[s], e = a.k_cu[s + 1];
    *kb = b;
    if (!a.causal)
        return e - b;
    int qp = cuda_att_qpos(a, s, i), lo = b, hi = e; /* first key with position > qp */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (cuda_att_kpos(a, s, mid) <= qp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - b;
}

/* First query row of sequence s that sees key row j (queries after it see it too). */
__device__ int cuda_att_first_query(const cuda_att &a, int s, int j)
{
    int b = a.q_cu[s], e = a.q_cu[s + 1];
    if (!a.causal)
        return b;
    int kp = cuda_att_kpos(a, s, j), lo = b, hi = e; /* first query with position >= kp */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (cuda_att_qpos(a, s, mid) < kp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The row of the grid's warp among rows [cu[s], cu[s+1]): -1 past the end. */
__device__ __forceinline__ int cuda_att_row(const cuda_att &a, const int *cu, int *s)
{
    int warp = threadIdx.x >> 5;
    *s = blockIdx.x / a.chunks;
    int r = (blockIdx.x % a.chunks) * ATT_WARPS + warp, b = cu[*s];
    return r < cu[*s + 1] - b ? b + r : -1;
}

template <int NT>
__device__ __forceinline__ void cuda_att_load(float *r, const float *p, int D)
{
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        int c = t * 32 + lane;
        r[t] = c < D ? p[c] : 0.0f;
    }
}

/* r . p over D elements (r in registers, p a row in memory), the same in every lane. */
template <int NT>
__device__ __forceinline__ float cuda_att_dot(const float *r, const float *p, int D)
{
    int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        int c = t * 32 + lane;
        if (c < D)
            s += r[t] * p[c];
    }
    return cuda_warp_sum(s);
}

/* ---- forward -------------------------------------------------------------------------- */

template <int NT>
__global__ void cuda_att_fwd_kernel(float *out, float *lse, cuda_att a, int merge)
{
    int s, i = cuda_att_row(a, a.q_cu, &s);
    if (i < 0)
        return; /* warp-uniform */
    int lane = threadIdx.x & 31, h = blockIdx.y, g = h / (a.Hq / a.Hkv), D = a.D, kb;
    int n = cuda_att_keys(a, s, i, &kb);
    if (n == 0)
        return; /* the block is in this query's future: left as it was */
    size_t qs = (size_t)a.Hq * D, ks = (size_t)a.Hkv * D;
    float qv[NT], acc[NT];
    cuda_att_load<NT>(qv, a.q + i * qs + (size_t)h * D, D);
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < n; j++) {
        size_t ko = (size_t)(kb + j) * ks + (size_t)g * D;
        float sj = cuda_att_dot<NT>(qv, a.k + ko, D) * a.scale;
        if (sj > m) { /* rescale what was summed against the old maximum */
            float corr = expf(m - sj);
            l *= corr;
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[t] *= corr;
            m = sj;
        }
        float p = expf(sj - m);
        l += p;
        const float *vr = a.v + ko;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int c = t * 32 + lane;
            if (c < D)
                acc[t] += p * vr[c];
        }
    }
    double lb = (double)m + log((double)l);
    float *o = out + i * qs + (size_t)h * D, *L = lse + (size_t)i * a.Hq + h;
    float old = merge ? *L : -INFINITY;
    __syncwarp(); /* every lane has read *L before lane 0 writes it */
    if (old == -INFINITY) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int c = t * 32 + lane;
            if (c < D)
                o[c] = (float)((double)acc[t] / l);
        }
        if (lane == 0)
            *L = (float)lb;
        return;
    }
    /* online softmax over blocks: M = max, weights exp(lse - M), exp(lb - M) */
    double M = old > lb ? old : lb;
    double wa = exp(old - M), wb = exp(lb - M), den = wa + wb;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        int c = t * 32 + lane;
        if (c < D)
            o[c] = (float)((wa * o[c] + wb * ((double)acc[t] / l)) / den);
    }
    if (lane == 0)
        *L = (float)(M + log(den));
}

/* ---- backward -------------------------------------------------------------------------- */

/* Di[i, h] = dO_i . O_i in double (lane partials, then the butterfly). */
template <int NT>
__global__ void cuda_att_di_kernel(double *Di, const float *dout, const float *out, cuda_att a)
{
    int s, i = cuda_att_row(a, a.q_cu, &s);
    if (i < 0 || (size_t)i >= a.cap)
        return;
    int lane = threadIdx.x & 31, h = blockIdx.y, D = a.D;
    size_t o = (size_t)i * a.Hq * D + (size_t)h * D;
    double di = 0;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        int c = t * 32 + lane;
        if (c < D)
            di += (double)dout[o + c] * out[o + c];
    }
    di = cuda_warp_sum_d(di);
    if (lane == 0)
        Di[(size_t)i * a.Hq + h] = di;
}

template <int NT>
__global__ void cuda_att_dq_kernel(float *dq, const float *dout, const float *lse,
                                   const double *Di, cuda_att a)
{
    int s, i = cuda_att_row(a, a.q_cu, &s);
    if (i < 0 || (size_t)i >= a.cap)
        return;
    int lane = threadIdx.x & 31, h = blockIdx.y, g = h / (a.Hq / a.Hkv), D = a.D, kb;
    int n = cuda_att_keys(a, s, i, &kb);
    if (n == 0)
        return;
    size_t qs = (size_t)a.Hq * D, ks = (size_t)a.Hkv * D, qo = i * qs + (size_t)h * D;
    float qv[NT], dov[NT], acc[NT];
    cuda_att_load<NT>(qv, a.q + qo, D);
    cuda_att_load<NT>(dov, dout + qo, D);
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    float L = lse[(size_t)i * a.Hq + h];
    double di = Di[(size_t)i * a.Hq + h];
    for (int j = 0; j < n; j++) {
        size_t ko = (size_t)(kb + j) * ks + (size_t)g * D;
        const float *kr = a.k + ko;
        float p = expf(cuda_att_dot<NT>(qv, kr, D) * a.scale - L);
        float dp = cuda_att_dot<NT>(dov, a.v + ko, D);
        float ds = (float)(p * ((double)dp - di)) * a.scale;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int c = t * 32 + lane;
            if (c < D)
                acc[t] += ds * kr[c];
        }
    }
    float *o = dq + qo;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        int c = t * 32 + lane;
        if (c < D)
            o[c] += acc[t];
    }
}

/* Grid: rows of the keys (chunks per sequence) x kv heads.  dk/dv of a key row collect
 * every query head of its group, in head order, then queries in row order. */
template <int NT>
__global__ void cuda_att_dkv_kernel(float *dk, float *dv, const float *dout, const float *lse,
                                    const double *Di, cuda_att a)
{
    int s, j = cuda_att_row(a, a.k_cu, &s);
    if (j < 0)
        return;
    int lane = threadIdx.x & 31, g = blockIdx.y, D = a.D, group = a.Hq / a.Hkv;
    size_t qs = (size_t)a.Hq * D, ks = (size_t)a.Hkv * D, ko = (size_t)j * ks + (size_t)g * D;
    float kv[NT], vv[NT], dka[NT], dva[NT];
    cuda_att_load<NT>(kv, a.k + ko, D);
    cuda_att_load<NT>(vv, a.v + ko, D);
#pragma unroll
    for (int t = 0; t < NT; t++)
        dka[t] = dva[t] = 0.0f;
    int i0 = cuda_att_first_query(a, s, j), ie = a.q_cu[s + 1];
    if ((size_t)ie > a.cap)
        ie = (int)a.cap; /* only when max_q understated a sequence: never read past Di */
    for (int h = g * group; h < (g + 1) * group; h++)
        for (int i = i0; i < ie; i++) {
            size_t qo = i * qs + (size_t)h * D;
            const float *qr = a.q + qo, *dor = dout + qo;
            float p = expf(cuda_att_dot<NT>(kv, qr, D) * a.scale - lse[(size_t)i * a.Hq + h]);
            float dp = cuda_att_dot<NT>(vv, dor, D);
            float ds = (float)(p * ((double)dp - Di[(size_t)i * a.Hq + h])) * a.scale;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int c = t * 32 + lane;
                if (c < D) {
                    dka[t] += ds * qr[c];
                    dva[t] += p * dor[c];
                }
            }
        }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        int c = t * 32 + lane;
        if (c < D) {
            if (dk)
                dk[ko + c] += dka[t];
            if (dv)
                dv[ko + c] += dva[t];
        }
    }
}

/* ---- host side --------------------------------------------------------------------------- */

/* kern<NT> with NT = 4, 8 or 16 elements per lane (D <= 128, 256, 512). */
#define CUDA_ATT_LAUNCH(kern, D, grid, st, ...)                                               \
    do {                                                                                      \
        if ((D) <= 128)                                                                       \
            kern<4><<<grid, ATT_WARPS * 32, 0, st>>>(__VA_ARGS__);                            \
        else if ((D) <= 256)                                                                  \
            kern<8><<<grid, ATT_WARPS * 32, 0, st>>>(__VA_ARGS__);                            \
        else                                                                                  \
            kern<16><<<grid, ATT_WARPS * 32, 0, st>>>(__VA_ARGS__);                           \
    } while (0)

/* Checks the shapes and fills a; returns 1 when there is nothing to do, 0 to go on, or an
 * error. */
static int cuda_att_setup(kdev *d, const char *op, cuda_att *a, const float *q, const float *k,
                          const float *v, const int *q_cu, const int *q_pos, const int *k_cu,
                          const int *k_pos, int nseq, int max_q, int Hq, int Hkv, int D,
                          int causal)
{
    if (D < 1 || D > ATT_MAX_D || Hq < 1 || Hkv < 1 || Hq % Hkv || Hq > 65535)
        return kdev_fail(d, HERR_ARG, "%s: bad heads Hq=%d Hkv=%d or head dim D=%d (1..%d)",
                         op, Hq, Hkv, D, ATT_MAX_D);
    if (nseq <= 0 || max_q <= 0)
        return 1;
    long long chunks = (max_q + ATT_WARPS - 1) / ATT_WARPS;
    if (chunks * nseq > 0x7fffffffLL)
        return kdev_fail(d, HERR_ARG, "%s: nseq=%d x max rows %d is too large a grid", op, nseq,
                         max_q);
    a->q = q;
    a->k = k;
    a->v = v;
    a->q_cu = q_cu;
    a->q_pos = q_pos;
    a->k_cu = k_cu;
    a->k_pos = k_pos;
    a->chunks = (int)chunks;
    a->Hq = Hq;
    a->Hkv = Hkv;
    a->D = D;
    a->causal = causal != 0;
    a->scale = (float)(1.0 / sqrt((double)D));
    a->cap = (size_t)nseq * (size_t)max_q;
    return 0;
}

static int cuda_att_fwd(kdev *d, const char *op, float *out, float *lse, cuda_att a, int nseq,
                        int merge)
{
    dim3 grid((unsigned)(a.chunks * nseq), (unsigned)a.Hq);
    CUDA_ATT_LAUNCH(cuda_att_fwd_kernel, a.D, grid, cuda_stream(d), out, lse, a, merge);
    return cuda_launched(d, op);
}

static int cuda_att_bwd(kdev *d, const char *op, float *dq, float *dk, float *dv,
                        const float *dout, const float *out, const float *lse, cuda_att a,
                        int nseq, int max_k)
{
    if (!dq && !dk && !dv)
        return 0;
    void *ws;
    int rc = cuda_scratch(d, a.cap * (size_t)a.Hq * sizeof(double), &ws, op);
    if (rc)
        return rc;
    double *Di = (double *)ws;
    cudaStream_t st = cuda_stream(d);
    dim3 qgrid((unsigned)(a.chunks * nseq), (unsigned)a.Hq);
    CUDA_ATT_LAUNCH(cuda_att_di_kernel, a.D, qgrid, st, Di, dout, out, a);
    if ((rc = cuda_launched(d, op)))
        return rc;
    if (dq) {
        CUDA_ATT_LAUNCH(cuda_att_dq_kernel, a.D, qgrid, st, dq, dout, lse, Di, a);
        if ((rc = cuda_launched(d, op)))
            return rc;
    }
    if ((dk || dv) && max_k > 0) {
        cuda_att ka = a; /* the grid walks the key rows */
        long long kchunks = (max_k + ATT_WARPS - 1) / ATT_WARPS;
        if (kchunks * nseq > 0x7fffffffLL)
            return kdev_fail(d, HERR_ARG, "%s: nseq=%d x max key rows %d is too large a grid",
                             op, nseq, max_k);
        ka.chunks = (int)kchunks;
        dim3 kgrid((unsigned)(ka.chunks * nseq), (unsigned)a.Hkv);
        CUDA_ATT_LAUNCH(cuda_att_dkv_kernel, a.D, kgrid, st, dk, dv, dout, lse, Di, ka);
        if ((rc = cuda_launched(d, op)))
            return rc;
    }
    return 0;
}

/* The fp32 kernels read fp32 operands: *p[i] in bf16 activation memory is replaced by a
 * new fp32 copy t[i] (NULL where it was fp32), released by f32_release. */
static int f32_operands(kdev *d, float **t, const float **p, const size_t *n, int cnt,
                        const char *op)
{
    int rc = 0;
    for (int i = 0; i < cnt; i++) {
        t[i] = NULL;
        if (!rc && !(rc = cuda_act_f32(d, &t[i], p[i], n[i], op)) && t[i])
            p[i] = t[i];
    }
    return rc;
}

static int f32_release(kdev *d, float **t, int cnt, int rc)
{
    for (int i = 0; i < cnt; i++)
        cuda_act_f32_free(d, t[i], 0);
    return rc;
}

/* ---- row strides (kdev_attention_forward_ld) -------------------------------------------
 * The bf16 kernels read and write q, k, v and their gradients in place with any stride
 * where they lie in activation memory; everywhere else (fp32 memory, the fp32 kernels)
 * strided tensors go through contiguous fp32 copies (stream-ordered allocations). */

struct att_rows {
    int ld[3], w[3];   /* q, k, v: strides (resolved) and rows' widths */
    int strided;       /* some ld[i] != w[i] */
};

static att_rows rows_of(int ldq, int ldk, int ldv, int Hq, int Hkv, int D)
{
    att_rows r;
    r.w[0] = Hq * D;
    r.w[1] = r.w[2] = Hkv * D;
    int ld[3] = { ldq, ldk, ldv };
    r.strided = 0;
    for (int i = 0; i < 3; i++) {
        r.ld[i] = ld[i] > 0 ? ld[i] : r.w[i];
        r.strided |= r.ld[i] != r.w[i];
    }
    return r;
}

/* The bf16 kernels take every strided tensor of p (q, k, v, then dq, dk, dv: entry i and
 * i + 3 share stride i; NULL ignored) in place: each lies in activation memory. */
static int in_place(kdev *d, const att_rows *r, const float *const *p, int n)
{
    for (int i = 0; i < n; i++)
        if (p[i] && r->ld[i % 3] != r->w[i % 3] && !cuda_act16(d, p[i]))
            return 0;
    return 1;
}

/* t = a contiguous fp32 copy of rows x w elements of src (rows ld apart, any memory). */
static int compact(kdev *d, float **t, const float *src, int ld, int w, int rows,
                   const char *op)
{
    size_t n = (size_t)rows * w;
    int rc = cuda_err(d, cudaMallocAsync((void **)t, n * sizeof(float), cuda_stream(d)), op);
    return rc || !src ? rc : cuda_act_copy_2d(d, *t, (size_t)w, src, (size_t)ld, (size_t)rows,
                                              (size_t)w);
}

static int compact_forward(kdev *d, float *out, float *lse, const float *const *qkv,
                           const att_rows *r, const int *cu_seqlens, int nseq, int max_seqlen,
                           int N, int Hq, int Hkv, int D, int causal)
{
    static const char op[] = "attention_forward";
    float *t[3] = { NULL, NULL, NULL };
    const float *in[3] = { qkv[0], qkv[1], qkv[2] };
    int rc = 0;
    for (int i = 0; !rc && i < 3; i++)
        if (r->ld[i] != r->w[i] && !(rc = compact(d, &t[i], in[i], r->ld[i], r->w[i], N, op)))
            in[i] = t[i];
    if (!rc)
        rc = cuda_attention_forward(d, out, lse, in[0], in[1], in[2], 0, 0, 0, cu_seqlens, nseq,
                                    max_seqlen, N, Hq, Hkv, D, causal);
    return f32_release(d, t, 3, rc);
}

static int compact_backward(kdev *d, float *const *grad, const float *dout,
                            const float *const *qkv, const float *out, const float *lse,
                            const att_rows *r, const int *cu_seqlens, int nseq,
                            int max_seqlen, int N, int Hq, int Hkv, int D, int causal, int set)
{
    static const char op[] = "attention_backward";
    float *t[6] = { NULL, NULL, NULL, NULL, NULL, NULL };
    const float *in[3] = { qkv[0], qkv[1], qkv[2] };
    float *g[3] = { grad[0], grad[1], grad[2] };
    int rc = 0;
    for (int i = 0; !rc && i < 3; i++) {
        if (r->ld[i] == r->w[i])
            continue;
        if (!(rc = compact(d, &t[i], in[i], r->ld[i], r->w[i], N, op)))
            in[i] = t[i];
        /* a gradient added to starts from its values */
        if (!rc && g[i] &&
            !(rc = compact(d, &t[3 + i], set ? NULL : g[i], r->ld[i], r->w[i], N, op)))
            g[i] = t[3 + i];
    }
    if (!rc)
        rc = cuda_attention_backward(d, g[0], g[1], g[2], dout, in[0], in[1], in[2], out, lse,
                                     0, 0, 0, cu_seqlens, nseq, max_seqlen, N, Hq, Hkv, D,
                                     causal, set);
    for (int i = 0; !rc && i < 3; i++)
        if (t[3 + i])
            rc = cuda_act_copy_2d(d, grad[i], (size_t)r->ld[i], t[3 + i], (size_t)r->w[i],
                                  (size_t)N, (size_t)r->w[i]);
    return f32_release(d, t, 6, rc);
}

int cuda_attention_forward(kdev *d, float *out, float *lse, const float *q, const float *k,
                           const float *v, int ldq, int ldk, int ldv, const int *cu_seqlens,
                           int nseq, int max_seqlen, int N, int Hq, int Hkv, int D, int causal)
{
    static const char op[] = "attention_forward";
    att_rows r = rows_of(ldq, ldk, ldv, Hq, Hkv, D);
    const float *qkv[3] = { q, k, v };
    int bf16 = cuda_st(d)->prec == KDEV_PREC_BF16 && cuda_attention16_fits(D);
    if (bf16 && in_place(d, &r, qkv, 3))
        return cuda_attention16_forward(d, out, lse, q, k, v, r.ld[0], r.ld[1], r.ld[2],
                                        cu_seqlens, nseq, max_seqlen, N, Hq, Hkv, D, causal);
    if (r.strided)
        return compact_forward(d, out, lse, qkv, &r, cu_seqlens, nseq, max_seqlen, N, Hq, Hkv,
                               D, causal);
    /* the fp32 kernels: operands in bf16 activation memory through fp32 copies, an out
     * there gets their result rounded */
    size_t nq = (size_t)N * Hq * D, nk = (size_t)N * Hkv * D;
    const float *in[3] = { q, k, v };
    size_t n[3] = { nq, nk, nk };
    float *t[4] = { NULL, NULL, NULL, NULL }, *o = out;
    int rc = f32_operands(d, t, in, n, 3, op);
    if (!rc && cuda_act16(d, out))
        rc = cuda_err(d, cudaMallocAsync((void **)&t[3], nq * sizeof(float), cuda_stream(d)),
                      op);
    if (t[3])
        o = t[3];
    cuda_att a;
    if (!rc) {
        rc = cuda_att_setup(d, op, &a, in[0], in[1], in[2], cu_seqlens, NULL, cu_seqlens, NULL,
                            nseq, max_seqlen, Hq, Hkv, D, causal);
        rc = rc ? (rc > 0 ? 0 : rc) : cuda_att_fwd(d, op, o, lse, a, nseq, 0);
    }
    if (!rc && o != out)
        rc = cuda_to_bf16(d, (kcuda_bf16 *)out, o, nq, op);
    return f32_release(d, t, 4, rc);
}

int cuda_attention_backward(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, int ldq, int ldk, int ldv, const int *cu_seqlens,
                            int nseq, int max_seqlen, int N, int Hq, int Hkv, int D, int causal,
                            int set)
{
    static const char op[] = "attention_backward";
    att_rows r = rows_of(ldq, ldk, ldv, Hq, Hkv, D);
    const float *t6[6] = { q, k, v, dq, dk, dv };
    int bf16 = cuda_st(d)->prec == KDEV_PREC_BF16 && cuda_attention16_fits(D);
    if (bf16 && in_place(d, &r, t6, 6))
        return cuda_attention16_backward(d, dq, dk, dv, dout, q, k, v, out, lse, r.ld[0],
                                         r.ld[1], r.ld[2], cu_seqlens, nseq, max_seqlen, N, Hq,
                                         Hkv, D, causal, set);
    if (r.strided) {
        float *grad[3] = { dq, dk, dv };
        return compact_backward(d, grad, dout, t6, out, lse, &r, cu_seqlens, nseq, max_seqlen,
                                N, Hq, Hkv, D, causal, set);
    }
    size_t nq = (size_t)N * Hq * D, nk = (size_t)N * Hkv * D;
    /* operands in bf16 activation memory through fp32 copies; gradients there through fp32
     * copies (their values when added to) rounded back */
    const float *in[8] = { q, k, v, out, dq, dk, dv, dout };
    size_t n[8] = { nq, nk, nk, nq, nq, nk, nk, nq };
    float *t[8], *gr[3] = { dq, dk, dv };
    int rc = f32_operands(d, t, in, n, 8, op);
    for (int i = 0; !rc && i < 3; i++) {
        if (t[4 + i])
            gr[i] = t[4 + i];
        if (set && gr[i])   /* the fp32 kernels add */
            rc = cuda_err(d, cudaMemsetAsync(gr[i], 0, n[4 + i] * sizeof(float),
                                             cuda_stream(d)), op);
    }
    cuda_att a;
    if (!rc) {
        rc = cuda_att_setup(d, op, &a, in[0], in[1], in[2], cu_seqlens, NULL, cu_seqlens, NULL,
                            nseq, max_seqlen, Hq, Hkv, D, causal);
        rc = rc ? (rc > 0 ? 0 : rc)
                : cuda_att_bwd(d, op, gr[0], gr[1], gr[2], in[7], in[3], lse, a, nseq,
                               max_seqlen);
    }
    float *g[3] = { dq, dk, dv };
    for (int i = 0; !rc && i < 3; i++)
        if (t[4 + i])
            rc = cuda_to_bf16(d, (kcuda_bf16 *)g[i], t[4 + i], n[4 + i], op);
    return f32_release(d, t, 8, rc);
}

int cuda_attention_block_forward(kdev *d, float *out, float *lse, const float *q,
                                 const float *k, const float *v, const int *q_cu,
                                 const int *q_pos, const int *k_cu, const int *k_pos, int nseq,
                                 int max_q, int max_k, int Hq, int Hkv, int D, int causal)
{
    static const char op[] = "attention_block_forward";
    if (int rc = cuda_no_act16(d, op, "out", out))
        return rc;
    cuda_att a;
    int rc = cuda_att_setup(d, op, &a, q, k, v, q_cu, q_pos, k_cu, k_pos, nseq, max_q, Hq, Hkv,
                            D, causal);
    if (rc || max_k <= 0) /* no keys: every query is left as it was */
        return rc > 0 ? 0 : rc;
    return cuda_att_fwd(d, op, out, lse, a, nseq, 1);
}

int cuda_attention_block_backward(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, const int *q_cu,
                                  const int *q_pos, const int *k_cu, const int *k_pos,
                                  int nseq, int max_q, int max_k, int Hq, int Hkv, int D,
                                  int causal)
{
    static const char op[] = "attention_block_backward";
    if (int rc = cuda_no_act16(d, op, "out", out))
        return rc;
    cuda_att a;
    int rc = cuda_att_setup(d, op, &a, q, k, v, q_cu, q_pos, k_cu, k_pos, nseq, max_q, Hq, Hkv,
                            D, causal);
    if (rc || max_k <= 0)
        return rc > 0 ? 0 : rc;
    return cuda_att_bwd(d, op, dq, dk, dv, dout, out, lse, a, nseq, max_k);
}
