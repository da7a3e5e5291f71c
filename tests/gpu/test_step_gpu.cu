/* test_step_gpu.cu - the bf16 GPU training step of the dense decoder (trainer/gpu/gpt_gpu.h)
 * against the fp32 CPU reference model (trainer/model/model.h) on a tiny GPT-2-shaped
 * decoder, both sides holding the same parameters:
 *   - the first forward's loss within 1e-2 relative of model_forward's;
 *   - every parameter's gradient within relative L2 2e-2 of model_forward_backward's;
 *   - three clipped AdamW steps on both sides (the CPU side with kcpu_sumsq,
 *     kcpu_clip_factor, kcpu_scale and kcpu_adamw_update, as the trainer's optimizer):
 *     every step's loss within 1e-2 relative, and the loss decrease over the steps within
 *     25% (+ 0.002) of the reference's;
 *   - the gradient of the same batch as two micro batches (accumulation) within 2e-2.
 * Parameters are the CPU model's initialisation with norm weights and biases perturbed
 * (so that those paths matter), rounded to bf16 so that both sides start from the same
 * values.  Tokens and targets are fresh random values (seed printed; HEARTH_SEED=N
 * replays).  Without a CUDA device only the host-side checks run (tensor table equal to
 * the CPU model's, GPT-2 124M parameter count), then one skipped case; exit 0. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_util.h"

extern "C" {
#include "gpu/gpt_gpu.h"
#include "kernels.h"
#include "model/model.h"
}

enum { LAYERS = 2, HIDDEN = 128, HEADS = 2, FFN = 512, VOCAB = 500, MAXPOS = 128, B = 2, T = 64 };
#define STEPS 3

static int failed, ntest;

static void report(int ok, const char *name, const char *note)
{
    printf("%s %d - %s # %s\n", ok ? "ok" : "not ok", ++ntest, name, note);
    failed += !ok;
    fflush(stdout);
}

static void tiny_shape(model_shape *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "gpt2-tiny");
    stack_shape *d = &s->decoder.s;
    d->layers = LAYERS;
    d->hidden = HIDDEN;
    d->ffn = FFN;
    d->heads = HEADS;
    d->kv_heads = HEADS;
    d->head_dim = HIDDEN / HEADS;
    d->norm = NORM_LAYERNORM;
    d->norm_eps = 1e-5f;
    d->mlp = MLP_GELU;
    d->gelu = GELU_TANH;
    d->bias_qkv = d->bias_proj = d->bias_mlp = 1;
    d->pos = POS_LEARNED;
    d->rope_theta = 10000.0;
    s->decoder.vocab = VOCAB;
    s->decoder.tied_embeddings = 1;
    s->decoder.max_positions = MAXPOS;
    s->decoder.image_token_id = -1;
}

/* One optimizer step of the CPU reference: global-norm clip, then AdamW per tensor. */
static void cpu_adamw(model *m, float *mm, float *vv, const gpt_gpu_adamw *o, int step)
{
    float *p = model_params(m), *gr = model_grads(m);
    int n = model_tensor_count(m);
    double ss = 0;
    for (int i = 0; i < n; i++) {
        const model_tensor *t = model_tensor_at(m, i);
        ss += kcpu_sumsq(gr + t->offset, t->numel);
    }
    float clip = kcpu_clip_factor(sqrt(ss), o->max_norm);
    for (int i = 0; i < n; i++) {
        const model_tensor *t = model_tensor_at(m, i);
        kcpu_scale(gr + t->offset, t->numel, clip);
        kcpu_adamw_update(p + t->offset, gr + t->offset, mm + t->offset, vv + t->offset,
                          t->numel, o->lr, o->beta1, o->beta2, o->eps,
                          t->decay ? o->weight_decay : 0.0f, step);
    }
}

/* The host-side checks (no device needed): the GPU model's tensor table is the CPU
 * model's (names, order, sizes, decay flags), and the GPT-2 124M configuration has the
 * preset's parameter count (shape_count_params). */
static void host_checks(model *cm)
{
    gpt_gpu_config cfg = {LAYERS, HIDDEN, HEADS, FFN, VOCAB, MAXPOS, 1e-5f, B, T, 1};
    gpt_gpu *pl = NULL;
    char ebuf[320] = "", note[512];
    int ok = gpt_gpu_plan(&pl, &cfg, ebuf, sizeof ebuf) == 0;
    int nt = ok ? gpt_gpu_tensor_count(pl) : 0;
    if (ok && nt != model_tensor_count(cm)) {
        printf("# %d tensors, the CPU model has %d\n", nt, model_tensor_count(cm));
        ok = 0;
    }
    for (int i = 0; ok && i < nt; i++) {
        const model_tensor *t = model_tensor_at(cm, i);
        if (strcmp(t->name, gpt_gpu_tensor_name(pl, i)) || t->numel != gpt_gpu_tensor_numel(pl, i) ||
            !t->decay != !gpt_gpu_tensor_decay(pl, i)) {
            printf("# tensor %d: %s (%zu, decay %d) vs CPU %s (%zu, decay %d)\n", i,
                   gpt_gpu_tensor_name(pl, i), gpt_gpu_tensor_numel(pl, i),
                   gpt_gpu_tensor_decay(pl, i), t->name, t->numel, t->decay);
            ok = 0;
        }
    }
    snprintf(note, sizeof note, "%d tensors%s", nt, pl ? "" : ebuf);
    report(ok, "tensor table matches the CPU model", note);
    gpt_gpu_free(pl);

    /* GPT-2 124M at B 64 x T 1024. */
    model_shape gs;
    tiny_shape(&gs);
    gs.decoder.s.layers = 12;
    gs.decoder.s.hidden = 768;
    gs.decoder.s.ffn = 3072;
    gs.decoder.s.heads = gs.decoder.s.kv_heads = 12;
    gs.decoder.s.head_dim = 64;
    gs.decoder.vocab = 50257;
    gs.decoder.max_positions = 1024;
    shape_params sp;
    shape_count_params(&gs, &sp);
    gpt_gpu_config big = {12, 768, 12, 3072, 50257, 1024, 1e-5f, 64, 1024, 1};
    size_t state = 0, act = 0, np = 0;
    ok = gpt_gpu_plan(&pl, &big, ebuf, sizeof ebuf) == 0;
    if (ok) {
        np = gpt_gpu_param_count(pl);
        gpt_gpu_memory(pl, &state, &act);
    }
    snprintf(note, sizeof note, "%zu parameters (shape_count_params %lld); state %.2f GiB, "
             "activations %.2f GiB at B 64 x T 1024%s", np, (long long)sp.total,
             state / 1073741824.0, act / 1073741824.0, ok ? "" : ebuf);
    report(ok && (long long)np == (long long)sp.total && np == 124439808u,
           "GPT-2 124M plan: parameter count", note);
    gpt_gpu_free(pl);
}

int main(void)
{
    const char *se = getenv("HEARTH_SEED");
    uint64_t seed = se ? strtoull(se, NULL, 10)
                       : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)clock();
    if (seed == 0)
        seed = 1;
    uint64_t rng = seed;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    int have_dev = e == cudaSuccess && ndev > 0;
    cudaDeviceProp prop;
    if (have_dev && cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("# device: %s (sm_%d%d), seed %llu\n", prop.name, prop.major, prop.minor,
               (unsigned long long)seed);
    else
        printf("# device: none, seed %llu\n", (unsigned long long)seed);

    /* The CPU reference. */
    model_shape shape;
    tiny_shape(&shape);
    hearth_err herr;
    model *cm = NULL;
    if (shape_validate(&shape, &herr) || model_create(&cm, &shape, seed, &herr)) {
        printf("1..1\nnot ok 1 - cpu model # %s\n", herr.msg);
        return 1;
    }
    int nt_cpu = model_tensor_count(cm);
    printf("1..%d\n", have_dev ? 2 + 1 + 1 + nt_cpu + 1 + 1 : 3);
    host_checks(cm);
    if (!have_dev) {
        printf("not ok 3 - gpu training step # SKIP no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        model_free(cm);
        return failed ? 1 : 0;
    }
    ntest = 2;

    gpt_gpu_config cfg = {LAYERS, HIDDEN, HEADS, FFN, VOCAB, MAXPOS, 1e-5f, B, T, 1};
    gpt_gpu *gm = NULL;
    char ebuf[320] = "";
    if (gpt_gpu_create(&gm, &cfg, seed, ebuf, sizeof ebuf)) {
        printf("not ok 3 - gpu model # %s\n", ebuf);
        model_free(cm);
        return 1;
    }
    int nt = gpt_gpu_tensor_count(gm);

    /* Same parameters on both sides, tensor by tensor by name. */
    float *cp = model_params(cm);
    int bad_table = nt != nt_cpu;
    for (int i = 0; i < nt && !bad_table; i++) {
        const model_tensor *t = model_tensor_find(cm, gpt_gpu_tensor_name(gm, i));
        if (!t || t->numel != gpt_gpu_tensor_numel(gm, i)) {
            bad_table = 1;
            break;
        }
        float *p = cp + t->offset;
        int is_norm_w = strstr(t->name, "norm.weight") != NULL;
        for (size_t j = 0; j < t->numel; j++) {
            if (is_norm_w)
                p[j] = 1.0f + gu_uniform(&rng, -0.2f, 0.2f);
            else if (t->ndim == 1)
                p[j] = gu_uniform(&rng, -0.05f, 0.05f);
            p[j] = gu_from_bf16(gu_to_bf16(p[j]));
        }
        if (gpt_gpu_set_param(gm, i, p)) {
            printf("# set_param %s: %s\n", t->name, gpt_gpu_errmsg(gm));
            bad_table = 1;
        }
    }
    report(!bad_table, "parameters copied from the CPU model", "");

    /* A batch: random tokens, next-token targets, some positions without a target. */
    int *tok = (int *)malloc(B * T * sizeof(int)), *tgt = (int *)malloc(B * T * sizeof(int));
    for (int i = 0; i < B * T; i++)
        tok[i] = (int)(gu_next(&rng) % VOCAB);
    int n_targets = 0;
    for (int i = 0; i < B * T; i++) {
        int last = i % T == T - 1;
        tgt[i] = last || gu_next(&rng) % 16 == 0 ? -1 : tok[i + 1];
        n_targets += tgt[i] != -1;
    }
    vlm_batch vb;
    memset(&vb, 0, sizeof vb);
    vb.n_seq = B;
    vb.seq_len = T;
    vb.tokens = tok;
    vb.targets = tgt;
    char note[2048];

    /* First forward. */
    model_stats st;
    double lc = 0, lg = 0;
    int rc = model_forward(cm, &vb, &st, &herr);
    if (!rc)
        lc = st.loss_sum / st.n_targets;
    int grc = gpt_gpu_load_batch(gm, 0, tok, tgt);
    if (!grc)
        grc = gpt_gpu_forward(gm, 0, &lg);
    double rel = fabs(lg - lc) / fabs(lc);
    snprintf(note, sizeof note, "gpu %.6f cpu %.6f rel %.2e (<= 1e-2)%s%s", lg, lc, rel,
             rc ? herr.msg : "", grc ? gpt_gpu_errmsg(gm) : "");
    report(!rc && !grc && rel <= 1e-2, "first-step loss vs model_forward", note);

    /* Gradients of the mean loss. */
    model_zero_grad(cm);
    rc = model_forward_backward(cm, &vb, 1.0f / (float)n_targets, 0.0f, &st, &herr);
    grc = gpt_gpu_forward_backward(gm, 1, &lg);
    float *gg = (float *)malloc(model_param_count(cm) * sizeof(float));
    for (int i = 0; i < nt; i++) {
        const char *name = gpt_gpu_tensor_name(gm, i);
        const model_tensor *t = bad_table ? NULL : model_tensor_find(cm, name);
        double r = INFINITY;
        int ok = !rc && !grc && t && gpt_gpu_get_grad(gm, i, gg) == 0;
        if (ok)
            r = gu_rel_l2(gg, model_grads(cm) + t->offset, t->numel);
        snprintf(note, sizeof note, "rel L2 %.2e (<= 2e-2)%s", r, grc ? gpt_gpu_errmsg(gm) : "");
        char nm[160];
        snprintf(nm, sizeof nm, "gradient %s", name);
        report(ok && r <= 2e-2, nm, note);
    }

    /* The same gradient from two micro batches of one sequence each (accumulation). */
    {
        gpt_gpu_config c2 = cfg;
        c2.micro_batch = 1;
        c2.max_micro = 2;
        gpt_gpu *g2 = NULL;
        double worst = INFINITY, l2 = 0;
        int ok2 = !rc && !bad_table && gpt_gpu_create(&g2, &c2, seed, ebuf, sizeof ebuf) == 0;
        for (int i = 0; ok2 && i < nt; i++)
            ok2 = gpt_gpu_set_param(g2, i, cp + model_tensor_find(cm, gpt_gpu_tensor_name(g2, i))->offset) == 0;
        ok2 = ok2 && gpt_gpu_load_batch(g2, 0, tok, tgt) == 0 &&
              gpt_gpu_load_batch(g2, 1, tok + T, tgt + T) == 0 &&
              gpt_gpu_forward_backward(g2, 2, &l2) == 0;
        for (int i = 0; ok2 && i < nt; i++) {
            const model_tensor *t = model_tensor_find(cm, gpt_gpu_tensor_name(g2, i));
            if (gpt_gpu_get_grad(g2, i, gg)) {
                ok2 = 0;
                break;
            }
            double r = gu_rel_l2(gg, model_grads(cm) + t->offset, t->numel);
            worst = i == 0 || r > worst || r != r ? r : worst;
        }
        snprintf(note, sizeof note, "loss %.6f vs cpu %.6f, worst gradient rel L2 %.2e (<= 2e-2)%s",
                 l2, st.loss_sum / st.n_targets, worst, ok2 || !g2 ? (g2 ? "" : ebuf) : gpt_gpu_errmsg(g2));
        report(ok2 && worst <= 2e-2 && fabs(l2 - st.loss_sum / st.n_targets) <= 1e-2 * fabs(l2),
               "gradient accumulated over 2 micro batches", note);
        gpt_gpu_free(g2);
    }

    /* Three AdamW steps: the loss before each, and after the last. */
    gpt_gpu_adamw opt = {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    double tc[STEPS + 1], tg[STEPS + 1];
    int ok = !bad_table;
    float *mm = (float *)calloc(model_param_count(cm), sizeof(float));
    float *vv = (float *)calloc(model_param_count(cm), sizeof(float));
    for (int s = 1; s <= STEPS && ok; s++) {
        model_zero_grad(cm);
        if (model_forward_backward(cm, &vb, 1.0f / (float)n_targets, 0.0f, &st, &herr)) {
            printf("# cpu step %d: %s\n", s, herr.msg);
            ok = 0;
            break;
        }
        tc[s - 1] = st.loss_sum / st.n_targets;
        cpu_adamw(cm, mm, vv, &opt, s);
        if (gpt_gpu_step(gm, 1, &opt, s, &tg[s - 1])) {
            printf("# gpu step %d: %s\n", s, gpt_gpu_errmsg(gm));
            ok = 0;
        }
    }
    if (ok && !model_forward(cm, &vb, &st, &herr))
        tc[STEPS] = st.loss_sum / st.n_targets;
    else
        ok = 0;
    if (ok && gpt_gpu_forward(gm, 0, &tg[STEPS]))
        ok = 0;
    double worst = 0;
    for (int s = 0; ok && s <= STEPS; s++) {
        double r = fabs(tg[s] - tc[s]) / fabs(tc[s]);
        worst = r > worst ? r : worst;
        printf("# step %d: loss gpu %.6f cpu %.6f\n", s + 1, tg[s], tc[s]);
    }
    double dc = tc[0] - tc[STEPS], dg = tg[0] - tg[STEPS];
    /* The decrease within 25%, plus 2e-3 absolute for the bf16 loss itself. */
    double ddiff = ok ? fabs(dg - dc) : INFINITY;
    snprintf(note, sizeof note, "worst rel %.2e (<= 1e-2), decrease gpu %.4f cpu %.4f "
             "(|diff| %.4f <= 0.25 * cpu + 0.002)", worst, dg, dc, ddiff);
    report(ok && worst <= 1e-2 && dc > 0 && ddiff <= 0.25 * dc + 2e-3,
           "3 AdamW steps: loss trajectory", note);

    if (failed)
        printf("# replay with HEARTH_SEED=%llu\n", (unsigned long long)seed);
    free(gg);
    free(mm);
    free(vv);
    free(tok);
    free(tgt);
    gpt_gpu_free(gm);
    model_free(cm);
    return failed ? 1 : 0;
}
