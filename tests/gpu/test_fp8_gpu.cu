/* test_fp8_gpu.cu - the FP8 GEMM pieces of kcuda (gemm_fp8.cu) against the CPU
 * emulation (kernels/cpu/fp8.c) on fresh random inputs:
 *   quantise  kcuda_fp8_quantise's codes equal kcpu_fp8_encode(x * scale) bit for bit
 *             (both formats, three scales, magnitudes 2^-24..2^20 and the special
 *             values), its transposed copy is the transpose;
 *   gemm      kcuda_matmul_fp8 on those codes against a double product of the decoded
 *             codes (the emulation's values), written and accumulated, E4M3 x E4M3 and
 *             E5M2 x E4M3; tolerance 1e-3 relative L2: Hopper's FP8 tensor cores add
 *             their products with fewer mantissa bits than fp32 between cuBLASLt's
 *             promotions to fp32 (an H100 measured 0.9e-4..1.1e-4), where a wrong scale,
 *             format or layout is off by O(1);
 *   fits      shapes that are not multiples of 16 give KCUDA_ENOALGO, having done nothing.
 * The model-level ops (kdev_fp8_matmul_*, cuda against the cpu device) are in
 * test_kdev_gpu.cu.  Plain TAP; without a CUDA device one skipped test.  HEARTH_SEED=N
 * replays a run. */
extern "C" {
#include "kernels.h"
}
#include "tests/gpu/gpu_tap.h"

#define TOL_FP8 1e-3

struct tctx {
    kcuda_ctx *k;
    uint64_t rng;
    char note[512];
};

/* n inputs with magnitudes 2^-24 .. 2^20, both signs, the special values first. */
static float *wide_inputs(struct tctx *t, size_t n)
{
    static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 448.0f,
                                    449.0f, 464.0f, 57344.0f, 61440.0f, -1e30f, 1e-45f,
                                    0.0078125f, 0.001953125f, 0.0009765625f,
                                    1.52587890625e-05f, 0.0625f, 240.0f, 232.0f};
    float *x = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; x && i < n; i++) {
        float m = ldexpf(gu_uniform(&t->rng, 0.5f, 1.0f), (int)(gu_next(&t->rng) % 45) - 24);
        x[i] = gu_next(&t->rng) & 1 ? -m : m;
    }
    if (x && n >= sizeof special / sizeof special[0])
        memcpy(x, special, sizeof special);
    return x;
}

static uint8_t *bytes_download(struct gu_pool *p, const uint8_t *d, size_t n)
{
    uint8_t *h = gu_ph(p, (uint8_t *)malloc(n ? n : 1));
    if (h && gu_ck(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), "download bytes"))
        return NULL;
    return h;
}

/* Codes (q) and transposed codes (qt) of x [rows, cols] at scale s: 0 = as the cpu. */
static int quantise_case(struct tctx *t, struct gu_pool *p, const float *x, const float *dx,
                         int rows, int cols, float s, int f)
{
    size_t n = (size_t)rows * cols;
    uint8_t *q = NULL, *qt = NULL;
    if (gu_ck(cudaMalloc(&q, n), "cudaMalloc") || gu_ck(cudaMalloc(&qt, n), "cudaMalloc"))
        return 1;
    gu_pd(p, q), gu_pd(p, qt);
    int rc = kcuda_fp8_quantise(t->k, q, qt, dx, rows, cols, s, f);
    if (!gu_rc_ok(t->k, rc, "kcuda_fp8_quantise"))
        return 1;
    const uint8_t *hq = bytes_download(p, q, n), *hqt = bytes_download(p, qt, n);
    if (!hq || !hqt)
        return 1;
    size_t bad = 0, badt = 0, first = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            uint8_t want = kcpu_fp8_encode(x[i] * s, (kfp8_format)f);
            if (hq[i] != want && !bad++)
                first = i;
            badt += hqt[(size_t)c * rows + r] != hq[i];
        }
    if (bad)
        printf("# %s scale %g: %zu codes differ, first x[%zu] = %.9g: gpu 0x%02x cpu 0x%02x\n",
               f ? "e5m2" : "e4m3", s, bad, first, x[first], hq[first],
               kcpu_fp8_encode(x[first] * s, (kfp8_format)f));
    if (badt)
        printf("# %s scale %g: %zu transposed codes differ\n", f ? "e5m2" : "e4m3", s, badt);
    return bad || badt;
}

static int t_quantise(struct tctx *t)
{
    /* 37 x 70: partial 32 x 32 tiles in both directions */
    const int shapes[][2] = {{37, 70}, {64, 96}, {1, 45}};
    const float scales[] = {1.0f, 3.7f, 1.0f / 1024};
    int fail = 0;
    for (int i = 0; i < 3; i++) {
        struct gu_pool p = {};
        int rows = shapes[i][0], cols = shapes[i][1];
        float *x = gu_ph(&p, wide_inputs(t, (size_t)rows * cols));
        void *dx = x ? gu_pd(&p, gu_upload(x, (size_t)rows * cols, 0)) : NULL;
        if (!dx) {
            gu_pool_free(&p);
            return 1;
        }
        for (int f = 0; f < 2; f++)
            for (int s = 0; s < 3; s++)
                fail |= quantise_case(t, &p, x, (const float *)dx, rows, cols, scales[s], f);
        gu_pool_free(&p);
    }
    gu_note(t, " codes=%s", fail ? "DIFF" : "bits");
    return fail;
}

/* out[R, C] = (a . b^T) * sa * sb (+ out0) in double from the cpu's decoding. */
static void gemm_ref(float *out, const uint8_t *a, int fa, const uint8_t *b, int fb, float sa,
                     float sb, int R, int C, int Kd, const float *out0)
{
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int k = 0; k < Kd; k++)
                s += (double)kcpu_fp8_decode(a[(size_t)r * Kd + k], (kfp8_format)fa) *
                     kcpu_fp8_decode(b[(size_t)c * Kd + k], (kfp8_format)fb);
            s = s * sa * sb;
            out[(size_t)r * C + c] = (float)(out0 ? s + out0[(size_t)r * C + c] : s);
        }
}

static int gemm_case(struct tctx *t, int R, int C, int Kd, int fa, int fb)
{
    struct gu_pool p = {};
    size_t na = (size_t)R * Kd, nb = (size_t)C * Kd, no = (size_t)R * C;
    float *ha = gu_ph(&p, gu_rand(&t->rng, na, -2, 2, 0));
    float *hb = gu_ph(&p, gu_rand(&t->rng, nb, -0.1f, 0.1f, 0));
    float *o0 = gu_ph(&p, gu_rand(&t->rng, no, -1, 1, 0));
    float *ref = gu_ph(&p, (float *)malloc(no * sizeof(float)));
    void *da = gu_pd(&p, gu_upload(ha, na, 0)), *db = gu_pd(&p, gu_upload(hb, nb, 0));
    void *dout = gu_pd(&p, gu_poisoned(no, 0)), *dacc = gu_pd(&p, gu_upload(o0, no, 0));
    uint8_t *qa = NULL, *qb = NULL;
    int fail = 1;
    float sa = kcpu_fp8_scale(kcpu_amax(ha, na), (kfp8_format)fa, 0, 1.0f);
    float sb = kcpu_fp8_scale(kcpu_amax(hb, nb), (kfp8_format)fb, 0, 1.0f);
    float alpha = (1.0f / sa) * (1.0f / sb);
    if (!ref || !da || !db || !dout || !dacc || gu_ck(cudaMalloc(&qa, na), "cudaMalloc") ||
        gu_ck(cudaMalloc(&qb, nb), "cudaMalloc"))
        goto out;
    gu_pd(&p, qa), gu_pd(&p, qb);
    if (!gu_rc_ok(t->k, kcuda_fp8_quantise(t->k, qa, NULL, (const float *)da, R, Kd, sa, fa),
                  "quantise a") ||
        !gu_rc_ok(t->k, kcuda_fp8_quantise(t->k, qb, NULL, (const float *)db, C, Kd, sb, fb),
                  "quantise b") ||
        !gu_rc_ok(t->k, kcuda_matmul_fp8(t->k, (float *)dout, qa, fa, qb, fb, alpha, R, C, Kd,
                                         0), "kcuda_matmul_fp8") ||
        !gu_rc_ok(t->k, kcuda_matmul_fp8(t->k, (float *)dacc, qa, fa, qb, fb, alpha, R, C, Kd,
                                         1), "kcuda_matmul_fp8 (accumulate)"))
        goto out;
    {
        const uint8_t *hqa = bytes_download(&p, qa, na), *hqb = bytes_download(&p, qb, nb);
        float *got = gu_ph(&p, gu_download(dout, no, 0));
        float *acc = gu_ph(&p, gu_download(dacc, no, 0));
        if (!hqa || !hqb || !got || !acc)
            goto out;
        gemm_ref(ref, hqa, fa, hqb, fb, 1.0f / sa, 1.0f / sb, R, C, Kd, NULL);
        double e1 = gu_rel_l2(got, ref, no);
        gemm_ref(ref, hqa, fa, hqb, fb, 1.0f / sa, 1.0f / sb, R, C, Kd, o0);
        double e2 = gu_rel_l2(acc, ref, no);
        gu_note(t, " %dx%dx%d/%d%d=%.1e,%.1e", R, C, Kd, fa, fb, e1, e2);
        fail = !(e1 <= TOL_FP8) || !(e2 <= TOL_FP8);
        if (fail)
            printf("# %dx%dx%d formats %d,%d: relative L2 %.3e (written) %.3e (accumulated) "
                   "> %.0e\n", R, C, Kd, fa, fb, e1, e2, TOL_FP8);
    }
out:
    gu_pool_free(&p);
    return fail;
}

static int t_gemm(struct tctx *t)
{
    int fail = gemm_case(t, 64, 48, 256, KCUDA_FP8_E4M3, KCUDA_FP8_E4M3);
    fail |= gemm_case(t, 128, 256, 1024, KCUDA_FP8_E5M2, KCUDA_FP8_E4M3);
    fail |= gemm_case(t, 32, 64, 4096, KCUDA_FP8_E4M3, KCUDA_FP8_E5M2);
    return fail;
}

/* Shapes cuBLASLt's FP8 kernels do not take: KCUDA_ENOALGO, the output untouched. */
static int t_fits(struct tctx *t)
{
    const int shapes[][3] = {{40, 64, 64}, {64, 40, 64}, {64, 64, 40}};
    struct gu_pool p = {};
    uint8_t *q = NULL;
    float *out = (float *)gu_pd(&p, gu_poisoned(64 * 64, 0));
    int fail = !out || gu_ck(cudaMalloc(&q, 64 * 64), "cudaMalloc");
    gu_pd(&p, q);
    for (int i = 0; !fail && i < 3; i++) {
        int rc = kcuda_matmul_fp8(t->k, out, q, KCUDA_FP8_E4M3, q, KCUDA_FP8_E4M3, 1.0f,
                                  shapes[i][0], shapes[i][1], shapes[i][2], 0);
        if (rc != KCUDA_ENOALGO || kcuda_matmul_fp8_fits(out, shapes[i][0], shapes[i][1],
                                                         shapes[i][2])) {
            printf("# %dx%dx%d: returned %d, want KCUDA_ENOALGO\n", shapes[i][0], shapes[i][1],
                   shapes[i][2], rc);
            fail = 1;
        }
    }
    float *h = fail ? NULL : gu_ph(&p, gu_download(out, 64 * 64, 0));
    for (int i = 0; h && i < 64 * 64; i++)
        if (!isnan(h[i])) {
            printf("# the output was written\n");
            fail = 1;
            break;
        }
    gu_pool_free(&p);
    return fail;
}

static const struct gu_test<struct tctx> tests[] = {
    {"fp8_quantise", t_quantise},
    {"fp8_gemm", t_gemm},
    {"fp8_gemm_fits", t_fits},
};

int main(void)
{
    static struct tctx t;
    return gu_tap_main("gpu fp8 gemm", tests, (int)(sizeof tests / sizeof tests[0]), &t);
}
