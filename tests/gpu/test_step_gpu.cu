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

#include "gpu_tap.h"
#include "gpu/gpt_gpu_kernels.h"   /* C++ linkage, as gpt_gpu_kernels.cu */

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

/* The step's own kernels (gpt_gpu_kernels.h) on shapes the tiny model does not reach:
 * several 512-row chunks with a short last one, columns not a multiple of 256, and a
 * GELU length not a multiple of 8.  fp32 CPU sums as the reference. */
static void kernel_checks(uint64_t *rng)
{
    const int M = 1500, NC = 136;
    const size_t NG = 1003;
    float *dy = gu_rand(rng, (size_t)M * NC, -1, 1, 1), *x = gu_rand(rng, (size_t)M * NC, -2, 2, 1);
    float *mu = gu_rand(rng, M, -0.5f, 0.5f, 0), *rs = gu_rand(rng, M, 0.5f, 2.0f, 0);
    float *g0 = gu_rand(rng, 3 * (size_t)NC, -1, 1, 0);   /* dweight, dbias, bias: old values */
    float *ga = gu_rand(rng, NG, -1, 1, 1), *gx = gu_rand(rng, NG, -4, 4, 1);
    float *ref = (float *)malloc(3 * NC * sizeof(float)), *gref = (float *)malloc(NG * sizeof(float));
    for (int c = 0; c < NC; c++) {
        double w = g0[c], b = g0[NC + c];
        for (int r = 0; r < M; r++) {
            double d = dy[(size_t)r * NC + c];
            w += d * ((x[(size_t)r * NC + c] - mu[r]) * rs[r]);
            b += d;
        }
        ref[c] = (float)w;
        ref[NC + c] = (float)b;
        ref[2 * NC + c] = (float)b - g0[NC + c] + g0[2 * NC + c];
    }
    for (size_t i = 0; i < NG; i++) {
        double v = gx[i], k = 0.7978845608028654, t = tanh(k * (v + 0.044715 * v * v * v));
        gref[i] = (float)(ga[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k *
                                                  (1 + 3 * 0.044715 * v * v)));
    }
    void *ddy = gu_upload(dy, (size_t)M * NC, 1), *dx = gu_upload(x, (size_t)M * NC, 1);
    void *dmu = gu_upload(mu, M, 0), *drs = gu_upload(rs, M, 0), *dg = gu_upload(g0, 3 * NC, 0);
    void *dga = gu_upload(ga, NG, 1), *dgx = gu_upload(gx, NG, 1), *dgo = gu_poisoned(NG, 1);
    void *scr = gu_poisoned(2 * ggk_bias_scratch(M, NC), 0);
    int ok = ddy && dx && dmu && drs && dg && dga && dgx && dgo && scr &&
             ggk_ln_param_grad_ok(NC, (const kcuda_bf16 *)ddy, (const kcuda_bf16 *)dx);
    float *got = NULL, *ggot = NULL;
    if (ok) {
        float *g = (float *)dg;
        ok = ggk_ln_param_grad(0, g, g + NC, (const kcuda_bf16 *)ddy, (const kcuda_bf16 *)dx,
                               (const float *)dmu, (const float *)drs, (float *)scr, M,
                               NC) == cudaSuccess &&
             ggk_bias_grad(0, g + 2 * NC, (const kcuda_bf16 *)ddy, (float *)scr, M, NC) ==
                 cudaSuccess &&
             ggk_gelu_backward_set(0, (kcuda_bf16 *)dgo, (const kcuda_bf16 *)dga,
                                   (const kcuda_bf16 *)dgx, NG) == cudaSuccess;
        got = ok ? gu_download(dg, 3 * NC, 0) : NULL;
        ggot = ok ? gu_download(dgo, NG, 1) : NULL;
    }
    double ew = got ? gu_rel_l2(got, ref, NC) : INFINITY;
    double eb = got ? gu_rel_l2(got + NC, ref + NC, NC) : INFINITY;
    double ebias = got ? gu_rel_l2(got + 2 * NC, ref + 2 * NC, NC) : INFINITY;
    double eg = ggot ? gu_rel_l2(ggot, gref, NG) : INFINITY;
    char note[256];
    snprintf(note, sizeof note, "rel L2: ln dweight %.1e, ln dbias %.1e, bias %.1e (<= 1e-5); "
             "gelu backward %.1e (<= 1e-2)", ew, eb, ebias, eg);
    report(ok && ew <= 1e-5 && eb <= 1e-5 && ebias <= 1e-5 && eg <= 1e-2,
           "step kernels: layernorm/bias gradients, gelu backward", note);
    void *dev[9] = {ddy, dx, dmu, drs, dg, dga, dgx, dgo, scr};
    for (int i = 0; i < 9; i++)
        cudaFree(dev[i]);
    free(dy), free(x), free(mu), free(rs), free(g0), free(ga), free(gx), free(ref), free(gref);
    free(got), free(ggot);
}

int main(void)
{
    uint64_t seed = gu_seed(), rng = seed;
    const char *no_dev = "";
    int have_dev = gu_device_count(&no_dev) > 0;
    gu_device_line(seed); /* "none" without a device */

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
    printf("1..%d\n", have_dev ? 2 + 1 + 1 + nt_cpu + 1 + 1 + 1 + 1 : 3);
    host_checks(cm);
    if (!have_dev) {
        printf("not ok 3 - gpu training step # SKIP no CUDA device (%s)\n", no_dev);
        model_free(cm);
        return failed ? 1 : 0;
    }
    ntest = 2;
    kernel_checks(&rng);

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

    /* The per-phase profile, on a second model (the AdamW test below needs gm's optimizer
     * state untouched): the same gradients bit for bit with the events on (they only
     * time), every kind of work of the step timed, and the sums reset by a read. */
    {
        gpt_gpu *gp = NULL;
        int nk = gpt_gpu_profile_kinds();
        double *pms = (double *)calloc((size_t)nk, sizeof(double)), lp = 0, total = 0;
        int okp = pms && gpt_gpu_create(&gp, &cfg, seed ^ 0x5eedull, ebuf, sizeof ebuf) == 0;
        size_t np = okp ? gpt_gpu_param_count(gp) : 0, off = 0;
        float *before = (float *)malloc((np + 1) * sizeof(float));
        float *after = (float *)malloc((np + 1) * sizeof(float));
        gpt_gpu_adamw o = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
        okp = okp && before && after && gpt_gpu_load_batch(gp, 0, tok, tgt) == 0 &&
              gpt_gpu_forward_backward(gp, 1, &lp) == 0;
        for (int i = 0; okp && i < nt; off += gpt_gpu_tensor_numel(gp, i), i++)
            okp = gpt_gpu_get_grad(gp, i, before + off) == 0;
        okp = okp && gpt_gpu_profile(gp, 1) == 0 && gpt_gpu_forward_backward(gp, 1, &lp) == 0;
        off = 0;
        for (int i = 0; okp && i < nt; off += gpt_gpu_tensor_numel(gp, i), i++)
            okp = gpt_gpu_get_grad(gp, i, after + off) == 0;
        okp = okp && gpt_gpu_update(gp, &o, 1) == 0 && gpt_gpu_profile_read(gp, pms, nk) == nk;
        size_t mism = 0;
        for (size_t j = 0; okp && j < np; j++)
            mism += memcmp(&before[j], &after[j], sizeof(float)) != 0;
        /* A kind may read 0 at the events' resolution (0.5 us) on this tiny model; a
         * negative or NaN one, or most of them 0, would be a bookkeeping error. */
        const char *untimed = NULL;
        int zeros = 0;
        for (int k = 0; okp && k < nk; k++) {
            total += pms[k];
            zeros += pms[k] == 0.0;
            if (!(pms[k] >= 0) && !untimed)
                untimed = gpt_gpu_profile_name(k);
        }
        double gdiff = okp ? gu_rel_l2(after, before, np) : INFINITY;
        double again[1] = {1};
        int rr = okp ? gpt_gpu_profile_read(gp, again, 1) : -1;
        okp = okp && gpt_gpu_profile(gp, 0) == 0;
        snprintf(note, sizeof note, "%zu gradient elements differ (rel L2 %.1e <= 1e-6); "
                 "%.3f ms over %d kinds, %d at 0%s%s; after a read %.3f ms%s%s", mism, gdiff,
                 total, nk, zeros, untimed ? ", bad: " : "", untimed ? untimed : "", again[0],
                 okp ? "" : " error: ", okp ? "" : (gp ? gpt_gpu_errmsg(gp) : ebuf));
        report(okp && gdiff <= 1e-6 && !untimed && total > 0 && zeros <= nk / 4 && rr == nk &&
                   again[0] == 0.0,
               "step profile: phases timed, results unchanged", note);
        gpt_gpu_free(gp);
        free(before);
        free(after);
        free(pms);
    }

    /* The same gradient from two micro batches of one sequence each (accumulation). */
    {
        gpt_gpu_config c2 = cfg;
        c2.micro_batch = 1;
        c2.max_micro = 2;
        gpt_gpu *g2 = NULL;
        double worst = INFINITY, l2 = 0;
        int ok2 = !rc && !bad_table && gpt_gpu_create(&g2, &c2, seed, ebuf, sizeof ebuf) == 0;
        /* The separate bias-gradient pass here (the model above uses the fused epilogue
         * wherever cuBLASLt offers it): both paths checked against the CPU. */
        if (ok2)
            gpt_gpu_fused_bias_grad(g2, 0);
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
               "gradient accumulated over 2 micro batches (separate bias pass)", note);
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
