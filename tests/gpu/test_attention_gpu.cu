/* test_attention_gpu.cu - kcuda_attention_forward/backward_bf16 (flash attention) against
 * the fp32 CPU reference kcpu_attention_* on fresh random bf16-representable inputs.
 * Plain TAP, one line per (head dim, causal, GQA ratio) with the worst errors as a note;
 * each runs several variable-length batches (length-1 sequences, lengths that are not
 * multiples of the 64-row tiles, exact multiples, several tiles).
 *   forward:  out and lse poisoned (NaN) before the call; out rel L2 <= 1e-2, lse <= 1e-3.
 *   backward: given the reference's out (rounded to bf16) and lse, so that it is tested on
 *             its own; gradients start at 0; dq, dk, dv rel L2 <= 1e-2.
 * Then: accumulation (+=) into random gradients with NULL gradients in two calls,
 * bitwise determinism of two runs, a long causal sequence, argument errors.
 * Without a CUDA device it prints one skipped test and exits 0.  HEARTH_SEED=N replays. */
extern "C" {
#include "kernels.h"
}
#include "tests/gpu/gpu_tap.h"

#define TOL 1e-2
#define TOL_LSE 1e-3

struct tctx {
    kcuda_ctx *k;
    uint64_t rng;
    double worst[5]; /* out, lse, dq, dk, dv: worst relative L2 of the current test */
};

static const char *const names[5] = {"out", "lse", "dq", "dk", "dv"};

/* One attention problem: host inputs and references, device buffers. */
struct prob {
    int nseq, max_seqlen, N, Hq, Hkv, D, causal;
    int cu[16];
    size_t nq, nk; /* elements of q-shaped and k-shaped tensors */
    float *q, *k, *v, *dout, *out, *lse, *outb, *dq, *dk, *dv;
    void *d_q, *d_k, *d_v, *d_dout, *d_out, *d_lse, *d_outb, *d_lseref, *d_dq, *d_dk, *d_dv;
    int *d_cu;
};

static void prob_free(struct prob *p)
{
    float *h[] = {p->q, p->k, p->v, p->dout, p->out, p->lse, p->outb, p->dq, p->dk, p->dv};
    void *d[] = {p->d_q, p->d_k, p->d_v, p->d_dout, p->d_out, p->d_lse, p->d_outb,
                 p->d_lseref, p->d_dq, p->d_dk, p->d_dv, p->d_cu};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
        free(h[i]);
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        cudaFree(d[i]);
    memset(p, 0, sizeof *p);
}

static float *zeros(size_t n) { return (float *)calloc(n, sizeof(float)); }

static float *bf16_round(const float *x, size_t n)
{
    float *r = (float *)malloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++)
        r[i] = gu_from_bf16(gu_to_bf16(x[i]));
    return r;
}

/* Random inputs, the CPU forward and backward (gradients from zero), device copies.
 * 0 on success. */
static int prob_make(struct tctx *t, struct prob *p, const int *lens, int nseq, int Hq,
                     int Hkv, int D, int causal)
{
    memset(p, 0, sizeof *p);
    p->nseq = nseq;
    p->Hq = Hq;
    p->Hkv = Hkv;
    p->D = D;
    p->causal = causal;
    p->cu[0] = 0;
    for (int s = 0; s < nseq; s++) {
        p->cu[s + 1] = p->cu[s] + lens[s];
        if (lens[s] > p->max_seqlen)
            p->max_seqlen = lens[s];
    }
    p->N = p->cu[nseq];
    p->nq = (size_t)p->N * Hq * D;
    p->nk = (size_t)p->N * Hkv * D;
    /* q, k in [-2, 2]: scores of spread ~1.3 after the 1/sqrt(D) scale, so that the
     * softmax is neither flat nor one-hot */
    p->q = gu_rand(&t->rng, p->nq, -2, 2, 1);
    p->k = gu_rand(&t->rng, p->nk, -2, 2, 1);
    p->v = gu_rand(&t->rng, p->nk, -1, 1, 1);
    p->dout = gu_rand(&t->rng, p->nq, -1, 1, 1);
    p->out = zeros(p->nq);
    p->lse = zeros((size_t)p->N * Hq);
    kcpu_attention_forward(p->out, p->lse, p->q, p->k, p->v, p->cu, nseq, Hq, Hkv, D, causal);
    p->outb = bf16_round(p->out, p->nq);
    p->dq = zeros(p->nq);
    p->dk = zeros(p->nk);
    p->dv = zeros(p->nk);
    kcpu_attention_backward(p->dq, p->dk, p->dv, p->dout, p->q, p->k, p->v, p->outb, p->lse,
                            p->cu, nseq, Hq, Hkv, D, causal);
    p->d_q = gu_upload(p->q, p->nq, 1);
    p->d_k = gu_upload(p->k, p->nk, 1);
    p->d_v = gu_upload(p->v, p->nk, 1);
    p->d_dout = gu_upload(p->dout, p->nq, 1);
    p->d_outb = gu_upload(p->outb, p->nq, 1);
    p->d_lseref = gu_upload(p->lse, (size_t)p->N * Hq, 0);
    p->d_out = gu_poisoned(p->nq, 1);
    p->d_lse = gu_poisoned((size_t)p->N * Hq, 0);
    if (gu_ck(cudaMalloc((void **)&p->d_cu, sizeof(int) * (nseq + 1)), "cudaMalloc") ||
        gu_ck(cudaMemcpy(p->d_cu, p->cu, sizeof(int) * (nseq + 1), cudaMemcpyHostToDevice),
              "upload cu_seqlens"))
        return 1;
    return !p->d_q || !p->d_k || !p->d_v || !p->d_dout || !p->d_outb || !p->d_lseref ||
           !p->d_out || !p->d_lse;
}

/* Zero device gradients (fresh buffers each call). */
static int grads_zero(struct prob *p)
{
    cudaFree(p->d_dq);
    cudaFree(p->d_dk);
    cudaFree(p->d_dv);
    p->d_dq = p->d_dk = p->d_dv = NULL;
    if (gu_ck(cudaMalloc(&p->d_dq, p->nq * 2), "cudaMalloc") ||
        gu_ck(cudaMalloc(&p->d_dk, p->nk * 2), "cudaMalloc") ||
        gu_ck(cudaMalloc(&p->d_dv, p->nk * 2), "cudaMalloc"))
        return 1;
    return gu_ck(cudaMemset(p->d_dq, 0, p->nq * 2), "memset") ||
           gu_ck(cudaMemset(p->d_dk, 0, p->nk * 2), "memset") ||
           gu_ck(cudaMemset(p->d_dv, 0, p->nk * 2), "memset");
}

static int rc_ok(struct tctx *t, int rc, const char *what)
{
    return gu_rc_ok(t->k, rc, what);
}

/* Device result vs host reference; records the error under slot `which`.  0 = pass. */
static int check(struct tctx *t, int which, const struct prob *p, const void *dev,
                 const float *ref, size_t n, int bf16, double tol)
{
    float *got = gu_download(dev, n, bf16);
    if (!got) {
        t->worst[which] = INFINITY;
        return 1;
    }
    double err = gu_rel_l2(got, ref, n);
    free(got);
    if (!(err <= t->worst[which]))
        t->worst[which] = isnan(err) ? INFINITY : err;
    if (!(err <= tol)) {
        printf("# %s: relative L2 %.3e > %.0e (N=%d nseq=%d max_seqlen=%d Hq=%d Hkv=%d "
               "D=%d causal=%d)\n",
               names[which], err, tol, p->N, p->nseq, p->max_seqlen, p->Hq, p->Hkv, p->D,
               p->causal);
        return 1;
    }
    return 0;
}

static int run_forward(struct tctx *t, struct prob *p)
{
    int rc = kcuda_attention_forward_bf16(
        t->k, (kcuda_bf16 *)p->d_out, (float *)p->d_lse, (const kcuda_bf16 *)p->d_q,
        (const kcuda_bf16 *)p->d_k, (const kcuda_bf16 *)p->d_v, p->d_cu, p->nseq,
        p->max_seqlen, p->Hq, p->Hkv, p->D, p->causal);
    return rc_ok(t, rc, "attention_forward") ? 0 : 1;
}

static int run_backward_on(struct tctx *t, kcuda_ctx *kc, struct prob *p, void *dq, void *dk,
                           void *dv)
{
    int rc = kcuda_attention_backward_bf16(
        kc, (kcuda_bf16 *)dq, (kcuda_bf16 *)dk, (kcuda_bf16 *)dv,
        (const kcuda_bf16 *)p->d_dout, (const kcuda_bf16 *)p->d_q, (const kcuda_bf16 *)p->d_k,
        (const kcuda_bf16 *)p->d_v, (const kcuda_bf16 *)p->d_outb, (const float *)p->d_lseref,
        p->d_cu, p->nseq, p->max_seqlen, p->Hq, p->Hkv, p->D, p->causal);
    if (rc < 0) {
        printf("# attention_backward returned %d: %s\n", rc, kcuda_ctx_errmsg(kc));
        return 1;
    }
    return rc_ok(t, rc, "attention_backward") ? 0 : 1;
}

static int run_backward(struct tctx *t, struct prob *p, void *dq, void *dk, void *dv)
{
    return run_backward_on(t, t->k, p, dq, dk, dv);
}

/* Forward and backward of one batch, compared with the reference. */
static int run_case(struct tctx *t, const int *lens, int nseq, int Hq, int Hkv, int D,
                    int causal)
{
    struct prob p;
    int fail = prob_make(t, &p, lens, nseq, Hq, Hkv, D, causal);
    if (fail) {
        printf("# setup failed\n");
        prob_free(&p);
        return 1;
    }
    if (run_forward(t, &p)) {
        prob_free(&p);
        return 1;
    }
    fail |= check(t, 0, &p, p.d_out, p.out, p.nq, 1, TOL);
    fail |= check(t, 1, &p, p.d_lse, p.lse, (size_t)p.N * Hq, 0, TOL_LSE);
    if (grads_zero(&p) || run_backward(t, &p, p.d_dq, p.d_dk, p.d_dv)) {
        prob_free(&p);
        return 1;
    }
    fail |= check(t, 2, &p, p.d_dq, p.dq, p.nq, 1, TOL);
    fail |= check(t, 3, &p, p.d_dk, p.dk, p.nk, 1, TOL);
    fail |= check(t, 4, &p, p.d_dv, p.dv, p.nk, 1, TOL);
    prob_free(&p);
    return fail;
}

/* Variable-length batches: length-1 sequences, non-multiples of 64, exact multiples,
 * sequences of several tiles. */
static const int batch0[] = {1, 17, 64, 130, 1, 97};
static const int batch1[] = {200, 1, 63, 65};
static const int batch2[] = {128, 129};
#define NB(a) ((int)(sizeof(a) / sizeof(a)[0]))

struct acase {
    int D, causal, ratio;
};

static int t_case(struct tctx *t, const struct acase *c)
{
    /* kv heads: 2 for ratios 1 and 2 (so that several kv heads are tested), 1 for 8 */
    int Hkv = c->ratio == 8 ? 1 : 2, Hq = Hkv * c->ratio, fail = 0;
    fail |= run_case(t, batch0, NB(batch0), Hq, Hkv, c->D, c->causal);
    fail |= run_case(t, batch1, NB(batch1), Hq, Hkv, c->D, c->causal);
    fail |= run_case(t, batch2, NB(batch2), Hq, Hkv, c->D, c->causal);
    return fail;
}

/* One long causal sequence (16 tiles) next to a short one, GQA 4. */
static int t_long(struct tctx *t)
{
    static const int lens[] = {1000, 37};
    return run_case(t, lens, 2, 4, 1, 128, 1);
}

/* Backward adds into random gradients; dq+dv in one call and dk alone in another (NULL
 * gradients) give init + the full gradient.  On a context whose 64 KiB workspace holds
 * delta but no dk/dv partial sums, so that a GQA group is summed inside one block (the
 * other tests, small inputs on the default workspace, split the group's query heads over
 * blocks and add partial sums). */
static int t_accumulate(struct tctx *t)
{
    struct prob p;
    kcuda_ctx *small = NULL;
    char err[256];
    if (kcuda_ctx_create(&small, NULL, 64 << 10, err, sizeof err) < 0) {
        printf("# %s\n", err);
        return 1;
    }
    int fail = prob_make(t, &p, batch0, NB(batch0), 4, 2, 80, 0);
    float *q0 = gu_rand(&t->rng, p.nq, -1, 1, 1), *k0 = gu_rand(&t->rng, p.nk, -1, 1, 1);
    float *v0 = gu_rand(&t->rng, p.nk, -1, 1, 1);
    if (fail || !q0 || !k0 || !v0) {
        free(q0);
        free(k0);
        free(v0);
        prob_free(&p);
        kcuda_ctx_free(small);
        return 1;
    }
    p.d_dq = gu_upload(q0, p.nq, 1);
    p.d_dk = gu_upload(k0, p.nk, 1);
    p.d_dv = gu_upload(v0, p.nk, 1);
    for (size_t i = 0; i < p.nq; i++)
        p.dq[i] += q0[i];
    for (size_t i = 0; i < p.nk; i++) {
        p.dk[i] += k0[i];
        p.dv[i] += v0[i];
    }
    free(q0);
    free(k0);
    free(v0);
    if (!p.d_dq || !p.d_dk || !p.d_dv || run_backward_on(t, small, &p, p.d_dq, NULL, p.d_dv) ||
        run_backward_on(t, small, &p, NULL, p.d_dk, NULL)) {
        prob_free(&p);
        kcuda_ctx_free(small);
        return 1;
    }
    fail |= check(t, 2, &p, p.d_dq, p.dq, p.nq, 1, TOL);
    fail |= check(t, 3, &p, p.d_dk, p.dk, p.nk, 1, TOL);
    fail |= check(t, 4, &p, p.d_dv, p.dv, p.nk, 1, TOL);
    prob_free(&p);
    kcuda_ctx_free(small);
    return fail;
}

static int same_bits(const void *a, const void *b, size_t bytes)
{
    void *ha = malloc(bytes), *hb = malloc(bytes);
    int same = gu_ck(cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost), "download") == 0 &&
               gu_ck(cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost), "download") == 0 &&
               memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return same;
}

/* Two runs give the same bits (no atomics, fixed orders). */
static int t_deterministic(struct tctx *t)
{
    struct prob p;
    void *d1[5] = {NULL, NULL, NULL, NULL, NULL};
    int fail = prob_make(t, &p, batch1, NB(batch1), 8, 1, 128, 1);
    if (!fail)
        fail = run_forward(t, &p);
    if (!fail) {
        d1[0] = p.d_out;
        d1[1] = p.d_lse;
        p.d_out = gu_poisoned(p.nq, 1);
        p.d_lse = gu_poisoned((size_t)p.N * p.Hq, 0);
        fail = !p.d_out || !p.d_lse || run_forward(t, &p);
    }
    if (!fail)
        fail = grads_zero(&p) || run_backward(t, &p, p.d_dq, p.d_dk, p.d_dv);
    if (!fail) {
        d1[2] = p.d_dq, d1[3] = p.d_dk, d1[4] = p.d_dv;
        p.d_dq = p.d_dk = p.d_dv = NULL;
        fail = grads_zero(&p) || run_backward(t, &p, p.d_dq, p.d_dk, p.d_dv);
    }
    if (!fail) {
        const void *d2[5] = {p.d_out, p.d_lse, p.d_dq, p.d_dk, p.d_dv};
        size_t bytes[5] = {p.nq * 2, (size_t)p.N * p.Hq * 4, p.nq * 2, p.nk * 2, p.nk * 2};
        for (int i = 0; i < 5; i++)
            if (!same_bits(d1[i], d2[i], bytes[i])) {
                printf("# %s differs between two runs\n", names[i]);
                fail = 1;
            }
    }
    for (int i = 0; i < 5; i++)
        cudaFree(d1[i]);
    prob_free(&p);
    return fail;
}

/* Unsupported shapes and a too-small workspace are errors, not launches. */
static int t_errors(struct tctx *t)
{
    static const int lens[] = {5};
    struct prob p;
    int fail = prob_make(t, &p, lens, 1, 2, 2, 64, 0);
    if (fail) {
        prob_free(&p);
        return 1;
    }
    const kcuda_bf16 *q = (const kcuda_bf16 *)p.d_q, *k = (const kcuda_bf16 *)p.d_k;
    const kcuda_bf16 *v = (const kcuda_bf16 *)p.d_v;
    kcuda_bf16 *o = (kcuda_bf16 *)p.d_out;
    float *l = (float *)p.d_lse;
    int r1 = kcuda_attention_forward_bf16(t->k, o, l, q, k, v, p.d_cu, 1, 5, 2, 2, 96, 0);
    int r2 = kcuda_attention_forward_bf16(t->k, o, l, q, k, v, p.d_cu, 1, 5, 3, 2, 64, 0);
    int r3 = kcuda_attention_forward_bf16(t->k, o, l, q + 1, k, v, p.d_cu, 1, 5, 2, 2, 64, 0);
    if (r1 != KCUDA_EARG || r2 != KCUDA_EARG || r3 != KCUDA_EARG) {
        printf("# expected KCUDA_EARG: D=96 -> %d, Hq%%Hkv -> %d, misaligned -> %d\n", r1, r2,
               r3);
        fail = 1;
    }
    kcuda_ctx *small = NULL;
    char err[256];
    if (kcuda_ctx_create(&small, NULL, 16, err, sizeof err) < 0) {
        printf("# %s\n", err);
        fail = 1;
    } else {
        int r4 = grads_zero(&p) ? 0
                                : kcuda_attention_backward_bf16(
                                      small, (kcuda_bf16 *)p.d_dq, NULL, NULL,
                                      (const kcuda_bf16 *)p.d_dout, q, k, v,
                                      (const kcuda_bf16 *)p.d_outb, (const float *)p.d_lseref,
                                      p.d_cu, 1, 5, 2, 2, 64, 0);
        if (r4 != KCUDA_ENOMEM) {
            printf("# 16-byte workspace: expected KCUDA_ENOMEM, got %d\n", r4);
            fail = 1;
        }
        kcuda_ctx_free(small);
    }
    prob_free(&p);
    return fail;
}

int main(void)
{
    if (gu_skip_without_device("gpu attention"))
        return 0;
    static const int dims[] = {64, 80, 128}, ratios[] = {1, 2, 8};
    struct acase cases[18];
    int ncases = 0;
    for (int d = 0; d < 3; d++)
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < 3; r++, ncases++) {
                cases[ncases].D = dims[d];
                cases[ncases].causal = c;
                cases[ncases].ratio = ratios[r];
            }
    struct tctx t;
    memset(&t, 0, sizeof t);
    uint64_t seed = gu_seed();
    t.rng = seed;
    gu_device_line(seed);
    static const char *const extra[] = {"long causal D=128 GQA 4",
                                        "backward accumulates, NULL grads, unsplit GQA",
                                        "deterministic", "argument errors"};
    int (*const extra_fn[])(struct tctx *) = {t_long, t_accumulate, t_deterministic, t_errors};
    int ntests = ncases + 4;
    char err[256];
    int rc = kcuda_ctx_create(&t.k, NULL, 0, err, sizeof err);
    printf("1..%d\n", ntests);
    if (rc < 0) {
        printf("# %s\n", err);
        for (int i = 0; i < ntests; i++)
            printf("not ok %d - attention\n", i + 1);
        return 1;
    }
    int failed = 0;
    for (int i = 0; i < ntests; i++) {
        char name[96], note[160] = "";
        for (int w = 0; w < 5; w++)
            t.worst[w] = -1;
        int f;
        if (i < ncases) {
            const struct acase *c = &cases[i];
            snprintf(name, sizeof name, "attention D=%d %s GQA %d", c->D,
                     c->causal ? "causal" : "bidirectional", c->ratio);
            f = t_case(&t, c);
        } else {
            snprintf(name, sizeof name, "attention %s", extra[i - ncases]);
            f = extra_fn[i - ncases](&t);
        }
        for (int w = 0; w < 5; w++)
            if (t.worst[w] >= 0) {
                size_t len = strlen(note);
                snprintf(note + len, sizeof note - len, " %s=%.2e", names[w], t.worst[w]);
            }
        printf("%s %d - %s #%s\n", f ? "not ok" : "ok", i + 1, name, note);
        if (f) {
            printf("# replay with HEARTH_SEED=%llu\n", (unsigned long long)seed);
            failed++;
        }
        fflush(stdout);
    }
    kcuda_ctx_free(t.k);
    return failed ? 1 : 0;
}
