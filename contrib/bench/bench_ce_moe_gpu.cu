/* bench_ce_moe_gpu.cu - the fused bf16 cross-entropy and the MoE layer kernels.  Prints
 * one table.
 *
 * Cross-entropy at N=4096, V=151936 (Qwen's vocabulary), forward + backward in place:
 *   ours:  kcuda_ce_forward_bf16 (one read of the bf16 logits) + kcuda_ce_backward_bf16
 *          (one read, one write): 6 bytes per logit;
 *   naive: the bf16 logits widened to an fp32 copy, the two-pass fp32 kernels
 *          (kcuda_crossentropy_forward_f32/backward_f32 into a zeroed fp32 gradient) and
 *          the gradient narrowed back to bf16.
 *   GB/s counts the 6 bytes per logit that the task needs (for both rows, so that the
 *   two compare as time); % of the HBM peak computed from the device attributes.
 * MoE layer at N=4096 tokens, H=2048, E=64 experts, top-8, Fm=768 (router logits given):
 *   forward = router, plan, offsets to the host, permute, expert MLPs, unpermute;
 *   backward = unpermute, expert MLPs, permute, router backward.  The expert GEMMs are
 *   compared with one dense GEMM chain of the same total rows (R=N*K) and FLOPs, the
 *   best a grouped GEMM could do.
 * Each timing is the median of REPS runs after 3 warm-ups, with events on the stream. */
#include "contrib/bench/bench_gpu_util.h"

#include <cuda_bf16.h>

#define REPS 10

__global__ void widen(float *y, const __nv_bfloat16 *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __bfloat162float(x[i]);
}

__global__ void narrow(__nv_bfloat16 *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __float2bfloat16_rn(x[i]);
}

static unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256); }

static void fill(kcuda_bf16 *x, size_t n, uint64_t *seed, float lo, float hi)
{
    bg_fill_bf16(x, n, (*seed)++, lo, hi);
}

/* Median ms of fn(arg) over REPS runs; -1 on error. */
static float timeit(int (*fn)(void *), void *arg)
{
    return bg_median_ms(NULL, "bench", 3, REPS, [&]() { return fn(arg); });
}

/* ---- cross-entropy ----------------------------------------------------------------- */

struct ce {
    kcuda_ctx *k;
    int N, V;
    kcuda_bf16 *logits, *work; /* work: the in-place buffer, refreshed from logits */
    float *loss, *lse, *dloss, *l32, *dl32;
    int *tg;
};

static int ce_refresh(void *a)
{
    struct ce *c = (struct ce *)a;
    return -(cudaMemcpyAsync(c->work, c->logits, (size_t)c->N * c->V * 2,
                             cudaMemcpyDeviceToDevice, 0) != cudaSuccess);
}

static int ce_fwd(void *a)
{
    struct ce *c = (struct ce *)a;
    return kcuda_ce_forward_bf16(c->k, c->loss, c->lse, c->work, c->tg, c->N, c->V, -1);
}

static int ce_bwd(void *a)
{
    struct ce *c = (struct ce *)a;
    return kcuda_ce_backward_bf16(c->k, c->work, c->work, c->lse, c->tg, c->dloss, c->N, c->V,
                                  -1);
}

static int naive_fwd(void *a)
{
    struct ce *c = (struct ce *)a;
    size_t n = (size_t)c->N * c->V;
    widen<<<blocks(n), 256>>>(c->l32, (const __nv_bfloat16 *)c->logits, n);
    return kcuda_crossentropy_forward_f32(c->k, c->loss, c->l32, c->tg, c->N, c->V, -1);
}

static int naive_bwd(void *a)
{
    struct ce *c = (struct ce *)a;
    size_t n = (size_t)c->N * c->V;
    if (cudaMemsetAsync(c->dl32, 0, n * 4, 0) != cudaSuccess)
        return -1;
    int rc = kcuda_crossentropy_backward_f32(c->k, c->dl32, c->l32, c->tg, c->dloss, c->N,
                                             c->V, -1);
    narrow<<<blocks(n), 256>>>((__nv_bfloat16 *)c->work, c->dl32, n);
    return rc;
}

static double peak_gbs(void)
{
    int clk_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
    double g = 2.0 * clk_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    return g > 0 ? g : 4800.0;
}

static int bench_ce(kcuda_ctx *k, uint64_t *seed)
{
    struct ce c = {};
    c.k = k;
    c.N = 4096;
    c.V = 151936;
    size_t n = (size_t)c.N * c.V;
    int *tg = (int *)malloc(c.N * sizeof(int));
    float *dl = (float *)malloc(c.N * sizeof(float));
    for (int i = 0; i < c.N; i++) {
        tg[i] = i % 50 == 7 ? -1 : (int)((i * 2654435761u) % (unsigned)c.V);
        dl[i] = 1.0f / c.N;
    }
    if (gu_ck(cudaMalloc(&c.logits, n * 2), "logits") || gu_ck(cudaMalloc(&c.work, n * 2), "work") ||
        gu_ck(cudaMalloc(&c.loss, c.N * 4), "loss") || gu_ck(cudaMalloc(&c.lse, c.N * 4), "lse") ||
        gu_ck(cudaMalloc(&c.dloss, c.N * 4), "dloss") || gu_ck(cudaMalloc(&c.tg, c.N * 4), "tg") ||
        gu_ck(cudaMalloc(&c.l32, n * 4), "fp32 logits") || gu_ck(cudaMalloc(&c.dl32, n * 4), "fp32 grad"))
        return 1;
    cudaMemcpy(c.tg, tg, c.N * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(c.dloss, dl, c.N * 4, cudaMemcpyHostToDevice);
    free(tg);
    free(dl);
    fill(c.logits, n, seed, -12, 12);
    ce_refresh(&c);
    float f = timeit(ce_fwd, &c), b = timeit(ce_bwd, &c); /* bwd in place, repeatedly: the
                                                             bytes moved are the same */
    ce_refresh(&c);
    float nf = timeit(naive_fwd, &c), nb = timeit(naive_bwd, &c);
    if (f < 0 || b < 0 || nf < 0 || nb < 0) {
        printf("# cross-entropy: %s\n", kcuda_ctx_errmsg(k));
        return 1;
    }
    double peak = peak_gbs(), bytes = 6.0 * n;
    printf("\ncross-entropy N=%d V=%d (bf16 logits %.2f GB), HBM peak %.0f GB/s\n", c.N, c.V,
           n * 2 / 1e9, peak);
    printf("%-34s %9s %9s %9s %10s %7s\n", "implementation", "fwd ms", "bwd ms", "total ms",
           "GB/s", "% peak");
    printf("%-34s %9.3f %9.3f %9.3f %10.0f %6.1f%%\n", "fused bf16 (ours, bwd in place)", f, b,
           f + b, bytes / ((f + b) * 1e-3) / 1e9, 100.0 * bytes / ((f + b) * 1e-3) / 1e9 / peak);
    printf("%-34s %9.3f %9.3f %9.3f %10.0f %6.1f%%\n", "naive fp32 copy, two-pass", nf, nb,
           nf + nb, bytes / ((nf + nb) * 1e-3) / 1e9,
           100.0 * bytes / ((nf + nb) * 1e-3) / 1e9 / peak);
    printf("%-34s %9s %9s %9.2fx\n", "speedup", "", "", (nf + nb) / (f + b));
    cudaFree(c.logits);
    cudaFree(c.work);
    cudaFree(c.loss);
    cudaFree(c.lse);
    cudaFree(c.dloss);
    cudaFree(c.tg);
    cudaFree(c.l32);
    cudaFree(c.dl32);
    return 0;
}

/* ---- MoE layer ------------------------------------------------------------------------ */

struct moe {
    kcuda_ctx *k;
    int N, H, E, K, Fm, R;
    float *z, *w, *pr, *aux, *dz, *dtw;
    int *idx, *cnt, *off, *src, *slot, off_h[1025];
    kcuda_bf16 *x, *xp, *h, *a, *yp, *y, *dy, *dyp, *da, *dh, *dxp, *dx, *wg, *wd, *dwg, *dwd;
    float t_router, t_plan, t_perm, t_exp, t_unperm;
};

#define STEP(call)                 \
    do {                           \
        if ((call) < 0)            \
            return -1;             \
    } while (0)

static int moe_fwd(void *arg)
{
    struct moe *m = (struct moe *)arg;
    STEP(kcuda_moe_router_forward(m->k, m->idx, m->w, m->pr, m->cnt, m->aux, m->z, m->N, m->E,
                                  m->K));
    STEP(kcuda_moe_plan(m->k, m->off, m->src, m->slot, m->idx, m->N, m->E, m->K));
    if (cudaMemcpy(m->off_h, m->off, (m->E + 1) * sizeof(int), cudaMemcpyDeviceToHost))
        return -1;
    STEP(kcuda_moe_permute_forward_bf16(m->k, m->xp, m->x, m->src, m->N, m->K, m->H));
    STEP(kcuda_moe_experts_forward_bf16(m->k, m->yp, m->h, m->a, m->xp, m->wg, m->wd, m->off_h,
                                        m->E, m->H, m->Fm));
    STEP(kcuda_moe_unpermute_forward_bf16(m->k, m->y, m->yp, m->w, m->slot, m->N, m->K, m->H));
    return 0;
}

static int moe_bwd(void *arg)
{
    struct moe *m = (struct moe *)arg;
    STEP(kcuda_moe_unpermute_backward_bf16(m->k, m->dyp, m->dtw, m->dy, m->yp, m->w, m->slot,
                                           m->N, m->K, m->H));
    STEP(kcuda_moe_experts_backward_bf16(m->k, m->dxp, m->dwg, m->dwd, m->da, m->dh, m->dyp,
                                         m->xp, m->h, m->a, m->wg, m->wd, m->off_h, m->E, m->H,
                                         m->Fm));
    STEP(kcuda_moe_permute_backward_bf16(m->k, m->dx, m->dxp, m->slot, m->N, m->K, m->H));
    STEP(kcuda_moe_router_backward(m->k, m->dz, m->dtw, 0.01f, m->pr, m->idx, m->w, m->cnt,
                                   m->N, m->E, m->K));
    return 0;
}

static int moe_experts_fwd(void *arg)
{
    struct moe *m = (struct moe *)arg;
    return kcuda_moe_experts_forward_bf16(m->k, m->yp, m->h, m->a, m->xp, m->wg, m->wd,
                                          m->off_h, m->E, m->H, m->Fm);
}

static int moe_experts_bwd(void *arg)
{
    struct moe *m = (struct moe *)arg;
    return kcuda_moe_experts_backward_bf16(m->k, m->dxp, m->dwg, m->dwd, m->da, m->dh, m->dyp,
                                           m->xp, m->h, m->a, m->wg, m->wd, m->off_h, m->E, m->H,
                                           m->Fm);
}

/* The same FLOPs as one dense chain over R rows with expert 0's weights. */
static int dense_fwd(void *arg)
{
    struct moe *m = (struct moe *)arg;
    STEP(kcuda_matmul_forward_bf16(m->k, m->h, m->xp, m->wg, NULL, m->R, m->H, 2 * m->Fm));
    STEP(kcuda_swiglu_forward_bf16(m->k, m->a, m->h, m->R, m->Fm));
    return kcuda_matmul_forward_bf16(m->k, m->yp, m->a, m->wd, NULL, m->R, m->Fm, m->H);
}

static int dense_bwd(void *arg)
{
    struct moe *m = (struct moe *)arg;
    STEP(kcuda_matmul_backward_bf16(m->k, m->da, m->dwd, NULL, m->dyp, m->a, m->wd, m->R, m->Fm,
                                    m->H));
    STEP(kcuda_swiglu_backward_bf16(m->k, m->dh, m->da, m->h, m->R, m->Fm, 1));
    return kcuda_matmul_backward_bf16(m->k, m->dxp, m->dwg, NULL, m->dh, m->xp, m->wg, m->R,
                                      m->H, 2 * m->Fm);
}

static int bench_moe(kcuda_ctx *k, uint64_t *seed)
{
    struct moe m = {};
    m.k = k;
    m.N = 4096, m.H = 2048, m.E = 64, m.K = 8, m.Fm = 768;
    m.R = m.N * m.K;
    size_t N = m.N, H = m.H, E = m.E, K = m.K, F = m.Fm, R = m.R;
    int bad = 0;
#define DM(p, n) bad |= gu_ck(cudaMalloc((void **)&(p), (n)), #p)
    DM(m.z, N * E * 4); DM(m.w, N * K * 4); DM(m.pr, N * E * 4); DM(m.aux, 4);
    DM(m.dz, N * E * 4); DM(m.dtw, N * K * 4);
    DM(m.idx, N * K * 4); DM(m.cnt, E * 4); DM(m.off, (E + 1) * 4); DM(m.src, R * 4);
    DM(m.slot, R * 4);
    DM(m.x, N * H * 2); DM(m.xp, R * H * 2); DM(m.h, R * 2 * F * 2); DM(m.a, R * F * 2);
    DM(m.yp, R * H * 2); DM(m.y, N * H * 2); DM(m.dy, N * H * 2); DM(m.dyp, R * H * 2);
    DM(m.da, R * F * 2); DM(m.dh, R * 2 * F * 2); DM(m.dxp, R * H * 2); DM(m.dx, N * H * 2);
    DM(m.wg, E * 2 * F * H * 2); DM(m.wd, E * H * F * 2); DM(m.dwg, E * 2 * F * H * 2);
    DM(m.dwd, E * H * F * 2);
#undef DM
    if (bad)
        return 1;
    /* router logits: random, so the load is roughly even (as after balancing) */
    {
        uint64_t s = *seed | 1;
        float *z = gu_rand(&s, N * E, -2, 2, 0);
        cudaMemcpy(m.z, z, N * E * 4, cudaMemcpyHostToDevice);
        free(z);
    }
    fill(m.x, N * H, seed, -1, 1);
    fill(m.dy, N * H, seed, -1e-3f, 1e-3f);
    fill(m.wg, E * 2 * F * H, seed, -0.02f, 0.02f);
    fill(m.wd, E * H * F, seed, -0.02f, 0.02f);
    cudaMemset(m.dz, 0, N * E * 4);
    cudaMemset(m.dtw, 0, N * K * 4);
    cudaMemset(m.dwg, 0, E * 2 * F * H * 2);
    cudaMemset(m.dwd, 0, E * H * F * 2);
    cudaMemset(m.dx, 0, N * H * 2);
    cudaMemset(m.dxp, 0, R * H * 2);
    cudaMemset(m.dyp, 0, R * H * 2);
    float f = timeit(moe_fwd, &m), b = timeit(moe_bwd, &m);
    float ef = timeit(moe_experts_fwd, &m), eb = timeit(moe_experts_bwd, &m);
    float df = timeit(dense_fwd, &m), db = timeit(dense_bwd, &m);
    if (f < 0 || b < 0 || ef < 0 || eb < 0 || df < 0 || db < 0) {
        printf("# moe: %s\n", kcuda_ctx_errmsg(k));
        return 1;
    }
    int mn = m.off_h[1] - m.off_h[0], mx = mn, ent;
    for (int e = 0; e < m.E; e++) {
        int c = m.off_h[e + 1] - m.off_h[e];
        mn = c < mn ? c : mn;
        mx = c > mx ? c : mx;
    }
    long hits, misses;
    kcuda_ctx_gemm_stats(k, &ent, &hits, &misses);
    double flop_f = 2.0 * R * H * 3 * F, flop_b = 2 * flop_f;
    printf("\nMoE layer N=%d H=%d E=%d top-%d Fm=%d (rows per expert %d..%d); "
           "GEMM cache %d entries, %ld misses\n",
           m.N, m.H, m.E, m.K, m.Fm, mn, mx, ent, misses);
    printf("%-34s %9s %9s %9s %10s %10s\n", "", "fwd ms", "bwd ms", "total ms", "fwd TF/s",
           "bwd TF/s");
    printf("%-34s %9.3f %9.3f %9.3f %10s %10s\n", "whole layer (router..unpermute)", f, b, f + b,
           "", "");
    printf("%-34s %9.3f %9.3f %9.3f %10.0f %10.0f\n", "expert MLPs, one GEMM per expert", ef, eb,
           ef + eb, flop_f / (ef * 1e-3) / 1e12, flop_b / (eb * 1e-3) / 1e12);
    printf("%-34s %9.3f %9.3f %9.3f %10.0f %10.0f\n", "dense chain, same rows and FLOPs", df, db,
           df + db, flop_f / (df * 1e-3) / 1e12, flop_b / (db * 1e-3) / 1e12);
    printf("%-34s %9.3f %9.3f %9.3f\n", "routing and data movement", f - ef, b - eb,
           (f - ef) + (b - eb));
    void *bufs[] = {m.z, m.w, m.pr, m.aux, m.dz, m.dtw, m.idx, m.cnt, m.off, m.src, m.slot,
                    m.x, m.xp, m.h, m.a, m.yp, m.y, m.dy, m.dyp, m.da, m.dh, m.dxp, m.dx,
                    m.wg, m.wd, m.dwg, m.dwd};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        cudaFree(bufs[i]);
    return 0;
}

int main(void)
{
    cudaDeviceProp prop;
    kcuda_ctx *k = NULL;
    int opened = bg_open("bench_ce_moe_gpu", &prop, &k);
    if (opened <= 0)
        return opened < 0;
    uint64_t seed = bg_seed();
    printf("# %s, %d SMs; median of %d runs after 3 warm-ups\n", prop.name,
           prop.multiProcessorCount, REPS);
    int rc = bench_ce(k, &seed);
    rc |= bench_moe(k, &seed);
    kcuda_ctx_free(k);
    return rc;
}
