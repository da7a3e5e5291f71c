/* bench_step_gpu.cu - one training step of the dense decoder on one GPU (trainer/gpu/
 * gpt_gpu.h): GPT-2 124M shape by default, B 64 x T 1024, bf16 with fp32 master weights,
 * clipped AdamW.  Reports ms/step, tokens/s, MFU and memory, as a table and as one
 * machine-readable line
 *   RESULT hearth <tok/s> <ms/step> <MFU %> <peak GiB> <loss first> <loss last>
 * that contrib/bench/run_step_gpu.sh puts next to PyTorch's (gpt2_torch.py).
 *
 * MFU: analytic training FLOPs over the bf16 GEMM peak measured on the H200 (741 TFLOP/s,
 * --peak to change): 6 x (block linears + LM head) per token + 12 x layers x hidden x T
 * per token for attention scores (causal mask not halved), the convention of
 * shape_count_flops (trainer/shape/model_shape.h) and of gpt2_torch.py.
 * Memory: the model's own allocations (parameters, gradients, moments, activation arena),
 * and the device's used memory after the run (cudaMemGetInfo: includes the context and
 * cuBLASLt's workspace).
 * Tokens: random (fixed seed), next-token targets; the same batch every step.
 * Usage: bench_step_gpu [--layers L] [--hidden C] [--heads H] [--ffn F] [--vocab V]
 *                       [--seq T] [--batch B] [--micro b] [--steps S] [--warmup W]
 *                       [--peak TFLOPS] [--profile] [--no-fused-bias]
 * (--batch is the step's sequences, --micro the sequences per micro batch; B/b micro
 * batches accumulate gradients; without --micro, the largest that fits in memory.)  Unknown options are ignored (contrib/bench/run.sh passes
 * its own to every benchmark).  --profile (or HEARTH_STEP_PROFILE=1 in the environment)
 * adds a per-phase table (lines "PHASE kind ms/step %"), timed on extra steps with the
 * model's CUDA events on (gpt_gpu_profile).  --no-fused-bias: bias gradients by their own
 * pass instead of the weight-gradient GEMM's epilogue (gpt_gpu_fused_bias_grad), to compare.
 * Without a device it prints a note and exits 0. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "gpu/gpt_gpu.h"
}

static int arg_int(int argc, char **argv, const char *name, int def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return atoi(argv[i + 1]);
    return def;
}

static int has_flag(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("bench_step_gpu: no CUDA device (%s): skipped\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    gpt_gpu_config c;
    c.layers = arg_int(argc, argv, "--layers", 12);
    c.hidden = arg_int(argc, argv, "--hidden", 768);
    c.heads = arg_int(argc, argv, "--heads", 12);
    c.ffn = arg_int(argc, argv, "--ffn", 4 * c.hidden);
    c.vocab = arg_int(argc, argv, "--vocab", 50257);
    c.seq_len = arg_int(argc, argv, "--seq", 1024);
    c.max_positions = c.seq_len > 1024 ? c.seq_len : 1024;
    c.norm_eps = 1e-5f;
    int batch = arg_int(argc, argv, "--batch", 64);
    c.micro_batch = arg_int(argc, argv, "--micro", 0);
    int steps = arg_int(argc, argv, "--steps", 10), warmup = arg_int(argc, argv, "--warmup", 3);
    double peak = arg_int(argc, argv, "--peak", 741) * 1e12;
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    size_t free0 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    if (c.micro_batch == 0) {
        /* The largest micro batch dividing the batch whose plan fits, with 2 GiB spare for
         * the context, cuBLASLt and the kernels' workspace. */
        for (int mb = batch; mb >= 1; mb--) {
            if (batch % mb)
                continue;
            gpt_gpu *pl = NULL;
            size_t st = 0, act = 0;
            c.micro_batch = mb;
            c.max_micro = batch / mb;
            if (gpt_gpu_plan(&pl, &c, NULL, 0) == 0)
                gpt_gpu_memory(pl, &st, &act);
            gpt_gpu_free(pl);
            if (st && st + act + (2ull << 30) <= free0)
                break;
        }
    }
    if (c.micro_batch < 1 || batch % c.micro_batch || steps < 1 || warmup < 0) {
        fprintf(stderr, "bench_step_gpu: --batch must be a multiple of --micro; steps >= 1\n");
        return 2;
    }
    int n_micro = batch / c.micro_batch;
    c.max_micro = n_micro;
    gpt_gpu *g = NULL;
    char err[320];
    if (gpt_gpu_create(&g, &c, 1234, err, sizeof err)) {
        fprintf(stderr, "bench_step_gpu: %s\n", err);
        return 1;
    }
    if (has_flag(argc, argv, "--no-fused-bias"))
        gpt_gpu_fused_bias_grad(g, 0);
    /* Batches. */
    size_t ntok = (size_t)c.micro_batch * c.seq_len;
    int *tok = (int *)malloc((ntok + 1) * sizeof(int)), *tgt = (int *)malloc(ntok * sizeof(int));
    uint64_t s = 88172645463325252ull;
    int rc = 0;
    for (int m = 0; m < n_micro && !rc; m++) {
        for (size_t i = 0; i <= ntok; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            tok[i] = (int)(s % (uint64_t)c.vocab);
        }
        for (size_t i = 0; i < ntok; i++)
            tgt[i] = (i + 1) % c.seq_len == 0 ? -1 : tok[i + 1];
        rc = gpt_gpu_load_batch(g, m, tok, tgt);
    }
    gpt_gpu_adamw opt = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    double loss_first = NAN, loss_last = NAN;
    int step = 1;
    for (int i = 0; i < warmup && !rc; i++, step++)
        rc = gpt_gpu_step(g, n_micro, &opt, step, i == 0 ? &loss_first : NULL);
    cudaStream_t st = (cudaStream_t)gpt_gpu_stream(g);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms = 0;
    if (!rc) {
        cudaEventRecord(e0, st);
        for (int i = 0; i < steps && !rc; i++, step++)
            rc = gpt_gpu_step(g, n_micro, &opt, step, i == steps - 1 ? &loss_last : NULL);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
    }
    if (rc) {
        fprintf(stderr, "bench_step_gpu: %s\n", gpt_gpu_errmsg(g));
        gpt_gpu_free(g);
        return 1;
    }
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    /* Where the step's time goes: forward alone (micro batch 0), forward + backward, and
     * the optimizer (norm, clip, AdamW), each timed over a few repetitions. */
    float ms_fwd = 0, ms_fb = 0, ms_opt = 0;
    const int reps = 3;
    double ignored;
    cudaEventRecord(e0, st);
    for (int i = 0; i < reps && !rc; i++)
        rc = gpt_gpu_forward(g, 0, &ignored);
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms_fwd, e0, e1);
    cudaEventRecord(e0, st);
    for (int i = 0; i < reps && !rc; i++)
        rc = gpt_gpu_forward_backward(g, n_micro, NULL);
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms_fb, e0, e1);
    cudaEventRecord(e0, st);
    for (int i = 0; i < reps && !rc; i++, step++)
        rc = gpt_gpu_update(g, &opt, step);
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms_opt, e0, e1);
    if (rc)
        fprintf(stderr, "bench_step_gpu: breakdown: %s\n", gpt_gpu_errmsg(g));
    size_t state = 0, act = 0;
    gpt_gpu_memory(g, &state, &act);
    /* The per-phase table (HEARTH_STEP_PROFILE=1 or --profile): separate steps with the
     * step's events on, after the timed ones, so that the numbers above are unprofiled. */
    const char *pe = getenv("HEARTH_STEP_PROFILE");
    int profile = (pe && atoi(pe) > 0) || has_flag(argc, argv, "--profile");
    int nk = gpt_gpu_profile_kinds();
    double *pms = (double *)calloc((size_t)nk, sizeof *pms);
    const int psteps = 3;
    if (profile && !rc && pms) {
        rc = gpt_gpu_profile(g, 1);
        if (!rc) /* one step with events on, not counted (cuBLASLt cache, event pool) */
            rc = gpt_gpu_step(g, n_micro, &opt, step++, NULL);
        if (!rc && (rc = gpt_gpu_profile_read(g, pms, nk)) > 0)
            rc = 0;
        for (int i = 0; i < psteps && !rc; i++, step++)
            rc = gpt_gpu_step(g, n_micro, &opt, step, NULL);
        if (!rc && (rc = gpt_gpu_profile_read(g, pms, nk)) > 0)
            rc = 0;
        if (!rc)
            rc = gpt_gpu_profile(g, 0);
        if (rc) {
            fprintf(stderr, "bench_step_gpu: profile: %s\n", gpt_gpu_errmsg(g));
            profile = 0;
        }
    }

    double L = c.layers, C = c.hidden, F = c.ffn, V = c.vocab, T = c.seq_len;
    double flops_tok = 6.0 * (L * (4 * C * C + 2 * C * F) + V * C) + 12.0 * L * C * T;
    double ms_step = ms / steps, tokens = (double)batch * c.seq_len;
    double tok_s = tokens / (ms_step / 1e3), mfu = 100.0 * flops_tok * tok_s / peak;
    double gib = 1024.0 * 1024.0 * 1024.0;
    double used = (double)(free0 - free1) / gib;

    printf("# device: %s; GPT-2 shape L%d C%d H%d F%d V%d, B %d x T %d (%d micro batch%s of %d)\n",
           prop.name, c.layers, c.hidden, c.heads, c.ffn, c.vocab, batch, c.seq_len, n_micro,
           n_micro > 1 ? "es" : "", c.micro_batch);
    printf("# %zu parameters; %d warm-up + %d timed steps; loss %.4f -> %.4f\n",
           gpt_gpu_param_count(g), warmup, steps, loss_first, loss_last);
    printf("%-10s %10s %12s %8s %12s %12s\n", "", "ms/step", "tokens/s", "MFU", "state GiB",
           "activ. GiB");
    printf("%-10s %10.2f %12.0f %7.1f%% %12.2f %12.2f\n", "hearth", ms_step, tok_s, mfu,
           state / gib, act / gib);
    printf("# device memory used by the run: %.2f GiB\n", used);
    printf("# breakdown per step: forward %.2f ms x %d micro batch%s, forward+backward %.2f ms, "
           "optimizer %.2f ms\n", ms_fwd / reps, n_micro, n_micro > 1 ? "es" : "", ms_fb / reps,
           ms_opt / reps);
    if (profile && pms) {
        double sum = 0;
        for (int i = 0; i < nk; i++)
            sum += pms[i];
        printf("# phase breakdown (CUDA events per kind of work, mean of %d profiled steps; "
               "the phases tile the step)\n", psteps);
        printf("PHASE %-20s %10s %7s\n", "kind", "ms/step", "%");
        for (int i = 0; i < nk; i++)
            if (pms[i] > 0)
                printf("PHASE %-20s %10.3f %6.1f%%\n", gpt_gpu_profile_name(i), pms[i] / psteps,
                       sum > 0 ? 100.0 * pms[i] / sum : 0.0);
        printf("PHASE %-20s %10.3f %6.1f%% (unprofiled step: %.2f ms)\n", "total", sum / psteps,
               100.0, ms_step);
    }
    printf("RESULT hearth %.0f %.2f %.1f %.2f %.4f %.4f\n", tok_s, ms_step, mfu, used,
           loss_first, loss_last);
    free(pms);
    free(tok);
    free(tgt);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    gpt_gpu_free(g);
    return isfinite(loss_last) ? 0 : 1;
}
