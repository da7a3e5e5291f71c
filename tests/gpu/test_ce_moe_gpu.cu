/* test_ce_moe_gpu.cu - the fused bf16 cross-entropy (kernels/cuda/ce_fused.cu) and the
 * mixture-of-experts kernels (kernels/cuda/moe.cu) against the fp32 CPU reference
 * (kcpu_crossentropy_*, kcpu_moe_*, kcpu_matmul_*, kcpu_swiglu_*) on fresh random inputs.
 * Plain TAP, one line per test with the errors as a diagnostic.  Outputs are poisoned
 * (all bits set: NaN, or -1 for integers) so that an unwritten element fails; gradients
 * that accumulate (+=) start from random values.  Integer outputs (top-k indices, the
 * plan) must match exactly: the router logits are generated without near-ties.
 * Tolerances: bf16 storage relative L2 <= 1e-2, fp32 <= 1e-5.
 * Without a CUDA device it prints one skipped test and exits 0.  HEARTH_SEED=N replays. */
extern "C" {
#include "kernels.h"
}
#include "tests/gpu/gpu_tap.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-5
#define IGNORE (-1)

struct tctx {
    kcuda_ctx *k;
    uint64_t rng;
    char note[768];
};

/* Relative L2 of a host result against the reference; 0 = pass. */
static int cmp_host(struct tctx *t, const char *what, const float *got, const float *ref,
                    size_t n, double tol)
{
    double err = gu_rel_l2(got, ref, n);
    gu_note(t, " %s=%.2e", what, err);
    if (!(err <= tol)) {
        printf("# %s: relative L2 %.3e > %.0e\n", what, err, tol);
        return 1;
    }
    return 0;
}

/* Downloads a device result and compares it; 0 = pass. */
static int check(struct tctx *t, const char *what, const void *dev, const float *ref, size_t n,
                 int bf16)
{
    float *got = gu_download(dev, n, bf16);
    if (!got) {
        printf("# %s: download failed\n", what);
        return 1;
    }
    int f = cmp_host(t, what, got, ref, n, bf16 ? TOL_BF16 : TOL_F32);
    free(got);
    return f;
}

static int *ipoisoned(struct gu_pool *p, size_t n)
{
    return (int *)gu_pd(p, gu_poisoned(n, 0)); /* 0xffffffff = -1 */
}

static int *idownload(struct gu_pool *p, const int *d, size_t n)
{
    int *h = (int *)gu_ph(p, malloc(n * sizeof(int)));
    if (gu_ck(cudaDeviceSynchronize(), "sync") ||
        gu_ck(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost), "download int"))
        return NULL;
    return h;
}

static int icmp(const char *what, const int *got, const int *ref, size_t n)
{
    if (!got)
        return 1;
    for (size_t i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            printf("# %s[%zu] = %d, want %d\n", what, i, got[i], ref[i]);
            return 1;
        }
    return 0;
}

/* Byte equality of two device buffers (determinism). */
static int same_bytes(const char *what, const void *a, const void *b, size_t bytes)
{
    unsigned char *x = (unsigned char *)malloc(bytes), *y = (unsigned char *)malloc(bytes);
    int bad = gu_ck(cudaDeviceSynchronize(), "sync") ||
              gu_ck(cudaMemcpy(x, a, bytes, cudaMemcpyDeviceToHost), "download") ||
              gu_ck(cudaMemcpy(y, b, bytes, cudaMemcpyDeviceToHost), "download") ||
              memcmp(x, y, bytes) != 0;
    if (bad)
        printf("# %s: two runs differ\n", what);
    free(x);
    free(y);
    return bad;
}

static int rc_ok(struct tctx *t, int rc, const char *what)
{
    return gu_rc_ok(t->k, rc, what);
}

/* ---- cross-entropy -------------------------------------------------------------------- */

/* bf16 logits: uniform in [-8,8) plus a per-row shift in [-40,40) (stability). */
static float *ce_logits(struct tctx *t, int N, int V)
{
    float *l = gu_rand(&t->rng, (size_t)N * V, -8, 8, 0);
    for (int i = 0; i < N; i++) {
        float sh = gu_uniform(&t->rng, -40, 40);
        for (int j = 0; j < V; j++) {
            float *x = l + (size_t)i * V + j;
            *x = gu_from_bf16(gu_to_bf16(*x + sh));
        }
    }
    return l;
}

/* Targets in [0,V), with a few ignored rows and (when bad) one invalid target. */
static int *ce_targets(struct tctx *t, int N, int V, int bad)
{
    int *tg = (int *)malloc(N * sizeof(int));
    for (int i = 0; i < N; i++)
        tg[i] = (int)(gu_next(&t->rng) % (uint64_t)V);
    for (int i = 1; i < N; i += 4)
        tg[i] = IGNORE;
    if (bad && N > 2)
        tg[N - 1] = V + 5;
    return tg;
}

static int t_ce(struct tctx *t)
{
    static const int shapes[][2] = {{9, 151936}, {67, 1024}, {5, 7}, {33, 1001}, {4, 8}};
    int fail = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], V = shapes[s][1];
        size_t nv = (size_t)N * V;
        struct gu_pool p = {};
        float *l = (float *)gu_ph(&p, ce_logits(t, N, V));
        float *dloss = (float *)gu_ph(&p, gu_rand(&t->rng, N, 0.1f, 2, 0));
        int *tg = (int *)gu_ph(&p, ce_targets(t, N, V, 1));
        float *rloss = gu_hzeros(&p, N), *rlse = gu_hzeros(&p, N), *rdl = gu_hzeros(&p, nv);
        kcpu_crossentropy_forward(rloss, l, tg, N, V, IGNORE);
        kcpu_crossentropy_backward(rdl, l, tg, dloss, N, V, IGNORE);
        for (int i = 0; i < N; i++)
            rlse[i] = (tg[i] >= 0 && tg[i] < V) ? rloss[i] + l[(size_t)i * V + tg[i]] : 0.0f;
        /* logits at an odd element offset as well: other row alignments */
        kcuda_bf16 *d_lbuf = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(nv + 8, 1));
        void *d_l = gu_pd(&p, gu_upload(l, nv, 1));
        void *d_dloss = gu_pd(&p, gu_upload(dloss, N, 0));
        int *d_tg = gu_iupload(&p, tg, N);
        float *d_loss = (float *)gu_pd(&p, gu_poisoned(N, 0)), *d_lse = (float *)gu_pd(&p, gu_poisoned(N, 0));
        kcuda_bf16 *d_dl = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(nv, 1));
        kcuda_bf16 *d_dl2 = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(nv + 8, 1));
        if (!d_lbuf || !d_l || !d_dloss || !d_tg || !d_loss || !d_lse || !d_dl || !d_dl2 ||
            gu_ck(cudaMemcpy(d_lbuf + 3, d_l, nv * 2, cudaMemcpyDeviceToDevice), "copy")) {
            gu_pool_free(&p);
            return 1;
        }
        const kcuda_bf16 *L = (const kcuda_bf16 *)d_l;
        int ok = rc_ok(t, kcuda_ce_forward_bf16(t->k, d_loss, d_lse, L, d_tg, N, V, IGNORE),
                       "ce_forward");
        ok = ok && rc_ok(t, kcuda_ce_backward_bf16(t->k, d_dl, L, d_lse, d_tg,
                                                   (const float *)d_dloss, N, V, IGNORE),
                         "ce_backward");
        if (!ok) {
            gu_pool_free(&p);
            return 1;
        }
        float *got = (float *)gu_ph(&p, gu_download(d_loss, N, 0));
        float *glse = (float *)gu_ph(&p, gu_download(d_lse, N, 0));
        if (!got || !glse) {
            gu_pool_free(&p);
            return 1;
        }
        for (int i = 0; i < N; i++) {
            int cls = tg[i] == IGNORE ? 1 : (tg[i] < 0 || tg[i] >= V) ? 2 : 0;
            if ((cls == 1 && (got[i] != 0.0f || glse[i] != 0.0f)) ||
                (cls == 2 && (!isnan(got[i]) || !isnan(rloss[i])))) {
                printf("# V=%d row %d (%s): loss %g lse %g\n", V, i,
                       cls == 1 ? "ignored" : "invalid", got[i], glse[i]);
                fail = 1;
            }
            if (cls == 2)
                got[i] = rloss[i] = 0.0f; /* compare the rest */
        }
        char nm[64];
        snprintf(nm, sizeof nm, "loss[%dx%d]", N, V);
        fail |= cmp_host(t, nm, got, rloss, N, TOL_F32);
        fail |= cmp_host(t, "lse", glse, rlse, N, TOL_F32);
        fail |= check(t, "dlogits", d_dl, rdl, nv, 1);

        /* the logits at an element offset of 3 (other row alignments): the forward
         * within tolerance (its reduction order differs); the backward from the same lse
         * out of place into a buffer of another alignment (the scalar path) and in place
         * (the vector path) must equal the aligned result bit for bit */
        const kcuda_bf16 *L3 = d_lbuf + 3;
        float *d_loss3 = (float *)gu_pd(&p, gu_poisoned(N, 0)), *d_lse3 = (float *)gu_pd(&p, gu_poisoned(N, 0));
        ok = d_loss3 && d_lse3 &&
             rc_ok(t, kcuda_ce_forward_bf16(t->k, d_loss3, d_lse3, L3, d_tg, N, V, IGNORE),
                   "ce_forward(offset 3)");
        float *g3 = ok ? (float *)gu_ph(&p, gu_download(d_loss3, N, 0)) : NULL;
        if (!g3) {
            gu_pool_free(&p);
            return 1;
        }
        for (int i = 0; i < N; i++)
            if (isnan(rloss[i]) || (tg[i] >= V && isnan(g3[i])))
                g3[i] = rloss[i] = 0.0f;
        fail |= cmp_host(t, "loss(offset 3)", g3, rloss, N, TOL_F32);
        ok = rc_ok(t, kcuda_ce_backward_bf16(t->k, d_dl2, L3, d_lse, d_tg,
                                             (const float *)d_dloss, N, V, IGNORE),
                   "ce_backward(offset 3 -> 0)");
        fail |= !ok || same_bytes("dlogits misaligned out of place", d_dl2, d_dl, nv * 2);
        ok = rc_ok(t, kcuda_ce_backward_bf16(t->k, d_lbuf + 3, L3, d_lse, d_tg,
                                             (const float *)d_dloss, N, V, IGNORE),
                   "ce_backward(in place)");
        fail |= !ok || same_bytes("dlogits in place", d_lbuf + 3, d_dl, nv * 2);
        gu_pool_free(&p);
    }
    return fail;
}

/* Forward and backward twice: the same bits. */
static int t_ce_determinism(struct tctx *t)
{
    int N = 64, V = 151936;
    size_t nv = (size_t)N * V;
    struct gu_pool p = {};
    float *l = (float *)gu_ph(&p, ce_logits(t, N, V));
    float *dloss = (float *)gu_ph(&p, gu_rand(&t->rng, N, 0.1f, 2, 0));
    int *tg = (int *)gu_ph(&p, ce_targets(t, N, V, 0));
    void *d_l = gu_pd(&p, gu_upload(l, nv, 1)), *d_dloss = gu_pd(&p, gu_upload(dloss, N, 0));
    int *d_tg = gu_iupload(&p, tg, N);
    float *lo[2], *ls[2];
    kcuda_bf16 *dl[2];
    for (int r = 0; r < 2; r++) {
        lo[r] = (float *)gu_pd(&p, gu_poisoned(N, 0));
        ls[r] = (float *)gu_pd(&p, gu_poisoned(N, 0));
        dl[r] = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(nv, 1));
    }
    int fail = !d_l || !d_dloss || !d_tg || !lo[1] || !ls[1] || !dl[1];
    for (int r = 0; !fail && r < 2; r++) {
        fail |= !rc_ok(t, kcuda_ce_forward_bf16(t->k, lo[r], ls[r], (const kcuda_bf16 *)d_l, d_tg,
                                                N, V, IGNORE), "ce_forward");
        fail |= !rc_ok(t, kcuda_ce_backward_bf16(t->k, dl[r], (const kcuda_bf16 *)d_l, ls[r], d_tg,
                                                 (const float *)d_dloss, N, V, IGNORE),
                       "ce_backward");
    }
    if (!fail) {
        fail |= same_bytes("losses", lo[0], lo[1], N * 4);
        fail |= same_bytes("lse", ls[0], ls[1], N * 4);
        fail |= same_bytes("dlogits", dl[0], dl[1], nv * 2);
    }
    gu_note(t, " N=%d V=%d", N, V);
    gu_pool_free(&p);
    return fail;
}

/* The vocabulary split in R uneven slices: partials, combine, backward per slice. */
static int t_ce_vocab(struct tctx *t)
{
    int N = 13, V = 151936, R = 3, fail = 0;
    int v0s[4] = {0, 50001, 100000, V};
    size_t nv = (size_t)N * V;
    struct gu_pool p = {};
    float *l = (float *)gu_ph(&p, ce_logits(t, N, V));
    float *dloss = (float *)gu_ph(&p, gu_rand(&t->rng, N, 0.1f, 2, 0));
    int *tg = (int *)gu_ph(&p, ce_targets(t, N, V, 1));
    tg[0] = 50000; /* targets at the slice edges */
    tg[2] = 50001;
    tg[3] = V - 1;
    float *rloss = gu_hzeros(&p, N), *rdl = gu_hzeros(&p, nv);
    kcpu_crossentropy_forward(rloss, l, tg, N, V, IGNORE);
    kcpu_crossentropy_backward(rdl, l, tg, dloss, N, V, IGNORE);
    void *d_l = gu_pd(&p, gu_upload(l, nv, 1)), *d_dloss = gu_pd(&p, gu_upload(dloss, N, 0));
    int *d_tg = gu_iupload(&p, tg, N);
    float *d_max = (float *)gu_pd(&p, gu_poisoned((size_t)R * N, 0));
    float *d_sum = (float *)gu_pd(&p, gu_poisoned((size_t)R * N, 0));
    float *d_tl = (float *)gu_pd(&p, gu_poisoned((size_t)R * N, 0));
    float *d_loss = (float *)gu_pd(&p, gu_poisoned(N, 0)), *d_lse = (float *)gu_pd(&p, gu_poisoned(N, 0));
    kcuda_bf16 *d_slice[3], *d_dslice[3];
    if (!d_l || !d_dloss || !d_tg || !d_max || !d_sum || !d_tl || !d_loss || !d_lse) {
        gu_pool_free(&p);
        return 1;
    }
    for (int r = 0; r < R; r++) {
        int Vs = v0s[r + 1] - v0s[r];
        d_slice[r] = (kcuda_bf16 *)gu_pd(&p, gu_poisoned((size_t)N * Vs, 1));
        d_dslice[r] = (kcuda_bf16 *)gu_pd(&p, gu_poisoned((size_t)N * Vs, 1));
        if (!d_slice[r] || !d_dslice[r] ||
            gu_ck(cudaMemcpy2D(d_slice[r], (size_t)Vs * 2, (kcuda_bf16 *)d_l + v0s[r],
                               (size_t)V * 2, (size_t)Vs * 2, N, cudaMemcpyDeviceToDevice),
                  "slice")) {
            gu_pool_free(&p);
            return 1;
        }
        fail |= !rc_ok(t, kcuda_ce_vocab_partial_bf16(t->k, d_max + (size_t)r * N,
                                                      d_sum + (size_t)r * N, d_tl + (size_t)r * N,
                                                      d_slice[r], d_tg, N, V, v0s[r], Vs, IGNORE),
                       "ce_vocab_partial");
    }
    fail |= !rc_ok(t, kcuda_ce_vocab_combine(t->k, d_loss, d_lse, d_max, d_sum, d_tl, d_tg, N, V,
                                             R, IGNORE), "ce_vocab_combine");
    for (int r = 0; !fail && r < R; r++) {
        int Vs = v0s[r + 1] - v0s[r];
        fail |= !rc_ok(t, kcuda_ce_vocab_backward_bf16(t->k, d_dslice[r], d_slice[r], d_lse, d_tg,
                                                       (const float *)d_dloss, N, V, v0s[r], Vs,
                                                       IGNORE), "ce_vocab_backward");
    }
    if (fail) {
        gu_pool_free(&p);
        return 1;
    }
    float *got = (float *)gu_ph(&p, gu_download(d_loss, N, 0));
    if (!got) {
        gu_pool_free(&p);
        return 1;
    }
    if (!isnan(got[N - 1])) {
        printf("# invalid target: loss %g, want NaN\n", got[N - 1]);
        fail = 1;
    }
    got[N - 1] = rloss[N - 1] = 0.0f;
    fail |= cmp_host(t, "loss", got, rloss, N, TOL_F32);
    /* the slices' gradients side by side = the full gradient */
    float *gdl = gu_hzeros(&p, nv);
    for (int r = 0; r < R; r++) {
        int Vs = v0s[r + 1] - v0s[r];
        float *g = gu_download(d_dslice[r], (size_t)N * Vs, 1);
        if (!g) {
            gu_pool_free(&p);
            return 1;
        }
        for (int i = 0; i < N; i++)
            memcpy(gdl + (size_t)i * V + v0s[r], g + (size_t)i * Vs, (size_t)Vs * 4);
        free(g);
    }
    fail |= cmp_host(t, "dlogits", gdl, rdl, nv, TOL_BF16);
    gu_pool_free(&p);
    return fail;
}

/* ---- MoE router ----------------------------------------------------------------------- */

/* Router logits without near-ties: each token's E logits are a random permutation of
 * 0.07 * e (plus jitter below 0.01 and a per-token shift), so the probabilities of any
 * two experts differ by more than 5 %. */
static float *router_logits(struct tctx *t, int N, int E)
{
    float *z = (float *)malloc((size_t)N * E * sizeof *z);
    int *perm = (int *)malloc(E * sizeof *perm);
    for (int i = 0; i < N; i++) {
        for (int e = 0; e < E; e++)
            perm[e] = e;
        for (int e = E - 1; e > 0; e--) {
            int j = (int)(gu_next(&t->rng) % (uint64_t)(e + 1)), x = perm[e];
            perm[e] = perm[j];
            perm[j] = x;
        }
        float sh = gu_uniform(&t->rng, -3, 3);
        for (int e = 0; e < E; e++)
            z[(size_t)i * E + e] = sh + 0.07f * perm[e] + gu_uniform(&t->rng, 0, 0.01f);
    }
    free(perm);
    return z;
}

static int t_router(struct tctx *t)
{
    static const int shapes[][3] = {{333, 64, 8}, {100, 40, 3}, {57, 128, 1}, {20, 7, 7}};
    int fail = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], E = shapes[s][1], K = shapes[s][2];
        size_t ne = (size_t)N * E, nk = (size_t)N * K;
        struct gu_pool p = {};
        float *z = (float *)gu_ph(&p, router_logits(t, N, E));
        int *ridx = (int *)gu_ph(&p, malloc(nk * sizeof(int)));
        float *rw = gu_hzeros(&p, nk), *rp = gu_hzeros(&p, ne), raux = 0;
        kcpu_moe_router_forward(ridx, rw, rp, &raux, z, N, E, K);
        int *rcnt = (int *)gu_ph(&p, calloc(E, sizeof(int)));
        for (size_t i = 0; i < nk; i++)
            rcnt[ridx[i]]++;
        float *dw = (float *)gu_ph(&p, gu_rand(&t->rng, nk, -1, 1, 0));
        float *dz0 = (float *)gu_ph(&p, gu_rand(&t->rng, ne, -1, 1, 0));
        float daux = 0.37f;
        float *rdz = gu_hcopy(&p, dz0, ne), *rdz2 = gu_hcopy(&p, dz0, ne);
        kcpu_moe_router_backward(rdz, dw, daux, rp, ridx, rw, N, E, K);
        kcpu_moe_router_backward(rdz2, NULL, daux, rp, ridx, rw, N, E, K);

        float *d_z = (float *)gu_pd(&p, gu_upload(z, ne, 0));
        int *d_idx = ipoisoned(&p, nk), *d_cnt = ipoisoned(&p, E);
        float *d_w = (float *)gu_pd(&p, gu_poisoned(nk, 0)), *d_p = (float *)gu_pd(&p, gu_poisoned(ne, 0));
        float *d_aux = (float *)gu_pd(&p, gu_poisoned(1, 0));
        float *d_dw = (float *)gu_pd(&p, gu_upload(dw, nk, 0));
        float *d_dz = (float *)gu_pd(&p, gu_upload(dz0, ne, 0)), *d_dz2 = (float *)gu_pd(&p, gu_upload(dz0, ne, 0));
        if (!d_z || !d_idx || !d_cnt || !d_w || !d_p || !d_aux || !d_dw || !d_dz || !d_dz2) {
            gu_pool_free(&p);
            return 1;
        }
        int ok = rc_ok(t, kcuda_moe_router_forward(t->k, d_idx, d_w, d_p, d_cnt, d_aux, d_z, N,
                                                   E, K), "router_forward");
        ok = ok && rc_ok(t, kcuda_moe_router_backward(t->k, d_dz, d_dw, daux, d_p, d_idx, d_w,
                                                      d_cnt, N, E, K), "router_backward");
        ok = ok && rc_ok(t, kcuda_moe_router_backward(t->k, d_dz2, NULL, daux, d_p, d_idx, d_w,
                                                      d_cnt, N, E, K), "router_backward(aux)");
        if (!ok) {
            gu_pool_free(&p);
            return 1;
        }
        char nm[64];
        snprintf(nm, sizeof nm, "topk_idx[%d,%d,%d]", N, E, K);
        fail |= icmp(nm, idownload(&p, d_idx, nk), ridx, nk);
        fail |= icmp("counts", idownload(&p, d_cnt, E), rcnt, E);
        gu_note(t, " [N%d E%d K%d]", N, E, K);
        fail |= check(t, "probs", d_p, rp, ne, 0);
        fail |= check(t, "topk_w", d_w, rw, nk, 0);
        fail |= check(t, "aux", d_aux, &raux, 1, 0);
        fail |= check(t, "dlogits", d_dz, rdz, ne, 0);
        fail |= check(t, "dlogits_aux", d_dz2, rdz2, ne, 0);
        gu_pool_free(&p);
    }
    return fail;
}

/* ---- plan, permute, unpermute ----------------------------------------------------------- */

/* K distinct experts per token, uniformly at random (the plan does not need ties-free). */
static int *random_topk(struct tctx *t, int N, int E, int K)
{
    int *idx = (int *)malloc((size_t)N * K * sizeof(int));
    for (int i = 0; i < N; i++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = (int)(gu_next(&t->rng) % (uint64_t)E);
                dup = 0;
                for (int q = 0; q < j; q++)
                    dup |= idx[(size_t)i * K + q] == e;
            } while (dup);
            idx[(size_t)i * K + j] = e;
        }
    return idx;
}

static int t_plan(struct tctx *t)
{
    static const int shapes[][3] = {{1000, 64, 8}, {300, 1000, 4}, {7, 3, 2}, {4096, 128, 6}};
    int fail = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], E = shapes[s][1], K = shapes[s][2];
        size_t nk = (size_t)N * K;
        struct gu_pool p = {};
        int *idx = (int *)gu_ph(&p, random_topk(t, N, E, K));
        if (s == 3) /* a skewed load: expert 5 takes every first slot */
            for (int i = 0; i < N; i++)
                for (int j = 0; j < K; j++)
                    if (idx[(size_t)i * K + j] == 5)
                        idx[(size_t)i * K + j] = idx[(size_t)i * K], idx[(size_t)i * K] = 5;
        int *roff = (int *)gu_ph(&p, malloc((E + 1) * sizeof(int)));
        int *rsrc = (int *)gu_ph(&p, malloc(nk * sizeof(int))), *rslot = (int *)gu_ph(&p, malloc(nk * sizeof(int)));
        kcpu_moe_plan(roff, rsrc, rslot, idx, N, E, K);
        int *d_idx = gu_iupload(&p, idx, nk), *d_off = ipoisoned(&p, E + 1);
        int *d_src = ipoisoned(&p, nk), *d_slot = ipoisoned(&p, nk);
        if (!d_idx || !d_off || !d_src || !d_slot ||
            !rc_ok(t, kcuda_moe_plan(t->k, d_off, d_src, d_slot, d_idx, N, E, K), "plan")) {
            gu_pool_free(&p);
            return 1;
        }
        fail |= icmp("offsets", idownload(&p, d_off, E + 1), roff, E + 1);
        fail |= icmp("row_src", idownload(&p, d_src, nk), rsrc, nk);
        fail |= icmp("slot_row", idownload(&p, d_slot, nk), rslot, nk);
        gu_note(t, " [N%d E%d K%d]", N, E, K);
        gu_pool_free(&p);
    }
    return fail;
}

static int t_permute(struct tctx *t)
{
    static const int shapes[][4] = {{200, 64, 8, 2048}, {37, 16, 3, 77}, {64, 8, 2, 24}};
    int fail = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], E = shapes[s][1], K = shapes[s][2], C = shapes[s][3];
        size_t nk = (size_t)N * K, nc = (size_t)N * C, rc_ = nk * C;
        struct gu_pool p = {};
        int *idx = (int *)gu_ph(&p, random_topk(t, N, E, K));
        int *off = (int *)gu_ph(&p, malloc((E + 1) * sizeof(int)));
        int *src = (int *)gu_ph(&p, malloc(nk * sizeof(int))), *slot = (int *)gu_ph(&p, malloc(nk * sizeof(int)));
        kcpu_moe_plan(off, src, slot, idx, N, E, K);
        float *x = (float *)gu_ph(&p, gu_rand(&t->rng, nc, -2, 2, 1));
        float *dxp = (float *)gu_ph(&p, gu_rand(&t->rng, rc_, -1, 1, 1));
        float *dx0 = (float *)gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, 1));
        float *eo = (float *)gu_ph(&p, gu_rand(&t->rng, rc_, -2, 2, 1));
        float *w = (float *)gu_ph(&p, gu_rand(&t->rng, nk, 0, 1, 0));
        float *dy = (float *)gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, 1));
        float *deo0 = (float *)gu_ph(&p, gu_rand(&t->rng, rc_, -1, 1, 1));
        float *dw0 = (float *)gu_ph(&p, gu_rand(&t->rng, nk, -1, 1, 0));
        float *rxp = gu_hzeros(&p, rc_), *rdx = gu_hcopy(&p, dx0, nc), *ry = gu_hzeros(&p, nc);
        float *rdeo = gu_hcopy(&p, deo0, rc_), *rdw = gu_hcopy(&p, dw0, nk);
        kcpu_moe_permute_forward(rxp, x, src, N, K, C);
        kcpu_moe_permute_backward(rdx, dxp, src, N, K, C);
        kcpu_moe_unpermute_forward(ry, eo, w, slot, N, K, C);
        kcpu_moe_unpermute_backward(rdeo, rdw, dy, eo, w, slot, N, K, C);
        int *d_src = gu_iupload(&p, src, nk), *d_slot = gu_iupload(&p, slot, nk);
        kcuda_bf16 *d_x = (kcuda_bf16 *)gu_pd(&p, gu_upload(x, nc, 1));
        kcuda_bf16 *d_xp = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(rc_, 1));
        kcuda_bf16 *d_dxp = (kcuda_bf16 *)gu_pd(&p, gu_upload(dxp, rc_, 1));
        kcuda_bf16 *d_dx = (kcuda_bf16 *)gu_pd(&p, gu_upload(dx0, nc, 1));
        kcuda_bf16 *d_eo = (kcuda_bf16 *)gu_pd(&p, gu_upload(eo, rc_, 1));
        float *d_w = (float *)gu_pd(&p, gu_upload(w, nk, 0));
        kcuda_bf16 *d_y = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(nc, 1));
        kcuda_bf16 *d_dy = (kcuda_bf16 *)gu_pd(&p, gu_upload(dy, nc, 1));
        kcuda_bf16 *d_deo = (kcuda_bf16 *)gu_pd(&p, gu_upload(deo0, rc_, 1));
        float *d_dw = (float *)gu_pd(&p, gu_upload(dw0, nk, 0));
        if (!d_src || !d_slot || !d_x || !d_xp || !d_dxp || !d_dx || !d_eo || !d_w || !d_y ||
            !d_dy || !d_deo || !d_dw) {
            gu_pool_free(&p);
            return 1;
        }
        int ok = rc_ok(t, kcuda_moe_permute_forward_bf16(t->k, d_xp, d_x, d_src, N, K, C),
                       "permute_forward");
        ok = ok && rc_ok(t, kcuda_moe_permute_backward_bf16(t->k, d_dx, d_dxp, d_slot, N, K, C),
                         "permute_backward");
        ok = ok && rc_ok(t, kcuda_moe_unpermute_forward_bf16(t->k, d_y, d_eo, d_w, d_slot, N, K,
                                                             C), "unpermute_forward");
        ok = ok && rc_ok(t, kcuda_moe_unpermute_backward_bf16(t->k, d_deo, d_dw, d_dy, d_eo, d_w,
                                                              d_slot, N, K, C),
                         "unpermute_backward");
        if (!ok) {
            gu_pool_free(&p);
            return 1;
        }
        gu_note(t, " [C%d]", C);
        float *gxp = (float *)gu_ph(&p, gu_download(d_xp, rc_, 1));
        if (!gxp || memcmp(gxp, rxp, rc_ * 4) != 0) { /* a copy: exact */
            printf("# permute_forward is not an exact copy\n");
            fail = 1;
        }
        fail |= check(t, "dinp", d_dx, rdx, nc, 1);
        fail |= check(t, "unperm", d_y, ry, nc, 1);
        fail |= check(t, "dexpert", d_deo, rdeo, rc_, 1);
        /* fp32 storage, but dot products of bf16 rows: the bf16 tolerance */
        float *gdw = (float *)gu_ph(&p, gu_download(d_dw, nk, 0));
        fail |= !gdw || cmp_host(t, "dtopk_w", gdw, rdw, nk, TOL_BF16);
        gu_pool_free(&p);
    }
    return fail;
}

/* ---- expert MLPs ------------------------------------------------------------------------ */

static int t_experts(struct tctx *t)
{
    int E = 6, H = 256, Fm = 96, F2 = 2 * Fm;
    int n[6] = {37, 0, 128, 1, 64, 90}; /* an empty expert, a one-row one */
    int off[7] = {0};
    for (int e = 0; e < E; e++)
        off[e + 1] = off[e] + n[e];
    int R = off[E];
    struct gu_pool p = {};
    float *xp = (float *)gu_ph(&p, gu_rand(&t->rng, (size_t)R * H, -1, 1, 1));
    float *wg = (float *)gu_ph(&p, gu_rand(&t->rng, (size_t)E * F2 * H, -0.1f, 0.1f, 1));
    float *wd = (float *)gu_ph(&p, gu_rand(&t->rng, (size_t)E * H * Fm, -0.1f, 0.1f, 1));
    float *dy = (float *)gu_ph(&p, gu_rand(&t->rng, (size_t)R * H, -1, 1, 1));
    float *dx0 = (float *)gu_ph(&p, gu_rand(&t->rng, (size_t)R * H, -0.1f, 0.1f, 1));
    float *dwg0 = (float *)gu_ph(&p, gu_rand(&t->rng, (size_t)E * F2 * H, -0.1f, 0.1f, 1));
    float *dwd0 = (float *)gu_ph(&p, gu_rand(&t->rng, (size_t)E * H * Fm, -0.1f, 0.1f, 1));
    float *rh = gu_hzeros(&p, (size_t)R * F2), *ra = gu_hzeros(&p, (size_t)R * Fm);
    float *ry = gu_hzeros(&p, (size_t)R * H), *rda = gu_hzeros(&p, (size_t)R * Fm);
    float *rdh = gu_hzeros(&p, (size_t)R * F2), *rdx = gu_hcopy(&p, dx0, (size_t)R * H);
    float *rdwg = gu_hcopy(&p, dwg0, (size_t)E * F2 * H), *rdwd = gu_hcopy(&p, dwd0, (size_t)E * H * Fm);
    for (int e = 0; e < E; e++) {
        if (!n[e])
            continue;
        size_t o = off[e];
        const float *we = wg + (size_t)e * F2 * H, *de = wd + (size_t)e * H * Fm;
        kcpu_matmul_forward(rh + o * F2, xp + o * H, we, NULL, n[e], H, F2);
        kcpu_swiglu_forward(ra + o * Fm, rh + o * F2, n[e], Fm);
        kcpu_matmul_forward(ry + o * H, ra + o * Fm, de, NULL, n[e], Fm, H);
        kcpu_matmul_backward(rda + o * Fm, rdwd + (size_t)e * H * Fm, NULL, dy + o * H,
                             ra + o * Fm, de, n[e], Fm, H);
        kcpu_swiglu_backward(rdh + o * F2, rda + o * Fm, rh + o * F2, n[e], Fm);
        kcpu_matmul_backward(rdx + o * H, rdwg + (size_t)e * F2 * H, NULL, rdh + o * F2,
                             xp + o * H, we, n[e], H, F2);
    }
    kcuda_bf16 *d_xp = (kcuda_bf16 *)gu_pd(&p, gu_upload(xp, (size_t)R * H, 1));
    kcuda_bf16 *d_wg = (kcuda_bf16 *)gu_pd(&p, gu_upload(wg, (size_t)E * F2 * H, 1));
    kcuda_bf16 *d_wd = (kcuda_bf16 *)gu_pd(&p, gu_upload(wd, (size_t)E * H * Fm, 1));
    kcuda_bf16 *d_dy = (kcuda_bf16 *)gu_pd(&p, gu_upload(dy, (size_t)R * H, 1));
    kcuda_bf16 *d_dx = (kcuda_bf16 *)gu_pd(&p, gu_upload(dx0, (size_t)R * H, 1));
    kcuda_bf16 *d_dwg = (kcuda_bf16 *)gu_pd(&p, gu_upload(dwg0, (size_t)E * F2 * H, 1));
    kcuda_bf16 *d_dwd = (kcuda_bf16 *)gu_pd(&p, gu_upload(dwd0, (size_t)E * H * Fm, 1));
    kcuda_bf16 *d_h = (kcuda_bf16 *)gu_pd(&p, gu_poisoned((size_t)R * F2, 1));
    kcuda_bf16 *d_a = (kcuda_bf16 *)gu_pd(&p, gu_poisoned((size_t)R * Fm, 1));
    kcuda_bf16 *d_y = (kcuda_bf16 *)gu_pd(&p, gu_poisoned((size_t)R * H, 1));
    kcuda_bf16 *d_da = (kcuda_bf16 *)gu_pd(&p, gu_poisoned((size_t)R * Fm, 1));
    kcuda_bf16 *d_dh = (kcuda_bf16 *)gu_pd(&p, gu_poisoned((size_t)R * F2, 1));
    if (!d_xp || !d_wg || !d_wd || !d_dy || !d_dx || !d_dwg || !d_dwd || !d_h || !d_a || !d_y ||
        !d_da || !d_dh) {
        gu_pool_free(&p);
        return 1;
    }
    int ok = rc_ok(t, kcuda_moe_experts_forward_bf16(t->k, d_y, d_h, d_a, d_xp, d_wg, d_wd, off,
                                                     E, H, Fm), "experts_forward");
    ok = ok && rc_ok(t, kcuda_moe_experts_backward_bf16(t->k, d_dx, d_dwg, d_dwd, d_da, d_dh,
                                                        d_dy, d_xp, d_h, d_a, d_wg, d_wd, off, E,
                                                        H, Fm), "experts_backward");
    if (!ok) {
        gu_pool_free(&p);
        return 1;
    }
    int fail = 0;
    fail |= check(t, "hp", d_h, rh, (size_t)R * F2, 1);
    fail |= check(t, "ap", d_a, ra, (size_t)R * Fm, 1);
    fail |= check(t, "yp", d_y, ry, (size_t)R * H, 1);
    fail |= check(t, "dxp", d_dx, rdx, (size_t)R * H, 1);
    fail |= check(t, "dgate_up", d_dwg, rdwg, (size_t)E * F2 * H, 1);
    fail |= check(t, "ddown", d_dwd, rdwd, (size_t)E * H * Fm, 1);
    /* offsets that decrease are refused with a message */
    int bad[7] = {0, 5, 3, 9, 9, 9, 9};
    int rc = kcuda_moe_experts_forward_bf16(t->k, d_y, d_h, d_a, d_xp, d_wg, d_wd, bad, E, H, Fm);
    if (rc != KCUDA_EARG || !strstr(kcuda_ctx_errmsg(t->k), "decrease")) {
        printf("# bad offsets: rc %d, message '%s'\n", rc, kcuda_ctx_errmsg(t->k));
        fail = 1;
    }
    gu_pool_free(&p);
    return fail;
}

/* ---- determinism of the MoE path --------------------------------------------------------- */

static int t_moe_determinism(struct tctx *t)
{
    int N = 512, E = 64, K = 8, C = 512;
    size_t ne = (size_t)N * E, nk = (size_t)N * K, nc = (size_t)N * C, rc_ = nk * C;
    struct gu_pool p = {};
    float *z = (float *)gu_ph(&p, router_logits(t, N, E));
    float *dw = (float *)gu_ph(&p, gu_rand(&t->rng, nk, -1, 1, 0));
    float *x = (float *)gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, 1));
    float *dxp = (float *)gu_ph(&p, gu_rand(&t->rng, rc_, -1, 1, 1));
    float *eo = (float *)gu_ph(&p, gu_rand(&t->rng, rc_, -1, 1, 1));
    float *dy = (float *)gu_ph(&p, gu_rand(&t->rng, nc, -1, 1, 1));
    float *d_z = (float *)gu_pd(&p, gu_upload(z, ne, 0)), *d_dw = (float *)gu_pd(&p, gu_upload(dw, nk, 0));
    kcuda_bf16 *d_x = (kcuda_bf16 *)gu_pd(&p, gu_upload(x, nc, 1));
    kcuda_bf16 *d_dxp = (kcuda_bf16 *)gu_pd(&p, gu_upload(dxp, rc_, 1));
    kcuda_bf16 *d_eo = (kcuda_bf16 *)gu_pd(&p, gu_upload(eo, rc_, 1));
    kcuda_bf16 *d_dy = (kcuda_bf16 *)gu_pd(&p, gu_upload(dy, nc, 1));
    int fail = !d_z || !d_dw || !d_x || !d_dxp || !d_eo || !d_dy;
    struct {
        int *idx, *cnt, *off, *src, *slot;
        float *w, *pr, *aux, *dz, *dtw;
        kcuda_bf16 *xp, *dx, *y, *deo;
    } r[2];
    for (int q = 0; !fail && q < 2; q++) {
        r[q].idx = ipoisoned(&p, nk), r[q].cnt = ipoisoned(&p, E), r[q].off = ipoisoned(&p, E + 1);
        r[q].src = ipoisoned(&p, nk), r[q].slot = ipoisoned(&p, nk);
        r[q].w = (float *)gu_pd(&p, gu_poisoned(nk, 0)), r[q].pr = (float *)gu_pd(&p, gu_poisoned(ne, 0));
        r[q].aux = (float *)gu_pd(&p, gu_poisoned(1, 0));
        r[q].dz = (float *)gu_pd(&p, gu_poisoned(ne, 0)), r[q].dtw = (float *)gu_pd(&p, gu_poisoned(nk, 0));
        r[q].xp = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(rc_, 1)), r[q].dx = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(nc, 1));
        r[q].y = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(nc, 1)), r[q].deo = (kcuda_bf16 *)gu_pd(&p, gu_poisoned(rc_, 1));
        if (!r[q].idx || !r[q].cnt || !r[q].off || !r[q].src || !r[q].slot || !r[q].w ||
            !r[q].pr || !r[q].aux || !r[q].dz || !r[q].dtw || !r[q].xp || !r[q].dx || !r[q].y ||
            !r[q].deo) {
            fail = 1;
            break;
        }
        cudaMemset(r[q].dz, 0, ne * 4);
        cudaMemset(r[q].dtw, 0, nk * 4);
        cudaMemset(r[q].dx, 0, nc * 2);
        cudaMemset(r[q].deo, 0, rc_ * 2);
        kcuda_ctx *k = t->k;
        fail |= !rc_ok(t, kcuda_moe_router_forward(k, r[q].idx, r[q].w, r[q].pr, r[q].cnt,
                                                   r[q].aux, d_z, N, E, K), "router_forward");
        fail |= !rc_ok(t, kcuda_moe_router_backward(k, r[q].dz, d_dw, 0.5f, r[q].pr, r[q].idx,
                                                    r[q].w, r[q].cnt, N, E, K), "router_backward");
        fail |= !rc_ok(t, kcuda_moe_plan(k, r[q].off, r[q].src, r[q].slot, r[q].idx, N, E, K),
                       "plan");
        fail |= !rc_ok(t, kcuda_moe_permute_forward_bf16(k, r[q].xp, d_x, r[q].src, N, K, C),
                       "permute_forward");
        fail |= !rc_ok(t, kcuda_moe_permute_backward_bf16(k, r[q].dx, d_dxp, r[q].slot, N, K, C),
                       "permute_backward");
        fail |= !rc_ok(t, kcuda_moe_unpermute_forward_bf16(k, r[q].y, d_eo, r[q].w, r[q].slot, N,
                                                           K, C), "unpermute_forward");
        fail |= !rc_ok(t, kcuda_moe_unpermute_backward_bf16(k, r[q].deo, r[q].dtw, d_dy, d_eo,
                                                            r[q].w, r[q].slot, N, K, C),
                       "unpermute_backward");
    }
    if (!fail) {
        fail |= same_bytes("topk_idx", r[0].idx, r[1].idx, nk * 4);
        fail |= same_bytes("topk_w", r[0].w, r[1].w, nk * 4);
        fail |= same_bytes("probs", r[0].pr, r[1].pr, ne * 4);
        fail |= same_bytes("aux", r[0].aux, r[1].aux, 4);
        fail |= same_bytes("router dlogits", r[0].dz, r[1].dz, ne * 4);
        fail |= same_bytes("plan", r[0].src, r[1].src, nk * 4);
        fail |= same_bytes("xp", r[0].xp, r[1].xp, rc_ * 2);
        fail |= same_bytes("dx", r[0].dx, r[1].dx, nc * 2);
        fail |= same_bytes("y", r[0].y, r[1].y, nc * 2);
        fail |= same_bytes("dexpert", r[0].deo, r[1].deo, rc_ * 2);
        fail |= same_bytes("dtopk_w", r[0].dtw, r[1].dtw, nk * 4);
    }
    gu_note(t, " N=%d E=%d K=%d C=%d", N, E, K, C);
    gu_pool_free(&p);
    return fail;
}

/* ---- runner -------------------------------------------------------------------------------- */

static const struct gu_test<struct tctx> tests[] = {
    {"ce_fused_bf16", t_ce},          {"ce_fused_determinism", t_ce_determinism},
    {"ce_vocab_parallel", t_ce_vocab}, {"moe_router", t_router},
    {"moe_plan", t_plan},             {"moe_permute_unpermute", t_permute},
    {"moe_experts", t_experts},       {"moe_determinism", t_moe_determinism},
};

int main(void)
{
    static struct tctx t;
    int n = (int)(sizeof tests / sizeof tests[0]);
    return gu_tap_main("ce/moe gpu kernels", tests, n, &t);
}
