/* test_kdev_gpu.cu - the cuda device backend (kernels/cuda/kdev_cuda*.cu, loaded from
 * libhearth_cuda.so) against the cpu backend (the fp32 reference) through kdev.h, op by op:
 * every entry of kdev_ops runs on both devices with the same fresh random inputs and the
 * results are compared.  Plain TAP, one line per op family with the errors as a note.
 *
 * Outputs that an op writes start as NaN (all bits set) on both devices, so that an
 * element the GPU fails to write shows; gradients that accumulate (+=) start from the same
 * random values.  Backward ops get the cpu's forward results as inputs on both devices, so
 * that each op is measured alone.
 *
 * Tolerances, max |gpu - cpu| / max |cpu| over the tensor:
 *   TOL_F32  1e-5  fp32 kernels whose sums run in another order or in fp32 where the
 *                  reference uses double (matmul, norms, RoPE, activations, MoE sums,
 *                  the FP8 linear: the same quantised values on both, the GPU's FP8
 *                  GEMM dequantising the sum rather than each operand);
 *   TOL_ATT  1e-4  attention (online softmax, warp-order dot products);
 *   TOL_BF16 3e-2  matmul and attention at precision BF16 (operands rounded to 8 bits of
 *                  mantissa, fp32 accumulation);
 *   TOL_OPT  1e-6  AdamW;
 *   TOL_D    1e-12 double reductions (cross-entropy row sums, sum of squares);
 *   bitwise        rows, copies, zero/fill, add/accumulate/scale, embedding, integer
 *                  outputs (top-k, plan), permutes, unpermute forward, amax, fp8 qdq
 *                  (NaN = NaN: the GPU's NaN payload is canonical).
 * Edge cases: ragged sequences including length 1, GQA (Hq=4, Hkv=2), causal and not,
 * D = 64, 80, 200, 512, ids < 0 (gather, embedding backward), n = 1 rows, MoE E=8 K=2.
 * Activation memory (test_act): at BF16 the ops that take it (kdev.h "act") with that
 * argument in bf16 on the cuda device against the cpu in fp32 (TOL_BF16), and the
 * refusals of the ops that do not.
 * Determinism: attention backward, ce_rowsum and sumsq run twice on the GPU must give the
 * same bits.
 *
 * The backend library is $HEARTH_CUDA_LIB, else build/lib/libhearth_cuda.so beside this
 * program's build directory.  Without a CUDA device it prints one skipped test and exits
 * 0; with a device but no loadable backend it fails.  HEARTH_SEED=N replays a run. */
#include "kdev.h"
#include "tests/gpu/gpu_tap.h"

#include <limits.h>
#include <unistd.h>

#define TOL_F32 1e-5
#define TOL_ATT 1e-4
#define TOL_FP8GEMM 1e-3 /* the FP8 tensor cores' sums (test_fp8_gpu.cu) */
#define TOL_OPT 1e-6
#define TOL_D 1e-12
#define TOL_BF16 3e-2

#define MAXBUF 512

/* A buffer on both devices: p[0] on the cpu, p[1] on the cuda device. */
struct dp {
    void *p[2];
    size_t bytes;
};

struct tctx {
    kdev *d[2];
    uint64_t rng;
    char note[1024];
    int bad;                 /* failed calls of the current test */
    struct dp bufs[MAXBUF];  /* released after each test */
    int nbufs;
    void *host[MAXBUF];      /* freed after each test */
    int nhost;
    double tol;              /* > 0: the tolerance of matmul and attention checks (the
                                bf16 precision case), else their fp32 ones */
};

static const char *DEVNAME[2] = {"cpu", "cuda"};

#define FP(b, k) ((float *)(b).p[k])
#define IP(b, k) ((int *)(b).p[k])
#define DBP(b, k) ((double *)(b).p[k])
/* A kdev call on device k of t; a failure is printed and counted. */
#define CK(call) ck(t, k, (call), #call)

static void ck(struct tctx *t, int k, int rc, const char *what)
{
    if (rc == 0)
        return;
    printf("# %s: %.70s returned %d: %s\n", DEVNAME[k], what, rc, kdev_errmsg(t->d[k]));
    t->bad++;
}

static void *hkeep(struct tctx *t, void *p)
{
    if (p && t->nhost < MAXBUF)
        t->host[t->nhost++] = p;
    else if (p) { /* the pool is full: a leak in a test beats a crash */
        printf("# host pool full\n");
    }
    return p;
}

static void t_reset(struct tctx *t)
{
    for (int i = 0; i < t->nbufs; i++)
        for (int k = 0; k < 2; k++)
            kdev_release(t->d[k], t->bufs[i].p[k]);
    for (int i = 0; i < t->nhost; i++)
        free(t->host[i]);
    t->nbufs = t->nhost = 0;
    t->bad = 0;
    for (int k = 0; k < 2; k++)
        kdev_status_clear(t->d[k]);
}

/* A buffer of `bytes` on both devices holding host's bytes (zeros when host is NULL). */
static struct dp dp_make(struct tctx *t, const void *host, size_t bytes)
{
    struct dp b = {{NULL, NULL}, bytes};
    for (int k = 0; k < 2; k++) {
        CK(kdev_alloc(t->d[k], &b.p[k], bytes));
        if (host && b.p[k])
            CK(kdev_upload(t->d[k], b.p[k], host, bytes));
    }
    if (t->nbufs < MAXBUF)
        t->bufs[t->nbufs++] = b;
    else
        t->bad++;
    return b;
}

/* Both devices' buffer set from host again (inputs of a second call). */
static void dp_set(struct tctx *t, struct dp b, const void *host)
{
    for (int k = 0; k < 2; k++)
        CK(kdev_upload(t->d[k], b.p[k], host, b.bytes));
}

static float *hrand(struct tctx *t, size_t n, float lo, float hi)
{
    float *h = (float *)hkeep(t, malloc((n ? n : 1) * sizeof(float)));
    for (size_t i = 0; i < n; i++)
        h[i] = gu_uniform(&t->rng, lo, hi);
    return h;
}

static struct dp dp_rand(struct tctx *t, size_t n, float lo, float hi)
{
    return dp_make(t, hrand(t, n, lo, hi), n * sizeof(float));
}

/* n floats of NaN (all bits set) on both devices: an output. */
static struct dp dp_nan(struct tctx *t, size_t n)
{
    void *h = hkeep(t, malloc(n ? n * sizeof(float) : 1));
    memset(h, 0xff, n * sizeof(float));
    return dp_make(t, h, n * sizeof(float));
}

static struct dp dp_ints(struct tctx *t, const int *h, size_t n)
{
    return dp_make(t, h, n * sizeof(int));
}

/* Host copy of device k's side of b (freed with the test); NULL on failure. */
static void *dl(struct tctx *t, int k, struct dp b)
{
    void *h = hkeep(t, malloc(b.bytes ? b.bytes : 1));
    if (kdev_download(t->d[k], h, b.p[k], b.bytes)) {
        printf("# %s: download: %s\n", DEVNAME[k], kdev_errmsg(t->d[k]));
        return NULL;
    }
    return h;
}

/* ---- comparisons: 0 = pass ------------------------------------------------------------- */

static int judge(struct tctx *t, const char *what, double err, double tol)
{
    gu_note(t, " %s=%.1e", what, err);
    if (!(err <= tol)) {
        printf("# %s: max relative error %.3e > %.0e\n", what, err, tol);
        return 1;
    }
    return 0;
}

/* max |g - c| / max |c| over n floats; NaN must match NaN. */
static double rel_err(const float *c, const float *g, size_t n)
{
    double ref = 0, err = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(c[i]) || isnan(g[i])) {
            if (isnan(c[i]) != isnan(g[i]))
                return INFINITY;
            continue;
        }
        double a = fabs((double)c[i]), e = fabs((double)g[i] - c[i]);
        ref = a > ref ? a : ref;
        err = e > err ? e : err;
    }
    return ref > 0 ? err / ref : err;
}

static int cmp_tol(struct tctx *t, const char *what, struct dp b, size_t n, double tol)
{
    const float *c = (const float *)dl(t, 0, b), *g = (const float *)dl(t, 1, b);
    if (!c || !g)
        return 1;
    return judge(t, what, rel_err(c, g, n), tol);
}

static int cmp_tol_d(struct tctx *t, const char *what, struct dp b, size_t n, double tol)
{
    const double *c = (const double *)dl(t, 0, b), *g = (const double *)dl(t, 1, b);
    if (!c || !g)
        return 1;
    double ref = 0, err = 0;
    for (size_t i = 0; i < n; i++) {
        double a = fabs(c[i]), e = fabs(g[i] - c[i]);
        if (isnan(c[i]) != isnan(g[i]))
            e = INFINITY;
        ref = a > ref ? a : ref;
        err = e > err ? e : err;
    }
    return judge(t, what, ref > 0 ? err / ref : err, tol);
}

/* The same bytes on both devices (bitwise); nan_eq: float NaNs compare equal whatever
 * their payload. */
static int cmp_bits_ex(struct tctx *t, const char *what, struct dp b, int nan_eq)
{
    const unsigned char *c = (const unsigned char *)dl(t, 0, b);
    const unsigned char *g = (const unsigned char *)dl(t, 1, b);
    if (!c || !g)
        return 1;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i + 4 <= b.bytes || i < b.bytes; i += 4) {
        size_t w = b.bytes - i < 4 ? b.bytes - i : 4;
        if (memcmp(c + i, g + i, w) == 0)
            continue;
        if (nan_eq && w == 4) {
            float x, y;
            memcpy(&x, c + i, 4);
            memcpy(&y, g + i, 4);
            if (isnan(x) && isnan(y))
                continue;
        }
        if (!bad++)
            first = i / 4;
    }
    gu_note(t, " %s=%s", what, bad ? "DIFF" : "bits");
    if (bad) {
        float x, y;
        int xi, yi;
        memcpy(&x, c + first * 4, 4);
        memcpy(&y, g + first * 4, 4);
        memcpy(&xi, c + first * 4, 4);
        memcpy(&yi, g + first * 4, 4);
        printf("# %s: %zu words differ, first [%zu]: cpu %.9g (%d) cuda %.9g (%d)\n", what, bad,
               first, x, xi, y, yi);
    }
    return bad != 0;
}

static int cmp_bits(struct tctx *t, const char *what, struct dp b)
{
    return cmp_bits_ex(t, what, b, 0);
}

/* The cuda sides of a and b hold the same bytes (two runs on the GPU). */
static int same_gpu(struct tctx *t, const char *what, struct dp a, struct dp b)
{
    const void *x = dl(t, 1, a), *y = dl(t, 1, b);
    if (!x || !y)
        return 1;
    int diff = memcmp(x, y, a.bytes) != 0;
    gu_note(t, " %s=%s", what, diff ? "DIFF" : "same");
    if (diff)
        printf("# %s: two GPU runs on the same inputs differ\n", what);
    return diff;
}

/* ---- memory ------------------------------------------------------------------------------ */

static int test_memory(struct tctx *t)
{
    int f = 0;
    size_t p0[2], c0[2];
    for (int k = 0; k < 2; k++)
        kdev_mem_stats(t->d[k], &p0[k], &c0[k]);
    /* fresh memory is zeroed; zero-byte blocks are valid and distinct */
    struct dp z = dp_make(t, NULL, 4000), e1 = dp_make(t, NULL, 0), e2 = dp_make(t, NULL, 0);
    if (t->bad)
        return 1;
    const unsigned char *zh = (const unsigned char *)dl(t, 1, z);
    for (size_t i = 0; zh && i < z.bytes; i++)
        if (zh[i]) {
            printf("# alloc: byte %zu not zero\n", i);
            f++;
            break;
        }
    if (!e1.p[1] || !e2.p[1] || e1.p[1] == e2.p[1]) {
        printf("# alloc(0): pointers %p %p not valid and distinct\n", e1.p[1], e2.p[1]);
        f++;
    }
    for (int k = 0; k < 2; k++) {
        size_t pk, ck_;
        kdev_mem_stats(t->d[k], &pk, &ck_);
        if (ck_ != c0[k] + 4000 || pk < ck_) {
            printf("# %s mem_stats after alloc: current %zu (want %zu) peak %zu\n", DEVNAME[k],
                   ck_, c0[k] + 4000, pk);
            f++;
        }
    }
    /* a 1 MiB block raises the peak; releasing it lowers current but not the peak */
    for (int k = 0; k < 2; k++) {
        void *big = NULL;
        size_t pa, ca, pb, cb;
        CK(kdev_alloc(t->d[k], &big, 1u << 20));
        kdev_mem_stats(t->d[k], &pa, &ca);
        kdev_release(t->d[k], big);
        kdev_mem_stats(t->d[k], &pb, &cb);
        if (ca != c0[k] + 4000 + (1u << 20) || pa < ca || cb != c0[k] + 4000 || pb != pa) {
            printf("# %s mem_stats: after alloc %zu/%zu, after release %zu/%zu "
                   "(current/peak)\n", DEVNAME[k], ca, pa, cb, pb);
            f++;
        }
    }
    gu_note(t, " mem_stats=%s", f ? "BAD" : "ok");
    /* what the device counts is what the GPU gives: 256 MiB through kdev_alloc take at
     * least that much of cudaMemGetInfo's free memory (allocator granularity may add) */
    {
        size_t free0, free1, total, want = (size_t)256 << 20, pk0, pk1;
        int k = 1;
        void *big = NULL;
        kdev_mem_stats(t->d[1], &pk0, NULL);
        cudaDeviceSynchronize();
        cudaMemGetInfo(&free0, &total);
        CK(kdev_alloc(t->d[k], &big, want));
        CK(kdev_sync(t->d[k]));
        cudaMemGetInfo(&free1, &total);
        kdev_mem_stats(t->d[1], &pk1, NULL);
        kdev_release(t->d[1], big);
        size_t taken = free0 > free1 ? free0 - free1 : 0;
        int ok = taken >= want && taken < want + ((size_t)64 << 20) && pk1 >= want;
        gu_note(t, " memgetinfo=%s(%zu MiB taken, peak %zu MiB)", ok ? "ok" : "BAD",
                taken >> 20, pk1 >> 20);
        f += !ok;
    }

    /* upload/download round trip, copy, copy_2d, zero, fill */
    size_t n = 1000;
    float *hsrc = hrand(t, n, -3, 3);
    struct dp src = dp_make(t, hsrc, n * 4), cp = dp_nan(t, n), two = dp_nan(t, 5 * 16);
    struct dp one = dp_nan(t, 8), zf = dp_rand(t, n, -1, 1), three = dp_nan(t, 5 * 16);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_copy(d, cp.p[k], src.p[k], n * sizeof(float)));
        /* 5 rows of 24 bytes: from rows 40 bytes apart to rows 64 bytes apart */
        CK(kdev_copy_2d(d, two.p[k], 64, src.p[k], 40, 24, 5));
        /* 16-byte rows and pitches (the cuda backend's own kernel) */
        CK(kdev_copy_2d(d, three.p[k], 64, src.p[k], 48, 32, 5));
        /* one row: pitches smaller than the width are fine */
        CK(kdev_copy_2d(d, one.p[k], 4, FP(src, k) + 3, 4, 32, 1));
        CK(kdev_zero(d, FP(zf, k) + 100, 300 * sizeof(float)));
        CK(kdev_fill(d, FP(zf, k) + 500, 333, -2.5f));
        CK(kdev_sync(d));
    }
    const void *back = dl(t, 1, src);
    if (!back || memcmp(back, hsrc, n * sizeof(float)) != 0) {
        printf("# upload/download round trip differs\n");
        f++;
    }
    f += cmp_bits(t, "copy", cp);
    f += cmp_bits(t, "copy_2d", two);
    f += cmp_bits(t, "copy_2d_16", three);
    f += cmp_bits(t, "copy_2d_1row", one);
    f += cmp_bits(t, "zero_fill", zf);
    const char *hw = kdev_hw_name(t->d[1]);
    gu_note(t, " hw=\"%s\"", hw);
    if (strcmp(kdev_name(t->d[1]), "cuda") != 0 || !hw || !*hw) {
        printf("# name %s, hw_name \"%s\"\n", kdev_name(t->d[1]), hw ? hw : "(null)");
        f++;
    }
    return f + t->bad;
}

/* ---- rows and elementwise ---------------------------------------------------------------- */

static int rows_case(struct tctx *t, const char *tag, int n, int C, int rows_src)
{
    char w[64];
    int f = 0;
    int *idx = (int *)hkeep(t, malloc(n * sizeof(int)));
    for (int r = 0; r < n; r++) /* repeats and negatives */
        idx[r] = gu_next(&t->rng) % 5 == 0 ? -1 : (int)(gu_next(&t->rng) % rows_src);
    /* scatter targets: distinct rows of dst (a shuffled prefix), some -1 */
    int *perm = (int *)hkeep(t, malloc(rows_src * sizeof(int)));
    for (int i = 0; i < rows_src; i++)
        perm[i] = i;
    for (int i = rows_src - 1; i > 0; i--) {
        int j = (int)(gu_next(&t->rng) % (i + 1)), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    int *sidx = (int *)hkeep(t, malloc(n * sizeof(int)));
    for (int r = 0; r < n; r++)
        sidx[r] = r < rows_src && gu_next(&t->rng) % 4 ? perm[r] : -1;
    struct dp src = dp_rand(t, (size_t)rows_src * C, -2, 2), I = dp_ints(t, idx, n);
    struct dp SI = dp_ints(t, sidx, n), g = dp_nan(t, (size_t)n * C);
    struct dp sc = dp_rand(t, (size_t)rows_src * C, -2, 2), rs = dp_rand(t, (size_t)n * C, -2, 2);
    struct dp x = dp_rand(t, (size_t)n * C, -2, 2), bias = dp_rand(t, C, -1, 1);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        CK(kdev_gather_rows(t->d[k], FP(g, k), FP(src, k), IP(I, k), n, C));
        CK(kdev_scatter_rows(t->d[k], FP(sc, k), FP(rs, k), IP(SI, k), n, C));
        CK(kdev_add_bias(t->d[k], FP(x, k), FP(bias, k), n, C));
    }
    snprintf(w, sizeof w, "%s.gather", tag);
    f += cmp_bits(t, w, g);
    snprintf(w, sizeof w, "%s.scatter", tag);
    f += cmp_bits(t, w, sc);
    snprintf(w, sizeof w, "%s.bias", tag);
    f += cmp_bits(t, w, x);
    return f;
}

static int test_rows(struct tctx *t)
{
    int f = rows_case(t, "n37", 37, 70, 50);
    f += rows_case(t, "n1", 1, 5, 3);
    return f + t->bad;
}

static int test_elementwise(struct tctx *t)
{
    size_t n = 100003;
    struct dp a = dp_rand(t, n, -4, 4), b = dp_rand(t, n, -4, 4), o = dp_nan(t, n);
    struct dp acc = dp_rand(t, n, -4, 4), s = dp_rand(t, n, -4, 4), al = dp_rand(t, n, -4, 4);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_add(d, FP(o, k), FP(a, k), FP(b, k), n));
        CK(kdev_add(d, FP(al, k), FP(al, k), FP(b, k), n)); /* out aliases a */
        CK(kdev_accumulate(d, FP(acc, k), FP(a, k), n));
        CK(kdev_scale(d, FP(s, k), n, -0.37f));
    }
    int f = cmp_bits(t, "add", o) + cmp_bits(t, "add_alias", al);
    f += cmp_bits(t, "accumulate", acc) + cmp_bits(t, "scale", s);
    return f + t->bad;
}

/* ---- matmul -------------------------------------------------------------------------------- */

static int mm_case(struct tctx *t, const char *tag, int M, int K, int N)
{
    char w[64];
    int f = 0;
    struct dp inp = dp_rand(t, (size_t)M * K, -1, 1), wt = dp_rand(t, (size_t)N * K, -1, 1);
    struct dp bias = dp_rand(t, N, -1, 1), o1 = dp_nan(t, (size_t)M * N), o2 = dp_nan(t, (size_t)M * N);
    struct dp dout = dp_rand(t, (size_t)M * N, -1, 1);
    float *hdi = hrand(t, (size_t)M * K, -1, 1), *hdw = hrand(t, (size_t)N * K, -1, 1);
    float *hdb = hrand(t, N, -1, 1);
    struct dp di = dp_make(t, hdi, (size_t)M * K * 4), dw = dp_make(t, hdw, (size_t)N * K * 4);
    struct dp db = dp_make(t, hdb, (size_t)N * 4);
    struct dp di1 = dp_make(t, hdi, (size_t)M * K * 4), dw1 = dp_make(t, hdw, (size_t)N * K * 4);
    struct dp db1 = dp_make(t, hdb, (size_t)N * 4);
    /* the _set form writes dinp: NaN there must not survive; dw still accumulates */
    struct dp dis = dp_nan(t, (size_t)M * K), dws = dp_make(t, hdw, (size_t)N * K * 4);
    /* the residual forward: res + the product (+ bias) */
    struct dp res = dp_rand(t, (size_t)M * N, -1, 1), o3 = dp_nan(t, (size_t)M * N);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_matmul_forward_residual(d, FP(o3, k), FP(res, k), FP(inp, k), FP(wt, k),
                                        FP(bias, k), M, K, N));
        CK(kdev_matmul_backward_set(d, FP(dis, k), FP(dws, k), NULL, FP(dout, k), FP(inp, k),
                                    FP(wt, k), M, K, N));
        CK(kdev_matmul_forward(d, FP(o1, k), FP(inp, k), FP(wt, k), FP(bias, k), M, K, N));
        CK(kdev_matmul_forward(d, FP(o2, k), FP(inp, k), FP(wt, k), NULL, M, K, N));
        CK(kdev_matmul_backward(d, FP(di, k), FP(dw, k), FP(db, k), FP(dout, k), FP(inp, k),
                                FP(wt, k), M, K, N));
        /* one gradient at a time */
        CK(kdev_matmul_backward(d, FP(di1, k), NULL, NULL, FP(dout, k), FP(inp, k), FP(wt, k),
                                M, K, N));
        CK(kdev_matmul_backward(d, NULL, FP(dw1, k), NULL, FP(dout, k), FP(inp, k), FP(wt, k),
                                M, K, N));
        CK(kdev_matmul_backward(d, NULL, NULL, FP(db1, k), FP(dout, k), FP(inp, k), FP(wt, k),
                                M, K, N));
    }
    struct {
        const char *n;
        struct dp b;
        size_t len;
    } chk[] = {{"out", o1, (size_t)M * N}, {"out_nb", o2, (size_t)M * N},
               {"out_res", o3, (size_t)M * N},
               {"dinp", di, (size_t)M * K}, {"dw", dw, (size_t)N * K}, {"db", db, (size_t)N},
               {"dinp1", di1, (size_t)M * K}, {"dw1", dw1, (size_t)N * K}, {"db1", db1, (size_t)N},
               {"dinp_set", dis, (size_t)M * K}, {"dw_set", dws, (size_t)N * K}};
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++) {
        snprintf(w, sizeof w, "%s.%s", tag, chk[i].n);
        f += cmp_tol(t, w, chk[i].b, chk[i].len, t->tol > 0 ? t->tol : TOL_F32);
    }
    return f;
}

static int test_matmul(struct tctx *t)
{
    int f = mm_case(t, "37x67x53", 37, 67, 53);
    f += mm_case(t, "M1", 1, 40, 24);
    /* rows of 16-byte multiples: the residual in the bf16 GEMM's epilogue */
    f += mm_case(t, "64x64x96", 64, 64, 96);
    return f + t->bad;
}

/* ---- embedding ------------------------------------------------------------------------------ */

static int test_embedding(struct tctx *t)
{
    int f = 0, V = 23, C = 70;
    int Ns[2] = {41, 1};
    for (int c = 0; c < 2; c++) {
        int N = Ns[c];
        int *ids = (int *)hkeep(t, malloc(N * sizeof(int)));
        int *nid = (int *)hkeep(t, malloc(N * sizeof(int)));
        for (int i = 0; i < N; i++) {
            ids[i] = (int)(gu_next(&t->rng) % V); /* repeats */
            nid[i] = gu_next(&t->rng) % 4 == 0 ? -1 - (int)(gu_next(&t->rng) % 3) : ids[i];
        }
        struct dp I = dp_ints(t, ids, N), NI = dp_ints(t, nid, N);
        struct dp table = dp_rand(t, (size_t)V * C, -1, 1), out = dp_nan(t, (size_t)N * C);
        struct dp dout = dp_rand(t, (size_t)N * C, -1, 1), dt = dp_rand(t, (size_t)V * C, -1, 1);
        if (t->bad)
            return 1;
        for (int k = 0; k < 2; k++) {
            CK(kdev_embedding_forward(t->d[k], FP(out, k), IP(I, k), FP(table, k), N, C));
            CK(kdev_embedding_backward(t->d[k], FP(dt, k), FP(dout, k), IP(NI, k), N, C));
        }
        f += cmp_bits(t, c ? "n1.fwd" : "fwd", out);
        f += cmp_bits(t, c ? "n1.bwd" : "bwd_neg_ids", dt);
    }
    return f + t->bad;
}

/* ---- norms ------------------------------------------------------------------------------------ */

static int norm_case(struct tctx *t, const char *tag, int N, int C, int bias)
{
    char w[64];
    int f = 0;
    float eps = 1e-5f;
    struct dp x = dp_rand(t, (size_t)N * C, -2, 2), wt = dp_rand(t, C, 0.5f, 1.5f);
    struct dp b = dp_rand(t, C, -1, 1), o = dp_nan(t, (size_t)N * C), rstd = dp_nan(t, N);
    struct dp o2 = dp_nan(t, (size_t)N * C), mean = dp_nan(t, N), rstd2 = dp_nan(t, N);
    struct dp dout = dp_rand(t, (size_t)N * C, -1, 1), dx = dp_rand(t, (size_t)N * C, -1, 1);
    struct dp dw = dp_rand(t, C, -1, 1), dx2 = dp_rand(t, (size_t)N * C, -1, 1);
    struct dp dw2 = dp_rand(t, C, -1, 1), db2 = dp_rand(t, C, -1, 1);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_rmsnorm_forward(d, FP(o, k), FP(rstd, k), FP(x, k), FP(wt, k), N, C, eps));
        CK(kdev_layernorm_forward(d, FP(o2, k), FP(mean, k), FP(rstd2, k), FP(x, k), FP(wt, k),
                                  bias ? FP(b, k) : NULL, N, C, eps));
    }
    /* the backward reads the cpu's statistics on both devices */
    float *hr = (float *)dl(t, 0, rstd), *hm = (float *)dl(t, 0, mean);
    float *hr2 = (float *)dl(t, 0, rstd2);
    if (!hr || !hm || !hr2)
        return 1;
    struct dp R = dp_make(t, hr, N * 4), M = dp_make(t, hm, N * 4), R2 = dp_make(t, hr2, N * 4);
    for (int k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_rmsnorm_backward(d, FP(dx, k), FP(dw, k), FP(dout, k), FP(x, k), FP(wt, k),
                                 FP(R, k), N, C));
        CK(kdev_layernorm_backward(d, FP(dx2, k), FP(dw2, k), bias ? FP(db2, k) : NULL,
                                   FP(dout, k), FP(x, k), FP(wt, k), FP(M, k), FP(R2, k), N, C));
    }
    struct {
        const char *n;
        struct dp b;
        size_t len;
    } chk[] = {{"rms", o, (size_t)N * C}, {"rstd", rstd, (size_t)N}, {"rms.dx", dx, (size_t)N * C},
               {"rms.dw", dw, (size_t)C}, {"ln", o2, (size_t)N * C}, {"mean", mean, (size_t)N},
               {"ln.rstd", rstd2, (size_t)N}, {"ln.dx", dx2, (size_t)N * C},
               {"ln.dw", dw2, (size_t)C}, {"ln.db", db2, (size_t)C}};
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++) {
        snprintf(w, sizeof w, "%s.%s", tag, chk[i].n);
        f += cmp_tol(t, w, chk[i].b, chk[i].len, t->tol > 0 ? t->tol : TOL_F32);
    }
    return f;
}

static int test_norms(struct tctx *t)
{
    int f = norm_case(t, "37x300", 37, 300, 1);
    f += norm_case(t, "n1", 1, 77, 0);
    return f + t->bad;
}

/* ---- RoPE and activations -------------------------------------------------------------------- */

static int test_rope(struct tctx *t)
{
    int f = 0, N = 13, H = 3;
    int Ds[3] = {64, 80, 7};
    for (int c = 0; c < 3; c++) {
        int D = Ds[c], half = D / 2;
        char w[32];
        int *pos = (int *)hkeep(t, malloc(N * sizeof(int)));
        for (int i = 0; i < N; i++)
            pos[i] = (int)(gu_next(&t->rng) % 4096);
        float *hc = (float *)hkeep(t, malloc((size_t)N * (half ? half : 1) * 4));
        float *hsn = (float *)hkeep(t, malloc((size_t)N * (half ? half : 1) * 4));
        kcpu_rope_table_1d(hc, hsn, pos, N, D, 10000.0f);
        struct dp cs = dp_make(t, hc, (size_t)N * half * 4), sn = dp_make(t, hsn, (size_t)N * half * 4);
        struct dp x = dp_rand(t, (size_t)N * H * D, -2, 2), g = dp_rand(t, (size_t)N * H * D, -2, 2);
        if (t->bad)
            return 1;
        for (int k = 0; k < 2; k++) {
            CK(kdev_rope_forward(t->d[k], FP(x, k), FP(cs, k), FP(sn, k), N, H, D));
            CK(kdev_rope_backward(t->d[k], FP(g, k), FP(cs, k), FP(sn, k), N, H, D));
        }
        snprintf(w, sizeof w, "D%d.fwd", D);
        f += cmp_tol(t, w, x, (size_t)N * H * D, TOL_F32);
        snprintf(w, sizeof w, "D%d.bwd", D);
        f += cmp_tol(t, w, g, (size_t)N * H * D, TOL_F32);
    }
    return f + t->bad;
}

static int test_activations(struct tctx *t)
{
    int f = 0, N = 29, F = 130;
    size_t n = 40001;
    struct dp in = dp_rand(t, (size_t)N * 2 * F, -4, 4), o = dp_nan(t, (size_t)N * F);
    struct dp dout = dp_rand(t, (size_t)N * F, -1, 1), din = dp_rand(t, (size_t)N * 2 * F, -1, 1);
    struct dp gx = dp_rand(t, n, -6, 6), go[2] = {dp_nan(t, n), dp_nan(t, n)};
    struct dp gd = dp_rand(t, n, -1, 1), gdi[2] = {dp_rand(t, n, -1, 1), dp_rand(t, n, -1, 1)};
    /* the _set forms write dinp: NaN there must not survive */
    struct dp dins = dp_nan(t, (size_t)N * 2 * F), gds = dp_nan(t, n);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_swiglu_forward(d, FP(o, k), FP(in, k), N, F));
        CK(kdev_swiglu_backward(d, FP(din, k), FP(dout, k), FP(in, k), N, F));
        CK(kdev_swiglu_backward_set(d, FP(dins, k), FP(dout, k), FP(in, k), N, F));
        CK(kdev_gelu_backward_set(d, FP(gds, k), FP(gd, k), FP(gx, k), n, KGELU_TANH));
        for (int g = 0; g < 2; g++) {
            CK(kdev_gelu_forward(d, FP(go[g], k), FP(gx, k), n, (kgelu_kind)g));
            CK(kdev_gelu_backward(d, FP(gdi[g], k), FP(gd, k), FP(gx, k), n, (kgelu_kind)g));
        }
    }
    f += cmp_tol(t, "swiglu", o, (size_t)N * F, TOL_F32);
    f += cmp_tol(t, "swiglu.d", din, (size_t)N * 2 * F, TOL_F32);
    f += cmp_tol(t, "gelu_tanh", go[0], n, TOL_F32) + cmp_tol(t, "gelu_erf", go[1], n, TOL_F32);
    f += cmp_tol(t, "gelu_tanh.d", gdi[0], n, TOL_F32);
    f += cmp_tol(t, "gelu_erf.d", gdi[1], n, TOL_F32);
    f += cmp_tol(t, "swiglu.dset", dins, (size_t)N * 2 * F, TOL_F32);
    f += cmp_tol(t, "gelu_tanh.dset", gds, n, TOL_F32);
    return f + t->bad;
}

/* ---- attention ----------------------------------------------------------------------------- */

struct att_io {
    struct dp q, k, v, cu, out, lse, dout, dq, dk, dv;
    int N, maxlen;
};

/* Inputs for sequences of the given lengths; out/lse NaN, gradients random. */
static struct att_io att_inputs(struct tctx *t, const int *lens, int nseq, int Hq, int Hkv, int D)
{
    struct att_io a;
    int *cu = (int *)hkeep(t, malloc((nseq + 1) * sizeof(int)));
    cu[0] = 0;
    a.maxlen = 0;
    for (int s = 0; s < nseq; s++) {
        cu[s + 1] = cu[s] + lens[s];
        a.maxlen = lens[s] > a.maxlen ? lens[s] : a.maxlen;
    }
    a.N = cu[nseq];
    size_t nq = (size_t)a.N * Hq * D, nk = (size_t)a.N * Hkv * D;
    a.q = dp_rand(t, nq, -1, 1);
    a.k = dp_rand(t, nk, -1, 1);
    a.v = dp_rand(t, nk, -1, 1);
    a.cu = dp_ints(t, cu, nseq + 1);
    a.out = dp_nan(t, nq);
    a.lse = dp_nan(t, (size_t)a.N * Hq);
    a.dout = dp_rand(t, nq, -1, 1);
    a.dq = dp_rand(t, nq, -1, 1);
    a.dk = dp_rand(t, nk, -1, 1);
    a.dv = dp_rand(t, nk, -1, 1);
    return a;
}

static int att_case(struct tctx *t, const char *tag, const int *lens, int nseq, int Hq, int Hkv,
                    int D, int causal, int with_dq)
{
    char w[64];
    int f = 0;
    struct att_io a = att_inputs(t, lens, nseq, Hq, Hkv, D);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++)
        CK(kdev_attention_forward(t->d[k], FP(a.out, k), FP(a.lse, k), FP(a.q, k), FP(a.k, k),
                                  FP(a.v, k), IP(a.cu, k), nseq, a.maxlen, a.N, Hq, Hkv, D, causal));
    size_t nq = (size_t)a.N * Hq * D, nk = (size_t)a.N * Hkv * D;
    snprintf(w, sizeof w, "%s.out", tag);
    f += cmp_tol(t, w, a.out, nq, t->tol > 0 ? t->tol : TOL_ATT);
    snprintf(w, sizeof w, "%s.lse", tag);
    f += cmp_tol(t, w, a.lse, (size_t)a.N * Hq, t->tol > 0 ? t->tol : TOL_ATT);
    /* the backward of both reads the cpu's out and lse */
    void *ho = dl(t, 0, a.out), *hl = dl(t, 0, a.lse);
    if (!ho || !hl)
        return 1;
    dp_set(t, a.out, ho);
    dp_set(t, a.lse, hl);
    for (int k = 0; k < 2; k++)
        CK(kdev_attention_backward(t->d[k], with_dq ? FP(a.dq, k) : NULL, FP(a.dk, k),
                                   FP(a.dv, k), FP(a.dout, k), FP(a.q, k), FP(a.k, k),
                                   FP(a.v, k), FP(a.out, k), FP(a.lse, k), IP(a.cu, k), nseq,
                                   a.maxlen, a.N, Hq, Hkv, D, causal));
    if (with_dq) {
        snprintf(w, sizeof w, "%s.dq", tag);
        f += cmp_tol(t, w, a.dq, nq, t->tol > 0 ? t->tol : TOL_ATT);
    }
    snprintf(w, sizeof w, "%s.dk", tag);
    f += cmp_tol(t, w, a.dk, nk, t->tol > 0 ? t->tol : TOL_ATT);
    snprintf(w, sizeof w, "%s.dv", tag);
    f += cmp_tol(t, w, a.dv, nk, t->tol > 0 ? t->tol : TOL_ATT);
    /* the _set form writes the gradients: NaN there must not survive */
    struct dp sq = dp_nan(t, nq), sk = dp_nan(t, nk), sv = dp_nan(t, nk);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++)
        CK(kdev_attention_backward_set(t->d[k], with_dq ? FP(sq, k) : NULL, FP(sk, k),
                                       FP(sv, k), FP(a.dout, k), FP(a.q, k), FP(a.k, k),
                                       FP(a.v, k), FP(a.out, k), FP(a.lse, k), IP(a.cu, k),
                                       nseq, a.maxlen, a.N, Hq, Hkv, D, causal));
    struct { const char *n; struct dp b; size_t len; } set[] = {
        {"dq_set", sq, nq}, {"dk_set", sk, nk}, {"dv_set", sv, nk}};
    for (int i = with_dq ? 0 : 1; i < 3; i++) {
        snprintf(w, sizeof w, "%s.%s", tag, set[i].n);
        f += cmp_tol(t, w, set[i].b, set[i].len, t->tol > 0 ? t->tol : TOL_ATT);
    }
    return f;
}

static int ld_case(struct tctx *t, const char *tag, const int *lens, int nseq, int Hq,
                   int Hkv, int D, int act);

static int test_attention(struct tctx *t)
{
    static const int lens[4] = {1, 17, 69, 130}, lens2[2] = {5, 33}, lens3[2] = {3, 40};
    int f = att_case(t, "c64", lens, 4, 4, 2, 64, 1, 1);
    f += att_case(t, "n80", lens, 4, 4, 2, 80, 0, 1);
    f += att_case(t, "c80", lens, 4, 4, 2, 80, 1, 0); /* dq not wanted */
    f += att_case(t, "c200", lens2, 2, 2, 1, 200, 1, 1);
    f += att_case(t, "n512", lens3, 2, 2, 2, 512, 0, 1);
    f += ld_case(t, "ld.c64", lens, 4, 4, 2, 64, 0);
    return f + t->bad;
}

/* The fused LM head (kdev_head_ce_*): forward losses and lse, backward dinp and dW
 * (accumulated into random values), cuda at precision BF16 against the cpu's composition. */
static int head_case(struct tctx *t, const char *tag, int n, int K, int V)
{
    char w[64];
    int f = 0;
    int *tg = (int *)hkeep(t, malloc(n * sizeof(int)));
    for (int r = 0; r < n; r++)
        tg[r] = (int)(gu_next(&t->rng) % V);
    struct dp X = dp_rand(t, (size_t)n * K, -1, 1), W = dp_rand(t, (size_t)V * K, -1, 1);
    struct dp T = dp_ints(t, tg, n), WS = dp_nan(t, (size_t)n * V), LO = dp_nan(t, n);
    struct dp LS = dp_make(t, NULL, n * sizeof(double)), MX = dp_nan(t, n);
    struct dp SU = dp_make(t, NULL, 2 * (size_t)n * sizeof(double));
    struct dp DX = dp_rand(t, (size_t)n * K, -1, 1), DW = dp_rand(t, (size_t)V * K, -1, 1);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        CK(kdev_head_ce_forward(t->d[k], FP(WS, k), DBP(LS, k), FP(LO, k), FP(MX, k),
                                DBP(SU, k), FP(X, k), FP(W, k), IP(T, k), n, K, V));
        CK(kdev_head_ce_backward(t->d[k], FP(DX, k), FP(DW, k), FP(WS, k), DBP(LS, k), IP(T, k),
                                 0.37, FP(X, k), FP(W, k), n, K, V));
    }
    snprintf(w, sizeof w, "%s.loss", tag);
    f += cmp_tol(t, w, LO, (size_t)n, TOL_BF16);
    snprintf(w, sizeof w, "%s.lse", tag);
    f += cmp_tol_d(t, w, LS, (size_t)n, TOL_BF16);
    snprintf(w, sizeof w, "%s.dinp", tag);
    f += cmp_tol(t, w, DX, (size_t)n * K, TOL_BF16);
    snprintf(w, sizeof w, "%s.dw", tag);
    f += cmp_tol(t, w, DW, (size_t)V * K, TOL_BF16);
    return f;
}

/* Precision BF16 on the cuda device (kdev_set_precision): GEMMs on bf16 tensor cores and
 * attention through kcuda's bf16 flash kernels for D = 64, 80, 128, against the fp32 cpu
 * at TOL_BF16; the cpu device refuses BF16. */
static int test_bf16(struct tctx *t)
{
    static const int lens[4] = {1, 17, 69, 130}, lens2[3] = {64, 64, 200};
    int f = 0;
    int k = 1;
    CK(kdev_set_precision(t->d[k], KDEV_PREC_BF16));
    int rc = kdev_set_precision(t->d[0], KDEV_PREC_BF16);
    kdev_status_clear(t->d[0]);
    if (rc != HERR_CONFIG) {
        printf("# cpu set_precision(BF16): rc %d, want HERR_CONFIG\n", rc);
        f++;
    }
    t->tol = TOL_BF16;
    f += mm_case(t, "bf16.96x200x136", 96, 200, 136);
    f += mm_case(t, "bf16.M1", 1, 40, 24);
    /* K % 8: rows padded to Kp (72), dinp and dW through Kp-wide copies; with odd N
     * also the padded forward; 3420: the Qwen2.5-VL ViT's fc2 */
    f += mm_case(t, "bf16.37x67x53", 37, 67, 53);
    f += mm_case(t, "bf16.64x3420x128", 64, 3420, 128);
    f += mm_case(t, "bf16.40x64x53", 40, 64, 53);   /* odd N: dout rows padded to 56, the
                                                      forward through 56 output columns */
    /* N % 4 with more rows than one block of the padded forward (2^26 / 48008 = 1397) */
    f += mm_case(t, "bf16.1400x8x48001", 1400, 8, 48001);
    /* the fused head: V padded to 8 (1001), V % 8 == 0, a vocabulary too small for the
     * workspace and K % 8 != 0 (both composed from the pieces) */
    f += head_case(t, "bf16.head.37x64x1001", 37, 64, 1001);
    f += head_case(t, "bf16.head.16x128x512", 16, 128, 512);
    f += head_case(t, "bf16.head.5x64x3", 5, 64, 3);
    f += head_case(t, "bf16.head.9x60x77", 9, 60, 77);
    f += att_case(t, "bf16.c64", lens, 4, 4, 2, 64, 1, 1);
    f += att_case(t, "bf16.n80", lens, 4, 4, 2, 80, 0, 1);
    f += att_case(t, "bf16.c128", lens2, 3, 2, 2, 128, 1, 0);
    f += ld_case(t, "bf16.ld.c64", lens, 4, 4, 2, 64, 0);   /* fp32 memory: copies */
    t->tol = 0;
    CK(kdev_set_precision(t->d[k], KDEV_PREC_FP32));
    return f + t->bad;
}

/* ---- activation memory (kdev_alloc_act) --------------------------------------------------
 * At precision BF16 the cuda device's activation memory holds bf16.  Each op that takes an
 * "act" argument runs with that argument there on the cuda device and in fp32 on the cpu:
 * producers (norms, activations, attention's out) against the cpu's fp32 result (TOL_BF16
 * covers the output's rounding, 2^-9), consumers (the matmul's inp, attention backward's
 * out) against the cpu given the same bf16-rounded values as fp32.  Ops that take no
 * activation memory refuse it, and the precision cannot change under it. */

/* x rounded to bf16 (nearest even), as fp32: what activation memory stores of it. */
static float bf16_round(float x)
{
    return gu_from_bf16(gu_to_bf16(x));
}

/* n values in the cuda device's activation memory (p[1]; p[0] NULL), from host. */
static struct dp act_make(struct tctx *t, const float *host, size_t n)
{
    struct dp b = {{NULL, NULL}, n * sizeof(float)};
    int k = 1;
    CK(kdev_alloc_act(t->d[1], &b.p[1], n));
    if (host && b.p[1])
        CK(kdev_act_upload(t->d[1], b.p[1], host, n));
    if (t->nbufs < MAXBUF)
        t->bufs[t->nbufs++] = b;
    else
        t->bad++;
    return b;
}

/* The cpu's fp32 c (a buffer) against the cuda device's activation memory a. */
static int cmp_act(struct tctx *t, const char *what, struct dp c, struct dp a, size_t n,
                   double tol)
{
    const float *hc = (const float *)dl(t, 0, c);
    float *ha = (float *)hkeep(t, malloc(n ? n * sizeof(float) : 1));
    if (!hc || kdev_act_download(t->d[1], ha, a.p[1], n)) {
        printf("# act download: %s\n", kdev_errmsg(t->d[1]));
        return 1;
    }
    return judge(t, what, rel_err(hc, ha, n), tol);
}

/* b's host values rounded to bf16, set on both devices, and the same values in the cuda
 * device's activation memory (returned). */
static struct dp act_rounded(struct tctx *t, struct dp b, size_t n)
{
    float *h = (float *)dl(t, 0, b);
    if (!h) {
        t->bad++;
        return b;
    }
    for (size_t i = 0; i < n; i++)
        h[i] = bf16_round(h[i]);
    dp_set(t, b, h);
    return act_make(t, h, n);
}

/* The matmul with inp in activation memory: forward (N % 4 != 0 takes the padded path),
 * the backward with every gradient (_set form), and again with dout in activation memory
 * too (dbias from its bf16 values); K or N % 8 != 0 pads the bf16 rows. */
static int act_mm_case(struct tctx *t, const char *tag, int M, int K, int N)
{
    char w[64];
    int f = 0, k;
    size_t nx = (size_t)M * K;
    float *hx = hrand(t, nx, -1, 1);
    for (size_t i = 0; i < nx; i++)
        hx[i] = bf16_round(hx[i]);
    struct dp x = dp_make(t, hx, nx * 4), xa = act_make(t, hx, nx);
    struct dp wt = dp_rand(t, (size_t)N * K, -1, 1), bias = dp_rand(t, N, -1, 1);
    struct dp o = dp_nan(t, (size_t)M * N), dout = dp_rand(t, (size_t)M * N, -1, 1);
    float *hdw = hrand(t, (size_t)N * K, -1, 1);
    struct dp di = dp_nan(t, nx), dw = dp_make(t, hdw, (size_t)N * K * 4);
    float *hdb = hrand(t, N, -1, 1);
    struct dp db = dp_make(t, hdb, (size_t)N * 4);
    struct dp da = act_rounded(t, dout, (size_t)M * N), di2 = dp_nan(t, nx);
    struct dp dw2 = dp_make(t, hdw, (size_t)N * K * 4), db2 = dp_make(t, hdb, (size_t)N * 4);
    /* dinp in activation memory, written and added to */
    struct dp di3 = dp_nan(t, nx), di3a = act_make(t, NULL, nx), di4 = dp_rand(t, nx, -1, 1);
    struct dp di4a = act_rounded(t, di4, nx), oa = act_make(t, NULL, (size_t)M * N);
    if (t->bad)
        return 1;
    /* out in activation memory (bias rounded to bf16 in the GEMM's epilogue; N % 8 != 0
     * through an fp32 copy) */
    k = 1;
    CK(kdev_matmul_forward(t->d[1], FP(oa, 1), FP(xa, 1), FP(wt, 1), FP(bias, 1), M, K, N));
    for (k = 0; k < 2; k++) {
        const float *in = k ? FP(xa, 1) : FP(x, 0);
        CK(kdev_matmul_forward(t->d[k], FP(o, k), in, FP(wt, k), FP(bias, k), M, K, N));
        CK(kdev_matmul_backward_set(t->d[k], FP(di, k), FP(dw, k), FP(db, k), FP(dout, k), in,
                                    FP(wt, k), M, K, N));
        CK(kdev_matmul_backward_set(t->d[k], FP(di2, k), FP(dw2, k), FP(db2, k),
                                    k ? FP(da, 1) : FP(dout, 0), in, FP(wt, k), M, K, N));
        CK(kdev_matmul_backward_set(t->d[k], k ? FP(di3a, 1) : FP(di3, 0), NULL, NULL,
                                    k ? FP(da, 1) : FP(dout, 0), in, FP(wt, k), M, K, N));
        CK(kdev_matmul_backward(t->d[k], k ? FP(di4a, 1) : FP(di4, 0), NULL, NULL,
                                k ? FP(da, 1) : FP(dout, 0), in, FP(wt, k), M, K, N));
    }
    snprintf(w, sizeof w, "%s.out.to_act", tag);
    f += cmp_act(t, w, o, oa, (size_t)M * N, TOL_BF16);
    snprintf(w, sizeof w, "%s.dinp.to_act", tag);
    f += cmp_act(t, w, di3, di3a, nx, TOL_BF16);
    snprintf(w, sizeof w, "%s.dinp.acc_act", tag);
    f += cmp_act(t, w, di4, di4a, nx, TOL_BF16);
    struct { const char *n; struct dp b; size_t len; } chk[] = {
        {"out", o, (size_t)M * N}, {"dinp", di, nx}, {"dw", dw, (size_t)N * K}, {"db", db, (size_t)N},
        {"dinp.act", di2, nx}, {"dw.act", dw2, (size_t)N * K}, {"db.act", db2, (size_t)N}};
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++) {
        snprintf(w, sizeof w, "%s.%s", tag, chk[i].n);
        f += cmp_tol(t, w, chk[i].b, chk[i].len, TOL_BF16);
    }
    return f + t->bad;
}

/* Producers: norms (LayerNorm with and without bias, RMSNorm), GELU (n % 4 != 0: the
 * tail), SwiGLU, each writing activation memory. */
static int act_producers(struct tctx *t, int N, int C)
{
    int f = 0, k;
    size_t n = (size_t)N * C;
    struct dp x = dp_rand(t, n, -2, 2), wt = dp_rand(t, C, 0.5f, 1.5f), b = dp_rand(t, C, -1, 1);
    struct dp o = dp_nan(t, n), st = dp_nan(t, N), st2 = dp_nan(t, N);
    struct dp ln = act_make(t, NULL, n), rms = act_make(t, NULL, n), lnb = act_make(t, NULL, n);
    struct dp o2 = dp_nan(t, n), o3 = dp_nan(t, n);
    size_t ng = n - 3;   /* GELU over a length that is not a multiple of 4 */
    struct dp ge = act_make(t, NULL, ng), o4 = dp_nan(t, ng);
    int F = C / 2;
    struct dp sw = act_make(t, NULL, (size_t)N * F), o5 = dp_nan(t, (size_t)N * F);
    if (t->bad)
        return 1;
    for (k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_layernorm_forward(d, k ? FP(ln, 1) : FP(o, 0), FP(st, k), FP(st2, k), FP(x, k),
                                  FP(wt, k), NULL, N, C, 1e-5f));
        CK(kdev_layernorm_forward(d, k ? FP(lnb, 1) : FP(o3, 0), NULL, NULL, FP(x, k), FP(wt, k),
                                  FP(b, k), N, C, 1e-5f));
        CK(kdev_rmsnorm_forward(d, k ? FP(rms, 1) : FP(o2, 0), NULL, FP(x, k), FP(wt, k), N, C,
                                1e-5f));
        CK(kdev_gelu_forward(d, k ? FP(ge, 1) : FP(o4, 0), FP(x, k), ng, KGELU_TANH));
        CK(kdev_swiglu_forward(d, k ? FP(sw, 1) : FP(o5, 0), FP(x, k), N, F));
    }
    f += cmp_act(t, "layernorm", o, ln, n, TOL_BF16);
    f += cmp_act(t, "layernorm_bias", o3, lnb, n, TOL_BF16);
    f += cmp_act(t, "rmsnorm", o2, rms, n, TOL_BF16);
    f += cmp_act(t, "gelu", o4, ge, ng, TOL_BF16);
    f += cmp_act(t, "swiglu", o5, sw, (size_t)N * F, TOL_BF16);
    /* the qkv split: columns [8, 8 + cols) of every row of x into packed rows, cols a
     * multiple of 4 (16-byte loads) and not */
    static const int cols[2] = { 32, 30 };
    for (int i = 0; i < 2; i++) {
        size_t nc = (size_t)N * cols[i];
        struct dp pc = dp_nan(t, nc), pa = act_make(t, NULL, nc);
        if (t->bad)
            return f + t->bad;
        for (k = 0; k < 2; k++)
            CK(kdev_act_copy_2d(t->d[k], k ? FP(pa, 1) : FP(pc, 0), (size_t)cols[i],
                                FP(x, k) + 8, (size_t)C, (size_t)N, (size_t)cols[i]));
        f += cmp_act(t, i ? "copy_rows30" : "copy_rows32", pc, pa, nc, TOL_BF16);
    }
    /* RoPE in place on activation memory: x [N, H, D] */
    int H = 2, D = C / H;
    struct dp cs = dp_rand(t, (size_t)N * D / 2, -1, 1), sn = dp_rand(t, (size_t)N * D / 2, -1, 1);
    struct dp rx = dp_rand(t, n, -1, 1), ra = act_rounded(t, rx, n);
    if (t->bad)
        return f + t->bad;
    for (k = 0; k < 2; k++)
        CK(kdev_rope_forward(t->d[k], k ? FP(ra, 1) : FP(rx, 0), FP(cs, k), FP(sn, k), N, H, D));
    f += cmp_act(t, "rope", rx, ra, n, TOL_BF16);
    /* RoPE backward, GELU and SwiGLU backward written into activation memory (the _set
     * forms, and GELU's accumulating form on the values there) */
    struct dp rb = dp_rand(t, n, -1, 1), rba = act_rounded(t, rb, n);
    struct dp dy = dp_rand(t, ng, -1, 1), gb = dp_nan(t, ng), gba = act_make(t, NULL, ng);
    struct dp sb = dp_nan(t, n), sba = act_make(t, NULL, n);
    struct dp gacc = dp_rand(t, ng, -1, 1), gacca = act_rounded(t, gacc, ng);
    if (t->bad)
        return f + t->bad;
    for (k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_rope_backward(d, k ? FP(rba, 1) : FP(rb, 0), FP(cs, k), FP(sn, k), N, H, D));
        CK(kdev_gelu_backward_set(d, k ? FP(gba, 1) : FP(gb, 0), FP(dy, k), FP(x, k), ng,
                                  KGELU_TANH));
        CK(kdev_gelu_backward(d, k ? FP(gacca, 1) : FP(gacc, 0), FP(dy, k), FP(x, k), ng,
                              KGELU_TANH));
        CK(kdev_swiglu_backward_set(d, k ? FP(sba, 1) : FP(sb, 0), FP(dy, k), FP(x, k), N, F));
    }
    /* and with dout in activation memory too (both bf16; fp32 dinp from a bf16 dout) */
    struct dp dya = act_rounded(t, dy, ng), gb2 = dp_nan(t, ng), gb2a = act_make(t, NULL, ng);
    struct dp gb3 = dp_nan(t, ng), sb2 = dp_nan(t, n), sb2a = act_make(t, NULL, n);
    if (t->bad)
        return f + t->bad;
    for (k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        const float *g = k ? FP(dya, 1) : FP(dy, 0);
        CK(kdev_gelu_backward_set(d, k ? FP(gb2a, 1) : FP(gb2, 0), g, FP(x, k), ng, KGELU_TANH));
        CK(kdev_gelu_backward_set(d, FP(gb3, k), g, FP(x, k), ng, KGELU_TANH));
        CK(kdev_swiglu_backward_set(d, k ? FP(sb2a, 1) : FP(sb2, 0), g, FP(x, k), N, F));
    }
    f += cmp_act(t, "gelu_bwd.dout_act", gb2, gb2a, ng, TOL_BF16);
    f += cmp_tol(t, "gelu_bwd.dout_act_f32", gb3, ng, TOL_BF16);
    f += cmp_act(t, "swiglu_bwd.dout_act", sb2, sb2a, n, TOL_BF16);
    /* every tensor of GELU and SwiGLU in activation memory (inp rounded on both) */
    struct dp xr = dp_rand(t, n, -2, 2), xra = act_rounded(t, xr, n);
    struct dp go = dp_nan(t, ng), goa = act_make(t, NULL, ng), so = dp_nan(t, (size_t)N * F);
    struct dp soa = act_make(t, NULL, (size_t)N * F), gi = dp_nan(t, ng);
    struct dp gia = act_make(t, NULL, ng), si = dp_nan(t, n), sia = act_make(t, NULL, n);
    struct dp sdy = dp_rand(t, (size_t)N * F, -1, 1), sdya = act_rounded(t, sdy, (size_t)N * F);
    if (t->bad)
        return f + t->bad;
    for (k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        const float *in = k ? FP(xra, 1) : FP(xr, 0);
        CK(kdev_gelu_forward(d, k ? FP(goa, 1) : FP(go, 0), in, ng, KGELU_TANH));
        CK(kdev_swiglu_forward(d, k ? FP(soa, 1) : FP(so, 0), in, N, F));
        CK(kdev_gelu_backward_set(d, k ? FP(gia, 1) : FP(gi, 0), k ? FP(dya, 1) : FP(dy, 0), in,
                                  ng, KGELU_TANH));
        CK(kdev_swiglu_backward_set(d, k ? FP(sia, 1) : FP(si, 0), k ? FP(sdya, 1) : FP(sdy, 0),
                                    in, N, F));
    }
    f += cmp_act(t, "gelu.bf16", go, goa, ng, TOL_BF16);
    f += cmp_act(t, "swiglu.bf16", so, soa, (size_t)N * F, TOL_BF16);
    f += cmp_act(t, "gelu_bwd.bf16", gi, gia, ng, TOL_BF16);
    f += cmp_act(t, "swiglu_bwd.bf16", si, sia, n, TOL_BF16);
    /* inp in activation memory and out not: refused */
    k = 1;
    int rc = kdev_gelu_forward(t->d[1], FP(go, 1), FP(xra, 1), ng, KGELU_TANH);
    kdev_status_clear(t->d[1]);
    if (rc != HERR_ARG) {
        printf("# gelu_forward from activation memory into fp32: rc %d, want HERR_ARG\n", rc);
        f++;
    }
    f += cmp_act(t, "rope_bwd", rb, rba, n, TOL_BF16);
    f += cmp_act(t, "gelu_bwd", gb, gba, ng, TOL_BF16);
    f += cmp_act(t, "gelu_bwd_acc", gacc, gacca, ng, TOL_BF16);
    f += cmp_act(t, "swiglu_bwd", sb, sba, n, TOL_BF16);
    /* the gradients' merge: packed bf16 rows into columns [4, 4 + 32) of C-wide rows, into
     * fp32 and into activation memory */
    size_t np = (size_t)N * 32;
    float *hp = hrand(t, np, -1, 1);
    for (size_t i = 0; i < np; i++)
        hp[i] = bf16_round(hp[i]);
    struct dp pk = dp_make(t, hp, np * 4), pka = act_make(t, hp, np);
    struct dp m32 = dp_rand(t, n, -1, 1), mh = dp_make(t, dl(t, 0, m32), n * 4);
    struct dp ma = act_rounded(t, mh, n);
    if (t->bad)
        return f + t->bad;
    for (k = 0; k < 2; k++)
        CK(kdev_act_copy_2d(t->d[k], FP(m32, k) + 4, (size_t)C, k ? FP(pka, 1) : FP(pk, 0),
                            32, (size_t)N, 32));
    k = 0;
    CK(kdev_act_copy_2d(t->d[0], FP(mh, 0) + 4, (size_t)C, FP(pk, 0), 32, (size_t)N, 32));
    CK(kdev_act_copy_2d(t->d[1], kdev_act_at(t->d[1], FP(ma, 1), 4), (size_t)C, FP(pka, 1), 32,
                        (size_t)N, 32));
    f += cmp_tol(t, "merge_to_f32", m32, n, 0);
    f += cmp_act(t, "merge_to_act", mh, ma, n, 0);
    return f + t->bad;
}

/* Attention with q, k, v and out in activation memory: the bf16 flash kernels (D 64) and
 * the fp32 kernels' path (D 16: operands through fp32 copies, the result rounded into
 * out and read back for the backward). */
static int act_att_case(struct tctx *t, const char *tag, const int *lens, int nseq, int Hq,
                        int Hkv, int D)
{
    char w[64];
    int f = 0, k;
    struct att_io a = att_inputs(t, lens, nseq, Hq, Hkv, D);
    size_t nq = (size_t)a.N * Hq * D, nk = (size_t)a.N * Hkv * D;
    struct dp oa = act_make(t, NULL, nq), sq = dp_nan(t, nq), sk = dp_nan(t, nk);
    struct dp sv = dp_nan(t, nk);
    struct dp qa = act_rounded(t, a.q, nq), ka = act_rounded(t, a.k, nk);
    struct dp va = act_rounded(t, a.v, nk);
    if (t->bad)
        return 1;
    for (k = 0; k < 2; k++)
        CK(kdev_attention_forward(t->d[k], k ? FP(oa, 1) : FP(a.out, 0), FP(a.lse, k),
                                  k ? FP(qa, 1) : FP(a.q, 0), k ? FP(ka, 1) : FP(a.k, 0),
                                  k ? FP(va, 1) : FP(a.v, 0), IP(a.cu, k), nseq, a.maxlen,
                                  a.N, Hq, Hkv, D, 1));
    snprintf(w, sizeof w, "%s.out", tag);
    f += cmp_act(t, w, a.out, oa, nq, TOL_BF16);
    /* the backward: the cpu reads the cuda device's (rounded) out and both the cpu's lse */
    float *ho = (float *)hkeep(t, malloc(nq * sizeof(float)));
    void *hl = dl(t, 0, a.lse);
    if (!hl || kdev_act_download(t->d[1], ho, oa.p[1], nq))
        return 1;
    k = 0;
    CK(kdev_upload(t->d[0], a.out.p[0], ho, nq * sizeof(float)));
    dp_set(t, a.lse, hl);
    /* the gradients in fp32, then in activation memory written (_set) and added to */
    struct dp gq = act_make(t, NULL, nq), gk = act_make(t, NULL, nk), gv = act_make(t, NULL, nk);
    struct dp aq = act_rounded(t, a.dq, nq), ak = act_rounded(t, a.dk, nk);
    struct dp av = act_rounded(t, a.dv, nk), cq = dp_nan(t, nq), ck_ = dp_nan(t, nk);
    struct dp cv = dp_nan(t, nk), douta = act_rounded(t, a.dout, nq);
    if (t->bad)
        return 1;
    for (k = 0; k < 2; k++) {
        const float *q = k ? FP(qa, 1) : FP(a.q, 0), *kk = k ? FP(ka, 1) : FP(a.k, 0);
        const float *v = k ? FP(va, 1) : FP(a.v, 0), *o = k ? FP(oa, 1) : FP(a.out, 0);
        CK(kdev_attention_backward_set(t->d[k], FP(sq, k), FP(sk, k), FP(sv, k), FP(a.dout, k),
                                       q, kk, v, o, FP(a.lse, k), IP(a.cu, k), nseq, a.maxlen,
                                       a.N, Hq, Hkv, D, 1));
        CK(kdev_attention_backward_set(t->d[k], k ? FP(gq, 1) : FP(cq, 0),
                                       k ? FP(gk, 1) : FP(ck_, 0), k ? FP(gv, 1) : FP(cv, 0),
                                       k ? FP(douta, 1) : FP(a.dout, 0), q, kk, v, o,
                                       FP(a.lse, k), IP(a.cu, k), nseq, a.maxlen, a.N, Hq, Hkv,
                                       D, 1));
        CK(kdev_attention_backward(t->d[k], k ? FP(aq, 1) : FP(a.dq, 0),
                                   k ? FP(ak, 1) : FP(a.dk, 0), k ? FP(av, 1) : FP(a.dv, 0),
                                   FP(a.dout, k), q, kk, v, o, FP(a.lse, k), IP(a.cu, k), nseq,
                                   a.maxlen, a.N, Hq, Hkv, D, 1));
    }
    struct { const char *n; struct dp c, g; size_t len; } ga[] = {
        {"dq.act", cq, gq, nq}, {"dk.act", ck_, gk, nk}, {"dv.act", cv, gv, nk},
        {"dq.acc", a.dq, aq, nq}, {"dk.acc", a.dk, ak, nk}, {"dv.acc", a.dv, av, nk}};
    for (int i = 0; i < 6; i++) {
        snprintf(w, sizeof w, "%s.%s", tag, ga[i].n);
        f += cmp_act(t, w, ga[i].c, ga[i].g, ga[i].len, TOL_BF16);
    }
    struct { const char *n; struct dp b; size_t len; } chk[] = {
        {"dq", sq, nq}, {"dk", sk, nk}, {"dv", sv, nk}};
    for (int i = 0; i < 3; i++) {
        snprintf(w, sizeof w, "%s.%s", tag, chk[i].n);
        f += cmp_tol(t, w, chk[i].b, chk[i].len, TOL_BF16);
    }
    return f + t->bad;
}

/* Attention on the column blocks of fused [N, (Hq + 2 Hkv) D] rows (q, k, v in each row:
 * kdev_attention_forward_ld and kdev_attention_backward_ld_set, the gradient written into
 * fused rows of its own), the cuda device against the cpu from the same values.  act: the
 * cuda side's rows in activation memory (read and written in place by the bf16 kernels),
 * else fp32 memory (contiguous copies around either precision's kernels). */
static int ld_case(struct tctx *t, const char *tag, const int *lens, int nseq, int Hq,
                   int Hkv, int D, int act)
{
    char w[64];
    int f = 0, k;
    struct att_io a = att_inputs(t, lens, nseq, Hq, Hkv, D);
    int QD = Hq * D, KD = Hkv * D, ld = QD + 2 * KD;
    size_t nf = (size_t)a.N * ld, nq = (size_t)a.N * QD;
    float *h = hrand(t, nf, -1, 1);
    if (act)   /* the cpu reads what the cuda side holds */
        for (size_t i = 0; i < nf; i++)
            h[i] = bf16_round(h[i]);
    struct dp qkv = dp_make(t, h, nf * sizeof(float)), dqkv = dp_nan(t, nf);
    struct dp qkva = act ? act_make(t, h, nf) : qkv, dqkva = act ? act_make(t, NULL, nf) : dqkv;
    struct dp outa = act ? act_make(t, NULL, nq) : a.out;
    double tol = act ? TOL_BF16 : t->tol > 0 ? t->tol : TOL_ATT;
    if (t->bad)
        return 1;
    float *base[2], *gbase[2];
    for (k = 0; k < 2; k++) {
        base[k] = k ? FP(qkva, 1) : FP(qkv, 0);
        gbase[k] = k ? FP(dqkva, 1) : FP(dqkv, 0);
    }
    /* column i of a row: elements of activation memory on the cuda side with act */
#define COL(p, k, i) ((k) && act ? kdev_act_at(t->d[1], (p), (i)) : (p) + (i))
    for (k = 0; k < 2; k++)
        CK(kdev_attention_forward_ld(t->d[k], k ? FP(outa, 1) : FP(a.out, 0), FP(a.lse, k),
                                     base[k], COL(base[k], k, QD), COL(base[k], k, QD + KD), ld,
                                     ld, ld, IP(a.cu, k), nseq, a.maxlen, a.N, Hq, Hkv, D, 1));
    snprintf(w, sizeof w, "%s.out", tag);
    f += act ? cmp_act(t, w, a.out, outa, nq, tol) : cmp_tol(t, w, a.out, nq, tol);
    snprintf(w, sizeof w, "%s.lse", tag);
    f += cmp_tol(t, w, a.lse, (size_t)a.N * Hq, tol);
    /* the backward of both reads the cpu's out and lse (fp32 memory) */
    void *ho = dl(t, 0, a.out), *hl = dl(t, 0, a.lse);
    if (!ho || !hl)
        return 1;
    dp_set(t, a.out, ho);
    dp_set(t, a.lse, hl);
    for (k = 0; k < 2; k++)
        CK(kdev_attention_backward_ld_set(t->d[k], gbase[k], COL(gbase[k], k, QD),
                                          COL(gbase[k], k, QD + KD), FP(a.dout, k), base[k],
                                          COL(base[k], k, QD), COL(base[k], k, QD + KD),
                                          FP(a.out, k), FP(a.lse, k), ld, ld, ld, IP(a.cu, k),
                                          nseq, a.maxlen, a.N, Hq, Hkv, D, 1));
#undef COL
    snprintf(w, sizeof w, "%s.dqkv", tag);
    f += act ? cmp_act(t, w, dqkv, dqkva, nf, tol) : cmp_tol(t, w, dqkv, nf, tol);
    return f + t->bad;
}

static int test_act(struct tctx *t)
{
    static const int lens[4] = {1, 17, 69, 130};
    int f = 0, k = 1, rc;
    kdev *d = t->d[1];
    if (kdev_act_bytes(t->d[0]) != 4 || kdev_act_bytes(d) != 4) {
        printf("# act bytes at fp32: cpu %zu cuda %zu, want 4\n", kdev_act_bytes(t->d[0]),
               kdev_act_bytes(d));
        f++;
    }
    CK(kdev_set_precision(d, KDEV_PREC_BF16));
    if (kdev_act_bytes(d) != 2) {
        printf("# act bytes at bf16: %zu, want 2\n", kdev_act_bytes(d));
        f++;
    }
    f += act_mm_case(t, "mm.96x64x136", 96, 64, 136);
    f += act_mm_case(t, "mm.37x67x53", 37, 67, 53);
    f += act_producers(t, 33, 96);
    f += act_att_case(t, "att.d64", lens, 4, 4, 2, 64);
    f += act_att_case(t, "att.d16", lens, 4, 4, 2, 16);
    f += ld_case(t, "att.ld.c64", lens, 4, 4, 2, 64, 1);   /* in place (bf16 kernels) */
    f += ld_case(t, "att.ld.c64h", lens, 4, 4, 4, 64, 1);
    f += ld_case(t, "att.ld.c16", lens, 4, 4, 2, 16, 1);   /* fp32 kernels, through copies */
    /* refusals: an fp32-only op given activation memory; a precision change under it */
    struct dp a = act_make(t, NULL, 64), x = dp_rand(t, 64, -1, 1);
    if (t->bad)
        return f + t->bad;
    rc = kdev_add(d, FP(x, 1), FP(x, 1), FP(a, 1), 64);
    gu_note(t, " add=%d", rc);
    if (rc != HERR_ARG || !strstr(kdev_errmsg(d), "activation memory")) {
        printf("# add on activation memory: rc %d \"%s\", want HERR_ARG\n", rc, kdev_errmsg(d));
        f++;
    }
    kdev_status_clear(d);
    rc = kdev_set_precision(d, KDEV_PREC_FP32);
    kdev_status_clear(d);
    if (rc != HERR_CONFIG) {
        printf("# set_precision(FP32) under bf16 activation memory: rc %d, want HERR_CONFIG\n",
               rc);
        f++;
    }
    f += t->bad;
    t_reset(t);   /* releases the activation memory: the precision may change again */
    CK(kdev_set_precision(d, KDEV_PREC_FP32));
    return f + t->bad;
}

/* Block attention: per sequence of length L the queries are positions [L/3, L) and the
 * keys come in two blocks, positions [0, L/2) and [L/2, L).  The forward merges block 0
 * then block 1 into out/lse from lse = -inf (compared after each); the backward adds both
 * blocks' shares from the cpu's final out/lse. */
static int blk_case(struct tctx *t, const char *tag, const int *lens, int nseq, int Hq, int Hkv,
                    int D, int causal)
{
    char w[64];
    int f = 0;
    int *qcu = (int *)hkeep(t, malloc((nseq + 1) * sizeof(int)));
    int *kcu[2] = {(int *)hkeep(t, malloc((nseq + 1) * sizeof(int))),
                   (int *)hkeep(t, malloc((nseq + 1) * sizeof(int)))};
    int total = 0;
    for (int s = 0; s < nseq; s++)
        total += lens[s];
    int *qpos = (int *)hkeep(t, malloc((total + 1) * sizeof(int)));
    int *kpos[2] = {(int *)hkeep(t, malloc((total + 1) * sizeof(int))),
                    (int *)hkeep(t, malloc((total + 1) * sizeof(int)))};
    int maxq = 0, maxk[2] = {0, 0};
    qcu[0] = kcu[0][0] = kcu[1][0] = 0;
    for (int s = 0; s < nseq; s++) {
        int L = lens[s], q0 = L / 3, h = L / 2;
        qcu[s + 1] = qcu[s] + (L - q0);
        for (int p = q0; p < L; p++)
            qpos[qcu[s] + p - q0] = p;
        maxq = L - q0 > maxq ? L - q0 : maxq;
        int b0[2] = {0, h}, b1[2] = {h, L};
        for (int b = 0; b < 2; b++) {
            int lo = b ? b1[0] : b0[0], hi = b ? b1[1] : b0[1];
            kcu[b][s + 1] = kcu[b][s] + (hi - lo);
            for (int p = lo; p < hi; p++)
                kpos[b][kcu[b][s] + p - lo] = p;
            maxk[b] = hi - lo > maxk[b] ? hi - lo : maxk[b];
        }
    }
    int Nq = qcu[nseq];
    size_t nq = (size_t)Nq * Hq * D;
    struct dp Q = dp_rand(t, nq, -1, 1), QC = dp_ints(t, qcu, nseq + 1);
    struct dp QP = dp_ints(t, qpos, Nq ? Nq : 1);
    struct dp K[2], V[2], KC[2], KP[2], DK[2], DV[2];
    for (int b = 0; b < 2; b++) {
        size_t nk = (size_t)kcu[b][nseq] * Hkv * D;
        K[b] = dp_rand(t, nk, -1, 1);
        V[b] = dp_rand(t, nk, -1, 1);
        KC[b] = dp_ints(t, kcu[b], nseq + 1);
        KP[b] = dp_ints(t, kpos[b], kcu[b][nseq] ? kcu[b][nseq] : 1);
        DK[b] = dp_rand(t, nk, -1, 1);
        DV[b] = dp_rand(t, nk, -1, 1);
    }
    float *ninf = (float *)hkeep(t, malloc((size_t)Nq * Hq * sizeof(float)));
    for (size_t i = 0; i < (size_t)Nq * Hq; i++)
        ninf[i] = -INFINITY;
    struct dp O = dp_rand(t, nq, -1, 1), LSE = dp_make(t, ninf, (size_t)Nq * Hq * 4);
    struct dp DO = dp_rand(t, nq, -1, 1), DQ = dp_rand(t, nq, -1, 1);
    if (t->bad)
        return 1;
    for (int b = 0; b < 2; b++) {
        for (int k = 0; k < 2; k++)
            CK(kdev_attention_block_forward(t->d[k], FP(O, k), FP(LSE, k), FP(Q, k),
                                            FP(K[b], k), FP(V[b], k), IP(QC, k), IP(QP, k),
                                            IP(KC[b], k), IP(KP[b], k), nseq, maxq, maxk[b], Hq,
                                            Hkv, D, causal));
        snprintf(w, sizeof w, "%s.b%d.out", tag, b);
        f += cmp_tol(t, w, O, nq, TOL_ATT);
        snprintf(w, sizeof w, "%s.b%d.lse", tag, b);
        f += cmp_tol(t, w, LSE, (size_t)Nq * Hq, TOL_ATT);
    }
    void *ho = dl(t, 0, O), *hl = dl(t, 0, LSE);
    if (!ho || !hl)
        return 1;
    dp_set(t, O, ho);
    dp_set(t, LSE, hl);
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < 2; k++)
            CK(kdev_attention_block_backward(t->d[k], FP(DQ, k), FP(DK[b], k), FP(DV[b], k),
                                             FP(DO, k), FP(Q, k), FP(K[b], k), FP(V[b], k),
                                             FP(O, k), FP(LSE, k), IP(QC, k), IP(QP, k),
                                             IP(KC[b], k), IP(KP[b], k), nseq, maxq, maxk[b],
                                             Hq, Hkv, D, causal));
    snprintf(w, sizeof w, "%s.dq", tag);
    f += cmp_tol(t, w, DQ, nq, TOL_ATT);
    for (int b = 0; b < 2; b++) {
        size_t nk = (size_t)kcu[b][nseq] * Hkv * D;
        snprintf(w, sizeof w, "%s.b%d.dk", tag, b);
        f += cmp_tol(t, w, DK[b], nk, TOL_ATT);
        snprintf(w, sizeof w, "%s.b%d.dv", tag, b);
        f += cmp_tol(t, w, DV[b], nk, TOL_ATT);
    }
    return f;
}

static int test_attention_block(struct tctx *t)
{
    static const int lens[3] = {1, 17, 69};
    int f = blk_case(t, "c64", lens, 3, 4, 2, 64, 1);
    f += blk_case(t, "n80", lens, 3, 4, 2, 80, 0);
    return f + t->bad;
}

/* ---- cross-entropy pieces ------------------------------------------------------------------- */

static int ce_case(struct tctx *t, const char *tag, int n, int Vl, int v0)
{
    char w[64];
    int f = 0;
    int *tg = (int *)hkeep(t, malloc(n * sizeof(int)));
    for (int r = 0; r < n; r++) {
        int u = (int)(gu_next(&t->rng) % 4);
        tg[r] = u == 0 ? v0 - 1 - (int)(gu_next(&t->rng) % 5)      /* before the slice */
                : u == 1 ? v0 + Vl + (int)(gu_next(&t->rng) % 5)   /* after it */
                         : v0 + (int)(gu_next(&t->rng) % Vl);      /* in it */
    }
    struct dp L = dp_rand(t, (size_t)n * Vl, -8, 8), T = dp_ints(t, tg, n), mx = dp_nan(t, n);
    struct dp sums = dp_make(t, NULL, (size_t)2 * n * sizeof(double));
    struct dp dlg = dp_nan(t, (size_t)n * Vl);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++)
        CK(kdev_ce_rowmax(t->d[k], FP(mx, k), FP(L, k), n, Vl));
    snprintf(w, sizeof w, "%s.max", tag);
    f += cmp_bits(t, w, mx);
    const float *hm = (const float *)dl(t, 0, mx);
    if (!hm)
        return 1;
    dp_set(t, mx, hm);
    for (int k = 0; k < 2; k++)
        CK(kdev_ce_rowsum(t->d[k], DBP(sums, k), FP(L, k), FP(mx, k), IP(T, k), v0, n, Vl));
    snprintf(w, sizeof w, "%s.sum", tag);
    f += cmp_tol_d(t, w, sums, 2 * (size_t)n, TOL_D);
    const double *hs = (const double *)dl(t, 0, sums);
    if (!hs)
        return 1;
    dp_set(t, sums, hs);
    /* finish from the same (cpu's) max and sums on both */
    struct dp FL = dp_make(t, NULL, n * sizeof(double)), FLS = dp_nan(t, n);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++)
        CK(kdev_ce_finish(t->d[k], DBP(FL, k), FP(FLS, k), FP(mx, k), DBP(sums, k), n));
    snprintf(w, sizeof w, "%s.finish.lse", tag);
    f += cmp_tol_d(t, w, FL, (size_t)n, TOL_D);
    snprintf(w, sizeof w, "%s.finish.loss", tag);
    f += cmp_tol(t, w, FLS, (size_t)n, TOL_OPT);
    double *lse = (double *)hkeep(t, malloc(n * sizeof(double)));
    for (int r = 0; r < n; r++)
        lse[r] = hm[r] + log(hs[r]);
    struct dp LS = dp_make(t, lse, n * sizeof(double));
    for (int k = 0; k < 2; k++)
        CK(kdev_ce_grad(t->d[k], FP(dlg, k), FP(L, k), DBP(LS, k), IP(T, k), v0, 0.37, n, Vl));
    snprintf(w, sizeof w, "%s.grad", tag);
    f += cmp_tol(t, w, dlg, (size_t)n * Vl, TOL_OPT);
    return f;
}

static int test_ce(struct tctx *t)
{
    int f = ce_case(t, "37x1000", 37, 1000, 500);
    f += ce_case(t, "n1", 1, 3001, 0);
    f += ce_case(t, "V1", 5, 1, 7);
    return f + t->bad;
}

/* ---- mixture of experts --------------------------------------------------------------------- */

static int moe_case(struct tctx *t, const char *tag, int N, int E, int K, int C)
{
    char w[64];
    int f = 0, P = N * K;
    /* logits without near-ties: a shuffled ladder 0.6 apart plus noise below 0.2 */
    float *hz = (float *)hkeep(t, malloc((size_t)N * E * sizeof(float)));
    for (int i = 0; i < N; i++) {
        for (int e = 0; e < E; e++)
            hz[(size_t)i * E + e] = 0.6f * e - 2.0f + gu_uniform(&t->rng, 0.0f, 0.2f);
        for (int e = E - 1; e > 0; e--) {
            int j = (int)(gu_next(&t->rng) % (e + 1));
            float tmp = hz[(size_t)i * E + e];
            hz[(size_t)i * E + e] = hz[(size_t)i * E + j];
            hz[(size_t)i * E + j] = tmp;
        }
    }
    struct dp Z = dp_make(t, hz, (size_t)N * E * 4), TI = dp_make(t, NULL, (size_t)P * 4);
    struct dp TW = dp_nan(t, P), PR = dp_nan(t, (size_t)N * E), AUX = dp_nan(t, 1);
    struct dp DZ = dp_rand(t, (size_t)N * E, -1, 1), DZ2 = dp_rand(t, (size_t)N * E, -1, 1);
    struct dp DTW = dp_rand(t, P, -1, 1);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++)
        CK(kdev_moe_router_forward(t->d[k], IP(TI, k), FP(TW, k), FP(PR, k), FP(AUX, k),
                                   FP(Z, k), N, E, K));
    snprintf(w, sizeof w, "%s.topk", tag);
    f += cmp_bits(t, w, TI);
    snprintf(w, sizeof w, "%s.w", tag);
    f += cmp_tol(t, w, TW, P, TOL_OPT);
    snprintf(w, sizeof w, "%s.probs", tag);
    f += cmp_tol(t, w, PR, (size_t)N * E, TOL_OPT);
    snprintf(w, sizeof w, "%s.aux", tag);
    f += cmp_tol(t, w, AUX, 1, TOL_OPT);
    /* everything downstream reads the cpu's routing on both devices */
    void *hti = dl(t, 0, TI), *htw = dl(t, 0, TW), *hpr = dl(t, 0, PR);
    if (!hti || !htw || !hpr)
        return 1;
    dp_set(t, TI, hti);
    dp_set(t, TW, htw);
    dp_set(t, PR, hpr);
    for (int k = 0; k < 2; k++) {
        CK(kdev_moe_router_backward(t->d[k], FP(DZ, k), FP(DTW, k), 0.3f, FP(PR, k), IP(TI, k),
                                    FP(TW, k), N, E, K));
        CK(kdev_moe_router_backward(t->d[k], FP(DZ2, k), NULL, 0.3f, FP(PR, k), IP(TI, k),
                                    FP(TW, k), N, E, K));
    }
    snprintf(w, sizeof w, "%s.dz", tag);
    f += cmp_tol(t, w, DZ, (size_t)N * E, TOL_F32);
    snprintf(w, sizeof w, "%s.dz_aux", tag);
    f += cmp_tol(t, w, DZ2, (size_t)N * E, TOL_F32);

    struct dp OFF = dp_make(t, NULL, (size_t)(E + 1) * 4), RS = dp_make(t, NULL, (size_t)P * 4);
    struct dp SR = dp_make(t, NULL, (size_t)P * 4);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++)
        CK(kdev_moe_plan(t->d[k], IP(OFF, k), IP(RS, k), IP(SR, k), IP(TI, k), N, E, K));
    snprintf(w, sizeof w, "%s.offsets", tag);
    f += cmp_bits(t, w, OFF);
    snprintf(w, sizeof w, "%s.row_src", tag);
    f += cmp_bits(t, w, RS);
    snprintf(w, sizeof w, "%s.slot_row", tag);
    f += cmp_bits(t, w, SR);
    void *hrs = dl(t, 0, RS), *hsr = dl(t, 0, SR);
    if (!hrs || !hsr)
        return 1;
    dp_set(t, RS, hrs);
    dp_set(t, SR, hsr);

    struct dp X = dp_rand(t, (size_t)N * C, -1, 1), XP = dp_nan(t, (size_t)P * C);
    struct dp DXP = dp_rand(t, (size_t)P * C, -1, 1), DX = dp_rand(t, (size_t)N * C, -1, 1);
    struct dp EO = dp_rand(t, (size_t)P * C, -1, 1), Y = dp_nan(t, (size_t)N * C);
    struct dp DY = dp_rand(t, (size_t)N * C, -1, 1), DEO = dp_rand(t, (size_t)P * C, -1, 1);
    struct dp DTW2 = dp_rand(t, P, -1, 1);
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        CK(kdev_moe_permute_forward(d, FP(XP, k), FP(X, k), IP(RS, k), N, K, C));
        CK(kdev_moe_permute_backward(d, FP(DX, k), FP(DXP, k), IP(RS, k), N, K, C));
        CK(kdev_moe_unpermute_forward(d, FP(Y, k), FP(EO, k), FP(TW, k), IP(SR, k), N, K, C));
        CK(kdev_moe_unpermute_backward(d, FP(DEO, k), FP(DTW2, k), FP(DY, k), FP(EO, k),
                                       FP(TW, k), IP(SR, k), N, K, C));
    }
    snprintf(w, sizeof w, "%s.perm", tag);
    f += cmp_bits(t, w, XP);
    snprintf(w, sizeof w, "%s.perm.d", tag);
    f += cmp_bits(t, w, DX);
    snprintf(w, sizeof w, "%s.unperm", tag);
    f += cmp_bits(t, w, Y);
    snprintf(w, sizeof w, "%s.unperm.dx", tag);
    f += cmp_bits(t, w, DEO);
    snprintf(w, sizeof w, "%s.unperm.dw", tag);
    f += cmp_tol(t, w, DTW2, P, TOL_OPT);
    return f;
}

static int test_moe(struct tctx *t)
{
    int f = moe_case(t, "N37", 37, 8, 2, 48);
    f += moe_case(t, "N1", 1, 8, 2, 5);
    return f + t->bad;
}

/* ---- fp8 and the optimizer ------------------------------------------------------------------ */

static int test_fp8(struct tctx *t)
{
    int f = 0;
    size_t n = 20011;
    float *x = (float *)hkeep(t, malloc(n * sizeof(float)));
    for (size_t i = 0; i < n; i++) { /* magnitudes 2^-24 .. 2^20, both signs */
        float m = ldexpf(gu_uniform(&t->rng, 0.5f, 1.0f), (int)(gu_next(&t->rng) % 45) - 24);
        x[i] = gu_next(&t->rng) & 1 ? -m : m;
    }
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 449.0f, 464.0f,
                             57344.0f, 61440.0f, -1e30f, 1e-45f, 0.0078125f, 0.001953125f,
                             0.0009765625f, 1.52587890625e-05f, 0.0625f, 240.0f, 232.0f};
    memcpy(x, special, sizeof special);
    struct dp X = dp_make(t, x, n * 4);
    /* amax cases: all of x (specials: NaN wins), finite values with one NaN near the end,
     * finite values only */
    float *xn = (float *)hkeep(t, malloc(n * sizeof(float)));
    memcpy(xn, x, n * sizeof(float));
    xn[n - 7] = NAN;
    struct dp XF = dp_make(t, xn + 100, (n - 100) * 4), XS = dp_make(t, x + 100, 1000 * 4);
    const float scales[3] = {1.0f, 3.7f, 1.0f / 1024};
    struct dp Q[2][3];
    for (int fm = 0; fm < 2; fm++)
        for (int s = 0; s < 3; s++)
            Q[fm][s] = dp_nan(t, n);
    if (t->bad)
        return 1;
    float am[2][3];
    for (int k = 0; k < 2; k++) {
        CK(kdev_amax(t->d[k], &am[k][0], FP(X, k), n));
        CK(kdev_amax(t->d[k], &am[k][1], FP(XF, k), n - 100));
        CK(kdev_amax(t->d[k], &am[k][2], FP(XS, k), 1000));
        for (int fm = 0; fm < 2; fm++)
            for (int s = 0; s < 3; s++)
                CK(kdev_fp8_qdq(t->d[k], FP(Q[fm][s], k), FP(X, k), n, scales[s],
                                (kfp8_format)fm));
    }
    for (int i = 0; i < 3; i++) {
        int same = memcmp(&am[0][i], &am[1][i], 4) == 0 || (isnan(am[0][i]) && isnan(am[1][i]));
        if (!same) {
            printf("# amax case %d: cpu %.9g cuda %.9g\n", i, am[0][i], am[1][i]);
            f++;
        }
    }
    gu_note(t, " amax=%s(%g,%g,%g)", f ? "DIFF" : "bits", am[1][0], am[1][1], am[1][2]);
    for (int fm = 0; fm < 2; fm++)
        for (int s = 0; s < 3; s++) {
            char w[32];
            snprintf(w, sizeof w, "%s.s%d", fm ? "e5m2" : "e4m3", s);
            f += cmp_bits_ex(t, w, Q[fm][s], 1);
        }
    return f + t->bad;
}

/* The FP8 linear (kdev_fp8_matmul_*): the cuda device's FP8 GEMM (shapes of multiples of
 * 16) or its emulation (other shapes) against the cpu's emulation, with the scales the
 * model would take from these tensors' amax.  The quantised values are the same (the
 * codes bit for bit: test_fp8_gpu); the emulation's products differ by the order of the
 * fp32 sums and by dequantising the sum instead of each operand (TOL_F32), the FP8
 * GEMM's also by the tensor cores' narrower sums between promotions to fp32 (TOL_FP8GEMM,
 * test_fp8_gpu.cu; an H100 measured up to 2.7e-4).  gemm: whether the
 * cuda device must take its FP8 GEMM (ws = NULL succeeds) or must refuse it (HERR_NOALGO,
 * its status untouched). */
static int fp8mm_case(struct tctx *t, const char *tag, int M, int K, int N, int gemm)
{
    char w[64];
    int f = 0;
    size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *hx = hrand(t, nx, -3, 3), *hw = hrand(t, nw, -0.2f, 0.2f);
    float *hy = hrand(t, ny, -1e-3f, 1e-3f);
    struct dp x = dp_make(t, hx, nx * 4), wt = dp_make(t, hw, nw * 4);
    struct dp dout = dp_make(t, hy, ny * 4), bias = dp_rand(t, N, -1, 1);
    struct dp o1 = dp_nan(t, ny), o2 = dp_nan(t, ny), ws = dp_make(t, NULL, (ny + nx + nw) * 4);
    float *hdi = hrand(t, nx, -1e-3f, 1e-3f), *hdw = hrand(t, nw, -1e-3f, 1e-3f);
    struct dp di = dp_make(t, hdi, nx * 4), dw = dp_make(t, hdw, nw * 4);
    struct dp di1 = dp_make(t, hdi, nx * 4), dw1 = dp_make(t, hdw, nw * 4);
    float sx = kcpu_fp8_scale(kcpu_amax(hx, nx), KFP8_E4M3, 0, 1.0f);
    float sw = kcpu_fp8_scale(kcpu_amax(hw, nw), KFP8_E4M3, 0, 1.0f);
    float sd = kcpu_fp8_scale(kcpu_amax(hy, ny), KFP8_E5M2, 0, 1.0f);
    struct dp am = dp_nan(t, 3);   /* the amaxes the calls record: x, w, dy */
    if (t->bad)
        return 1;
    for (int k = 0; k < 2; k++) {
        kdev *d = t->d[k];
        kdev_fp8_amax rec = { FP(am, k), FP(am, k) + 1, FP(am, k) + 2 };
        CK(kdev_fp8_matmul_forward(d, FP(ws, k), FP(o1, k), FP(x, k), FP(wt, k), FP(bias, k),
                                   M, K, N, sx, sw, &rec));
        CK(kdev_fp8_matmul_forward(d, FP(ws, k), FP(o2, k), FP(x, k), FP(wt, k), NULL, M, K,
                                   N, sx, sw, NULL));
        CK(kdev_fp8_matmul_backward(d, FP(ws, k), FP(di, k), FP(dw, k), FP(dout, k), FP(x, k),
                                    FP(wt, k), M, K, N, sx, sw, sd, KFP8_E5M2, &rec));
        /* one gradient at a time */
        CK(kdev_fp8_matmul_backward(d, FP(ws, k), FP(di1, k), NULL, FP(dout, k), FP(x, k),
                                    FP(wt, k), M, K, N, sx, sw, sd, KFP8_E5M2, NULL));
        CK(kdev_fp8_matmul_backward(d, FP(ws, k), NULL, FP(dw1, k), FP(dout, k), FP(x, k),
                                    FP(wt, k), M, K, N, sx, sw, sd, KFP8_E5M2, NULL));
    }
    /* the amaxes: what kdev_amax gives, bit for bit (the cuda GEMM's from its quantise) */
    snprintf(w, sizeof w, "%s.amax", tag);
    f += cmp_bits(t, w, am);
    /* the cuda device without ws: its FP8 GEMM, or a clean refusal */
    int rc = kdev_fp8_matmul_forward(t->d[1], NULL, FP(o2, 1), FP(x, 1), FP(wt, 1), NULL, M, K,
                                     N, sx, sw, NULL);
    int want = gemm ? 0 : HERR_NOALGO;
    if (rc != want || kdev_status(t->d[1]) != 0) {
        printf("# %s: fp8_matmul_forward without ws returned %d (status %d), want %d: %s\n",
               tag, rc, kdev_status(t->d[1]), want, kdev_errmsg(t->d[1]));
        f++;
    }
    gu_note(t, " %s=%s", tag, gemm ? "fp8gemm" : "emulated");
    struct {
        const char *n;
        struct dp b;
        size_t len;
    } chk[] = {{"out", o1, ny}, {"out_nb", o2, ny}, {"dinp", di, nx}, {"dw", dw, nw},
               {"dinp1", di1, nx}, {"dw1", dw1, nw}};
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++) {
        snprintf(w, sizeof w, "%s.%s", tag, chk[i].n);
        f += cmp_tol(t, w, chk[i].b, chk[i].len, gemm ? TOL_FP8GEMM : TOL_F32);
    }
    return f;
}

static int test_fp8_gemm(struct tctx *t)
{
    int f = fp8mm_case(t, "64x256x512", 64, 256, 512, 1);
    f += fp8mm_case(t, "256x1024x128", 256, 1024, 128, 1);
    f += fp8mm_case(t, "16x4096x32", 16, 4096, 32, 1);
    f += fp8mm_case(t, "37x72x200", 37, 72, 200, 0);   /* M % 16: the emulation */
    f += fp8mm_case(t, "64x72x48", 64, 72, 48, 0);     /* K % 16 */
    return f + t->bad;
}

static int test_optimizer(struct tctx *t)
{
    int f = 0;
    size_t n = 10007, ns = 100003;
    struct dp p = dp_rand(t, n, -1, 1), g = dp_rand(t, n, -1, 1), m = dp_rand(t, n, -0.1f, 0.1f);
    float *hv = hrand(t, n, 0, 0.01f);
    struct dp v = dp_make(t, hv, n * 4), x = dp_rand(t, ns, -3, 3);
    if (t->bad)
        return 1;
    double ss[2][2];
    for (int k = 0; k < 2; k++) {
        CK(kdev_adamw_update(t->d[k], FP(p, k), FP(g, k), FP(m, k), FP(v, k), n, 1e-3f, 0.9f,
                             0.95f, 1e-8f, 0.1f, 3));
        CK(kdev_sumsq(t->d[k], &ss[k][0], FP(x, k), ns));
        CK(kdev_sumsq(t->d[k], &ss[k][1], FP(x, k), 1));
    }
    f += cmp_tol(t, "param", p, n, TOL_OPT) + cmp_tol(t, "m", m, n, TOL_OPT);
    f += cmp_tol(t, "v", v, n, TOL_OPT);
    for (int i = 0; i < 2; i++) {
        double e = fabs(ss[1][i] - ss[0][i]) / fabs(ss[0][i]);
        f += judge(t, i ? "sumsq1" : "sumsq", e, TOL_D);
    }
    /* the multi-tensor ops over three tensors of one buffer (sizes 1, a chunk and a bit,
     * and the rest), clipped by 0.5; decay on the first and the last */
    size_t sz[3] = {1, 16385, 3000};
    size_t off[3] = {0, 1, 16386};
    struct dp P = dp_rand(t, 20000, -1, 1), G = dp_rand(t, 20000, -1, 1);
    struct dp Mm = dp_rand(t, 20000, -0.1f, 0.1f), V = dp_make(t, hrand(t, 20000, 0, 0.01f), 20000 * 4);
    if (t->bad)
        return f + 1;
    double sm[2];
    for (int k = 0; k < 2; k++) {
        const float *xs[3];
        kdev_adamw_tensor at[3];
        for (int i = 0; i < 3; i++) {
            xs[i] = FP(G, k) + off[i];
            at[i] = (kdev_adamw_tensor){FP(P, k) + off[i], FP(G, k) + off[i], FP(Mm, k) + off[i],
                                        FP(V, k) + off[i], sz[i], i != 1};
        }
        CK(kdev_sumsq_multi(t->d[k], &sm[k], xs, sz, 3));
        CK(kdev_adamw_multi(t->d[k], at, 3, 0.5f, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2));
    }
    f += judge(t, "sumsq_multi", fabs(sm[1] - sm[0]) / fabs(sm[0]), TOL_D);
    f += cmp_tol(t, "multi.param", P, 20000, TOL_OPT) + cmp_tol(t, "multi.m", Mm, 20000, TOL_OPT);
    f += cmp_tol(t, "multi.v", V, 20000, TOL_OPT);
    return f + t->bad;
}

/* ---- determinism and errors ---------------------------------------------------------------- */

static int test_determinism(struct tctx *t)
{
    static const int lens[4] = {1, 17, 69, 130};
    int f = 0, Hq = 4, Hkv = 2, D = 64, nseq = 4;
    struct att_io a = att_inputs(t, lens, nseq, Hq, Hkv, D);
    size_t nq = (size_t)a.N * Hq * D, nk = (size_t)a.N * Hkv * D;
    struct dp g2[3] = {dp_make(t, NULL, nq * 4), dp_make(t, NULL, nk * 4),
                       dp_make(t, NULL, nk * 4)};
    struct dp g1[3] = {dp_make(t, NULL, nq * 4), dp_make(t, NULL, nk * 4),
                       dp_make(t, NULL, nk * 4)};
    int n = 29, Vl = 5000;
    int *tg = (int *)hkeep(t, malloc(n * sizeof(int)));
    for (int r = 0; r < n; r++)
        tg[r] = (int)(gu_next(&t->rng) % Vl);
    struct dp L = dp_rand(t, (size_t)n * Vl, -8, 8), T = dp_ints(t, tg, n), mx = dp_nan(t, n);
    struct dp s1 = dp_make(t, NULL, 2 * n * 8), s2 = dp_make(t, NULL, 2 * n * 8);
    if (t->bad)
        return 1;
    int k = 1;
    kdev *d = t->d[1];
    CK(kdev_attention_forward(d, FP(a.out, k), FP(a.lse, k), FP(a.q, k), FP(a.k, k), FP(a.v, k),
                              IP(a.cu, k), nseq, a.maxlen, a.N, Hq, Hkv, D, 1));
    struct dp *gs[2] = {g1, g2};
    for (int run = 0; run < 2; run++)
        CK(kdev_attention_backward(d, FP(gs[run][0], k), FP(gs[run][1], k), FP(gs[run][2], k),
                                   FP(a.dout, k), FP(a.q, k), FP(a.k, k), FP(a.v, k),
                                   FP(a.out, k), FP(a.lse, k), IP(a.cu, k), nseq, a.maxlen,
                                   a.N, Hq, Hkv, D, 1));
    CK(kdev_ce_rowmax(d, FP(mx, k), FP(L, k), n, Vl));
    CK(kdev_ce_rowsum(d, DBP(s1, k), FP(L, k), FP(mx, k), IP(T, k), 0, n, Vl));
    CK(kdev_ce_rowsum(d, DBP(s2, k), FP(L, k), FP(mx, k), IP(T, k), 0, n, Vl));
    double q1, q2;
    CK(kdev_sumsq(d, &q1, FP(L, k), (size_t)n * Vl));
    CK(kdev_sumsq(d, &q2, FP(L, k), (size_t)n * Vl));
    if (t->bad)
        return 1;
    f += same_gpu(t, "att.dq", g1[0], g2[0]) + same_gpu(t, "att.dk", g1[1], g2[1]);
    f += same_gpu(t, "att.dv", g1[2], g2[2]) + same_gpu(t, "ce_rowsum", s1, s2);
    int sq = memcmp(&q1, &q2, sizeof q1) != 0;
    gu_note(t, " sumsq=%s", sq ? "DIFF" : "same");
    return f + sq + t->bad;
}

static int test_errors(struct tctx *t)
{
    int f = 0;
    kdev *d = t->d[1];
    struct dp x = dp_rand(t, 64, -1, 1);
    int cu[2] = {0, 1};
    struct dp CU = dp_ints(t, cu, 2);
    if (t->bad)
        return 1;
    int rc = kdev_attention_forward(d, FP(x, 1), FP(x, 1), FP(x, 1), FP(x, 1), FP(x, 1),
                                    IP(CU, 1), 1, 1, 1, 1, 1, 600, 0);
    gu_note(t, " D600=%d \"%s\"", rc, kdev_errmsg(d));
    if (rc != HERR_ARG || !strstr(kdev_errmsg(d), "attention_forward")) {
        printf("# attention_forward D=600: rc %d, message \"%s\"\n", rc, kdev_errmsg(d));
        f++;
    }
    kdev_status_clear(d);
    /* the device still works after a refused call */
    float h[64];
    if (kdev_download(d, h, x.p[1], sizeof h) || kdev_sync(d)) {
        printf("# after the refused call: %s\n", kdev_errmsg(d));
        f++;
    }
    return f;
}

/* ---- main ------------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    int (*fn)(struct tctx *);
} TESTS[] = {
    {"memory", test_memory},
    {"rows", test_rows},
    {"elementwise", test_elementwise},
    {"matmul", test_matmul},
    {"embedding", test_embedding},
    {"norms", test_norms},
    {"rope", test_rope},
    {"activations", test_activations},
    {"attention", test_attention},
    {"attention_block", test_attention_block},
    {"bf16", test_bf16},
    {"act", test_act},
    {"ce", test_ce},
    {"moe", test_moe},
    {"fp8", test_fp8},
    {"fp8_gemm", test_fp8_gemm},
    {"optimizer", test_optimizer},
    {"determinism", test_determinism},
    {"errors", test_errors},
};

/* $HEARTH_CUDA_LIB when set, else build/lib/libhearth_cuda.so of this program's build
 * directory (build/tests/gpu/../../lib). */
static void default_cuda_lib(void)
{
    const char *env = getenv("HEARTH_CUDA_LIB");
    if (env && *env)
        return;
    char exe[PATH_MAX], lib[PATH_MAX + 64];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return;
    *slash = '\0';
    snprintf(lib, sizeof lib, "%s/../../lib/libhearth_cuda.so", exe);
    setenv("HEARTH_CUDA_LIB", lib, 0);
}

int main(void)
{
    static struct tctx t;
    const int ntests = (int)(sizeof TESTS / sizeof TESTS[0]);
    char err[600];
    default_cuda_lib();
    uint64_t seed = gu_seed();
    t.rng = seed;
    int rc = kdev_create(&t.d[1], KDEV_CUDA, err, sizeof err);
    if (rc) {
        const char *why = "";
        if (rc == HERR_DEVICE || gu_device_count(&why) == 0) {
            printf("1..1\nnot ok 1 - kdev cuda backend # SKIP %s\n", err);
            return 0;
        }
        printf("1..1\nnot ok 1 - kdev cuda backend # %s\n", err);
        return 1;
    }
    if ((rc = kdev_create(&t.d[0], KDEV_CPU, err, sizeof err))) {
        printf("1..1\nnot ok 1 - kdev cpu backend # %s\n", err);
        kdev_free(t.d[1]);
        return 1;
    }
    gu_device_line(seed);
    printf("# kdev: %s on \"%s\", library %s\n", kdev_name(t.d[1]), kdev_hw_name(t.d[1]),
           getenv("HEARTH_CUDA_LIB"));
    printf("1..%d\n", ntests);
    int failed = 0;
    for (int i = 0; i < ntests; i++) {
        t.note[0] = 0;
        t_reset(&t);
        int f = TESTS[i].fn(&t);
        printf("%s %d - %s #%s\n", f ? "not ok" : "ok", i + 1, TESTS[i].name, t.note);
        if (f) {
            printf("# replay with HEARTH_SEED=%llu\n", (unsigned long long)seed);
            failed++;
        }
        fflush(stdout);
    }
    t_reset(&t);
    size_t peak, cur;
    kdev_mem_stats(t.d[1], &peak, &cur);
    printf("# cuda device memory: peak %zu bytes, %zu still held\n", peak, cur);
    kdev_free(t.d[0]);
    kdev_free(t.d[1]);
    return failed ? 1 : 0;
}
