/* test_kernels_gpu.cu - every kcuda_ kernel against the fp32 CPU reference (kernels/cpu)
 * on fresh random inputs.  Plain TAP (no cmocka: the GPU machine lacks it), one line
 * per kernel, the worst relative L2 error as a diagnostic.  Outputs are poisoned (NaN)
 * before each run, so an element a kernel fails to write fails the test; gradients that
 * are accumulated (+=) start from random values instead, so the += is tested.
 * Tolerances: bf16 storage relative L2 <= 1e-2, fp32 <= 1e-5.
 * Without a CUDA device it prints one skipped test and exits 0.
 * HEARTH_SEED=N replays a run. */
extern "C" {
#include "kernels.h"
}
#include "tests/gpu/gpu_tap.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-5

struct tctx {
    kcuda_ctx *k;
    uint64_t rng;
    double worst;   /* worst error/tolerance ratio seen in the current test */
    char note[512]; /* the per-check errors, printed as a diagnostic */
};

/* Compares a device result with the host reference; records the error. 0 = pass. */
static int check(struct tctx *t, const char *what, const void *dev, const float *ref, size_t n,
                 int bf16)
{
    float *got = gu_download(dev, n, bf16);
    if (!got) {
        printf("# %s: download failed\n", what);
        t->worst = INFINITY;
        return 1;
    }
    double tol = bf16 ? TOL_BF16 : TOL_F32, err = gu_rel_l2(got, ref, n);
    free(got);
    size_t len = strlen(t->note);
    snprintf(t->note + len, sizeof t->note - len, " %s=%.2e", what, err);
    double ratio = err / tol;
    if (!(ratio <= t->worst) || isnan(ratio))
        t->worst = isnan(ratio) ? INFINITY : ratio;
    if (!(err <= tol)) {
        printf("# %s: relative L2 %.3e > %.0e\n", what, err, tol);
        return 1;
    }
    return 0;
}

static int rc_ok(struct tctx *t, int rc, const char *what)
{
    if (gu_rc_ok(t->k, rc, what))
        return 1;
    t->worst = INFINITY;
    return 0;
}

/* ---- matmul ------------------------------------------------------------------ */

static const int gemm_shapes[][3] = {{64, 256, 512}, {37, 72, 200}, {128, 512, 1024},
                                     {256, 1024, 256}};

static int t_matmul(struct tctx *t, int bf16)
{
    int fail = 0;
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
        int M = gemm_shapes[s][0], K = gemm_shapes[s][1], N = gemm_shapes[s][2];
        struct gu_pool p = {};
        float *inp = gu_ph(&p, gu_rand(&t->rng, (size_t)M * K, -1, 1, bf16));
        float *w = gu_ph(&p, gu_rand(&t->rng, (size_t)N * K, -1, 1, bf16));
        float *b = gu_ph(&p, gu_rand(&t->rng, N, -1, 1, bf16));
        float *dout = gu_ph(&p, gu_rand(&t->rng, (size_t)M * N, -1, 1, bf16));
        float *dinp0 = gu_ph(&p, gu_rand(&t->rng, (size_t)M * K, -1, 1, bf16));
        float *dw0 = gu_ph(&p, gu_rand(&t->rng, (size_t)N * K, -1, 1, bf16));
        float *db0 = gu_ph(&p, gu_rand(&t->rng, N, -1, 1, bf16));
        void *d_inp = gu_pd(&p, gu_upload(inp, (size_t)M * K, bf16));
        void *d_w = gu_pd(&p, gu_upload(w, (size_t)N * K, bf16));
        void *d_b = gu_pd(&p, gu_upload(b, N, bf16));
        void *d_dout = gu_pd(&p, gu_upload(dout, (size_t)M * N, bf16));
        void *d_dinp = gu_pd(&p, gu_upload(dinp0, (size_t)M * K, bf16));
        void *d_dw = gu_pd(&p, gu_upload(dw0, (size_t)N * K, bf16));
        void *d_db = gu_pd(&p, gu_upload(db0, N, bf16));
        void *d_out = gu_pd(&p, gu_poisoned((size_t)M * N, bf16));
        void *d_out2 = gu_pd(&p, gu_poisoned((size_t)M * N, bf16));
        if (!d_inp || !d_w || !d_b || !d_dout || !d_dinp || !d_dw || !d_db || !d_out ||
            !d_out2) {
            gu_pool_free(&p);
            return 1;
        }
        float *ref = gu_ph(&p, (float *)malloc((size_t)M * N * sizeof(float)));
        float *ref2 = gu_ph(&p, (float *)malloc((size_t)M * N * sizeof(float)));
        kcpu_matmul_forward(ref, inp, w, b, M, K, N);
        kcpu_matmul_forward(ref2, inp, w, NULL, M, K, N);
        float *rdinp = gu_hcopy(&p, dinp0, (size_t)M * K), *rdw = gu_hcopy(&p, dw0, (size_t)N * K);
        float *rdb = gu_hcopy(&p, db0, N);
        kcpu_matmul_backward(rdinp, rdw, rdb, dout, inp, w, M, K, N);

        int r1, r2, r3;
        if (bf16) {
            r1 = kcuda_matmul_forward_bf16(t->k, (kcuda_bf16 *)d_out, (kcuda_bf16 *)d_inp,
                                           (kcuda_bf16 *)d_w, (kcuda_bf16 *)d_b, M, K, N);
            r2 = kcuda_matmul_forward_bf16(t->k, (kcuda_bf16 *)d_out2, (kcuda_bf16 *)d_inp,
                                           (kcuda_bf16 *)d_w, NULL, M, K, N);
            r3 = kcuda_matmul_backward_bf16(t->k, (kcuda_bf16 *)d_dinp, (kcuda_bf16 *)d_dw,
                                            (kcuda_bf16 *)d_db, (kcuda_bf16 *)d_dout,
                                            (kcuda_bf16 *)d_inp, (kcuda_bf16 *)d_w, M, K, N);
        } else {
            r1 = kcuda_matmul_forward_f32(t->k, (float *)d_out, (float *)d_inp, (float *)d_w,
                                          (float *)d_b, M, K, N);
            r2 = kcuda_matmul_forward_f32(t->k, (float *)d_out2, (float *)d_inp, (float *)d_w,
                                          NULL, M, K, N);
            r3 = kcuda_matmul_backward_f32(t->k, (float *)d_dinp, (float *)d_dw, (float *)d_db,
                                           (float *)d_dout, (float *)d_inp, (float *)d_w, M,
                                           K, N);
        }
        if (!rc_ok(t, r1, "matmul_forward(bias)") || !rc_ok(t, r2, "matmul_forward") ||
            !rc_ok(t, r3, "matmul_backward")) {
            gu_pool_free(&p);
            return 1;
        }
        char nm[64];
        snprintf(nm, sizeof nm, "out[%d,%d,%d]", M, K, N);
        fail |= check(t, nm, d_out, ref, (size_t)M * N, bf16);
        fail |= check(t, "out_nobias", d_out2, ref2, (size_t)M * N, bf16);
        fail |= check(t, "dinp", d_dinp, rdinp, (size_t)M * K, bf16);
        fail |= check(t, "dweight", d_dw, rdw, (size_t)N * K, bf16);
        fail |= check(t, "dbias", d_db, rdb, N, bf16);
        gu_pool_free(&p);
    }
    return fail;
}

static int t_matmul_f32(struct tctx *t) { return t_matmul(t, 0); }

/* kcuda_matmul_backward_bf16_f32w: bf16 operands, dweight accumulated in fp32 storage
 * (checked at the fp32 tolerance: bf16 products are exact in fp32), dinp overwritten
 * (a poisoned buffer: every element must be written) or accumulated. */
static int t_matmul_f32w(struct tctx *t)
{
    int fail = 0;
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
        int M = gemm_shapes[s][0], K = gemm_shapes[s][1], N = gemm_shapes[s][2];
        struct gu_pool p = {};
        float *inp = gu_ph(&p, gu_rand(&t->rng, (size_t)M * K, -1, 1, 1));
        float *w = gu_ph(&p, gu_rand(&t->rng, (size_t)N * K, -1, 1, 1));
        float *dout = gu_ph(&p, gu_rand(&t->rng, (size_t)M * N, -1, 1, 1));
        float *dinp0 = gu_ph(&p, gu_rand(&t->rng, (size_t)M * K, -1, 1, 1));
        float *dw0 = gu_ph(&p, gu_rand(&t->rng, (size_t)N * K, -1, 1, 0));
        void *d_inp = gu_pd(&p, gu_upload(inp, (size_t)M * K, 1));
        void *d_w = gu_pd(&p, gu_upload(w, (size_t)N * K, 1));
        void *d_dout = gu_pd(&p, gu_upload(dout, (size_t)M * N, 1));
        void *d_dinp_acc = gu_pd(&p, gu_upload(dinp0, (size_t)M * K, 1));
        void *d_dinp_set = gu_pd(&p, gu_poisoned((size_t)M * K, 1));
        void *d_dw = gu_pd(&p, gu_upload(dw0, (size_t)N * K, 0));
        if (!d_inp || !d_w || !d_dout || !d_dinp_acc || !d_dinp_set || !d_dw) {
            gu_pool_free(&p);
            return 1;
        }
        float *zero = gu_ph(&p, (float *)calloc((size_t)M * K, sizeof(float)));
        float *rdinp = gu_hcopy(&p, dinp0, (size_t)M * K), *rdw = gu_hcopy(&p, dw0, (size_t)N * K);
        kcpu_matmul_backward(rdinp, rdw, NULL, dout, inp, w, M, K, N);
        kcpu_matmul_backward(zero, NULL, NULL, dout, inp, w, M, K, N);
        void *d_dw2 = gu_pd(&p, gu_upload(dw0, (size_t)N * K, 0));
        void *d_db = gu_pd(&p, gu_poisoned(N, 0));
        if (!d_dw2 || !d_db) {
            gu_pool_free(&p);
            return 1;
        }
        float *rdb = gu_ph(&p, (float *)calloc(N, sizeof(float)));
        kcpu_matmul_backward(NULL, NULL, rdb, dout, inp, w, M, K, N);
        int r1 = kcuda_matmul_backward_bf16_f32w(t->k, (kcuda_bf16 *)d_dinp_acc, 1, (float *)d_dw,
                                                 NULL, (kcuda_bf16 *)d_dout, (kcuda_bf16 *)d_inp,
                                                 (kcuda_bf16 *)d_w, M, K, N);
        int r2 = kcuda_matmul_backward_bf16_f32w(t->k, (kcuda_bf16 *)d_dinp_set, 0, NULL, NULL,
                                                 (kcuda_bf16 *)d_dout, (kcuda_bf16 *)d_inp,
                                                 (kcuda_bf16 *)d_w, M, K, N);
        /* The fused bias gradient (BGRADB): where cuBLASLt offers it, exact column sums and
         * the same dweight; where not, the documented refusal. */
        int r3 = kcuda_matmul_backward_bf16_f32w(t->k, NULL, 0, (float *)d_dw2, (float *)d_db,
                                                 (kcuda_bf16 *)d_dout, (kcuda_bf16 *)d_inp,
                                                 (kcuda_bf16 *)d_w, M, K, N);
        int fused = r3 == KCUDA_OK;
        if (!fused && r3 != KCUDA_ENOALGO && r3 != KCUDA_ECUBLAS)
            fail |= !rc_ok(t, r3, "matmul_backward_f32w(bgradb)");
        if (!fused)
            printf("# [%d,%d,%d] fused bias gradient not offered: %s\n", M, K, N,
                   kcuda_ctx_errmsg(t->k));
        if (!rc_ok(t, r1, "matmul_backward_f32w") || !rc_ok(t, r2, "matmul_backward_f32w(set)")) {
            gu_pool_free(&p);
            return 1;
        }
        char nm[64];
        snprintf(nm, sizeof nm, "dweight f32 [%d,%d,%d]", M, K, N);
        fail |= check(t, nm, d_dw, rdw, (size_t)N * K, 0);
        if (fused) {
            fail |= check(t, "dweight f32 (with bgradb)", d_dw2, rdw, (size_t)N * K, 0);
            fail |= check(t, "dbias f32 (bgradb)", d_db, rdb, N, 0);
        }
        fail |= check(t, "dinp (accumulated)", d_dinp_acc, rdinp, (size_t)M * K, 1);
        fail |= check(t, "dinp (overwritten)", d_dinp_set, zero, (size_t)M * K, 1);
        gu_pool_free(&p);
    }
    return fail;
}
static int t_matmul_bf16(struct tctx *t) { return t_matmul(t, 1); }

/* The second call of a shape must reuse the cached algorithm, not ask again. */
static int t_gemm_cache(struct tctx *t)
{
    struct gu_pool p = {};
    int M = 48, K = 64, N = 80, e0, e1, e2;
    long h0, h1, h2, m0, m1, m2;
    float *a = gu_ph(&p, gu_rand(&t->rng, (size_t)M * K, -1, 1, 1));
    float *w = gu_ph(&p, gu_rand(&t->rng, (size_t)N * K, -1, 1, 1));
    void *da = gu_pd(&p, gu_upload(a, (size_t)M * K, 1)), *dw = gu_pd(&p, gu_upload(w, (size_t)N * K, 1));
    void *dout = gu_pd(&p, gu_poisoned((size_t)M * N, 1));
    int fail = !da || !dw || !dout;
    kcuda_ctx_gemm_stats(t->k, &e0, &h0, &m0);
    fail |= !rc_ok(t, kcuda_matmul_forward_bf16(t->k, (kcuda_bf16 *)dout, (kcuda_bf16 *)da,
                                                 (kcuda_bf16 *)dw, NULL, M, K, N), "first");
    kcuda_ctx_gemm_stats(t->k, &e1, &h1, &m1);
    fail |= !rc_ok(t, kcuda_matmul_forward_bf16(t->k, (kcuda_bf16 *)dout, (kcuda_bf16 *)da,
                                                 (kcuda_bf16 *)dw, NULL, M, K, N), "second");
    kcuda_ctx_gemm_stats(t->k, &e2, &h2, &m2);
    if (e1 != e0 + 1 || m1 != m0 + 1 || e2 != e1 || h2 != h1 + 1 || m2 != m1) {
        printf("# cache: entries %d->%d->%d hits %ld->%ld->%ld misses %ld->%ld->%ld\n", e0, e1,
               e2, h0, h1, h2, m0, m1, m2);
        fail = 1;
    }
    snprintf(t->note, sizeof t->note, " entries=%d hits=%ld misses=%ld", e2, h2, m2);
    /* A cached entry keeps its descriptors; the bias pointer must still be this call's:
     * two fp32 forwards of one shape with different biases differ by exactly b2 - b1. */
    {
        float *x = gu_ph(&p, gu_rand(&t->rng, (size_t)M * K, -1, 1, 0));
        float *wf = gu_ph(&p, gu_rand(&t->rng, (size_t)N * K, -1, 1, 0));
        float *b1 = gu_ph(&p, gu_rand(&t->rng, N, -1, 1, 0)), *b2 = gu_ph(&p, gu_rand(&t->rng, N, -1, 1, 0));
        void *dx = gu_pd(&p, gu_upload(x, (size_t)M * K, 0)), *dwf = gu_pd(&p, gu_upload(wf, (size_t)N * K, 0));
        void *db1 = gu_pd(&p, gu_upload(b1, N, 0)), *db2 = gu_pd(&p, gu_upload(b2, N, 0));
        void *o1 = gu_pd(&p, gu_poisoned((size_t)M * N, 0)), *o2 = gu_pd(&p, gu_poisoned((size_t)M * N, 0));
        if (!dx || !dwf || !db1 || !db2 || !o1 || !o2) {
            gu_pool_free(&p);
            return 1;
        }
        fail |= !rc_ok(t, kcuda_matmul_forward_f32(t->k, (float *)o1, (float *)dx, (float *)dwf,
                                                    (float *)db1, M, K, N), "bias 1");
        fail |= !rc_ok(t, kcuda_matmul_forward_f32(t->k, (float *)o2, (float *)dx, (float *)dwf,
                                                    (float *)db2, M, K, N), "bias 2");
        float *g1 = gu_ph(&p, gu_download(o1, (size_t)M * N, 0));
        float *g2 = gu_ph(&p, gu_download(o2, (size_t)M * N, 0));
        float *d = gu_ph(&p, (float *)malloc((size_t)M * N * 4)), *r = gu_ph(&p, (float *)malloc((size_t)M * N * 4));
        if (!g1 || !g2) {
            gu_pool_free(&p);
            return 1;
        }
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                d[(size_t)i * N + j] = g2[(size_t)i * N + j] - g1[(size_t)i * N + j];
                r[(size_t)i * N + j] = b2[j] - b1[j];
            }
        double e = gu_rel_l2(d, r, (size_t)M * N);
        size_t len = strlen(t->note);
        snprintf(t->note + len, sizeof t->note - len, " bias_swap=%.2e", e);
        if (!(e <= TOL_F32)) {
            printf("# cached descriptor kept a stale bias: relative L2 %.3e\n", e);
            fail = 1;
        }
    }
    /* A bad shape is refused with a message, and nothing is launched. */
    int rc = kcuda_matmul_forward_bf16(t->k, (kcuda_bf16 *)dout, (kcuda_bf16 *)da,
                                       (kcuda_bf16 *)dw, NULL, 0, K, N);
    if (rc != KCUDA_EARG || !strstr(kcuda_ctx_errmsg(t->k), "bad shape")) {
        printf("# bad shape: rc %d, message '%s'\n", rc, kcuda_ctx_errmsg(t->k));
        fail = 1;
    }
    gu_pool_free(&p);
    return fail;
}

/* ---- RMSNorm ----------------------------------------------------------------- */

static int t_rmsnorm(struct tctx *t, int bf16)
{
    /* 2500 x 128: qk_norm's many short rows, more than the backward's grid; 9000: wider
     * than 256 threads x 8 groups */
    static const int shapes[][2] = {{67, 256}, {33, 2048}, {5, 1000}, {2500, 128}, {4, 9000}};
    int fail = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t nc = (size_t)N * C;
        struct gu_pool p = {};
        float *x = gu_ph(&p, gu_rand(&t->rng, nc, -2, 2, bf16));
        float *w = gu_ph(&p, gu_rand(&t->rng, C, 0.5f, 1.5f, bf16));
        float *dy = gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, bf16));
        float *dx0 = gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, bf16));
        float *dw0 = gu_ph(&p, gu_rand(&t->rng, C, -1, 1, 0));
        float *ref = gu_ph(&p, (float *)malloc(nc * 4)), *rstd = gu_ph(&p, (float *)malloc(N * 4));
        kcpu_rmsnorm_forward(ref, rstd, x, w, N, C, 1e-6f);
        float *rdx = gu_hcopy(&p, dx0, nc), *rdw = gu_hcopy(&p, dw0, C);
        kcpu_rmsnorm_backward(rdx, rdw, dy, x, w, rstd, N, C);
        void *d_x = gu_pd(&p, gu_upload(x, nc, bf16)), *d_w = gu_pd(&p, gu_upload(w, C, bf16));
        void *d_dy = gu_pd(&p, gu_upload(dy, nc, bf16)), *d_dx = gu_pd(&p, gu_upload(dx0, nc, bf16));
        void *d_dw = gu_pd(&p, gu_upload(dw0, C, 0));
        /* the backward reads the reference rstd, so that it is tested on its own */
        void *d_rstd_ref = gu_pd(&p, gu_upload(rstd, N, 0));
        void *d_out = gu_pd(&p, gu_poisoned(nc, bf16)), *d_rstd = gu_pd(&p, gu_poisoned(N, 0));
        if (!d_x || !d_w || !d_dy || !d_dx || !d_dw || !d_rstd_ref || !d_out || !d_rstd) {
            gu_pool_free(&p);
            return 1;
        }
        int r1, r2;
        if (bf16) {
            r1 = kcuda_rmsnorm_forward_bf16(t->k, (kcuda_bf16 *)d_out, (float *)d_rstd,
                                            (kcuda_bf16 *)d_x, (kcuda_bf16 *)d_w, N, C, 1e-6f);
            r2 = kcuda_rmsnorm_backward_bf16(t->k, (kcuda_bf16 *)d_dx, (float *)d_dw,
                                             (kcuda_bf16 *)d_dy, (kcuda_bf16 *)d_x,
                                             (kcuda_bf16 *)d_w, (float *)d_rstd_ref, N, C);
        } else {
            r1 = kcuda_rmsnorm_forward_f32(t->k, (float *)d_out, (float *)d_rstd, (float *)d_x,
                                           (float *)d_w, N, C, 1e-6f);
            r2 = kcuda_rmsnorm_backward_f32(t->k, (float *)d_dx, (float *)d_dw, (float *)d_dy,
                                            (float *)d_x, (float *)d_w, (float *)d_rstd_ref, N,
                                            C);
        }
        if (!rc_ok(t, r1, "rmsnorm_forward") || !rc_ok(t, r2, "rmsnorm_backward")) {
            gu_pool_free(&p);
            return 1;
        }
        fail |= check(t, "out", d_out, ref, nc, bf16);
        fail |= check(t, "rstd", d_rstd, rstd, N, 0);
        fail |= check(t, "dinp", d_dx, rdx, nc, bf16);
        /* fp32 storage, but summed over bf16 products: bf16 tolerance then */
        if (bf16) {
            float *g = gu_download(d_dw, C, 0);
            double e = g ? gu_rel_l2(g, rdw, C) : INFINITY;
            free(g);
            size_t len = strlen(t->note);
            snprintf(t->note + len, sizeof t->note - len, " dweight=%.2e", e);
            if (!(e <= TOL_BF16)) {
                printf("# dweight: relative L2 %.3e\n", e);
                fail = 1;
            }
        } else {
            fail |= check(t, "dweight", d_dw, rdw, C, 0);
        }
        gu_pool_free(&p);
    }
    return fail;
}

static int t_rmsnorm_f32(struct tctx *t) { return t_rmsnorm(t, 0); }
static int t_rmsnorm_bf16(struct tctx *t) { return t_rmsnorm(t, 1); }

/* ---- SwiGLU ------------------------------------------------------------------ */

static int t_swiglu(struct tctx *t, int bf16)
{
    int N = 77, F = 1000;
    size_t nf = (size_t)N * F;
    struct gu_pool p = {};
    float *x = gu_ph(&p, gu_rand(&t->rng, 2 * nf, -4, 4, bf16));
    float *dy = gu_ph(&p, gu_rand(&t->rng, nf, -1, 1, bf16));
    float *dx0 = gu_ph(&p, gu_rand(&t->rng, 2 * nf, -1, 1, bf16));
    float *ref = gu_ph(&p, (float *)malloc(nf * 4)), *rdx = gu_hcopy(&p, dx0, 2 * nf);
    kcpu_swiglu_forward(ref, x, N, F);
    kcpu_swiglu_backward(rdx, dy, x, N, F);
    void *d_x = gu_pd(&p, gu_upload(x, 2 * nf, bf16)), *d_dy = gu_pd(&p, gu_upload(dy, nf, bf16));
    void *d_dx = gu_pd(&p, gu_upload(dx0, 2 * nf, bf16)), *d_out = gu_pd(&p, gu_poisoned(nf, bf16));
    int fail = 0;
    if (!d_x || !d_dy || !d_dx || !d_out) {
        gu_pool_free(&p);
        return 1;
    }
    int r1, r2;
    if (bf16) {
        r1 = kcuda_swiglu_forward_bf16(t->k, (kcuda_bf16 *)d_out, (kcuda_bf16 *)d_x, N, F);
        r2 = kcuda_swiglu_backward_bf16(t->k, (kcuda_bf16 *)d_dx, (kcuda_bf16 *)d_dy,
                                        (kcuda_bf16 *)d_x, N, F, 1);
    } else {
        r1 = kcuda_swiglu_forward_f32(t->k, (float *)d_out, (float *)d_x, N, F);
        r2 = kcuda_swiglu_backward_f32(t->k, (float *)d_dx, (float *)d_dy, (float *)d_x, N, F,
                                       1);
    }
    if (!rc_ok(t, r1, "swiglu_forward") || !rc_ok(t, r2, "swiglu_backward")) {
        gu_pool_free(&p);
        return 1;
    }
    fail |= check(t, "out", d_out, ref, nf, bf16);
    fail |= check(t, "dinp", d_dx, rdx, 2 * nf, bf16);
    gu_pool_free(&p);
    return fail;
}

static int t_swiglu_f32(struct tctx *t) { return t_swiglu(t, 0); }
static int t_swiglu_bf16(struct tctx *t) { return t_swiglu(t, 1); }

/* ---- cross-entropy ------------------------------------------------------------- */

static int t_crossentropy(struct tctx *t)
{
    static const int shapes[][2] = {{67, 1024}, {9, 151936}, {3, 7}};
    int fail = 0, ignore = -100;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], V = shapes[s][1];
        size_t nv = (size_t)N * V;
        struct gu_pool p = {};
        float *l = gu_ph(&p, gu_rand(&t->rng, nv, -8, 8, 0));
        float *dl0 = gu_ph(&p, gu_rand(&t->rng, nv, -1, 1, 0));
        float *dloss = gu_ph(&p, gu_rand(&t->rng, N, 0.1f, 1, 0));
        int *tg = (int *)malloc(N * sizeof(int));
        for (int i = 0; i < N; i++)
            tg[i] = (int)(gu_next(&t->rng) % (uint64_t)V);
        tg[N / 2] = ignore;       /* an ignored row: loss 0, no gradient */
        int bad = N > 2 ? N - 1 : -1;
        if (bad >= 0)
            tg[bad] = V + 3;      /* an invalid target: loss NaN, no gradient */
        float *ref = gu_ph(&p, (float *)malloc(N * 4)), *rdl = gu_hcopy(&p, dl0, nv);
        kcpu_crossentropy_forward(ref, l, tg, N, V, ignore);
        kcpu_crossentropy_backward(rdl, l, tg, dloss, N, V, ignore);
        void *d_l = gu_pd(&p, gu_upload(l, nv, 0)), *d_dl = gu_pd(&p, gu_upload(dl0, nv, 0));
        void *d_dloss = gu_pd(&p, gu_upload(dloss, N, 0)), *d_loss = gu_pd(&p, gu_poisoned(N, 0));
        int *d_tg = NULL;
        if (!gu_ck(cudaMalloc(&d_tg, N * sizeof(int)), "cudaMalloc"))
            gu_pd(&p, d_tg);
        if (!d_l || !d_dl || !d_dloss || !d_loss || !d_tg ||
            gu_ck(cudaMemcpy(d_tg, tg, N * sizeof(int), cudaMemcpyHostToDevice), "targets")) {
            free(tg);
            gu_pool_free(&p);
            return 1;
        }
        int r1 = kcuda_crossentropy_forward_f32(t->k, (float *)d_loss, (float *)d_l, d_tg, N,
                                                V, ignore);
        int r2 = kcuda_crossentropy_backward_f32(t->k, (float *)d_dl, (float *)d_l, d_tg,
                                                 (float *)d_dloss, N, V, ignore);
        free(tg);
        if (!rc_ok(t, r1, "crossentropy_forward") || !rc_ok(t, r2, "crossentropy_backward")) {
            gu_pool_free(&p);
            return 1;
        }
        float *got = gu_download(d_loss, N, 0);
        if (!got) {
            gu_pool_free(&p);
            return 1;
        }
        gu_ph(&p, got);
        if (bad >= 0) {
            if (!isnan(got[bad]) || !isnan(ref[bad])) {
                printf("# invalid target: loss %g (reference %g), want NaN\n", got[bad],
                       ref[bad]);
                fail = 1;
            }
            got[bad] = ref[bad] = 0; /* compare the rest */
        }
        if (got[N / 2] != 0.0f) {
            printf("# ignored row: loss %g, want 0\n", got[N / 2]);
            fail = 1;
        }
        double e = gu_rel_l2(got, ref, N);
        size_t len = strlen(t->note);
        snprintf(t->note + len, sizeof t->note - len, " loss[V=%d]=%.2e", V, e);
        if (!(e <= TOL_F32)) {
            printf("# losses V=%d: relative L2 %.3e\n", V, e);
            fail = 1;
        }
        fail |= check(t, "dlogits", d_dl, rdl, nv, 0);
        gu_pool_free(&p);
    }
    return fail;
}

/* ---- AdamW --------------------------------------------------------------------- */

static int t_adamw(struct tctx *t)
{
    size_t n = 100003;
    struct gu_pool p = {};
    float *pm = gu_ph(&p, gu_rand(&t->rng, n, -1, 1, 0));
    float *m = gu_ph(&p, gu_rand(&t->rng, n, -0.1f, 0.1f, 0));
    float *v = gu_ph(&p, gu_rand(&t->rng, n, 0, 0.01f, 0));
    void *d_p = gu_pd(&p, gu_upload(pm, n, 0)), *d_m = gu_pd(&p, gu_upload(m, n, 0));
    void *d_v = gu_pd(&p, gu_upload(v, n, 0)), *d_pb = gu_pd(&p, gu_poisoned(n, 1));
    int fail = 0;
    if (!d_p || !d_m || !d_v || !d_pb) {
        gu_pool_free(&p);
        return 1;
    }
    for (int step = 1; step <= 3; step++) {
        float *g = gu_rand(&t->rng, n, -1, 1, 0);
        void *d_g = gu_upload(g, n, 0);
        kcpu_adamw_update(pm, g, m, v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        int rc = d_g ? kcuda_adamw_update(t->k, (float *)d_p, step == 3 ? (kcuda_bf16 *)d_pb : NULL,
                                          (float *)d_g, (float *)d_m, (float *)d_v, n, 1e-2f,
                                          0.9f, 0.95f, 1e-8f, 0.1f, step)
                     : KCUDA_ECUDA;
        free(g);
        int ok = rc_ok(t, rc, "adamw_update");
        cudaFree(d_g);
        if (!ok) {
            gu_pool_free(&p);
            return 1;
        }
    }
    fail |= check(t, "param", d_p, pm, n, 0);
    fail |= check(t, "m", d_m, m, n, 0);
    fail |= check(t, "v", d_v, v, n, 0);
    /* the bf16 copy is exactly the rounding of the fp32 parameters written */
    float *gp = gu_ph(&p, gu_download(d_p, n, 0)), *gb = gu_ph(&p, gu_download(d_pb, n, 1));
    size_t mism = 0;
    for (size_t i = 0; gp && gb && i < n; i++)
        mism += gu_to_bf16(gp[i]) != gu_to_bf16(gb[i]) || isnan(gb[i]);
    if (!gp || !gb || mism) {
        printf("# bf16 parameter copy: %zu of %zu elements differ\n", mism, n);
        fail = 1;
    }
    gu_pool_free(&p);
    return fail;
}

/* cuBLASLt's GELU epilogues (kcuda_matmul_forward_bf16_gelu, kcuda_matmul_dinp_bf16_dgelu)
 * against the cpu's matmul followed by its tanh GELU (forward: out and pre, both poisoned
 * first; backward: dinp written from a fresh pre-activation). */
static int t_matmul_gelu(struct tctx *t)
{
    int fail = 0;
    for (size_t s = 0; s < sizeof gemm_shapes / sizeof gemm_shapes[0]; s++) {
        int M = gemm_shapes[s][0], K = gemm_shapes[s][1], N = gemm_shapes[s][2];
        size_t mk = (size_t)M * K, nk = (size_t)N * K, mn = (size_t)M * N;
        struct gu_pool p = {};
        float *inp = gu_ph(&p, gu_rand(&t->rng, mk, -1, 1, 1));
        float *w = gu_ph(&p, gu_rand(&t->rng, nk, -0.2f, 0.2f, 1));
        float *b = gu_ph(&p, gu_rand(&t->rng, N, -1, 1, 1));
        float *dout = gu_ph(&p, gu_rand(&t->rng, mn, -1, 1, 1));
        float *pre = gu_ph(&p, gu_rand(&t->rng, mk, -3, 3, 1));   /* the backward's */
        void *d_inp = gu_pd(&p, gu_upload(inp, mk, 1)), *d_w = gu_pd(&p, gu_upload(w, nk, 1));
        void *d_b = gu_pd(&p, gu_upload(b, N, 1)), *d_dout = gu_pd(&p, gu_upload(dout, mn, 1));
        void *d_pre = gu_pd(&p, gu_upload(pre, mk, 1));
        void *d_out = gu_pd(&p, gu_poisoned(mn, 1)), *d_u = gu_pd(&p, gu_poisoned(mn, 1));
        void *d_dinp = gu_pd(&p, gu_poisoned(mk, 1));
        float *ru = gu_ph(&p, (float *)malloc(mn * sizeof(float)));
        float *ra = gu_ph(&p, (float *)malloc(mn * sizeof(float)));
        float *rda = gu_ph(&p, (float *)calloc(mk, sizeof(float)));
        float *rdi = gu_ph(&p, (float *)calloc(mk, sizeof(float)));
        if (!d_inp || !d_w || !d_b || !d_dout || !d_pre || !d_out || !d_u || !d_dinp || !ru ||
            !ra || !rda || !rdi) {
            gu_pool_free(&p);
            return 1;
        }
        kcpu_matmul_forward(ru, inp, w, b, M, K, N);
        kcpu_gelu_forward(ra, ru, mn, KGELU_TANH);
        kcpu_matmul_backward(rda, NULL, NULL, dout, inp, w, M, K, N);
        kcpu_gelu_backward(rdi, rda, pre, mk, KGELU_TANH);
        typedef const kcuda_bf16 *cb;
        if (!rc_ok(t, kcuda_matmul_forward_bf16_gelu(t->k, (kcuda_bf16 *)d_out,
                                                     (kcuda_bf16 *)d_u, (cb)d_inp, (cb)d_w,
                                                     (cb)d_b, M, K, N),
                   "matmul_forward_bf16_gelu") ||
            !rc_ok(t, kcuda_matmul_dinp_bf16_dgelu(t->k, (kcuda_bf16 *)d_dinp, (cb)d_dout,
                                                   (cb)d_w, (cb)d_pre, M, K, N),
                   "matmul_dinp_bf16_dgelu")) {
            gu_pool_free(&p);
            return 1;
        }
        char nm[64];
        snprintf(nm, sizeof nm, "gelu_out[%d,%d,%d]", M, K, N);
        fail |= check(t, nm, d_out, ra, mn, 1);
        fail |= check(t, "gelu_pre", d_u, ru, mn, 1);
        fail |= check(t, "dgelu_dinp", d_dinp, rdi, mk, 1);
        gu_pool_free(&p);
    }
    return fail;
}

/* ---- runner ---------------------------------------------------------------------- */

static const struct gu_test<struct tctx> tests[] = {
    {"matmul_f32", t_matmul_f32},       {"matmul_bf16", t_matmul_bf16},
    {"matmul_bf16_f32w", t_matmul_f32w}, {"matmul_bf16_gelu", t_matmul_gelu},
    {"gemm_algo_cache", t_gemm_cache},  {"rmsnorm_f32", t_rmsnorm_f32},
    {"rmsnorm_bf16", t_rmsnorm_bf16},   {"swiglu_f32", t_swiglu_f32},
    {"swiglu_bf16", t_swiglu_bf16},     {"crossentropy_f32", t_crossentropy},
    {"adamw", t_adamw},
};

static void reset_worst(struct tctx *t) { t->worst = 0; }

int main(void)
{
    static struct tctx t;
    int n = (int)(sizeof tests / sizeof tests[0]);
    return gu_tap_main("gpu kernels", tests, n, &t, reset_worst);
}
