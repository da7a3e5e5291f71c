/* test_elementwise_gpu.cu - LayerNorm, fused residual + RMSNorm/LayerNorm, RoPE (1-D,
 * mRoPE, 2-D tables), GELU (tanh, erf), embedding, multi-tensor sum of squares / clip
 * factor / AdamW against the fp32 CPU reference (kernels/cpu) on fresh random inputs.
 * Plain TAP, one line per kernel family with the per-check errors as a diagnostic.
 * Outputs are poisoned (NaN) before each run; accumulated gradients start from random
 * values so that the += is tested.  Edge sizes: N = 1, widths that are not multiples of
 * the block or vector width, odd D, misaligned tensors, empty tensors.  The kernels
 * with reductions (norms, weight/bias gradients, sum of squares) or a scatter (embedding
 * backward) are run twice on the same inputs and must give the same bits.  Tolerances: bf16 relative L2 <= 1e-2, fp32 <= 1e-5, AdamW <= 1e-6.
 * Without a CUDA device it prints one skipped test and exits 0.  HEARTH_SEED=N replays. */
extern "C" {
#include "kernels.h"
}
#include "tests/gpu/gpu_tap.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-5
#define TOL_ADAMW 1e-6

typedef kcuda_bf16 bf;

struct tctx {
    kcuda_ctx *k;
    uint64_t rng;
    char note[1024];
};

static float *halloc(struct gu_pool *p, size_t n)
{
    return gu_ph(p, (float *)malloc((n ? n : 1) * sizeof(float)));
}

/* Device result vs host reference at tolerance tol; 0 = pass. */
static int check_tol(struct tctx *t, const char *what, const void *dev, const float *ref,
                     size_t n, int bf16, double tol)
{
    float *got = gu_download(dev, n, bf16);
    if (!got) {
        printf("# %s: download failed\n", what);
        return 1;
    }
    double err = gu_rel_l2(got, ref, n);
    free(got);
    gu_note(t, " %s=%.1e", what, err);
    if (!(err <= tol)) {
        printf("# %s: relative L2 %.3e > %.0e\n", what, err, tol);
        return 1;
    }
    return 0;
}

static int check(struct tctx *t, const char *what, const void *dev, const float *ref, size_t n,
                 int bf16)
{
    return check_tol(t, what, dev, ref, n, bf16, bf16 ? TOL_BF16 : TOL_F32);
}

/* The two device buffers hold the same bytes (determinism checks); 0 = equal. */
static int same_bits(const char *what, const void *a, const void *b, size_t bytes)
{
    unsigned char *ha = (unsigned char *)malloc(bytes ? bytes : 1);
    unsigned char *hb = (unsigned char *)malloc(bytes ? bytes : 1);
    int bad = gu_ck(cudaDeviceSynchronize(), "sync") ||
              gu_ck(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost), "download") ||
              gu_ck(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost), "download");
    if (!bad && memcmp(ha, hb, bytes) != 0) {
        printf("# %s: two runs on the same inputs differ\n", what);
        bad = 1;
    }
    free(ha);
    free(hb);
    return bad;
}

/* A device copy of another device buffer. */
static void *dclone(struct gu_pool *p, const void *src, size_t bytes)
{
    void *d = NULL;
    if (gu_ck(cudaMalloc(&d, bytes ? bytes : 1), "cudaMalloc"))
        return NULL;
    gu_pd(p, d);
    if (gu_ck(cudaMemcpy(d, src, bytes, cudaMemcpyDeviceToDevice), "clone"))
        return NULL;
    return d;
}

/* Host values rounded to bf16 as the device stores them. */
static void round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = gu_from_bf16(gu_to_bf16(x[i]));
}

static int rc_ok(struct tctx *t, int rc, const char *what)
{
    return gu_rc_ok(t->k, rc, what);
}

/* ---- LayerNorm ------------------------------------------------------------------- */

/* 3000 rows: more than the backward's grid, so its blocks take several rows each; 9000
 * columns: more than 256 threads x 8 groups, so its blocks are wider */
static const int norm_shapes[][2] = {{67, 256}, {130, 2048}, {1, 1000}, {5, 77}, {1, 1},
                                     {200, 300}, {3000, 768}, {5, 9000}};

static int t_layernorm(struct tctx *t, int bf16)
{
    int fail = 0;
    for (size_t s = 0; s < sizeof norm_shapes / sizeof norm_shapes[0]; s++) {
        int N = norm_shapes[s][0], C = norm_shapes[s][1], with_bias = s != 3;
        size_t nc = (size_t)N * C;
        struct gu_pool p = {};
        float *x = gu_ph(&p, gu_rand(&t->rng, nc, -2, 3, bf16));
        float *w = gu_ph(&p, gu_rand(&t->rng, C, 0.5f, 1.5f, bf16));
        float *b = gu_ph(&p, gu_rand(&t->rng, C, -1, 1, bf16));
        float *dy = gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, bf16));
        float *dx0 = gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, bf16));
        float *dw0 = gu_ph(&p, gu_rand(&t->rng, C, -1, 1, 0));
        float *db0 = gu_ph(&p, gu_rand(&t->rng, C, -1, 1, 0));
        float *ref = halloc(&p, nc), *mean = halloc(&p, N), *rstd = halloc(&p, N);
        kcpu_layernorm_forward(ref, mean, rstd, x, w, with_bias ? b : NULL, N, C, 1e-5f);
        float *rdx = gu_hcopy(&p, dx0, nc), *rdw = gu_hcopy(&p, dw0, C), *rdb = gu_hcopy(&p, db0, C);
        kcpu_layernorm_backward(rdx, rdw, rdb, dy, x, w, mean, rstd, N, C);
        void *d_x = gu_pd(&p, gu_upload(x, nc, bf16)), *d_w = gu_pd(&p, gu_upload(w, C, bf16));
        void *d_b = gu_pd(&p, gu_upload(b, C, bf16)), *d_dy = gu_pd(&p, gu_upload(dy, nc, bf16));
        void *d_dx = gu_pd(&p, gu_upload(dx0, nc, bf16)), *d_dw = gu_pd(&p, gu_upload(dw0, C, 0));
        void *d_db = gu_pd(&p, gu_upload(db0, C, 0));
        void *d_mean_ref = gu_pd(&p, gu_upload(mean, N, 0)), *d_rstd_ref = gu_pd(&p, gu_upload(rstd, N, 0));
        void *d_out = gu_pd(&p, gu_poisoned(nc, bf16)), *d_mean = gu_pd(&p, gu_poisoned(N, 0));
        void *d_rstd = gu_pd(&p, gu_poisoned(N, 0));
        void *d_dw2 = d_dw ? dclone(&p, d_dw, C * 4) : NULL;
        void *d_db2 = d_db ? dclone(&p, d_db, C * 4) : NULL;
        if (!d_x || !d_w || !d_b || !d_dy || !d_dx || !d_dw || !d_db || !d_mean_ref ||
            !d_rstd_ref || !d_out || !d_mean || !d_rstd || !d_dw2 || !d_db2) {
            gu_pool_free(&p);
            return 1;
        }
        int r1, r2, r3;
        if (bf16) {
            r1 = kcuda_layernorm_forward_bf16(t->k, (bf *)d_out, (float *)d_mean,
                                              (float *)d_rstd, (bf *)d_x, (bf *)d_w,
                                              with_bias ? (bf *)d_b : NULL, N, C, 1e-5f);
            r2 = kcuda_layernorm_backward_bf16(t->k, (bf *)d_dx, (float *)d_dw, (float *)d_db,
                                               (bf *)d_dy, (bf *)d_x, (bf *)d_w,
                                               (float *)d_mean_ref, (float *)d_rstd_ref, N, C);
            r3 = kcuda_layernorm_backward_bf16(t->k, NULL, (float *)d_dw2, (float *)d_db2,
                                               (bf *)d_dy, (bf *)d_x, (bf *)d_w,
                                               (float *)d_mean_ref, (float *)d_rstd_ref, N, C);
        } else {
            r1 = kcuda_layernorm_forward_f32(t->k, (float *)d_out, (float *)d_mean,
                                             (float *)d_rstd, (float *)d_x, (float *)d_w,
                                             with_bias ? (float *)d_b : NULL, N, C, 1e-5f);
            r2 = kcuda_layernorm_backward_f32(t->k, (float *)d_dx, (float *)d_dw,
                                              (float *)d_db, (float *)d_dy, (float *)d_x,
                                              (float *)d_w, (float *)d_mean_ref,
                                              (float *)d_rstd_ref, N, C);
            r3 = kcuda_layernorm_backward_f32(t->k, NULL, (float *)d_dw2, (float *)d_db2,
                                              (float *)d_dy, (float *)d_x, (float *)d_w,
                                              (float *)d_mean_ref, (float *)d_rstd_ref, N, C);
        }
        if (!rc_ok(t, r1, "layernorm_forward") || !rc_ok(t, r2, "layernorm_backward") ||
            !rc_ok(t, r3, "layernorm_backward (again)")) {
            gu_pool_free(&p);
            return 1;
        }
        gu_note(t, " [%dx%d]", N, C);
        fail |= check(t, "out", d_out, ref, nc, bf16);
        fail |= check(t, "mean", d_mean, mean, N, 0);
        fail |= check(t, "rstd", d_rstd, rstd, N, 0);
        /* Over one element both sides multiply rounding residue by rstd = 1/sqrt(eps)
         * (316 here), so fp32 agreement is looser there; the bf16 bound is unchanged. */
        fail |= check_tol(t, "dinp", d_dx, rdx, nc, bf16,
                          bf16 ? TOL_BF16 : (C > 1 ? TOL_F32 : 1e-4));
        /* fp32 storage, but summed over bf16 inputs: the bf16 tolerance then */
        fail |= check_tol(t, "dw", d_dw, rdw, C, 0, bf16 ? TOL_BF16 : TOL_F32);
        fail |= check_tol(t, "db", d_db, rdb, C, 0, bf16 ? TOL_BF16 : TOL_F32);
        fail |= same_bits("layernorm dweight", d_dw, d_dw2, C * 4);
        fail |= same_bits("layernorm dbias", d_db, d_db2, C * 4);
        /* a second forward gives the same bits */
        void *o2 = gu_pd(&p, gu_poisoned(nc, bf16)), *m2 = gu_pd(&p, gu_poisoned(N, 0));
        int r4 = !o2 || !m2 ? -1
                 : bf16 ? kcuda_layernorm_forward_bf16(t->k, (bf *)o2, (float *)m2, NULL,
                                                       (bf *)d_x, (bf *)d_w,
                                                       with_bias ? (bf *)d_b : NULL, N, C, 1e-5f)
                        : kcuda_layernorm_forward_f32(t->k, (float *)o2, (float *)m2, NULL,
                                                      (float *)d_x, (float *)d_w,
                                                      with_bias ? (float *)d_b : NULL, N, C,
                                                      1e-5f);
        fail |= !rc_ok(t, r4, "layernorm_forward (again)") ||
                same_bits("layernorm out", d_out, o2, nc * (bf16 ? 2 : 4)) ||
                same_bits("layernorm mean", d_mean, m2, (size_t)N * 4);
        gu_pool_free(&p);
    }
    return fail;
}

static int t_layernorm_f32(struct tctx *t) { return t_layernorm(t, 0); }
static int t_layernorm_bf16(struct tctx *t) { return t_layernorm(t, 1); }

/* ---- fused residual + norm ---------------------------------------------------------- */

/* sum = x + r (written, exactly the bf16 rounding of the fp32 sum), out = norm(sum); then
 * the backward through the plain norm backward accumulates into the residual gradient.
 * One shape writes the sum in place over x. */
static int t_residual(struct tctx *t, int layer)
{
    int fail = 0;
    for (size_t s = 0; s < sizeof norm_shapes / sizeof norm_shapes[0]; s++) {
        int N = norm_shapes[s][0], C = norm_shapes[s][1], inplace = s == 0;
        size_t nc = (size_t)N * C;
        struct gu_pool p = {};
        float *x = gu_ph(&p, gu_rand(&t->rng, nc, -2, 2, 1));
        float *r = gu_ph(&p, gu_rand(&t->rng, nc, -2, 2, 1));
        float *w = gu_ph(&p, gu_rand(&t->rng, C, 0.5f, 1.5f, 1));
        float *b = gu_ph(&p, gu_rand(&t->rng, C, -1, 1, 1));
        float *dy = gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, 1));
        float *dres0 = gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, 1));
        float *dw0 = gu_ph(&p, gu_rand(&t->rng, C, -1, 1, 0));
        float *sum = halloc(&p, nc), *ref = halloc(&p, nc), *mean = halloc(&p, N);
        float *rstd = halloc(&p, N);
        kcpu_add(sum, x, r, nc);
        round_bf16(sum, nc);
        float *rdres = gu_hcopy(&p, dres0, nc), *rdw = gu_hcopy(&p, dw0, C);
        if (layer) {
            kcpu_layernorm_forward(ref, mean, rstd, sum, w, b, N, C, 1e-5f);
            kcpu_layernorm_backward(rdres, rdw, NULL, dy, sum, w, mean, rstd, N, C);
        } else {
            kcpu_rmsnorm_forward(ref, rstd, sum, w, N, C, 1e-6f);
            kcpu_rmsnorm_backward(rdres, rdw, dy, sum, w, rstd, N, C);
        }
        void *d_x = gu_pd(&p, gu_upload(x, nc, 1)), *d_r = gu_pd(&p, gu_upload(r, nc, 1));
        void *d_w = gu_pd(&p, gu_upload(w, C, 1)), *d_b = gu_pd(&p, gu_upload(b, C, 1));
        void *d_dy = gu_pd(&p, gu_upload(dy, nc, 1)), *d_dres = gu_pd(&p, gu_upload(dres0, nc, 1));
        void *d_dw = gu_pd(&p, gu_upload(dw0, C, 0));
        void *d_sum = inplace ? d_x : gu_pd(&p, gu_poisoned(nc, 1));
        void *d_out = gu_pd(&p, gu_poisoned(nc, 1)), *d_mean = gu_pd(&p, gu_poisoned(N, 0));
        void *d_rstd = gu_pd(&p, gu_poisoned(N, 0));
        if (!d_x || !d_r || !d_w || !d_b || !d_dy || !d_dres || !d_dw || !d_sum || !d_out ||
            !d_mean || !d_rstd) {
            gu_pool_free(&p);
            return 1;
        }
        int r1, r2;
        if (layer) {
            r1 = kcuda_residual_layernorm_forward_bf16(t->k, (bf *)d_out, (bf *)d_sum,
                                                       (float *)d_mean, (float *)d_rstd,
                                                       (bf *)d_x, (bf *)d_r, (bf *)d_w,
                                                       (bf *)d_b, N, C, 1e-5f);
            r2 = rc_ok(t, r1, "residual_layernorm_forward")
                     ? kcuda_layernorm_backward_bf16(t->k, (bf *)d_dres, (float *)d_dw, NULL,
                                                     (bf *)d_dy, (bf *)d_sum, (bf *)d_w,
                                                     (float *)d_mean, (float *)d_rstd, N, C)
                     : -1;
        } else {
            r1 = kcuda_residual_rmsnorm_forward_bf16(t->k, (bf *)d_out, (bf *)d_sum,
                                                     (float *)d_rstd, (bf *)d_x, (bf *)d_r,
                                                     (bf *)d_w, N, C, 1e-6f);
            r2 = rc_ok(t, r1, "residual_rmsnorm_forward")
                     ? kcuda_rmsnorm_backward_bf16(t->k, (bf *)d_dres, (float *)d_dw,
                                                   (bf *)d_dy, (bf *)d_sum, (bf *)d_w,
                                                   (float *)d_rstd, N, C)
                     : -1;
        }
        if (r1 < 0 || !rc_ok(t, r2, "norm_backward")) {
            gu_pool_free(&p);
            return 1;
        }
        if (!inplace) { /* a second forward gives the same bits */
            void *o2 = gu_pd(&p, gu_poisoned(nc, 1)), *s2 = gu_pd(&p, gu_poisoned(nc, 1));
            int r3 = !o2 || !s2 ? -1
                     : layer ? kcuda_residual_layernorm_forward_bf16(
                                   t->k, (bf *)o2, (bf *)s2, NULL, NULL, (bf *)d_x, (bf *)d_r,
                                   (bf *)d_w, (bf *)d_b, N, C, 1e-5f)
                             : kcuda_residual_rmsnorm_forward_bf16(t->k, (bf *)o2, (bf *)s2,
                                                                   NULL, (bf *)d_x, (bf *)d_r,
                                                                   (bf *)d_w, N, C, 1e-6f);
            fail |= !rc_ok(t, r3, "residual norm forward (again)") ||
                    same_bits("residual norm out", d_out, o2, nc * 2);
        }
        gu_note(t, " [%dx%d%s]", N, C, inplace ? " in place" : "");
        float *gs = gu_ph(&p, gu_download(d_sum, nc, 1));
        size_t mism = 0;
        for (size_t i = 0; gs && i < nc; i++)
            mism += memcmp(&gs[i], &sum[i], 4) != 0;
        if (!gs || mism) {
            printf("# residual sum: %zu of %zu elements differ from the bf16 rounding\n", mism,
                   nc);
            fail = 1;
        }
        fail |= check(t, "out", d_out, ref, nc, 1);
        if (layer)
            fail |= check(t, "mean", d_mean, mean, N, 0);
        fail |= check(t, "rstd", d_rstd, rstd, N, 0);
        fail |= check(t, "dres", d_dres, rdres, nc, 1);
        fail |= check_tol(t, "dw", d_dw, rdw, C, 0, TOL_BF16);
        gu_pool_free(&p);
    }
    return fail;
}

static int t_residual_rmsnorm(struct tctx *t) { return t_residual(t, 0); }
static int t_residual_layernorm(struct tctx *t) { return t_residual(t, 1); }

/* ---- RoPE --------------------------------------------------------------------------- */

static int t_rope(struct tctx *t, int bf16)
{
    /* kind 0: 1-D, 1: mRoPE, 2: 2-D */
    static const int cases[][4] = {{37, 5, 64, 0}, {1, 3, 128, 1}, {50, 4, 80, 2},
                                   {7, 2, 9, 0},   {300, 2, 128, 1}, {1, 1, 2, 2}};
    int fail = 0;
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int N = cases[s][0], H = cases[s][1], D = cases[s][2], kind = cases[s][3], half = D / 2;
        size_t n = (size_t)N * H * D, nt = (size_t)N * half;
        struct gu_pool p = {};
        float *cs = halloc(&p, nt), *sn = halloc(&p, nt);
        int *pos = (int *)malloc(3 * (size_t)N * sizeof(int));
        for (int i = 0; i < 3 * N; i++)
            pos[i] = (int)(gu_next(&t->rng) % 4096);
        if (kind == 0) {
            kcpu_rope_table_1d(cs, sn, pos, N, D, 10000.0f);
        } else if (kind == 1) {
            int sec[3] = {half / 4, (half - half / 4) / 2, 0};
            sec[2] = half - sec[0] - sec[1];
            kcpu_rope_table_mrope(cs, sn, pos, sec, N, D, 1000000.0f);
        } else {
            kcpu_rope_table_2d(cs, sn, pos, N, D, 10000.0f);
        }
        free(pos);
        float *x = gu_ph(&p, gu_rand(&t->rng, n, -2, 2, bf16));
        float *g = gu_ph(&p, gu_rand(&t->rng, n, -1, 1, bf16));
        float *rx = gu_hcopy(&p, x, n), *rg = gu_hcopy(&p, g, n);
        kcpu_rope_forward(rx, cs, sn, N, H, D);
        kcpu_rope_backward(rg, cs, sn, N, H, D);
        void *d_x = gu_pd(&p, gu_upload(x, n, bf16)), *d_g = gu_pd(&p, gu_upload(g, n, bf16));
        void *d_c = gu_pd(&p, gu_upload(cs, nt, 0)), *d_s = gu_pd(&p, gu_upload(sn, nt, 0));
        if (!d_x || !d_g || !d_c || !d_s) {
            gu_pool_free(&p);
            return 1;
        }
        int r1, r2;
        if (bf16) {
            r1 = kcuda_rope_forward_bf16(t->k, (bf *)d_x, (float *)d_c, (float *)d_s, N, H, D);
            r2 = kcuda_rope_backward_bf16(t->k, (bf *)d_g, (float *)d_c, (float *)d_s, N, H, D);
        } else {
            r1 = kcuda_rope_forward_f32(t->k, (float *)d_x, (float *)d_c, (float *)d_s, N, H, D);
            r2 = kcuda_rope_backward_f32(t->k, (float *)d_g, (float *)d_c, (float *)d_s, N, H,
                                         D);
        }
        if (!rc_ok(t, r1, "rope_forward") || !rc_ok(t, r2, "rope_backward")) {
            gu_pool_free(&p);
            return 1;
        }
        static const char *kn[] = {"1d", "mrope", "2d"};
        gu_note(t, " [%s %d,%d,%d]", kn[kind], N, H, D);
        fail |= check(t, "fwd", d_x, rx, n, bf16);
        fail |= check(t, "bwd", d_g, rg, n, bf16);
        gu_pool_free(&p);
    }
    return fail;
}

static int t_rope_f32(struct tctx *t) { return t_rope(t, 0); }
static int t_rope_bf16(struct tctx *t) { return t_rope(t, 1); }

/* ---- GELU --------------------------------------------------------------------------- */

static int t_gelu(struct tctx *t, int bf16)
{
    /* the last size runs on buffers one element past an aligned address (scalar path) */
    static const size_t sizes[] = {100003, 1, 4096 * 3 + 5, 777};
    const int nsizes = (int)(sizeof sizes / sizeof sizes[0]);
    int fail = 0;
    for (int kind = 0; kind <= 1; kind++)
        for (int s = 0; s < nsizes; s++) {
            size_t n = sizes[s], o = s == nsizes - 1, es = bf16 ? 2 : 4;
            struct gu_pool p = {};
            /* One element alone is measured relative to itself: keep it where 1 + tanh
             * does not cancel (below about -2.5 it amplifies the 1-2 ulp difference
             * between the device's and the host's tanh a hundredfold). */
            float lo = n == 1 ? -2.0f : -5.0f;
            float *x = gu_ph(&p, gu_rand(&t->rng, n + o, lo, 5, bf16));
            float *dy = gu_ph(&p, gu_rand(&t->rng, n + o, -1, 1, bf16));
            float *dx0 = gu_ph(&p, gu_rand(&t->rng, n + o, -1, 1, bf16));
            float *ref = halloc(&p, n), *rdx = gu_hcopy(&p, dx0 + o, n);
            kcpu_gelu_forward(ref, x + o, n, (kgelu_kind)kind);
            kcpu_gelu_backward(rdx, dy + o, x + o, n, (kgelu_kind)kind);
            char *d_x = (char *)gu_pd(&p, gu_upload(x, n + o, bf16));
            char *d_dy = (char *)gu_pd(&p, gu_upload(dy, n + o, bf16));
            char *d_dx = (char *)gu_pd(&p, gu_upload(dx0, n + o, bf16));
            char *d_out = (char *)gu_pd(&p, gu_poisoned(n + o, bf16));
            if (!d_x || !d_dy || !d_dx || !d_out) {
                gu_pool_free(&p);
                return 1;
            }
            d_x += o * es;
            d_dy += o * es;
            d_dx += o * es;
            d_out += o * es;
            int r1, r2;
            if (bf16) {
                r1 = kcuda_gelu_forward_bf16(t->k, (bf *)d_out, (bf *)d_x, n, kind);
                r2 = kcuda_gelu_backward_bf16(t->k, (bf *)d_dx, (bf *)d_dy, (bf *)d_x, n, kind,
                                              1);
            } else {
                r1 = kcuda_gelu_forward_f32(t->k, (float *)d_out, (float *)d_x, n, kind);
                r2 = kcuda_gelu_backward_f32(t->k, (float *)d_dx, (float *)d_dy, (float *)d_x, n,
                                             kind, 1);
            }
            if (!rc_ok(t, r1, "gelu_forward") || !rc_ok(t, r2, "gelu_backward")) {
                gu_pool_free(&p);
                return 1;
            }
            gu_note(t, " [%s n=%zu%s]", kind ? "erf" : "tanh", n, o ? " misaligned" : "");
            fail |= check(t, "fwd", d_out, ref, n, bf16);
            fail |= check(t, "bwd", d_dx, rdx, n, bf16);
            gu_pool_free(&p);
        }
    /* an unknown kind is refused */
    int rc = kcuda_gelu_forward_f32(t->k, (float *)1, (float *)1, 1, 2);
    if (rc != KCUDA_EARG) {
        printf("# gelu kind 2: rc %d, want KCUDA_EARG\n", rc);
        fail = 1;
    }
    return fail;
}

static int t_gelu_f32(struct tctx *t) { return t_gelu(t, 0); }
static int t_gelu_bf16(struct tctx *t) { return t_gelu(t, 1); }

/* ---- embedding ------------------------------------------------------------------------ */

/* ids drawn from a small range so that many tokens share an id (the scatter's hard case),
 * plus one id far away; the fp32 gradient table is summed in token order on both sides,
 * so it must match to fp32 precision and be bitwise stable. */
static int t_embedding(struct tctx *t, int bf16)
{
    static const int cases[][3] = {{517, 300, 1000}, {1, 1, 3}, {2048, 256, 40}, {33, 1029, 5}};
    int fail = 0;
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        int N = cases[s][0], C = cases[s][1], V = cases[s][2];
        size_t nc = (size_t)N * C, vc = (size_t)V * C;
        struct gu_pool p = {};
        int *ids = (int *)malloc(N * sizeof(int));
        int range = V > 50 ? 50 : V;
        for (int i = 0; i < N; i++)
            ids[i] = (int)(gu_next(&t->rng) % (uint64_t)range);
        ids[N - 1] = V - 1;
        float *table = gu_ph(&p, gu_rand(&t->rng, vc, -1, 1, bf16));
        float *dy = gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, bf16));
        float *dt0 = gu_ph(&p, gu_rand(&t->rng, vc, -1, 1, 0));
        float *ref = halloc(&p, nc), *rdt = gu_hcopy(&p, dt0, vc);
        kcpu_embedding_forward(ref, ids, table, N, C);
        kcpu_embedding_backward(rdt, dy, ids, N, C);
        void *d_ids = gu_iupload(&p, ids, N);
        free(ids);
        void *d_tab = gu_pd(&p, gu_upload(table, vc, bf16)), *d_dy = gu_pd(&p, gu_upload(dy, nc, bf16));
        void *d_dt = gu_pd(&p, gu_upload(dt0, vc, 0)), *d_out = gu_pd(&p, gu_poisoned(nc, bf16));
        void *d_dt2 = d_dt ? dclone(&p, d_dt, vc * 4) : NULL;
        if (!d_ids || !d_tab || !d_dy || !d_dt || !d_out || !d_dt2) {
            gu_pool_free(&p);
            return 1;
        }
        int r1, r2, r3;
        if (bf16) {
            r1 = kcuda_embedding_forward_bf16(t->k, (bf *)d_out, (int *)d_ids, (bf *)d_tab, N, C);
            r2 = kcuda_embedding_backward_bf16(t->k, (float *)d_dt, (bf *)d_dy, (int *)d_ids, N,
                                               C);
            r3 = kcuda_embedding_backward_bf16(t->k, (float *)d_dt2, (bf *)d_dy, (int *)d_ids, N,
                                               C);
        } else {
            r1 = kcuda_embedding_forward_f32(t->k, (float *)d_out, (int *)d_ids, (float *)d_tab,
                                             N, C);
            r2 = kcuda_embedding_backward_f32(t->k, (float *)d_dt, (float *)d_dy, (int *)d_ids,
                                              N, C);
            r3 = kcuda_embedding_backward_f32(t->k, (float *)d_dt2, (float *)d_dy, (int *)d_ids,
                                              N, C);
        }
        if (!rc_ok(t, r1, "embedding_forward") || !rc_ok(t, r2, "embedding_backward") ||
            !rc_ok(t, r3, "embedding_backward (again)")) {
            gu_pool_free(&p);
            return 1;
        }
        gu_note(t, " [N=%d C=%d V=%d]", N, C, V);
        /* a gather: exact */
        fail |= check_tol(t, "fwd", d_out, ref, nc, bf16, 0.0);
        fail |= check(t, "dtable", d_dt, rdt, vc, 0);
        fail |= same_bits("embedding dtable", d_dt, d_dt2, vc * 4);
        gu_pool_free(&p);
    }
    return fail;
}

static int t_embedding_f32(struct tctx *t) { return t_embedding(t, 0); }
static int t_embedding_bf16(struct tctx *t) { return t_embedding(t, 1); }

/* ---- multi-tensor ----------------------------------------------------------------------- */

/* Sizes with chunk-boundary and empty cases; tensor 3 starts one float past an aligned
 * address (the scalar path). */
static const size_t mt_sizes[] = {1, 100003, KCUDA_MT_CHUNK, KCUDA_MT_CHUNK + 1, 0, 7, 300000,
                                  5, 40000};
#define MT_N (int)(sizeof mt_sizes / sizeof mt_sizes[0])

/* One device allocation per tensor, at an offset of (i == 3) floats. */
static float *mt_dev(struct gu_pool *p, const float *h, size_t n, int i)
{
    float *base = NULL;
    size_t off = i == 3 ? 1 : 0;
    if (gu_ck(cudaMalloc((void **)&base, (n + off + 1) * 4), "cudaMalloc"))
        return NULL;
    gu_pd(p, base);
    if (n && gu_ck(cudaMemcpy(base + off, h, n * 4, cudaMemcpyHostToDevice), "upload"))
        return NULL;
    return base + off;
}

static int t_multi_sumsq(struct tctx *t)
{
    struct gu_pool p = {};
    kcuda_tensor_f32 desc[MT_N];
    double ref = 0;
    int fail = 0;
    for (int i = 0; i < MT_N; i++) {
        float *h = gu_ph(&p, gu_rand(&t->rng, mt_sizes[i] ? mt_sizes[i] : 1, -3, 3, 0));
        ref += kcpu_sumsq(h, mt_sizes[i]);
        desc[i].p = mt_dev(&p, h, mt_sizes[i], i);
        desc[i].n = mt_sizes[i];
        if (!desc[i].p) {
            gu_pool_free(&p);
            return 1;
        }
    }
    void *d_desc = NULL, *d_out = gu_pd(&p, gu_poisoned(6, 0)), *d_f = gu_pd(&p, gu_poisoned(2, 0));
    if (!gu_ck(cudaMalloc(&d_desc, sizeof desc), "cudaMalloc"))
        gu_pd(&p, d_desc);
    if (!d_desc || !d_out || !d_f ||
        gu_ck(cudaMemcpy(d_desc, desc, sizeof desc, cudaMemcpyHostToDevice), "upload")) {
        gu_pool_free(&p);
        return 1;
    }
    double *o = (double *)d_out;
    int r1 = kcuda_multi_sumsq_f32(t->k, o, (kcuda_tensor_f32 *)d_desc, MT_N);
    int r2 = kcuda_multi_sumsq_f32(t->k, o + 1, (kcuda_tensor_f32 *)d_desc, MT_N);
    int r3 = kcuda_multi_sumsq_f32(t->k, o + 2, (kcuda_tensor_f32 *)d_desc, 0);
    if (!rc_ok(t, r1, "multi_sumsq") || !rc_ok(t, r2, "multi_sumsq (again)") ||
        !rc_ok(t, r3, "multi_sumsq (empty list)")) {
        gu_pool_free(&p);
        return 1;
    }
    double got[3];
    if (gu_ck(cudaMemcpy(got, d_out, sizeof got, cudaMemcpyDeviceToHost), "download")) {
        gu_pool_free(&p);
        return 1;
    }
    double err = fabs(got[0] - ref) / ref;
    gu_note(t, " sumsq=%.1e", err);
    if (!(err <= TOL_F32)) {
        printf("# sumsq %.17g, reference %.17g (relative %.3e)\n", got[0], ref, err);
        fail = 1;
    }
    if (memcmp(&got[0], &got[1], sizeof(double)) != 0) {
        printf("# sumsq: two runs differ (%.17g, %.17g)\n", got[0], got[1]);
        fail = 1;
    }
    if (got[2] != 0.0) {
        printf("# sumsq of no tensors: %g, want 0\n", got[2]);
        fail = 1;
    }
    /* clip factor on the device: clipping (max below the norm) and not clipping */
    float maxn[2] = {(float)(0.37 * sqrt(got[0])), (float)(2.0 * sqrt(got[0]))};
    float gf[2];
    for (int i = 0; i < 2; i++)
        fail |= !rc_ok(t, kcuda_clip_factor(t->k, (float *)d_f + i, o, maxn[i]), "clip_factor");
    if (gu_ck(cudaMemcpy(gf, d_f, sizeof gf, cudaMemcpyDeviceToHost), "download")) {
        gu_pool_free(&p);
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        float want = kcpu_clip_factor(sqrt(got[0]), maxn[i]);
        if (memcmp(&gf[i], &want, 4) != 0) {
            printf("# clip factor (max %g): %.9g, want %.9g\n", maxn[i], gf[i], want);
            fail = 1;
        }
    }
    gu_note(t, " clip=%.4f,%.1f", gf[0], gf[1]);
    gu_pool_free(&p);
    return fail;
}

static int t_multi_adamw(struct tctx *t)
{
    struct gu_pool p = {};
    kcuda_adamw_tensor desc[MT_N];
    float *hp[MT_N], *hm[MT_N], *hv[MT_N], *dgrad[MT_N];
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, clip = 0.7f;
    int fail = 0;
    for (int i = 0; i < MT_N; i++) {
        size_t n = mt_sizes[i], na = n ? n : 1;
        hp[i] = gu_ph(&p, gu_rand(&t->rng, na, -1, 1, 0));
        hm[i] = gu_ph(&p, gu_rand(&t->rng, na, -0.1f, 0.1f, 0));
        hv[i] = gu_ph(&p, gu_rand(&t->rng, na, 0, 0.01f, 0));
        desc[i].param = mt_dev(&p, hp[i], n, i);
        desc[i].m = mt_dev(&p, hm[i], n, i);
        desc[i].v = mt_dev(&p, hv[i], n, i);
        desc[i].param_bf16 = i == 2 ? NULL : (kcuda_bf16 *)gu_pd(&p, gu_poisoned(na + 1, 1));
        if (i == 3 && desc[i].param_bf16)
            desc[i].param_bf16 += 1; /* misaligned too */
        dgrad[i] = mt_dev(&p, hp[i], n, i); /* overwritten every step */
        desc[i].grad = dgrad[i];
        desc[i].n = n;
        desc[i].decay = i % 2 == 0;
        if (!desc[i].param || !desc[i].m || !desc[i].v || !dgrad[i] ||
            (i != 2 && !desc[i].param_bf16)) {
            gu_pool_free(&p);
            return 1;
        }
    }
    void *d_desc = NULL, *d_clip = gu_pd(&p, gu_upload(&clip, 1, 0));
    if (!gu_ck(cudaMalloc(&d_desc, sizeof desc), "cudaMalloc"))
        gu_pd(&p, d_desc);
    if (!d_desc || !d_clip ||
        gu_ck(cudaMemcpy(d_desc, desc, sizeof desc, cudaMemcpyHostToDevice), "upload")) {
        gu_pool_free(&p);
        return 1;
    }
    for (int step = 1; step <= 3; step++) {
        for (int i = 0; i < MT_N; i++) {
            size_t n = mt_sizes[i];
            float *g = gu_rand(&t->rng, n ? n : 1, -1, 1, 0);
            int bad = n && gu_ck(cudaMemcpy(dgrad[i], g, n * 4, cudaMemcpyHostToDevice), "grad");
            kcpu_scale(g, n, clip);
            kcpu_adamw_update(hp[i], g, hm[i], hv[i], n, lr, b1, b2, eps,
                              desc[i].decay ? wd : 0.0f, step);
            free(g);
            if (bad) {
                gu_pool_free(&p);
                return 1;
            }
        }
        int rc = kcuda_multi_adamw_update(t->k, (kcuda_adamw_tensor *)d_desc, MT_N,
                                          (float *)d_clip, lr, b1, b2, eps, wd, step);
        if (!rc_ok(t, rc, "multi_adamw_update")) {
            gu_pool_free(&p);
            return 1;
        }
    }
    size_t diff = 0, total = 0;
    for (int i = 0; i < MT_N; i++) {
        size_t n = mt_sizes[i];
        if (!n)
            continue;
        char nm[32];
        snprintf(nm, sizeof nm, "p%d", i);
        fail |= check_tol(t, nm, desc[i].param, hp[i], n, 0, TOL_ADAMW);
        fail |= check_tol(t, "m", desc[i].m, hm[i], n, 0, TOL_ADAMW);
        fail |= check_tol(t, "v", desc[i].v, hv[i], n, 0, TOL_ADAMW);
        float *gp = gu_download(desc[i].param, n, 0);
        for (size_t j = 0; gp && j < n; j++)
            diff += memcmp(&gp[j], &hp[i][j], 4) != 0;
        total += n;
        if (desc[i].param_bf16) {
            /* the bf16 copy is exactly the rounding of the fp32 parameters written */
            float *gb = gu_download(desc[i].param_bf16, n, 1);
            size_t mism = 0;
            for (size_t j = 0; gp && gb && j < n; j++)
                mism += gu_to_bf16(gp[j]) != gu_to_bf16(gb[j]) || isnan(gb[j]);
            if (!gp || !gb || mism) {
                printf("# tensor %d: bf16 copy: %zu of %zu elements differ\n", i, mism, n);
                fail = 1;
            }
            free(gb);
        }
        free(gp);
    }
    gu_note(t, " bitwise-diff=%zu/%zu", diff, total);
    int rc = kcuda_multi_adamw_update(t->k, (kcuda_adamw_tensor *)d_desc, MT_N, NULL, lr, b1,
                                      b2, eps, wd, 0);
    if (rc != KCUDA_EARG) {
        printf("# step 0: rc %d, want KCUDA_EARG\n", rc);
        fail = 1;
    }
    gu_pool_free(&p);
    return fail;
}

/* ---- argument checks ---------------------------------------------------------------- */

static int t_bad_args(struct tctx *t)
{
    int fail = 0;
    struct {
        const char *name;
        int rc;
    } c[] = {
        {"layernorm N=0", kcuda_layernorm_forward_f32(t->k, (float *)1, NULL, NULL, (float *)1,
                                                       (float *)1, NULL, 0, 4, 1e-5f)},
        {"rope D=0", kcuda_rope_forward_f32(t->k, (float *)1, (float *)1, (float *)1, 1, 1, 0)},
        {"embedding C=0",
         kcuda_embedding_forward_f32(t->k, (float *)1, (int *)1, (float *)1, 1, 0)},
        {"residual rmsnorm NULL sum",
         kcuda_residual_rmsnorm_forward_bf16(t->k, (bf *)1, NULL, NULL, (bf *)1, (bf *)1,
                                             (bf *)1, 1, 1, 1e-6f)},
        {"multi_sumsq -1 tensors", kcuda_multi_sumsq_f32(t->k, (double *)1, NULL, -1)},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (c[i].rc != KCUDA_EARG) {
            printf("# %s: rc %d, want KCUDA_EARG\n", c[i].name, c[i].rc);
            fail = 1;
        }
    gu_note(t, " last message: %s", kcuda_ctx_errmsg(t->k));
    return fail;
}

/* ---- runner ---------------------------------------------------------------------------- */

static const struct gu_test<struct tctx> tests[] = {
    {"layernorm_f32", t_layernorm_f32},
    {"layernorm_bf16", t_layernorm_bf16},
    {"residual_rmsnorm_bf16", t_residual_rmsnorm},
    {"residual_layernorm_bf16", t_residual_layernorm},
    {"rope_f32", t_rope_f32},
    {"rope_bf16", t_rope_bf16},
    {"gelu_f32", t_gelu_f32},
    {"gelu_bf16", t_gelu_bf16},
    {"embedding_f32", t_embedding_f32},
    {"embedding_bf16", t_embedding_bf16},
    {"multi_sumsq_clip", t_multi_sumsq},
    {"multi_adamw", t_multi_adamw},
    {"bad_args", t_bad_args},
};

int main(void)
{
    static struct tctx t;
    int n = (int)(sizeof tests / sizeof tests[0]);
    return gu_tap_main("gpu elementwise kernels", tests, n, &t);
}
