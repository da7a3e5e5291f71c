/* bench_elementwise_gpu.cu - memory bandwidth of the elementwise, normalisation and
 * optimizer kernels (kcuda_layernorm_*, residual norms, RoPE, GELU, embedding,
 * multi-tensor sum of squares and AdamW) at Qwen2.5-VL-3B decoder sizes: N = 4096 tokens,
 * C = 2048 hidden, 16 heads x 128, fc width 8192, vocabulary 151936, and an optimizer
 * shard of about 3.7e9 / 16 parameters (whole decoder layers' tensors).  Prints one table:
 * bytes each call must move, the median time, GB/s and the share of the H200's HBM peak
 * (4.8 TB/s), next to a baseline: a device-to-device cudaMemcpy moving the same bytes
 * (what the memory system gives a plain copy), or for the fused/multi-tensor kernels the
 * unfused composition they replace.
 * Inputs are random (hash fill), 3 warm-up calls, REPS timed calls, median reported. */
#include "contrib/bench/bench_gpu_util.h"

#include <cuda_bf16.h>

#define REPS 20
#define HBM_PEAK_GBS 4800.0

typedef kcuda_bf16 bf;

/* The unfused baseline of the residual norms: a plain add, then the norm. */
__global__ void add_bf16(__nv_bfloat16 *out, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                         size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

static uint64_t g_seed = 1;

static bf *rbf(size_t n, float lo, float hi)
{
    bf *d = NULL;
    if (gu_ck(cudaMalloc((void **)&d, n * 2), "cudaMalloc"))
        return NULL;
    bg_fill_bf16(d, n, g_seed++, lo, hi);
    return d;
}

static float *rf32(size_t n, float lo, float hi)
{
    float *d = NULL;
    if (gu_ck(cudaMalloc((void **)&d, n * 4), "cudaMalloc"))
        return NULL;
    bg_fill_f32(d, n, g_seed++, lo, hi);
    return d;
}

/* Median milliseconds of f() (which returns a kcuda code), or -1 on an error. */
template <typename F>
static float time_ms(kcuda_ctx *k, const char *what, F f)
{
    return bg_median_ms(k, what, 3, REPS, f);
}

static void *g_copy_a, *g_copy_b; /* scratch of the copy baseline, 2 x max bytes / 2 */

/* GB/s of a device-to-device copy moving `bytes` in total (bytes/2 read + bytes/2 written). */
static double copy_gbs(kcuda_ctx *k, double bytes)
{
    size_t half = (size_t)(bytes / 2);
    if (half > ((size_t)1 << 30))
        return NAN; /* beyond the scratch buffers */
    float t = time_ms(k, "memcpy", [&] {
        return cudaMemcpyAsync(g_copy_a, g_copy_b, half, cudaMemcpyDeviceToDevice, 0) ==
                       cudaSuccess
                   ? 0
                   : KCUDA_ECUDA;
    });
    return t > 0 ? bytes / (t * 1e-3) * 1e-9 : NAN;
}

static int g_status;

static void row(const char *name, const char *shape, double bytes, float ms, const char *base,
                double base_gbs)
{
    double gbs = ms > 0 ? bytes / (ms * 1e-3) * 1e-9 : NAN;
    if (ms < 0)
        g_status = 1;
    printf("%-30s %-22s %9.1f %10.1f %9.0f %6.1f%% | %-24s %9.0f\n", name, shape, bytes * 1e-6,
           ms * 1e3, gbs, 100.0 * gbs / HBM_PEAK_GBS, base, base_gbs);
}

int main(void)
{
    cudaDeviceProp prop;
    kcuda_ctx *k = NULL;
    int opened = bg_open("bench_elementwise_gpu", &prop, &k);
    if (opened <= 0)
        return opened < 0;
    g_seed = bg_seed();
    const int N = 4096, C = 2048, H = 16, D = 128, F = 8192, V = 151936;
    const size_t nc = (size_t)N * C, nf = (size_t)N * F;
    const double shard = 3.7e9 / 16;
    if (gu_ck(cudaMalloc(&g_copy_a, 1u << 30), "copy a") ||
        gu_ck(cudaMalloc(&g_copy_b, 1u << 30), "copy b"))
        return 1;
    printf("# %s, %d SMs; median of %d calls; GB/s = bytes the call must move / time; "
           "peak %.0f GB/s\n",
           prop.name, prop.multiProcessorCount, REPS, HBM_PEAK_GBS);
    printf("%-30s %-22s %9s %10s %9s %7s | %-24s %9s\n", "kernel", "shape", "MB", "us", "GB/s",
           "peak", "baseline", "GB/s");

    bf *x = rbf(nc, -2, 2), *r = rbf(nc, -2, 2), *y = rbf(nc, -1, 1), *s = rbf(nc, -1, 1);
    bf *dy = rbf(nc, -1, 1), *dx = rbf(nc, -1e-3f, 1e-3f), *w = rbf(C, 0.5f, 1.5f);
    bf *b = rbf(C, -1, 1);
    float *mean = rf32(N, 0, 0), *rstd = rf32(N, 0, 0), *dw = rf32(C, 0, 0), *db = rf32(C, 0, 0);
    if (!x || !r || !y || !s || !dy || !dx || !w || !b || !mean || !rstd || !dw || !db)
        return 1;
    char shp[64];
    snprintf(shp, sizeof shp, "%dx%d bf16", N, C);
    double by = 4.0 * nc;
    row("layernorm_forward", shp, by, time_ms(k, "ln fwd", [&] {
            return kcuda_layernorm_forward_bf16(k, y, mean, rstd, x, w, b, N, C, 1e-5f);
        }), "memcpy same bytes", copy_gbs(k, by));
    by = 12.0 * nc;
    row("layernorm_backward", shp, by, time_ms(k, "ln bwd", [&] {
            return kcuda_layernorm_backward_bf16(k, dx, dw, db, dy, x, w, mean, rstd, N, C);
        }), "memcpy same bytes", copy_gbs(k, by));
    by = 8.0 * nc;
    float t_add_rms = time_ms(k, "add+rmsnorm", [&] {
        add_bf16<<<(unsigned)((nc + 255) / 256), 256>>>((__nv_bfloat16 *)s,
                                                        (__nv_bfloat16 *)x,
                                                        (__nv_bfloat16 *)r, nc);
        return kcuda_rmsnorm_forward_bf16(k, y, rstd, s, w, N, C, 1e-6f);
    });
    row("residual_rmsnorm_forward", shp, by, time_ms(k, "res rms", [&] {
            return kcuda_residual_rmsnorm_forward_bf16(k, y, s, rstd, x, r, w, N, C, 1e-6f);
        }), "add + rmsnorm_forward", t_add_rms > 0 ? by / (t_add_rms * 1e-3) * 1e-9 : NAN);
    row("residual_layernorm_forward", shp, by, time_ms(k, "res ln", [&] {
            return kcuda_residual_layernorm_forward_bf16(k, y, s, mean, rstd, x, r, w, b, N, C,
                                                         1e-5f);
        }), "memcpy same bytes", copy_gbs(k, by));

    /* RoPE on q [N, 16, 128]; tables as built by kcpu_rope_table_* */
    float *cs = rf32((size_t)N * D / 2, -1, 1), *sn = rf32((size_t)N * D / 2, -1, 1);
    if (!cs || !sn)
        return 1;
    snprintf(shp, sizeof shp, "%dx%dx%d bf16", N, H, D);
    by = 4.0 * N * H * D + 8.0 * N * (D / 2);
    row("rope_forward", shp, by, time_ms(k, "rope", [&] {
            return kcuda_rope_forward_bf16(k, x, cs, sn, N, H, D);
        }), "memcpy same bytes", copy_gbs(k, by));

    bf *g = rbf(nf, -4, 4), *go = rbf(nf, -1, 1), *gd = rbf(nf, -1e-3f, 1e-3f);
    if (!g || !go || !gd)
        return 1;
    snprintf(shp, sizeof shp, "%dx%d bf16", N, F);
    by = 4.0 * nf;
    row("gelu_forward (tanh)", shp, by, time_ms(k, "gelu", [&] {
            return kcuda_gelu_forward_bf16(k, go, g, nf, 0);
        }), "memcpy same bytes", copy_gbs(k, by));
    row("gelu_forward (erf)", shp, by, time_ms(k, "gelu erf", [&] {
            return kcuda_gelu_forward_bf16(k, go, g, nf, 1);
        }), "memcpy same bytes", copy_gbs(k, by));
    by = 8.0 * nf;
    row("gelu_backward (tanh)", shp, by, time_ms(k, "gelu bwd", [&] {
            return kcuda_gelu_backward_bf16(k, gd, go, g, nf, 0, 1);
        }), "memcpy same bytes", copy_gbs(k, by));
    cudaFree(g);
    cudaFree(go);
    cudaFree(gd);

    /* embedding: random ids over the whole vocabulary (nearly all distinct) */
    bf *table = rbf((size_t)V * C, -1, 1);
    float *dtable = rf32((size_t)V * C, 0, 0);
    int *ids = NULL;
    int *hid = (int *)malloc(N * sizeof(int));
    uint64_t st = g_seed;
    for (int i = 0; i < N; i++)
        hid[i] = (int)(gu_next(&st) % (uint64_t)V);
    if (!table || !dtable || gu_ck(cudaMalloc((void **)&ids, N * sizeof(int)), "ids") ||
        gu_ck(cudaMemcpy(ids, hid, N * sizeof(int), cudaMemcpyHostToDevice), "ids"))
        return 1;
    free(hid);
    snprintf(shp, sizeof shp, "%dx%d V=%d", N, C, V);
    by = 4.0 * nc + 4.0 * N;
    row("embedding_forward", shp, by, time_ms(k, "emb fwd", [&] {
            return kcuda_embedding_forward_bf16(k, y, ids, table, N, C);
        }), "memcpy same bytes", copy_gbs(k, by));
    by = 2.0 * nc + 8.0 * nc; /* dout read, fp32 table rows read and written */
    row("embedding_backward (sort)", shp, by, time_ms(k, "emb bwd", [&] {
            return kcuda_embedding_backward_bf16(k, dtable, dy, ids, N, C);
        }), "memcpy same bytes", copy_gbs(k, by));
    cudaFree(table);
    cudaFree(dtable);
    cudaFree(ids);

    /* optimizer shard: decoder layers (qkv, o, fc1 gate+up, fc2, 2 norms, qkv bias) until
     * about 3.7e9 / 16 parameters; one fp32 buffer per role cut into those tensors */
    const size_t sizes[] = {(size_t)C * 2560, (size_t)C * C, (size_t)C * 11008 * 2,
                            (size_t)11008 * C, C, C, 2560};
    const int per_layer = (int)(sizeof sizes / sizeof sizes[0]);
    size_t layer = 0;
    for (int i = 0; i < per_layer; i++)
        layer += sizes[i];
    int layers = (int)(shard / layer);
    if (layers < 1)
        layers = 1;
    int nt = layers * per_layer;
    size_t total = layer * layers;
    float *P = rf32(total, -1, 1), *G = rf32(total, -1, 1), *M = rf32(total, -0.1f, 0.1f);
    float *Vv = rf32(total, 0, 0.01f);
    bf *PB = rbf(total, 0, 0);
    kcuda_tensor_f32 *ht = (kcuda_tensor_f32 *)malloc(nt * sizeof *ht);
    kcuda_adamw_tensor *ha = (kcuda_adamw_tensor *)malloc(nt * sizeof *ha);
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        size_t n = sizes[i % per_layer];
        ht[i].p = G + off;
        ht[i].n = n;
        ha[i].param = P + off;
        ha[i].param_bf16 = PB + off;
        ha[i].grad = G + off;
        ha[i].m = M + off;
        ha[i].v = Vv + off;
        ha[i].n = n;
        ha[i].decay = n > (size_t)C;
        off += n;
    }
    kcuda_tensor_f32 *dt = NULL;
    kcuda_adamw_tensor *da = NULL;
    double *sumsq = NULL;
    float *clip = NULL;
    if (!P || !G || !M || !Vv || !PB || gu_ck(cudaMalloc((void **)&dt, nt * sizeof *ht), "t") ||
        gu_ck(cudaMalloc((void **)&da, nt * sizeof *ha), "a") ||
        gu_ck(cudaMalloc((void **)&sumsq, 8), "s") || gu_ck(cudaMalloc((void **)&clip, 4), "c") ||
        gu_ck(cudaMemcpy(dt, ht, nt * sizeof *ht, cudaMemcpyHostToDevice), "t") ||
        gu_ck(cudaMemcpy(da, ha, nt * sizeof *ha, cudaMemcpyHostToDevice), "a"))
        return 1;
    snprintf(shp, sizeof shp, "%d tensors, %.0fM", nt, total * 1e-6);
    by = 4.0 * total;
    row("multi_sumsq_f32", shp, by, time_ms(k, "sumsq", [&] {
            return kcuda_multi_sumsq_f32(k, sumsq, dt, nt);
        }), "memcpy same bytes", copy_gbs(k, by));
    if (kcuda_clip_factor(k, clip, sumsq, 1.0f) < 0)
        g_status = 1;
    by = 30.0 * total; /* read p g m v, write p m v and the bf16 copy */
    float t_single = time_ms(k, "per-tensor adamw", [&] {
        int rc = 0;
        for (int i = 0; i < nt && rc == 0; i++)
            rc = kcuda_adamw_update(k, ha[i].param, ha[i].param_bf16, ha[i].grad, ha[i].m,
                                    ha[i].v, ha[i].n, 1e-4f, 0.9f, 0.95f, 1e-8f,
                                    ha[i].decay ? 0.1f : 0.0f, 10);
        return rc;
    });
    row("multi_adamw_update", shp, by, time_ms(k, "multi adamw", [&] {
            return kcuda_multi_adamw_update(k, da, nt, clip, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                            10);
        }), "per-tensor adamw_update", t_single > 0 ? by / (t_single * 1e-3) * 1e-9 : NAN);
    printf("# multi_adamw does its per-element math in double (bitwise kcpu_adamw_update);"
           " the per-tensor baseline is fp32 and takes no clip factor\n");
    free(ht);
    free(ha);
    kcuda_ctx_free(k);
    return g_status;
}
