/* bench_kdev_gpu.cu - the cuda device's ops (kdev.h, precision BF16 as hearth-train runs
 * them) at the shapes of one GPT-2 124M micro batch of 16 x 1024 tokens, one row per op,
 * and what they add up to over a training step of 4 such micro batches: where the step's
 * time goes op by op, without the model around it.  Beside the ops, the raw cuBLASLt
 * GEMMs of the LM head (bf16 operands; fp32 output with the vocabulary's 50257 columns,
 * the same padded to 50264, bf16 output) and of its backward (over 50257 or 50264
 * columns of the gradient) show what the head's layout costs.
 *
 * Each row: 2 warm-up calls, then REPS calls back to back and one kdev_sync, wall time
 * over REPS (the GPU's throughput for the op, launch gaps included).  Inputs are random;
 * outputs are overwritten or accumulated as the model does.  Usage:
 *   bench_kdev_gpu            (the backend library: $HEARTH_CUDA_LIB or ../lib/) */
extern "C" {
#include "kdev.h"
}
#include "contrib/bench/bench_gpu_util.h"

#include <vector>

#define REPS 10

/* GPT-2 124M, one micro batch */
enum { B = 16, T = 1024, N = B * T, C = 768, F = 3072, V = 50257, H = 12, D = 64, L = 12,
       MICRO = 4 };

struct bench {
    kdev *d;
    std::vector<void *> bufs;
    uint64_t seed;
    double step_ms;    /* the ops' estimate of one training step */
    int aside;         /* rows shown for comparison, not summed into step_ms */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static float *fbuf(bench *b, size_t n, float lo = -1.0f, float hi = 1.0f)
{
    void *p = NULL;
    if (kdev_alloc(b->d, &p, n * sizeof(float))) {
        printf("# alloc %zu floats: %s\n", n, kdev_errmsg(b->d));
        exit(1);
    }
    bg_fill_f32((float *)p, n, b->seed++, lo, hi);
    b->bufs.push_back(p);
    return (float *)p;
}

/* n elements of activation memory, random in [-1, 1] (uploaded through fp32) */
static float *abuf(bench *b, size_t n)
{
    void *p = NULL;
    std::vector<float> h(n);
    uint64_t r = b->seed++ * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        h[i] = (float)((r >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    }
    if (kdev_alloc_act(b->d, &p, n) || kdev_act_upload(b->d, p, h.data(), n)) {
        printf("# act buffer of %zu: %s\n", n, kdev_errmsg(b->d));
        exit(1);
    }
    b->bufs.push_back(p);
    return (float *)p;
}

static void *ibuf(bench *b, const std::vector<int> &h)
{
    void *p = NULL;
    if (kdev_alloc(b->d, &p, h.size() * sizeof(int)) ||
        kdev_upload(b->d, p, h.data(), h.size() * sizeof(int))) {
        printf("# int buffer: %s\n", kdev_errmsg(b->d));
        exit(1);
    }
    b->bufs.push_back(p);
    return p;
}

/* Times f (REPS calls, one sync) and prints a row; per_step: calls in one training step,
 * bytes and flops of one call (0: not shown). */
template <typename Fn>
static void row(bench *b, const char *name, int per_step, double gbytes, double gflop, Fn f)
{
    cudaDeviceSynchronize();
    for (int i = 0; i < 2; i++)
        f();
    kdev_sync(b->d);
    double t0 = now_ms();
    for (int i = 0; i < REPS; i++)
        f();
    int rc = kdev_sync(b->d);
    double ms = (now_ms() - t0) / REPS;
    if (rc || kdev_status(b->d)) {
        printf("| %s | failed: %s |\n", name, kdev_errmsg(b->d));
        kdev_status_clear(b->d);
        return;
    }
    if (!b->aside)
        b->step_ms += ms * per_step;
    char gbs[32] = "", tfs[32] = "";
    if (gbytes > 0)
        snprintf(gbs, sizeof gbs, "%.0f", gbytes / ms * 1e3);
    if (gflop > 0)
        snprintf(tfs, sizeof tfs, "%.0f", gflop / ms);
    printf("| %s%s | %.3f | %d | %.1f | %s | %s |\n", b->aside ? "(aside) " : "", name, ms,
           per_step, ms * per_step, gbs, tfs);
    fflush(stdout);
}

/* Raw cuBLASLt LM-head forward through a kcuda context of its own (not in the step). */
static void head_raw(bench *b)
{
    kcuda_ctx *k = NULL;
    char err[256];
    if (kcuda_ctx_create(&k, NULL, 0, err, sizeof err) < 0) {
        printf("# kcuda context: %s\n", err);
        return;
    }
    const int Vp = (V + 7) & ~7;
    void *a, *w, *o;
    cudaMalloc(&a, (size_t)N * C * 2);
    cudaMalloc(&w, (size_t)Vp * C * 2);
    cudaMalloc(&o, (size_t)N * Vp * 4);
    bg_fill_bf16(a, (size_t)N * C, b->seed++, -1, 1);
    bg_fill_bf16(w, (size_t)Vp * C, b->seed++, -1, 1);
    cudaDeviceSynchronize();
    const double gf = 2.0 * N * C * V * 1e-9;
    struct { const char *name; int n, f32; } v[] = {
        {"raw head GEMM, fp32 out, N 50257", V, 1},
        {"raw head GEMM, fp32 out, N 50264", Vp, 1},
        {"raw head GEMM, bf16 out, N 50264", Vp, 0},
    };
    for (auto &x : v) {
        float ms = bg_median_ms(k, x.name, 2, REPS, [&]() {
            return x.f32 ? kcuda_matmul_forward_bf16_f32out(k, (float *)o, (kcuda_bf16 *)a,
                                                            (kcuda_bf16 *)w, NULL, N, C, x.n)
                         : kcuda_matmul_forward_bf16(k, (kcuda_bf16 *)o, (kcuda_bf16 *)a,
                                                     (kcuda_bf16 *)w, NULL, N, C, x.n);
        });
        printf("| %s | %.3f | - | - | | %.0f |\n", x.name, ms, gf / ms);
    }
    /* the backward's two products from a bf16 dout of 50264-column rows (o reused as it),
     * over the 50257 real columns or all 50264 (the pad columns zero in the model) */
    void *dx, *dw;
    cudaMalloc(&dx, (size_t)N * C * 4);
    cudaMalloc(&dw, (size_t)Vp * C * 4);
    bg_fill_bf16(o, (size_t)N * Vp, b->seed++, -1, 1);
    cudaDeviceSynchronize();
    struct { const char *name; int n, dinp; } u[] = {
        {"raw head dinp GEMM, k 50257", V, 1},
        {"raw head dinp GEMM, k 50264", Vp, 1},
        {"raw head dW GEMM, n 50257", V, 0},
        {"raw head dW GEMM, n 50264", Vp, 0},
    };
    for (auto &x : u) {
        float ms = bg_median_ms(k, x.name, 2, REPS, [&]() {
            return x.dinp ? kcuda_matmul_dinp_bf16_f32out(k, (float *)dx, (kcuda_bf16 *)o, Vp,
                                                          (kcuda_bf16 *)w, N, C, x.n, 1)
                          : kcuda_matmul_dweight_bf16_f32out(k, (float *)dw, (kcuda_bf16 *)o,
                                                             Vp, (kcuda_bf16 *)a, N, C, x.n);
        });
        printf("| %s | %.3f | - | - | | %.0f |\n", x.name, ms, gf / ms);
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(a);
    cudaFree(w);
    cudaFree(o);
    kcuda_ctx_free(k);
}

/* The fc1 weight gradient with its bias gradient (16384 x 768 -> 3072, bf16 operands,
 * fp32 dW): cuBLASLt's BGRADB epilogue against the GEMM and the separate column-sum
 * passes kdev runs today (aside: not in the step). */
static void bgrad_raw(bench *b)
{
    kcuda_ctx *k = NULL;
    char err[256];
    if (kcuda_ctx_create(&k, NULL, 0, err, sizeof err) < 0) {
        printf("# kcuda context: %s\n", err);
        return;
    }
    void *x, *g, *dw, *db, *part;
    cudaMalloc(&x, (size_t)N * C * 2);
    cudaMalloc(&g, (size_t)N * F * 2);
    cudaMalloc(&dw, (size_t)F * C * 4);
    cudaMalloc(&db, (size_t)F * 4);
    cudaMalloc(&part, kcuda_bias_partials_floats(N, F) * 4);
    bg_fill_bf16(x, (size_t)N * C, b->seed++, -1, 1);
    bg_fill_bf16(g, (size_t)N * F, b->seed++, -1, 1);
    cudaMemset(dw, 0, (size_t)F * C * 4);
    cudaMemset(db, 0, (size_t)F * 4);
    cudaDeviceSynchronize();
    const double gf = 2.0 * N * C * F * 1e-9;
    const kcuda_bf16 *gx = (const kcuda_bf16 *)x, *gg = (const kcuda_bf16 *)g;
    float t[3];
    t[0] = bg_median_ms(k, "dW", 2, REPS, [&]() {
        return kcuda_matmul_dweight_bf16_f32out(k, (float *)dw, gg, F, gx, N, C, F);
    });
    t[1] = bg_median_ms(k, "dW + partials", 2, REPS, [&]() {
        int rc = kcuda_matmul_dweight_bf16_f32out(k, (float *)dw, gg, F, gx, N, C, F);
        if (!rc)
            rc = kcuda_bias_partials_bf16(k, (float *)part, gg, N, F);
        return rc ? rc : kcuda_bias_partials_add(k, (float *)db, (float *)part, N, F);
    });
    t[2] = bg_median_ms(k, "dW BGRADB", 2, REPS, [&]() {
        return kcuda_matmul_backward_bf16_f32w(k, NULL, 0, (float *)dw, (float *)db, gg, gx,
                                               NULL, N, C, F);
    });
    const char *names[3] = { "raw fc1 dW", "raw fc1 dW + bias column sums (2 passes)",
                             "raw fc1 dW + bias by the BGRADB epilogue" };
    for (int i = 0; i < 3; i++)
        printf("| (aside) %s | %.3f | - | - | | %.0f |\n", names[i], t[i], gf / t[i]);
    cudaFree(x);
    cudaFree(g);
    cudaFree(dw);
    cudaFree(db);
    cudaFree(part);
    kcuda_ctx_free(k);
}

/* The MLP's GELU in cuBLASLt's epilogue against the GEMM and GELU kernels kdev runs
 * today (one micro batch's fc1 forward and fc2 dinp, all bf16; aside). */
static void gelu_raw(bench *b)
{
    kcuda_ctx *k = NULL;
    char err[256];
    if (kcuda_ctx_create(&k, NULL, 0, err, sizeof err) < 0) {
        printf("# kcuda context: %s\n", err);
        return;
    }
    void *x, *w1, *b1, *u, *a, *w2, *dy, *da, *du;
    cudaMalloc(&x, (size_t)N * C * 2);
    cudaMalloc(&w1, (size_t)F * C * 2);
    cudaMalloc(&b1, (size_t)F * 2);
    cudaMalloc(&u, (size_t)N * F * 2);
    cudaMalloc(&a, (size_t)N * F * 2);
    cudaMalloc(&w2, (size_t)C * F * 2);
    cudaMalloc(&dy, (size_t)N * C * 2);
    cudaMalloc(&da, (size_t)N * F * 2);
    cudaMalloc(&du, (size_t)N * F * 2);
    bg_fill_bf16(x, (size_t)N * C, b->seed++, -1, 1);
    bg_fill_bf16(w1, (size_t)F * C, b->seed++, -0.05f, 0.05f);
    bg_fill_bf16(b1, (size_t)F, b->seed++, -0.1f, 0.1f);
    bg_fill_bf16(w2, (size_t)C * F, b->seed++, -0.05f, 0.05f);
    bg_fill_bf16(dy, (size_t)N * C, b->seed++, -1, 1);
    cudaDeviceSynchronize();
    typedef const kcuda_bf16 *cb;
    typedef kcuda_bf16 *mb;
    const double gf = 2.0 * N * C * F * 1e-9;
    float t[4];
    t[0] = bg_median_ms(k, "fc1 + gelu", 2, REPS, [&]() {
        int rc = kcuda_matmul_forward_bf16(k, (mb)u, (cb)x, (cb)w1, (cb)b1, N, C, F);
        return rc ? rc : kcuda_gelu_forward_bf16(k, (mb)a, (cb)u, (size_t)N * F, 0);
    });
    t[1] = bg_median_ms(k, "fc1 GELU_AUX_BIAS", 2, REPS, [&]() {
        return kcuda_matmul_forward_bf16_gelu(k, (mb)a, (mb)u, (cb)x, (cb)w1, (cb)b1, N, C, F);
    });
    t[2] = bg_median_ms(k, "fc2 dinp + gelu bwd", 2, REPS, [&]() {
        int rc = kcuda_matmul_backward_bf16_f32w(k, (mb)da, 0, NULL, NULL, (cb)dy, NULL, (cb)w2,
                                                 N, F, C);
        return rc ? rc : kcuda_gelu_backward_bf16(k, (mb)du, (cb)da, (cb)u, (size_t)N * F, 0, 0);
    });
    t[3] = bg_median_ms(k, "fc2 dinp DGELU", 2, REPS, [&]() {
        return kcuda_matmul_dinp_bf16_dgelu(k, (mb)du, (cb)dy, (cb)w2, (cb)u, N, F, C);
    });
    const char *names[4] = { "raw fc1 forward + GELU kernel",
                             "raw fc1 forward, GELU_AUX_BIAS epilogue",
                             "raw fc2 dinp + GELU backward kernel",
                             "raw fc2 dinp, DGELU epilogue" };
    for (int i = 0; i < 4; i++)
        printf("| (aside) %s | %.3f | - | - | | %.0f |\n", names[i], t[i], gf / t[i]);
    void *all[] = { x, w1, b1, u, a, w2, dy, da, du };
    for (void *p : all)
        cudaFree(p);
    kcuda_ctx_free(k);
}

int main(void)
{
    cudaDeviceProp prop;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_kdev_gpu: no CUDA device\n");
        return 0;
    }
    cudaGetDeviceProperties(&prop, 0);
    static bench b;
    char err[600];
    if (kdev_create(&b.d, KDEV_CUDA, err, sizeof err)) {
        printf("bench_kdev_gpu: %s\n", err);
        return 1;
    }
    kdev_set_precision(b.d, KDEV_PREC_BF16);
    b.seed = bg_seed();
    printf("# %s, %d SMs; GPT-2 124M micro batch %d x %d, precision bf16; per step: %d micro "
           "batches x %d layers\n", prop.name, prop.multiProcessorCount, B, T, MICRO, L);
    printf("| op | ms/call | calls/step | ms/step | GB/s | TFLOP/s |\n|---|---:|---:|---:|---:|---:|\n");
    const int LS = L * MICRO;   /* per-layer ops in a step */

    /* activations and weights of one layer */
    float *x = fbuf(&b, (size_t)N * C), *y = fbuf(&b, (size_t)N * C), *dx = fbuf(&b, (size_t)N * C);
    float *qkv = fbuf(&b, (size_t)N * 3 * C), *dqkv = fbuf(&b, (size_t)N * 3 * C);
    float *u = fbuf(&b, (size_t)N * F), *du = fbuf(&b, (size_t)N * F), *a = fbuf(&b, (size_t)N * F);
    float *wqkv = fbuf(&b, (size_t)3 * C * C, -0.05f, 0.05f), *bqkv = fbuf(&b, 3 * C);
    float *wo = fbuf(&b, (size_t)C * C, -0.05f, 0.05f), *bo = fbuf(&b, C);
    float *w1 = fbuf(&b, (size_t)F * C, -0.05f, 0.05f), *b1 = fbuf(&b, F);
    float *w2 = fbuf(&b, (size_t)C * F, -0.05f, 0.05f), *b2 = fbuf(&b, C);
    float *gw = fbuf(&b, (size_t)F * C), *gb = fbuf(&b, F);
    float *lnw = fbuf(&b, C), *lnb = fbuf(&b, C), *mean = fbuf(&b, N), *rstd = fbuf(&b, N, 0.5f, 1.5f);
    const double g = 2e-9 * N;   /* GFLOP per unit of K x N of a forward GEMM */

    row(&b, "matmul fwd qkv 768->2304 (+bias)", LS, 0, g * C * 3 * C,
        [&] { return kdev_matmul_forward(b.d, qkv, x, wqkv, bqkv, N, C, 3 * C); });
    row(&b, "matmul fwd proj 768->768", LS, 0, g * C * C,
        [&] { return kdev_matmul_forward(b.d, y, x, wo, bo, N, C, C); });
    row(&b, "matmul fwd fc1 768->3072", LS, 0, g * C * F,
        [&] { return kdev_matmul_forward(b.d, u, x, w1, b1, N, C, F); });
    row(&b, "matmul fwd fc2 3072->768", LS, 0, g * F * C,
        [&] { return kdev_matmul_forward(b.d, y, a, w2, b2, N, F, C); });
    row(&b, "matmul bwd qkv", LS, 0, 2 * g * C * 3 * C,
        [&] { return kdev_matmul_backward_set(b.d, dx, gw, gb, dqkv, x, wqkv, N, C, 3 * C); });
    row(&b, "matmul bwd proj", LS, 0, 2 * g * C * C,
        [&] { return kdev_matmul_backward_set(b.d, dx, gw, gb, y, x, wo, N, C, C); });
    row(&b, "matmul bwd fc1", LS, 0, 2 * g * C * F,
        [&] { return kdev_matmul_backward_set(b.d, dx, gw, gb, du, x, w1, N, C, F); });
    row(&b, "matmul bwd fc2", LS, 0, 2 * g * F * C,
        [&] { return kdev_matmul_backward_set(b.d, du, gw, gb, y, a, w2, N, F, C); });

    /* The same GEMMs as the model calls them (trainer/model/block.c): the norm outputs,
     * u, a, att, the qkv rows and the gradients du, da, datt, dqkv in activation memory;
     * the residual stream's gradient dres and the norms' input gradient dh in fp32. */
    float *h16 = abuf(&b, (size_t)N * C), *att16 = abuf(&b, (size_t)N * C);
    float *qkv16 = abuf(&b, (size_t)N * 3 * C), *dqkv16 = abuf(&b, (size_t)N * 3 * C);
    float *u16 = abuf(&b, (size_t)N * F), *a16 = abuf(&b, (size_t)N * F);
    float *du16 = abuf(&b, (size_t)N * F), *da16 = abuf(&b, (size_t)N * C);
    row(&b, "act: matmul fwd qkv (out act)", 0, 0, g * C * 3 * C,
        [&] { return kdev_matmul_forward(b.d, qkv16, h16, wqkv, bqkv, N, C, 3 * C); });
    row(&b, "act: matmul fwd proj (out fp32)", 0, 0, g * C * C,
        [&] { return kdev_matmul_forward(b.d, y, att16, wo, bo, N, C, C); });
    row(&b, "act: matmul fwd fc1 (out act)", 0, 0, g * C * F,
        [&] { return kdev_matmul_forward(b.d, u16, h16, w1, b1, N, C, F); });
    row(&b, "act: matmul fwd fc2 (out fp32)", 0, 0, g * F * C,
        [&] { return kdev_matmul_forward(b.d, y, a16, w2, b2, N, F, C); });
    row(&b, "act: matmul bwd qkv (dout act, dinp fp32)", 0, 0, 2 * g * C * 3 * C,
        [&] { return kdev_matmul_backward_set(b.d, dx, gw, gb, dqkv16, h16, wqkv, N, C, 3 * C); });
    row(&b, "act: matmul bwd proj (dout fp32, dinp act)", 0, 0, 2 * g * C * C,
        [&] { return kdev_matmul_backward_set(b.d, da16, gw, gb, y, att16, wo, N, C, C); });
    row(&b, "act: matmul bwd fc1 (dout act, dinp fp32)", 0, 0, 2 * g * C * F,
        [&] { return kdev_matmul_backward_set(b.d, dx, gw, gb, du16, h16, w1, N, C, F); });
    row(&b, "act: matmul bwd fc2 (dout fp32, dinp act)", 0, 0, 2 * g * F * C,
        [&] { return kdev_matmul_backward_set(b.d, du16, gw, gb, y, a16, w2, N, F, C); });
    row(&b, "act: matmul bwd fc2, dW only", 0, 0, g * F * C,
        [&] { return kdev_matmul_backward_set(b.d, NULL, gw, NULL, y, a16, w2, N, F, C); });
    row(&b, "act: matmul bwd fc2, dinp only", 0, 0, g * F * C,
        [&] { return kdev_matmul_backward_set(b.d, du16, NULL, NULL, y, a16, w2, N, F, C); });
    row(&b, "act: matmul bwd fc1, dW only", 0, 0, g * F * C,
        [&] { return kdev_matmul_backward_set(b.d, NULL, gw, NULL, du16, h16, w1, N, C, F); });
    row(&b, "act: matmul bwd fc1, dinp only", 0, 0, g * F * C,
        [&] { return kdev_matmul_backward_set(b.d, dx, NULL, NULL, du16, h16, w1, N, C, F); });

    const double act = (double)N * C * 4e-9;   /* GB of one fp32 [N, C] tensor */
    row(&b, "layernorm fwd", 2 * LS, 2 * act, 0,
        [&] { return kdev_layernorm_forward(b.d, y, mean, rstd, x, lnw, lnb, N, C, 1e-5f); });
    row(&b, "layernorm bwd", 2 * LS, 3 * act, 0, [&] {
        return kdev_layernorm_backward(b.d, dx, gw, gb, y, x, lnw, mean, rstd, N, C);
    });
    row(&b, "gelu fwd", LS, 2 * act * 4, 0,
        [&] { return kdev_gelu_forward(b.d, a, u, (size_t)N * F, KGELU_TANH); });
    row(&b, "gelu bwd", LS, 3 * act * 4, 0,
        [&] { return kdev_gelu_backward_set(b.d, du, a, u, (size_t)N * F, KGELU_TANH); });
    row(&b, "add (residual)", 2 * LS, 3 * act, 0,
        [&] { return kdev_add(b.d, y, x, dx, (size_t)N * C); });
    row(&b, "accumulate (residual grad)", 2 * LS, 3 * act, 0,
        [&] { return kdev_accumulate(b.d, dx, y, (size_t)N * C); });
    row(&b, "copy_2d qkv split (one of 3)", 6 * LS, 2 * act, 0, [&] {
        return kdev_copy_2d(b.d, y, C * 4, qkv + C, 3 * C * 4, C * 4, N);
    });

    /* attention: 16 causal sequences of 1024 */
    std::vector<int> cu(B + 1);
    for (int i = 0; i <= B; i++)
        cu[i] = i * T;
    int *cu_d = (int *)ibuf(&b, cu);
    float *q = fbuf(&b, (size_t)N * C), *k = fbuf(&b, (size_t)N * C), *v = fbuf(&b, (size_t)N * C);
    float *att = fbuf(&b, (size_t)N * C), *lse = fbuf(&b, (size_t)N * H);
    float *dq = fbuf(&b, (size_t)N * C), *dk = fbuf(&b, (size_t)N * C), *dv = fbuf(&b, (size_t)N * C);
    const double af = 4e-9 * B * (double)T * T * D * H / 2;   /* causal forward */
    row(&b, "attention fwd (bf16 flash + conversions)", LS, 0, af, [&] {
        return kdev_attention_forward(b.d, att, lse, q, k, v, cu_d, B, T, N, H, H, D, 1);
    });
    row(&b, "attention bwd (bf16 flash + conversions)", LS, 0, 2.5 * af, [&] {
        return kdev_attention_backward(b.d, dq, dk, dv, att, q, k, v, att, lse, cu_d, B, T, N,
                                       H, H, D, 1);
    });

    /* the LM head and its cross-entropy over the whole micro batch (one chunk) */
    float *wte = fbuf(&b, (size_t)V * C, -0.05f, 0.05f), *gwte = fbuf(&b, (size_t)V * C);
    float *logits = fbuf(&b, (size_t)N * V), *cmax = fbuf(&b, N), *losses = fbuf(&b, N);
    std::vector<int> tg(N);
    for (int i = 0; i < N; i++)
        tg[i] = (int)((i * 2654435761u) % V);
    int *tg_d = (int *)ibuf(&b, tg);
    void *sums = NULL, *lsed = NULL;
    kdev_alloc(b.d, &sums, 2 * (size_t)N * sizeof(double));
    kdev_alloc(b.d, &lsed, (size_t)N * sizeof(double));
    const double lg = (double)N * V * 4e-9;
    /* the fused head the model runs with the vocabulary on one GPU (kdev_head_ce_*): the
     * forward alone aside, then forward + backward (the gradient overwrites the logits, so
     * each backward needs a fresh forward) in the step */
    b.aside = 1;
    row(&b, "LM head + cross-entropy fused fwd", MICRO, 0, g * C * V, [&] {
        return kdev_head_ce_forward(b.d, logits, (double *)lsed, losses, cmax, (double *)sums,
                                    x, wte, tg_d, N, C, V);
    });
    b.aside = 0;
    row(&b, "LM head + cross-entropy fused fwd + bwd", MICRO, 0, 3 * g * C * V, [&] {
        int rc = kdev_head_ce_forward(b.d, logits, (double *)lsed, losses, cmax,
                                      (double *)sums, x, wte, tg_d, N, C, V);
        return rc ? rc : kdev_head_ce_backward(b.d, dx, gwte, logits, (const double *)lsed,
                                               tg_d, 1.0 / N, x, wte, N, C, V);
    });
    /* the vocabulary-parallel pieces over fp32 logits (tp > 1, or an FP8 head) */
    b.aside = 1;
    row(&b, "LM head matmul fwd 768->50257", MICRO, 0, g * C * V,
        [&] { return kdev_matmul_forward(b.d, logits, x, wte, NULL, N, C, V); });
    row(&b, "ce_rowmax", MICRO, lg, 0, [&] { return kdev_ce_rowmax(b.d, cmax, logits, N, V); });
    row(&b, "ce_rowsum", MICRO, lg, 0, [&] {
        return kdev_ce_rowsum(b.d, (double *)sums, logits, cmax, tg_d, 0, N, V);
    });
    row(&b, "ce_finish", MICRO, 0, 0, [&] {
        return kdev_ce_finish(b.d, (double *)lsed, losses, cmax, (const double *)sums, N);
    });
    row(&b, "ce_grad (in place)", MICRO, 2 * lg, 0, [&] {
        return kdev_ce_grad(b.d, logits, logits, (const double *)lsed, tg_d, 0, 1.0 / N, N, V);
    });
    row(&b, "LM head matmul bwd (dinp, dW)", MICRO, 0, 2 * g * C * V, [&] {
        return kdev_matmul_backward(b.d, dx, gwte, NULL, logits, x, wte, N, C, V);
    });
    b.aside = 0;
    printf("| **sum: one training step (%d micro batches)** | | | %.1f | | |\n", MICRO,
           b.step_ms);
    head_raw(&b);
    bgrad_raw(&b);
    gelu_raw(&b);
    for (void *p : b.bufs)
        kdev_release(b.d, p);
    kdev_release(b.d, sums);
    kdev_release(b.d, lsed);
    kdev_free(b.d);
    return 0;
}
