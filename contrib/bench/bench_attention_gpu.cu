/* bench_attention_gpu.cu - flash attention (kcuda_attention_*_bf16) against a naive GPU
 * baseline on decoder-like and encoder-like shapes.  Prints one table.
 *
 * Naive baseline: one block per (query token, head) that materialises the whole score row
 * of that query in shared memory (fp32, CUDA cores, no tiling: every query re-reads all of
 * K and V); its backward is one block per query row for dq and one per key row for dk/dv,
 * each materialising its row or column of P and dS.  It also serves as a second reference
 * at sizes the CPU test does not reach: the last column is the largest relative L2
 * difference between the two over out, dq, dk, dv.
 * FLOPs: forward 4 * sum(L^2) * D * Hq (halved when causal), backward 2.5 x forward.
 * Inputs are random (never zeros), 2 warm-up calls, the median of REPS timed calls
 * (events).  Usage: bench_attention_gpu */
#include "contrib/bench/bench_gpu_util.h"

#include <cuda_bf16.h>

#define REPS 10
#define NAIVE_REPS 3
#define NT 128

typedef __nv_bfloat16 bf;

struct shape {
    const char *name;
    int nseq, len, Hq, Hkv, D, causal;
};

static const struct shape shapes[] = {
    {"decoder S4096 GQA8", 1, 4096, 16, 2, 128, 1},
    {"encoder win64", 64, 64, 16, 16, 80, 0},
    {"encoder full1024", 4, 1024, 16, 16, 80, 0},
    {"gpt2 B8 T1024", 8, 1024, 12, 12, 64, 1},
};

/* ---- naive baseline ----------------------------------------------------------------- */

__device__ float blk_reduce(float v, float *part, int is_max)
{
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = part[0];
    for (int w = 1; w < NT / 32; w++)
        r = is_max ? fmaxf(r, part[w]) : r + part[w];
    return r;
}

/* token -> (start, L, position) through the cu_seqlens array */
__device__ void locate(const int *cu, int nseq, int tok, int *start, int *L, int *pos)
{
    int lo = 0, hi = nseq - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= tok)
            lo = mid;
        else
            hi = mid - 1;
    }
    *start = cu[lo];
    *L = cu[lo + 1] - cu[lo];
    *pos = tok - cu[lo];
}

__device__ float dot_bf(const bf *a, const bf *b, int D)
{
    float s = 0.0f;
    for (int d = 0; d < D; d++)
        s += __bfloat162float(a[d]) * __bfloat162float(b[d]);
    return s;
}

/* grid (N, Hq); smem (max_seqlen + 32) floats */
__global__ void naive_fwd(bf *out, float *lse, const bf *q, const bf *k, const bf *v,
                          const int *cu, int nseq, int Hq, int Hkv, int D, int causal,
                          float scale)
{
    extern __shared__ float sm[];
    float *part = sm, *p = sm + 32;
    int start, L, i, h = blockIdx.y, g = h / (Hq / Hkv);
    locate(cu, nseq, blockIdx.x, &start, &L, &i);
    int nk = causal ? i + 1 : L;
    const bf *qi = q + ((size_t)blockIdx.x * Hq + h) * D;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < nk; j += NT) {
        p[j] = scale * dot_bf(qi, k + ((size_t)(start + j) * Hkv + g) * D, D);
        mx = fmaxf(mx, p[j]);
    }
    mx = blk_reduce(mx, part, 1);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < nk; j += NT) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    sum = blk_reduce(sum, part, 0); /* its barriers also publish p[] */
    for (int d = threadIdx.x; d < D; d += NT) {
        float acc = 0.0f;
        for (int j = 0; j < nk; j++)
            acc += p[j] * __bfloat162float(v[((size_t)(start + j) * Hkv + g) * D + d]);
        out[((size_t)blockIdx.x * Hq + h) * D + d] = __float2bfloat16_rn(acc / sum);
    }
    if (threadIdx.x == 0)
        lse[(size_t)blockIdx.x * Hq + h] = mx + logf(sum);
}

/* dq; grid (N, Hq); smem (max_seqlen + 32) floats */
__global__ void naive_dq(bf *dq, const bf *dout, const bf *q, const bf *k, const bf *v,
                         const bf *out, const float *lse, const int *cu, int nseq, int Hq,
                         int Hkv, int D, int causal, float scale)
{
    extern __shared__ float sm[];
    float *part = sm, *ds = sm + 32;
    int start, L, i, h = blockIdx.y, g = h / (Hq / Hkv);
    locate(cu, nseq, blockIdx.x, &start, &L, &i);
    int nk = causal ? i + 1 : L;
    size_t row = (size_t)blockIdx.x * Hq + h;
    const bf *qi = q + row * D, *doi = dout + row * D;
    float delta = 0.0f;
    for (int d = threadIdx.x; d < D; d += NT)
        delta += __bfloat162float(doi[d]) * __bfloat162float(out[row * D + d]);
    delta = blk_reduce(delta, part, 0);
    float l = lse[row];
    for (int j = threadIdx.x; j < nk; j += NT) {
        size_t kr = ((size_t)(start + j) * Hkv + g) * D;
        float p = expf(scale * dot_bf(qi, k + kr, D) - l);
        ds[j] = p * (dot_bf(doi, v + kr, D) - delta) * scale;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += NT) {
        float acc = 0.0f;
        for (int j = 0; j < nk; j++)
            acc += ds[j] * __bfloat162float(k[((size_t)(start + j) * Hkv + g) * D + d]);
        dq[row * D + d] = __float2bfloat16_rn(__bfloat162float(dq[row * D + d]) + acc);
    }
}

/* dk, dv; grid (N, Hkv); smem (2 * max_seqlen) floats */
__global__ void naive_dkdv(bf *dk, bf *dv, const bf *dout, const bf *q, const bf *k,
                           const bf *v, const bf *out, const float *lse, const int *cu,
                           int nseq, int Hq, int Hkv, int D, int causal, float scale,
                           int max_seqlen)
{
    extern __shared__ float sm[];
    float *pp = sm, *ds = sm + max_seqlen;
    int start, L, j, g = blockIdx.y, group = Hq / Hkv;
    locate(cu, nseq, blockIdx.x, &start, &L, &j);
    int i0 = causal ? j : 0;
    size_t kr = ((size_t)blockIdx.x * Hkv + g) * D;
    float accv[2] = {0.0f, 0.0f}, acck[2] = {0.0f, 0.0f}; /* d = threadIdx.x, + NT */
    for (int h = g * group; h < (g + 1) * group; h++) {
        __syncthreads();
        for (int i = i0 + threadIdx.x; i < L; i += NT) {
            size_t row = (size_t)(start + i) * Hq + h;
            float p = expf(scale * dot_bf(q + row * D, k + kr, D) - lse[row]);
            float delta = dot_bf(dout + row * D, out + row * D, D);
            pp[i] = p;
            ds[i] = p * (dot_bf(dout + row * D, v + kr, D) - delta) * scale;
        }
        __syncthreads();
        for (int c = 0; c < 2; c++) {
            int d = threadIdx.x + c * NT;
            if (d >= D)
                continue;
            for (int i = i0; i < L; i++) {
                size_t row = (size_t)(start + i) * Hq + h;
                accv[c] += pp[i] * __bfloat162float(dout[row * D + d]);
                acck[c] += ds[i] * __bfloat162float(q[row * D + d]);
            }
        }
    }
    for (int c = 0; c < 2; c++) {
        int d = threadIdx.x + c * NT;
        if (d < D) {
            dk[kr + d] = __float2bfloat16_rn(__bfloat162float(dk[kr + d]) + acck[c]);
            dv[kr + d] = __float2bfloat16_rn(__bfloat162float(dv[kr + d]) + accv[c]);
        }
    }
}

/* ---- driver ------------------------------------------------------------------------- */

struct bufs {
    bf *q, *k, *v, *dout, *out, *dq, *dk, *dv, *out2, *dq2, *dk2, *dv2;
    float *lse, *lse2;
    int *cu;
};

enum { OURS_FWD, OURS_BWD, NAIVE_FWD, NAIVE_BWD, NKINDS };

static int call(kcuda_ctx *kc, int kind, const struct shape *s, struct bufs *b, bf *out,
                float *lse, bf *dq, bf *dk, bf *dv)
{
    int N = s->nseq * s->len;
    float scale = 1.0f / sqrtf((float)s->D);
    size_t sm = (size_t)(s->len + 32) * sizeof(float);
    switch (kind) {
    case OURS_FWD:
        return kcuda_attention_forward_bf16(kc, (kcuda_bf16 *)out, lse, (kcuda_bf16 *)b->q,
                                            (kcuda_bf16 *)b->k, (kcuda_bf16 *)b->v, b->cu,
                                            s->nseq, s->len, s->Hq, s->Hkv, s->D, s->causal);
    case OURS_BWD:
        return kcuda_attention_backward_bf16(
            kc, (kcuda_bf16 *)dq, (kcuda_bf16 *)dk, (kcuda_bf16 *)dv, (kcuda_bf16 *)b->dout,
            (kcuda_bf16 *)b->q, (kcuda_bf16 *)b->k, (kcuda_bf16 *)b->v, (kcuda_bf16 *)b->out,
            b->lse, b->cu, s->nseq, s->len, s->Hq, s->Hkv, s->D, s->causal);
    case NAIVE_FWD:
        naive_fwd<<<dim3(N, s->Hq), NT, sm>>>(out, lse, b->q, b->k, b->v, b->cu, s->nseq,
                                              s->Hq, s->Hkv, s->D, s->causal, scale);
        break;
    default:
        naive_dq<<<dim3(N, s->Hq), NT, sm>>>(dq, b->dout, b->q, b->k, b->v, b->out, b->lse,
                                             b->cu, s->nseq, s->Hq, s->Hkv, s->D, s->causal,
                                             scale);
        naive_dkdv<<<dim3(N, s->Hkv), NT, 2 * (size_t)s->len * sizeof(float)>>>(
            dk, dv, b->dout, b->q, b->k, b->v, b->out, b->lse, b->cu, s->nseq, s->Hq, s->Hkv,
            s->D, s->causal, scale, s->len);
        break;
    }
    return gu_ck(cudaGetLastError(), "naive launch");
}

/* Median milliseconds of `reps` calls, or -1 on error. */
static float time_call(kcuda_ctx *kc, int kind, const struct shape *s, struct bufs *b, int reps)
{
    int naive = kind >= NAIVE_FWD;
    /* the naive kernels are plain launches: no context message to print */
    return bg_median_ms(naive ? NULL : kc, s->name, 2, reps, [&]() {
        return call(kc, kind, s, b, naive ? b->out2 : b->out, naive ? b->lse2 : b->lse,
                    naive ? b->dq2 : b->dq, naive ? b->dk2 : b->dk, naive ? b->dv2 : b->dv);
    });
}

static double rel_dev(const void *a, const void *b, size_t n)
{
    float *x = gu_download(a, n, 1), *y = gu_download(b, n, 1);
    double e = x && y ? gu_rel_l2(x, y, n) : INFINITY;
    free(x);
    free(y);
    return e;
}

/* Both backwards once from zero gradients (after the timing, which accumulated). */
static double compare(kcuda_ctx *kc, const struct shape *s, struct bufs *b)
{
    size_t N = (size_t)s->nseq * s->len, nq = N * s->Hq * s->D, nk = N * s->Hkv * s->D;
    bf *g[6] = {b->dq, b->dk, b->dv, b->dq2, b->dk2, b->dv2};
    size_t n[6] = {nq, nk, nk, nq, nk, nk};
    for (int i = 0; i < 6; i++)
        cudaMemset(g[i], 0, n[i] * 2);
    if (call(kc, OURS_FWD, s, b, b->out, b->lse, NULL, NULL, NULL) < 0 ||
        call(kc, NAIVE_FWD, s, b, b->out2, b->lse2, NULL, NULL, NULL) < 0 ||
        call(kc, OURS_BWD, s, b, NULL, NULL, b->dq, b->dk, b->dv) < 0 ||
        call(kc, NAIVE_BWD, s, b, NULL, NULL, b->dq2, b->dk2, b->dv2) < 0)
        return INFINITY;
    double worst = rel_dev(b->out, b->out2, nq);
    for (int i = 0; i < 3; i++) {
        double e = rel_dev(g[i], g[i + 3], n[i]);
        worst = e > worst || isnan(e) ? e : worst;
    }
    return worst;
}

int main(void)
{
    cudaDeviceProp prop;
    kcuda_ctx *kc = NULL;
    int opened = bg_open("bench_attention_gpu", &prop, &kc);
    if (opened <= 0)
        return opened < 0;
    uint64_t seed = bg_seed();
    printf("# %s, %d SMs; flash attention (bf16, mma.sync) vs naive (fp32 score rows in "
           "shared memory); median of %d (naive %d); TFLOP/s: fwd 4*sum(L^2)*D*Hq (/2 causal), "
           "bwd 2.5x\n",
           prop.name, prop.multiProcessorCount, REPS, NAIVE_REPS);
    printf("%-20s %5s %5s %3s %3s %3s %1s | %8s %6s %8s %6s %5s | %8s %6s %8s %6s %5s | %8s\n",
           "shape", "nseq", "len", "Hq", "Hkv", "D", "c", "fwd ms", "TF/s", "naive ms", "TF/s",
           "x", "bwd ms", "TF/s", "naive ms", "TF/s", "x", "max diff");
    int status = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct shape *s = &shapes[si];
        size_t N = (size_t)s->nseq * s->len, nq = N * s->Hq * s->D, nk = N * s->Hkv * s->D;
        struct bufs b;
        memset(&b, 0, sizeof b);
        bf **qs[] = {&b.q, &b.dout, &b.out, &b.dq, &b.out2, &b.dq2};
        bf **ks[] = {&b.k, &b.v, &b.dk, &b.dv, &b.dk2, &b.dv2};
        int bad = 0;
        for (int i = 0; i < 6; i++)
            bad |= gu_ck(cudaMalloc((void **)qs[i], nq * 2), "cudaMalloc") |
                   gu_ck(cudaMalloc((void **)ks[i], nk * 2), "cudaMalloc");
        bad |= gu_ck(cudaMalloc((void **)&b.lse, N * s->Hq * 4), "cudaMalloc") |
               gu_ck(cudaMalloc((void **)&b.lse2, N * s->Hq * 4), "cudaMalloc") |
               gu_ck(cudaMalloc((void **)&b.cu, (s->nseq + 1) * sizeof(int)), "cudaMalloc");
        if (bad)
            return 1;
        int *cu = (int *)malloc((s->nseq + 1) * sizeof(int));
        for (int i = 0; i <= s->nseq; i++)
            cu[i] = i * s->len;
        cudaMemcpy(b.cu, cu, (s->nseq + 1) * sizeof(int), cudaMemcpyHostToDevice);
        free(cu);
        bg_fill_bf16(b.q, nq, seed++, -2.0f, 2.0f);
        bg_fill_bf16(b.k, nk, seed++, -2.0f, 2.0f);
        bg_fill_bf16(b.v, nk, seed++, -1.0f, 1.0f);
        bg_fill_bf16(b.dout, nq, seed++, -1.0f, 1.0f);
        bf *gz[] = {b.dq, b.dk, b.dv, b.dq2, b.dk2, b.dv2};
        size_t gn[] = {nq, nk, nk, nq, nk, nk};
        for (int i = 0; i < 6; i++)
            cudaMemset(gz[i], 0, gn[i] * 2);
        /* the backward reads out and lse of our forward */
        float t[NKINDS];
        t[OURS_FWD] = time_call(kc, OURS_FWD, s, &b, REPS);
        t[NAIVE_FWD] = time_call(kc, NAIVE_FWD, s, &b, NAIVE_REPS);
        t[OURS_BWD] = time_call(kc, OURS_BWD, s, &b, REPS);
        t[NAIVE_BWD] = time_call(kc, NAIVE_BWD, s, &b, NAIVE_REPS);
        double diff = compare(kc, s, &b);
        double fl = 4.0 * s->nseq * (double)s->len * s->len * s->D * s->Hq *
                    (s->causal ? 0.5 : 1.0);
        printf("%-20s %5d %5d %3d %3d %3d %1d | %8.3f %6.1f %8.3f %6.1f %5.1f | "
               "%8.3f %6.1f %8.3f %6.1f %5.1f | %8.1e\n",
               s->name, s->nseq, s->len, s->Hq, s->Hkv, s->D, s->causal, t[OURS_FWD],
               fl / t[OURS_FWD] * 1e-9, t[NAIVE_FWD], fl / t[NAIVE_FWD] * 1e-9,
               t[NAIVE_FWD] / t[OURS_FWD], t[OURS_BWD], 2.5 * fl / t[OURS_BWD] * 1e-9,
               t[NAIVE_BWD], 2.5 * fl / t[NAIVE_BWD] * 1e-9, t[NAIVE_BWD] / t[OURS_BWD], diff);
        for (int i = 0; i < NKINDS; i++)
            if (t[i] < 0)
                status = 1;
        if (!(diff <= 2e-2))
            status = 1;
        for (int i = 0; i < 6; i++) {
            cudaFree(*qs[i]);
            cudaFree(*ks[i]);
        }
        cudaFree(b.lse);
        cudaFree(b.lse2);
        cudaFree(b.cu);
    }
    kcuda_ctx_free(kc);
    return status;
}
