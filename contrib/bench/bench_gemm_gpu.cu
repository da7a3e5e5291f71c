/* bench_gemm_gpu.cu - cuBLASLt bf16 GEMM throughput (kcuda_matmul_*_bf16) on the
 * tiny-vlm and qwen2.5-vl-3b linear-layer shapes, against the CPU blocked fp32 matmul
 * (kcpu_matmul_forward).  Prints one table.
 *
 * GPU: inputs are random (never zeros: zeros run faster), 3 warm-up calls, then each of
 * REPS calls timed alone with events; the median is reported.  Forward, dinp and dweight
 * are timed separately (backward through kcuda_matmul_backward_bf16 with the other
 * gradient NULL).  CPU: the forward at M = min(M, CPU_M) rows, one warm-up and one timed
 * call (a full-size CPU run of the large shapes would take minutes).  Usage:
 *   bench_gemm_gpu [--no-cpu] */
extern "C" {
#include "kernels.h"
}
#include "contrib/bench/bench_gpu_util.h"

#include <cuda_bf16.h>
#include <omp.h>

#define REPS 20
#define CPU_M 256

struct shape {
    const char *name;
    int M, K, N;
};

static const struct shape shapes[] = {
    {"tiny-vlm dec qkv", 2048, 256, 512},       {"tiny-vlm dec o", 2048, 256, 256},
    {"tiny-vlm dec fc1", 2048, 256, 1024},      {"tiny-vlm dec fc2", 2048, 512, 256},
    {"tiny-vlm lm_head", 2048, 256, 1024},      {"qwen3b vit qkv", 4096, 1280, 3840},
    {"qwen3b vit proj", 4096, 1280, 1280},      {"qwen3b vit fc1", 4096, 1280, 6840},
    {"qwen3b vit fc2", 4096, 3420, 1280},       {"qwen3b dec qkv", 4096, 2048, 2560},
    {"qwen3b dec o", 4096, 2048, 2048},         {"qwen3b dec fc1", 4096, 2048, 22016},
    {"qwen3b dec fc2", 4096, 11008, 2048},      {"qwen3b lm_head", 4096, 2048, 151936},
    {"gpt2 qkv", 16384, 768, 2304},             {"gpt2 proj", 16384, 768, 768},
    {"gpt2 fc1", 16384, 768, 3072},             {"gpt2 fc2", 16384, 3072, 768},
    {"square 8192", 8192, 8192, 8192},
};

enum { FWD, DINP, DW };

/* Median milliseconds of one kind of call, or -1 on error. */
static float time_gemm(kcuda_ctx *k, int kind, const struct shape *s, kcuda_bf16 *a,
                       kcuda_bf16 *w, kcuda_bf16 *o, kcuda_bf16 *da, kcuda_bf16 *dw)
{
    return bg_median_ms(k, s->name, 3, REPS, [&]() {
        if (kind == FWD)
            return kcuda_matmul_forward_bf16(k, o, a, w, NULL, s->M, s->K, s->N);
        return kcuda_matmul_backward_bf16(k, kind == DINP ? da : NULL, kind == DW ? dw : NULL,
                                          NULL, o, a, w, s->M, s->K, s->N);
    });
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU fp32 forward GFLOP/s at M = min(M, CPU_M). */
static double cpu_gflops(const struct shape *s, uint64_t *rng)
{
    int M = s->M < CPU_M ? s->M : CPU_M;
    float *a = gu_rand(rng, (size_t)M * s->K, -1, 1, 0);
    float *w = gu_rand(rng, (size_t)s->N * s->K, -1, 1, 0);
    float *o = (float *)malloc((size_t)M * s->N * sizeof(float));
    kcpu_matmul_forward(o, a, w, NULL, M, s->K, s->N);
    double t0 = now_s();
    kcpu_matmul_forward(o, a, w, NULL, M, s->K, s->N);
    double t = now_s() - t0;
    free(a);
    free(w);
    free(o);
    return 2.0 * M * s->K * s->N / t * 1e-9;
}

int main(int argc, char **argv)
{
    int with_cpu = !(argc > 1 && strcmp(argv[1], "--no-cpu") == 0);
    cudaDeviceProp prop;
    kcuda_ctx *k = NULL;
    int opened = bg_open("bench_gemm_gpu", &prop, &k);
    if (opened <= 0)
        return opened < 0;
    uint64_t rng = bg_seed();
    printf("# %s, %d SMs; bf16 GEMM via cuBLASLt (fp32 accumulate), median of %d; "
           "CPU: kcpu_matmul_forward fp32, %d threads, M<=%d\n",
           prop.name, prop.multiProcessorCount, REPS, omp_get_max_threads(), CPU_M);
    printf("%-18s %6s %6s %7s | %9s %9s %9s | %9s %9s %9s | %9s\n", "shape", "M", "K", "N",
           "fwd ms", "dinp ms", "dW ms", "fwd TF/s", "dinp TF/s", "dW TF/s", "CPU GF/s");
    int status = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const struct shape *s = &shapes[i];
        size_t na = (size_t)s->M * s->K, nw = (size_t)s->N * s->K, no = (size_t)s->M * s->N;
        kcuda_bf16 *a, *w, *o, *da, *dw;
        if (gu_ck(cudaMalloc(&a, na * 2), "a") || gu_ck(cudaMalloc(&w, nw * 2), "w") ||
            gu_ck(cudaMalloc(&o, no * 2), "o") || gu_ck(cudaMalloc(&da, na * 2), "da") ||
            gu_ck(cudaMalloc(&dw, nw * 2), "dw"))
            return 1;
        bg_fill_bf16(a, na, rng++, -1.0f, 1.0f);
        bg_fill_bf16(w, nw, rng++, -1.0f, 1.0f);
        bg_fill_bf16(o, no, rng++, -1.0f, 1.0f);
        /* small gradients so that 23 accumulations stay finite */
        cudaMemset(da, 0, na * 2);
        cudaMemset(dw, 0, nw * 2);
        float t[3];
        for (int kind = 0; kind < 3; kind++)
            t[kind] = time_gemm(k, kind, s, a, w, o, da, dw);
        double fl = 2.0 * s->M * s->K * s->N;
        double cg = with_cpu && s->N * (double)s->K < 4e8 ? cpu_gflops(s, &rng) : NAN;
        printf("%-18s %6d %6d %7d | %9.3f %9.3f %9.3f | %9.1f %9.1f %9.1f | %9.1f\n", s->name,
               s->M, s->K, s->N, t[0], t[1], t[2], fl / t[0] * 1e-9, fl / t[1] * 1e-9,
               fl / t[2] * 1e-9, cg);
        if (t[0] < 0 || t[1] < 0 || t[2] < 0)
            status = 1;
        cudaFree(a);
        cudaFree(w);
        cudaFree(o);
        cudaFree(da);
        cudaFree(dw);
    }
    int entries;
    long hits, misses;
    kcuda_ctx_gemm_stats(k, &entries, &hits, &misses);
    printf("# algorithm cache: %d entries, %ld hits, %ld misses\n", entries, hits, misses);
    kcuda_ctx_free(k);
    return status;
}
